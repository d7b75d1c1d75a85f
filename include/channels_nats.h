/*
 * channels_nats.h - the C ABI of channels-nats, a Django Channels channel layer on NATS.
 *
 * One library (libchannels_nats.so / .dylib / channels_nats.dll) holds the whole layer:
 * connection, reconnection, subscriptions, mailboxes, capacity, expiry, groups, outbound
 * buffering and cancellation. C, Rust and the Python package all use it through the functions
 * below, the same way, and every program that uses the same NATS server and subject prefix
 * joins the same layer.
 *
 * Conventions
 * -----------
 * - Every call that can start an operation sets *op (when op is not NULL) to 0, or to the
 *   handle of the pending operation.
 * - Every function name starts with cn_. Every function returns a cn_status, except the three
 *   accessors cn_version(), cn_status_text() and cn_last_error(), and cn_free().
 * - Strings are NUL-terminated UTF-8. Invalid UTF-8 is refused with CN_INVALID_ARG.
 * - Message bodies are msgpack maps with string keys, exactly as they travel on the wire (see
 *   "Wire contract" in the README). The library checks them (CN_INVALID_MESSAGE).
 * - Handles (cn_client, cn_op, cn_queue) are integers from one counter; 0 is never a valid
 *   handle, and no handle is ever reused.
 * - The host never holds messages for the library: the mailbox of each channel, inside the
 *   library, is the only place a message waits, and it alone applies capacity and expiry.
 * - Inputs are copied before a call returns: the caller may free or reuse them at once.
 * - Memory returned through char ** (a channel name, statistics) belongs to the caller, who
 *   releases it with cn_free() and nothing else (the library may use another C runtime than the
 *   host, as on Windows). Message bodies and result texts are lent instead: they belong to the
 *   library and stay valid until the next cn_queue_take() or cn_receive() with the same queue,
 *   or cn_queue_free() of it. Copy what you keep longer.
 *
 * No call waits on the network
 * ----------------------------
 * Every call finishes at once. An operation that can be done without waiting is done during the
 * call: it returns CN_OK (or an error) and fills its out-parameters. One that has to wait (for a
 * message, for room in the outbound buffer, for the server to confirm a subscription, for a
 * connection) returns CN_PENDING, stores its handle in *op, and later puts exactly one result
 * (a cn_result) into the result queue given with it, unless cn_cancel() withdrew it first (a
 * receive that cn_receive() starts over is pending again: one more result per CN_PENDING, and
 * one per successful swap of its cn_result.rearm word). No
 * library thread ever calls into the host for a result: the host takes results
 * from its queue on its own thread, whenever it likes. This holds whatever the network does:
 * with the server frozen or the link stalled, calls keep returning at once, and sends wait as
 * CN_PENDING (backpressure) instead of blocking their thread.
 *
 * Result queues and threads
 * -------------------------
 * A host makes one queue per event loop (or per thread that waits for results) with
 * cn_queue_new(), watches its notify descriptor, and calls cn_queue_take() when it becomes
 * readable. Operations started on any thread may name any queue. Two rules keep lent memory
 * valid: cn_queue_take(), and cn_receive() with this queue, are not called concurrently from
 * several threads, and nothing they lent is used after the next of them.
 *
 * All other functions may be called from any thread, concurrently. Results of one operation
 * kind on one client arrive in the order the operations finished; received messages arrive in
 * the order the client received them (one dispatcher per client).
 *
 * The log callback is the only call from a library thread into the host. Each client calls it
 * from a library thread, one record at a time, in the order the records were made, and never
 * while the library holds a lock: a host may hold a lock of its own across every call
 * into the library (as Python holds its GIL) and take that lock in the callback. A slow callback
 * delays no message; it must not call functions of this library (they return CN_ILLEGAL_STATE
 * there).
 *
 * The library's Go runtime
 * ------------------------
 * The library runs a Go runtime of its own in the host's process, and a thread inside a call
 * runs Go code. So that it finds the runtime free to run it, the runtime gets two Ps (Go's
 * right to run code on a thread) more than the CPUs it would use, and, below a live heap of
 * 16 MiB, collects garbage 16 MiB after its last collection instead of when its heap doubled.
 * GOMAXPROCS or GOGC in the environment when the library loads turns the matching setting off
 * and has Go's own meaning for the library. The host's threads and heap are not touched.
 *
 * On Linux, run with /proc mounted. On each call from a host thread the runtime asks for that
 * thread's stack bounds until it once gets them, and glibc reads those of a process's main
 * thread from /proc/self/maps. Without /proc every call from the main thread therefore begins
 * with a failed open, a few microseconds. cn_connect() logs a warning then.
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
    CN_PENDING = 1,          /* continues; its result will be in the queue */
    CN_ERR = 2,              /* failed for a reason not listed below; see cn_last_error() */
    CN_INVALID_ARG = 3,      /* a NULL pointer where one is not allowed, invalid UTF-8, a bad length */
    CN_INVALID_CONFIG = 4,   /* the configuration document is not valid JSON or has an unknown key or bad value */
    CN_INVALID_NAME = 5,     /* a channel, group or prefix name the layer refuses */
    CN_INVALID_MESSAGE = 6,  /* the body is not a msgpack map with string keys, or uses the reserved key */
    CN_MESSAGE_TOO_LARGE = 7,/* body and headers exceed the server's max_payload; nothing was sent */
    CN_FOREIGN_CHANNEL = 8,  /* receive or group_add on a process channel of another client */
    CN_INVALID_HANDLE = 9,   /* 0, or a client or queue handle that is unknown or freed */
    CN_CLOSED = 10,          /* the client is closed, or was closed while the operation waited */
    /* 11 is not used. */
    CN_NOT_PENDING = 12,     /* cn_cancel(): the operation had already finished; its result was taken */
    CN_ILLEGAL_STATE = 13,   /* not possible now: the client is still connecting, or a call from the log callback */
    CN_NO_SERVER = 14,       /* connect: no server of the list could be reached within connect_deadline */
    CN_TIMEOUT = 15,         /* a bounded wait ran out: publish_deadline (a send), flush_timeout (a subscription) */
    CN_FORKED = 16,          /* called in a process forked after the library was loaded */
    CN_INTERNAL = 17         /* a bug in the library was caught; the process can go on */
} cn_status;

