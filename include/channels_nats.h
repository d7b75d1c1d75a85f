/*
 * channels_nats.h - the C ABI of channels-nats, a Django Channels channel layer on NATS.
 *
 * One library (libchannels_nats.so / .dylib / channels_nats.dll) holds the whole layer:
 * connection, reconnection, subscriptions, mailboxes, capacity, expiry, groups and
 * cancellation. C, Rust and the Python package all use it through the functions below, and every
 * program that uses the same NATS server and subject prefix joins the same layer.
 *
 * Conventions
 * -----------
 * - Every function name starts with cn_. Every function returns a cn_status, except the three
 *   accessors cn_status_text(), cn_last_error() and cn_version(), and cn_free().
 * - Strings are NUL-terminated UTF-8. Invalid UTF-8 is refused with CN_INVALID_ARG.
 * - Message bodies are msgpack maps with string keys, exactly as they travel on the wire (see
 *   "Wire contract" in the README). The library checks them (CN_INVALID_MESSAGE).
 * - Handles (cn_client, cn_op, cn_queue) are integers; 0 is never a valid handle. Handles are not
 *   reused.
 * - Inputs are copied before a call returns: the caller may free or reuse them at once.
 * - Memory the library returns through an out-parameter (char **, uint8_t **) belongs to the
 *   caller, who must release it with cn_free() and nothing else (the library may use another C
 *   runtime than the host, as on Windows).
 * - Data passed to a callback is valid only during the callback. Copy what you keep.
 *
 * Finishing at once, or later
 * ---------------------------
 * Operations that may wait on the network take a cn_callback and a closure:
 * - If the operation can finish without waiting, it finishes during the call: it returns CN_OK
 *   (or an error) and fills its out-parameters; the callback is not called.
 * - Otherwise it returns CN_PENDING, stores an operation handle in *op (when op is not NULL), and
 *   the callback is called exactly once, later, on a library thread, with the result - unless
 *   cn_cancel() withdrew the operation first. A client can instead hand its results over in
 *   batches (cn_set_batch_callback) or keep them in a result queue that the host empties on its
 *   own thread (cn_set_result_queue): the same results, without per-operation callbacks.
 * - If callback is NULL, the call waits on the calling thread until the operation finishes and
 *   never returns CN_PENDING. Such a waiting call is refused with CN_ILLEGAL_STATE when it is made
 *   from inside a callback of this library for receive, connect and close, because the thread it
 *   would block delivers the results it waits for.
 *
 * Threads
 * -------
 * All functions may be called from any thread, concurrently. Callbacks run on threads the
 * library owns. A client delivers received messages from one dispatch thread, in arrival order;
 * messages returned with cn_put_back() that go to a waiting receive or stream are delivered from
 * that thread too, in their order. A callback must return quickly: while it runs, this client
 * delivers nothing else. A callback may call any function of this library, with the limits above.
 *
 * After cn_close() has returned CN_OK (waiting form) or has called its callback (pending form),
 * no callback of that client runs any more, and the client handle is invalid (CN_CLOSED).
 *
 * Processes
 * ---------
 * A process forked after the library was loaded cannot use it: every call in the child returns
 * CN_FORKED at once, without entering the library. Load the library (or create the channel
 * layer) in the worker process after the fork, or use a spawn start method.
 */
#ifndef CHANNELS_NATS_H
#define CHANNELS_NATS_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32) && defined(CN_BUILDING_LIBRARY)
#define CN_EXTERN __declspec(dllexport)
#elif defined(_WIN32)
#define CN_EXTERN __declspec(dllimport)
#elif defined(CN_BUILDING_LIBRARY)
/* The macOS build hides every other C symbol (-fvisibility=hidden), because zig's linker, which
   cross-links it, ignores export lists. */
