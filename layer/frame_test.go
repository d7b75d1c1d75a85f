package layer

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatalf("msgpack.Marshal: %v", err)
	}
	return b
}

func wantFrameError(t *testing.T, err error, desc string) *FrameError {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: accepted, want a *FrameError", desc)
	}
	var fe *FrameError
	if !errors.As(err, &fe) {
		t.Fatalf("%s: error %v (%T) is not a *FrameError", desc, err, err)
	}
	if fe.Reason == "" {
		t.Errorf("%s: FrameError.Reason is empty", desc)
	}
	return fe
}

func manyItems(n int) []any {
	items := make([]any, n)
	for i := range items {
		items[i] = i
	}
	return items
}

func manyEntries(n int) map[string]any {
	m := make(map[string]any, n)
	for i := 0; i < n; i++ {
		m[fmt.Sprintf("key%03d", i)] = i
	}
	return m
}

// validFrameValues are message dicts every peer decodes into a string-keyed dict.
func validFrameValues() map[string]map[string]any {
	return map[string]map[string]any{
		"empty":   {},
		"text":    {"type": "websocket.send", "text": "hello"},
		"bytes":   {"type": "http.response.body", "body": []byte("\x00\x01\xff"), "more_body": false},
		"unicode": {"text": "안녕 ✓ émoji 🎉", "ключ": "значение"},
		"ints": {
			"big": int64(1) << 62, "neg": -1, "neg8": -100, "neg16": -30000, "neg32": -2000000000,
			"neg64": int64(-1) << 62, "u8": 200, "u16": 60000, "u32": uint32(4000000000),
			"u64": uint64(1) << 63, "zero": 0,
		},
		"floats":      {"f": 1.5, "f32": float32(2.25), "neg": -0.5},
		"list":        {"items": []any{1, nil, "x", []byte("y"), true, 1.5}},
		"nested":      {"a": map[string]any{"b": map[string]any{"c": []any{map[string]any{"d": nil}}}}},
		"bools":       {"t": true, "f": false, "n": nil},
		"empty map":   {"m": map[string]any{}, "l": []any{}, "s": "", "b": []byte{}},
		"str8":        {"s": strings.Repeat("x", 200)},
		"str16":       {"s": strings.Repeat("é", 200)},
		"str32":       {"s": strings.Repeat("y", 70000)},
		"long key":    {strings.Repeat("k", 300): 1},
		"bin16":       {"b": bytes.Repeat([]byte{0xc1}, 300)},
		"bin32":       {"b": bytes.Repeat([]byte{0xff}, 70000)},
		"array16":     {"a": manyItems(16)},
		"array32":     {"a": manyItems(70000)},
		"map16":       manyEntries(16),
		"nested map":  {"m": manyEntries(20)},
		"headers":     {"headers": []any{[]any{[]byte("host"), []byte("example.com")}}},
		"asgi nested": {"inner": map[string]any{ReservedKey: "x"}},
	}
}

func TestValidateFrameAcceptsValid(t *testing.T) {
	for desc, v := range validFrameValues() {
		body := mustMarshal(t, v)
		if err := ValidateFrame(body); err != nil {
			t.Errorf("%s: ValidateFrame = %v, want nil", desc, err)
		}
		if err := validateOutbound(body); err != nil {
			t.Errorf("%s: validateOutbound = %v, want nil", desc, err)
		}
	}
}

