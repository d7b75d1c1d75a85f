//go:build linux

package abitest

import (
	"bytes"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ebitengine/purego"
)

// Streams (include/channels_nats.h, cn_receive_stream and cn_stream_stop): a standing receive
// that hands over each of a channel's next credit messages as a result of its own, with its
// closure, CN_OK, the body in data and in text NULL (the message arrived just now) or the
// milliseconds it had left (it had waited). cn_stream_stop ends it and tells the credit it had
// not used: exactly the rest of the credit comes as results. cn_cancel stops it too; closing the
// client ends it with one CN_CLOSED result.

// The two stream functions, bound on first use (lib_test.go's load binds the others).
var (
	receiveStreamFn func(h uint64, channel *byte, credit uint32, cb, closure uintptr, op *uint64) int32
	streamStopFn    func(h uint64, op uint64, unused *uint32) int32

	streamBindOnce sync.Once
	streamBindErr  error
)

// needStreams binds cn_receive_stream and cn_stream_stop in the library TestMain loaded (dlopen
// of the same path returns the loaded library).
func needStreams(t testing.TB) {
	t.Helper()
	streamBindOnce.Do(func() {
		defer func() {
			if r := recover(); r != nil {
				streamBindErr = fmt.Errorf("binding the stream functions: %v", r)
			}
		}()
		path, err := libPath()
		if err != nil {
			streamBindErr = err
			return
		}
		lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			streamBindErr = fmt.Errorf("dlopen %s: %w", path, err)
			return
		}
		purego.RegisterLibFunc(&receiveStreamFn, lib, "cn_receive_stream")
		purego.RegisterLibFunc(&streamStopFn, lib, "cn_stream_stop")
	})
	if streamBindErr != nil {
		t.Fatal(streamBindErr)
	}
}

// startStream is one cn_receive_stream with the completion callback and closure; op holds
// garbage before the call, so that the library must write it. It returns the status, the op and
// cn_last_error().
func startStream(c *client, channel string, credit uint32, closure uintptr) (int32, uint64, string) {
	op := uint64(0xdeadbeef)
	st, msg := onThread(func() int32 { return receiveStreamFn(c.h, cs(channel), credit, completeCB, closure, &op) })
	return st, op, msg
}

// streamPending starts a stream that must be pending, with an op handle and no error detail.
func streamPending(t testing.TB, c *client, channel string, credit uint32, closure uintptr) uint64 {
	t.Helper()
	st, op, msg := startStream(c, channel, credit, closure)
	if st != cnPending {
		t.Fatalf("cn_receive_stream(%s, credit %d): %s (%q), want CN_PENDING", channel, credit, name(st), msg)
	}
	if op == 0 || op == 0xdeadbeef {
		t.Fatalf("cn_receive_stream(%s): CN_PENDING with op %#x", channel, op)
	}
	if msg != "" {
		t.Errorf("cn_receive_stream: cn_last_error() is %q after CN_PENDING", msg)
	}
	return op
}

// stopStream is one cn_stream_stop; unused holds garbage before the call.
func stopStream(c *client, op uint64) (int32, uint32, string) {
	unused := uint32(0xdead)
	st, msg := onThread(func() int32 { return streamStopFn(c.h, op, &unused) })
	return st, unused, msg
}

// stopEnded checks that the stream op had ended: cn_stream_stop says CN_NOT_PENDING with unused
// 0, and so does cn_cancel.
func stopEnded(t testing.TB, c *client, op uint64, what string) {
	t.Helper()
	if st, unused, msg := stopStream(c, op); st != cnNotPending || unused != 0 || msg == "" {
		t.Errorf("cn_stream_stop of %s: %s unused %d (%q), want CN_NOT_PENDING, unused 0 and a detail", what, name(st), unused, msg)
	}
	if st := cnCancel(c.h, op); st != cnNotPending {
		t.Errorf("cn_cancel of %s: %s, want CN_NOT_PENDING", what, name(st))
	}
}

// collectN takes n callback results of w, failing after the wait.
func collectN(t testing.TB, w *waiter, n int) []cbResult {
	t.Helper()
	out := make([]cbResult, 0, n)
	deadline := time.After(wait)
	for len(out) < n {
		select {
		case r := <-w.ch:
			out = append(out, r)
		case <-deadline:
			t.Fatalf("%d of %d stream results (closure %d) within %s", len(out), n, w.closure, wait)
		}
	}
	return out
}

// settleVia makes sure that every message sender sent to c's process channels before has been
// routed by c: sender sends a marker to mark (a process channel of c that holds nothing else) and
// the marker is taken with cn_receive_many (no pending operation: it works on a client whose
// results go to a queue). One subscription, one dispatcher, one publisher's order.
func settleVia(t testing.TB, c, sender *client, mark string) {
	t.Helper()
	sender.send(mark, pack(t, map[string]any{"type": "marker"}))
	deadline := time.Now().Add(wait)
	for {
		_, recs, st, msg := takeManyRaw(t, c.h, mark, 8)
		if st != cnOK {
			t.Fatalf("cn_receive_many(%s): %s (%s)", mark, name(st), msg)
		}
		if len(recs) == 1 {
			return
		}
		if len(recs) > 1 {
			t.Fatalf("the marker channel held %d messages", len(recs))
		}
		if time.Now().After(deadline) {
			t.Fatalf("the marker did not arrive within %s", wait)
		}
		time.Sleep(time.Millisecond)
	}
}

// takeAll takes every message waiting in channel (cn_receive_many) and returns their numbers.
func takeAll(t testing.TB, c *client, channel string) []int {
	t.Helper()
	_, recs := c.takeMany(channel, ^uintptr(0))
	return numbers(recs)
}

