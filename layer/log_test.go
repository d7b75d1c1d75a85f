package layer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRedact(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"nats://user:pw@host:4222", "nats://[redacted]@host:4222"},
		{"tls://tok@h:1", "tls://[redacted]@h:1"},
		{"connect failed for nats://user:pw@host:4222 after 3 attempts", "connect failed for nats://[redacted]@host:4222 after 3 attempts"},
		{"servers: nats://a:1, tls://tok@h:1 and nats://alice:s3cret@b:2 are down",
			"servers: nats://a:1, tls://[redacted]@h:1 and nats://[redacted]@b:2 are down"},
		{`url "nats://user:pw@host:4222" refused`, `url "nats://[redacted]@host:4222" refused`},
		{"'nats://tok@host:4222'", "'nats://[redacted]@host:4222'"},
		{"nats://user:pw@host:4222,nats://u2:p2@other:4222", "nats://[redacted]@host:4222,nats://[redacted]@other:4222"},
		{"ws://user:pw@host/path?x=1", "ws://[redacted]@host/path?x=1"},
		// Without user information a URL is left alone.
		{"nats://host:4222", "nats://host:4222"},
		{"dial nats://127.0.0.1:4222 failed: connection refused", "dial nats://127.0.0.1:4222 failed: connection refused"},
		{"see https://docs.nats.io/x?y=1#z for more", "see https://docs.nats.io/x?y=1#z for more"},
		{"no url here: user:pw@host", "no url here: user:pw@host"},
		{"", ""},
	} {
		if got := (&redactor{}).text(tc.in); got != tc.want {
			t.Errorf("redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestRedactNeverLeaks checks that credentials are gone whatever follows the URL in the text:
// error texts often put a colon, a period or a bracket right after it.
func TestRedactNeverLeaks(t *testing.T) {
	for _, tc := range []struct {
		in      string
		secrets []string
		keep    string
	}{
		{"connect to nats://user:pw@host:4222: connection refused", []string{"user", "pw"}, "host:4222"},
		{"nats: cannot connect (nats://user:pw@host:4222)", []string{"user", "pw"}, "host:4222"},
		{"server was nats://user:pw@host:4222.", []string{"user", "pw"}, "host:4222"},
		{"[nats://tok@host:4222]", []string{"tok"}, "host:4222"},
		{"nats://user:pw@host:4222;retrying", []string{"user", "pw"}, "host:4222"},
		{"tls://user:p%40ss@host:4443", []string{"user", "p%40ss", "p@ss"}, "host:4443"},
		{"nats://user:pw@host:4222\ttab", []string{"user", "pw"}, "host:4222"},
		{"nats://user:pw@host:99999", []string{"user", "pw"}, "host"},
		{"nats://user:pw@[::1]:4222", []string{"user", "pw"}, "[::1]:4222"},
	} {
		got := (&redactor{}).text(tc.in)
		for _, s := range tc.secrets {
			if strings.Contains(got, s) {
				t.Errorf("redact(%q) = %q still contains %q", tc.in, got, s)
			}
		}
		if !strings.Contains(got, tc.keep) {
			t.Errorf("redact(%q) = %q lost %q", tc.in, got, tc.keep)
		}
	}
}

func TestRedactErr(t *testing.T) {
	if (&redactor{}).err(nil) != nil {
		t.Error("(&redactor{}).err(nil) != nil")
	}
	plain := errors.New("nats: timeout")
	if got := (&redactor{}).err(plain); got != plain {
		t.Errorf("redactErr changed an error without credentials: %v", got)
	}
	got := (&redactor{}).err(fmt.Errorf("connect nats://user:pw@host:4222 failed"))
	if got == nil || strings.Contains(got.Error(), "pw") || !strings.Contains(got.Error(), "host:4222") {
		t.Errorf("redactErr = %v", got)
	}
}

func describeDrops(total uint64) string { return fmt.Sprintf("dropped %d", total) }

func TestDropReporter(t *testing.T) {
	var rec logSink
	r := newDropReporter(rec.log)
	if r.interval != DropLogInterval || DropLogInterval != 60*time.Second {
		t.Fatalf("interval = %v (DropLogInterval %v), want 60s (SPEC S3)", r.interval, DropLogInterval)
	}
	r.interval = time.Second
	t0 := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

	steps := []struct {
		desc string
		at   time.Duration
		n    uint64
		want string // the warning logged, or "" for none
	}{
		{"first drop logs at once", 0, 1, "dropped 1"},
		{"a drop right after does not log", 10 * time.Millisecond, 1, ""},
		{"a batch within the interval does not log", 500 * time.Millisecond, 5, ""},
		{"just before the interval does not log", time.Second - time.Nanosecond, 1, ""},
		{"at the interval logs the running total", time.Second, 2, "dropped 10"},
		{"right after that does not log", time.Second + time.Millisecond, 1, ""},
		{"an interval after the last warning logs", 2*time.Second + 5*time.Millisecond, 1, "dropped 12"},
		{"a long gap logs once", time.Hour, 3, "dropped 15"},
	}
	for _, s := range steps {
		calls := 0
		r.drop("capacity", "chan-a", s.n, t0.Add(s.at), func(total uint64) string {
			calls++
			return describeDrops(total)
		})
		got := rec.take()
		if s.want == "" {
			if len(got) != 0 || calls != 0 {
				t.Errorf("%s: logged %v (describe called %d times), want nothing", s.desc, got, calls)
			}
			continue
		}
		if len(got) != 1 || got[0].msg != s.want || got[0].level != LevelWarning {
			t.Errorf("%s: logged %v, want one warning %q", s.desc, got, s.want)
		}
		if calls != 1 {
			t.Errorf("%s: describe called %d times, want 1", s.desc, calls)
		}
	}

	if got := r.recovered("capacity", "chan-a"); got != 15 {
		t.Errorf("recovered = %d, want 15", got)
	}
	if got := r.recovered("capacity", "chan-a"); got != 0 {
		t.Errorf("recovered again = %d, want 0 (reset)", got)
	}
	// After a recovery the rate limit still holds, whatever the pattern of drops: a new spell
	// within the interval of the last warning does not log (a mailbox that flaps between full
	// and not cannot flood the log); once the interval has passed it logs the running total
	// since the name was first seen.
	r.drop("capacity", "chan-a", 1, t0.Add(time.Hour+time.Millisecond), describeDrops)
	if got := rec.take(); len(got) != 0 {
		t.Errorf("a drop right after a recovery, within the interval, logged %v; want nothing", got)
	}
	r.drop("capacity", "chan-a", 1, t0.Add(time.Hour+time.Second), describeDrops)
	if got := rec.take(); len(got) != 1 || got[0].msg != "dropped 17" {
		t.Errorf("a drop an interval after the last warning logged %v, want one warning %q", got, "dropped 17")
	}
	if got := r.recovered("capacity", "chan-a"); got != 2 {
		t.Errorf("recovered after the second spell = %d, want its 2 drops (its start was logged)", got)
	}
	// A spell none of whose drops was logged ends without a "has room again".
	r.drop("capacity", "chan-a", 1, t0.Add(time.Hour+time.Second+time.Millisecond), describeDrops)
	if got := r.recovered("capacity", "chan-a"); got != 0 || len(rec.take()) != 0 {
		t.Errorf("recovered after a spell that was never announced = %d, want 0 and nothing logged", got)
	}
}

func TestDropReporterKeys(t *testing.T) {
	var rec logSink
	r := newDropReporter(rec.log)
	r.interval = time.Minute
	now := time.Unix(1700000000, 0)
	// Kinds and names are counted separately; each one's first drop logs.
	r.drop("capacity", "a", 1, now, describeDrops)
	r.drop("capacity", "b", 2, now, describeDrops)
	r.drop("slow consumer", "a", 3, now, describeDrops)
	r.drop("capacity", "a", 4, now.Add(time.Second), describeDrops)
	if got := rec.take(); len(got) != 3 {
		t.Fatalf("logged %v, want three first-drop warnings", got)
	}
	for _, tc := range []struct {
		kind, name string
		want       uint64
	}{
		{"capacity", "a", 5}, {"capacity", "b", 2}, {"slow consumer", "a", 3}, {"slow consumer", "b", 0}, {"expired", "a", 0},
	} {
		if got := r.recovered(tc.kind, tc.name); got != tc.want {
			t.Errorf("recovered(%q, %q) = %d, want %d", tc.kind, tc.name, got, tc.want)
		}
	}
	// The running totals outlive a recovery; forget (a mailbox that is gone) drops them.
	if len(r.spells) != 3 {
		t.Errorf("%d keys known after every recovery, want the 3 that dropped", len(r.spells))
	}
	for _, k := range []dropKey{{"capacity", "a"}, {"capacity", "b"}, {"slow consumer", "a"}} {
		r.forget(k.kind, k.name)
	}
	if len(r.spells) != 0 {
		t.Errorf("%d keys left after forget", len(r.spells))
	}
	if got := rec.take(); len(got) != 0 {
		t.Errorf("recovered logged %v; the caller logs recovery", got)
	}
}

func TestDropReporterConcurrent(t *testing.T) {
	var rec logSink
	r := newDropReporter(rec.log)
	now := time.Unix(1700000000, 0)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				r.drop("capacity", "c", 1, now, describeDrops)
			}
		}()
	}
	wg.Wait()
	if got := rec.take(); len(got) != 1 {
		t.Errorf("8000 drops at one instant logged %d warnings, want 1", len(got))
	}
	if got := r.recovered("capacity", "c"); got != 8000 {
		t.Errorf("recovered = %d, want 8000", got)
	}
}

