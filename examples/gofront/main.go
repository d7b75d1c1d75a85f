// Command gofront is a WebSocket chat front written in Go that joins the rooms of the Django
// Channels chat demo (examples/chat/) through the channels-nats layer package.
//
// A room is the Channels group "chat_<room>". Every WebSocket connection gets a process channel
// of its own (Layer.NewChannel) that joins the room's group, so a message typed in a browser
// connected here and one typed in a browser connected to Django reach both: both sides publish
// {"type": "chat.message", "text": ..., "sender": ...} to the group, and both push every such
// event to their sockets as {"text": ..., "sender": ...}.
//
//	go run ./examples/gofront -nats nats://127.0.0.1:4222
//
// Then open http://127.0.0.1:8003/chat/lobby/. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/channels-nats/channels-nats/layer"
)

// options are the command line flags; each has an environment variable as its default.
type options struct {
	listen  string
	servers string
	prefix  string
	name    string
	verbose bool
}

func parseOptions(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("gofront", flag.ContinueOnError)
	fs.StringVar(&o.listen, "listen", env("GOFRONT_LISTEN", "127.0.0.1:8003"), "HTTP address to serve on (env GOFRONT_LISTEN)")
	fs.StringVar(&o.servers, "nats", env("GOFRONT_NATS", layer.DefaultServer), "NATS server URL(s), comma separated (env GOFRONT_NATS)")
	fs.StringVar(&o.prefix, "prefix", env("GOFRONT_PREFIX", layer.DefaultPrefix), "subject prefix; must match the Django CHANNEL_LAYERS prefix (env GOFRONT_PREFIX)")
	fs.StringVar(&o.name, "name", env("GOFRONT_NAME", "go-front"), "sender label of the messages typed here (env GOFRONT_NAME)")
	fs.BoolVar(&o.verbose, "v", false, "debug logging")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if strings.TrimSpace(o.name) == "" {
		return o, errors.New("-name must not be empty")
	}
	return o, nil
}

func env(key, fallback string) string {
	if v, ok := os.LookupEnv(key); ok && v != "" {
		return v
	}
	return fallback
}

func main() {
	o, err := parseOptions(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gofront:", err)
		os.Exit(2)
	}
	level := slog.LevelInfo
	if o.verbose {
		level = slog.LevelDebug
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))
	if err := run(o); err != nil {
		slog.Error("gofront stopped", "err", err)
		os.Exit(1)
	}
}

// run serves until SIGINT or SIGTERM. A second signal kills the process the usual way.
func run(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() { <-ctx.Done(); stop() }()
	// Listen first, so /healthz answers (503) while NATS is still being reached.
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	return serve(ctx, ln, o)
}

// serve runs the front on ln until ctx ends, then shuts down: no new sockets, the open ones
// closed with 1001 (going away), their memberships discarded, the layer closed.
func serve(ctx context.Context, ln net.Listener, o options) error {
	cfg := layer.Config{Prefix: o.prefix}
	for _, s := range strings.Split(o.servers, ",") {
		if s = strings.TrimSpace(s); s != "" {
			cfg.Servers = append(cfg.Servers, s)
		}
	}
	cfg.Connection.Name = "gofront " + o.name
	if _, err := cfg.WithDefaults(); err != nil {
		ln.Close()
		return err
	}

	f := newFront(o.name, slog.Default())
	srv := &http.Server{Handler: f.handler(), ReadHeaderTimeout: 10 * time.Second}
	srv.RegisterOnShutdown(f.closeConnections)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	slog.Info("gofront listening", "url", "http://"+ln.Addr().String()+"/chat/lobby/",
		"nats", strings.Join(cfg.Servers, ","), "prefix", o.prefix, "name", o.name)

	l, err := connect(ctx, cfg)
	if err == nil {
		f.setLayer(l)
		slog.Info("connected to NATS", "client_id", l.ClientID())
		select {
		case <-ctx.Done():
		case err = <-served:
		}
	}

	slog.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
	defer cancel()
	if serr := srv.Shutdown(shutdownCtx); serr != nil {
		slog.Warn("HTTP shutdown", "err", serr)
	}
	f.wait(shutdownCtx) // the WebSocket handlers have discarded their memberships
	if l != nil {
		_ = l.Close()
	}
	slog.Info("stopped")
	if errors.Is(err, context.Canceled) || errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// connect connects the layer, retrying until ctx ends: the front may start before nats-server.
func connect(ctx context.Context, cfg layer.Config) (*layer.Layer, error) {
	for attempt := 1; ; attempt++ {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		l, err := layer.Connect(cctx, cfg)
		cancel()
		if err == nil {
			return l, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if attempt == 1 || attempt%10 == 0 {
			slog.Warn("cannot reach NATS yet; retrying every second", "err", err, "attempt", attempt)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