func TestValidateFrameAcceptsHeaderForms(t *testing.T) {
	// The same content in every header width msgpack allows, as other encoders may choose them.
	for _, tc := range []struct {
		desc string
		body []byte
	}{
		{"fixmap", []byte{0x81, 0xa1, 'a', 0x01}},
		{"map16", []byte{0xde, 0x00, 0x01, 0xa1, 'a', 0x01}},
		{"map32", []byte{0xdf, 0x00, 0x00, 0x00, 0x01, 0xa1, 'a', 0x01}},
		{"str8 key", []byte{0x81, 0xd9, 0x01, 'a', 0x01}},
		{"str16 key", []byte{0x81, 0xda, 0x00, 0x01, 'a', 0x01}},
		{"str32 key", []byte{0x81, 0xdb, 0x00, 0x00, 0x00, 0x01, 'a', 0x01}},
		{"empty key", []byte{0x81, 0xa0, 0xc0}},
		{"array16", []byte{0x81, 0xa1, 'a', 0xdc, 0x00, 0x01, 0xc3}},
		{"array32", []byte{0x81, 0xa1, 'a', 0xdd, 0x00, 0x00, 0x00, 0x01, 0xc2}},
		{"bin8", []byte{0x81, 0xa1, 'a', 0xc4, 0x02, 0xff, 0xfe}},
		{"bin16", []byte{0x81, 0xa1, 'a', 0xc5, 0x00, 0x01, 0xff}},
		{"bin32", []byte{0x81, 0xa1, 'a', 0xc6, 0x00, 0x00, 0x00, 0x01, 0xff}},
		{"float32", []byte{0x81, 0xa1, 'a', 0xca, 0x3f, 0xc0, 0x00, 0x00}},
		{"float64", []byte{0x81, 0xa1, 'a', 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0}},
		{"uint64", []byte{0x81, 0xa1, 'a', 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
		{"int8", []byte{0x81, 0xa1, 'a', 0xd0, 0x80}},
		{"negative fixint", []byte{0x81, 0xa1, 'a', 0xff}},
		{"nested map16 value", []byte{0x81, 0xa1, 'a', 0xde, 0x00, 0x01, 0xa1, 'b', 0x90}},
	} {
		if err := ValidateFrame(tc.body); err != nil {
			t.Errorf("%s: ValidateFrame(% x) = %v, want nil", tc.desc, tc.body, err)
		}
		var m map[string]any
		if err := msgpack.Unmarshal(tc.body, &m); err != nil {
			t.Errorf("%s: the test frame itself does not decode: %v", tc.desc, err)
		}
	}
}

// nestedArrays returns {"k": [[...[]...]]} whose innermost array sits at the given depth; the
// top-level map's values are at depth 1.
func nestedArrays(depth int) []byte {
	b := []byte{0x81, 0xa1, 'k'}
	b = append(b, bytes.Repeat([]byte{0x91}, depth-1)...)
	return append(b, 0x90)
}

// scalarAt returns {"k": [[...[1]...]]} whose innermost integer sits at the given depth.
func scalarAt(depth int) []byte {
	b := []byte{0x81, 0xa1, 'k'}
	b = append(b, bytes.Repeat([]byte{0x91}, depth-1)...)
	return append(b, 0x01)
}

// nestedMaps returns {"k": {"k": ... {} ...}} whose innermost map sits at the given depth.
func nestedMaps(depth int) []byte {
	b := []byte{0x81, 0xa1, 'k'}
	b = append(b, bytes.Repeat([]byte{0x81, 0xa1, 'k'}, depth-1)...)
	return append(b, 0x80)
}

func TestValidateFrameDepth(t *testing.T) {
	for _, tc := range []struct {
		desc string
		body []byte
		ok   bool
	}{
		{"arrays at the limit", nestedArrays(maxFrameDepth), true},
		{"arrays one past the limit", nestedArrays(maxFrameDepth + 1), false},
		{"maps at the limit", nestedMaps(maxFrameDepth), true},
		{"maps one past the limit", nestedMaps(maxFrameDepth + 1), false},
		{"scalar at the limit", scalarAt(maxFrameDepth), true},
		{"scalar one past the limit", scalarAt(maxFrameDepth + 1), false},
		{"far too deep", nestedArrays(100000), false},
	} {
		err := ValidateFrame(tc.body)
		if tc.ok {
			if err != nil {
				t.Errorf("%s: ValidateFrame = %v, want nil", tc.desc, err)
			}
			var m map[string]any
			if err := msgpack.Unmarshal(tc.body, &m); err != nil {
				t.Errorf("%s: the test frame itself does not decode: %v", tc.desc, err)
			}
			continue
		}
		fe := wantFrameError(t, err, tc.desc)
		if !strings.Contains(fe.Reason, "deeper") {
			t.Errorf("%s: reason %q does not name the depth", tc.desc, fe.Reason)
		}
	}
	if maxFrameDepth != 512 {
		t.Errorf("maxFrameDepth = %d; the peers' recursion limits were checked against 512", maxFrameDepth)
	}
}

func TestValidateFrameRefusesInvalid(t *testing.T) {
	valid := mustMarshal(t, map[string]any{"a": 1})
	map32Huge := []byte{0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'a', 0x01}
	for _, tc := range []struct {
		desc   string
		body   []byte
		reason string // a substring of FrameError.Reason, if it matters
		offset int    // the expected FrameError.Offset, or -1
	}{
		{"empty", nil, "empty", 0},
		{"array at top level", []byte{0x91, 0x01}, "not a map", 0},
		{"int at top level", []byte{0x01}, "not a map", 0},
		{"string at top level", []byte{0xa1, 'x'}, "not a map", 0},
		{"nil at top level", []byte{0xc0}, "not a map", 0},
		{"0xc1 at top level", []byte{0xc1}, "not a map", 0},
		{"0xc1 as a value", []byte{0x81, 0xa1, 'a', 0xc1}, "0xc1", 3},
		{"trailing garbage", append(append([]byte{}, valid...), 0x00), "follow", len(valid)},
		{"two maps", append(append([]byte{}, valid...), valid...), "follow", len(valid)},
		{"int key", []byte{0x81, 0x01, 0xa1, 'x'}, "key", 1},
		{"nil key", []byte{0x81, 0xc0, 0x01}, "key", 1},
		{"bin key", []byte{0x81, 0xc4, 0x01, 'a', 0x01}, "key", 1},
		{"array key", []byte{0x81, 0x90, 0x01}, "key", 1},
		{"nested int key", []byte{0x81, 0xa1, 'm', 0x81, 0x01, 0x02}, "key", 4},
		{"nested key in a list", []byte{0x81, 0xa1, 'l', 0x91, 0x81, 0xc3, 0x02}, "key", 5},
		{"invalid UTF-8 value", []byte{0x81, 0xa1, 'a', 0xa2, 0xc3, 0x28}, "UTF-8", 4},
		{"invalid UTF-8 key", []byte{0x81, 0xa1, 0xff, 0x01}, "UTF-8", 2},
		{"surrogate in str8", []byte{0x81, 0xa1, 'a', 0xd9, 0x03, 0xed, 0xa0, 0x80}, "UTF-8", 5},
		{"invalid UTF-8 nested key", []byte{0x81, 0xa1, 'm', 0x81, 0xa1, 0x80, 0x01}, "UTF-8", 5},
		{"fixext1", []byte{0x81, 0xa1, 'a', 0xd4, 0x01, 0x00}, "ext", 3},
		{"fixext16", append([]byte{0x81, 0xa1, 'a', 0xd8, 0x01}, make([]byte, 16)...), "ext", 3},
		{"ext8", []byte{0x81, 0xa1, 'a', 0xc7, 0x01, 0x05, 0x00}, "ext", 3},
		{"ext16", []byte{0x81, 0xa1, 'a', 0xc8, 0x00, 0x01, 0x05, 0x00}, "ext", 3},
		{"timestamp ext", []byte{0x81, 0xa1, 'a', 0xd6, 0xff, 0, 0, 0, 0}, "ext", 3},
		{"map32 claiming 2^32-1 entries", map32Huge, "truncated", -1},
		{"map16 claiming more entries", []byte{0xde, 0x00, 0x02, 0xa1, 'a', 0x01}, "truncated", -1},
		{"array32 claiming 2^32-1 items", []byte{0x81, 0xa1, 'a', 0xdd, 0xff, 0xff, 0xff, 0xff, 0x01}, "truncated", -1},
		{"str32 claiming 2^32-1 bytes", []byte{0x81, 0xa1, 'a', 0xdb, 0xff, 0xff, 0xff, 0xff, 'x'}, "truncated", -1},
		{"bin32 claiming 2^32-1 bytes", []byte{0x81, 0xa1, 'a', 0xc6, 0xff, 0xff, 0xff, 0xff, 'x'}, "truncated", -1},
		{"str32 key claiming 2^31 bytes", []byte{0x81, 0xdb, 0x80, 0x00, 0x00, 0x00, 'x'}, "truncated", -1},
	} {
		fe := wantFrameError(t, ValidateFrame(tc.body), tc.desc)
		if !strings.Contains(fe.Reason, tc.reason) {
			t.Errorf("%s: reason %q does not contain %q", tc.desc, fe.Reason, tc.reason)
		}
		if tc.offset >= 0 && fe.Offset != tc.offset {
			t.Errorf("%s: offset %d, want %d", tc.desc, fe.Offset, tc.offset)
		}
		if fe.Offset < 0 || fe.Offset > len(tc.body) {
			t.Errorf("%s: offset %d outside the body of %d bytes", tc.desc, fe.Offset, len(tc.body))
		}
		if !strings.Contains(fe.Error(), fe.Reason) {
			t.Errorf("%s: Error() %q does not contain the reason", tc.desc, fe.Error())
		}
		wantFrameError(t, validateOutbound(tc.body), tc.desc+" (outbound)")
	}
}

func TestValidateFrameRefusesEveryTruncation(t *testing.T) {
	for desc, v := range validFrameValues() {
		body := mustMarshal(t, v)
		if len(body) > 5000 {
			// Large frames: cut around every header and a sample of the body.
			for _, cut := range []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 100, 255, 256, 1000, len(body) / 2, len(body) - 2, len(body) - 1} {
				if cut < len(body) {
					wantFrameError(t, ValidateFrame(body[:cut]), desc+" cut")
				}
			}
			continue
		}
		for cut := 0; cut < len(body); cut++ {
			if ValidateFrame(body[:cut]) == nil {
				t.Errorf("%s: the first %d of %d bytes were accepted", desc, cut, len(body))
			}
		}
	}
}

func TestValidateOutboundReservedKey(t *testing.T) {
	for _, tc := range []struct {
		desc string
		v    map[string]any
		ok   bool
	}{
		{"top-level reserved key", map[string]any{ReservedKey: "x"}, false},
		{"reserved key among others", map[string]any{"type": "t", "a": 1, "b": []any{1, 2}, ReservedKey: "x", "z": nil}, false},
		{"reserved key with a nested value", map[string]any{"m": map[string]any{"x": []any{1}}, ReservedKey: map[string]any{}}, false},
		{"reserved key nested", map[string]any{"inner": map[string]any{ReservedKey: "x"}}, true},
		{"reserved key as a value", map[string]any{"k": ReservedKey}, true},
		{"reserved key in a list", map[string]any{"l": []any{ReservedKey, map[string]any{ReservedKey: 1}}}, true},
		{"similar key", map[string]any{ReservedKey + "x": 1, "__asgi_channel": 2}, true},
	} {
		body := mustMarshal(t, tc.v)
		if err := ValidateFrame(body); err != nil {
			t.Errorf("%s: ValidateFrame = %v, want nil (the reserved key is a send-side rule)", tc.desc, err)
		}
		err := validateOutbound(body)
		if tc.ok {
			if err != nil {
				t.Errorf("%s: validateOutbound = %v, want nil", tc.desc, err)
			}
			continue
		}
		fe := wantFrameError(t, err, tc.desc)
		if !strings.Contains(fe.Reason, ReservedKey) {
			t.Errorf("%s: reason %q does not name %s", tc.desc, fe.Reason, ReservedKey)
		}
	}
	// The reserved key in a long str form is the same key.
	long := []byte{0x81, 0xd9, byte(len(ReservedKey))}
	long = append(append(long, ReservedKey...), 0x01)
	wantFrameError(t, validateOutbound(long), "reserved key as str8")
	// Keys that merely start with the reserved key's bytes at the key position are not it.
	prefixed := mustMarshal(t, map[string]any{"__asgi": 1})
	if err := validateOutbound(prefixed); err != nil {
		t.Errorf("validateOutbound(__asgi) = %v", err)
	}
}

// frameSeeds are the seed inputs of FuzzValidateFrame; testdata/fuzz/FuzzValidateFrame holds a
// few of them as committed corpus files as well.
func frameSeeds(t testing.TB) [][]byte {
	seeds := [][]byte{
		nil,
		{0x80},
		{0x91, 0x01},
		{0xc1},
		{0x81, 0x01, 0xa1, 'x'},
		{0x81, 0xa1, 'm', 0x81, 0x01, 0x02},
		{0x81, 0xa1, 'a', 0xa2, 0xc3, 0x28},
		{0x81, 0xa1, 0xff, 0x01},
		{0x81, 0xa1, 'a', 0xd4, 0x01, 0x00},
		{0x81, 0xa1, 'a', 0xc7, 0x01, 0x05, 0x00},
		{0xdf, 0xff, 0xff, 0xff, 0xff, 0xa1, 'a', 0x01},
		{0x81, 0xa1, 'a', 0xdd, 0xff, 0xff, 0xff, 0xff, 0x01},
		{0x81, 0xa1, 'a', 0x01, 0x00},
		nestedArrays(maxFrameDepth),
		nestedArrays(maxFrameDepth + 1),
	}
	for _, v := range []map[string]any{
		{"type": "websocket.send", "text": "hello"},
		{"body": []byte("\x00\x01\xff"), "n": int64(1) << 62, "neg": -7, "f": 1.5, "f32": float32(0.5)},
		{"l": []any{1, nil, "x", map[string]any{"k": true}}, "m": map[string]any{}},
		{"s": strings.Repeat("x", 300), "a": manyItems(20)},
		manyEntries(17),
	} {
		b := mustMarshal(t, v)
		seeds = append(seeds, b, b[:len(b)-1])
	}
	return seeds
}

func FuzzValidateFrame(f *testing.F) {
	for _, s := range frameSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		err := ValidateFrame(body)
		outErr := validateOutbound(body)
		if err != nil {
			var fe *FrameError
			if !errors.As(err, &fe) {
				t.Fatalf("ValidateFrame error %v (%T) is not a *FrameError", err, err)
			}
			if fe.Offset < 0 || fe.Offset > len(body) {
				t.Fatalf("offset %d outside the body of %d bytes", fe.Offset, len(body))
			}
			if outErr == nil {
				t.Fatalf("validateOutbound accepted a frame ValidateFrame refused: %v", err)
			}
			// vmihailenco's map decoder preallocates what a header claims, so an unchecked
			// frame is not handed to it: a decode that fails implies the check above refused,
			// which is the contrapositive of the decode-must-succeed check below.
			return
		}
		var m map[string]any
		if derr := msgpack.Unmarshal(body, &m); derr != nil {
			t.Fatalf("ValidateFrame accepted % x but msgpack.Unmarshal fails: %v", body, derr)
		}
		if m == nil {
			t.Fatalf("ValidateFrame accepted % x but it decodes to a nil map", body)
		}
		// The layer's own decoder gives what vmihailenco gives, type for type.
		own, oerr := DecodeMessage(body)
		if oerr != nil || !sameDecoded(own, m) {
			t.Fatalf("DecodeMessage(% x) = %#v, %v; vmihailenco/msgpack gives %#v", body, own, oerr, m)
		}
		if encoded, eerr := encodeMessage(own); eerr != nil || ValidateFrame(encoded) != nil {
			t.Fatalf("re-encoding %#v with encodeMessage: % x, %v", own, encoded, eerr)
		}
		again, merr := msgpack.Marshal(m)
		if merr != nil {
			t.Fatalf("re-encoding the decoded frame: %v", merr)
		}
		if err := ValidateFrame(again); err != nil {
			t.Fatalf("the re-encoded frame % x is refused: %v", again, err)
		}
		_, reserved := m[ReservedKey]
		if reserved != (outErr != nil) {
			t.Fatalf("reserved key present=%v but validateOutbound = %v", reserved, outErr)
		}
	})
}

