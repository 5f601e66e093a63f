"""``KeyedJaggedArray``: torchrec's KeyedJaggedTensor on numpy or cupy arrays, validated at construction."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..core.buffers import check_array
from ..errors import ArgumentError, ArgumentTypeError
from .device import check_device_array, int_stats, is_device, namespace, to_host
from .keyed_ops import KeyedOps

__all__ = ["KeyedJaggedArray"]

_NAME = "KeyedJaggedArray"


class KeyedJaggedArray(KeyedOps):
    """Variable-length feature lists per key and batch slot, in torchrec's key-major layout.

    ``lengths`` holds one entry per key per batch slot: all slots of the first key, then all slots
    of the second, and so on; ``values`` is the concatenation of the rows in the same order. The
    table of the example below (keys are rows, batch slots are columns)::

               0      1          2
        A  [100]     []  [101, 102]
        B     []  [200]       [201]

    Under variable batch per key (VBE), ``stride_per_key_per_rank[k]`` lists the batch slots of key
    k contributed by each rank; key k then has ``sum(stride_per_key_per_rank[k])`` slots.

    Unlike torchrec, construction checks everything it can: integer, non-negative lengths that sum to
    the number of values, weights as long as values, lengths a multiple of the number of keys (or
    matching ``stride_per_key_per_rank``), and unique string keys.

    The arguments come in torchrec's order (``keys, values, weights, lengths, offsets, stride,
    stride_per_key_per_rank``); torchrec's cached per-key arguments are accepted by keyword and checked.
    torchrec's methods are here too: :meth:`from_lengths_sync`, :meth:`split`, :meth:`permute`,
    :meth:`concat`, ``kja["key"]``, :meth:`to_dict`, :meth:`empty`, :meth:`empty_like`, ...

    Args:
        keys: Unique key names.
        values: The concatenated rows (dim 0 counts values; trailing dimensions are allowed).
        weights: Optional per-value weights, as long as ``values`` along dim 0.
        lengths: Row lengths, key-major; give this or ``offsets``.
        offsets: ``[0] + cumsum(lengths)``; give this or ``lengths``.
        stride: Batch slots per key (non-VBE); needed only when there are no keys.
        stride_per_key_per_rank: VBE: a ``[num_keys][num_ranks]`` table of batch slots.
        stride_per_key: torchrec's cache, keyword only; checked against the lengths.
        length_per_key: torchrec's cache, keyword only; checked.
        offset_per_key: torchrec's cache, keyword only; checked.
        index_per_key: torchrec's cache, keyword only; checked.

    Raises:
        ArgumentTypeError: non-array inputs, non-integer lengths or offsets, non-string keys.
        ArgumentError: any inconsistency between keys, lengths, offsets, values, weights and strides.

    Example:
        >>> import numpy as np
        >>> from mpicomm.jagged import KeyedJaggedArray
        >>> kja = KeyedJaggedArray(["A", "B"], np.array([100, 101, 102, 200, 201]),
        ...                        lengths=np.array([1, 0, 2, 0, 1, 1]))
        >>> kja.stride(), kja.length_per_key(), kja.offset_per_key()
        (3, [3, 2], [0, 3, 5])
        >>> kja["A"][2].tolist(), kja.to_dict()["B"].lengths().tolist()
        ([101, 102], [0, 1, 1])
    """

    __hash__ = None  # type: ignore[assignment]

    def __init__(
        self,
        keys: Sequence[str],
        values: np.ndarray,
        weights: np.ndarray | None = None,
        lengths: np.ndarray | None = None,
        offsets: np.ndarray | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: Sequence[Sequence[int]] | None = None,
        *,
        stride_per_key: Sequence[int] | None = None,
        length_per_key: Sequence[int] | None = None,
        offset_per_key: Sequence[int] | None = None,
        index_per_key: Mapping[str, int] | None = None,
    ) -> None:
        self._keys = _check_keys(keys)
        self._values = _check_values(values)
        self._lengths, self._offsets = _lengths_offsets(lengths, offsets)
        self._weights = _check_weights(weights, self._values)
        _check_sides(self._values, self._lengths, self._weights)
        n = _exact_total(self._lengths, _NAME, "lengths" if offsets is None else "offsets")
        if n != self._values.shape[0]:
            raise ArgumentError(
                f"{_NAME}: lengths sum to {n}; expected {self._values.shape[0]}, the number of values"
            )
        self._spkpr = _check_vbe(stride_per_key_per_rank, len(self._keys), self._lengths.size)
        self._stride = self._check_stride(stride)
        self._per_key: tuple[list[int], list[int], list[int]] | None = None
        self._offsets64: np.ndarray | None = None
        given = {
            "stride_per_key": stride_per_key,
            "length_per_key": length_per_key,
            "offset_per_key": offset_per_key,
        }
        if any(v is not None for v in given.values()) or index_per_key is not None:
            self._check_caches(given, index_per_key)

    def _check_caches(self, given: dict[str, Sequence[int] | None], index_per_key: object) -> None:
        """Check torchrec's cached per-key lists, when given, against this array."""
        have = dict(zip(given, self._per_key_stats(), strict=True))
        for name, value in given.items():
            if value is not None and [int(v) for v in value] != have[name]:
                raise ArgumentError(
                    f"{_NAME}: {name} is {list(value)}; expected {have[name]} (from the lengths)"
                )
        if index_per_key is not None and dict(index_per_key) != self.index_per_key():  # type: ignore[call-overload]
            raise ArgumentError(
                f"{_NAME}: index_per_key is {index_per_key!r}; expected {self.index_per_key()}"
            )

    def _check_stride(self, stride: int | None) -> int:
        k, n = len(self._keys), self._lengths.size
        if stride is not None:
            if isinstance(stride, bool) or not isinstance(stride, (int, np.integer)) or stride < 0:
                raise ArgumentTypeError(f"{_NAME}: stride is {stride!r}; expected a non-negative int or None")
            stride = int(stride)
        if self._spkpr is not None:
            natural = max((sum(row) for row in self._spkpr), default=0)
            if stride is not None and stride != natural:
                raise ArgumentError(
                    f"{_NAME}: stride is {stride} with stride_per_key_per_rank; expected {natural}, the "
                    "most batch slots of any key in the table (or leave stride out)"
                )
            return natural
        if k == 0:
            if n:
                raise ArgumentError(f"{_NAME}: lengths has {n} entries; expected 0 because there are no keys")
            return 0 if stride is None else stride
        if n % k:
            raise ArgumentError(
                f"{_NAME}: lengths has {n} entries; expected a multiple of {k} (the number of keys), "
                "or pass stride_per_key_per_rank for a variable batch per key"
            )
        if stride is not None and stride * k != n:
            raise ArgumentError(f"{_NAME}: stride is {stride}; expected {n // k} ({n} lengths for {k} keys)")
        return n // k

    @classmethod
    def from_offsets(
        cls,
        keys: Sequence[str],
        values: np.ndarray,
        offsets: np.ndarray,
        weights: np.ndarray | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: Sequence[Sequence[int]] | None = None,
    ) -> KeyedJaggedArray:
        """Build from offsets (``[0] + cumsum(lengths)``) instead of lengths.

        Example:
            >>> import numpy as np
            >>> from mpicomm.jagged import KeyedJaggedArray
            >>> offsets = np.array([0, 2, 2, 3, 4, 5, 8])
            >>> kja = KeyedJaggedArray.from_offsets(["F0", "F1"], np.arange(8.0), offsets)
            >>> kja.lengths().tolist(), kja.length_per_key()
            ([2, 0, 1, 1, 1, 3], [3, 5])
        """
        return cls(keys, values, offsets=offsets, weights=weights, stride=stride,
                   stride_per_key_per_rank=stride_per_key_per_rank)  # fmt: skip

    @classmethod
    def from_offsets_sync(
        cls,
        keys: Sequence[str],
        values: np.ndarray,
        offsets: np.ndarray,
        weights: np.ndarray | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: Sequence[Sequence[int]] | None = None,
        inverse_indices: Any = None,
    ) -> KeyedJaggedArray:
        """Build from offsets: torchrec's name for :meth:`from_offsets` (``inverse_indices`` unused)."""
        return cls.from_offsets(keys, values, offsets, weights, stride, stride_per_key_per_rank)

    @classmethod
    def from_lengths_sync(
        cls,
        keys: Sequence[str],
        values: np.ndarray,
        lengths: np.ndarray,
        weights: np.ndarray | None = None,
        stride: int | None = None,
        stride_per_key_per_rank: Sequence[Sequence[int]] | None = None,
        inverse_indices: Any = None,
    ) -> KeyedJaggedArray:
        """Build from lengths, torchrec's argument order (nothing to sync on numpy).

        Example:
            >>> import numpy as np
            >>> from mpicomm import KeyedJaggedArray
            >>> kja = KeyedJaggedArray.from_lengths_sync(["A", "B"], np.arange(3), np.array([1, 0, 2, 0]))
            >>> kja.length_per_key()
            [1, 2]
        """
        return cls(keys, values, weights, lengths, None, stride, stride_per_key_per_rank)

    @classmethod
    def from_dict(
        cls,
        rows: Mapping[str, Sequence[Any]],
        weights: Mapping[str, Sequence[Any]] | None = None,
        dtype: Any = None,
        weights_dtype: Any = None,
    ) -> KeyedJaggedArray:
        """Build from ``{key: [row, row, ...]}``, one row (a list or array of values) per batch slot.

        When every key has the same number of rows, that is the stride; otherwise the result is VBE
        with one rank column (``stride_per_key_per_rank = [[rows of key k]]``).

        Args:
            rows: Per-key lists of rows, in key order.
            weights: Optional per-key lists of weight rows, shaped like ``rows``.
            dtype: The values' dtype (default: numpy's choice, int64 for empty input).
            weights_dtype: The weights' dtype (default: float32).

        Example:
            >>> from mpicomm.jagged import KeyedJaggedArray
            >>> kja = KeyedJaggedArray.from_dict({"A": [[100], [], [101, 102]], "B": [[], [200], [201]]})
            >>> kja.lengths().tolist(), kja.values().tolist()
            ([1, 0, 2, 0, 1, 1], [100, 101, 102, 200, 201])
        """
        keys = list(rows)
        flat = [np.asarray(r, dtype=dtype) for k in keys for r in rows[k]]
        lengths = np.array([len(r) for r in flat], dtype=np.int64)
        if dtype is None:
            # an empty row is float64 to numpy; only rows with values decide the dtype
            dtype = np.result_type(*[r for r in flat if r.size]) if lengths.any() else np.int64
        values = np.concatenate([r.astype(dtype, copy=False) for r in flat]) if flat else np.empty(0, dtype)
        w = None
        if weights is not None:
            wflat = [np.asarray(r, dtype=weights_dtype or np.float32) for k in keys for r in weights[k]]
            w = np.concatenate(wflat) if wflat else np.empty(0, dtype=weights_dtype or np.float32)
        counts = [len(rows[k]) for k in keys]
        vbe = [[c] for c in counts] if len(set(counts)) > 1 else None
        return cls(keys, values, lengths=lengths, weights=w, stride_per_key_per_rank=vbe)

    def keys(self) -> list[str]:
        """The keys, in order."""
        return list(self._keys)

    def values(self) -> np.ndarray:
        """The concatenated rows."""
        return self._values

    def weights(self) -> np.ndarray | None:
        """The per-value weights, or None."""
        return self._weights

    def weights_or_none(self) -> np.ndarray | None:
        """The same as :meth:`weights` (torchrec's name) of :meth:`weights`."""
        return self._weights

    def lengths(self) -> np.ndarray:
        """Row lengths, key-major (one entry per key per batch slot)."""
        return self._lengths

    def stride(self) -> int:
        """Batch slots: ``len(lengths) // len(keys)``, or under VBE the largest per-key total."""
        return self._stride

    def variable_stride_per_key(self) -> bool:
        """Whether this array is VBE (built with ``stride_per_key_per_rank``)."""
        return self._spkpr is not None

    def stride_per_key_per_rank(self) -> list[list[int]] | None:
        """The VBE table ``[num_keys][num_ranks]``, or None when every key has ``stride()`` slots."""
        return None if self._spkpr is None else [list(r) for r in self._spkpr]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KeyedJaggedArray):
            return NotImplemented
        return (
            self._keys == other._keys
            and self._stride == other._stride
            and self._spkpr == other._spkpr
            and _same(self._lengths, other._lengths)
            and _same(self._values, other._values)
            and (
                (self._weights is None and other._weights is None)
                or (self._weights is not None and other._weights is not None
                    and _same(self._weights, other._weights))
            )
        )  # fmt: skip

    def __repr__(self) -> str:
        head = (
            f"KeyedJaggedArray(keys={len(self._keys)}, stride={self._stride}, "
            f"values={self._values.shape[0]} {self._values.dtype}, lengths {self._lengths.dtype}"
            + (f", weights {self._weights.dtype}" if self._weights is not None else "")
            + (f", stride_per_key_per_rank={self._spkpr}" if self._spkpr is not None else "")
            + ")"
        )
        return head + "".join("\n" + line for line in _table(self))


