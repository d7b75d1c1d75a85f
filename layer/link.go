package layer

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// The link is the writing side of the layer's NATS connection. Every publish, subscribe and
// unsubscribe is queued here and carried out by one goroutine (run), in the order it was queued.
// No caller ever waits on nats.go: nats.go writes while it holds its connection lock, and a write
// past what the layer's socket buffers (socket.go) waits for as long as a stalled socket takes
// to time out.
//
// A publish on a quiet connection skips the queue when nothing can make its write block
// (tryInline): then the caller writes it to the socket itself, as asyncio's transports write at
// once when their buffer is empty, and no goroutine has to wake up for it. That wake-up (the
// writer's, the socket flusher's, nats.go's flusher's) was most of a lone message's time in
// the library.
//
// Publishes are bounded, as asyncio's transports bound their write buffers: a send is accepted
// at once while the queued bytes are under the high-water mark (and nobody waits before it);
// otherwise it waits as an Op until the writer has brought the queue down to the low-water mark,
// or fails after the publish deadline with nothing sent.
//
// A publish handed to nats.go is counted until the server confirms it: a PING written after it
// was answered. Those still unconfirmed when their connection fails, and those still queued when
// the layer closes, are counted as lost and logged: nothing accepted vanishes uncounted.
type link struct {
	l          *Layer
	high       int           // queued bytes from which new publishes wait
	low        int           // queued bytes below which waiting publishes are admitted again
	deadline   time.Duration // how long a publish may wait for room
	wake       chan struct{} // the writer has work, or the connection changed
	confirmNow chan struct{} // half of inlineLimit is unconfirmed: confirm before confirmEvery
	exited     chan struct{} // closed when the writer returns

	mu         sync.Mutex
	queue      []linkItem
	queued     Tally // the publishes in queue and in the writer's hands, not yet handed to nats.go
	waiting    []*waitingPublish
	nc         *nats.Conn
	up         bool   // nc takes publishes; false while nats.go reconnects or after a close for good
	wire       wire   // the socket nc is established on, for tryInline; none while nc is not up
	cur        genKey // the connection that handed and confirmed count for
	handed     Tally  // handed to nats.go, or written to its socket (tryInline), on cur
	confirmed  Tally  // of handed, what a PONG on cur confirmed
	lost       Tally
	accepted   uint64
	timeouts   uint64
	refusing   bool      // Close began: publishes are refused
	stopping   bool      // the writer ends once the queue is written
	abandoned  bool      // the writer ends at once; what it holds was counted as lost
	confirming bool      // a confirmation round trip is in flight
	writing    bool      // the writer holds a batch it has not accounted for yet
	inline     Tally     // being written right now by callers of tryInline
	lastHanded time.Time // when the last publish was handed to nats.go or written (tryInline)
	failures   uint64    // connections that failed (disconnected)
}

// linkItem is one queued write: a publish (msg) or a subscription change (run).
type linkItem struct {
	msg    *nats.Msg
	size   int
	pooled *[]byte // the pool's buffer of msg.Data, given back once written (or given up); nil if none
	run    func(nc *nats.Conn)
}

// release gives a pooled body back once nothing needs it any more.
func (it linkItem) release() {
	if it.pooled != nil {
		releaseBody(it.pooled)
	}
}

// waitingPublish is a publish that found no room.
type waitingPublish struct {
	item  linkItem
	op    *Op
	done  func(error)
	timer *time.Timer
}

// genKey names one socket of nats.go: a Conn and how often it had reconnected.
type genKey struct {
	nc         *nats.Conn
	reconnects uint64
}

const (
	// inlineLimit bounds what the server may not have confirmed yet (a publish written inline
	// included) for tryInline. Those bytes are all that can sit in the socket's buffer, whose
	// writers wait only past socketBufferLimit, and in the kernel's socket buffers, which are
	// larger: a socket write cannot block below it.
	inlineLimit  = 16 << 10
	linkBatch    = 256                    // items the writer takes at once
	busyPause    = 20 * time.Millisecond  // before a retry when nats.go was reconnecting
	downPause    = 250 * time.Millisecond // longest the writer sleeps while the connection is down
	confirmEvery = 100 * time.Millisecond // longest time between two confirmation round trips
	// quietGap: a publish made this long after the one before is written to the socket by its
	// caller. More often, the writer hands them to nats.go and the socket's flusher writes
	// several per wake-up.
	quietGap = 100 * time.Microsecond
)

