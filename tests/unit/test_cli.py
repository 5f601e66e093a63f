"""One command tree: ``python -m mpicomm {info,demo,plan,bench}``, the ``mpicomm`` script, the old ones."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "mpicomm"


def _run(*args: str, exe: tuple[str, ...] = (sys.executable,)) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "PYTEST_"))}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([*exe, *args], capture_output=True, text=True, timeout=180, env=env, check=False)


@pytest.mark.process
def test_no_command_prints_the_tree() -> None:
    done = _run("-m", "mpicomm")
    assert done.returncode == 0, done.stderr
    for command in ("info", "demo", "plan", "bench"):
        assert f"    {command} " in done.stdout


@pytest.mark.process
@pytest.mark.parametrize("command", ["info", "demo", "plan", "bench"])
def test_every_command_has_help(command: str) -> None:
    done = _run("-m", "mpicomm", command, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ") and f"mpicomm {command}" in done.stdout


@pytest.mark.process
@pytest.mark.parametrize("module", ["mpicomm.demo", "mpicomm.plan", "mpicomm.bench"])
def test_old_module_entry_points_keep_working(module: str) -> None:
    done = _run("-m", module, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ")


@pytest.mark.process
def test_plan_runs_as_a_command() -> None:
    done = _run("-m", "mpicomm", "plan", "--nodes", "2", "--ntasks-per-node", "2")
    assert done.returncode == 0, done.stderr
    assert "node1" in done.stdout


@pytest.mark.process
def test_demo_quiet_prints_only_the_verdict() -> None:
    done = _run("-m", "mpicomm", "demo", "--quiet")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "all checks passed"


@pytest.mark.process
def test_unknown_command_is_refused_with_the_choices() -> None:
    done = _run("-m", "mpicomm", "launch")
    assert done.returncode == 2
    assert "invalid choice: 'launch'" in done.stderr and "info" in done.stderr


@pytest.mark.process
@pytest.mark.skipif(not SCRIPT.exists(), reason="the mpicomm console script is not installed here")
def test_console_script_is_the_same_tree() -> None:
    done = _run("plan", "--help", exe=(str(SCRIPT),))
    assert done.returncode == 0, done.stderr
    assert "mpicomm plan" in done.stdout
    assert _run("--version", exe=(str(SCRIPT),)).stdout.startswith("mpicomm ")


def test_console_script_is_declared() -> None:
    setup = (Path(__file__).resolve().parents[2] / "setup.cfg").read_text()
    assert "console_scripts =\n    mpicomm = mpicomm.__main__:main" in setup
