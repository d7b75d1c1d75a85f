//go:build linux

package layer

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// testHost is an event loop of a host that reads the layer's connection: it watches
// ReadEvents in an epoll set of its own (as asyncio's selector does) and calls OnReadable
// whenever it is readable, while reading is set.
type testHost struct {
	reading atomic.Bool
	calls   atomic.Int64
	done    chan struct{}
}

func startTestHost(t *testing.T, l *Layer) *testHost {
	t.Helper()
	fd, err := l.ReadEvents()
	if err != nil {
		t.Fatalf("ReadEvents: %v", err)
	}
	if again, _ := l.ReadEvents(); again != fd {
		t.Fatalf("ReadEvents returned %d, then %d", fd, again)
	}
	loop, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.EpollCtl(loop, syscall.EPOLL_CTL_ADD, fd, &syscall.EpollEvent{Events: syscall.EPOLLIN}); err != nil {
		t.Fatal(err)
	}
	h := &testHost{done: make(chan struct{})}
	h.reading.Store(true)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		events := make([]syscall.EpollEvent, 1)
		for {
			select {
			case <-h.done:
				return
			default:
			}
			n, _ := syscall.EpollWait(loop, events, 20)
			if n > 0 && h.reading.Load() {
				l.OnReadable()
				h.calls.Add(1)
			} else if n > 0 {
				time.Sleep(time.Millisecond) // a host busy elsewhere: the descriptor stays readable
			}
		}
	}()
	t.Cleanup(func() {
		close(h.done)
		<-stopped
		_ = syscall.Close(loop)
	})
	return h
}

// hrSendAndReceive sends n numbered messages from b to channel of a, in order, and receives them
// on a, checking their order.
func hrSendAndReceive(t *testing.T, a, b *Layer, channel string, from, n int) {
	t.Helper()
	got := make(chan error, 1)
	go func() {
		for i := from; i < from+n; i++ {
			body, err := a.ReceiveRaw(ctxT(t, 10*time.Second), channel)
			if err != nil {
				got <- fmt.Errorf("receive %d: %w", i, err)
				return
			}
			if m := lcN(t, body); m != strconv.Itoa(i) {
				got <- fmt.Errorf("received %s, want %d", m, i)
				return
			}
		}
		got <- nil
	}()
	for i := from; i < from+n; i++ {
		lcSend(t, b, channel, strconv.Itoa(i))
		if i%16 == 0 {
			time.Sleep(time.Millisecond) // let receives wait too, not only find a backlog
		}
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}

// TestHostReadsTheConnection: a host that watches ReadEvents and calls OnReadable reads the
// connection, its messages keep their order, and after the socket is cut and nats.go
// reconnects, the same descriptor reports the new socket.
func TestHostReadsTheConnection(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Capacity = 200 // the receives may lag all of hrSendAndReceive's sends: none may be dropped (S2)
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	pc := msgNewChannel(t, a)
	startTestHost(t, a)

	hrSendAndReceive(t, a, b, pc, 0, 200)
	reads := a.Stats().HostReads.Reads
	if reads == 0 {
		t.Fatal("the host never read the connection")
	}

	before := a.Stats().Reconnects
	a.dialer.cutAll()
	waitFor(t, 10*time.Second, "the reconnect", func() bool { return a.Stats().Reconnects > before && a.Stats().Connected })
	rsRoundTrip(t, a) // the restored SUBs are on the server: b's sends no longer race them (S1)
	hrSendAndReceive(t, a, b, pc, 200, 200)
	if a.Stats().HostReads.Reads == reads {
		t.Fatal("after the reconnect the host read nothing: ReadEvents does not report the new socket")
	}
}

// TestHostReadsCanBeTurnedOff: with NoHostReads a connection in the clear offers no read
// events, and the library's own reader delivers everything.
func TestHostReadsCanBeTurnedOff(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.NoHostReads = true
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	if fd, err := a.ReadEvents(); !errors.Is(err, ErrNoReadEvents) || fd != -1 {
		t.Fatalf("ReadEvents with NoHostReads: %d, %v; want -1 and ErrNoReadEvents", fd, err)
	}
	pc := msgNewChannel(t, a)
	hrSendAndReceive(t, a, b, pc, 0, 50)
	if reads := a.Stats().HostReads.Reads; reads != 0 {
		t.Fatalf("the host read the connection %d times with NoHostReads", reads)
	}
}

// TestHostThatStopsReadingIsTakenOver: a host that stops calling OnReadable while bytes wait
// (its loop is blocked) does not stop the connection: the layer reads it again within a few
// checks, and the host reads again once it calls again. No message is lost or reordered.
func TestHostThatStopsReadingIsTakenOver(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	pc := msgNewChannel(t, a)
	h := startTestHost(t, a)
	hrSendAndReceive(t, a, b, pc, 0, 50)

	h.reading.Store(false)
	start := time.Now()
	hrSendAndReceive(t, a, b, pc, 50, 50)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("50 messages took %s without the host", took)
	}
	takeovers := a.Stats().HostReads.Takeovers
	if takeovers == 0 {
		t.Fatal("messages arrived while the host did not read, and no takeover was counted")
	}

	h.reading.Store(true)
	calls := h.calls.Load()
	hrSendAndReceive(t, a, b, pc, 100, 50)
	// The layer reads until the host's next call, and the host calls when its poll sees bytes
	// before the layer's own read took them: on a busy machine the layer can win that race for
	// every one of 50 messages, so more come until the host wins one.
	next := 150
	waitFor(t, 5*time.Second, "the host to read again", func() bool {
		if h.calls.Load() > calls {
			return true
		}
		hrSendAndReceive(t, a, b, pc, next, 1)
		next++
		return false
	})
	if !a.dialer.host.active() {
		t.Fatal("the host called OnReadable again, and the layer still reads itself")
	}
}

// TestReadEventsNeedTheProtocolInTheClear: over a websocket the bytes read are frames, not the
// protocol: the host cannot read them, and the layer says so.
func TestReadEventsNeedTheProtocolInTheClear(t *testing.T) {
	for _, servers := range [][]string{{"ws://127.0.0.1:1"}, {"nats://127.0.0.1:1", "tls://127.0.0.1:2"}} {
		if plainServers(servers) {
			t.Errorf("%v counted as the protocol in the clear", servers)
		}
	}
	if !plainServers([]string{"nats://127.0.0.1:1", "127.0.0.1:2", "NATS://h:3"}) {
		t.Error("nats:// URLs and bare addresses are the protocol in the clear")
	}
	if !(ConnectionOptions{TLSCAFile: "ca.pem"}).usesTLS() || (ConnectionOptions{}).usesTLS() {
		t.Error("usesTLS does not follow the TLS options")
	}
	l := &Layer{dialer: newDialer(time.Second, time.Second)}
	if _, err := l.ReadEvents(); !errors.Is(err, ErrNoReadEvents) {
		t.Fatalf("ReadEvents on a layer that does not frame its sockets: %v, want ErrNoReadEvents", err)
	}
}

// TestHostFansALargeGroupOutWithTheDispatcher: a group message that the host reads goes to the
// first chunk of its members on the host's thread and to the others on the dispatcher's, and
// every member gets every message once, in order.
func TestHostFansALargeGroupOutWithTheDispatcher(t *testing.T) {
	var a *Layer
	msgFanOutInChunks(t, func(l *Layer) {
		a = l
		startTestHost(t, l)
	})
	if a.Stats().HostReads.Reads == 0 {
		t.Fatal("the host never read the connection")
	}
}
