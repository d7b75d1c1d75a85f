package main

/*
#include "bridge.h"
*/
import "C"

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/channels-nats/channels-nats/layer"
)

// Handles of clients, operations and queues come from one counter, so no handle is ever reused
// and one kind of handle is never taken for another.
var (
	lastHandle atomic.Uint64
	clients    handleTable[client] // while open
	issued     sync.Map            // uint64 -> struct{}: every client handle ever issued, to tell closed from unknown
)

func nextHandle() uint64 { return lastHandle.Add(1) }

// client is one cn_client: a layer.Layer once connected, its pending operations and its log sink.
type client struct {
	id    uint64
	logs  logOutbox // its log records, on their way to the host's callback
	burst burst     // signals of its queues held back during a burst of deliveries

	live atomic.Pointer[layer.Layer] // the layer while it may be used: connected, not closing

	mu         sync.Mutex
	layer      *layer.Layer       // nil while connecting
	connecting context.CancelFunc // cancels a connect in progress
	connectQ   *resultQueue       // where the connect in progress reports
	closing    bool
	ops        map[uint64]*op // pending operations, for cn_cancel and cn_queue_free

	running sync.WaitGroup // the connect goroutine
}

// lookup finds a client by handle.
func lookup(h C.cn_client) (*client, error) {
	id := uint64(h)
	if c := clients.get(id); c != nil {
		return c, nil
	}
	if _, ok := issued.Load(id); ok {
		return nil, layer.ErrClosed
	}
	return nil, errInvalidClient
}

// usable finds a client that can be used now: connected, not closing.
func usable(h C.cn_client) (*client, *layer.Layer, error) {
	c, err := lookup(h)
	if err != nil {
		return nil, nil, err
	}
	if l := c.live.Load(); l != nil {
		return c, l, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closing:
		return nil, nil, layer.ErrClosed
	case c.layer == nil:
		return nil, nil, errConnecting
	}
	return c, c.layer, nil
}

// logRecord passes a layer log record on to the host's log callback, without waiting for it.
func (c *client) logRecord(level layer.Level, message string) { c.logs.add(level, message) }

// burst holds back the signals of result queues while the dispatcher delivers the results of one
// arrived message (layer.Config.Deliveries): a group message that finishes many receives wakes
// each host loop once, after the last of them. During cn_on_readable the host's own queue is not
// signalled at all: the host takes its results right after the call, on the same thread.
type burst struct {
	mu      sync.Mutex
	active  bool
	waiting []*resultQueue
	reader  *resultQueue // the queue of the host in cn_on_readable
}

// deliveries is the client's layer.Config.Deliveries.
func (c *client) deliveries(begin bool) {
	b := &c.burst
	b.mu.Lock()
	if begin {
		b.active = true
		b.mu.Unlock()
		return
	}
	b.active = false
	waiting, reader := b.waiting, b.reader
	b.waiting = nil
	b.mu.Unlock()
	for _, q := range waiting {
		if q != reader {
			q.signal()
		}
	}
}

