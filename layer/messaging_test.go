package layer

// Integration tests of the messaging paths of a Layer against an embedded nats-server: send,
// receive, groups, ordering, capacity, expiry, size limits, validation, the wire contract of
// SPEC section 3, and the counters. Each test names the SPEC rule (S1-S20) and the reference
// test number (anchor-channels-nats.md section 5a) it covers.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/vmihailenco/msgpack/v5"
)

// msgQuiet is how long a "nothing arrives" check waits.
const msgQuiet = 300 * time.Millisecond

// msgResult is what a receive started with msgStartInto delivered.
type msgResult struct {
	from string // a label of the reader
	m    map[string]any
	err  error
}

// msgStartInto begins a receive and requires it to be pending, then waits until it waits in
// the channel's mailbox. A receive is listed there only once the channel's subscription is
// confirmed (S1), so a send issued afterwards must reach it. The result goes to out, which must
// have room for it (Close delivers ErrClosed to a receive still waiting, and must not block).
func msgStartInto(t *testing.T, l *Layer, channel, label string, out chan msgResult) *Op {
	t.Helper()
	msg, p, err := l.StartReceive(channel, func(m Message, err error) {
		if err != nil {
			out <- msgResult{label, nil, err}
			return
		}
		d, err := DecodeMessage(m.Body)
		out <- msgResult{label, d, err}
	})
	if err != nil {
		t.Fatalf("StartReceive(%s): %v", channel, err)
	}
	if p == nil {
		t.Fatalf("StartReceive(%s) returned a message at once (%x); expected a pending receive", channel, msg.Body)
	}
	msgAwaitListed(t, l, channel, p)
	return p
}

// msgListed reports whether the receive of op waits in the mailbox of channel.
func msgListed(l *Layer, channel string, op *Op) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	mb := l.mailboxes[channel]
	if mb == nil {
		return false
	}
	for _, w := range mb.waiters {
		if w.op == op {
			return true
		}
	}
	return false
}

// msgAwaitListed waits (5 s at most) until the receive of op waits in the mailbox of channel:
// its subscription is confirmed. It fails if the receive ended meanwhile.
func msgAwaitListed(t testing.TB, l *Layer, channel string, op *Op) {
	t.Helper()
	waitFor(t, 5*time.Second, "the receive on "+channel+" to wait in its mailbox", func() bool {
		if !op.pending() {
			t.Fatalf("the receive on %s ended before it waited in its mailbox", channel)
		}
		return msgListed(l, channel, op)
	})
}

// msgStart is msgStartInto with a channel of its own.
func msgStart(t *testing.T, l *Layer, channel string) (<-chan msgResult, *Op) {
	t.Helper()
	out := make(chan msgResult, 1)
	return out, msgStartInto(t, l, channel, channel, out)
}

// msgAwait waits for the next result on out.
func msgAwait(t *testing.T, out <-chan msgResult, what string) msgResult {
	t.Helper()
	select {
	case r := <-out:
		if r.err != nil {
			t.Fatalf("%s: receive ended with %v", what, r.err)
		}
		return r
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: no message within 5s", what)
	}
	return msgResult{}
}

// msgNoResult fails if anything arrives on out within msgQuiet.
func msgNoResult(t *testing.T, out <-chan msgResult, what string) {
	t.Helper()
	select {
	case r := <-out:
		t.Fatalf("%s: unexpected delivery to %s: %v (err %v)", what, r.from, r.m, r.err)
	case <-time.After(msgQuiet):
	}
}

// msgRecv receives the next message on channel (5 s at most).
func msgRecv(t *testing.T, l *Layer, channel string) map[string]any {
	t.Helper()
	m, err := l.Receive(ctxT(t, 5*time.Second), channel)
	if err != nil {
		t.Fatalf("Receive(%s): %v", channel, err)
	}
	return m
}

// msgNothing requires that no message arrives on channel within msgQuiet.
func msgNothing(t *testing.T, l *Layer, channel string) {
	t.Helper()
	m, err := l.Receive(ctxT(t, msgQuiet), channel)
	if err == nil {
		t.Fatalf("Receive(%s): expected nothing, got %v", channel, m)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Receive(%s): expected a timeout, got %v", channel, err)
	}
}

func msgSend(t *testing.T, l *Layer, channel string, msg map[string]any) {
	t.Helper()
	if err := l.Send(ctxT(t, 5*time.Second), channel, msg); err != nil {
		t.Fatalf("Send(%s): %v", channel, err)
	}
}

func msgGroupSend(t *testing.T, l *Layer, group string, msg map[string]any) {
	t.Helper()
	if err := l.GroupSend(ctxT(t, 5*time.Second), group, msg); err != nil {
		t.Fatalf("GroupSend(%s): %v", group, err)
	}
}

func msgNewChannel(t *testing.T, l *Layer) string {
	t.Helper()
	ch, err := l.NewChannel(ctxT(t, 5*time.Second), "")
	if err != nil {
		t.Fatalf("NewChannel: %v", err)
	}
	return ch
}

func msgGroupAdd(t *testing.T, l *Layer, group, channel string) {
	t.Helper()
	if err := l.GroupAdd(ctxT(t, 5*time.Second), group, channel); err != nil {
		t.Fatalf("GroupAdd(%s, %s): %v", group, channel, err)
	}
}

// msgInt reads any decoded msgpack integer as an int64.
func msgInt(v any) (int64, bool) {
	switch n := v.(type) {
	case int:
		return int64(n), true
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	case uint64:
		if n > 1<<63-1 {
			return 0, false
		}
		return int64(n), true
	}
	return 0, false
}

// msgN returns the integer field "n" of a received message.
func msgN(t *testing.T, m map[string]any) int64 {
	t.Helper()
	n, ok := msgInt(m["n"])
	if !ok {
		t.Fatalf("message %v has no integer n", m)
	}
	return n
}

// msgQueued is how many messages wait in the mailbox of name (-1: no mailbox).
func msgQueued(l *Layer, name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	mb := l.mailboxes[name]
	if mb == nil {
		return -1
	}
	return len(mb.entries)
}

// msgSizedMessage returns a message whose msgpack body is exactly n bytes.
func msgSizedMessage(t *testing.T, n int) map[string]any {
	t.Helper()
	for size := n; size >= 0; size-- {
		m := map[string]any{"type": "big", "b": make([]byte, size)}
		body, err := encodeMessage(m)
		if err != nil {
			t.Fatal(err)
		}
		if len(body) == n {
			return m
		}
	}
	t.Fatalf("no message of %d bytes", n)
	return nil
}

// msgRawSub subscribes a raw connection to subject and confirms the subscription.
func msgRawSub(t *testing.T, nc *nats.Conn, subject string) chan *nats.Msg {
	t.Helper()
	ch := make(chan *nats.Msg, 256)
	if _, err := nc.ChanSubscribe(subject, ch); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

// msgRawNext returns the next message of a raw subscription.
func msgRawNext(t *testing.T, ch chan *nats.Msg) *nats.Msg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("raw subscriber: no message within 5s")
	}
	return nil
}

// msgConnSubs lists the subscriptions the server holds for the client connection named name.
func msgConnSubs(t *testing.T, ts *testServer, name string) []server.SubDetail {
	t.Helper()
	ts.mu.Lock()
	srv := ts.srv
	ts.mu.Unlock()
	cz, err := srv.Connz(&server.ConnzOptions{Subscriptions: true, SubscriptionsDetail: true})
	if err != nil {
		t.Fatal(err)
	}
	var subs []server.SubDetail
	found := false
	for _, c := range cz.Conns {
		if c.Name == name {
			found = true
			subs = append(subs, c.SubsDetail...)
		}
	}
	if !found {
		t.Fatalf("the server has no connection named %q", name)
	}
	return subs
}

// msgNamed is testConfig with a connection name, so the server's view of it can be found.
func msgNamed(rec *logSink, name string, urls ...string) Config {
	cfg := testConfig(rec, urls...)
	cfg.Connection.Name = name
	return cfg
}

var msgProcessName = regexp.MustCompile(`^specific\.([0-9a-f]{12})![0-9a-f]{32}$`)

// Ref 1: a process channel round trip with unicode text, from another Layer and from the same.
func TestMessagingProcessChannelRoundTrip(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)

	want := map[string]any{"type": "test.message", "text": "안녕 héllo 世界 🚀"}
	msgSend(t, b, ch, want)
	if got := msgRecv(t, a, ch); !reflect.DeepEqual(got, want) {
		t.Fatalf("from another layer: got %#v, want %#v", got, want)
	}
	msgSend(t, a, ch, want)
	if got := msgRecv(t, a, ch); !reflect.DeepEqual(got, want) {
		t.Fatalf("from the same layer: got %#v, want %#v", got, want)
	}
}