// seq is the numbers from..to-1.
func seq(from, to int) []int {
	out := make([]int, 0, max(0, to-from))
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

var decimal = regexp.MustCompile(`^[0-9]+$`)

// One stream, callback mode: CN_PENDING with an op; each of the credit messages is one call of
// the callback with the closure, CN_OK, text NULL (it arrived just now) and the body byte for
// byte, in arrival order, on a library thread. Then the stream has ended: later messages stay in
// the mailbox for cn_receive, and cn_stream_stop and cn_cancel say CN_NOT_PENDING.
func TestStreamCallback(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	const credit = 5
	bodies := make([][]byte, credit+2)
	for i := range bodies {
		bodies[i] = queueBody(t, i) // sizes differ, NUL bytes inside
	}
	w := newWaiter(credit+4, nil)
	var caller int
	op := uint64(0xdeadbeef)
	st, msg := onThread(func() int32 {
		caller = syscall.Gettid()
		return receiveStreamFn(c.h, cs(ch), credit, completeCB, w.closure, &op)
	})
	if st != cnPending || op == 0 || op == 0xdeadbeef {
		t.Fatalf("cn_receive_stream: %s (%q) op %#x, want CN_PENDING with an op", name(st), msg, op)
	}
	if msg != "" {
		t.Errorf("cn_last_error() is %q after CN_PENDING", msg)
	}
	if len(w.ch) != 0 {
		t.Fatalf("a result came before anything was sent: %+v", <-w.ch)
	}
	for _, b := range bodies {
		sender.send(ch, b)
	}
	for i, r := range collectN(t, w, credit) {
		switch {
		case r.Status != cnOK:
			t.Errorf("result %d: %s (%q), want CN_OK", i, name(r.Status), r.Text)
		case r.HasText:
			t.Errorf("result %d: text %q, want NULL (the message arrived just now)", i, r.Text)
		case !r.HasData || r.Len != uintptr(len(bodies[i])) || !bytes.Equal(r.Data, bodies[i]):
			t.Errorf("result %d: %d bytes n=%d, want message %d (%d bytes) byte for byte", i, r.Len, numberOf(r.Data), i, len(bodies[i]))
		}
		if r.Tid == caller {
			t.Errorf("result %d: the callback ran on the thread that called cn_receive_stream", i)
		}
	}
	// Once the barrier came, the last two messages were routed: to the mailbox, not the stream.
	c.barrier(sender)
	if n := w.calls.Load(); n != credit {
		t.Errorf("the callback ran %d times for a credit of %d", n, credit)
	}
	stopEnded(t, c, op, "a stream whose credit was used")
	for i := credit; i < len(bodies); i++ {
		if got := c.receiveNow(ch); !bytes.Equal(got, bodies[i]) {
			t.Errorf("cn_receive after the stream got n=%d, want %d", numberOf(got), i)
		}
	}
	c.nothingWaiting(ch)
	w.none(t, 20*time.Millisecond)
}

// Many messages in one stream: every one once, in order, intact; delivered counts them. A text,
// if any, is the decimal milliseconds left, within the expiry.
func TestStreamOrderMany(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	const n = 3000
	w := newWaiter(n+8, nil)
	delivered := c.counter("delivered")
	op := streamPending(t, c, ch, n, w.closure)
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = queueBody(t, i)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i, body := range bodies {
			b, bn := bp(body)
			if st := cnSend(sender.h, cs(ch), b, bn, 0, 0, nil); st != cnOK {
				stray("cn_send %d: %s", i, name(st))
				return
			}
		}
	}()
	got := collectN(t, w, n)
	<-done
	texts := 0
	for i, r := range got {
		if r.Status != cnOK || !bytes.Equal(r.Data, bodies[i]) {
			t.Fatalf("result %d: %s n=%d (%d bytes), want CN_OK with message %d", i, name(r.Status), numberOf(r.Data), r.Len, i)
		}
		if r.HasText {
			texts++
			left, err := strconv.Atoi(r.Text)
			if !decimal.MatchString(r.Text) || err != nil || left > 60000 || left < 50000 {
				t.Errorf("result %d: text %q, want NULL or the milliseconds left (at most the 60000 ms expiry)", i, r.Text)
			}
		}
	}
	if texts > 0 {
		t.Logf("%d of %d fresh messages came with a time left", texts, n)
	}
	stopEnded(t, c, op, "a stream whose credit was used")
	if got := c.counter("delivered"); got != delivered+n {
		t.Errorf("stats: delivered = %d, want %d", got, delivered+n)
	}
	c.nothingWaiting(ch)
}

// Result-queue mode and batch mode: each message is one result with the stream's closure, in
// order; the callback is never called. The stream ends after its credit; the rest stays in the
// mailbox.
func TestStreamSinks(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	const credit, extra = 300, 20
	check := func(t *testing.T, c, sender *client, results func(n int) []qResult, closure uintptr) {
		ch, mark := newChannelWait(t, c), newChannelWait(t, c)
		bodies := make([][]byte, credit+extra)
		for i := range bodies {
			bodies[i] = queueBody(t, i)
		}
		op := streamPending(t, c, ch, credit, closure)
		for _, b := range bodies {
			sender.send(ch, b)
		}
		got := results(credit)
		if len(got) != credit {
			t.Fatalf("%d results, want %d", len(got), credit)
		}
		for i, r := range got {
			if r.Closure != closure || r.Status != cnOK || r.HasText || !r.HasData || !bytes.Equal(r.Data, bodies[i]) {
				t.Fatalf("result %d: %v n=%d, want closure %d, CN_OK, no text, message %d", i, r, numberOf(r.Data), closure, i)
			}
		}
		settleVia(t, c, sender, mark)
		if more := results(0); len(more) != 0 {
			t.Errorf("%d results beyond the credit: %v", len(more), more)
		}
		stopEnded(t, c, op, "a stream whose credit was used")
		if got := takeAll(t, c, ch); fmt.Sprint(got) != fmt.Sprint(seq(credit, credit+extra)) {
			t.Errorf("the mailbox after the stream holds %v, want %v", got, seq(credit, credit+extra))
		}
	}
	t.Run("queue", func(t *testing.T) {
		pr, pw := notifyPipe(t)
		q := newQueue(t, pw)
		c := connect(t, ts.url, nil)
		q.attach(c)
		sender := connect(t, ts.url, nil)
		w := newWaiter(1, nil)
		check(t, c, sender, func(n int) []qResult {
			if n == 0 {
				return q.take(64)
			}
			return hostLoop(t, q, pr, n, 17)
		}, w.closure)
		q.empty(20 * time.Millisecond)
		if n := w.calls.Load(); n != 0 {
			t.Errorf("the stream's callback ran %d times in queue mode", n)
		}
	})
	t.Run("batch", func(t *testing.T) {
		c := connect(t, ts.url, nil)
		if st := cnSetBatch(c.h, batchCB, 0); st != cnOK {
			t.Fatalf("cn_set_batch_callback: %s", name(st))
		}
		sender := connect(t, ts.url, nil)
		w := newWaiter(credit+extra, nil) // onBatch hands each result of a batch to onComplete
		batches := func() int {
			batchSizes.Lock()
			defer batchSizes.Unlock()
			return len(batchSizes.sizes)
		}
		first := batches()
		check(t, c, sender, func(n int) []qResult {
			rs := collectN(t, w, n)
			for n == 0 && len(w.ch) > 0 { // results(0): whatever came beyond
				rs = append(rs, <-w.ch)
			}
			out := make([]qResult, len(rs))
			for i, r := range rs { // onComplete found w by the result's closure
				out[i] = qResult{Closure: w.closure, Status: r.Status, Text: r.Text, HasText: r.HasText, Data: r.Data, HasData: r.HasData, Len: r.Len}
			}
			return out
		}, w.closure)
		if batches() == first {
			t.Error("no call of the batch callback: the results came another way")
		}
	})
}

