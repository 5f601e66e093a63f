"""torch tensors inside object collectives: their data out of band as numpy arrays, rebuilt as CPU tensors.

torch pickles a tensor through its storage, inside the stream. mpicomm's pickler hands a dense CPU
tensor over as a zero-copy numpy view instead, so its data travels out of band like a numpy array's
(no copy into the stream above 64 KiB), and the receiver rebuilds a CPU tensor over the received
memory with :func:`from_numpy`, which safe mode allows with checked arguments (a numpy array of a
plain dtype, a dtype tag, a bool). Other tensors (sparse, quantized, CUDA, ...) keep torch's own
pickling; safe mode refuses those, as it refuses every class off its allow-list.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["from_numpy", "reduce_tensor"]

_BF16 = "bfloat16"


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
        array = t.numpy()
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
