/* mpicomm.core._cmpi, the list forms: lists of numpy arrays, one per rank, as the Python paths in
 * mpicomm.dense.small, .placed and .exchange take them, making the same MPI calls (see _cmpi.c). */
#include "_cmpi.h"


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
        if (PyList_GET_SIZE(obj) != size) { /* a warning hook run by the export may change the list */
            drop(l);
            return 0;
        }
        PyObject *x = Py_NewRef(PyList_GET_ITEM(obj, i));
        int got = Py_TYPE(x) == S.t_ndarray && PyObject_GetBuffer(x, &l->v[i], flags) == 0;
        Py_DECREF(x);
        if (!got) {
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

/* One reusable temporary for the copying paths: a fresh allocation of 64 KiB or more costs page
 * faults on every call. Taken while the GIL is held; a second taker (another thread, while the
 * first waits in MPI) gets memory of its own. */
static char *scratch = NULL;
static size_t scratch_size = 0;
static int scratch_busy = 0;
#define SCRATCH_MAX ((size_t)16 << 20)

static char *take(size_t n) {
    if (!scratch_busy && n <= SCRATCH_MAX) {
        if (n > scratch_size) {
            char *grown = PyMem_RawRealloc(scratch, n);
            if (grown == NULL) return NULL;
            scratch = grown;
            scratch_size = n;
        }
        scratch_busy = 1;
        return scratch;
    }
    return PyMem_RawMalloc(n);
}

static void give(char *p) {
    if (p == NULL) return;
    if (p == scratch)
        scratch_busy = 0;
    else
        PyMem_RawFree(p);
}

typedef struct {
    const char *start, *end;
    int write;
} Span;

static int by_start(const void *x, const void *y) {
    const char *a = ((const Span *)x)->start, *b = ((const Span *)y)->start; /* compared as integers */
    uintptr_t u = (uintptr_t)a, v = (uintptr_t)b;
    return (u > v) - (u < v);
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

/* The head both copying list forms share: the array `x` (written if `x_writes`) and the list `lst`
 * of the group size of arrays of x's kind and length (written if x is not), no written byte shared,
 * x at most `limit` bytes. Returns a temporary for the group size times x, or NULL with nothing
 * held in b or l (the call cannot be served). */
static char *one_and_list(Bufs *b, List *l, PyObject *x, PyObject *lst, int x_writes, Py_ssize_t limit, H comm,
                          int *size) {
    l->v = NULL;
    l->n = 0;
    if (!get_fmt(b, x, x_writes)) return NULL;
    Py_ssize_t n = elements(&b->v[0]), len = b->v[0].len;
    if (n < 0 || n > INT_MAX || len > limit || comm_size(comm, size) ||
        !get_list(l, lst, *size, &b->v[0], len, !x_writes)) {
        release(b);
        return NULL;
    }
    List *ls[] = {l};
    int lw[] = {!x_writes}, ow[] = {x_writes};
    Py_buffer *one[] = {&b->v[0]};
    char *tmp = spans_apart(ls, lw, 1, one, ow, 1) ? take((size_t)(len * *size + 1)) : NULL;
    if (tmp == NULL) {
        PyErr_Clear();
        drop(l);
        release(b);
    }
    return tmp;
}

/* allgather_list(x, outs, datatype, comm, limit): MPI_Allgather of x into a temporary, copied out
 * into the list outs of arrays of x's kind and length, when x is at most `limit` bytes. */
PyObject *cmpi_allgather_list(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(5);
    Bufs b = {.n = 0};
    List outs;
    H dt, comm;
    int size;
    Py_ssize_t limit = PyLong_AsSsize_t(a[4]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    if (!handle_of(a[2], S.t_datatype, &dt) || !handle_of(a[3], S.t_comm, &comm)) return cannot(&b);
    char *tmp = one_and_list(&b, &outs, a[0], a[1], 0, limit, comm, &size);
    if (tmp == NULL) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]), len = b.v[0].len;
    const void *s = b.v[0].buf;
    int ierr;
    /* MPI_Allgather says nothing of how much each rank sent: a slot that a short message (a rank
     * whose send and receive counts differ) left unwritten holds zeros, never an earlier call's bytes */
    memset(tmp, 0, (size_t)(len * size));
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(const void *, int, C##_T, void *, int, C##_T, C##_T))S.fn[F_ALLGATHER])( \
    s, (int)n, C(dt), tmp, (int)n, C(dt), C(comm))
    ierr = S.int_handles ? CALL(HI) : CALL(HP);
#undef CALL
    Py_END_ALLOW_THREADS;
    if (!ierr)
        for (int i = 0; i < size; i++) memcpy(outs.v[i].buf, tmp + (Py_ssize_t)i * len, (size_t)len);
    give(tmp);
    drop(&outs);
    return done(&b, ierr);
}

/* reduce_scatter_list(out, ins, datatype, op, comm, limit): the list ins (arrays of out's kind and
 * length) packed into a temporary and MPI_Reduce_scatter_block'ed into out, out at most `limit` bytes. */
PyObject *cmpi_reduce_scatter_list(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(6);
    Bufs b = {.n = 0};
    List ins;
    H dt, op, comm;
    int size;
    Py_ssize_t limit = PyLong_AsSsize_t(a[5]);
    if (limit == -1 && PyErr_Occurred()) return NULL;
    if (!handle_of(a[2], S.t_datatype, &dt) || !handle_of(a[3], S.t_op, &op) || !handle_of(a[4], S.t_comm, &comm))
        return cannot(&b);
    char *tmp = one_and_list(&b, &ins, a[0], a[1], 1, limit, comm, &size);
    if (tmp == NULL) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]), len = b.v[0].len;
    for (int i = 0; i < size; i++) memcpy(tmp + (Py_ssize_t)i * len, ins.v[i].buf, (size_t)len);
    drop(&ins);
    void *r = b.v[0].buf;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(const void *, void *, int, C##_T, C##_T, C##_T))S.fn[F_REDUCE_SCATTER_BLOCK])( \
    tmp, r, (int)n, C(dt), C(op), C(comm))
    ierr = S.int_handles ? CALL(HI) : CALL(HP);
