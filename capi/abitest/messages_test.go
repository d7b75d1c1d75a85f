//go:build linux

package abitest

import (
	"bytes"
	"math/rand/v2"
	"sync"
	"syscall"
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
	// The process subscription is confirmed now: the next one finishes at once.
	w := newWaiter(1, nil)
	var out uintptr
	var op uint64
	if st := cnNewChannel(c.h, nil, completeCB, w.closure, &out, &op); st != cnOK {
		t.Fatalf("second cn_new_channel: %s, want CN_OK at once", name(st))
	}
	second := takeString(out)
	if second == first || clientIDOf(t, second) != m[2] {
		t.Errorf("second name %q: want a new name with the client id of %q", second, first)
	}
	// The waiting form, and "" as the prefix.
	if st := cnNewChannel(c.h, cs(""), 0, 0, &out, nil); st != cnOK {
		t.Fatalf("cn_new_channel waiting form: %s", name(st))
	}
	if s := takeString(out); !processName.MatchString(s) || clientIDOf(t, s) != m[2] {
		t.Errorf("waiting form name %q", s)
	}
	// A prefix of its own.
	if p := c.newChannel("daphne.response"); !processName.MatchString(p) || p[:len("daphne.response.")] != "daphne.response." || clientIDOf(t, p) != m[2] {
		t.Errorf("cn_new_channel(daphne.response) = %q", p)
	}
	// A pending new_channel (a prefix whose subscription is new) can be withdrawn.
	cancelled := newWaiter(1, nil)
	op = 0
	switch st := cnNewChannel(c.h, cs("never.used"), completeCB, cancelled.closure, &out, &op); st {
	case cnPending:
		switch st := cnCancel(c.h, op); st {
		case cnOK:
			cancelled.none(t, 100*time.Millisecond)
		case cnNotPending:
			if r := cancelled.wait(t); r.Status != cnOK {
				t.Errorf("new_channel callback: %s", nameOf(r.Status))
			}
		default:
			t.Errorf("cn_cancel of a pending new_channel: %s", nameOf(st))
		}
	case cnOK:
		cnFree(out)
	default:
		t.Errorf("cn_new_channel(never.used): %s", nameOf(st))
	}
	// Another client has another id.
	d := connect(t, ts.url, nil)
	if id := clientIDOf(t, d.newChannel("")); id == m[2] {
		t.Errorf("two clients share the client id %s", id)
	}
	w.none(t, 0)
}

func TestSendThenReceiveAtOnce(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	body := pack(t, map[string]any{"type": "hello", "text": "wörld", "bin": []byte{0, 1, 2, 255}})
	want := append([]byte(nil), body...)
	b, n := bp(body)
	name := []byte(ch + "\x00")
	if st := cnSend(c.h, &name[0], b, n, 0, 0, nil); st != cnOK {
		t.Fatalf("cn_send: %s", nameOf(st))
	}
	// Inputs are copied before the call returns: scribble over both.
	for i := range body {
		body[i] = 0xc1
	}
	for i := range name {
		name[i] = 'x'
	}
	c.barrier(c)
	w := newWaiter(1, nil)
	var out, got uintptr
	var op uint64
	st := cnReceive(c.h, cs(ch), completeCB, w.closure, &out, &got, &op)
	if st != cnOK {
		t.Fatalf("cn_receive of a waiting message: %s, want CN_OK at once", nameOf(st))
	}
	if out == 0 || got != uintptr(len(want)) {
		t.Fatalf("body %#x len %d, want len %d", out, got, len(want))
	}
	if data := takeBytes(out, got); !bytes.Equal(data, want) {
		t.Errorf("received %x, want %x", data, want)
	}
	w.none(t, 50*time.Millisecond)
	if st, _, op := c.receive(ch, w); st != cnPending {
		t.Errorf("second receive: %s, want CN_PENDING", nameOf(st))
	} else {
		cnCancel(c.h, op)
	}
}

