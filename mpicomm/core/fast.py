"""The tests that let a common call skip the general checks: numpy C-contiguous arrays on the world group.

A collective's *fast path* serves the call torch users make most: blocking, on the world group,
validation off, C-contiguous numpy arrays of a dtype already seen (its MPI datatype cached). Every
test here is a few attribute reads; a call that fails any of them takes the general path, which
checks everything and raises the messages. The fast path never accepts a call the general path
would refuse: what it does not test itself (sizes, ranks, overlap), each collective tests before
its one MPI call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import chunks, cmpi, validation, watchdog
from .buffers import _DATATYPES
from .groups import ProcessGroup, _State

__all__ = ["TAG_UB_MIN", "WORLD", "apart", "broadcast_in_c", "comm_of", "dt_in", "dt_out", "peer", "world"]

#: MPI guarantees tags up to 32767 on every implementation (``MPI_TAG_UB`` is at least that).
TAG_UB_MIN = 32767

_Flag = validation._Flag

#: The world group, its communicator and its size, as the small calls' fast paths read them:
#: ``WORLD[1]`` where ``_State.world is WORLD[0]``, else :func:`comm_of`. A ProcessGroup's
#: attribute read is a lookup by name (cheap since core.late has no ``__getattr__`` hook, which
#: cost ~300 instructions a read on 3.11); an item of this list is cheaper still. Before the first call
#: ``WORLD[0]`` is a placeholder that no ``_State.world`` (a group or None) is; a new world (init
#: after ``destroy_process_group``) is a new group: the identity test never serves a freed one.
WORLD: list[Any] = [object(), None, -1]


def comm_of(g: ProcessGroup) -> Any:
    """``g``'s communicator (None off the group); the world's parts are kept in :data:`WORLD`.

    Example:
        >>> import mpicomm
        >>> w = mpicomm.init()
        >>> comm_of(w) is w.comm and WORLD[0] is w and WORLD[2] == w.size()
        True
    """
    comm = g.comm
    if g is _State.world:
        WORLD[:] = [g, comm, g._size]  # one assignment: a reader on another thread sees all or nothing
    return comm


def world(group: ProcessGroup | None, async_op: bool) -> ProcessGroup | None:
    """The world group if a call on ``group`` may take the fast path, else None.

    Example:
        >>> import mpicomm
        >>> world(None, async_op=True) is None  # asynchronous calls take the general path
        True
    """
    if group is None and async_op is False and not _Flag.on:
        return _State.world
    return None


def dt_in(x: Any) -> Any:
    """The cached MPI datatype of ``x`` if it is a C-contiguous numpy array, else None.

    Example:
        >>> dt_in([1.0]) is None
        True
    """
    if type(x) is np.ndarray and x.flags.c_contiguous:
        return _DATATYPES.get(x.dtype)
    return None


def dt_out(x: Any) -> Any:
    """Like :func:`dt_in`, for an output: also writeable.

    Example:
        >>> import numpy as np
        >>> a = np.zeros(2); a.flags.writeable = False
        >>> dt_out(a) is None
        True
    """
    if type(x) is np.ndarray:
        flags = x.flags
        if flags.c_contiguous and flags.writeable:
            return _DATATYPES.get(x.dtype)
    return None


def apart(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether numpy arrays ``a`` and ``b`` share no memory, told cheaply where ownership tells it.

    Two arrays that own their memory, or are views of two different arrays that own theirs (numpy
    collapses a view's base to the owner), cannot overlap; anything else (a base that is not a
    numpy array, such as a torch tensor's) asks ``numpy.may_share_memory``.

    Example:
        >>> import numpy as np
        >>> x = np.zeros(4)
        >>> apart(x, np.zeros(4)), apart(x, x[1:])
        (True, False)
    """
    oa, ob = a.base, b.base
    if oa is None:
        oa = a
    elif type(oa) is not np.ndarray or oa.base is not None:
        return not np.may_share_memory(a, b)
    if ob is None:
        ob = b
    elif type(ob) is not np.ndarray or ob.base is not None:
        return not np.may_share_memory(a, b)
    return oa is not ob


def peer(w: ProcessGroup, rank: object, group_rank: object, tag: object) -> bool:
    """Whether a point-to-point call's peer and tag need no more checks.

    They need none when the peer is another world rank, the tag one MPI allows everywhere and no
    group rank is given. :func:`mpicomm.send` and :func:`mpicomm.recv` make this test inline on
    their fast path (a Python call costs a tenth of a small message there); it stays here for code
    that imports it.

    Example:
        >>> import mpicomm
        >>> peer(mpicomm.init(), mpicomm.get_rank(), None, 0)  # a message to itself: the general path
        False
    """
    return (
        group_rank is None
        and type(rank) is int
        and type(tag) is int
        and 0 <= rank < w._size
        and rank != w._rank
        and 0 <= tag <= TAG_UB_MIN
    )


def broadcast_in_c() -> Any:
    """:func:`mpicomm.broadcast`'s fast path in C, for its front door; None where the C module is not built.

    The door's C form calls it before the host (``mpicomm/front/_door.c``): it serves the call the
    host's fast path serves without a Work (blocking, the world group, validation off, nothing
    queued for the engine, a C-contiguous writeable numpy array of a cached dtype, a world rank or
    None as ``src``, unchunked, ``cmpi.bcast`` bound and not replaced) with the host's tests on the
    state read here, and returns ``NotImplemented`` before any MPI call for every other call, which
    the host then serves (``mpicomm/core/_cmpi_bcast.c``). An 8-byte broadcast costs about 2,900
    instructions less than through the host in Python. Off with ``MPICOMM_C=0``, as the C door is.

    Example:
        >>> import numpy as np
        >>> fn = broadcast_in_c()
        >>> fn is None or fn(np.zeros(2), None, None, True, None) is NotImplemented  # async: the host's
        True
    """
    if cmpi.switched_off():
        return None
    try:
        from . import _cmpi  # type: ignore[attr-defined]
    except ImportError:
        return None
    t, f, s, c = watchdog._Threads, _Flag, _State, chunks.Setting

    def slot(obj: object, name: str) -> Any:
        return vars(type(obj))[name]  # the slot's member descriptor: the C side reads the slot in place

    _cmpi.broadcast_checked_bind(
        t, slot(t, "pending"), f, slot(f, "on"), s, slot(s, "world"), WORLD, _DATATYPES, c, slot(c, "least"),
        vars(cmpi), _cmpi.bcast,
    )  # fmt: skip
    return _cmpi.broadcast_checked
