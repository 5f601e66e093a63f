/* mpicomm.core._cmpi: the MPI calls of mpicomm's fast paths, made from C without mpi4py's
 * argument parsing.
 *
 * Why: an 8-byte MPI_Allreduce costs about 1 us on a node; mpi4py's parsing of the message
 * ([array, datatype], the op, the communicator) adds about 0.3 us on top, as much as mpicomm's
 * own checks. These functions take the mpi4py objects the fast paths already hold, read their
 * handles in place and call MPI directly, so a common call costs less than the raw mpi4py call.
 *
 * How, without MPI's headers: mpicomm.core.cmpi finds the MPI functions in the libmpi that
 * mpi4py loaded (dlsym through mpi4py's extension module), tells this module the handle width
 * (MPICH's ABI: int; Open MPI's and the MPI-5 standard ABI: pointers), MPI_IN_PLACE's value and
 * where mpi4py keeps the handle inside its objects, and checks one call of each kind before it
 * is used. Every function here returns None once MPI has done the call, raises mpi4py's
 * MPI.Exception when MPI returns an error, and returns NotImplemented, before any MPI call,
 * when it cannot serve the arguments (an object that is not a C-contiguous buffer, a read-only
 * output, sizes that do not fit, a count over INT_MAX): the caller then takes mpi4py's path,
 * whose errors are the ones users see. The GIL is released around every MPI call.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef intptr_t H; /* an MPI handle as this module carries it */

enum { F_ALLREDUCE, F_BCAST, F_ALLGATHER, F_REDUCE_SCATTER_BLOCK, F_ALLTOALL, F_ALLTOALLV,
       F_SEND, F_RECV, F_COMM_SIZE, F_GATHERV, F_COMM_RANK, F_ISEND, F_IRECV, F_WAITALL, F_COUNT };

static const char *const NAMES[F_COUNT] = {
    "MPI_Allreduce", "MPI_Bcast", "MPI_Allgather", "MPI_Reduce_scatter_block", "MPI_Alltoall",
    "MPI_Alltoallv", "MPI_Send", "MPI_Recv", "MPI_Comm_size", "MPI_Gatherv", "MPI_Comm_rank",
    "MPI_Isend", "MPI_Irecv", "MPI_Waitall"};

static void *fn[F_COUNT];
static int bound = 0;
static int int_handles = 1;     /* 1: handles are C ints; 0: pointers */
static void *in_place = NULL;   /* MPI_IN_PLACE */
static Py_ssize_t offset = 0;   /* where mpi4py keeps the handle inside its objects */
static Py_ssize_t status_size = 0; /* sizeof(MPI_Status) */
static PyTypeObject *t_comm = NULL, *t_datatype = NULL, *t_op = NULL, *t_ndarray = NULL;
static PyObject *exc_type = NULL; /* mpi4py's MPI.Exception */

/* A call through fn[i] with handles of either width: C(h) converts a handle, T its type. */
#define I_T int
#define I(h) ((int)(h))
#define P_T void *
#define P(h) ((void *)(h))

static int handle_of(PyObject *obj, PyTypeObject *type, H *out) {
    if (!PyObject_TypeCheck(obj, type)) return 0;
    char *at = (char *)obj + offset;
    *out = int_handles ? (H) * (int *)at : (H) * (void **)at;
    return 1;
}

static PyObject *mpi_error(int ierr) {
    PyObject *code = PyLong_FromLong(ierr);
    if (code != NULL) {
        PyErr_SetObject(exc_type, code);
        Py_DECREF(code);
    }
    return NULL;
}

/* The buffers of a call's array arguments; released together. */
typedef struct {
    Py_buffer v[6];
    int n;
} Bufs;

static int get(Bufs *b, PyObject *obj, int writable) {
    if (Py_TYPE(obj) != t_ndarray) return 0; /* numpy only: its buffers say their itemsize */
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &b->v[b->n], flags) < 0) {
        PyErr_Clear();
        return 0;
    }
    b->n++;
    return 1;
}

static void release(Bufs *b) {
    for (int i = 0; i < b->n; i++) PyBuffer_Release(&b->v[i]);
    b->n = 0;
}

static PyObject *cannot(Bufs *b) {
    release(b);
    Py_RETURN_NOTIMPLEMENTED;
}

