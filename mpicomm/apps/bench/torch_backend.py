"""The bench's "torch_backend" report: torch.distributed on the registered backend against gloo and mpicomm.

Issue 32's speed goals for ``dist.init_process_group("mpicomm")`` (``import mpicomm.torch``):

* ``dist.all_reduce`` through the backend adds at most 3 us to mpicomm called directly at 8 B, and at
  most 5% from 1 MiB, and is at least 30x faster than gloo at 8 B;
* a DDP step (the 265k-parameter MLP, a 25M-parameter MLP) takes at most 0.8x gloo's time.

Every rank starts torch's default group on mpicomm and a gloo group of the same ranks (on the store
the MPI rendezvous made). Per size it times, on one shared float32 tensor, interleaved as the sweep
does (calibrated samples, alternating order, the quiet gate; max over ranks): ``mpicomm.all_reduce``
(``direct``), ``pg.allreduce([t], opts)`` (the backend without torch's Python wrapper: ``pg``),
``dist.all_reduce`` on the backend (``backend``) and on gloo (``gloo``). On a loaded machine the
8-byte times at 2 ranks mostly measure waiting for the partner, so the same three calls are also
timed on a one-rank group of each rank: ``pg - direct`` is the backend's own cost and
``dist - pg`` torch's Python wrapper (``dist.all_reduce`` around ``pg.allreduce``).

The DDP and FSDP2 parts (:mod:`mpicomm.apps.bench.torch_steps`) time whole training steps
(forward, backward with DDP's bucketed all_reduce, SGD) on mpicomm and on gloo, the same DDP step
without communication and the buckets' all_reduces alone: the share of the all_reduce time hidden
behind backward (DDP's bucket all_reduces run on mpicomm's communication thread, issue 41).
Before timing, one step of each (same seed) is checked: every gradient equal to gloo's.

Where the job has at least as many ranks as the machine has cores, each rank's torch runs one
intra-op thread (``torch.set_num_threads(1)``, restored afterwards; the report says so): two ranks'
thread pools on two cores would take turns with the ranks' MPI waits. The report also gives the
MPI thread level and MPICH's intra-node allreduce selection, which decide how MPICH waits
(:mod:`mpicomm.apps.bench.torch_steps`: its ``p2p`` cases).

Example::

    mpiexec -n 2 python -m mpi4py -m mpicomm.bench --ops torch_backend --rounds 16
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

import mpicomm

from ... import _mpi
from .harness import Env, _data, _timed, calibrate, everywhere, fmt_size, quiet_gate
from .torch_steps import ALGO, MODELS, ddp_rows, fsdp_rows, step_lines

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["MODELS", "torch_backend", "torch_backend_lines"]

#: Bytes per rank of the all_reduce rows.
SIZES = (8, 64 << 10, 1 << 20, 16 << 20)
#: The goals: microseconds added at 8 B, the ratio from 1 MiB, gloo's time over ours at 8 B, DDP's ratio.
ADD_US, LARGE, GLOO_X, DDP_X = 3.0, 1.05, 30.0, 0.8
#: The all_reduce contenders, in the table's order.
CASES = ("direct", "pg", "backend", "gloo")

Samples = dict[str, list[float]]


def _samples(ctl: MPI.Intracomm, fns: dict[str, Callable[[], object]], args: argparse.Namespace) -> Samples:
    """Seconds per call of each function, ``args.rounds`` samples each (max over ranks), order alternating."""
    for fn in fns.values():
        _timed(ctl, fn, 2)
    ks = {k: args.iters or calibrate(ctl, fn, args.sample_time) for k, fn in fns.items()}
    times: Samples = {k: [] for k in fns}
    for r in range(args.rounds):
        for k in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            quiet_gate(ctl, args.gate, args.gate_wait)
            times[k].append(_timed(ctl, fns[k], ks[k]))
    return times


def _stats(times: Samples) -> dict[str, dict[str, float]]:
    """Median and minimum seconds per call of each case."""
    return {k: {"median": statistics.median(v), "min": min(v)} for k, v in times.items()}


def _all_reduce_rows(ctl: MPI.Intracomm, e: Env, gloo: Any, args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per size: each contender's median and min, and whether every contender's sum is right."""
    import torch
    import torch.distributed as dist

    pg = dist.group.WORLD
    world = pg.mpicomm_group  # type: ignore[union-attr]
    opts: Any = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.SUM
    opts.asyncOp = False
    rows = []
    for size in SIZES:
        count = size // 4
        expected = np.sum([_data(count, r) for r in range(e.n)], axis=0)
        calls: dict[str, Callable[[torch.Tensor], object]] = {
            "direct": lambda t: mpicomm.all_reduce(t, group=world),
            "pg": lambda t: pg.allreduce([t], opts),  # type: ignore[union-attr]
            "backend": dist.all_reduce,
            "gloo": lambda t: dist.all_reduce(t, group=gloo),
        }
        ok = True
        for call in calls.values():
            probe = torch.from_numpy(_data(count, e.rank))
            call(probe)
            ok = ok and bool(np.array_equal(probe.numpy(), expected))
        t = torch.zeros(count)  # one tensor for all: separate ones time their placement too
        fns: dict[str, Callable[[], object]] = {k: partial(c, t) for k, c in calls.items()}
        times = _samples(ctl, fns, args)
        rows.append({"size": size, "check": everywhere(ctl, ok), **_stats(times)})
    return rows


