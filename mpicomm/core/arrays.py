"""Array kinds: numpy arrays live on the host, cupy arrays on a CUDA device; told apart without cupy.

This is the one place that decides what kind an array is. cupy is never imported here: a cupy array
is recognised by its type's module and its ``__cuda_array_interface__``, so numpy users pay nothing.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["CUDA", "HOST", "array_kind", "is_device_array"]

#: The kind of a numpy array.
HOST = "host"
#: The kind of a cupy array (device memory).
CUDA = "cuda"


def is_device_array(x: object) -> bool:
    """Whether ``x`` is a cupy array (device memory), found without importing cupy.

    Example:
        >>> import numpy as np
        >>> is_device_array(np.ones(2)), is_device_array([1.0])
        (False, False)
    """
    cls = type(x)
    return cls.__module__.startswith("cupy") and hasattr(cls, "__cuda_array_interface__")


def array_kind(x: object) -> str | None:
    """``"host"`` for a numpy array, ``"cuda"`` for a cupy array, ``None`` for anything else.

    Example:
        >>> import numpy as np
        >>> array_kind(np.zeros(3)), array_kind(3.0)
        ('host', None)
    """
    if isinstance(x, np.ndarray):
        return HOST
    return CUDA if is_device_array(x) else None


#: Types known not to be device arrays (filled as calls see them; bounded by the types a program uses).
_HOST_TYPES: set[type] = {np.ndarray, int, float, bool, str, type(None)}


def _device_type(cls: type) -> bool:
    if cls in _HOST_TYPES:
        return False
    found = cls.__module__.startswith("cupy") and hasattr(cls, "__cuda_array_interface__")
    if not found and cls is not list and cls is not tuple:
        _HOST_TYPES.add(cls)
    return found


def any_device_array(values: Any) -> bool:
    """Whether any of ``values``, or the first element of a list or tuple among them, is a cupy array.

    The first element stands for a list: a list that mixes numpy and cupy arrays is refused by the
    host path's checks. A numpy call pays one set lookup per argument.

    Example:
        >>> import numpy as np
        >>> any_device_array((np.ones(1), [np.ones(1)], None, 3))
        False
    """
    for v in values:
        cls = type(v)
        if cls in _HOST_TYPES:
            continue
        if cls is list or cls is tuple:
            if v and _device_type(type(v[0])):
                return True
        elif _device_type(cls):
            return True
    return False
