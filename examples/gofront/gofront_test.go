package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/channels-nats/channels-nats/layer"
)

// startNATS runs an embedded nats-server on a free loopback port and returns its URL.
func startNATS(t *testing.T) string {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv.ClientURL()
}

func connectLayer(t *testing.T, url string, tweak ...func(*layer.Config)) *layer.Layer {
	t.Helper()
	cfg := layer.Config{Servers: []string{url}}
	for _, f := range tweak {
		f(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l, err := layer.Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// startFront serves a front on l with httptest and returns it with its base URL.
func startFront(t *testing.T, l *layer.Layer) (*front, *httptest.Server) {
	t.Helper()
	f := newFront("go-front", slog.New(slog.NewTextHandler(io.Discard, nil)))
	if l != nil {
		f.setLayer(l)
	}
	hs := httptest.NewServer(f.handler())
	t.Cleanup(func() {
		f.closeConnections()
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		f.wait(ctx)
	})
	return f, hs
}

func dial(t *testing.T, hs *httptest.Server, room string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(hs.URL, "http")+"/ws/chat/"+room+"/", nil)
	if err != nil {
		t.Fatalf("dial room %s: %v (response %v)", room, err, resp)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	return c
}

func send(t *testing.T, c *websocket.Conn, text string) {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"text": text})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
}

// next reads the next frame as {"text", "sender"}, with exactly these keys.
func next(t *testing.T, c *websocket.Conn) outgoing {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	typ, b, err := c.Read(ctx)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if typ != websocket.MessageText {
		t.Fatalf("got a %v frame, want text", typ)
	}
	var keys map[string]any
	if err := json.Unmarshal(b, &keys); err != nil || len(keys) != 2 || keys["text"] == nil || keys["sender"] == nil {
		t.Fatalf("frame %s: want a JSON object with text and sender only", b)
	}
	var m outgoing
	_ = json.Unmarshal(b, &m)
	return m
}

func receive(t *testing.T, l *layer.Layer, ch string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	m, err := l.Receive(ctx, ch)
	if err != nil {
		t.Fatalf("receive on %s: %v", ch, err)
	}
	return m
}

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestChatWithDjango: two browsers on the Go front and a second layer standing for a Django
// process, all in room t1, see each other's messages.
func TestChatWithDjango(t *testing.T) {
	url := startNATS(t)
	_, hs := startFront(t, connectLayer(t, url))
	django := connectLayer(t, url)
	ctx := context.Background()
	dch, err := django.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := django.GroupAdd(ctx, "chat_t1", dch); err != nil {
		t.Fatal(err)
	}
	a, b := dial(t, hs, "t1"), dial(t, hs, "t1")

	// Browser A -> both browsers and Django.
	send(t, a, "hello from A ✓")
	want := outgoing{Text: "hello from A ✓", Sender: "go-front"}
	for _, c := range []*websocket.Conn{a, b} {
		if got := next(t, c); got != want {
			t.Fatalf("browser got %+v, want %+v", got, want)
		}
	}
	m := receive(t, django, dch)
	if m["type"] != "chat.message" || m["text"] != want.Text || m["sender"] != want.Sender || len(m) != 3 {
		t.Fatalf("Django got %#v", m)
	}

	// Django -> both browsers.
	err = django.GroupSend(ctx, "chat_t1", map[string]any{"type": "chat.message", "text": "hi from Django", "sender": "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if m := receive(t, django, dch); m["text"] != "hi from Django" { // Django is a member too
		t.Fatalf("Django got %#v", m)
	}
	want = outgoing{Text: "hi from Django", Sender: "alice"}
	for _, c := range []*websocket.Conn{a, b} {
		if got := next(t, c); got != want {
			t.Fatalf("browser got %+v, want %+v", got, want)
		}
	}

	// Other event types, other rooms, empty and oversized texts and malformed frames reach nobody;
	// the connection survives them.
	_ = django.GroupSend(ctx, "chat_t1", map[string]any{"type": "user.joined", "text": "x"})
	_ = django.GroupSend(ctx, "chat_t2", map[string]any{"type": "chat.message", "text": "other room", "sender": "bob"})
	send(t, a, "   ")
	send(t, a, strings.Repeat("x", maxText+1))
	_ = a.Write(ctx, websocket.MessageText, []byte(`{"message": "wrong key"}`))
	_ = a.Write(ctx, websocket.MessageText, []byte(`not json`))
	send(t, a, strings.Repeat("y", maxText))
	if got := next(t, b); got.Text != strings.Repeat("y", maxText) {
		t.Fatalf("b got %.40q..., want the %d-byte message", got.Text, maxText)
	}
	if got := next(t, a); got.Text != strings.Repeat("y", maxText) {
		t.Fatalf("a got %.40q...", got.Text)
	}
	// Django gets its own user.joined too, in either order: two publishers are not ordered.
	for got := receive(t, django, dch); got["text"] != strings.Repeat("y", maxText); got = receive(t, django, dch) {
		if got["type"] != "user.joined" {
			t.Fatalf("Django got %.60v", got)
		}
	}
}

// TestRoomNames: invalid rooms are refused with 400, pages and redirects work.
func TestRoomNames(t *testing.T) {
	_, hs := startFront(t, connectLayer(t, startNATS(t)))
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(path string, header ...string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", hs.URL+path, nil)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	upgrade := []string{"Connection", "Upgrade", "Upgrade", "websocket", "Sec-WebSocket-Version", "13", "Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="}
	long := strings.Repeat("r", 51)
	for _, room := range []string{"bad%20room", "a.b", "a/b", "caf%C3%A9", long, "x*", "a%2Fb"} {
		for _, prefix := range []string{"/ws/chat/", "/chat/"} {
			if resp := get(prefix+room+"/", upgrade...); resp.StatusCode != http.StatusBadRequest {
				t.Errorf("GET %s%s/: %d, want 400", prefix, room, resp.StatusCode)
			}
		}
	}
	for _, path := range []string{"/ws/chat/", "/chat/", "/ws/chat/a/b"} {
		if resp := get(path, upgrade...); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400", path, resp.StatusCode)
		}
	}
	if _, _, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(hs.URL, "http")+"/ws/chat/no.dots/", nil); err == nil {
		t.Error("dial to an invalid room succeeded")
	}
	dial(t, hs, strings.Repeat("R", 50)).CloseNow()
	dial(t, hs, "Az09_-").CloseNow()

	resp := get("/chat/lobby/")
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /chat/lobby/: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, id := range []string{`id="chat-log"`, `id="chat-message-input"`, `id="chat-message-submit"`, `"/ws/chat/"`} {
		if !strings.Contains(string(body), id) {
			t.Errorf("the page lacks %s", id)
		}
	}
	if resp := get("/"); resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/chat/lobby/" {
		t.Errorf("GET /: %d to %q, want a redirect to /chat/lobby/", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp := get("/nothing"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /nothing: %d", resp.StatusCode)
	}
	// A page of another origin cannot open a socket here.
	if resp := get("/ws/chat/lobby/", append(upgrade, "Origin", "http://evil.example")...); resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin upgrade: %d, want 403", resp.StatusCode)
	}
}

// TestDisconnectLeavesGroup: a socket that closes takes its channel out of its group.
func TestDisconnectLeavesGroup(t *testing.T) {
	url := startNATS(t)
	front := connectLayer(t, url, func(c *layer.Config) { c.MailboxGrace = 200 * time.Millisecond })
	_, hs := startFront(t, front)
	django := connectLayer(t, url)
	ctx := context.Background()

	a, b := dial(t, hs, "t1"), dial(t, hs, "t1")
	c := dial(t, hs, "t2")
	if s := front.Stats(); s.Groups != 2 || s.Mailboxes != 3 {
		t.Fatalf("with 3 sockets in 2 rooms: %d groups, %d mailboxes", s.Groups, s.Mailboxes)
	}

	// The only member of chat_t2 leaves: the group is gone from the front's layer.
	c.Close(websocket.StatusNormalClosure, "")
	eventually(t, "chat_t2 to be left", func() bool { return front.Stats().Groups == 1 })

	// A leaves chat_t1: its mailbox is reclaimed (it is no member any more), B still chats.
	a.Close(websocket.StatusNormalClosure, "")
	eventually(t, "the mailboxes of A and C to be reclaimed", func() bool { return front.Stats().Mailboxes == 1 })
	if err := django.GroupSend(ctx, "chat_t1", map[string]any{"type": "chat.message", "text": "still here?", "sender": "alice"}); err != nil {
		t.Fatal(err)
	}
	if got := next(t, b); got.Text != "still here?" {
		t.Fatalf("b got %+v", got)
	}
	before := front.Stats()
	if before.Dropped.NoMailbox != 0 || before.Dropped.Capacity != 0 {
		t.Fatalf("drops: %+v", before.Dropped)
	}

	b.Close(websocket.StatusNormalClosure, "")
	eventually(t, "every membership to end", func() bool { s := front.Stats(); return s.Groups == 0 && s.Mailboxes == 0 })
	_ = django.GroupSend(ctx, "chat_t1", map[string]any{"type": "chat.message", "text": "anyone?", "sender": "alice"})
	time.Sleep(100 * time.Millisecond)
	if s := front.Stats(); s.Delivered != before.Delivered {
		t.Fatalf("a message reached the front after everyone left: delivered %d -> %d", before.Delivered, s.Delivered)
	}
}

// TestHealthAndShutdown: /healthz is 503 until the layer is set, then 200; closing the front
// closes its sockets with 1001 and refuses new ones.
func TestHealthAndShutdown(t *testing.T) {
	l := connectLayer(t, startNATS(t))
	f, hs := startFront(t, nil)
	health := func() (int, map[string]any) {
		t.Helper()
		resp, err := http.Get(hs.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&m)
		return resp.StatusCode, m
	}
	if code, _ := health(); code != http.StatusServiceUnavailable {
		t.Fatalf("healthz before the layer: %d, want 503", code)
	}
	if _, resp, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(hs.URL, "http")+"/ws/chat/t1/", nil); err == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("dial before the layer: %v, %v", err, resp)
	}
	f.setLayer(l)
	c := dial(t, hs, "t1")
	// The handler registers the socket right after the handshake the client already saw.
	eventually(t, "healthz to count the socket", func() bool {
		code, m := health()
		return code == http.StatusOK && m["status"] == "ok" && m["connections"] == 1.0 && m["groups"] == 1.0
	})

	f.closeConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, err := c.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Fatalf("read after shutdown: %v, want close status 1001", err)
	}
	f.wait(ctx)
	if s := l.Stats(); s.Groups != 0 {
		t.Fatalf("%d groups after shutdown", s.Groups)
	}
	if _, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(hs.URL, "http")+"/ws/chat/t1/", nil); err == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("dial after shutdown: %v", err)
	}
}