#undef CALL
    Py_END_ALLOW_THREADS;
    give(tmp);
    return done(&b, ierr);
}

/* gather_list(x, outs, root, datatype, comm, limit): MPI_Gatherv of x, every rank making the Gatherv
 * the general path makes. On the root into the list outs (arrays of x's kind and length; None on
 * the other ranks): straight into the entries, with displacements measured from the lowest one
 * (mpicomm.dense.placed), where they are whole elements within int range; else, for entries of at
 * most `limit` bytes, into a temporary copied out. */
PyObject *cmpi_gather_list(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(6);
    Bufs b = {.n = 0};
    List outs = {NULL, 0};
    H dt, comm;
    int size, rank;
    int root = (int)PyLong_AsLong(a[2]);
    Py_ssize_t limit = PyLong_AsSsize_t(a[5]);
    if (PyErr_Occurred()) return NULL;
    if (!handle_of(a[3], S.t_datatype, &dt) || !handle_of(a[4], S.t_comm, &comm)) return cannot(&b);
    if (!get_fmt(&b, a[0], 0)) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]), len = b.v[0].len, item = b.v[0].itemsize;
    if (n < 0 || n > INT_MAX || comm_size(comm, &size) || comm_rank(comm, &rank)) return cannot(&b);
    if (root < 0 || root >= size) return cannot(&b);
    char *tmp = NULL, *into = NULL;
    int *counts = NULL, *displs = NULL;
    if (rank == root) {
        if (!get_list(&outs, a[1], size, &b.v[0], len, 1)) return cannot(&b);
        List *ls[] = {&outs};
        int lw[] = {1}, ow[] = {0};
        Py_buffer *one[] = {&b.v[0]};
        int ok = spans_apart(ls, lw, 1, one, ow, 1);
        counts = ok ? PyMem_Malloc(sizeof(int) * 2 * (size_t)(size > 0 ? size : 1)) : NULL;
        if (counts == NULL) {
            PyErr_Clear();
            drop(&outs);
            return cannot(&b);
        }
        displs = counts + size;
        char *low = outs.v[0].buf;
        for (int i = 1; i < size; i++)
            if ((char *)outs.v[i].buf < low) low = outs.v[i].buf;
        int placed = n > 0;
        for (int i = 0; placed && i < size; i++) {
            Py_ssize_t d = (char *)outs.v[i].buf - low;
            placed = d % item == 0 && d / item <= INT_MAX;
            counts[i] = (int)n;
            displs[i] = placed ? (int)(d / item) : 0;
        }
        if (placed) {
            into = low;
        } else if (len <= limit && (Py_ssize_t)n * size <= INT_MAX && (tmp = take((size_t)(len * size + 1)))) {
            into = tmp;
            memset(tmp, 0, (size_t)(len * size)); /* nothing of an earlier call where a rank sent short */
            for (int i = 0; i < size; i++) {
                counts[i] = (int)n;
                displs[i] = (int)n * i;
            }
        } else {
            PyErr_Clear();
            PyMem_Free(counts);
            drop(&outs);
            return cannot(&b);
        }
    } else if (a[1] != Py_None) {
        return cannot(&b);
    }
    const void *s = b.v[0].buf;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C)                                                                                          \
    ((int (*)(const void *, int, C##_T, void *, const int *, const int *, C##_T, int, C##_T))S.fn[F_GATHERV])( \
        s, (int)n, C(dt), into, counts, displs, C(dt), root, C(comm))
    ierr = S.int_handles ? CALL(HI) : CALL(HP);
#undef CALL
    Py_END_ALLOW_THREADS;
    if (!ierr && tmp != NULL)
        for (int i = 0; i < size; i++) memcpy(outs.v[i].buf, tmp + (Py_ssize_t)i * len, (size_t)len);
    give(tmp);
    PyMem_Free(counts);
    drop(&outs);
    return done(&b, ierr);
}

/* The error of a failed exchange: mpi4py's MPI.Exception of `ierr`, carrying what mpicomm needs to
 * say which message went wrong (mpicomm.core.statuses): `mpicomm_statuses`, the raw MPI_Status of
 * each request (NULL: none), `mpicomm_posted`, one (peer, is_receive, bytes expected) per request in
 * posting order, and where a receive was short, `mpicomm_short` = (peer, bytes, bytes expected). */
static PyObject *exchange_error(int ierr, const char *statuses, int count, List *recvs, List *sends, int rank,
                                PyObject *shortfall) {
    PyObject *posted = PyList_New(0), *raw = NULL, *type, *value, *tb;
    for (int k = 0; k < 2 && posted != NULL; k++) {
        List *l = k == 0 ? recvs : sends;
        for (int p = 0; p < l->n && posted != NULL; p++) {
            if (p == rank) continue;
            PyObject *t = Py_BuildValue("(iin)", p, k == 0, l->v[p].len);
            if (t == NULL || PyList_Append(posted, t) < 0) Py_CLEAR(posted);
            Py_XDECREF(t);
        }
    }
    if (statuses != NULL) raw = PyBytes_FromStringAndSize(statuses, (Py_ssize_t)count * S.status_size);
    mpi_error(ierr);
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL) {
        if (posted != NULL) PyObject_SetAttrString(value, "mpicomm_posted", posted);
        if (raw != NULL) PyObject_SetAttrString(value, "mpicomm_statuses", raw);
        if (shortfall != NULL) PyObject_SetAttrString(value, "mpicomm_short", shortfall);
        PyErr_Clear(); /* an attribute that could not be set leaves the plain MPI error */
    }
    Py_XDECREF(posted);
    Py_XDECREF(raw);
    Py_XDECREF(shortfall);
    PyErr_Restore(type, value, tb);
    return NULL;
}

