"""The jagged code on device arrays: the array's own namespace (numpy or cupy) and the device recat index.

A KeyedJaggedArray holds numpy arrays or cupy arrays (a torch CUDA tensor or another device array is
viewed as a cupy array by the front door). Its checks and methods run in the namespace of its
arrays: numpy for numpy (the host path, unchanged), cupy for cupy, found from the array's type
without importing cupy here. What must reach the host (a check's verdict, the per-key value
offsets that the counts message carries) comes over as a few numbers, never the values.

:func:`segment_index` builds the recat index on the device from per-segment counts the host
already has (the counts message): a scatter of one jump per segment and a cumulative sum, so no
Python loop runs over keys, sources or values, and no index of the values' length crosses the bus.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..errors import ArgumentTypeError

__all__ = ["is_device", "namespace", "segment_index", "to_host", "xp_take"]


def is_device(x: object) -> bool:
    """Whether ``x`` is a device array (a cupy array: its type comes from cupy, with the CUDA interface).

    Example:
        >>> is_device(np.zeros(2)), is_device([1, 2])
        (False, False)
    """
    cls = type(x)
    return cls.__module__.startswith("cupy") and hasattr(cls, "__cuda_array_interface__")


def namespace(x: Any) -> Any:
    """The array namespace of ``x``: numpy for host arrays, the cupy module for cupy arrays.

    Example:
        >>> namespace(np.zeros(1)) is np
        True
    """
    if isinstance(x, np.ndarray) or not is_device(x):
        return np
    return sys.modules[type(x).__module__.partition(".")[0]]


def to_host(x: Any) -> np.ndarray:
    """A numpy copy of a small device array (or ``x`` itself if it is a numpy array): one transfer.

    Example:
        >>> to_host(np.arange(3)).tolist()
        [0, 1, 2]
    """
    if isinstance(x, np.ndarray):
        return x
    out: np.ndarray = x.get()
    return out


def xp_take(x: Any, index: np.ndarray | slice) -> Any:
    """``x[index]`` along dim 0 with a host ``index``, in ``x``'s namespace (the index is uploaded once)."""
    if isinstance(x, np.ndarray) or isinstance(index, slice):
        return x[index]
    return x[namespace(x).asarray(index)]


def check_device_array(x: Any, fn: str, arg: str) -> Any:
    """A device array as the jagged code takes it: no Python objects inside (the dtype is checked).

    Raises:
        ArgumentTypeError: a dtype that holds Python objects.
    """
    if x.dtype.hasobject:
        raise ArgumentTypeError(f"{fn}: {arg} has dtype {x.dtype}; expected a dtype without Python objects")
    return x


def int_stats(x: Any) -> tuple[int, int]:
    """``(min, max)`` of a non-empty device integer array, in one transfer of two numbers."""
    xp = namespace(x)
    both = to_host(xp.stack([x.min(), x.max()]))
    return int(both[0]), int(both[1])


def segment_index(xp: Any, sizes: np.ndarray, order: np.ndarray, total: int) -> Any:
    """On the device: the gather index reading segments ``sizes`` (laid end to end) in the order ``order``.

    ``sizes`` and ``order`` are small host arrays (one entry per segment); the result has ``total``
    entries (``sizes.sum()``) and lives in ``xp``. Within output segment j (source segment
    ``order[j]``), entry i reads ``i + (source start - output start)``: the jumps of that offset are
    scattered at each non-empty segment's output start and summed up with ``cumsum``.

    Example:
        >>> segment_index(np, np.array([2, 0, 3]), np.array([2, 0, 1]), 5).tolist()
        [2, 3, 4, 0, 1]
    """
    sizes = sizes.astype(np.int64, copy=False)
    if total == 0:
        return xp.zeros(0, dtype=np.int64)
    src = np.zeros(sizes.size + 1, dtype=np.int64)
    np.cumsum(sizes, out=src[1:])
    counts = sizes[order]
    dst = np.zeros(counts.size, dtype=np.int64)
    np.cumsum(counts[:-1], out=dst[1:])
    keep = counts > 0
    shift = src[:-1][order][keep] - dst[keep]
    jumps = np.diff(shift, prepend=np.int64(0))
    packed = xp.asarray(np.stack([dst[keep], jumps]))  # one upload of two short rows
    marks = xp.zeros(total, dtype=np.int64)
    marks[packed[0]] = packed[1]
    return xp.cumsum(marks) + xp.arange(total, dtype=np.int64)
