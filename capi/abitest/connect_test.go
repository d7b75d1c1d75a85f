//go:build linux

package abitest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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
	for st := range statusNames {
		text := cnStatusText(st)
		if !strings.HasPrefix(text, name(st)) {
			t.Errorf("cn_status_text(%d) = %q, want it to name %s", st, text, name(st))
		}
		if prev, dup := seen[text]; dup {
			t.Errorf("cn_status_text(%d) = cn_status_text(%d) = %q", st, prev, text)
		}
		seen[text] = st
	}
	// 11 is not used any more (it was CN_CANCELLED): it is as unknown as any other number.
	for _, st := range []int32{11, cnInternal + 1, 99, -1, 1 << 30} {
		text := cnStatusText(st)
		if _, known := seen[text]; known || !strings.Contains(strings.ToLower(text), "unknown") {
			t.Errorf("cn_status_text(%d) = %q, want a text of its own saying the code is unknown", st, text)
		}
	}
}

func TestLastError(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	// The same thread, failure then success: the failure sets it, the success clears it.
	onThread(func() int32 {
		if st := cnCancel(0, 1); st != cnInvalidHandle {
			t.Errorf("cn_cancel(0, 1) = %s, want CN_INVALID_HANDLE", name(st))
		}
		if cnLastError() == "" {
			t.Error("cn_last_error() empty after a failure")
		}
		var out uintptr
		st := cnStats(c.h, &out)
		cnFree(out)
		if st != cnOK {
			t.Errorf("cn_stats = %s", name(st))
		}
		if e := cnLastError(); e != "" {
			t.Errorf("cn_last_error() = %q after a success that followed a failure", e)
		}
		// CN_PENDING is no failure either.
		if st := cnClose(c.h, c.own.h, 0); st != cnPending {
			t.Errorf("cn_close = %s, want CN_PENDING", name(st))
		}
		if e := cnLastError(); e != "" {
			t.Errorf("cn_last_error() = %q after CN_PENDING", e)
		}
		return 0
	})
	if r := c.own.one(); r.Op != c.h || r.Status != cnOK {
		t.Errorf("close result %v", r)
	}
}

// Every client gets a new handle, from the counter that makes queue and op handles too: none is
// reused, also after a close.
func TestConnectHandles(t *testing.T) {
	ts := startServer(t)
	seen := map[uint64]string{}
	fresh := func(h uint64, what string) {
		t.Helper()
		if prev, dup := seen[h]; dup || h == 0 {
			t.Errorf("%s got handle %d, already the handle of %s", what, h, prev)
		}
		seen[h] = what
	}
	a := connect(t, ts.url, nil)
	fresh(a.h, "client a")
	fresh(a.own.h, "queue of a")
	fresh(a.receivePending(a.newChannel(""), nil), "an op of a")
	b := connect(t, ts.url, nil)
	fresh(b.h, "client b")
	fresh(b.own.h, "queue of b")
	closeClient(t, b)
	c := connect(t, ts.url, nil)
	fresh(c.h, "client c, after b was closed")
}

// NULL and "" mean all defaults (nats://127.0.0.1:4222, which need not run): the connect is
// accepted, never an argument or configuration error. Closing it abandons it.
func TestConnectDefaults(t *testing.T) {
	for _, doc := range []*byte{nil, cs("")} {
		q := newQueue(t)
		var h uint64
		st, msg := onThread(func() int32 { return cnConnect(doc, 0, 0, q.h, 0, &h) })
		if st != cnPending || h == 0 {
			t.Fatalf("cn_connect with the default configuration: %s (%q) handle %d, want CN_PENDING", name(st), msg, h)
		}
		results := 2 // the connect's and the close's
		switch st := cnClose(h, q.h, 0); st {
		case cnPending:
		case cnClosed: // the connect failed already: its result is the only one
			results = 1
		default:
			t.Fatalf("cn_close: %s", name(st))
		}
		for _, r := range q.wait(results) {
			if r.Op != h {
				t.Errorf("result %v of another op than the client %d", r, h)
			}
		}
	}
}

