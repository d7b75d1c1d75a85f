package layer

import (
	"runtime"
	"sync/atomic"
)

// A receive that its host starts over without calling the layer.
//
// A consumer that receives in a loop starts a receive over after each message (ReceiveAgain).
// That call takes the layer lock and lists the receive in its mailbox again, for every message of
// every consumer, between two steps of the host's tasks. A Receipt given a word (ShareWord)
// avoids it: after a delivery its receive stays listed in its mailbox, parked, and the word holds
// the Receipt's key. The host starts the receive over with one compare-and-swap of the word, from
// key to ^key (Rearm), where no lock and no call is needed, and the layer reads the word when a
// message comes:
//
//   - armed (^key): the message goes to the receive, which parks again once it is delivered;
//   - parked (key): nobody waits, so the layer revokes the park (the word becomes 0) and the
//     message goes to the mailbox; the host's Rearm then fails, and it starts the receive over
//     with ReceiveAgain, which finds the message.
//
// So a parked receive never waits while a message waits in its mailbox. The word is shared
// with the host only for the race between Rearm and a revoke; what the layer decides about the
// receive is in its Op's state. A party of the layer that changes a parked receive first moves
// its state to opSettling, then reads or swaps the word, then leaves the state final: two
// parties of the layer never work on the word at once, and the host's Rearm is the only other
// change to it. A word with another value than key or ^key is no longer this receive's (its
// host may reuse it): the layer never writes it, except handTo's park of a receive it delivers to.

// ShareWord makes r park after each message it is delivered, for its host to start over with
// Rearm(word, key). key is not 0 and below 1<<63. Call it before r is first handed to
// StartReceiveInto; word must stay valid until r has ended (Settle reports true, Cancel or Close
// ended it, or Retract gave its message back).
func (r *Receipt) ShareWord(word *atomic.Uint64, key uint64) {
	r.w.word, r.w.key = word, key
}

// Rearm starts a parked receive over: true when it waits again, for the next message of its
// mailbox, under the same Op; false when it cannot (a message came meanwhile, or the receive
// ended): then ReceiveAgain starts it over, or a receive by name. word and key are what its
// Receipt was given with ShareWord. It takes no lock and never waits.
func Rearm(word *atomic.Uint64, key uint64) bool { return word.CompareAndSwap(key, ^key) }

// Settle ends r's park when its host did not start it over: true when r no longer waits (it was
// parked, or had ended), false when it waits (its host armed it, or a message is on its way to
// it). A host calls it once it will not call Rearm for r's last message any more. It takes no lock.
func (r *Receipt) Settle() bool {
	w := &r.w
	if !r.holdParked() {
		s := r.state.Load()
		return s == opDone || s == opCancelled // else pending, or a message is on its way to it
	}
	if w.revoke() {
		r.state.Store(opDone) // still listed: the mailbox drops it when it next looks
		return true
	}
	r.state.Store(opParked) // armed: it waits
	return false
}

// holdParked moves a parked o to opSettling, for its caller to read or swap the word and then
// store o's next state; false when o is not parked. Another party of the layer that holds it
// meanwhile is waited for: it does so for a few instructions, and takes no lock while it does.
func (o *Op) holdParked() bool {
	for {
		switch o.state.Load() {
		case opParked:
			if o.state.CompareAndSwap(opParked, opSettling) {
				return true
			}
		case opSettling:
			runtime.Gosched()
		default:
			return false
		}
	}
}

// revoke ends a park that the host did not arm: false when the word is not w's key (armed, or
// no longer w's). Only with w's state held (holdParked).
func (w *waiter) revoke() bool { return w.word.CompareAndSwap(w.key, 0) }

// takeArmed takes a park that the host armed: false when the word is not ^key. Only with w's
// state held (holdParked).
func (w *waiter) takeArmed() bool { return w.word.CompareAndSwap(^w.key, 0) }

// Delivering reports whether a message is on its way to r: its result comes soon.
func (r *Receipt) Delivering() bool {
	s := r.state.Load()
	return s == opHanding || s == opHandingLast
}

// waits reports whether w is a receive that waits for a message: pending, or armed by its host.
// Being given one, parked and unarmed, or ended, it does not.
func (w *waiter) waits() bool {
	switch w.op.state.Load() {
	case opPending, opSettling:
		return true
	case opParked:
		return w.word.Load() == ^w.key
	}
	return false
}

// ended reports whether w's receive has ended: a listed w is only left for the mailbox to drop.
func (w *waiter) ended() bool {
	s := w.op.state.Load()
	return s == opDone || s == opCancelled
}

