//go:build linux

package abitest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"regexp"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// The result queues of include/channels_nats.h ("Result queues"): cn_queue_new,
// cn_set_result_queue, cn_queue_take and cn_queue_free. Results of pending operations go into
// the queue instead of the operations' callbacks, so every receive here passes completeCB with a
// closure the test chooses: a callback that still ran would reach a waiter (calls > 0) or no
// waiter at all (a stray, which fails the binary in TestMain).

// qResult is one cn_result taken from a queue, copied before the memory block was freed.
type qResult struct {
	Closure uintptr
	Status  int32
	Text    string
	HasText bool
	Data    []byte
	HasData bool
	Len     uintptr
}

func (r qResult) String() string {
	return fmt.Sprintf("{closure %d %s text %q data %d bytes}", r.Closure, name(r.Status), r.Text, r.Len)
}

// queue is a cn_queue of a test.
type queue struct {
	t testing.TB
	h uint64
}

// newQueue makes a queue with notify (-1: none). It is freed when the test ends: make it before
// the clients that attach to it, so that their cleanups (which close them) run first.
func newQueue(t testing.TB, notify int) *queue {
	t.Helper()
	var h uint64
	st, msg := onThread(func() int32 { return cnQueueNew(notify, &h) })
	if st != cnOK {
		t.Fatalf("cn_queue_new(%d): %s (%s)", notify, name(st), msg)
	}
	if h == 0 {
		t.Fatalf("cn_queue_new(%d): CN_OK with handle 0", notify)
	}
	if msg != "" {
		t.Errorf("cn_queue_new: cn_last_error() is %q after CN_OK", msg)
	}
	t.Cleanup(func() {
		if st := cnQueueFree(h); st != cnOK && st != cnInvalidHandle {
			t.Errorf("cleanup: cn_queue_free: %s (%s)", name(st), cnLastError())
		}
	})
	return &queue{t: t, h: h}
}

// attach puts c's results into q.
func (q *queue) attach(c *client) {
	q.t.Helper()
	st, msg := onThread(func() int32 { return cnSetQueue(c.h, q.h) })
	if st != cnOK {
		q.t.Fatalf("cn_set_result_queue: %s (%s)", name(st), msg)
	}
}

// takeRaw is one cn_queue_take with capacity entries. It checks the out-parameters the header
// promises (reporting with t.Errorf, so that it may run on any goroutine), copies the results and
// frees the memory block.
func takeRaw(t testing.TB, h uint64, capacity int) ([]qResult, int32) {
	t.Helper()
	results := make([]cResult, capacity)
	var rp *cResult
	if capacity > 0 {
		rp = &results[0]
	}
	// Garbage in the out-parameters: the library must overwrite both.
	count, memory := uintptr(0xdead), ^uintptr(0)
	st, msg := onThread(func() int32 { return cnQueueTake(h, rp, uintptr(capacity), &count, &memory) })
	if st != cnOK {
		return nil, st
	}
	if msg != "" {
		t.Errorf("cn_queue_take: cn_last_error() is %q after CN_OK", msg)
	}
	if count > uintptr(capacity) {
		t.Errorf("cn_queue_take(capacity %d): count %d", capacity, count)
		return nil, cnInternal
	}
	if count == 0 {
		if memory != 0 {
			t.Errorf("cn_queue_take: count 0 but memory %#x, want NULL", memory)
		}
		return nil, st
	}
	if memory == 0 {
		t.Errorf("cn_queue_take: count %d but memory NULL", count)
	}
	out := make([]qResult, count)
	for i, r := range results[:count] {
		out[i] = qResult{Closure: r.closure, Status: r.status, Len: r.len}
		if r.text != 0 {
			out[i].Text, out[i].HasText = cString(r.text), true
		}
		if r.data != 0 {
			out[i].Data, out[i].HasData = cBytes(r.data, r.len), true
		} else if r.len != 0 {
			t.Errorf("cn_queue_take: result %d has data NULL and len %d", i, r.len)
		}
	}
	cnFree(memory)
	return out, st
}

// take is takeRaw that must succeed.
func (q *queue) take(capacity int) []qResult {
	q.t.Helper()
	out, st := takeRaw(q.t, q.h, capacity)
	if st != cnOK {
		q.t.Fatalf("cn_queue_take(capacity %d): %s (%s)", capacity, name(st), cnLastError())
	}
	return out
}

