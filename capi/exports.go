package main

/*
#cgo CFLAGS: -I${SRCDIR}/../include
#include <stdlib.h>
#include "bridge.h"
*/
import "C"

import (
	"context"
	"encoding/json"
	"errors"
	"runtime"
	"unsafe"

	"github.com/channels-nats/channels-nats/layer"
)

// The cngo_* functions implement the cn_* functions of include/channels_nats.h, whose comments
// are the contract; wrappers.c calls them after its fork check. Closures arrive as uintptr_t so
// that Go never holds a host pointer as a pointer.

//export cngo_connect
func cngo_connect(configJSON *C.char, log C.cn_log_callback, logClosure C.uintptr_t,
	qh C.cn_queue, closure C.uintptr_t, out *C.cn_client) (st C.cn_status) {
	defer recoverStatus(&st)
	if out == nil {
		return fail(argError("client must not be NULL"))
	}
	*out = 0
	q, err := lookupQueue(qh)
	if err != nil {
		return fail(err)
	}
	doc, err := goString(configJSON, "config_json", false)
	if err != nil {
		return fail(err)
	}
	if doc == "" {
		doc = "{}"
	}
	cfg, err := layer.ParseConfig([]byte(doc))
	if err == nil {
		cfg, err = cfg.WithDefaults()
	}
	if err != nil {
		return fail(configError{err})
	}
	c := &client{id: nextHandle(), ops: map[uint64]*op{}}
	c.logs.start(log, logClosure)
	if warning := stackBoundsWarning(mainThreadMaps); warning != "" {
		c.logs.add(layer.LevelWarning, warning)
	}
	cfg.Log = c.logRecord
	cfg.Deliveries = c.deliveries
	ctx, cancel := context.WithCancel(context.Background())
	c.connecting, c.connectQ = cancel, q
	issued.Store(c.id, struct{}{})
	clients.put(c.id, c)
	*out = C.cn_client(c.id)

	c.running.Add(1)
	go func() {
		defer c.running.Done()
		defer recoverInGoroutine(c)
		defer cancel()
		l, err := layer.Connect(ctx, cfg)
		failed := false
		c.mu.Lock()
		c.connecting, c.connectQ = nil, nil
		switch {
		case c.closing: // close abandoned this connect; it finishes the client
			if err == nil {
				_ = l.Close()
			}
			err = layer.ErrClosed
		case err != nil:
			clients.remove(c.id)
			err, failed = connectError{err}, true
		default:
			c.layer = l
			c.live.Store(l)
		}
		c.mu.Unlock()
		if failed { // the records of the failed connect reach the host before its result, none after
			c.logs.finish()
		}
		q.add(c, outcome{id: c.id, closure: closure, status: statusOf(err), text: resultText(err, "")})
	}()
	return C.CN_PENDING
}

//export cngo_close
func cngo_close(h C.cn_client, qh C.cn_queue, closure C.uintptr_t) (st C.cn_status) {
	defer recoverStatus(&st)
	c, err := lookup(h)
	if err != nil {
		return fail(err)
	}
	q, err := lookupQueue(qh)
	if err != nil {
		return fail(err)
	}
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return fail(layer.ErrClosed)
	}
	c.closing = true
	c.live.Store(nil)
	c.mu.Unlock()
	go func() {
		defer recoverInGoroutine(c)
		c.close()
		c.mu.Lock()
		l := c.layer
		c.mu.Unlock()
		q.add(c, outcome{id: c.id, closure: closure, status: C.CN_OK, text: statsJSON(l)})
	}()
	return C.CN_PENDING
}

// start begins an operation whose pending result goes to queue qh: it checks the client and
// the queue, then see begin.
func start(h C.cn_client, qh C.cn_queue, closure C.uintptr_t, opOut *C.cn_op,
	begin func(o *op) (*layer.Op, error)) C.cn_status {
	if opOut != nil {
		*opOut = 0
	}
	c, l, q, err := target(h, qh)
	if err != nil {
		return fail(err)
	}
	return beginOp(c, l, q, closure, opOut, begin)
}

// target is the client and the queue of a call.
func target(h C.cn_client, qh C.cn_queue) (*client, *layer.Layer, *resultQueue, error) {
	c, l, err := usable(h)
	if err != nil {
		return nil, nil, nil, err
	}
	q, err := lookupQueue(qh)
	return c, l, q, err
}

// beginOp writes the op handle first (a result taken on another thread may name it before the
// call returns), and registers the op when begin leaves it pending.
func beginOp(c *client, l *layer.Layer, q *resultQueue, closure C.uintptr_t, opOut *C.cn_op,
	begin func(o *op) (*layer.Op, error)) C.cn_status {
	o := c.newOp(l, q, closure)
	if opOut != nil {
		*opOut = C.cn_op(o.id)
	}
	lop, err := begin(o)
	if err != nil || lop == nil {
		if opOut != nil {
			*opOut = 0
		}
		return result(err)
	}
	o.register(lop)
	return C.CN_PENDING
}

