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

	"github.com/channels-nats/channels-nats/internal/testport"
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

// wait is how long a test waits for a result that must come.
const wait = 5 * time.Second

// ---- Servers --------------------------------------------------------------------------------

// testServer is an embedded nats-server on 127.0.0.1.
type testServer struct {
	srv *server.Server
	url string
}

// startServer runs a nats-server for the test; configure may change its options.
func startServer(t testing.TB, configure ...func(*server.Options)) *testServer {
	t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: testport.Free(t), NoLog: true, NoSigs: true}
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
// its connect_deadline.
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
	return fmt.Sprintf("nats://127.0.0.1:%d", testport.Free(t))
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

// paddedBody is a numbered message with a payload; a struct, so that its encoding (the order of
// the keys) is the same every time.
type paddedBody struct {
	Type string `msgpack:"type"`
	N    int    `msgpack:"n"`
	Pad  []byte `msgpack:"pad"`
}

// padded is a body numbered n with size bytes of payload holding every byte value (NULs too).
// The same n and size give the same bytes.
func padded(t testing.TB, n, size int) []byte {
	pad := make([]byte, size)
	for i := range pad {
		pad[i] = byte(i + n)
	}
	return pack(t, paddedBody{"test", n, pad})
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

// client is a connected cn_client. own is the queue of the helpers below: each of them has at
// most one operation pending on it and takes its result, so tests use queues of their own for
// the operations they look at.
type client struct {
	t   testing.TB
	h   uint64
	own *queue
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

// connect connects a client to url; it is closed when the test ends.
func connect(t testing.TB, url string, extra map[string]any) *client {
	t.Helper()
	return connectDoc(t, config(t, []string{url}, extra), nil)
}

// connectDoc connects a client with a configuration document and log sink (nil: one of its
// own), and checks the connect's result: op is the client handle, the closure comes back, CN_OK
// without text or data.
func connectDoc(t testing.TB, doc string, log *logSink) *client {
	t.Helper()
	if log == nil {
		log = newLogSink(nil)
	}
	c := &client{t: t, own: newQueue(t), log: log}
	closure := newClosure()
	c.h = startConnect(t, doc, log, c.own, closure)
	r := c.own.one()
	if r.Op != c.h || r.Closure != closure || r.Status != cnOK || r.HasText || r.HasData {
		t.Fatalf("connect result %v (text %v, data %v), want op %d closure %d CN_OK without text or data",
			r, r.HasText, r.HasData, c.h, closure)
	}
	return c
}

// startConnect is one cn_connect that must return CN_PENDING with a handle (log may be nil). The
// client is closed when the test ends.
func startConnect(t testing.TB, doc string, log *logSink, q *queue, closure uintptr) uint64 {
	t.Helper()
	var logFn, logClosure uintptr
	if log != nil {
		logFn, logClosure = logCB, log.closure
	}
	h := ^uint64(0) // garbage: the library must write it
	st, msg := onThread(func() int32 { return cnConnect(cs(doc), logFn, logClosure, q.h, closure, &h) })
	if st != cnPending || h == 0 || h == ^uint64(0) {
		t.Fatalf("cn_connect: %s (%s), handle %d; want CN_PENDING with a handle", name(st), msg, h)
	}
	t.Cleanup(func() { closeAtEnd(t, h) })
	return h
}

// closeAtEnd closes h unless it is closed already, and waits for the close's result on a queue
// of its own (the test's queues may be freed by now).
func closeAtEnd(t testing.TB, h uint64) {
	var qh uint64
	if st := cnQueueNew(-1, &qh); st != cnOK {
		t.Errorf("cleanup: cn_queue_new: %s", name(st))
		return
	}
	defer cnQueueFree(qh)
	switch st := cnClose(h, qh, 0); st {
	case cnClosed:
		return
	case cnPending:
	default:
		t.Errorf("cleanup: cn_close: %s (%s)", name(st), cnLastError())
		return
	}
	q := &queue{t: t, h: qh, rfd: -1, wfd: -1}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		for _, r := range q.takeAll() {
			if r.Op == h {
				return
			}
		}
	}
	t.Errorf("cleanup: no result of cn_close(%d) within 20 s", h)
}

// newChannel makes a process channel, at once or pending with the name as the result's text.
func (c *client) newChannel(prefix string) string {
	c.t.Helper()
	var p *byte
	if prefix != "" {
		p = cs(prefix)
	}
	var out uintptr
	op := ^uint64(0)
	closure := newClosure()
	st, msg := onThread(func() int32 { return cnNewChannel(c.h, p, c.own.h, closure, &out, &op) })
	switch st {
	case cnOK:
		if out == 0 || op != 0 {
			c.t.Fatalf("cn_new_channel: CN_OK with name %#x and op %d, want a name and op 0", out, op)
		}
		return takeString(out)
	case cnPending:
		r := c.own.one()
		if r.Op != op || r.Closure != closure || r.Status != cnOK || r.Text == "" || r.HasData {
			c.t.Fatalf("cn_new_channel result %v, want op %d CN_OK with the name as text", r, op)
		}
		if out != 0 {
			c.t.Errorf("pending cn_new_channel also stored a name in *channel")
		}
		return r.Text
	}
	c.t.Fatalf("cn_new_channel: %s (%s)", name(st), msg)
	return ""
}

// send sends body and requires CN_OK (accepted at once: the outbound buffer has room).
func (c *client) send(channel string, body []byte) {
	c.t.Helper()
	b, n := bp(body)
	st, msg := onThread(func() int32 { return cnSend(c.h, cs(channel), b, n, c.own.h, 0, nil) })
	if st != cnOK {
		c.t.Fatalf("cn_send(%s): %s (%s)", channel, name(st), msg)
	}
}

// sendAwaited sends body, waiting for its result when the outbound buffer is full (CN_PENDING).
func (c *client) sendAwaited(channel string, body []byte) {
	c.t.Helper()
	b, n := bp(body)
	var op uint64
	st, msg := onThread(func() int32 { return cnSend(c.h, cs(channel), b, n, c.own.h, 0, &op) })
	switch st {
	case cnOK:
	case cnPending:
		if r := c.own.one(); r.Op != op || r.Status != cnOK {
			c.t.Fatalf("cn_send(%s) result %v, want op %d CN_OK", channel, r, op)
		}
	default:
		c.t.Fatalf("cn_send(%s): %s (%s)", channel, name(st), msg)
	}
}

// groupSend sends body to a group and requires CN_OK.
func (c *client) groupSend(group string, body []byte) {
	c.t.Helper()
	b, n := bp(body)
	st, msg := onThread(func() int32 { return cnGroupSend(c.h, cs(group), b, n, c.own.h, 0, nil) })
	if st != cnOK {
		c.t.Fatalf("cn_group_send(%s): %s (%s)", group, name(st), msg)
	}
}

// groupAdd adds channel to group, at once or pending.
func (c *client) groupAdd(group, channel string) {
	c.t.Helper()
	var op uint64
	st, msg := onThread(func() int32 { return cnGroupAdd(c.h, cs(group), cs(channel), c.own.h, 0, &op) })
	switch st {
	case cnOK:
	case cnPending:
		if r := c.own.one(); r.Op != op || r.Status != cnOK || r.HasText || r.HasData {
			c.t.Fatalf("cn_group_add(%s, %s) result %v, want op %d CN_OK without text or data", group, channel, r, op)
		}
	default:
		c.t.Fatalf("cn_group_add(%s, %s): %s (%s)", group, channel, name(st), msg)
	}
}

// receive starts a receive whose pending result goes to q (nil: c.own). It returns the status,
// a copy of the body when a message was waiting (CN_OK) and the op when it is pending.
func (c *client) receive(channel string, q *queue, closure uintptr) (st int32, body []byte, op uint64) {
	c.t.Helper()
	if q == nil {
		q = c.own
	}
	var out, n uintptr
	op = ^uint64(0) // garbage: the library must write it
	st, msg := onThread(func() int32 { return cnReceive(c.h, cs(channel), q.h, closure, &out, &n, &op) })
	switch st {
	case cnOK:
		if out == 0 || op != 0 {
			c.t.Errorf("cn_receive(%s): CN_OK with body %#x (%d bytes) and op %d, want a body and op 0", channel, out, n, op)
		}
		return st, cBytes(out, n), 0
	case cnPending:
		if op == 0 || op == ^uint64(0) || out != 0 || n != 0 {
			c.t.Errorf("cn_receive(%s): CN_PENDING with op %d, body %#x, len %d; want an op, NULL and 0", channel, op, out, n)
		}
		return st, nil, op
	}
	c.t.Logf("cn_receive(%s): %s (%s)", channel, name(st), msg)
	return st, nil, 0
}

// receivePending starts a receive that must be pending, its result going to q (nil: c.own).
func (c *client) receivePending(channel string, q *queue) uint64 {
	c.t.Helper()
	return c.receivePendingFor(channel, q, newClosure())
}

// receivePendingFor is receivePending with the closure its result must carry.
func (c *client) receivePendingFor(channel string, q *queue, closure uintptr) uint64 {
	c.t.Helper()
	st, body, op := c.receive(channel, q, closure)
	if st != cnPending {
		c.t.Fatalf("cn_receive(%s): %s (n=%d), want CN_PENDING", channel, name(st), numberOf(body))
	}
	return op
}

// receiveNow receives a message that must be waiting already.
func (c *client) receiveNow(channel string) []byte {
	c.t.Helper()
	st, body, op := c.receive(channel, nil, 0)
	if st != cnOK {
		if st == cnPending {
			cnCancel(c.h, op)
		}
		c.t.Fatalf("cn_receive(%s): %s, want CN_OK with the waiting message", channel, name(st))
	}
	return body
}

// receiveAny receives the next message, at once or as a pending result.
func (c *client) receiveAny(channel string) []byte {
	c.t.Helper()
	st, body, op := c.receive(channel, nil, 0)
	switch st {
	case cnOK:
		return body
	case cnPending:
		r := c.own.one()
		if r.Op != op || r.Status != cnOK || !r.HasData {
			c.t.Fatalf("cn_receive(%s) result %v, want op %d CN_OK with data", channel, r, op)
		}
		return r.Data
	}
	c.t.Fatalf("cn_receive(%s): %s", channel, name(st))
	return nil
}

// nothingWaiting checks that channel holds no message: a receive is pending, and is withdrawn.
func (c *client) nothingWaiting(channel string) {
	c.t.Helper()
	st, body, op := c.receive(channel, nil, 0)
	if st != cnPending {
		c.t.Errorf("%s holds a message (n=%d, %s), want none", channel, numberOf(body), name(st))
		return
	}
	if st := cnCancel(c.h, op); st != cnOK {
		c.t.Errorf("cn_cancel of a waiting receive: %s", name(st))
	}
}

// stats returns the client's counters.
func (c *client) stats() map[string]any {
	c.t.Helper()
	var out uintptr
	st, msg := onThread(func() int32 { return cnStats(c.h, &out) })
	if st != cnOK || out == 0 {
		c.t.Fatalf("cn_stats: %s (%s)", name(st), msg)
	}
	return parseStats(c.t, takeString(out))
}

// parseStats decodes a statistics document.
func parseStats(t testing.TB, doc string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatalf("statistics are not JSON: %v: %q", err, doc)
	}
	return m
}

// stat is the number at a dotted path of a statistics document ("dropped.capacity"); -1 when
// it is missing or not a number.
func stat(m map[string]any, path string) float64 {
	var v any = m
	for _, key := range strings.Split(path, ".") {
		obj, ok := v.(map[string]any)
		if !ok {
			return -1
		}
		v = obj[key]
	}
	if n, ok := v.(float64); ok {
		return n
	}
	return -1
}

// barrier makes sure that every message from earlier sends of from has reached c's mailboxes:
// from sends a marker to a process channel of c with a waiting receive, and a client delivers in
// arrival order (one dispatcher), while the server keeps one publisher's order.
func (c *client) barrier(from *client) {
	c.t.Helper()
	c.barrierOnce.Do(func() { c.barrierCh = c.newChannel("") })
	st, body, op := c.receive(c.barrierCh, nil, 0)
	if st != cnPending {
		c.t.Fatalf("barrier receive: %s (n=%d), want CN_PENDING", name(st), numberOf(body))
	}
	from.send(c.barrierCh, pack(c.t, map[string]any{"type": "barrier"}))
	if r := c.own.one(); r.Op != op || r.Status != cnOK {
		c.t.Fatalf("barrier result %v, want op %d CN_OK", r, op)
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
