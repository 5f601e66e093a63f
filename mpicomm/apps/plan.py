r"""``python -m mpicomm.plan``: plan shards onto ranks, show the plan, write it and the Slurm script (no MPI).

Examples (from the repository root)::

    python -m mpicomm.plan jobs/sharded.toml                       # table and load chart
    python -m mpicomm.plan jobs/sharded.toml --json plan.json      # also write the plan
    python -m mpicomm.plan jobs/sharded.toml --json jobs/sharded.plan.json --sbatch jobs/sharded.sbatch \\
        --job-name mpicomm-sharded -- -m mpicomm.planner.run_plan jobs/sharded.plan.json
    python -m mpicomm.plan --nodes 2 --ntasks-per-node 4 --job-name demo \
        --sbatch demo.sbatch -- -m mpicomm.demo

Without a spec file, the layout comes from the flags alone and no plan is made. The exit status is 0 on
success and 2 on a bad spec, a plan that does not fit, or bad flags.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import ArgumentError, MpicommError
from ..planner import (
    GreedyPerfPartitioner,
    JobShape,
    RankLayout,
    format_layout_table,
    format_load_chart,
    format_plan_table,
    job_launcher,
    load_spec,
    render_sbatch,
    save_plan,
)
from ..planner.io import Spec
from ..planner.render import check_time

__all__ = ["build_parser", "main"]

PROG = "python -m mpicomm plan"


def build_parser() -> argparse.ArgumentParser:
    """The command line (the command to run in the batch script goes after ``--``)."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Plan sharding options onto ranks (GreedyPerfPartitioner), print the plan and a load "
        "chart, "
        "write it as JSON and write the Slurm batch script for its layout. No MPI needed.",
        epilog="The command run on every task goes after --, e.g. -- -m mpicomm.demo; the script runs it as "
        '"${MPICOMM_PYTHON:-python3}" -m mpi4py <command>, started by the MPICH wheel\'s mpiexec or by srun '
        "(MPICOMM_LAUNCHER=auto|mpiexec|srun, chosen when the job starts; see docs/jobs.rst).",
    )
    p.add_argument(
        "spec", nargs="?", help="topology and sharding options, .toml or .json (see docs/planner.rst)"
    )
    p.add_argument("--json", metavar="FILE", help="write the plan as JSON")
    p.add_argument("--sbatch", metavar="FILE", help="write the batch script running the command after --")
    job = p.add_argument_group("job shape (default: the spec's [job] table, else one node per host)")
    job.add_argument("--nodes", type=int)
    job.add_argument("--ntasks-per-node", type=int)
    job.add_argument("--gpus-per-node", type=int)
    job.add_argument("--cpus-per-task", type=int)
    job.add_argument("--distribution", choices=("block", "cyclic"))
    job.add_argument("--node-names", metavar="HOSTLIST", help='node names, e.g. "n[1-2]" (adds --nodelist)')
    sb = p.add_argument_group("batch script")
    sb.add_argument("--job-name", help="default: the spec file's name, else mpicomm")
    sb.add_argument(
        "--time",
        default="00:10:00",
        type=_time,
        help="time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (default 00:10:00)",
    )
    sb.add_argument("--output", default="%x-%j.out", help="output file pattern (default %%x-%%j.out)")
    sb.add_argument("--account", help="default: $MPICOMM_ACCOUNT, else none")
    sb.add_argument("--partition", help="default: $MPICOMM_PARTITION, else none")
    sb.add_argument(
        "--mpi",
        default="pmi2",
        help="default srun --mpi plugin when srun launches (pmi2: MPICH; pmix: Open MPI)",
    )
    sb.add_argument(
        "--chdir",
        metavar="DIR",
        help="directory the job runs in (#SBATCH --chdir); default: this directory, found at run time "
        "from the script's place, so the script can be submitted from anywhere",
    )
    view = p.add_argument_group("output")
    view.add_argument(
        "--sort-by", choices=("storage", "perf"), help="partitioner order (default: the spec's)"
    )
    view.add_argument("--chart-width", type=int, default=40, help="width of the load bars (default 40)")
    view.add_argument("--quiet", action="store_true", help="print nothing but errors")
    return p


def _time(text: str) -> str:
    try:
        return check_time(text, "--time", "the time limit")
    except MpicommError as exc:
        raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None


