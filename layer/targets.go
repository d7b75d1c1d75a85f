package layer

import (
	"sync"

	"github.com/nats-io/nats.go"
)

// targetsKept bounds the channels, and apart from them the groups, whose subjects a layer keeps
// for its sends.
const targetsKept = 4096

// sendTarget is what every publish to one channel carries: its subject and, for a process
// channel, the header naming it. Publishes share them, so both are read-only once made.
type sendTarget struct {
	subject string
	header  nats.Header
}

// sendTargets remembers the targets of the channels and groups sent to lately, and with them
// that their names are valid. A reply goes to the same process channel again and again, and its
// header is a map: made anew for each send it was the largest allocation of a send, and in a
// burst of sends those allocations made the garbage collector run every few milliseconds, each
// run a chance to hold up the thread that sends. Checking the name was the largest part of a
// send's CPU after that: a name is checked when it is first sent to, and again only after the
// memory started over.
type sendTargets struct {
	subj     subjects
	mu       sync.Mutex
	channels map[string]sendTarget // emptied when full: a few new entries cost less than an eviction order
	groups   map[string]string     // group -> subject, emptied when full
}

func newSendTargets(subj subjects) *sendTargets {
	return &sendTargets{subj: subj, channels: make(map[string]sendTarget), groups: make(map[string]string)}
}

// of returns the target of channel, or the error of an invalid name.
func (t *sendTargets) of(channel string) (sendTarget, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return remember(&t.channels, channel, func() (sendTarget, error) {
		if err := ValidateChannelName(channel); err != nil {
			return sendTarget{}, err
		}
		target := sendTarget{subject: t.subj.channel(channel)}
		if IsProcessChannel(channel) {
			target.header = nats.Header{ChannelHeader: []string{channel}}
		}
		return target, nil
	})
}

// ofGroup returns the subject of group, or the error of an invalid name.
func (t *sendTargets) ofGroup(group string) (string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return remember(&t.groups, group, func() (string, error) {
		if err := ValidateGroupName(group); err != nil {
			return "", err
		}
		return t.subj.group(group), nil
	})
}

// remember returns what kept holds for name, or builds it and keeps it unless building failed.
// A full memory starts over. The caller holds the lock that guards kept.
func remember[V any](kept *map[string]V, name string, build func() (V, error)) (V, error) {
	if v, ok := (*kept)[name]; ok {
		return v, nil
	}
	v, err := build()
	if err != nil {
		return v, err
	}
	if len(*kept) >= targetsKept {
		*kept = map[string]V{}
	}
	(*kept)[name] = v
	return v, nil
}