func TestReceivePendingThenSend(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	other := connect(t, ts.url, nil)
	ch := c.newChannel("")
	w := newWaiter(2, nil)
	op := c.receivePending(ch, w)
	w.none(t, 20*time.Millisecond)
	// A send on a healthy connection finishes at once, also in the pending form: CN_OK and
	// no callback.
	body := numbered(t, 42)
	sent := newWaiter(1, nil)
	b, n := bp(body)
	var sendOp uint64
	if st := cnSend(other.h, cs(ch), b, n, completeCB, sent.closure, &sendOp); st != cnOK {
		t.Fatalf("cn_send (pending form): %s, want CN_OK at once", nameOf(st))
	}
	r := w.wait(t)
	if r.Status != cnOK || !bytes.Equal(r.Data, body) || r.Len != uintptr(len(body)) {
		t.Fatalf("callback: %s %x (len %d), want CN_OK %x", nameOf(r.Status), r.Data, r.Len, body)
	}
	if r.HasText {
		t.Errorf("receive callback text = %q, want NULL", r.Text)
	}
	if st := cnCancel(c.h, op); st != cnNotPending {
		t.Errorf("cn_cancel after the callback: %s, want CN_NOT_PENDING", nameOf(st))
	}
	w.none(t, 50*time.Millisecond)
	sent.none(t, 0)
}

func TestPlainChannel(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	other := connect(t, ts.url, nil)
	ch := uniq(t, "plain")
	w := newWaiter(2, nil)
	if op := c.receivePending(ch, w); op == 0 {
		t.Fatal("no op")
	}
	// The receive subscribed; once the server has the subscription, a send is delivered.
	ts.waitInterest(t, "channels.ch."+ch)
	body := numbered(t, 7)
	other.send(ch, body)
	r := w.wait(t)
	if r.Status != cnOK || !bytes.Equal(r.Data, body) {
		t.Fatalf("callback: %s %x, want CN_OK %x", nameOf(r.Status), r.Data, body)
	}
	// The subscription stays while there are readers: a second round trip.
	other.send(ch, numbered(t, 8))
	if got := numberOf(c.receiveAny(ch)); got != 8 {
		t.Errorf("second message n=%d, want 8", got)
	}
	w.none(t, 20*time.Millisecond)
}

func TestGroupFanOut(t *testing.T) {
	ts := startServer(t)
	a := connect(t, ts.url, nil)
	b := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	group := uniq(t, "room")
	chans := []struct {
		c  *client
		ch string
	}{{a, a.newChannel("")}, {a, a.newChannel("")}, {b, b.newChannel("")}}
	for _, m := range chans {
		m.c.groupAdd(group, m.ch)
		m.c.groupAdd(group, m.ch) // twice is not an error
	}
	var ws []*waiter
	for _, m := range chans {
		w := newWaiter(4, nil)
		m.c.receivePending(m.ch, w)
		ws = append(ws, w)
	}
	body := pack(t, map[string]any{"type": "chat.message", "text": "hi"})
	sender.groupSend(group, body)
	for i, w := range ws {
		if r := w.wait(t); r.Status != cnOK || !bytes.Equal(r.Data, body) {
			t.Errorf("member %d: %s %x", i, nameOf(r.Status), r.Data)
		}
	}
	// Exactly one each: after the traffic has arrived, nothing more is waiting.
	a.barrier(sender)
	b.barrier(sender)
	for i, m := range chans {
		w := newWaiter(1, nil)
		st, data, op := m.c.receive(m.ch, w)
		if st != cnPending {
			t.Errorf("member %d got a second copy: %s %x", i, nameOf(st), data)
			continue
		}
		if st := cnCancel(m.c.h, op); st != cnOK {
			t.Errorf("cancel: %s", nameOf(st))
		}
		w.none(t, 0)
	}
	// A group without members is no error; a discarded member gets nothing.
	sender.groupSend(uniq(t, "empty"), body)
	if st := cnGroupDiscard(a.h, cs(group), cs(chans[0].ch)); st != cnOK {
		t.Errorf("cn_group_discard: %s", nameOf(st))
	}
	if st := cnGroupDiscard(a.h, cs(group), cs(chans[0].ch)); st != cnOK {
		t.Errorf("cn_group_discard of a non-member: %s", nameOf(st))
	}
	sender.groupSend(group, numbered(t, 2))
	if n := numberOf(a.receiveAny(chans[1].ch)); n != 2 {
		t.Errorf("remaining member got n=%d", n)
	}
	a.barrier(sender)
	w := newWaiter(1, nil)
	if st, data, op := a.receive(chans[0].ch, w); st != cnPending {
		t.Errorf("discarded member received: %s %x", nameOf(st), data)
	} else {
		cnCancel(a.h, op)
	}
}

