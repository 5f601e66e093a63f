"""Lazy access to ``mpi4py.MPI``, so that ``import mpicomm`` neither loads libmpi nor starts MPI.

MPI's thread level is chosen here, when mpicomm is the one that starts MPI: ``MPICOMM_THREAD_LEVEL``
(``single``, ``funneled``, ``serialized``, ``multiple``) if set; else what the user asked mpi4py
for (``MPI4PY_RC_THREAD_LEVEL``, or ``mpi4py.rc.thread_level`` / ``mpi4py.rc.threads`` set in the
program); else :data:`DEFAULT_LEVEL`, the lowest level mpicomm's own features need. MPI started
before mpicomm (``from mpi4py import MPI`` first, ``python -m mpi4py``) keeps the level it has.
Under MPICH, ``MPI_THREAD_MULTIPLE`` (mpi4py's default) costs about 1 us on every small collective.

Modules that talk to MPI read ``_mpi.MPI`` at call time. It is ``None`` until :func:`load` runs, which
:func:`mpicomm.init` does before any group exists, so every code path that holds a group may use it.
When no MPI library can be loaded, :func:`load` raises one short
:class:`~mpicomm.errors.MPIUnavailableError` that says what was tried and what to do, instead of
mpi4py's traceback; the planner and ``import mpicomm`` keep working without MPI.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from .errors import ArgumentError, MPIUnavailableError

if TYPE_CHECKING:
    from mpi4py import MPI
else:
    MPI = None

__all__ = [
    "DEFAULT_LEVEL",
    "LEVELS",
    "MPI",
    "THREAD_ENV",
    "diagnose",
    "library_version",
    "load",
    "need",
    "thread_level",
]

#: The setting that picks MPI's thread level when mpicomm starts MPI.
THREAD_ENV = "MPICOMM_THREAD_LEVEL"
#: MPI's thread levels, lowest first, as mpi4py names them.
LEVELS = ("single", "funneled", "serialized", "multiple")
#: What mpicomm asks for by default: one thread in MPI at a time. mpicomm's own threads (the
#: watchdog) never enter MPI at this level, and a call from a second thread is refused before any
#: MPI call (:mod:`mpicomm.core.watchdog`); a program that communicates from several threads at
#: once sets ``MPICOMM_THREAD_LEVEL=multiple``.
DEFAULT_LEVEL = "serialized"


class _Start:
    """Who chose the thread level MPI was asked for (for ``python -m mpicomm info`` and the bench)."""

    chosen_by = "MPI not started by mpicomm yet"
    asked: str | None = None
    #: A feature in use that needs more than :data:`DEFAULT_LEVEL`: ``(level, why)`` (:func:`need`).
    needs: tuple[str, str] | None = None


_REMEDIES = """\
To fix it, one of:
  pip install "mpicomm[mpich]"              the MPICH wheel from PyPI: no system MPI needed
  module load <your MPI>                    on a cluster, so that libmpi.so is on LD_LIBRARY_PATH
  export MPI4PY_LIBMPI=/path/to/libmpi.so   point mpi4py at a library it did not find
