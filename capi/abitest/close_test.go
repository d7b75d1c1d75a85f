//go:build linux

package abitest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// closeClient closes c with its own queue and waits for the close's result, which it checks
// (op the client handle, the closure, CN_OK, statistics as text). It returns the result and
// those that came before it on c.own (operations of the helpers ended with CN_CLOSED).
func closeClient(t testing.TB, c *client) (closed result, before []result) {
	t.Helper()
	closure := newClosure()
	if st, msg := onThread(func() int32 { return cnClose(c.h, c.own.h, closure) }); st != cnPending {
		t.Fatalf("cn_close: %s (%q), want CN_PENDING", name(st), msg)
	}
	for range 1000 {
		for _, r := range c.own.wait(1) {
			if r.Op != c.h || r.Closure != closure {
				before = append(before, r)
				continue
			}
			if r.Status != cnOK || !r.HasText || r.HasData {
				t.Fatalf("close result %v, want CN_OK with the statistics as text", r)
			}
			closed = r
		}
		if closed.Op != 0 {
			return closed, before
		}
	}
	t.Fatalf("no close result")
	return
}

// checkAll calls every function that takes a client handle, with valid other arguments; each
// but those named in except must return want with a cn_last_error() detail, and none may queue
// a result.
func checkAll(t *testing.T, what string, h uint64, want int32, except ...string) {
	t.Helper()
	q := newQueue(t)
	body := numbered(t, 1)
	b, n := bp(body)
	var out, blen uintptr
	var op uint64
	ch := "specific.0123456789ab!0123456789abcdef0123456789abcdef"
	calls := []struct {
		fn   string
		call func() int32
	}{
		{"cn_close", func() int32 { return cnClose(h, q.h, 0) }},
		{"cn_stats", func() int32 { return cnStats(h, &out) }},
		{"cn_send", func() int32 { return cnSend(h, cs(ch), b, n, q.h, 0, &op) }},
		{"cn_group_send", func() int32 { return cnGroupSend(h, cs("grp"), b, n, q.h, 0, &op) }},
		{"cn_receive", func() int32 { return cnReceive(h, cs("plain"), q.h, 0, &out, &blen, &op) }},
		{"cn_receive(start over)", func() int32 { again := uint64(1); return cnReceive(h, nil, q.h, 0, &out, &blen, &again) }},
		{"cn_new_channel", func() int32 { return cnNewChannel(h, nil, q.h, 0, &out, &op) }},
		{"cn_group_add", func() int32 { return cnGroupAdd(h, cs("grp"), cs("plain"), q.h, 0, &op) }},
		{"cn_group_discard", func() int32 { return cnGroupDiscard(h, cs("grp"), cs("plain")) }},
		{"cn_flush", func() int32 { return cnFlush(h) }},
		{"cn_read_events", func() int32 { var fd int64; return cnReadEvents(h, &fd) }},
		{"cn_on_readable", func() int32 { return cnOnReadable(h, q.h) }},
		{"cn_cancel", func() int32 { return cnCancel(h, 1) }},
	}
	var wrong []string
	for _, c := range calls {
		if slices.Contains(except, c.fn) {
			continue
		}
		st, msg := onThread(c.call)
		if st != want || msg == "" {
			wrong = append(wrong, fmt.Sprintf("%s: %s (%q)", c.fn, name(st), msg))
		}
	}
	if len(wrong) > 0 {
		t.Errorf("%s: want %s with a detail from every call, got:\n  %s", what, name(want), strings.Join(wrong, "\n  "))
	}
	q.quiet(20 * time.Millisecond)
}