/* The first receive of an exchange whose message was shorter than its buffer, as (peer, bytes,
 * bytes expected), or NULL: MPI takes a short message as complete, and the bytes it left unwritten
 * are not the caller's to see. */
static PyObject *short_receive(const char *statuses, List *recvs, int rank, H dt) {
    int k = 0;
    for (int p = 0; p < recvs->n; p++) {
        if (p == rank) continue;
        const void *st = statuses + (Py_ssize_t)k++ * S.status_size;
        int got = 0;
#define CALL(C) ((int (*)(const void *, C##_T, int *))S.fn[F_GET_COUNT])(st, C(dt), &got)
        int err = S.int_handles ? CALL(HI) : CALL(HP);
#undef CALL
        Py_ssize_t want = elements(&recvs->v[p]);
        if (err || got != want) {
            Py_ssize_t item = recvs->v[p].itemsize;
            return Py_BuildValue("(inn)", p, err || got < 0 ? (Py_ssize_t)-1 : (Py_ssize_t)got * item, want * item);
        }
    }
    return NULL;
}

/* exchange(recvs, sends, out, tag, datatype, comm): the pairwise exchange of
 * mpicomm.dense.exchange: for each peer p (not this rank), an MPI_Irecv into recvs[p] and an
 * MPI_Isend of sends[p] with `tag` over comm, this rank's own entry sends[rank] copied into
 * recvs[rank] (or into `out` where recvs is None: scatter's root), then MPI_Waitall. recvs (or
 * out) may be None; every array is of the first send's kind, and no written buffer may share
 * memory with another. */
