"""print(plan) is a short summary whatever the plan's size; --time says which formats Slurm takes."""

from __future__ import annotations

import pytest

from mpicomm.apps.plan import main as plan_main
from mpicomm.errors import ArgumentError
from mpicomm.planner import GreedyPerfPartitioner, Shard, ShardingOption, Storage, Topology
from mpicomm.planner.render import check_time


def test_print_of_a_large_plan_stays_short(capsys: pytest.CaptureFixture[str]) -> None:
    topo = Topology(world_size=64, compute_device="cpu", ddr_cap=1 << 40)
    options = [
        ShardingOption(
            f"table{t}", "device", [Shard(Storage(0, 1 << 20), float(1 + (t * s) % 5)) for s in range(40)]
        )
        for t in range(30)
    ]
    plan = GreedyPerfPartitioner().partition(options, topo)
    print(plan)
    out = capsys.readouterr().out
    assert out.startswith("Plan: 1200 shards of 30 options on 64 ranks (cpu)\n")
    assert len(out) < 1500 and out.count("\n") <= 14
    assert "... and 22 more options" in out and "(40 shards)" in out
    assert repr(plan) == "Plan(world_size=64, options=30, shards=1200)"
    loads = [d.perf.total for d in plan.devices]
    assert f"min {min(loads):g}, max {max(loads):g}" in out


@pytest.mark.parametrize("good", ["30", "30:00", "00:10:00", "1-0", "1-12:00", "2-00:00:00"])
def test_slurm_time_formats_pass(good: str) -> None:
    assert check_time(good) == good


@pytest.mark.parametrize("bad", ["banana", "10m", "1:2:3:4", "-5", "1-", "00:10:00 "])
def test_bad_times_get_the_formats(bad: str) -> None:
    with pytest.raises(ArgumentError, match=r"expected a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH"):
        check_time(bad)


def test_plan_cli_refuses_a_bad_time_before_planning(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        plan_main(["--nodes", "1", "--time", "banana", "--sbatch", "x.sbatch", "--", "x.py"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "argument --time: the time limit is 'banana'; expected a Slurm time limit" in err
