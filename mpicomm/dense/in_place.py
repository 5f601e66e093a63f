"""The in-place ``MPI_Allreduce`` every host all_reduce ends in, and the general ``reduce``'s ``MPI_Reduce``.

Ranks on either path of an all_reduce (the C call refused, not bound, or ``MPICOMM_C=0``) make the
same MPI calls: the same pieces of a large buffer (:mod:`mpicomm.core.pieces`) and MPICH's same
algorithm (:mod:`mpicomm.core.algorithms`). At ``MPI_THREAD_MULTIPLE`` (mpi4py's default level) a
large ``reduce`` goes in pieces of a third of that size: MPICH's ``MPI_Reduce`` of 2 ranks took
105-125 ms for 64 MiB whole or in 16 MiB pieces and 34-37 ms in pieces of 8-12.8 MiB. Below it
(mpicomm's default is ``serialized``) MPICH's shared-memory algorithm took 38-45 ms whole and 45-48
in pieces, so it goes whole (the 2-core machine, 29 Nov 2026).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from .. import _mpi
from ..core import algorithms, cmpi, pieces

__all__ = ["allreduce", "allreduce_mpi4py", "reduce"]


def allreduce(buf: np.ndarray, dt: Any, mop: Any, comm: Any) -> None:
    """``MPI_Allreduce`` in place on a contiguous ``buf``: the C call, else mpi4py's, cut and switched alike.

    Example:
        >>> import numpy as np, mpicomm
        >>> from mpi4py import MPI
        >>> from mpicomm.dense import in_place
        >>> _ = mpicomm.init()
        >>> x = np.ones(5)
        >>> in_place.allreduce(x, MPI.DOUBLE, MPI.SUM, MPI.COMM_WORLD)
        >>> bool((x == mpicomm.get_world_size()).all())
        True
    """
    if cmpi.allreduce(buf, dt, mop, comm) is NotImplemented:
        allreduce_mpi4py(buf, dt, mop, comm)


def allreduce_mpi4py(buf: np.ndarray, dt: Any, mop: Any, comm: Any) -> None:
    """mpi4py's in-place ``Allreduce`` on a contiguous ``buf``, in the C call's pieces and algorithm.

    Example (pieces of 16 bytes: three calls for five doubles, as the C call would make them):
        >>> import numpy as np, mpicomm
        >>> from mpi4py import MPI
        >>> from mpicomm.core import pieces
        >>> from mpicomm.dense.in_place import allreduce_mpi4py
        >>> _ = mpicomm.init()
        >>> pieces.reload({"MPICOMM_ALLREDUCE_PIECE": "16"}), pieces.per_call(5, 40)
        (16, 2)
        >>> x = np.arange(5.0)
        >>> allreduce_mpi4py(x, MPI.DOUBLE, MPI.MAX, MPI.COMM_WORLD)
        >>> x.tolist(), pieces.reload() == pieces.DEFAULT_PIECE_BYTES
        ([0.0, 1.0, 2.0, 3.0, 4.0], True)
    """
    with algorithms.large(algorithms.ALLREDUCE, buf.nbytes):
        for part in _parts(buf, pieces.piece_bytes()):
            comm.Allreduce(_mpi.MPI.IN_PLACE, [part, dt], mop)


def reduce(buf: np.ndarray, here: bool, dt: Any, mop: Any, root: int, comm: Any) -> None:
    """``MPI_Reduce`` onto ``root``, at ``multiple`` in pieces of a third of the all_reduce's (8 MiB).

    Args:
        buf: This rank's contiguous input; on the root (``here``) also the output, reduced in place.
        here: Whether this rank is the root.
        dt: The MPI datatype of the elements.
        mop: The MPI op.
        root: The root's rank in ``comm``.
        comm: The communicator.

    Example:
        >>> import numpy as np, mpicomm
        >>> from mpi4py import MPI
        >>> from mpicomm.dense import in_place
        >>> _ = mpicomm.init()
        >>> x, here = np.ones(3), MPI.COMM_WORLD.Get_rank() == 0
        >>> in_place.reduce(x, here, MPI.DOUBLE, MPI.SUM, 0, MPI.COMM_WORLD)
        >>> not here or x.tolist() == [float(mpicomm.get_world_size())] * 3
        True
    """
    place = _mpi.MPI.IN_PLACE
    for piece in _parts(buf, pieces._State.reduce):
        part = [piece, dt]
        comm.Reduce(place if here else part, part if here else None, mop, root)


def _parts(buf: np.ndarray, size: int) -> Iterator[np.ndarray]:
    """``buf``'s elements in the equal pieces :func:`mpicomm.core.pieces.per_call` cuts (one if empty)."""
    per = max(pieces.per_call(buf.size, buf.nbytes, size), 1)
    flat = buf.reshape(-1)
    for start in range(0, max(flat.size, 1), per):  # one call for an empty buffer too
        yield flat[start : start + per]
