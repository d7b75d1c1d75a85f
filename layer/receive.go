package layer

import (
	"context"
	"strings"
	"sync/atomic"
	"time"
)

// Message is one received message.
type Message struct {
	// Body is the msgpack map as it arrived. Group members in one process share it: read it,
	// copy it or decode it, never modify it.
	Body []byte
	// Channel is the name the receive was made on.
	Channel string

	mb *mailbox
	at time.Time
}

// Receiver is where a receive that waits delivers its result (see StartReceiveInto).
type Receiver interface {
	// Received is called exactly once, from a library goroutine, with the next message or with
	// the error that ended the receive, unless the receive's Op is cancelled first. It must not
	// block and must not call Close.
	Received(Message, error)
}

// deliverFunc makes a function a Receiver.
type deliverFunc func(Message, error)

func (f deliverFunc) Received(m Message, err error) { f(m, err) }

// StartReceive begins a receive on channel. When a message is waiting it is returned at once
// with a nil *Op. Otherwise deliver is called exactly once, later, from a library goroutine, with
// the next message or with the error that ended the receive (ErrClosed, or a failed subscription
// on the first receive of a plain channel), unless the Op is cancelled first. deliver must not
// block and must not call Close.
//
// A process channel must belong to this client (*ForeignChannelError, S12); the name "X!" of this
// client receives every process channel message that has no mailbox of its own (S13). The first
// receive of a plain channel subscribes to it and waits for the server's confirmation (S1).
//
// StartReceive keeps a copy of channel, never channel itself: a host may pass a name it only
// lends for the call.
func (l *Layer) StartReceive(channel string, deliver func(Message, error)) (Message, *Op, error) {
	return l.StartReceiveInto(channel, func() (*Receipt, Receiver) { return new(Receipt), deliverFunc(deliver) })
}

// StartReceiveInto is StartReceive for a host that keeps a record of its own for each waiting
// receive, with a Receipt in it: a receive that finds a message waiting allocates nothing and
// looks its mailbox up once, and one that waits allocates only the host's record. newReceipt is
// called at most once, and only for a receive that returns an *Op (the Receipt's), before
// anything can be delivered to it; it returns an unused Receipt and where the result goes. It runs
// under the layer's lock and must not call the layer.
func (l *Layer) StartReceiveInto(channel string, newReceipt func() (*Receipt, Receiver)) (Message, *Op, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return Message{}, nil, ErrClosed
	}
	now := time.Now()
	mb := l.mailboxes[channel]
	s := liveFeed(mb) // the common case: a channel received on before, checked then
	if s == nil {
		l.mu.Unlock()
		channel = strings.Clone(channel) // it names the mailbox and the subscription from now on
		if err := ValidateChannelName(channel); err != nil {
			return Message{}, nil, err
		}
		key, err := l.receiveKey(channel)
		if err != nil {
			return Message{}, nil, err
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return Message{}, nil, ErrClosed
		}
		mb = l.mailboxLocked(channel, now)
		s = l.want(key)
		mb.feed = s
	}
	if s.confirmed {
		msg, op := l.takeOrWait(mb, now, newReceipt)
		l.mu.Unlock()
		return msg, op, nil
	}
	mb.subscribing++
	r, to := newReceipt()
	l.mu.Unlock()

	// The subscription must be confirmed first; the receive waits for it on a goroutine. Until
	// it waits in the mailbox, Cancel withdraws it through op.withdraw (op.recv stays nil).
	ctx, cancel := context.WithCancel(l.ctx)
	listed := false // set under l.mu once the receive waits in the mailbox
	op := &r.Op
	op.withdraw = func() {
		cancel()
		l.mu.Lock()
		if listed && mb.removeWaiter(&r.w) {
			l.readerLeft(mb, time.Now(), true)
		}
		l.mu.Unlock()
	}
	l.spawn(func() {
		defer cancel()
		err := l.confirm(ctx, s)
		l.mu.Lock()
		mb.subscribing--
		if err == nil && op.pending() {
			if l.closed {
				err = ErrClosed
			} else if msg, ok := l.popLocked(mb, time.Now()); ok {
				l.mu.Unlock()
				l.handTo(op, to, msg)
				return
			} else {
				l.listWaiter(&r.w, mb, op, to, time.Now())
				listed = true
				l.mu.Unlock()
				return
			}
		}
		if mb.plain && mb.idle() {
			l.scheduleRelease(mb) // no one will read what its subscription takes
		}
		l.mu.Unlock()
		if err == nil {
			err = ctx.Err()
		}
		if op.finish() {
			to.Received(Message{}, err)
		}
	})
	return Message{}, op, nil
}