// signal wakes q's host now, or at the end of the burst in progress.
func (c *client) signal(q *resultQueue) {
	b := &c.burst
	b.mu.Lock()
	if q == b.reader {
		b.mu.Unlock()
		return
	}
	if b.active {
		b.waiting = append(b.waiting, q)
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	q.signal()
}

// reading sets (or, with nil, clears) the queue of the host that reads the connection now.
func (c *client) reading(q *resultQueue) {
	c.burst.mu.Lock()
	c.burst.reader = q
	c.burst.mu.Unlock()
}

// op is a pending operation of a client: its result goes to queue q, unless it is withdrawn.
type op struct {
	id      uint64
	c       *client
	q       *resultQueue
	closure C.uintptr_t
	l       *layer.Layer
	sent    bool // a send: once accepted, it is not taken back
	// reusable is a receive's record in the layer, which a cn_receive with channel NULL starts
	// over; nil for the other operations.
	reusable *layer.Receipt
	// word is what the host starts reusable over with, without a call (cn_result.rearm); nil
	// for the other operations. It goes back to rearmWords when o is forgotten (wordBack,
	// guarded by c.mu).
	word     *atomic.Uint64
	wordBack bool

	mu       sync.Mutex
	lop      *layer.Op // set by register, once the call that began it returned
	state    opState
	claimed  bool // a withdraw runs or ran: later ones have nothing to do
	retract  bool // nobody will take its result: Retract it once lop is known
	received bool // its last result carried a message
}

type opState uint8

const (
	opRunning   opState = iota // the layer works on it
	opQueued                   // its result waits in q
	opTaken                    // the host took its result with q's last take: it may still retract it, or receive again
	opDone                     // the host kept its result (it took from q again)
	opWithdrawn                // cancelled or retracted
)

// opOf is c's pending operation id, or nil when it ended (or is another client's);
// errInvalidOp for a handle this library never issued.
func (c *client) opOf(id C.cn_op) (*op, error) {
	if id == 0 || uint64(id) > lastHandle.Load() {
		return nil, errInvalidOp
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ops[uint64(id)], nil
}

func (c *client) newOp(l *layer.Layer, q *resultQueue, closure C.uintptr_t) *op {
	return new(op).start(c, l, q, closure)
}

// start gives a zero o its handle and where its result goes, and returns it: for an op of its
// own (newOp) or one inside a receiveOp.
func (o *op) start(c *client, l *layer.Layer, q *resultQueue, closure C.uintptr_t) *op {
	o.id, o.c, o.q, o.closure, o.l = nextHandle(), c, q, closure, l
	return o
}

// register makes a pending o known to cn_cancel and cn_queue_free, unless its result was taken
// already (a host taking from its queue on another thread). Operations that finish during their
// call are never registered.
func (o *op) register(lop *layer.Op) {
	o.c.mu.Lock()
	o.mu.Lock()
	o.lop = lop
	if o.state == opRunning || o.state == opQueued {
		o.c.ops[o.id] = o
	}
	retract := o.retract
	o.retract = false
	o.mu.Unlock()
	o.c.mu.Unlock()
	if retract {
		lop.Retract()
	}
}

// unregister forgets o, which has ended: cn_cancel no longer finds it, and its word goes to
// another receive.
func (o *op) unregister() {
	o.c.mu.Lock()
	delete(o.c.ops, o.id)
	back := o.word != nil && !o.wordBack
	o.wordBack = true
	o.c.mu.Unlock()
	if back {
		rearmWords.put(o.word)
	}
}

// complete queues o's result. When nobody will take it (its queue was freed), what o did is
// retracted instead: a received message goes back to its mailbox.
func (o *op) complete(err error, text string, body []byte) {
	o.mu.Lock()
	if o.state == opWithdrawn {
		// A receive its host armed, withdrawn while its next message was on the way: the
		// withdraw waited until the layer had it (awaitResult) and gave it back.
		o.mu.Unlock()
		return
	}
	o.state = opQueued
	o.received = err == nil && body != nil
	o.mu.Unlock()
	var rearm uintptr
	if err == nil && body != nil && o.word != nil {
		rearm = uintptr(unsafe.Pointer(o.word))
	}
	if o.q.add(o.c, outcome{op: o, id: o.id, closure: o.closure, status: statusOf(err), text: resultText(err, text), body: body, rearm: rearm}) {
		return
	}
	o.unregister()
	o.giveUp()
}

// giveUp retracts o, whose result nobody will take, unless someone else already did. The call
// that began o may still be returning: then register retracts.
func (o *op) giveUp() {
	o.mu.Lock()
	if o.state != opQueued {
		o.mu.Unlock()
		return
	}
	o.state = opWithdrawn
	lop := o.lop
	o.retract = lop == nil
	o.mu.Unlock()
	if lop != nil {
		lop.Retract()
	}
}

// receiveOp is a pending receive: the op and the layer's record of it, in one allocation.
type receiveOp struct {
	op
	receipt layer.Receipt
}

// Received is the layer's callback for the receive.
func (r *receiveOp) Received(m layer.Message, err error) { r.complete(err, "", m.Body) }

// done is the layer's callback for o's pending send or group_add.
func (o *op) done(err error) { o.complete(err, "", nil) }

// named is the layer's callback for o's pending new_channel.
func (o *op) named(name string, err error) { o.complete(err, name, nil) }

// taken marks o's result as handed to the host; false when o was withdrawn (skip the result).
// q.mu is held by the caller.
func (o *op) taken() bool { return o.advance(opQueued, opTaken) }

// kept ends the time in which the host could retract o's result, or receive again with o; false
// when o received again meanwhile, by call or by its word (it goes on). q.mu is held by the caller.
func (o *op) kept() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.state != opTaken {
		return false
	}
	if o.reusable != nil && !o.reusable.Settle() {
		o.state = opRunning // its host armed it (Rearm): it waits under the same handle
		return false
	}
	o.state = opDone
	return true
}

// again starts o over: a receive whose result the host took with its queue's last take, or
// that received again since, waits for the next message of its channel (cn_receive with channel NULL).
// waits: it is pending again, and its next result comes under the same handle; otherwise msg
// was waiting, or err says why o cannot start over (layer.ErrNotAgain, layer.ErrClosed).
//
// o.mu is held throughout: a cn_cancel on another thread withdraws o before or after, never
// between the layer's decision and o's state, and the result of a receive that waits again is
// queued (complete) only after o is running.
func (o *op) again() (msg layer.Message, waits bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.reusable == nil || !o.received || o.claimed || o.state != opTaken {
		return layer.Message{}, false, layer.ErrNotAgain
	}
	msg, lop, err := o.l.ReceiveAgain(o.reusable)
	if lop == nil {
		return msg, false, err // o stays as the last take left it
	}
	o.state = opRunning
	return layer.Message{}, true, nil
}

func (o *op) advance(from, to opState) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.state != from {
		return false
	}
	o.state = to
	return true
}

