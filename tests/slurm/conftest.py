"""A real Slurm for the job tests: ``slurm-ci.sh start`` once per session, ``stop`` at the end, always.

The tests skip, saying how to run them, when this is not root or Slurm cannot be installed (no apt-get,
or apt-get failed). Run them as root on Debian/Ubuntu with ``make test-slurm``. On failure, each report
gets the tail of every Slurm daemon log; the job tests put the job's own output in their messages.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Generator, Iterator
from types import FrameType
from typing import Any

import pytest
from slurmjob import CI_DIR, SCRIPT, daemon_logs

HOW = "run them as root on Debian/Ubuntu: make test-slurm"


def _script(command: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLURM_CI_DIR": str(CI_DIR)}
    return subprocess.run(
        ["bash", str(SCRIPT), command], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # so that the fixture below still stops the daemons


class _State:
    started = False


@pytest.fixture(scope="session")
def slurm() -> Iterator[None]:
    """A running cluster: partition ``one`` (node n0, 8 CPUs) and ``two`` (n1 and n2, 4 CPUs each)."""
    if os.geteuid() != 0:
        pytest.skip(f"the Slurm tests install and start Slurm daemons, which needs root; {HOW}")
    installed = _script("install", timeout=600)
    if installed.returncode != 0:
        pytest.skip(f"Slurm is missing and could not be installed ({installed.stderr.strip()}); {HOW}")
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        _State.started = True
        started = _script("start", timeout=120)
        if started.returncode != 0:
            pytest.fail(f"slurm-ci.sh start failed:\n{started.stdout}{started.stderr}\n{daemon_logs()}")
        yield
    finally:
        stopped = _script("stop", timeout=120)
        _State.started = False
        signal.signal(signal.SIGTERM, previous)
        if stopped.returncode != 0:
            print(f"slurm-ci.sh stop failed:\n{stopped.stdout}{stopped.stderr}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed and _State.started:
        report.sections.append(("Slurm daemon logs (tails)", daemon_logs()))
    return report
