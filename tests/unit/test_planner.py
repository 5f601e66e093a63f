"""GreedyPerfPartitioner: the seed example, torchrec's worked examples, errors and bad inputs.

The expected placements are the ones torchrec's own tests assert (shared/reference/semantics.md §3.6).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mpicomm.errors import ArgumentError, ArgumentTypeError, MpicommError
from mpicomm.planner import (
    GreedyPerfPartitioner,
    Perf,
    PlannerError,
    PlannerErrorKind,
    Shard,
    ShardingOption,
    Storage,
    Topology,
)
from mpicomm.planner.scale import make_problem, measure_scale

REPO = Path(__file__).resolve().parents[2]
MIB = 1024**2


def shards(n: int, hbm: int = 1000, ddr: int = 1000, perf: float | Perf = 100.0) -> list[Shard]:
    return [Shard(Storage(hbm, ddr), perf) for _ in range(n)]


def plan(
    options: list[ShardingOption], topology: Topology, sort_by: str = "storage"
) -> dict[str, list[int | None]]:
    return GreedyPerfPartitioner(sort_by).partition(options, topology).ranks()


def test_seed_example_two_uniform_two_device_options_end_with_perf_10_on_each_rank() -> None:
    topo = Topology(world_size=2, compute_device="cpu", ddr_cap=100)
    opts = [
        ShardingOption("u1", "uniform", shards(2, 0, 1, 1.0)),
        ShardingOption("u2", "uniform", shards(2, 0, 2, 2.0)),
        ShardingOption("d3", "device", shards(2, 0, 3, 3.0)),
        ShardingOption("d4", "device", shards(2, 0, 4, 4.0)),
    ]
    result = GreedyPerfPartitioner().partition(opts, topo)
    assert [d.perf.total for d in result.devices] == [10.0, 10.0]
    assert [d.used for d in result.devices] == [Storage(0, 10), Storage(0, 10)]
    assert result.ranks() == {"u1": [0, 1], "u2": [0, 1], "d4": [0, 1], "d3": [0, 1]}
    assert result.options is not opts and result.options[0] is opts[0]  # shards filled in place


def test_ex1_table_wise_balanced_perf_alternates_ranks() -> None:
    topo = Topology(world_size=2, compute_device="cuda")
    opts = [ShardingOption(f"t{i}", "device", shards(1, perf=Perf(40, 30, 20, 10))) for i in range(4)]
    result = GreedyPerfPartitioner().partition(opts, topo)
    assert result.ranks() == {"t0": [0], "t1": [1], "t2": [0], "t3": [1]}
    for d in result.devices:
        assert d.perf == Perf(80, 60, 40, 20)
        assert d.used == Storage(2000, 2000)


def test_ex1_table_wise_unbalanced_perf_fills_the_lighter_rank() -> None:
    topo = Topology(world_size=2, compute_device="cuda")
    opts = [ShardingOption("t0", "device", shards(1, perf=Perf(75, 75, 75, 75)))]
    opts += [ShardingOption(f"t{i}", "device", shards(1, perf=Perf(40, 30, 20, 10))) for i in (1, 2, 3)]
    result = GreedyPerfPartitioner().partition(opts, topo)
    assert result.ranks() == {"t0": [0], "t1": [1], "t2": [1], "t3": [1]}
    assert result.devices[0].perf.total == 300 and result.devices[0].used == Storage(1000, 1000)
    assert result.devices[1].perf == Perf(120, 90, 60, 30) and result.devices[1].used == Storage(3000, 3000)


def test_ex2_row_wise_uniform_puts_shard_i_on_rank_i() -> None:
    topo = Topology(world_size=4, compute_device="cuda")
    opts = [ShardingOption(f"t{i}", "uniform", shards(4)) for i in range(4)]
    result = GreedyPerfPartitioner().partition(opts, topo)
    assert result.ranks() == {f"t{i}": [0, 1, 2, 3] for i in range(4)}
    assert all(d.used == Storage(4000, 4000) for d in result.devices)


def test_ex3_table_column_wise_within_hosts() -> None:
    topo = Topology(world_size=16, local_world_size=8, compute_device="cuda")
    opts = [ShardingOption(f"t{i}", "host", shards(n)) for i, n in enumerate([10, 4, 12, 10])]
    assert plan(opts, topo) == {
        "t0": [8, 9, 10, 11, 12, 13, 14, 15, 8, 9],
        "t1": [4, 5, 6, 7],
        "t2": [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3],
        "t3": [10, 11, 12, 13, 14, 15, 8, 9, 10, 11],
    }


def test_ex4_table_row_wise_alternates_hosts() -> None:
    topo = Topology(world_size=16, local_world_size=8, compute_device="cuda")
    perf = Perf(40, 30, 20, 10)
    opts = [ShardingOption(f"t{i}", "host", shards(8, perf=perf), within_host="uniform") for i in range(4)]
    result = GreedyPerfPartitioner().partition(opts, topo)
    lo, hi = list(range(8)), list(range(8, 16))
    assert result.ranks() == {"t0": lo, "t1": hi, "t2": lo, "t3": hi}
    assert all(d.used == Storage(2000, 2000) and d.perf == Perf(80, 60, 40, 20) for d in result.devices)


def test_ex4_dependency_keeps_a_group_on_one_host() -> None:
    topo = Topology(world_size=16, local_world_size=8, compute_device="cuda")
    opts = [
        ShardingOption("t0", "host", shards(8), dependency="host_0", within_host="uniform"),
        ShardingOption("t1", "host", shards(5), dependency="host_0"),
        ShardingOption("t2", "host", shards(6), dependency="host_0"),
        ShardingOption("t3", "host", shards(8), within_host="uniform"),
    ]
    assert plan(opts, topo) == {
        "t0": list(range(8)),
        "t1": [0, 1, 2, 3, 4],
        "t2": [5, 6, 7, 0, 1, 2],
        "t3": list(range(8, 16)),
    }


def test_ex6_without_balance_modules_keeps_proposal_order_on_ties() -> None:
    # torchrec's TestBalanceModules without balancing; balance_modules itself is not supported
    topo = Topology(world_size=2, compute_device="cuda")
    opts = [ShardingOption(n, "device", shards(1)) for n in ("wt0", "wt1", "wt2", "t0")]
    assert plan(opts, topo) == {"wt0": [0], "wt1": [1], "wt2": [0], "t0": [1]}


def test_host_loads_are_summed_left_to_right_as_torchrec_does() -> None:
    # host 0: 0.1 + 0.2 + 0.3 = 0.6000000000000001, host 1: 0.3 + 0.2 + 0.1 = 0.6: torchrec picks host 1
    topo = Topology(world_size=6, local_world_size=3, compute_device="cuda")
    perfs = [0.1, 0.2, 0.3, 0.3, 0.2, 0.1]
    opts = [
        ShardingOption("u", "uniform", [Shard(Storage(1, 1), p) for p in perfs]),
        ShardingOption("h", "host", shards(1, 1, 1, 1.0)),
    ]
    assert plan(opts, topo)["h"] == [5]  # host 1 (exact sums would tie and pick host 0), its lightest rank


def test_dependency_and_option_names_do_not_mix() -> None:
    topo = Topology(world_size=2, local_world_size=1, compute_device="cuda")
    # an option named "a" and another option depending on "a" are separate groups
    opts = [ShardingOption("a", "device", shards(1)), ShardingOption("b", "host", shards(1), dependency="a")]
    assert plan(opts, topo) == {"a": [0], "b": [1]}
    # an empty dependency means none (torchrec: ``dependency or fqn``)
    opts = [ShardingOption(n, "device", shards(1), dependency="") for n in ("x", "y")]
    assert plan(opts, topo) == {"x": [0], "y": [1]}
    with pytest.raises(ArgumentTypeError, match="dependency of 'z' is 5; expected a string or None"):
        ShardingOption("z", "device", shards(1), dependency=5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"size": 5}, ArgumentTypeError, "Shard: size is 5; expected a list of ints >= 0"),
        ({"size": "12"}, ArgumentTypeError, "Shard: size is '12'"),
        ({"offset": [0, -1]}, ArgumentError, "Shard: offset is [0, -1]"),
        ({"rank": "x"}, ArgumentError, "Shard: rank is 'x'; expected None or a rank >= 0"),
        ({"rank": -1}, ArgumentError, "Shard: rank is -1"),
    ],
)
def test_bad_shard_fields(kwargs: dict[str, object], exc: type[Exception], words: str) -> None:
    with pytest.raises(exc) as info:
        Shard(Storage(1, 1), 1.0, **kwargs)  # type: ignore[arg-type]
    assert words in str(info.value)


def test_ex5_storage_bound_fit_test_is_less_or_equal() -> None:
    topo = Topology(world_size=2, compute_device="cuda", hbm_cap=2000 * MIB)
    opts = [
        ShardingOption("t0", "device", shards(1, 1500 * MIB, 1000 * MIB, 40.0)),
        ShardingOption("t1", "device", shards(1, 1000 * MIB, 1000 * MIB, 80.0)),
        ShardingOption("t2", "device", shards(1, 500 * MIB, 1000 * MIB, 120.0)),
    ]
    assert plan(opts, topo) == {"t0": [0], "t1": [1], "t2": [0]}


def test_equal_ranks_fill_each_hosts_first_rank_first() -> None:
    topo = Topology(world_size=4, local_world_size=2, compute_device="cpu", ddr_cap=100)
    opts = [ShardingOption(f"t{i}", "device", shards(1, 0, 1, 1.0)) for i in range(4)]
    assert [r[0] for r in plan(opts, topo).values()] == [0, 2, 1, 3]


def test_shards_of_one_option_may_share_a_rank() -> None:
    topo = Topology(world_size=2, compute_device="cpu", ddr_cap=100)
    assert plan([ShardingOption("z", "device", shards(3, 0, 1, 0.0))], topo) == {"z": [0, 0, 0]}
    assert plan([ShardingOption("p", "device", shards(3, 0, 1, 10.0))], topo) == {"p": [0, 1, 0]}


def test_sort_by_perf_places_the_costliest_group_first() -> None:
    topo = Topology(world_size=2, compute_device="cpu", ddr_cap=100)
    opts = [
        ShardingOption("big", "device", shards(1, 0, 50, 1.0)),
        ShardingOption("hot", "device", shards(1, 0, 1, 9.0)),
    ]
    assert plan(opts, topo, "storage") == {"big": [0], "hot": [1]}
    assert plan(opts, topo, "perf") == {"hot": [0], "big": [1]}


def test_ex7_device_shard_too_big_names_option_shard_size_and_free_space() -> None:
    topo = Topology(world_size=2, compute_device="cuda", hbm_cap=2000, ddr_cap=10_000)
    opts = [
        ShardingOption("small", "device", shards(1, 500, 0)),
        ShardingOption("huge", "device", shards(2, 3000, 0)),
    ]
    with pytest.raises(PlannerError) as info:
        GreedyPerfPartitioner().partition(opts, topo)
    msg = str(info.value)
    assert info.value.kind is PlannerErrorKind.PARTITION
    assert isinstance(info.value, MpicommError) and isinstance(info.value, ValueError)
    assert "'huge'" in msg and "shard 0 of 2" in msg and "Storage(hbm=3000, ddr=0)" in msg
    assert (
        "largest free space is hbm 2000 on rank" in msg
    )  # 'huge' is placed first (larger), so nothing is used yet
    assert "Possible solutions:\n  1. Use more ranks (world_size is 2)" in msg and "\n  4. " in msg
    assert all(s.rank is None for o in opts for s in o.shards), "a failed plan must not leave ranks behind"


def test_ex7_host_group_larger_than_any_host() -> None:
    topo = Topology(world_size=2, local_world_size=1, compute_device="cuda", hbm_cap=2000)
    opts = [ShardingOption(f"t{i}", "host", shards(1, 1000, 0), dependency="host_0") for i in range(3)]
    with pytest.raises(
        PlannerError,
        match=r"host group 'host_0' \(options 't0', 't1', 't2'\) needs "
        r"Storage\(hbm=3000, ddr=0\)",
    ) as info:
        GreedyPerfPartitioner().partition(opts, topo)
    assert "largest free space on one host is Storage(hbm=2000" in str(info.value)
    assert "Possible solutions:\n  1." in str(info.value)


def test_uniform_shard_that_does_not_fit_on_its_rank() -> None:
    topo = Topology(world_size=2, compute_device="cpu", ddr_cap=10)
    opts = [ShardingOption("u", "uniform", [Shard(Storage(0, 5)), Shard(Storage(0, 11))])]
    with pytest.raises(PlannerError, match=r"'u' \(partition_by='uniform'\) shard 1 of 2 needs .* on rank 1"):
        GreedyPerfPartitioner().partition(opts, topo)


@pytest.mark.parametrize(
    ("make", "exc", "words"),
    [
        (lambda: Storage(-1, 0), ArgumentError, "Storage: hbm is -1; expected a number >= 0"),
        (
            lambda: Storage(1.5, 0),  # type: ignore[arg-type]
            ArgumentTypeError,
            "Storage: hbm is float",
        ),
        (lambda: Perf(-2.0), ArgumentError, "Perf: fwd_compute is -2.0"),
        (lambda: Shard(Storage(1, 1), float("nan")), ArgumentError, "Perf: value is nan"),
        (
            lambda: Shard((1, 1)),  # type: ignore[arg-type]
            ArgumentTypeError,
            "Shard: storage is tuple",
        ),
        (
            lambda: ShardingOption("t", "row_wise", shards(1)),
            ArgumentError,
            "partition_by of 't' is 'row_wise'",
        ),
        (lambda: ShardingOption("t", "device", []), ArgumentError, "shards of 't' is []"),
        (
            lambda: ShardingOption("t", "host", shards(1), within_host="x"),
            ArgumentError,
            "within_host of 't'",
        ),
        (lambda: Topology(0), ArgumentError, "world_size is 0"),
        (lambda: Topology(4, local_world_size=3), ArgumentError, "local_world_size is 3; expected a divisor"),
        (lambda: Topology(4, compute_device="tpu"), ArgumentError, "compute_device is 'tpu'"),
        (lambda: GreedyPerfPartitioner("size"), ArgumentError, "sort_by is 'size'"),
    ],
)
def test_bad_values_raise_clear_errors(make, exc, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(exc) as info:
        make()
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (
            [ShardingOption("u", "uniform", shards(3))],
            "option 'u' has partition_by='uniform' and 3 shards; expected 4",
        ),
        (
            [ShardingOption("a", "device", shards(1)), ShardingOption("a", "host", shards(1))],
            "two options named 'a'",
        ),
        (
            [ShardingOption("a", "device", shards(1), "g"), ShardingOption("b", "device", shards(1), "g")],
            "options 'a', 'b' share the dependency 'g'",
        ),
        (
            [ShardingOption("h", "host", shards(3), within_host="uniform")],
            "within_host='uniform' and 3 shards; expected 2",
        ),
    ],
)
def test_bad_proposals_raise_before_placing_anything(options: list[ShardingOption], words: str) -> None:
    topo = Topology(world_size=4, local_world_size=2, compute_device="cpu", ddr_cap=10**6)
    with pytest.raises(ArgumentError) as info:
        GreedyPerfPartitioner().partition(options, topo)
    assert words in str(info.value) and str(info.value).startswith("GreedyPerfPartitioner.partition: ")


def test_wrong_argument_types() -> None:
    topo = Topology(world_size=2)
    with pytest.raises(ArgumentTypeError, match="storage_constraint is int; expected a Topology"):
        GreedyPerfPartitioner().partition([], 2)  # type: ignore[arg-type]
    with pytest.raises(ArgumentTypeError, match=r"proposal\[0\] is str; expected a ShardingOption"):
        GreedyPerfPartitioner().partition(["t0"], topo)  # type: ignore[list-item]


def test_same_input_gives_the_same_plan_and_leaves_the_topology_alone() -> None:
    first, topo = make_problem(options=300, shards_per_option=3, world_size=64, seed=5)
    second, _ = make_problem(options=300, shards_per_option=3, world_size=64, seed=5)
    a = GreedyPerfPartitioner().partition(first, topo)
    b = GreedyPerfPartitioner().partition(second, topo)
    assert a.ranks() == b.ranks() and a.devices == b.devices
    assert all(d.perf == Perf() and d.storage == Storage(topo.hbm_cap, topo.ddr_cap) for d in topo.devices)


def test_measure_scale_reports_a_plan_of_the_asked_size() -> None:
    result = measure_scale(options=200, shards_per_option=5, world_size=128, repeat=2)
    assert result["shards"] == 1000 and result["world_size"] == 128 and result["repeat"] == 2
    assert 0 < result["seconds"] <= min(result["all_seconds"]) + 1e-12
    assert result["max_perf"] >= result["min_perf"] > 0


@pytest.mark.slow
def test_the_benchmark_sized_problem_plans_every_shard() -> None:
    # The time is the benchmark's business (python -m mpicomm.bench); this checks the plan it times.
    result = measure_scale(repeat=1)
    assert (result["shards"], result["world_size"]) == (100_000, 4096)
    assert result["max_perf"] >= result["min_perf"] > 0


@pytest.mark.process
def test_importing_the_planner_does_not_load_mpi() -> None:
    code = textwrap.dedent("""
        import json, sys
        import mpicomm.planner, mpicomm.plan, mpicomm.planner.scale, mpicomm.planner.run_plan
        from mpicomm.planner import JobShape, RankLayout, RankPlacement, expand_hostlist, check_environment
        from mpicomm.planner import LayoutMismatchError, render_sbatch
        print(json.dumps({"mpi": "mpi4py.MPI" in sys.modules}))
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_"))}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"mpi": False}
