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
	type handBack struct {
		subject string
		bodies  [][]byte
	}
	var handBacks []handBack
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
			if mb.plain {
				if bodies := l.release(mb, now); len(bodies) > 0 {
					handBacks = append(handBacks, handBack{l.subj.channel(mb.name), bodies})
				}
			} else {
				l.discard(mb, now)
			}
		case mb.groups > 0 && len(mb.waiters) == 0 && now.Sub(mb.readAt) > l.cfg.GroupExpiry:
			expired = append(expired, mb.name)
		}
	}
	for _, channel := range expired {
		l.expireMember(channel)
	}
	for _, s := range l.subs {
		l.retireDrops(s)
	}
	nc := l.nc
	l.mu.Unlock()

	for _, h := range handBacks {
		l.handBack(nc, h.subject, h.bodies)
	}
}

// expireMember takes channel out of every group, because nothing read it for GroupExpiry (S18).
// l.mu must be held.
func (l *Layer) expireMember(channel string) {
	var left []string
	for name, g := range l.groups {
		if g.process[channel] != nil || g.plain[channel] != nil {
			left = append(left, name)
		}
	}
	for _, name := range left {
		l.removeMember(name, channel)
	}
	l.counters.groupsExpired.Add(uint64(len(left)))
	l.log(LevelWarning, fmt.Sprintf("channels_nats: %s left %d group(s) after %s without a reader (group_expiry); "+
		"a consumer that stops reading should call group_discard", channel, len(left), l.cfg.GroupExpiry))
}
