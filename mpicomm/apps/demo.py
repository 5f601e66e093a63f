"""The mpicomm demo: every collective on small readable data, each result checked against numpy.

Run it on any number of ranks; one rank needs no launcher::

    mpirun -n 8 python -m mpi4py -m mpicomm.demo
    python -m mpicomm.demo

Every rank computes what each call must give from the inputs of all ranks, compares it with what
it got, and sends its rows to rank 0, which prints one table. The exit status is 0 when every
check passed on every rank, 1 otherwise.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import numpy as np

import mpicomm
from mpicomm import ReduceOp

from .demo_gpu import run_gpu

__all__ = ["CASES", "main", "run"]

#: What a call takes or gives on one rank: an array, a list of arrays, or nothing.
Data: TypeAlias = "np.ndarray | list[np.ndarray] | None"


@dataclass
class Step:
    """One rank's side of one call: what it sent, what it got, and what it should have got."""

    sent: Data
    got: Data
    want: Data
    note: str = ""
    detail: list[str] = field(default_factory=list)  # text lines shown after the table


Case: TypeAlias = Callable[[int, int], Step]

# torch's all_to_all_single docstring example (four ranks): rows rank i sends to rank j.
_TORCH_SPLITS = [[2, 2, 1, 1], [3, 2, 2, 2], [2, 1, 1, 1], [2, 2, 2, 1]]


def _pair(r: int) -> np.ndarray:
    """Rank r's input to the reductions, ``[r + 1, 2 (r + 1)]``."""
    return np.array([r + 1.0, 2.0 * (r + 1)])


def _chunk(j: int) -> np.ndarray:
    """The j-th of the consecutive runs ``[1, 2], [3, 4, 5], [6, 7, 8, 9], ...`` (j + 2 numbers)."""
    start = j * (j + 3) // 2 + 1
    return np.arange(start, start + j + 2)


def _weight(r: int, w: int) -> int:
    """Rank r's factor in reduce_scatter: 10**r on 2 ranks (torch's example), r + 1 on more."""
    return 10**r if w <= 2 else r + 1


def _splits(w: int) -> list[list[int]]:
    """Rows rank i sends to rank j in all_to_all_single: torch's example on 4 ranks, else with zeros."""
    return _TORCH_SPLITS if w == 4 else [[(i + j + 1) % 3 for j in range(w)] for i in range(w)]


def _all_reduce(op: ReduceOp, ref: Callable[[np.ndarray], np.ndarray], ints: bool = False) -> Case:
    """A case running all_reduce with ``op``; ``ref`` reduces the stacked inputs of all ranks."""

    def make(r: int) -> np.ndarray:
        return np.array([r + 1]) if ints else _pair(r)

    def case(r: int, w: int) -> Step:
        x = make(r)
        sent = x.copy()
        mpicomm.all_reduce(x, op=op)
        return Step(sent, x, ref(np.stack([make(q) for q in range(w)])))

    return case


def _all_reduce_async(r: int, w: int) -> Step:
    x = _pair(r)
    sent = x.copy()
    work = mpicomm.all_reduce(x, op=ReduceOp.AVG, async_op=True)
    done = work is not None and work.wait()
    return Step(sent, x if done else None, np.mean([_pair(q) for q in range(w)], axis=0))


def _broadcast(r: int, w: int) -> Step:
    src = w - 1
    want = np.arange(3) + 10 * src
    x = want.copy() if r == src else np.zeros(3, dtype=want.dtype)
    mpicomm.broadcast(x, src=src)
    return Step(want if r == src else None, x, want)


def _all_gather(r: int, w: int) -> Step:
    out = [np.empty(j + 2, dtype=np.int64) for j in range(w)]
    mpicomm.all_gather(out, _chunk(r))
    return Step(_chunk(r), out, [_chunk(j) for j in range(w)])


def _all_gather_into_tensor(r: int, w: int) -> Step:
    x = np.array([1 + 2 * r, 2 + 2 * r])
    out = np.empty((w, 2), dtype=x.dtype)
    mpicomm.all_gather_into_tensor(out, x)
    return Step(x, out, np.arange(1, 2 * w + 1).reshape(w, 2))