#define CN_EXTERN __attribute__((visibility("default")))
#else
#define CN_EXTERN
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. cn_status_text() names each; cn_last_error() gives the detail of a failure. */
typedef enum {
    CN_OK = 0,               /* done */
    CN_PENDING = 1,          /* continues; the callback reports the result */
    CN_ERR = 2,              /* failed for a reason not listed below; see cn_last_error() */
    CN_INVALID_ARG = 3,      /* a NULL pointer where one is not allowed, invalid UTF-8, a bad length */
    CN_INVALID_CONFIG = 4,   /* the configuration document is not valid JSON or has an unknown key or bad value */
    CN_INVALID_NAME = 5,     /* a channel, group or prefix name the layer refuses */
    CN_INVALID_MESSAGE = 6,  /* the body is not a msgpack map with string keys, or uses the reserved key */
    CN_MESSAGE_TOO_LARGE = 7,/* body and headers exceed the server's max_payload; nothing was sent */
    CN_FOREIGN_CHANNEL = 8,  /* receive or group_add on a process channel of another client */
    CN_INVALID_HANDLE = 9,   /* 0, or a handle this library never issued */
    CN_CLOSED = 10,          /* the client is closed, or was closed while the operation waited */
    CN_CANCELLED = 11,       /* the operation was cancelled (only when waiting on the calling thread) */
    CN_NOT_PENDING = 12,     /* cn_cancel(): the operation had already finished; its callback runs or ran */
    CN_ILLEGAL_STATE = 13,   /* not possible now: the client is still connecting, or a waiting call from a callback */
    CN_NO_SERVER = 14,       /* connect: no server of the list could be reached */
    CN_TIMEOUT = 15,         /* a bounded wait (connect_timeout, flush_timeout) ran out */
    CN_FORKED = 16,          /* called in a process forked after the library was loaded */
    CN_INTERNAL = 17         /* a bug in the library was caught; the process can go on */
} cn_status;

/* A connected client: one NATS connection and its channel-layer state. 0 is invalid. */
typedef uint64_t cn_client;

/* A pending operation, for cn_cancel(). 0 is invalid. */
typedef uint64_t cn_op;

/* A result queue (see cn_queue_new). */
typedef uint64_t cn_queue;

/* Log levels, the same numbers as Python's logging module. */
enum { CN_LOG_DEBUG = 10, CN_LOG_INFO = 20, CN_LOG_WARNING = 30, CN_LOG_ERROR = 40 };

/*
 * The completion callback of a pending operation.
 *   closure  the pointer given with the operation, unchanged.
 *   status   CN_OK, or the error that ended the operation (CN_CLOSED when the client was closed).
 *   text     on failure, the error detail; on success, the operation's text result (the channel
 *            name for cn_new_channel), or NULL. Valid during the call only.
 *   data,len on success of cn_receive, the message body; otherwise NULL and 0. Valid during the
 *            call only. A receiver that cannot use a message it got must return it with
 *            cn_put_back(), or it is lost.
 */
typedef void (*cn_callback)(void *closure, cn_status status, const char *text,
                            const uint8_t *data, size_t len);

/* One result in a batch (see cn_set_batch_callback): the same values a cn_callback gets. */
typedef struct cn_result {
    void *closure;        /* the closure given with the operation */
    cn_status status;
    const char *text;     /* NULL when there is none */
    const uint8_t *data;  /* NULL when there is none */
    size_t len;
} cn_result;

/*
 * Receives the results of a client's pending operations in batches (see cn_set_batch_callback).
 * results[0..count-1] and everything they point to are valid during the call only.
 */
typedef void (*cn_batch_callback)(void *closure, const cn_result *results, size_t count);

/*
 * The log callback of a client: warnings about drops, reconnects and lost publishes (level is
 * one of CN_LOG_*). message is valid during the call only. It may run on any library thread,
 * also while the library holds internal locks: it must not call functions of this library.
 */
typedef void (*cn_log_callback)(void *closure, int level, const char *message);

/* ---- Library ---------------------------------------------------------------------------- */

/* The library version, e.g. "0.1.0". A static string: never free it. Never NULL. */
CN_EXTERN const char *cn_version(void);

/* The name of a status code, e.g. "CN_CLOSED: the client is closed". A static string: never
   free it. An unknown code gives a text that says so. Never NULL. */
CN_EXTERN const char *cn_status_text(cn_status status);

/* The detail of the last call on this thread that failed, or "" when the last call succeeded.
   Owned by the library and valid until the next call of this library on this thread. Never NULL.
   Credentials from server URLs never appear in it. */
CN_EXTERN const char *cn_last_error(void);

/* Releases memory the library returned through an out-parameter. NULL is ignored. */
CN_EXTERN void cn_free(void *ptr);

/* ---- Clients ---------------------------------------------------------------------------- */

