package layer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
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

// groupMembers holds the members of one group in this client.
type groupMembers struct {
	process map[string]*mailbox // process-channel members, fed by one subscription per group
	plain   map[string]*mailbox // plain-channel members, each fed by its own queue subscription
}

func (g *groupMembers) size() int { return len(g.process) + len(g.plain) }

// Send publishes a message to a channel (validated: see SendRaw). Values may be nil, bool, any
// integer type, float32, float64, string, []byte, []any, []string, map[string]any and
// map[string]string; anything else is a *FrameError.
func (l *Layer) Send(ctx context.Context, channel string, msg map[string]any) error {
	body, err := encodeMessage(msg)
	if err != nil {
		return err
	}
	return l.SendRaw(ctx, channel, body)
}

// SendRaw publishes a msgpack body to a channel. The body must be a valid wire message without
// the reserved key (*FrameError otherwise, S8); with its headers it must fit the server's
// max_payload (*MessageTooLargeError, S7). Nothing is sent when it returns an error. A message
// sent to a channel nobody receives on is lost (S1).
func (l *Layer) SendRaw(ctx context.Context, channel string, body []byte) error {
	if err := ValidateChannelName(channel); err != nil {
		return err
	}
	m := &nats.Msg{Subject: l.subj.channel(channel), Data: body}
	if IsProcessChannel(channel) {
		m.Header = nats.Header{ChannelHeader: []string{channel}}
	}
	return l.publish(ctx, m)
}

// GroupSend publishes a message to every member of a group, in every process (see GroupSendRaw).
func (l *Layer) GroupSend(ctx context.Context, group string, msg map[string]any) error {
	body, err := encodeMessage(msg)
	if err != nil {
		return err
	}
	return l.GroupSendRaw(ctx, group, body)
}

// GroupSendRaw publishes a msgpack body once on the group's subject; the server fans it out.
// The rules of SendRaw apply. Sending to a group with no members is not an error.
func (l *Layer) GroupSendRaw(ctx context.Context, group string, body []byte) error {
	if err := ValidateGroupName(group); err != nil {
		return err
	}
	return l.publish(ctx, &nats.Msg{Subject: l.subj.group(group), Data: body})
}

// headerSize is how many bytes a header block adds to a message on the wire.
func headerSize(h nats.Header) int {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}

func (l *Layer) publish(ctx context.Context, m *nats.Msg) error {
	if err := validateOutbound(m.Data); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	nc, err := l.connection(ctx, false)
	if err != nil {
		return err
	}
	size := int64(len(m.Data) + headerSize(m.Header))
	if limit := nc.MaxPayload(); size > limit {
		return &MessageTooLargeError{Size: size, MaxPayload: limit}
	}
	if err := nc.PublishMsg(m); err != nil {
		if errors.Is(err, nats.ErrConnectionClosed) {
			l.mu.Lock()
			closed := l.closed
			l.mu.Unlock()
			if closed {
				return ErrClosed
			}
		}
		return fmt.Errorf("channels_nats: cannot publish on %s: %w", m.Subject, redactErr(err))
	}
	l.counters.published.Add(1)
	return nil
}

// PendingReceive is a receive waiting for a message (see StartReceive), or a stream (see
// StartStream).
type PendingReceive struct {
	l *Layer
	w *waiter
}

// Cancel withdraws the receive. It reports true when the receive was still waiting: its callback
// will never run. False means a message or an error was already handed to the callback, which
// runs (or ran) anyway; a host that no longer wants that message must PutBack it (S14).
func (p *PendingReceive) Cancel() bool {
	return p.Stop() > 0
}

// Stop ends a stream (or withdraws a receive) and returns the credit it had not used: of the
// credit it started with, exactly the rest is (or was) handed to its callback, some of it
// possibly after Stop returns. 0 means it had already ended.
func (p *PendingReceive) Stop() int {
	l := p.l
	l.mu.Lock()
	defer l.mu.Unlock()
	credit := p.w.mb.removeWaiter(p.w)
	if credit > 0 {
		l.readerLeft(p.w.mb, time.Now(), true)
	}
	return credit
}

