"""Failure handling: one rank's uncaught exception ends the whole job, instead of hanging the others.

Once :func:`mpicomm.init` runs on more than one rank, mpicomm wraps ``sys.excepthook`` and
``threading.excepthook``: the failing rank prints its traceback prefixed with its rank (to the
process's own stderr, ``sys.__stderr__``, whatever hooks installed later did to ``sys.stderr``), then calls
``MPI_Abort`` on ``COMM_WORLD`` so that ranks blocked in a collective are killed too. Opt out with
``MPICOMM_ABORT_ON_EXCEPTION=0`` or ``mpicomm.init(abort_on_exception=False)``; ``python -m mpi4py``
gives the same guarantee from outside.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from types import TracebackType
from typing import Any

from .. import _mpi

__all__ = ["install_abort_hook", "wanted"]


class _Hook:
    installed = False
    declined = False
    previous: Any = None
    previous_thread: Any = None


def wanted(abort_on_exception: bool | None = None) -> bool:
    """Whether to install the abort hook: ``abort_on_exception``, else ``MPICOMM_ABORT_ON_EXCEPTION`` (on).

    An explicit False (``init(abort_on_exception=False)``) is remembered: a later
    ``init_process_group`` does not install the hook either.
    """
    if abort_on_exception is None:
        return not _Hook.declined and os.environ.get("MPICOMM_ABORT_ON_EXCEPTION", "1") != "0"
    _Hook.declined = not abort_on_exception
    return abort_on_exception


def install_abort_hook() -> None:
    """Wrap the exception hooks so that an uncaught exception on this rank aborts the MPI job.

    MPI must be initialised (the hook needs this rank's number).
    """
    if _Hook.installed:
        return
    _Hook.installed = True
    _Hook.previous = sys.excepthook
    _Hook.previous_thread = threading.excepthook
    rank = _mpi.MPI.COMM_WORLD.Get_rank()

    def excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        _report_and_abort(rank, kind, value, tb)

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        _report_and_abort(rank, args.exc_type, args.exc_value, args.exc_traceback)

    sys.excepthook = excepthook
    threading.excepthook = thread_hook


def _report_and_abort(
    rank: int, kind: type[BaseException], value: BaseException | None, tb: TracebackType | None
) -> None:
    if issubclass(kind, KeyboardInterrupt) and _Hook.previous is not None:
        _Hook.previous(kind, value, tb)
    lines = traceback.format_exception(kind, value, tb)
    text = "".join(f"[rank {rank}] {line}" for chunk in lines for line in chunk.splitlines(True))
    text += f"[rank {rank}] mpicomm: uncaught exception, aborting the MPI job\n"
    # The process's own stderr, which the launcher forwards: a hook installed after ours may have
    # swapped sys.stderr for a buffer it prints only when we return (torch's init_process_group does,
    # and we never return), so the traceback would be lost and the job end with only "Abort(1)".
    # A sys.stderr the program redirected elsewhere (a log file) gets the text too.
    streams = [sys.__stderr__] if sys.stderr is sys.__stderr__ else [sys.__stderr__, sys.stderr]
    for stream in streams:
        if stream is None:  # no console (pythonw)
            continue
        try:
            stream.write(text)
            stream.flush()
        except Exception:  # a closed or broken stream must not stop the abort
            pass
    # The launcher forwards our stderr asynchronously and may drop what is still in the pipe when
    # the abort tears the job down: give it a moment, so the traceback is never lost.
    time.sleep(0.25)
    _mpi.MPI.COMM_WORLD.Abort(1)
    # MPI_Abort may return when called from a thread other than the main one (MPICH does): never
    # go back to the program, which would run on until the launcher kills it.
    os._exit(1)
