"""Large host messages in the chunks device ranks send (:mod:`mpicomm.core.chunks`), as zero-copy views.

A device rank stages a large ``all_reduce``, ``broadcast``, ``reduce`` or equal-split
``all_to_all_single`` chunk by chunk, each chunk one host call; so a host rank (numpy array, torch
CPU tensor) makes the same host call on the same chunks of its own array, and ranks holding
different kinds meet in every MPI call. A C-contiguous array is cut into views; another layout is
copied once into a contiguous array (what the host code does anyway for a reduction) and, where it
is written, copied back. ``all_to_all_single``'s chunk ``[a, b)`` is columns ``a`` to ``b`` of every
destination block: a strided ``(group size, b - a)`` view, which MPI reads and writes in place
through a row datatype.

Every argument error is raised by the first chunk's host call, before any MPI call: all chunks
share the arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.groups import ProcessGroup
from ..core.reduce_op import ReduceOp
from ..core.work import Work, completed

__all__ = ["all_reduce", "all_to_all_single", "broadcast", "reduce", "run"]

#: The host implementation a chunker calls per chunk (passed in: it lives in the module that calls).
Host = Callable[..., Any]


def run(
    tensor: np.ndarray, step: int, each: Callable[[np.ndarray], Any], write: bool, async_op: bool
) -> Work | None:
    """Call ``each`` on every ``step``-byte chunk of ``tensor``'s elements, in order.

    Args:
        tensor: The array (any layout).
        step: The chunk length in bytes (a multiple of the itemsize).
        each: The host call on one chunk (a 1-D contiguous array).
        write: Whether the call writes ``tensor`` (a strided one is copied back).
        async_op: Return a completed Work (the chunks have run) instead of None.
    """
    whole = tensor.flags.c_contiguous
    flat = (tensor if whole else np.ascontiguousarray(tensor)).reshape(-1)
    n = step // tensor.itemsize
    for a in range(0, flat.size, n):
        each(flat[a : a + n])
    if write and not whole:
        np.copyto(tensor, flat.reshape(tensor.shape))
    return completed([tensor]) if async_op else None


def all_reduce(
    host: Host, tensor: np.ndarray, op: ReduceOp, g: ProcessGroup, async_op: bool, step: int
) -> Work | None:
    """``all_reduce`` chunk by chunk."""
    return run(tensor, step, lambda c: host(c, op, g), True, async_op)


def broadcast(
    host: Host, tensor: np.ndarray, root: int, g: ProcessGroup, async_op: bool, step: int
) -> Work | None:
    """``broadcast`` chunk by chunk from group rank ``root``."""
    return run(tensor, step, lambda c: host(c, group=g, group_src=root), g.rank() != root, async_op)


def reduce(
    host: Host, tensor: np.ndarray, root: int, op: ReduceOp, g: ProcessGroup, async_op: bool, step: int
) -> Work | None:
    """``reduce`` chunk by chunk to group rank ``root``."""
    return run(tensor, step, lambda c: host(c, op=op, group=g, group_dst=root), g.rank() == root, async_op)


def all_to_all_single(
    host: Host, output: np.ndarray, input: np.ndarray, g: ProcessGroup, async_op: bool, step: int
) -> Work | None:
    """Equal-split ``all_to_all_single``: chunk ``[a, b)`` moves columns ``a`` to ``b`` of every block."""
    n, whole = g.size(), output.flags.c_contiguous
    src = np.ascontiguousarray(input).reshape(n, -1)
    dst = output.reshape(n, -1) if whole else np.empty((n, output.size // n), output.dtype)
    width = step // output.itemsize
    for a in range(0, dst.shape[1], width):
        host(dst[:, a : a + width], src[:, a : a + width], group=g)
    if not whole:
        np.copyto(output, dst.reshape(output.shape))
    return completed([output]) if async_op else None
