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

// A full mailbox (capacity 1) drops new messages: counted in the stats, logged as a warning.
func TestStatsAndLog(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, map[string]any{"capacity": 1})
	ch := c.newChannel("")
	for i := range 3 {
		c.send(ch, numbered(t, i))
	}
	c.barrier(c) // 4 published, the marker delivered to a waiting receive

	s := c.stats()
	for _, key := range []string{"published", "delivered", "handed_back", "reconnects", "recoveries",
		"groups_expired", "subscriptions", "mailboxes", "groups"} {
		if _, ok := s[key].(float64); !ok {
			t.Errorf("stats: %q missing or not a number: %v", key, s)
		}
	}
	dropped, ok := s["dropped"].(map[string]any)
	if !ok {
		t.Fatalf("stats: no \"dropped\" object: %v", s)
	}
	for _, key := range []string{"capacity", "expired", "slow_consumer", "bad_frame", "no_mailbox"} {
		if _, ok := dropped[key].(float64); !ok {
			t.Errorf("stats: dropped.%s missing or not a number: %v", key, dropped)
		}
	}
	want := map[string]float64{"published": 4, "delivered": 1, "reconnects": 0, "groups": 0}
	for key, v := range want {
		if s[key] != v {
			t.Errorf("stats: %s = %v, want %v", key, s[key], v)
		}
	}
	wantDropped := map[string]float64{"capacity": 2, "expired": 0, "slow_consumer": 0, "bad_frame": 0, "no_mailbox": 0}
	for key, v := range wantDropped {
		if dropped[key] != v {
			t.Errorf("stats: dropped.%s = %v, want %v", key, dropped[key], v)
		}
	}
	if n, _ := s["mailboxes"].(float64); n < 2 {
		t.Errorf("stats: mailboxes = %v, want at least 2", s["mailboxes"])
	}
	if n, _ := s["subscriptions"].(float64); n < 1 {
		t.Errorf("stats: subscriptions = %v, want at least 1", s["subscriptions"])
	}
	if s["connected"] != true {
		t.Errorf("stats: connected = %v", s["connected"])
	}
	if s["client_id"] != clientIDOf(t, ch) {
		t.Errorf("stats: client_id = %v, want the id in %s", s["client_id"], ch)
	}

	// The first message stayed; the two after it were dropped.
	if got := numberOf(c.receiveNow(ch)); got != 0 {
		t.Errorf("the full mailbox kept n=%d, want 0", got)
	}
	if s := c.stats(); s["delivered"] != float64(2) {
		t.Errorf("stats: delivered = %v after one more receive, want 2", s["delivered"])
	}

	// The drop was logged as a warning naming the full mailbox.
	deadline := time.Now().Add(wait)
	for {
		var found bool
		var recs []logRecord
		recs = c.log.snapshot()
		for _, r := range recs {
			if r.Level == cnLogWarning && strings.Contains(r.Message, "is full") && strings.Contains(r.Message, ch) {
				found = true
			}
		}
		if found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no CN_LOG_WARNING record saying %s is full; records: %v", ch, recs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, r := range c.log.snapshot() {
		if r.Level != 10 && r.Level != 20 && r.Level != 30 && r.Level != 40 {
			t.Errorf("log record with level %d, not a CN_LOG_* level: %q", r.Level, r.Message)
		}
	}
}

// Eight OS threads use one client at once, each on its own channel, with both receive forms.
func TestConcurrentThreads(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	const threads, rounds = 8, 200
	var (
		ready   sync.WaitGroup
		done    sync.WaitGroup
		mu      sync.Mutex
		tids    = map[int]bool{}
		errs    []string
		release = make(chan struct{})
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		if len(errs) < 20 {
			errs = append(errs, fmt.Sprintf(format, args...))
		}
		mu.Unlock()
	}
	chans := make([]string, threads)
	bodies := make([][][]byte, threads)
	for g := range chans {
		chans[g] = c.newChannel("")
		for i := range rounds {
			bodies[g] = append(bodies[g], numbered(t, g*rounds+i))
		}
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
			ch := cs(chans[g])
			w := newWaiter(2, nil)
			for i := range rounds {
				b, n := bp(bodies[g][i])
				var out, blen uintptr
				var op uint64
				if i%2 == 0 { // send, then a waiting receive
					if st := cnSend(c.h, ch, b, n, 0, 0, nil); st != cnOK {
						fail("thread %d: cn_send: %s %s", g, name(st), cnLastError())
						return
					}
					if st := cnReceive(c.h, ch, 0, 0, &out, &blen, &op); st != cnOK {
						fail("thread %d: waiting cn_receive: %s %s", g, name(st), cnLastError())
						return
					}
					if got := numberOf(takeBytes(out, blen)); got != g*rounds+i {
						fail("thread %d: got n=%d, want %d", g, got, g*rounds+i)
					}
					continue
				}
				// a pending receive, then the send that completes it
				st := cnReceive(c.h, ch, completeCB, w.closure, &out, &blen, &op)
				if st != cnPending {
					fail("thread %d: cn_receive: %s, want CN_PENDING", g, name(st))
					return
				}
				if st := cnSend(c.h, ch, b, n, 0, 0, nil); st != cnOK {
					fail("thread %d: cn_send: %s", g, name(st))
					return
				}
				select {
				case r := <-w.ch:
					if r.Status != cnOK || numberOf(r.Data) != g*rounds+i {
						fail("thread %d: callback %s n=%d, want %d", g, name(r.Status), numberOf(r.Data), g*rounds+i)
					}
				case <-time.After(wait):
					fail("thread %d: no callback", g)
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
	if s := c.stats(); s["delivered"] != float64(threads*rounds) {
		t.Errorf("stats: delivered = %v, want %d", s["delivered"], threads*rounds)
	}
}

// cn_last_error() belongs to the calling thread.
func TestLastErrorPerThread(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	type report struct {
		tid int
		msg string
	}
	failed, succeeded := make(chan struct{}), make(chan struct{})
	results := make(chan report, 2)
	go func() { // thread 1: fails, then looks after thread 2 succeeded
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if st := cnClose(999999999, 0, 0); st != cnInvalidHandle {
			t.Errorf("cn_close(999999999) = %s", name(st))
		}
		close(failed)
		<-succeeded
		results <- report{syscall.Gettid(), cnLastError()}
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
		results <- report{-syscall.Gettid(), msg}
	}()
	var one, two report
	for range 2 {
		r := <-results
		if r.tid > 0 {
			one = r
		} else {
			two = r
			two.tid = -r.tid
		}
	}
	if one.tid == two.tid {
		t.Fatalf("both ran on thread %d", one.tid)
	}
	if one.msg == "" {
		t.Error("the failing thread's cn_last_error() was cleared by a success on another thread")
	}
	if two.msg != "" {
		t.Errorf("the succeeding thread's cn_last_error() = %q, want \"\" (another thread's failure leaked)", two.msg)
	}
}
