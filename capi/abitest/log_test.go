//go:build linux

package abitest

import (
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"
)

// The log callback runs on a library thread that holds no lock of the library: while it is
// stuck in its first record (a drop, which the layer counts under its lock), messages still
// reach waiting receives, and records made meanwhile wait for it, in order. Past 1024 waiting
// they are dropped, and one warning says how many once the callback has caught up.
func TestLogCallbackHoldsNoLock(t *testing.T) {
	ts := startServer(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	sink := newLogSink(func(logRecord) {
		first.Do(func() {
			close(entered)
			<-release
		})
	})
	c := connectDoc(t, config(t, []string{ts.url}, map[string]any{"capacity": 1}), sink)
	var released sync.Once
	t.Cleanup(func() { released.Do(func() { close(release) }) }) // before the client's close

	// Each full mailbox drops its second message and logs that once.
	const channels = 1100
	names := make([]string, channels)
	for i := range names {
		names[i] = c.newChannel("")
	}
	c.send(names[0], numbered(t, 0))
	c.send(names[0], numbered(t, 1))
	select {
	case <-entered:
	case <-time.After(wait):
		t.Fatalf("no log record within %v of a drop", wait)
	}
	for _, ch := range names[1:] {
		c.send(ch, numbered(t, 0))
		c.send(ch, numbered(t, 1))
	}
	c.barrier(c) // a pending receive gets its message while the callback is stuck
	if got := stat(c.stats(), "dropped.capacity"); got != channels {
		t.Fatalf("dropped.capacity = %v while the log callback is stuck, want %d", got, channels)
	}
	released.Do(func() { close(release) })

	report := regexp.MustCompile(`^channels_nats: (\d+) log record\(s\) were dropped: more than 1024 waited`)
	isFull := regexp.MustCompile(`mailbox for (\S+) is full`)
	index := make(map[string]int, channels)
	for i, ch := range names {
		index[ch] = i
	}
	var full []int // the index of the channel each "is full" record names, in the order they came
	dropped := 0
	for deadline := time.Now().Add(wait); dropped == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no record reporting the dropped log records within %v; %d records", wait, len(sink.snapshot()))
		}
		full = full[:0]
		for _, r := range sink.snapshot() {
			if m := report.FindStringSubmatch(r.Message); m != nil {
				if r.Level != cnLogWarning {
					t.Errorf("the report of dropped records has level %d, want CN_LOG_WARNING", r.Level)
				}
				dropped, _ = strconv.Atoi(m[1])
				continue
			}
			if m := isFull.FindStringSubmatch(r.Message); m != nil {
				if i, ok := index[m[1]]; ok {
					full = append(full, i)
				}
			}
		}
	}
	if len(full)+dropped != channels {
		t.Errorf("%d drop warnings and %d dropped records, want %d in all", len(full), dropped, channels)
	}
	if len(full) < 1025 { // the one in the callback and the 1024 that waited
		t.Errorf("%d drop warnings reached the callback, want at least 1025", len(full))
	}
	for k := 1; k < len(full); k++ {
		if full[k] <= full[k-1] {
			t.Fatalf("drop warnings out of order: channel %d after channel %d", full[k], full[k-1])
		}
	}
}
