//go:build linux

package abitest

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"
)

// cancelSetup is a receiving client with a channel, a sender, and a queue for the receives.
type cancelSetup struct {
	c, sender *client
	ch        string
	q         *queue
}

func newCancelSetup(t *testing.T, extra map[string]any) cancelSetup {
	ts := startServer(t)
	c := connect(t, ts.url, extra)
	return cancelSetup{c: c, sender: connect(t, ts.url, nil), ch: c.newChannel(""), q: newQueue(t)}
}

// delivered is the client's delivered counter.
func (s cancelSetup) delivered() float64 { return stat(s.c.stats(), "delivered") }

// cancel is cn_cancel with its cn_last_error().
func (s cancelSetup) cancel(op uint64) (int32, string) {
	return onThread(func() int32 { return cnCancel(s.c.h, op) })
}

// cn_cancel of a receive that waits: CN_OK, no result ever, and the message goes to the next
// receive. A second cancel is CN_NOT_PENDING.
func TestCancelWaiting(t *testing.T) {
	s := newCancelSetup(t, nil)
	op := s.c.receivePending(s.ch, s.q)
	if st, msg := s.cancel(op); st != cnOK || msg != "" {
		t.Fatalf("cn_cancel of a waiting receive: %s (%q), want CN_OK", name(st), msg)
	}
	if st, msg := s.cancel(op); st != cnNotPending || msg == "" {
		t.Errorf("second cn_cancel: %s (%q), want CN_NOT_PENDING with a detail", name(st), msg)
	}
	s.sender.send(s.ch, numbered(t, 1))
	if n := numberOf(s.c.receiveAny(s.ch)); n != 1 {
		t.Errorf("after a cancel the next receive got n=%d, want 1", n)
	}
	s.q.quiet(50 * time.Millisecond)
}

// cn_cancel of a receive whose result waits in the queue, not taken yet: CN_OK, the result is
// never taken, and the message is received again by the next receive (counted once).
func TestCancelQueuedResult(t *testing.T) {
	s := newCancelSetup(t, nil)
	op := s.c.receivePending(s.ch, s.q)
	s.sender.send(s.ch, numbered(t, 1))
	if !readable(s.q.rfd, wait) {
		t.Fatal("no notify byte for the result")
	}
	if st, msg := s.cancel(op); st != cnOK {
		t.Fatalf("cn_cancel of a queued result: %s (%q), want CN_OK", name(st), msg)
	}
	if got := s.q.takeNow(); len(got) != 0 {
		t.Errorf("a withdrawn result was taken: %v", got)
	}
	if n := numberOf(s.c.receiveNow(s.ch)); n != 1 {
		t.Errorf("the next receive got n=%d, want the message of the withdrawn result, 1", n)
	}
	if d := s.delivered(); d != 1 {
		t.Errorf("delivered = %v, want 1: the withdrawn receive does not count", d)
	}
	if st, _ := s.cancel(op); st != cnNotPending {
		t.Errorf("second cn_cancel: %s, want CN_NOT_PENDING", name(st))
	}
}

// cn_cancel of a receive whose result the last take handed over (the host's consumer was
// cancelled after the result reached it): CN_OK, and the message goes back to the front of the
// mailbox, before messages that arrived meanwhile. A cn_receive with the queue in between does
// not end that chance; only the next take does.
func TestCancelTakenResult(t *testing.T) {
	s := newCancelSetup(t, nil)
	op := s.c.receivePending(s.ch, s.q)
	s.sender.send(s.ch, numbered(t, 1))
	if r := s.q.one(); r.Op != op || numberOf(r.Data) != 1 {
		t.Fatalf("result %v, want op %d n=1", r, op)
	}
	s.sender.send(s.ch, numbered(t, 2))
	s.sender.send(s.ch, numbered(t, 3))
	s.c.barrier(s.sender)
	// A receive with the same queue (on another channel) releases what the take lent, but the
	// result can still be given back.
	other := s.c.newChannel("")
	s.c.send(other, numbered(t, 9))
	s.c.barrier(s.c)
	if st, body, _ := s.c.receive(other, s.q, 0); st != cnOK || numberOf(body) != 9 {
		t.Fatalf("cn_receive at once with the queue: %s n=%d", name(st), numberOf(body))
	}
	if st, msg := s.cancel(op); st != cnOK {
		t.Fatalf("cn_cancel of a taken result: %s (%q), want CN_OK", name(st), msg)
	}
	for want := 1; want <= 3; want++ {
		if n := numberOf(s.c.receiveNow(s.ch)); n != want {
			t.Errorf("after the give-back: n=%d, want %d (the given back message first, then the rest in order)", n, want)
		}
	}
	if st, _ := s.cancel(op); st != cnNotPending {
		t.Errorf("second cn_cancel: %s, want CN_NOT_PENDING", name(st))
	}
	s.q.quiet(20 * time.Millisecond)
}

