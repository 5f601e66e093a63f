"""Builders of the dense comparisons: each mpicomm collective against the raw mpi4py call it wraps."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

import mpicomm

from ... import _mpi

if TYPE_CHECKING:
    pass
from .harness import Buffers, Call, Contender, Env, _data, _noop


def _all_reduce(e: Env, c: int, who: str, m: Buffers) -> Contender:
    x = m.take("x", c, partial(_data, c, e.rank))
    if who == "mpicomm":
        return partial(mpicomm.all_reduce, x), [x]
    return partial(e.comm.Allreduce, _mpi.MPI.IN_PLACE, x), [x]


def _reduce(e: Env, c: int, who: str, m: Buffers) -> Contender:
    x = m.take("x", c, partial(_data, c, e.rank))
    if who == "mpicomm":
        return partial(mpicomm.reduce, x, 0), [x]
    if e.rank == 0:
        return partial(e.comm.Reduce, _mpi.MPI.IN_PLACE, x, _mpi.MPI.SUM, 0), [x]
    return partial(e.comm.Reduce, x, None, _mpi.MPI.SUM, 0), [x]


def _root_data(e: Env, c: int, m: Buffers) -> np.ndarray:
    return m.take("x", c, partial(_data, c, 0) if e.rank == 0 else None)


def _broadcast(e: Env, c: int, who: str, m: Buffers) -> Contender:
    x = _root_data(e, c, m)
    if who == "mpicomm":
        return partial(mpicomm.broadcast, x, 0), [x]
    return partial(e.comm.Bcast, x, 0), [x]


def _all_gather(e: Env, c: int, who: str, m: Buffers) -> Contender:
    x = m.take("x", c, partial(_data, c, e.rank))
    if who == "list":
        outs = [m.take(f"out{j}", c) for j in range(e.n)]
        return partial(mpicomm.all_gather, outs, x), outs
    out = m.take("out", e.n * c)
    if who == "tensor":
        return partial(mpicomm.all_gather_into_tensor, out, x), [out]
    return partial(e.comm.Allgather, x, out), [out]


def _reduce_scatter(e: Env, c: int, who: str, m: Buffers) -> Contender:
    out = m.take("out", c)
    if who == "list":
        return partial(mpicomm.reduce_scatter, out, m.chunks(e, c)), [out]
    if who == "tensor":
        return partial(mpicomm.reduce_scatter_tensor, out, m.joined(e, c)), [out]
    return partial(e.comm.Reduce_scatter_block, m.joined(e, c), out), [out]


def split_counts(total: int, n: int) -> np.ndarray:
    """Elements rank r sends to rank d: ``total`` split by the anchor weights ``1 + (r + 2d) mod n``.

    Example:
        >>> split_counts(10, 2).tolist()
        [[5, 5], [5, 5]]
        >>> split_counts(12, 3).tolist()
        [[2, 6, 4], [4, 2, 6], [6, 4, 2]]
    """
    r, d = np.arange(n)[:, None], np.arange(n)[None, :]
    weights = 1 + (r + 2 * d) % n
    counts = total * weights // weights.sum(axis=1, keepdims=True)
    counts[:, -1] += total - counts.sum(axis=1)
    return np.asarray(counts, dtype=np.int64)


def _all_to_all(e: Env, c: int, who: str, m: Buffers) -> Contender:
    counts = split_counts(c, e.n)
    sends, recvs = counts[e.rank].tolist(), counts[:, e.rank].tolist()
    inp = _data(c, e.rank)
    if who == "list":
        pieces = np.split(inp, np.cumsum(sends)[:-1])
        ins = [m.take(f"in{j}", p.size, p.copy) for j, p in enumerate(pieces)]
        outs = [m.take(f"out{j}", k) for j, k in enumerate(recvs)]
        return partial(mpicomm.all_to_all, outs, ins), outs
    inp, out = m.take("in", c, inp.copy), m.take("out", sum(recvs))
    if who == "single":
        return partial(mpicomm.all_to_all_single, out, inp, recvs, sends), [out]
    f = _mpi.MPI.FLOAT
    send, recv = [inp, (sends, _displs(sends)), f], [out, (recvs, _displs(recvs)), f]
    return partial(e.comm.Alltoallv, send, recv), [out]


def _displs(counts: list[int]) -> list[int]:
    return [0, *np.cumsum(counts)[:-1].tolist()]


def _gather(e: Env, c: int, who: str, m: Buffers) -> Contender:
    x, root = m.take("x", c, partial(_data, c, e.rank)), e.rank == 0
    if who == "mpicomm":
        outs = [m.take(f"out{j}", c) for j in range(e.n)] if root else None
        return partial(mpicomm.gather, x, outs, 0), outs or []
    out = m.take("out", e.n * c) if root else None
    return partial(e.comm.Gather, x, out, 0), [] if out is None else [out]


def _scatter(e: Env, c: int, who: str, m: Buffers) -> Contender:
    out, root = m.take("out", c), e.rank == 0
    if who == "mpicomm":
        return partial(mpicomm.scatter, out, m.chunks(e, c) if root else None, 0), [out]
    inp = m.joined(e, c) if root else None
    return partial(e.comm.Scatter, inp, out, 0), [out]


def _barrier(e: Env, c: int, who: str, m: Buffers) -> Contender:
    return partial(mpicomm.barrier if who == "mpicomm" else e.comm.Barrier), []


def _send_recv(e: Env, c: int, who: str, m: Buffers) -> Contender:
    """One round trip between world ranks 0 and 1 per call; the other ranks idle."""
    x = _root_data(e, c, m)
    peer = 1 - e.rank
    send: Call
    recv: Call
    if who == "mpicomm":
        send, recv = partial(mpicomm.send, x, peer), partial(mpicomm.recv, x, peer)
    else:
        send, recv = partial(e.comm.Send, x, peer), partial(e.comm.Recv, x, peer)
    first, second = (send, recv) if e.rank == 0 else (recv, send)

    def trip() -> None:
        first()
        second()

    return (trip if e.rank < 2 else _noop), [x]


def _torch_or_numpy(x: np.ndarray, who: str) -> tuple[Any, np.ndarray]:
    """``x`` as the contender ``who`` passes it: a torch tensor over the same memory, or ``x`` itself.

    Both contenders take the same buffers (see :class:`Buffers`): with buffers of their own, the
    torch rows at 1-16 MiB measured where the pages fell (0.88x to 1.56x in one day's runs), not the
    front door.
    """
    if who != "torch":
        return x, x
    import torch  # only when the torch comparisons run; mpicomm itself never imports torch

    return torch.from_numpy(x), x


def _all_reduce_kinds(e: Env, c: int, who: str, m: Buffers) -> Contender:
    """all_reduce on a torch CPU tensor against the same call on a numpy array (the front door's cost)."""
    t, x = _torch_or_numpy(m.take("x", c, partial(_data, c, e.rank)), who)
    return partial(mpicomm.all_reduce, t), [x]


def _all_to_all_kinds(e: Env, c: int, who: str, m: Buffers) -> Contender:
    """all_to_all_single with split sizes on torch CPU tensors against the same call on numpy arrays."""
    counts = split_counts(c, e.n)
    sends, recvs = counts[e.rank].tolist(), counts[:, e.rank].tolist()
    inp, _ = _torch_or_numpy(m.take("in", c, partial(_data, c, e.rank)), who)
    out, host = _torch_or_numpy(m.take("out", sum(recvs)), who)
    return partial(mpicomm.all_to_all_single, out, inp, recvs, sends), [host]


def _validated(e: Env, c: int, who: str, m: Buffers) -> Contender:
    """all_reduce with validation mode on (one small exchange per call) against validation off."""
    x = m.take("x", c, partial(_data, c, e.rank))
    if who == "numpy":
        return partial(mpicomm.all_reduce, x), [x]

    def checked() -> None:
        mpicomm.set_validation(True)
        try:
            mpicomm.all_reduce(x)
        finally:
            mpicomm.set_validation(False)

    return checked, [x]
