//go:build linux

package abitest

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// call is one call of the C ABI with what it must return.
type call struct {
	what string
	want int32
	fn   func() int32
}

// run makes the calls; each must return its status with a cn_last_error() detail.
func run(t *testing.T, calls []call) {
	t.Helper()
	for _, c := range calls {
		st, msg := onThread(c.fn)
		if st != c.want {
			t.Errorf("%s: %s (%q), want %s", c.what, name(st), msg, name(c.want))
		} else if msg == "" {
			t.Errorf("%s: %s without a cn_last_error() detail", c.what, name(st))
		}
	}
}

// NULL pointers, invalid UTF-8, refused names and bodies that are not Channels messages: each
// refused with its status and a detail, nothing sent, nothing pending, the client unharmed.
func TestMisuseArguments(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	q := newQueue(t)
	body := numbered(t, 1)
	b, n := bp(body)
	var out, blen uintptr
	var op uint64
	h, qh := c.h, q.h
	calls := []call{
		{"cn_send(channel NULL)", cnInvalidArg, func() int32 { return cnSend(h, nil, b, n, qh, 0, &op) }},
		{"cn_send(body NULL)", cnInvalidArg, func() int32 { return cnSend(h, cs(ch), nil, n, qh, 0, &op) }},
		{"cn_send(body NULL, len 0)", cnInvalidArg, func() int32 { return cnSend(h, cs(ch), nil, 0, qh, 0, &op) }},
		{"cn_group_send(group NULL)", cnInvalidArg, func() int32 { return cnGroupSend(h, nil, b, n, qh, 0, &op) }},
		{"cn_group_send(body NULL)", cnInvalidArg, func() int32 { return cnGroupSend(h, cs("grp"), nil, n, qh, 0, &op) }},
		{"cn_receive(channel NULL)", cnInvalidArg, func() int32 { return cnReceive(h, nil, qh, 0, &out, &blen, &op) }},
		{"cn_receive(body NULL)", cnInvalidArg, func() int32 { return cnReceive(h, cs(ch), qh, 0, nil, &blen, &op) }},
		{"cn_receive(len NULL)", cnInvalidArg, func() int32 { return cnReceive(h, cs(ch), qh, 0, &out, nil, &op) }},
		{"cn_new_channel(channel NULL)", cnInvalidArg, func() int32 { return cnNewChannel(h, nil, qh, 0, nil, &op) }},
		{"cn_group_add(group NULL)", cnInvalidArg, func() int32 { return cnGroupAdd(h, nil, cs(ch), qh, 0, &op) }},
		{"cn_group_add(channel NULL)", cnInvalidArg, func() int32 { return cnGroupAdd(h, cs("grp"), nil, qh, 0, &op) }},
		{"cn_group_discard(group NULL)", cnInvalidArg, func() int32 { return cnGroupDiscard(h, nil, cs(ch)) }},
		{"cn_group_discard(channel NULL)", cnInvalidArg, func() int32 { return cnGroupDiscard(h, cs("grp"), nil) }},
		{"cn_stats(json NULL)", cnInvalidArg, func() int32 { return cnStats(h, nil) }},
	}
	// Invalid UTF-8 anywhere a string goes in.
	bad := "caf\xff"
	calls = append(calls, []call{
		{"cn_send(channel invalid UTF-8)", cnInvalidArg, func() int32 { return cnSend(h, cs(bad), b, n, qh, 0, &op) }},
		{"cn_send(process channel invalid UTF-8)", cnInvalidArg, func() int32 { return cnSend(h, cs(ch[:len(ch)-1]+"\xff"), b, n, qh, 0, &op) }},
		{"cn_group_send(group invalid UTF-8)", cnInvalidArg, func() int32 { return cnGroupSend(h, cs(bad), b, n, qh, 0, &op) }},
		{"cn_receive(channel invalid UTF-8)", cnInvalidArg, func() int32 { return cnReceive(h, cs(bad), qh, 0, &out, &blen, &op) }},
		{"cn_new_channel(prefix invalid UTF-8)", cnInvalidArg, func() int32 { return cnNewChannel(h, cs(bad), qh, 0, &out, &op) }},
		{"cn_group_add(group invalid UTF-8)", cnInvalidArg, func() int32 { return cnGroupAdd(h, cs(bad), cs(ch), qh, 0, &op) }},
		{"cn_group_add(channel invalid UTF-8)", cnInvalidArg, func() int32 { return cnGroupAdd(h, cs("grp"), cs(bad), qh, 0, &op) }},
		{"cn_group_discard(group invalid UTF-8)", cnInvalidArg, func() int32 { return cnGroupDiscard(h, cs(bad), cs(ch)) }},
		{"cn_group_discard(channel invalid UTF-8)", cnInvalidArg, func() int32 { return cnGroupDiscard(h, cs("grp"), cs(bad)) }},
	}...)
	// Names the layer refuses.
	for _, bad := range []string{"bad name", "a..b", ".lead", "trail.", "a*b", "a>b", ""} {
		calls = append(calls, []call{
			{"cn_send(" + bad + ")", cnInvalidName, func() int32 { return cnSend(h, cs(bad), b, n, qh, 0, &op) }},
			{"cn_group_send(" + bad + ")", cnInvalidName, func() int32 { return cnGroupSend(h, cs(bad), b, n, qh, 0, &op) }},
			{"cn_receive(" + bad + ")", cnInvalidName, func() int32 { return cnReceive(h, cs(bad), qh, 0, &out, &blen, &op) }},
			{"cn_group_add(group " + bad + ")", cnInvalidName, func() int32 { return cnGroupAdd(h, cs(bad), cs(ch), qh, 0, &op) }},
			{"cn_group_add(channel " + bad + ")", cnInvalidName, func() int32 { return cnGroupAdd(h, cs("grp"), cs(bad), qh, 0, &op) }},
			{"cn_group_discard(group " + bad + ")", cnInvalidName, func() int32 { return cnGroupDiscard(h, cs(bad), cs(ch)) }},
		}...)
		if bad != "" { // "" as the prefix means "specific"
			calls = append(calls, call{"cn_new_channel(prefix " + bad + ")", cnInvalidName,
				func() int32 { return cnNewChannel(h, cs(bad), qh, 0, &out, &op) }})
		}
	}
	calls = append(calls, call{"cn_send(name too long)", cnInvalidName,
		func() int32 { return cnSend(h, cs(strings.Repeat("a", 200)), b, n, qh, 0, &op) }})
	// Bodies that are not Channels messages.
	bodies := map[string][]byte{
		"empty body":         {},
		"not a map (string)": pack(t, "hello"),
		"not a map (list)":   pack(t, []any{1, 2}),
		"not msgpack":        {0xc1},
		"truncated map":      pack(t, map[string]any{"type": "x"})[:3],
		"int key":            pack(t, map[int]any{1: "x"}),
		"nested int key":     pack(t, map[string]any{"type": "x", "inner": map[int]any{1: "y"}}),
		"reserved key":       pack(t, map[string]any{"type": "x", "__asgi_channel__": "y"}),
		"trailing bytes":     append(numbered(t, 1), 0x01),
	}
	for what, body := range bodies {
		b, n := bp(body)
		calls = append(calls, []call{
			{"cn_send(" + what + ")", cnInvalidMessage, func() int32 { return cnSend(h, cs(ch), b, n, qh, 0, &op) }},
			{"cn_group_send(" + what + ")", cnInvalidMessage, func() int32 { return cnGroupSend(h, cs("grp"), b, n, qh, 0, &op) }},
		}...)
	}
	run(t, calls)
	q.quiet(100 * time.Millisecond)
	// Nothing was sent and the client still works.
	c.send(ch, numbered(t, 5))
	if got := numberOf(c.receiveAny(ch)); got != 5 {
		t.Errorf("after the refused calls a round trip got n=%d, want 5 (a refused send was delivered?)", got)
	}
	if s := c.stats(); stat(s, "published") != 1 {
		t.Errorf("published = %v after refused sends and one send, want 1", s["published"])
	}
}

