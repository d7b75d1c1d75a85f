package layer

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/nats-io/nats.go"
)

// What a bare socket reads is framed by the layer, not by nats.go: every MSG and HMSG is taken
// out of the stream and put into the inbox (Layer.arrive), and nats.go's reader gets the rest
// (INFO, PING, PONG, +OK, -ERR) as whole operations. So a message can be read and routed on any
// thread that has the socket's read lock, the host's event loop included (socket.onReadable),
// as a C client's event-loop adapter reads its socket on the loop's thread. Over TLS or a
// websocket the bytes read are not the protocol: there nats.go frames and delivers them.
//
// The messages of a subscription are told by its sid, which nats.go chooses: the layer learns
// the sids from the SUB and UNSUB operations nats.go writes to the socket (outbound), before
// the server can send anything on them.

// framing says whether a socket's reads are framed here.
type framing uint8

const (
	framingUnknown framing = iota // nothing read yet: the first operation must be the server's INFO
	framingOn                     // the protocol as it is: the layer frames it
	framingOff                    // TLS, a websocket, or not the protocol: nats.go frames it
)

const (
	inboundBufferSize = 64 << 10 // a socket's read buffer, grown for a larger message
	// maxControlLine bounds an operation's line: longer means the stream is not the protocol.
	// The server's INFO lists the cluster's URLs, so it is larger than nats.go's 4 KiB limit
	// for the other lines.
	maxControlLine = 1 << 20
)

var (
	errControlLine = errors.New("channels_nats: the server sent a protocol line that is too long")
	errBadMessage  = errors.New("channels_nats: the server sent a message operation that cannot be parsed")
)

// inbound is the read side of a framed socket: guarded by socket.readMu.
type inbound struct {
	state      framing
	buf        []byte // buf[start:end] is read and not framed yet
	start, end int
	need       int    // a frame of this many bytes has begun at start
	informed   bool   // the server's first INFO was framed
	forward    []byte // whole operations for nats.go's reader, in order
	err        error  // why reading ended: nats.go's reader gets it after forward
}

// space returns where the next read goes: after what is buffered, which moves to the front (or
// to a larger array, for a frame larger than the buffer) when the buffer's end is reached.
func (in *inbound) space() []byte {
	if in.start == in.end {
		in.start, in.end = 0, 0
		if len(in.buf) > inboundBufferSize && in.need == 0 {
			in.buf = nil // a large message passed: do not keep its array
		}
	}
	if in.buf == nil {
		in.buf = make([]byte, inboundBufferSize)
	}
	if in.end == len(in.buf) || in.need > len(in.buf)-in.start {
		size := len(in.buf)
		for size < in.need || in.end-in.start == size {
			size *= 2
		}
		if size > len(in.buf) {
			grown := make([]byte, size)
			in.end = copy(grown, in.buf[in.start:in.end])
			in.buf = grown
		} else {
			in.end = copy(in.buf, in.buf[in.start:in.end])
		}
		in.start = 0
	}
	return in.buf[in.end:]
}

// arrival is one message operation framed from the stream. hdr and payload point into the
// read buffer until the next read.
type arrival struct {
	sid                   int64
	subject, hdr, payload []byte
}

// frame takes every whole operation out of what is buffered: each message goes to deliver, the
// rest to forward. It stops at a frame that is not whole yet, and fails on a stream that is not
// the protocol. An INFO that asks for TLS ends the framing (framingOff): what follows it goes
// to nats.go as it is.
func (in *inbound) frame(deliver func(arrival)) error {
	for in.state == framingOn && in.start < in.end {
		data := in.buf[in.start:in.end]
		eol := bytes.Index(data, crlf)
		if eol < 0 {
			if len(data) > maxControlLine {
				return errControlLine
			}
			return nil
		}
		line := data[:eol]
		op, args, _ := bytes.Cut(line, []byte{' '})
		switch {
		case bytes.Equal(op, []byte("MSG")), bytes.Equal(op, []byte("HMSG")):
			a, hdrSize, size, ok := parseMessageLine(args, len(op) == 4)
			if !ok {
				return errBadMessage
			}
			frameSize := eol + 2 + size + 2
			if len(data) < frameSize {
				in.need = frameSize
				return nil
			}
			body := data[eol+2 : eol+2+size]
			a.hdr, a.payload = body[:hdrSize], body[hdrSize:]
			in.need = 0
			in.start += frameSize
			deliver(a)
		case bytes.Equal(op, []byte("INFO")) && !in.informed:
			in.informed = true
			in.forwardLine(eol)
			if requiresTLS(args) {
				in.state = framingOff
			}
		default:
			in.forwardLine(eol)
		}
	}
	if in.state == framingOff && in.start < in.end { // after an INFO that asks for TLS
		in.forward = append(in.forward, in.buf[in.start:in.end]...)
		in.start = in.end
	}
	return nil
}

// forwardLine hands the operation that ends at buf[start+eol] to nats.go.
func (in *inbound) forwardLine(eol int) {
	in.forward = append(in.forward, in.buf[in.start:in.start+eol+2]...)
	in.start += eol + 2
}