func newLink(l *Layer) *link {
	high := l.cfg.Connection.PendingSize
	return &link{
		l: l, high: high, low: high / 2, deadline: l.cfg.PublishDeadline,
		wake: make(chan struct{}, 1), confirmNow: make(chan struct{}, 1), exited: make(chan struct{}),
	}
}

func (k *link) start() {
	go k.run()
}

func (k *link) signal() {
	select {
	case k.wake <- struct{}{}:
	default: // a signal is pending: the writer looks at everything when it wakes
	}
}

// generation reads which socket nc is on. It may wait on nats.go: only the link's goroutines
// call it.
func generation(nc *nats.Conn) genKey { return genKey{nc, nc.Stats().Reconnects} }

// publish queues m (size bytes on the wire) or, when there is no room, returns an Op whose done
// is called once it was queued (nil) or with why it never will be. pooled is the buffer of the
// pool that m.Data is in (copyBody), or nil.
func (k *link) publish(m *nats.Msg, size int, pooled *[]byte, done func(error)) (*Op, error) {
	k.mu.Lock()
	if k.refusing {
		k.mu.Unlock()
		return nil, ErrClosed
	}
	it := linkItem{msg: m, size: size, pooled: pooled}
	if len(k.waiting) == 0 && k.fits(size) {
		k.pushLocked(it)
		k.accepted++
		k.mu.Unlock()
		k.signal()
		return nil, nil
	}
	w := &waitingPublish{item: it, done: done}
	w.op = &Op{withdraw: func() { k.forget(w) }}
	w.timer = time.AfterFunc(k.deadline, func() { k.expire(w) })
	k.waiting = append(k.waiting, w)
	k.mu.Unlock()
	return w.op, nil
}

// tryInline writes m (size bytes of payload and headers, wire bytes on the wire) to the socket
// of the established connection on the caller's thread (socket.writePublish), when that cannot
// block: the connection is up and quiet (quietGap), nothing is queued, waiting or in the
// writer's hands (the order of publishes), and what the server has not confirmed stays under
// inlineLimit, m included. m.Data is not kept. It reports whether m was taken: false leaves m to
// publish.
func (k *link) tryInline(m *nats.Msg, size int64, wire int) bool {
	t := Tally{1, uint64(wire)}
	now := time.Now()
	k.mu.Lock()
	unconfirmed := k.handed.minus(k.confirmed)
	if k.refusing || k.stopping || !k.up || k.writing || len(k.queue) > 0 || len(k.waiting) > 0 ||
		unconfirmed.Bytes+k.inline.Bytes+t.Bytes > inlineLimit || now.Sub(k.lastHanded) < quietGap ||
		!k.wire.takes(m, size) {
		k.mu.Unlock()
		return false
	}
	sock, failures := k.wire.sock, k.failures
	k.lastHanded = now
	k.inline.add(t)
	k.mu.Unlock()

	written := sock.writePublish(m)

	k.mu.Lock()
	k.inline = k.inline.minus(t)
	if !written { // the socket had failed: nothing went out, the writer publishes it once nc is back
		k.mu.Unlock()
		return false
	}
	k.accepted++
	// A write that failed closed the socket, and nats.go replaces the connection: m counts as
	// handed on it, lost with whatever else it held unconfirmed. When the connection failed
	// while m was written, that was counted already, and whether m reached the server is
	// unknown: m counts as lost.
	lost := k.failures != failures
	if lost {
		k.lost.add(t)
	} else {
		k.handAddLocked(t)
	}
	k.mu.Unlock()
	if lost {
		k.l.log(LevelWarning, fmt.Sprintf("channels_nats: 1 publish(es) (%d bytes) counted as lost: the connection failed while it was written; it may have reached the server", t.Bytes))
	}
	return true
}

// fits reports whether size more bytes may be queued now. One publish is always taken into an
// empty queue, however large. k.mu must be held.
func (k *link) fits(size int) bool { return k.queued.Bytes == 0 || int(k.queued.Bytes)+size <= k.high }

func (k *link) pushLocked(it linkItem) {
	k.queue = append(k.queue, it)
	if it.msg != nil {
		k.queued.add(Tally{1, uint64(it.size)})
	}
}

// command queues a subscription change, in order with the publishes.
func (k *link) command(run func(nc *nats.Conn)) {
	k.mu.Lock()
	k.pushLocked(linkItem{run: run})
	k.mu.Unlock()
	k.signal()
}

