package layer

// Tests of streams (StartStream, PendingReceive.Stop and Cancel on a stream): a standing receive
// with credit that hands each of the channel's next messages to one callback, in arrival order.
// They run against an embedded nats-server and reuse the helpers of lifecycle_test.go (lc...),
// take_test.go (tk...), resilience_test.go (rs...) and names_test.go; the helpers of this file
// start with st.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// stSink records what a stream hands to its callback. The callback runs on library goroutines,
// so every field is guarded by mu.
type stSink struct {
	mu        sync.Mutex
	msgs      []Message
	errs      []error
	errBodies int           // error calls that carried a message: there must be none
	onMessage func(n int)   // set before the stream starts; runs in the callback after message n
	first     chan struct{} // closed when the first message is recorded
}

func stNewSink() *stSink { return &stSink{first: make(chan struct{})} }

func (s *stSink) deliver(m Message, err error) {
	s.mu.Lock()
	if err != nil {
		s.errs = append(s.errs, err)
		if m.Body != nil || m.Channel != "" {
			s.errBodies++
		}
		s.mu.Unlock()
		return
	}
	s.msgs = append(s.msgs, m)
	n, hook := len(s.msgs), s.onMessage
	s.mu.Unlock()
	if n == 1 {
		close(s.first)
	}
	if hook != nil {
		hook(n)
	}
}

// messages returns a copy of what the stream got so far.
func (s *stSink) messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.msgs...)
}

func (s *stSink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.msgs)
}

// errorsWithMessage is how many error calls carried a message: there must be none.
func (s *stSink) errorsWithMessage() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errBodies
}

func (s *stSink) errors() []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]error(nil), s.errs...)
}

// ns returns the n of every message the stream got, in the order the callback saw them.
func (s *stSink) ns(t testing.TB) []string { t.Helper(); return tkNs(t, s.messages()) }

// waitMsgs waits (bounded) until the stream got at least n messages.
func (s *stSink) waitMsgs(t testing.TB, n int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%d streamed message(s)", n), func() bool { return s.count() >= n })
}

// noErrors fails the test if the stream's callback was called with an error.
func (s *stSink) noErrors(t testing.TB) {
	t.Helper()
	if errs := s.errors(); len(errs) != 0 {
		t.Fatalf("the stream's callback got error(s) %v", errs)
	}
}

// stStart starts a stream that must start (an empty mailbox, a confirmed subscription).
func stStart(t testing.TB, l *Layer, channel string, credit int, sink *stSink) *PendingReceive {
	t.Helper()
	p, err := l.StartStream(channel, credit, sink.deliver)
	if err != nil || p == nil {
		t.Fatalf("StartStream(%s, %d) = %v, %v; want a stream", channel, credit, p, err)
	}
	return p
}

// stSettle sends a sentinel to channel, which must have no receive or stream waiting, and waits
// until it is the last message in l's mailbox. The dispatcher routes messages one at a time and
// calls the callbacks of a message before it routes the next, so from then on every message sent
// earlier by sender was handed over or stored: counts are final. It returns the n of every
// message waiting before the sentinel, which stays in the mailbox.
func stSettle(t testing.TB, l, sender *Layer, channel string) []string {
	t.Helper()
	const sentinel = "settle"
	lcSend(t, sender, channel, sentinel)
	var waiting []string
	waitFor(t, 10*time.Second, "the sentinel in the mailbox of "+channel, func() bool {
		waiting = tkWaiting(t, l, channel)
		return len(waiting) > 0 && waiting[len(waiting)-1] == sentinel
	})
	return waiting[:len(waiting)-1]
}

// stSendAll sends lcBody of every n from a goroutine of its own, so that messages keep arriving
// while the test acts; the returned channel yields the first error (or nil) when it is done.
func stSendAll(t testing.TB, sender *Layer, channel string, ns []string) <-chan error {
	bodies := make([][]byte, len(ns))
	for i, n := range ns {
		bodies[i] = lcBody(t, n) // lcBody may fail the test: only on the test goroutine
	}
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for i, b := range bodies {
			if err := sender.SendRaw(ctx, channel, b); err != nil {
				done <- fmt.Errorf("send %s: %w", ns[i], err)
				return
			}
		}
		done <- nil
	}()
	return done
}

// stAwait waits (bounded) for one value of ch.
func stAwait[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing within 10s", what)
		var zero T
		return zero
	}
}