def _reduce_scatter(r: int, w: int) -> Step:
    ins = [_weight(r, w) * _chunk(j) for j in range(w)]
    out = np.empty(r + 2, dtype=np.int64)
    mpicomm.reduce_scatter(out, ins)
    return Step(ins, out, sum(_weight(q, w) for q in range(w)) * _chunk(r))


def _reduce_scatter_tensor(r: int, w: int) -> Step:
    x = np.arange(2 * w)
    out = np.empty(2, dtype=x.dtype)
    mpicomm.reduce_scatter_tensor(out, x)
    return Step(x, out, w * np.arange(2 * r, 2 * r + 2))


def _all_to_all_single(r: int, w: int) -> Step:
    s = _splits(w)
    inputs = [10 * i + np.arange(sum(s[i])) for i in range(w)]
    out_splits = [s[i][r] for i in range(w)]
    out = np.empty(sum(out_splits), dtype=inputs[r].dtype)
    mpicomm.all_to_all_single(out, inputs[r], out_splits, s[r])
    want = [inputs[i][sum(s[i][:r]) : sum(s[i][: r + 1])] for i in range(w)]
    return Step(inputs[r], out, np.concatenate(want))


def _gather(r: int, w: int) -> Step:
    dst = w - 1
    x = np.full(r + 1, r)
    out = [np.empty(j + 1, dtype=x.dtype) for j in range(w)] if r == dst else None
    mpicomm.gather(x, out, dst=dst)
    return Step(x, out, [np.full(j + 1, j) for j in range(w)] if r == dst else None)


def _scatter(r: int, w: int) -> Step:
    parts = [10 * j + np.arange(j + 1) for j in range(w)]
    out = np.empty(r + 1, dtype=parts[0].dtype)
    mpicomm.scatter(out, parts if r == 0 else None, src=0)
    return Step(parts if r == 0 else None, out, parts[r])


def _reduce(r: int, w: int) -> Step:
    x = _pair(r)
    sent = x.copy()
    mpicomm.reduce(x, dst=0, op=ReduceOp.PRODUCT)
    want = np.prod([_pair(q) for q in range(w)], axis=0)
    return Step(sent, x if r == 0 else None, want if r == 0 else None)


def _ring(r: int, w: int) -> Step:
    if w == 1:
        return Step(None, None, None, note="needs 2 ranks")
    got = np.empty(1, dtype=np.int64)
    pending = mpicomm.irecv(got, src=(r - 1) % w)
    mpicomm.send(np.array([r]), dst=(r + 1) % w)
    source = pending.source_rank() if pending is not None else -1
    return Step(np.array([r]), got if source == (r - 1) % w else None, np.array([(r - 1) % w]))


def _halo(r: int, w: int) -> Step:
    from .halo import check

    mine, want = check(24, 32, steps=50)
    return Step(np.array(mine.shape), mine, want, note="24x32 grid, 50 steps; this rank's block")


