package layer

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// ChannelHeader is the NATS header that carries the full name of a process channel.
const ChannelHeader = "Channel"

// handoff is a message given to a waiting receive or stream.
type handoff struct {
	w   *waiter
	msg Message
}

// handoffs holds the messages given to waiters, in the order they were given (under the layer
// lock), until they are delivered outside that lock, under Layer.routing: deliveries made one
// batch at a time, in that order, keep the order of arrival, put-backs included (S10, S14).
type handoffs struct {
	queued []handoff // guarded by Layer.mu
	spare  []handoff // guarded by Layer.routing: queued's next backing array, so delivering allocates nothing
}

// Every subscription delivers into the inbox, in arrival order (nats.go's reader puts them
// there), and the inbox is routed in that order: a message is taken from it and routed under
// Layer.routing, one at a time, by one of two goroutines.
//
// Usually nats.go's reader routes what it put there itself, before it reads the socket again
// (routeArrived, called by socket.Read): a message reaches its mailbox or its waiting receive
// on the thread that read it. Handing each to the dispatcher goroutine woke that goroutine and,
// on an idle runtime, a second thread looking for work, for every message of a quiet connection.
//
// The reader waits for no lock to start routing a message (a large group's fan-out takes the
// layer lock back between its chunks like any routing), and when routing what one read brought
// takes longer than routeBudget (a burst, a large group), it hands the rest to the dispatcher
// and reads on. So the connection is still read while the dispatcher routes, and when that
// falls behind, nats.go drops and counts what the inbox cannot hold (S3), as when the
// dispatcher routed every message. The dispatcher hands routing back once it finds the inbox
// empty. A connection that fails (its reader may have left messages in the inbox) wakes the
// dispatcher too.

// routeBudget is how long the reader routes before it hands the rest of the inbox over.
const routeBudget = time.Millisecond

// dispatch routes the inbox when it is handed over, and delivers the handoffs queued by others
// (a receive's put-back).
func (l *Layer) dispatch() {
	defer l.routines.Done()
	for {
		select {
		case <-l.kick:
		case <-l.done:
			l.routing.Lock()
			l.deliverHandoffs(true) // given before the close: delivered before its ErrClosed
			l.routing.Unlock()
			return
		}
		l.routeHandedOver() // and delivers the handoffs
	}
}

// routeArrived routes the inbox on the calling goroutine (nats.go's reader, before each read of
// the socket) unless the dispatcher routes it now. When another goroutine holds the routing or
// the layer lock, or past routeBudget, it leaves the rest to the dispatcher and wakes it.
func (l *Layer) routeArrived() { l.routeArrivedBy(false) }

// routeArrivedOnHost is routeArrived on the host's thread (OnReadable). There a group message
// with more members here than one chunk, whose first chunk woke receives, is delivered to that
// chunk only: the dispatcher delivers it to the others, on another thread, while the host
// returns to run the consumers the first chunk woke.
func (l *Layer) routeArrivedOnHost() { l.routeArrivedBy(true) }

func (l *Layer) routeArrivedBy(host bool) {
	if len(l.inbox) == 0 {
		return
	}
	if l.dispatcherRoutes.Load() || !l.routing.TryLock() {
		l.kickDispatcher() // it routes what it finds in the inbox: these messages included
		return
	}
	defer l.routing.Unlock()
	start := time.Now()
	for {
		m, ok := l.nextArrived()
		if !ok {
			break
		}
		routed := l.route(m, false, host)
		if l.fanOutRest != nil { // the dispatcher delivers it to the other members, then routes on
			l.deliverHandoffs(false)
			l.dispatcherRoutes.Store(true)
			l.kickDispatcher()
			return
		}
		if !routed || len(l.inbox) > 0 && time.Since(start) > routeBudget {
			if !routed {
				l.held = m // the dispatcher routes it first
			}
			l.dispatcherRoutes.Store(true)
			l.kickDispatcher() // it delivers the handoffs too
			return
		}
	}
	if !l.deliverHandoffs(false) {
		l.kickDispatcher()
	}
}

