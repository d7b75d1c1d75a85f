//go:build linux

package abitest

import (
	"bytes"
	"testing"
	"time"
)

func TestGroupFanOut(t *testing.T) {
	ts := startServer(t)
	a := connect(t, ts.url, nil)
	b := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	group := uniq(t, "room")
	members := []struct {
		c  *client
		ch string
	}{{a, a.newChannel("")}, {a, a.newChannel("")}, {b, b.newChannel("")}}
	for _, m := range members {
		m.c.groupAdd(group, m.ch)
		m.c.groupAdd(group, m.ch) // twice is not an error
	}
	q := newQueue(t)
	ops := map[uint64]bool{}
	for _, m := range members {
		ops[m.c.receivePending(m.ch, q)] = true
	}
	body := pack(t, map[string]any{"type": "chat.message", "text": "hi"})
	sender.groupSend(group, body)
	for op, r := range byOp(t, q.wait(len(members))) {
		if !ops[op] || r.Status != cnOK || !bytes.Equal(r.Data, body) {
			t.Errorf("member result %v, want CN_OK with the body", r)
		}
	}
	// Exactly one each: after the traffic has arrived, nothing more is waiting.
	a.barrier(sender)
	b.barrier(sender)
	for _, m := range members {
		m.c.nothingWaiting(m.ch)
	}
	// A group without members is no error; a discarded member gets nothing.
	sender.groupSend(uniq(t, "empty"), body)
	for range 2 { // removing a non-member is not an error either
		if st, msg := onThread(func() int32 { return cnGroupDiscard(a.h, cs(group), cs(members[0].ch)) }); st != cnOK || msg != "" {
			t.Errorf("cn_group_discard: %s (%q)", name(st), msg)
		}
	}
	sender.groupSend(group, numbered(t, 2))
	if n := numberOf(a.receiveAny(members[1].ch)); n != 2 {
		t.Errorf("remaining member got n=%d", n)
	}
	a.barrier(sender)
	a.nothingWaiting(members[0].ch)
	q.quiet(20 * time.Millisecond)
}

// groupSetup is a client with a process channel, a sender, and a queue for group_adds.
type groupSetup struct {
	t         *testing.T
	c, sender *client
	ch        string
	q         *queue
}

func newGroupSetup(t *testing.T) groupSetup {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	return groupSetup{t: t, c: c, sender: connect(t, ts.url, nil), ch: c.newChannel(""), q: newQueue(t)}
}

// startAdd starts a group_add of the channel to a new group, which must be pending: the group's
// subscription is new.
func (s groupSetup) startAdd() (group string, op uint64) {
	s.t.Helper()
	group = uniq(s.t, "g")
	st, msg := onThread(func() int32 { return cnGroupAdd(s.c.h, cs(group), cs(s.ch), s.q.h, 0, &op) })
	if st != cnPending || op == 0 {
		s.t.Fatalf("cn_group_add to a new group: %s (%q) op %d, want CN_PENDING with an op", name(st), msg, op)
	}
	return group, op
}

// member reports whether a group message reaches the channel.
func (s groupSetup) member(group string) bool {
	s.t.Helper()
	s.sender.groupSend(group, numbered(s.t, 5))
	s.c.barrier(s.sender)
	st, body, op := s.c.receive(s.ch, nil, 0)
	switch st {
	case cnOK:
		if numberOf(body) != 5 {
			s.t.Fatalf("the channel held n=%d", numberOf(body))
		}
		return true
	case cnPending:
		cnCancel(s.c.h, op)
		return false
	}
	s.t.Fatalf("cn_receive: %s", name(st))
	return false
}

// A pending group_add's result: its op, CN_OK, text and data NULL; the channel is a member. One
// kept past the next take stays (cn_cancel is CN_NOT_PENDING).
func TestGroupAddPending(t *testing.T) {
	s := newGroupSetup(t)
	group, op := s.startAdd()
	if r := s.q.one(); r.Op != op || r.Status != cnOK || r.HasText || r.HasData {
		t.Fatalf("group_add result %v (text %v data %v), want op %d CN_OK, text and data NULL", r, r.HasText, r.HasData, op)
	}
	s.q.take(4)
	if st := cnCancel(s.c.h, op); st != cnNotPending {
		t.Errorf("cn_cancel after the next take: %s, want CN_NOT_PENDING", name(st))
	}
	if !s.member(group) {
		t.Error("a group_add that finished left no membership")
	}
}

// A group_add cancelled at any point before the next take leaves no membership: while it waits
// for the server, with its result in the queue, and with its result taken.
func TestGroupAddCancelled(t *testing.T) {
	s := newGroupSetup(t)
	for _, when := range []string{"pending", "result queued", "result taken"} {
		group, op := s.startAdd()
		switch when {
		case "result queued":
			if !readable(s.q.rfd, wait) {
				t.Fatalf("no notify byte for the group_add's result")
			}
		case "result taken":
			if r := s.q.one(); r.Op != op || r.Status != cnOK {
				t.Fatalf("group_add result %v", r)
			}
		}
		if st, msg := onThread(func() int32 { return cnCancel(s.c.h, op) }); st != cnOK {
			t.Fatalf("%s: cn_cancel of a group_add: %s (%q), want CN_OK", when, name(st), msg)
		}
		if got := s.q.takeNow(); len(got) != 0 {
			t.Errorf("%s: a withdrawn group_add's result was taken: %v", when, got)
		}
		if s.member(group) {
			t.Errorf("%s: a cancelled group_add left a membership", when)
		}
	}
	if n := stat(s.c.stats(), "groups"); n != 0 {
		t.Errorf("stats: groups = %v after three cancelled group_adds, want 0", n)
	}
}