// stCapacityPair is tkPair with a receiving layer whose mailboxes hold capacity messages, for
// tests that leave many messages waiting.
func stCapacityPair(t testing.TB, capacity int) (a, b *Layer, ch string) {
	t.Helper()
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Capacity = capacity
	a = connect(t, cfg)
	b = connect(t, testConfig(nil, s.url()))
	ch, err := a.NewChannel(ctxT(t, 10*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	return a, b, ch
}

// ---------------------------------------------------------------------------------------------
// Delivery

// TestStreamDeliversInArrivalOrder: a stream hands exactly its credit of messages to its callback,
// in arrival order, each counted as delivered, then ends; the messages after its credit stay in
// the mailbox in order. Many messages make a reordering or a lost message visible.
func TestStreamDeliversInArrivalOrder(t *testing.T) {
	const credit, total = 500, 650
	a, b, ch := stCapacityPair(t, 1000)
	sink := stNewSink()
	p := stStart(t, a, ch, credit, sink)
	if w := lcWaiters(a, ch); w != 1 {
		t.Fatalf("%d waiter(s) on the mailbox, want the stream alone", w)
	}

	for _, n := range tkSeq(1, total) {
		lcSend(t, b, ch, n)
	}
	// The dispatcher routes in order: once the last one waits, everything before was handed over.
	waitFor(t, 10*time.Second, "the messages past the credit", func() bool { return lcEntries(a, ch) == total-credit })

	tkSame(t, "streamed messages", sink.ns(t), tkSeq(1, credit))
	tkSame(t, "messages left in the mailbox", tkWaiting(t, a, ch), tkSeq(credit+1, total))
	sink.noErrors(t)
	for _, m := range sink.messages() {
		if m.Channel != ch {
			t.Fatalf("a streamed message names channel %q, want %q", m.Channel, ch)
		}
	}
	if st := a.Stats(); st.Delivered != credit || st.Dropped.Capacity != 0 || st.Dropped.Expired != 0 {
		t.Fatalf("Delivered=%d (want %d), drops %+v", st.Delivered, credit, st.Dropped)
	}
	// Its credit is used: it has ended and is no longer in line.
	if w := lcWaiters(a, ch); w != 0 {
		t.Fatalf("%d waiter(s) left after the credit was used", w)
	}
	if unused := p.Stop(); unused != 0 {
		t.Fatalf("Stop after the credit was used = %d, want 0", unused)
	}
	if p.Cancel() {
		t.Fatal("Cancel after the credit was used returned true")
	}
}

// TestStreamFirstInLine: a stream queues behind a receive that was waiting before it, and once in
// front it keeps its place for its whole credit: a receive that started after it gets the message
// after the credit. While it waits, TakeReceive finds nothing: every arrival goes to it.
func TestStreamFirstInLine(t *testing.T) {
	a, b, ch := tkPair(t)
	before, _ := tkPending(t, a, ch)
	sink := stNewSink()
	stStart(t, a, ch, 3, sink)
	after, _ := tkPending(t, a, ch)

	if got := tkTake(t, a, ch, 10); len(got) != 0 {
		t.Fatalf("TakeReceive with a stream waiting returned %v", tkNs(t, got))
	}
	for _, n := range tkSeq(1, 6) {
		lcSend(t, b, ch, n)
	}
	waitFor(t, 10*time.Second, "the last message in the mailbox", func() bool { return lcEntries(a, ch) == 1 })

	if n := lcN(t, tkAwait(t, before, "the receive that waited first").Body); n != "1" {
		t.Fatalf("the receive that waited before the stream got %q, want 1", n)
	}
	tkSame(t, "streamed messages", sink.ns(t), []string{"2", "3", "4"})
	if n := lcN(t, tkAwait(t, after, "the receive that waited after the stream").Body); n != "5" {
		t.Fatalf("the receive that waited after the stream got %q, want 5", n)
	}
	tkSame(t, "mailbox", tkWaiting(t, a, ch), []string{"6"})
	sink.noErrors(t)
	if d := a.Stats().Delivered; d != 5 {
		t.Fatalf("Delivered = %d, want 5", d)
	}
}

// TestStreamGroupAndDirectMessagesInOrder: a stream on a process channel that is a group member
// gets direct and group messages interleaved in the order they arrived, and each one is handed
// over by the dispatcher: inside its own Deliveries(true) ... Deliveries(false) bracket, which
// only the dispatch goroutine opens.
func TestStreamGroupAndDirectMessagesInOrder(t *testing.T) {
	s := startServer(t)
	var mu sync.Mutex
	var events []string
	record := func(e string) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	cfg := testConfig(nil, s.url())
	cfg.Deliveries = func(begin bool) {
		if begin {
			record("begin")
		} else {
			record("end")
		}
	}
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.GroupAdd(ctx, "st-group", ch); err != nil {
		t.Fatal(err)
	}

	const total = 40
	sink := stNewSink()
	sink.onMessage = func(int) { record("deliver") }
	stStart(t, a, ch, total, sink)
	for i, n := range tkSeq(1, total) {
		if i%2 == 0 {
			lcSend(t, b, ch, n)
		} else {
			lcGroupSend(t, b, "st-group", n)
		}
	}
	sink.waitMsgs(t, total)
	waitFor(t, 10*time.Second, "the end of the last delivery", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(events) == 3*total
	})
	tkSame(t, "streamed messages", sink.ns(t), tkSeq(1, total))
	sink.noErrors(t)
	mu.Lock()
	got := append([]string(nil), events...)
	mu.Unlock()
	for i := 0; i < len(got); i += 3 {
		if got[i] != "begin" || got[i+1] != "deliver" || got[i+2] != "end" {
			t.Fatalf("events %d..%d = %v, want begin, deliver, end (all: %v)", i, i+2, got[i:i+3], got)
		}
	}
	if d := a.Stats().Delivered; d != total {
		t.Fatalf("Delivered = %d, want %d", d, total)
	}
}

// TestStreamOnProcessPrefix (S13): the rules of StartReceive for names apply, so a stream on the
// name "X!" of this client gets the messages of this client's process channels that have no
// mailbox of their own, in order.
func TestStreamOnProcessPrefix(t *testing.T) {
	a, b, made := tkPair(t)
	prefix := lcNonLocal(made) + "!"
	sink := stNewSink()
	stStart(t, a, prefix, 3, sink)
	unmade := []string{prefix + randomHex(16), prefix + randomHex(16), prefix + randomHex(16)}
	for i, ch := range unmade {
		lcSend(t, b, ch, fmt.Sprint(i+1))
	}
	sink.waitMsgs(t, 3)
	tkSame(t, "streamed messages", sink.ns(t), []string{"1", "2", "3"})
	sink.noErrors(t)
	for _, m := range sink.messages() {
		if m.Channel != prefix {
			t.Fatalf("a message taken by the prefix stream names %q, want %q (the name received on)", m.Channel, prefix)
		}
	}
	if st := a.Stats(); st.Delivered != 3 || st.Dropped.NoMailbox != 0 {
		t.Fatalf("Delivered=%d NoMailbox=%d, want 3 and 0", st.Delivered, st.Dropped.NoMailbox)
	}
}

// ---------------------------------------------------------------------------------------------
// Stop and Cancel: credit accounting

// TestStreamStopAndCancel: Stop returns the credit not used and Cancel reports whether any was
// left; a stopped stream's callback gets nothing more (the next message waits in the mailbox);
// Stop or Cancel of a stream that has ended gives 0 and false.
func TestStreamStopAndCancel(t *testing.T) {
	a, b, ch := tkPair(t)

	// Stopped before any message: the whole credit comes back, the callback never runs.
	fresh := stNewSink()
	p := stStart(t, a, ch, 5, fresh)
	if unused := p.Stop(); unused != 5 {
		t.Fatalf("Stop of a fresh stream = %d, want 5", unused)
	}
	if w := lcWaiters(a, ch); w != 0 {
		t.Fatalf("%d waiter(s) after Stop", w)
	}
	tkFill(t, a, b, ch, "x")
	if n := fresh.count(); n != 0 {
		t.Fatalf("a stopped stream got %d message(s)", n)
	}
	tkSame(t, "take after the stop", tkNs(t, tkTake(t, a, ch, 5)), []string{"x"})

	// Cancelled after part of its credit: true, then nothing more.
	part := stNewSink()
	p = stStart(t, a, ch, 5, part)
	lcSend(t, b, ch, "1")
	lcSend(t, b, ch, "2")
	part.waitMsgs(t, 2)
	if !p.Cancel() {
		t.Fatal("Cancel with 3 of 5 credit left returned false")
	}
	if unused := p.Stop(); unused != 0 {
		t.Fatalf("Stop after Cancel = %d, want 0", unused)
	}
	if p.Cancel() {
		t.Fatal("a second Cancel returned true")
	}
	if rest := stSettle(t, a, b, ch); len(rest) != 0 {
		t.Fatalf("messages before the sentinel: %v", rest)
	}
	tkSame(t, "messages of the cancelled stream", part.ns(t), []string{"1", "2"})
	tkTake(t, a, ch, 5)

	// Ended by its credit: Cancel is false, Stop 0.
	used := stNewSink()
	p = stStart(t, a, ch, 2, used)
	lcSend(t, b, ch, "3")
	lcSend(t, b, ch, "4")
	used.waitMsgs(t, 2)
	if p.Cancel() {
		t.Fatal("Cancel of a stream that used its credit returned true")
	}
	if unused := p.Stop(); unused != 0 {
		t.Fatalf("Stop of a stream that used its credit = %d, want 0", unused)
	}
	tkSame(t, "messages of the used stream", used.ns(t), []string{"3", "4"})
	for _, s := range []*stSink{fresh, part, used} {
		s.noErrors(t)
	}
	// x, 1, 2, settle (taken), 3, 4.
	if d := a.Stats().Delivered; d != 6 {
		t.Fatalf("Delivered = %d, want 6", d)
	}
}

// TestStreamStopFromCallback: Stop called from the callback at the k-th message returns exactly
// credit-k, and the messages after the k-th stay in the mailbox, in order. The point where it
// stops is fixed, so the counts are exact.
func TestStreamStopFromCallback(t *testing.T) {
	const credit, k, total = 1000, 137, 200
	a, b, ch := tkPair(t)
	var pr atomic.Pointer[PendingReceive]
	stopped := make(chan int, 1)
	sink := stNewSink()
	sink.onMessage = func(n int) {
		if n == k {
			stopped <- pr.Load().Stop()
		}
	}
	pr.Store(stStart(t, a, ch, credit, sink)) // before any message is sent

	for _, n := range tkSeq(1, total) {
		lcSend(t, b, ch, n)
	}
	if unused := stAwait(t, stopped, "the Stop in the callback"); unused != credit-k {
		t.Fatalf("Stop at message %d of credit %d = %d, want %d", k, credit, unused, credit-k)
	}
	rest := stSettle(t, a, b, ch)
	tkSame(t, "streamed messages", sink.ns(t), tkSeq(1, k))
	tkSame(t, "messages left in the mailbox", rest, tkSeq(k+1, total))
	sink.noErrors(t)
	if d := a.Stats().Delivered; d != k {
		t.Fatalf("Delivered = %d, want %d", d, k)
	}
	if unused := pr.Load().Stop(); unused != 0 {
		t.Fatalf("a second Stop = %d, want 0", unused)
	}
}

// TestStreamStopWhileMessagesFlow: Stop from another goroutine races with arrivals. Wherever it
// lands, it returns credit-k where k is how many messages were handed over, those are exactly the
// first k in order, and every later one is in the mailbox in order: nothing is lost or handed over
// twice. Several rounds, with credit above and below the number of messages sent.
func TestStreamStopWhileMessagesFlow(t *testing.T) {
	const total = 250
	a, b, ch := stCapacityPair(t, 1000)
	for round, credit := range []int{1000, 120, 40, 1000, 251, 2} {
		before := a.Stats().Delivered
		sink := stNewSink()
		p := stStart(t, a, ch, credit, sink)
		sent := stSendAll(t, b, ch, tkSeq(1, total))
		stAwait(t, sink.first, fmt.Sprintf("round %d: the first message", round))
		unused := p.Stop() // while the sender is (usually) still sending
		if err := stAwait(t, sent, "the sender"); err != nil {
			t.Fatal(err)
		}
		rest := stSettle(t, a, b, ch)

		k := credit - unused
		t.Logf("round %d: credit %d, stopped after %d message(s)", round, credit, k)
		if unused < 0 || k < 1 || k > min(credit, total) {
			t.Fatalf("round %d: Stop = %d with credit %d after the first message was handed over", round, unused, credit)
		}
		tkSame(t, fmt.Sprintf("round %d: streamed messages", round), sink.ns(t), tkSeq(1, k))
		tkSame(t, fmt.Sprintf("round %d: messages left in the mailbox", round), rest, tkSeq(k+1, total))
		sink.noErrors(t)
		if d := a.Stats().Delivered - before; d != uint64(k) {
			t.Fatalf("round %d: Delivered grew by %d, want %d", round, d, k)
		}
		if again := p.Stop(); again != 0 {
			t.Fatalf("round %d: a second Stop = %d, want 0", round, again)
		}
		if got := tkTake(t, a, ch, 2*total); len(got) != total-k+1 { // empty it for the next round
			t.Fatalf("round %d: took %d, want %d", round, len(got), total-k+1)
		}
	}
}

// TestStreamStopReleasesPlainChannel (S6): stopping a stream on a plain channel is its reader
// leaving: after ReleaseLinger the channel is released, so the queue group is not split and
// another client's reader gets the next message.
func TestStreamStopReleasesPlainChannel(t *testing.T) {
	s := startServer(t)
	a := connect(t, lcLingerConfig(s.url(), 100*time.Millisecond))
	other := connect(t, testConfig(nil, s.url()))
	sender := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 20*time.Second)
	const ch = "st-release"

	// A receive that gets its message subscribes without scheduling a release.
	got := lcRecvAsync(ctx, a, ch)
	lcReady(t, a, channelKey(ch), ch, 1)
	lcSend(t, sender, ch, "0")
	if r := lcAwait(t, got, 5*time.Second, "the first receive"); r.err != nil || lcN(t, r.body) != "0" {
		t.Fatalf("first receive: %q, %v", r.body, r.err)
	}
	sink := stNewSink()
	p := stStart(t, a, ch, 10, sink)
	lcSend(t, sender, ch, "1")
	sink.waitMsgs(t, 1)
	if unused := p.Stop(); unused != 9 {
		t.Fatalf("Stop = %d, want 9", unused)
	}
	waitFor(t, 5*time.Second, "the release of "+ch, func() bool { return lcSub(a, channelKey(ch)) == nil && !lcHasBox(a, ch) })

	otherGot := lcRecvAsync(ctx, other, ch)
	lcReady(t, other, channelKey(ch), ch, 1)
	lcSend(t, sender, ch, "2")
	if r := lcAwait(t, otherGot, 5*time.Second, "the other client's receive"); r.err != nil || lcN(t, r.body) != "2" {
		t.Fatalf("the other client got %q, %v; want 2", r.body, r.err)
	}
	tkSame(t, "streamed messages", sink.ns(t), []string{"1"})
	sink.noErrors(t)
}

