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
#include "_cmpi.h"

static const char *const NAMES[F_COUNT] = {
    "MPI_Allreduce", "MPI_Bcast", "MPI_Allgather", "MPI_Reduce_scatter_block", "MPI_Alltoall",
    "MPI_Alltoallv", "MPI_Send", "MPI_Recv", "MPI_Comm_size", "MPI_Gatherv", "MPI_Comm_rank",
    "MPI_Isend", "MPI_Irecv", "MPI_Waitall", "MPI_Reduce", "MPI_Get_count", "MPI_Sendrecv"};

HIDDEN CmpiState cmpi_state = {.int_handles = 1};

/* MPICH's algorithm for large intra-node allreduce and bcast (see mpicomm.core.algorithms). Below
 * MPI_THREAD_MULTIPLE MPICH picks its shared-memory "release_gather" algorithm, 2-5x slower than
 * its point-to-point one from about 32 KiB on (and faster below). For a message of at least
 * `from` bytes, while the selection variable holds its default, the call writes the point-to-point
 * value through MPI's tool interface and the default back after it. Only one thread is inside MPI
 * below multiple, and every rank of a collective has the same message size, so all ranks choose
 * alike. */
typedef int (*cvar_rw)(void *handle, void *value);
static struct {
    cvar_rw read, write;
    void *handle[2];   /* ALGO_ALLREDUCE, ALGO_BCAST; NULL: never switched */
    int dflt[2], fast[2];
    Py_ssize_t from;
    unsigned long long switched[2];
} A;
enum { ALGO_ALLREDUCE, ALGO_BCAST };

/* Called with the GIL released, right before the MPI call: whether it switched. */
static inline int algo_enter(int which, Py_ssize_t len) {
    int cur;
    if (A.handle[which] == NULL || len < A.from) return 0;
    if (A.read(A.handle[which], &cur) != 0 || cur != A.dflt[which]) return 0; /* someone else's choice */
    if (A.write(A.handle[which], &A.fast[which]) != 0) return 0;
    A.switched[which]++;
    return 1;
}

static inline void algo_leave(int which, int on) {
    if (on) A.write(A.handle[which], &A.dflt[which]);
}

/* switch_algorithm(which, read, write, handle, default, fast, from): install (handle 0: remove) the
 * switch of one call; from is shared by both. */
static PyObject *switch_algorithm(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "mpicomm.core._cmpi.switch_algorithm: 7 arguments");
        return NULL;
    }
    long which = PyLong_AsLong(a[0]);
    void *rd = PyLong_AsVoidPtr(a[1]), *wr = PyLong_AsVoidPtr(a[2]), *h = PyLong_AsVoidPtr(a[3]);
    int dflt = (int)PyLong_AsLong(a[4]), fast = (int)PyLong_AsLong(a[5]);
    Py_ssize_t from = PyLong_AsSsize_t(a[6]);
    if (PyErr_Occurred()) return NULL;
    if (which != ALGO_ALLREDUCE && which != ALGO_BCAST) {
        PyErr_SetString(PyExc_ValueError, "mpicomm.core._cmpi.switch_algorithm: which is 0 or 1");
        return NULL;
    }
    if (h != NULL && (rd == NULL || wr == NULL || from < 1)) {
        PyErr_SetString(PyExc_ValueError, "mpicomm.core._cmpi.switch_algorithm: no read/write or from < 1");
        return NULL;
    }
    A.handle[which] = NULL;
    A.read = (cvar_rw)rd;
    A.write = (cvar_rw)wr;
    A.dflt[which] = dflt;
    A.fast[which] = fast;
    A.from = from;
    A.handle[which] = h;
    Py_RETURN_NONE;
}

/* algorithm_enter(which, nbytes) -> bool and algorithm_leave(which, on): the same switch around an
 * MPI call made elsewhere (mpi4py's, a device buffer's), so that every path of a large call picks
 * the algorithm the C calls pick. */
static PyObject *algorithm_enter(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "mpicomm.core._cmpi.algorithm_enter: 2 arguments");
        return NULL;
    }
    long which = PyLong_AsLong(a[0]);
    Py_ssize_t len = PyLong_AsSsize_t(a[1]);
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong((which == ALGO_ALLREDUCE || which == ALGO_BCAST) && algo_enter((int)which, len));
}

