/*
 * channels_nats._fastpath: cn_receive and cn_queue_take as one CPython call each.
 *
 * A receive that finds its message waiting is the hot path of a saturated consumer, and through
 * cffi it costs more than the library call itself: seven arguments converted one by one, two
 * cdata objects to read the out-parameters, and a cffi buffer to decode from. receive takes
 * the three arguments that vary, decodes the lent body (or copies the decode of the same bytes
 * made for another member of a group), and counts the streak of ready receives, so that a ready
 * receive costs the Python caller one call and one type check.
 *
 * A fan-out wakes many waiting receives with one take: settled in Python, each result cost a
 * tuple of six integers, a dictionary pop and a dozen bytecodes around the future's own work.
 * take settles the received messages of a take here and passes every other result to Python,
 * in order.
 *
 * It is compiled into the same shared object as the cffi module (python/cffi_build.py), so it is
 * built, shipped and fingerprinted with it, and loaded from that file under its own name. Built
 * for CPython's stable ABI from 3.10 on, like the cffi module.
 */
#include <pyconfig.h>
/* The stable ABI where cffi's module uses it: not in debug builds of CPython. */
#if !defined(Py_LIMITED_API) && !defined(Py_DEBUG) && !defined(Py_TRACE_REFS) && !defined(Py_REF_DEBUG)
#define Py_LIMITED_API 0x030a0000 /* METH_FASTCALL is in it from 3.10 on */
#endif
#include <Python.h>

#include "channels_nats.h"

#ifndef PyBUF_READ /* in the limited API from 3.11 on; the value is CPython's since 3.3 */
#define PyBUF_READ 0x100
#endif

/* Set once by configure(): the function that decodes a body (msgpack.unpackb), and after how many
   ready receives in a row on one thread the next one yields to the event loop first. */
static PyObject *fastpath_decode;
static int fastpath_streak;

/* Forgets the decodes kept for ready receives (fastpath_received). */
static void fastpath_recent_forget(void);

/* The method take calls on a future, and what it raises for a future that is done already (a
   cancelled caller's): made once by configure. */
static PyObject *fastpath_set_result_name;
static PyObject *fastpath_invalid_state;

/* The largest batch take accepts: its results live on the stack during the call. */
#define FASTPATH_TAKE_MAX 256

/* Receives in a row on this thread that found their message waiting: a thread runs one event
   loop at a time, so this is that loop's streak. */
static __thread int fastpath_ready;

/*
 * configure(decode, streak) -> None
 *
 * decode(view) returns the message of a body; streak is READY_STREAK. Called before the first
 * receive, and again with the same values by each event loop's result queue. Another decode
 * than the last forgets the decodes kept for ready receives.
 */
static PyObject *fastpath_configure(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 2 || !PyCallable_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "configure(decode, streak) takes a callable and an int");
        return NULL;
    }
    long streak = PyLong_AsLong(args[1]);
    if (streak == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (streak < 1 || streak > 1000000) {
        PyErr_SetString(PyExc_ValueError, "configure: streak must be between 1 and 1000000");
        return NULL;
    }
    if (fastpath_set_result_name == NULL) {
        PyObject *asyncio = PyImport_ImportModule("asyncio");
        fastpath_invalid_state = asyncio == NULL ? NULL : PyObject_GetAttrString(asyncio, "InvalidStateError");
        Py_XDECREF(asyncio);
        fastpath_set_result_name = PyUnicode_InternFromString("set_result");
        if (fastpath_invalid_state == NULL || fastpath_set_result_name == NULL) {
            Py_CLEAR(fastpath_invalid_state);
            Py_CLEAR(fastpath_set_result_name);
            return NULL;
        }
    }
    if (args[0] != fastpath_decode) {
        fastpath_recent_forget(); /* what the other function decoded is not this one's */
    }
    Py_INCREF(args[0]);
    Py_XDECREF(fastpath_decode);
    fastpath_decode = args[0];
    fastpath_streak = (int)streak;
    Py_RETURN_NONE;
}

/* A handle (cn_client, cn_queue) from a Python int; 0 with an exception set when it is not one.
   The library gives out no handle 0. */
static unsigned long long fastpath_handle(PyObject *value) {
    unsigned long long handle = PyLong_AsUnsignedLongLong(value);
    return handle == (unsigned long long)-1 && PyErr_Occurred() ? 0 : handle;
}

