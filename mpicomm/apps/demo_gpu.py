"""``demo --device cuda``: the collectives on cupy arrays, each checked against the numpy path.

Every rank binds its GPU, runs each call on cupy arrays and the same call on numpy arrays, and
compares the two bit for bit. Rank 0 prints one line per call with the path it took (direct,
pipelined or staged, :data:`mpicomm.front.device.PATHS`), then ``all checks passed`` or the failures.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

import mpicomm

from ..front import device as front
from ..gpu.cuda_aware import cuda_awareness
from ..gpu.device import bind_device

__all__ = ["run_gpu"]

#: name -> (function of (xp, rank, world size) returning the arrays to compare)
Call = Callable[[Any, int, int], list[Any]]


def _all_reduce(xp: Any, r: int, w: int) -> list[Any]:
    x = xp.arange(8, dtype=np.float64) * (r + 1)
    mpicomm.all_reduce(x)
    return [x]


def _broadcast(xp: Any, r: int, w: int) -> list[Any]:
    x = xp.arange(6, dtype=np.int64) + 10 * r
    mpicomm.broadcast(x, src=w - 1)
    return [x]


def _all_gather_into_tensor(xp: Any, r: int, w: int) -> list[Any]:
    out = xp.zeros((w, 3), dtype=np.float32)
    mpicomm.all_gather_into_tensor(out, xp.full(3, r, dtype=np.float32))
    return [out]


def _all_to_all_single(xp: Any, r: int, w: int) -> list[Any]:
    out = xp.zeros(2 * w, dtype=np.int32)
    mpicomm.all_to_all_single(out, xp.arange(2 * w, dtype=np.int32) + 100 * r)
    return [out]


def _reduce_scatter_tensor(xp: Any, r: int, w: int) -> list[Any]:
    out = xp.zeros(2, dtype=np.float64)
    mpicomm.reduce_scatter_tensor(out, xp.arange(2 * w, dtype=np.float64) + r)
    return [out]


def _all_reduce_async(xp: Any, r: int, w: int) -> list[Any]:
    x = xp.full(5, float(r))
    work = mpicomm.all_reduce(x, op=mpicomm.ReduceOp.MAX, async_op=True)
    if work is not None:
        work.wait()
    return [x]


def _ring(xp: Any, r: int, w: int) -> list[Any]:
    got = xp.zeros(4)
    mpicomm.sendrecv(xp.full(4, float(r)), got, dst=(r + 1) % w, src=(r - 1) % w)
    return [got]


CALLS: dict[str, Call] = {
    "all_reduce": _all_reduce,
    "all_reduce async MAX": _all_reduce_async,
    "broadcast": _broadcast,
    "all_gather_into_tensor": _all_gather_into_tensor,
    "all_to_all_single": _all_to_all_single,
    "reduce_scatter_tensor": _reduce_scatter_tensor,
    "sendrecv ring": _ring,
}


def run_gpu(quiet: bool = False) -> bool:
    """Run :data:`CALLS` on cupy and on numpy on every rank; print the table on rank 0.

    Raises:
        ModuleNotFoundError: cupy is not installed.
    """
    cp = importlib.import_module("cupy")
    device = bind_device()
    r, w = mpicomm.get_rank(), mpicomm.get_world_size()
    ok: list[bool] = []
    paths: list[str] = []
    for call in CALLS.values():
        front.PATHS.clear()
        got = [cp.asnumpy(a) for a in call(cp, r, w)]
        taken = ", ".join(sorted({path for (_, path) in front.PATHS})) or "-"
        want = call(np, r, w)
        ok.append(all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)))
        paths.append(taken)
    failures = np.array([ok.count(False)])
    mpicomm.all_reduce(failures)
    if r == 0:
        if not quiet:
            aware = cuda_awareness()
            print(f"mpicomm {mpicomm.__version__} GPU demo on {w} rank(s), GPU {device}")
            print(f"data path: {aware.path} ({aware.reason})")
            for (name, _), path, good in zip(CALLS.items(), paths, ok, strict=True):
                print(f"  {name:<24} {path:<18} {'ok' if good else 'FAILED'}")
        print("all checks passed" if failures[0] == 0 else f"{failures[0]} check(s) FAILED", flush=True)
    return bool(failures[0] == 0)
