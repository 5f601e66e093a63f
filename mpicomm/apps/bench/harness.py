"""Benchmark mpicomm against the raw mpi4py calls it wraps, timed interleaved in the same processes.

For each op and size: one correctness check (mpicomm's output against the baseline's), warm-up,
calibration of the calls per sample (to about --sample-time seconds, agreed by all ranks), then
--rounds samples per contender in alternating order (A B, B A, ...). Before each sample a quiet
gate waits until other processes leave the CPUs (--gate). A sample is seconds per call of k
back-to-back calls, max over ranks; the tables give the median. Sizes are bytes per rank of
float32 data. Bandwidths follow nccl-tests (GB/s = 1e9 B/s): busbw = algbw * 2(n-1)/n for
all_reduce; algbw over n * size and busbw = algbw * (n-1)/n for all_gather, reduce_scatter, gather
and scatter; busbw = algbw * (n-1)/n for the all-to-alls; busbw = algbw for broadcast and reduce;
send_recv gives size / (round trip / 2). See docs/benchmarks.rst for the method and results.

Example: mpiexec -n 2 python -m mpi4py -m mpicomm.bench --json bench.json --plot bench.png
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np

import mpicomm

from . import _mpi, jagged
from .jagged import jagged_all_to_all

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["main"]

#: Bytes per rank swept by default: the anchor sizes (8 B, 1 KiB, 64 KiB, 1, 16, 64 MiB) and between.
DEFAULT_SIZES = (8, 64, 1 << 10, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20)
MAX_REPS = 1_000_000
F32 = np.float32

Call = Callable[[], object]
#: A contender: the call to time and the arrays it writes, compared once between contenders.
Contender = tuple[Call, list[np.ndarray]]


@dataclass(frozen=True)
class Env:
    """What the builders need: the communicator the raw calls use, this rank and the world size."""

    comm: MPI.Intracomm
    rank: int
    n: int


def _data(count: int, rank: int, salt: int = 0) -> np.ndarray:
    """Small integer-valued float32 data, so that sums are exact in any order."""
    return ((np.arange(count, dtype=np.int32) + salt) % 7 + rank + 1).astype(F32)


class Buffers:
    """The arrays of one build: fresh test data for the check, or zeros shared by both contenders.

    Timing both contenders on the same memory matters: two separately allocated arrays gave the very
    same raw ``Allreduce`` times 0.66x to 1.6x apart at 1-16 MiB (page and cache placement), far more
    than the overhead measured here. Zeros keep in-place reductions finite however often they run.
    """

    def __init__(self, shared: bool) -> None:
        self.shared = shared
        self.arrays: dict[str, np.ndarray] = {}

    def take(self, key: str, count: int, fill: Callable[[], np.ndarray] | None = None) -> np.ndarray:
        """The array named ``key``: shared zeros when timing, else ``fill()`` (or new zeros)."""
        if not self.shared:
            return fill() if fill is not None else np.zeros(count, F32)
        a = self.arrays.get(key)
        if a is None or a.size != count:
            a = self.arrays[key] = np.zeros(count, F32)
        return a

    def chunks(self, e: Env, c: int) -> list[np.ndarray]:
        """One separately allocated input array per rank, as a user's list would be."""
        return [self.take(f"in{j}", c, partial(_data, c, e.rank, j)) for j in range(e.n)]

    def joined(self, e: Env, c: int) -> np.ndarray:
        """The same inputs as :meth:`chunks`, in one array."""
        return self.take("in", e.n * c, lambda: np.concatenate(Buffers(False).chunks(e, c)))


def _noop() -> None:
    return None


# Builders: (env, float32 elements per rank, contender, buffers) -> the call and the arrays it writes.


def _all_reduce(e: Env, c: int, who: str, m: Buffers) -> Contender:
    x = m.take("x", c, partial(_data, c, e.rank))
    if who == "mpicomm":
        return partial(mpicomm.all_reduce, x), [x]
    return partial(e.comm.Allreduce, _mpi.MPI.IN_PLACE, x), [x]


def _reduce(e: Env, c: int, who: str, m: Buffers) -> Contender:
    x = m.take("x", c, partial(_data, c, e.rank))
    if who == "mpicomm":
        return partial(mpicomm.reduce, x, dst=0), [x]
    if e.rank == 0:
        return partial(e.comm.Reduce, _mpi.MPI.IN_PLACE, x, root=0), [x]
    return partial(e.comm.Reduce, x, None, root=0), [x]


def _root_data(e: Env, c: int, m: Buffers) -> np.ndarray:
    return m.take("x", c, partial(_data, c, 0) if e.rank == 0 else None)


def _broadcast(e: Env, c: int, who: str, m: Buffers) -> Contender:
    x = _root_data(e, c, m)
    if who == "mpicomm":
        return partial(mpicomm.broadcast, x, src=0), [x]
    return partial(e.comm.Bcast, x, root=0), [x]


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
        return partial(mpicomm.gather, x, outs, dst=0), outs or []
    out = m.take("out", e.n * c) if root else None
    return partial(e.comm.Gather, x, out, root=0), [] if out is None else [out]


def _scatter(e: Env, c: int, who: str, m: Buffers) -> Contender:
    out, root = m.take("out", c), e.rank == 0
    if who == "mpicomm":
        return partial(mpicomm.scatter, out, m.chunks(e, c) if root else None, src=0), [out]
    inp = m.joined(e, c) if root else None
    return partial(e.comm.Scatter, inp, out, root=0), [out]