_MAX_ROWS, _MAX_COLS, _MAX_CELL = 16, 8, 24


def _table(kja: KeyedJaggedArray) -> list[str]:
    """The table: one line per key, one column per batch slot, truncated to a screenful."""
    rows = kja.to_dict()
    keys = kja.keys()[:_MAX_ROWS]
    ncols = min(kja.stride(), _MAX_COLS)
    cells = [[_cell(r) for r in rows[k][:ncols]] for k in keys]
    for line in cells:
        line.extend([""] * (ncols - len(line)))
    header = [str(i) for i in range(ncols)]
    widths = [max([len(header[i])] + [len(c[i]) for c in cells]) for i in range(ncols)]
    kw = max([len(k) for k in keys], default=0)
    more = "  ..." if kja.stride() > ncols else ""
    out = (
        [" " * kw + "".join("  " + h.rjust(w) for h, w in zip(header, widths, strict=True)) + more]
        if keys
        else []
    )
    out += [
        k.ljust(kw) + "".join("  " + c.rjust(w) for c, w in zip(line, widths, strict=True))
        for k, line in zip(keys, cells, strict=True)
    ]
    if len(kja.keys()) > len(keys):
        out.append(f"... {len(kja.keys()) - len(keys)} more keys")
    return out


def _cell(row: np.ndarray) -> str:
    text = "[" + ", ".join(str(v) for v in row.tolist()) + "]"
    return text if len(text) <= _MAX_CELL else text[: _MAX_CELL - 4] + "...]"


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape or is_device(a) != is_device(b):
        return False
    return bool(namespace(a).array_equal(a, b))


