"""The staged path: device arrays through pinned host buffers, stream-ordered, around the host code.

A staged call borrows one pinned buffer per device array from the process's pool, copies the inputs
down on mpicomm's own device-to-host stream once the caller's current stream has reached the call,
runs the numpy implementation on the host buffers (so results, errors and validation are exactly the
host path's), and copies the outputs up on the host-to-device stream. The call returns (or its
``Work`` completes) only after the upload has finished, so the results are visible to every stream.
No device-wide synchronize is used: only events and the two copy streams.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.work import Work
from .backend import backend
from .staging import HostBufferPool

__all__ = ["Staging", "StagedWork", "pool", "reset_pool"]


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
        self.be = backend()
        self.pool = pool()
        self.d2h, self.h2d = self.be.copy_streams()
        self._inputs: list[tuple[Any, np.ndarray]] = []
        self._outputs: list[tuple[Any, np.ndarray]] = []
        self._lent: list[np.ndarray] = []

    def host(self, dev: Any, read: bool, write: bool) -> np.ndarray:
        """A pinned host array shaped like ``dev``; ``read``: filled from it, ``write``: copied back."""
        raw = self.pool.acquire(int(dev.nbytes))
        self._lent.append(raw)
        out: np.ndarray = raw.view(dev.dtype).reshape(dev.shape)
        if read:
            self._inputs.append((self.be.contiguous(dev), out))
        if write:
            self._outputs.append((dev, out))
        return out

    def download(self) -> None:
        """Copy the inputs down once the caller's stream has reached this call; wait for the copies."""
        if self._inputs:
            self.d2h.wait_event(self.be.current_stream().record())
            for dev, out in self._inputs:
                self.be.to_host(out, dev, self.d2h)
            self.d2h.synchronize()
        self._inputs = []

    def upload(self) -> None:
        """Copy the outputs up (after the caller's earlier work on them), wait, and give the buffers back."""
        try:
            if self._outputs:
                self.h2d.wait_event(self.be.current_stream().record())
                for dev, src in self._outputs:
                    self.be.to_device(dev, src, self.h2d)
                self.h2d.synchronize()
        finally:
            self._outputs = []
            self.release()

    def release(self) -> None:
        """Give every borrowed buffer back to the pool."""
        lent, self._lent = self._lent, []
        for raw in lent:
            self.pool.release(raw)


class StagedWork(Work):
    """The ``Work`` of a staged ``async_op=True`` call: the host operation, then the upload.

    The host ``Work`` runs MPI's non-blocking operation on pinned buffers; when it completes (in
    :meth:`wait`, or in an :meth:`is_completed` that finds it done), the outputs are copied up and the
    buffers go back to the pool.
    """

    __slots__ = ("_after", "_inner", "_shown")

    def __init__(self, inner: Work, after: Callable[[], None], shown: list[Any]) -> None:
        super().__init__([])
        self._inner, self._shown = inner, shown
        self._after: Callable[[], None] | None = after

    def wait(self, timeout: datetime.timedelta | float | None = None) -> bool:
        """Block until the data is in the device arrays and return True (``timeout`` as Work's)."""
        if timeout is not None and not self._inner.is_completed():
            self._inner.wait(timeout)  # a timeout raises while the operation is pending: nothing uploaded
        try:
            self._inner.wait()
        finally:
            self._run_after()
        return True

    def is_completed(self) -> bool:
        """Whether the operation and its upload are done (uploads once the operation is)."""
        if not self._inner.is_completed():
            return False
        self._run_after()
        return True

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

    def _run_after(self) -> None:
        after, self._after = self._after, None
        if after is not None:
            after()