/* Whether every value of a decoded message is of a type its members may share (str, int,
   float, bool, bytes, None): then each member gets a copy of the first decode, else a decode of
   its own (Python's _results.IMMUTABLE). */
static int fastpath_flat(PyObject *message) {
    if (!PyDict_CheckExact(message)) {
        return 0;
    }
    Py_ssize_t at = 0;
    PyObject *key, *value;
    while (PyDict_Next(message, &at, &key, &value)) {
        if (!(value == Py_None || PyUnicode_CheckExact(value) || PyLong_CheckExact(value) || PyBool_Check(value) ||
              PyFloat_CheckExact(value) || PyBytes_CheckExact(value))) {
            return 0;
        }
    }
    return 1;
}

/* The decode of a lent body. */
static PyObject *fastpath_decoded(const void *data, size_t len) {
    PyObject *view = PyMemoryView_FromMemory((char *)data, (Py_ssize_t)len, PyBUF_READ);
    if (view == NULL) {
        return NULL;
    }
    PyObject *message = PyObject_CallFunctionObjArgs(fastpath_decode, view, NULL);
    Py_DECREF(view);
    return message;
}

/*
 * The decodes of recent group messages, for receives that find their message waiting. A group
 * message reaches each member's mailbox with the same body, and a consumer draining a backlog
 * gets it in a receive of its own, on the loop's thread, between other members' receives: each
 * decoded the same bytes again. A receive whose body is byte for byte one decoded recently gets
 * a copy of that decode instead, as the members of one take do (take, below), when its values
 * are all immutable. A hash of the bytes picks a set of two entries, and the bytes are compared
 * in full, so an equal body is the only way to a hit: what the library lends is never trusted
 * to stay at an address. Two entries a set keep the messages of a saturated fan-out (a few
 * dozen in flight) apart. Only this module's calls touch the cache, all of them holding the
 * GIL. It holds at most 256 bodies of up to 512 bytes and their decodes.
 */
#define FASTPATH_RECENT_SETS 128 /* a power of two; two entries each */
#define FASTPATH_RECENT_BODY 512  /* the longest body kept; a longer one is decoded each time */

typedef struct {
    size_t len;          /* of body; 0: empty */
    unsigned char *body; /* PyMem_Malloc'ed, len bytes */
    PyObject *message;   /* a decode of body, never handed out itself: receives get copies */
} fastpath_recent_entry;

typedef struct {
    fastpath_recent_entry ways[2];
    int older; /* the way a miss replaces: the one used less recently */
} fastpath_recent_set;

static fastpath_recent_set fastpath_recent[FASTPATH_RECENT_SETS];

static void fastpath_recent_forget(void) {
    for (int set = 0; set < FASTPATH_RECENT_SETS; set++) {
        for (int way = 0; way < 2; way++) {
            fastpath_recent_entry *e = &fastpath_recent[set].ways[way];
            Py_CLEAR(e->message);
            PyMem_Free(e->body);
            e->body = NULL;
            e->len = 0;
        }
    }
}

/* The set of a body: a multiplicative hash of its bytes, eight at a time. */
static fastpath_recent_set *fastpath_recent_set_of(const unsigned char *body, size_t len) {
    uint64_t h = 0x9E3779B97F4A7C15u ^ (uint64_t)len;
    size_t at = 0;
    for (; at + 8 <= len; at += 8) {
        uint64_t word;
        memcpy(&word, body + at, 8);
        h = (h ^ word) * 0xFF51AFD7ED558CCDu;
        h ^= h >> 32;
    }
    for (; at < len; at++) {
        h = (h ^ body[at]) * 0xFF51AFD7ED558CCDu;
        h ^= h >> 32;
    }
    return &fastpath_recent[h & (FASTPATH_RECENT_SETS - 1)];
}

/* The message of a lent body a ready receive took: a copy of a recent decode of the same bytes,
   else a decode, kept for the next member when it is flat and short. */
