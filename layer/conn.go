package layer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// connectFirst opens the first connection, trying again while the servers cannot be reached
// until ConnectDeadline (retries included) or ctx ends. Refusals that another try would not
// change (bad credentials, TLS, a bad option) end it at once.
func (l *Layer) connectFirst(ctx context.Context) (*nats.Conn, error) {
	deadline := time.Now().Add(l.cfg.ConnectDeadline)
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	pause := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		nc, err := l.dial(ctx)
		if err == nil {
			return nc, nil
		}
		if !retryableConnect(err) {
			return nil, l.connectError(err)
		}
		if time.Until(deadline) <= pause || ctx.Err() != nil {
			if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("%w (connect_deadline %s, %d attempt(s))", l.connectError(err), l.cfg.ConnectDeadline, attempt)
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
		}
		pause = min(pause*2, l.cfg.Connection.ReconnectWait)
	}
}

func (l *Layer) connectError(err error) error {
	return fmt.Errorf("channels_nats: cannot connect to %s: %w", l.redact.text(strings.Join(l.cfg.Servers, ", ")), l.redact.err(err))
}

// retryableConnect: the server could not be reached or did not answer, which may change. A TLS
// refusal (a certificate required or not trusted) arrives as a network error too, but another
// try would meet the same refusal.
func retryableConnect(err error) bool {
	var netErr *net.OpError
	var alert tls.AlertError
	var certErr *tls.CertificateVerificationError
	if errors.As(err, &alert) || errors.As(err, &certErr) || strings.Contains(err.Error(), "tls") ||
		strings.Contains(err.Error(), "x509") {
		return false
	}
	return errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, io.EOF) ||
		errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &netErr)
}

// dial opens a NATS connection with the configured options, within ctx.
func (l *Layer) dial(ctx context.Context) (*nats.Conn, error) {
	opts, err := l.natsOptions()
	if err != nil {
		return nil, err
	}
	type result struct {
		nc  *nats.Conn
		err error
	}
	got := make(chan result, 1)
	go func() {
		nc, err := nats.Connect(strings.Join(l.cfg.Servers, ","), opts...)
		got <- result{nc, err}
	}()
	select {
	case r := <-got:
		if r.err == nil && ctx.Err() != nil { // both were ready: the ctx wins
			r.nc.Close()
			return nil, ctx.Err()
		}
		return r.nc, r.err
	case <-ctx.Done():
		go func() { // the connect is bounded by connect_timeout; do not leak its socket
			if r := <-got; r.nc != nil {
				r.nc.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

func (l *Layer) natsOptions() ([]nats.Option, error) {
	o := l.cfg.Connection
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.SetCustomDialer(l.dialer),
		nats.ReconnectWait(o.ReconnectWait),
		// The link buffers publishes across outages itself, bounded, and counts what it loses:
		// nats.go must refuse them while it reconnects instead of keeping them.
		nats.ReconnectBufSize(-1),
		nats.Timeout(o.ConnectTimeout),
		nats.PingInterval(o.PingInterval),
		nats.MaxPingsOutstanding(o.MaxPingsOutstanding),
		// nats.go passes every write to the layer's socket at once, which buffers it (socket.go).
		nats.WriteBufferSize(writeBufferSize),
		nats.ClosedHandler(l.connectionClosed),
		nats.ErrorHandler(l.asyncError),
		nats.DisconnectErrHandler(l.disconnected),
		nats.ReconnectHandler(l.reconnected),
		nats.DiscoveredServersHandler(l.learnServer),
	}
	switch o.MaxReconnects {
	case NoReconnect:
		opts = append(opts, nats.NoReconnect())
	default:
		opts = append(opts, nats.MaxReconnects(o.MaxReconnects))
	}
	if o.NoRandomize {
		opts = append(opts, nats.DontRandomize())
	}
	if o.Token != "" {
		opts = append(opts, nats.Token(o.Token))
	}
	if o.User != "" || o.Password != "" {
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	}
	if o.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(o.CredsFile))
	}
	if o.NkeySeedFile != "" {
		opt, err := nats.NkeyOptionFromSeed(o.NkeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("channels_nats: nkey_seed: %w", err)
		}
		opts = append(opts, opt)
	}
	if o.TLSCAFile != "" {
		opts = append(opts, nats.RootCAs(o.TLSCAFile))
	}
	if o.TLSCertFile != "" {
		opts = append(opts, nats.ClientCert(o.TLSCertFile, o.TLSKeyFile))
	}
	if o.TLSFirst {
		opts = append(opts, nats.TLSHandshakeFirst())
	}
	return opts, nil
}

// installConnection makes nc the layer's connection (the first, or a replacement).
func (l *Layer) installConnection(nc *nats.Conn) {
	l.learnServer(nc)
	l.connected.Store(true)
	l.link.install(nc)
	l.subscriptionsChanged()
}

func (l *Layer) disconnected(nc *nats.Conn, err error) {
	l.connected.Store(false)
	l.link.disconnected(nc)
	l.handOverInbox()
	if err != nil && !nc.IsClosed() {
		l.log(LevelWarning, fmt.Sprintf("channels_nats: disconnected from NATS (%s); reconnecting", l.redact.text(err.Error())))
	}
}

func (l *Layer) reconnected(nc *nats.Conn) {
	l.counters.reconnects.Add(1)
	l.learnServer(nc)
	l.connected.Store(true)
	l.link.connected(nc)
	l.mu.Lock()
	n := len(l.subs)
	l.mu.Unlock()
	l.log(LevelWarning, fmt.Sprintf("channels_nats: reconnected to %s; %d subscription(s) restored", l.redact.text(nc.ConnectedUrlRedacted()), n))
}

// learnServer keeps what the server of nc announced, so that Stats and publishes never read nc
// (its lock may be held by a write to a stalled socket). It runs on nats.go's handler goroutine or
// the one that made the connection.
func (l *Layer) learnServer(nc *nats.Conn) {
	peers := []string{}
	for _, peer := range nc.DiscoveredServers() {
		peers = append(peers, l.redact.text(peer))
	}
	l.maxPayload.Store(nc.MaxPayload())
	l.server.Store(&ServerInfo{
		URL: l.redact.text(nc.ConnectedUrlRedacted()), Name: nc.ConnectedServerName(), Version: nc.ConnectedServerVersion(),
		Cluster: nc.ConnectedClusterName(), MaxPayload: nc.MaxPayload(), Peers: peers,
	})
}

// asyncError receives nats.go's asynchronous errors. A slow consumer means the connection
// dropped messages before they were routed (S3); the count is read from the subscription.
func (l *Layer) asyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrSlowConsumer) {
		select {
		case l.wake <- struct{}{}:
		default:
		}
		return
	}
	subject := ""
	if sub != nil {
		subject = " on " + sub.Subject
	}
	l.log(LevelError, fmt.Sprintf("channels_nats: NATS error%s: %s", subject, l.redact.text(err.Error())))
}

