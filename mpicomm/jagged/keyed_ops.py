"""The KeyedJaggedTensor methods torchrec users call, vectorised in numpy: a base of KeyedJaggedArray.

Per-key views (``offset_per_key``, ``kja["key"]``, ``to_dict``) and the ops that build new arrays
(``split``, ``permute``, ``concat``, ``empty``, ``empty_like``). Each checks its arguments and
names itself in its messages; none loops in Python over batch slots or values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from ..core.buffers import as_int_list
from ..errors import ArgumentError, ArgumentTypeError
from .device import namespace, to_host, xp_take
from .jagged_array import JaggedArray, cumulative

__all__ = ["KeyedOps"]

_K = TypeVar("_K", bound="KeyedOps")
_NAME = "KeyedJaggedArray"


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + c) for s, c in zip(starts, counts)])`` without a Python loop."""
    counts = counts.astype(np.int64, copy=False)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, np.int64)
    begins = np.cumsum(counts) - counts
    index: np.ndarray = np.arange(total, dtype=np.int64) - np.repeat(begins, counts)
    return index + np.repeat(starts.astype(np.int64), counts)


class KeyedOps:
    """torchrec's KeyedJaggedTensor methods over the fields of a :class:`KeyedJaggedArray`."""

    _keys: list[str]
    _values: np.ndarray
    _lengths: np.ndarray
    _offsets: np.ndarray | None
    _offsets64: np.ndarray | None
    _weights: np.ndarray | None
    _stride: int
    _spkpr: list[list[int]] | None
    _per_key: tuple[list[int], list[int], list[int]] | None

    @classmethod
    def _trusted(
        cls: type[_K],
        keys: list[str],
        values: np.ndarray,
        lengths: np.ndarray,
        weights: np.ndarray | None,
        stride: int,
        stride_per_key_per_rank: list[list[int]] | None,
    ) -> _K:
        """Build without checks, from parts the library computed itself."""
        self = cls.__new__(cls)
        self._keys, self._values, self._lengths, self._offsets = keys, values, lengths, None
        self._offsets64 = None
        self._weights, self._stride, self._spkpr, self._per_key = (
            weights,
            stride,
            stride_per_key_per_rank,
            None,
        )
        return self

    # ----------------------------------------------------------------------------- per-key views

    def offsets(self) -> np.ndarray:
        """``[0] + cumsum(lengths)``, computed on first use."""
        if self._offsets is None:
            self._offsets = cumulative(self._lengths, self._lengths.dtype)
        return self._offsets

    def _wide_offsets(self) -> np.ndarray:
        """``offsets()`` in a dtype no sum of the lengths wraps in (computed on first use).

        ``offsets()`` keeps the lengths' dtype, as torchrec does, so uint16 or int32 lengths whose
        total passes that dtype's range wrap there; the exchange counts from these instead.
        """
        if self._offsets64 is None:
            if self._lengths.dtype.itemsize == 8:
                self._offsets64 = KeyedOps.offsets(self)
            else:
                self._offsets64 = cumulative(self._lengths, np.int64)
        return self._offsets64

    def stride_per_key(self) -> list[int]:
        """Batch slots of each key."""
        return self._per_key_stats()[0]

    def length_per_key(self) -> list[int]:
        """Values of each key (the sum of its lengths)."""
        return self._per_key_stats()[1]

    def offset_per_key(self) -> list[int]:
        """``[0] + cumsum(length_per_key())``: where each key's values start."""
        return self._per_key_stats()[2]

    def lengths_offset_per_key(self) -> list[int]:
        """``[0] + cumsum(stride_per_key())``: where each key's lengths start."""
        ends = np.zeros(len(self._keys) + 1, dtype=np.int64)
        np.cumsum(self.stride_per_key(), out=ends[1:])
        return [int(e) for e in ends]

    def index_per_key(self) -> dict[str, int]:
        """``{key: its position}``.

        Example:
            >>> import numpy as np
            >>> from mpicomm import KeyedJaggedArray
            >>> KeyedJaggedArray(["A", "B"], np.arange(2), lengths=np.array([1, 1])).index_per_key()
            {'A': 0, 'B': 1}
        """
        return {k: i for i, k in enumerate(self._keys)}

    def _per_key_stats(self) -> tuple[list[int], list[int], list[int]]:
        if self._per_key is None:
            vbe = self._spkpr
            spk = [sum(r) for r in vbe] if vbe is not None else [self._stride] * len(self._keys)
            ends = np.zeros(len(spk) + 1, dtype=np.int64)
            np.cumsum(spk, out=ends[1:])
            # KeyedOps.offsets: the arrays' own, also under mpicomm.KeyedJaggedArray (which answers in torch)
            opk = to_host(xp_take(KeyedOps.offsets(self), ends)).astype(np.int64).tolist()
            lpk = np.diff(opk).tolist()
            self._per_key = (spk, lpk, opk)
        return self._per_key

    def __getitem__(self, key: str) -> JaggedArray:
        """One key's rows as a :class:`JaggedArray` of views (torchrec's ``kjt["key"]``).

        Raises:
            ArgumentError: no such key.

        Example:
            >>> import numpy as np
            >>> from mpicomm import KeyedJaggedArray
            >>> kja = KeyedJaggedArray(["A", "B"], np.arange(4), lengths=np.array([1, 0, 2, 1]))
            >>> [row.tolist() for row in kja["B"]]
            [[1, 2], [3]]
        """
        try:
            i = self._keys.index(key)
        except ValueError:
            raise ArgumentError(
                f"{_NAME}[...]: key is {key!r}; expected one of the keys {self._keys[:8]}"
                + (" ..." if len(self._keys) > 8 else "")
            ) from None
        return self._jagged(i)

    def _jagged(self, i: int) -> JaggedArray:
        spk, _, opk = self._per_key_stats()
        lo = sum(spk[:i])
        v = slice(opk[i], opk[i + 1])
        w = None if self._weights is None else self._weights[v]
        return JaggedArray(self._values[v], self._lengths[lo : lo + spk[i]], w)

    def to_dict(self) -> dict[str, JaggedArray]:
        """``{key: JaggedArray}`` (torchrec's ``to_dict``); each JaggedArray is also the list of its rows.

        Example:
            >>> import numpy as np
            >>> from mpicomm import KeyedJaggedArray
            >>> kja = KeyedJaggedArray(["A", "B"], np.arange(4), lengths=np.array([1, 0, 2, 1]))
            >>> {k: ja.lengths().tolist() for k, ja in kja.to_dict().items()}
            {'A': [1, 0], 'B': [2, 1]}
        """
        return {k: self._jagged(i) for i, k in enumerate(self._keys)}

    def wait(self: _K) -> _K:
        """Return this array: torchrec's ``KJTAllToAll(...)(kjt).wait().wait()`` chain works unchanged.

        In mpicomm one ``wait()`` on the awaitable already gives the KeyedJaggedArray.
        """
        return self

    # ----------------------------------------------------------------------------- new arrays

    def split(self: _K, segments: Sequence[int]) -> list[_K]:
        """Cut the keys into consecutive groups of ``segments[i]`` keys (torchrec's ``split``).

        The pieces are views into this array's values and lengths.

        Args:
            segments: Keys per piece; non-negative, summing to the number of keys.

        Returns:
            One KeyedJaggedArray per segment (an empty segment keeps the stride).

        Raises:
            ArgumentTypeError: segments are not integers.
            ArgumentError: a negative segment, or segments that do not sum to the number of keys.

        Example:
            >>> import numpy as np
            >>> from mpicomm import KeyedJaggedArray
            >>> kja = KeyedJaggedArray(["A", "B", "C"], np.arange(6), lengths=np.array([1, 1, 2, 0, 1, 1]))
            >>> [(p.keys(), p.values().tolist()) for p in kja.split([1, 2])]
            [(['A'], [0, 1]), (['B', 'C'], [2, 3, 4, 5])]
        """
        fn = f"{_NAME}.split"
        if isinstance(segments, (str, bytes)) or not isinstance(segments, (list, tuple, np.ndarray)):
            raise ArgumentTypeError(f"{fn}: segments is {segments!r}; expected a list of ints")
        segs = as_int_list(segments, fn, "segments")
        if sum(segs) != len(self._keys):
            raise ArgumentError(
                f"{fn}: segments sum to {sum(segs)}; expected {len(self._keys)} (the number of keys)"
            )
        spk, _, opk = self._per_key_stats()
        lo = np.concatenate([[0], np.cumsum(spk, dtype=np.int64)]).tolist()
        out, start = [], 0
        for seg in segs:
            end = start + seg
            v, n = slice(opk[start], opk[end]), slice(lo[start], lo[end])
            vbe = None if self._spkpr is None else self._spkpr[start:end]
            w = None if self._weights is None else self._weights[v]
            out.append(
                self._trusted(self._keys[start:end], self._values[v], self._lengths[n], w, self._stride, vbe)
            )
            start = end
        return out

    def permute(self: _K, indices: Sequence[int], indices_tensor: Any = None) -> _K:
        """The keys in the order ``indices`` (a subset is allowed), with their rows (torchrec's ``permute``).

        Args:
            indices: Positions of the keys to take, in the new order; each at most once.
            indices_tensor: Accepted for torchrec compatibility; the same indices as an array.

        Returns:
            A new KeyedJaggedArray (copies of the values, gathered in one numpy call).

        Raises:
            ArgumentTypeError: indices are not integers.
            ArgumentError: an index out of range or repeated.

        Example:
            >>> import numpy as np
            >>> from mpicomm import KeyedJaggedArray
            >>> kja = KeyedJaggedArray(["A", "B", "C"], np.arange(6), lengths=np.array([1, 1, 2, 0, 1, 1]))
            >>> p = kja.permute([2, 0])
            >>> p.keys(), p.lengths().tolist(), p.values().tolist()
            (['C', 'A'], [1, 1, 1, 1], [4, 5, 0, 1])
        """
        order = self._check_indices(indices if indices_tensor is None else indices_tensor)
        spk, lpk, opk = self._per_key_stats()
        lo = np.concatenate([[0], np.cumsum(spk, dtype=np.int64)])
        pick = np.asarray(order, dtype=np.int64)
        rows = _ranges(lo[:-1][pick], np.asarray(spk, np.int64)[pick])
        vals = _ranges(np.asarray(opk[:-1], np.int64)[pick], np.asarray(lpk, np.int64)[pick])
        vbe = None if self._spkpr is None else [self._spkpr[i] for i in order]
        if not isinstance(self._values, np.ndarray):  # device arrays: each index uploaded once
            xp = namespace(self._values)
            rows, vals = xp.asarray(rows), xp.asarray(vals)
        w = None if self._weights is None else self._weights[vals]
        keys = [self._keys[i] for i in order]
        return self._trusted(keys, self._values[vals], self._lengths[rows], w, self._stride, vbe)

    def _check_indices(self, indices: object) -> list[int]:
        fn = f"{_NAME}.permute"
        if isinstance(indices, (str, bytes)) or not isinstance(indices, (list, tuple, np.ndarray)):
            raise ArgumentTypeError(f"{fn}: indices is {indices!r}; expected a list of ints")
        order = as_int_list(indices, fn, "indices")
        n = len(self._keys)
        bad = [i for i in order if not 0 <= i < n]
        if bad:
            raise ArgumentError(f"{fn}: indices has {bad[0]}; expected 0 <= index < {n} (the number of keys)")
        if len(set(order)) != len(order):
            twice = next(i for i in order if order.count(i) > 1)
            raise ArgumentError(f"{fn}: indices lists {twice} twice; expected each key at most once")
        return order

    @classmethod
    def concat(cls: type[_K], kja_list: Sequence[KeyedOps]) -> _K:
        """The keys of every array in ``kja_list``, one after the other (torchrec's ``concat``).

        Args:
            kja_list: KeyedJaggedArrays with distinct keys, all weighted or none, all VBE or none, the
                same stride (non-VBE) and the same dtypes.

        Returns:
            A new KeyedJaggedArray.

        Raises:
            ArgumentTypeError: an entry is not a KeyedJaggedArray, or dtypes differ.
            ArgumentError: an empty list, mixed weights or VBE, strides that differ, a repeated key.

        Example:
            >>> import numpy as np
            >>> from mpicomm import KeyedJaggedArray
            >>> a = KeyedJaggedArray(["A"], np.arange(2), lengths=np.array([2, 0]))
            >>> b = KeyedJaggedArray(["B"], np.arange(1), lengths=np.array([0, 1]))
            >>> c = KeyedJaggedArray.concat([a, b])
            >>> c.keys(), c.lengths().tolist(), c.stride()
            (['A', 'B'], [2, 0, 0, 1], 2)
        """
        parts = _check_concat(cls, kja_list)
        first = parts[0]
        weighted, vbe = first._weights is not None, first._spkpr is not None
        keys = [k for p in parts for k in p._keys]
        xp = namespace(first._values)
        values = xp.concatenate([p._values for p in parts])
        lengths = xp.concatenate([p._lengths for p in parts])
        w = xp.concatenate([p._weights for p in parts if p._weights is not None]) if weighted else None
        table = [row for p in parts for row in (p._spkpr or [])] if vbe else None
        stride = next((p._stride for p in parts if p._keys), first._stride)
        if vbe:
            stride = max(p._stride for p in parts)
        return cls._trusted(keys, values, lengths, w, stride, table)

    @classmethod
    def empty(
        cls: type[_K],
        is_weighted: bool = False,
        device: Any = None,
        values_dtype: Any = None,
        weights_dtype: Any = None,
        lengths_dtype: Any = np.int32,
    ) -> _K:
        """A KeyedJaggedArray with no keys and stride 0 (torchrec's ``empty``; ``device`` is not used).

        Example:
            >>> from mpicomm import KeyedJaggedArray
            >>> e = KeyedJaggedArray.empty(is_weighted=True)
            >>> e.keys(), e.stride(), e.weights().size
            ([], 0, 0)
        """
        values = np.empty(0, dtype=values_dtype or np.float32)
        weights = np.empty(0, dtype=weights_dtype or np.float32) if is_weighted else None
        return cls._trusted([], values, np.empty(0, dtype=lengths_dtype), weights, 0, None)

    @classmethod
    def empty_like(cls: type[_K], kja: KeyedOps) -> _K:
        """No keys, with ``kja``'s stride and dtypes (torchrec's ``empty_like``).

        Raises:
            ArgumentTypeError: ``kja`` is not a KeyedJaggedArray.
        """
        if not isinstance(kja, cls):
            raise ArgumentTypeError(
                f"{_NAME}.empty_like: kja is a {type(kja).__qualname__}; expected a KeyedJaggedArray"
            )
        w = None if kja._weights is None else kja._weights[:0]
        return cls._trusted([], kja._values[:0], kja._lengths[:0], w, kja._stride, None)


