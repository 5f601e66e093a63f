"""Validation mode: check across ranks what no single rank can see, and fail on every rank together.

With validation on (``MPICOMM_VALIDATE=1`` or :func:`set_validation`), each collective first runs
one small ``allgather`` of a record of the call: function name, op, dtype, element counts and, for
the v-collectives, what each rank sends to and expects from every other. Every rank checks the same
gathered records with the same code, so a mismatch raises the same :class:`CrossRankMismatchError`
on every rank, where without validation MPI would hang or return wrong data. At
``MPI_THREAD_MULTIPLE`` each call holding its group also ends with one agreement on whether two
threads called on the group at once on any rank (:mod:`mpicomm.core.busy`): if so, every rank
raises the same :class:`~mpicomm.DistError` instead of some returning wrongly paired data.

Cost: one extra small allgather per call (a 256-byte slot per rank with the JSON record; the rest
of a longer record point to point; never pickle): a few microseconds to tens of microseconds at
small world sizes, O(W^2) integers for the all-to-alls; at ``MPI_THREAD_MULTIPLE`` one
``MPI_Allreduce`` of one int more per call that holds its group;
keep it for debugging and tests. A local check that fails on some ranks only travels in the same
exchange (see :func:`report`), so every rank raises it together instead of some waiting forever.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from .. import _mpi
from ..errors import (
    ArgumentError,
    ArgumentTypeError,
    BackendArgumentError,
    CommunicationError,
    CrossRankMismatchError,
    DtypeMismatchError,
    GroupError,
    MpicommError,
    ReductionTypeError,
)
from .control import MAX_TEXT, allgather_texts, decode

if TYPE_CHECKING:
    from .groups import ProcessGroup

__all__ = ["agree", "fingerprint", "is_validation_enabled", "set_validation"]


class _FlagState:
    # one instance, _Flag: every call reads it, and Python 3.11 specialises attribute reads on
    # instances with slots (a few instructions), not on classes (a type lookup, ~130 instructions)
    __slots__ = ("dtype", "exchanges", "on")

    def __init__(self) -> None:
        self.on = False
        #: Validation exchanges entered so far (a call that fails before its own tells the other ranks).
        self.exchanges = 0
        #: The dtype the caller passed, where a call runs on a wider copy (float16 and bfloat16 reduce
        #: in float32): the record names this one, so ranks with different half types disagree.
        self.dtype: str | None = None


_Flag = _FlagState()

#: Called with the new setting when validation mode is turned on or off: at
#: ``MPI_THREAD_MULTIPLE``, :mod:`mpicomm.core.busy` makes each call that holds its group agree
#: across the ranks whether two threads raced the group on any rank (it registers itself here,
#: since it imports this module's importers).
WATCHERS: list[Callable[[bool], None]] = []


class exact_dtype:  # noqa: N801 - a context manager used like a function
    """Within it, validation records name ``dtype`` instead of the dtype of the (widened) arrays."""

    def __init__(self, dtype: object) -> None:
        self._dtype = str(dtype)

    def __enter__(self) -> None:
        self._saved, _Flag.dtype = _Flag.dtype, self._dtype

    def __exit__(self, *exc: object) -> None:
        _Flag.dtype = self._saved


#: Error classes by the code a failing rank sends in the validation exchange; 0 means no error.
KINDS: tuple[type[MpicommError] | None, ...] = (
    None,
    ArgumentError,
    ArgumentTypeError,
    ReductionTypeError,
    CrossRankMismatchError,
    GroupError,
    CommunicationError,
    MpicommError,
    BackendArgumentError,  # appended: the codes before it keep their meaning
    DtypeMismatchError,  # a ValueError too, as torch's: the other ranks must not raise a TypeError only
)


def set_validation(enabled: bool = True) -> None:
    """Turn validation mode on or off for this process; every rank must make the same choice.

    Args:
        enabled: True or False.

    Raises:
        ArgumentTypeError: ``enabled`` is not a bool (a string such as ``"no"`` is refused, not read as true).

    Example:
        >>> import mpicomm
        >>> mpicomm.set_validation(True)
        >>> mpicomm.is_validation_enabled()
        True
        >>> mpicomm.set_validation(False)
    """
    if not isinstance(enabled, bool):
        raise ArgumentTypeError(f"set_validation: enabled is {enabled!r}; expected True or False")
    _Flag.on = enabled
    _tell(enabled)


def is_validation_enabled() -> bool:
    """Whether validation mode is on.

    Example:
        >>> import mpicomm
        >>> isinstance(mpicomm.is_validation_enabled(), bool)
        True
    """
    return _Flag.on


def read_environment() -> None:
    """Turn validation on when ``MPICOMM_VALIDATE`` is set to something other than ``0`` or empty."""
    if os.environ.get("MPICOMM_VALIDATE", "0") not in ("", "0"):
        _Flag.on = True
        _tell(True)


def _tell(on: bool) -> None:
    """Tell the modules that follow the setting (:data:`WATCHERS`) that validation mode is ``on`` or off."""
    for watcher in WATCHERS:
        watcher(on)


def check(
    group: ProcessGroup,
    fn: str,
    agree: dict[str, Any],
    sends: Sequence[int] | None = None,
    recvs: Sequence[int] | None = None,
    unit: str = "elements",
    wait: Callable[[Any], None] | None = None,
) -> None:
    """Gather a record of this call from every rank and raise on every rank if they disagree.

    The records travel as JSON text (see :mod:`mpicomm.core.control`), never as pickles.

    Args:
        group: The group the call runs on.
        fn: The public function's name.
        agree: Fields that must be equal on every rank (op, dtype, count, root...).
        sends: Elements this rank sends to each group rank, if the call moves uneven data.
        recvs: Elements this rank expects from each group rank.
        unit: What ``sends`` and ``recvs`` count, for the message.
        wait: Completes (or gives up on) a request: given, the exchange is posted non-blocking
            and bounded by it (``barrier(timeout=)``); see :func:`~mpicomm.core.control.allgather_texts`.

    Raises:
        CrossRankMismatchError: the ranks disagree; the message is the same on every rank.
        MpicommError: another rank's local check failed (see :func:`report`); its error class.
    """
    rows = [None if x is None else [int(v) for v in x] for x in (sends, recvs)]
    if _Flag.dtype is not None and "dtype" in agree:
        agree = {**agree, "dtype": _Flag.dtype}
    import json  # imported here: ~1.3 ms of every start-up otherwise

    record = json.dumps([fn, agree, *rows], default=_plain).encode()
    records = _records(group, fn, _exchange(group, fn, 0, record, wait=wait))
    names = {r[0] for r in records}
    if len(names) > 1:
        # each rank is in a different function, so no function name can start a shared message
        calls = _per_rank([r[0] for r in records])
        raise CrossRankMismatchError(f"validation: ranks called different functions: {calls}")
    try:
        message = _first_mismatch(records, unit)
    except RecursionError:  # a field nested so deep that comparing it recurses too far
        raise CrossRankMismatchError(f"{fn}: validation: a rank sent a record nested too deep") from None
    if message is not None:
        raise CrossRankMismatchError(f"{fn}: validation found ranks that disagree: {message}")


def agree(group: ProcessGroup, fn: str, fields: dict[str, Any]) -> None:
    """Compare ``fields`` across ``group``, validation on or off; raise on every rank if they differ.

    For the calls that make communicators (``new_group``, ``split_group``, ``DeviceMesh``...): they
    are rare and already collective, so one small exchange costs little next to the communicator,
    and ranks that disagree would otherwise get groups that silently hold the wrong ranks. Pass
    long values through :func:`fingerprint`. A local mistake raised on some ranks inside
    ``reporting(group, fn, always=True)`` meets the others here, and every rank raises it.

    Raises:
        CrossRankMismatchError: the ranks passed different ``fields``; the same message everywhere.
        MpicommError: another rank's local check failed; its error class.

    Example:
        >>> import mpicomm
        >>> from mpicomm.core import validation
        >>> validation.agree(mpicomm.init(), "example", {"ranks": [0]})
    """
    import json

    record = json.dumps([fn, fields, None, None], default=_plain).encode()
    if _same_digest(group, record, failed=False):
        return
    records = _records(group, fn, _exchange(group, fn, 0, record))  # raises a rank's local failure
    message = _first_mismatch(records, "elements")
    if message is not None:
        raise CrossRankMismatchError(
            f"{fn}: the ranks passed different arguments: {message}; expected the same on every rank "
            "(each would get a group holding other ranks than it thinks)"
        )


def _same_digest(group: ProcessGroup, record: bytes, failed: bool) -> bool:
    """Whether every rank of ``group`` holds this record and none failed: one 24-byte ``MPI_Allreduce``.

    The common case costs that one small collective; only a difference or a failure (any rank's)
    sends every rank into the text exchange that says what differs, or raises the failure.
    """
    _Flag.exchanges += 1
    import hashlib  # imported here: ~3 ms of every start-up otherwise

    digest = int.from_bytes(hashlib.blake2b(record, digest_size=7).digest(), "little")
    words = np.array([digest, -digest, int(failed)], np.int64)
    group.comm.Allreduce(_mpi.MPI.IN_PLACE, words, _mpi.MPI.MAX)
    return int(words[0]) == -int(words[1]) and not words[2]


def fingerprint(value: object) -> object:
    """``value`` itself if it is short, else a SHA-256 digest of it (with its shape, or its length).

    A grid of ints is hashed from its bytes (a 4096-rank mesh costs microseconds, not a JSON text).

    Example:
        >>> fingerprint([0, 1])
        [0, 1]
        >>> fingerprint(list(range(1000)))[:7]
        'sha256:'
    """
    import hashlib
    import json

    try:
        grid = np.asarray(value, dtype=np.int64)
    except (TypeError, ValueError, OverflowError):  # ragged lists, names: their JSON text
        grid = None
    if grid is not None and grid.ndim:
        if grid.size <= 16:
            return value
        digest = hashlib.sha256(grid.tobytes() + str(grid.shape).encode()).hexdigest()[:32]
        return f"sha256:{digest} of a {grid.shape} grid starting {grid.ravel()[:4].tolist()}"
    text = json.dumps(value, default=_plain)
    if len(text) <= 96:
        return value
    return f"sha256:{hashlib.sha256(text.encode()).hexdigest()[:32]} of {len(text)} chars ({text[:40]}...)"


class reporting:  # noqa: N801 - used as a function: ``with validation.reporting(group, fn):``
    """Around a call's local argument checks: in validation mode a mistake raised there is reported.

    An :class:`~mpicomm.ArgumentError` or :class:`~mpicomm.ArgumentTypeError` leaving the block goes
    through :func:`report`, so the other ranks, waiting in the same call's exchange, raise it too
    instead of waiting for this rank. With validation off (unless ``always``: a call followed by
    :func:`agree`), or ``group`` None (a call that not every rank makes), it passes through unchanged.

    Example:
        >>> import mpicomm
        >>> from mpicomm.core import validation
        >>> with validation.reporting(mpicomm.init(), "example"):
        ...     pass
    """

    __slots__ = ("always", "fn", "group")

    def __init__(self, group: ProcessGroup | None, fn: str, always: bool = False) -> None:
        self.group = group
        self.fn = fn
        self.always = always

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, trace: object) -> None:
        if self.group is None or not isinstance(exc, (ArgumentError, ArgumentTypeError)):
            return
        if self.always:  # the others are in agree(): its digest exchange first, then the texts
            _same_digest(self.group, b"", failed=True)
            report(self.group, self.fn, exc)
        elif _Flag.on:
            report(self.group, self.fn, exc)  # raises the same error on every rank


def report(group: ProcessGroup, fn: str, exc: Exception) -> NoReturn:
    """This rank's local check of ``fn`` failed: tell every rank in the validation exchange, raise together.

    The other ranks, in :func:`check` of the same call, raise the same class with the same message
    (that of the lowest failing rank), instead of waiting forever for this rank.

    Raises:
        MpicommError: always; the class of the lowest failing rank's error.
    """
    world = group.ranks[group.rank()]
    text = f"{exc} (found on rank {world}; validation mode raised it on every rank)"
    _exchange(group, fn, _kind(exc), text.encode(), cause=exc)
    raise AssertionError("unreachable: _exchange raises when a rank reports a failure")  # pragma: no cover


def _plain(value: object) -> object:
    """A JSON-able stand-in for a record field: numpy numbers as Python numbers, anything else as text."""
    if isinstance(value, np.generic):
        return value.item()
    return str(value)


def _kind(exc: Exception) -> int:
    """The code of the nearest class of ``exc`` in :data:`KINDS` (its own, else its closest base)."""
    for cls in type(exc).__mro__:
        if cls in KINDS:
            return KINDS.index(cls)
    if isinstance(exc, TypeError):
        return KINDS.index(ArgumentTypeError)
    if isinstance(exc, ValueError):
        return KINDS.index(ArgumentError)
    return KINDS.index(MpicommError)


def _exchange(
    group: ProcessGroup,
    fn: str,
    kind: int,
    text: bytes,
    cause: Exception | None = None,
    wait: Callable[[Any], None] | None = None,
) -> list[bytes]:
    """Every rank's (kind, record); raise the lowest failing rank's error on every rank if any failed."""
    _Flag.exchanges += 1
    limit = MAX_TEXT + 48 * group.size()
    reports = allgather_texts(group.comm, kind, text, limit, group.internal, wait)
    failed = [(k, t) for k, t in reports if k]
    if failed:
        k, t = failed[0]
        cls = KINDS[k] if 0 < k < len(KINDS) else None
        message = decode(t) + (f" (and {len(failed) - 1} more rank(s) failed)" if len(failed) > 1 else "")
        if cls is None:
            raise CrossRankMismatchError(
                f"{fn}: validation: a rank sent the unknown error code {k}: {message}"
            )
        raise cls(message) from cause
    return [t for _, t in reports]


def _records(group: ProcessGroup, fn: str, texts: list[bytes]) -> list[tuple[str, dict[str, Any], Any, Any]]:
    """The JSON records of every rank, each checked for shape (a hostile rank may send anything)."""
    import json

    out = []
    for rank, text in enumerate(texts):
        try:
            record = json.loads(text)
            if not isinstance(record, list) or len(record) != 4:
                raise TypeError("expected [name, fields, sends, recvs]")
            name, agree, sends, recvs = record
            if not isinstance(name, str) or not isinstance(agree, dict):
                raise TypeError("expected [name, fields, sends, recvs]")
            if (sends is None) != (recvs is None):
                raise TypeError("expected both rows or neither")
            for row in (sends, recvs):
                if row is not None and (
                    not isinstance(row, list)
                    or len(row) != group.size()
                    or not all(type(v) is int for v in row)
                ):
                    raise TypeError(f"expected {group.size()} ints per row")
        except (ValueError, TypeError, RecursionError) as exc:
            raise CrossRankMismatchError(
                f"{fn}: validation: group rank {rank} sent a malformed validation record ({exc})"
            ) from None
        out.append((name, agree, sends, recvs))
    return out


def _first_mismatch(records: list[tuple[str, dict[str, Any], Any, Any]], unit: str) -> str | None:
    """The first field that differs between ranks, or the first send that its receiver does not expect.

    Every field any rank sent is compared (a field missing on a rank differs from one it has).
    """
    keys = dict.fromkeys(k for r in records for k in r[1])
    for key in keys:
        values = [r[1].get(key, "(missing)") for r in records]
        if any(v != values[0] for v in values):
            return f"{key} differs: " + _per_rank(values)
    sends = [r[2] for r in records]
    recvs = [r[3] for r in records]
    if any((row is None) != (sends[0] is None) for row in sends):
        return "per-rank counts differ: " + _per_rank(["given" if row else "none" for row in sends])
    if sends[0] is None:
        return None
    for src, row in enumerate(sends):
        for dst, count in enumerate(row):
            expected = recvs[dst][src]
            if count != expected:
                return (
                    f"rank {src} sends {count} {unit} to rank {dst}, which expects {expected} from rank {src}"
                )
    return None


def _per_rank(values: list[Any]) -> str:
    return ", ".join(f"rank {i}: {v}" for i, v in enumerate(values))