// publish is cn_send and cn_group_send.
func publish(h C.cn_client, name *C.char, what string, body *C.uint8_t, n C.size_t, qh C.cn_queue,
	closure C.uintptr_t, opOut *C.cn_op, send func(*layer.Layer, string, []byte, func(error)) (*layer.Op, error)) C.cn_status {
	if opOut != nil {
		*opOut = 0
	}
	target, err := goString(name, what, true)
	if err != nil {
		return fail(err)
	}
	data, err := cBytes(body, n, "body")
	if err != nil {
		return fail(err)
	}
	return start(h, qh, closure, opOut, func(o *op) (*layer.Op, error) {
		o.sent = true
		return send(o.l, target, data, o.done) // the layer copies the lent body before it returns
	})
}

//export cngo_send
func cngo_send(h C.cn_client, channel *C.char, body *C.uint8_t, n C.size_t, qh C.cn_queue,
	closure C.uintptr_t, opOut *C.cn_op) (st C.cn_status) {
	defer recoverStatus(&st)
	return publish(h, channel, "channel", body, n, qh, closure, opOut, (*layer.Layer).StartSend)
}

//export cngo_group_send
func cngo_group_send(h C.cn_client, group *C.char, body *C.uint8_t, n C.size_t, qh C.cn_queue,
	closure C.uintptr_t, opOut *C.cn_op) (st C.cn_status) {
	defer recoverStatus(&st)
	return publish(h, group, "group", body, n, qh, closure, opOut, (*layer.Layer).StartGroupSend)
}

//export cngo_receive
func cngo_receive(h C.cn_client, channel *C.char, qh C.cn_queue, closure C.uintptr_t,
	bodyOut **C.uint8_t, lenOut *C.size_t, opOut *C.cn_op) (st C.cn_status) {
	defer recoverStatus(&st)
	var again C.cn_op // with channel NULL: the receive to start over
	if opOut != nil {
		again, *opOut = *opOut, 0
	}
	if bodyOut == nil || lenOut == nil {
		return fail(argError("body and len must not be NULL"))
	}
	storeAddress(unsafe.Pointer(bodyOut), 0)
	*lenOut = 0
	if channel == nil {
		if again == 0 {
			return fail(argError("channel must not be NULL, unless *op names a receive to start over"))
		}
		return receiveAgain(h, again, qh, bodyOut, lenOut, opOut)
	}
	lent, err := lentBytes(channel, "channel")
	if err != nil {
		return fail(err)
	}
	c, l, q, err := target(h, qh)
	if err != nil {
		return fail(err)
	}
	if err := checkUTF8(lent, "channel"); err != nil {
		return fail(err)
	}
	// A receive that finds a message waiting (the common case) makes no op and allocates
	// nothing: the op is made only when the receive has to wait, with the layer's record of it.
	var o *receiveOp
	msg, lop, err := l.StartReceiveInto(lent, func() (*layer.Receipt, layer.Receiver) {
		o = new(receiveOp)
		o.start(c, l, q, closure)
		o.reusable = &o.receipt
		o.word = rearmWords.get()
		o.receipt.ShareWord(o.word, o.id)
		if opOut != nil {
			*opOut = C.cn_op(o.id) // before a result taken on another thread can name it
		}
		return &o.receipt, o
	})
	switch {
	case err != nil:
		if opOut != nil {
			*opOut = 0
		}
		return fail(err)
	case lop == nil:
		lendReceived(q, msg, bodyOut, lenOut)
		return C.CN_OK
	}
	o.register(lop)
	return C.CN_PENDING
}

// receiveAgain is cn_receive with channel NULL: it starts over receive id, whose message the
// last take of its queue (qh) handed over (op.again).
func receiveAgain(h C.cn_client, id C.cn_op, qh C.cn_queue, bodyOut **C.uint8_t, lenOut *C.size_t,
	opOut *C.cn_op) C.cn_status {
	c, _, q, err := target(h, qh)
	if err != nil {
		return fail(err)
	}
	o := q.lentOp(id)
	if o == nil || o.c != c {
		o, err = c.opOf(id)
		switch {
		case err != nil:
			return fail(err)
		case o == nil:
			return fail(layer.ErrNotAgain)
		case o.q != q:
			return fail(argError("queue must be the queue of the receive that starts over"))
		}
	}
	msg, waits, err := o.again()
	switch {
	case err != nil:
		return fail(err)
	case waits:
		*opOut = id
		return C.CN_PENDING
	}
	lendReceived(q, msg, bodyOut, lenOut)
	return C.CN_OK
}

// lendReceived hands a message a receive found waiting to the host: lent until the queue's next
// take or receive.
func lendReceived(q *resultQueue, msg layer.Message, bodyOut **C.uint8_t, lenOut *C.size_t) {
	q.mu.Lock()
	storeAddress(unsafe.Pointer(bodyOut), q.lendAgain(msg.Body))
	*lenOut = C.size_t(len(msg.Body))
	q.mu.Unlock()
}

