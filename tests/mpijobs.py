"""Jobs in fresh processes for the unit tests: ``mpiexec -n N python job.py``, or one interpreter outside MPI.

In such a job mpicomm, not ``python -m mpi4py``, starts MPI; the tests read its exit status, its
output and how long it took. The timeout only turns a hang into a failure that shows the output.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

MPIEXEC = Path(sys.executable).parent / "mpiexec"
REPO = Path(__file__).resolve().parents[1]

#: Skips a test module where the interpreter has no ``mpiexec`` beside it.
needs_mpiexec = pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable}")


def run_job(
    tmp_path: Path, body: str, ranks: int = 2, env: dict[str, str] | None = None, timeout: float = 90
) -> tuple[int, str, float]:
    """Run ``body`` under ``mpiexec -n ranks python``; return its exit status, output and seconds.

    The caller's mpi4py and thread-level settings (``MPI4PY_RC_*``, ``MPICOMM_THREAD*``) are left out
    so that a job starts MPI as mpicomm chooses unless ``env`` says otherwise.
    """
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("MPI4PY_RC_", "MPICOMM_THREAD"))}
    environment.update({"OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})})
    start = time.monotonic()
    proc = subprocess.Popen(
        [str(MPIEXEC), "-n", str(ranks), sys.executable, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the job hung:\n{out}")
    return proc.returncode, out, time.monotonic() - start


def python(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> dict:
    """Run ``code`` in a fresh interpreter outside any MPI launcher; it prints one JSON object last.

    The launcher's variables (and mpicomm's own settings) are left out, so that the child starts as
    a plain ``python`` would; ``env`` adds to what is left. Returns that last JSON object.
    """
    drop = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIEXEC_", "MPICOMM_")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    clean["OMP_NUM_THREADS"] = "1"
    clean.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=clean,
        cwd=REPO,
        timeout=timeout,
    )
    assert proc.returncode == 0, f"rc={proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])