// handOverInbox makes the dispatcher route what the inbox holds: the reader of a connection that
// failed may have left messages there, and it will not read again.
func (l *Layer) handOverInbox() {
	if len(l.inbox) > 0 {
		l.kickDispatcher()
	}
}

// routeHandedOver is the dispatcher's routing, when it is woken: whatever the inbox holds, a
// message at a time (the reader takes no lock another goroutine holds), until it is empty; then
// the reader routes again.
func (l *Layer) routeHandedOver() {
	for {
		l.routing.Lock()
		if l.fanOutRest != nil {
			l.continueFanOut()
		}
		m, more := l.nextArrived()
		if more {
			l.dispatcherRoutes.Store(true)
			l.route(m, true, false)
		} else {
			l.dispatcherRoutes.Store(false)
		}
		l.deliverHandoffs(true)
		l.routing.Unlock()
		if !more {
			return
		}
	}
}

// kickDispatcher wakes the dispatcher: it has handoffs to deliver, or the inbox to route.
func (l *Layer) kickDispatcher() {
	select {
	case l.kick <- struct{}{}:
	default: // a kick is pending: the dispatcher will see this one's work too
	}
}

// nextArrived takes the next message to route: the one the reader handed over unrouted, then
// the inbox's, in order. l.routing must be held.
func (l *Layer) nextArrived() (*nats.Msg, bool) {
	if m := l.held; m != nil {
		l.held = nil
		return m, true
	}
	select {
	case m := <-l.inbox:
		return m, true
	default:
		return nil, false
	}
}

// deliverHandoffs calls the waiters of the queued handoffs, in order. l.routing must be held.
// Unless wait is set it does nothing while another goroutine holds the layer lock, and returns
// false.
func (l *Layer) deliverHandoffs(wait bool) bool {
	if wait {
		l.mu.Lock()
	} else if !l.mu.TryLock() {
		return false
	}
	batch := l.handoffs.queued
	l.handoffs.queued = l.handoffs.spare[:0]
	l.mu.Unlock()
	if len(batch) > 0 {
		if l.cfg.Deliveries != nil {
			l.cfg.Deliveries(true)
		}
		for _, h := range batch {
			l.handTo(h.w.op, h.w.to, h.msg)
		}
		if l.cfg.Deliveries != nil {
			l.cfg.Deliveries(false)
		}
		clear(batch) // let the bodies be collected
	}
	l.handoffs.spare = batch[:0]
	return true
}

// handTo delivers msg to a receive, or gives it back when the receive was cancelled after the
// message was handed over (S14).
func (l *Layer) handTo(op *Op, to Receiver, msg Message) {
	w := op.recv
	// A receive that parks was given the message by takeWaiter (opHanding): it cannot be
	// cancelled meanwhile, and it parks once it has it (rearm.go).
	parks := w != nil && w.parks() && op.state.Load() != opPending
	if !parks && !op.finish() {
		l.giveBack(msg)
		return
	}
	if w != nil { // Retract gives it back from there, with no closure to allocate
		w.msg = msg
		w.handed.Store(true)
		if parks {
			w.park()
		}
	} else {
		op.retractWith(func() { l.giveBack(msg) })
	}
	to.Received(msg, nil)
}

