/* The compiled core of the framer (ADR 0018): proxy.wire.framer.Framer's feed() in C, item for item.
 *
 * The pure-Python Framer in framer.py is the definition; this type does exactly what it does, with the same
 * items, the same attributes and the same violations, and the unit tests run against both
 * (tests/unit/test_framer.py, tests/unit/test_framer_differential.py). Only the framing is here: the violations
 * are built by the Python subclass (proxy.wire.framer.CFramer._refuse, _length_violation), called on that rare
 * path only, so that their text lives in one place.
 *
 * No I/O, no state beyond one message in progress: sans-IO like the rest of proxy/wire.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>

#define FORWARD 0
#define COPY 1
#define HOLD 2
#define REFUSE 3
#define SPAN 0
#define DATA_ROW 'D'

typedef struct {
    PyObject_HEAD
    PyObject *table;      /* bytes of 256 verbs */
    PyObject *violation;  /* None, or the ProtocolViolation */
    long long max_length;
    long long need;       /* body bytes of the message in progress still to come */
    unsigned char hdr[5]; /* the first bytes of a header split across chunks */
    int hdr_len;
    int type;
    int verb;             /* the verb of the message in progress */
    PyObject *body;       /* a bytearray: its body so far, when it is copied or held; else NULL */
} FramerCore;

static PyObject *IntForward, *IntCopy, *IntHold;  /* the item kinds, as Python ints (SPAN is FORWARD's 0) */
static PyObject *TypeInts[256];                    /* the type bytes as Python ints */

static int
set_table(FramerCore *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "cannot delete the table");
        return -1;
    }
    if (value == self->table)
        return 0;
    if (!PyBytes_CheckExact(value) || PyBytes_GET_SIZE(value) != 256) {
        PyErr_SetString(PyExc_TypeError, "a verb table is 256 bytes (proxy.wire.framer.verbs)");
        return -1;
    }
    /* checked once per table object (verbs() shares one object per distinct table) */
    const unsigned char *verbs = (const unsigned char *)PyBytes_AS_STRING(value);
    for (int i = 0; i < 256; i++) {
        if (verbs[i] > REFUSE) {
            PyErr_Format(PyExc_ValueError, "verb %d for type %d: a verb is FORWARD, COPY, HOLD or REFUSE", verbs[i], i);
            return -1;
        }
    }
    Py_INCREF(value);
    Py_XSETREF(self->table, value);
    return 0;
}

static PyObject *
get_table(FramerCore *self, void *closure)
{
    Py_INCREF(self->table);
    return self->table;
}

static PyObject *
get_at_boundary(FramerCore *self, void *closure)
{
    return PyBool_FromLong(!self->need && !self->hdr_len);
}

static int
FramerCore_init(FramerCore *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"table", "max_length", NULL};
    PyObject *table = NULL;
    long long max_length = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OL", kwlist, &table, &max_length))
        return -1;
    if (table == NULL) {
        PyErr_SetString(PyExc_TypeError, "FramerCore needs a table");
        return -1;
    }
    if (max_length < 0) {
        PyErr_SetString(PyExc_ValueError, "FramerCore needs max_length >= 0");
        return -1;
    }
    if (set_table(self, table, NULL) < 0)
        return -1;
    self->max_length = max_length;
    Py_INCREF(Py_None);
    Py_XSETREF(self->violation, Py_None);
    self->need = 0;
    self->hdr_len = 0;
    self->type = 0;
    self->verb = FORWARD;
    Py_CLEAR(self->body);
    return 0;
}

static int
FramerCore_traverse(FramerCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->table);
    Py_VISIT(self->violation);
    Py_VISIT(self->body);
    return 0;
}

static int
FramerCore_clear(FramerCore *self)
{
    Py_CLEAR(self->table);
    Py_CLEAR(self->violation);
    Py_CLEAR(self->body);
    return 0;
}