/*
 * Connects a new client.
 *   config_json  the configuration: a JSON object with the keys of the Django CONFIG block,
 *                e.g. {"servers": ["nats://127.0.0.1:4222"], "prefix": "channels"}. NULL or ""
 *                means all defaults. Durations are seconds. An unknown key is CN_INVALID_CONFIG,
 *                and cn_last_error() lists the known keys.
 *   log, log_closure  where the client's log records go; log may be NULL (records are dropped).
 *   callback, closure  completion; NULL waits for the connection on the calling thread.
 *   client       required; receives the new handle at once, even when CN_PENDING is returned.
 *                The handle can be used once the connection is made (CN_ILLEGAL_STATE before);
 *                if the connection fails, it is released and later calls return CN_CLOSED.
 * Returns CN_OK, CN_PENDING, CN_INVALID_ARG, CN_INVALID_CONFIG, CN_NO_SERVER, CN_TIMEOUT,
 * CN_ILLEGAL_STATE (waiting form inside a callback), CN_FORKED, CN_INTERNAL.
 * The callback reports CN_OK, CN_NO_SERVER, CN_TIMEOUT or CN_CLOSED (closed while connecting).
 */
CN_EXTERN cn_status cn_connect(const char *config_json, cn_log_callback log, void *log_closure,
                               cn_callback callback, void *closure, cn_client *client);

/*
 * Closes a client: waiting receives and other pending operations end with CN_CLOSED through
 * their callbacks, publishes still buffered are drained within drain_timeout, and the connection
 * is closed. Closing never fails; what could not be sent is logged. Afterwards no callback of the
 * client runs and the handle is invalid. A connect still in progress is abandoned.
 *   callback, closure  completion (always CN_OK); NULL waits on the calling thread.
 * Returns CN_OK, CN_PENDING, CN_INVALID_HANDLE, CN_CLOSED (already closed or closing),
 * CN_ILLEGAL_STATE (waiting form inside a callback), CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_close(cn_client client, cn_callback callback, void *closure);

/* ---- Messages --------------------------------------------------------------------------- */

/*
 * Sends a message to a channel: a process channel ("specific.<id>!<local>", of any client) or a
 * plain channel name. Nothing is sent when an error is returned. A message sent to a channel
 * nobody receives on is lost: delivery is at most once.
 *   body, len  the msgpack map; required.
 * Finishes at once unless the connection is being replaced after it was closed for good; then
 * CN_PENDING (or the waiting form waits). A pending send that is cancelled may still have been
 * published.
 * Returns CN_OK, CN_PENDING, CN_INVALID_ARG, CN_INVALID_NAME, CN_INVALID_MESSAGE,
 * CN_MESSAGE_TOO_LARGE, CN_INVALID_HANDLE, CN_CLOSED, CN_ILLEGAL_STATE, CN_ERR, CN_FORKED,
 * CN_INTERNAL.
 */
CN_EXTERN cn_status cn_send(cn_client client, const char *channel, const uint8_t *body, size_t len,
                            cn_callback callback, void *closure, cn_op *op);

/*
 * Sends a message to every member of a group, in every process: one publish, the server fans it
 * out. A group without members is not an error. Otherwise as cn_send().
 */
CN_EXTERN cn_status cn_group_send(cn_client client, const char *group, const uint8_t *body,
                                  size_t len, cn_callback callback, void *closure, cn_op *op);

/*
 * Receives the next message of a channel: a process channel this client made, the prefix of this
 * client's process channels ("specific.<id>!", which gets every message of them that has no
 * mailbox of its own), or a plain channel (the first receive subscribes to it).
 * When a message is waiting, it is returned at once: CN_OK with *body and *len set (the caller
 * frees *body with cn_free()). Otherwise CN_PENDING, and the callback gets the message.
 *   body, len  required.
 * cn_cancel() on a pending receive never loses a message: one already taken for it goes back to
 * the front of the mailbox. A receive of a plain channel whose last reader was cancelled keeps its
 * subscription for release_linger, so back-to-back receives with timeouts lose nothing.
 * Returns CN_OK, CN_PENDING, CN_INVALID_ARG, CN_INVALID_NAME, CN_FOREIGN_CHANNEL,
 * CN_INVALID_HANDLE, CN_CLOSED, CN_ILLEGAL_STATE, CN_ERR, CN_FORKED, CN_INTERNAL.
 * The callback reports CN_OK (with data), CN_CLOSED, CN_TIMEOUT (subscription not confirmed) or
 * CN_ERR.
 */
