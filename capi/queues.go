package main

/*
#include "bridge.h"
*/
import "C"

import (
	"runtime"
	"sync"
	"unsafe"
)

var queues handleTable[resultQueue] // until cn_queue_free

// outcome is one result waiting in a queue.
type outcome struct {
	op      *op // nil for a connect's or a close's result
	id      uint64
	closure C.uintptr_t
	status  C.cn_status
	text    string
	body    []byte
	rearm   uintptr // the word of a receive that parked with this message (cn_result.rearm)
}

// resultSlot is a cn_result as Go fills it in host memory: its pointers as integers (see
// storeAddress). The declarations after it fail to compile unless its layout is the header's.
type resultSlot struct {
	op      C.cn_op
	closure uintptr
	status  C.cn_status
	text    uintptr
	data    uintptr
	len     C.size_t
	rearm   uintptr
}

// Each index below is out of range (a compile error) unless the two agree.
var (
	_ = [1]int{}[unsafe.Sizeof(resultSlot{})-unsafe.Sizeof(C.cn_result{})]
	_ = [1]int{}[unsafe.Offsetof(resultSlot{}.closure)-unsafe.Offsetof(C.cn_result{}.closure)]
	_ = [1]int{}[unsafe.Offsetof(resultSlot{}.status)-unsafe.Offsetof(C.cn_result{}.status)]
	_ = [1]int{}[unsafe.Offsetof(resultSlot{}.text)-unsafe.Offsetof(C.cn_result{}.text)]
	_ = [1]int{}[unsafe.Offsetof(resultSlot{}.data)-unsafe.Offsetof(C.cn_result{}.data)]
	_ = [1]int{}[unsafe.Offsetof(resultSlot{}.len)-unsafe.Offsetof(C.cn_result{}.len)]
	_ = [1]int{}[unsafe.Offsetof(resultSlot{}.rearm)-unsafe.Offsetof(C.cn_result{}.rearm)]
)

// resultQueue holds results until the host takes them (cn_queue_take): no library thread ever
// calls into the host for them. When the queue goes from empty to non-empty it writes one byte
// to the host's notify descriptor.
//
// What a take or a receive lends the host stays valid until the next one: message bodies are
// the layer's own bytes, pinned (no copy), and texts are copied into one C block.
type resultQueue struct {
	id     uint64
	notify *notifier // nil: the host polls

	mu    sync.Mutex
	items []outcome
	array []outcome // the array items is a window of, kept for the next burst when small
	lent  []*op     // whose results the last take handed over: retractable until the next take
	// nextLent is where lentOp looks first: after the op of lent that started over last.
	nextLent int
	// spareLent is the array of the lent before, for the next take's.
	spareLent []*op
	freed     bool
	pinned    runtime.Pinner // bodies lent by the last take or receive
	last      uintptr        // the body pinned last, until release
	block     unsafe.Pointer // C block the last take's texts were copied into
	size      int            // its size
	texts     []slotText     // scratch of take: the texts it hands over
}

// slotText is a text a take copies into its C block, for results[slot].
type slotText struct {
	slot int
	text string
}

// keptResults bounds the array an emptied queue keeps for its next results. A queue that fills
// and empties with every group message then queues into the same array, where it let the array
// go each time and regrew it: bench/wake_cost.py (2,000 members, 60 messages) ran 12 to 13 of
// the library's garbage collections against 22 to 23. A larger array, left by a burst, goes.
const keptResults = 4096

// add queues r and wakes the host when the queue was empty; false when the queue was freed.
func (q *resultQueue) add(c *client, r outcome) bool {
	q.mu.Lock()
	if q.freed {
		q.mu.Unlock()
		return false
	}
	wasEmpty := len(q.items) == 0
	if wasEmpty {
		q.items = q.array[:0]
	}
	moves := len(q.items) == cap(q.items) // append moves items to a new array, starting at items[0]
	q.items = append(q.items, r)
	if moves {
		q.array = q.items[:0]
	}
	q.mu.Unlock()
	if wasEmpty {
		c.signal(q)
	}
	return true
}

// signal writes the notify byte, unless q was freed: after cn_queue_free the host may close or
// reuse the descriptor.
func (q *resultQueue) signal() {
	if q.notify == nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.freed {
		q.notify.signal()
	}
}

// lend pins body until the next release, and returns its address for C (an integer: see
// storeAddress). The members of a group message share one body, so results in a row often lend
// the same one: it is pinned once. q.mu must be held.
func (q *resultQueue) lend(body []byte) uintptr {
	if len(body) == 0 {
		return 0
	}
	at := uintptr(unsafe.Pointer(&body[0]))
	if at != q.last {
		q.pinned.Pin(&body[0])
		q.last = at
	}
	return at
}

// release ends what the last take or receive lent. q.mu must be held.
func (q *resultQueue) release() {
	q.pinned.Unpin()
	q.last = 0
}

// lendAgain releases what the last take or receive lent, unless body is the one pinned last: a
// receive that lends it again keeps it pinned (and what was lent with it, a little longer). q.mu
// must be held.
func (q *resultQueue) lendAgain(body []byte) uintptr {
	if len(body) == 0 || uintptr(unsafe.Pointer(&body[0])) != q.last {
		q.release()
	}
	return q.lend(body)
}

// textBlock returns a C block of at least n bytes for texts, reusing the last one. q.mu must be
// held.
func (q *resultQueue) textBlock(n int) []byte {
	if n > q.size {
		C.free(q.block)
		q.size = max(n, 2*q.size, 256)
		q.block = C.malloc(C.size_t(q.size))
	}
	return unsafe.Slice((*byte)(q.block), q.size)
}

