package layer

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// pipeSocket is a socket over one end of a net.Pipe, whose writes wait until the other end
// reads them: a socket whose peer takes nothing.
func pipeSocket(t *testing.T) (*socket, *dialer, net.Conn) {
	t.Helper()
	mine, peer := net.Pipe()
	d := newDialer(time.Second, 5*time.Second)
	s := &socket{Conn: mine, d: d, kick: make(chan struct{}, 1), closed: make(chan struct{})}
	d.open[s] = struct{}{}
	go s.flusher()
	t.Cleanup(func() {
		_ = s.Close()
		_ = peer.Close()
	})
	return s, d, peer
}

// writeReturns reports whether write returned within d.
func writeReturns(write func(), d time.Duration) bool {
	done := make(chan struct{})
	go func() {
		write()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// TestSocketBuffersWritesWithoutWaiting: the writes nats.go makes return at once while the peer
// takes nothing, up to socketBufferLimit; they reach the peer later, whole and in order.
func TestSocketBuffersWritesWithoutWaiting(t *testing.T) {
	s, _, peer := pipeSocket(t)
	var want bytes.Buffer
	for n := 0; want.Len()+100 <= socketBufferLimit; n++ {
		op := fmt.Sprintf("PUB a.b %d\r\n%s\r\n", n, strings.Repeat("x", 80))
		want.WriteString(op)
		if !writeReturns(func() { _, _ = s.Write([]byte(op)) }, 2*time.Second) {
			t.Fatalf("write %d (%d bytes buffered) waited for a peer that takes nothing", n, want.Len())
		}
	}
	got := make([]byte, want.Len())
	if _, err := io.ReadFull(peer, got); err != nil {
		t.Fatalf("reading what was buffered: %v", err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("the peer read other bytes than were written, or in another order")
	}
}

// TestSocketWritesAPublishOnTheCaller: writePublish writes a publish's protocol operation to
// the socket on the caller's goroutine, so it returns only once the peer took it; behind a
// buffered write it is buffered instead and returns at once, and the peer reads both in order.
// On a socket that failed it writes nothing and says so.
func TestSocketWritesAPublishOnTheCaller(t *testing.T) {
	s, _, peer := pipeSocket(t)
	const op = "PUB a 1\r\nx\r\n"
	done := make(chan bool, 1)
	go func() { done <- s.writePublish(&nats.Msg{Subject: "a", Data: []byte("x")}) }()
	select {
	case <-done:
		t.Fatal("writePublish returned before the peer read it: it was buffered")
	case <-time.After(100 * time.Millisecond):
	}
	got := make([]byte, len(op))
	if _, err := io.ReadFull(peer, got); err != nil || string(got) != op {
		t.Fatalf("peer read %q (%v), want %q", got, err, op)
	}
	if !<-done {
		t.Fatal("writePublish reported nothing written on an open socket")
	}

	// A buffered write first, held by the flusher in a write the peer does not take yet: the
	// publish behind it must not overtake it, nor wait.
	first := "PUB a 5\r\nfirst\r\n"
	if _, err := s.Write([]byte(first)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the flusher to start its write", func() bool {
		if !s.writing.TryLock() {
			return true
		}
		s.writing.Unlock()
		return false
	})
	second := &nats.Msg{Subject: "b", Header: nats.Header{"Channel": {"b!x"}}, Data: []byte("second")}
	wantSecond := "HPUB b 26 32\r\nNATS/1.0\r\nChannel: b!x\r\n\r\nsecond\r\n"
	if !writeReturns(func() { s.writePublish(second) }, 2*time.Second) {
		t.Fatal("a publish behind a write under way waited for the socket")
	}
	both := make([]byte, len(first)+len(wantSecond))
	if _, err := io.ReadFull(peer, both); err != nil || string(both) != first+wantSecond {
		t.Fatalf("peer read %q (%v), want %q", both, err, first+wantSecond)
	}

	_ = s.Close()
	if s.writePublish(&nats.Msg{Subject: "a", Data: []byte("x")}) {
		t.Fatal("writePublish on a closed socket reported the publish written")
	}
}

// TestSocketLargeWritesWaitForTheSocket: a write that would take the buffer past
// socketBufferLimit is written by its caller, which waits for the peer meanwhile (the bound of
// what the socket holds), after what was buffered before it.
func TestSocketLargeWritesWaitForTheSocket(t *testing.T) {
	s, _, peer := pipeSocket(t)
	small := "PUB a 1\r\ns\r\n"
	large := "PUB a " + fmt.Sprint(socketBufferLimit) + "\r\n" + strings.Repeat("L", socketBufferLimit) + "\r\n"
	if _, err := s.Write([]byte(small)); err != nil {
		t.Fatal(err)
	}
	var returned atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = s.Write([]byte(large))
		returned.Store(true)
	}()
	time.Sleep(100 * time.Millisecond)
	if returned.Load() {
		t.Fatal("a write past socketBufferLimit returned while the peer took nothing")
	}
	got := make([]byte, len(small)+len(large))
	if _, err := io.ReadFull(peer, got); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if string(got) != small+large {
		t.Fatal("the peer read the large write out of order with the buffered one")
	}
}

// TestSocketFailedWriteFailsTheSocket: when the peer is gone, the flusher's write fails; the
// socket closes (so that nats.go's reader fails and it reconnects) and every later write returns
// the error at once.
func TestSocketFailedWriteFailsTheSocket(t *testing.T) {
	s, d, peer := pipeSocket(t)
	_ = peer.Close()
	if _, err := s.Write([]byte("PING\r\n")); err != nil {
		t.Fatalf("a buffered write failed at once: %v", err)
	}
	waitFor(t, 2*time.Second, "the failed write to close the socket", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return len(d.open) == 0
	})
	_, err := s.Write([]byte("PING\r\n"))
	if err == nil || !(errors.Is(err, io.ErrClosedPipe) || errors.Is(err, net.ErrClosed)) {
		t.Fatalf("a write after the failure returned %v, want the failure", err)
	}
	if _, err := s.Read(make([]byte, 1)); err == nil {
		t.Fatal("the socket still reads after its write failed")
	}
}

