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
	"syscall"
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
	cnCancelled      int32 = 11
	cnNotPending     int32 = 12
	cnIllegalState   int32 = 13
	cnNoServer       int32 = 14
	cnTimeout        int32 = 15
	cnForked         int32 = 16
	cnInternal       int32 = 17

	cnLogWarning int32 = 30
)

var statusNames = []string{
	"CN_OK", "CN_PENDING", "CN_ERR", "CN_INVALID_ARG", "CN_INVALID_CONFIG", "CN_INVALID_NAME",
	"CN_INVALID_MESSAGE", "CN_MESSAGE_TOO_LARGE", "CN_FOREIGN_CHANNEL", "CN_INVALID_HANDLE",
	"CN_CLOSED", "CN_CANCELLED", "CN_NOT_PENDING", "CN_ILLEGAL_STATE", "CN_NO_SERVER",
	"CN_TIMEOUT", "CN_FORKED", "CN_INTERNAL",
}

// name is the enum name of a status code, for failure messages.
func name(st int32) string {
	if st >= 0 && int(st) < len(statusNames) {
		return statusNames[st]
	}
	return fmt.Sprintf("status(%d)", st)
}

// The cn_* functions, bound in TestMain. Pointers the library writes through are *uint64
// (cn_client*, cn_op*, cn_queue*), *uintptr (char**, uint8_t**, void**, size_t*) and *cResult
// (cn_result*); intptr_t is int (64-bit Linux); strings are NUL-terminated
// byte slices (*byte, nil for NULL) so that NULL and invalid UTF-8 can be passed.
var (
	cnVersion      func() string
	cnStatusText   func(st int32) string
	cnLastError    func() string
	cnFree         func(p uintptr)
	cnConnect      func(config *byte, log, logClosure, cb, closure uintptr, client *uint64) int32
	cnClose        func(h uint64, cb, closure uintptr) int32
	cnSend         func(h uint64, channel *byte, body *byte, n uintptr, cb, closure uintptr, op *uint64) int32
	cnGroupSend    func(h uint64, group *byte, body *byte, n uintptr, cb, closure uintptr, op *uint64) int32
	cnReceive      func(h uint64, channel *byte, cb, closure uintptr, body *uintptr, n *uintptr, op *uint64) int32
	cnPutBack      func(h uint64, channel *byte, body *byte, n uintptr) int32
	cnReceiveMany  func(h uint64, channel *byte, limit uintptr, block *uintptr, n *uintptr, count *uintptr) int32
	cnPutBackMany  func(h uint64, channel *byte, block *byte, n uintptr) int32
	cnNewChannel   func(h uint64, prefix *byte, cb, closure uintptr, channel *uintptr, op *uint64) int32
	cnGroupAdd     func(h uint64, group, channel *byte, cb, closure uintptr, op *uint64) int32
	cnGroupDiscard func(h uint64, group, channel *byte) int32
	cnFlush        func(h uint64) int32
	cnCancel       func(h uint64, op uint64) int32
	cnStats        func(h uint64, json *uintptr) int32
	cnSetBatch     func(h uint64, cb, closure uintptr) int32
	cnQueueNew     func(notify int, queue *uint64) int32
	cnSetQueue     func(h uint64, queue uint64) int32
	cnQueueTake    func(queue uint64, results *cResult, capacity uintptr, count *uintptr, memory *uintptr) int32
	cnQueueFree    func(queue uint64) int32
)

// The two C function pointers, made once per test binary.
var (
	completeCB uintptr // cn_callback
	logCB      uintptr // cn_log_callback
	batchCB    uintptr // cn_batch_callback
)

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

// load opens the library and binds every cn_* function and both callbacks.
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
	bind(&cnConnect, "cn_connect")
	bind(&cnClose, "cn_close")
	bind(&cnSend, "cn_send")
	bind(&cnGroupSend, "cn_group_send")
	bind(&cnReceive, "cn_receive")
	bind(&cnPutBack, "cn_put_back")
	bind(&cnReceiveMany, "cn_receive_many")
	bind(&cnPutBackMany, "cn_put_back_many")
	bind(&cnNewChannel, "cn_new_channel")
	bind(&cnGroupAdd, "cn_group_add")
	bind(&cnGroupDiscard, "cn_group_discard")
	bind(&cnFlush, "cn_flush")
	bind(&cnCancel, "cn_cancel")
	bind(&cnStats, "cn_stats")
	bind(&cnSetBatch, "cn_set_batch_callback")
	bind(&cnQueueNew, "cn_queue_new")
	bind(&cnSetQueue, "cn_set_result_queue")
	bind(&cnQueueTake, "cn_queue_take")
	bind(&cnQueueFree, "cn_queue_free")
	if err != nil {
		return err
	}
	completeCB = purego.NewCallback(onComplete)
	logCB = purego.NewCallback(onLog)
	batchCB = purego.NewCallback(onBatch)
	return nil
}

