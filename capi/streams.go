package main

/*
#include "bridge.h"
*/
import "C"

import (
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/channels-nats/channels-nats/layer"
)

// errNotSubscribed: a stream never waits, so it cannot be the receive that subscribes.
var errNotSubscribed = errors.New("the channel's subscription is not ready; receive on it once first (cn_receive)")

// freshSlack: a message that has waited less than this is reported with its full expiry (a NULL
// text), so the common case, a message handed over as it arrives, costs no text.
const freshSlack = 10 * time.Millisecond

// stream is a standing receive (cn_receive_stream): each message it takes becomes one result with
// its closure, with no call per message. It ends when its credit is used, on cn_stream_stop or
// cn_cancel, or with one CN_CLOSED result when the client closes.
type stream struct {
	id      uint64
	c       *client
	l       *layer.Layer
	cb      C.cn_callback
	closure C.uintptr_t

	mu    sync.Mutex
	pr    *layer.PendingReceive
	owed  int  // results still to come: the credit, less what was delivered and what a stop took back
	ended bool // the last result went out, or nothing more will come
}

// deliver is the layer's callback for the stream's messages.
func (s *stream) deliver(m layer.Message, err error) {
	if err != nil {
		s.end(err)
		return
	}
	text := ""
	if left := s.l.TimeLeft(m, time.Now()); left < s.l.Expiry()-freshSlack {
		text = strconv.FormatInt(left.Milliseconds(), 10)
	}
	s.c.emit(s.cb, s.closure, C.CN_OK, text, m.Body)
	s.mu.Lock()
	s.owed--
	done := s.owed <= 0 && !s.ended
	s.ended = s.ended || done
	s.mu.Unlock()
	if done {
		s.c.forget(s.id)
	}
}

// end sends err as the stream's last result, unless it had ended.
func (s *stream) end(err error) bool {
	s.mu.Lock()
	first := !s.ended
	s.ended = true
	s.mu.Unlock()
	if first {
		s.c.emit(s.cb, s.closure, statusOf(err), errorText(err), nil)
		s.c.forget(s.id)
	}
	return first
}

// stop ends the stream and returns the credit it had not used (0 when it had ended). The results
// of the credit it did use still come, some possibly after stop returns.
func (s *stream) stop() int {
	s.mu.Lock()
	pr := s.pr
	s.mu.Unlock()
	if pr == nil {
		return 0 // still starting, or never started: nothing to stop yet
	}
	unused := pr.Stop()
	s.mu.Lock()
	s.owed -= unused
	done := s.owed <= 0 && !s.ended
	s.ended = s.ended || done
	s.mu.Unlock()
	if done {
		s.c.forget(s.id)
	}
	return unused
}

func (s *stream) withdraw() bool { return s.stop() > 0 }

// forget removes a pending operation or stream from the client.
func (c *client) forget(id uint64) {
	c.mu.Lock()
	delete(c.ops, id)
	c.mu.Unlock()
}

//export cngo_receive_stream
func cngo_receive_stream(h C.cn_client, channel *C.char, credit C.uint32_t, cb C.cn_callback, closure C.uintptr_t,
	opOut *C.cn_op) (st C.cn_status) {
	defer recoverStatus(&st)
	if opOut != nil {
		*opOut = 0
	}
	if cb == nil {
		return fail(argError("callback must not be NULL: a stream has no waiting form"))
	}
	if credit == 0 {
		return fail(argError("credit must be at least 1"))
	}
	c, l, err := usable(h)
	if err != nil {
		return fail(err)
	}
	name, err := goString(channel, "channel", true)
	if err != nil {
		return fail(err)
	}
	s := &stream{id: nextHandle(), c: c, l: l, cb: cb, closure: closure, owed: int(credit)}
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return fail(layer.ErrClosed)
	}
	c.ops[s.id] = s // first: its first message may be delivered before StartStream returns
	c.mu.Unlock()
	pr, err := l.StartStream(name, int(credit), s.deliver)
	if err != nil || pr == nil {
		c.forget(s.id)
		switch {
		case errors.Is(err, layer.ErrWouldBlock):
			return fail(errNotSubscribed)
		case err != nil:
			return fail(err)
		}
		return C.CN_OK // messages are waiting: the host takes them first
	}
	s.mu.Lock()
	s.pr = pr
	s.mu.Unlock()
	if opOut != nil {
		*opOut = C.cn_op(s.id)
	}
	return C.CN_PENDING
}

//export cngo_stream_stop
func cngo_stream_stop(h C.cn_client, id C.cn_op, unused *C.uint32_t) (st C.cn_status) {
	defer recoverStatus(&st)
	if unused == nil {
		return fail(argError("unused must not be NULL"))
	}
	*unused = 0
	c, err := lookup(h)
	if err != nil {
		return fail(err)
	}
	if id == 0 || uint64(id) > lastHandle.Load() {
		return fail(errInvalidHandle)
	}
	c.mu.Lock()
	o := c.ops[uint64(id)]
	c.mu.Unlock()
	s, ok := o.(*stream)
	if o != nil && !ok {
		return fail(argError("not a stream: cancel a receive with cn_cancel"))
	}
	if !ok {
		return fail(errNotPending)
	}
	n := s.stop()
	if n == 0 {
		return fail(errNotPending)
	}
	*unused = C.uint32_t(n)
	return C.CN_OK
}
