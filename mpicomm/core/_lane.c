/* mpicomm.core._lane: point-to-point messages of the program's thread, run inside the engine's
 * blocking collective, below MPI_THREAD_MULTIPLE (MPICH 4.2 and later).
 *
 * Why: at MPI_THREAD_SERIALIZED only one thread may be inside MPI. When mpicomm's communication
 * thread is inside a blocking collective whose peer first waits for a message this rank sends
 * after posting that collective (gloo's idiom: all_reduce(async_op=True), then send), neither rank
 * can go on: the send may not enter MPI, and the collective cannot be made non-blocking (MPI never
 * matches a non-blocking collective with the peer's blocking one). MPICH's MPIX_Async_start
 * registers a poll function that MPI's progress engine calls from inside any MPI call, on the
 * thread that is inside MPI: this one posts the program's messages there (MPI_Isend, MPI_Irecv)
 * and tests them until they complete, so one thread stays inside MPI at a time.
 *
 * A ring of SLOTS slots, each one call of the program's (send, recv, isend, irecv: one message;
 * sendrecv: a send and a receive posted together). The program's thread fills the slot at `head`
 * and marks it POSTED; whichever thread is inside MPI (the engine's, through the poll function,
 * or the program's once nothing else is: progress()) posts POSTED slots in the order they were
 * filled (MPI's non-overtaking order), moves them to FLIGHT, then DONE or FAILED once every
 * message of the slot has completed. The program's thread takes a DONE or FAILED slot back
 * (IDLE). A full ring (the slot at `head` not yet taken) refuses: the call then waits behind the
 * engine's queue. MPICH's handles are ints (its ABI); mpicomm.core.lane binds only there. The poll
 * function stays registered for the process's life and returns MPIX_ASYNC_DONE once stop() is
 * called (MPI_Finalize waits for every registered function to be done).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>
#include <time.h>

enum { IDLE, POSTED, FLIGHT, DONE, FAILED };
enum { ASYNC_NOPROGRESS = 0, ASYNC_DONE = 1 };
#define SLOTS 64

typedef int (*poll_fn)(void *);
static int (*async_start)(poll_fn, void *, int);
static int (*isend)(const void *, int, int, int, int, int, int *);
static int (*irecv)(void *, int, int, int, int, int, int *);
static int (*test)(int *, int *, int *);
static int stream_null;

typedef struct {
    int send, count, datatype, peer, tag, request, done;
    void *buf;
    int status[8]; /* MPICH's MPI_Status: count_lo, count_hi_and_cancelled, MPI_SOURCE, MPI_TAG, MPI_ERROR */
} message;

typedef struct {
    atomic_int state;
    int n, comm, error;
    message m[2];
} slot;

static slot ring[SLOTS];
static atomic_uint head;   /* slots filled, ever (the program's thread alone writes it) */
static unsigned posted;    /* slots posted to MPI, ever (the thread inside MPI) */
static atomic_int active;  /* slots POSTED or FLIGHT: the poll function's one test when 0 */
static atomic_int stopped;
static int busy;           /* inside progress: MPI_Test may progress, and call the poll function again */

static void end(slot *s, int state) {
    atomic_store_explicit(&s->state, state, memory_order_release);
    atomic_fetch_sub_explicit(&active, 1, memory_order_relaxed);
}

