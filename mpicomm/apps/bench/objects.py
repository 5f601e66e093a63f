"""The "objects" report of ``python -m mpicomm.bench``: object collectives against mpi4py's pickled calls.

Timed in the same processes, interleaved, with the harness of :mod:`mpicomm.bench` (warm-up,
calibration, rounds in alternating order behind the quiet gate; a sample is seconds per call, max
over ranks; the report gives medians):

* ``broadcast_object_list([obj])`` against ``comm.bcast(obj)`` and ``pkl5.Intracomm(comm).bcast(obj)``
  for 1000 small dicts (about 58 kB pickled) and a dict holding a 100 MB float32 array;
* ``all_gather_object`` of one 10 MB float32 array per rank against ``comm.allgather`` and pkl5's
  ``allgather``;
* the status agreement every object collective ends with (one 8-byte ``Allreduce``), alone;
* with ``--objects-huge`` (run by hand: about 7 GiB of memory at 2 ranks), ``broadcast_object_list``
  of a dict holding a 2.2 GiB array against ``pkl5.bcast`` only, one call per sample.

The ratio is mpicomm's time over the faster of the two mpi4py calls; the target is at most 1.1 (1.2
for the 2.2 GiB point, where page faults on fresh memory dominate and vary from run to run).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

import mpicomm

from ... import _mpi
from ...objects import wire
from .harness import Env, _medians, fmt_time
from .report import line

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["objects_lines", "objects_report"]

#: Ratio to the faster mpi4py call that the broadcasts must stay under.
TARGET = 1.1
#: The same for the broadcast of a 2.2 GiB array (--objects-huge).
HUGE_TARGET = 1.2
HUGE = "ndarray2.2GB"
BCAST_CASES = ("dicts1000", "ndarray100MB")


def dicts1000() -> list[dict[str, Any]]:
    """1000 small records, about 58 kB pickled: the shape of a configuration or metadata broadcast."""
    return [
        {
            "id": i,
            "name": f"item-{i:04d}",
            "score": i * 0.5,
            "tags": ["alpha", "beta"],
            "ok": i % 2 == 0,
            "owner": f"user{i % 97}",
        }
        for i in range(1000)
    ]


def ndarray100mb() -> dict[str, Any]:
    """A dict holding a 100 MB float32 array and a little metadata."""
    return {"x": np.arange(25_000_000, dtype=np.float32), "meta": {"step": 7, "name": "weights"}}


def ndarray2_2gb() -> dict[str, Any]:
    """A dict holding a 2.2 GiB uint8 array: past the 2 GiB of a C int count, in pieces of 1 GiB."""
    return {"x": np.resize(np.arange(251, dtype=np.uint8), int(2.2 * 2**30)), "meta": {"step": 7}}


PAYLOADS: dict[str, Callable[[], Any]] = {
    "dicts1000": dicts1000,
    "ndarray100MB": ndarray100mb,
    HUGE: ndarray2_2gb,
}


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and bool(np.array_equal(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))
    return bool(a == b)


def _bcast_calls(e: Env, obj: Any) -> dict[str, Callable[[], Any]]:
    from mpi4py.util import pkl5

    wrapped = pkl5.Intracomm(e.comm)  # a second handle on the same communicator, not a copy
    mine = obj if e.rank == 0 else None

    def ours() -> Any:
        objs = [mine]
        mpicomm.broadcast_object_list(objs, src=0)
        return objs[0]

    calls = {
        "mpicomm": ours,
        "comm.bcast": lambda: e.comm.bcast(mine, root=0),
        "pkl5.bcast": lambda: wrapped.bcast(mine, root=0),
    }
    return calls


def _gather_calls(e: Env, obj: Any) -> dict[str, Callable[[], Any]]:
    from mpi4py.util import pkl5

    wrapped = pkl5.Intracomm(e.comm)  # a second handle on the same communicator, not a copy

    def ours() -> Any:
        out: list[Any] = [None] * e.n
        mpicomm.all_gather_object(out, obj)
        return out

    calls = {
        "mpicomm": ours,
        "comm.allgather": lambda: e.comm.allgather(obj),
        "pkl5.allgather": lambda: wrapped.allgather(obj),
    }
    return calls


def _case(
    ctl: MPI.Intracomm, calls: dict[str, Callable[[], Any]], args: argparse.Namespace
) -> dict[str, Any]:
    """Check every contender's result against the first's once, then time them all."""
    results = {k: fn() for k, fn in calls.items()}
    first = next(iter(results.values()))
    ok = all(_equal(first, r) for r in results.values())
    ok = bool(ctl.allreduce(ok, op=_mpi.MPI.LAND))
    times = _medians(ctl, dict(calls.items()), args)
    best = min(v for k, v in times.items() if k != "mpicomm")
    return {"check": ok, "times": times, "ratio": times["mpicomm"] / best}


def objects_report(ctl: MPI.Intracomm, e: Env, args: argparse.Namespace) -> dict[str, Any]:
    """Time the object broadcasts, the 10 MB all-gather and the status agreement."""
    cases: dict[str, Any] = {}
    for name in BCAST_CASES:
        calls = _bcast_calls(e, PAYLOADS[name]())
        cases[name] = _case(ctl, calls, args)
    mine = np.full(2_500_000, float(e.rank), np.float32)
    cases["all_gather_10MB"] = _case(ctl, _gather_calls(e, mine), args)
    if getattr(args, "objects_huge", False):
        calls = _bcast_calls(e, PAYLOADS[HUGE]() if e.rank == 0 else None)
        del calls["comm.bcast"]  # one more 2.2 GiB pickle copy per rank, and not the baseline here
        one_call = argparse.Namespace(**{**vars(args), "iters": 1, "rounds": max(2, args.rounds // 4)})
        cases[HUGE] = _case(ctl, calls, one_call)
    world = mpicomm.init()
    agree = _medians(ctl, {"agree": lambda: wire.agree(world, 0, "")}, args)["agree"]
    ok = all(c["check"] for c in cases.values())
    return {"check": ok, "ranks": e.n, "cases": cases, "status_agreement": agree, "target": TARGET}


def objects_lines(res: dict[str, Any]) -> str:
    """The objects report as text: one row per payload, the ratio and the verdicts."""
    head = ("payload", "mpicomm", "mpi4py", "t mpi4py", "other", "t other", "mpicomm/faster", "check")
    rows = [head]
    for name, c in res["cases"].items():
        others = [k for k in c["times"] if k != "mpicomm"]
        cells = [fmt_time(c["times"]["mpicomm"])]
        for k in others:
            cells += [k, fmt_time(c["times"][k])]
        cells += [""] * (len(head) - 3 - len(cells))  # the huge point has one mpi4py contender only
        rows.append((name, *cells, f"{c['ratio']:.3f}", "ok" if c["check"] else "FAIL"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    verdicts = []
    for name in (*BCAST_CASES, HUGE):
        if name not in res["cases"]:
            continue
        target = HUGE_TARGET if name == HUGE else res["target"]
        verdict = "reached" if res["cases"][name]["ratio"] <= target else "NOT reached"
        verdicts.append(f"{verdict:<13} broadcast_object_list {name} <= {target}x the faster mpi4py call")
    return "\n".join(
        [
            f"objects: {res['ranks']} ranks, root 0; time per call, max over ranks, median of rounds",
            *(line(r, widths) for r in rows),
            *verdicts,
            "status agreement (one 8-byte Allreduce, part of every call above): "
            + fmt_time(res["status_agreement"]),
        ]
    )
