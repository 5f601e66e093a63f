"""Reductions, broadcast and barrier with torch.distributed's names and semantics.

Each call checks its arguments on the calling rank before any MPI call, and with validation mode on
(:mod:`mpicomm.core.validation`) also across ranks. ``async_op=True`` returns a :class:`~mpicomm.Work`;
otherwise the call blocks and returns ``None``. On a rank outside ``group`` every call warns and
returns ``None``, as in torch.distributed. Arrays are changed in place where torch changes tensors in
place; output arrays must be writeable and may be strided views: ``broadcast`` writes them in place
through a derived datatype, the reductions reduce in a contiguous temporary that is copied back (MPI's
predefined ops take predefined datatypes only). Inputs may be any layout (a strided input to a
reduction is copied once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..core import algorithms, chunks, cmpi, fast, validation
from ..core import engine_gate as engine  # the gate: the engine itself loads past it, at first need
from ..core.arrays import Array
from ..core.buffers import (
    _DATATYPES,
    check_array,
    check_array_list,
    check_disjoint,
    check_output,
    check_same_dtype,
    datatype,
    message,
    recv_message,
    send_view,
    staged,
)
from ..core.chunks import Setting as _Chunks
from ..core.groups import ProcessGroup, _State, resolve, root_rank, warn_non_member
from ..core.pieces import _State as _Pieces
from ..core.reduce_op import ReduceOp, average, is_half, premultiply
from ..core.statuses import waitall
from ..core.watchdog import _Threads
from ..core.work import Work, completed
from ..errors import ArgumentError, ArgumentTypeError
from . import in_place, small
from .exchange import REDUCE_SCATTER, exchange, reduce_scatter_c
from .gathers import _check_own_size
from .half import reduce_wide

__all__ = [
    "all_reduce",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
]

_SUM = ReduceOp.SUM
_Flag = validation._Flag
_ND = np.ndarray
_WORLD = fast.WORLD
_datatype_of = _DATATYPES.get  # bound once: a call of it costs less than a method lookup and call
_T = _Threads  # the engine's count of queued calls (mpicomm.core.engine), read by the inline gates


def _post_average(op: ReduceOp, x: np.ndarray, size: int) -> Callable[[], None] | None:
    if op.name != "AVG":
        return None
    return lambda: average(x, size)


def all_reduce(
    tensor: Array,
    op: ReduceOp = _SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``tensor`` over all ranks of the group; every rank gets the result in place.

    ======  ==========  ===========
    rank    tensor in   tensor out
    ======  ==========  ===========
    0       [1, 2]      [4, 6]
    1       [3, 4]      [4, 6]
    ======  ==========  ===========

    Args:
        tensor: Input and output, a writeable array (a strided view is reduced in a temporary and
            copied back), the same shape and dtype on every rank.
        op: The reduction (see :class:`~mpicomm.ReduceOp`).
        group: The process group; ``None`` for the world.
        async_op: Return a Work at once; the call runs on mpicomm's communication thread
            (the same MPI call as a blocking one, so ranks may differ in ``async_op``;
            docs/sharp-bits).

    Returns:
        A Work if ``async_op``, else None.

    Raises:
        ArgumentTypeError: ``tensor`` is not an array, or ``op`` is not defined on its dtype.
        ArgumentError: ``tensor`` is read-only.
        CrossRankMismatchError: (validation mode) ranks disagree on op, dtype or size.

    Example:
        >>> import numpy as np, mpicomm
        >>> x = np.full(3, mpicomm.get_rank() + 1.0)
        >>> mpicomm.all_reduce(x, op=mpicomm.ReduceOp.MAX)
        >>> bool((x == mpicomm.get_world_size()).all())
        True
    """
    if (async_op is not False or _T.pending) and engine.wanted(group=group):  # the engine's gate, inline
        return engine.through(_ALL_REDUCE, (tensor, op, group, async_op), {}, async_op)  # type: ignore[no-any-return]
    w = _WORLD
    g: ProcessGroup
    if group is None and _State.world is w[0]:  # the world, its parts kept (fast.WORLD)
        g, comm = w[0], w[1]  # type: ignore[assignment]  # WORLD[0] is a group once it is the world
    else:
        g = resolve(group, "all_reduce")
        comm = fast.comm_of(g)
        if comm is None:
            warn_non_member(g, "all_reduce")
            return None
    # Fast path (an 8-byte all_reduce costs about 1 us in MPI, so every check here counts): a
    # cached (datatype, op) pair for a numpy array and a plain MPI op; everything else goes through
    # _all_reduce_checked. cmpi checks the layout and serves a blocking call; mpi4py refuses a
    # read-only buffer before calling MPI; the front door has checked that async_op is a bool.
    # async_op never changes the MPI call (ranks may differ in it, as in torch): a Work asked for
    # runs this same code on the engine's thread (the gate above), where it is one already
    # complete. The pairs are numbers' (at most chunks.WIDEST bytes an element), so
    # size <= few proves a small array unchunked without computing nbytes.
    try:
        dt, mop = op._ops[tensor.dtype]
    except (KeyError, AttributeError, TypeError):
        return _all_reduce_checked(tensor, op, g, async_op)
    if type(tensor) is not _ND or _Flag.on or not op._plain:
        return _all_reduce_checked(tensor, op, g, async_op)
    if tensor.size > _Chunks.few and tensor.nbytes > _Chunks.least:
        return _all_reduce_large(tensor, dt, mop, op, g, comm, async_op)
    if cmpi.allreduce(tensor, dt, mop, comm) is None:
        return None if async_op is False else completed([tensor])
    if not tensor.flags.c_contiguous:
        return _all_reduce_checked(tensor, op, g, async_op)
    try:
        in_place.allreduce_mpi4py(tensor, dt, mop, comm)
    except BufferError:  # a read-only array: the message that names the argument
        check_output(tensor, "all_reduce", "tensor")
        raise
    return completed([tensor]) if async_op else None