// sameDecoded is reflect.DeepEqual, except that NaN equals NaN (a frame may carry one).
func sameDecoded(a, b any) bool {
	switch a := a.(type) {
	case float64:
		b, ok := b.(float64)
		return ok && (a == b || a != a && b != b)
	case float32:
		b, ok := b.(float32)
		return ok && (a == b || a != a && b != b)
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !sameDecoded(a[i], b[i]) {
				return false
			}
		}
		return true
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, v := range a {
			if w, found := b[k]; !found || !sameDecoded(v, w) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(a, b)
}

// TestFrameCorpusFiles keeps the committed seed corpus honest: files named valid_* hold frames
// ValidateFrame accepts, files named invalid_* frames it refuses.
func TestFrameCorpusFiles(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzValidateFrame")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("reading the seed corpus: %v", err)
	}
	valid, invalid := 0, 0
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) != 2 || lines[0] != "go test fuzz v1" {
			t.Errorf("%s: not a corpus file of one []byte value", e.Name())
			continue
		}
		lit, ok := strings.CutPrefix(lines[1], "[]byte(")
		lit, ok2 := strings.CutSuffix(lit, ")")
		body, err := strconv.Unquote(lit)
		if !ok || !ok2 || err != nil {
			t.Errorf("%s: cannot read %q: %v", e.Name(), lines[1], err)
			continue
		}
		err = ValidateFrame([]byte(body))
		switch {
		case strings.HasPrefix(e.Name(), "valid_"):
			valid++
			if err != nil {
				t.Errorf("%s: ValidateFrame = %v, want nil", e.Name(), err)
			}
		case strings.HasPrefix(e.Name(), "invalid_"):
			invalid++
			wantFrameError(t, err, e.Name())
		}
	}
	if valid == 0 || invalid == 0 {
		t.Errorf("the seed corpus has %d valid and %d invalid frames; want some of each", valid, invalid)
	}
}