/* A client: one NATS connection and its channel-layer state. 0 is invalid. */
typedef uint64_t cn_client;

/* A pending operation, for cn_cancel() and to match its result. 0 is invalid. */
typedef uint64_t cn_op;

/* A result queue (see cn_queue_new()). 0 is invalid. */
typedef uint64_t cn_queue;

/* Log levels, the same numbers as Python's logging module. */
enum { CN_LOG_DEBUG = 10, CN_LOG_INFO = 20, CN_LOG_WARNING = 30, CN_LOG_ERROR = 40 };

/*
 * The result of one pending operation, taken with cn_queue_take().
 *   op       the operation it ends, as stored in *op by the call that started it; for
 *            cn_connect() and cn_close(), the client handle.
 *   closure  the pointer given with the operation, unchanged.
 *   status   CN_OK, or the error that ended the operation (CN_CLOSED when its client closed).
 *   text     NULL, or: on failure the error detail; on success the channel name (cn_new_channel)
 *            or the client's final statistics as JSON (cn_close; see cn_stats()).
 *   data,len on success of cn_receive(), the message body; otherwise NULL and 0.
 *   rearm    NULL, or, with a received message, the word that starts the receive over without a
 *            call (see "Starting a receive over" at cn_receive()).
 * text and data are lent (see Conventions).
 */
typedef struct cn_result {
    cn_op op;
    void *closure;
    cn_status status;
    const char *text;
    const uint8_t *data;
    size_t len;
    uint64_t *rearm;
} cn_result;

/*
 * The log callback of a client: warnings about drops, reconnects and lost publishes (level is
 * one of CN_LOG_*). message is valid during the call only. It runs on a library thread that
 * holds no lock of the library, for one client's records one at a time and in order; it must not
 * call functions of this library. Up to 1024 records wait for it; a record made while that many
 * wait is dropped, and once the callback has caught up one warning says how many were.
 */
typedef void (*cn_log_callback)(void *closure, int level, const char *message);

/* ---- Library ---------------------------------------------------------------------------- */

/* The library version, e.g. "1.0.0". A static string: never free it. Never NULL. */
CN_EXTERN const char *cn_version(void);

/* The name of a status code, e.g. "CN_CLOSED: the client is closed". A static string: never
   free it. An unknown code gives a text that says so. Never NULL. */
CN_EXTERN const char *cn_status_text(cn_status status);

/* The detail of the last call on this thread that failed, or "" when the last call succeeded.
   Owned by the library and valid until the next call of this library on this thread. Never NULL.
   Credentials from server URLs never appear in it. */
CN_EXTERN const char *cn_last_error(void);

