/* mpicomm.front._door: the front door's numpy fast path in C (see mpicomm/front/door.py), a callable that
 * stands for a public call.
 *
 * Why: every public call that takes arrays goes through the front door, whose Python wrapper costs
 * about 0.17 us a call (its frame, the watchdog's token, the thread check): as much as the MPI call
 * at 8 bytes. A Door does the same for a call whose arrays are all numpy, in C, and hands every
 * other call (torch, device arrays, a bad async_op, another thread's call, a missing argument) to
 * that Python wrapper, whose behaviour it mirrors:
 *
 *   1. every array argument is a numpy array (its type exactly np.ndarray, or a type the kinds
 *      table calls plain, or a list/tuple of numpy arrays), and async_op, where given, is a bool;
 *   2. below MPI_THREAD_MULTIPLE, the calling thread is the one that started MPI; at it, a call that
 *      takes no tag holds its group in mpicomm.core.busy's table while it runs: another thread's
 *      call on the group marks it raced and waits (busy.race), and every call on a raced group
 *      raises as it returns (busy.settle, which in validation mode first agrees across the ranks);
 *   3. the watchdog's token (thread ident, site, group, None) is on the live list while the host
 *      implementation runs with the caller's own arguments; where the call has a fast entry (a C
 *      function that serves its common call whole: broadcast's, mpicomm/core/_cmpi_bcast.c), that
 *      runs first, in the same place, and the host only where it answers NotImplemented;
 *   4. an Exception the host (or the fast entry) raises goes to `failed(exc, before, args, kwnames)`, a Python function
 *      that returns what the Python wrapper raises (mpicomm.core.calls.failed: after the validation
 *      exchange where one is due): exc itself, or a CommunicationError raised here with exc as its
 *      context.
 *
 * It is not a function object, so it carries a __dict__ (functools.update_wrapper fills __name__,
 * __doc__, __wrapped__...) and is a non-data descriptor that returns itself, as builtin functions
 * are: inspect.isroutine() holds, inspect.signature() follows __wrapped__ to the host's signature. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <string.h>
#include <structmember.h>

#include "../core/_slots.h"

#define DOOR_MAX_ARRAYS 8
#define DOOR_MAX_PARAMS 16 /* of a call with a fast entry */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *host;     /* the host (numpy) implementation */
    PyObject *fallback; /* the Python wrapper: every call this door does not serve */
    PyObject *failed;   /* failed(exc, before, args, kwnames): raises the call's error */
    PyObject *site;     /* the watchdog's site of this call */
    PyObject *live;     /* the watchdog's list of live tokens */
    PyObject *threads;  /* watchdog._Threads: .owner, the thread that started MPI, or None */
    PyObject *state;    /* validation._Flag: .exchanges */
    Py_ssize_t owner_at, exchanges_at; /* where those two slots are, in their objects */
    PyObject *ndarray;  /* numpy.ndarray */
    PyObject *kinds;    /* type -> kind, the front door's table */
    PyObject *plain;    /* the kinds served as they are (a frozenset) */
    PyObject *list_kind;
    PyObject *names;    /* the parameters' names, in order (a tuple of str) */
    PyObject *defaults; /* their defaults, `missing` for none (a tuple) */
    PyObject *missing;
    Py_ssize_t arrays[DOOR_MAX_ARRAYS];
    int n_arrays;
    Py_ssize_t flag, group; /* positions of async_op and group, -1 for none */
    PyObject *weakrefs; /* weakref.ref(door) works, as for a function */
    /* at MPI_THREAD_MULTIPLE (see mpicomm/core/busy.py) */
    int exclusive;         /* whether the call holds its group (it takes no tag) */
    Py_ssize_t engine_at;  /* where threads.engine is: the async engine's thread, never checked */
    PyObject *groups;      /* groups._State: .world, the key of group None */
    Py_ssize_t world_at;
    PyObject *group_type;  /* ProcessGroup: another group argument holds nothing (the host refuses it) */
    PyObject *busy;        /* group -> the token of the call inside it */
    PyObject *raced;       /* the groups two threads called on at once -> what happened */
    PyObject *race;        /* race(token, group, inside): marks the group raced, waits, holds it */
    PyObject *spoil;       /* busy.settle(token, group, error class or None): raises on a raced group */
    PyObject *fast;        /* NULL, or the call's fast entry: tried before the host (see fast_call) */
} Door;

/* The thread ident as a Python int, made once per thread that calls (most programs: one). */
static unsigned long ident_of_obj;
static PyObject *ident_obj;

