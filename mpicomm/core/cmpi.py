"""The fast paths' MPI calls, made from C (``mpicomm.core._cmpi``) where that module is built and bound.

mpi4py parses every message it is given (``[array, datatype]``, the op, the communicator), which
costs about 0.3 us a call, as much as all of mpicomm's own checks on a common call. The C module
takes the mpi4py objects the fast paths already hold, reads their handles where mpi4py keeps them
and calls MPI itself, so a common blocking call on numpy arrays costs less than the raw mpi4py
call it replaces. Its functions mirror MPI's, in MPI's argument order (``c`` the communicator):

* ``allreduce(buf, dt, op, c)``: ``MPI_Allreduce`` with ``MPI_IN_PLACE``;
* ``reduce(buf, dt, op, root, c)``: ``MPI_Reduce``, ``MPI_IN_PLACE`` on the root;
* ``bcast(buf, dt, root, c)``: ``MPI_Bcast``;
* ``allgather(s, r, dt, c)``: ``MPI_Allgather``, ``r`` the group size times ``s``;
* ``reduce_scatter_block(s, r, dt, op, c)``: ``MPI_Reduce_scatter_block``;
* ``alltoall(s, r, dt, c)``: ``MPI_Alltoall`` of equal pieces;
* ``alltoallv(s, sc, sd, r, rc, rd, dt, c)``: ``MPI_Alltoallv``, counts and displacements as int32
  arrays;
* ``send(buf, dt, dest, tag, c)`` and ``recv(buf, dt, src, tag, c)``: ``MPI_Send`` and ``MPI_Recv``;
* ``sendrecv(s, sdt, dest, stag, r, rdt, src, rtag, c)``: ``MPI_Sendrecv`` (``dest``/``src`` may be
  ``MPI_PROC_NULL``);
* ``sendrecv_checked(s, r, dest, src, tag, sendtag, recvtag, c, datatypes, proc_null, any_tag)``:
  ``mpicomm.sendrecv``'s whole fast path, its peers and tags as the caller gave them (None, an int),
  checked in C; returns the rank received from (-1: none) instead of None;
* ``broadcast_checked(tensor, src, group, async_op, group_src)`` (``_cmpi_bcast.c``):
  ``mpicomm.broadcast``'s whole fast path, the front door's fast entry of that call (bound by
  ``mpicomm.core.fast.broadcast_in_c``, not through this module); it calls ``MPI_Bcast`` only
  while ``bcast`` here is the C module's own;

and the list forms' common calls (lists of numpy arrays of one kind, as :mod:`mpicomm.dense.small`,
:mod:`mpicomm.dense.placed` and :mod:`mpicomm.dense.exchange` make them, with the same MPI calls,
so ranks on either path match):

* ``allgather_list(x, outs, dt, c, limit)``: ``MPI_Allgather`` into a temporary, copied out;
* ``reduce_scatter_list(out, ins, dt, op, c, limit)``: ``ins`` packed, then
  ``MPI_Reduce_scatter_block``;
* ``gather_list(x, outs, root, dt, c, limit)``: ``MPI_Gatherv`` (``outs`` None off the root);
* ``exchange(recvs, sends, out, tag, dt, c)``: one ``MPI_Irecv`` and ``MPI_Isend`` per peer, the
  own entry copied, then ``MPI_Waitall`` (``all_to_all``, ``scatter``'s root, and ``all_gather`` and
  ``reduce_scatter`` past 64 KiB; an empty own entry copies nothing);

and ``jagged(values, lengths, splits, fp, bound, datatypes, i64, c, empty)``, the whole blocking
:func:`mpicomm.jagged_all_to_all` (the counts ``MPI_Alltoall``, its checks, then ``MPI_Alltoallv``
of the lengths unless they rode in the counts message, and of the values): it returns
``(lengths, values, splits)``, or, after the counts message, the counts received when anything in
them is not the common case, for the Python path to finish (see ``_cmpi_jagged.c``).

``kjt_repeat(header, got, expect, values, sc, sd, out, rc, rd, segs, tmp, i64, dt, c)`` makes a
:class:`mpicomm.KJTAllToAll` call whose counts message repeats one already checked (its
``MPI_Alltoall``, then its ``MPI_Alltoallv`` and recat, see ``_cmpi_jagged.c``): it returns True,
or False after the counts message when that differs from ``expect``.

The front door's C form, which makes no MPI call, is an extension of its own beside the front door
(``mpicomm/front/_door.c``, :mod:`mpicomm.front.door`); ``switched_off()`` turns both off.

No buffer that is written may share memory with another, or the function returns ``NotImplemented``.

Each returns None once MPI has made the call, raises mpi4py's ``MPI.Exception`` on an MPI error,
and returns ``NotImplemented`` *before any MPI call that communicates* (only the local
``MPI_Comm_size`` and ``MPI_Comm_rank`` may have run) when it cannot serve the arguments (not a
C-contiguous numpy array, a read-only output, sizes that do not match, a count over 2**31 - 1).
A caller then makes the mpi4py call, whose checks and messages are the ones users see::

    if cmpi.allreduce(x, dt, op, comm) is NotImplemented:
        comm.Allreduce(MPI.IN_PLACE, [x, dt], op)

Until :func:`bind` succeeds (MPI not started yet, no C compiler at install, an MPI whose library
cannot be found, or ``MPICOMM_C=0``) every function here returns ``NotImplemented``, so mpicomm
behaves exactly as with mpi4py alone.

Binding needs no MPI headers: the functions are looked up where mpi4py's own calls find them
(the global scope first, so that a PMPI tool in ``LD_PRELOAD`` sees these calls too, then the
libmpi that mpi4py's extension module depends on), the handle
width comes from ``MPI._sizeof`` (MPICH's ABI: C ints; Open MPI's and the MPI-5 standard ABI:
pointers), ``MPI_IN_PLACE`` from ``int(MPI.IN_PLACE)``, and where mpi4py keeps a handle inside its
objects from ``MPI._addressof``. Each of these is checked (every handle kind of one width, handles
read back against ``.handle``, one ``MPI_Allreduce`` on ``MPI_COMM_SELF``) before the module is
used. The datatypes the callers pass are those mpicomm caches for the arrays' own dtypes, whose
size is the dtype's itemsize: the C side counts elements as bytes over itemsize.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from .. import _mpi
from . import algorithms, pieces

__all__ = [
    "allgather",
    "allgather_list",
    "allreduce",
    "alltoall",
    "alltoallv",
    "bcast",
    "bind",
    "bound",
    "exchange",
    "gather_list",
    "jagged",
    "kjt_repeat",
    "recv",
    "reduce",
    "reduce_scatter_block",
    "reduce_scatter_list",
    "send",
    "sendrecv",
    "sendrecv_checked",
    "switched_off",
]


def _unbound(*args: Any) -> Any:
    return NotImplemented


allreduce = reduce = bcast = allgather = reduce_scatter_block = alltoall = alltoallv = send = recv = _unbound
sendrecv = sendrecv_checked = _unbound
allgather_list = reduce_scatter_list = gather_list = exchange = jagged = kjt_repeat = _unbound
_NAMES = tuple(name for name in __all__ if name not in ("bind", "bound", "switched_off"))  # the C functions
_why = "not bound yet (MPI not started)"


def bound() -> str | None:
    """None when the C calls are in use, else why not (for ``python -m mpicomm info`` and the bench).

    Example:
        >>> import mpicomm
        >>> _ = mpicomm.init()
        >>> bound() is None or isinstance(bound(), str)
        True
    """
    return None if allreduce is not _unbound else _why


def switched_off() -> bool:
    """Whether ``MPICOMM_C`` switches the C module off (``0``, ``off``, ``no`` or ``false``).

    Then neither its MPI calls (:func:`bind`) nor the front door's C form are used.

    Example:
        >>> isinstance(switched_off(), bool)
        True
    """
    return os.environ.get("MPICOMM_C", "1").strip() in ("0", "off", "no", "false")


def bind() -> None:
    """Bind the C module to the running MPI; leave the mpi4py path in place if anything is off.

    Called by :func:`mpicomm.init` once MPI has started. Idempotent.
    """
    global _why
    if allreduce is not _unbound:
        return
    pieces.reload()  # the mpi4py path cuts alike (a bad value raises here, at start-up)
    if switched_off():
        _why = "switched off (MPICOMM_C=0)"
        return
    try:
        from . import _cmpi  # type: ignore[attr-defined]
    except ImportError as exc:
        _why = f"the C module is not built ({exc})"
        return
    try:
        _bind(_cmpi)
    except (OSError, AttributeError, ValueError, TypeError, RuntimeError) as exc:
        _why = f"binding failed: {exc}"
        return
    globals().update({name: getattr(_cmpi, name) for name in _NAMES})
    _why = ""
    algorithms.install(_cmpi)  # MPICH's point-to-point algorithm for large allreduce/bcast
    pieces.install(_cmpi)


def _lookup(scopes: tuple[Any, ...], name: str) -> Any:
    for scope in scopes:
        try:
            return getattr(scope, name)
        except AttributeError:
            continue
    raise AttributeError(f"{name} is in no loaded MPI library")


def _bind(module: Any) -> None:
    MPI = _mpi.MPI
    # mpi4py's own calls bind as the dynamic linker binds them: the global scope first (a PMPI
    # tool in LD_PRELOAD, a libmpi loaded globally), then the libmpi its extension depends on
    scopes = (ctypes.CDLL(None), ctypes.CDLL(MPI.__file__, mode=os.RTLD_NOLOAD | os.RTLD_LAZY))
    addresses = tuple(ctypes.cast(_lookup(scopes, name), ctypes.c_void_p).value for name in module.names())
    width = MPI._sizeof(MPI.Comm)
    if width not in (ctypes.sizeof(ctypes.c_int), ctypes.sizeof(ctypes.c_void_p)):
        raise ValueError(f"MPI handles of {width} bytes")
    others = {MPI._sizeof(kind) for kind in (MPI.Datatype, MPI.Op, MPI.Request)}
    if others != {width}:
        raise ValueError(f"MPI handles of different widths ({width} and {sorted(others)} bytes)")
    samples = (MPI.COMM_SELF, MPI.COMM_WORLD, MPI.FLOAT, MPI.DOUBLE, MPI.SUM, MPI.MAX)
    offsets = {MPI._addressof(x) - id(x) for x in samples}
    if len(offsets) != 1:
        raise ValueError(f"mpi4py keeps handles at offsets {sorted(offsets)}")
    int_handles = width == ctypes.sizeof(ctypes.c_int) and width != ctypes.sizeof(ctypes.c_void_p)
    module.bind(
        addresses,
        int_handles,
        int(MPI.IN_PLACE),
        offsets.pop(),
        MPI.Comm,
        MPI.Datatype,
        MPI.Op,
        np.ndarray,
        MPI.Exception,
        MPI._sizeof(MPI.Status),
        MPI.BYTE,
    )
    for x in samples:
        got = module.handle(x)
        want = x.handle if int_handles else ctypes.c_void_p(x.handle).value
        if got is None or (got - want) % (1 << 64 if not int_handles else 1 << 32):
            raise ValueError(f"read handle {got} for {x!r}, mpi4py says {x.handle}")
    # one call through the binding, on this process alone
    probe = np.array([3.0, 4.0])
    answer = module.allreduce(probe, MPI.DOUBLE, MPI.SUM, MPI.COMM_SELF)
    if answer is not None or probe.tolist() != [3.0, 4.0]:
        raise RuntimeError("a probe MPI_Allreduce on MPI_COMM_SELF gave a wrong answer")