static PyObject *fastpath_received(const void *data, size_t len) {
    if (len == 0 || len > FASTPATH_RECENT_BODY) {
        return fastpath_decoded(data, len);
    }
    fastpath_recent_set *set = fastpath_recent_set_of(data, len);
    for (int way = 0; way < 2; way++) {
        fastpath_recent_entry *e = &set->ways[way];
        if (e->len == len && memcmp(e->body, data, len) == 0) {
            set->older = 1 - way;
            return PyDict_Copy(e->message);
        }
    }
    PyObject *message = fastpath_decoded(data, len);
    if (message == NULL || !fastpath_flat(message)) {
        return message;
    }
    fastpath_recent_entry *e = &set->ways[set->older];
    PyObject *kept = PyDict_Copy(message);
    unsigned char *body = kept == NULL ? NULL : PyMem_Realloc(e->body, len);
    if (body == NULL) { /* not kept: the receive still gets its message */
        Py_XDECREF(kept);
        PyErr_Clear();
        return message;
    }
    memcpy(body, data, len);
    PyObject *replaced = e->message;
    e->body = body;
    e->len = len;
    e->message = kept;
    Py_XDECREF(replaced);
    set->older = 1 - set->older;
    return message;
}

/* Whether a receive may go ahead: it got want arguments, and configure() was called. Else false,
   with a TypeError or RuntimeError that names the call by its usage. */
static int fastpath_receives(const char *usage, Py_ssize_t nargs, Py_ssize_t want) {
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s takes %zd arguments", usage, want);
        return 0;
    }
    if (fastpath_decode == NULL) {
        PyErr_Format(PyExc_RuntimeError, "%s: configure() was not called", usage);
        return 0;
    }
    return 1;
}

/* What receive and receive_again return for a call that returned status: the message it lent,
   the op of a receive that waits, or minus the status. Counts the streak of ready receives. */
static PyObject *fastpath_receive_result(cn_status status, cn_op op, const uint8_t *body, size_t len) {
    if (status != CN_OK) {
        fastpath_ready = 0;
        return status == CN_PENDING ? PyLong_FromUnsignedLongLong(op) : PyLong_FromLong(-(long)status);
    }
    fastpath_ready++;
    return fastpath_received(body, len);
}

/*
 * receive(client: int, channel: bytes, queue: int) -> message | int
 *
 * cn_receive with no closure. Returns the decoded message when one was waiting: it is decoded
 * straight from the library's memory, which lends the body only until the queue's next take or
 * receive, or copied from a recent decode of the same bytes (fastpath_received). Else an int: the
 * op of the pending receive (> 0), minus the status of a failed call (< 0; the detail is
 * cn_last_error() on this thread), or 0 when this thread's receives found their messages waiting
 * streak times in a row: then no call was made, and the caller lets the event loop run other tasks
 * before it asks again. The call keeps the GIL: it waits on nothing but the library's own locks,
 * and the library calls the log callback, which takes the GIL, only from a thread that holds none
 * of them (include/channels_nats.h). Releasing and taking the GIL again cost a ready receive about
 * a twentieth of its time.
 */
static PyObject *fastpath_receive(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!fastpath_receives("receive(client, channel, queue)", nargs, 3)) {
        return NULL;
    }
    unsigned long long client = fastpath_handle(args[0]), queue = fastpath_handle(args[2]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    char *channel;
    if (PyBytes_AsStringAndSize(args[1], &channel, NULL) < 0) { /* NULL: refuses an embedded NUL */
        return NULL;
    }
    if (fastpath_ready >= fastpath_streak) {
        fastpath_ready = 0;
        return PyLong_FromLong(0);
    }
    const uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    cn_status status = cn_receive((cn_client)client, channel, (cn_queue)queue, NULL, &body, &len, &op);
    return fastpath_receive_result(status, op, body, len);
}

/*
 * The receives the last take on this thread handed a message to with a word (cn_result.rearm),
 * until the next take: receive_again starts one over with a compare-and-swap of its word, and
 * makes no call at all. A thread runs one event loop, so this is that loop's queue's last take.
 */
static __thread cn_queue fastpath_lent_queue;
static __thread size_t fastpath_lent_count, fastpath_lent_next;
static __thread cn_op fastpath_lent_ops[FASTPATH_TAKE_MAX];
static __thread uint64_t *fastpath_lent_words[FASTPATH_TAKE_MAX];

/* How many of the last take's receives after the last one found receive_again reads first:
   consumers run, and start over, in the order the take woke them. */
#define FASTPATH_LENT_LOOKAHEAD 4