// route routes m to its mailboxes and waiting receives, and reports true; false when wait is
// not set and another goroutine holds the layer lock: then m is not routed yet. firstChunk: a
// group message to more members than a chunk reaches the first chunk only, and the rest is left
// in l.fanOutRest.
func (l *Layer) route(m *nats.Msg, wait, firstChunk bool) bool {
	if err := ValidateFrame(m.Data); err != nil {
		l.countBadFrame(m.Subject, err.Error())
		return true
	}
	rest, ok := strings.CutPrefix(m.Subject, l.cfg.Prefix+".")
	if !ok {
		return true // not ours: cannot happen with the subjects this layer subscribes to
	}
	kind, name, _ := strings.Cut(rest, ".")

	if wait {
		l.mu.Lock()
	} else if !l.mu.TryLock() {
		return false
	}
	if l.closed {
		l.mu.Unlock()
		return true
	}
	now := time.Now() // the expiry clock starts in the mailbox, not while waiting for the lock (S4)
	switch kind {
	case "pc":
		target := ""
		if vs := m.Header[ChannelHeader]; len(vs) > 0 {
			target = vs[0]
		}
		nonLocal, _, isProcess := strings.Cut(target, "!")
		if !isProcess || nonLocal != name {
			l.mu.Unlock()
			l.countBadFrame(m.Subject, fmt.Sprintf("its %s header %s does not name a process channel of %s", ChannelHeader, quoteName(target), name))
			return true
		}
		mb := l.mailboxes[target]
		if mb == nil {
			mb = l.mailboxes[nonLocal+"!"] // S13: the process-prefix mailbox takes the rest
		}
		if mb == nil {
			l.countNoMailbox(m.Subject, target)
		} else {
			l.enqueue(mb, m.Data, now)
		}
	case "ch":
		if mb := l.mailboxes[name]; mb != nil && mb.plain {
			l.enqueue(mb, m.Data, now)
		} else {
			l.handBack(m.Subject, [][]byte{m.Data}) // it was in flight when the channel was released
		}
	case "grp":
		g := l.groups[name]
		if g == nil {
			break
		}
		if queue := m.Sub.Queue; queue != "" {
			if mb := g.plain[strings.TrimPrefix(queue, l.cfg.Prefix+".ch.")]; mb != nil {
				l.enqueue(mb, m.Data, now)
			}
			break
		}
		if !l.fanOut(&fanOutOf{name: name, g: g, body: m.Data, now: now}, firstChunk) {
			return true // the layer closed while the lock was let go; l.mu is not held
		}
	}
	l.mu.Unlock()
	return true
}

// fanOutChunk is how many members of a group one hold of the layer lock delivers a message to.
// A receive on another thread, which needs the lock too, then waits for one chunk, not for the
// whole group: 10,000 members take about a millisecond.
const fanOutChunk = 256

// fanOutOf is one group message on its way to the process-channel members of its group.
type fanOutOf struct {
	name    string // the group's
	g       *groupMembers
	body    []byte
	now     time.Time
	members []*mailbox // g.members() when it began
	next    int        // the first of members still to get it
	changes uint64     // g.changes when the members were listed
}

// fanOut enqueues f's body to every process-channel member of its group; they share body, and
// receivers copy (S9). l.mu must be held. Past fanOutChunk members it lets go of the lock between
// chunks and delivers the handoffs so far (it holds l.routing: nothing else routes or delivers
// meanwhile, so the order of arrival holds in each mailbox and for each receive) and, when the
// group changed meanwhile, skips those no longer members. With firstChunk it stops after a first
// chunk that woke receives and leaves the rest in l.fanOutRest (continueFanOut); where nobody
// waits (a backlog), a hand-over would only wake the dispatcher. It returns with l.mu held,
// unless the layer closed meanwhile (false, l.mu not held).
func (l *Layer) fanOut(f *fanOutOf, firstChunk bool) bool {
	members := f.g.members()
	if len(members) <= fanOutChunk {
		for _, mb := range members {
			l.enqueue(mb, f.body, f.now)
		}
		return true
	}
	f.members, f.changes = members, f.g.changes
	return l.fanOutChunks(f, firstChunk)
}

// continueFanOut delivers the group message left in l.fanOutRest to the members it has not
// reached yet. l.routing must be held.
func (l *Layer) continueFanOut() {
	f := l.fanOutRest
	l.fanOutRest = nil
	l.mu.Lock()
	if l.fanOutChunks(f, false) {
		l.mu.Unlock()
	}
}