// After the next take the result is the host's for good: cn_cancel is CN_NOT_PENDING and the
// message does not come back.
func TestCancelAfterSecondTake(t *testing.T) {
	s := newCancelSetup(t, nil)
	op := s.c.receivePending(s.ch, s.q)
	s.sender.send(s.ch, numbered(t, 1))
	if r := s.q.one(); r.Op != op {
		t.Fatalf("result %v, want op %d", r, op)
	}
	if got := s.q.take(4); len(got) != 0 {
		t.Fatalf("second take: %v", got)
	}
	if st, msg := s.cancel(op); st != cnNotPending || msg == "" {
		t.Errorf("cn_cancel after a second take: %s (%q), want CN_NOT_PENDING with a detail", name(st), msg)
	}
	s.c.nothingWaiting(s.ch)
	if d := s.delivered(); d != 1 {
		t.Errorf("delivered = %v, want 1", d)
	}
}

// A message given back keeps its place in time: with expiry 0.5 s, one given back after 0.7 s
// has expired and is dropped as expired, not received.
func TestCancelKeepsExpiry(t *testing.T) {
	s := newCancelSetup(t, map[string]any{"expiry": 0.5})
	op := s.c.receivePending(s.ch, s.q)
	s.sender.send(s.ch, numbered(t, 1))
	s.q.one()
	time.Sleep(700 * time.Millisecond)
	if st, _ := s.cancel(op); st != cnOK {
		t.Fatalf("cn_cancel of a taken result: %s, want CN_OK", name(st))
	}
	s.c.nothingWaiting(s.ch)
	if n := stat(s.c.stats(), "dropped.expired"); n != 1 {
		t.Errorf("dropped.expired = %v, want 1", n)
	}
}

// Handles: an op never issued and op 0 are CN_INVALID_HANDLE; another client's op is
// CN_NOT_PENDING and does not withdraw it; an unknown client is CN_INVALID_HANDLE.
func TestCancelHandles(t *testing.T) {
	s := newCancelSetup(t, nil)
	for _, op := range []uint64{0, 1 << 60} {
		if st, msg := s.cancel(op); st != cnInvalidHandle || msg == "" {
			t.Errorf("cn_cancel(op %d): %s (%q), want CN_INVALID_HANDLE", op, name(st), msg)
		}
	}
	sch := s.sender.newChannel("")
	sop := s.sender.receivePending(sch, s.q)
	if st, _ := s.cancel(sop); st != cnNotPending {
		t.Errorf("cn_cancel of another client's op: %s, want CN_NOT_PENDING", name(st))
	}
	if st := cnCancel(1<<60, sop); st != cnInvalidHandle {
		t.Errorf("cn_cancel with an unknown client: %s, want CN_INVALID_HANDLE", name(st))
	}
	s.c.send(sch, numbered(t, 3))
	if r := s.q.one(); r.Op != sop || r.Status != cnOK || numberOf(r.Data) != 3 {
		t.Errorf("the other client's receive: %v (a cancel through the wrong client must not withdraw it)", r)
	}
}