def _device_mesh(r: int, w: int) -> Step:
    shape = (2, w // 2) if w % 2 == 0 else (1, w)
    mesh = mpicomm.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    x = np.array([float(r)])
    try:
        mpicomm.all_reduce(x, group=mesh.get_group("dp"))  # the ranks in this rank's column
    finally:
        for group in mesh.get_all_groups():
            mpicomm.destroy_process_group(group)
    column = np.arange(w).reshape(shape)[:, r % shape[1]]
    return Step(np.array([float(r)]), x, np.array([float(column.sum())]), note=f"mesh {shape}, dp group")


def _barrier(r: int, w: int) -> Step:
    mpicomm.barrier()
    return Step(None, None, None)


# KJTAllToAll: torchrec's docstring example on 2 ranks (keys A, B, C, splits [2, 1], 3 batch slots);
# on other world sizes, every rank gets consecutive keys (some none) and the batch differs per rank.
_SEED_LENGTHS = [[[1, 0, 2], [0, 1, 1], [1, 1, 0]], [[1, 1, 0], [0, 1, 2], [1, 1, 0]]]


def _kjt_splits(w: int) -> list[int]:
    """Keys per rank: [3] on 1 rank, [2, 1] on 2 (the seed example), else 2, 0, 1, 2, 0, 1, ..."""
    return {1: [3], 2: [2, 1]}.get(w) or [(2, 0, 1)[d % 3] for d in range(w)]


def _kjt_lengths(r: int, w: int) -> np.ndarray:
    """Rank r's lengths, one row per key, one column per batch slot (the seed's on 2 ranks)."""
    if w == 2:
        return np.array(_SEED_LENGTHS[r])
    keys, stride = sum(_kjt_splits(w)), 3 if w == 1 else 2 + r % 2
    return (r + 2 * np.arange(keys)[:, None] + np.arange(stride)[None, :]) % 3


def _kjt_input(r: int, w: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Rank r's keys, lengths (key by slot) and values: key k counts on from 100 (k + 1) over ranks."""
    lens = [_kjt_lengths(q, w) for q in range(w)]
    before = sum(x.sum(axis=1) for x in lens[:r]) if r else np.zeros(len(lens[0]), dtype=np.int64)
    values = [100 * (k + 1) + before[k] + np.arange(n) for k, n in enumerate(lens[r].sum(axis=1))]
    keys = [chr(ord("A") + k) for k in range(len(lens[r]))]
    return keys, lens[r], np.concatenate(values)


def _kjt_expected(r: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """Rank r's output by numpy: its keys, each with the slots of rank 0, then rank 1, ..."""
    first = sum(_kjt_splits(w)[:r])
    out_l, out_v = [], []
    for k in range(first, first + _kjt_splits(w)[r]):
        for q in range(w):
            _, lens, vals = _kjt_input(q, w)
            start = int(lens[:k].sum())
            out_l.append(lens[k])
            out_v.append(vals[start : start + int(lens[k].sum())])
    empty = np.empty(0, dtype=np.int64)
    return np.concatenate(out_l or [empty]), np.concatenate(out_v or [empty])


def _kjt_table(kja: mpicomm.KeyedJaggedArray) -> list[str]:
    """The KeyedJaggedArray's table without its heading line ("(no keys)" for none)."""
    return repr(kja).splitlines()[1:] or ["(no keys)"]


def _kjt(r: int, w: int) -> Step:
    keys, lens, vals = _kjt_input(r, w)
    kja = mpicomm.KeyedJaggedArray(keys, vals, lengths=lens.reshape(-1))
    out = mpicomm.KJTAllToAll(_kjt_splits(w))(kja).wait()
    want_l, want_v = _kjt_expected(r, w)
    stride_ok = out.stride() == sum(_kjt_lengths(q, w).shape[1] for q in range(w))
    got = [out.lengths(), out.values()] if stride_ok else None
    detail = [*_kjt_table(kja), "->", *_kjt_table(out)]
    return Step([lens.reshape(-1), vals], got, [want_l, want_v], detail=detail)


#: The configuration rank 0 broadcasts in the object cases.
_CONFIG = {"name": "demo", "lr": 0.01, "steps": 100, "layers": [64, 32]}


def _config_numbers(config: object) -> np.ndarray | None:
    """The numbers of a configuration dict, to check it like the arrays of the other cases."""
    if not isinstance(config, dict):
        return None
    return np.array([config["lr"], config["steps"], *config["layers"]], dtype=float)


def _broadcast_object_list(r: int, w: int) -> Step:
    objs: list[object] = [dict(_CONFIG)] if r == 0 else [None]
    before = repr(objs)
    mpicomm.broadcast_object_list(objs, src=0)
    want = _config_numbers(_CONFIG)
    return Step(want if r == 0 else None, _config_numbers(objs[0]), want, detail=[before, "->", repr(objs)])


def _summary(r: int) -> dict[str, object]:
    """Rank r's summary: what it holds after the reductions above."""
    x = _pair(r)
    return {"rank": r, "sum": float(x.sum()), "max": float(x.max())}


def _gather_object(r: int, w: int) -> Step:
    out: list[object] | None = [None] * w if r == 0 else None
    mine = _summary(r)
    mpicomm.gather_object(mine, out, dst=0)
    own = np.array([mine["sum"]], dtype=float)
    if out is None:
        return Step(own, None, None, detail=[repr(mine), "->", "-"])
    got = np.array([o["sum"] if isinstance(o, dict) else np.nan for o in out], dtype=float)
    want = np.array([_summary(q)["sum"] for q in range(w)], dtype=float)
    return Step(own, got, want, detail=[repr(mine), "->", *map(repr, out)])


CASES: list[tuple[str, Case]] = [
    ("all_reduce SUM", _all_reduce(ReduceOp.SUM, lambda a: a.sum(0))),
    ("all_reduce AVG", _all_reduce(ReduceOp.AVG, lambda a: a.mean(0))),
    ("all_reduce MAX", _all_reduce(ReduceOp.MAX, lambda a: a.max(0))),
    ("all_reduce PREMUL_SUM(0.5)", _all_reduce(ReduceOp.PREMUL_SUM(0.5), lambda a: 0.5 * a.sum(0))),
    ("all_reduce BXOR (int64)", _all_reduce(ReduceOp.BXOR, np.bitwise_xor.reduce, ints=True)),
    ("all_reduce AVG async_op", _all_reduce_async),
    ("broadcast src=last", _broadcast),
    ("all_gather (uneven)", _all_gather),
    ("all_gather_into_tensor", _all_gather_into_tensor),
    ("reduce_scatter (uneven)", _reduce_scatter),
    ("reduce_scatter_tensor", _reduce_scatter_tensor),
    ("all_to_all_single (splits)", _all_to_all_single),
    ("gather dst=last (uneven)", _gather),
    ("scatter src=0 (uneven)", _scatter),
    ("reduce PRODUCT dst=0", _reduce),
    ("irecv/send ring r-1 -> r", _ring),
    ("halo exchange (Jacobi, sendrecv)", _halo),
    ("DeviceMesh dp x tp: all_reduce on dp", _device_mesh),
    ("barrier", _barrier),
    ("KJTAllToAll (keyed jagged)", _kjt),
    ("broadcast_object_list (config)", _broadcast_object_list),
    ("gather_object dst=0 (summaries)", _gather_object),
]


def _equal(got: Data, want: Data) -> bool:
    """Whether a result matches its reference: same structure and shapes, equal values."""
    if isinstance(got, list) or isinstance(want, list):
        return (
            isinstance(got, list)
            and isinstance(want, list)
            and len(got) == len(want)
            and all(_equal(g, x) for g, x in zip(got, want, strict=True))
        )
    if got is None or want is None:
        return got is None and want is None
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=1e-12, atol=0))


def _items(items: list[str], head: int, tail: int) -> str:
    """``[a, b, ..., z]``: the first ``head`` and last ``tail`` items of a long list."""
    if len(items) > head + tail + 1:
        items = [*items[:head], "...", *items[-tail:]]
    return "[" + ", ".join(items) + "]"


def _number(v: object) -> str:
    """A number as short text: whole floats without a decimal point, other floats in ``%g``."""
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:g}"
    return str(v)


