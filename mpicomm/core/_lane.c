/* mpicomm.core._lane: a point-to-point call of the program's thread, run inside the engine's
 * blocking collective, below MPI_THREAD_MULTIPLE (MPICH 4.2 and later).
 *
 * Why: at MPI_THREAD_SERIALIZED only one thread may be inside MPI. When mpicomm's communication
 * thread is inside a blocking collective whose peer first waits for a message this rank sends
 * after posting that collective (gloo's idiom: all_reduce(async_op=True), then send), neither rank
 * can go on: the send may not enter MPI, and the collective cannot be made non-blocking (MPI never
 * matches a non-blocking collective with the peer's blocking one). MPICH's MPIX_Async_start
 * registers a poll function that MPI's progress engine calls from inside any MPI call, on the
 * thread that is inside MPI: this one posts the program's message there (MPI_Isend or
 * MPI_Irecv) and tests it until it completes, so one thread stays inside MPI at a time.
 *
 * One slot (the program's thread makes one blocking call at a time): the program's thread fills it
 * and marks it POSTED; the poll function, on whatever thread is inside MPI, moves it to FLIGHT
 * (posted), then DONE or FAILED. The program's thread waits for DONE with the GIL released, or
 * takes the call back while it is still POSTED once nothing is inside MPI. MPICH's handles are
 * ints (its ABI); mpicomm.core.lane binds only there. The poll function stays registered for the
 * process's life and returns MPIX_ASYNC_DONE once stop() is called (MPI_Finalize waits for every
 * registered function to be done).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdatomic.h>

enum { IDLE, POSTED, FLIGHT, DONE, FAILED, STOPPED };
enum { ASYNC_NOPROGRESS = 0, ASYNC_DONE = 1 };

typedef int (*poll_fn)(void *);
static int (*async_start)(poll_fn, void *, int);
static int (*isend)(const void *, int, int, int, int, int, int *);
static int (*irecv)(void *, int, int, int, int, int, int *);
static int (*test)(int *, int *, int *);
static int stream_null;

static struct {
    atomic_int state;
    atomic_int stop;
    int busy;  /* inside the poll function: MPI_Test may progress, and call it again */
    int send;
    void *buf;
    int count, datatype, peer, tag, comm, request, error;
    int status[8];  /* MPICH's MPI_Status: count_lo, count_hi_and_cancelled, MPI_SOURCE, MPI_TAG, MPI_ERROR */
} slot;

static int poll(void *thing) {
    (void)thing;
    if (atomic_load_explicit(&slot.stop, memory_order_acquire)) return ASYNC_DONE;
    if (slot.busy) return ASYNC_NOPROGRESS;
    int state = atomic_load_explicit(&slot.state, memory_order_acquire);
    if (state != POSTED && state != FLIGHT) return ASYNC_NOPROGRESS;
    slot.busy = 1;
    int err, flag = 0;
    if (state == POSTED) {  /* claimed first: the program's thread takes back only a POSTED slot */
        int expected = POSTED;
        if (!atomic_compare_exchange_strong(&slot.state, &expected, FLIGHT)) {
            slot.busy = 0;
            return ASYNC_NOPROGRESS;
        }
        err = slot.send ? isend(slot.buf, slot.count, slot.datatype, slot.peer, slot.tag, slot.comm, &slot.request)
                        : irecv(slot.buf, slot.count, slot.datatype, slot.peer, slot.tag, slot.comm, &slot.request);
        if (!err) state = FLIGHT;
    } else {
        err = test(&slot.request, &flag, slot.status);
        if (!err && flag) state = DONE;
    }
    if (err) {
        slot.error = err;
        state = FAILED;
    }
    slot.busy = 0;
    atomic_store_explicit(&slot.state, state, memory_order_release);
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
    atomic_store(&slot.state, IDLE);
    return PyLong_FromLong(async_start(poll, NULL, stream_null));
}

/* post(send, buffer, count, datatype, peer, tag, comm): fill the slot; False if it is in use. The
 * caller keeps the buffer alive and unchanged until the slot is DONE, FAILED or taken back. */
