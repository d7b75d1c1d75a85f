//go:build linux

package abitest

import (
	"fmt"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// What a C host does with result queues ("Result queues and threads" in the header): it makes a
// queue with a notify descriptor, waits until the descriptor is readable, reads and discards
// its bytes, and then takes results until the queue is empty.

// result is one cn_result taken from a queue, copied at once (what it points to is lent only
// until the next take). TextPtr and DataPtr are the lent addresses, for the tests of lending.
type result struct {
	Op      uint64
	Closure uintptr
	Status  int32
	Text    string
	HasText bool
	Data    []byte
	HasData bool
	Len     uintptr
	Rearm   uintptr // the word that starts the receive over (cn_result.rearm)

	TextPtr, DataPtr uintptr
}

func (r result) String() string {
	return fmt.Sprintf("{op %d closure %d %s text %q data %d bytes}", r.Op, r.Closure, name(r.Status), r.Text, r.Len)
}

// queue is a cn_queue of a test with its notify pipe (rfd -1: the host polls).
type queue struct {
	t        testing.TB
	h        uint64
	rfd, wfd int
}

// newQueue makes a queue that signals a non-blocking pipe. It is freed when the test ends, and
// the pipe closed after that (the host keeps notify open until cn_queue_free).
func newQueue(t testing.TB) *queue {
	t.Helper()
	r, w := notifyPipe(t)
	return newQueueOn(t, r, w)
}

// newPolledQueue makes a queue without notify (-1): the host polls.
func newPolledQueue(t testing.TB) *queue {
	t.Helper()
	return newQueueOn(t, -1, -1)
}

// newQueueOn makes a queue that signals wfd (-1: none); rfd is the end the test reads.
func newQueueOn(t testing.TB, rfd, wfd int) *queue {
	t.Helper()
	var h uint64
	st, msg := onThread(func() int32 { return cnQueueNew(wfd, &h) })
	if st != cnOK || h == 0 {
		t.Fatalf("cn_queue_new(%d): %s (%s), handle %d", wfd, name(st), msg, h)
	}
	if msg != "" {
		t.Errorf("cn_queue_new: cn_last_error() is %q after CN_OK", msg)
	}
	// Registered after the pipe's cleanup, so it runs before it: free, then close.
	t.Cleanup(func() {
		if st := cnQueueFree(h); st != cnOK && st != cnInvalidHandle {
			t.Errorf("cleanup: cn_queue_free: %s (%s)", name(st), cnLastError())
		}
	})
	return &queue{t: t, h: h, rfd: rfd, wfd: wfd}
}

// takeRaw is one cn_queue_take with room for capacity results. The out-parameter holds garbage
// before the call, so that the library must write it.
func (q *queue) takeRaw(capacity int) ([]cResult, int32, string) {
	results := make([]cResult, capacity)
	var rp *cResult
	if capacity > 0 {
		rp = &results[0]
	}
	count := uintptr(0xdead)
	st, msg := onThread(func() int32 { return cnQueueTake(q.h, rp, uintptr(capacity), &count) })
	if st != cnOK {
		return nil, st, msg
	}
	if count > uintptr(capacity) {
		q.t.Errorf("cn_queue_take(capacity %d): count %d", capacity, count)
		return nil, cnInternal, msg
	}
	if msg != "" {
		q.t.Errorf("cn_queue_take: cn_last_error() is %q after CN_OK", msg)
	}
	return results[:count], st, msg
}

// copyResult copies what r points to; it reports with t.Errorf, so that it may run on any
// goroutine.
func copyResult(t testing.TB, r cResult) result {
	out := result{Op: r.op, Closure: r.closure, Status: r.status, Len: r.len, Rearm: r.rearm, TextPtr: r.text, DataPtr: r.data}
	if r.text != 0 {
		out.Text, out.HasText = cString(r.text), true
	}
	if r.data != 0 {
		out.Data, out.HasData = cBytes(r.data, r.len), true
	} else if r.len != 0 {
		t.Errorf("result %v: data NULL with len %d", out, r.len)
	}
	if r.op == 0 {
		t.Errorf("result %v: op 0", out)
	}
	return out
}

// take is one cn_queue_take that must succeed; the results are copied.
func (q *queue) take(capacity int) []result {
	q.t.Helper()
	raw, st, msg := q.takeRaw(capacity)
	if st != cnOK {
		q.t.Fatalf("cn_queue_take(capacity %d): %s (%s)", capacity, name(st), msg)
	}
	out := make([]result, len(raw))
	for i, r := range raw {
		out[i] = copyResult(q.t, r)
	}
	return out
}

// takeAll takes until a take comes back short, as a host does. It never makes a take more than
// that: each take ends what the one before lent, and the chance to give its results back with
// cn_cancel.
func (q *queue) takeAll() []result {
	q.t.Helper()
	const capacity = 16
	var got []result
	for range 100000 {
		batch := q.take(capacity)
		got = append(got, batch...)
		if len(batch) < capacity {
			return got
		}
	}
	q.t.Fatalf("the queue never ran empty")
	return nil
}

// takeNow takes what the queue holds now, as a host does: first the notify bytes, then the
// results.
func (q *queue) takeNow() []result {
	q.t.Helper()
	if q.rfd >= 0 {
		drain(q.t, q.rfd)
	}
	return q.takeAll()
}

// wait takes results the way a host does until at least n came, failing after a while. A
// result that sits in the queue without a notify byte on its way fails it: such a host would
// sleep forever.
func (q *queue) wait(n int) []result {
	q.t.Helper()
	var got []result
	deadline := time.Now().Add(wait)
	for len(got) < n {
		left := time.Until(deadline)
		if q.rfd < 0 {
			got = append(got, q.takeAll()...)
			if len(got) < n {
				if left <= 0 {
					q.t.Fatalf("%d of %d results within %s: %v", len(got), n, wait, got)
				}
				time.Sleep(time.Millisecond)
			}
			continue
		}
		if !readable(q.rfd, max(left, 0)) {
			extra := q.takeAll()
			q.t.Fatalf("no notify byte within %s with %d of %d results taken; %d more were in the queue unsignalled: %v",
				wait, len(got), n, len(extra), extra)
		}
		drain(q.t, q.rfd) // first the bytes, then the results: none is missed
		got = append(got, q.takeAll()...)
	}
	return got
}

// one waits for exactly one result.
func (q *queue) one() result {
	q.t.Helper()
	got := q.wait(1)
	if len(got) != 1 {
		q.t.Fatalf("%d results, want 1: %v", len(got), got)
	}
	return got[0]
}

// quiet checks that no result and no notify byte comes for d.
func (q *queue) quiet(d time.Duration) {
	q.t.Helper()
	if q.rfd >= 0 && readable(q.rfd, d) {
		q.t.Errorf("notify byte on a queue that must stay quiet (%d bytes)", drain(q.t, q.rfd))
	} else if q.rfd < 0 {
		time.Sleep(d)
	}
	if got := q.takeAll(); len(got) > 0 {
		q.t.Errorf("results in a queue that must stay quiet: %v", got)
	}
}

// byOp indexes results by op and fails on an op that came twice.
func byOp(t testing.TB, results []result) map[uint64]result {
	t.Helper()
	m := make(map[uint64]result, len(results))
	for _, r := range results {
		if prev, dup := m[r.Op]; dup {
			t.Errorf("op %d came twice: %v and %v", r.Op, prev, r)
		}
		m[r.Op] = r
	}
	return m
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
		left := max(time.Until(deadline), 0)
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
	for range 1 << 16 {
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
	return total
}
