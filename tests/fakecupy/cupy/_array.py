# ruff: noqa: N801, N802 - the fake keeps cupy's own names
"""The fake ``cupy.ndarray``: a numpy view over fake device memory, with cupy's rules.

* Reads that reach the host (``get``, ``item``, ``bool()``, ``repr``) and every operation that makes
  a new array run the current stream's queue first (stream order), then compute at once.
* Writes into an existing array (``x[...] = y``, ``fill``, ``copyto``, ``+=``) are kernels: queued
  on the current stream, run when the stream is waited for.
* ``__array__`` raises ``TypeError`` as cupy's does, and numpy arrays are refused where cupy refuses
  them, so implicit host conversions fail here as they would on a GPU.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _memory, cuda

NOT_ALLOWED = (
    "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a NumPy array "
    "explicitly."
)


def flush() -> None:
    """Run the current stream's queue: what an operation on it must see first."""
    cuda.get_current_stream().synchronize()


def dev(x: Any, what: str = "argument") -> Any:
    """``x`` for numpy: a fake array's numpy view; scalars, dtypes and nested tuples as they are."""
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray):
        raise TypeError(f"Unsupported type {type(x)}")
    if isinstance(x, (list, tuple)):
        return type(x)(dev(i, what) for i in x)
    return x


def wrap(res: Any, sources: tuple[Any, ...] = ()) -> Any:
    """A numpy result as a fake array: a view of a source's memory if it is one, else a new allocation."""
    if isinstance(res, tuple):
        return tuple(wrap(r, sources) for r in res)
    if isinstance(res, list):
        return [wrap(r, sources) for r in res]
    if isinstance(res, np.generic):
        res = np.asarray(res)
    if not isinstance(res, np.ndarray):
        return res
    for src in sources:
        if isinstance(src, ndarray) and np.may_share_memory(res, src._a):
            return ndarray._view(res, src._mem)
    return ndarray._copy_of(res)


def _sources(args: Any) -> tuple[Any, ...]:
    out: list[Any] = []
    for a in args:
        if isinstance(a, ndarray):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(_sources(a))
    return tuple(out)


def lift(fn: Callable[..., Any]) -> Callable[..., Any]:
    """numpy's ``fn`` on fake arrays: stream-ordered, numpy arrays refused, results on the device."""

    def call(*args: Any, **kwargs: Any) -> Any:
        flush()
        res = fn(*dev(args), **{k: dev(v) for k, v in kwargs.items()})
        return wrap(res, _sources(args) + _sources(tuple(kwargs.values())))

    call.__name__ = call.__qualname__ = getattr(fn, "__name__", "function")
    call.__doc__ = f"Fake cupy: numpy.{call.__name__} on device arrays."
    return call


class _Flags:
    def __init__(self, a: np.ndarray) -> None:
        self.c_contiguous = bool(a.flags.c_contiguous)
        self.f_contiguous = bool(a.flags.f_contiguous)
        self.owndata = False

    def __getitem__(self, key: str) -> bool:
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous, "OWNDATA": False}[key]