def _barrier(e: Env, c: int, who: str, m: Buffers) -> Contender:
    return partial(mpicomm.barrier if who == "mpicomm" else e.comm.Barrier), []


def _send_recv(e: Env, c: int, who: str, m: Buffers) -> Contender:
    """One round trip between world ranks 0 and 1 per call; the other ranks idle."""
    x = _root_data(e, c, m)
    peer = 1 - e.rank
    send: Call
    recv: Call
    if who == "mpicomm":
        send, recv = partial(mpicomm.send, x, dst=peer), partial(mpicomm.recv, x, src=peer)
    else:
        send, recv = partial(e.comm.Send, x, dest=peer), partial(e.comm.Recv, x, source=peer)
    first, second = (send, recv) if e.rank == 0 else (recv, send)

    def trip() -> None:
        first()
        second()

    return (trip if e.rank < 2 else _noop), [x]


# The jagged all-to-all: KJTAllToAll against the raw two-step (Alltoall of int64 counts, allocate,
# Alltoallv of the values). KEYS_PER_RANK keys go to each rank, JAG_STRIDE batch slots per key; rank
# r's values for rank d (split_counts, the anchor weights) spread over that rank's keys and slots.
KEYS_PER_RANK, JAG_STRIDE = 2, 2


def jagged_lengths(c: int, rank: int, n: int) -> np.ndarray:
    """Rank ``rank``'s lengths (key-major): its values for each destination over that rank's rows.

    Example:
        >>> jagged_lengths(10, 0, 1).tolist()
        [3, 3, 2, 2]
    """
    rows = KEYS_PER_RANK * JAG_STRIDE
    q, rem = np.divmod(split_counts(c, n)[rank], rows)
    lens: np.ndarray = q[:, None] + (np.arange(rows)[None, :] < rem[:, None])
    return lens.reshape(-1).astype(np.int64)


def reference_recat(lens: list[np.ndarray], vals: list[np.ndarray], nkeys: int) -> list[np.ndarray]:
    """Per-source received (lengths, values), key-major each, put in key-then-source order (a loop)."""
    out_l, out_v = [], []
    offs = [np.concatenate([[0], np.cumsum(x)]) for x in lens]
    for k in range(nkeys):
        for s, x in enumerate(lens):
            per = x.size // nkeys if nkeys else 0
            out_l.append(x[k * per : (k + 1) * per])
            out_v.append(vals[s][offs[s][k * per] : offs[s][(k + 1) * per]])
    return [np.concatenate(out_v or [np.empty(0, F32)]), np.concatenate(out_l or [np.empty(0, np.int64)])]


def _jagged(e: Env, c: int, who: str, m: Buffers) -> Contender:
    lens = jagged_lengths(c, e.rank, e.n)
    vals = m.take("in", c, partial(_data, c, e.rank))
    outs: list[np.ndarray] = []
    if who == "mpicomm":
        keys = [f"k{i}" for i in range(KEYS_PER_RANK * e.n)]
        kja, a2a = (
            mpicomm.KeyedJaggedArray(keys, vals, lengths=lens),
            mpicomm.KJTAllToAll([KEYS_PER_RANK] * e.n),
        )

        def call() -> None:
            got = a2a(kja).wait()
            if not m.shared:
                outs[:] = [got.values(), got.lengths()]

        return call, outs
    return _raw_two_step(e, c, vals, m, outs), outs


def _raw_two_step(e: Env, c: int, vals: np.ndarray, m: Buffers, outs: list[np.ndarray]) -> Call:
    sends = split_counts(c, e.n)[e.rank]
    sc, rc, sd = sends.copy(), np.empty(e.n, np.int64), _displs(sends.tolist())
    send = [vals, (sends.tolist(), sd), _mpi.MPI.FLOAT]
    i64 = _mpi.MPI.INT64_T

    def call() -> None:
        e.comm.Alltoall([sc, i64], [rc, i64])
        recvs = rc.tolist()
        out = np.empty(sum(recvs), F32)
        e.comm.Alltoallv(send, [out, (recvs, _displs(recvs)), _mpi.MPI.FLOAT])
        if not m.shared:  # the check only: put the rows in key-then-source order as a reference
            mine = [jagged_lengths(c, s, e.n).reshape(e.n, -1)[e.rank] for s in range(e.n)]
            outs[:] = reference_recat(mine, np.split(out, np.cumsum(recvs)[:-1]), KEYS_PER_RANK)

    return call


# The realistic shape: 256 keys, batch 512 per rank, Poisson(20) lengths from a shared seed,
# float32 values with float32 weights, keys split as evenly as possible over the ranks.
REAL_KEYS, REAL_BATCH, REAL_MEAN, REAL_SEED = 256, 512, 20, 2024