static PyObject *done(Bufs *b, int ierr) {
    release(b);
    if (ierr) return mpi_error(ierr);
    Py_RETURN_NONE;
}

/* Whether two buffers share no byte (MPI forbids aliased send and receive buffers). */
static int apart(const Py_buffer *x, const Py_buffer *y) {
    const char *a = x->buf, *b = y->buf;
    return x->len == 0 || y->len == 0 || a + x->len <= b || b + y->len <= a;
}

static Py_ssize_t elements(const Py_buffer *v) { return v->itemsize > 0 ? v->len / v->itemsize : -1; }

static int comm_size(H comm, int *size) {
    return int_handles ? ((int (*)(I_T, int *))fn[F_COMM_SIZE])(I(comm), size)
                       : ((int (*)(P_T, int *))fn[F_COMM_SIZE])(P(comm), size);
}

#define ARGS(n)                                                                       \
    if (!bound || nargs != (n)) {                                                     \
        PyErr_SetString(PyExc_TypeError, "mpicomm.core._cmpi: unbound or wrong args"); \
        return NULL;                                                                  \
    }

/* allreduce(buf, datatype, op, comm): MPI_Allreduce(MPI_IN_PLACE, buf, ...). */
static PyObject *allreduce(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(4);
    Bufs b = {.n = 0};
    H dt, op, comm;
    if (!handle_of(a[1], t_datatype, &dt) || !handle_of(a[2], t_op, &op) || !handle_of(a[3], t_comm, &comm))
        return cannot(&b);
    if (!get(&b, a[0], 1)) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]);
    if (n < 0 || n > INT_MAX) return cannot(&b);
    void *buf = b.v[0].buf;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(const void *, void *, int, C##_T, C##_T, C##_T))fn[F_ALLREDUCE])( \
    in_place, buf, (int)n, C(dt), C(op), C(comm))
    ierr = int_handles ? CALL(I) : CALL(P);
#undef CALL
    Py_END_ALLOW_THREADS;
    return done(&b, ierr);
}

/* bcast(buf, datatype, root, comm): MPI_Bcast; buf is written on every rank but the root. */
static PyObject *bcast(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(4);
    Bufs b = {.n = 0};
    H dt, comm;
    int root = (int)PyLong_AsLong(a[2]);
    if (root == -1 && PyErr_Occurred()) return NULL;
    if (!handle_of(a[1], t_datatype, &dt) || !handle_of(a[3], t_comm, &comm)) return cannot(&b);
    if (!get(&b, a[0], 1)) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]);
    if (n < 0 || n > INT_MAX) return cannot(&b);
    void *buf = b.v[0].buf;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(void *, int, C##_T, int, C##_T))fn[F_BCAST])(buf, (int)n, C(dt), root, C(comm))
    ierr = int_handles ? CALL(I) : CALL(P);
#undef CALL
    Py_END_ALLOW_THREADS;
    return done(&b, ierr);
}

/* allgather(send, recv, datatype, comm): recv holds the group size times send's elements. */
static PyObject *allgather(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(4);
    Bufs b = {.n = 0};
    H dt, comm;
    int size;
    if (!handle_of(a[2], t_datatype, &dt) || !handle_of(a[3], t_comm, &comm)) return cannot(&b);
    if (!get(&b, a[0], 0) || !get(&b, a[1], 1)) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]);
    if (n < 0 || n > INT_MAX || b.v[0].itemsize != b.v[1].itemsize || !apart(&b.v[0], &b.v[1]))
        return cannot(&b);
    if (comm_size(comm, &size) || elements(&b.v[1]) != n * size) return cannot(&b);
    void *s = b.v[0].buf, *r = b.v[1].buf;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(const void *, int, C##_T, void *, int, C##_T, C##_T))fn[F_ALLGATHER])( \
    s, (int)n, C(dt), r, (int)n, C(dt), C(comm))
    ierr = int_handles ? CALL(I) : CALL(P);
#undef CALL
    Py_END_ALLOW_THREADS;
    return done(&b, ierr);
}