static void
FramerCore_dealloc(FramerCore *self)
{
    PyObject_GC_UnTrack(self);
    FramerCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Append a new reference to out and drop it; -1 on error. */
static int
append_steal(PyObject *out, PyObject *item)
{
    if (item == NULL)
        return -1;
    int r = PyList_Append(out, item);
    Py_DECREF(item);
    return r;
}

static int
append_span(PyObject *out, const char *buf, Py_ssize_t start, Py_ssize_t end)
{
    PyObject *bytes = PyBytes_FromStringAndSize(buf + start, end - start);
    if (bytes == NULL)
        return -1;
    PyObject *item = PyTuple_Pack(2, IntForward, bytes);
    Py_DECREF(bytes);
    return append_steal(out, item);
}

static int
append_message(PyObject *out, int verb, int t, const char *body, Py_ssize_t size)
{
    PyObject *bytes = PyBytes_FromStringAndSize(body, size);
    if (bytes == NULL)
        return -1;
    PyObject *item = PyTuple_Pack(3, verb == COPY ? IntCopy : IntHold, TypeInts[t], bytes);
    Py_DECREF(bytes);
    return append_steal(out, item);
}

/* The message in progress is complete: report its body when it is copied or held. */
static int
complete(FramerCore *self, PyObject *out)
{
    PyObject *body = self->body;
    if (body == NULL)
        return 0;
    self->body = NULL;
    int r = append_message(out, self->verb, self->type, PyByteArray_AS_STRING(body), PyByteArray_GET_SIZE(body));
    Py_DECREF(body);
    return r;
}

static inline unsigned long
read_u32(const unsigned char *p)
{
    return ((unsigned long)p[0] << 24) | ((unsigned long)p[1] << 16) | ((unsigned long)p[2] << 8) | (unsigned long)p[3];
}

static PyObject *
FramerCore_feed(FramerCore *self, PyObject *arg)
{
    Py_buffer view;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    if (self->table == NULL) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_TypeError, "FramerCore.__init__ was not called");
        return NULL;
    }
    if (self->violation != Py_None)
        return out;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)view.buf;
    const char *cdata = (const char *)view.buf;
    Py_ssize_t n = view.len;
    Py_ssize_t pos = 0;
    Py_ssize_t span = -1;
    /* the table may be replaced from Python only between calls: hold our own reference meanwhile */
    PyObject *table_obj = self->table;
    Py_INCREF(table_obj);
    const unsigned char *table = (const unsigned char *)PyBytes_AS_STRING(table_obj);
    const long long limit = self->max_length + 4;

    while (pos < n) {
        if (self->need) {  /* the body of the message in progress */
            Py_ssize_t take = self->need < (long long)(n - pos) ? (Py_ssize_t)self->need : n - pos;
            if (self->verb != HOLD && span < 0)
                span = pos;
            if (self->body != NULL) {
                Py_ssize_t had = PyByteArray_GET_SIZE(self->body);
                if (PyByteArray_Resize(self->body, had + take) < 0)
                    goto error;
                memcpy(PyByteArray_AS_STRING(self->body) + had, data + pos, take);
            }
            pos += take;
            self->need -= take;
            if (!self->need && complete(self, out) < 0)
                goto error;
            continue;
        }
        if (!self->hdr_len && n - pos >= 5) {
            int t = data[pos];
            long long length = (long long)read_u32(data + pos + 1);
            Py_ssize_t end = pos + 1 + (Py_ssize_t)length;
            if (end <= n && length >= 4 && length <= limit) {
                /* the common case: the whole message is in this chunk; slice, don't assemble */
                int verb = table[t];
                if (verb == FORWARD) {
                    if (span < 0)
                        span = pos;
                    pos = end;
                    if (t == DATA_ROW) {
                        /* a result's rows, relayed untouched: hop over the run of whole DataRows */
                        while (pos + 5 <= n) {
                            long long len2 = (long long)read_u32(data + pos + 1);
                            Py_ssize_t end2 = pos + 1 + (Py_ssize_t)len2;
                            if (data[pos] != DATA_ROW || end2 > n || len2 < 4)
                                break;
                            pos = end2;
                        }
                    }
                    continue;
                }
                if (verb == COPY) {
                    if (span < 0)
                        span = pos;
                    if (append_message(out, COPY, t, cdata + pos + 5, end - pos - 5) < 0)
                        goto error;
                    pos = end;
                    continue;
                }
                if (verb == HOLD) {
                    if (span >= 0) {
                        if (append_span(out, cdata, span, pos) < 0)
                            goto error;
                        span = -1;
                    }
                    if (append_message(out, HOLD, t, cdata + pos + 5, end - pos - 5) < 0)
                        goto error;
                    pos = end;
                    continue;
                }
                /* REFUSE, or a verb this code does not know: the checks below */
            }
        }
        /* a header, whole or split, of a message that does not end in this chunk (or is bad) */
        if (!self->hdr_len) {
            int verb = table[data[pos]];
            if (verb == REFUSE) {
                PyObject *r = PyObject_CallMethod((PyObject *)self, "_refuse", "in", (int)data[pos], pos);
                if (r == NULL)
                    goto error;
                Py_DECREF(r);
                break;
            }
            self->verb = verb;
            if (verb == HOLD && span >= 0) {
                if (append_span(out, cdata, span, pos) < 0)
                    goto error;
                span = -1;
            }
        }
        if (self->verb != HOLD && span < 0)
            span = pos;
        Py_ssize_t take = 5 - self->hdr_len;
        if (take > n - pos)
            take = n - pos;
        memcpy(self->hdr + self->hdr_len, data + pos, take);
        self->hdr_len += (int)take;
        pos += take;
        if (self->hdr_len < 5)
            break;
        int t = self->hdr[0];
        long long length = (long long)read_u32(self->hdr + 1);
        self->hdr_len = 0;
        if (length < 4 || length - 4 > self->max_length) {
            /* the bad message's header is not forwarded: the span stops where it started */
            Py_ssize_t start = pos - 5;
            if (span >= 0 && start > span) {
                if (append_span(out, cdata, span, start) < 0)
                    goto error;
            }
            span = -1;
            PyObject *r = PyObject_CallMethod((PyObject *)self, "_length_violation", "iLn", t, length,
                                              start > 0 ? start : (Py_ssize_t)0);
            if (r == NULL)
                goto error;
            Py_DECREF(r);
            break;
        }
        self->type = t;
        self->need = length - 4;
        Py_CLEAR(self->body);
        if (self->verb != FORWARD) {
            self->body = PyByteArray_FromStringAndSize(NULL, 0);
            if (self->body == NULL)
                goto error;
        }
        if (!self->need && complete(self, out) < 0)
            goto error;
    }
    if (span >= 0 && pos > span) {
        PyObject *bytes;
        if (span == 0 && pos == n && PyBytes_CheckExact(arg)) {
            Py_INCREF(arg);  /* a chunk with nothing held comes back as itself */
            bytes = arg;
        } else {
            bytes = PyBytes_FromStringAndSize(cdata + span, pos - span);
            if (bytes == NULL)
                goto error;
        }
        PyObject *item = PyTuple_Pack(2, IntForward, bytes);
        Py_DECREF(bytes);
        if (append_steal(out, item) < 0)
            goto error;
    }
    Py_DECREF(table_obj);
    PyBuffer_Release(&view);
    return out;