static PyObject *algorithm_leave(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "mpicomm.core._cmpi.algorithm_leave: 2 arguments");
        return NULL;
    }
    long which = PyLong_AsLong(a[0]);
    int on = PyObject_IsTrue(a[1]);
    if (PyErr_Occurred() || on < 0) return NULL;
    if (which == ALGO_ALLREDUCE || which == ALGO_BCAST) algo_leave((int)which, on);
    Py_RETURN_NONE;
}

/* algorithm_switches(): how many allreduce and bcast calls ran with the point-to-point algorithm. */
static PyObject *algorithm_switches(PyObject *self, PyObject *unused) {
    return Py_BuildValue("(KK)", A.switched[ALGO_ALLREDUCE], A.switched[ALGO_BCAST]);
}

/* The largest allreduce message in bytes; a larger buffer goes in equal pieces, one call each
 * (mpicomm.core.pieces: MPI reduces into a temporary as large as the message, and glibc maps one
 * of 32 MiB or more afresh on every call). 0: one call. Set alike on every rank. */
static Py_ssize_t piece_bytes;
static unsigned long long pieces_made; /* MPI_Allreduce calls made by allreduce calls cut in pieces */

/* set_piece(nbytes): the piece size of allreduce (mpicomm.core.pieces passes a checked size). */
static PyObject *set_piece(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    Py_ssize_t v = nargs == 1 ? PyLong_AsSsize_t(a[0]) : -1;
    if (PyErr_Occurred()) return NULL;
    if (v < 0) return PyErr_Format(PyExc_ValueError, "mpicomm.core._cmpi.set_piece(nbytes >= 0)");
    piece_bytes = v;
    Py_RETURN_NONE;
}

/* allreduce_pieces(): how many MPI_Allreduce calls allreduce made for buffers cut in pieces. */
static PyObject *allreduce_pieces(PyObject *self, PyObject *unused) { return PyLong_FromUnsignedLongLong(pieces_made); }

/* allreduce(buf, datatype, op, comm): MPI_Allreduce(MPI_IN_PLACE, buf, ...), in pieces of at most
 * piece_bytes (equal, as mpicomm.core.pieces.per_call cuts them for the mpi4py path). */
static PyObject *allreduce(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(4);
    Bufs b = {.n = 0};
    H dt, op, comm;
    if (!handle_of(a[1], S.t_datatype, &dt) || !handle_of(a[2], S.t_op, &op) || !handle_of(a[3], S.t_comm, &comm))
        return cannot(&b);
    if (!get(&b, a[0], 1)) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]);
    if (n < 0) return cannot(&b);
    char *buf = b.v[0].buf;
    Py_ssize_t len = b.v[0].len, per = n, width = n > 0 ? len / n : 0;
    if (piece_bytes > 0 && len > piece_bytes) {
        Py_ssize_t k = (len + piece_bytes - 1) / piece_bytes;
        per = (n + k - 1) / k;
    }
    if (per > INT_MAX) return cannot(&b);
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
    int on = algo_enter(ALGO_ALLREDUCE, len);
    Py_ssize_t off = 0;
    do {  /* one call for an empty buffer too: every rank makes the same calls */
        int count = (int)(n - off < per ? n - off : per);
#define CALL(C) ((int (*)(const void *, void *, int, C##_T, C##_T, C##_T))S.fn[F_ALLREDUCE])( \
    S.in_place, buf + off * width, count, C(dt), C(op), C(comm))
        ierr = S.int_handles ? CALL(HI) : CALL(HP);
#undef CALL
        off += count;
        if (per < n) pieces_made++;
    } while (ierr == 0 && off < n);
    algo_leave(ALGO_ALLREDUCE, on);
    Py_END_ALLOW_THREADS;
    return done(&b, ierr);
}

/* reduce(buf, datatype, op, root, comm): MPI_Reduce into buf on the root (MPI_IN_PLACE), from buf
 * elsewhere; buf must be writeable on every rank, as the general path requires. */