def _check_sides(values: Any, lengths: Any, weights: Any) -> None:
    """Values, lengths (or offsets) and weights all in host memory or all on the device."""
    nd = np.ndarray
    if type(values) is nd and type(lengths) is nd and (weights is None or type(weights) is nd):
        return  # the common case, in one line of type checks
    dev = is_device(values)
    for arg, x in (("lengths", lengths), ("weights", weights)):
        if x is not None and is_device(x) != dev:
            raise ArgumentTypeError(
                f"{_NAME}: values {'is a device' if dev else 'is a host'} array and {arg} "
                f"{'is not' if dev else 'is a device array'}; expected all arrays on the GPU or all on "
                "the host (move one with cupy.asarray / .get(), or tensor.cuda() / .cpu())"
            )


def _array(x: object, arg: str) -> np.ndarray:
    """``x`` as the jagged code takes it: a numpy array, or a device (cupy) array."""
    if type(x) is np.ndarray or not is_device(x):
        return check_array(x, _NAME, arg)
    dev: np.ndarray = check_device_array(x, _NAME, arg)  # typed as numpy: the same methods are used
    return dev


def _check_keys(keys: object) -> list[str]:
    if isinstance(keys, str) or not isinstance(keys, (list, tuple)):
        raise ArgumentTypeError(f"{_NAME}: keys is a {type(keys).__qualname__}; expected a list of str")
    for i, k in enumerate(keys):
        if not isinstance(k, str):
            raise ArgumentTypeError(f"{_NAME}: keys[{i}] is {k!r}; expected a str")
    if len(set(keys)) != len(keys):
        dup = sorted({k for k in keys if keys.count(k) > 1})
        raise ArgumentError(f"{_NAME}: keys has duplicates {dup}; expected unique keys")
    return list(keys)


