"""Point-to-point messages: ``send``, ``recv``, ``isend``, ``irecv`` (torch's names) and ``sendrecv``.

Ranks are world ranks (``dst``/``src``) or group ranks (``group_dst``/``group_src``), as in torch 2.6+.
``recv`` with no source receives from any rank and returns the world rank it came from. Buffers may be
any strided view (a ghost column ``u[:, 0]``): MPI reads and writes them in place through derived
datatypes (:mod:`mpicomm.core.layouts`).
"""

from __future__ import annotations

from typing import Any, TypeGuard

import numpy as np

from .. import _mpi
from ..core import cmpi, fast, lane, validation
from ..core import engine_gate as engine  # the gate: the engine itself loads past it, at first need
from ..core.arrays import Array
from ..core.buffers import _DATATYPES, check_array, check_disjoint, check_output, message, recv_message
from ..core.fast import TAG_UB_MIN
from ..core.groups import ProcessGroup, _State, resolve, warn_non_member
from ..core.watchdog import _Threads
from ..core.work import Work
from ..errors import ArgumentError, ArgumentTypeError, BackendArgumentError

__all__ = ["irecv", "isend", "recv", "send", "sendrecv"]

_Flag = validation._Flag


def _peer(g: ProcessGroup, rank: int | None, group_rank: int | None, fn: str, arg: str, any_ok: bool) -> int:
    """The group rank of send's/recv's peer; ``MPI.PROC_NULL`` (no peer) as MPI and sendrecv take it.

    The rule for every point-to-point call (docs/sharp-bits.rst): a peer is a rank of the group, or
    this MPI's own ``MPI.PROC_NULL`` for none (nothing moves); any other negative int is out of range
    and raises, as torch's calls do.
    """
    if rank is None and group_rank is None:
        if any_ok:
            return int(_mpi.MPI.ANY_SOURCE)
        raise ArgumentError(f"{fn}: no {arg} given; expected {arg}= (world rank) or group_{arg}=")
    null = int(_mpi.MPI.PROC_NULL)
    peer = _neighbour(g, rank, group_rank, fn, arg, null, ", or MPI.PROC_NULL for no peer")
    if peer == g.rank():
        raise ArgumentError(
            f"{fn}: {arg} is this rank ({g.ranks[peer]}); expected another rank "
            "(a message to or from itself could never be matched)"
        )
    return peer


def _tag(g: ProcessGroup, tag: object, fn: str, arg: str = "tag") -> int:
    if not isinstance(tag, (int, np.integer)) or isinstance(tag, bool):
        raise ArgumentTypeError(f"{fn}: {arg} is {tag!r}; expected an int")
    upper = _tag_upper_bound(g)
    if not 0 <= tag <= upper:
        raise ArgumentError(f"{fn}: {arg} is {tag}; expected 0 <= {arg} <= {upper} (MPI_TAG_UB of this MPI)")
    return int(tag)


def _tag_upper_bound(g: ProcessGroup) -> int:
    """The largest tag this MPI allows (``MPI_TAG_UB``, at least 32767), read once.

    The in-MPI lane reads it as it starts (:mod:`mpicomm.core.lane`): then no MPI call here, which
    a call the lane serves may not make while the engine's thread is inside MPI.
    """
    if _TagBound.value is None:
        known = lane.tag_upper_bound()
        _TagBound.value = known if known is not None else int(g.comm.Get_attr(_mpi.MPI.TAG_UB))
    return _TagBound.value


class _TagBound:
    value: int | None = None


