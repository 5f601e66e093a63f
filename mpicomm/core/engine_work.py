"""The Work of a call the engine runs, the engine's queue state, and its failure rule.

Apart from :mod:`mpicomm.core.engine` (its queue's thread and the gate) to keep each module short:
``EngineWork`` is what ``async_op=True`` returns; :func:`drain` waits for the queue to empty;
after a call run by the engine fails, ``_refuse`` raises its error at every later call.
"""

from __future__ import annotations

import datetime
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import CommunicationError
from . import chunks, watchdog
from .work import Work

if TYPE_CHECKING:
    from .engine_gate import Spec

__all__ = ["EngineWork", "drain"]

_T = watchdog._Threads
_get_ident = threading.get_ident


class _Queue:
    """The engine's queue, its thread and the condition :func:`drain` waits on."""

    items: queue.SimpleQueue[EngineWork | None] = queue.SimpleQueue()
    cond = threading.Condition(threading.Lock())
    thread: threading.Thread | None = None
    p2p = 0  # point-to-point calls queued and not yet run (their own lane waits for them)
    stopping = False
    #: Runs the queue up to a Work, on the engine's thread (set by mpicomm.core.engine: _run_until).
    run_until: Callable[[EngineWork], None] | None = None
    #: The error every later call raises once a call run by the engine failed (:func:`_broken`).
    failed: CommunicationError | None = None
    #: ``MPICOMM_ENGINE=0``: no engine; ``async_op=True`` runs the call at once, its Work complete.
    enabled = os.environ.get("MPICOMM_ENGINE", "1").strip() != "0"


_Q = _Queue


