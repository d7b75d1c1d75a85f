//go:build linux

package abitest

import (
	"strings"
	"testing"
	"time"
)

// A pending group_add completes through its callback; one cancelled in time leaves no
// membership behind.
func TestGroupAddPending(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")

	// Completed: the callback says CN_OK and the channel is a member.
	group := uniq(t, "g1")
	w := newWaiter(2, nil)
	var op uint64
	switch st := cnGroupAdd(c.h, cs(group), cs(ch), completeCB, w.closure, &op); st {
	case cnOK:
	case cnPending:
		if op == 0 {
			t.Error("pending cn_group_add with op 0")
		}
		if r := w.wait(t); r.Status != cnOK {
			t.Fatalf("group_add callback: %s (%s)", name(r.Status), r.Text)
		}
	default:
		t.Fatalf("cn_group_add: %s", name(st))
	}
	sender.groupSend(group, numbered(t, 1))
	if got := numberOf(c.receiveAny(ch)); got != 1 {
		t.Errorf("member got n=%d, want 1", got)
	}

	// Cancelled: no membership, no callback.
	group = uniq(t, "g2")
	cancelled := newWaiter(2, nil)
	op = 0
	st := cnGroupAdd(c.h, cs(group), cs(ch), completeCB, cancelled.closure, &op)
	if st != cnPending {
		t.Fatalf("cn_group_add on a new group: %s, want CN_PENDING (its subscription is not confirmed yet)", name(st))
	}
	member := false
	switch st := cnCancel(c.h, op); st {
	case cnOK:
		cancelled.none(t, 100*time.Millisecond)
	case cnNotPending: // it finished first
		if r := cancelled.wait(t); r.Status != cnOK {
			t.Fatalf("group_add callback: %s", name(r.Status))
		}
		member = true
		t.Log("the group_add finished before the cancel; membership not checked")
	default:
		t.Fatalf("cn_cancel of a pending group_add: %s", name(st))
	}
	if !member {
		sender.groupSend(group, numbered(t, 2))
		c.barrier(sender)
		probe := newWaiter(1, nil)
		if st, body, op := c.receive(ch, probe); st != cnPending {
			t.Errorf("a cancelled group_add left a membership: the group send arrived (%s, n=%d)", name(st), numberOf(body))
		} else {
			cnCancel(c.h, op)
		}
	}
}

// cn_flush empties the mailboxes and ends memberships; a waiting receive keeps waiting.
func TestFlush(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	waiting, full := c.newChannel(""), c.newChannel("")
	group := uniq(t, "g")
	c.groupAdd(group, full)
	w := newWaiter(2, nil)
	c.receivePending(waiting, w)
	sender.send(full, numbered(t, 1))
	c.barrier(sender)
	if st, msg := onThread(func() int32 { return cnFlush(c.h) }); st != cnOK || msg != "" {
		t.Fatalf("cn_flush: %s (%q)", name(st), msg)
	}
	// The waiting receive still waits, and still gets what is sent to it.
	w.none(t, 20*time.Millisecond)
	sender.send(waiting, numbered(t, 2))
	if r := w.wait(t); r.Status != cnOK || numberOf(r.Data) != 2 {
		t.Errorf("waiting receive after cn_flush: %s n=%d, want CN_OK n=2", name(r.Status), numberOf(r.Data))
	}
	// The message that waited in a mailbox is gone, and so is the membership.
	probe := newWaiter(2, nil)
	st, body, op := c.receive(full, probe)
	if st != cnPending {
		t.Fatalf("after cn_flush the mailbox still held n=%d (%s)", numberOf(body), name(st))
	}
	sender.groupSend(group, numbered(t, 3))
	c.barrier(sender)
	probe.none(t, 20*time.Millisecond)
	cnCancel(c.h, op)
	if s := c.stats(); s["groups"] != float64(0) {
		t.Errorf("stats after cn_flush: groups = %v, want 0", s["groups"])
	}
}

// Receiving on the prefix "specific.<id>!" of this client gets the messages of its process
// channels that have no mailbox of their own.
func TestProcessPrefixReceive(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	prefix := ch[:strings.IndexByte(ch, '!')+1]
	w := newWaiter(2, nil)
	c.receivePending(prefix, w)
	unmade := prefix + strings.Repeat("ab", 16)
	sender.send(unmade, numbered(t, 1))
	if r := w.wait(t); r.Status != cnOK || numberOf(r.Data) != 1 {
		t.Errorf("prefix receive: %s n=%d, want CN_OK n=1", name(r.Status), numberOf(r.Data))
	}
	// A channel with its own mailbox keeps its messages.
	w2 := newWaiter(2, nil)
	c.receivePending(prefix, w2)
	sender.send(ch, numbered(t, 2))
	c.barrier(sender)
	if got := numberOf(c.receiveNow(ch)); got != 2 {
		t.Errorf("own mailbox got n=%d", got)
	}
	w2.none(t, 20*time.Millisecond)
}
