package layer

import (
	"context"
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

// subscription is one subscription the layer wants. It survives reconnects (nats.go restores it)
// and is made again on a new connection after a close for good. Guarded by Layer.mu.
type subscription struct {
	subject, queue string
	sub            *nats.Subscription
	confirmed      bool // a flush round trip after the SUB succeeded (S1)
	dropsSeen      int  // slow-consumer drops of sub already counted
}

func (s *subscription) subscribe(nc *nats.Conn, inbox chan *nats.Msg) error {
	sub, err := nc.ChanQueueSubscribe(s.subject, s.queue, inbox)
	if err != nil {
		return err
	}
	s.sub, s.confirmed, s.dropsSeen = sub, false, 0
	return nil
}

// key helpers
func processKey(nonLocal string) subKey      { return subKey{kind: subProcess, name: nonLocal} }
func channelKey(channel string) subKey       { return subKey{kind: subChannel, name: channel} }
func groupKey(group string) subKey           { return subKey{kind: subGroup, name: group} }
func memberKey(group, channel string) subKey { return subKey{subGroupChannel, group, channel} }

// want returns the subscription for k, subscribing when it is new. If the connection is down
// for good the record is kept without a NATS subscription; the recovery subscribes it.
// l.mu must be held.
func (l *Layer) want(k subKey) (*subscription, error) {
	if s := l.subs[k]; s != nil {
		return s, nil
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
	if !l.nc.IsClosed() {
		if err := s.subscribe(l.nc, l.inbox); err != nil {
			return nil, fmt.Errorf("channels_nats: cannot subscribe to %s: %w", s.subject, err)
		}
	}
	l.subs[k] = s
	return s, nil
}

// wouldWait reports whether making the subscriptions of keys usable needs a round trip, when ctx
// asks not to wait (NoWait): callers then return ErrWouldBlock before changing anything.
// l.mu must be held.
func (l *Layer) wouldWait(ctx context.Context, keys ...subKey) bool {
	if !mustNotWait(ctx) {
		return false
	}
	for _, k := range keys {
		if s := l.subs[k]; s == nil || !s.confirmed {
			return true
		}
	}
	return false
}

// drop unsubscribes k if the layer has it. l.mu must be held.
func (l *Layer) drop(k subKey) {
	s := l.subs[k]
	if s == nil {
		return
	}
	delete(l.subs, k)
	l.retireDrops(s)
	if s.sub != nil {
		_ = s.sub.Unsubscribe() // fails only on a closed connection, where the sub is gone anyway
	}
}

// confirm waits until the server has processed the SUBs of subs (a flush round trip), so a
// message published right after, from any connection to that server, is delivered (S1).
func (l *Layer) confirm(ctx context.Context, subs ...*subscription) error {
	l.mu.Lock()
	pending := false
	for _, s := range subs {
		pending = pending || !s.confirmed
	}
	l.mu.Unlock()
	if !pending {
		return nil
	}
	if mustNotWait(ctx) {
		return ErrWouldBlock
	}
	nc, err := l.connection(ctx, true)
	if err != nil {
		return err
	}
	// Subscriptions made on an earlier connection were remade on nc before it was published.
	fctx, cancel := context.WithTimeout(ctx, l.cfg.Connection.FlushTimeout)
	defer cancel()
	if err := nc.FlushWithContext(fctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		l.mu.Lock()
		closed := l.closed
		l.mu.Unlock()
		if closed {
			return ErrClosed
		}
		return fmt.Errorf("channels_nats: the server did not confirm the subscription: %w", redactErr(err))
	}
	l.mu.Lock()
	for _, s := range subs {
		if s.sub != nil && s.sub.IsValid() {
			s.confirmed = true
		}
	}
	l.mu.Unlock()
	return nil
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
	l.counters.slowConsumer.Add(uint64(n))
	limit := l.cfg.Connection.PendingMsgsLimit
	l.drops.drop("slow consumer", subject, uint64(n), time.Now(), func(total uint64) string {
		return fmt.Sprintf("channels_nats: the NATS connection dropped %d message(s) on %s before they reached a mailbox "+
			"(slow consumer; %d so far). Raise pending_msgs_limit (now %d) or receive faster.", n, subject, total, limit)
	})
}
