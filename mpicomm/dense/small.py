"""Small entries of ``all_gather`` and ``reduce_scatter``: one MPI collective instead of W messages.

The list forms move each rank's entry straight between list entries with point-to-point messages,
which costs no copy and matches the one-array collective from 64 KiB up. Below that, the fixed cost
of W messages dominates, so a call whose entries are all at most :data:`SMALL` bytes makes one MPI
call through a temporary: ``all_gather`` (entries of one size) an ``Allgather`` copied out into its
entries, ``reduce_scatter`` a ``Reduce_scatter_block`` of its packed inputs.

Every rank must choose the same algorithm, so the choice depends only on what every rank of a
correct call sees alike: the entry sizes (an ``all_gather``'s list holds every rank's size, as a
``reduce_scatter``'s inputs do) and the dtype. How a rank gets there is its own business:
``all_gather`` and ``reduce_scatter`` serve a common call (world group, blocking,
validation off, C-contiguous numpy entries that share no memory) before any other check and return
False for every other call; the general path checks it and then calls ``gather_small`` or
``reduce_scatter_small`` when :func:`small` says so, whatever the layouts. (``gather`` always
makes one v-collective: see :mod:`mpicomm.dense.placed`.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import cmpi, fast
from ..core.buffers import _DATATYPES, staged
from ..core.groups import ProcessGroup
from ..core.reduce_op import ReduceOp
from ..core.work import completed
from .placed import entries

__all__ = ["SMALL", "all_gather", "gather_small", "reduce_scatter", "reduce_scatter_small", "small"]

#: Bytes per entry up to which a list form goes through one collective and a temporary.
SMALL = 64 << 10


def _copy_out(outs: list[np.ndarray], tmp: np.ndarray, counts: list[int]) -> None:
    start = 0
    for o, n in zip(outs, counts, strict=True):
        o[...] = tmp[start : start + n].reshape(o.shape)
        start += n


def small(sizes: list[int], itemsize: int) -> bool:
    """Whether entries of these element counts go through one collective (one size, at most SMALL bytes).

    Example:
        >>> small([4, 4], 8), small([4, 5], 8), small([1 << 20] * 2, 8)
        (True, False, False)
    """
    return bool(sizes) and all(n == sizes[0] for n in sizes) and sizes[0] * itemsize <= SMALL


def all_gather(w: ProcessGroup, outs: Any, x: Any) -> bool:
    """Serve a common ``all_gather`` (see the module), or return False."""
    dt = _DATATYPES.get(x.dtype) if type(x) is np.ndarray else None
    if dt is None:
        return False
    if cmpi.allgather_list(x, outs, dt, w.comm, SMALL) is None:
        return True
    if fast.dt_in(x) is None or x.nbytes > SMALL:
        return False
    owners: set[int] = set()
    if not entries(outs, w._size, dt, x.size, True, owners, SMALL) or not entries(
        [x], 1, dt, x.size, False, owners
    ):
        return False
    gather_small(w.comm, outs, x, dt)
    return True


def gather_small(comm: Any, outs: list[np.ndarray], x: np.ndarray, dt: Any, async_op: bool = False) -> Any:
    """``Allgather`` of ``x`` (any layout) into a temporary, copied out into ``outs``.

    Returns:
        None, or a :class:`~mpicomm.Work` if ``async_op`` (it copies out when it completes).
    """
    n = x.size
    tmp = np.zeros(len(outs) * n, x.dtype)  # a short message leaves zeros, never earlier bytes
    send = x if x.flags.c_contiguous else np.ascontiguousarray(x)
    comm.Allgather([send, dt], [tmp, dt])
    _copy_out(outs, tmp, [n] * len(outs))
    return completed(outs) if async_op else None


def reduce_scatter(w: ProcessGroup, out: Any, ins: Any, op: Any) -> bool:
    """Serve a common ``reduce_scatter`` (see the module), or return False."""
    if type(op) is not ReduceOp or not op._plain or type(out) is not np.ndarray:
        return False
    pair = op._ops.get(out.dtype)
    if pair is not None and cmpi.reduce_scatter_list(out, ins, pair[0], pair[1], w.comm, SMALL) is None:
        return True
    if fast.dt_out(out) is None or out.nbytes > SMALL:
        return False
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
    comm.Reduce_scatter_block([packed, dt], [buf, dt], mop)
    if back is not None:
        back()
    return completed([out]) if async_op else None