// Messages waiting in the mailbox: CN_OK, nothing started (op 0, no result); the host takes them
// and starts the stream then. Expired messages do not count as waiting.
func TestStreamMessagesWaiting(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	c.backlog(sender, ch, 3)
	w := newWaiter(8, nil)
	delivered := c.counter("delivered")
	st, op, msg := startStream(c, ch, 10, w.closure)
	if st != cnOK || op != 0 || msg != "" {
		t.Fatalf("cn_receive_stream with 3 messages waiting: %s op %#x (%q), want CN_OK, op 0, no detail", name(st), op, msg)
	}
	if got := c.counter("delivered"); got != delivered {
		t.Errorf("stats: delivered = %d after a stream that did not start, want %d", got, delivered)
	}
	if got := takeAll(t, c, ch); fmt.Sprint(got) != "[0 1 2]" {
		t.Fatalf("the mailbox holds %v after the refused start, want [0 1 2] (nothing taken)", got)
	}
	w.none(t, 20*time.Millisecond)

	// Now empty: it starts, and the next message goes to it.
	op = streamPending(t, c, ch, 1, w.closure)
	sender.send(ch, numbered(t, 3))
	if r := w.wait(t); r.Status != cnOK || numberOf(r.Data) != 3 {
		t.Errorf("the stream got %s n=%d, want message 3", name(r.Status), numberOf(r.Data))
	}
	stopEnded(t, c, op, "a stream of credit 1 that got its message")

	// A message put back with 15 ms left has expired 60 ms later: the mailbox counts as empty.
	sender.send(ch, numbered(t, 4))
	c.barrier(sender)
	_, recs := c.takeMany(ch, 1)
	if len(recs) != 1 {
		t.Fatalf("took %v, want [4]", numbers(recs))
	}
	expired := c.counter("dropped.expired")
	recs[0].left = 15
	c.putBackMany(ch, encodeBlock(recs))
	time.Sleep(60 * time.Millisecond) // let its 15 ms run out
	op = streamPending(t, c, ch, 1, w.closure)
	if got := c.counter("dropped.expired"); got != expired+1 {
		t.Errorf("stats: dropped.expired = %d, want %d (the expired message)", got, expired+1)
	}
	if st, unused, _ := stopStream(c, op); st != cnOK || unused != 1 {
		t.Errorf("cn_stream_stop: %s unused %d, want CN_OK 1", name(st), unused)
	}
	w.none(t, 20*time.Millisecond)
}

// text: NULL for a message that arrived just now, the decimal milliseconds left for one that had
// waited (put back with cn_put_back_many with a time left below the expiry, or taken and put back
// unchanged after a while).
func TestStreamTextTimeLeft(t *testing.T) {
	needStreams(t)
	const expiry = 10000 // ms
	ts := startServer(t)
	c := connect(t, ts.url, map[string]any{"expiry": expiry / 1000})
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	w := newWaiter(8, nil)
	op := streamPending(t, c, ch, 5, w.closure)

	// A fresh message: NULL.
	sender.send(ch, numbered(t, 0))
	if r := w.wait(t); r.Status != cnOK || numberOf(r.Data) != 0 || r.HasText {
		t.Errorf("fresh message: %s n=%d text %q (non-NULL %v), want CN_OK, message 0, NULL", name(r.Status), numberOf(r.Data), r.Text, r.HasText)
	}
	// Put back with 4000 ms, then with 250 ms left: the milliseconds left, at most what was given.
	for i, left := range []uint32{4000, 250} {
		before := time.Now()
		c.putBackMany(ch, encodeBlock([]record{{numbered(t, 1+i), left}}))
		r := w.wait(t)
		waited := time.Since(before)
		if r.Status != cnOK || numberOf(r.Data) != 1+i {
			t.Errorf("put back with %d ms: %s n=%d, want message %d", left, name(r.Status), numberOf(r.Data), 1+i)
			continue
		}
		got, err := strconv.ParseInt(r.Text, 10, 64)
		if !r.HasText || !decimal.MatchString(r.Text) || err != nil {
			t.Errorf("put back with %d ms left: text %q (non-NULL %v), want the decimal milliseconds left", left, r.Text, r.HasText)
			continue
		}
		if lo := int64(left) - ms(waited) - 2; got > int64(left) || got < lo { // 2: whole milliseconds
			t.Errorf("put back with %d ms left: text %q, want %d..%d", left, r.Text, lo, left)
		}
	}
	// Waited in the mailbox: taken with 300 ms gone, put back unchanged.
	if st, unused, _ := stopStream(c, op); st != cnOK || unused != 2 {
		t.Fatalf("cn_stream_stop: %s unused %d, want CN_OK 2", name(st), unused)
	}
	sent := time.Now() // it reached c after this
	sender.send(ch, numbered(t, 3))
	c.barrier(sender)
	time.Sleep(300 * time.Millisecond)
	block, recs := c.takeMany(ch, 1)
	if len(recs) != 1 || recs[0].left > expiry-300 {
		t.Fatalf("took %v with %v, want message 3 with at most %d ms left", numbers(recs), recs, expiry-300)
	}
	op = streamPending(t, c, ch, 1, w.closure)
	c.putBackMany(ch, block)
	r := w.wait(t)
	waited := time.Since(sent) // at most
	got, err := strconv.ParseInt(r.Text, 10, 64)
	switch {
	case r.Status != cnOK || numberOf(r.Data) != 3:
		t.Errorf("after it waited: %s n=%d, want message 3", name(r.Status), numberOf(r.Data))
	case !r.HasText || err != nil || !decimal.MatchString(r.Text):
		t.Errorf("a message that waited 300 ms: text %q (non-NULL %v), want the milliseconds left", r.Text, r.HasText)
	case got > int64(recs[0].left) || got < expiry-ms(waited)-3: // 3: whole milliseconds, three times
		t.Errorf("a message that waited 300 ms: text %q, want %d..%d", r.Text, expiry-ms(waited)-3, recs[0].left)
	}
	stopEnded(t, c, op, "a stream of credit 1 that got its message")
}