/* reduce_scatter_block(send, recv, datatype, op, comm): send holds the group size times recv's elements. */
static PyObject *reduce_scatter_block(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(5);
    Bufs b = {.n = 0};
    H dt, op, comm;
    int size;
    if (!handle_of(a[2], t_datatype, &dt) || !handle_of(a[3], t_op, &op) || !handle_of(a[4], t_comm, &comm))
        return cannot(&b);
    if (!get(&b, a[0], 0) || !get(&b, a[1], 1)) return cannot(&b);
    Py_ssize_t n = elements(&b.v[1]);
    if (n < 0 || n > INT_MAX || b.v[0].itemsize != b.v[1].itemsize || !apart(&b.v[0], &b.v[1]))
        return cannot(&b);
    if (comm_size(comm, &size) || elements(&b.v[0]) != n * size) return cannot(&b);
    void *s = b.v[0].buf, *r = b.v[1].buf;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(const void *, void *, int, C##_T, C##_T, C##_T))fn[F_REDUCE_SCATTER_BLOCK])( \
    s, r, (int)n, C(dt), C(op), C(comm))
    ierr = int_handles ? CALL(I) : CALL(P);
#undef CALL
    Py_END_ALLOW_THREADS;
    return done(&b, ierr);
}

/* alltoall(send, recv, datatype, comm): equal pieces, send and recv of one size. */
static PyObject *alltoall(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(4);
    Bufs b = {.n = 0};
    H dt, comm;
    int size;
    if (!handle_of(a[2], t_datatype, &dt) || !handle_of(a[3], t_comm, &comm)) return cannot(&b);
    if (!get(&b, a[0], 0) || !get(&b, a[1], 1)) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]);
    if (n < 0 || b.v[0].len != b.v[1].len || b.v[0].itemsize != b.v[1].itemsize || !apart(&b.v[0], &b.v[1]))
        return cannot(&b);
    if (comm_size(comm, &size) || size <= 0 || n % size || n / size > INT_MAX) return cannot(&b);
    int count = (int)(n / size);
    void *s = b.v[0].buf, *r = b.v[1].buf;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(const void *, int, C##_T, void *, int, C##_T, C##_T))fn[F_ALLTOALL])( \
    s, count, C(dt), r, count, C(dt), C(comm))
    ierr = int_handles ? CALL(I) : CALL(P);
#undef CALL
    Py_END_ALLOW_THREADS;
    return done(&b, ierr);
}

/* Whether counts/displacements (int32 arrays of the group size) stay inside a buffer of n elements. */
static int inside(const Py_buffer *counts, const Py_buffer *displs, int size, Py_ssize_t n) {
    if (counts->len != (Py_ssize_t)sizeof(int) * size || displs->len != (Py_ssize_t)sizeof(int) * size ||
        counts->itemsize != (Py_ssize_t)sizeof(int) || displs->itemsize != (Py_ssize_t)sizeof(int))
        return 0;
    const int *c = counts->buf, *d = displs->buf;
    for (int i = 0; i < size; i++)
        if (c[i] < 0 || d[i] < 0 || (Py_ssize_t)d[i] + c[i] > n) return 0;
    return 1;
}

/* alltoallv(send, scounts, sdispls, recv, rcounts, rdispls, datatype, comm); counts are int32 arrays. */
static PyObject *alltoallv(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(8);
    Bufs b = {.n = 0};
    H dt, comm;
    int size;
    if (!handle_of(a[6], t_datatype, &dt) || !handle_of(a[7], t_comm, &comm)) return cannot(&b);
    if (!get(&b, a[0], 0) || !get(&b, a[1], 0) || !get(&b, a[2], 0) || !get(&b, a[3], 1) ||
        !get(&b, a[4], 0) || !get(&b, a[5], 0))
        return cannot(&b);
    if (b.v[0].itemsize != b.v[3].itemsize || !apart(&b.v[0], &b.v[3]) || comm_size(comm, &size) ||
        !inside(&b.v[1], &b.v[2], size, elements(&b.v[0])) || !inside(&b.v[4], &b.v[5], size, elements(&b.v[3])))
        return cannot(&b);
    const void *s = b.v[0].buf;
    void *r = b.v[3].buf;
    const int *sc = b.v[1].buf, *sd = b.v[2].buf, *rc = b.v[4].buf, *rd = b.v[5].buf;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C)                                                                                      \
    ((int (*)(const void *, const int *, const int *, C##_T, void *, const int *, const int *, C##_T, \
              C##_T))fn[F_ALLTOALLV])(s, sc, sd, C(dt), r, rc, rd, C(dt), C(comm))
    ierr = int_handles ? CALL(I) : CALL(P);
#undef CALL
    Py_END_ALLOW_THREADS;
    return done(&b, ierr);
}

/* send(buf, datatype, dest, tag, comm) */
static PyObject *send(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(5);
    Bufs b = {.n = 0};
    H dt, comm;
    int dest = (int)PyLong_AsLong(a[2]), tag = (int)PyLong_AsLong(a[3]);
    if (PyErr_Occurred()) return NULL;
    if (!handle_of(a[1], t_datatype, &dt) || !handle_of(a[4], t_comm, &comm)) return cannot(&b);
    if (!get(&b, a[0], 0)) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]);
    if (n < 0 || n > INT_MAX) return cannot(&b);
    void *buf = b.v[0].buf;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(const void *, int, C##_T, int, int, C##_T))fn[F_SEND])( \
    buf, (int)n, C(dt), dest, tag, C(comm))
    ierr = int_handles ? CALL(I) : CALL(P);
#undef CALL
    Py_END_ALLOW_THREADS;
    return done(&b, ierr);
}

