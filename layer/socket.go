package layer

import (
	"errors"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

// The layer's sockets sit under nats.go, which is told to pass on every protocol operation as
// soon as it is made (writeBufferSize). A socket takes those writes into a buffer of its own and
// its flusher goroutine writes them out: a batch the link's writer hands over leaves in one
// system call, as it did from nats.go's buffer.
//
// A publish made on a quiet connection (link.tryInline) does not pass through nats.go: the
// layer writes its protocol operation to the socket of the established connection itself
// (socket.writePublish), on the publishing thread, as asyncio's transports write at once when
// their buffer is empty. Behind bytes still buffered or being written it is buffered too, so
// the socket's writes leave in the order they were made. See protocol.go for why.
//
// What a socket reads, and who reads it, is in inbound.go and reading.go.

const (
	// writeBufferSize is nats.go's flush threshold: 1 makes it write each operation to the socket
	// at once, which buffers it.
	writeBufferSize = 1
	// socketBufferLimit: a write of nats.go's that would bring a socket's buffer past this is
	// written out by its caller, which waits for the socket meanwhile, as nats.go's writes did
	// past its own 32 KiB buffer. It is the bound of what a socket holds (one larger write
	// aside). writePublish never waits: the link only writes that way below inlineLimit.
	socketBufferLimit = 32 << 10
	// closeWriteBound bounds the last write of a socket that closes: the link has had what it
	// handed over confirmed by then, or counted it as lost.
	closeWriteBound = 100 * time.Millisecond
)

// socketWriteTimeout: a write that takes nothing for as long as the pings allow means the link is
// dead. A shorter bound would tear down a link that only stalled, and while a write waits, no
// ping can go out.
func socketWriteTimeout(o ConnectionOptions) time.Duration {
	return o.PingInterval * time.Duration(o.MaxPingsOutstanding+1)
}

// dialer opens the layer's sockets and remembers them, so that Close can cut one that a stuck
// write holds: nats.go writes while holding its connection lock, and a socket that takes nothing
// would keep even nats.go's own Close waiting until the write deadline.
type dialer struct {
	timeout      time.Duration          // of a dial
	writeTimeout time.Duration          // a write that takes nothing for this long fails: the link is dead
	dialing      func()                 // called as nats.go starts a dial, while it holds its connection lock
	reading      func()                 // called before each read of a socket: the layer routes what the last one brought
	arrive       func(*nats.Msg)        // takes a message framed from a socket's stream (inbound.go)
	routeOnHost  func()                 // routes what the host read (Layer.OnReadable)
	frames       bool                   // the layer may frame what its sockets read: no TLS is configured
	host         hostReads              // whether the host reads the established socket (reading.go)
	events       readEvents             // the descriptor a host that reads the connection watches
	latest       atomic.Pointer[socket] // the socket of the last dial
	mu           sync.Mutex
	open         map[*socket]struct{}
}

func newDialer(timeout, writeTimeout time.Duration) *dialer {
	return &dialer{timeout: timeout, writeTimeout: writeTimeout, open: map[*socket]struct{}{}}
}

// Dial is nats.CustomDialer's method.
func (d *dialer) Dial(network, address string) (net.Conn, error) {
	if d.dialing != nil {
		d.dialing()
	}
	c, err := net.DialTimeout(network, address, d.timeout)
	if err != nil {
		return nil, err
	}
	s := &socket{Conn: c, d: d, kick: make(chan struct{}, 1), closed: make(chan struct{}), forwarded: make(chan struct{}, 1)}
	if sc, ok := c.(syscall.Conn); ok && d.frames {
		if raw, err := sc.SyscallConn(); err == nil {
			s.raw, s.readWait = raw, s.readOnReader
		}
	}
	d.mu.Lock()
	d.open[s] = struct{}{}
	d.mu.Unlock()
	d.latest.Store(s)
	go s.flusher()
	return s, nil
}

// cutAll closes every socket the dialer opened that is still open.
func (d *dialer) cutAll() {
	d.mu.Lock()
	open := make([]*socket, 0, len(d.open))
	for s := range d.open {
		open = append(open, s)
	}
	d.mu.Unlock()
	for _, s := range open {
		_ = s.Close()
	}
}

// wire is the socket of an established connection, with what its server accepts.
type wire struct {
	sock       *socket
	maxPayload int64
	headers    bool
}

// takes reports whether m may be written on w as it is: a larger one, or one with headers that
// the server does not support, goes through nats.go, which refuses it.
func (w wire) takes(m *nats.Msg, size int64) bool {
	return w.sock != nil && size <= w.maxPayload && (len(m.Header) == 0 || w.headers)
}

// established returns the wire of nc when nc is connected, on the socket of the dialer's last
// dial, and writes the protocol to it as it is (bare); else none. nats.go dials only while it
// is not connected, so a connected nc writes to the last socket dialed, unless a dial began
// meanwhile: the socket is read before and after. It waits for nats.go's connection lock: only
// the callbacks and the connecting goroutine call it.
func (d *dialer) established(nc *nats.Conn) wire {
	s := d.latest.Load()
	if s == nil || !nc.IsConnected() || !bare(nc) {
		return wire{}
	}
	w := wire{sock: s, maxPayload: nc.MaxPayload(), headers: nc.HeadersSupported()}
	if d.latest.Load() != s {
		return wire{}
	}
	s.establish()
	return w
}

// bare reports whether nc writes the NATS protocol to its socket as it is: not through TLS, not
// in websocket frames. Only to such a socket may the layer write a publish itself.
func bare(nc *nats.Conn) bool {
	if _, err := nc.TLSConnectionState(); !errors.Is(err, nats.ErrConnectionNotTLS) {
		return false
	}
	u, err := url.Parse(nc.ConnectedUrl())
	return err == nil && u.Scheme != "ws" && u.Scheme != "wss"
}

// socket is one connection's socket (see the top of this file).
type socket struct {
	net.Conn
	d      *dialer
	kick   chan struct{} // the buffer has bytes for the flusher
	closed chan struct{}

	writing sync.Mutex // held while bytes go to the socket: the writes leave in order

	mu    sync.Mutex
	buf   []byte // written, in order, before anything written later
	spare []byte // the flusher's: buf's next backing array
	err   error  // the write that failed, or net.ErrClosed: every later write fails with it

	closing  sync.Once
	closeErr error

	// The read side (reading.go): set when the layer frames what this socket reads.
	raw         syscall.RawConn
	readWait    func(fd uintptr) bool // readOnReader, made once: a method value per read allocates
	readMu      sync.Mutex
	in          inbound       // guarded by readMu
	forwarded   chan struct{} // in has operations or an error for nats.go's reader
	established atomic.Bool   // nats.go's connection on this socket is up: the host may read it
	waiting     atomic.Bool   // nats.go's reader waits for the descriptor (RawConn.Read)
	woken       atomic.Bool   // that wait was cut short by wakeReader
	deadlineMu  sync.Mutex
	deadline    time.Time // nats.go's read deadline

	subsMu sync.RWMutex
	out    outbound // guarded by subsMu
}

// Write takes p (nats.go's writes are whole protocol operations); see the top of this file.
func (s *socket) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if s.raw != nil {
		s.subsMu.Lock()
		s.out.scan(p)
		s.subsMu.Unlock()
	}
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return 0, err
	}
	if len(s.buf)+len(p) <= socketBufferLimit {
		s.bufferLocked(p)
		return len(p), nil
	}
	s.mu.Unlock()
	s.writing.Lock() // behind the flusher's write, if one is under way
	defer s.writing.Unlock()
	s.mu.Lock()
	out := net.Buffers{s.buf, p}
	s.buf = s.buf[len(s.buf):] // out holds the array until it is written
	s.mu.Unlock()
	err := s.writeOut(&out)
	s.mu.Lock()
	if len(s.buf) == 0 {
		s.buf = s.buf[:0:0] // let the written array go; the next append makes a new one
	}
	s.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return len(p), nil
}