func TestConnectInvalidConfig(t *testing.T) {
	ts := startServer(t)
	q := newQueue(t)
	refused := func(doc *byte, want int32, what string) string {
		t.Helper()
		h := ^uint64(0)
		st, msg := onThread(func() int32 { return cnConnect(doc, logCB, 0, q.h, 0, &h) })
		if st != want || msg == "" || h != 0 {
			t.Errorf("cn_connect(%s): %s (%q) handle %d, want %s with a detail and handle 0", what, name(st), msg, h, name(want))
		}
		return msg
	}
	for _, doc := range []string{`{`, `[1,2]`, `{"servers": 3}`, `{"capacity": "many"}`, `{"connect_deadline": "soon"}`} {
		refused(cs(doc), cnInvalidConfig, doc)
	}
	msg := refused(cs(config(t, []string{ts.url}, map[string]any{"bogus_key": 1})), cnInvalidConfig, "an unknown key")
	for _, want := range []string{"bogus_key", "servers", "prefix", "capacity", "expiry", "connect_deadline", "publish_deadline", "connect_options"} {
		if !strings.Contains(msg, want) {
			t.Errorf("unknown key: cn_last_error() = %q, want it to name %q (the key and the known keys)", msg, want)
		}
	}
	msg = refused(cs(config(t, []string{ts.url}, map[string]any{"connect_options": map[string]any{"nosuch": true}})),
		cnInvalidConfig, "an unknown connect option")
	if !strings.Contains(msg, "nosuch") {
		t.Errorf("unknown connect option: cn_last_error() = %q, want it to name it", msg)
	}
	// Invalid UTF-8 in the document is an argument error.
	refused(cs("{\"prefix\": \"\xff\"}"), cnInvalidArg, "invalid UTF-8")
	// Nothing was started: no result, no connection.
	q.quiet(50 * time.Millisecond)
	if n := ts.srv.NumClients(); n != 0 {
		t.Errorf("refused connects left %d connection(s)", n)
	}
}

// client NULL, and a queue that is not one: refused at once, nothing is connected.
func TestConnectArguments(t *testing.T) {
	ts := startServer(t)
	doc := config(t, []string{ts.url}, nil)
	q := newQueue(t)
	freed := newQueue(t)
	if st := cnQueueFree(freed.h); st != cnOK {
		t.Fatalf("cn_queue_free: %s", name(st))
	}
	other := connect(t, ts.url, nil)
	if st, msg := onThread(func() int32 { return cnConnect(cs(doc), 0, 0, q.h, 0, nil) }); st != cnInvalidArg || msg == "" {
		t.Errorf("cn_connect(client NULL): %s (%q), want CN_INVALID_ARG with a detail", name(st), msg)
	}
	for _, bad := range []struct {
		what  string
		queue uint64
	}{{"queue 0", 0}, {"a queue never issued", 1 << 60}, {"a freed queue", freed.h}, {"a client handle as the queue", other.h}} {
		h := ^uint64(0)
		st, msg := onThread(func() int32 { return cnConnect(cs(doc), 0, 0, bad.queue, 0, &h) })
		if st != cnInvalidHandle || msg == "" || h != 0 {
			t.Errorf("cn_connect(%s): %s (%q) handle %d, want CN_INVALID_HANDLE with a detail and handle 0", bad.what, name(st), msg, h)
		}
	}
	q.quiet(100 * time.Millisecond)
	if n := ts.srv.NumClients(); n != 1 {
		t.Errorf("the server has %d connections, want 1 (only the other client): a refused connect connected", n)
	}
}

// Nothing listens: the connect's result is CN_NO_SERVER within connect_deadline, and its text
// names the server and connect_deadline (without the credentials of the URL). A server that
// accepts but never answers is the same. The handle is closed afterwards.
func TestConnectNoServer(t *testing.T) {
	for _, tc := range []struct{ what, url string }{{"nothing listens", deadURL(t)}, {"a silent server", silentServer(t)}} {
		t.Run(strings.ReplaceAll(tc.what, " ", "_"), func(t *testing.T) {
			url := strings.Replace(tc.url, "nats://", "nats://alice:s3cret@", 1)
			hostPort := strings.TrimPrefix(tc.url, "nats://")
			doc := config(t, []string{url}, map[string]any{"connect_deadline": 0.5})
			q := newQueue(t)
			closure := newClosure()
			start := time.Now()
			h := startConnect(t, doc, nil, q, closure)
			r := q.one()
			took := time.Since(start)
			if r.Op != h || r.Closure != closure || r.Status != cnNoServer || r.HasData {
				t.Fatalf("connect result %v, want op %d closure %d CN_NO_SERVER", r, h, closure)
			}
			for _, want := range []string{hostPort, "connect_deadline"} {
				if !strings.Contains(r.Text, want) {
					t.Errorf("connect result text %q does not name %q", r.Text, want)
				}
			}
			if strings.Contains(r.Text, "s3cret") {
				t.Errorf("connect result text shows the password: %q", r.Text)
			}
			if took > 2*time.Second {
				t.Errorf("the connect's result came after %s with connect_deadline 0.5", took)
			}
			checkAll(t, "the handle of a failed connect", h, cnClosed)
			q.quiet(50 * time.Millisecond)
		})
	}
}

