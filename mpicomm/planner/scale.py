"""How long the partitioner takes on a large problem: ``python -m mpicomm.planner.scale``.

The default is the issue's target: 10,000 device options of 10 shards each (100,000 shards) onto 4,096
ranks in hosts of 8, planned in under 2 s on one core. Inputs come from a fixed seed, so every run plans
the same problem; only the partition call is timed, best of ``repeat``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from .partitioner import GreedyPerfPartitioner
from .types import Shard, ShardingOption, Storage, Topology

__all__ = ["make_problem", "measure_scale"]


def make_problem(
    options: int = 10_000, shards_per_option: int = 10, world_size: int = 4096, seed: int = 0
) -> tuple[list[ShardingOption], Topology]:
    """A large random proposal: device options with shards of 1-64 MiB and perf 1-100, and 8 ranks per host.

    Example:
        >>> opts, topo = make_problem(options=3, shards_per_option=2, world_size=8)
        >>> len(opts), sum(len(o.shards) for o in opts), topo.num_hosts
        (3, 6, 1)
    """
    rng = random.Random(seed)
    mib = 1 << 20
    proposal = []
    for i in range(options):
        rows = rng.randint(1, 64) * mib
        perf = float(rng.randint(1, 100))
        proposal.append(
            ShardingOption(
                f"t{i}", "device", [Shard(Storage(rows, rows), perf) for _ in range(shards_per_option)]
            )
        )
    lws = min(8, world_size)
    while world_size % lws:
        lws -= 1
    return proposal, Topology(world_size, local_world_size=lws)


def measure_scale(
    options: int = 10_000, shards_per_option: int = 10, world_size: int = 4096, repeat: int = 3
) -> dict[str, Any]:
    """Time :meth:`GreedyPerfPartitioner.partition` on :func:`make_problem`; best of ``repeat``.

    Returns:
        ``{"options", "shards", "world_size", "repeat", "seconds" (best wall-clock time), "all_seconds",
        "cpu_seconds" (best CPU time of this process: the fair figure on a busy machine), "max_perf",
        "min_perf"}``; the last two show how even the plan is.

    Example:
        >>> r = measure_scale(options=20, shards_per_option=2, world_size=8, repeat=1)
        >>> r["shards"], r["world_size"], r["seconds"] > 0
        (40, 8, True)
    """
    proposal, topology = make_problem(options, shards_per_option, world_size)
    partitioner = GreedyPerfPartitioner()
    times, cpu_times = [], []
    plan = None
    for _ in range(max(1, repeat)):
        start, cpu_start = time.perf_counter(), time.process_time()
        plan = partitioner.partition(proposal, topology)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    assert plan is not None  # repeat >= 1 above; not user input
    totals = [d.perf.total for d in plan.devices]
    return {
        "options": options,
        "shards": options * shards_per_option,
        "world_size": world_size,
        "repeat": len(times),
        "seconds": min(times),
        "all_seconds": times,
        "cpu_seconds": min(cpu_times),
        "max_perf": max(totals),
        "min_perf": min(totals),
    }


def main(argv: list[str] | None = None) -> int:
    """Print :func:`measure_scale` as JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m mpicomm.planner.scale", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--options", type=int, default=10_000)
    parser.add_argument("--shards-per-option", type=int, default=10)
    parser.add_argument("--world-size", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    result = measure_scale(args.options, args.shards_per_option, args.world_size, args.repeat)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
