package layer

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The map form of messages (Send, GroupSend, Receive, DecodeMessage) is for Go hosts; the C ABI
// and the wire carry bodies as bytes. It is a small msgpack codec of its own, for the types a
// Channels message holds, so that the C library does not carry a reflection-based one.

// encodeMessage packs a Go message the way every peer expects: a msgpack map, []byte as bin,
// string as str, integers in their smallest form. Values may be nil, bool, any integer type,
// float32, float64, string, []byte, []any, []string, map[string]any and map[string]string,
// nested to maxFrameDepth.
func encodeMessage(msg map[string]any) ([]byte, error) {
	var e encoder
	if err := e.value(msg, 0); err != nil {
		return nil, fmt.Errorf("channels_nats: cannot encode the message: %w", err)
	}
	return e.buf, nil
}

type encoder struct{ buf []byte }

func (e *encoder) value(v any, depth int) error {
	if depth > maxFrameDepth {
		return &FrameError{len(e.buf), fmt.Sprintf("nested deeper than %d levels", maxFrameDepth)}
	}
	switch v := v.(type) {
	case nil:
		e.buf = append(e.buf, 0xc0)
	case bool:
		b := byte(0xc2)
		if v {
			b = 0xc3
		}
		e.buf = append(e.buf, b)
	case string:
		e.str(v)
	case []byte:
		e.header(len(v), 0, 0xc4, 0xc5, 0xc6)
		e.buf = append(e.buf, v...)
	case int:
		e.int(int64(v))
	case int8:
		e.int(int64(v))
	case int16:
		e.int(int64(v))
	case int32:
		e.int(int64(v))
	case int64:
		e.int(v)
	case uint:
		e.uint(uint64(v))
	case uint8:
		e.uint(uint64(v))
	case uint16:
		e.uint(uint64(v))
	case uint32:
		e.uint(uint64(v))
	case uint64:
		e.uint(v)
	case float32:
		e.buf = binary.BigEndian.AppendUint32(append(e.buf, 0xca), math.Float32bits(v))
	case float64:
		e.buf = binary.BigEndian.AppendUint64(append(e.buf, 0xcb), math.Float64bits(v))
	case []any:
		e.header(len(v), 0x90, 0, 0xdc, 0xdd)
		for _, item := range v {
			if err := e.value(item, depth+1); err != nil {
				return err
			}
		}
	case []string:
		e.header(len(v), 0x90, 0, 0xdc, 0xdd)
		for _, item := range v {
			e.str(item)
		}
	case map[string]any:
		e.header(len(v), 0x80, 0, 0xde, 0xdf)
		for key, item := range v {
			e.str(key)
			if err := e.value(item, depth+1); err != nil {
				return err
			}
		}
	case map[string]string:
		e.header(len(v), 0x80, 0, 0xde, 0xdf)
		for key, item := range v {
			e.str(key)
			e.str(item)
		}
	default:
		return &FrameError{len(e.buf), fmt.Sprintf("a %T cannot be sent (use nil, bool, numbers, string, []byte, []any or map[string]any)", v)}
	}
	return nil
}

// header writes a length: fixed (fix | n, up to 15; 0 when the type has no fixed form), or the
// 8-, 16- or 32-bit form (code 0 when the type has none of that size).
func (e *encoder) header(n int, fix, code8, code16, code32 byte) {
	switch {
	case fix != 0 && n < 16:
		e.buf = append(e.buf, fix|byte(n))
	case code8 != 0 && n < 1<<8:
		e.buf = append(e.buf, code8, byte(n))
	case n < 1<<16:
		e.buf = binary.BigEndian.AppendUint16(append(e.buf, code16), uint16(n))
	default:
		e.buf = binary.BigEndian.AppendUint32(append(e.buf, code32), uint32(n))
	}
}

func (e *encoder) str(s string) {
	if len(s) < 32 {
		e.buf = append(e.buf, 0xa0|byte(len(s)))
	} else {
		e.header(len(s), 0, 0xd9, 0xda, 0xdb)
	}
	e.buf = append(e.buf, s...)
}