// TestOptions covers the flags and their environment defaults.
func TestOptions(t *testing.T) {
	t.Setenv("GOFRONT_NAME", "from-env")
	o, err := parseOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	want := options{listen: "127.0.0.1:8003", servers: "nats://127.0.0.1:4222", prefix: "channels", name: "from-env"}
	if o != want {
		t.Fatalf("defaults: %+v", o)
	}
	o, err = parseOptions([]string{"-listen", ":0", "-nats", "nats://a:1,nats://b:2", "-prefix", "p", "-name", "n"})
	if err != nil || o.listen != ":0" || o.servers != "nats://a:1,nats://b:2" || o.prefix != "p" || o.name != "n" {
		t.Fatalf("flags: %+v %v", o, err)
	}
	if _, err := parseOptions([]string{"-name", " "}); err == nil {
		t.Fatal("an empty -name was accepted")
	}
}

// TestServe runs the whole program on a free port and stops it as a signal would.
func TestServe(t *testing.T) {
	url := startNATS(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() {
		served <- serve(ctx, ln, options{servers: url, prefix: "channels", name: "gofront-test"})
	}()
	eventually(t, "/healthz to answer 200", func() bool {
		resp, err := http.Get(base + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	c, _, err := websocket.Dial(ctx, "ws://"+ln.Addr().String()+"/ws/chat/lobby/", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	send(t, c, "ping")
	if got := next(t, c); got != (outgoing{Text: "ping", Sender: "gofront-test"}) {
		t.Fatalf("got %+v", got)
	}

	cancel() // what SIGINT does
	rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer rcancel()
	if _, _, err := c.Read(rctx); websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Fatalf("read after shutdown: %v, want close status 1001", err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("serve did not return after shutdown")
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Fatal("still serving after shutdown")
	}
}