static PyObject *post(PyObject *self, PyObject *args) {
    int send, count, datatype, peer, tag, comm;
    unsigned long long buf;
    unsigned int dt, cm;
    if (!PyArg_ParseTuple(args, "pKiIiiI", &send, &buf, &count, &dt, &peer, &tag, &cm)) return NULL;
    datatype = (int)dt, comm = (int)cm;
    if (atomic_load(&slot.state) != IDLE || atomic_load(&slot.stop)) Py_RETURN_FALSE;
    slot.send = send;
    slot.buf = (void *)(uintptr_t)buf;
    slot.count = count, slot.datatype = datatype, slot.peer = peer, slot.tag = tag, slot.comm = comm;
    slot.error = 0;
    atomic_store_explicit(&slot.state, POSTED, memory_order_release);
    Py_RETURN_TRUE;
}

/* wait(seconds): wait up to that long (GIL released) for the slot to leave POSTED and FLIGHT;
 * returns its state. */
static PyObject *wait_for(PyObject *self, PyObject *arg) {
    double seconds = PyFloat_AsDouble(arg);
    if (seconds < 0 && PyErr_Occurred()) return NULL;
    int state;
    Py_BEGIN_ALLOW_THREADS;
    struct timespec nap = {0, 20000};
    long rounds = (long)(seconds / 20e-6);
    for (long i = 0;; i++) {
        state = atomic_load_explicit(&slot.state, memory_order_acquire);
        if ((state != POSTED && state != FLIGHT) || i >= rounds) break;
        nanosleep(&nap, NULL);
    }
    Py_END_ALLOW_THREADS;
    return PyLong_FromLong(state);
}

/* take(): (state, MPI error, source, tag) once DONE or FAILED, the slot then IDLE again; a POSTED
 * slot taken back (nothing was posted: the caller runs the call itself); None while in FLIGHT. */
static PyObject *take(PyObject *self, PyObject *unused) {
    int state = atomic_load_explicit(&slot.state, memory_order_acquire);
    if (state == FLIGHT) Py_RETURN_NONE;
    if (state == POSTED) {
        int expected = POSTED;
        if (!atomic_compare_exchange_strong(&slot.state, &expected, IDLE)) Py_RETURN_NONE;
    } else if (state == DONE || state == FAILED) {
        atomic_store(&slot.state, IDLE);
    }
    return Py_BuildValue("iiii", state, slot.error, slot.status[2], slot.status[3]);
}

/* finish(): in FLIGHT with nothing else inside MPI, test the request here until it completes. */
static PyObject *finish(PyObject *self, PyObject *unused) {
    while (atomic_load(&slot.state) == FLIGHT) {
        int err, flag = 0;
        Py_BEGIN_ALLOW_THREADS;
        slot.busy = 1;
        err = test(&slot.request, &flag, slot.status);
        slot.busy = 0;
        Py_END_ALLOW_THREADS;
        if (err) slot.error = err;
        if (err || flag) atomic_store(&slot.state, err ? FAILED : DONE);
    }
    Py_RETURN_NONE;
}

/* stop(): the poll function ends at its next call (before MPI_Finalize, which waits for it). */
static PyObject *stop(PyObject *self, PyObject *unused) {
    atomic_store(&slot.stop, 1);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS, "Bind MPIX_Async_start, MPI_Isend, MPI_Irecv, MPI_Test."},
    {"start", start, METH_NOARGS, "Register the poll function."},
    {"post", post, METH_VARARGS, "Hand a message to the thread inside MPI."},
    {"wait", wait_for, METH_O, "Wait for the slot to complete, up to some seconds."},
    {"take", take, METH_NOARGS, "The slot's outcome, or it taken back while still posted."},
    {"finish", finish, METH_NOARGS, "Complete an in-flight message on this thread."},
    {"stop", stop, METH_NOARGS, "End the poll function."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_lane", NULL, -1, methods};

PyMODINIT_FUNC PyInit__lane(void) { return PyModule_Create(&module); }
