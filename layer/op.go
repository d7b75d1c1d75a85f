package layer

import (
	"context"
	"sync/atomic"
)

// Op is an operation that could not finish during the call that started it: a receive waiting
// for a message, a send waiting for room in the outbound buffer, a new channel or a group_add
// waiting for the server to confirm a subscription. Its callback runs exactly once, later, on a
// library goroutine, unless Cancel returns true first.
//
// Every Start* method returns a nil *Op when the operation finished during the call.
type Op struct {
	state atomic.Int32
	// withdraw undoes what the operation had begun; Cancel calls it once, after it won. It is
	// set before the Op is returned and never changes.
	withdraw func()
	// undo takes back what the finished operation did (see Retract); set when it finishes.
	undo atomic.Pointer[func()]
	// recv is the receive that waits in a mailbox when the Op is a Receipt's (most are): Cancel
	// and Retract work on it directly, with no closure to allocate.
	recv *waiter
}

const (
	opPending int32 = iota
	opDone
	opCancelled
	// The states of a receive whose Receipt has a word (rearm.go):
	opHanding     // takeWaiter gave it a message, which handTo delivers
	opHandingLast // the same, and another message went elsewhere meanwhile: it will not park
	opParked      // delivered and still listed: its host may arm it (Rearm)
	opSettling    // a party of the layer reads or swaps its word for a moment
)

// Cancel withdraws the operation. True means it was still pending: its callback never runs,
// and whatever it had begun is undone (a receive loses no message, a group_add leaves no
// membership, a send is not sent). False means the callback runs or ran.
func (o *Op) Cancel() bool {
	if !o.state.CompareAndSwap(opPending, opCancelled) {
		if w := o.recv; w != nil && w.parks() {
			return w.cancelArmed() // a parked receive its host started over waits too
		}
		return false
	}
	switch {
	case o.recv != nil:
		o.recv.unlist()
	case o.withdraw != nil:
		o.withdraw()
	}
	return true
}

// Retract takes back an operation that finished but whose result its caller will never see (a
// host's consumer was cancelled after the callback ran): a received message goes back to the
// front of its mailbox, keeping its arrival time, and a membership the group_add made is removed.
// A send, once accepted, and a new channel have nothing to take back. Only the first call acts.
func (o *Op) Retract() {
	if undo := o.undo.Swap(nil); undo != nil {
		(*undo)()
		return
	}
	w := o.recv
	if w == nil {
		return
	}
	if w.parks() && w.mb != nil {
		w.unpark() // parked or done, it leaves its mailbox before its message goes back there
		w.unlist()
	}
	if w.handed.CompareAndSwap(true, false) {
		w.l.giveBack(w.msg)
	}
}

// finish claims the right to run the callback; false once the operation was cancelled.
func (o *Op) finish() bool { return o.state.CompareAndSwap(opPending, opDone) }

// retractWith makes undo what Retract does; set before the callback runs.
func (o *Op) retractWith(undo func()) { o.undo.Store(&undo) }

// pending reports whether neither finish nor Cancel has won yet.
func (o *Op) pending() bool { return o.state.Load() == opPending }

// wait is how the blocking methods use a started operation: it returns the operation's result,
// or ctx.Err() once ctx ends and the operation could still be withdrawn. An operation that
// finished just as ctx ended has its result returned.
func wait[T any](ctx context.Context, op *Op, got <-chan T) (T, error) {
	select {
	case r := <-got:
		return r, nil
	case <-ctx.Done():
		if op.Cancel() {
			var zero T
			return zero, ctx.Err()
		}
		return <-got, nil
	}
}

// cancelled reports whether Cancel won.
func (o *Op) cancelled() bool { return o.state.Load() == opCancelled }
