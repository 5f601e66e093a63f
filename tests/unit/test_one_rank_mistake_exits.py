"""A mistake on one rank under validation mode ends a plain ``python`` job, never hangs it.

The job runs under ``mpiexec`` with plain ``python`` (no ``-m mpi4py``, so no abort on an uncaught
exception): rank 0 alone passes a wrong ``output_split_sizes``; every rank catches the error and
calls ``sys.exit(3)``. Before validation mode carried local failures, the other ranks waited in the
validation exchange forever. The timeout is only a guard that reports a hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

MPIEXEC = Path(sys.executable).parent / "mpiexec"
REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable}")

SCRIPT = """
    import sys

    import numpy as np

    import mpicomm

    mpicomm.init(abort_on_exception=False)
    mpicomm.set_validation(True)
    w, r = mpicomm.get_world_size(), mpicomm.get_rank()
    out_splits = [2] + [1] * (w - 1) if r == 0 else [1] * w
    try:
        mpicomm.all_to_all_single(np.empty(w), np.ones(w), out_splits, [1] * w)
    except mpicomm.ArgumentError as exc:
        print(f"rank {r} caught: {exc}", flush=True)
        sys.exit(3)
    print(f"rank {r} went on", flush=True)
"""


def test_every_rank_catches_the_error_and_the_job_exits(tmp_path: Path) -> None:
    path = tmp_path / "mistake.py"
    path.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [str(MPIEXEC), "-n", "2", sys.executable, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the job hung after a mistake on rank 0:\n{out}")
    assert proc.returncode != 0
    for rank in (0, 1):
        assert f"rank {rank} caught: all_to_all_single: output_split_sizes" in out, out
    assert "went on" not in out
