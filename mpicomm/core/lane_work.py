"""Point-to-point calls handed to the in-MPI lane (:mod:`mpicomm.core.lane`), and their Work.

While the engine has calls queued below ``MPI_THREAD_MULTIPLE``, ``serve`` puts a ``send``,
``recv``, ``isend``, ``irecv`` or ``sendrecv`` (its messages made by
``mpicomm.front.lane_message``, no MPI call) in a slot of the lane's ring; the thread inside MPI
posts it and tests it. A blocking call waits for its slot here, with the GIL released; ``isend``
and ``irecv`` return a ``LaneWork`` at once, complete when the data has moved.

Order: slots are posted in the order they were filled, and the engine posts every filled slot
(``flush``) before it takes its next call and before its queue count reaches 0, under the
queue's lock, the same lock ``serve`` fills a slot under while it sees calls queued. So a slot
is posted before any later call of the program enters MPI (MPI's non-overtaking order holds), and
once nothing is queued only slots in flight remain, which the program's own thread may test.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from .. import _mpi
from ..errors import CommunicationError
from . import lane, watchdog
from .engine_work import _refuse
from .work import Work

__all__ = ["FULL", "IDLE", "LaneWork", "Message", "flush", "serve"]

_T = watchdog._Threads

#: :func:`serve`'s answers when it did not take the call: nothing queued any more (run the host
#: here), or the ring full (queue the call behind the engine's, as without the lane).
IDLE, FULL = object(), object()


class Message:
    """One call's messages as the lane posts them, and what to do once they moved.

    Args:
        ops: One or two ``(send, array, datatype handle, peer, tag)``; each array C-contiguous
            (a strided buffer's packed copy), kept alive until the slot is taken.
        comm: The group's communicator handle (an int: MPICH's ABI).
        ranks: The group's world ranks (a receive's source in world ranks).
        after: Run once a receive completed (a packed buffer copied back into the caller's view).
        result: The Work's result (``irecv``: the caller's array).
        null_source: The receive is from ``MPI_PROC_NULL`` (nothing comes: the source is -1).

    Example:
        >>> import numpy as np
        >>> m = Message(((True, np.ones(2), 0, 1, 0),), 0, [0, 1])
        >>> m.outcome is None
        True
    """

    __slots__ = ("after", "comm", "null_source", "ops", "outcome", "ranks", "result")

    def __init__(
        self,
        ops: tuple[tuple[bool, np.ndarray, int, int, int], ...],
        comm: int,
        ranks: list[int],
        after: Callable[[], Any] | None = None,
        result: list[Any] | None = None,
        null_source: bool = False,
    ) -> None:
        self.ops, self.comm, self.ranks, self.after = ops, comm, ranks, after
        self.result = result if result is not None else []
        self.null_source = null_source
        #: ``(state, MPI error, source, tag)`` once the slot is taken.
        self.outcome: tuple[int, int, int, int] | None = None


class _Ring:
    held: dict[int, Message] = {}  # noqa: RUF012 - slot -> its message: the arrays stay alive until taken
    lock = threading.Lock()  # filling and taking slots (Work methods may be called from any thread)


def serve(fn: str, msg: Message, posts: bool, cond: Any) -> Any:
    """Hand ``msg`` to the lane; ``IDLE`` or ``FULL`` if not taken (the caller runs or queues it).

    ``isend``/``irecv`` (``posts``) get a :class:`LaneWork`; a blocking call its result once done.

    ``cond`` is the engine's queue lock: the slot is filled only while calls are queued, and the
    engine flushes the lane under it before its count drops (see the module's docstring).
    """
    c = lane.started()
    specs = tuple((send, a.ctypes.data, a.size, dt, peer, tag) for send, a, dt, peer, tag in msg.ops)
    with cond:
        if not _T.pending:
            return IDLE
        with _Ring.lock:
            _collect(c)
            slot = c.post(msg.comm, *specs)
            if slot < 0:
                return FULL
            _Ring.held[slot] = msg
    work = LaneWork(fn, slot, msg)
    if posts:
        return work
    work._wait(None)
    if work._error is not None:
        raise work._error
    return None if fn == "send" else work._source


def flush() -> None:
    """On the engine's thread, under the queue's lock, before it takes its next call: post what is filled."""
    if _Ring.held:
        c = lane.started()
        if c is not None:
            c.progress()


def _collect(c: Any) -> None:
    """Take every finished slot (under ``_Ring.lock``): its outcome to its message, the slot free again."""
    for slot in list(_Ring.held):
        out = c.take(slot)
        if out is not None:
            _Ring.held.pop(slot).outcome = out


class LaneWork(Work):
    """The Work of an ``isend``/``irecv`` the lane posted: complete once its message has moved.

    ``wait(timeout)`` raises a :class:`~mpicomm.CommunicationError` after about ``timeout`` seconds
    (the message stays posted: a later wait can complete it), as a posted ``isend``'s Work does.
    """

    __slots__ = ("_msg", "_slot")
    __qualname__ = "Work"

    def __init__(self, fn: str, slot: int, msg: Message) -> None:
        super().__init__([], keep=msg, result=msg.result, fn=fn)
        self._slot, self._msg = slot, msg

    def _block(self, timeout: datetime.timedelta | float | None) -> None:
        """:meth:`wait` until the message has moved.

        Timed by the watchdog, but not after the queued calls (watchdog.timing would wait for them).
        """
        with watchdog._Timing((watchdog._count(), watchdog.WAIT, None, timeout)):
            self._wait(timeout)

    def _wait(self, timeout: datetime.timedelta | float | None = None) -> None:
        seconds = None
        if timeout is not None:
            seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else float(timeout)
        deadline = None if seconds is None else time.monotonic() + seconds
        c = lane.started()
        while not self.is_completed():
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                raise CommunicationError(
                    f"{self._name()}: Work.wait: the operation did not complete within {seconds:g} s; "
                    "expected its peer to take part (Timed out; it stays posted, so its arrays stay "
                    "in use and a later wait() can still complete it)"
                )
            if _T.pending and _get_ident() != _T.engine:
                _refuse(self._name())  # a failed engine never enters MPI again: nothing would serve it
                c.wait(self._slot, min(left, 0.005))  # the thread inside MPI serves it
            else:  # nothing else inside MPI (nothing can enter it), or the engine's own thread: here
                with _Ring.lock:
                    c.complete(self._slot, left)

    def is_completed(self) -> bool:
        """Whether the message has moved (never blocks)."""
        if self._done:
            return True
        msg = self._msg
        if msg.outcome is None:
            c = lane.started()
            with _Ring.lock:
                if msg.outcome is None and (not _T.pending or _get_ident() == _T.engine):
                    c.progress()  # nothing else inside MPI (or this is the engine's thread): test it here
                _collect(c)
            if msg.outcome is None:
                return False
        self._land(msg.outcome)
        return True

    def _land(self, outcome: tuple[int, int, int, int]) -> None:
        state, error, source, _ = outcome
        msg = self._msg
        self._done = True
        if state == lane.FAILED:
            self._fail(_mpi.MPI.Exception(error))  # MPI's own text (MPI_Error_string may be called anywhere)
        elif not msg.null_source and 0 <= source < len(msg.ranks):
            self._source = msg.ranks[source]
            if msg.after is not None:
                try:
                    msg.after()
                except Exception as exc:
                    self._error = exc
        self._keep = None

    def __repr__(self) -> str:
        return f"<mpicomm.Work {self._fn} {'completed' if self._done else 'pending'} (in-MPI lane)>"


LaneWork.__name__ = "Work"
_get_ident = threading.get_ident
