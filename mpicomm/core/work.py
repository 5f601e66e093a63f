"""``Work``: the handle that ``async_op=True`` calls return, over MPI's non-blocking operations."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from typing import Any

from .. import _mpi
from ..errors import CommunicationError
from . import watchdog
from .future import Future
from .statuses import all_done, describe, waitall

__all__ = ["Work", "mpi_text"]


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
            with watchdog.timing(watchdog.WAIT, None, timeout):
                self._wait(timeout)
        if self._error is not None:
            raise self._error
        return True

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


def completed(result: list[Any] | None = None) -> Work:
    """A Work that is already complete (for calls that had nothing to communicate)."""
    work = Work([], result=result)
    work._done = True
    return work
