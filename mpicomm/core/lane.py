"""Point-to-point calls run inside the engine's collective, below ``MPI_THREAD_MULTIPLE`` (MPICH).

At ``MPI_THREAD_SERIALIZED`` only one thread may be inside MPI. A program that posts an
asynchronous collective and then sends what its peer needs before that collective (gloo's idiom)
would wait for good: the send may not enter MPI while the communication thread is inside the
collective, and that collective cannot be made non-blocking, since MPI never matches a
non-blocking collective with the blocking one the peer makes (and ``MPI_Iallreduce`` plus its wait
costs 2-3x an 8-byte ``MPI_Allreduce``, measured, where the blocking fast path has 1.2x).

MPICH 4.2 and later let a program register a poll function that MPI's progress engine calls from
inside any MPI call (``MPIX_Async_start``). The engine registers one (``mpicomm/core/_lane.c``)
on its own thread as it starts; the program's ``send``, ``recv``, ``isend``, ``irecv`` or
``sendrecv`` of numpy arrays (strided ones packed) then fills a slot of its ring, and the thread
inside MPI posts it (``MPI_Isend``/``MPI_Irecv``) and tests it there until it completes: still one
thread inside MPI at a time (:mod:`mpicomm.core.lane_work` hands the calls over and waits).
Elsewhere (Open MPI, an older MPICH, a device buffer, ``MPICOMM_C=0``) the call waits behind the
queue, and a blocking one warns after ``mpicomm.core.engine.STALL`` seconds (docs/sharp-bits.rst).
"""

from __future__ import annotations

import atexit
import ctypes
import os
from typing import Any

from .. import _mpi

__all__ = ["DONE", "FAILED", "POSTED", "start", "started", "tag_upper_bound"]

#: A slot's states (mpicomm/core/_lane.c).
IDLE, POSTED, FLIGHT, DONE, FAILED = range(5)
#: MPIX_STREAM_NULL in MPICH's ABI (its mpi.h), the stream a poll function registered without one uses.
_STREAM_NULL = 0x3C000000


class _Lane:
    module: Any = None
    why = "not started (the engine starts it below MPI_THREAD_MULTIPLE)"
    tag_ub: int | None = None  # MPI_TAG_UB, read as the lane starts (the program's thread may not then)


def tag_upper_bound() -> int | None:
    """``MPI_TAG_UB``, read on the engine's thread as the lane started (None before, or without it)."""
    return _Lane.tag_ub


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
    _Lane.tag_ub = int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767)  # the same on every communicator
    _lane.bind(*addresses, _STREAM_NULL)
    if _lane.start() != 0:
        _Lane.why = "MPIX_Async_start failed"
        return
    atexit.register(_lane.stop)  # after mpi4py's finaliser is registered: runs before it (LIFO)
    _Lane.module, _Lane.why = _lane, ""