// ---- Callbacks ------------------------------------------------------------------------------

// cbResult is one call of the completion callback, copied during the call.
type cbResult struct {
	Status  int32
	Text    string
	HasText bool // text was not NULL
	Data    []byte
	HasData bool // data was not NULL
	Len     uintptr
	Seq     uint64 // global order of all completion callbacks
	Tid     int    // the thread it ran on
}

// waiter receives the callbacks of the operations given its closure value.
type waiter struct {
	closure  uintptr
	ch       chan cbResult
	calls    atomic.Int64
	overflow atomic.Int64
	inCB     func(r cbResult) // runs inside the callback, on the library's thread; may be nil
}

// logRecord is one call of the log callback.
type logRecord struct {
	Level   int32
	Message string
}

// logSink receives the log records of the clients given its closure value.
type logSink struct {
	closure uintptr
	mu      sync.Mutex
	records []logRecord
	calls   atomic.Int64
}

var (
	nextClosure atomic.Uintptr // closure values: 1, 2, ... (0 would be NULL)
	waiters     sync.Map       // closure -> *waiter; never removed, late callbacks stay routable
	sinks       sync.Map       // closure -> *logSink
	cbSeq       atomic.Uint64

	strayMu sync.Mutex
	strays  []string // callbacks that reached no registered waiter, or panicked
)

func stray(format string, args ...any) {
	strayMu.Lock()
	strays = append(strays, fmt.Sprintf(format, args...))
	strayMu.Unlock()
}

// newWaiter registers a waiter whose channel holds up to buf results.
func newWaiter(buf int, inCB func(cbResult)) *waiter {
	w := &waiter{closure: nextClosure.Add(1), ch: make(chan cbResult, buf), inCB: inCB}
	waiters.Store(w.closure, w)
	return w
}

func newLogSink() *logSink {
	s := &logSink{closure: nextClosure.Add(1)}
	sinks.Store(s.closure, s)
	return s
}

func onComplete(closure uintptr, status int32, text, data, n uintptr) {
	defer func() {
		if r := recover(); r != nil {
			stray("panic in the completion callback (closure %d): %v", closure, r)
		}
	}()
	r := cbResult{Status: status, Len: n, Seq: cbSeq.Add(1), Tid: syscall.Gettid()}
	if text != 0 {
		r.Text, r.HasText = cString(text), true
	}
	if data != 0 {
		r.Data, r.HasData = cBytes(data, n), true
	}
	v, ok := waiters.Load(closure)
	if !ok {
		stray("completion callback with unknown closure %d (%s, %q)", closure, name(status), r.Text)
		return
	}
	w := v.(*waiter)
	w.calls.Add(1)
	if w.inCB != nil {
		w.inCB(r)
	}
	select {
	case w.ch <- r:
	default:
		w.overflow.Add(1)
	}
}

func onLog(closure uintptr, level int32, message uintptr) {
	defer func() {
		if r := recover(); r != nil {
			stray("panic in the log callback (closure %d): %v", closure, r)
		}
	}()
	text := ""
	if message != 0 {
		text = cString(message)
	}
	v, ok := sinks.Load(closure)
	if !ok {
		stray("log callback with unknown closure %d: %d %q", closure, level, text)
		return
	}
	s := v.(*logSink)
	s.calls.Add(1)
	s.mu.Lock()
	s.records = append(s.records, logRecord{level, text})
	s.mu.Unlock()
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

// takeString copies and frees a string the library returned through an out-parameter.
func takeString(p uintptr) string {
	s := cString(p)
	cnFree(p)
	return s
}

// takeBytes copies and frees a body the library returned through an out-parameter.
func takeBytes(p, n uintptr) []byte {
	b := cBytes(p, n)
	cnFree(p)
	return b
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
