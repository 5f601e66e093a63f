/* mpicomm.core._cmpi, the packing of strided views for the point-to-point calls (see _cmpi.c). */
#include "_cmpi.h"
#include <sys/mman.h>

/* Strided views (a ghost column u[:, 0], a[:, ::2], a.T) in send, recv and sendrecv_checked: packed
 * into scratch memory kept per thread (the GIL is released around MPI, so two threads may be in a
 * call at once) and sent contiguous, which measured 0.6-1x "np.ascontiguousarray + a contiguous
 * call + copy back" where MPICH's derived datatypes measured 2-20x (docs/halo.rst). A view MPI
 * moves well by datatype (runs of RUN_LIMIT contiguous bytes or more), or a message above
 * PACK_LIMIT bytes, goes to the Python path, which sends it through a cached derived datatype
 * (mpicomm.core.buffers, mpicomm.core.layouts). The scratch memory stays allocated while its
 * thread lives (at most PACK_LIMIT bytes a thread): a thread-specific key's destructor frees it
 * when the thread ends (a program that starts a thread per task would otherwise keep every
 * thread's 64 MiB, issue 44). scratch_held counts the bytes all threads hold, for the tests. */
static _Thread_local char *scratch;
static _Thread_local Py_ssize_t scratch_size;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static int scratch_keyed; /* the key was made (0: the scratch is not freed at thread exit) */
static Py_ssize_t scratch_total; /* bytes held by every thread's scratch, changed atomically */

/* The scratch block holds its own size in a header, for the destructor. */
#define SCRATCH_HEAD ((Py_ssize_t)sizeof(long double) > 16 ? (Py_ssize_t)sizeof(long double) : 16)

/* The scratch is mapped (mmap), not malloc'd: its pages go back to the system when it is unmapped,
 * where glibc keeps freed blocks of a thread's arena resident (measured: 64 of 128 MiB kept after
 * four threads ended). Its contents never outlive a call, so a larger one replaces it, unmapped. */
static char *map_block(Py_ssize_t bytes) {
    void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : (char *)p;
}

/* Runs at thread exit, without the GIL, with the key's value (the block, its size in its header). */
static void scratch_free(void *p) {
    Py_ssize_t size = *(Py_ssize_t *)p;
    __atomic_fetch_sub(&scratch_total, size, __ATOMIC_RELAXED);
    munmap(p, (size_t)(size + SCRATCH_HEAD));
}

static void scratch_key_make(void) { scratch_keyed = pthread_key_create(&scratch_key, scratch_free) == 0; }

static int grow(Py_ssize_t need) {
    pthread_once(&scratch_once, scratch_key_make);
    char *more = map_block(need + SCRATCH_HEAD);
    if (more == NULL) return 0;
    if (scratch != NULL) { /* the old block's contents are not needed: unmapped, not copied */
        munmap(scratch - SCRATCH_HEAD, (size_t)(scratch_size + SCRATCH_HEAD));
        __atomic_fetch_sub(&scratch_total, scratch_size, __ATOMIC_RELAXED);
        scratch = NULL;
        scratch_size = 0;
    }
    if (scratch_keyed && pthread_setspecific(scratch_key, more) != 0) {
        munmap(more, (size_t)(need + SCRATCH_HEAD)); /* could not be handed to the destructor: none kept */
        if (scratch_keyed) pthread_setspecific(scratch_key, NULL);
        return 0;
    }
    *(Py_ssize_t *)more = need;
    __atomic_fetch_add(&scratch_total, need - scratch_size, __ATOMIC_RELAXED);
    scratch = more + SCRATCH_HEAD;
    scratch_size = need;
    return 1;
}

/* This thread's scratch memory, grown to at least `need` bytes; NULL where it cannot be. */
HIDDEN char *pack_scratch(Py_ssize_t need) {
    if (scratch_size < need && !grow(need)) return NULL;
    return scratch;
}

/* scratch_held(): the bytes of pack scratch that live threads hold (tests/unit/test_cmpi_scratch.py). */
HIDDEN PyObject *cmpi_scratch_held(PyObject *self, PyObject *unused) {
    return PyLong_FromSsize_t(__atomic_load_n(&scratch_total, __ATOMIC_RELAXED));
}

/* A numpy array's buffer with its strides (any layout), the output one writeable. */
HIDDEN int get_strided(Bufs *b, PyObject *obj, int writable) {
    if (Py_TYPE(obj) != S.t_ndarray) return 0;
    int flags = PyBUF_STRIDES | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &b->v[b->n], flags) < 0) {
        PyErr_Clear();
        return 0;
    }
    b->n++;
    if (b->v[b->n - 1].ndim > 32) return 0; /* released with the others */
    return 1;
}