// Messages to one channel arrive in order, with each next receive started from inside the
// previous receive's callback (the pending form, which a callback may use).
func TestCallbackOrder(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	const total = 50
	var (
		mu   sync.Mutex
		got  []int
		errs []string
		done = make(chan struct{})
	)
	var w *waiter
	var next func()
	record := func(body []byte) {
		mu.Lock()
		got = append(got, numberOf(body))
		if len(got) == total {
			close(done)
		}
		mu.Unlock()
	}
	next = func() { // runs in the callback: receive until one is pending
		for {
			var out, n uintptr
			var op uint64
			switch st := cnReceive(c.h, cs(ch), completeCB, w.closure, &out, &n, &op); st {
			case cnOK:
				record(takeBytes(out, n))
				continue
			case cnPending:
			default:
				mu.Lock()
				errs = append(errs, "receive in callback: "+nameOf(st)+" "+cnLastError())
				mu.Unlock()
			}
			return
		}
	}
	w = newWaiter(total+1, func(r cbResult) {
		if r.Status != cnOK {
			mu.Lock()
			errs = append(errs, "callback: "+nameOf(r.Status)+" "+r.Text)
			mu.Unlock()
			return
		}
		record(r.Data)
		mu.Lock()
		finished := len(got) >= total
		mu.Unlock()
		if !finished {
			next()
		}
	})
	c.receivePending(ch, w)
	for i := range total {
		sender.send(ch, numbered(t, i))
	}
	select {
	case <-done:
	case <-time.After(wait):
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range errs {
		t.Error(e)
	}
	if len(got) != total {
		t.Fatalf("received %d of %d: %v", len(got), total, got)
	}
	for i, n := range got {
		if n != i {
			t.Fatalf("order: got %v", got)
		}
	}
}

func TestCancel(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")

	// Before delivery: withdrawn, its callback never runs, the message goes to the next receive.
	cancelled := newWaiter(2, nil)
	op := c.receivePending(ch, cancelled)
	if st := cnCancel(c.h, op); st != cnOK {
		t.Fatalf("cn_cancel of a pending receive: %s", nameOf(st))
	}
	if st := cnCancel(c.h, op); st != cnNotPending {
		t.Errorf("second cn_cancel: %s, want CN_NOT_PENDING", nameOf(st))
	}
	sender.send(ch, numbered(t, 1))
	if n := numberOf(c.receiveAny(ch)); n != 1 {
		t.Errorf("after a cancel the next receive got n=%d, want 1", n)
	}
	cancelled.none(t, 100*time.Millisecond)

	// After delivery: CN_NOT_PENDING.
	w := newWaiter(2, nil)
	op = c.receivePending(ch, w)
	sender.send(ch, numbered(t, 2))
	if r := w.wait(t); r.Status != cnOK || numberOf(r.Data) != 2 {
		t.Fatalf("callback: %s n=%d", nameOf(r.Status), numberOf(r.Data))
	}
	if st := cnCancel(c.h, op); st != cnNotPending {
		t.Errorf("cn_cancel after delivery: %s, want CN_NOT_PENDING", nameOf(st))
	}

	// An op handle never issued, op 0, and the op of another client.
	if st, msg := onThread(func() int32 { return cnCancel(c.h, 999999999) }); st != cnInvalidHandle || msg == "" {
		t.Errorf("cn_cancel of an op never issued: %s (%q), want CN_INVALID_HANDLE", nameOf(st), msg)
	}
	if st, msg := onThread(func() int32 { return cnCancel(c.h, 0) }); st != cnInvalidHandle || msg == "" {
		t.Errorf("cn_cancel(op 0): %s (%q), want CN_INVALID_HANDLE", nameOf(st), msg)
	}
	sch := sender.newChannel("")
	sw := newWaiter(2, nil)
	sop := sender.receivePending(sch, sw)
	if st := cnCancel(c.h, sop); st != cnNotPending && st != cnInvalidHandle {
		t.Errorf("cn_cancel of another client's op: %s, want CN_NOT_PENDING (or CN_INVALID_HANDLE)", nameOf(st))
	}
	c.send(sch, numbered(t, 3))
	if r := sw.wait(t); r.Status != cnOK || numberOf(r.Data) != 3 {
		t.Errorf("the other client's receive: %s n=%d (a cancel through the wrong client must not withdraw it)", nameOf(r.Status), numberOf(r.Data))
	}
}

// Receives started and cancelled in a tight loop, racing with sends: every message is received
// exactly once, either at once (CN_OK) or through a callback (cancel said CN_NOT_PENDING).
func TestCancelStorm(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, map[string]any{"capacity": 1000})
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	const sends, cycles = 300, 500
	var (
		mu    sync.Mutex
		count = map[int]int{}
		bad   []string
	)
	record := func(body []byte) {
		n := numberOf(body)
		mu.Lock()
		count[n]++
		mu.Unlock()
	}
	w := newWaiter(sends+cycles, func(r cbResult) {
		if r.Status != cnOK {
			mu.Lock()
			bad = append(bad, "callback "+nameOf(r.Status)+": "+r.Text)
			mu.Unlock()
			return
		}
		record(r.Data)
	})
	senderDone := make(chan struct{})
	bodies := make([][]byte, sends)
	for i := range bodies {
		bodies[i] = numbered(t, i)
	}
	go func() {
		defer close(senderDone)
		for i, body := range bodies {
			b, n := bp(body)
			if st := cnSend(sender.h, cs(ch), b, n, 0, 0, nil); st != cnOK {
				mu.Lock()
				bad = append(bad, "cn_send: "+nameOf(st))
				mu.Unlock()
			}
			time.Sleep(time.Duration(i%3) * 50 * time.Microsecond)
		}
	}()
	var notPending, withdrawn, immediate int
	rng := rand.New(rand.NewPCG(1, 2))
	sending := true
	for i := 0; i < cycles || sending; i++ {
		select {
		case <-senderDone:
			sending = false
		default:
		}
		var out, n uintptr
		var op uint64
		switch st := cnReceive(c.h, cs(ch), completeCB, w.closure, &out, &n, &op); st {
		case cnOK:
			immediate++
			record(takeBytes(out, n))
		case cnPending:
			// Cancel at once or a little later, so that some cancels meet a delivery.
			for end := time.Now().Add(time.Duration(rng.IntN(40)) * time.Microsecond); time.Now().Before(end); {
			}
			switch st := cnCancel(c.h, op); st {
			case cnOK:
				withdrawn++
			case cnNotPending:
				notPending++
			default:
				t.Fatalf("cn_cancel: %s", nameOf(st))
			}
		default:
			t.Fatalf("cn_receive: %s", nameOf(st))
		}
	}
	<-senderDone
	c.barrier(sender)
	// Everything has arrived: take what the mailbox still holds.
	for {
		var out, n uintptr
		var op uint64
		st := cnReceive(c.h, cs(ch), completeCB, w.closure, &out, &n, &op)
		if st == cnOK {
			immediate++
			record(takeBytes(out, n))
			continue
		}
		if st != cnPending {
			t.Fatalf("drain cn_receive: %s", nameOf(st))
		}
		if cnCancel(c.h, op) == cnNotPending {
			notPending++ // a message handed back meanwhile went to it
			continue
		}
		break
	}
	deadline := time.Now().Add(wait)
	total := func() int {
		mu.Lock()
		defer mu.Unlock()
		s := 0
		for _, k := range count {
			s += k
		}
		return s
	}
	for total() < sends && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // a duplicate would show now
	mu.Lock()
	defer mu.Unlock()
	for _, b := range bad {
		t.Error(b)
	}
	var lost, dup []int
	for i := range sends {
		switch count[i] {
		case 0:
			lost = append(lost, i)
		case 1:
		default:
			dup = append(dup, i)
		}
	}
	if len(count) > sends {
		t.Errorf("received unknown messages: %v", count)
	}
	if len(lost) > 0 || len(dup) > 0 {
		t.Errorf("lost %v, duplicated %v", lost, dup)
	}
	if int64(notPending) != w.calls.Load() {
		t.Errorf("%d cancels said CN_NOT_PENDING, %d callbacks ran: each CN_NOT_PENDING means its callback runs", notPending, w.calls.Load())
	}
	t.Logf("%d at once, %d withdrawn, %d through callbacks", immediate, withdrawn, notPending)
}

