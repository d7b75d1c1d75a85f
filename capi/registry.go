package main

/*
#include "bridge.h"
*/
import "C"

import (
	"context"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/channels-nats/channels-nats/layer"
)

// Handles of clients and operations come from one counter, so no handle is ever reused and
// one kind of handle is never taken for the other.
var (
	lastHandle atomic.Uint64
	clients    sync.Map // uint64 -> *client, while open
	issued     sync.Map // uint64 -> struct{}: every client handle ever issued, to tell closed from unknown
)

func nextHandle() uint64 { return lastHandle.Add(1) }

// client is one cn_client: a layer.Layer once connected, its pending operations and its log sink.
type client struct {
	id         uint64
	log        C.cn_log_callback
	logClosure C.uintptr_t
	silenced   atomic.Bool // set when close finished: no log record may reach the host after

	mu         sync.Mutex
	layer      *layer.Layer       // nil while connecting
	connecting context.CancelFunc // cancels a connect in progress
	closing    bool
	ops        map[uint64]pendingOp

	running sync.WaitGroup // goroutines that may still call back: connect and pending operations

	results resultSink // set by cn_set_batch_callback or cn_set_result_queue
}

// lookup finds a client by handle.
func lookup(h C.cn_client) (*client, error) {
	id := uint64(h)
	if v, ok := clients.Load(id); ok {
		return v.(*client), nil
	}
	if _, ok := issued.Load(id); ok {
		return nil, layer.ErrClosed
	}
	return nil, errInvalidHandle
}

// connected returns the client's layer, or why it cannot be used now.
func (c *client) connected() (*layer.Layer, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closing:
		return nil, layer.ErrClosed
	case c.layer == nil:
		return nil, errConnecting
	}
	return c.layer, nil
}

// logRecord passes a layer log record to the host's log callback.
func (c *client) logRecord(level layer.Level, message string) {
	if c.log == nil || c.silenced.Load() {
		return
	}
	text := C.CString(message)
	defer C.free(unsafe.Pointer(text))
	C.bridge_invoke_log(c.log, c.logClosure, C.int(level), text)
}

// deliveries brackets a burst of results of one arrived message (layer.Config.Deliveries): a
// result queue signals its host once for the burst. c.results is set before the first pending
// operation exists, so before any delivery.
func (c *client) deliveries(begin bool) {
	q, ok := c.results.(*resultQueue)
	switch {
	case !ok:
	case begin:
		q.hold()
	default:
		q.release()
	}
}

// pendingOp is what cn_cancel and close find in a client: an op or a stream.
type pendingOp interface {
	withdraw() bool     // cn_cancel: true when its callback will not run (again)
	end(err error) bool // close: its last result, unless it had ended
}

// findOp returns the pending operation or stream of client h that id names, nil when it has
// finished; errInvalidHandle for op 0 or a handle this library never issued.
func findOp(h C.cn_client, id C.cn_op) (pendingOp, error) {
	c, err := lookup(h)
	if err != nil {
		return nil, err
	}
	if id == 0 || uint64(id) > lastHandle.Load() {
		return nil, errInvalidHandle
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ops[uint64(id)], nil
}

// op is a pending operation: its callback runs exactly once unless it is withdrawn first.
type op struct {
	id      uint64
	c       *client
	cb      C.cn_callback
	closure C.uintptr_t
	state   atomic.Int32

	mu      sync.Mutex
	cancel  context.CancelFunc    // set by run: ends the wait of the goroutine working for it
	receive *layer.PendingReceive // a receive waiting in its mailbox
}

const (
	opPending int32 = iota
	opFinished
	opWithdrawn
)

// newOp makes an operation that is not registered yet: a call that may finish at once pays for
// registering only when it does not.
func (c *client) newOp(cb C.cn_callback, closure C.uintptr_t) *op {
	return &op{id: nextHandle(), c: c, cb: cb, closure: closure}
}

// register makes o known to cn_cancel and close; it fails once the client is closing. An
// operation that finished before it was registered (its result raced the registration) is not
// kept: finish deletes after its state changed, register inserts only while it has not.
func (c *client) register(o *op) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return layer.ErrClosed
	}
	if o.state.Load() == opPending {
		c.ops[o.id] = o
	}
	return nil
}

// start registers a new pending operation.
func (c *client) start(cb C.cn_callback, closure C.uintptr_t) (*op, error) {
	o := c.newOp(cb, closure)
	return o, c.register(o)
}

