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


def any_device_array(values: Any) -> bool:
    """Whether any of ``values``, or any element of a list or tuple among them, is a cupy array.

    Plain numpy calls stop at the first test of each argument, so this costs next to nothing on the
    host path.

    Example:
        >>> import numpy as np
        >>> any_device_array((np.ones(1), [np.ones(1)], None, 3))
        False
    """
    for v in values:
        cls = type(v)
        if cls is np.ndarray or v is None:
            continue
        if cls is list or cls is tuple:
            if any(is_device_array(e) for e in v):
                return True
        elif is_device_array(v):
            return True
    return False