// TestFrameExpansionIsBounded: a body of nothing but empty maps would decode to tens of times its
// size; it is refused at send and dropped on arrival. Records of a few fields are far below the
// bound, at any size, and small messages may hold MaxContainers maps and arrays.
func TestFrameExpansionIsBounded(t *testing.T) {
	maps := make([]any, 100_000)
	for i := range maps {
		maps[i] = map[string]any{}
	}
	bomb, err := encodeMessage(map[string]any{"type": "bomb", "maps": maps})
	if err != nil {
		t.Fatal(err)
	}
	var frameErr *FrameError
	if err := ValidateFrame(bomb); !errors.As(err, &frameErr) || !strings.Contains(err.Error(), "expand") {
		t.Fatalf("ValidateFrame(100,000 empty maps) = %v, want a FrameError about expansion", err)
	}
	rows := make([]any, 20_000)
	for i := range rows {
		rows[i] = map[string]any{"id": i, "name": fmt.Sprintf("row %d", i)}
	}
	table, _ := encodeMessage(map[string]any{"type": "rows", "rows": rows})
	if err := ValidateFrame(table); err != nil {
		t.Errorf("20,000 records refused: %v", err)
	}
	small := make([]any, MaxContainers-1)
	for i := range small {
		small[i] = []any{}
	}
	few, _ := encodeMessage(map[string]any{"l": small})
	if err := ValidateFrame(few); err != nil {
		t.Errorf("%d empty arrays in a small message refused: %v", MaxContainers, err)
	}
}
