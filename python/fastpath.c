/*
 * channels_nats._fastpath: cn_receive as one CPython call.
 *
 * A receive that finds its message waiting is the hot path of a saturated consumer, and through
 * cffi it costs more than the library call itself: seven arguments converted one by one, two
 * cdata objects to read the out-parameters, and a cffi buffer to decode from. This function takes
 * the three arguments that vary, decodes the lent body, and counts the streak of ready receives,
 * so that a ready receive costs the Python caller one call and one type check.
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

/* Receives in a row on this thread that found their message waiting: a thread runs one event
   loop at a time, so this is that loop's streak. */
static __thread int fastpath_ready;

/*
 * configure(decode, streak) -> None
 *
 * decode(view) returns the message of a body; streak is READY_STREAK. Called before the first
 * receive, and again with the same values by each event loop's result queue.
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
    Py_INCREF(args[0]);
    Py_XDECREF(fastpath_decode);
    fastpath_decode = args[0];
    fastpath_streak = (int)streak;
    Py_RETURN_NONE;
}

/*
 * receive(client: int, channel: bytes, queue: int) -> message | int
 *
 * cn_receive with no closure. Returns the decoded message when one was waiting: it is decoded
 * straight from the library's memory, which lends the body only until the queue's next take or
 * receive. Else an int: the op of the pending receive (> 0), minus the status of a failed call
 * (< 0; the detail is cn_last_error() on this thread), or 0 when this thread's receives found
 * their messages waiting streak times in a row: then no call was made, and the caller lets the
 * event loop run other tasks before it asks again. The call keeps the GIL: it waits on nothing
 * but the library's own locks, and the library calls the log callback, which takes the GIL,
 * only from a thread that holds none of them (include/channels_nats.h). Releasing and taking
 * the GIL again cost a ready receive about a twentieth of its time.
 */
static PyObject *fastpath_receive(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "receive(client, channel, queue) takes 3 arguments");
        return NULL;
    }
    if (fastpath_decode == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "receive: configure() was not called");
        return NULL;
    }
    unsigned long long client = PyLong_AsUnsignedLongLong(args[0]);
    if (client == (unsigned long long)-1 && PyErr_Occurred()) {
        return NULL;
    }
    unsigned long long queue = PyLong_AsUnsignedLongLong(args[2]);
    if (queue == (unsigned long long)-1 && PyErr_Occurred()) {
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
    if (status != CN_OK) {
        fastpath_ready = 0;
        return status == CN_PENDING ? PyLong_FromUnsignedLongLong(op) : PyLong_FromLong(-(long)status);
    }
    fastpath_ready++;
    PyObject *view = PyMemoryView_FromMemory((char *)body, (Py_ssize_t)len, PyBUF_READ);
    if (view == NULL) {
        return NULL;
    }
    PyObject *message = PyObject_CallFunctionObjArgs(fastpath_decode, view, NULL); /* in the stable ABI of 3.10 */
    Py_DECREF(view);
    return message;
}

static PyMethodDef fastpath_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))fastpath_configure, METH_FASTCALL,
     "configure(decode, streak): how receive decodes a body, and its streak of ready receives."},
    {"receive", (PyCFunction)(void (*)(void))fastpath_receive, METH_FASTCALL,
     "cn_receive: the decoded message, or the op of a pending receive (> 0), minus an error status (< 0), "
     "or 0 to yield to the event loop first."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT, "channels_nats._fastpath", "cn_receive as one CPython call.", 0, fastpath_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void) { return PyModuleDef_Init(&fastpath_module); }
