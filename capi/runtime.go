package main

/*
#include "bridge.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

// The Go runtime of this library lives in the host's process, and every host thread that calls
// a cn_* function runs Go code while it is inside. Such a thread needs one of the runtime's Ps
// (the right to run Go code) for the length of the call, and when it finds none free, or the
// runtime takes its P back to stop the world for a collection, the thread sleeps in the Go
// scheduler until another thread hands it one. For an event loop that sleep is a stall of
// every task on it: on 2 CPUs, in a burst of sends after a frozen broker came back, it added up
// to several milliseconds per tick. Two settings shorten it, each unless the user's environment
// sets it (GOMAXPROCS, GOGC): spare Ps, and fewer collections in bursts.

// spareProcs is how many Ps the runtime gets beyond its default (the CPUs it may use): while
// the library's own goroutines (the reader, the dispatcher, the flushers) hold as many Ps as
// there are CPUs, a host thread entering a call still finds one free. Setting the count stops
// the runtime from following later changes of a container's CPU limit, as it does for any
// program that sets it.
const spareProcs = 2

// gcFloorBytes is the least the Go heap may grow by between two collections. The library's
// live heap is a few megabytes, so the runtime's default (collect when the heap doubles) meant
// a collection every few megabytes of messages: about 9 in a burst of 20,000 sends of 1 KB,
// each with two pauses in which every thread in Go, the host's included, waits. With the floor,
// the heap may hold up to this much garbage; from a live heap of gcFloorBytes up, the runtime's
// default applies unchanged.
const gcFloorBytes = 16 << 20

func init() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(runtime.GOMAXPROCS(0) + spareProcs)
	}
	if os.Getenv("GOGC") == "" {
		tuneGC()
	}
}

// gcSentinel is an object nothing refers to: its finalizer runs after each collection, which
// is how tuneGC hears of one (the runtime has no other hook). Its pointer field keeps it out of
// the allocator's blocks for tiny objects, where its finalizer would wait for its neighbours.
type gcSentinel struct{ _ *int }

// heapMinimum is the runtime's least heap goal at GOGC=100 (4 MiB, as the Go GC guide says); the
// runtime scales it by GOGC like the rest of the goal.
const heapMinimum = 4 << 20

// gcPercentFor is the GOGC that puts the next collection at live + gcFloorBytes. From a live heap
// of gcFloorBytes up, the runtime's default (the next collection at twice the live heap) leaves
// that much room already. Under heapMinimum the goal is the minimum scaled by GOGC, not
// live × (1 + GOGC/100).
func gcPercentFor(live uint64) int {
	switch {
	case live >= gcFloorBytes:
		return 100
	case live < heapMinimum:
		return int((live + gcFloorBytes) * 100 / heapMinimum)
	default:
		return int(gcFloorBytes * 100 / live)
	}
}

// tuneGC sets the collector's percentage from the live heap of the last collection (none yet at
// init: then the floor alone), and arms itself to run again after the next collection.
func tuneGC() {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(sample)
	debug.SetGCPercent(gcPercentFor(sample[0].Value.Uint64()))
	runtime.SetFinalizer(&gcSentinel{}, func(*gcSentinel) { tuneGC() })
}

// mainThreadMaps is where glibc finds the stack of a process's main thread.
const mainThreadMaps = "/proc/self/maps"

// withGlibc says whether the library is built against glibc: only glibc reads mainThreadMaps.
const withGlibc = C.BRIDGE_GLIBC == 1

// stackBoundsWarning is a warning for the host's log when every call into the library from the
// process's main thread will cost a failed open first, else "". On each call from a host
// thread the runtime asks for that thread's stack bounds until it once gets them; glibc reads a
// main thread's from mapsPath, so where /proc is not mounted (a bare chroot, some sandboxes)
// the runtime never gets them and asks again on every call. That costs a few microseconds a
// call, more than a receive that finds its message waiting: in make bench's wake scenario a
// delivery cost 1.6 times the CPU without /proc.
func stackBoundsWarning(mapsPath string) string {
	if !withGlibc {
		return ""
	}
	f, err := os.Open(mapsPath)
	if err == nil {
		_ = f.Close()
		return ""
	}
	return fmt.Sprintf("channels_nats: every call into the library from the main thread will be slower: the Go runtime "+
		"asks glibc for that thread's stack bounds on each, and glibc cannot read them (%v); mount /proc", err)
}