// republish queues messages the layer sends on its own behalf (a released channel's hand-back,
// S6): bounded by mailbox capacities, they never wait for room.
func (k *link) republish(subject string, bodies [][]byte) {
	k.mu.Lock()
	for _, body := range bodies {
		k.pushLocked(linkItem{msg: &nats.Msg{Subject: subject, Data: body}, size: len(subject) + len(body)})
	}
	k.mu.Unlock()
	k.signal()
}

// forget removes a cancelled waiting publish.
func (k *link) forget(w *waitingPublish) {
	w.timer.Stop()
	k.mu.Lock()
	k.unwait(w)
	k.mu.Unlock()
	w.item.release()
}

func (k *link) unwait(w *waitingPublish) {
	for i, x := range k.waiting {
		if x == w {
			k.waiting = append(k.waiting[:i], k.waiting[i+1:]...)
			return
		}
	}
}

// expire fails a publish that waited for the whole publish deadline.
func (k *link) expire(w *waitingPublish) {
	if !w.op.finish() {
		return
	}
	k.mu.Lock()
	k.unwait(w)
	k.timeouts++
	reason := k.stateLocked()
	k.mu.Unlock()
	w.item.release()
	w.done(&PublishTimeoutError{Subject: w.item.msg.Subject, Deadline: k.deadline, Reason: reason})
}

// stateLocked says why the connection takes nothing. k.mu must be held.
func (k *link) stateLocked() string {
	if !k.up {
		return "the connection to NATS is down and being re-established"
	}
	return fmt.Sprintf("%d byte(s) of earlier publishes are still waiting to be written (a slow or stalled link, or a frozen server)", k.queued.Bytes)
}

// admitLocked moves waiting publishes into the queue once it has drained to the low-water mark,
// and returns them: their done is called outside the lock. k.mu must be held.
func (k *link) admitLocked() []*waitingPublish {
	if len(k.waiting) == 0 || int(k.queued.Bytes) > k.low {
		return nil
	}
	var admitted []*waitingPublish
	for len(k.waiting) > 0 && k.fits(k.waiting[0].item.size) {
		w := k.waiting[0]
		k.waiting = k.waiting[1:]
		if w.op.finish() { // else it is being cancelled or expired: it is no longer ours
			k.pushLocked(w.item)
			k.accepted++
			admitted = append(admitted, w)
		}
	}
	return admitted
}

func finishAdmitted(admitted []*waitingPublish) {
	for _, w := range admitted {
		w.timer.Stop()
		w.done(nil)
	}
}

// run is the writer: it takes the queue in batches and carries each item out on the current
// connection, in order.
func (k *link) run() {
	defer close(k.exited)
	go k.confirmLoop()
	pause := time.Duration(0)
	buf := make([]linkItem, 0, linkBatch) // each batch in turn: write gives the items up before the next
	for {
		if pause > 0 {
			select {
			case <-k.wake:
			case <-time.After(pause):
			}
		}
		batch, nc, ok := k.next(buf)
		if !ok {
			return
		}
		if batch == nil {
			pause = downPause
			continue
		}
		pause = 0
		ok = k.write(batch, nc)
		clear(batch) // the buffer no longer holds the bodies
		if !ok {
			pause = busyPause
		}
	}
}

// next returns the next batch, in into's array, and the connection to write it on; a nil batch
// when the connection is down; ok false when the writer must end. It waits for work.
func (k *link) next(into []linkItem) (batch []linkItem, nc *nats.Conn, ok bool) {
	for {
		k.mu.Lock()
		switch {
		case k.abandoned, k.stopping && len(k.queue) == 0:
			k.mu.Unlock()
			return nil, nil, false
		case len(k.queue) > 0 && !k.up:
			k.mu.Unlock()
			return nil, nil, true
		case len(k.queue) > 0:
			n := min(len(k.queue), linkBatch)
			batch = append(into[:0], k.queue[:n]...)
			// The rest moves to the front, so the queue's array serves for good; the tail is
			// cleared, so the queue no longer holds the bodies taken.
			left := copy(k.queue, k.queue[n:])
			clear(k.queue[left:])
			k.queue = k.queue[:left]
			nc = k.nc
			k.writing = true
			k.mu.Unlock()
			return batch, nc, true
		}
		k.mu.Unlock()
		<-k.wake
	}
}