// withdraw cancels o: true when its result will not be taken, or when the host took it with the
// queue's last take and gives it back. What a finished o did is then retracted (a received
// message goes back to its mailbox, a membership is removed).
func (o *op) withdraw() bool {
	o.mu.Lock()
	lop, first := o.lop, !o.claimed
	o.claimed = true
	o.mu.Unlock()
	if !first {
		return false
	}
	if lop.Cancel() {
		o.mu.Lock()
		o.state = opWithdrawn
		o.mu.Unlock()
		o.unregister()
		return true
	}
	o.awaitResult() // the layer won the race: its result is being queued
	if o.sent {
		return false // accepted, so sent: its result stays for the host to take
	}
	o.q.mu.Lock()
	o.mu.Lock()
	retract := o.state == opQueued || o.state == opTaken
	if retract {
		o.state = opWithdrawn
	}
	o.mu.Unlock()
	o.q.mu.Unlock()
	o.unregister()
	if retract {
		lop.Retract()
	}
	return retract
}

// awaitResult returns once the layer's callback has given o its result: right after the layer
// finished o, so the wait is short and rare (a cancel that lost the race). A receive its host
// armed (capi's state still says taken) may be getting its next message: that one, too.
func (o *op) awaitResult() {
	for {
		o.mu.Lock()
		running := o.state == opRunning
		o.mu.Unlock()
		if !running && (o.reusable == nil || !o.reusable.Delivering()) {
			return
		}
		runtime.Gosched()
	}
}

// close ends the client: pending operations end with CN_CLOSED results, and when it returns no
// result or log record of the client comes any more.
func (c *client) close() {
	c.mu.Lock()
	l, abandon := c.layer, c.connecting
	c.mu.Unlock()
	if abandon != nil {
		abandon()
	}
	c.running.Wait()
	c.mu.Lock()
	l = c.layer
	c.mu.Unlock()
	if l != nil {
		_ = l.Close() // pending operations report CN_CLOSED to their queues
	}
	c.logs.finish()
	clients.remove(c.id)
}