// Ref 2 and SPEC section 3: new_channel names are unique, specific.<12 hex>!<32 hex>, valid, and
// carry the client id; a custom prefix keeps the form.
func TestMessagingNewChannelNames(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	if !regexp.MustCompile(`^[0-9a-f]{12}$`).MatchString(a.ClientID()) {
		t.Fatalf("ClientID %q is not 12 lowercase hex", a.ClientID())
	}
	if a.ClientID() == b.ClientID() {
		t.Fatalf("two layers share client id %s", a.ClientID())
	}
	seen := map[string]bool{}
	for i := 0; i < 50; i++ {
		ch := msgNewChannel(t, a)
		m := msgProcessName.FindStringSubmatch(ch)
		if m == nil {
			t.Fatalf("NewChannel returned %q, want specific.<12 hex>!<32 hex>", ch)
		}
		if m[1] != a.ClientID() {
			t.Fatalf("name %q carries id %s, want the ClientID %s", ch, m[1], a.ClientID())
		}
		if err := ValidateChannelName(ch); err != nil {
			t.Fatalf("NewChannel returned an invalid name: %v", err)
		}
		if !IsProcessChannel(ch) {
			t.Fatalf("%q is not a process channel", ch)
		}
		if seen[ch] {
			t.Fatalf("NewChannel returned %q twice", ch)
		}
		seen[ch] = true
	}
	if chB := msgNewChannel(t, b); msgProcessName.FindStringSubmatch(chB)[1] != b.ClientID() {
		t.Fatalf("b's name %q does not carry b's id %s", chB, b.ClientID())
	}

	foo, err := a.NewChannel(ctxT(t, 5*time.Second), "foo")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^foo\.` + a.ClientID() + `![0-9a-f]{32}$`).MatchString(foo) {
		t.Fatalf("NewChannel(foo) returned %q", foo)
	}
	msgSend(t, b, foo, map[string]any{"type": "custom.prefix"})
	if got := msgRecv(t, a, foo); got["type"] != "custom.prefix" {
		t.Fatalf("custom prefix channel: got %v", got)
	}
	var ne *NameError
	if _, err := a.NewChannel(ctxT(t, time.Second), "bad prefix"); !errors.As(err, &ne) {
		t.Fatalf("NewChannel(\"bad prefix\"): want *NameError, got %v", err)
	}
}

// Ref 3, S1: the first receive of a plain channel subscribes and confirms before it waits, so a
// send made after StartReceive returned a pending receive arrives.
func TestMessagingPlainChannelReceiveThenSend(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	out, _ := msgStart(t, a, "test-channel")
	msgSend(t, b, "test-channel", map[string]any{"type": "hello", "n": 1})
	if r := msgAwait(t, out, "plain channel"); r.m["type"] != "hello" {
		t.Fatalf("got %v", r.m)
	}
}

// Ref 4: one group_send reaches every member in every Layer (2 members in A, 1 in B, sender C).
func TestMessagingGroupSendReachesEveryMember(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	c := connect(t, testConfig(nil, s.url()))
	a1, a2, b1 := msgNewChannel(t, a), msgNewChannel(t, a), msgNewChannel(t, b)
	msgGroupAdd(t, a, "room", a1)
	msgGroupAdd(t, a, "room", a2)
	msgGroupAdd(t, b, "room", b1)

	msgGroupSend(t, c, "room", map[string]any{"type": "chat", "text": "to all"})
	for _, x := range []struct {
		l  *Layer
		ch string
	}{{a, a1}, {a, a2}, {b, b1}} {
		if got := msgRecv(t, x.l, x.ch); got["text"] != "to all" {
			t.Fatalf("%s got %v", x.ch, got)
		}
	}
	for _, x := range []struct {
		l  *Layer
		ch string
	}{{a, a1}, {a, a2}, {b, b1}} {
		if n := msgQueued(x.l, x.ch); n != 0 {
			t.Fatalf("%s holds %d more message(s); each member must get exactly one", x.ch, n)
		}
	}
}

// A group larger than fanOutChunk is delivered in chunks, the lock let go between them: every
// member still gets every message once and in order, whether its receive waited (a handoff
// delivered between chunks) or the message waited in its mailbox.
func TestMessagingGroupFanOutInChunks(t *testing.T) { msgFanOutInChunks(t, nil) }

// msgFanOutInChunks is TestMessagingGroupFanOutInChunks; reading, if not nil, is called on the
// receiving layer before the messages are sent.
func msgFanOutInChunks(t *testing.T, reading func(*Layer)) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	c := connect(t, testConfig(nil, s.url()))
	members := make([]string, 3*fanOutChunk+10)
	waiting := map[string]<-chan msgResult{}
	for i := range members {
		members[i] = msgNewChannel(t, a)
		msgGroupAdd(t, a, "big", members[i])
		if i%2 == 0 {
			out, op := msgStart(t, a, members[i])
			msgAwaitListed(t, a, members[i], op)
			waiting[members[i]] = out
		}
	}
	if reading != nil {
		reading(a)
	}
	for n := range 3 {
		msgGroupSend(t, c, "big", map[string]any{"type": "chunk", "n": n})
	}
	for _, ch := range members {
		first := 0
		if out, ok := waiting[ch]; ok {
			if r := msgAwait(t, out, ch); r.err != nil || msgN(t, r.m) != 0 {
				t.Fatalf("%s: the waiting receive got %v, %v; want message 0", ch, r.m, r.err)
			}
			first = 1
		}
		for n := first; n < 3; n++ {
			if got := msgN(t, msgRecv(t, a, ch)); got != int64(n) {
				t.Fatalf("%s got message %d, want %d", ch, got, n)
			}
		}
		if left := msgQueued(a, ch); left != 0 {
			t.Fatalf("%s holds %d more message(s); each member must get each message once", ch, left)
		}
	}
}

// Members that leave a large group while messages fan out to it (the lock is let go between
// chunks) get a prefix of the messages, in order, and nothing after they left; the others get
// every message.
func TestMessagingGroupFanOutWhileMembersLeave(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	c := connect(t, testConfig(nil, s.url()))
	const messages = 20
	members := make([]string, 2*fanOutChunk+20)
	for i := range members {
		members[i] = msgNewChannel(t, a)
		msgGroupAdd(t, a, "leaving", members[i])
	}
	leavers := members[:fanOutChunk]
	left := make(chan struct{})
	go func() {
		defer close(left)
		for _, ch := range leavers {
			if err := a.GroupDiscard("leaving", ch); err != nil {
				t.Errorf("GroupDiscard(%s): %v", ch, err)
			}
		}
	}()
	for n := range messages {
		msgGroupSend(t, c, "leaving", map[string]any{"type": "chunk", "n": n})
	}
	<-left
	stayed := members[fanOutChunk:]
	waitFor(t, 10*time.Second, "every message at the members that stayed", func() bool {
		for _, ch := range stayed {
			if msgQueued(a, ch) != messages {
				return false
			}
		}
		return true
	})
	for i, ch := range members {
		want := msgQueued(a, ch)
		if i >= fanOutChunk && want != messages {
			t.Fatalf("%s stayed in the group but holds %d of %d messages", ch, want, messages)
		}
		for n := range want {
			if got := msgN(t, msgRecv(t, a, ch)); got != int64(n) {
				t.Fatalf("%s got message %d as its message %d: a member gets a prefix, in order", ch, got, n)
			}
		}
	}
}

// Members that leave while a message fans out to their group are skipped: with every member but
// one discarded after the first chunk, the first chunk has the message, and the one that
// stayed has it wherever it was.
func TestMessagingGroupFanOutSkipsWhoLeft(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	c := connect(t, testConfig(nil, s.url()))
	members := make([]string, 2*fanOutChunk+5)
	for i := range members {
		members[i] = msgNewChannel(t, a)
		msgGroupAdd(t, a, "skipping", members[i])
	}
	var once sync.Once
	a.betweenChunks = func() { // the dispatcher's goroutine, without the lock
		once.Do(func() {
			for _, ch := range members[1:] { // members[0] stays: the group lives on
				if err := a.GroupDiscard("skipping", ch); err != nil {
					t.Errorf("GroupDiscard(%s): %v", ch, err)
				}
			}
		})
	}
	msgGroupSend(t, c, "skipping", map[string]any{"type": "chunk", "n": 0})
	holding := func() (n int) {
		for _, ch := range members {
			n += msgQueued(a, ch)
		}
		return n
	}
	waitFor(t, 10*time.Second, "the first chunk's deliveries", func() bool { return holding() >= fanOutChunk })
	waitFor(t, 10*time.Second, "the member that stayed", func() bool { return msgQueued(a, members[0]) == 1 })
	time.Sleep(msgQuiet) // and no more
	if n := holding(); n != fanOutChunk && n != fanOutChunk+1 {
		t.Fatalf("%d members hold the message; want the first chunk's %d and the one that stayed", n, fanOutChunk)
	}
}

// Ref 5, S9: members of one group in one Layer get independent decoded maps; mutating one
// (including nested values and byte slices) leaves the other intact.
func TestMessagingGroupMembersGetIndependentMaps(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	c1, c2 := msgNewChannel(t, a), msgNewChannel(t, a)
	msgGroupAdd(t, a, "room", c1)
	msgGroupAdd(t, a, "room", c2)
	want := map[string]any{
		"type":   "chat",
		"data":   []byte{1, 2, 3},
		"nested": map[string]any{"k": "v"},
		"list":   []any{"x", "y"},
	}
	msgGroupSend(t, b, "room", want)

	m1 := msgRecv(t, a, c1)
	m1["type"] = "mutated"
	m1["data"].([]byte)[0] = 99
	m1["nested"].(map[string]any)["k"] = "changed"
	m1["list"].([]any)[0] = "changed"
	m1["extra"] = true

	m2 := msgRecv(t, a, c2) // decoded after m1 was mutated: a shared body or map would show it
	if !reflect.DeepEqual(m2, want) {
		t.Fatalf("second member got %#v, want %#v", m2, want)
	}
	if reflect.ValueOf(m1).Pointer() == reflect.ValueOf(m2).Pointer() {
		t.Fatal("two members got the same map object")
	}
}

// Ref 6: 20 direct sends and 20 group_sends each arrive in order.
func TestMessagingOrderWithinOneSubscription(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	msgGroupAdd(t, a, "room", ch)
	const n = 20
	for i := 0; i < n; i++ {
		msgSend(t, b, ch, map[string]any{"type": "direct", "n": i})
	}
	for i := 0; i < n; i++ {
		if got := msgN(t, msgRecv(t, a, ch)); got != int64(i) {
			t.Fatalf("direct: message %d arrived as number %d", i, got)
		}
	}
	for i := 0; i < n; i++ {
		msgGroupSend(t, b, "room", map[string]any{"type": "group", "n": i})
	}
	for i := 0; i < n; i++ {
		if got := msgN(t, msgRecv(t, a, ch)); got != int64(i) {
			t.Fatalf("group: message %d arrived as number %d", i, got)
		}
	}
}

// S10: one mailbox fed by three subscriptions (the process subject and two group subjects);
// messages sent alternately by one sender via Send and two GroupSends arrive strictly in order.
func TestMessagingOrderAcrossSubscriptions(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	msgGroupAdd(t, a, "room1", ch)
	msgGroupAdd(t, a, "room2", ch)
	if got := a.Stats().Subscriptions; got != 3 {
		t.Fatalf("want 3 subscriptions (process, room1, room2), got %d", got)
	}
	const n = 60
	for i := 0; i < n; i++ {
		msg := map[string]any{"type": "order", "n": i}
		switch i % 3 {
		case 0:
			msgSend(t, b, ch, msg)
		case 1:
			msgGroupSend(t, b, "room1", msg)
		case 2:
			msgGroupSend(t, b, "room2", msg)
		}
	}
	for i := 0; i < n; i++ {
		if got := msgN(t, msgRecv(t, a, ch)); got != int64(i) {
			t.Fatalf("message %d arrived as number %d: order across subscriptions broken", i, got)
		}
	}
	msgNothing(t, a, ch)

	// The same for a plain channel that is a group member: its channel subject and the group
	// subject (in the channel's queue group) feed one mailbox.
	msgGroupAdd(t, a, "room3", "plain")
	for i := 0; i < n; i++ {
		msg := map[string]any{"type": "order", "n": i}
		if i%2 == 0 {
			msgSend(t, b, "plain", msg)
		} else {
			msgGroupSend(t, b, "room3", msg)
		}
	}
	for i := 0; i < n; i++ {
		if got := msgN(t, msgRecv(t, a, "plain")); got != int64(i) {
			t.Fatalf("plain channel: message %d arrived as number %d", i, got)
		}
	}
}

// Ref 8 and group no-ops: group_add twice gives one delivery per group_send; group_discard
// stops delivery; discarding a non-member and sending to an unknown group are not errors.
func TestMessagingGroupAddDiscard(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	msgGroupAdd(t, a, "room", ch)
	subs := a.Stats().Subscriptions
	msgGroupAdd(t, a, "room", ch) // idempotent
	if st := a.Stats(); st.Subscriptions != subs || st.Groups != 1 {
		t.Fatalf("second group_add changed state: %d subscriptions (was %d), %d groups", st.Subscriptions, subs, st.Groups)
	}

	// One sender, one receiving connection: the direct sentinel arrives after anything the group
	// send produced, so "the next message is the sentinel" proves there was no second copy.
	msgGroupSend(t, b, "room", map[string]any{"type": "g", "n": 1})
	msgSend(t, b, ch, map[string]any{"type": "sentinel", "n": 2})
	if got := msgRecv(t, a, ch); got["type"] != "g" {
		t.Fatalf("want the group message, got %v", got)
	}
	if got := msgRecv(t, a, ch); got["type"] != "sentinel" {
		t.Fatalf("group_add twice delivered twice: got %v", got)
	}

	if err := a.GroupDiscard("room", ch); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.Groups != 0 || st.Subscriptions != 1 {
		t.Fatalf("after discard: %d groups, %d subscriptions; want 0 and 1 (process)", st.Groups, st.Subscriptions)
	}
	msgGroupSend(t, b, "room", map[string]any{"type": "g", "n": 3})
	msgSend(t, b, ch, map[string]any{"type": "sentinel", "n": 4})
	if got := msgRecv(t, a, ch); got["type"] != "sentinel" {
		t.Fatalf("group_discard did not stop delivery: got %v", got)
	}
	msgGroupSend(t, b, "room", map[string]any{"type": "g", "n": 5})
	msgNothing(t, a, ch)

	if err := a.GroupDiscard("room", ch); err != nil {
		t.Fatalf("discard of a non-member: %v", err)
	}
	if err := a.GroupDiscard("never-joined", "plain-channel"); err != nil {
		t.Fatalf("discard from an unknown group: %v", err)
	}
	if err := b.GroupSend(ctxT(t, time.Second), "nobody-here", map[string]any{"type": "x"}); err != nil {
		t.Fatalf("group_send to an unknown group: %v", err)
	}
}

// Ref 11, S2: a full mailbox drops new messages, not old ones.
func TestMessagingFullMailboxDropsNewMessages(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Capacity = 2
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	for i := 0; i < 5; i++ {
		msgSend(t, b, ch, map[string]any{"type": "x", "n": i})
	}
	waitFor(t, 5*time.Second, "3 capacity drops", func() bool { return a.Stats().Dropped.Capacity == 3 })
	for i := 0; i < 2; i++ {
		if got := msgN(t, msgRecv(t, a, ch)); got != int64(i) {
			t.Fatalf("want message %d, got %d: the full mailbox dropped old messages", i, got)
		}
	}
	msgNothing(t, a, ch)
	if got := a.Stats().Dropped.Capacity; got != 3 {
		t.Fatalf("Dropped.Capacity = %d, want 3", got)
	}
}

// Ref 12, S3: 18 capacity drops give exactly one "is full" warning; after one receive and one
// successful send, exactly one "has room again" warning with the count.
func TestMessagingCapacityWarnings(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	cfg := testConfig(rec, s.url())
	cfg.Capacity = 2
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	for i := 0; i < 20; i++ {
		msgSend(t, b, ch, map[string]any{"type": "x", "n": i})
	}
	waitFor(t, 5*time.Second, "18 capacity drops", func() bool { return a.Stats().Dropped.Capacity == 18 })
	if n := rec.count("is full"); n != 1 {
		t.Fatalf("want exactly one \"is full\" warning, got %d:\n%s", n, rec.all())
	}
	if n := rec.count(fmt.Sprint(int(LevelWarning)), "is full", ch); n != 1 {
		t.Fatalf("the \"is full\" warning must be a WARNING naming %s:\n%s", ch, rec.all())
	}
	if n := rec.count("has room again"); n != 0 {
		t.Fatalf("\"has room again\" before any room:\n%s", rec.all())
	}

	if got := msgN(t, msgRecv(t, a, ch)); got != 0 {
		t.Fatalf("want message 0, got %d", got)
	}
	msgSend(t, b, ch, map[string]any{"type": "x", "n": 20})
	waitFor(t, 5*time.Second, "\"has room again\"", func() bool { return rec.count("has room again") > 0 })
	if n := rec.count("has room again", "18 message(s)", ch); n != 1 {
		t.Fatalf("want one \"has room again\" warning with \"18 message(s)\" naming %s:\n%s", ch, rec.all())
	}
	for _, want := range []int64{1, 20} {
		if got := msgN(t, msgRecv(t, a, ch)); got != want {
			t.Fatalf("want message %d, got %d", want, got)
		}
	}
	if n := rec.count("has room again"); n != 1 {
		t.Fatalf("want exactly one \"has room again\", got %d:\n%s", n, rec.all())
	}
	if n := rec.count("is full"); n != 1 {
		t.Fatalf("want still one \"is full\", got %d:\n%s", n, rec.all())
	}
	if got := a.Stats().Dropped.Capacity; got != 18 {
		t.Fatalf("Dropped.Capacity = %d, want 18", got)
	}
}

// Ref 13: a plain channel read by three Layers: one send completes exactly one read.
func TestMessagingPlainChannelOneReaderAcrossLayers(t *testing.T) {
	s := startServer(t)
	out := make(chan msgResult, 8)
	var readers []*Layer
	for i := 0; i < 3; i++ {
		l := connect(t, testConfig(nil, s.url()))
		msgStartInto(t, l, "worker-queue", fmt.Sprintf("layer %d", i), out)
		readers = append(readers, l)
	}
	sender := connect(t, testConfig(nil, s.url()))
	msgSend(t, sender, "worker-queue", map[string]any{"type": "job", "n": 1})
	first := msgAwait(t, out, "worker-queue")
	if msgN(t, first.m) != 1 {
		t.Fatalf("got %v", first.m)
	}
	msgNoResult(t, out, "one send, three readers")
	for i, l := range readers {
		if n := msgQueued(l, "worker-queue"); n > 0 {
			t.Fatalf("layer %d also holds %d message(s)", i, n)
		}
	}
}

// Ref 14: two concurrent readers of a plain channel in one Layer share it: one send completes
// exactly one of them, the next send the other.
func TestMessagingPlainChannelTwoReadersOneLayer(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	out := make(chan msgResult, 4)
	msgStartInto(t, a, "shared", "reader 1", out)
	msgStartInto(t, a, "shared", "reader 2", out)
	if got := a.Stats().Subscriptions; got != 1 {
		t.Fatalf("two readers of one plain channel: %d subscriptions, want 1", got)
	}
	msgSend(t, b, "shared", map[string]any{"type": "job", "n": 1})
	first := msgAwait(t, out, "first send")
	msgNoResult(t, out, "one send, two readers")
	msgSend(t, b, "shared", map[string]any{"type": "job", "n": 2})
	second := msgAwait(t, out, "second send")
	if first.from == second.from {
		t.Fatalf("%s completed twice", first.from)
	}
	if msgN(t, first.m) != 1 || msgN(t, second.m) != 2 {
		t.Fatalf("got %v then %v", first.m, second.m)
	}
}

// A group's fan-out lists its members once and reuses the list until they change: a member that
// joins after a fan-out gets the next message, and one that left does not.
func TestMessagingGroupSendFollowsMembershipChanges(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	first, second, later := msgNewChannel(t, a), msgNewChannel(t, a), msgNewChannel(t, a)
	msgGroupAdd(t, a, "room", first)
	msgGroupAdd(t, a, "room", second)
	msgGroupSend(t, b, "room", map[string]any{"type": "g", "n": 1})
	for _, ch := range []string{first, second} {
		if got := msgRecv(t, a, ch); msgN(t, got) != 1 {
			t.Fatalf("%s: want message 1, got %v", ch, got)
		}
	}

	msgGroupAdd(t, a, "room", later)
	msgGroupSend(t, b, "room", map[string]any{"type": "g", "n": 2})
	for _, ch := range []string{first, second, later} {
		if got := msgRecv(t, a, ch); msgN(t, got) != 2 {
			t.Fatalf("%s: want message 2 after a member joined, got %v", ch, got)
		}
	}

	if err := a.GroupDiscard("room", second); err != nil {
		t.Fatal(err)
	}
	msgGroupSend(t, b, "room", map[string]any{"type": "g", "n": 3})
	msgSend(t, b, second, map[string]any{"type": "sentinel"})
	for _, ch := range []string{first, later} {
		if got := msgRecv(t, a, ch); msgN(t, got) != 3 {
			t.Fatalf("%s: want message 3 after a member left, got %v", ch, got)
		}
	}
	if got := msgRecv(t, a, second); got["type"] != "sentinel" {
		t.Fatalf("a member that left got %v", got)
	}
}

// The process-channel members of a group get a group message in the order they joined, in a
// group past fanOutChunk and after members left (the holes they leave squeezed out) and joined
// again (at the end).
func TestMessagingGroupMembersGetAMessageInTheOrderTheyJoined(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	members := make([]string, 3*fanOutChunk)
	for i := range members {
		members[i] = msgNewChannel(t, a)
		msgGroupAdd(t, a, "queue", members[i])
	}
	var stay, rejoin []string
	for i, ch := range members {
		switch i % 3 {
		case 0:
			stay = append(stay, ch)
			continue
		case 1:
			rejoin = append(rejoin, ch)
		}
		if err := a.GroupDiscard("queue", ch); err != nil {
			t.Fatal(err)
		}
	}
	for _, ch := range rejoin {
		msgGroupAdd(t, a, "queue", ch)
	}
	want := append(stay, rejoin...)
	var mu sync.Mutex
	var order []string
	for _, ch := range want {
		_, op, err := a.StartReceive(ch, func(m Message, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("receive on %s: %v", m.Channel, err)
			}
			order = append(order, m.Channel)
		})
		if err != nil || op == nil {
			t.Fatalf("StartReceive(%s): %v, %v; want a pending receive", ch, op, err)
		}
	}
	msgGroupSend(t, b, "queue", map[string]any{"type": "g"})
	waitFor(t, 5*time.Second, "every member's message", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == len(want)
	})
	mu.Lock()
	defer mu.Unlock()
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("delivery %d of %d went to %s, not to %s: not the order the members joined", i, len(want), order[i], want[i])
		}
	}
}

// Ref 34, SPEC section 3 row 4: a plain channel read by two Layers that both group_add it gets a
// group message once (queue group <prefix>.ch.<c> on the group subject).
func TestMessagingGroupToSharedPlainChannelOneReader(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	c := connect(t, testConfig(nil, s.url()))
	out := make(chan msgResult, 4)
	pending := map[string]*Op{}
	for i, l := range []*Layer{a, b} {
		msgGroupAdd(t, l, "jobs", "shared-worker")
		label := fmt.Sprintf("layer %d", i)
		pending[label] = msgStartInto(t, l, "shared-worker", label, out)
	}
	msgGroupSend(t, c, "jobs", map[string]any{"type": "job", "n": 0})
	first := msgAwait(t, out, "group message")
	msgNoResult(t, out, "one group message, two readers")
	for label, p := range pending {
		if label != first.from && !p.Cancel() {
			t.Fatalf("%s's receive was no longer pending", label)
		}
	}

	// Ten more: every one is delivered exactly once across both layers (the channel stays
	// subscribed while it is in the group, with no reader waiting).
	const more = 10
	for i := 1; i <= more; i++ {
		msgGroupSend(t, c, "jobs", map[string]any{"type": "job", "n": i})
	}
	// All arrived before either layer is drained: one that comes after the drain would be missed.
	waitFor(t, 5*time.Second, "the ten messages in the two mailboxes", func() bool {
		return msgQueued(a, "shared-worker")+msgQueued(b, "shared-worker") == more
	})
	seen := map[int64]int{msgN(t, first.m): 1}
	for _, l := range []*Layer{a, b} {
		for {
			m, err := l.Receive(ctxT(t, msgQuiet), "shared-worker")
			if err != nil {
				break
			}
			seen[msgN(t, m)]++
		}
	}
	for i := int64(0); i <= more; i++ {
		if seen[i] != 1 {
			t.Fatalf("message %d delivered %d times (all: %v)", i, seen[i], seen)
		}
	}
}

// Ref 15, 40: concurrent new_channel calls share one process subscription (in the Layer and on
// the server), and sends to 20 channels are each routed to the right one, once.
func TestMessagingNewChannelsShareOneSubscription(t *testing.T) {
	s := startServer(t)
	a := connect(t, msgNamed(nil, "msg-a", s.url()))
	b := connect(t, testConfig(nil, s.url()))
	names := make([]string, 20)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ch, err := a.NewChannel(ctxT(t, 5*time.Second), "")
			names[i] = ch
			errs <- err
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := a.Stats().Subscriptions; got != 1 {
		t.Fatalf("8 concurrent NewChannel: %d subscriptions, want 1", got)
	}
	for i := 8; i < len(names); i++ {
		names[i] = msgNewChannel(t, a)
	}
	st := a.Stats()
	if st.Subscriptions != 1 || st.Mailboxes != len(names) {
		t.Fatalf("20 channels: %d subscriptions (want 1), %d mailboxes (want 20)", st.Subscriptions, st.Mailboxes)
	}
	subs := msgConnSubs(t, s, "msg-a")
	if len(subs) != 1 || subs[0].Subject != "channels.pc.specific."+a.ClientID() || subs[0].Queue != "" {
		t.Fatalf("server-side subscriptions of the layer: %+v; want one on channels.pc.specific.%s", subs, a.ClientID())
	}

	for i, ch := range names {
		msgSend(t, b, ch, map[string]any{"type": "routed", "n": i})
	}
	for i, ch := range names {
		if got := msgN(t, msgRecv(t, a, ch)); got != int64(i) {
			t.Fatalf("channel %d got the message for channel %d", i, got)
		}
	}
	msgNothing(t, a, names[0])
	for i, ch := range names {
		if n := msgQueued(a, ch); n != 0 {
			t.Fatalf("channel %d holds %d extra message(s)", i, n)
		}
	}
	if got := a.Stats().Dropped.NoMailbox; got != 0 {
		t.Fatalf("Dropped.NoMailbox = %d", got)
	}
}

// Ref 16, S2: channel_capacity patterns set the capacity of matching mailboxes; others keep the
// default capacity.
func TestMessagingChannelCapacityPatterns(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Capacity = 4
	cfg.ChannelCapacity = []CapacityRule{{Pattern: "specific.*", Capacity: 2}}
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))

	ch := msgNewChannel(t, a)
	msgGroupAdd(t, a, "keep", "plain") // subscribes the plain channel without reading it
	for i := 0; i < 6; i++ {
		msgSend(t, b, ch, map[string]any{"type": "pc", "n": i})
	}
	waitFor(t, 5*time.Second, "4 drops on the process channel", func() bool { return a.Stats().Dropped.Capacity == 4 })
	for i := 0; i < 6; i++ {
		msgSend(t, b, "plain", map[string]any{"type": "plain", "n": i})
	}
	waitFor(t, 5*time.Second, "2 drops on the plain channel", func() bool { return a.Stats().Dropped.Capacity == 6 })

	for i := 0; i < 2; i++ {
		if got := msgN(t, msgRecv(t, a, ch)); got != int64(i) {
			t.Fatalf("process channel: want %d, got %d", i, got)
		}
	}
	msgNothing(t, a, ch)
	for i := 0; i < 4; i++ {
		if got := msgN(t, msgRecv(t, a, "plain")); got != int64(i) {
			t.Fatalf("plain channel: want %d, got %d", i, got)
		}
	}
	msgNothing(t, a, "plain")
}

// Ref 10, S4: a message that waited longer than expiry is skipped; the fresh one is returned.
func TestMessagingExpiredMessagesSkipped(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Expiry = 50 * time.Millisecond
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	msgSend(t, b, ch, map[string]any{"type": "stale"})
	waitFor(t, 5*time.Second, "the stale message to arrive", func() bool {
		return msgQueued(a, ch) == 1 || a.Stats().Dropped.Expired == 1
	})
	time.Sleep(150 * time.Millisecond) // let it age past expiry (not an assertion)
	out, _ := msgStart(t, a, ch)       // must wait: the stale message is not handed out
	msgSend(t, b, ch, map[string]any{"type": "fresh"})
	if r := msgAwait(t, out, "fresh message"); r.m["type"] != "fresh" {
		t.Fatalf("got %v", r.m)
	}
	if got := a.Stats().Dropped.Expired; got != 1 {
		t.Fatalf("Dropped.Expired = %d, want 1", got)
	}
}

// Ref 17, S2/S4: an expired entry does not hold the capacity: with capacity 1, a fresh message
// after an expired one is kept and received.
func TestMessagingExpiredDoNotHoldCapacity(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Capacity = 1
	cfg.Expiry = 200 * time.Millisecond
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	msgSend(t, b, ch, map[string]any{"type": "stale"})
	waitFor(t, 5*time.Second, "the stale message to arrive", func() bool { return msgQueued(a, ch) == 1 })
	time.Sleep(250 * time.Millisecond) // let it age past expiry (not an assertion)
	msgSend(t, b, ch, map[string]any{"type": "fresh"})
	if got := msgRecv(t, a, ch); got["type"] != "fresh" {
		t.Fatalf("got %v", got)
	}
	st := a.Stats()
	if st.Dropped.Capacity != 0 || st.Dropped.Expired != 1 {
		t.Fatalf("Dropped.Capacity = %d (want 0), Dropped.Expired = %d (want 1)", st.Dropped.Capacity, st.Dropped.Expired)
	}
}

// Ref 72, S2: enqueue on a full mailbox reclaims expired entries first (unit on enqueue, with
// controlled arrival times so the housekeeping sweep cannot do it instead).
func TestMessagingEnqueueReclaimsExpired(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Expiry = 200 * time.Millisecond
	l := connect(t, cfg)
	t0 := time.Now()
	mb := newMailbox("specific.000000000000!unit", 3, t0) // not in l.mailboxes: no sweep sees it
	l.mu.Lock()
	for i := 0; i < 3; i++ {
		l.enqueue(mb, []byte{byte(i)}, t0)
	}
	l.enqueue(mb, []byte{3}, t0.Add(50*time.Millisecond))
	afterFull, droppedFull := len(mb.entries), l.counters.capacity.Load()
	l.enqueue(mb, []byte{4}, t0.Add(250*time.Millisecond))
	afterReclaim := len(mb.entries)
	var kept []byte
	if afterReclaim == 1 {
		kept = mb.entries[0].body
	}
	l.mu.Unlock()
	if afterFull != 3 || droppedFull != 1 {
		t.Fatalf("a full mailbox of fresh entries: %d entries, %d dropped; want 3 and 1", afterFull, droppedFull)
	}
	if afterReclaim != 1 || !bytes.Equal(kept, []byte{4}) {
		t.Fatalf("after expiry: %d entries (%v); want only the new one", afterReclaim, kept)
	}
	st := l.Stats()
	if st.Dropped.Expired != 3 || st.Dropped.Capacity != 1 {
		t.Fatalf("Dropped.Expired = %d (want 3), Dropped.Capacity = %d (want 1)", st.Dropped.Expired, st.Dropped.Capacity)
	}
}

// S7, ref 35: body plus headers above max_payload is refused before anything is sent with a
// *MessageTooLargeError; exactly at the limit it goes; the connection stays up.
func TestMessagingMessageTooLarge(t *testing.T) {
	const maxPayload = 1024
	s := startServer(t, func(o *server.Options) { o.MaxPayload = maxPayload })
	rec := &logSink{}
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(rec, s.url()))
	ch := msgNewChannel(t, a)
	msgGroupAdd(t, a, "room", ch)
	hdr := len("NATS/1.0\r\n") + len(ChannelHeader+": "+ch+"\r\n") + len("\r\n")

	check := func(err error, size int) {
		t.Helper()
		if !errors.Is(err, ErrMessageTooLarge) {
			t.Fatalf("want ErrMessageTooLarge, got %v", err)
		}
		var tl *MessageTooLargeError
		if !errors.As(err, &tl) {
			t.Fatalf("want *MessageTooLargeError, got %T", err)
		}
		if tl.Size != int64(size) || tl.MaxPayload != maxPayload {
			t.Fatalf("sizes: got %d over %d, want %d over %d", tl.Size, tl.MaxPayload, size, maxPayload)
		}
	}
	ctx := ctxT(t, 5*time.Second)
	// The reference test: max_payload - 60 bytes of body; the header pushes it over.
	check(b.Send(ctx, ch, msgSizedMessage(t, maxPayload-60)), maxPayload-60+hdr)
	check(b.Send(ctx, ch, msgSizedMessage(t, maxPayload-hdr+1)), maxPayload+1)
	check(b.GroupSend(ctx, "room", msgSizedMessage(t, maxPayload+1)), maxPayload+1)
	if st := b.Stats(); st.Published != 0 || !st.Connected {
		t.Fatalf("after refusals: published %d, connected %v", st.Published, st.Connected)
	}

	exact := msgSizedMessage(t, maxPayload-hdr)
	msgSend(t, b, ch, exact) // exactly at the limit
	exactGroup := msgSizedMessage(t, maxPayload)
	msgGroupSend(t, b, "room", exactGroup)
	msgSend(t, b, ch, map[string]any{"type": "small"})

	// Nothing refused went out: the next messages are the ones that were accepted, in order.
	if got := msgRecv(t, a, ch); !reflect.DeepEqual(got, exact) {
		t.Fatalf("want the at-limit direct message (%d-byte data), got type %v", len(exact["b"].([]byte)), got["type"])
	}
	if got := msgRecv(t, a, ch); !reflect.DeepEqual(got, exactGroup) {
		t.Fatalf("want the at-limit group message, got type %v", got["type"])
	}
	if got := msgRecv(t, a, ch); got["type"] != "small" {
		t.Fatalf("want the small message, got %v", got["type"])
	}
	st := b.Stats()
	if !st.Connected || st.Reconnects != 0 || st.Recoveries != 0 || st.Published != 3 {
		t.Fatalf("sender after the refusals: connected %v, reconnects %d, recoveries %d, published %d (want 3)",
			st.Connected, st.Reconnects, st.Recoveries, st.Published)
	}
	if n := rec.count("disconnected"); n != 0 {
		t.Fatalf("the sender was disconnected:\n%s", rec.all())
	}
}

// Ref 36, S8, SPEC section 3: invalid names give *NameError; the reserved key at top level
// gives *FrameError; nothing is published.
func TestMessagingInvalidNamesAndReservedKey(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	raw := msgRawSub(t, rawConn(t, s.url()), "channels.>")
	ctx := ctxT(t, 5*time.Second)
	ok := map[string]any{"type": "x"}

	wantName := func(what string, err error, kind string) {
		t.Helper()
		var ne *NameError
		if !errors.As(err, &ne) {
			t.Fatalf("%s: want *NameError, got %v", what, err)
		}
		if ne.Kind != kind {
			t.Fatalf("%s: NameError kind %q, want %q", what, ne.Kind, kind)
		}
	}
	wantName("GroupSend(bad*name)", a.GroupSend(ctx, "bad*name", ok), "group")
	for _, g := range []string{"bad>name", "a..b", ".g", "g.", "has space", ""} {
		wantName("GroupSend("+g+")", a.GroupSend(ctx, g, ok), "group")
		wantName("GroupAdd("+g+")", a.GroupAdd(ctx, g, "valid"), "group")
	}
	for _, ch := range []string{"has space", "a..b", ".x", "x.", "a*b", "a>b", "", "tab\tx", "nl\n"} {
		wantName("Send("+ch+")", a.Send(ctx, ch, ok), "channel")
		_, err := a.Receive(ctx, ch)
		wantName("Receive("+ch+")", err, "channel")
		wantName("GroupAdd(g, "+ch+")", a.GroupAdd(ctx, "g", ch), "channel")
	}

	reserved := map[string]any{"type": "x", ReservedKey: "specific.abc!def"}
	var fe *FrameError
	if err := a.Send(ctx, "valid", reserved); !errors.As(err, &fe) {
		t.Fatalf("Send with %s: want *FrameError, got %v", ReservedKey, err)
	}
	if err := a.GroupSend(ctx, "valid", reserved); !errors.As(err, &fe) {
		t.Fatalf("GroupSend with %s: want *FrameError, got %v", ReservedKey, err)
	}
	if st := a.Stats(); st.Published != 0 || st.Mailboxes != 0 || st.Subscriptions != 0 {
		t.Fatalf("refused calls left state: %+v", st)
	}

	msgSend(t, a, "valid", map[string]any{"type": "sentinel"})
	if m := msgRawNext(t, raw); m.Subject != "channels.ch.valid" || !bytes.Contains(m.Data, []byte("sentinel")) {
		t.Fatalf("a refused message went out: first frame on the wire is %s %q", m.Subject, m.Data)
	}
}

// S8: SendRaw and GroupSendRaw refuse bodies the other side could not decode (a nested int
// key, invalid UTF-8, a top-level array) with *FrameError, and send nothing.
func TestMessagingOutboundFrameValidation(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	raw := msgRawSub(t, rawConn(t, s.url()), "channels.>")
	ctx := ctxT(t, 5*time.Second)
	bad := map[string][]byte{
		"nested int key":      []byte("\x82\xa4type\xa1x\xa1a\x81\x01\xa1x"),
		"top-level int key":   []byte("\x81\x01\xa1x"),
		"invalid UTF-8":       []byte("\x81\xa1a\xa2\xff\xfe"),
		"invalid UTF-8 key":   []byte("\x81\xa2\xc3\x28\x01"),
		"top-level array":     []byte("\x91\x01"),
		"byte 0xc1":           []byte("\xc1"),
		"empty":               {},
		"trailing bytes":      []byte("\x80\x01"),
		"ext type":            []byte("\x81\xa1a\xd4\x01\x00"),
		"truncated":           []byte("\x81\xa1a\xa5ab"),
		"reserved key (raw)":  []byte("\x81\xb0__asgi_channel__\xa1x"),
		"nested int key deep": []byte("\x81\xa1a\x91\x81\xcd\x01\x00\xc0"),
	}
	for what, body := range bad {
		var fe *FrameError
		if err := a.SendRaw(ctx, "plain", body); !errors.As(err, &fe) {
			t.Fatalf("SendRaw(%s): want *FrameError, got %v", what, err)
		}
		if err := a.GroupSendRaw(ctx, "room", body); !errors.As(err, &fe) {
			t.Fatalf("GroupSendRaw(%s): want *FrameError, got %v", what, err)
		}
		if err := a.SendRaw(ctx, "specific.abcdef012345!x", body); !errors.As(err, &fe) {
			t.Fatalf("SendRaw(%s) to a process channel: want *FrameError, got %v", what, err)
		}
	}
	// Encodable by Go but not by the other side: an ext-typed value (time.Time).
	var fe *FrameError
	if err := a.Send(ctx, "plain", map[string]any{"type": "x", "at": time.Now()}); !errors.As(err, &fe) {
		t.Fatalf("Send with a time.Time (msgpack ext): want *FrameError, got %v", err)
	}
	if got := a.Stats().Published; got != 0 {
		t.Fatalf("Published = %d after refusals", got)
	}
	if err := a.SendRaw(ctx, "plain", []byte("\x81\xa4type\xa8sentinel")); err != nil {
		t.Fatal(err)
	}
	if m := msgRawNext(t, raw); m.Subject != "channels.ch.plain" || string(m.Data) != "\x81\xa4type\xa8sentinel" {
		t.Fatalf("a refused body went out: first frame on the wire is %s %q", m.Subject, m.Data)
	}
}

// Ref 37, SPEC section 3 body: every type the spec allows round-trips, with bytes as bytes; the
// wire forms are those of Python's msgpack.packb(use_bin_type=True).
func TestMessagingTypesRoundTrip(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	msg := map[string]any{
		"type":   "types",
		"bytes":  []byte{0x00, 0x01},
		"empty":  []byte{},
		"text":   "안녕 héllo 🚀",
		"big":    int64(1 << 62),
		"neg":    int64(-5),
		"float":  1.5,
		"list":   []any{1, "two", nil},
		"nested": map[string]any{"a": map[string]any{"b": []any{true, "c"}}},
		"none":   nil,
		"yes":    true,
		"no":     false,
	}
	msgSend(t, b, ch, msg)
	got := msgRecv(t, a, ch)

	if v, ok := got["bytes"].([]byte); !ok || !bytes.Equal(v, []byte{0, 1}) {
		t.Fatalf("bytes: got %T %v", got["bytes"], got["bytes"])
	}
	if v, ok := got["empty"].([]byte); !ok || len(v) != 0 {
		t.Fatalf("empty bytes: got %T %v", got["empty"], got["empty"])
	}
	if got["text"] != msg["text"] || got["type"] != "types" {
		t.Fatalf("text: got %#v", got["text"])
	}
	if v, ok := msgInt(got["big"]); !ok || v != 1<<62 {
		t.Fatalf("1<<62: got %T %v", got["big"], got["big"])
	}
	if v, ok := msgInt(got["neg"]); !ok || v != -5 {
		t.Fatalf("-5: got %T %v", got["neg"], got["neg"])
	}
	if v, ok := got["float"].(float64); !ok || v != 1.5 {
		t.Fatalf("1.5: got %T %v", got["float"], got["float"])
	}
	list, ok := got["list"].([]any)
	if !ok || len(list) != 3 {
		t.Fatalf("list: got %#v", got["list"])
	}
	if v, ok := msgInt(list[0]); !ok || v != 1 || list[1] != "two" || list[2] != nil {
		t.Fatalf("list: got %#v", list)
	}
	if !reflect.DeepEqual(got["nested"], msg["nested"]) {
		t.Fatalf("nested: got %#v", got["nested"])
	}
	if v, present := got["none"]; !present || v != nil {
		t.Fatalf("none: got %#v (present %v)", v, present)
	}
	if got["yes"] != true || got["no"] != false {
		t.Fatalf("bools: got %#v %#v", got["yes"], got["no"])
	}
	if len(got) != len(msg) {
		t.Fatalf("got %d keys, want %d: %#v", len(got), len(msg), got)
	}

	// Single-key messages have one encoding: compare the bytes with Python's packb output.
	wire := []struct {
		value any
		want  string
	}{
		{[]byte{0, 1}, "\xc4\x02\x00\x01"},
		{"é", "\xa2\xc3\xa9"},
		{int64(1 << 62), "\xcf\x40\x00\x00\x00\x00\x00\x00\x00"},
		{1, "\x01"},
		{-5, "\xfb"},
		{1.5, "\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00"},
		{nil, "\xc0"},
		{true, "\xc3"},
		{[]any{1, "two", nil}, "\x93\x01\xa3two\xc0"},
	}
	for _, w := range wire {
		msgSend(t, b, ch, map[string]any{"v": w.value})
		body, err := a.ReceiveRaw(ctxT(t, 5*time.Second), ch)
		if err != nil {
			t.Fatal(err)
		}
		if want := "\x81\xa1v" + w.want; string(body) != want {
			t.Fatalf("%#v on the wire: %x, want %x", w.value, body, want)
		}
	}
}

// SPEC section 3, ref 38/44: what a raw nats.go subscriber sees for each kind of traffic, with a
// custom prefix and with the default one.
func TestMessagingWireContractOutbound(t *testing.T) {
	s := startServer(t)
	cfgA := testConfig(nil, s.url())
	cfgA.Prefix = "app"
	a := connect(t, cfgA)
	cfgB := testConfig(nil, s.url())
	cfgB.Prefix = "app"
	b := connect(t, cfgB)
	d := connect(t, testConfig(nil, s.url())) // default prefix
	raw := rawConn(t, s.url())
	appSub := msgRawSub(t, raw, "app.>")
	defSub := msgRawSub(t, raw, "channels.>")

	ch := msgNewChannel(t, a)
	decode := func(m *nats.Msg) map[string]any {
		t.Helper()
		var v map[string]any
		if err := msgpack.Unmarshal(m.Data, &v); err != nil {
			t.Fatalf("body on %s is not a msgpack map: %v", m.Subject, err)
		}
		return v
	}

	msgSend(t, b, ch, map[string]any{"type": "pc", "text": "x"})
	m := msgRawNext(t, appSub)
	if want := "app.pc.specific." + a.ClientID(); m.Subject != want {
		t.Fatalf("process channel send: subject %q, want %q", m.Subject, want)
	}
	if len(m.Header) != 1 || len(m.Header[ChannelHeader]) != 1 || m.Header.Get("Channel") != ch {
		t.Fatalf("process channel send: headers %v, want exactly Channel: %s", m.Header, ch)
	}
	if v := decode(m); !reflect.DeepEqual(v, map[string]any{"type": "pc", "text": "x"}) {
		t.Fatalf("process channel body: %#v", v)
	}
	if subj, _ := ChannelSubject("app", ch); subj != m.Subject {
		t.Fatalf("ChannelSubject(app, %s) = %q, the layer used %q", ch, subj, m.Subject)
	}

	msgSend(t, b, "c", map[string]any{"type": "plain"})
	m = msgRawNext(t, appSub)
	if m.Subject != "app.ch.c" || len(m.Header) != 0 {
		t.Fatalf("plain send: subject %q headers %v, want app.ch.c and none", m.Subject, m.Header)
	}
	if v := decode(m); v["type"] != "plain" || len(v) != 1 {
		t.Fatalf("plain body: %#v", v)
	}

	msgGroupSend(t, b, "g", map[string]any{"type": "group"})
	m = msgRawNext(t, appSub)
	if m.Subject != "app.grp.g" || len(m.Header) != 0 {
		t.Fatalf("group send: subject %q headers %v, want app.grp.g and none", m.Subject, m.Header)
	}
	if v := decode(m); v["type"] != "group" || len(v) != 1 {
		t.Fatalf("group body: %#v", v)
	}
	if subj, _ := GroupSubject("app", "g"); subj != m.Subject {
		t.Fatalf("GroupSubject(app, g) = %q", subj)
	}

	msgSend(t, d, "c", map[string]any{"type": "default"})
	msgGroupSend(t, d, "g", map[string]any{"type": "default"})
	if m := msgRawNext(t, defSub); m.Subject != "channels.ch.c" {
		t.Fatalf("default prefix plain send: %q", m.Subject)
	}
	if m := msgRawNext(t, defSub); m.Subject != "channels.grp.g" {
		t.Fatalf("default prefix group send: %q", m.Subject)
	}
	select {
	case m := <-appSub:
		t.Fatalf("default-prefix traffic on %s", m.Subject)
	default:
	}
}

// SPEC section 3 table: the subscriptions and queue groups the layer holds on the server.
func TestMessagingWireContractSubscriptions(t *testing.T) {
	s := startServer(t)
	cfg := msgNamed(nil, "msg-subs", s.url())
	cfg.Prefix = "app"
	a := connect(t, cfg)
	ch := msgNewChannel(t, a)
	msgStart(t, a, "c")
	msgGroupAdd(t, a, "g", "c")
	msgGroupAdd(t, a, "g", ch)
	msgGroupAdd(t, a, "h", ch)

	type sub struct{ subject, queue string }
	var got []sub
	for _, d := range msgConnSubs(t, s, "msg-subs") {
		got = append(got, sub{d.Subject, d.Queue})
	}
	want := []sub{
		{"app.ch.c", "app.ch.c"},
		{"app.grp.g", ""},
		{"app.grp.g", "app.ch.c"},
		{"app.grp.h", ""},
		{"app.pc.specific." + a.ClientID(), ""},
	}
	less := func(x []sub) func(i, j int) bool {
		return func(i, j int) bool {
			return x[i].subject < x[j].subject || x[i].subject == x[j].subject && x[i].queue < x[j].queue
		}
	}
	sort.Slice(got, less(got))
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("server-side subscriptions:\n got %v\nwant %v", got, want)
	}
	if n := a.Stats().Subscriptions; n != len(want) {
		t.Fatalf("Stats().Subscriptions = %d, want %d", n, len(want))
	}
}

// SPEC section 3, interop: frames published the way a foreign process (the Python reference
// layer) would are received: a process channel frame with its Channel header, a plain channel
// frame and a group frame.
func TestMessagingWireContractInbound(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Prefix = "app"
	a := connect(t, cfg)
	raw := rawConn(t, s.url())
	ch := msgNewChannel(t, a)
	msgGroupAdd(t, a, "g", ch)
	// What Python's msgpack.packb({"type": "t", "n": 1, "b": b"\x00\x01"}, use_bin_type=True) gives.
	frame := []byte("\x83\xa4type\xa1t\xa1n\x01\xa1b\xc4\x02\x00\x01")
	want := map[string]any{"type": "t", "n": int8(1), "b": []byte{0, 1}}

	pm := nats.NewMsg("app.pc.specific." + a.ClientID())
	pm.Header.Set(ChannelHeader, ch)
	pm.Data = frame
	if err := raw.PublishMsg(pm); err != nil {
		t.Fatal(err)
	}
	if got := msgRecv(t, a, ch); !reflect.DeepEqual(got, want) {
		t.Fatalf("raw process channel frame: got %#v, want %#v", got, want)
	}

	if err := raw.Publish("app.grp.g", frame); err != nil {
		t.Fatal(err)
	}
	if got := msgRecv(t, a, ch); !reflect.DeepEqual(got, want) {
		t.Fatalf("raw group frame: got %#v", got)
	}

	out, _ := msgStart(t, a, "c")
	if err := raw.Publish("app.ch.c", frame); err != nil {
		t.Fatal(err)
	}
	if r := msgAwait(t, out, "raw plain channel frame"); !reflect.DeepEqual(r.m, want) {
		t.Fatalf("raw plain channel frame: got %#v", r.m)
	}
	if st := a.Stats(); st.Dropped.BadFrame != 0 || st.Dropped.NoMailbox != 0 || st.Delivered != 3 {
		t.Fatalf("stats after raw frames: %+v", st)
	}
}

// SPEC section 3 rows 2 and 4: a foreign worker that joins a plain channel's queue group (on the
// channel subject and on a group subject) shares the work with the layer: each message is
// delivered once overall.
func TestMessagingWireContractQueueGroups(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Prefix = "app"
	a := connect(t, cfg)
	pub := rawConn(t, s.url())
	worker := rawConn(t, s.url())

	run := func(what, subject, channel string, setup func()) {
		t.Helper()
		const n = 60
		rawGot := make(chan *nats.Msg, n+10)
		if _, err := worker.ChanQueueSubscribe(subject, "app.ch."+channel, rawGot); err != nil {
			t.Fatal(err)
		}
		if err := worker.Flush(); err != nil {
			t.Fatal(err)
		}
		setup()
		for i := 0; i < n; i++ {
			body, err := encodeMessage(map[string]any{"type": "job", "n": i})
			if err != nil {
				t.Fatal(err)
			}
			if err := pub.Publish(subject, body); err != nil {
				t.Fatal(err)
			}
		}
		if err := pub.Flush(); err != nil {
			t.Fatal(err)
		}
		seen := map[int64]int{}
		layerCount := 0
		for {
			m, err := a.Receive(ctxT(t, msgQuiet), channel)
			if err != nil {
				break
			}
			seen[msgN(t, m)]++
			layerCount++
		}
		waitFor(t, 5*time.Second, what+": all messages", func() bool { return layerCount+len(rawGot) >= n })
		rawCount := len(rawGot)
		for i := 0; i < rawCount; i++ {
			m := <-rawGot
			v, err := DecodeMessage(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			seen[msgN(t, v)]++
		}
		for i := int64(0); i < n; i++ {
			if seen[i] != 1 {
				t.Fatalf("%s: message %d delivered %d times (layer %d, raw %d)", what, i, seen[i], layerCount, rawCount)
			}
		}
		if layerCount == 0 || rawCount == 0 {
			t.Fatalf("%s: no sharing: layer got %d, the raw queue member %d", what, layerCount, rawCount)
		}
	}
	// group_add of a plain channel subscribes its channel subject too, and keeps it while
	// nobody is waiting to read.
	run("channel subject", "app.ch.work", "work", func() { msgGroupAdd(t, a, "keep", "work") })
	run("group subject", "app.grp.jobs", "work2", func() { msgGroupAdd(t, a, "jobs", "work2") })
}

// Ref 41, 42, S12: another Layer can send to a process channel; receive, StartReceive and
// group_add on it fail with ErrForeignChannel and leave no state behind.
func TestMessagingForeignProcessChannel(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	msgNewChannel(t, b) // b has a process subscription and mailbox of its own
	before := b.Stats()

	msgSend(t, b, ch, map[string]any{"type": "from b"})
	if got := msgRecv(t, a, ch); got["type"] != "from b" {
		t.Fatalf("got %v", got)
	}

	ctx := ctxT(t, 5*time.Second)
	wantForeign := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrForeignChannel) {
			t.Fatalf("%s: want ErrForeignChannel, got %v", what, err)
		}
		var fe *ForeignChannelError
		if !errors.As(err, &fe) {
			t.Fatalf("%s: want *ForeignChannelError, got %T", what, err)
		}
	}
	_, err := b.Receive(ctx, ch)
	wantForeign("Receive", err)
	_, err = b.ReceiveRaw(ctx, ch)
	wantForeign("ReceiveRaw", err)
	called := make(chan struct{}, 1)
	_, p, err := b.StartReceive(ch, func(Message, error) { called <- struct{}{} })
	wantForeign("StartReceive", err)
	if p != nil {
		t.Fatal("StartReceive on a foreign channel returned a pending receive")
	}
	wantForeign("GroupAdd", b.GroupAdd(ctx, "room", ch))
	_, err = b.Receive(ctx, "specific."+a.ClientID()+"!")
	wantForeign("Receive on a's process prefix", err)

	after := b.Stats()
	if after.Mailboxes != before.Mailboxes || after.Subscriptions != before.Subscriptions || after.Groups != before.Groups {
		t.Fatalf("refused calls changed b: mailboxes %d->%d, subscriptions %d->%d, groups %d->%d",
			before.Mailboxes, after.Mailboxes, before.Subscriptions, after.Subscriptions, before.Groups, after.Groups)
	}
	// a's channel still gets b's sends exactly once.
	msgSend(t, b, ch, map[string]any{"type": "again"})
	if got := msgRecv(t, a, ch); got["type"] != "again" {
		t.Fatalf("got %v", got)
	}
	msgNothing(t, a, ch)
	select {
	case <-called:
		t.Fatal("the refused StartReceive's callback ran")
	default:
	}
}

// Ref 51, 52, S13: receive("specific.<id>!") gets messages for this client's process channels
// that have no mailbox of their own; a channel with its own mailbox is not taken by it.
func TestMessagingProcessPrefixMailbox(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	prefix := "specific." + a.ClientID() + "!"

	out, _ := msgStart(t, a, prefix)
	msgSend(t, b, prefix+"aa11", map[string]any{"type": "to aa11"})
	if r := msgAwait(t, out, "prefix reader"); r.m["type"] != "to aa11" {
		t.Fatalf("got %v", r.m)
	}

	ch := msgNewChannel(t, a)
	out, _ = msgStart(t, a, prefix)
	msgSend(t, b, ch, map[string]any{"type": "own mailbox"})
	msgSend(t, b, prefix+"bb22", map[string]any{"type": "to bb22"})
	if got := msgRecv(t, a, ch); got["type"] != "own mailbox" {
		t.Fatalf("channel with its own mailbox got %v", got)
	}
	// Same sender, same receiving connection: bb22 arrived after ch's message, so the prefix
	// reader's first message shows whether it took ch's.
	if r := msgAwait(t, out, "prefix reader"); r.m["type"] != "to bb22" {
		t.Fatalf("the prefix reader took %v", r.m)
	}
	if got := a.Stats().Dropped.NoMailbox; got != 0 {
		t.Fatalf("Dropped.NoMailbox = %d", got)
	}
}

// Ref 53, 71, S8, S3: frames that are not a Channels message are dropped, counted and logged
// once; the waiting receive is not ended and gets the next good message.
func TestMessagingInboundBadFrames(t *testing.T) {
	s := startServer(t)
	rec := &logSink{}
	a := connect(t, testConfig(rec, s.url()))
	raw := rawConn(t, s.url())
	good := []byte("\x81\xa4type\xa4good")

	out, _ := msgStart(t, a, "c")
	for _, body := range [][]byte{[]byte("\x91\x01"), []byte("\xc1"), good} {
		if err := raw.Publish("channels.ch.c", body); err != nil {
			t.Fatal(err)
		}
	}
	if r := msgAwait(t, out, "after two bad frames"); r.m["type"] != "good" {
		t.Fatalf("got %v", r.m)
	}
	if got := a.Stats().Dropped.BadFrame; got != 2 {
		t.Fatalf("Dropped.BadFrame = %d, want 2", got)
	}
	if n := rec.count("not a Channels message"); n != 1 {
		t.Fatalf("want exactly one bad-frame warning, got %d:\n%s", n, rec.all())
	}
	if n := rec.count(fmt.Sprint(int(LevelWarning)), "not a Channels message", "channels.ch.c"); n != 1 {
		t.Fatalf("the bad-frame warning must be a WARNING naming the subject:\n%s", rec.all())
	}

	// A message with a nested int key (what the reference layer could send) is dropped too.
	out, _ = msgStart(t, a, "c")
	for _, body := range [][]byte{[]byte("\x82\xa4type\xa1x\xa1a\x81\x01\xa1x"), good} {
		if err := raw.Publish("channels.ch.c", body); err != nil {
			t.Fatal(err)
		}
	}
	if r := msgAwait(t, out, "after a nested int key"); r.m["type"] != "good" {
		t.Fatalf("got %v", r.m)
	}
	if got := a.Stats().Dropped.BadFrame; got != 3 {
		t.Fatalf("Dropped.BadFrame = %d, want 3", got)
	}
	if n := rec.count("not a Channels message"); n != 1 {
		t.Fatalf("the warning is rate limited: want still one, got %d:\n%s", n, rec.all())
	}
}

// S8, SPEC section 3 routing: a process channel frame without a Channel header, or whose header
// names no process channel of this client, is a bad frame; a channel of this client without a
// mailbox is counted as no_mailbox; the good frame after them is received.
func TestMessagingInboundBadProcessFrames(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	raw := rawConn(t, s.url())
	ch := msgNewChannel(t, a)
	subject := "channels.pc.specific." + a.ClientID()
	body := []byte("\x81\xa4type\xa1x")
	publish := func(header string, data []byte) {
		t.Helper()
		m := nats.NewMsg(subject)
		if header != "" {
			m.Header.Set(ChannelHeader, header)
		}
		m.Data = data
		if err := raw.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	out, _ := msgStart(t, a, ch)
	publish("", body)                               // no header
	publish("not-a-process-channel", body)          // no "!"
	publish("specific.000000000000!x", body)        // another client
	publish("specific."+a.ClientID()+"!ffff", body) // ours, but no mailbox
	publish(ch, []byte("\x81\xa4type\xa4good"))     // good
	if r := msgAwait(t, out, "good frame"); r.m["type"] != "good" {
		t.Fatalf("got %v", r.m)
	}
	st := a.Stats()
	if st.Dropped.BadFrame != 3 || st.Dropped.NoMailbox != 1 {
		t.Fatalf("Dropped.BadFrame = %d (want 3), Dropped.NoMailbox = %d (want 1)", st.Dropped.BadFrame, st.Dropped.NoMailbox)
	}
}

// S11: one Layer used by 20 goroutines at once opens no new connection.
func TestMessagingConcurrentUseSharesOneConnection(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, b)
	msgGroupAdd(t, b, "room", ch)
	if n := s.numClients(); n != 2 {
		t.Fatalf("%d clients before, want 2", n)
	}
	const n = 20
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			errs <- a.GroupSend(ctxT(t, 5*time.Second), "room", map[string]any{"type": "g", "n": i})
			errs <- a.Send(ctxT(t, 5*time.Second), ch, map[string]any{"type": "d", "n": n + i})
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	seen := map[int64]bool{}
	for i := 0; i < 2*n; i++ {
		seen[msgN(t, msgRecv(t, b, ch))] = true
	}
	if len(seen) != 2*n {
		t.Fatalf("got %d distinct messages, want %d", len(seen), 2*n)
	}
	if got := s.numClients(); got != 2 {
		t.Fatalf("%d clients after concurrent use, want 2 (one per layer)", got)
	}
	if got := a.Stats().Published; got != 2*n {
		t.Fatalf("Published = %d, want %d", got, 2*n)
	}
}

// S20: published and delivered count what was sent and received; refused calls count nothing.
func TestMessagingStatsCounters(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, b)
	msgGroupAdd(t, b, "room", ch)
	for i := 0; i < 3; i++ {
		msgSend(t, a, ch, map[string]any{"type": "d", "n": i})
	}
	for i := 0; i < 2; i++ {
		msgGroupSend(t, a, "room", map[string]any{"type": "g", "n": i})
	}
	_ = a.Send(ctxT(t, time.Second), "bad name", map[string]any{"type": "x"})
	_ = a.Send(ctxT(t, time.Second), ch, map[string]any{ReservedKey: "x"})
	for i := 0; i < 5; i++ {
		msgRecv(t, b, ch)
	}
	sa, sb := a.Stats(), b.Stats()
	if sa.Published != 5 || sa.Delivered != 0 {
		t.Fatalf("sender: published %d (want 5), delivered %d (want 0)", sa.Published, sa.Delivered)
	}
	if sb.Published != 0 || sb.Delivered != 5 {
		t.Fatalf("receiver: published %d (want 0), delivered %d (want 5)", sb.Published, sb.Delivered)
	}
	if sb.ClientID != b.ClientID() || !sb.Connected || sb.Mailboxes != 1 || sb.Groups != 1 || sb.Subscriptions != 2 {
		t.Fatalf("receiver state: %+v; want its client id, connected, 1 mailbox, 1 group, 2 subscriptions", sb)
	}
	d := sb.Dropped
	if d.Capacity+d.Expired+d.SlowConsumer+d.BadFrame+d.NoMailbox != 0 {
		t.Fatalf("unexpected drops: %+v", d)
	}
}

// SPEC section 6: a receive whose message is already in the mailbox returns it at once, without
// registering a waiter (StartReceive returns a nil *Op and never calls back).
func TestMessagingReceiveReadyMessageReturnsAtOnce(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	msgSend(t, b, ch, map[string]any{"type": "x", "n": 1})
	waitFor(t, 5*time.Second, "the message to reach the mailbox", func() bool { return msgQueued(a, ch) == 1 })

	var calls atomic.Int32
	msg, p, err := a.StartReceive(ch, func(Message, error) { calls.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	if p != nil {
		t.Fatal("StartReceive registered a waiter although a message was ready")
	}
	m, err := DecodeMessage(msg.Body)
	if err != nil || msgN(t, m) != 1 {
		t.Fatalf("got %v, %v", m, err)
	}
	a.mu.Lock()
	waiters := len(a.mailboxes[ch].waiters)
	a.mu.Unlock()
	if waiters != 0 {
		t.Fatalf("%d waiter(s) registered", waiters)
	}
	// The next message stays in the mailbox: the callback was not kept anywhere.
	msgSend(t, b, ch, map[string]any{"type": "x", "n": 2})
	waitFor(t, 5*time.Second, "the second message to reach the mailbox", func() bool { return msgQueued(a, ch) == 1 })
	if calls.Load() != 0 {
		t.Fatal("the callback of an immediate receive ran")
	}
	if got := a.Stats().Delivered; got != 1 {
		t.Fatalf("Delivered = %d, want 1", got)
	}
}

// A receive that waits allocates nothing in the layer but the host's Receipt, and cancelling it
// nothing: the mailbox keeps its waiters array for the next receive that waits.
func TestMessagingWaitingReceiveAllocatesOnlyItsReceipt(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	to := deliverFunc(func(Message, error) { t.Error("a cancelled receive was delivered to") })
	newReceipt := func() (*Receipt, Receiver) { return new(Receipt), to }
	allocs := testing.AllocsPerRun(200, func() {
		_, op, err := a.StartReceiveInto(ch, newReceipt)
		if err != nil || op == nil {
			t.Fatalf("StartReceiveInto(%s) on an empty mailbox: op %v, %v; want it waiting", ch, op, err)
		}
		if !op.Cancel() {
			t.Fatal("Cancel of a waiting receive returned false")
		}
	})
	if allocs != 1 {
		t.Fatalf("a receive that waits and is cancelled made %v allocations, want 1 (its Receipt)", allocs)
	}
}

// StartReceiveInto asks for a Receipt only for a receive that has to wait: a receive that finds a
// message (oldest first) calls newReceipt not at all; one that finds none, or only expired ones,
// calls it once, returns that Receipt's Op and gets the next message through its Receiver; a
// closed layer calls it never.
func TestMessagingStartReceiveInto(t *testing.T) {
	s := startServer(t)
	cfg := testConfig(nil, s.url())
	cfg.Expiry = time.Second // the first two messages must outlive their way in on a busy machine
	a := connect(t, cfg)
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	made := 0
	got := make(chan Message, 1)
	var receipt *Receipt
	newReceipt := func() (*Receipt, Receiver) {
		made++
		receipt = new(Receipt)
		return receipt, deliverFunc(func(m Message, err error) {
			if err != nil {
				t.Errorf("delivered %v", err)
			}
			got <- m
		})
	}
	typeOf := func(m Message) any {
		var v map[string]any
		if err := msgpack.Unmarshal(m.Body, &v); err != nil {
			t.Fatal(err)
		}
		return v["type"]
	}
	for _, kind := range []string{"first", "second"} {
		msgSend(t, b, ch, map[string]any{"type": kind})
	}
	waitFor(t, 5*time.Second, "two messages to arrive", func() bool { return msgQueued(a, ch) == 2 })
	for _, want := range []string{"first", "second"} {
		msg, op, err := a.StartReceiveInto(ch, newReceipt)
		if err != nil || op != nil || typeOf(msg) != want || msg.Channel != ch {
			t.Fatalf("got %v on %q (op %v, %v), want %s waiting on %q", typeOf(msg), msg.Channel, op, err, want, ch)
		}
	}
	if made != 0 {
		t.Fatalf("newReceipt called %d time(s) by receives that found a message", made)
	}
	msgSend(t, b, ch, map[string]any{"type": "stale"})
	waitFor(t, 5*time.Second, "the stale message to arrive", func() bool { return msgQueued(a, ch) == 1 })
	time.Sleep(cfg.Expiry + 100*time.Millisecond) // past expiry (not an assertion)
	if _, op, err := a.StartReceiveInto(ch, newReceipt); err != nil || op == nil {
		t.Fatalf("a receive that found only an expired message: op %v, %v; want it waiting", op, err)
	} else if made != 1 || op != &receipt.Op {
		t.Fatalf("newReceipt called %d time(s) by a receive that waits, want 1, and its Receipt's Op returned", made)
	}
	if got := a.Stats().Dropped.Expired; got != 1 {
		t.Fatalf("Dropped.Expired = %d, want 1", got)
	}
	msgSend(t, b, ch, map[string]any{"type": "next"})
	select {
	case m := <-got:
		if typeOf(m) != "next" {
			t.Fatalf("the waiting receive got %v, want next", typeOf(m))
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting receive got nothing")
	}
	_ = a.Close()
	if _, _, err := a.StartReceiveInto(ch, newReceipt); !errors.Is(err, ErrClosed) || made != 1 {
		t.Fatalf("on a closed layer: %v, newReceipt called %d time(s); want ErrClosed and no call", err, made)
	}
}

// S10 across the hand-over of routing: a connection's reader routes what it reads, and hands
// the rest to the dispatcher when the layer lock is held by another goroutine (it never waits
// for it) or when routing takes long; the dispatcher hands routing back once it has caught up.
// Messages that arrive before, during and after a hand-over reach their mailbox in the order
// they were sent, and none is lost or doubled.
func TestMessagingRoutingHandOverKeepsOrder(t *testing.T) {
	s := startServer(t)
	const each = 40
	cfg := testConfig(nil, s.url())
	cfg.Capacity = 3 * each // receiving starts while the last messages arrive: none may be dropped
	a := connect(t, cfg)
	c := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	send := func(from int) {
		for n := from; n < from+each; n++ {
			msgSend(t, c, ch, map[string]any{"type": "order", "n": n})
		}
	}
	send(0) // routed by the reader
	waitFor(t, 5*time.Second, "the first messages", func() bool { return msgQueued(a, ch) == each })

	a.mu.Lock() // the reader cannot route: it hands over to the dispatcher, which waits here
	send(each)
	waitFor(t, 5*time.Second, "the reader to hand routing over", a.dispatcherRoutes.Load)
	a.mu.Unlock()
	waitFor(t, 5*time.Second, "the dispatcher to hand routing back", func() bool {
		return !a.dispatcherRoutes.Load() && msgQueued(a, ch) == 2*each
	})
	send(2 * each) // routed by the reader again
	for n := range 3 * each {
		if got := msgN(t, msgRecv(t, a, ch)); got != int64(n) {
			t.Fatalf("message %d arrived as number %d", got, n)
		}
	}
	msgNothing(t, a, ch)
}

// ReceiveAgain starts a Receipt's receive over in its mailbox: it waits again as the same Op,
// or returns a message that was waiting, in order, each message delivered once. From then on
// Retract does not give back the message the receive had before. It refuses a Receipt whose
// receive was cancelled, or whose mailbox was flushed since.
func TestMessagingReceiveAgain(t *testing.T) {
	s := startServer(t)
	a := connect(t, testConfig(nil, s.url()))
	b := connect(t, testConfig(nil, s.url()))
	ch := msgNewChannel(t, a)
	got := make(chan int, 8)
	receipt := new(Receipt)
	newReceipt := func() (*Receipt, Receiver) {
		return receipt, deliverFunc(func(m Message, err error) {
			if err != nil {
				t.Errorf("delivered %v", err)
			}
			got <- numberIn(t, m.Body)
		})
	}
	next := func(want int) {
		t.Helper()
		select {
		case n := <-got:
			if n != want {
				t.Fatalf("delivered n=%d, want %d", n, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("message %d was not delivered", want)
		}
	}
	if _, op, err := a.StartReceiveInto(ch, newReceipt); err != nil || op != &receipt.Op {
		t.Fatalf("StartReceiveInto: op %v, %v; want the Receipt's Op", op, err)
	}
	msgSend(t, b, ch, map[string]any{"type": "n", "n": 1})
	next(1)
	for n := 2; n <= 3; n++ {
		if _, op, err := a.ReceiveAgain(receipt); err != nil || op != &receipt.Op {
			t.Fatalf("ReceiveAgain on an empty mailbox: op %v, %v; want the Receipt's Op", op, err)
		}
		msgSend(t, b, ch, map[string]any{"type": "n", "n": n})
		next(n)
	}
	for n := 4; n <= 5; n++ {
		msgSend(t, b, ch, map[string]any{"type": "n", "n": n})
	}
	waitFor(t, 5*time.Second, "two messages to arrive", func() bool { return msgQueued(a, ch) == 2 })
	for n := 4; n <= 5; n++ {
		msg, op, err := a.ReceiveAgain(receipt)
		if err != nil || op != nil || numberIn(t, msg.Body) != n {
			t.Fatalf("ReceiveAgain with messages waiting: op %v, %v, n=%d; want message %d", op, err, numberIn(t, msg.Body), n)
		}
		receipt.Retract() // message 3 was consumed, and a waiting message is returned, not handed over
	}
	if _, op, err := a.ReceiveAgain(receipt); err != nil || op == nil || !op.Cancel() {
		t.Fatalf("ReceiveAgain: op %v, %v; want it waiting, and cancelled", op, err)
	}
	if _, _, err := a.ReceiveAgain(receipt); !errors.Is(err, ErrNotAgain) {
		t.Errorf("ReceiveAgain of a cancelled receive: %v, want ErrNotAgain", err)
	}
	if st := a.Stats(); st.Delivered != 5 {
		t.Errorf("Delivered = %d, want 5", st.Delivered)
	}

	receipt = new(Receipt)
	if _, op, err := a.StartReceiveInto(ch, newReceipt); err != nil || op == nil {
		t.Fatalf("StartReceiveInto: op %v, %v; want it waiting", op, err)
	}
	msgSend(t, b, ch, map[string]any{"type": "n", "n": 6})
	next(6)
	if err := a.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.ReceiveAgain(receipt); !errors.Is(err, ErrNotAgain) {
		t.Errorf("ReceiveAgain after Flush: %v, want ErrNotAgain", err)
	}
	_ = a.Close()
	if _, _, err := a.ReceiveAgain(receipt); !errors.Is(err, ErrClosed) {
		t.Errorf("ReceiveAgain after Close: %v, want ErrClosed", err)
	}
}

// numberIn is the "n" of a message body, or -1 without one.
func numberIn(t *testing.T, body []byte) int {
	t.Helper()
	if body == nil {
		return -1
	}
	var v struct {
		N int `msgpack:"n"`
	}
	if err := msgpack.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	return v.N
}
