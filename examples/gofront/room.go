package main

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/channels-nats/channels-nats/layer"
)

// The protocol shared with the Django demo (examples/chat/).
const (
	groupPrefix = "chat_"        // room r is the Channels group "chat_" + r
	eventType   = "chat.message" // the "type" of the group events; Django calls chat_message
	maxText     = 4096           // bytes of text accepted from a browser
	// maxFrame bounds one incoming WebSocket frame: maxText of text JSON-escaped (\uXXXX) fits.
	maxFrame = 6*maxText + 256
)

var (
	roomName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,50}$`)

	//go:embed static/room.html
	roomPage []byte
)

// front serves the chat page and the WebSocket endpoint. The layer is set once it is connected.
type front struct {
	name string // the sender label of messages typed here
	log  *slog.Logger

	l      atomic.Pointer[layer.Layer]
	nextID atomic.Uint64

	mu      sync.Mutex
	closing bool
	conns   map[*websocket.Conn]struct{}
	active  sync.WaitGroup // WebSocket handlers that have not returned
}

func newFront(name string, log *slog.Logger) *front {
	return &front{name: name, log: log, conns: map[*websocket.Conn]struct{}{}}
}

func (f *front) setLayer(l *layer.Layer) { f.l.Store(l) }

func (f *front) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/chat/lobby/", http.StatusFound)
	})
	mux.HandleFunc("GET /chat/", f.servePage)
	mux.HandleFunc("GET /ws/chat/", f.serveWS)
	mux.HandleFunc("GET /healthz", f.serveHealth)
	return mux
}

// parseRoom returns the room of a path "<prefix><room>/" (the final slash may be left out).
func parseRoom(path, prefix string) (string, bool) {
	room := strings.TrimSuffix(strings.TrimPrefix(path, prefix), "/")
	return room, roomName.MatchString(room)
}

const badRoom = "invalid room name: 1 to 50 ASCII letters, digits, '-' or '_'"

func (f *front) servePage(w http.ResponseWriter, r *http.Request) {
	if _, ok := parseRoom(r.URL.Path, "/chat/"); !ok {
		http.Error(w, badRoom, http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(roomPage)
}

// serveHealth answers 200 while the layer is connected to NATS, 503 otherwise.
func (f *front) serveHealth(w http.ResponseWriter, _ *http.Request) {
	type health struct {
		Status      string `json:"status"`
		Connected   bool   `json:"nats_connected"`
		ClientID    string `json:"client_id,omitempty"`
		Connections int    `json:"connections"`
		Groups      int    `json:"groups"`
	}
	h := health{Status: "connecting"}
	if l := f.l.Load(); l != nil {
		s := l.Stats()
		h.Connected, h.ClientID, h.Groups = s.Connected, s.ClientID, s.Groups
		if s.Connected {
			h.Status = "ok"
		} else {
			h.Status = "disconnected"
		}
	}
	f.mu.Lock()
	h.Connections = len(f.conns)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if h.Status != "ok" {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(h)
}

// enter counts a WebSocket handler in, unless the front is shutting down.
func (f *front) enter() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closing {
		return false
	}
	f.active.Add(1)
	return true
}

// track registers an open socket so closeConnections can close it; false when shutting down.
func (f *front) track(c *websocket.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closing {
		return false
	}
	f.conns[c] = struct{}{}
	return true
}

func (f *front) untrack(c *websocket.Conn) {
	f.mu.Lock()
	delete(f.conns, c)
	f.mu.Unlock()
}

// closeConnections refuses new sockets and closes the open ones with 1001 (going away). It is
// registered with http.Server.RegisterOnShutdown: Shutdown does not close hijacked connections.
func (f *front) closeConnections() {
	f.mu.Lock()
	f.closing = true
	conns := make([]*websocket.Conn, 0, len(f.conns))
	for c := range f.conns {
		conns = append(conns, c)
	}
	f.mu.Unlock()
	for _, c := range conns {
		go func() { _ = c.Close(websocket.StatusGoingAway, "server shutting down") }()
	}
}

// wait waits until every WebSocket handler has returned, or ctx ends.
func (f *front) wait(ctx context.Context) {
	done := make(chan struct{})
	go func() { f.active.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		f.log.Warn("some WebSocket connections did not finish in time")
	}
}

// serveWS joins the room's group with a new process channel, then pumps group events to the
// socket and the socket's messages to the group until either side ends.
func (f *front) serveWS(w http.ResponseWriter, r *http.Request) {
	room, ok := parseRoom(r.URL.Path, "/ws/chat/")
	if !ok {
		http.Error(w, badRoom, http.StatusBadRequest)
		return
	}
	l := f.l.Load()
	if l == nil || !f.enter() {
		http.Error(w, "not ready: not connected to NATS, or shutting down", http.StatusServiceUnavailable)
		return
	}
	defer f.active.Done()
	group := groupPrefix + room
	log := f.log.With("room", room, "conn", f.nextID.Add(1))

	// Join before accepting: once the browser sees the socket open, the group reaches it.
	joinCtx, cancelJoin := context.WithTimeout(r.Context(), 10*time.Second)
	ch, err := l.NewChannel(joinCtx, "")
	if err == nil {
		err = l.GroupAdd(joinCtx, group, ch)
	}
	cancelJoin()
	if err != nil {
		log.Warn("cannot join the room", "err", err)
		http.Error(w, "cannot join the room", http.StatusServiceUnavailable)
		return
	}
	defer func() {
		if err := l.GroupDiscard(group, ch); err != nil && !errors.Is(err, layer.ErrClosed) {
			log.Warn("group discard", "err", err)
		}
	}()

	c, err := websocket.Accept(w, r, nil) // same-origin only (the default)
	if err != nil {
		log.Info("WebSocket handshake refused", "err", err) // Accept wrote the HTTP error
		return
	}
	defer c.CloseNow()
	if !f.track(c) {
		_ = c.Close(websocket.StatusGoingAway, "server shutting down")
		return
	}
	defer f.untrack(c)
	c.SetReadLimit(maxFrame)
	log.Info("joined", "remote", r.RemoteAddr, "channel", ch)

	ctx, cancel := context.WithCancel(r.Context())
	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		f.pumpToSocket(ctx, log, l, ch, c)
	}()
	f.readFromSocket(ctx, log, l, group, c)
	cancel()
	<-pumped
	log.Info("left")
}

// outgoing is what a browser receives for every chat.message event of its room.
type outgoing struct {
	Text   string `json:"text"`
	Sender string `json:"sender"`
}

// pumpToSocket writes the chat.message events received on ch to the socket until ctx ends, the
// layer closes or a write fails.
func (f *front) pumpToSocket(ctx context.Context, log *slog.Logger, l *layer.Layer, ch string, c *websocket.Conn) {
	for {
		msg, err := l.Receive(ctx, ch)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, layer.ErrClosed):
			_ = c.Close(websocket.StatusGoingAway, "server shutting down")
			return
		case err != nil:
			log.Warn("receive", "err", err) // a body that could not be decoded: skip it
			continue
		}
		if msg["type"] != eventType {
			log.Debug("ignored an event", "type", msg["type"])
			continue
		}
		text, textOK := msg["text"].(string)
		sender, senderOK := msg["sender"].(string) // a missing sender shows as ""
		if !textOK || (!senderOK && msg["sender"] != nil) {
			log.Warn("ignored a chat.message whose text or sender is not a string")
			continue
		}
		frame, err := json.Marshal(outgoing{Text: text, Sender: sender})
		if err != nil {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = c.Write(wctx, websocket.MessageText, frame)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				log.Info("write failed; closing", "err", err)
			}
			_ = c.CloseNow() // ends the read loop too
			return
		}
	}
}

// incoming is what a browser sends.
type incoming struct {
	Text *string `json:"text"`
}

// readFromSocket publishes the socket's messages to the group until the socket closes.
func (f *front) readFromSocket(ctx context.Context, log *slog.Logger, l *layer.Layer, group string, c *websocket.Conn) {
	for {
		typ, data, err := c.Read(ctx)
		if err != nil {
			switch websocket.CloseStatus(err) {
			case websocket.StatusNormalClosure, websocket.StatusGoingAway, websocket.StatusNoStatusRcvd:
			default:
				if ctx.Err() == nil {
					log.Debug("read ended", "err", err)
				}
			}
			return
		}
		if typ != websocket.MessageText {
			_ = c.Close(websocket.StatusUnsupportedData, "text frames only")
			return
		}
		var in incoming
		if err := json.Unmarshal(data, &in); err != nil || in.Text == nil {
			log.Warn(`ignored a frame that is not {"text": "..."}`)
			continue
		}
		text := *in.Text
		if strings.TrimSpace(text) == "" {
			continue
		}
		if len(text) > maxText {
			log.Warn("ignored a message over the size limit", "bytes", len(text), "limit", maxText)
			continue
		}
		event := map[string]any{"type": eventType, "text": text, "sender": f.name}
		if err := l.GroupSend(ctx, group, event); err != nil {
			if errors.Is(err, layer.ErrClosed) || ctx.Err() != nil {
				return
			}
			log.Warn("group send", "err", err)
		}
	}
}