class ndarray:
    """A fake cupy array (see the module docstring)."""

    __array_priority__ = 100
    _a: np.ndarray
    _mem: Any

    def __init__(
        self, shape: Any, dtype: Any = float, memptr: Any = None, strides: Any = None, order: str = "C"
    ) -> None:
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if memptr is None:
            mem = _memory.Memory(nbytes, cuda.Device().id)
            base, offset = mem.array(), 0
        else:
            mem = memptr.mem
            base = mem.array()
            offset = memptr.ptr - mem.ptr
        a = np.ndarray(shape, dtype, buffer=base, offset=offset, strides=strides, order=order)  # type: ignore[call-overload]
        self._a, self._mem = a, mem

    @classmethod
    def _view(cls, a: np.ndarray, mem: Any) -> ndarray:
        out = cls.__new__(cls)
        out._a, out._mem = a, mem
        return out

    @classmethod
    def _copy_of(cls, host: np.ndarray, device_id: int | None = None) -> ndarray:
        dev_id = cuda.Device().id if device_id is None else device_id
        mem = _memory.Memory(host.nbytes, dev_id)
        a = mem.array()[: host.nbytes].view(host.dtype).reshape(host.shape)
        np.copyto(a, host)
        return cls._view(a, mem)

    # ---------------------------------------------------------------- attributes
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    strides = property(lambda self: self._a.strides)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    ndim = property(lambda self: self._a.ndim)
    flags = property(
        lambda self: self.__dict__.get("_flags") or self.__dict__.setdefault("_flags", _Flags(self._a))
    )
    T = property(lambda self: ndarray._view(self._a.T, self._mem))
    base = property(lambda self: None)

    @property
    def device(self) -> cuda.Device:
        # the id was checked when the memory was made: no device-count check (cupy's costs ~0.3 us)
        dev = cuda.Device.__new__(cuda.Device)
        dev.id, dev._prev = self._mem.device_id, []
        return dev

    @property
    def data(self) -> cuda.MemoryPointer:
        # made once per array (its memory never moves): cupy's costs ~0.1 us, a fresh one here ~1 us
        try:
            return self.__dict__["_data"]  # type: ignore[no-any-return]
        except KeyError:
            made = self.__dict__["_data"] = cuda.MemoryPointer(
                self._mem, self._a.__array_interface__["data"][0] - self._mem.ptr
            )
            return made

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        stream = cuda.get_current_stream()
        return {
            "shape": self._a.shape,
            "typestr": self._a.dtype.str,
            "descr": self._a.dtype.descr,
            "data": (self._a.ctypes.data, False),
            "strides": None if self._a.flags.c_contiguous else self._a.strides,
            "stream": stream.ptr or 1,
            "version": 3,
        }

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self._mem.device_id)

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        """A capsule over the memory; it says host memory (the fake's truth), which consumers carry as is."""
        flush()
        keep = {k: v for k, v in kwargs.items() if k in ("max_version", "copy") and v is not None}
        return self._a.__dlpack__(**keep)

    def toDlpack(self) -> Any:
        return self.__dlpack__()

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    # ---------------------------------------------------------------- to and from the host
    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError(NOT_ALLOWED)

    def get(
        self, stream: Any = None, order: str = "C", out: np.ndarray | None = None, blocking: bool = True
    ) -> np.ndarray:
        (stream or cuda.get_current_stream()).synchronize()
        if out is not None:
            np.copyto(out, self._a)
            return out
        return np.array(self._a, order=order)  # type: ignore[call-overload]

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, not {type(arr)}")
        if arr.shape != self.shape or arr.dtype != self.dtype:
            raise ValueError(f"Shape/dtype mismatch: {arr.shape} {arr.dtype} into {self.shape} {self.dtype}")
        snapshot, dst = arr.copy(), self._a
        (stream or cuda.get_current_stream()).launch(lambda: np.copyto(dst, snapshot))

    def item(self) -> Any:
        flush()
        return self._a.item()

    def tolist(self) -> Any:
        flush()
        return self._a.tolist()

    def __bool__(self) -> bool:
        flush()
        return bool(self._a)

    def __int__(self) -> int:
        flush()
        return int(self._a)

    def __float__(self) -> float:
        flush()
        return float(self._a)

    def __complex__(self) -> complex:
        flush()
        return complex(self._a)

    def __index__(self) -> int:
        flush()
        return operator.index(self._a)

    def __repr__(self) -> str:
        flush()
        return repr(self._a).replace("array(", "array(", 1)

    __str__ = __repr__

    # ---------------------------------------------------------------- indexing and kernels
    def __getitem__(self, key: Any) -> Any:
        flush()
        k = dev(key, "index")
        res = self._a[k]
        if not isinstance(res, np.ndarray):
            res = self._a[(k if isinstance(k, tuple) else (k,)) + (Ellipsis,)]
        return wrap(res, (self,))

    def __setitem__(self, key: Any, value: Any) -> None:
        if isinstance(value, np.ndarray):
            raise TypeError(f"Unsupported type {type(value)}")
        dst, k, v = self._a, key, value
        cuda.get_current_stream().launch(lambda: dst.__setitem__(dev(k), dev(v)))

    def fill(self, value: Any) -> None:
        dst = self._a
        cuda.get_current_stream().launch(lambda: dst.fill(value))

    # ---------------------------------------------------------------- shapes and copies
    def reshape(self, *shape: Any, order: str = "C") -> ndarray:
        flush()
        return wrap(self._a.reshape(*shape, order=order), (self,))  # type: ignore[call-overload]

    def ravel(self, order: str = "C") -> ndarray:
        flush()
        return wrap(self._a.ravel(order), (self,))  # type: ignore[arg-type]

    def view(self, dtype: Any = None) -> ndarray:
        return ndarray._view(self._a if dtype is None else self._a.view(dtype), self._mem)

    def astype(
        self, dtype: Any, order: str = "K", casting: Any = None, subok: Any = None, copy: bool = True
    ) -> ndarray:
        flush()
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return ndarray._copy_of(self._a.astype(dtype, order=order), self._mem.device_id)  # type: ignore[arg-type]

    def copy(self, order: str = "C") -> ndarray:
        out = ndarray(self.shape, self.dtype, order=order)
        dst, src = out._a, self._a
        cuda.get_current_stream().launch(lambda: np.copyto(dst, src))
        return out

    def __copy__(self) -> ndarray:
        return self.copy()

    def __deepcopy__(self, memo: Any) -> ndarray:
        return self.copy()

    def __reduce__(self) -> Any:
        return (_rebuild, (self.get(),))

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if method != "__call__" or any(isinstance(i, np.ndarray) for i in inputs):
            return NotImplemented
        return lift(ufunc)(*inputs, **kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        import cupy

        mine = getattr(cupy, func.__name__, None)
        if mine is None:
            return NotImplemented
        return mine(*args, **kwargs)


def _rebuild(host: np.ndarray) -> ndarray:
    return ndarray._copy_of(host)


def _method(name: str) -> Callable[..., Any]:
    def call(self: ndarray, *args: Any, **kwargs: Any) -> Any:
        flush()
        res = getattr(self._a, name)(*dev(args), **{k: dev(v) for k, v in kwargs.items()})
        return wrap(res, (self,))

    call.__name__ = name
    return call


def _binary(fn: Callable[[Any, Any], Any], reflected: bool = False) -> Callable[..., Any]:
    def call(self: ndarray, other: Any) -> Any:
        if isinstance(other, (np.ndarray, list, tuple)):
            return NotImplemented
        flush()
        a, b = (dev(other), self._a) if reflected else (self._a, dev(other))
        return wrap(fn(a, b))

    return call


def _inplace(fn: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def call(self: ndarray, other: Any) -> ndarray:
        if isinstance(other, np.ndarray):
            raise TypeError(f"Unsupported type {type(other)}")
        dst = self._a
        cuda.get_current_stream().launch(lambda: fn(dst, dev(other)))
        return self

    return call


for _name in [
    "sum",
    "prod",
    "max",
    "min",
    "mean",
    "std",
    "var",
    "any",
    "all",
    "argmax",
    "argmin",
    "cumsum",
    "cumprod",
    "argsort",
    "nonzero",
    "transpose",
    "squeeze",
    "swapaxes",
    "flatten",
    "repeat",
    "take",
    "clip",
    "dot",
    "round",
    "conj",
    "searchsorted",
    "diagonal",
    "trace",
]:
    setattr(ndarray, _name, _method(_name))


def _sort(self: ndarray, axis: int = -1) -> None:
    dst = self._a
    cuda.get_current_stream().launch(lambda: dst.sort(axis=axis))


ndarray.sort = _sort  # type: ignore[attr-defined]

_OPS = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "truediv": operator.truediv,
    "floordiv": operator.floordiv,
    "mod": operator.mod,
    "pow": operator.pow,
    "and": operator.and_,
    "or": operator.or_,
    "xor": operator.xor,
    "lshift": operator.lshift,
    "rshift": operator.rshift,
    "matmul": operator.matmul,
}
_IOPS = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "truediv": np.true_divide,
    "floordiv": np.floor_divide,
    "mod": np.remainder,
    "pow": np.power,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
    "lshift": np.left_shift,
    "rshift": np.right_shift,
}
for _name, _fn in _OPS.items():
    setattr(ndarray, f"__{_name}__", _binary(_fn))
    setattr(ndarray, f"__r{_name}__", _binary(_fn, reflected=True))
for _name, _ufunc in _IOPS.items():
    setattr(ndarray, f"__i{_name}__", _inplace(lambda a, b, u=_ufunc: u(a, b, out=a, casting="unsafe")))
for _name, _fn in {
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}.items():
    setattr(ndarray, f"__{_name}__", _binary(_fn))
ndarray.__hash__ = None  # type: ignore[assignment]
for _name, _fn1 in {"neg": operator.neg, "pos": operator.pos, "abs": abs, "invert": operator.invert}.items():
    setattr(ndarray, f"__{_name}__", lambda self, f=_fn1: (flush(), wrap(f(self._a)))[1])
ndarray.__module__ = "cupy"
ndarray.__qualname__ = ndarray.__name__ = "ndarray"