/* Post the filled slots in order, test those in flight; on the one thread inside MPI. */
static void progress_here(void) {
    if (busy) return;
    busy = 1;
    unsigned filled = atomic_load_explicit(&head, memory_order_acquire);
    for (; posted != filled; posted++) {
        slot *s = &ring[posted % SLOTS];
        int err = 0;
        for (int k = 0; k < s->n && !err; k++) {
            message *m = &s->m[k];
            m->done = 0;
            err = m->send ? isend(m->buf, m->count, m->datatype, m->peer, m->tag, s->comm, &m->request)
                          : irecv(m->buf, m->count, m->datatype, m->peer, m->tag, s->comm, &m->request);
        }
        if (err) {
            s->error = err;
            end(s, FAILED);
        } else {
            atomic_store_explicit(&s->state, FLIGHT, memory_order_release);
        }
    }
    for (int i = 0; i < SLOTS && atomic_load_explicit(&active, memory_order_relaxed); i++) {
        slot *s = &ring[i];
        if (atomic_load_explicit(&s->state, memory_order_relaxed) != FLIGHT) continue;
        int all = 1, err = 0;
        for (int k = 0; k < s->n && !err; k++) {
            message *m = &s->m[k];
            if (m->done) continue;
            int flag = 0;
            err = test(&m->request, &flag, m->status);
            m->done = flag;
            all = all && flag;
        }
        if (err) {
            s->error = err;
            end(s, FAILED);
        } else if (all) {
            end(s, DONE);
        }
    }
    busy = 0;
}

static int poll(void *thing) {
    (void)thing;
    if (atomic_load_explicit(&stopped, memory_order_acquire)) return ASYNC_DONE;
    if (atomic_load_explicit(&active, memory_order_acquire)) progress_here();
    return ASYNC_NOPROGRESS;
}

/* bind(async_start, isend, irecv, test, stream_null): the MPI functions' addresses. */
static PyObject *bind(PyObject *self, PyObject *args) {
    unsigned long long a, s, r, t;
    if (!PyArg_ParseTuple(args, "KKKKi", &a, &s, &r, &t, &stream_null)) return NULL;
    async_start = (int (*)(poll_fn, void *, int))(uintptr_t)a;
    isend = (int (*)(const void *, int, int, int, int, int, int *))(uintptr_t)s;
    irecv = (int (*)(void *, int, int, int, int, int, int *))(uintptr_t)r;
    test = (int (*)(int *, int *, int *))(uintptr_t)t;
    Py_RETURN_NONE;
}

/* start(): register the poll function (on a thread allowed inside MPI); returns MPI's error code. */
static PyObject *start(PyObject *self, PyObject *unused) {
    if (async_start == NULL) return PyLong_FromLong(-1);
    return PyLong_FromLong(async_start(poll, NULL, stream_null));
}

/* post(comm, (send, buffer, count, datatype, peer, tag)[, (...)]): fill the slot at head with one
 * or two messages; its index, or -1 if the ring is full. The caller keeps the buffers alive and
 * unchanged until the slot is DONE or FAILED. */
static PyObject *post(PyObject *self, PyObject *args) {
    unsigned int cm, dt[2];
    unsigned long long buf[2];
    int send[2], count[2], peer[2], tag[2];
    int n = PyTuple_GET_SIZE(args) - 1;
    if (!PyArg_ParseTuple(args, "I(pKiIii)|(pKiIii)", &cm, &send[0], &buf[0], &count[0], &dt[0], &peer[0],
                          &tag[0], &send[1], &buf[1], &count[1], &dt[1], &peer[1], &tag[1]))
        return NULL;
    unsigned h = atomic_load(&head);
    slot *s = &ring[h % SLOTS];
    if (atomic_load_explicit(&s->state, memory_order_acquire) != IDLE || atomic_load(&stopped))
        return PyLong_FromLong(-1);
    s->n = n, s->comm = (int)cm, s->error = 0;
    for (int k = 0; k < n; k++) {
        message *m = &s->m[k];
        m->send = send[k], m->buf = (void *)(uintptr_t)buf[k], m->count = count[k];
        m->datatype = (int)dt[k], m->peer = peer[k], m->tag = tag[k], m->done = 0;
        m->status[2] = m->status[3] = -1;
    }
    atomic_fetch_add(&active, 1);
    atomic_store_explicit(&s->state, POSTED, memory_order_release);
    atomic_store_explicit(&head, h + 1, memory_order_release);
    return PyLong_FromLong(h % SLOTS);
}

static int index_of(PyObject *arg) {
    long i = PyLong_AsLong(arg);
    if (i < 0 || i >= SLOTS) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "lane slot out of range");
        return -1;
    }
    return (int)i;
}