def _check_concat(cls: type[_K], kja_list: object) -> list[_K]:
    fn = f"{_NAME}.concat"
    if not isinstance(kja_list, (list, tuple)) or not kja_list:
        raise ArgumentError(f"{fn}: kja_list is {kja_list!r}; expected a non-empty list of KeyedJaggedArray")
    bad = next((i for i, p in enumerate(kja_list) if not isinstance(p, cls)), None)
    if bad is not None:
        got = type(kja_list[bad]).__qualname__
        raise ArgumentTypeError(f"{fn}: kja_list[{bad}] is a {got}; expected a KeyedJaggedArray")
    parts: list[_K] = list(kja_list)
    for i, p in enumerate(parts[1:], 1):
        _check_alike(p, parts[0], i, fn)
    keyed = [p for p in parts if p._keys]
    for i, p in enumerate(parts):
        if p._spkpr is None and keyed and p._keys and p._stride != keyed[0]._stride:
            raise ArgumentError(
                f"{fn}: kja_list[{i}] has stride {p._stride}; expected {keyed[0]._stride}, the stride of the "
                "others (VBE arrays may differ)"
            )
    keys = [k for p in parts for k in p._keys]
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ArgumentError(f"{fn}: the arrays share keys {dup}; expected distinct keys")
    return parts


