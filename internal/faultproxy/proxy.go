// Package faultproxy is a loopback TCP proxy for tests. It sits between a client and a server
// and injects the faults a real network produces while the TCP connection stays open: a
// stalled link (Stop) and a slow link (Delay). Closing faults (Cut, Refuse) are there too, so
// one proxy can play a test's whole fault plan.
//
// Every mode applies at once to the connections already open and to new ones.
package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

const (
	// holdCap bounds the bytes one direction of a connection holds (read, not yet written):
	// past it the reader pauses, so a long delay on a fast sender costs bounded memory and
	// the sender feels the back pressure a slow link gives.
	holdCap = 8 << 20
	// readSize is the most one read takes from a socket.
	readSize = 32 << 10
	// dialTimeout bounds the dial to the target for each accepted connection.
	dialTimeout = 5 * time.Second
)

// Direction names the way bytes travel through the proxy.
type Direction int

const (
	Up   Direction = 1 << iota // client to server
	Down                       // server to client
	Both Direction = Up | Down // both ways
)

// Proxy forwards every connection accepted on a loopback port to its target. It is safe for
// concurrent use.
type Proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup // the accept loop and every connection's goroutines

	mu       sync.Mutex
	stopped  Direction     // directions not forwarded
	delay    time.Duration // how long every chunk waits after it was read
	refuse   bool
	changed  chan struct{} // closed and replaced at every mode change, to wake the waiters
	links    map[*link]struct{}
	accepted int
	closed   bool
}

// link is one proxied connection: the client's socket and the one dialled to the target.
// Its fields are guarded by Proxy.mu.
type link struct {
	client net.Conn
	server net.Conn // nil until the dial succeeds
	// ctx is done once the link is closed; it ends the dial and every wait of its pipes.
	ctx    context.Context
	cancel context.CancelFunc
}

// Start listens on a free port of 127.0.0.1 and proxies each connection to target, given as
// host:port or nats://host:port. The target is dialled per connection, so it need not be up
// yet.
func Start(target string) (*Proxy, error) {
	target = strings.TrimPrefix(target, "nats://")
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("faultproxy: target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p := &Proxy{ln: ln, target: target, changed: make(chan struct{}), links: map[*link]struct{}{}}
	p.wg.Go(p.acceptLoop)
	return p, nil
}

// Addr is the address the proxy listens on, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL is Addr as a NATS server URL, "nats://127.0.0.1:port".
func (p *Proxy) URL() string { return "nats://" + p.Addr() }

// Pass forwards normally: it ends Stop and Delay, and bytes they held go out at once. It leaves
// Refuse as it is.
func (p *Proxy) Pass() {
	p.setMode(func() { p.stopped, p.delay = 0, 0 })
}

// Delay forwards every chunk d after it was read, in order, in both directions, while reading
// goes on: a delay line, like a link with a long round trip. Delay(0) ends it; a Stop in force
// stays in force.
func (p *Proxy) Delay(d time.Duration) {
	p.setMode(func() { p.delay = d })
}

// Stop stops forwarding in dir while both sockets stay open, like a stalled link: the proxy
// stops reading from the source, so the kernel buffers fill and the sender's writes block.
// Bytes read before are held and written after Pass. Stops add up: Stop(Up) then Stop(Down)
// stops both.
func (p *Proxy) Stop(dir Direction) {
	p.setMode(func() {
		p.stopped |= dir
		// A read already waiting would take the next bytes even though the mode changed; a
		// past deadline ends it, and the reader then sees the mode before reading again.
		now := time.Now()
		for l := range p.links {
			if dir&Up != 0 {
				_ = l.client.SetReadDeadline(now)
			}
			if dir&Down != 0 && l.server != nil {
				_ = l.server.SetReadDeadline(now)
			}
		}
	})
}

// Cut closes every open connection, both sockets, at once. New connections are still accepted.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closeLinks()
}

// Refuse, while on, closes every new connection as soon as it is accepted, like a server that
// is going down. Open connections are left alone.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = on
}

// Conns is how many client connections are open now.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// Accepted is how many client connections were accepted in total, refused ones included.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Close stops listening, closes every connection and waits until all the proxy's goroutines
// have ended.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	p.closeLinks()
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// setMode applies change under the lock and wakes every goroutine that waits on the mode.
func (p *Proxy) setMode(change func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	change()
	close(p.changed)
	p.changed = make(chan struct{})
}

// mode returns the current mode and a channel closed at its next change, so a waiter that
// checked this mode cannot miss the change.
func (p *Proxy) mode() (stopped Direction, delay time.Duration, changed <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopped, p.delay, p.changed
}

// closeLinks closes and forgets every link; p.mu is held.
func (p *Proxy) closeLinks() {
	for l := range p.links {
		l.close()
		delete(p.links, l)
	}
}

// close closes both sockets and ends the link's waits; Proxy.mu is held. Closing twice is
// harmless.
func (l *link) close() {
	l.cancel()
	_ = l.client.Close()
	if l.server != nil {
		_ = l.server.Close()
	}
}

// drop closes the link and forgets it.
func (p *Proxy) drop(l *link) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l.close()
	delete(p.links, l)
}

func (p *Proxy) acceptLoop() {
	for {
		c, err := p.ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			// Out of file descriptors and the like: pause so they can free up instead of spinning.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		p.admit(c)
	}
}

