"""Tracing: where the time of a run goes, per rank and per call (``MPICOMM_TRACE=<dir>``).

- ``recorder``: :class:`Recorder`, every traced call of a process as one row of a preallocated table.
- ``wrap``: :func:`traced` (the wrapper of one public call) and :func:`install`, which puts the wrappers
  in place at ``import mpicomm`` where ``MPICOMM_TRACE`` is set (nothing is wrapped otherwise).
- ``clock``: each rank's clock offset to rank 0's, from MPI round trips at the first world
  collective and at exit.
- ``output``: each rank's Chrome-trace JSON at exit and rank 0's merge on one clock.
- ``summary``: the table per call and per call site, with the imbalance across ranks (mpiP's view);
  ``plot``: the PNG of time per call and rank.
- ``profiled``: the torch backend's calls named in torch's profiler (``mpicomm:all_reduce``).

May import: the front door (``mpicomm.front``), ``mpicomm.core``, mpi4py, numpy; matplotlib in ``plot``
and torch in ``profiled`` only. Imported by ``mpicomm/__init__.py`` only when ``MPICOMM_TRACE`` is set,
by the torch backend (``profiled``) and by ``python -m mpicomm trace``.
"""

from __future__ import annotations

from .recorder import Recorder
from .wrap import CALLS, RECORDER, install, traced, untraced

__all__ = ["CALLS", "RECORDER", "Recorder", "install", "traced", "untraced"]
