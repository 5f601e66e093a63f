"""``P2POp`` and ``batch_isend_irecv``: a list of sends and receives started together, as in torch.

Every operation of the batch is checked before the first one is posted, so a bad entry never leaves
the others half sent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _mpi
from ..core.buffers import check_array, check_output, datatype, send_view
from ..core.groups import ProcessGroup, resolve, warn_non_member
from ..core.work import Work
from ..errors import ArgumentError, ArgumentTypeError
from .p2p import _peer, _tag, irecv, isend

__all__ = ["P2POp", "batch_isend_irecv"]

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
        tensor: np.ndarray,
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
    return [_prepare(g, p, i, fn) for i, p in enumerate(ops)]


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
