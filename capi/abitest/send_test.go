//go:build linux

package abitest

import (
	"strings"
	"testing"
	"time"

	"github.com/channels-nats/channels-nats/internal/faultproxy"
)

// Backpressure (cn_send): a send that finds the outbound buffer full is CN_PENDING and its result
// comes later: CN_OK once it was accepted, CN_TIMEOUT after publish_deadline, CN_CLOSED when the
// client closes. The link is stalled with the fault proxy: both sockets stay open and nothing is
// forwarded, so the kernel buffers fill, the writer blocks, and the small outbound buffer
// (pending_size 1024) is full.

// stalledBodySize is the size of the bodies that fill the link: large, so that the kernel's
// socket buffers are full after a few hundred sends.
const stalledBodySize = 32 << 10

// stall is a client connected through a fault proxy, a receiver connected to the server
// directly with a channel, and a queue for the sends' results.
type stall struct {
	t    *testing.T
	px   *faultproxy.Proxy
	c    *client
	recv *client
	ch   string
	q    *queue
}

// newStall connects the clients, checks the path, and stalls the link.
func newStall(t *testing.T, publishDeadline float64) *stall {
	t.Helper()
	ts := startServer(t)
	px, err := faultproxy.Start(ts.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() }) // after the clients' cleanups: they close first
	s := &stall{t: t, px: px, q: newQueue(t)}
	s.c = connect(t, px.URL(), map[string]any{
		"publish_deadline": publishDeadline,
		"connect_options":  map[string]any{"pending_size": 1024, "drain_timeout": 0.5},
	})
	s.recv = connect(t, ts.url, map[string]any{"capacity": 100000})
	s.ch = s.recv.newChannel("")
	s.c.send(s.ch, numbered(t, -1))
	if n := numberOf(s.recv.receiveAny(s.ch)); n != -1 {
		t.Fatalf("before the stall the receiver got n=%d", n)
	}
	px.Stop(faultproxy.Both)
	return s
}

// send is one cn_send of the body numbered n with its result going to s.q; no call may wait.
func (s *stall) send(n int, closure uintptr) (int32, uint64) {
	s.t.Helper()
	b, bn := bp(padded(s.t, n, stalledBodySize))
	op := ^uint64(0)
	start := time.Now()
	st, msg := onThread(func() int32 { return cnSend(s.c.h, cs(s.ch), b, bn, s.q.h, closure, &op) })
	if took := time.Since(start); took > 200*time.Millisecond {
		s.t.Errorf("cn_send %d on a stalled link took %s: no call may wait on the network", n, took)
	}
	switch st {
	case cnOK:
		if op != 0 {
			s.t.Errorf("cn_send %d: CN_OK with op %d, want 0", n, op)
		}
	case cnPending:
		if op == 0 || op == ^uint64(0) {
			s.t.Fatalf("cn_send %d: CN_PENDING with op %d", n, op)
		}
	default:
		s.t.Fatalf("cn_send %d: %s (%s)", n, name(st), msg)
	}
	return st, op
}

// fill sends the bodies 0, 1, ... until one finds the buffer full and stays waiting (the first
// that has to wait may still be admitted while the kernel's buffers take the last bytes). It
// returns how many were accepted, the op of the one waiting (numbered accepted) and when it was
// sent.
func (s *stall) fill(closure uintptr) (accepted int, op uint64, sent time.Time) {
	s.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for n := 0; n < 3000 && time.Now().Before(deadline); n++ {
		sent = time.Now()
		st, op := s.send(n, closure)
		if st != cnPending {
			continue
		}
		if !readable(s.q.rfd, 300*time.Millisecond) {
			return n, op, sent
		}
		if r := s.q.one(); r.Op != op || r.Status != cnOK {
			s.t.Fatalf("a send admitted while the link filled: %v, want op %d CN_OK", r, op)
		}
	}
	s.t.Fatalf("no send to a stalled link stayed pending: the outbound buffer is not bounded")
	return 0, 0, sent
}

