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
from ..dense.sync import barrier as _barrier
from ..dense.sync import monitored_barrier as _monitored_barrier
from ..errors import ArgumentError
from ..front import coalesced, collectives
from . import options

__all__ = [
    "allgather",
    "allreduce",
    "allreduce_coalesced",
    "alltoall",
    "alltoall_base",
    "barrier",
    "broadcast",
    "gather",
    "install",
    "monitored_barrier",
    "recv",
    "reduce",
    "reduce_scatter",
    "scatter",
    "send",
]

Timeout = datetime.timedelta | float | None


def _op(op: Any, opts: Any, fn: str) -> ReduceOp:
    """The reduction of ``op`` or ``opts.reduceOp`` (:func:`mpicomm.c10d.options.reduction`)."""
    if opts is not None and hasattr(opts, "reduceOp"):
        op = opts.reduceOp
    return options.reduction(op, f"ProcessGroup.{fn}")


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

    Args:
        self: The process group.
        tensors: A one-entry list (c10d's) or the tensor itself; reduced in place.
        opts: An options object with ``reduceOp`` (torch's ``AllreduceOptions``), or the op itself.
        op: The reduction, ours or torch's by name (``ReduceOp.MAX``).
        timeout: Accepted; see :func:`~mpicomm.barrier` for what timeouts bound.

    Returns:
        The Work of the reduction.

    Raises:
        ArgumentError: a list of other than one tensor.
        ArgumentTypeError: an op that is not a reduction.

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
    """``pg.broadcast([tensor], opts)`` or ``pg.broadcast(tensor, root)``; ``root`` is a group rank.

    Args:
        self: The process group.
        tensors: A one-entry list or the tensor itself.
        opts: An options object with ``rootRank`` (torch's ``BroadcastOptions``), or the root.
        root: The group rank of the source.
        timeout: Accepted; see :func:`~mpicomm.barrier` for what timeouts bound.

    Returns:
        The Work of the broadcast.

    Example:
        >>> import numpy as np, mpicomm
        >>> x = np.full(2, float(mpicomm.get_rank()))
        >>> mpicomm.init().broadcast([x], 0).wait() and float(x[0]) == 0.0
        True
    """
    tensor = _one(tensors, "broadcast", "tensors")
    return _work(collectives.broadcast(tensor, None, self, True, group_src=options.root(opts, root)))


def allgather(self: ProcessGroup, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Work:
    """``pg.allgather([[out0, out1, ...]], [input])`` or ``pg.allgather([out0, ...], input)``.

    Args:
        self: The process group.
        output_tensors: One tensor per group rank (inside a one-entry list, as c10d's).
        input_tensors: This rank's tensor (inside a one-entry list, as c10d's).
        opts: Accepted (torch's ``AllgatherOptions``).

    Returns:
        The Work of the gather.

    Example:
        >>> import numpy as np, mpicomm
        >>> outs = [np.empty(1) for _ in range(mpicomm.get_world_size())]
        >>> mpicomm.init().allgather([outs], [np.ones(1)]).wait()
        True
    """
    outputs = output_tensors
    if isinstance(input_tensors, (list, tuple)):
        outputs = _one(output_tensors, "allgather", "output_tensors")
    tensor = _one(input_tensors, "allgather", "input_tensors")
    return _work(collectives.all_gather(outputs, tensor, self, True))


def reduce_scatter(
    self: ProcessGroup, output_tensors: Any, input_tensors: Any, opts: Any = None, *, op: Any = ReduceOp.SUM
) -> Work:
    """``pg.reduce_scatter([out], [[in0, in1, ...]], opts)`` or ``pg.reduce_scatter(out, [in0, ...])``.

    Args:
        self: The process group.
        output_tensors: This rank's result (inside a one-entry list, as c10d's).
        input_tensors: One tensor per group rank (inside a one-entry list, as c10d's).
        opts: An options object with ``reduceOp``, or the op itself.
        op: The reduction.

    Returns:
        The Work of the reduction.

    Example:
        >>> import numpy as np, mpicomm
        >>> w = mpicomm.get_world_size()
        >>> out = np.empty(1)
        >>> mpicomm.init().reduce_scatter([out], [[np.ones(1) for _ in range(w)]]).wait()
        True
    """
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
    """``pg.alltoall_base(output, input, output_split_sizes, input_split_sizes)`` (``[]``: even splits).

    Args:
        self: The process group.
        output: Receives the rows from every rank, in rank order.
        input: The rows to send, split along dim 0.
        output_split_sizes: Rows from each rank; ``[]`` for even splits.
        input_split_sizes: Rows to each rank; ``[]`` for even splits.
        opts: Accepted (torch's ``AllToAllOptions``).

    Returns:
        The Work of the exchange.

    Example:
        >>> import numpy as np, mpicomm
        >>> w = mpicomm.get_world_size()
        >>> out = np.empty(w)
        >>> mpicomm.init().alltoall_base(out, np.arange(float(w)), [], []).wait()
        True
    """
    out_splits = list(output_split_sizes) or None
    in_splits = list(input_split_sizes) or None
    return _work(collectives.all_to_all_single(output, input, out_splits, in_splits, self, True))


def reduce(
    self: ProcessGroup, tensors: Any, opts: Any = None, op: Any = ReduceOp.SUM, *, root: int = 0
) -> Work:
    """``pg.reduce([tensor], opts)`` or ``pg.reduce(tensor, root, op)``: reduce onto group rank ``root``.

    Args:
        self: The process group.
        tensors: A one-entry list or the tensor itself; the root's is overwritten with the result.
        opts: torch's ``ReduceOptions`` (``reduceOp``, ``rootRank``), or the root (c10d's overload).
        op: The reduction (c10d's overload), ours or torch's by name.
        root: The group rank of the destination.

    Returns:
        The Work of the reduction.

    Example:
        >>> import numpy as np, mpicomm
        >>> x, w = np.ones(2), mpicomm.get_world_size()
        >>> mpicomm.init().reduce([x], 0).wait() and float(x[0]) == (w if mpicomm.get_rank() == 0 else 1)
        True
    """
    tensor = _one(tensors, "reduce", "tensors")
    reduction = _op(op, opts, "reduce")
    return _work(collectives.reduce(tensor, None, reduction, self, True, group_dst=options.root(opts, root)))


def gather(
    self: ProcessGroup, output_tensors: Any, input_tensors: Any, opts: Any = None, *, root: int = 0
) -> Work:
    """``pg.gather([[out0, out1, ...]], [input], opts)`` or ``pg.gather([out0, ...], input, root)``.

    Args:
        self: The process group.
        output_tensors: On the root, one tensor per group rank (inside a one-entry list, as
            c10d's); elsewhere ``[]`` (or ``[[]]``).
        input_tensors: This rank's tensor (inside a one-entry list, as c10d's).
        opts: torch's ``GatherOptions`` (``rootRank``), or the root (c10d's overload).
        root: The group rank of the destination.

    Returns:
        The Work of the gather.

    Example:
        >>> import numpy as np, mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> outs = [[np.empty(1) for _ in range(w)]] if r == 0 else []
        >>> mpicomm.init().gather(outs, [np.full(1, float(r))]).wait()
        True
    """
    outputs = output_tensors
    if isinstance(input_tensors, (list, tuple)):
        outputs = _one(output_tensors, "gather", "output_tensors") if output_tensors else []
    tensor = _one(input_tensors, "gather", "input_tensors")
    gather_list = list(outputs) if outputs else None
    return _work(
        collectives.gather(tensor, gather_list, None, self, True, group_dst=options.root(opts, root))
    )


def scatter(
    self: ProcessGroup, output_tensors: Any, input_tensors: Any, opts: Any = None, *, root: int = 0
) -> Work:
    """``pg.scatter([output], [[in0, in1, ...]], opts)`` or ``pg.scatter(output, [in0, ...], root)``.

    Args:
        self: The process group.
        output_tensors: This rank's result (inside a one-entry list, as c10d's).
        input_tensors: On the root, one tensor per group rank (inside a one-entry list, as c10d's);
            elsewhere ``[]``.
        opts: torch's ``ScatterOptions`` (``rootRank``), or the root (c10d's overload).
        root: The group rank of the source.

    Returns:
        The Work of the scatter.

    Example:
        >>> import numpy as np, mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> out = np.empty(1)
        >>> ins = [[np.full(1, float(i)) for i in range(w)]] if r == 0 else []
        >>> mpicomm.init().scatter([out], ins).wait() and float(out[0]) == r
        True
    """
    output = _one(output_tensors, "scatter", "output_tensors")
    inputs = input_tensors
    if isinstance(output_tensors, (list, tuple)):
        inputs = _one(input_tensors, "scatter", "input_tensors") if input_tensors else []
    scatter_list = list(inputs) if inputs else None
    return _work(
        collectives.scatter(output, scatter_list, None, self, True, group_src=options.root(opts, root))
    )


def allreduce_coalesced(self: ProcessGroup, tensors: Any, opts: Any = None) -> Work:
    """``pg.allreduce_coalesced([t0, t1, ...], opts)``: every tensor reduced in place, one MPI call.

    Args:
        self: The process group.
        tensors: The tensors, of one dtype.
        opts: torch's ``AllreduceCoalescedOptions`` (``reduceOp``), or the op itself.

    Returns:
        The Work of the reduction (``mpicomm.all_reduce_coalesced`` returns a Future, as torch's).

    Example:
        >>> import numpy as np, mpicomm
        >>> a, b = np.ones(1), np.ones(2)
        >>> mpicomm.init().allreduce_coalesced([a, b]).wait() and float(b[1]) == mpicomm.get_world_size()
        True
    """
    op = ReduceOp.SUM
    if opts is not None and not hasattr(opts, "reduceOp"):
        op, opts = opts, None
    work = coalesced._all_reduce_coalesced(tensors, _op(op, opts, "allreduce_coalesced"), self, True)
    return _work(work)


def alltoall(self: ProcessGroup, output_tensors: Any, input_tensors: Any, opts: Any = None) -> Work:
    """``pg.alltoall([out0, out1, ...], [in0, in1, ...], opts)``: :func:`~mpicomm.all_to_all` on this group.

    Args:
        self: The process group.
        output_tensors: One tensor per group rank, received from it.
        input_tensors: One tensor per group rank, sent to it.
        opts: Accepted (torch's ``AllToAllOptions``).

    Returns:
        The Work of the exchange.

    Example:
        >>> import numpy as np, mpicomm
        >>> w = mpicomm.get_world_size()
        >>> outs = [np.empty(1) for _ in range(w)]
        >>> mpicomm.init().alltoall(outs, [np.ones(1) for _ in range(w)]).wait()
        True
    """
    return _work(collectives.all_to_all(output_tensors, input_tensors, self, True))


def _allgather_base(self: ProcessGroup, output: Any, input: Any, opts: Any = None) -> Work:
    """``pg._allgather_base(output, input)``: :func:`~mpicomm.all_gather_into_tensor` (c10d's name).

    Example:
        >>> import numpy as np, mpicomm
        >>> mpicomm.init()._allgather_base(np.empty(mpicomm.get_world_size()), np.ones(1)).wait()
        True
    """
    return _work(collectives.all_gather_into_tensor(output, input, self, True))


def _reduce_scatter_base(self: ProcessGroup, output: Any, input: Any, opts: Any = None) -> Work:
    """``pg._reduce_scatter_base(output, input, opts)``: :func:`~mpicomm.reduce_scatter_tensor` (c10d's).

    Example:
        >>> import numpy as np, mpicomm
        >>> out = np.empty(1)
        >>> mpicomm.init()._reduce_scatter_base(out, np.ones(mpicomm.get_world_size())).wait()
        True
    """
    return _work(
        collectives.reduce_scatter_tensor(
            output, input, _op(ReduceOp.SUM, opts, "_reduce_scatter_base"), self, True
        )
    )


def barrier(self: ProcessGroup, opts: Any = None, *, timeout: Timeout = None) -> Work:
    """``pg.barrier()``: a barrier on this group, as a Work.

    Args:
        self: The process group.
        opts: Accepted (torch's ``BarrierOptions``); its ``timeout``, when set, bounds the barrier.
        timeout: A ``timedelta`` or seconds: a blocking barrier that raises when not every rank
            entered in time (the group's own timeout applies otherwise).

    Returns:
        The Work of the barrier (already complete when a timeout was given).

    Example:
        >>> import mpicomm
        >>> mpicomm.init().barrier().wait()
        True
    """
    timeout = options.barrier_timeout(opts, timeout)
    if timeout is not None:
        _barrier(self, False, None, timeout)
        return completed()
    return _work(_barrier(self, True))


def monitored_barrier(self: ProcessGroup, timeout: Timeout = None, wait_all_ranks: bool = False) -> None:
    """``pg.monitored_barrier(timeout)``: :func:`~mpicomm.monitored_barrier` on this group.

    Args:
        self: The process group.
        timeout: A ``timedelta`` or seconds; None for the group's timeout (30 minutes by default).
        wait_all_ranks: Accepted; every missing rank is always named.

    Raises:
        CommunicationError: ranks did not arrive in time (a RuntimeError, as torch's).

    Example:
        >>> import mpicomm
        >>> mpicomm.init().monitored_barrier(60)
    """
    _monitored_barrier(self, timeout, wait_all_ranks)


def send(self: ProcessGroup, tensors: Any, dstRank: int, tag: int = 0) -> Work:  # noqa: N803 - c10d's name
    """``pg.send([tensor], dstRank, tag)``: a non-blocking send to group rank ``dstRank``.

    Args:
        self: The process group.
        tensors: A one-entry list or the tensor itself.
        dstRank: The group rank of the receiver.
        tag: The message tag.

    Returns:
        The Work of the send.

    Example:
        >>> import numpy as np, mpicomm
        >>> g, w, r = mpicomm.init(), mpicomm.get_world_size(), mpicomm.get_rank()
        >>> if w > 1 and r < 2:
        ...     got = np.zeros(1)
        ...     _ = g.send([np.ones(1)], 1 - r, 5).wait() if r == 0 else g.recv([got], 0, 5).wait()
    """
    tensor = _one(tensors, "send", "tensors")
    return _work(collectives.isend(tensor, None, self, tag, group_dst=dstRank))


def recv(self: ProcessGroup, tensors: Any, srcRank: int, tag: int = 0) -> Work:  # noqa: N803 - c10d's name
    """``pg.recv([tensor], srcRank, tag)``: a non-blocking receive from group rank ``srcRank``.

    Args:
        self: The process group.
        tensors: A one-entry list or the tensor itself; written when the Work completes.
        srcRank: The group rank of the sender.
        tag: The message tag.

    Returns:
        The Work of the receive.

    Example:
        >>> import numpy as np, mpicomm
        >>> g, w, r = mpicomm.init(), mpicomm.get_world_size(), mpicomm.get_rank()
        >>> if w > 1 and r < 2:
        ...     got = np.zeros(1)
        ...     _ = g.send([np.ones(1)], 1, 6).wait() if r == 0 else g.recv([got], 0, 6).wait()
    """
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
    "reduce": reduce,
    "gather": gather,
    "scatter": scatter,
    "allreduce_coalesced": allreduce_coalesced,
    "alltoall": alltoall,
    "_allgather_base": _allgather_base,
    "_reduce_scatter_base": _reduce_scatter_base,
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