error:
    Py_DECREF(table_obj);
    PyBuffer_Release(&view);
    Py_DECREF(out);
    return NULL;
}

static PyMethodDef FramerCore_methods[] = {
    {"feed", (PyCFunction)FramerCore_feed, METH_O,
     "feed(chunk) -> items in stream order: (SPAN, bytes), (COPY, type, body), (HOLD, type, body)"},
    {NULL}
};

static PyMemberDef FramerCore_members[] = {
    {"max_length", T_LONGLONG, offsetof(FramerCore, max_length), 0, "the longest body allowed"},
    {"violation", T_OBJECT, offsetof(FramerCore, violation), 0, "the ProtocolViolation, once one is seen"},
    {NULL}
};

static PyGetSetDef FramerCore_getset[] = {
    {"table", (getter)get_table, (setter)set_table, "the verb table (256 bytes), replaceable between chunks", NULL},
    {"at_boundary", (getter)get_at_boundary, NULL, "the bytes fed so far end exactly at a message boundary", NULL},
    {NULL}
};

static PyTypeObject FramerCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "proxy.wire._cframer.FramerCore",
    .tp_doc = "The framer's state and feed() in C; proxy.wire.framer.CFramer adds the violations.",
    .tp_basicsize = sizeof(FramerCore),
    .tp_itemsize = 0,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)FramerCore_init,
    .tp_dealloc = (destructor)FramerCore_dealloc,
    .tp_traverse = (traverseproc)FramerCore_traverse,
    .tp_clear = (inquiry)FramerCore_clear,
    .tp_methods = FramerCore_methods,
    .tp_members = FramerCore_members,
    .tp_getset = FramerCore_getset,
};

static struct PyModuleDef cframer_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "proxy.wire._cframer",
    .m_doc = "The compiled core of proxy.wire.framer (ADR 0018).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__cframer(void)
{
    if (PyType_Ready(&FramerCoreType) < 0)
        return NULL;
    IntForward = PyLong_FromLong(FORWARD);
    IntCopy = PyLong_FromLong(COPY);
    IntHold = PyLong_FromLong(HOLD);
    if (IntForward == NULL || IntCopy == NULL || IntHold == NULL)
        return NULL;
    for (int i = 0; i < 256; i++) {
        TypeInts[i] = PyLong_FromLong(i);
        if (TypeInts[i] == NULL)
            return NULL;
    }
    PyObject *m = PyModule_Create(&cframer_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&FramerCoreType);
    if (PyModule_AddObject(m, "FramerCore", (PyObject *)&FramerCoreType) < 0) {
        Py_DECREF(&FramerCoreType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