// settled waits until the stalled client's outbound buffer is empty and nobody waits for room.
func (s *stall) settled() map[string]any {
	s.t.Helper()
	for deadline := time.Now().Add(3 * wait); ; time.Sleep(5 * time.Millisecond) {
		st := s.c.stats()
		if stat(st, "outbound.bytes") == 0 && stat(st, "outbound.waiting") == 0 {
			return st
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the outbound buffer did not empty once the link flowed: %v", st)
		}
	}
}

// received is what reached the receiver, in order, once everything sent has arrived.
func (s *stall) received() []int {
	s.t.Helper()
	s.settled()
	s.recv.barrier(s.c)
	var got []int
	for range 10000 {
		st, body, op := s.recv.receive(s.ch, nil, 0)
		if st != cnOK {
			cnCancel(s.recv.h, op)
			return got
		}
		got = append(got, numberOf(body))
	}
	return got
}

// inOrder checks that got is 0..n-1.
func inOrder(t *testing.T, got []int, n int) {
	t.Helper()
	ok := len(got) == n
	for i := 0; ok && i < n; i++ {
		ok = got[i] == i
	}
	if !ok {
		t.Errorf("the receiver got %d messages %v..., want 0..%d in order", len(got), got[:min(len(got), 10)], n-1)
	}
}

// Sends that find the buffer full wait as CN_PENDING, in order (a send after a waiting one waits
// too); the statistics show them. Once the link flows they are accepted: CN_OK results, and every
// message arrives once, in order.
func TestSendBackpressure(t *testing.T) {
	s := newStall(t, 30)
	closure := newClosure()
	accepted, first, _ := s.fill(closure)
	ops := []uint64{first}
	for n := accepted + 1; n < accepted+4; n++ {
		st, op := s.send(n, closure)
		if st != cnPending {
			t.Fatalf("send %d after a waiting one: %s, want CN_PENDING (order)", n, name(st))
		}
		ops = append(ops, op)
	}
	st := s.c.stats()
	if stat(st, "outbound.waiting") != 4 || stat(st, "outbound.bytes") <= 0 {
		t.Errorf("stats while stalled: outbound %v, want 4 waiting and bytes queued", st["outbound"])
	}
	if stat(st, "published") != float64(1+accepted) {
		t.Errorf("stats while stalled: published %v, want %d (accepted sends only)", st["published"], 1+accepted)
	}
	s.q.quiet(200 * time.Millisecond) // nothing finishes while the link is stalled
	s.px.Pass()
	got := s.q.wait(len(ops))
	for i, r := range got {
		if r.Op != ops[i] || r.Closure != closure || r.Status != cnOK || r.HasText || r.HasData {
			t.Errorf("result %d: %v, want op %d CN_OK without text or data, in order", i, r, ops[i])
		}
	}
	inOrder(t, s.received(), accepted+len(ops))
	// Published: the first message, those accepted at once and those that waited, and the
	// barrier of received.
	if st := s.settled(); stat(st, "published") != float64(2+accepted+len(ops)) || stat(st, "lost.messages") != 0 || stat(st, "publish_timeouts") != 0 {
		t.Errorf("stats after the stall: %v", st)
	}
}