/* recv(buf, datatype, source, tag, comm): a message longer than buf is MPI's truncation error. */
static PyObject *recv(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(5);
    Bufs b = {.n = 0};
    H dt, comm;
    int source = (int)PyLong_AsLong(a[2]), tag = (int)PyLong_AsLong(a[3]);
    if (PyErr_Occurred()) return NULL;
    if (!handle_of(a[1], t_datatype, &dt) || !handle_of(a[4], t_comm, &comm)) return cannot(&b);
    if (!get(&b, a[0], 1)) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]);
    if (n < 0 || n > INT_MAX) return cannot(&b);
    void *buf = b.v[0].buf;
    /* MPI_Status is at most a few dozen bytes in every ABI; 256 aligned bytes hold any of them. */
    union { char bytes[256]; long double align; } status;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(void *, int, C##_T, int, int, C##_T, void *))fn[F_RECV])( \
    buf, (int)n, C(dt), source, tag, C(comm), &status)
    ierr = int_handles ? CALL(I) : CALL(P);
#undef CALL
    Py_END_ALLOW_THREADS;
    return done(&b, ierr);
}


/* ---- the list forms: lists of numpy arrays, one per rank ---------------------------------- */

/* The buffers of a list of `size` arrays (or of one array repeated), with their formats. */
typedef struct {
    Py_buffer *v;
    int n;
} List;

static void drop(List *l) {
    for (int i = 0; i < l->n; i++) PyBuffer_Release(&l->v[i]);
    PyMem_Free(l->v);
    l->v = NULL;
    l->n = 0;
}

static int same_kind(const Py_buffer *x, const Py_buffer *y) {
    const char *f = x->format ? x->format : "B", *g = y->format ? y->format : "B";
    return x->itemsize == y->itemsize && strcmp(f, g) == 0;
}

/* Fill l with the buffers of list `obj` of `size` C-contiguous numpy arrays of `like`'s kind and
 * length (`len` bytes; -1: any length). 0 where anything differs (nothing is left held then). */
static int get_list(List *l, PyObject *obj, int size, const Py_buffer *like, Py_ssize_t len, int writable) {
    l->v = NULL;
    l->n = 0;
    if (!PyList_CheckExact(obj) || PyList_GET_SIZE(obj) != size) return 0;
    l->v = PyMem_Calloc(size > 0 ? size : 1, sizeof(Py_buffer));
    if (l->v == NULL) {
        PyErr_Clear();
        return 0;
    }
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    for (int i = 0; i < size; i++) {
        PyObject *x = PyList_GET_ITEM(obj, i);
        if (Py_TYPE(x) != t_ndarray || PyObject_GetBuffer(x, &l->v[i], flags) < 0) {
            PyErr_Clear();
            drop(l);
            return 0;
        }
        l->n++;
        if (!same_kind(&l->v[i], like) || (len >= 0 && l->v[i].len != len)) {
            drop(l);
            return 0;
        }
    }
    return 1;
}

typedef struct {
    const char *start, *end;
    int write;
} Span;

static int by_start(const void *x, const void *y) {
    const char *a = ((const Span *)x)->start, *b = ((const Span *)y)->start;
    return (a > b) - (a < b);
}

