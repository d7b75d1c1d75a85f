package layer

// Edge cases that the messaging, lifecycle and resilience suites leave open (the "Known gaps"
// of docs/test-plan.md): a NewChannel cancelled while its subscription is confirmed (ref 46), a
// group that loses its last process member but keeps a plain one (ref 67), expiry counted from
// arrival in the mailbox (S4, ref 54), a GroupAdd and a first plain receive made while the
// connection is closed for good (S17, C20), a plain reader that stops without being cancelled
// (S6), a message close to 1 MB (C6), a message sent before anyone subscribed (S1) and two first
// receives waiting on one held-back confirmation (ref 39). Servers are embedded and real; the
// confirmation is held back with the fault proxy (lcStartProxy in lifecycle_test.go).

import (
	"bytes"
	"context"
	"errors"
	"sort"
	"testing"
	"time"

	"github.com/channels-nats/channels-nats/internal/faultproxy"
)

// ---------------------------------------------------------------------------------------------
// helpers

// edgeSubscribing sums, over every mailbox of l, the operations waiting for a confirmation.
func edgeSubscribing(l *Layer) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, mb := range l.mailboxes {
		n += mb.subscribing
	}
	return n
}

// edgeSubscribingOn is how many operations on the mailbox of name wait for a confirmation.
func edgeSubscribingOn(l *Layer, name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if mb := l.mailboxes[name]; mb != nil {
		return mb.subscribing
	}
	return 0
}

