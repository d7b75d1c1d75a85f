//go:build linux

package abitest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// cn_receive_many and cn_put_back_many (include/channels_nats.h, after cn_put_back): a host takes
// up to max waiting messages of a channel in one call, as a block of records (uint32 body length,
// uint32 milliseconds left before the message expires, both little-endian, then the body), and
// returns those it will not deliver in the same form, to the front of the mailbox, in order.

// recordHeader is the size of a record's header: body length and time left.
const recordHeader = 8

// record is one message of a block.
type record struct {
	body []byte
	left uint32 // milliseconds left before it expires
}

// encodeBlock builds a block from records.
func encodeBlock(recs []record) []byte {
	var b []byte
	for _, r := range recs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(r.body)))
		b = binary.LittleEndian.AppendUint32(b, r.left)
		b = append(b, r.body...)
	}
	return b
}

// parseBlock reads the records of a block that must hold count of them and nothing else. It
// reports with t.Errorf, so that it may run on any goroutine.
func parseBlock(t testing.TB, block []byte, count int) []record {
	t.Helper()
	var recs []record
	for at := 0; at < len(block); {
		if len(block)-at < recordHeader {
			t.Errorf("block of %d bytes ends inside the header of record %d (at byte %d)", len(block), len(recs), at)
			return recs
		}
		n := int(binary.LittleEndian.Uint32(block[at:]))
		left := binary.LittleEndian.Uint32(block[at+4:])
		if len(block)-at-recordHeader < n {
			t.Errorf("block of %d bytes ends inside the body of record %d (%d bytes at byte %d)", len(block), len(recs), n, at)
			return recs
		}
		recs = append(recs, record{append([]byte(nil), block[at+recordHeader:at+recordHeader+n]...), left})
		at += recordHeader + n
	}
	if len(recs) != count {
		t.Errorf("the block holds %d records, *count says %d", len(recs), count)
	}
	return recs
}

// blockSize is the size of a block of these bodies: each record is its header and its body.
func blockSize(bodies [][]byte) int {
	n := 0
	for _, b := range bodies {
		n += recordHeader + len(b)
	}
	return n
}

// takeManyRaw is one cn_receive_many. On CN_OK it checks the out-parameters the header promises
// (reporting with t.Errorf, so that it may run on any goroutine), copies the block, frees it with
// cn_free and parses it. On a failure it returns the status and cn_last_error().
func takeManyRaw(t testing.TB, h uint64, channel string, max uintptr) ([]byte, []record, int32, string) {
	t.Helper()
	// Garbage in the out-parameters: the library must overwrite all three.
	p, n, count := ^uintptr(0), uintptr(0xdead), uintptr(0xbeef)
	st, msg := onThread(func() int32 { return cnReceiveMany(h, cs(channel), max, &p, &n, &count) })
	if st != cnOK {
		return nil, nil, st, msg
	}
	if msg != "" {
		t.Errorf("cn_receive_many: cn_last_error() is %q after CN_OK", msg)
	}
	if count > max {
		t.Errorf("cn_receive_many(max %d): count %d", max, count)
	}
	if count == 0 {
		if p != 0 {
			t.Errorf("cn_receive_many(max %d): count 0 but block %#x, want NULL", max, p)
		}
		if n != 0 {
			t.Errorf("cn_receive_many(max %d): count 0 but len %d, want 0", max, n)
		}
		return nil, nil, st, msg
	}
	if p == 0 || p == ^uintptr(0) {
		t.Errorf("cn_receive_many(max %d): count %d but block %#x", max, count, p)
		return nil, nil, cnInternal, msg
	}
	block := takeBytes(p, n)
	return block, parseBlock(t, block, int(count)), st, msg
}

// takeMany is takeManyRaw that must return CN_OK.
// backlog has sender send the numbered messages 0..n-1 to ch and waits until c has them all.
func (c *client) backlog(sender *client, ch string, n int) {
	c.t.Helper()
	for i := range n {
		sender.send(ch, numbered(c.t, i))
	}
	c.barrier(sender)
}

func (c *client) takeMany(channel string, max uintptr) ([]byte, []record) {
	c.t.Helper()
	block, recs, st, msg := takeManyRaw(c.t, c.h, channel, max)
	if st != cnOK {
		c.t.Fatalf("cn_receive_many(%s, %d): %s (%s)", channel, max, name(st), msg)
	}
	return block, recs
}

