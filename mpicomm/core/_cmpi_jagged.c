/* jagged(values, lengths, splits, fp, bound, datatypes, i64, comm, empty): the whole blocking
 * mpicomm.jagged_all_to_all of numpy arrays in one C call (see mpicomm.jagged.exchange).
 *
 * Why: the call is two small collectives (the counts MPI_Alltoall, then MPI_Alltoallv), and the
 * Python around them (per-destination sums, the counts message, its checks, displacements) cost
 * several times the two MPI calls at small sizes. Here Python does O(1) work a call.
 *
 * The wire format is mpicomm.jagged.wire's (checked against this file by tests/unit/test_cmpi_jagged.py):
 * per destination WIDE int64 words, FLAGS, DTYPES (fp), SPLITS, ROWS, VALUES, STRIDE, MODE, then up
 * to INLINE lengths of the rows for that destination when every destination gets at most INLINE
 * rows (then the lengths need no MPI_Alltoallv of their own). The Python path and this one send the
 * same messages and make the same MPI calls, so ranks on either path match.
 *
 * Arguments: values, a C-contiguous numpy array of at least one dimension (any dtype but object;
 * records travel whole); lengths, a 1-D int64 numpy array; splits, a list or tuple of Python ints,
 * one per rank; fp, the counts message's dtype fingerprint; bound, the payload cap in bytes;
 * datatypes, mpicomm's dtype -> MPI datatype cache; i64, MPI.INT64_T (the counts message); comm;
 * empty, numpy.empty (allocates the results).
 *
 * Returns:
 * - NotImplemented before any MPI call when it cannot serve the arguments (anything unusual,
 *   including every argument error: the Python path then raises the message users see);
 * - (lengths, values, splits received) once done;
 * - after the counts MPI_Alltoall, the (size, WIDE) int64 array received, when anything in it is
 *   not the common case (ranks that disagree, claims past the cap, forged inline lengths, a rank
 *   that asked for the non-blocking calls, counts past INT_MAX): the Python path takes over from
 *   there, raising or finishing the exchange with the same MPI calls every other rank makes. */
#include "_cmpi.h"

enum { W_FLAGS, W_DTYPES, W_SPLITS, W_ROWS, W_VALUES, W_STRIDE, W_MODE, W_HEADER };
#define INLINE 9
#define WIDE (W_HEADER + INLINE)
enum { M_IN_HEADER, M_BLOCKING, M_NONBLOCKING };

typedef int64_t i64;

static int call_alltoall(const void *s, void *r, int count, H dt, H comm) {
    int ierr;
    void *f = S.fn[F_ALLTOALL];
    Py_BEGIN_ALLOW_THREADS;
#define CALL(C) ((int (*)(const void *, int, C##_T, void *, int, C##_T, C##_T))f)(s, count, C(dt), r, count, C(dt), C(comm))
    ierr = S.int_handles ? CALL(HI) : CALL(HP);
#undef CALL
    Py_END_ALLOW_THREADS;
    return ierr;
}

/* counts[i] * row as int32 counts with their displacements; 0 if any of them passes INT_MAX. */
static int int_counts(const i64 *counts, Py_ssize_t stride, int n, i64 row, int *c, int *d) {
    i64 at = 0, k;
    for (int i = 0; i < n; i++) {
        if (__builtin_mul_overflow(counts[i * stride], row, &k) || k > INT_MAX || at > INT_MAX) return 0;
        c[i] = (int)k;
        d[i] = (int)at;
        at += k;
    }
    return 1;
}

static PyObject *dtype_of(PyObject *array) {
    static PyObject *name = NULL;
    if (name == NULL && (name = PyUnicode_InternFromString("dtype")) == NULL) return NULL;
    return PyObject_GetAttr(array, name);
}

/* A new numpy array from empty(shape, dtype); NULL with the error set. */
static PyObject *allocate(PyObject *empty, PyObject *shape, PyObject *dtype) {
    PyObject *args[2] = {shape, dtype};
    return PyObject_Vectorcall(empty, args, 2, NULL);
}

