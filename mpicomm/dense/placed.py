"""``gather`` in one MPI call, straight into the root's list entries.

torch's ``gather`` hands the root W separate arrays. ``MPI_Gatherv`` takes one buffer and one
displacement per rank; counted from the entry that lies lowest in memory, the displacements reach
every other entry where it lies, so one MPI call fills every entry in place, with no temporary and
no copy.

Every rank of a call makes the same MPI call whatever its own layouts, so the wire never depends on
what one rank alone sees (a non-root rank does not know the other ranks' sizes). How the root
describes its side is its own business: entries that are C-contiguous, of one dtype and within a C
``int`` of displacements of each other are reached in place (:func:`spread`); otherwise they go
through one contiguous temporary, copied out after the gather. (``scatter`` stays pairwise: from
1 MiB up, one message per rank beat ``MPI_Scatterv`` into the same entries, measured.)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _mpi
from ..core import cmpi, fast
from ..core.buffers import _DATATYPES, address, datatype, message
from ..core.groups import ProcessGroup
from ..core.work import Work, completed

__all__ = ["entries", "gather", "gather_fast", "spread"]

#: The largest displacement every MPI takes (a C int: Open MPI 5 has no MPI-4 large-count calls).
INT_MAX = (1 << 31) - 1
#: Bytes per entry up to which a common gather whose entries cmpi cannot reach from the lowest one
#: (addresses apart by other than whole elements) goes through its temporary (one copy per entry).
SMALL_GATHER = 64 << 10


def spread(arrays: list[np.ndarray]) -> tuple[np.ndarray, list[int]] | None:
    """The entry lowest in memory and each entry's displacement from it, in elements; or None.

    None when an entry is not C-contiguous, when the entries differ in dtype, or when a
    displacement is not a whole number of elements or does not fit a C int. Empty entries take
    displacement 0 (MPI reads or writes nothing there).

    Example:
        >>> import numpy as np
        >>> whole = np.zeros(10)
        >>> base, displs = spread([whole[6:], whole[:2]])
        >>> base is not None, displs
        (True, [6, 0])
        >>> spread([whole[::2], whole[:2]]) is None  # a strided entry
        True
    """
    dtype = arrays[0].dtype
    address = _mpi.MPI.Get_address
    addresses = []
    for a in arrays:
        if a.dtype != dtype or not a.flags.c_contiguous:
            return None
        addresses.append(address(a) if a.size else -1)
    placed = [v for v in addresses if v >= 0]
    if not placed:
        return arrays[0], [0] * len(arrays)
    low = min(placed)
    itemsize = dtype.itemsize
    displs = []
    for v in addresses:
        if v < 0:
            displs.append(0)
            continue
        d, rest = divmod(v - low, itemsize)
        if rest or d > INT_MAX:
            return None
        displs.append(d)
    return arrays[addresses.index(low)], displs


def _owner(x: np.ndarray) -> Any:
    """The array that owns ``x``'s memory (numpy collapses a view's base to the owner), or None."""
    base = x.base
    if base is None:
        return x
    return base if type(base) is np.ndarray and base.base is None else None


def entries(xs: Any, size: int, dt: Any, n: int, write: bool, owners: set[int], limit: int = -1) -> bool:
    """Whether ``xs`` is a list of ``size`` plain arrays of datatype ``dt`` and ``n`` elements each.

    Plain: C-contiguous numpy (writeable if ``write``), at most ``limit`` bytes when ``limit`` is not
    -1, owning its memory or a view of an array that owns it. Outputs (``write``) must have owners
    distinct from each other and from those already in ``owners``, which collects them; inputs must
    not share one. One loop, no generators: this is the whole cost of a common call's checks.

    Example:
        >>> import numpy as np
        >>> from mpicomm.core.buffers import datatype
        >>> xs = [np.zeros(2), np.zeros(2)]
        >>> entries(xs, 2, datatype(xs[0].dtype), 2, True, set())
        True
        >>> whole = np.zeros(4)  # two views of one array: their overlap is not told cheaply
        >>> entries([whole[:2], whole[2:]], 2, datatype(whole.dtype), 2, True, set())
        False
    """
    if type(xs) is not list or len(xs) != size:
        return False
    for x in xs:
        if type(x) is not np.ndarray or x.size != n or (limit >= 0 and x.nbytes > limit):
            return False
        flags = x.flags
        if not flags.c_contiguous or (write and not flags.writeable) or _DATATYPES.get(x.dtype) is not dt:
            return False
        owner = _owner(x)
        if owner is None:
            return False
        key = id(owner)
        if key in owners:
            return False
        if write:
            owners.add(key)
    return True


def _addresses(xs: Any, size: int, dt: Any, n: int, write: bool) -> list[int] | None:
    """The addresses of ``xs`` if it is a list of ``size`` plain numpy arrays of ``n`` > 0 elements.

    Plain: C-contiguous, writeable if ``write``, of the dtype whose cached MPI datatype is ``dt``.
    """
    if type(xs) is not list or len(xs) != size or n == 0:
        return None
    address, types = _mpi.MPI.Get_address, _DATATYPES
    found = []
    for x in xs:
        if type(x) is not np.ndarray or x.size != n:
            return None
        flags = x.flags
        if not flags.c_contiguous or (write and not flags.writeable) or types.get(x.dtype) is not dt:
            return None
        found.append(address(x))
    return found


def _reach(addresses: list[int], other: int, nbytes: int, itemsize: int) -> tuple[int, list[int]] | None:
    """The lowest entry's index and each entry's displacement from it, in elements; or None.

    None when two of the spans ``nbytes`` long starting at ``addresses`` and ``other`` overlap, or a
    displacement is not a whole number of elements or does not fit a C int.
    """
    ordered = sorted([*addresses, other])
    for i in range(1, len(ordered)):
        if ordered[i] - ordered[i - 1] < nbytes:
            return None
    low = min(addresses)
    displs = []
    for a in addresses:
        d, rest = divmod(a - low, itemsize)
        if rest or d > INT_MAX:
            return None
        displs.append(d)
    return addresses.index(low), displs


def gather_fast(w: ProcessGroup, x: Any, outs: Any, dst: Any) -> bool:
    """Serve a common ``gather`` (world group, blocking, validation off, plain numpy), or return False.

    The root's entries must have this rank's size (a call with uneven sizes takes the general path)
    and share no memory with each other or the input (else the general path sorts it out).
    """
    root = 0 if dst is None else dst
    if type(x) is not np.ndarray or type(root) is not int or not 0 <= root < w._size:
        return False
    dt = _DATATYPES.get(x.dtype)
    if dt is not None and cmpi.gather_list(x, outs, root, dt, w.comm, SMALL_GATHER) is None:
        return True
    dt = fast.dt_in(x)
    if dt is None:
        return False
    if w._rank != root:
        if outs is not None:
            return False
        w.comm.Gatherv([x, dt], None, root)
        return True
    found = _addresses(outs, w._size, dt, x.size, True)
    if found is None:
        return False
    placed = _reach(found, _mpi.MPI.Get_address(x), x.nbytes, x.itemsize)
    if placed is None:
        return False
    w.comm.Gatherv([x, dt], [outs[placed[0]], ([x.size] * w._size, placed[1]), dt], root)
    return True


def _packed(arrays: list[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """One contiguous temporary with room for every entry, and the entries' displacements in it."""
    counts = [a.size for a in arrays]
    return np.zeros(sum(counts), arrays[0].dtype), list(itertools.accumulate(counts, initial=0))[:-1]


