package layer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// FrameError says why a message body is not a Channels message on the wire: the body must be one
// msgpack map whose keys are UTF-8 strings at every depth, with no ext types and nothing after it.
// These are exactly the frames every peer (Python msgpack with raw=False and strict map keys,
// vmihailenco/msgpack, the reference layer) decodes into a string-keyed dict.
type FrameError struct {
	Offset int
	Reason string
}

// Error says what is wrong and where.
func (e *FrameError) Error() string {
	return fmt.Sprintf("not a Channels message: %s (at byte %d)", e.Reason, e.Offset)
}

// ReservedKey is the top-level key Channels reserves for itself; messages must not carry it.
const ReservedKey = "__asgi_channel__"

// maxFrameDepth bounds nesting so that no peer's recursive decoder overflows its stack.
const maxFrameDepth = 512

// What a message may expand to when it is decoded is bounded: it may hold at most MaxContainers
// maps and arrays, or one per ContainerBytes bytes of body if that is more. An empty map is one
// byte on the wire and some 60 bytes as a Python dict, so a megabyte of nothing else would
// decode to some 60 megabytes; real messages (records of a few fields) stay far below the bound.
const (
	MaxContainers  = 4096
	ContainerBytes = 8
)

var errTruncated = errors.New("truncated")

// ValidateFrame checks that body is a valid wire message (see FrameError). It does not allocate
// and reads each byte once, so routing can run it on every inbound frame.
func ValidateFrame(body []byte) error {
	r := newFrameReader(body)
	n, ok := r.mapHeader()
	if !ok {
		if r.err != nil {
			return r.failure()
		}
		return &FrameError{0, "the top-level value is not a map"}
	}
	for i := 0; i < n; i++ {
		if !r.key() || !r.value(1) {
			return r.failure()
		}
	}
	if r.pos != len(body) {
		return &FrameError{r.pos, "bytes follow the message"}
	}
	return nil
}

// validateOutbound is ValidateFrame plus the send-side rule that the reserved key is absent.
func validateOutbound(body []byte) error {
	if err := ValidateFrame(body); err != nil {
		return err
	}
	r := newFrameReader(body)
	n, _ := r.mapHeader()
	for i := 0; i < n; i++ {
		start := r.pos
		r.key()
		if string(body[r.keyStart:r.pos]) == ReservedKey {
			return &FrameError{start, "the key " + ReservedKey + " is reserved for Channels"}
		}
		r.value(1)
	}
	return nil
}

type frameReader struct {
	buf        []byte
	pos        int
	keyStart   int // where the bytes of the last string key begin
	containers int // maps and arrays the rest of the frame may still hold
	err        error
	errAt      int
}

func newFrameReader(body []byte) frameReader {
	return frameReader{buf: body, containers: max(MaxContainers, len(body)/ContainerBytes)}
}

func (r *frameReader) fail(reason string) bool {
	if r.err == nil {
		r.err = errors.New(reason)
		r.errAt = r.pos
	}
	return false
}

func (r *frameReader) failure() error {
	if r.err == nil {
		return &FrameError{r.pos, "malformed"}
	}
	return &FrameError{r.errAt, r.err.Error()}
}

// take returns the next n bytes, or fails when the body is shorter.
func (r *frameReader) take(n int) ([]byte, bool) {
	if n < 0 || len(r.buf)-r.pos < n {
		r.fail(errTruncated.Error())
		return nil, false
	}
	b := r.buf[r.pos : r.pos+n]
	r.pos += n
	return b, true
}

func (r *frameReader) length(size int) (int, bool) {
	b, ok := r.take(size)
	if !ok {
		return 0, false
	}
	switch size {
	case 1:
		return int(b[0]), true
	case 2:
		return int(binary.BigEndian.Uint16(b)), true
	default:
		n := binary.BigEndian.Uint32(b)
		if uint64(n) > uint64(len(r.buf)) { // cannot be satisfied; avoids overflow on 32-bit
			return 0, r.fail(errTruncated.Error())
		}
		return int(n), true
	}
}

// mapHeader reads a map header and returns its entry count; ok is false if the next value is
// not a map (r.err is set only when the body is truncated).
func (r *frameReader) mapHeader() (int, bool) {
	if r.pos >= len(r.buf) {
		return 0, r.fail("empty body")
	}
	c := r.buf[r.pos]
	switch {
	case c&0xf0 == 0x80:
		r.pos++
		return int(c & 0x0f), true
	case c == 0xde:
		r.pos++
		return r.length(2)
	case c == 0xdf:
		r.pos++
		return r.length(4)
	}
	return 0, false
}

