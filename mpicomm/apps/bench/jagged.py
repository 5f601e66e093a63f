"""The jagged comparisons: jagged_all_to_all against the raw two-step, KJTAllToAll at a realistic shape."""

from __future__ import annotations

import argparse
import contextlib
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

import mpicomm

from ... import _mpi
from ...jagged.exchange import jagged_all_to_all

if TYPE_CHECKING:
    from mpi4py import MPI
from ...jagged import kjt, repeat
from ...jagged import plan as kjt_plan
from ...jagged.exchange import JaggedResult
from .dense import _displs, split_counts
from .harness import F32, Buffers, Call, Contender, Env, _data, _medians, everywhere, fmt_time, largest
from .report import line

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
    saved = kjt._Placement.min_values
    kjt._Placement.min_values = saved if min_values is None else min_values
    try:
        yield
    finally:
        kjt._Placement.min_values = saved


def _source_order(e: Env, kja: mpicomm.KeyedJaggedArray, splits: list[int]) -> list[np.ndarray]:
    """What arrives before the recat, in (source, key) order: lengths, values, weights, value counts."""
    rows = [s * kja.stride() for s in splits]
    got = jagged_all_to_all(kja.values(), kja.lengths(), rows)
    w = kja.weights()
    assert isinstance(got, JaggedResult) and w is not None
    wts = jagged_all_to_all(w, kja.lengths(), rows)
    assert isinstance(wts, JaggedResult)
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
    a2a(kja).wait()  # the first call checks that the ranks agree on the splits and makes the plans
    lay, send = a2a._layout, a2a._send_plan(kja)
    i64 = _mpi.MPI.INT64_T

    def counts() -> tuple[Any, repeat.Arrived]:
        """KJTAllToAll's first step alone: the counts message, its exchange and its checks."""
        sent = repeat.sending(send, lay, kja)
        got = np.empty_like(sent.header)
        g.internal.Alltoall([sent.header, i64], [got, i64])
        recv = send.receive(lay, got, "KJTAllToAll")
        return recv, repeat.arriving(recv, lay, got, send.item_bytes, "KJTAllToAll")

    recv, arrived = counts()
    values_sk, total = arrived.values_sk, arrived.total
    lens, vals, wts, _ = _source_order(e, kja, splits)

    def recat() -> None:
        """The gather path's reorder alone, on data already in (source, key) order."""
        index = kjt_plan.value_index(values_sk, lay, total)
        lens[recv.row_index], vals[index], wts[index]

    def gather_path() -> None:
        with _placement(1 << 62):
            a2a(kja).wait()

    return {
        "placed": lambda: a2a(kja).wait(),
        "gather": gather_path,
        "counts": counts,
        "recat": recat,
        "raw": _raw_realistic(e, kja, splits),
    }


def _raw_realistic(e: Env, kja: mpicomm.KeyedJaggedArray, splits: list[int]) -> Call:
    """Raw mpi4py two-step of the same bytes: Alltoall of counts, then Alltoallv of each array."""
    bounds = np.concatenate([[0], np.cumsum(splits)]) * kja.stride()
    sc = np.stack([np.diff(bounds), np.diff(kja.offsets()[bounds])], axis=1).astype(np.int64)
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


def jagged_realistic(ctl: MPI.Intracomm, e: Env, args: argparse.Namespace) -> dict[str, Any]:
    """Time the realistic shape; split each path into count exchange, value exchange and recat.

    The split: ``counts`` is mpicomm's first step alone (the counts message, its blocking int64
    Alltoall and its checks), ``recat`` the gather path's reorder alone (the value index and the three
    gathers, on data already in (source, key) order), and the value exchange is the rest of the call.
    The placed path (MPI writes each segment to its final place with indexed datatypes) has no recat.
    """
    kja, splits = realistic_input(e.rank, e.n)
    ok = everywhere(ctl, bool(_realistic_check(e, kja, splits)))
    t = _medians(ctl, _phases(e, kja, splits), args)
    paths = {}
    for path, recat in (("placed", 0.0), ("gather", t["recat"])):
        total = t[path]
        values = total - t["counts"] - recat
        paths[path] = {"total": total, "counts": t["counts"], "values": values, "recat": recat}
        paths[path]["recat_share"] = recat / total
    nbytes = int(largest(ctl, kja.values().nbytes))
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