// putBackMany returns block (never NULL, also when empty) and requires CN_OK.
func (c *client) putBackMany(channel string, block []byte) {
	c.t.Helper()
	b, n := bp(block)
	st, msg := onThread(func() int32 { return cnPutBackMany(c.h, cs(channel), b, n) })
	if st != cnOK {
		c.t.Fatalf("cn_put_back_many(%s, %d bytes): %s (%s)", channel, len(block), name(st), msg)
	}
	if msg != "" {
		c.t.Errorf("cn_put_back_many: cn_last_error() is %q after CN_OK", msg)
	}
}

// nothingWaiting checks that channel holds no message now: a receive is pending, and is
// withdrawn.
func (c *client) nothingWaiting(channel string) {
	c.t.Helper()
	w := newWaiter(1, nil)
	st, body, op := c.receive(channel, w)
	switch st {
	case cnPending:
		if st := cnCancel(c.h, op); st != cnOK {
			c.t.Errorf("cn_cancel of the probing receive: %s", name(st))
		}
	case cnOK:
		c.t.Errorf("%s still holds a message (n=%d, %d bytes), want none", channel, numberOf(body), len(body))
	default:
		c.t.Errorf("probing receive on %s: %s", channel, name(st))
	}
}

// counter is a number of the client's stats: "delivered", or "dropped.expired".
func (c *client) counter(key string) int {
	c.t.Helper()
	s := c.stats()
	doc := s
	if sub, ok := strings.CutPrefix(key, "dropped."); ok {
		doc, _ = s["dropped"].(map[string]any)
		key = sub
	}
	v, ok := doc[key].(float64)
	if !ok {
		c.t.Fatalf("stats: no number %q: %v", key, s)
	}
	return int(v)
}

// numbers are the "n" of the records' bodies.
func numbers(recs []record) []int {
	out := make([]int, len(recs))
	for i, r := range recs {
		out[i] = numberOf(r.body)
	}
	return out
}

// ms is d in whole milliseconds, as a signed number for bounds.
func ms(d time.Duration) int64 { return d.Milliseconds() }

// k messages waiting, max n: min(n, k) records, oldest first, byte-exact (zero bytes, a 100 kB
// body), with a time left within the expiry; they count as delivered; the rest stays in order.
func TestReceiveManyOldestFirst(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, map[string]any{"expiry": 2})
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	zeros := pack(t, map[string]any{"type": "test", "n": 1, "bin": []byte{0, 0, 1, 0, 255, 0}, "text": "a\x00b\x00"})
	pattern := make([]byte, 100_000)
	for i := range pattern {
		pattern[i] = byte(i % 7) // every seventh byte is 0
	}
	big := pack(t, map[string]any{"type": "test", "n": 2, "bin": pattern})
	sent := [][]byte{numbered(t, 0), zeros, big, numbered(t, 3), numbered(t, 4)}
	if bytes.IndexByte(zeros, 0) < 0 || len(big) < 100_000 {
		t.Fatal("test bodies are not what they should be")
	}
	for _, b := range sent {
		sender.send(ch, b)
	}
	c.barrier(sender)
	delivered := c.counter("delivered")

	block, recs := c.takeMany(ch, 3)
	if len(recs) != 3 {
		t.Fatalf("cn_receive_many(max 3) with 5 waiting: %d records %v, want 3", len(recs), numbers(recs))
	}
	if len(block) != blockSize(sent[:3]) {
		t.Errorf("block is %d bytes, want %d (8 + body per record)", len(block), blockSize(sent[:3]))
	}
	for i, r := range recs {
		if !bytes.Equal(r.body, sent[i]) {
			t.Errorf("record %d: %d bytes (n=%d), want %d bytes of message %d byte for byte", i, len(r.body), numberOf(r.body), len(sent[i]), i)
		}
		if r.left > 2000 || r.left < 1000 {
			t.Errorf("record %d: %d ms left, want at most the expiry (2000 ms) and not much less", i, r.left)
		}
	}
	if got := c.counter("delivered"); got != delivered+3 {
		t.Errorf("stats: delivered = %d after taking 3, want %d", got, delivered+3)
	}
	// The rest is still there, in order, for cn_receive.
	for i := 3; i < 5; i++ {
		if got := c.receiveNow(ch); !bytes.Equal(got, sent[i]) {
			t.Errorf("cn_receive after the take: n=%d, want %d", numberOf(got), i)
		}
	}
	c.nothingWaiting(ch)
	if got := c.counter("delivered"); got != delivered+5 {
		t.Errorf("stats: delivered = %d, want %d", got, delivered+5)
	}

	// Fewer waiting than max: all of them. Then none.
	for i := 10; i < 13; i++ {
		sender.send(ch, numbered(t, i))
	}
	c.barrier(sender)
	if _, recs := c.takeMany(ch, 10); fmt.Sprint(numbers(recs)) != "[10 11 12]" {
		t.Errorf("cn_receive_many(max 10) with 3 waiting: %v, want [10 11 12]", numbers(recs))
	}
	if _, recs := c.takeMany(ch, 10); len(recs) != 0 {
		t.Errorf("cn_receive_many after everything was taken: %v, want none", numbers(recs))
	}
	// max SIZE_MAX is "all of them".
	sender.send(ch, numbered(t, 20))
	sender.send(ch, numbered(t, 21))
	c.barrier(sender)
	if _, recs := c.takeMany(ch, ^uintptr(0)); fmt.Sprint(numbers(recs)) != "[20 21]" {
		t.Errorf("cn_receive_many(max SIZE_MAX) with 2 waiting: %v, want [20 21]", numbers(recs))
	}
}

