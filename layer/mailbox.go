package layer

import (
	"sync/atomic"
	"time"
)

// entry is one message waiting in a mailbox, stamped when it reached this process (S4).
type entry struct {
	at   time.Time
	body []byte
}

// expired is the expiry rule (S4), for every message wherever it waits: a message that has
// waited expiry or longer since it reached this process is dropped.
func expired(at, now time.Time, expiry time.Duration) bool { return now.Sub(at) >= expiry }

// waiter is one pending receive. Its receiver is called outside the layer lock, once, with the
// message or with the error that ended the receive, unless its op was cancelled first.
type waiter struct {
	l      *Layer
	mb     *mailbox
	op     *Op
	to     Receiver
	listed bool        // still in mb.waiters
	msg    Message     // the message it was handed, for Retract
	handed atomic.Bool // msg was delivered and can still be given back
	// word and key, when its host shares a word with the layer (Receipt.ShareWord): it parks
	// after each delivery, listed, for the host to start over with Rearm (rearm.go).
	word *atomic.Uint64
	key  uint64
}

// Receipt is the layer's record of a receive that waits: its Op and its place in a mailbox. A
// host that keeps a record of its own for each waiting receive embeds a Receipt in it and hands
// it to StartReceiveInto, so that a receive that waits costs one allocation. The zero value is
// ready to use; a Receipt serves one receive.
type Receipt struct {
	Op
	w waiter
}

// unlist removes w from its mailbox (its receive was cancelled).
func (w *waiter) unlist() {
	l := w.l
	l.mu.Lock()
	if w.mb.removeWaiter(w) {
		l.readerLeft(w.mb, time.Now(), true)
	}
	l.mu.Unlock()
}

// mailbox holds the messages of one channel name in this process (S2, S4, S5): the only place a
// message waits between the connection and a consumer. Every field is guarded by Layer.mu.
type mailbox struct {
	name     string
	plain    bool // a plain channel (no "!"): it owns a queue subscription
	capacity int

	entries []entry // arrival order; the front is the oldest
	waiters []*waiter
	feed    *subscription // the subscription receives on this name need, once one was made

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
// A parked receive that its host did not start over is no reader: its park is revoked. l.mu must
// be held.
func (mb *mailbox) idle() bool {
	if mb.groups != 0 || mb.subscribing != 0 {
		return false
	}
	mb.settleParked()
	return len(mb.waiters) == 0
}

// dropExpired removes expired entries from the front and returns how many it removed.
func (mb *mailbox) dropExpired(now time.Time, expiry time.Duration) int {
	n := 0
	for n < len(mb.entries) && expired(mb.entries[n].at, now, expiry) {
		n++
	}
	if n > 0 {
		clear(mb.entries[:n]) // let the bodies be collected
		mb.entries = mb.entries[n:]
	}
	return n
}

// pop removes and returns the oldest entry that has not expired; dropped is how many expired
// entries it removed on the way.
func (mb *mailbox) pop(now time.Time, expiry time.Duration) (e entry, ok bool, dropped int) {
	dropped = mb.dropExpired(now, expiry)
	if len(mb.entries) == 0 {
		return entry{}, false, dropped
	}
	e = mb.entries[0]
	mb.entries[0] = entry{}
	mb.entries = mb.entries[1:]
	return e, true, dropped
}

// push appends an arrived message unless the mailbox is full after expired entries were
// reclaimed (S2). dropped is how many expired entries it reclaimed.
func (mb *mailbox) push(e entry, expiry time.Duration) (ok bool, dropped int) {
	if len(mb.entries) >= mb.capacity {
		dropped = mb.dropExpired(e.at, expiry)
	}
	if len(mb.entries) >= mb.capacity {
		return false, dropped
	}
	mb.entries = append(mb.entries, e)
	return true, dropped
}

// insert puts an entry that a receiver could not take back at position i (S14). A message
// that comes back is never refused for capacity: it was counted in the mailbox before.
func (mb *mailbox) insert(i int, e entry) {
	mb.entries = append(mb.entries, entry{})
	copy(mb.entries[i+1:], mb.entries[i:])
	mb.entries[i] = e
}

// takeWaiter returns the longest-waiting receive that takes an arriving message, or nil. A
// receive with a word stays listed, last (it parks once the message is delivered); the others
// are unlisted, as are the receives that were cancelled or ended. l.mu must be held.
func (mb *mailbox) takeWaiter() *waiter {
	for i := 0; i < len(mb.waiters); {
		w := mb.waiters[i]
		if w.parks() {
			switch w.claimFor() {
			case claimed:
				// It waits no more: it goes behind those that do, and waits again where it is
				// when its host starts it over (listWaiter).
				copy(mb.waiters[i:], mb.waiters[i+1:])
				mb.waiters[len(mb.waiters)-1] = w
				return w
			case passed:
				i++
				continue
			}
			mb.unlistAt(i)
			continue
		}
		mb.unlistAt(i)
		if w.op.pending() {
			return w
		}
	}
	return nil
}

// unlistAt removes mb.waiters[i]. l.mu must be held.
func (mb *mailbox) unlistAt(i int) {
	mb.waiters[i].listed = false
	if i == 0 && len(mb.waiters) > 1 {
		mb.waiters[0] = nil
		mb.waiters = mb.waiters[1:]
		return
	}
	copy(mb.waiters[i:], mb.waiters[i+1:])
	mb.waiters[len(mb.waiters)-1] = nil
	mb.waiters = mb.waiters[:len(mb.waiters)-1] // the last one gone: the next receive reuses the array
}

// endWaiters removes and returns every waiter (the layer closes).
func (mb *mailbox) endWaiters() []*waiter {
	ended := mb.waiters
	for _, w := range ended {
		w.listed = false
	}
	mb.waiters = nil
	return ended
}

// removeWaiter unlists w; false when it was no longer listed.
func (mb *mailbox) removeWaiter(w *waiter) bool {
	if !w.listed {
		return false
	}
	for i, x := range mb.waiters {
		if x == w {
			mb.unlistAt(i)
			break
		}
	}
	w.listed = false
	return true
}
