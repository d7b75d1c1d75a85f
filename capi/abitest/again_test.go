//go:build linux

package abitest

import (
	"testing"
	"time"
)

// receiveAgain is cn_receive with channel NULL, starting receive op over on the setup's queue,
// with its cn_last_error(): the status, the body of a message that was waiting (CN_OK), and the
// detail. *op must come back as op with CN_PENDING, else 0.
func (s cancelSetup) receiveAgain(op uint64) (int32, []byte, string) {
	s.c.t.Helper()
	return s.receiveAgainOn(op, s.q)
}

func (s cancelSetup) receiveAgainOn(op uint64, q *queue) (int32, []byte, string) {
	s.c.t.Helper()
	out, n := uintptr(0xbad), uintptr(0xbad) // garbage: the library must write them
	inout := op
	st, msg := onThread(func() int32 { return cnReceive(s.c.h, nil, q.h, 0, &out, &n, &inout) })
	if want := map[bool]uint64{true: op, false: 0}[st == cnPending]; inout != want {
		s.c.t.Errorf("cn_receive starting %d over: %s with *op %d, want %d", op, name(st), inout, want)
	}
	switch {
	case st == cnOK && out != 0:
		return st, cBytes(out, n), msg
	case out != 0 || n != 0:
		s.c.t.Errorf("cn_receive starting over: %s with body %#x, len %d; want NULL and 0", name(st), out, n)
	}
	return st, nil, msg
}

// takeReceived waits for the one result of op on the setup's queue, a message, and returns its
// number.
func (s cancelSetup) takeReceived(op uint64, closure uintptr) int {
	s.c.t.Helper()
	r := s.q.one()
	if r.Op != op || r.Closure != closure || r.Status != cnOK || !r.HasData {
		s.c.t.Fatalf("result %v, want op %d, closure %d, CN_OK with a message", r, op, closure)
	}
	return numberOf(r.Data)
}

// tookOne starts a receive on the setup's channel that waits, sends it message n, and takes its
// result with one take of the setup's queue: the receive can start over until the next take.
func (s cancelSetup) tookOne(n int) result {
	s.c.t.Helper()
	op := s.c.receivePending(s.ch, s.q)
	s.sender.send(s.ch, numbered(s.c.t, n))
	r := s.q.one()
	if r.Op != op || numberOf(r.Data) != n {
		s.c.t.Fatalf("result %v, want op %d n=%d", r, op, n)
	}
	return r
}

// A receive whose result the last take handed over starts over as the same operation: it waits
// again, and its next message comes under the same op and closure, as many times as the host
// asks, each message delivered once.
func TestReceiveAgainWaitsAsTheSameOperation(t *testing.T) {
	s := newCancelSetup(t, nil)
	closure := newClosure()
	op := s.c.receivePendingFor(s.ch, s.q, closure)
	s.sender.send(s.ch, numbered(t, 1))
	if n := s.takeReceived(op, closure); n != 1 {
		t.Fatalf("first result n=%d, want 1", n)
	}
	for want := 2; want <= 4; want++ {
		if st, body, msg := s.receiveAgain(op); st != cnPending {
			t.Fatalf("a start-over before message %d: %s n=%d (%q), want CN_PENDING", want, name(st), numberOf(body), msg)
		}
		s.sender.send(s.ch, numbered(t, want))
		if n := s.takeReceived(op, closure); n != want {
			t.Fatalf("result n=%d, want %d", n, want)
		}
	}
	if d := s.delivered(); d != 4 {
		t.Errorf("delivered = %v, want 4", d)
	}
	s.c.nothingWaiting(s.ch)
}

// A message that is waiting already is returned by the call, in order, and the operation can
// start over after it too, until it waits again.
func TestReceiveAgainReturnsAWaitingMessage(t *testing.T) {
	s := newCancelSetup(t, nil)
	op := s.tookOne(1).Op
	s.sender.send(s.ch, numbered(t, 2))
	s.sender.send(s.ch, numbered(t, 3))
	s.c.barrier(s.sender)
	for want := 2; want <= 3; want++ {
		if st, body, msg := s.receiveAgain(op); st != cnOK || numberOf(body) != want {
			t.Fatalf("a start-over with message %d waiting: %s n=%d (%q)", want, name(st), numberOf(body), msg)
		}
	}
	if st, body, _ := s.receiveAgain(op); st != cnPending {
		t.Fatalf("a start-over on an empty mailbox: %s n=%d, want CN_PENDING", name(st), numberOf(body))
	}
	s.sender.send(s.ch, numbered(t, 4))
	if r := s.q.one(); r.Op != op || numberOf(r.Data) != 4 {
		t.Fatalf("result %v, want op %d n=4", r, op)
	}
}