// Nothing waiting: CN_OK, count 0, block NULL. max 0 takes nothing, even with messages waiting.
func TestReceiveManyNone(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	if _, recs := c.takeMany(ch, 16); len(recs) != 0 {
		t.Errorf("cn_receive_many of an empty mailbox: %v", numbers(recs))
	}
	c.send(ch, numbered(t, 1))
	c.send(ch, numbered(t, 2))
	c.barrier(c)
	delivered := c.counter("delivered")
	if _, recs := c.takeMany(ch, 0); len(recs) != 0 {
		t.Errorf("cn_receive_many(max 0): %v, want none", numbers(recs))
	}
	if got := c.counter("delivered"); got != delivered {
		t.Errorf("stats: delivered = %d after max 0, want %d", got, delivered)
	}
	if _, recs := c.takeMany(ch, 16); fmt.Sprint(numbers(recs)) != "[1 2]" {
		t.Errorf("after max 0 the messages are %v, want [1 2]", numbers(recs))
	}
}

// The time left of each record is the expiry less the time it waited since it reached the
// client; a block put back unchanged keeps counting down from there.
func TestReceiveManyTimeLeft(t *testing.T) {
	const expiry = 2000 // ms
	ts := startServer(t)
	c := connect(t, ts.url, map[string]any{"expiry": expiry / 1000})
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	// Each message reaches c between the start of its send and the end of its barrier.
	sent0 := time.Now()
	sender.send(ch, numbered(t, 0))
	c.barrier(sender)
	arrived0 := time.Now()
	time.Sleep(500 * time.Millisecond)
	sent1 := time.Now()
	sender.send(ch, numbered(t, 1))
	c.barrier(sender)
	arrived1 := time.Now()
	time.Sleep(300 * time.Millisecond)

	before := time.Now()
	block, recs := c.takeMany(ch, 2)
	after := time.Now()
	if fmt.Sprint(numbers(recs)) != "[0 1]" {
		t.Fatalf("took %v, want [0 1]", numbers(recs))
	}
	bounds := func(what string, left uint32, waitedAtLeast, waitedAtMost time.Duration) {
		t.Helper()
		lo, hi := expiry-ms(waitedAtMost)-2, expiry-ms(waitedAtLeast)+1
		if int64(left) < lo || int64(left) > hi {
			t.Errorf("%s: %d ms left, want %d..%d (expiry %d ms less the time it waited)", what, left, lo, hi, expiry)
		}
	}
	bounds("message 0", recs[0].left, before.Sub(arrived0), after.Sub(sent0))
	bounds("message 1", recs[1].left, before.Sub(arrived1), after.Sub(sent1))
	if recs[0].left >= recs[1].left {
		t.Errorf("the older message has %d ms left, the newer %d: want less", recs[0].left, recs[1].left)
	}

	// Put back unchanged: the time left runs on from what the block says.
	putBefore := time.Now()
	c.putBackMany(ch, block)
	putAfter := time.Now()
	time.Sleep(300 * time.Millisecond)
	before = time.Now()
	_, again := c.takeMany(ch, 2)
	after = time.Now()
	if fmt.Sprint(numbers(again)) != "[0 1]" {
		t.Fatalf("after the put-back took %v, want [0 1]", numbers(again))
	}
	for i, r := range again {
		lo := int64(recs[i].left) - ms(after.Sub(putBefore)) - 2
		hi := int64(recs[i].left) - ms(before.Sub(putAfter)) + 1
		if int64(r.left) < lo || int64(r.left) > hi {
			t.Errorf("message %d: %d ms left after it was put back with %d ms and waited >= 300 ms, want %d..%d", i, r.left, recs[i].left, lo, hi)
		}
	}
}