// writePublish writes the protocol operation of m (see protocol.go) straight to the socket when
// nothing is buffered or being written; else it buffers it behind those bytes. It never waits
// for the flusher, and waits for the socket only as long as the kernel's socket buffer is full:
// the link writes this way only while what the server has not confirmed is small. It returns
// false when the socket had failed or closed before: then nothing of m went out. A write that
// fails closes the socket (failed), and nats.go replaces the connection. m.Data is not kept.
func (s *socket) writePublish(m *nats.Msg) bool {
	bp := opBuffers.Get().(*[]byte)
	// One buffer, one write: the body is small here (inlineLimit), and Go's race detector sees
	// a plain write to a socket, not writev, as ordering what the peer reads after it.
	op := append(append(appendPublishOp((*bp)[:0], m), m.Data...), crlf...)
	defer func() {
		if cap(op) <= opBufferKept {
			*bp = op[:0]
			opBuffers.Put(bp)
		}
	}()
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return false
	}
	if len(s.buf) > 0 || !s.writing.TryLock() {
		s.bufferLocked(op)
		return true
	}
	s.mu.Unlock()
	_, err := s.Conn.Write(op)
	s.writing.Unlock()
	s.failed(err)
	return true
}

// bufferLocked appends p to the buffer, unlocks s.mu and tells the flusher when the buffer was
// empty. s.mu must be held.
func (s *socket) bufferLocked(p []byte) {
	first := len(s.buf) == 0
	s.buf = append(s.buf, p...)
	s.mu.Unlock()
	if first {
		select {
		case s.kick <- struct{}{}:
		default: // the flusher was told already
		}
	}
}

