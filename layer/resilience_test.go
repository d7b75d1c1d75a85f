package layer

// Resilience tests (SPEC S16, S17, S19, S20 and the cluster section of the reference suite):
// server restarts, connections closed for good and recovered, closes that cannot drain,
// connect failures, authentication, TLS and a routed 3-node cluster. Every test runs against
// real embedded nats-servers (or, where a misbehaving server is the point, a small fake one).
//
// Where the network is in flux the tests assert eventual reachability, like the reference's
// publish_until_it_lands: publish every 100 ms until a receive completes, bounded at 15 s.
// Where the layer promises a confirmed subscription (after a recovery, S17) they send once.

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/channels-nats/channels-nats/internal/faultproxy"
	"github.com/channels-nats/channels-nats/internal/testport"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// rsEventually bounds every eventual-delivery wait in this file.
const rsEventually = 15 * time.Second

// ---------------------------------------------------------------------------------------------
// helpers

// rsConn returns the layer's current NATS connection.
func rsConn(l *Layer) *nats.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.link.conn()
}

// rsForceClose closes the layer's current connection for good, as nats.go does after its last
// reconnect attempt, and returns it.
func rsForceClose(l *Layer) *nats.Conn {
	nc := rsConn(l)
	nc.Close()
	return nc
}

// rsSubKinds counts the layer's wanted subscriptions by kind.
func rsSubKinds(l *Layer) map[subKind]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[subKind]int{}
	for k := range l.subs {
		n[k.kind]++
	}
	return n
}

func rsNumSubs(l *Layer) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.subs)
}

// rsWaiters is how many receives wait on the mailbox of channel.
func rsWaiters(l *Layer, channel string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if mb := l.mailboxes[channel]; mb != nil {
		return len(mb.waiters)
	}
	return 0
}

// rsSubConfirmed reports whether the layer has a confirmed subscription for k.
func rsSubConfirmed(l *Layer, k subKey) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.subs[k]
	return s != nil && s.confirmed
}

// rsRoundTrip makes sure every SUB this layer's connection sent was processed by the server.
func rsRoundTrip(t *testing.T, l *Layer) {
	t.Helper()
	if err := rsConn(l).FlushTimeout(5 * time.Second); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

func rsPort(rawURL string) string {
	i := strings.LastIndex(rawURL, ":")
	return rawURL[i+1:]
}

// rsClientGoroutines counts goroutines running layer or nats.go client code.
func rsClientGoroutines() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "/layer.(*Layer)") || strings.Contains(g, "github.com/nats-io/nats.go.") {
			count++
		}
	}
	return count
}

// rsNoLeak waits until the client goroutines are back at (or below) baseline.
func rsNoLeak(t *testing.T, baseline int, what string) {
	t.Helper()
	deadline := time.Now().Add(rsEventually)
	for rsClientGoroutines() > baseline {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %d layer/nats.go goroutine(s) left, baseline %d", what, rsClientGoroutines(), baseline)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type rsGot struct {
	msg map[string]any
	err error
}

// rsRecvTagged receives on channel until a message whose "tag" is tag arrives (skipping the
// extra copies earlier publish loops left behind) and reports it, or the error that ended it.
func rsRecvTagged(ctx context.Context, l *Layer, channel, tag string) <-chan rsGot {
	got := make(chan rsGot, 1)
	go func() {
		for {
			m, err := l.Receive(ctx, channel)
			if err != nil {
				got <- rsGot{nil, err}
				return
			}
			if m["tag"] == tag {
				got <- rsGot{m, nil}
				return
			}
		}
	}()
	return got
}

// rsPublishUntil publishes a tagged message every 100 ms until got reports, bounded at 15 s
// (the reference's publish_until_it_lands). Publish errors are tolerated while the network is
// in flux; the last one is reported if nothing lands.
func rsPublishUntil(t *testing.T, what string, got <-chan rsGot, tag string, send func(context.Context, map[string]any) error) map[string]any {
	t.Helper()
	deadline := time.Now().Add(rsEventually)
	var lastErr error
	for i := 0; ; i++ {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := send(sctx, map[string]any{"type": "rs.ping", "tag": tag, "n": i}); err != nil {
			lastErr = err
		}
		cancel()
		select {
		case r := <-got:
			if r.err != nil {
				t.Fatalf("%s: the receive ended with %v", what, r.err)
			}
			return r.msg
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: nothing arrived within %s of publishing every 100 ms (last publish error: %v)", what, rsEventually, lastErr)
		}
	}
}

// rsUntilLands receives a fresh tag on channel of recv while send publishes it repeatedly.
func rsUntilLands(t *testing.T, what string, recv *Layer, channel string, send func(context.Context, map[string]any) error) map[string]any {
	t.Helper()
	tag := randomHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), rsEventually+5*time.Second)
	defer cancel()
	return rsPublishUntil(t, what, rsRecvTagged(ctx, recv, channel, tag), tag, send)
}

// rsExpect receives one message on channel within 5 s and checks its tag (strict: one send).
func rsExpect(t *testing.T, what string, l *Layer, channel, tag string) {
	t.Helper()
	m, err := l.Receive(ctxT(t, 5*time.Second), channel)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if m["tag"] != tag {
		t.Fatalf("%s: got %v, want tag %s", what, m, tag)
	}
}

func rsMsg(tag string) map[string]any { return map[string]any{"type": "rs.msg", "tag": tag} }

// rsWaitRoutes waits until node has n-1 routes.
func rsWaitRoutes(t *testing.T, node *testServer, want int) {
	t.Helper()
	waitFor(t, rsEventually, "cluster routes after a restart", func() bool {
		node.mu.Lock()
		defer node.mu.Unlock()
		return node.srv != nil && node.srv.NumRoutes() >= want
	})
}

// rsFakeServer is a TCP server that speaks just enough NATS to be connected to (INFO, PONG,
// swallowing PUB/HPUB payloads), and can stop answering PINGs (jam). A silent one never sends
// INFO, like a server that accepted the socket but hangs.
type rsFakeServer struct {
	ln       net.Listener
	silent   bool
	jam      atomic.Bool
	accepted atomic.Int32
	open     atomic.Int32
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	wg       sync.WaitGroup
	once     sync.Once
}

func rsStartFake(t *testing.T, addr string, silent bool) *rsFakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	f := &rsFakeServer{ln: ln, silent: silent, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.serve()
	t.Cleanup(f.stop)
	return f
}

func (f *rsFakeServer) url() string { return "nats://" + f.ln.Addr().String() }

func (f *rsFakeServer) serve() {
	defer f.wg.Done()
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return
		}
		f.accepted.Add(1)
		f.open.Add(1)
		f.mu.Lock()
		f.conns[c] = struct{}{}
		f.mu.Unlock()
		f.wg.Add(1)
		go f.handle(c)
	}
}