// key reads a map key, which must be a UTF-8 string.
func (r *frameReader) key() bool {
	if r.pos >= len(r.buf) {
		return r.fail(errTruncated.Error())
	}
	c := r.buf[r.pos]
	var n int
	var ok bool
	switch {
	case c&0xe0 == 0xa0:
		r.pos++
		n, ok = int(c&0x1f), true
	case c == 0xd9:
		r.pos++
		n, ok = r.length(1)
	case c == 0xda:
		r.pos++
		n, ok = r.length(2)
	case c == 0xdb:
		r.pos++
		n, ok = r.length(4)
	default:
		return r.fail("a map key is not a string")
	}
	if !ok {
		return false
	}
	r.keyStart = r.pos
	return r.utf8(n)
}

func (r *frameReader) utf8(n int) bool {
	start := r.pos
	b, ok := r.take(n)
	if !ok {
		return false
	}
	if !utf8.Valid(b) {
		r.pos = start
		return r.fail("a string is not valid UTF-8")
	}
	return true
}

func (r *frameReader) skip(n int) bool {
	_, ok := r.take(n)
	return ok
}

// value reads any value at the given nesting depth.
func (r *frameReader) value(depth int) bool {
	if depth > maxFrameDepth {
		return r.fail(fmt.Sprintf("nested deeper than %d levels", maxFrameDepth))
	}
	if r.pos >= len(r.buf) {
		return r.fail(errTruncated.Error())
	}
	c := r.buf[r.pos]
	switch {
	case c <= 0x7f || c >= 0xe0: // positive and negative fixint
		r.pos++
		return true
	case c&0xf0 == 0x80: // fixmap
		n, _ := r.mapHeader()
		return r.mapEntries(n, depth)
	case c&0xf0 == 0x90: // fixarray
		r.pos++
		return r.arrayItems(int(c&0x0f), depth)
	case c&0xe0 == 0xa0: // fixstr
		r.pos++
		return r.utf8(int(c & 0x1f))
	}
	r.pos++
	switch c {
	case 0xc0, 0xc2, 0xc3: // nil, false, true
		return true
	case 0xc4, 0xc5, 0xc6: // bin 8/16/32
		n, ok := r.length(1 << (c - 0xc4))
		return ok && r.skip(n)
	case 0xca:
		return r.skip(4)
	case 0xcb:
		return r.skip(8)
	case 0xcc, 0xd0:
		return r.skip(1)
	case 0xcd, 0xd1:
		return r.skip(2)
	case 0xce, 0xd2:
		return r.skip(4)
	case 0xcf, 0xd3:
		return r.skip(8)
	case 0xd9, 0xda, 0xdb: // str 8/16/32
		n, ok := r.length(1 << (c - 0xd9))
		return ok && r.utf8(n)
	case 0xdc, 0xdd: // array 16/32
		n, ok := r.length(2 << (c - 0xdc))
		return ok && r.arrayItems(n, depth)
	case 0xde, 0xdf: // map 16/32
		n, ok := r.length(2 << (c - 0xde))
		return ok && r.mapEntries(n, depth)
	}
	r.pos--
	if c == 0xc1 {
		return r.fail("byte 0xc1 is never used in msgpack")
	}
	return r.fail("ext types are not part of the wire contract")
}

// container counts one more map or array against the frame's bound.
func (r *frameReader) container() bool {
	r.containers--
	if r.containers < 0 {
		return r.fail(fmt.Sprintf("more than %d maps and arrays, and more than one per %d bytes: "+
			"it would expand too much when decoded", MaxContainers, ContainerBytes))
	}
	return true
}

func (r *frameReader) arrayItems(n, depth int) bool {
	if !r.container() {
		return false
	}
	for i := 0; i < n; i++ {
		if !r.value(depth + 1) {
			return false
		}
	}
	return true
}

func (r *frameReader) mapEntries(n, depth int) bool {
	if !r.container() {
		return false
	}
	for i := 0; i < n; i++ {
		if !r.key() || !r.value(depth+1) {
			return false
		}
	}
	return true
}
