"""Large element-wise collectives on device arrays, pipelined through two pinned host buffers.

``all_reduce``, ``broadcast``, ``reduce`` and ``all_to_all_single`` (equal splits) of at least two
chunks (``MPICOMM_STAGING_CHUNK``, 4 MiB by default; per block of all_to_all_single, whose chunks take a
1 / group size share) run chunk by chunk: chunk ``i + 1`` is copied down while MPI works on chunk
``i``, and chunk ``i`` is copied up while MPI works on chunk ``i + 1``, so the copies hide behind MPI.
Before a buffer is filled again, its previous upload must have finished (the ``freed`` events); before
the first download, the caller's stream must have reached the call. Each chunk runs the *host* implementation
on its host buffers, so float16 and bfloat16 (reduced in float32), AVG and PREMUL_SUM are the host
path's, chunk for chunk.

Whether the chunks go on the wire is asked of every rank first (:func:`mpicomm.core.chunks.split`):
only where every rank pipelines (all hold device arrays) does the message go in chunks; where any
rank holds host arrays (numpy, torch CPU), which never chunk (their speed), or takes another path,
every rank sends it in one call, and this rank stages it whole. So ranks may hold any kind and any
layout in one call. ``async_op`` plays no part in the MPI calls: an asynchronous call asks and
pipelines like a blocking one, on mpicomm's communication thread after the caller's stream as it
was at the call (:mod:`mpicomm.gpu.posted`), and returns at once; where a rank does not pipeline it
sends the message whole through the same buffers (one chunk). So ranks may differ in ``async_op``
too. A strided array goes through a contiguous device copy. ``reduce_scatter_tensor`` is not
pipelined. The order of the waits is checked on the CPU with the lazy fake cupy
(``tests/mpi/test_gpu_fakecupy.py``, ``tests/mpi/test_gpu_async_paths.py``), and on a GPU by
``tests/gpu`` (the asynchronous calls not yet).

Each function returns ``NotImplemented`` where it does not apply (small calls, a rank outside the
group, arguments the host code would refuse); the generic staged path then serves the call or raises
the host code's error. Where it asked every rank and heard "one call", it returns
:data:`mpicomm.core.chunks.ONE_CALL`: the staged path then runs the host call inside
:class:`mpicomm.core.chunks.answered`, which does not ask again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..core import chunks, validation
from ..core.engine import drain
from ..core.groups import ProcessGroup, resolve, root_rank
from ..core.reduce_op import ReduceOp
from ..core.work import completed
from ..dense import alltoall, reductions
from . import posted
from .direct import _overlap
from .staged import Staging
from .staging import ChunkPlan, plan_chunks

__all__ = ["all_reduce", "all_to_all_single", "broadcast", "reduce", "run_chunks"]


def _local(x: Any, group: ProcessGroup | None, fn: str, parts: int = 1) -> tuple[ProcessGroup, int] | Any:
    """The group and the chunk length if the call may be pipelined (no MPI call), else ``NotImplemented``.

    ``NotImplemented`` where nothing will be asked: the staged path serves the call as usual.
    """
    try:
        g = resolve(group, fn)
    except Exception:
        return NotImplemented  # the host code raises the error
    if g.comm is None:
        return NotImplemented
    step = chunks.step(int(x.nbytes), x.itemsize, parts)
    if not step:  # one chunk: not pipelined
        return NotImplemented
    return g, step


def _serve(
    fn: str,
    x: Any,
    group: ProcessGroup | None,
    async_op: bool,
    make: Callable[[], Callable[[ChunkPlan, Any], None]],
    shown: Any,
    parts: int = 1,
) -> Any:
    """Ask every rank whether the call is pipelined, then run it in chunks (or in one, asynchronously).

    ``make()`` prepares the call on the caller's thread (strided arrays made contiguous on its
    stream) and returns ``run(plan, producer)``, which pipelines it (``producer``: the event the
    copy streams wait for before the first download, or None for the caller's stream now).

    Blocking: asked here; where a rank does not pipeline (holds host arrays, or takes another path)
    it returns :data:`~mpicomm.core.chunks.ONE_CALL` and the staged path sends the message whole.
    ``async_op``: the question and the chunks run on mpicomm's communication thread after the
    caller's stream as it is now (:func:`mpicomm.gpu.posted.post`); where a rank does not pipeline,
    the message goes through the same buffers in one chunk, the host call inside
    :class:`~mpicomm.core.chunks.answered` (one call, as the staged path makes it). Either way the
    MPI calls do not depend on ``async_op``.

    ``parts``: ``x`` is cut in that many equal parts that move together, one chunk of each per step
    (``all_to_all_single``): the plan covers one part, with chunks of ``1 / parts`` of the chunk size.
    """
    found = _local(x, group, fn, parts)
    if type(found) is not tuple:
        return found
    if async_op and validation._Flag.on:  # validation mode: checked and exchanged at the call, here
        drain(None, fn)
        done = _serve(fn, x, group, False, make, shown, parts)
        return completed([shown]) if done is None else done
    g, step = found
    nbytes = int(x.nbytes) // parts
    if not async_op:
        if not chunks.split(g.comm, True):  # a rank holds host arrays (or takes another path): one call
            return chunks.ONE_CALL  # the staged call that follows sends it whole without asking again
        make()(plan_chunks(nbytes, x.itemsize, step), None)
        return None
    run = make()
    comm = g.comm

    def move(producer: Any) -> None:
        if chunks.split(comm, True):
            run(plan_chunks(nbytes, x.itemsize, step), producer)
            return
        with chunks.answered():  # the host call sends it whole and does not ask again
            run(plan_chunks(nbytes, x.itemsize, nbytes), producer)

    return posted.post(fn, g, move, [shown], posted.device_of(shown))


def _root(group: ProcessGroup | None, world: int | None, local: int | None, fn: str, arg: str) -> int | None:
    """The root's group rank, or None where the host code would refuse the arguments."""
    try:
        return root_rank(resolve(group, fn), world, local, fn, arg)
    except Exception:
        return None


def run_chunks(
    stage: Staging,
    plan: ChunkPlan,
    src: Any,
    dst: Any,
    step: Callable[[Any, Any], Any],
    parts: int = 1,
    down: bool = True,
    up: bool = True,
    out_parts: int = 1,
    at_call: Any = None,
) -> None:
    """Run ``step(host_in, host_out)`` chunk by chunk through two pooled host buffers.

    ``dst`` is cut in ``out_parts`` equal parts of ``m`` elements and ``src`` in ``parts`` parts of
    ``m``. Chunk ``c`` covers elements ``[a, b)`` of every part: part ``r`` of ``src`` is
    ``src[r * m + a : r * m + b]``, row ``r`` of ``host_in``; row ``r`` of ``host_out`` goes to
    ``dst[r * m + a : r * m + b]`` (rows of ``b - a`` elements, contiguous; a single part is passed
    as a 1-D array). Chunk ``c``: download (if ``down``) on the d2h stream, ``step`` on the host,
    upload of ``host_out`` (if ``up``) on the h2d stream; the download of chunk ``c + 1`` is queued
    before ``step`` runs on chunk ``c``.

    Args:
        stage: The call's staging (streams, backend and pool).
        plan: The chunks of ``dst``'s bytes.
        src: The 1-D contiguous device array read.
        dst: The 1-D contiguous device array written (``src`` itself for the in-place calls).
        step: The host work on one chunk: ``host_in`` (``parts`` rows) and ``host_out`` (1-D).
        parts: How many parts ``src`` has (the group size for all_to_all_single, else 1).
        down: Copy each chunk down before ``step``.
        up: Copy each chunk up after ``step``.
        out_parts: How many parts ``dst`` has (the group size for all_to_all_single, else 1).
        at_call: The event the copy streams wait for before the first copy (recorded on the
            caller's stream at the call), or None: the caller's current stream now.
    """
    be, d2h, h2d = stage.be, stage.d2h, stage.h2d
    size, m = dst.itemsize, dst.size // out_parts
    same = src is dst
    raws = [stage.pool.acquire(plan.buffer_bytes * parts) for _ in range(2)]
    raws += [] if same else [stage.pool.acquire(plan.buffer_bytes * out_parts) for _ in range(2)]
    ins = [raw.view(dst.dtype) for raw in raws[:2]]
    outs = ins if same else [raw.view(dst.dtype) for raw in raws[2:]]
    freed: list[Any] = [None, None]
    stage._queued = True  # from here a failure must wait for the copy streams before release
    try:
        if at_call is None:
            at_call = be.current_stream().record()
        d2h.wait_event(at_call)
        if up:
            h2d.wait_event(at_call)

        def start(i: int) -> Any:
            c = plan.chunks[i]
            a, b = c.start // size, c.stop // size
            if freed[c.buffer] is not None:
                d2h.wait_event(freed[c.buffer])
            if down:
                host = ins[c.buffer][: parts * (b - a)].reshape(parts, b - a)
                for r in range(parts):
                    be.to_host(host[r], src[r * m + a : r * m + b], d2h)
            return d2h.record()

        ready = start(0)
        for i, c in enumerate(plan.chunks):
            a, b = c.start // size, c.stop // size
            nxt = start(i + 1) if i + 1 < len(plan) else None
            ready.synchronize()
            host_in = ins[c.buffer][: parts * (b - a)].reshape(parts, b - a)
            host_out = outs[c.buffer][: out_parts * (b - a)].reshape(out_parts, b - a)
            step(host_in if parts > 1 else host_in[0], host_out if out_parts > 1 else host_out[0])
            if up:
                for r in range(out_parts):
                    be.to_device(dst[r * m + a : r * m + b], host_out[r], h2d)
            freed[c.buffer] = h2d.record()
            ready = nxt
        h2d.synchronize()
        stage._queued = False
    finally:
        stage._lent.extend(raws)
        stage.release()


def _runner(
    tensor: Any,
    step: Callable[[Any, Any], Any],
    down: bool,
    up: bool,
    out: Any = None,
    parts: int = 1,
    out_parts: int = 1,
) -> Callable[[ChunkPlan, Any], None]:
    """``run(plan, at_call)`` pipelining ``tensor`` (and the separate output ``out``), prepared here.

    Strided arrays go through contiguous copies, queued now on the caller's current stream.
    """
    stage = Staging()
    be = stage.be
    src = be.contiguous(tensor)
    src = src if src.ndim == 1 else src.reshape(-1)  # the common 1-D case: no view to make
    target = tensor if out is None else out
    if out is None:
        dst = src
    else:
        dst = out.reshape(-1) if out.flags.c_contiguous else be.empty(out.shape, out.dtype).reshape(-1)

    def run(plan: ChunkPlan, at_call: Any) -> None:
        run_chunks(stage, plan, src, dst, step, parts, down, up, out_parts, at_call)
        if up and not target.flags.c_contiguous:
            be.copy(target, dst.reshape(target.shape), stage.h2d)
            stage.h2d.synchronize()

    return run


def all_reduce(
    tensor: Any, op: ReduceOp = ReduceOp.SUM, group: ProcessGroup | None = None, async_op: bool = False
) -> Any:
    """``all_reduce`` of a large device array in pipelined chunks (see the module docstring)."""

    def make() -> Callable[[ChunkPlan, Any], None]:
        return _runner(tensor, lambda h, _o: reductions.all_reduce(h, op, group), True, True)

    return _serve("all_reduce", tensor, group, async_op, make, tensor)


def broadcast(
    tensor: Any,
    src: int | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Any:
    """``broadcast`` of a large device array in pipelined chunks (see the module docstring)."""
    root = _root(group, src, group_src, "broadcast", "src")
    if root is None:
        return NotImplemented
    g = resolve(group, "broadcast")
    mine, world_root = g.rank() == root, g.ranks[root]

    def step(h: Any, _o: Any) -> None:
        reductions.broadcast(h, world_root, group)

    def make() -> Callable[[ChunkPlan, Any], None]:
        return _runner(tensor, step, down=mine, up=not mine)

    return _serve("broadcast", tensor, group, async_op, make, tensor)


def reduce(
    tensor: Any,
    dst: int | None = None,
    op: ReduceOp = ReduceOp.SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Any:
    """``reduce`` of a large device array in pipelined chunks: only the destination's array is written."""
    root = _root(group, dst, group_dst, "reduce", "dst")
    if root is None:
        return NotImplemented
    g = resolve(group, "reduce")
    mine, world_root = g.rank() == root, g.ranks[root]

    def step(h: Any, _o: Any) -> None:
        reductions.reduce(h, world_root, op, group)

    def make() -> Callable[[ChunkPlan, Any], None]:
        return _runner(tensor, step, down=True, up=mine)

    return _serve("reduce", tensor, group, async_op, make, tensor)


def all_to_all_single(
    output: Any,
    input: Any,
    output_split_sizes: Any = None,
    input_split_sizes: Any = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Any:
    """``all_to_all_single`` with equal splits in pipelined chunks: each step moves one chunk of every block.

    Block ``j`` of the input (rows ``j * k`` to ``(j + 1) * k``, ``k`` = rows / group size) goes to
    rank ``j``; each chunk downloads the same columns of every block, runs the host call on a
    ``(group size, width)`` host array, and uploads each row to its block of the output. Uneven
    splits, overlapping arguments and shapes the host code would refuse take the generic staged path.
    """
    fn = "all_to_all_single"
    if output_split_sizes or input_split_sizes:
        return NotImplemented
    try:
        n = resolve(group, fn).size()
    except Exception:
        return NotImplemented
    if (
        output is input
        or input.dtype != output.dtype
        or input.ndim == 0
        or input.shape != output.shape
        or input.shape[0] % n
    ):
        return NotImplemented  # the host code serves the call or raises its error
    if _overlap(input, output):
        return NotImplemented  # overlapping memory: the staged path keeps the host code's aliasing rules

    def step(h: Any, o: Any) -> None:
        alltoall.all_to_all_single(o, h, group=group)

    def make() -> Callable[[ChunkPlan, Any], None]:
        return _runner(input, step, down=True, up=True, out=output, parts=n, out_parts=n)

    return _serve(fn, output, group, async_op, make, output, parts=n)
