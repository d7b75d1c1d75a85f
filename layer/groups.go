package layer

import (
	"context"
	"strings"
	"time"
)

// groupMembers holds the members of one group in this client.
type groupMembers struct {
	// The process-channel members, fed by one subscription per group: joined holds their
	// mailboxes in the order they joined, nil where one left since, and process the index of
	// each in joined. A group message reaches them in that order: a host that made its consumers
	// in the order they joined then wakes them in the order they lie in its memory, which with
	// 2,000 members cost a sixth to a third less CPU per delivery than the map's order
	// (README.md, "Where the time goes").
	process map[string]int
	joined  []*mailbox
	left    int                 // nil entries in joined
	plain   map[string]*mailbox // plain-channel members, each fed by its own queue subscription
	changes uint64              // counts changes of process: a fan-out that let go of l.mu sees them
	// listed is joined without its holes, made by the first fan-out after a change and shared
	// by the fan-outs until the next. Never changed in place.
	listed []*mailbox
}

func newGroupMembers() *groupMembers {
	return &groupMembers{process: map[string]int{}, plain: map[string]*mailbox{}}
}

func (g *groupMembers) size() int { return len(g.process) + len(g.plain) }

// member is channel's mailbox when channel is a member, else nil.
func (g *groupMembers) member(channel string) *mailbox {
	if i, ok := g.process[channel]; ok {
		return g.joined[i]
	}
	return g.plain[channel]
}

// add makes channel, whose mailbox is mb, a member; it is not one yet.
func (g *groupMembers) add(channel string, mb *mailbox) {
	if mb.plain {
		g.plain[channel] = mb
		return
	}
	g.process[channel] = len(g.joined)
	g.joined = append(g.joined, mb)
	g.changed()
}

// remove ends channel's membership and returns its mailbox; nil when it was not a member.
func (g *groupMembers) remove(channel string) *mailbox {
	if mb, ok := g.plain[channel]; ok {
		delete(g.plain, channel)
		return mb
	}
	i, ok := g.process[channel]
	if !ok {
		return nil
	}
	mb := g.joined[i]
	delete(g.process, channel)
	g.joined[i] = nil
	g.left++
	if g.left > len(g.joined)/2 { // squeeze the holes out: joined stays under twice the members
		kept := g.joined[:0]
		for _, m := range g.joined {
			if m != nil {
				g.process[m.name] = len(kept)
				kept = append(kept, m)
			}
		}
		clear(g.joined[len(kept):])
		g.joined, g.left = kept, 0
	}
	g.changed()
	return mb
}

// members returns the process-channel members in the order they joined (see listed). l.mu must
// be held.
func (g *groupMembers) members() []*mailbox {
	if g.listed == nil {
		g.listed = make([]*mailbox, 0, len(g.process))
		for _, mb := range g.joined {
			if mb != nil {
				g.listed = append(g.listed, mb)
			}
		}
	}
	return g.listed
}

// changed records a change of the process-channel members.
func (g *groupMembers) changed() {
	g.changes++
	g.listed = nil
}

