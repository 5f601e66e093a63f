"""Lazy access to ``mpi4py.MPI``, so that ``import mpicomm`` neither loads libmpi nor starts MPI.

Modules that talk to MPI read ``_mpi.MPI`` at call time. It is ``None`` until :func:`load` runs, which
:func:`mpicomm.init` does before any group exists, so every code path that holds a group may use it.
When no MPI library can be loaded, :func:`load` raises one short
:class:`~mpicomm.errors.MPIUnavailableError` that says what was tried and what to do, instead of
mpi4py's traceback; the planner and ``import mpicomm`` keep working without MPI.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .errors import MPIUnavailableError

if TYPE_CHECKING:
    from mpi4py import MPI
else:
    MPI = None

__all__ = ["MPI", "diagnose", "library_version", "load"]

_REMEDIES = """\
To fix it, one of:
  pip install "mpicomm[mpich]"              the MPICH wheel from PyPI: no system MPI needed
  module load <your MPI>                    on a cluster, so that libmpi.so is on LD_LIBRARY_PATH
  export MPI4PY_LIBMPI=/path/to/libmpi.so   point mpi4py at a library it did not find
`python -m mpicomm info` prints this diagnosis."""


def load() -> None:
    """Import ``mpi4py.MPI`` (which initialises MPI unless the user set ``mpi4py.rc``) into ``MPI``.

    Raises:
        MPIUnavailableError: mpi4py is not installed or finds no loadable MPI library.
    """
    global MPI
    if MPI is None:
        try:
            from mpi4py import MPI as module
        except (ImportError, RuntimeError, OSError) as exc:
            raise MPIUnavailableError(_explain(exc)) from None
        MPI = module


def _explain(exc: BaseException) -> str:
    """The short message for a failed ``from mpi4py import MPI``: what was tried, what to do."""
    if isinstance(exc, ImportError) and (exc.name or "").split(".")[0] == "mpi4py" and "MPI" not in str(exc):
        return f"mpicomm: mpi4py is not installed ({exc}).\n{_REMEDIES}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    tried = [line.split(":", 1)[0] for line in lines[1:] if ":" in line]
    reason = lines[1].split(":", 1)[1].strip() if len(lines) > 1 and ":" in lines[1] else (lines or [""])[0]
    shown = ", ".join(tried[:6]) + (f" and {len(tried) - 6} more" if len(tried) > 6 else "")
    env = os.environ.get("MPI4PY_LIBMPI")
    where = f" (MPI4PY_LIBMPI={env})" if env else ""
    what = f"mpi4py tried {shown}{where}: {reason}" if tried else f"mpi4py said: {reason or exc!r}"
    return f"mpicomm: no MPI library could be loaded; {what}.\n{_REMEDIES}"


def diagnose() -> str | None:
    """Try to load MPI; return the message that says why it cannot be, or None when it loads.

    Example:
        >>> diagnose() is None  # the test environment has the MPICH wheel
        True
    """
    try:
        load()
    except MPIUnavailableError as exc:
        return str(exc)
    return None


def library_version() -> str:
    """The first line of ``MPI_Get_library_version``, e.g. ``"MPICH Version: 5.0.2"``."""
    load()
    return str(MPI.Get_library_version()).strip().splitlines()[0]
