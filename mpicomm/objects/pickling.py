"""Pickling for the object collectives: protocol 5 with out-of-band buffers, safe mode, device placement.

.. warning::
   Unpickling runs code chosen by whoever made the bytes: a crafted pickle can call ``os.system`` the
   moment it is loaded. Use the object collectives only between peers you trust, or turn on safe mode
   (:func:`set_safe_unpickling`, ``MPICOMM_SAFE_PICKLE=1`` or ``safe=True`` per call), whose unpickler
   loads only builtin containers and scalars, numpy arrays, dtypes and scalars (never object dtypes),
   and the classes given to :func:`allow_unpickle`. Safe mode stops code from running; it does not
   stop a payload from asking for much memory (``bytearray(2**32)`` is a 30-byte pickle).

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
import warnings
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError, MpicommError

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


def _refuse(what: str) -> UnpicklingRefusedError:
    return UnpicklingRefusedError(f"safe mode refused to unpickle {what}")


def _check_dtype(d: Any, where: str) -> None:
    """Refuse dtypes that hold Python objects, and structured dtypes whose layout runs past the item."""
    if not isinstance(d, np.dtype):
        raise _refuse(f"{where}: expected a numpy dtype, got a {type(d).__qualname__}")
    if d.hasobject:
        raise _refuse(
            f"an array or dtype of object dtype ({d}) in {where}: object arrays hold raw Python "
            "object pointers; send a list instead, or unpickle with safe=False from a trusted peer"
        )
    if d.fields is not None:
        for sub, offset, *_ in d.fields.values():
            if offset < 0 or offset + sub.itemsize > d.itemsize:
                raise _refuse(f"dtype {d} in {where}: a field lies outside its {d.itemsize}-byte item")
    if d.subdtype is not None:
        base, shape = d.subdtype
        if base.itemsize * int(np.prod(shape)) != d.itemsize:
            raise _refuse(f"dtype {d} in {where}: its sub-array does not fill its {d.itemsize}-byte item")


def _is_plain_class(func: object) -> bool:
    """A class on the allow-list that safe mode may call (numpy's own types go through checked calls)."""
    return (
        isinstance(func, type)
        and not issubclass(func, (np.ndarray, np.dtype, np.generic))
        and (func.__module__, func.__qualname__) in _ALLOWED
    )


#: The pure-Python unpickler of the standard library (typed as Any: typeshed gives it the C class's type).
_PyUnpickler: Any = pickle._Unpickler  # type: ignore[attr-defined]


class _SafeUnpickler(_PyUnpickler):  # type: ignore[misc]
    """The pure-Python unpickler with an allow-list on names and checks on every opcode that calls code.

    ``find_class`` loads only names on the allow-list; REDUCE and NEWOBJ call only the classes on
    it and numpy's own rebuilding functions, whose arguments are checked (no object dtypes); BUILD
    never touches a class, and a numpy dtype or array takes its state only once, right after it is
    made and before anything uses it. INST and OBJ (protocols 0 and 1, never written by
    :func:`dumps`) are refused. The C unpickler cannot hook these opcodes, hence the pure-Python
    one, used in safe mode only.
    """

    dispatch: ClassVar[dict[int, Any]] = dict(_PyUnpickler.dispatch)

    def __init__(self, file: Any, buffers: Iterable[Any]) -> None:
        super().__init__(file, buffers=buffers)
        self._pending: dict[int, Any] = {}  # numpy dtypes/arrays made here, waiting for their BUILD
        self._numpy = _numpy_calls()

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        raise UnpicklingRefusedError(
            f"safe mode refused to unpickle {module}.{name}: it is not on the allow-list (builtin "
            f"containers and scalars, numpy arrays, dtypes and scalars); if {name} is a class you "
            f"trust, allow it with mpicomm.allow_unpickle({name.rsplit('.', 1)[-1]})"
        )

    def _not_pending(self, values: Iterable[Any], where: str) -> None:
        for v in values:
            if id(v) in self._pending:
                what = "dtype" if isinstance(v, np.dtype) else "array"
                raise _refuse(f"{where}: it uses a numpy {what} before its state was set")

    def _call(self, func: Any, args: Any, kwargs: Any = None) -> Any:
        name = getattr(func, "__qualname__", type(func).__qualname__)
        if not isinstance(args, tuple) or (kwargs is not None and not isinstance(kwargs, dict)):
            raise _refuse(f"a call of {name} with arguments that are not a tuple")
        self._not_pending(args, f"a call of {name}")
        if kwargs:
            self._not_pending(kwargs.values(), f"a call of {name}")
        special = self._numpy.get(id(func))
        if special is not None and special[0] is func:
            if kwargs:
                raise _refuse(f"a call of {name} with keyword arguments")
            return special[1](self, func, *args)
        if not _is_plain_class(func):
            raise _refuse(
                f"a call of {name}: safe mode calls only the classes on the allow-list and numpy's "
                "array, dtype and scalar rebuilding functions"
            )
        return func(*args, **(kwargs or {}))

    def load_reduce(self) -> None:
        args = self.stack.pop()
        self.stack[-1] = self._call(self.stack[-1], args)

    def load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._new(cls, args, {}))

    def load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._new(cls, args, kwargs))

    def _new(self, cls: Any, args: Any, kwargs: Any) -> Any:
        if not _is_plain_class(cls) or not isinstance(args, tuple) or not isinstance(kwargs, dict):
            raise _refuse(f"{getattr(cls, '__qualname__', cls)!r}.__new__: not a class on the allow-list")
        self._not_pending((*args, *kwargs.values()), f"{cls.__qualname__}.__new__")
        return cls.__new__(cls, *args, **kwargs)

    def load_inst(self) -> None:
        raise _refuse("an INST opcode (pickle protocol 0 objects); mpicomm writes protocol 5")

    def load_obj(self) -> None:
        raise _refuse("an OBJ opcode (pickle protocol 1 objects); mpicomm writes protocol 5")

    def load_build(self) -> None:
        state, inst = self.stack[-1], self.stack[-2]
        if isinstance(inst, type):
            raise _refuse(
                f"state for the class {inst.__module__}.{inst.__qualname__} itself (BUILD on a class)"
            )
        if not isinstance(inst, (np.dtype, np.ndarray, np.generic)):
            super().load_build()
            return
        where = f"the state of a numpy {type(inst).__name__}"
        if self._pending.pop(id(inst), None) is not inst:
            raise _refuse(f"{where}: numpy objects take their state only once, right after they are made")
        if not isinstance(state, tuple):
            raise _refuse(f"{where}: expected a tuple")
        inner = list(state)
        if isinstance(inst, np.ndarray):
            if len(state) != 5:
                raise _refuse(f"{where}: expected (version, shape, dtype, is_fortran, data)")
            _check_dtype(state[2], where)
        else:
            inner += (
                [f[0] for f in (state[4] or {}).values()]
                if len(state) > 4 and isinstance(state[4], dict)
                else []
            )
            inner += [state[2][0]] if len(state) > 2 and isinstance(state[2], tuple) and state[2] else []
        self._not_pending(inner, where)
        super().load_build()
        _check_dtype(inst.dtype if isinstance(inst, np.ndarray) else inst, where)

    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex
    dispatch[pickle.INST[0]] = load_inst
    dispatch[pickle.OBJ[0]] = load_obj
    dispatch[pickle.BUILD[0]] = load_build


