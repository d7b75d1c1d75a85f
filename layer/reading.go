package layer

import (
	"errors"
	"io"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Who reads a framed socket (see inbound.go). By default nats.go's reader does, in socket.Read,
// and routes what it framed before it reads again. A host with an event loop can read it on the
// loop's thread instead: it watches Layer.ReadEvents and calls Layer.OnReadable when that is
// readable. A message then reaches its waiting receive on the thread that reads the socket,
// with no thread in between to wake, as in a client written for that loop. Once the host has
// asked for ReadEvents, nats.go's reader waits for the operations the host framed for it.
//
// A host that stops reading (a loop blocked by a long call, or closed) must not stop the
// connection: the server would count it as a slow consumer, its pings would go unanswered and
// expiry would start late. So nats.go's reader checks every hostReadCheck while the host reads:
// when bytes wait and the host has not been called since the last check, the layer reads the
// socket itself again (a takeover, in Stats) until the host's next call.

const (
	// hostReadCheck is how long bytes may wait for the host before the layer reads them.
	hostReadCheck = 10 * time.Millisecond
	// hostIdleCheck is the longest gap between the checks while nothing waits to be read.
	hostIdleCheck = 160 * time.Millisecond
	// hostReadsPerEvent bounds the reads of one OnReadable: what is left keeps the descriptor
	// readable, so the host's other work runs between them, as asyncio's transports read once
	// per turn of the loop.
	hostReadsPerEvent = 4
)

// hostReads says whether the host reads the layer's established socket.
type hostReads struct {
	attached  atomic.Bool   // the host asked for the read events: it watches them
	stalled   atomic.Bool   // bytes waited past a check: the layer reads until the host's next call
	calls     atomic.Uint64 // calls of OnReadable
	reads     atomic.Uint64 // calls that read something (Stats)
	takeovers atomic.Uint64 // times the layer read because the host did not (Stats)
}

func (h *hostReads) active() bool { return h.attached.Load() && !h.stalled.Load() }

// called records a call of OnReadable: the host reads.
func (h *hostReads) called() {
	h.calls.Add(1)
	if h.stalled.Load() {
		h.stalled.Store(false)
	}
}

func (h *hostReads) stall() {
	if h.stalled.CompareAndSwap(false, true) {
		h.takeovers.Add(1)
	}
}

// readResult is what one read of a framed socket did.
type readResult uint8

const (
	readSome       readResult = iota // bytes were read and framed: more may be there
	readWouldBlock                   // nothing to read now
	readEnded                        // the socket failed or closed, or nats.go frames it (framingOff)
)

// Read is nats.go's reader's read: what the layer framed for it, or, on a socket it does not
// frame, the socket's bytes. Before it reads, the layer routes what the last read brought (see
// dispatch.go).
func (s *socket) Read(p []byte) (int, error) {
	if s.d.reading != nil {
		s.d.reading()
	}
	if s.raw == nil {
		return s.Conn.Read(p)
	}
	for {
		n, err, done, unframed := s.takeForwarded(p)
		switch {
		case done:
			return n, err
		case unframed:
			return s.Conn.Read(p)
		case s.hostReads() && !s.isClosed():
			s.awaitHost()
		default:
			s.waiting.Store(true)
			err := s.raw.Read(s.readWait)
			s.waiting.Store(false)
			if err != nil && !(s.woken.Swap(false) && errors.Is(err, os.ErrDeadlineExceeded) && s.restoreDeadline()) {
				return 0, err
			}
		}
	}
}

// takeForwarded copies into p what the layer framed for nats.go: whole operations, then the
// error that ended reading (done). unframed: nats.go frames this socket's bytes itself.
func (s *socket) takeForwarded(p []byte) (n int, err error, done, unframed bool) {
	s.readMu.Lock()
	defer s.readMu.Unlock()
	switch {
	case len(s.in.forward) > 0:
		n = copy(p, s.in.forward)
		s.in.forward = s.in.forward[:copy(s.in.forward, s.in.forward[n:])]
		return n, nil, true, false
	case s.in.err != nil:
		return 0, s.in.err, true, false
	}
	return 0, nil, false, s.in.state == framingOff
}

// hostReads reports whether the host reads this socket now.
func (s *socket) hostReads() bool { return s.established.Load() && s.d.host.active() }

func (s *socket) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// wakeReader ends nats.go's reader's wait for the descriptor, if it waits: the host read what
// it waited for, and framed operations for it. A read deadline in the past ends the wait (Go
// has no other way in); Read then restores nats.go's own.
func (s *socket) wakeReader() {
	if s.waiting.Load() {
		s.woken.Store(true)
		_ = s.Conn.SetReadDeadline(time.Unix(1, 0))
	}
}

// restoreDeadline sets nats.go's read deadline again after wakeReader; false when that deadline
// has passed meanwhile (the wait's error is nats.go's then).
func (s *socket) restoreDeadline() bool {
	s.deadlineMu.Lock()
	defer s.deadlineMu.Unlock()
	if !s.deadline.IsZero() && !time.Now().Before(s.deadline) {
		return false
	}
	_ = s.Conn.SetReadDeadline(s.deadline)
	return true
}

// readOnReader is nats.go's reader's read of the descriptor (syscall.RawConn.Read): false
// makes it wait until the socket is readable, true ends the wait.
func (s *socket) readOnReader(fd uintptr) bool {
	if s.hostReads() {
		return true // the host reads: wait for it instead
	}
	return s.readFrom(fd, false) != readWouldBlock || s.hasForwarded() // the host read it first
}

// hasForwarded reports whether in holds something for nats.go's reader.
func (s *socket) hasForwarded() bool {
	s.readMu.Lock()
	defer s.readMu.Unlock()
	return len(s.in.forward) > 0 || s.in.err != nil
}

// onReadable reads what the socket has, on the host's thread (Layer.OnReadable); it reports
// whether it read anything.
func (s *socket) onReadable() bool {
	if s.raw == nil || !s.established.Load() {
		return false
	}
	read := false
	for range hostReadsPerEvent {
		r := readEnded
		if s.raw.Control(func(fd uintptr) { r = s.readFrom(fd, true) }) != nil || r != readSome {
			break
		}
		read = true
	}
	return read
}

// readFrom reads the descriptor once, without waiting, frames what it read and routes the
// messages. The caller holds a reference to the descriptor (RawConn.Read or Control); onHost:
// it is the host, and nats.go's reader may be waiting for the descriptor.
func (s *socket) readFrom(fd uintptr, onHost bool) readResult {
	s.readMu.Lock()
	if s.in.err != nil || s.in.state == framingOff {
		s.readMu.Unlock()
		return readEnded
	}
	arrived := false
	n, err := readIgnoringEINTR(int(fd), s.in.space())
	switch {
	case err == errWouldBlock:
		s.readMu.Unlock()
		return readWouldBlock
	case err != nil:
		s.in.err = err
	case n == 0:
		s.in.err = io.EOF
	default:
		s.in.end += n
		s.in.begin()
		if err := s.in.frame(func(a arrival) { arrived = s.deliver(a) || arrived }); err != nil {
			s.in.err = err
		}
	}
	ended := s.in.err != nil
	forwarded := len(s.in.forward) > 0 || ended
	s.readMu.Unlock()
	if ended {
		s.stopReadEvents() // a socket at its end stays readable: the host must not be woken by it
	}
	if forwarded {
		select {
		case s.forwarded <- struct{}{}:
		default: // nats.go's reader was told already
		}
		if onHost {
			s.wakeReader()
		}
	}
	switch {
	case arrived && onHost:
		s.d.routeOnHost()
	case arrived && s.d.reading != nil:
		s.d.reading()
	}
	if ended {
		return readEnded
	}
	return readSome
}

// deliver takes one framed message into the layer, copied out of the read buffer, and reports
// whether it did: a message on a subscription that was given up is dropped, as nats.go drops it.
// s.readMu is held.
func (s *socket) deliver(a arrival) bool {
	s.subsMu.RLock()
	sub := s.out.subs[a.sid]
	s.subsMu.RUnlock()
	if sub == nil {
		return false
	}
	m := &nats.Msg{Subject: sub.Subject, Sub: sub, Data: make([]byte, len(a.payload))}
	copy(m.Data, a.payload)
	if string(a.subject) != sub.Subject { // the layer subscribes to no wildcard; this is for safety
		m.Subject = string(a.subject)
	}
	if len(a.hdr) > 0 {
		// A header block that does not parse is left out, as nats.go passes such a message
		// without it: the layer then counts it as a bad frame.
		m.Header, _ = nats.DecodeHeadersMsg(a.hdr)
	}
	s.d.arrive(m)
	return true
}

// awaitHost is nats.go's reader's wait while the host reads the socket: for operations the host
// framed for it, or for the socket to close. It checks that the host still reads (see the top
// of this file) and returns when it does not.
func (s *socket) awaitHost() {
	h := &s.d.host
	seen, interval := h.calls.Load(), hostReadCheck
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-s.forwarded:
			return
		case <-s.closed:
			return
		case <-t.C:
		}
		if !h.active() {
			return
		}
		switch n := h.calls.Load(); {
		case n != seen:
			seen, interval = n, hostReadCheck
		case s.unread():
			h.stall()
			return
		default:
			interval = min(2*interval, hostIdleCheck)
		}
		t.Reset(interval)
	}
}