// Receives started and cancelled in tight loops on several threads (each with its own queue),
// racing with sends: cancels that meet a delivery, give back taken results, or come after the
// next take, and receives started over (channel NULL), then kept or cancelled. Every
// message is received exactly once, and delivered counts exactly those kept.
func TestCancelStorm(t *testing.T) {
	ts := startServer(t)
	const workers, sends = 4, 800
	clients := []*client{
		connect(t, ts.url, map[string]any{"capacity": 1000}),
		connect(t, ts.url, map[string]any{"capacity": 1000}),
	}
	sender := connect(t, ts.url, nil)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		tallies = map[string]int{}
	)
	for k := range workers {
		c := clients[k%len(clients)]
		ch := c.newChannel("")
		q := newQueue(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			go func() {
				for i := range sends {
					b, n := bp(numbered(t, k*100000+i))
					if st := cnSend(sender.h, cs(ch), b, n, sender.own.h, 0, nil); st != cnOK {
						stray("worker %d: cn_send: %s", k, name(st))
					}
					time.Sleep(time.Duration(i%4) * 40 * time.Microsecond)
				}
			}()
			tally := stormWorker(t, c, ch, q, k, sends)
			mu.Lock()
			for key, n := range tally {
				tallies[key] += n
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	for i, c := range clients {
		if d := int(stat(c.stats(), "delivered")); d != workers/len(clients)*sends {
			t.Errorf("client %d: delivered = %v, want %d (the messages kept; given back ones do not count)", i, d, workers/len(clients)*sends)
		}
	}
	t.Logf("outcomes: %v", tallies)
	if tallies["given back"] == 0 || tallies["withdrawn"] == 0 || tallies["kept"] == 0 ||
		tallies["again withdrawn"] == 0 || tallies["again kept"] == 0 {
		t.Errorf("the storm missed a path: %v", tallies)
	}
}

// stormWorker receives the sends messages numbered k*100000+i on ch, cancelling at random, and
// checks that each came once. It reports with t.Errorf (it runs on its own goroutine) and returns
// how often each path was taken.
func stormWorker(t *testing.T, c *client, ch string, q *queue, k, sends int) map[string]int {
	rng := rand.New(rand.NewPCG(uint64(k), 7))
	count := map[int]int{}
	tally := map[string]int{}
	take := func() []result { // a host's take, here without Fatal (another goroutine)
		raw, st, msg := q.takeRaw(16)
		if st != cnOK {
			t.Errorf("worker %d: cn_queue_take: %s (%s)", k, name(st), msg)
		}
		out := make([]result, len(raw))
		for i, r := range raw {
			out[i] = copyResult(t, r)
		}
		return out
	}
	// await takes until op's result came; other results are errors.
	await := func(op uint64) (result, bool) {
		for deadline := time.Now().Add(wait); time.Now().Before(deadline); {
			if !readable(q.rfd, time.Until(deadline)) {
				break
			}
			drain(t, q.rfd)
			for _, r := range take() {
				if r.Op == op {
					return r, true
				}
				t.Errorf("worker %d: result of another op: %v", k, r)
			}
		}
		t.Errorf("worker %d: no result for op %d", k, op)
		return result{}, false
	}
	// withdraw cancels op before any take of its result: no result may come after CN_OK.
	withdraw := func(op uint64, path string) {
		if st := cnCancel(c.h, op); st != cnOK {
			t.Errorf("worker %d: cn_cancel (%s): %s, want CN_OK", k, path, name(st))
		}
		drain(t, q.rfd)
		for _, r := range take() {
			t.Errorf("worker %d: a result after CN_OK from cn_cancel (%s): %v", k, path, r)
		}
		tally[path]++
	}
	deadline := time.Now().Add(30 * time.Second)
	for received := 0; received < sends; {
		if time.Now().After(deadline) {
			t.Errorf("worker %d: %d of %d messages within 30 s", k, received, sends)
			return tally
		}
		var out, n uintptr
		var op uint64
		switch st := cnReceive(c.h, cs(ch), q.h, 0, &out, &n, &op); st {
		case cnOK:
			count[numberOf(cBytes(out, n))]++
			received++
			tally["at once"]++
			continue
		case cnPending:
		default:
			t.Errorf("worker %d: cn_receive: %s", k, name(st))
			return tally
		}
		switch rng.IntN(4) {
		case 0: // cancel after a moment: it may meet the delivery
			for end := time.Now().Add(time.Duration(rng.IntN(80)) * time.Microsecond); time.Now().Before(end); {
			}
			withdraw(op, "withdrawn")
		case 1: // the consumer goes away after the result reached it: give it back
			if _, ok := await(op); !ok {
				return tally
			}
			if st := cnCancel(c.h, op); st != cnOK {
				t.Errorf("worker %d: cn_cancel of a taken result: %s, want CN_OK", k, name(st))
			}
			tally["given back"]++
		case 2: // kept: the next take ends the chance to give it back
			r, ok := await(op)
			if !ok {
				return tally
			}
			for _, extra := range take() {
				t.Errorf("worker %d: unexpected result %v", k, extra)
			}
			if st := cnCancel(c.h, op); st != cnNotPending {
				t.Errorf("worker %d: cn_cancel after the next take: %s, want CN_NOT_PENDING", k, name(st))
			}
			if r.Status == cnOK {
				count[numberOf(r.Data)]++
				received++
			}
			tally["kept"]++
		case 3: // kept, and the receive starts over (channel NULL), then waits or is cancelled
			r, ok := await(op)
			if !ok {
				return tally
			}
			if r.Status == cnOK {
				count[numberOf(r.Data)]++
				received++
			}
			if received == sends {
				continue
			}
			again := op
			switch st := cnReceive(c.h, nil, q.h, 0, &out, &n, &again); {
			case st == cnOK:
				count[numberOf(cBytes(out, n))]++
				received++
				tally["again at once"]++
			case st == cnPending && rng.IntN(2) == 0:
				withdraw(op, "again withdrawn")
			case st == cnPending:
				if r, ok := await(op); !ok {
					return tally
				} else if r.Status == cnOK {
					count[numberOf(r.Data)]++
					received++
				}
				tally["again kept"]++
			default:
				t.Errorf("worker %d: cn_receive starting over: %s", k, name(st))
				return tally
			}
		}
	}
	var lost, dup []int
	for i := range sends {
		switch count[k*100000+i] {
		case 0:
			lost = append(lost, i)
		case 1:
		default:
			dup = append(dup, i)
		}
	}
	if len(lost) > 0 || len(dup) > 0 || len(count) != sends {
		t.Errorf("worker %d: lost %v, duplicated %v, %d distinct: %s", k, lost, dup, len(count), fmt.Sprint(tally))
	}
	return tally
}

// cn_cancel may be called from any thread, concurrently: threads that cancel the same waiting
// receive at once all return, one with CN_OK, the others with CN_NOT_PENDING. (The race is
// narrow: it is tried many times, for a bounded time.)
func TestCancelConcurrentSameOp(t *testing.T) {
	s := newCancelSetup(t, nil)
	const threads = 4
	deadline := time.Now().Add(8 * time.Second)
	attempts := 0
	for ; attempts < 5000 && time.Now().Before(deadline); attempts++ {
		op := s.c.receivePending(s.ch, s.q)
		start := make(chan struct{})
		sts := make(chan int32, threads)
		for range threads {
			go func() {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				<-start
				sts <- cnCancel(s.c.h, op)
			}()
		}
		close(start)
		ok := 0
		for k := range threads {
			select {
			case st := <-sts:
				switch st {
				case cnOK:
					ok++
				case cnNotPending:
				default:
					t.Fatalf("attempt %d: concurrent cn_cancel: %s", attempts, name(st))
				}
			case <-time.After(wait):
				t.Fatalf("attempt %d: %d of %d concurrent cn_cancel calls of op %d never returned", attempts, threads-k, threads, op)
			}
		}
		if ok != 1 {
			t.Fatalf("attempt %d: %d concurrent cn_cancel calls said CN_OK, want exactly 1", attempts, ok)
		}
	}
	t.Logf("%d attempts", attempts)
	s.q.quiet(10 * time.Millisecond)
}