// StartReceive begins a receive on channel. When a message is waiting it is returned at once
// with a nil *PendingReceive. Otherwise deliver is called exactly once, later, from a library
// goroutine, with the next message or with the error that ended the receive (ErrClosed), unless
// Cancel returns true first. deliver must not block and must not call Close.
//
// ctx bounds only the wait for the channel's subscription, on the first receive of a plain
// channel (S1). A process channel must belong to this client (*ForeignChannelError, S12); the
// name "X!" of this client receives every process channel message that has no mailbox of its
// own (S13).
func (l *Layer) StartReceive(ctx context.Context, channel string, deliver func(Message, error)) (Message, *PendingReceive, error) {
	if err := ValidateChannelName(channel); err != nil {
		return Message{}, nil, err
	}
	if err := ctx.Err(); err != nil {
		return Message{}, nil, err
	}
	key, err := l.receiveKey(channel)
	if err != nil {
		return Message{}, nil, err
	}
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return Message{}, nil, ErrClosed
		}
		if l.wouldWait(ctx, key) {
			l.mu.Unlock()
			return Message{}, nil, ErrWouldBlock
		}
		now := time.Now()
		mb := l.mailboxLocked(channel, now)
		s, err := l.want(key)
		if err != nil {
			l.mu.Unlock()
			return Message{}, nil, err
		}
		if s.confirmed {
			msg, p := l.takeOrWait(mb, now, deliver)
			l.mu.Unlock()
			return msg, p, nil
		}
		mb.subscribing++
		l.mu.Unlock()
		err = l.confirm(ctx, s)
		l.mu.Lock()
		mb.subscribing--
		if err != nil {
			if mb.plain && mb.idle() {
				l.scheduleRelease(mb) // no one will read what its subscription takes
			}
			l.mu.Unlock()
			return Message{}, nil, err
		}
		l.mu.Unlock()
	}
}

// TakeReceive returns up to limit of the oldest live messages of channel, oldest first, when they
// are waiting and the channel's subscription is confirmed; none otherwise, and nothing changed:
// StartReceive then subscribes or waits. It never blocks, so a host can try it before paying for
// a pending receive, or take several messages at once into a buffer of its own (TimeLeft says
// how long each may stay there; PutBack returns what it will not deliver).
func (l *Layer) TakeReceive(channel string, limit int) ([]Message, error) {
	key, err := l.lockForReceive(channel)
	if err != nil {
		return nil, err
	}
	defer l.mu.Unlock()
	mb := l.mailboxes[channel]
	if s := l.subs[key]; s == nil || !s.confirmed || mb == nil {
		return nil, nil
	}
	now := time.Now()
	var taken []Message
	for len(taken) < limit {
		msg, ok := l.popLocked(mb, now)
		if !ok {
			break
		}
		taken = append(taken, msg)
	}
	return taken, nil
}

// lockForReceive checks channel for a receive that does not wait and returns the subscription it
// needs, with l.mu held; on an error l.mu is not held.
func (l *Layer) lockForReceive(channel string) (subKey, error) {
	if err := ValidateChannelName(channel); err != nil {
		return subKey{}, err
	}
	key, err := l.receiveKey(channel)
	if err != nil {
		return subKey{}, err
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return subKey{}, ErrClosed
	}
	return key, nil
}

// TimeLeft is how long m could still have waited in its mailbox before expiring (S4), at now;
// never negative.
func (l *Layer) TimeLeft(m Message, now time.Time) time.Duration {
	return max(0, l.cfg.Expiry-now.Sub(m.at))
}

