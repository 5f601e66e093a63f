"""The scripts' launcher choice under a real Slurm: auto for the MPICH wheel and for Debian's Open MPI, the
overrides, both output labels, and the regression test of the multi-node start-up hang.

The hang (docs/jobs.rst, "When a job hangs"): Slurm's pmi2 plugin reads a PMI-1 request in one 1024-byte
read, and the MPICH wheel's address exchange sends requests of up to ~1100 bytes on 2+ nodes, their length
set by heap bytes, so by the environment. Under ``auto`` the wheel runs under its own mpiexec, which reads
whole lines; the regression test pads the environment until requests cross 1024 bytes and checks that
every such job starts cleanly.
"""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import pytest
from slurmjob import JOB_DIR, REPO, Job, job_env, render, submit

from mpicomm.planner import JobShape

pytestmark = pytest.mark.usefixtures("slurm")

DEBIAN_PYTHON = Path("/usr/bin/python3")
PROGRAM = """\
from mpi4py import MPI

comm = MPI.COMM_WORLD
comm.Barrier()
print(f"rank {comm.rank}: {MPI.Get_processor_name()}", flush=True)
comm.Barrier()
if comm.rank == 0:
    print(f"LAUNCH OK {comm.size}", flush=True)
"""


def _program(tmp_path: Path) -> Path:
    path = tmp_path / "launch.py"
    path.write_text(PROGRAM)
    return path


def _check(job: Job, ranks: int, nodes: int) -> None:
    assert job.state == "COMPLETED" and job.exit_code == 0, job.describe()
    seen = job.ranks()
    assert sorted(seen) == list(range(ranks)), f"MPI ranks {sorted(seen)}; want {ranks}\n{job.describe()}"
    assert {words[1] for words in seen.values()} == {str(ranks)}, job.describe()
    assert len({words[3] for words in seen.values()}) == nodes, job.describe()


def test_auto_starts_debian_open_mpi_with_srun(tmp_path: Path) -> None:
    if not DEBIAN_PYTHON.exists() or os.system(f"{DEBIAN_PYTHON} -c 'import mpi4py' 2>/dev/null") != 0:
        pytest.skip("Debian's python3-mpi4py (Open MPI) is not installed: slurm-ci.sh install adds it")
    script = render(
        tmp_path / "ompi.sbatch", JobShape(nodes=2, ntasks_per_node=2), [str(_program(tmp_path))], name="ompi"
    )
    # Debian's Open MPI speaks PMIx only: the srun plugin is the submitter's override
    env = job_env({"MPICOMM_PYTHON": str(DEBIAN_PYTHON), "MPICOMM_SRUN_MPI": "pmix", "SLURM_LABELIO": "1"})
    job = submit(script, ["--partition", "two"], env=env)
    assert job.launcher() == "srun (auto: the MPI library is not PyPI's MPICH wheel)", job.describe()
    _check(job, 4, 2)
    assert job.last_line(task=0) == "LAUNCH OK 4", job.describe()  # srun's "0: " label
    assert re.search(r"^3: rank 3: ", job.text, re.MULTILINE), job.describe()


def test_srun_override_runs_the_wheel_on_one_node(tmp_path: Path) -> None:
    script = render(
        tmp_path / "srun.sbatch", JobShape(nodes=1, ntasks_per_node=4), [str(_program(tmp_path))], name="srun"
    )
    job = submit(
        script, ["--partition", "one"], env=job_env({"MPICOMM_LAUNCHER": "srun", "SLURM_LABELIO": "1"})
    )
    assert job.launcher() == "srun (MPICOMM_LAUNCHER=srun)", job.describe()
    _check(job, 4, 1)
    assert job.last_line(task=0) == "LAUNCH OK 4", job.describe()  # "0: LAUNCH OK 4"
    assert "[0] " not in job.text, job.describe()


def test_mpiexec_override_labels_ranks_in_brackets(tmp_path: Path) -> None:
    script = render(
        tmp_path / "mpiexec.sbatch",
        JobShape(nodes=2, ntasks_per_node=2),
        [str(_program(tmp_path))],
        name="mx",
    )
    env = job_env({"MPICOMM_LAUNCHER": "mpiexec", "SLURM_LABELIO": "1", "PYTHONUNBUFFERED": "1"})
    job = submit(script, ["--partition", "two"], env=env)
    assert job.launcher() == "mpiexec (MPICOMM_LAUNCHER=mpiexec)", job.describe()
    _check(job, 4, 2)
    assert job.last_line(task=0) == "LAUNCH OK 4", job.describe()  # "[0] LAUNCH OK 4"
    assert re.search(r"^\[3\] rank 3: ", job.text, re.MULTILINE), job.describe()


# --- the regression test of the hang ------------------------------------------------------------------

#: Lengths of an environment variable that move the heap so that the wheel's segmented address puts cross
#: 1024 bytes. Found with PMI_DEBUG=1 on the CI machine from an interactive shell's environment (584-628 gave
#: requests of 1024-1098 bytes); the environment pytest passes moves the window, and a run that reaches no
#: request over 1024 bytes says so in a warning. Tried in this order until CROSSINGS jobs crossed.
PADDINGS = (584, 592, 600, 608, 616, 624, 576, 568, 632, 640)
CROSSINGS = 3
MOST_JOBS = 4
_PUT = re.compile(r"send to fd=\d+ pmi: (cmd=put .*)")


def _longest_put(text: str) -> int:
    """The longest PMI-1 ``put`` request (with its newline) that PMI_DEBUG=1 printed."""
    return max((len(m.group(1)) + 1 for m in _PUT.finditer(text)), default=0)


def _padded_env(padding: int) -> dict[str, str]:
    """The test jobs' environment with ``MPICOMM_PAD`` of ``padding`` bytes, and PMI_DEBUG=1."""
    return job_env({"PMI_DEBUG": "1", "MPICOMM_PAD": "X" * padding})


def test_two_node_wheel_jobs_with_pmi_requests_over_1024_bytes_start_cleanly_under_auto() -> None:
    script = REPO / "jobs" / "demo.sbatch"  # 2 nodes x 4 ranks, the README's example
    longest: dict[int, int] = {}
    for padding in PADDINGS[:MOST_JOBS]:
        job = submit(script, ["--partition", "two", "--time=2"], env=_padded_env(padding))
        assert job.launcher().startswith("mpiexec (auto: "), job.describe()
        _check(job, 8, 2)
        assert "all checks passed" in job.text and "FAILED" not in job.text, job.describe()
        longest[padding] = _longest_put(job.text)
        if sum(n > 1024 for n in longest.values()) >= CROSSINGS:
            break
    if not any(n > 1024 for n in longest.values()):
        # Not a failure of the launcher (every job started), but this run did not reach the hang's
        # condition: say so in the test summary instead of passing quietly.
        warnings.warn(
            f"no padding made a PMI request cross 1024 bytes (longest per padding: {longest}); the hang's "
            f"condition was not reached: pick PADDINGS anew with PMI_DEBUG=1 (job outputs in {JOB_DIR})",
            stacklevel=1,
        )
    print(f"longest PMI-1 put per padding, all started cleanly: {longest}")