/* The value of parameter p in a vectorcall (borrowed), its default if not given, or NULL if
 * neither (the call goes to the Python wrapper, which raises TypeError). */
static PyObject *param(Door *d, Py_ssize_t p, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (p < nargs) return args[p];
    if (kwnames != NULL) {
        PyObject *name = PyTuple_GET_ITEM(d->names, p);
        Py_ssize_t nkw = PyTuple_GET_SIZE(kwnames);
        for (Py_ssize_t j = 0; j < nkw; j++) {
            PyObject *k = PyTuple_GET_ITEM(kwnames, j);
            if (k == name) return args[nargs + j];
        }
        for (Py_ssize_t j = 0; j < nkw; j++) {
            PyObject *k = PyTuple_GET_ITEM(kwnames, j);
            int eq = PyUnicode_Compare(k, name);
            if (eq == 0) return args[nargs + j];
            if (eq == -1 && PyErr_Occurred()) PyErr_Clear();
        }
    }
    PyObject *dflt = PyTuple_GET_ITEM(d->defaults, p);
    return dflt == d->missing ? NULL : dflt;
}

/* Whether v is served here: a numpy array, a plain kind, or a list/tuple of numpy arrays. */
static int numpy_like(Door *d, PyObject *v) {
    PyObject *t = (PyObject *)Py_TYPE(v);
    if (t == d->ndarray) return 1;
    PyObject *k = PyDict_GetItemWithError(d->kinds, t); /* borrowed */
    if (k == NULL) {
        PyErr_Clear();
        return 0;
    }
    int plain = PySet_Contains(d->plain, k);
    if (plain < 0) {
        PyErr_Clear();
        return 0;
    }
    if (plain) return 1;
    if (k != d->list_kind || !(PyList_CheckExact(v) || PyTuple_CheckExact(v))) return 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
    PyObject **items = PySequence_Fast_ITEMS(v);
    for (Py_ssize_t i = 0; i < n; i++)
        if ((PyObject *)Py_TYPE(items[i]) != d->ndarray) return 0;
    return 1;
}

static void drop_token(PyObject *live, PyObject *token) {
    Py_ssize_t n = PyList_GET_SIZE(live);
    if (n > 0 && PyList_GET_ITEM(live, n - 1) == token) { /* the common case: the last one, as list.pop() */
        Py_SET_SIZE(live, n - 1);
        Py_DECREF(token);
        return;
    }
    for (Py_ssize_t i = n - 1; i >= 0; i--) {
        if (PyList_GET_ITEM(live, i) == token) {
            if (PyList_SetSlice(live, i, i + 1, NULL) < 0) PyErr_Clear();
            return;
        }
    }
}

static PyObject *door_fail(Door *d, PyObject *before, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (type == NULL || !PyErr_GivenExceptionMatches(type, PyExc_Exception)) {
        PyErr_Restore(type, value, tb); /* KeyboardInterrupt, SystemExit: as they are */
        return NULL;
    }
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL) PyException_SetTraceback(value, tb);
    Py_ssize_t total = nargs + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *given = PyTuple_New(total);
    if (given == NULL) {
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < total; i++) {
        Py_INCREF(args[i]);
        PyTuple_SET_ITEM(given, i, args[i]);
    }
    PyObject *err = PyObject_CallFunctionObjArgs(d->failed, value, before, given, kwnames != NULL ? kwnames : Py_None, NULL);
    Py_DECREF(given);
    if (err == value) { /* raised as it is, as the wrapper's `raise exc` */
        Py_DECREF(err);
        PyErr_Restore(type, value, tb);
        return NULL;
    }
    Py_XDECREF(type);
    Py_XDECREF(tb);
    if (err == NULL || !PyExceptionInstance_Check(err)) {
        Py_XDECREF(value);
        if (err != NULL) {
            Py_DECREF(err);
            PyErr_SetString(PyExc_SystemError, "mpicomm front door: failed() returned no exception");
        }
        return NULL;
    }
    /* the wrapper raises it inside `except Exception as exc`: exc is its context, whatever the caller
     * is handling (PyErr_Restore chains nothing, where PyErr_SetObject would) */
    PyException_SetContext(err, value); /* steals value */
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(err)), err, PyException_GetTraceback(err));
    return NULL;
}

