package layer

// Tests of the outbound side (link.go) and of the first connect (conn.go) against a real
// embedded nats-server, with the faults a real network makes played by the loopback fault
// proxy: backpressure while the link is stalled, the publish deadline, the accounting of
// publishes lost with a failed connection or at Close, the detection of a dead link by the
// pings (and a short stall that must not count as one), and connect_deadline.

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/channels-nats/channels-nats/internal/faultproxy"
	"github.com/channels-nats/channels-nats/internal/testport"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// ---------------------------------------------------------------------------------------------
// helpers

// linkSettled reports whether l's link holds nothing: nothing queued or in the writer's hands,
// nobody waiting for room, and every publish handed to nats.go confirmed by the server.
func linkSettled(l *Layer) bool {
	k := l.link
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.queue) == 0 && k.queued == (Tally{}) && len(k.waiting) == 0 && k.handed == k.confirmed
}

// lkHanded is what the link has handed to the connection.
func lkHanded(l *Layer) Tally {
	l.link.mu.Lock()
	defer l.link.mu.Unlock()
	return l.link.handed
}

// lkWroteInline reports whether the one publish made since nats.go had sent outMsgs and the
// link had handed handed was written on the caller's thread: handed already, past nats.go. The
// writer would have handed it later, or through nats.go.
func lkWroteInline(l *Layer, nc *nats.Conn, outMsgs uint64, handed Tally) bool {
	return lkHanded(l).Messages == handed.Messages+1 && nc.Stats().OutMsgs == outMsgs
}

