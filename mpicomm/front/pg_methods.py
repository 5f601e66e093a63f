"""torch's ``ProcessGroup`` methods (c10d's): ``pg.allreduce([t])``, ``pg.broadcast``, ``pg.send``, ...

torch programs also call collectives as methods of a group object: ``group.allreduce([t]).wait()``,
``group.allreduce([t]).get_future().then(...)``. Each method here is the public call of the front
door with c10d's arguments: a list of tensors (one entry: one device per process), an options
object or ``op``/``root``/``timeout`` keywords, group ranks for roots and peers. Each returns a
:class:`~mpicomm.Work` (a completed one on a rank that is not a member).

:mod:`mpicomm.core.groups` cannot import the front door (arrows point down), so :func:`install`,
run when :mod:`mpicomm` is imported, attaches these functions to :class:`~mpicomm.ProcessGroup`.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

from ..core.groups import ProcessGroup
from ..core.reduce_op import ReduceOp
from ..core.work import Work, completed
from ..dense.reductions import barrier as _barrier
from ..dense.sync import monitored_barrier as _monitored_barrier
from ..errors import ArgumentError, ArgumentTypeError
from . import collectives

__all__ = [
    "allgather",
    "allreduce",
    "alltoall_base",
    "barrier",
    "broadcast",
    "install",
    "monitored_barrier",
    "recv",
    "reduce_scatter",
    "send",
]

Timeout = datetime.timedelta | float | None


def _op(op: Any, opts: Any, fn: str) -> ReduceOp:
    """The reduction of ``op`` or ``opts.reduceOp``: ours, or torch's by its name (``ReduceOp.SUM``)."""
    if opts is not None and hasattr(opts, "reduceOp"):
        op = opts.reduceOp
    if isinstance(op, ReduceOp):
        return op
    name = getattr(op, "name", None) or str(op).rsplit(".", 1)[-1]
    found = getattr(ReduceOp, str(name).upper(), None)
    if not isinstance(found, ReduceOp):
        raise ArgumentTypeError(f"ProcessGroup.{fn}: op is {op!r}; expected a ReduceOp")
    return found


def _one(tensors: Any, fn: str, arg: str) -> Any:
    """The single tensor of c10d's one-entry list (or the tensor itself)."""
    if isinstance(tensors, (list, tuple)):
        if len(tensors) != 1:
            raise ArgumentError(
                f"ProcessGroup.{fn}: {arg} has {len(tensors)} entries; expected 1 (one tensor per process)"
            )
        return tensors[0]
    return tensors


def _work(out: Work | None) -> Work:
    return completed() if out is None else out


def allreduce(
    self: ProcessGroup, tensors: Any, opts: Any = None, *, op: Any = ReduceOp.SUM, timeout: Timeout = None
) -> Work:
    """``pg.allreduce([tensor], opts)`` or ``pg.allreduce(tensor, op=...)``: all_reduce on this group.

    Example:
        >>> import numpy as np, mpicomm
        >>> x = np.ones(2)
        >>> mpicomm.init().allreduce([x]).wait()
        True
    """
    if opts is not None and not hasattr(opts, "reduceOp"):
        op, opts = opts, None  # c10d's positional op: pg.allreduce([t], ReduceOp.MAX)
    tensor = _one(tensors, "allreduce", "tensors")
    return _work(collectives.all_reduce(tensor, _op(op, opts, "allreduce"), self, True))


def broadcast(
    self: ProcessGroup, tensors: Any, opts: Any = None, *, root: int = 0, timeout: Timeout = None
) -> Work:
    """``pg.broadcast([tensor], opts)`` or ``pg.broadcast(tensor, root)``; ``root`` is a group rank."""
    if opts is not None and hasattr(opts, "rootRank"):
        root = opts.rootRank
    elif isinstance(opts, int):
        root = opts
    tensor = _one(tensors, "broadcast", "tensors")
    return _work(collectives.broadcast(tensor, None, self, True, group_src=root))


