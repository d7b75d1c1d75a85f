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
// lock), until the dispatch goroutine delivers them outside the lock. One goroutine delivering in
// that order keeps the order of arrival, put-backs included (S10, S14).
type handoffs struct {
	queued []handoff // guarded by Layer.mu
	spare  []handoff // the dispatcher's: queued's next backing array, so delivering allocates nothing
}

// dispatch is the single consumer of every subscription (S10): it validates each frame once and
// routes it to its mailboxes in arrival order. It also delivers every handoff.
func (l *Layer) dispatch() {
	defer l.routines.Done()
	for {
		select {
		case m := <-l.inbox:
			l.route(m)
		case <-l.kick:
		case <-l.done:
			l.deliverHandoffs() // given before the close: delivered before its ErrClosed
			return
		}
		l.deliverHandoffs()
	}
}

// deliverHandoffs calls the waiters of the queued handoffs, in order. Only the dispatch goroutine
// calls it.
func (l *Layer) deliverHandoffs() {
	l.mu.Lock()
	batch := l.handoffs.queued
	l.handoffs.queued = l.handoffs.spare[:0]
	l.mu.Unlock()
	if len(batch) > 0 {
		if l.cfg.Deliveries != nil {
			l.cfg.Deliveries(true)
		}
		for _, h := range batch {
			l.handTo(h.w.op, h.w.deliver, h.msg)
		}
		if l.cfg.Deliveries != nil {
			l.cfg.Deliveries(false)
		}
		clear(batch) // let the bodies be collected
	}
	l.handoffs.spare = batch[:0]
}

// handTo delivers msg to a receive, or gives it back when the receive was cancelled after the
// message was handed over (S14).
func (l *Layer) handTo(op *Op, deliver func(Message, error), msg Message) {
	if !op.finish() {
		l.giveBack(msg)
		return
	}
	if w := op.recv; w != nil { // Retract gives it back from there, with no closure to allocate
		w.msg = msg
		w.handed.Store(true)
	} else {
		op.retractWith(func() { l.giveBack(msg) })
	}
	deliver(msg, nil)
}

func (l *Layer) route(m *nats.Msg) {
	if err := ValidateFrame(m.Data); err != nil {
		l.countBadFrame(m.Subject, err.Error())
		return
	}
	rest, ok := strings.CutPrefix(m.Subject, l.cfg.Prefix+".")
	if !ok {
		return // not ours: cannot happen with the subjects this layer subscribes to
	}
	kind, name, _ := strings.Cut(rest, ".")

	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
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
			return
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
		if !l.fanOut(name, g, m.Data, now) {
			return // the layer closed while the lock was let go; l.mu is not held
		}
	}
	l.mu.Unlock()
}

// fanOutChunk is how many members of a group one hold of the layer lock delivers a message to.
// A receive on another thread, which needs the lock too, then waits for one chunk, not for the
// whole group: 10,000 members take the dispatcher about a millisecond.
const fanOutChunk = 256

// fanOut enqueues body to every process-channel member of g, the group name names; they share
// body, and receivers copy (S9). l.mu must be held. Past fanOutChunk members it lets go of the
// lock between chunks and delivers the handoffs so far (the dispatcher is the only goroutine
// that routes and delivers, so the order of arrival holds in each mailbox and for each receive)
// and, when g changed meanwhile, skips those no longer members. It returns with l.mu held,
// unless the layer closed meanwhile (false, l.mu not held).
func (l *Layer) fanOut(name string, g *groupMembers, body []byte, now time.Time) bool {
	if len(g.process) <= fanOutChunk {
		for _, mb := range g.process {
			l.enqueue(mb, body, now)
		}
		return true
	}
	members := l.fanOutScratch[:0]
	for _, mb := range g.process {
		members = append(members, mb)
	}
	defer func() {
		clear(members) // no mailbox stays reachable from here
		l.fanOutScratch = members[:0]
	}()
	changes := g.changes
	for start := 0; start < len(members); start += fanOutChunk {
		if start > 0 {
			// Let go of the lock: a receive waiting for it takes it, and the members served
			// so far get their message now, not after the whole group.
			l.mu.Unlock()
			l.deliverHandoffs()
			if l.betweenChunks != nil {
				l.betweenChunks()
			}
			l.mu.Lock()
			if l.closed {
				l.mu.Unlock()
				return false
			}
			if l.groups[name] != g { // flushed, or its last member left
				return true
			}
		}
		for _, mb := range members[start:min(start+fanOutChunk, len(members))] {
			if g.changes != changes && g.process[mb.name] != mb {
				continue
			}
			l.enqueue(mb, body, now)
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