// cn_stream_stop of a stream with credit left: CN_OK with the credit it had not used, and no more
// results; later messages stay in the mailbox; the stream has ended.
func TestStreamStopUnused(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	w := newWaiter(16, nil)
	op := streamPending(t, c, ch, 10, w.closure)
	for i := range 3 {
		sender.send(ch, numbered(t, i))
	}
	for i, r := range collectN(t, w, 3) {
		if r.Status != cnOK || numberOf(r.Data) != i {
			t.Errorf("result %d: %s n=%d", i, name(r.Status), numberOf(r.Data))
		}
	}
	st, unused, msg := stopStream(c, op)
	if st != cnOK || unused != 7 || msg != "" {
		t.Fatalf("cn_stream_stop after 3 of 10: %s unused %d (%q), want CN_OK 7 and no detail", name(st), unused, msg)
	}
	stopEnded(t, c, op, "a stopped stream")
	for i := 3; i < 6; i++ {
		sender.send(ch, numbered(t, i))
	}
	c.barrier(sender)
	if got := takeAll(t, c, ch); fmt.Sprint(got) != "[3 4 5]" {
		t.Errorf("after the stop the mailbox holds %v, want [3 4 5]", got)
	}
	w.none(t, 20*time.Millisecond)

	// Stopped before any message: all the credit comes back.
	op = streamPending(t, c, ch, 4, w.closure)
	if st, unused, _ := stopStream(c, op); st != cnOK || unused != 4 {
		t.Errorf("cn_stream_stop of an unused stream: %s unused %d, want CN_OK 4", name(st), unused)
	}
	sender.send(ch, numbered(t, 6))
	c.barrier(sender)
	if got := takeAll(t, c, ch); fmt.Sprint(got) != "[6]" {
		t.Errorf("after the stop the mailbox holds %v, want [6]", got)
	}
	w.none(t, 20*time.Millisecond)
}

// A stop while a message is being handed over: the stream had taken it, so the stop does not
// count it as unused, and its result comes after cn_stream_stop returned. The results and unused
// add up to the credit.
func TestStreamStopInFlight(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var releaseOnce sync.Once
	unblock := func() { releaseOnce.Do(func() { close(release) }) }
	defer unblock()
	w := newWaiter(8, func(cbResult) {
		select {
		case entered <- struct{}{}:
		default:
		}
		select { // holds the library thread that delivers (bounded, so a failure cannot hang)
		case <-release:
		case <-time.After(wait):
		}
	})
	op := streamPending(t, c, ch, 5, w.closure)
	sender.send(ch, numbered(t, 0))
	select {
	case <-entered:
	case <-time.After(wait):
		t.Fatal("the stream's callback did not start")
	}
	st, unused, _ := stopStream(c, op)
	if st != cnOK || unused != 4 {
		t.Errorf("cn_stream_stop with the first message in its callback: %s unused %d, want CN_OK 4", name(st), unused)
	}
	stopEnded(t, c, op, "a stream stopped with a result still to come")
	if len(w.ch) != 0 {
		t.Fatal("the result was complete before the callback returned")
	}
	unblock()
	if r := w.wait(t); r.Status != cnOK || numberOf(r.Data) != 0 {
		t.Errorf("the result in flight: %s n=%d, want CN_OK with message 0", name(r.Status), numberOf(r.Data))
	}
	sender.send(ch, numbered(t, 1))
	c.barrier(sender)
	if got := takeAll(t, c, ch); fmt.Sprint(got) != "[1]" {
		t.Errorf("after the stop the mailbox holds %v, want [1]", got)
	}
	stopEnded(t, c, op, "a stopped stream whose last result came")
	w.none(t, 20*time.Millisecond)

	// The same with a close while the result is in flight: the stream was stopped, so the close
	// adds no CN_CLOSED; the result comes before the close callback.
	entered2, release2 := make(chan struct{}, 1), make(chan struct{})
	var release2Once sync.Once
	unblock2 := func() { release2Once.Do(func() { close(release2) }) }
	defer unblock2()
	w2 := newWaiter(8, func(cbResult) {
		select {
		case entered2 <- struct{}{}:
		default:
		}
		select {
		case <-release2:
		case <-time.After(wait):
		}
	})
	op = streamPending(t, c, ch, 3, w2.closure)
	sender.send(ch, numbered(t, 2))
	select {
	case <-entered2:
	case <-time.After(wait):
		t.Fatal("the second stream's callback did not start")
	}
	if st, unused, _ := stopStream(c, op); st != cnOK || unused != 2 {
		t.Errorf("cn_stream_stop with a message in its callback: %s unused %d, want CN_OK 2", name(st), unused)
	}
	closed := newWaiter(2, nil)
	if st := cnClose(c.h, completeCB, closed.closure); st != cnPending {
		t.Fatalf("cn_close (pending form) while a callback runs: %s, want CN_PENDING", name(st))
	}
	unblock2()
	cr := closed.wait(t)
	if cr.Status != cnOK {
		t.Errorf("close callback: %s", name(cr.Status))
	}
	if n := w2.calls.Load(); n != 1 {
		t.Errorf("the stopped stream had %d results when the close finished, want 1 (its message, no CN_CLOSED)", n)
	}
	if r := w2.wait(t); r.Status != cnOK || numberOf(r.Data) != 2 || r.Seq > cr.Seq {
		t.Errorf("the result in flight at the close: %s n=%d (seq %d, close %d), want CN_OK with message 2 before the close callback", name(r.Status), numberOf(r.Data), r.Seq, cr.Seq)
	}
	w2.none(t, 20*time.Millisecond)
}

