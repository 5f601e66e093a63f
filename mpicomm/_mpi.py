"""Lazy access to ``mpi4py.MPI``, so that ``import mpicomm`` neither loads libmpi nor starts MPI.

Modules that talk to MPI read ``_mpi.MPI`` at call time. It is ``None`` until :func:`load` runs, which
:func:`mpicomm.init` does before any group exists, so every code path that holds a group may use it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mpi4py import MPI
else:
    MPI = None

__all__ = ["MPI", "library_version", "load"]


def load() -> None:
    """Import ``mpi4py.MPI`` (which initialises MPI unless the user set ``mpi4py.rc``) into ``MPI``."""
    global MPI
    if MPI is None:
        from mpi4py import MPI as module

        MPI = module


def library_version() -> str:
    """The first line of ``MPI_Get_library_version``, e.g. ``"MPICH Version: 5.0.2"``."""
    load()
    return str(MPI.Get_library_version()).strip().splitlines()[0]