// collect polls q (capacity per take) until it holds n results or the wait is over.
func (q *queue) collect(n, capacity int) []qResult {
	q.t.Helper()
	var got []qResult
	deadline := time.Now().Add(wait)
	for len(got) < n {
		batch := q.take(capacity)
		got = append(got, batch...)
		if len(batch) == 0 {
			if time.Now().After(deadline) {
				q.t.Fatalf("%d of %d results in the queue after %s: %v", len(got), n, wait, got)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return got
}

// empty checks that q holds nothing, now and for a little while.
func (q *queue) empty(d time.Duration) {
	q.t.Helper()
	deadline := time.Now().Add(d)
	for {
		if extra := q.take(16); len(extra) > 0 {
			q.t.Errorf("unexpected results in the queue: %v", extra)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// byClosure indexes results by closure and fails on a closure that came twice.
func byClosure(t testing.TB, results []qResult) map[uintptr]qResult {
	t.Helper()
	m := make(map[uintptr]qResult, len(results))
	for _, r := range results {
		if prev, dup := m[r.Closure]; dup {
			t.Errorf("closure %d came twice: %v and %v", r.Closure, prev, r)
		}
		m[r.Closure] = r
	}
	return m
}

// startReceive is cn_receive with the completion callback and an arbitrary closure (it reports
// with t.Errorf: it runs on other goroutines too).
func startReceive(t testing.TB, c *client, channel string, closure uintptr) (int32, []byte, uint64) {
	t.Helper()
	var out, n uintptr
	var op uint64
	st := cnReceive(c.h, cs(channel), completeCB, closure, &out, &n, &op)
	switch st {
	case cnOK:
		if out == 0 {
			t.Errorf("cn_receive(%s): CN_OK with a NULL body", channel)
			return cnInternal, nil, 0
		}
		return st, takeBytes(out, n), 0
	case cnPending:
		if op == 0 {
			t.Errorf("cn_receive(%s): CN_PENDING with op 0", channel)
		}
		return st, nil, op
	}
	return st, nil, 0
}

// pendingReceive starts a receive that must be pending.
func pendingReceive(t testing.TB, c *client, channel string, closure uintptr) uint64 {
	t.Helper()
	st, body, op := startReceive(t, c, channel, closure)
	if st != cnPending {
		t.Fatalf("cn_receive(%s): %s (body %x), want CN_PENDING", channel, name(st), body)
	}
	return op
}

// newChannelWait makes a process channel with the waiting form: no pending operation, so it
// works on a client whose results go to a queue.
func newChannelWait(t testing.TB, c *client) string {
	t.Helper()
	var out uintptr
	st, msg := onThread(func() int32 { return cnNewChannel(c.h, nil, 0, 0, &out, nil) })
	if st != cnOK || out == 0 {
		t.Fatalf("cn_new_channel (waiting): %s (%s)", name(st), msg)
	}
	return takeString(out)
}

// paddedBody is a numbered message with a payload; a struct, so that its encoding (the order of
// the keys) is the same every time.
type paddedBody struct {
	Type string `msgpack:"type"`
	N    int    `msgpack:"n"`
	Pad  []byte `msgpack:"pad"`
}

// queueBody is a message body numbered n with a payload of every byte value, its length
// depending on n: bodies differ in size and content, and hold NUL bytes. The same n gives the
// same bytes.
func queueBody(t testing.TB, n int) []byte {
	pad := make([]byte, (n*131)%3000)
	for i := range pad {
		pad[i] = byte(i + n)
	}
	return pack(t, paddedBody{"test", n, pad})
}

// connectPending starts a pending connect and returns its handle and the waiter of its callback.
// The client is closed when the test ends.
func connectPending(t testing.TB, doc string) (uint64, *waiter) {
	t.Helper()
	w := newWaiter(2, nil)
	var h uint64
	st, msg := onThread(func() int32 { return cnConnect(cs(doc), 0, 0, completeCB, w.closure, &h) })
	if st != cnPending || h == 0 {
		t.Fatalf("cn_connect (pending form): %s (%s), handle %d", name(st), msg, h)
	}
	t.Cleanup(func() {
		if st := cnClose(h, 0, 0); st != cnOK && st != cnClosed {
			t.Errorf("cleanup: cn_close: %s", name(st))
		}
	})
	return h, w
}

// ---- notify descriptors -----------------------------------------------------------------------

// notifyPipe is a non-blocking pipe, closed when the test ends: the library writes to w, the
// test reads r.
func notifyPipe(t testing.TB) (r, w int) {
	t.Helper()
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_NONBLOCK|syscall.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Close(p[0])
		syscall.Close(p[1])
	})
	return p[0], p[1]
}

// notifySocketPair is a non-blocking Unix socket pair: the library writes to w, the test reads r.
func notifySocketPair(t testing.TB) (r, w int) {
	t.Helper()
	p, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Close(p[0])
		syscall.Close(p[1])
	})
	return p[0], p[1]
}

// pollFd is struct pollfd.
type pollFd struct {
	fd      int32
	events  int16
	revents int16
}

const pollIn = 0x1

// readable waits up to d for fd to become readable (ppoll, retried on EINTR).
func readable(fd int, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left < 0 {
			left = 0
		}
		ts := syscall.NsecToTimespec(int64(left))
		p := pollFd{fd: int32(fd), events: pollIn}
		n, _, errno := syscall.Syscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&p)), 1,
			uintptr(unsafe.Pointer(&ts)), 0, 0, 0)
		switch {
		case errno == syscall.EINTR:
			continue
		case errno != 0:
			panic(fmt.Sprintf("ppoll(%d): %v", fd, errno))
		case n > 0:
			return p.revents&pollIn != 0
		case left == 0:
			return false
		}
	}
}

// drain reads and discards every byte waiting on the non-blocking fd and returns how many.
func drain(t testing.TB, fd int) int {
	t.Helper()
	total := 0
	buf := make([]byte, 256)
	for {
		n, err := syscall.Read(fd, buf)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return total
		case err != nil:
			t.Fatalf("read(%d): %v", fd, err)
		case n == 0:
			return total
		}
		total += n
	}
}

// hostLoop takes results the way the header tells a host to: wait until notify is readable,
// read and discard its bytes, then take until the queue is empty; again until want results came.
// A result that is in the queue without a byte on its way fails it (the host would sleep
// forever).
func hostLoop(t testing.TB, q *queue, rfd, want, capacity int) []qResult {
	t.Helper()
	var got []qResult
	for len(got) < want {
		if !readable(rfd, wait) {
			leftover := q.take(want)
			t.Fatalf("no notify byte within %s with %d of %d results taken (the queue held %d more)",
				wait, len(got), want, len(leftover))
		}
		if n := drain(t, rfd); n == 0 {
			t.Fatalf("notify was readable but held no byte")
		}
		for {
			batch := q.take(capacity)
			got = append(got, batch...)
			if len(batch) < capacity {
				break
			}
		}
	}
	return got
}

// ---- cn_queue_new and cn_queue_free -------------------------------------------------------------

func TestQueueNew(t *testing.T) {
	// queue NULL
	for _, notify := range []int{-1, 0} {
		st, msg := onThread(func() int32 { return cnQueueNew(notify, nil) })
		if st != cnInvalidArg || msg == "" {
			t.Errorf("cn_queue_new(%d, NULL): %s (%q), want CN_INVALID_ARG with a detail", notify, name(st), msg)
		}
	}
	seen := map[uint64]bool{}
	fresh := func(h uint64) {
		t.Helper()
		if seen[h] {
			t.Errorf("queue handle %d issued twice", h)
		}
		seen[h] = true
	}

	// -1: no notify; the host polls.
	polled := newQueue(t, -1)
	fresh(polled.h)
	if got := polled.take(8); len(got) != 0 {
		t.Errorf("a new queue holds %v", got)
	}

	// A pipe and a socket pair.
	pr, pw := notifyPipe(t)
	piped := newQueue(t, pw)
	fresh(piped.h)
	sr, sw := notifySocketPair(t)
	socketed := newQueue(t, sw)
	fresh(socketed.h)
	if n := drain(t, pr) + drain(t, sr); n != 0 {
		t.Errorf("%d notify bytes written by cn_queue_new", n)
	}

	// Not an open descriptor.
	closedR, closedW := func() (int, int) {
		var p [2]int
		if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		syscall.Close(p[0])
		syscall.Close(p[1])
		return p[0], p[1]
	}()
	for _, notify := range []int{-2, -1000, 1 << 20, 999_999, closedW, closedR} {
		var h uint64
		var fstatErr error
		if notify >= 0 {
			var stat syscall.Stat_t
			fstatErr = syscall.Fstat(notify, &stat)
		}
		st, msg := onThread(func() int32 { return cnQueueNew(notify, &h) })
		if notify >= 0 && fstatErr == nil {
			// The closed descriptor number was reused meanwhile by another thread: not a test.
			if st == cnOK {
				cnQueueFree(h)
			}
			continue
		}
		if st != cnInvalidArg || msg == "" {
			t.Errorf("cn_queue_new(%d, not an open descriptor): %s (%q), want CN_INVALID_ARG with a detail", notify, name(st), msg)
			if st == cnOK {
				cnQueueFree(h)
			}
		}
	}

	// Free: CN_OK once, then the handle is invalid for every queue function.
	for _, q := range []*queue{polled, piped, socketed} {
		if st := cnQueueFree(q.h); st != cnOK {
			t.Errorf("cn_queue_free: %s (%s)", name(st), cnLastError())
		}
		if st := cnQueueFree(q.h); st != cnInvalidHandle {
			t.Errorf("second cn_queue_free: %s, want CN_INVALID_HANDLE", name(st))
		}
		if _, st := takeRaw(t, q.h, 4); st != cnInvalidHandle {
			t.Errorf("cn_queue_take of a freed queue: %s, want CN_INVALID_HANDLE", name(st))
		}
	}
	// The library never closes notify: both descriptors still work after cn_queue_free.
	for _, fd := range []int{pw, sw} {
		if _, err := syscall.Write(fd, []byte{7}); err != nil {
			t.Errorf("notify %d after cn_queue_free: %v (the library closed it?)", fd, err)
		}
	}
	if n := drain(t, pr); n != 1 {
		t.Errorf("read %d bytes from the pipe after cn_queue_free, want the 1 the test wrote", n)
	}
	if n := drain(t, sr); n != 1 {
		t.Errorf("read %d bytes from the socket pair after cn_queue_free, want the 1 the test wrote", n)
	}

	// Handles never issued.
	for _, h := range []uint64{0, 1 << 60, ^uint64(0)} {
		if st, msg := onThread(func() int32 { return cnQueueFree(h) }); st != cnInvalidHandle || msg == "" {
			t.Errorf("cn_queue_free(%d): %s (%q), want CN_INVALID_HANDLE with a detail", h, name(st), msg)
		}
		if _, st := takeRaw(t, h, 4); st != cnInvalidHandle {
			t.Errorf("cn_queue_take(%d): %s, want CN_INVALID_HANDLE", h, name(st))
		}
	}
}