func TestMessageTooLarge(t *testing.T) {
	ts := startServer(t, func(o *server.Options) { o.MaxPayload = 1024 })
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	q := newQueue(t)
	big := pack(t, map[string]any{"type": "x", "pad": strings.Repeat("a", 2000)})
	// 1000 bytes: within max_payload alone, over it with a process channel's Channel header.
	edge := pack(t, map[string]any{"type": "t", "pad": strings.Repeat("a", 985)})
	if len(edge) != 1000 {
		t.Fatalf("edge body is %d bytes", len(edge))
	}
	bb, bn := bp(big)
	eb, en := bp(edge)
	var op uint64
	run(t, []call{
		{"cn_send(2 KB)", cnTooLarge, func() int32 { return cnSend(c.h, cs(ch), bb, bn, q.h, 0, &op) }},
		{"cn_send(2 KB, plain)", cnTooLarge, func() int32 { return cnSend(c.h, cs(uniq(t, "plain")), bb, bn, q.h, 0, &op) }},
		{"cn_group_send(2 KB)", cnTooLarge, func() int32 { return cnGroupSend(c.h, cs("grp"), bb, bn, q.h, 0, &op) }},
		{"cn_send(1000 B + Channel header)", cnTooLarge, func() int32 { return cnSend(c.h, cs(ch), eb, en, q.h, 0, nil) }},
	})
	// The same 1000 bytes without a header fit.
	if st := cnGroupSend(c.h, cs("grp"), eb, en, q.h, 0, nil); st != cnOK {
		t.Errorf("cn_group_send(1000 B): %s, want CN_OK", name(st))
	}
	q.quiet(50 * time.Millisecond)
	// The connection stayed up, and nothing was sent.
	c.send(ch, numbered(t, 9))
	if got := numberOf(c.receiveAny(ch)); got != 9 {
		t.Errorf("after CN_MESSAGE_TOO_LARGE the round trip got n=%d, want 9", got)
	}
	if s := c.stats(); s["connected"] != true || stat(s, "published") != 2 {
		t.Errorf("stats after CN_MESSAGE_TOO_LARGE: %v", s)
	}
}

