//go:build linux

package abitest

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Closing a client with pending receives: each receive's callback runs once with CN_CLOSED,
// before the close callback; afterwards no callback of the client runs, and its handle is closed.
func TestCloseWithPendingOperations(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	sender := connect(t, ts.url, nil)
	var chans []string
	for range 5 {
		chans = append(chans, c.newChannel(""))
	}
	for range 5 {
		chans = append(chans, uniq(t, "plain"))
	}
	var ws []*waiter
	for _, ch := range chans {
		w := newWaiter(4, nil)
		c.receivePending(ch, w)
		ws = append(ws, w)
	}
	// And one waiting receive (callback NULL) on a thread of its own.
	waitingCh := c.newChannel("")
	waitingDone := make(chan int32, 1)
	go func() {
		var out, n uintptr
		st := cnReceive(c.h, cs(waitingCh), 0, 0, &out, &n, nil)
		if st == cnOK {
			cnFree(out)
		}
		waitingDone <- st
	}()
	time.Sleep(20 * time.Millisecond) // let it start waiting
	closed := newWaiter(2, nil)
	st := cnClose(c.h, completeCB, closed.closure)
	if st != cnPending && st != cnOK {
		t.Fatalf("cn_close (pending form): %s", name(st))
	}
	var closeSeq uint64
	if st == cnPending {
		r := closed.wait(t)
		if r.Status != cnOK || r.HasData {
			t.Errorf("close callback: %s, want CN_OK", name(r.Status))
		}
		closeSeq = r.Seq
	} else {
		closeSeq = cbSeq.Load()
	}
	for i, w := range ws {
		if n := w.calls.Load(); n != 1 {
			t.Errorf("receive %d (%s): callback ran %d times before the close finished, want 1", i, chans[i], n)
			continue
		}
		r := <-w.ch
		if r.Status != cnClosed || !r.HasText || r.Text == "" {
			t.Errorf("receive %d: %s %q, want CN_CLOSED with a detail", i, name(r.Status), r.Text)
		}
		if r.HasData || r.Len != 0 {
			t.Errorf("receive %d: CN_CLOSED with data", i)
		}
		if r.Seq > closeSeq {
			t.Errorf("receive %d: its CN_CLOSED callback ran after the close callback", i)
		}
	}
	select {
	case st := <-waitingDone:
		if st != cnClosed {
			t.Errorf("waiting receive during the close: %s, want CN_CLOSED", name(st))
		}
	case <-time.After(wait):
		t.Error("a waiting receive did not return after the close")
	}
	// No callback of the closed client runs any more, whatever traffic comes.
	logs := c.log.calls.Load()
	deadline := time.Now().Add(300 * time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		for _, ch := range chans {
			sender.send(ch, numbered(t, i))
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i, w := range ws {
		if n := w.calls.Load(); n != 1 {
			t.Errorf("receive %d: %d callbacks after the close", i, n)
		}
	}
	if n := closed.calls.Load(); n > 1 {
		t.Errorf("close callback ran %d times", n)
	}
	if n := c.log.calls.Load(); n != logs {
		t.Errorf("%d log records after the close: %v", n-logs, c.log.snapshot()[logs:])
	}
	checkAll(t, "closed handle", c.h, cnClosed)
	checkAll(t, "unknown handle 999999999", 999999999, cnInvalidHandle)
	checkAll(t, "handle 0", 0, cnInvalidHandle)
}

// checkAll calls every function that takes a client handle, with valid other arguments.
func checkAll(t *testing.T, what string, h uint64, want int32) {
	t.Helper()
	w := newWaiter(16, nil)
	body := numbered(t, 1)
	b, n := bp(body)
	var out, blen uintptr
	var op uint64
	ch := "specific.0123456789ab!0123456789abcdef0123456789abcdef"
	calls := []struct {
		fn   string
		call func() int32
	}{
		{"cn_close (waiting)", func() int32 { return cnClose(h, 0, 0) }},
		{"cn_close (pending)", func() int32 { return cnClose(h, completeCB, w.closure) }},
		{"cn_send", func() int32 { return cnSend(h, cs(ch), b, n, completeCB, w.closure, &op) }},
		{"cn_group_send", func() int32 { return cnGroupSend(h, cs("grp"), b, n, completeCB, w.closure, &op) }},
		{"cn_receive", func() int32 { return cnReceive(h, cs("plain"), completeCB, w.closure, &out, &blen, &op) }},
		{"cn_receive (waiting)", func() int32 { return cnReceive(h, cs("plain"), 0, 0, &out, &blen, &op) }},
		{"cn_put_back", func() int32 { return cnPutBack(h, cs("plain"), b, n) }},
		{"cn_new_channel", func() int32 { return cnNewChannel(h, nil, completeCB, w.closure, &out, &op) }},
		{"cn_group_add", func() int32 { return cnGroupAdd(h, cs("grp"), cs("plain"), completeCB, w.closure, &op) }},
		{"cn_group_discard", func() int32 { return cnGroupDiscard(h, cs("grp"), cs("plain")) }},
		{"cn_flush", func() int32 { return cnFlush(h) }},
		{"cn_cancel", func() int32 { return cnCancel(h, 1) }},
		{"cn_stats", func() int32 { return cnStats(h, &out) }},
	}
	var wrong []string
	for _, c := range calls {
		st, msg := onThread(c.call)
		if st != want || msg == "" {
			wrong = append(wrong, fmt.Sprintf("%s: %s (%q)", c.fn, name(st), msg))
		}
	}
	if len(wrong) > 0 {
		t.Errorf("%s: want %s with a detail from every call, got:\n  %s", what, name(want), strings.Join(wrong, "\n  "))
	}
	w.none(t, 20*time.Millisecond)
}

func TestCloseWaitingAndTwice(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	w := newWaiter(2, nil)
	c.receivePending(ch, w)
	if st := cnClose(c.h, 0, 0); st != cnOK {
		t.Fatalf("cn_close (waiting form): %s, want CN_OK", name(st))
	}
	// The waiting close returned: the receive's callback has run, once, with CN_CLOSED.
	if n := w.calls.Load(); n != 1 {
		t.Fatalf("pending receive: %d callbacks when the waiting close returned, want 1", n)
	}
	if r := <-w.ch; r.Status != cnClosed {
		t.Errorf("pending receive: %s, want CN_CLOSED", name(r.Status))
	}
	for _, form := range []struct {
		what string
		cb   uintptr
	}{{"waiting", 0}, {"pending", completeCB}} {
		st, msg := onThread(func() int32 { return cnClose(c.h, form.cb, w.closure) })
		if st != cnClosed || msg == "" {
			t.Errorf("second cn_close (%s form): %s (%q), want CN_CLOSED", form.what, name(st), msg)
		}
	}
	w.none(t, 50*time.Millisecond)
	if n := ts.srv.NumClients(); n != 0 {
		t.Errorf("the server still has %d connection(s) after the close", n)
	}
}

// A close in progress: a second close and new operations are refused with CN_CLOSED.
func TestCloseWhileClosing(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	var second, sendSt int32 = -1, -1
	closed := newWaiter(1, nil)
	// From the pending receive's CN_CLOSED callback, which runs during the close.
	w := newWaiter(2, func(r cbResult) {
		second = cnClose(c.h, completeCB, closed.closure)
		body := numbered(t, 1)
		b, n := bp(body)
		sendSt = cnSend(c.h, cs(ch), b, n, completeCB, closed.closure, nil)
	})
	c.receivePending(ch, w)
	if st := cnClose(c.h, completeCB, closed.closure); st != cnPending && st != cnOK {
		t.Fatalf("cn_close: %s", name(st))
	}
	if st := cnClose(c.h, completeCB, closed.closure); st != cnClosed {
		t.Errorf("cn_close while closing: %s, want CN_CLOSED", name(st))
	}
	if r := w.wait(t); r.Status != cnClosed {
		t.Fatalf("pending receive: %s", name(r.Status))
	}
	if r := closed.wait(t); r.Status != cnOK {
		t.Errorf("close callback: %s", name(r.Status))
	}
	if second != cnClosed {
		t.Errorf("cn_close from a callback during the close: %s, want CN_CLOSED", name(second))
	}
	if sendSt != cnClosed {
		t.Errorf("cn_send from a callback during the close: %s, want CN_CLOSED", name(sendSt))
	}
	closed.none(t, 50*time.Millisecond)
}

// An operation handle is not a client handle: the library never issued it as a cn_client, so
// calls given it as the client are CN_INVALID_HANDLE (not CN_CLOSED, which says a client was
// closed).
func TestOpHandleIsNotAClient(t *testing.T) {
	ts := startServer(t)
	c := connect(t, ts.url, nil)
	ch := c.newChannel("")
	w := newWaiter(1, nil)
	op := c.receivePending(ch, w)
	if op == c.h {
		t.Fatalf("op handle %d equals the client handle", op)
	}
	checkAll(t, "an op handle as the client", op, cnInvalidHandle)
	if st := cnCancel(c.h, op); st != cnOK {
		t.Errorf("the receive is still pending: cn_cancel = %s", name(st))
	}
}