`python -m mpicomm info` prints this diagnosis."""


def load() -> None:
    """Import ``mpi4py.MPI`` (which initialises MPI unless the user set ``mpi4py.rc``) into ``MPI``.

    Raises:
        MPIUnavailableError: mpi4py is not installed or finds no loadable MPI library.
    """
    global MPI
    if MPI is None:
        try:
            if "mpi4py.MPI" not in sys.modules:
                _choose_level()
            else:
                _Start.chosen_by = "inherited: mpi4py.MPI was imported before mpicomm"
            from mpi4py import MPI as module
        except (ImportError, RuntimeError, OSError) as exc:
            raise MPIUnavailableError(_explain(exc)) from None
        MPI = module


def _requested() -> tuple[str | None, str]:
    """The level mpicomm asks for (None: leave it to mpi4py's settings) and who chose it.

    Raises:
        ArgumentError: ``MPICOMM_THREAD_LEVEL`` names no thread level.
    """
    text = os.environ.get(THREAD_ENV, "").strip().lower()
    if text:
        if text not in LEVELS:
            raise ArgumentError(
                f"init: {THREAD_ENV} is {os.environ[THREAD_ENV]!r}; expected one of {', '.join(LEVELS)}"
            )
        return text, THREAD_ENV
    if (
        os.environ.get("MPI4PY_RC_THREAD_LEVEL", "").strip()
        or os.environ.get("MPI4PY_RC_THREADS", "").strip()
    ):
        return None, "the user: MPI4PY_RC_THREAD_LEVEL / MPI4PY_RC_THREADS"
    import mpi4py

    if "thread_level" in vars(mpi4py.rc) or "threads" in vars(mpi4py.rc):  # set on the instance: by the user
        return None, "the user: mpi4py.rc"
    if _Start.needs is not None:
        level, why = _Start.needs
        return level, f"mpicomm: {why}"
    return DEFAULT_LEVEL, "mpicomm (its default)"


def need(level: str, why: str) -> None:
    """Say that a feature in use needs MPI at ``level`` at least, before MPI starts.

    mpicomm's own choice (never the user's, never a started MPI's) becomes the highest level that
    the features in use need: the torch backend needs ``multiple``, because torch calls a process
    group from its own threads (autograd's device threads run DDP's hooks).

    Args:
        level: One of :data:`LEVELS`.
        why: The feature, for ``python -m mpicomm info``.

    Example:
        >>> from mpicomm import _mpi
        >>> _mpi.need("single", "nothing more than the default") is None
        True
    """
    if level not in LEVELS:
        raise ArgumentError(f"need: level is {level!r}; expected one of {', '.join(LEVELS)}")
    known = _Start.needs[0] if _Start.needs is not None else DEFAULT_LEVEL
    if LEVELS.index(level) > LEVELS.index(known):
        _Start.needs = (level, why)


def _choose_level() -> None:
    """Set ``mpi4py.rc.thread_level`` to mpicomm's choice before ``mpi4py.MPI`` starts MPI."""
    level, _Start.chosen_by = _requested()
    if level is not None:
        import mpi4py

        mpi4py.rc.threads = True
        mpi4py.rc.thread_level = level
        _Start.asked = level


def required() -> int:
    """The ``MPI_THREAD_*`` constant to pass to ``MPI_Init_thread`` when mpicomm starts MPI itself.

    Where the user made mpi4py not start MPI (``mpi4py.rc.initialize = False``), :func:`mpicomm.init`
    calls ``MPI_Init_thread`` with this.
    """
    level = _Start.asked or _rc_level()
    return int(getattr(MPI, f"THREAD_{level.upper()}"))


def _rc_level() -> str:
    import mpi4py

    return str(mpi4py.rc.thread_level) if mpi4py.rc.threads else "single"


def thread_level() -> str:
    """The thread level MPI runs at, and who chose it (MPI started), e.g. ``serialized (chosen by ...)``.

    Example:
        >>> import mpicomm
        >>> _ = mpicomm.init()
        >>> thread_level().split()[0] in LEVELS
        True
    """
    load()
    granted = MPI.Query_thread()
    names = {int(getattr(MPI, f"THREAD_{n.upper()}")): n for n in LEVELS}
    return f"{names.get(granted, str(granted))} (chosen by {_Start.chosen_by})"


def _explain(exc: BaseException) -> str:
    """The short message for a failed ``from mpi4py import MPI``: what was tried, what to do."""
    if isinstance(exc, ImportError) and (exc.name or "").split(".")[0] == "mpi4py" and "MPI" not in str(exc):
        return f"mpicomm: mpi4py is not installed ({exc}).\n{_REMEDIES}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    tried = [line.split(":", 1)[0] for line in lines[1:] if ":" in line]
    reason = lines[1].split(":", 1)[1].strip() if len(lines) > 1 and ":" in lines[1] else (lines or [""])[0]
    shown = ", ".join(tried[:6]) + (f" and {len(tried) - 6} more" if len(tried) > 6 else "")
    env = os.environ.get("MPI4PY_LIBMPI")
    where = f" (MPI4PY_LIBMPI={env})" if env else ""
    what = f"mpi4py tried {shown}{where}: {reason}" if tried else f"mpi4py said: {reason or exc!r}"
    return f"mpicomm: no MPI library could be loaded; {what}.\n{_REMEDIES}"


def diagnose() -> str | None:
    """Try to load MPI; return the message that says why it cannot be, or None when it loads.

    Example:
        >>> diagnose() is None  # the test environment has the MPICH wheel
        True
    """
    try:
        load()
    except MPIUnavailableError as exc:
        return str(exc)
    return None


def library_version() -> str:
    """The first line of ``MPI_Get_library_version``, e.g. ``"MPICH Version: 5.0.2"``."""
    load()
    return str(MPI.Get_library_version()).strip().splitlines()[0]