// A descriptor is an int: a notify value whose low 32 bits name an open descriptor but that is
// not itself one must be refused, or the library writes its bytes to that other descriptor.
func TestQueueNewNotifyOutOfRange(t *testing.T) {
	pr, pw := notifyPipe(t)
	ts := startServer(t)
	for _, notify := range []int{1<<32 + pw, -1<<32 + pw} {
		var h uint64
		st, msg := onThread(func() int32 { return cnQueueNew(notify, &h) })
		if st == cnInvalidArg {
			continue
		}
		t.Errorf("cn_queue_new(%#x): %s (%q), want CN_INVALID_ARG: it is not an open descriptor", notify, name(st), msg)
		if st != cnOK {
			continue
		}
		// Show where the notify byte goes.
		c := connect(t, ts.url, nil)
		if st := cnSetQueue(c.h, h); st == cnOK {
			ch := newChannelWait(t, c)
			pendingReceive(t, c, ch, nextClosure.Add(1))
			c.send(ch, numbered(t, 1))
			if readable(pr, time.Second) {
				t.Errorf("the notify byte of queue %#x went to descriptor %d", notify, pw)
			}
			drain(t, pr)
		}
		cnClose(c.h, 0, 0)
		cnQueueFree(h)
	}
}

// cn_queue_free refuses while a client that is not closed is attached, also one that is still
// connecting; once every attached client is closed it frees the queue with the results nobody
// took, and the handle is invalid.
func TestQueueFree(t *testing.T) {
	ts := startServer(t)
	q := newQueue(t, -1)
	c1 := connect(t, ts.url, nil)
	c2 := connect(t, ts.url, nil)
	q.attach(c1)
	q.attach(c2)
	refused := func(when string) {
		t.Helper()
		st, msg := onThread(func() int32 { return cnQueueFree(q.h) })
		if st != cnIllegalState || msg == "" {
			t.Fatalf("cn_queue_free %s: %s (%q), want CN_ILLEGAL_STATE with a detail", when, name(st), msg)
		}
	}
	refused("with two open clients attached")
	// The queue still works after the refusal.
	ch := newChannelWait(t, c1)
	w := newWaiter(1, nil)
	pendingReceive(t, c1, ch, w.closure)
	c2.send(ch, numbered(t, 1))
	if got := q.collect(1, 4); got[0].Closure != w.closure || got[0].Status != cnOK || numberOf(got[0].Data) != 1 {
		t.Errorf("after a refused free: %v", got)
	}
	// Results left in the queue when the clients close: a receive ended by the close.
	pendingReceive(t, c1, newChannelWait(t, c1), nextClosure.Add(1))
	if st := cnClose(c1.h, 0, 0); st != cnOK {
		t.Fatalf("cn_close: %s", name(st))
	}
	refused("with one open client attached")
	// A client still connecting counts as attached.
	h, cw := connectPending(t, config(t, []string{silentServer(t)}, map[string]any{"connect_options": map[string]any{"connect_timeout": 20}}))
	if st := cnSetQueue(h, q.h); st != cnOK {
		t.Fatalf("cn_set_result_queue while connecting: %s (%s)", name(st), cnLastError())
	}
	if st := cnClose(c2.h, 0, 0); st != cnOK {
		t.Fatalf("cn_close: %s", name(st))
	}
	refused("with a connecting client attached")
	if st := cnClose(h, 0, 0); st != cnOK {
		t.Fatalf("cn_close of the connecting client: %s", name(st))
	}
	if r := cw.wait(t); r.Status != cnClosed {
		t.Errorf("abandoned connect: callback %s, want CN_CLOSED", name(r.Status))
	}
	// Every attached client is closed: free works, the untaken CN_CLOSED result goes with it.
	if st, msg := onThread(func() int32 { return cnQueueFree(q.h) }); st != cnOK || msg != "" {
		t.Fatalf("cn_queue_free with every attached client closed: %s (%q)", name(st), msg)
	}
	if st := cnQueueFree(q.h); st != cnInvalidHandle {
		t.Errorf("second cn_queue_free: %s, want CN_INVALID_HANDLE", name(st))
	}
	if _, st := takeRaw(t, q.h, 4); st != cnInvalidHandle {
		t.Errorf("cn_queue_take after cn_queue_free: %s, want CN_INVALID_HANDLE", name(st))
	}
	// A freed queue cannot be attached.
	c3 := connect(t, ts.url, nil)
	if st := cnSetQueue(c3.h, q.h); st != cnInvalidHandle {
		t.Errorf("cn_set_result_queue with a freed queue: %s, want CN_INVALID_HANDLE", name(st))
	}
	if w.calls.Load() != 0 {
		t.Errorf("the receive callback ran %d times", w.calls.Load())
	}
}

// A client whose connect failed is closed ("it is released and later calls return CN_CLOSED"):
// it must not keep its queue from being freed.
func TestQueueFreeAfterFailedConnect(t *testing.T) {
	q := newQueue(t, -1)
	doc := config(t, []string{silentServer(t)}, map[string]any{"connect_options": map[string]any{"connect_timeout": 0.3}})
	h, cw := connectPending(t, doc)
	if st := cnSetQueue(h, q.h); st != cnOK {
		t.Fatalf("cn_set_result_queue while connecting: %s (%s)", name(st), cnLastError())
	}
	r := cw.wait(t)
	if r.Status != cnTimeout && r.Status != cnNoServer {
		t.Fatalf("connect to a silent server: %s, want CN_TIMEOUT or CN_NO_SERVER", name(r.Status))
	}
	if st := cnClose(h, 0, 0); st != cnClosed {
		t.Errorf("cn_close after the failed connect: %s, want CN_CLOSED (the client is released)", name(st))
	}
	st, msg := onThread(func() int32 { return cnQueueFree(q.h) })
	if st != cnOK {
		t.Errorf("cn_queue_free after the only attached client failed to connect: %s (%q), want CN_OK: "+
			"that client is closed (cn_close says CN_CLOSED), and the queue can never be freed", name(st), msg)
	}
}

