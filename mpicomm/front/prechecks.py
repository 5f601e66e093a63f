"""An asynchronous call's arguments, checked on the caller's thread before the call is queued (issue 41).

The engine (:mod:`mpicomm.core.engine`) runs a queued call's host on its own thread, and the host
checks its arguments there; without these checks a mistake in an ``async_op=True`` call would
surface only at ``wait()``. Each public call that can be queued has a row here: what each argument
is (an input array, an output array, a list of them, an op, a root, a peer, a tag), checked with the
very helpers its host uses (``mpicomm.core.buffers``, ``mpicomm.core.groups.root_rank``,
the point-to-point peers and tags), so the message is the one a blocking call raises. None of them
calls MPI: the engine may be inside MPI meanwhile, and below ``MPI_THREAD_MULTIPLE`` this thread
may not be. The host checks again on the engine's thread (a few microseconds; what a row leaves
out, such as validation mode's cross-rank records, is still caught there and raised at ``wait()``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.buffers import (
    check_array,
    check_array_list,
    check_disjoint,
    check_disjoint_lists,
    check_output,
    check_same_dtype,
)
from ..core.groups import ProcessGroup, resolve, root_rank
from ..core.reduce_op import ReduceOp
from ..dense import alltoall, gathers, p2p
from ..errors import ArgumentError, ArgumentTypeError

__all__ = ["check"]

#: One row a call: (what, argument names) steps, run in order. What each step does is in _STEPS.
_ROWS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "all_reduce": (("out", ("tensor",)), ("op", ("op", "tensor"))),
    "broadcast": (("out", ("tensor",)), ("root", ("src",))),
    "reduce": (("out", ("tensor",)), ("op", ("op", "tensor")), ("root", ("dst",))),
    "reduce_scatter": (
        ("out", ("output",)),
        ("ins", ("input_list",)),
        ("same", ("output", "input_list")),
        ("own", ("input_list", "output")),
        ("op", ("op", "output")),
    ),
    "reduce_scatter_tensor": (
        ("out", ("output",)),
        ("in", ("input",)),
        ("same", ("output", "input")),
        ("times", ("input", "output")),
        ("op", ("op", "output")),
    ),
    "all_gather": (
        ("in", ("tensor",)),
        ("outs", ("tensor_list",)),
        ("same", ("tensor", "tensor_list")),
        ("own", ("tensor_list", "tensor")),
        ("lists apart", ("tensor_list", "tensor")),
    ),
    "all_gather_into_tensor": (
        ("in", ("input_tensor",)),
        ("out", ("output_tensor",)),
        ("same", ("input_tensor", "output_tensor")),
        ("times", ("output_tensor", "input_tensor")),
    ),
    "gather": (("in", ("tensor",)), ("rooted", ("gather_list", "dst", "tensor"))),
    "scatter": (("out", ("tensor",)), ("rooted", ("scatter_list", "src", "tensor"))),
    "all_to_all": (
        ("outs", ("output_tensor_list",)),
        ("ins", ("input_tensor_list",)),
        ("same", ("output_tensor_list", "input_tensor_list")),
        ("own", ("output_tensor_list", "input_tensor_list")),
        ("lists apart", ("output_tensor_list", "input_tensor_list")),
    ),
    "all_to_all_single": (
        ("out", ("output",)),
        ("in", ("input",)),
        ("same", ("output", "input")),
        ("apart", ("output", "input")),
        ("rows", ("input", "output")),
        ("splits", ("output_split_sizes", "output")),
        ("splits", ("input_split_sizes", "input")),
        ("own splits", ("output_split_sizes", "input_split_sizes")),
    ),
    "send": (("in", ("tensor",)), ("peer", ("dst",)), ("tag", ("tag",))),
    "isend": (("in", ("tensor",)), ("peer", ("dst",)), ("tag", ("tag",))),
    "recv": (("out", ("tensor",)), ("peer", ("src",)), ("tag", ("tag",))),
    "irecv": (("out", ("tensor",)), ("peer", ("src",)), ("tag", ("tag",))),
    "all_reduce_coalesced": (("many", ("tensors",)), ("op", ("op", "tensors"))),
    "all_gather_coalesced": (("many", ("output_tensors",)), ("many", ("input_tensor_list",))),
}


def check(fn: str, signature: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    """Raise what the host of ``fn`` would raise for a mistake in these arguments, before any MPI call.

    Args:
        fn: The public name (a call without a row is not checked here).
        signature: The host's ``inspect.Signature``, to name the arguments.
        args: The call's positional arguments, as the host receives them (the front door's views).
        kw: Its keyword arguments.

    Raises:
        TypeError: arguments the signature does not take (as Python raises for a direct call).
        MpicommError: the error the host raises for the argument (ArgumentError, ArgumentTypeError,
            ReductionTypeError, GroupError...), naming ``fn`` and the argument.

    Example:
        >>> import inspect, numpy as np, mpicomm
        >>> from mpicomm.dense.reductions import all_reduce
        >>> ro = np.zeros(2); ro.flags.writeable = False
        >>> check("all_reduce", inspect.signature(all_reduce), (ro,), {})
        Traceback (most recent call last):
        ...
        mpicomm.errors.ArgumentError: all_reduce: tensor is read-only; expected a writeable array
    """
    row = _ROWS.get(fn)
    if row is None:
        return
    try:
        bound = signature.bind(*args, **kw)
    except TypeError as exc:
        raise TypeError(f"{fn}(): {exc}") from None
    bound.apply_defaults()
    given = bound.arguments
    g = resolve(given.get("group"), fn)
    if g.comm is None:
        return  # a rank outside the group: the host warns and returns None
    call = _Call(g, fn, given)
    for what, names in row:
        _STEPS[what](call, names)


class _Call:
    """What the steps of one check share: the group, the public name, the arguments, those checked."""

    __slots__ = ("fn", "g", "given", "seen")

    def __init__(self, g: ProcessGroup, fn: str, given: dict[str, Any]) -> None:
        self.g, self.fn, self.given = g, fn, given
        self.seen: dict[str, Any] = {}  # the arrays (or lists of them) checked so far, by argument


def _one(output: bool) -> Callable[[_Call, tuple[str, ...]], None]:
    def step(c: _Call, names: tuple[str, ...]) -> None:
        name = names[0]
        c.seen[name] = (check_output if output else check_array)(c.given[name], c.fn, name)

    return step


def _list(output: bool) -> Callable[[_Call, tuple[str, ...]], None]:
    def step(c: _Call, names: tuple[str, ...]) -> None:
        name = names[0]
        c.seen[name] = check_array_list(c.given[name], c.fn, name, c.g.size(), output=output)

    return step


def _many(c: _Call, names: tuple[str, ...]) -> None:
    """A list of any length (the coalesced calls), or one array."""
    name = names[0]
    value = c.given[name]
    if isinstance(value, np.ndarray):
        c.seen[name] = check_array(value, c.fn, name)
        return
    c.seen[name] = check_array_list(value, c.fn, name, None, output=False)


def _arrays(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _same(c: _Call, names: tuple[str, ...]) -> None:
    a, b = (_arrays(c.seen[n]) for n in names)
    if a and b:
        check_same_dtype(a[0], b[0], c.fn, *names)


def _apart(c: _Call, names: tuple[str, ...]) -> None:
    out, inp = names
    check_disjoint(c.seen[out], c.seen[inp], c.fn, out, inp)


def _own(c: _Call, names: tuple[str, ...]) -> None:
    """This rank's own entry of a list: the size of what it sends to itself (or its own input)."""
    listed, other = names
    me = c.g.rank()
    mine, theirs = c.seen[listed][me], c.seen[other]
    if isinstance(theirs, list):  # all_to_all: its own output entry against its own input entry
        theirs = theirs[me]
        if mine.size != theirs.size:
            raise ArgumentError(
                f"{c.fn}: {listed}[{me}] has {mine.size} elements; expected {theirs.size}, the size of "
                f"{other}[{me}] (what this rank sends to itself)"
            )
        return
    gathers._check_own_size(mine, theirs, c.fn, listed, me)