/* The word of receive op from queue's last take, or NULL. */
static uint64_t *fastpath_lent_word(cn_queue queue, cn_op op) {
    if (queue != fastpath_lent_queue) {
        return NULL;
    }
    size_t n = fastpath_lent_count, start = fastpath_lent_next;
    for (size_t i = start; i < n && i < start + FASTPATH_LENT_LOOKAHEAD; i++) {
        if (fastpath_lent_ops[i] == op) {
            fastpath_lent_next = i + 1;
            return fastpath_lent_words[i];
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (fastpath_lent_ops[i] == op) {
            fastpath_lent_next = i + 1;
            return fastpath_lent_words[i];
        }
    }
    return NULL;
}

/* Starts receive op over through its word (include/channels_nats.h, "Starting a receive over
   without a call"): true when it waits again. */
static int fastpath_rearm(cn_queue queue, cn_op op) {
#if defined(__GNUC__) || defined(__clang__)
    uint64_t *word = fastpath_lent_word(queue, op);
    uint64_t expected = op;
    return word != NULL && __atomic_compare_exchange_n(word, &expected, ~(uint64_t)op, 0, __ATOMIC_SEQ_CST,
                                                       __ATOMIC_SEQ_CST);
#else
    (void)queue, (void)op;
    return 0; /* a compiler without the builtins: the call below does the same */
#endif
}

/*
 * receive_again(client: int, op: int, queue: int) -> message | int
 *
 * The receive op, whose message the queue's last take handed over, starts over: with a
 * compare-and-swap of its word when the take gave one (no call), else, or when the swap fails
 * because a message came meanwhile, with cn_receive with channel NULL and *op set. Returns what
 * receive does: the decoded message, the op when it waits again (> 0), minus the status of a
 * failed call (< 0: -CN_NOT_PENDING when it cannot start over), or 0 after the streak of ready
 * receives (nothing was taken).
 */
static PyObject *fastpath_receive_again(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (!fastpath_receives("receive_again(client, op, queue)", nargs, 3)) {
        return NULL;
    }
    unsigned long long client = fastpath_handle(args[0]), again = fastpath_handle(args[1]),
                       queue = fastpath_handle(args[2]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (fastpath_ready >= fastpath_streak) {
        fastpath_ready = 0;
        return PyLong_FromLong(0);
    }
    if (fastpath_rearm((cn_queue)queue, (cn_op)again)) {
        fastpath_ready = 0;
        Py_INCREF(args[1]);
        return args[1]; /* the op, waiting again */
    }
    const uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = (cn_op)again;
    cn_status status = cn_receive((cn_client)client, NULL, (cn_queue)queue, NULL, &body, &len, &op);
    return fastpath_receive_result(status, op, body, len);
}

/*
 * take(queue, batch, waiting, other) -> int
 *
 * cn_queue_take of at most batch results, settled in the order they came. A received message
 * (status CN_OK, a body, no closure) resolves the future its op waits with in waiting, a dict
 * {op: (future, client, publishing)}, from which the entry is popped: with the body's decode,
 * or, for the next member of the same group message, a copy of that decode when all its values
 * are immutable (no task runs before the whole take is settled, so none changed it yet). An op
 * not in waiting was withdrawn: its result is skipped. A future already done was cancelled
 * after the result came: the message is given back (cn_cancel). Every other result is
 * other(op, closure, status, text, data, len), with the pointers as integers, lent until the
 * next take. Returns the number of results taken, or minus the status of a failed take (the
 * detail is cn_last_error() on this thread). The GIL is kept, as in receive.
 */
static PyObject *fastpath_take(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 4 || !PyDict_CheckExact(args[2]) || !PyCallable_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "take(queue, batch, waiting, other) takes an int, an int, a dict and a callable");
        return NULL;
    }
    if (fastpath_decode == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "take: configure() was not called");
        return NULL;
    }
    unsigned long long queue = fastpath_handle(args[0]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    long batch = PyLong_AsLong(args[1]);
    if (batch == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (batch < 1 || batch > FASTPATH_TAKE_MAX) {
        PyErr_SetString(PyExc_ValueError, "take: batch must be between 1 and 256");
        return NULL;
    }
    PyObject *waiting = args[2], *other = args[3];
    cn_result results[FASTPATH_TAKE_MAX];
    size_t count = 0;
    fastpath_lent_count = fastpath_lent_next = 0; /* the words of the take before are no longer the host's */
    cn_status status = cn_queue_take((cn_queue)queue, results, (size_t)batch, &count);
    if (status != CN_OK) {
        return PyLong_FromLong(-(long)status);
    }
    fastpath_lent_queue = (cn_queue)queue;
    const void *last_data = NULL; /* the body of first, the decode of the last group message */
    PyObject *first = NULL;
    int flat = -1; /* whether first's values are all immutable; -1: not looked at yet */
    for (size_t i = 0; i < count; i++) {
        const cn_result *r = &results[i];
        if (r->closure != NULL || r->status != CN_OK || r->data == NULL) {
            PyObject *done = PyObject_CallFunction(other, "KKiKKn", (unsigned long long)r->op,
                                                   (unsigned long long)(uintptr_t)r->closure, (int)r->status,
                                                   (unsigned long long)(uintptr_t)r->text,
                                                   (unsigned long long)(uintptr_t)r->data, (Py_ssize_t)r->len);
            if (done == NULL) {
                goto failed;
            }
            Py_DECREF(done);
            continue;
        }
        PyObject *key = PyLong_FromUnsignedLongLong(r->op);
        if (key == NULL) {
            goto failed;
        }
        PyObject *entry = PyDict_GetItemWithError(waiting, key); /* borrowed */
        if (entry == NULL) {
            Py_DECREF(key);
            if (PyErr_Occurred()) {
                goto failed;
            }
            continue;
        }
        Py_INCREF(entry);
        int removed = PyDict_DelItem(waiting, key);
        Py_DECREF(key);
        PyObject *future = PyTuple_GetItem(entry, 0), *client = PyTuple_GetItem(entry, 1); /* borrowed */
        if (removed < 0 || future == NULL || client == NULL) {
            Py_DECREF(entry);
            goto failed;
        }
        PyObject *message;
        if (r->data == last_data) { /* the next member of that group message: the same body */
            if (flat < 0) {
                flat = fastpath_flat(first);
            }
            message = flat ? PyDict_Copy(first) : fastpath_decoded(r->data, r->len);
        } else {
            message = fastpath_decoded(r->data, r->len);
            Py_XDECREF(first);
            Py_XINCREF(message);
            first = message;
            last_data = message == NULL ? NULL : r->data;
            flat = -1;
        }
        if (message == NULL) {
            Py_DECREF(entry);
            goto failed;
        }
        /* Set at once: asking done() first cost a call per result for the rare one whose caller
           was cancelled before the result came. That future refuses, and the message goes back. */
        PyObject *set = PyObject_CallMethodObjArgs(future, fastpath_set_result_name, message, NULL);
        Py_DECREF(message);
        if (set == NULL) {
            if (!PyErr_ExceptionMatches(fastpath_invalid_state)) {
                Py_DECREF(entry);
                goto failed;
            }
            PyErr_Clear();
            unsigned long long handle = fastpath_handle(client);
            Py_DECREF(entry);
            if (PyErr_Occurred()) {
                goto failed;
            }
            cn_cancel((cn_client)handle, r->op);
            continue;
        }
        Py_DECREF(entry);
        Py_DECREF(set);
        if (r->rearm != NULL) {
            fastpath_lent_ops[fastpath_lent_count] = r->op;
            fastpath_lent_words[fastpath_lent_count++] = r->rearm;
        }
    }
    Py_XDECREF(first);
    return PyLong_FromSize_t(count);
failed:
    Py_XDECREF(first);
    return NULL;
}

static PyMethodDef fastpath_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))fastpath_configure, METH_FASTCALL,
     "configure(decode, streak): how receive decodes a body, and its streak of ready receives."},
    {"receive", (PyCFunction)(void (*)(void))fastpath_receive, METH_FASTCALL,
     "cn_receive: the decoded message, or the op of a pending receive (> 0), minus an error status (< 0), "
     "or 0 to yield to the event loop first."},
    {"receive_again", (PyCFunction)(void (*)(void))fastpath_receive_again, METH_FASTCALL,
     "cn_receive starting over op, a receive whose message the queue's last take handed over: as receive."},
    {"take", (PyCFunction)(void (*)(void))fastpath_take, METH_FASTCALL,
     "cn_queue_take, its received messages settled here and every other result passed to other(), in order: "
     "the number of results taken, or minus an error status."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT, "channels_nats._fastpath", "cn_receive and cn_queue_take as one CPython call each.", 0, fastpath_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void) { return PyModuleDef_Init(&fastpath_module); }
