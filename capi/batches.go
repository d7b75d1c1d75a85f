package main

/*
#include "bridge.h"
*/
import "C"

import (
	"sync"
	"unsafe"
)

// outcome is the result of one pending operation, waiting to be delivered in a batch.
type outcome struct {
	closure C.uintptr_t
	status  C.cn_status
	text    string
	data    []byte
}

// batcher delivers a client's results through its batch callback: a goroutine takes every
// result that is ready and hands them over in one call, so a host pays for entering its runtime
// (a Python thread taking the GIL) once per batch instead of once per message.
type batcher struct {
	cb      C.cn_batch_callback
	closure C.uintptr_t

	mu      sync.Mutex
	queued  []outcome
	wake    chan struct{}
	stopped chan struct{}
	done    chan struct{}
}

func newBatcher(cb C.cn_batch_callback, closure C.uintptr_t) *batcher {
	b := &batcher{cb: cb, closure: closure, wake: make(chan struct{}, 1),
		stopped: make(chan struct{}), done: make(chan struct{})}
	go b.run()
	return b
}

func (b *batcher) add(r outcome) {
	b.mu.Lock()
	b.queued = append(b.queued, r)
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// detach delivers what is queued and waits until the goroutine has ended.
func (b *batcher) detach() {
	close(b.stopped)
	<-b.done
}

func (b *batcher) run() {
	defer close(b.done)
	for {
		select {
		case <-b.wake:
			b.deliver()
		case <-b.stopped:
			b.deliver()
			return
		}
	}
}

// deliver hands every queued result to the host in one call. The results and their texts and
// bodies live in C memory for the duration of the call.
func (b *batcher) deliver() {
	b.mu.Lock()
	batch := b.queued
	b.queued = nil
	b.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	results := unsafe.Slice((*C.cn_result)(C.calloc(C.size_t(len(batch)), C.sizeof_cn_result)), len(batch))
	defer C.free(unsafe.Pointer(&results[0]))
	defer C.free(packResults(batch, results))
	C.bridge_invoke_batch(b.cb, b.closure, &results[0], C.size_t(len(batch)))
}

// packResults fills results (as long as batch) and returns the malloc'ed block their texts and
// bodies point into; the caller frees it after the results were used.
func packResults(batch []outcome, results []C.cn_result) unsafe.Pointer {
	size := 0
	for _, r := range batch {
		size += len(r.data) + len(r.text) + 1
	}
	block := C.malloc(C.size_t(size + 1))
	store := unsafe.Slice((*byte)(block), size+1)
	at := 0
	for i, r := range batch {
		results[i] = C.cn_result{status: r.status}
		C.bridge_set_closure(&results[i], r.closure)
		if r.text != "" {
			n := copy(store[at:], r.text)
			store[at+n] = 0
			results[i].text = (*C.char)(unsafe.Pointer(&store[at]))
			at += n + 1
		}
		if r.data != nil {
			n := copy(store[at:], r.data)
			results[i].data = (*C.uint8_t)(unsafe.Pointer(&store[at]))
			results[i].len = C.size_t(n)
			at += n
		}
	}
	return block
}