def _unpack(outs: list[np.ndarray], tmp: np.ndarray, displs: list[int]) -> Callable[[], None]:
    def run() -> None:
        for o, d in zip(outs, displs, strict=True):
            o[...] = tmp[d : d + o.size].reshape(o.shape)

    return run


def _own(x: np.ndarray, slot: np.ndarray | None) -> Any:
    """What the root sends as its own entry ``slot`` of the list.

    ``MPI_IN_PLACE`` when ``x`` is that very entry (torch's in-place idiom); a contiguous copy when
    the two overlap otherwise, so MPI never sees aliased buffers; else ``x`` as it lies.
    """
    if slot is None or not np.may_share_memory(x, slot):
        return None
    same = x.flags.c_contiguous and slot.flags.c_contiguous and x.nbytes == slot.nbytes
    if same and (x.size == 0 or address(x) == address(slot)):
        return _mpi.MPI.IN_PLACE
    return np.ascontiguousarray(x).copy()


def gather(comm: Any, x: np.ndarray, outs: list[np.ndarray] | None, root: int, async_op: bool) -> Work | None:
    """``MPI_Gatherv`` of ``x`` (any layout) into ``outs`` (the root's list, None elsewhere).

    ``x`` may be the root's own entry ``outs[root]`` (sent ``MPI_IN_PLACE``).

    Returns:
        A Work if ``async_op``, else None once the entries are filled.
    """
    send: Any = message(x)
    recv: list[Any] | None = None
    after = None
    if outs is not None:
        placed = spread(outs)
        if placed is None:
            tmp, displs = _packed(outs)
            after = _unpack(outs, tmp, displs)
            placed = (tmp, displs)
        else:
            own = _own(x, outs[root])
            if own is not None:
                send = own if own is _mpi.MPI.IN_PLACE else message(own)
        recv = [placed[0], ([o.size for o in outs], placed[1]), datatype(outs[0].dtype)]
    comm.Gatherv(send, recv, root)
    if after is not None:
        after()
    return completed(outs or []) if async_op else None
