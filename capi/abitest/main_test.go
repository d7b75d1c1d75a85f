//go:build linux

package abitest

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/vmihailenco/msgpack/v5"
)

func TestMain(m *testing.M) {
	if err := load(); err != nil {
		fmt.Fprintln(os.Stderr, "abitest:", err)
		os.Exit(1)
	}
	code := m.Run()
	strayMu.Lock()
	for _, s := range strays {
		fmt.Fprintln(os.Stderr, "abitest: FAIL:", s)
		code = 1
	}
	strayMu.Unlock()
	os.Exit(code)
}

// wait is how long a test waits for a callback that must come.
const wait = 5 * time.Second

// ---- Servers --------------------------------------------------------------------------------

// testServer is an embedded nats-server on 127.0.0.1.
type testServer struct {
	srv *server.Server
	url string
}

// freePort asks the kernel for a free loopback port.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startServer runs a nats-server for the test; configure may change its options.
func startServer(t testing.TB, configure ...func(*server.Options)) *testServer {
	t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: freePort(t), NoLog: true, NoSigs: true}
	for _, f := range configure {
		f(opts)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return &testServer{srv: srv, url: fmt.Sprintf("nats://127.0.0.1:%d", opts.Port)}
}

// waitInterest waits until the server has a subscription matching subject.
func (ts *testServer) waitInterest(t testing.TB, subject string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !ts.srv.GlobalAccount().SubscriptionInterest(subject) {
		if time.Now().After(deadline) {
			t.Fatalf("no subscription on %s", subject)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// silentServer accepts connections and never says anything (no INFO), so a connect hangs until
// its connect_timeout.
func silentServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return "nats://" + ln.Addr().String()
}

// deadURL is a loopback URL on which nothing listens.
func deadURL(t testing.TB) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", freePort(t))
}

// ---- Messages -------------------------------------------------------------------------------

// pack encodes a message body (a msgpack map).
func pack(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// numbered is the body {"type": "test", "n": n}.
func numbered(t testing.TB, n int) []byte {
	return pack(t, map[string]any{"type": "test", "n": n})
}

// numberOf decodes the "n" of a numbered body, -1 if it is not one.
func numberOf(body []byte) int {
	var m map[string]any
	if err := msgpack.Unmarshal(body, &m); err != nil {
		return -1
	}
	switch n := m["n"].(type) {
	case int8:
		return int(n)
	case int16:
		return int(n)
	case int32:
		return int(n)
	case int64:
		return int(n)
	case uint8:
		return int(n)
	case uint16:
		return int(n)
	case uint32:
		return int(n)
	case uint64:
		return int(n)
	}
	return -1
}

// ---- Clients --------------------------------------------------------------------------------

// client is a connected cn_client with its log sink.
type client struct {
	t   testing.TB
	h   uint64
	log *logSink

	barrierOnce sync.Once
	barrierCh   string
}

// config is a configuration document for servers with extra keys.
func config(t testing.TB, servers []string, extra map[string]any) string {
	t.Helper()
	doc := map[string]any{"servers": servers}
	for k, v := range extra {
		doc[k] = v
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// connect connects a client with the waiting form; it is closed when the test ends.
func connect(t testing.TB, url string, extra map[string]any) *client {
	t.Helper()
	c := &client{t: t, log: newLogSink()}
	doc := config(t, []string{url}, extra)
	st, msg := onThread(func() int32 { return cnConnect(cs(doc), logCB, c.log.closure, 0, 0, &c.h) })
	if st != cnOK {
		t.Fatalf("cn_connect: %s (%s)", name(st), msg)
	}
	if c.h == 0 {
		t.Fatal("cn_connect: CN_OK with handle 0")
	}
	t.Cleanup(func() {
		if st := cnClose(c.h, 0, 0); st != cnOK && st != cnClosed {
			t.Errorf("cleanup: cn_close: %s", name(st))
		}
	})
	return c
}

// newChannel makes a process channel in either form the header allows: at once, or pending
// with the name as the callback's text.
func (c *client) newChannel(prefix string) string {
	c.t.Helper()
	w := newWaiter(1, nil)
	var out uintptr
	var op uint64
	var p *byte
	if prefix != "" {
		p = cs(prefix)
	}
	st, msg := onThread(func() int32 { return cnNewChannel(c.h, p, completeCB, w.closure, &out, &op) })
	switch st {
	case cnOK:
		if out == 0 {
			c.t.Fatal("cn_new_channel: CN_OK without a name")
		}
		return takeString(out)
	case cnPending:
		r := w.wait(c.t)
		if r.Status != cnOK || !r.HasText || r.Text == "" {
			c.t.Fatalf("cn_new_channel callback: %s text %q", name(r.Status), r.Text)
		}
		if r.HasData || r.Len != 0 {
			c.t.Errorf("cn_new_channel callback with data (%d bytes), want NULL and 0", r.Len)
		}
		return r.Text
	}
	c.t.Fatalf("cn_new_channel: %s (%s)", name(st), msg)
	return ""
}

// send sends body with the waiting form and requires CN_OK.
func (c *client) send(channel string, body []byte) {
	c.t.Helper()
	b, n := bp(body)
	st, msg := onThread(func() int32 { return cnSend(c.h, cs(channel), b, n, 0, 0, nil) })
	if st != cnOK {
		c.t.Fatalf("cn_send(%s): %s (%s)", channel, name(st), msg)
	}
}

// groupSend sends body to a group and requires CN_OK.
func (c *client) groupSend(group string, body []byte) {
	c.t.Helper()
	b, n := bp(body)
	st, msg := onThread(func() int32 { return cnGroupSend(c.h, cs(group), b, n, 0, 0, nil) })
	if st != cnOK {
		c.t.Fatalf("cn_group_send(%s): %s (%s)", group, name(st), msg)
	}
}

// groupAdd adds channel to group with the waiting form.
func (c *client) groupAdd(group, channel string) {
	c.t.Helper()
	st, msg := onThread(func() int32 { return cnGroupAdd(c.h, cs(group), cs(channel), 0, 0, nil) })
	if st != cnOK {
		c.t.Fatalf("cn_group_add(%s, %s): %s (%s)", group, channel, name(st), msg)
	}
}

// receive starts a receive with the callback of w: it returns the status, the body when the
// message was there (CN_OK) and the operation handle when it is pending.
func (c *client) receive(channel string, w *waiter) (st int32, body []byte, op uint64) {
	c.t.Helper()
	var out, n uintptr
	st, msg := onThread(func() int32 { return cnReceive(c.h, cs(channel), completeCB, w.closure, &out, &n, &op) })
	switch st {
	case cnOK:
		if out == 0 {
			c.t.Fatalf("cn_receive(%s): CN_OK with a NULL body", channel)
		}
		return st, takeBytes(out, n), 0
	case cnPending:
		if op == 0 {
			c.t.Errorf("cn_receive(%s): CN_PENDING with op 0", channel)
		}
		return st, nil, op
	}
	c.t.Logf("cn_receive(%s): %s (%s)", channel, name(st), msg)
	return st, nil, 0
}

// receivePending starts a receive that must be pending.
func (c *client) receivePending(channel string, w *waiter) uint64 {
	c.t.Helper()
	st, _, op := c.receive(channel, w)
	if st != cnPending {
		c.t.Fatalf("cn_receive(%s): %s, want CN_PENDING", channel, name(st))
	}
	return op
}

// receiveNow receives a message that must be waiting already.
func (c *client) receiveNow(channel string) []byte {
	c.t.Helper()
	w := newWaiter(1, nil)
	st, body, op := c.receive(channel, w)
	if st != cnOK {
		if st == cnPending {
			cnCancel(c.h, op)
		}
		c.t.Fatalf("cn_receive(%s): %s, want CN_OK with the waiting message", channel, name(st))
	}
	return body
}

// receiveAny receives the next message, now or through the callback.
func (c *client) receiveAny(channel string) []byte {
	c.t.Helper()
	w := newWaiter(1, nil)
	st, body, _ := c.receive(channel, w)
	switch st {
	case cnOK:
		return body
	case cnPending:
		r := w.wait(c.t)
		if r.Status != cnOK {
			c.t.Fatalf("cn_receive(%s) callback: %s (%s)", channel, name(r.Status), r.Text)
		}
		return r.Data
	}
	c.t.Fatalf("cn_receive(%s): %s", channel, name(st))
	return nil
}

// stats returns the client's counters.
func (c *client) stats() map[string]any {
	c.t.Helper()
	var out uintptr
	st, msg := onThread(func() int32 { return cnStats(c.h, &out) })
	if st != cnOK || out == 0 {
		c.t.Fatalf("cn_stats: %s (%s)", name(st), msg)
	}
	doc := takeString(out)
	var m map[string]any
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		c.t.Fatalf("cn_stats: not JSON: %v: %s", err, doc)
	}
	return m
}

// barrier makes sure that every message from sends earlier has reached c's mailboxes:
// the sender sends a marker to a process channel of c with a waiting receive, and a client
// delivers in arrival order (one dispatcher), while the server keeps one publisher's order.
func (c *client) barrier(from *client) {
	c.t.Helper()
	c.barrierOnce.Do(func() { c.barrierCh = c.newChannel("") })
	w := newWaiter(1, nil)
	st, body, op := c.receive(c.barrierCh, w)
	if st == cnOK {
		c.t.Fatalf("barrier channel held a message: %x", body)
	}
	if st != cnPending || op == 0 {
		c.t.Fatalf("barrier receive: %s", name(st))
	}
	from.send(c.barrierCh, pack(c.t, map[string]any{"type": "barrier"}))
	if r := w.wait(c.t); r.Status != cnOK {
		c.t.Fatalf("barrier callback: %s (%s)", name(r.Status), r.Text)
	}
}

// wait returns the next callback result, failing the test after a while.
func (w *waiter) wait(t testing.TB) cbResult {
	t.Helper()
	select {
	case r := <-w.ch:
		return r
	case <-time.After(wait):
		t.Fatalf("no callback for closure %d within %s", w.closure, wait)
	}
	return cbResult{}
}

// none checks that no callback comes for d.
func (w *waiter) none(t testing.TB, d time.Duration) {
	t.Helper()
	select {
	case r := <-w.ch:
		t.Errorf("unexpected callback for closure %d: %s %q %x", w.closure, name(r.Status), r.Text, r.Data)
	case <-time.After(d):
	}
}

// processName is the format of cn_new_channel names.
var processName = regexp.MustCompile(`^([a-z][a-z0-9_.-]*)\.([0-9a-f]{12})![0-9a-f]{32}$`)

// clientIDOf is the client id of a process channel name.
func clientIDOf(t testing.TB, channel string) string {
	t.Helper()
	m := processName.FindStringSubmatch(channel)
	if m == nil {
		t.Fatalf("%q is not a process channel name", channel)
	}
	return m[2]
}

// uniq is a name no other test uses.
func uniq(t testing.TB, kind string) string {
	return fmt.Sprintf("%s%s%d", kind, strings.NewReplacer("/", "", "_", "").Replace(t.Name()), time.Now().UnixNano()%1000000)
}
