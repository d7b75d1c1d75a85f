package layer

import (
	"errors"
	"fmt"
	"testing"
)

// Every send to a channel takes its subject and header from sendTargets: a channel sent to again
// gets the same header map, and that costs no allocation; a process channel's header names it,
// a plain channel has none; and once full, the memory starts over instead of growing.
func TestSendTargetsAreSharedAndBounded(t *testing.T) {
	targets := newSendTargets(subjects{"pfx"})
	process := "specific.abc!def"
	first := mustTarget(t, targets, process)
	if first.subject != "pfx.pc.specific.abc" || first.header.Get(ChannelHeader) != process {
		t.Fatalf("process channel target %q %v", first.subject, first.header)
	}
	if again := mustTarget(t, targets, process); fmt.Sprintf("%p", again.header) != fmt.Sprintf("%p", first.header) {
		t.Fatal("a second send to the same channel made a new header")
	}
	if allocs := testing.AllocsPerRun(100, func() { _, _ = targets.of(process) }); allocs != 0 {
		t.Fatalf("a send to a known channel allocated %.0f times for its target", allocs)
	}
	if plain := mustTarget(t, targets, "chat"); plain.subject != "pfx.ch.chat" || plain.header != nil {
		t.Fatalf("plain channel target %q %v", plain.subject, plain.header)
	}
	for i := range targetsKept + 10 {
		mustTarget(t, targets, fmt.Sprintf("c%d", i))
	}
	if n := len(targets.channels); n > targetsKept {
		t.Fatalf("the memory of targets holds %d channels, more than %d", n, targetsKept)
	}
	if fresh := mustTarget(t, targets, process); fresh.header.Get(ChannelHeader) != process {
		t.Fatalf("after the memory started over: %v", fresh.header)
	}
}

// A group's subject is kept the same way, allocation-free once known, and bounded.
func TestGroupTargetsAreKeptAndBounded(t *testing.T) {
	targets := newSendTargets(subjects{"pfx"})
	if subject, err := targets.ofGroup("room"); err != nil || subject != "pfx.grp.room" {
		t.Fatalf("group subject %q, %v", subject, err)
	}
	if allocs := testing.AllocsPerRun(100, func() { _, _ = targets.ofGroup("room") }); allocs != 0 {
		t.Fatalf("a send to a known group allocated %.0f times for its subject", allocs)
	}
	for i := range targetsKept + 10 {
		if _, err := targets.ofGroup(fmt.Sprintf("g%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(targets.groups); n > targetsKept {
		t.Fatalf("the memory of group subjects holds %d groups, more than %d", n, targetsKept)
	}
}

// An invalid name is refused each time it is sent to, and never kept: only names that passed
// the check skip it.
func TestSendTargetsRefuseInvalidNamesEveryTime(t *testing.T) {
	targets := newSendTargets(subjects{"pfx"})
	for range 2 {
		var nameErr *NameError
		if _, err := targets.of("bad name"); !errors.As(err, &nameErr) {
			t.Fatalf("channel %q: %v, want a *NameError", "bad name", err)
		}
		if _, err := targets.ofGroup("bad*group"); !errors.As(err, &nameErr) {
			t.Fatalf("group %q: %v, want a *NameError", "bad*group", err)
		}
	}
	if len(targets.channels) != 0 || len(targets.groups) != 0 {
		t.Fatalf("invalid names were kept: %v %v", targets.channels, targets.groups)
	}
}

func mustTarget(t *testing.T, targets *sendTargets, channel string) sendTarget {
	t.Helper()
	target, err := targets.of(channel)
	if err != nil {
		t.Fatalf("%s: %v", channel, err)
	}
	return target
}