/* Releases memory the library returned through a char ** out-parameter. NULL is ignored. */
CN_EXTERN void cn_free(void *ptr);

/* ---- Result queues ---------------------------------------------------------------------- */

/*
 * Makes a result queue.
 *   notify  -1, or the write end the library signals: a file descriptor (POSIX: a pipe or a
 *           socket, preferably non-blocking) or a SOCKET (Windows). Whenever the queue goes from
 *           empty to non-empty, the library writes one byte to it; the results that one arriving
 *           message produces together (a group message finishing many waiting receives) are
 *           signalled once, after the last of them is queued (a group of more than 256 members
 *           gets its message, and is signalled, in chunks of 256). The host reads and discards these
 *           bytes BEFORE it takes results (so no result is left behind unsignalled), and keeps
 *           notify open until cn_queue_free(). With -1 the host polls.
 *   queue   required; receives the handle.
 * Returns CN_OK, CN_INVALID_ARG (queue NULL, or notify is not an open descriptor), CN_FORKED,
 * CN_INTERNAL.
 */
CN_EXTERN cn_status cn_queue_new(intptr_t notify, cn_queue *queue);

/*
 * Takes up to capacity results from queue, oldest first, without waiting.
 *   results   an array of capacity cn_result the library fills (may be NULL when capacity is 0).
 *   count     required; receives how many were taken (0: the queue was empty).
 * What the results point to is lent until the next cn_queue_take() or cn_receive() with this
 * queue, or cn_queue_free(). What an earlier call lent is released by this one, and the results
 * of the take before can no longer be given back with cn_cancel() or started over with
 * cn_receive().
 * Returns CN_OK, CN_INVALID_ARG, CN_INVALID_HANDLE, CN_ILLEGAL_STATE (from the log callback),
 * CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_queue_take(cn_queue queue, cn_result *results, size_t capacity, size_t *count);

/*
 * Frees a queue, for example when the event loop it served closes. Pending operations whose
 * results would come to it are cancelled with the rules of cn_cancel() (a receive loses no
 * message, a group_add leaves no membership, a waiting send is not sent); results nobody took
 * are discarded, and a received message among them goes back to the front of its mailbox. A
 * client still connecting with this queue is closed. A close in progress goes on; its result is
 * dropped. The library never closes notify; the host may close it after this call.
 * Returns CN_OK, CN_INVALID_HANDLE, CN_ILLEGAL_STATE (from the log callback), CN_FORKED,
 * CN_INTERNAL.
 */
CN_EXTERN cn_status cn_queue_free(cn_queue queue);

/* ---- Clients ---------------------------------------------------------------------------- */

/*
 * Connects a new client. Always pending when the arguments are valid: the connection is made on
 * a library thread, trying again while no server can be reached, for at most connect_deadline.
 *   config_json  the configuration: a JSON object with the keys of the Django CONFIG block,
 *                e.g. {"servers": ["nats://127.0.0.1:4222"], "prefix": "channels"}. NULL or ""
 *                means all defaults. Durations are seconds. An unknown key is CN_INVALID_CONFIG,
 *                and cn_last_error() lists the known keys.
 *   log, log_closure  where the client's log records go; log may be NULL (records are dropped).
 *                The records of a connect that fails reach log before its result, none after.
 *   queue, closure    where the connect's result goes: op is the client handle; status CN_OK,
 *                CN_NO_SERVER (no server within connect_deadline, or a refusal that another try
 *                would not change, such as bad credentials or an unreadable TLS or credentials
 *                file; text says which, without any secret), or CN_CLOSED (closed while
 *                connecting).
 *   client       required; receives the new handle at once. The handle can be used once the
 *                connect's result is CN_OK (CN_ILLEGAL_STATE before); if the connect fails, later
 *                calls return CN_CLOSED.
 * Returns CN_PENDING, CN_INVALID_ARG, CN_INVALID_CONFIG, CN_INVALID_HANDLE (queue),
 * CN_ILLEGAL_STATE (from the log callback), CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_connect(const char *config_json, cn_log_callback log, void *log_closure,
                               cn_queue queue, void *closure, cn_client *client);

/*
 * Closes a client. Always pending: pending operations end with CN_CLOSED results (each in its
 * own queue, before the close's result), publishes still buffered are written and confirmed by
 * the server within drain_timeout, and the connection is closed. Closing never fails; what
 * could not be sent is counted (statistics "lost") and logged. A connect in progress is
 * abandoned.
 *   queue, closure  where the close's result goes: op is the client handle, status CN_OK, text
 *                   the client's final statistics as JSON (all zero if it never connected). Every log
 *                   record of the client has reached log before it. After it, no result of this
 *                   client comes and no log record of it is written; the handle is invalid
 *                   (CN_CLOSED).
 * Returns CN_PENDING, CN_INVALID_HANDLE (client or queue), CN_CLOSED (already closed or
 * closing), CN_ILLEGAL_STATE (from the log callback), CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_close(cn_client client, cn_queue queue, void *closure);

/*
 * The client's counters as a JSON object: published (accepted sends), delivered, dropped
 * (capacity, expired, slow_consumer, bad_frame, no_mailbox), lost (messages and bytes of accepted
 * publishes that never reached the server), publish_timeouts, outbound (bytes queued, sends
 * waiting), handed_back, reconnects, recoveries, groups_expired, subscriptions, mailboxes,
 * groups, connected, client_id, server (url, name, version, cluster, max_payload and peers, as
 * the server of the last connection announced itself), host_reads (reads: cn_on_readable() calls
 * that read the connection; takeovers: times the library read it because the host had not; see
 * cn_read_events()), and goroutines (the library's, for all
 * clients: a leak check).
 *   json  required; receives the document (free it with cn_free()).
 * Returns CN_OK, CN_INVALID_ARG, CN_INVALID_HANDLE, CN_CLOSED, CN_ILLEGAL_STATE (connecting, or
 * from the log callback), CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_stats(cn_client client, char **json);

/* ---- Messages --------------------------------------------------------------------------- */

