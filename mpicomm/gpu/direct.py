"""The direct path: device pointers straight to a CUDA-aware MPI, for blocking data movement.

Used only where the MPI really handles device memory (Open MPI 4.1's CUDA build: blocking point-to-
point and blocking collectives; never non-blocking collectives or ``MPI_Reduce_local``), so only for
blocking MPI calls, and only for the calls that move data without arithmetic: ``broadcast``,
``all_gather_into_tensor``, ``all_to_all_single``, ``send`` and ``recv``. The three collectives serve
``async_op=True`` too, with the same blocking MPI call and a completed Work (:data:`COMPLETING`), so
the path, like the MPI calls, does not depend on ``async_op``. Reductions stay staged:
Open MPI's CUDA reductions copy through pageable host memory, unpipelined, which the staged pipeline
beats (docs/gpu.rst).

Each function makes the same MPI calls on the same communicator as the host implementation (for a call
longer than one chunk, first the question of :func:`mpicomm.core.chunks.split`, answered "one call"), so
ranks may mix paths and kinds within one call. It first waits for the caller's current stream (mpi4py
hands device pointers to MPI without any synchronisation). A non-contiguous output goes through a
contiguous device temporary that starts as a copy of the output, so elements MPI does not write (a
shorter message) keep their values. The in-place idiom of ``all_gather_into_tensor`` (the input is this
rank's slot of the output) is passed as ``MPI_IN_PLACE``, as the host path does. Anything unusual
(validation mode, a rank outside the group, an argument the host code would refuse, arguments whose
memory overlaps otherwise) returns ``NotImplemented``, and the staged path, which runs the host code on
host buffers with the same aliasing, serves the call or raises its error. Everything device-side goes
through the backend protocol (:mod:`mpicomm.gpu.backend`).
"""

from __future__ import annotations

from typing import Any

from .. import _mpi
from ..core import chunks, validation
from ..core.buffers import datatype
from ..core.groups import ProcessGroup, resolve, root_rank
from ..core.work import completed
from ..dense.alltoall import _counts, _row, _splits, _unsplit
from ..dense.p2p import _peer, _tag
from .backend import backend

__all__ = ["COMPLETING", "all_gather_into_tensor", "all_to_all_single", "broadcast", "recv", "send"]

#: The direct calls that serve ``async_op=True`` with their blocking MPI call, returning a completed Work.
COMPLETING = frozenset(("broadcast", "all_gather_into_tensor", "all_to_all_single"))


def _group(group: ProcessGroup | None, fn: str) -> ProcessGroup | None:
    if validation._Flag.on:
        return None
    g = resolve(group, fn)
    return g if g.comm is not None else None


def _ready(*inputs: Any) -> list[Any]:
    """Contiguous versions of ``inputs``, after the caller's current stream has finished its work."""
    be = backend()
    out = [be.contiguous(x) for x in inputs]
    be.current_stream().synchronize()
    return out


def _writable(out: Any) -> tuple[Any, Any]:
    """The buffer MPI writes (``out``, or a contiguous copy of it) and a function that finishes it."""
    if out.flags.c_contiguous:
        return out, lambda: None
    be = backend()
    tmp = be.contiguous(out)  # a copy: what MPI leaves alone keeps the output's values

    def back() -> None:
        stream = be.current_stream()
        be.copy(out, tmp, stream)
        stream.synchronize()

    return tmp, back


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
    buf, back = _writable(tensor)
    if g.rank() == root:
        (buf,) = _ready(tensor)
    else:
        _ready()
    if chunks.step(int(tensor.nbytes), tensor.itemsize):
        chunks.split(g.comm, False)  # the question every rank of a large call answers: one call here
    g.comm.Bcast([buf, datatype(tensor.dtype)], root)
    if g.rank() != root:
        back()
    return completed([tensor]) if async_op else None


def all_gather_into_tensor(
    output_tensor: Any, input_tensor: Any, group: ProcessGroup | None = None, async_op: bool = False
) -> Any:
    """``all_gather_into_tensor`` with device arrays handed to MPI."""
    g = _group(group, "all_gather_into_tensor")
    if g is None or output_tensor.dtype != input_tensor.dtype:
        return NotImplemented
    if output_tensor.size != g.size() * input_tensor.size:
        return NotImplemented
    dt = datatype(input_tensor.dtype)
    if _overlap(output_tensor, input_tensor):
        if not (_own_slot(output_tensor, input_tensor, g.rank())):
            return NotImplemented  # the staged path shows the host code the same aliasing
        _ready()
        g.comm.Allgather(_mpi.MPI.IN_PLACE, [output_tensor, dt])
        return completed([output_tensor]) if async_op else None
    out, back = _writable(output_tensor)
    (inp,) = _ready(input_tensor)
    g.comm.Allgather([inp, dt], [out, dt])
    back()
    return completed([output_tensor]) if async_op else None


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
    if unsplit and chunks.step(int(input.nbytes), input.itemsize, g.size()):
        chunks.split(g.comm, False)  # the question every rank of a large call answers: one call here
    out, back = _writable(output)
    (inp,) = _ready(input)
    dt = datatype(inp.dtype)
    if _unsplit(output_split_sizes) and _unsplit(input_split_sizes):
        g.comm.Alltoall([inp, dt], [out, dt])
    else:
        g.comm.Alltoallv([inp, _counts(in_rows, row), dt], [out, _counts(out_rows, row), dt])
    back()
    return completed([output]) if async_op else None


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
    (x,) = _ready(tensor)
    g.comm.Send([x, datatype(x.dtype)], peer, _tag(g, tag, "send"))
    return None


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
    _ready()
    status = _mpi.MPI.Status()
    g.comm.Recv([buf, datatype(tensor.dtype)], peer, _tag(g, tag, "recv"), status)
    back()
    return g.ranks[status.Get_source()]
