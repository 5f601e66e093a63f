"""All-to-all exchanges: ``all_to_all`` on lists of arrays and ``all_to_all_single`` with split sizes.

Inputs and outputs may be strided views: MPI reads and writes them in place through derived datatypes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..core import chunks, cmpi, fast, validation
from ..core.arrays import Array
from ..core.buffers import (
    _DATATYPES,
    as_int_list,
    check_array,
    check_array_list,
    check_disjoint,
    check_disjoint_lists,
    check_output,
    check_same_dtype,
    displacements,
    row_message,
    row_size,
)
from ..core.chunks import Setting as _Chunks
from ..core.groups import ProcessGroup, _State, resolve, warn_non_member
from ..core.work import Work, completed
from ..errors import ArgumentError, ArgumentTypeError, BackendArgumentError
from .exchange import ALL_TO_ALL, copy_own, exchange, finish

__all__ = ["all_to_all", "all_to_all_single"]

_Flag = validation._Flag


def all_to_all(
    output_tensor_list: list[Array],
    input_tensor_list: list[Array],
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Work | None:
    """Send ``input_tensor_list[j]`` to rank j and receive rank j's into ``output_tensor_list[j]``.

    ======  ====================  ======================
    rank    input_tensor_list     output_tensor_list
    ======  ====================  ======================
    0       [[0], [1, 1]]         [[0], [10]]
    1       [[10], [11, 11]]      [[1, 1], [11, 11]]
    ======  ====================  ======================

    Sizes may differ per pair; the arrays are read and written where they lie, without packing
    them into a temporary (see :mod:`mpicomm.dense.exchange`).

    Args:
        output_tensor_list: One writeable array (any layout) per group rank, sized for what that rank sends.
        input_tensor_list: One array per group rank, to send to it.
        group: The process group; ``None`` for the world.
        async_op: Return a Work instead of blocking.

    Returns:
        A Work if ``async_op``, else None.

    Raises:
        ArgumentTypeError: not lists of arrays, or dtypes that differ.
        ArgumentError: a list whose length is not the group size.
        CrossRankMismatchError: (validation mode) a rank sends a size its peer does not expect.

    Example:
        >>> import numpy as np, mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> out = [np.empty(1) for _ in range(w)]
        >>> mpicomm.all_to_all(out, [np.array([10.0 * r + j]) for j in range(w)])
        >>> [o[0] for o in out] == [10.0 * j + r for j in range(w)]
        True
    """
    fn = "all_to_all"
    w = _State.world
    if group is None and async_op is False and w is not None and not _Flag.on:
        # the common call: lists of one dtype, nothing written that shares memory (cmpi checks)
        x = input_tensor_list[0] if type(input_tensor_list) is list and input_tensor_list else None
        dt = _DATATYPES.get(x.dtype) if type(x) is np.ndarray else None
        if (
            dt is not None
            and cmpi.exchange(output_tensor_list, input_tensor_list, None, ALL_TO_ALL, dt, w.internal) is None
        ):
            return None
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    outs = check_array_list(output_tensor_list, fn, "output_tensor_list", g.size(), output=True)
    ins = check_array_list(input_tensor_list, fn, "input_tensor_list", g.size(), output=False)
    check_same_dtype(outs[0], ins[0], fn, "output_tensor_list", "input_tensor_list")
    me = g.rank()
    if outs[me].size != ins[me].size:
        raise ArgumentError(
            f"{fn}: output_tensor_list[{me}] has {outs[me].size} elements; expected {ins[me].size}, "
            f"the size of input_tensor_list[{me}] (what this rank sends to itself)"
        )
    check_disjoint_lists(outs, ins, (me, me), fn, "output_tensor_list", "input_tensor_list")
    if validation._Flag.on:
        validation.check(g, fn, {"dtype": str(ins[0].dtype)}, [a.size for a in ins], [o.size for o in outs])
    peers = [p for p in range(g.size()) if p != me]
    posts: list[Any] = []
    requests = exchange(g, {p: outs[p] for p in peers}, {p: ins[p] for p in peers}, ALL_TO_ALL, posts)
    copy_own(outs[me], ins[me])
    return finish(requests, async_op, (ins, outs), outs, posts, "all_to_all")


def all_to_all_single(
    output: Array,
    input: Array,
    output_split_sizes: Sequence[int] | None = None,
    input_split_sizes: Sequence[int] | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Work | None:
    """Split ``input`` along dim 0, send piece j to rank j, and concatenate what arrives into ``output``.

    Split sizes count rows along dim 0 (a row is all the elements of one index of dim 0, so
    multi-dimensional arrays work). ``None`` or ``[]`` means equal pieces, which needs dim 0 to be a
    multiple of the group size. Zero splits are fine: nothing is sent to that rank. The four-rank
    example of torch's docstring:

    ======  =============  =================  ==================  ============================
    rank    input          input_split_sizes  output_split_sizes  output
    ======  =============  =================  ==================  ============================
    0       [0..5]         [2, 2, 1, 1]       [2, 3, 2, 2]        [0, 1, 10, 11, 12, 20, 21,
                                                                  30, 31]
    1       [10..18]       [3, 2, 2, 2]       [2, 2, 1, 2]        [2, 3, 13, 14, 22, 32, 33]
    2       [20..24]       [2, 1, 1, 1]       [1, 2, 1, 2]        [4, 15, 16, 23, 34, 35]
    3       [30..36]       [2, 2, 2, 1]       [1, 2, 1, 1]        [5, 17, 18, 24, 36]
    ======  =============  =================  ==================  ============================

    Args:
        output: Writeable array with ``sum(output_split_sizes)`` rows, any layout.
        input: Array with ``sum(input_split_sizes)`` rows; its rows have the size of ``output``'s.
        output_split_sizes: Rows to receive from each group rank.
        input_split_sizes: Rows to send to each group rank.
        group: The process group; ``None`` for the world.
        async_op: Return a Work at once; the call runs on mpicomm's communication thread
            (the same MPI call as a blocking one, so ranks may differ in ``async_op``;
            docs/sharp-bits).

    Returns:
        A Work if ``async_op``, else None.

    Raises:
        ArgumentTypeError: not arrays, dtypes that differ, split sizes that are not integers.
        ArgumentError: split lists of the wrong length, sum or sign, rows of different sizes, or dim 0
            not divisible by the group size for equal splits.
        CrossRankMismatchError: (validation mode) rank i's input split for j differs from rank j's
            output split for i.

    Example:
        >>> import numpy as np, mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> out = np.empty(w)
        >>> mpicomm.all_to_all_single(out, np.arange(w, dtype=float) + 10 * r)
        >>> out.tolist() == [10.0 * j + r for j in range(w)]
        True
    """
    fn = "all_to_all_single"
    w = _State.world
    if group is None and async_op is False and w is not None and not _Flag.on:
        # the common call: its checks inline, the buffers' (layouts, sizes, overlap) in cmpi first
        dt = _DATATYPES.get(output.dtype) if type(output) is np.ndarray else None
        if dt is not None and type(input) is np.ndarray and input.dtype is output.dtype:
            if output_split_sizes is None and input_split_sizes is None:
                equal = output.shape == input.shape and output.ndim and input.shape[0] % w._size == 0
                if equal and input.nbytes <= _Chunks.least:
                    if cmpi.alltoall(input, output, dt, w.comm) is None:
                        return None
                    if fast.dt_out(output) is dt and fast.dt_in(input) is dt and fast.apart(output, input):
                        w.comm.Alltoall([input, dt], [output, dt])
                        return None
            else:
                plan = _plan(output_split_sizes, input_split_sizes, output, input)
                if plan is not None:
                    if cmpi.alltoallv(input, *plan[2], output, *plan[3], dt, w.comm) is None:
                        return None
                    if fast.dt_out(output) is dt and fast.dt_in(input) is dt and fast.apart(output, input):
                        w.comm.Alltoallv([input, plan[0], dt], [output, plan[1], dt])
                        return None
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    out = check_output(output, fn, "output")
    inp = check_array(input, fn, "input")
    check_same_dtype(out, inp, fn, "output", "input")
    check_disjoint(out, inp, fn, "output", "input")
    row = _row(inp, out, fn)
    out_rows = _splits(output_split_sizes, out, g.size(), fn, "output")
    in_rows = _splits(input_split_sizes, inp, g.size(), fn, "input")
    me = g.rank()
    if out_rows[me] != in_rows[me]:
        raise ArgumentError(
            f"{fn}: output_split_sizes[{me}] is {out_rows[me]} rows; expected {in_rows[me]}, "
            f"input_split_sizes[{me}] (the rows this rank sends to itself)"
        )
    unsplit = _unsplit(output_split_sizes) and _unsplit(input_split_sizes)
    if unsplit and inp.nbytes > _Chunks.least and chunks.step(inp.nbytes, inp.itemsize, g.size()):
        chunks.split(g.comm, False)  # device ranks would pipeline it: tell them this rank does not
    if validation._Flag.on:
        validation.check(g, fn, {"dtype": str(inp.dtype), "row": row}, in_rows, out_rows, unit="rows")
    sbuf, sdt, sunit, _ = row_message(inp, readonly=True)
    rbuf, rdt, runit, post = row_message(out, readonly=False)
    if _unsplit(output_split_sizes) and _unsplit(input_split_sizes):
        send: list[Any] = [sbuf, in_rows[0] * sunit, sdt]
        recv: list[Any] = [rbuf, out_rows[0] * runit, rdt]
        g.comm.Alltoall(send, recv)
    else:
        send = [sbuf, _counts(in_rows, sunit), sdt]
        recv = [rbuf, _counts(out_rows, runit), rdt]
        common = group is None and async_op is False and w is not None and not _Flag.on  # world plans only
        if common and fast.dt_out(output) is not None and fast.dt_in(input) is not None:
            _remember(output_split_sizes, input_split_sizes, output, input, send[1], recv[1])
        g.comm.Alltoallv(send, recv)
    if post is not None:
        post()
    return completed([out]) if async_op else None


def _row(inp: np.ndarray, out: np.ndarray, fn: str) -> int:
    """Elements per dim-0 row, which input and output must share."""
    if inp.ndim == 0 or out.ndim == 0:
        which = "input" if inp.ndim == 0 else "output"
        raise ArgumentError(f"{fn}: {which} is 0-dimensional; expected at least one dimension to split")
    row_in, row_out = row_size(inp), row_size(out)
    if row_in != row_out:
        raise ArgumentError(
            f"{fn}: output rows hold {row_out} elements (shape {out.shape}); expected {row_in}, "
            f"as input's rows (shape {inp.shape})"
        )
    return row_in


#: Checked split sizes -> (send, receive) counts and displacements, for the fast path. Keyed by the
#: split lists and both shapes (so row sizes), valid for the world group; bounded by clearing.
_PLANS: dict[tuple[Any, ...], tuple[Any, ...]] = {}
_PLANS_MAX = 256


def _key(out_splits: Any, in_splits: Any, out: np.ndarray, inp: np.ndarray) -> tuple[Any, ...] | None:
    try:
        outs, ins = tuple(out_splits), tuple(in_splits)
        # the entries' types too: 2.0 == 2 and hashes alike, but the checks refuse a float split
        key = (outs, ins, tuple(map(type, outs)), tuple(map(type, ins)), out.shape, inp.shape)
        hash(key)
    except TypeError:  # a None beside a list, or unhashable entries: the general path decides
        return None
    return key


def _plan(out_splits: Any, in_splits: Any, out: np.ndarray, inp: np.ndarray) -> tuple[Any, ...] | None:
    """The counts of an earlier call with the same splits and shapes that passed every check, or None.

    A plan holds the send and receive (counts, displacements) as mpi4py takes them, then the same
    as int32 arrays for :mod:`mpicomm.core.cmpi` (``(None, None)`` where a count passes 2**31 - 1).
    """
    key = _key(out_splits, in_splits, out, inp)
    return None if key is None else _PLANS.get(key)


def _remember(
    out_splits: Any, in_splits: Any, out: np.ndarray, inp: np.ndarray, send: Any, recv: Any
) -> None:
    key = _key(out_splits, in_splits, out, inp)
    if key is not None:
        if len(_PLANS) >= _PLANS_MAX:
            _PLANS.clear()
        _PLANS[key] = (send, recv, _int32(send), _int32(recv))


def _int32(spec: tuple[list[int], list[int]]) -> tuple[Any, Any]:
    counts, displs = spec
    if max(counts, default=0) >= 1 << 31 or max(displs, default=0) >= 1 << 31:
        return None, None
    return np.array(counts, np.int32), np.array(displs, np.int32)


def _unsplit(sizes: Sequence[int] | None) -> bool:
    return sizes is None or (isinstance(sizes, (list, tuple, np.ndarray)) and len(sizes) == 0)


def _splits(sizes: Sequence[int] | None, x: np.ndarray, size: int, fn: str, which: str) -> list[int]:
    """Rows per rank from a split-size argument, checked against the array's dim 0."""
    rows = x.shape[0]
    arg = f"{which}_split_sizes"
    if sizes is not None and not isinstance(sizes, (list, tuple, np.ndarray)):
        raise ArgumentTypeError(
            f"{fn}: {arg} is {sizes!r}, a {type(sizes).__qualname__}; "
            f"expected a list of {size} non-negative ints"
        )
    if sizes is None or len(sizes) == 0:
        if rows % size:
            raise BackendArgumentError(
                f"{fn}: {which} has {rows} rows along dim 0, which do not divide equally across "
                f"the group size {size}; expected a multiple of {size} or explicit {arg}"
            )
        return [rows // size] * size
    splits = as_int_list(sizes, fn, arg)
    if len(splits) != size:
        raise BackendArgumentError(
            f"{fn}: {arg} has {len(splits)} entries; expected {size} (the group size) "
            "(torch says: Number of tensor splits not equal to group size)"
        )
    if sum(splits) != rows:
        raise BackendArgumentError(
            f"{fn}: {arg} sums to {sum(splits)}; expected {rows}, the rows of {which} along dim 0 "
            "(torch says: Split sizes doesn't match total dim 0 size)"
        )
    return splits


def _counts(rows: list[int], row: int) -> tuple[list[int], list[int]]:
    """Element counts and displacements of consecutive pieces of ``rows[i]`` rows each."""
    counts = [r * row for r in rows]
    return counts, displacements(counts)
