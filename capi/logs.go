package main

/*
#include "bridge.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/channels-nats/channels-nats/layer"
)

// logBacklog is how many of a client's log records may wait for its log callback. A record made
// while that many wait is dropped, and the drops are reported in a record of their own.
const logBacklog = 1024

// queuedLog is one record waiting for the host's log callback.
type queuedLog struct {
	level   layer.Level
	message string
}

// logOutbox hands a client's log records to the host's callback on a goroutine of its own. The
// layer makes records where it holds its locks (a drop is counted under the layer lock), and a
// host may hold a lock of its own across every call into the library: a callback that needs
// that lock (Python's, the GIL) would deadlock against a thread of the host waiting for the
// layer's. Through the outbox no library thread waits for the host's callback, and a slow
// callback delays no message.
type logOutbox struct {
	callback C.cn_log_callback
	closure  C.uintptr_t

	mu      sync.Mutex
	records chan queuedLog // nil when there is no callback; closed by finish
	done    chan struct{}  // closed when the last record was handed over
	dropped atomic.Uint64  // records dropped since the last report of drops
}

// start begins handing records to callback, which may be NULL (records are dropped).
func (o *logOutbox) start(callback C.cn_log_callback, closure C.uintptr_t) {
	o.callback, o.closure = callback, closure
	o.done = make(chan struct{})
	if callback == nil {
		close(o.done)
		return
	}
	o.records = make(chan queuedLog, logBacklog)
	go o.deliver(o.records) // the channel itself: finish may clear the field before deliver runs
}

// add queues a record; it never waits. After finish it drops the record: nothing reaches the
// host after the result that ended the client.
func (o *logOutbox) add(level layer.Level, message string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.records == nil {
		return
	}
	select {
	case o.records <- queuedLog{level, message}:
	default:
		o.dropped.Add(1)
	}
}

// finish stops taking records and returns once the callback has had every record queued before.
func (o *logOutbox) finish() {
	o.mu.Lock()
	if o.records != nil {
		close(o.records)
		o.records = nil
	}
	o.mu.Unlock()
	<-o.done
}

// deliver calls the host's callback for each record in turn. A spell of drops is reported once
// the records queued before it were handed over: a drop happens only while records wait, so the
// report always follows.
func (o *logOutbox) deliver(records <-chan queuedLog) {
	defer close(o.done)
	for record := range records {
		o.invoke(record.level, record.message)
		if len(records) > 0 {
			continue
		}
		if n := o.dropped.Swap(0); n > 0 {
			o.invoke(layer.LevelWarning, fmt.Sprintf("channels_nats: %d log record(s) were dropped: "+
				"more than %d waited for the log callback, which returns too slowly", n, logBacklog))
		}
	}
}

func (o *logOutbox) invoke(level layer.Level, message string) {
	text := C.CString(message)
	defer C.free(unsafe.Pointer(text))
	C.bridge_invoke_log(o.callback, o.closure, C.int(level), text)
}
