//go:build linux

package abitest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Status codes of include/channels_nats.h.
const (
	cnOK             int32 = 0
	cnPending        int32 = 1
	cnErr            int32 = 2
	cnInvalidArg     int32 = 3
	cnInvalidConfig  int32 = 4
	cnInvalidName    int32 = 5
	cnInvalidMessage int32 = 6
	cnTooLarge       int32 = 7
	cnForeign        int32 = 8
	cnInvalidHandle  int32 = 9
	cnClosed         int32 = 10
	cnNotPending     int32 = 12
	cnIllegalState   int32 = 13
	cnNoServer       int32 = 14
	cnTimeout        int32 = 15
	cnForked         int32 = 16
	cnInternal       int32 = 17

	cnLogWarning int32 = 30
)

// statusNames are the enum names by code; 11 is not used.
var statusNames = map[int32]string{
	cnOK: "CN_OK", cnPending: "CN_PENDING", cnErr: "CN_ERR", cnInvalidArg: "CN_INVALID_ARG",
	cnInvalidConfig: "CN_INVALID_CONFIG", cnInvalidName: "CN_INVALID_NAME",
	cnInvalidMessage: "CN_INVALID_MESSAGE", cnTooLarge: "CN_MESSAGE_TOO_LARGE",
	cnForeign: "CN_FOREIGN_CHANNEL", cnInvalidHandle: "CN_INVALID_HANDLE", cnClosed: "CN_CLOSED",
	cnNotPending: "CN_NOT_PENDING", cnIllegalState: "CN_ILLEGAL_STATE", cnNoServer: "CN_NO_SERVER",
	cnTimeout: "CN_TIMEOUT", cnForked: "CN_FORKED", cnInternal: "CN_INTERNAL",
}

// name is the enum name of a status code, for failure messages.
func name(st int32) string {
	if n, ok := statusNames[st]; ok {
		return n
	}
	return fmt.Sprintf("status(%d)", st)
}

// The cn_* functions, bound in TestMain. Pointers the library writes through are *uint64
// (cn_client*, cn_op*, cn_queue*), *uintptr (char**, const uint8_t**, size_t*) and *cResult
// (cn_result*); intptr_t is int (64-bit Linux); void* closures are uintptr (the library never
// dereferences them); strings are NUL-terminated byte slices (*byte, nil for NULL) so that NULL
// and invalid UTF-8 can be passed.
var (
	cnVersion      func() string
	cnStatusText   func(st int32) string
	cnLastError    func() string
	cnFree         func(p uintptr)
	cnQueueNew     func(notify int, queue *uint64) int32
	cnQueueTake    func(queue uint64, results *cResult, capacity uintptr, count *uintptr) int32
	cnQueueFree    func(queue uint64) int32
	cnConnect      func(config *byte, log, logClosure uintptr, queue uint64, closure uintptr, client *uint64) int32
	cnClose        func(h uint64, queue uint64, closure uintptr) int32
	cnStats        func(h uint64, json *uintptr) int32
	cnSend         func(h uint64, channel *byte, body *byte, n uintptr, queue uint64, closure uintptr, op *uint64) int32
	cnGroupSend    func(h uint64, group *byte, body *byte, n uintptr, queue uint64, closure uintptr, op *uint64) int32
	cnReceive      func(h uint64, channel *byte, queue uint64, closure uintptr, body *uintptr, n *uintptr, op *uint64) int32
	cnCancel       func(h uint64, op uint64) int32
	cnNewChannel   func(h uint64, prefix *byte, queue uint64, closure uintptr, channel *uintptr, op *uint64) int32
	cnGroupAdd     func(h uint64, group, channel *byte, queue uint64, closure uintptr, op *uint64) int32
	cnGroupDiscard func(h uint64, group, channel *byte) int32
	cnFlush        func(h uint64) int32
	cnReadEvents   func(h uint64, fd *int64) int32
	cnOnReadable   func(h, q uint64) int32
)

// cResult mirrors struct cn_result of include/channels_nats.h on 64-bit platforms: op, closure,
// status (an enum: 4 bytes, then 4 of padding), text, data, len; 48 bytes.
type cResult struct {
	op      uint64
	closure uintptr
	status  int32
	_       int32
	text    uintptr
	data    uintptr
	len     uintptr
	rearm   uintptr
}

// logCB is the cn_log_callback, made once per test binary.
var logCB uintptr

// libPath is the library under test: $CN_LIB, else build/<goos>-<goarch>/libchannels_nats.so
// under the module root.
func libPath() (string, error) {
	if p := os.Getenv("CN_LIB"); p != "" {
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "build", runtime.GOOS+"-"+runtime.GOARCH, "libchannels_nats.so"), nil
}