// Put back unchanged: at the front, in their order, before messages that arrived meanwhile; no
// longer counted as delivered. The library copies the block.
func TestPutBackManyOrder(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	c.backlog(sender, ch, 5)
	block, recs := c.takeMany(ch, 3)
	if fmt.Sprint(numbers(recs)) != "[0 1 2]" {
		t.Fatalf("took %v, want [0 1 2]", numbers(recs))
	}
	sender.send(ch, numbered(t, 5))
	sender.send(ch, numbered(t, 6))
	c.barrier(sender)
	delivered := c.counter("delivered")
	c.putBackMany(ch, block)
	for i := range block {
		block[i] = 0xc1 // the library copied what it keeps
	}
	if got := c.counter("delivered"); got != delivered-3 {
		t.Errorf("stats: delivered = %d after putting 3 back, want %d", got, delivered-3)
	}
	for i := range 7 {
		if got := numberOf(c.receiveNow(ch)); got != i {
			t.Fatalf("receive %d after the put-back got n=%d, want %d", i, got, i)
		}
	}
	c.nothingWaiting(ch)

	// A block the host rebuilt with its time left updated goes back in its order, too; and
	// several put-backs in a row each go to the front.
	for i := 10; i < 14; i++ {
		sender.send(ch, numbered(t, i))
	}
	c.barrier(sender)
	_, first := c.takeMany(ch, 2)
	_, second := c.takeMany(ch, 2)
	if fmt.Sprint(numbers(first), numbers(second)) != "[10 11] [12 13]" {
		t.Fatalf("took %v and %v, want [10 11] and [12 13]", numbers(first), numbers(second))
	}
	for i := range second {
		second[i].left -= 10
	}
	c.putBackMany(ch, encodeBlock(second))
	c.putBackMany(ch, encodeBlock(first))
	if _, recs := c.takeMany(ch, 10); fmt.Sprint(numbers(recs)) != "[10 11 12 13]" {
		t.Errorf("after two put-backs took %v, want [10 11 12 13]", numbers(recs))
	}
}

// Time left 0: the messages expire in the mailbox and the next receive drops them (counted as
// dropped.expired). Another time left is kept: such a message expires when it says.
func TestPutBackManyExpired(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, map[string]any{"expiry": 2})
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	c.backlog(sender, ch, 3)
	_, recs := c.takeMany(ch, 3)
	if len(recs) != 3 {
		t.Fatalf("took %v, want 3", numbers(recs))
	}
	expired, delivered := c.counter("dropped.expired"), c.counter("delivered")
	for i := range recs {
		recs[i].left = 0
	}
	c.putBackMany(ch, encodeBlock(recs))
	if got := c.counter("delivered"); got != delivered-3 {
		t.Errorf("stats: delivered = %d after putting 3 back, want %d", got, delivered-3)
	}
	c.nothingWaiting(ch)
	if got := c.counter("dropped.expired"); got != expired+3 {
		t.Errorf("stats: dropped.expired = %d after 3 came back with 0 ms left, want %d", got, expired+3)
	}

	// 0 ms, 1500 ms and 150 ms left: the first is dropped, the second received, the third
	// expires after its 150 ms.
	for i := 10; i < 13; i++ {
		sender.send(ch, numbered(t, i))
	}
	c.barrier(sender)
	_, recs = c.takeMany(ch, 3)
	if fmt.Sprint(numbers(recs)) != "[10 11 12]" {
		t.Fatalf("took %v, want [10 11 12]", numbers(recs))
	}
	expired = c.counter("dropped.expired")
	recs[0].left, recs[1].left, recs[2].left = 0, 1500, 150
	c.putBackMany(ch, encodeBlock(recs))
	if got := numberOf(c.receiveNow(ch)); got != 11 {
		t.Errorf("after putting back 0/1500/150 ms left, the receive got n=%d, want 11", got)
	}
	if got := c.counter("dropped.expired"); got != expired+1 {
		t.Errorf("stats: dropped.expired = %d, want %d (the one with 0 ms left)", got, expired+1)
	}
	time.Sleep(400 * time.Millisecond)
	c.nothingWaiting(ch)
	if got := c.counter("dropped.expired"); got != expired+2 {
		t.Errorf("stats: dropped.expired = %d 400 ms later, want %d (the one with 150 ms left)", got, expired+2)
	}
}

