/* The quiet read path's bookkeeping of Bind, Describe, Execute and Sync in C (ADR 0018, second addendum), and of a
 * repeated unnamed Parse.
 *
 * ReadPath._quiet_client (read_path.py) is the definition: quiet_run does for these four message kinds exactly
 * what it does (the same portals, unnamed-statement rewrites, metrics keys and quiet FIFOs), and for a Parse what
 * ReadPath._repeated_parse does when it repeats one; tests/unit/test_quiet_differential.py runs both over the same
 * messages and compares everything. What it does not handle it leaves untouched and returns where it stopped: a
 * Parse that is not the repeated one and Query (they need the classifier), Close,
 * FunctionCall, COPY traffic, Terminate, a message whose body is malformed (Python raises the session's protocol
 * violation from that message, with its own words), and any message while the read path is not quiet.
 *
 * join_parts builds the chunk to send from the relay's parts (bytes, and held items that go on as they were) in
 * one allocation, instead of encoding each held item in Python and joining.
 *
 * server_quiet_run is the server's side while the read path is quiet: Relay._server_read's loop (Relay._seen and
 * ReadPath.on_server_quiet, its definition) for the spans, the RowDescriptions that name no watched relation and
 * the ReadyForQuerys; it hands back at the first message it leaves to that loop (ADR 0018's addendum "the quiet
 * server side in C"), and the same differential test runs both over random server streams.
 *
 * No I/O: sans-IO like the rest of the read path.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#define SPAN 0
#define HOLD 2
#define BIND 'B'
#define DESCRIBE 'D'
#define EXECUTE 'E'
#define SYNC 'S'
#define PARSE 'P'
#define COPY 1
#define ROW_DESCRIPTION 'T'
#define READY_FOR_QUERY 'Z'

static PyObject *S_skipping, *S_pending, *S_statements, *S_portals, *S_unnamed, *S_quiet_group, *S_quiet_sent;
static PyObject *S_statement_counts, *S_statement, *S_cls, *S_append;
static PyObject *S_repeat, *S_classifier, *S_generation, *S_watch, *S_stale, *S_prepared, *S_touch;
static PyObject *S_readies, *S_transactions, *S_state, *S_txn_status, *S_phase, *S_ending, *S_tx_status;
static PyObject *S_preparing, *S_statement_seconds, *S_buckets, *S_counts, *S_sum, *S_observe, *S_leak_oids, *S_popleft;
static PyObject *K_I;             /* b"I": idle, outside a transaction */
static PyObject *One;             /* the int 1 */
static PyObject *Authenticating;  /* proxy.wire.state.Phase.AUTHENTICATING, given by init() */
static PyObject *K_B, *K_E, *K_DS, *K_DP, *K_P, *K_passthrough, *K_extended, *K_empty;
static PyObject *EmptyParse;   /* an empty unnamed Parse: read_path._EMPTY_UNNAMED_PARSE */
static PyObject *PerfCounter;  /* time.perf_counter */
static PyObject *Portal;       /* proxy.readpath.read_path.Portal, given by init() */
static PyObject *Grown;        /* proxy.fifo.grown */
static Py_ssize_t Long = -1;   /* proxy.fifo.LONG */

/* The offset of the first NUL in buf[from:len], or -1 (Python's bytes.index raises ValueError there). */
static inline Py_ssize_t
nul_at(const char *buf, Py_ssize_t from, Py_ssize_t len)
{
    if (from > len)
        return -1;
    const char *p = memchr(buf + from, 0, (size_t)(len - from));
    return p == NULL ? -1 : p - buf;
}

/* A name as str (UTF-8, strict), or NULL with no exception set when it is not UTF-8 (Python raises there). */
static PyObject *
name_of(const char *buf, Py_ssize_t start, Py_ssize_t end)
{
    PyObject *s = PyUnicode_DecodeUTF8(buf + start, end - start, "strict");
    if (s == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError))
        PyErr_Clear();
    return s;
}

/* A message's header at w: its type byte and its int32 length (the body's and its own 4 bytes). */
static inline void
put_header(unsigned char *w, int type, Py_ssize_t body)
{
    unsigned long n = (unsigned long)(body + 4);
    w[0] = (unsigned char)type;
    w[1] = (unsigned char)(n >> 24);
    w[2] = (unsigned char)(n >> 16);
    w[3] = (unsigned char)(n >> 8);
    w[4] = (unsigned char)n;
}