static PyObject *reduce(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(5);
    Bufs b = {.n = 0};
    H dt, op, comm;
    int rank, root = (int)PyLong_AsLong(a[3]);
    if (root == -1 && PyErr_Occurred()) return NULL;
    if (!handle_of(a[1], S.t_datatype, &dt) || !handle_of(a[2], S.t_op, &op) || !handle_of(a[4], S.t_comm, &comm))
        return cannot(&b);
    if (!get(&b, a[0], 1) || comm_rank(comm, &rank)) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]);
    if (n < 0 || n > INT_MAX) return cannot(&b);
    void *buf = b.v[0].buf;
    const void *s = rank == root ? S.in_place : buf;
    void *r = rank == root ? buf : NULL;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(const void *, void *, int, C##_T, C##_T, int, C##_T))S.fn[F_REDUCE])( \
    s, r, (int)n, C(dt), C(op), root, C(comm))
    ierr = S.int_handles ? CALL(HI) : CALL(HP);
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
    if (!handle_of(a[1], S.t_datatype, &dt) || !handle_of(a[3], S.t_comm, &comm)) return cannot(&b);
    if (!get(&b, a[0], 1)) return cannot(&b);
    return call_bcast(&b, dt, root, comm);
}

/* MPI_Bcast of b's one buffer (bcast's, and broadcast_checked's in _cmpi_bcast.c); releases b. */
HIDDEN PyObject *call_bcast(Bufs *b, H dt, int root, H comm) {
    Py_ssize_t n = elements(&b->v[0]);
    if (n < 0 || n > INT_MAX) return cannot(b);
    void *buf = b->v[0].buf;
    Py_ssize_t len = b->v[0].len;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
    int on = algo_enter(ALGO_BCAST, len);
#define CALL(C) ((int (*)(void *, int, C##_T, int, C##_T))S.fn[F_BCAST])(buf, (int)n, C(dt), root, C(comm))
    ierr = S.int_handles ? CALL(HI) : CALL(HP);
#undef CALL
    algo_leave(ALGO_BCAST, on);
    Py_END_ALLOW_THREADS;
    return done(b, ierr);
}

/* allgather(send, recv, datatype, comm): recv holds the group size times send's elements.
 * alltoall(send, recv, datatype, comm): equal pieces, send and recv of one size.
 * Both calls take MPI's (send, count, type, recv, count, type, comm). */
static PyObject *blocks(PyObject *const *a, Py_ssize_t nargs, int to_all) {
    ARGS(4);
    Bufs b = {.n = 0};
    H dt, comm;
    int size;
    if (!handle_of(a[2], S.t_datatype, &dt) || !handle_of(a[3], S.t_comm, &comm)) return cannot(&b);
    if (!two(&b, a[0], a[1]) || comm_size(comm, &size) || size <= 0) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]), count = to_all ? n / size : n;
    int fits = to_all ? b.v[0].len == b.v[1].len && n % size == 0 : elements(&b.v[1]) == n * size;
    if (n < 0 || count > INT_MAX || !fits) return cannot(&b);
    void *s = b.v[0].buf, *r = b.v[1].buf, *f = S.fn[to_all ? F_ALLTOALL : F_ALLGATHER];
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(const void *, int, C##_T, void *, int, C##_T, C##_T))f)(s, (int)count, C(dt), r, (int)count, C(dt), C(comm))
    ierr = S.int_handles ? CALL(HI) : CALL(HP);
#undef CALL
    Py_END_ALLOW_THREADS;
    return done(&b, ierr);
}

static PyObject *allgather(PyObject *self, PyObject *const *a, Py_ssize_t nargs) { return blocks(a, nargs, 0); }

static PyObject *alltoall(PyObject *self, PyObject *const *a, Py_ssize_t nargs) { return blocks(a, nargs, 1); }

/* reduce_scatter_block(send, recv, datatype, op, comm): send holds the group size times recv's elements. */
static PyObject *reduce_scatter_block(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(5);
    Bufs b = {.n = 0};
    H dt, op, comm;
    int size;
    if (!handle_of(a[2], S.t_datatype, &dt) || !handle_of(a[3], S.t_op, &op) || !handle_of(a[4], S.t_comm, &comm))
        return cannot(&b);
    if (!two(&b, a[0], a[1])) return cannot(&b);
    Py_ssize_t n = elements(&b.v[1]);
    if (n < 0 || n > INT_MAX) return cannot(&b);
    if (comm_size(comm, &size) || elements(&b.v[0]) != n * size) return cannot(&b);
    void *s = b.v[0].buf, *r = b.v[1].buf;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(const void *, void *, int, C##_T, C##_T, C##_T))S.fn[F_REDUCE_SCATTER_BLOCK])( \
    s, r, (int)n, C(dt), C(op), C(comm))
    ierr = S.int_handles ? CALL(HI) : CALL(HP);
#undef CALL
    Py_END_ALLOW_THREADS;
    return done(&b, ierr);
}

