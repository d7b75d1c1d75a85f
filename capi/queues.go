package main

/*
#include "bridge.h"
*/
import "C"

import (
	"errors"
	"sync"
	"unsafe"
)

var (
	queues           sync.Map // uint64 -> *resultQueue, until cn_queue_free
	errQueueAttached = errors.New("a client that is not closed still puts its results in this queue")
)

// resultSink takes the results of a client's pending operations when they do not go to each
// operation's own callback: a batcher (cn_set_batch_callback) or a resultQueue.
type resultSink interface {
	add(outcome)
	detach() // the client is closed: nothing more comes from it
}

// resultQueue holds results until the host takes them (cn_queue_take): no library thread ever
// calls into the host for them, which is what an event loop with an interpreter lock wants. When
// the queue goes from empty to non-empty it writes one byte to the host's notify descriptor.
type resultQueue struct {
	id     uint64
	notify *notifier // nil: the host polls

	mu       sync.Mutex
	items    []outcome
	attached int  // clients not closed yet that add to this queue
	held     int  // bursts of deliveries in progress (hold): the signal waits for their end
	owed     bool // a signal is due when the last burst ends
}

func (q *resultQueue) add(r outcome) {
	q.mu.Lock()
	signal := len(q.items) == 0
	q.items = append(q.items, r)
	if signal && q.held > 0 {
		q.owed, signal = true, false
	}
	q.mu.Unlock()
	if signal && q.notify != nil {
		q.notify.signal()
	}
}

// hold starts a burst of results (the deliveries of one group message): the host is signalled
// once, when the burst ends, and takes the whole burst at once instead of racing the library
// for every result of it.
func (q *resultQueue) hold() {
	q.mu.Lock()
	q.held++
	q.mu.Unlock()
}

// release ends a burst, and signals the host if a result came during it.
func (q *resultQueue) release() {
	q.mu.Lock()
	q.held--
	signal := q.held == 0 && q.owed
	if signal {
		q.owed = false
	}
	q.mu.Unlock()
	if signal && q.notify != nil {
		q.notify.signal()
	}
}

func (q *resultQueue) detach() {
	q.mu.Lock()
	q.attached--
	q.mu.Unlock()
}

// take removes up to max results, oldest first.
func (q *resultQueue) take(max int) []outcome {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := min(max, len(q.items))
	taken := q.items[:n:n]
	q.items = q.items[n:]
	if len(q.items) == 0 {
		q.items = nil // let the backing array go
	}
	return taken
}

//export cngo_queue_new
func cngo_queue_new(notify C.intptr_t, out *C.cn_queue) (st C.cn_status) {
	defer recoverStatus(&st)
	if out == nil {
		return fail(argError("queue must not be NULL"))
	}
	*out = 0
	q := &resultQueue{id: nextHandle()}
	if notify != -1 {
		n, err := newNotifier(uintptr(notify))
		if err != nil {
			return fail(err)
		}
		q.notify = n
	}
	queues.Store(q.id, q)
	*out = C.cn_queue(q.id)
	return C.CN_OK
}

func lookupQueue(h C.cn_queue) (*resultQueue, error) {
	if v, ok := queues.Load(uint64(h)); ok {
		return v.(*resultQueue), nil
	}
	return nil, errInvalidHandle
}

//export cngo_set_result_queue
func cngo_set_result_queue(h C.cn_client, qh C.cn_queue) (st C.cn_status) {
	defer recoverStatus(&st)
	q, err := lookupQueue(qh)
	if err != nil {
		return fail(err)
	}
	return result(setSink(h, func() resultSink {
		q.mu.Lock()
		q.attached++
		q.mu.Unlock()
		return q
	}))
}

//export cngo_queue_take
func cngo_queue_take(qh C.cn_queue, results *C.cn_result, capacity C.size_t, count *C.size_t,
	memory *unsafe.Pointer) (st C.cn_status) {
	defer recoverStatus(&st)
	if count == nil || memory == nil || (results == nil && capacity > 0) {
		return fail(argError("results (unless capacity is 0), count and memory must not be NULL"))
	}
	*count, *memory = 0, nil
	q, err := lookupQueue(qh)
	if err != nil {
		return fail(err)
	}
	if capacity == 0 {
		return C.CN_OK
	}
	taken := q.take(int(min(capacity, 1<<20)))
	if len(taken) == 0 {
		return C.CN_OK
	}
	*memory = packResults(taken, unsafe.Slice(results, len(taken)))
	*count = C.size_t(len(taken))
	return C.CN_OK
}

//export cngo_queue_free
func cngo_queue_free(qh C.cn_queue) (st C.cn_status) {
	defer recoverStatus(&st)
	q, err := lookupQueue(qh)
	if err != nil {
		return fail(err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.attached > 0 {
		return fail(errQueueAttached)
	}
	queues.Delete(q.id) // results nobody took go with it: their clients are closed
	return C.CN_OK
}
