package layer

import (
	"fmt"
	"testing"
)

// Every send to a channel takes its subject and header from sendTargets: a channel sent to again
// gets the same header map, and that costs no allocation; a process channel's header names it,
// a plain channel has none; and once full, the memory starts over instead of growing.
func TestSendTargetsAreSharedAndBounded(t *testing.T) {
	targets := newSendTargets(subjects{"pfx"})
	process := "specific.abc!def"
	first := targets.of(process)
	if first.subject != "pfx.pc.specific.abc" || first.header.Get(ChannelHeader) != process {
		t.Fatalf("process channel target %q %v", first.subject, first.header)
	}
	if again := targets.of(process); fmt.Sprintf("%p", again.header) != fmt.Sprintf("%p", first.header) {
		t.Fatal("a second send to the same channel made a new header")
	}
	if allocs := testing.AllocsPerRun(100, func() { targets.of(process) }); allocs != 0 {
		t.Fatalf("a send to a known channel allocated %.0f times for its target", allocs)
	}
	if plain := targets.of("chat"); plain.subject != "pfx.ch.chat" || plain.header != nil {
		t.Fatalf("plain channel target %q %v", plain.subject, plain.header)
	}
	for i := range targetsKept + 10 {
		targets.of(fmt.Sprintf("c%d", i))
	}
	if n := len(targets.kept); n > targetsKept {
		t.Fatalf("the memory of targets holds %d channels, more than %d", n, targetsKept)
	}
	if fresh := targets.of(process); fresh.header.Get(ChannelHeader) != process {
		t.Fatalf("after the memory started over: %v", fresh.header)
	}
}