/* Whether the thread ident in slot `at` of `threads` is `me` (0 where unset or None). */
static int is_thread(PyObject *threads, Py_ssize_t at, unsigned long me) {
    PyObject *v = slot(threads, at);
    if (v == NULL || v == Py_None) return 0;
    unsigned long o = PyLong_AsUnsignedLong(v);
    if (o == (unsigned long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return o == me;
}

/* At MPI_THREAD_MULTIPLE: mark the call of `token` as inside its group (busy.hold). Returns 0 with
 * *held a new reference to the group's key (NULL where the call holds nothing: the engine's thread,
 * a call nested in one of this thread, a group argument of another type), or -1 with the error set.
 * Where another thread's call is inside, busy.race marks the group raced and returns once it holds
 * it. */
static int hold(Door *d, PyObject *group, PyObject *token, unsigned long me, PyObject **held) {
    *held = NULL;
    if (is_thread(d->threads, d->engine_at, me)) return 0;
    PyObject *k = group;
    if (group == Py_None) {
        k = slot(d->groups, d->world_at);
        if (k == NULL) k = Py_None;
    } else if ((PyObject *)Py_TYPE(group) != d->group_type) {
        return 0;
    }
    PyObject *inside = PyDict_SetDefault(d->busy, k, token); /* borrowed */
    if (inside == NULL) return -1;
    if (inside == token) {
        *held = Py_NewRef(k);
        return 0;
    }
    PyObject *who = PyTuple_GET_ITEM(inside, 0), *mine = PyTuple_GET_ITEM(token, 0);
    int same = who == mine ? 1 : PyObject_RichCompareBool(who, mine, Py_EQ);
    if (same < 0) return -1;
    if (same) return 0; /* nested in a call of this thread: the outer call lets go */
    /* marked in the step that found the call inside (no Python code runs between): that call looks
     * at the mark as it ends, in validation mode (busy.settle) */
    PyObject *blank = PyUnicode_New(0, 0);
    if (blank == NULL || PyDict_SetDefault(d->raced, k, blank) == NULL) {
        Py_XDECREF(blank);
        return -1;
    }
    Py_DECREF(blank);
    Py_INCREF(inside); /* race() waits: the thread inside lets go meanwhile */
    Py_INCREF(k);
    PyObject *r = PyObject_CallFunctionObjArgs(d->race, token, k, inside, NULL);
    Py_DECREF(inside);
    if (r == NULL) {
        Py_DECREF(k);
        return -1;
    }
    Py_DECREF(r);
    *held = k;
    return 0;
}

/* let_go where busy's raced table is not empty (a raced group, or validation mode): busy.settle(token,
 * group, the error's class or None) runs first, while the group is still held: it may agree across
 * the ranks (validation mode) and raises on a raced group; then the hold ends, and where settle
 * raised, the result `r` is dropped and its error raised (the host's error, if any, is its context). */
static PyObject *settle(Door *d, PyObject *held, PyObject *token, PyObject *r, PyObject *type, PyObject *value,
                        PyObject *tb) {
    PyObject *st = NULL, *sv = NULL, *stb = NULL;
    PyObject *got = PyObject_CallFunctionObjArgs(d->spoil, token, held, type ? type : Py_None, NULL);
    if (got == NULL) PyErr_Fetch(&st, &sv, &stb);
    Py_XDECREF(got);
    PyObject *cur = PyDict_GetItemWithError(d->busy, held);
    if (cur == token && PyDict_DelItem(d->busy, held) < 0) PyErr_Clear();
    if (cur == NULL) PyErr_Clear();
    Py_DECREF(held);
    if (st == NULL) {
        PyErr_Restore(type, value, tb);
        return r;
    }
    Py_XDECREF(r);
    PyErr_Restore(st, sv, stb);
    if (value != NULL) { /* as Python's `finally` raising: the host's error is the context */
        PyObject *t2, *v2, *tb2;
        PyErr_Fetch(&t2, &v2, &tb2);
        PyErr_NormalizeException(&t2, &v2, &tb2);
        PyErr_NormalizeException(&type, &value, &tb);
        if (tb != NULL) PyException_SetTraceback(value, tb);
        if (v2 != NULL) PyException_SetContext(v2, value); /* steals value */
        else Py_DECREF(value);
        PyErr_Restore(t2, v2, tb2);
    }
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return NULL;
}

/* End the hold of `token` on `held` (steals it) as busy.let_go does; returns `r` with the host's
 * error, if any, as it was, unless busy's raced table is not empty (settle above). */
static PyObject *let_go(Door *d, PyObject *held, PyObject *token, PyObject *r) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (PyDict_GET_SIZE(d->raced) > 0) return settle(d, held, token, r, type, value, tb);
    PyObject *cur = PyDict_GetItemWithError(d->busy, held);
    if (cur == token && PyDict_DelItem(d->busy, held) < 0) PyErr_Clear();
    if (cur == NULL) PyErr_Clear();
    Py_DECREF(held);
    PyErr_Restore(type, value, tb);
    return r;
}

/* The position of the parameter named `key` (a keyword of the call), or -1 for none. */
static Py_ssize_t position(Door *d, PyObject *key) {
    Py_ssize_t n = PyTuple_GET_SIZE(d->names);
    for (Py_ssize_t p = 0; p < n; p++)
        if (PyTuple_GET_ITEM(d->names, p) == key) return p;
    for (Py_ssize_t p = 0; p < n; p++) {
        int eq = PyUnicode_Compare(key, PyTuple_GET_ITEM(d->names, p));
        if (eq == 0) return p;
        if (eq == -1 && PyErr_Occurred()) PyErr_Clear();
    }
    return -1;
}

/* The fast entry's answer: it gets every parameter in order, positionally (those given, then the
 * defaults), and answers the call, or NotImplemented before any MPI call where the call is not the
 * common one it serves (the host then serves it). A call whose arguments do not bind plainly (an
 * unknown or repeated keyword, a parameter without a value) goes to the host, which raises. Every
 * parameter is positional-or-keyword (mpicomm.front.door gives no fast entry otherwise). */
static PyObject *fast_call(Door *d, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *all[DOOR_MAX_PARAMS] = {NULL};
    Py_ssize_t n = PyTuple_GET_SIZE(d->names), nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t p = 0; p < nargs; p++) all[p] = args[p];
    for (Py_ssize_t j = 0; j < nkw; j++) {
        Py_ssize_t p = position(d, PyTuple_GET_ITEM(kwnames, j));
        if (p < 0 || all[p] != NULL) Py_RETURN_NOTIMPLEMENTED;
        all[p] = args[nargs + j];
    }
    for (Py_ssize_t p = nargs; p < n; p++) {
        if (all[p] != NULL) continue;
        all[p] = PyTuple_GET_ITEM(d->defaults, p);
        if (all[p] == d->missing) Py_RETURN_NOTIMPLEMENTED;
    }
    return PyObject_Vectorcall(d->fast, all, n, NULL);
}

