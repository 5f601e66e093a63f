"""The safe unpickler: an allow-list of names and a check on every opcode that calls code or sets state.

Safe mode (``safe=True``, :func:`~mpicomm.set_safe_unpickling`, ``MPICOMM_SAFE_PICKLE=1``) loads
builtin containers and scalars, numpy arrays, dtypes and scalars (never object dtypes) and the
classes given to :func:`~mpicomm.allow_unpickle`; everything else raises
:class:`~mpicomm.UnpicklingRefusedError`. It is built on CPython's pure-Python ``pickle._Unpickler``
(the C unpickler cannot hook opcodes), whose behaviour ``tests/unit/test_safe_unpickler_corpus.py``
pins for every supported Python version.

What it protects against: code running on the receiver (``__reduce__`` payloads, ``eval``,
``os.system``, ``getattr`` chains, ``importlib``), state set on functions, classes or through dunder
names (``__setstate__``, ``__class__``), object arrays, memory claims the stream does not carry
(``BYTEARRAY8`` of 2**50 bytes, ``bytes(2**40)``, ``list(range(2**40))``, arrays of zero-byte
items), and work out of proportion to the stream's size: every stream has a budget
(:mod:`mpicomm.objects.budget`) that calls, hashed keys, repeated references and the loaded object's
expanded size are charged to, and cycles and nesting past :data:`MAX_DEPTH` are refused. What it
does not: an allowed class whose own ``__init__``/``__setstate__`` misbehaves, or a stream that is
simply large (its size is what the sender sent).
"""

from __future__ import annotations

import copyreg
import importlib
import pickle
import struct
import warnings
from collections.abc import Iterable
from typing import Any, ClassVar

import numpy as np

from ..errors import UnpicklingRefusedError
from . import tensors
from .budget import MAX_DEPTH, Budget, brief, measure, refuse

__all__ = ["MAX_CALL_ITEMS", "MAX_DEPTH", "MAX_DIGITS", "allowed"]


class _Reader:
    """A file-like view of a bytes-like object, without copying it (``io.BytesIO`` would copy)."""

    __slots__ = ("_pos", "_view")

    def __init__(self, data: Any) -> None:
        self._view = memoryview(data).cast("B")
        self._pos = 0

    @property
    def size(self) -> int:
        """The stream's length in bytes."""
        return len(self._view)

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
        """The bytes up to and including the next newline, in time linear in the line's length."""
        start, step = self._pos, 64
        while True:
            chunk = self._view[self._pos : self._pos + step].tobytes()
            cut = chunk.find(b"\n")
            if cut >= 0 or self._pos + len(chunk) >= len(self._view):
                end = self._pos + (cut + 1 if cut >= 0 else len(chunk))
                self._pos = end
                return self._view[start:end].tobytes()
            self._pos += len(chunk)
            step *= 2


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
    | {("mpicomm.objects.tensors", "from_numpy"), ("mpicomm.objects.tensors", "from_device")}
)


_refuse = refuse


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


def _check_items(d: Any, shape: object, where: str) -> None:
    """Refuse arrays and scalars of zero-byte items, and shapes that are not a short tuple of counts.

    An array of 2**62 zero-byte (``V0``) items needs no bytes in the stream, yet copying it never
    ends; numpy itself refuses shapes whose byte count overflows.
    """
    if d.itemsize == 0:
        raise _refuse(f"{where}: items of dtype {d} take no bytes (a zero-itemsize array of any length)")
    if not isinstance(shape, tuple) or len(shape) > MAX_NDIM:
        raise _refuse(f"{where}: shape {brief(shape)}; expected a tuple of at most {MAX_NDIM} counts")
    if not all(type(n) is int and n >= 0 for n in shape):
        raise _refuse(f"{where}: shape holds {brief(next(n for n in shape if type(n) is not int or n < 0))}")