/* Whether no written span shares a byte with any other span (reads may share with reads). */
static int disjoint(Span *s, int n) {
    qsort(s, (size_t)n, sizeof(Span), by_start);
    const char *end_any = NULL, *end_write = NULL;
    for (int i = 0; i < n; i++) {
        if (s[i].start == s[i].end) continue;
        if (end_any != NULL && s[i].start < (s[i].write ? end_any : (end_write ? end_write : s[i].start)))
            return 0;
        if (end_any == NULL || s[i].end > end_any) end_any = s[i].end;
        if (s[i].write && (end_write == NULL || s[i].end > end_write)) end_write = s[i].end;
    }
    return 1;
}

/* Whether the lists' and the single buffers' spans are disjoint where written. */
static int spans_apart(List *lists[], const int *lwrite, int nl, Py_buffer *one[], const int *owrite, int no) {
    int n = no;
    for (int i = 0; i < nl; i++) n += lists[i]->n;
    Span *s = PyMem_Malloc(sizeof(Span) * (size_t)(n > 0 ? n : 1));
    if (s == NULL) {
        PyErr_Clear();
        return 0;
    }
    int k = 0;
    for (int i = 0; i < nl; i++)
        for (int j = 0; j < lists[i]->n; j++) {
            Py_buffer *v = &lists[i]->v[j];
            s[k++] = (Span){v->buf, (const char *)v->buf + v->len, lwrite[i]};
        }
    for (int i = 0; i < no; i++) s[k++] = (Span){one[i]->buf, (const char *)one[i]->buf + one[i]->len, owrite[i]};
    int ok = disjoint(s, n);
    PyMem_Free(s);
    return ok;
}

static int get_fmt(Bufs *b, PyObject *obj, int writable) {
    if (Py_TYPE(obj) != t_ndarray) return 0;
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &b->v[b->n], flags) < 0) {
        PyErr_Clear();
        return 0;
    }
    b->n++;
    return 1;
}

/* allgather_list(x, outs, datatype, comm, limit): MPI_Allgather of x into a temporary, copied out
 * into the list outs of arrays of x's kind and length, when x is at most `limit` bytes. */
static PyObject *allgather_list(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(5);
    Bufs b = {.n = 0};
    List outs;
    H dt, comm;
    int size;
    Py_ssize_t limit = PyLong_AsSsize_t(a[4]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    if (!handle_of(a[2], t_datatype, &dt) || !handle_of(a[3], t_comm, &comm)) return cannot(&b);
    if (!get_fmt(&b, a[0], 0)) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]), len = b.v[0].len;
    if (n < 0 || n > INT_MAX || len > limit || comm_size(comm, &size)) return cannot(&b);
    if (!get_list(&outs, a[1], size, &b.v[0], len, 1)) return cannot(&b);
    List *ls[] = {&outs};
    int lw[] = {1}, ow[] = {0};
    Py_buffer *one[] = {&b.v[0]};
    char *tmp = spans_apart(ls, lw, 1, one, ow, 1) ? PyMem_Malloc((size_t)(len * size + 1)) : NULL;
    if (tmp == NULL) {
        PyErr_Clear();
        drop(&outs);
        return cannot(&b);
    }
    const void *s = b.v[0].buf;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(const void *, int, C##_T, void *, int, C##_T, C##_T))fn[F_ALLGATHER])( \
    s, (int)n, C(dt), tmp, (int)n, C(dt), C(comm))
    ierr = int_handles ? CALL(I) : CALL(P);
#undef CALL
    Py_END_ALLOW_THREADS;
    if (!ierr)
        for (int i = 0; i < size; i++) memcpy(outs.v[i].buf, tmp + (Py_ssize_t)i * len, (size_t)len);
    PyMem_Free(tmp);
    drop(&outs);
    return done(&b, ierr);
}

/* reduce_scatter_list(out, ins, datatype, op, comm, limit): the list ins (arrays of out's kind and
 * length) packed into a temporary and MPI_Reduce_scatter_block'ed into out, out at most `limit` bytes. */