def _shape(args: argparse.Namespace, spec: Spec | None) -> JobShape:
    base = JobShape() if spec is None else spec.shape or JobShape.from_topology(spec.topology)
    overrides = {
        k: getattr(args, k)
        for k in ("nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task", "distribution")
        if getattr(args, k) is not None
    }
    shape = JobShape(**{**base.__dict__, **overrides})
    if spec is not None:
        topo = spec.topology
        if shape.world_size != topo.world_size:
            raise ArgumentError(
                f"job shape: the job runs {shape.nodes} x {shape.ntasks_per_node} = {shape.world_size} "
                f"ranks; the topology has world_size {topo.world_size}; expected the same number"
            )
        if (topo.num_hosts > 1 or shape.nodes > 1) and (
            shape.nodes != topo.num_hosts
            or shape.ntasks_per_node != topo.local_world_size
            or shape.distribution != "block"
        ):
            raise ArgumentError(
                f"job shape: the topology has {topo.num_hosts} host(s) of {topo.local_world_size} "
                f"consecutive ranks; the job runs {shape.nodes} node(s) x {shape.ntasks_per_node} tasks "
                f"with {shape.distribution} distribution; expected {topo.num_hosts} node(s) x "
                f"{topo.local_world_size} tasks, block distribution (set the topology's local_world_size "
                "to the tasks per node)"
            )
    return shape


def _run(argv: list[str]) -> int:
    command: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, command = argv[:cut], argv[cut + 1 :]
    args = build_parser().parse_args(argv)
    spec = load_spec(args.spec) if args.spec else None
    shape = _shape(args, spec)
    names = args.node_names if args.node_names is not None else (spec.node_names if spec else None)
    layout = RankLayout.from_shape(shape, names)
    say = (lambda text: None) if args.quiet else print
    if spec is not None:
        partitioner = GreedyPerfPartitioner(args.sort_by or spec.sort_by)
        plan = partitioner.partition(spec.options, spec.topology)
        say(format_plan_table(plan, layout))
        say("")
        say(format_load_chart(plan, args.chart_width))
        if args.json:
            save_plan(args.json, plan, layout)
            say(f"plan written to {args.json}")
    else:
        say(format_layout_table(layout))
        if args.json:
            raise ArgumentError("--json: needs a spec file to plan; expected SPEC before the flags")
    if args.sbatch:
        if not command:
            raise ArgumentError("--sbatch: needs the command to run after --, e.g. -- -m mpicomm.demo")
        job_name = args.job_name or (Path(args.spec).stem if args.spec else "mpicomm")
        # the command's paths are relative to where it ran: say where that is, from the script's folder
        here = os.path.relpath(os.getcwd(), os.path.dirname(os.path.abspath(args.sbatch)))
        where = "this script's folder" if here == "." else f"{here} (from this script's folder)"
        header = [
            f"Generated by {PROG}; edit the flags, not this file. Regenerate from {where} with:",
            f"  {PROG} {shlex.join([*_header_args(argv), '--', *command])}",
        ]
        text = render_sbatch(
            layout,
            command,
            job_name=job_name,
            time=args.time,
            output=args.output,
            account=args.account,
            partition=args.partition,
            mpi=args.mpi,
            header=header,
            chdir=_chdir(args.chdir, args.sbatch),
        )
        Path(args.sbatch).write_text(text)
        say(f"batch script written to {args.sbatch}")
        if not args.quiet:
            say(_launcher_note(args.mpi))
    elif command:
        raise ArgumentError("--: a command after -- is only used with --sbatch FILE")
    return 0


def _launcher_note(mpi: str) -> str:
    """Which launcher the script picks when it starts, as seen from this shell, and why."""
    python, choice = job_launcher(mpi=mpi)
    return (
        "launcher: chosen when the job starts (MPICOMM_LAUNCHER=auto|mpiexec|srun, default auto); "
        f"submitted from this shell (job interpreter {python}: MPICOMM_PYTHON, default python3), it is "
        f"{choice.describe()}"
    )


def _chdir(given: str | None, sbatch: str) -> str:
    """An absolute ``--chdir``, or this directory relative to the script's (found again at run time)."""
    if given is not None:
        return os.path.abspath(given)
    return os.path.relpath(os.getcwd(), os.path.dirname(os.path.abspath(sbatch)))


def _header_args(argv: Sequence[str]) -> list[str]:
    """The flags as given, without --quiet (which does not change what is written)."""
    return [a for a in argv if a != "--quiet"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 ok, 2 error with the message on stderr)."""
    try:
        return _run(list(sys.argv[1:] if argv is None else argv))
    except MpicommError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
