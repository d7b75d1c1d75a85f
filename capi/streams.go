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

	mu     sync.Mutex
	pr     *layer.PendingReceive
	owed   int   // results still to come: the credit, less what was delivered and what a stop took back
	ended  bool  // the last result went out, or nothing more will come
	busy   bool  // a start or a stop is between the layer's answer and ours: an end waits for it
	closed error // the end that came while busy, for the start or stop to send or drop
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

// end sends err as the stream's last result, unless it had ended. While a start or a stop is
// busy it only notes err: whether the stream ends with it depends on their outcome.
func (s *stream) end(err error) bool {
	s.mu.Lock()
	if s.ended || s.busy {
		if !s.ended {
			s.closed = err
		}
		s.mu.Unlock()
		return false
	}
	s.ended = true
	s.mu.Unlock()
	s.finishWith(err)
	return true
}

func (s *stream) finishWith(err error) {
	s.c.emit(s.cb, s.closure, statusOf(err), errorText(err), nil)
	s.c.forget(s.id)
}

// started records the stream's pending receive; an end that came meanwhile is sent now.
func (s *stream) started(pr *layer.PendingReceive) {
	s.mu.Lock()
	s.pr, s.busy = pr, false
	closed := s.closed
	send := closed != nil && !s.ended
	s.ended = s.ended || send
	s.mu.Unlock()
	if send {
		s.finishWith(closed)
	}
}

// stop ends the stream and returns the credit it had not used (0 when it had ended). The results
// of the credit it did use still come, some possibly after stop returns.
func (s *stream) stop() int {
	s.mu.Lock()
	pr := s.pr
	if pr == nil || s.busy {
		s.mu.Unlock()
		return 0 // still starting, or another stop runs: nothing to stop here
	}
	s.busy = true
	s.mu.Unlock()
	unused := pr.Stop()
	s.mu.Lock()
	s.busy = false
	s.owed -= unused
	// A close that came meanwhile ends the stream only if it got there first (nothing unused):
	// otherwise the stop took the credit back and the results in flight are all that come.
	closed := s.closed
	send := unused == 0 && closed != nil && !s.ended
	done := s.owed <= 0 && !s.ended && !send
	s.ended = s.ended || done || send
	s.mu.Unlock()
	switch {
	case send:
		s.finishWith(closed)
	case done:
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
	s := &stream{id: nextHandle(), c: c, l: l, cb: cb, closure: closure, owed: int(credit), busy: true}
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
	s.started(pr)
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
	o, err := findOp(h, id)
	if err != nil {
		return fail(err)
	}
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