// With a receive waiting, the first message put back completes it (on a library thread, not
// during the call) and the rest stay at the front, in order.
func TestPutBackManyPendingReceive(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	c.backlog(sender, ch, 3)
	block, recs := c.takeMany(ch, 3)
	if fmt.Sprint(numbers(recs)) != "[0 1 2]" {
		t.Fatalf("took %v, want [0 1 2]", numbers(recs))
	}
	w := newWaiter(2, nil)
	op := c.receivePending(ch, w)
	delivered := c.counter("delivered")
	b, n := bp(block)
	var caller int
	st, msg := onThread(func() int32 {
		caller = syscall.Gettid()
		return cnPutBackMany(c.h, cs(ch), b, n)
	})
	if st != cnOK {
		t.Fatalf("cn_put_back_many: %s (%s)", name(st), msg)
	}
	r := w.wait(t)
	if r.Status != cnOK || !bytes.Equal(r.Data, recs[0].body) {
		t.Errorf("the waiting receive got %s n=%d, want CN_OK with message 0", name(r.Status), numberOf(r.Data))
	}
	if r.Tid == caller {
		t.Error("the receive callback ran on the thread that called cn_put_back_many, during the call")
	}
	if st := cnCancel(c.h, op); st != cnNotPending {
		t.Errorf("cn_cancel of the completed receive: %s, want CN_NOT_PENDING", name(st))
	}
	for i := 1; i < 3; i++ {
		if got := numberOf(c.receiveNow(ch)); got != i {
			t.Errorf("then n=%d, want %d", got, i)
		}
	}
	c.nothingWaiting(ch)
	w.none(t, 20*time.Millisecond)
	// 3 put back, 1 handed to the receive, 2 received.
	if got := c.counter("delivered"); got != delivered {
		t.Errorf("stats: delivered = %d, want %d", got, delivered)
	}
}

// A block that ends inside a record is refused as a whole: CN_INVALID_ARG, nothing put back
// (not even its complete records). len 0 returns nothing.
func TestPutBackManyMalformed(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	c.send(ch, numbered(t, 1))
	c.send(ch, numbered(t, 2))
	c.barrier(c)
	block, recs := c.takeMany(ch, 2)
	if fmt.Sprint(numbers(recs)) != "[1 2]" {
		t.Fatalf("took %v, want [1 2]", numbers(recs))
	}
	first := recordHeader + len(recs[0].body)
	longer := func(extra uint32) []byte { // the first record's length says extra bytes more
		b := append([]byte(nil), block...)
		binary.LittleEndian.PutUint32(b, uint32(len(recs[0].body))+extra)
		return b
	}
	secondTooLong := append([]byte(nil), block...)
	binary.LittleEndian.PutUint32(secondTooLong[first:], uint32(len(recs[1].body))+1)
	huge := append([]byte(nil), block...)
	binary.LittleEndian.PutUint32(huge[first:], 0xffffffff)
	bad := map[string][]byte{
		"4 bytes":                                    block[:4],
		"7 bytes":                                    block[:7],
		"a header without its body":                  block[:recordHeader],
		"a body cut short":                           block[:first-1],
		"a record and 5 bytes":                       block[:first+5],
		"the block and 3 bytes":                      append(append([]byte(nil), block...), 1, 2, 3),
		"the last body cut short":                    block[:len(block)-1],
		"the first length 1 beyond the block":        longer(uint32(len(block) - first + 1)),
		"the second length 1 beyond the block":       secondTooLong,
		"the second length 0xffffffff":               huge,
		"the first length 0xffffffff":                longer(0xffffffff - uint32(len(recs[0].body))),
		"a record and a header without its body":     append(append([]byte(nil), block[:first]...), 5, 0, 0, 0, 0, 0, 0, 0),
		"the first length 0x80000000 (negative int)": longer(0x80000000 - uint32(len(recs[0].body))),
	}
	delivered := c.counter("delivered")
	var calls []call
	for what, blk := range bad {
		b, n := bp(blk)
		calls = append(calls, call{"cn_put_back_many(" + what + ")", cnInvalidArg,
			func() int32 { return cnPutBackMany(c.h, cs(ch), b, n) }})
	}
	run(t, calls)
	if got := c.counter("delivered"); got != delivered {
		t.Errorf("stats: delivered = %d after refused put-backs, want %d (something was put back)", got, delivered)
	}
	c.nothingWaiting(ch)
	// len 0 with a valid pointer: CN_OK, nothing.
	c.putBackMany(ch, block[:0])
	c.nothingWaiting(ch)
	if got := c.counter("delivered"); got != delivered {
		t.Errorf("stats: delivered = %d after an empty put-back, want %d", got, delivered)
	}
	// The real block still goes back whole.
	c.putBackMany(ch, block)
	if _, again := c.takeMany(ch, 10); fmt.Sprint(numbers(again)) != "[1 2]" {
		t.Errorf("after the refused put-backs took %v, want [1 2]", numbers(again))
	}
}

