package main

/*
#include <string.h>
#include "bridge.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/channels-nats/channels-nats/layer"
	"github.com/nats-io/nats.go"
)

var (
	errInvalidClient = handleError("not a client handle of this library (0, never issued, or not a client)")
	errInvalidQueue  = handleError("not a result queue of this library (0, never made, or freed with cn_queue_free)")
	errInvalidOp     = handleError("not an operation handle of this library (0, or never issued)")
	errConnecting    = errors.New("the client is still connecting; wait for its connect callback")
	errNotPending    = errors.New("the operation had already finished")
)

// argError is a bad argument (CN_INVALID_ARG).
type argError string

func (e argError) Error() string { return string(e) }

// handleError is a handle this library does not know (CN_INVALID_HANDLE).
type handleError string

func (e handleError) Error() string { return string(e) }

// configError is a bad configuration document (CN_INVALID_CONFIG).
type configError struct{ err error }

func (e configError) Error() string { return e.err.Error() }

// connectError is a connect that failed (CN_NO_SERVER): no server reached, or one refused it.
type connectError struct{ err error }

func (e connectError) Error() string { return e.err.Error() }
func (e connectError) Unwrap() error { return e.err }

// internalError is a recovered panic (CN_INTERNAL).
type internalError struct{ value any }

func (e internalError) Error() string { return fmt.Sprintf("internal error: %v", e.value) }

// statusOf maps an error of the layer or of this shim to its status code.
func statusOf(err error) C.cn_status {
	if err == nil {
		return C.CN_OK
	}
	return failureStatus(err)
}

// failureStatus is statusOf for a non-nil error. Apart from statusOf because the targets of
// errors.As escape: declared in statusOf they would be allocated on every call, success included.
func failureStatus(err error) C.cn_status {
	var (
		nameErr  *layer.NameError
		frameErr *layer.FrameError
		argErr   argError
		handErr  handleError
		cfgErr   configError
		connErr  connectError
		panicErr internalError
	)
	switch {
	case errors.As(err, &connErr): // first: it wraps whatever made the connect fail
		return C.CN_NO_SERVER
	case errors.As(err, &argErr):
		return C.CN_INVALID_ARG
	case errors.As(err, &cfgErr):
		return C.CN_INVALID_CONFIG
	case errors.As(err, &nameErr):
		return C.CN_INVALID_NAME
	case errors.As(err, &frameErr):
		return C.CN_INVALID_MESSAGE
	case errors.Is(err, layer.ErrMessageTooLarge):
		return C.CN_MESSAGE_TOO_LARGE
	case errors.Is(err, layer.ErrForeignChannel):
		return C.CN_FOREIGN_CHANNEL
	case errors.As(err, &handErr):
		return C.CN_INVALID_HANDLE
	case errors.Is(err, layer.ErrClosed):
		return C.CN_CLOSED
	case errors.Is(err, errNotPending), errors.Is(err, layer.ErrNotAgain):
		return C.CN_NOT_PENDING
	case errors.Is(err, errConnecting):
		return C.CN_ILLEGAL_STATE
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout), errors.Is(err, layer.ErrPublishTimeout):
		return C.CN_TIMEOUT
	case errors.As(err, &panicErr):
		return C.CN_INTERNAL
	}
	return C.CN_ERR
}

// errorText is the text a failure shows in cn_last_error() and results.
func errorText(err error) string { return err.Error() }

// resultText is a result's text: the error detail on failure, else the operation's own text.
func resultText(err error, text string) string {
	if err != nil {
		return errorText(err)
	}
	return text
}

// fail records err as this thread's last error and returns its status.
func fail(err error) C.cn_status {
	text := C.CString(errorText(err))
	C.bridge_set_last_error(text)
	C.free(unsafe.Pointer(text))
	return statusOf(err)
}

// result turns the outcome of a call into its status, recording the error if any.
func result(err error) C.cn_status {
	if err == nil {
		return C.CN_OK
	}
	return fail(err)
}

// recoverStatus turns a panic in an export into CN_INTERNAL instead of killing the host.
func recoverStatus(st *C.cn_status) {
	if r := recover(); r != nil {
		*st = fail(internalError{r})
	}
}

// recoverInGoroutine keeps a panic in a library goroutine from killing the host; it is logged.
func recoverInGoroutine(c *client) {
	if r := recover(); r != nil {
		c.logRecord(layer.LevelError, internalError{r}.Error())
	}
}

// goString copies a C string argument, which must be valid UTF-8; name says which argument.
func goString(p *C.char, name string, required bool) (string, error) {
	if p == nil && !required {
		return "", nil
	}
	s, err := lentBytes(p, name)
	if err == nil {
		err = checkUTF8(s, name)
	}
	return strings.Clone(s), err
}

// lentBytes reads a required C string argument in place, without copying it and without the
// UTF-8 check (checkUTF8): valid during the call only, so nothing may keep it. A caller that looks
// the string up first checks it only on a miss: a name the library holds was checked when made.
func lentBytes(p *C.char, name string) (string, error) {
	if p == nil {
		return "", argError(name + " must not be NULL")
	}
	return unsafe.String((*byte)(unsafe.Pointer(p)), cStringLength(p)), nil
}

// cStringLength is strlen, counted in Go: a call into C from inside an exported function costs
// more than counting the bytes of a name (a tenth of a receive that finds its message waiting).
func cStringLength(p *C.char) int {
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return n
}

func checkUTF8(s, name string) error {
	if !utf8.ValidString(s) {
		return argError(name + " is not valid UTF-8")
	}
	return nil
}

// storeAddress writes a pointer into a host's pointer out-parameter as an integer. A store of a
// Go pointer type into C memory would run the write barrier, which also looks at the value being
// overwritten: a stale lent body, possibly freed since, or uninitialized garbage.
func storeAddress(out unsafe.Pointer, address uintptr) { *(*uintptr)(out) = address }

// cBytes lends a C buffer to Go without copying; valid only during the call.
func cBytes(p *C.uint8_t, n C.size_t, name string) ([]byte, error) {
	if p == nil {
		return nil, argError(name + " must not be NULL")
	}
	if n == 0 {
		return []byte{}, nil
	}
	if uint64(n) > 1<<40 {
		return nil, argError(name + " length is not plausible")
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(p)), int(n)), nil
}
