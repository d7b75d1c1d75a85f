package layer

import (
	"testing"
	"time"
)

func TestSmokeRoundTrip(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ctx := ctxT(t, 10*time.Second)
	ch, err := a.NewChannel(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx, ch, map[string]any{"type": "test.message", "text": "hi"}); err != nil {
		t.Fatal(err)
	}
	m, err := a.Receive(ctx, ch)
	if err != nil || m["text"] != "hi" {
		t.Fatalf("got %v, %v", m, err)
	}
	if err := a.GroupAdd(ctx, "room", ch); err != nil {
		t.Fatal(err)
	}
	if err := b.GroupSend(ctx, "room", map[string]any{"type": "g", "n": 1}); err != nil {
		t.Fatal(err)
	}
	m, err = a.Receive(ctx, ch)
	if err != nil || m["type"] != "g" {
		t.Fatalf("got %v, %v", m, err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = b.Send(ctx, "worker", map[string]any{"type": "job"})
	}()
	rctx := ctxT(t, 5*time.Second)
	done := make(chan error, 1)
	go func() {
		m, err := a.Receive(rctx, "worker")
		if err == nil && m["type"] != "job" {
			t.Errorf("got %v", m)
		}
		done <- err
	}()
	// The first send may race the subscription; keep sending until it lands.
	for i := 0; i < 50; i++ {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			t.Log(a.Stats())
			return
		case <-time.After(100 * time.Millisecond):
			_ = b.Send(ctx, "worker", map[string]any{"type": "job"})
		}
	}
	t.Fatal("plain channel receive never completed")
}