// Arguments and handles: NULL pointers, invalid UTF-8, names the layer refuses, another client's
// process channel, unknown handles. A refused call takes nothing and puts nothing back.
func TestReceiveManyRefused(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	other := connect(t, ts.url, nil)
	ch := c.newChannel("")
	theirs := other.newChannel("")
	prefixOfTheirs := theirs[:strings.IndexByte(theirs, '!')+1]
	c.send(ch, numbered(t, 1))
	c.barrier(c)
	delivered := c.counter("delivered")
	h := c.h
	var p, n, count uintptr
	valid := encodeBlock([]record{{numbered(t, 99), 1000}})
	vb, vn := bp(valid)
	calls := []call{
		{"cn_receive_many(block NULL)", cnInvalidArg, func() int32 { return cnReceiveMany(h, cs(ch), 8, nil, &n, &count) }},
		{"cn_receive_many(len NULL)", cnInvalidArg, func() int32 { return cnReceiveMany(h, cs(ch), 8, &p, nil, &count) }},
		{"cn_receive_many(count NULL)", cnInvalidArg, func() int32 { return cnReceiveMany(h, cs(ch), 8, &p, &n, nil) }},
		{"cn_receive_many(all NULL)", cnInvalidArg, func() int32 { return cnReceiveMany(h, cs(ch), 8, nil, nil, nil) }},
		{"cn_receive_many(channel NULL)", cnInvalidArg, func() int32 { return cnReceiveMany(h, nil, 8, &p, &n, &count) }},
		{"cn_receive_many(channel invalid UTF-8)", cnInvalidArg, func() int32 { return cnReceiveMany(h, cs(ch[:len(ch)-1]+"\xff"), 8, &p, &n, &count) }},
		{"cn_receive_many(another client's channel)", cnForeign, func() int32 { return cnReceiveMany(h, cs(theirs), 8, &p, &n, &count) }},
		{"cn_receive_many(another client's prefix)", cnForeign, func() int32 { return cnReceiveMany(h, cs(prefixOfTheirs), 8, &p, &n, &count) }},
		{"cn_receive_many(unknown client)", cnInvalidHandle, func() int32 { return cnReceiveMany(999999999, cs(ch), 8, &p, &n, &count) }},
		{"cn_receive_many(client 0)", cnInvalidHandle, func() int32 { return cnReceiveMany(0, cs(ch), 8, &p, &n, &count) }},
		{"cn_put_back_many(channel NULL)", cnInvalidArg, func() int32 { return cnPutBackMany(h, nil, vb, vn) }},
		{"cn_put_back_many(block NULL)", cnInvalidArg, func() int32 { return cnPutBackMany(h, cs(ch), nil, vn) }},
		{"cn_put_back_many(block NULL, len 0)", cnInvalidArg, func() int32 { return cnPutBackMany(h, cs(ch), nil, 0) }},
		{"cn_put_back_many(channel invalid UTF-8)", cnInvalidArg, func() int32 { return cnPutBackMany(h, cs(ch[:len(ch)-1]+"\xff"), vb, vn) }},
		{"cn_put_back_many(unknown client)", cnInvalidHandle, func() int32 { return cnPutBackMany(999999999, cs(ch), vb, vn) }},
		{"cn_put_back_many(client 0)", cnInvalidHandle, func() int32 { return cnPutBackMany(0, cs(ch), vb, vn) }},
	}
	for _, bad := range []string{"bad name", "a..b", ".lead", "trail.", "a*b", "a>b", "", strings.Repeat("a", 200)} {
		calls = append(calls,
			call{"cn_receive_many(" + bad + ")", cnInvalidName, func() int32 { return cnReceiveMany(h, cs(bad), 8, &p, &n, &count) }},
			call{"cn_put_back_many(" + bad + ")", cnInvalidName, func() int32 { return cnPutBackMany(h, cs(bad), vb, vn) }},
		)
	}
	run(t, calls)
	// The waiting message is still there, alone: nothing was taken, nothing put back.
	if got := c.counter("delivered"); got != delivered {
		t.Errorf("stats: delivered = %d after refused calls, want %d", got, delivered)
	}
	if got := numberOf(c.receiveNow(ch)); got != 1 {
		t.Errorf("after the refused calls the receive got n=%d, want 1", got)
	}
	c.nothingWaiting(ch)
	// The other client's mailbox is untouched as well.
	c.send(theirs, numbered(t, 7))
	if got := numberOf(other.receiveAny(theirs)); got != 7 {
		t.Errorf("the other client received n=%d, want 7", got)
	}
}