// edgeMailboxNames lists the names of l's mailboxes, sorted.
func edgeMailboxNames(l *Layer) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	names := make([]string, 0, len(l.mailboxes))
	for name := range l.mailboxes {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// edgeNATSSubs is how many NATS subscriptions l's current connection holds.
func edgeNATSSubs(l *Layer) int {
	return l.link.conn().NumSubscriptions()
}

// edgeServerSubs counts the server-side subscriptions of the connection named name on subject
// with queue group queue ("" for none).
func edgeServerSubs(t *testing.T, s *testServer, name, subject, queue string) int {
	t.Helper()
	n := 0
	for _, sd := range msgConnSubs(t, s, name) {
		if sd.Subject == subject && sd.Queue == queue {
			n++
		}
	}
	return n
}

// edgeNoResult fails if any of the receives or operations has reported.
func edgeNoResult[T any](t *testing.T, what string, chans ...<-chan T) {
	t.Helper()
	for i, ch := range chans {
		select {
		case r := <-ch:
			if res, ok := any(r).(lcResult); ok {
				t.Errorf("%s: operation %d returned (body %q, err %v); it should still wait", what, i, res.body, res.err)
				continue
			}
			t.Errorf("%s: operation %d returned %v; it should still wait", what, i, r)
		default:
		}
	}
}

// ---------------------------------------------------------------------------------------------
// Ref 46: NewChannel cancelled during its confirmation

// TestEdgeNewChannelCancelledWhileConfirming (ref 46, S1, S5, S14): the first NewChannel of a
// client, cancelled while the server's PONG is held back, returns context.Canceled promptly. The
// process subscription is not taken as confirmed (another NewChannel still waits for a round
// trip), a NewChannel after the release works and delivers, and the mailboxes of the cancelled
// calls are reclaimed after the grace.
func TestEdgeNewChannelCancelledWhileConfirming(t *testing.T) {
	s := startServer(t)
	px := lcStartProxy(t, s.url())
	cfg := testConfig(nil, px.URL())
	cfg.MailboxGrace = 200 * time.Millisecond
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 20*time.Second)
	process := processKey("specific." + a.ClientID())

	type result struct {
		name string
		err  error
	}
	px.Stop(faultproxy.Down)
	octx, cancel := context.WithCancel(ctx)
	done := make(chan result, 1)
	go func() {
		name, err := a.NewChannel(octx, "")
		done <- result{name, err}
	}()
	waitFor(t, 5*time.Second, "NewChannel waiting for its confirmation", func() bool { return edgeSubscribing(a) == 1 })
	orphans := edgeMailboxNames(a) // the mailbox the call made; it cannot go while the call waits
	if len(orphans) != 1 {
		t.Fatalf("mailboxes while the first NewChannel waits: %v, want its own", orphans)
	}
	cancelled := time.Now()
	cancel()
	select {
	case r := <-done:
		if !errors.Is(r.err, context.Canceled) || r.name != "" {
			t.Fatalf("NewChannel cancelled while confirming: %q, %v; want \"\", context.Canceled", r.name, r.err)
		}
		if el := time.Since(cancelled); el > 500*time.Millisecond {
			t.Errorf("NewChannel returned %s after its cancel", el)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("NewChannel did not return after its cancel")
	}
	if lcConfirmed(a, process) {
		t.Fatal("the process subscription counts as confirmed although its PONG never arrived")
	}
	// Still held back: a NewChannel cannot return before a round trip of its own.
	second := make(chan result, 1)
	go func() {
		name, err := a.NewChannel(ctxT(t, 300*time.Millisecond), "")
		second <- result{name, err}
	}()
	// The cancelled call's goroutine lets go of its mailbox on its own time: wait for the
	// second call's mailbox, not for a count the first may still hold.
	waitFor(t, 5*time.Second, "the second NewChannel waiting for its confirmation", func() bool {
		for _, name := range edgeMailboxNames(a) {
			if name != orphans[0] && edgeSubscribingOn(a, name) == 1 {
				orphans = append(orphans, name)
				return true
			}
		}
		return false
	})
	if r := <-second; !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("NewChannel while the confirmation is still held back: %q, %v; want context.DeadlineExceeded", r.name, r.err)
	}
	if len(orphans) != 2 {
		t.Fatalf("mailboxes of the two unfinished NewChannels: %v, want 2", orphans)
	}
	px.Pass()

	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatalf("NewChannel after the cancelled one: %v", err)
	}
	if !lcConfirmed(a, process) {
		t.Fatal("NewChannel returned without a confirmed process subscription")
	}
	if n := a.Stats().Subscriptions; n != 1 {
		t.Errorf("Subscriptions = %d, want 1 (one process subscription)", n)
	}
	got := lcRecvAsync(ctx, a, pc)
	waitFor(t, 5*time.Second, "the receive on the new channel", func() bool { return lcWaiters(a, pc) == 1 })
	lcSend(t, b, pc, "after")
	if r := lcAwait(t, got, 5*time.Second, "receive on the new channel"); r.err != nil || lcN(t, r.body) != "after" {
		t.Fatalf("the new channel got %q, %v", r.body, r.err)
	}
	for _, name := range orphans {
		waitFor(t, 5*time.Second, "reclaim of the mailbox of a cancelled NewChannel", func() bool { return !lcHasBox(a, name) })
	}
	if st := a.Stats(); st.Dropped.NoMailbox != 0 || st.Subscriptions != 1 {
		t.Errorf("after the reclaim: NoMailbox = %d, Subscriptions = %d; want 0, 1", st.Dropped.NoMailbox, st.Subscriptions)
	}
	lcCheckConsistent(t, a)
}

// ---------------------------------------------------------------------------------------------
// Ref 67: the group subscription goes with its last process member, the plain member stays

