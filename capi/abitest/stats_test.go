//go:build linux

package abitest

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Every documented counter is in cn_stats, with the right values: a full mailbox (capacity 1)
// drops new messages, counted and logged as a warning.
func TestStatsAndLog(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, map[string]any{"capacity": 1})
	ch := c.newChannel("")
	for i := range 3 {
		c.send(ch, numbered(t, i))
	}
	c.barrier(c) // 4 published, the marker delivered to a waiting receive

	s := c.stats()
	for _, path := range []string{"published", "delivered", "dropped.capacity", "dropped.expired", "dropped.slow_consumer",
		"dropped.bad_frame", "dropped.no_mailbox", "lost.messages", "lost.bytes", "publish_timeouts", "outbound.bytes",
		"outbound.waiting", "handed_back", "reconnects", "recoveries", "groups_expired", "subscriptions", "mailboxes",
		"groups", "goroutines"} {
		if stat(s, path) < 0 {
			t.Errorf("stats: %s missing or not a number: %v", path, s)
		}
	}
	for path, want := range map[string]float64{
		"published": 4, "delivered": 1, "dropped.capacity": 2, "dropped.expired": 0, "dropped.slow_consumer": 0,
		"dropped.bad_frame": 0, "dropped.no_mailbox": 0, "lost.messages": 0, "lost.bytes": 0, "publish_timeouts": 0,
		"outbound.waiting": 0, "reconnects": 0, "groups": 0,
	} {
		if got := stat(s, path); got != want {
			t.Errorf("stats: %s = %v, want %v", path, got, want)
		}
	}
	if stat(s, "mailboxes") < 2 || stat(s, "subscriptions") < 1 || stat(s, "goroutines") < 1 {
		t.Errorf("stats: mailboxes %v subscriptions %v goroutines %v, want at least 2, 1, 1", s["mailboxes"], s["subscriptions"], s["goroutines"])
	}
	if s["connected"] != true || s["client_id"] != clientIDOf(t, ch) {
		t.Errorf("stats: connected %v client_id %v, want true and the id in %s", s["connected"], s["client_id"], ch)
	}

	// The first message stayed; the two after it were dropped.
	if got := numberOf(c.receiveNow(ch)); got != 0 {
		t.Errorf("the full mailbox kept n=%d, want 0", got)
	}
	if got := stat(c.stats(), "delivered"); got != 2 {
		t.Errorf("stats: delivered = %v after one more receive, want 2", got)
	}

	// The drop was logged as a warning naming the full mailbox.
	for deadline := time.Now().Add(wait); ; time.Sleep(5 * time.Millisecond) {
		found := false
		for _, r := range c.log.snapshot() {
			found = found || r.Level == cnLogWarning && strings.Contains(r.Message, "is full") && strings.Contains(r.Message, ch)
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no CN_LOG_WARNING record saying %s is full; records: %v", ch, c.log.snapshot())
		}
	}
	for _, r := range c.log.snapshot() {
		if r.Level != 10 && r.Level != 20 && r.Level != 30 && r.Level != 40 {
			t.Errorf("log record with level %d, not a CN_LOG_* level: %q", r.Level, r.Message)
		}
	}
	var out uintptr
	if st := cnStats(c.h, &out); st != cnOK {
		t.Fatal(name(st))
	}
	cnFree(out) // freed with cn_free, as the header says
}

// Eight OS threads use one client at once, each on its own channel and with its own queue: a
// send then a receive that finds the message, and a pending receive then the send that ends it.
func TestConcurrentThreads(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	const threads, rounds = 8, 200
	var (
		ready, done sync.WaitGroup
		mu          sync.Mutex
		tids        = map[int]bool{}
		errs        []string
		release     = make(chan struct{})
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		if len(errs) < 20 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
		mu.Unlock()
	}
	chans := make([]string, threads)
	queues := make([]*queue, threads)
	for g := range chans {
		chans[g] = c.newChannel("")
		queues[g] = newQueue(t)
	}
	ready.Add(threads)
	done.Add(threads)
	for g := range threads {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			mu.Lock()
			tids[syscall.Gettid()] = true
			mu.Unlock()
			ready.Done()
			<-release
			ch, q := cs(chans[g]), queues[g]
			for i := range rounds {
				n := g*rounds + i
				b, bn := bp(numbered(t, n))
				send := func() bool {
					if st := cnSend(c.h, ch, b, bn, q.h, 0, nil); st != cnOK {
						fail("thread %d: cn_send: %s %s", g, name(st), cnLastError())
						return false
					}
					return true
				}
				// Even rounds send first, so the receive may find the message (or wait for the
				// dispatcher to route it); odd rounds receive first, on an empty mailbox.
				if i%2 == 0 && !send() {
					return
				}
				var out, blen uintptr
				var op uint64
				switch st := cnReceive(c.h, ch, q.h, 0, &out, &blen, &op); {
				case st == cnOK && i%2 == 0:
					if got := numberOf(cBytes(out, blen)); got != n {
						fail("thread %d: got n=%d, want %d", g, got, n)
					}
					continue
				case st != cnPending:
					fail("thread %d: cn_receive in round %d: %s", g, i, name(st))
					return
				}
				if i%2 == 1 && !send() {
					return
				}
				if !readable(q.rfd, wait) {
					fail("thread %d: no result for message %d", g, n)
					return
				}
				drain(t, q.rfd)
				raw, st, _ := q.takeRaw(4)
				if st != cnOK || len(raw) != 1 || raw[0].op != op || numberOf(cBytes(raw[0].data, raw[0].len)) != n {
					fail("thread %d: take: %s %d results, want the one for message %d", g, name(st), len(raw), n)
					return
				}
			}
		}()
	}
	ready.Wait()
	close(release)
	done.Wait()
	for _, e := range errs {
		t.Error(e)
	}
	if len(tids) != threads {
		t.Errorf("the goroutines ran on %d distinct threads, want %d", len(tids), threads)
	}
	if got := stat(c.stats(), "delivered"); got != threads*rounds {
		t.Errorf("stats: delivered = %v, want %d", got, threads*rounds)
	}
}

// cn_last_error() belongs to the calling thread.
func TestLastErrorPerThread(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	failed, succeeded := make(chan struct{}), make(chan struct{})
	results := make(chan [2]string, 2)
	go func() { // thread 1: fails, then looks after thread 2 succeeded
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if st := cnCancel(999999999, 1); st != cnInvalidHandle {
			t.Errorf("cn_cancel(999999999) = %s", name(st))
		}
		close(failed)
		<-succeeded
		results <- [2]string{"failing", cnLastError()}
	}()
	go func() { // thread 2: succeeds after thread 1 failed
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		<-failed
		var out uintptr
		if st := cnStats(c.h, &out); st != cnOK {
			t.Errorf("cn_stats = %s", name(st))
		}
		cnFree(out)
		msg := cnLastError()
		close(succeeded)
		results <- [2]string{"succeeding", msg}
	}()
	for range 2 {
		r := <-results
		if r[0] == "failing" && r[1] == "" {
			t.Error("the failing thread's cn_last_error() was cleared by a success on another thread")
		}
		if r[0] == "succeeding" && r[1] != "" {
			t.Errorf("the succeeding thread's cn_last_error() = %q, want \"\" (another thread's failure leaked)", r[1])
		}
	}
}