static PyObject *door_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Door *d = (Door *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs > PyTuple_GET_SIZE(d->names)) goto slow;
    for (int i = 0; i < d->n_arrays; i++) {
        PyObject *v = param(d, d->arrays[i], args, nargs, kwnames);
        if (v == NULL || !numpy_like(d, v)) goto slow;
    }
    PyObject *group = Py_None;
    if (d->flag >= 0) {
        PyObject *f = param(d, d->flag, args, nargs, kwnames);
        if (f != Py_True && f != Py_False) goto slow;
    }
    if (d->group >= 0) {
        group = param(d, d->group, args, nargs, kwnames);
        if (group == NULL) goto slow;
    }
    unsigned long me = PyThread_get_thread_ident();
    PyObject *owner = slot(d->threads, d->owner_at);
    if (owner == NULL) goto slow;
    if (owner != Py_None) {
        unsigned long o = PyLong_AsUnsignedLong(owner);
        if (o == (unsigned long)-1 && PyErr_Occurred()) return NULL;
        if (o != me) goto slow; /* the Python wrapper raises the thread error */
    }
    PyObject *before = slot(d->state, d->exchanges_at);
    if (before == NULL) goto slow;
    Py_INCREF(before);
    if (ident_obj == NULL || ident_of_obj != me) {
        PyObject *made = PyLong_FromUnsignedLong(me);
        if (made == NULL) {
            Py_DECREF(before);
            return NULL;
        }
        Py_XSETREF(ident_obj, made);
        ident_of_obj = me;
    }
    /* a reference of our own: the tuple's allocation may collect garbage, run Python code and let
     * another thread replace the cached ident */
    PyObject *ident = Py_NewRef(ident_obj);
    PyObject *token = PyTuple_Pack(4, ident, d->site, group, Py_None);
    Py_DECREF(ident);
    if (token == NULL) {
        Py_DECREF(before);
        return NULL;
    }
    PyObject *held = NULL;
    if (owner == Py_None && d->exclusive && hold(d, group, token, me, &held) < 0) {
        Py_DECREF(token);
        Py_DECREF(before);
        return NULL;
    }
    if (PyList_Append(d->live, token) < 0) {
        if (held != NULL) let_go(d, held, token, NULL);
        Py_DECREF(token);
        Py_DECREF(before);
        return NULL;
    }
    PyObject *r = d->fast != NULL ? fast_call(d, args, nargs, kwnames) : Py_NewRef(Py_NotImplemented);
    if (r == Py_NotImplemented) {
        Py_DECREF(r);
        r = PyObject_Vectorcall(d->host, args, nargsf, kwnames);
    }
    if (r == NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        drop_token(d->live, token);
        PyErr_Restore(type, value, tb);
        r = door_fail(d, before, args, nargs, kwnames);
    } else {
        drop_token(d->live, token);
    }
    if (held != NULL) r = let_go(d, held, token, r);
    Py_DECREF(token);
    Py_DECREF(before);
    return r;

