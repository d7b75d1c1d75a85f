package layer

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// wordReceiver is a Receipt with a word, as a host that starts its receives over through memory
// makes it, and the results it was delivered.
type wordReceiver struct {
	receipt *Receipt
	word    atomic.Uint64
	got     chan delivery
}

type delivery struct {
	n   int
	err error
}

const testKey = 42

func newWordReceiver(t *testing.T) *wordReceiver {
	r := &wordReceiver{receipt: new(Receipt), got: make(chan delivery, 4096)}
	r.receipt.ShareWord(&r.word, testKey)
	return r
}

func (r *wordReceiver) newReceipt(t *testing.T) func() (*Receipt, Receiver) {
	return func() (*Receipt, Receiver) {
		return r.receipt, deliverFunc(func(m Message, err error) {
			n := -1
			if err == nil {
				n = numberIn(t, m.Body)
			}
			r.got <- delivery{n, err}
		})
	}
}

func (r *wordReceiver) next(t *testing.T) delivery {
	t.Helper()
	select {
	case d := <-r.got:
		return d
	case <-time.After(5 * time.Second):
		t.Fatal("nothing was delivered")
		return delivery{}
	}
}

func (r *wordReceiver) rearm() bool { return Rearm(&r.word, testKey) }

// A receive with a word parks after its message, and its host starts it over with Rearm: the
// next message comes to the same Receipt with no call into the layer. A message that comes while
// it is parked revokes the park: Rearm fails, and ReceiveAgain returns that message.
func TestRearmStartsAReceiveOver(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	r := newWordReceiver(t)
	if _, op, err := a.StartReceiveInto(ch, r.newReceipt(t)); err != nil || op != &r.receipt.Op {
		t.Fatalf("StartReceiveInto: op %v, %v; want the Receipt's Op", op, err)
	}
	for n := 1; n <= 3; n++ {
		msgSend(t, b, ch, map[string]any{"type": "n", "n": n})
		if d := r.next(t); d.n != n || d.err != nil {
			t.Fatalf("delivered %+v, want n=%d", d, n)
		}
		if n < 3 && !r.rearm() {
			t.Fatalf("Rearm after message %d failed", n)
		}
	}
	msgSend(t, b, ch, map[string]any{"type": "n", "n": 4})
	waitFor(t, 5*time.Second, "message 4 in the mailbox", func() bool { return msgQueued(a, ch) == 1 })
	if r.rearm() {
		t.Fatal("Rearm with a message waiting succeeded")
	}
	if msg, op, err := a.ReceiveAgain(r.receipt); err != nil || op != nil || numberIn(t, msg.Body) != 4 {
		t.Fatalf("ReceiveAgain: op %v, %v; want message 4", op, err)
	}
	if _, op, err := a.ReceiveAgain(r.receipt); err != nil || op == nil {
		t.Fatalf("ReceiveAgain on an empty mailbox: op %v, %v; want it waiting", op, err)
	}
	msgSend(t, b, ch, map[string]any{"type": "n", "n": 5})
	if d := r.next(t); d.n != 5 {
		t.Fatalf("delivered %+v, want n=5", d)
	}
	if !r.rearm() || !r.receipt.Cancel() {
		t.Fatal("an armed receive was not cancelled")
	}
	msgSend(t, b, ch, map[string]any{"type": "n", "n": 6})
	waitFor(t, 5*time.Second, "message 6 in the mailbox", func() bool { return msgQueued(a, ch) == 1 })
	if st := a.Stats(); st.Delivered != 5 {
		t.Errorf("Delivered = %d, want 5", st.Delivered)
	}
}

// A parked receive that its host did not start over does not hold its mailbox: it is reclaimed
// after the grace (S5), and Rearm fails from then on. An armed one holds it, as a waiting one does.
func TestRearmParkedReceiveDoesNotHoldItsMailbox(t *testing.T) {
	s := startServer(t)
	a := connect(t, lcGraceConfig(s.url()))
	b := connect(t, testConfig(nil, s.url()))
	parked, armed := msgNewChannel(t, a), msgNewChannel(t, a)
	p, r := newWordReceiver(t), newWordReceiver(t)
	for _, c := range []struct {
		ch string
		r  *wordReceiver
	}{{parked, p}, {armed, r}} {
		if _, op, err := a.StartReceiveInto(c.ch, c.r.newReceipt(t)); err != nil || op == nil {
			t.Fatalf("StartReceiveInto: op %v, %v", op, err)
		}
		msgSend(t, b, c.ch, map[string]any{"type": "n", "n": 1})
		if d := c.r.next(t); d.n != 1 {
			t.Fatalf("delivered %+v, want n=1", d)
		}
	}
	if !r.rearm() {
		t.Fatal("Rearm failed")
	}
	waitFor(t, 5*time.Second, "the parked receive's mailbox to be reclaimed", func() bool { return !lcHasBox(a, parked) })
	if p.rearm() {
		t.Error("Rearm after the mailbox was reclaimed succeeded")
	}
	if !lcHasBox(a, armed) {
		t.Fatal("the armed receive's mailbox was reclaimed")
	}
	msgSend(t, b, armed, map[string]any{"type": "n", "n": 2})
	if d := r.next(t); d.n != 2 {
		t.Fatalf("delivered %+v, want n=2", d)
	}
}