def allgather(self: ProcessGroup, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Work:
    """``pg.allgather([[out0, out1, ...]], [input])`` or ``pg.allgather([out0, ...], input)``."""
    outputs = output_tensors
    if isinstance(input_tensors, (list, tuple)):
        outputs = _one(output_tensors, "allgather", "output_tensors")
    tensor = _one(input_tensors, "allgather", "input_tensors")
    return _work(collectives.all_gather(outputs, tensor, self, True))


def reduce_scatter(
    self: ProcessGroup, output_tensors: Any, input_tensors: Any, opts: Any = None, *, op: Any = ReduceOp.SUM
) -> Work:
    """``pg.reduce_scatter([out], [[in0, in1, ...]], opts)`` or ``pg.reduce_scatter(out, [in0, ...])``."""
    if opts is not None and not hasattr(opts, "reduceOp"):
        op, opts = opts, None
    output = _one(output_tensors, "reduce_scatter", "output_tensors")
    inputs = input_tensors
    if isinstance(output_tensors, (list, tuple)):
        inputs = _one(input_tensors, "reduce_scatter", "input_tensors")
    return _work(collectives.reduce_scatter(output, inputs, _op(op, opts, "reduce_scatter"), self, True))


def alltoall_base(
    self: ProcessGroup,
    output: Any,
    input: Any,
    output_split_sizes: Sequence[int],
    input_split_sizes: Sequence[int],
    opts: Any = None,
) -> Work:
    """``pg.alltoall_base(output, input, output_split_sizes, input_split_sizes)`` (``[]``: even splits)."""
    out_splits = list(output_split_sizes) or None
    in_splits = list(input_split_sizes) or None
    return _work(collectives.all_to_all_single(output, input, out_splits, in_splits, self, True))


def barrier(self: ProcessGroup, opts: Any = None, *, timeout: Timeout = None) -> Work:
    """``pg.barrier()``: a barrier on this group, as a Work."""
    if opts is not None and getattr(opts, "timeout", None) is not None:
        timeout = opts.timeout
    if timeout is not None:
        _barrier(self, False, None, timeout)
        return completed()
    return _work(_barrier(self, True))


def monitored_barrier(self: ProcessGroup, timeout: Timeout = None, wait_all_ranks: bool = False) -> None:
    """``pg.monitored_barrier(timeout)``: :func:`~mpicomm.monitored_barrier` on this group."""
    _monitored_barrier(self, timeout, wait_all_ranks)


def send(self: ProcessGroup, tensors: Any, dstRank: int, tag: int = 0) -> Work:  # noqa: N803 - c10d's name
    """``pg.send([tensor], dstRank, tag)``: a non-blocking send to group rank ``dstRank``."""
    tensor = _one(tensors, "send", "tensors")
    return _work(collectives.isend(tensor, None, self, tag, group_dst=dstRank))


def recv(self: ProcessGroup, tensors: Any, srcRank: int, tag: int = 0) -> Work:  # noqa: N803 - c10d's name
    """``pg.recv([tensor], srcRank, tag)``: a non-blocking receive from group rank ``srcRank``."""
    tensor = _one(tensors, "recv", "tensors")
    return _work(collectives.irecv(tensor, None, self, tag, group_src=srcRank))


#: The methods :func:`install` attaches, by c10d's names.
METHODS: dict[str, Callable[..., Any]] = {
    "allreduce": allreduce,
    "broadcast": broadcast,
    "allgather": allgather,
    "reduce_scatter": reduce_scatter,
    "alltoall_base": alltoall_base,
    "barrier": barrier,
    "monitored_barrier": monitored_barrier,
    "send": send,
    "recv": recv,
}


def install() -> None:
    """Attach :data:`METHODS` to :class:`~mpicomm.ProcessGroup` (``rank`` and ``size`` are its own).

    Example:
        >>> import mpicomm
        >>> callable(mpicomm.ProcessGroup.allreduce)
        True
    """
    for name, method in METHODS.items():
        setattr(ProcessGroup, name, method)


install()
