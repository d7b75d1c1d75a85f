package layer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// Version is the version of this library, reported by the C ABI too.
const Version = "1.0.0"

// Errors returned by the Layer. Errors about names are *NameError, about bodies *FrameError.
var (
	// ErrClosed ends every call made after Close, and every operation that was pending when
	// Close ran.
	ErrClosed = errors.New("channels_nats: the layer is closed")
	// ErrMessageTooLarge is matched (errors.Is) by a *MessageTooLargeError.
	ErrMessageTooLarge = errors.New("channels_nats: message too large")
	// ErrForeignChannel is matched (errors.Is) by a *ForeignChannelError.
	ErrForeignChannel = errors.New("channels_nats: process channel of another client")
	// ErrPublishTimeout is matched (errors.Is) by a *PublishTimeoutError.
	ErrPublishTimeout = errors.New("channels_nats: publish timed out")
	// ErrNotAgain is returned by ReceiveAgain when the Receipt cannot wait again: its receive
	// did not end with a message, or its mailbox was reclaimed or flushed since. A receive by
	// name (StartReceiveInto) starts over.
	ErrNotAgain = errors.New("channels_nats: this receive cannot start again; receive by channel name")
	// ErrNoReadEvents is returned by ReadEvents where the host cannot read the connection: not
	// on Linux, over TLS or websockets, or with Config.NoHostReads. The layer reads it itself there.
	ErrNoReadEvents = errors.New("channels_nats: the host cannot read this connection " +
		"(read events need Linux, a connection without TLS or websockets, and host_reads not false); " +
		"the library reads it itself")
)

// MessageTooLargeError reports a message whose body and headers exceed the server's max_payload
// (S7). Nothing was sent and the connection stays up.
type MessageTooLargeError struct {
	Size, MaxPayload int64
}

// Error gives both sizes and the two ways out.
func (e *MessageTooLargeError) Error() string {
	return fmt.Sprintf("message is %d bytes on the wire, over the server's max_payload of %d; "+
		"raise max_payload on nats-server or send less", e.Size, e.MaxPayload)
}

// Is makes errors.Is(err, ErrMessageTooLarge) true.
func (e *MessageTooLargeError) Is(target error) bool { return target == ErrMessageTooLarge }

// ForeignChannelError reports a receive or group_add on a process channel that another client
// (another Layer, usually another process) handed out (S12). Sending to it is fine.
type ForeignChannelError struct {
	Channel string
}

// Error names the channel and why it cannot be received here.
func (e *ForeignChannelError) Error() string {
	return e.Channel + " belongs to another client; only the layer whose new_channel() made a process channel can receive on it"
}

// Is makes errors.Is(err, ErrForeignChannel) true.
func (e *ForeignChannelError) Is(target error) bool { return target == ErrForeignChannel }

// PublishTimeoutError reports a send that waited PublishDeadline for room in the outbound
// buffer: the connection took nothing for that long (a frozen server, a stalled link, an
// outage). Nothing of the message was sent.
type PublishTimeoutError struct {
	Subject  string
	Deadline time.Duration
	Reason   string // why the connection took nothing
}

// Error names the subject, the deadline and the state of the connection.
func (e *PublishTimeoutError) Error() string {
	return fmt.Sprintf("channels_nats: could not publish on %s within publish_deadline (%s): %s; nothing was sent",
		e.Subject, e.Deadline, e.Reason)
}

// Is makes errors.Is(err, ErrPublishTimeout) true.
func (e *PublishTimeoutError) Is(target error) bool { return target == ErrPublishTimeout }