/* The (size, WIDE) int64 array of what arrived, for the Python path to take over. */
static PyObject *hand_over(PyObject *empty, const i64 *got, int n, PyObject *i64_dtype) {
    PyObject *shape = Py_BuildValue("(ii)", n, WIDE);
    if (shape == NULL) return NULL;
    PyObject *out = allocate(empty, shape, i64_dtype);
    Py_DECREF(shape);
    if (out == NULL) return NULL;
    Py_buffer v;
    if (PyObject_GetBuffer(out, &v, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    if (v.len == (Py_ssize_t)sizeof(i64) * n * WIDE) memcpy(v.buf, got, (size_t)v.len);
    PyBuffer_Release(&v);
    return out;
}

HIDDEN PyObject *cmpi_jagged(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(9);
    Bufs b = {.n = 0};
    H comm, dt_hdr, dt_l, dt_v;
    int n;
    PyObject *splits = a[2], *datatypes = a[5], *empty = a[8];
    if (!handle_of(a[6], S.t_datatype, &dt_hdr) || !handle_of(a[7], S.t_comm, &comm) ||
        !PyDict_CheckExact(datatypes) || !(PyList_CheckExact(splits) || PyTuple_CheckExact(splits)) ||
        !PyLong_CheckExact(a[3]) || !PyLong_CheckExact(a[4]))
        return cannot(&b);
    i64 fp = PyLong_AsLongLong(a[3]), bound = PyLong_AsLongLong(a[4]);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return cannot(&b);
    }
    /* b.v: values, lengths (then the two results) */
    if (!get_fmt(&b, a[0], 0) || !get_fmt(&b, a[1], 0)) return cannot(&b);
    Py_buffer *V = &b.v[0], *L = &b.v[1];
    if (V->ndim < 1 || V->itemsize <= 0 || strchr(V->format, 'O') != NULL || L->ndim != 1 ||
        L->itemsize != (Py_ssize_t)sizeof(i64) || comm_size(comm, &n) || n <= 0 ||
        PySequence_Fast_GET_SIZE(splits) != n)
        return cannot(&b);
    PyObject *v_dtype = dtype_of(a[0]), *l_dtype = dtype_of(a[1]);
    PyObject *tv = v_dtype ? cmpi_datatype_for(datatypes, v_dtype) : NULL;
    PyObject *tl = l_dtype ? cmpi_datatype_for(datatypes, l_dtype) : NULL;
    /* the lengths' datatype must be the Python path's for int64 lengths (and it is 8 bytes) */
    if (tv == NULL || tl == NULL || !handle_of(tv, S.t_datatype, &dt_v) || !handle_of(tl, S.t_datatype, &dt_l) ||
        (strcmp(L->format, "l") != 0 && strcmp(L->format, "q") != 0)) {
        PyErr_Clear();
        Py_XDECREF(v_dtype);
        Py_XDECREF(l_dtype);
        return cannot(&b);
    }
    i64 row = 1;
    for (int i = 1; i < V->ndim; i++) row *= V->shape[i];
    i64 row_bytes = row * V->itemsize, rows_in = V->shape[0];
    const i64 *lens = L->buf;
    Py_ssize_t nlens = L->shape[0];

    /* one block: the message out, the message in, then int32 counts and displacements: values
     * sent, lengths sent, lengths received, values received */
    size_t words = (size_t)2 * n * WIDE;
    i64 *mem = PyMem_Calloc(words * sizeof(i64) + (size_t)8 * n * sizeof(int), 1);
    if (mem == NULL) {
        Py_DECREF(v_dtype);
        Py_DECREF(l_dtype);
        release(&b);
        return PyErr_NoMemory();
    }
    i64 *hdr = mem, *got = mem + (size_t)n * WIDE;
    int *sc = (int *)(mem + words), *sd = sc + n, *lsc = sd + n, *lsd = lsc + n;
    int *lrc = lsd + n, *lrd = lrc + n, *rc = lrd + n, *rd = rc + n;
    PyObject *result = NULL, *out_l = NULL, *out_v = NULL;
    int ierr = 0, mode = M_IN_HEADER;

    /* every argument check, before any MPI call: splits, lengths, values along dim 0 */
    Py_ssize_t at = 0;
    i64 all = 0;
    for (int d = 0; d < n; d++) {
        PyObject *x = PySequence_Fast_GET_ITEM(splits, d);
        if (!PyLong_CheckExact(x)) goto cannot;
        i64 r = PyLong_AsLongLong(x), v = 0;
        if (r == -1 && PyErr_Occurred()) goto cannot;
        if (r < 0 || r > nlens - at) goto cannot;
        if (r > INLINE) mode = M_BLOCKING;
        for (Py_ssize_t i = at; i < at + r; i++)
            if (lens[i] < 0 || __builtin_add_overflow(v, lens[i], &v)) goto cannot;
        i64 *h = hdr + (size_t)d * WIDE;
        h[W_DTYPES] = fp;
        h[W_ROWS] = r;
        h[W_VALUES] = v;
        if (r <= INLINE) memcpy(h + W_HEADER, lens + at, (size_t)r * sizeof(i64));
        at += r;
        if (__builtin_add_overflow(all, v, &all)) goto cannot;
    }
    if (at != nlens || all != rows_in || !int_counts(hdr + W_VALUES, WIDE, n, row, sc, sd) ||
        !int_counts(hdr + W_ROWS, WIDE, n, 1, lsc, lsd))
        goto cannot;
    for (int d = 0; d < n; d++) {
        i64 *h = hdr + (size_t)d * WIDE;
        h[W_MODE] = mode;
        if (mode != M_IN_HEADER) memset(h + W_HEADER, 0, INLINE * sizeof(i64));
    }

    if ((ierr = call_alltoall(hdr, got, WIDE, dt_hdr, comm))) goto out;

    /* what arrived is untrusted: anything but the common case goes to the Python path */
    i64 total_rows = 0, total_vals = 0, bytes = 0, t;
    int take_over = 0, in_header = 1;
    for (int s = 0; s < n && !take_over; s++) {
        const i64 *g = got + (size_t)s * WIDE;
        i64 r = g[W_ROWS], v = g[W_VALUES];
        if (g[W_FLAGS] != 0 || g[W_DTYPES] != fp || g[W_SPLITS] != 0 || r < 0 || v < 0 ||
            (g[W_MODE] != M_IN_HEADER && g[W_MODE] != M_BLOCKING) || __builtin_mul_overflow(r, (i64)sizeof(i64), &t) ||
            __builtin_add_overflow(bytes, t, &bytes) || __builtin_mul_overflow(v, row_bytes, &t) ||
            __builtin_add_overflow(bytes, t, &bytes) || bytes > bound ||
            __builtin_add_overflow(total_rows, r, &total_rows) || __builtin_add_overflow(total_vals, v, &total_vals)) {
            take_over = 1; /* (values of zero bytes a row are bounded by nothing but their sum) */
            break;
        }
        if (g[W_MODE] != M_IN_HEADER) in_header = 0;
    }
    if (!take_over && in_header) {
        for (int s = 0; s < n && !take_over; s++) {
            const i64 *g = got + (size_t)s * WIDE;
            i64 sum = 0;
            if (g[W_ROWS] > INLINE) take_over = 1;
            for (i64 j = 0; j < g[W_ROWS] && !take_over; j++)
                if (g[W_HEADER + j] < 0 || __builtin_add_overflow(sum, g[W_HEADER + j], &sum)) take_over = 1;
            if (sum != g[W_VALUES]) take_over = 1;
        }
    }
    if (take_over || !int_counts(got + W_ROWS, WIDE, n, 1, lrc, lrd) || !int_counts(got + W_VALUES, WIDE, n, row, rc, rd)) {
        result = hand_over(empty, got, n, l_dtype);
        goto out;
    }

    /* the results */
    PyObject *shape = PyTuple_New(V->ndim);
    if (shape == NULL) goto out;
    for (int i = 0; i < V->ndim; i++) {
        PyObject *k = i ? PyLong_FromSsize_t(V->shape[i]) : PyLong_FromLongLong(total_vals);
        if (k == NULL) {
            Py_DECREF(shape);
            goto out;
        }
        PyTuple_SET_ITEM(shape, i, k);
    }
    out_v = allocate(empty, shape, v_dtype);
    Py_DECREF(shape);
    if (out_v == NULL) goto out;
    PyObject *count = PyLong_FromLongLong(total_rows);
    if (count == NULL) goto out;
    out_l = allocate(empty, count, l_dtype);
    Py_DECREF(count);
    if (out_l == NULL || !get(&b, out_v, 1) || !get(&b, out_l, 1) || b.v[2].len != total_vals * row_bytes ||
        b.v[3].len != total_rows * (i64)sizeof(i64)) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "jagged: numpy.empty gave an unexpected array");
        goto out;
    }
    i64 *dst_l = b.v[3].buf;
    if (in_header) {
        for (int s = 0; s < n; s++) {
            const i64 *g = got + (size_t)s * WIDE;
            memcpy(dst_l, g + W_HEADER, (size_t)g[W_ROWS] * sizeof(i64));
            dst_l += g[W_ROWS];
        }
    } else if ((ierr = call_alltoallv(lens, lsc, lsd, dst_l, lrc, lrd, dt_l, comm))) {
        goto out;
    }
    if ((ierr = call_alltoallv(V->buf, sc, sd, b.v[2].buf, rc, rd, dt_v, comm))) goto out;
    PyObject *from = PyList_New(n);
    if (from == NULL) goto out;
    for (int s = 0; s < n; s++) {
        PyObject *k = PyLong_FromLongLong(got[(size_t)s * WIDE + W_ROWS]);
        if (k == NULL) {
            Py_DECREF(from);
            goto out;
        }
        PyList_SET_ITEM(from, s, k);
    }
    result = PyTuple_Pack(3, out_l, out_v, from);
    Py_DECREF(from);
    goto out;