static PyObject *reduce_scatter_list(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(6);
    Bufs b = {.n = 0};
    List ins;
    H dt, op, comm;
    int size;
    Py_ssize_t limit = PyLong_AsSsize_t(a[5]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    if (!handle_of(a[2], t_datatype, &dt) || !handle_of(a[3], t_op, &op) || !handle_of(a[4], t_comm, &comm))
        return cannot(&b);
    if (!get_fmt(&b, a[0], 1)) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]), len = b.v[0].len;
    if (n < 0 || n > INT_MAX || len > limit || comm_size(comm, &size)) return cannot(&b);
    if (!get_list(&ins, a[1], size, &b.v[0], len, 0)) return cannot(&b);
    List *ls[] = {&ins};
    int lw[] = {0}, ow[] = {1};
    Py_buffer *one[] = {&b.v[0]};
    char *tmp = spans_apart(ls, lw, 1, one, ow, 1) ? PyMem_Malloc((size_t)(len * size + 1)) : NULL;
    if (tmp == NULL) {
        PyErr_Clear();
        drop(&ins);
        return cannot(&b);
    }
    for (int i = 0; i < size; i++) memcpy(tmp + (Py_ssize_t)i * len, ins.v[i].buf, (size_t)len);
    drop(&ins);
    void *r = b.v[0].buf;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(const void *, void *, int, C##_T, C##_T, C##_T))fn[F_REDUCE_SCATTER_BLOCK])( \
    tmp, r, (int)n, C(dt), C(op), C(comm))
    ierr = int_handles ? CALL(I) : CALL(P);
#undef CALL
    Py_END_ALLOW_THREADS;
    PyMem_Free(tmp);
    return done(&b, ierr);
}

/* gather_list(x, outs, root, datatype, comm, limit): MPI_Gatherv of x; on the root into a temporary
 * copied out into the list outs (arrays of x's kind and length; None on the other ranks), when x
 * is at most `limit` bytes. Every rank makes the Gatherv the general path makes. */