/* A typed message: type byte, int32 length (including itself), then the parts. */
static PyObject *
message3(char type, const char *a, Py_ssize_t alen, const char *b, Py_ssize_t blen, const char *c, Py_ssize_t clen)
{
    Py_ssize_t body = alen + blen + clen;
    if (body > 0x7FFFFFFF - 4) {
        PyErr_SetString(PyExc_OverflowError, "message too long");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, 5 + body);
    if (out == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    put_header(p, type, body);
    memcpy(p + 5, a, (size_t)alen);
    memcpy(p + 5 + alen, b, (size_t)blen);
    memcpy(p + 5 + alen + blen, c, (size_t)clen);
    return out;
}

/* The quiet state of one call: the reader's attributes, read once (none of them is replaced by these messages but
 * quiet_sent, which is re-read after it grows). */
typedef struct {
    PyObject *reader;
    PyObject *statements;  /* dict */
    PyObject *portals;     /* dict */
    PyObject *unnamed;     /* str or None */
    PyObject *group;       /* list */
    PyObject *counts;      /* a dict (a Counter) */
} Quiet;

static void
quiet_release(Quiet *q)
{
    Py_CLEAR(q->statements);
    Py_CLEAR(q->portals);
    Py_CLEAR(q->unnamed);
    Py_CLEAR(q->group);
    Py_CLEAR(q->counts);
}

/* 1: loaded; 0: a state this code does not follow (the caller stops); -1: error. */
static int
quiet_load(Quiet *q, PyObject *reader)
{
    q->reader = reader;
    PyObject *v = PyObject_GetAttr(reader, S_skipping);
    if (v == NULL)
        return -1;
    int skipping = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (skipping != 0)
        return skipping < 0 ? -1 : 0;
    v = PyObject_GetAttr(reader, S_pending);
    if (v == NULL)
        return -1;
    Py_ssize_t owed = PyObject_Length(v);
    Py_DECREF(v);
    if (owed != 0)
        return owed < 0 ? -1 : 0;
    if ((q->statements = PyObject_GetAttr(reader, S_statements)) == NULL ||
        (q->portals = PyObject_GetAttr(reader, S_portals)) == NULL ||
        (q->unnamed = PyObject_GetAttr(reader, S_unnamed)) == NULL ||
        (q->group = PyObject_GetAttr(reader, S_quiet_group)) == NULL ||
        (q->counts = PyObject_GetAttr(reader, S_statement_counts)) == NULL)
        return -1;
    if (!PyDict_CheckExact(q->statements) || !PyDict_CheckExact(q->portals) || !PyList_CheckExact(q->group) ||
        !PyDict_Check(q->counts) || (q->unnamed != Py_None && !PyUnicode_CheckExact(q->unnamed)))
        return 0;
    return 1;
}

/* statement_counts[cls, "extended"] += 1, as Counter does it (a missing key counts from 0). */
static int
count_execute(Quiet *q, PyObject *cls)
{
    PyObject *key = PyTuple_Pack(2, cls, K_extended);
    if (key == NULL)
        return -1;
    PyObject *now = PyDict_GetItemWithError(q->counts, key);
    PyObject *next;
    if (now == NULL) {
        if (PyErr_Occurred()) {
            Py_DECREF(key);
            return -1;
        }
        next = PyLong_FromLong(1);
    } else {
        PyObject *one = PyLong_FromLong(1);
        next = one == NULL ? NULL : PyNumber_Add(now, one);
        Py_XDECREF(one);
    }
    int rc = next == NULL ? -1 : PyDict_SetItem(q->counts, key, next);
    Py_XDECREF(next);
    Py_DECREF(key);
    return rc;
}

/* The message with the plan-once statement standing for the unnamed one: head, its name, tail (a new reference). */
static PyObject *
naming_unnamed(Quiet *q, char type, const char *head, Py_ssize_t hlen, const char *tail, Py_ssize_t tlen)
{
    Py_ssize_t nlen;
    const char *name = PyUnicode_AsUTF8AndSize(q->unnamed, &nlen);
    return name == NULL ? NULL : message3(type, head, hlen, name, nlen, tail, tlen);
}

/* The quiet group's next kind; on error the replacement made for the message is dropped. 1 done, -1 error. */
static int
group_append(Quiet *q, PyObject *kind, PyObject **replacement)
{
    if (PyList_Append(q->group, kind) < 0) {
        Py_CLEAR(*replacement);
        return -1;
    }
    return 1;
}

/* portals[portal] = Portal(st), unless the portal held there already has st (a page's repeated Bind). 0 or -1. */
static int
keep_portal(Quiet *q, PyObject *portal, PyObject *st)
{
    PyObject *held = PyDict_GetItemWithError(q->portals, portal);
    if (held == NULL && PyErr_Occurred())
        return -1;
    if (held != NULL) {
        PyObject *was = PyObject_GetAttr(held, S_statement);
        if (was == NULL)
            return -1;
        Py_DECREF(was);
        if (was == st)
            return 0;
    }
    Py_INCREF(st);  /* held across the call into Python (the Portal dataclass's __init__) */
    PyObject *p = PyObject_CallOneArg(Portal, st);
    Py_DECREF(st);
    int rc = p == NULL ? -1 : PyDict_SetItem(q->portals, portal, p);
    Py_XDECREF(p);
    return rc;
}

/* Bind. *replacement: a new reference, or NULL when the message goes on as it was. 1 done, 0 stop, -1 error. */
static int
on_bind(Quiet *q, const char *b, Py_ssize_t len, PyObject **replacement)
{
    Py_ssize_t portal_end = nul_at(b, 0, len);
    if (portal_end < 0)
        return 0;
    Py_ssize_t stmt_end = nul_at(b, portal_end + 1, len);
    if (stmt_end < 0)
        return 0;
    PyObject *st = NULL;  /* borrowed */
    if (PyDict_GET_SIZE(q->statements)) {
        if (Portal == NULL)  /* init() not called: Python does it */
            return 0;
        PyObject *stmt = name_of(b, portal_end + 1, stmt_end);
        if (stmt == NULL)
            return PyErr_Occurred() ? -1 : 0;
        st = PyDict_GetItemWithError(q->statements, stmt);
        Py_DECREF(stmt);
        if (st == NULL && PyErr_Occurred())
            return -1;
    }
    if (st != NULL || PyDict_GET_SIZE(q->portals)) {
        PyObject *portal = name_of(b, 0, portal_end);
        if (portal == NULL)
            return PyErr_Occurred() ? -1 : 0;
        int rc;
        if (st != NULL) {
            rc = keep_portal(q, portal, st);
        } else {
            rc = PyDict_DelItem(q->portals, portal);
            if (rc < 0 && PyErr_ExceptionMatches(PyExc_KeyError)) {
                PyErr_Clear();
                rc = 0;
            }
        }
        Py_DECREF(portal);
        if (rc < 0)
            return -1;
    }
    *replacement = NULL;
    if (stmt_end == portal_end + 1 && q->unnamed != Py_None &&
        (*replacement = naming_unnamed(q, BIND, b, portal_end + 1, b + stmt_end, len - stmt_end)) == NULL)
        return -1;
    return group_append(q, K_B, replacement);
}

static int
on_execute(Quiet *q, const char *b, Py_ssize_t len)
{
    Py_ssize_t end = nul_at(b, 0, len);
    if (end < 0)
        return 0;
    PyObject *cls = K_passthrough;  /* borrowed */
    PyObject *owned = NULL;
    if (PyDict_GET_SIZE(q->portals)) {
        PyObject *name = name_of(b, 0, end);
        if (name == NULL)
            return PyErr_Occurred() ? -1 : 0;
        PyObject *portal = PyDict_GetItemWithError(q->portals, name);
        Py_DECREF(name);
        if (portal == NULL && PyErr_Occurred())
            return -1;
        if (portal != NULL) {
            Py_INCREF(portal);
            PyObject *st = PyObject_GetAttr(portal, S_statement);
            Py_DECREF(portal);
            if (st == NULL)
                return -1;
            if (st != Py_None) {
                owned = PyObject_GetAttr(st, S_cls);
                if (owned == NULL) {
                    Py_DECREF(st);
                    return -1;
                }
                cls = owned;
            }
            Py_DECREF(st);
        }
    }
    int rc = count_execute(q, cls);
    Py_XDECREF(owned);
    if (rc < 0 || PyList_Append(q->group, K_E) < 0)
        return -1;
    return 1;
}

static int
on_describe(Quiet *q, const char *b, Py_ssize_t len, PyObject **replacement)
{
    *replacement = NULL;
    int statement = len > 0 && b[0] == 'S';
    if (statement && len == 2 && b[1] == 0 && q->unnamed != Py_None &&
        (*replacement = naming_unnamed(q, DESCRIBE, "S", 1, "", 1)) == NULL)
        return -1;
    return group_append(q, statement ? K_DS : K_DP, replacement);
}

static int
on_sync(Quiet *q)
{
    PyObject *sent = PyObject_GetAttr(q->reader, S_quiet_sent);
    if (sent == NULL)
        return -1;
    PyObject *now = PyObject_CallNoArgs(PerfCounter);
    int rc = -1;
    if (now != NULL) {
        if (PyList_CheckExact(sent))
            rc = PyList_Append(sent, now);
        else {
            PyObject *r = PyObject_CallMethodOneArg(sent, S_append, now);
            rc = r == NULL ? -1 : 0;
            Py_XDECREF(r);
        }
        Py_DECREF(now);
    }
    if (rc == 0) {
        Py_ssize_t n = PyObject_Length(sent);
        if (n < 0)
            rc = -1;
        else if (n > Long) {
            PyObject *grown = PyObject_CallOneArg(Grown, sent);
            rc = grown == NULL ? -1 : PyObject_SetAttr(q->reader, S_quiet_sent, grown);
            Py_XDECREF(grown);
        }
    }
    Py_DECREF(sent);
    if (rc < 0)
        return -1;
    return PyList_SetSlice(q->group, 0, PyList_GET_SIZE(q->group), NULL) < 0 ? -1 : 1;
}

/* 1 when a ReadPath._repeat check holds, 0 when it does not, -1 on error; takes the reference to ``got``. */
static int
holds(PyObject *got, PyObject *want)
{
    if (got == NULL)
        return -1;
    int rc = PyObject_RichCompareBool(got, want, Py_EQ);
    Py_DECREF(got);
    return rc;
}

/* A repeated unnamed Parse, as ReadPath._repeated_parse does it: 1 done (*replacement: the empty unnamed Parse, or
 * NULL when it goes on as it was), 0 stop (not the repeated one: Python takes it the whole way), -1 error. */
static int
on_repeated_parse(Quiet *q, const char *b, Py_ssize_t len, PyObject **replacement)
{
    *replacement = NULL;
    if (EmptyParse == NULL)  /* init() not called: Python does it */
        return 0;
    PyObject *repeat = PyObject_GetAttr(q->reader, S_repeat);
    if (repeat == NULL)
        return -1;
    int rc = 0;
    PyObject *classifier = NULL;
    if (!PyTuple_CheckExact(repeat) || PyTuple_GET_SIZE(repeat) != 6)
        goto done;
    PyObject *body = PyTuple_GET_ITEM(repeat, 0), *key = PyTuple_GET_ITEM(repeat, 2);
    PyObject *name = PyTuple_GET_ITEM(repeat, 3), *kept = PyTuple_GET_ITEM(repeat, 4);
    if (!PyBytes_CheckExact(body) || PyBytes_GET_SIZE(body) != len || memcmp(PyBytes_AS_STRING(body), b, len) != 0)
        goto done;
    if ((classifier = PyObject_GetAttr(q->reader, S_classifier)) == NULL ||
        (rc = holds(PyObject_GetAttr(classifier, S_generation), PyTuple_GET_ITEM(repeat, 1))) != 1)
        goto done;
    PyObject *watch = PyObject_GetAttr(q->reader, S_watch);
    PyObject *stale = watch == NULL ? NULL : PyObject_GetAttr(watch, S_stale);
    Py_XDECREF(watch);
    if (stale == NULL) {
        rc = -1;
        goto done;
    }
    rc = PyObject_IsTrue(stale);
    Py_DECREF(stale);
    if (rc != 0) {  /* stale: refused the whole way */
        rc = rc < 0 ? -1 : 0;
        goto done;
    }
    if (key != Py_None) {
        PyObject *prepared = PyObject_GetAttr(q->reader, S_prepared);
        if (prepared == NULL || !PyDict_CheckExact(prepared)) {
            rc = prepared == NULL ? -1 : 0;
            Py_XDECREF(prepared);
            goto done;
        }
        PyObject *found = PyDict_GetItemWithError(prepared, key);  /* borrowed */
        Py_XINCREF(found);
        Py_DECREF(prepared);
        if (found == NULL) {
            rc = PyErr_Occurred() ? -1 : 0;
            goto done;
        }
        if ((rc = holds(found, name)) != 1)
            goto done;
    }
    PyObject *now = PyDict_GET_SIZE(q->statements) ? PyDict_GetItemWithError(q->statements, K_empty) : NULL;
    if (now == NULL && PyErr_Occurred()) {
        rc = -1;
        goto done;
    }
    if ((now == NULL ? Py_None : now) != kept) {
        rc = 0;
        goto done;
    }
    PyObject *r = PyObject_CallMethodOneArg(classifier, S_touch, PyTuple_GET_ITEM(repeat, 5));
    if (r == NULL || PyObject_SetAttr(q->reader, S_unnamed, name) < 0) {
        Py_XDECREF(r);
        rc = -1;
        goto done;
    }
    Py_DECREF(r);
    Py_INCREF(name);
    Py_XSETREF(q->unnamed, name);  /* the Binds and Describes after it in this run name it */
    if (name != Py_None) {
        Py_INCREF(EmptyParse);
        *replacement = EmptyParse;
    }
    rc = group_append(q, K_P, replacement);
done:
    Py_XDECREF(classifier);
    Py_DECREF(repeat);
    return rc;
}

/* What a run (quiet_run, server_quiet_run) does with items[i]: a span is appended to out (ITEM_SPAN); an item of
 * kind `kind` (HOLD or COPY) with a bytes body gives its type and body (ITEM_MESSAGE); anything else ends the run
 * there (ITEM_STOP); -1 on error. */
enum { ITEM_STOP = 0, ITEM_MESSAGE = 1, ITEM_SPAN = 2 };

static int
next_item(PyObject *items, Py_ssize_t i, long kind, PyObject *out, long *t, PyObject **body)
{
    PyObject *item = PyList_GET_ITEM(items, i);
    if (!PyTuple_CheckExact(item) || PyTuple_GET_SIZE(item) < 2)
        return ITEM_STOP;
    long got = PyLong_AsLong(PyTuple_GET_ITEM(item, 0));
    if (got == -1 && PyErr_Occurred())
        return -1;
    if (got == SPAN) {
        PyObject *span = PyTuple_GET_ITEM(item, 1);
        if (!PyBytes_CheckExact(span))
            return ITEM_STOP;
        return PyList_Append(out, span) < 0 ? -1 : ITEM_SPAN;
    }
    if (got != kind || PyTuple_GET_SIZE(item) != 3 || !PyBytes_CheckExact(PyTuple_GET_ITEM(item, 2)))
        return ITEM_STOP;
    *t = PyLong_AsLong(PyTuple_GET_ITEM(item, 1));
    if (*t == -1 && PyErr_Occurred())
        return -1;
    *body = PyTuple_GET_ITEM(item, 2);
    return ITEM_MESSAGE;
}

/* quiet_run(reader, items, start, out, count_answered) -> (stop, replaced, answered)
 *
 * From items[start], while the read path is quiet: a span's bytes and each Bind, Describe, Execute and Sync (held
 * items) are accounted for as ReadPath.on_client does, and appended to out (the item itself when it goes on as it
 * was, else its replacement). Returns the index of the first item not handled (len(items) when all were), whether
 * a message was replaced, and how many Syncs were counted for the relay's answered-statements count (when
 * count_answered). Nothing of the item at the stop index has been done. */
static PyObject *
quiet_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "quiet_run(reader, items, start, out, count_answered)");
        return NULL;
    }
    PyObject *reader = args[0], *items = args[1], *out = args[3];
    if (!PyList_CheckExact(out)) {
        PyErr_SetString(PyExc_TypeError, "quiet_run: out is a list");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[2]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (!PyList_CheckExact(items))  /* not the framer's list: Python does it */
        return Py_BuildValue("(nOn)", i, Py_False, (Py_ssize_t)0);
    int count_answered = PyObject_IsTrue(args[4]);
    if (count_answered < 0)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(items);
    int replaced = 0;
    Py_ssize_t answered = 0;
    Quiet q = {0};
    int loaded = 0;  /* the reader's state is read once, at the first held item */
    for (; i < n; i++) {
        long t;
        PyObject *body;
        int got = next_item(items, i, HOLD, out, &t, &body);
        if (got < 0)
            goto error;
        if (got == ITEM_SPAN)
            continue;
        if (got == ITEM_STOP)
            break;
        if (t != BIND && t != DESCRIBE && t != EXECUTE && t != SYNC && t != PARSE)
            break;
        if (!loaded) {
            int rc = quiet_load(&q, reader);
            if (rc < 0)
                goto error;
            if (rc == 0)
                break;
            loaded = 1;
        }
        const char *b = PyBytes_AS_STRING(body);
        Py_ssize_t len = PyBytes_GET_SIZE(body);
        PyObject *replacement = NULL;
        int rc;
        if (t == PARSE)
            rc = on_repeated_parse(&q, b, len, &replacement);
        else if (t == BIND)
            rc = on_bind(&q, b, len, &replacement);
        else if (t == DESCRIBE)
            rc = on_describe(&q, b, len, &replacement);
        else if (t == EXECUTE)
            rc = on_execute(&q, b, len);
        else {
            rc = on_sync(&q);
            if (rc > 0 && count_answered)
                answered++;
        }
        if (rc < 0)
            goto error;
        if (rc == 0)
            break;
        if (replacement != NULL) {
            replaced = 1;
            rc = PyList_Append(out, replacement);
            Py_DECREF(replacement);
        } else
            rc = PyList_Append(out, PyList_GET_ITEM(items, i));  /* the held item, as it was */
        if (rc < 0)
            goto error;
    }
    quiet_release(&q);
    return Py_BuildValue("(nNn)", i, PyBool_FromLong(replaced), answered);
error:
    quiet_release(&q);
    return NULL;
}

