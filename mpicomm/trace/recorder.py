"""The recorder: every traced call of this process as one row of a preallocated table of integers.

A row is :data:`WIDTH` 64-bit integers in one ``array('q')`` (the call's name, group, call site, array
kind and path as indices into small string tables, the bytes it sent and received, its start and end in
``time.perf_counter_ns``, its sequence number among the collectives of its group, flags and thread).
Recording a call writes twelve integers into the table: no event object, no string, no dictionary per
call. The table doubles when full (amortised), up to ``limit`` rows; later calls are counted, not kept.
Waits on the Work of an async call are rows of a second table (:data:`WAIT_WIDTH` integers).
"""

from __future__ import annotations

import struct
import sys
from array import array
from threading import get_ident
from time import perf_counter_ns
from typing import Any

from numpy import ndarray

from ..core import groups as _groups
from ..core.work import Work
from ..front import device as _device
from ..front import kinds as _kinds

__all__ = ["ASYNC", "FAILED", "FIELDS", "WAIT_WIDTH", "WIDTH", "Call", "Recorder", "Strings"]

#: The columns of a call's row.
FIELDS = ("name", "group", "site", "kind", "path", "sent", "recv", "start", "end", "seq", "flags", "thread")
NAME, GROUP, SITE, KIND, PATH, SENT, RECV, START, END, SEQ, FLAGS, THREAD = range(len(FIELDS))
WIDTH = len(FIELDS)
#: A wait's row: the call's row index, the wait's start and end, and whether it found the call done.
WAIT_WIDTH = 4
#: Flags of a call: it returned a Work (async), it raised.
ASYNC, FAILED = 1, 2

#: Module name prefixes of frames that are not the caller's (the first other frame is the call site);
#: ``mpicomm.apps`` are programs, so their frames are call sites.
_INSIDE = ("mpicomm.", "torch.distributed", "torch.nn.parallel", "torch.utils._contextlib", "contextlib")
_PROGRAMS = "mpicomm.apps."
_DEVICE_KINDS = frozenset((_kinds.CUPY, _kinds.CUDA))
_HOST, _DIRECT, _STAGED = 1, 2, 3
_ROW = struct.Struct(f"{WIDTH}q").pack_into
_BYTES = 8 * WIDTH


class Strings:
    """An interning table: each distinct string once, by index (index 0 is ``""``)."""

    __slots__ = ("index", "items")

    def __init__(self, *first: str) -> None:
        self.items: list[str] = ["", *first]
        self.index: dict[str, int] = {s: i for i, s in enumerate(self.items)}

    def id(self, text: str) -> int:
        """The index of ``text``, added on first sight."""
        i = self.index.get(text)
        if i is None:
            i = self.index[text] = len(self.items)
            self.items.append(text)
        return i


class Call:
    """What the recorder needs to know of one public call, worked out once when it is wrapped.

    Args:
        name: The public name (``"all_reduce"``).
        nid: Its index in the recorder's name table.
        slots: ``(position, argument, reads, writes)`` of each array argument.
        group: The position of the ``group`` argument (-1: none).
        collective: Whether every member of the group makes the call (it gets a sequence number).
    """

    __slots__ = ("collective", "group", "name", "nid", "slots")

    def __init__(
        self,
        name: str,
        nid: int,
        slots: tuple[tuple[int, str, bool, bool], ...],
        group: int,
        collective: bool,
    ) -> None:
        self.name, self.nid, self.slots, self.group, self.collective = name, nid, slots, group, collective


def nbytes(x: Any) -> int:
    """The bytes of an array, or of every array of a list (0 for anything else)."""
    size = getattr(x, "nbytes", None)
    if type(size) is int:
        return size
    if isinstance(x, (list, tuple)):
        return sum(nbytes(y) for y in x)
    return 0


