"""Rank layouts agree with what Slurm really does, and check_environment holds inside a real job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from slurmjob import PROBE_DIR, REPO, job_env, nodes_have_own_hostnames, render, run, submit

from mpicomm.planner import JobShape, RankLayout

pytestmark = pytest.mark.usefixtures("slurm")

HERE = Path(__file__).resolve().parent
TASK_VARIABLES = "$SLURM_PROCID $SLURM_LOCALID $SLURM_NODEID $SLURMD_NODENAME $SLURM_JOB_NODELIST"
SHAPES = [
    ("one", JobShape(nodes=1, ntasks_per_node=8)),
    ("two", JobShape(nodes=2, ntasks_per_node=4)),
    ("two", JobShape(nodes=2, ntasks_per_node=4, distribution="cyclic")),
    ("two", JobShape(nodes=2, ntasks_per_node=3, distribution="cyclic")),
    ("two", JobShape(nodes=2, ntasks_per_node=2, cpus_per_task=2)),
]


def _srun_tasks(partition: str, shape: JobShape) -> dict[int, tuple[int, int, str, str]]:
    """Each task's (SLURM_LOCALID, SLURM_NODEID, SLURMD_NODENAME, SLURM_JOB_NODELIST), by SLURM_PROCID."""
    argv = ["srun", "-p", partition, "-t", "1", "-N", str(shape.nodes)]
    argv += [f"--ntasks-per-node={shape.ntasks_per_node}", f"--cpus-per-task={shape.cpus_per_task}"]
    argv += [f"--distribution={shape.distribution}", "bash", "-c", f'echo "{TASK_VARIABLES}"']
    tasks = {}
    for line in run(argv).splitlines():
        procid, localid, nodeid, name, nodelist = line.split()
        tasks[int(procid)] = (int(localid), int(nodeid), name, nodelist)
    return tasks