/* join_parts(parts) -> bytes: each part is bytes, or a held item (kind, type, body) encoded as a message. */
static PyObject *
join_parts(PyObject *module, PyObject *parts)
{
    if (!PyList_CheckExact(parts)) {
        PyErr_SetString(PyExc_TypeError, "join_parts: a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(parts), total = 0;
    if (n == 1 && PyBytes_CheckExact(PyList_GET_ITEM(parts, 0))) {
        PyObject *only = PyList_GET_ITEM(parts, 0);
        Py_INCREF(only);
        return only;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyList_GET_ITEM(parts, i);
        if (PyBytes_CheckExact(p))
            total += PyBytes_GET_SIZE(p);
        else if (PyTuple_CheckExact(p) && PyTuple_GET_SIZE(p) == 3 && PyBytes_CheckExact(PyTuple_GET_ITEM(p, 2)))
            total += 5 + PyBytes_GET_SIZE(PyTuple_GET_ITEM(p, 2));
        else {
            PyErr_SetString(PyExc_TypeError, "join_parts: a part is bytes or a held item (kind, type, body)");
            return NULL;
        }
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PyList_GET_ITEM(parts, i);
        if (PyBytes_CheckExact(p)) {
            memcpy(w, PyBytes_AS_STRING(p), (size_t)PyBytes_GET_SIZE(p));
            w += PyBytes_GET_SIZE(p);
            continue;
        }
        long t = PyLong_AsLong(PyTuple_GET_ITEM(p, 1));
        if ((t == -1 && PyErr_Occurred()) || t < 0 || t > 255) {
            if (!PyErr_Occurred())
                PyErr_SetString(PyExc_ValueError, "join_parts: a message type is a byte");
            Py_DECREF(out);
            return NULL;
        }
        PyObject *body = PyTuple_GET_ITEM(p, 2);
        Py_ssize_t len = PyBytes_GET_SIZE(body);
        if (len > 0x7FFFFFFF - 4) {
            PyErr_SetString(PyExc_OverflowError, "message too long");
            Py_DECREF(out);
            return NULL;
        }
        put_header(w, (int)t, len);
        memcpy(w + 5, PyBytes_AS_STRING(body), (size_t)len);
        w += 5 + len;
    }
    return out;
}

/* ------------------------------------------------------------------ the server's side */

/* obj.name += 1 (an int attribute). 0, or -1 on error. */
static int
increment(PyObject *obj, PyObject *name)
{
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return -1;
    PyObject *next = PyNumber_Add(v, One);
    Py_DECREF(v);
    if (next == NULL)
        return -1;
    int rc = PyObject_SetAttr(obj, name, next);
    Py_DECREF(next);
    return rc;
}

/* ReadPath._may_leak: whether a RowDescription's body holds one of reader.watch.leak_oids. 1 (or a state this code
 * does not follow: Python decides), 0, or -1 on error. */
static int
may_leak(PyObject *reader, const char *b, Py_ssize_t len)
{
    PyObject *watch = PyObject_GetAttr(reader, S_watch);
    if (watch == NULL)
        return -1;
    PyObject *oids = PyObject_GetAttr(watch, S_leak_oids);
    Py_DECREF(watch);
    if (oids == NULL)
        return -1;
    int found = !PyTuple_CheckExact(oids);
    for (Py_ssize_t k = 0; !found && k < PyTuple_GET_SIZE(oids); k++) {
        PyObject *oid = PyTuple_GET_ITEM(oids, k);
        found = !PyBytes_CheckExact(oid)
                || memmem(b, (size_t)len, PyBytes_AS_STRING(oid), (size_t)PyBytes_GET_SIZE(oid)) != NULL;
    }
    Py_DECREF(oids);
    return found;
}

/* Histogram.observe(value) (proxy/stats.py): counts[bisect_left(buckets, value)] += 1; sum += value. 0 or -1. */
static int
observe(PyObject *histogram, PyObject *value)
{
    PyObject *buckets = PyObject_GetAttr(histogram, S_buckets);
    if (buckets == NULL)
        return -1;
    PyObject *counts = PyObject_GetAttr(histogram, S_counts);
    if (counts == NULL || !PyTuple_CheckExact(buckets) || !PyList_CheckExact(counts)) {
        Py_DECREF(buckets);
        if (counts == NULL)
            return -1;
        Py_DECREF(counts);
        PyObject *r = PyObject_CallMethodOneArg(histogram, S_observe, value);  /* not the plain one: its own */
        Py_XDECREF(r);
        return r == NULL ? -1 : 0;
    }
    Py_ssize_t lo = 0, hi = PyTuple_GET_SIZE(buckets);
    while (lo < hi) {  /* bisect_left */
        Py_ssize_t mid = (lo + hi) / 2;
        int less = PyObject_RichCompareBool(PyTuple_GET_ITEM(buckets, mid), value, Py_LT);
        if (less < 0)
            goto error;
        if (less)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo >= PyList_GET_SIZE(counts)) {
        PyErr_SetString(PyExc_IndexError, "list index out of range");
        goto error;
    }
    PyObject *next = PyNumber_Add(PyList_GET_ITEM(counts, lo), One);
    if (next == NULL)
        goto error;
    PyList_SetItem(counts, lo, next);  /* steals next */
    Py_DECREF(buckets);
    Py_DECREF(counts);
    PyObject *sum = PyObject_GetAttr(histogram, S_sum);
    if (sum == NULL)
        return -1;
    PyObject *total = PyNumber_Add(sum, value);
    Py_DECREF(sum);
    if (total == NULL)
        return -1;
    int rc = PyObject_SetAttr(histogram, S_sum, total);
    Py_DECREF(total);
    return rc;
error:
    Py_DECREF(buckets);
    Py_DECREF(counts);
    return -1;
}

/* A ReadyForQuery while quiet: Relay._seen (the relay's readies and transactions, SessionState.on_backend's
 * txn_status) then ReadPath.on_server_quiet (the read path's readies, tx_status, the statement's latency). 1 done,
 * 0 left untouched (a body that is not one status byte, a session still authenticating, statements being
 * prepared: Python does those), -1 error. */
static int
on_ready(PyObject *relay, PyObject *reader, const char *b, Py_ssize_t len)
{
    if (len != 1)
        return 0;
    PyObject *state = PyObject_GetAttr(relay, S_state);
    if (state == NULL)
        return -1;
    PyObject *phase = PyObject_GetAttr(state, S_phase);
    if (phase == NULL) {
        Py_DECREF(state);
        return -1;
    }
    Py_DECREF(phase);  /* compared by identity only: Authenticating holds its own reference */
    int busy = 1;  /* still authenticating: left to Python */
    if (phase != Authenticating) {
        PyObject *preparing = PyObject_GetAttr(reader, S_preparing);
        busy = preparing == NULL ? -1 : PyObject_IsTrue(preparing);
        Py_XDECREF(preparing);
    }
    if (busy != 0) {
        Py_DECREF(state);
        return busy < 0 ? -1 : 0;
    }
    PyObject *status = PyBytes_FromStringAndSize(b, 1);
    PyObject *was = status == NULL ? NULL : PyObject_GetAttr(state, S_txn_status);
    int rc = -1;
    if (was == NULL || increment(relay, S_readies) < 0)
        goto done;
    int left = PyObject_RichCompareBool(was, K_I, Py_NE);  /* txn_status != b"I": a transaction that ends here */
    if (left < 0 || (left && b[0] == 'I' && increment(relay, S_transactions) < 0))
        goto done;
    if (PyObject_SetAttr(state, S_txn_status, status) < 0 || increment(reader, S_readies) < 0
            || PyObject_SetAttr(reader, S_tx_status, status) < 0)
        goto done;
    PyObject *sent_fifo = PyObject_GetAttr(reader, S_quiet_sent);
    if (sent_fifo == NULL)
        goto done;
    Py_ssize_t owed = PyObject_Length(sent_fifo);
    PyObject *sent = NULL;
    if (owed > 0) {
        if (PyList_CheckExact(sent_fifo)) {  /* fifo.popleft */
            sent = Py_NewRef(PyList_GET_ITEM(sent_fifo, 0));
            if (PyList_SetSlice(sent_fifo, 0, 1, NULL) < 0)
                Py_CLEAR(sent);
        } else
            sent = PyObject_CallMethodNoArgs(sent_fifo, S_popleft);
    }
    Py_DECREF(sent_fifo);
    if (owed < 0 || (owed > 0 && sent == NULL))
        goto done;
    if (sent != NULL) {
        PyObject *histogram = PyObject_GetAttr(reader, S_statement_seconds);
        if (histogram == NULL) {
            Py_DECREF(sent);
            goto done;
        }
        if (histogram != Py_None) {
            PyObject *now = PyObject_CallNoArgs(PerfCounter);
            PyObject *value = now == NULL ? NULL : PyNumber_Subtract(now, sent);
            Py_XDECREF(now);
            if (value == NULL || observe(histogram, value) < 0) {
                Py_XDECREF(value);
                Py_DECREF(histogram);
                Py_DECREF(sent);
                goto done;
            }
            Py_DECREF(value);
        }
        Py_DECREF(histogram);
        Py_DECREF(sent);
    }
    rc = 1;
done:
    Py_XDECREF(was);
    Py_XDECREF(status);
    Py_DECREF(state);
    return rc;
}

/* server_quiet_run(relay, reader, items, start, out) -> stop: Relay._server_read's loop over the framer's items
 * while the read path is quiet (its definition), from items[start]: each span appended to out, a RowDescription
 * that names no watched relation looked at and let go, a ReadyForQuery accounted for (on_ready). Returns the index
 * of the first item not handled (len(items) when all were): an ErrorResponse, a ParameterStatus or any other
 * message the session state reads, a RowDescription that may carry event rows, a ReadyForQuery on_ready leaves.
 * Nothing of the item at the stop index has been done. */
static PyObject *
server_quiet_run(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "server_quiet_run(relay, reader, items, start, out)");
        return NULL;
    }
    PyObject *relay = args[0], *reader = args[1], *items = args[2], *out = args[4];
    Py_ssize_t i = PyLong_AsSsize_t(args[3]);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (!PyList_CheckExact(out) || !PyList_CheckExact(items)) {
        PyErr_SetString(PyExc_TypeError, "server_quiet_run: items and out are lists");
        return NULL;
    }
    PyObject *ending = PyObject_GetAttr(relay, S_ending);
    if (ending == NULL)
        return NULL;
    Py_DECREF(ending);
    if (ending != Py_None)  /* the session ends: Python stops where it must */
        return PyLong_FromSsize_t(i);
    Py_ssize_t n = PyList_GET_SIZE(items);
    for (; i < n; i++) {
        long t;
        PyObject *body;
        int got = next_item(items, i, COPY, out, &t, &body);
        if (got < 0)
            return NULL;
        if (got == ITEM_SPAN)
            continue;
        if (got == ITEM_STOP)
            break;
        int done;  /* 1 handled, 0 left to Python, -1 error */
        if (t == ROW_DESCRIPTION) {
            int leak = may_leak(reader, PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body));
            done = leak < 0 ? -1 : !leak;
        } else if (t == READY_FOR_QUERY)
            done = on_ready(relay, reader, PyBytes_AS_STRING(body), PyBytes_GET_SIZE(body));
        else
            break;
        if (done < 0)
            return NULL;
        if (done == 0)
            break;
    }
    return PyLong_FromSsize_t(i);
}