// Returned rebuilds a message that a host took and kept, from its body and the time it has left
// now, for PutBack: it expires when it would have expired in its mailbox.
func (l *Layer) Returned(channel string, body []byte, left time.Duration) Message {
	return Message{Channel: channel, Body: body, at: time.Now().Add(left - l.cfg.Expiry)}
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

// popLocked takes the oldest live message of mb, if any, dropping expired ones. l.mu must be held.
func (l *Layer) popLocked(mb *mailbox, now time.Time) (Message, bool) {
	mb.readAt = now
	e, ok, expired := mb.pop(now, l.cfg.Expiry)
	l.countExpired(expired)
	if !ok {
		return Message{}, false
	}
	l.counters.delivered.Add(1)
	return Message{Body: e.body, Channel: mb.name, mb: mb, at: e.at}, true
}

// takeOrWait returns the oldest live message of mb, or registers a waiter. l.mu must be held.
func (l *Layer) takeOrWait(mb *mailbox, now time.Time, deliver func(Message, error)) (Message, *PendingReceive) {
	if msg, ok := l.popLocked(mb, now); ok {
		return msg, nil
	}
	w := &waiter{mb: mb, deliver: deliver, credit: 1, listed: true}
	mb.waiters = append(mb.waiters, w)
	return Message{}, &PendingReceive{l, w}
}

// StartStream starts a standing receive on channel: each of the next credit messages is handed
// to deliver as it arrives, in arrival order, from the dispatch goroutine, without a call per
// message. While it has credit it is first in line for
// the channel's messages; then it ends. Stop ends it earlier; a layer that closes ends it with
// one call deliver(Message{}, ErrClosed). deliver must not block and must not call Close.
//
// It starts only on an empty mailbox, so that its messages keep their order: when messages are
// waiting it returns (nil, nil) and the caller takes them first (TakeReceive or StartReceive).
// It never waits: before the channel's subscription is confirmed it returns ErrWouldBlock (a
// StartReceive on the channel subscribes). The rules of StartReceive for names apply.
func (l *Layer) StartStream(channel string, credit int, deliver func(Message, error)) (*PendingReceive, error) {
	if credit < 1 {
		return nil, fmt.Errorf("channels_nats: a stream's credit must be at least 1, not %d", credit)
	}
	key, err := l.lockForReceive(channel)
	if err != nil {
		return nil, err
	}
	defer l.mu.Unlock()
	if s := l.subs[key]; s == nil || !s.confirmed {
		return nil, ErrWouldBlock
	}
	now := time.Now()
	mb := l.mailboxLocked(channel, now)
	mb.readAt = now
	l.countExpired(mb.dropExpired(now, l.cfg.Expiry))
	if len(mb.entries) > 0 {
		return nil, nil
	}
	w := &waiter{mb: mb, deliver: deliver, credit: credit, listed: true}
	mb.waiters = append(mb.waiters, w)
	return &PendingReceive{l, w}, nil
}

// readerLeft updates mb when a receive stops waiting, with a message or cancelled. l.mu must be held.
func (l *Layer) readerLeft(mb *mailbox, now time.Time, cancelled bool) {
	mb.readAt = now
	if len(mb.waiters) == 0 {
		mb.activeAt = now // the idle grace starts now (S5)
	}
	if cancelled && mb.plain && mb.idle() {
		l.scheduleRelease(mb)
	}
}

// ReceiveRaw waits for the next message on channel and returns its body (see StartReceive and
// Message.Body). When ctx ends first it returns ctx.Err() and loses nothing: a message handed
// over at that moment goes back to the front of its mailbox (S14).
func (l *Layer) ReceiveRaw(ctx context.Context, channel string) ([]byte, error) {
	type result struct {
		msg Message
		err error
	}
	got := make(chan result, 1)
	msg, pending, err := l.StartReceive(ctx, channel, func(m Message, err error) { got <- result{m, err} })
	if err != nil || pending == nil {
		return msg.Body, err
	}
	select {
	case r := <-got:
		return r.msg.Body, r.err
	case <-ctx.Done():
		if !pending.Cancel() {
			if r := <-got; r.err == nil {
				l.PutBack(r.msg)
			}
		}
		return nil, ctx.Err()
	}
}

// Receive is ReceiveRaw with the body decoded into a map of its own.
func (l *Layer) Receive(ctx context.Context, channel string) (map[string]any, error) {
	body, err := l.ReceiveRaw(ctx, channel)
	if err != nil {
		return nil, err
	}
	return DecodeMessage(body)
}

// PutBack returns received messages that their receiver could not take (its task was cancelled,
// its event loop closed, a host buffer it will not deliver) to the front of their mailboxes, in
// their order, or to the next waiting receives (S14). If a plain channel was released meanwhile,
// its messages are re-published on its subject. A host that kept only the body and the channel
// name may pass Message{Channel: name, Body: body} (it gets a full expiry again), or Returned.
func (l *Layer) PutBack(msgs ...Message) {
	now := time.Now()
	inserted := map[*mailbox]int{} // put-backs of this call already at the front of a mailbox
	handBack := map[string][][]byte{}
	handedOver := false
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	for _, msg := range msgs {
		name, at := msg.Channel, msg.at
		if msg.mb != nil {
			name = msg.mb.name
		}
		if name == "" {
			continue
		}
		if at.IsZero() {
			at = now
		}
		uncount(&l.counters.delivered) // it was counted when it was handed over
		if now.Sub(at) >= l.cfg.Expiry {
			l.countExpired(1) // no time left: it would have expired in the mailbox (S4)
			continue
		}
		mb := l.mailboxes[name]
		released := msg.mb != nil && mb != msg.mb && msg.mb.plain
		switch {
		case released || mb == nil && !IsProcessChannel(name):
			subject := l.subj.channel(name)
			handBack[subject] = append(handBack[subject], msg.Body)
		case mb == nil:
			l.countNoMailbox(name)
		default:
			if w := mb.takeWaiter(); w != nil {
				// Delivered by the dispatch goroutine, in order with everything else (callbacks
				// never run on the caller's goroutine).
				l.handOver(w, Message{Body: msg.Body, Channel: name, mb: mb, at: at}, now)
				handedOver = true
			} else {
				mb.insert(inserted[mb], entry{at, msg.Body})
				inserted[mb]++
			}
		}
	}
	nc := l.nc
	l.mu.Unlock()
	if handedOver {
		select {
		case l.kick <- struct{}{}:
		default: // a kick is pending: the dispatcher will see these too
		}
	}
	for subject, bodies := range handBack {
		l.handBack(nc, subject, bodies)
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

// mailboxLocked returns the mailbox of name, creating it. l.mu must be held.
func (l *Layer) mailboxLocked(name string, now time.Time) *mailbox {
	if mb := l.mailboxes[name]; mb != nil {
		return mb
	}
	mb := newMailbox(name, l.cfg.capacityOf(name), now)
	l.mailboxes[name] = mb
	return mb
}

// NewChannel returns a new process channel name, "<prefix>.<client id>!<32 hex>" (prefix ""
// means "specific"), with its mailbox ready: messages sent to it from now on are kept until
// received, expired or reclaimed (S5). It returns after the server confirmed the process
// subscription (S1).
func (l *Layer) NewChannel(ctx context.Context, prefix string) (string, error) {
	if prefix == "" {
		prefix = "specific"
	}
	if err := validatePrefix(prefix); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	nonLocal := prefix + "." + l.clientID
	name := nonLocal + "!" + randomHex(16)
	if err := ValidateChannelName(name); err != nil {
		return "", err
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return "", ErrClosed
	}
	if l.wouldWait(ctx, processKey(nonLocal)) {
		l.mu.Unlock()
		return "", ErrWouldBlock
	}
	s, err := l.want(processKey(nonLocal))
	if err != nil {
		l.mu.Unlock()
		return "", err
	}
	mb := l.mailboxLocked(name, time.Now())
	mb.subscribing++
	l.mu.Unlock()
	err = l.confirm(ctx, s)
	l.mu.Lock()
	mb.subscribing--
	l.mu.Unlock()
	if err != nil {
		return "", err
	}
	return name, nil
}

// GroupAdd makes channel a member of group in this client (S18: membership lives here). It
// returns after the server confirmed the group subscription (S1). Adding a member twice is not
// an error. If ctx ends first, a membership this call made is rolled back.
func (l *Layer) GroupAdd(ctx context.Context, group, channel string) error {
	if err := ValidateGroupName(group); err != nil {
		return err
	}
	if err := ValidateChannelName(channel); err != nil {
		return err
	}
	nonLocal, _, process := strings.Cut(channel, "!")
	if process && !l.owns(channel) {
		return &ForeignChannelError{channel}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	keys := [2]subKey{memberKey(group, channel), channelKey(channel)}
	if process {
		keys = [2]subKey{groupKey(group), processKey(nonLocal)}
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	if l.wouldWait(ctx, keys[:]...) {
		l.mu.Unlock()
		return ErrWouldBlock
	}
	now := time.Now()
	mb := l.mailboxLocked(channel, now)
	g := l.groups[group]
	if g == nil {
		g = &groupMembers{process: map[string]*mailbox{}, plain: map[string]*mailbox{}}
		l.groups[group] = g
	}
	members := g.plain
	if process {
		members = g.process
	}
	_, already := members[channel]
	if !already {
		members[channel] = mb
		mb.groups++
		mb.readAt = now
	}
	var subs []*subscription
	var err error
	for _, k := range keys {
		var s *subscription
		if s, err = l.want(k); err != nil {
			break
		}
		subs = append(subs, s)
	}
	mb.subscribing++
	l.mu.Unlock()
	if err == nil {
		err = l.confirm(ctx, subs...)
	}
	l.mu.Lock()
	mb.subscribing--
	if err != nil && !already {
		l.removeMember(group, channel)
	}
	if mb.plain && mb.idle() {
		l.scheduleRelease(mb) // a Flush overtook the membership: nobody reads this channel
	}
	l.mu.Unlock()
	return err
}

// GroupDiscard removes channel from group in this client. Removing a channel that is not a
// member is not an error. It does not wait on the network.
func (l *Layer) GroupDiscard(group, channel string) error {
	if err := ValidateGroupName(group); err != nil {
		return err
	}
	if err := ValidateChannelName(channel); err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	l.removeMember(group, channel)
	return nil
}

// removeMember ends a membership and drops the subscriptions only it needed. l.mu must be held.
func (l *Layer) removeMember(name, channel string) bool {
	g := l.groups[name]
	if g == nil {
		return false
	}
	members := g.plain
	if IsProcessChannel(channel) {
		members = g.process
	}
	mb, ok := members[channel]
	if !ok {
		return false
	}
	delete(members, channel)
	mb.groups--
	if g.size() == 0 {
		delete(l.groups, name)
	}
	if !mb.plain {
		if len(g.process) == 0 {
			l.drop(groupKey(name))
		}
		return true
	}
	l.drop(memberKey(name, channel))
	if mb.idle() {
		l.scheduleRelease(mb)
	}
	return true
}

// Flush resets this client's state (S15): mailboxes, memberships and subscriptions. Receives
// that are waiting keep waiting on emptied mailboxes, with the subscriptions they need. It does
// not wait on the network and does not fail on a dead connection.
func (l *Layer) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	kept := map[string]*mailbox{}
	keptProcesses := map[string]bool{}
	for name, mb := range l.mailboxes {
		clear(mb.entries)
		mb.entries, mb.groups, mb.dropping = nil, 0, false
		l.drops.recovered("capacity", name)
		if len(mb.waiters) == 0 && mb.subscribing == 0 {
			mb.discharged = true
			continue
		}
		kept[name] = mb
		if nonLocal, _, ok := strings.Cut(name, "!"); ok {
			keptProcesses[nonLocal] = true
		}
	}
	l.mailboxes, l.groups = kept, map[string]*groupMembers{}
	for k := range l.subs {
		needed := k.kind == subProcess && keptProcesses[k.name] || k.kind == subChannel && kept[k.name] != nil
		if !needed {
			l.drop(k)
		}
	}
	return nil
}

// scheduleRelease releases plain channel mailbox mb once it has been idle for ReleaseLinger since
// the last reader left (S6). l.mu must be held.
func (l *Layer) scheduleRelease(mb *mailbox) {
	if mb.discharged {
		return
	}
	mb.releaseAt = time.Now().Add(l.cfg.ReleaseLinger)
	if !mb.lingering {
		mb.lingering = true
		l.releaseAfter(mb, l.cfg.ReleaseLinger)
	}
}

// releaseAfter arms the linger timer of mb; a reader that left meanwhile pushes the release back.
func (l *Layer) releaseAfter(mb *mailbox, d time.Duration) {
	time.AfterFunc(d, func() {
		l.mu.Lock()
		if wait := time.Until(mb.releaseAt); wait > 0 && !l.closed && !mb.discharged {
			l.releaseAfter(mb, wait)
			l.mu.Unlock()
			return
		}
		mb.lingering = false
		if l.closed || mb.discharged || !mb.idle() {
			l.mu.Unlock()
			return
		}
		bodies := l.release(mb, time.Now())
		nc := l.nc
		l.mu.Unlock()
		if len(bodies) > 0 {
			l.handBack(nc, l.subj.channel(mb.name), bodies)
		}
	})
}

// release removes plain channel mailbox mb and its subscription and returns the messages it still
// held, to be handed back (S6). l.mu must be held.
func (l *Layer) release(mb *mailbox, now time.Time) [][]byte {
	l.discard(mb, now)
	l.drop(channelKey(mb.name))
	bodies := make([][]byte, len(mb.entries))
	for i, e := range mb.entries {
		bodies[i] = e.body
	}
	mb.entries = nil
	return bodies
}

// discard removes mb from the layer, counting what expired in it. l.mu must be held.
func (l *Layer) discard(mb *mailbox, now time.Time) {
	l.countExpired(mb.dropExpired(now, l.cfg.Expiry))
	delete(l.mailboxes, mb.name)
	mb.discharged = true
	l.drops.recovered("capacity", mb.name)
}