// StartGroupAdd makes channel a member of group in this client (S18: membership lives here).
// It finishes at once (a nil *Op) when the subscriptions it needs are confirmed already;
// otherwise done is called once the server confirmed them (S1), or with why it did not, unless
// the Op is cancelled first. A membership that ends that way (failed or cancelled) is taken back,
// unless the channel was a member before. Adding a member twice is not an error.
func (l *Layer) StartGroupAdd(group, channel string, done func(error)) (*Op, error) {
	if err := ValidateGroupName(group); err != nil {
		return nil, err
	}
	if err := ValidateChannelName(channel); err != nil {
		return nil, err
	}
	nonLocal, _, process := strings.Cut(channel, "!")
	if process && !l.owns(channel) {
		return nil, &ForeignChannelError{channel}
	}
	keys := [2]subKey{memberKey(group, channel), channelKey(channel)}
	if process {
		keys = [2]subKey{groupKey(group), processKey(nonLocal)}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	now := time.Now()
	mb := l.mailboxLocked(channel, now)
	g := l.groups[group]
	if g == nil {
		g = newGroupMembers()
		l.groups[group] = g
	}
	already := g.member(channel) != nil
	if !already {
		g.add(channel, mb)
		mb.groups++
		mb.readAt = now
	}
	subs := []*subscription{l.want(keys[0]), l.want(keys[1])}
	if confirmedAll(subs) {
		return nil, nil
	}
	// leave takes the membership back, unless the channel was a member before; l.mu must be held.
	leave := func() {
		if !already {
			l.removeMember(group, channel)
		}
	}
	return l.confirmLater(mb, subs, done, leave), nil
}

// confirmLater confirms subs on a goroutine for an operation of mb that did not finish at once;
// done gets the result unless the Op was cancelled. undo (if not nil) runs under l.mu to take
// back what the operation began when it fails or is cancelled, and later on Retract.
// l.mu must be held.
func (l *Layer) confirmLater(mb *mailbox, subs []*subscription, done func(error), undo func()) *Op {
	mb.subscribing++
	ctx, cancel := context.WithCancel(l.ctx)
	undone := false // guarded by l.mu
	undoOnce := func() {
		if undo != nil && !undone {
			undone = true
			undo()
		}
	}
	op := &Op{}
	op.withdraw = func() {
		cancel()
		// At once, not when the goroutine below notices: once Cancel returns, a message
		// published after it must not reach a membership the cancelled group_add made (S14).
		l.mu.Lock()
		undoOnce()
		l.mu.Unlock()
	}
	l.spawn(func() {
		defer cancel()
		err := l.confirm(ctx, subs...)
		l.mu.Lock()
		mb.subscribing--
		won := op.finish()
		switch {
		case undo == nil:
		case !won || err != nil:
			undoOnce()
		default:
			op.retractWith(func() {
				l.mu.Lock()
				defer l.mu.Unlock()
				if !l.closed {
					undo()
				}
			})
		}
		if mb.plain && mb.idle() {
			l.scheduleRelease(mb) // nobody reads this channel now (a Flush may have overtaken it)
		}
		l.mu.Unlock()
		if won {
			done(err)
		}
	})
	return op
}

// GroupAdd is StartGroupAdd that waits, within ctx.
func (l *Layer) GroupAdd(ctx context.Context, group, channel string) error {
	return awaitDone(ctx, func(done func(error)) (*Op, error) { return l.StartGroupAdd(group, channel, done) })
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
	mb := g.remove(channel)
	if mb == nil {
		return false
	}
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

// StartNewChannel makes a new process channel name, "<prefix>.<client id>!<32 hex>" (prefix ""
// means "specific"), with its mailbox ready: messages sent to it from now on are kept until
// received, expired or reclaimed (S5). It finishes at once when the client's process
// subscription is confirmed already; otherwise done gets the name once the server confirmed it
// (S1), unless the Op is cancelled first.
func (l *Layer) StartNewChannel(prefix string, done func(string, error)) (string, *Op, error) {
	if prefix == "" {
		prefix = "specific"
	}
	if err := validatePrefix(prefix); err != nil {
		return "", nil, err
	}
	nonLocal := prefix + "." + l.clientID
	name := nonLocal + "!" + randomHex(16)
	if err := ValidateChannelName(name); err != nil {
		return "", nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return "", nil, ErrClosed
	}
	mb := l.mailboxLocked(name, time.Now())
	s := l.want(processKey(nonLocal))
	if s.confirmed {
		return name, nil, nil
	}
	// A channel that is never reported is reclaimed after mailbox_grace like any idle one.
	return "", l.confirmLater(mb, []*subscription{s}, func(err error) { done(name, err) }, nil), nil
}

// NewChannel is StartNewChannel that waits, within ctx.
func (l *Layer) NewChannel(ctx context.Context, prefix string) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	type result struct {
		name string
		err  error
	}
	got := make(chan result, 1)
	name, op, err := l.StartNewChannel(prefix, func(name string, err error) { got <- result{name, err} })
	if err != nil || op == nil {
		return name, err
	}
	r, err := wait(ctx, op, got)
	if err != nil {
		return "", err
	}
	if r.err != nil {
		return "", r.err
	}
	return r.name, nil
}
