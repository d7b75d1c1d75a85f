package layer

// Lifecycle tests against a real embedded nats-server: cancellation (S14), mailbox reclaim (S5),
// plain channel release and hand-back (S6), flush (S15), close (S16), group expiry (S18), slow
// consumer drops (S3) and the Start* forms that never wait. Reference tests are cited as "ref N" (anchor section 5a).

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/channels-nats/channels-nats/internal/faultproxy"
	"github.com/nats-io/nats.go"
)

// lcWarning starts every warning record a logSink holds.
var lcWarning = fmt.Sprintf("%d channels_nats:", LevelWarning)

// lcResult is the outcome of one ReceiveRaw.
type lcResult struct {
	body []byte
	err  error
}

// lcBody is a valid message body carrying n.
func lcBody(t testing.TB, n string) []byte {
	t.Helper()
	b, err := encodeMessage(map[string]any{"type": "lc.test", "n": n})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// lcN returns the n of a body made by lcBody.
func lcN(t testing.TB, body []byte) string {
	t.Helper()
	m, err := DecodeMessage(body)
	if err != nil {
		t.Fatalf("cannot decode %q: %v", body, err)
	}
	n, _ := m["n"].(string)
	return n
}

// lcSend sends lcBody(n) to channel.
func lcSend(t testing.TB, l *Layer, channel, n string) {
	t.Helper()
	if err := l.SendRaw(ctxT(t, 5*time.Second), channel, lcBody(t, n)); err != nil {
		t.Fatalf("send %s to %s: %v", n, channel, err)
	}
}

// lcGroupSend sends lcBody(n) to group.
func lcGroupSend(t testing.TB, l *Layer, group, n string) {
	t.Helper()
	if err := l.GroupSendRaw(ctxT(t, 5*time.Second), group, lcBody(t, n)); err != nil {
		t.Fatalf("group send %s to %s: %v", n, group, err)
	}
}

// lcRecvAsync runs ReceiveRaw in a goroutine.
func lcRecvAsync(ctx context.Context, l *Layer, channel string) <-chan lcResult {
	got := make(chan lcResult, 1)
	go func() {
		body, err := l.ReceiveRaw(ctx, channel)
		got <- lcResult{body, err}
	}()
	return got
}

// lcAwait waits for a result of lcRecvAsync.
func lcAwait(t testing.TB, got <-chan lcResult, timeout time.Duration, what string) lcResult {
	t.Helper()
	select {
	case r := <-got:
		return r
	case <-time.After(timeout):
		t.Fatalf("%s: no result within %s", what, timeout)
		return lcResult{}
	}
}

// lcRecv receives one message and returns its n.
func lcRecv(t testing.TB, l *Layer, channel string, timeout time.Duration) string {
	t.Helper()
	body, err := l.ReceiveRaw(ctxT(t, timeout), channel)
	if err != nil {
		t.Fatalf("receive on %s: %v", channel, err)
	}
	return lcN(t, body)
}

// lcExpectNothing asserts that a receive on channel gets nothing within d.
func lcExpectNothing(t testing.TB, l *Layer, channel string, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	body, err := l.ReceiveRaw(ctx, channel)
	if !errors.Is(err, context.DeadlineExceeded) {
		n := ""
		if err == nil {
			n = lcN(t, body)
		}
		t.Fatalf("receive on %s: want nothing within %s, got n=%q err=%v", channel, d, n, err)
	}
}

// lcBox reports whether l has a mailbox for name, with how many entries and waiters.
func lcBox(l *Layer, name string) (ok bool, entries, waiters int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	mb := l.mailboxes[name]
	if mb == nil {
		return false, 0, 0
	}
	return true, len(mb.entries), len(mb.waiters)
}

func lcHasBox(l *Layer, name string) bool { ok, _, _ := lcBox(l, name); return ok }

func lcEntries(l *Layer, name string) int { _, n, _ := lcBox(l, name); return n }

// lcArrived is how many messages l's connection nc has brought: framed by the layer
// (inbound.go) or, over TLS and websockets, by nats.go. It does not take the layer lock.
func lcArrived(l *Layer, nc *nats.Conn) uint64 { return l.counters.framed.Load() + nc.Stats().InMsgs }

// lcConnectionDrops is how many messages of sub the connection dropped before they reached the
// inbox: counted by the layer when it frames the socket, by nats.go when nats.go does. It does
// not take the layer lock.
func lcConnectionDrops(l *Layer, sub *nats.Subscription) (int, error) {
	d, err := sub.Dropped()
	return d + int(l.counters.slowConsumer.Load()), err
}

func lcWaiters(l *Layer, name string) int { _, _, n := lcBox(l, name); return n }

// lcSub returns the subscription l holds for k, or nil.
func lcSub(l *Layer, k subKey) *subscription {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.subs[k]
}

// lcConfirmed reports whether l holds a confirmed subscription for k.
func lcConfirmed(l *Layer, k subKey) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.subs[k]
	return s != nil && s.confirmed
}

// lcReady waits until l has a confirmed subscription for k and at least n receives waiting on
// channel, so a message sent now reaches them.
func lcReady(t testing.TB, l *Layer, k subKey, channel string, n int) {
	t.Helper()
	waitFor(t, 5*time.Second, fmt.Sprintf("%d receive(s) waiting on %s", n, channel), func() bool {
		return lcConfirmed(l, k) && lcWaiters(l, channel) >= n
	})
}

// lcSubKinds counts l's subscriptions of kind.
func lcSubKinds(l *Layer, kind subKind) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for k := range l.subs {
		if k.kind == kind {
			n++
		}
	}
	return n
}

// lcNonLocal is the part of a process channel name before "!".
func lcNonLocal(channel string) string {
	nonLocal, _, _ := strings.Cut(channel, "!")
	return nonLocal
}

// lcProblems checks that l's groups, mailboxes and subscriptions agree with each other.
func lcProblems(l *Layer) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var p []string
	memberships := map[*mailbox]int{}
	for name, g := range l.groups {
		if g.size() == 0 {
			p = append(p, "empty group "+name+" is kept")
		}
		holes := 0
		for _, mb := range g.joined {
			if mb == nil {
				holes++
			}
		}
		if holes != g.left || len(g.joined)-holes != len(g.process) {
			p = append(p, fmt.Sprintf("group %s lists %d joined with %d holes (%d counted) for %d process members", name, len(g.joined), holes, g.left, len(g.process)))
		}
		for ch, i := range g.process {
			mb := g.joined[i]
			memberships[mb]++
			if mb == nil || mb.name != ch {
				p = append(p, fmt.Sprintf("process member %s of %s is not at its place in joined", ch, name))
				continue
			}
			if l.mailboxes[ch] != mb {
				p = append(p, fmt.Sprintf("member %s of %s has no live mailbox", ch, name))
			}
			if l.subs[groupKey(name)] == nil {
				p = append(p, fmt.Sprintf("process member %s of %s has no group subscription", ch, name))
			}
			if l.subs[processKey(lcNonLocal(ch))] == nil {
				p = append(p, fmt.Sprintf("process member %s of %s has no process subscription", ch, name))
			}
		}
		for ch, mb := range g.plain {
			memberships[mb]++
			if l.mailboxes[ch] != mb {
				p = append(p, fmt.Sprintf("member %s of %s has no live mailbox", ch, name))
			}
			if l.subs[memberKey(name, ch)] == nil {
				p = append(p, fmt.Sprintf("plain member %s of %s has no member subscription", ch, name))
			}
			if l.subs[channelKey(ch)] == nil {
				p = append(p, fmt.Sprintf("plain member %s of %s has no channel subscription", ch, name))
			}
		}
	}
	for name, mb := range l.mailboxes {
		if mb.groups != memberships[mb] {
			p = append(p, fmt.Sprintf("mailbox %s counts %d group(s) but is in %d", name, mb.groups, memberships[mb]))
		}
		if mb.discharged {
			p = append(p, "discharged mailbox "+name+" is still listed")
		}
	}
	for k := range l.subs {
		switch k.kind {
		case subGroup:
			if g := l.groups[k.name]; g == nil || len(g.process) == 0 {
				p = append(p, "group subscription "+k.name+" without process members")
			}
		case subGroupChannel:
			if g := l.groups[k.name]; g == nil || g.plain[k.channel] == nil {
				p = append(p, fmt.Sprintf("member subscription (%s, %s) without that member", k.name, k.channel))
			}
		}
	}
	return p
}

func lcCheckConsistent(t testing.TB, l *Layer) {
	t.Helper()
	for _, p := range lcProblems(l) {
		t.Error("inconsistent state: " + p)
	}
}

// lcSubscribePlain makes l subscribe to plain channel (confirmed) without keeping a reader:
// a receive that starts waiting, then is cancelled (the linger release is scheduled).
func lcSubscribePlain(t testing.TB, l *Layer, channel string) {
	t.Helper()
	_, p, err := l.StartReceive(channel, func(Message, error) {})
	if err != nil || p == nil {
		t.Fatalf("subscribing %s: pending=%v err=%v", channel, p, err)
	}
	msgAwaitListed(t, l, channel, p) // the subscription is confirmed
	if !p.Cancel() {
		t.Fatalf("cancel of the subscribing receive on %s returned false", channel)
	}
}

// lcCollector reads channel in a loop and counts what arrives, until ctx ends.
type lcCollector struct {
	mu   sync.Mutex
	seen map[string]int
	done chan struct{}
}