func (f *rsFakeServer) handle(c net.Conn) {
	defer f.wg.Done()
	defer f.open.Add(-1)
	defer func() {
		f.mu.Lock()
		delete(f.conns, c)
		f.mu.Unlock()
		c.Close()
	}()
	if f.silent {
		_, _ = io.Copy(io.Discard, c)
		return
	}
	port := f.ln.Addr().(*net.TCPAddr).Port
	fmt.Fprintf(c, `INFO {"server_id":"RSFAKE","server_name":"rsfake","version":"2.10.0","proto":1,"host":"127.0.0.1","port":%d,"headers":true,"max_payload":1048576}`+"\r\n", port)
	r := bufio.NewReader(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		switch strings.ToUpper(fields[0]) {
		case "PING":
			if !f.jam.Load() {
				_, _ = io.WriteString(c, "PONG\r\n")
			}
		case "PUB", "HPUB":
			size, _ := strconv.Atoi(fields[len(fields)-1])
			if _, err := io.CopyN(io.Discard, r, int64(size)+2); err != nil {
				return
			}
		}
	}
}

// stop closes the listener and every accepted connection.
func (f *rsFakeServer) stop() {
	f.once.Do(func() {
		f.ln.Close()
		f.mu.Lock()
		for c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
		f.wg.Wait()
	})
}

