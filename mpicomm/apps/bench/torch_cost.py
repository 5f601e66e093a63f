"""The bench's "torch_cost" report: what a torch CPU tensor adds to a call, with the caches warm and cold.

Issue 20's goal is that a torch CPU tensor adds at most 1.5 us to a call over the same call on a
numpy array. Up to 64 KiB the sweep's ``*_torch`` rows show that directly. From 1 MiB on they cannot:
the A/A noise floor there is +-1-3% (2-5 us a call), and every call runs with cold caches, because
the previous call's data pushed the code and data of the next one out of L1 and L2.

This report measures the same difference without MPI's noise. On rank 0 only, in a one-rank group
(the data does not leave the process), it times single calls of ``all_reduce`` and
``all_to_all_single``, one on numpy arrays and one on torch tensors over the same memory, with
``time.perf_counter_ns``:

* **warm**: 4 KiB arrays, each case's calls back to back (blocks of 250, the cases' blocks
  alternating), so that code and data stay in the caches;
* **cold**: 1 MiB arrays, the cases interleaved call by call with a 4 MiB copy before each call
  (outside the timed part), as a >= 1 MiB transfer leaves the caches.

For reference it also times, cold, what the torch path cannot avoid: one attribute read
(``tensor.data_ptr()``) and ``tensor.numpy()``. The other ranks wait in a barrier.

Example::

    mpiexec -n 2 python -m mpi4py -m mpicomm.bench --ops torch_cost
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

import mpicomm

from .harness import Env

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["torch_cost", "torch_cost_lines"]

#: The goal: at most this many microseconds added by a torch tensor to a call.
TARGET_US = 1.5
#: float32 elements per array: 4 KiB warm, 1 MiB cold; and in the copy that makes the caches cold (4 MiB).
WARM_COUNT, COUNT, FLUSH = (4 << 10) // 4, (1 << 20) // 4, (4 << 20) // 4
#: Timed calls per case and per mode, and the warm mode's back-to-back calls per block.
REPS, BLOCK = 3000, 250


def _medians(cases: dict[str, Callable[[], object]], flush: Callable[[], None] | None) -> dict[str, float]:
    """Median microseconds per call of each case.

    Warm (``flush`` None): each case runs in blocks of back-to-back calls, the blocks of the cases
    alternating. Cold: the cases interleave call by call, ``flush()`` before each.
    """
    clock = time.perf_counter_ns
    times: dict[str, list[int]] = {k: [] for k in cases}
    items = list(cases.items())
    block = 1 if flush is not None else BLOCK
    for r in range(REPS // block):
        for name, fn in items if r % 2 == 0 else items[::-1]:
            for _ in range(block):
                if flush is not None:
                    flush()
                t0 = clock()
                fn()
                times[name].append(clock() - t0)
    return {k: float(np.median(v)) / 1e3 for k, v in times.items()}


def _cases(count: int, group: mpicomm.ProcessGroup) -> dict[str, Callable[[], object]]:
    """The timed calls on ``count`` float32 elements in ``group``, and the two torch reads alone."""
    import torch  # only when this report runs; mpicomm itself never imports torch

    x, y = np.arange(count, dtype=np.float32), np.zeros(count, np.float32)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    return {
        "all_reduce numpy": lambda: mpicomm.all_reduce(x, group=group),
        "all_reduce torch": lambda: mpicomm.all_reduce(tx, group=group),
        "all_to_all_single numpy": lambda: mpicomm.all_to_all_single(y, x, group=group),
        "all_to_all_single torch": lambda: mpicomm.all_to_all_single(ty, tx, group=group),
        "nothing": lambda: None,
        "tensor.data_ptr()": tx.data_ptr,
        "tensor.numpy()": tx.numpy,
    }


def _check(group: mpicomm.ProcessGroup) -> bool:
    """Whether both kinds give the one-rank answers: all_reduce keeps, all_to_all_single copies."""
    import torch

    ok = True
    for kind in (np.asarray, torch.from_numpy):
        probe, out = kind(np.arange(8, dtype=np.float32)), kind(np.zeros(8, np.float32))
        mpicomm.all_reduce(probe, group=group)
        mpicomm.all_to_all_single(out, probe, group=group)
        ok = ok and np.array_equal(np.asarray(probe), np.arange(8)) and np.array_equal(np.asarray(out), probe)
    return bool(ok)


def _measure() -> dict[str, Any]:
    """Rank 0's measurement (see the module's docstring)."""
    src, dst = np.ones(FLUSH, np.float32), np.empty(FLUSH, np.float32)

    def flush() -> None:
        np.copyto(dst, src)

    group = mpicomm.new_group([0], use_local_synchronization=True)
    try:
        warm = _medians(_cases(WARM_COUNT, group), None)
        cold = _medians(_cases(COUNT, group), flush)
        ok = _check(group)
    finally:
        mpicomm.destroy_process_group(group)
    res: dict[str, Any] = {"warm_us": warm, "cold_us": cold, "target_us": TARGET_US, "check": ok}
    for mode, m in (("warm", warm), ("cold", cold)):
        for call in ("all_reduce", "all_to_all_single"):
            res[f"{call}_added_{mode}_us"] = m[f"{call} torch"] - m[f"{call} numpy"]
    return res


def torch_cost(ctl: MPI.Intracomm, e: Env, args: argparse.Namespace) -> dict[str, Any]:
    """Measure on rank 0 (the other ranks wait in a barrier); rank 0 returns the results."""
    res: dict[str, Any] = {"check": True}
    if e.rank == 0:
        res = _measure()
    ctl.Barrier()
    return res


def torch_cost_lines(res: dict[str, Any]) -> str:
    """The report's lines: added microseconds per call, warm and cold, and the cold reference reads."""
    head = "torch_cost: what a torch CPU tensor adds to a call over numpy (rank 0, one-rank group)"
    out = [f"{head}; warm 4 KiB, cold 1 MiB"]
    for call in ("all_reduce", "all_to_all_single"):
        warm, cold = res[f"{call}_added_warm_us"], res[f"{call}_added_cold_us"]
        verdict = "reached" if max(warm, cold) <= res["target_us"] else "NOT reached"
        out.append(
            f"  {call:<18} warm {warm:+.2f} us, cold {cold:+.2f} us; target <= {res['target_us']:g} us: "
            f"{verdict}"
        )
    c = res["cold_us"]
    read, numpy_ = c["tensor.data_ptr()"] - c["nothing"], c["tensor.numpy()"] - c["nothing"]
    out.append(f"  cold, alone: one torch attribute read {read:.2f} us, tensor.numpy() {numpy_:.2f} us")
    return "\n".join(out)