def _text(x: Data, head: int, tail: int, outer: int) -> str:
    if x is None:
        return "-"
    if isinstance(x, list) or x.ndim > 1:
        return _items([_text(a, head, tail, outer) for a in x], outer, 1)
    return _items([_number(v) for v in x.tolist()], head, tail)


def _fmt(x: Data, width: int = 34) -> str:
    """A short text for an array or a list of arrays, abbreviated more and more until it fits ``width``."""
    for head, tail, outer in ((3, 2, 2), (2, 1, 1), (1, 1, 1)):
        text = _text(x, head, tail, outer)
        if len(text) <= width:
            return text
    return text[: width - 3] + "..."


def _gather_rows(rows: list[list[object]]) -> list[list[list[object]]] | None:
    """Every rank's rows on rank 0 (None elsewhere): sizes first, then the JSON text, uneven sizes."""
    w, r = mpicomm.get_world_size(), mpicomm.get_rank()
    payload = np.frombuffer(json.dumps(rows).encode(), dtype=np.uint8)
    sizes = [np.empty(1, dtype=np.int64) for _ in range(w)] if r == 0 else None
    mpicomm.gather(np.array([payload.size]), sizes, dst=0)
    texts = [np.empty(int(s[0]), dtype=np.uint8) for s in sizes] if sizes is not None else None
    mpicomm.gather(payload, texts, dst=0)
    return None if texts is None else [json.loads(t.tobytes()) for t in texts]