static int running(int i) {
    int state = atomic_load_explicit(&ring[i].state, memory_order_acquire);
    return state == POSTED || state == FLIGHT;
}

/* wait(i, seconds): wait up to that long (GIL released) while the thread inside MPI serves slot i;
 * returns its state. */
static PyObject *wait_for(PyObject *self, PyObject *args) {
    int i;
    double seconds;
    if (!PyArg_ParseTuple(args, "id", &i, &seconds)) return NULL;
    if (i < 0 || i >= SLOTS) return PyErr_Format(PyExc_IndexError, "lane slot %d out of range", i);
    Py_BEGIN_ALLOW_THREADS;
    struct timespec nap = {0, 20000};
    long rounds = (long)(seconds / 20e-6);
    for (long k = 0; running(i) && k < rounds; k++) nanosleep(&nap, NULL);
    Py_END_ALLOW_THREADS;
    return PyLong_FromLong(atomic_load(&ring[i].state));
}

/* complete(i, seconds): with nothing else inside MPI, progress here until slot i has ended or
 * that long has passed (GIL released); returns its state. */
static PyObject *complete(PyObject *self, PyObject *args) {
    int i;
    double seconds;
    if (!PyArg_ParseTuple(args, "id", &i, &seconds)) return NULL;
    if (i < 0 || i >= SLOTS) return PyErr_Format(PyExc_IndexError, "lane slot %d out of range", i);
    Py_BEGIN_ALLOW_THREADS;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long k = 0; running(i); k++) {
        progress_here();
        if ((k & 255) == 255) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((double)(t.tv_sec - t0.tv_sec) + 1e-9 * (double)(t.tv_nsec - t0.tv_nsec) > seconds) break;
        }
    }
    Py_END_ALLOW_THREADS;
    return PyLong_FromLong(atomic_load(&ring[i].state));
}

/* progress(): post the filled slots and test those in flight, here (a thread allowed inside MPI). */
static PyObject *progress(PyObject *self, PyObject *unused) {
    if (atomic_load_explicit(&active, memory_order_acquire)) progress_here();
    Py_RETURN_NONE;
}

/* take(i): (state, MPI error, source, tag) of a DONE or FAILED slot, which is then IDLE again (the
 * source and tag of its receive; -1 for a send alone); None while it runs. */
static PyObject *take(PyObject *self, PyObject *arg) {
    int i = index_of(arg);
    if (i < 0) return NULL;
    slot *s = &ring[i];
    int state = atomic_load_explicit(&s->state, memory_order_acquire);
    if (state != DONE && state != FAILED) Py_RETURN_NONE;
    message *r = &s->m[s->n - 1];
    PyObject *out = Py_BuildValue("iiii", state, s->error, r->send ? -1 : r->status[2], r->send ? -1 : r->status[3]);
    atomic_store_explicit(&s->state, IDLE, memory_order_release);
    return out;
}

/* stop(): the poll function ends at its next call (before MPI_Finalize, which waits for it). */
static PyObject *stop(PyObject *self, PyObject *unused) {
    atomic_store(&stopped, 1);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "Bind MPIX_Async_start, MPI_Isend, MPI_Irecv, MPI_Test."},
    {"start", start, METH_NOARGS, "Register the poll function."},
    {"post", post, METH_VARARGS, "Hand one call's messages to the thread inside MPI."},
    {"wait", wait_for, METH_VARARGS, "Wait while the thread inside MPI serves a slot, up to some seconds."},
    {"complete", complete, METH_VARARGS, "Progress a slot on this thread, up to some seconds."},
    {"progress", progress, METH_NOARGS, "Post the filled slots and test those in flight, here."},
    {"take", take, METH_O, "A finished slot's outcome, the slot then free."},
    {"stop", stop, METH_NOARGS, "End the poll function."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lane", NULL, -1, methods};

PyMODINIT_FUNC PyInit__lane(void) { return PyModule_Create(&module); }