def send(
    tensor: Array,
    dst: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_dst: int | None = None,
) -> None:
    """Send ``tensor`` to one rank and block until the buffer may be reused.

    Args:
        tensor: The data; any layout (a strided view is sent in place, without a copy).
        dst: World rank of the receiver; ``MPI.PROC_NULL`` sends nothing (as in MPI and
            :func:`sendrecv`); any other negative rank raises.
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
    w = _State.world
    if (  # the fast path: the peer and tag tested inline (a Python call is a tenth of a small message here)
        group is None
        and w is not None
        and not _Flag.on
        and type(tensor) is np.ndarray
        and group_dst is None
        and type(dst) is int
        and type(tag) is int
        and 0 <= dst < w._size
        and dst != w._rank
        and 0 <= tag <= TAG_UB_MIN
    ):
        dt = _DATATYPES.get(tensor.dtype)
        if dt is not None:
            if cmpi.send(tensor, dt, dst, tag, w.comm) is None:
                return None
            if fast.dt_in(tensor) is not None:
                w.comm.Send([tensor, dt], dst, tag)
                return None
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    x = check_array(tensor, fn, "tensor")
    peer = _peer(g, dst, group_dst, fn, "dst", any_ok=False)
    g.comm.Send(message(x, pack=True), peer, _tag(g, tag, fn))
    return None


def recv(
    tensor: Array,
    src: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_src: int | None = None,
) -> int:
    """Receive into ``tensor`` from one rank (any rank when no source is given).

    Args:
        tensor: Writeable output of any layout (a strided view is written in place), the size of the message.
        src: World rank of the sender; ``None`` (and no ``group_src``) for any rank;
            ``MPI.PROC_NULL`` receives nothing and returns -1 (as in MPI and :func:`sendrecv`); any
            other negative rank raises.
        group: The process group; ``None`` for the world.
        tag: Message tag to match.
        group_src: The sender as a rank of ``group``.

    Returns:
        The world rank the message came from (-1 from ``MPI.PROC_NULL`` or on a rank outside
        ``group``). A message shorter than ``tensor`` fills its first elements (in C order); the
        others keep their values, whatever the layout.

    Raises:
        ArgumentTypeError: ``tensor`` is not an array, or ``tag`` is not an int.
        ArgumentError: a source out of range, or a read-only ``tensor``.

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
    w = _State.world
    if (  # the fast path, as send's
        group is None
        and w is not None
        and not _Flag.on
        and type(tensor) is np.ndarray
        and group_src is None
        and type(src) is int
        and type(tag) is int
        and 0 <= src < w._size
        and src != w._rank
        and 0 <= tag <= TAG_UB_MIN
    ):
        dt = _DATATYPES.get(tensor.dtype)
        if dt is not None:
            if cmpi.recv(tensor, dt, src, tag, w.comm) is None:
                return src  # type: ignore[return-value]
            if fast.dt_out(tensor) is not None:
                w.comm.Recv([tensor, dt], src, tag)
                return src  # type: ignore[return-value]
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return -1
    x = check_output(tensor, fn, "tensor")
    peer = _peer(g, src, group_src, fn, "src", any_ok=True)
    status = _mpi.MPI.Status()
    msg, post = recv_message(x, pack=True)
    g.comm.Recv(msg, peer, _tag(g, tag, fn), status)
    if peer == _mpi.MPI.PROC_NULL:
        return -1  # nothing came (and nothing was written)
    if post is not None:
        post()
    return g.ranks[status.Get_source()]