def _check_values(values: object) -> np.ndarray:
    v = _array(values, "values")
    if v.ndim == 0:
        raise ArgumentError(f"{_NAME}: values is 0-dimensional; expected at least one dimension")
    return v


def _check_weights(weights: object, values: np.ndarray) -> np.ndarray | None:
    if weights is None:
        return None
    w = _array(weights, "weights")
    if w.ndim == 0 or w.shape[0] != values.shape[0]:
        raise ArgumentError(
            f"{_NAME}: weights has shape {w.shape}; expected {values.shape[0]} entries along dim 0, "
            "one per value"
        )
    return w


def _check_int_array(x: object, arg: str) -> np.ndarray:
    a = _array(x, arg)
    if a.ndim != 1:
        raise ArgumentError(f"{_NAME}: {arg} has shape {a.shape}; expected a 1-D array")
    if a.dtype.kind not in "iu":
        raise ArgumentTypeError(f"{_NAME}: {arg} has dtype {a.dtype}; expected an integer dtype")
    return a


def _exact_total(lengths: np.ndarray, fn: str, arg: str) -> int:
    """The exact sum of non-negative integer ``lengths``; refused if it (or a partial sum) passes int64.

    numpy's sums wrap silently (``[2**64 - 1, 3]`` as uint64 sums to 2), and the offsets are int64.

    Raises:
        ArgumentError: the total is 2**63 or more.
    """
    if lengths.size == 0:
        return 0
    top = int(lengths.max()) if type(lengths) is np.ndarray else int_stats(lengths)[1]
    if top * lengths.size < 2**63:  # no partial sum can wrap: numpy's (or cupy's) sum is exact
        return int(lengths.sum(dtype=np.int64))
    total = int(np.sum(to_host(lengths), dtype=object))
    if total >= 2**63:
        raise ArgumentError(
            f"{fn}: {arg} describe {total} values in all, past int64; expected a total below 2**63 "
            "(numpy's sum would wrap it)"
        )
    return total


