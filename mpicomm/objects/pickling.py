"""Pickling for the object collectives: protocol 5 with out-of-band buffers, safe mode, device placement.

.. warning::
   Unpickling runs code chosen by whoever made the bytes: a crafted pickle can call ``os.system`` the
   moment it is loaded. Use the object collectives only between peers you trust, or turn on safe mode
   (:func:`set_safe_unpickling`, ``MPICOMM_SAFE_PICKLE=1`` or ``safe=True`` per call), whose unpickler
   loads only builtin containers and scalars, numpy arrays, dtypes and scalars (never object dtypes),
   and the classes given to :func:`allow_unpickle` (see :mod:`mpicomm.objects.unpickler` for what it
   protects against and what it does not).

:func:`dumps` turns one object into a pickle stream and a list of out-of-band buffers: the memory of
every contiguous numpy array of at least :data:`OUT_OF_BAND_MIN` bytes, sent as it lies instead of
being copied into the stream, and the device memory of every cupy array or torch CUDA tensor, whatever
its size (:mod:`mpicomm.objects.devbufs` moves those). :func:`loads` rebuilds the object from the
stream and the received buffers (arrays then live in the receive buffers, without another copy).
"""

from __future__ import annotations

import collections
import datetime
import importlib.util
import io
import os
import pickle
import sys
from collections.abc import Iterable
from typing import Any

import numpy as np

from ..errors import (
    ArgumentError,
    ArgumentTypeError,
    MpicommError,
    ObjectCollectiveError,
    UnpicklingRefusedError,
)
from .devbufs import flat_bytes
from .tensors import KNOWN, device_args, device_tag, from_device, reduce_tensor
from .unpickler import _ALLOWED, _Reader, _SafeUnpickler

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


def dumps(obj: object) -> tuple[bytes, list[Any]]:
    """Pickle ``obj`` with protocol 5; large contiguous buffers and every device array kept out of the stream.

    Args:
        obj: Any picklable object.

    Returns:
        The pickle stream and the out-of-band buffers in stream order: flat byte memoryviews (host
        memory) and flat uint8 device arrays (the memory of cupy arrays, torch CUDA tensors, ...).

    Raises:
        Exception: whatever pickle raises for an object it cannot pickle (``TypeError``,
            ``AttributeError``, ``pickle.PicklingError``).

    Example:
        >>> import numpy as np
        >>> stream, buffers = dumps({"x": np.zeros(1 << 20, np.uint8)})
        >>> len(stream) < 1000, [b.nbytes for b in buffers]
        (True, [1048576])
    """
    buffers: list[Any] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        if pickler.devices:  # a device array's memory: always out of band, as device memory
            device = pickler.devices.pop(id(buf), None)
            if device is not None:
                buffers.append(device[1])
                return False
        raw = buf.raw()
        if raw.nbytes < OUT_OF_BAND_MIN:
            return True  # in the stream
        buffers.append(raw)
        return False

    out = io.BytesIO()
    pickler = _Pickler(out, protocol=5, buffer_callback=keep)
    pickler.dump(obj)
    return out.getvalue(), buffers


class _Pickler(pickle.Pickler):
    """Protocol 5: CPU torch tensors as numpy arrays, device arrays as marker buffers (see :func:`dumps`).

    :func:`dumps` replaces each marker with the device array's memory (:mod:`mpicomm.objects.tensors`).
    """

    #: id(marker PickleBuffer) -> (marker, the device array's flat bytes); made on the first device array
    devices: dict[int, tuple[pickle.PickleBuffer, Any]] | None = None

    def reducer_override(self, obj: Any) -> Any:
        if KNOWN.get(type(obj), "") is None:  # numpy arrays, dtypes, ...: neither torch nor device arrays
            return NotImplemented
        tag = device_tag(obj)
        if tag is None:
            return reduce_tensor(obj)
        found = device_args(obj, tag)
        if found is None:
            return NotImplemented
        arr, args = found
        marker = pickle.PickleBuffer(bytearray(1))  # writable: loaded as the buffer object itself
        if self.devices is None:
            self.devices = {}
        self.devices[id(marker)] = (marker, flat_bytes(arr))
        return from_device, (marker, *args)


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
        UnpicklingRefusedError: in safe mode, for anything it does not load: a name off the
            allow-list, a call or state that could run code, a memory claim the stream does not
            carry, too deep a nesting, or a malformed stream (the cause is chained).
        Exception: without safe mode, whatever unpickling raises (a missing class, a failing
            ``__reduce__``).

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
    try:
        return _SafeUnpickler(_Reader(stream), buffers=buffers).load()
    except UnpicklingRefusedError:
        raise
    except Exception as exc:  # a malformed stream: refused like any other, one class to catch
        text = describe(exc)  # a builtin's own message: short, but cut in case
        raise UnpicklingRefusedError(f"safe mode could not load the stream: {text[:500]}") from exc


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
    """Move the arrays found in ``obj`` to ``device``.

    Arrays are found in lists (replaced in place), tuples and namedtuples (rebuilt), dicts,
    ``OrderedDict`` and ``defaultdict`` (values replaced in place) and the ``__dict__`` of instances,
    frozen dataclasses included; not in sets, dict keys, ``__slots__`` or other containers.
    ``None`` leaves everything as unpickled; ``"cpu"`` turns cupy arrays into numpy arrays; ``"cuda"``
    (``"cuda:N"``) turns numpy arrays into cupy arrays on the current (N-th) GPU.
    """
    if device is None or (device == "cpu" and "cupy" not in sys.modules):
        return obj

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
    elif isinstance(obj, tuple) and hasattr(kind, "_fields") and hasattr(kind, "_make"):  # a namedtuple
        return kind._make(_walk(x, convert, seen) for x in obj)
    elif (
        hasattr(obj, "__dict__")
        and not isinstance(obj, (type, datetime.date))
        and kind.__module__ != "builtins"
    ):
        seen.add(id(obj))
        for k, v in list(vars(obj).items()):
            new_value = _walk(v, convert, seen)
            try:
                setattr(obj, k, new_value)
            except AttributeError:  # a frozen dataclass, or a read-only property over its __dict__
                object.__setattr__(obj, k, new_value)
    return obj


def describe(exc: BaseException, where: bool = False) -> str:
    """An exception as ``"TypeError: cannot pickle '_thread.lock' object"``.

    With ``where``, the place it was raised follows (``" (at cupy/_memory.py:63, in find)"``): for
    errors of other libraries, whose traceback stays on the rank where they happened.
    """
    text = f"{type(exc).__name__}: {exc}"
    tb = exc.__traceback__
    if not where or tb is None:
        return text
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    path = "/".join(code.co_filename.replace("\\", "/").split("/")[-2:])
    return f"{text} (at {path}:{tb.tb_lineno}, in {code.co_name})"


def error_kind(exc: BaseException) -> int:
    """The code of the exception class every rank raises for ``exc`` (see :data:`KINDS`)."""
    if isinstance(exc, UnpicklingRefusedError):
        return 3
    if isinstance(exc, ArgumentError):
        return 1
    if isinstance(exc, ArgumentTypeError):
        return 4
    return 2


#: Error classes by code: 0 means no error.
KINDS: tuple[type[MpicommError] | None, ...] = (
    None,
    ArgumentError,
    ObjectCollectiveError,
    UnpicklingRefusedError,
    ArgumentTypeError,
)