// ---------------------------------------------------------------------------------------------
// Close

// TestStreamCloseEndsWithOneErrClosed (S16): Close ends every active stream with exactly one
// call deliver(Message{}, ErrClosed), whatever credit it had left, after the messages it was
// handed; a stream that had used its credit gets no call. Everything is done when Close returns.
func TestStreamCloseEndsWithOneErrClosed(t *testing.T) {
	a, b, ch := tkPair(t)
	idleCh, err := a.NewChannel(ctxT(t, 10*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	usedCh, err := a.NewChannel(ctxT(t, 10*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}

	busy, idle, used := stNewSink(), stNewSink(), stNewSink()
	pBusy := stStart(t, a, ch, math.MaxInt32, busy) // much credit left: still one error
	pIdle := stStart(t, a, idleCh, 5, idle)         // nothing handed over
	pUsed := stStart(t, a, usedCh, 1, used)         // ended by its credit before Close
	for _, n := range tkSeq(1, 3) {
		lcSend(t, b, ch, n)
	}
	lcSend(t, b, usedCh, "u")
	busy.waitMsgs(t, 3)
	used.waitMsgs(t, 1)

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	// Close returns after the last callback: no wait needed.
	for name, s := range map[string]*stSink{"busy": busy, "idle": idle} {
		errs := s.errors()
		if len(errs) != 1 || !errors.Is(errs[0], ErrClosed) {
			t.Fatalf("%s stream: error calls %v, want exactly one ErrClosed", name, errs)
		}
		if s.errorsWithMessage() != 0 {
			t.Fatalf("%s stream: the ErrClosed call carried a message", name)
		}
	}
	used.noErrors(t)
	tkSame(t, "busy stream", busy.ns(t), tkSeq(1, 3))
	if n := idle.count(); n != 0 {
		t.Fatalf("idle stream got %d message(s)", n)
	}
	tkSame(t, "used stream", used.ns(t), []string{"u"})

	for name, p := range map[string]*PendingReceive{"busy": pBusy, "idle": pIdle, "used": pUsed} {
		if unused := p.Stop(); unused != 0 {
			t.Fatalf("Stop of the %s stream after Close = %d, want 0", name, unused)
		}
		if p.Cancel() {
			t.Fatalf("Cancel of the %s stream after Close returned true", name)
		}
	}
	// A second Close (the cleanup makes one too) calls nothing again.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if n := len(busy.errors()) + len(idle.errors()) + len(used.errors()); n != 2 {
		t.Fatalf("%d error call(s) after a second Close, want 2", n)
	}
	if p, err := a.StartStream(ch, 1, stNewSink().deliver); !errors.Is(err, ErrClosed) || p != nil {
		t.Fatalf("StartStream after Close = %v, %v; want ErrClosed", p, err)
	}
}

// ---------------------------------------------------------------------------------------------
// Refusals: it never waits, never reorders, and checks its arguments

// TestStreamWouldBlockOnPlainChannel (S1): a stream never waits for a subscription. On a plain
// channel never received on, and while the first receive on it waits for the server's
// confirmation, StartStream returns ErrWouldBlock and changes nothing; after a receive
// subscribed, it starts and gets the channel's messages.
func TestStreamWouldBlockOnPlainChannel(t *testing.T) {
	s := startServer(t)
	px := lcStartProxy(t, s.url())
	a := connect(t, testConfig(nil, px.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 20*time.Second)
	const ch = "st-plain"
	sink := stNewSink()

	before := a.Stats()
	for _, credit := range []int{1, 100} {
		if p, err := a.StartStream(ch, credit, sink.deliver); !errors.Is(err, ErrWouldBlock) || p != nil {
			t.Fatalf("StartStream(credit %d) on a plain channel never received on = %v, %v; want ErrWouldBlock", credit, p, err)
		}
	}
	if lcHasBox(a, ch) || lcSub(a, channelKey(ch)) != nil {
		t.Fatal("a refused StartStream made a mailbox or a subscription")
	}
	if after := a.Stats(); after.Mailboxes != before.Mailboxes || after.Subscriptions != before.Subscriptions {
		t.Fatalf("a refused StartStream changed the layer: before %+v, after %+v", before, after)
	}

	// The first receive waits for its confirmation (the server's PONG is held back).
	px.pause()
	type started struct {
		p   *PendingReceive
		err error
	}
	start := make(chan started, 1)
	first := make(chan Message, 1)
	go func() {
		_, p, err := a.StartReceive(ctx, ch, func(m Message, err error) {
			if err == nil {
				first <- m
			}
		})
		start <- started{p, err}
	}()
	waitFor(t, 5*time.Second, "the first receive waiting for its confirmation", func() bool { return lcSubscribing(a, ch) })
	if p, err := a.StartStream(ch, 5, sink.deliver); !errors.Is(err, ErrWouldBlock) || p != nil {
		t.Fatalf("StartStream while the subscription is confirming = %v, %v; want ErrWouldBlock", p, err)
	}
	if ok, n, w := lcBox(a, ch); !ok || n != 0 || w != 0 || !lcSubscribing(a, ch) {
		t.Fatalf("the refused StartStream changed the confirming receive's mailbox: box=%v entries=%d waiters=%d", ok, n, w)
	}
	px.resume()
	if st := stAwait(t, start, "the first StartReceive"); st.err != nil || st.p == nil {
		t.Fatalf("first StartReceive: pending=%v err=%v; want a pending receive", st.p, st.err)
	}

	// Confirmed now: the stream starts, behind the receive that was waiting first.
	p := stStart(t, a, ch, 2, sink)
	for _, n := range []string{"r", "s1", "s2", "after"} {
		lcSend(t, b, ch, n)
	}
	if n := lcN(t, stAwait(t, first, "the first receive").Body); n != "r" {
		t.Fatalf("the first receive got %q, want r", n)
	}
	sink.waitMsgs(t, 2)
	waitFor(t, 5*time.Second, "the message after the credit", func() bool { return lcEntries(a, ch) == 1 })
	tkSame(t, "streamed messages", sink.ns(t), []string{"s1", "s2"})
	tkSame(t, "mailbox", tkWaiting(t, a, ch), []string{"after"})
	sink.noErrors(t)
	if unused := p.Stop(); unused != 0 {
		t.Fatalf("Stop = %d, want 0", unused)
	}
}

// TestStreamWouldBlockOnUnconfirmedSubscription (S1, S17): after the connection was closed for
// good, subscriptions wait for a new confirmation; StartStream then returns ErrWouldBlock and
// registers nothing. A StartReceive confirms again; then the stream starts and gets messages.
func TestStreamWouldBlockOnUnconfirmedSubscription(t *testing.T) {
	a, b, ch := tkPair(t)
	key := processKey(lcNonLocal(ch))
	rsForceClose(a)
	waitFor(t, 5*time.Second, "the process subscription to be unconfirmed", func() bool { return !lcConfirmed(a, key) })

	sink := stNewSink()
	if p, err := a.StartStream(ch, 3, sink.deliver); !errors.Is(err, ErrWouldBlock) || p != nil {
		t.Fatalf("StartStream on an unconfirmed subscription = %v, %v; want ErrWouldBlock", p, err)
	}
	if w := lcWaiters(a, ch); w != 0 {
		t.Fatalf("the refused StartStream registered %d waiter(s)", w)
	}

	_, pending := tkPending(t, a, ch) // waits for the recovery and confirms the subscription
	if !lcConfirmed(a, key) {
		t.Fatal("the subscription is not confirmed after StartReceive returned")
	}
	if !pending.Cancel() {
		t.Fatal("the confirming receive was handed something")
	}
	stStart(t, a, ch, 3, sink)
	for _, n := range tkSeq(1, 3) {
		lcSend(t, b, ch, n)
	}
	sink.waitMsgs(t, 3)
	tkSame(t, "streamed messages", sink.ns(t), tkSeq(1, 3))
	sink.noErrors(t)
}

// TestStreamNotStartedOnNonEmptyMailbox: with live messages waiting, StartStream returns
// (nil, nil) and changes nothing, so the messages keep their order: the caller takes them first,
// then the stream starts. Expired messages do not count: they are dropped (and counted) and the
// stream starts.
func TestStreamNotStartedOnNonEmptyMailbox(t *testing.T) {
	a, b, ch := tkPair(t)
	tkFill(t, a, b, ch, "1", "2", "3")
	refused := stNewSink()
	before := a.Stats()
	p, err := a.StartStream(ch, 10, refused.deliver)
	if err != nil || p != nil {
		t.Fatalf("StartStream on a mailbox with 3 messages = %v, %v; want nil, nil", p, err)
	}
	if w := lcWaiters(a, ch); w != 0 {
		t.Fatalf("the refused StartStream registered %d waiter(s)", w)
	}
	tkSame(t, "mailbox after the refused StartStream", tkWaiting(t, a, ch), []string{"1", "2", "3"})
	if after := a.Stats(); after != before {
		t.Fatalf("the refused StartStream changed the stats: before %+v, after %+v", before, after)
	}
	tkFill(t, a, b, ch, "4") // a later arrival is stored too: no stream took it
	if n := refused.count(); n != 0 {
		t.Fatalf("the refused stream's callback got %d message(s)", n)
	}

	// The documented way: take what waits, then start.
	tkSame(t, "take of what waited", tkNs(t, tkTake(t, a, ch, 10)), []string{"1", "2", "3", "4"})
	sink := stNewSink()
	p = stStart(t, a, ch, 2, sink)
	lcSend(t, b, ch, "5")
	lcSend(t, b, ch, "6")
	sink.waitMsgs(t, 2)
	tkSame(t, "streamed messages", sink.ns(t), []string{"5", "6"})
	sink.noErrors(t)
	refused.noErrors(t)
	if d := a.Stats().Delivered; d != 6 {
		t.Fatalf("Delivered = %d, want 6", d)
	}

	// Only an expired message waits: it does not hold the stream back. A host took it and returns
	// it with 1 ms left (a taken message, so that Delivered stays exact).
	tkFill(t, a, b, ch, "old")
	old := tkTake(t, a, ch, 1)
	a.PutBack(a.Returned(ch, old[0].Body, time.Millisecond))
	time.Sleep(20 * time.Millisecond) // it ages past its expiry (not a synchronization)
	late := stNewSink()
	stStart(t, a, ch, 1, late)
	lcSend(t, b, ch, "7")
	late.waitMsgs(t, 1)
	tkSame(t, "streamed past the expired message", late.ns(t), []string{"7"})
	if st := a.Stats(); st.Dropped.Expired != 1 || st.Delivered != 7 {
		t.Fatalf("Expired=%d Delivered=%d, want 1 and 7", st.Dropped.Expired, st.Delivered)
	}
}

// TestStreamRefusesBadArguments: credit below 1 is an error; invalid names (*NameError) and a
// process channel of another client (*ForeignChannelError) are refused as by StartReceive. The
// refused calls change nothing and never call the callback. A closed layer gives ErrClosed.
func TestStreamRefusesBadArguments(t *testing.T) {
	a, b, own := tkPair(t)
	foreign, err := b.NewChannel(ctxT(t, 10*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	sink := stNewSink()
	before := a.Stats()

	for _, credit := range []int{0, -1, math.MinInt} {
		p, err := a.StartStream(own, credit, sink.deliver)
		if err == nil || p != nil || errors.Is(err, ErrWouldBlock) || errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "credit") {
			t.Fatalf("StartStream(credit %d) = %v, %v; want an error about the credit", credit, p, err)
		}
	}
	if w := lcWaiters(a, own); w != 0 {
		t.Fatalf("a refused credit registered %d waiter(s)", w)
	}

	p, err := a.StartStream(foreign, 1, sink.deliver)
	var fe *ForeignChannelError
	if !errors.As(err, &fe) || fe.Channel != foreign || !errors.Is(err, ErrForeignChannel) || p != nil {
		t.Fatalf("StartStream(foreign) = %v, %v (%T); want *ForeignChannelError for %s", p, err, err, foreign)
	}
	if lcHasBox(a, foreign) {
		t.Fatal("StartStream(foreign) made a mailbox")
	}

	for _, name := range []string{"", "has space", "a..b", "x!y!z", lcNonLocal(own) + "!x y", "bad*"} {
		p, err := a.StartStream(name, 1, sink.deliver)
		wantNameError(t, err, "channel", name)
		if p != nil {
			t.Fatalf("StartStream(%q) returned a stream with its error", name)
		}
	}
	if after := a.Stats(); after.Mailboxes != before.Mailboxes || after.Subscriptions != before.Subscriptions || after.Delivered != before.Delivered {
		t.Fatalf("refused StartStreams changed the layer: before %+v, after %+v", before, after)
	}

	// Nothing was registered: a message to the own channel waits in its mailbox.
	tkFill(t, a, b, own, "1")
	if n, errs := sink.count(), sink.errors(); n != 0 || len(errs) != 0 {
		t.Fatalf("the callback of refused streams was called: %d message(s), errors %v", n, errs)
	}

	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []string{own, "st-plain-closed"} {
		if p, err := a.StartStream(ch, 1, sink.deliver); !errors.Is(err, ErrClosed) || p != nil {
			t.Fatalf("StartStream(%s) after Close = %v, %v; want ErrClosed", ch, p, err)
		}
	}
}

// ---------------------------------------------------------------------------------------------
// PutBack and TimeLeft

// TestStreamPutBackGoesToStream (S14): a message put back while a stream waits goes to the
// stream and uses its credit, keeping its arrival clock; once the credit is used a put-back goes
// to the front of the mailbox again. With credit for one, the first message of a put-back goes to
// the stream and the rest stays in front of the mailbox, in order. Delivered counts what stays
// handed over.
func TestStreamPutBackGoesToStream(t *testing.T) {
	a, b, ch := tkPair(t)
	tkFill(t, a, b, ch, "1", "2", "3")
	taken := tkTake(t, a, ch, 3)
	sink := stNewSink()
	p := stStart(t, a, ch, 3, sink)

	// One at a time, so that the order the callback sees is fixed.
	a.PutBack(taken[0])
	sink.waitMsgs(t, 1)
	a.PutBack(taken[1])
	sink.waitMsgs(t, 2)
	lcSend(t, b, ch, "4") // its last credit
	sink.waitMsgs(t, 3)
	tkSame(t, "streamed messages", sink.ns(t), []string{"1", "2", "4"})
	now := time.Now()
	for i, m := range sink.messages()[:2] {
		if m.Channel != ch || a.TimeLeft(m, now) != a.TimeLeft(taken[i], now) {
			t.Fatalf("put-back message %d reached the stream as channel %q with %s left; want %q and %s (its own clock)",
				i+1, m.Channel, a.TimeLeft(m, now), ch, a.TimeLeft(taken[i], now))
		}
	}
	if unused := p.Stop(); unused != 0 {
		t.Fatalf("Stop after the credit was used = %d, want 0", unused)
	}
	a.PutBack(taken[2]) // no stream any more: to the mailbox
	tkSame(t, "mailbox after the last put-back", tkWaiting(t, a, ch), []string{"3"})
	sink.noErrors(t)
	if d := a.Stats().Delivered; d != 3 { // 1, 2 and 4; 3 is waiting again
		t.Fatalf("Delivered = %d, want 3", d)
	}

	// Credit for one, three put back in one call.
	tkFill(t, a, b, ch, "5", "6")
	taken = tkTake(t, a, ch, 3)
	tkSame(t, "second take", tkNs(t, taken), []string{"3", "5", "6"})
	one := stNewSink()
	stStart(t, a, ch, 1, one)
	a.PutBack(taken...)
	one.waitMsgs(t, 1)
	tkSame(t, "stream of one", one.ns(t), []string{"3"})
	tkSame(t, "mailbox after the put-back", tkWaiting(t, a, ch), []string{"5", "6"})
	if w := lcWaiters(a, ch); w != 0 {
		t.Fatalf("%d waiter(s) left after the credit was used", w)
	}
	one.noErrors(t)
	if d := a.Stats().Delivered; d != 4 {
		t.Fatalf("Delivered = %d, want 4", d)
	}
}

// TestStreamTimeLeft (S4): a message handed over by a stream as it arrives has about the full
// Expiry left, counted down exactly as time passes and never negative; a message that waited in a
// host's buffer and reaches a stream through PutBack has only what it had left.
func TestStreamTimeLeft(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Expiry = 3 * time.Second
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ch, err := a.NewChannel(ctxT(t, 10*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}

	sink := stNewSink()
	stStart(t, a, ch, 1, sink)
	lcSend(t, b, ch, "fresh")
	sink.waitMsgs(t, 1)
	m := sink.messages()[0]
	now := time.Now()
	left := a.TimeLeft(m, now)
	if left <= cfg.Expiry-time.Second || left > cfg.Expiry {
		t.Fatalf("TimeLeft of a streamed message = %s, want in (%s, %s]", left, cfg.Expiry-time.Second, cfg.Expiry)
	}
	for _, d := range []time.Duration{time.Millisecond, 500 * time.Millisecond, left} {
		if got := a.TimeLeft(m, now.Add(d)); got != left-d {
			t.Errorf("TimeLeft %s later = %s, want %s", d, got, left-d)
		}
	}
	if got := a.TimeLeft(m, now.Add(left+time.Hour)); got != 0 {
		t.Errorf("TimeLeft past expiry = %s, want 0", got)
	}

	// A message kept 300 ms in a host buffer, then put back to a stream, keeps its age.
	tkFill(t, a, b, ch, "kept")
	held := tkTake(t, a, ch, 1)
	time.Sleep(300 * time.Millisecond) // it ages in the "host buffer" (not a synchronization)
	again := stNewSink()
	stStart(t, a, ch, 1, again)
	a.PutBack(held...)
	again.waitMsgs(t, 1)
	got := again.messages()[0]
	now = time.Now()
	if l := a.TimeLeft(got, now); l > cfg.Expiry-300*time.Millisecond || l != a.TimeLeft(held[0], now) {
		t.Fatalf("TimeLeft of a message put back to a stream = %s, want its own %s (at most %s)",
			l, a.TimeLeft(held[0], now), cfg.Expiry-300*time.Millisecond)
	}
	sink.noErrors(t)
	again.noErrors(t)
}

// ---------------------------------------------------------------------------------------------
// TestStreamPutBackManyKeepsOrder: three messages put back in one call to a stream with credit 3
// must reach its callback one at a time, in their order (the dispatcher delivers every hand-over;
// each put-back once had a goroutine of its own). The first call waits (bounded, 1 s) to see
// whether another call starts meanwhile; with serialized hand-overs none does and the test only
// takes that second longer.
func TestStreamPutBackManyKeepsOrder(t *testing.T) {
	a, b, ch := tkPair(t)
	tkFill(t, a, b, ch, "1", "2", "3")
	taken := tkTake(t, a, ch, 3)

	var inFlight, overlaps, started atomic.Int32
	secondStarted := make(chan struct{})
	sink := stNewSink()
	sink.onMessage = func(n int) {
		if inFlight.Add(1) > 1 {
			overlaps.Add(1)
		}
		if started.Add(1) == 2 {
			close(secondStarted)
		}
		if n == 1 {
			select { // give a concurrent hand-over the time to show
			case <-secondStarted:
			case <-time.After(time.Second):
			}
		}
		inFlight.Add(-1)
	}
	stStart(t, a, ch, 3, sink)
	a.PutBack(taken...)
	sink.waitMsgs(t, 3)
	waitFor(t, 5*time.Second, "the callbacks to return", func() bool { return inFlight.Load() == 0 })
	if n := overlaps.Load(); n != 0 {
		t.Errorf("the stream's callback ran concurrently with itself %d time(s)", n)
	}
	tkSame(t, "streamed put-back messages", sink.ns(t), []string{"1", "2", "3"})
}