// write carries out batch on nc. It returns false when nats.go could not take a publish (it is
// reconnecting, or the connection was closed for good): that publish and the rest of the batch
// go back to the front of the queue.
func (k *link) write(batch []linkItem, nc *nats.Conn) bool {
	before := generation(nc)
	var handed, refused, done Tally
	var refusal error
	i := 0
	for ; i < len(batch); i++ {
		it := batch[i]
		if it.msg == nil {
			it.run(nc)
			continue
		}
		err := nc.PublishMsg(it.msg)
		if err != nil && connectionBusy(err) {
			break
		}
		it.release() // nats.go copied it into its write buffer, or will never take it
		t := Tally{1, uint64(it.size)}
		done.add(t)
		switch {
		case err == nil:
			handed.add(t)
		case refusedAtOnce(err):
			refused.add(t)
			refusal = err
		default:
			// A write to the socket failed (a stalled link timed out): what nats.go held is gone
			// with this socket. It counts as handed, so it is lost with the others, and the
			// connection is replaced at once.
			handed.add(t)
			_ = nc.ForceReconnect()
		}
	}
	after := before
	if handed.Messages > 0 {
		after = generation(nc)
	}

	k.mu.Lock()
	if k.abandoned { // the drain gave up and counted everything the writer held
		k.mu.Unlock()
		return true
	}
	k.queued = k.queued.minus(done)
	k.writing = false
	k.observeLocked(before)
	if handed.Messages > 0 {
		k.lastHanded = time.Now()
	}
	if after == before {
		k.handed.add(handed)
	} else {
		// nats.go reconnected while this batch was written: which socket took each publish is
		// unknown, so they count as lost with the socket that failed.
		k.handed.add(handed)
		k.observeLocked(after)
	}
	k.lost.add(refused)
	if i < len(batch) {
		k.queue = slices.Insert(k.queue, 0, batch[i:]...) // copied: the writer reuses batch's array
	}
	admitted := k.admitLocked()
	k.mu.Unlock()
	finishAdmitted(admitted)
	if refused.Messages > 0 {
		k.l.log(LevelWarning, fmt.Sprintf("channels_nats: the server refused %d accepted publish(es) (%d bytes): %s; counted as lost",
			refused.Messages, refused.Bytes, k.l.redact.text(refusal.Error())))
	}
	return i == len(batch)
}

// connectionBusy: nats.go took nothing because it has no connection now.
func connectionBusy(err error) bool {
	return errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrConnectionDraining)
}

// refusedAtOnce: nats.go took nothing because this server refuses the message (a server with
// a smaller max_payload after a reconnect).
func refusedAtOnce(err error) bool {
	return errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, nats.ErrBadSubject) || errors.Is(err, nats.ErrHeadersNotSupported)
}

// observeLocked makes g the connection that handed and confirmed count for. When it differs
// from the last one, that one failed: what it had not confirmed is lost. k.mu must be held.
func (k *link) observeLocked(g genKey) {
	if g == k.cur {
		return
	}
	k.loseUnconfirmedLocked("the connection it was written on failed")
	k.cur = g
}

// loseUnconfirmedLocked counts what the current connection had not confirmed as lost and logs
// it. k.mu must be held.
func (k *link) loseUnconfirmedLocked(why string) {
	gone := k.handed.minus(k.confirmed)
	k.handed, k.confirmed = Tally{}, Tally{}
	if gone.Messages == 0 {
		return
	}
	k.lost.add(gone)
	k.l.log(LevelWarning, fmt.Sprintf("channels_nats: %d publish(es) (%d bytes) were not confirmed by the server and are "+
		"counted as lost (%s; some may have reached it just before)", gone.Messages, gone.Bytes, why))
}

// handAddLocked counts t as handed to nats.go on the current connection. Once half of
// inlineLimit is unconfirmed it asks for a confirmation at once, so that a steady trickle of
// publishes (a ping-pong) stays under inlineLimit and keeps skipping the queue. k.mu must be
// held.
func (k *link) handAddLocked(t Tally) {
	k.handed.add(t)
	if !k.confirming && k.handed.minus(k.confirmed).Bytes > inlineLimit/2 {
		select {
		case k.confirmNow <- struct{}{}:
		default: // asked already
		}
	}
}

// confirmLoop asks the server, every confirmEvery or sooner when handAddLocked asks, to confirm
// what was handed: a PING after the publishes, answered by a PONG, proves the server read them
// all.
func (k *link) confirmLoop() {
	for {
		select {
		case <-k.exited:
			return
		case <-time.After(confirmEvery):
		case <-k.confirmNow:
		}
		k.mu.Lock()
		idle := k.handed == k.confirmed || !k.up || k.confirming || k.stopping
		nc := k.nc
		k.mu.Unlock()
		if !idle {
			k.confirm(nc, k.l.cfg.Connection.FlushTimeout)
		}
	}
}