// ---- cn_set_result_queue ------------------------------------------------------------------------

func TestSetResultQueueRules(t *testing.T) {
	ts := startServer(t)
	q := newQueue(t, -1)
	other := newQueue(t, -1)
	c := connect(t, ts.url, nil)
	invalid := []struct {
		what   string
		client uint64
		queue  uint64
	}{
		{"unknown client", 999999999, q.h},
		{"client 0", 0, q.h},
		{"unknown queue", c.h, 1 << 60},
		{"queue 0", c.h, 0},
		{"a client handle as the queue", c.h, c.h},
		{"a queue handle as the client", q.h, q.h},
	}
	for _, tc := range invalid {
		st, msg := onThread(func() int32 { return cnSetQueue(tc.client, tc.queue) })
		if st != cnInvalidHandle || msg == "" {
			t.Errorf("cn_set_result_queue(%s): %s (%q), want CN_INVALID_HANDLE with a detail", tc.what, name(st), msg)
		}
	}
	// A client that did waiting and at-once operations but has none pending may still attach.
	ch := newChannelWait(t, c)
	c.send(ch, numbered(t, 0))
	c.receiveAny(ch) // at once, or through the callback: nothing is pending afterwards
	if st, msg := onThread(func() int32 { return cnSetQueue(c.h, q.h) }); st != cnOK || msg != "" {
		t.Fatalf("first cn_set_result_queue: %s (%q)", name(st), msg)
	}
	for _, tc := range []struct {
		what string
		fn   func() int32
	}{
		{"the same queue again", func() int32 { return cnSetQueue(c.h, q.h) }},
		{"another queue", func() int32 { return cnSetQueue(c.h, other.h) }},
		{"a batch callback after the queue", func() int32 { return cnSetBatch(c.h, batchCB, 0) }},
	} {
		if st, msg := onThread(tc.fn); st != cnIllegalState || msg == "" {
			t.Errorf("%s: %s (%q), want CN_ILLEGAL_STATE with a detail", tc.what, name(st), msg)
		}
	}

	// After a batch callback.
	batched := connect(t, ts.url, nil)
	if st := cnSetBatch(batched.h, batchCB, 0); st != cnOK {
		t.Fatalf("cn_set_batch_callback: %s", name(st))
	}
	if st, msg := onThread(func() int32 { return cnSetQueue(batched.h, q.h) }); st != cnIllegalState || msg == "" {
		t.Errorf("cn_set_result_queue after a batch callback: %s (%q), want CN_ILLEGAL_STATE", name(st), msg)
	}

	// With an operation pending.
	late := connect(t, ts.url, nil)
	lw := newWaiter(1, nil)
	late.receivePending(newChannelWait(t, late), lw)
	if st, msg := onThread(func() int32 { return cnSetQueue(late.h, q.h) }); st != cnIllegalState || msg == "" {
		t.Errorf("cn_set_result_queue with an operation pending: %s (%q), want CN_ILLEGAL_STATE", name(st), msg)
	}

	// A closed client.
	closed := connect(t, ts.url, nil)
	if st := cnClose(closed.h, 0, 0); st != cnOK {
		t.Fatalf("cn_close: %s", name(st))
	}
	if st, msg := onThread(func() int32 { return cnSetQueue(closed.h, other.h) }); st != cnClosed || msg == "" {
		t.Errorf("cn_set_result_queue on a closed client: %s (%q), want CN_CLOSED", name(st), msg)
	}

	// While connecting, then the pending receive of the connected client goes to the queue, while
	// cn_connect's own callback is not queued.
	h, cw := connectPending(t, config(t, []string{ts.url}, nil))
	if st, msg := onThread(func() int32 { return cnSetQueue(h, other.h) }); st != cnOK {
		t.Fatalf("cn_set_result_queue while connecting: %s (%q)", name(st), msg)
	}
	if r := cw.wait(t); r.Status != cnOK {
		t.Fatalf("connect callback: %s (%s)", name(r.Status), r.Text)
	}
	other.empty(20 * time.Millisecond)
	cc := &client{t: t, h: h}
	w := newWaiter(1, nil)
	cch := newChannelWait(t, cc)
	pendingReceive(t, cc, cch, w.closure)
	c.send(cch, numbered(t, 5))
	got := other.collect(1, 4)
	if got[0].Closure != w.closure || got[0].Status != cnOK || numberOf(got[0].Data) != 5 {
		t.Errorf("result of the client attached while connecting: %v", got)
	}
	if n := w.calls.Load(); n != 0 {
		t.Errorf("the receive callback ran %d times", n)
	}
	if n := lw.calls.Load(); n != 0 {
		t.Errorf("the callback of the receive pending on the refused client ran %d times", n)
	}
}

// ---- cn_queue_take --------------------------------------------------------------------------------