// admit registers a new client connection and starts its goroutine, unless Refuse is on or
// the proxy is closing.
func (p *Proxy) admit(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.accepted++
	if p.refuse || p.closed {
		_ = c.Close()
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &link{client: c, ctx: ctx, cancel: cancel}
	p.links[l] = struct{}{}
	p.wg.Go(func() { p.run(l) })
}

// run dials the target for l, forwards both ways until both have ended or the link is
// closed, then closes it.
func (p *Proxy) run(l *link) {
	defer p.drop(l)
	dialer := net.Dialer{Timeout: dialTimeout}
	server, err := dialer.DialContext(l.ctx, "tcp", p.target)
	if err != nil {
		return
	}
	p.mu.Lock()
	if l.ctx.Err() != nil { // cut or closed while dialling
		p.mu.Unlock()
		_ = server.Close()
		return
	}
	l.server = server
	pipes := []*pipe{newPipe(p, l, Up, l.client, server), newPipe(p, l, Down, server, l.client)}
	p.mu.Unlock()

	var wg sync.WaitGroup
	for _, pp := range pipes {
		wg.Go(pp.read)
		wg.Go(pp.write)
	}
	wg.Wait()
}

// pipe carries one direction of a link. A reader goroutine fills a queue of chunks stamped
// with their read time and a writer goroutine empties it, so the mode can hold or delay bytes
// without stopping the other direction, and reading can go on while bytes wait.
type pipe struct {
	p        *Proxy
	l        *link
	dir      Direction
	src, dst net.Conn

	mu    sync.Mutex
	queue []chunk
	held  int  // bytes in queue
	eof   bool // src has ended; the writer passes that on once the queue is empty

	data  chan struct{} // poked when the queue grows or eof is set: wakes the writer
	space chan struct{} // poked when the queue shrinks: wakes a reader paused at holdCap
}

type chunk struct {
	b  []byte
	at time.Time // when it was read; it is due at at+delay
}

func newPipe(p *Proxy, l *link, dir Direction, src, dst net.Conn) *pipe {
	return &pipe{p: p, l: l, dir: dir, src: src, dst: dst,
		data: make(chan struct{}, 1), space: make(chan struct{}, 1)}
}

// poke wakes the goroutine waiting on c, or the next one to wait: c has room for one wake-up,
// so none is lost and the poker never blocks.
func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (pp *pipe) read() {
	defer func() {
		pp.mu.Lock()
		pp.eof = true
		pp.mu.Unlock()
		poke(pp.data)
	}()
	buf := make([]byte, readSize)
	for pp.waitReadable() {
		n, err := pp.src.Read(buf)
		if n > 0 {
			// A copy of the right size, so what is held is what holdCap counts.
			pp.push(bytes.Clone(buf[:n]))
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Stop ended the read. Clearing the deadline before waitReadable looks at the mode
			// means a Stop after that look ends the next read too.
			_ = pp.src.SetReadDeadline(time.Time{})
			continue
		}
		if err != nil {
			return
		}
	}
}

// waitReadable waits until the direction is not stopped and holds less than holdCap; false
// once the link is closed.
func (pp *pipe) waitReadable() bool {
	for {
		stopped, _, changed := pp.p.mode()
		pp.mu.Lock()
		full := pp.held >= holdCap
		pp.mu.Unlock()
		if stopped&pp.dir == 0 && !full {
			return true
		}
		select {
		case <-changed:
		case <-pp.space:
		case <-pp.l.ctx.Done():
			return false
		}
	}
}

func (pp *pipe) push(b []byte) {
	pp.mu.Lock()
	pp.queue = append(pp.queue, chunk{b: b, at: time.Now()})
	pp.held += len(b)
	pp.mu.Unlock()
	poke(pp.data)
}

func (pp *pipe) write() {
	for {
		c, ok := pp.next()
		if !ok {
			break
		}
		if _, err := pp.dst.Write(c.b); err != nil {
			pp.p.drop(pp.l) // a broken socket ends the whole connection
			return
		}
		pp.pop()
	}
	if pp.l.ctx.Err() == nil {
		// The source ended: pass its end on as TCP does, with the other direction still open.
		if cw, ok := pp.dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}
}

// next waits until the chunk at the head of the queue is due under the current mode and
// returns it, leaving it queued (and counted) until pop. It returns false once the queue is
// empty after the source ended, or the link is closed.
func (pp *pipe) next() (chunk, bool) {
	for {
		stopped, delay, changed := pp.p.mode()
		pp.mu.Lock()
		empty, eof := len(pp.queue) == 0, pp.eof
		var head chunk
		if !empty {
			head = pp.queue[0]
		}
		pp.mu.Unlock()

		var due <-chan time.Time
		switch {
		case empty && eof:
			return chunk{}, false
		case empty, stopped&pp.dir != 0:
			// wait for data or a mode change
		default:
			wait := time.Until(head.at.Add(delay))
			if wait <= 0 {
				return head, true
			}
			due = time.After(wait)
		}
		select {
		case <-pp.data:
		case <-changed:
		case <-due:
		case <-pp.l.ctx.Done():
			return chunk{}, false
		}
	}
}

// pop drops the head chunk once it is written and wakes a reader paused at holdCap.
func (pp *pipe) pop() {
	pp.mu.Lock()
	pp.held -= len(pp.queue[0].b)
	pp.queue[0] = chunk{} // let the bytes be collected
	pp.queue = pp.queue[1:]
	pp.mu.Unlock()
	poke(pp.space)
}