// TestEdgeGroupKeepsPlainMemberWhenProcessMemberLeaves (ref 67): a group with a process member
// and a plain member. Discarding the process member unsubscribes the group's process subscription
// (in the layer and on the server) and keeps the (group, plain) queue subscription; group_send
// still reaches the plain member, once, and no longer the process channel.
func TestEdgeGroupKeepsPlainMemberWhenProcessMemberLeaves(t *testing.T) {
	s := startServer(t)
	a := connect(t, msgNamed(nil, "edge-67", s.url()))
	b := connect(t, testConfig(nil, s.url()))
	const group, plain = "edge-room", "edge-shared"
	groupSubject, queue := "channels.grp."+group, "channels.ch."+plain

	pc := msgNewChannel(t, a)
	msgGroupAdd(t, a, group, pc)
	msgGroupAdd(t, a, group, plain)
	groupSub, memberSub := lcSub(a, groupKey(group)), lcSub(a, memberKey(group, plain))
	if groupSub == nil || memberSub == nil || lcSub(a, channelKey(plain)) == nil {
		t.Fatalf("subscriptions before the discard: group %v, member %v, channel %v",
			groupSub != nil, memberSub != nil, lcSub(a, channelKey(plain)) != nil)
	}
	a.mu.Lock()
	natsGroupSub, natsMemberSub := groupSub.sub, memberSub.sub
	a.mu.Unlock()

	if err := a.GroupDiscard(group, pc); err != nil {
		t.Fatal(err)
	}
	if lcSub(a, groupKey(group)) != nil {
		t.Error("the group's process subscription outlived its last process member")
	}
	// The link unsubscribes it, after whatever it was asked before.
	waitFor(t, 5*time.Second, "the NATS subscription of the group's process subscription to be unsubscribed", func() bool {
		return !natsGroupSub.IsValid()
	})
	if lcSub(a, memberKey(group, plain)) != memberSub || !natsMemberSub.IsValid() {
		t.Error("the (group, plain) queue subscription was dropped with the process member")
	}
	if lcSub(a, channelKey(plain)) == nil {
		t.Error("the plain member's channel subscription was dropped")
	}
	if st := a.Stats(); st.Groups != 1 {
		t.Errorf("Groups = %d, want 1", st.Groups)
	}
	rsRoundTrip(t, a) // the server has processed the UNSUB
	if n := edgeServerSubs(t, s, "edge-67", groupSubject, ""); n != 0 {
		t.Errorf("the server still holds %d plain subscription(s) on %s", n, groupSubject)
	}
	if n := edgeServerSubs(t, s, "edge-67", groupSubject, queue); n != 1 {
		t.Errorf("the server holds %d subscription(s) on %s in queue %s, want 1", n, groupSubject, queue)
	}

	lcGroupSend(t, b, group, "g1")
	lcSend(t, b, pc, "direct") // same publisher: had pc still been a member, g1 would come first
	if got := lcRecv(t, a, pc, 5*time.Second); got != "direct" {
		t.Errorf("the discarded process channel got %q first, want direct", got)
	}
	if got := lcRecv(t, a, plain, 5*time.Second); got != "g1" {
		t.Fatalf("the plain member got %q, want g1", got)
	}
	lcSend(t, b, plain, "sentinel")
	if got := lcRecv(t, a, plain, 5*time.Second); got != "sentinel" {
		t.Errorf("the plain member got %q after g1, want sentinel (g1 once)", got)
	}
	lcCheckConsistent(t, a)
}

// ---------------------------------------------------------------------------------------------
// S4, ref 54: expiry counts the time in the mailbox

// TestEdgeExpiryCountsTimeInTheMailbox (S4, ref 54): with Expiry 300 ms the dispatcher is
// stalled (the test holds the layer lock) for 600 ms while two messages are published and
// flushed: the first is taken by the dispatcher, which then waits for the lock; the second waits
// in the inbox behind it. Neither has been in a mailbox before the stall ends, so once routed and
// received right away both are returned and nothing counts as expired.
func TestEdgeExpiryCountsTimeInTheMailbox(t *testing.T) {
	const expiry, stall = 300 * time.Millisecond, 600 * time.Millisecond
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Expiry = expiry
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	pc := msgNewChannel(t, a)
	nc := rsConn(a)
	before := lcArrived(a, nc)

	a.mu.Lock()
	locked := true
	unlock := func() {
		if locked {
			locked = false
			a.mu.Unlock()
		}
	}
	defer unlock() // a failure below must not leave the layer locked for Close
	stalled := time.Now()
	lcSend(t, b, pc, "held")
	lcSend(t, b, pc, "queued")
	rsRoundTrip(t, b)
	// Both reached A: the dispatcher took the first and waits for the lock; the second is queued.
	waitFor(t, 5*time.Second, "both messages at the stalled dispatcher", func() bool {
		return lcArrived(a, nc) >= before+2 && len(a.inbox) == 1
	})
	time.Sleep(time.Until(stalled.Add(stall)))
	unlock()
	// Receive only once both are routed, so neither is handed straight to a waiting receive
	// (which skips the expiry check) and both wait in the mailbox as they would for a consumer.
	waitFor(t, 5*time.Second, "both messages routed", func() bool {
		return lcEntries(a, pc)+int(a.Stats().Dropped.Expired) >= 2
	})

	for _, want := range []string{"held", "queued"} {
		body, err := a.ReceiveRaw(ctxT(t, time.Second), pc)
		if err != nil {
			t.Errorf("message %q, routed after a %s stall with expiry %s, was not received: %v", want, stall, expiry, err)
			continue
		}
		if got := lcN(t, body); got != want {
			t.Errorf("received %q, want %q", got, want)
		}
	}
	if n := a.Stats().Dropped.Expired; n != 0 {
		t.Errorf("Dropped.Expired = %d, want 0: the time before a message reached its mailbox counted as expiry", n)
	}
}

