"""Array kinds: what an argument is (numpy, torch, cupy, a foreign array) and its view for the data paths.

This is the one place that decides what kind an array is. Neither torch nor cupy is imported here:
a kind is recognised by its type (its module, its class hierarchy, the array protocols it offers),
once per type, so numpy users pay one dictionary lookup per argument. The data paths below the front
door see only two kinds: numpy arrays (host) and the GPU backend's arrays (cupy, device).

=========================================  ==========  ==========================================
caller's array                             kind        what the data paths get
=========================================  ==========  ==========================================
``numpy.ndarray``                          ``numpy``   the array itself
torch CPU tensor                           ``torch``   a zero-copy numpy view by address (``bfloat16``
                                                       through ``ml_dtypes``; the storage stays
                                                       resizable, see ``cpu_view``)
torch CUDA tensor                          ``torch``   a zero-copy device array (the backend's)
cupy array                                 ``cupy``    the array itself
object with ``__cuda_array_interface__``   ``cuda``    a zero-copy device array
object with ``__array_interface__``        ``host``    a zero-copy numpy view (``numpy.asarray``)
object with ``__dlpack__`` only            ``dlpack``  a numpy view (CPU) or device array (CUDA)
any other buffer-protocol object           ``buffer``  a zero-copy numpy view of its memoryview in
                                                       its format's dtype (``bytearray``, ``mmap``:
                                                       bytes, as mpi4py sends them; ``memoryview``,
                                                       ``array.array``, ctypes arrays; ``bytes``
                                                       read-only)
=========================================  ==========  ==========================================
"""

from __future__ import annotations

import ctypes
import sys
import weakref
from typing import Any

import numpy as np

from ..errors import ArgumentError, ArgumentTypeError

#: Torch tensors of this many bytes get huge pages (mpicomm.core.pages.SMALLEST; imported at the first).
_HUGE = 4 << 20

__all__ = [
    "CUDA",
    "CUPY",
    "BUFFER",
    "DLPACK",
    "HOST",
    "LIST",
    "NUMPY",
    "OTHER",
    "TORCH",
    "cpu_numpy",
    "cpu_view",
    "foreign_view",
    "keep_view",
    "kind_of",
    "like",
    "torch_view",
    "view",
]

NUMPY, TORCH, CUPY, CUDA, HOST, DLPACK, OTHER = "numpy", "torch", "cupy", "cuda", "host", "dlpack", "other"
#: An object that exports the buffer protocol and nothing else mpicomm knows (mpi4py takes them all).
BUFFER = "buffer"
#: A list or tuple (of arrays, in the list forms of the collectives).
LIST = "list"

#: Kinds whose arrays reach the data paths as they are.
NATIVE = frozenset((NUMPY, OTHER))

_KINDS: dict[type, str] = {np.ndarray: NUMPY, int: OTHER, float: OTHER, bool: OTHER, str: OTHER}
_KINDS[type(None)] = OTHER
_KINDS[list] = _KINDS[tuple] = LIST
_KINDS[bytearray] = _KINDS[bytes] = _KINDS[memoryview] = BUFFER

#: DLPack device types (``__dlpack_device__()[0]``) that are host memory: CPU, CUDA host, CUDA managed.
_DLPACK_HOST = (1, 3, 13)


def _classify(cls: type) -> str:
    if issubclass(cls, np.ndarray):
        return NUMPY
    if issubclass(cls, np.generic):  # a numpy scalar is no buffer to write into: the host checks refuse it
        return OTHER
    if cls.__module__.startswith("torch") and any(
        base.__name__ == "Tensor" and base.__module__ == "torch" for base in cls.__mro__
    ):
        return TORCH
    if hasattr(cls, "__cuda_array_interface__"):
        return CUPY if cls.__module__.startswith("cupy") else CUDA
    if hasattr(cls, "__array_interface__") or hasattr(cls, "__array_struct__"):
        return HOST
    if hasattr(cls, "__dlpack__"):
        return DLPACK
    return OTHER


