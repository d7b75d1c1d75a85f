//go:build linux

package abitest

import (
	"strings"
	"testing"
	"time"

	"github.com/channels-nats/channels-nats/layer"
)

func TestVersion(t *testing.T) {
	if got := cnVersion(); got != layer.Version {
		t.Errorf("cn_version() = %q, want layer.Version %q", got, layer.Version)
	}
	cnFree(0) // NULL is ignored
}

func TestStatusText(t *testing.T) {
	seen := map[string]int32{}
	for st := int32(0); st <= cnInternal; st++ {
		text := cnStatusText(st)
		if text == "" {
			t.Errorf("cn_status_text(%d) is empty", st)
			continue
		}
		if !strings.HasPrefix(text, name(st)) {
			t.Errorf("cn_status_text(%d) = %q, want it to name %s", st, text, name(st))
		}
		if prev, dup := seen[text]; dup {
			t.Errorf("cn_status_text(%d) = cn_status_text(%d) = %q", st, prev, text)
		}
		seen[text] = st
	}
	for _, st := range []int32{cnInternal + 1, 99, -1, 1 << 30} {
		text := cnStatusText(st)
		if _, known := seen[text]; known || text == "" {
			t.Errorf("cn_status_text(%d) = %q, want a text of its own for an unknown code", st, text)
		}
		if !strings.Contains(strings.ToLower(text), "unknown") {
			t.Errorf("cn_status_text(%d) = %q, want it to say the code is unknown", st, text)
		}
	}
}

func TestLastError(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	var out uintptr
	st, msg := onThread(func() int32 { return cnStats(c.h, &out) })
	cnFree(out)
	if st != cnOK || msg != "" {
		t.Errorf("after a success: %s, cn_last_error() = %q, want \"\"", name(st), msg)
	}
	st, msg = onThread(func() int32 { return cnCancel(0, 1) })
	if st != cnInvalidHandle || msg == "" {
		t.Errorf("after cn_cancel(0, 1): %s, cn_last_error() = %q, want CN_INVALID_HANDLE and a detail", name(st), msg)
	}
	// The same thread, failure then success: the success clears it.
	onThread(func() int32 {
		if st := cnCancel(0, 1); st != cnInvalidHandle {
			t.Errorf("cn_cancel(0, 1) = %s", name(st))
		}
		if cnLastError() == "" {
			t.Error("cn_last_error() empty after a failure")
		}
		st := cnStats(c.h, &out)
		cnFree(out)
		if st != cnOK {
			t.Errorf("cn_stats = %s", name(st))
		}
		if e := cnLastError(); e != "" {
			t.Errorf("cn_last_error() = %q after a success that followed a failure", e)
		}
		return 0
	})
}

func TestConnectWaiting(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	if st := cnFlush(c.h); st != cnOK {
		t.Errorf("cn_flush on a new client: %s", name(st))
	}
	// Handles are never reused: a second client gets a new one, also after a close.
	d := connect(t, ts.url, nil)
	if st := cnClose(d.h, 0, 0); st != cnOK {
		t.Fatalf("cn_close: %s", name(st))
	}
	e := connect(t, ts.url, nil)
	if c.h == d.h || d.h == e.h || c.h == e.h {
		t.Errorf("handles reused: %d %d %d", c.h, d.h, e.h)
	}
	// NULL and "" mean all defaults (nats://127.0.0.1:4222, which need not run): never an
	// argument or configuration error.
	for _, doc := range []*byte{nil, cs("")} {
		var h uint64
		st := cnConnect(doc, 0, 0, 0, 0, &h)
		switch st {
		case cnOK:
			cnClose(h, 0, 0)
		case cnNoServer, cnTimeout:
		default:
			t.Errorf("cn_connect with default configuration: %s", name(st))
		}
	}
}

func TestConnectPending(t *testing.T) {
	ts := startServer(t)
	w := newWaiter(2, nil)
	log := newLogSink()
	var h uint64
	doc := config(t, []string{ts.url}, nil)
	st := cnConnect(cs(doc), logCB, log.closure, completeCB, w.closure, &h)
	if st != cnPending && st != cnOK {
		t.Fatalf("cn_connect (pending form): %s", name(st))
	}
	if h == 0 {
		t.Fatal("cn_connect did not store the handle at once")
	}
	t.Cleanup(func() { cnClose(h, 0, 0) })
	if st == cnPending {
		r := w.wait(t)
		if r.Status != cnOK {
			t.Fatalf("connect callback: %s (%s)", name(r.Status), r.Text)
		}
		if r.HasData || r.Len != 0 {
			t.Errorf("connect callback got data")
		}
	}
	var out uintptr
	if st := cnStats(h, &out); st != cnOK {
		t.Errorf("cn_stats after the connect callback: %s", name(st))
	}
	cnFree(out)
	w.none(t, 50*time.Millisecond)
}