/*
 * Sends a message to a channel: a process channel ("specific.<id>!<local>", of any client) or a
 * plain channel name. A message sent to a channel nobody receives on is lost: delivery is at
 * most once.
 *   body, len  the msgpack map; required. Copied: the caller may reuse it at once.
 *   queue, closure, op  for the pending case (op may be NULL).
 * CN_OK: accepted into the outbound buffer; it is written as soon as the connection takes it. On
 * a quiet connection (no publish in the last 100 microseconds, little not yet confirmed by the
 * server) the call writes it to the socket itself, as a non-blocking write that the socket's
 * buffer is known to take, so that no library thread has to wake up for it.
 * CN_PENDING: the outbound buffer is full (a slow or stalled link, a frozen server, an outage);
 * the send waits for room, and its result is CN_OK once it was accepted, CN_TIMEOUT when no room
 * came within publish_deadline (nothing was sent), or CN_CLOSED. Cancelling a pending send with
 * cn_cancel() sends nothing. Nothing is sent when an error is returned.
 * Returns CN_OK, CN_PENDING, CN_INVALID_ARG, CN_INVALID_NAME, CN_INVALID_MESSAGE,
 * CN_MESSAGE_TOO_LARGE, CN_INVALID_HANDLE, CN_CLOSED, CN_ILLEGAL_STATE, CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_send(cn_client client, const char *channel, const uint8_t *body, size_t len,
                            cn_queue queue, void *closure, cn_op *op);

/*
 * Sends a message to every member of a group, in every process: one publish, the server fans it
 * out. A group without members is not an error. Otherwise as cn_send().
 */
CN_EXTERN cn_status cn_group_send(cn_client client, const char *group, const uint8_t *body,
                                  size_t len, cn_queue queue, void *closure, cn_op *op);