func TestQueueTakeArguments(t *testing.T) {
	ts := startServer(t)
	q := newQueue(t, -1)
	c := connect(t, ts.url, nil)
	q.attach(c)
	var results [4]cResult
	var count, memory uintptr
	bad := []struct {
		what string
		fn   func() int32
	}{
		{"count NULL", func() int32 { return cnQueueTake(q.h, &results[0], 4, nil, &memory) }},
		{"memory NULL", func() int32 { return cnQueueTake(q.h, &results[0], 4, &count, nil) }},
		{"count and memory NULL", func() int32 { return cnQueueTake(q.h, &results[0], 4, nil, nil) }},
		{"results NULL with capacity 4", func() int32 { return cnQueueTake(q.h, nil, 4, &count, &memory) }},
		{"count NULL, capacity 0", func() int32 { return cnQueueTake(q.h, nil, 0, nil, &memory) }},
		{"memory NULL, capacity 0", func() int32 { return cnQueueTake(q.h, nil, 0, &count, nil) }},
	}
	check := func() {
		t.Helper()
		for _, b := range bad {
			if st, msg := onThread(b.fn); st != cnInvalidArg || msg == "" {
				t.Errorf("cn_queue_take(%s): %s (%q), want CN_INVALID_ARG with a detail", b.what, name(st), msg)
			}
		}
	}
	check() // on an empty queue

	// An empty queue: CN_OK, count 0, memory NULL, with any capacity, results NULL with 0.
	for _, capacity := range []int{0, 1, 64} {
		if got := q.take(capacity); len(got) != 0 {
			t.Errorf("take(%d) of an empty queue: %v", capacity, got)
		}
	}

	// Results waiting: the refused calls take nothing, capacity 0 takes nothing.
	ch := newChannelWait(t, c)
	w := newWaiter(1, nil)
	pendingReceive(t, c, ch, w.closure)
	body := queueBody(t, 3)
	c.send(ch, body)
	deadline := time.Now().Add(wait)
	var got []qResult
	for {
		check()
		if zero := q.take(0); len(zero) != 0 {
			t.Fatalf("take(0) returned %v", zero)
		}
		if got = q.take(4); len(got) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if len(got) != 1 || got[0].Closure != w.closure || !bytes.Equal(got[0].Data, body) {
		t.Fatalf("after refused takes: %v, want the one receive result intact", got)
	}
	if w.calls.Load() != 0 {
		t.Errorf("the receive callback ran")
	}
}

// ---- results --------------------------------------------------------------------------------------

// Pending receives finish through the queue: every message once, bodies intact, callbacks never
// called, the results taken the way the header tells a host (notify byte, drain, take until
// empty). cn_cancel of an operation whose result was queued says CN_NOT_PENDING.
func TestQueueReceives(t *testing.T) {
	ts := startServer(t)
	pr, pw := notifyPipe(t)
	q := newQueue(t, pw)
	c := connect(t, ts.url, map[string]any{"capacity": 1000})
	q.attach(c)
	sender := connect(t, ts.url, nil)
	const n = 150
	chans := make([]string, n)
	waiters := make([]*waiter, n)
	ops := make([]uint64, n)
	bodies := make([][]byte, n)
	for i := range chans {
		chans[i] = newChannelWait(t, c)
		waiters[i] = newWaiter(1, nil)
		ops[i] = pendingReceive(t, c, chans[i], waiters[i].closure)
		bodies[i] = queueBody(t, i)
	}
	// A large body too.
	big := make([]byte, 200_000)
	for i := range big {
		big[i] = byte(i * 7)
	}
	bodies[n-1] = pack(t, paddedBody{"test", n - 1, big})
	if readable(pr, 20*time.Millisecond) {
		t.Fatalf("notify readable before any result")
	}
	if got := q.take(8); len(got) != 0 {
		t.Fatalf("queue holds %v before any send", got)
	}
	go func() {
		for i := range chans {
			b, bn := bp(bodies[i])
			if st := cnSend(sender.h, cs(chans[i]), b, bn, 0, 0, nil); st != cnOK {
				stray("cn_send: %s", name(st))
			}
			if i%10 == 0 {
				time.Sleep(time.Millisecond) // let the host empty the queue between some results
			}
		}
	}()
	got := byClosure(t, hostLoop(t, q, pr, n, 7))
	if len(got) != n {
		t.Fatalf("%d distinct results, want %d", len(got), n)
	}
	for i, w := range waiters {
		r, ok := got[w.closure]
		switch {
		case !ok:
			t.Errorf("receive %d: no result", i)
		case r.Status != cnOK:
			t.Errorf("receive %d: %v, want CN_OK", i, r)
		case r.HasText:
			t.Errorf("receive %d: text %q, want NULL", i, r.Text)
		case !r.HasData || r.Len != uintptr(len(bodies[i])) || !bytes.Equal(r.Data, bodies[i]):
			t.Errorf("receive %d: body of %d bytes differs from the %d sent", i, r.Len, len(bodies[i]))
		}
	}
	q.empty(50 * time.Millisecond)
	for i, w := range waiters {
		if n := w.calls.Load(); n != 0 {
			t.Errorf("receive %d: its callback ran %d times", i, n)
		}
		if st := cnCancel(c.h, ops[i]); st != cnNotPending {
			t.Errorf("cn_cancel of receive %d, whose result was taken: %s, want CN_NOT_PENDING", i, name(st))
		}
	}
}

// One byte when the queue goes from empty to non-empty; after the host read it and took
// everything, another byte for the next result. With a socket pair too.
func TestQueueNotify(t *testing.T) {
	ts := startServer(t)
	for _, kind := range []string{"pipe", "socketpair"} {
		t.Run(kind, func(t *testing.T) {
			var rfd, wfd int
			if kind == "pipe" {
				rfd, wfd = notifyPipe(t)
			} else {
				rfd, wfd = notifySocketPair(t)
			}
			q := newQueue(t, wfd)
			c := connect(t, ts.url, nil)
			q.attach(c)
			ch := newChannelWait(t, c)
			if readable(rfd, 20*time.Millisecond) {
				t.Fatalf("notify readable before any result (%d bytes)", drain(t, rfd))
			}
			for round := range 5 {
				w := newWaiter(1, nil)
				pendingReceive(t, c, ch, w.closure)
				if readable(rfd, 10*time.Millisecond) {
					t.Fatalf("round %d: notify readable while the receive waits", round)
				}
				c.send(ch, numbered(t, round))
				if !readable(rfd, wait) {
					t.Fatalf("round %d: no notify byte within %s of the result", round, wait)
				}
				// Give a second byte (there must be none: one result, one transition) time to come.
				time.Sleep(5 * time.Millisecond)
				if n := drain(t, rfd); n != 1 {
					t.Errorf("round %d: %d notify bytes for one result, want 1", round, n)
				}
				got := q.take(4)
				if len(got) != 1 || got[0].Closure != w.closure || numberOf(got[0].Data) != round {
					t.Fatalf("round %d: took %v", round, got)
				}
				if got := q.take(4); len(got) != 0 {
					t.Fatalf("round %d: a second take returned %v", round, got)
				}
				if readable(rfd, 10*time.Millisecond) {
					t.Errorf("round %d: notify readable after the only result was taken", round)
					drain(t, rfd)
				}
			}
			// Two results that are ready together: at least one byte, and both taken after it.
			ch2 := newChannelWait(t, c)
			w1, w2 := newWaiter(1, nil), newWaiter(1, nil)
			pendingReceive(t, c, ch, w1.closure)
			pendingReceive(t, c, ch2, w2.closure)
			c.send(ch, numbered(t, 100))
			c.send(ch2, numbered(t, 101))
			got := byClosure(t, hostLoop(t, q, rfd, 2, 1))
			if got[w1.closure].Status != cnOK || got[w2.closure].Status != cnOK || len(got) != 2 {
				t.Errorf("two results: %v", got)
			}
		})
	}
}

// cn_new_channel pending: the queued result's text is the channel name; a pending group_add's
// text is NULL. Neither has data.
func TestQueueTexts(t *testing.T) {
	ts := startServer(t)
	q := newQueue(t, -1)
	c := connect(t, ts.url, nil)
	q.attach(c)
	sender := connect(t, ts.url, nil)
	// A prefix this client never used needs a new subscription: the call waits for the server.
	var name0 string
	var op uint64
	w := newWaiter(1, nil)
	for attempt := 0; ; attempt++ {
		prefix := fmt.Sprintf("fresh%d", attempt)
		var out uintptr
		st := cnNewChannel(c.h, cs(prefix), completeCB, w.closure, &out, &op)
		if st == cnOK { // allowed when the subscription happens to be confirmed: try another prefix
			cnFree(out)
			if attempt > 20 {
				t.Skip("cn_new_channel never went pending")
			}
			continue
		}
		if st != cnPending {
			t.Fatalf("cn_new_channel: %s (%s)", name(st), cnLastError())
		}
		name0 = prefix
		break
	}
	got := q.collect(1, 4)
	r := got[0]
	want := regexp.MustCompile(`^` + name0 + `\.[0-9a-f]{12}![0-9a-f]{32}$`)
	if r.Closure != w.closure || r.Status != cnOK || !r.HasText || !want.MatchString(r.Text) {
		t.Fatalf("pending cn_new_channel result: %v, want CN_OK with the name %s.<id>!<hex> as text", r, name0)
	}
	if r.HasData || r.Len != 0 {
		t.Errorf("pending cn_new_channel result with data (%d bytes)", r.Len)
	}
	if st := cnCancel(c.h, op); st != cnNotPending {
		t.Errorf("cn_cancel after the result was taken: %s, want CN_NOT_PENDING", name(st))
	}
	// The channel it named works.
	rw := newWaiter(1, nil)
	pendingReceive(t, c, r.Text, rw.closure)
	sender.send(r.Text, numbered(t, 9))
	if got := q.collect(1, 4); got[0].Closure != rw.closure || numberOf(got[0].Data) != 9 {
		t.Errorf("receive on the new channel: %v", got)
	}

	// group_add of a plain channel nobody subscribed yet.
	gw := newWaiter(1, nil)
	switch st := cnGroupAdd(c.h, cs(uniq(t, "grp")), cs(uniq(t, "plain")), completeCB, gw.closure, &op); st {
	case cnPending:
		got := q.collect(1, 4)
		if got[0].Closure != gw.closure || got[0].Status != cnOK || got[0].HasText || got[0].HasData {
			t.Errorf("pending cn_group_add result: %v (text %v data %v), want CN_OK, text and data NULL", got[0], got[0].HasText, got[0].HasData)
		}
	case cnOK:
		t.Log("cn_group_add finished at once")
	default:
		t.Errorf("cn_group_add: %s", name(st))
	}
	q.empty(20 * time.Millisecond)
	for _, w := range []*waiter{w, rw, gw} {
		if n := w.calls.Load(); n != 0 {
			t.Errorf("a callback of a queued operation ran %d times", n)
		}
	}
}

// Receives pending at cn_close end with CN_CLOSED in the queue, there when cn_close returned
// (waiting form) or called its own callback (pending form, which is not queued).
func TestQueueClose(t *testing.T) {
	ts := startServer(t)
	for _, form := range []string{"waiting", "pending"} {
		t.Run(form, func(t *testing.T) {
			pr, pw := notifyPipe(t)
			q := newQueue(t, pw)
			c := connect(t, ts.url, nil)
			q.attach(c)
			var ws []*waiter
			for i := range 8 {
				ch := uniq(t, fmt.Sprintf("plain%d", i))
				if i < 5 {
					ch = newChannelWait(t, c)
				}
				w := newWaiter(1, nil)
				st, _, _ := startReceive(t, c, ch, w.closure)
				if st != cnPending {
					t.Fatalf("cn_receive(%s): %s", ch, name(st))
				}
				ws = append(ws, w)
			}
			if form == "waiting" {
				if st := cnClose(c.h, 0, 0); st != cnOK {
					t.Fatalf("cn_close: %s", name(st))
				}
			} else {
				cw := newWaiter(2, nil)
				switch st := cnClose(c.h, completeCB, cw.closure); st {
				case cnPending:
					if r := cw.wait(t); r.Status != cnOK {
						t.Fatalf("close callback: %s", name(r.Status))
					}
				case cnOK:
				default:
					t.Fatalf("cn_close: %s", name(st))
				}
			}
			// Everything is in the queue now: no waiting, one take with room for more.
			if !readable(pr, wait) {
				t.Errorf("no notify byte for the results of the close")
			}
			drain(t, pr)
			got := byClosure(t, q.take(64))
			if len(got) != len(ws) {
				t.Fatalf("%d results in the queue after the close, want %d: %v", len(got), len(ws), got)
			}
			for i, w := range ws {
				r := got[w.closure]
				if r.Status != cnClosed || !r.HasText || r.Text == "" || r.HasData || r.Len != 0 {
					t.Errorf("receive %d: %v (text %v, data %v), want CN_CLOSED with a detail and no data", i, r, r.HasText, r.HasData)
				}
				if n := w.calls.Load(); n != 0 {
					t.Errorf("receive %d: its callback ran %d times", i, n)
				}
			}
			q.empty(30 * time.Millisecond)
			if readable(pr, 0) {
				t.Errorf("notify byte after everything was taken (%d bytes)", drain(t, pr))
			}
			if st := cnQueueFree(q.h); st != cnOK {
				t.Errorf("cn_queue_free after the close: %s (%s)", name(st), cnLastError())
			}
		})
	}
}

// A capacity smaller than the number of results: several takes, each at most capacity, oldest
// first; a block stays valid until it is freed, also after later takes.
func TestQueueCapacity(t *testing.T) {
	ts := startServer(t)
	q := newQueue(t, -1)
	c := connect(t, ts.url, nil)
	q.attach(c)
	sender := connect(t, ts.url, nil)

	// Order: one sender, one client, one dispatcher: results finish in the order of the sends,
	// and the takes, whenever they run, must hand them over in that order.
	const n = 40
	chans := make([]string, n)
	closures := make([]uintptr, n)
	for i := range chans {
		chans[i] = newChannelWait(t, c)
		closures[i] = nextClosure.Add(1)
		pendingReceive(t, c, chans[i], closures[i])
	}
	for i := range chans {
		sender.send(chans[i], queueBody(t, i))
	}
	var order []qResult
	for deadline := time.Now().Add(wait); len(order) < n; {
		batch := q.take(3)
		order = append(order, batch...)
		if len(batch) == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%d of %d results", len(order), n)
			}
			time.Sleep(200 * time.Microsecond)
		}
	}
	for i, r := range order {
		if r.Closure != closures[i] || !bytes.Equal(r.Data, queueBody(t, i)) {
			var got []int
			for _, r := range order {
				got = append(got, numberOf(r.Data))
			}
			t.Fatalf("results not oldest first: message order %v", got)
		}
	}

	// Exact counts: ten receives ended by the close are all in the queue when it returns.
	c2 := connect(t, ts.url, nil)
	q2 := newQueue(t, -1)
	q2.attach(c2)
	want := map[uintptr]bool{}
	for range 10 {
		cl := nextClosure.Add(1)
		want[cl] = true
		pendingReceive(t, c2, newChannelWait(t, c2), cl)
	}
	if st := cnClose(c2.h, 0, 0); st != cnOK {
		t.Fatalf("cn_close: %s", name(st))
	}
	if got := q2.take(0); len(got) != 0 {
		t.Fatalf("capacity 0 took %v", got)
	}
	// The first block is kept while the second is taken.
	var first [3]cResult
	var count, mem uintptr
	if st := cnQueueTake(q2.h, &first[0], 3, &count, &mem); st != cnOK || count != 3 || mem == 0 {
		t.Fatalf("first take(3): %s count %d memory %#x", name(st), count, mem)
	}
	firstTexts := make([]string, 3)
	for i, r := range first {
		firstTexts[i] = cString(r.text)
	}
	var seen []uintptr
	for i, wantCount := range []int{3, 3, 1, 0, 0} {
		got := q2.take(3)
		if len(got) != wantCount {
			t.Fatalf("take %d (capacity 3): %d results, want %d", i+2, len(got), wantCount)
		}
		for _, r := range got {
			seen = append(seen, r.Closure)
		}
	}
	for i, r := range first {
		if txt := cString(r.text); txt != firstTexts[i] || r.status != cnClosed {
			t.Errorf("first block changed after later takes: %q %s, was %q", txt, name(r.status), firstTexts[i])
		}
		seen = append(seen, r.closure)
	}
	cnFree(mem)
	sort.Slice(seen, func(i, j int) bool { return seen[i] < seen[j] })
	for i, cl := range seen {
		if !want[cl] || (i > 0 && seen[i-1] == cl) {
			t.Fatalf("closures taken: %v, want each of the 10 once", seen)
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("%d closures taken, want %d", len(seen), len(want))
	}
}

