package layer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
)

// subKind tells what a subscription feeds.
type subKind uint8

const (
	subProcess      subKind = iota // p.pc.<nonLocal>: this client's process channels
	subChannel                     // p.ch.<c> in queue p.ch.<c>: plain channel c
	subGroup                       // p.grp.<g>: the process-channel members of g
	subGroupChannel                // p.grp.<g> in queue p.ch.<c>: plain member c of g
)

// subKey identifies a subscription the layer wants: name is the process nonLocal part, the
// channel or the group; channel is the member for subGroupChannel.
type subKey struct {
	kind    subKind
	name    string
	channel string
}

// subscription is one subscription the layer wants. The link makes it on the connection
// (subscribeOn); nats.go restores it after a reconnect, and the layer makes it again on a new
// connection after a close for good. Guarded by Layer.mu.
type subscription struct {
	subject, queue string
	sub            *nats.Subscription // nil until the link made it
	nc             *nats.Conn         // the connection sub was made on
	err            error              // why making it failed
	confirmed      bool               // a flush round trip after the SUB succeeded (S1)
	dropped        bool               // no longer wanted: the link must not make it
	dropsSeen      int                // slow-consumer drops of sub already counted
}

// key helpers
func processKey(nonLocal string) subKey      { return subKey{kind: subProcess, name: nonLocal} }
func channelKey(channel string) subKey       { return subKey{kind: subChannel, name: channel} }
func groupKey(group string) subKey           { return subKey{kind: subGroup, name: group} }
func memberKey(group, channel string) subKey { return subKey{subGroupChannel, group, channel} }

// want returns the subscription for k, asking the link to make it when it is new. l.mu must
// be held.
func (l *Layer) want(k subKey) *subscription {
	if s := l.subs[k]; s != nil {
		return s
	}
	s := &subscription{}
	switch k.kind {
	case subProcess:
		s.subject = l.subj.process(k.name)
	case subChannel:
		s.subject, s.queue = l.subj.channel(k.name), l.subj.queue(k.name)
	case subGroup:
		s.subject = l.subj.group(k.name)
	case subGroupChannel:
		s.subject, s.queue = l.subj.group(k.name), l.subj.queue(k.channel)
	}
	l.subs[k] = s
	l.link.command(func(nc *nats.Conn) {
		if err := l.subscribeOn(nc, s); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			l.log(LevelError, fmt.Sprintf("channels_nats: cannot subscribe to %s: %s", s.subject, l.redact.text(err.Error())))
		}
	})
	return s
}

// subscribeOn makes s on nc, unless it is no longer wanted or is there already. A connection
// closed for good is not an error of s: the recovery makes it on the next one.
func (l *Layer) subscribeOn(nc *nats.Conn, s *subscription) error {
	l.mu.Lock()
	skip := s.dropped || s.nc == nc && s.sub != nil
	l.mu.Unlock()
	if skip {
		return nil
	}
	sub, err := nc.ChanQueueSubscribe(s.subject, s.queue, l.inbox)
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case errors.Is(err, nats.ErrConnectionClosed):
		return err
	case err != nil:
		s.err = fmt.Errorf("channels_nats: cannot subscribe to %s: %w", s.subject, l.redact.err(err))
	default:
		l.retireDrops(s)
		s.sub, s.nc, s.err, s.confirmed, s.dropsSeen = sub, nc, nil, false, 0
	}
	l.subscriptionsChanged()
	return err
}

// subscriptionsChanged wakes every confirm waiting for a subscription to be made. l.mu must be
// held, or the caller must be the only one who can change them (Connect).
func (l *Layer) subscriptionsChanged() {
	close(l.subsChanged)
	l.subsChanged = make(chan struct{})
}

