"""Sparse COO all-reduce: gather every rank's indices and values, then coalesce (as torch's Gloo does).

torch's Gloo backend reduces a sparse COO tensor in ``all_reduce`` by gathering all ranks'
non-zeros and summing duplicates; only SUM is defined. :func:`all_reduce_sparse` does the same.
``mpicomm.all_reduce`` hands a sparse tensor here from the front door's slow path (a sparse
tensor never reaches the numpy fast path), which keeps dense calls at their cost. torch is imported
only when a sparse tensor arrives.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..core.groups import ProcessGroup, resolve, warn_non_member
from ..core.reduce_op import ReduceOp
from ..core.watchdog import Site, timed
from ..core.work import Work, completed
from ..dense import gathers
from ..errors import ArgumentError, ArgumentTypeError
from . import kinds

__all__ = ["all_reduce_sparse", "is_sparse"]

_SUM = ReduceOp.SUM


def is_sparse(x: object) -> bool:
    """Whether ``x`` is a torch sparse COO tensor (without importing torch).

    Example:
        >>> import numpy as np
        >>> is_sparse(np.zeros(2))
        False
    """
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor) and x.layout == torch.sparse_coo


@timed(Site("all_reduce_sparse"))
def all_reduce_sparse(
    tensor: Any,
    op: ReduceOp = _SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Work | None:
    """Sum a torch sparse COO ``tensor`` over the group, in place (torch Gloo's sparse all_reduce).

    Every rank's indices and values are gathered (uneven counts, no padding), concatenated and
    coalesced, so every rank ends with the same coalesced sum.

    ======  =====================  ======================================
    rank    tensor in (index: v)   tensor out
    ======  =====================  ======================================
    0       {0: 1}                 {0: 2, 1: 1}
    1       {0: 1, 1: 1}           {0: 2, 1: 1}
    ======  =====================  ======================================

    Args:
        tensor: A sparse COO tensor of the same shape and dtype on every rank.
        op: Must be ``ReduceOp.SUM``.
        group: The process group; ``None`` for the world.
        async_op: Return a completed :class:`~mpicomm.Work` (the call has already blocked).

    Returns:
        A Work if ``async_op``, else None.

    Raises:
        ArgumentError: an op other than SUM (densify with ``tensor.to_dense()`` for others).

    Example:
        >>> import torch, mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> t = torch.sparse_coo_tensor([[r]], [1.0], (w,))
        >>> mpicomm.all_reduce_sparse(t)
        >>> t.to_dense().tolist() == [1.0] * w
        True
    """
    fn = "all_reduce_sparse"
    if not is_sparse(tensor):
        raise ArgumentTypeError(
            f"{fn}: tensor is a {type(tensor).__qualname__}; expected a torch sparse COO tensor "
            "(dense arrays: all_reduce)"
        )
    if op != _SUM:
        raise ArgumentError(
            f"{fn}: op is {op!r} on a sparse COO tensor; expected ReduceOp.SUM (the only sparse "
            "reduction, as in torch's Gloo backend), or pass tensor.to_dense() for other ops"
        )
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    torch = sys.modules["torch"]
    local = tensor.coalesce()
    indices = local.indices().t().contiguous()  # one row of sparse_dim int64 per non-zero
    values = local.values().contiguous()
    counts = np.empty(g.size(), dtype=np.int64)
    gathers.all_gather_into_tensor(counts, np.array([indices.shape[0]], dtype=np.int64), g)
    sizes = counts.tolist()
    all_indices = [torch.empty((n, indices.shape[1]), dtype=indices.dtype) for n in sizes]
    all_values = [torch.empty((n, *values.shape[1:]), dtype=values.dtype) for n in sizes]
    for outs, mine, arg in ((all_indices, indices, "indices"), (all_values, values, "values")):
        views = [kinds.torch_view(t, fn, arg, write=True) for t in outs]
        gathers.all_gather(views, kinds.torch_view(mine, fn, arg, write=False), g)
    total = torch.sparse_coo_tensor(
        torch.cat(all_indices).t(), torch.cat(all_values), tuple(tensor.shape), dtype=tensor.dtype
    ).coalesce()
    tensor.copy_(total)
    return completed([tensor]) if async_op else None
