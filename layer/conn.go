package layer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// dial opens a NATS connection with the configured options. closed is closed when that
// connection is closed for good, whoever closed it.
func (l *Layer) dial(ctx context.Context) (nc *nats.Conn, closed chan struct{}, err error) {
	closed = make(chan struct{})
	opts, err := l.natsOptions(closed)
	if err != nil {
		return nil, nil, err
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
		if r.err != nil {
			return nil, nil, fmt.Errorf("channels_nats: cannot connect to %s: %w", redact(strings.Join(l.cfg.Servers, ", ")), redactErr(r.err))
		}
		return r.nc, closed, nil
	case <-ctx.Done():
		go func() { // the connect is bounded by connect_timeout; do not leak its socket
			if r := <-got; r.nc != nil {
				r.nc.Close()
			}
		}()
		return nil, nil, ctx.Err()
	}
}

func (l *Layer) natsOptions(closed chan struct{}) ([]nats.Option, error) {
	o := l.cfg.Connection
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.ReconnectWait(o.ReconnectWait),
		nats.ReconnectBufSize(o.ReconnectBufferSize),
		nats.Timeout(o.ConnectTimeout),
		nats.DrainTimeout(o.DrainTimeout),
		nats.FlusherTimeout(o.FlushTimeout),
		nats.ClosedHandler(func(nc *nats.Conn) {
			close(closed)
			l.connectionClosed(nc)
		}),
		nats.ErrorHandler(l.asyncError),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil && !nc.IsClosed() {
				l.log(LevelWarning, fmt.Sprintf("channels_nats: disconnected from NATS (%s); reconnecting", redact(err.Error())))
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			l.counters.reconnects.Add(1)
			l.mu.Lock()
			n := len(l.subs)
			l.mu.Unlock()
			l.log(LevelWarning, fmt.Sprintf("channels_nats: reconnected to %s; %d subscription(s) restored", redact(nc.ConnectedUrlRedacted()), n))
		}),
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

// asyncError receives nats.go's asynchronous errors. A slow consumer means the connection
// dropped messages before the dispatcher saw them (S3); the count is read from the subscription.
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
	l.log(LevelError, fmt.Sprintf("channels_nats: NATS error%s: %s", subject, redact(err.Error())))
}

// connection returns a usable connection. When the last one was closed for good it joins (or
// starts) a reconnect attempt and waits for it within ctx. A publish gives up after one failed
// attempt (what it would send is lost anyway); a subscription (persist) keeps waiting for the
// recovery until ctx ends, so a change made during the outage is restored, not dropped.
func (l *Layer) connection(ctx context.Context, persist bool) (*nats.Conn, error) {
	for {
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			return nil, ErrClosed
		}
		if nc := l.nc; !nc.IsClosed() {
			l.mu.Unlock()
			return nc, nil
		}
		if mustNotWait(ctx) {
			l.mu.Unlock()
			return nil, ErrWouldBlock
		}
		a := l.reconnectLocked()
		l.mu.Unlock()
		select {
		case <-a.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if a.err == nil {
			continue
		}
		if !persist || errors.Is(a.err, ErrClosed) {
			return nil, a.err
		}
		select { // the background recovery retries too; look again shortly
		case <-time.After(retryPause):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// retryPause is how long a waiting subscription pauses between two failed reconnect attempts.
const retryPause = 250 * time.Millisecond

// reconnectAttempt is one try at replacing a connection that was closed for good. Concurrent
// callers share it.
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

// replaceConnection opens a new connection and restores every subscription on it (S17).
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
	nc, closed, err := l.dial(ctx)
	if err != nil {
		return err
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		nc.Close()
		return ErrClosed
	}
	restored := 0
	for _, s := range l.subs {
		l.retireDrops(s)
		if err := s.subscribe(nc, l.inbox); err != nil {
			l.mu.Unlock()
			nc.Close() // no open connection with missing subscriptions is left behind
			return fmt.Errorf("channels_nats: cannot restore the subscription on %s: %w", s.subject, err)
		}
		restored++
	}
	l.nc, l.ncClosed = nc, closed
	l.mu.Unlock()
	if err := nc.FlushTimeout(l.cfg.Connection.FlushTimeout); err != nil {
		nc.Close()
		return fmt.Errorf("channels_nats: the server did not confirm the restored subscriptions: %w", redactErr(err))
	}
	l.counters.recoveries.Add(1)
	l.log(LevelWarning, fmt.Sprintf("channels_nats: the NATS connection was closed; reconnected and restored %d subscription(s)", restored))
	return nil
}

// connectionClosed runs when a connection is closed for good. Unless the layer itself is
// closing, it starts the background recovery, so that a process that only receives comes back too.
func (l *Layer) connectionClosed(nc *nats.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || nc != l.nc {
		return
	}
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
		if l.closed || !l.nc.IsClosed() {
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
		l.log(LevelWarning, fmt.Sprintf("channels_nats: reconnect failed (%s); trying again in %.1fs", redact(a.err.Error()), backoff.Seconds()))
		select {
		case <-time.After(backoff):
		case <-l.done:
			return
		}
		backoff = min(backoff*2, 30*time.Second)
	}
}
