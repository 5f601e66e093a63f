/* The shared part of mpicomm.core._cmpi (see _cmpi.c): the bound state, handle and buffer helpers.
 *
 * Contract with the callers (mpicomm.core.cmpi): a datatype passed with an array is the one
 * mpicomm caches for the array's own dtype, whose size equals numpy's itemsize, so a buffer of
 * `len` bytes holds len / itemsize elements of it. */
#ifndef MPICOMM_CMPI_H
#define MPICOMM_CMPI_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__)
#define HIDDEN __attribute__((visibility("hidden")))
#else
#define HIDDEN
#endif

typedef intptr_t H; /* an MPI handle as this module carries it */

enum { F_ALLREDUCE, F_BCAST, F_ALLGATHER, F_REDUCE_SCATTER_BLOCK, F_ALLTOALL, F_ALLTOALLV,
       F_SEND, F_RECV, F_COMM_SIZE, F_GATHERV, F_COMM_RANK, F_ISEND, F_IRECV, F_WAITALL, F_REDUCE, F_GET_COUNT,
       F_SENDRECV, F_COUNT };

/* What bind() learnt: the MPI functions, the handle width, MPI_IN_PLACE, mpi4py's layout. */
typedef struct {
    void *fn[F_COUNT];
    int bound;
    int int_handles;          /* 1: handles are C ints (MPICH's ABI); 0: pointers */
    void *in_place;           /* MPI_IN_PLACE */
    Py_ssize_t offset;        /* where mpi4py keeps the handle inside its objects */
    Py_ssize_t status_size;   /* sizeof(MPI_Status) */
    H byte;                   /* MPI_BYTE, to count the bytes a receive's status holds */
    PyTypeObject *t_comm, *t_datatype, *t_op, *t_ndarray;
    PyObject *exc_type;       /* mpi4py's MPI.Exception */
} CmpiState;

extern HIDDEN CmpiState cmpi_state;
#define S cmpi_state

/* A call through S.fn[i] with handles of either width: C(h) converts a handle, C##_T is its type. */
#define HI_T int
#define HI(h) ((int)(h))
#define HP_T void *
#define HP(h) ((void *)(h))

/* The buffers of a call's array arguments; released together. */
typedef struct {
    Py_buffer v[6];
    int n;
} Bufs;

static inline int handle_of(PyObject *obj, PyTypeObject *type, H *out) {
    if (!PyObject_TypeCheck(obj, type)) return 0;
    char *at = (char *)obj + S.offset;
    *out = S.int_handles ? (H) * (int *)at : (H) * (void **)at;
    return 1;
}

static inline PyObject *mpi_error(int ierr) {
    PyObject *code = PyLong_FromLong(ierr);
    if (code != NULL) {
        PyErr_SetObject(S.exc_type, code);
        Py_DECREF(code);
    }
    return NULL;
}


static inline int get(Bufs *b, PyObject *obj, int writable) {
    if (Py_TYPE(obj) != S.t_ndarray) return 0; /* numpy only: its buffers say their itemsize */
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &b->v[b->n], flags) < 0) {
        PyErr_Clear();
        return 0;
    }
    b->n++;
    return 1;
}

static inline void release(Bufs *b) {
    for (int i = 0; i < b->n; i++) PyBuffer_Release(&b->v[i]);
    b->n = 0;
}

static inline PyObject *cannot(Bufs *b) {
    release(b);
    Py_RETURN_NOTIMPLEMENTED;
}

static inline PyObject *done(Bufs *b, int ierr) {
    release(b);
    if (ierr) return mpi_error(ierr);
    Py_RETURN_NONE;
}

/* Whether two buffers share no byte (MPI forbids aliased send and receive buffers). */
static inline int apart(const Py_buffer *x, const Py_buffer *y) {
    const char *a = x->buf, *b = y->buf;
    return x->len == 0 || y->len == 0 || a + x->len <= b || b + y->len <= a;
}

/* The send and receive arrays of a two-array call: numpy, C-contiguous, the receive one writeable,
 * of one itemsize and sharing no byte; 0 where the call cannot be served. */
static inline int two(Bufs *b, PyObject *send, PyObject *recv) {
    return get(b, send, 0) && get(b, recv, 1) && b->v[0].itemsize == b->v[1].itemsize && apart(&b->v[0], &b->v[1]);
}

static inline Py_ssize_t elements(const Py_buffer *v) { return v->itemsize > 0 ? v->len / v->itemsize : -1; }