// take moves up to len(results) results into results and returns how many. The results of the
// take before are kept for good now: their ops are forgotten. It reads only the results it hands
// over, texts included: a fan-out leaves thousands queued, and a take is a window of them.
func (q *resultQueue) take(results []resultSlot) int {
	q.mu.Lock()
	q.release()
	before := q.lent
	kept := before[:0] // in place: only this take still holds before's array
	for _, o := range before {
		if o.kept() {
			kept = append(kept, o)
		}
	}
	q.lent, q.spareLent, q.nextLent = q.spareLent[:0], nil, 0
	texts := q.texts[:0] // the results that carry a text, which goes into the C block below
	filled, used, textBytes := 0, 0, 0
	for _, r := range q.items {
		if filled == len(results) {
			break
		}
		used++
		if r.op != nil {
			if !r.op.taken() {
				continue // withdrawn while it waited here: it takes no slot
			}
			q.lent = append(q.lent, r.op)
		}
		if r.text != "" {
			texts = append(texts, slotText{filled, r.text})
			textBytes += len(r.text) + 1
		}
		results[filled] = resultSlot{C.cn_op(r.id), uintptr(r.closure), r.status, 0, q.lend(r.body), C.size_t(len(r.body)), r.rearm}
		filled++
	}
	if textBytes > 0 {
		block, at := q.textBlock(textBytes), 0
		for _, t := range texts {
			k := copy(block[at:], t.text)
			block[at+k] = 0
			results[t.slot].text = uintptr(unsafe.Pointer(&block[at]))
			at += k + 1
		}
	}
	clear(texts)
	q.texts = texts[:0]
	clear(q.items[:used])
	q.items = q.items[used:]
	if len(q.items) == 0 && cap(q.array) > keptResults {
		q.items, q.array = nil, nil // let a burst's large array go
	}
	q.mu.Unlock()
	for _, o := range kept {
		o.unregister()
	}
	clear(before)
	q.mu.Lock()
	if q.spareLent == nil && !q.freed {
		q.spareLent = before[:0] // the next take's lent, with no allocation
	}
	q.mu.Unlock()
	return filled
}

// lentLookahead is how many ops of the last take lentOp reads, from where it looks first.
const lentLookahead = 4

// lentOp is op id when the last take handed its result over and it is near where the last
// start-over was found; nil otherwise (look in the client's ops). Hosts start receives over in
// the order the take handed their messages over, and then each finds its op at once: the client's
// map of its pending ops, thousands with a large group, cost a cache miss or more per lookup.
func (q *resultQueue) lentOp(id C.cn_op) *op {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := q.nextLent; i < min(q.nextLent+lentLookahead, len(q.lent)); i++ {
		if o := q.lent[i]; o.id == uint64(id) {
			q.nextLent = i + 1
			return o
		}
	}
	return nil
}

// free ends q: later results are dropped, and the ops of the last take are forgotten. It
// returns the results nobody took.
func (q *resultQueue) free() []outcome {
	q.mu.Lock()
	q.freed = true
	left, lent := q.items, q.lent[:0]
	for _, o := range q.lent {
		if o.kept() { // one that receives again is withdrawn with the pending ones
			lent = append(lent, o)
		}
	}
	q.items, q.array, q.lent, q.spareLent, q.nextLent = nil, nil, nil, nil, 0
	q.release()
	C.free(q.block)
	q.block, q.size = nil, 0
	q.mu.Unlock()
	for _, o := range lent {
		o.unregister()
	}
	return left
}

func lookupQueue(h C.cn_queue) (*resultQueue, error) {
	if q := queues.get(uint64(h)); q != nil {
		return q, nil
	}
	return nil, errInvalidQueue
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
	queues.put(q.id, q)
	*out = C.cn_queue(q.id)
	return C.CN_OK
}

//export cngo_queue_take
func cngo_queue_take(qh C.cn_queue, results *C.cn_result, capacity C.size_t, count *C.size_t) (st C.cn_status) {
	defer recoverStatus(&st)
	if count == nil || (results == nil && capacity > 0) {
		return fail(argError("results (unless capacity is 0) and count must not be NULL"))
	}
	*count = 0
	q, err := lookupQueue(qh)
	if err != nil {
		return fail(err)
	}
	if capacity == 0 {
		return C.CN_OK
	}
	*count = C.size_t(q.take(unsafe.Slice((*resultSlot)(unsafe.Pointer(results)), int(min(capacity, 1<<20)))))
	return C.CN_OK
}

//export cngo_queue_free
func cngo_queue_free(qh C.cn_queue) (st C.cn_status) {
	defer recoverStatus(&st)
	q, err := lookupQueue(qh)
	if err != nil {
		return fail(err)
	}
	queues.remove(q.id)
	for _, r := range q.free() {
		if r.op != nil {
			r.op.unregister()
			r.op.giveUp() // a receive's message goes back to its mailbox
		}
	}
	// Pending operations that would report here are withdrawn; connects are abandoned.
	for _, c := range clients.all() {
		c.mu.Lock()
		var mine []*op
		for _, o := range c.ops {
			if o.q == q {
				mine = append(mine, o)
			}
		}
		abandon := c.connectQ == q && c.layer == nil && !c.closing
		if abandon {
			c.closing = true
		}
		c.mu.Unlock()
		for _, o := range mine {
			o.withdraw()
		}
		if abandon {
			go c.close()
		}
	}
	return C.CN_OK
}
