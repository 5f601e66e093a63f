"""Point-to-point messages: ``send``, ``recv``, ``isend`` and ``irecv``, with torch.distributed's names.

Ranks are world ranks (``dst``/``src``) or group ranks (``group_dst``/``group_src``), as in torch 2.6+.
``recv`` with no source receives from any rank and returns the world rank it came from.
"""

from __future__ import annotations

import numpy as np

from .. import _mpi
from ..core.buffers import check_array, check_output, datatype, send_view
from ..core.groups import ProcessGroup, resolve, root_rank, warn_non_member
from ..core.work import Work
from ..errors import ArgumentError, ArgumentTypeError

__all__ = ["irecv", "isend", "recv", "send"]


def _peer(g: ProcessGroup, rank: int | None, group_rank: int | None, fn: str, arg: str, any_ok: bool) -> int:
    if rank is None and group_rank is None:
        if any_ok:
            return int(_mpi.MPI.ANY_SOURCE)
        raise ArgumentError(f"{fn}: no {arg} given; expected {arg}= (world rank) or group_{arg}=")
    peer = root_rank(g, rank, group_rank, fn, arg)
    if peer == g.rank():
        raise ArgumentError(
            f"{fn}: {arg} is this rank ({g.ranks[peer]}); expected another rank "
            "(a message to or from itself could never be matched)"
        )
    return peer


def _tag(g: ProcessGroup, tag: int, fn: str) -> int:
    if not isinstance(tag, (int, np.integer)) or isinstance(tag, bool):
        raise ArgumentTypeError(f"{fn}: tag is {tag!r}; expected an int")
    upper = _tag_upper_bound(g)
    if not 0 <= tag <= upper:
        raise ArgumentError(f"{fn}: tag is {tag}; expected 0 <= tag <= {upper} (MPI_TAG_UB of this MPI)")
    return int(tag)


def _tag_upper_bound(g: ProcessGroup) -> int:
    """The largest tag this MPI allows (``MPI_TAG_UB``, at least 32767), read once."""
    if _TagBound.value is None:
        _TagBound.value = int(g.comm.Get_attr(_mpi.MPI.TAG_UB))
    return _TagBound.value


class _TagBound:
    value: int | None = None


def send(
    tensor: np.ndarray,
    dst: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_dst: int | None = None,
) -> None:
    """Send ``tensor`` to one rank and block until the buffer may be reused.

    Args:
        tensor: The data; any layout (a non-contiguous array is copied once).
        dst: World rank of the receiver.
        group: The process group; ``None`` for the world.
        tag: Message tag that the receiver matches on.
        group_dst: The receiver as a rank of ``group`` (instead of ``dst``).

    Raises:
        ArgumentTypeError: ``tensor`` is not an array, or ``tag`` is not an int.
        ArgumentError: no destination, one out of range, or this rank itself.

    Example:
        >>> import numpy as np, mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> if w > 1 and r == 0:
        ...     mpicomm.send(np.arange(3.0), dst=1)
        >>> if w > 1 and r == 1:
        ...     x = np.empty(3); _ = mpicomm.recv(x, src=0)
    """
    fn = "send"
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    x = send_view(check_array(tensor, fn, "tensor"))
    peer = _peer(g, dst, group_dst, fn, "dst", any_ok=False)
    g.comm.Send([x, datatype(x.dtype)], peer, _tag(g, tag, fn))
    return None


def recv(
    tensor: np.ndarray,
    src: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_src: int | None = None,
) -> int:
    """Receive into ``tensor`` from one rank (any rank when no source is given).

    Args:
        tensor: Writeable C-contiguous output, the size of the message.
        src: World rank of the sender; ``None`` (and no ``group_src``) for any rank.
        group: The process group; ``None`` for the world.
        tag: Message tag to match.
        group_src: The sender as a rank of ``group``.

    Returns:
        The world rank the message came from (-1 on a rank outside ``group``).

    Raises:
        ArgumentTypeError: ``tensor`` is not an array, or ``tag`` is not an int.
        ArgumentError: a source out of range, a read-only or non-contiguous ``tensor``.

    Example:
        >>> import numpy as np, mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> if w > 1 and r == 1:
        ...     mpicomm.send(np.ones(2), dst=0)
        >>> if w > 1 and r == 0:
        ...     print(mpicomm.recv(np.empty(2)))
        ... else:
        ...     print(1)
        1
    """
    fn = "recv"
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return -1
    x = check_output(tensor, fn, "tensor")
    peer = _peer(g, src, group_src, fn, "src", any_ok=True)
    status = _mpi.MPI.Status()
    g.comm.Recv([x, datatype(x.dtype)], peer, _tag(g, tag, fn), status)
    return g.ranks[status.Get_source()]


def isend(
    tensor: np.ndarray,
    dst: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_dst: int | None = None,
) -> Work | None:
    """Start sending ``tensor`` to one rank; the returned Work completes when it may be reused.

    Args and Raises as for :func:`send`.

    Returns:
        A Work (``None`` on a rank outside ``group``).

    Example:
        >>> import numpy as np, mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> if w > 1 and r < 2:
        ...     out = np.empty(1)
        ...     rq = mpicomm.irecv(out, src=1 - r)
        ...     sq = mpicomm.isend(np.array([float(r)]), dst=1 - r)
        ...     _ = sq.wait(), rq.wait()
    """
    fn = "isend"
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    x = send_view(check_array(tensor, fn, "tensor"))
    peer = _peer(g, dst, group_dst, fn, "dst", any_ok=False)
    req = g.comm.Isend([x, datatype(x.dtype)], peer, _tag(g, tag, fn))
    return Work([req], keep=x)


def irecv(
    tensor: np.ndarray,
    src: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_src: int | None = None,
) -> Work | None:
    """Start receiving into ``tensor``; ``Work.source_rank()`` gives the sender's world rank.

    Args and Raises as for :func:`recv`.

    Returns:
        A Work (``None`` on a rank outside ``group``).

    Example:
        >>> import numpy as np, mpicomm
        >>> if mpicomm.get_world_size() == 1:
        ...     pass
    """
    fn = "irecv"
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    x = check_output(tensor, fn, "tensor")
    peer = _peer(g, src, group_src, fn, "src", any_ok=True)
    req = g.comm.Irecv([x, datatype(x.dtype)], peer, _tag(g, tag, fn))
    return Work([req], keep=x, result=[x], status=_mpi.MPI.Status(), source_ranks=g.ranks)
