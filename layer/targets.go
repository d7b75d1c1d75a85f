package layer

import (
	"sync"

	"github.com/nats-io/nats.go"
)

// targetsKept bounds the channels whose subject and header a layer keeps for its sends.
const targetsKept = 4096

// sendTarget is what every publish to one channel carries: its subject and, for a process
// channel, the header naming it. Publishes share them, so both are read-only once made.
type sendTarget struct {
	subject string
	header  nats.Header
}

// sendTargets remembers the targets of the channels sent to lately. A reply goes to the same
// process channel again and again, and its header is a map: made anew for each send it was the
// largest allocation of a send, and in a burst of sends those allocations made the garbage
// collector run every few milliseconds, each run a chance to hold up the thread that sends.
type sendTargets struct {
	subj subjects
	mu   sync.Mutex
	kept map[string]sendTarget // emptied when full: a few new entries cost less than an eviction order
}

func newSendTargets(subj subjects) *sendTargets {
	return &sendTargets{subj: subj, kept: make(map[string]sendTarget)}
}

// of returns the target of a valid channel name.
func (t *sendTargets) of(channel string) sendTarget {
	t.mu.Lock()
	defer t.mu.Unlock()
	if target, ok := t.kept[channel]; ok {
		return target
	}
	target := sendTarget{subject: t.subj.channel(channel)}
	if IsProcessChannel(channel) {
		target.header = nats.Header{ChannelHeader: []string{channel}}
	}
	if len(t.kept) >= targetsKept {
		t.kept = make(map[string]sendTarget)
	}
	t.kept[channel] = target
	return target
}