// begin decides the framing from the first bytes read: the server's INFO in the clear, or
// anything else (a TLS handshake, a websocket upgrade), which nats.go frames.
func (in *inbound) begin() {
	if in.state != framingUnknown || in.end-in.start < len("INFO ") {
		return
	}
	if bytes.HasPrefix(in.buf[in.start:in.end], []byte("INFO ")) {
		in.state = framingOn
		return
	}
	in.state = framingOff
	in.forward = append(in.forward, in.buf[in.start:in.end]...)
	in.start = in.end
}

// requiresTLS reports whether an INFO's arguments ask the client to start TLS.
func requiresTLS(info []byte) bool {
	var i struct {
		TLSRequired bool `json:"tls_required"`
	}
	return json.Unmarshal(info, &i) != nil || i.TLSRequired
}

// parseMessageLine parses the arguments of MSG (subject sid [reply] size) or of HMSG (subject
// sid [reply] header-size total-size).
func parseMessageLine(args []byte, headers bool) (a arrival, hdrSize, size int, ok bool) {
	var fields [5][]byte
	n := 0
	for len(args) > 0 && n < len(fields) {
		var f []byte
		f, args, _ = bytes.Cut(args, []byte{' '})
		if len(f) > 0 {
			fields[n] = f
			n++
		}
	}
	sizes := 1
	if headers {
		sizes = 2
	}
	if len(args) > 0 || n != 2+sizes && n != 3+sizes {
		return arrival{}, 0, 0, false
	}
	sid, ok := parseDecimal(fields[1], 18)
	if !ok {
		return arrival{}, 0, 0, false
	}
	if size, ok = parseSize(fields[n-1]); !ok {
		return arrival{}, 0, 0, false
	}
	if headers {
		if hdrSize, ok = parseSize(fields[n-2]); !ok || hdrSize > size {
			return arrival{}, 0, 0, false
		}
	}
	return arrival{sid: int64(sid), subject: fields[0]}, hdrSize, size, true
}

// parseSize parses a size field, at most maxFrameSize.
func parseSize(b []byte) (int, bool) {
	n, ok := parseDecimal(b, 10)
	return n, ok && n <= maxFrameSize
}

// parseDecimal parses at most digits decimal digits. It allocates nothing: it runs for every
// message read and every publish nats.go writes.
func parseDecimal(b []byte, digits int) (int, bool) {
	if len(b) == 0 || len(b) > digits {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// maxFrameSize bounds what a size field may announce: far above any server's max_payload.
const maxFrameSize = 1 << 30

// outbound follows what nats.go writes to a socket for its SUB and UNSUB operations: the
// subscriptions whose messages the layer frames. Guarded by socket.subsMu.
type outbound struct {
	skip    int    // payload bytes of a publish still to pass
	partial []byte // the start of an operation whose line a write cut
	subs    map[int64]*nats.Subscription
}

// scan follows the operations of one write.
func (o *outbound) scan(p []byte) {
	for len(p) > 0 {
		if o.skip > 0 {
			n := min(o.skip, len(p))
			o.skip -= n
			p = p[n:]
			continue
		}
		if n := len(o.partial); n > 0 && o.partial[n-1] == '\r' && p[0] == '\n' { // a cut CRLF
			o.operation(o.partial[:n-1])
			o.partial = o.partial[:0]
			p = p[1:]
			continue
		}
		eol := bytes.Index(p, crlf)
		if eol < 0 {
			o.partial = append(o.partial, p...)
			return
		}
		line := p[:eol]
		if len(o.partial) > 0 {
			o.partial = append(o.partial, line...)
			line = o.partial
		}
		o.operation(line)
		o.partial = o.partial[:0]
		p = p[eol+2:]
	}
}

// operation follows one operation line.
func (o *outbound) operation(line []byte) {
	op, args, _ := bytes.Cut(line, []byte{' '})
	if string(op) == "PUB" || string(op) == "HPUB" { // subject [reply] [header-size] total-size, then the payload
		args = bytes.TrimRight(args, " ")
		if n, ok := parseSize(args[bytes.LastIndexByte(args, ' ')+1:]); ok {
			o.skip = n + 2
		}
		return
	}
	fields := bytes.Fields(args) // SUB and UNSUB: rare
	switch string(op) {
	case "SUB": // subject [queue] sid
		if len(fields) < 2 {
			return
		}
		sid, err := strconv.ParseInt(string(fields[len(fields)-1]), 10, 64)
		if err != nil {
			return
		}
		sub := &nats.Subscription{Subject: string(fields[0])}
		if len(fields) == 3 {
			sub.Queue = string(fields[1])
		}
		if o.subs == nil {
			o.subs = map[int64]*nats.Subscription{}
		}
		o.subs[sid] = sub
	case "UNSUB": // sid [max]: the layer never asks nats.go for a maximum
		if len(fields) > 0 {
			if sid, err := strconv.ParseInt(string(fields[0]), 10, 64); err == nil {
				delete(o.subs, sid)
			}
		}
	}
}
