/* Declarations shared by the Go side of the C ABI (cgo preamble) and wrappers.c. Internal. */
#ifndef CN_BRIDGE_H
#define CN_BRIDGE_H

#include <stdint.h>
#include <stdlib.h>
#include "channels_nats.h"

/* Sets this thread's cn_last_error() text. */
void bridge_set_last_error(const char *text);

/* Calls a host's log callback; marks the thread as inside it meanwhile. Go cannot call C function
   pointers directly. */
void bridge_invoke_log(cn_log_callback callback, uintptr_t closure, int level, const char *message);

/* 1 where the library is built against glibc, which reads the stack bounds of a process's main
   thread from /proc/self/maps (stackBoundsWarning in runtime.go); musl and the others do not. */
#if defined(__GLIBC__)
#define BRIDGE_GLIBC 1
#else
#define BRIDGE_GLIBC 0
#endif

#endif
