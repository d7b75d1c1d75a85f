package main

import (
	"maps"
	"sync"
	"sync/atomic"
)

// handleTable maps handles to the live objects they name. Every call looks a handle up, and
// handles come and go rarely (a client per connect, a queue per event loop): a lookup reads a
// map that nobody writes once it is published, and adding or removing a handle publishes a copy.
type handleTable[T any] struct {
	mu      sync.Mutex // serializes the copies
	current atomic.Pointer[map[uint64]*T]
}

// get returns the object of handle id, or nil.
func (t *handleTable[T]) get(id uint64) *T {
	if m := t.current.Load(); m != nil {
		return (*m)[id]
	}
	return nil
}

func (t *handleTable[T]) put(id uint64, v *T) {
	t.update(func(m map[uint64]*T) { m[id] = v })
}

func (t *handleTable[T]) remove(id uint64) {
	t.update(func(m map[uint64]*T) { delete(m, id) })
}

// all returns the objects at the time of the call.
func (t *handleTable[T]) all() []*T {
	m := t.current.Load()
	if m == nil {
		return nil
	}
	out := make([]*T, 0, len(*m))
	for _, v := range *m {
		out = append(out, v)
	}
	return out
}

func (t *handleTable[T]) update(change func(map[uint64]*T)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var next map[uint64]*T
	if m := t.current.Load(); m != nil {
		next = maps.Clone(*m)
	} else {
		next = map[uint64]*T{}
	}
	change(next)
	t.current.Store(&next)
}
