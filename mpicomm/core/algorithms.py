"""MPICH's point-to-point algorithm for large intra-node ``all_reduce`` and ``broadcast``.

Why: below ``MPI_THREAD_MULTIPLE`` (mpicomm's default level is ``serialized``) MPICH reduces and
broadcasts between the ranks of a node with its shared-memory "release_gather" algorithm, whose
ranks spin on flags in a small shared buffer. It is the fastest below about 16 KiB, and 2-5x slower
than MPICH's point-to-point algorithm ("mpir") from 64 KiB on: a 2-rank ``MPI_Allreduce`` of 1 MiB
took 0.58 ms against 0.23 ms, of 16 MiB 12.3 ms against 3.9 ms (the quiet 2-core machine, 28 Nov
2026; docs/benchmarks.rst). At ``multiple`` MPICH never uses release_gather, which is why an mpi4py
program (mpi4py starts MPI at ``multiple``) did not see it and a port to mpicomm did.

What: once the C calls are bound (:func:`mpicomm.core.cmpi.bind`), :func:`install` hands the C
module MPICH's two selection variables (``MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM``,
``MPIR_CVAR_BCAST_POSIX_INTRA_ALGORITHM``) through MPI's tool interface. A C ``allreduce`` or
``bcast`` of at least :data:`FROM` bytes then writes the point-to-point value before its MPI call
and MPICH's default back after it; smaller calls keep release_gather. Every rank of a collective has
the same message size, and below ``multiple`` one thread at a time is inside MPI, so all ranks
choose alike and no other call sees the switched value.

Left alone: a variable the user set (in the environment under any of MPICH's names, or through the
tool interface: a call finds a value other than the default and keeps it), MPI libraries other
than MPICH, ``multiple``, and the mpi4py path (``MPICOMM_C=0``). ``MPICOMM_MPICH_P2P_FROM`` sets the
size in bytes (``0`` turns the switch off).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterator
from typing import Any

from .. import _mpi
from ..sizes import parse_size

__all__ = [
    "ALLREDUCE",
    "BCAST",
    "FROM",
    "VARIABLES",
    "install",
    "installed",
    "large",
    "switches",
    "threshold",
]

#: The smallest message (bytes) sent with the point-to-point algorithm; ``MPICOMM_MPICH_P2P_FROM``.
FROM = 64 * 1024
#: The selection variables, in the C module's order (allreduce, bcast).
VARIABLES = ("MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM", "MPIR_CVAR_BCAST_POSIX_INTRA_ALGORITHM")
#: The calls :func:`large` takes (the C module's numbering).
ALLREDUCE, BCAST = 0, 1
# MPICH's values of these variables (its generated enum: mpir, release_gather, auto)
_MPIR, _AUTO = 0, 2


class _State:
    installed: tuple[str, ...] = ()
    module: Any = None


def threshold() -> int:
    """The smallest message switched, in bytes (``MPICOMM_MPICH_P2P_FROM``, :data:`FROM` unset; 0: off).

    The variable is a byte count with an optional binary unit (``65536``, ``64K``), as
    ``MPICOMM_STAGING_CHUNK`` is (:func:`mpicomm.sizes.parse_size`).

    Raises:
        ArgumentError: the variable is not a byte count.

    Example:
        >>> from mpicomm.core import algorithms
        >>> algorithms.threshold() >= 0
        True
    """
    raw = os.environ.get("MPICOMM_MPICH_P2P_FROM", "").strip()
    return parse_size(raw, "init", "environment variable MPICOMM_MPICH_P2P_FROM") if raw else FROM


def _user_set(variable: str) -> bool:
    tail = variable.removeprefix("MPIR_CVAR_")
    return any(name in os.environ for name in (variable, "MPICH_" + tail, "MPIR_PARAM_" + tail))


def install(module: Any) -> tuple[str, ...]:
    """Hand the C module ``module`` the switch of each variable it may use; the variables installed.

    Does nothing (returns ``()``) where MPI is not MPICH, MPI runs at ``multiple``, the size is 0,
    or MPI's tool interface does not offer the variables.

    Example:
        >>> import mpicomm
        >>> from mpicomm.core import algorithms
        >>> _ = mpicomm.init()
        >>> set(algorithms.installed()) <= set(algorithms.VARIABLES)
        True
    """
    MPI = _mpi.MPI
    start = threshold()
    if MPI is None or start == 0 or "MPICH" not in MPI.Get_library_version():
        return ()
    if MPI.Query_thread() >= MPI.THREAD_MULTIPLE:  # MPICH uses no release_gather there
        return ()
    try:
        lib = ctypes.CDLL(MPI.__file__)  # dlsym here also searches the libmpi mpi4py links
        provided = ctypes.c_int()
        if lib.MPI_T_init_thread(0, ctypes.byref(provided)) != 0:  # kept open: the handles live on
            return ()
        read = ctypes.cast(lib.MPI_T_cvar_read, ctypes.c_void_p).value
        write = ctypes.cast(lib.MPI_T_cvar_write, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return ()
    done = []
    for which, variable in enumerate(VARIABLES):
        if _user_set(variable):
            continue
        index, count, handle, value = ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p(), ctypes.c_int(-1)
        if lib.MPI_T_cvar_get_index(variable.encode(), ctypes.byref(index)) != 0:
            continue
        if lib.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle), ctypes.byref(count)) != 0:
            continue
        if count.value != 1 or lib.MPI_T_cvar_read(handle, ctypes.byref(value)) != 0 or value.value != _AUTO:
            lib.MPI_T_cvar_handle_free(ctypes.byref(handle))
            continue
        module.switch_algorithm(which, read, write, handle.value, _AUTO, _MPIR, start)
        done.append(variable)
    _State.installed, _State.module = tuple(done), module
    return _State.installed


def installed() -> tuple[str, ...]:
    """The selection variables the C calls switch (empty where nothing is switched).

    Example:
        >>> from mpicomm.core import algorithms
        >>> isinstance(algorithms.installed(), tuple)
        True
    """
    return _State.installed


def switches() -> tuple[int, int]:
    """How many C ``allreduce`` and ``bcast`` calls ran with the point-to-point algorithm so far.

    Example:
        >>> from mpicomm.core import algorithms
        >>> all(n >= 0 for n in algorithms.switches())
        True
    """
    if _State.module is None:
        return (0, 0)
    got = _State.module.algorithm_switches()
    return (int(got[0]), int(got[1]))


@contextlib.contextmanager
def large(which: int, nbytes: int) -> Iterator[None]:
    """The C calls' choice of algorithm around an MPI call made outside them.

    For an ``MPI_Allreduce`` (:data:`ALLREDUCE`) or ``MPI_Bcast`` (:data:`BCAST`) of ``nbytes``
    made by mpi4py or on a device buffer, so that ranks taking different paths for one call agree
    on MPICH's algorithm.

    Example:
        >>> import numpy as np, mpicomm
        >>> from mpi4py import MPI
        >>> from mpicomm.core import algorithms
        >>> _ = mpicomm.init()
        >>> x = np.ones(4)
        >>> with algorithms.large(algorithms.ALLREDUCE, x.nbytes):
        ...     MPI.COMM_WORLD.Allreduce(MPI.IN_PLACE, x)
        >>> bool(x[0] == mpicomm.get_world_size())
        True
    """
    module = _State.module
    if module is None or not _State.installed:
        yield
        return
    on = module.algorithm_enter(which, nbytes)
    try:
        yield
    finally:
        module.algorithm_leave(which, on)