// unregister forgets o in its client and ends the wait of a goroutine working for it.
func (o *op) unregister() {
	o.mu.Lock()
	cancel := o.cancel
	o.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	o.c.mu.Lock()
	delete(o.c.ops, o.id)
	o.c.mu.Unlock()
}

// finish reports the result through the callback, unless the operation was withdrawn; it
// reports whether the callback ran.
func (o *op) finish(err error, text string, data []byte) bool {
	st := statusOf(err)
	if err != nil {
		text = errorText(err)
	}
	if o.c.results != nil {
		// Under o.mu, so that a cancel that finds the operation finished (CN_NOT_PENDING) also
		// finds its result already in the sink: a host may take it right after.
		o.mu.Lock()
		finished := o.state.CompareAndSwap(opPending, opFinished)
		if finished {
			o.c.emit(o.cb, o.closure, st, text, data)
		}
		o.mu.Unlock()
		if finished {
			o.unregister()
		}
		return finished
	}
	if !o.state.CompareAndSwap(opPending, opFinished) {
		return false
	}
	o.unregister()
	o.c.emit(o.cb, o.closure, st, text, data)
	return true
}

// end finishes o with err (close).
func (o *op) end(err error) bool { return o.finish(err, "", nil) }

// emit hands one result to the client's result sink, or calls cb with it on this goroutine.
func (c *client) emit(cb C.cn_callback, closure C.uintptr_t, st C.cn_status, text string, data []byte) {
	if sink := c.results; sink != nil {
		sink.add(outcome{closure: closure, status: st, text: text, data: data})
		return
	}
	var ctext *C.char
	if text != "" {
		ctext = C.CString(text)
		defer C.free(unsafe.Pointer(ctext))
	}
	var cdata *C.uint8_t
	if len(data) > 0 {
		// Go memory without pointers may be lent to C for the duration of the call.
		cdata = (*C.uint8_t)(unsafe.Pointer(&data[0]))
	}
	C.bridge_invoke(cb, closure, st, ctext, cdata, C.size_t(len(data)))
}

// withdraw cancels a pending operation: true when its callback will not run.
func (o *op) withdraw() bool {
	o.mu.Lock()
	withdrawn := o.state.CompareAndSwap(opPending, opWithdrawn)
	pr := o.receive
	o.mu.Unlock()
	if !withdrawn {
		return false
	}
	o.unregister()
	if pr != nil {
		pr.Cancel() // false: the message is on its way to deliver(), which puts it back
	}
	return true
}

// deliver is the layer's callback for a waiting receive.
func (o *op) deliver(l *layer.Layer) func(layer.Message, error) {
	return func(m layer.Message, err error) {
		if !o.finish(err, "", m.Body) && err == nil {
			l.PutBack(m) // withdrawn while the message was handed over: nothing is lost (S14)
		}
	}
}

// waitFor attaches a receive that is now waiting in its mailbox, or withdraws it again when the
// operation was cancelled meanwhile.
func (o *op) waitFor(pr *layer.PendingReceive) {
	o.mu.Lock()
	o.receive = pr
	o.mu.Unlock()
	if o.state.Load() == opWithdrawn {
		pr.Cancel()
	}
}

// run runs f for o on a library goroutine that close waits for; f's context ends when o is
// withdrawn or finished.
func (o *op) run(f func(ctx context.Context)) {
	ctx, cancel := context.WithCancel(context.Background())
	o.mu.Lock()
	o.cancel = cancel
	o.mu.Unlock()
	if o.state.Load() != opPending {
		cancel() // withdrawn meanwhile
	}
	o.c.running.Add(1)
	go func() {
		defer o.c.running.Done()
		defer recoverInGoroutine(o.c)
		f(ctx)
	}()
}

// close ends the client: every pending operation ends with CN_CLOSED, and when it returns no
// callback of the client runs any more.
func (c *client) close() {
	c.mu.Lock()
	l, abandon := c.layer, c.connecting
	c.mu.Unlock()
	if abandon != nil {
		abandon()
	}
	if l != nil {
		_ = l.Close() // waiting receives end with ErrClosed through their callbacks
	}
	c.mu.Lock()
	left := make([]pendingOp, 0, len(c.ops))
	for _, o := range c.ops {
		left = append(left, o)
	}
	c.mu.Unlock()
	for _, o := range left {
		o.end(layer.ErrClosed)
	}
	c.running.Wait()
	if c.results != nil {
		c.results.detach() // a batcher delivers what is queued, then ends
	}
	c.silenced.Store(true)
	clients.Delete(c.id)
}
