"""The GPU report (``--device cuda`` or ``--ops gpu``): cupy collectives against their bounds.

For each op and size (bytes per rank): mpicomm on cupy arrays by the staged path, by the direct path
where the MPI is CUDA-aware, the raw mpi4py call on cupy buffers (CUDA-aware MPIs only), the same raw
call on pinned host buffers (the host-MPI leg), and mpicomm on numpy arrays. The pinned copy
bandwidth down and up is measured in the same run, so the staged path's efficiency is reported
against ``max(copy time, host-MPI time)``, the best a staged call can do. Needs cupy and a GPU.

The staged-cost report (``--ops gpu_cost``) times what mpicomm's own Python adds to a small staged
call: ``all_reduce`` and ``broadcast`` of a cupy array by mpicomm's staged path against the same
copies and MPI call written by hand as a user would write them (:func:`hand_written`:
``memcpyAsync`` down on the caller's stream, synchronise it, the MPI call on the pinned buffer,
``memcpyAsync`` up on that stream, synchronise it), through the same cupy. It needs no GPU: on the
numpy-backed fake cupy (``PYTHONPATH=tests/fakecupy``) the copies and events cost little, so the
difference is mpicomm's bookkeeping; there the report also counts the CUDA runtime calls one call of
each contender makes (each costs microseconds on a GPU). A foreign device object
(``__cuda_array_interface__`` only) and, where torch sees a GPU, a torch CUDA tensor are timed too.
Goal (issue 35): at most 1.3x the hand-written sequence at 4 KiB on 1 rank, and a torch CUDA tensor
at most 5 us over cupy.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
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

__all__ = ["cost_lines", "cost_report", "gpu_lines", "gpu_report", "hand_written"]

SIZES = (4 << 10, 1 << 20, 16 << 20, 64 << 20)
OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "all_to_all_single")
#: The goals of issue 12: staged efficiency from 16 MiB, direct over staged at 64 MiB, 4 KiB overhead.
STAGED_EFFICIENCY, DIRECT_SPEEDUP, SMALL_OVERHEAD = 0.7, 3.0, 100e-6
#: The staged-cost report's sizes (bytes per rank) and goals: mpicomm / hand-written, torch - cupy.
COST_SIZES = (4 << 10, 64 << 10)
COST_RATIO, TORCH_EXTRA = 1.3, 5e-6


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


class _Foreign:
    """A device array seen only through ``__cuda_array_interface__`` (another library's tensor)."""

    def __init__(self, x: Any) -> None:
        self._x = x

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return dict(self._x.__cuda_array_interface__)


def hand_written(cp: Any, comm: Any, op: str, d: Any, root_here: bool = True) -> Callable[[], object]:
    """The staged ``op`` of the device array ``d`` written by hand: its copies and MPI call only.

    The fewest CUDA calls that keep the caller's stream order: ``d`` is copied into a pinned buffer on
    the caller's current stream, which is synchronised; the MPI call runs on the pinned buffer; the
    buffer is copied back on the same stream, which is synchronised. ``broadcast`` copies down on the
    root only and up elsewhere (``root_here``: this rank is the root). (Until issue 35's cut this
    sequence recorded an event and used two copy streams, as mpicomm then did: 8 CUDA calls.)
    """
    from mpi4py import MPI

    from ...gpu.staging import pinned_allocator

    nbytes = int(d.nbytes)
    host = pinned_allocator(nbytes).view(d.dtype)
    memcpy, hptr = cp.cuda.runtime.memcpyAsync, host.__array_interface__["data"][0]
    down, up = op != "broadcast" or root_here, op != "broadcast" or not root_here

    def call() -> None:
        dptr = d.data.ptr  # per call, as any code that is handed an array must read it
        stream = cp.cuda.get_current_stream()
        if down:
            memcpy(hptr, dptr, nbytes, 2, stream.ptr)
            stream.synchronize()
        if op == "broadcast":
            comm.Bcast(host, 0)
        else:
            comm.Allreduce(MPI.IN_PLACE, host, MPI.SUM)
        if up:
            memcpy(dptr, hptr, nbytes, 1, stream.ptr)
            stream.synchronize()

    return call


def _cost_calls(cp: Any, comm: Any, op: str, count: int, rank: int) -> dict[str, Callable[[], object]]:
    d, other, n = cp.ones(count, np.float32), cp.ones(count, np.float32), np.ones(count, np.float32)
    foreign = _Foreign(other)

    def mine(x: Any) -> Callable[[], object]:
        if op == "broadcast":
            return lambda: mpicomm.broadcast(x, src=0)
        return lambda: mpicomm.all_reduce(x)

    calls = {
        "mpicomm cupy": mine(d),
        "hand-written": hand_written(cp, comm, op, cp.ones(count, np.float32), rank == 0),
        "mpicomm foreign": mine(foreign),
        "mpicomm numpy": mine(n),
    }
    torch = importlib.import_module("torch") if importlib.util.find_spec("torch") else None
    if torch is not None and torch.cuda.is_available() and not getattr(cp, "IS_FAKE", False):
        calls["mpicomm torch"] = mine(torch.ones(count, dtype=torch.float32, device="cuda"))
    return calls


def cost_report(ctl: MPI.Intracomm, e: Env, args: argparse.Namespace) -> dict[str, Any]:
    """Time mpicomm's staged path against the hand-written sequence (see the module docstring)."""
    from ...front import device as front

    cp = importlib.import_module("cupy")
    if not getattr(cp, "IS_FAKE", False):
        bind_device()
    comm: Any = mpicomm.init().comm
    before = dict(front.PATHS)
    rows = []
    fake = bool(getattr(cp, "IS_FAKE", False))
    for op in ("all_reduce", "broadcast"):
        for size in COST_SIZES:
            calls = _cost_calls(cp, comm, op, size // 4, e.rank)
            times = _medians(ctl, calls, args)
            rows.append({"op": op, "size": size, "times": times, "cuda": _cuda_calls(calls) if fake else {}})
    staged = sum(v for (fn, path), v in front.PATHS.items() if path == "staged") - sum(
        v for (fn, path), v in before.items() if path == "staged"
    )
    return {"check": staged > 0, "ranks": e.n, "fake": fake, "rows": rows}


def _cuda_calls(calls: dict[str, Callable[[], object]]) -> dict[str, dict[str, int]]:
    """The CUDA runtime calls one (warm) call of each contender makes, by name: the fake cupy counts them."""
    tools = sys.modules["cupy._fake"]  # the fake's own controls (no such module in cupy)
    out = {}
    for name, call in calls.items():
        with tools.counting() as made:
            call()
        out[name] = dict(made)
    return out


def cost_lines(res: dict[str, Any]) -> str:
    """The staged-cost report as text: per call, mpicomm against the hand-written sequence."""
    head = ("op", "size/rank", "cupy", "hand-written", "cupy/hand", "foreign", "torch", "numpy")
    rows = [head]
    verdicts = []
    for r in res["rows"]:
        t = r["times"]
        ratio = t["mpicomm cupy"] / t["hand-written"]
        torch = fmt_time(t["mpicomm torch"]) if "mpicomm torch" in t else "-"
        rows.append(
            (
                r["op"],
                fmt_size(r["size"]),
                fmt_time(t["mpicomm cupy"]),
                fmt_time(t["hand-written"]),
                f"{ratio:.2f}",
                fmt_time(t["mpicomm foreign"]),
                torch,
                fmt_time(t["mpicomm numpy"]),
            )
        )
        if r["size"] == COST_SIZES[0]:
            ok = "reached" if ratio <= COST_RATIO else "NOT reached"
            verdicts.append(f"{ok:<13} {r['op']} 4 KiB staged <= {COST_RATIO}x hand-written ({ratio:.2f})")
            if "mpicomm torch" in t:
                extra = t["mpicomm torch"] - t["mpicomm cupy"]
                ok = "reached" if extra <= TORCH_EXTRA else "NOT reached"
                verdicts.append(f"{ok:<13} {r['op']} 4 KiB torch CUDA <= cupy + 5 us ({extra * 1e6:+.1f} us)")
    for r in res["rows"]:
        if r.get("cuda") and r["size"] == COST_SIZES[0]:
            made = {k: sum(v.values()) for k, v in r["cuda"].items() if k != "mpicomm numpy"}
            verdicts.append(
                f"CUDA calls in one {r['op']} of 4 KiB (the fake's count): "
                + ", ".join(f"{k.removeprefix('mpicomm ')} {v}" for k, v in made.items())
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    where = "the fake cupy (CPU emulation, not a GPU measurement)" if res["fake"] else "cupy on a GPU"
    return "\n".join(
        [
            f"gpu_cost: {res['ranks']} ranks, staged path on {where}; hand-written = the same copies and "
            "MPI call on the caller's stream, without mpicomm",
            *(line(row, widths) for row in rows),
            *verdicts,
        ]
    )
