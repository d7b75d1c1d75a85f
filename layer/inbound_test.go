package layer

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// feed frames stream as if each read brought at most chunk bytes, and returns the messages
// (as "sid subject hdr|payload") and what went to nats.go.
func feed(t *testing.T, stream string, chunk int) ([]string, string, *inbound) {
	t.Helper()
	var in inbound
	var got []string
	rest := []byte(stream)
	for len(rest) > 0 {
		space := in.space()
		n := copy(space[:min(len(space), chunk)], rest)
		rest = rest[n:]
		in.end += n
		in.begin()
		if err := in.frame(func(a arrival) {
			got = append(got, fmt.Sprintf("%d %s %s|%s", a.sid, a.subject, a.hdr, a.payload))
		}); err != nil {
			t.Fatalf("chunk %d: %v", chunk, err)
		}
	}
	return got, string(in.forward), &in
}

func TestInboundFramesMessagesAtEverySplit(t *testing.T) {
	big := strings.Repeat("x", 3*inboundBufferSize)
	hdr := "NATS/1.0\r\nChannel: x\r\n\r\n"
	stream := "INFO {\"server_id\":\"a\",\"max_payload\":1048576}\r\n" +
		"PING\r\n" +
		"MSG p.pc.abc 1 5\r\nhello\r\n" +
		"+OK\r\n" +
		"MSG p.ch.c 2 reply.to 0\r\n\r\n" +
		fmt.Sprintf("HMSG p.pc.abc 1 %d %d\r\n%sbody\r\n", len(hdr), len(hdr)+4, hdr) +
		"MSG p.grp.g  3  " + fmt.Sprint(len(big)) + "\r\n" + big + "\r\n" +
		"PONG\r\n-ERR 'Stale Connection'\r\n"
	want := []string{
		"1 p.pc.abc |hello",
		"2 p.ch.c |",
		"1 p.pc.abc " + hdr + "|body",
		"3 p.grp.g |" + big,
	}
	wantForward := "INFO {\"server_id\":\"a\",\"max_payload\":1048576}\r\nPING\r\n+OK\r\nPONG\r\n-ERR 'Stale Connection'\r\n"
	for _, chunk := range []int{1, 2, 3, 7, 64, 4096, len(stream)} {
		got, forward, in := feed(t, stream, chunk)
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("chunk %d: messages\n%q\nwant\n%q", chunk, got, want)
		}
		if forward != wantForward {
			t.Fatalf("chunk %d: forwarded %q, want %q", chunk, forward, wantForward)
		}
		if in.state != framingOn || in.start != in.end {
			t.Fatalf("chunk %d: state %d, %d bytes left", chunk, in.state, in.end-in.start)
		}
		in.space()
		if len(in.buf) != inboundBufferSize {
			t.Fatalf("chunk %d: the buffer kept %d bytes after the large message", chunk, len(in.buf))
		}
	}
}

func TestInboundLeavesTLSAndOtherStreamsToNATSGo(t *testing.T) {
	for name, stream := range map[string]string{
		"TLS required": "INFO {\"tls_required\":true}\r\n\x16\x03\x01MSG p.pc.a 1 1\r\nx\r\n",
		"websocket":    "HTTP/1.1 101 Switching Protocols\r\n\r\n\x82\x05MSG p",
		"TLS first":    "\x16\x03\x01\x00\x05hello",
	} {
		got, forward, in := feed(t, stream, 5)
		if len(got) != 0 || forward != stream || in.state != framingOff {
			t.Errorf("%s: framed %q, forwarded %q, state %d: want everything forwarded", name, got, forward, in.state)
		}
	}
}

func TestInboundRefusesWhatIsNotTheProtocol(t *testing.T) {
	for name, stream := range map[string]string{
		"bad size":       "INFO {}\r\nMSG p.pc.a 1 five\r\nhello\r\n",
		"missing sid":    "INFO {}\r\nMSG p.pc.a 5\r\nhello\r\n",
		"header > total": "INFO {}\r\nHMSG p.pc.a 1 9 5\r\nhello\r\n",
		"too many args":  "INFO {}\r\nMSG a 1 b c 5\r\nhello\r\n",
	} {
		var in inbound
		in.end = copy(in.space(), stream)
		in.begin()
		if err := in.frame(func(arrival) { t.Errorf("%s: framed a message", name) }); err != errBadMessage {
			t.Errorf("%s: %v, want errBadMessage", name, err)
		}
	}
	var in inbound
	in.end = copy(in.space(), "INFO "+strings.Repeat("x", inboundBufferSize-5))
	in.begin()
	for in.end-in.start <= maxControlLine {
		space := in.space()
		in.end += copy(space, bytes.Repeat([]byte("x"), len(space)))
	}
	if err := in.frame(func(arrival) {}); err != errControlLine {
		t.Fatalf("a line without its end: %v, want errControlLine", err)
	}
}

func TestOutboundLearnsSubscriptionsFromWhatNATSGoWrites(t *testing.T) {
	payload := "SUB fake 9\r\n" // a publish's payload that looks like an operation
	writes := "CONNECT {\"verbose\":false}\r\nPING\r\n" +
		"SUB p.pc.abc  1\r\n" +
		"PUB p.ch.x " + fmt.Sprint(len(payload)) + "\r\n" + payload + "\r\n" +
		"SUB p.grp.g p.ch.c 2\r\n" +
		"HPUB p.pc.abc reply 12 " + fmt.Sprint(12+len(payload)) + "\r\nNATS/1.0\r\n\r\n" + payload + "\r\n" +
		"SUB p.ch.d p.ch.d 3\r\n" +
		"UNSUB 3 \r\n"
	for _, chunk := range []int{1, 5, 13, len(writes)} {
		var o outbound
		for rest := writes; rest != ""; {
			n := min(chunk, len(rest))
			o.scan([]byte(rest[:n]))
			rest = rest[n:]
		}
		got := map[int64]string{}
		for sid, sub := range o.subs {
			got[sid] = sub.Subject + " " + sub.Queue
		}
		want := map[int64]string{1: "p.pc.abc ", 2: "p.grp.g p.ch.c"}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("chunk %d: subscriptions %v, want %v", chunk, got, want)
		}
	}
}