PyObject *cmpi_exchange(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(6);
    Bufs b = {.n = 0};
    List recvs = {NULL, 0}, sends = {NULL, 0};
    H dt, comm;
    int size, rank;
    int tag = (int)PyLong_AsLong(a[3]);
    if (tag == -1 && PyErr_Occurred()) return NULL;
    if (!handle_of(a[4], S.t_datatype, &dt) || !handle_of(a[5], S.t_comm, &comm)) return cannot(&b);
    int rerr = comm_rank(comm, &rank);
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
    for (int i = 0; ok && i < recvs.n; i++) ok = elements(&recvs.v[i]) >= 0 && elements(&recvs.v[i]) <= INT_MAX;
    for (int i = 0; ok && i < sends.n; i++) ok = elements(&sends.v[i]) >= 0 && elements(&sends.v[i]) <= INT_MAX;
    Py_ssize_t width = S.int_handles ? (Py_ssize_t)sizeof(int) : (Py_ssize_t)sizeof(void *);
    char *requests = ok ? PyMem_Malloc((size_t)(2 * size * (width + S.status_size) + 1)) : NULL;
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
#define CALL(C) ((int (*)(void *, int, C##_T, int, int, C##_T, void *))S.fn[F_IRECV])( \
    v->buf, (int)elements(v), C(dt), p, tag, C(comm), req)
        ierr = S.int_handles ? CALL(HI) : CALL(HP);
#undef CALL
        if (!ierr) count++;
    }
    for (int p = 0; p < sends.n && !ierr; p++) {
        if (p == rank) continue;
        Py_buffer *v = &sends.v[p];
        void *req = requests + count * width;
#define CALL(C) ((int (*)(const void *, int, C##_T, int, int, C##_T, void *))S.fn[F_ISEND])( \
    v->buf, (int)elements(v), C(dt), p, tag, C(comm), req)
        ierr = S.int_handles ? CALL(HI) : CALL(HP);
#undef CALL
        if (!ierr) count++;
    }
    if (own != NULL && !ierr) memcpy(own->buf, sends.v[rank].buf, (size_t)own->len);
    int werr;
    Py_BEGIN_ALLOW_THREADS;
    werr = ((int (*)(int, void *, void *))S.fn[F_WAITALL])(count, requests, statuses);
    Py_END_ALLOW_THREADS;
    PyObject *shortfall = !ierr && !werr ? short_receive(statuses, &recvs, rank, dt) : NULL;
    if (werr || shortfall != NULL) {
        exchange_error(werr, werr ? statuses : NULL, count, &recvs, &sends, rank, shortfall);
        PyMem_Free(requests);
        drop(&recvs);
        drop(&sends);
        release(&b);
        return NULL;
    }
    PyMem_Free(requests);
    drop(&recvs);
    drop(&sends);
    return done(&b, ierr);
}
