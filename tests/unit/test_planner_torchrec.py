"""The planner as torchrec users write it: near-ties broken as torchrec breaks them, plain-number shards,
and ``partition()``'s result used as the list of ShardingOption torchrec returns."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from mpicomm.errors import ArgumentError, ArgumentTypeError
from mpicomm.planner import GreedyPerfPartitioner, Perf, Plan, Shard, ShardingOption, Storage, Topology

Total = Callable[[list[float]], float]


def torchrec_total(p: list[float]) -> float:
    """torchrec's Perf.total: fwd_compute + bwd_compute + fwd_comms + bwd_comms + prefetch_compute."""
    fc, fcm, bc, bcm, pc = p
    return fc + bc + fcm + bcm + pc


def field_order_total(p: list[float]) -> float:
    """The order mpicomm used before: the fields left to right."""
    fc, fcm, bc, bcm, pc = p
    return fc + fcm + bc + bcm + pc


def greedy(options: list[tuple[int, list[float]]], world: int, cap: int, total: Total) -> list[int]:
    """torchrec's greedy for one-shard device options, written out: sort options by storage (stable,
    largest first), then each onto the rank of least total perf that fits (ties: lowest rank)."""
    free = [cap] * world
    perf = [[0.0] * 5 for _ in range(world)]
    ranks = [-1] * len(options)
    for i in sorted(range(len(options)), key=lambda i: -options[i][0]):
        hbm, fields = options[i]
        rank = min((r for r in range(world) if hbm <= free[r]), key=lambda r: (total(perf[r]), r))
        free[rank] -= hbm
        perf[rank] = [a + b for a, b in zip(perf[rank], fields, strict=True)]
        ranks[i] = rank
    return ranks


def mpicomm_plan(options: list[tuple[int, list[float]]], world: int, cap: int) -> list[int]:
    opts = [
        ShardingOption(f"t{i}", "device", [Shard(Storage(hbm, 0), Perf(*fields))])
        for i, (hbm, fields) in enumerate(options)
    ]
    plan = GreedyPerfPartitioner().partition(opts, Topology(world, hbm_cap=cap, ddr_cap=cap))
    return [o.shards[0].rank for o in plan]  # type: ignore[misc]


def test_perf_total_adds_in_torchrec_order() -> None:
    assert Perf(0.3, 0.2, 0.1).total == 0.3 + 0.1 + 0.2 != 0.3 + 0.2 + 0.1
    assert Perf(1, 2, 3, 4, 5).total == 15.0


def test_issue_minimal_near_tie_puts_c_on_rank_1_as_torchrec_does() -> None:
    # a: Perf(0.3, 0.2, 0.1) totals 0.6000000000000001 in torchrec's order, b totals 0.6, so c goes to
    # b's rank; added left to right a would total 0.6 too, and the tie would send c to rank 0.
    topo = Topology(world_size=2, hbm_cap=100, ddr_cap=100)
    opts = [
        ShardingOption("a", "device", [Shard(Storage(3, 0), Perf(0.3, 0.2, 0.1))]),
        ShardingOption("b", "device", [Shard(Storage(2, 0), 0.6)]),
        ShardingOption("c", "device", [Shard(Storage(1, 0), 1.0)]),
    ]
    assert GreedyPerfPartitioner().partition(opts, topo).ranks() == {"a": [0], "b": [1], "c": [1]}


def _decimal_problem(rng: np.random.Generator) -> tuple[list[tuple[int, list[float]]], int]:
    world = int(rng.integers(2, 5))
    options = []
    for _ in range(int(rng.integers(3, 9))):
        tenths = rng.integers(0, 6, size=5) * (rng.random(5) < 0.7)
        options.append((int(rng.integers(1, 6)), [round(0.1 * t, 1) for t in tenths.tolist()]))
    return options, world


def test_decimal_near_ties_place_every_shard_where_torchrec_does() -> None:
    rng = np.random.default_rng(14)
    differs = 0
    for _ in range(400):
        options, world = _decimal_problem(rng)
        want = greedy(options, world, 100, torchrec_total)
        assert mpicomm_plan(options, world, 100) == want, (options, world)
        differs += want != greedy(options, world, 100, field_order_total)
    # the problems really are near-ties: the old order would have placed some of them differently
    assert differs > 0


def test_seed_example_with_plain_numbers_counts_storage_on_the_compute_device() -> None:
    def opts() -> list[ShardingOption]:
        return [
            ShardingOption("u1", "uniform", [Shard(storage=1, perf=1) for _ in range(2)]),
            ShardingOption("u2", "uniform", [Shard(storage=2, perf=2) for _ in range(2)]),
            ShardingOption("d3", "device", [Shard(storage=3, perf=3) for _ in range(2)]),
            ShardingOption("d4", "device", [Shard(storage=4, perf=4) for _ in range(2)]),
        ]

    cpu = GreedyPerfPartitioner().partition(opts(), Topology(world_size=2, compute_device="cpu", ddr_cap=100))
    assert [d.used for d in cpu.devices] == [Storage(0, 10), Storage(0, 10)]
    assert [d.perf.total for d in cpu.devices] == [10.0, 10.0]
    gpu = GreedyPerfPartitioner().partition(opts(), Topology(world_size=2, hbm_cap=100))
    assert [d.used for d in gpu.devices] == [Storage(10, 0), Storage(10, 0)]
    assert gpu.ranks() == cpu.ranks() == {"u1": [0, 1], "u2": [0, 1], "d3": [0, 1], "d4": [0, 1]}


def test_plain_number_storage_that_fits_nowhere_names_the_device_memory() -> None:
    with pytest.raises(Exception, match=r"needs Storage\(hbm=0, ddr=11\)"):
        GreedyPerfPartitioner().partition(
            [ShardingOption("big", "device", [Shard(storage=11)])],
            Topology(world_size=1, compute_device="cpu", ddr_cap=10),
        )


@pytest.mark.parametrize(
    ("storage", "exc", "words"),
    [("1", ArgumentTypeError, "Shard: storage is str"), (-1, ArgumentError, "Shard: storage is -1")],
)
def test_bad_plain_storage(storage: object, exc: type[Exception], words: str) -> None:
    with pytest.raises(exc, match=words):
        Shard(storage=storage)  # type: ignore[arg-type]


def test_partition_result_behaves_as_torchrec_list_of_sharding_options() -> None:
    proposal = [ShardingOption(f"t{i}", "device", [Shard(storage=1, perf=i + 1)]) for i in range(3)]
    plan = GreedyPerfPartitioner().partition(proposal, Topology(world_size=2))
    assert isinstance(plan, Plan)
    assert len(plan) == 3 and plan[0] is proposal[0] and plan[-1] is proposal[2]
    assert plan[1:] == proposal[1:] and list(plan) == proposal and plan == proposal
    assert [o.name for o in plan] == ["t0", "t1", "t2"] and proposal[1] in plan
    assert plan.index(proposal[2]) == 2
    # and the extras are still there
    assert plan.ranks() == {"t0": [0], "t1": [1], "t2": [0]}
    assert plan.num_shards == 3 and len(plan.devices) == 2