def _check_plain_state(inst: object, state: object) -> None:
    """BUILD on anything but a numpy object: an instance of an allowed class, no dunder names in its state.

    Setting state on a function (renaming numpy's ``_frombuffer``), a class, or planting
    ``__setstate__``/``__class__``/``__dict__`` on an instance is refused.
    """
    if not _is_plain_class(type(inst)):
        what = f"a {type(inst).__qualname__} (BUILD)"
        if isinstance(inst, type):
            what = f"the class {inst.__module__}.{inst.__qualname__} itself (BUILD on a class)"
        raise _refuse(f"state for {what}: safe mode sets state only on instances of allowed classes")
    parts = state if isinstance(state, tuple) and len(state) == 2 else (state,)
    for part in parts:
        if part is None or not isinstance(part, dict):
            continue
        for key in part:
            if not isinstance(key, str) or (key.startswith("__") and key.endswith("__")):
                raise _refuse(
                    f"state for a {type(inst).__qualname__} with the key {brief(key)}: safe mode sets only "
                    "plain (non-dunder) string attributes"
                )


#: A call in a safe-mode pickle may not ask for more items (a range argument) or bytes than this.
MAX_CALL_ITEMS = 1 << 20
#: Most objects a safe-mode pickle may have on its stack at once (nesting, and up to 1,000 items
#: the pickler batches before APPENDS/SETITEMS).
MAX_STACK = MAX_DEPTH
#: Most dimensions of an array safe mode loads (numpy's own limit).
MAX_NDIM = 64
#: Longest text number (INT, LONG opcodes of protocol 0) a safe-mode pickle may have, in characters.
MAX_DIGITS = 4_400


