package layer

// Tests of the mailbox rules that the host-side buffers used to cover (S2, S4, S14): the expiry
// boundary (a message that waited exactly expiry is expired), Op.Retract giving a delivered
// message back with its arrival time and its place (put-back order) and taking a membership
// back, capacity with a slow reader, and cancelled receives that race a delivery without
// losing the message. Against a real embedded nats-server where a message travels.

import (
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/channels-nats/channels-nats/internal/faultproxy"
)

// mbTake takes the next message of channel without waiting: it must be there.
func mbTake(t testing.TB, l *Layer, channel string) Message {
	t.Helper()
	msg, op, err := l.StartReceive(channel, func(Message, error) { t.Error("callback of a receive that finished at once") })
	if err != nil {
		t.Fatalf("StartReceive(%s): %v", channel, err)
	}
	if op != nil {
		op.Cancel()
		t.Fatalf("StartReceive(%s) had to wait; a message should have been there", channel)
	}
	return msg
}

// mbWaiting lists the n of every message waiting in the mailbox of channel, in order.
func mbWaiting(t testing.TB, l *Layer, channel string) []string {
	t.Helper()
	l.mu.Lock()
	var bodies [][]byte
	if mb := l.mailboxes[channel]; mb != nil {
		for _, e := range mb.entries {
			bodies = append(bodies, e.body)
		}
	}
	l.mu.Unlock()
	ns := make([]string, len(bodies))
	for i, b := range bodies {
		ns[i] = lcN(t, b)
	}
	return ns
}

func mbSame(t testing.TB, what string, got []string, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: got %q, want %q", what, got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: got %q, want %q", what, got, want)
		}
	}
}

// mbFill sends ns to channel of a from b and waits until they all wait in a's mailbox.
func mbFill(t testing.TB, a, b *Layer, channel string, ns ...string) {
	t.Helper()
	before := lcEntries(a, channel)
	for _, n := range ns {
		lcSend(t, b, channel, n)
	}
	waitFor(t, 5*time.Second, "the messages in the mailbox", func() bool { return lcEntries(a, channel) == before+len(ns) })
}

// TestMailboxExpiryBoundary (S4): the one expiry rule: a message that has waited expiry or
// longer is expired, one that waited a nanosecond less is not; pop and push apply it.
func TestMailboxExpiryBoundary(t *testing.T) {
	const expiry = time.Second
	at := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	for _, tc := range []struct {
		waited time.Duration
		want   bool
	}{
		{0, false}, {expiry - time.Nanosecond, false}, {expiry, true}, {expiry + time.Nanosecond, true}, {time.Hour, true},
	} {
		if got := expired(at, at.Add(tc.waited), expiry); got != tc.want {
			t.Errorf("expired after waiting %s of %s = %v, want %v", tc.waited, expiry, got, tc.want)
		}
	}

	mb := newMailbox("specific.abc!def", 2, at)
	if ok, _ := mb.push(entry{at, []byte("old")}, expiry); !ok {
		t.Fatal("push into an empty mailbox refused")
	}
	if ok, _ := mb.push(entry{at.Add(time.Nanosecond), []byte("younger")}, expiry); !ok {
		t.Fatal("push of the second message refused")
	}
	// Exactly expiry after the first arrival: the first is expired, the second is not.
	e, ok, dropped := mb.pop(at.Add(expiry), expiry)
	if !ok || string(e.body) != "younger" || dropped != 1 {
		t.Fatalf("pop at exactly expiry: %q, %v, dropped %d; want the younger message and 1 dropped", e.body, ok, dropped)
	}
	// A full mailbox makes room by reclaiming what is expired exactly at the new arrival.
	mb = newMailbox("specific.abc!def", 1, at)
	mb.push(entry{at, []byte("old")}, expiry)
	if ok, dropped := mb.push(entry{at.Add(expiry - time.Nanosecond), []byte("early")}, expiry); ok || dropped != 0 {
		t.Fatalf("push into a full mailbox a nanosecond before expiry: ok %v, dropped %d; want refused", ok, dropped)
	}
	if ok, dropped := mb.push(entry{at.Add(expiry), []byte("new")}, expiry); !ok || dropped != 1 {
		t.Fatalf("push into a full mailbox at exactly expiry: ok %v, dropped %d; want accepted after reclaiming 1", ok, dropped)
	}
}

