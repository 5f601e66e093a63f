"""A job in which one rank fails must end at once and exit non-zero, not hang until its time limit."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from slurmjob import job_env, submit

from mpicomm.planner import JobShape, RankLayout, render_sbatch

pytestmark = pytest.mark.usefixtures("slurm")

# One rank raises while the others wait in a barrier: mpicomm's abort hook (and python -m mpi4py)
# must turn that into MPI_Abort, so srun, the batch script and sbatch all report a failure.
PROGRAM = """\
import sys
import mpicomm

mpicomm.init()
rank, size = mpicomm.get_rank(), mpicomm.get_world_size()
failing = int(sys.argv[1])
if rank == failing % size:
    raise RuntimeError(f"rank {rank} of {size} fails on purpose")
mpicomm.barrier()
print(f"rank {rank}: the barrier returned although rank {failing % size} failed", flush=True)
"""

SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=mpicomm-fail
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --time=00:02:00
set -euo pipefail
srun "$MPICOMM_PYTHON" -m mpi4py {program} {failing}
"""


def _write(tmp_path: Path, failing: int) -> Path:
    program = tmp_path / "fail.py"
    program.write_text(PROGRAM)
    script = tmp_path / "fail.sbatch"
    script.write_text(textwrap.dedent(SCRIPT.format(program=program, failing=failing)))
    return script


@pytest.mark.parametrize("failing", [3, 0])
def test_job_with_one_failing_rank_exits_nonzero(tmp_path: Path, failing: int) -> None:
    job = submit(_write(tmp_path, failing), ["--partition", "two"], env=job_env())
    assert job.state == "FAILED" and job.exit_code != 0, job.describe()
    assert f"rank {failing} of 4 fails on purpose" in job.text, job.describe()
    assert "the barrier returned" not in job.text, job.describe()


def test_rendered_job_with_one_failing_rank_exits_nonzero(tmp_path: Path) -> None:
    layout = RankLayout.from_shape(JobShape(nodes=2, ntasks_per_node=2), node_names="n[1-2]")
    program = tmp_path / "fail.py"
    program.write_text(PROGRAM)
    script = tmp_path / "rendered-fail.sbatch"
    text = render_sbatch(
        layout,
        [str(program), "1"],
        job_name="mpicomm-rendered-fail",
        time="00:02:00",
        environ={"MPICOMM_PARTITION": "two"},
    )
    assert "#SBATCH --partition=two" in text, text
    script.write_text(text)
    job = submit(script, env=job_env())
    assert job.state == "FAILED" and job.exit_code != 0, job.describe()
    assert "Partition=two " in job.record, job.describe()
    assert "rank 1 of 4 fails on purpose" in job.text, job.describe()
    assert "the barrier returned" not in job.text, job.describe()