// socketsBuffered is how many bytes l's open sockets hold, not yet written.
func socketsBuffered(l *Layer) int {
	l.dialer.mu.Lock()
	defer l.dialer.mu.Unlock()
	n := 0
	for s := range l.dialer.open {
		s.mu.Lock()
		n += len(s.buf)
		s.mu.Unlock()
	}
	return n
}

// pingCounter relays one client's connections to a server and counts the PINGs the client
// writes (the bodies the tests send never contain one).
type pingCounter struct {
	ln    net.Listener
	pings atomic.Int64
}

func startPingCounter(t *testing.T, server string) *pingCounter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc := &pingCounter{ln: ln}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			upstream, err := net.Dial("tcp", server)
			if err != nil {
				_ = client.Close()
				return
			}
			t.Cleanup(func() {
				_ = client.Close()
				_ = upstream.Close()
			})
			go func() { _, _ = io.Copy(client, upstream) }()
			go pc.relay(upstream, client)
		}
	}()
	return pc
}

// relay copies what the client writes to the server, counting the PINGs in it.
func (pc *pingCounter) relay(upstream, client net.Conn) {
	var tail []byte // the end of the last read: a PING may span two reads
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			seen := append(tail, buf[:n]...)
			pc.pings.Add(int64(bytes.Count(seen, []byte("PING\r\n")) - bytes.Count(tail, []byte("PING\r\n"))))
			tail = append(tail[:0], seen[max(0, len(seen)-5):]...)
			if _, err := upstream.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			_ = upstream.Close()
			return
		}
	}
}

// TestQuietPublishesSendNoPing: publishes on a quiet connection go to the socket on the caller's
// thread with no PING to force them out (a PING per publish made the server answer each with a
// PONG that woke the reader for nothing); only the link's confirmations send PINGs, a few for
// the whole trickle.
func TestQuietPublishesSendNoPing(t *testing.T) {
	s := startServer(t)
	pc := startPingCounter(t, strings.TrimPrefix(s.url(), "nats://"))
	a := connect(t, testConfig(nil, "nats://"+pc.ln.Addr().String()))
	const group, count = "quiet-ping", 20
	sub := lkSubscribe(t, s.url(), "channels.grp."+group)
	waitFor(t, 5*time.Second, "the link to settle", func() bool { return linkSettled(a) })
	before, start := pc.pings.Load(), time.Now()
	for n := range count {
		time.Sleep(2 * time.Millisecond)
		if sd := lkStartGroupSend(t, a, group, n, lkBody(t, n, 100)); sd.op != nil {
			t.Fatalf("send %d waits for room on an idle link", n)
		}
		if left := socketsBuffered(a); left != 0 {
			t.Fatalf("send %d: %d byte(s) left in the socket's buffer when StartGroupSend returned, want them written", n, left)
		}
	}
	if got := sub.drain(t, 500*time.Millisecond, 2*count); len(got) != count {
		t.Fatalf("%d of %d messages arrived", len(got), count)
	}
	// 20 sends in about 50 ms: a periodic confirmation per confirmEvery they took (a busy
	// machine stretches them), and one more on the way out. A PING per publish would be 20.
	took := time.Since(start)
	if pings, most := pc.pings.Load()-before, int64(took/confirmEvery)+3; pings > most {
		t.Fatalf("%d quiet publishes in %s sent %d PINGs, want at most %d (the link's confirmations)", count, took, pings, most)
	}
}
