//go:build linux

package abitest

import (
	"sync/atomic"
	"testing"
	"time"
)

// rearm is what a host does to start a receive over without a call: a compare-and-swap of the
// result's word from its op to ~op (include/channels_nats.h).
func rearm(r result) bool {
	if r.Rearm == 0 {
		return false
	}
	return (*atomic.Uint64)(ptr(r.Rearm)).CompareAndSwap(r.Op, ^r.Op)
}

// tookParked is tookOne's result, which must carry a word: its receive parked.
func (s cancelSetup) tookParked(n int) result {
	s.c.t.Helper()
	r := s.tookOne(n)
	if r.Rearm == 0 {
		s.c.t.Fatalf("result %v without a word", r)
	}
	return r
}

// sendFor sends message n on the setup's channel and takes its one result, which must be op's.
func (s cancelSetup) sendFor(op uint64, n int) result {
	s.c.t.Helper()
	s.sender.send(s.ch, numbered(s.c.t, n))
	got := s.q.one()
	if got.Op != op || numberOf(got.Data) != n {
		s.c.t.Fatalf("result %v, want op %d n=%d", got, op, n)
	}
	return got
}

// armedOne is tookParked's receive, armed again through its word.
func (s cancelSetup) armedOne(n int) result {
	s.c.t.Helper()
	r := s.tookParked(n)
	if !rearm(r) {
		s.c.t.Fatalf("arming %v failed", r)
	}
	return r
}

// A receive armed through its word waits again as the same operation, message after message,
// each delivered once, with no call between them.
func TestRearmWaitsAsTheSameOperation(t *testing.T) {
	s := newCancelSetup(t, nil)
	closure := newClosure()
	op := s.c.receivePendingFor(s.ch, s.q, closure)
	s.sender.send(s.ch, numbered(t, 1))
	r := s.q.one()
	word := r.Rearm
	for want := 2; want <= 5; want++ {
		if !rearm(r) {
			t.Fatalf("arming before message %d failed (word %#x)", want, r.Rearm)
		}
		if rearm(r) {
			t.Fatalf("arming twice before message %d succeeded", want)
		}
		s.sender.send(s.ch, numbered(t, want))
		r = s.q.one()
		if r.Op != op || r.Closure != closure || r.Status != cnOK || numberOf(r.Data) != want || r.Rearm != word {
			t.Fatalf("result %v, want op %d closure %d n=%d with word %#x", r, op, closure, want, word)
		}
	}
	if d := s.delivered(); d != 5 {
		t.Errorf("delivered = %v, want 5", d)
	}
	s.c.nothingWaiting(s.ch)
}

// A message that reaches the mailbox while the receive is parked revokes the park: arming fails,
// and the start-over by call returns that message. Messages keep their order.
func TestRearmFailsWhenAMessageWaits(t *testing.T) {
	s := newCancelSetup(t, nil)
	r := s.tookParked(1)
	s.sender.send(s.ch, numbered(t, 2))
	s.sender.send(s.ch, numbered(t, 3))
	s.c.barrier(s.sender)
	if rearm(r) {
		t.Fatal("arming with messages waiting succeeded")
	}
	for want := 2; want <= 3; want++ {
		if st, body, msg := s.receiveAgain(r.Op); st != cnOK || numberOf(body) != want {
			t.Fatalf("a start-over with message %d waiting: %s n=%d (%q)", want, name(st), numberOf(body), msg)
		}
	}
	if st, _, _ := s.receiveAgain(r.Op); st != cnPending {
		t.Fatalf("a start-over on an empty mailbox: %s, want CN_PENDING", name(st))
	}
	s.sendFor(r.Op, 4)
}

// A park lasts until the queue's next take: then arming fails and the receive has ended. An
// armed receive outlives the take and gets its message.
func TestRearmUntilTheNextTake(t *testing.T) {
	s := newCancelSetup(t, nil)
	r := s.tookParked(1)
	if got := s.q.take(4); len(got) != 0 {
		t.Fatalf("unexpected results %v", got)
	}
	if rearm(r) {
		t.Error("arming after the next take succeeded")
	}
	if st, _, _ := s.receiveAgain(r.Op); st != cnNotPending {
		t.Errorf("a start-over after the next take: %s, want CN_NOT_PENDING", name(st))
	}

	r = s.armedOne(2)
	if got := s.q.take(4); len(got) != 0 {
		t.Fatalf("unexpected results %v", got)
	}
	s.sendFor(r.Op, 3)
}

// The word of an ended receive goes to another receive, whose key is its own op: the old op's
// swap changes nothing there.
func TestRearmWithAStaleWordChangesNothing(t *testing.T) {
	s := newCancelSetup(t, nil)
	old := s.tookParked(1)
	s.q.take(4) // old has ended: its word goes back
	r := s.tookParked(2)
	stale := old
	stale.Rearm = r.Rearm // the pool hands words out again; the test makes sure it is this one
	if rearm(stale) {
		t.Fatal("a swap with an ended receive's op armed another receive")
	}
	if !rearm(r) {
		t.Fatal("arming failed")
	}
	s.sendFor(r.Op, 3)
}

