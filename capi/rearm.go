package main

/*
#include <stdlib.h>
*/
import "C"

import (
	"sync"
	"sync/atomic"
	"unsafe"
)

// The words a host starts its receives over with (cn_result.rearm, layer.Rearm): each receive
// that waits has one while it lives. They are in C memory, where the host may write them after
// the call that lent them returned; Go memory it could only write while pinned. A word is given
// to a receive whose key is its op handle, and handles are never reused: a host that writes a
// word it should have forgotten (a word goes to another receive once its own has ended) cannot
// match that receive's key, so it changes nothing.
var rearmWords wordPool

// wordsPerBlock is how many words one C allocation holds. Blocks are never freed: a word goes
// back to the pool, and the pool keeps as many as were ever in use at once.
const wordsPerBlock = 1024

type wordPool struct {
	mu   sync.Mutex
	free []*atomic.Uint64
}

// get returns a word that no receive uses, 0.
func (p *wordPool) get() *atomic.Uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 {
		mem := C.calloc(wordsPerBlock, 8) // 8-byte aligned, as atomic access needs
		if mem == nil {
			panic("channels_nats: out of memory for receive words")
		}
		block := unsafe.Slice((*atomic.Uint64)(mem), wordsPerBlock)
		for i := range block {
			p.free = append(p.free, &block[i])
		}
	}
	w := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	return w
}

// put gives back the word of a receive that ended: the layer no longer reads or writes it.
func (p *wordPool) put(w *atomic.Uint64) {
	w.Store(0)
	p.mu.Lock()
	p.free = append(p.free, w)
	p.mu.Unlock()
}