/* MPI_Alltoallv with the GIL released (the counts already checked); its MPI error code. */
HIDDEN int call_alltoallv(const void *s, const int *sc, const int *sd, void *r, const int *rc, const int *rd, H dt,
                          H comm) {
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C)                                                                                      \
    ((int (*)(const void *, const int *, const int *, C##_T, void *, const int *, const int *, C##_T, \
              C##_T))S.fn[F_ALLTOALLV])(s, sc, sd, C(dt), r, rc, rd, C(dt), C(comm))
    ierr = S.int_handles ? CALL(HI) : CALL(HP);
#undef CALL
    Py_END_ALLOW_THREADS;
    return ierr;
}

/* alltoallv(send, scounts, sdispls, recv, rcounts, rdispls, datatype, comm); counts are int32 arrays. */
static PyObject *alltoallv(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(8);
    Bufs b = {.n = 0};
    H dt, comm;
    int size;
    if (!handle_of(a[6], S.t_datatype, &dt) || !handle_of(a[7], S.t_comm, &comm)) return cannot(&b);
    if (!two(&b, a[0], a[3]) || !get(&b, a[1], 0) || !get(&b, a[2], 0) || !get(&b, a[4], 0) || !get(&b, a[5], 0))
        return cannot(&b);
    /* b.v: send, recv, scounts, sdispls, rcounts, rdispls */
    if (comm_size(comm, &size) || !counts_inside(&b.v[2], &b.v[3], size, elements(&b.v[0])) ||
        !counts_inside(&b.v[4], &b.v[5], size, elements(&b.v[1])))
        return cannot(&b);
    const void *s = b.v[0].buf;
    void *r = b.v[1].buf;
    const int *sc = b.v[2].buf, *sd = b.v[3].buf, *rc = b.v[4].buf, *rd = b.v[5].buf;
    return done(&b, call_alltoallv(s, sc, sd, r, rc, rd, dt, comm));
}

/* send(buf, datatype, dest, tag, comm) and recv(buf, datatype, source, tag, comm); a message
 * longer than recv's buf is MPI's truncation error. */
static PyObject *p2p(PyObject *const *a, Py_ssize_t nargs, int receive) {
    ARGS(5);
    Bufs b = {.n = 0};
    H dt, comm;
    int peer = (int)PyLong_AsLong(a[2]), tag = (int)PyLong_AsLong(a[3]);
    if (PyErr_Occurred()) return NULL;
    if (!handle_of(a[1], S.t_datatype, &dt) || !handle_of(a[4], S.t_comm, &comm)) return cannot(&b);
    if (!get_strided(&b, a[0], receive)) return cannot(&b);
    Py_ssize_t n = elements(&b.v[0]);
    if (n < 0 || n > INT_MAX) return cannot(&b);
    void *buf = b.v[0].buf;
    int packed = !pack_flat(&b.v[0]);
    if (packed) {
        if (b.v[0].len > PACK_LIMIT || pack_long_runs(&b.v[0]) || (buf = pack_scratch(b.v[0].len)) == NULL)
            return cannot(&b);
        if (!receive) strided_copy(&b.v[0], buf, 1, -1);
    }
    Status status;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define SEND(C) ((int (*)(const void *, int, C##_T, int, int, C##_T))S.fn[F_SEND])(buf, (int)n, C(dt), peer, tag, C(comm))
#define RECV(C) ((int (*)(void *, int, C##_T, int, int, C##_T, void *))S.fn[F_RECV])( \
    buf, (int)n, C(dt), peer, tag, C(comm), &status)
    if (receive)
        ierr = S.int_handles ? RECV(HI) : RECV(HP);
    else
        ierr = S.int_handles ? SEND(HI) : SEND(HP);
#undef SEND
#undef RECV
    Py_END_ALLOW_THREADS;
    if (packed && receive && !ierr) strided_copy(&b.v[0], buf, 0, received(&status));
    return done(&b, ierr);
}

/* The element counts of b's two buffers in *ns and *nr; 0 where either does not fit MPI's int. */
static int counts_fit(Bufs *b, Py_ssize_t *ns, Py_ssize_t *nr) {
    *ns = elements(&b->v[0]);
    *nr = elements(&b->v[1]);
    return *ns >= 0 && *ns <= INT_MAX && *nr >= 0 && *nr <= INT_MAX;
}

/* MPI_Sendrecv with the GIL released (the status is not read); the counts fit an int (counts_fit). */
static int call_sendrecv(const void *s, Py_ssize_t ns, H sdt, int dest, int stag, void *r, Py_ssize_t nr, H rdt,
                         int source, int rtag, H comm, Status *st) {
    Status own;
    Status *status = st != NULL ? st : &own;
    int ierr;
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C)                                                                                        \
    ((int (*)(const void *, int, C##_T, int, int, void *, int, C##_T, int, int, C##_T, void *))S.fn[F_SENDRECV])( \
        s, (int)ns, C(sdt), dest, stag, r, (int)nr, C(rdt), source, rtag, C(comm), status)
    ierr = S.int_handles ? CALL(HI) : CALL(HP);
#undef CALL
    Py_END_ALLOW_THREADS;
    return ierr;
}

/* sendrecv(send, sdt, dest, sendtag, recv, rdt, source, recvtag, comm): MPI_Sendrecv, the halo step.
 * dest or source may be MPI_PROC_NULL (that side moves nothing); the buffers must share no byte. */
static PyObject *sendrecv(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(9);
    Bufs b = {.n = 0};
    H sdt, rdt, comm;
    int dest = (int)PyLong_AsLong(a[2]), stag = (int)PyLong_AsLong(a[3]);
    int source = (int)PyLong_AsLong(a[6]), rtag = (int)PyLong_AsLong(a[7]);
    if (PyErr_Occurred()) return NULL;
    if (!handle_of(a[1], S.t_datatype, &sdt) || !handle_of(a[5], S.t_datatype, &rdt) ||
        !handle_of(a[8], S.t_comm, &comm))
        return cannot(&b);
    if (!get(&b, a[0], 0) || !get(&b, a[4], 1) || !apart(&b.v[0], &b.v[1])) return cannot(&b);
    Py_ssize_t ns, nr;
    if (!counts_fit(&b, &ns, &nr)) return cannot(&b);
    return done(&b, call_sendrecv(b.v[0].buf, ns, sdt, dest, stag, b.v[1].buf, nr, rdt, source, rtag, comm, NULL));
}

#define BAD LONG_MIN /* no rank or tag MPI takes (MPI_PROC_NULL is -1 in MPICH, -2 in Open MPI) */

/* A peer or tag given to sendrecv_checked as a Python object: None (then `none`), or an exact int in
 * [lo, hi) or equal to `also`; BAD where it is none of these. */
static long small_int(PyObject *x, long none, long lo, long hi, long also) {
    if (x == Py_None) return none;
    if (!PyLong_CheckExact(x)) return BAD;
    int overflow = 0;
    long v = PyLong_AsLongAndOverflow(x, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return BAD;
    }
    return (v >= lo && v < hi) || v == also ? v : BAD;
}

#define TAG_UB_MIN 32767 /* every MPI allows tags up to this */


/* The MPI datatype that `datatypes` (mpicomm's write-once cache, dtype -> datatype) holds for the
 * array's dtype, or NULL. The last few dtypes seen are kept by identity: hashing a numpy dtype for
 * the dictionary costs as much as the rest of a small sendrecv's checks. */
#define KEPT 8
static PyObject *kept_dtype[KEPT], *kept_type[KEPT];
static int kept_next;

/* The datatype for a dtype object (borrowed), or NULL; shared with _cmpi_jagged.c. */
HIDDEN PyObject *cmpi_datatype_for(PyObject *datatypes, PyObject *dtype) {
    for (int i = 0; i < KEPT; i++)
        if (kept_dtype[i] == dtype) return kept_type[i]; /* kept: a reference of ours */
    PyObject *type = PyDict_GetItemWithError(datatypes, dtype);
    if (type == NULL) {
        PyErr_Clear();
        return NULL;
    }
    int i = kept_next;
    kept_next = (kept_next + 1) % KEPT;
    Py_XSETREF(kept_dtype[i], Py_NewRef(dtype));
    Py_XSETREF(kept_type[i], Py_NewRef(type));
    return type;
}

static PyObject *datatype_of(PyObject *datatypes, PyObject *array) {
    static PyObject *name = NULL;
    if (name == NULL && (name = PyUnicode_InternFromString("dtype")) == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *dtype = PyObject_GetAttr(array, name);
    if (dtype == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *type = cmpi_datatype_for(datatypes, dtype);
    Py_DECREF(dtype); /* the kept table holds its own reference when it keeps one */
    return type;
}

/* sendrecv_checked(send, recv, dest, source, tag, sendtag, recvtag, comm, datatypes, proc_null, any_tag):
 * the whole fast path of mpicomm.sendrecv on the world: peers None (MPI_PROC_NULL), proc_null or a
 * rank of comm; tag, or sendtag/recvtag (mpi4py's names: recvtag defaults to any_tag there), exact
 * ints in [0, 32767]; datatypes maps each array's dtype to its MPI datatype. Returns the rank
 * received from (-1 for none), or NotImplemented before any MPI call where anything is off. */
static PyObject *sendrecv_checked(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(11);
    Bufs b = {.n = 0};
    H sdt, rdt, comm;
    int size;
    if (!handle_of(a[7], S.t_comm, &comm) || !PyDict_CheckExact(a[8]) || !PyLong_CheckExact(a[9]) ||
        !PyLong_CheckExact(a[10]) || Py_TYPE(a[0]) != S.t_ndarray || Py_TYPE(a[1]) != S.t_ndarray)
        return cannot(&b);
    long null = PyLong_AsLong(a[9]), any_tag = PyLong_AsLong(a[10]);
    if (PyErr_Occurred() || comm_size(comm, &size)) {
        PyErr_Clear();
        return cannot(&b);
    }
    long dest = small_int(a[2], null, 0, size, null), source = small_int(a[3], null, 0, size, null);
    long stag, rtag;
    if (a[5] == Py_None && a[6] == Py_None) {
        stag = rtag = small_int(a[4], 0, 0, TAG_UB_MIN + 1, BAD);
    } else if (a[4] == Py_None) {
        stag = small_int(a[5], 0, 0, TAG_UB_MIN + 1, BAD);
        rtag = small_int(a[6], any_tag, 0, TAG_UB_MIN + 1, any_tag);
    } else {
        return cannot(&b); /* tag with sendtag/recvtag: refused by name on the checked path */
    }
    if (dest == BAD || source == BAD || stag == BAD || rtag == BAD) return cannot(&b);
    PyObject *stype = datatype_of(a[8], a[0]), *rtype = datatype_of(a[8], a[1]);
    if (stype == NULL || rtype == NULL || !handle_of(stype, S.t_datatype, &sdt) ||
        !handle_of(rtype, S.t_datatype, &rdt))
        return cannot(&b);
    if (!get_strided(&b, a[0], 0) || !get_strided(&b, a[1], 1) || !pack_disjoint(&b.v[0], &b.v[1]))
        return cannot(&b);
    Py_ssize_t ns, nr;
    if (!counts_fit(&b, &ns, &nr)) return cannot(&b);
    /* a strided view travels through this thread's scratch memory: packed before, unpacked after */
    int pack_s = !pack_flat(&b.v[0]), pack_r = !pack_flat(&b.v[1]);
    Py_ssize_t need = (pack_s ? b.v[0].len : 0) + (pack_r ? b.v[1].len : 0);
    char *scratch = NULL;
    if (need > PACK_LIMIT || (pack_s && pack_long_runs(&b.v[0])) || (pack_r && pack_long_runs(&b.v[1])) ||
        (need > 0 && (scratch = pack_scratch(need)) == NULL))
        return cannot(&b);
    const void *s = b.v[0].buf;
    void *r = b.v[1].buf;
    if (pack_s) {
        strided_copy(&b.v[0], scratch, 1, -1);
        s = scratch;
    }
    if (pack_r) r = scratch + (pack_s ? b.v[0].len : 0);
    int from = (int)source;
    Status status;
    int ierr = call_sendrecv(s, ns, sdt, (int)dest, (int)stag, r, nr, rdt, from, (int)rtag, comm, &status);
    if (pack_r && !ierr && from != null) /* MPI_PROC_NULL wrote nothing; a short message, what it held */
        strided_copy(&b.v[1], r, 0, received(&status));
    release(&b);
    if (ierr) return mpi_error(ierr);
    return PyLong_FromLong(from == null ? -1 : from);
}

static PyObject *send(PyObject *self, PyObject *const *a, Py_ssize_t nargs) { return p2p(a, nargs, 0); }

static PyObject *recv(PyObject *self, PyObject *const *a, Py_ssize_t nargs) { return p2p(a, nargs, 1); }

/* handle(obj): the handle read where this module reads it (to check the binding against .handle). */
static PyObject *handle(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(1);
    H h;
    if (!handle_of(a[0], S.t_comm, &h) && !handle_of(a[0], S.t_datatype, &h) && !handle_of(a[0], S.t_op, &h))
        Py_RETURN_NONE;
    return PyLong_FromSsize_t((Py_ssize_t)h);
}

/* bind(addresses, int_handles, in_place, offset, Comm, Datatype, Op, ndarray, Exception, status_size, BYTE) */
static PyObject *bind(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (nargs != 11 || !PyTuple_Check(a[0]) || PyTuple_GET_SIZE(a[0]) != F_COUNT) {
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
    if (ss <= 0 || ss > 256) { /* recv's status buffer holds 256 bytes */
        PyErr_SetString(PyExc_ValueError, "mpicomm.core._cmpi.bind: implausible MPI_Status size");
        return NULL;
    }
    for (int i = 4; i <= 7; i++)
        if (!PyType_Check(a[i])) {
            PyErr_SetString(PyExc_TypeError, "mpicomm.core._cmpi.bind: expected types");
            return NULL;
        }
    if (!PyObject_TypeCheck(a[10], (PyTypeObject *)a[5])) {
        PyErr_SetString(PyExc_TypeError, "mpicomm.core._cmpi.bind: expected MPI.BYTE last");
        return NULL;
    }
    char *byte_at = (char *)a[10] + off; /* where handle_of reads, with the layout being bound */
    S.byte = ih ? (H) * (int *)byte_at : (H) * (void **)byte_at;
    memcpy(S.fn, f, sizeof(S.fn));
    S.int_handles = ih;
    S.in_place = ip;
    S.offset = off;
    S.status_size = ss;
    Py_XSETREF(S.t_comm, (PyTypeObject *)Py_NewRef(a[4]));
    Py_XSETREF(S.t_datatype, (PyTypeObject *)Py_NewRef(a[5]));
    Py_XSETREF(S.t_op, (PyTypeObject *)Py_NewRef(a[6]));
    Py_XSETREF(S.t_ndarray, (PyTypeObject *)Py_NewRef(a[7]));
    Py_XSETREF(S.exc_type, Py_NewRef(a[8]));
    S.bound = 1;
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
#define LIST(name) {#name, (PyCFunction)(void (*)(void))cmpi_##name, METH_FASTCALL, NULL}
static PyMethodDef methods[] = {
    FAST(bind), FAST(handle), FAST(allreduce), FAST(reduce), FAST(bcast), FAST(allgather), FAST(reduce_scatter_block),
    FAST(alltoall), FAST(alltoallv), FAST(send), FAST(recv), FAST(sendrecv),
    FAST(sendrecv_checked), LIST(broadcast_checked), LIST(broadcast_checked_bind), LIST(allgather_list), LIST(reduce_scatter_list),
    LIST(gather_list), LIST(exchange), LIST(jagged), LIST(kjt_repeat),
    {"names", names, METH_NOARGS, NULL},
    {"scratch_held", cmpi_scratch_held, METH_NOARGS, NULL},
    FAST(switch_algorithm), FAST(algorithm_enter), FAST(algorithm_leave), FAST(set_piece),
    {"algorithm_switches", algorithm_switches, METH_NOARGS, NULL},
    {"allreduce_pieces", allreduce_pieces, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cmpi",
                                    "MPI calls for mpicomm's fast paths (see mpicomm.core.cmpi).", -1, methods};

PyMODINIT_FUNC PyInit__cmpi(void) { return PyModule_Create(&module); }