def isend(
    tensor: Array,
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
    x = check_array(tensor, fn, "tensor")
    peer = _peer(g, dst, group_dst, fn, "dst", any_ok=False)
    msg = message(x, pack=True)
    req = g.comm.Isend(msg, peer, _tag(g, tag, fn))
    return Work([req], keep=(x, msg), fn="isend")


def irecv(
    tensor: Array,
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
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> u = np.zeros((3, 4))
        >>> if w > 1 and r < 2:
        ...     rq = mpicomm.irecv(u[:, 0], src=1 - r)  # into a ghost column, in place
        ...     mpicomm.send(np.arange(3.0), dst=1 - r)
        ...     _ = rq.wait()
        ...     print(u[:, 0].tolist())
        ... else:
        ...     print([0.0, 1.0, 2.0])
        [0.0, 1.0, 2.0]
    """
    fn = "irecv"
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    x = check_output(tensor, fn, "tensor")
    peer = _peer(g, src, group_src, fn, "src", any_ok=True)
    msg, post = recv_message(x, pack=True)
    req = g.comm.Irecv(msg, peer, _tag(g, tag, fn))
    return Work(
        [req],
        keep=(x, msg),
        result=[x],
        finish=post,
        status=_mpi.MPI.Status(),
        source_ranks=None if peer == _mpi.MPI.PROC_NULL else g.ranks,  # from MPI_PROC_NULL: -1
        fn="irecv",
    )


def sendrecv(
    tensor: Array,
    recv_tensor: Array,
    dst: int | None = None,
    src: int | None = None,
    group: ProcessGroup | None = None,
    tag: int | None = None,
    group_dst: int | None = None,
    group_src: int | None = None,
    sendtag: int | None = None,
    recvtag: int | None = None,
) -> int:
    """Send ``tensor`` to one rank and receive ``recv_tensor`` from another in one call (``MPI_Sendrecv``).

    torch.distributed has no such call. It is the halo-exchange step: every rank sends its edge to one
    neighbour and receives its ghost cells from the other, with no deadlock whatever the order of the
    ranks. ``None`` or ``MPI.PROC_NULL`` as ``dst`` sends nothing and as ``src`` receives nothing (the
    edge of a non-periodic domain, as mpi4py's ``Sendrecv`` takes it); either may be this rank itself
    (a periodic domain one rank wide). Both buffers may be strided views, read and written in place.

    ========  ==========================  ==========================
    rank      sends (``dst=r+1``)         receives (``src=r-1``)
    ========  ==========================  ==========================
    0         its edge to 1               nothing (``src=None``)
    1         its edge to 2               rank 0's edge
    2 (last)  nothing (``dst=None``)      rank 1's edge
    ========  ==========================  ==========================

    Args:
        tensor: The data to send; any layout.
        recv_tensor: Writeable output of any layout, the size of the incoming message; must not overlap
            ``tensor``.
        dst: World rank to send to; ``None`` or ``MPI.PROC_NULL`` to send nothing.
        src: World rank to receive from; ``None`` or ``MPI.PROC_NULL`` to receive nothing.
        group: The process group; ``None`` for the world.
        tag: Message tag, for both the message sent and the one received (default 0).
        group_dst: The destination as a rank of ``group`` (instead of ``dst``).
        group_src: The source as a rank of ``group`` (instead of ``src``).
        sendtag: mpi4py's name: the tag of the message sent (default 0); instead of ``tag``.
        recvtag: mpi4py's name: the tag to receive (default ``MPI.ANY_TAG``, as mpi4py's); instead
            of ``tag``.

    Returns:
        The world rank the message came from; -1 when nothing was received or on a rank outside ``group``.

    Raises:
        ArgumentTypeError: a buffer is not an array, or a tag or peer is not an int.
        ArgumentError: a peer out of range, a read-only ``recv_tensor``, buffers that overlap, or
            ``tag`` given with ``sendtag``/``recvtag``.

    Example:
        >>> import numpy as np, mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> u = np.zeros((2, 5))
        >>> u[:, 1:-1] = r
        >>> # ring: send the last interior column right, receive the left ghost column from the left
        >>> _ = mpicomm.sendrecv(u[:, -2], u[:, 0], dst=(r + 1) % w, src=(r - 1) % w)
        >>> u[:, 0].tolist() == [float((r - 1) % w)] * 2
        True
        >>> # a non-periodic line: the ends have no neighbour
        >>> left, right = (r - 1 if r > 0 else None), (r + 1 if r < w - 1 else None)
        >>> got = mpicomm.sendrecv(u[:, -2], u[:, 0], dst=right, src=left, sendtag=r, recvtag=(r - 1) % w)
        >>> got == (-1 if left is None else left)
        True
    """
    if _Threads.pending and engine.wanted(
        p2p=True, group=group
    ):  # the engine's gate, inline: behind the queued calls
        args = (tensor, recv_tensor, dst, src, group, tag, group_dst, group_src, sendtag, recvtag)
        return engine.through(_SENDRECV, args, {}, False)  # type: ignore[no-any-return]
    w = _State.world
    if (  # the fast path (the halo step of every time step): peers, tags and arrays checked in C
        w is not None and group is None and group_dst is None and group_src is None and not _Flag.on
    ):  # (before the first checked call, _Const.null is None, which the C function refuses)
        got = cmpi.sendrecv_checked(
            tensor,
            recv_tensor,
            dst,
            src,
            tag,
            sendtag,
            recvtag,
            w.comm,
            _DATATYPES,
            _Const.null,
            _Const.any_tag,
        )
        if got is not NotImplemented:
            return got  # type: ignore[no-any-return]
    return _sendrecv(tensor, recv_tensor, dst, src, group, tag, group_dst, group_src, sendtag, recvtag)


class _Consts:
    """MPI.PROC_NULL and MPI.ANY_TAG (their values differ between MPIs), read by the first checked call.

    One instance (:data:`_Const`): Python 3.11 specialises reads of an instance's slots, not a class's
    attributes (~130 instructions each on sendrecv's fast path).
    """

    __slots__ = ("any_tag", "null")

    def __init__(self) -> None:
        self.null: int | None = None
        self.any_tag = 0


_Const = _Consts()


def _sendrecv(
    tensor: Array,
    recv_tensor: Array,
    dst: int | None,
    src: int | None,
    group: ProcessGroup | None,
    tag: int | None,
    group_dst: int | None,
    group_src: int | None,
    sendtag: int | None,
    recvtag: int | None,
) -> int:
    """:func:`sendrecv` with every argument checked by name (any group, layout or tag)."""
    fn = "sendrecv"
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return -1
    x = check_array(tensor, fn, "tensor")
    y = check_output(recv_tensor, fn, "recv_tensor")
    check_disjoint(y, x, fn, "recv_tensor", "tensor")
    null = _Const.null = int(_mpi.MPI.PROC_NULL)
    _Const.any_tag = int(_mpi.MPI.ANY_TAG)
    to, frm, stag, rtag = _sendrecv_peers(g, dst, src, tag, group_dst, group_src, sendtag, recvtag)
    status = _mpi.MPI.Status()
    msg, post = recv_message(y, pack=True)
    g.comm.Sendrecv(message(x, pack=True), to, stag, msg, frm, rtag, status)
    if post is not None and frm != null:  # from MPI_PROC_NULL nothing came: the temporary is not data
        post()
    return -1 if frm == null else g.ranks[status.Get_source()]


def _sendrecv_peers(
    g: ProcessGroup,
    dst: int | None,
    src: int | None,
    tag: int | None,
    group_dst: int | None,
    group_src: int | None,
    sendtag: int | None,
    recvtag: int | None,
) -> tuple[int, int, int, int]:
    """The peers and tags of :func:`sendrecv` as MPI takes them, checked by name.

    ``(dst, src, sendtag, recvtag)``: group ranks or ``MPI_PROC_NULL``, tags or ``MPI_ANY_TAG``. No
    MPI call once ``MPI_TAG_UB`` is known (the in-MPI lane checks with it too).
    """
    fn = "sendrecv"
    null = int(_mpi.MPI.PROC_NULL)
    to = _neighbour(g, dst, group_dst, fn, "dst", null)
    frm = _neighbour(g, src, group_src, fn, "src", null)
    if tag is not None and (sendtag is not None or recvtag is not None):
        given = ", ".join(
            f"{k}={v!r}" for k, v in (("sendtag", sendtag), ("recvtag", recvtag)) if v is not None
        )
        raise ArgumentError(
            f"{fn}: both tag={tag!r} and {given} given; expected tag= (one tag for both messages) "
            "or sendtag=/recvtag= (mpi4py's names), not both"
        )
    any_tag = int(_mpi.MPI.ANY_TAG)
    if sendtag is None and recvtag is None:
        stag = rtag = _tag(g, 0 if tag is None else tag, fn)
    else:
        stag = 0 if sendtag is None else _tag(g, sendtag, fn, "sendtag")
        rtag = any_tag if recvtag is None or recvtag == any_tag else _tag(g, recvtag, fn, "recvtag")
    return to, frm, stag, rtag


def _neighbour(
    g: ProcessGroup,
    rank: object,
    group_rank: object,
    fn: str,
    arg: str,
    null: int,
    more: str = ", or None or MPI.PROC_NULL for no peer",
) -> int:
    """The group rank of a peer, or ``null`` (MPI_PROC_NULL) for none: None or MPI.PROC_NULL."""
    given = rank if group_rank is None else group_rank
    if rank is None and group_rank is None:
        return null
    if _is_int(given) and given == null and (rank is None or group_rank is None):
        return null
    return _peer_rank(g, rank, group_rank, fn, arg, more)


def _is_int(x: object) -> TypeGuard[int | np.integer[Any]]:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _peer_rank(g: ProcessGroup, rank: object, group_rank: object, fn: str, arg: str, more: str) -> int:
    """The group rank of a point-to-point peer given as a world rank or a group rank, checked by name.

    A peer is no root: the messages say which argument is wrong and what it may be (``more``: the
    other values the call takes).

    Raises:
        ArgumentTypeError: not an int.
        ArgumentError: both forms given, or a world rank outside the group.
        BackendArgumentError: out of range (a ValueError, and a RuntimeError as gloo's is).
    """
    if rank is not None and group_rank is not None:
        raise ArgumentError(
            f"{fn}: both {arg}={rank!r} and group_{arg}={group_rank!r} given; expected one of them"
        )
    given, shown = (rank, arg) if group_rank is None else (group_rank, f"group_{arg}")
    if not _is_int(given):
        raise ArgumentTypeError(f"{fn}: {shown} is {given!r}; expected an int rank{more}")
    peer = int(given)
    if group_rank is None and g is not _State.world:
        if peer not in g._index:
            raise ArgumentError(
                f"{fn}: {arg} is world rank {peer}, which is not part of group {g.name}; expected a "
                f"member's world rank{more}"
            )
        return g._index[peer]
    if not 0 <= peer < g._size:
        scope = "world" if group_rank is None else "group"
        raise BackendArgumentError(
            f"{fn}: {shown} is {peer}; expected a {scope} rank 0 <= {shown} < {g._size} "
            f"(the group size){more}"
        )
    return peer


#: sendrecv as the engine runs it (its gate is inline: mpicomm.core.engine.wanted).
_SENDRECV = engine.Spec("sendrecv", sendrecv, p2p=True, posts=False, validated=False, queued=True)