// ReceiveAgain starts the next receive on the channel of r, a Receipt from StartReceiveInto
// whose receive ended with a message that its host consumed: in the same mailbox, for the same
// Receiver, with no name to look up and nothing to allocate. It returns what StartReceiveInto
// does, r's own Op when it waits. From this call on, Retract no longer gives back r's last
// message. ErrNotAgain means r cannot wait again (its receive ended otherwise, or its mailbox
// was reclaimed or flushed, or its subscription is being made again): receive by name instead.
// The host calls it for one Receipt at a time, never while r waits. A Receipt with a word
// (ShareWord) is started over with Rearm instead, and with ReceiveAgain when Rearm fails.
func (l *Layer) ReceiveAgain(r *Receipt) (Message, *Op, error) {
	w := &r.w
	l.mu.Lock()
	defer l.mu.Unlock()
	if w.parks() && w.listed {
		w.unpark() // a parked receive the host starts over by call (its Rearm failed, or none was made)
		if w.ended() {
			w.mb.removeWaiter(w)
		}
	}
	switch {
	case l.closed:
		return Message{}, nil, ErrClosed
	case w.mb == nil || w.to == nil || w.listed || r.pending() || r.cancelled() ||
		w.mb.discharged || liveFeed(w.mb) == nil || !w.mb.feed.confirmed:
		return Message{}, nil, ErrNotAgain
	}
	// The last message was consumed: it is no longer r's to give back.
	r.undo.Store(nil)
	w.handed.Store(false)
	w.msg = Message{}
	now := time.Now()
	if msg, ok := l.popLocked(w.mb, now); ok {
		return msg, nil, nil
	}
	r.recv = w
	r.state.Store(opPending)
	l.listWaiter(w, w.mb, &r.Op, w.to, now)
	return Message{}, &r.Op, nil
}

// liveFeed is the subscription that feeds mb, when a receive made it and it was not dropped
// since; nil otherwise (mb may be nil). l.mu must be held.
func liveFeed(mb *mailbox) *subscription {
	if mb == nil || mb.feed == nil || mb.feed.dropped {
		return nil
	}
	return mb.feed
}

// takeOrWait returns the oldest live message of mb, or makes the receive wait for one. l.mu
// must be held.
func (l *Layer) takeOrWait(mb *mailbox, now time.Time, newReceipt func() (*Receipt, Receiver)) (Message, *Op) {
	if msg, ok := l.popLocked(mb, now); ok {
		return msg, nil
	}
	r, to := newReceipt()
	r.recv = &r.w
	l.listWaiter(&r.w, mb, &r.Op, to, now)
	return Message{}, &r.Op
}

// listWaiter makes w the newest receive waiting in mb: ahead of the receives that got a message
// and were not started over yet, which stay listed (rearm.go). l.mu must be held.
func (l *Layer) listWaiter(w *waiter, mb *mailbox, op *Op, to Receiver, now time.Time) {
	mb.readAt = now
	w.l, w.mb, w.op, w.to, w.listed = l, mb, op, to, true
	mb.waiters = append(mb.waiters, w)
	i := len(mb.waiters) - 1
	for ; i > 0 && mb.waiters[i-1].resting(); i-- {
		mb.waiters[i] = mb.waiters[i-1]
	}
	mb.waiters[i] = w
}