CN_EXTERN cn_status cn_receive(cn_client client, const char *channel, cn_callback callback,
                               void *closure, uint8_t **body, size_t *len, cn_op *op);

/*
 * Returns a message that a receiver got but cannot use (its task was cancelled after the
 * callback ran) to the front of the channel's mailbox, or to the next waiting receive.
 *   channel  the channel it was received on; body, len  the message as received.
 * Returns CN_OK, CN_INVALID_ARG, CN_INVALID_NAME, CN_INVALID_HANDLE, CN_CLOSED, CN_FORKED,
 * CN_INTERNAL.
 */
CN_EXTERN cn_status cn_put_back(cn_client client, const char *channel, const uint8_t *body,
                                size_t len);

/*
 * Takes up to max messages that are waiting in a channel's mailbox, oldest first, without
 * waiting and without subscribing: for hosts that buffer received messages themselves (one call
 * for many messages). They count as delivered. A host that will not deliver some of them must
 * return them with cn_put_back_many(), or they are lost; it should not keep them longer than
 * their time left (they would have expired in the mailbox).
 *   max    at most this many (0 takes none).
 *   block  required; receives NULL when *count is 0, else the messages back to back, each as a
 *          record: uint32 body length, uint32 milliseconds left before it expires (both
 *          little-endian), then the body. Free it with cn_free().
 *   len    required; receives the block's size in bytes.
 *   count  required; receives how many messages it holds (0: none waiting, or the channel's
 *          subscription is not confirmed yet; cn_receive() then does what is needed).
 * Returns CN_OK, CN_INVALID_ARG, CN_INVALID_NAME, CN_FOREIGN_CHANNEL, CN_INVALID_HANDLE,
 * CN_CLOSED, CN_ILLEGAL_STATE, CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_receive_many(cn_client client, const char *channel, size_t max,
                                    uint8_t **block, size_t *len, size_t *count);

/*
 * Returns messages taken with cn_receive_many() that the host will not deliver to the front of
 * the channel's mailbox, in their order (or to waiting receives), with the time each has left
 * now, so they expire when they would have.
 *   block, len  records in the form cn_receive_many() gives (the time left updated, or not);
 *               len 0 returns nothing. The library copies what it keeps.
 * Returns CN_OK, CN_INVALID_ARG (NULL, or a block that ends inside a record), CN_INVALID_NAME,
 * CN_INVALID_HANDLE, CN_CLOSED, CN_ILLEGAL_STATE, CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_put_back_many(cn_client client, const char *channel, const uint8_t *block,
                                     size_t len);

/*
 * Starts a stream: a standing receive on a channel that hands over each of its next credit
 * messages as a result of its own, with closure, in arrival order, with no call per message. A
 * host that receives on a channel again and again (an event loop serving a consumer) makes one
 * call per credit instead of one per message. While the stream has credit it is first in line
 * for the channel's messages; when the credit is used it ends, and the host starts another.
 *   credit    how many messages it may take; at least 1.
 *   callback  required (a stream has no waiting form); called once per message with CN_OK, the
 *             body in data, and in text NULL when the message arrived just now, or else the
 *             milliseconds it has left before it would have expired in its mailbox (decimal).
 *             A stream that ends because the client closed gets one more call, CN_CLOSED.
 *   op        optional; on CN_PENDING receives the stream's handle, for cn_stream_stop().
 * A stream starts only on an empty mailbox, so that no message overtakes another: when messages
 * are waiting it starts nothing and returns CN_OK; take them (cn_receive_many(), cn_receive())
 * and call again. It never waits: before the channel's subscription is confirmed (a plain
 * channel that was never received on) it returns CN_ILLEGAL_STATE; cn_receive() subscribes.
 * Like a receive, a message handed over is delivered; one the host will not deliver goes back
 * with cn_put_back() or cn_put_back_many(), or it is lost. cn_cancel() stops a stream too, but
 * does not tell how many results are still to come.
 * Returns CN_OK (nothing started), CN_PENDING, CN_INVALID_ARG, CN_INVALID_NAME,
 * CN_FOREIGN_CHANNEL, CN_INVALID_HANDLE, CN_CLOSED, CN_ILLEGAL_STATE, CN_ERR, CN_FORKED,
 * CN_INTERNAL.
 */
