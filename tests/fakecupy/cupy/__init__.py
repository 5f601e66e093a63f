# ruff: noqa: N816 - the fake keeps cupy's own names
"""A numpy-backed fake of cupy's public API, for testing mpicomm's GPU paths on a CPU.

Put ``tests/fakecupy`` first on ``sys.path`` (``PYTHONPATH=tests/fakecupy`` for MPI runs, or
``fakecupy.active()`` in one process) and ``import cupy`` gets this package. "Device" memory is host
memory registered as device memory and poisoned when allocated; streams are maximally lazy (see
``cupy.cuda``); ``cupy.cuda.runtime.memcpyAsync`` checks the memory kind and bounds of each side.
It proves plumbing, stream order and layouts, never GPU behaviour. ``cupy._fake`` holds the test
controls (queue a late kernel, memory totals).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _fake, _memory, cuda
from ._array import NOT_ALLOWED, dev, flush, lift, ndarray, wrap
from ._fake import RawKernel

__version__ = "14.2.0+fakecupy"
IS_FAKE = True

# dtypes and constants are numpy's, as in cupy
for _n in [
    "bool_",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "intp",
    "uintp",
    "byte",
    "ubyte",
    "short",
    "ushort",
    "intc",
    "uintc",
    "int_",
    "uint",
    "longlong",
    "ulonglong",
    "half",
    "single",
    "double",
    "csingle",
    "cdouble",
    "dtype",
    "iinfo",
    "finfo",
    "result_type",
    "can_cast",
    "promote_types",
    "issubdtype",
    "newaxis",
    "nan",
    "inf",
    "pi",
    "e",
    "integer",
    "floating",
    "signedinteger",
    "unsignedinteger",
    "complexfloating",
    "number",
    "generic",
]:
    if hasattr(np, _n):
        globals()[_n] = getattr(np, _n)

_LIFTED = [
    "empty_like",
    "zeros_like",
    "ones_like",
    "full_like",
    "arange",
    "linspace",
    "concatenate",
    "stack",
    "hstack",
    "vstack",
    "cumsum",
    "cumprod",
    "repeat",
    "take",
    "searchsorted",
    "unique",
    "diff",
    "bincount",
    "where",
    "argsort",
    "sort",
    "lexsort",
    "nonzero",
    "flatnonzero",
    "sum",
    "prod",
    "max",
    "min",
    "amax",
    "amin",
    "argmax",
    "argmin",
    "mean",
    "abs",
    "absolute",
    "all",
    "any",
    "array_equal",
    "allclose",
    "isclose",
    "reshape",
    "ravel",
    "transpose",
    "split",
    "array_split",
    "broadcast_to",
    "count_nonzero",
    "clip",
    "maximum",
    "minimum",
    "add",
    "subtract",
    "multiply",
    "divide",
    "true_divide",
    "floor_divide",
    "equal",
    "not_equal",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "logical_and",
    "logical_or",
    "logical_not",
    "isnan",
    "isinf",
    "isfinite",
    "tile",
    "dot",
    "matmul",
    "negative",
    "sqrt",
    "exp",
    "log",
    "square",
    "expand_dims",
    "squeeze",
    "flip",
    "roll",
    "zeros",
    "ones",
    "full",
    "identity",
    "eye",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "invert",
    "remainder",
    "mod",
    "power",
    "sign",
]
for _n in _LIFTED:
    globals()[_n] = lift(getattr(np, _n))


def empty(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    """Uninitialised device memory: filled with the poison byte."""
    return ndarray(shape, dtype, order=order)


def empty_like(
    a: ndarray, dtype: Any = None, order: str = "K", subok: Any = None, shape: Any = None
) -> ndarray:
    return ndarray(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)


def asarray(a: Any, dtype: Any = None, order: Any = None, *, blocking: bool = False) -> ndarray:
    """A device array: the fake array itself, a zero-copy view of a CUDA-array-interface object, or a copy."""
    if isinstance(a, ndarray):
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    face = getattr(a, "__cuda_array_interface__", None)
    if face is not None:
        out = _fake.view_interface(a, face)
        return out if dtype is None else out.astype(dtype, copy=False)
    flush()
    host = np.asarray(a, dtype=dtype, order=order)  # type: ignore[call-overload]
    return ndarray._copy_of(np.ascontiguousarray(host) if host.ndim else host)


def array(
    obj: Any,
    dtype: Any = None,
    copy: bool = True,
    order: str = "K",
    subok: bool = False,
    ndmin: int = 0,
    *,
    blocking: bool = False,
) -> ndarray:
    if isinstance(obj, ndarray) or hasattr(obj, "__cuda_array_interface__"):
        src = asarray(obj)
        return src.astype(src.dtype if dtype is None else dtype) if copy else asarray(src, dtype)
    return asarray(np.array(obj, dtype=dtype, ndmin=ndmin))


def ascontiguousarray(a: ndarray, dtype: Any = None) -> ndarray:
    if not isinstance(a, ndarray):
        raise TypeError(f"Unsupported type {type(a)}")
    if a.flags.c_contiguous and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    out = ndarray(a.shape, a.dtype if dtype is None else dtype)
    dst, src = out._a, a._a
    cuda.get_current_stream().launch(lambda: np.copyto(dst, src, casting="unsafe"))
    return out


def asnumpy(
    a: Any, stream: Any = None, order: str = "C", out: Any = None, *, blocking: bool = True
) -> np.ndarray:
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out)
    return np.asarray(a, order=order)  # type: ignore[call-overload]


def copyto(dst: ndarray, src: Any, casting: str = "same_kind", where: Any = None) -> None:
    """A kernel: queued on the current stream."""
    if not isinstance(dst, ndarray) or isinstance(src, np.ndarray):
        raise TypeError(f"Unsupported type {type(dst) if not isinstance(dst, ndarray) else type(src)}")
    d = dst._a
    cuda.get_current_stream().launch(
        lambda: np.copyto(d, dev(src), casting=casting, where=True if where is None else dev(where))  # type: ignore[arg-type]
    )


def from_dlpack(x: Any) -> ndarray:
    """A view of a DLPack CUDA array (here: whose capsule points at host memory), without a copy."""
    return _fake.view_dlpack(x)


fromDlpack = from_dlpack


def get_array_module(*args: Any) -> Any:
    import cupy

    return cupy if any(isinstance(a, ndarray) for a in args) else np


def get_default_pinned_memory_pool() -> cuda.PinnedMemoryPool:
    return cuda._default_pinned_pool


def get_default_memory_pool() -> _fake.MemoryPool:
    return _fake.MEMORY_POOL


def is_available() -> bool:
    return True


__all__ = ["IS_FAKE", "NOT_ALLOWED", "RawKernel", "asarray", "asnumpy", "cuda", "ndarray", "wrap", "_memory"]
