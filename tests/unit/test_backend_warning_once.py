"""The warning for a backend name other than "mpi" comes once per job, from rank 0, not from every rank."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

MPIEXEC = Path(sys.executable).parent / "mpiexec"
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable}")
def test_three_ranks_asking_for_gloo_and_nccl_print_one_warning(tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(
        textwrap.dedent(
            """
            import sys
            import mpicomm
            mpicomm.init_process_group("gloo")
            mpicomm.new_group(backend="nccl")
            with open(f"{sys.argv[1]}/rank{mpicomm.get_rank()}.txt", "w") as f:
                f.write(f"backend {mpicomm.get_backend()}")
            """
        )
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [str(MPIEXEC), "-n", "3", sys.executable, str(job), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    text = out.stdout + out.stderr
    assert text.count("is served by MPI") == 1, text
    # each rank answers in a file of its own: the launcher may interleave the ranks' output mid-line
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in range(3)] == ["backend gloo"] * 3, text