// One queue serves two clients: each result once, with its own client's data; closing one
// client leaves the other's results flowing.
func TestQueueTwoClients(t *testing.T) {
	ts := startServer(t)
	pr, pw := notifyPipe(t)
	q := newQueue(t, pw)
	a := connect(t, ts.url, nil)
	b := connect(t, ts.url, nil)
	q.attach(a)
	q.attach(b)
	sender := connect(t, ts.url, nil)
	type expect struct {
		body []byte
	}
	want := map[uintptr]expect{}
	var sends [][2]any
	for i := range 40 {
		cl := a
		if i%2 == 1 {
			cl = b
		}
		ch := newChannelWait(t, cl)
		closure := nextClosure.Add(1)
		pendingReceive(t, cl, ch, closure)
		body := queueBody(t, i)
		want[closure] = expect{body}
		sends = append(sends, [2]any{ch, body})
	}
	for _, s := range sends {
		sender.send(s[0].(string), s[1].([]byte))
	}
	got := byClosure(t, hostLoop(t, q, pr, len(want), 5))
	for cl, e := range want {
		if r, ok := got[cl]; !ok || r.Status != cnOK || !bytes.Equal(r.Data, e.body) {
			t.Errorf("closure %d: %v", cl, r)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d results, want %d", len(got), len(want))
	}
	// a closes: its pending receive ends with CN_CLOSED; b keeps delivering.
	aw, bw := nextClosure.Add(1), nextClosure.Add(1)
	pendingReceive(t, a, newChannelWait(t, a), aw)
	bch := newChannelWait(t, b)
	pendingReceive(t, b, bch, bw)
	if st := cnClose(a.h, 0, 0); st != cnOK {
		t.Fatalf("cn_close: %s", name(st))
	}
	if st := cnQueueFree(q.h); st != cnIllegalState {
		t.Errorf("cn_queue_free with b still attached: %s, want CN_ILLEGAL_STATE", name(st))
	}
	sender.send(bch, numbered(t, 77))
	got = byClosure(t, hostLoop(t, q, pr, 2, 5))
	if got[aw].Status != cnClosed || got[bw].Status != cnOK || numberOf(got[bw].Data) != 77 {
		t.Errorf("after a's close: %v", got)
	}
}

// Several OS threads take from one queue at once while results keep coming: each result is
// taken exactly once, intact.
func TestQueueConcurrentTakers(t *testing.T) {
	ts := startServer(t)
	q := newQueue(t, -1)
	const nClients, perClient, rounds, takers = 2, 120, 3, 8
	var clients []*client
	for range nClients {
		c := connect(t, ts.url, map[string]any{"capacity": 1000})
		q.attach(c)
		clients = append(clients, c)
	}
	sender := connect(t, ts.url, nil)
	type target struct {
		c  *client
		ch string
	}
	var targets []target
	for _, c := range clients {
		for range perClient {
			targets = append(targets, target{c, newChannelWait(t, c)})
		}
	}
	var (
		mu       sync.Mutex
		expected = map[uintptr][]byte{}
		taken    = map[uintptr]int{}
		bad      []string
		total    atomic.Int64
		stop     atomic.Bool
		wg       sync.WaitGroup
	)
	for k := range takers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread() // each taker on an OS thread of its own
			defer runtime.UnlockOSThread()
			capacity := 1 + k%5
			results := make([]cResult, capacity)
			for !stop.Load() {
				var count, mem uintptr
				if st := cnQueueTake(q.h, &results[0], uintptr(capacity), &count, &mem); st != cnOK {
					mu.Lock()
					bad = append(bad, "cn_queue_take: "+name(st))
					mu.Unlock()
					return
				}
				if count == 0 {
					runtime.Gosched()
					continue
				}
				copies := make([]qResult, count)
				for i, r := range results[:count] {
					copies[i] = qResult{Closure: r.closure, Status: r.status, Data: cBytes(r.data, r.len)}
				}
				cnFree(mem)
				mu.Lock()
				for _, r := range copies {
					taken[r.Closure]++
					if want, ok := expected[r.Closure]; !ok || r.Status != cnOK || !bytes.Equal(r.Data, want) {
						bad = append(bad, fmt.Sprintf("taker %d: %v (expected %v)", k, r, ok))
					}
				}
				mu.Unlock()
				total.Add(int64(count))
			}
		}()
	}
	for round := range rounds {
		bodies := make([][]byte, len(targets))
		for i, tg := range targets {
			closure := nextClosure.Add(1)
			bodies[i] = queueBody(t, round*1000+i)
			mu.Lock()
			expected[closure] = bodies[i]
			mu.Unlock()
			pendingReceive(t, tg.c, tg.ch, closure)
		}
		for i, tg := range targets {
			sender.send(tg.ch, bodies[i])
		}
		want := int64((round + 1) * len(targets))
		deadline := time.Now().Add(wait)
		for total.Load() < want && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if total.Load() < want {
			stop.Store(true)
			wg.Wait()
			t.Fatalf("round %d: %d of %d results taken", round, total.Load(), want)
		}
	}
	time.Sleep(20 * time.Millisecond) // a duplicate would be taken now
	stop.Store(true)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for _, b := range bad {
		t.Error(b)
	}
	for cl := range expected {
		if taken[cl] != 1 {
			t.Errorf("closure %d taken %d times, want 1", cl, taken[cl])
		}
	}
	if int(total.Load()) != len(expected) {
		t.Errorf("%d results taken, %d expected", total.Load(), len(expected))
	}
}

