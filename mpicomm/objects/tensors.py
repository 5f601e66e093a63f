"""torch tensors and cupy arrays inside object collectives: their data out of band, rebuilt on arrival.

torch pickles a tensor through its storage, inside the stream. mpicomm's pickler hands a dense CPU
tensor over as a zero-copy numpy view instead, so its data travels out of band like a numpy array's
(no copy into the stream above 64 KiB), and the receiver rebuilds a CPU tensor over the received
memory with :func:`from_numpy`, which safe mode allows with checked arguments (a numpy array of a
plain dtype, a dtype tag, a bool). Other tensors (sparse, quantized, CUDA, ...) keep torch's own
pickling; safe mode refuses those, as it refuses every class off its allow-list.

A cupy array is copied to the host once, in the order of the work queued on the caller's current
stream (``ndarray.get()``), and travels as that host copy's out-of-band buffer; the receiver
rebuilds it with :func:`from_numpy` and the tag ``"cupy"``: one host-to-device copy into a new cupy
array on the receiving rank's current device (through its current stream). Its bytes are never part
of the pickle stream above 64 KiB (below, copying them costs less than a message, as for numpy).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["CUPY", "check", "from_numpy", "reduce_cupy", "reduce_tensor"]

_BF16 = "bfloat16"
#: The tag of a cupy array: rebuilt on the receiving rank's current device.
CUPY = "cupy"


def reduce_tensor(obj: Any) -> Any:
    """The pickle reduction of a dense CPU torch tensor (``NotImplemented`` for anything else).

    Example:
        >>> reduce_tensor([1, 2]) is NotImplemented
        True
    """
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(obj, cupy.ndarray):
        return reduce_cupy(obj)
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
        array = t.numpy()
    except (RuntimeError, TypeError):
        return NotImplemented
    return from_numpy, (array, tag, bool(obj.requires_grad))


def reduce_cupy(obj: Any) -> Any:
    """The pickle reduction of a cupy array: its host copy (C order) and the tag ``"cupy"``.

    The copy is made in stream order: after the work queued on the current stream that writes the
    array. Arrays of other than plain dtypes keep cupy's own pickling (which safe mode refuses).
    """
    if obj.dtype.kind not in "biufc":
        return NotImplemented
    host: np.ndarray = obj.get()
    return from_numpy, (host, CUPY, False)


def from_numpy(array: np.ndarray, tag: str, requires_grad: bool) -> Any:
    """A CPU tensor over ``array``'s memory (a copy if the array is read-only); a cupy array for ``"cupy"``.

    Raises:
        ModuleNotFoundError: torch (or cupy, for a cupy array) is not installed on the receiving rank.
    """
    if tag == CUPY:
        import cupy  # the sender had cupy; this rank needs it to hold a device array

        return cupy.asarray(array)  # a new array on the current device, copied on its current stream
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
            ``tag`` is not ``""``, ``"bfloat16"`` or ``"cupy"``, or ``requires_grad`` is not a bool
            (False for a cupy array).
    """
    if type(array) is not np.ndarray or array.dtype.kind not in "biufc":
        raise TypeError(f"a tensor from a {type(array).__qualname__}; expected a numpy array of numbers")
    if tag not in ("", _BF16, CUPY) or (tag == _BF16 and array.dtype != np.int16):
        raise TypeError(f"a tensor with dtype tag {tag!r}; expected '', 'bfloat16' over int16, or 'cupy'")
    if type(requires_grad) is not bool or (tag == CUPY and requires_grad):
        raise TypeError(f"a tensor with requires_grad={requires_grad!r}; expected a bool (False for cupy)")
