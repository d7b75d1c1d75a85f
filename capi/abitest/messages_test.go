//go:build linux

package abitest

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestNewChannel(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	first := c.newChannel("")
	m := processName.FindStringSubmatch(first)
	if m == nil || m[1] != "specific" {
		t.Fatalf("cn_new_channel = %q, want specific.<12 hex>!<32 hex>", first)
	}
	// The process subscription is confirmed now: the next one finishes at once, op 0.
	q := newQueue(t)
	var out uintptr
	op := ^uint64(0)
	if st := cnNewChannel(c.h, nil, q.h, 0, &out, &op); st != cnOK || op != 0 {
		t.Fatalf("second cn_new_channel: %s op %d, want CN_OK at once with op 0", name(st), op)
	}
	second := takeString(out)
	if second == first || clientIDOf(t, second) != m[2] {
		t.Errorf("second name %q: want a new name with the client id of %q", second, first)
	}
	// "" as the prefix, op NULL.
	if st := cnNewChannel(c.h, cs(""), q.h, 0, &out, nil); st != cnOK {
		t.Fatalf("cn_new_channel(\"\"): %s", name(st))
	}
	if s := takeString(out); !strings.HasPrefix(s, "specific.") || clientIDOf(t, s) != m[2] {
		t.Errorf("cn_new_channel(\"\") = %q", s)
	}
	// A prefix of its own: pending the first time (a new subscription), the name as the text.
	if p := c.newChannel("daphne.response"); !strings.HasPrefix(p, "daphne.response.") || clientIDOf(t, p) != m[2] {
		t.Errorf("cn_new_channel(daphne.response) = %q", p)
	}
	// A pending new_channel can be withdrawn: no result comes.
	switch st := cnNewChannel(c.h, cs("never.used"), q.h, 0, &out, &op); st {
	case cnPending:
		if st := cnCancel(c.h, op); st != cnOK {
			t.Errorf("cn_cancel of a pending new_channel: %s, want CN_OK", name(st))
		}
		// Its confirmation may have come before the cancel (a busy machine): then its result
		// was queued, signalled and taken back, and only the byte stays.
		time.Sleep(100 * time.Millisecond)
		drain(t, q.rfd)
		if got := q.takeAll(); len(got) > 0 {
			t.Errorf("a withdrawn new_channel left results: %v", got)
		}
	default:
		t.Errorf("cn_new_channel(never.used): %s, want CN_PENDING (its subscription is new)", name(st))
	}
	// Another client has another id.
	d := connect(t, ts.url, nil)
	if id := clientIDOf(t, d.newChannel("")); id == m[2] {
		t.Errorf("two clients share the client id %s", id)
	}
}

// A message that is waiting is received during the call: CN_OK, op 0, the body lent. Inputs
// of cn_send are copied before it returns.
func TestSendThenReceiveAtOnce(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	body := pack(t, map[string]any{"type": "hello", "text": "wörld", "bin": []byte{0, 1, 2, 255}})
	want := bytes.Clone(body)
	b, n := bp(body)
	channel := []byte(ch + "\x00")
	q := newQueue(t)
	op := ^uint64(0)
	if st := cnSend(c.h, &channel[0], b, n, q.h, 0, &op); st != cnOK || op != 0 {
		t.Fatalf("cn_send: %s op %d, want CN_OK at once with op 0", name(st), op)
	}
	// Scribble over both inputs: the library copied them.
	for i := range body {
		body[i] = 0xc1
	}
	for i := range channel {
		channel[i] = 'x'
	}
	c.barrier(c)
	st, got, _ := c.receive(ch, q, 0)
	if st != cnOK || !bytes.Equal(got, want) {
		t.Fatalf("cn_receive of a waiting message: %s %x, want CN_OK %x", name(st), got, want)
	}
	q.quiet(20 * time.Millisecond)
	c.nothingWaiting(ch)
	if s := c.stats(); stat(s, "published") != 2 || stat(s, "delivered") != 2 {
		t.Errorf("stats: published %v delivered %v, want 2 and 2 (the message and the barrier)", s["published"], s["delivered"])
	}
}

// A receive with nothing waiting is pending; the message sent then is its result, with its op
// and closure, CN_OK, text NULL and the body.
func TestReceivePendingThenSend(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	other := connect(t, ts.url, nil)
	ch := c.newChannel("")
	q := newQueue(t)
	closure := newClosure()
	st, _, op := c.receive(ch, q, closure)
	if st != cnPending {
		t.Fatalf("cn_receive: %s, want CN_PENDING", name(st))
	}
	q.quiet(20 * time.Millisecond)
	body := padded(t, 42, 1000)
	other.send(ch, body)
	r := q.one()
	if r.Op != op || r.Closure != closure || r.Status != cnOK || r.HasText || !bytes.Equal(r.Data, body) || r.Len != uintptr(len(body)) {
		t.Fatalf("result %v, want op %d closure %d CN_OK, text NULL and the %d bytes sent", r, op, closure, len(body))
	}
	q.quiet(20 * time.Millisecond)
}

