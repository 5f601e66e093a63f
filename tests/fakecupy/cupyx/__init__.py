"""Fake ``cupyx``: pinned host arrays (numpy arrays over the fake's pinned allocations)."""

from __future__ import annotations

from typing import Any

import numpy as np
from cupy import cuda


def empty_pinned(shape: Any, dtype: Any = float, order: str = "C") -> np.ndarray:
    """A numpy array over new pinned memory (through cupy's pinned allocator, pooled by default)."""
    return cuda.pinned_array(shape, dtype, order)


def zeros_pinned(shape: Any, dtype: Any = float, order: str = "C") -> np.ndarray:
    out = empty_pinned(shape, dtype, order)
    out.fill(0)
    return out


def empty_like_pinned(a: np.ndarray, dtype: Any = None) -> np.ndarray:
    return empty_pinned(a.shape, a.dtype if dtype is None else dtype)


__all__ = ["empty_like_pinned", "empty_pinned", "zeros_pinned"]