// A stop while messages flow, in callback and queue mode: exactly credit-unused results come,
// the first messages in order, and the others wait in the mailbox, in order: none lost, none
// twice.
func TestStreamStopWhileFlowing(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	const sends, credit, stopAfter = 3000, 5000, 200
	run := func(t *testing.T, c, sender *client, ch, mark string, closure uintptr, results func() int, all func(n int) []cbResult) {
		op := streamPending(t, c, ch, credit, closure)
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := range sends {
				body := numbered(t, i)
				b, n := bp(body)
				if st := cnSend(sender.h, cs(ch), b, n, 0, 0, nil); st != cnOK {
					stray("cn_send %d: %s", i, name(st))
					return
				}
			}
		}()
		deadline := time.Now().Add(wait)
		for results() < stopAfter && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond)
		}
		st, unused, msg := stopStream(c, op)
		if st != cnOK {
			t.Fatalf("cn_stream_stop while messages flow: %s (%q)", name(st), msg)
		}
		<-done
		settleVia(t, c, sender, mark)
		used := credit - int(unused)
		if used < stopAfter || used > sends {
			t.Fatalf("unused %d: %d results due, want %d..%d", unused, used, stopAfter, sends)
		}
		got := all(used)
		for i, r := range got {
			if r.Status != cnOK || numberOf(r.Data) != i {
				t.Fatalf("result %d: %s n=%d, want message %d", i, name(r.Status), numberOf(r.Data), i)
			}
		}
		if extra := all(0); len(extra) != 0 {
			t.Errorf("%d results beyond credit-unused = %d", len(extra), used)
		}
		if rest := takeAll(t, c, ch); fmt.Sprint(rest) != fmt.Sprint(seq(used, sends)) {
			t.Errorf("the mailbox holds %d messages (%v...), want %d..%d", len(rest), rest[:min(5, len(rest))], used, sends-1)
		}
		stopEnded(t, c, op, "a stopped stream")
		t.Logf("stopped after %d of %d sent: unused %d", used, sends, unused)
	}
	t.Run("callback", func(t *testing.T) {
		c := connect(t, ts.url, map[string]any{"capacity": 100000})
		sender := connect(t, ts.url, nil)
		w := newWaiter(credit, nil)
		run(t, c, sender, c.newChannel(""), c.newChannel(""), w.closure,
			func() int { return int(w.calls.Load()) },
			func(n int) []cbResult {
				out := collectN(t, w, n)
				if n == 0 {
					time.Sleep(20 * time.Millisecond)
					for len(w.ch) > 0 {
						out = append(out, <-w.ch)
					}
				}
				return out
			})
	})
	t.Run("queue", func(t *testing.T) {
		q := newQueue(t, -1)
		c := connect(t, ts.url, map[string]any{"capacity": 100000})
		q.attach(c)
		sender := connect(t, ts.url, nil)
		w := newWaiter(1, nil)
		var mu sync.Mutex
		var taken []qResult
		results := func() int { // polls the queue
			mu.Lock()
			defer mu.Unlock()
			taken = append(taken, q.take(64)...)
			return len(taken)
		}
		run(t, c, sender, newChannelWait(t, c), newChannelWait(t, c), w.closure, results,
			func(n int) []cbResult {
				if n == 0 {
					q.empty(20 * time.Millisecond)
					return nil
				}
				mu.Lock()
				got := append([]qResult(nil), taken...)
				mu.Unlock()
				if len(got) < n {
					got = append(got, q.collect(n-len(got), 64)...)
				}
				out := make([]cbResult, len(got))
				for i, r := range got {
					if r.Closure != w.closure {
						t.Errorf("result %d: closure %d, want %d", i, r.Closure, w.closure)
					}
					out[i] = cbResult{Status: r.Status, Text: r.Text, HasText: r.HasText, Data: r.Data, HasData: r.HasData, Len: r.Len}
				}
				return out
			})
		if n := w.calls.Load(); n != 0 {
			t.Errorf("the stream's callback ran %d times in queue mode", n)
		}
	})
}

// cn_cancel stops a stream: CN_OK while it has credit, no result after, later messages stay in
// the mailbox; then CN_NOT_PENDING from cn_cancel and cn_stream_stop.
func TestStreamCancel(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	w := newWaiter(8, nil)
	for _, used := range []int{0, 2} {
		op := streamPending(t, c, ch, 4, w.closure)
		for i := range used {
			sender.send(ch, numbered(t, i))
		}
		for i, r := range collectN(t, w, used) {
			if r.Status != cnOK || numberOf(r.Data) != i {
				t.Errorf("result %d: %s n=%d", i, name(r.Status), numberOf(r.Data))
			}
		}
		if st, msg := onThread(func() int32 { return cnCancel(c.h, op) }); st != cnOK || msg != "" {
			t.Errorf("cn_cancel of a stream with %d of 4 used: %s (%q), want CN_OK", used, name(st), msg)
		}
		stopEnded(t, c, op, "a cancelled stream")
		sender.send(ch, numbered(t, 10))
		c.barrier(sender)
		if got := takeAll(t, c, ch); fmt.Sprint(got) != "[10]" {
			t.Errorf("after the cancel the mailbox holds %v, want [10]", got)
		}
		w.none(t, 20*time.Millisecond)
	}
}

// While a stream has credit it is first in line: a cn_receive that starts after it waits until
// the credit is used, and gets the next message then. Another stream can follow.
func TestStreamFirstInLine(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	sw := newWaiter(8, nil)
	op := streamPending(t, c, ch, 2, sw.closure)
	rw := newWaiter(2, nil)
	rop := c.receivePending(ch, rw)
	for i := range 3 {
		sender.send(ch, numbered(t, i))
	}
	for i, r := range collectN(t, sw, 2) {
		if r.Status != cnOK || numberOf(r.Data) != i {
			t.Errorf("stream result %d: %s n=%d, want message %d", i, name(r.Status), numberOf(r.Data), i)
		}
	}
	if r := rw.wait(t); r.Status != cnOK || numberOf(r.Data) != 2 {
		t.Errorf("the receive behind the stream got %s n=%d, want message 2", name(r.Status), numberOf(r.Data))
	}
	if st := cnCancel(c.h, rop); st != cnNotPending {
		t.Errorf("cn_cancel of the completed receive: %s", name(st))
	}
	stopEnded(t, c, op, "a stream whose credit was used")

	// The host starts another stream for the next credit.
	op = streamPending(t, c, ch, 2, sw.closure)
	sender.send(ch, numbered(t, 3))
	if r := sw.wait(t); r.Status != cnOK || numberOf(r.Data) != 3 {
		t.Errorf("the second stream got %s n=%d, want message 3", name(r.Status), numberOf(r.Data))
	}
	if st, unused, _ := stopStream(c, op); st != cnOK || unused != 1 {
		t.Errorf("cn_stream_stop of the second stream: %s unused %d, want CN_OK 1", name(st), unused)
	}
	sw.none(t, 20*time.Millisecond)
	rw.none(t, 0)
}

