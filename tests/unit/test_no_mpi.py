"""Without a loadable MPI library: import and the planner work, MPI use gets one short mpicomm error.

Each check runs in a fresh interpreter with ``MPI4PY_LIBMPI`` pointing at a library that does not
exist, as on a machine where ``pip install mpicomm`` went without the ``[mpich]`` extra.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

NOWHERE = "/nonexistent/mpi/lib/libmpi.so"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "PYTEST_"))}
    env["MPI4PY_LIBMPI"] = NOWHERE
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=120, env=env, check=False
    )


def test_import_and_planner_work_without_mpi() -> None:
    code = (
        "import mpicomm\n"
        "from mpicomm.planner import GreedyPerfPartitioner, Shard, ShardingOption, Storage, Topology\n"
        "topo = Topology(world_size=2, compute_device='cpu', ddr_cap=1 << 30)\n"
        "opts = [ShardingOption('t', 'device', [Shard(Storage(0, 1 << 20), 1.0)])]\n"
        "GreedyPerfPartitioner().partition(opts, topo)\n"
        "print('planned', opts[0].shards[0].rank)\n"
    )
    done = _run("-c", code)
    assert done.returncode == 0, done.stderr
    assert "planned 0" in done.stdout


def test_first_mpi_use_raises_one_short_error_saying_what_to_do() -> None:
    code = (
        "import numpy as np, mpicomm\n"
        "try:\n"
        "    mpicomm.all_reduce(np.ones(2))\n"
        "except mpicomm.MPIUnavailableError as exc:\n"
        "    assert isinstance(exc, RuntimeError) and exc.__cause__ is None\n"
        "    print(exc)\n"
    )
    done = _run("-c", code)
    assert done.returncode == 0, done.stderr
    message = done.stdout
    assert message.startswith("mpicomm: no MPI library could be loaded; mpi4py tried " + NOWHERE)
    for remedy in ('pip install "mpicomm[mpich]"', "module load", "MPI4PY_LIBMPI=", "python -m mpicomm info"):
        assert remedy in message
    assert len(message.strip().splitlines()) <= 8


def test_info_prints_the_diagnosis_instead_of_a_traceback() -> None:
    done = _run("-m", "mpicomm", "info")
    assert done.returncode == 1
    assert "Traceback" not in done.stdout + done.stderr
    assert "MPI:      not available" in done.stdout
    assert NOWHERE in done.stdout and 'pip install "mpicomm[mpich]"' in done.stdout


def test_demo_command_without_mpi_prints_the_diagnosis() -> None:
    done = _run("-m", "mpicomm", "demo", "--quiet")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("mpicomm: no MPI library could be loaded")


def test_plan_command_works_without_mpi() -> None:
    done = _run("-m", "mpicomm", "plan", "--nodes", "2", "--ntasks-per-node", "2")
    assert done.returncode == 0, done.stderr
    assert "node1" in done.stdout
