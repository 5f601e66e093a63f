"""Small entries of ``all_gather`` and ``reduce_scatter``: one MPI collective instead of W messages.

The list forms move each rank's entry straight between list entries with point-to-point messages,
which costs no copy and matches the one-array collective from 64 KiB up. Below that, the fixed cost
of W messages dominates, so a call whose entries are all at most :data:`SMALL` bytes makes one MPI
call: ``all_gather`` an ``MPI_Allgatherv`` straight into its entries (:mod:`mpicomm.dense.placed`),
``reduce_scatter`` (entries of one size) a ``Reduce_scatter_block`` of its packed inputs.

Every rank must choose the same algorithm, so the choice depends only on what every rank of a
correct call sees alike: the entry sizes (an ``all_gather``'s list holds every rank's size, as a
``reduce_scatter``'s inputs do) and the dtype. How a rank gets there is its own business:
``all_gather`` and ``reduce_scatter`` serve a common call (world group, blocking,
validation off, C-contiguous numpy entries that share no memory) before any other check and return
False for every other call; the general path checks it and then calls
:func:`mpicomm.dense.placed.all_gather` when every entry is at most :data:`SMALL` bytes (uneven
sizes included), or ``reduce_scatter_small`` when :func:`small` says so, whatever the layouts.
(``gather`` and ``scatter`` always make one v-collective: see :mod:`mpicomm.dense.placed`.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import fast
from ..core.buffers import staged
from ..core.groups import ProcessGroup
from ..core.reduce_op import ReduceOp
from ..core.work import Work
from . import placed
from .placed import entries

__all__ = ["SMALL", "all_gather", "reduce_scatter", "reduce_scatter_small", "small"]

#: Bytes per entry up to which a list form makes one collective call.
SMALL = 64 << 10


def small(sizes: list[int], itemsize: int) -> bool:
    """Whether entries of these element counts go through one collective (one size, at most SMALL bytes).

    Example:
        >>> small([4, 4], 8), small([4, 5], 8), small([1 << 20] * 2, 8)
        (True, False, False)
    """
    return bool(sizes) and all(n == sizes[0] for n in sizes) and sizes[0] * itemsize <= SMALL


def all_gather(w: ProcessGroup, outs: Any, x: Any) -> bool:
    """Serve a common ``all_gather`` (see the module), or return False."""
    dt = fast.dt_in(x)
    if dt is None or x.nbytes > SMALL:
        return False
    owners: set[int] = set()
    if not entries(outs, w._size, dt, x.size, True, owners, SMALL) or not entries(
        [x], 1, dt, x.size, False, owners
    ):
        return False
    placed.all_gather(w.comm, outs, x, -1, False)
    return True


def reduce_scatter(w: ProcessGroup, out: Any, ins: Any, op: Any) -> bool:
    """Serve a common ``reduce_scatter`` (see the module), or return False."""
    if type(op) is not ReduceOp or not op._plain or fast.dt_out(out) is None or out.nbytes > SMALL:
        return False
    pair = op._ops.get(out.dtype)
    owners: set[int] = set()
    if pair is None or not entries([out], 1, pair[0], out.size, True, owners, SMALL):
        return False
    if not entries(ins, w._size, pair[0], out.size, False, owners, SMALL):
        return False
    reduce_scatter_small(w.comm, out, ins, pair[0], pair[1])
    return True


def reduce_scatter_small(
    comm: Any, out: np.ndarray, ins: list[np.ndarray], dt: Any, mop: Any, async_op: bool = False
) -> Any:
    """``Reduce_scatter_block`` of the concatenated ``ins`` into ``out`` (any layout, writeable).

    Returns:
        None, or a :class:`~mpicomm.Work` if ``async_op``.
    """
    packed = np.concatenate([x.reshape(-1) for x in ins])
    buf, back = staged(out)
    if async_op:
        req = comm.Ireduce_scatter_block([packed, dt], [buf, dt], mop)
        return Work([req], keep=(packed, buf), result=[out], finish=back, fn="reduce_scatter")
    comm.Reduce_scatter_block([packed, dt], [buf, dt], mop)
    if back is not None:
        back()
    return None