func TestPutBack(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	c.send(ch, numbered(t, 1))
	c.send(ch, numbered(t, 2))
	c.barrier(c)
	first := c.receiveNow(ch)
	if numberOf(first) != 1 {
		t.Fatalf("first receive n=%d", numberOf(first))
	}
	b, n := bp(first)
	if st := cnPutBack(c.h, cs(ch), b, n); st != cnOK {
		t.Fatalf("cn_put_back: %s", nameOf(st))
	}
	for i := range first {
		first[i] = 0 // the library copied it
	}
	if got := c.receiveNow(ch); numberOf(got) != 1 {
		t.Errorf("after put_back the next receive got n=%d, want the put back message 1", numberOf(got))
	}
	if got := c.receiveNow(ch); numberOf(got) != 2 {
		t.Errorf("then n=%d, want 2", numberOf(got))
	}
	// Put back with a receive waiting: it gets the message, on a library thread, not during
	// the cn_put_back call on the caller's thread.
	w := newWaiter(1, nil)
	c.receivePending(ch, w)
	body := numbered(t, 3)
	b, n = bp(body)
	var caller int
	st, _ := onThread(func() int32 {
		caller = syscall.Gettid()
		return cnPutBack(c.h, cs(ch), b, n)
	})
	if st != cnOK {
		t.Fatalf("cn_put_back: %s", nameOf(st))
	}
	r := w.wait(t)
	if r.Status != cnOK || numberOf(r.Data) != 3 {
		t.Errorf("waiting receive after put_back: %s n=%d", nameOf(r.Status), numberOf(r.Data))
	}
	if r.Tid == caller {
		t.Error("the receive callback ran on the thread that called cn_put_back, during the call")
	}
}