// confirm makes one round trip on nc and, when it succeeds on the same socket, marks what was
// handed before it as confirmed. It reports whether everything handed is confirmed.
func (k *link) confirm(nc *nats.Conn, timeout time.Duration) bool {
	g := generation(nc)
	k.mu.Lock()
	k.observeLocked(g)
	mark := k.handed
	k.confirming = true
	k.mu.Unlock()
	err := nc.FlushTimeout(timeout)
	ok := err == nil && generation(nc) == g
	k.mu.Lock()
	defer k.mu.Unlock()
	k.confirming = false
	if ok && k.cur == g {
		k.confirmed = mark
	}
	return ok && k.handed == k.confirmed
}

// connected records that nc (re)connected: publishes flow again.
func (k *link) connected(nc *nats.Conn) {
	w := k.l.dialer.established(nc)
	k.mu.Lock()
	if nc == k.nc {
		k.up, k.wire = true, w
	}
	k.mu.Unlock()
	k.signal()
}

// dialing records that nats.go is opening a socket (a reconnect, or another server of the
// list): it holds its connection lock meanwhile, through the handshake, so no caller may publish
// inline until the connection is up again. The disconnect callback says so too, but later.
func (k *link) dialing() {
	k.mu.Lock()
	k.up, k.wire = false, wire{}
	k.mu.Unlock()
}

// disconnected records that nc lost its socket: what it had not confirmed is lost.
func (k *link) disconnected(nc *nats.Conn) {
	k.mu.Lock()
	if nc == k.nc {
		k.up, k.wire = false, wire{}
		k.failures++
		if !k.abandoned {
			k.loseUnconfirmedLocked("the connection failed before the server confirmed them")
		}
	}
	k.mu.Unlock()
}

// install makes nc the connection to write on (the first one, or one that replaces a connection
// closed for good).
func (k *link) install(nc *nats.Conn) {
	w := k.l.dialer.established(nc)
	k.mu.Lock()
	k.nc, k.up, k.cur, k.wire = nc, true, genKey{nc: nc}, w
	k.handed, k.confirmed = Tally{}, Tally{}
	k.mu.Unlock()
	k.signal()
}

// conn is the connection the writer uses.
func (k *link) conn() *nats.Conn {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.nc
}

// refuse ends admission (Close): waiting publishes end with ErrClosed, new ones are refused.
func (k *link) refuse() {
	k.mu.Lock()
	k.refusing = true
	waiting := k.waiting
	k.waiting = nil
	k.mu.Unlock()
	for _, w := range waiting {
		if w.op.finish() {
			w.timer.Stop()
			w.item.release()
			w.done(ErrClosed)
		}
	}
}

// drain writes what is queued and has the server confirm it, within timeout, then closes the
// connection. What did not make it is counted and logged.
func (k *link) drain(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	k.mu.Lock()
	k.stopping = true
	nc := k.nc
	k.mu.Unlock()
	k.signal()

	written := false
	select {
	case <-k.exited:
		written = true
	case <-time.After(time.Until(deadline)):
	}
	confirmed := false
	if left := time.Until(deadline); written && left > 0 {
		confirmed = k.confirm(nc, left)
	}

	k.mu.Lock()
	k.abandoned = true
	unsent, unconfirmed := k.queued, Tally{}
	if !confirmed {
		unconfirmed = k.handed.minus(k.confirmed)
	}
	k.lost.add(unsent)
	k.lost.add(unconfirmed)
	k.handed, k.confirmed, k.queued, k.queue = Tally{}, Tally{}, Tally{}, nil
	k.mu.Unlock()

	if !written {
		k.l.dialer.cutAll() // the writer is stuck in a socket write: end it
	}
	nc.Close()
	<-k.exited
	if gone := unsent.Messages + unconfirmed.Messages; gone > 0 {
		k.l.log(LevelWarning, fmt.Sprintf("channels_nats: closed with %d publish(es) (%d bytes) that did not reach the server "+
			"within drain_timeout (%s): %d still queued, %d written but not confirmed by the server; counted as lost",
			gone, unsent.Bytes+unconfirmed.Bytes, timeout, unsent.Messages, unconfirmed.Messages))
	}
}

// stats fills the link's part of s.
func (k *link) stats(s *Stats) {
	k.mu.Lock()
	defer k.mu.Unlock()
	s.Published, s.Lost, s.PublishTimeouts = k.accepted, k.lost, k.timeouts
	s.Outbound.Bytes, s.Outbound.Waiting = int(k.queued.Bytes), len(k.waiting)
}