// Twenty fresh clients in a row, each to a dead port: every connect's result is CN_NO_SERVER
// with its cause, and the very first call after it says CN_CLOSED, every time.
func TestConnectFailedRepeatedly(t *testing.T) {
	doc := config(t, []string{deadURL(t)}, map[string]any{"connect_deadline": 0.2})
	q := newQueue(t)
	for i := range 20 {
		h := startConnect(t, doc, nil, q, 0)
		r := q.one()
		if r.Op != h || r.Status != cnNoServer || !strings.Contains(r.Text, "connect_deadline") {
			t.Fatalf("client %d: connect result %v, want op %d CN_NO_SERVER explaining the cause", i, r, h)
		}
		var out uintptr
		if st, msg := onThread(func() int32 { return cnStats(h, &out) }); st != cnClosed || msg == "" {
			t.Fatalf("client %d: first call after the failed connect: cn_stats = %s (%q), want CN_CLOSED with a detail", i, name(st), msg)
		}
		if st := cnClose(h, q.h, 0); st != cnClosed {
			t.Fatalf("client %d: cn_close after the failed connect: %s, want CN_CLOSED", i, name(st))
		}
	}
	q.quiet(20 * time.Millisecond)
}

// A connect refused before anything is dialled (a TLS file that cannot be read) fails at once,
// before the client's log thread has run: its result still comes, and the first call after it
// says CN_CLOSED, a hundred times in a row. The client's log records are handed over before the
// result, so the result waits for that thread (it hung there once, when that thread started
// after the client was finished).
func TestConnectRefusedAtOnceWithALogCallback(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	doc := config(t, []string{deadURL(t)}, map[string]any{"connect_options": map[string]any{"tls_ca": missing}})
	q := newQueue(t)
	for i := range 100 {
		h := startConnect(t, doc, newLogSink(nil), q, 0)
		r := q.one()
		if r.Op != h || r.Status != cnNoServer || !strings.Contains(r.Text, "missing.pem") {
			t.Fatalf("client %d: connect result %v, want op %d CN_NO_SERVER naming the file", i, r, h)
		}
		if st := cnClose(h, q.h, 0); st != cnClosed {
			t.Fatalf("client %d: cn_close after the failed connect: %s, want CN_CLOSED", i, name(st))
		}
	}
	q.quiet(20 * time.Millisecond)
}

// While the connect is in progress the client refuses calls with CN_ILLEGAL_STATE. Closing it
// abandons the connect: the connect's result is CN_CLOSED, before the close's result.
func TestConnectStillConnecting(t *testing.T) {
	doc := config(t, []string{silentServer(t)}, map[string]any{"connect_deadline": 20})
	q := newQueue(t)
	h := startConnect(t, doc, nil, q, 0)
	var out, n uintptr
	var op uint64
	body := numbered(t, 1)
	b, bn := bp(body)
	for _, c := range []struct {
		fn   string
		call func() int32
	}{
		{"cn_stats", func() int32 { return cnStats(h, &out) }},
		{"cn_flush", func() int32 { return cnFlush(h) }},
		{"cn_read_events", func() int32 { var fd int64; return cnReadEvents(h, &fd) }},
		{"cn_on_readable", func() int32 { return cnOnReadable(h, q.h) }},
		{"cn_send", func() int32 { return cnSend(h, cs("chan"), b, bn, q.h, 0, &op) }},
		{"cn_group_send", func() int32 { return cnGroupSend(h, cs("grp"), b, bn, q.h, 0, &op) }},
		{"cn_receive", func() int32 { return cnReceive(h, cs("chan"), q.h, 0, &out, &n, &op) }},
		{"cn_receive(start over)", func() int32 { again := uint64(1); return cnReceive(h, nil, q.h, 0, &out, &n, &again) }},
		{"cn_new_channel", func() int32 { return cnNewChannel(h, nil, q.h, 0, &out, &op) }},
		{"cn_group_add", func() int32 { return cnGroupAdd(h, cs("grp"), cs("chan"), q.h, 0, &op) }},
		{"cn_group_discard", func() int32 { return cnGroupDiscard(h, cs("grp"), cs("chan")) }},
	} {
		if st, msg := onThread(c.call); st != cnIllegalState || msg == "" {
			t.Errorf("%s while connecting: %s (%q), want CN_ILLEGAL_STATE with a detail", c.fn, name(st), msg)
		}
	}
	q.quiet(50 * time.Millisecond) // the silent server holds the connect
	closure := newClosure()
	if st := cnClose(h, q.h, closure); st != cnPending {
		t.Fatalf("cn_close while connecting: %s, want CN_PENDING", name(st))
	}
	got := q.wait(2)
	if len(got) != 2 || got[0].Op != h || got[0].Status != cnClosed || got[1].Op != h || got[1].Closure != closure || got[1].Status != cnOK {
		t.Fatalf("results %v, want the connect's CN_CLOSED, then the close's CN_OK", got)
	}
	q.quiet(50 * time.Millisecond)
	checkAll(t, "a client closed while connecting", h, cnClosed)
}