// A send that finds no room within publish_deadline ends with CN_TIMEOUT and a text that says
// why; nothing of it is sent, publish_timeouts counts it.
func TestSendPublishDeadline(t *testing.T) {
	s := newStall(t, 0.5)
	accepted, op, sent := s.fill(0)
	r := s.q.one()
	took := time.Since(sent)
	if r.Op != op || r.Status != cnTimeout || !strings.Contains(r.Text, "publish") || r.HasData {
		t.Fatalf("result %v, want op %d CN_TIMEOUT with a text about the publish", r, op)
	}
	if took < 450*time.Millisecond || took > 2500*time.Millisecond {
		t.Errorf("the send timed out %s after it was made, with publish_deadline 0.5", took)
	}
	if st := s.c.stats(); stat(st, "publish_timeouts") != 1 || stat(st, "outbound.waiting") != 0 {
		t.Errorf("stats: publish_timeouts %v outbound %v, want 1 and nobody waiting", st["publish_timeouts"], st["outbound"])
	}
	if st := cnCancel(s.c.h, op); st != cnOK && st != cnNotPending {
		t.Errorf("cn_cancel of a timed-out send: %s", name(st))
	}
	s.px.Pass()
	inOrder(t, s.received(), accepted) // not the one that timed out
	s.q.quiet(20 * time.Millisecond)
}

// A waiting send withdrawn with cn_cancel is not sent and has no result; one whose queue was
// freed neither.
func TestSendCancelPending(t *testing.T) {
	s := newStall(t, 30)
	accepted, op, _ := s.fill(0)
	if st, msg := onThread(func() int32 { return cnCancel(s.c.h, op) }); st != cnOK {
		t.Fatalf("cn_cancel of a waiting send: %s (%q), want CN_OK", name(st), msg)
	}
	if st := cnCancel(s.c.h, op); st != cnNotPending {
		t.Errorf("second cn_cancel: %s, want CN_NOT_PENDING", name(st))
	}
	// The next one waits on another queue, which is freed.
	freed := newQueue(t)
	b, bn := bp(padded(t, accepted+1, stalledBodySize))
	if st := cnSend(s.c.h, cs(s.ch), b, bn, freed.h, 0, nil); st != cnPending {
		t.Fatalf("cn_send to a full buffer: %s, want CN_PENDING", name(st))
	}
	if st := cnQueueFree(freed.h); st != cnOK {
		t.Fatalf("cn_queue_free: %s", name(st))
	}
	if st := s.c.stats(); stat(st, "outbound.waiting") != 0 {
		t.Errorf("outbound.waiting = %v after both waiting sends were withdrawn, want 0", stat(st, "outbound.waiting"))
	}
	s.px.Pass()
	inOrder(t, s.received(), accepted)
	s.q.quiet(20 * time.Millisecond)
	if readable(freed.rfd, 0) {
		t.Errorf("notify byte on the freed queue")
	}
}

// Closing with the link stalled: the waiting send ends with CN_CLOSED before the close's result;
// the close ends within drain_timeout, and what it could not send is in its statistics (lost)
// and in a warning.
func TestCloseLosesStalledPublishes(t *testing.T) {
	s := newStall(t, 30)
	accepted, op, _ := s.fill(0)
	closedQ := newQueue(t)
	start := time.Now()
	if st := cnClose(s.c.h, closedQ.h, 0); st != cnPending {
		t.Fatalf("cn_close: %s", name(st))
	}
	r := closedQ.one()
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the close took %s with drain_timeout 0.5 on a stalled link", took)
	}
	if r.Op != s.c.h || r.Status != cnOK {
		t.Fatalf("close result %v", r)
	}
	sent := s.q.takeNow()
	if len(sent) != 1 || sent[0].Op != op || sent[0].Status != cnClosed {
		t.Errorf("the waiting send's results when the close's came: %v, want one CN_CLOSED", sent)
	}
	st := parseStats(t, r.Text)
	if stat(st, "lost.messages") < 1 || stat(st, "lost.bytes") < stalledBodySize || stat(st, "published") != float64(1+accepted) {
		t.Errorf("final statistics: lost %v published %v, want publishes lost (at least one of %d bytes) and %d published",
			st["lost"], st["published"], stalledBodySize, 1+accepted)
	}
	warned := false
	for _, rec := range s.c.log.snapshot() {
		warned = warned || rec.Level == cnLogWarning && strings.Contains(rec.Message, "lost")
	}
	if !warned {
		t.Errorf("no warning about the lost publishes: %v", s.c.log.snapshot())
	}
}
