//go:build linux

package abitest

import "testing"

// A host that reads the connection on its own thread (cn_read_events, cn_on_readable): it waits
// for the descriptor, calls cn_on_readable with its queue, and takes the results right after,
// with no notify byte between. None is lost when another thread routes meanwhile (the header's
// "unless another thread was routing"): that result comes with a byte, as any other.
func TestReadEventsHostReadsTheConnection(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	ch := c.newChannel("")
	var fd int64 = -2
	if st, msg := onThread(func() int32 { return cnReadEvents(c.h, &fd) }); st != cnOK || fd < 0 {
		t.Fatalf("cn_read_events: %s (%q), fd %d; want CN_OK and a descriptor", name(st), msg, fd)
	}
	q := c.own
	if st, msg := onThread(func() int32 { return cnOnReadable(c.h, q.h) }); st != cnOK {
		t.Fatalf("cn_on_readable with nothing to read: %s (%q)", name(st), msg)
	}
	const rounds = 20
	immediate := 0
	for i := range rounds {
		op := c.receivePending(ch, q)
		sender.send(ch, numbered(t, i))
		if !readable(int(fd), wait) {
			t.Fatalf("round %d: the read-events descriptor did not become readable within %s", i, wait)
		}
		if st, msg := onThread(func() int32 { return cnOnReadable(c.h, q.h) }); st != cnOK {
			t.Fatalf("round %d: cn_on_readable: %s (%q)", i, name(st), msg)
		}
		var got []result
		if !readable(q.rfd, 0) {
			got = q.takeAll() // no byte came: the host takes right after the call
		}
		if len(got) == 1 {
			immediate++
		} else {
			got = append(got, q.wait(1)...)
		}
		if len(got) != 1 || got[0].Op != op || numberOf(got[0].Data) != i {
			t.Fatalf("round %d: results %v, want message %d for op %d", i, got, i, op)
		}
	}
	if immediate < rounds/2 {
		t.Fatalf("only %d of %d messages were delivered within cn_on_readable without a notify byte", immediate, rounds)
	}
	hostReads, _ := c.stats()["host_reads"].(map[string]any)
	if reads, _ := hostReads["reads"].(float64); reads < float64(immediate) {
		t.Fatalf("stats host_reads %v: fewer reads than the %d messages read on the host", hostReads, immediate)
	}
}