def kind_of(x: object) -> str:
    """The kind of ``x``, one of the module's constants (``OTHER`` for a non-array).

    Example:
        >>> import numpy as np
        >>> kind_of(np.ones(2)), kind_of([1.0]), kind_of(None)
        ('numpy', 'list', 'other')
    """
    cls = type(x)
    kind = _KINDS.get(cls)
    if kind is None:
        kind = _classify(cls)
        if kind == OTHER and not issubclass(cls, np.generic):  # a numpy scalar stays no array
            kind = _exports_buffer(x)
            if kind is None:  # this object could not say (a closed mmap): ask the next one again
                return OTHER
        _KINDS[cls] = kind
    return kind


def _exports_buffer(x: object) -> str | None:
    """``BUFFER`` if ``x`` exports the buffer protocol, ``OTHER`` if its type does not, None: unknown.

    A type without ``__array_interface__`` and the rest is asked once, through one of its objects
    (Python 3.11 has no class-level test for the buffer protocol).
    """
    try:
        memoryview(x).release()  # type: ignore[arg-type]
    except TypeError:
        return OTHER
    except (ValueError, BufferError):
        return None
    return BUFFER


def torch_view(t: Any, fn: str, arg: str, write: bool) -> Any:
    """A torch tensor as the data paths take it: a numpy view on the CPU, a device array on CUDA.

    No data is copied except the read-only argument of a tensor whose conjugate or negative bit is
    set (torch's lazy ``conj()``), which is resolved into a new tensor as torch's own backends do.
    A leaf tensor that requires grad is viewed through ``detach()``: written in place, as torch
    writes it, without autograd.

    Args:
        t: The tensor.
        fn: The public function, for messages.
        arg: The argument's name, for messages.
        write: Whether the call writes into ``t``.

    Raises:
        ArgumentTypeError: a sparse, nested, quantized or meta tensor, a device other than the CPU
            or CUDA, or a dtype MPI cannot carry.
        ArgumentError: a written tensor whose conjugate or negative bit is set.
    """
    cuda = t.is_cuda
    if not cuda:
        view = cpu_numpy(t)  # the common case: a plain CPU tensor
        if view is not None:
            return view
    else:
        view = _kept_cuda_view(t)
        if view is not None:
            return view
    torch = sys.modules["torch"]
    what = f"{fn}: {arg} is a torch tensor"
    if t.layout != torch.strided:
        raise ArgumentTypeError(f"{what} with layout {t.layout}; expected a dense tensor (call .to_dense())")
    for flag, name in ((t.is_nested, "nested"), (t.is_quantized, "quantized"), (t.is_meta, "meta")):
        if flag:
            raise ArgumentTypeError(
                f"{what} that is {name}; expected a dense tensor with data on the CPU or a GPU"
            )
    if t.is_conj() or t.is_neg():
        if write:
            raise ArgumentError(
                f"{what} with a lazy conjugate or negation bit; expected a tensor mpicomm can write "
                "(call .resolve_conj() / .resolve_neg() first)"
            )
        t = t.detach().resolve_conj().resolve_neg()
    if cuda:
        return _cuda_view(t, fn, arg)
    if t.requires_grad:
        t = t.detach()
    if t.device.type != "cpu":
        raise ArgumentTypeError(f"{what} on device {t.device}; expected a CPU or CUDA tensor")
    dtype = _numpy_dtypes().get(t.dtype)
    if dtype is None and t.dtype == torch.bfloat16:
        dtype = _bfloat16(fn, arg)
    if dtype is None:
        raise ArgumentTypeError(f"{what} of dtype {t.dtype}; expected a dtype MPI can carry (numpy has none)")
    try:
        return _address_view(t, dtype, True)
    except RuntimeError as exc:
        raise ArgumentError(f"{what} whose memory mpicomm cannot reach: {exc}") from exc


def cpu_numpy(t: Any) -> Any:
    """A plain CPU tensor's numpy view (:func:`cpu_view`), or None: refused, or on CUDA."""
    if not t.is_cpu:  # no exception to raise and catch for a CUDA tensor (~1 us)
        return None
    try:
        return cpu_view(t)
    except (RuntimeError, TypeError):
        return None