//export cngo_new_channel
func cngo_new_channel(h C.cn_client, prefix *C.char, qh C.cn_queue, closure C.uintptr_t,
	channelOut **C.char, opOut *C.cn_op) (st C.cn_status) {
	defer recoverStatus(&st)
	if opOut != nil {
		*opOut = 0
	}
	if channelOut == nil {
		return fail(argError("channel must not be NULL"))
	}
	storeAddress(unsafe.Pointer(channelOut), 0)
	p, err := goString(prefix, "prefix", false)
	if err != nil {
		return fail(err)
	}
	return start(h, qh, closure, opOut, func(o *op) (*layer.Op, error) {
		name, lop, err := o.l.StartNewChannel(p, o.named)
		if err == nil && lop == nil {
			storeAddress(unsafe.Pointer(channelOut), uintptr(unsafe.Pointer(C.CString(name))))
		}
		return lop, err
	})
}

//export cngo_group_add
func cngo_group_add(h C.cn_client, group, channel *C.char, qh C.cn_queue, closure C.uintptr_t,
	opOut *C.cn_op) (st C.cn_status) {
	defer recoverStatus(&st)
	if opOut != nil {
		*opOut = 0
	}
	g, ch, err := membership(group, channel)
	if err != nil {
		return fail(err)
	}
	return start(h, qh, closure, opOut, func(o *op) (*layer.Op, error) {
		return o.l.StartGroupAdd(g, ch, o.done)
	})
}

// membership copies the group and channel arguments of group_add and group_discard.
func membership(group, channel *C.char) (string, string, error) {
	g, err := goString(group, "group", true)
	if err != nil {
		return "", "", err
	}
	ch, err := goString(channel, "channel", true)
	return g, ch, err
}

//export cngo_group_discard
func cngo_group_discard(h C.cn_client, group, channel *C.char) (st C.cn_status) {
	defer recoverStatus(&st)
	_, l, err := usable(h)
	if err != nil {
		return fail(err)
	}
	g, ch, err := membership(group, channel)
	if err != nil {
		return fail(err)
	}
	return result(l.GroupDiscard(g, ch))
}

//export cngo_flush
func cngo_flush(h C.cn_client) (st C.cn_status) {
	defer recoverStatus(&st)
	_, l, err := usable(h)
	if err != nil {
		return fail(err)
	}
	return result(l.Flush())
}

//export cngo_read_events
func cngo_read_events(h C.cn_client, fd *C.intptr_t) (st C.cn_status) {
	defer recoverStatus(&st)
	if fd == nil {
		return fail(argError("fd must not be NULL"))
	}
	*fd = -1
	_, l, err := usable(h)
	if err != nil {
		return fail(err)
	}
	n, err := l.ReadEvents()
	if errors.Is(err, layer.ErrNoReadEvents) {
		return C.CN_OK // the library reads the connection itself
	}
	if err != nil {
		return fail(err)
	}
	*fd = C.intptr_t(n)
	return C.CN_OK
}

//export cngo_on_readable
func cngo_on_readable(h C.cn_client, qh C.cn_queue) (st C.cn_status) {
	defer recoverStatus(&st)
	c, l, err := usable(h)
	if err != nil {
		return fail(err)
	}
	if qh != 0 {
		q, err := lookupQueue(qh)
		if err != nil {
			return fail(err)
		}
		c.reading(q)
		defer c.reading(nil)
	}
	l.OnReadable()
	return C.CN_OK
}

//export cngo_cancel
func cngo_cancel(h C.cn_client, id C.cn_op) (st C.cn_status) {
	defer recoverStatus(&st)
	c, err := lookup(h)
	if err != nil {
		return fail(err)
	}
	o, err := c.opOf(id)
	if err != nil {
		return fail(err)
	}
	if o == nil || !o.withdraw() {
		return fail(errNotPending)
	}
	return C.CN_OK
}

//export cngo_stats
func cngo_stats(h C.cn_client, out **C.char) (st C.cn_status) {
	defer recoverStatus(&st)
	if out == nil {
		return fail(argError("json must not be NULL"))
	}
	storeAddress(unsafe.Pointer(out), 0)
	_, l, err := usable(h)
	if err != nil {
		return fail(err)
	}
	storeAddress(unsafe.Pointer(out), uintptr(unsafe.Pointer(C.CString(statsJSON(l)))))
	return C.CN_OK
}

// statsJSON is the stats document of cn_stats and of a close's result (all zero for a client
// that never connected). Goroutines are counted for the whole library (all clients): a leak
// check for hosts.
func statsJSON(l *layer.Layer) string {
	var stats layer.Stats
	if l != nil {
		stats = l.Stats()
	}
	doc, _ := json.Marshal(struct {
		layer.Stats
		Goroutines int `json:"goroutines"`
	}{stats, runtime.NumGoroutine()})
	return string(doc)
}