CN_EXTERN cn_status cn_receive_stream(cn_client client, const char *channel, uint32_t credit,
                                      cn_callback callback, void *closure, cn_op *op);

/*
 * Stops a stream and tells how much of its credit it had not used.
 *   unused  required; on CN_OK receives that credit. Of the stream's credit, exactly the rest is
 *           (or was) delivered: results of messages it took just before the stop may still come
 *           after this returns. The host knows the stream is over when it has them all.
 * CN_NOT_PENDING: the stream had already ended (credit used, stopped, or closed); *unused is 0.
 * Returns CN_OK, CN_NOT_PENDING, CN_INVALID_ARG (unused NULL, or op is not a stream),
 * CN_INVALID_HANDLE, CN_CLOSED, CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_stream_stop(cn_client client, cn_op op, uint32_t *unused);

/* ---- Channels and groups ---------------------------------------------------------------- */

/*
 * Makes a new process channel of this client, "<prefix>.<client id>!<32 hex>", with its mailbox:
 * messages sent to it from now on are kept until received, expired or reclaimed.
 *   prefix   NULL or "" for "specific".
 *   channel  required; on CN_OK receives the name (free it with cn_free()). With CN_PENDING the
 *            callback gets the name as its text.
 * Finishes at once when the client's process subscription is already confirmed by the server.
 * Returns CN_OK, CN_PENDING, CN_INVALID_ARG, CN_INVALID_NAME, CN_INVALID_HANDLE, CN_CLOSED,
 * CN_ILLEGAL_STATE, CN_TIMEOUT, CN_ERR, CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_new_channel(cn_client client, const char *prefix, cn_callback callback,
                                   void *closure, char **channel, cn_op *op);

/*
 * Adds a channel to a group in this client. Adding a member twice is not an error. Finishes at
 * once when the subscriptions it needs are already confirmed by the server. A pending group_add
 * that is cancelled leaves no membership behind.
 * Returns CN_OK, CN_PENDING, CN_INVALID_ARG, CN_INVALID_NAME, CN_FOREIGN_CHANNEL,
 * CN_INVALID_HANDLE, CN_CLOSED, CN_ILLEGAL_STATE, CN_TIMEOUT, CN_ERR, CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_group_add(cn_client client, const char *group, const char *channel,
                                 cn_callback callback, void *closure, cn_op *op);

/* Removes a channel from a group in this client. Removing a non-member is not an error. Always
   finishes at once. Returns CN_OK, CN_INVALID_ARG, CN_INVALID_NAME, CN_INVALID_HANDLE,
   CN_CLOSED, CN_ILLEGAL_STATE, CN_FORKED, CN_INTERNAL. */
CN_EXTERN cn_status cn_group_discard(cn_client client, const char *group, const char *channel);

/* Resets this client's state: mailboxes, memberships and subscriptions. Receives that are waiting
   keep waiting. Never waits on the network and never fails on a dead connection. Returns CN_OK,
   CN_INVALID_HANDLE, CN_CLOSED, CN_ILLEGAL_STATE, CN_FORKED, CN_INTERNAL. */
CN_EXTERN cn_status cn_flush(cn_client client);

/* ---- Operations ------------------------------------------------------------------------- */

/*
 * Withdraws a pending operation. CN_OK: it was withdrawn and its callback will not run (a message
 * already taken for a receive went back to its mailbox). CN_NOT_PENDING: it had already finished
 * and its callback runs or ran. Cancelling a send does not unsend what was published.
 * Returns CN_OK, CN_NOT_PENDING, CN_INVALID_HANDLE (unknown client, op 0 or an op handle this
 * library never issued), CN_CLOSED,
 * CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_cancel(cn_client client, cn_op op);

/*
 * Delivers the results of this client's pending operations in batches: from now on, instead of
 * calling each operation's callback, the library calls callback once with every result that is
 * ready, in the order they finished. Operations still need a non-NULL callback to run in the
 * pending form; it is not called. A host whose callbacks are expensive to enter (an interpreter
 * lock to take) pays that once per batch instead of once per message. Call it once, before the
 * first pending operation (it may be called while the client is still connecting). cn_close()'s
 * own callback and cn_connect()'s are not batched. The batch callback runs on one library thread.
 * Returns CN_OK, CN_INVALID_ARG (callback NULL), CN_INVALID_HANDLE, CN_CLOSED, CN_ILLEGAL_STATE
 * (a batch callback or a result queue is already set, or operations are pending), CN_FORKED,
 * CN_INTERNAL.
 */
