package layer

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// ChannelHeader is the NATS header that carries the full name of a process channel.
const ChannelHeader = "Channel"

// handoff is a message given to a waiting receive, delivered after the layer lock is released.
type handoff struct {
	w   *waiter
	msg Message
}

// routeScratch is reused for every message, so routing allocates nothing. Only the dispatcher
// goroutine touches it.
type routeScratch struct {
	handoffs []handoff
}

func (sc *routeScratch) reset() {
	clear(sc.handoffs)
	sc.handoffs = sc.handoffs[:0]
}

// dispatch is the single consumer of every subscription (S10): it validates each frame once and
// routes it to its mailboxes in arrival order.
func (l *Layer) dispatch() {
	defer l.routines.Done()
	for {
		select {
		case m := <-l.inbox:
			l.route(m)
		case <-l.done:
			return
		}
	}
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
	sc := &l.scratch
	defer sc.reset()
	var handBack bool

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
			l.countBadFrame(m.Subject, fmt.Sprintf("its %s header %q does not name a process channel of %s", ChannelHeader, target, name))
			return
		}
		mb := l.mailboxes[target]
		if mb == nil {
			mb = l.mailboxes[nonLocal+"!"] // S13: the process-prefix mailbox takes the rest
		}
		if mb == nil {
			l.countNoMailbox(target)
		} else {
			l.enqueue(mb, m.Data, now, sc)
		}
	case "ch":
		if mb := l.mailboxes[name]; mb != nil && mb.plain {
			l.enqueue(mb, m.Data, now, sc)
		} else {
			handBack = true // it was in flight when the channel was released
		}
	case "grp":
		g := l.groups[name]
		if g == nil {
			break
		}
		if queue := m.Sub.Queue; queue != "" {
			if mb := g.plain[strings.TrimPrefix(queue, l.cfg.Prefix+".ch.")]; mb != nil {
				l.enqueue(mb, m.Data, now, sc)
			}
			break
		}
		for _, mb := range g.process { // every member shares m.Data; receivers copy (S9)
			l.enqueue(mb, m.Data, now, sc)
		}
	}
	nc := l.nc
	l.mu.Unlock()

	if handBack {
		l.handBack(nc, m.Subject, [][]byte{m.Data})
	}
	if len(sc.handoffs) == 0 {
		return
	}
	if l.cfg.Deliveries != nil {
		l.cfg.Deliveries(true)
		defer l.cfg.Deliveries(false)
	}
	for _, h := range sc.handoffs {
		h.w.deliver(h.msg, nil)
	}
}

// enqueue puts one arrived message into mb, or hands it straight to a waiting receive.
// l.mu must be held.
func (l *Layer) enqueue(mb *mailbox, body []byte, now time.Time, sc *routeScratch) {
	mb.activeAt = now
	if w := mb.takeWaiter(); w != nil {
		l.readerLeft(mb, now, false)
		l.counters.delivered.Add(1)
		sc.handoffs = append(sc.handoffs, handoff{w, Message{Body: body, Channel: mb.name, mb: mb, at: now}})
		return
	}
	if len(mb.entries) >= mb.capacity {
		l.countExpired(mb.dropExpired(now, l.cfg.Expiry))
	}
	if len(mb.entries) >= mb.capacity {
		l.counters.capacity.Add(1)
		mb.dropping = true
		capacity := mb.capacity
		l.drops.drop("capacity", mb.name, 1, now, func(total uint64) string {
			return fmt.Sprintf("channels_nats: mailbox for %s is full (capacity %d); %d message(s) dropped so far", mb.name, capacity, total)
		})
		return
	}
	mb.entries = append(mb.entries, entry{now, body})
	if mb.dropping {
		mb.dropping = false
		if n := l.drops.recovered("capacity", mb.name); n > 0 {
			l.log(LevelWarning, fmt.Sprintf("channels_nats: mailbox for %s has room again after dropping %d message(s)", mb.name, n))
		}
	}
}

func (l *Layer) countExpired(n int) {
	if n > 0 {
		l.counters.expired.Add(uint64(n))
	}
}

func (l *Layer) countNoMailbox(channel string) {
	l.counters.noMailbox.Add(1)
	l.drops.drop("no mailbox", channel, 1, time.Now(), func(total uint64) string {
		return fmt.Sprintf("channels_nats: dropped a message for %s: this client has no mailbox for it (reclaimed "+
			"after mailbox_grace, or never made) and nothing receives on its prefix; %d so far", channel, total)
	})
}

func (l *Layer) countBadFrame(subject, why string) {
	l.counters.badFrame.Add(1)
	l.drops.drop("bad frame", subject, 1, time.Now(), func(total uint64) string {
		return fmt.Sprintf("channels_nats: dropped a frame on %s that is not a Channels message (%s); %d so far. "+
			"Whatever publishes on this subject must send a msgpack map with string keys.", subject, why, total)
	})
}

// handBack re-publishes messages of a released plain channel on its subject, so another reader
// of the queue group gets them (S6). The UNSUB went out first on the same connection, so they
// do not come back here.
func (l *Layer) handBack(nc *nats.Conn, subject string, bodies [][]byte) {
	for _, body := range bodies {
		if err := nc.Publish(subject, body); err != nil {
			l.log(LevelWarning, fmt.Sprintf("channels_nats: could not hand back %d message(s) on %s (%s)", len(bodies), subject, redact(err.Error())))
			return
		}
		l.counters.handedBack.Add(1)
	}
}