// The chance to start over ends with the queue's next take, as the chance to give the result
// back does; before the result was taken there is none, nor for a cancelled receive, an unknown
// handle or another client's receive. A refused call changes nothing.
func TestReceiveAgainRefusals(t *testing.T) {
	s := newCancelSetup(t, nil)
	op := s.c.receivePending(s.ch, s.q)
	s.sender.send(s.ch, numbered(t, 1))
	s.c.barrier(s.sender)
	if st, _, msg := s.receiveAgain(op); st != cnNotPending || msg == "" {
		t.Errorf("a start-over before the result was taken: %s (%q), want CN_NOT_PENDING with a detail", name(st), msg)
	}
	if r := s.q.one(); r.Op != op || numberOf(r.Data) != 1 {
		t.Fatalf("result %v, want op %d n=1", r, op)
	}
	other := op
	if st, _ := onThread(func() int32 { var out, n uintptr; return cnReceive(s.sender.h, nil, s.q.h, 0, &out, &n, &other) }); st != cnNotPending {
		t.Errorf("starting over another client's receive: %s, want CN_NOT_PENDING", name(st))
	}
	if st, _, msg := s.receiveAgain(0); st != cnInvalidArg || msg == "" {
		t.Errorf("cn_receive with channel NULL and *op 0: %s (%q), want CN_INVALID_ARG with a detail", name(st), msg)
	}
	if st, _, msg := s.receiveAgain(1 << 62); st != cnInvalidHandle || msg == "" {
		t.Errorf("starting over op 1<<62: %s (%q), want CN_INVALID_HANDLE with a detail", name(st), msg)
	}
	if st, _, msg := s.receiveAgainOn(op, s.c.own); st != cnInvalidArg || msg == "" {
		t.Errorf("starting over with another queue: %s (%q), want CN_INVALID_ARG with a detail", name(st), msg)
	}
	if st, _ := onThread(func() int32 { var n uintptr; inout := op; return cnReceive(s.c.h, nil, s.q.h, 0, nil, &n, &inout) }); st != cnInvalidArg {
		t.Errorf("starting over with body NULL: %s, want CN_INVALID_ARG", name(st))
	}
	if got := s.q.take(16); len(got) != 0 { // the next take: the result is kept for good
		t.Fatalf("unexpected results %v", got)
	}
	if st, _, _ := s.receiveAgain(op); st != cnNotPending {
		t.Errorf("a start-over after the next take: %s, want CN_NOT_PENDING", name(st))
	}

	cancelled := s.c.receivePending(s.ch, s.q)
	if st, _ := s.cancel(cancelled); st != cnOK {
		t.Fatalf("cn_cancel: %s", name(st))
	}
	if st, _, _ := s.receiveAgain(cancelled); st != cnNotPending {
		t.Errorf("a start-over of a cancelled receive: %s, want CN_NOT_PENDING", name(st))
	}
	s.sender.send(s.ch, numbered(t, 2))
	s.c.barrier(s.sender)
	if n := numberOf(s.c.receiveNow(s.ch)); n != 2 {
		t.Errorf("the next receive by name got n=%d, want 2", n)
	}
	s.q.quiet(20 * time.Millisecond)
}