// rsStartProxy starts a fault proxy to targetURL for the test. Refuse(true) closes new
// connections at once; a server that goes closes the connections it had through the proxy.
func rsStartProxy(t *testing.T, targetURL string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(targetURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// rsWriteTLSFiles writes a fresh self-signed CA and a server certificate for 127.0.0.1 signed
// by it (ECDSA P-256) and returns the paths.
func rsWriteTLSFiles(t *testing.T) (caFile, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	writePEM := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		must(os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return path
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "channels-nats test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	must(err)
	caCert, err := x509.ParseCertificate(caDER)
	must(err)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, caCert, &srvKey.PublicKey, caKey)
	must(err)
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	must(err)
	return writePEM("ca.pem", "CERTIFICATE", caDER), writePEM("server.pem", "CERTIFICATE", srvDER),
		writePEM("server-key.pem", "EC PRIVATE KEY", keyDER)
}

// rsNoReconnect is a test config whose connection closes for good at the first loss, so the
// layer's own recovery (S17) takes over.
func rsNoReconnect(rec *logSink, urls ...string) Config {
	cfg := testConfig(rec, urls...)
	cfg.Connection.MaxReconnects = NoReconnect
	cfg.Connection.ConnectTimeout = 500 * time.Millisecond
	return cfg
}

// ---------------------------------------------------------------------------------------------
// nats.go reconnects (S17, first half)

// S17, S20: the server is killed and restarted on the same port; nats.go reconnects and
// resubscribes, and a process channel, a plain channel and a group all deliver again.
func TestResilienceServerRestartReconnectsEveryKind(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	a := connect(t, testConfig(rec, s.url()))
	pub := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 60*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.GroupAdd(ctx, "rs-room", pc); err != nil {
		t.Fatal(err)
	}
	direct := func(ctx context.Context, m map[string]any) error { return pub.Send(ctx, pc, m) }
	plain := func(ctx context.Context, m map[string]any) error { return pub.Send(ctx, "rs-work", m) }
	group := func(ctx context.Context, m map[string]any) error { return pub.GroupSend(ctx, "rs-room", m) }

	rsUntilLands(t, "process channel before the restart", a, pc, direct)
	rsUntilLands(t, "plain channel before the restart", a, "rs-work", plain)
	rsUntilLands(t, "group before the restart", a, pc, group)
	if n := rsNumSubs(a); n != 3 {
		t.Fatalf("want 3 subscriptions (process, group, plain), got %d", n)
	}

	s.stop()
	waitFor(t, rsEventually, "the layer to notice the outage", func() bool { return !a.Stats().Connected })
	s.start()

	rsUntilLands(t, "process channel after the restart", a, pc, direct)
	rsUntilLands(t, "plain channel after the restart", a, "rs-work", plain)
	rsUntilLands(t, "group after the restart", a, pc, group)

	waitFor(t, rsEventually, "Stats().Reconnects", func() bool { return a.Stats().Reconnects >= 1 })
	st := a.Stats()
	if !st.Connected || st.Recoveries != 0 {
		t.Fatalf("after a nats.go reconnect want connected and no recovery, got %+v", st)
	}
	if rec.count("reconnected") < 1 {
		t.Fatalf("no warning saying reconnected; log:\n%s", rec.all())
	}
	if rec.count("reconnected", "3 subscription(s) restored") < 1 {
		t.Fatalf("the reconnect warning does not count the 3 subscriptions; log:\n%s", rec.all())
	}
}

// S17: publishes made during a short outage are accepted into the link's buffer (nats.go keeps
// none) and go out after the reconnect. The receiver must have resubscribed before the sender flushes its buffer, so
// the sender reaches the server through a proxy that stays shut until the receiver is back;
// each buffered message is sent once and must arrive.
func TestResilienceOutboundBufferDeliversPublishesMadeDuringOutage(t *testing.T) {
	s := startServer(t)
	proxy := rsStartProxy(t, s.url())
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, proxy.URL()))
	ctx := ctxT(t, 60*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.GroupAdd(ctx, "rs-buffered", pc); err != nil {
		t.Fatal(err)
	}
	rsUntilLands(t, "through the proxy before the outage", a, pc,
		func(ctx context.Context, m map[string]any) error { return b.Send(ctx, pc, m) })
	// The server confirms what was written before the outage, so nothing of it counts as lost.
	waitFor(t, 5*time.Second, "the publishes before the outage to be confirmed", func() bool {
		return linkSettled(a) && linkSettled(b)
	})

	proxy.Refuse(true)
	s.stop()
	waitFor(t, rsEventually, "both layers to notice the outage", func() bool {
		return !a.Stats().Connected && !b.Stats().Connected
	})
	publishedBefore := b.Stats().Published
	sctx := ctxT(t, 2*time.Second)
	if err := b.Send(sctx, pc, rsMsg("buffered-direct")); err != nil {
		t.Fatalf("a send during a short outage must be buffered, got %v", err)
	}
	if err := b.GroupSend(sctx, "rs-buffered", rsMsg("buffered-group")); err != nil {
		t.Fatalf("a group_send during a short outage must be buffered, got %v", err)
	}
	// The receiver's own publish: nats.go resends its SUBs before its buffer on reconnect.
	if err := a.Send(sctx, pc, rsMsg("buffered-self")); err != nil {
		t.Fatalf("a send during a short outage must be buffered, got %v", err)
	}
	if got := b.Stats().Published - publishedBefore; got != 2 {
		t.Fatalf("want 2 buffered publishes counted, got %d", got)
	}
	if st := b.Stats(); st.Outbound.Bytes == 0 || st.Outbound.Waiting != 0 {
		t.Fatalf("the sender's outbound buffer should hold the publishes: %+v", st.Outbound)
	}
	if n, err := rsConn(b).Buffered(); err == nil && n != 0 {
		t.Fatalf("nats.go's own reconnect buffer holds %d bytes; it must be disabled", n)
	}

	s.start()
	waitFor(t, rsEventually, "the receiver to reconnect", func() bool {
		st := a.Stats()
		return st.Connected && st.Reconnects >= 1
	})
	rsRoundTrip(t, a) // its resubscriptions are on the server
	proxy.Refuse(false)
	waitFor(t, rsEventually, "the sender to reconnect", func() bool { return b.Stats().Reconnects >= 1 })

	want := map[string]bool{"buffered-direct": true, "buffered-group": true, "buffered-self": true}
	rctx := ctxT(t, rsEventually)
	for len(want) > 0 {
		m, err := a.Receive(rctx, pc)
		if err != nil {
			t.Fatalf("buffered messages never arrived (still missing %v): %v", want, err)
		}
		delete(want, fmt.Sprint(m["tag"]))
	}
	for _, l := range []*Layer{a, b} {
		if st := l.Stats(); st.Lost.Messages != 0 || st.Outbound.Bytes != 0 {
			t.Fatalf("after the reconnect nothing is lost or queued: Lost %+v, Outbound %+v", st.Lost, st.Outbound)
		}
	}
}

// ---------------------------------------------------------------------------------------------
// connections closed for good and recovered (S17, refs 26, 31, 32, 66)

// S17, ref 26: with MaxReconnects = NoReconnect nats.go closes the connection when the server
// goes; the layer's background recovery opens a new one once the server is back and restores
// every kind of subscription: process channel, plain channel (with a pending receive), group
// with a process member and group with a plain member (queue subscription).
func TestResilienceRecoveryRestoresEverySubscriptionKind(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	a := connect(t, rsNoReconnect(rec, s.url()))
	ctx := ctxT(t, 60*time.Second)
	pc1, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	pc2, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.GroupAdd(ctx, "rs-g-process", pc2); err != nil {
		t.Fatal(err)
	}
	if err := a.GroupAdd(ctx, "rs-g-plain", "rs-member"); err != nil {
		t.Fatal(err)
	}
	pending := rsRecvTagged(ctx, a, "rs-plain", "after-recovery-plain")
	waitFor(t, 5*time.Second, "the plain receive to be subscribed and waiting", func() bool {
		return rsSubConfirmed(a, channelKey("rs-plain")) && rsWaiters(a, "rs-plain") == 1
	})
	kinds := rsSubKinds(a)
	n := rsNumSubs(a)
	// process (one for both channels), group, group x plain, plain member's channel, plain.
	if n != 5 || kinds[subProcess] != 1 || kinds[subGroup] != 1 || kinds[subGroupChannel] != 1 || kinds[subChannel] != 2 {
		t.Fatalf("unexpected subscriptions before the outage: %d, %v", n, kinds)
	}
	old := rsConn(a)

	s.stop()
	waitFor(t, rsEventually, "nats.go to close the connection for good", old.IsClosed)
	s.start()
	waitFor(t, rsEventually, "the background recovery", func() bool { return a.Stats().Recoveries >= 1 })

	st := a.Stats()
	if !st.Connected || st.Subscriptions != n || st.Reconnects != 0 {
		t.Fatalf("after the recovery: %+v", st)
	}
	if rsConn(a) == old {
		t.Fatal("the layer still holds the closed connection")
	}
	if got := rec.count(fmt.Sprintf("reconnected and restored %d subscription(s)", n)); got != 1 {
		t.Fatalf("want one warning \"reconnected and restored %d subscription(s)\", got %d; log:\n%s", n, got, rec.all())
	}

	// The recovery confirmed the restored subscriptions: one send of each kind must arrive.
	pub := connect(t, testConfig(nil, s.url()))
	if err := pub.Send(ctx, pc1, rsMsg("after-recovery-direct")); err != nil {
		t.Fatal(err)
	}
	if err := pub.Send(ctx, "rs-plain", rsMsg("after-recovery-plain")); err != nil {
		t.Fatal(err)
	}
	if err := pub.GroupSend(ctx, "rs-g-process", rsMsg("after-recovery-group")); err != nil {
		t.Fatal(err)
	}
	if err := pub.GroupSend(ctx, "rs-g-plain", rsMsg("after-recovery-member")); err != nil {
		t.Fatal(err)
	}
	rsExpect(t, "process channel after the recovery", a, pc1, "after-recovery-direct")
	select {
	case r := <-pending:
		if r.err != nil {
			t.Fatalf("the plain receive pending across the outage ended with %v", r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the plain receive pending across the outage never got its message")
	}
	rsExpect(t, "group with a process member after the recovery", a, pc2, "after-recovery-group")
	rsExpect(t, "group with a plain member after the recovery", a, "rs-member", "after-recovery-member")
}

// S17, ref 32: a process that only receives comes back when its connection is closed under
// it: a receive pending before the close completes after the recovery.
func TestResilienceForcedCloseRecoversReceiveOnlyProcess(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	a := connect(t, testConfig(rec, s.url()))
	pub := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 60*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	tag := randomHex(6)
	got := rsRecvTagged(ctx, a, pc, tag)
	waitFor(t, 5*time.Second, "the receive to wait", func() bool { return rsWaiters(a, pc) == 1 })

	old := rsForceClose(a)
	rsPublishUntil(t, "pending receive after a forced close", got, tag,
		func(ctx context.Context, m map[string]any) error { return pub.Send(ctx, pc, m) })

	waitFor(t, rsEventually, "Stats().Recoveries", func() bool { return a.Stats().Recoveries >= 1 })
	if rsConn(a) == old || !a.Stats().Connected {
		t.Fatal("the layer did not move to a new, open connection")
	}
	if got := rec.count("reconnected and restored 1 subscription(s)"); got != 1 {
		t.Fatalf("want one recovery warning with 1 subscription, got %d; log:\n%s", got, rec.all())
	}
	// The next call after a close for good also works (it joins or finds the new connection).
	if err := a.Send(ctx, pc, rsMsg("self")); err != nil {
		t.Fatal(err)
	}
	rsExpect(t, "own send after the recovery", a, pc, "self")
}

// Ref 31: a group discarded while the connection was down is not brought back by the recovery.
func TestResilienceRecoveryForgetsGroupDiscardedWhileDown(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	a := connect(t, rsNoReconnect(rec, s.url()))
	ctx := ctxT(t, 60*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.GroupAdd(ctx, "rs-gone", pc); err != nil {
		t.Fatal(err)
	}
	old := rsConn(a)
	s.stop()
	waitFor(t, rsEventually, "the connection to close for good", old.IsClosed)
	if err := a.GroupDiscard("rs-gone", pc); err != nil {
		t.Fatalf("group_discard on a dead connection: %v", err)
	}
	if k := rsSubKinds(a); k[subGroup] != 0 || k[subProcess] != 1 {
		t.Fatalf("after the discard: %v", k)
	}
	s.start()
	waitFor(t, rsEventually, "the background recovery", func() bool { return a.Stats().Recoveries >= 1 })
	if k := rsSubKinds(a); k[subGroup] != 0 || k[subGroupChannel] != 0 || len(k) != 1 {
		t.Fatalf("the recovery brought back a discarded group: %v", k)
	}
	if rec.count("reconnected and restored 1 subscription(s)") != 1 {
		t.Fatalf("want the recovery to restore exactly 1 subscription; log:\n%s", rec.all())
	}
	if st := a.Stats(); st.Groups != 0 {
		t.Fatalf("groups after the discard: %d", st.Groups)
	}
	// One publisher connection: had the group message been delivered, it would arrive first.
	pub := connect(t, testConfig(nil, s.url()))
	if err := pub.GroupSend(ctx, "rs-gone", rsMsg("group")); err != nil {
		t.Fatal(err)
	}
	if err := pub.Send(ctx, pc, rsMsg("direct")); err != nil {
		t.Fatal(err)
	}
	rsExpect(t, "the direct message (the discarded group's must not come first)", a, pc, "direct")
	if m, err := a.Receive(ctxT(t, 300*time.Millisecond), pc); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a discarded group delivered after the recovery: %v, %v", m, err)
	}
}

// S17: while the server is down the recovery keeps failing, logs "reconnect failed" with a
// growing backoff, and succeeds once the server is back.
func TestResilienceRecoveryRetriesWithBackoffUntilServerReturns(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	a := connect(t, rsNoReconnect(rec, s.url()))
	ctx := ctxT(t, 60*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	s.stop()
	waitFor(t, rsEventually, "two failed recovery attempts", func() bool { return rec.count("reconnect failed") >= 2 })
	if rec.count("reconnect failed", "trying again in 0.5s") != 1 || rec.count("reconnect failed", "trying again in 1.0s") != 1 {
		t.Fatalf("want a backoff of 0.5 s then 1.0 s; log:\n%s", rec.all())
	}
	if st := a.Stats(); st.Connected || st.Recoveries != 0 {
		t.Fatalf("while the server is down: %+v", st)
	}
	s.start()
	waitFor(t, rsEventually, "the recovery once the server is back", func() bool { return a.Stats().Recoveries >= 1 })
	if got := rec.count("reconnected and restored 1 subscription(s)"); got != 1 {
		t.Fatalf("want one recovery warning, got %d; log:\n%s", got, rec.all())
	}
	failed := rec.count("reconnect failed")
	pub := connect(t, testConfig(nil, s.url()))
	if err := pub.Send(ctx, pc, rsMsg("back")); err != nil {
		t.Fatal(err)
	}
	rsExpect(t, "process channel after the recovery", a, pc, "back")
	time.Sleep(600 * time.Millisecond)
	if rec.count("reconnect failed") != failed {
		t.Fatalf("the recovery loop kept running after it succeeded; log:\n%s", rec.all())
	}
}

// S14, S17: while the recovery is stuck on a server that accepted the socket but never answers,
// nothing waits on it: a send is accepted at once into the link's buffer (StartSend and
// StartGroupSend return a nil *Op), a first plain receive returns a pending *Op at once, and a
// blocking receive with a short ctx ends with the ctx's error. What was accepted during the
// recovery is written once the new connection is up.
func TestResilienceSendWhileRecoveringHonoursContext(t *testing.T) {
	s := startServer(t)
	cfg := rsNoReconnect(nil, s.url())
	cfg.Connection.ConnectTimeout = 5 * time.Second // a recovery attempt on the silent server lasts this long
	a := connect(t, cfg)
	ctx := ctxT(t, 60*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	old := rsConn(a)
	s.stop()
	fake := rsStartFake(t, fmt.Sprintf("127.0.0.1:%d", s.opts.Port), true)
	waitFor(t, rsEventually, "the connection to close for good", old.IsClosed)
	waitFor(t, rsEventually, "a recovery attempt stuck on the silent server", func() bool { return fake.open.Load() >= 1 })

	// Waiting for the silent server would take the 5 s ConnectTimeout: a second leaves room for
	// a busy machine and still tells the two apart.
	const noWait = time.Second
	start := time.Now()
	if err := a.Send(ctxT(t, noWait), pc, rsMsg("late")); err != nil {
		t.Fatalf("a send while recovering must be accepted into the buffer, got %v", err)
	}
	if d := time.Since(start); d > noWait {
		t.Fatalf("Send took %s while recovering", d)
	}
	body, err := encodeMessage(rsMsg("nowait"))
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	op, err := a.StartSend(pc, body, func(error) { t.Error("done of an accepted send ran") })
	if err != nil || op != nil {
		t.Fatalf("StartSend while recovering: op=%v err=%v, want accepted at once", op, err)
	}
	op, err = a.StartGroupSend("rs-any", body, func(error) { t.Error("done of an accepted group send ran") })
	if err != nil || op != nil {
		t.Fatalf("StartGroupSend while recovering: op=%v err=%v, want accepted at once", op, err)
	}
	_, rop, err := a.StartReceive("rs-new-plain", func(Message, error) { t.Error("callback of a cancelled receive") })
	if err != nil || rop == nil {
		t.Fatalf("a first plain receive while recovering: op=%v err=%v, want a pending receive", rop, err)
	}
	if d := time.Since(start); d > noWait {
		t.Fatalf("the Start calls took %s", d)
	}
	if !rop.Cancel() {
		t.Fatal("cancel of the first plain receive while recovering returned false")
	}
	if st := a.Stats(); st.Outbound.Bytes == 0 || st.Published < 3 {
		t.Fatalf("while recovering the buffer should hold the 3 accepted sends: %+v", st)
	}
	start = time.Now()
	if _, err := a.ReceiveRaw(ctxT(t, 200*time.Millisecond), "rs-new-plain"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want context.DeadlineExceeded from a first plain receive while recovering, got %v", err)
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Fatalf("a first plain receive took %s with a 200 ms context", d)
	}

	fake.stop() // the stuck attempt fails at once; the next one reaches the real server
	s.start()
	waitFor(t, rsEventually, "the recovery", func() bool { return a.Stats().Recoveries >= 1 })
	// What was accepted while recovering was written on the new connection, in order.
	rsExpect(t, "the send accepted while recovering", a, pc, "late")
	rsExpect(t, "the StartSend accepted while recovering", a, pc, "nowait")
	pub := connect(t, testConfig(nil, s.url()))
	if err := pub.Send(ctx, pc, rsMsg("back")); err != nil {
		t.Fatal(err)
	}
	rsExpect(t, "after the recovery", a, pc, "back")
	if st := a.Stats(); st.Lost.Messages != 0 || st.Outbound.Bytes != 0 {
		t.Fatalf("after the recovery nothing is lost or queued: %+v", st)
	}
}

// Ref 66: two processes read plain channel "shared" and both added it to group "room"; each
// group_send reaches exactly one of them, before and after both connections are closed for good
// and recovered (no lost and no duplicated queue membership).
func TestResilienceGroupedPlainChannelSurvivesRecovery(t *testing.T) {
	s := startServer(t)
	recA, recB := &logSink{}, &logSink{}
	a := connect(t, testConfig(recA, s.url()))
	b := connect(t, testConfig(recB, s.url()))
	pub := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 60*time.Second)
	for _, l := range []*Layer{a, b} {
		if err := l.GroupAdd(ctx, "rs-room", "rs-shared"); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	counts := map[string]int{} // "phase/n" -> deliveries
	for _, l := range []*Layer{a, b} {
		go func() {
			for {
				m, err := l.Receive(ctx, "rs-shared")
				if err != nil {
					return
				}
				mu.Lock()
				counts[fmt.Sprintf("%v/%v", m["phase"], m["n"])]++
				mu.Unlock()
			}
		}()
	}
	phase := func(p int) {
		t.Helper()
		for i := range 10 {
			if err := pub.GroupSend(ctx, "rs-room", map[string]any{"type": "rs.job", "phase": p, "n": i}); err != nil {
				t.Fatal(err)
			}
		}
		total := func() (n, distinct int) {
			mu.Lock()
			defer mu.Unlock()
			for k, c := range counts {
				if strings.HasPrefix(k, fmt.Sprintf("%d/", p)) {
					n += c
					distinct++
				}
			}
			return n, distinct
		}
		waitFor(t, rsEventually, fmt.Sprintf("10 deliveries in phase %d", p), func() bool { n, _ := total(); return n >= 10 })
		time.Sleep(300 * time.Millisecond) // room for duplicates to show up
		if n, distinct := total(); n != 10 || distinct != 10 {
			t.Fatalf("phase %d: want exactly 10 deliveries of 10 messages, got %d deliveries of %d", p, n, distinct)
		}
	}
	phase(1)

	rsForceClose(a)
	rsForceClose(b)
	waitFor(t, rsEventually, "both recoveries", func() bool {
		return a.Stats().Recoveries >= 1 && b.Stats().Recoveries >= 1
	})
	for name, rec := range map[string]*logSink{"a": recA, "b": recB} {
		if got := rec.count("reconnected and restored 2 subscription(s)"); got != 1 {
			t.Fatalf("%s: want one warning \"restored 2 subscription(s)\", got %d; log:\n%s", name, got, rec.all())
		}
	}
	phase(2)
}

// ---------------------------------------------------------------------------------------------
// Close: bounded, never fails (S16, refs 61, 64)

// S16: with the server gone, Close returns nil, quickly, and leaves no goroutine behind.
func TestResilienceCloseWithServerDownIsBounded(t *testing.T) {
	s := startServer(t)
	baseline := rsClientGoroutines()
	cfg := testConfig(nil, s.url())
	cfg.Connection.DrainTimeout = 300 * time.Millisecond
	a := connect(t, cfg)
	ctx := ctxT(t, 30*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	ended := make(chan error, 1)
	go func() { _, err := a.Receive(ctx, pc); ended <- err }()
	waitFor(t, 5*time.Second, "the receive to wait", func() bool { return rsWaiters(a, pc) == 1 })
	s.stop()
	waitFor(t, rsEventually, "the outage to be noticed", func() bool { return !a.Stats().Connected })

	start := time.Now()
	if err := a.Close(); err != nil {
		t.Fatalf("Close returned %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %s with the server down", d)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("a waiting receive ended with %v, want ErrClosed", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not end the waiting receive")
	}
	if err := a.Send(ctx, pc, rsMsg("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("send after Close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("a second Close returned %v", err)
	}
	rsNoLeak(t, baseline, "after Close with the server down")
}

// S16: publishes buffered during an outage that Close cannot send any more are logged
// ("logs what it could not send").
func TestResilienceCloseLogsPublishesLostInOutage(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	cfg := testConfig(rec, s.url())
	cfg.Connection.DrainTimeout = 300 * time.Millisecond
	a := connect(t, cfg)
	s.stop()
	waitFor(t, rsEventually, "the outage to be noticed", func() bool { return !a.Stats().Connected })
	ctx := ctxT(t, 5*time.Second)
	for i := range 3 {
		if err := a.Send(ctx, "rs-lost", map[string]any{"type": "rs.lost", "n": i}); err != nil {
			t.Fatalf("a send during the outage: %v", err)
		}
	}
	queued := a.Stats().Outbound.Bytes
	if queued == 0 {
		t.Fatal("nothing in the outbound buffer")
	}
	start := time.Now()
	if err := a.Close(); err != nil {
		t.Fatalf("Close returned %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close took %s", d)
	}
	if rec.count("closed with 3 publish(es)", "drain_timeout (300ms)", "3 still queued", "counted as lost") != 1 {
		t.Fatalf("Close dropped buffered publishes without saying so; want a warning \"closed with 3 "+
			"publish(es) ... 3 still queued\"; log:\n%s", rec.all())
	}
	if st := a.Stats(); st.Lost.Messages != 3 || st.Lost.Bytes != uint64(queued) {
		t.Fatalf("Lost = %+v, want the 3 queued publishes (%d bytes)", st.Lost, queued)
	}
}

// S16, ref 61: a connection that is up but jammed (the server stops answering) cannot be
// confirmed; Close gives up after the drain timeout, returns nil, logs and counts the publish the
// server never confirmed as lost, and no
// callback of the layer runs after it returned.
func TestResilienceCloseJammedConnection(t *testing.T) {
	fake := rsStartFake(t, "127.0.0.1:0", false)
	rec := &logSink{}
	cfg := testConfig(rec, fake.url())
	cfg.Connection.DrainTimeout = 300 * time.Millisecond
	cfg.Connection.ConnectTimeout = time.Second
	baseline := rsClientGoroutines()
	a := connect(t, cfg)
	ctx := ctxT(t, 10*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	fake.jam.Store(true)
	if err := a.Send(ctx, pc, rsMsg("into the jam")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := a.Close(); err != nil {
		t.Fatalf("Close returned %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Close on a jammed connection took %s", d)
	}
	if rec.count("closed with 1 publish(es)", "drain_timeout (300ms)", "0 still queued", "1 written but not confirmed") != 1 {
		t.Fatalf("want one warning that the jammed publish was written but not confirmed; log:\n%s", rec.all())
	}
	if st := a.Stats(); st.Lost.Messages != 1 {
		t.Fatalf("Lost = %+v, want the 1 unconfirmed publish", st.Lost)
	}
	if !rsConn(a).IsClosed() {
		t.Fatal("the connection is still open after Close")
	}
	records := rec.count("")
	time.Sleep(500 * time.Millisecond)
	if rec.count("") != records {
		t.Fatalf("the layer logged after Close returned; log:\n%s", rec.all())
	}
	rsNoLeak(t, baseline, "after Close on a jammed connection")
	waitFor(t, 5*time.Second, "the socket to close", func() bool { return fake.open.Load() == 0 })
}

// S16, ref 64: Close during the background recovery returns promptly, ends the recovery loop,
// and leaves no goroutine behind: both while the loop sleeps in its backoff and while an
// attempt is stuck connecting.
func TestResilienceCloseDuringRecovery(t *testing.T) {
	for _, stuck := range []bool{false, true} {
		t.Run(map[bool]string{false: "backoff", true: "connecting"}[stuck], func(t *testing.T) {
			s := startServer(t)
			rec := &logSink{}
			cfg := rsNoReconnect(rec, s.url())
			cfg.Connection.ConnectTimeout = time.Second
			baseline := rsClientGoroutines()
			a, err := Connect(ctxT(t, 10*time.Second), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = a.Close() })
			if _, err := a.NewChannel(ctxT(t, 5*time.Second), ""); err != nil {
				t.Fatal(err)
			}
			old := rsConn(a)
			s.stop()
			var fake *rsFakeServer
			if stuck {
				fake = rsStartFake(t, fmt.Sprintf("127.0.0.1:%d", s.opts.Port), true)
			}
			waitFor(t, rsEventually, "the connection to close for good", old.IsClosed)
			if stuck {
				waitFor(t, rsEventually, "an attempt stuck connecting", func() bool { return fake.open.Load() >= 1 })
			} else {
				waitFor(t, rsEventually, "a failed attempt", func() bool { return rec.count("reconnect failed") >= 1 })
			}
			a.mu.Lock()
			recovering := a.recovering
			a.mu.Unlock()
			if !recovering {
				t.Fatal("no recovery loop is running")
			}
			start := time.Now()
			if err := a.Close(); err != nil {
				t.Fatalf("Close returned %v", err)
			}
			if d := time.Since(start); d > time.Second {
				t.Fatalf("Close during a recovery took %s", d)
			}
			a.mu.Lock()
			recovering = a.recovering
			a.mu.Unlock()
			if recovering {
				t.Fatal("the recovery loop still runs after Close returned")
			}
			rsNoLeak(t, baseline, "after Close during a recovery")
			if st := a.Stats(); st.Recoveries != 0 || st.Connected {
				t.Fatalf("a recovery happened after Close: %+v", st)
			}
		})
	}
}

// ---------------------------------------------------------------------------------------------
// Connect failures (ref 65, S19)

// Ref 65: a connect to a port nothing listens on fails quickly, and connects to a server that
// accepts but never answers time out and leave no socket and no goroutine behind.
func TestResilienceConnectFailuresLeaveNothingBehind(t *testing.T) {
	baseline := rsClientGoroutines()
	dead := testport.Free(t)
	cfg := testConfig(nil, fmt.Sprintf("nats://127.0.0.1:%d", dead))
	cfg.Connection.ConnectTimeout = 500 * time.Millisecond
	cfg.ConnectDeadline = time.Second // retries included
	start := time.Now()
	l, err := Connect(ctxT(t, 10*time.Second), cfg)
	if err == nil {
		l.Close()
		t.Fatal("Connect to a dead port succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Connect to a dead port took %s", d)
	}
	if !strings.Contains(err.Error(), "cannot connect") {
		t.Fatalf("unhelpful error: %v", err)
	}

	fake := rsStartFake(t, "127.0.0.1:0", true)
	cfg = testConfig(nil, fake.url())
	cfg.Connection.ConnectTimeout = 500 * time.Millisecond
	cfg.ConnectDeadline = time.Second
	for i := range 3 {
		start := time.Now()
		l, err := Connect(ctxT(t, 10*time.Second), cfg)
		if err == nil {
			l.Close()
			t.Fatal("Connect to a silent server succeeded")
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Fatalf("connect %d to a silent server took %s", i, d)
		}
	}
	if fake.accepted.Load() < 3 {
		t.Fatalf("the silent server saw %d connects", fake.accepted.Load())
	}
	waitFor(t, 3*time.Second, "the timed-out sockets to be closed", func() bool { return fake.open.Load() == 0 })
	rsNoLeak(t, baseline, "after failed connects")
}

// Connect honours its ctx: already cancelled, it fails with context.Canceled and leaves no
// connection on the server; ending while the server hangs, it returns the ctx error before the
// connect timeout and the socket is closed afterwards.
func TestResilienceConnectHonoursContext(t *testing.T) {
	s := startServer(t)
	baseline := rsClientGoroutines()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for range 5 {
		l, err := Connect(cancelled, testConfig(nil, s.url()))
		if err == nil {
			l.Close()
			t.Fatal("Connect with a cancelled ctx returned a layer")
		}
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("want context.Canceled, got %v", err)
		}
	}
	waitFor(t, 5*time.Second, "no client left on the server", func() bool { return s.numClients() == 0 })

	fake := rsStartFake(t, "127.0.0.1:0", true)
	cfg := testConfig(nil, fake.url())
	cfg.Connection.ConnectTimeout = time.Second
	start := time.Now()
	_, err := Connect(ctxT(t, 200*time.Millisecond), cfg)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want context.DeadlineExceeded, got %v", err)
	}
	if d := time.Since(start); d > 800*time.Millisecond {
		t.Fatalf("Connect ignored its 200 ms ctx: %s", d)
	}
	waitFor(t, 5*time.Second, "the abandoned socket to be closed", func() bool { return fake.open.Load() == 0 })
	rsNoLeak(t, baseline, "after abandoned connects")
}

// S19: credentials in a server URL never appear in an error text, whatever the failure.
func TestResilienceConnectErrorsRedactURLCredentials(t *testing.T) {
	s := startServer(t, func(o *server.Options) { o.Username, o.Password = "rsuser", "right-pw" })
	fake := rsStartFake(t, "127.0.0.1:0", true)
	dead := testport.Free(t)
	for name, u := range map[string]string{
		"refused":   fmt.Sprintf("nats://rsuser:s3cret@127.0.0.1:%d", dead),
		"timeout":   "nats://rsuser:s3cret@" + strings.TrimPrefix(fake.url(), "nats://"),
		"rejected":  "nats://rsuser:s3cret@" + strings.TrimPrefix(s.url(), "nats://"),
		"two hosts": fmt.Sprintf("nats://rsuser:s3cret@127.0.0.1:%d,nats://other:s3cret@127.0.0.1:%d", dead, dead),
	} {
		cfg := testConfig(nil, u)
		cfg.Connection.ConnectTimeout = 500 * time.Millisecond
		cfg.ConnectDeadline = 500 * time.Millisecond
		l, err := Connect(ctxT(t, 10*time.Second), cfg)
		if err == nil {
			l.Close()
			t.Fatalf("%s: Connect succeeded", name)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("%s: the error text shows the password: %v", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
}

// ---------------------------------------------------------------------------------------------
// Authentication and TLS (S19)

func rsRoundTripOn(t *testing.T, l *Layer) {
	t.Helper()
	ctx := ctxT(t, 10*time.Second)
	pc, err := l.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Send(ctx, pc, rsMsg("auth")); err != nil {
		t.Fatal(err)
	}
	rsExpect(t, "round trip", l, pc, "auth")
}

// S19: token authentication works; a wrong token fails without showing a token.
func TestResilienceTokenAuth(t *testing.T) {
	s := startServer(t, func(o *server.Options) { o.Authorization = "tok-rs-9f3" })
	cfg := testConfig(nil, s.url())
	cfg.Connection.Token = "tok-rs-9f3"
	rsRoundTripOn(t, connect(t, cfg))

	cfg.Connection.Token = "wrong-tok-xyz"
	cfg.Connection.ConnectTimeout = time.Second
	l, err := Connect(ctxT(t, 10*time.Second), cfg)
	if err == nil {
		l.Close()
		t.Fatal("a wrong token was accepted")
	}
	if strings.Contains(err.Error(), "wrong-tok-xyz") || strings.Contains(err.Error(), "tok-rs-9f3") {
		t.Fatalf("the error shows a token: %v", err)
	}
	cfg.Connection.Token = ""
	if l, err := Connect(ctxT(t, 10*time.Second), cfg); err == nil {
		l.Close()
		t.Fatal("no token was accepted")
	}
}

// S19: user and password work as options and as URL userinfo; a wrong password fails; the
// password in the URL never reaches a log record across a reconnect and a failed recovery.
func TestResilienceUserPasswordAuth(t *testing.T) {
	s := startServer(t, func(o *server.Options) { o.Username, o.Password = "rsuser", "rs-pw-s3cret" })
	cfg := testConfig(nil, s.url())
	cfg.Connection.User, cfg.Connection.Password = "rsuser", "rs-pw-s3cret"
	rsRoundTripOn(t, connect(t, cfg))

	cfg.Connection.Password = "nope-pw"
	cfg.Connection.ConnectTimeout = time.Second
	l, err := Connect(ctxT(t, 10*time.Second), cfg)
	if err == nil {
		l.Close()
		t.Fatal("a wrong password was accepted")
	}
	if strings.Contains(err.Error(), "nope-pw") {
		t.Fatalf("the error shows the password: %v", err)
	}

	withCreds := "nats://rsuser:rs-pw-s3cret@" + strings.TrimPrefix(s.url(), "nats://")
	rec := &logSink{}
	a := connect(t, testConfig(rec, withCreds))
	recB := &logSink{}
	b := connect(t, rsNoReconnect(recB, withCreds))
	rsRoundTripOn(t, a)
	ctx := ctxT(t, 30*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}

	s.stop()
	waitFor(t, rsEventually, "a failed recovery", func() bool { return recB.count("reconnect failed") >= 1 })
	s.start()
	waitFor(t, rsEventually, "the reconnect", func() bool { return a.Stats().Reconnects >= 1 })
	waitFor(t, rsEventually, "the recovery", func() bool { return b.Stats().Recoveries >= 1 })
	rsUntilLands(t, "after the reconnect with URL credentials", a, pc,
		func(ctx context.Context, m map[string]any) error { return b.Send(ctx, pc, m) })
	if rec.count("reconnected") < 1 || recB.count("reconnected and restored") != 1 {
		t.Fatalf("missing reconnect warnings; logs:\n%s\n%s", rec.all(), recB.all())
	}
	for _, r := range []*logSink{rec, recB} {
		if strings.Contains(r.all(), "rs-pw-s3cret") {
			t.Fatalf("a log record shows the password:\n%s", r.all())
		}
	}
}

// S19: TLS with a CA file: a server certificate signed by a test CA is accepted with
// TLSCAFile, and traffic flows (also after a reconnect); without the CA the connect fails.
func TestResilienceTLS(t *testing.T) {
	caFile, certFile, keyFile := rsWriteTLSFiles(t)
	tlsConfig, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: certFile, KeyFile: keyFile})
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, func(o *server.Options) {
		o.TLS, o.TLSConfig, o.TLSTimeout = true, tlsConfig, 2
	})
	tlsURL := fmt.Sprintf("tls://127.0.0.1:%d", s.opts.Port)
	cfg := testConfig(nil, tlsURL)
	cfg.Connection.TLSCAFile = caFile
	cfg.Connection.ConnectTimeout = 2 * time.Second
	a := connect(t, cfg)
	b := connect(t, cfg)
	ctx := ctxT(t, 30*time.Second)
	pc, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.GroupAdd(ctx, "rs-tls", pc); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx, pc, rsMsg("tls-direct")); err != nil {
		t.Fatal(err)
	}
	rsExpect(t, "send over TLS", a, pc, "tls-direct")
	if err := b.GroupSend(ctx, "rs-tls", rsMsg("tls-group")); err != nil {
		t.Fatal(err)
	}
	rsExpect(t, "group_send over TLS", a, pc, "tls-group")
	if !rsConn(a).TLSRequired() {
		t.Fatal("the connection is not using TLS")
	}

	s.stop()
	waitFor(t, rsEventually, "the outage", func() bool { return !a.Stats().Connected })
	s.start()
	rsUntilLands(t, "over TLS after a reconnect", a, pc,
		func(ctx context.Context, m map[string]any) error { return b.Send(ctx, pc, m) })

	noCA := testConfig(nil, tlsURL)
	noCA.Connection.ConnectTimeout = 2 * time.Second
	if l, err := Connect(ctxT(t, 10*time.Second), noCA); err == nil {
		l.Close()
		t.Fatal("a TLS connect without the CA succeeded")
	} else if !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("want a certificate error without the CA, got %v", err)
	}
	plain := testConfig(nil, s.url())
	plain.Connection.TLSCAFile = caFile
	plain.Connection.ConnectTimeout = 2 * time.Second
	rsRoundTripOn(t, connect(t, plain)) // nats:// with a CA upgrades as the server requires
}

// ---------------------------------------------------------------------------------------------
// 3-node cluster (reference tests/test_cluster.py)

// Cluster 1: a group_send from a process on node 2 reaches a member on node 0.
func TestResilienceClusterGroupSendCrossesNodes(t *testing.T) {
	nodes := startCluster(t, 3)
	worker := connect(t, testConfig(nil, nodes[0].url()))
	pub := connect(t, testConfig(nil, nodes[2].url()))
	ctx := ctxT(t, 30*time.Second)
	pc, err := worker.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := worker.GroupAdd(ctx, "rs-cluster", pc); err != nil {
		t.Fatal(err)
	}
	rsUntilLands(t, "group_send from node 2 to node 0", worker, pc,
		func(ctx context.Context, m map[string]any) error { return pub.GroupSend(ctx, "rs-cluster", m) })
	rsUntilLands(t, "plain channel from node 2 to node 0", worker, "rs-cluster-work",
		func(ctx context.Context, m map[string]any) error { return pub.Send(ctx, "rs-cluster-work", m) })
}

// Cluster 2: a send from node 2 reaches a process channel owned on node 1.
func TestResilienceClusterProcessChannelCrossesNodes(t *testing.T) {
	nodes := startCluster(t, 3)
	owner := connect(t, testConfig(nil, nodes[1].url()))
	sender := connect(t, testConfig(nil, nodes[2].url()))
	ctx := ctxT(t, 30*time.Second)
	pc, err := owner.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	rsUntilLands(t, "send from node 2 to a process channel on node 1", owner, pc,
		func(ctx context.Context, m map[string]any) error { return sender.Send(ctx, pc, m) })
}

// rsClusterWorker connects a worker that knows every node, tries them in order and is on node 0.
func rsClusterWorker(t *testing.T, nodes []*testServer) *Layer {
	t.Helper()
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.url())
	}
	cfg := testConfig(nil, urls...)
	cfg.Connection.NoRandomize = true
	cfg.Connection.ConnectTimeout = time.Second
	w := connect(t, cfg)
	if got := rsPort(rsConn(w).ConnectedUrl()); got != rsPort(nodes[0].url()) {
		t.Fatalf("the worker connected to port %s, want node 0 (%s)", got, rsPort(nodes[0].url()))
	}
	return w
}

// Cluster 3: a worker that knows every node survives losing its node: it moves to another
// node and a group message from node 2 still arrives.
func TestResilienceClusterWorkerSurvivesLosingItsNode(t *testing.T) {
	nodes := startCluster(t, 3)
	worker := rsClusterWorker(t, nodes)
	pub := connect(t, testConfig(nil, nodes[2].url()))
	ctx := ctxT(t, 30*time.Second)
	pc, err := worker.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := worker.GroupAdd(ctx, "rs-cluster", pc); err != nil {
		t.Fatal(err)
	}
	group := func(ctx context.Context, m map[string]any) error { return pub.GroupSend(ctx, "rs-cluster", m) }
	rsUntilLands(t, "group message before node 0 goes", worker, pc, group)

	nodes[0].stop()
	rsUntilLands(t, "group message after node 0 went", worker, pc, group)
	if got := rsPort(rsConn(worker).ConnectedUrl()); got == rsPort(nodes[0].url()) || got == "" {
		t.Fatalf("the worker is on %q, not on another node", rsConn(worker).ConnectedUrl())
	}
	if worker.Stats().Reconnects < 1 {
		t.Fatal("Stats().Reconnects did not count the move")
	}
}

// Cluster 4: a restarted node carries traffic again: a publisher that knows only node 0
// reaches the worker (which moved away) by group_send and by send; the worker stays off node 0.
func TestResilienceClusterRestartedNodeCarriesTraffic(t *testing.T) {
	nodes := startCluster(t, 3)
	worker := rsClusterWorker(t, nodes)
	ctx := ctxT(t, 30*time.Second)
	pc, err := worker.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := worker.GroupAdd(ctx, "rs-cluster", pc); err != nil {
		t.Fatal(err)
	}
	node0 := rsPort(nodes[0].url())
	nodes[0].stop()
	waitFor(t, rsEventually, "the worker to move off node 0", func() bool {
		nc := rsConn(worker)
		return nc.IsConnected() && rsPort(nc.ConnectedUrl()) != node0
	})
	nodes[0].start()
	rsWaitRoutes(t, nodes[0], 2)

	cfg := testConfig(nil, nodes[0].url())
	cfg.Connection.MaxReconnects = 5
	cfg.Connection.ConnectTimeout = 2 * time.Second
	pub := connect(t, cfg)
	rsUntilLands(t, "group_send through the restarted node", worker, pc,
		func(ctx context.Context, m map[string]any) error { return pub.GroupSend(ctx, "rs-cluster", m) })
	rsUntilLands(t, "send through the restarted node", worker, pc,
		func(ctx context.Context, m map[string]any) error { return pub.Send(ctx, pc, m) })
	if got := rsPort(rsConn(worker).ConnectedUrl()); got == node0 {
		t.Fatal("the worker moved back to node 0")
	}
	if got := rsPort(rsConn(pub).ConnectedUrl()); got != node0 {
		t.Fatalf("the publisher is on port %s, not on the restarted node 0", got)
	}
}

// Cluster 5: a node that freezes instead of dying (its socket stays open, nothing comes back):
// with the default pings, a worker on it notices within 15 s, moves to another node with its
// subscriptions, and receives group messages published through another node again.
func TestResilienceClusterWorkerLeavesAFrozenNode(t *testing.T) {
	nodes := startCluster(t, 3)
	frozen, err := faultproxy.Start(nodes[0].url())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = frozen.Close() })
	cfg := testConfig(nil, frozen.URL(), nodes[1].url(), nodes[2].url())
	cfg.Connection.NoRandomize = true
	cfg.Connection.ConnectTimeout = time.Second
	worker := connect(t, cfg)
	if got := rsPort(rsConn(worker).ConnectedUrl()); got != rsPort(frozen.URL()) {
		t.Fatalf("the worker connected to %s, not through the proxy of node 0", got)
	}
	pub := connect(t, testConfig(nil, nodes[2].url()))
	ctx := ctxT(t, 40*time.Second)
	pc, err := worker.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := worker.GroupAdd(ctx, "rs-frozen", pc); err != nil {
		t.Fatal(err)
	}
	group := func(ctx context.Context, m map[string]any) error { return pub.GroupSend(ctx, "rs-frozen", m) }
	rsUntilLands(t, "group message before node 0 froze", worker, pc, group)

	frozen.Stop(faultproxy.Both)
	frozeAt := time.Now()
	waitFor(t, 20*time.Second, "the worker to leave the frozen node", func() bool {
		return worker.Stats().Reconnects >= 1
	})
	noticed := time.Since(frozeAt)
	t.Logf("the frozen node was left after %s", noticed.Round(time.Millisecond))
	if noticed > 15*time.Second {
		t.Errorf("a frozen node was noticed after %s, more than 15 s", noticed)
	}
	rsUntilLands(t, "group message after node 0 froze", worker, pc, group)
	if got := rsPort(rsConn(worker).ConnectedUrl()); got == rsPort(frozen.URL()) {
		t.Fatalf("the worker is still on the frozen node")
	}
}

// Stats().Server describes the server of the connection, as it announced itself, without
// reading the connection (so it never waits on a stalled one): in a cluster it names the cluster
// and the peers the server told about; after a move it names the new server.
func TestResilienceStatsNameTheServer(t *testing.T) {
	nodes := startCluster(t, 3)
	cfg := testConfig(nil, nodes[0].url())
	l := connect(t, cfg)
	waitFor(t, 10*time.Second, "the cluster's peers to be announced", func() bool { return len(l.Stats().Server.Peers) >= 2 })
	info := l.Stats().Server
	if info.URL != nodes[0].url() || info.Name != "n0" || info.Cluster != "channels-nats-test" || info.Version == "" ||
		info.MaxPayload <= 0 {
		t.Fatalf("Stats().Server = %+v", info)
	}
	nodes[0].stop()
	waitFor(t, 15*time.Second, "the layer to move to another node", func() bool {
		s := l.Stats()
		return s.Connected && s.Server.URL != nodes[0].url()
	})
	if name := l.Stats().Server.Name; name != "n1" && name != "n2" {
		t.Fatalf("after the move Stats().Server.Name = %q", name)
	}
}
