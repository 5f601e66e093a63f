"""The direct path: device pointers straight to a CUDA-aware MPI, for blocking data movement.

Used only where the MPI really handles device memory (Open MPI 4.1's CUDA build: blocking point-to-
point and blocking collectives; never non-blocking collectives or ``MPI_Reduce_local``), so only for
blocking MPI calls, and only for the calls that move data without arithmetic: ``broadcast``,
``all_gather_into_tensor``, ``all_to_all_single``, ``send`` and ``recv``. The three collectives serve
``async_op=True`` too (:data:`COMPLETING`): the same blocking MPI call, run on mpicomm's communication
thread after the caller's stream as it was at the call (:mod:`mpicomm.gpu.posted`), and a Work
returned at once; the path, like the MPI calls, does not depend on ``async_op``. Reductions stay staged:
Open MPI's CUDA reductions copy through pageable host memory, unpipelined, which the staged pipeline
beats (docs/gpu.rst).

Each function makes the same MPI calls on the same communicator as the host implementation (for a call
longer than one chunk, first the question of :func:`mpicomm.core.chunks.split`, answered "one call"), so
ranks may mix paths and kinds within one call. A blocking call first waits for the caller's current
stream (mpi4py hands device pointers to MPI without any synchronisation); an asynchronous one records
an event on it, which the engine waits for before the MPI call. A non-contiguous output goes through a
contiguous device temporary that starts as a copy of the output, so elements MPI does not write (a
shorter message) keep their values. The in-place idiom of ``all_gather_into_tensor`` (the input is this
rank's slot of the output) is passed as ``MPI_IN_PLACE``, as the host path does. Anything unusual
(validation mode, a rank outside the group, an argument the host code would refuse, arguments whose
memory overlaps otherwise) returns ``NotImplemented``, and the staged path, which runs the host code on
host buffers with the same aliasing, serves the call or raises its error. Everything device-side goes
through the backend protocol (:mod:`mpicomm.gpu.backend`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import _mpi
from ..core import algorithms, chunks, validation
from ..core.buffers import datatype
from ..core.groups import ProcessGroup, resolve, root_rank
from ..dense.alltoall import _counts, _row, _splits, _unsplit
from ..dense.p2p import _peer, _tag
from . import posted
from .backend import backend

__all__ = ["COMPLETING", "all_gather_into_tensor", "all_to_all_single", "broadcast", "recv", "send"]

#: The direct calls that serve ``async_op=True``: queued on mpicomm's communication thread (:mod:`.posted`).
COMPLETING = frozenset(("broadcast", "all_gather_into_tensor", "all_to_all_single"))


def _group(group: ProcessGroup | None, fn: str) -> ProcessGroup | None:
    if validation._Flag.on:
        return None
    g = resolve(group, fn)
    return g if g.comm is not None else None


def _contiguous(*inputs: Any) -> list[Any]:
    """Contiguous versions of ``inputs`` (copies queued on the caller's current stream)."""
    be = backend()
    return [be.contiguous(x) for x in inputs]


def _writable(out: Any) -> tuple[Any, Callable[[Any], None]]:
    """The buffer MPI writes (``out``, or a contiguous copy of it) and ``back(stream)``, which finishes it."""
    if out.flags.c_contiguous:
        return out, _nothing
    be = backend()
    tmp = be.contiguous(out)  # a copy: what MPI leaves alone keeps the output's values

    def back(stream: Any) -> None:
        be.copy(out, tmp, stream)
        stream.synchronize()

    return tmp, back


def _nothing(stream: Any) -> None:
    return None


def _serve(fn: str, g: ProcessGroup, async_op: bool, move: Callable[[Any], None], shown: Any) -> Any:
    """Run ``move(stream)`` (the MPI call, then copies back on ``stream``) now, or queue it on the engine.

    Blocking: after the caller's current stream has finished its work, on this thread, copies back on
    that stream. ``async_op``: the engine waits for the caller's stream as it is now, then runs it
    with copies back on the host-to-device copy stream (:func:`mpicomm.gpu.posted.post`); the Work
    shows ``shown``.
    """
    be = backend()
    if not async_op:
        stream = be.current_stream()
        stream.synchronize()  # mpi4py hands device pointers to MPI without any synchronisation
        move(stream)
        return None
    copy = be.copy_streams()[1]

    def job(producer: Any) -> None:
        producer.synchronize()
        move(copy)

    return posted.post(fn, g, job, [shown], posted.device_of(shown))


def _overlap(a: Any, b: Any) -> bool:
    """Whether two device arrays' address ranges meet."""
    be = backend()
    (a0, a1), (b0, b1) = be.span(a), be.span(b)
    return bool(a0 < b1 and b0 < a1)


def broadcast(
    tensor: Any,
    src: int | None = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Any:
    """``broadcast`` with the device array handed to MPI (``NotImplemented`` where not applicable)."""
    g = _group(group, "broadcast")
    if g is None:
        return NotImplemented
    root = root_rank(g, src, group_src, "broadcast", "src")
    back: Callable[[Any], None] = _nothing
    if g.rank() == root:
        (buf,) = _contiguous(tensor)
    else:
        buf, back = _writable(tensor)
    large = chunks.step(int(tensor.nbytes), tensor.itemsize)
    comm, dt = g.comm, datatype(tensor.dtype)

    def move(stream: Any) -> None:
        if large:
            chunks.split(comm, False)  # the question every rank of a large call answers: one call here
        with algorithms.large(algorithms.BCAST, int(tensor.nbytes)):  # as a host rank's C call
            comm.Bcast([buf, dt], root)
        back(stream)

    return _serve("broadcast", g, async_op, move, tensor)


def all_gather_into_tensor(
    output_tensor: Any, input_tensor: Any, group: ProcessGroup | None = None, async_op: bool = False
) -> Any:
    """``all_gather_into_tensor`` with device arrays handed to MPI."""
    fn = "all_gather_into_tensor"
    g = _group(group, fn)
    if g is None or output_tensor.dtype != input_tensor.dtype:
        return NotImplemented
    if output_tensor.size != g.size() * input_tensor.size:
        return NotImplemented
    comm, dt = g.comm, datatype(input_tensor.dtype)
    if _overlap(output_tensor, input_tensor):
        if not (_own_slot(output_tensor, input_tensor, g.rank())):
            return NotImplemented  # the staged path shows the host code the same aliasing

        def in_place(stream: Any) -> None:
            comm.Allgather(_mpi.MPI.IN_PLACE, [output_tensor, dt])

        return _serve(fn, g, async_op, in_place, output_tensor)
    out, back = _writable(output_tensor)
    (inp,) = _contiguous(input_tensor)

    def move(stream: Any) -> None:
        comm.Allgather([inp, dt], [out, dt])
        back(stream)

    return _serve(fn, g, async_op, move, output_tensor)


def _own_slot(out: Any, inp: Any, rank: int) -> bool:
    """Whether ``inp`` is exactly this rank's slot of the contiguous ``out`` (torch's in-place idiom)."""
    if not (out.flags.c_contiguous and inp.flags.c_contiguous):
        return False
    (o0, _), (i0, i1) = backend().span(out), backend().span(inp)
    return bool(i0 == o0 + rank * (i1 - i0) and i1 - i0 == int(inp.nbytes))


def all_to_all_single(
    output: Any,
    input: Any,
    output_split_sizes: Any = None,
    input_split_sizes: Any = None,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Any:
    """``all_to_all_single`` with device arrays handed to MPI (``Alltoall`` or ``Alltoallv``)."""
    fn = "all_to_all_single"
    g = _group(group, fn)
    if g is None or output.dtype != input.dtype:
        return NotImplemented
    try:
        row = _row(input, output, fn)
        out_rows = _splits(output_split_sizes, output, g.size(), fn, "output")
        in_rows = _splits(input_split_sizes, input, g.size(), fn, "input")
    except Exception:
        return NotImplemented  # the staged path runs the host checks and raises their error
    if out_rows[g.rank()] != in_rows[g.rank()] or _overlap(output, input):
        return NotImplemented  # the staged path runs the host code's checks on the same aliasing
    unsplit = _unsplit(output_split_sizes) and _unsplit(input_split_sizes)
    large = unsplit and chunks.step(int(input.nbytes), input.itemsize, g.size())
    out, back = _writable(output)
    (inp,) = _contiguous(input)
    comm, dt = g.comm, datatype(inp.dtype)
    if unsplit:
        send, recv = [inp, dt], [out, dt]
    else:
        send, recv = [inp, _counts(in_rows, row), dt], [out, _counts(out_rows, row), dt]

    def move(stream: Any) -> None:
        if large:
            chunks.split(comm, False)  # the question every rank of a large call answers: one call here
        if unsplit:
            comm.Alltoall(send, recv)
        else:
            comm.Alltoallv(send, recv)
        back(stream)

    return _serve(fn, g, async_op, move, output)


def send(
    tensor: Any,
    dst: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_dst: int | None = None,
) -> Any:
    """``send`` of a device array."""
    g = _group(group, "send")
    if g is None:
        return NotImplemented
    peer = _peer(g, dst, group_dst, "send", "dst", any_ok=False)
    (x,) = _contiguous(tensor)
    comm, t = g.comm, _tag(g, tag, "send")

    def move(stream: Any) -> None:
        comm.Send([x, datatype(x.dtype)], peer, t)

    return _serve("send", g, False, move, tensor)


def recv(
    tensor: Any,
    src: int | None = None,
    group: ProcessGroup | None = None,
    tag: int = 0,
    group_src: int | None = None,
) -> Any:
    """``recv`` into a device array; returns the sender's world rank."""
    g = _group(group, "recv")
    if g is None:
        return NotImplemented
    peer = _peer(g, src, group_src, "recv", "src", any_ok=True)
    buf, back = _writable(tensor)
    status = _mpi.MPI.Status()
    comm, t = g.comm, _tag(g, tag, "recv")

    def move(stream: Any) -> None:
        comm.Recv([buf, datatype(tensor.dtype)], peer, t, status)
        back(stream)

    _serve("recv", g, False, move, tensor)
    return g.ranks[status.Get_source()]