slow:
    return PyObject_Vectorcall(d->fallback, args, nargsf, kwnames);
}

/* The object fields a Door holds a reference to (its __dict__ apart): visited, cleared and set from
 * one list. */
#define DOOR_OBJECTS(X)                                                                            \
    X(host) X(fallback) X(failed) X(site) X(live) X(threads) X(state) X(ndarray) X(kinds) X(plain) \
        X(list_kind) X(names) X(defaults) X(missing) X(groups) X(group_type) X(busy) X(raced) X(race) X(spoil) \
            X(fast)

static int door_traverse(PyObject *self, visitproc visit, void *arg) {
    Door *d = (Door *)self;
    Py_VISIT(d->dict);
#define VISIT(f) Py_VISIT(d->f);
    DOOR_OBJECTS(VISIT)
#undef VISIT
    return 0;
}

static int door_clear(PyObject *self) {
    Door *d = (Door *)self;
    Py_CLEAR(d->dict);
#define CLEAR(f) Py_CLEAR(d->f);
    DOOR_OBJECTS(CLEAR)
#undef CLEAR
    return 0;
}

static void door_dealloc(PyObject *self) {
    PyObject_GC_UnTrack(self);
    if (((Door *)self)->weakrefs != NULL) PyObject_ClearWeakRefs(self);
    door_clear(self);
    Py_TYPE(self)->tp_free(self);
}

static PyObject *door_get(PyObject *self, PyObject *obj, PyObject *type) {
    Py_INCREF(self); /* as a builtin function: never bound to an instance */
    return self;
}

/* The door's __qualname__ (borrowed), or NULL when it has none that is a str. */
static PyObject *qualname(Door *d) {
    PyObject *name = d->dict != NULL ? PyDict_GetItemString(d->dict, "__qualname__") : NULL;
    return name != NULL && PyUnicode_Check(name) ? name : NULL;
}

static PyObject *door_repr(PyObject *self) {
    Door *d = (Door *)self;
    PyObject *name = qualname(d);
    if (name != NULL) return PyUnicode_FromFormat("<function %U (mpicomm front door)>", name);
    return PyUnicode_FromString("<function (mpicomm front door)>");
}

/* __reduce__: the door's name, so that copy.copy and copy.deepcopy give the door itself, as for a
 * function (pickle looks the name up as it does a function's). */
static PyObject *door_reduce(PyObject *self, PyObject *unused) {
    Door *d = (Door *)self;
    PyObject *name = qualname(d);
    if (name == NULL) {
        PyErr_SetString(PyExc_TypeError, "a front door without a str __qualname__ cannot be copied");
        return NULL;
    }
    Py_INCREF(name);
    return name;
}

static PyMethodDef door_methods[] = {{"__reduce__", door_reduce, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};

static PyGetSetDef door_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject DoorType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "mpicomm.front._door.Door",
    .tp_basicsize = sizeof(Door),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A public call's front door, its numpy fast path in C (see mpicomm.front.door).",
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Door, vectorcall),
    .tp_dictoffset = offsetof(Door, dict),
    .tp_weaklistoffset = offsetof(Door, weakrefs),
    .tp_traverse = door_traverse,
    .tp_clear = door_clear,
    .tp_dealloc = door_dealloc,
    .tp_descr_get = door_get,
    .tp_repr = door_repr,
    .tp_getset = door_getset,
    .tp_methods = door_methods,
};