// lkBody is a valid message body of about size bytes carrying the sequence number n.
func lkBody(t testing.TB, n, size int) []byte {
	t.Helper()
	b, err := encodeMessage(map[string]any{"type": "lk", "n": n, "pad": strings.Repeat("x", size)})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// lkN is the sequence number of a body made by lkBody.
func lkN(t testing.TB, body []byte) int {
	t.Helper()
	m, err := DecodeMessage(body)
	if err != nil {
		t.Fatalf("cannot decode a body: %v", err)
	}
	switch n := m["n"].(type) {
	case int8:
		return int(n)
	case int16:
		return int(n)
	case int32:
		return int(n)
	case int64:
		return int(n)
	case uint8:
		return int(n)
	case uint16:
		return int(n)
	case uint32:
		return int(n)
	case uint64:
		return int(n)
	}
	t.Fatalf("no sequence number in %v", m)
	return 0
}

// lkSubscriber is a plain nats.go subscriber on the server itself (not through the proxy): what
// it receives reached the server.
type lkSubscriber struct {
	sub *nats.Subscription
}

func lkSubscribe(t testing.TB, url, subject string) *lkSubscriber {
	t.Helper()
	nc := rawConn(t, url)
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushTimeout(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	return &lkSubscriber{sub}
}

// next returns the sequence number of the next message, false when none comes within d.
func (s *lkSubscriber) next(t testing.TB, d time.Duration) (int, bool) {
	t.Helper()
	m, err := s.sub.NextMsg(d)
	if errors.Is(err, nats.ErrTimeout) {
		return 0, false
	}
	if err != nil {
		t.Fatalf("subscriber: %v", err)
	}
	return lkN(t, m.Data), true
}

// drain returns every sequence number that arrives until nothing came for quiet (bounded by
// max messages).
func (s *lkSubscriber) drain(t testing.TB, quiet time.Duration, max int) []int {
	t.Helper()
	var got []int
	for len(got) < max {
		n, ok := s.next(t, quiet)
		if !ok {
			break
		}
		got = append(got, n)
	}
	return got
}

// lkSend is one StartGroupSend: how long the call took, whether it was accepted at once, and
// for one that waits, its Op and a channel that gets its done's error.
type lkSend struct {
	n     int
	start time.Time
	took  time.Duration
	op    *Op
	done  chan error
}

func lkStartGroupSend(t testing.TB, l *Layer, group string, n int, body []byte) lkSend {
	t.Helper()
	s := lkSend{n: n, start: time.Now(), done: make(chan error, 1)}
	op, err := l.StartGroupSend(group, body, func(err error) { s.done <- err })
	s.took = time.Since(s.start)
	if err != nil {
		t.Fatalf("StartGroupSend %d: %v", n, err)
	}
	s.op = op
	return s
}

// lkProxied connects a layer to s through a new fault proxy.
func lkProxied(t testing.TB, s *testServer, rec *logSink, configure func(*Config)) (*Layer, *faultproxy.Proxy) {
	t.Helper()
	px := lcStartProxy(t, s.url())
	cfg := testConfig(rec, px.URL())
	if configure != nil {
		configure(&cfg)
	}
	return connect(t, cfg), px
}

// lkLostLogged sums the publish counts of the warnings that say publishes were counted as lost.
var lkLostWarning = regexp.MustCompile(`(\d+) publish\(es\) \(\d+ bytes\).*counted as lost`)

func lkLostLogged(rec *logSink) (total uint64, lines []string) {
	for _, r := range rec.take() {
		if m := lkLostWarning.FindStringSubmatch(r.msg); m != nil && r.level == LevelWarning {
			n, _ := strconv.ParseUint(m[1], 10, 64)
			total += n
			lines = append(lines, r.msg)
		}
	}
	return total, lines
}

// ---------------------------------------------------------------------------------------------
// backpressure

// lkStall is what lkFillStalled saw: every send it made, how many were accepted at once, the
// longest call and the largest Outbound.Bytes.
type lkStall struct {
	sends       []lkSend
	atOnce      int
	longest     time.Duration
	maxOutbound int
}

// lkFillStalled makes StartGroupSends of about size bytes on a stalled link until wantWaiting of
// them wait for room at the same time, then checks that the link is really stalled: for 300 ms
// none of them is admitted. The kernel's socket buffers take some MB before the writer blocks,
// and until then waiting sends are admitted again as the writer drains the queue. A send
// accepted at once while an earlier one still waits would break the order: that fails the test.
func lkFillStalled(t *testing.T, a *Layer, group string, size, wantWaiting int) lkStall {
	t.Helper()
	var r lkStall
	const maxSends = 20000
	limit := time.Now().Add(60 * time.Second)
	for n := 1; n <= maxSends && time.Now().Before(limit); n++ {
		sd := lkStartGroupSend(t, a, group, n, lkBody(t, n, size))
		r.longest = max(r.longest, sd.took)
		if sd.op == nil {
			r.atOnce++
			for _, earlier := range r.sends {
				if earlier.op != nil && earlier.op.pending() {
					t.Fatalf("send %d was accepted at once while send %d still waits for room: the order is lost", n, earlier.n)
				}
			}
		}
		r.sends = append(r.sends, sd)
		st := a.Stats()
		r.maxOutbound = max(r.maxOutbound, st.Outbound.Bytes)
		if st.Outbound.Waiting < wantWaiting {
			continue
		}
		// Enough wait at once: stalled if none of them is admitted for 300 ms (a quick look
		// first, while the writer still drains into the socket buffers).
		time.Sleep(20 * time.Millisecond)
		if a.Stats().Outbound.Waiting != st.Outbound.Waiting {
			continue
		}
		time.Sleep(280 * time.Millisecond)
		if a.Stats().Outbound.Waiting == st.Outbound.Waiting {
			return r
		}
	}
	t.Fatalf("after %d sends to a stalled link, %d waiting, the link still takes them: the outbound buffer is not bounded",
		len(r.sends), a.Stats().Outbound.Waiting)
	return r
}

// TestLinkBackpressure: with the link stalled (the proxy stops both ways, sockets open), no
// StartGroupSend waits in the call. Sends are accepted at once (a nil *Op) while there is room,
// and wait as Ops, in order, once the socket and the outbound buffer are full. The outbound
// buffer stays bounded by PendingSize (plus one message). Once the link flows again every
// waiting send is admitted (done(nil)) and the server gets every message, once, in order.
func TestLinkBackpressure(t *testing.T) {
	s := startServer(t)
	const pending, size, group = 64 << 10, 2 << 10, "lk-bp"
	a, px := lkProxied(t, s, nil, func(c *Config) {
		c.Connection.PendingSize = pending
		c.PublishDeadline = 60 * time.Second         // nothing may time out here
		c.Connection.PingInterval = 30 * time.Second // nor may the pings end the stalled connection
	})
	sub := lkSubscribe(t, s.url(), "channels.grp."+group)
	msgSize := len(lkBody(t, 0, size)) + len("channels.grp."+group)

	// The path works before the stall.
	if err := a.GroupSendRaw(ctxT(t, 5*time.Second), group, lkBody(t, 0, size)); err != nil {
		t.Fatal(err)
	}
	if n, ok := sub.next(t, 5*time.Second); !ok || n != 0 {
		t.Fatalf("before the stall the subscriber got %d, %v", n, ok)
	}
	waitFor(t, 5*time.Second, "the link to settle", func() bool { return linkSettled(a) })

	px.Stop(faultproxy.Both)
	r := lkFillStalled(t, a, group, size, 50)
	st := a.Stats()
	t.Logf("stalled: %d send(s), %d accepted at once, %d waiting; longest call %s; largest Outbound.Bytes %d (PendingSize %d, message %d)",
		len(r.sends), r.atOnce, st.Outbound.Waiting, r.longest, r.maxOutbound, pending, msgSize)
	if r.atOnce == 0 {
		t.Fatal("no send was accepted at once")
	}
	if r.longest > 250*time.Millisecond { // a send that waited would wait for the stall: seconds
		t.Errorf("the longest StartGroupSend on a stalled link took %s; a send must never wait in the call", r.longest)
	}
	if r.maxOutbound > pending+msgSize {
		t.Errorf("Outbound.Bytes reached %d, over PendingSize %d plus one message (%d)", r.maxOutbound, pending, msgSize)
	}
	if want := uint64(1 + len(r.sends) - st.Outbound.Waiting); st.Published != want {
		t.Errorf("Published = %d while stalled, want %d (accepted at once or admitted)", st.Published, want)
	}

	px.Pass()
	for _, sd := range r.sends {
		if sd.op == nil {
			continue
		}
		select {
		case err := <-sd.done:
			if err != nil {
				t.Fatalf("waiting send %d ended with %v; want it admitted", sd.n, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("waiting send %d was not admitted within 15 s of the link flowing again", sd.n)
		}
	}
	for want := 1; want <= len(r.sends); want++ {
		n, ok := sub.next(t, 10*time.Second)
		if !ok {
			t.Fatalf("the subscriber got messages 1..%d of %d, then nothing", want-1, len(r.sends))
		}
		if n != want {
			t.Fatalf("the subscriber got message %d where %d was due: order or completeness lost", n, want)
		}
	}
	if extra := sub.drain(t, 200*time.Millisecond, 10); len(extra) != 0 {
		t.Fatalf("messages beyond the %d sent arrived: %v", len(r.sends), extra)
	}
	waitFor(t, 5*time.Second, "the link to settle", func() bool { return linkSettled(a) })
	if st := a.Stats(); st.Published != uint64(1+len(r.sends)) || st.Lost.Messages != 0 || st.PublishTimeouts != 0 ||
		st.Outbound.Bytes != 0 || st.Outbound.Waiting != 0 || st.Reconnects != 0 {
		t.Errorf("after the stall: %+v", st)
	}
}

// TestLinkInlinePublish: on a healthy, quiet link a send is written to the socket before
// StartGroupSend returns (on the caller's thread, past nats.go: no writer and no flusher wake-up);
// the sends of a burst behind it, and one too large to go inline, go through the queue; all of
// them keep their order.
func TestLinkInlinePublish(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	const group, count = "lk-inline", 40
	sub := lkSubscribe(t, s.url(), "channels.grp."+group)
	nc := a.link.conn()
	for n := range count {
		size, quiet := 100, n%10 == 0 || n%10 == 5
		if n%10 == 8 {
			size = inlineLimit + 1 // too large to go inline, even on a quiet link
		}
		if quiet || size > inlineLimit {
			waitFor(t, 5*time.Second, "the link to settle", func() bool { return linkSettled(a) })
			time.Sleep(2 * quietGap)
		}
		before, handed := nc.Stats().OutMsgs, lkHanded(a)
		sd := lkStartGroupSend(t, a, group, n, lkBody(t, n, size))
		if sd.op != nil {
			t.Fatalf("send %d waits for room on an idle link", n)
		}
		if !quiet {
			continue
		}
		if !lkWroteInline(a, nc, before, handed) {
			t.Fatalf("quiet send %d went through the queue, want it written on the caller's thread", n)
		}
		if left := socketsBuffered(a); left != 0 {
			t.Fatalf("quiet send %d: %d byte(s) left in the socket's buffer when StartGroupSend returned, want them written", n, left)
		}
	}
	got := sub.drain(t, 500*time.Millisecond, 2*count)
	if len(got) != count {
		t.Fatalf("%d of %d messages arrived: %v", len(got), count, got)
	}
	for i, n := range got {
		if n != i {
			t.Fatalf("arrival order %v, want 0..%d", got, count-1)
		}
	}
	if st := a.Stats(); st.Published != count || st.Lost.Messages != 0 {
		t.Fatalf("Published %d, Lost %+v; want %d and none", st.Published, st.Lost, count)
	}
}

// TestLinkTrickleStaysInline: quiet sends that add up to several times inlineLimit within one
// confirmEvery (a ping-pong's traffic) all go inline: the link has the server confirm them once
// half of inlineLimit is unconfirmed, instead of waiting for the next periodic confirmation.
func TestLinkTrickleStaysInline(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	const group, size, gap = "lk-trickle", 512, 2 * time.Millisecond
	count := 3 * inlineLimit / size // 96 sends in about 200 ms: 48 KiB, 2 confirmEvery
	sub := lkSubscribe(t, s.url(), "channels.grp."+group)
	nc := a.link.conn()
	waitFor(t, 5*time.Second, "the link to settle", func() bool { return linkSettled(a) })
	// A confirmation's round trip must come back within the next 16 sends. One slower than
	// that on a busy machine sends a few through the queue; without the early confirmations,
	// two thirds of them would go that way.
	const mostQueued = 3
	queued := 0
	for n := range count {
		time.Sleep(gap)
		before, handed := nc.Stats().OutMsgs, lkHanded(a)
		if sd := lkStartGroupSend(t, a, group, n, lkBody(t, n, size)); sd.op != nil {
			t.Fatalf("send %d waits for room on an idle link", n)
		}
		if !lkWroteInline(a, nc, before, handed) {
			if queued++; queued > mostQueued {
				t.Fatalf("send %d of a trickle (%d bytes every %s) was the %dth through the queue, want at most %d", n, size, gap, queued, mostQueued)
			}
		}
	}
	if got := sub.drain(t, 500*time.Millisecond, 2*count); len(got) != count {
		t.Fatalf("%d of %d messages arrived", len(got), count)
	}
}

// TestLinkPublishDeadline: with the link stalled and a short PublishDeadline, a send waiting for
// room fails after the deadline with a *PublishTimeoutError (errors.Is ErrPublishTimeout) that
// says why, and nothing of it is sent; PublishTimeouts counts them. A waiting send that is
// cancelled returns true and its done never runs. What was accepted still arrives, in order,
// once the link flows.
func TestLinkPublishDeadline(t *testing.T) {
	s := startServer(t)
	const deadline, group = time.Second, "lk-deadline"
	rec := &logSink{}
	a, px := lkProxied(t, s, rec, func(c *Config) {
		c.Connection.PendingSize = 16 << 10
		c.PublishDeadline = deadline
		c.Connection.PingInterval = 30 * time.Second // the pings must not end the stalled connection
	})
	sub := lkSubscribe(t, s.url(), "channels.grp."+group)
	if err := a.GroupSendRaw(ctxT(t, 5*time.Second), group, lkBody(t, 0, 10)); err != nil {
		t.Fatal(err)
	}
	if n, ok := sub.next(t, 5*time.Second); !ok || n != 0 {
		t.Fatalf("before the stall the subscriber got %d, %v", n, ok)
	}
	waitFor(t, 5*time.Second, "the link to settle", func() bool { return linkSettled(a) })

	px.Stop(faultproxy.Both)
	r := lkFillStalled(t, a, group, 2<<10, 5)
	stalled := time.Now().Add(-300 * time.Millisecond) // the waiting sends waited at least since then
	var cancelledDone atomic.Bool
	cancelled, err := a.StartGroupSend(group, lkBody(t, -1, 10), func(error) { cancelledDone.Store(true) })
	if err != nil || cancelled == nil {
		t.Fatalf("one more send to the full buffer: op=%v err=%v, want it to wait", cancelled, err)
	}
	if !cancelled.Cancel() {
		t.Fatal("Cancel of a send waiting for room returned false")
	}
	if cancelled.Cancel() {
		t.Fatal("a second Cancel returned true")
	}

	var arrive []int // what must reach the server: accepted at once or admitted
	timedOut := 0
	for _, sd := range r.sends {
		if sd.op == nil {
			arrive = append(arrive, sd.n)
			continue
		}
		select {
		case err := <-sd.done:
			if err == nil { // admitted before the link was full
				arrive = append(arrive, sd.n)
				continue
			}
			took := time.Since(sd.start)
			var pte *PublishTimeoutError
			if !errors.Is(err, ErrPublishTimeout) || !errors.As(err, &pte) {
				t.Fatalf("waiting send %d ended with %v; want nil or a *PublishTimeoutError", sd.n, err)
			}
			if pte.Deadline != deadline || pte.Subject != "channels.grp."+group || pte.Reason == "" ||
				!strings.Contains(err.Error(), "publish_deadline") {
				t.Errorf("the timeout error does not say what and why: %+v (%v)", pte, err)
			}
			if took < deadline-50*time.Millisecond || took > deadline+time.Second {
				t.Errorf("waiting send %d failed after %s; the publish deadline is %s", sd.n, took, deadline)
			}
			timedOut++
		case <-time.After(time.Until(stalled.Add(deadline + 3*time.Second))):
			t.Fatalf("waiting send %d did not end within the publish deadline (%s) plus 3 s", sd.n, deadline)
		}
	}
	st := a.Stats()
	t.Logf("%d sends: %d to arrive, %d timed out: %+v; log:\n%s", len(r.sends), len(arrive), timedOut, st, rec.all())
	if timedOut < 5 {
		t.Errorf("%d send(s) timed out; the %d waiting on the stalled link should have", timedOut, 5)
	}
	if st.PublishTimeouts != uint64(timedOut) || st.Outbound.Waiting != 0 {
		t.Errorf("PublishTimeouts %d, Outbound.Waiting %d; want %d, 0", st.PublishTimeouts, st.Outbound.Waiting, timedOut)
	}

	// The accepted ones arrive, in order; the timed-out and the cancelled one never do.
	px.Pass()
	for _, want := range arrive {
		n, ok := sub.next(t, 10*time.Second)
		if !ok || n != want {
			t.Fatalf("the subscriber got %d (%v) where %d was due", n, ok, want)
		}
	}
	if extra := sub.drain(t, 300*time.Millisecond, 10); len(extra) != 0 {
		t.Fatalf("sends that timed out or were cancelled arrived: %v", extra)
	}
	if cancelledDone.Load() {
		t.Fatal("the done of a cancelled send ran")
	}
	if st := a.Stats(); st.Published != uint64(1+len(arrive)) || st.Lost.Messages != 0 {
		t.Errorf("after the stall: Published %d, Lost %+v; want %d, none", st.Published, st.Lost, 1+len(arrive))
	}
}

// ---------------------------------------------------------------------------------------------
// accounting: nothing accepted vanishes uncounted

// TestLinkLostPublishesAreCounted: during steady traffic the link stalls (the proxy stops both
// ways), then the connection is cut and the layer reconnects through the proxy. Whatever was
// accepted either reached the server or is counted in Stats().Lost, and the warnings name the
// count.
func TestLinkLostPublishesAreCounted(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	const group, total, stopAt, cutAt = "lk-lost", 400, 100, 300
	a, px := lkProxied(t, s, rec, func(c *Config) {
		c.Connection.PingInterval = 200 * time.Millisecond
		c.PublishDeadline = 30 * time.Second
	})
	sub := lkSubscribe(t, s.url(), "channels.grp."+group)

	var accepted atomic.Int64
	var failed []error
	var mu sync.Mutex
	var waits []lkSend
	for n := 0; n < total; n++ {
		switch n {
		case stopAt:
			px.Stop(faultproxy.Both)
		case cutAt:
			px.Cut()
			px.Pass()
		}
		sd := lkStartGroupSend(t, a, group, n, lkBody(t, n, 2<<10))
		if sd.op == nil {
			accepted.Add(1)
		} else {
			waits = append(waits, sd)
		}
		time.Sleep(time.Millisecond)
	}
	for _, sd := range waits {
		select {
		case err := <-sd.done:
			if err != nil {
				mu.Lock()
				failed = append(failed, err)
				mu.Unlock()
				continue
			}
			accepted.Add(1)
		case <-time.After(15 * time.Second):
			t.Fatalf("waiting send %d never ended", sd.n)
		}
	}
	waitFor(t, 15*time.Second, "the reconnect", func() bool { st := a.Stats(); return st.Connected && st.Reconnects >= 1 })
	waitFor(t, 15*time.Second, "the link to settle", func() bool { return linkSettled(a) })
	seen := map[int]bool{}
	for _, n := range sub.drain(t, 500*time.Millisecond, 2*total) {
		if seen[n] {
			t.Errorf("message %d arrived twice", n)
		}
		seen[n] = true
	}
	st := a.Stats()
	logged, lines := lkLostLogged(rec)
	t.Logf("%d accepted, %d failed, %d delivered, Lost %+v; logged %d in %q", accepted.Load(), len(failed), len(seen), st.Lost, logged, lines)
	if len(failed) != 0 {
		t.Errorf("%d send(s) failed: %v", len(failed), failed[0])
	}
	if uint64(len(seen))+st.Lost.Messages < uint64(accepted.Load()) {
		t.Errorf("%d accepted but only %d delivered and %d counted as lost: publishes vanished uncounted",
			accepted.Load(), len(seen), st.Lost.Messages)
	}
	if st.Lost.Messages == 0 {
		t.Error("nothing counted as lost although the connection failed with unconfirmed publishes")
	}
	if logged != st.Lost.Messages {
		t.Errorf("the warnings name %d lost publish(es), Stats().Lost counts %d; log:\n%s", logged, st.Lost.Messages, strings.Join(lines, "\n"))
	}
}

// TestLinkCloseCountsWhatNeverArrived: publishes made while the link is stalled never reach the
// server; Close gives up after drain_timeout, logs how many did not arrive, and Stats().Lost
// counts exactly them.
func TestLinkCloseCountsWhatNeverArrived(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	const group, n = "lk-close", 20
	a, px := lkProxied(t, s, rec, func(c *Config) { c.Connection.DrainTimeout = 500 * time.Millisecond })
	sub := lkSubscribe(t, s.url(), "channels.grp."+group)
	if err := a.GroupSendRaw(ctxT(t, 5*time.Second), group, lkBody(t, 0, 10)); err != nil {
		t.Fatal(err)
	}
	if got, ok := sub.next(t, 5*time.Second); !ok || got != 0 {
		t.Fatalf("before the stall the subscriber got %d, %v", got, ok)
	}
	waitFor(t, 5*time.Second, "the link to settle", func() bool { return linkSettled(a) })

	px.Stop(faultproxy.Both)
	var bytes uint64
	for i := 1; i <= n; i++ {
		body := lkBody(t, i, 2<<10)
		if op, err := a.StartGroupSend(group, body, func(error) {}); err != nil || op != nil {
			t.Fatalf("send %d to a stalled link: op=%v err=%v, want accepted at once", i, op, err)
		}
		bytes += uint64(len(body) + len("channels.grp."+group))
	}
	start := time.Now()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if took > 2*time.Second {
		t.Errorf("Close with a stalled link took %s with drain_timeout 500ms", took)
	}
	if got := sub.drain(t, 300*time.Millisecond, 2*n); len(got) != 0 {
		t.Fatalf("publishes to the stalled link arrived: %v", got)
	}
	st := a.Stats()
	t.Logf("Close took %s; Lost %+v; log:\n%s", took, st.Lost, rec.all())
	if st.Lost.Messages != n || st.Lost.Bytes != bytes {
		t.Errorf("Lost = %+v, want the %d publishes (%d bytes) that never arrived", st.Lost, n, bytes)
	}
	if rec.count(lcWarning, fmt.Sprintf("closed with %d publish(es) (%d bytes)", n, bytes), "drain_timeout (500ms)", "counted as lost") != 1 {
		t.Errorf("no warning at Close naming the %d lost publishes; log:\n%s", n, rec.all())
	}
}

// ---------------------------------------------------------------------------------------------
// a dead link, and a stall that is not one

// TestLinkDeadLinkNoticed: with the default PingInterval and MaxPingsOutstanding, a link that
// stops both ways while idle (no socket error ever comes) is noticed by the unanswered pings
// within about 12 s: a disconnect is logged and Stats().Connected turns false. Once the link
// flows again the layer reconnects and a group message reaches the member again.
func TestLinkDeadLinkNoticed(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	a, px := lkProxied(t, s, rec, nil)
	pub := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 60*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.GroupAdd(ctx, "lk-dead", pc); err != nil {
		t.Fatal(err)
	}
	lcGroupSend(t, pub, "lk-dead", "before")
	if n := lcRecv(t, a, pc, 5*time.Second); n != "before" {
		t.Fatalf("before the stall got %q", n)
	}

	px.Stop(faultproxy.Both)
	stopped := time.Now()
	waitFor(t, 15*time.Second, "the dead link to be noticed", func() bool { return !a.Stats().Connected })
	noticed := time.Since(stopped)
	t.Logf("the dead link was noticed after %s (PingInterval %s, MaxPingsOutstanding %d)", noticed, DefaultPingInterval, DefaultMaxPingsOut)
	if noticed > 13*time.Second {
		t.Errorf("the dead link was noticed after %s; the pings bound it at 12 s", noticed)
	}
	waitFor(t, 2*time.Second, "the disconnect warning", func() bool { return rec.count(lcWarning, "disconnected from NATS") >= 1 })

	px.Pass()
	waitFor(t, 15*time.Second, "the reconnect", func() bool { st := a.Stats(); return st.Connected && st.Reconnects >= 1 })
	rsRoundTrip(t, a) // the restored SUBs are on the server
	lcGroupSend(t, pub, "lk-dead", "after")
	if n := lcRecv(t, a, pc, 5*time.Second); n != "after" {
		t.Fatalf("after the reconnect got %q", n)
	}
}

// TestLinkShortStallKeepsConnection: a stall shorter than the pings allow (2 s with PingInterval
// 4 s) does not count as a dead link: no reconnect, and what was sent during and after it
// arrives, in order.
func TestLinkShortStallKeepsConnection(t *testing.T) {
	s := startServer(t)
	const group = "lk-stall"
	a, px := lkProxied(t, s, nil, func(c *Config) { c.Connection.PingInterval = 4 * time.Second })
	sub := lkSubscribe(t, s.url(), "channels.grp."+group)
	send := func(n int) {
		t.Helper()
		if op, err := a.StartGroupSend(group, lkBody(t, n, 100), func(error) {}); err != nil || op != nil {
			t.Fatalf("send %d: op=%v err=%v, want accepted at once", n, op, err)
		}
	}
	send(0)
	if n, ok := sub.next(t, 5*time.Second); !ok || n != 0 {
		t.Fatalf("before the stall the subscriber got %d, %v", n, ok)
	}

	px.Stop(faultproxy.Both)
	for n := 1; n <= 10; n++ {
		send(n)
		time.Sleep(200 * time.Millisecond) // 2 s of stall with traffic
	}
	px.Pass()
	for n := 11; n <= 20; n++ {
		send(n)
	}
	for want := 1; want <= 20; want++ {
		if n, ok := sub.next(t, 5*time.Second); !ok || n != want {
			t.Fatalf("after the stall the subscriber got %d (%v) where %d was due", n, ok, want)
		}
	}
	waitFor(t, 5*time.Second, "the link to settle", func() bool { return linkSettled(a) })
	time.Sleep(time.Second) // a ping cycle after the stall
	if st := a.Stats(); st.Reconnects != 0 || !st.Connected || st.Lost.Messages != 0 {
		t.Errorf("a 2 s stall with PingInterval 4 s: Reconnects %d, Connected %v, Lost %+v; want 0, true, none",
			st.Reconnects, st.Connected, st.Lost)
	}
	if px.Accepted() != 1 {
		t.Errorf("the proxy accepted %d connections; the stall must not replace the first", px.Accepted())
	}
}

// ---------------------------------------------------------------------------------------------
// connect_deadline

// TestLinkConnectDeadline: the first connect retries while the server cannot be reached, up to
// ConnectDeadline: to a port where nothing listens it fails after about the deadline with an
// error that names the server and connect_deadline; a server that comes up 300 ms after Connect
// began is connected to; a refusal (a wrong token) fails at once, not after the deadline.
func TestLinkConnectDeadline(t *testing.T) {
	dead := fmt.Sprintf("127.0.0.1:%d", testport.Free(t))
	cfg := testConfig(nil, "nats://"+dead)
	cfg.ConnectDeadline = time.Second
	start := time.Now()
	l, err := Connect(ctxT(t, 10*time.Second), cfg)
	took := time.Since(start)
	if err == nil {
		l.Close()
		t.Fatal("Connect to a port where nothing listens succeeded")
	}
	t.Logf("dead port: failed after %s: %v", took, err)
	if took < 800*time.Millisecond || took > 2*time.Second {
		t.Errorf("Connect to a dead port failed after %s; ConnectDeadline is 1 s", took)
	}
	if !strings.Contains(err.Error(), dead) || !strings.Contains(err.Error(), "connect_deadline") {
		t.Errorf("the error does not name the server and connect_deadline: %v", err)
	}

	// A server that comes up late: Connect keeps trying.
	port := testport.Free(t)
	late := Config{Servers: []string{fmt.Sprintf("nats://127.0.0.1:%d", port)}, ConnectDeadline: 5 * time.Second,
		Log: func(Level, string) {}}
	type result struct {
		l   *Layer
		err error
	}
	got := make(chan result, 1)
	lateCtx := ctxT(t, 10*time.Second)
	start = time.Now()
	go func() {
		l, err := Connect(lateCtx, late)
		got <- result{l, err}
	}()
	time.Sleep(300 * time.Millisecond)
	s := startServer(t, func(o *server.Options) { o.Port = port })
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("Connect to a server that came up 300 ms later: %v", r.err)
		}
		t.Cleanup(func() { _ = r.l.Close() })
		t.Logf("late server: connected after %s", time.Since(start))
		if !r.l.Stats().Connected || s.numClients() != 1 {
			t.Errorf("after the late connect: Connected %v, server clients %d", r.l.Stats().Connected, s.numClients())
		}
		rsRoundTripOn(t, r.l)
	case <-time.After(8 * time.Second):
		t.Fatal("Connect to a server that came up 300 ms later did not return")
	}

	// A refusal is final.
	ts := startServer(t, func(o *server.Options) { o.Authorization = "right-token" })
	wrong := testConfig(nil, ts.url())
	wrong.Connection.Token = "wrong-token"
	wrong.ConnectDeadline = 5 * time.Second
	start = time.Now()
	l, err = Connect(ctxT(t, 10*time.Second), wrong)
	took = time.Since(start)
	if err == nil {
		l.Close()
		t.Fatal("Connect with a wrong token succeeded")
	}
	t.Logf("wrong token: failed after %s: %v", took, err)
	if took > time.Second {
		t.Errorf("Connect with a wrong token failed after %s; a refusal must not be retried until connect_deadline", took)
	}
	if strings.Contains(err.Error(), "connect_deadline") || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("the refusal should be reported as such, not as a deadline: %v", err)
	}
}

// TestLinkWritesItsOwnPublishesOnlyToBareSockets: the layer writes a quiet publish to the socket
// itself only when nats.go writes the protocol to it as it is. Over a websocket (and over TLS,
// TestResilienceTLS) nats.go frames its writes, so the layer's own would be garbage to the
// server: there every publish goes through nats.go, and arrives.
func TestLinkWritesItsOwnPublishesOnlyToBareSockets(t *testing.T) {
	s := startServer(t, func(o *server.Options) {
		o.Websocket.Host, o.Websocket.Port, o.Websocket.NoTLS = "127.0.0.1", testport.Free(t), true
	})
	a := connect(t, testConfig(nil, fmt.Sprintf("ws://127.0.0.1:%d", s.opts.Websocket.Port)))
	plain := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	for _, l := range []*Layer{a, plain} {
		waitFor(t, 5*time.Second, "the link to settle", func() bool { return linkSettled(l) })
		time.Sleep(2 * quietGap)
	}
	wireOf := func(l *Layer) wire {
		l.link.mu.Lock()
		defer l.link.mu.Unlock()
		return l.link.wire
	}
	if w := wireOf(a); w.sock != nil {
		t.Fatal("the layer would write its own publishes into a websocket connection")
	}
	if w := wireOf(plain); w.sock == nil {
		t.Fatal("the layer would not write its own publishes to a plain connection")
	}
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for i, sender := range []*Layer{a, plain} {
		time.Sleep(2 * quietGap)
		if err := sender.Send(ctx, pc, map[string]any{"type": "lk.ws", "n": i}); err != nil {
			t.Fatal(err)
		}
		m, err := a.Receive(ctx, pc)
		if err != nil || fmt.Sprint(m["n"]) != strconv.Itoa(i) {
			t.Fatalf("message %d over the websocket: %v, %v", i, m, err)
		}
	}
}
