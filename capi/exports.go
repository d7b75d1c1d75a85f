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
	cb C.cn_callback, closure C.uintptr_t, out *C.cn_client) (st C.cn_status) {
	defer recoverStatus(&st)
	if out == nil {
		return fail(argError("client must not be NULL"))
	}
	*out = 0
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
	c := &client{id: nextHandle(), log: log, logClosure: logClosure, ops: map[uint64]pendingOp{}}
	cfg.Log = c.logRecord
	cfg.Deliveries = c.deliveries
	ctx, cancel := context.WithCancel(context.Background())
	c.connecting = cancel
	issued.Store(c.id, struct{}{})
	clients.Store(c.id, c)
	*out = C.cn_client(c.id)

	connect := func() error {
		defer cancel()
		l, err := layer.Connect(ctx, cfg)
		c.mu.Lock()
		defer c.mu.Unlock()
		c.connecting = nil
		switch {
		case c.closing: // close abandoned this connect; it finishes the client
			if err == nil {
				_ = l.Close()
			}
			return layer.ErrClosed
		case err != nil:
			clients.Delete(c.id)
			if c.results != nil {
				c.results.detach() // a client that never connected frees its queue too
			}
			return connectError{err}
		}
		c.layer = l
		return nil
	}
	if cb == nil {
		if err := connect(); err != nil {
			*out = 0
			return fail(err)
		}
		return C.CN_OK
	}
	c.running.Add(1)
	go func() {
		defer c.running.Done()
		defer recoverInGoroutine(c)
		err := connect()
		var text *C.char
		if err != nil {
			text = C.CString(errorText(err))
			defer C.free(unsafe.Pointer(text))
		}
		C.bridge_invoke(cb, closure, statusOf(err), text, nil, 0)
	}()
	return C.CN_PENDING
}

//export cngo_close
func cngo_close(h C.cn_client, cb C.cn_callback, closure C.uintptr_t) (st C.cn_status) {
	defer recoverStatus(&st)
	c, err := lookup(h)
	if err != nil {
		return fail(err)
	}
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return fail(layer.ErrClosed)
	}
	c.closing = true
	c.mu.Unlock()
	if cb == nil {
		c.close()
		return C.CN_OK
	}
	go func() {
		defer recoverInGoroutine(c)
		c.close()
		C.bridge_invoke(cb, closure, C.CN_OK, nil, nil, 0)
	}()
	return C.CN_PENDING
}

// publish is cn_send and cn_group_send: at once on a healthy connection, else pending.
func publish(h C.cn_client, name *C.char, what string, body *C.uint8_t, n C.size_t, cb C.cn_callback,
	closure C.uintptr_t, opOut *C.cn_op, send func(*layer.Layer, context.Context, string, []byte) error) C.cn_status {
	if opOut != nil {
		*opOut = 0
	}
	c, l, err := usable(h)
	if err != nil {
		return fail(err)
	}
	target, err := goString(name, what, true)
	if err != nil {
		return fail(err)
	}
	data, err := cBytes(body, n, "body")
	if err != nil {
		return fail(err)
	}
	// nats.go copies the body into its write buffer, so the C memory is only read during the call.
	err = send(l, layer.NoWait(context.Background()), target, data)
	if !errors.Is(err, layer.ErrWouldBlock) {
		return result(err)
	}
	data = append([]byte(nil), data...) // the caller may reuse its buffer once we return
	if cb == nil {
		return result(send(l, context.Background(), target, data))
	}
	o, err := c.start(cb, closure)
	if err != nil {
		return fail(err)
	}
	o.run(func(ctx context.Context) { o.finish(send(l, ctx, target, data), "", nil) })
	if opOut != nil {
		*opOut = C.cn_op(o.id)
	}
	return C.CN_PENDING
}

//export cngo_send
func cngo_send(h C.cn_client, channel *C.char, body *C.uint8_t, n C.size_t, cb C.cn_callback,
	closure C.uintptr_t, opOut *C.cn_op) (st C.cn_status) {
	defer recoverStatus(&st)
	return publish(h, channel, "channel", body, n, cb, closure, opOut, (*layer.Layer).SendRaw)
}