/* door(host, fallback, failed, site, live, threads, owner, state, exchanges, ndarray, kinds, plain,
 *      list_kind, names, defaults, missing, arrays, flag, group,
 *      exclusive, engine, groups, world, group_type, busy, raced, race, spoil[, fast]): a new Door;
 *      `owner`, `engine`, `exchanges` and `world` are the member descriptors of those slots of
 *      `threads`, `state` and `groups`; `fast`, None or absent for none, is the call's fast entry
 *      (fast_call), for a call of at most DOOR_MAX_PARAMS parameters. */
static PyObject *door_new(PyObject *module, PyObject *args) {
    Door tmp = {0};
    PyObject *arrays, *owner, *exchanges, *engine, *world;
    if (!PyArg_ParseTuple(args, "OOOOO!OOOOOO!O!OO!O!OO!nnpOOOOO!O!OO|O:door", &tmp.host, &tmp.fallback, &tmp.failed,
                          &tmp.site, &PyList_Type, &tmp.live, &tmp.threads, &owner, &tmp.state, &exchanges,
                          &tmp.ndarray, &PyDict_Type, &tmp.kinds, &PyFrozenSet_Type, &tmp.plain, &tmp.list_kind,
                          &PyTuple_Type, &tmp.names, &PyTuple_Type, &tmp.defaults, &tmp.missing, &PyTuple_Type,
                          &arrays, &tmp.flag, &tmp.group, &tmp.exclusive, &engine, &tmp.groups, &world,
                          &tmp.group_type, &PyDict_Type, &tmp.busy, &PyDict_Type, &tmp.raced, &tmp.race,
                          &tmp.spoil, &tmp.fast))
        return NULL;
    if (tmp.fast == Py_None) tmp.fast = NULL;
    Py_ssize_t n = PyTuple_GET_SIZE(tmp.names), na = PyTuple_GET_SIZE(arrays);
    if (PyTuple_GET_SIZE(tmp.defaults) != n || na > DOOR_MAX_ARRAYS || tmp.flag >= n || tmp.group >= n ||
        (tmp.fast != NULL && n > DOOR_MAX_PARAMS)) {
        PyErr_SetString(PyExc_ValueError, "door: defaults, arrays, flag, group or fast do not fit the names");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name = PyTuple_GET_ITEM(tmp.names, i);
        if (!PyUnicode_CheckExact(name)) {
            PyErr_SetString(PyExc_TypeError, "door: names must be str");
            return NULL;
        }
    }
    for (Py_ssize_t i = 0; i < na; i++) {
        Py_ssize_t p = PyLong_AsSsize_t(PyTuple_GET_ITEM(arrays, i));
        if (p == -1 && PyErr_Occurred()) return NULL;
        if (p < 0 || p >= n) {
            PyErr_SetString(PyExc_ValueError, "door: an array position outside the parameters");
            return NULL;
        }
        tmp.arrays[i] = p;
    }
    if ((tmp.owner_at = slot_offset(owner, tmp.threads)) < 0 || (tmp.exchanges_at = slot_offset(exchanges, tmp.state)) < 0 ||
        (tmp.engine_at = slot_offset(engine, tmp.threads)) < 0 || (tmp.world_at = slot_offset(world, tmp.groups)) < 0) {
        PyErr_SetString(PyExc_TypeError,
                        "door: owner, engine, exchanges and world must be object slots of threads, state and groups");
        return NULL;
    }
    Door *d = PyObject_GC_New(Door, &DoorType);
    if (d == NULL) return NULL;
    d->vectorcall = door_call;
    d->dict = NULL;
    d->weakrefs = NULL;
#define SET(f) d->f = Py_XNewRef(tmp.f);
    DOOR_OBJECTS(SET)
#undef SET
    memcpy(d->arrays, tmp.arrays, sizeof(d->arrays));
    d->n_arrays = (int)na;
    d->owner_at = tmp.owner_at;
    d->exchanges_at = tmp.exchanges_at;
    d->flag = tmp.flag;
    d->group = tmp.group;
    d->exclusive = tmp.exclusive;
    d->engine_at = tmp.engine_at;
    d->world_at = tmp.world_at;
    PyObject_GC_Track((PyObject *)d);
    return (PyObject *)d;
}

static PyMethodDef module_methods[] = {{"door", door_new, METH_VARARGS, NULL}, {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_door",
                                    "The front door's numpy fast path in C (see mpicomm.front.door).", -1,
                                    module_methods};

PyMODINIT_FUNC PyInit__door(void) {
    if (PyType_Ready(&DoorType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyModule_AddObjectRef(m, "Door", (PyObject *)&DoorType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