class Recorder:
    """Every traced call of this process (one instance per process, :data:`mpicomm.trace.RECORDER`).

    Args:
        capacity: Rows allocated up front (the table doubles when full).
        limit: The most rows kept; later calls are counted in :attr:`dropped`.
        ring: Start again at row 0 when ``capacity`` is reached (the bench's recorder: a bounded table).

    Example:
        >>> rec = Recorder(capacity=4)
        >>> rec.n, len(rec.rows) // WIDTH
        (0, 4)
    """

    def __init__(self, capacity: int = 1 << 10, limit: int = 1 << 22, ring: bool = False) -> None:
        self.cap, self.limit, self.ring = capacity, max(limit, capacity), ring
        self.rows = array("q", bytes(8 * WIDTH * capacity))
        self.n = 0
        self.dropped = 0
        self.waits = array("q", bytes(8 * WAIT_WIDTH * 256))
        self.nwaits = 0
        self.names = Strings()
        self.groups = Strings()
        self.sites = Strings()
        self.kinds = Strings(*sorted({_kinds.NUMPY, _kinds.TORCH, _kinds.CUPY, _kinds.CUDA, _kinds.HOST}))
        self.paths = ("", "host", "direct", "staged")
        #: 1 while a traced call runs: calls it makes itself are not recorded again.
        self.depth = 0
        #: True until the clocks were compared at the first collective on the world group.
        self.unsynced = True
        self.comm: Any = None
        #: Clock samples: (local ns, offset to rank 0's clock in ns, round trip in ns).
        self.clock: list[tuple[int, int, int]] = []
        self.begin = perf_counter_ns()
        self.end = 0
        self.pending: dict[int, int] = {}
        self._seq: dict[int, int] = {}
        self._sites: dict[Any, dict[int, int]] = {}
        self._inside: dict[Any, bool] = {}
        self._groups: dict[int, tuple[Any, int]] = {}
        self._numpy = self.kinds.id(_kinds.NUMPY)
        self._world: tuple[Any, int] = (None, 0)
        self._direct: dict[str, int] = {}

    # -- the hot path

    def add(self, call: Call, args: tuple[Any, ...], kwargs: dict[str, Any], start: int, end: int, out: Any,
            flags: int) -> None:  # fmt: skip
        """Record one call that ran from ``start`` to ``end`` and returned ``out``."""
        i = self.n
        if i == self.cap:
            if not self._grow():
                return
            i = self.n  # 0 again in a ring
        n, sent, recv, first = len(args), 0, 0, None
        for pos, arg, reads, writes in call.slots:
            x = args[pos] if pos < n else kwargs.get(arg)
            if x is None:
                continue
            size = nbytes(x)
            sent += size if reads else 0
            recv += size if writes else 0
            if first is None:
                first = x
        g = call.group
        gid = self.group_id(args[g] if 0 <= g < n else kwargs.get("group"))
        seq = -1
        if call.collective:
            seq = self._seq.get(gid, 0)
            self._seq[gid] = seq + 1
        if out is not None and isinstance(out, Work):
            flags |= ASYNC
            self.pending[id(out)] = i
        if type(first) is ndarray:
            kind, path = self._numpy, _HOST
        elif first is not None:
            kind, path = self.kind_path(first, call.name)
        else:
            kind = path = 0
        # one struct write of the twelve fields (a third of the time of twelve item writes); the
        # thread's ident is numbered 0, 1, ... in the files
        site, nid, thread = self.site(), call.nid, get_ident()
        _ROW(self.rows, i * _BYTES, nid, gid, site, kind, path, sent, recv, start, end, seq, flags, thread)
        self.n = i + 1

    def add_wait(self, index: int, start: int, end: int, done: bool) -> None:
        """Record a wait (or a test that found it done, ``done``) on the Work of call row ``index``."""
        j = self.nwaits
        if (j + 1) * WAIT_WIDTH > len(self.waits):
            self.waits.frombytes(bytes(len(self.waits) * 8))
        o = j * WAIT_WIDTH
        self.waits[o], self.waits[o + 1], self.waits[o + 2], self.waits[o + 3] = index, start, end, int(done)
        self.nwaits = j + 1

    def _grow(self) -> bool:
        """Make room for one more row: double the table, start again (ring), or drop (at the limit)."""
        if self.ring:
            self.n = 0
            self.pending.clear()
            return True
        if self.cap >= self.limit:
            self.dropped += 1
            return False
        grow = min(self.cap, self.limit - self.cap)
        self.rows.frombytes(bytes(8 * WIDTH * grow))
        self.cap += grow
        return True

    # -- what a row refers to

    def site(self) -> int:
        """The index of the call site ``file:line (function)``: the first frame outside mpicomm and torch."""
        f = sys._getframe(2)
        inside = self._inside
        while f.f_back is not None:
            code = f.f_code
            skip = inside.get(code)
            if skip is None:
                name = f.f_globals.get("__name__", "")
                skip = inside[code] = name.startswith(_INSIDE) and not name.startswith(_PROGRAMS)
            if not skip:
                break
            f = f.f_back
        lines = self._sites.get(f.f_code)
        if lines is None:
            lines = self._sites[f.f_code] = {}
        sid = lines.get(f.f_lineno)
        if sid is None:
            code = f.f_code
            sid = lines[f.f_lineno] = self.sites.id(f"{code.co_filename}:{f.f_lineno} ({code.co_name})")
        return sid

    def group_id(self, group: Any) -> int:
        """The index of the group's label: ``world``, or its name and world ranks (alike on every member)."""
        world = _groups._State.world
        if group is None and world is self._world[0]:
            return self._world[1]
        g = world if group is None else group
        if g is None:
            return 0
        known = self._groups.get(id(g))
        if known is not None and known[0] is g:
            return known[1]
        label = "world" if g is world else f"{g.name} {_ranks(g.ranks)}"
        gid = self.groups.id(label)
        if g is world:
            self._world = (world, gid)
        self._groups[id(g)] = (g, gid)  # the group is kept: its id is not reused by another one
        return gid

    def kind_path(self, x: Any, fn: str) -> tuple[int, int]:
        """The indices of the array kind of ``x`` and of the path the call took (host, direct, staged)."""
        kind = _kinds.kind_of(x)
        if kind == _kinds.LIST:
            if not x:
                return 0, _HOST
            x = x[0]
            kind = _kinds.kind_of(x)
        device = kind in _DEVICE_KINDS or (kind == _kinds.TORCH and getattr(x, "is_cuda", False))
        if not device:
            return self.kinds.id(kind), _HOST
        direct = _device.PATHS[fn, "direct"]  # the front door counts its direct calls
        took = _DIRECT if direct != self._direct.get(fn, 0) else _STAGED
        self._direct[fn] = direct
        return self.kinds.id(kind), took


def _ranks(ranks: list[int]) -> str:
    """World ranks, short: ``[0,2,4]``, or ``[0..63]/64`` for a long list."""
    if len(ranks) <= 8:
        return "[" + ",".join(map(str, ranks)) + "]"
    return f"[{ranks[0]},{ranks[1]}..{ranks[-1]}]/{len(ranks)}"
