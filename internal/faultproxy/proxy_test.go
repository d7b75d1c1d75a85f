package faultproxy

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// echoServer starts a TCP server on loopback that writes back what it reads, and returns its
// address. It is closed, connections included, when the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				_, _ = io.Copy(c, c)
				_ = c.Close()
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func startProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip sends msg and fails the test unless the same bytes come back within 5 s.
func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	if _, err := c.Write([]byte(msg)); err != nil {
		t.Fatal(err)
	}
	expect(t, c, msg, 5*time.Second)
}

// expect fails the test unless msg arrives on c within timeout.
func expect(t *testing.T, c net.Conn, msg string, timeout time.Duration) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = c.SetReadDeadline(time.Time{}) }()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("reading %q: %v", msg, err)
	}
	if string(got) != msg {
		t.Fatalf("got %q, want %q", got, msg)
	}
}

// expectClosed fails the test unless a read on c ends with EOF or an error other than a timeout.
func expectClosed(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := c.Read(make([]byte, 1))
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a closed connection: %v, want EOF or a connection error", err)
	}
}

// waitFor polls cond for up to 2 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 200 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestStartRejectsABadTarget(t *testing.T) {
	if _, err := Start("no-port"); err == nil {
		t.Fatal("Start accepted a target without a port")
	}
}

func TestPassForwards(t *testing.T) {
	p := startProxy(t, "nats://"+echoServer(t))
	if !strings.HasPrefix(p.Addr(), "127.0.0.1:") || p.URL() != "nats://"+p.Addr() {
		t.Fatalf("Addr %q, URL %q", p.Addr(), p.URL())
	}
	c := dial(t, p)
	roundTrip(t, c, "hello")
	roundTrip(t, c, "again")
	if p.Conns() != 1 || p.Accepted() != 1 {
		t.Fatalf("Conns %d, Accepted %d, want 1 and 1", p.Conns(), p.Accepted())
	}
}

// TestHalfClose checks that the end of one direction is passed on while the other still
// carries bytes, as TCP does, and that the connection is gone once both have ended.
func TestHalfClose(t *testing.T) {
	p := startProxy(t, echoServer(t))
	c := dial(t, p)
	if _, err := c.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "last words" {
		t.Fatalf("got %q (%v), want the echo and then EOF", got, err)
	}
	waitFor(t, "the connection to be gone", func() bool { return p.Conns() == 0 })
}

func TestDelay(t *testing.T) {
	const d = 150 * time.Millisecond
	p := startProxy(t, echoServer(t))
	c := dial(t, p)
	roundTrip(t, c, "warm up") // the connection is open before the mode changes

	p.Delay(d)
	start := time.Now()
	roundTrip(t, c, "ping")
	// Up and down are each delayed.
	if rt := time.Since(start); rt < 2*d || rt > time.Second {
		t.Fatalf("round trip under Delay(%v) took %v", d, rt)
	}

	// A delay line: chunks sent in a row are all in flight at once, and arrive in order.
	start = time.Now()
	var want strings.Builder
	for i := range 5 {
		msg := fmt.Sprintf("<%d>", i)
		want.WriteString(msg)
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(30 * time.Millisecond)
	}
	expect(t, c, want.String(), 5*time.Second)
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("5 chunks 30 ms apart under Delay(%v) took %v: not pipelined", d, took)
	}

	p.Pass()
	start = time.Now()
	roundTrip(t, c, "pong")
	if rt := time.Since(start); rt >= d {
		t.Fatalf("round trip after Pass took %v", rt)
	}
}