// Layer is a channel layer client: one NATS connection, its mailboxes, groups and subscriptions.
// Close ends it for good; open a new one with Connect.
type Layer struct {
	cfg      Config
	subj     subjects
	clientID string  // 12 lowercase hex, the id in every name NewChannel returns
	log      LogFunc // cfg.Log behind the redactor
	redact   *redactor
	drops    *dropReporter
	counters counters
	targets  *sendTargets       // the subject and header of the channels sent to lately
	link     *link              // every write to the connection goes through it
	dialer   *dialer            // the sockets of this layer's connections, to cut a stuck one at close
	ctx      context.Context    // ends when Close begins: every pending operation's wait derives from it
	stop     context.CancelFunc // ends ctx

	inbox chan *nats.Msg // every subscription delivers here, in arrival order (see dispatch.go)
	wake  chan struct{}  // asks housekeeping to look at slow-consumer drops now
	kick  chan struct{}  // asks the dispatcher to deliver handoffs queued outside it, or to route

	// routing is held while a message is taken from the inbox and routed, and while handoffs
	// are delivered: one goroutine at a time, in order (dispatch.go).
	routing          sync.Mutex
	dispatcherRoutes atomic.Bool    // set under routing: the dispatcher routes the inbox until it is empty
	held             *nats.Msg      // guarded by routing: handed over unrouted, before the inbox's
	done             chan struct{}  // closed by Close once no operation can start: stops the goroutines below
	routines         sync.WaitGroup // dispatcher, housekeeping, recovery
	ops              sync.WaitGroup // goroutines of pending operations

	connected  atomic.Bool  // the connection is up (kept by nats.go's handlers; reading nc would lock it)
	maxPayload atomic.Int64 // the server's max_payload, read when a connection is made
	server     atomic.Pointer[ServerInfo]

	mu            sync.Mutex
	closed        bool
	attempt       *reconnectAttempt
	recovering    bool // a background recovery loop runs
	mailboxes     map[string]*mailbox
	groups        map[string]*groupMembers
	subs          map[subKey]*subscription
	subsChanged   chan struct{} // closed and replaced whenever a subscription is made or fails
	handoffs      handoffs
	fanOutRest    *fanOutOf // guarded by routing: a group message the host's routing left to the dispatcher
	betweenChunks func()    // tests: runs while fanOut has let go of the layer lock
}

// counters are the Stats counters that are updated without the layer lock. A counter whose event
// is also logged is raised after the warning is written, so that whoever sees the count can read
// the warning too.
type counters struct {
	framed                                atomic.Uint64 // messages framed from the layer's sockets (inbound.go)
	delivered                             atomic.Uint64
	capacity, expired, slowConsumer       atomic.Uint64
	badFrame, noMailbox, handedBack       atomic.Uint64
	reconnects, recoveries, groupsExpired atomic.Uint64
}

// Stats are the layer's counters (S20). Counts are since Connect.
type Stats struct {
	ClientID  string `json:"client_id"`
	Published uint64 `json:"published"` // messages accepted by Send and GroupSend
	Delivered uint64 `json:"delivered"` // messages returned by receives
	Dropped   struct {
		Capacity     uint64 `json:"capacity"`      // a full mailbox refused them (S2)
		Expired      uint64 `json:"expired"`       // they waited longer than Expiry (S4)
		SlowConsumer uint64 `json:"slow_consumer"` // the connection dropped them before they were routed (S3)
		BadFrame     uint64 `json:"bad_frame"`     // not a Channels message (S8)
		NoMailbox    uint64 `json:"no_mailbox"`    // no mailbox here for their process channel
	} `json:"dropped"`
	// Lost counts publishes that were accepted and did not reach the server: unconfirmed when
	// their connection failed, refused by a new server, or still queued when the layer closed.
	Lost            Tally  `json:"lost"`
	PublishTimeouts uint64 `json:"publish_timeouts"` // sends that failed after PublishDeadline (not lost: the caller was told)
	Outbound        struct {
		Bytes   int `json:"bytes"`   // bytes of accepted publishes not handed to the connection yet
		Waiting int `json:"waiting"` // sends waiting for room
	} `json:"outbound"`
	HandedBack    uint64     `json:"handed_back"`    // re-published when a plain channel was released (S6)
	Reconnects    uint64     `json:"reconnects"`     // reconnects made by nats.go
	Recoveries    uint64     `json:"recoveries"`     // new connections after a close for good (S17)
	GroupsExpired uint64     `json:"groups_expired"` // memberships ended by GroupExpiry (S18)
	Subscriptions int        `json:"subscriptions"`
	Mailboxes     int        `json:"mailboxes"`
	Groups        int        `json:"groups"`
	Connected     bool       `json:"connected"`
	Server        ServerInfo `json:"server"` // the server of the last connection made
	// HostReads: the host's OnReadable calls that read the connection, and the times the layer
	// read it because the host had not for hostReadCheck (ReadEvents).
	HostReads struct {
		Reads     uint64 `json:"reads"`
		Takeovers uint64 `json:"takeovers"`
	} `json:"host_reads"`
}

