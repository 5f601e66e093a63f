"""``P2POp`` and ``batch_isend_irecv``: a list of sends and receives started together, as in torch.

Every operation of the batch is checked before the first one is posted, so a bad entry never leaves
the others half sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _mpi
from ..core.arrays import Array
from ..core.buffers import check_array, check_output, datatype, send_view
from ..core.groups import ProcessGroup, resolve, warn_non_member
from ..core.work import Work
from ..errors import ArgumentError, ArgumentTypeError
from .p2p import _peer, _tag, irecv, isend

__all__ = ["P2POp", "batch_isend_irecv", "check_batch_aliasing"]

_OPS: dict[str, str] = {"isend": "dst", "irecv": "src", "send": "dst", "recv": "src"}


class P2POp:
    """One point-to-point operation of :func:`batch_isend_irecv` (torch.distributed's ``P2POp``).

    Args:
        op: :func:`mpicomm.isend` or :func:`mpicomm.irecv` (``send``/``recv`` are taken as the same).
        tensor: The array to send, or the writeable C-contiguous array to receive into.
        peer: The other side's world rank.
        group: The process group; ``None`` for the world.
        tag: The message tag.
        group_peer: The other side as a rank of ``group`` (instead of ``peer``).

    Raises:
        ArgumentTypeError: ``op`` is not isend/irecv.

    Example:
        >>> import numpy as np, mpicomm
        >>> mpicomm.P2POp(mpicomm.isend, np.zeros(2), peer=0)
        P2POp(isend, peer=0, tag=0)
    """

    __slots__ = ("group", "group_peer", "op", "peer", "tag", "tensor")

    def __init__(
        self,
        op: Callable[..., Any],
        tensor: Array,
        peer: int | None = None,
        group: ProcessGroup | None = None,
        tag: int = 0,
        group_peer: int | None = None,
    ) -> None:
        name = getattr(op, "__name__", None)
        if name not in _OPS or getattr(op, "__module__", "").split(".")[0] != "mpicomm":
            raise ArgumentTypeError(f"P2POp: op is {op!r}; expected mpicomm.isend or mpicomm.irecv")
        self.op = isend if _OPS[name] == "dst" else irecv
        self.tensor, self.peer, self.group, self.tag, self.group_peer = tensor, peer, group, tag, group_peer

    def __repr__(self) -> str:
        where = f"peer={self.peer}" if self.group_peer is None else f"group_peer={self.group_peer}"
        return f"P2POp({self.op.__name__}, {where}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """The host side of :func:`mpicomm.batch_isend_irecv` (its docstring says what it does).

    Every operation is checked, then each is posted as one MPI non-blocking call, in list order.

    Args:
        p2p_op_list: The operations (numpy arrays), all on the same group.

    Returns:
        One Work per operation, in list order.
    """
    posts = _check(p2p_op_list)
    return [post() for post in posts]


def _check(ops: list[P2POp]) -> list[Callable[[], Work]]:
    fn = "batch_isend_irecv"
    if not isinstance(ops, (list, tuple)) or not ops:
        raise ArgumentError(f"{fn}: p2p_op_list is {ops!r}; expected a non-empty list of P2POp")
    bad = next((i for i, p in enumerate(ops) if not isinstance(p, P2POp)), None)
    if bad is not None:
        raise ArgumentTypeError(f"{fn}: p2p_op_list[{bad}] is {ops[bad]!r}; expected a mpicomm.P2POp")
    if any(p.group is not ops[0].group for p in ops):
        raise ArgumentError(f"{fn}: the operations use different groups; expected one group for the batch")
    g = resolve(ops[0].group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return []
    posts = [_prepare(g, p, i, fn) for i, p in enumerate(ops)]
    check_batch_aliasing([p.tensor for p in ops], [p.op is irecv for p in ops], fn)
    return posts


def _span(x: np.ndarray) -> tuple[int, int]:
    """The byte addresses ``[low, high)`` of ``x``'s elements."""
    ptr = int(x.__array_interface__["data"][0])
    if x.size == 0:
        return ptr, ptr
    low = ptr + sum((n - 1) * s for n, s in zip(x.shape, x.strides, strict=True) if s < 0)
    return low, ptr + sum((n - 1) * s for n, s in zip(x.shape, x.strides, strict=True) if s > 0) + x.itemsize


def check_batch_aliasing(
    arrays: list[Any],
    written: list[bool],
    fn: str,
    span: Callable[[Any], tuple[int, int]] | None = None,
    exact: Callable[[Any, Any], bool] | None = None,
) -> None:
    """Raise if two operations of a batch share memory where one of them is received into.

    One sort of the byte ranges (O(n log n)); ranges that meet are compared element-exact where
    ``exact`` can (numpy: ``np.shares_memory`` for strided views). Two sends may share memory.

    Args:
        arrays: Each operation's array (numpy arrays, or device arrays with ``span``).
        written: Whether each operation receives into its array.
        fn: The public function, for the message.
        span: The byte range of an array; numpy's layout by default.
        exact: Whether two arrays whose ranges meet share an element; by default numpy's answer for
            numpy arrays, else True.

    Raises:
        ArgumentError: two operations overlap and one of them writes.
    """
    if not any(written):
        return
    spans = [(span or _span)(x) for x in arrays]
    order = sorted((k for k in range(len(arrays)) if spans[k][0] < spans[k][1]), key=lambda k: spans[k][0])
    open_: list[int] = []
    for k in order:
        open_ = [j for j in open_ if spans[j][1] > spans[k][0]]
        for j in open_:
            if (written[j] or written[k]) and _shares(arrays[j], arrays[k], exact):
                a, b = sorted((j, k))
                which = "both are" if written[a] and written[b] else "one of them is"
                raise ArgumentError(
                    f"{fn}: p2p_op_list[{b}].tensor overlaps p2p_op_list[{a}].tensor in memory and {which} "
                    "received into; expected separate arrays for the operations of one batch (MPI forbids "
                    "writing a buffer that another operation uses)"
                )
        open_.append(k)


def _shares(a: Any, b: Any, exact: Callable[[Any, Any], bool] | None) -> bool:
    if exact is not None:
        return exact(a, b)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return (a.flags.c_contiguous and b.flags.c_contiguous) or bool(np.shares_memory(a, b))
    return True


def _prepare(g: ProcessGroup, p: P2POp, i: int, fn: str) -> Callable[[], Work]:
    where = f"{fn}: p2p_op_list[{i}]"
    comm = g.comm
    if p.op is isend:
        x = send_view(check_array(p.tensor, where, "tensor"))
        peer = _peer(g, p.peer, p.group_peer, where, "peer", any_ok=False)
        tag = _tag(g, p.tag, where)
        return lambda: Work([comm.Isend([x, datatype(x.dtype)], peer, tag)], keep=x)
    y = check_output(p.tensor, where, "tensor")
    peer = _peer(g, p.peer, p.group_peer, where, "peer", any_ok=True)
    tag = _tag(g, p.tag, where)
    return lambda: Work(
        [comm.Irecv([y, datatype(y.dtype)], peer, tag)],
        keep=y,
        result=[y],
        status=_mpi.MPI.Status(),
        source_ranks=g.ranks,
    )