// ---------------------------------------------------------------------------------------------
// S17, C20: changes made while the connection is closed for good

// TestEdgeChangesWhileClosedForGoodAreRestored (S17, C20): with MaxReconnects = NoReconnect the
// server goes and the connection is closed for good. A GroupAdd of a process channel, a GroupAdd
// of a plain channel and a first receive on a plain channel, made while the server is down, wait
// (each with an 8 s context) and complete once the server is back and the recovery ran. Then
// group_send reaches both members and a send reaches the plain receive.
func TestEdgeChangesWhileClosedForGoodAreRestored(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	a := connect(t, rsNoReconnect(rec, s.url()))
	ctx := ctxT(t, 30*time.Second)
	const group, member, plain = "edge-down-room", "edge-down-member", "edge-down-plain"
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	old := rsConn(a)
	s.stop()
	waitFor(t, rsEventually, "nats.go to close the connection for good", old.IsClosed)

	opCtx := ctxT(t, 8*time.Second)
	addProcess, addPlain := make(chan error, 1), make(chan error, 1)
	go func() { addProcess <- a.GroupAdd(opCtx, group, pc) }()
	go func() { addPlain <- a.GroupAdd(opCtx, group, member) }()
	received := lcRecvAsync(opCtx, a, plain)
	time.Sleep(700 * time.Millisecond) // longer than the first recovery backoff (0.5 s)
	edgeNoResult(t, "GroupAdd(process) while the server is down", addProcess)
	edgeNoResult(t, "GroupAdd(plain) while the server is down", addPlain)
	edgeNoResult(t, "first plain receive while the server is down", received)
	if t.Failed() {
		t.FailNow()
	}

	s.start()
	for what, ch := range map[string]chan error{"GroupAdd(process)": addProcess, "GroupAdd(plain)": addPlain} {
		select {
		case err := <-ch:
			if err != nil {
				t.Errorf("%s made while the connection was closed for good: %v", what, err)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s did not complete after the server came back", what)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	waitFor(t, rsEventually, "the recovery", func() bool { return a.Stats().Recoveries >= 1 })
	lcReady(t, a, channelKey(plain), plain, 1)
	if k := rsSubKinds(a); k[subProcess] != 1 || k[subGroup] != 1 || k[subGroupChannel] != 1 || k[subChannel] != 2 {
		t.Errorf("subscriptions after the recovery: %v; want process 1, group 1, group x plain 1, plain 2", k)
	}
	for _, k := range []subKey{processKey(lcNonLocal(pc)), groupKey(group), memberKey(group, member), channelKey(member), channelKey(plain)} {
		if !lcConfirmed(a, k) {
			t.Errorf("subscription %+v is not confirmed after the recovery", k)
		}
	}

	pub := connect(t, testConfig(nil, s.url()))
	lcSend(t, pub, plain, "plain")
	if r := lcAwait(t, received, 5*time.Second, "first plain receive"); r.err != nil || lcN(t, r.body) != "plain" {
		t.Fatalf("the plain receive made while down got %q, %v", r.body, r.err)
	}
	lcGroupSend(t, pub, group, "room")
	if got := lcRecv(t, a, pc, 5*time.Second); got != "room" {
		t.Errorf("the process member got %q, want room", got)
	}
	if got := lcRecv(t, a, member, 5*time.Second); got != "room" {
		t.Errorf("the plain member got %q, want room", got)
	}
	lcCheckConsistent(t, a)
}

// ---------------------------------------------------------------------------------------------
// S6: a plain reader that stops without being cancelled

// TestEdgePlainReaderThatStopsIsReleasedAfterGrace (S6, loss window 3): a reader of a plain
// channel completes a receive and then stops reading, without a cancel. Two more messages land
// in its mailbox. After MailboxGrace (200 ms) without a reader its subscription is released and
// the two messages are handed back to another reader, once each.
func TestEdgePlainReaderThatStopsIsReleasedAfterGrace(t *testing.T) {
	const grace = 200 * time.Millisecond
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.MailboxGrace = grace
	a := connect(t, cfg)
	c := connect(t, testConfig(nil, s.url()))
	sender := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 15*time.Second)
	const ch = "edge-stopped-reader"

	got := lcRecvAsync(ctx, a, ch)
	lcReady(t, a, channelKey(ch), ch, 1)
	lcSend(t, sender, ch, "0")
	if r := lcAwait(t, got, 5*time.Second, "A's receive"); r.err != nil || lcN(t, r.body) != "0" {
		t.Fatalf("A got %q, %v", r.body, r.err)
	}
	// A stops reading. Only A is subscribed, so the next two messages land in its mailbox.
	lcSend(t, sender, ch, "1")
	lcSend(t, sender, ch, "2")
	waitFor(t, 5*time.Second, "the two messages in A's mailbox", func() bool { return lcEntries(a, ch) == 2 })
	arrived := time.Now()
	col := lcCollect(ctx, c, ch)
	lcReady(t, c, channelKey(ch), ch, 1)
	if lcSub(a, channelKey(ch)) == nil {
		t.Fatalf("A released %s %s after its messages arrived, before the other reader was ready; "+
			"the %s grace is too short for this machine", ch, time.Since(arrived), grace)
	}

	waitFor(t, 5*time.Second, "A's release after the grace", func() bool {
		return lcSub(a, channelKey(ch)) == nil && !lcHasBox(a, ch)
	})
	// The layer drops its record at once and unsubscribes on the link's goroutine right after.
	waitFor(t, 5*time.Second, "A's NATS subscription to go", func() bool { return edgeNATSSubs(a) == 0 })
	waitFor(t, 5*time.Second, "the handed-back messages at the other reader", func() bool { return col.total() == 2 })
	for _, n := range []string{"1", "2"} {
		if k := col.count(n); k != 1 {
			t.Errorf("message %s reached the other reader %d time(s)", n, k)
		}
	}
	if st := a.Stats(); st.HandedBack != 2 || st.Delivered != 1 {
		t.Errorf("A: HandedBack = %d, Delivered = %d; want 2, 1", st.HandedBack, st.Delivered)
	}
	time.Sleep(100 * time.Millisecond)
	if n := col.total(); n != 2 {
		t.Errorf("the other reader got %d messages, want 2", n)
	}
}

// ---------------------------------------------------------------------------------------------
// C6: messages close to 1 MB

// TestEdgeMessageNearOneMegabyte (C6, S7): with the server's default max_payload (1 MiB), a
// message carrying 1,000,000 bytes round-trips by send (process and plain channel) and by
// group_send, and a group message of exactly 1 MiB goes too; above 1 MiB send and group_send
// fail with ErrMessageTooLarge and the connection stays up.
func TestEdgeMessageNearOneMegabyte(t *testing.T) {
	const mib = 1 << 20
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	if mp := rsConn(b).MaxPayload(); mp != mib {
		t.Fatalf("the server's default max_payload is %d, want %d", mp, mib)
	}
	const group, plain = "edge-big", "edge-big-plain"
	pc := msgNewChannel(t, a)
	msgGroupAdd(t, a, group, pc)
	data := make([]byte, 1_000_000)
	for i := range data {
		data[i] = byte(i*7 + i/251)
	}
	msg := map[string]any{"type": "edge.big", "data": data}
	check := func(what string, got map[string]any) {
		t.Helper()
		if b, ok := got["data"].([]byte); !ok || !bytes.Equal(b, data) || got["type"] != "edge.big" {
			t.Errorf("%s: the 1,000,000-byte message did not round-trip (data %T of %d bytes)", what, got["data"], len(b))
		}
	}

	msgSend(t, b, pc, msg)
	check("send to a process channel", msgRecv(t, a, pc))
	msgGroupSend(t, b, group, msg)
	check("group_send", msgRecv(t, a, pc))
	out, _ := msgStart(t, a, plain)
	msgSend(t, b, plain, msg)
	check("send to a plain channel", msgAwait(t, out, "plain channel").m)
	exact := msgSizedMessage(t, mib)
	msgGroupSend(t, b, group, exact) // a group message has no header: exactly max_payload
	if got := msgRecv(t, a, pc); !bytes.Equal(got["b"].([]byte), exact["b"].([]byte)) {
		t.Error("the group message of exactly max_payload did not round-trip")
	}

	big := map[string]any{"type": "edge.too-big", "data": make([]byte, mib)}
	for what, err := range map[string]error{
		"send":       b.Send(ctxT(t, 5*time.Second), pc, big),
		"group_send": b.GroupSend(ctxT(t, 5*time.Second), group, big),
	} {
		var tl *MessageTooLargeError
		if !errors.Is(err, ErrMessageTooLarge) || !errors.As(err, &tl) || tl.MaxPayload != mib || tl.Size <= mib {
			t.Errorf("%s of a message over 1 MiB: %v, want a *MessageTooLargeError over %d", what, err, mib)
		}
	}
	if st := b.Stats(); !st.Connected || st.Published != 4 || st.Reconnects != 0 {
		t.Errorf("sender: connected %v, published %d (want 4), reconnects %d", st.Connected, st.Published, st.Reconnects)
	}
	msgNothing(t, a, pc)
}

// ---------------------------------------------------------------------------------------------
// S1: a message sent before its receiver subscribed is lost

// TestEdgeSendBeforeSubscribeIsLost (S1, loss window 1): a message sent to a plain channel that
// nobody reads is lost; the receive that starts afterwards gets the next message and never the
// first.
func TestEdgeSendBeforeSubscribeIsLost(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	const ch = "edge-early"

	lcSend(t, b, ch, "first")
	rsRoundTrip(t, b) // the server has processed it, with no subscriber
	got := lcRecvAsync(ctx, a, ch)
	lcReady(t, a, channelKey(ch), ch, 1)
	lcSend(t, b, ch, "second")
	if r := lcAwait(t, got, 5*time.Second, "receive"); r.err != nil || lcN(t, r.body) != "second" {
		t.Fatalf("the first received message is %q (%v), want second", r.body, r.err)
	}
	lcExpectNothing(t, a, ch, 300*time.Millisecond)
	if st := a.Stats(); st.Delivered != 1 {
		t.Errorf("Delivered = %d, want 1", st.Delivered)
	}
}

// ---------------------------------------------------------------------------------------------
// Ref 39: a second caller waits for the confirmation in flight

// TestEdgeConcurrentFirstReceivesShareOneConfirmation (ref 39, S1, C15): two first receives on
// one plain channel while the server's PONG is held back. Both wait (neither is handed an
// unconfirmed mailbox), they share one subscription (in the layer and on the server), and after
// the release each gets one of two messages.
func TestEdgeConcurrentFirstReceivesShareOneConfirmation(t *testing.T) {
	s := startServer(t)
	px := lcStartProxy(t, s.url())
	a := connect(t, msgNamed(nil, "edge-39", px.URL()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 15*time.Second)
	const ch = "edge-concurrent"

	px.Stop(faultproxy.Down)
	r1 := lcRecvAsync(ctx, a, ch)
	waitFor(t, 5*time.Second, "the first receive waiting for its confirmation", func() bool { return edgeSubscribingOn(a, ch) == 1 })
	r2 := lcRecvAsync(ctx, a, ch)
	waitFor(t, 5*time.Second, "both receives waiting for the confirmation", func() bool { return edgeSubscribingOn(a, ch) == 2 })
	time.Sleep(200 * time.Millisecond)
	edgeNoResult(t, "a first receive while the confirmation is held back", r1, r2)
	if st := a.Stats(); st.Subscriptions != 1 || st.Mailboxes != 1 {
		t.Errorf("while confirming: Subscriptions = %d, Mailboxes = %d; want 1, 1", st.Subscriptions, st.Mailboxes)
	}
	if lcConfirmed(a, channelKey(ch)) || lcWaiters(a, ch) != 0 {
		t.Errorf("while the PONG is held back: confirmed %v, %d waiter(s); want false, 0", lcConfirmed(a, channelKey(ch)), lcWaiters(a, ch))
	}
	px.Pass()

	lcReady(t, a, channelKey(ch), ch, 2)
	rsRoundTrip(t, a)
	if n := edgeServerSubs(t, s, "edge-39", "channels.ch."+ch, "channels.ch."+ch); n != 1 || a.Stats().Subscriptions != 1 {
		t.Errorf("after the confirmation: %d server-side and %d layer subscription(s), want 1 and 1", n, a.Stats().Subscriptions)
	}
	lcSend(t, b, ch, "1")
	lcSend(t, b, ch, "2")
	seen := map[string]int{}
	for i, r := range []<-chan lcResult{r1, r2} {
		res := lcAwait(t, r, 5*time.Second, "receive")
		if res.err != nil {
			t.Fatalf("receive %d: %v", i+1, res.err)
		}
		seen[lcN(t, res.body)]++
	}
	if seen["1"] != 1 || seen["2"] != 1 {
		t.Errorf("the two receives got %v, want 1 and 2 once each", seen)
	}
}

// ---------------------------------------------------------------------------------------------
// A group_add that Flush overtakes must end

// TestEdgeGroupAddOvertakenByFlushEnds (ref 69, S1, S15): a StartGroupAdd whose confirmation is
// held back (the proxy holds what the server sends) is overtaken by Flush, which drops the
// subscriptions it waited for. Once the server answers again the operation must end: done is
// called (whatever its error), and the mailbox no longer counts an operation waiting for a
// subscription, so the channel can be reclaimed or released.
func TestEdgeGroupAddOvertakenByFlushEnds(t *testing.T) {
	for _, plain := range []bool{false, true} {
		t.Run(map[bool]string{false: "process member", true: "plain member"}[plain], func(t *testing.T) {
			s := startServer(t)
			px := lcStartProxy(t, s.url())
			a := connect(t, lcLingerConfig(px.URL(), 100*time.Millisecond))
			member := "edge-flushed-plain"
			if !plain {
				member = msgNewChannel(t, a)
			}
			px.Stop(faultproxy.Down)
			done := make(chan error, 1)
			op, err := a.StartGroupAdd("edge-flushed", member, func(err error) { done <- err })
			if err != nil || op == nil {
				t.Fatalf("StartGroupAdd with the confirmation held back: op=%v err=%v, want a pending Op", op, err)
			}
			waitFor(t, 5*time.Second, "the group_add to wait for its confirmation", func() bool {
				return edgeSubscribingOn(a, member) == 1
			})
			if err := a.Flush(); err != nil {
				t.Fatal(err)
			}
			px.Pass()
			select {
			case err := <-done:
				t.Logf("the overtaken StartGroupAdd ended with %v", err)
			case <-time.After(5 * time.Second):
				t.Errorf("a StartGroupAdd overtaken by Flush never finished: Op pending %v, %d operation(s) of %s still wait for a subscription",
					op.pending(), edgeSubscribingOn(a, member), member)
				op.Cancel() // end it, so the layer closes cleanly
				return
			}
			waitFor(t, 5*time.Second, "no operation left waiting", func() bool { return edgeSubscribingOn(a, member) == 0 })
			lcCheckConsistent(t, a)
		})
	}
}
