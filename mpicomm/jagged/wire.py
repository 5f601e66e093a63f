"""The counts message both jagged exchanges start with, and the checks and helpers they share."""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from .. import _mpi
from ..core.buffers import check_array, datatype, displacements, row_size, send_view
from ..core.control import PAYLOAD_ENV, memory_bound
from ..core.groups import ProcessGroup
from ..errors import ArgumentError, ArgumentTypeError, CommunicationError, CrossRankMismatchError
from .keyed import _exact_total

# Per-destination int64 fields of the counts message. The first three must be equal on every rank.
# KJTAllToAll appends, per destination, the batch slots and then the value counts of each of that
# destination's keys, both padded to the largest split: the receiver learns every (source, key)
# segment from this one message.
_FLAGS, _DTYPES, _SPLITS, _ROWS, _VALUES, _STRIDE, _TOTAL = range(7)
_HEADER = 7

_VBE, _WEIGHTED = 1, 2

# jagged_all_to_all's counts message: the _HEADER words, then up to _INLINE lengths of the rows
# for that destination (int64), so that few rows need no lengths Alltoallv of their own.
_INLINE = 9
_JAGGED_WORDS = _HEADER + _INLINE


def _dtype_tag(dtype: np.dtype[Any]) -> str:
    """A dtype's byte-order string, with its name where that string is ambiguous (``<V2`` is bfloat16).

    Example:
        >>> _dtype_tag(np.dtype(np.float32)), _dtype_tag(np.dtype("V2"))
        ('<f4', '|V2:void16')
    """
    return dtype.str if dtype.kind != "V" else f"{dtype.str}:{dtype.name}"


def _fingerprint(*parts: object) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