// cn_cancel racing deliveries, from several threads on clients that share a queue: when
// cn_cancel says CN_NOT_PENDING the result is already in the queue (a take right after finds
// it); when it says CN_OK the result never comes and the message is received later. Every
// message is received exactly once.
func TestQueueCancelStorm(t *testing.T) {
	ts := startServer(t)
	q := newQueue(t, -1)
	const workers, sends = 4, 400
	var clients []*client
	for range 2 {
		c := connect(t, ts.url, map[string]any{"capacity": 1000})
		q.attach(c)
		clients = append(clients, c)
	}
	sender := connect(t, ts.url, nil)
	// The shared view of the queue: every take records its results under mu, so that a worker
	// that looks for its result finds it whichever worker took it.
	var (
		mu      sync.Mutex
		results = map[uintptr]qResult{}
	)
	takeAll := func() { // under mu, on any goroutine
		for {
			got, st := takeRaw(t, q.h, 16)
			if st != cnOK {
				t.Errorf("cn_queue_take: %s", name(st))
				return
			}
			for _, r := range got {
				if prev, dup := results[r.Closure]; dup {
					t.Errorf("closure %d taken twice: %v %v", r.Closure, prev, r)
				}
				results[r.Closure] = r
			}
			if len(got) < 16 {
				return
			}
		}
	}
	var (
		notPending, withdrawn, immediate atomic.Int64
		withdrawnSet                     sync.Map // closure -> struct{}
		wg                               sync.WaitGroup
	)
	for k := range workers {
		c := clients[k%len(clients)]
		ch := newChannelWait(t, c)
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			rng := rand.New(rand.NewPCG(uint64(k), 7))
			count := map[int]int{}
			record := func(body []byte) { count[numberOf(body)]++ }
			// A result taken for this worker: look it up (under mu) and use it.
			claim := func(closure uintptr) (qResult, bool) {
				mu.Lock()
				defer mu.Unlock()
				takeAll()
				r, ok := results[closure]
				if ok {
					delete(results, closure)
				}
				return r, ok
			}
			senderDone := make(chan struct{})
			go func() {
				defer close(senderDone)
				for i := range sends {
					b, n := bp(numbered(t, k*100000+i))
					if st := cnSend(sender.h, cs(ch), b, n, 0, 0, nil); st != cnOK {
						stray("worker %d: cn_send: %s", k, name(st))
					}
					time.Sleep(time.Duration(i%4) * 40 * time.Microsecond)
				}
			}()
			sending := true
			for i := 0; sending || i < sends; i++ {
				select {
				case <-senderDone:
					sending = false
				default:
				}
				closure := nextClosure.Add(1)
				st, body, op := startReceive(t, c, ch, closure)
				switch st {
				case cnOK:
					immediate.Add(1)
					record(body)
					continue
				case cnPending:
				default:
					t.Errorf("worker %d: cn_receive: %s", k, name(st))
					return
				}
				for end := time.Now().Add(time.Duration(rng.IntN(80)) * time.Microsecond); time.Now().Before(end); {
				}
				switch st := cnCancel(c.h, op); st {
				case cnOK:
					withdrawn.Add(1)
					withdrawnSet.Store(closure, struct{}{})
				case cnNotPending:
					notPending.Add(1)
					r, ok := claim(closure)
					if !ok {
						t.Errorf("worker %d: cn_cancel said CN_NOT_PENDING but the result was not in the queue", k)
						// It may still come: wait for it so the accounting below stays right.
						for deadline := time.Now().Add(wait); !ok && time.Now().Before(deadline); {
							time.Sleep(time.Millisecond)
							r, ok = claim(closure)
						}
						if !ok {
							return
						}
					}
					if r.Status != cnOK {
						t.Errorf("worker %d: queued result %v", k, r)
						continue
					}
					record(r.Data)
				default:
					t.Errorf("worker %d: cn_cancel: %s", k, name(st))
					return
				}
			}
			<-senderDone
			// Take what is left: at once, or through the queue.
			deadline := time.Now().Add(wait)
			for got := func() int {
				s := 0
				for _, n := range count {
					s += n
				}
				return s
			}(); got < sends; got++ {
				closure := nextClosure.Add(1)
				st, body, _ := startReceive(t, c, ch, closure)
				switch st {
				case cnOK:
					record(body)
					continue
				case cnPending:
				default:
					t.Errorf("worker %d: drain cn_receive: %s", k, name(st))
					return
				}
				for {
					if r, ok := claim(closure); ok {
						record(r.Data)
						break
					}
					if time.Now().After(deadline) {
						t.Errorf("worker %d: %d of %d messages received", k, got, sends)
						return
					}
					time.Sleep(time.Millisecond)
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
				t.Errorf("worker %d: lost %v, duplicated %v, %d distinct", k, lost, dup, len(count))
			}
		}()
	}
	wg.Wait()
	time.Sleep(30 * time.Millisecond) // a result of a withdrawn receive would show now
	mu.Lock()
	takeAll()
	for cl, r := range results {
		if _, ok := withdrawnSet.Load(cl); ok {
			t.Errorf("a receive withdrawn with CN_OK has a result: %v", r)
		} else {
			t.Errorf("a result nobody claimed: %v", r)
		}
	}
	mu.Unlock()
	t.Logf("%d at once, %d withdrawn, %d CN_NOT_PENDING (result already queued)", immediate.Load(), withdrawn.Load(), notPending.Load())
	if notPending.Load() == 0 {
		t.Errorf("no cancel met a delivery: the storm did not test the race")
	}
}

