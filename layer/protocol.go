package layer

import (
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
)

// A publish made on the caller's thread (link.tryInline) is written to the socket by the layer
// itself, as the NATS protocol operation nats.go would write for it. Through nats.go, every
// publish also woke nats.go's flusher goroutine, which found nothing to write (nats.go passes
// each write on at once, see socket.go) and went back to sleep; on an idle runtime that wake-up
// started a second thread as well. For a lone message that was most of the library's work.

// headerSize is how many bytes a header block adds to a message on the wire.
func headerSize(h nats.Header) int {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}

// appendPublishOp appends what precedes m's payload on the wire: "PUB <subject> <size>\r\n", or
// with headers "HPUB <subject> <header size> <total size>\r\n" and the header block. The payload
// and crlf follow it.
func appendPublishOp(b []byte, m *nats.Msg) []byte {
	if len(m.Header) == 0 {
		b = append(b, "PUB "...)
		b = append(b, m.Subject...)
		b = append(b, ' ')
		b = strconv.AppendInt(b, int64(len(m.Data)), 10)
		return append(b, "\r\n"...)
	}
	hdr := headerSize(m.Header)
	b = append(b, "HPUB "...)
	b = append(b, m.Subject...)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(hdr), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(hdr+len(m.Data)), 10)
	b = append(b, "\r\nNATS/1.0\r\n"...)
	for k, vs := range m.Header {
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
	}
	return append(b, "\r\n"...)
}

// crlf ends every publish operation.
var crlf = []byte("\r\n")

// opBuffers holds the buffers a publish written by the layer is put together in: a socket
// copies what it does not write at once, so a buffer is free again when the write returns.
var opBuffers = sync.Pool{New: func() any {
	b := make([]byte, 0, 1024)
	return &b
}}

// opBufferKept is the largest buffer given back to opBuffers: a publish written by the layer
// is at most inlineLimit on the wire.
const opBufferKept = inlineLimit + 1024