func lcCollect(ctx context.Context, l *Layer, channel string) *lcCollector {
	c := &lcCollector{seen: map[string]int{}, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for {
			body, err := l.ReceiveRaw(ctx, channel)
			if err != nil {
				return
			}
			m, _ := DecodeMessage(body)
			n, _ := m["n"].(string)
			c.mu.Lock()
			c.seen[n]++
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *lcCollector) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.seen {
		n += v
	}
	return n
}

func (c *lcCollector) count(n string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seen[n]
}

// lcStartProxy starts a fault proxy to target for the test. px.Stop(faultproxy.Down) holds back
// what the server sends, so a subscription confirmation (PING/PONG) can be kept waiting on
// purpose; px.Pass() lets it through.
func lcStartProxy(t testing.TB, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// lcSubscribing reports whether an operation on name waits for its subscription's confirmation.
func lcSubscribing(l *Layer, name string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	mb := l.mailboxes[name]
	return mb != nil && mb.subscribing > 0
}

// ---------------------------------------------------------------------------------------------
// S14: cancellation

func TestLifecycleReceiveCancelIsPrompt(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	ch, err := a.NewChannel(ctxT(t, 5*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	lcSubscribePlain(t, a, "prompt-plain")

	for _, channel := range []string{ch, "prompt-plain"} {
		// Cancelled while waiting.
		ctx, cancel := context.WithCancel(context.Background())
		got := lcRecvAsync(ctx, a, channel)
		waitFor(t, 5*time.Second, "receive waiting on "+channel, func() bool { return lcWaiters(a, channel) == 1 })
		cancelled := time.Now()
		cancel()
		r := lcAwait(t, got, 2*time.Second, "cancelled receive")
		if el := time.Since(cancelled); el > 250*time.Millisecond {
			t.Errorf("%s: cancelled receive returned after %s", channel, el)
		}
		if !errors.Is(r.err, context.Canceled) || r.body != nil {
			t.Errorf("%s: cancelled receive returned body=%q err=%v, want context.Canceled", channel, r.body, r.err)
		}
		if n := lcWaiters(a, channel); n != 0 {
			t.Errorf("%s: %d waiter(s) left after the cancel", channel, n)
		}

		// A deadline.
		start := time.Now()
		ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
		_, err := a.ReceiveRaw(ctx, channel)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: receive with a deadline: %v", channel, err)
		}
		if el := time.Since(start); el > 300*time.Millisecond {
			t.Errorf("%s: receive with a 50ms deadline returned after %s", channel, el)
		}
	}
}

// TestLifecycleCancelStorm: receives with tiny random timeouts race a stream of sends; every
// message is received exactly once (S14, S5 ref 20, S6 linger across polls), and no goroutine
// is left after the layers are closed.
func TestLifecycleCancelStorm(t *testing.T) {
	for _, plain := range []bool{false, true} {
		name := "process"
		if plain {
			name = "plain"
		}
		t.Run(name, func(t *testing.T) { lcCancelStorm(t, plain) })
	}
}

func lcCancelStorm(t *testing.T, plain bool) {
	s := startServer(t)
	time.Sleep(20 * time.Millisecond) // let the server's start-up goroutines settle
	base := runtime.NumGoroutine()

	cfg := testConfig(nil, s.url())
	cfg.Capacity = 100000
	cfg.ReleaseLinger = time.Minute // polling must keep the plain subscription for the whole storm
	recv := connect(t, cfg)
	send := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 60*time.Second)

	var ch string
	if plain {
		ch = "storm-plain"
		lcSubscribePlain(t, recv, ch)
	} else {
		var err error
		if ch, err = recv.NewChannel(ctx, ""); err != nil {
			t.Fatal(err)
		}
	}

	// The sender is slower than the receiver, so most receives wait and many end right around
	// an arrival: a message handed over at the cancel must go back to the front, not get lost.
	const n, minIterations = 1500, 2000
	var sending atomic.Bool
	sending.Store(true)
	sendErr := make(chan error, 1)
	go func() {
		defer sending.Store(false)
		for i := range n {
			if err := send.SendRaw(ctx, ch, lcBody(t, strconv.Itoa(i))); err != nil {
				sendErr <- err
				return
			}
			time.Sleep(time.Duration(20+rand.IntN(300)) * time.Microsecond)
		}
		sendErr <- nil
	}()

	counts := make([]int, n)
	received, iterations, cancelled, cancelledWhileSending := 0, 0, 0, 0
	deadline, progress := time.Now().Add(30*time.Second), time.Now()
	for (received < n || iterations < minIterations) && time.Now().Before(deadline) {
		if received < n && !sending.Load() && time.Since(progress) > time.Second {
			break // the rest is lost
		}
		iterations++
		var rctx context.Context
		var cancel context.CancelFunc
		switch rand.IntN(3) {
		case 0:
			rctx, cancel = context.WithTimeout(ctx, time.Duration(rand.IntN(200))*time.Microsecond)
		case 1:
			rctx, cancel = context.WithCancel(ctx)
			time.AfterFunc(time.Duration(rand.IntN(300))*time.Microsecond, cancel)
		default:
			rctx, cancel = context.WithTimeout(ctx, time.Duration(rand.IntN(1000))*time.Microsecond)
		}
		body, err := recv.ReceiveRaw(rctx, ch)
		cancel()
		if err != nil {
			if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("iteration %d: %v", iterations, err)
			}
			cancelled++
			if sending.Load() {
				cancelledWhileSending++
			}
			continue
		}
		i, convErr := strconv.Atoi(lcN(t, body))
		if convErr != nil || i < 0 || i >= n {
			t.Fatalf("unexpected message %q", body)
		}
		counts[i]++
		received++
		progress = time.Now()
	}
	if err := <-sendErr; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d iterations, %d cancelled (%d while sending), %d received", iterations, cancelled, cancelledWhileSending, received)
	if cancelledWhileSending < n/2 {
		t.Errorf("only %d receives were cancelled while messages arrived; the storm did not exercise cancellation", cancelledWhileSending)
	}
	var lost, dup []int
	for i, c := range counts {
		switch {
		case c == 0:
			lost = append(lost, i)
		case c > 1:
			dup = append(dup, i)
		}
	}
	if len(lost) > 0 || len(dup) > 0 {
		t.Fatalf("lost %d message(s) %v, duplicated %d %v", len(lost), lcHead(lost), len(dup), lcHead(dup))
	}
	lcExpectNothing(t, recv, ch, 300*time.Millisecond) // no late duplicate

	st := recv.Stats()
	if st.Delivered != n {
		t.Errorf("Stats().Delivered = %d, want %d (put-backs must not count twice)", st.Delivered, n)
	}
	if st.Dropped.Capacity+st.Dropped.Expired+st.Dropped.SlowConsumer+st.Dropped.NoMailbox+st.Dropped.BadFrame != 0 || st.HandedBack != 0 {
		t.Errorf("unexpected drops or hand-backs: %+v", st)
	}
	if plain && lcSub(recv, channelKey(ch)) == nil {
		t.Error("the plain channel subscription was released during the storm")
	}

	_ = recv.Close()
	_ = send.Close()
	waitFor(t, 10*time.Second, fmt.Sprintf("goroutines back to the baseline %d", base), func() bool {
		return runtime.NumGoroutine() <= base+2
	})
}

func lcHead(xs []int) []int { return xs[:min(len(xs), 10)] }

// TestLifecycleReceiveCancelledAfterHandOver (S14): a message handed to a receive whose context
// ended before it took it goes back to the front of the mailbox, ahead of later arrivals.
func TestLifecycleReceiveCancelledAfterHandOver(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	ch, err := a.NewChannel(ctxT(t, 5*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := lcRecvAsync(ctx, a, ch)
	waitFor(t, 5*time.Second, "the reader", func() bool { return lcWaiters(a, ch) == 1 })

	// Route two arrivals as the dispatcher does, but take the hand-over of the first out of the
	// dispatcher's queue and hold it back until the receive's context has ended.
	a.mu.Lock()
	mb := a.mailboxes[ch]
	now := time.Now()
	a.enqueue(mb, lcBody(t, "1"), now)
	a.enqueue(mb, lcBody(t, "2"), now)
	held := a.handoffs.queued
	a.handoffs.queued = nil
	a.mu.Unlock()
	if len(held) != 1 {
		t.Fatalf("%d hand-overs, want 1", len(held))
	}
	// The receive's context ends while its hand-over is held: the receive is withdrawn at once
	// (its Op was still pending), and the hand-over, delivered later, finds it cancelled.
	cancelled := time.Now()
	cancel()
	res := lcAwait(t, r, 2*time.Second, "cancelled receive")
	if !errors.Is(res.err, context.Canceled) || res.body != nil {
		t.Fatalf("cancelled receive returned %q, %v; want context.Canceled", res.body, res.err)
	}
	if d := time.Since(cancelled); d > 250*time.Millisecond {
		t.Errorf("the cancelled receive returned after %s", d)
	}
	if !held[0].w.op.cancelled() {
		t.Fatal("the receive returned context.Canceled but its Op was not cancelled")
	}
	a.mu.Lock()
	a.handoffs.queued = append(held, a.handoffs.queued...)
	a.mu.Unlock()
	a.kick <- struct{}{} // the dispatcher delivers the held hand-over: it goes back to the front
	waitFor(t, 5*time.Second, "the held message back in the mailbox", func() bool { return lcEntries(a, ch) == 2 })
	if n := lcEntries(a, ch); n != 2 {
		t.Fatalf("the mailbox holds %d, want 2", n)
	}
	if got := lcRecv(t, a, ch, 5*time.Second); got != "1" {
		t.Fatalf("first receive after the cancel got %q, want 1", got)
	}
	if got := lcRecv(t, a, ch, 5*time.Second); got != "2" {
		t.Fatalf("then got %q, want 2", got)
	}
	if d := a.Stats().Delivered; d != 2 {
		t.Errorf("Stats().Delivered = %d, want 2", d)
	}
}

// TestLifecyclePendingReceiveCancel: Cancel before delivery returns true and the callback never
// runs; after a hand-over Cancel returns false and Retract gives the message back to the front (S14).
func TestLifecyclePendingReceiveCancel(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}

	var called atomic.Bool
	m, p, err := a.StartReceive(ch, func(Message, error) { called.Store(true) })
	if err != nil || p == nil || m.Body != nil {
		t.Fatalf("StartReceive on an empty mailbox: msg=%q pending=%v err=%v", m.Body, p, err)
	}
	if !p.Cancel() {
		t.Fatal("Cancel before any message returned false")
	}
	lcSend(t, b, ch, "one")
	waitFor(t, 5*time.Second, "the message in the mailbox", func() bool { return lcEntries(a, ch) == 1 })
	time.Sleep(50 * time.Millisecond)
	if called.Load() {
		t.Fatal("the callback of a cancelled receive ran")
	}
	if got := lcRecv(t, a, ch, 5*time.Second); got != "one" {
		t.Fatalf("got %q, want one", got)
	}

	handed := make(chan Message, 1)
	_, p, err = a.StartReceive(ch, func(m Message, err error) {
		if err != nil {
			t.Errorf("callback error: %v", err)
		}
		handed <- m
	})
	if err != nil || p == nil {
		t.Fatalf("pending=%v err=%v", p, err)
	}
	lcSend(t, b, ch, "first")
	var first Message
	select {
	case first = <-handed:
	case <-time.After(5 * time.Second):
		t.Fatal("the callback did not run")
	}
	if n := lcN(t, first.Body); n != "first" {
		t.Fatalf("the callback got %q, want first", n)
	}
	if p.Cancel() {
		t.Fatal("Cancel after the message was handed over returned true")
	}
	lcSend(t, b, ch, "second")
	waitFor(t, 5*time.Second, "the second message in the mailbox", func() bool { return lcEntries(a, ch) == 1 })
	p.Retract() // the host's consumer was cancelled after the callback ran
	p.Retract() // only the first call acts
	if n := lcEntries(a, ch); n != 2 {
		t.Fatalf("after Retract the mailbox holds %d, want 2", n)
	}
	if got := lcRecv(t, a, ch, 5*time.Second); got != "first" {
		t.Fatalf("after Retract the next receive got %q, want first", got)
	}
	if got := lcRecv(t, a, ch, 5*time.Second); got != "second" {
		t.Fatalf("then got %q, want second", got)
	}
	if d := a.Stats().Delivered; d != 3 {
		t.Errorf("Stats().Delivered = %d, want 3", d)
	}
}

// TestLifecyclePutBackHandsToWaitingReceive: a retracted message goes to a receive that is waiting.
func TestLifecyclePutBackHandsToWaitingReceive(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	got1 := make(chan Message, 1)
	_, p1, err := a.StartReceive(ch, func(m Message, _ error) { got1 <- m })
	if err != nil || p1 == nil {
		t.Fatalf("pending=%v err=%v", p1, err)
	}
	lcSend(t, b, ch, "x")
	var m Message
	select {
	case m = <-got1:
	case <-time.After(5 * time.Second):
		t.Fatal("first receive got nothing")
	}

	got2 := make(chan Message, 1)
	_, p2, err := a.StartReceive(ch, func(m Message, err error) {
		if err != nil {
			t.Errorf("callback error: %v", err)
		}
		got2 <- m
	})
	if err != nil || p2 == nil {
		t.Fatalf("second receive: pending=%v err=%v", p2, err)
	}
	if n := lcN(t, m.Body); n != "x" {
		t.Fatalf("the first receive got %q, want x", n)
	}
	p1.Retract() // the host could not take it: it goes to the waiting receive
	select {
	case m2 := <-got2:
		if n := lcN(t, m2.Body); n != "x" {
			t.Fatalf("the waiting receive got %q, want x", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the put-back message did not reach the waiting receive")
	}
	if p2.Cancel() {
		t.Error("Cancel after the put-back hand-over returned true")
	}
	if n := lcEntries(a, ch); n != 0 {
		t.Errorf("the mailbox holds %d, want 0", n)
	}
	if d := a.Stats().Delivered; d != 1 {
		t.Errorf("Stats().Delivered = %d, want 1", d)
	}
}

// TestLifecyclePutBackAfterPlainRelease: a message retracted after its plain channel was released
// is re-published, so another reader of the channel gets it (S6, S14).
func TestLifecyclePutBackAfterPlainRelease(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.ReleaseLinger = 100 * time.Millisecond
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	sender := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	const ch = "putback-plain"

	got := make(chan Message, 1)
	_, p, err := a.StartReceive(ch, func(m Message, _ error) { got <- m })
	if err != nil || p == nil {
		t.Fatalf("pending=%v err=%v", p, err)
	}
	msgAwaitListed(t, a, ch, p)
	lcSend(t, sender, ch, "kept")
	var m Message
	select {
	case m = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("A got nothing")
	}
	lcSubscribePlain(t, a, ch) // a cancelled reader: the release follows after the linger
	waitFor(t, 5*time.Second, "A's release of "+ch, func() bool { return lcSub(a, channelKey(ch)) == nil && !lcHasBox(a, ch) })

	bGot := lcRecvAsync(ctx, b, ch)
	lcReady(t, b, channelKey(ch), ch, 1)
	if n := lcN(t, m.Body); n != "kept" {
		t.Fatalf("A got %q, want kept", n)
	}
	p.Retract() // its plain channel was released meanwhile: it is re-published
	r := lcAwait(t, bGot, 5*time.Second, "B's receive")
	if r.err != nil || lcN(t, r.body) != "kept" {
		t.Fatalf("B got %q, %v; want kept", r.body, r.err)
	}
	if hb := a.Stats().HandedBack; hb != 1 {
		t.Errorf("A's HandedBack = %d, want 1", hb)
	}
}

// TestLifecycleCancelledSend: a send with an ended context returns the context's error promptly,
// also while it waits for room in the outbound buffer during an outage (ref 58 intent, S14), and
// a send withdrawn that way is never sent.
func TestLifecycleCancelledSend(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Connection.MaxReconnects = NoReconnect
	cfg.Connection.ConnectTimeout = 3 * time.Second
	cfg.Connection.PendingSize = 1 // one publish fills the buffer: the next one waits for room
	a := connect(t, cfg)
	ch, err := a.NewChannel(ctxT(t, 5*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := a.Send(ctx, ch, map[string]any{"type": "x"}); !errors.Is(err, context.Canceled) {
		t.Errorf("Send with a cancelled context: %v", err)
	}
	if err := a.GroupSend(ctx, "room", map[string]any{"type": "x"}); !errors.Is(err, context.Canceled) {
		t.Errorf("GroupSend with a cancelled context: %v", err)
	}
	if p := a.Stats().Published; p != 0 {
		t.Errorf("Published = %d after cancelled sends, want 0", p)
	}

	// The connection goes for good, and the server's port now accepts but never answers: the
	// reconnect hangs for ConnectTimeout and nothing is written. One send fills the buffer; a
	// send waiting for room must still end with its context.
	s.stop()
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", s.opts.Port))
	if err != nil {
		t.Fatalf("cannot listen on the server's port again: %v", err)
	}
	var conns []net.Conn
	var connsMu sync.Mutex
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			connsMu.Lock()
			conns = append(conns, c)
			connsMu.Unlock()
		}
	}()
	silent := func() {
		ln.Close()
		connsMu.Lock()
		for _, c := range conns {
			c.Close()
		}
		connsMu.Unlock()
	}
	t.Cleanup(silent)
	waitFor(t, 5*time.Second, "the connection closed for good", func() bool {
		return a.link.conn().IsClosed()
	})
	if err := a.Send(ctxT(t, time.Second), ch, map[string]any{"type": "accepted"}); err != nil {
		t.Fatalf("the first send during the outage must be accepted: %v", err)
	}
	for _, send := range []func(context.Context) error{
		func(ctx context.Context) error { return a.Send(ctx, ch, map[string]any{"type": "cancelled"}) },
		func(ctx context.Context) error { return a.GroupSend(ctx, "room", map[string]any{"type": "cancelled"}) },
	} {
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(100*time.Millisecond, cancel)
		start := time.Now()
		err := send(ctx)
		el := time.Since(start)
		cancel()
		if !errors.Is(err, context.Canceled) {
			t.Errorf("send cancelled while waiting for room: %v", err)
		}
		if el < 90*time.Millisecond {
			t.Errorf("send returned after %s, before its cancel; it should have waited for room", el)
		}
		if el > time.Second {
			t.Errorf("send cancelled after 100ms returned after %s", el)
		}
	}
	if st := a.Stats(); st.Published != 1 || st.Outbound.Waiting != 0 {
		t.Errorf("after the cancelled sends: Published %d, Outbound.Waiting %d; want 1, 0", st.Published, st.Outbound.Waiting)
	}

	// The server comes back: the accepted send arrives, the cancelled ones never do.
	silent()
	s.start()
	waitFor(t, 15*time.Second, "the recovery", func() bool { return a.Stats().Recoveries >= 1 })
	m, err := a.Receive(ctxT(t, 5*time.Second), ch)
	if err != nil || m["type"] != "accepted" {
		t.Fatalf("after the recovery got %v, %v; want the accepted send", m, err)
	}
	if m, err := a.Receive(ctxT(t, msgQuiet), ch); err == nil {
		t.Fatalf("a cancelled send arrived: %v", m)
	}
}

// ---------------------------------------------------------------------------------------------
// S5: process channel mailbox lifetime

func lcGraceConfig(url string) Config {
	cfg := testConfig(nil, url)
	cfg.MailboxGrace = 100 * time.Millisecond
	return cfg
}

// TestLifecycleIdleMailboxIsReclaimed: mailboxes with no receiver, traffic or group go after the
// grace: never used (ref 19), after a cancelled receive (ref 7), after a normal receive (ref 21).
func TestLifecycleIdleMailboxIsReclaimed(t *testing.T) {
	s := startServer(t)
	a := connect(t, lcGraceConfig(s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)

	unused, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	cancelledRead, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	completedRead, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if m := a.Stats().Mailboxes; m == 0 {
		t.Fatal("Mailboxes = 0 right after NewChannel")
	}
	lcExpectNothing(t, a, cancelledRead, 30*time.Millisecond)
	// The receive waits before the send: a send slower than the grace finds its mailbox there.
	done := lcRecvAsync(ctx, a, completedRead)
	waitFor(t, 5*time.Second, "the receive to wait", func() bool { return lcWaiters(a, completedRead) == 1 })
	lcSend(t, b, completedRead, "done")
	if r := lcAwait(t, done, 5*time.Second, "the completed read"); r.err != nil || lcN(t, r.body) != "done" {
		t.Fatalf("got %q, %v", r.body, r.err)
	}
	for _, ch := range []string{unused, cancelledRead, completedRead} {
		waitFor(t, 5*time.Second, "reclaim of "+ch, func() bool { return !lcHasBox(a, ch) })
	}
	if m := a.Stats().Mailboxes; m != 0 {
		t.Errorf("Mailboxes = %d after the reclaim, want 0", m)
	}
	// The process subscription stays: a new channel works at once.
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	lcSend(t, b, ch, "again")
	if got := lcRecv(t, a, ch, 5*time.Second); got != "again" {
		t.Fatalf("got %q", got)
	}
}

// TestLifecycleBacklogOutlivesTheGrace: a process mailbox that still holds messages is not
// reclaimed with them. Its reader may drain it at any pace, with receives that never wait, or
// come back after the grace; the mailbox goes once it is empty, or once what it holds expired
// (counted). A plain channel read that way keeps its subscription and its backlog too.
func TestLifecycleBacklogOutlivesTheGrace(t *testing.T) {
	s := startServer(t)
	cfg := lcGraceConfig(s.url())
	cfg.Expiry = 4 * time.Second // past the 1.15 s of sleeps below, on a busy machine too
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	drained, left := msgNewChannel(t, a), msgNewChannel(t, a)
	const plain = "backlog-plain"
	first := lcRecvAsync(ctx, a, plain) // subscribes
	waitFor(t, 5*time.Second, "the plain channel's receive waiting", func() bool { return lcWaiters(a, plain) == 1 })
	const backlog = 6
	for i := range backlog {
		lcSend(t, b, plain, strconv.Itoa(i))
		lcSend(t, b, drained, strconv.Itoa(i))
		lcSend(t, b, left, strconv.Itoa(i))
	}
	if r := lcAwait(t, first, 5*time.Second, "the plain channel's first receive"); r.err != nil || lcN(t, r.body) != "0" {
		t.Fatalf("the plain channel's first receive: %q, %v", r.body, r.err)
	}
	waitFor(t, 5*time.Second, "the backlogs", func() bool {
		return lcEntries(a, plain) == backlog-1 && lcEntries(a, drained) == backlog && lcEntries(a, left) == backlog
	})

	// The plain channel: receives within the grace of each other, longer than it in all.
	for i := 1; i < backlog; i++ {
		if ok, n, _ := lcBox(a, plain); !ok || n != backlog-i {
			t.Fatalf("the plain channel's mailbox: %v with %d message(s) before receive %d, want %d", ok, n, i, backlog-i)
		}
		if got := lcRecv(t, a, plain, 5*time.Second); got != strconv.Itoa(i) {
			t.Fatalf("message %d of the plain channel's backlog is %q", i, got)
		}
		time.Sleep(cfg.MailboxGrace / 2)
	}
	// The process channel: slower than the grace.
	for i := range backlog {
		time.Sleep(3 * cfg.MailboxGrace / 2)
		if got := lcRecv(t, a, drained, 5*time.Second); got != strconv.Itoa(i) {
			t.Fatalf("message %d of the drained backlog is %q", i, got)
		}
	}
	waitFor(t, 5*time.Second, "the reclaim of the drained mailbox", func() bool { return !lcHasBox(a, drained) })
	if n := lcEntries(a, left); n != backlog {
		t.Fatalf("the mailbox nobody read holds %d message(s), want %d", n, backlog)
	}
	waitFor(t, 2*cfg.Expiry, "the reclaim of the unread mailbox once its messages expired", func() bool { return !lcHasBox(a, left) })
	if got := a.Stats().Dropped.Expired; got != backlog {
		t.Errorf("Dropped.Expired = %d, want %d", got, backlog)
	}
}

// TestLifecycleDisconnectCyclesLeaveNothing (ref 19): new_channel, group_add, a read that is
// cancelled, group_discard, five times: no groups and no group subscriptions are left, and the
// mailboxes go after the grace.
func TestLifecycleDisconnectCyclesLeaveNothing(t *testing.T) {
	s := startServer(t)
	a := connect(t, lcGraceConfig(s.url()))
	ctx := ctxT(t, 10*time.Second)
	var chans []string
	for range 5 {
		ch, err := a.NewChannel(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
		if err := a.GroupAdd(ctx, "cycle", ch); err != nil {
			t.Fatal(err)
		}
		lcExpectNothing(t, a, ch, 20*time.Millisecond)
		if err := a.GroupDiscard("cycle", ch); err != nil {
			t.Fatal(err)
		}
	}
	if st := a.Stats(); st.Groups != 0 {
		t.Errorf("Groups = %d, want 0", st.Groups)
	}
	if n := lcSubKinds(a, subGroup); n != 0 {
		t.Errorf("%d group subscription(s) left", n)
	}
	waitFor(t, 5*time.Second, "every mailbox reclaimed", func() bool { return a.Stats().Mailboxes == 0 })
	lcCheckConsistent(t, a)
}

// TestLifecycleMailboxKeptAlive: a group member is kept past the grace and a timed-out read of
// it is not a disconnect (ref 22); a mailbox with steady traffic is kept until the traffic stops.
func TestLifecycleMailboxKeptAlive(t *testing.T) {
	s := startServer(t)
	a := connect(t, lcGraceConfig(s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 20*time.Second)

	member, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.GroupAdd(ctx, "kept", member); err != nil {
		t.Fatal(err)
	}
	busy, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	lcExpectNothing(t, a, member, 50*time.Millisecond) // a timed-out read

	start := time.Now()
	sent := 0
	for ; time.Since(start) < 500*time.Millisecond; sent++ {
		lcSend(t, b, busy, strconv.Itoa(sent))
		time.Sleep(25 * time.Millisecond)
		if !lcHasBox(a, busy) {
			t.Fatalf("the mailbox with traffic was reclaimed after %s", time.Since(start))
		}
		if !lcHasBox(a, member) {
			t.Fatalf("the group member's mailbox was reclaimed after %s", time.Since(start))
		}
	}
	lcGroupSend(t, b, "kept", "group")
	if got := lcRecv(t, a, member, 5*time.Second); got != "group" {
		t.Fatalf("the member got %q, want group", got)
	}
	for i := range sent {
		if got := lcRecv(t, a, busy, 5*time.Second); got != strconv.Itoa(i) {
			t.Fatalf("message %d of the busy mailbox is %q", i, got)
		}
	}
	// Without traffic, the busy mailbox goes once read; the member stays.
	waitFor(t, 5*time.Second, "reclaim of the mailbox whose traffic stopped", func() bool { return !lcHasBox(a, busy) })
	if !lcHasBox(a, member) {
		t.Error("the group member's mailbox was reclaimed")
	}
}

// TestLifecyclePollingKeepsWhatArrivesBetweenPolls (ref 20): a message that arrives while nobody
// reads a process channel is returned by the next poll, round after round.
func TestLifecyclePollingKeepsWhatArrivesBetweenPolls(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.MailboxGrace = time.Second // longer than a send may take on a busy machine, between two polls
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ch, err := a.NewChannel(ctxT(t, 5*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		lcExpectNothing(t, a, ch, 30*time.Millisecond)
		n := strconv.Itoa(i)
		lcSend(t, b, ch, n)
		waitFor(t, 5*time.Second, "the message in the mailbox", func() bool { return lcEntries(a, ch) == 1 })
		if got := lcRecv(t, a, ch, 5*time.Second); got != n {
			t.Fatalf("round %d: got %q", i, got)
		}
	}
}

// TestLifecycleSecondReceiverKeepsMailbox (ref 25): with two readers of a process channel, one
// cancelled, the other still gets the next message, also after the grace.
func TestLifecycleSecondReceiverKeepsMailbox(t *testing.T) {
	s := startServer(t)
	a := connect(t, lcGraceConfig(s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	c1, cancel1 := context.WithCancel(ctx)
	r1 := lcRecvAsync(c1, a, ch)
	waitFor(t, 5*time.Second, "the first reader", func() bool { return lcWaiters(a, ch) == 1 })
	r2 := lcRecvAsync(ctx, a, ch)
	waitFor(t, 5*time.Second, "both readers", func() bool { return lcWaiters(a, ch) == 2 })
	cancel1()
	if r := lcAwait(t, r1, 2*time.Second, "cancelled reader"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("cancelled reader: %v", r.err)
	}
	time.Sleep(300 * time.Millisecond) // three times the grace
	if ok, _, w := lcBox(a, ch); !ok || w != 1 {
		t.Fatalf("mailbox present=%v waiters=%d, want present with 1", ok, w)
	}
	lcSend(t, b, ch, "next")
	r := lcAwait(t, r2, 5*time.Second, "second reader")
	if r.err != nil || lcN(t, r.body) != "next" {
		t.Fatalf("second reader got %q, %v", r.body, r.err)
	}
}

// ---------------------------------------------------------------------------------------------
// S6: plain channel release

func lcLingerConfig(url string, linger time.Duration) Config {
	cfg := testConfig(nil, url)
	cfg.ReleaseLinger = linger
	return cfg
}

// TestLifecyclePlainReleaseAfterCancel (ref 24, 45, 60): cancelling the only reader releases the
// plain channel after the linger, so the queue group is no longer split: another reader gets all.
func TestLifecyclePlainReleaseAfterCancel(t *testing.T) {
	s := startServer(t)
	a := connect(t, lcLingerConfig(s.url(), 100*time.Millisecond))
	c := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	const ch = "release-plain"

	rctx, cancel := context.WithCancel(ctx)
	r := lcRecvAsync(rctx, a, ch)
	lcReady(t, a, channelKey(ch), ch, 1)
	cancelled := time.Now()
	cancel()
	if res := lcAwait(t, r, time.Second, "cancelled reader"); !errors.Is(res.err, context.Canceled) {
		t.Fatalf("cancelled reader: %v", res.err)
	}
	if lcSub(a, channelKey(ch)) == nil && time.Since(cancelled) < 50*time.Millisecond {
		t.Error("the subscription went at once; it should linger")
	}
	waitFor(t, 5*time.Second, "release of the plain subscription", func() bool {
		return lcSub(a, channelKey(ch)) == nil && !lcHasBox(a, ch)
	})
	// The link unsubscribes in order with everything queued before.
	waitFor(t, 5*time.Second, "A's NATS subscriptions to go", func() bool { return a.link.conn().NumSubscriptions() == 0 })

	col := lcCollect(ctx, c, ch)
	lcReady(t, c, channelKey(ch), ch, 1)
	const n = 10
	for i := range n {
		lcSend(t, b, ch, strconv.Itoa(i))
	}
	waitFor(t, 5*time.Second, "every message at the remaining reader", func() bool { return col.total() == n })
	for i := range n {
		if got := col.count(strconv.Itoa(i)); got != 1 {
			t.Errorf("message %d arrived %d time(s)", i, got)
		}
	}
	if st := a.Stats(); st.HandedBack != 0 || st.Delivered != 0 {
		t.Errorf("A: HandedBack=%d Delivered=%d, want 0, 0", st.HandedBack, st.Delivered)
	}
}

// TestLifecyclePlainBackToBackPolls (S6 linger): polls of a plain channel within the linger keep
// the subscription, and a message sent between polls is returned by the next one.
func TestLifecyclePlainBackToBackPolls(t *testing.T) {
	s := startServer(t)
	a := connect(t, lcLingerConfig(s.url(), time.Second))
	b := connect(t, testConfig(nil, s.url()))
	const ch = "poll-plain"

	lcExpectNothing(t, a, ch, 30*time.Millisecond) // subscribes, then times out
	sub := lcSub(a, channelKey(ch))
	if sub == nil || !sub.confirmed {
		t.Fatalf("no confirmed subscription after the first poll: %+v", sub)
	}
	for i := range 5 {
		n := strconv.Itoa(i)
		lcSend(t, b, ch, n)
		waitFor(t, 5*time.Second, "the message in the mailbox", func() bool { return lcEntries(a, ch) == 1 })
		if got := lcRecv(t, a, ch, 5*time.Second); got != n {
			t.Fatalf("round %d: got %q", i, got)
		}
		lcExpectNothing(t, a, ch, 30*time.Millisecond)
		if cur := lcSub(a, channelKey(ch)); cur != sub {
			t.Fatalf("round %d: the subscription was released and made again", i)
		}
	}
}

// TestLifecyclePlainReleaseHandsBack (S6): what a released plain mailbox still holds is
// re-published, and another reader of the channel gets it.
func TestLifecyclePlainReleaseHandsBack(t *testing.T) {
	s := startServer(t)
	a := connect(t, lcLingerConfig(s.url(), time.Second))
	b := connect(t, testConfig(nil, s.url()))
	sender := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	const ch = "handback-plain"
	const n = 5

	lcSubscribePlain(t, a, ch) // A is subscribed, nobody reads, the release is due after 1s
	for i := range n {
		lcSend(t, sender, ch, strconv.Itoa(i))
	}
	waitFor(t, 5*time.Second, "the messages in A's mailbox", func() bool { return lcEntries(a, ch) == n })
	col := lcCollect(ctx, b, ch)
	lcReady(t, b, channelKey(ch), ch, 1)
	if lcSub(a, channelKey(ch)) == nil {
		t.Fatal("A released before B was ready; the linger is too short for this machine")
	}

	waitFor(t, 5*time.Second, "A's release", func() bool { return !lcHasBox(a, ch) && lcSub(a, channelKey(ch)) == nil })
	waitFor(t, 5*time.Second, "the handed-back messages at B", func() bool { return col.total() == n })
	for i := range n {
		if got := col.count(strconv.Itoa(i)); got != 1 {
			t.Errorf("message %d reached B %d time(s)", i, got)
		}
	}
	if hb := a.Stats().HandedBack; hb != n {
		t.Errorf("A's HandedBack = %d, want %d", hb, n)
	}
	time.Sleep(100 * time.Millisecond)
	if got := col.total(); got != n {
		t.Errorf("B got %d messages, want %d", got, n)
	}
}

// TestLifecyclePlainInGroupIsNotReleased (S6): a plain channel in a group keeps its subscription
// when its reader is cancelled.
func TestLifecyclePlainInGroupIsNotReleased(t *testing.T) {
	s := startServer(t)
	a := connect(t, lcLingerConfig(s.url(), 100*time.Millisecond))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	const ch = "grouped-plain"
	if err := a.GroupAdd(ctx, "g", ch); err != nil {
		t.Fatal(err)
	}
	lcExpectNothing(t, a, ch, 30*time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	if lcSub(a, channelKey(ch)) == nil || lcSub(a, memberKey("g", ch)) == nil || !lcHasBox(a, ch) {
		t.Fatal("a plain channel in a group was released after its reader was cancelled")
	}
	lcGroupSend(t, b, "g", "1")
	lcSend(t, b, ch, "2")
	if got := lcRecv(t, a, ch, 5*time.Second); got != "1" {
		t.Fatalf("got %q, want 1", got)
	}
	if got := lcRecv(t, a, ch, 5*time.Second); got != "2" {
		t.Fatalf("got %q, want 2", got)
	}
}

// ---------------------------------------------------------------------------------------------
// S15: flush

// TestLifecycleFlushClearsState (ref 18).
func TestLifecycleFlushClearsState(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, member := range []string{ch, "flush-plain"} {
		if err := a.GroupAdd(ctx, "room", member); err != nil {
			t.Fatal(err)
		}
	}
	lcSend(t, b, ch, "stale")
	waitFor(t, 5*time.Second, "the message in the mailbox", func() bool { return lcEntries(a, ch) == 1 })
	if st := a.Stats(); st.Mailboxes != 2 || st.Groups != 1 || st.Subscriptions != 4 {
		t.Fatalf("before Flush: %+v", st)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.Mailboxes != 0 || st.Groups != 0 || st.Subscriptions != 0 {
		t.Errorf("after Flush: Mailboxes=%d Groups=%d Subscriptions=%d, want 0", st.Mailboxes, st.Groups, st.Subscriptions)
	}
	if lcSubKinds(a, subGroup)+lcSubKinds(a, subGroupChannel) != 0 {
		t.Error("group subscriptions left after Flush")
	}
	// The link unsubscribes in order with everything queued before.
	waitFor(t, 5*time.Second, "no NATS subscription left after Flush", func() bool { return a.link.conn().NumSubscriptions() == 0 })
	// The layer still works: a new channel and group.
	ch2, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.GroupAdd(ctx, "room", ch2); err != nil {
		t.Fatal(err)
	}
	lcGroupSend(t, b, "room", "fresh")
	if got := lcRecv(t, a, ch2, 5*time.Second); got != "fresh" {
		t.Fatalf("got %q", got)
	}
	lcCheckConsistent(t, a)
}

// TestLifecycleFlushKeepsWaitingReceives (ref 47, 48): receives waiting during Flush still get
// messages sent afterwards, on process and shared plain channels.
func TestLifecycleFlushKeepsWaitingReceives(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	const plain = "flush-shared"
	rp := lcRecvAsync(ctx, a, ch)
	r1 := lcRecvAsync(ctx, a, plain)
	r2 := lcRecvAsync(ctx, a, plain)
	waitFor(t, 5*time.Second, "the process reader", func() bool { return lcWaiters(a, ch) == 1 })
	lcReady(t, a, channelKey(plain), plain, 2)

	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	lcSend(t, b, ch, "p")
	lcSend(t, b, plain, "1")
	lcSend(t, b, plain, "2")
	if r := lcAwait(t, rp, 5*time.Second, "process reader"); r.err != nil || lcN(t, r.body) != "p" {
		t.Fatalf("process reader got %q, %v", r.body, r.err)
	}
	seen := map[string]bool{}
	for i, r := range []<-chan lcResult{r1, r2} {
		res := lcAwait(t, r, 5*time.Second, fmt.Sprintf("plain reader %d", i+1))
		if res.err != nil {
			t.Fatalf("plain reader %d: %v", i+1, res.err)
		}
		seen[lcN(t, res.body)] = true
	}
	if !seen["1"] || !seen["2"] {
		t.Errorf("plain readers got %v, want 1 and 2", seen)
	}
	if ok, entries, waiters := lcBox(a, ch); ok && (entries != 0 || waiters != 0) {
		t.Errorf("process mailbox holds %d entries and %d waiters, want none", entries, waiters)
	}
	lcCheckConsistent(t, a)
}

// TestLifecycleFlushDuringSubscribe (ref 69): Flush racing the first receive of plain channels
// does not strand it: every receive still gets the message sent once it waits.
func TestLifecycleFlushDuringSubscribe(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 20*time.Second)

	stop := make(chan struct{})
	var flushes atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = a.Flush()
			flushes.Add(1)
			runtime.Gosched()
		}
	}()
	const n = 20
	results := make([]<-chan lcResult, n)
	for i := range n {
		results[i] = lcRecvAsync(ctx, a, "flush-sub-"+strconv.Itoa(i))
	}
	for i := range n {
		ch := "flush-sub-" + strconv.Itoa(i)
		lcReady(t, a, channelKey(ch), ch, 1)
	}
	close(stop)
	wg.Wait()
	for i := range n {
		ch := "flush-sub-" + strconv.Itoa(i)
		lcReady(t, a, channelKey(ch), ch, 1)
		lcSend(t, b, ch, strconv.Itoa(i))
	}
	for i, r := range results {
		res := lcAwait(t, r, 5*time.Second, "receive "+strconv.Itoa(i))
		if res.err != nil || lcN(t, res.body) != strconv.Itoa(i) {
			t.Errorf("receive %d got %q, %v", i, res.body, res.err)
		}
	}
	t.Logf("%d flushes", flushes.Load())
	lcCheckConsistent(t, a)
}

// TestLifecycleFlushOnDeadConnection (ref 28): Flush does not fail when the server is gone,
// whether nats.go is still reconnecting or the connection is closed for good.
func TestLifecycleFlushOnDeadConnection(t *testing.T) {
	for _, forGood := range []bool{false, true} {
		t.Run(fmt.Sprintf("closed-for-good=%v", forGood), func(t *testing.T) {
			s := startServer(t)
			cfg := testConfig(nil, s.url())
			if forGood {
				cfg.Connection.MaxReconnects = NoReconnect
			}
			a := connect(t, cfg)
			ctx := ctxT(t, 10*time.Second)
			ch, err := a.NewChannel(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			if err := a.GroupAdd(ctx, "room", ch); err != nil {
				t.Fatal(err)
			}
			if err := a.GroupAdd(ctx, "room", "dead-plain"); err != nil {
				t.Fatal(err)
			}
			s.stop()
			waitFor(t, 5*time.Second, "the connection to go", func() bool {
				a.mu.Lock()
				defer a.mu.Unlock()
				return !a.link.conn().IsConnected() && (!forGood || a.link.conn().IsClosed())
			})
			if err := a.Flush(); err != nil {
				t.Fatalf("Flush on a dead connection: %v", err)
			}
			if st := a.Stats(); st.Mailboxes != 0 || st.Groups != 0 || st.Subscriptions != 0 {
				t.Errorf("after Flush: %+v", st)
			}
			start := time.Now()
			_ = a.Close()
			if el := time.Since(start); el > 3*time.Second {
				t.Errorf("Close took %s", el)
			}
		})
	}
}

// ---------------------------------------------------------------------------------------------
// S16: close

// TestLifecycleCloseEndsWaitingReceives (ref 55, 56): waiting receives end with ErrClosed, later
// calls return ErrClosed, and Close twice is fine.
func TestLifecycleCloseEndsWaitingReceives(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	const plain = "close-shared"
	rp := lcRecvAsync(ctx, a, ch)
	r1 := lcRecvAsync(ctx, a, plain)
	r2 := lcRecvAsync(ctx, a, plain)
	waitFor(t, 5*time.Second, "the process reader", func() bool { return lcWaiters(a, ch) == 1 })
	lcReady(t, a, channelKey(plain), plain, 2)

	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for i, r := range []<-chan lcResult{rp, r1, r2} {
		res := lcAwait(t, r, 2*time.Second, fmt.Sprintf("reader %d", i))
		if !errors.Is(res.err, ErrClosed) {
			t.Errorf("reader %d ended with %v, want ErrClosed", i, res.err)
		}
	}
	if err := a.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	checks := map[string]error{
		"Send":         a.Send(ctx, ch, map[string]any{"type": "x"}),
		"SendPlain":    a.Send(ctx, plain, map[string]any{"type": "x"}),
		"GroupSend":    a.GroupSend(ctx, "room", map[string]any{"type": "x"}),
		"GroupAdd":     a.GroupAdd(ctx, "room", ch),
		"GroupDiscard": a.GroupDiscard("room", ch),
	}
	_, err = a.ReceiveRaw(ctx, ch)
	checks["ReceiveRaw"] = err
	_, err = a.ReceiveRaw(ctx, plain)
	checks["ReceiveRawPlain"] = err
	_, err = a.NewChannel(ctx, "")
	checks["NewChannel"] = err
	_, p, err := a.StartReceive(ch, func(Message, error) { t.Error("callback after Close") })
	checks["StartReceive"] = err
	if p != nil {
		t.Error("StartReceive after Close returned a pending receive")
	}
	for name, err := range checks {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
	if err := a.Flush(); err != nil {
		t.Errorf("Flush after Close: %v", err)
	}
	if st := a.Stats(); st.Connected {
		t.Error("Stats().Connected after Close")
	}
	waitFor(t, 5*time.Second, "the server to see the client go", func() bool { return s.numClients() == 0 })
}

// TestLifecycleCloseIsBoundedWithoutServer (S16): Close returns within the drain timeout (plus a
// margin) when the server is gone, ends the waiting receive, and logs the publishes it lost.
func TestLifecycleCloseIsBoundedWithoutServer(t *testing.T) {
	for _, forGood := range []bool{false, true} {
		t.Run(fmt.Sprintf("closed-for-good=%v", forGood), func(t *testing.T) {
			s := startServer(t)
			rec := &logSink{}
			cfg := testConfig(rec, s.url())
			cfg.Connection.DrainTimeout = 500 * time.Millisecond
			if forGood {
				cfg.Connection.MaxReconnects = NoReconnect
			}
			a := connect(t, cfg)
			ctx := ctxT(t, 10*time.Second)
			ch, err := a.NewChannel(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			r := lcRecvAsync(ctx, a, ch)
			waitFor(t, 5*time.Second, "the reader", func() bool { return lcWaiters(a, ch) == 1 })
			s.stop()
			waitFor(t, 5*time.Second, "the disconnect", func() bool { return !a.Stats().Connected })

			start := time.Now()
			if err := a.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if el := time.Since(start); el > cfg.Connection.DrainTimeout+time.Second {
				t.Errorf("Close took %s, want < %s", el, cfg.Connection.DrainTimeout+time.Second)
			}
			if res := lcAwait(t, r, time.Second, "reader"); !errors.Is(res.err, ErrClosed) {
				t.Errorf("the waiting receive ended with %v, want ErrClosed", res.err)
			}
		})
	}
}

// TestLifecycleCloseLogsUnsentPublishes (S16: "logs what it could not send"): a publish buffered
// while the server is gone cannot go out on Close; Close says so in a warning.
func TestLifecycleCloseLogsUnsentPublishes(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	cfg := testConfig(rec, s.url())
	cfg.Connection.DrainTimeout = 500 * time.Millisecond
	a := connect(t, cfg)
	ctx := ctxT(t, 10*time.Second)
	s.stop()
	waitFor(t, 5*time.Second, "the disconnect", func() bool { return !a.Stats().Connected })
	if err := a.Send(ctx, "unsent-plain", map[string]any{"type": "lost"}); err != nil {
		t.Fatalf("a send during the outage should be buffered: %v", err)
	}
	start := time.Now()
	_ = a.Close()
	if el := time.Since(start); el > cfg.Connection.DrainTimeout+time.Second {
		t.Errorf("Close took %s", el)
	}
	if rec.count(lcWarning, "closed with 1 publish(es)", "drain_timeout (500ms)", "1 still queued", "counted as lost") != 1 {
		t.Errorf("Close dropped a buffered publish without a warning; log:\n%s", rec.all())
	}
	if st := a.Stats(); st.Lost.Messages != 1 || st.Lost.Bytes == 0 || st.Outbound.Bytes != 0 {
		t.Errorf("after Close: Lost %+v, Outbound.Bytes %d; want 1 message lost and nothing queued", st.Lost, st.Outbound.Bytes)
	}
}

// TestLifecycleNoCallbackAfterClose (ref 63, S16): while messages stream in, Close ends every
// pending receive before it returns, and no receive callback runs after that.
func TestLifecycleNoCallbackAfterClose(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 20*time.Second)
	var chans []string
	for range 3 {
		ch, err := a.NewChannel(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		chans = append(chans, ch)
	}
	chans = append(chans, "after-close-1", "after-close-2")
	for _, ch := range chans[3:] {
		lcSubscribePlain(t, a, ch)
	}

	var closeReturned atomic.Bool
	var late, endedByClose, missing atomic.Int64
	var wg sync.WaitGroup
	for _, ch := range chans {
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					got := make(chan error, 1)
					_, p, err := a.StartReceive(ch, func(_ Message, err error) {
						if closeReturned.Load() {
							late.Add(1)
						}
						got <- err
					})
					if err != nil {
						if !errors.Is(err, ErrClosed) {
							t.Errorf("StartReceive: %v", err)
						}
						return
					}
					if p == nil {
						continue // a message was waiting
					}
					select {
					case err := <-got:
						if errors.Is(err, ErrClosed) {
							endedByClose.Add(1)
							return
						}
						if err != nil {
							t.Errorf("callback error: %v", err)
							return
						}
					case <-time.After(5 * time.Second):
						missing.Add(1) // deliver must run exactly once
						return
					}
				}
			}()
		}
	}
	stopSend := make(chan struct{})
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		body := lcBody(t, "flood")
		for i := 0; ; i++ {
			select {
			case <-stopSend:
				return
			default:
			}
			_ = b.SendRaw(ctx, chans[i%len(chans)], body)
			if i%50 == 0 {
				time.Sleep(100 * time.Microsecond)
			}
		}
	}()
	waitFor(t, 10*time.Second, "traffic", func() bool { return a.counters.delivered.Load() >= 500 })
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	closeReturned.Store(true)
	wg.Wait()
	time.Sleep(300 * time.Millisecond)
	close(stopSend)
	<-sendDone
	if n := late.Load(); n != 0 {
		t.Errorf("%d receive callback(s) ran after Close returned", n)
	}
	if n := missing.Load(); n != 0 {
		t.Errorf("%d pending receive(s) never got their callback", n)
	}
	t.Logf("%d receives ended by Close, %d delivered", endedByClose.Load(), a.counters.delivered.Load())
}

// TestLifecycleCloseWaitsForDeliveriesInFlight (S16): one group message handed to several waiting
// receives is delivered callback after callback; if the first callback is slow and Close runs
// meanwhile, Close returns only after the rest were delivered.
func TestLifecycleCloseWaitsForDeliveriesInFlight(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	const members = 5
	var closeReturned, first atomic.Bool
	var delivered, late atomic.Int64
	started := make(chan struct{})
	for range members {
		ch, err := a.NewChannel(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := a.GroupAdd(ctx, "inflight", ch); err != nil {
			t.Fatal(err)
		}
		_, p, err := a.StartReceive(ch, func(_ Message, err error) {
			if closeReturned.Load() {
				late.Add(1)
			}
			if err == nil {
				delivered.Add(1)
			}
			if first.CompareAndSwap(false, true) {
				close(started)
				time.Sleep(100 * time.Millisecond) // a slow host callback
			}
		})
		if err != nil || p == nil {
			t.Fatalf("pending=%v err=%v", p, err)
		}
	}
	lcGroupSend(t, b, "inflight", "x")
	select {
	case <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("no callback ran")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	closeReturned.Store(true)
	if n := delivered.Load(); n != members {
		t.Errorf("%d of %d callbacks had run when Close returned", n, members)
	}
	time.Sleep(200 * time.Millisecond)
	if n := late.Load(); n != 0 {
		t.Errorf("%d callback(s) ran after Close returned", n)
	}
}

// ---------------------------------------------------------------------------------------------
// S18: group expiry

func TestLifecycleGroupExpiry(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	cfg := testConfig(rec, s.url())
	cfg.GroupExpiry = 200 * time.Millisecond
	cfg.ReleaseLinger = 100 * time.Millisecond
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)

	idle, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	read, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	const idlePlain = "expiring-plain"
	for _, ch := range []string{idle, read, idlePlain} {
		if err := a.GroupAdd(ctx, "room", ch); err != nil {
			t.Fatal(err)
		}
	}
	r := lcRecvAsync(ctx, a, read)
	waitFor(t, 5*time.Second, "the reader", func() bool { return lcWaiters(a, read) == 1 })

	waitFor(t, 5*time.Second, "group expiry of the unread members", func() bool { return a.Stats().GroupsExpired == 2 })
	a.mu.Lock()
	g := a.groups["room"]
	var idleIn, plainIn, readIn bool
	if g != nil {
		idleIn, plainIn, readIn = g.member(idle) != nil, g.member(idlePlain) != nil, g.member(read) != nil
	}
	a.mu.Unlock()
	if idleIn || plainIn || !readIn {
		t.Fatalf("members after expiry: idle=%v plain=%v read=%v, want only read", idleIn, plainIn, readIn)
	}
	for _, ch := range []string{idle, idlePlain} {
		if rec.count(lcWarning, "group_expiry", ch) != 1 {
			t.Errorf("want one group_expiry warning naming %s; log:\n%s", ch, rec.all())
		}
	}
	if lcSub(a, memberKey("room", idlePlain)) != nil {
		t.Error("the expired plain member kept its group subscription")
	}
	waitFor(t, 5*time.Second, "release of the expired plain member", func() bool { return lcSub(a, channelKey(idlePlain)) == nil })

	time.Sleep(300 * time.Millisecond) // more than the expiry again: the waiting reader stays
	if got := a.Stats().GroupsExpired; got != 2 {
		t.Errorf("GroupsExpired = %d, want 2: a member with a pending receive expired", got)
	}
	lcGroupSend(t, b, "room", "still")
	if res := lcAwait(t, r, 5*time.Second, "reader"); res.err != nil || lcN(t, res.body) != "still" {
		t.Fatalf("reader got %q, %v", res.body, res.err)
	}
	lcCheckConsistent(t, a)
}

// ---------------------------------------------------------------------------------------------
// S3: slow consumer (ref 49)

func TestLifecycleSlowConsumer(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	cfg := testConfig(rec, s.url())
	cfg.Connection.PendingMsgsLimit = 4
	a := connect(t, cfg)
	raw := rawConn(t, s.url())
	ch, err := a.NewChannel(ctxT(t, 5*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	subject := a.subj.process(lcNonLocal(ch))
	const burst = 20

	// stall holds the layer lock, so the dispatcher cannot route, while raw publishes a burst;
	// it returns how many messages the connection dropped in total.
	stall := func(from int) (int, error) {
		a.mu.Lock()
		defer a.mu.Unlock()
		sub := a.subs[processKey(lcNonLocal(ch))].sub
		before, _ := lcConnectionDrops(a, sub)
		for i := range burst {
			m := &nats.Msg{Subject: subject, Header: nats.Header{ChannelHeader: []string{ch}}, Data: lcBody(t, strconv.Itoa(from+i))}
			if err := raw.PublishMsg(m); err != nil {
				return 0, err
			}
		}
		if err := raw.Flush(); err != nil {
			return 0, err
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			d, err := lcConnectionDrops(a, sub)
			if err != nil {
				return 0, err
			}
			if d-before+len(a.inbox) >= burst-1 {
				return d, nil
			}
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("the connection saw only %d drops and %d queued", d-before, len(a.inbox))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	dropped, err := stall(0)
	if err != nil {
		t.Fatal(err)
	}
	if dropped == 0 {
		t.Fatal("no message was dropped with a pending limit of 4")
	}
	waitFor(t, 5*time.Second, "slow-consumer count", func() bool { return a.Stats().Dropped.SlowConsumer == uint64(dropped) })
	waitFor(t, 5*time.Second, "the rest in the mailbox", func() bool { return lcEntries(a, ch) == burst-dropped })
	if n := rec.count(lcWarning, "slow consumer", subject); n != 1 {
		t.Fatalf("%d slow consumer warning(s) naming %s, want 1; log:\n%s", n, subject, rec.all())
	}
	if st := a.Stats(); st.Dropped.Capacity != 0 {
		t.Errorf("slow-consumer drops counted as capacity drops: %+v", st.Dropped)
	}

	// A second spell within the interval is counted but not logged again.
	dropped2, err := stall(burst)
	if err != nil {
		t.Fatal(err)
	}
	if dropped2 <= dropped {
		t.Fatalf("the second burst dropped nothing (%d then %d)", dropped, dropped2)
	}
	waitFor(t, 5*time.Second, "slow-consumer count after the second burst", func() bool {
		return a.Stats().Dropped.SlowConsumer == uint64(dropped2)
	})
	if n := rec.count("slow consumer"); n != 1 {
		t.Errorf("%d slow consumer warnings within the interval, want 1; log:\n%s", n, rec.all())
	}
	if got := lcRecv(t, a, ch, 5*time.Second); got != "0" {
		t.Errorf("first surviving message is %q, want 0 (the dispatcher held it)", got)
	}
}

// ---------------------------------------------------------------------------------------------
// Groups: cancelled and overtaken group_add (ref 7, 70)

func TestLifecycleCancelledGroupAdd(t *testing.T) {
	s := startServer(t)
	a := connect(t, lcLingerConfig(s.url(), 100*time.Millisecond))
	ctx := ctxT(t, 10*time.Second)
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, member := range []string{ch, "cancelled-plain"} {
		if err := a.GroupAdd(cancelled, "cgroup", member); !errors.Is(err, context.Canceled) {
			t.Errorf("GroupAdd(%s) with a cancelled context: %v, want context.Canceled", member, err)
		}
	}
	a.mu.Lock()
	_, has := a.groups["cgroup"]
	a.mu.Unlock()
	if has {
		t.Error("a cancelled GroupAdd left a group entry")
	}
	if n := lcSubKinds(a, subGroup) + lcSubKinds(a, subGroupChannel); n != 0 {
		t.Errorf("%d group subscription(s) left by cancelled GroupAdds", n)
	}
	waitFor(t, 5*time.Second, "release of the plain channel's subscription", func() bool {
		return lcSub(a, channelKey("cancelled-plain")) == nil && !lcHasBox(a, "cancelled-plain")
	})
	lcCheckConsistent(t, a)
	if err := a.GroupAdd(ctx, "cgroup", ch); err != nil {
		t.Fatalf("a GroupAdd after the cancelled one: %v", err)
	}
	lcCheckConsistent(t, a)
}

// TestLifecycleCancelledWhileConfirming (ref 7, 45, 59): a GroupAdd or a first receive of a plain
// channel cancelled while the server has not yet confirmed the subscription returns promptly and
// leaves no membership, no group subscription and, after the linger, no plain subscription.
func TestLifecycleCancelledWhileConfirming(t *testing.T) {
	s := startServer(t)
	px := lcStartProxy(t, s.url())
	a := connect(t, lcLingerConfig(px.URL(), 100*time.Millisecond))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}

	ops := []struct {
		name, channel string
		run           func(context.Context) error
	}{
		{"GroupAdd(process)", pc, func(ctx context.Context) error { return a.GroupAdd(ctx, "confirming", pc) }},
		{"GroupAdd(plain)", "confirming-plain", func(ctx context.Context) error { return a.GroupAdd(ctx, "confirming", "confirming-plain") }},
		{"ReceiveRaw(plain)", "confirming-read", func(ctx context.Context) error {
			_, err := a.ReceiveRaw(ctx, "confirming-read")
			return err
		}},
	}
	for _, op := range ops {
		px.Stop(faultproxy.Down)
		octx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- op.run(octx) }()
		waitFor(t, 5*time.Second, op.name+" waiting for its confirmation", func() bool { return lcSubscribing(a, op.channel) })
		cancelled := time.Now()
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("%s cancelled while confirming: %v, want context.Canceled", op.name, err)
			}
			if el := time.Since(cancelled); el > 500*time.Millisecond {
				t.Errorf("%s returned %s after its cancel", op.name, el)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not return after its cancel", op.name)
		}
		px.Pass()
	}
	a.mu.Lock()
	_, has := a.groups["confirming"]
	a.mu.Unlock()
	if has {
		t.Error("a cancelled GroupAdd left its group behind")
	}
	if n := lcSubKinds(a, subGroup) + lcSubKinds(a, subGroupChannel); n != 0 {
		t.Errorf("%d group subscription(s) left", n)
	}
	for _, ch := range []string{"confirming-plain", "confirming-read"} {
		waitFor(t, 5*time.Second, "release of "+ch, func() bool { return lcSub(a, channelKey(ch)) == nil && !lcHasBox(a, ch) })
	}
	lcCheckConsistent(t, a)
	lcGroupSend(t, b, "confirming", "x")
	lcExpectNothing(t, a, pc, 300*time.Millisecond)
}

// TestLifecycleFlushOvertakesConfirmation (ref 69, 70): Flush while the server has not yet
// confirmed a subscription. A GroupAdd it overtook leaves no membership, no group subscription
// and no plain subscription nobody reads; a first receive it overtook still gets a later message.
func TestLifecycleFlushOvertakesConfirmation(t *testing.T) {
	s := startServer(t)
	px := lcStartProxy(t, s.url())
	a := connect(t, lcLingerConfig(px.URL(), 100*time.Millisecond))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}

	overtake := func(name, channel string, run func() error) error {
		t.Helper()
		px.Stop(faultproxy.Down)
		defer px.Pass()
		done := make(chan error, 1)
		go func() { done <- run() }()
		waitFor(t, 5*time.Second, name+" waiting for its confirmation", func() bool { return lcSubscribing(a, channel) })
		if err := a.Flush(); err != nil {
			t.Errorf("Flush: %v", err)
		}
		px.Pass()
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Second):
			t.Fatalf("%s did not return after Flush", name)
			return nil
		}
	}

	for _, member := range []string{pc, "overtaken-plain"} {
		err := overtake("GroupAdd("+member+")", member, func() error { return a.GroupAdd(ctx, "overtaken", member) })
		t.Logf("GroupAdd(%s) overtaken by Flush returned %v", member, err)
		a.mu.Lock()
		_, has := a.groups["overtaken"]
		a.mu.Unlock()
		if has {
			t.Errorf("GroupAdd(%s) overtaken by Flush left a membership", member)
		}
		if n := lcSubKinds(a, subGroup) + lcSubKinds(a, subGroupChannel); n != 0 {
			t.Errorf("GroupAdd(%s) overtaken by Flush left %d group subscription(s)", member, n)
		}
		lcCheckConsistent(t, a)
	}
	// The plain channel is in no group and nobody reads it: it must not keep its queue-group
	// share (S6). Allow several linger periods.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) && lcSub(a, channelKey("overtaken-plain")) != nil {
		time.Sleep(10 * time.Millisecond)
	}
	if lcSub(a, channelKey("overtaken-plain")) != nil || lcHasBox(a, "overtaken-plain") {
		t.Errorf("a plain channel whose GroupAdd Flush overtook keeps its subscription with no reader and no group")
	}
	lcGroupSend(t, b, "overtaken", "x")
	lcExpectNothing(t, a, pc, 300*time.Millisecond)

	// A first receive that Flush overtakes still gets the message sent once it waits.
	const ch = "overtaken-read"
	got := make(chan lcResult, 1)
	go func() {
		body, err := a.ReceiveRaw(ctx, ch)
		got <- lcResult{body, err}
	}()
	px.Stop(faultproxy.Down)
	waitFor(t, 5*time.Second, "the receive waiting for its confirmation", func() bool { return lcSubscribing(a, ch) })
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	px.Pass()
	lcReady(t, a, channelKey(ch), ch, 1)
	lcSend(t, b, ch, "after")
	if r := lcAwait(t, got, 5*time.Second, "overtaken receive"); r.err != nil || lcN(t, r.body) != "after" {
		t.Fatalf("overtaken receive got %q, %v", r.body, r.err)
	}
	lcCheckConsistent(t, a)
}

func TestLifecycleGroupAddOvertakenByFlush(t *testing.T) {
	s := startServer(t)
	a := connect(t, lcLingerConfig(s.url(), 50*time.Millisecond))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 20*time.Second)

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = a.Flush()
			time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
		}
	}()
	var ok, failed int
	for i := range 200 {
		member := "overtaken-" + strconv.Itoa(i%7)
		if i%2 == 0 {
			ch, err := a.NewChannel(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			member = ch
		}
		// A GroupAdd that Flush overtook must still end (with whatever error), not wait for a
		// subscription Flush dropped.
		err := a.GroupAdd(ctxT(t, 5*time.Second), "race"+strconv.Itoa(i%3), member)
		if errors.Is(err, context.DeadlineExceeded) {
			close(stop)
			wg.Wait()
			t.Fatalf("GroupAdd %d (%s) did not end within 5 s while Flush raced it", i, member)
		}
		if err != nil {
			failed++
			continue
		}
		ok++
	}
	close(stop)
	wg.Wait()
	t.Logf("%d GroupAdds returned nil, %d failed", ok, failed)
	lcCheckConsistent(t, a)

	// Once the race is over, the layer works as before.
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.GroupAdd(ctx, "after", ch); err != nil {
		t.Fatal(err)
	}
	lcGroupSend(t, b, "after", "ok")
	if got := lcRecv(t, a, ch, 5*time.Second); got != "ok" {
		t.Fatalf("got %q", got)
	}
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "empty state after the last Flush", func() bool {
		st := a.Stats()
		return st.Groups == 0 && st.Mailboxes == 0 && st.Subscriptions == 0
	})
	lcCheckConsistent(t, a)
}

// ---------------------------------------------------------------------------------------------
// Start* never wait

// TestLifecycleStartCallsNeverWait: the Start* forms finish during the call (a nil *Op) when
// nothing has to wait, and otherwise return a pending *Op at once. A first receive on a plain
// channel does not wait for its subscription in the call; cancelled while it is confirmed, it
// leaves no queue-group share behind (released after the linger).
func TestLifecycleStartCallsNeverWait(t *testing.T) {
	s := startServer(t)
	a := connect(t, lcLingerConfig(s.url(), 100*time.Millisecond))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	const ch = "nowait-plain"

	start := time.Now()
	_, p, err := a.StartReceive(ch, func(Message, error) { t.Error("callback of a cancelled receive") })
	if err != nil || p == nil {
		t.Fatalf("first receive on an unsubscribed plain channel: pending=%v err=%v, want a pending receive", p, err)
	}
	if d := time.Since(start); d > 50*time.Millisecond {
		t.Errorf("the first StartReceive of a plain channel took %s; it must not wait for the subscription", d)
	}
	if !p.Cancel() {
		t.Fatal("Cancel of a receive waiting for its subscription returned false")
	}
	if p.Cancel() {
		t.Fatal("a second Cancel returned true")
	}
	// The subscription that cancelled receive started must not keep a queue-group share.
	waitFor(t, 5*time.Second, "release of the subscription of the cancelled receive", func() bool {
		return lcSub(a, channelKey(ch)) == nil && !lcHasBox(a, ch)
	})

	r := lcRecvAsync(ctx, a, ch) // a normal receive subscribes
	lcReady(t, a, channelKey(ch), ch, 1)
	lcSend(t, b, ch, "first")
	if res := lcAwait(t, r, 5*time.Second, "normal receive"); res.err != nil || lcN(t, res.body) != "first" {
		t.Fatalf("got %q, %v", res.body, res.err)
	}

	// Once subscribed, a receive is listed in the mailbox during the call.
	got := make(chan Message, 1)
	m, p, err := a.StartReceive(ch, func(m Message, err error) {
		if err != nil {
			t.Errorf("callback error: %v", err)
		}
		got <- m
	})
	if err != nil || p == nil || m.Body != nil {
		t.Fatalf("receive once subscribed: msg=%q pending=%v err=%v, want a pending receive", m.Body, p, err)
	}
	if !msgListed(a, ch, p) {
		t.Fatal("a receive on a confirmed channel was not waiting in its mailbox when StartReceive returned")
	}
	lcSend(t, b, ch, "second")
	select {
	case m := <-got:
		if n := lcN(t, m.Body); n != "second" {
			t.Fatalf("got %q, want second", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the pending receive got nothing")
	}

	lcSend(t, b, ch, "third")
	waitFor(t, 5*time.Second, "the message in the mailbox", func() bool { return lcEntries(a, ch) == 1 })
	m, p, err = a.StartReceive(ch, func(Message, error) { t.Error("callback for a ready message") })
	if err != nil || p != nil || lcN(t, m.Body) != "third" {
		t.Fatalf("receive with a message waiting: msg=%q pending=%v err=%v", m.Body, p, err)
	}

	// A process channel made by NewChannel is subscribed: the next StartNewChannel finishes
	// during the call, and a receive on it is listed at once.
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	pc2, op, err := a.StartNewChannel("", func(string, error) { t.Error("done of a finished StartNewChannel") })
	if err != nil || op != nil || !IsProcessChannel(pc2) || pc2 == pc {
		t.Fatalf("StartNewChannel with the process subscription confirmed: name=%q op=%v err=%v", pc2, op, err)
	}
	_, p, err = a.StartReceive(pc, func(Message, error) {})
	if err != nil || p == nil || !msgListed(a, pc, p) {
		t.Fatalf("receive on a new process channel: pending=%v err=%v", p, err)
	}
	if !p.Cancel() {
		t.Fatal("Cancel of a waiting receive returned false")
	}
	// A group_add whose subscriptions are confirmed finishes during the call too; so does a send.
	if err := a.GroupAdd(ctx, "nowait-room", pc); err != nil {
		t.Fatal(err)
	}
	op, err = a.StartGroupAdd("nowait-room", pc2, func(error) { t.Error("done of a finished StartGroupAdd") })
	if err != nil || op != nil {
		t.Fatalf("StartGroupAdd with its subscriptions confirmed: op=%v err=%v", op, err)
	}
	op, err = a.StartGroupSend("nowait-room", lcBody(t, "g"), func(error) { t.Error("done of an accepted send") })
	if err != nil || op != nil {
		t.Fatalf("StartGroupSend: op=%v err=%v, want accepted at once", op, err)
	}
	for _, c := range []string{pc, pc2} {
		if n := lcRecv(t, a, c, 5*time.Second); n != "g" {
			t.Fatalf("%s got %q, want g", c, n)
		}
	}
}

// TestLifecycleLingerCountsFromTheLastReader: a plain channel is released ReleaseLinger after
// its LAST reader left, not after the first of several back-to-back polls (S6).
func TestLifecycleLingerCountsFromTheLastReader(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.ReleaseLinger = 300 * time.Millisecond
	a := connect(t, cfg)
	subscribed := func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.subs[channelKey("polled")] != nil
	}
	poll := func(d time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		if _, err := a.ReceiveRaw(ctx, "polled"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("poll: %v", err)
		}
	}
	poll(50 * time.Millisecond) // the first reader leaves: the linger starts
	time.Sleep(200 * time.Millisecond)
	poll(50 * time.Millisecond) // another reader comes and goes inside the linger
	time.Sleep(150 * time.Millisecond)
	if !subscribed() {
		t.Fatal("released 400 ms after the first reader left, only 150 ms after the last one")
	}
	waitFor(t, 5*time.Second, "the release after the last reader's linger", func() bool { return !subscribed() })
}

// TestLifecycleCancelledGroupAddLeavesAtOnce (S14): once Cancel of a group_add still waiting for
// the server's confirmation returns, the membership is gone; not later, when the goroutine that
// confirms notices. A group message published right after the Cancel must not reach the channel.
func TestLifecycleCancelledGroupAddLeavesAtOnce(t *testing.T) {
	s := startServer(t)
	px := lcStartProxy(t, s.url())
	a := connect(t, testConfig(nil, px.URL()))
	ctx := ctxT(t, 10*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	px.Stop(faultproxy.Down) // the group subscription cannot be confirmed: the group_add waits
	for attempt := range 20 {
		group := fmt.Sprintf("leaves-at-once-%d", attempt)
		op, err := a.StartGroupAdd(group, pc, func(error) { t.Errorf("the result of a cancelled group_add %s", group) })
		if err != nil || op == nil {
			t.Fatalf("StartGroupAdd %s: op %v, %v; want it waiting", group, op, err)
		}
		if !op.Cancel() {
			t.Fatalf("Cancel of the waiting group_add %s lost", group)
		}
		a.mu.Lock()
		g := a.groups[group]
		member := g != nil && g.member(pc) != nil
		a.mu.Unlock()
		if member {
			t.Fatalf("attempt %d: %s is still a member of %s when Cancel has returned", attempt, pc, group)
		}
	}
}