// Closing a client with pending receives on two queues: each receive ends once with CN_CLOSED in
// its own queue, and all of them are there when the close's result comes (in a third queue).
// Afterwards no result and no log record of the client comes, whatever traffic arrives, and
// its handle is closed.
func TestCloseWithPendingOperations(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, map[string]any{"capacity": 1})
	sender := connect(t, ts.url, nil)
	qs := []*queue{newQueue(t), newQueue(t)}
	var chans []string
	for range 5 {
		chans = append(chans, c.newChannel(""))
	}
	for range 5 {
		chans = append(chans, uniq(t, "plain"))
	}
	ops := make([]map[uint64]bool, len(qs))
	for i := range ops {
		ops[i] = map[uint64]bool{}
	}
	for i, ch := range chans {
		ops[i%2][c.receivePending(ch, qs[i%2])] = true
	}
	closedQ := newQueue(t)
	closure := newClosure()
	if st := cnClose(c.h, closedQ.h, closure); st != cnPending {
		t.Fatalf("cn_close: %s, want CN_PENDING", name(st))
	}
	r := closedQ.one()
	if r.Op != c.h || r.Closure != closure || r.Status != cnOK || !r.HasText || r.HasData {
		t.Fatalf("close result %v, want op %d (the client) closure %d CN_OK with statistics", r, c.h, closure)
	}
	for i, q := range qs {
		got := byOp(t, q.takeNow()) // at once: they came before the close's result
		if len(got) != len(ops[i]) {
			t.Errorf("queue %d: %d results when the close's result came, want %d: %v", i, len(got), len(ops[i]), got)
		}
		for op := range ops[i] {
			r := got[op]
			if r.Status != cnClosed || r.Text == "" || r.HasData || r.Len != 0 {
				t.Errorf("queue %d: receive %d ended with %v, want CN_CLOSED with a detail and no data", i, op, r)
			}
		}
	}
	// No result or log record of the closed client, whatever traffic comes.
	logs := c.log.calls.Load()
	deadline := time.Now().Add(200 * time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		for _, ch := range chans {
			sender.send(ch, numbered(t, i))
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, q := range append(qs, closedQ) {
		q.quiet(20 * time.Millisecond)
	}
	if n := c.log.calls.Load(); n != logs {
		t.Errorf("%d log records after the close's result: %v", n-logs, c.log.snapshot()[logs:])
	}
	checkAll(t, "closed handle", c.h, cnClosed)
	checkAll(t, "unknown handle 999999999", 999999999, cnInvalidHandle)
	checkAll(t, "handle 0", 0, cnInvalidHandle)
	if n := ts.srv.NumClients(); n != 1 {
		t.Errorf("the server has %d connections after the close, want 1 (the sender)", n)
	}
}

// The close's text is the client's final statistics as JSON: what it published and delivered.
func TestCloseResultStats(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	for i := range 3 {
		c.send(ch, numbered(t, i))
	}
	c.barrier(c) // 4 published, the marker delivered
	if got := numberOf(c.receiveNow(ch)); got != 0 {
		t.Fatalf("received n=%d, want 0", got)
	}
	id := clientIDOf(t, ch)
	closed, _ := closeClient(t, c)
	s := parseStats(t, closed.Text)
	for path, want := range map[string]float64{"published": 4, "delivered": 2, "lost.messages": 0, "publish_timeouts": 0} {
		if got := stat(s, path); got != want {
			t.Errorf("final statistics: %s = %v, want %v (%s)", path, got, want, closed.Text)
		}
	}
	if s["client_id"] != id || s["connected"] != false || stat(s, "goroutines") < 1 {
		t.Errorf("final statistics: client_id %v connected %v goroutines %v, want %s, false and a count",
			s["client_id"], s["connected"], s["goroutines"], id)
	}
}

// A second cn_close, during the close or after it, is CN_CLOSED; so is every other call as soon
// as cn_close returned. cn_close with a bad queue closes nothing.
func TestCloseTwice(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	freed := newQueue(t)
	cnQueueFree(freed.h)
	for _, qh := range []uint64{0, 1 << 60, freed.h, c.h} {
		if st, msg := onThread(func() int32 { return cnClose(c.h, qh, 0) }); st != cnInvalidHandle || msg == "" {
			t.Errorf("cn_close(queue %d): %s (%q), want CN_INVALID_HANDLE", qh, name(st), msg)
		}
	}
	if s := c.stats(); s["connected"] != true {
		t.Fatalf("after refused closes the client is not connected: %v", s)
	}
	q := newQueue(t)
	if st := cnClose(c.h, q.h, 0); st != cnPending {
		t.Fatalf("cn_close: %s", name(st))
	}
	// cn_cancel is left out: while the close ends them, ops of the client are still known.
	checkAll(t, "a client whose close is in progress", c.h, cnClosed, "cn_cancel")
	if r := q.one(); r.Op != c.h || r.Status != cnOK {
		t.Errorf("close result %v", r)
	}
	checkAll(t, "a closed client", c.h, cnClosed)
	q.quiet(20 * time.Millisecond)
}

// An op handle or a queue handle is not a client handle: calls given one as the client are
// CN_INVALID_HANDLE (not CN_CLOSED, which says a client was closed).
func TestOpHandleIsNotAClient(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	q := newQueue(t)
	op := c.receivePending(c.newChannel(""), q)
	checkAll(t, "an op handle as the client", op, cnInvalidHandle)
	checkAll(t, "a queue handle as the client", q.h, cnInvalidHandle)
	if st := cnCancel(c.h, op); st != cnOK {
		t.Errorf("the receive is still pending: cn_cancel = %s, want CN_OK", name(st))
	}
}

// goroutines (the library's, for all clients) comes back to where it was after many clients
// connected, worked, closed, or failed to connect: a leak check.
func TestGoroutinesAfterClose(t *testing.T) {
	ts := startServer(t)
	watch := connect(t, ts.url, nil)
	goroutines := func() int { return int(stat(watch.stats(), "goroutines")) }
	settle := func(limit int) int {
		n := goroutines()
		for deadline := time.Now().Add(wait); n > limit && time.Now().Before(deadline); n = goroutines() {
			time.Sleep(10 * time.Millisecond)
		}
		return n
	}
	time.Sleep(50 * time.Millisecond) // let the goroutines of earlier tests end
	baseline := goroutines()
	if baseline < 1 {
		t.Fatalf("cn_stats: goroutines = %d", baseline)
	}
	peak := 0
	dead := config(t, []string{deadURL(t)}, map[string]any{"connect_deadline": 0.1})
	for i := range 20 {
		c := connect(t, ts.url, nil)
		ch := c.newChannel("")
		c.groupAdd(uniq(t, "g"), ch)
		c.receivePending(uniq(t, "plain"), nil)
		c.send(ch, numbered(t, i))
		peak = max(peak, goroutines())
		closeClient(t, c)
		if i%4 == 0 {
			q := newQueue(t)
			startConnect(t, dead, nil, q, 0)
			if r := q.one(); r.Status != cnNoServer {
				t.Fatalf("connect to a dead port: %v", r)
			}
		}
	}
	const slack = 3
	if n := settle(baseline + slack); n > baseline+slack {
		t.Errorf("goroutines: %d before, %d (peak) with a client open, %d after 20 clients closed and 5 failed connects: a leak",
			baseline, peak, n)
	}
}
