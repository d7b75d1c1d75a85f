package layer

import (
	"fmt"
	"time"
)

// housekeep runs the periodic work: idle mailbox reclaim (S5, S6), expiry of waiting messages
// (S4), group expiry (S18) and slow-consumer accounting (S3).
func (l *Layer) housekeep() {
	defer l.routines.Done()
	tick := time.NewTicker(l.sweepInterval())
	defer tick.Stop()
	for {
		select {
		case now := <-tick.C:
			l.sweep(now)
		case <-l.wake:
			l.pollSlowConsumers()
		case <-l.done:
			return
		}
	}
}

// sweepInterval is half the shortest of the timeouts the sweep enforces, between 5 ms and 1 s.
func (l *Layer) sweepInterval() time.Duration {
	d := min(l.cfg.MailboxGrace, l.cfg.GroupExpiry, l.cfg.Expiry) / 2
	return min(max(d, 5*time.Millisecond), time.Second)
}

func (l *Layer) sweep(now time.Time) {
	var expired []string

	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	for _, mb := range l.mailboxes {
		l.countExpired(mb.dropExpired(now, l.cfg.Expiry))
		switch {
		case mb.idle() && now.Sub(mb.activeAt) > l.cfg.MailboxGrace:
			switch {
			case mb.plain:
				l.release(mb, now) // what it holds is handed back (S6)
			case len(mb.entries) == 0:
				l.discard(mb, now)
			default:
				// Its messages wait for a reader until they expire (counted then), and the
				// mailbox with them: discarding it would lose them uncounted.
			}
		case mb.groups > 0 && !mb.waitedOn() && now.Sub(mb.readAt) > l.cfg.GroupExpiry:
			expired = append(expired, mb.name)
		}
	}
	for _, channel := range expired {
		l.expireMember(channel)
	}
	for _, s := range l.subs {
		l.retireDrops(s)
	}
	l.mu.Unlock()
}

// expireMember takes channel out of every group, because nothing read it for GroupExpiry (S18).
// l.mu must be held.
func (l *Layer) expireMember(channel string) {
	var left []string
	for name, g := range l.groups {
		if g.member(channel) != nil {
			left = append(left, name)
		}
	}
	for _, name := range left {
		l.removeMember(name, channel)
	}
	l.log(LevelWarning, fmt.Sprintf("channels_nats: %s left %d group(s) after %s without a reader (group_expiry); "+
		"a consumer that stops reading should call group_discard", channel, len(left), l.cfg.GroupExpiry))
	l.counters.groupsExpired.Add(uint64(len(left)))
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
		defer l.mu.Unlock()
		if wait := time.Until(mb.releaseAt); wait > 0 && !l.closed && !mb.discharged {
			l.releaseAfter(mb, wait)
			return
		}
		mb.lingering = false
		if !l.closed && !mb.discharged && mb.idle() {
			l.release(mb, time.Now())
		}
	})
}

// release removes plain channel mailbox mb and its subscription and hands back the messages it
// still held (S6). l.mu must be held.
func (l *Layer) release(mb *mailbox, now time.Time) {
	l.discard(mb, now)
	l.drop(channelKey(mb.name))
	if len(mb.entries) == 0 {
		return
	}
	bodies := make([][]byte, len(mb.entries))
	for i, e := range mb.entries {
		bodies[i] = e.body
	}
	mb.entries = nil
	l.handBack(l.subj.channel(mb.name), bodies)
}

// discard removes mb from the layer, counting what expired in it. l.mu must be held.
func (l *Layer) discard(mb *mailbox, now time.Time) {
	l.countExpired(mb.dropExpired(now, l.cfg.Expiry))
	delete(l.mailboxes, mb.name)
	mb.discharged = true
	l.drops.forget("capacity", mb.name)
}