func TestConnectInvalidConfig(t *testing.T) {
	ts := startServer(t)
	for _, doc := range []string{`{`, `[1,2]`, `{"servers": 3}`, `{"capacity": "many"}`} {
		w := newWaiter(1, nil)
		var h uint64
		st, msg := onThread(func() int32 { return cnConnect(cs(doc), 0, 0, completeCB, w.closure, &h) })
		if st != cnInvalidConfig || msg == "" {
			t.Errorf("cn_connect(%s): %s (%q), want CN_INVALID_CONFIG with a detail", doc, name(st), msg)
		}
		w.none(t, 0)
		if st == cnOK || st == cnPending {
			cnClose(h, 0, 0)
		}
	}
	doc := config(t, []string{ts.url}, map[string]any{"bogus_key": 1})
	st, msg := onThread(func() int32 {
		var h uint64
		return cnConnect(cs(doc), 0, 0, 0, 0, &h)
	})
	if st != cnInvalidConfig {
		t.Fatalf("unknown key: %s, want CN_INVALID_CONFIG", name(st))
	}
	for _, want := range []string{"bogus_key", "servers", "prefix", "capacity", "expiry", "connect_options"} {
		if !strings.Contains(msg, want) {
			t.Errorf("unknown key: cn_last_error() = %q, want it to name %q (the key and the known keys)", msg, want)
		}
	}
	// Unknown keys in connect_options too.
	doc = config(t, []string{ts.url}, map[string]any{"connect_options": map[string]any{"nosuch": true}})
	st, msg = onThread(func() int32 {
		var h uint64
		return cnConnect(cs(doc), 0, 0, 0, 0, &h)
	})
	if st != cnInvalidConfig || !strings.Contains(msg, "nosuch") {
		t.Errorf("unknown connect option: %s (%q), want CN_INVALID_CONFIG naming it", name(st), msg)
	}
	// Invalid UTF-8 in the document is an argument error.
	st, _ = onThread(func() int32 {
		var h uint64
		return cnConnect(cs("{\"prefix\": \"\xff\"}"), 0, 0, 0, 0, &h)
	})
	if st != cnInvalidArg {
		t.Errorf("config with invalid UTF-8: %s, want CN_INVALID_ARG", name(st))
	}
}

func TestConnectNoServer(t *testing.T) {
	// Credentials in the URL never appear in error texts.
	url := strings.Replace(deadURL(t), "nats://", "nats://alice:s3cret@", 1)
	doc := config(t, []string{url}, map[string]any{"connect_options": map[string]any{"connect_timeout": 0.5}})
	var h uint64
	st, msg := onThread(func() int32 { return cnConnect(cs(doc), 0, 0, 0, 0, &h) })
	if st != cnNoServer || msg == "" {
		t.Errorf("waiting connect to a dead port: %s (%q), want CN_NO_SERVER with a detail", name(st), msg)
	}
	if strings.Contains(msg, "s3cret") {
		t.Errorf("cn_last_error() shows the password: %q", msg)
	}
	if h != 0 {
		if st := cnStats(h, new(uintptr)); st != cnClosed {
			t.Errorf("handle of a failed waiting connect: cn_stats = %s, want CN_CLOSED", name(st))
		}
	}

	w := newWaiter(2, nil)
	h = 0
	st = cnConnect(cs(doc), 0, 0, completeCB, w.closure, &h)
	if st != cnPending {
		t.Fatalf("pending connect to a dead port: %s, want CN_PENDING", name(st))
	}
	if h == 0 {
		t.Fatal("pending connect did not store the handle at once")
	}
	r := w.wait(t)
	if r.Status != cnNoServer || !r.HasText || r.Text == "" {
		t.Errorf("connect callback: %s (%q), want CN_NO_SERVER with a detail", name(r.Status), r.Text)
	}
	if strings.Contains(r.Text, "s3cret") {
		t.Errorf("the connect callback's text shows the password: %q", r.Text)
	}
	// The handle was released: later calls are CN_CLOSED.
	var out, n uintptr
	var op uint64
	body := numbered(t, 1)
	b, bn := bp(body)
	checks := map[string]int32{
		"cn_stats":       cnStats(h, &out),
		"cn_flush":       cnFlush(h),
		"cn_send":        cnSend(h, cs("chan"), b, bn, 0, 0, nil),
		"cn_receive":     cnReceive(h, cs("chan"), completeCB, w.closure, &out, &n, &op),
		"cn_new_channel": cnNewChannel(h, nil, completeCB, w.closure, &out, &op),
		"cn_cancel":      cnCancel(h, 1),
		"cn_close":       cnClose(h, 0, 0),
	}
	for fn, st := range checks {
		if st != cnClosed {
			t.Errorf("%s on the handle of a failed connect: %s, want CN_CLOSED", fn, name(st))
		}
	}
	w.none(t, 50*time.Millisecond)
}