func (e *encoder) int(n int64) {
	switch {
	case n >= 0:
		e.uint(uint64(n))
	case n >= -32:
		e.buf = append(e.buf, byte(n))
	case n >= math.MinInt8:
		e.buf = append(e.buf, 0xd0, byte(n))
	case n >= math.MinInt16:
		e.buf = binary.BigEndian.AppendUint16(append(e.buf, 0xd1), uint16(n))
	case n >= math.MinInt32:
		e.buf = binary.BigEndian.AppendUint32(append(e.buf, 0xd2), uint32(n))
	default:
		e.buf = binary.BigEndian.AppendUint64(append(e.buf, 0xd3), uint64(n))
	}
}

func (e *encoder) uint(n uint64) {
	switch {
	case n < 128:
		e.buf = append(e.buf, byte(n))
	case n <= math.MaxUint8:
		e.buf = append(e.buf, 0xcc, byte(n))
	case n <= math.MaxUint16:
		e.buf = binary.BigEndian.AppendUint16(append(e.buf, 0xcd), uint16(n))
	case n <= math.MaxUint32:
		e.buf = binary.BigEndian.AppendUint32(append(e.buf, 0xce), uint32(n))
	default:
		e.buf = binary.BigEndian.AppendUint64(append(e.buf, 0xcf), n)
	}
}

// DecodeMessage unpacks a body returned by ReceiveRaw into a Go map of its own: strings as
// string, bin as []byte (copied), each integer as the Go type of its msgpack form (int8 for a
// fixint, uint8 to uint64 and int8 to int64 for the sized forms), float32 and float64 as such,
// arrays as []any, maps as map[string]any, nil and bool.
func DecodeMessage(body []byte) (map[string]any, error) {
	if err := ValidateFrame(body); err != nil { // from here on the body is well formed
		return nil, fmt.Errorf("channels_nats: cannot decode the message: %w", err)
	}
	d := decoder{buf: body}
	return d.value().(map[string]any), nil
}

type decoder struct {
	buf []byte
	pos int
}

func (d *decoder) next(n int) []byte {
	b := d.buf[d.pos : d.pos+n]
	d.pos += n
	return b
}

func (d *decoder) size(bytes int) int {
	switch b := d.next(bytes); bytes {
	case 1:
		return int(b[0])
	case 2:
		return int(binary.BigEndian.Uint16(b))
	default:
		return int(binary.BigEndian.Uint32(b))
	}
}

// value decodes one value of a body ValidateFrame accepted (so no ext types, string keys).
func (d *decoder) value() any {
	c := d.next(1)[0]
	switch {
	case c < 0x80, c >= 0xe0: // positive and negative fixint
		return int8(c)
	case c&0xf0 == 0x80:
		return d.mapOf(int(c & 0x0f))
	case c&0xf0 == 0x90:
		return d.arrayOf(int(c & 0x0f))
	case c&0xe0 == 0xa0:
		return string(d.next(int(c & 0x1f)))
	}
	switch c {
	case 0xc2, 0xc3:
		return c == 0xc3
	case 0xc4, 0xc5, 0xc6:
		return append([]byte{}, d.next(d.size(1<<(c-0xc4)))...)
	case 0xca:
		return math.Float32frombits(binary.BigEndian.Uint32(d.next(4)))
	case 0xcb:
		return math.Float64frombits(binary.BigEndian.Uint64(d.next(8)))
	case 0xcc:
		return d.next(1)[0]
	case 0xcd:
		return binary.BigEndian.Uint16(d.next(2))
	case 0xce:
		return binary.BigEndian.Uint32(d.next(4))
	case 0xcf:
		return binary.BigEndian.Uint64(d.next(8))
	case 0xd0:
		return int8(d.next(1)[0])
	case 0xd1:
		return int16(binary.BigEndian.Uint16(d.next(2)))
	case 0xd2:
		return int32(binary.BigEndian.Uint32(d.next(4)))
	case 0xd3:
		return int64(binary.BigEndian.Uint64(d.next(8)))
	case 0xd9, 0xda, 0xdb:
		return string(d.next(d.size(1 << (c - 0xd9))))
	case 0xdc, 0xdd:
		return d.arrayOf(d.size(2 << (c - 0xdc)))
	case 0xde, 0xdf:
		return d.mapOf(d.size(2 << (c - 0xde)))
	}
	return nil // 0xc0, nil
}

func (d *decoder) arrayOf(n int) []any {
	items := make([]any, n)
	for i := range items {
		items[i] = d.value()
	}
	return items
}

func (d *decoder) mapOf(n int) map[string]any {
	m := make(map[string]any, n)
	for range n {
		key := d.value().(string)
		m[key] = d.value()
	}
	return m
}