// unread reports whether the socket has bytes (or its end) waiting to be read.
func (s *socket) unread() bool {
	waiting := false
	_ = s.raw.Control(func(fd uintptr) { waiting = peek(fd) })
	return waiting
}

// establish records that nats.go's connection on s is up: the host may read s from now on.
func (s *socket) establish() {
	if s.raw == nil {
		return
	}
	s.readMu.Lock()
	framed := s.in.state == framingOn
	s.readMu.Unlock()
	if framed && !s.established.Swap(true) {
		s.d.events.watch(s)
	}
}

// stopReadEvents takes s out of what the host watches.
func (s *socket) stopReadEvents() {
	if s.raw != nil {
		s.d.events.unwatch(s)
	}
}

// usesTLS reports whether the client asks for TLS itself (a server may still ask, in its INFO).
func (o ConnectionOptions) usesTLS() bool {
	return o.TLSCAFile != "" || o.TLSCertFile != "" || o.TLSFirst
}

// plainServers reports whether every server URL speaks the protocol in the clear: nats:// or no
// scheme (tls://, ws:// and wss:// do not).
func plainServers(servers []string) bool {
	for _, s := range servers {
		if scheme, _, ok := strings.Cut(s, "://"); ok && !strings.EqualFold(scheme, "nats") {
			return false
		}
	}
	return true
}