/* init(portal_class, empty_parse, authenticating): the Portal class quiet_run makes for a Bind of a statement it
 * follows, the empty unnamed Parse a repeated translated Parse becomes, and the session phase in which
 * server_quiet_run leaves a ReadyForQuery to Python (Phase.AUTHENTICATING). */
static PyObject *
init(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "init(portal_class, empty_parse: bytes, authenticating)");
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_XSETREF(Portal, args[0]);
    Py_INCREF(args[1]);
    Py_XSETREF(EmptyParse, args[1]);
    Py_INCREF(args[2]);
    Py_XSETREF(Authenticating, args[2]);
    Py_RETURN_NONE;
}

static PyMethodDef cquiet_methods[] = {
    {"quiet_run", (PyCFunction)(void (*)(void))quiet_run, METH_FASTCALL,
     "quiet_run(reader, items, start, out, count_answered) -> (stop, replaced, answered)"},
    {"join_parts", (PyCFunction)join_parts, METH_O, "join_parts(parts) -> bytes"},
    {"server_quiet_run", (PyCFunction)(void (*)(void))server_quiet_run, METH_FASTCALL,
     "server_quiet_run(relay, reader, items, start, out) -> stop"},
    {"init", (PyCFunction)(void (*)(void))init, METH_FASTCALL, "init(portal_class, empty_parse, authenticating)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef cquiet_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "proxy.readpath._cquiet",
    .m_doc = "The quiet read path's bookkeeping in C: the client's Bind/Describe/Execute/Sync and repeated Parse, "
             "the server's RowDescription and ReadyForQuery (ADR 0018's addenda).",
    .m_size = -1,
    .m_methods = cquiet_methods,
};

#define INTERN(var, text) if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL

PyMODINIT_FUNC
PyInit__cquiet(void)
{
    INTERN(S_skipping, "skipping");
    INTERN(S_pending, "pending");
    INTERN(S_statements, "statements");
    INTERN(S_portals, "portals");
    INTERN(S_unnamed, "unnamed");
    INTERN(S_quiet_group, "quiet_group");
    INTERN(S_quiet_sent, "quiet_sent");
    INTERN(S_statement_counts, "statement_counts");
    INTERN(S_statement, "statement");
    INTERN(S_cls, "cls");
    INTERN(S_append, "append");
    INTERN(S_repeat, "_repeat");
    INTERN(S_classifier, "classifier");
    INTERN(S_generation, "generation");
    INTERN(S_watch, "watch");
    INTERN(S_stale, "stale");
    INTERN(S_prepared, "prepared");
    INTERN(S_touch, "touch");
    INTERN(S_readies, "readies");
    INTERN(S_transactions, "transactions");
    INTERN(S_state, "state");
    INTERN(S_txn_status, "txn_status");
    INTERN(S_phase, "phase");
    INTERN(S_ending, "ending");
    INTERN(S_tx_status, "tx_status");
    INTERN(S_preparing, "preparing");
    INTERN(S_statement_seconds, "statement_seconds");
    INTERN(S_buckets, "buckets");
    INTERN(S_counts, "counts");
    INTERN(S_sum, "sum");
    INTERN(S_observe, "observe");
    INTERN(S_leak_oids, "leak_oids");
    INTERN(S_popleft, "popleft");
    if ((K_I = PyBytes_FromStringAndSize("I", 1)) == NULL || (One = PyLong_FromLong(1)) == NULL)
        return NULL;
    INTERN(K_P, "P");
    INTERN(K_empty, "");
    INTERN(K_B, "B");
    INTERN(K_E, "E");
    INTERN(K_DS, "DS");
    INTERN(K_DP, "DP");
    INTERN(K_passthrough, "passthrough");
    INTERN(K_extended, "extended");
    PyObject *time = PyImport_ImportModule("time");
    if (time == NULL)
        return NULL;
    PerfCounter = PyObject_GetAttrString(time, "perf_counter");
    Py_DECREF(time);
    PyObject *fifo = PyImport_ImportModule("proxy.fifo");
    if (PerfCounter == NULL || fifo == NULL)
        return NULL;
    Grown = PyObject_GetAttrString(fifo, "grown");
    PyObject *lng = PyObject_GetAttrString(fifo, "LONG");
    Py_DECREF(fifo);
    if (Grown == NULL || lng == NULL)
        return NULL;
    Long = PyLong_AsSsize_t(lng);
    Py_DECREF(lng);
    if (Long == -1 && PyErr_Occurred())
        return NULL;
    return PyModule_Create(&cquiet_module);
}
