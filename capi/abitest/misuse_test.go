//go:build linux

package abitest

import (
	"strings"
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

func TestMisuseArguments(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	never := newWaiter(64, nil)
	cb, cl := completeCB, never.closure
	body := numbered(t, 1)
	b, n := bp(body)
	var out, blen uintptr
	var op uint64
	h := c.h
	calls := []call{
		{"cn_send(channel NULL)", cnInvalidArg, func() int32 { return cnSend(h, nil, b, n, cb, cl, &op) }},
		{"cn_send(body NULL)", cnInvalidArg, func() int32 { return cnSend(h, cs(ch), nil, n, cb, cl, &op) }},
		{"cn_send(body NULL, len 0)", cnInvalidArg, func() int32 { return cnSend(h, cs(ch), nil, 0, cb, cl, &op) }},
		{"cn_group_send(group NULL)", cnInvalidArg, func() int32 { return cnGroupSend(h, nil, b, n, cb, cl, &op) }},
		{"cn_group_send(body NULL)", cnInvalidArg, func() int32 { return cnGroupSend(h, cs("grp"), nil, n, cb, cl, &op) }},
		{"cn_receive(channel NULL)", cnInvalidArg, func() int32 { return cnReceive(h, nil, cb, cl, &out, &blen, &op) }},
		{"cn_receive(body NULL)", cnInvalidArg, func() int32 { return cnReceive(h, cs(ch), cb, cl, nil, &blen, &op) }},
		{"cn_receive(len NULL)", cnInvalidArg, func() int32 { return cnReceive(h, cs(ch), cb, cl, &out, nil, &op) }},
		{"cn_put_back(channel NULL)", cnInvalidArg, func() int32 { return cnPutBack(h, nil, b, n) }},
		{"cn_put_back(body NULL)", cnInvalidArg, func() int32 { return cnPutBack(h, cs(ch), nil, n) }},
		{"cn_new_channel(channel NULL)", cnInvalidArg, func() int32 { return cnNewChannel(h, nil, cb, cl, nil, &op) }},
		{"cn_group_add(group NULL)", cnInvalidArg, func() int32 { return cnGroupAdd(h, nil, cs(ch), cb, cl, &op) }},
		{"cn_group_add(channel NULL)", cnInvalidArg, func() int32 { return cnGroupAdd(h, cs("grp"), nil, cb, cl, &op) }},
		{"cn_group_discard(group NULL)", cnInvalidArg, func() int32 { return cnGroupDiscard(h, nil, cs(ch)) }},
		{"cn_group_discard(channel NULL)", cnInvalidArg, func() int32 { return cnGroupDiscard(h, cs("grp"), nil) }},
		{"cn_stats(json NULL)", cnInvalidArg, func() int32 { return cnStats(h, nil) }},
	}
	// Invalid UTF-8 anywhere a string goes in.
	bad := "caf\xff"
	calls = append(calls, []call{
		{"cn_send(channel invalid UTF-8)", cnInvalidArg, func() int32 { return cnSend(h, cs(bad), b, n, cb, cl, &op) }},
		{"cn_send(process channel invalid UTF-8)", cnInvalidArg, func() int32 { return cnSend(h, cs(ch[:len(ch)-1]+"\xff"), b, n, cb, cl, &op) }},
		{"cn_group_send(group invalid UTF-8)", cnInvalidArg, func() int32 { return cnGroupSend(h, cs(bad), b, n, cb, cl, &op) }},
		{"cn_receive(channel invalid UTF-8)", cnInvalidArg, func() int32 { return cnReceive(h, cs(bad), cb, cl, &out, &blen, &op) }},
		{"cn_put_back(channel invalid UTF-8)", cnInvalidArg, func() int32 { return cnPutBack(h, cs(bad), b, n) }},
		{"cn_new_channel(prefix invalid UTF-8)", cnInvalidArg, func() int32 { return cnNewChannel(h, cs(bad), cb, cl, &out, &op) }},
		{"cn_group_add(group invalid UTF-8)", cnInvalidArg, func() int32 { return cnGroupAdd(h, cs(bad), cs(ch), cb, cl, &op) }},
		{"cn_group_add(channel invalid UTF-8)", cnInvalidArg, func() int32 { return cnGroupAdd(h, cs("grp"), cs(bad), cb, cl, &op) }},
		{"cn_group_discard(group invalid UTF-8)", cnInvalidArg, func() int32 { return cnGroupDiscard(h, cs(bad), cs(ch)) }},
		{"cn_group_discard(channel invalid UTF-8)", cnInvalidArg, func() int32 { return cnGroupDiscard(h, cs("grp"), cs(bad)) }},
	}...)
	// Names the layer refuses.
	for _, bad := range []string{"bad name", "a..b", ".lead", "trail.", "a*b", "a>b", ""} {
		calls = append(calls, []call{
			{"cn_send(" + bad + ")", cnInvalidName, func() int32 { return cnSend(h, cs(bad), b, n, cb, cl, &op) }},
			{"cn_group_send(" + bad + ")", cnInvalidName, func() int32 { return cnGroupSend(h, cs(bad), b, n, cb, cl, &op) }},
			{"cn_receive(" + bad + ")", cnInvalidName, func() int32 { return cnReceive(h, cs(bad), cb, cl, &out, &blen, &op) }},
			{"cn_put_back(" + bad + ")", cnInvalidName, func() int32 { return cnPutBack(h, cs(bad), b, n) }},
			{"cn_group_add(group " + bad + ")", cnInvalidName, func() int32 { return cnGroupAdd(h, cs(bad), cs(ch), cb, cl, &op) }},
			{"cn_group_add(channel " + bad + ")", cnInvalidName, func() int32 { return cnGroupAdd(h, cs("grp"), cs(bad), cb, cl, &op) }},
			{"cn_group_discard(group " + bad + ")", cnInvalidName, func() int32 { return cnGroupDiscard(h, cs(bad), cs(ch)) }},
		}...)
		if bad != "" { // "" as the prefix means "specific"
			calls = append(calls, call{"cn_new_channel(prefix " + bad + ")", cnInvalidName,
				func() int32 { return cnNewChannel(h, cs(bad), cb, cl, &out, &op) }})
		}
	}
	calls = append(calls, call{"cn_send(name too long)", cnInvalidName,
		func() int32 { return cnSend(h, cs(strings.Repeat("a", 200)), b, n, cb, cl, &op) }})
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
			{"cn_send(" + what + ")", cnInvalidMessage, func() int32 { return cnSend(h, cs(ch), b, n, cb, cl, &op) }},
			{"cn_group_send(" + what + ")", cnInvalidMessage, func() int32 { return cnGroupSend(h, cs("grp"), b, n, cb, cl, &op) }},
		}...)
	}
	run(t, calls)
	never.none(t, 100*time.Millisecond)
	// Nothing was sent and the client still works.
	c.send(ch, numbered(t, 5))
	if got := numberOf(c.receiveAny(ch)); got != 5 {
		t.Errorf("after the refused calls a round trip got n=%d, want 5 (a refused send was delivered?)", got)
	}
	if s := c.stats(); s["published"] != float64(1) {
		t.Errorf("published = %v after refused sends and one send, want 1", s["published"])
	}
}