def realistic_input(rank: int, n: int) -> tuple[mpicomm.KeyedJaggedArray, list[int]]:
    """Rank ``rank``'s KeyedJaggedArray of the realistic shape and the keys per destination."""
    rng = np.random.default_rng([REAL_SEED, rank])
    lens = rng.poisson(REAL_MEAN, REAL_KEYS * REAL_BATCH).astype(np.int64)
    vals, wts = rng.random(int(lens.sum()), dtype=F32), rng.random(int(lens.sum()), dtype=F32)
    keys = [f"f{i}" for i in range(REAL_KEYS)]
    splits = [REAL_KEYS // n + (d < REAL_KEYS % n) for d in range(n)]
    return mpicomm.KeyedJaggedArray(keys, vals, lengths=lens, weights=wts), splits


@contextlib.contextmanager
def _placement(min_values: int | None) -> Any:
    """Force KJTAllToAll's small-data path (recat in wait()) when ``min_values`` is huge."""
    saved = jagged._Placement.min_values
    jagged._Placement.min_values = saved if min_values is None else min_values
    try:
        yield
    finally:
        jagged._Placement.min_values = saved


def _source_order(e: Env, kja: mpicomm.KeyedJaggedArray, splits: list[int]) -> list[np.ndarray]:
    """What arrives before the recat, in (source, key) order: lengths, values, weights, value counts."""
    rows = [s * kja.stride() for s in splits]
    got = jagged_all_to_all(kja.values(), kja.lengths(), rows)
    w = kja.weights()
    assert isinstance(got, jagged.JaggedResult) and w is not None
    wts = jagged_all_to_all(w, kja.lengths(), rows)
    assert isinstance(wts, jagged.JaggedResult)
    counts = [int(x.sum()) for x in np.split(got.lengths, np.cumsum(got.splits)[:-1])]
    return [got.lengths, got.values, wts.values, np.asarray(counts)]


def _realistic_check(e: Env, kja: mpicomm.KeyedJaggedArray, splits: list[int]) -> bool:
    """Both KJTAllToAll paths against a loop recat of what jagged_all_to_all delivers."""
    a2a = mpicomm.KJTAllToAll(splits)
    placed = a2a(kja).wait()
    with _placement(1 << 62):
        gathered = a2a(kja).wait()
    lens, vals, _, counts = _source_order(e, kja, splits)
    n_rows = np.cumsum([splits[e.rank] * REAL_BATCH] * e.n)[:-1]
    want = reference_recat(np.split(lens, n_rows), np.split(vals, np.cumsum(counts)[:-1]), splits[e.rank])
    ok = placed == gathered and np.array_equal(gathered.values(), want[0])
    return bool(ok and np.array_equal(gathered.lengths(), want[1]))


def _phases(e: Env, kja: mpicomm.KeyedJaggedArray, splits: list[int]) -> dict[str, Call]:
    """The calls timed: the whole exchange on each path, its count exchange, its recat, raw MPI."""
    a2a, g = mpicomm.KJTAllToAll(splits), mpicomm.init()
    a2a(kja).wait()  # the first call checks that the ranks agree on the splits
    header, me = a2a._counts(kja, *a2a._describe(kja))[0], e.rank
    lens, vals, wts, _ = _source_order(e, kja, splits)
    keys = kja.keys()[sum(splits[:me]) : sum(splits[: me + 1])]
    per_rank = np.full(e.n, kja.stride(), dtype=np.int64)

    def gather_path() -> None:
        with _placement(1 << 62):
            a2a(kja).wait()

    return {
        "placed": lambda: a2a(kja).wait(),
        "gather": gather_path,
        "counts": partial(jagged._exchange_header, g, header, "KJTAllToAll"),
        "recat": partial(jagged._recat, keys, lens, vals, wts, per_rank, None, a2a._plan.order),
        "raw": _raw_realistic(e, kja, header),
    }


def _raw_realistic(e: Env, kja: mpicomm.KeyedJaggedArray, header: np.ndarray) -> Call:
    """Raw mpi4py two-step of the same bytes: Alltoall of counts, then Alltoallv of each array."""
    sc = np.ascontiguousarray(header[:, [jagged._ROWS, jagged._VALUES]])
    rc, i64 = np.empty_like(sc), _mpi.MPI.INT64_T
    f32 = _mpi.MPI.FLOAT
    arrays = [(kja.lengths(), 0, i64), (kja.values(), 1, f32), (kja.weights_or_none(), 1, f32)]

    def call() -> None:
        e.comm.Alltoall([sc, 2, i64], [rc, 2, i64])
        for x, col, dt in arrays:
            assert x is not None
            s, r = sc[:, col].tolist(), rc[:, col].tolist()
            out = np.empty(sum(r), x.dtype)
            e.comm.Alltoallv([x, (s, _displs(s)), dt], [out, (r, _displs(r)), dt])

    return call


def _medians(ctl: MPI.Intracomm, fns: dict[str, Call], args: argparse.Namespace) -> dict[str, float]:
    """Median seconds per call of each function (max over ranks), rounds interleaved, order alternating."""
    for fn in fns.values():
        _timed(ctl, fn, 2)
    ks = {k: args.iters or calibrate(ctl, fn, args.sample_time) for k, fn in fns.items()}
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(args.rounds):
        for k in list(fns) if r % 2 == 0 else list(fns)[::-1]:
            quiet_gate(ctl, args.gate, args.gate_wait)
            times[k].append(_timed(ctl, fns[k], ks[k]))
    return {k: statistics.median(t) for k, t in times.items()}


def jagged_realistic(ctl: MPI.Intracomm, e: Env, args: argparse.Namespace) -> dict[str, Any]:
    """Time the realistic shape; split each path into count exchange, value exchange and recat.

    The split: ``counts`` is mpicomm's first step alone (the blocking int64 Alltoall with its
    fingerprint check), ``recat`` the gather path's reorder alone (``jagged._recat`` on data already
    in (source, key) order), and the value exchange is the rest of the whole call. The placed path
    (MPI writes each segment to its final place with indexed datatypes) has no recat step.
    """
    kja, splits = realistic_input(e.rank, e.n)
    ok = bool(ctl.allreduce(_realistic_check(e, kja, splits), op=_mpi.MPI.LAND))
    t = _medians(ctl, _phases(e, kja, splits), args)
    paths = {}
    for path, recat in (("placed", 0.0), ("gather", t["recat"])):
        total = t[path]
        values = total - t["counts"] - recat
        paths[path] = {"total": total, "counts": t["counts"], "values": values, "recat": recat}
        paths[path]["recat_share"] = recat / total
    nbytes = int(ctl.allreduce(kja.values().nbytes, op=_mpi.MPI.MAX))
    return {"check": ok, "ranks": e.n, "values_bytes_max": nbytes, "raw": t["raw"], "paths": paths}


def realistic_lines(res: dict[str, Any]) -> str:
    """The realistic shape's table and the recat target, as text."""
    head = ("path", "counts", "values", "recat", "total", "recat %", "raw 2-step", "total/raw")
    rows = [head]
    for name, p in res["paths"].items():
        cells = [fmt_time(p[k]) for k in ("counts", "values", "recat", "total")]
        ratio = f"{p['total'] / res['raw']:.3f}"
        rows.append((name, *cells, f"{100 * p['recat_share']:.1f}", fmt_time(res["raw"]), ratio))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    share = res["paths"]["placed"]["recat_share"]
    verdict = "reached" if share < 0.15 else "NOT reached"
    return "\n".join(
        [
            f"jagged_realistic: {REAL_KEYS} keys, batch {REAL_BATCH}/rank, Poisson({REAL_MEAN}) lengths, "
            f"float32 values + weights, {res['ranks']} ranks, check {'ok' if res['check'] else 'FAIL'}",
            *(line(r, widths) for r in rows),
            f"{verdict:<13} realistic shape recat < 15% of the call (default path {100 * share:.1f}%)",
        ]
    )


#: (algorithm bytes per byte of size per rank, busbw/algbw factor) as functions of the world size n.
BANDWIDTH: dict[str, tuple[Callable[[int], float], Callable[[int], float]]] = {
    "one": (lambda n: 1.0, lambda n: 1.0),
    "allreduce": (lambda n: 1.0, lambda n: 2 * (n - 1) / n),
    "alltoall": (lambda n: 1.0, lambda n: (n - 1) / n),
    "gather": (lambda n: float(n), lambda n: (n - 1) / n),
    "pingpong": (lambda n: 2.0, lambda n: 1.0),
}


@dataclass(frozen=True)
class Spec:
    """One benchmarked comparison: contender ``a`` against ``b`` (described by ``baseline``)."""

    build: Callable[[Env, int, str, Buffers], Contender]
    a: str
    b: str
    baseline: str
    bw: str = "one"
    sized: bool = True
    min_ranks: int = 1


#: The project's targets: (text, op, size, limit on the ratio); op None: every raw op at >= size.
TARGETS = (
    ("all_reduce 8 B <= 1.5x Allreduce", "all_reduce", 8, 1.5),
    ("every op at >= 1 MiB <= 1.03x raw mpi4py", None, 1 << 20, 1.03),
    ("list reduce_scatter <= 1.1x tensor form, 16 MiB", "reduce_scatter_list_vs_tensor", 16 << 20, 1.1),
    ("list all_gather <= 1.1x tensor form, 16 MiB", "all_gather_list_vs_tensor", 16 << 20, 1.1),
    ("jagged at >= 64 KiB <= 1.2x raw two-step", "jagged", 64 << 10, 1.2, True),
    ("jagged at 1 KiB <= 2x raw two-step", "jagged", 1 << 10, 2.0),
)

OPS: dict[str, Spec] = {
    "all_reduce": Spec(_all_reduce, "mpicomm", "mpi4py", "Allreduce(IN_PLACE)", "allreduce"),
    "broadcast": Spec(_broadcast, "mpicomm", "mpi4py", "Bcast"),
    "reduce": Spec(_reduce, "mpicomm", "mpi4py", "Reduce (IN_PLACE on root)"),
    "all_gather_into_tensor": Spec(_all_gather, "tensor", "mpi4py", "Allgather", "gather"),
    "all_gather": Spec(_all_gather, "list", "mpi4py", "Allgather into one array", "gather"),
    "reduce_scatter_tensor": Spec(_reduce_scatter, "tensor", "mpi4py", "Reduce_scatter_block", "gather"),
    "reduce_scatter": Spec(_reduce_scatter, "list", "mpi4py", "Reduce_scatter_block on one array", "gather"),
    "all_to_all_single": Spec(_all_to_all, "single", "mpi4py", "Alltoallv", "alltoall"),
    "all_to_all": Spec(_all_to_all, "list", "mpi4py", "Alltoallv on one array", "alltoall"),
    "gather": Spec(_gather, "mpicomm", "mpi4py", "Gather", "gather"),
    "scatter": Spec(_scatter, "mpicomm", "mpi4py", "Scatter", "gather"),
    "barrier": Spec(_barrier, "mpicomm", "mpi4py", "Barrier", sized=False),
    "send_recv": Spec(_send_recv, "mpicomm", "mpi4py", "Send/Recv ping-pong", "pingpong", min_ranks=2),
    "all_gather_list_vs_tensor": Spec(
        _all_gather, "list", "tensor", "mpicomm.all_gather_into_tensor", "gather"
    ),
    "reduce_scatter_list_vs_tensor": Spec(
        _reduce_scatter, "list", "tensor", "mpicomm.reduce_scatter_tensor", "gather"
    ),
    "jagged": Spec(_jagged, "mpicomm", "raw", "Alltoall counts, allocate, Alltoallv", "alltoall"),
    # A/A: the same raw call against itself on the same memory; its ratio is the harness's noise floor.
    "noise_floor": Spec(_all_reduce, "mpi4py", "mpi4py", "Allreduce(IN_PLACE) again (A/A)", "allreduce"),
}


#: Measurements that are not one A/B comparison per size, run after the sweep when named in --ops.
REPORTS = {
    "jagged_realistic": "KJTAllToAll, realistic shape: counts / values / recat split",
    "objects": "object collectives vs comm.bcast / pkl5 (mpicomm.bench_objects)",
    "planner": "GreedyPerfPartitioner: 10,000 options (100,000 shards) on 4,096 ranks, on rank 0",
}


@dataclass
class Point:
    """The measurement of one comparison at one size; times are seconds per call, max over ranks."""

    op: str
    size: int
    a: str
    b: str
    baseline: str
    check: bool
    reps_a: int
    reps_b: int
    samples_a: list[float]
    samples_b: list[float]
    quiet_a: list[bool]
    quiet_b: list[bool]
    alg_bytes: float
    bus_factor: float
    loadavg: list[float] = field(default_factory=list)

    @property
    def t_a(self) -> float:
        """Median seconds per call of contender A."""
        return statistics.median(self.samples_a)

    @property
    def t_b(self) -> float:
        """Median seconds per call of baseline B."""
        return statistics.median(self.samples_b)

    @property
    def ratio(self) -> float:
        """A's median time over B's (above 1: A is slower)."""
        return self.t_a / self.t_b

    def busbw(self, t: float) -> float | None:
        """Bus bandwidth in GB/s for a time per call, None for size-free ops."""
        return self.alg_bytes * self.bus_factor / t / 1e9 if self.size else None

    def record(self) -> dict[str, Any]:
        """Everything about the point, with the derived figures, for the JSON file."""
        paired = [a / b for a, b in zip(self.samples_a, self.samples_b, strict=True)]
        qa = [t for t, q in zip(self.samples_a, self.quiet_a, strict=True) if q]
        qb = [t for t, q in zip(self.samples_b, self.quiet_b, strict=True) if q]
        derived = {
            "t_a": self.t_a,
            "t_b": self.t_b,
            "ratio": self.ratio,
            "ratio_paired_median": statistics.median(paired),
            "ratio_quiet": statistics.median(qa) / statistics.median(qb) if qa and qb else None,
            "min_a": min(self.samples_a),
            "min_b": min(self.samples_b),
            "busbw_a": self.busbw(self.t_a),
            "busbw_b": self.busbw(self.t_b),
        }
        return {**asdict(self), **derived}


def _busy_jiffies() -> tuple[int, int]:
    """Busy and total CPU time of the whole machine, in jiffies, from /proc/stat; (0, 0) without it."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return sum(v) - v[3] - v[4], sum(v)  # idle and iowait are not busy


def quiet_gate(ctl: MPI.Intracomm, cores: float, wait: float) -> bool:
    """Wait until other processes use fewer than ``cores`` CPU cores; True if that happened in time.

    Every rank sleeps 0.1 s while rank 0 reads the machine's CPU use from /proc/stat, so whatever is
    busy then is someone else; this repeats for up to ``wait`` seconds. ``cores <= 0`` turns it off.
    """
    if cores <= 0:
        return True
    deadline = time.monotonic() + wait
    while True:
        b0, t0 = _busy_jiffies()
        time.sleep(0.1)
        b1, t1 = _busy_jiffies()
        used = (b1 - b0) / (t1 - t0) * (os.cpu_count() or 1) if t1 > t0 else 0.0
        quiet, late = ctl.bcast((used < cores, time.monotonic() > deadline), root=0)
        if quiet or late:
            return bool(quiet)


def _timed(ctl: MPI.Intracomm, fn: Call, k: int) -> float:
    """Seconds per call of ``k`` back-to-back calls, max over ranks, after a barrier."""
    ctl.Barrier()
    t0 = time.perf_counter()
    for _ in repeat(None, k):
        fn()
    elapsed = time.perf_counter() - t0
    return float(ctl.allreduce(elapsed / k, op=_mpi.MPI.MAX))


def calibrate(ctl: MPI.Intracomm, fn: Call, target: float) -> int:
    """Calls per sample so that a sample lasts about ``target`` seconds; the same on every rank.

    Every decision is taken on times already reduced with MAX over ranks, so all ranks loop the same
    number of times; the final count is agreed with one more MAX allreduce all the same.
    """
    k = 1
    while True:
        per_call = max(_timed(ctl, fn, k), 1e-9)
        if per_call * k >= target / 4 or k >= MAX_REPS:
            break
        k = min(MAX_REPS, max(2 * k, math.ceil(target / 4 / per_call)))
    k = min(MAX_REPS, max(1, math.ceil(target / per_call)))
    return int(ctl.allreduce(k, op=_mpi.MPI.MAX))


def check(ctl: MPI.Intracomm, a: Contender, b: Contender) -> bool:
    """Run each contender once on its own test data and compare outputs; the verdict is every rank's."""
    a[0]()
    b[0]()
    flat_a, flat_b = (np.concatenate([o.ravel() for o in x[1]] or [np.empty(0, F32)]) for x in (a, b))
    ok = bool(np.array_equal(flat_a, flat_b))
    return bool(ctl.allreduce(ok, op=_mpi.MPI.LAND))


def measure(ctl: MPI.Intracomm, env: Env, name: str, size: int, args: argparse.Namespace) -> Point:
    """Check, warm up, calibrate and time one comparison at one size (rounds alternate A B / B A)."""
    spec, c = OPS[name], size // 4
    ok = check(ctl, spec.build(env, c, spec.a, Buffers(False)), spec.build(env, c, spec.b, Buffers(False)))
    shared = Buffers(True)
    a, b = spec.build(env, c, spec.a, shared), spec.build(env, c, spec.b, shared)
    for fn in (a[0], b[0]):
        _timed(ctl, fn, 2)
    ka = args.iters or calibrate(ctl, a[0], args.sample_time)
    kb = args.iters or calibrate(ctl, b[0], args.sample_time)
    times: dict[str, list[float]] = {"a": [], "b": []}
    quiet: dict[str, list[bool]] = {"a": [], "b": []}
    for r in range(args.rounds):
        order = (("a", a[0], ka), ("b", b[0], kb))
        for key, fn, k in order if r % 2 == 0 else order[::-1]:
            quiet[key].append(quiet_gate(ctl, args.gate, args.gate_wait))
            times[key].append(_timed(ctl, fn, k))
    alg, bus = BANDWIDTH[spec.bw]
    meta = (name, size, spec.a, spec.b, spec.baseline, ok, ka, kb, times["a"], times["b"])
    return Point(*meta, quiet["a"], quiet["b"], alg(env.n) * size, bus(env.n), list(os.getloadavg()))


def fmt_time(t: float) -> str:
    """``2.3 µs``, ``1.25 ms``, ``0.31 s``."""
    for scale, unit in ((1e-6, "µs"), (1e-3, "ms")):
        if t < 1000 * scale:
            return f"{t / scale:.1f} {unit}" if t < 100 * scale else f"{t / scale:.0f} {unit}"
    return f"{t:.2f} s"


def fmt_size(nbytes: int) -> str:
    """``8 B``, ``64 KiB``, ``16 MiB``; ``-`` for size-free ops."""
    if nbytes == 0:
        return "-"
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def fmt_bw(bw: float | None) -> str:
    """GB/s with three significant digits, ``-`` when not defined."""
    return "-" if bw is None else f"{bw:.3g}"


def parse_size(text: str) -> int:
    """``"64KiB"``, ``"1M"``, ``"8"`` to bytes (binary units); a positive multiple of 4 (float32).

    Example:
        >>> parse_size("64KiB"), parse_size("1M"), parse_size("8")
        (65536, 1048576, 8)
    """
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"size {text!r}; expected e.g. 8, 1KiB, 64K, 16MiB")
    nbytes = int(m[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[m[2].upper()]
    if nbytes <= 0 or nbytes % 4:
        raise argparse.ArgumentTypeError(
            f"size {text!r} is {nbytes} bytes; expected a positive multiple of 4 (the data is float32)"
        )
    return nbytes


def _sizes(text: str) -> list[int]:
    return sorted({parse_size(s) for s in text.split(",") if s.strip()})


def _ops(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    for s in names:
        if s not in OPS and s not in REPORTS:
            known = ", ".join([*OPS, *REPORTS])
            raise argparse.ArgumentTypeError(f"unknown op {s!r}; expected some of: {known}")
    return names


SIZES_HELP = "comma-separated bytes per rank, binary units K, M, G (default 8,64,1K,4K,...,16M,64M)"
#: The timing options: flag, type, default, metavar, help.
OPTIONS = (
    ("--rounds", int, 8, "R", "samples per contender; even keeps A-first and B-first equal (default 8)"),
    ("--sample-time", float, 0.05, "S", "calibrate each sample to about S seconds (default 0.05)"),
    ("--iters", int, 0, "K", "fixed calls per sample instead of calibrating (default 0: calibrate)"),
    ("--gate", float, 0.3, "CORES", "before each sample wait until others use < CORES cores (0: off)"),
    ("--gate-wait", float, 1.0, "S", "sample anyway after waiting S seconds for the gate (default 1)"),
)


def _parser() -> argparse.ArgumentParser:
    ops = "\n".join(f"  {k:<30} A: {v.a:<8} B: {v.baseline}" for k, v in OPS.items())
    ops += "".join(f"\n  {k:<30} {v}" for k, v in REPORTS.items())
    p = argparse.ArgumentParser(
        prog="mpiexec -n N python -m mpi4py -m mpicomm.bench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__,
        epilog="ops (A: the mpicomm call, B: the baseline; ratio A/B above 1: mpicomm is slower):\n" + ops,
    )
    p.add_argument("--ops", type=_ops, default=[*OPS, *REPORTS], help="comma-separated ops (default all)")
    p.add_argument("--sizes", type=_sizes, default=list(DEFAULT_SIZES), help=SIZES_HELP)
    for flag, kind, default, metavar, text in OPTIONS:
        p.add_argument(flag, type=kind, default=default, metavar=metavar, help=text)
    p.add_argument("--json", metavar="FILE", help="write the results and the machine to FILE")
    p.add_argument("--plot", metavar="FILE.png", help="plot busbw against size (needs matplotlib)")
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse on every rank; only rank 0 (as the launcher numbers them, MPI is not needed) prints."""
    quiet = any(os.environ.get(v, "0") != "0" for v in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK"))
    sink = io.StringIO()
    with (
        contextlib.redirect_stdout(sink) if quiet else contextlib.nullcontext(),
        contextlib.redirect_stderr(sink) if quiet else contextlib.nullcontext(),
    ):
        args = _parser().parse_args(argv)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        if not quiet:
            print(
                "mpicomm.bench: --plot needs matplotlib; pip install matplotlib (or the 'plot' "
                "extra: pip install -e '.[plot]')",
                file=sys.stderr,
            )
        raise SystemExit(2)
    if args.rounds < 1 or args.sample_time <= 0 or args.iters < 0:
        raise SystemExit("mpicomm.bench: expected --rounds >= 1, --sample-time > 0, --iters >= 0")
    return args


def machine(ctl: MPI.Intracomm) -> dict[str, Any]:
    """Where the run happened: host, cores, CPU, OS, library versions, world size, load."""
    import mpi4py

    hosts = sorted(set(ctl.allgather(platform.node())))
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    env = {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "MPIR_CVAR", "MPICH_"))}
    return {
        "hostname": platform.node(),
        "hosts": hosts,
        "cores": os.cpu_count(),
        "cpu": cpu,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "mpi_library": " ".join(_mpi.library_version().split()),
        "mpi_standard": list(_mpi.MPI.Get_version()),
        "mpi4py": mpi4py.__version__,
        "numpy": np.__version__,
        "mpicomm": mpicomm.__version__,
        "world_size": ctl.Get_size(),
        "loadavg": list(os.getloadavg()),
        "env": env,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


HEAD = ("op", "size/rank", "A", "t A", "B", "t B", "busbw A", "busbw B", "A/B", "quiet", "check")
WIDTHS = (29, 9, 7, 8, 7, 8, 8, 8, 6, 5, 5)


def row(p: Point) -> tuple[str, ...]:
    """A point as table cells: times, busbw in GB/s, the ratio, quiet samples of all, the check."""
    quiet = f"{sum(p.quiet_a) + sum(p.quiet_b)}/{len(p.quiet_a) + len(p.quiet_b)}"
    t_a, t_b, check = fmt_time(p.t_a), fmt_time(p.t_b), "ok" if p.check else "FAIL"
    bw_a, bw_b = fmt_bw(p.busbw(p.t_a)), fmt_bw(p.busbw(p.t_b))
    return (p.op, fmt_size(p.size), p.a, t_a, p.b, t_b, bw_a, bw_b, f"{p.ratio:.3f}", quiet, check)


def line(cells: Sequence[str], widths: Sequence[int]) -> str:
    """Cells padded to the widths, two spaces apart."""
    return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()


def table(points: list[Point]) -> str:
    """The summary table, one row per point, columns as wide as their widest cell."""
    rows = [HEAD, *map(row, points)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEAD))]
    return "\n".join(line(r, widths) for r in rows)


def target(
    points: list[Point], text: str, op: str | None, size: int, limit: float, at_least: bool = False
) -> dict[str, Any]:
    """One target's verdict: the worst ratio among its points, and every point over the limit.

    ``op`` None: every op against raw mpi4py at >= ``size``; else that op at ``size`` (or above it
    with ``at_least``).
    """
    if op is None:
        got = [p for p in points if p.b == "mpi4py" and p.a != p.b and p.size >= size]
    else:
        got = [p for p in points if p.op == op and (p.size >= size if at_least else p.size == size)]
    worst = max(got, key=lambda p: p.ratio, default=None)
    return {
        "target": text,
        "limit": limit,
        "worst": None if worst is None else worst.ratio,
        "worst_at": None if worst is None else f"{worst.op} {fmt_size(worst.size)}",
        "missed": [f"{p.op} {fmt_size(p.size)} ({p.ratio:.3f})" for p in got if p.ratio > limit],
        "reached": None if worst is None else worst.ratio <= limit,
    }


def target_lines(goals: list[dict[str, Any]]) -> str:
    """Target verdicts as text."""
    lines = []
    for g in goals:
        verdict = {None: "not measured", True: "reached", False: "NOT reached"}[g["reached"]]
        worst = "" if g["worst"] is None else f" (worst {g['worst']:.3f} at {g['worst_at']})"
        lines.append(f"{verdict:<13} {g['target']}{worst}")
        lines.extend(f"{'':<13}   missed: {m}" for m in g["missed"])
    return "\n".join(lines)


def plot(points: list[Point], path: str, n: int) -> None:
    """Plot busbw against size for both contenders, one panel per op (matplotlib imported here only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [k for k in OPS if any(p.op == k and p.size for p in points)]
    cols = min(4, len(names)) or 1
    rows = max(1, math.ceil(len(names) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        pts = [p for p in points if p.op == name]
        xs = [p.size for p in pts]
        ax.plot(xs, [p.busbw(p.t_a) for p in pts], "o-", label=pts[0].a)
        ax.plot(xs, [p.busbw(p.t_b) for p in pts], "s--", label=pts[0].b)
        ax.set(xscale="log", yscale="log", title=name, xlabel="bytes per rank", ylabel="busbw GB/s")
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    fig.suptitle(f"mpicomm vs mpi4py, {n} ranks")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def sweep(ctl: MPI.Intracomm, env: Env, args: argparse.Namespace) -> list[Point]:
    """Measure every requested op at every requested size, printing one line per point on rank 0."""
    points: list[Point] = []
    if env.rank == 0:
        print(line(HEAD, WIDTHS), flush=True)
    for name in (k for k in args.ops if k in OPS):
        spec = OPS[name]
        if env.n < spec.min_ranks:
            if env.rank == 0:
                print(f"{name}: skipped, needs {spec.min_ranks} ranks", flush=True)
            continue
        for size in args.sizes if spec.sized else [0]:
            points.append(measure(ctl, env, name, size, args))
            if env.rank == 0:
                print(line(row(points[-1]), WIDTHS), flush=True)
    return points


def report(
    ctl: MPI.Intracomm,
    args: argparse.Namespace,
    info: dict[str, Any],
    points: list[Point],
    extra: dict[str, Any],
) -> None:
    """Print the table and the targets, write the JSON and the plot (rank 0 only)."""
    goals = [target(points, *t) for t in TARGETS]
    print("\n" + table(points) + "\n\n" + target_lines(goals), flush=True)
    if "jagged_realistic" in extra:
        print("\n" + realistic_lines(extra["jagged_realistic"]), flush=True)
    if "objects" in extra:
        from .bench_objects import objects_lines

        print("\n" + objects_lines(extra["objects"]), flush=True)
    if "planner" in extra:
        print("\n" + planner_line(extra["planner"]), flush=True)
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
        doc = {
            "machine": {**info, "loadavg_end": list(os.getloadavg())},
            "settings": settings,
            "points": [p.record() for p in points],
            "targets": goals,
            **extra,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        plot(points, args.plot, ctl.Get_size())
        print(f"wrote {args.plot}")


def _objects(ctl: MPI.Intracomm, e: Env, args: argparse.Namespace) -> dict[str, Any]:
    from .bench_objects import objects_report  # imported here: bench_objects imports this module

    return objects_report(ctl, e, args)


#: The planner's scale target: seconds of CPU time for the problem of ``measure_scale``'s defaults.
PLANNER_LIMIT = 2.0


def planner_scale(ctl: MPI.Intracomm, e: Env, args: argparse.Namespace) -> dict[str, Any]:
    """Time the planner on rank 0 (it needs no MPI; the other ranks wait in a barrier)."""
    from .planner.scale import measure_scale

    res: dict[str, Any] = {"check": True}
    if e.rank == 0:
        res = measure_scale()
        res["check"] = res["min_perf"] > 0
    ctl.Barrier()
    return res


def planner_line(res: dict[str, Any]) -> str:
    """One line: the planner's time and whether it is within :data:`PLANNER_LIMIT`."""
    verdict = "reached" if res["cpu_seconds"] < PLANNER_LIMIT else "NOT reached"
    return (
        f"planner: {res['shards']:,} shards of {res['options']:,} options on {res['world_size']:,} ranks in "
        f"{res['seconds']:.2f} s wall, {res['cpu_seconds']:.2f} s CPU (best of {res['repeat']}); "
        f"target < {PLANNER_LIMIT:g} s: {verdict}"
    )


REPORT_RUNS: dict[str, Callable[[MPI.Intracomm, Env, argparse.Namespace], dict[str, Any]]] = {
    "jagged_realistic": jagged_realistic,
    "objects": _objects,
    "planner": planner_scale,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns 1 if a correctness check failed, else 0."""
    args = parse_args(argv)
    world = mpicomm.init()
    mpicomm.set_validation(False)  # validation adds an allgather per call: not what we measure
    ctl = world.comm.Dup()  # barriers and time reductions stay off the measured communicator
    env = Env(world.comm, world.rank, world.size)
    info = machine(ctl)
    if env.rank == 0:
        print(
            f"mpicomm.bench: {env.n} ranks on {', '.join(info['hosts'])} ({info['cores']} cores), "
            f"{info['mpi_library']}, mpi4py {info['mpi4py']}, numpy {info['numpy']}, "
            f"load {info['loadavg'][0]:.2f}",
            flush=True,
        )
    points = sweep(ctl, env, args)
    extra = {k: fn(ctl, env, args) for k, fn in REPORT_RUNS.items() if k in args.ops}
    if env.rank == 0:
        report(ctl, args, info, points, extra)
    ctl.Free()
    checks = [p.check for p in points] + [x["check"] for x in extra.values()]
    if env.rank == 0:
        failed = checks.count(False)
        verdict = "all results checked" if not failed else f"{failed} check(s) FAILED"
        runs = f"{len(points)} comparison(s), {len(extra)} report(s) on {env.n} rank(s)"
        print(f"bench done: {runs}, {verdict}")
    return 0 if all(checks) else 1


if __name__ == "__main__":
    sys.exit(main())