// A group message that finishes many waiting receives is one burst: the notify byte comes after
// the last of its results is queued, so the first take after the byte finds all of them.
func TestQueueBurstSignalsOnce(t *testing.T) {
	ts := startServer(t)
	rfd, wfd := notifyPipe(t)
	q := newQueue(t, wfd)
	c := connect(t, ts.url, nil)
	q.attach(c)
	sender := connect(t, ts.url, nil)
	group := uniq(t, "burst")
	const members = 500
	closures := map[uintptr]bool{}
	for range members {
		ch := newChannelWait(t, c)
		c.groupAdd(group, ch)
		w := newWaiter(1, nil)
		pendingReceive(t, c, ch, w.closure)
		closures[w.closure] = true
	}
	sender.groupSend(group, numbered(t, 7))
	if !readable(rfd, wait) {
		t.Fatalf("no notify byte within %s of the group message", wait)
	}
	got := q.take(2 * members) // at once: the library may still be queueing if it signalled early
	if len(got) != members {
		t.Fatalf("the first take after the signal found %d of the %d results of the burst", len(got), members)
	}
	for _, r := range got {
		if r.Status != cnOK || !closures[r.Closure] || numberOf(r.Data) != 7 {
			t.Fatalf("result %+v is not one of the burst", r)
		}
	}
}