// captureHandler records the slog records it receives.
type captureHandler struct {
	mu      sync.Mutex
	records []slog.Record
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *captureHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.records = append(h.records, r)
	return nil
}
func (h *captureHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *captureHandler) WithGroup(string) slog.Handler      { return h }

func TestSlogLog(t *testing.T) {
	h := &captureHandler{}
	old := slog.Default()
	slog.SetDefault(slog.New(h))
	defer slog.SetDefault(old)
	for _, tc := range []struct {
		level Level
		want  slog.Level
	}{
		{LevelDebug, slog.LevelDebug}, {LevelInfo, slog.LevelInfo},
		{LevelWarning, slog.LevelWarn}, {LevelError, slog.LevelError},
	} {
		h.records = nil
		slogLog(tc.level, "message")
		if len(h.records) != 1 {
			t.Fatalf("level %d: %d records", tc.level, len(h.records))
		}
		r := h.records[0]
		if r.Level != tc.want || r.Message != "message" {
			t.Errorf("level %d: got %v %q, want %v", tc.level, r.Level, r.Message, tc.want)
		}
		logger := ""
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "logger" {
				logger = a.Value.String()
			}
			return true
		})
		if logger != "channels_nats" {
			t.Errorf("level %d: logger attribute %q, want channels_nats (SPEC S3)", tc.level, logger)
		}
	}
	// Python's logging levels, which hosts pass through unchanged.
	if LevelDebug != 10 || LevelInfo != 20 || LevelWarning != 30 || LevelError != 40 {
		t.Errorf("levels %d %d %d %d, want 10 20 30 40", LevelDebug, LevelInfo, LevelWarning, LevelError)
	}
}

// TestQuoteNameKeepsLogLinesSafe: a name from the network reaches a log line quoted, cut, and
// with no control character, line break or NUL of its own.
func TestQuoteNameKeepsLogLinesSafe(t *testing.T) {
	got := quoteName("specific.x!\x1b[31m\r\n\u2028\x00" + strings.Repeat("y", 2000))
	for _, c := range []string{"\x1b", "\r", "\n", "\u2028", "\x00"} {
		if strings.Contains(got, c) {
			t.Errorf("quoteName kept %q: %s", c, got)
		}
	}
	if len(got) > 200 || !strings.Contains(got, "(2022 bytes)") {
		t.Errorf("quoteName did not cut the name: %s", got)
	}
}