// ServerInfo describes the server a layer is (or was last) connected to, as that server announced
// itself. URLs carry no credentials.
type ServerInfo struct {
	URL        string   `json:"url"`
	Name       string   `json:"name"`
	Version    string   `json:"version"`
	Cluster    string   `json:"cluster"`     // "" when the server is not in a cluster
	MaxPayload int64    `json:"max_payload"` // bytes
	Peers      []string `json:"peers"`       // other servers of the cluster it told the client about
}

// Tally is a count of messages and their bytes.
type Tally struct {
	Messages uint64 `json:"messages"`
	Bytes    uint64 `json:"bytes"`
}

func (t *Tally) add(o Tally) { t.Messages, t.Bytes = t.Messages+o.Messages, t.Bytes+o.Bytes }

func (t Tally) minus(o Tally) Tally { return Tally{t.Messages - o.Messages, t.Bytes - o.Bytes} }

// Connect opens a Layer: it connects to NATS, retrying within ConnectDeadline, and starts its
// goroutines. ctx bounds the connect too.
func Connect(ctx context.Context, cfg Config) (*Layer, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	l := &Layer{
		cfg:         cfg,
		subj:        subjects{cfg.Prefix},
		targets:     newSendTargets(subjects{cfg.Prefix}),
		clientID:    randomHex(6),
		redact:      newRedactor(&cfg),
		dialer:      newDialer(cfg.Connection.ConnectTimeout, socketWriteTimeout(cfg.Connection)),
		inbox:       make(chan *nats.Msg, cfg.Connection.PendingMsgsLimit),
		wake:        make(chan struct{}, 1),
		done:        make(chan struct{}),
		kick:        make(chan struct{}, 1),
		mailboxes:   map[string]*mailbox{},
		groups:      map[string]*groupMembers{},
		subs:        map[subKey]*subscription{},
		subsChanged: make(chan struct{}),
	}
	l.log = func(level Level, message string) { cfg.Log(level, l.redact.text(message)) }
	l.drops = newDropReporter(l.log)
	l.ctx, l.stop = context.WithCancel(context.Background())
	l.link = newLink(l)
	l.dialer.dialing = l.link.dialing
	l.dialer.reading = l.routeArrived
	l.dialer.arrive = l.arrive
	l.dialer.routeOnHost = l.routeArrivedOnHost
	l.dialer.frames = framingSupported && !cfg.Connection.usesTLS() && plainServers(cfg.Servers)
	nc, err := l.connectFirst(ctx)
	if err != nil {
		l.stop()
		return nil, err
	}
	l.installConnection(nc)
	l.routines.Add(2)
	go l.dispatch()
	go l.housekeep()
	l.link.start()
	return l, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b)
}

// ClientID is the 12-hex id that identifies this client in the names NewChannel returns.
func (l *Layer) ClientID() string { return l.clientID }

// Prefix is the subject prefix in use.
func (l *Layer) Prefix() string { return l.cfg.Prefix }

// owns reports whether process channel name was handed out by this client: the last token before
// "!" is its client id.
func (l *Layer) owns(name string) bool {
	nonLocal, _, _ := strings.Cut(name, "!")
	return nonLocal == l.clientID || strings.HasSuffix(nonLocal, "."+l.clientID)
}

// spawn runs f for a pending operation on a goroutine that Close waits for.
func (l *Layer) spawn(f func()) {
	l.ops.Add(1)
	go func() {
		defer l.ops.Done()
		f()
	}()
}

// Close ends the layer (S16): pending operations end with ErrClosed, publishes still queued are
// written within the drain timeout, and the connection is closed. It never fails; what could
// not be sent is counted and logged. After Close returns, no callback of this layer runs. It
// must not be called from a callback of this layer.
func (l *Layer) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	var ended []*waiter
	for _, mb := range l.mailboxes {
		ended = append(ended, mb.endWaiters()...)
		mb.discharged = true
	}
	l.mailboxes, l.groups = map[string]*mailbox{}, map[string]*groupMembers{}
	l.mu.Unlock()

	l.stop()
	l.link.refuse() // sends waiting for room end with ErrClosed; the queue is still written
	l.ops.Wait()    // pending subscriptions and receives have ended
	close(l.done)
	l.routines.Wait() // the dispatcher has delivered its last message
	l.routing.Lock()  // and so has a reader or host thread that was routing
	l.routing.Unlock()
	for _, w := range ended {
		w.endParked()
		if w.op.finish() {
			w.to.Received(Message{}, ErrClosed)
		}
	}
	l.link.drain(l.cfg.Connection.DrainTimeout)
	l.dialer.events.close()
	return nil
}

