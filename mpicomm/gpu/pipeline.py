"""Large element-wise collectives on device arrays, pipelined through two pinned host buffers.

For ``all_reduce`` and ``broadcast`` of at least two chunks (``MPICOMM_STAGING_CHUNK``, 4 MiB by
default), chunk ``i + 1`` is copied down while MPI works on chunk ``i``, and chunk ``i`` is copied up
while MPI works on chunk ``i + 1``, so the copies hide behind MPI. Before a buffer is filled again, its
previous upload must have finished (the ``freed`` events); before the first download, the caller's
stream must have reached the call. The order of these waits is checked on the CPU with a lazy stream
stand-in (``tests/unit/test_gpu_pipeline.py``), and on a GPU by the GPU suite.

Each function returns ``NotImplemented`` where it does not apply (asynchronous calls, small or
non-contiguous arrays, AVG and PREMUL_SUM, validation mode, a rank outside the group); the generic
staged path then serves the call.
"""

from __future__ import annotations

from typing import Any

from .. import _mpi
from ..core import validation
from ..core.buffers import datatype
from ..core.groups import ProcessGroup, resolve, root_rank
from ..core.reduce_op import ReduceOp
from .staged import Staging
from .staging import plan_chunks

__all__ = ["all_reduce", "broadcast", "run_chunks"]


def _applies(tensor: Any, async_op: bool, group: ProcessGroup | None, fn: str) -> ProcessGroup | None:
    if async_op or validation._Flag.on or not tensor.flags.c_contiguous:
        return None
    g = resolve(group, fn)
    if g.comm is None:
        return None
    if len(plan_chunks(int(tensor.nbytes), tensor.itemsize)) < 2:
        return None
    return g


def run_chunks(stage: Staging, flat: Any, step: Any, down: bool = True, up: bool = True) -> None:
    """Run ``step(host_chunk)`` over ``flat`` chunk by chunk through two pooled host buffers.

    Chunk ``i``: download (if ``down``) on the d2h stream, ``step`` on the host, upload (if ``up``)
    on the h2d stream; the download of chunk ``i + 1`` is queued before ``step`` runs on chunk ``i``.

    Args:
        stage: The call's staging (streams, backend and pool).
        flat: The 1-D contiguous device array.
        step: The MPI work on one host chunk (a 1-D view of a pinned buffer).
        down: Copy each chunk down before ``step``.
        up: Copy each chunk up after ``step``.
    """
    be, d2h, h2d = stage.be, stage.d2h, stage.h2d
    plan = plan_chunks(int(flat.nbytes), flat.itemsize)
    size = flat.itemsize
    raws = [stage.pool.acquire(plan.buffer_bytes) for _ in range(2)]
    bufs = [raw.view(flat.dtype) for raw in raws]
    freed: list[Any] = [None, None]
    try:
        d2h.wait_event(be.current_stream().record())
        if up:
            h2d.wait_event(be.current_stream().record())

        def start(i: int) -> Any:
            c = plan.chunks[i]
            a, b = c.start // size, c.stop // size
            if freed[c.buffer] is not None:
                d2h.wait_event(freed[c.buffer])
            if down:
                be.to_host(bufs[c.buffer][: b - a], flat[a:b], d2h)
            return d2h.record()

        ready = start(0)
        for i, c in enumerate(plan.chunks):
            a, b = c.start // size, c.stop // size
            nxt = start(i + 1) if i + 1 < len(plan) else None
            ready.synchronize()
            host = bufs[c.buffer][: b - a]
            step(host, a, b)
            if up:
                be.to_device(flat[a:b], host, h2d)
            freed[c.buffer] = h2d.record()
            ready = nxt
        h2d.synchronize()
    finally:
        for raw in raws:
            stage.pool.release(raw)


def all_reduce(
    tensor: Any, op: ReduceOp = ReduceOp.SUM, group: ProcessGroup | None = None, async_op: bool = False
) -> Any:
    """``all_reduce`` of a large device array in pipelined chunks (see the module docstring)."""
    if not isinstance(op, ReduceOp) or op.name in ("AVG", "PREMUL_SUM"):
        return NotImplemented
    g = _applies(tensor, async_op, group, "all_reduce")
    if g is None:
        return NotImplemented
    _, mop = op.mpi_op(tensor.dtype, "all_reduce")
    dt = datatype(tensor.dtype)
    comm = g.comm

    def step(host: Any, a: int, b: int) -> None:
        comm.Allreduce(_mpi.MPI.IN_PLACE, [host, dt], mop)

    run_chunks(Staging(), tensor.reshape(-1), step)
    return None


def broadcast(
    tensor: Any,
    src: int | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Any:
    """``broadcast`` of a large device array in pipelined chunks (see the module docstring)."""
    g = _applies(tensor, async_op, group, "broadcast")
    if g is None:
        return NotImplemented
    root = root_rank(g, src, group_src, "broadcast", "src")
    dt = datatype(tensor.dtype)
    comm, mine = g.comm, g.rank() == root

    def step(host: Any, a: int, b: int) -> None:
        comm.Bcast([host, dt], root)

    run_chunks(Staging(), tensor.reshape(-1), step, down=mine, up=not mine)
    return None
