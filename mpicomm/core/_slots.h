/* Reading a slotted Python object's attribute in C, for the fast paths of the C extensions
 * (mpicomm/front/_door.c, mpicomm/core/_cmpi_bcast.c).
 *
 * mpicomm's per-call state lives in one instance of a class with __slots__ (the thread owner, the
 * validation flag, the world group, the chunk setting): an object slot is a PyObject * at a fixed
 * offset inside the instance, which its member descriptor names. Reading it there costs a load,
 * where PyObject_GetAttr costs a type lookup and a descriptor call. */
#ifndef MPICOMM_SLOTS_H
#define MPICOMM_SLOTS_H

#include <Python.h>
#include <structmember.h>

/* The offset of the slot `desc` (a member descriptor of obj's type, a writeable object slot), or -1. */
static inline Py_ssize_t slot_offset(PyObject *desc, PyObject *obj) {
    if (Py_TYPE(desc) != &PyMemberDescr_Type || PyDescr_TYPE(desc) != Py_TYPE(obj)) return -1;
    PyMemberDef *m = ((PyMemberDescrObject *)desc)->d_member;
    if (m->type != T_OBJECT_EX || (m->flags & READONLY)) return -1;
    return m->offset;
}

/* The slot of `obj` at offset `at` (borrowed; NULL while unset). */
static inline PyObject *slot(PyObject *obj, Py_ssize_t at) { return *(PyObject **)((char *)obj + at); }

#endif