// cn_cancel of an armed receive withdraws it and loses nothing; of one whose next message was
// handed over, it gives that message back; a parked receive that was not armed gives back its
// last message, as any taken result does.
func TestRearmCancel(t *testing.T) {
	s := newCancelSetup(t, nil)
	r := s.armedOne(1)
	if st, msg := s.cancel(r.Op); st != cnOK {
		t.Fatalf("cn_cancel of an armed receive: %s (%q), want CN_OK", name(st), msg)
	}
	s.sender.send(s.ch, numbered(t, 2))
	s.c.barrier(s.sender)
	s.q.quiet(20 * time.Millisecond)
	if n := numberOf(s.c.receiveNow(s.ch)); n != 2 {
		t.Errorf("after the cancel the next receive got n=%d, want 2 (message 1 stays consumed)", n)
	}

	r = s.armedOne(3)
	s.sender.send(s.ch, numbered(t, 4))
	s.sender.send(s.ch, numbered(t, 5))
	if got := s.q.one(); got.Op != r.Op || numberOf(got.Data) != 4 {
		t.Fatalf("result %v, want op %d n=4", got, r.Op)
	}
	s.c.barrier(s.sender)
	if st, msg := s.cancel(r.Op); st != cnOK {
		t.Fatalf("cn_cancel of a taken result of an armed receive: %s (%q), want CN_OK", name(st), msg)
	}
	for want := 4; want <= 5; want++ {
		if n := numberOf(s.c.receiveNow(s.ch)); n != want {
			t.Errorf("after the give-back: n=%d, want %d", n, want)
		}
	}

	r = s.tookParked(6)
	if st, msg := s.cancel(r.Op); st != cnOK {
		t.Fatalf("cn_cancel of a parked receive's result: %s (%q), want CN_OK", name(st), msg)
	}
	if rearm(r) {
		t.Error("arming after the result was given back succeeded")
	}
	if n := numberOf(s.c.receiveNow(s.ch)); n != 6 {
		t.Errorf("after giving back a parked receive's message: n=%d, want 6", n)
	}
	if d := s.delivered(); d != 8 {
		t.Errorf("delivered = %v, want 8 (six messages and two barriers; a given back one counts once)", d)
	}
}

// An armed receive ends with CN_CLOSED when its client closes, as a waiting one does.
func TestRearmClose(t *testing.T) {
	s := newCancelSetup(t, nil)
	r := s.armedOne(1)
	closed := newQueue(t)
	if st := cnClose(s.c.h, closed.h, newClosure()); st != cnPending {
		t.Fatalf("cn_close: %s, want CN_PENDING", name(st))
	}
	closed.one()
	got := s.q.takeNow()
	if len(got) != 1 || got[0].Op != r.Op || got[0].Status != cnClosed || got[0].Rearm != 0 {
		t.Fatalf("results %v, want op %d CN_CLOSED without a word", got, r.Op)
	}
}

// Freeing the queue withdraws an armed receive: the next receive, on another queue, gets the
// message.
func TestRearmQueueFree(t *testing.T) {
	s := newCancelSetup(t, nil)
	r := s.armedOne(1)
	if st := cnQueueFree(s.q.h); st != cnOK {
		t.Fatalf("cn_queue_free: %s", name(st))
	}
	if st, _ := s.cancel(r.Op); st != cnNotPending {
		t.Errorf("cn_cancel of the armed receive after cn_queue_free: %s, want CN_NOT_PENDING (withdrawn)", name(st))
	}
	s.sender.send(s.ch, numbered(t, 2))
	s.c.barrier(s.sender)
	if n := numberOf(s.c.receiveNow(s.ch)); n != 2 {
		t.Errorf("after cn_queue_free the next receive got n=%d, want 2", n)
	}
}

// The first receive of a plain channel waits for its subscription and is not parked after its
// message: arming fails, and the start-over by call makes it one that parks from then on.
func TestRearmFirstReceiveOfAPlainChannel(t *testing.T) {
	ts := startServer(t)
	c, sender := connect(t, ts.url, nil), connect(t, ts.url, nil)
	ch := uniq(t, "plain")
	q := newQueue(t)
	s := cancelSetup{c: c, sender: sender, ch: ch, q: q}
	op := c.receivePending(ch, q)
	ts.waitInterest(t, "channels.ch."+ch)
	sender.send(ch, numbered(t, 1))
	r := q.one()
	if r.Op != op || numberOf(r.Data) != 1 {
		t.Fatalf("result %v, want op %d n=1", r, op)
	}
	if rearm(r) {
		t.Fatal("arming the first receive of a plain channel succeeded")
	}
	if st, _, msg := s.receiveAgain(op); st != cnPending {
		t.Fatalf("a start-over: %s (%q), want CN_PENDING", name(st), msg)
	}
	for want := 2; want <= 3; want++ {
		sender.send(ch, numbered(t, want))
		r = q.one()
		if r.Op != op || numberOf(r.Data) != want {
			t.Fatalf("result %v, want op %d n=%d", r, op, want)
		}
		if want == 2 && !rearm(r) {
			t.Fatal("arming after a start-over by call failed")
		}
	}
}
