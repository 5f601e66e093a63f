"""Pickling for the object collectives: protocol 5 with out-of-band buffers, safe mode, device placement.

.. warning::
   Unpickling runs code chosen by whoever made the bytes: a crafted pickle can call ``os.system`` the
   moment it is loaded. Use the object collectives only between peers you trust, or turn on safe mode
   (:func:`set_safe_unpickling`, ``MPICOMM_SAFE_PICKLE=1`` or ``safe=True`` per call), whose unpickler
   loads only builtin containers and scalars, numpy arrays, dtypes and scalars, and the classes given
   to :func:`allow_unpickle`.

:func:`dumps` turns one object into a pickle stream and a list of out-of-band buffers: the memory of
every contiguous numpy array of at least :data:`OUT_OF_BAND_MIN` bytes, sent as it lies instead of
being copied into the stream. :func:`loads` rebuilds the object from the stream and the received
buffers (arrays then live in the receive buffers, without another copy).
"""

from __future__ import annotations

import collections
import datetime
import importlib.util
import os
import pickle
import sys
from collections.abc import Iterable
from typing import Any

from .errors import ArgumentError, ArgumentTypeError, MpicommError

__all__ = [
    "ObjectCollectiveError",
    "UnpicklingRefusedError",
    "allow_unpickle",
    "dumps",
    "is_safe_unpickling",
    "loads",
    "set_safe_unpickling",
]

#: Buffers smaller than this (bytes) stay in the stream: one message costs more than copying them.
OUT_OF_BAND_MIN = 64 << 10


class ObjectCollectiveError(MpicommError, RuntimeError):
    """An object could not be pickled on its sender or unpickled on a receiver.

    The object collectives raise it on every rank of the call with the same message, which names the
    element, the rank where it failed and the cause.
    """


class UnpicklingRefusedError(ObjectCollectiveError, pickle.UnpicklingError):
    """Safe mode refused to load a class that is not on the allow-list (see :func:`allow_unpickle`)."""


def dumps(obj: object) -> tuple[bytes, list[memoryview]]:
    """Pickle ``obj`` with protocol 5; large contiguous buffers are kept out of the stream.

    Args:
        obj: Any picklable object.

    Returns:
        The pickle stream and the out-of-band buffers, as flat byte memoryviews, in stream order.

    Raises:
        Exception: whatever pickle raises for an object it cannot pickle (``TypeError``,
            ``AttributeError``, ``pickle.PicklingError``).

    Example:
        >>> import numpy as np
        >>> stream, buffers = dumps({"x": np.zeros(1 << 20, np.uint8)})
        >>> len(stream) < 1000, [b.nbytes for b in buffers]
        (True, [1048576])
    """
    buffers: list[memoryview] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        raw = buf.raw()
        if raw.nbytes < OUT_OF_BAND_MIN:
            return True  # in the stream
        buffers.append(raw)
        return False

    stream = pickle.dumps(obj, protocol=5, buffer_callback=keep)
    return stream, buffers


def loads(stream: Any, buffers: Iterable[Any] = (), safe: bool | None = None) -> Any:
    """Unpickle one object from ``stream`` and the out-of-band ``buffers`` that :func:`dumps` gave.

    Several objects may share one iterator of buffers: each takes the ones it needs, in order.

    Args:
        stream: The pickle stream (any bytes-like object).
        buffers: The out-of-band buffers, a list or an iterator shared between calls.
        safe: Refuse classes outside the allow-list; ``None`` follows :func:`is_safe_unpickling`.

    Returns:
        The object.

    Raises:
        UnpicklingRefusedError: safe mode met a class that is not allowed.
        Exception: whatever unpickling raises (a missing module or class, a failing ``__reduce__``).

    Example:
        >>> import numpy as np
        >>> stream, buffers = dumps([np.arange(3), {"a": 1}])
        >>> loads(stream, buffers, safe=True)
        [array([0, 1, 2]), {'a': 1}]
    """
    if safe is None:
        safe = is_safe_unpickling()
    if not safe:
        return pickle.loads(stream, buffers=buffers)
    return _SafeUnpickler(_Reader(stream), buffers=buffers).load()