static PyObject *gather_list(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(6);
    Bufs b = {.n = 0};
    List outs = {NULL, 0};
    H dt, comm;
    int size, rank;
    int root = (int)PyLong_AsLong(a[2]);
    Py_ssize_t limit = PyLong_AsSsize_t(a[5]);
    if (PyErr_Occurred()) return NULL;
    if (!handle_of(a[3], t_datatype, &dt) || !handle_of(a[4], t_comm, &comm)) return cannot(&b);
    if (!get_fmt(&b, a[0], 0)) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]), len = b.v[0].len;
    if (n < 0 || n > INT_MAX || len > limit || comm_size(comm, &size)) return cannot(&b);
    int rerr = int_handles ? ((int (*)(I_T, int *))fn[F_COMM_RANK])(I(comm), &rank)
                           : ((int (*)(P_T, int *))fn[F_COMM_RANK])(P(comm), &rank);
    if (rerr || root < 0 || root >= size || (Py_ssize_t)n * size > INT_MAX) return cannot(&b);
    char *tmp = NULL;
    int *counts = NULL, *displs = NULL;
    if (rank == root) {
        if (!get_list(&outs, a[1], size, &b.v[0], len, 1)) return cannot(&b);
        List *ls[] = {&outs};
        int lw[] = {1}, ow[] = {0};
        Py_buffer *one[] = {&b.v[0]};
        if (spans_apart(ls, lw, 1, one, ow, 1)) {
            tmp = PyMem_Malloc((size_t)(len * size + 1));
            counts = PyMem_Malloc(sizeof(int) * 2 * (size_t)size);
        }
        if (tmp == NULL || counts == NULL) {
            PyErr_Clear();
            PyMem_Free(tmp);
            PyMem_Free(counts);
            drop(&outs);
            return cannot(&b);
        }
        displs = counts + size;
        for (int i = 0; i < size; i++) {
            counts[i] = (int)n;
            displs[i] = (int)n * i;
        }
    } else if (a[1] != Py_None) {
        return cannot(&b);
    }
    const void *s = b.v[0].buf;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C)                                                                                          \
    ((int (*)(const void *, int, C##_T, void *, const int *, const int *, C##_T, int, C##_T))fn[F_GATHERV])( \
        s, (int)n, C(dt), tmp, counts, displs, C(dt), root, C(comm))
    ierr = int_handles ? CALL(I) : CALL(P);
#undef CALL
    Py_END_ALLOW_THREADS;
    if (!ierr && tmp != NULL)
        for (int i = 0; i < size; i++) memcpy(outs.v[i].buf, tmp + (Py_ssize_t)i * len, (size_t)len);
    PyMem_Free(tmp);
    PyMem_Free(counts);
    drop(&outs);
    return done(&b, ierr);
}

/* exchange(recvs, sends, out, tag, datatype, comm): the pairwise exchange of
 * mpicomm.dense.exchange: for each peer p (not this rank), an MPI_Irecv into recvs[p] and an
 * MPI_Isend of sends[p] with `tag` over comm, this rank's own entry sends[rank] copied into
 * recvs[rank] (or into `out` where recvs is None: scatter's root), then MPI_Waitall. recvs (or
 * out) may be None; every array is of the first send's kind, and no written buffer may share
 * memory with another. */
static PyObject *exchange(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(6);
    Bufs b = {.n = 0};
    List recvs = {NULL, 0}, sends = {NULL, 0};
    H dt, comm;
    int size, rank;
    int tag = (int)PyLong_AsLong(a[3]);
    if (tag == -1 && PyErr_Occurred()) return NULL;
    if (!handle_of(a[4], t_datatype, &dt) || !handle_of(a[5], t_comm, &comm)) return cannot(&b);
    int rerr = int_handles ? ((int (*)(I_T, int *))fn[F_COMM_RANK])(I(comm), &rank)
                           : ((int (*)(P_T, int *))fn[F_COMM_RANK])(P(comm), &rank);
    if (rerr || comm_size(comm, &size) || size <= 0 || !PyList_CheckExact(a[1]) || PyList_GET_SIZE(a[1]) != size)
        return cannot(&b);
    if (!get_fmt(&b, PyList_GET_ITEM(a[1], 0), 0)) return cannot(&b); /* the kind every array must have */
    if (!get_list(&sends, a[1], size, &b.v[0], -1, 0)) return cannot(&b);
    Py_buffer *own = NULL;
    if (a[0] != Py_None) {
        if (a[2] != Py_None || !get_list(&recvs, a[0], size, &b.v[0], -1, 1)) {
            drop(&sends);
            return cannot(&b);
        }
        own = &recvs.v[rank];
    } else if (a[2] != Py_None) {
        if (!get_fmt(&b, a[2], 1) || !same_kind(&b.v[1], &b.v[0])) {
            drop(&sends);
            return cannot(&b);
        }
        own = &b.v[1];
    }
    List *ls[] = {&recvs, &sends};
    int lw[] = {1, 0}, ow[] = {1};
    Py_buffer *one[] = {own};
    int ok = spans_apart(ls, lw, 2, one, ow, own != NULL && a[0] == Py_None ? 1 : 0);
    ok = ok && (own == NULL || own->len == sends.v[rank].len);
    for (int i = 0; ok && i < recvs.n; i++) ok = elements(&recvs.v[i]) <= INT_MAX;
    for (int i = 0; ok && i < sends.n; i++) ok = elements(&sends.v[i]) <= INT_MAX;
    Py_ssize_t width = int_handles ? (Py_ssize_t)sizeof(int) : (Py_ssize_t)sizeof(void *);
    char *requests = ok ? PyMem_Malloc((size_t)(2 * size * (width + status_size) + 1)) : NULL;
    if (requests == NULL) {
        PyErr_Clear();
        drop(&recvs);
        drop(&sends);
        return cannot(&b);
    }
    char *statuses = requests + 2 * size * width;
    int count = 0, ierr = 0;
    for (int p = 0; p < recvs.n && !ierr; p++) {
        if (p == rank) continue;
        Py_buffer *v = &recvs.v[p];
        void *req = requests + count * width;
#define CALL(C) ((int (*)(void *, int, C##_T, int, int, C##_T, void *))fn[F_IRECV])( \
    v->buf, (int)elements(v), C(dt), p, tag, C(comm), req)
        ierr = int_handles ? CALL(I) : CALL(P);
#undef CALL
        if (!ierr) count++;
    }
    for (int p = 0; p < sends.n && !ierr; p++) {
        if (p == rank) continue;
        Py_buffer *v = &sends.v[p];
        void *req = requests + count * width;
#define CALL(C) ((int (*)(const void *, int, C##_T, int, int, C##_T, void *))fn[F_ISEND])( \
    v->buf, (int)elements(v), C(dt), p, tag, C(comm), req)
        ierr = int_handles ? CALL(I) : CALL(P);
#undef CALL
        if (!ierr) count++;
    }
    if (own != NULL && !ierr) memcpy(own->buf, sends.v[rank].buf, (size_t)own->len);
    int werr;
    Py_BEGIN_ALLOW_THREADS;
    werr = ((int (*)(int, void *, void *))fn[F_WAITALL])(count, requests, statuses);
    Py_END_ALLOW_THREADS;
    PyMem_Free(requests);
    drop(&recvs);
    drop(&sends);
    return done(&b, ierr ? ierr : werr);
}

