"""Every ``jobs/*.sbatch`` submitted to a real Slurm: exit code 0, rank 0's summary line, all its ranks."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from slurmjob import REPO, job_env, nodes_have_own_hostnames, sbatch_directives, submit

from mpicomm.planner import load_plan

pytestmark = pytest.mark.usefixtures("slurm")

JOBS = sorted((REPO / "jobs").glob("*.sbatch"))


def _sharded_summary() -> str:
    """run_plan's summary, computed from the committed plan it runs."""
    plan, layout = load_plan(REPO / "jobs" / "sharded.plan.json")
    shards = sum(len(plan.shards_on(d.rank)) for d in plan.devices)
    hbm, ddr = sum(d.used.hbm for d in plan.devices), sum(d.used.ddr for d in plan.devices)
    return f"PLAN OK ranks={layout.world_size} nodes={layout.shape.nodes} shards={shards} hbm={hbm} ddr={ddr}"


# Rank 0's last line (a regular expression) when the job succeeds. A new job script needs an entry here.
FINAL_LINES: dict[str, Callable[[], str]] = {
    # The benchmark's last line: how many comparisons ran and whether every result was checked.
    "bench.sbatch": lambda: (
        r"bench done: \d+ comparison\(s\), \d+ report\(s\) on 2 rank\(s\), all results checked"
    ),
    "demo.sbatch": lambda: re.escape("all checks passed"),
    "sharded.sbatch": lambda: re.escape(_sharded_summary()),
}


def _ranks(directives: dict[str, str]) -> int:
    if "ntasks" in directives:
        return int(directives["ntasks"])
    return int(directives.get("nodes", "1")) * int(directives.get("ntasks-per-node", "1"))


def _partition(directives: dict[str, str]) -> str:
    """``two`` (2 nodes of 4 CPUs) when the job fits there, else ``one`` (1 node of 8 CPUs)."""
    nodes = int(directives.get("nodes", "1"))
    per_node = _ranks(directives) // nodes * int(directives.get("cpus-per-task", "1"))
    return "two" if nodes == 2 or (nodes == 1 and per_node <= 4) else "one"


def test_every_job_script_has_an_expected_last_line() -> None:
    assert JOBS, "no jobs/*.sbatch found"
    missing = [job.name for job in JOBS if job.name not in FINAL_LINES]
    assert not missing, f"add the expected last line of {missing} to FINAL_LINES in {__file__}"


@pytest.mark.parametrize("script", JOBS, ids=[job.name for job in JOBS])
def test_job_script_runs_on_every_rank_and_ends_with_its_summary(script: Path) -> None:
    directives = sbatch_directives(script)
    for needed in ("job-name", "time", "output"):
        assert needed in directives, f"{script.name} has no #SBATCH --{needed}"
    ranks, nodes = _ranks(directives), int(directives.get("nodes", "1"))
    # SLURM_LABELIO: the launcher prefixes each line with its rank ("[0] " under the wheel's mpiexec,
    # "0: " under srun), so that rank 0's last line can be told from the other ranks' lines.
    options = ["--partition", _partition(directives), "--time=3"]
    job = submit(script, options, env=job_env({"SLURM_LABELIO": "1"}))
    # this venv's MPI is PyPI's MPICH wheel: auto picks its own mpiexec, on one node as on two
    assert job.launcher().startswith("mpiexec (auto: the MPI library is PyPI's MPICH wheel"), job.describe()
    assert job.state == "COMPLETED" and job.exit_code == 0, job.describe()
    if script.name in FINAL_LINES:
        want, last = FINAL_LINES[script.name](), job.last_line(task=0)
        assert re.fullmatch(want, last), f"rank 0's last line {last!r} !~ {want!r}\n{job.describe()}"
    seen = job.ranks()
    assert sorted(seen) == list(range(ranks)), f"MPI ranks {sorted(seen)}; want {ranks}\n{job.describe()}"
    assert {words[1] for words in seen.values()} == {str(ranks)}, f"world sizes {seen}\n{job.describe()}"
    assert len({words[3] for words in seen.values()}) == nodes, f"nodes used {seen}\n{job.describe()}"
    if nodes_have_own_hostnames():
        assert all(words[2] == words[3] for words in seen.values()), f"MPI host != Slurm node {seen}"


def test_rank_probe_catches_silent_singletons(tmp_path: Path) -> None:
    # srun --mpi=none gives the MPICH wheel no PMI: 4 worlds of one rank each, and exit code 0.
    # The rank check above must see that, or a broken launch line would pass for a 4-rank job.
    script = tmp_path / "singletons.sbatch"
    script.write_text(
        "#!/bin/bash\n#SBATCH --job-name=mpicomm-singletons\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=4\n"
        "#SBATCH --time=00:02:00\n"
        'srun --mpi=none "$MPICOMM_PYTHON" -m mpi4py -c "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()"\n'
    )
    job = submit(script, ["--partition", "one"], env=job_env())
    assert job.state == "COMPLETED" and job.exit_code == 0, job.describe()
    seen = job.ranks()
    assert sorted(seen) == [0] and seen[0][1] == "1", (
        f"expected only singletons, got {seen}\n{job.describe()}"
    )