func TestMessageTooLarge(t *testing.T) {
	ts := startServer(t, func(o *server.Options) { o.MaxPayload = 1024 })
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	plain := uniq(t, "plain")
	never := newWaiter(8, nil)
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
		{"cn_send(2 KB)", cnTooLarge, func() int32 { return cnSend(c.h, cs(ch), bb, bn, completeCB, never.closure, &op) }},
		{"cn_send(2 KB, plain)", cnTooLarge, func() int32 { return cnSend(c.h, cs(plain), bb, bn, completeCB, never.closure, &op) }},
		{"cn_group_send(2 KB)", cnTooLarge, func() int32 { return cnGroupSend(c.h, cs("grp"), bb, bn, completeCB, never.closure, &op) }},
		{"cn_send(1000 B + Channel header)", cnTooLarge, func() int32 { return cnSend(c.h, cs(ch), eb, en, 0, 0, nil) }},
	})
	// The same 1000 bytes without a header fit.
	if st := cnGroupSend(c.h, cs("grp"), eb, en, 0, 0, nil); st != cnOK {
		t.Errorf("cn_group_send(1000 B): %s, want CN_OK", name(st))
	}
	never.none(t, 50*time.Millisecond)
	// The connection stayed up, and nothing was sent.
	c.send(ch, numbered(t, 9))
	if got := numberOf(c.receiveAny(ch)); got != 9 {
		t.Errorf("after CN_MESSAGE_TOO_LARGE the round trip got n=%d, want 9", got)
	}
	if s := c.stats(); s["connected"] != true {
		t.Errorf("stats after CN_MESSAGE_TOO_LARGE: %v", s)
	}
}

