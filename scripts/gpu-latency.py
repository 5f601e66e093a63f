"""Where a small staged call's time goes on a real GPU: CUDA primitives, then mpicomm's calls profiled.

Run ON the GPU machine at 2 ranks (any MPI), after ``scripts/gpu-window.sh setup``::

    . /tmp/venv-mpich/gpu-env.sh
    $MPIEXEC -n 2 $PYV -m mpi4py scripts/gpu-latency.py [--size 4096] [--calls 300] [--profile]

It prints, on rank 0: the cost of each CUDA primitive the staged path uses (stream lookup, event
record, a small asynchronous copy and the waits, each averaged over ``--calls``), then the time per
call of mpicomm's staged all_reduce, broadcast and all_gather_into_tensor on cupy arrays (and torch
CUDA tensors, where torch imports) against numpy arrays of the same size, and with ``--profile`` the
25 functions that took the most time of the all_reduce calls (cProfile, own time). A diagnostic for
developers; the benchmark harness (``python -m mpicomm.bench --device cuda``) gives the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import time
from collections.abc import Callable
from typing import Any

import cupy as cp
import numpy as np
from mpi4py import MPI

import mpicomm


def per_call(fn: Callable[[], Any], calls: int) -> float:
    """Microseconds per call of ``fn`` (after 10 warm-up calls), ranks in step."""
    for _ in range(10):
        fn()
    MPI.COMM_WORLD.Barrier()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def primitives(nbytes: int, calls: int) -> list[tuple[str, float]]:
    """The CUDA calls of one staged call, each timed alone."""
    dev = cp.ones(nbytes // 4, cp.float32)
    mem = cp.cuda.alloc_pinned_memory(nbytes)
    host = np.frombuffer(mem, np.uint8, nbytes)
    side = cp.cuda.Stream(non_blocking=True)
    cur = cp.cuda.get_current_stream()
    ev = cur.record()
    ev.synchronize()

    def copy_sync() -> None:
        cp.cuda.runtime.memcpyAsync(host.ctypes.data, dev.data.ptr, nbytes, 2, side.ptr)
        side.synchronize()

    def copy_event() -> None:
        cp.cuda.runtime.memcpyAsync(host.ctypes.data, dev.data.ptr, nbytes, 2, side.ptr)
        side.record().synchronize()

    def copy_query() -> None:
        cp.cuda.runtime.memcpyAsync(host.ctypes.data, dev.data.ptr, nbytes, 2, side.ptr)
        e = side.record()
        while not e.done:
            pass

    comm = MPI.COMM_WORLD
    pinned_out = np.frombuffer(cp.cuda.alloc_pinned_memory(nbytes), np.uint8, nbytes)
    page_in, page_out = np.zeros(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    other = cp.cuda.Stream(non_blocking=True)

    def by_hand(src: np.ndarray, dst: np.ndarray, mpi: bool, events: bool, down: Any, up: Any) -> None:
        if events:
            at = cur.record()
            down.wait_event(at)
            up.wait_event(at)
        if down is not None:
            cp.cuda.runtime.memcpyAsync(src.ctypes.data, dev.data.ptr, nbytes, 2, down.ptr)
            down.synchronize()
        if mpi:
            comm.Allreduce(src.view(np.float32), dst.view(np.float32))
        cp.cuda.runtime.memcpyAsync(dev.data.ptr, dst.ctypes.data, nbytes, 1, up.ptr)
        up.synchronize()

    variants = [
        ("down, up (no MPI)", (host, pinned_out, False, False, side, other)),
        ("events, down, up (no MPI)", (host, pinned_out, False, True, side, other)),
        ("down, up on one stream (no MPI)", (host, pinned_out, False, False, side, side)),
        ("events, down, up on one stream (no MPI)", (host, pinned_out, False, True, side, side)),
        ("down, up on the current stream (no MPI)", (host, pinned_out, False, False, cur, cur)),
        ("up only", (host, pinned_out, False, False, None, other)),
        ("down, Allreduce, up (pinned)", (host, pinned_out, True, False, side, other)),
        ("events, down, Allreduce, up (pinned)", (host, pinned_out, True, True, side, other)),
        ("events, down, Allreduce, up, one stream", (host, pinned_out, True, True, side, side)),
        ("down, Allreduce, up (pageable)", (page_in, page_out, True, False, side, other)),
    ]
    return [
        (
            "Allreduce on pinned host buffers",
            per_call(lambda: comm.Allreduce(host.view(np.float32), pinned_out.view(np.float32)), calls),
        ),
        *[(f"by hand: {name}", per_call(lambda args=args: by_hand(*args), calls)) for name, args in variants],
        ("get_current_stream", per_call(cp.cuda.get_current_stream, calls)),
        ("Event()", per_call(cp.cuda.Event, calls)),
        ("stream.record()", per_call(cur.record, calls)),
        ("side.wait_event(ev)", per_call(lambda: side.wait_event(ev), calls)),
        ("event.synchronize() (done)", per_call(ev.synchronize, calls)),
        ("idle stream.synchronize()", per_call(side.synchronize, calls)),
        ("device synchronize", per_call(cp.cuda.runtime.deviceSynchronize, calls)),
        (
            f"memcpyAsync D2H {nbytes} B only",
            per_call(
                lambda: cp.cuda.runtime.memcpyAsync(host.ctypes.data, dev.data.ptr, nbytes, 2, side.ptr),
                calls,
            ),
        ),
        (f"memcpyAsync D2H {nbytes} B + stream sync", per_call(copy_sync, calls)),
        (f"memcpyAsync D2H {nbytes} B + event sync", per_call(copy_event, calls)),
        (f"memcpyAsync D2H {nbytes} B + poll event.done", per_call(copy_query, calls)),
    ]


def torch_wraps(nbytes: int, calls: int) -> list[tuple[str, float]]:
    """What viewing a torch CUDA tensor as a cupy array costs, part by part."""
    import torch

    from mpicomm.front.kinds import torch_view

    t = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")

    def refused() -> None:
        with contextlib.suppress(TypeError):
            t.numpy()

    def unowned() -> Any:
        mem = cp.cuda.UnownedMemory(t.data_ptr(), t.nbytes, t, t.device.index)
        return cp.ndarray(tuple(t.shape), np.float32, cp.cuda.MemoryPointer(mem, 0))

    return [
        ("torch: t.numpy() refused", per_call(refused, calls)),
        ("torch: t.__cuda_array_interface__", per_call(lambda: t.__cuda_array_interface__, calls)),
        ("torch: cupy.asarray(t)", per_call(lambda: cp.asarray(t), calls)),
        ("torch: cupy.from_dlpack(t)", per_call(lambda: cp.from_dlpack(t), calls)),
        ("torch: UnownedMemory + ndarray", per_call(unowned, calls)),
        ("torch: torch.cuda.current_stream()", per_call(torch.cuda.current_stream, calls)),
        ("torch: mpicomm torch_view", per_call(lambda: torch_view(t, "f", "t", True), calls)),
    ]


def main() -> None:
    """Parse the arguments, time the primitives and the calls, print on rank 0."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096, help="bytes per rank (default 4096)")
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--profile", action="store_true", help="cProfile the staged all_reduce calls")
    a = ap.parse_args()
    mpicomm.init()
    rank = MPI.COMM_WORLD.rank
    n = MPI.COMM_WORLD.size
    say = print if rank == 0 else (lambda *_a, **_k: None)
    from mpicomm.gpu.cuda_aware import cuda_awareness

    say(f"gpu-latency: {n} ranks, {a.size} B, {a.calls} calls; {MPI.Get_library_version().splitlines()[0]}")
    say(f"path: {cuda_awareness()}")
    for name, us in primitives(a.size, a.calls):
        say(f"  {name:44} {us:9.1f} us")

    try:
        import torch

        if torch.cuda.is_available():
            for name, us in torch_wraps(a.size, a.calls):
                say(f"  {name:44} {us:9.1f} us")
    except ImportError:
        pass
    count = a.size // 4
    arrays: dict[str, Callable[[int], Any]] = {
        "numpy": lambda k: np.ones(k, np.float32),
        "cupy": lambda k: cp.ones(k, cp.float32),
    }
    try:
        import torch

        if torch.cuda.is_available():
            arrays["torch cuda"] = lambda k: torch.ones(k, dtype=torch.float32, device="cuda")
    except ImportError:
        pass
    for kind, make in arrays.items():
        x, big, other = make(count), make(count * n), make(count * n)
        calls = {
            "all_reduce": lambda x=x: mpicomm.all_reduce(x),
            "broadcast": lambda x=x: mpicomm.broadcast(x, src=0),
            "all_gather_into_tensor": lambda x=x, big=big: mpicomm.all_gather_into_tensor(big, x),
            "all_to_all_single": lambda big=big, other=other: mpicomm.all_to_all_single(other, big),
        }
        for name, fn in calls.items():
            say(f"  {kind:10} {name:24} {per_call(fn, a.calls):9.1f} us")
    if a.profile:
        x = cp.ones(count, cp.float32)
        prof = cProfile.Profile()
        MPI.COMM_WORLD.Barrier()
        prof.enable()
        for _ in range(a.calls):
            mpicomm.all_reduce(x)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(25)
        say(out.getvalue())


if __name__ == "__main__":
    main()
