"""Object collectives: pickled Python objects, with torch.distributed's names, arguments and semantics.

.. warning::
   These calls use pickle, and unpickling runs code chosen by the sender: a crafted object can run any
   command on every receiving rank. Use them only between ranks you trust, or turn on safe mode
   (``safe=True``, :func:`~mpicomm.set_safe_unpickling` or ``MPICOMM_SAFE_PICKLE=1``), which loads
   builtin containers and scalars, numpy arrays and dtypes (not object dtypes), and the classes you
   allow with :func:`~mpicomm.allow_unpickle`, and refuses everything else. Safe mode stops code
   from running, not memory exhaustion (``bytearray(2**32)`` is a 30-byte pickle).

What mpicomm does better than torch: numpy arrays inside objects travel out of band (pickle protocol 5,
sent from their own memory, never copied into the pickle stream); a small broadcast is one message
plus one 8-byte status reduction; gathers use ``Allgatherv``/``Gatherv``/``Scatterv`` instead of padding
every object to the largest; objects over 2 GiB work on every MPI; and when an object cannot be
pickled on its sender or unpickled on a receiver, or the lists disagree in length, every rank of the
call raises the same error (naming the element, the world rank and the cause) instead of hanging;
so does an argument that is wrong on one rank only (a ``None`` instead of a list, a ``device`` it
cannot serve).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.buffers import displacements
from ..core.calls import collective
from ..core.control import MAX_TEXT, bcast_text, decode
from ..core.groups import ProcessGroup, root_rank, warn_non_member
from .devbufs import Incoming, Outgoing, split_words
from .messages import (
    I8,
    Problem,
    _agree,
    _list_problem,
    _pickle,
    _pickle_list,
    _ready,
    _received,
    _stage,
    _start,
    _unpickle,
    _validate,
)
from .moves import _buffer_rounds, _scatter_buffers, _scatter_source
from .wire import (
    agree,
    allgatherv,
    as_bytes,
    bcast_bytes,
    check_counts,
    gatherv,
    raise_first,
    raise_reports,
    receive_buffer,
    recv_envelope,
    scatterv,
    send_envelope,
)

__all__ = ["all_gather_object", "broadcast_object_list", "gather_object", "scatter_object_list"]


@collective("broadcast_object_list")
def broadcast_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: ProcessGroup | None = None,
    device: Any = None,
    group_src: int | None = None,
    *,
    safe: bool | None = None,
) -> None:
    """Broadcast the picklable objects in ``object_list`` from the source to every rank's list, in place.

    Every rank passes a list of the same length; on the other ranks its contents are replaced in
    place. The source's own list is left as it is: the same objects, not copies.

    ======  =======================  =======================
    rank    object_list in           object_list out
    ======  =======================  =======================
    0 src   ``["foo", 12, {1: 2}]``  ``["foo", 12, {1: 2}]``
    1       ``[None, None, None]``   ``["foo", 12, {1: 2}]``
    2       ``[None, None, None]``   ``["foo", 12, {1: 2}]``
    ======  =======================  =======================

    .. warning:: Unpickling runs code chosen by the sender; use only with trusted peers or ``safe=True``.

    Args:
        object_list: The objects on the source; a list of the same length elsewhere.
        src: World rank of the source (default: group rank 0).
        group: The process group; ``None`` for the world.
        device: Where arrays found in received objects go: ``None`` (as unpickled), ``"cpu"``
            (numpy) or ``"cuda"`` / ``"cuda:N"`` (cupy arrays on the current / N-th GPU).
        group_src: The source as a rank of ``group`` (instead of ``src``).
        safe: Unpickle with the allow-list only; ``None`` follows :func:`~mpicomm.set_safe_unpickling`.

    Returns:
        None.

    Raises:
        ArgumentTypeError: on every rank: ``object_list`` is not a list, or ``safe`` is not a bool,
            on some rank.
        ArgumentError: bad source; on every rank: a bad ``device`` somewhere, the source's list is
            empty or the lengths differ.
        ObjectCollectiveError: on every rank: an object cannot be pickled on the source or
            unpickled on some rank.
        UnpicklingRefusedError: on every rank: safe mode refused a class.

    Example:
        >>> import mpicomm
        >>> objs = ["foo", 12, {1: 2}] if mpicomm.get_rank() == 0 else [None] * 3
        >>> mpicomm.broadcast_object_list(objs, src=0)
        >>> objs
        ['foo', 12, {1: 2}]
    """
    fn = "broadcast_object_list"
    g, dev, safe, problem = _start(group, fn, device, safe)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    problem = problem or _list_problem(object_list, fn, "object_list")
    root = root_rank(g, src, group_src, fn, "src")
    _validate(g, fn, {"src": root})
    me, source = g.ranks[g.rank()], g.ranks[root]
    if g.rank() == root:
        kind, msg, streams, buffers = _pickle_list(object_list, fn, source, problem)
        kind, msg, header, stream, outgoing = _ready(kind, msg, streams, buffers, fn, g)
        try:
            send_envelope(g.comm, header, stream, root)
            for buf in [] if outgoing is None else outgoing.bufs:
                bcast_bytes(g.comm, buf, root)
        finally:
            if outgoing is not None:
                outgoing.close()
        if kind:
            raise_first([(kind, msg)])
        agree(g, 0, "")
        return None
    header, stream = recv_envelope(g.comm, root, fn)
    kind, n = int(header[0]), int(header[1])
    if kind:
        raise_first([(kind, decode(stream[:MAX_TEXT]))])
    bufs: list[Any] = []
    msg = ""
    if header.size > 4 + n:
        incoming = Incoming(*split_words(header[4 + n :].tolist()), receive_buffer)
        try:
            for b in incoming.bufs:  # taken part in even with a problem here, so the source is not stuck
                bcast_bytes(g.comm, b, root)
        except BaseException:
            incoming.drop()
            raise
        bufs, kind, msg = _received(incoming, fn, me)  # kind != 0: no device buffers here
    got: list[Any] = []
    fatal = None
    if problem is not None:
        kind, msg = problem
    elif kind:
        got = []
    elif len(object_list) != n:
        kind = 1
        msg = (
            f"{fn}: object_list has {len(object_list)} entries on rank {me} but {n} on the source rank "
            f"{source}; expected the same length on every rank"
        )
    else:
        names = [f"{fn}: object_list[{i}] from rank {source}" for i in range(n)]
        sizes = [int(s) for s in header[4 : 4 + n]]
        kind, msg, got, fatal = _unpickle(stream, sizes, bufs, safe, dev, names, me)
    _agree(g, kind, msg, fatal)
    object_list[:] = got
    return None


def _pickle_one(obj: Any, fn: str, rank: int, problem: Problem) -> tuple[int, str, bytes, list[Any]]:
    if problem is not None:
        return problem[0], problem[1], b"", []
    kind, msg, streams, buffers = _pickle([obj], fn, "obj", rank)
    return kind, msg, (streams[0] if streams else b""), (buffers[0] if buffers else [])


@collective("all_gather_object")
def all_gather_object(
    object_list: list[Any],
    obj: Any,
    group: ProcessGroup | None = None,
    *,
    device: Any = None,
    safe: bool | None = None,
) -> None:
    """Gather one picklable object from every rank into ``object_list`` on every rank.

    ``object_list`` needs at least one entry per group rank (the idiom is ``[None] * world_size``);
    entries ``0 .. W-1`` are replaced, later ones left alone. Every entry is an unpickled copy, this
    rank's own object included.

    ======  =======  =======================
    rank    obj      object_list out
    ======  =======  =======================
    0       "foo"    ``["foo", 12, {1: 2}]``
    1       12       ``["foo", 12, {1: 2}]``
    2       {1: 2}   ``["foo", 12, {1: 2}]``
    ======  =======  =======================

    .. warning:: Unpickling runs code chosen by the sender; use only with trusted peers or ``safe=True``.

    Args:
        object_list: Output, a list of at least the group size.
        obj: This rank's object.
        group: The process group; ``None`` for the world.
        device: Where arrays in received objects go (see :func:`broadcast_object_list`).
        safe: Unpickle with the allow-list only; ``None`` follows the global setting.

    Returns:
        None.

    Raises:
        ArgumentTypeError: on every rank: ``object_list`` is not a list on some rank.
        ArgumentError: on every rank: a bad ``device`` somewhere, or some rank's ``object_list``
            is shorter than the group.
        ObjectCollectiveError: on every rank: an object cannot be pickled or unpickled.
        UnpicklingRefusedError: on every rank: safe mode refused a class.

    Example:
        >>> import mpicomm
        >>> w = mpicomm.get_world_size()
        >>> out = [None] * w
        >>> mpicomm.all_gather_object(out, {"rank": mpicomm.get_rank()})
        >>> [o["rank"] for o in out] == list(range(w))
        True
    """
    fn = "all_gather_object"
    g, dev, safe, problem = _start(group, fn, device, safe)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    me = g.ranks[g.rank()]
    problem = problem or _list_problem(object_list, fn, "object_list")
    if problem is None and len(object_list) < g.size():
        problem = (
            1,
            (
                f"{fn}: object_list has {len(object_list)} entries on rank {me}; expected at least "
                f"{g.size()} (the group size), e.g. [None] * {g.size()}"
            ),
        )
    _validate(g, fn, {})
    kind, msg, stream, buffers = _pickle_one(obj, fn, me, problem)
    kind, msg, outgoing = _stage(kind, msg, buffers, fn, me, g.size() > 1)
    try:
        meta = _exchange_meta(g, kind, len(stream), len(buffers), msg, fn)
        sizes, nbufs = meta[:, 1].tolist(), meta[:, 2].tolist()
        streams = allgatherv(g, as_bytes(stream), sizes)
        bufs, kind, msg = _buffer_rounds(g, buffers, outgoing, nbufs, None, fn)
    finally:
        if outgoing is not None:
            outgoing.close()
    got: list[Any] = []
    fatal = None
    if not kind:
        kind, msg, got, fatal = _unpickle_ranks(streams, sizes, bufs, safe, dev, fn, g)
    _agree(g, kind, msg, fatal)
    object_list[: g.size()] = got
    return None


def _exchange_meta(g: ProcessGroup, kind: int, size: int, nbufs: int, msg: str, fn: str) -> np.ndarray:
    """Allgather (kind, stream bytes, buffer count) of every rank; raise everywhere if one failed.

    Claims no real message makes (negative, or beyond memory) raise ObjectCollectiveError everywhere.
    """
    meta = np.empty((g.size(), 3), I8)
    g.comm.Allgather(np.array([kind, size, nbufs], I8), meta)
    if meta[:, 0].any():
        raise_reports(g, kind, msg)
    for r, (_, size_r, nbufs_r) in enumerate(meta.tolist()):
        check_counts(fn, [nbufs_r], [size_r], r)
    check_counts(fn, [], meta[:, 1].tolist(), None)
    return meta


def _unpickle_ranks(
    streams: np.ndarray,
    sizes: list[int],
    bufs: list[list[np.ndarray]],
    safe: bool,
    dev: Any,
    fn: str,
    g: ProcessGroup,
) -> tuple[int, str, list[Any], BaseException | None]:
    got = []
    me = g.ranks[g.rank()]
    for r, (start, size) in enumerate(zip(displacements(sizes), sizes, strict=True)):
        names = [f"{fn}: the object from rank {g.ranks[r]}"]
        kind, msg, one, fatal = _unpickle(
            streams[start : start + size], [size], bufs[r], safe, dev, names, me
        )
        if kind:
            return kind, msg, [], fatal
        got.extend(one)
    return 0, "", got, None


@collective("gather_object")
def gather_object(
    obj: Any,
    object_gather_list: list[Any] | None = None,
    dst: int | None = None,
    group: ProcessGroup | None = None,
    group_dst: int | None = None,
    *,
    device: Any = None,
    safe: bool | None = None,
) -> None:
    """Gather one picklable object from every rank into ``object_gather_list`` on the destination.

    ======  =======  ==================================
    rank    obj      object_gather_list out
    ======  =======  ==================================
    0 dst   "foo"    ``["foo", 12, {1: 2}]``
    1       12       ``None`` (not given)
    2       {1: 2}   ``None`` (not given)
    ======  =======  ==================================

    .. warning:: Unpickling runs code chosen by the sender; use only with trusted peers or ``safe=True``.

    Args:
        obj: This rank's object.
        object_gather_list: On the destination, a list of at least the group size (entries
            ``0 .. W-1`` are replaced); ``None`` or empty elsewhere.
        dst: World rank of the destination (default: group rank 0).
        group: The process group; ``None`` for the world.
        group_dst: The destination as a rank of ``group``.
        device: Where arrays in received objects go (see :func:`broadcast_object_list`).
        safe: Unpickle with the allow-list only; ``None`` follows the global setting.

    Returns:
        None.

    Raises:
        ArgumentTypeError: on every rank: ``object_gather_list`` is neither a list nor None on some rank.
        ArgumentError: bad destination; on every rank: the list is missing or short on the
            destination, or given on another rank.
        ObjectCollectiveError: on every rank: an object cannot be pickled or unpickled.
        UnpicklingRefusedError: on every rank: safe mode refused a class.

    Example:
        >>> import mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> out = [None] * w if r == 0 else None
        >>> mpicomm.gather_object(r * 10, out, dst=0)
        >>> r != 0 or out == [10 * i for i in range(w)]
        True
    """
    fn = "gather_object"
    g, dev, safe, problem = _start(group, fn, device, safe)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    problem = problem or _list_problem(object_gather_list, fn, "object_gather_list", none_ok=True)
    root = root_rank(g, dst, group_dst, fn, "dst")
    _validate(g, fn, {"dst": root})
    problem = problem or _gather_list_problem(object_gather_list, g, root, fn)
    me = g.ranks[g.rank()]
    kind, msg, stream, buffers = _pickle_one(obj, fn, me, problem)
    kind, msg, outgoing = _stage(kind, msg, buffers, fn, me, g.rank() != root)
    try:
        meta = _exchange_meta(g, kind, len(stream), len(buffers), msg, fn)
        sizes, nbufs = meta[:, 1].tolist(), meta[:, 2].tolist()
        streams = gatherv(g, as_bytes(stream), sizes, root)
        bufs, kind, msg = _buffer_rounds(g, buffers, outgoing, nbufs, root, fn)
    finally:
        if outgoing is not None:
            outgoing.close()
    got: list[Any] = []
    fatal = None
    if streams is not None and not kind:
        kind, msg, got, fatal = _unpickle_ranks(streams, sizes, bufs, safe, dev, fn, g)
    _agree(g, kind, msg, fatal)
    if object_gather_list is not None and g.rank() == root:
        object_gather_list[: g.size()] = got
    return None


def _gather_list_problem(out: list[Any] | None, g: ProcessGroup, root: int, fn: str) -> Problem:
    me, dst = g.ranks[g.rank()], g.ranks[root]
    if g.rank() != root:
        if out:
            return 1, (
                f"{fn}: object_gather_list is given on rank {me}, which is not the destination "
                f"{dst}; expected None there"
            )
        return None
    if not out or len(out) < g.size():
        return 1, (
            f"{fn}: object_gather_list is {'missing' if not out else f'of length {len(out)}'} on the "
            f"destination rank {dst}; expected a list of at least {g.size()} (the group size), e.g. "
            f"[None] * {g.size()}"
        )
    return None


@collective("scatter_object_list")
def scatter_object_list(
    scatter_object_output_list: list[Any],
    scatter_object_input_list: list[Any] | None = None,
    src: int | None = None,
    group: ProcessGroup | None = None,
    group_src: int | None = None,
    *,
    device: Any = None,
    safe: bool | None = None,
) -> None:
    """Send ``scatter_object_input_list[r]`` from the source to rank r's ``scatter_object_output_list[0]``.

    ======  =====================================  ==========================
    rank    input (source only)                    output[0] out
    ======  =====================================  ==========================
    0 src   ``["foo", 12, {1: 2}]``                ``"foo"``
    1       ignored                                ``12``
    2       ignored                                ``{1: 2}``
    ======  =====================================  ==========================

    .. warning:: Unpickling runs code chosen by the sender; use only with trusted peers or ``safe=True``.

    Args:
        scatter_object_output_list: A list of at least one entry on every rank; entry 0 receives.
        scatter_object_input_list: On the source, exactly one object per group rank; ignored elsewhere.
        src: World rank of the source (default: group rank 0).
        group: The process group; ``None`` for the world.
        group_src: The source as a rank of ``group``.
        device: Where arrays in received objects go (see :func:`broadcast_object_list`).
        safe: Unpickle with the allow-list only; ``None`` follows the global setting.

    Returns:
        None.

    Raises:
        ArgumentTypeError: on every rank: the output is not a list on some rank.
        ArgumentError: bad source; on every rank: an empty output list somewhere, or an input list
            on the source that is not one object per rank.
        ObjectCollectiveError: on every rank: an object cannot be pickled or unpickled.
        UnpicklingRefusedError: on every rank: safe mode refused a class.

    Example:
        >>> import mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> out = [None]
        >>> mpicomm.scatter_object_list(out, [f"to {i}" for i in range(w)] if r == 0 else None, src=0)
        >>> out[0] == f"to {r}"
        True
    """
    fn = "scatter_object_list"
    g, dev, safe, problem = _start(group, fn, device, safe)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    out = scatter_object_output_list
    problem = problem or _list_problem(out, fn, "scatter_object_output_list")
    root = root_rank(g, src, group_src, fn, "src")
    _validate(g, fn, {"src": root})
    me, source = g.ranks[g.rank()], g.ranks[root]
    if problem is None and not out:
        problem = (
            1,
            (
                f"{fn}: scatter_object_output_list is empty on rank {me}; expected a list of at least "
                "one entry, e.g. [None] (torch says: Expected argument scatter_object_output_list to be a "
                "list of size at least 1.)"
            ),
        )
    kind, msg = problem or (0, "")
    row = np.empty(4, I8)
    streams: list[bytes] | None = None
    buffers: list[list[Any]] = []
    outgoing: list[Outgoing | None] = []
    try:
        if g.rank() == root:
            rows, source_msg, streams, buffers, outgoing = _scatter_source(g, scatter_object_input_list, fn)
            g.comm.Scatter(rows, row, root)
        else:
            g.comm.Scatter(None, row, root)
            source_msg = ""
        if row[0]:
            text = bcast_text(g.comm, source_msg.encode(), root, side=g.internal)
            raise_first([(int(row[0]), decode(text))])
        check_counts(fn, [int(row[2])], [int(row[1]), int(row[3])], root)
        parts = None if streams is None else [as_bytes(x) for x in streams]
        stream = scatterv(g, parts, int(row[1]), int(row[3]), root)
        mine, got_kind, got_msg = _scatter_buffers(g, buffers, outgoing, int(row[2]), root)
    finally:
        for out_r in outgoing:
            if out_r is not None:
                out_r.close()
    got: list[Any] = []
    fatal = None
    if kind == 0:
        kind, msg = got_kind, got_msg
    if kind == 0:
        names = [f"{fn}: scatter_object_input_list[{g.rank()}] from rank {source}"]
        kind, msg, got, fatal = _unpickle(stream, [stream.size], mine, safe, dev, names, me)
    _agree(g, kind, msg, fatal)
    out[0] = got[0]
    return None