def _check_call_size(name: str, cls: Any, args: tuple[Any, ...]) -> None:
    """Refuse memory bombs hidden in calls: ``bytes(2**40)``, ``list(range(2**40))``."""
    for a in args:
        if isinstance(a, range) and len(a) > MAX_CALL_ITEMS:
            raise _refuse(f"a call of {name} with a range of {len(a)} items (at most {MAX_CALL_ITEMS})")
        if cls in (bytes, bytearray) and isinstance(a, int) and a > MAX_CALL_ITEMS:
            raise _refuse(f"a call of {name}({a}): it would allocate {a} bytes (at most {MAX_CALL_ITEMS})")


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

    def __init__(self, file: _Reader, buffers: Iterable[Any]) -> None:
        super().__init__(file, buffers=buffers)
        self._size = file.size
        self._budget = Budget(file.size)
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
        _check_call_size(name, func, (*args, *(kwargs or {}).values()))
        self._budget.charge_call(name, func, (*args, *(kwargs or {}).values()))
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
            raise _refuse(f"{brief(cls)}.__new__: not a class on the allow-list")
        self._not_pending((*args, *kwargs.values()), f"{cls.__qualname__}.__new__")
        _check_call_size(f"{cls.__qualname__}.__new__", cls, (*args, *kwargs.values()))
        self._budget.charge_call(f"{cls.__qualname__}.__new__", cls, (*args, *kwargs.values()))
        return cls.__new__(cls, *args, **kwargs)

    def load_inst(self) -> None:
        raise _refuse("an INST opcode (pickle protocol 0 objects); mpicomm writes protocol 5")

    def load_obj(self) -> None:
        raise _refuse("an OBJ opcode (pickle protocol 1 objects); mpicomm writes protocol 5")

    def load_build(self) -> None:
        state, inst = self.stack[-1], self.stack[-2]
        if not isinstance(inst, (np.dtype, np.ndarray, np.generic)):
            _check_plain_state(inst, state)
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
            _check_items(state[2], state[1], where)
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

    def _fill(self, opcode: str, under: int) -> None:
        """APPEND(S), SETITEM(S), ADDITEMS fill instances of allowed classes only (no functions, no classes).

        ``under`` is how deep the target lies on the stack; -1 for under the last MARK.
        """
        stack = self.stack if under > 0 else (self.metastack[-1] if self.metastack else [])
        target = stack[-under] if under > 0 and len(stack) >= under else (stack[-1] if stack else None)
        if not _is_plain_class(type(target)):
            raise _refuse(
                f"{opcode} on a {type(target).__qualname__}: only instances of allowed classes are filled"
            )

    def load_append(self) -> None:
        self._fill("APPEND", 2)
        super().load_append()

    def load_appends(self) -> None:
        self._fill("APPENDS", -1)
        super().load_appends()

    def load_setitem(self) -> None:
        self._fill("SETITEM", 3)
        if len(self.stack) >= 2:
            self._budget.charge_key(self.stack[-2], "a dict key (SETITEM)")
        super().load_setitem()

    def load_setitems(self) -> None:
        self._fill("SETITEMS", -1)
        for key in self.stack[::2]:
            self._budget.charge_key(key, "a dict key (SETITEMS)")
        super().load_setitems()

    def load_additems(self) -> None:
        self._fill("ADDITEMS", -1)
        for item in self.stack:
            self._budget.charge_key(item, "a set member (ADDITEMS)")
        super().load_additems()

    def _shared(self) -> None:
        """A memo reference or DUP: a long text or bytes object seen again costs its length again."""
        top = self.stack[-1]
        if isinstance(top, (str, bytes, bytearray)) and len(top) > 64:
            self._budget.spend(len(top) // 64, f"a reference to {brief(top)}")

    def load_get(self) -> None:
        super().load_get()
        self._shared()

    def load_binget(self) -> None:
        super().load_binget()
        self._shared()

    def load_long_binget(self) -> None:
        super().load_long_binget()
        self._shared()

    def load_dup(self) -> None:
        super().load_dup()
        self._shared()

    def load_frozenset(self) -> None:
        for item in self.stack:
            self._budget.charge_key(item, "a frozenset member (FROZENSET)")
        super().load_frozenset()

    def load(self) -> Any:
        """Load the object, then measure it: no cycle, no deeper nesting, no larger expansion than allowed."""
        out = super().load()
        measure(out, self._budget.total, "the loaded object")
        return out

    def load_frame(self) -> None:
        (size,) = struct.unpack("<Q", self.read(8))
        if size > self._size:
            raise _refuse(f"a FRAME of {size} bytes in a {self._size}-byte stream")
        self._unframer.load_frame(size)

    def get_extension(self, code: int) -> None:
        """EXT1/2/4: always through :meth:`find_class`, never from copyreg's cache of earlier loads."""
        key = copyreg._inverted_registry.get(code)  # type: ignore[attr-defined]
        if not key:
            raise _refuse(f"the unregistered extension code {code}")
        self.append(self.find_class(*key))

    def load_mark(self) -> None:
        if len(self.metastack) >= MAX_DEPTH:
            raise _refuse(f"containers nested over {MAX_DEPTH} deep (MARK)")
        super().load_mark()

    def _open(self, empty: Any) -> None:
        """EMPTY_LIST, EMPTY_DICT, EMPTY_SET: open containers wait on the stack, its length is their depth."""
        if len(self.stack) >= MAX_STACK:
            raise _refuse(f"containers nested over {MAX_STACK} deep")
        self.append(empty)

    def load_empty_list(self) -> None:
        self._open([])

    def load_empty_dictionary(self) -> None:
        self._open({})

    def load_empty_set(self) -> None:
        self._open(set())

    def _digits(self, opcode: str) -> bytes:
        """The text of an INT or LONG opcode (protocol 0), refused when longer than any real int's."""
        line = bytes(self.readline())
        if len(line) > MAX_DIGITS:
            raise _refuse(f"a {opcode} opcode of {len(line)} digits (at most {MAX_DIGITS})")
        return line

    def load_int(self) -> None:
        data = self._digits("INT")
        val: Any = {b"00\n": False, b"01\n": True}.get(data)
        self.append(int(data, 0) if val is None else val)

    def load_long(self) -> None:
        self.append(int(self._digits("LONG")[:-1].rstrip(b"L"), 0))

    def load_bytearray8(self) -> None:
        (size,) = struct.unpack("<Q", self.read(8))
        if size > self._size:
            raise _refuse(f"a BYTEARRAY8 of {size} bytes in a {self._size}-byte stream")
        out = bytearray(size)
        if self.readinto(out) != size:
            raise _refuse(f"a BYTEARRAY8 of {size} bytes: the stream ends before")
        self.append(out)

    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.NEWOBJ[0]] = load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex
    dispatch[pickle.INST[0]] = load_inst
    dispatch[pickle.OBJ[0]] = load_obj
    dispatch[pickle.BUILD[0]] = load_build
    dispatch[pickle.APPEND[0]] = load_append
    dispatch[pickle.APPENDS[0]] = load_appends
    dispatch[pickle.SETITEM[0]] = load_setitem
    dispatch[pickle.SETITEMS[0]] = load_setitems
    dispatch[pickle.ADDITEMS[0]] = load_additems
    dispatch[pickle.FROZENSET[0]] = load_frozenset
    dispatch[pickle.GET[0]] = load_get
    dispatch[pickle.BINGET[0]] = load_binget
    dispatch[pickle.LONG_BINGET[0]] = load_long_binget
    dispatch[pickle.DUP[0]] = load_dup
    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8
    dispatch[pickle.MARK[0]] = load_mark
    dispatch[pickle.FRAME[0]] = load_frame
    dispatch[pickle.EMPTY_LIST[0]] = load_empty_list
    dispatch[pickle.EMPTY_DICT[0]] = load_empty_dictionary
    dispatch[pickle.EMPTY_SET[0]] = load_empty_set
    dispatch[pickle.INT[0]] = load_int
    dispatch[pickle.LONG[0]] = load_long