CN_EXTERN cn_status cn_set_batch_callback(cn_client client, cn_batch_callback callback, void *closure);

/* ---- Result queues ---------------------------------------------------------------------- */

/*
 * Makes a result queue: clients attached to it (cn_set_result_queue) put the results of their
 * pending operations in it, and the host takes them with cn_queue_take() whenever it likes, on any
 * thread. No library thread calls into the host for these results, which suits an event loop in a
 * runtime with an interpreter lock: it watches notify and takes the results on its own thread.
 *   notify  -1, or the write end the library signals: a file descriptor (POSIX: a pipe or a
 *           socket, preferably non-blocking) or a SOCKET (Windows). Whenever the queue goes from
 *           empty to non-empty, the library writes one byte to it; the results one arriving
 *           message produces together (a group message finishing many waiting receives) are
 *           signalled once, after the last of them is queued. The host reads and discards
 *           these bytes BEFORE it takes results (so no result is left behind unsignalled), and
 *           keeps notify open until cn_queue_free(). With -1 the host polls.
 *   queue   required; receives the handle.
 * One queue may serve several clients. Returns CN_OK, CN_INVALID_ARG (queue NULL, or notify is not
 * an open descriptor), CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_queue_new(intptr_t notify, cn_queue *queue);

/*
 * Puts the results of this client's pending operations into queue instead of calling each
 * operation's callback (which must still be non-NULL for an operation to run in the pending
 * form; it is not called). A result is in the queue before cn_cancel() can report CN_NOT_PENDING
 * for its operation. Call it once, before the first pending operation (it may be called while
 * the client is still connecting). cn_close()'s own callback and cn_connect()'s are not queued.
 * Results that cn_close() ends (CN_CLOSED) are queued too; take them after the close.
 * Returns CN_OK, CN_INVALID_HANDLE (client or queue), CN_CLOSED, CN_ILLEGAL_STATE (a batch
 * callback or a queue is already set, or operations are pending), CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_set_result_queue(cn_client client, cn_queue queue);

/*
 * Takes up to capacity results from queue, oldest first, without waiting.
 *   results   an array of capacity cn_result the library fills (may be NULL when capacity is 0).
 *   count     required; receives how many were taken (0: the queue was empty).
 *   memory    required; receives NULL when count is 0, else the block the results' text and data
 *             point into. The results stay valid until the caller frees it with cn_free().
 * A receive's message that the host took but cannot deliver must go back with cn_put_back().
 * Several threads may take from one queue at once; each result is taken once.
 * Returns CN_OK, CN_INVALID_ARG, CN_INVALID_HANDLE, CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_queue_take(cn_queue queue, cn_result *results, size_t capacity,
                                  size_t *count, void **memory);

/*
 * Frees a queue. Results nobody took are discarded (their clients are closed). The library never
 * closes notify; the host may close it after this call.
 * Returns CN_OK, CN_INVALID_HANDLE, CN_ILLEGAL_STATE (a client attached to it is not closed),
 * CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_queue_free(cn_queue queue);

/* ---- Statistics ------------------------------------------------------------------------- */

/*
 * The client's counters as a JSON object: published, delivered, dropped (capacity, expired,
 * slow_consumer, bad_frame, no_mailbox), handed_back, reconnects, recoveries, groups_expired,
 * subscriptions, mailboxes, groups, connected, client_id, and goroutines (the library's, for all
 * clients: a leak check).
 *   json  required; receives the document (free it with cn_free()).
 * Returns CN_OK, CN_INVALID_ARG, CN_INVALID_HANDLE, CN_CLOSED, CN_ILLEGAL_STATE, CN_FORKED,
 * CN_INTERNAL.
 */
CN_EXTERN cn_status cn_stats(cn_client client, char **json);

#ifdef __cplusplus
}
#endif

#endif /* CHANNELS_NATS_H */