/*
 * Receives the next message of a channel: a process channel this client made, the prefix of this
 * client's process channels ("specific.<id>!", which gets every message of them that has no
 * mailbox of its own), or a plain channel (the first receive subscribes to it).
 *   channel    the name; or NULL to start over the receive *op names (see below).
 *   queue, closure, op  for the pending case (op may be NULL, except to start a receive over).
 *   body, len  required.
 * CN_OK: a message was waiting; *body and *len are its body, lent (see Conventions).
 * CN_PENDING: the receive waits in the channel's mailbox; its result carries the message in
 * data and len, or CN_CLOSED, or (first receive of a plain channel) CN_TIMEOUT or CN_ERR when the
 * subscription was not confirmed. A message handed to a receive counts as delivered; the mailbox
 * (capacity, expiry) is the only place messages wait. cn_cancel() never loses a message: one
 * already handed to the receive goes back to the front of the mailbox. A plain channel whose last reader was cancelled keeps its
 * subscription for release_linger, so back-to-back receives with timeouts lose nothing.
 *
 * Starting a receive over: with channel NULL and *op the handle of a receive whose result, a
 * message, the last cn_queue_take() of queue handed over (or that a start-over returned CN_OK
 * for since), the same receive waits again for the next message of its channel, in the same
 * mailbox, with its own closure (the closure argument is not used). A host that receives on a
 * channel message after message does this for every receive after one that waited: no name is
 * looked up and no operation is made. Receives started over in the order the take handed their
 * results over are found at once; in another order each costs a lookup among all of the client's
 * pending operations. It is the host's promise that the message was consumed:
 * from this call on, cn_cancel(op) no longer gives it back. CN_OK: a message was waiting (lent,
 * as above); the receive can start over again until the queue's next take. CN_PENDING: it waits
 * again, *op is the same handle, and its result comes to queue under it, as any receive's does.
 * CN_NOT_PENDING: it cannot start over (its result was not taken yet, or queue was taken from
 * again since, or the result carried no message; it was cancelled; or the channel's mailbox was
 * reclaimed or flushed since): nothing happened, receive by name. *op is 0 after every return
 * but CN_PENDING, so a host keeps the handle itself. CN_INVALID_ARG when queue is not the
 * receive's; CN_INVALID_HANDLE for a handle this library never issued.
 *
 * Starting a receive over without a call: a result whose rearm is not NULL came to a receive
 * that stays in its mailbox, parked, after its message. Until the queue's next take, on any
 * thread, the host may start it over with one atomic compare-and-swap of that 64-bit word, from
 * the result's op to its bitwise complement (~op), sequentially consistent; in C11, with rearm
 * cast to _Atomic uint64_t *, atomic_compare_exchange_strong(rearm, &expected, ~op) where
 * expected is op. When the swap succeeds the receive waits again, as after a start-over that
 * returned CN_PENDING (the same promise, the same handle, the same closure; cn_cancel() withdraws
 * it), with no call and no lock. When it fails a message came meanwhile, or the receive cannot
 * start over: call cn_receive() with channel NULL, as above, which returns the message or says
 * why. The library revokes a park that was not armed when a message reaches the mailbox, when
 * the queue is taken from next, and when the mailbox would be reclaimed, so a parked receive
 * never waits while a message waits, and never holds a mailbox (mailbox_grace, group_expiry).
 * The word belongs to the library and stays mapped for the life of the process: a swap made
 * after the next take finds another value there and changes nothing; never write it otherwise.
 * Returns CN_OK, CN_PENDING, CN_NOT_PENDING (a start-over only), CN_INVALID_ARG,
 * CN_INVALID_NAME, CN_FOREIGN_CHANNEL, CN_INVALID_HANDLE, CN_CLOSED, CN_ILLEGAL_STATE, CN_FORKED,
 * CN_INTERNAL.
 */
CN_EXTERN cn_status cn_receive(cn_client client, const char *channel, cn_queue queue, void *closure,
                               const uint8_t **body, size_t *len, cn_op *op);

/*
 * Withdraws a pending operation, or gives back its result. CN_OK: the operation is withdrawn and
 * what it did is undone: a receive's message goes back to the front of its mailbox (keeping its
 * place in time for expiry), a group_add's membership is taken back, a waiting send is not sent.
 * This holds while it waits, while its result waits in the queue, and also after the host took
 * its result, until the host's next cn_queue_take() of that queue: a host whose consumer was
 * cancelled after the result reached it (an asyncio task cancelled before it resumed) gives the
 * result back this way, and the host never has to hold on to a message. CN_NOT_PENDING: the
 * operation had ended already (its result was kept, or it was withdrawn before), or it is a send
 * that was accepted: a sent message is not taken back, and its result stays in the queue.
 * Returns CN_OK, CN_NOT_PENDING, CN_INVALID_HANDLE (unknown client, op 0 or an op handle this
 * library never issued), CN_CLOSED, CN_ILLEGAL_STATE (from the log callback), CN_FORKED,
 * CN_INTERNAL.
 */
CN_EXTERN cn_status cn_cancel(cn_client client, cn_op op);

/* ---- Channels and groups ---------------------------------------------------------------- */