/* handle(obj): the handle read where this module reads it (to check the binding against .handle). */
static PyObject *handle(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(1);
    H h;
    if (!handle_of(a[0], t_comm, &h) && !handle_of(a[0], t_datatype, &h) && !handle_of(a[0], t_op, &h))
        Py_RETURN_NONE;
    return PyLong_FromSsize_t((Py_ssize_t)h);
}

/* bind(addresses, int_handles, in_place, offset, Comm, Datatype, Op, ndarray, Exception, status_size) */
static PyObject *bind(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (nargs != 10 || !PyTuple_Check(a[0]) || PyTuple_GET_SIZE(a[0]) != F_COUNT) {
        PyErr_SetString(PyExc_TypeError, "mpicomm.core._cmpi.bind: wrong arguments");
        return NULL;
    }
    void *f[F_COUNT];
    for (int i = 0; i < F_COUNT; i++) {
        f[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(a[0], i));
        if (f[i] == NULL) {
            if (!PyErr_Occurred())
                PyErr_Format(PyExc_ValueError, "mpicomm.core._cmpi.bind: no address for %s", NAMES[i]);
            return NULL;
        }
    }
    int ih = PyObject_IsTrue(a[1]);
    void *ip = PyLong_AsVoidPtr(a[2]);
    Py_ssize_t off = PyLong_AsSsize_t(a[3]), ss = PyLong_AsSsize_t(a[9]);
    if (ih < 0 || PyErr_Occurred()) return NULL;
    if (ss <= 0 || ss > 1024) {
        PyErr_SetString(PyExc_ValueError, "mpicomm.core._cmpi.bind: implausible MPI_Status size");
        return NULL;
    }
    for (int i = 4; i <= 7; i++)
        if (!PyType_Check(a[i])) {
            PyErr_SetString(PyExc_TypeError, "mpicomm.core._cmpi.bind: expected types");
            return NULL;
        }
    memcpy(fn, f, sizeof(fn));
    int_handles = ih;
    in_place = ip;
    offset = off;
    status_size = ss;
    Py_XSETREF(t_comm, (PyTypeObject *)Py_NewRef(a[4]));
    Py_XSETREF(t_datatype, (PyTypeObject *)Py_NewRef(a[5]));
    Py_XSETREF(t_op, (PyTypeObject *)Py_NewRef(a[6]));
    Py_XSETREF(t_ndarray, (PyTypeObject *)Py_NewRef(a[7]));
    Py_XSETREF(exc_type, Py_NewRef(a[8]));
    bound = 1;
    Py_RETURN_NONE;
}

static PyObject *names(PyObject *self, PyObject *unused) {
    PyObject *t = PyTuple_New(F_COUNT);
    if (t == NULL) return NULL;
    for (int i = 0; i < F_COUNT; i++) {
        PyObject *s = PyUnicode_FromString(NAMES[i]);
        if (s == NULL) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

#define FAST(name) {#name, (PyCFunction)(void (*)(void))name, METH_FASTCALL, NULL}
static PyMethodDef methods[] = {
    FAST(bind), FAST(handle), FAST(allreduce), FAST(bcast), FAST(allgather), FAST(reduce_scatter_block),
    FAST(alltoall), FAST(alltoallv), FAST(send), FAST(recv), FAST(allgather_list), FAST(reduce_scatter_list),
    FAST(gather_list), FAST(exchange),
    {"names", names, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cmpi",
                                    "MPI calls for mpicomm's fast paths (see mpicomm.core.cmpi).", -1, methods};

PyMODINIT_FUNC PyInit__cmpi(void) { return PyModule_Create(&module); }
