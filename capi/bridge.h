/* Declarations shared by the Go side of the C ABI (cgo preamble) and wrappers.c. Internal. */
#ifndef CN_BRIDGE_H
#define CN_BRIDGE_H

#include <stdint.h>
#include <stdlib.h>
#include "channels_nats.h"

/* Sets this thread's cn_last_error() text. */
void bridge_set_last_error(const char *text);

/* Fills a result in host memory. Pointers arrive as integers: Go must not store Go pointers into
   C memory itself, because its write barrier would also look at the stale pointers it
   overwrites (bodies lent by an earlier take, possibly freed since). */
void bridge_set_result(cn_result *result, cn_op op, uintptr_t closure, cn_status status,
                       const char *text, uintptr_t data, size_t len);

/* Stores a pointer in a host's pointer out-parameter (*out = value), for the same reason: the
   slot may hold a stale lent body, or uninitialized garbage. */
void bridge_store_pointer(void *out, uintptr_t value);

/* Calls a host's log callback; marks the thread as inside it meanwhile. Go cannot call C function
   pointers directly. */
void bridge_invoke_log(cn_log_callback callback, uintptr_t closure, int level, const char *message);

#endif