// churn makes the library allocate (and collect) a lot: a pair of clients pass 100 messages of
// 64 kB (6.4 MB: some sends wait for room). What the library lent must survive it.
func churn(t testing.TB, ts *testServer) {
	t.Helper()
	a, b := connect(t, ts.url, map[string]any{"capacity": 1000}), connect(t, ts.url, nil)
	ch := a.newChannel("")
	for i := range 100 {
		b.sendAwaited(ch, padded(t, i, 64<<10))
	}
	for i := range 100 {
		if got := numberOf(a.receiveAny(ch)); got != i {
			t.Fatalf("churn: message %d, want %d", got, i)
		}
	}
	closeClient(t, a)
	closeClient(t, b)
}

// Bodies and texts are lent until the next cn_queue_take or cn_receive with the same queue:
// they stay intact while the library works (and collects garbage), and what one queue lent is
// not released by calls with another.
func TestLentMemory(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	q1, q2, q3 := newQueue(t), newQueue(t), newQueue(t)

	// A result's body, taken from q1.
	ch := c.newChannel("")
	c.receivePending(ch, q1)
	taken := padded(t, 1, 5000)
	sender.send(ch, taken)
	r := q1.one()
	if !bytes.Equal(r.Data, taken) {
		t.Fatalf("result body differs from the one sent")
	}
	// A body received at once with q2.
	atOnce := padded(t, 2, 7000)
	sender.send(ch, atOnce)
	c.barrier(sender)
	var body, n uintptr
	if st := cnReceive(c.h, cs(ch), q2.h, 0, &body, &n, nil); st != cnOK || n != uintptr(len(atOnce)) {
		t.Fatalf("cn_receive at once: %s len %d", name(st), n)
	}
	// Texts: three CN_CLOSED details in one take from q3, and a close's statistics.
	d := connect(t, ts.url, nil)
	for range 3 {
		d.receivePending(d.newChannel(""), q3)
	}
	closed, _ := closeClient(t, d)
	texts := q3.wait(3)
	if len(texts) != 3 {
		t.Fatalf("%d CN_CLOSED results, want 3", len(texts))
	}
	for _, r := range texts {
		if r.Status != cnClosed || r.Text == "" {
			t.Fatalf("result %v, want CN_CLOSED with a detail", r)
		}
	}

	churn(t, ts)

	if got := cBytes(r.DataPtr, r.Len); !bytes.Equal(got, taken) {
		t.Errorf("the body lent by cn_queue_take changed before the next take")
	}
	if got := cBytes(body, n); !bytes.Equal(got, atOnce) {
		t.Errorf("the body lent by cn_receive changed before the next take or receive")
	}
	for i, r := range texts {
		if got := cString(r.TextPtr); got != r.Text {
			t.Errorf("text %d lent by cn_queue_take changed: %q, was %q", i, got, r.Text)
		}
	}
	if got := cString(closed.TextPtr); got != closed.Text {
		t.Errorf("the close's statistics changed before the next take: %q, was %q", got, closed.Text)
	}
	// One take's texts are valid together: each has a place of its own.
	if texts[0].TextPtr == texts[1].TextPtr || texts[1].TextPtr == texts[2].TextPtr {
		t.Errorf("the texts of one take share memory: %#x %#x %#x", texts[0].TextPtr, texts[1].TextPtr, texts[2].TextPtr)
	}
}

// The members of a group message share its body. A receive that lends it again, after a take
// that ended what was lent before, must pin it again: it stays intact while the library collects
// garbage.
func TestLentGroupBodyLentAgain(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	q := newQueue(t)
	group := uniq(t, "group")
	first, second := c.newChannel(""), c.newChannel("")
	c.groupAdd(group, first)
	c.groupAdd(group, second)
	body := padded(t, 3, 64<<10)
	sender.groupSend(group, body)
	c.barrier(sender)
	var at1, n1, at2, n2 uintptr
	if st := cnReceive(c.h, cs(first), q.h, 0, &at1, &n1, nil); st != cnOK {
		t.Fatalf("cn_receive(first): %s, want CN_OK", name(st))
	}
	q.takeNow() // nothing in it: it ends what the receive lent
	if st := cnReceive(c.h, cs(second), q.h, 0, &at2, &n2, nil); st != cnOK {
		t.Fatalf("cn_receive(second): %s, want CN_OK", name(st))
	}
	if at1 != at2 {
		t.Fatalf("the members got bodies at %#x and %#x, want one shared body", at1, at2)
	}
	churn(t, ts)
	if got := cBytes(at2, n2); !bytes.Equal(got, body) {
		t.Errorf("the group body lent again changed before the next take or receive")
	}
}