def _table(names: Sequence[str], per_rank: list[list[list[object]]]) -> str:
    """One table: per operation, a line for each rank shown (0, 1 and the last beyond 4 ranks)."""
    w = len(per_rank)
    shown = list(range(w)) if w <= 4 else [0, 1, w - 1]
    lines = [["operation", "rank", "sent", "got", "ok"]]
    for i, name in enumerate(names):
        cells = [per_rank[r][i] for r in range(w)]
        failed = [r for r in range(w) if not cells[r][2]]
        note = next((str(c[3]) for c in cells if c[3]), "")
        ok = f"FAIL on ranks {failed}" if failed else note or "ok"
        for k, r in enumerate(shown):
            sent, got = str(cells[r][0]), str(cells[r][1])
            lines.append([name if k == 0 else "", str(r), sent, got, ok if k == 0 else ""])
    widths = [max(len(line[c]) for line in lines) for c in range(4)]
    padded = ["  ".join(cell.ljust(n) for cell, n in zip(line, widths, strict=False)) for line in lines]
    return "\n".join(f"{text}  {line[4]}".rstrip() for text, line in zip(padded, lines, strict=True))


def _lines(x: object) -> list[object]:
    return x if isinstance(x, list) else []


def _details(names: Sequence[str], per_rank: list[list[list[object]]]) -> str:
    """Each case's detail lines (before ``->`` after), ranks side by side, shown ranks as in the table."""
    w = len(per_rank)
    shown = list(range(w)) if w <= 4 else [0, 1, w - 1]
    text = ""
    for i, name in enumerate(names):
        blocks = [[str(x) for x in _lines(per_rank[r][i][4])] for r in shown]
        if not any(blocks):
            continue
        text += f"\n{name}: each rank's input, then its output\n"
        for r, block in zip(shown, blocks, strict=True):
            cut = block.index("->") if "->" in block else len(block)
            before, after = block[:cut], block[cut + 1 :]
            width = max(map(len, before), default=0)
            for k in range(max(len(before), len(after))):
                left = before[k] if k < len(before) else ""
                right = after[k] if k < len(after) else ""
                head = f"rank {r}" if k == 0 else ""
                text += f"{head:<8}{left:<{width}}  {'->' if k == 0 else '  '}  {right}".rstrip() + "\n"
    return text


def run(cases: Sequence[tuple[str, Case]] = CASES, quiet: bool = False) -> bool:
    """Run every case on every rank, print the table on rank 0, and return whether all ranks passed.

    With ``quiet``, rank 0 prints only the last line (``all checks passed`` or the failure count).
    """
    w, r = mpicomm.get_world_size(), mpicomm.get_rank()
    rows: list[list[object]] = []
    for _, case in cases:
        step = case(r, w)
        rows.append([_fmt(step.sent), _fmt(step.got), _equal(step.got, step.want), step.note, step.detail])
    per_rank = _gather_rows(rows)
    show = per_rank is not None and not quiet
    if per_rank is not None and show:
        validation = "on" if mpicomm.is_validation_enabled() else "off"
        ranks = "" if w <= 4 else f"; showing ranks 0, 1 and {w - 1}, ok covers them all"
        print(f"mpicomm {mpicomm.__version__} demo on {w} rank(s), validation {validation}{ranks}")
        print(_table([name for name, _ in cases], per_rank), flush=True)
        print(_details([name for name, _ in cases], per_rank), end="", flush=True)
    failures = np.array([sum(not row[2] for row in rows) + (not _plan(r, w, show))])
    mpicomm.all_reduce(failures)  # after rank 0 printed: a failing rank's exit may abort the job
    if per_rank is not None:
        print("all checks passed" if failures[0] == 0 else f"{failures[0]} check(s) FAILED", flush=True)
    return bool(failures[0] == 0)


