"""The README's first command ends in ``mpirun -n 8 python -m mpicomm.demo``: run the demo for real."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

MPIEXEC = Path(sys.executable).parent / "mpiexec"


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "PYTEST_"))}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, check=False)


def _flags() -> list[str]:
    version = subprocess.run([str(MPIEXEC), "--version"], capture_output=True, text=True, check=False)
    return ["--oversubscribe"] if "open" in (version.stdout + version.stderr).lower() else []


def test_demo_without_a_launcher_checks_every_result() -> None:
    done = _run([sys.executable, "-m", "mpicomm.demo"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "all checks passed" in done.stdout
    assert "all_to_all_single" in done.stdout and "KJTAllToAll" in done.stdout
    assert "broadcast_object_list (config)" in done.stdout and "gather_object" in done.stdout


@pytest.mark.parametrize("ranks", [3, 8])
def test_demo_under_mpiexec_checks_every_result(ranks: int) -> None:
    cmd = [str(MPIEXEC), *_flags(), "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "mpicomm.demo"]
    done = _run(cmd)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("all checks passed") == 1  # one table, from rank 0
    assert f"on {ranks} rank" in done.stdout
    # rank 0 prints the configuration every shown rank received and the summaries it gathered
    assert done.stdout.count("'layers': [64, 32]") == (ranks if ranks <= 4 else 3) + 1
    # the planner section: every rank planned the same; each rank has a row and a bar
    assert f"on {ranks} rank(s), the same plan on every rank: True" in done.stdout
    assert all(f"rank {r:>{len(str(ranks - 1))}} |" in done.stdout for r in range(ranks))
    for r in range(ranks):
        assert f"{{'rank': {r}, 'sum': {3.0 * (r + 1)}, 'max': {2.0 * (r + 1)}}}" in done.stdout


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="cupy is installed here")
def test_demo_on_cuda_without_cupy_says_what_to_install() -> None:
    done = _run([sys.executable, "-m", "mpicomm", "demo", "--device", "cuda"])
    assert done.returncode == 2
    assert "--device cuda needs cupy: pip install 'mpicomm[cuda12]'" in done.stderr