func TestPlainChannel(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	other := connect(t, ts.url, nil)
	ch := uniq(t, "plain")
	q := newQueue(t)
	op := c.receivePending(ch, q)
	// The receive subscribed; once the server has the subscription, a send is delivered.
	ts.waitInterest(t, "channels.ch."+ch)
	body := numbered(t, 7)
	other.send(ch, body)
	if r := q.one(); r.Op != op || r.Status != cnOK || !bytes.Equal(r.Data, body) {
		t.Fatalf("result %v, want op %d CN_OK %x", r, op, body)
	}
	// The subscription stays while there are readers: a second round trip.
	other.send(ch, numbered(t, 8))
	if got := numberOf(c.receiveAny(ch)); got != 8 {
		t.Errorf("second message n=%d, want 8", got)
	}
}

// A plain channel keeps its subscription across back-to-back receives (release_linger): a
// message sent between a cancelled receive and the next one is not lost. A receive cancelled
// while it still subscribes never has a result.
func TestPlainChannelBackToBack(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := uniq(t, "poll")
	q := newQueue(t)
	if st := cnCancel(c.h, c.receivePending(ch, q)); st != cnOK {
		t.Fatalf("cn_cancel of a subscribing receive: %s, want CN_OK", name(st))
	}
	op := c.receivePending(ch, q)
	ts.waitInterest(t, "channels.ch."+ch)
	if st := cnCancel(c.h, op); st != cnOK {
		t.Fatalf("cn_cancel: %s", name(st))
	}
	sender.send(ch, numbered(t, 1)) // between two polls
	if got := numberOf(c.receiveAny(ch)); got != 1 {
		t.Errorf("the next poll got n=%d, want 1", got)
	}
	q.quiet(20 * time.Millisecond)
}

// Receiving on the prefix "specific.<id>!" of this client gets the messages of its process
// channels that have no mailbox of their own; a channel with a mailbox keeps its messages.
func TestProcessPrefixReceive(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	prefix := ch[:strings.IndexByte(ch, '!')+1]
	q := newQueue(t)
	op := c.receivePending(prefix, q)
	sender.send(prefix+strings.Repeat("ab", 16), numbered(t, 1))
	if r := q.one(); r.Op != op || r.Status != cnOK || numberOf(r.Data) != 1 {
		t.Errorf("prefix receive: %v, want op %d CN_OK n=1", r, op)
	}
	c.receivePending(prefix, q)
	sender.send(ch, numbered(t, 2))
	c.barrier(sender)
	if got := numberOf(c.receiveNow(ch)); got != 2 {
		t.Errorf("own mailbox got n=%d", got)
	}
	q.quiet(20 * time.Millisecond)
}

// Messages to one channel arrive in order, with each next receive started as soon as the
// previous result was taken, as a host loop does.
func TestReceiveOrder(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, map[string]any{"capacity": 1000}) // the default, 100, would drop some
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	q := newQueue(t)
	const total = 200
	go func() {
		for i := range total {
			b, n := bp(numbered(t, i))
			if st := cnSend(sender.h, cs(ch), b, n, sender.own.h, 0, nil); st != cnOK {
				stray("cn_send: %s", name(st))
			}
		}
	}()
	var got []int
	for len(got) < total {
		st, body, _ := c.receive(ch, q, 0)
		switch st {
		case cnOK:
			got = append(got, numberOf(body))
		case cnPending:
			r := q.one()
			if r.Status != cnOK {
				t.Fatalf("result %v", r)
			}
			got = append(got, numberOf(r.Data))
		default:
			t.Fatalf("cn_receive: %s", name(st))
		}
	}
	for i, n := range got {
		if n != i {
			t.Fatalf("order: got %v", got)
		}
	}
}