def _split(ctl: MPI.Intracomm, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The 8-byte call's layers on a one-rank group of each rank (no partner to wait for).

    ``direct`` is mpicomm's front door, ``pg`` the backend's ``allreduce`` called by hand, ``dist``
    torch's ``dist.all_reduce`` on that group: ``pg - direct`` is ours, ``dist - pg`` torch's wrapper.
    """
    import torch
    import torch.distributed as dist

    from ...c10d.registered import MpicommProcessGroup

    solo = mpicomm.new_group([ctl.Get_rank()], use_local_synchronization=True)
    try:
        pg = MpicommProcessGroup(solo, "solo")
        t, opts = torch.zeros(2), dist.AllreduceOptions()
        opts.asyncOp = False
        fns = {
            "direct": lambda: mpicomm.all_reduce(t, group=solo),
            "pg": lambda: pg.allreduce([t], opts),
            "dist": lambda: dist.all_reduce(t, group=pg),
            "AllreduceOptions()": dist.AllreduceOptions,
            "opts.reduceOp": lambda: opts.reduceOp,
        }
        return _stats(_samples(ctl, fns, args))
    finally:
        mpicomm.destroy_process_group(solo)


def torch_backend(ctl: MPI.Intracomm, e: Env, args: argparse.Namespace) -> dict[str, Any]:
    """Run the report on every rank (see the module's docstring); rank 0's results count."""
    import torch
    import torch.distributed as dist

    import mpicomm.torch  # noqa: F401  # registers the backend

    from ...c10d import waiting

    threads = torch.get_num_threads()
    if e.n >= (os.cpu_count() or 1):  # a core per rank at most: one intra-op thread each
        torch.set_num_threads(1)
    started = not dist.is_initialized()
    if started:
        dist.init_process_group("mpicomm")
    gloo = dist.new_group(backend="gloo")
    try:
        res: dict[str, Any] = {
            "all_reduce": _all_reduce_rows(ctl, e, gloo, args),
            "split": _split(ctl, args),
            "ddp": ddp_rows(ctl, e, gloo, args, _samples, _stats),
            "fsdp": fsdp_rows(ctl, e, gloo, args, _samples, _stats),
            "world_size": e.n,
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "torch_threads_before": threads,
            "thread_level": _mpi.thread_level(),
            "algorithm": waiting.read_cvar(ALGO),
        }
    finally:
        dist.destroy_process_group(gloo)
        if started:
            dist.destroy_process_group()
        torch.set_num_threads(threads)
    res["check"] = all(r["check"] for r in res["all_reduce"] + res["ddp"] + res["fsdp"])
    return res


def _us(row: dict[str, Any], case: str, stat: str) -> float:
    return float(row[case][stat]) * 1e6


def torch_backend_lines(res: dict[str, Any]) -> str:
    """The report's table (median, min in brackets) and the goals' verdicts."""
    out = [
        f"torch_backend: dist.all_reduce on the registered backend, {res['world_size']} ranks, "
        "us per call, median (min); direct = mpicomm.all_reduce, pg = pg.allreduce by hand",
        f"  {'size':>8} {'direct':>16} {'pg':>16} {'backend':>16} {'gloo':>18}  added   back/dir  gloo/back",
    ]
    if "thread_level" in res:
        out.insert(
            1,
            f"  MPI thread level {res['thread_level']}; MPICH {ALGO} = {res['algorithm']} "
            f"(0: point-to-point, 1: release_gather, 2: auto); torch intra-op threads {res['torch_threads']} "
            f"(was {res['torch_threads_before']})",
        )
    verdicts = []
    for row in res["all_reduce"]:
        cells = [f"{_us(row, c, 'median'):>8.1f} ({_us(row, c, 'min'):.1f})" for c in CASES]
        added = _us(row, "backend", "median") - _us(row, "direct", "median")
        ratio = row["backend"]["median"] / row["direct"]["median"]
        gloo_x = row["gloo"]["median"] / row["backend"]["median"]
        check = "" if row["check"] else "  CHECK FAILED"
        out.append(
            f"  {fmt_size(row['size']):>8} {' '.join(cells)} {added:+6.1f} {ratio:8.2f}x {gloo_x:7.1f}x"
            + check
        )
        if row["size"] == 8:
            added_min = _us(row, "backend", "min") - _us(row, "direct", "min")
            verdicts.append(
                (
                    f"8 B: backend adds <= {ADD_US:g} us (median {added:+.1f}, min {added_min:+.1f})",
                    min(added, added_min) <= ADD_US,
                )
            )
            verdicts.append((f"8 B: >= {GLOO_X:g}x faster than gloo ({gloo_x:.1f}x)", gloo_x >= GLOO_X))
        if row["size"] >= 1 << 20:
            verdicts.append(
                (f"{fmt_size(row['size'])}: backend <= {LARGE:g}x direct ({ratio:.3f}x)", ratio <= LARGE)
            )
    sp = {k: v["min"] * 1e6 for k, v in res["split"].items()}
    out.append(
        f"  8 B on a one-rank group (mins): direct {sp['direct']:.2f} us, pg.allreduce {sp['pg']:.2f}, "
        f"dist.all_reduce {sp['dist']:.2f}: the backend's own {sp['pg'] - sp['direct']:+.2f} us (one "
        f"opts.reduceOp read {sp['opts.reduceOp']:.2f}), torch's Python wrapper "
        f"{sp['dist'] - sp['pg']:+.2f} us (AllreduceOptions() {sp['AllreduceOptions()']:.2f})"
    )
    lines, more = step_lines(res, DDP_X)
    out += lines
    verdicts += more
    out += [f"  target {text}: {'reached' if ok else 'NOT reached'}" for text, ok in verdicts]
    return "\n".join(out)
