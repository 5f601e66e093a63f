"""The one place that knows what an array is: type checks, dtype to MPI datatype, layouts, messages.

Every other module asks this one; none of them tests for ``numpy.ndarray`` itself or for its strides.
A non-contiguous view travels in place through a derived datatype (:mod:`mpicomm.core.layouts`); only
a layout MPI cannot describe (overlapping elements), or a call where MPI cannot use one (reductions),
goes through a contiguous temporary that is copied back. The GPU issue adds cupy here (array module
lookup, stream synchronisation, host staging) without touching the collectives.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from .. import _mpi
from ..errors import ArgumentError, ArgumentTypeError, DtypeMismatchError
from . import layouts

__all__ = [
    "Array",
    "check_array",
    "check_array_list",
    "check_output",
    "check_disjoint",
    "check_disjoint_lists",
    "check_same_dtype",
    "datatype",
    "displacements",
    "message",
    "packs",
    "recv_message",
    "row_message",
    "send_view",
    "staged",
]

#: Work to do once a message has landed: copy a temporary back into a strided output.
Post = Callable[[], None] | None

#: What mpicomm accepts as an array. cupy arrays join in the GPU issue.
Array = np.ndarray

# dtype -> MPI datatype, filled on first use of each dtype (MPI must be loaded by then).
_DATATYPES: dict[np.dtype[Any], Any] = {}


def check_array(x: object, fn: str, arg: str) -> np.ndarray:
    """Return ``x`` if it is an array mpicomm can send, else raise.

    Args:
        x: The value the caller passed.
        fn: The public function's name, for the message.
        arg: The argument's name, for the message.

    Raises:
        ArgumentTypeError: ``x`` is not a numpy array, or holds Python objects.
    """
    if type(x) is not np.ndarray and not isinstance(x, np.ndarray):
        raise ArgumentTypeError(
            f"{fn}: {arg} is a {type(x).__module__}.{type(x).__qualname__}; expected a numpy.ndarray"
        )
    if x.dtype.hasobject:
        raise ArgumentTypeError(
            f"{fn}: {arg} has dtype {x.dtype}; expected a dtype without Python objects "
            "(pickle objects with the object collectives instead)"
        )
    if x.dtype.itemsize == 0:  # MPI counts elements in bytes over the itemsize (issue 34)
        raise ArgumentError(
            f"{fn}: {arg} has dtype {x.dtype.str}, whose elements hold no bytes; expected a dtype of at "
            "least one byte"
        )
    return x


def check_output(x: object, fn: str, arg: str) -> np.ndarray:
    """Like :func:`check_array`, and also require a writeable array (MPI writes into it).

    Any layout is accepted: a strided view is written through, as torch writes through views.

    Raises:
        ArgumentTypeError: ``x`` is not an array.
        ArgumentError: ``x`` is read-only.
    """
    x = check_array(x, fn, arg)
    flags = x.flags
    if not flags.writeable:
        raise ArgumentError(f"{fn}: {arg} is read-only; expected a writeable array")
    return x


def check_array_list(xs: object, fn: str, arg: str, length: int | None, output: bool) -> list[np.ndarray]:
    """Raise unless ``xs`` is a list or tuple of arrays (of ``length`` entries, when given).

    Raises:
        ArgumentTypeError: ``xs`` is not a sequence of arrays.
        ArgumentError: wrong length, or an output entry that MPI cannot write into.
    """
    if not isinstance(xs, (list, tuple)):
        raise ArgumentTypeError(f"{fn}: {arg} is a {type(xs).__qualname__}; expected a list of numpy arrays")
    if length is not None and len(xs) != length:
        raise ArgumentError(f"{fn}: {arg} has {len(xs)} entries; expected {length} (the group size)")
    check = check_output if output else check_array
    arrays = [check(x, fn, f"{arg}[{i}]") for i, x in enumerate(xs)]
    if arrays:
        first = arrays[0].dtype
        for i, x in enumerate(arrays):
            if x.dtype != first:
                raise DtypeMismatchError(
                    f"{fn}: {arg}[{i}] has dtype {x.dtype}; expected {first}, the dtype of {arg}[0]"
                )
    return arrays


def check_same_dtype(a: np.ndarray, b: np.ndarray, fn: str, a_name: str, b_name: str) -> None:
    """Raise unless ``a`` and ``b`` have the same dtype.

    Raises:
        ArgumentTypeError: the dtypes differ.
    """
    if a.dtype != b.dtype:
        raise DtypeMismatchError(
            f"{fn}: {b_name} has dtype {b.dtype}; expected {a.dtype}, the dtype of {a_name}"
        )


def datatype(dtype: np.dtype[Any]) -> Any:
    """The MPI datatype that carries one element of ``dtype``.

    Types MPI has no name for (float16 on some MPIs, structured or byte-swapped dtypes) travel as a
    contiguous run of bytes: they can be moved but not reduced.
    """
    dt = _DATATYPES.get(dtype)
    if dt is None:
        dt = _DATATYPES[dtype] = _make_datatype(dtype)
    return dt


def _make_datatype(dtype: np.dtype[Any]) -> Any:
    MPI = _mpi.MPI
    if dtype.isnative and dtype.kind in "biufc":
        # mpi4py's own typecode table gives the predefined datatype (reductions need it).
        try:
            dt = MPI.Datatype.fromcode(dtype.char)
            # a name the library does not implement (float16 on Open MPI 4) exists but fails here
            if dt != MPI.DATATYPE_NULL and dt.Get_size() == dtype.itemsize:
                return dt
        except (ValueError, KeyError, TypeError, MPI.Exception):
            pass
    # A predefined MPI.BYTE run of itemsize bytes; committed once and kept for the process lifetime.
    dt = MPI.BYTE.Create_contiguous(dtype.itemsize).Commit()
    return dt


#: Point-to-point messages of a strided view up to this many bytes are packed (a contiguous copy sent,
#: or received and copied back): with MPICH 5 on shared memory a derived datatype cost 2-20x
#: "np.ascontiguousarray + contiguous call + copy back" from 64 B to 16 MiB (docs/halo.rst), packing
#: 0.6-1x. Larger ones, and views of long contiguous runs (:data:`RUN_LIMIT`), which MPI moves as
#: block copies, go through a derived datatype, committed once per layout (:mod:`layouts`). The C
#: calls (``mpicomm.core.cmpi``) apply the same two limits, packing into memory kept per thread.
PACK_LIMIT = 1 << 26
#: Contiguous bytes per run from which a strided view is left to a derived datatype.
RUN_LIMIT = 1 << 16


def packs(x: np.ndarray) -> bool:
    """Whether a strided ``x`` is better packed than described by a datatype (size and layout).

    Example:
        >>> import numpy as np
        >>> packs(np.zeros((264, 66))[:, 0]), packs(np.zeros((4, 20000))[:, :-1])
        (True, False)
    """
    if x.nbytes > PACK_LIMIT:
        return False
    run = x.itemsize
    for n, s in zip(reversed(x.shape), reversed(x.strides), strict=True):
        if n > 1 and s != run:
            break
        run *= n
    return run < RUN_LIMIT


def message(x: np.ndarray, pack: bool = False) -> list[Any]:
    """The mpi4py buffer specification that sends ``x`` as it lies, whatever its strides.

    With ``pack`` (point-to-point calls), a strided ``x`` that :func:`packs` travels as a
    contiguous copy instead of through a derived datatype.

    Example:
        >>> import numpy as np, mpicomm
        >>> _ = mpicomm.init()
        >>> len(message(np.zeros((3, 4))[:, 0]))  # [memory, 1, derived datatype]
        3
        >>> message(np.zeros((3, 4))[:, 0], pack=True)[0].flags.c_contiguous
        True
    """
    if x.flags.c_contiguous or x.size == 0:
        return [x, datatype(x.dtype)]
    if pack and packs(x):
        return [np.ascontiguousarray(x), datatype(x.dtype)]
    return layouts.whole(x, datatype(x.dtype), readonly=True)


def recv_message(x: np.ndarray, pack: bool = False) -> tuple[list[Any], Post]:
    """The buffer specification to receive into ``x``, and what to do once the message has landed.

    A C-contiguous or regularly strided ``x`` is written in place (the second item is None); a layout
    whose elements overlap, or with ``pack`` a view that :func:`packs`, is received into a temporary
    that the second item copies back. With ``pack`` (point-to-point calls, whose message may be
    short) the temporary starts as a copy of ``x``: what the message does not reach keeps its value.
    """
    dt = datatype(x.dtype)
    if x.flags.c_contiguous or x.size == 0:
        return [x, dt], None
    if layouts.regular(x) and not (pack and packs(x)):
        return layouts.whole(x, dt, readonly=False), None
    # a point-to-point message may be shorter than x: the temporary starts as x's own values, so the
    # elements it does not reach keep them, as in a contiguous x (the C calls copy back only what
    # arrived); the collectives' messages fill their buffers whole
    tmp = np.ascontiguousarray(x) if pack else np.empty(x.shape, x.dtype)
    return [tmp, dt], _copy_back(x, tmp)


def staged(x: np.ndarray) -> tuple[np.ndarray, Post]:
    """``x`` when C-contiguous, else a contiguous copy and the function that writes it back into ``x``.

    For reductions: MPI's predefined ops are defined on predefined datatypes only, so a strided
    in-place buffer is reduced in a temporary.
    """
    if x.flags.c_contiguous:
        return x, None
    tmp = np.ascontiguousarray(x)
    return tmp, _copy_back(x, tmp)


def row_message(x: np.ndarray, readonly: bool) -> tuple[Any, Any, int, Post]:
    """``(buffer, datatype, unit, post)`` for messages counted in dim-0 rows of ``x``.

    A row is ``unit`` items of ``datatype``: for a C-contiguous ``x`` the element type and the row's
    element count; for a strided ``x`` one derived row type (``unit`` 1) resized to dim 0's stride, so
    MPI reads or writes the rows in place. A layout rows cannot describe goes through a contiguous
    temporary (``post`` copies it back when receiving).
    """
    dt = datatype(x.dtype)
    if not (x.flags.c_contiguous or x.size == 0):
        described = layouts.rows(x, dt, readonly)
        if described is not None:
            return described[0], described[1], 1, None
        tmp = np.ascontiguousarray(x)
        post = None if readonly else _copy_back(x, tmp)
        return tmp, dt, row_size(x), post
    return x, dt, row_size(x), None


def _copy_back(x: np.ndarray, tmp: np.ndarray) -> Callable[[], None]:
    return lambda: np.copyto(x, tmp)


def send_view(x: np.ndarray) -> np.ndarray:
    """``x`` itself when it is C-contiguous, else a C-contiguous copy (for local arithmetic on inputs)."""
    return x if x.flags.c_contiguous else np.ascontiguousarray(x)


def row_size(x: np.ndarray) -> int:
    """Elements in one row along dim 0 (1 for a 1-D array, 0 for an empty trailing shape)."""
    n = 1
    for s in x.shape[1:]:
        n *= s
    return n


def address(x: np.ndarray) -> int:
    """The address of the first byte of ``x``."""
    # through mpi4py's buffer: ten times cheaper than __array_interface__ (which builds a dict)
    return int(_mpi.MPI.buffer(x).address)


def displacements(counts: Iterable[int]) -> list[int]:
    """Where each of ``counts`` starts in their concatenation, as Python ints (MPI's displacements).

    Example:
        >>> displacements([3, 0, 2])
        [0, 3, 3]
    """
    starts = list(itertools.accumulate((int(c) for c in counts), initial=0))
    starts.pop()
    return starts


def as_int_list(values: Sequence[int] | np.ndarray, fn: str, arg: str) -> list[int]:
    """Turn split sizes into a list of Python ints, refusing non-integers and negatives.

    Raises:
        ArgumentTypeError: an entry is not an integer.
        ArgumentError: an entry is negative.
    """
    if type(values) is list and all(type(v) is int for v in values):
        out = values  # the common case, without a round trip through numpy
        if out and min(out) < 0:
            raise ArgumentError(f"{fn}: {arg} has a negative entry {min(out)} in {out}; expected >= 0")
        return out
    arr = np.asarray(values)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ArgumentTypeError(f"{fn}: {arg} is {values!r}; expected a 1-D list of non-negative integers")
    out = [int(v) for v in arr.tolist()]
    if any(v < 0 for v in out):
        raise ArgumentError(f"{fn}: {arg} has a negative entry {min(out)} in {out}; expected >= 0")
    return out


def check_disjoint(out: np.ndarray, inp: np.ndarray, fn: str, out_name: str, in_name: str) -> None:
    """Raise if an output and an input overlap in memory (MPI forbids aliased buffers).

    Interleaved strided views (``a[:, 0]`` and ``a[:, 1]``) share a byte range but no element; they
    are told apart exactly.

    Raises:
        ArgumentError: the two arrays share memory.
    """
    if np.may_share_memory(out, inp) and _shares(out, inp):
        raise ArgumentError(
            f"{fn}: {in_name} overlaps {out_name} in memory; expected separate arrays "
            "(MPI forbids aliased send and receive buffers)"
        )


def _shares(a: np.ndarray, b: np.ndarray) -> bool:
    """Exactly whether ``a`` and ``b`` share an element (byte ranges suffice for contiguous arrays)."""
    if a.flags.c_contiguous and b.flags.c_contiguous:
        return True
    return bool(np.shares_memory(a, b))  # exact: a small Diophantine problem per pair of views


def check_disjoint_lists(
    outs: Sequence[np.ndarray],
    ins: Sequence[np.ndarray],
    same_ok: tuple[int, int] | None,
    fn: str,
    out_name: str,
    in_name: str,
) -> None:
    """Raise if an output entry overlaps another output entry or an input entry.

    ``same_ok = (i, j)`` allows ``outs[i]`` and ``ins[j]`` to be the very same memory (this rank's
    own entry, which is copied locally, never sent). One sort of the byte ranges: O(n log n); entries
    whose byte ranges meet are then compared element-exact when one of them is strided.

    Raises:
        ArgumentError: two entries share memory.
    """
    arrays = [*outs, *ins]
    if all(a.base is None for a in arrays) and len({id(a) for a in arrays}) == len(arrays):
        return  # distinct arrays that each own their memory cannot overlap
    if not all(a.flags.c_contiguous for a in arrays):
        _check_strided_lists(outs, ins, same_ok, fn, out_name, in_name)
        return
    spans = [(address(a), address(a) + a.nbytes, f"{out_name}[{i}]", True) for i, a in enumerate(outs)]
    spans += [(address(a), address(a) + a.nbytes, f"{in_name}[{j}]", False) for j, a in enumerate(ins)]
    if same_ok is not None:
        o, i = outs[same_ok[0]], ins[same_ok[1]]
        if address(o) == address(i) and o.nbytes == i.nbytes:
            del spans[len(outs) + same_ok[1]]
    spans = sorted(s for s in spans if s[1] > s[0])
    out_end, out_name_end = -1, ""
    any_end, any_name_end = -1, ""
    for start, end, name, is_out in spans:
        clash = any_name_end if is_out and start < any_end else out_name_end if start < out_end else None
        if clash:
            raise ArgumentError(
                f"{fn}: {name} overlaps {clash} in memory; expected separate arrays "
                "(MPI forbids overlapping receive buffers)"
            )
        if end > any_end:
            any_end, any_name_end = end, name
        if is_out and end > out_end:
            out_end, out_name_end = end, name


def _check_strided_lists(
    outs: Sequence[np.ndarray],
    ins: Sequence[np.ndarray],
    same_ok: tuple[int, int] | None,
    fn: str,
    out_name: str,
    in_name: str,
) -> None:
    """:func:`check_disjoint_lists` when some entry is strided: byte ranges that meet are compared exactly."""
    spans = [(*_range(a), f"{out_name}[{i}]", True, a) for i, a in enumerate(outs)]
    spans += [(*_range(a), f"{in_name}[{j}]", False, a) for j, a in enumerate(ins)]
    if same_ok is not None:
        o, i = outs[same_ok[0]], ins[same_ok[1]]
        if _range(o) == _range(i) and o.strides == i.strides:
            del spans[len(outs) + same_ok[1]]
    spans = sorted((s for s in spans if s[1] > s[0] and s[4].size), key=lambda s: (s[0], s[1]))
    active: list[tuple[int, int, str, bool, np.ndarray]] = []
    for span in spans:
        start, _, name, is_out, arr = span
        active = [a for a in active if a[1] > start]
        for other in active:
            if (is_out or other[3]) and _shares(arr, other[4]):
                raise ArgumentError(
                    f"{fn}: {name} overlaps {other[2]} in memory; expected separate arrays "
                    "(MPI forbids overlapping receive buffers)"
                )
        active.append(span)


def _range(x: np.ndarray) -> tuple[int, int]:
    """The byte range ``[low, high)`` that ``x`` touches."""
    if x.flags.c_contiguous:
        start = address(x) if x.size else 0
        return start, start + x.nbytes
    low, nbytes = layouts.span(x)
    return low, low + nbytes


class _LargeCounts:
    known: bool | None = None


def large_counts() -> bool:
    """Whether the MPI library has MPI-4 large-count calls (MPICH 4+, Intel MPI; not Open MPI 5.0)."""
    if _LargeCounts.known is None:
        _LargeCounts.known = _mpi.MPI.Get_version() >= (4, 0)
    return _LargeCounts.known