// mbHanded is a message delivered to a receive that waited for it, and that receive's Op.
type mbHanded struct {
	msg Message
	op  *Op
}

// mbHand starts a receive on the empty mailbox of channel, sends n to it from b and returns
// what the receive's callback got.
func mbHand(t testing.TB, a, b *Layer, channel, n string) mbHanded {
	t.Helper()
	got := make(chan Message, 1)
	_, op, err := a.StartReceive(channel, func(m Message, err error) {
		if err != nil {
			t.Errorf("callback error: %v", err)
		}
		got <- m
	})
	if err != nil || op == nil {
		t.Fatalf("StartReceive(%s): op=%v err=%v, want a pending receive", channel, op, err)
	}
	msgAwaitListed(t, a, channel, op)
	lcSend(t, b, channel, n)
	select {
	case m := <-got:
		if lcN(t, m.Body) != n {
			t.Fatalf("the receive got %q, want %q", lcN(t, m.Body), n)
		}
		return mbHanded{m, op}
	case <-time.After(5 * time.Second):
		t.Fatalf("the receive on %s got nothing", channel)
	}
	return mbHanded{}
}

// TestMailboxRetractKeepsArrivalTime (S4, S14): a message given back by Retract keeps the time
// it reached this process: retracted before its expiry it is received again with that time;
// retracted once its expiry has come it is dropped and counted as expired at once; retracted
// shortly before, it expires in the mailbox when it would have.
func TestMailboxRetractKeepsArrivalTime(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	const expiry = 600 * time.Millisecond
	cfg.Expiry = expiry
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ch, err := a.NewChannel(ctxT(t, 5*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	h := mbHand(t, a, b, ch, "kept")
	arrived := h.msg.at
	if arrived.IsZero() || time.Since(arrived) > expiry/2 {
		t.Fatalf("the message's arrival time %v is not when it reached the mailbox", arrived)
	}

	// Retracted while it has time left: received again, with its arrival time.
	h.op.Retract()
	m2 := mbTake(t, a, ch)
	if lcN(t, m2.Body) != "kept" || !m2.at.Equal(arrived) {
		t.Fatalf("after Retract got %q arrived %v; want kept, arrived %v", lcN(t, m2.Body), m2.at, arrived)
	}
	h.op.Retract() // only the first call acts
	if n := lcEntries(a, ch); n != 0 {
		t.Fatalf("a second Retract gave the message back again (%d waiting)", n)
	}

	// Retracted once its expiry has come: dropped at once, counted once.
	h = mbHand(t, a, b, ch, "late")
	time.Sleep(time.Until(h.msg.at.Add(expiry)) + 20*time.Millisecond)
	before := a.Stats()
	h.op.Retract()
	if n := lcEntries(a, ch); n != 0 {
		t.Fatalf("a message retracted after its expiry waits in the mailbox (%d entries)", n)
	}
	st := a.Stats()
	if st.Dropped.Expired != before.Dropped.Expired+1 || st.Delivered != before.Delivered-1 {
		t.Fatalf("after retracting an expired message: Expired %d -> %d, Delivered %d -> %d; want +1 and -1",
			before.Dropped.Expired, st.Dropped.Expired, before.Delivered, st.Delivered)
	}
	lcExpectNothing(t, a, ch, 100*time.Millisecond)

	// Retracted 150 ms before its expiry: it waits, then expires when it would have.
	h = mbHand(t, a, b, ch, "short")
	time.Sleep(time.Until(h.msg.at.Add(expiry - 150*time.Millisecond)))
	h.op.Retract()
	if n := lcEntries(a, ch); n != 1 {
		t.Fatalf("a message retracted 150 ms before its expiry is not in the mailbox (%d)", n)
	}
	time.Sleep(time.Until(h.msg.at.Add(expiry)) + 20*time.Millisecond)
	lcExpectNothing(t, a, ch, 100*time.Millisecond)
	if st := a.Stats(); st.Dropped.Expired != before.Dropped.Expired+2 {
		t.Fatalf("Expired = %d, want %d", st.Dropped.Expired, before.Dropped.Expired+2)
	}
}

// TestMailboxRetractKeepsOrder (S14): a retracted message goes in front of those waiting;
// messages retracted last first come back in their order; a new arrival goes behind them.
// Delivered counts only what stays received. Each mailbox keeps its own order, and a
// retracted message goes to a receive that waits.
func TestMailboxRetractKeepsOrder(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	other, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	var handed []mbHanded
	for _, n := range []string{"1", "2", "3"} {
		handed = append(handed, mbHand(t, a, b, ch, n))
	}
	mbFill(t, a, b, ch, "4", "5")
	for i := len(handed) - 1; i >= 0; i-- {
		handed[i].op.Retract()
	}
	mbSame(t, "waiting after retracting last first", mbWaiting(t, a, ch), "1", "2", "3", "4", "5")
	if d := a.Stats().Delivered; d != 0 {
		t.Fatalf("Delivered after retracting every received message = %d, want 0", d)
	}

	// Interleaved retractions in two mailboxes keep each one's order.
	hb := mbHand(t, a, b, other, "b1")
	mbFill(t, a, b, other, "b2")
	ha := mbTake(t, a, ch) // taken at once: nothing to retract; it stays received
	if lcN(t, ha.Body) != "1" {
		t.Fatalf("took %q, want 1", lcN(t, ha.Body))
	}
	hb.op.Retract()
	mbSame(t, "first mailbox", mbWaiting(t, a, ch), "2", "3", "4", "5")
	mbSame(t, "second mailbox", mbWaiting(t, a, other), "b1", "b2")

	mbFill(t, a, b, ch, "6")
	for i := 2; i <= 6; i++ {
		if got := lcRecv(t, a, ch, 5*time.Second); got != strconv.Itoa(i) {
			t.Fatalf("receive %d after the retractions got %q", i, got)
		}
	}
	if d := a.Stats().Delivered; d != 6 {
		t.Fatalf("Delivered = %d, want 6", d)
	}

	// With a receive waiting, a retracted message goes to it.
	h := mbHand(t, a, b, ch, "again")
	got := make(chan Message, 1)
	_, op, err := a.StartReceive(ch, func(m Message, err error) {
		if err != nil {
			t.Errorf("callback error: %v", err)
		}
		got <- m
	})
	if err != nil || op == nil {
		t.Fatalf("StartReceive: op=%v err=%v", op, err)
	}
	h.op.Retract()
	select {
	case m := <-got:
		if lcN(t, m.Body) != "again" {
			t.Fatalf("the waiting receive got %q", lcN(t, m.Body))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the retracted message did not reach the waiting receive")
	}
	if n := lcEntries(a, ch); n != 0 {
		t.Fatalf("the mailbox holds %d, want 0", n)
	}
}

// TestMailboxRetractOtherOperations: Retract of a group_add that finished later takes the
// membership back (a group message no longer reaches the channel); Retract of an accepted send,
// of a new channel and of a receive that was cancelled changes nothing.
func TestMailboxRetractOtherOperations(t *testing.T) {
	s := startServer(t)
	px := lcStartProxy(t, s.url())
	a := connect(t, testConfig(nil, px.URL()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	// A group_add on a new group waits for its subscription: it returns an Op that finishes.
	px.Stop(faultproxy.Down) // hold the confirmation back, so the Op surely is pending
	done := make(chan error, 1)
	op, err := a.StartGroupAdd("mb-retract", pc, func(err error) { done <- err })
	if err != nil || op == nil {
		t.Fatalf("StartGroupAdd on a new group: op=%v err=%v, want a pending Op", op, err)
	}
	px.Pass()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the group_add did not finish")
	}
	lcGroupSend(t, b, "mb-retract", "member")
	if n := lcRecv(t, a, pc, 5*time.Second); n != "member" {
		t.Fatalf("got %q", n)
	}
	op.Retract()
	if st := a.Stats(); st.Groups != 0 {
		t.Fatalf("after retracting the group_add %d group(s) remain", st.Groups)
	}
	lcCheckConsistent(t, a)
	lcGroupSend(t, b, "mb-retract", "gone")
	lcExpectNothing(t, a, pc, msgQuiet)

	// A receive that was cancelled has nothing to give back.
	_, rop, err := a.StartReceive(pc, func(Message, error) { t.Error("callback of a cancelled receive") })
	if err != nil || rop == nil || !rop.Cancel() {
		t.Fatalf("a receive to cancel: op=%v err=%v", rop, err)
	}
	rop.Retract()
	lcSend(t, b, pc, "after")
	if n := lcRecv(t, a, pc, 5*time.Second); n != "after" {
		t.Fatalf("got %q", n)
	}
	lcExpectNothing(t, a, pc, 100*time.Millisecond)
}

// TestMailboxCapacityWithSlowReader (S2): with capacity 10 and a reader that does not come back
// for more, at most 10 messages wait in the mailbox and one was handed to the waiting receive;
// the rest are dropped and counted. The reader then gets the kept ones in order.
func TestMailboxCapacityWithSlowReader(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Capacity = 10
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ch, err := a.NewChannel(ctxT(t, 5*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	handed := make(chan Message, 2)
	if _, op, err := a.StartReceive(ch, func(m Message, err error) {
		if err == nil {
			handed <- m
		}
	}); err != nil || op == nil {
		t.Fatalf("StartReceive: op=%v err=%v", op, err)
	}
	const sent = 50
	for i := range sent {
		if op, err := b.StartSend(ch, lcBody(t, strconv.Itoa(i)), func(error) {}); err != nil || op != nil {
			t.Fatalf("send %d: op=%v err=%v", i, op, err)
		}
	}
	waitFor(t, 5*time.Second, "every message to be routed", func() bool {
		st := a.Stats()
		return uint64(lcEntries(a, ch))+st.Dropped.Capacity+st.Delivered == sent
	})
	st := a.Stats()
	if n := lcEntries(a, ch); n != 10 || st.Delivered != 1 || st.Dropped.Capacity != sent-11 {
		t.Fatalf("capacity 10 with one waiting receive: %d waiting, %d delivered, %d dropped; want 10, 1, %d",
			n, st.Delivered, st.Dropped.Capacity, sent-11)
	}
	select {
	case m := <-handed:
		if lcN(t, m.Body) != "0" {
			t.Fatalf("the waiting receive got %q, want 0", lcN(t, m.Body))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting receive got nothing")
	}
	if len(handed) != 0 {
		t.Fatal("the receive was handed more than one message")
	}
	for i := 1; i <= 10; i++ {
		if got := lcRecv(t, a, ch, 5*time.Second); got != strconv.Itoa(i) {
			t.Fatalf("kept message %d is %q", i, got)
		}
	}
	lcExpectNothing(t, a, ch, 100*time.Millisecond)
}

// TestMailboxCancelRacingDeliveryLosesNothing (S14): a receive cancelled while its message
// arrives either was withdrawn (Cancel true: the message waits for the next receive, in front)
// or got it (Cancel false: the callback runs with it). No message is lost or duplicated.
func TestMailboxCancelRacingDeliveryLosesNothing(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ch, err := a.NewChannel(ctxT(t, 5*time.Second), "")
	if err != nil {
		t.Fatal(err)
	}
	const rounds = 200
	var won, lost int
	for i := range rounds {
		n := strconv.Itoa(i)
		got := make(chan Message, 1)
		_, op, err := a.StartReceive(ch, func(m Message, err error) {
			if err != nil {
				t.Errorf("round %d: callback error %v", i, err)
			}
			got <- m
		})
		if err != nil || op == nil {
			t.Fatalf("round %d: StartReceive op=%v err=%v", i, op, err)
		}
		if sop, err := b.StartSend(ch, lcBody(t, n), func(error) {}); err != nil || sop != nil {
			t.Fatalf("round %d: send op=%v err=%v", i, sop, err)
		}
		time.Sleep(time.Duration(rand.IntN(400)) * time.Microsecond)
		if op.Cancel() {
			won++
			if m := lcRecv(t, a, ch, 5*time.Second); m != n {
				t.Fatalf("round %d: after a successful cancel the next receive got %q, want %q", i, m, n)
			}
			select {
			case m := <-got:
				t.Fatalf("round %d: the callback of a cancelled receive ran with %q", i, lcN(t, m.Body))
			default:
			}
			continue
		}
		lost++
		select {
		case m := <-got:
			if lcN(t, m.Body) != n {
				t.Fatalf("round %d: the callback got %q, want %q", i, lcN(t, m.Body), n)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Cancel returned false but the callback never ran", i)
		}
	}
	t.Logf("%d rounds: the cancel won %d, the delivery %d", rounds, won, lost)
	lcExpectNothing(t, a, ch, 100*time.Millisecond)
	if st := a.Stats(); st.Delivered != rounds {
		t.Fatalf("Delivered = %d, want %d", st.Delivered, rounds)
	}
}
