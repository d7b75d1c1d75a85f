package layer

import "time"

// entry is one message waiting in a mailbox, stamped when it reached this process (S4).
type entry struct {
	at   time.Time
	body []byte
}

// waiter is one pending receive, or a stream (StartStream). deliver is called outside the layer
// lock, once per message up to credit, or once with the error that ended it, unless it is
// stopped first.
type waiter struct {
	mb      *mailbox
	deliver func(Message, error)
	credit  int  // messages it still takes: 1 for a receive, up to the stream's credit for a stream
	listed  bool // still in mb.waiters; false once its credit is used, an error was handed over, or stopped
}

// mailbox buffers the messages of one channel name in this process (S2, S4, S5).
// Every field is guarded by Layer.mu.
type mailbox struct {
	name     string
	plain    bool // a plain channel (no "!"): it owns a queue subscription
	capacity int

	entries []entry // arrival order; the front is the oldest
	waiters []*waiter

	groups      int // how many groups it belongs to
	subscribing int // receives and group_adds still waiting for their subscription

	activeAt   time.Time // last arrival, or when the last reader left (idle reclaim, S5)
	readAt     time.Time // last time a reader waited or got a message (group expiry, S18)
	dropping   bool      // in a spell of capacity drops ("has room again" is due at its end)
	lingering  bool      // a release after ReleaseLinger is scheduled (S6)
	releaseAt  time.Time // when that release may happen: ReleaseLinger after the last reader left
	discharged bool      // removed from the layer; put-backs must go elsewhere
}

func newMailbox(name string, capacity int, now time.Time) *mailbox {
	return &mailbox{name: name, plain: !IsProcessChannel(name), capacity: capacity, activeAt: now, readAt: now}
}

// idle reports whether nothing holds the mailbox: no reader, no group, no subscribe in flight.
func (mb *mailbox) idle() bool {
	return len(mb.waiters) == 0 && mb.groups == 0 && mb.subscribing == 0
}

// dropExpired removes expired entries from the front and returns how many it removed.
func (mb *mailbox) dropExpired(now time.Time, expiry time.Duration) int {
	n := 0
	for n < len(mb.entries) && now.Sub(mb.entries[n].at) > expiry {
		n++
	}
	if n > 0 {
		clear(mb.entries[:n]) // let the bodies be collected
		mb.entries = mb.entries[n:]
	}
	return n
}

// pop removes and returns the oldest entry that has not expired; expired is how many expired
// entries it skipped on the way.
func (mb *mailbox) pop(now time.Time, expiry time.Duration) (e entry, ok bool, expired int) {
	expired = mb.dropExpired(now, expiry)
	if len(mb.entries) == 0 {
		return entry{}, false, expired
	}
	e = mb.entries[0]
	mb.entries[0] = entry{}
	mb.entries = mb.entries[1:]
	return e, true, expired
}

// insert puts an entry that was handed to a receiver that is gone back at position i (S14).
func (mb *mailbox) insert(i int, e entry) {
	mb.entries = append(mb.entries, entry{})
	copy(mb.entries[i+1:], mb.entries[i:])
	mb.entries[i] = e
}

// takeWaiter returns the longest-waiting receiver for one message, or nil. It is removed, unless
// it is a stream with credit left: that stays first in line.
func (mb *mailbox) takeWaiter() *waiter {
	if len(mb.waiters) == 0 {
		return nil
	}
	w := mb.waiters[0]
	w.credit--
	if w.credit > 0 {
		return w
	}
	mb.waiters[0] = nil
	mb.waiters = mb.waiters[1:]
	w.listed = false
	return w
}

// endWaiters removes and returns every waiter (the layer closes).
func (mb *mailbox) endWaiters() []*waiter {
	ended := mb.waiters
	for _, w := range ended {
		w.listed, w.credit = false, 0
	}
	mb.waiters = nil
	return ended
}

// removeWaiter unlists w and returns the credit it had left: 0 when it was no longer listed.
func (mb *mailbox) removeWaiter(w *waiter) int {
	if !w.listed {
		return 0
	}
	for i, x := range mb.waiters {
		if x == w {
			mb.waiters = append(mb.waiters[:i], mb.waiters[i+1:]...)
			break
		}
	}
	credit := w.credit
	w.listed, w.credit = false, 0
	return credit
}