func TestStopUpBlocksTheSenderAndHoldsItsBytes(t *testing.T) {
	const total = 64 << 20
	p := startProxy(t, echoServer(t))
	c := dial(t, p)
	roundTrip(t, c, "warm up")

	p.Stop(Up)
	pattern := func(i int) byte { return byte(i % 251) } // a period that no buffer size divides
	block := make([]byte, 1<<20)
	written := 0
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	for written < total {
		for i := range block {
			block[i] = pattern(written + i)
		}
		n, err := c.Write(block)
		written += n
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if written >= total {
		t.Fatalf("all %d bytes written through a stopped link", written)
	}
	t.Logf("the write blocked after %d bytes", written)
	if p.Conns() != 1 {
		t.Fatalf("Conns %d while stopped, want 1", p.Conns())
	}

	_ = c.SetWriteDeadline(time.Time{})
	p.Pass()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got := make([]byte, 1<<20)
	for read := 0; read < written; {
		n, err := c.Read(got[:min(len(got), written-read)])
		for i := range n {
			if got[i] != pattern(read+i) {
				t.Fatalf("byte %d is %d, want %d", read+i, got[i], pattern(read+i))
			}
		}
		read += n
		if err != nil {
			t.Fatalf("after %d of %d bytes: %v", read, written, err)
		}
	}
}

func TestStopDownHoldsReplies(t *testing.T) {
	p := startProxy(t, echoServer(t))
	c := dial(t, p)
	roundTrip(t, c, "warm up")

	p.Stop(Down)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(make([]byte, 4)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %d bytes (%v) through a stopped link", n, err)
	}
	p.Pass()
	expect(t, c, "ping", 5*time.Second)
}

func TestCut(t *testing.T) {
	p := startProxy(t, echoServer(t))
	c := dial(t, p)
	roundTrip(t, c, "hello")

	p.Cut()
	expectClosed(t, c)
	if p.Conns() != 0 {
		t.Fatalf("Conns %d after Cut, want 0", p.Conns())
	}
	roundTrip(t, dial(t, p), "after cut")
	if p.Accepted() != 2 {
		t.Fatalf("Accepted %d, want 2", p.Accepted())
	}
}

func TestRefuse(t *testing.T) {
	p := startProxy(t, echoServer(t))
	p.Refuse(true)
	expectClosed(t, dial(t, p))
	if p.Accepted() != 1 || p.Conns() != 0 {
		t.Fatalf("Accepted %d, Conns %d, want 1 and 0", p.Accepted(), p.Conns())
	}
	p.Refuse(false)
	roundTrip(t, dial(t, p), "welcome back")
}

// TestModesUnderLoad flips modes while clients talk, for the race detector, and checks that no
// byte is lost or reordered.
func TestModesUnderLoad(t *testing.T) {
	p := startProxy(t, echoServer(t))
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 40 {
			switch i % 4 {
			case 0:
				p.Delay(5 * time.Millisecond)
			case 1:
				p.Stop(Up)
			case 2:
				p.Stop(Down)
			case 3:
				p.Pass()
			}
			time.Sleep(5 * time.Millisecond)
		}
		p.Pass()
	})
	for i := range 4 {
		c := dial(t, p)
		wg.Go(func() {
			for j := range 20 {
				msg := fmt.Sprintf("client %d message %d;", i, j)
				if _, err := c.Write([]byte(msg)); err != nil {
					t.Error(err)
					return
				}
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				got := make([]byte, len(msg))
				if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, []byte(msg)) {
					t.Errorf("got %q (%v), want %q", got, err, msg)
					return
				}
			}
		})
	}
	wg.Wait()
}

// proxyGoroutines counts the goroutines running a method of this package's types.
func proxyGoroutines() int {
	buf := make([]byte, 1<<20)
	n := 0
	for stack := range strings.SplitSeq(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(stack, "faultproxy.(*") {
			n++
		}
	}
	return n
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	target := echoServer(t)
	before := runtime.NumGoroutine()

	p, err := Start(target)
	if err != nil {
		t.Fatal(err)
	}
	// Goroutines in every kind of wait: a writer on a delayed chunk, a reader on a stopped
	// direction, readers in Read, a refused connection.
	idle, delayed := dial(t, p), dial(t, p)
	roundTrip(t, idle, "hello")
	roundTrip(t, delayed, "hello")
	p.Delay(time.Hour)
	if _, err := delayed.Write([]byte("delayed")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // for the proxy to read the chunk before Stop
	p.Stop(Up)
	if _, err := idle.Write([]byte("held")); err != nil {
		t.Fatal(err)
	}
	p.Refuse(true)
	expectClosed(t, dial(t, p))

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if p.Conns() != 0 {
		t.Fatalf("Conns %d after Close", p.Conns())
	}
	// Close waits for its own goroutines; other ones (the echo server's) may take a moment.
	if n := proxyGoroutines(); n != 0 {
		t.Fatalf("%d of the proxy's goroutines still run after Close", n)
	}
	expectClosed(t, idle)
	expectClosed(t, delayed)
	waitFor(t, "the goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}
