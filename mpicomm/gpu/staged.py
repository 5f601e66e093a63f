"""The staged path: device arrays through pinned host buffers, stream-ordered, around the host code.

A staged call borrows one pinned buffer per device array from the process's pool (an array that lies
inside another argument's memory gets a view of that one's buffer, so the host code sees the same
aliasing as the device), copies the inputs down on the caller's current stream, after the work
queued there before the call, and synchronises that stream, runs the numpy implementation on the
host buffers (so results, errors and validation are exactly the host path's), and copies the
outputs up on mpicomm's host-to-device stream. The upload waits for the caller's stream *as it was
at the call* (done by then where the call read something; else an event recorded then), never for
work queued after it. The call returns (or its ``Work`` completes) only after the upload has
finished, so the results are visible to every stream. No device-wide synchronize is used.

A small call makes the fewest CUDA calls its copies allow: ``all_reduce`` of one array makes four
(copy down, synchronise the caller's stream, copy up, synchronise the upload stream), a broadcast
root two, a receiver four (a pooled event recorded on the caller's stream, the upload stream's wait
for it, the copy, the synchronisation).

Buffers go back to the pool only when no copy into or out of them can still run: after an error,
the copy streams are synchronised first. A dropped ``Work`` of an asynchronous call keeps its
buffers until its operation completes (:func:`reap`, run at every staged call), then uploads and
returns them.
"""

from __future__ import annotations

import collections
import datetime
from typing import Any, ClassVar

import numpy as np

from ..core import watchdog
from ..core.work import Work
from .backend import backend
from .staging import HostBufferPool, forget_address, keep_address

__all__ = ["Staging", "StagedWork", "orphans", "pool", "reap", "reset_pool"]


class _Pool:
    value: HostBufferPool | None = None


def pool() -> HostBufferPool:
    """The process's pool of pinned host buffers (allocated through the backend, on first use)."""
    if _Pool.value is None:
        _Pool.value = HostBufferPool(lambda nbytes: backend().pinned(nbytes))
    return _Pool.value


def reset_pool() -> None:
    """Drop the pool (its buffers are freed once nothing uses them); for tests and backend changes."""
    _Pool.value = None


class Staging:
    """The host buffers and copies of one staged call.

    Use :meth:`host` for every device argument, then :meth:`download` before the host call and
    :meth:`upload` after it (or :meth:`release` if the host call failed).
    """

    def __init__(self) -> None:
        if _Orphans.works:
            reap()
        self.be = backend()
        self.pool = _Pool.value or pool()
        self.d2h, self.h2d = self.be.copy_streams()
        self._inputs: list[tuple[Any, np.ndarray]] = []
        self._outputs: list[tuple[Any, np.ndarray]] = []
        self._lent: list[np.ndarray] = []
        self._kept: list[np.ndarray] = []  # host views whose addresses are kept (staging.keep_address)
        self._queued = False  # copies were queued that may not have run yet
        self._down: Any = None  # the stream the downloads are queued on (the caller's), while they run
        self._at_call: Any = None  # a call that reads nothing: the backend's event on the caller's stream
        self._reached = False  # the caller's stream has run the work queued before the call

    def host(self, dev: Any, read: bool, write: bool, inside: np.ndarray | None = None) -> np.ndarray:
        """A pinned host array shaped like ``dev``; ``read``: filled from it, ``write``: copied back.

        ``inside``: a host byte view (of another argument's buffer) to use instead of a new buffer,
        where ``dev`` lies inside that argument's memory.
        """
        if inside is None:
            raw = self.pool.acquire(int(dev.nbytes))
            self._lent.append(raw)
            address = self.pool.address(raw)
        else:
            raw, address = inside, None
        out: np.ndarray = np.ndarray(
            dev.shape, dev.dtype, raw
        )  # half the cost of raw.view(dtype).reshape(shape)
        if address is not None:
            keep_address(out, address)
            self._kept.append(out)
        if read:
            self._inputs.append((self.be.contiguous(dev), out))
        if write:
            self._outputs.append((dev, out))
        return out

    def download(self) -> None:
        """Copy the inputs down after the caller's work queued before the call, and wait for them.

        The copies go on the caller's current stream, which is then synchronised: two CUDA calls for
        a small input, where an event on it, a copy stream waiting for that event and the copy
        stream's synchronisation made four (and the upload then needs no wait). A call that reads
        nothing marks the caller's stream with an event instead, for the upload to wait for.
        """
        be = self.be
        inputs, self._inputs = self._inputs, []
        stream = be.current_stream()
        if inputs:
            self._down, self._queued = stream, True
            for dev, out in inputs:
                be.to_host(out, dev, stream)
            stream.synchronize()
            self._down, self._queued = None, False
            self._reached = True
        elif self._outputs:
            self._at_call = be.mark(stream)

    def _wait_for_the_call(self) -> None:
        """Have the upload stream wait for the caller's stream as it was at the call (unless it ran)."""
        if not self._reached:
            at = self._at_call
            self.h2d.wait_event(at if at is not None else self.be.current_stream().record())

    def start_upload(self) -> Any:
        """Queue the outputs' copies up (after the caller's work before the call); the event of their end."""
        outputs, self._outputs = self._outputs, []
        if not outputs:
            return None
        self._wait_for_the_call()
        self._queued = True
        for dev, src in outputs:
            self.be.to_device(dev, src, self.h2d)
        return self.h2d.record()

    def upload(self) -> None:
        """Copy the outputs up, wait, and give the buffers back (no event: the stream is waited for)."""
        outputs, self._outputs = self._outputs, []
        try:
            if outputs:
                h2d, to_device = self.h2d, self.be.to_device
                self._wait_for_the_call()
                self._queued = True
                for dev, src in outputs:
                    to_device(dev, src, h2d)
                h2d.synchronize()
                self._queued = False
        finally:
            self.release()

    def release(self) -> None:
        """Give every borrowed buffer back to the pool, once no copy queued for this call can still run."""
        self._outputs = []
        lent, self._lent = self._lent, []
        kept, self._kept = self._kept, []
        try:
            if self._queued:
                if self._down is not None:
                    self._down.synchronize()
                self.d2h.synchronize()
                self.h2d.synchronize()
                self._queued = False
        finally:
            at, self._at_call = self._at_call, None
            if at is not None:
                self.be.unmark(at)
            for out in kept:
                forget_address(out)
            for raw in lent:
                self.pool.release(raw)


