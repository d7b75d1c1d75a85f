/*
 * The exported cn_* functions. Each checks for a fork before it enters the Go runtime (a child
 * forked after the runtime started would hang in it), clears the thread's last error, and calls
 * the Go implementation (cngo_*, exports.go). Only cn_* symbols leave the library (exports.map).
 */
#define CN_BUILDING_LIBRARY
#include <string.h>
#include "bridge.h"
#include "_cgo_export.h"

#define CN_VERSION_TEXT "1.0.0"

#if defined(_WIN32)
#define CN_THREAD_LOCAL __thread /* mingw-w64 gcc ignores __declspec(thread) (only a warning) */
static int cn_forked(void) { return 0; } /* Windows has no fork */
#else
#include <pthread.h>
#if defined(__linux__)
/* The Go runtime's own thread-local variable uses the initial-exec model, which makes the whole
   library's TLS block static (the DT_FLAGS STATIC_TLS flag): the loader sets it up in every
   thread at dlopen. Initial-exec for ours too costs no more room, and their accesses become
   plain loads instead of a __tls_get_addr call at the start of every cn_* call. */
#define CN_THREAD_LOCAL __thread __attribute__((tls_model("initial-exec")))
#else
#define CN_THREAD_LOCAL __thread
#endif
/* Set in the child of every fork. A flag, not a getpid() per call: getpid is a system call. */
static volatile int cn_child_of_fork;
static void cn_note_fork(void) { cn_child_of_fork = 1; }
__attribute__((constructor)) static void cn_watch_forks(void) { pthread_atfork(NULL, NULL, cn_note_fork); }
static int cn_forked(void) { return cn_child_of_fork; }
#endif

static CN_THREAD_LOCAL char cn_error_text[1024];
static CN_THREAD_LOCAL int cn_in_log_callback;

void bridge_set_last_error(const char *text) {
    size_t n = strlen(text);
    if (n >= sizeof cn_error_text) {
        n = sizeof cn_error_text - 1;
    }
    memcpy(cn_error_text, text, n);
    cn_error_text[n] = '\0';
}

void bridge_invoke_log(cn_log_callback callback, uintptr_t closure, int level, const char *message) {
    cn_in_log_callback++;
    callback((void *)closure, level, message);
    cn_in_log_callback--;
}

/* Every entry point starts here: refuses forked children and calls from the log callback (the
   library may hold the locks such a call needs), and resets the last error. */
#define CN_ENTER()                                                                            \
    do {                                                                                      \
        if (cn_forked()) {                                                                    \
            bridge_set_last_error("this process was forked after channels_nats was loaded; "  \
                                  "load it (create the layer) in the worker after the fork"); \
            return CN_FORKED;                                                                 \
        }                                                                                     \
        if (cn_in_log_callback > 0) {                                                         \
            bridge_set_last_error("functions of this library cannot be called from its log "  \
                                  "callback");                                                \
            return CN_ILLEGAL_STATE;                                                          \
        }                                                                                     \
        cn_error_text[0] = '\0';                                                              \
    } while (0)

#define CN_CLOSURE(p) ((uintptr_t)(p))

const char *cn_version(void) { return CN_VERSION_TEXT; }

const char *cn_status_text(cn_status status) {
    switch (status) {
    case CN_OK: return "CN_OK: done";
    case CN_PENDING: return "CN_PENDING: continues; its result will be in the queue";
    case CN_ERR: return "CN_ERR: failed";
    case CN_INVALID_ARG: return "CN_INVALID_ARG: invalid argument";
    case CN_INVALID_CONFIG: return "CN_INVALID_CONFIG: invalid configuration";
    case CN_INVALID_NAME: return "CN_INVALID_NAME: invalid channel, group or prefix name";
    case CN_INVALID_MESSAGE: return "CN_INVALID_MESSAGE: not a Channels message";
    case CN_MESSAGE_TOO_LARGE: return "CN_MESSAGE_TOO_LARGE: over the server's max_payload";
    case CN_FOREIGN_CHANNEL: return "CN_FOREIGN_CHANNEL: process channel of another client";
    case CN_INVALID_HANDLE: return "CN_INVALID_HANDLE: not a handle of this library";
    case CN_CLOSED: return "CN_CLOSED: the client is closed";
    case CN_NOT_PENDING: return "CN_NOT_PENDING: the operation had already finished";
    case CN_ILLEGAL_STATE: return "CN_ILLEGAL_STATE: not possible now";
    case CN_NO_SERVER: return "CN_NO_SERVER: no server could be reached";
    case CN_TIMEOUT: return "CN_TIMEOUT: timed out";
    case CN_FORKED: return "CN_FORKED: the process was forked after the library was loaded";
    case CN_INTERNAL: return "CN_INTERNAL: internal error";
    }
    return "unknown status code";
}