// Results of received messages are queued in the order the client received them, across
// subscriptions: process channels (one subscription), plain channels (one each) and group
// members (one per group), all sent by one publisher, whose order the server keeps.
func TestArrivalOrderAcrossSubscriptions(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	q := newQueue(t)
	type target struct {
		send func(n int)
		op   uint64
	}
	var targets []target
	for i := range 24 {
		switch i % 3 {
		case 0:
			ch := c.newChannel("")
			targets = append(targets, target{func(n int) { sender.send(ch, numbered(t, n)) }, c.receivePending(ch, q)})
		case 1:
			ch := uniq(t, "plain") + string(rune('a'+i))
			op := c.receivePending(ch, q)
			ts.waitInterest(t, "channels.ch."+ch)
			targets = append(targets, target{func(n int) { sender.send(ch, numbered(t, n)) }, op})
		case 2:
			ch, group := c.newChannel(""), uniq(t, "grp")+string(rune('a'+i))
			c.groupAdd(group, ch)
			targets = append(targets, target{func(n int) { sender.groupSend(group, numbered(t, n)) }, c.receivePending(ch, q)})
		}
	}
	// A send order that mixes the kinds: 0, 7, 14, 21, 4, 11, ...
	var order []int
	for i := range targets {
		order = append(order, (i*7)%len(targets))
	}
	for n, i := range order {
		targets[i].send(n)
	}
	var got []result
	for deadline := time.Now().Add(wait); len(got) < len(targets) && time.Now().Before(deadline); {
		if readable(q.rfd, 10*time.Millisecond) {
			drain(t, q.rfd)
		}
		got = append(got, q.take(1)...) // one at a time: the order of single takes counts too
	}
	if len(got) != len(targets) {
		t.Fatalf("%d of %d results", len(got), len(targets))
	}
	for n, r := range got {
		if r.Status != cnOK || numberOf(r.Data) != n || r.Op != targets[order[n]].op {
			var nums []int
			for _, r := range got {
				nums = append(nums, numberOf(r.Data))
			}
			t.Fatalf("results not in arrival order: %v", nums)
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
	q := newQueue(t)
	op := c.receivePending(waiting, q)
	sender.send(full, numbered(t, 1))
	c.barrier(sender)
	if st, msg := onThread(func() int32 { return cnFlush(c.h) }); st != cnOK || msg != "" {
		t.Fatalf("cn_flush: %s (%q)", name(st), msg)
	}
	// The waiting receive still waits, and still gets what is sent to it.
	q.quiet(20 * time.Millisecond)
	sender.send(waiting, numbered(t, 2))
	if r := q.one(); r.Op != op || r.Status != cnOK || numberOf(r.Data) != 2 {
		t.Errorf("waiting receive after cn_flush: %v, want CN_OK n=2", r)
	}
	// The message that waited in a mailbox is gone, and so is the membership.
	c.nothingWaiting(full)
	sender.groupSend(group, numbered(t, 3))
	c.barrier(sender)
	c.nothingWaiting(full)
	if s := c.stats(); stat(s, "groups") != 0 {
		t.Errorf("stats after cn_flush: groups = %v, want 0", s["groups"])
	}
}

// The library reads the channel name of cn_receive in place and keeps only copies: a host may
// overwrite its buffer once the call returns, for a receive that subscribes (a plain channel's
// first), one that waits in an existing mailbox, and one that finds a message waiting.
func TestReceiveNameBufferReused(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	other := connect(t, ts.url, nil)
	ch := uniq(t, "reused")
	q := newQueue(t)
	buffer := []byte(ch + "\x00")
	receive := func() (int32, uint64) {
		var out, n uintptr
		var op uint64
		st, msg := onThread(func() int32 { return cnReceive(c.h, &buffer[0], q.h, 0, &out, &n, &op) })
		for i := range len(buffer) - 1 { // another name of the same length, as a reused buffer would hold
			buffer[i] = 'x'
		}
		if st != cnPending && st != cnOK {
			t.Fatalf("cn_receive: %s (%s)", name(st), msg)
		}
		return st, op
	}
	deliverTo := func(op uint64, n int) {
		t.Helper()
		other.send(ch, numbered(t, n))
		if r := q.one(); r.Op != op || r.Status != cnOK || numberOf(r.Data) != n {
			t.Fatalf("result %v, want op %d with message %d", r, op, n)
		}
	}
	st, op := receive()
	if st != cnPending {
		t.Fatalf("first receive: %s, want CN_PENDING", name(st))
	}
	ts.waitInterest(t, "channels.ch."+ch)
	deliverTo(op, 1)

	copy(buffer, ch)
	if st, op = receive(); st != cnPending {
		t.Fatalf("second receive: %s, want CN_PENDING", name(st))
	}
	deliverTo(op, 2)

	other.send(ch, numbered(t, 3))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		copy(buffer, ch)
		var out, n uintptr
		var op uint64
		st, _ := onThread(func() int32 { return cnReceive(c.h, &buffer[0], q.h, 0, &out, &n, &op) })
		if st == cnOK {
			if got := numberOf(cBytes(out, n)); got != 3 {
				t.Fatalf("cn_receive: message %d, want 3", got)
			}
			return
		}
		if st != cnPending || time.Now().After(deadline) {
			t.Fatalf("cn_receive: %s, want message 3 waiting in the mailbox", name(st))
		}
		cnCancel(c.h, op) // it had not arrived yet
	}
}
