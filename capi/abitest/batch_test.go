//go:build linux

package abitest

import (
	"sync"
	"testing"
	"time"
	"unsafe"
)

// cResult mirrors struct cn_result of include/channels_nats.h on 64-bit platforms.
type cResult struct {
	closure uintptr
	status  int32
	_       int32
	text    uintptr
	data    uintptr
	len     uintptr
}

// batchSizes records how many results each call of the batch callback carried.
var batchSizes struct {
	sync.Mutex
	sizes []int
}

// onBatch hands each result of a batch to the per-operation bookkeeping of onComplete.
func onBatch(_ uintptr, results uintptr, count uintptr) {
	batchSizes.Lock()
	batchSizes.sizes = append(batchSizes.sizes, int(count))
	batchSizes.Unlock()
	for _, r := range unsafe.Slice((*cResult)(ptr(results)), int(count)) {
		onComplete(r.closure, r.status, r.text, r.data, r.len)
	}
}

func TestBatchCallbackRules(t *testing.T) {
	s := startServer(t)
	if st := cnSetBatch(999999999, batchCB, 0); st != cnInvalidHandle {
		t.Fatalf("unknown client: %s", name(st))
	}
	c := connect(t, s.url, nil)
	if st := cnSetBatch(c.h, 0, 0); st != cnInvalidArg {
		t.Fatalf("NULL callback: %s", name(st))
	}
	if st := cnSetBatch(c.h, batchCB, 0); st != cnOK {
		t.Fatalf("first set: %s %s", name(st), cnLastError())
	}
	if st := cnSetBatch(c.h, batchCB, 0); st != cnIllegalState {
		t.Fatalf("second set: %s", name(st))
	}

	late := connect(t, s.url, nil)
	ch := late.newChannel("")
	w := newWaiter(1, nil)
	late.receivePending(ch, w)
	if st := cnSetBatch(late.h, batchCB, 0); st != cnIllegalState {
		t.Fatalf("set with an operation pending: %s", name(st))
	}
}

// TestBatchDelivery: in batch mode every pending receive still gets its message exactly once,
// through the batch callback, and results that are ready together arrive in one call.
func TestBatchDelivery(t *testing.T) {
	s := startServer(t)
	c := connect(t, s.url, nil)
	if st := cnSetBatch(c.h, batchCB, 0); st != cnOK {
		t.Fatalf("set: %s", name(st))
	}
	sender := connect(t, s.url, nil)
	group := uniq(t, "batch")
	const members = 200
	waiters := make([]*waiter, members)
	for i := range waiters {
		ch := c.newChannel("")
		c.groupAdd(group, ch)
		waiters[i] = newWaiter(2, nil)
		c.receivePending(ch, waiters[i])
	}
	batchSizes.Lock()
	before := len(batchSizes.sizes)
	batchSizes.Unlock()
	sender.groupSend(group, numbered(t, 7))
	for i, w := range waiters { // each got it once: a second callback would fill its buffer
		r := w.wait(t)
		if r.Status != cnOK || numberOf(r.Data) != 7 {
			t.Fatalf("member %d: %s %v", i, name(r.Status), r.Data)
		}
	}
	for i, w := range waiters {
		if n := w.calls.Load(); n != 1 {
			t.Fatalf("member %d: %d callbacks", i, n)
		}
	}
	batchSizes.Lock()
	calls := batchSizes.sizes[before:]
	batchSizes.Unlock()
	if len(calls) >= members {
		t.Fatalf("%d results came in %d calls: not batched", members, len(calls))
	}

	// Close ends pending receives through the batch callback before it returns.
	ch := c.newChannel("")
	w := newWaiter(1, nil)
	c.receivePending(ch, w)
	if st := cnClose(c.h, 0, 0); st != cnOK {
		t.Fatalf("close: %s", name(st))
	}
	select {
	case r := <-w.ch:
		if r.Status != cnClosed {
			t.Fatalf("pending receive ended with %s", name(r.Status))
		}
	case <-time.After(time.Second):
		t.Fatal("close returned before the pending receive was ended")
	}
}
