package layer

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/channels-nats/channels-nats/internal/testport"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// testServer is an embedded nats-server on 127.0.0.1 that a test can stop and start again on
// the same port.
type testServer struct {
	t    testing.TB
	mu   sync.Mutex
	opts server.Options
	srv  *server.Server
}

// startServer runs a server for the test; configure may change its options.
func startServer(t testing.TB, configure ...func(*server.Options)) *testServer {
	t.Helper()
	opts := server.Options{Host: "127.0.0.1", Port: testport.Free(t), NoLog: true, NoSigs: true}
	for _, f := range configure {
		f(&opts)
	}
	ts := &testServer{t: t, opts: opts}
	ts.start()
	t.Cleanup(ts.stop)
	return ts
}

func (ts *testServer) start() {
	ts.t.Helper()
	ts.mu.Lock()
	defer ts.mu.Unlock()
	opts := ts.opts
	srv, err := server.NewServer(&opts)
	if err != nil {
		ts.t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		ts.t.Fatal("nats-server did not start")
	}
	ts.srv = srv
}

func (ts *testServer) stop() {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.srv != nil {
		ts.srv.Shutdown()
		ts.srv.WaitForShutdown()
		ts.srv = nil
	}
}

func (ts *testServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", ts.opts.Port) }

// numClients is how many client connections the server has.
func (ts *testServer) numClients() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	return ts.srv.NumClients()
}

// startCluster runs n servers routed to each other and waits until every route is up.
func startCluster(t testing.TB, n int) []*testServer {
	t.Helper()
	routePorts := make([]int, n)
	for i := range routePorts {
		routePorts[i] = testport.Free(t)
	}
	var routes []*url.URL
	for _, p := range routePorts {
		u, _ := url.Parse(fmt.Sprintf("nats://127.0.0.1:%d", p))
		routes = append(routes, u)
	}
	nodes := make([]*testServer, n)
	for i := range nodes {
		nodes[i] = startServer(t, func(o *server.Options) {
			o.ServerName = fmt.Sprintf("n%d", i)
			o.Cluster = server.ClusterOpts{Name: "channels-nats-test", Host: "127.0.0.1", Port: routePorts[i]}
			o.Routes = routes
		})
	}
	waitFor(t, 15*time.Second, "cluster routes", func() bool {
		for _, node := range nodes {
			node.mu.Lock()
			r := node.srv.NumRoutes()
			node.mu.Unlock()
			if r < n-1 {
				return false
			}
		}
		return true
	})
	return nodes
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// logRecord is one record a logSink collected.
type logRecord struct {
	level Level
	msg   string
}

// logSink collects log records so tests can assert on warnings.
type logSink struct {
	mu      sync.Mutex
	records []logRecord
}

func (r *logSink) log(level Level, message string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.records = append(r.records, logRecord{level, message})
}

// line is a record as "<level> <message>", so tests can match the level as text too.
func (rec logRecord) line() string { return fmt.Sprintf("%d %s", rec.level, rec.msg) }

// count returns how many records contain every one of parts (in their line form).
func (r *logSink) count(parts ...string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
next:
	for _, rec := range r.records {
		line := rec.line()
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		n++
	}
	return n
}

// all returns every record, one a line, for failure messages.
func (r *logSink) all() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	lines := make([]string, len(r.records))
	for i, rec := range r.records {
		lines[i] = rec.line()
	}
	return strings.Join(lines, "\n")
}

// take returns the records collected so far and forgets them.
func (r *logSink) take() []logRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	taken := r.records
	r.records = nil
	return taken
}

// testConfig is a Config for server urls with a recorder for its logs.
func testConfig(rec *logSink, urls ...string) Config {
	cfg := Config{Servers: urls}
	cfg.Connection.ReconnectWait = 50 * time.Millisecond
	if rec != nil {
		cfg.Log = rec.log
	} else {
		cfg.Log = func(Level, string) {}
	}
	return cfg
}

// connect opens a Layer for the test and closes it at cleanup.
func connect(t testing.TB, cfg Config) *Layer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// rawConn is a plain nats.go connection for publishing frames the layer did not make.
func rawConn(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// ctxT returns a context that ends after d (and at test end).
func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
