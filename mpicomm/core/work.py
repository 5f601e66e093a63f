"""``Work``: the handle that ``async_op=True`` calls return, over MPI's non-blocking operations."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _mpi
from ..errors import ArgumentTypeError, CommunicationError
from . import watchdog
from .statuses import all_done, describe, waitall

if TYPE_CHECKING:
    from .future import Future

__all__ = ["Work", "mpi_text", "wait_all"]


class Work:
    """A pending collective or point-to-point operation (torch.distributed's ``Work``).

    The handle keeps every buffer of the operation alive until it completes, so the caller may drop
    its own references. Results are in the caller's arrays once :meth:`wait` returns (or
    :meth:`is_completed` returns True): reading or writing them before that is undefined, as in MPI.

    Example:
        >>> import numpy as np, mpicomm
        >>> x = np.ones(4)
        >>> work = mpicomm.all_reduce(x, async_op=True)
        >>> work.wait()
        True
        >>> bool((x == mpicomm.get_world_size()).all())
        True
    """

    __slots__ = (
        "_done",
        "_error",
        "_finish",
        "_fn",
        "_keep",
        "_ranks",
        "_requests",
        "_result",
        "_source",
        "_status",
    )

    def __init__(
        self,
        requests: list[Any],
        keep: Any = None,
        result: list[Any] | None = None,
        finish: Callable[[], None] | None = None,
        status: Any = None,
        source_ranks: list[int] | None = None,
        fn: str = "",
    ) -> None:
        self._fn = fn
        self._requests = requests
        self._keep = keep
        self._result = result if result is not None else []
        self._finish = finish
        self._status = status
        self._source = -1
        self._ranks = source_ranks
        self._done = False
        self._error: BaseException | None = None

    def wait(self, timeout: datetime.timedelta | float | None = None) -> bool:
        """Block until the operation is complete and return True.

        Args:
            timeout: A ``timedelta`` or seconds: raise if the operation has not completed by then.
                An MPI operation cannot be abandoned halfway: it stays posted (its arrays stay in
                use) and a later ``wait`` can still complete it.

        Raises:
            CommunicationError: MPI reported an error for this operation, or ``timeout`` passed
                (a RuntimeError, as torch's); the message names the call (``all_reduce: ...``).
        """
        if not self._done:
            self._block(timeout)
        if self._error is not None:
            raise self._error
        return True

    def _block(self, timeout: datetime.timedelta | float | None) -> None:
        """:meth:`wait` while the operation is pending: the calls queued before it first, timed.

        The one piece a kind of Work changes (the engine's, a device job's, a lane message's).
        """
        if watchdog._Threads.pending and timeout is not None:
            watchdog._drain(timeout, self._name())  # calls queued before it run first, within timeout
        with watchdog.timing(watchdog.WAIT, None, timeout):
            self._wait(timeout)

    def _wait(self, timeout: datetime.timedelta | float | None = None) -> None:
        """:meth:`wait`'s work, without the watchdog's token (for a call that has its own, with its group)."""
        if timeout is not None and not self._done:
            self._wait_until(timeout)
        if not self._done:
            try:
                if self._status is not None:
                    self._requests[0].Wait(self._status)
                else:
                    waitall(self._requests)  # an exchange's errors name the failing message
            except _mpi.MPI.Exception as exc:
                self._fail(exc)
            except CommunicationError as exc:  # a short receive (mpicomm.core.statuses)
                self._error, self._done = exc, True
            self._complete()

    def _wait_until(self, timeout: datetime.timedelta | float) -> None:
        seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        deadline = time.monotonic() + seconds
        while not self.is_completed():
            if time.monotonic() > deadline:
                raise CommunicationError(
                    f"{self._name()}: Work.wait: the operation did not complete within {seconds:g} s; "
                    "expected every rank of its group to take part (Timed out; it stays posted, so its "
                    "arrays stay in use and a later wait() can still complete it)"
                )
            time.sleep(0.0005)

    def is_completed(self) -> bool:
        """Whether the operation has finished (never blocks)."""
        if not self._done:
            threads = watchdog._Threads
            if threads.pending and threads.owner is not None and watchdog._get_ident() != threads.engine:
                return False  # the engine may be inside MPI (serialized): known once its queue empties
            try:
                if self._status is not None:
                    ready = self._requests[0].Test(self._status)
                else:
                    ready = all_done(self._requests)
            except _mpi.MPI.Exception as exc:
                self._fail(exc)
                ready = True
            except CommunicationError as exc:
                self._error, self._done = exc, True
                ready = True
            if not ready:
                return False
            self._complete()
        return True

    def is_success(self) -> bool:
        """Whether the operation finished without error (torch's deprecated spelling, kept)."""
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        """The error the operation ended with, or None (also None while it is still running)."""
        return self._error

    def result(self) -> list[Any]:
        """Wait, then return the output arrays of the operation (an empty list for send and barrier)."""
        self.wait()
        return self._result

    def get_future(self) -> Future:
        """A :class:`~mpicomm.core.future.Future` of the output arrays (torch's ``get_future``).

        Example:
            >>> import numpy as np, mpicomm
            >>> fut = mpicomm.all_reduce(np.ones(1), async_op=True).get_future()
            >>> float(fut.wait()[0][0]) == mpicomm.get_world_size()
            True
        """
        from .future import Future  # loaded with the first future: a blocking program needs none (issue 44)

        return Future(self)

    def source_rank(self) -> int:
        """The world rank a completed ``irecv`` received from (useful with any-source receives)."""
        self.wait()
        return self._source

    #: torch's private spelling, which its own tests call.
    _source_rank = source_rank

    def _name(self) -> str:
        return self._fn or "Work.wait"

    def _fail(self, exc: BaseException) -> None:
        self._error = CommunicationError(f"{self._name()}: MPI reported an error: {mpi_text(exc)}")
        self._error.__cause__ = exc
        self._done = True

    def _complete(self) -> None:
        if self._done and self._error is not None:
            return
        self._done = True
        if self._status is not None and self._ranks is not None:
            self._source = self._ranks[self._status.Get_source()]
        if self._finish is not None:
            finish, self._finish = self._finish, None
            try:
                finish()
            except Exception as exc:
                self._error = exc
        self._keep = None

    def __repr__(self) -> str:
        state = "completed" if self._done else "pending"
        return f"<mpicomm.Work {state}>"


def mpi_text(exc: BaseException) -> str:
    """What went wrong: the failing message of an exchange (:mod:`mpicomm.core.statuses`), else MPI's text."""
    told = describe(exc)
    if told is not None:
        return told
    text = getattr(exc, "Get_error_string", None)
    try:
        return str(text()) if text is not None else str(exc)
    except Exception:
        return str(exc)


def wait_all(
    works: list[Work | None] | tuple[Work | None, ...], timeout: datetime.timedelta | float | None = None
) -> bool:
    """Wait until every operation of ``works`` has completed (MPI's ``MPI_Waitall``), then return True.

    The halo codes' idiom: post every ``irecv`` and ``isend`` of a step, then wait for all of them at
    once. ``None`` entries (a call on a rank outside its group returns None) are skipped. Every
    operation is completed before any error is raised, as MPI's Waitall does: the first failed
    operation's error (in the order of ``works``) is raised once all have finished.

    Args:
        works: The handles, as ``async_op=True`` calls, ``isend``/``irecv`` and ``batch_isend_irecv``
            return them.
        timeout: A ``timedelta`` or seconds: raise if they have not all completed by then (they stay
            posted, and a later wait can complete them).

    Returns:
        True.

    Raises:
        ArgumentTypeError: ``works`` is not a list or tuple, or an entry is neither a Work nor None
            (checked before any wait).
        CommunicationError: an operation failed (its own error), or ``timeout`` passed.

    Example:
        >>> import numpy as np, mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> got = np.zeros(1)
        >>> works = [mpicomm.all_reduce(np.ones(1), async_op=True), None]
        >>> if w > 1:
        ...     works += [mpicomm.irecv(got, src=(r - 1) % w), mpicomm.isend(np.ones(1), dst=(r + 1) % w)]
        >>> mpicomm.wait_all(works)
        True
    """
    if not isinstance(works, (list, tuple)):
        raise ArgumentTypeError(f"wait_all: works is a {type(works).__qualname__}; expected a list of Works")
    for i, work in enumerate(works):
        if work is not None and not isinstance(work, Work):
            raise ArgumentTypeError(
                f"wait_all: works[{i}] is a {type(work).__module__}.{type(work).__qualname__}; expected an "
                "mpicomm Work (from an async_op=True call, isend or irecv) or None"
            )
    pending = [w for w in works if w is not None and not w._done]
    if pending:
        if watchdog._Threads.pending and timeout is not None:
            watchdog._drain(timeout, "wait_all")
        with watchdog.timing(watchdog.WAIT, None, timeout):
            if timeout is not None:
                _all_within(pending, timeout)
            else:
                _wait_together(pending)
    for work in works:
        if work is not None and work._error is not None:
            raise work._error
    return True


def _wait_together(pending: list[Work]) -> None:
    """One ``MPI_Waitall`` over the plain Works' requests; Works with their own completion wait alone."""
    MPI = _mpi.MPI
    plain = [w for w in pending if type(w) is Work and type(w._requests) is list]
    requests = [rq for w in plain for rq in w._requests]
    statuses = [MPI.Status() for _ in requests]
    failure: Any = None
    try:
        MPI.Request.Waitall(requests, statuses)
    except MPI.Exception as exc:
        failure = exc
    at = 0
    for work in plain:
        mine = statuses[at : at + len(work._requests)]
        at += len(work._requests)
        if failure is not None:
            if failure.Get_error_class() != MPI.ERR_IN_STATUS:
                work._fail(failure)  # the call as a whole failed: no status says which request
                continue
            errors = [st.Get_error() for st in mine]
            bad = next((e for e in errors if e not in (MPI.SUCCESS, MPI.ERR_PENDING)), None)
            if bad is not None:
                work._fail(MPI.Exception(bad))
                continue
            if MPI.ERR_PENDING in errors:
                work._wait()  # not completed by the failed Waitall: on its own
                continue
        if work._status is not None:
            work._status = mine[0]  # the receive's status, as Work.wait would have filled it
        work._complete()
    for work in pending:
        if not work._done:
            work._wait()  # a Work of its own kind (staged, an exchange that checks its messages)


def _all_within(pending: list[Work], timeout: datetime.timedelta | float) -> None:
    seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
    deadline = time.monotonic() + seconds
    while True:
        left = [w for w in pending if not w.is_completed()]
        if not left:
            return
        if time.monotonic() > deadline:
            raise CommunicationError(
                f"wait_all: {len(left)} of {len(pending)} operations did not complete within {seconds:g} s "
                f"(the first: {left[0]._name()}); expected every rank of their groups to take part (Timed "
                "out; they stay posted, so their arrays stay in use and a later wait can complete them)"
            )
        time.sleep(0.0005)


class _Completed(Work):
    """A Work complete when made: every field but ``_result`` a class default (nothing to set or free).

    A subclass's class attributes shadow ``Work``'s slots for reads (writing one raises
    AttributeError); a complete Work's fields never change after it is made: ``Work``'s methods
    write only while not ``_done``, but for :meth:`_complete`, a no-op here, and the front door
    sets ``_result``, a slot still.
    """

    __slots__ = ()
    __qualname__ = "Work"  # messages that name an argument's type say Work, as for any other Work
    __init__ = object.__init__  # _Completed() is made in C: no Python frame
    _fn = ""
    _requests: list[Any] = []  # noqa: RUF012 - read only: the Work is complete
    _keep = None
    _finish = None
    _status = None
    _source = -1
    _ranks = None
    _done = True
    _error = None

    def _complete(self) -> None:
        """Nothing to complete (``Work._complete`` of a done Work without error only rewrites its fields)."""


_Completed.__name__ = "Work"


def completed(result: list[Any] | None = None) -> Work:
    """A Work that is already complete (a blocking call's answer to ``async_op=True``).

    Made without ``Work.__init__`` and its ten fields (that cost as much as an 8-byte all_reduce's
    own checks): ``async_op=True`` should cost little more than False.

    Example:
        >>> work = completed([])
        >>> work.is_completed(), work.wait(), work.result(), work.exception()
        (True, True, [], None)
    """
    work: Work = _Completed()
    work._result = result if result is not None else []
    return work