// flusher writes the buffer out whenever it has bytes, until the socket closes.
func (s *socket) flusher() {
	for {
		select {
		case <-s.kick:
		case <-s.closed:
			return
		}
		s.writing.Lock()
		s.mu.Lock()
		out := s.buf
		s.buf = s.spare[:0]
		s.mu.Unlock()
		if len(out) > 0 {
			buffers := net.Buffers{out}
			_ = s.writeOut(&buffers)
		}
		if cap(out) > 4*socketBufferLimit {
			out = nil // a large write passed: do not keep its array
		}
		s.spare = out[:0]
		s.writing.Unlock()
	}
}

// writeOut writes out to the socket within the dialer's write timeout. s.writing must be held.
func (s *socket) writeOut(out *net.Buffers) error {
	_ = s.Conn.SetWriteDeadline(time.Now().Add(s.d.writeTimeout))
	_, err := out.WriteTo(s.Conn)
	_ = s.Conn.SetWriteDeadline(time.Time{}) // writePublish sets none: it cannot wait
	s.failed(err)
	return err
}

// failed records a write that failed and closes the socket, so that nats.go's reader fails too
// and nats.go replaces the connection: what it had buffered here is lost with the socket.
func (s *socket) failed(err error) {
	if err == nil {
		return
	}
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.buf = nil
	s.mu.Unlock()
	_ = s.Close()
}

// SetDeadline sets only the read deadline: the socket bounds its writes itself, and nats.go's
// writes to it never wait.
func (s *socket) SetDeadline(t time.Time) error { return s.SetReadDeadline(t) }

// SetReadDeadline sets nats.go's read deadline, which the socket keeps to restore it after it
// cut a wait of nats.go's reader short (wakeReader).
func (s *socket) SetReadDeadline(t time.Time) error {
	s.deadlineMu.Lock()
	defer s.deadlineMu.Unlock()
	s.deadline = t
	return s.Conn.SetReadDeadline(t)
}

// SetWriteDeadline does nothing, for the same reason.
func (s *socket) SetWriteDeadline(time.Time) error { return nil }

// Close writes what the buffer holds, when no write is stuck and within closeWriteBound (nats.go
// flushes its buffer before it closes a connection), then closes the socket: that also ends a
// write that waits.
func (s *socket) Close() error {
	s.closing.Do(func() {
		s.d.mu.Lock()
		delete(s.d.open, s)
		s.d.mu.Unlock()
		if s.writing.TryLock() {
			s.mu.Lock()
			out, failed := net.Buffers{s.buf}, s.err != nil
			s.buf = nil
			if !failed {
				s.err = net.ErrClosed
			}
			s.mu.Unlock()
			if len(out[0]) > 0 && !failed {
				_ = s.Conn.SetWriteDeadline(time.Now().Add(min(s.d.writeTimeout, closeWriteBound)))
				_, _ = out.WriteTo(s.Conn)
			}
			s.writing.Unlock()
		}
		s.mu.Lock()
		s.buf = nil
		if s.err == nil {
			s.err = net.ErrClosed
		}
		s.mu.Unlock()
		close(s.closed)
		s.stopReadEvents()
		s.closeErr = s.Conn.Close()
	})
	return s.closeErr
}