// reconnectAttempt is one try at replacing a connection that was closed for good.
type reconnectAttempt struct {
	done chan struct{}
	err  error
}

// reconnectLocked returns the attempt in flight or starts one. l.mu must be held.
func (l *Layer) reconnectLocked() *reconnectAttempt {
	if l.attempt != nil {
		return l.attempt
	}
	a := &reconnectAttempt{done: make(chan struct{})}
	l.attempt = a
	go func() {
		a.err = l.replaceConnection()
		l.mu.Lock()
		l.attempt = nil
		l.mu.Unlock()
		close(a.done)
	}()
	return a
}

// replaceConnection opens a new connection, makes every subscription on it and has the server
// confirm them, then hands it to the link (S17). The link writes nothing meanwhile: its
// connection is closed, so the subscription changes queued during the outage run after this.
func (l *Layer) replaceConnection() error {
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.Connection.ConnectTimeout*time.Duration(len(l.cfg.Servers))+time.Second)
	defer cancel()
	go func() {
		select {
		case <-l.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	nc, err := l.dial(ctx)
	if err != nil {
		return l.connectError(err)
	}
	l.mu.Lock()
	wanted := make([]*subscription, 0, len(l.subs))
	for _, s := range l.subs {
		wanted = append(wanted, s)
	}
	l.mu.Unlock()
	for _, s := range wanted {
		if err := l.subscribeOn(nc, s); err != nil {
			nc.Close() // no connection with missing subscriptions is left behind
			return fmt.Errorf("channels_nats: cannot restore the subscription on %s: %w", s.subject, err)
		}
	}
	if err := nc.FlushTimeout(l.cfg.Connection.FlushTimeout); err != nil {
		nc.Close()
		return fmt.Errorf("channels_nats: the server did not confirm the restored subscriptions: %w", l.redact.err(err))
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		nc.Close()
		return ErrClosed
	}
	for _, s := range wanted {
		s.confirmed = s.nc == nc && s.sub != nil
	}
	l.mu.Unlock()
	l.installConnection(nc)
	l.log(LevelWarning, fmt.Sprintf("channels_nats: the NATS connection was closed; reconnected and restored %d subscription(s)", len(wanted)))
	l.counters.recoveries.Add(1)
	return nil
}

// connectionClosed runs when a connection is closed for good. Unless the layer itself is
// closing, it starts the background recovery, so that a process that only receives comes back too.
func (l *Layer) connectionClosed(nc *nats.Conn) {
	l.link.disconnected(nc)
	l.handOverInbox()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || nc != l.link.conn() {
		return
	}
	l.connected.Store(false)
	for _, s := range l.subs {
		s.confirmed = false // until the new connection confirms it again (S1)
	}
	if l.recovering {
		return
	}
	l.recovering = true
	l.routines.Add(1)
	go l.recover()
}

// recover retries replaceConnection with a backoff from 0.5 s up to 30 s until it works or the
// layer is closed.
func (l *Layer) recover() {
	defer l.routines.Done()
	defer func() {
		l.mu.Lock()
		l.recovering = false
		l.mu.Unlock()
	}()
	backoff := 500 * time.Millisecond
	for {
		l.mu.Lock()
		if l.closed || l.connected.Load() {
			l.mu.Unlock()
			return
		}
		a := l.reconnectLocked()
		l.mu.Unlock()
		select {
		case <-a.done:
		case <-l.done:
			return
		}
		if a.err == nil || errors.Is(a.err, ErrClosed) {
			continue // the loop head sees the new connection, or the close
		}
		l.log(LevelWarning, fmt.Sprintf("channels_nats: reconnect failed (%s); trying again in %.1fs", l.redact.text(a.err.Error()), backoff.Seconds()))
		select {
		case <-time.After(backoff):
		case <-l.done:
			return
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}