// cn_cancel of a receive that started over withdraws it while it waits, and gives back its new
// message once taken, but never the message it had before: the host consumed that one.
func TestReceiveAgainCancel(t *testing.T) {
	s := newCancelSetup(t, nil)
	op := s.tookOne(1).Op
	if st, _, _ := s.receiveAgain(op); st != cnPending {
		t.Fatalf("a start-over: %s, want CN_PENDING", name(st))
	}
	if st, msg := s.cancel(op); st != cnOK {
		t.Fatalf("cn_cancel of a receive waiting again: %s (%q), want CN_OK", name(st), msg)
	}
	s.q.quiet(20 * time.Millisecond)
	s.c.nothingWaiting(s.ch) // message 1 stays consumed

	op = s.tookOne(2).Op
	if st, _, _ := s.receiveAgain(op); st != cnPending {
		t.Fatalf("a start-over: %s, want CN_PENDING", name(st))
	}
	s.sender.send(s.ch, numbered(t, 3))
	s.sender.send(s.ch, numbered(t, 4))
	if r := s.q.one(); r.Op != op || numberOf(r.Data) != 3 {
		t.Fatalf("result %v, want op %d n=3", r, op)
	}
	s.c.barrier(s.sender)
	if st, msg := s.cancel(op); st != cnOK {
		t.Fatalf("cn_cancel of a taken result of a receive that started over: %s (%q), want CN_OK", name(st), msg)
	}
	for want := 3; want <= 4; want++ {
		if n := numberOf(s.c.receiveNow(s.ch)); n != want {
			t.Errorf("after the give-back: n=%d, want %d", n, want)
		}
	}
	if d := s.delivered(); d != 5 {
		t.Errorf("delivered = %v, want 5 (four messages and the barrier's): the given back message counts once", d)
	}
	if st, _, _ := s.receiveAgain(op); st != cnNotPending {
		t.Errorf("a start-over after cn_cancel: %s, want CN_NOT_PENDING", name(st))
	}
}

// A mailbox that was flushed since is not the channel's any more: the receive cannot start
// over there, and a receive by name makes the new mailbox.
func TestReceiveAgainAfterFlush(t *testing.T) {
	s := newCancelSetup(t, nil)
	op := s.tookOne(1).Op
	if st, msg := onThread(func() int32 { return cnFlush(s.c.h) }); st != cnOK {
		t.Fatalf("cn_flush: %s (%s)", name(st), msg)
	}
	if st, _, msg := s.receiveAgain(op); st != cnNotPending || msg == "" {
		t.Errorf("a start-over after cn_flush: %s (%q), want CN_NOT_PENDING with a detail", name(st), msg)
	}
	s.q.quiet(20 * time.Millisecond)
}

// Receives that one take handed over start over in any order, not only in the order of the
// take: each waits again as its own operation and gets its channel's next message.
func TestReceiveAgainInAnyOrder(t *testing.T) {
	s := newCancelSetup(t, nil)
	const receives = 12
	channels, ops := make([]string, receives), make([]uint64, receives)
	for i := range channels {
		channels[i] = s.c.newChannel("")
		ops[i] = s.c.receivePending(channels[i], s.q)
	}
	reverse, evensFirst := make([]int, receives), make([]int, 0, receives)
	for i := range reverse {
		reverse[i] = receives - 1 - i
	}
	for _, odd := range []int{0, 1} {
		for i := odd; i < receives; i += 2 {
			evensFirst = append(evensFirst, i)
		}
	}
	for round, order := range [][]int{reverse, evensFirst} {
		for i, ch := range channels {
			s.sender.send(ch, numbered(t, 100*round+i))
		}
		s.c.barrier(s.sender)
		got := s.q.take(2 * receives) // one take: all of them can start over until the next
		if len(got) != receives {
			t.Fatalf("round %d: %d results in one take, want %d", round, len(got), receives)
		}
		for i, r := range got {
			if r.Op != ops[i] || numberOf(r.Data) != 100*round+i {
				t.Fatalf("round %d: result %d is %v, want op %d n=%d", round, i, r, ops[i], 100*round+i)
			}
		}
		for _, i := range order {
			if st, body, msg := s.receiveAgain(ops[i]); st != cnPending {
				t.Fatalf("round %d: starting receive %d over: %s n=%d (%q), want CN_PENDING", round, i, name(st), numberOf(body), msg)
			}
		}
	}
	for i, ch := range channels {
		s.sender.send(ch, numbered(t, 1000+i))
	}
	s.c.barrier(s.sender)
	got := s.q.take(2 * receives)
	if len(got) != receives {
		t.Fatalf("%d results after the last start-overs, want %d", len(got), receives)
	}
	for i, r := range got {
		if r.Op != ops[i] || numberOf(r.Data) != 1000+i {
			t.Fatalf("result %d after the last start-overs is %v, want op %d n=%d", i, r, ops[i], 1000+i)
		}
	}
}