def _plan(r: int, w: int, show: bool) -> bool:
    """Plan a small embedding-table sharding for this job on every rank; check all ranks agree.

    The planner needs no MPI; each rank plans on its own and ``all_gather_object`` compares the
    results. Rank 0 prints the plan table and the load chart.
    """
    from mpicomm.planner import (
        GreedyPerfPartitioner,
        JobShape,
        RankLayout,
        Shard,
        ShardingOption,
        Storage,
        Topology,
        format_load_chart,
        format_plan_table,
    )

    mib = 1 << 20
    topo = Topology(world_size=w, compute_device="cpu", ddr_cap=2048 * mib)
    options = [
        ShardingOption("users", "uniform", [Shard(Storage(0, 64 * mib), 1.0) for _ in range(w)]),
        ShardingOption("items", "device", [Shard(Storage(0, 128 * mib), 2.0) for _ in range(4)]),
        ShardingOption("ads", "device", [Shard(Storage(0, 256 * mib), 3.0) for _ in range(2)]),
    ]
    plan = GreedyPerfPartitioner().partition(options, topo)
    mine = [(o.name, i, s.rank) for o in options for i, s in enumerate(o.shards)]
    every: list[object] = [None] * w
    mpicomm.all_gather_object(every, mine)
    same = all(x == mine for x in every)
    if show:
        print(
            f"\nplanner: {len(mine)} shards of 3 tables on {w} rank(s), the same plan on every rank: {same}"
        )
        print(format_plan_table(plan, RankLayout.from_shape(JobShape.from_topology(topo))))
        print(format_load_chart(plan, width=30), flush=True)
    return same


_HELP = """\
Run each mpicomm collective on small data and check every rank's result against numpy:
all_reduce (SUM, AVG, MAX, PREMUL_SUM, BXOR, async), broadcast, all_gather, all_gather_into_tensor,
reduce_scatter, reduce_scatter_tensor, all_to_all_single, gather, scatter, reduce, send/recv,
a halo exchange (Jacobi steps of the heat equation on a Cartesian grid of ranks, ghost columns
swapped in place with sendrecv, checked against one process), barrier, KJTAllToAll,
broadcast_object_list (a configuration dict from rank 0) and gather_object (per-rank summaries to
rank 0). Rank 0 prints one table: what each rank sent and got, and whether it
matched, then each rank's keyed jagged array before and after KJTAllToAll, the configuration every
rank received and the summaries rank 0 gathered, and last a small sharding plan for this job
(plan table and load chart), planned on every rank and compared. Runs on any number of
ranks; beyond 4 it shows ranks 0, 1 and the last one, and checks them all."""

_EXAMPLES = """\
examples:
  python -m mpicomm.demo                          one rank, no launcher needed
  mpirun -n 8 python -m mpi4py -m mpicomm.demo    8 ranks; a failing rank aborts the job
  python -m mpicomm demo --quiet                  only the last line (for batch jobs)
  make demo NP=4                                  the same through the Makefile
  mpirun -n 2 python -m mpicomm demo --device cuda   the collectives on cupy arrays (GPU)

exit status: 0 if every check passed on every rank, 1 otherwise"""


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, run the demo, and return the exit status (0 when every check passed)."""
    parser = argparse.ArgumentParser(
        prog="python -m mpicomm demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=_HELP,
        epilog=_EXAMPLES,
    )
    parser.add_argument(
        "--validate",
        action="store_true",
        help="turn on validation mode (cross-rank checks of every call; same as MPICOMM_VALIDATE=1)",
    )
    parser.add_argument(
        "--quiet", action="store_true", help="print only the last line: all checks passed, or the failures"
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the collectives on cupy arrays, each checked against numpy (needs cupy and a GPU)",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and importlib.util.find_spec("cupy") is None:
        print(
            "mpicomm demo: --device cuda needs cupy: pip install 'mpicomm[cuda12]' (or [cuda13])",
            file=sys.stderr,
        )
        return 2
    mpicomm.init()
    if args.validate:
        mpicomm.set_validation(True)
    if args.device == "cuda":
        return 0 if run_gpu(quiet=args.quiet) else 1
    return 0 if run(quiet=args.quiet) else 1


if __name__ == "__main__":
    sys.exit(main())
