package layer

import (
	"sync"
	"testing"
	"time"
)

// TestDeliveriesHookBracketsABurst: Config.Deliveries is called once before and once after the
// deliveries one group message makes to every waiting member, and every delivery of the burst
// happens between the two calls; a message that waits in a mailbox makes no call.
func TestDeliveriesHookBracketsABurst(t *testing.T) {
	srv := startServer(t)
	var mu sync.Mutex
	var events []string // "begin", "deliver", "end"
	record := func(e string) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	cfg := testConfig(nil, srv.url())
	cfg.Deliveries = func(begin bool) {
		if begin {
			record("begin")
		} else {
			record("end")
		}
	}
	l, sender := connect(t, cfg), connect(t, testConfig(nil, srv.url()))
	const members = 20
	var delivered sync.WaitGroup
	for i := 0; i < members; i++ {
		channel, err := l.NewChannel(ctxT(t, 5*time.Second), "")
		if err != nil {
			t.Fatal(err)
		}
		msgGroupAdd(t, l, "burst", channel)
		delivered.Add(1)
		if _, p, err := l.StartReceive(channel, func(_ Message, err error) {
			if err == nil {
				record("deliver")
				delivered.Done()
			}
		}); err != nil || p == nil {
			t.Fatalf("StartReceive: pending=%v err=%v", p, err)
		}
	}
	msgGroupSend(t, sender, "burst", map[string]any{"type": "burst"})
	delivered.Wait()
	waitFor(t, 5*time.Second, "the end of the burst", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(events) > 0 && events[len(events)-1] == "end"
	})
	mu.Lock()
	got := append([]string(nil), events...)
	mu.Unlock()
	if len(got) != members+2 || got[0] != "begin" || got[len(got)-1] != "end" {
		t.Fatalf("events = %v; want begin, %d deliveries, end", got, members)
	}
	for _, e := range got[1 : len(got)-1] {
		if e != "deliver" {
			t.Fatalf("events = %v; want every delivery between begin and end", got)
		}
	}

	// Nobody waits now: the next group message goes to the mailboxes, with no burst.
	msgGroupSend(t, sender, "burst", map[string]any{"type": "stored"})
	time.Sleep(200 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if len(events) != len(got) {
		t.Fatalf("a message stored in mailboxes called Deliveries: %v", events[len(got):])
	}
}