def _all_reduce_large(
    tensor: np.ndarray, dt: Any, mop: Any, op: ReduceOp, g: ProcessGroup, comm: Any, async_op: bool
) -> Work | None:
    """all_reduce of a large numpy array with a plain op, validation off: the checked path, short.

    This code runs cold (each call has just streamed megabytes through the caches): the checked
    path cost 60-70 us a 4 MiB call between two ranks against 5 us on one (docs/benchmarks.rst).
    A contiguous, writeable array that is not half precision needs only the chunk question and the
    C call; anything else takes the checked path, which asks the same question once.
    """
    flags = tensor.flags
    if not (flags.c_contiguous and flags.writeable) or is_half(tensor.dtype):
        return _all_reduce_checked(tensor, op, g, async_op)
    if chunks.step(tensor.nbytes, tensor.itemsize):
        chunks.split(g.comm, False)  # device ranks would pipeline it: tell them this rank does not
    in_place.allreduce(tensor, dt, mop, comm)
    return completed([tensor]) if async_op else None


def _all_reduce_checked(tensor: np.ndarray, op: ReduceOp, g: ProcessGroup, async_op: bool) -> Work | None:
    """all_reduce with every check, validation, PREMUL_SUM, AVG and strided tensors."""
    check_output(tensor, "all_reduce", "tensor")
    if type(op) is not ReduceOp:
        _bad_op(op, "all_reduce")
    if tensor.nbytes > _Chunks.least and chunks.step(tensor.nbytes, tensor.itemsize):
        chunks.split(g.comm, False)  # device ranks would pipeline it: tell them this rank does not
    if is_half(tensor.dtype):
        return reduce_wide(
            lambda w: _all_reduce_checked(w, op, g, async_op), op, "all_reduce", tensor, [], async_op
        )
    dt, mop = op.mpi_op(tensor.dtype, "all_reduce")
    if validation._Flag.on:
        validation.check(g, "all_reduce", {"op": repr(op), "dtype": str(tensor.dtype), "count": tensor.size})
    buf, back = staged(tensor)
    premultiply(op, buf, out=buf)
    post = _then(_post_average(op, buf, g.size()), back)
    in_place.allreduce(buf, dt, mop, g.comm)
    if post is not None:
        post()
    return completed([tensor]) if async_op else None


def _then(first: Callable[[], None] | None, second: Callable[[], None] | None) -> Callable[[], None] | None:
    """Run ``first`` then ``second`` (either may be None): the average, then the copy-back."""
    if first is None or second is None:
        return first or second

    def both() -> None:
        first()
        second()

    return both


