package layer

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
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

// dropReporter rate-limits drop warnings per kind and channel or subject: the first drop is
// logged at once, later ones at most once per interval, each with the running count, whatever
// the pattern of drops; a spell of drops whose start was logged ends with one "has room again".
type dropReporter struct {
	mu       sync.Mutex
	log      LogFunc
	interval time.Duration
	spells   map[dropKey]*dropSpell
}

type dropKey struct{ kind, name string }

type dropSpell struct {
	total    uint64    // drops since the key was first seen
	spell    uint64    // drops of the spell in progress
	loggedAt time.Time // the last warning about a drop
	warned   bool      // the spell in progress was announced: its end is announced too
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
	s.total += n
	s.spell += n
	due := s.loggedAt.IsZero() || now.Sub(s.loggedAt) >= r.interval
	if due {
		s.loggedAt, s.warned = now, true
	}
	total := s.total
	r.mu.Unlock()
	if due {
		r.log(LevelWarning, describe(total))
	}
}

// recovered ends a spell of drops. It returns how many the spell dropped when its start was
// announced (its end is due), else 0.
func (r *dropReporter) recovered(kind, name string) uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.spells[dropKey{kind, name}]
	if s == nil || s.spell == 0 {
		return 0
	}
	n, warned := s.spell, s.warned
	s.spell, s.warned = 0, false
	if !warned {
		return 0
	}
	return n
}

// forget drops what the reporter knows of a name that is gone (a discarded mailbox).
func (r *dropReporter) forget(kind, name string) {
	r.mu.Lock()
	delete(r.spells, dropKey{kind, name})
	r.mu.Unlock()
}

// maxLoggedName is how much of a name that comes from the network a log line shows.
const maxLoggedName = 64

// quoteName makes a name that comes from the network safe for a log line: quoted, with control
// and other unprintable characters escaped (no terminal escape, line break or NUL reaches the
// record), and cut to maxLoggedName characters.
func quoteName(name string) string {
	if runes := []rune(name); len(runes) > maxLoggedName {
		return strconv.Quote(string(runes[:maxLoggedName])) + fmt.Sprintf("... (%d bytes)", len(name))
	}
	return strconv.Quote(name)
}