/* Whether counts/displacements (int32 arrays of the group size) stay inside a buffer of n elements. */
static inline int counts_inside(const Py_buffer *counts, const Py_buffer *displs, int size, Py_ssize_t n) {
    if (counts->len != (Py_ssize_t)sizeof(int) * size || displs->len != (Py_ssize_t)sizeof(int) * size ||
        counts->itemsize != (Py_ssize_t)sizeof(int) || displs->itemsize != (Py_ssize_t)sizeof(int))
        return 0;
    const int *c = counts->buf, *d = displs->buf;
    for (int i = 0; i < size; i++)
        if (c[i] < 0 || d[i] < 0 || (Py_ssize_t)d[i] + c[i] > n) return 0;
    return 1;
}

static inline int comm_size(H comm, int *size) {
    return S.int_handles ? ((int (*)(HI_T, int *))S.fn[F_COMM_SIZE])(HI(comm), size)
                       : ((int (*)(HP_T, int *))S.fn[F_COMM_SIZE])(HP(comm), size);
}

#define ARGS(n)                                                                       \
    if (!S.bound || nargs != (n)) {                                                     \
        PyErr_SetString(PyExc_TypeError, "mpicomm.core._cmpi: unbound or wrong args"); \
        return NULL;                                                                  \
    }

static inline int comm_rank(H comm, int *rank) {
    return S.int_handles ? ((int (*)(HI_T, int *))S.fn[F_COMM_RANK])(HI(comm), rank)
                         : ((int (*)(HP_T, int *))S.fn[F_COMM_RANK])(HP(comm), rank);
}

static inline int get_fmt(Bufs *b, PyObject *obj, int writable) {
    if (Py_TYPE(obj) != S.t_ndarray) return 0;
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &b->v[b->n], flags) < 0) {
        PyErr_Clear();
        return 0;
    }
    b->n++;
    return 1;
}

/* MPI_Status is at most a few dozen bytes in every ABI; 256 aligned bytes hold any of them. */
typedef union {
    char bytes[256];
    long double align;
} Status;

/* The packing of strided views for send, recv and sendrecv_checked (_cmpi_pack.c). */
#define PACK_LIMIT ((Py_ssize_t)1 << 26)
#define RUN_LIMIT ((Py_ssize_t)1 << 16)
HIDDEN char *pack_scratch(Py_ssize_t need);
HIDDEN PyObject *cmpi_scratch_held(PyObject *self, PyObject *unused);
HIDDEN int get_strided(Bufs *b, PyObject *obj, int writable);
HIDDEN int pack_flat(const Py_buffer *v);
HIDDEN int pack_long_runs(const Py_buffer *v);
HIDDEN int pack_disjoint(const Py_buffer *x, const Py_buffer *y);
HIDDEN void strided_copy(const Py_buffer *v, char *contiguous, int to_flat, Py_ssize_t upto);
HIDDEN Py_ssize_t received(const void *status);

/* broadcast's MPI call (_cmpi.c) and its whole fast path (_cmpi_bcast.c). */
HIDDEN PyObject *call_bcast(Bufs *b, H dt, int root, H comm);
HIDDEN PyObject *cmpi_broadcast_checked(PyObject *self, PyObject *const *a, Py_ssize_t nargs);
HIDDEN PyObject *cmpi_broadcast_checked_bind(PyObject *self, PyObject *const *a, Py_ssize_t nargs);

/* The list forms (_cmpi_lists.c). */
HIDDEN PyObject *cmpi_allgather_list(PyObject *self, PyObject *const *a, Py_ssize_t nargs);
HIDDEN PyObject *cmpi_reduce_scatter_list(PyObject *self, PyObject *const *a, Py_ssize_t nargs);
HIDDEN PyObject *cmpi_gather_list(PyObject *self, PyObject *const *a, Py_ssize_t nargs);
HIDDEN PyObject *cmpi_exchange(PyObject *self, PyObject *const *a, Py_ssize_t nargs);

/* jagged_all_to_all's blocking call (_cmpi_jagged.c), and the datatype cache it shares (_cmpi.c). */
HIDDEN PyObject *cmpi_jagged(PyObject *self, PyObject *const *a, Py_ssize_t nargs);
HIDDEN PyObject *cmpi_kjt_repeat(PyObject *self, PyObject *const *a, Py_ssize_t nargs);
HIDDEN PyObject *cmpi_datatype_for(PyObject *datatypes, PyObject *dtype);
HIDDEN int call_alltoallv(const void *s, const int *sc, const int *sd, void *r, const int *rc, const int *rd, H dt,
                          H comm);

#endif