// fanOutChunks is fanOut's delivery to f.members from f.next on, a chunk per hold of the layer
// lock.
func (l *Layer) fanOutChunks(f *fanOutOf, firstChunk bool) bool {
	members := f.members
	for start := f.next; start < len(members); start += fanOutChunk {
		if start > 0 {
			if firstChunk && len(l.handoffs.queued) > 0 {
				f.next, l.fanOutRest = start, f
				return true
			}
			// Let go of the lock: a receive waiting for it takes it, and the members served
			// so far get their message now, not after the whole group.
			l.mu.Unlock()
			l.deliverHandoffs(true)
			if l.betweenChunks != nil {
				l.betweenChunks()
			}
			l.mu.Lock()
			if l.closed {
				l.mu.Unlock()
				return false
			}
			if l.groups[f.name] != f.g { // flushed, or its last member left
				return true
			}
		}
		for _, mb := range members[start:min(start+fanOutChunk, len(members))] {
			if f.g.changes != f.changes && f.g.member(mb.name) != mb {
				continue
			}
			l.enqueue(mb, f.body, f.now)
		}
	}
	return true
}

// enqueue puts one arrived message into mb, or hands it straight to a waiting receive.
// l.mu must be held.
func (l *Layer) enqueue(mb *mailbox, body []byte, now time.Time) {
	mb.activeAt = now
	if w := mb.takeWaiter(); w != nil {
		l.handOver(w, Message{Body: body, Channel: mb.name, mb: mb, at: now}, now)
		return
	}
	ok, expired := mb.push(entry{now, body}, l.cfg.Expiry)
	l.countExpired(expired)
	if !ok {
		mb.dropping = true
		capacity := mb.capacity
		l.drops.drop("capacity", mb.name, 1, now, func(total uint64) string {
			return fmt.Sprintf("channels_nats: mailbox for %s is full (capacity %d); %d message(s) dropped so far", mb.name, capacity, total)
		})
		l.counters.capacity.Add(1)
		return
	}
	if mb.dropping {
		mb.dropping = false
		if n := l.drops.recovered("capacity", mb.name); n > 0 {
			l.log(LevelWarning, fmt.Sprintf("channels_nats: mailbox for %s has room again after dropping %d message(s)", mb.name, n))
		}
	}
}

// handOver queues msg for w, which takeWaiter returned. l.mu must be held.
func (l *Layer) handOver(w *waiter, msg Message, now time.Time) {
	l.readerLeft(msg.mb, now, false)
	l.counters.delivered.Add(1)
	l.handoffs.queued = append(l.handoffs.queued, handoff{w, msg})
}

func (l *Layer) countExpired(n int) {
	if n > 0 {
		l.counters.expired.Add(uint64(n))
	}
}

// countNoMailbox counts a message for a process channel that has no mailbox here. Warnings are
// limited per subject, not per name: the names come from whoever publishes.
func (l *Layer) countNoMailbox(subject, channel string) {
	l.drops.drop("no mailbox", subject, 1, time.Now(), func(total uint64) string {
		return fmt.Sprintf("channels_nats: dropped a message on %s for %s: this client has no mailbox for it (reclaimed "+
			"after mailbox_grace, or never made) and nothing receives on its prefix; %d so far on this subject",
			subject, quoteName(channel), total)
	})
	l.counters.noMailbox.Add(1)
}

func (l *Layer) countBadFrame(subject, why string) {
	l.drops.drop("bad frame", subject, 1, time.Now(), func(total uint64) string {
		return fmt.Sprintf("channels_nats: dropped a frame on %s that is not a Channels message (%s); %d so far. "+
			"Whatever publishes on this subject must send a msgpack map with string keys.", subject, why, total)
	})
	l.counters.badFrame.Add(1)
}

// handBack re-publishes messages of a released plain channel on its subject, so another reader
// of the queue group gets them (S6). The link writes them after the UNSUB it was given first,
// so they do not come back here. l.mu may be held.
func (l *Layer) handBack(subject string, bodies [][]byte) {
	l.link.republish(subject, bodies)
	l.counters.handedBack.Add(uint64(len(bodies)))
}