const char *cn_last_error(void) { return cn_error_text; }

void cn_free(void *ptr) {
    /* free() needs no Go runtime, so a forked child may release what its parent got. */
    free(ptr);
}

cn_status cn_queue_new(intptr_t notify, cn_queue *queue) {
    CN_ENTER();
    return cngo_queue_new(notify, queue);
}

cn_status cn_queue_take(cn_queue queue, cn_result *results, size_t capacity, size_t *count) {
    CN_ENTER();
    return cngo_queue_take(queue, results, capacity, count);
}

cn_status cn_queue_free(cn_queue queue) {
    CN_ENTER();
    return cngo_queue_free(queue);
}

cn_status cn_connect(const char *config_json, cn_log_callback log, void *log_closure,
                     cn_queue queue, void *closure, cn_client *client) {
    CN_ENTER();
    return cngo_connect((char *)config_json, log, CN_CLOSURE(log_closure), queue,
                        CN_CLOSURE(closure), client);
}

cn_status cn_close(cn_client client, cn_queue queue, void *closure) {
    CN_ENTER();
    return cngo_close(client, queue, CN_CLOSURE(closure));
}

cn_status cn_stats(cn_client client, char **json) {
    CN_ENTER();
    return cngo_stats(client, json);
}

cn_status cn_send(cn_client client, const char *channel, const uint8_t *body, size_t len,
                  cn_queue queue, void *closure, cn_op *op) {
    CN_ENTER();
    return cngo_send(client, (char *)channel, (uint8_t *)body, len, queue, CN_CLOSURE(closure), op);
}

cn_status cn_group_send(cn_client client, const char *group, const uint8_t *body, size_t len,
                        cn_queue queue, void *closure, cn_op *op) {
    CN_ENTER();
    return cngo_group_send(client, (char *)group, (uint8_t *)body, len, queue, CN_CLOSURE(closure), op);
}

cn_status cn_receive(cn_client client, const char *channel, cn_queue queue, void *closure,
                     const uint8_t **body, size_t *len, cn_op *op) {
    CN_ENTER();
    return cngo_receive(client, (char *)channel, queue, CN_CLOSURE(closure), (uint8_t **)body, len, op);
}

cn_status cn_cancel(cn_client client, cn_op op) {
    CN_ENTER();
    return cngo_cancel(client, op);
}

cn_status cn_new_channel(cn_client client, const char *prefix, cn_queue queue, void *closure,
                         char **channel, cn_op *op) {
    CN_ENTER();
    return cngo_new_channel(client, (char *)prefix, queue, CN_CLOSURE(closure), channel, op);
}

cn_status cn_group_add(cn_client client, const char *group, const char *channel, cn_queue queue,
                       void *closure, cn_op *op) {
    CN_ENTER();
    return cngo_group_add(client, (char *)group, (char *)channel, queue, CN_CLOSURE(closure), op);
}

cn_status cn_group_discard(cn_client client, const char *group, const char *channel) {
    CN_ENTER();
    return cngo_group_discard(client, (char *)group, (char *)channel);
}

cn_status cn_flush(cn_client client) {
    CN_ENTER();
    return cngo_flush(client);
}

cn_status cn_read_events(cn_client client, intptr_t *fd) {
    CN_ENTER();
    return cngo_read_events(client, fd);
}

cn_status cn_on_readable(cn_client client, cn_queue queue) {
    CN_ENTER();
    return cngo_on_readable(client, queue);
}
