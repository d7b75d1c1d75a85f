/*
 * channels_nats._fastpath: cn_receive as one CPython call.
 *
 * A receive that finds its message waiting is the hot path of a saturated consumer, and through
 * cffi it costs more than the library call itself: seven arguments converted one by one, two
 * cdata objects to read the out-parameters, and a cffi buffer to decode from. This function takes
 * the three arguments that vary and hands the lent body back as a memoryview.
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

/*
 * receive(client: int, channel: bytes, queue: int) -> memoryview | int
 *
 * cn_receive with no closure. Returns the message body when one was waiting: a read-only view of
 * the library's memory, lent until the queue's next take or receive (decode it at once). Else an
 * int: the op of the pending receive (> 0), or minus the status of a failed call (< 0; the detail
 * is cn_last_error() on this thread). The GIL is released during the call: the library may call
 * the host's log callback from its own threads meanwhile, and that callback needs the GIL.
 */
static PyObject *fastpath_receive(PyObject *module, PyObject *const *args, Py_ssize_t nargs) {
    (void)module;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "receive(client, channel, queue) takes 3 arguments");
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
    const uint8_t *body = NULL;
    size_t len = 0;
    cn_op op = 0;
    cn_status status;
    Py_BEGIN_ALLOW_THREADS
    status = cn_receive((cn_client)client, channel, (cn_queue)queue, NULL, &body, &len, &op);
    Py_END_ALLOW_THREADS
    switch (status) {
    case CN_OK:
        return PyMemoryView_FromMemory((char *)body, (Py_ssize_t)len, PyBUF_READ);
    case CN_PENDING:
        return PyLong_FromUnsignedLongLong(op);
    default:
        return PyLong_FromLong(-(long)status);
    }
}

static PyMethodDef fastpath_methods[] = {
    {"receive", (PyCFunction)(void (*)(void))fastpath_receive, METH_FASTCALL,
     "cn_receive: the lent body (memoryview), or the op of a pending receive (> 0), or minus an error status."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT, "channels_nats._fastpath", "cn_receive as one CPython call.", 0, fastpath_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fastpath(void) { return PyModuleDef_Init(&fastpath_module); }
