"""MPICH's long waits sleep under torch's backend, as gloo's waits do.

A rank that waits for a late peer inside MPICH polls: it stays runnable and burns its core for the
whole wait. gloo's waits sleep on a condition variable. Where ranks share cores (more processes
than cores: a shared machine, several jobs on a node), the polling rank takes CPU time its peer and
its own next step need, and the scheduler favours a thread that slept over one that used its slice:
a table-wise torchrec DLRM step (five all-to-alls a step) spent 1.2-2.9x gloo's CPU time and
was 1.1-2.7x gloo's wall time on a loaded 2-core machine, while its fastest steps were faster than
gloo's (docs/benchmarks.rst, "torchrec step").

Where each rank has a core, polling is what makes MPI fast: on the same 2-core machine with
nothing else running, the step polling was 0.75-0.85x gloo's and sleeping 1.19-1.29x (four runs of
``--ops torchrec``). So the waits sleep only where the node is oversubscribed: more of the job's
ranks on it than it has cores (the launcher's ``LOCAL_WORLD_SIZE``, :mod:`mpicomm.c10d.launch`,
or the world size where no launcher says).

MPICH yields between polls after ``MPIR_CVAR_POLLS_BEFORE_YIELD`` empty ones (1,000); its
``MPIR_CVAR_ENABLE_HEAVY_YIELD`` makes that yield a short sleep. :func:`sleep_in_long_waits` (run when
torch makes the default group of backend ``"mpicomm"``) turns it on through MPI's tool interface
(``MPI_T_cvar_write``): MPI has started by then, so the environment is read too late. A wait shorter
than the first 1,000 polls (every small call on a quiet machine) is unchanged: the 8-byte
``all_reduce``'s fastest time is the same. A user who set the variable (to 0 or 1, under either of
MPICH's names) keeps their choice, on a machine shared with other jobs too (set it to 1 there);
other MPI libraries are left as they are.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

from .. import _mpi
from .launch import launcher_variables

__all__ = [
    "CVAR",
    "heavy_yield",
    "oversubscribed",
    "read_cvar",
    "set_heavy_yield",
    "sleep_in_long_waits",
    "write_cvar",
]

#: MPICH's control variable; ``MPICH_ENABLE_HEAVY_YIELD`` is its other name in the environment.
CVAR = "MPIR_CVAR_ENABLE_HEAVY_YIELD"
_NAMES = (CVAR, "MPICH_ENABLE_HEAVY_YIELD", "MPIR_PARAM_ENABLE_HEAVY_YIELD")


class _State:
    done = False


def _on_cvar(act: Callable[[Any, ctypes.c_void_p], int], name: str = CVAR) -> int | None:
    """``act(lib, handle)`` on MPICH's variable ``name`` via MPI's tool interface (None: it cannot run)."""
    MPI = _mpi.MPI
    if MPI is None or "MPICH" not in MPI.Get_library_version():
        return None
    try:
        # dlsym on mpi4py's extension module also searches the MPI library it was linked against
        lib = ctypes.CDLL(MPI.__file__)
        provided, index, count, handle = ctypes.c_int(), ctypes.c_int(), ctypes.c_int(), ctypes.c_void_p()
        if lib.MPI_T_init_thread(0, ctypes.byref(provided)) != 0:
            return None
        result = None
        if lib.MPI_T_cvar_get_index(name.encode(), ctypes.byref(index)) == 0 and (
            lib.MPI_T_cvar_handle_alloc(index, None, ctypes.byref(handle), ctypes.byref(count)) == 0
        ):
            result = act(lib, handle) if count.value == 1 else None
            lib.MPI_T_cvar_handle_free(ctypes.byref(handle))
        lib.MPI_T_finalize()
        return result
    except (OSError, AttributeError):  # no MPI_T in this library
        return None


def _writer(value: int) -> Callable[[Any, ctypes.c_void_p], int]:
    def write(lib: Any, handle: ctypes.c_void_p) -> int:
        return int(lib.MPI_T_cvar_write(handle, ctypes.byref(ctypes.c_int(value))) == 0)

    return write


def _read(lib: Any, handle: ctypes.c_void_p) -> int:
    value = ctypes.c_int(-1)
    lib.MPI_T_cvar_read(handle, ctypes.byref(value))
    return value.value


def oversubscribed(world_size: int, cores: int | None = None) -> bool:
    """Whether more of the job's ranks run on this node than it has cores.

    Args:
        world_size: The job's ranks, for where no launcher variable says how many share the node.
        cores: The node's cores; ``os.cpu_count()`` by default.

    Example:
        >>> from mpicomm.c10d.waiting import oversubscribed
        >>> oversubscribed(8, cores=2), oversubscribed(2, cores=2)
        (True, False)
    """
    local = launcher_variables().get("LOCAL_WORLD_SIZE")
    ranks = int(local[0]) if local is not None else world_size
    return ranks > (cores if cores is not None else os.cpu_count() or 1)


def sleep_in_long_waits(world_size: int, cores: int | None = None) -> bool:
    """Make MPICH sleep in long waits where the node is oversubscribed; whether this call turned it on.

    Runs once per process. Returns False, changing nothing, where each rank has a core
    (:func:`oversubscribed`), when the user set the variable, when MPI is not MPICH, or when MPI's
    tool interface does not offer the variable.

    Args:
        world_size: The job's ranks (see :func:`oversubscribed`).
        cores: The node's cores; ``os.cpu_count()`` by default.

    Example:
        >>> import mpicomm
        >>> from mpicomm.c10d.waiting import sleep_in_long_waits
        >>> _ = mpicomm.init()
        >>> sleep_in_long_waits(1, cores=1)  # a rank with a core of its own polls, as MPICH does
        False
    """
    if _State.done or any(n in os.environ for n in _NAMES):
        return False
    _State.done = True
    return oversubscribed(world_size, cores) and set_heavy_yield(1)


def set_heavy_yield(value: int) -> bool:
    """Set the variable (1: sleep in long waits, 0: poll); whether it was written (the bench's switch).

    Example:
        >>> import mpicomm
        >>> from mpicomm.c10d.waiting import heavy_yield, set_heavy_yield
        >>> _ = mpicomm.init()
        >>> was = heavy_yield()
        >>> set_heavy_yield(1) is False or heavy_yield() == 1
        True
        >>> _ = set_heavy_yield(was or 0)
    """
    return _on_cvar(_writer(value)) == 1


def heavy_yield() -> int | None:
    """The variable's value, read through MPI's tool interface (None where it cannot be read).

    Example:
        >>> import mpicomm
        >>> from mpicomm.c10d.waiting import heavy_yield
        >>> _ = mpicomm.init()
        >>> heavy_yield() in (0, 1, None)
        True
    """
    value = _on_cvar(_read)
    return None if value is None or value < 0 else value


def write_cvar(name: str, value: int) -> bool:
    """Set MPICH's integer control variable ``name`` through MPI's tool interface; whether it was written.

    MPICH reads its collective-selection variables at each call, so this takes effect at the next one
    (the bench switches ``MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM`` for some samples this way).

    Example:
        >>> import mpicomm
        >>> from mpicomm.c10d.waiting import CVAR, read_cvar, write_cvar
        >>> _ = mpicomm.init()
        >>> was = read_cvar(CVAR)
        >>> write_cvar(CVAR, 0) is False or read_cvar(CVAR) == 0
        True
        >>> _ = write_cvar(CVAR, was or 0)
    """
    return _on_cvar(_writer(value), name) == 1


def read_cvar(name: str) -> int | None:
    """MPICH's integer control variable ``name`` (None where it cannot be read: not MPICH, no such variable).

    Example:
        >>> import mpicomm
        >>> from mpicomm.c10d.waiting import read_cvar
        >>> _ = mpicomm.init()
        >>> read_cvar("MPIR_CVAR_NO_SUCH_VARIABLE") is None
        True
    """
    value = _on_cvar(_read, name)
    return None if value is None or value < 0 else value
