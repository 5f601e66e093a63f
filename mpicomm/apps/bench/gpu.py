"""The GPU report (``--device cuda`` or ``--ops gpu``): cupy collectives against their bounds.

For each op and size (bytes per rank): mpicomm on cupy arrays by the staged path, by the direct path
where the MPI is CUDA-aware, the raw mpi4py call on cupy buffers (CUDA-aware MPIs only), the same raw
call on pinned host buffers (the host-MPI leg), and mpicomm on numpy arrays. The pinned copy
bandwidth down and up is measured in the same run, so the staged path's efficiency is reported
against ``max(copy time, host-MPI time)``, the best a staged call can do. Needs cupy and a GPU.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

import mpicomm

from ...gpu import cuda_aware
from ...gpu.device import bind_device
from .harness import Env, _medians, fmt_size, fmt_time
from .report import line

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["gpu_lines", "gpu_report"]

SIZES = (4 << 10, 1 << 20, 16 << 20, 64 << 20)
OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "all_to_all_single")
#: The goals of issue 12: staged efficiency from 16 MiB, direct over staged at 64 MiB, 4 KiB overhead.
STAGED_EFFICIENCY, DIRECT_SPEEDUP, SMALL_OVERHEAD = 0.7, 3.0, 100e-6


def _copy_bandwidth(cp: Any, nbytes: int) -> dict[str, float]:
    """Pinned device-to-host and host-to-device bandwidth in bytes/s, timed with CUDA events."""
    dev = cp.empty(nbytes, dtype=np.uint8)
    host = importlib.import_module("cupyx").empty_pinned((nbytes,), np.uint8)
    out = {}
    for name, (dst, src, kind) in {"d2h": (host, dev, 2), "h2d": (dev, host, 1)}.items():
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        stream = cp.cuda.get_current_stream()
        dptr = dst.ctypes.data if kind == 2 else dst.data.ptr
        sptr = src.data.ptr if kind == 2 else src.ctypes.data
        best = float("inf")
        for _ in range(5):
            start.record(stream)
            cp.cuda.runtime.memcpyAsync(dptr, sptr, nbytes, kind, stream.ptr)
            stop.record(stream)
            stop.synchronize()
            best = min(best, cp.cuda.get_elapsed_time(start, stop) / 1e3)
        out[name] = nbytes / best
    return out


def _calls(cp: Any, comm: MPI.Intracomm, op: str, count: int, n: int) -> dict[str, Callable[[], object]]:
    """Mpicomm on cupy, raw mpi4py on pinned host buffers and on cupy, mpicomm on numpy."""
    from mpi4py import MPI

    cupyx = importlib.import_module("cupyx")
    big = op == "all_gather_into_tensor"
    d_in, d_out = cp.ones(count, np.float32), cp.empty(count * n if big else count, np.float32)
    h_in = cupyx.empty_pinned((count,), np.float32)
    h_out = cupyx.empty_pinned((count * n if big else count,), np.float32)
    n_in, n_out = np.ones(count, np.float32), np.empty(count * n if big else count, np.float32)
    h_in[:] = 1

    def mine(i: Any, o: Any) -> Callable[[], object]:
        return {
            "all_reduce": lambda: mpicomm.all_reduce(o),
            "broadcast": lambda: mpicomm.broadcast(o, src=0),
            "all_gather_into_tensor": lambda: mpicomm.all_gather_into_tensor(o, i),
            "all_to_all_single": lambda: mpicomm.all_to_all_single(o, i),
        }[op]

    def raw(i: Any, o: Any) -> Callable[[], object]:
        call: Callable[[], object] = {
            "all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, o),
            "broadcast": lambda: comm.Bcast(o, 0),
            "all_gather_into_tensor": lambda: comm.Allgather(i, o),
            "all_to_all_single": lambda: comm.Alltoall(i, o),
        }[op]
        if isinstance(o, np.ndarray):
            return call
        return lambda: (cp.cuda.get_current_stream().synchronize(), call())

    calls = {
        "mpicomm cupy": mine(d_in, d_out),
        "raw pinned": raw(h_in, h_out),
        "mpicomm numpy": mine(n_in, n_out),
    }
    if cuda_aware.cuda_awareness().aware:
        calls["raw cupy"] = raw(d_in, d_out)
    return calls


def gpu_report(ctl: MPI.Intracomm, e: Env, args: argparse.Namespace) -> dict[str, Any]:
    """Time every op and size of :data:`SIZES` on cupy arrays; see the module docstring."""
    cp = importlib.import_module("cupy")
    bind_device()
    comm: Any = mpicomm.init().comm
    bw = _copy_bandwidth(cp, 64 << 20)
    path = cuda_aware.cuda_awareness().path
    rows = []
    for op in OPS:
        for size in SIZES:
            count = size // 4 // e.n * e.n
            times = _medians(ctl, _calls(cp, comm, op, count, e.n), args)
            moved = count * 4 * (e.n if op == "all_gather_into_tensor" else 1)
            copies = moved / bw["d2h"] + moved / bw["h2d"]
            rows.append({"op": op, "size": size, "times": times, "copy_bound": copies, "path": path})
    return {"check": True, "ranks": e.n, "path": path, "bandwidth": bw, "rows": rows}


def gpu_lines(res: dict[str, Any]) -> str:
    """The GPU report as text, with the efficiency of the cupy calls against their bound."""
    bw = res["bandwidth"]
    head = ("op", "size/rank", "cupy", "numpy", "raw pinned", "raw cupy", "bound", "bound/cupy")
    rows = [head]
    for r in res["rows"]:
        t = r["times"]
        bound = max(r["copy_bound"], t["raw pinned"])
        raw = fmt_time(t["raw cupy"]) if "raw cupy" in t else "-"
        cells = (fmt_time(t["mpicomm cupy"]), fmt_time(t["mpicomm numpy"]), fmt_time(t["raw pinned"]), raw)
        rows.append(
            (r["op"], fmt_size(r["size"]), *cells, fmt_time(bound), f"{bound / t['mpicomm cupy']:.2f}")
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join(
        [
            f"gpu: {res['ranks']} ranks, path {res['path']}; pinned copies {bw['d2h'] / 1e9:.1f} GB/s down, "
            f"{bw['h2d'] / 1e9:.1f} GB/s up; bound = max(copy time, raw pinned); staged goal bound/cupy >= "
            f"{STAGED_EFFICIENCY} from 16 MiB",
            *(line(row, widths) for row in rows),
        ]
    )