/* Whether a buffer lies C-contiguous (strides as a C array of its shape would have). */
HIDDEN int pack_flat(const Py_buffer *v) {
    Py_ssize_t step = v->itemsize;
    for (int d = v->ndim - 1; d >= 0; d--) {
        if (v->shape[d] > 1 && v->strides[d] != step) return 0;
        step *= v->shape[d];
    }
    return 1;
}

/* Whether a strided buffer is better left to a derived datatype: long contiguous runs. */
HIDDEN int pack_long_runs(const Py_buffer *v) {
    Py_ssize_t run = v->itemsize;
    for (int d = v->ndim - 1; d >= 0 && (v->shape[d] <= 1 || v->strides[d] == run); d--) run *= v->shape[d];
    return run >= RUN_LIMIT;
}

/* The lowest byte a buffer touches and one past the highest. */
static void bounds(const Py_buffer *v, const char **lo, const char **hi) {
    const char *l = v->buf, *h = (const char *)v->buf + v->itemsize;
    for (int d = 0; d < v->ndim; d++) {
        Py_ssize_t reach = (v->shape[d] - 1) * v->strides[d];
        if (v->shape[d] == 0) return (void)(*lo = *hi = v->buf);
        if (reach < 0) l += reach; else h += reach;
    }
    *lo = l;
    *hi = h;
}

/* Whether two buffers surely share no byte: byte ranges apart, or two 1-D views of one stride whose
 * elements interleave without touching (the columns of one array). Anything else: 0, and the Python
 * path answers exactly (numpy.shares_memory). */
HIDDEN int pack_disjoint(const Py_buffer *x, const Py_buffer *y) {
    const char *xl, *xh, *yl, *yh;
    if (x->len == 0 || y->len == 0) return 1;
    bounds(x, &xl, &xh);
    bounds(y, &yl, &yh);
    if (xh <= yl || yh <= xl) return 1;
    if (x->ndim != 1 || y->ndim != 1 || x->strides[0] != y->strides[0] || x->strides[0] <= 0) return 0;
    Py_ssize_t stride = x->strides[0], d = ((const char *)y->buf - (const char *)x->buf) % stride;
    if (d < 0) d += stride;
    return d >= x->itemsize && stride - d >= y->itemsize;
}

/* Copy between a strided buffer and `flat` memory in C order (to_flat: gather, else scatter), at most
 * `upto` bytes of the flat stream (-1: all): a short message fills only the elements (and the part of
 * the last one) that it holds, as MPI fills a contiguous buffer; the rest keep their values. */
HIDDEN void strided_copy(const Py_buffer *v, char *contiguous, int to_flat, Py_ssize_t upto) {
    Py_ssize_t e = v->itemsize, total = v->itemsize > 0 ? v->len / v->itemsize : 0, idx[32] = {0}, rest = 0;
    int nd = v->ndim;
    if (upto >= 0 && e > 0 && upto < total * e) {
        total = upto / e;
        rest = upto % e;
    }
    if (total == 0 && rest == 0) return;
    Py_ssize_t inner_n = nd > 0 ? v->shape[nd - 1] : 1, inner_s = nd > 0 ? v->strides[nd - 1] : e;
    char *row = v->buf;
    for (Py_ssize_t k = 0; k <= total; k += inner_n) {
        Py_ssize_t here = total - k < inner_n ? total - k : inner_n;
        char *p = row, *f = contiguous + k * e;
        if (e == 8) {
            for (Py_ssize_t i = 0; i < here; i++, p += inner_s, f += 8)
                if (to_flat) memcpy(f, p, 8); else memcpy(p, f, 8);
        } else if (e == 4) {
            for (Py_ssize_t i = 0; i < here; i++, p += inner_s, f += 4)
                if (to_flat) memcpy(f, p, 4); else memcpy(p, f, 4);
        } else {
            for (Py_ssize_t i = 0; i < here; i++, p += inner_s, f += e)
                if (to_flat) memcpy(f, p, (size_t)e); else memcpy(p, f, (size_t)e);
        }
        if (here < inner_n) { /* the stream ends in this row, maybe inside an element */
            if (rest > 0) memcpy(p, f, (size_t)rest);
            return;
        }
        if (k + inner_n == total && rest == 0) return;
        for (int d = nd - 2; d >= 0; d--) { /* the next row: odometer over the outer dims */
            if (++idx[d] < v->shape[d]) {
                row += v->strides[d];
                break;
            }
            row -= v->strides[d] * (v->shape[d] - 1);
            idx[d] = 0;
        }
    }
}

/* The bytes a receive's status says arrived (MPI_Get_count in MPI_BYTE); -1 where MPI cannot say. */
HIDDEN Py_ssize_t received(const void *status) {
    int got = -1;
#define CALL(C) ((int (*)(const void *, C##_T, int *))S.fn[F_GET_COUNT])(status, C(S.byte), &got)
    int err = S.int_handles ? CALL(HI) : CALL(HP);
#undef CALL
    return err || got < 0 ? -1 : (Py_ssize_t)got;
}