cannot:
    PyErr_Clear();
    Py_DECREF(v_dtype);
    Py_DECREF(l_dtype);
    PyMem_Free(mem);
    return cannot(&b);

out:
    Py_XDECREF(out_l);
    Py_XDECREF(out_v);
    Py_DECREF(v_dtype);
    Py_DECREF(l_dtype);
    PyMem_Free(mem);
    release(&b);
    if (ierr) {
        Py_XDECREF(result);
        return mpi_error(ierr);
    }
    return result;
}

/* kjt_repeat(header, got, expect, values, sc, sd, out, rc, rd, segs, tmp, hdr_dt, dt, comm): one
 * KJTAllToAll call whose counts message repeats (mpicomm.jagged.kjt's _Repeat), in one C call.
 *
 * Why: once a call's counts message has been received and checked, a later call that receives the
 * same bytes needs nothing of Python between its two MPI calls but one comparison; the recat of
 * the values is a few segment copies. The calls are KJTAllToAll's own (MPI_Alltoall of header into
 * got, then MPI_Alltoallv of the values), so ranks on the Python path match.
 *
 * Arguments: header, the int64 counts message sent (size * W words); got, a writable int64 array of
 * as many bytes (what arrives lands there); expect, the bytes of the message the last call
 * received, checked; values, the C-contiguous values sent (one value a row); sc, sd, rc, rd, int32
 * counts and displacements; out, the values' new array; segs, None when the values arrive in their
 * final order, else an int64 (m, 3) array of (from, to, count) segments, in values, that put what
 * arrives in tmp (an array of out's size) into out; hdr_dt, MPI.INT64_T; dt, the values' datatype.
 *
 * Returns True once done; False after the counts message when it differs from expect (got holds
 * it, nothing else has moved: the Python path finishes the call); NotImplemented before any MPI
 * call when it cannot serve the arguments. */
