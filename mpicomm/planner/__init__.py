"""Plan where shards go and how ranks map to nodes, then write the Slurm script: no MPI needed.

``import mpicomm.planner`` never imports ``mpi4py.MPI``, so it runs on a login node.

Example:
    >>> from mpicomm.planner import GreedyPerfPartitioner, Shard, ShardingOption, Storage, Topology
    >>> topo = Topology(world_size=2, compute_device="cpu", ddr_cap=100)
    >>> opts = [ShardingOption("u1", "uniform", [Shard(Storage(0, 1), 1.0)] * 2),
    ...         ShardingOption("u2", "uniform", [Shard(Storage(0, 2), 2.0)] * 2),
    ...         ShardingOption("d3", "device", [Shard(Storage(0, 3), 3.0)] * 2),
    ...         ShardingOption("d4", "device", [Shard(Storage(0, 4), 4.0)] * 2)]
    >>> [d.perf.total for d in GreedyPerfPartitioner().partition(opts, topo).devices]
    [10.0, 10.0]
"""

from __future__ import annotations

from .chart import format_bytes, format_layout_table, format_load_chart, format_plan_table
from .environment import LayoutMismatchError, check_environment, job_rank_and_size
from .hostlist import expand_hostlist, expand_tasks_per_node
from .io import Spec, load_plan, load_spec, parse_spec, plan_to_dict, save_plan
from .launcher import LauncherChoice, choose_launcher, job_launcher, launch_lines
from .layout import JobShape, RankLayout, RankPlacement
from .partitioner import GreedyPerfPartitioner
from .render import render_sbatch
from .result import DeviceLoad, Plan
from .types import Device, Perf, PlannerError, PlannerErrorKind, Shard, ShardingOption, Storage, Topology

__all__ = [
    "Device",
    "DeviceLoad",
    "GreedyPerfPartitioner",
    "JobShape",
    "LauncherChoice",
    "LayoutMismatchError",
    "Perf",
    "Plan",
    "PlannerError",
    "PlannerErrorKind",
    "RankLayout",
    "RankPlacement",
    "Shard",
    "ShardingOption",
    "Spec",
    "Storage",
    "Topology",
    "check_environment",
    "choose_launcher",
    "expand_hostlist",
    "expand_tasks_per_node",
    "format_bytes",
    "format_layout_table",
    "format_load_chart",
    "format_plan_table",
    "job_launcher",
    "job_rank_and_size",
    "launch_lines",
    "load_plan",
    "load_spec",
    "parse_spec",
    "plan_to_dict",
    "render_sbatch",
    "save_plan",
]