// Closing the client ends an active stream with exactly one CN_CLOSED result (with a detail, no
// data), after the results of the messages it got; a stream that ended before (credit used, or
// stopped) gets none. After the close both functions say CN_CLOSED. Callback and queue mode.
func TestStreamClose(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	type stream struct {
		what   string
		credit uint32
		sends  int // messages sent to it before the close: each is one CN_OK result
		stop   bool
		closed bool // still active at the close: one CN_CLOSED result
	}
	streams := []stream{
		{what: "active", credit: 5, sends: 2, closed: true},
		{what: "unused", credit: 3, closed: true},
		{what: "credit used", credit: 1, sends: 1},
		{what: "stopped", credit: 3, sends: 1, stop: true},
	}
	for _, mode := range []string{"callback", "queue"} {
		t.Run(mode, func(t *testing.T) {
			var q *queue
			if mode == "queue" {
				q = newQueue(t, -1) // before the client: its cleanup closes the client first
			}
			c := connect(t, ts.url, nil)
			if q != nil {
				q.attach(c)
			}
			sender := connect(t, ts.url, nil)
			mark := newChannelWait(t, c)
			ws := make([]*waiter, len(streams))
			ops := make([]uint64, len(streams))
			chans := make([]string, len(streams))
			for i, s := range streams {
				chans[i] = newChannelWait(t, c)
				ws[i] = newWaiter(16, nil)
				ops[i] = streamPending(t, c, chans[i], s.credit, ws[i].closure)
				for j := range s.sends {
					sender.send(chans[i], numbered(t, j))
				}
			}
			settleVia(t, c, sender, mark)
			// results takes what came for each stream so far (everything, once the close returned).
			results := func() [][]cbResult {
				got := make([][]cbResult, len(streams))
				if q == nil {
					for i, w := range ws {
						for len(w.ch) > 0 {
							got[i] = append(got[i], <-w.ch)
						}
					}
					return got
				}
				for _, r := range q.take(256) {
					found := false
					for i, w := range ws {
						if r.Closure == w.closure {
							got[i] = append(got[i], cbResult{Status: r.Status, Text: r.Text, HasText: r.HasText, Data: r.Data, HasData: r.HasData, Len: r.Len})
							found = true
						}
					}
					if !found {
						t.Errorf("a result with closure %d: %v", r.Closure, r)
					}
				}
				return got
			}
			// The routed messages' results are in once the marker was routed (callback mode: the
			// callback ran on the dispatcher before; queue mode: queued before).
			before := results()
			for i, s := range streams {
				if len(before[i]) != s.sends {
					t.Fatalf("%s stream: %d results before the close, want %d", s.what, len(before[i]), s.sends)
				}
				for j, r := range before[i] {
					if r.Status != cnOK || numberOf(r.Data) != j {
						t.Errorf("%s stream: result %d is %s n=%d, want CN_OK with message %d", s.what, j, name(r.Status), numberOf(r.Data), j)
					}
				}
				if s.stop {
					if st, unused, _ := stopStream(c, ops[i]); st != cnOK || int(unused) != int(s.credit)-s.sends {
						t.Errorf("%s stream: cn_stream_stop: %s unused %d, want CN_OK %d", s.what, name(st), unused, int(s.credit)-s.sends)
					}
				}
			}
			// Callback mode closes in the pending form: the stream results come before the close
			// callback. Queue mode waits: the results are queued when cn_close returned.
			closeSeq := uint64(1) << 62
			if q == nil {
				closed := newWaiter(2, nil)
				if st := cnClose(c.h, completeCB, closed.closure); st != cnPending {
					t.Fatalf("cn_close (pending form): %s", name(st))
				}
				r := closed.wait(t)
				if r.Status != cnOK {
					t.Fatalf("close callback: %s", name(r.Status))
				}
				closeSeq = r.Seq
			} else if st := cnClose(c.h, 0, 0); st != cnOK {
				t.Fatalf("cn_close: %s", name(st))
			}
			after := results()
			for i, s := range streams {
				want := 0
				if s.closed {
					want = 1
				}
				if len(after[i]) != want {
					t.Errorf("%s stream: %d results came with the close, want %d: %+v", s.what, len(after[i]), want, after[i])
					continue
				}
				if want == 1 {
					r := after[i][0]
					if r.Status != cnClosed || !r.HasText || r.Text == "" || r.HasData || r.Len != 0 {
						t.Errorf("%s stream: %s text %q data %v, want CN_CLOSED with a detail and no data", s.what, name(r.Status), r.Text, r.HasData)
					}
					if q == nil && r.Seq > closeSeq {
						t.Errorf("%s stream: its CN_CLOSED came after the close callback", s.what)
					}
				}
				if q != nil {
					if n := ws[i].calls.Load(); n != 0 {
						t.Errorf("%s stream: its callback ran %d times in queue mode", s.what, n)
					}
				}
			}
			unused := uint32(9)
			if st := streamStopFn(c.h, ops[0], &unused); st != cnClosed || unused != 0 {
				t.Errorf("cn_stream_stop after the close: %s unused %d, want CN_CLOSED 0", name(st), unused)
			}
			if st, op, _ := startStream(c, chans[0], 1, ws[0].closure); st != cnClosed || op != 0 {
				t.Errorf("cn_receive_stream after the close: %s op %#x, want CN_CLOSED 0", name(st), op)
			}
			// Nothing more comes, whatever is sent.
			for i, ch := range chans {
				sender.send(ch, numbered(t, 100+i))
			}
			time.Sleep(30 * time.Millisecond)
			for i, late := range results() {
				if len(late) != 0 {
					t.Errorf("%s stream: results after the close: %+v", streams[i].what, late)
				}
			}
		})
	}
}

