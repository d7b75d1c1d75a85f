package layer

// Tests of the receive-buffer contract of ops.go: TakeReceive (a non-blocking take of up to max
// waiting messages), TimeLeft, Returned, and PutBack of several messages (S4, S6, S14). Helpers
// from lifecycle_test.go (lcSend, lcN, lcEntries, ...) and resilience_test.go are reused; the
// helpers of this file start with tk.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"
)

// tkPair starts a server and returns a receiving layer, a sending layer and a process channel
// of the receiving one.
func tkPair(t testing.TB) (a, b *Layer, ch string) {
	t.Helper()
	s := startServer(t)
	a = connect(t, testConfig(nil, s.url()))
	b = connect(t, testConfig(nil, s.url()))
	ch, err := a.NewChannel(ctxT(t, 10*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	return a, b, ch
}

// tkTake calls TakeReceive and fails the test on an error.
func tkTake(t testing.TB, l *Layer, channel string, n int) []Message {
	t.Helper()
	msgs, err := l.TakeReceive(channel, n)
	if err != nil {
		t.Fatalf("TakeReceive(%s, %d): %v", channel, n, err)
	}
	return msgs
}

// tkNs returns the n of every message, in order.
func tkNs(t testing.TB, msgs []Message) []string {
	t.Helper()
	ns := make([]string, 0, len(msgs))
	for _, m := range msgs {
		ns = append(ns, lcN(t, m.Body))
	}
	return ns
}

// tkWaiting returns the n of every entry waiting in the mailbox of channel, front first.
func tkWaiting(t testing.TB, l *Layer, channel string) []string {
	t.Helper()
	l.mu.Lock()
	var bodies [][]byte
	if mb := l.mailboxes[channel]; mb != nil {
		for _, e := range mb.entries {
			bodies = append(bodies, e.body)
		}
	}
	l.mu.Unlock()
	ns := make([]string, 0, len(bodies))
	for _, b := range bodies {
		ns = append(ns, lcN(t, b))
	}
	return ns
}

// tkFill sends ns to channel from sender and waits until they all wait in l's mailbox.
func tkFill(t testing.TB, l, sender *Layer, channel string, ns ...string) {
	t.Helper()
	want := lcEntries(l, channel) + len(ns)
	for _, n := range ns {
		lcSend(t, sender, channel, n)
	}
	waitFor(t, 5*time.Second, fmt.Sprintf("%d message(s) waiting on %s", want, channel), func() bool {
		return lcEntries(l, channel) == want
	})
}

// tkSeq is "1" .. "n".
func tkSeq(from, to int) []string {
	var ns []string
	for i := from; i <= to; i++ {
		ns = append(ns, strconv.Itoa(i))
	}
	return ns
}

// tkSame fails the test unless got equals want (nil and empty are equal).
func tkSame(t testing.TB, what string, got, want []string) {
	t.Helper()
	if len(got) == 0 && len(want) == 0 {
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

// tkPending starts a receive on channel that must wait; its message goes to the returned channel.
func tkPending(t testing.TB, l *Layer, channel string) (<-chan Message, *PendingReceive) {
	t.Helper()
	got := make(chan Message, 1)
	m, p, err := l.StartReceive(ctxT(t, 5*time.Second), channel, func(m Message, err error) {
		if err != nil {
			if !errors.Is(err, ErrClosed) { // a receive still waiting at cleanup ends so
				t.Errorf("receive on %s ended with %v", channel, err)
			}
			return
		}
		got <- m
	})
	if err != nil || p == nil {
		t.Fatalf("StartReceive(%s): msg=%q pending=%v err=%v; want a pending receive", channel, m.Body, p, err)
	}
	return got, p
}

// tkAwait waits for the message of a pending receive.
func tkAwait(t testing.TB, got <-chan Message, what string) Message {
	t.Helper()
	select {
	case m := <-got:
		return m
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no message within 5s", what)
		return Message{}
	}
}

// ---------------------------------------------------------------------------------------------
// TakeReceive

// TestTakeReceiveUpToMax: with k messages waiting, TakeReceive(max) returns min(max, k) of them,
// oldest first, leaves the rest in order, and counts what it returned as delivered.
func TestTakeReceiveUpToMax(t *testing.T) {
	a, b, ch := tkPair(t)
	tkFill(t, a, b, ch, tkSeq(1, 5)...)

	for _, max := range []int{0, -1} {
		if got := tkTake(t, a, ch, max); len(got) != 0 {
			t.Fatalf("TakeReceive(max=%d) returned %v, want none", max, tkNs(t, got))
		}
	}
	tkSame(t, "waiting after max 0", tkWaiting(t, a, ch), tkSeq(1, 5))
	if d := a.Stats().Delivered; d != 0 {
		t.Fatalf("Delivered after max 0 = %d, want 0", d)
	}

	steps := []struct {
		max       int
		want      []string
		delivered uint64
	}{
		{1, []string{"1"}, 1},
		{3, []string{"2", "3", "4"}, 4},
		{10, []string{"5"}, 5}, // fewer waiting than max
		{10, nil, 5},           // none waiting
		{1, nil, 5},
	}
	for _, st := range steps {
		got := tkTake(t, a, ch, st.max)
		tkSame(t, fmt.Sprintf("TakeReceive(max=%d)", st.max), tkNs(t, got), st.want)
		for _, m := range got {
			if m.Channel != ch {
				t.Errorf("a taken message names channel %q, want %q", m.Channel, ch)
			}
		}
		if d := a.Stats().Delivered; d != st.delivered {
			t.Fatalf("after TakeReceive(max=%d): Delivered = %d, want %d", st.max, d, st.delivered)
		}
	}
	if st := a.Stats(); st.Dropped.Expired != 0 || st.Dropped.NoMailbox != 0 {
		t.Errorf("drops: %+v", st.Dropped)
	}
	if !lcHasBox(a, ch) {
		t.Fatal("the mailbox is gone after it was emptied by TakeReceive")
	}
	lcExpectNothing(t, a, ch, 100*time.Millisecond) // taken messages are not received again
}

// TestTakeReceiveEmptyMailbox: on a confirmed channel with nothing waiting, TakeReceive returns
// none without an error and the channel keeps working for both kinds of receive.
func TestTakeReceiveEmptyMailbox(t *testing.T) {
	a, b, ch := tkPair(t)
	for _, max := range []int{1, 64} {
		if got := tkTake(t, a, ch, max); len(got) != 0 {
			t.Fatalf("TakeReceive(max=%d) on an empty mailbox returned %v", max, tkNs(t, got))
		}
	}
	if ok, n, w := lcBox(a, ch); !ok || n != 0 || w != 0 {
		t.Fatalf("mailbox after TakeReceive on it empty: exists=%v entries=%d waiters=%d", ok, n, w)
	}
	if d := a.Stats().Delivered; d != 0 {
		t.Fatalf("Delivered = %d, want 0", d)
	}

	got, _ := tkPending(t, a, ch)
	lcSend(t, b, ch, "later")
	if n := lcN(t, tkAwait(t, got, "receive after an empty take").Body); n != "later" {
		t.Fatalf("the receive got %q, want later", n)
	}
	tkFill(t, a, b, ch, "x")
	tkSame(t, "take after the receive", tkNs(t, tkTake(t, a, ch, 5)), []string{"x"})
	if d := a.Stats().Delivered; d != 2 {
		t.Fatalf("Delivered = %d, want 2", d)
	}
}

// TestTakeReceiveUnknownChannel: a plain channel nobody receives on, and a valid process channel
// of this client that has no mailbox, give none; nothing is created (no mailbox, no subscription)
// and a later StartReceive on them subscribes and receives as usual.
func TestTakeReceiveUnknownChannel(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	made, err := a.NewChannel(ctx, "") // the process subscription exists; the mailbox below does not
	if err != nil {
		t.Fatal(err)
	}
	const plain = "tk-unknown-plain"
	process := lcNonLocal(made) + "!" + randomHex(16)

	before := a.Stats()
	for _, ch := range []string{plain, process} {
		if got := tkTake(t, a, ch, 10); len(got) != 0 {
			t.Fatalf("TakeReceive(%s) returned %v, want none", ch, tkNs(t, got))
		}
		if lcHasBox(a, ch) {
			t.Fatalf("TakeReceive(%s) made a mailbox", ch)
		}
	}
	after := a.Stats()
	if after.Mailboxes != before.Mailboxes || after.Subscriptions != before.Subscriptions || after.Delivered != before.Delivered {
		t.Fatalf("TakeReceive on unknown channels changed the layer: before %+v, after %+v", before, after)
	}
	if lcSub(a, channelKey(plain)) != nil {
		t.Fatal("TakeReceive subscribed to a plain channel")
	}

	// A later receive works: it subscribes (plain) or makes the mailbox (process).
	gotPlain := lcRecvAsync(ctx, a, plain)
	lcReady(t, a, channelKey(plain), plain, 1)
	lcSend(t, b, plain, "p")
	if r := lcAwait(t, gotPlain, 5*time.Second, "plain receive after TakeReceive"); r.err != nil || lcN(t, r.body) != "p" {
		t.Fatalf("plain receive got %q, %v; want p", r.body, r.err)
	}
	gotProcess := lcRecvAsync(ctx, a, process)
	waitFor(t, 5*time.Second, "a receive waiting on "+process, func() bool { return lcWaiters(a, process) == 1 })
	lcSend(t, b, process, "q")
	if r := lcAwait(t, gotProcess, 5*time.Second, "process receive after TakeReceive"); r.err != nil || lcN(t, r.body) != "q" {
		t.Fatalf("process receive got %q, %v; want q", r.body, r.err)
	}
	// Now both are known and confirmed: TakeReceive takes from them.
	tkFill(t, a, b, process, "q2")
	tkSame(t, "take on the process channel", tkNs(t, tkTake(t, a, process, 3)), []string{"q2"})
}

// TestTakeReceiveUnconfirmedSubscription: after the connection was closed for good every
// subscription waits for a new confirmation; TakeReceive then gives none although messages wait,
// and changes nothing. A StartReceive confirms again and gets the oldest; TakeReceive then takes
// the rest.
func TestTakeReceiveUnconfirmedSubscription(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 30*time.Second)
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	tkFill(t, a, b, ch, "1", "2", "3")
	key := processKey(lcNonLocal(ch))

	rsForceClose(a)
	waitFor(t, 5*time.Second, "the process subscription to be unconfirmed", func() bool { return !lcConfirmed(a, key) })
	if got := tkTake(t, a, ch, 10); len(got) != 0 {
		t.Fatalf("TakeReceive on an unconfirmed subscription returned %v, want none", tkNs(t, got))
	}
	tkSame(t, "waiting after the refused take", tkWaiting(t, a, ch), []string{"1", "2", "3"})
	if st := a.Stats(); st.Delivered != 0 || st.Dropped.Expired != 0 {
		t.Fatalf("after the refused take: Delivered=%d Expired=%d, want 0 and 0", st.Delivered, st.Dropped.Expired)
	}
	if lcWaiters(a, ch) != 0 {
		t.Fatal("TakeReceive registered a waiter")
	}

	m, p, err := a.StartReceive(ctx, ch, func(Message, error) {})
	if err != nil || p != nil {
		t.Fatalf("StartReceive after the refused take: msg=%q pending=%v err=%v", m.Body, p, err)
	}
	if n := lcN(t, m.Body); n != "1" {
		t.Fatalf("StartReceive got %q, want 1 (the oldest)", n)
	}
	if !lcConfirmed(a, key) {
		t.Fatal("the subscription is not confirmed after StartReceive returned")
	}
	tkSame(t, "take after the confirmation", tkNs(t, tkTake(t, a, ch, 10)), []string{"2", "3"})
	if d := a.Stats().Delivered; d != 3 {
		t.Fatalf("Delivered = %d, want 3", d)
	}
}

// TestTakeReceiveWhileFirstReceiveConfirms: while the first receive of a plain channel waits for
// its confirmation (the server's PONG is held back), TakeReceive gives none and does not disturb
// that receive, which then waits and gets the next message.
func TestTakeReceiveWhileFirstReceiveConfirms(t *testing.T) {
	s := startServer(t)
	px := lcStartProxy(t, s.url())
	a := connect(t, testConfig(nil, px.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 20*time.Second)
	const ch = "tk-confirming"

	px.pause()
	got := make(chan Message, 1)
	type started struct {
		p   *PendingReceive
		err error
	}
	start := make(chan started, 1)
	go func() {
		_, p, err := a.StartReceive(ctx, ch, func(m Message, err error) {
			if err != nil {
				t.Errorf("receive ended with %v", err)
			}
			got <- m
		})
		start <- started{p, err}
	}()
	waitFor(t, 5*time.Second, "the first receive waiting for its confirmation", func() bool { return lcSubscribing(a, ch) })
	for i := 0; i < 3; i++ {
		if msgs := tkTake(t, a, ch, 10); len(msgs) != 0 {
			t.Fatalf("TakeReceive while confirming returned %v", tkNs(t, msgs))
		}
	}
	if ok, n, w := lcBox(a, ch); !ok || n != 0 || w != 0 || !lcSubscribing(a, ch) || lcConfirmed(a, channelKey(ch)) {
		t.Fatalf("TakeReceive changed the confirming receive's state: box=%v entries=%d waiters=%d", ok, n, w)
	}
	px.resume()
	var st started
	select {
	case st = <-start:
	case <-time.After(5 * time.Second):
		t.Fatal("StartReceive did not return after the confirmation")
	}
	if st.err != nil || st.p == nil {
		t.Fatalf("StartReceive: pending=%v err=%v; want a pending receive", st.p, st.err)
	}
	lcSend(t, b, ch, "first")
	if n := lcN(t, tkAwait(t, got, "the receive that was confirming").Body); n != "first" {
		t.Fatalf("got %q, want first", n)
	}
}

// TestTakeReceiveRefuses: a process channel of another client (*ForeignChannelError), an invalid
// name (*NameError) and a closed layer (ErrClosed). The refused calls change nothing.
func TestTakeReceiveRefuses(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	own, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := b.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	lcSend(t, b, foreign, "theirs")
	waitFor(t, 5*time.Second, "b's message", func() bool { return lcEntries(b, foreign) == 1 })
	before := a.Stats()

	msgs, err := a.TakeReceive(foreign, 10)
	var fe *ForeignChannelError
	if !errors.As(err, &fe) || fe.Channel != foreign || !errors.Is(err, ErrForeignChannel) {
		t.Fatalf("TakeReceive(foreign) = %v, %v (%T); want *ForeignChannelError for %s", tkNs(t, msgs), err, err, foreign)
	}
	if len(msgs) != 0 {
		t.Fatalf("TakeReceive(foreign) returned messages with its error: %v", tkNs(t, msgs))
	}
	if lcHasBox(a, foreign) || lcEntries(b, foreign) != 1 {
		t.Fatal("TakeReceive(foreign) changed a mailbox")
	}

	for _, name := range []string{"", "has space", "a..b", "x!y!z", lcNonLocal(own) + "!x y", "bad*"} {
		msgs, err := a.TakeReceive(name, 10)
		wantNameError(t, err, "channel", name)
		if len(msgs) != 0 {
			t.Fatalf("TakeReceive(%q) returned messages with its error", name)
		}
	}
	after := a.Stats()
	if after.Mailboxes != before.Mailboxes || after.Subscriptions != before.Subscriptions || after.Delivered != before.Delivered {
		t.Fatalf("refused TakeReceives changed the layer: before %+v, after %+v", before, after)
	}

	tkFill(t, a, b, own, "1")
	taken := tkTake(t, a, own, 1)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []string{own, "tk-plain"} {
		if msgs, err := a.TakeReceive(ch, 10); !errors.Is(err, ErrClosed) || len(msgs) != 0 {
			t.Fatalf("TakeReceive(%s) after Close = %v, %v; want ErrClosed", ch, tkNs(t, msgs), err)
		}
	}
	a.PutBack(taken...) // no-ops after Close; must not panic
	a.PutBack()
	a.PutBack(a.Returned(own, lcBody(t, "r"), time.Second))
}

// TestTakeReceiveSkipsExpired (S4): messages that waited longer than Expiry are not returned and
// are counted as expired (by TakeReceive or by the sweep, once); live ones behind them are taken.
func TestTakeReceiveSkipsExpired(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Expiry = 400 * time.Millisecond
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ch, err := a.NewChannel(ctxT(t, 10*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	tkFill(t, a, b, ch, "old1", "old2")
	time.Sleep(cfg.Expiry + 200*time.Millisecond) // they age past expiry (not an assertion)
	for _, n := range []string{"new1", "new2"} {
		lcSend(t, b, ch, n)
	}
	waitFor(t, 5*time.Second, "the fresh messages", func() bool {
		w := tkWaiting(t, a, ch)
		return len(w) > 0 && w[len(w)-1] == "new2"
	})
	tkSame(t, "take past expired messages", tkNs(t, tkTake(t, a, ch, 10)), []string{"new1", "new2"})
	st := a.Stats()
	if st.Dropped.Expired != 2 || st.Delivered != 2 {
		t.Fatalf("Expired=%d Delivered=%d, want 2 and 2", st.Dropped.Expired, st.Delivered)
	}
	if len(tkTake(t, a, ch, 10)) != 0 {
		t.Fatal("a second take found messages")
	}
}

// TestTakeReceiveSkipsExpiredInTheMiddle (S4): with a long Expiry (the sweep rarely runs), put-back
// messages with no time left in front of live ones are skipped by TakeReceive, even where a live
// message precedes them, and each is counted as expired exactly once.
func TestTakeReceiveSkipsExpiredInTheMiddle(t *testing.T) {
	a, b, ch := tkPair(t)
	tkFill(t, a, b, ch, "live1", "live2")
	a.PutBack(
		a.Returned(ch, lcBody(t, "dead1"), 0),
		a.Returned(ch, lcBody(t, "front"), time.Minute),
		a.Returned(ch, lcBody(t, "dead2"), 0),
	)
	time.Sleep(5 * time.Millisecond) // "no time left" is past expiry as soon as time moves on
	tkSame(t, "take", tkNs(t, tkTake(t, a, ch, 10)), []string{"front", "live1", "live2"})
	if st := a.Stats(); st.Dropped.Expired != 2 {
		t.Fatalf("Expired = %d, want 2", st.Dropped.Expired)
	}
	time.Sleep(1100 * time.Millisecond) // a sweep (every 1 s at most) runs: nothing counted twice
	if st := a.Stats(); st.Dropped.Expired != 2 {
		t.Fatalf("Expired after a sweep = %d, want 2", st.Dropped.Expired)
	}
}

// ---------------------------------------------------------------------------------------------
// TimeLeft and Returned

// TestTimeLeft: the time a taken message has left decreases as time passes, by exactly the time
// that passed, starts at no more than Expiry, and is never negative.
func TestTimeLeft(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Expiry = 2 * time.Second
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ch, err := a.NewChannel(ctxT(t, 10*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	tkFill(t, a, b, ch, "1")
	msgs := tkTake(t, a, ch, 1)
	if len(msgs) != 1 {
		t.Fatalf("took %d, want 1", len(msgs))
	}
	m := msgs[0]
	now := time.Now()
	left := a.TimeLeft(m, now)
	if left <= 0 || left > cfg.Expiry {
		t.Fatalf("TimeLeft right after arrival = %s, want in (0, %s]", left, cfg.Expiry)
	}
	if left < cfg.Expiry-time.Second {
		t.Errorf("TimeLeft right after arrival = %s: more than 1 s of %s already gone", left, cfg.Expiry)
	}
	for _, d := range []time.Duration{time.Millisecond, 300 * time.Millisecond, left / 2, left} {
		want := left - d
		if got := a.TimeLeft(m, now.Add(d)); got != want {
			t.Errorf("TimeLeft %s later = %s, want %s", d, got, want)
		}
	}
	for _, d := range []time.Duration{left + time.Nanosecond, left + time.Second, 100 * cfg.Expiry, 1000 * time.Hour} {
		if got := a.TimeLeft(m, now.Add(d)); got != 0 {
			t.Errorf("TimeLeft %s later (past expiry) = %s, want 0", d, got)
		}
	}
	time.Sleep(50 * time.Millisecond)
	if later := a.TimeLeft(m, time.Now()); later >= left || later < 0 {
		t.Errorf("TimeLeft after 50 ms of real time = %s, was %s", later, left)
	}
	if got := a.TimeLeft(Message{}, time.Now()); got < 0 {
		t.Errorf("TimeLeft of a zero Message = %s, negative", got)
	}
	r := a.Returned(ch, m.Body, 0)
	if got := a.TimeLeft(r, time.Now().Add(time.Second)); got != 0 {
		t.Errorf("TimeLeft of a message returned with nothing left, 1 s on = %s, want 0", got)
	}
}

// TestReturnedPutBackRestoresExpiry (S4, S14): a message rebuilt by Returned with the time it had
// left expires in the mailbox when that time is up (counted once as expired), not a full Expiry
// later; one with a long time left survives and keeps its clock. A taken message put back as is
// keeps its own arrival time; one rebuilt as Message{Channel, Body} gets a full Expiry.
func TestReturnedPutBackRestoresExpiry(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Expiry = 5 * time.Second
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ch, err := a.NewChannel(ctxT(t, 10*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	tkFill(t, a, b, ch, "short", "long")
	msgs := tkTake(t, a, ch, 2)
	if len(msgs) != 2 {
		t.Fatalf("took %d, want 2", len(msgs))
	}
	short, long := msgs[0].Body, msgs[1].Body

	// Short: 300 ms left. Still there at once, with at most that left; gone after it.
	a.PutBack(a.Returned(ch, short, 300*time.Millisecond))
	again := tkTake(t, a, ch, 5)
	tkSame(t, "take right after the put-back", tkNs(t, again), []string{"short"})
	if left := a.TimeLeft(again[0], time.Now()); left <= 0 || left > 300*time.Millisecond {
		t.Fatalf("TimeLeft of the message returned with 300 ms = %s", left)
	}
	a.PutBack(a.Returned(ch, short, a.TimeLeft(again[0], time.Now())))
	time.Sleep(500 * time.Millisecond)
	if got := tkTake(t, a, ch, 5); len(got) != 0 {
		t.Fatalf("a message returned with 300 ms left was still taken 500 ms later: %v", tkNs(t, got))
	}
	if st := a.Stats(); st.Dropped.Expired != 1 || st.Delivered != 1 { // "long" is still out
		t.Fatalf("Expired=%d Delivered=%d, want 1 and 1", st.Dropped.Expired, st.Delivered)
	}

	// Long: 4 s left. Survives 300 ms, with its clock kept (not reset to Expiry).
	a.PutBack(a.Returned(ch, long, 4*time.Second))
	time.Sleep(300 * time.Millisecond)
	got := tkTake(t, a, ch, 5)
	tkSame(t, "take of the long one", tkNs(t, got), []string{"long"})
	if left := a.TimeLeft(got[0], time.Now()); left <= 2*time.Second || left > 3700*time.Millisecond {
		t.Fatalf("TimeLeft of a message returned with 4 s, 300 ms later = %s, want in (2s, 3.7s]", left)
	}

	// Put back as taken: its own clock.
	time.Sleep(200 * time.Millisecond)
	before := a.TimeLeft(got[0], time.Now())
	a.PutBack(got[0])
	kept := tkTake(t, a, ch, 5)
	tkSame(t, "take after putting the taken message back", tkNs(t, kept), []string{"long"})
	now := time.Now()
	if a.TimeLeft(kept[0], now) != a.TimeLeft(got[0], now) || a.TimeLeft(kept[0], now) > before {
		t.Fatalf("a put-back message did not keep its clock: %s left, before the put-back %s",
			a.TimeLeft(kept[0], now), before)
	}

	// Body and name only: a full Expiry.
	a.PutBack(Message{Channel: ch, Body: long})
	full := tkTake(t, a, ch, 5)
	tkSame(t, "take of the body-only put-back", tkNs(t, full), []string{"long"})
	if left := a.TimeLeft(full[0], time.Now()); left < cfg.Expiry-time.Second || left > cfg.Expiry {
		t.Fatalf("TimeLeft of Message{Channel, Body} put back = %s, want about %s", left, cfg.Expiry)
	}
	if st := a.Stats(); st.Dropped.Expired != 1 {
		t.Fatalf("Expired = %d, want 1", st.Dropped.Expired)
	}
}

// ---------------------------------------------------------------------------------------------
// PutBack of several messages

// TestPutBackManyKeepsOrder (S14): messages put back in one call go in front of those already
// waiting, in their order; a later call goes in front of an earlier one; one call can return
// messages of several mailboxes, each in its order. Delivered counts only what stays taken.
func TestPutBackManyKeepsOrder(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	tkFill(t, a, b, ch, tkSeq(1, 6)...)

	first := tkTake(t, a, ch, 3)
	tkSame(t, "first take", tkNs(t, first), []string{"1", "2", "3"})
	a.PutBack(first...)
	tkSame(t, "waiting after the put-back", tkWaiting(t, a, ch), tkSeq(1, 6))
	if d := a.Stats().Delivered; d != 0 {
		t.Fatalf("Delivered after putting every taken message back = %d, want 0", d)
	}

	all := tkTake(t, a, ch, 10)
	tkSame(t, "take of everything", tkNs(t, all), tkSeq(1, 6))
	a.PutBack(all[3:]...)
	a.PutBack(all[1:3]...)
	a.PutBack(all[0])
	tkSame(t, "waiting after three put-backs, last first", tkWaiting(t, a, ch), tkSeq(1, 6))
	lcSend(t, b, ch, "7")
	waitFor(t, 5*time.Second, "a new arrival", func() bool { return lcEntries(a, ch) == 7 })
	for i, want := range tkSeq(1, 7) {
		if got := lcRecv(t, a, ch, 5*time.Second); got != want {
			t.Fatalf("receive %d after the put-backs got %q, want %q", i+1, got, want)
		}
	}

	// Two mailboxes in one call, interleaved.
	other, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	tkFill(t, a, b, ch, "a1", "a2", "a3")
	tkFill(t, a, b, other, "b1", "b2", "b3")
	ta := tkTake(t, a, ch, 2)
	tb := tkTake(t, a, other, 2)
	a.PutBack(ta[0], tb[0], ta[1], tb[1])
	tkSame(t, "first mailbox", tkWaiting(t, a, ch), []string{"a1", "a2", "a3"})
	tkSame(t, "second mailbox", tkWaiting(t, a, other), []string{"b1", "b2", "b3"})
	if d := a.Stats().Delivered; d != 7 {
		t.Fatalf("Delivered = %d, want 7", d)
	}
}

// TestPutBackManyToWaitingReceive (S14): with a receive waiting, the first message of a
// put-back goes to it and the rest stay in front of the mailbox in order; with two waiting, the
// longest-waiting gets the first and the other the second.
func TestPutBackManyToWaitingReceive(t *testing.T) {
	a, b, ch := tkPair(t)

	tkFill(t, a, b, ch, "1", "2", "3")
	taken := tkTake(t, a, ch, 3)
	got, p := tkPending(t, a, ch)
	a.PutBack(taken...)
	if n := lcN(t, tkAwait(t, got, "the waiting receive").Body); n != "1" {
		t.Fatalf("the waiting receive got %q, want 1", n)
	}
	if p.Cancel() {
		t.Error("Cancel after the put-back hand-over returned true")
	}
	if w := lcWaiters(a, ch); w != 0 {
		t.Fatalf("%d waiter(s) left", w)
	}
	tkSame(t, "waiting after the hand-over", tkWaiting(t, a, ch), []string{"2", "3"})
	if d := a.Stats().Delivered; d != 1 {
		t.Fatalf("Delivered = %d, want 1", d)
	}
	tkSame(t, "take of the rest", tkNs(t, tkTake(t, a, ch, 10)), []string{"2", "3"})

	// Two receives waiting.
	tkFill(t, a, b, ch, "4", "5", "6", "7")
	taken = tkTake(t, a, ch, 4)
	got1, _ := tkPending(t, a, ch)
	got2, _ := tkPending(t, a, ch)
	a.PutBack(taken...)
	if n := lcN(t, tkAwait(t, got1, "the first waiting receive").Body); n != "4" {
		t.Fatalf("the longest-waiting receive got %q, want 4", n)
	}
	if n := lcN(t, tkAwait(t, got2, "the second waiting receive").Body); n != "5" {
		t.Fatalf("the second waiting receive got %q, want 5", n)
	}
	tkSame(t, "waiting after two hand-overs", tkWaiting(t, a, ch), []string{"6", "7"})
	if d := a.Stats().Delivered; d != 5 {
		t.Fatalf("Delivered = %d, want 5", d)
	}
}

// TestPutBackNone: PutBack with no message changes nothing: no hand-over to a waiting receive,
// no counter, no mailbox.
func TestPutBackNone(t *testing.T) {
	a, b, ch := tkPair(t)
	other, err := a.NewChannel(ctxT(t, 10*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	tkFill(t, a, b, ch, "1", "2")
	tkTake(t, a, ch, 1)
	got, p := tkPending(t, a, other)
	before := a.Stats()

	a.PutBack()
	a.PutBack([]Message{}...)
	a.PutBack([]Message(nil)...)

	time.Sleep(50 * time.Millisecond)
	select {
	case m := <-got:
		t.Fatalf("an empty PutBack handed %q to a waiting receive", m.Body)
	default:
	}
	if after := a.Stats(); !reflect.DeepEqual(before, after) {
		t.Fatalf("an empty PutBack changed the stats: before %+v, after %+v", before, after)
	}
	tkSame(t, "waiting after empty put-backs", tkWaiting(t, a, ch), []string{"2"})
	if w := lcWaiters(a, other); w != 1 {
		t.Fatalf("%d receive(s) waiting, want 1", w)
	}
	if !p.Cancel() {
		t.Fatal("the waiting receive was handed something")
	}
}

// TestPutBackManyAfterPlainRelease (S6, S14): messages of a plain channel taken by TakeReceive
// and put back after the channel was released are re-published in their order, so another reader
// receives them; taken messages and messages rebuilt by Returned both go that way.
func TestPutBackManyAfterPlainRelease(t *testing.T) {
	s := startServer(t)
	a := connect(t, lcLingerConfig(s.url(), 100*time.Millisecond))
	b := connect(t, testConfig(nil, s.url()))
	sender := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 20*time.Second)
	const ch = "tk-released"

	// A group membership holds the mailbox (no reader needed), so nothing is released early.
	if err := a.GroupAdd(ctx, "tk-hold", ch); err != nil {
		t.Fatal(err)
	}
	tkFill(t, a, sender, ch, "1", "2", "3", "4")
	taken := tkTake(t, a, ch, 10)
	tkSame(t, "take on the plain channel", tkNs(t, taken), []string{"1", "2", "3", "4"})
	if err := a.GroupDiscard("tk-hold", ch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "A's release of "+ch, func() bool { return lcSub(a, channelKey(ch)) == nil && !lcHasBox(a, ch) })

	bGot := lcRecvAsync(ctx, b, ch)
	lcReady(t, b, channelKey(ch), ch, 1)
	now := time.Now()
	a.PutBack(taken[0], a.Returned(ch, taken[1].Body, a.TimeLeft(taken[1], now)), taken[2], Message{Channel: ch, Body: taken[3].Body})
	r := lcAwait(t, bGot, 5*time.Second, "B's receive")
	if r.err != nil || lcN(t, r.body) != "1" {
		t.Fatalf("B got %q, %v; want 1", r.body, r.err)
	}
	for _, want := range []string{"2", "3", "4"} {
		if got := lcRecv(t, b, ch, 5*time.Second); got != want {
			t.Fatalf("B then got %q, want %q", got, want)
		}
	}
	st := a.Stats()
	if st.HandedBack != 4 || st.Delivered != 0 || st.Dropped.NoMailbox != 0 {
		t.Fatalf("A: HandedBack=%d Delivered=%d NoMailbox=%d; want 4, 0, 0", st.HandedBack, st.Delivered, st.Dropped.NoMailbox)
	}
	if lcHasBox(a, ch) || lcSub(a, channelKey(ch)) != nil {
		t.Fatal("PutBack on a released plain channel made a mailbox or a subscription in A")
	}
}

// TestTakeReceiveConcurrent: takers and a plain receiver race on one process channel; every
// message ends with exactly one of them and the counters agree. When the takers keep everything,
// each batch is in arrival order. When they put part of each batch back, no order is asserted:
// two holders putting back one after the other legitimately leave the later put-back in front.
func TestTakeReceiveConcurrent(t *testing.T) {
	for _, putBack := range []bool{false, true} {
		name := "keep all"
		if putBack {
			name = "put back part"
		}
		t.Run(name, func(t *testing.T) { tkConcurrent(t, putBack) })
	}
}

func tkConcurrent(t *testing.T, putBack bool) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Capacity = 1000
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 30*time.Second)
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	const total = 300
	var mu sync.Mutex
	seen := map[int]int{}
	kept := 0
	keep := func(ns ...int) {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range ns {
			seen[n]++
		}
		kept += len(ns)
	}
	done := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return kept >= total
	}

	rctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !done() && rctx.Err() == nil {
				msgs, err := a.TakeReceive(ch, 1+rand.IntN(8))
				if err != nil {
					t.Errorf("TakeReceive: %v", err)
					return
				}
				if len(msgs) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				ns := make([]int, len(msgs))
				for j, m := range msgs {
					ns[j], _ = strconv.Atoi(lcN(t, m.Body))
				}
				k := len(msgs)
				if putBack {
					k = rand.IntN(len(msgs) + 1)
				} else {
					for j := 1; j < len(ns); j++ {
						if ns[j] <= ns[j-1] {
							t.Errorf("a batch is out of arrival order: %v", ns)
							break
						}
					}
				}
				keep(ns[:k]...)
				a.PutBack(msgs[k:]...)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !done() {
			body, err := a.ReceiveRaw(rctx, ch)
			if err != nil {
				return
			}
			n, _ := strconv.Atoi(lcN(t, body))
			keep(n)
		}
	}()
	for i := 1; i <= total; i++ {
		lcSend(t, b, ch, strconv.Itoa(i))
	}
	waitFor(t, 20*time.Second, "every message kept", done)
	stop()
	wg.Wait()
	if t.Failed() {
		return
	}
	for i := 1; i <= total; i++ {
		if seen[i] != 1 {
			t.Errorf("message %d kept %d time(s), want 1", i, seen[i])
		}
	}
	st := a.Stats()
	if st.Delivered != total || st.Dropped.Expired != 0 || st.Dropped.Capacity != 0 || st.Dropped.NoMailbox != 0 {
		t.Fatalf("stats: Delivered=%d (want %d), drops %+v", st.Delivered, total, st.Dropped)
	}
	if n := lcEntries(a, ch); n != 0 {
		t.Fatalf("%d message(s) left in the mailbox", n)
	}
}