def cpu_view(t: Any, keep: bool = True) -> np.ndarray:
    """A plain CPU tensor's memory as a numpy array, reached by address (~0.6 us).

    ``t.numpy()`` marks the tensor's storage as not resizable for ever (torch cannot know when the
    numpy array dies), which breaks FSDP-style memory management (``untyped_storage().resize_(0)``
    after a collective). This view is made from ``data_ptr()``, the shape and the strides over a
    ``ctypes`` window on the address: the storage is left as it was. With ``keep`` the view holds
    the tensor (as ``t.numpy()`` does); without it (the front door's cache of views, which must not
    keep a dead tensor's memory) the caller of a blocking call holds it for the call, and the front
    door gives an ``async_op`` call's :class:`~mpicomm.Work` the caller's tensors until it completes.

    Raises:
        TypeError: not a plain CPU tensor (CUDA, sparse, nested, requires grad, lazy conjugate or
            negation bit, or a dtype numpy has not), as ``t.numpy()`` refuses.
        RuntimeError: the tensor has no storage (a fake or functional tensor), or its storage is
            smaller than its shape needs (``untyped_storage().resize_(0)`` freed it).

    Example:
        >>> import torch
        >>> t = torch.arange(3.0)
        >>> cpu_view(t)[1] = 7.0
        >>> t.resize_(5).shape  # still resizable, unlike after t.numpy()
        torch.Size([5])
    """
    if not t.is_cpu:  # first, with a message that costs nothing to make (CUDA tensors are refused often)
        raise TypeError("not a plain CPU tensor (it is on another device)")
    dtype = _numpy_dtypes().get(t.dtype)
    if (
        dtype is None
        or t.requires_grad
        or t.layout is not _STRIDED[0]
        or t.is_nested
        or t.is_conj()
        or t.is_neg()
    ):
        raise TypeError(f"not a plain CPU tensor of a dtype numpy has ({t.dtype} on {t.device})")
    return _address_view(t, dtype, keep)


#: torch dtype -> numpy dtype, made when the first torch tensor arrives (torch is imported by then).
_DTYPES: dict[Any, np.dtype[Any]] = {}
#: torch.strided, likewise.
_STRIDED: list[Any] = [None]


class _Window(ctypes.Array):  # type: ignore[type-arg]
    """A ctypes window as large as any address range, from any address in ~0.07 us.

    numpy checks only that a view fits in it (a type per size would fill ctypes' cache of types);
    an instance may hold the tensor whose memory it shows (``tensor``).
    """

    _type_ = ctypes.c_char
    _length_ = 1 << 46
    tensor: Any


def _numpy_dtypes() -> dict[Any, np.dtype[Any]]:
    if not _DTYPES:
        torch = sys.modules["torch"]
        _STRIDED[0] = torch.strided
        names = ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
        pairs = [(getattr(torch, n), np.dtype(n)) for n in names]
        pairs += [(torch.complex64, np.dtype(np.complex64)), (torch.complex128, np.dtype(np.complex128))]
        wide = ("uint16", "uint32", "uint64")  # torch >= 2.3
        pairs += [(getattr(torch, n), np.dtype(n)) for n in wide if hasattr(torch, n)]
        _DTYPES.update(pairs)
    return _DTYPES


def _address_view(t: Any, dtype: np.dtype[Any], keep: bool) -> np.ndarray:
    """``t``'s elements as a numpy array of ``dtype`` over ``t.data_ptr()`` (the storage is not marked)."""
    shape = tuple(t.shape)
    if t.numel() == 0:
        return np.empty(shape, dtype)
    size = dtype.itemsize
    stride = t.stride()
    extent = (sum((d - 1) * s for d, s in zip(shape, stride, strict=True)) + 1) * size
    have = t.untyped_storage().nbytes()
    if t.storage_offset() * size + extent > have:
        raise RuntimeError(
            f"its storage holds {have} bytes, fewer than its shape {list(shape)} needs "
            "(was it freed with untyped_storage().resize_(0)?)"
        )
    address = t.data_ptr()
    if extent >= _HUGE:  # 2 MiB pages at its first touch (an MPI copy's page faults: core.pages)
        from ..core import pages  # here: a numpy program's first call does not import it

        pages.hint(address, extent)
    window = _Window.from_address(address)
    if keep:
        window.tensor = t
    strides = None if t.is_contiguous() else tuple(s * size for s in stride)
    view: np.ndarray = np.ndarray(shape, dtype, window, 0, strides)  # type: ignore[arg-type]
    return view