func TestConnectNullClient(t *testing.T) {
	ts := startServer(t)
	doc := config(t, []string{ts.url}, nil)
	w := newWaiter(1, nil)
	for _, cb := range []uintptr{0, completeCB} {
		st, msg := onThread(func() int32 { return cnConnect(cs(doc), 0, 0, cb, w.closure, nil) })
		if st != cnInvalidArg || msg == "" {
			t.Errorf("cn_connect(client NULL, callback %v): %s (%q), want CN_INVALID_ARG", cb != 0, name(st), msg)
		}
	}
	w.none(t, 100*time.Millisecond)
	if n := ts.srv.NumClients(); n != 0 {
		t.Errorf("a refused connect left %d connection(s)", n)
	}
}

// A client whose connect is still in progress refuses calls with CN_ILLEGAL_STATE; closing it
// abandons the connect, whose callback reports CN_CLOSED before the close callback runs.
func TestConnectStillConnecting(t *testing.T) {
	url := silentServer(t)
	doc := config(t, []string{url}, map[string]any{"connect_options": map[string]any{"connect_timeout": 2}})
	connected := newWaiter(2, nil)
	var h uint64
	if st := cnConnect(cs(doc), 0, 0, completeCB, connected.closure, &h); st != cnPending {
		t.Fatalf("cn_connect to a silent server: %s, want CN_PENDING", name(st))
	}
	t.Cleanup(func() { cnClose(h, 0, 0) })
	other := newWaiter(16, nil)
	var out, n uintptr
	var op uint64
	body := numbered(t, 1)
	b, bn := bp(body)
	calls := []struct {
		fn   string
		call func() int32
	}{
		{"cn_stats", func() int32 { return cnStats(h, &out) }},
		{"cn_flush", func() int32 { return cnFlush(h) }},
		{"cn_send", func() int32 { return cnSend(h, cs("chan"), b, bn, completeCB, other.closure, &op) }},
		{"cn_group_send", func() int32 { return cnGroupSend(h, cs("grp"), b, bn, completeCB, other.closure, &op) }},
		{"cn_receive", func() int32 { return cnReceive(h, cs("chan"), completeCB, other.closure, &out, &n, &op) }},
		{"cn_new_channel", func() int32 { return cnNewChannel(h, nil, completeCB, other.closure, &out, &op) }},
		{"cn_group_add", func() int32 { return cnGroupAdd(h, cs("grp"), cs("chan"), completeCB, other.closure, &op) }},
		{"cn_group_discard", func() int32 { return cnGroupDiscard(h, cs("grp"), cs("chan")) }},
		{"cn_put_back", func() int32 { return cnPutBack(h, cs("chan"), b, bn) }},
	}
	for _, c := range calls {
		st, msg := onThread(c.call)
		if st != cnIllegalState {
			t.Errorf("%s while connecting: %s (%q), want CN_ILLEGAL_STATE", c.fn, name(st), msg)
		}
	}
	if r := connected.ch; len(r) != 0 {
		t.Fatal("the connect finished early; the silent server did not hold it")
	}
	closed := newWaiter(1, nil)
	st := cnClose(h, completeCB, closed.closure)
	if st == cnPending {
		rc := closed.wait(t)
		if rc.Status != cnOK {
			t.Errorf("close callback: %s", name(rc.Status))
		}
		select {
		case r := <-connected.ch:
			if r.Status != cnClosed {
				t.Errorf("abandoned connect: callback %s, want CN_CLOSED", name(r.Status))
			}
			if r.Seq > rc.Seq {
				t.Error("the connect callback ran after the close callback")
			}
		default:
			t.Error("the close callback ran, the connect callback did not (it must run exactly once, before)")
		}
	} else if st != cnOK {
		t.Fatalf("cn_close while connecting: %s", name(st))
	}
	other.none(t, 0)
	connected.none(t, 100*time.Millisecond)
	if got := connected.calls.Load(); got != 1 {
		t.Errorf("connect callback ran %d times, want 1", got)
	}

	// The waiting form against a silent server gives up after connect_timeout.
	doc = config(t, []string{url}, map[string]any{"connect_options": map[string]any{"connect_timeout": 0.3}})
	var h2 uint64
	start := time.Now()
	st = cnConnect(cs(doc), 0, 0, 0, 0, &h2)
	if st != cnTimeout && st != cnNoServer {
		t.Errorf("waiting connect to a silent server: %s, want CN_TIMEOUT or CN_NO_SERVER", name(st))
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("waiting connect took %s with connect_timeout 0.3", d)
	}
}