// Refused calls: arguments, names, handles, a plain channel never received on, a client still
// connecting or closed. A refused cn_receive_stream sets *op to 0 and starts nothing;
// cn_stream_stop of a pending receive leaves the receive pending.
func TestStreamRefused(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	other := connect(t, ts.url, nil)
	ch := c.newChannel("")
	theirs := other.newChannel("")
	prefixOfTheirs := theirs[:strings.IndexByte(theirs, '!')+1]
	plain := uniq(t, "plain")
	never := newWaiter(64, nil)
	h, cl := c.h, never.closure
	var op uint64
	var unused uint32
	start := func(h uint64, channel *byte, credit uint32, cb uintptr) func() int32 {
		return func() int32 {
			op = 0xdeadbeef
			st := receiveStreamFn(h, channel, credit, cb, cl, &op)
			if op != 0 {
				t.Errorf("a refused cn_receive_stream left op %#x, want 0", op)
			}
			return st
		}
	}
	calls := []call{
		{"cn_receive_stream(callback NULL)", cnInvalidArg, start(h, cs(ch), 1, 0)},
		{"cn_receive_stream(credit 0)", cnInvalidArg, start(h, cs(ch), 0, completeCB)},
		{"cn_receive_stream(channel NULL)", cnInvalidArg, start(h, nil, 1, completeCB)},
		{"cn_receive_stream(channel invalid UTF-8)", cnInvalidArg, start(h, cs(ch[:len(ch)-1]+"\xff"), 1, completeCB)},
		{"cn_receive_stream(another client's channel)", cnForeign, start(h, cs(theirs), 1, completeCB)},
		{"cn_receive_stream(another client's prefix)", cnForeign, start(h, cs(prefixOfTheirs), 1, completeCB)},
		{"cn_receive_stream(client 0)", cnInvalidHandle, start(0, cs(ch), 1, completeCB)},
		{"cn_receive_stream(unknown client)", cnInvalidHandle, start(999999999, cs(ch), 1, completeCB)},
		{"cn_receive_stream(plain channel never received on)", cnIllegalState, start(h, cs(plain), 1, completeCB)},
		{"cn_stream_stop(unused NULL)", cnInvalidArg, func() int32 { return streamStopFn(h, 1, nil) }},
		{"cn_stream_stop(op 0)", cnInvalidHandle, func() int32 { return streamStopFn(h, 0, &unused) }},
		{"cn_stream_stop(op never issued)", cnInvalidHandle, func() int32 { return streamStopFn(h, 1<<60, &unused) }},
		{"cn_stream_stop(client 0)", cnInvalidHandle, func() int32 { return streamStopFn(0, 1, &unused) }},
		{"cn_stream_stop(unknown client)", cnInvalidHandle, func() int32 { return streamStopFn(999999999, 1, &unused) }},
	}
	for _, bad := range []string{"bad name", "a..b", ".lead", "trail.", "a*b", "a>b", "", strings.Repeat("a", 200)} {
		calls = append(calls, call{"cn_receive_stream(" + bad + ")", cnInvalidName, start(h, cs(bad), 1, completeCB)})
	}
	run(t, calls)
	// The plain channel was not subscribed to.
	time.Sleep(20 * time.Millisecond)
	if ts.srv.GlobalAccount().SubscriptionInterest("channels.ch." + plain) {
		t.Errorf("a refused cn_receive_stream subscribed to %s", plain)
	}

	// The op of a pending receive is not a stream: CN_INVALID_ARG, and the receive still waits.
	rw := newWaiter(2, nil)
	rop := c.receivePending(ch, rw)
	unused = 5
	if st, msg := onThread(func() int32 { return streamStopFn(h, rop, &unused) }); st != cnInvalidArg || msg == "" || unused != 0 {
		t.Errorf("cn_stream_stop(a pending receive's op): %s (%q) unused %d, want CN_INVALID_ARG with a detail, unused 0", name(st), msg, unused)
	}
	c.send(ch, numbered(t, 1))
	if r := rw.wait(t); r.Status != cnOK || numberOf(r.Data) != 1 {
		t.Errorf("the receive after cn_stream_stop refused its op: %s n=%d", name(r.Status), numberOf(r.Data))
	}

	// A client still connecting: CN_ILLEGAL_STATE.
	doc := config(t, []string{silentServer(t)}, map[string]any{"connect_options": map[string]any{"connect_timeout": 2}})
	connecting, _ := connectPending(t, doc)
	// A closed client: CN_CLOSED.
	closed := connect(t, ts.url, nil)
	closedCh := closed.newChannel("")
	if st := cnClose(closed.h, 0, 0); st != cnOK {
		t.Fatalf("cn_close: %s", name(st))
	}
	run(t, []call{
		{"cn_receive_stream(connecting)", cnIllegalState, start(connecting, cs("chan"), 1, completeCB)},
		{"cn_receive_stream(closed client)", cnClosed, start(closed.h, cs(closedCh), 1, completeCB)},
		{"cn_stream_stop(closed client)", cnClosed, func() int32 { return streamStopFn(closed.h, 1, &unused) }},
	})
	never.none(t, 20*time.Millisecond)
}

// Channel kinds other than a process channel. A plain channel: once cn_receive subscribed it (the
// subscription lingers after the receive), a stream takes its messages, sent by another client.
// The prefix of this client's process channels ("specific.<id>!") takes every message of them
// that has no mailbox of its own: a stream on it too.
func TestStreamChannelKinds(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	t.Run("plain", func(t *testing.T) {
		c := connect(t, ts.url, map[string]any{"release_linger": 30})
		sender := connect(t, ts.url, nil)
		plain := uniq(t, "plain")
		w := newWaiter(16, nil)
		if st, _, _ := startStream(c, plain, 3, w.closure); st != cnIllegalState {
			t.Fatalf("cn_receive_stream of a plain channel never received on: %s, want CN_ILLEGAL_STATE", name(st))
		}
		rw := newWaiter(2, nil)
		rop := c.receivePending(plain, rw)
		ts.waitInterest(t, "channels.ch."+plain)
		sender.send(plain, numbered(t, 0))
		if r := rw.wait(t); r.Status != cnOK || numberOf(r.Data) != 0 {
			t.Fatalf("cn_receive of the plain channel: %s n=%d", name(r.Status), numberOf(r.Data))
		}
		if st := cnCancel(c.h, rop); st != cnNotPending {
			t.Errorf("cn_cancel after delivery: %s", name(st))
		}
		op := streamPending(t, c, plain, 3, w.closure)
		for i := 1; i <= 4; i++ {
			sender.send(plain, numbered(t, i))
		}
		for i, r := range collectN(t, w, 3) {
			if r.Status != cnOK || numberOf(r.Data) != i+1 || r.HasText {
				t.Errorf("stream result %d: %s n=%d text %q, want CN_OK with message %d", i, name(r.Status), numberOf(r.Data), r.Text, i+1)
			}
		}
		stopEnded(t, c, op, "a stream whose credit was used")
		if got := numberOf(c.receiveAny(plain)); got != 4 {
			t.Errorf("after the stream cn_receive got n=%d, want 4", got)
		}
		w.none(t, 20*time.Millisecond)
	})
	t.Run("process prefix", func(t *testing.T) {
		c := connect(t, ts.url, nil)
		sender := connect(t, ts.url, nil)
		ch := c.newChannel("")
		prefix := ch[:strings.IndexByte(ch, '!')+1]
		w := newWaiter(8, nil)
		op := streamPending(t, c, prefix, 3, w.closure)
		orphans := []string{prefix + "nomailbox1", prefix + "nomailbox2"}
		for i, o := range orphans {
			sender.send(o, numbered(t, i))
		}
		sender.send(ch, numbered(t, 99)) // has a mailbox: not for the prefix
		for i, r := range collectN(t, w, 2) {
			if r.Status != cnOK || numberOf(r.Data) != i {
				t.Errorf("prefix stream result %d: %s n=%d, want message %d (sent to %s)", i, name(r.Status), numberOf(r.Data), i, orphans[i])
			}
		}
		c.barrier(sender)
		if got := numberOf(c.receiveNow(ch)); got != 99 {
			t.Errorf("the channel's own mailbox got n=%d, want 99", got)
		}
		if st, unused, _ := stopStream(c, op); st != cnOK || unused != 1 {
			t.Errorf("cn_stream_stop of the prefix stream: %s unused %d, want CN_OK 1", name(st), unused)
		}
		w.none(t, 20*time.Millisecond)
	})
}