def _new_dtype(u: _SafeUnpickler, func: Any, obj: object, align: object = False, copy: object = True) -> Any:
    if not isinstance(obj, str):
        raise _refuse(f"numpy.dtype({brief(obj)}): safe mode builds dtypes from their type string only")
    d = np.dtype(obj, align=bool(align), copy=True)  # always a new dtype: its state may be set below
    _check_dtype(d, f"numpy.dtype({brief(obj)})")
    u._pending[id(d)] = d
    return d


def _reconstruct(u: _SafeUnpickler, func: Any, subtype: object, shape: object, typecode: object) -> Any:
    if subtype is not np.ndarray or typecode not in (b"b", "b"):
        raise _refuse(
            f"numpy _reconstruct({brief(subtype)}, ..., {brief(typecode)}): expected numpy.ndarray, b'b'"
        )
    out = func(np.ndarray, (0,), b"b")
    u._pending[id(out)] = out
    return out


def _frombuffer(
    u: _SafeUnpickler, func: Any, buf: object, dtype: object, shape: object, order: object
) -> Any:
    _check_dtype(dtype, "numpy _frombuffer")
    _check_items(dtype, shape, "numpy _frombuffer")
    return func(buf, dtype, shape, order)


def _scalar(u: _SafeUnpickler, func: Any, dtype: object, data: object = None) -> Any:
    _check_dtype(dtype, "numpy scalar")
    _check_items(dtype, (), "numpy scalar")
    if not isinstance(data, bytes):
        raise _refuse(f"numpy scalar of {dtype}: expected its bytes, got a {type(data).__qualname__}")
    return func(dtype, data)


def _tensor(u: _SafeUnpickler, func: Any, *args: object) -> Any:
    try:
        tensors.check(*args)
    except TypeError as exc:
        raise _refuse(str(exc)) from None
    return func(*args)


def _device(u: _SafeUnpickler, func: Any, *args: object) -> Any:
    if len(args) != 5:
        raise _refuse(f"a device array rebuilt from {len(args)} arguments; expected 5")
    try:
        tensors.check_device_args(*args)
    except TypeError as exc:
        raise _refuse(str(exc)) from None
    return func(*args)


def _numpy_calls() -> dict[int, tuple[Any, Any]]:
    """The rebuilding callables of numpy (under the numpy 1 and numpy 2 module names) and their checks.

    Also mpicomm's own rebuilding of a torch tensor over a numpy array (:mod:`mpicomm.objects.tensors`).
    """
    out: dict[int, tuple[Any, Any]] = {id(np.dtype): (np.dtype, _new_dtype)}
    out[id(tensors.from_numpy)] = (tensors.from_numpy, _tensor)
    out[id(tensors.from_device)] = (tensors.from_device, _device)
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


def allowed() -> set[tuple[str, str]]:
    """The (module, name) pairs safe mode loads; :func:`~mpicomm.allow_unpickle` adds to this set."""
    return _ALLOWED