@pytest.mark.parametrize(
    ("partition", "shape"),
    SHAPES,
    ids=[f"{s.nodes}x{s.ntasks_per_node}-{s.distribution}-c{s.cpus_per_task}" for _, s in SHAPES],
)
def test_rank_layout_agrees_with_srun(partition: str, shape: JobShape) -> None:
    tasks = _srun_tasks(partition, shape)
    assert sorted(tasks) == list(range(shape.world_size)), tasks
    nodelists = {nodelist for *_, nodelist in tasks.values()}
    assert len(nodelists) == 1, tasks
    layout = RankLayout.from_shape(shape, node_names=nodelists.pop())
    assert layout.world_size == len(tasks)
    for placement in layout.ranks:
        local, node, name, _ = tasks[placement.rank]
        got = (placement.local_rank, placement.node_index, placement.node_name)
        assert got == (local, node, name), (
            f"rank {placement.rank}: layout {got}, Slurm {tasks[placement.rank]}"
        )
    # Plain reference for Slurm itself: block fills node after node, cyclic deals ranks round robin.
    for rank, (local, node, _, _) in tasks.items():
        want = (
            divmod(rank, shape.ntasks_per_node)
            if shape.distribution == "block"
            else (rank % shape.nodes, rank // shape.nodes)
        )
        assert (node, local) == want, (
            f"Slurm put rank {rank} on node {node} as local {local}; expected {want}"
        )
    assert len({name for _, _, name, _ in tasks.values()}) == shape.nodes, f"Slurm's nodes: {tasks}"


# (launcher, rank source, distribution): two nodes through the scripts' own choice (auto: the MPICH
# wheel's mpiexec), srun on one node only (the wheel's multi-node start-up under srun is the bug).
CHECKS = [
    ("auto", "env", "block"),
    ("auto", "mpi", "block"),
    ("auto", "mpi", "cyclic"),
    ("srun", "env", "block"),
    ("srun", "mpi", "block"),
]


def _shape(launch: str, distribution: str) -> JobShape:
    nodes, per_node = (2, 4) if launch == "auto" else (1, 4)
    return JobShape(nodes=nodes, ntasks_per_node=per_node, distribution=distribution)


def _layout_script(tmp_path: Path, launch: str, source: str, distribution: str) -> tuple[Path, str]:
    shape = _shape(launch, distribution)
    args = [str(HERE / "layout_job.py"), str(shape.nodes), str(shape.ntasks_per_node), distribution, source]
    script = render(tmp_path / "layout.sbatch", shape, args, name="mpicomm-layout")
    return script, "two" if launch == "auto" else "one"


def _env(launch: str) -> dict[str, str]:
    return job_env({"MPICOMM_LAUNCHER": launch})


@pytest.mark.parametrize(("launch", "source", "distribution"), CHECKS, ids=["-".join(c) for c in CHECKS])
def test_check_environment_passes_in_the_planned_job(
    tmp_path: Path, launch: str, source: str, distribution: str
) -> None:
    script, partition = _layout_script(tmp_path, launch, source, distribution)
    job = submit(script, ["--partition", partition], env=_env(launch))
    want = "mpiexec (auto: " if launch == "auto" else "srun (MPICOMM_LAUNCHER=srun)"
    assert job.launcher().startswith(want), job.describe()
    assert job.state == "COMPLETED" and job.exit_code == 0, job.describe()
    shape = _shape(launch, distribution)
    names = "n[1-2]" if shape.nodes == 2 else "n0"
    layout = RankLayout.from_shape(shape, node_names=names)
    assert job.last_line() == f"LAYOUT OK {layout.world_size} ranks on {','.join(layout.node_names)}", (
        job.describe()
    )
    records = [json.loads(p.read_text()) for p in PROBE_DIR.glob(f"layout-{job.job_id}.*.json")]
    assert sorted(r["mpi_rank"] for r in records) == list(range(layout.world_size)), job.describe()
    for record in records:
        placement = layout.ranks[record["mpi_rank"]]
        if distribution == "cyclic":  # rank r on node r mod N, local rank r // N (mpiexec -ppn 1)
            assert placement.node_index == record["mpi_rank"] % shape.nodes, record
        assert record["mpi_size"] == layout.world_size and record["placement"]["rank"] == placement.rank, (
            record
        )
        assert record["placement"]["node_name"] == placement.node_name, record
        assert record["env"]["SLURMD_NODENAME"] == placement.node_name, record
        if nodes_have_own_hostnames():
            assert record["host"] == placement.node_name, record
        assert record["placement"]["local_rank"] == placement.local_rank, record
        if launch == "srun":  # under mpiexec the SLURM_* task variables describe Hydra's proxies
            env = record["env"]
            assert int(env["SLURM_PROCID"]) == placement.rank, record
            assert int(env["SLURM_LOCALID"]) == placement.local_rank, record
            assert int(env["SLURM_NODEID"]) == placement.node_index, record


MISMATCH = [("auto", "env", "block"), ("srun", "mpi", "block")]


@pytest.mark.parametrize(("launch", "source", "distribution"), MISMATCH, ids=["-".join(c) for c in MISMATCH])
def test_check_environment_fails_a_job_started_on_fewer_ranks(
    tmp_path: Path, launch: str, source: str, distribution: str
) -> None:
    script, partition = _layout_script(tmp_path, launch, source, distribution)
    planned = _shape(launch, distribution).world_size
    running = 6 if launch == "auto" else 3
    options = ["--partition", partition, f"--ntasks={running}", "--ntasks-per-node=3"]
    job = submit(script, options, env=_env(launch))
    assert job.state == "FAILED" and job.exit_code != 0, job.describe()
    assert "LayoutMismatchError" in job.text, job.describe()
    assert f"planned for {planned} ranks, running on {running}" in job.text, job.describe()
    assert "LAYOUT OK" not in job.text, job.describe()


def test_sharded_job_submitted_on_6_ranks_stops_with_layout_mismatch() -> None:
    script = REPO / "jobs" / "sharded.sbatch"
    options = ["--partition", "two", "--time=3", "--ntasks=6", "--ntasks-per-node=3"]
    job = submit(script, options, env=job_env())
    assert job.state == "FAILED" and job.exit_code != 0, job.describe()
    assert "LayoutMismatchError" in job.text, job.describe()
    assert "planned for 8 ranks, running on 6" in job.text, job.describe()
    assert "PLAN OK" not in job.text, job.describe()