def _bfloat16(fn: str, arg: str) -> np.dtype[Any]:
    try:
        import ml_dtypes  # only when a bfloat16 tensor arrives: an optional package
    except ImportError as exc:
        raise ArgumentTypeError(
            f"{fn}: {arg} is a bfloat16 tensor; numpy needs ml_dtypes to hold bfloat16 "
            "(pip install ml_dtypes)"
        ) from exc
    dtype: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
    return dtype


def _device_view(x: Any, fn: str, arg: str) -> Any:
    """A device array of the GPU backend over ``x``'s memory (no copy; cupy is imported only now)."""
    return backend().wrap(x, fn, arg)


def backend() -> Any:
    """The GPU backend, imported on the first device array: a numpy program loads no GPU machinery."""
    from ..gpu.backend import backend as gpu_backend

    return gpu_backend()


def _cuda_view(t: Any, fn: str, arg: str) -> Any:
    """A torch CUDA tensor as a device array of the backend, ordered after torch's current stream.

    Made from the tensor's pointer, layout and device and torch's current stream on that device
    (:meth:`~mpicomm.gpu.backend.CupyBackend.over`), where DLPack's export cost ~70 us a call on a
    GPU (torch's ``__dlpack__`` looks up the current device twice and builds stream objects; the
    device context around it and cupy's import add more). The order is DLPack's: cupy's current
    stream waits on the device for torch's current stream where the two differ (a ``with
    torch.cuda.stream(s):`` block), and nothing is done where they are one. A dtype numpy lacks
    (bfloat16) and a backend without ``over`` take the DLPack route.
    """
    dtype = _numpy_dtypes().get(t.dtype)
    be = backend()
    over = getattr(be, "over", None)
    if dtype is None or over is None:
        return _device_view(t.detach() if t.requires_grad else t, fn, arg)
    device, ptr, shape, stride = t.get_device(), t.data_ptr(), t.shape, t.stride()
    strides = None if t.is_contiguous() else tuple(s * dtype.itemsize for s in stride)
    try:
        # no owner: the view must not keep the tensor (it is kept below, until the tensor dies); the
        # caller holds the tensor for a blocking call, and an async_op call's Work holds it
        view = over(ptr, tuple(shape), strides, dtype, device, None, _torch_stream(device))
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ArgumentTypeError(f"{fn}: {arg} is a torch CUDA tensor cupy cannot view: {exc}") from exc
    keep_view(_CUDA_VIEWS, _CUDA_VIEW_ENTRIES, t, view, ptr, shape, stride, t.dtype, device)
    return view


#: torch CUDA tensors' device views by the tensor's id, with the pointer, shape, strides, dtype and
#: device they were made for: a hit checks four facts (~0.5 us) where making the view costs ~2 us
#: (cupy's memory, pointer and array objects). An entry holds its tensor weakly and leaves when the
#: tensor dies; any change of the tensor's memory or layout (``resize_``, ``set_``, ``.data =``)
#: changes one of the facts and the view is made again. Only plain tensors come here (no conjugate
#: or negation bit, strided, a dtype numpy has). At most 8 entries.
_CUDA_VIEWS: dict[int, tuple[Any, ...]] = {}
_CUDA_VIEW_ENTRIES = 8


class _TensorRef(weakref.ref):  # type: ignore[type-arg]
    """A weak reference to a tensor whose view a table keeps under the tensor's id."""

    __slots__ = ("key", "table")
    key: int
    table: dict[int, tuple[Any, ...]]


def _forget(ref: _TensorRef) -> None:
    """The tensor of ``ref`` died: drop its entry (unless a newer one took the key)."""
    entry = ref.table.get(ref.key)
    if entry is not None and entry[0] is ref:
        del ref.table[ref.key]


