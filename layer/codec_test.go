package layer

import (
	"bytes"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// TestEncodeMessageMatchesVmihailenco: for every value type the map API takes, encodeMessage
// writes the bytes vmihailenco/msgpack wrote before it (compact integers, floats as given), so
// peers see the same frames as ever.
func TestEncodeMessageMatchesVmihailenco(t *testing.T) {
	long := string(bytes.Repeat([]byte("x"), 70000))
	values := []any{
		nil, true, false, "", "é", "0123456789012345678901234567890123", long,
		[]byte{}, []byte{0, 1, 2}, bytes.Repeat([]byte{7}, 300), bytes.Repeat([]byte{7}, 70000),
		0, 1, 127, 128, 255, 256, 65535, 65536, math.MaxUint32, math.MaxUint32 + 1, math.MaxInt64,
		-1, -32, -33, -128, -129, -32768, -32769, math.MinInt32, math.MinInt32 - 1, math.MinInt64,
		int8(-5), int16(300), int32(-70000), int64(1 << 40), uint(7), uint8(200), uint16(60000),
		uint32(1 << 31), uint64(math.MaxUint64), float32(1.5), 2.25, math.Inf(-1),
		[]any{}, []any{1, "a", nil}, make([]any, 20), make([]any, 70000), []string{"a", "b"},
		map[string]any{}, map[string]any{"k": map[string]any{"n": -7}}, map[string]string{"a": "b"},
	}
	for _, v := range values {
		msg := map[string]any{"v": v} // one key: map order cannot differ
		got, err := encodeMessage(msg)
		if err != nil {
			t.Fatalf("encodeMessage(%T): %v", v, err)
		}
		var want bytes.Buffer
		enc := msgpack.NewEncoder(&want)
		enc.UseCompactInts(true)
		enc.UseCompactFloats(false)
		if err := enc.Encode(msg); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want.Bytes()) {
			t.Errorf("encodeMessage(%T %.40v) = % x..., vmihailenco writes % x...", v, v, head(got), head(want.Bytes()))
		}
	}
}

func head(b []byte) []byte { return b[:min(len(b), 24)] }

// TestEncodeMessageRefuses: a type the map API does not take, and nesting beyond the limit every
// peer's decoder survives, are *FrameError, and nothing is encoded.
func TestEncodeMessageRefuses(t *testing.T) {
	for name, msg := range map[string]map[string]any{
		"a time.Time":                {"at": time.Now()},
		"a struct":                   {"s": struct{ A int }{1}},
		"a nested []int in an []any": {"l": []any{[]int{1}}},
	} {
		body, err := encodeMessage(msg)
		var fe *FrameError
		if !errors.As(err, &fe) || body != nil {
			t.Errorf("%s: encodeMessage = % x, %v; want a *FrameError", name, body, err)
		}
	}
	deep := map[string]any{}
	for i := 0; i <= maxFrameDepth; i++ {
		deep = map[string]any{"d": deep}
	}
	var fe *FrameError
	if _, err := encodeMessage(deep); !errors.As(err, &fe) {
		t.Errorf("nesting beyond %d levels: %v, want a *FrameError", maxFrameDepth, err)
	}
}
