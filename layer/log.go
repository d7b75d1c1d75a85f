package layer

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"sync"
	"time"
)

// Level is the severity of a log record. The values match Python's logging levels so hosts can
// pass them through unchanged.
type Level int

// Log levels.
const (
	LevelDebug   Level = 10
	LevelInfo    Level = 20
	LevelWarning Level = 30
	LevelError   Level = 40
)

// LogFunc receives the layer's log records. It is called from library goroutines and must not
// block for long or call back into the Layer.
type LogFunc func(level Level, message string)

func slogLog(level Level, message string) {
	slog.Default().Log(context.Background(), slog.Level((int(level)-20)/10*4), message, "logger", "channels_nats")
}

// DropLogInterval is the least time between two warnings about the same kind of drop on the same
// channel or subject.
const DropLogInterval = 60 * time.Second

// dropReporter rate-limits drop warnings: the first drop of a spell is logged at once, later ones
// at most once per interval, each with the running count.
type dropReporter struct {
	mu       sync.Mutex
	log      LogFunc
	interval time.Duration
	spells   map[dropKey]*dropSpell
}

type dropKey struct{ kind, name string }

type dropSpell struct {
	count    uint64
	loggedAt time.Time
}

func newDropReporter(log LogFunc) *dropReporter {
	return &dropReporter{log: log, interval: DropLogInterval, spells: map[dropKey]*dropSpell{}}
}

// drop records n more drops of a kind on a name; describe formats the warning from the running
// count and is only called when a warning is due.
func (r *dropReporter) drop(kind, name string, n uint64, now time.Time, describe func(total uint64) string) {
	r.mu.Lock()
	k := dropKey{kind, name}
	s := r.spells[k]
	if s == nil {
		s = &dropSpell{}
		r.spells[k] = s
	}
	s.count += n
	due := s.loggedAt.IsZero() || now.Sub(s.loggedAt) >= r.interval
	if due {
		s.loggedAt = now
	}
	total := s.count
	r.mu.Unlock()
	if due {
		r.log(LevelWarning, describe(total))
	}
}

// recovered ends a spell of drops and returns how many there were (0 if there was none).
func (r *dropReporter) recovered(kind, name string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := dropKey{kind, name}
	s := r.spells[k]
	if s == nil {
		return 0
	}
	delete(r.spells, k)
	return s.count
}

// userInfo matches the user information of a URL ("nats://user:password@" or "nats://token@"),
// wherever the URL stands in a text.
var userInfo = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@]*@`)

// redact replaces the user information of every URL in text, so credentials given in server
// URLs never reach a log record or an error message.
func redact(text string) string {
	return userInfo.ReplaceAllString(text, "${1}redacted@")
}

func redactErr(err error) error {
	if err == nil {
		return nil
	}
	if text := redact(err.Error()); text != err.Error() {
		return fmt.Errorf("%s", text)
	}
	return err
}
