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
const Version = "0.1.0"

// Errors returned by the Layer. Errors about names are *NameError, about bodies *FrameError.
var (
	// ErrClosed ends every call made after Close, and every receive that was waiting when Close ran.
	ErrClosed = errors.New("channels_nats: the layer is closed")
	// ErrMessageTooLarge is matched (errors.Is) by a *MessageTooLargeError.
	ErrMessageTooLarge = errors.New("channels_nats: message too large")
	// ErrForeignChannel is matched (errors.Is) by a *ForeignChannelError.
	ErrForeignChannel = errors.New("channels_nats: process channel of another client")
	// ErrWouldBlock is returned instead of waiting on the network when the context came from NoWait.
	ErrWouldBlock = errors.New("channels_nats: the operation would block")
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

type noWaitKey struct{}

// NoWait returns a context under which calls that would wait on the network (a subscription
// confirmation, a reconnect) return ErrWouldBlock at once instead, having changed nothing. Hosts
// use it to finish an operation on the calling thread when it can be finished without waiting,
// and to start it on another thread otherwise.
func NoWait(ctx context.Context) context.Context { return context.WithValue(ctx, noWaitKey{}, true) }

func mustNotWait(ctx context.Context) bool { return ctx.Value(noWaitKey{}) != nil }

// Layer is a channel layer client: one NATS connection, its mailboxes, groups and subscriptions.
// Close ends it for good; open a new one with Connect.
type Layer struct {
	cfg      Config
	subj     subjects
	clientID string // 12 lowercase hex, the id in every name NewChannel returns
	log      LogFunc
	drops    *dropReporter
	counters counters

	inbox    chan *nats.Msg // every subscription delivers here, so one dispatcher sees arrival order
	wake     chan struct{}  // asks housekeeping to look at slow-consumer drops now
	kick     chan struct{}  // asks the dispatcher to deliver handoffs that PutBack queued
	done     chan struct{}  // closed by Close: stops the goroutines below
	routines sync.WaitGroup // dispatcher, housekeeping, recovery

	mu         sync.Mutex
	closed     bool
	nc         *nats.Conn
	ncClosed   chan struct{} // closed when nc is closed for good
	attempt    *reconnectAttempt
	recovering bool // a background recovery loop runs
	mailboxes  map[string]*mailbox
	groups     map[string]*groupMembers
	subs       map[subKey]*subscription
	handoffs   handoffs
}

// counters are the Stats counters that are updated without the layer lock.
type counters struct {
	published, delivered                  atomic.Uint64
	capacity, expired, slowConsumer       atomic.Uint64
	badFrame, noMailbox, handedBack       atomic.Uint64
	reconnects, recoveries, groupsExpired atomic.Uint64
}

// Stats are the layer's counters (S20). Counts are since Connect.
type Stats struct {
	ClientID  string `json:"client_id"`
	Published uint64 `json:"published"` // messages published by Send and GroupSend
	Delivered uint64 `json:"delivered"` // messages returned by receives
	Dropped   struct {
		Capacity     uint64 `json:"capacity"`      // a full mailbox refused them (S2)
		Expired      uint64 `json:"expired"`       // they waited longer than Expiry (S4)
		SlowConsumer uint64 `json:"slow_consumer"` // the connection dropped them before the dispatcher (S3)
		BadFrame     uint64 `json:"bad_frame"`     // not a Channels message (S8)
		NoMailbox    uint64 `json:"no_mailbox"`    // no mailbox here for their process channel
	} `json:"dropped"`
	HandedBack    uint64 `json:"handed_back"`    // re-published when a plain channel was released (S6)
	Reconnects    uint64 `json:"reconnects"`     // reconnects made by nats.go
	Recoveries    uint64 `json:"recoveries"`     // new connections after a close for good (S17)
	GroupsExpired uint64 `json:"groups_expired"` // memberships ended by GroupExpiry (S18)
	Subscriptions int    `json:"subscriptions"`
	Mailboxes     int    `json:"mailboxes"`
	Groups        int    `json:"groups"`
	Connected     bool   `json:"connected"`
}

// Connect opens a Layer: it connects to NATS and starts the dispatcher. ctx bounds the connect.
func Connect(ctx context.Context, cfg Config) (*Layer, error) {
	cfg, err := cfg.WithDefaults()
	if err != nil {
		return nil, err
	}
	l := &Layer{
		cfg:       cfg,
		subj:      subjects{cfg.Prefix},
		clientID:  randomHex(6),
		log:       cfg.Log,
		drops:     newDropReporter(cfg.Log),
		inbox:     make(chan *nats.Msg, cfg.Connection.PendingMsgsLimit),
		wake:      make(chan struct{}, 1),
		done:      make(chan struct{}),
		kick:      make(chan struct{}, 1),
		mailboxes: map[string]*mailbox{},
		groups:    map[string]*groupMembers{},
		subs:      map[subKey]*subscription{},
	}
	nc, closedCh, err := l.dial(ctx)
	if err != nil {
		return nil, err
	}
	l.nc, l.ncClosed = nc, closedCh
	l.routines.Add(2)
	go l.dispatch()
	go l.housekeep()
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

// Expiry is how long a message may wait in a mailbox (S4).
func (l *Layer) Expiry() time.Duration { return l.cfg.Expiry }

// owns reports whether process channel name was handed out by this client: the last token before
// "!" is its client id.
func (l *Layer) owns(name string) bool {
	nonLocal, _, _ := strings.Cut(name, "!")
	return nonLocal == l.clientID || strings.HasSuffix(nonLocal, "."+l.clientID)
}

// Close ends the layer (S16): waiting receives end with ErrClosed, publishes still buffered are
// drained within the drain timeout, and the connection is closed. It never fails; what could not
// be sent is logged. After Close returns, no callback of this layer runs. It must not be called
// from a receive callback.
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
	nc, ncClosed := l.nc, l.ncClosed
	l.mu.Unlock()

	close(l.done)
	l.routines.Wait() // the dispatcher has delivered its last message
	for _, w := range ended {
		w.deliver(Message{}, ErrClosed)
	}
	if nc != nil {
		l.drain(nc, ncClosed)
	}
	return nil
}

// drain lets buffered publishes go out, bounded by the drain timeout, then closes nc. What could
// not go out is logged.
func (l *Layer) drain(nc *nats.Conn, closed <-chan struct{}) {
	timeout := l.cfg.Connection.DrainTimeout
	// Measured first: a drain that fails (while reconnecting, say) closes the connection itself.
	pending := 0
	if n, err := nc.Buffered(); err == nil {
		pending = n
	}
	err := nc.Drain()
	if err == nil {
		select {
		case <-closed:
			return
		case <-time.After(timeout + 250*time.Millisecond):
			err = fmt.Errorf("not drained within %s", timeout)
		}
	}
	if n, bufErr := nc.Buffered(); bufErr == nil {
		pending = n
	}
	nc.Close()
	if errors.Is(err, nats.ErrConnectionClosed) && pending == 0 {
		return // closed for good earlier: nothing was waiting to go out
	}
	l.log(LevelWarning, fmt.Sprintf("channels_nats: could not drain the connection on close (%s); "+
		"closed it instead, %d byte(s) of publishes did not go out", redact(err.Error()), pending))
}

// Stats returns the counters (S20).
func (l *Layer) Stats() Stats {
	l.pollSlowConsumers()
	var s Stats
	c := &l.counters
	s.ClientID = l.clientID
	s.Published, s.Delivered = c.published.Load(), c.delivered.Load()
	s.Dropped.Capacity, s.Dropped.Expired = c.capacity.Load(), c.expired.Load()
	s.Dropped.SlowConsumer, s.Dropped.BadFrame = c.slowConsumer.Load(), c.badFrame.Load()
	s.Dropped.NoMailbox, s.HandedBack = c.noMailbox.Load(), c.handedBack.Load()
	s.Reconnects, s.Recoveries, s.GroupsExpired = c.reconnects.Load(), c.recoveries.Load(), c.groupsExpired.Load()
	l.mu.Lock()
	s.Subscriptions, s.Mailboxes, s.Groups = len(l.subs), len(l.mailboxes), len(l.groups)
	s.Connected = !l.closed && l.nc != nil && l.nc.IsConnected()
	l.mu.Unlock()
	return s
}