func TestForeignChannel(t *testing.T) {
	ts := startServer(t)
	a := connect(t, ts.url, nil)
	b := connect(t, ts.url, nil)
	theirs := b.newChannel("")
	q := newQueue(t)
	var out, n uintptr
	var op uint64
	run(t, []call{
		{"cn_receive(another client's channel)", cnForeign, func() int32 { return cnReceive(a.h, cs(theirs), q.h, 0, &out, &n, &op) }},
		{"cn_receive(another client's prefix)", cnForeign, func() int32 {
			return cnReceive(a.h, cs(theirs[:strings.IndexByte(theirs, '!')+1]), q.h, 0, &out, &n, &op)
		}},
		{"cn_group_add(another client's channel)", cnForeign, func() int32 { return cnGroupAdd(a.h, cs("grp"), cs(theirs), q.h, 0, &op) }},
	})
	q.quiet(50 * time.Millisecond)
	// Sending to it works.
	a.send(theirs, numbered(t, 4))
	if got := numberOf(b.receiveAny(theirs)); got != 4 {
		t.Errorf("send to another client's channel: it received n=%d, want 4", got)
	}
}

// The log callback must not call the library: from inside it every function that returns a
// cn_status returns CN_ILLEGAL_STATE with a detail, whatever its arguments, and does nothing.
func TestCallsFromLogCallback(t *testing.T) {
	ts := startServer(t)
	q := newQueue(t)
	type outcome struct {
		st  int32
		msg string
	}
	var (
		mu   sync.Mutex
		got  map[string]outcome
		h    uint64 // the client, set before the first record can come
		ch   string
		once sync.Once
	)
	doc := config(t, []string{ts.url}, nil)
	sink := newLogSink(func(logRecord) {
		once.Do(func() {
			body := numbered(t, 2)
			b, n := bp(body)
			var out, blen uintptr
			var op, client, newQ uint64
			var count uintptr
			var results [2]cResult
			calls := map[string]func() int32{
				"cn_queue_new":     func() int32 { return cnQueueNew(-1, &newQ) },
				"cn_queue_take":    func() int32 { return cnQueueTake(q.h, &results[0], 2, &count) },
				"cn_queue_free":    func() int32 { return cnQueueFree(q.h) },
				"cn_connect":       func() int32 { return cnConnect(cs(doc), 0, 0, q.h, 0, &client) },
				"cn_close":         func() int32 { return cnClose(h, q.h, 0) },
				"cn_stats":         func() int32 { return cnStats(h, &out) },
				"cn_send":          func() int32 { return cnSend(h, cs(ch), b, n, q.h, 0, &op) },
				"cn_group_send":    func() int32 { return cnGroupSend(h, cs("grp"), b, n, q.h, 0, &op) },
				"cn_receive":       func() int32 { return cnReceive(h, cs(ch), q.h, 0, &out, &blen, &op) },
				"cn_cancel":        func() int32 { return cnCancel(h, 1) },
				"cn_new_channel":   func() int32 { return cnNewChannel(h, nil, q.h, 0, &out, &op) },
				"cn_group_add":     func() int32 { return cnGroupAdd(h, cs("grp"), cs(ch), q.h, 0, &op) },
				"cn_group_discard": func() int32 { return cnGroupDiscard(h, cs("grp"), cs(ch)) },
				"cn_flush":         func() int32 { return cnFlush(h) },
				"cn_read_events":   func() int32 { var fd int64; return cnReadEvents(h, &fd) },
				"cn_on_readable":   func() int32 { return cnOnReadable(h, q.h) },
			}
			res := map[string]outcome{}
			for fn, f := range calls {
				st := f()
				res[fn] = outcome{st, cnLastError()}
			}
			mu.Lock()
			got = res
			mu.Unlock()
		})
	})
	c := connectDoc(t, config(t, []string{ts.url}, map[string]any{"capacity": 1}), sink)
	h, ch = c.h, c.newChannel("")
	// A full mailbox (capacity 1) drops the second message and logs a warning.
	c.send(ch, numbered(t, 0))
	c.send(ch, numbered(t, 1))
	c.barrier(c)
	for deadline := time.Now().Add(wait); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		done := got != nil
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log record within %s: %v", wait, sink.snapshot())
		}
	}
	mu.Lock()
	var wrong []string
	for fn, o := range got {
		if o.st != cnIllegalState || o.msg == "" {
			wrong = append(wrong, fmt.Sprintf("%s: %s (%q)", fn, name(o.st), o.msg))
		}
	}
	mu.Unlock()
	if len(wrong) > 0 || len(got) != 16 {
		t.Errorf("calls from the log callback (%d made): want CN_ILLEGAL_STATE with a detail from each, got:\n  %s", len(got), strings.Join(wrong, "\n  "))
	}
	// None of them did anything: the queue is alive and empty, the client open, the first
	// message still waiting (no receive took it), nothing more published.
	q.quiet(20 * time.Millisecond)
	if got := numberOf(c.receiveNow(ch)); got != 0 {
		t.Errorf("the channel held n=%d, want 0", got)
	}
	if s := c.stats(); stat(s, "published") != 3 || s["connected"] != true {
		t.Errorf("stats: published %v connected %v, want 3 and true", s["published"], s["connected"])
	}
	if n := ts.srv.NumClients(); n != 1 {
		t.Errorf("the server has %d connections, want 1: a connect from the log callback connected", n)
	}
}