// drop gives up k if the layer has it: the link unsubscribes it, after whatever it was asked
// before. l.mu must be held.
func (l *Layer) drop(k subKey) {
	s := l.subs[k]
	if s == nil {
		return
	}
	delete(l.subs, k)
	l.retireDrops(s)
	s.dropped = true
	l.subscriptionsChanged() // a confirm waiting for it ends
	l.link.command(func(*nats.Conn) {
		l.mu.Lock()
		sub := s.sub
		l.mu.Unlock()
		if sub != nil {
			_ = sub.Unsubscribe() // fails only on a closed connection, where the sub is gone anyway
		}
	})
}

// confirmed reports whether every subscription of subs is confirmed. l.mu must be held.
func confirmedAll(subs []*subscription) bool {
	for _, s := range subs {
		if !s.confirmed {
			return false
		}
	}
	return true
}

// confirm waits until the link has made subs on the current connection and the server has
// processed their SUBs (a flush round trip), so a message published right after, from any
// connection to that server, is delivered (S1). ctx must end when the layer closes (it derives
// from l.ctx); the layer's closing gives ErrClosed.
func (l *Layer) confirm(ctx context.Context, subs ...*subscription) error {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return ErrClosed
		}
		if confirmedAll(subs) {
			l.mu.Unlock()
			return nil
		}
		nc := l.link.conn()
		made := true
		for _, s := range subs {
			switch {
			case s.dropped: // a Flush overtook the operation: there is nothing left to confirm
				l.mu.Unlock()
				return nil
			case s.err != nil:
				err := s.err
				l.mu.Unlock()
				return err
			}
			made = made && s.nc == nc && s.sub != nil
		}
		changed := l.subsChanged
		l.mu.Unlock()
		if !made {
			select {
			case <-changed:
				continue
			case <-ctx.Done():
				return l.ended(ctx)
			}
		}
		if err := l.flush(ctx, nc); err != nil {
			return err
		}
		l.mu.Lock()
		for _, s := range subs {
			if s.nc == nc && s.sub != nil && s.sub.IsValid() {
				s.confirmed = true
			}
		}
		l.mu.Unlock()
	}
}

// ended is the error of an operation whose ctx ended: ErrClosed when the layer closed.
func (l *Layer) ended(ctx context.Context) error {
	if l.ctx.Err() != nil {
		return ErrClosed
	}
	return ctx.Err()
}

// flush makes a round trip on nc, bounded by FlushTimeout and ctx.
func (l *Layer) flush(ctx context.Context, nc *nats.Conn) error {
	fctx, cancel := context.WithTimeout(ctx, l.cfg.Connection.FlushTimeout)
	defer cancel()
	err := nc.FlushWithContext(fctx)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return l.ended(ctx)
	case errors.Is(err, context.DeadlineExceeded):
		err = fmt.Errorf("%w after flush_timeout (%s)", nats.ErrTimeout, l.cfg.Connection.FlushTimeout)
	}
	return fmt.Errorf("channels_nats: the server did not confirm the subscription: %w", l.redact.err(err))
}

// retireDrops counts the last slow-consumer drops of s before its NATS subscription goes.
// l.mu must be held.
func (l *Layer) retireDrops(s *subscription) {
	if s.sub == nil {
		return
	}
	if n, err := s.sub.Dropped(); err == nil && n > s.dropsSeen {
		l.countSlowConsumer(s.subject, n-s.dropsSeen)
		s.dropsSeen = n
	}
}

// pollSlowConsumers counts drops the connection made since the last look (S3).
func (l *Layer) pollSlowConsumers() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, s := range l.subs {
		l.retireDrops(s)
	}
}

func (l *Layer) countSlowConsumer(subject string, n int) {
	limit := l.cfg.Connection.PendingMsgsLimit
	l.drops.drop("slow consumer", subject, uint64(n), time.Now(), func(total uint64) string {
		return fmt.Sprintf("channels_nats: the NATS connection dropped %d message(s) on %s before they reached a mailbox "+
			"(slow consumer; %d so far). Raise pending_msgs_limit (now %d) or receive faster.", n, subject, total, limit)
	})
	l.counters.slowConsumer.Add(uint64(n))
}
