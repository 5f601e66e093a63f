/* broadcast's whole fast path in C: mpicomm.core._cmpi.broadcast_checked, the front door's fast entry
 * of mpicomm.broadcast (see mpicomm.core.fast.broadcast_in_c and mpicomm/front/_door.c).
 *
 * Why: an 8-byte MPI_Bcast between two ranks of a node costs about 1.3 us, less than an
 * MPI_Allreduce, and the host's fast path in Python (mpicomm.dense.reductions.broadcast: its frame,
 * a dozen attribute and global reads, then cmpi.bcast) cost about 2,900 instructions a call on top
 * of the C door, which put the call at 1.2x raw mpi4py's Bcast. This function makes the same tests
 * on the same state, read where it lives (slots of mpicomm's state objects, the world's parts in
 * core.fast.WORLD, the datatype cache), and calls MPI_Bcast through _cmpi.c's call_bcast.
 *
 * It serves only the call the host's fast path serves without a Work: a blocking call on the world
 * group (group and group_src None, the world's parts kept), validation off, no call queued for the
 * engine, a numpy array (its type exactly ndarray), C-contiguous and writeable, of a dtype whose
 * datatype is cached, at most the chunk setting's `least` bytes, src None or a world rank (an int,
 * not a bool), and cmpi.bcast this module's own (bound, not replaced). Anything else returns
 * NotImplemented before any MPI call, and the door calls the host, which checks everything and
 * raises the messages; an MPI error raises mpi4py's MPI.Exception, as cmpi.bcast does in the host.
 */
#include "_cmpi.h"
#include "_slots.h"

/* What broadcast_checked_bind was given: the state objects, where their slots are, the names. */
static struct {
    PyObject *threads, *flag, *groups, *setting; /* watchdog._Threads, validation._Flag, groups._State, chunks.Setting */
    Py_ssize_t pending_at, on_at, world_at, least_at;
    PyObject *world;     /* core.fast.WORLD: [the world group, its communicator, its size] */
    PyObject *datatypes; /* core.buffers._DATATYPES: dtype -> MPI datatype */
    PyObject *cmpi;      /* mpicomm.core.cmpi's namespace, whose "bcast" must be `bcast` */
    PyObject *bcast;     /* this module's bcast */
    PyObject *bcast_name, *dtype_name;
} B;

/* broadcast_checked(tensor, src, group, async_op, group_src): None once MPI_Bcast has run, or
 * NotImplemented before any MPI call. */
HIDDEN PyObject *cmpi_broadcast_checked(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "mpicomm.core._cmpi.broadcast_checked: 5 arguments");
        return NULL;
    }
    PyObject *tensor = a[0], *src = a[1];
    if (!S.bound || B.cmpi == NULL || a[2] != Py_None || a[3] != Py_False || a[4] != Py_None ||
        Py_TYPE(tensor) != S.t_ndarray)
        Py_RETURN_NOTIMPLEMENTED;
    PyObject *pending = slot(B.threads, B.pending_at), *world = slot(B.groups, B.world_at);
    if (pending == NULL || world == NULL || slot(B.flag, B.on_at) != Py_False ||
        PyList_GET_SIZE(B.world) != 3 || PyList_GET_ITEM(B.world, 0) != world)
        Py_RETURN_NOTIMPLEMENTED;
    if (PyDict_GetItemWithError(B.cmpi, B.bcast_name) != B.bcast || PyObject_IsTrue(pending) != 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    long root = 0, size = PyLong_AsLong(PyList_GET_ITEM(B.world, 2));
    if (src != Py_None) {
        int overflow = 0;
        root = PyLong_CheckExact(src) ? PyLong_AsLongAndOverflow(src, &overflow) : -1;
        if (overflow) root = -1;
    }
    Py_ssize_t least = PyLong_AsSsize_t(slot(B.setting, B.least_at));
    PyObject *dtype = PyObject_GetAttr(tensor, B.dtype_name);
    PyObject *dt = dtype != NULL ? PyDict_GetItemWithError(B.datatypes, dtype) : NULL; /* borrowed */
    Py_XDECREF(dtype);
    H h_dt, h_comm;
    if (PyErr_Occurred() || dt == NULL || root < 0 || root >= size ||
        !handle_of(dt, S.t_datatype, &h_dt) || !handle_of(PyList_GET_ITEM(B.world, 1), S.t_comm, &h_comm)) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    Bufs b = {.n = 0};
    if (!get(&b, tensor, 1) || b.v[0].len > least) return cannot(&b);
    return call_bcast(&b, h_dt, (int)root, h_comm);
}

/* broadcast_checked_bind(threads, pending, flag, on, groups, world_slot, world, datatypes, setting,
 * least, cmpi, bcast): what broadcast_checked reads; pending, on, world_slot and least are the member
 * descriptors of those slots of threads, flag, groups and setting; cmpi is mpicomm.core.cmpi's
 * namespace and bcast this module's bcast. */
HIDDEN PyObject *cmpi_broadcast_checked_bind(PyObject *self, PyObject *const *a, Py_ssize_t nargs) {
    if (nargs != 12 || !PyList_CheckExact(a[6]) || !PyDict_CheckExact(a[7]) || !PyDict_CheckExact(a[10])) {
        PyErr_SetString(PyExc_TypeError, "mpicomm.core._cmpi.broadcast_checked_bind: wrong arguments");
        return NULL;
    }
    Py_ssize_t pending_at = slot_offset(a[1], a[0]), on_at = slot_offset(a[3], a[2]);
    Py_ssize_t world_at = slot_offset(a[5], a[4]), least_at = slot_offset(a[9], a[8]);
    if (pending_at < 0 || on_at < 0 || world_at < 0 || least_at < 0) {
        PyErr_SetString(PyExc_TypeError, "mpicomm.core._cmpi.broadcast_checked_bind: not object slots");
        return NULL;
    }
    PyObject *bcast_name = PyUnicode_InternFromString("bcast"), *dtype_name = PyUnicode_InternFromString("dtype");
    if (bcast_name == NULL || dtype_name == NULL) {
        Py_XDECREF(bcast_name);
        Py_XDECREF(dtype_name);
        return NULL;
    }
    PyObject *old = B.cmpi;
    B.cmpi = NULL; /* broadcast_checked serves nothing while the fields change */
    Py_XSETREF(B.bcast_name, bcast_name);
    Py_XSETREF(B.dtype_name, dtype_name);
    Py_XSETREF(B.threads, Py_NewRef(a[0]));
    Py_XSETREF(B.flag, Py_NewRef(a[2]));
    Py_XSETREF(B.groups, Py_NewRef(a[4]));
    Py_XSETREF(B.world, Py_NewRef(a[6]));
    Py_XSETREF(B.datatypes, Py_NewRef(a[7]));
    Py_XSETREF(B.setting, Py_NewRef(a[8]));
    Py_XSETREF(B.bcast, Py_NewRef(a[11]));
    B.pending_at = pending_at;
    B.on_at = on_at;
    B.world_at = world_at;
    B.least_at = least_at;
    B.cmpi = Py_NewRef(a[10]);
    Py_XDECREF(old);
    Py_RETURN_NONE;
}
