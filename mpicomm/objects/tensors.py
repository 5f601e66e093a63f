"""torch tensors and cupy arrays inside object collectives: their data out of band, rebuilt on arrival.

torch pickles a tensor through its storage, inside the stream. mpicomm's pickler hands a dense CPU
tensor over as a zero-copy numpy view instead, so its data travels out of band like a numpy array's
(no copy into the stream above 64 KiB), and the receiver rebuilds a CPU tensor over the received
memory with :func:`from_numpy`, which safe mode allows with checked arguments (a numpy array of a
plain dtype, a dtype tag, a bool). Other tensors (sparse, quantized, CUDA, ...) keep torch's own
pickling; safe mode refuses those, as it refuses every class off its allow-list.

Device arrays (cupy arrays, torch CUDA tensors, other ``__cuda_array_interface__`` arrays) never
have their bytes pickled: :func:`device_args` gives the stream's part (dtype, shape, kind) and the
array goes out of band as device memory (:mod:`mpicomm.objects.devbufs`); the receiver rebuilds it
with :func:`from_device` over the device buffer it received, on its current device: a cupy array
(a torch CUDA tensor for a torch tensor). Safe mode allows that call with checked arguments.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "CUPY",
    "TORCH",
    "CpuView",
    "check",
    "check_device_args",
    "device_args",
    "device_tag",
    "from_device",
    "from_numpy",
    "reduce_tensor",
]

_BF16 = "bfloat16"
#: Kind tags of device arrays: rebuilt as cupy arrays, as torch CUDA tensors (bfloat16 ones over
#: int16 device memory), or (any other device array) as cupy arrays.
CUPY, TORCH, TORCH_BF16, CUDA = "cupy", "torch", "torch.bfloat16", "cuda"
_DEVICE_TAGS = (CUPY, TORCH, TORCH_BF16, CUDA)
#: Largest number of dimensions of a rebuilt device array (numpy's and cupy's own limit is 64).
MAX_NDIM = 64
#: Device kind of each type seen (None: neither a device array type nor a torch tensor; "torch": a
#: tensor, CUDA or not).
KNOWN: dict[type, str | None] = {}


class CpuView:
    """How a CPU tensor's memory is viewed for sending; :func:`mpicomm.wiring.objects` sets :attr:`view`.

    ``t.numpy()`` marks the tensor's storage as not resizable for ever; the front door's address
    view (:func:`mpicomm.front.kinds.cpu_view`) leaves it resizable, so a tensor sent inside an
    object can still be freed with ``untyped_storage().resize_(0)`` afterwards.
    """

    view: Callable[[Any], np.ndarray] | None = None


def reduce_tensor(obj: Any) -> Any:
    """The pickle reduction of a dense CPU torch tensor (``NotImplemented`` for anything else).

    Example:
        >>> reduce_tensor([1, 2]) is NotImplemented
        True
    """
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return NotImplemented
    if obj.layout != torch.strided or obj.device.type != "cpu" or obj.is_quantized or obj.is_nested:
        return NotImplemented
    t = obj.detach().resolve_conj().resolve_neg()
    tag = ""
    if t.dtype == torch.bfloat16:
        t, tag = t.view(torch.int16), _BF16
    try:
        array = t.numpy() if CpuView.view is None else CpuView.view(t)
    except (RuntimeError, TypeError):
        return NotImplemented
    return from_numpy, (array, tag, bool(obj.requires_grad))


def from_numpy(array: np.ndarray, tag: str, requires_grad: bool) -> Any:
    """A CPU tensor over ``array``'s memory (a copy if the array is read-only).

    Raises:
        ModuleNotFoundError: torch is not installed on the receiving rank.
    """
    import torch  # the sender had torch; this rank needs it to hold a tensor

    if not array.flags.writeable:
        array = array.copy()
    t = torch.from_numpy(array)
    if tag == _BF16:
        t = t.view(torch.bfloat16)
    return t.requires_grad_(requires_grad) if requires_grad else t


def check(array: object, tag: object, requires_grad: object) -> None:
    """Refuse arguments of :func:`from_numpy` that a hostile stream could forge.

    Raises:
        TypeError: ``array`` is not a numpy array of a plain (bool, integer, float, complex) dtype,
            ``tag`` is not ``""`` or ``"bfloat16"``, or ``requires_grad`` is not a bool.
    """
    if type(array) is not np.ndarray or array.dtype.kind not in "biufc":
        raise TypeError(f"a tensor from a {type(array).__qualname__}; expected a numpy array of numbers")
    if tag not in ("", _BF16) or (tag == _BF16 and array.dtype != np.int16):
        raise TypeError(f"a tensor with dtype tag {tag!r}; expected '' or 'bfloat16' over int16")
    if type(requires_grad) is not bool:
        raise TypeError(f"a tensor with requires_grad={requires_grad!r}; expected a bool")


def _classify(cls: type) -> str | None:
    if cls.__module__.startswith("torch") and any(
        b.__name__ == "Tensor" and b.__module__ == "torch" for b in cls.__mro__
    ):
        return TORCH
    if issubclass(cls, np.ndarray) or not hasattr(cls, "__cuda_array_interface__"):
        return None
    return CUPY if cls.__module__.startswith("cupy") else CUDA


def device_tag(obj: object) -> str | None:
    """The kind tag of a device array (``"cupy"``, ``"torch"``, ``"cuda"``), None for anything else.

    One dictionary lookup per type, and a device check for torch tensors.

    Example:
        >>> device_tag(np.zeros(2)), device_tag([1])
        (None, None)
    """
    cls = type(obj)
    try:
        tag = KNOWN[cls]
    except KeyError:
        tag = KNOWN[cls] = _classify(cls)
    if tag == TORCH:
        t: Any = obj
        if t.device.type != "cuda" or t.layout != sys.modules["torch"].strided or t.is_quantized:
            return None
        return TORCH_BF16 if t.dtype == sys.modules["torch"].bfloat16 else TORCH
    return tag


def device_args(obj: Any, tag: str) -> tuple[Any, tuple[str, tuple[int, ...], str, bool]] | None:
    """What the stream holds of a device array and the array to send (C-contiguous, the backend's).

    Returns ``(array, (dtype, shape, tag, requires_grad))``, or None for a dtype other than bool,
    integer, float or complex (such arrays keep their library's own pickling).
    """
    requires_grad = False
    x = obj
    if tag in (TORCH, TORCH_BF16):
        requires_grad = bool(x.requires_grad)
        x = x.detach().resolve_conj().resolve_neg()
        if tag == TORCH_BF16:
            x = x.view(sys.modules["torch"].int16)
    from .devbufs import contiguous

    if tag == CUPY and obj.dtype.kind not in "biufc":
        return None
    arr = contiguous(x)
    if arr.dtype.kind not in "biufc":
        return None
    return arr, (arr.dtype.str, tuple(int(n) for n in arr.shape), tag, requires_grad)


def from_device(buf: Any, dtype: str, shape: tuple[int, ...], tag: str, requires_grad: bool) -> Any:
    """A device array of ``dtype`` and ``shape`` over the received flat device buffer ``buf`` (no copy).

    A cupy array for ``"cupy"`` and ``"cuda"``, a torch CUDA tensor for the torch tags.

    Raises:
        TypeError: arguments :func:`check_device_args` refuses.
        ModuleNotFoundError: torch is not installed here, for a torch tensor.
    """
    check_device_args(buf, dtype, shape, tag, requires_grad)
    arr = buf.view(np.dtype(dtype)).reshape(shape)
    if tag in (CUPY, CUDA):
        return arr
    import torch  # the sender had torch; this rank needs it to hold a tensor

    t = torch.utils.dlpack.from_dlpack(arr)
    if tag == TORCH_BF16:
        t = t.view(torch.bfloat16)
    return t.requires_grad_(True) if requires_grad else t


def check_device_args(buf: object, dtype: object, shape: object, tag: object, requires_grad: object) -> None:
    """Refuse arguments of :func:`from_device` that a hostile stream could forge.

    Raises:
        TypeError: ``buf`` is not a received flat uint8 device buffer, ``dtype`` not a plain dtype's
            string, ``shape`` not a tuple of at most 64 non-negative ints whose elements fill ``buf``
            exactly, ``tag`` not a device tag, or ``requires_grad`` not a bool (False but for torch).
    """
    cls = type(buf)
    if not (cls.__module__.startswith("cupy") and hasattr(cls, "__cuda_array_interface__")):
        raise TypeError(f"a device array over a {cls.__qualname__}; expected a received device buffer")
    if buf.dtype != np.uint8 or buf.ndim != 1:  # type: ignore[attr-defined]
        raise TypeError("a device array over a buffer that is not flat bytes; expected a received buffer")
    if type(dtype) is not str or len(dtype) > 8 or tag not in _DEVICE_TAGS:
        raise TypeError(
            f"a device array of dtype {dtype!r} and tag {tag!r}; expected a dtype string and {_DEVICE_TAGS}"
        )
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"a device array of dtype {dtype!r}; expected a numpy dtype string") from None
    if dt.kind not in "biufc" or (tag == TORCH_BF16 and dt != np.int16):
        raise TypeError(f"a device array of dtype {dt}; expected bool, integer, float or complex")
    if type(shape) is not tuple or len(shape) > MAX_NDIM or any(type(n) is not int or n < 0 for n in shape):
        raise TypeError("a device array whose shape is not a tuple of at most 64 non-negative ints")
    items = 1
    for n in shape:
        items *= n
    if items * dt.itemsize != buf.nbytes:  # type: ignore[attr-defined]
        raise TypeError(
            f"a device array of shape {shape[:8]} and dtype {dt} over a buffer of "
            f"{buf.nbytes} bytes; expected them to match"  # type: ignore[attr-defined]
        )
    if type(requires_grad) is not bool or (requires_grad and tag not in (TORCH, TORCH_BF16)):
        raise TypeError(
            f"a device array with requires_grad={requires_grad!r}; expected a bool (False but for torch)"
        )
