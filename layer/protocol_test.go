package layer

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestPublishOpsAreNATSProtocol: what appendPublishOp writes, with the payload and CRLF after
// it, is the operation the NATS protocol defines, its sizes counted as headerSize counts them.
func TestPublishOpsAreNATSProtocol(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  *nats.Msg
		want string
	}{
		{"plain", &nats.Msg{Subject: "cn.g.room", Data: []byte("body")}, "PUB cn.g.room 4\r\nbody\r\n"},
		{"empty", &nats.Msg{Subject: "s", Data: nil}, "PUB s 0\r\n\r\n"},
		{
			"header", &nats.Msg{Subject: "cn.pc.p1", Header: nats.Header{"Channel": {"p1!abc"}}, Data: []byte("xyz")},
			"HPUB cn.pc.p1 29 32\r\nNATS/1.0\r\nChannel: p1!abc\r\n\r\nxyz\r\n",
		},
	} {
		got := string(appendPublishOp(nil, tc.msg)) + string(tc.msg.Data) + string(crlf)
		if got != tc.want {
			t.Errorf("%s: wrote %q, want %q", tc.name, got, tc.want)
		}
		if op := appendPublishOp(nil, tc.msg); len(tc.msg.Header) > 0 {
			block := op[strings.Index(string(op), "\r\n")+2:]
			if len(block) != headerSize(tc.msg.Header) {
				t.Errorf("%s: header block of %d bytes, headerSize says %d", tc.name, len(block), headerSize(tc.msg.Header))
			}
		}
	}
}

// TestPublishOpsAppendToTheBuffer: appendPublishOp appends behind what the buffer holds.
func TestPublishOpsAppendToTheBuffer(t *testing.T) {
	got := string(appendPublishOp([]byte("PING\r\n"), &nats.Msg{Subject: "a", Data: []byte("1")}))
	if got != "PING\r\nPUB a 1\r\n" {
		t.Fatalf("got %q", got)
	}
}