class EngineWork(Work):
    """The Work of a call the engine runs: complete once the engine has run it (and what it posted ended).

    ``wait(timeout)`` raises a :class:`~mpicomm.CommunicationError` after about ``timeout`` seconds
    while the call is still queued or inside MPI (the call stays queued: a later wait can complete
    it). A call that posts non-blocking operations (``isend``, ``irecv``) is complete when they are.
    """

    __slots__ = (
        "_args",
        "_asked",
        "_callbacks",
        "_final",
        "_given",
        "_inner",
        "_kw",
        "_lock",
        "_out",
        "_posted",
        "_ran",
        "_raw",
        "_read_args",
        "_spec",
    )
    __qualname__ = "Work"  # messages that name an argument's type say Work, as for any other Work

    def __init__(self, spec: Spec, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
        self._read_args = False
        super().__init__([], fn=spec.fn)
        # a device call's pipeline may have asked the chunk question for this call already (a mark
        # kept per thread, mpicomm.core.chunks): it travels with the call to the engine's thread
        self._asked = chunks._ASKED.answered
        chunks._ASKED.answered = False
        self._spec, self._args, self._kw = spec, args, kw
        self._lock = threading.Lock()
        self._lock.acquire()  # released by the engine once the call has run
        self._ran = False
        self._posted = True
        self._out: Any = None
        self._raw: BaseException | None = None
        self._inner: Work | None = None
        self._callbacks: list[Callable[[EngineWork], None]] = []
        # What the Work's result will be made of: the arguments, as the front door maps them from
        # its views to the caller's arrays (it sets _result on the Work it returns, pending or not).
        self._given: list[Any] = [*args, *kw.values()]
        self._final: list[Any] | None = None
        self._read_args = False

    # -- the result: the host's, its views replaced by what the front door put in their places

    @property  # type: ignore[override]
    def _result(self) -> list[Any]:
        # The front door reads the result of the Work it returns and writes it back mapped (its views
        # replaced by the caller's arrays). Before the call has run that is the arguments, whose
        # mapped copy then translates the host's result; after, the host's result itself.
        if self._final is not None:
            return self._final
        if not self._ran:
            self._read_args = True
            return self._given
        if self._inner is None:
            return []
        result: list[Any] = _replaced(self._inner._result, [*self._args, *self._kw.values()], self._given)
        return result

    @_result.setter
    def _result(self, value: list[Any]) -> None:
        if self._read_args:
            self._given, self._read_args = value, False
        else:
            self._final = value

    # -- torch's Work

    def _block(self, timeout: datetime.timedelta | float | None) -> None:
        """:meth:`wait` until the call has run and what it posted completed (no drain: its queue)."""
        self._wait(timeout)

    def _wait(self, timeout: datetime.timedelta | float | None = None) -> None:
        if not self._ran:
            if _get_ident() == _T.engine:  # a callback of the engine's waits on a later call: run it
                run = _Q.run_until  # set as the engine is imported, before anything is queued
                if run is not None:
                    run(self)
            elif timeout is None:
                self._lock.acquire()
                self._lock.release()
            else:
                seconds = (
                    timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
                )
                if not self._lock.acquire(timeout=max(seconds, 0.0)):
                    raise CommunicationError(
                        f"{self._fn}: Work.wait: the operation did not complete within {seconds:g} s; "
                        "expected every rank of its group to take part (Timed out; the call stays "
                        "queued on mpicomm's communication thread, so its arrays stay in use and a "
                        "later wait() can still complete it)"
                    )
                self._lock.release()
        inner = self._inner
        if inner is not None and not inner._done:
            if _T.pending and _get_ident() != _T.engine and _T.owner is not None:
                drain(timeout, self._fn)  # the engine may be inside MPI: wait for the queue to empty
            inner.wait(timeout) if timeout is not None else inner._wait()
        self._finished()

    def is_completed(self) -> bool:
        """Whether the call has run and what it posted has completed (never blocks)."""
        if self._done:
            return True
        if not self._ran:
            return False
        inner = self._inner
        if inner is not None and not inner._done:
            if _T.pending and _T.owner is not None and _get_ident() != _T.engine:
                return False  # only the engine may enter MPI now: known when the queue empties
            if not inner.is_completed():
                return False
        self._finished()
        return True

    def exception(self) -> BaseException | None:
        """The error the call ended with, or None (also None while it runs)."""
        if self._ran and self._error is None and self._inner is not None and self._inner._done:
            return self._inner._error
        return self._error

    def source_rank(self) -> int:
        """The world rank a completed ``irecv`` received from."""
        self.wait()
        return self._inner.source_rank() if self._inner is not None else -1

    _source_rank = source_rank

    def then_on_engine(self, callback: Callable[[EngineWork], None]) -> None:
        """Run ``callback(self)`` once the engine has run the call (at once if it has).

        It runs on the engine's thread before the engine takes its next call (as gloo's callbacks
        run on its threads), or on this thread if the call has already run.
        """
        with _Q.cond:
            if not self._ran:
                self._callbacks.append(callback)
                return
        callback(self)

    def _finished(self) -> None:
        if self._done:
            return
        if self._error is None and self._inner is not None and self._inner._error is not None:
            self._error = self._inner._error
        self._done = True
        self._keep = None

    def __repr__(self) -> str:
        state = "completed" if self._done else "running" if self._ran else "queued"
        return f"<mpicomm.Work {self._fn} {state}>"


EngineWork.__name__ = "Work"


def _replaced(value: Any, before: list[Any], after: list[Any]) -> Any:
    """``value`` with each object of ``before`` (by identity, also inside lists) replaced by ``after``'s."""
    swap: dict[int, Any] = {}

    def pair(a: Any, b: Any) -> None:
        swap[id(a)] = b
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
            for x, y in zip(a, b, strict=True):
                pair(x, y)

    if len(before) == len(after):
        for a, b in zip(before, after, strict=True):
            pair(a, b)

    def put(v: Any) -> Any:
        if isinstance(v, list):
            return [put(x) for x in v]
        return swap.get(id(v), v)

    return put(value)


def _broken(fn: str, error: BaseException) -> None:
    """A call run by the engine failed: from now on no call of this process enters MPI.

    The ranks no longer agree on which call comes next (this rank left a collective its peers may
    be inside, or MPI reported an error, after which its state is undefined), so a later call would
    pair with the wrong one. Its Work raises ``error`` at ``wait()``; the calls queued behind it are
    not run (their Works raise the error below), and every later call raises it before any MPI
    call. One count stays on ``_T.pending`` for good: it sends every call, the blocking fast paths'
    too, to the gate's slow path or to :func:`drain`, where the error is raised (no test on the
    fast path). Like NCCL, which ends the process on an asynchronous error (its default), but as an
    exception: uncaught, the abort hook ends the job within seconds.
    """
    with _Q.cond:
        if _Q.failed is not None:
            return
        _Q.failed = CommunicationError(
            f"{fn}, run on mpicomm's communication thread, failed ({type(error).__name__}: {error}); "
            "after that no call of this rank enters MPI, as its ranks no longer agree on which call "
            "comes next; expected the job to end"
        )
        _Q.failed.__cause__ = error
        _T.pending += 1
        _Q.cond.notify_all()


def _refuse(fn: str) -> None:
    """Raise the error of an earlier failed call (:func:`_broken`), naming the call ``fn`` refused."""
    failed = _Q.failed
    if failed is not None:
        error = CommunicationError(f"{fn}: not run: {failed}")
        error.__cause__ = failed.__cause__
        raise error


def drain(timeout: datetime.timedelta | float | None = None, fn: str = "mpicomm") -> None:
    """Wait until the engine has run every queued call (a call outside the gate is about to enter MPI).

    Args:
        timeout: Raise after this long (a ``timedelta`` or seconds); None: wait as long as it takes
            (the watchdog bounds each queued call).
        fn: The call that waits, for the message.

    Raises:
        CommunicationError: ``timeout`` passed with calls still queued.
    """
    if _get_ident() == _T.engine:
        return
    _refuse(fn)
    seconds = None
    if timeout is not None:
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    deadline = None if seconds is None else time.monotonic() + seconds
    with _Q.cond:
        while _T.pending:
            _refuse(fn)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise CommunicationError(
                    f"{fn}: {_T.pending} call(s) posted with async_op=True did not complete within "
                    f"{seconds:g} s; expected every rank of their groups to take part (Timed out)"
                )
            _Q.cond.wait(left)
