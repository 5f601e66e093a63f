"""What every public collective shares around its body: one-rank mistakes and MPI errors.

:func:`collective` wraps a public function once, at its definition:

- With validation mode on, a local check that fails on some ranks only (``output_split_sizes[0]``
  wrong on rank 0) would leave the other ranks waiting in the validation exchange forever. The
  wrapper sends the failure into that exchange instead, so every rank raises the same error.
- An error that MPI reports in a blocking call (``mpi4py.MPI.Exception``) becomes a
  :class:`~mpicomm.CommunicationError` that names the function.
- ``async_op`` takes a bool only (``async_op="no"`` would be true).
- At ``MPI_THREAD_MULTIPLE`` a collective holds its group while it runs, as the front door's calls
  do (:mod:`mpicomm.core.busy`): two threads on one group at once raise instead of pairing wrongly.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from ..errors import ArgumentError, ArgumentTypeError, CommunicationError, MpicommError
from . import busy, validation, watchdog
from .groups import resolve
from .work import mpi_text

__all__ = ["check_flag", "collective", "failed"]

P = ParamSpec("P")
R = TypeVar("R")


def collective(
    fn: str, group_of: Callable[..., Any] | None = None, *, validated: bool = True
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Wrap the public collective ``fn`` (see the module docstring).

    Args:
        fn: The public name, for messages.
        group_of: Given the call's bound arguments (a dict), the ``group`` argument; by default the
            argument named ``group``.
        validated: Whether ``fn`` takes part in validation mode's exchange (False for point-to-point
            calls, whose peers are not in any exchange: their local failures raise on this rank only).

    Returns:
        The decorator.
    """

    def wrap(func: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(func)
        names = list(signature.parameters)
        flag = names.index("async_op") if "async_op" in names else -1
        state = validation._Flag
        site, held, timeout = _watched(fn, names, group_of)
        key = names[held] if held >= 0 else ""
        push, pop, serial = watchdog._live.append, watchdog._live.remove, watchdog.serial
        threads, ident = watchdog._Threads, watchdog._get_ident
        # point-to-point calls (validated False) and methods whose group is their object's hold nothing
        exclusive = validated and group_of is None and held >= 0

        @functools.wraps(func)
        def call(*args: P.args, **kwargs: P.kwargs) -> R:
            before = state.exchanges
            token = (
                serial(),
                site,
                args[held] if 0 <= held < len(args) else kwargs.get(key) if kwargs else None,
                None if timeout < 0 else args[timeout] if timeout < len(args) else kwargs.get("timeout"),
            )
            g: Any = busy.FREE
            mine: tuple[Any, ...] = ()
            if exclusive and threads.owner is None:  # MPI_THREAD_MULTIPLE: one thread per group
                mine = (ident(), site, token[2], None)
                g = busy.hold(token[2], mine, threads.engine)
            push(token)  # the watchdog times the call while its token is on the list
            try:
                if flag >= 0 and (
                    kwargs or len(args) > flag
                ):  # the cheap test first: most calls pass neither
                    check_flag(fn, args, kwargs, flag)
                return func(*args, **kwargs)
            except Exception as exc:
                raise failed(fn, exc, before, validated, signature, args, kwargs, group_of)  # noqa: B904
            finally:
                pop(token)
                if g is not busy.FREE:
                    busy.let_go(g, mine)

        return call

    return wrap


def _watched(
    fn: str, names: list[str], group_of: Callable[..., Any] | None
) -> tuple[watchdog.Site, int, int]:
    """The watchdog's site of ``fn``, and the indexes of its token's argument and ``timeout`` (-1: none).

    The token holds the ``group`` argument; for a method whose group is its object's
    (``KJTAllToAll.__call__``, whose ``group_of`` reads ``self``), the object.
    """
    timeout = names.index("timeout") if "timeout" in names and fn in ("barrier", "monitored_barrier") else -1
    if "group" in names:
        return watchdog.Site(fn), names.index("group"), timeout
    if group_of is not None and names and names[0] == "self":
        return watchdog.Site(fn, lambda obj: group_of({"self": obj})), 0, timeout
    return watchdog.Site(fn, lambda _: None), -1, timeout


def check_flag(fn: str, args: tuple[Any, ...], kwargs: dict[str, Any], flag: int) -> None:
    """Raise unless the call's ``async_op`` (keyword, or positional at index ``flag``) is a bool.

    Raises:
        ArgumentTypeError: ``async_op`` is not True or False.
    """
    value = kwargs["async_op"] if "async_op" in kwargs else args[flag] if len(args) > flag else False
    if value is not True and value is not False:
        raise ArgumentTypeError(f"{fn}: async_op is {value!r}; expected True or False")


def failed(
    fn: str,
    exc: Exception,
    before: int,
    validated: bool,
    signature: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    group_of: Callable[..., Any] | None = None,
) -> Exception:
    """What a failed public call raises: ``exc``, reported to the validation exchange, or an MPI error.

    Args:
        fn: The public name.
        exc: What the call's body raised.
        before: The validation exchange count when the call started.
        validated: Whether the call takes part in validation mode's exchange.
        signature: The call's signature, to find its group.
        args: The call's positional arguments.
        kwargs: The call's keyword arguments.
        group_of: Given the bound arguments, the group (default: the ``group`` argument).

    Returns:
        The exception to raise: a :class:`~mpicomm.CommunicationError` for an error MPI reported,
        else ``exc`` itself (sent into the validation exchange first when one is due).
    """
    if _is_mpi_error(exc):
        # a short receive is no MPI error: mpicomm's own finding (mpicomm.core.statuses)
        lead = "" if getattr(exc, "mpicomm_short", None) is not None else "MPI reported an error: "
        err = CommunicationError(f"{fn}: {lead}{mpi_text(exc)}")
        err.__cause__ = exc
        return err
    if isinstance(exc, MemoryError) and not isinstance(exc, MpicommError):
        exc = _no_memory(fn, exc)
    if not validated or not validation._Flag.on or validation._Flag.exchanges != before:
        return exc
    try:
        bound = signature.bind_partial(*args, **kwargs).arguments
    except TypeError:
        return exc
    group = group_of(bound) if group_of is not None else bound.get("group")
    _report(group, fn, exc)
    return exc


def _no_memory(fn: str, exc: MemoryError) -> ArgumentError:
    """The mpicomm error for a temporary the call could not allocate (numpy's MemoryError as cause).

    An impossible size comes from the caller's arrays: a view with zero strides
    (``np.broadcast_to``, ``as_strided``) stands for more elements than its memory holds, and a
    call that must copy it contiguous (a reduction in place, a packed message) cannot.
    """
    err = ArgumentError(
        f"{fn}: a temporary for an argument could not be allocated ({exc}); expected arrays whose "
        "contiguous copy fits in memory (a view with zero strides, from np.broadcast_to or "
        "as_strided, stands for more elements than its memory holds)"
    )
    err.__cause__ = exc
    return err


def _report(group: Any, fn: str, exc: Exception) -> None:
    """Send a local failure into the validation exchange (returns when there is no group to send on)."""
    try:
        g = resolve(group, fn)
    except Exception:
        return  # a bad group: nothing can be exchanged on it; the caller re-raises exc
    if g.comm is None:
        return
    validation.report(g, fn, exc)


def _is_mpi_error(exc: BaseException) -> bool:
    kind = type(exc)
    return kind.__name__ == "Exception" and kind.__module__ == "mpi4py.MPI"