// A closed client: CN_CLOSED from both.
func TestReceiveManyClosed(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	c.send(ch, numbered(t, 1))
	c.barrier(c)
	if st := cnClose(c.h, 0, 0); st != cnOK {
		t.Fatalf("cn_close: %s", name(st))
	}
	var p, n, count uintptr
	block := encodeBlock([]record{{numbered(t, 2), 1000}})
	b, bn := bp(block)
	run(t, []call{
		{"cn_receive_many(closed client)", cnClosed, func() int32 { return cnReceiveMany(c.h, cs(ch), 8, &p, &n, &count) }},
		{"cn_put_back_many(closed client)", cnClosed, func() int32 { return cnPutBackMany(c.h, cs(ch), b, bn) }},
	})
}

// A client still connecting: CN_ILLEGAL_STATE from both.
func TestReceiveManyConnecting(t *testing.T) {
	url := silentServer(t)
	doc := config(t, []string{url}, map[string]any{"connect_options": map[string]any{"connect_timeout": 2}})
	connected := newWaiter(2, nil)
	var h uint64
	if st := cnConnect(cs(doc), 0, 0, completeCB, connected.closure, &h); st != cnPending {
		t.Fatalf("cn_connect to a silent server: %s, want CN_PENDING", name(st))
	}
	t.Cleanup(func() { cnClose(h, 0, 0) })
	var p, n, count uintptr
	block := encodeBlock([]record{{numbered(t, 2), 1000}})
	b, bn := bp(block)
	run(t, []call{
		{"cn_receive_many(connecting)", cnIllegalState, func() int32 { return cnReceiveMany(h, cs("chan"), 8, &p, &n, &count) }},
		{"cn_put_back_many(connecting)", cnIllegalState, func() int32 { return cnPutBackMany(h, cs("chan"), b, bn) }},
	})
	if len(connected.ch) != 0 {
		t.Fatal("the connect finished early; the silent server did not hold it")
	}
}

// A plain channel never received on has no confirmed subscription: count 0, and nothing
// changes (no subscription, no mailbox). Once cn_receive subscribed, its messages can be taken
// and put back like a process channel's.
func TestReceiveManyPlainChannel(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, map[string]any{"release_linger": 30})
	sender := connect(t, ts.url, nil)
	plain := uniq(t, "plain")
	subject := "channels.ch." + plain
	before := c.stats()
	if _, recs := c.takeMany(plain, 16); len(recs) != 0 {
		t.Errorf("cn_receive_many of a plain channel never received on: %v", numbers(recs))
	}
	after := c.stats()
	for _, key := range []string{"subscriptions", "mailboxes", "delivered"} {
		if before[key] != after[key] {
			t.Errorf("stats: %s = %v after cn_receive_many, was %v: it changed something", key, after[key], before[key])
		}
	}
	time.Sleep(20 * time.Millisecond)
	if ts.srv.GlobalAccount().SubscriptionInterest(subject) {
		t.Errorf("cn_receive_many subscribed to %s", subject)
	}

	// cn_receive subscribes; with the subscription lingering, the take works.
	w := newWaiter(2, nil)
	op := c.receivePending(plain, w)
	ts.waitInterest(t, subject)
	sender.send(plain, numbered(t, 0))
	if r := w.wait(t); r.Status != cnOK || numberOf(r.Data) != 0 {
		t.Fatalf("cn_receive of the plain channel: %s n=%d", name(r.Status), numberOf(r.Data))
	}
	if st := cnCancel(c.h, op); st != cnNotPending {
		t.Errorf("cn_cancel after delivery: %s", name(st))
	}
	op = c.receivePending(plain, w)
	if st := cnCancel(c.h, op); st != cnOK {
		t.Fatalf("cn_cancel: %s", name(st))
	}
	for i := 1; i <= 4; i++ {
		sender.send(plain, numbered(t, i))
	}
	c.barrier(sender)
	block, recs := c.takeMany(plain, 3)
	if fmt.Sprint(numbers(recs)) != "[1 2 3]" {
		t.Fatalf("cn_receive_many of the subscribed plain channel: %v, want [1 2 3]", numbers(recs))
	}
	c.putBackMany(plain, block)
	for i := 1; i <= 4; i++ {
		if got := numberOf(c.receiveNow(plain)); got != i {
			t.Errorf("after the put-back the receive got n=%d, want %d", got, i)
		}
	}
	c.nothingWaiting(plain)
	w.none(t, 20*time.Millisecond)
}