/*
 * Makes a new process channel of this client, "<prefix>.<client id>!<32 hex>", with its mailbox:
 * messages sent to it from now on are kept until received, expired or reclaimed.
 *   prefix   NULL or "" for "specific".
 *   channel  required; on CN_OK receives the name (free it with cn_free()). With CN_PENDING the
 *            result's text is the name (lent).
 * Finishes at once when the client's process subscription is already confirmed by the server;
 * else pending, with CN_OK, CN_TIMEOUT, CN_ERR or CN_CLOSED as the result.
 * Returns CN_OK, CN_PENDING, CN_INVALID_ARG, CN_INVALID_NAME, CN_INVALID_HANDLE, CN_CLOSED,
 * CN_ILLEGAL_STATE, CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_new_channel(cn_client client, const char *prefix, cn_queue queue,
                                   void *closure, char **channel, cn_op *op);

/*
 * Adds a channel to a group in this client. Adding a member twice is not an error. Finishes at
 * once when the subscriptions it needs are already confirmed by the server; else pending, with
 * CN_OK, CN_TIMEOUT, CN_ERR or CN_CLOSED as the result. A group_add that fails or is cancelled
 * leaves no membership behind (unless the channel was a member before).
 * Returns CN_OK, CN_PENDING, CN_INVALID_ARG, CN_INVALID_NAME, CN_FOREIGN_CHANNEL,
 * CN_INVALID_HANDLE, CN_CLOSED, CN_ILLEGAL_STATE, CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_group_add(cn_client client, const char *group, const char *channel,
                                 cn_queue queue, void *closure, cn_op *op);

/* Removes a channel from a group in this client. Removing a non-member is not an error. Always
   finishes at once. Returns CN_OK, CN_INVALID_ARG, CN_INVALID_NAME, CN_INVALID_HANDLE,
   CN_CLOSED, CN_ILLEGAL_STATE, CN_FORKED, CN_INTERNAL. */
CN_EXTERN cn_status cn_group_discard(cn_client client, const char *group, const char *channel);

/* Resets this client's state: mailboxes, memberships and subscriptions. Receives that are waiting
   keep waiting. Never waits on the network and never fails on a dead connection. Returns CN_OK,
   CN_INVALID_HANDLE, CN_CLOSED, CN_ILLEGAL_STATE, CN_FORKED, CN_INTERNAL. */
CN_EXTERN cn_status cn_flush(cn_client client);

/* ---- Reading the connection on the host's event loop ------------------------------------ */

/*
 * A descriptor the host's event loop can watch so that the client's connection is read on the
 * loop's thread: then a message that arrives reaches its waiting receive, and its result the
 * queue, within the host's cn_on_readable() call, with no library thread to wake in between.
 * Without this, a library thread reads the connection and signals the queue's notify.
 *   fd  required; receives the descriptor, or -1 where the host cannot read the connection (not
 *       on Linux, over TLS or a websocket, or with "host_reads": false in the configuration:
 *       the library reads it itself there). It is
 *       readable (level-triggered: as long as bytes wait) whenever the connection has bytes to
 *       read; it is the same across reconnects, so the host registers it once. It is an epoll
 *       descriptor: watch it, do not read from it or change it. The library closes it in
 *       cn_close(): a host that may still watch it afterwards (its loop cannot unregister at
 *       once) watches a dup() of it, which it closes itself.
 * From this call on the host reads the connection: it calls cn_on_readable() whenever the
 * descriptor is readable. A host that does not (its loop is blocked or gone) stops nothing: when
 * bytes wait 10 ms with no call, the library reads the connection itself again, until the next
 * call (statistics host_reads.takeovers).
 * Any thread. Returns CN_OK, CN_INVALID_ARG, CN_INVALID_HANDLE, CN_CLOSED, CN_ILLEGAL_STATE,
 * CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_read_events(cn_client client, intptr_t *fd);

/*
 * Reads what the client's connection has, without waiting (at most a few reads: what is left
 * keeps the descriptor of cn_read_events() readable, so the loop runs its other work between),
 * and routes the messages: their receives' results are in their queues when it returns, unless
 * another thread was routing. The host calls it, on its loop's thread, whenever that descriptor
 * is readable (see cn_read_events()).
 *   queue  0, or the host's own result queue, which it takes from right after this call, on the
 *          same thread: results that reach it during the call are not signalled on its notify
 *          (no byte to read, no extra turn of the loop). Others' queues are signalled as usual.
 * Any thread. Returns CN_OK, CN_INVALID_HANDLE (client, or a queue that is not 0), CN_CLOSED,
 * CN_ILLEGAL_STATE, CN_FORKED, CN_INTERNAL.
 */
CN_EXTERN cn_status cn_on_readable(cn_client client, cn_queue queue);

#ifdef __cplusplus
}
#endif

#endif /* CHANNELS_NATS_H */
