"""bind_device chooses the GPU before MPI starts where the launcher announced the local rank (fix 11).

Run in a fresh interpreter with the fake cupy (tests/fakecupy), so that "MPI not started" is true.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fakecupy
import pytest

pytestmark = pytest.mark.process

SCRIPT = """
import json, sys
import cupy
from mpicomm.gpu.device import bind_device
index = bind_device()
mpi = sys.modules.get("mpi4py.MPI")
print(json.dumps({"index": index, "current": cupy.cuda.Device().id,
                  "mpi_started": bool(mpi is not None and mpi.Is_initialized())}))
"""


def _run(env_extra: dict[str, str]) -> dict[str, object]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "MPI_", "SLURM_", "HYDRA"))
    }
    env.update({"PYTHONPATH": os.pathsep.join([fakecupy.PATH, str(Path(__file__).parents[2])]), **env_extra})
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def test_bind_device_uses_the_launcher_rank_and_leaves_mpi_unstarted() -> None:
    got = _run({"OMPI_COMM_WORLD_LOCAL_RANK": "3", "FAKECUPY_DEVICE_COUNT": "2"})
    assert got == {"index": 1, "current": 1, "mpi_started": False}


def test_bind_device_without_a_launcher_variable_asks_mpi() -> None:
    got = _run({"FAKECUPY_DEVICE_COUNT": "2"})
    assert got == {"index": 0, "current": 0, "mpi_started": True}
