"""c10d's options in mpicomm's terms, once for both torch adapters: reductions, roots, timeouts.

torch hands a group its options as objects (``AllreduceOptions.reduceOp``, ``BroadcastOptions.rootRank``,
``BarrierOptions.timeout``) or, in c10d's older overloads, as the value itself (``pg.broadcast([t], 0)``,
``pg.allreduce([t], ReduceOp.MAX)``). The registered group (:mod:`mpicomm.c10d.registered`, what torch
builds for ``backend="mpicomm"``) and the methods of mpicomm's own groups (:mod:`mpicomm.c10d.pg_methods`)
both read them here. Imports no torch: mpicomm's own groups work without it, and torch's objects are
read by their attributes.

Timeouts are clamped to :data:`LONGEST_TIMEOUT` (100 years): ``timedelta(days=10**6)`` means "never"
to a user, but overflows the nanosecond clocks of torch's store.
"""

from __future__ import annotations

import datetime
from typing import Any

from ..core.groups import timeout_seconds
from ..core.reduce_op import ReduceOp
from ..errors import ArgumentTypeError

__all__ = ["LONGEST_TIMEOUT", "barrier_timeout", "clamped", "reduction", "root", "seconds"]

#: The longest timeout kept; a longer one is taken as this (torch's store counts int64 nanoseconds,
#: about 292 years, from an arbitrary start).
LONGEST_TIMEOUT = datetime.timedelta(days=36500)
_LONGEST_SECONDS = LONGEST_TIMEOUT.total_seconds()
_ZERO = datetime.timedelta(0)
# torch's reduction kinds (RedOpType members) already decoded, by type and kind: a pybind enum equals
# the int of its value, which must not find MIN for a plain 3
_BY_KIND: dict[tuple[type, Any], ReduceOp] = {}


def reduction(op: Any, fn: str) -> ReduceOp:
    """Mpicomm's reduction for ``op``: ours, torch's ``ReduceOp`` (PREMUL_SUM with its factor) or its kind.

    Args:
        op: A :class:`~mpicomm.ReduceOp`, torch's ``ReduceOp`` object (what ``opts.reduceOp`` gives), a
            ``ReduceOp.RedOpType`` member, or anything named like one (``"MAX"``).
        fn: The call to name in an error.

    Returns:
        The reduction.

    Raises:
        ArgumentTypeError: ``op`` names no reduction.

    Example:
        >>> from mpicomm import ReduceOp
        >>> reduction(ReduceOp.MAX, "f") is ReduceOp.MAX, reduction("min", "f") is ReduceOp.MIN
        (True, True)
    """
    if isinstance(op, ReduceOp):
        return op
    kind = getattr(op, "op", op)  # torch's ReduceOp object holds a RedOpType
    try:
        return _BY_KIND[type(kind), kind]
    except (KeyError, TypeError):  # TypeError: an unhashable op, refused below
        pass
    name = str(getattr(kind, "name", None) or str(kind).rsplit(".", 1)[-1]).upper()
    if name == "PREMUL_SUM":
        factor = getattr(op, "factor", None)
        if factor is None:
            raise ArgumentTypeError(f"{fn}: op is {op!r}; expected PREMUL_SUM made with its factor")
        return ReduceOp.PREMUL_SUM(factor.item() if hasattr(factor, "item") else factor)
    found = getattr(ReduceOp, name, None)
    if not isinstance(found, ReduceOp):
        raise ArgumentTypeError(f"{fn}: op is {op!r}; expected a ReduceOp")
    if not isinstance(kind, (str, int)):
        _BY_KIND[type(kind), kind] = found
    return found


def root(opts: Any, given: int = 0) -> int:
    """The group rank of a rooted call: ``opts.rootRank`` (c10d's options), ``opts`` itself, or ``given``.

    Example:
        >>> class Opts:
        ...     rootRank = 1
        >>> root(Opts()), root(2), root(None, 3)
        (1, 2, 3)
    """
    if opts is None:
        return given
    rank = getattr(opts, "rootRank", None)
    if rank is not None:
        return int(rank)
    if isinstance(opts, int) and not isinstance(opts, bool):
        return opts
    return given


def barrier_timeout(opts: Any, given: Any = None) -> Any:
    """A barrier's own bound: ``opts.timeout`` when set and above zero (torch leaves it below), or ``given``.

    Example:
        >>> import datetime
        >>> class Opts:
        ...     timeout = datetime.timedelta(0)
        >>> barrier_timeout(Opts(), 5.0)
        5.0
    """
    own = getattr(opts, "timeout", None) if opts is not None else None
    if own is None or (isinstance(own, datetime.timedelta) and own <= _ZERO):
        return given
    return clamped(own) if isinstance(own, datetime.timedelta) else own


def clamped(timeout: datetime.timedelta) -> datetime.timedelta:
    """``timeout``, at most :data:`LONGEST_TIMEOUT`.

    Example:
        >>> clamped(datetime.timedelta(days=10**6)) == LONGEST_TIMEOUT
        True
    """
    return min(timeout, LONGEST_TIMEOUT)


def seconds(timeout: Any, fn: str) -> float | None:
    """Seconds in torch's ``timeout`` (a ``timedelta`` or a number; None: none), at most 100 years.

    Raises:
        ArgumentTypeError: not a timedelta or a number.
        ArgumentError: negative.

    Example:
        >>> seconds(datetime.timedelta(minutes=2), "f"), seconds(datetime.timedelta(days=10**6), "f")
        (120.0, 3153600000.0)
    """
    value = timeout_seconds(timeout, fn)
    return None if value is None else min(value, _LONGEST_SECONDS)