// moduleRoot finds the directory of go.mod, upwards from the working directory.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// load opens the library and binds every cn_* function and the log callback.
func load() error {
	path, err := libPath()
	if err != nil {
		return err
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("%s: %w; build it first: make lib", path, err)
	}
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return fmt.Errorf("dlopen %s: %w; build it first: make lib", path, err)
	}
	bind := func(fn any, sym string) {
		if err == nil {
			err = func() (err error) {
				defer func() {
					if r := recover(); r != nil {
						err = fmt.Errorf("binding %s: %v", sym, r)
					}
				}()
				purego.RegisterLibFunc(fn, lib, sym)
				return nil
			}()
		}
	}
	bind(&cnVersion, "cn_version")
	bind(&cnStatusText, "cn_status_text")
	bind(&cnLastError, "cn_last_error")
	bind(&cnFree, "cn_free")
	bind(&cnQueueNew, "cn_queue_new")
	bind(&cnQueueTake, "cn_queue_take")
	bind(&cnQueueFree, "cn_queue_free")
	bind(&cnConnect, "cn_connect")
	bind(&cnClose, "cn_close")
	bind(&cnStats, "cn_stats")
	bind(&cnSend, "cn_send")
	bind(&cnGroupSend, "cn_group_send")
	bind(&cnReceive, "cn_receive")
	bind(&cnCancel, "cn_cancel")
	bind(&cnNewChannel, "cn_new_channel")
	bind(&cnGroupAdd, "cn_group_add")
	bind(&cnGroupDiscard, "cn_group_discard")
	bind(&cnFlush, "cn_flush")
	bind(&cnReadEvents, "cn_read_events")
	bind(&cnOnReadable, "cn_on_readable")
	if err != nil {
		return err
	}
	logCB = purego.NewCallback(onLog)
	return nil
}

// ---- The log callback -----------------------------------------------------------------------

// logRecord is one call of the log callback.
type logRecord struct {
	Level   int32
	Message string
}

// logSink receives the log records of the clients given its closure value. hook, if set, runs
// inside the callback, on the library's thread, after the record was stored.
type logSink struct {
	closure uintptr
	hook    func(logRecord)
	mu      sync.Mutex
	records []logRecord
	calls   atomic.Int64
}

var (
	nextClosure atomic.Uintptr // closure values: 1, 2, ... (0 would be NULL)
	sinks       sync.Map       // closure -> *logSink; never removed, late records stay routable

	strayMu sync.Mutex
	strays  []string // log records that reached no registered sink, or panicked
)

// newClosure is a closure value no other operation of the binary uses.
func newClosure() uintptr { return nextClosure.Add(1) }

func stray(format string, args ...any) {
	strayMu.Lock()
	strays = append(strays, fmt.Sprintf(format, args...))
	strayMu.Unlock()
}

// newLogSink registers a sink; hook may be nil.
func newLogSink(hook func(logRecord)) *logSink {
	s := &logSink{closure: newClosure(), hook: hook}
	sinks.Store(s.closure, s)
	return s
}

func onLog(closure uintptr, level int32, message uintptr) {
	defer func() {
		if r := recover(); r != nil {
			stray("panic in the log callback (closure %d): %v", closure, r)
		}
	}()
	rec := logRecord{Level: level}
	if message != 0 {
		rec.Message = cString(message)
	}
	v, ok := sinks.Load(closure)
	if !ok {
		stray("log callback with unknown closure %d: %d %q", closure, level, rec.Message)
		return
	}
	s := v.(*logSink)
	s.calls.Add(1)
	s.mu.Lock()
	s.records = append(s.records, rec)
	s.mu.Unlock()
	if s.hook != nil {
		s.hook(rec)
	}
}

func (s *logSink) snapshot() []logRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]logRecord(nil), s.records...)
}

// ---- C memory -------------------------------------------------------------------------------

// ptr turns an address from C into a pointer (written this way so that vet's unsafeptr check
// does not take it for a Go pointer round trip: it is C memory or the library's memory).
func ptr(p uintptr) unsafe.Pointer { return *(*unsafe.Pointer)(unsafe.Pointer(&p)) }

// cString copies a NUL-terminated C string.
func cString(p uintptr) string {
	if p == 0 {
		return ""
	}
	var b []byte
	for i := 0; i < 1<<20; i++ {
		c := *(*byte)(unsafe.Add(ptr(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// cBytes copies n bytes of C memory.
func cBytes(p, n uintptr) []byte {
	out := make([]byte, n)
	if n > 0 {
		copy(out, unsafe.Slice((*byte)(ptr(p)), n))
	}
	return out
}

// takeString copies and frees a string the library returned through a char ** out-parameter.
func takeString(p uintptr) string {
	s := cString(p)
	cnFree(p)
	return s
}

// cs is s as a NUL-terminated C string in Go memory (the library copies its inputs).
func cs(s string) *byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return &b[0]
}

// bp is the address and length of a body; an empty body gets a valid address of length 0.
func bp(body []byte) (*byte, uintptr) {
	if len(body) == 0 {
		return new(byte), 0
	}
	return &body[0], uintptr(len(body))
}

// onThread runs f on one OS thread and returns its status with that thread's cn_last_error().
func onThread(f func() int32) (int32, string) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	st := f()
	return st, cnLastError()
}
