"""The in-place ``MPI_Allreduce`` every host all_reduce ends in: the C call, else mpi4py's, alike.

Ranks on either path (the C call refused, not bound, or ``MPICOMM_C=0``) make the same MPI calls:
the same pieces of a large buffer (:mod:`mpicomm.core.pieces`) and MPICH's same algorithm
(:mod:`mpicomm.core.algorithms`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _mpi
from ..core import algorithms, cmpi, pieces

__all__ = ["allreduce", "allreduce_mpi4py"]


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
    per = pieces.per_call(buf.size, buf.nbytes)
    flat = buf.reshape(-1)
    with algorithms.large(algorithms.ALLREDUCE, buf.nbytes):
        if per >= buf.size:  # one call, an empty buffer's too
            comm.Allreduce(_mpi.MPI.IN_PLACE, [buf, dt], mop)
            return
        for start in range(0, flat.size, per):
            comm.Allreduce(_mpi.MPI.IN_PLACE, [flat[start : start + per], dt], mop)
