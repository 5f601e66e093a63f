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
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import mpicomm

if TYPE_CHECKING:
    from mpi4py import MPI
from ...planner.scale import measure_scale
from .dense import (
    _all_gather,
    _all_reduce,
    _all_reduce_kinds,
    _all_to_all,
    _all_to_all_kinds,
    _barrier,
    _broadcast,
    _gather,
    _reduce,
    _reduce_scatter,
    _scatter,
    _send_recv,
    _validated,
)
from .gpu import cost_lines, cost_report, gpu_lines, gpu_report
from .halo import _halo_column, _halo_row, _sendrecv, _sendrecv_edge
from .harness import (
    BANDWIDTH,
    DEFAULT_SIZES,
    Buffers,
    Env,
    Point,
    Spec,
    _timed,
    calibrate,
    check,
    machine,
    parse_size,
    quiet_gate,
)
from .jagged import _jagged, jagged_realistic, realistic_lines
from .objects import objects_lines, objects_report
from .overlap import async_lines, async_report
from .report import HEAD, WIDTHS, line, row, table, target, target_lines
from .torch_backend import torch_backend, torch_backend_lines
from .torch_cost import torch_cost, torch_cost_lines
from .torchrec_step import torchrec_step, torchrec_step_lines
from .traced import _traced

__all__ = ["main"]


#: The project's targets: (text, op, size, limit on the ratio[, at that size and above]); op None: every
#: raw op at >= size.
TARGETS: tuple[tuple[Any, ...], ...] = (
    ("all_reduce 8 B <= 1.2x Allreduce", "all_reduce", 8, 1.2),
    ("broadcast 8 B <= 1.3x Bcast", "broadcast", 8, 1.3),
    ("all_gather_into_tensor 8 B <= 1.3x Allgather", "all_gather_into_tensor", 8, 1.3),
    ("reduce_scatter_tensor 8 B <= 1.3x Reduce_scatter_block", "reduce_scatter_tensor", 8, 1.3),
    ("send/recv 8 B <= 1.3x Send/Recv", "send_recv", 8, 1.3),
    ("all_to_all_single 8 B <= 1.5x Alltoallv", "all_to_all_single", 8, 1.5),
    ("all_gather (list) 8 B <= 2x", "all_gather", 8, 2.0),
    ("reduce_scatter (list) 8 B <= 2x", "reduce_scatter", 8, 2.0),
    ("all_to_all (list) 8 B <= 2x", "all_to_all", 8, 2.0),
    ("gather 8 B <= 2x", "gather", 8, 2.0),
    ("scatter 8 B <= 2x", "scatter", 8, 2.0),
    ("every op at >= 1 MiB <= 1.05x raw mpi4py", None, 1 << 20, 1.05),
    ("list reduce_scatter <= 1.1x tensor form, 16 MiB", "reduce_scatter_list_vs_tensor", 16 << 20, 1.1),
    ("list all_gather <= 1.1x tensor form, 16 MiB", "all_gather_list_vs_tensor", 16 << 20, 1.1),
    ("jagged at 1 KiB <= 2x raw two-step", "jagged", 1 << 10, 2.0),
    ("jagged at 64 KiB <= 1.3x raw two-step", "jagged", 64 << 10, 1.3),
    ("jagged at 1 MiB <= 1.1x raw two-step", "jagged", 1 << 20, 1.1),
    ("jagged at 16 MiB <= 1.05x raw two-step", "jagged", 16 << 20, 1.05),
    ("sendrecv 8 B <= 1.15x Sendrecv", "sendrecv", 8, 1.15),
    ("sendrecv 64 KiB <= 1.15x Sendrecv", "sendrecv", 64 << 10, 1.15),
    ("sendrecv edge rank 8 B <= 1.15x Sendrecv", "sendrecv_edge", 8, 1.15),
    ("sendrecv edge rank 64 KiB <= 1.15x Sendrecv", "sendrecv_edge", 64 << 10, 1.15),
    ("halo column, every size <= 1.1x pack + Sendrecv", "halo_column", 8, 1.1, True),
    ("halo row, every size <= 1.1x pack + Sendrecv", "halo_row", 8, 1.1, True),
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
    # The halo step (mpicomm.apps.bench.halo): a ring, the edge ranks of a line, ghost columns and rows.
    "sendrecv": Spec(_sendrecv, "mpicomm", "mpi4py", "Sendrecv (ring)"),
    "sendrecv_edge": Spec(_sendrecv_edge, "mpicomm", "mpi4py", "Sendrecv with PROC_NULL (line ends)"),
    "halo_column": Spec(_halo_column, "mpicomm", "packed", "ascontiguousarray + Sendrecv + copy back"),
    "halo_row": Spec(_halo_row, "mpicomm", "packed", "ascontiguousarray + Sendrecv + copy back"),
    # The front door's cost on torch tensors (the goal: at most 1.5 us more per call than numpy) and
    # validation mode's cost, each against the same mpicomm call on numpy arrays, validation off.
    "all_reduce_torch": Spec(_all_reduce_kinds, "torch", "numpy", "mpicomm.all_reduce on numpy", "allreduce"),
    "all_to_all_single_torch": Spec(
        _all_to_all_kinds, "torch", "numpy", "mpicomm.all_to_all_single on numpy", "alltoall"
    ),
    "all_reduce_validated": Spec(
        _validated, "validated", "numpy", "mpicomm.all_reduce, validation off", "allreduce"
    ),
    # What MPICOMM_TRACE costs a call: the traced wrapper (mpicomm.trace) against the untraced call.
    "all_reduce_traced": Spec(_traced, "traced", "untraced", "mpicomm.all_reduce, untraced", "allreduce"),
    # A/A: the same raw call against itself on the same memory; its ratio is the harness's noise floor.
    "noise_floor": Spec(_all_reduce, "mpi4py", "mpi4py", "Allreduce(IN_PLACE) again (A/A)", "allreduce"),
}