// Messages put back with cn_put_back_many while a stream waits: the stream takes as many as its
// credit (each once; put-backs may come from several threads, so in any order), the rest go to
// the front of the mailbox in their order.
func TestStreamPutBack(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	c := connect(t, ts.url, map[string]any{"capacity": 1000})
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	const n, credit = 100, 40
	c.backlog(sender, ch, n)
	block, recs := c.takeMany(ch, n)
	if len(recs) != n {
		t.Fatalf("took %d, want %d", len(recs), n)
	}
	w := newWaiter(n, nil)
	op := streamPending(t, c, ch, credit, w.closure)
	c.putBackMany(ch, block)
	seen := map[int]bool{}
	for _, r := range collectN(t, w, credit) {
		k := numberOf(r.Data)
		if r.Status != cnOK || k < 0 || k >= credit || seen[k] {
			t.Errorf("stream result: %s n=%d, want CN_OK with one of messages 0..%d, once", name(r.Status), k, credit-1)
		}
		seen[k] = true
	}
	stopEnded(t, c, op, "a stream whose credit was used")
	if got := takeAll(t, c, ch); fmt.Sprint(got) != fmt.Sprint(seq(credit, n)) {
		t.Errorf("the mailbox holds %v, want %v", got, seq(credit, n))
	}
	w.none(t, 20*time.Millisecond)
}

// A callback may call the library: cn_stream_stop from inside the stream's own callback stops it
// with the credit after that message unused; cn_receive_stream from inside the callback of a
// stream's last message starts the next one, and no message goes past the streams (the
// dispatcher routes nothing while the callback runs).
func TestStreamFromCallback(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	c := connect(t, ts.url, map[string]any{"capacity": 1000})
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")

	var stopOp atomic.Uint64
	type stopped struct {
		st     int32
		unused uint32
	}
	stops := make(chan stopped, 4)
	w := newWaiter(16, func(r cbResult) {
		if numberOf(r.Data) == 2 {
			var unused uint32
			st := streamStopFn(c.h, stopOp.Load(), &unused)
			stops <- stopped{st, unused}
		}
	})
	stopOp.Store(streamPending(t, c, ch, 10, w.closure))
	for i := range 5 {
		sender.send(ch, numbered(t, i))
	}
	for i, r := range collectN(t, w, 3) {
		if r.Status != cnOK || numberOf(r.Data) != i {
			t.Errorf("result %d: %s n=%d", i, name(r.Status), numberOf(r.Data))
		}
	}
	select {
	case s := <-stops:
		if s.st != cnOK || s.unused != 7 {
			t.Errorf("cn_stream_stop inside the callback of the 3rd of 10: %s unused %d, want CN_OK 7", name(s.st), s.unused)
		}
	case <-time.After(wait):
		t.Fatal("the callback did not stop the stream")
	}
	c.barrier(sender)
	if got := takeAll(t, c, ch); fmt.Sprint(got) != "[3 4]" {
		t.Errorf("after the stop inside the callback the mailbox holds %v, want [3 4]", got)
	}
	w.none(t, 20*time.Millisecond)

	// A chain of streams of credit 3, each started by the callback of the previous one's last.
	const credit, sends = 3, 60
	var (
		mu      sync.Mutex
		inChain int
		starts  []int32
	)
	var chain *waiter
	chain = newWaiter(sends+8, func(r cbResult) {
		mu.Lock()
		inChain++
		last := inChain%credit == 0 && inChain < sends
		mu.Unlock()
		if last {
			var op uint64
			st := receiveStreamFn(c.h, cs(ch), credit, completeCB, chain.closure, &op)
			mu.Lock()
			starts = append(starts, st)
			mu.Unlock()
		}
	})
	first := streamPending(t, c, ch, credit, chain.closure)
	for i := range sends {
		sender.send(ch, numbered(t, 100+i))
	}
	for i, r := range collectN(t, chain, sends) {
		if r.Status != cnOK || numberOf(r.Data) != 100+i {
			t.Fatalf("chained result %d: %s n=%d, want message %d", i, name(r.Status), numberOf(r.Data), 100+i)
		}
	}
	mu.Lock()
	for i, st := range starts {
		if st != cnPending {
			t.Errorf("stream %d started inside a callback: %s, want CN_PENDING", i+2, name(st))
		}
	}
	if len(starts) != sends/credit-1 {
		t.Errorf("%d streams started inside callbacks, want %d", len(starts), sends/credit-1)
	}
	mu.Unlock()
	stopEnded(t, c, first, "the first stream of the chain")
	c.barrier(sender)
	c.nothingWaiting(ch)
	chain.none(t, 20*time.Millisecond)
}

// The host loop the header describes, on a result queue: start a stream; when messages are
// waiting (CN_OK) take them with cn_receive_many and start again; when its credit is used start
// the next. Every message arrives once, in order, while a sender publishes; the last stream is
// stopped and its unused credit adds up.
func TestStreamHostLoop(t *testing.T) {
	needStreams(t)
	ts := startServer(t)
	pr, pw := notifyPipe(t)
	q := newQueue(t, pw)
	c := connect(t, ts.url, map[string]any{"capacity": 100000})
	q.attach(c)
	sender := connect(t, ts.url, nil)
	ch := newChannelWait(t, c)
	const n, credit = 4000, 64
	w := newWaiter(1, nil)
	go func() {
		for i := range n {
			body := numbered(t, i)
			b, bn := bp(body)
			if st := cnSend(sender.h, cs(ch), b, bn, 0, 0, nil); st != cnOK {
				stray("cn_send %d: %s", i, name(st))
				return
			}
			if i%200 == 0 {
				time.Sleep(time.Millisecond) // let the host catch up now and then: both paths run
			}
		}
	}()
	next, streams, takes := 0, 0, 0
	expect := func(k int, how string) {
		if k != next {
			t.Fatalf("%s: message %d, want %d", how, k, next)
		}
		next++
	}
	deadline := time.Now().Add(4 * wait)
	for next < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d messages within %s", next, n, 4*wait)
		}
		st, op, msg := startStream(c, ch, credit, w.closure)
		switch st {
		case cnOK:
			takes++
			_, recs := c.takeMany(ch, ^uintptr(0))
			for _, r := range recs {
				expect(numberOf(r.body), "cn_receive_many")
			}
			continue
		case cnPending:
			streams++
		default:
			t.Fatalf("cn_receive_stream: %s (%q)", name(st), msg)
		}
		got := 0
		for got < credit && next < n {
			if !readable(pr, wait) {
				t.Fatalf("no notify byte within %s: %d of %d messages, %d of a stream's %d", wait, next, n, got, credit)
			}
			drain(t, pr)
			for _, r := range q.take(credit) {
				if r.Closure != w.closure || r.Status != cnOK {
					t.Fatalf("result %v, want CN_OK with closure %d", r, w.closure)
				}
				expect(numberOf(r.Data), "stream")
				got++
			}
		}
		if got < credit { // every message came: the last stream has credit left
			st, unused, _ := stopStream(c, op)
			if st != cnOK || int(unused) != credit-got {
				t.Errorf("cn_stream_stop of the last stream after %d of %d: %s unused %d, want CN_OK %d", got, credit, name(st), unused, credit-got)
			}
		}
	}
	q.empty(20 * time.Millisecond)
	t.Logf("%d messages: %d streams, %d times messages were waiting", n, streams, takes)
}