//export cngo_group_send
func cngo_group_send(h C.cn_client, group *C.char, body *C.uint8_t, n C.size_t, cb C.cn_callback,
	closure C.uintptr_t, opOut *C.cn_op) (st C.cn_status) {
	defer recoverStatus(&st)
	return publish(h, group, "group", body, n, cb, closure, opOut, (*layer.Layer).GroupSendRaw)
}

// usable finds a client that can be used now: connected, not closing.
func usable(h C.cn_client) (*client, *layer.Layer, error) {
	c, err := lookup(h)
	if err != nil {
		return nil, nil, err
	}
	l, err := c.connected()
	return c, l, err
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

// cCopy returns a malloc'ed copy of b, which the host frees with cn_free.
func cCopy(b []byte) *C.uint8_t {
	if len(b) == 0 {
		return (*C.uint8_t)(C.malloc(1)) // never NULL on success
	}
	return (*C.uint8_t)(C.CBytes(b))
}

//export cngo_receive
func cngo_receive(h C.cn_client, channel *C.char, cb C.cn_callback, closure C.uintptr_t,
	bodyOut **C.uint8_t, lenOut *C.size_t, opOut *C.cn_op) (st C.cn_status) {
	defer recoverStatus(&st)
	if opOut != nil {
		*opOut = 0
	}
	if bodyOut == nil || lenOut == nil {
		return fail(argError("body and len must not be NULL"))
	}
	*bodyOut, *lenOut = nil, 0
	c, l, err := usable(h)
	if err != nil {
		return fail(err)
	}
	name, err := goString(channel, "channel", true)
	if err != nil {
		return fail(err)
	}
	ready := func(body []byte) C.cn_status {
		*bodyOut, *lenOut = cCopy(body), C.size_t(len(body))
		return C.CN_OK
	}
	if cb == nil {
		body, err := l.ReceiveRaw(context.Background(), name)
		if err != nil {
			return fail(err)
		}
		return ready(body)
	}
	o := c.newOp(cb, closure)
	msg, pending, err := l.StartReceive(layer.NoWait(context.Background()), name, o.deliver(l))
	switch {
	case errors.Is(err, layer.ErrWouldBlock): // the channel's subscription is not confirmed yet
		if err := c.register(o); err != nil {
			return fail(err)
		}
		o.run(func(ctx context.Context) {
			msg, pending, err := l.StartReceive(ctx, name, o.deliver(l))
			switch {
			case err != nil:
				o.finish(err, "", nil)
			case pending != nil:
				o.waitFor(pending)
			case !o.finish(nil, "", msg.Body):
				l.PutBack(msg)
			}
		})
	case err != nil:
		return fail(err)
	case pending == nil: // a message was waiting: no pending operation at all
		return ready(msg.Body)
	default:
		o.waitFor(pending)
		if err := c.register(o); err != nil && o.withdraw() {
			return fail(err) // closing: nothing was delivered, nor will be
		} // else it finished already: its result is on its way, as for any pending operation
	}
	if opOut != nil {
		*opOut = C.cn_op(o.id)
	}
	return C.CN_PENDING
}

//export cngo_put_back
func cngo_put_back(h C.cn_client, channel *C.char, body *C.uint8_t, n C.size_t) (st C.cn_status) {
	defer recoverStatus(&st)
	l, name, data, err := putBackArgs(h, channel, body, n, "body")
	if err != nil {
		return fail(err)
	}
	l.PutBack(layer.Message{Channel: name, Body: append([]byte(nil), data...)})
	return C.CN_OK
}

// putBackArgs checks the arguments of cn_put_back and cn_put_back_many; data is lent, valid
// during the call only.
func putBackArgs(h C.cn_client, channel *C.char, p *C.uint8_t, n C.size_t, what string) (*layer.Layer, string, []byte, error) {
	_, l, err := usable(h)
	if err != nil {
		return nil, "", nil, err
	}
	name, err := goString(channel, "channel", true)
	if err == nil {
		err = layer.ValidateChannelName(name)
	}
	if err != nil {
		return nil, "", nil, err
	}
	data, err := cBytes(p, n, what)
	return l, name, data, err
}

// pendingOrNow runs a call that may wait on the network: at once when it need not wait, on the
// calling thread when cb is NULL, else as a pending operation whose callback gets the text. undo
// (if not nil) reverts a call that succeeded after the operation was withdrawn.
func pendingOrNow(c *client, cb C.cn_callback, closure C.uintptr_t, opOut *C.cn_op,
	call func(ctx context.Context) (string, error), done func(text string), undo func()) C.cn_status {
	text, err := call(layer.NoWait(context.Background()))
	if !errors.Is(err, layer.ErrWouldBlock) {
		if err == nil {
			done(text)
		}
		return result(err)
	}
	if cb == nil {
		text, err := call(context.Background())
		if err == nil {
			done(text)
		}
		return result(err)
	}
	o, err := c.start(cb, closure)
	if err != nil {
		return fail(err)
	}
	o.run(func(ctx context.Context) {
		text, err := call(ctx)
		if !o.finish(err, text, nil) && err == nil && undo != nil {
			undo() // cn_cancel won the race with the success: keep its promise
		}
	})
	if opOut != nil {
		*opOut = C.cn_op(o.id)
	}
	return C.CN_PENDING
}

//export cngo_new_channel
func cngo_new_channel(h C.cn_client, prefix *C.char, cb C.cn_callback, closure C.uintptr_t,
	channelOut **C.char, opOut *C.cn_op) (st C.cn_status) {
	defer recoverStatus(&st)
	if opOut != nil {
		*opOut = 0
	}
	if channelOut == nil {
		return fail(argError("channel must not be NULL"))
	}
	*channelOut = nil
	c, l, err := usable(h)
	if err != nil {
		return fail(err)
	}
	p, err := goString(prefix, "prefix", false)
	if err != nil {
		return fail(err)
	}
	return pendingOrNow(c, cb, closure, opOut,
		func(ctx context.Context) (string, error) { return l.NewChannel(ctx, p) },
		func(name string) { *channelOut = C.CString(name) },
		nil) // an unreported channel is reclaimed after mailbox_grace
}

//export cngo_group_add
func cngo_group_add(h C.cn_client, group, channel *C.char, cb C.cn_callback, closure C.uintptr_t,
	opOut *C.cn_op) (st C.cn_status) {
	defer recoverStatus(&st)
	if opOut != nil {
		*opOut = 0
	}
	c, l, err := usable(h)
	if err != nil {
		return fail(err)
	}
	g, ch, err := membership(group, channel)
	if err != nil {
		return fail(err)
	}
	return pendingOrNow(c, cb, closure, opOut,
		func(ctx context.Context) (string, error) { return "", l.GroupAdd(ctx, g, ch) },
		func(string) {},
		func() { _ = l.GroupDiscard(g, ch) })
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

//export cngo_cancel
func cngo_cancel(h C.cn_client, id C.cn_op) (st C.cn_status) {
	defer recoverStatus(&st)
	o, err := findOp(h, id)
	if err != nil {
		return fail(err)
	}
	if o == nil || !o.withdraw() {
		return fail(errNotPending)
	}
	return C.CN_OK
}

//export cngo_set_batch_callback
func cngo_set_batch_callback(h C.cn_client, cb C.cn_batch_callback, closure C.uintptr_t) (st C.cn_status) {
	defer recoverStatus(&st)
	if cb == nil {
		return fail(argError("callback must not be NULL"))
	}
	return result(setSink(h, func() resultSink { return newBatcher(cb, closure) }))
}

// setSink makes the results of client h go to the sink newSink returns, once, before its first
// pending operation (also while it connects: hosts set it first thing).
func setSink(h C.cn_client, newSink func() resultSink) error {
	c, err := lookup(h)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closing:
		return layer.ErrClosed
	case c.results != nil || len(c.ops) > 0:
		return errSinkTooLate
	}
	c.results = newSink()
	return nil
}

//export cngo_stats
func cngo_stats(h C.cn_client, out **C.char) (st C.cn_status) {
	defer recoverStatus(&st)
	if out == nil {
		return fail(argError("json must not be NULL"))
	}
	*out = nil
	_, l, err := usable(h)
	if err != nil {
		return fail(err)
	}
	// Goroutines are counted for the whole library (all clients): a leak check for hosts.
	doc, err := json.Marshal(struct {
		layer.Stats
		Goroutines int `json:"goroutines"`
	}{l.Stats(), runtime.NumGoroutine()})
	if err != nil {
		return fail(err)
	}
	*out = C.CString(string(doc))
	return C.CN_OK
}