#: The ops run by default: all, the torch comparisons only where torch is installed.
DEFAULT_OPS = [k for k in OPS if not k.endswith("_torch") or importlib.util.find_spec("torch") is not None]

#: Measurements that are not one A/B comparison per size, run after the sweep when named in --ops.
REPORTS = {
    "jagged_realistic": "KJTAllToAll, realistic shape: counts / values / recat split",
    "objects": "object collectives vs comm.bcast / pkl5 (mpicomm.apps.bench.objects)",
    "planner": "GreedyPerfPartitioner: 10,000 options (100,000 shards) on 4,096 ranks, on rank 0",
    "gpu": "cupy collectives vs raw mpi4py and the pinned-copy bound (needs a GPU; --device cuda)",
    "gpu_cost": "a small staged call vs its copies and MPI call by hand (cupy, or the fake cupy)",
    "torch_cost": "what a torch CPU tensor adds to a 1 MiB call, caches warm and cold (rank 0, needs torch)",
    "torch_backend": "dist.all_reduce on backend mpicomm vs gloo vs mpicomm direct; DDP steps (needs torch)",
    "async": "async_op=True: return time with a late peer; share of a 16 MiB call not hidden behind 2x sleep",
    "torchrec": "a table-wise torchrec DLRM step on backend mpicomm vs gloo (needs torchrec; asked by name)",
}

#: The reports run by default: all but the GPU one, which needs cupy and a GPU (and torch_cost without torch).
CPU_REPORTS = [
    k
    for k in REPORTS
    if k not in ("gpu", "gpu_cost", "torch_backend", "torchrec")  # torch_backend, torchrec: asked by name
    and (k != "torch_cost" or importlib.util.find_spec("torch") is not None)
]


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
        prog="mpiexec -n N python -m mpi4py -m mpicomm bench",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__,
        epilog="ops (A: the mpicomm call, B: the baseline; ratio A/B above 1: mpicomm is slower):\n" + ops,
    )
    p.add_argument(
        "--ops", type=_ops, default=[*DEFAULT_OPS, *CPU_REPORTS], help="comma-separated ops (default all)"
    )
    p.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="cuda: the GPU report only (same as --ops gpu)",
    )
    p.add_argument("--sizes", type=_sizes, default=list(DEFAULT_SIZES), help=SIZES_HELP)
    for flag, kind, default, metavar, text in OPTIONS:
        p.add_argument(flag, type=kind, default=default, metavar=metavar, help=text)
    p.add_argument(
        "--objects-huge",
        action="store_true",
        help="objects report: also broadcast a 2.2 GiB array against pkl5 (about 7 GiB at 2 ranks)",
    )
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
    if args.device == "cuda":
        args.ops = ["gpu"]
    return args


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
        print("\n" + objects_lines(extra["objects"]), flush=True)
    if "planner" in extra:
        print("\n" + planner_line(extra["planner"]), flush=True)
    if "gpu" in extra:
        print("\n" + gpu_lines(extra["gpu"]), flush=True)
    if "gpu_cost" in extra:
        print("\n" + cost_lines(extra["gpu_cost"]), flush=True)
    if "torch_cost" in extra:
        print("\n" + torch_cost_lines(extra["torch_cost"]), flush=True)
    if "torch_backend" in extra:
        print("\n" + torch_backend_lines(extra["torch_backend"]), flush=True)
    if "async" in extra:
        print("\n" + async_lines(extra["async"]), flush=True)
    if "torchrec" in extra:
        print("\n" + torchrec_step_lines(extra["torchrec"]), flush=True)
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


#: The planner's scale target: seconds of CPU time for the problem of ``measure_scale``'s defaults.
PLANNER_LIMIT = 2.0


def planner_scale(ctl: MPI.Intracomm, e: Env, args: argparse.Namespace) -> dict[str, Any]:
    """Time the planner on rank 0 (it needs no MPI; the other ranks wait in a barrier)."""
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
    "objects": objects_report,
    "planner": planner_scale,
    "gpu": gpu_report,
    "gpu_cost": cost_report,
    "torch_cost": torch_cost,
    "torch_backend": torch_backend,
    "async": async_report,
    "torchrec": torchrec_step,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; returns 1 if a correctness check failed, else 0."""
    args = parse_args(argv)
    world = mpicomm.init()
    mpicomm.set_validation(False)  # validation adds an allgather per call: not what we measure
    ctl = world.comm.Dup()  # barriers and time reductions stay off the measured communicator
    env = Env(world.comm, world.rank(), world.size())
    info = machine(ctl)
    if env.rank == 0:
        print(
            f"mpicomm.bench: {env.n} ranks on {', '.join(info['hosts'])} ({info['cores']} cores), "
            f"{info['mpi_library']}, mpi4py {info['mpi4py']}, numpy {info['numpy']}, "
            f"thread level {info['thread_level']}, load {info['loadavg'][0]:.2f}",
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