func TestForeignChannel(t *testing.T) {
	ts := startServer(t)
	a := connect(t, ts.url, nil)
	b := connect(t, ts.url, nil)
	theirs := b.newChannel("")
	never := newWaiter(8, nil)
	var out, n uintptr
	var op uint64
	prefixOfTheirs := theirs[:strings.IndexByte(theirs, '!')+1]
	run(t, []call{
		{"cn_receive(another client's channel)", cnForeign, func() int32 {
			return cnReceive(a.h, cs(theirs), completeCB, never.closure, &out, &n, &op)
		}},
		{"cn_receive(another client's channel, waiting)", cnForeign, func() int32 {
			return cnReceive(a.h, cs(theirs), 0, 0, &out, &n, &op)
		}},
		{"cn_receive(another client's prefix)", cnForeign, func() int32 {
			return cnReceive(a.h, cs(prefixOfTheirs), completeCB, never.closure, &out, &n, &op)
		}},
		{"cn_group_add(another client's channel)", cnForeign, func() int32 {
			return cnGroupAdd(a.h, cs("grp"), cs(theirs), completeCB, never.closure, &op)
		}},
	})
	never.none(t, 50*time.Millisecond)
	// Sending to it works.
	a.send(theirs, numbered(t, 4))
	if got := numberOf(b.receiveAny(theirs)); got != 4 {
		t.Errorf("send to another client's channel: it received n=%d, want 4", got)
	}
}

// Waiting calls (callback NULL) of receive, close and connect are refused inside a callback;
// other calls, and the pending form, work there.
func TestWaitingCallInsideCallback(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	other := c.newChannel("")
	doc := config(t, []string{ts.url}, nil)
	type outcome struct {
		st  int32
		msg string
	}
	got := map[string]outcome{}
	inner := newWaiter(4, nil)
	w := newWaiter(2, func(r cbResult) {
		var out, n uintptr
		var op uint64
		got["receive"] = outcome{cnReceive(c.h, cs(other), 0, 0, &out, &n, &op), cnLastError()}
		got["close"] = outcome{cnClose(c.h, 0, 0), cnLastError()}
		var h uint64
		got["connect"] = outcome{cnConnect(cs(doc), 0, 0, 0, 0, &h), cnLastError()}
		if h != 0 && got["connect"].st == cnOK {
			cnClose(h, completeCB, inner.closure)
		}
		body := numbered(t, 2)
		b, bn := bp(body)
		got["send"] = outcome{cnSend(c.h, cs(other), b, bn, 0, 0, nil), cnLastError()}
		got["stats"] = outcome{cnStats(c.h, &out), cnLastError()}
		cnFree(out)
		// Waiting forms the header does not refuse: they wait on the server, not on this thread.
		got["new_channel"] = outcome{cnNewChannel(c.h, cs("in.callback"), 0, 0, &out, nil), cnLastError()}
		if got["new_channel"].st == cnOK {
			cnFree(out)
		}
		got["group_add"] = outcome{cnGroupAdd(c.h, cs("in-callback"), cs(other), 0, 0, nil), cnLastError()}
		got["receive pending"] = outcome{cnReceive(c.h, cs(other), completeCB, inner.closure, &out, &n, &op), cnLastError()}
		if got["receive pending"].st == cnOK {
			cnFree(out)
		}
	})
	c.receivePending(ch, w)
	c.send(ch, numbered(t, 1))
	if r := w.wait(t); r.Status != cnOK {
		t.Fatalf("callback: %s", name(r.Status))
	}
	for _, fn := range []string{"receive", "close", "connect"} {
		if o := got[fn]; o.st != cnIllegalState || o.msg == "" {
			t.Errorf("waiting cn_%s inside a callback: %s (%q), want CN_ILLEGAL_STATE with a detail", fn, name(o.st), o.msg)
		}
	}
	for _, fn := range []string{"send", "stats", "new_channel", "group_add"} {
		if o := got[fn]; o.st != cnOK || o.msg != "" {
			t.Errorf("cn_%s inside a callback: %s (%q), want CN_OK", fn, name(o.st), o.msg)
		}
	}
	// The pending receive made in the callback gets the message sent in the callback.
	switch o := got["receive pending"]; o.st {
	case cnOK:
	case cnPending:
		if r := inner.wait(t); r.Status != cnOK || numberOf(r.Data) != 2 {
			t.Errorf("pending receive from a callback: %s n=%d", name(r.Status), numberOf(r.Data))
		}
	default:
		t.Errorf("pending cn_receive inside a callback: %s (%q)", name(o.st), o.msg)
	}
	// The refused close did not close the client.
	if s := c.stats(); s["connected"] != true {
		t.Errorf("client after a refused close from a callback: %v", s)
	}
}
