"""``JaggedArray``: one key's rows of a KeyedJaggedArray (torchrec's JaggedTensor on numpy or cupy arrays)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import overload

import numpy as np

from .device import is_device, namespace

__all__ = ["JaggedArray", "cumulative"]


def cumulative(lengths: np.ndarray, dtype: object) -> np.ndarray:
    """``[0] + cumsum(lengths)`` in ``dtype``, in the lengths' own namespace (numpy or cupy).

    Example:
        >>> cumulative(np.array([2, 0, 1]), np.int64).tolist()
        [0, 2, 2, 3]
    """
    if type(lengths) is np.ndarray:
        out: np.ndarray = np.zeros(lengths.size + 1, dtype=dtype)  # type: ignore[call-overload]
        np.cumsum(lengths, dtype=dtype, out=out[1:])  # type: ignore[call-overload]
        return out
    xp = namespace(lengths)
    dev: np.ndarray = xp.zeros(lengths.size + 1, dtype=dtype)
    dev[1:] = xp.cumsum(lengths, dtype=dtype)
    return dev


class JaggedArray:
    """Variable-length rows: ``values`` cut by ``lengths``, with optional per-value ``weights``.

    What ``kja["key"]`` and ``kja.to_dict()`` give (torchrec gives a JaggedTensor). It is also the
    list of its rows: ``len``, iteration and indexing give views into ``values()``.

    Args:
        values: The concatenated rows (dim 0 counts values).
        lengths: One length per row.
        weights: Optional per-value weights.

    Example:
        >>> import numpy as np
        >>> ja = JaggedArray(np.array([1, 2, 3]), np.array([2, 0, 1]))
        >>> len(ja), ja.offsets().tolist(), [row.tolist() for row in ja]
        (3, [0, 2, 2, 3], [[1, 2], [], [3]])
    """

    __slots__ = ("_lengths", "_offsets", "_values", "_weights")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, values: np.ndarray, lengths: np.ndarray, weights: np.ndarray | None = None) -> None:
        self._values, self._lengths, self._weights = values, lengths, weights
        self._offsets: np.ndarray | None = None

    def values(self) -> np.ndarray:
        """The concatenated rows (a view into the KeyedJaggedArray's values)."""
        return self._values

    def lengths(self) -> np.ndarray:
        """One length per row."""
        return self._lengths

    def offsets(self) -> np.ndarray:
        """``[0] + cumsum(lengths)``."""
        if self._offsets is None:
            self._offsets = cumulative(self._lengths, np.int64)
        return self._offsets

    def weights(self) -> np.ndarray | None:
        """The per-value weights, or None."""
        return self._weights

    def weights_or_none(self) -> np.ndarray | None:
        """The same as :meth:`weights` (torchrec's name)."""
        return self._weights

    def to_dense(self) -> list[np.ndarray]:
        """The rows, one view into ``values()`` each (torchrec's ``to_dense``)."""
        offsets = self.offsets().tolist()
        return [self._values[offsets[i] : offsets[i + 1]] for i in range(self._lengths.size)]

    def __len__(self) -> int:
        return int(self._lengths.size)

    @overload
    def __getitem__(self, index: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, index: slice) -> list[np.ndarray]: ...

    def __getitem__(self, index: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(index, slice):
            return self.to_dense()[index]
        i = range(len(self))[index]  # negative indexes and IndexError as for a list
        offsets = self.offsets()
        return self._values[int(offsets[i]) : int(offsets[i + 1])]

    def __iter__(self) -> Iterator[np.ndarray]:
        return iter(self.to_dense())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JaggedArray):
            return NotImplemented
        a, b = self._weights, other._weights
        same_w = (a is None and b is None) or (a is not None and b is not None and _equal(a, b))
        return bool(_equal(self._lengths, other._lengths) and _equal(self._values, other._values) and same_w)

    def __repr__(self) -> str:
        rows = ", ".join(str(r.tolist()) for r in self[:8]) + (", ..." if len(self) > 8 else "")
        return f"JaggedArray([{rows}]{', weighted' if self._weights is not None else ''})"


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    if is_device(a) != is_device(b):
        return False
    return bool(namespace(a).array_equal(a, b))