HIDDEN PyObject *cmpi_kjt_repeat(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    ARGS(14);
    Bufs b = {.n = 0}, c = {.n = 0};
    H dt_hdr, dt, comm;
    int n, ierr;
    int fused = a[9] != Py_None;
    /* b.v: header, got, values, out[, tmp]; c.v: sc, sd, rc, rd[, segs] */
    if (!handle_of(a[11], S.t_datatype, &dt_hdr) || !handle_of(a[12], S.t_datatype, &dt) ||
        !handle_of(a[13], S.t_comm, &comm) || !PyBytes_CheckExact(a[2]) || comm_size(comm, &n) || n <= 0)
        return cannot(&b);
    if (!get(&b, a[0], 0) || !get(&b, a[1], 1) || !get(&b, a[3], 0) || !get(&b, a[6], 1) ||
        (fused && !get(&b, a[10], 1)) || !get(&c, a[4], 0) || !get(&c, a[5], 0) || !get(&c, a[7], 0) ||
        !get(&c, a[8], 0) || (fused && !get(&c, a[9], 0)))
        goto cannot;
    Py_buffer *hdr = &b.v[0], *got = &b.v[1], *V = &b.v[2], *O = &b.v[3], *T = fused ? &b.v[4] : O;
    Py_ssize_t words = elements(hdr), isz = V->itemsize;
    if (hdr->itemsize != (Py_ssize_t)sizeof(i64) || got->len != hdr->len || PyBytes_GET_SIZE(a[2]) != hdr->len ||
        words % n != 0 || words / n > INT_MAX || !apart(hdr, got) || O->itemsize != isz || T->len != O->len ||
        T->itemsize != isz || !apart(V, T) || !apart(V, O) || (fused && !apart(T, O)) ||
        !apart(got, V) || !apart(got, T) ||
        !counts_inside(&c.v[0], &c.v[1], n, elements(V)) || !counts_inside(&c.v[2], &c.v[3], n, elements(T)))
        goto cannot;
    const i64 *segs = NULL;
    Py_ssize_t nsegs = 0, total = elements(O);
    if (fused) {
        Py_buffer *G = &c.v[4];
        if (G->itemsize != (Py_ssize_t)sizeof(i64) || G->len % (3 * (Py_ssize_t)sizeof(i64)) != 0) goto cannot;
        segs = G->buf;
        nsegs = G->len / (3 * (Py_ssize_t)sizeof(i64));
        for (Py_ssize_t i = 0; i < nsegs; i++) {
            i64 from = segs[3 * i], to = segs[3 * i + 1], k = segs[3 * i + 2];
            if (from < 0 || to < 0 || k < 0 || from > total - k || to > total - k) goto cannot;
        }
    }
    if ((ierr = call_alltoall(hdr->buf, got->buf, (int)(words / n), dt_hdr, comm))) goto failed;
    if (memcmp(got->buf, PyBytes_AS_STRING(a[2]), (size_t)got->len) != 0) {
        release(&b);
        release(&c);
        Py_RETURN_FALSE;
    }
    if ((ierr = call_alltoallv(V->buf, c.v[0].buf, c.v[1].buf, T->buf, c.v[2].buf, c.v[3].buf, dt, comm))) goto failed;
    for (Py_ssize_t i = 0; i < nsegs; i++)
        memcpy((char *)O->buf + segs[3 * i + 1] * isz, (const char *)T->buf + segs[3 * i] * isz,
               (size_t)(segs[3 * i + 2] * isz));
    release(&b);
    release(&c);
    Py_RETURN_TRUE;

failed:
    release(&b);
    release(&c);
    return mpi_error(ierr);

cannot:
    release(&c);
    return cannot(&b);
}
