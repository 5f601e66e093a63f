"""The engine's gate without the engine: what a blocking call needs to know, the engine loaded on first need.

The data paths and the front door ask one question on every call: is a call queued for mpicomm's
communication thread (:mod:`mpicomm.core.engine`)? The answer is the count
``mpicomm.core.watchdog._Threads.pending``, kept in the watchdog's thread state, which every call
already reads. So this module holds the gate (``gate``, :class:`Spec`, the arguments' check
:func:`precheck`) and hands everything past the fast path to the engine, importing it there: a
program that never asks for ``async_op=True`` never loads the engine, its queue or its lane (about
a third of a numpy program's first call, issue 44). While nothing is queued the engine need not be
loaded: a count stays above zero from the first queued call until it has run, and for good once a
call the engine ran failed (:mod:`mpicomm.core.engine_work`). The arrow points from the gate to the
engine: the engine imports nothing of this module (it reads the checks off each call's
:class:`Spec`).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, ClassVar, TypeVar

from . import watchdog

__all__ = ["Spec", "drain", "gate", "pending", "precheck", "through", "wanted"]

F = TypeVar("F", bound=Callable[..., Any])

_T = watchdog._Threads


def _engine() -> ModuleType:
    """:mod:`mpicomm.core.engine`, imported now if it was not (the first call past the fast path)."""
    loaded = sys.modules.get(_ENGINE)
    if loaded is not None:
        return loaded
    from . import engine

    return engine


_ENGINE = __name__.rsplit(".", 1)[0] + ".engine"


def precheck(check: Callable[..., None], message: Callable[..., Any] | None = None) -> None:
    """Make ``check(fn, signature, args, kwargs)`` run before every asynchronous call is queued.

    It raises the call's argument error on the caller's thread (before any MPI call), so a mistake
    in an ``async_op=True`` call raises at the call, not at ``wait()``. It must not call MPI.
    ``message(fn, signature, args, kwargs)``, if given, makes a blocking ``send``/``recv`` what the
    in-MPI lane takes (:mod:`mpicomm.core.lane`), or None for one it does not serve.

    Example:
        >>> before = Spec.check, Spec.message
        >>> precheck(lambda fn, signature, args, kw: None)
        >>> Spec.check, Spec.message = before
    """
    Spec.check = check
    Spec.message = message


def pending() -> int:
    """How many posted calls the engine has not finished (0: a call may enter MPI on its own thread).

    Example:
        >>> pending() >= 0
        True
    """
    return _T.pending


class Spec:
    """One gated public call: its host, its name and how the engine may run it.

    The class holds the arguments' check every asynchronous call makes on the caller's thread before
    it is queued, and the in-MPI lane's message (:func:`precheck`): the engine reads them off the
    call's spec, so it needs no import of this module (which loads it).
    """

    __slots__ = ("fn", "group_at", "host", "p2p", "posts", "queued", "signature", "site", "validated")

    #: Set by the front door (:mod:`mpicomm.front.prechecks`, through :func:`precheck`): the engine
    #: sits below the data paths whose checks it runs, so it is handed the function, never imports it.
    check: ClassVar[Callable[[str, inspect.Signature, tuple[Any, ...], dict[str, Any]], None] | None] = None
    #: A blocking send/recv as the in-MPI lane takes it (:mod:`mpicomm.core.lane`), or None.
    message: ClassVar[Callable[[str, inspect.Signature, tuple[Any, ...], dict[str, Any]], Any] | None] = None

    def __init__(
        self, fn: str, host: Callable[..., Any], p2p: bool, posts: bool, validated: bool, queued: bool
    ) -> None:
        self.fn, self.host, self.p2p, self.posts, self.validated = fn, host, p2p, posts, validated
        self.queued = queued
        self.signature = inspect.signature(host)
        names = list(self.signature.parameters)
        self.group_at = names.index("group") if "group" in names else -1
        self.site = watchdog.Site(f"{fn} (run on mpicomm's communication thread)")


def through(spec: Spec, args: tuple[Any, ...], kw: dict[str, Any], async_op: Any) -> Any:
    """The gate's slow path (``mpicomm.core.engine.through``): queued, or on its own lane."""
    return _engine().through(spec, args, kw, async_op)


def wanted(p2p: bool = False, group: Any = None) -> bool:
    """Whether a host that tests the gate itself should hand its call to :func:`through`.

    Asked only past the inline test (``async_op is not False or _T.pending``), so it loads the
    engine: see :func:`mpicomm.core.engine.wanted`.

    Example:
        >>> wanted() in (True, False)
        True
    """
    flag: bool = _engine().wanted(p2p, group)
    return flag


def drain(timeout: Any = None, fn: str = "mpicomm") -> None:
    """Wait until the engine has run every queued call (:func:`mpicomm.core.engine_work.drain`).

    Nothing is queued while the engine is not loaded: then it returns at once.

    Example:
        >>> drain(None, "example")
    """
    if _T.pending:
        from .engine_work import drain as wait

        wait(timeout, fn)


def gate(
    fn: str, *, p2p: bool = False, posts: bool = False, validated: bool = True, queued: bool = True
) -> Callable[[F], F]:
    """Put the engine's gate in front of the host implementation of the public call ``fn``.

    The wrapper keeps the host's signature (``functools.wraps``: the front door and
    ``inspect.signature`` see the host's parameters): a blocking call with nothing queued goes
    straight to the host after one test of ``async_op`` and one of the queue's count; every other
    call goes to the engine (:func:`through`, which loads it).

    Args:
        fn: The public name.
        p2p: A point-to-point call (its own lane at ``MPI_THREAD_MULTIPLE``).
        posts: The host posts non-blocking operations and returns their Work (``isend``, ``irecv``):
            it is never waited for on the engine.
        validated: Whether the call takes part in validation mode's exchange.
        queued: Whether the engine may run the call; False for a call whose results the engine
            cannot hand back in the caller's kinds (one that allocates its outputs): it waits for
            the queue to empty, then runs on the caller's thread (its Work complete on return).

    Returns:
        The decorator.
    """

    def wrap(host: F) -> F:
        spec = Spec(fn, host, p2p, posts, validated, queued)
        names = list(spec.signature.parameters)
        at = names.index("async_op") if "async_op" in names else -1
        default = spec.signature.parameters["async_op"].default if at >= 0 else False

        @functools.wraps(host)
        def gated(*args: Any, **kwargs: Any) -> Any:
            if at < 0:  # no async_op (isend, irecv, send, recv): only the queue decides
                return host(*args, **kwargs) if not _T.pending else through(spec, args, kwargs, posts)
            flag = args[at] if at < len(args) else kwargs.get("async_op", default)
            if flag is False and not _T.pending:
                return host(*args, **kwargs)  # nothing queued, a blocking call: the host, here
            return through(spec, args, kwargs, flag)

        return gated  # type: ignore[return-value]

    return wrap