// parks reports whether w parks after a delivery: its host shared a word, and it waits as its
// Op's receive (a first receive of a plain channel, listed once its subscription was confirmed,
// does not: its Op has no receive to find it by, and it ends as any receive does).
func (w *waiter) parks() bool { return w.word != nil && w.op != nil && w.op.recv == w }

// resting reports whether w is listed between two receives: given a message, or parked and not
// started over yet.
func (w *waiter) resting() bool {
	if !w.parks() {
		return false
	}
	switch w.op.state.Load() {
	case opHanding, opHandingLast:
		return true
	case opParked:
		return w.word.Load() == w.key
	}
	return false
}

// unpark ends w's park, armed or not: true when it was parked (it is done now, still listed),
// false when it was not. Only the layer's parties call it, never for a receive being delivered to.
func (w *waiter) unpark() bool {
	if !w.op.holdParked() {
		return false
	}
	if !w.revoke() {
		w.takeArmed()
	}
	w.op.state.Store(opDone)
	return true
}

// claim is what takeWaiter does with w, a listed receive with a word. l.mu must be held.
type claim int

const (
	claimed claim = iota // it takes the message
	passed               // it stays listed but takes nothing now (a message is on its way to it)
	gone                 // it is no longer waiting: unlist it
)

// claimFor decides whether w takes an arriving message: a pending or armed receive does (its
// state becomes opHanding), a parked one that was not armed has its park revoked. l.mu must be held.
func (w *waiter) claimFor() claim {
	for {
		switch w.op.state.Load() {
		case opPending:
			if w.op.state.CompareAndSwap(opPending, opHanding) {
				return claimed
			}
		case opParked:
			if !w.op.holdParked() {
				continue
			}
			if w.takeArmed() {
				w.op.state.Store(opHanding)
				return claimed
			}
			w.revoke()               // its host comes to the layer and finds the message
			w.op.state.Store(opDone) // (or the word holds another value: it is not this receive's)
			return gone
		case opHanding:
			// A second message while the first is on its way: it goes elsewhere, and the
			// receive must not park, since its mailbox may now hold a message.
			if w.op.state.CompareAndSwap(opHanding, opHandingLast) {
				return passed
			}
		case opHandingLast:
			return passed
		case opSettling:
			runtime.Gosched()
		default:
			return gone
		}
	}
}

// park leaves w listed after handTo delivered it msg, for its host to start over with Rearm;
// unless a message reached its mailbox meanwhile (opHandingLast): then it is done.
func (w *waiter) park() {
	w.word.Store(w.key) // nobody else reads it while the state says a message is on its way
	if !w.op.state.CompareAndSwap(opHanding, opParked) {
		w.word.Store(0)
		w.op.state.Store(opDone)
	}
}

// settleParked unlists the receives of mb that ended, and revokes the parks that were not armed:
// a parked receive whose host did not start it over does not hold its mailbox (S5, S18). l.mu
// must be held.
func (mb *mailbox) settleParked() {
	kept := mb.waiters[:0]
	for _, w := range mb.waiters {
		if w.parks() && w.op.holdParked() {
			if w.revoke() {
				w.op.state.Store(opDone)
			} else {
				w.op.state.Store(opParked) // armed: it waits
			}
		}
		if w.parks() && w.ended() {
			w.listed = false
			continue
		}
		kept = append(kept, w)
	}
	clear(mb.waiters[len(kept):])
	mb.waiters = kept
}

// waitedOn reports whether a receive waits in mb. l.mu must be held.
func (mb *mailbox) waitedOn() bool {
	for _, w := range mb.waiters {
		if !w.parks() || w.waits() {
			return true
		}
	}
	return false
}

// endParked prepares w, which Close unlisted, for the end of its receive: one its host armed
// gets ErrClosed like a pending one, and a park that was not armed is revoked.
func (w *waiter) endParked() {
	if !w.parks() || !w.op.holdParked() {
		return
	}
	if w.takeArmed() {
		w.op.state.Store(opPending) // armed: it was waiting
		return
	}
	w.revoke()
	w.op.state.Store(opDone)
}

// cancelArmed withdraws w when its host armed it: true when it did. false when w was parked
// and not armed (its last message is still the host's to keep or give back), or not parked.
func (w *waiter) cancelArmed() bool {
	if !w.op.holdParked() {
		return false
	}
	if !w.takeArmed() {
		w.op.state.Store(opParked)
		return false
	}
	w.op.state.Store(opCancelled)
	w.unlist()
	return true
}
