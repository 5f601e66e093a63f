"""A job in which one rank fails must end at once and exit non-zero, not hang until its time limit.

Two nodes under the scripts' own launcher choice (the MPICH wheel's mpiexec), one node under srun.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from slurmjob import job_env, render, submit

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

MAX_SECONDS = 30  # "at once": far below the 2-minute limit a hung job would run into


def _write(tmp_path: Path, failing: int) -> Path:
    program = tmp_path / "fail.py"
    program.write_text(PROGRAM)
    shape = JobShape(nodes=2, ntasks_per_node=2)
    return render(tmp_path / "fail.sbatch", shape, [str(program), str(failing)], name="mpicomm-fail")


@pytest.mark.parametrize("failing", [3, 0])
def test_two_node_job_with_one_failing_rank_ends_at_once_nonzero(tmp_path: Path, failing: int) -> None:
    job = submit(_write(tmp_path, failing), ["--partition", "two"], env=job_env())
    assert job.launcher().startswith("mpiexec (auto: "), job.describe()
    assert job.state == "FAILED" and job.exit_code != 0, job.describe()
    assert job.run_seconds() < MAX_SECONDS, f"ran {job.run_seconds()} s\n{job.describe()}"
    assert f"rank {failing} of 4 fails on purpose" in job.text, job.describe()
    assert "the barrier returned" not in job.text, job.describe()


def test_rendered_job_with_one_failing_rank_exits_nonzero_under_srun(tmp_path: Path) -> None:
    # srun with the wheel only on one node (no PMI address exchange there); the partition from the environment
    layout = RankLayout.from_shape(JobShape(nodes=1, ntasks_per_node=4), node_names="n0")
    program = tmp_path / "fail.py"
    program.write_text(PROGRAM)
    script = tmp_path / "rendered-fail.sbatch"
    text = render_sbatch(
        layout,
        [str(program), "1"],
        job_name="mpicomm-rendered-fail",
        time="00:02:00",
        environ={"MPICOMM_PARTITION": "one"},
    )
    assert "#SBATCH --partition=one" in text, text
    script.write_text(text)
    job = submit(script, env=job_env({"MPICOMM_LAUNCHER": "srun"}))
    assert job.launcher() == "srun (MPICOMM_LAUNCHER=srun)", job.describe()
    assert job.state == "FAILED" and job.exit_code != 0, job.describe()
    assert job.run_seconds() < MAX_SECONDS, f"ran {job.run_seconds()} s\n{job.describe()}"
    assert "Partition=one " in job.record, job.describe()
    assert "rank 1 of 4 fails on purpose" in job.text, job.describe()
    assert "the barrier returned" not in job.text, job.describe()
