"""Fake device memory: numpy buffers registered as "device" regions, filled with a poison byte.

Every region knows its device; ``memcpyAsync`` uses the registry to check that each side of a copy
is the kind of memory its direction says and that the copy stays inside the region it starts in.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import numpy as np

#: The byte every fresh device or pinned allocation is filled with (uninitialised memory shows up).
POISON = 0xA5

DEVICE, PINNED = "device", "pinned"

_regions: dict[int, tuple[int, int, int, str]] = {}  # key -> (start, stop, device id, kind)
_keys = itertools.count()
_totals = {DEVICE: 0, PINNED: 0}
_peaks = {DEVICE: 0, PINNED: 0}


def _drop(key: int) -> None:
    entry = _regions.pop(key, None)
    if entry is not None:
        _totals[entry[3]] -= entry[1] - entry[0]


class Memory:
    """One allocation: a host buffer standing for device (or pinned) memory, owner of every view of it."""

    def __init__(
        self, nbytes: int, device_id: int, kind: str = DEVICE, keep: Any = None, ptr: int = 0
    ) -> None:
        self.size, self.device_id, self.kind, self._keep = int(nbytes), int(device_id), kind, keep
        if keep is None:
            self._buf = np.empty(max(self.size, 1), np.uint8)
            self._buf.fill(POISON)
            ptr = self._buf.ctypes.data
        self.ptr = int(ptr)
        self.__array_interface__ = {
            "shape": (self.size,),
            "typestr": "|u1",
            "data": (self.ptr, False),
            "version": 3,
        }
        key = next(_keys)
        _regions[key] = (self.ptr, self.ptr + self.size, self.device_id, kind)
        _totals[kind] += self.size
        _peaks[kind] = max(_peaks[kind], _totals[kind])
        weakref.finalize(self, _drop, key)

    def array(self) -> np.ndarray:
        """A 1-D ``uint8`` numpy view whose base is this object (so views keep it alive)."""
        return np.asarray(self)


def find(ptr: int) -> tuple[int, int, int, str] | None:
    """The live region that holds address ``ptr``, or None (plain host memory)."""
    for entry in _snapshot():
        if entry[0] <= ptr < entry[1] or entry[0] == ptr:
            return entry
    return None


def _snapshot() -> list[tuple[int, int, int, str]]:
    """The regions now. A collection can run a finaliser (:func:`_drop`) that shrinks the table
    while a copy is made (``tuple(d.values())`` allocates after its iterator has started: CI saw
    "dictionary changed size during iteration" there); then the copy is made again."""
    while True:
        try:
            return list(_regions.values())
        except RuntimeError:
            continue


def totals() -> dict[str, int]:
    """Bytes of live device and pinned allocations now."""
    return dict(_totals)


def peaks() -> dict[str, int]:
    """The most bytes of device and pinned allocations live at once so far."""
    return dict(_peaks)


def reset_peaks() -> None:
    """Start the peaks again from what is live now."""
    _peaks.update(_totals)