// Close ends an armed receive with ErrClosed; a parked one that was not armed gets nothing.
func TestRearmClose(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	p, r := newWordReceiver(t), newWordReceiver(t)
	for _, w := range []*wordReceiver{p, r} {
		ch := msgNewChannel(t, a)
		if _, op, err := a.StartReceiveInto(ch, w.newReceipt(t)); err != nil || op == nil {
			t.Fatalf("StartReceiveInto: op %v, %v", op, err)
		}
		msgSend(t, b, ch, map[string]any{"type": "n", "n": 1})
		w.next(t)
	}
	if !r.rearm() {
		t.Fatal("Rearm failed")
	}
	_ = a.Close()
	if d := r.next(t); !errors.Is(d.err, ErrClosed) {
		t.Fatalf("the armed receive got %+v, want ErrClosed", d)
	}
	if p.rearm() {
		t.Error("Rearm after Close succeeded")
	}
	select {
	case d := <-p.got:
		t.Fatalf("the parked receive got %+v after Close", d)
	case <-time.After(50 * time.Millisecond):
	}
}

// A host that starts its receive over, by word or by call, while messages stream in gets each
// message once and in order, whichever side wins each race (run with -race).
func TestRearmRacesWithArrivals(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Capacity = 100000 // the host may fall behind the sender: nothing is dropped for room
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	r := newWordReceiver(t)
	if _, op, err := a.StartReceiveInto(ch, r.newReceipt(t)); err != nil || op == nil {
		t.Fatalf("StartReceiveInto: op %v, %v", op, err)
	}
	const messages = 2000
	go func() {
		for n := 1; n <= messages; n++ {
			msgSend(t, b, ch, map[string]any{"type": "n", "n": n})
			if n%8 == 0 {
				time.Sleep(100 * time.Microsecond) // bursts, then quiet: the host waits by word too
			}
		}
	}()
	byWord, byCall := 0, 0
	for want := 1; want <= messages; {
		if d := r.next(t); d.n != want || d.err != nil {
			t.Fatalf("delivered %+v, want n=%d", d, want)
		}
		want++
		for want <= messages { // start over: by word, else by call, which may find messages
			if r.rearm() {
				byWord++
				break
			}
			msg, op, err := a.ReceiveAgain(r.receipt)
			if err != nil {
				t.Fatalf("ReceiveAgain: %v", err)
			}
			byCall++
			if op != nil {
				break
			}
			if n := numberIn(t, msg.Body); n != want {
				t.Fatalf("ReceiveAgain returned n=%d, want %d", n, want)
			}
			want++
		}
	}
	t.Logf("started over %d times by word and %d by call", byWord, byCall)
	if st := a.Stats(); st.Delivered != messages {
		t.Errorf("Delivered = %d, want %d", st.Delivered, messages)
	}
}

// Receives on one channel are served in the order they began to wait: one that got a message
// and was started over through its word waits behind a receive that was waiting already.
func TestRearmKeepsTheOrderOfReceives(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	r := newWordReceiver(t)
	if _, op, err := a.StartReceiveInto(ch, r.newReceipt(t)); err != nil || op == nil {
		t.Fatalf("StartReceiveInto: op %v, %v", op, err)
	}
	other := make(chan int, 1)
	if _, op, err := a.StartReceive(ch, func(m Message, err error) { other <- numberIn(t, m.Body) }); err != nil || op == nil {
		t.Fatalf("StartReceive: op %v, %v", op, err)
	}
	msgSend(t, b, ch, map[string]any{"type": "n", "n": 1})
	if d := r.next(t); d.n != 1 {
		t.Fatalf("the first receive got %+v, want n=1", d)
	}
	if !r.rearm() {
		t.Fatal("Rearm failed")
	}
	msgSend(t, b, ch, map[string]any{"type": "n", "n": 2})
	select {
	case n := <-other:
		if n != 2 {
			t.Fatalf("the second receive got n=%d, want 2", n)
		}
	case d := <-r.got:
		t.Fatalf("the receive started over got %+v before the one that waited longer", d)
	case <-time.After(5 * time.Second):
		t.Fatal("message 2 was not delivered")
	}
	msgSend(t, b, ch, map[string]any{"type": "n", "n": 3})
	if d := r.next(t); d.n != 3 {
		t.Fatalf("the receive started over got %+v, want n=3", d)
	}
}