def _lists_apart(c: _Call, names: tuple[str, ...]) -> None:
    """No output entry overlaps an input (this rank's own pair may be the same array)."""
    outs, ins = names
    pair = (c.g.rank(), c.g.rank() if isinstance(c.seen[ins], list) else 0)
    check_disjoint_lists(c.seen[outs], _arrays(c.seen[ins]), pair, c.fn, outs, ins)


def _times(c: _Call, names: tuple[str, ...]) -> None:
    """The larger array holds the group size times the smaller's elements."""
    big, small = names
    n, size = c.seen[small].size, c.g.size()
    if c.seen[big].size != size * n:
        raise ArgumentError(
            f"{c.fn}: {big} has {c.seen[big].size} elements; expected {size * n} "
            f"(the group size {size} times {small}'s {n})"
        )


def _rows(c: _Call, names: tuple[str, ...]) -> None:
    inp, out = names
    alltoall._row(c.seen[inp], c.seen[out], c.fn)


def _own_splits(c: _Call, names: tuple[str, ...]) -> None:
    """The rows this rank sends to itself: its entries of both split lists agree."""
    me, size = c.g.rank(), c.g.size()
    outs = alltoall._splits(c.given[names[0]], c.seen["output"], size, c.fn, "output")
    ins = alltoall._splits(c.given[names[1]], c.seen["input"], size, c.fn, "input")
    if outs[me] != ins[me]:
        raise ArgumentError(
            f"{c.fn}: output_split_sizes[{me}] is {outs[me]} rows; expected {ins[me]}, "
            f"input_split_sizes[{me}] (the rows this rank sends to itself)"
        )


