"""Direct and pipelined device calls with ``async_op=True``: queued on mpicomm's communication thread.

The staged path queues its host part on the engine (:mod:`mpicomm.core.engine`) through the host
call's own gate. The direct and pipelined paths hand device memory (or their own copies of it) to MPI,
so they are queued here as one job each, whose Work (:class:`DeviceWork`) is returned at once:

* **producer side**: on the caller's thread the call is checked (nothing that could call MPI), strided
  inputs are made contiguous on the caller's current stream, and an event is recorded on that stream
  after them (:func:`post`). The engine waits for that event before it hands the device buffer to MPI
  (the direct path), or its copy streams wait for it on the device before the first download (the
  pipeline). Work queued on the caller's stream *after* the call is not waited for.
* **consumer side**: the job ends only once its results are in the device arrays: MPI wrote them (a
  blocking MPI call on device buffers is complete on return), and any copies back (a strided output's,
  the pipeline's uploads) were synchronised on the engine's thread. So after ``wait()`` (or once
  ``is_completed()`` is True) every stream reads the results; torch's NCCL Work instead makes the
  current stream wait on the device, as its kernels run on a stream, where an MPI call is host-driven.

The job makes the same MPI calls as the blocking call (the chunk question included, at its place in
program order), so ranks may differ in ``async_op``. The job runs under the caller's device (the
engine's thread has its own current device).
"""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Callable
from typing import Any

from ..core.engine import EngineWork, submit
from ..core.engine_gate import Spec
from ..core.engine_work import _Q, _refuse
from ..core.groups import ProcessGroup
from ..core.watchdog import _get_ident, _Threads
from ..core.work import Work, completed
from .backend import backend

__all__ = ["DeviceWork", "device_of", "post"]


def _job(run: Callable[[], Any], group: ProcessGroup | None = None) -> Work:
    """The engine's host for a device job: run it, hand back a completed Work (no result of its own)."""
    run()
    return completed([])


_SPECS: dict[str, Spec] = {}


def _spec(fn: str) -> Spec:
    spec = _SPECS.get(fn)
    if spec is None:
        spec = _SPECS[fn] = Spec(fn, _job, p2p=False, posts=False, validated=False, queued=True)
    return spec


def device_of(x: Any) -> Any:
    """``x``'s device as a context manager that makes it current (cupy's), or None (a stand-in's)."""
    device = getattr(x, "device", None)
    return device if hasattr(device, "__enter__") else None


class DeviceWork(Work):
    """The ``Work`` of a direct or pipelined ``async_op=True`` call (torch's Work, see the module).

    ``wait(timeout)`` raises a :class:`~mpicomm.CommunicationError` after about ``timeout`` seconds
    while the job is queued or inside MPI (it stays queued: a later ``wait`` can complete it);
    ``result()`` is the device arrays written.
    """

    __slots__ = ("_inner",)

    def __init__(self, inner: EngineWork, shown: list[Any], fn: str) -> None:
        super().__init__([], result=shown, fn=fn)
        self._inner = inner

    def _block(self, timeout: datetime.timedelta | float | None) -> None:
        """:meth:`wait` until the results are in the device arrays (``timeout`` as Work's)."""
        self._wait(timeout)

    def _wait(self, timeout: datetime.timedelta | float | None = None) -> None:
        self._inner._wait(timeout)  # raises only the timeout; the job's own error is kept on it
        self._settle()

    def is_completed(self) -> bool:
        """Whether the job has run (its results in the device arrays); never blocks."""
        if not self._done and self._inner.is_completed():
            self._settle()
        return self._done

    def exception(self) -> BaseException | None:
        """The error the job ended with, or None (also None while it runs)."""
        return self._inner.exception()

    def then_on_engine(self, callback: Callable[[Work], None]) -> None:
        """Run ``callback(self)`` once the job has run: on the engine's thread, or here if it has.

        The torch backend completes its futures this way (:class:`mpicomm.c10d.work.Running`), so a
        CUDA tensor's asynchronous call is not waited for on the caller's thread.
        """
        self._inner.then_on_engine(lambda _inner: callback(self))

    def _settle(self) -> None:
        if not self._done:
            self._error = self._inner.exception()
            self._done = True
            self._keep = None

    def __repr__(self) -> str:
        return f"<mpicomm.Work {self._fn} {'completed' if self._done else 'pending'} (device, engine)>"


def post(
    fn: str,
    group: ProcessGroup | None,
    move: Callable[[Any], None],
    shown: list[Any],
    device: Any,
    keep: Any = None,
) -> Work:
    """Queue ``move`` on the engine after the caller's current stream as it is now; its Work.

    Where there is no engine (``MPICOMM_ENGINE=0``) or this is the engine's own thread, ``move`` runs
    here and the Work returned is complete.

    Args:
        fn: The public name (errors and the watchdog name it).
        group: The call's group (the watchdog names it).
        move: The job, ``move(producer)``: ``producer`` is the event recorded now on the caller's
            current stream; the job waits for it (on the host, or makes its own streams wait) before
            MPI reads device memory, and returns once its results are in the device arrays.
        shown: The device arrays the call writes (``result()``).
        device: The device the arrays are on (a context manager making it current), or None.
        keep: Anything the job needs kept alive until it has run (temporaries).
    """
    _refuse(fn)  # after a failed engine call nothing more is queued
    producer = backend().current_stream().record()

    def run() -> None:
        with device if device is not None else contextlib.nullcontext():
            move(producer)

    if not _Q.enabled or _get_ident() == _Threads.engine:
        run()  # MPICOMM_ENGINE=0, or a callback on the engine's thread: the call runs here, in its turn
        return completed(list(shown))

    inner = EngineWork(_spec(fn), (run,), {"group": group})
    work = DeviceWork(inner, shown, fn)
    work._keep = keep
    submit(inner)
    return work