// The header promises the final statistics as the close's text; a client closed while it
// connected has statistics too (nothing published, not connected).
func TestCloseWhileConnectingReportsStats(t *testing.T) {
	doc := config(t, []string{silentServer(t)}, map[string]any{"connect_deadline": 20})
	q := newQueue(t)
	h := startConnect(t, doc, nil, q, 0)
	if st := cnClose(h, q.h, 0); st != cnPending {
		t.Fatalf("cn_close while connecting: %s, want CN_PENDING", name(st))
	}
	got := q.wait(2)
	if len(got) != 2 || got[1].Status != cnOK {
		t.Fatalf("results %v, want the connect's CN_CLOSED, then the close's CN_OK", got)
	}
	if !got[1].HasText {
		t.Fatalf("close result of a client closed while connecting: text NULL, want the final statistics as JSON")
	}
	if s := parseStats(t, got[1].Text); s["connected"] != false || stat(s, "published") != 0 {
		t.Errorf("final statistics of a client that never connected: %v", s)
	}
}

// cn_queue_free of the queue a connect reports to closes the client still connecting: its
// handle says CN_CLOSED at once, and nothing is written to the notify pipe any more.
func TestConnectQueueFreed(t *testing.T) {
	doc := config(t, []string{silentServer(t)}, map[string]any{"connect_deadline": 20})
	q := newQueue(t)
	h := startConnect(t, doc, nil, q, 0)
	if st, msg := onThread(func() int32 { return cnQueueFree(q.h) }); st != cnOK {
		t.Fatalf("cn_queue_free with a connect in progress: %s (%q)", name(st), msg)
	}
	var out uintptr
	if st := cnStats(h, &out); st != cnClosed {
		t.Errorf("cn_stats after the connect's queue was freed: %s, want CN_CLOSED", name(st))
	}
	if st := cnClose(h, newQueue(t).h, 0); st != cnClosed {
		t.Errorf("cn_close after the connect's queue was freed: %s, want CN_CLOSED", name(st))
	}
	if readable(q.rfd, 100*time.Millisecond) {
		t.Errorf("notify byte on a freed queue")
	}
}

// noProcEnv marks the run of this binary that TestConnectWithoutProcWarns starts in a mount
// namespace of its own.
const noProcEnv = "CN_ABITEST_WITHOUT_PROC"

// Where /proc is missing, every call from a process's main thread pays a failed open of
// /proc/self/maps (the Go runtime asks glibc, which the Linux builds use, for the thread's stack
// bounds until it gets them), and cn_connect says so in the client's log; with /proc it says
// nothing. The test runs again in a mount namespace of its own, an empty tmpfs over /proc
// there; that needs root, like the Python suite's interop tests.
func TestConnectWithoutProcWarns(t *testing.T) {
	connect := func() []logRecord {
		sink := newLogSink(nil)
		q := newQueue(t)
		h := startConnect(t, config(t, []string{deadURL(t)}, map[string]any{"connect_deadline": 0.2}), sink, q, 0)
		if r := q.one(); r.Op != h || r.Status != cnNoServer {
			t.Fatalf("connect result %v, want op %d CN_NO_SERVER", r, h)
		}
		return sink.snapshot()
	}
	if os.Getenv(noProcEnv) == "" {
		for _, rec := range connect() {
			if strings.Contains(rec.Message, "/proc") {
				t.Errorf("with /proc mounted, the connect logged %q", rec.Message)
			}
		}
		if os.Geteuid() != 0 {
			t.Skip("the run without /proc needs root (a mount namespace and a mount)")
		}
		cmd := exec.Command(os.Args[0], "-test.run=^TestConnectWithoutProcWarns$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), noProcEnv+"=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS} // and / made private
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestConnectWithoutProcWarns") {
			t.Fatalf("the run without /proc failed (%v):\n%s", err, out)
		}
		return
	}
	if err := syscall.Mount("tmpfs", "/proc", "tmpfs", 0, "size=64k"); err != nil {
		t.Fatalf("hiding /proc: %v", err)
	}
	for _, rec := range connect() {
		if rec.Level == cnLogWarning && strings.Contains(rec.Message, "main thread") &&
			strings.Contains(rec.Message, "/proc/self/maps") && strings.Contains(rec.Message, "mount /proc") {
			return
		}
	}
	t.Fatal("without /proc, the connect logged no warning about calls from the main thread")
}