def _op(c: _Call, names: tuple[str, ...]) -> None:
    name, on = names
    op = c.given[name]
    if type(op) is not ReduceOp:
        raise ArgumentTypeError(f"{c.fn}: op is {op!r}; expected a mpicomm.ReduceOp such as ReduceOp.SUM")
    arrays = _arrays(c.seen[on])
    if arrays:
        op.check(arrays[0].dtype, c.fn)


def _root(c: _Call, names: tuple[str, ...]) -> None:
    name = names[0]
    root_rank(c.g, c.given[name], c.given.get(f"group_{name}"), c.fn, name)


def _rooted(c: _Call, names: tuple[str, ...]) -> None:
    listed, name, own = names
    root = root_rank(c.g, c.given[name], c.given.get(f"group_{name}"), c.fn, name)
    gathers._root_list(c.given[listed], c.g, root, c.seen[own], c.fn, listed, output=c.fn == "gather")


def _splits(c: _Call, names: tuple[str, ...]) -> None:
    name, which = names
    alltoall._splits(c.given[name], c.seen[which], c.g.size(), c.fn, which)


def _peer(c: _Call, names: tuple[str, ...]) -> None:
    name = names[0]
    p2p._peer(c.g, c.given[name], c.given.get(f"group_{name}"), c.fn, name, any_ok=name == "src")


def _tag(c: _Call, names: tuple[str, ...]) -> None:
    """The tag's type and sign; its upper bound only once known (reading it is an MPI call)."""
    tag = c.given[names[0]]
    if p2p._TagBound.value is not None:
        p2p._tag(c.g, tag, c.fn)
    elif not isinstance(tag, (int, np.integer)) or isinstance(tag, bool):
        raise ArgumentTypeError(f"{c.fn}: tag is {tag!r}; expected an int")
    elif tag < 0:
        raise ArgumentError(f"{c.fn}: tag is {tag}; expected 0 <= tag (at most MPI_TAG_UB of this MPI)")


_STEPS: dict[str, Callable[[_Call, tuple[str, ...]], None]] = {
    "in": _one(False),
    "out": _one(True),
    "ins": _list(False),
    "outs": _list(True),
    "many": _many,
    "same": _same,
    "apart": _apart,
    "lists apart": _lists_apart,
    "own": _own,
    "times": _times,
    "rows": _rows,
    "own splits": _own_splits,
    "op": _op,
    "root": _root,
    "rooted": _rooted,
    "splits": _splits,
    "peer": _peer,
    "tag": _tag,
}
