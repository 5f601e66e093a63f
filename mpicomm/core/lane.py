"""A blocking ``send``/``recv`` run inside the engine's collective, below ``MPI_THREAD_MULTIPLE`` (MPICH).

At ``MPI_THREAD_SERIALIZED`` only one thread may be inside MPI. A program that posts an
asynchronous collective and then sends what its peer needs before that collective (gloo's idiom)
would wait for good: the send may not enter MPI while the communication thread is inside the
collective, and that collective cannot be made non-blocking, since MPI never matches a
non-blocking collective with the blocking one the peer makes (and ``MPI_Iallreduce`` plus its wait
costs 2-3x an 8-byte ``MPI_Allreduce``, measured, where the blocking fast path has 1.2x).

MPICH 4.2 and later let a program register a poll function that MPI's progress engine calls from
inside any MPI call (``MPIX_Async_start``). The engine registers one (``mpicomm/core/_lane.c``)
on its own thread as it starts; the program's blocking ``send`` or ``recv`` of a contiguous numpy
array then fills its slot, and the thread inside MPI posts it (``MPI_Isend``/``MPI_Irecv``) and
tests it there until it completes: still one thread inside MPI at a time. Elsewhere (Open MPI, an
older MPICH, a strided or device buffer, ``MPICOMM_C=0``) the call waits behind the queue, and
warns after ``mpicomm.core.engine.STALL`` seconds (docs/sharp-bits.rst).
"""

from __future__ import annotations

import atexit
import ctypes
import os
from typing import Any

from .. import _mpi

__all__ = ["DONE", "FAILED", "POSTED", "hold", "start", "started"]

#: The slot's states (mpicomm/core/_lane.c).
IDLE, POSTED, FLIGHT, DONE, FAILED = range(5)
#: MPIX_STREAM_NULL in MPICH's ABI (its mpi.h), the stream a poll function registered without one uses.
_STREAM_NULL = 0x3C000000


class _Lane:
    module: Any = None
    why = "not started (the engine starts it below MPI_THREAD_MULTIPLE)"
    held: Any = None  # the array of the message in the slot: MPI reads or writes it until it is empty


def hold(array: Any) -> None:
    """Keep ``array`` alive while its message is in the slot (None: the slot is empty again)."""
    _Lane.held = array


def started() -> Any:
    """The bound C module once :func:`start` has registered its poll function, else None."""
    return _Lane.module


def start() -> None:
    """Register the poll function; on the engine's thread as it starts (nothing else inside MPI then).

    Leaves the lane off, saying why in ``_Lane.why``, where MPI is not MPICH with ``MPIX_Async_start``,
    the C module is not built, or ``MPICOMM_C=0``.
    """
    if _Lane.module is not None:
        return
    if os.environ.get("MPICOMM_C", "1").strip() == "0":
        _Lane.why = "switched off (MPICOMM_C=0)"
        return
    try:
        from . import _lane  # type: ignore[attr-defined]
    except ImportError as exc:
        _Lane.why = f"the C module is not built ({exc})"
        return
    MPI = _mpi.MPI
    if MPI._sizeof(MPI.Comm) != ctypes.sizeof(ctypes.c_int) or not MPI.Get_library_version().startswith(
        "MPICH"
    ):
        _Lane.why = "not MPICH (MPIX_Async_start is MPICH's, MPI handles as ints)"
        return
    lib = ctypes.CDLL(MPI.__file__, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    try:
        names = ("MPIX_Async_start", "MPI_Isend", "MPI_Irecv", "MPI_Test")
        addresses = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in names]
    except AttributeError as exc:
        _Lane.why = f"this MPICH has no MPIX_Async_start ({exc})"
        return
    _lane.bind(*addresses, _STREAM_NULL)
    if _lane.start() != 0:
        _Lane.why = "MPIX_Async_start failed"
        return
    atexit.register(_lane.stop)  # after mpi4py's finaliser is registered: runs before it (LIFO)
    _Lane.module, _Lane.why = _lane, ""
