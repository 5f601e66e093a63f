"""A plan for several nodes started on one machine says so, not something about local ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpicomm.planner import JobShape, LayoutMismatchError, RankLayout, check_environment

REPO = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).parent / "mpiexec"


def test_all_ranks_on_one_machine_is_named_as_such() -> None:
    layout = RankLayout.from_shape(JobShape(nodes=2, ntasks_per_node=4))
    env = {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": "5", "MPI_LOCALNRANKS": "8"}
    with pytest.raises(LayoutMismatchError, match=r"planned for 2 nodes, running on 1 \(all 8 ranks") as info:
        check_environment(layout, env)
    assert "MPI_LOCALNRANKS" in str(info.value) and "--nodes 1 --ntasks-per-node 8" in str(info.value)
    open_mpi = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}
    with pytest.raises(LayoutMismatchError, match="planned for 2 nodes, running on 1"):
        check_environment(layout, open_mpi)


def test_one_node_plan_on_one_machine_passes() -> None:
    layout = RankLayout.from_shape(JobShape(nodes=1, ntasks_per_node=4))
    env = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "3", "MPI_LOCALNRANKS": "4"}
    assert check_environment(layout, env).local_rank == 3


@pytest.mark.process
def test_run_plan_under_mpiexec_on_one_machine() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "PYTEST_"))}
    env["OMP_NUM_THREADS"] = "1"
    version = subprocess.run([str(MPIEXEC), "--version"], capture_output=True, text=True, check=False)
    flags = ["--oversubscribe"] if "open" in (version.stdout + version.stderr).lower() else []
    cmd = [str(MPIEXEC), *flags, "-n", "8", sys.executable, "-m", "mpi4py", "-m", "mpicomm.planner.run_plan"]
    done = subprocess.run(
        [*cmd, "jobs/sharded.plan.json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode != 0
    assert "planned for 2 nodes, running on 1" in done.stdout + done.stderr