def _check_alike(p: KeyedOps, first: KeyedOps, i: int, fn: str) -> None:
    """``p`` can be concatenated after ``first``: weights, VBE, dtypes and value shapes agree."""
    if (p._weights is None) != (first._weights is None):
        raise ArgumentError(
            f"{fn}: kja_list[{i}] {'has no' if p._weights is None else 'has'} weights and kja_list[0] "
            f"{'has no' if first._weights is None else 'has'} weights; expected all weighted or none"
        )
    if (p._spkpr is None) != (first._spkpr is None):
        raise ArgumentError(f"{fn}: kja_list[{i}] and kja_list[0] differ in VBE; expected all VBE or none")
    if type(p._values) is not type(first._values):
        raise ArgumentTypeError(
            f"{fn}: kja_list[{i}] holds {type(p._values).__qualname__} arrays and kja_list[0] "
            f"{type(first._values).__qualname__} arrays; expected all on the host or all on the GPU"
        )
    pairs = [(p._values, first._values, "values"), (p._lengths, first._lengths, "lengths")]
    if p._weights is not None and first._weights is not None:
        pairs.append((p._weights, first._weights, "weights"))
    for arr, ref, what in pairs:
        if arr.dtype != ref.dtype or arr.shape[1:] != ref.shape[1:]:
            raise ArgumentTypeError(
                f"{fn}: kja_list[{i}] has {what} of dtype {arr.dtype} and row shape {arr.shape[1:]}; "
                f"expected {ref.dtype} and {ref.shape[1:]} like kja_list[0]"
            )