def _lengths_offsets(lengths: object, offsets: object) -> tuple[np.ndarray, np.ndarray | None]:
    if (lengths is None) == (offsets is None):
        raise ArgumentError(f"{_NAME}: got {'both' if lengths is not None else 'neither'} lengths and "
                            "offsets; expected exactly one of them (the third positional argument is "
                            "weights, as in torchrec: write lengths=...)")  # fmt: skip
    if lengths is not None:
        lens = _check_int_array(lengths, "lengths")
        if lens.size and (low := _lowest(lens)) < 0:
            raise ArgumentError(f"{_NAME}: lengths has a negative entry {low}; expected >= 0")
        return lens, None
    offs = _check_int_array(offsets, "offsets")
    if offs.size == 0 or int(offs[0]) != 0:
        raise ArgumentError(f"{_NAME}: offsets is {offs[:4].tolist()}...; expected it to start with 0")
    lens = namespace(offs).diff(offs)
    if lens.size and (low := _lowest(lens)) < 0:
        raise ArgumentError(f"{_NAME}: offsets decrease (a length of {low}); expected non-decreasing")
    return lens, offs


def _lowest(a: np.ndarray) -> int:
    """The smallest entry of a non-empty integer array (a device array answers with one transfer)."""
    return int(a.min()) if type(a) is np.ndarray else int_stats(a)[0]


def _check_vbe(table: object, nkeys: int, nlengths: int) -> list[list[int]] | None:
    if table is None:
        return None
    arg = "stride_per_key_per_rank"
    try:
        arr = np.asarray(table)
    except ValueError:
        arr = np.empty((0, 0, 0))
    if arr.ndim != 2 and not (arr.size == 0 and arr.ndim in (1, 2) and nkeys == 0):
        raise ArgumentError(f"{_NAME}: {arg} is {table!r}; expected a [num_keys][num_ranks] table of ints")
    arr = arr.reshape(0, 0) if arr.ndim == 1 else arr
    if arr.size and arr.dtype.kind not in "iu":
        raise ArgumentTypeError(f"{_NAME}: {arg} has entries of dtype {arr.dtype}; expected ints")
    if arr.shape[0] != nkeys:
        raise ArgumentError(f"{_NAME}: {arg} has {arr.shape[0]} rows; expected {nkeys} (one per key)")
    if arr.size and arr.min() < 0:
        raise ArgumentError(f"{_NAME}: {arg} has a negative entry {arr.min()}; expected >= 0")
    if arr.size and int(arr.max()) > nlengths:  # also keeps the sum below from wrapping
        raise ArgumentError(
            f"{_NAME}: {arg} has an entry of {int(arr.max())} slots; expected at most {nlengths}, "
            "the entries of lengths"
        )
    if int(arr.sum()) != nlengths:
        raise ArgumentError(
            f"{_NAME}: {arg} sums to {int(arr.sum())} slots; expected {nlengths}, the entries of lengths"
        )
    return [[int(v) for v in row] for row in arr.tolist()]