// popLocked takes the oldest live message of mb, if any, dropping expired ones. l.mu must be held.
func (l *Layer) popLocked(mb *mailbox, now time.Time) (Message, bool) {
	mb.readAt, mb.activeAt = now, now // a receiver, even one that never waits, keeps mb (S5)
	e, ok, expired := mb.pop(now, l.cfg.Expiry)
	l.countExpired(expired)
	if !ok {
		return Message{}, false
	}
	l.counters.delivered.Add(1)
	return Message{Body: e.body, Channel: mb.name, mb: mb, at: e.at}, true
}

// readerLeft updates mb when a receive stops waiting, with a message or cancelled. l.mu must be held.
func (l *Layer) readerLeft(mb *mailbox, now time.Time, cancelled bool) {
	mb.readAt = now
	if !mb.waitedOn() {
		mb.activeAt = now // the idle grace starts now (S5)
	}
	if cancelled && mb.plain && mb.idle() {
		l.scheduleRelease(mb)
	}
}

// receiveKey is the subscription a receive on channel needs; a process channel must be this
// client's (S12).
func (l *Layer) receiveKey(channel string) (subKey, error) {
	nonLocal, _, ok := strings.Cut(channel, "!")
	if !ok {
		return channelKey(channel), nil
	}
	if !l.owns(channel) {
		return subKey{}, &ForeignChannelError{channel}
	}
	return processKey(nonLocal), nil
}

// mailboxLocked returns the mailbox of name, creating it. l.mu must be held.
func (l *Layer) mailboxLocked(name string, now time.Time) *mailbox {
	if mb := l.mailboxes[name]; mb != nil {
		return mb
	}
	mb := newMailbox(name, l.cfg.capacityOf(name), now)
	l.mailboxes[name] = mb
	return mb
}

// ReceiveRaw waits for the next message on channel and returns its body (see StartReceive and
// Message.Body). When ctx ends first it returns ctx.Err() and loses nothing.
func (l *Layer) ReceiveRaw(ctx context.Context, channel string) ([]byte, error) {
	type result struct {
		msg Message
		err error
	}
	got := make(chan result, 1)
	msg, op, err := l.StartReceive(channel, func(m Message, err error) { got <- result{m, err} })
	if err != nil || op == nil {
		return msg.Body, err
	}
	r, err := wait(ctx, op, got)
	if err != nil {
		return nil, err
	}
	return r.msg.Body, r.err
}

// Receive is ReceiveRaw with the body decoded into a map of its own.
func (l *Layer) Receive(ctx context.Context, channel string) (map[string]any, error) {
	body, err := l.ReceiveRaw(ctx, channel)
	if err != nil {
		return nil, err
	}
	return DecodeMessage(body)
}

// giveBack returns a message that was handed to a receive that can no longer take it (cancelled
// after the hand-over, or retracted by a host whose consumer was cancelled): it goes to the front
// of its mailbox, or to the next waiting receive, and keeps its arrival time, so it expires when
// it would have (S4, S14). If its plain channel was released meanwhile, it is re-published on its
// subject.
func (l *Layer) giveBack(msg Message) {
	now := time.Now()
	name, at := msg.mb.name, msg.at
	handedOver := false
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	uncount(&l.counters.delivered) // it was counted when it was handed over
	mb := l.mailboxes[name]
	switch {
	case expired(at, now, l.cfg.Expiry):
		l.countExpired(1) // no time left: it would have expired in the mailbox (S4)
	case msg.mb.plain && mb != msg.mb: // released meanwhile
		l.handBack(l.subj.channel(name), [][]byte{msg.Body})
	case mb == nil:
		l.countNoMailbox(l.subj.channel(name), name)
	default:
		if w := mb.takeWaiter(); w != nil {
			// Delivered by the dispatcher, in order with everything else (callbacks never run
			// on the caller's goroutine).
			l.handOver(w, Message{Body: msg.Body, Channel: name, mb: mb, at: at}, now)
			handedOver = true
		} else {
			mb.insert(0, entry{at, msg.Body})
		}
	}
	l.mu.Unlock()
	if handedOver {
		l.kickDispatcher()
	}
}

// uncount takes one back from a counter, never below zero.
func uncount(c *atomic.Uint64) {
	for {
		n := c.Load()
		if n == 0 || c.CompareAndSwap(n, n-1) {
			return
		}
	}
}