def _bad_op(op: object, fn: str) -> None:
    raise ArgumentTypeError(f"{fn}: op is {op!r}; expected a mpicomm.ReduceOp such as ReduceOp.SUM")


def reduce(
    tensor: Array,
    dst: int | None = None,
    op: ReduceOp = _SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Work | None:
    """Reduce ``tensor`` over all ranks into ``tensor`` on the destination rank only.

    Other ranks' ``tensor`` is left unchanged (torch leaves it unspecified).

    Args:
        tensor: Input everywhere, output on the destination; writeable, any layout.
        dst: World rank of the destination (default: group rank 0).
        op: The reduction.
        group: The process group; ``None`` for the world.
        async_op: Return a Work at once; the call runs on mpicomm's communication thread
            (the same MPI call as a blocking one, so ranks may differ in ``async_op``;
            docs/sharp-bits).
        group_dst: The destination as a rank of ``group`` (instead of ``dst``).

    Returns:
        A Work if ``async_op``, else None.

    Raises:
        ArgumentTypeError: ``tensor`` is not an array, or ``op`` does not apply to its dtype.
        ArgumentError: bad destination, or a read-only ``tensor``.
        CrossRankMismatchError: (validation mode) ranks disagree on op, dtype, size or root.

    Example:
        >>> import numpy as np, mpicomm
        >>> x = np.ones(2, dtype=np.int64)
        >>> mpicomm.reduce(x, dst=0)
        >>> mpicomm.get_rank() != 0 or bool((x == mpicomm.get_world_size()).all())
        True
    """
    fn = "reduce"
    w = _WORLD
    if group is None and group_dst is None and type(tensor) is _ND and _State.world is w[0] and not _Flag.on:
        # the common call: a plain op on a cached dtype, the world's parts kept (fast.WORLD); cmpi
        # checks the buffer. async_op never changes the MPI call: a Work asked for is complete.
        pair = op._ops.get(tensor.dtype) if type(op) is ReduceOp else None
        root = 0 if dst is None else dst if type(dst) is int and 0 <= dst < w[2] else -1
        if (
            pair is not None
            and op._plain
            and root >= 0
            and tensor.nbytes <= _Chunks.least
            and tensor.nbytes <= _Pieces.reduce  # the general path cuts larger ones (dense.in_place)
            and cmpi.reduce(tensor, pair[0], pair[1], root, w[1]) is None
        ):
            return None if async_op is False else completed([tensor])
    g = resolve(group, fn)
    if fast.comm_of(g) is None:  # the world's parts kept for the next call
        warn_non_member(g, fn)
        return None
    check_output(tensor, fn, "tensor")
    if type(op) is not ReduceOp:
        _bad_op(op, fn)
    if tensor.nbytes > _Chunks.least and chunks.step(tensor.nbytes, tensor.itemsize):
        root_rank(g, dst, group_dst, fn, "dst")  # a bad root raises before the question
        chunks.split(g.comm, False)  # device ranks would pipeline it: tell them this rank does not
    if is_half(tensor.dtype):
        return reduce_wide(lambda w: reduce(w, dst, op, g, async_op, group_dst), op, fn, tensor, [], async_op)
    _, mop = op.mpi_op(tensor.dtype, fn)
    root = root_rank(g, dst, group_dst, fn, "dst")
    if validation._Flag.on:
        validation.check(
            g, fn, {"op": repr(op), "dtype": str(tensor.dtype), "count": tensor.size, "dst": root}
        )
    dt = datatype(tensor.dtype)
    post = None
    if g.rank() == root:
        buf, back = staged(tensor)
        if op.factor is not None:
            premultiply(op, buf, out=buf)
        in_place.reduce(buf, True, dt, mop, root, g.comm)
        post = _then(_post_average(op, buf, g.size()), back)
    else:
        in_place.reduce(send_view(premultiply(op, tensor)), False, dt, mop, root, g.comm)
    if post is not None:
        post()
    return completed([tensor]) if async_op else None


def broadcast(
    tensor: Array,
    src: int | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Work | None:
    """Copy ``tensor`` from the source rank into ``tensor`` on every other rank.

    Args:
        tensor: Data on the source, output elsewhere; same shape and dtype on every rank.
        src: World rank of the source (default: group rank 0).
        group: The process group; ``None`` for the world.
        async_op: Return a Work at once; the call runs on mpicomm's communication thread
            (the same MPI call as a blocking one, so ranks may differ in ``async_op``;
            docs/sharp-bits).
        group_src: The source as a rank of ``group`` (instead of ``src``).

    Returns:
        A Work if ``async_op``, else None.

    Raises:
        ArgumentTypeError: ``tensor`` is not an array.
        ArgumentError: bad source, or a read-only ``tensor``.
        CrossRankMismatchError: (validation mode) ranks disagree on dtype, size or source.

    Example:
        >>> import numpy as np, mpicomm
        >>> x = np.arange(3.0) if mpicomm.get_rank() == 0 else np.zeros(3)
        >>> mpicomm.broadcast(x, src=0)
        >>> x.tolist()
        [0.0, 1.0, 2.0]
    """
    # the common call: its checks inline, the buffer's in cmpi (a function call costs 50 ns here);
    # async_op never changes the MPI call (ranks may differ in it): a Work asked for is complete
    if (async_op is not False or _T.pending) and engine.wanted(group=group):  # the engine's gate, inline
        return engine.through(_BROADCAST, (tensor, src, group, async_op, group_src), {}, async_op)  # type: ignore[no-any-return]
    w = _WORLD
    if group is None and group_src is None and type(tensor) is _ND and _State.world is w[0] and not _Flag.on:
        dt = _datatype_of(tensor.dtype)
        root = 0 if src is None else src if type(src) is int and 0 <= src < w[2] else -1
        if dt is not None and root >= 0 and tensor.nbytes <= _Chunks.least:
            if cmpi.bcast(tensor, dt, root, w[1]) is None:
                return None if async_op is False else completed([tensor])
            if fast.dt_out(tensor) is not None:
                w[1].Bcast([tensor, dt], root)
                return None if async_op is False else completed([tensor])
    fn = "broadcast"
    g = resolve(group, fn)
    if fast.comm_of(g) is None:  # the world's parts kept for the next call
        warn_non_member(g, fn)
        return None
    check_output(tensor, fn, "tensor")
    root = root_rank(g, src, group_src, fn, "src")
    if tensor.nbytes > _Chunks.least and chunks.step(tensor.nbytes, tensor.itemsize):
        chunks.split(g.comm, False)  # device ranks would pipeline it: tell them this rank does not
    if validation._Flag.on:
        validation.check(g, fn, {"dtype": str(tensor.dtype), "count": tensor.size, "src": root})
    dt = _datatype_of(tensor.dtype)
    if dt is not None and cmpi.bcast(tensor, dt, root, g.comm) is None:  # C where bound (core.algorithms)
        return completed([tensor]) if async_op else None
    post = None
    if g.rank() == root:
        msg = message(tensor)
    else:
        msg, post = recv_message(tensor)
    with algorithms.large(algorithms.BCAST, tensor.nbytes):
        g.comm.Bcast(msg, root)
    if post is not None:
        post()
    return completed([tensor]) if async_op else None


def reduce_scatter(
    output: Array,
    input_list: list[Array],
    op: ReduceOp = _SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``input_list[r]`` over all ranks into ``output`` on rank r; sizes may differ per r.

    ======  ========================  ============
    rank    input_list                output (SUM)
    ======  ========================  ============
    0       [[1, 2], [3, 4, 5]]       [11, 22]
    1       [[10, 20], [30, 40, 50]]  [33, 44, 55]
    ======  ========================  ============

    Uneven sizes work on every MPI (Gloo has no reduce_scatter; NCCL does uneven sizes as one reduce
    per rank). When the inputs are views lying back to back in one buffer they
    are sent without a copy; otherwise they are packed once into a temporary.

    Args:
        output: This rank's result, writeable, any layout.
        input_list: One input per group rank; ``input_list[r]`` has rank r's output size.
        op: The reduction.
        group: The process group; ``None`` for the world.
        async_op: Return a Work instead of blocking.

    Returns:
        A Work if ``async_op``, else None.

    Raises:
        ArgumentTypeError: not arrays, dtypes that differ, or an op not defined on the dtype.
        ArgumentError: wrong list length, or ``input_list[rank]`` not the size of ``output``.
        CrossRankMismatchError: (validation mode) sizes, op or dtype differ between ranks.

    Example:
        >>> import numpy as np, mpicomm
        >>> w = mpicomm.get_world_size()
        >>> out = np.empty(2)
        >>> mpicomm.reduce_scatter(out, [np.ones(2) for _ in range(w)])
        >>> out.tolist() == [w, w]
        True
    """
    fn = "reduce_scatter"
    w = fast.world(group, async_op)
    if w is not None and (
        small.reduce_scatter(w, output, input_list, op)
        or reduce_scatter_c(w, output, input_list, op, small.SMALL)
    ):
        return None
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    out = check_output(output, fn, "output")
    ins = check_array_list(input_list, fn, "input_list", g.size(), output=False)
    check_same_dtype(out, ins[0], fn, "output", "input_list")
    _check_own_size(ins[g.rank()], out, fn, "input_list", g.rank())
    if type(op) is not ReduceOp:
        _bad_op(op, fn)
    if is_half(out.dtype):
        return reduce_wide(
            lambda w, *i: reduce_scatter(w, list(i), op, g, async_op), op, fn, out, ins, async_op
        )
    _, mop = op.mpi_op(out.dtype, fn)
    counts = [a.size for a in ins]
    if validation._Flag.on:
        validation.check(g, fn, {"op": repr(op), "dtype": str(out.dtype)}, counts, [out.size] * g.size())
    if op._plain and small.small(counts, out.itemsize):
        work: Work | None = small.reduce_scatter_small(g.comm, out, ins, datatype(out.dtype), mop, async_op)
        return work
    return _reduce_scatter_pairwise(out, ins, op, mop, g, async_op)


def _reduce_scatter_pairwise(
    out: np.ndarray, ins: list[np.ndarray], op: ReduceOp, mop: Any, g: ProcessGroup, async_op: bool
) -> Work | None:
    """Send ``ins[p]`` straight to rank p, receive the peers' pieces, reduce them locally.

    The pairwise-exchange algorithm MPI_Reduce_scatter itself uses for large messages, but fed
    from the list in place: the inputs are never packed into one buffer. Messages go over the
    group's internal communicator, so they cannot match the user's send/recv.
    """
    size, rank = g.size(), g.rank()
    dt = datatype(out.dtype)
    peers = [p for p in range(size) if p != rank]
    own = ins[rank]
    buf, back = staged(out)
    # The first peer's piece goes straight into the output when nothing else lives there (no
    # premultiplied own piece to put first, no input sharing its memory): one pass over the data
    # less than receiving it aside and copying this rank's own piece in first.
    direct = bool(peers) and op.factor is None and not any(np.may_share_memory(buf, x) for x in ins)
    received = np.empty((len(peers) - direct, out.size), out.dtype)
    targets = [buf, *received] if direct else list(received)
    sends = [premultiply(op, send_view(ins[p])) for p in peers]
    requests = exchange(
        g, dict(zip(peers, targets, strict=True)), dict(zip(peers, sends, strict=True)), REDUCE_SCATTER
    )

    def combine() -> None:
        flat = buf.reshape(-1)
        if not direct:
            np.copyto(buf, own.reshape(out.shape))
            premultiply(op, buf, out=buf)
        for row in received:
            mop.Reduce_local([row, dt], [flat, dt])
        if direct:  # MPI's predefined ops commute
            mop.Reduce_local([send_view(own).reshape(-1), dt], [flat, dt])
        if op.name == "AVG":
            average(buf, size)
        if back is not None:
            back()

    if async_op:
        work = Work(requests, keep=(sends, received, ins), result=[out], finish=combine, fn="reduce_scatter")
        return work
    waitall(requests)  # a short piece would leave bytes of `received` that MPI never wrote: refused
    combine()
    return None


def reduce_scatter_tensor(
    output: Array,
    input: Array,
    op: ReduceOp = _SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce ``input`` over all ranks and give rank r the r-th of W equal contiguous chunks.

    ``input`` may be flat (``W*n`` elements) or stacked (``(W, n...)``). Also available as
    :func:`reduce_scatter_single` (torch 2.13's name).

    ======  =============  ============
    rank    input          output (SUM)
    ======  =============  ============
    0       [0, 1, 2, 3]   [0, 2]
    1       [0, 1, 2, 3]   [4, 6]
    ======  =============  ============

    Args:
        output: This rank's chunk of the result, writeable, any layout.
        input: W times the size of ``output``; not modified.
        op: The reduction.
        group: The process group; ``None`` for the world.
        async_op: Return a Work at once; the call runs on mpicomm's communication thread
            (the same MPI call as a blocking one, so ranks may differ in ``async_op``;
            docs/sharp-bits).

    Returns:
        A Work if ``async_op``, else None.

    Raises:
        ArgumentTypeError: not arrays, dtypes that differ, or an op not defined on the dtype.
        ArgumentError: ``input`` is not W times the size of ``output``.
        CrossRankMismatchError: (validation mode) sizes, op or dtype differ between ranks.

    Example:
        >>> import numpy as np, mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> out = np.empty(2)
        >>> mpicomm.reduce_scatter_tensor(out, np.arange(2.0 * w))
        >>> out.tolist() == [2.0 * r * w, (2.0 * r + 1) * w]
        True
    """
    fn = "reduce_scatter_tensor"
    w = _State.world
    large = _Pieces.bytes or 1 << 62  # past it, the pairwise exchange (MPI's temporary: core.pieces)
    if group is None and async_op is False and w is not None and not _Flag.on and type(op) is ReduceOp:
        pair = op._ops.get(input.dtype) if type(input) is np.ndarray and op._plain else None
        pair = None if pair is None or input.nbytes > large else pair
        if pair is not None and type(output) is np.ndarray and output.dtype is input.dtype:
            # cmpi checks layouts, sizes and overlap; where it cannot serve, the same checks here
            if cmpi.reduce_scatter_block(input, output, pair[0], pair[1], w.comm) is None:
                return None
            if (
                fast.dt_in(input) is pair[0]
                and fast.dt_out(output) is pair[0]
                and input.size == w._size * output.size
                and fast.apart(output, input)
            ):
                w.comm.Reduce_scatter_block([input, pair[0]], [output, pair[0]], pair[1])
                return None
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    out = check_output(output, fn, "output")
    inp = check_array(input, fn, "input")  # copied if need be after the size checks
    check_same_dtype(out, inp, fn, "output", "input")
    if inp.size != g.size() * out.size:
        raise ArgumentError(
            f"{fn}: input has {inp.size} elements; expected {g.size() * out.size} "
            f"(the group size {g.size()} times output's {out.size})"
        )
    if type(op) is not ReduceOp:
        _bad_op(op, fn)
    if is_half(out.dtype):
        return reduce_wide(
            lambda w, i: reduce_scatter_tensor(w, i, op, g, async_op), op, fn, out, [inp], async_op
        )
    _, mop = op.mpi_op(out.dtype, fn)
    if validation._Flag.on:
        validation.check(g, fn, {"op": repr(op), "dtype": str(out.dtype), "count": out.size})
    inp = send_view(inp)
    check_disjoint(out, inp, fn, "output", "input")
    if inp.nbytes > large and g.size() > 1:  # a 64 MiB MPI call: 80 ms, the exchange 35-42
        return _reduce_scatter_pairwise(out, list(inp.reshape(g.size(), -1)), op, mop, g, async_op)
    inp = premultiply(op, inp)
    dt = datatype(out.dtype)
    buf, back = staged(out)
    send, recv = [inp, dt], [buf, dt]
    post = _then(_post_average(op, buf, g.size()), back)
    g.comm.Reduce_scatter_block(send, recv, mop)
    if post is not None:
        post()
    return completed([out]) if async_op else None


reduce_scatter_single = reduce_scatter_tensor


#: all_reduce and broadcast as the engine runs them (their gates are inline: mpicomm.core.engine.wanted).
_ALL_REDUCE = engine.Spec("all_reduce", all_reduce, p2p=False, posts=False, validated=True, queued=True)
_BROADCAST = engine.Spec("broadcast", broadcast, p2p=False, posts=False, validated=True, queued=True)