def _exclusive_cumsum(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _segment_index(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Indices that gather ``counts[i]`` items from ``starts[i]`` for each i in turn (counts >= 0).

    Example:
        >>> _segment_index(np.array([5, 0, 2]), np.array([2, 0, 3])).tolist()
        [5, 6, 2, 3, 4]
    """
    if counts.size == 0:
        return np.empty(0, dtype=np.int64)
    ends = np.cumsum(counts, dtype=np.int64)
    return np.repeat(starts - (ends - counts), counts) + np.arange(int(ends[-1]), dtype=np.int64)


def _check_lengths(lengths: object, fn: str, cheap: bool = False) -> np.ndarray:
    """``lengths`` as a C-contiguous 1-D integer array; ``cheap``: the values are the caller's to check.

    ``cheap`` leaves the negative-entry and exact-total checks to the caller, which sums the
    lengths per destination anyway (:func:`mpicomm.jagged.exchange.jagged_all_to_all`).
    """
    lens = send_view(check_array(lengths, fn, "lengths"))
    if lens.ndim != 1:
        raise ArgumentError(f"{fn}: lengths has shape {lens.shape}; expected a 1-D array")
    if lens.dtype.kind not in "iu":
        raise ArgumentTypeError(f"{fn}: lengths has dtype {lens.dtype}; expected an integer dtype")
    if cheap:
        return lens
    if lens.size and lens.min() < 0:
        raise ArgumentError(f"{fn}: lengths has a negative entry {lens.min()}; expected >= 0")
    _exact_total(lens, fn, "lengths")
    return lens


def _check_values(values: object, fn: str, arg: str = "values") -> np.ndarray:
    vals = send_view(check_array(values, fn, arg))
    if vals.ndim == 0:
        raise ArgumentError(f"{fn}: {arg} is 0-dimensional; expected at least one dimension")
    return vals


def _exchange_header(
    g: ProcessGroup, header: np.ndarray, fn: str, item_bytes: tuple[int, int] = (1, 1)
) -> np.ndarray:
    """Alltoall the per-destination counts; raise on every rank if the fingerprints disagree.

    Every rank sees every rank's fingerprint columns, so comparing them with its own is enough: if
    any two ranks differ, every rank sees a row unlike its own and raises. ``item_bytes`` are the
    bytes of one length and of one row of values, to hold the claims against the payload cap.
    """
    received = np.empty_like(header)
    g.internal.Alltoall([header, _mpi.MPI.INT64_T], [received, _mpi.MPI.INT64_T])
    if received[:, : _SPLITS + 1].tobytes() != header[:, : _SPLITS + 1].tobytes():
        _disagree(received, fn)
    _check_claims(received, fn, item_bytes)
    return received


def _check_claims(received: np.ndarray, fn: str, item_bytes: tuple[int, int] = (1, 1)) -> None:
    """Refuse row and value counts that no real peer sends, before anything is allocated for them."""
    counts = received[:, [_ROWS, _VALUES]]
    bound = memory_bound()
    per_rank = counts.astype(object) @ np.array(item_bytes, dtype=object)  # exact: no int64 wrap
    if (counts >= 0).all() and sum(per_rank) <= bound:
        return
    negative = counts.min(axis=1) < 0
    suspect = int(np.argmax(negative)) if negative.any() else int(np.argmax(per_rank))
    raise CommunicationError(
        f"{fn}: the ranks claim to send {counts[:, 0].tolist()} rows and {counts[:, 1].tolist()} values "
        f"here, {sum(per_rank)} bytes (first suspect: rank {suspect}); expected non-negative counts "
        f"within the payload cap ({bound} bytes, {PAYLOAD_ENV}): a corrupted message or a rank that "
        "does not run mpicomm"
    )


def check_kjt_claims(
    totals: list[int], counts: list[int], nbytes: tuple[int, int], rows: int, values: int, fn: str
) -> None:
    """Refuse KJT per-key value counts that exceed their sender's total, or a payload past the cap.

    Args:
        totals: The values each source says it holds in all (the TOTAL column).
        counts: The values each source sends here (its per-key counts for this rank's keys, summed).
        nbytes: Bytes of one length and of one row of values and weights together.
        rows: The batch slots (lengths) received in all.
        values: The values received in all.
        fn: The public function, for messages.

    Raises:
        CommunicationError: naming the sending rank.
    """
    bound = memory_bound()
    if rows * nbytes[0] + values * nbytes[1] <= bound and all(
        0 <= c <= t for c, t in zip(counts, totals, strict=True)
    ):
        return
    for rank, (c, t) in enumerate(zip(counts, totals, strict=True)):
        if not 0 <= c <= t:
            raise CommunicationError(
                f"{fn}: rank {rank} sends {c} values for this rank's keys but holds {t} values in all; "
                "expected per-key counts that add up to at most its total: a corrupted message or a "
                "rank that does not run mpicomm"
            )
    rank = int(np.argmax(counts))
    raise CommunicationError(
        f"{fn}: the ranks send {rows} lengths and {values} values here (rank {rank} the most, "
        f"{counts[rank]} values), {rows * nbytes[0] + values * nbytes[1]} bytes; expected at most the "
        f"payload cap of {bound} bytes ({PAYLOAD_ENV}; by default a quarter of this node's memory)"
    )


def _disagree(received: np.ndarray, fn: str) -> None:
    """Raise the mismatch error for the first column of ``received`` whose ranks disagree."""
    what = {
        _FLAGS: "weights or VBE, or the device path (device arrays to a CUDA-aware MPI or not)",
        _DTYPES: "dtypes or value shapes",
        _SPLITS: "splits or stagger",
    }
    for column, name in what.items():
        col = received[:, column]
        if (col != col[0]).any():
            bad = int(np.flatnonzero(col != col[0])[0])
            raise CrossRankMismatchError(
                f"{fn}: ranks disagree about {name}: rank 0 and rank {bad} differ; expected the same on "
                "every rank (set MPICOMM_VALIDATE=1 to see the values)"
            )


def _alltoallv(g: ProcessGroup, send: np.ndarray, send_rows: Any, recv: np.ndarray, recv_rows: Any) -> Any:
    """Post one Ialltoallv of whole dim-0 rows (the counts are W-long lists: plain Python is fastest)."""
    row = row_size(send)
    sc = send_rows.tolist() if isinstance(send_rows, np.ndarray) else list(send_rows)
    rc = recv_rows.tolist() if isinstance(recv_rows, np.ndarray) else list(recv_rows)
    if row != 1:
        sc, rc = [c * row for c in sc], [c * row for c in rc]
    dt = datatype(send.dtype)
    return g.internal.Ialltoallv([send, (sc, displacements(sc)), dt], [recv, (rc, displacements(rc)), dt])