class _Orphans:
    # A deque and no lock: StagedWork.__del__ appends, and a finaliser can run in the middle of
    # reap() on the same thread (garbage collection at any allocation there), where waiting for a
    # lock that reap() holds would hang the rank for good. deque's append and popleft are atomic.
    works: ClassVar[collections.deque[tuple[Work, Staging]]] = collections.deque()


def orphans() -> int:
    """How many dropped asynchronous staged operations still hold buffers."""
    return len(_Orphans.works)


def reap() -> None:
    """Finish the dropped asynchronous staged operations that have completed: upload, give buffers back."""
    works = _Orphans.works
    for _ in range(len(works)):  # each orphan present now, once; those added meanwhile wait
        try:
            inner, stage = works.popleft()
        except IndexError:  # another thread reaped it
            return
        if not inner.is_completed():
            works.append((inner, stage))
        elif inner.exception() is None:
            stage.upload()
        else:
            stage.release()


class StagedWork(Work):
    """The ``Work`` of a staged ``async_op=True`` call: the host operation, then the upload.

    The host ``Work`` runs MPI's non-blocking operation on pinned buffers. When it completes, the
    outputs' upload is queued (in :meth:`is_completed`, which never waits for it, or in
    :meth:`wait`, which does); then the buffers go back to the pool. A failed operation uploads
    nothing. A handle dropped before completion hands its buffers to :func:`reap`.
    """

    __slots__ = ("_inner", "_shown", "_stage", "_uploaded")

    def __init__(self, inner: Work, stage: Staging, shown: list[Any]) -> None:
        super().__init__([])
        self._inner, self._shown = inner, shown
        self._stage: Staging | None = stage
        self._uploaded: Any = None

    def wait(self, timeout: datetime.timedelta | float | None = None) -> bool:
        """Block until the data is in the device arrays and return True (``timeout`` as Work's)."""
        with watchdog.timing(watchdog.WAIT, None, timeout):  # the uploads are timed too, not only MPI's wait
            return self._wait_and_upload(timeout)

    def _wait_and_upload(self, timeout: datetime.timedelta | float | None) -> bool:
        if timeout is not None and not self._inner.is_completed():
            self._inner.wait(timeout)  # a timeout raises while the operation is pending: nothing uploaded
        try:
            self._inner.wait()
        except BaseException:
            self._give_up()
            raise
        stage, self._stage = self._stage, None
        if stage is not None:
            if self._uploaded is None:
                stage.upload()
            else:
                self._uploaded = None
                stage.h2d.synchronize()
                stage._queued = False
                stage.release()
        return True

    def is_completed(self) -> bool:
        """Whether the operation and its upload are done; queues the upload, never waits for it."""
        if not self._inner.is_completed():
            return False
        if self._inner.exception() is not None:
            self._give_up()
            return True
        if self._stage is None:
            return True
        if self._uploaded is None:
            self._uploaded = self._stage.start_upload() or True
        if self._uploaded is True or self._uploaded.done:
            self.wait()
            return True
        return False

    def is_success(self) -> bool:
        """Whether the operation finished without error."""
        return self.is_completed() and self._inner.exception() is None

    def exception(self) -> BaseException | None:
        """The error the host operation ended with, or None."""
        return self._inner.exception()

    def result(self) -> list[Any]:
        """Wait, then return the device arrays written (an empty list for send and barrier)."""
        self.wait()
        return self._shown

    def source_rank(self) -> int:
        """The world rank a completed ``irecv`` received from."""
        self.wait()
        return self._inner.source_rank()

    def _give_up(self) -> None:
        stage, self._stage = self._stage, None
        if stage is not None:
            stage.release()

    def __del__(self) -> None:
        stage = getattr(self, "_stage", None)
        if stage is not None:
            self._stage = None
            _Orphans.works.append((self._inner, stage))