// A plain channel keeps its subscription across back-to-back receives (release_linger): a
// message sent between a cancelled receive and the next one is not lost. A receive cancelled
// while it still subscribes never calls back.
func TestPlainChannelBackToBack(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := uniq(t, "poll")
	early := newWaiter(1, nil)
	op := c.receivePending(ch, early)
	if st := cnCancel(c.h, op); st != cnOK && st != cnNotPending {
		t.Fatalf("cn_cancel of a subscribing receive: %s", nameOf(st))
	} else if st == cnOK {
		early.none(t, 20*time.Millisecond)
	}
	w := newWaiter(1, nil)
	op = c.receivePending(ch, w)
	ts.waitInterest(t, "channels.ch."+ch)
	if st := cnCancel(c.h, op); st != cnOK {
		t.Fatalf("cn_cancel: %s", nameOf(st))
	}
	sender.send(ch, numbered(t, 1)) // between two polls
	if got := numberOf(c.receiveAny(ch)); got != 1 {
		t.Errorf("the next poll got n=%d, want 1", got)
	}
	w.none(t, 20*time.Millisecond)
}

// A callback may close its own client with the pending form.
func TestCloseFromCallback(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	closed := newWaiter(1, nil)
	var st int32 = -1
	w := newWaiter(1, func(cbResult) { st = cnClose(c.h, completeCB, closed.closure) })
	c.receivePending(ch, w)
	c.send(ch, numbered(t, 1))
	if r := w.wait(t); r.Status != cnOK {
		t.Fatalf("receive callback: %s", nameOf(r.Status))
	}
	switch st {
	case cnPending:
		if r := closed.wait(t); r.Status != cnOK {
			t.Errorf("close callback: %s", nameOf(r.Status))
		}
	case cnOK:
	default:
		t.Fatalf("cn_close (pending form) from a callback: %s", nameOf(st))
	}
	if st := cnStats(c.h, new(uintptr)); st != cnClosed {
		t.Errorf("after the close: cn_stats = %s, want CN_CLOSED", nameOf(st))
	}
}

// nameOf is name, for files where a local variable is called name.
func nameOf(st int32) string { return name(st) }