def keep_view(table: dict[int, tuple[Any, ...]], limit: int, t: Any, *facts: Any) -> None:
    """Keep ``(a weak reference to t, *facts)`` in ``table`` under ``id(t)``, at most ``limit`` entries.

    The oldest entry leaves for a new one past ``limit``; an entry leaves when its tensor dies, so no
    other tensor is served it under a reused id and no dead tensor's memory is held. The front door's
    CPU views (:mod:`mpicomm.front.door`) and the CUDA views here are kept this way.
    """
    key = id(t)
    if key not in table and len(table) >= limit:
        table.pop(next(iter(table)), None)  # the oldest entry
    ref = _TensorRef(t, _forget)
    ref.key, ref.table = key, table
    table[key] = (ref, *facts)


def _kept_cuda_view(t: Any) -> Any:
    """The kept view of the CUDA tensor ``t`` if its memory and layout are unchanged (None if not).

    The current stream is made to wait for torch's, as when the view was made.
    """
    entry = _CUDA_VIEWS.get(id(t))
    if (
        entry is None
        or entry[0]() is not t
        or t.data_ptr() != entry[2]
        or t.shape != entry[3]
        or t.stride() != entry[4]
        or t.dtype is not entry[5]
    ):
        return None
    after = getattr(backend(), "after", None)
    if after is None:  # another backend since: make the view again
        return None
    device = entry[6]
    after(_torch_stream(device), device)
    return entry[1]


#: torch's raw current-stream query, found on first use (``torch._C._cuda_getCurrentRawStream``:
#: ~0.2 us, where ``torch.cuda.current_stream(d).cuda_stream`` builds a Stream object).
_RAW_STREAM: list[Any] = []


def _torch_stream(device: int) -> int:
    """The handle of torch's current stream on CUDA device ``device`` (0: the legacy default stream)."""
    if not _RAW_STREAM:
        torch = sys.modules["torch"]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        _RAW_STREAM.append(raw or (lambda d: torch.cuda.current_stream(d).cuda_stream))
    return int(_RAW_STREAM[0](device))


def foreign_view(x: Any, kind: str, fn: str, arg: str) -> Any:
    """A foreign array (``__array_interface__``, ``__cuda_array_interface__``, DLPack) as the paths take it.

    Raises:
        ArgumentTypeError: the object's memory is neither host nor CUDA memory.
    """
    if kind == HOST:
        return np.asarray(x)
    if kind == BUFFER:
        return _buffer_view(x)
    if kind == CUDA:
        return _device_view(x, fn, arg)
    device = x.__dlpack_device__()[0] if hasattr(x, "__dlpack_device__") else 1
    if device in _DLPACK_HOST:
        return np.from_dlpack(x)
    if device == 2:
        return _device_view(x, fn, arg)
    raise ArgumentTypeError(
        f"{fn}: {arg} is a {type(x).__qualname__} in DLPack device type {device}; "
        "expected host or CUDA memory"
    )


def _buffer_view(x: Any) -> np.ndarray:
    """A buffer-protocol object's memory as numpy sees its memoryview: shape, strides and format kept.

    Example:
        >>> b = bytearray(3)
        >>> _buffer_view(b)[1] = 7
        >>> list(b)
        [0, 7, 0]
    """
    view: np.ndarray = np.asarray(memoryview(x))
    return view


def view(x: Any, kind: str, fn: str, arg: str, write: bool) -> Any:
    """``x`` of ``kind`` as the data paths take it (see the module table)."""
    if kind == TORCH:
        return torch_view(x, fn, arg, write)
    if kind in NATIVE or kind == CUPY:
        return x
    return foreign_view(x, kind, fn, arg)


def like(arr: Any, model: Any) -> Any:
    """A new array from a data path (numpy or device) in the kind of the caller's ``model`` array.

    torch in, torch out (zero-copy, on the model's device); numpy and cupy arrays stay as they are;
    foreign kinds get numpy or cupy arrays.

    Example:
        >>> import numpy as np
        >>> like(np.arange(3), np.zeros(1))
        array([0, 1, 2])
    """
    if kind_of(model) != TORCH or kind_of(arr) == TORCH:
        return arr
    torch = sys.modules["torch"]
    if isinstance(arr, np.ndarray):
        if arr.dtype.name == "bfloat16":
            return torch.from_numpy(arr.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(arr)
    return torch.from_dlpack(arr)