// ReadEvents returns a descriptor that is readable while the layer's connection has bytes to
// read, the same across reconnects (an epoll descriptor, on Linux), and makes the host the
// reader of the connection: it watches the descriptor in its event loop and calls OnReadable
// whenever it is readable, and the connection is read, and its messages routed, on its thread
// (reading.go). A host that does not (or no longer does) is taken over: the layer reads again
// when bytes wait hostReadCheck without a call, until the next one. The layer owns the
// descriptor and closes it in Close; a host that may watch it longer watches a duplicate.
// ErrNoReadEvents: the layer reads the connection itself.
func (l *Layer) ReadEvents() (int, error) {
	if !l.dialer.frames || l.cfg.NoHostReads {
		return -1, ErrNoReadEvents
	}
	fd, err := l.dialer.events.descriptor(l.dialer.latest.Load())
	if err == nil {
		l.dialer.host.attached.Store(true)
	}
	return fd, err
}

// OnReadable reads what the connection has, within a bound (what is left keeps ReadEvents
// readable), and routes its messages: their receives are delivered before it returns, unless
// another thread routes meanwhile. It never waits for the network.
func (l *Layer) OnReadable() {
	h := &l.dialer.host
	h.called()
	if s := l.dialer.latest.Load(); s != nil && s.onReadable() {
		h.reads.Add(1)
	}
}

// arrive takes a message framed from a socket (inbound.go) into the inbox, as nats.go's
// subscriptions do, or drops and counts it when the inbox is full (S3).
func (l *Layer) arrive(m *nats.Msg) {
	l.counters.framed.Add(1)
	select {
	case l.inbox <- m:
	default:
		l.countSlowConsumer(m.Subject, 1)
	}
}

// Flush resets this client's state (S15): mailboxes, memberships and subscriptions. Receives
// that are waiting keep waiting on emptied mailboxes, with the subscriptions they need. It does
// not wait on the network and does not fail on a dead connection.
func (l *Layer) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	kept := map[string]*mailbox{}
	keptProcesses := map[string]bool{}
	for name, mb := range l.mailboxes {
		clear(mb.entries)
		mb.entries, mb.groups, mb.dropping = nil, 0, false
		l.drops.forget("capacity", name)
		mb.settleParked()
		if len(mb.waiters) == 0 && mb.subscribing == 0 {
			mb.discharged = true
			continue
		}
		kept[name] = mb
		if nonLocal, _, ok := strings.Cut(name, "!"); ok {
			keptProcesses[nonLocal] = true
		}
	}
	l.mailboxes, l.groups = kept, map[string]*groupMembers{}
	for k := range l.subs {
		needed := k.kind == subProcess && keptProcesses[k.name] || k.kind == subChannel && kept[k.name] != nil
		if !needed {
			l.drop(k)
		}
	}
	return nil
}

// Stats returns the counters (S20).
func (l *Layer) Stats() Stats {
	l.pollSlowConsumers()
	var s Stats
	c := &l.counters
	s.ClientID = l.clientID
	s.Delivered = c.delivered.Load()
	s.Dropped.Capacity, s.Dropped.Expired = c.capacity.Load(), c.expired.Load()
	s.Dropped.SlowConsumer, s.Dropped.BadFrame = c.slowConsumer.Load(), c.badFrame.Load()
	s.Dropped.NoMailbox, s.HandedBack = c.noMailbox.Load(), c.handedBack.Load()
	s.Reconnects, s.Recoveries, s.GroupsExpired = c.reconnects.Load(), c.recoveries.Load(), c.groupsExpired.Load()
	l.link.stats(&s)
	s.HostReads.Reads, s.HostReads.Takeovers = l.dialer.host.reads.Load(), l.dialer.host.takeovers.Load()
	l.mu.Lock()
	s.Subscriptions, s.Mailboxes, s.Groups = len(l.subs), len(l.mailboxes), len(l.groups)
	s.Connected = !l.closed && l.connected.Load()
	l.mu.Unlock()
	if info := l.server.Load(); info != nil {
		s.Server = *info
	}
	return s
}