def _new_dtype(u: _SafeUnpickler, func: Any, obj: object, align: object = False, copy: object = True) -> Any:
    if not isinstance(obj, str):
        raise _refuse(f"numpy.dtype({obj!r}): safe mode builds dtypes from their type string only")
    d = np.dtype(obj, align=bool(align), copy=True)  # always a new dtype: its state may be set below
    _check_dtype(d, f"numpy.dtype({obj!r})")
    u._pending[id(d)] = d
    return d


def _reconstruct(u: _SafeUnpickler, func: Any, subtype: object, shape: object, typecode: object) -> Any:
    if subtype is not np.ndarray or typecode not in (b"b", "b"):
        raise _refuse(f"numpy _reconstruct({subtype!r}, ..., {typecode!r}): expected numpy.ndarray, b'b'")
    out = func(np.ndarray, (0,), b"b")
    u._pending[id(out)] = out
    return out


def _frombuffer(
    u: _SafeUnpickler, func: Any, buf: object, dtype: object, shape: object, order: object
) -> Any:
    _check_dtype(dtype, "numpy _frombuffer")
    return func(buf, dtype, shape, order)


def _scalar(u: _SafeUnpickler, func: Any, dtype: object, data: object = None) -> Any:
    _check_dtype(dtype, "numpy scalar")
    if not isinstance(data, bytes):
        raise _refuse(f"numpy scalar of {dtype}: expected its bytes, got a {type(data).__qualname__}")
    return func(dtype, data)


def _numpy_calls() -> dict[int, tuple[Any, Any]]:
    """The rebuilding callables of numpy (under the numpy 1 and numpy 2 module names) and their checks."""
    out: dict[int, tuple[Any, Any]] = {id(np.dtype): (np.dtype, _new_dtype)}
    checks = {("multiarray", "_reconstruct"): _reconstruct, ("multiarray", "scalar"): _scalar}
    checks[("numeric", "_frombuffer")] = _frombuffer
    for core in ("numpy._core", "numpy.core"):
        for (mod, name), check in checks.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    func = getattr(importlib.import_module(f"{core}.{mod}"), name)
                except (ImportError, AttributeError):
                    continue
            out[id(func)] = (func, check)
    return out


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


def describe(exc: BaseException) -> str:
    """An exception as ``"TypeError: cannot pickle '_thread.lock' object"``."""
    return f"{type(exc).__name__}: {exc}"


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
