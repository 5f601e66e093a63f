"""The bench's "async" report: does ``async_op=True`` return at once, and how much of a call does it hide?

Issue 41's goals for mpicomm's communication engine (:mod:`mpicomm.core.engine`):

* **post while the peer is late**: every rank but 0 sleeps :data:`LATE` seconds before it calls;
  rank 0 times ``all_reduce(x, async_op=True)`` (8 B) until it returns, then waits. Before the engine
  the call blocked for the whole delay.
* **share not hidden**: per op at 16 MiB, ``T`` is the median time of the blocking call; then the
  call is posted with ``async_op=True``, every rank sleeps ``2 T`` and waits. The share not hidden is
  ``(total - 2 T) / T`` (0: the whole call ran during the sleep; 1: none of it), max over ranks,
  median over :data:`REPEATS` tries. Goal: at most :data:`HIDDEN_GOAL`.
* **busy instead of asleep**: the same with numpy work of ``2 T`` (a GIL-free element-wise loop)
  instead of the sleep: where every core computes, a shared-memory transport has no spare core
  for its copies, and the share not hidden grows (docs/overlap.rst).

Example::

    mpiexec -n 2 python -m mpi4py -m mpicomm.bench --ops async
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

import mpicomm

from .harness import Env

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["async_lines", "async_report"]

#: Seconds the other ranks arrive late in the post row.
LATE = 0.3
#: Bytes per rank of the overlap rows.
SIZE = 16 << 20
#: Tries per row (the median is reported).
REPEATS = 5
#: The goal for the share of a call not hidden behind a sleep of twice its length.
HIDDEN_GOAL = 0.35


def _ops(n: int) -> dict[str, Callable[[bool], Any]]:
    """The 16 MiB calls: each takes async_op and returns what the call returns."""
    count = SIZE // 4
    x = np.ones(count, np.float32)
    out = np.empty(count * n, np.float32)
    return {
        "all_reduce": lambda a: mpicomm.all_reduce(x, async_op=a),
        "broadcast": lambda a: mpicomm.broadcast(x, src=0, async_op=a),
        "all_gather_into_tensor": lambda a: mpicomm.all_gather_into_tensor(out, x, async_op=a),
    }


def _busy(seconds: float, work: np.ndarray) -> None:
    """Numpy work for about ``seconds`` (element-wise loops release the GIL)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        np.sqrt(work, out=work)
        np.add(work, 1.0, out=work)


def _slowest(ctl: MPI.Intracomm, value: float) -> float:
    from mpi4py import MPI

    buf = np.array([value])
    ctl.Allreduce(MPI.IN_PLACE, buf, op=MPI.MAX)
    return float(buf[0])


def _post_row(ctl: MPI.Intracomm, e: Env) -> dict[str, float]:
    """Rank 0's time for an async all_reduce to return while the others are :data:`LATE` s late."""
    x = np.ones(2)
    posts: list[float] = []
    blocking: list[float] = []
    for _ in range(REPEATS):
        for asynchronous in (True, False):
            ctl.Barrier()
            if e.rank != 0:
                time.sleep(LATE)
            t0 = time.perf_counter()
            work = mpicomm.all_reduce(x, async_op=asynchronous)
            took = time.perf_counter() - t0
            if work is not None:
                work.wait()
            if e.rank == 0:
                (posts if asynchronous else blocking).append(took)
    return {
        "post_s": statistics.median(posts) if posts else 0.0,
        "blocking_s": statistics.median(blocking) if blocking else 0.0,
    }


def _hidden_rows(ctl: MPI.Intracomm, e: Env) -> list[dict[str, Any]]:
    rows = []
    work_array = np.ones(1 << 18)
    for name, call in _ops(e.n).items():
        call(False)  # warm: first-touch pages, MPI's buffers
        times = []
        for _ in range(REPEATS):
            ctl.Barrier()
            t0 = time.perf_counter()
            call(False)
            times.append(_slowest(ctl, time.perf_counter() - t0))
        t = statistics.median(times)
        row: dict[str, Any] = {"op": name, "bytes": SIZE, "call_s": t}
        for mode in ("sleep", "busy"):
            shares = []
            for _ in range(REPEATS):
                ctl.Barrier()
                t0 = time.perf_counter()
                work = call(True)
                if mode == "sleep":
                    time.sleep(2 * t)
                else:
                    _busy(2 * t, work_array)
                work.wait()
                total = _slowest(ctl, time.perf_counter() - t0)
                shares.append(max(0.0, (total - 2 * t) / t))
            row[f"unhidden_{mode}"] = statistics.median(shares)
        rows.append(row)
    return rows


def async_report(ctl: MPI.Intracomm, e: Env, args: argparse.Namespace) -> dict[str, Any]:
    """Measure the post row and the 16 MiB rows (every rank; rank 0's results count)."""
    post = _post_row(ctl, e) if e.n > 1 else {"post_s": 0.0, "blocking_s": 0.0}
    rows = _hidden_rows(ctl, e)
    return {"late_s": LATE, **post, "rows": rows, "goal": HIDDEN_GOAL, "check": True}


def async_lines(res: dict[str, Any]) -> str:
    """The report's lines: the post time, then one line per op."""
    out = ["async (mpicomm's communication engine):"]
    if res["blocking_s"]:
        out.append(
            f"  all_reduce 8 B, peers {res['late_s'] * 1e3:.0f} ms late: async_op=True returns in "
            f"{res['post_s'] * 1e6:.0f} us (blocking: {res['blocking_s'] * 1e3:.0f} ms)"
        )
    for row in res["rows"]:
        verdict = "reached" if row["unhidden_sleep"] <= res["goal"] else "NOT reached"
        out.append(
            f"  {row['op']} {row['bytes'] >> 20} MiB ({row['call_s'] * 1e3:.1f} ms): share not hidden behind "
            f"a sleep of 2x {row['unhidden_sleep']:.2f} (goal <= {res['goal']:g}: {verdict}); behind "
            f"numpy work of 2x {row['unhidden_busy']:.2f}"
        )
    return "\n".join(out)