// Several OS threads take from one channel with cn_receive_many while a sender publishes: every
// message is taken exactly once, and each thread sees increasing numbers (oldest first).
func TestReceiveManyConcurrentTakers(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, map[string]any{"capacity": 100000})
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	const sends, threads = 3000, 6
	bodies := make([][]byte, sends)
	for i := range bodies {
		bodies[i] = numbered(t, i)
	}
	delivered := c.counter("delivered")
	var (
		counts [sends]atomic.Int32
		taken  atomic.Int64
		calls  atomic.Int64
		multi  atomic.Int64 // calls that took more than one
		mu     sync.Mutex
		errs   []string
		wg     sync.WaitGroup
		tids   sync.Map
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		if len(errs) < 20 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
		mu.Unlock()
	}
	deadline := time.Now().Add(4 * wait)
	wg.Add(threads + 1)
	go func() {
		defer wg.Done()
		for i, body := range bodies {
			b, n := bp(body)
			if st := cnSend(sender.h, cs(ch), b, n, 0, 0, nil); st != cnOK {
				fail("cn_send %d: %s", i, name(st))
			}
			if i%50 == 0 {
				time.Sleep(200 * time.Microsecond)
			}
		}
	}()
	for g := range threads {
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			tids.Store(syscall.Gettid(), true)
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			last := -1
			for taken.Load() < sends && time.Now().Before(deadline) {
				limit := uintptr(1 + rng.IntN(32))
				_, recs, st, msg := takeManyRaw(t, c.h, ch, limit)
				if st != cnOK {
					fail("thread %d: cn_receive_many: %s (%s)", g, name(st), msg)
					return
				}
				calls.Add(1)
				if len(recs) == 0 {
					time.Sleep(50 * time.Microsecond)
					continue
				}
				if len(recs) > 1 {
					multi.Add(1)
				}
				for _, r := range recs {
					n := numberOf(r.body)
					if n < 0 || n >= sends {
						fail("thread %d: a record that is no message of the test: %x", g, r.body)
						continue
					}
					if !bytes.Equal(r.body, bodies[n]) {
						fail("thread %d: message %d differs: %x", g, n, r.body)
					}
					if n <= last {
						fail("thread %d: took %d after %d (not oldest first)", g, n, last)
					}
					last = n
					counts[n].Add(1)
				}
				taken.Add(int64(len(recs)))
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	for _, e := range errs {
		t.Error(e)
	}
	mu.Unlock()
	var lost, dup []int
	for i := range counts {
		switch counts[i].Load() {
		case 0:
			lost = append(lost, i)
		case 1:
		default:
			dup = append(dup, i)
		}
	}
	if len(lost) > 0 || len(dup) > 0 {
		t.Errorf("%d messages never taken %v, %d taken more than once %v", len(lost), lost, len(dup), dup)
	}
	if got := c.counter("delivered"); got != delivered+sends {
		t.Errorf("stats: delivered = %d, want %d", got, delivered+sends)
	}
	c.nothingWaiting(ch)
	nt := 0
	tids.Range(func(any, any) bool { nt++; return true })
	if nt != threads {
		t.Errorf("the takers ran on %d OS threads, want %d", nt, threads)
	}
	t.Logf("%d calls on %d threads, %d took more than one", calls.Load(), nt, multi.Load())
}

// A message put back with 0 ms left has expired: it is not handed to a waiting receive either
// ("so they expire when they would have"). The waiting receive gets the first message that still
// has time left; the expired ones are dropped and counted.
func TestPutBackManyExpiredPendingReceive(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, map[string]any{"expiry": 2})
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	c.backlog(sender, ch, 3)
	_, recs := c.takeMany(ch, 3)
	if fmt.Sprint(numbers(recs)) != "[0 1 2]" {
		t.Fatalf("took %v, want [0 1 2]", numbers(recs))
	}
	expired := c.counter("dropped.expired")
	w := newWaiter(2, nil)
	op := c.receivePending(ch, w)
	recs[0].left, recs[1].left, recs[2].left = 0, 0, 1500
	c.putBackMany(ch, encodeBlock(recs))
	r := w.wait(t)
	if r.Status != cnOK || numberOf(r.Data) != 2 {
		t.Errorf("the waiting receive got %s n=%d, want message 2 (0 and 1 came back with 0 ms left: expired)", name(r.Status), numberOf(r.Data))
	}
	if st := cnCancel(c.h, op); st != cnNotPending {
		t.Errorf("cn_cancel of the completed receive: %s, want CN_NOT_PENDING", name(st))
	}
	c.nothingWaiting(ch)
	if got := c.counter("dropped.expired"); got != expired+2 {
		t.Errorf("stats: dropped.expired = %d, want %d (two came back with 0 ms left)", got, expired+2)
	}
}