class _Reader:
    """A file-like view of a bytes-like object, without copying it (``io.BytesIO`` would copy)."""

    __slots__ = ("_pos", "_view")

    def __init__(self, data: Any) -> None:
        self._view = memoryview(data).cast("B")
        self._pos = 0

    def read(self, n: int = -1) -> bytes:
        end = len(self._view) if n < 0 else self._pos + n
        out = self._view[self._pos : end].tobytes()
        self._pos += len(out)
        return out

    def readinto(self, b: Any) -> int:
        n = min(len(b), len(self._view) - self._pos)
        memoryview(b).cast("B")[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def readline(self) -> bytes:
        rest = self._view[self._pos :].tobytes()
        cut = rest.find(b"\n") + 1 or len(rest)
        self._pos += cut
        return rest[:cut]


def _builtin_names() -> set[tuple[str, str]]:
    names = [
        "bool", "bytearray", "bytes", "complex", "dict", "float", "frozenset", "int", "list", "range",
        "set", "slice", "str", "tuple", "Ellipsis", "NotImplemented",
    ]  # fmt: skip
    return {("builtins", n) for n in names}


def _numpy_names() -> set[tuple[str, str]]:
    out = {("numpy", "ndarray"), ("numpy", "dtype")}
    for core in ("numpy.core", "numpy._core"):
        out |= {(f"{core}.multiarray", "_reconstruct"), (f"{core}.multiarray", "scalar")}
        out |= {(f"{core}.numeric", "_frombuffer")}
    return out


#: (module, name) pairs safe mode loads: data containers only, nothing that can run a command.
_ALLOWED: set[tuple[str, str]] = (
    _builtin_names()
    | _numpy_names()
    | {("collections", n) for n in ("OrderedDict", "Counter", "deque", "defaultdict")}
    | {("datetime", n) for n in ("date", "datetime", "time", "timedelta", "timezone")}
)


class _SafeUnpickler(pickle.Unpickler):
    """An unpickler whose ``find_class`` loads only what is on the allow-list."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise UnpicklingRefusedError(
            f"safe mode refused to unpickle {module}.{name}: it is not on the allow-list (builtin "
            f"containers and scalars, numpy arrays, dtypes and scalars); if {name} is a class you "
            f"trust, allow it with mpicomm.allow_unpickle({name.rsplit('.', 1)[-1]})"
        )


class _Safe:
    on: bool | None = None  # None: not decided yet, read MPICOMM_SAFE_PICKLE on first use


def set_safe_unpickling(enabled: bool = True) -> None:
    """Turn safe mode on or off for every later object collective of this process.

    The default comes from ``MPICOMM_SAFE_PICKLE`` (``1`` turns it on). A call's own ``safe=``
    argument overrides this setting. Safe mode only protects the ranks that unpickle; turn it on where
    the bytes come from peers you do not trust.

    Args:
        enabled: True to refuse every class outside the allow-list.

    Raises:
        ArgumentTypeError: ``enabled`` is not a bool.

    Example:
        >>> import mpicomm
        >>> mpicomm.set_safe_unpickling(True)
        >>> mpicomm.is_safe_unpickling()
        True
        >>> mpicomm.set_safe_unpickling(False)
    """
    if not isinstance(enabled, bool):
        raise ArgumentTypeError(f"set_safe_unpickling: enabled is {enabled!r}; expected True or False")
    _Safe.on = enabled


def is_safe_unpickling() -> bool:
    """Whether the object collectives unpickle in safe mode by default.

    Example:
        >>> import mpicomm
        >>> isinstance(mpicomm.is_safe_unpickling(), bool)
        True
    """
    if _Safe.on is None:
        _Safe.on = os.environ.get("MPICOMM_SAFE_PICKLE", "0") not in ("", "0")
    return _Safe.on


def allow_unpickle(*classes: type) -> None:
    """Add classes that safe mode may unpickle (on this process; call it on every receiving rank).

    Only add classes whose unpickling cannot run arbitrary code: their ``__reduce__``,
    ``__setstate__`` and ``__init__`` are then trusted with whatever the sender put in the stream.

    Args:
        *classes: The classes, e.g. a dataclass holding a configuration.

    Raises:
        ArgumentTypeError: an argument is not a class.

    Example:
        >>> import fractions, mpicomm
        >>> mpicomm.allow_unpickle(fractions.Fraction)
        >>> stream, buffers = dumps(fractions.Fraction(1, 3))
        >>> loads(stream, buffers, safe=True)
        Fraction(1, 3)
    """
    for cls in classes:
        if not isinstance(cls, type):
            raise ArgumentTypeError(f"allow_unpickle: got {cls!r}; expected classes")
    _ALLOWED.update((cls.__module__, cls.__qualname__) for cls in classes)


def check_device(device: object, fn: str) -> str | None:
    """Check a ``device=`` argument; returns ``None``, ``"cpu"`` or ``"cuda"``/``"cuda:N"``.

    Raises:
        ArgumentTypeError: not a string or None.
        ArgumentError: an unknown device, or a CUDA device without cupy installed.
    """
    if device is None:
        return None
    name = getattr(device, "type", device) if not isinstance(device, str) else device
    if not isinstance(name, str):
        raise ArgumentTypeError(f"{fn}: device is {device!r}; expected None, 'cpu', 'cuda' or 'cuda:N'")
    text = str(device) if not isinstance(device, str) else device
    if text == "cpu":
        return "cpu"
    head, _, index = text.partition(":")
    if head != "cuda" or (index and not index.isdigit()):
        raise ArgumentError(f"{fn}: device is {device!r}; expected None, 'cpu', 'cuda' or 'cuda:N'")
    if "cupy" not in sys.modules and importlib.util.find_spec("cupy") is None:
        raise ArgumentError(
            f"{fn}: device is {device!r}, which needs cupy, but cupy is not installed; expected "
            "device=None or 'cpu', or install cupy (pip install mpicomm[cuda12])"
        )
    return text


def place(obj: Any, device: str | None) -> Any:
    """Move the arrays found in ``obj`` (in lists, tuples, dicts, sets and instance dicts) to ``device``.

    ``None`` leaves everything as unpickled; ``"cpu"`` turns cupy arrays into numpy arrays; ``"cuda"``
    (``"cuda:N"``) turns numpy arrays into cupy arrays on the current (N-th) GPU.
    """
    if device is None or (device == "cpu" and "cupy" not in sys.modules):
        return obj
    import numpy as np

    if device == "cpu":
        import cupy

        return _walk(obj, lambda x: cupy.asnumpy(x) if isinstance(x, cupy.ndarray) else None, set())
    import cupy

    index = device.partition(":")[2]
    with cupy.cuda.Device(int(index)) if index else _nothing():
        return _walk(obj, lambda x: cupy.asarray(x) if isinstance(x, np.ndarray) else None, set())


class _nothing:  # noqa: N801 - used like contextlib.nullcontext, without its typing noise
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _walk(obj: Any, convert: Any, seen: set[int]) -> Any:
    new = convert(obj)
    if new is not None:
        return new
    if id(obj) in seen:
        return obj
    kind = type(obj)
    if kind is list:
        seen.add(id(obj))
        obj[:] = [_walk(x, convert, seen) for x in obj]
    elif kind is dict or isinstance(obj, (collections.OrderedDict, collections.defaultdict)):
        seen.add(id(obj))
        for k, v in obj.items():
            obj[k] = _walk(v, convert, seen)
    elif kind is tuple:
        return tuple(_walk(x, convert, seen) for x in obj)
    elif (
        hasattr(obj, "__dict__")
        and not isinstance(obj, (type, datetime.date))
        and kind.__module__ != "builtins"
    ):
        seen.add(id(obj))
        for k, v in vars(obj).items():
            setattr(obj, k, _walk(v, convert, seen))
    return obj


def describe(exc: BaseException) -> str:
    """An exception as ``"TypeError: cannot pickle '_thread.lock' object"``."""
    return f"{type(exc).__name__}: {exc}"


def error_kind(exc: BaseException) -> int:
    """The code of the exception class every rank raises for ``exc`` (see :data:`KINDS`)."""
    if isinstance(exc, UnpicklingRefusedError):
        return 3
    if isinstance(exc, ArgumentError):
        return 1
    return 2


#: Error classes by code: 0 means no error.
KINDS: tuple[type[MpicommError] | None, ...] = (
    None,
    ArgumentError,
    ObjectCollectiveError,
    UnpicklingRefusedError,
)
