"""Submit, wait for and read Slurm jobs on the test cluster that ``slurm-ci.sh start`` brings up.

``sbatch --wait`` polls after 2 s, then 8 s more (Slurm 22.05), so a 1 s job often takes 10 s; here
``scontrol show job`` is polled every 0.5 s instead (finished jobs stay visible for MinJobAge, 300 s).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mpicomm.planner import JobShape, RankLayout, render_sbatch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "slurm-ci.sh"
PROBE = Path(__file__).resolve().parent / "probe"
CI_DIR = Path(os.environ.get("SLURM_CI_DIR", "/tmp/slurm-ci"))
JOB_DIR = CI_DIR / "jobs"
PROBE_DIR = CI_DIR / "probe"
FINISHED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
    }
)
# What a test job must not inherit from the shell that runs pytest (an outer allocation, an mpiexec).
_FOREIGN = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_", "PMI_", "PMIX_", "HYDRA_", "OMPI_COMM_", "PYTEST_")


def job_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a test job gets (sbatch and srun export it to every task).

    ``MPICOMM_PYTHON`` is the interpreter running pytest unless set (an absolute path either way);
    ``probe/sitecustomize.py`` is put on ``PYTHONPATH`` so that every MPI process of the job records
    its rank and world size under ``MPICOMM_RANK_PROBE_DIR``.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN)}
    env["MPICOMM_PYTHON"] = str(Path(env.get("MPICOMM_PYTHON", sys.executable)).absolute())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROBE), env.get("PYTHONPATH", "")) if p)
    env["MPICOMM_RANK_PROBE_DIR"] = str(PROBE_DIR)
    env.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    env.update(extra or {})
    return env


def run(argv: Sequence[str], timeout: float = 60, env: Mapping[str, str] | None = None) -> str:
    """Run a Slurm command from the repository root; its stdout, or an AssertionError with everything."""
    done = subprocess.run(
        list(argv), cwd=REPO, env=dict(env or job_env()), capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} exited {done.returncode}\n--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
        )
    return done.stdout


def _field(record: str, name: str) -> str:
    found = re.search(rf"(?:^|\s){name}=(\S*)", record)
    return found.group(1) if found else ""


@dataclass
class Job:
    """A finished batch job: its state, exit code (128 + signal when killed) and output file."""

    job_id: str
    state: str
    exit_code: int
    output: Path
    record: str = field(repr=False)

    @property
    def text(self) -> str:
        """The job's output file (stdout and stderr of the batch script and its steps)."""
        return self.output.read_text(errors="replace") if self.output.exists() else ""

    def last_line(self, task: int | None = None) -> str:
        """The last non-empty line of the output, or of one task's lines when they were labelled.

        srun labels a task's lines ``0: ``, the MPICH wheel's mpiexec ``[0] ``; both are read.
        """
        lines = [line.strip() for line in self.text.splitlines() if line.strip()]
        if task is not None:
            labelled = (re.fullmatch(r"(?:(\d+):|\[(\d+)\])\s?(.*)", line) for line in lines)
            lines = [m.group(3).strip() for m in labelled if m and int(m.group(1) or m.group(2)) == task]
        return lines[-1] if lines else ""

    def launcher(self) -> str:
        """The launcher line the batch script printed: ``mpiexec (auto: ...)`` or ``srun (...)``."""
        found = re.search(r"^mpicomm: launcher (.*)$", self.text, re.MULTILINE)
        return found.group(1) if found else ""

    def run_seconds(self) -> int:
        """How long the job ran (``RunTime``), in seconds."""
        days, _, clock = _field(self.record, "RunTime").rpartition("-")
        h, m, sec = (int(x) for x in clock.split(":"))
        return int(days or 0) * 86400 + h * 3600 + m * 60 + sec

    def ranks(self) -> dict[int, list[str]]:
        """What the rank probe recorded: rank -> [rank, size, MPI processor name, SLURMD_NODENAME]."""
        seen: dict[int, list[str]] = {}
        for path in PROBE_DIR.glob(f"{self.job_id}.*"):
            words = path.read_text().split()
            seen[int(words[0])] = words
        return seen

    def describe(self) -> str:
        """Everything worth reading when a test on this job fails."""
        return (
            f"job {self.job_id}: state {self.state}, exit code {self.exit_code}\n"
            f"--- scontrol show job\n{self.record}\n--- {self.output}\n{self.text}"
        )


#: What slurmstepd writes when its pmi2 plugin cuts a PMI-1 request of the MPICH wheel (over 1024 bytes);
#: the ranks then wait in MPI_Init forever. The launcher choice keeps the wheel away from srun on 2+ nodes.
GARBLED_PMI = "mpi/pmi2: invalid client request"


def wait(job_id: str, output: Path, timeout: float = 150.0) -> Job:
    """Poll ``scontrol show job`` every 0.5 s until the job ends; scancel it after ``timeout`` s.

    Raises:
        AssertionError: the job ran past ``timeout``, or its output shows Slurm's PMI misread (then it is
            cancelled at once: nothing retries it).
    """
    deadline = time.monotonic() + timeout
    while True:
        record = run(["scontrol", "show", "job", "-o", job_id]).strip()
        state = _field(record, "JobState")
        if state in FINISHED:
            code, _, signal = _field(record, "ExitCode").partition(":")
            exit_code = 128 + int(signal) if signal and int(signal) else int(code or 0)
            return Job(job_id, state, exit_code, output, record)
        if output.exists() and GARBLED_PMI in output.read_text(errors="replace"):
            subprocess.run(["scancel", job_id], check=False)
            raise AssertionError(
                f"job {job_id}: MPI start-up garbled by Slurm's pmi2 plugin ({GARBLED_PMI!r} in {output}): "
                "the MPICH wheel was started by srun on 2+ nodes, which the launcher choice must avoid"
            )
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], check=False)
            raise AssertionError(f"job {job_id} still {state} after {timeout} s: cancelled\n{record}")
        time.sleep(0.5)


def submit(
    script: Path,
    options: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 150.0,
) -> Job:
    """Submit ``script`` from the repository root with ``options`` and wait for it to end (once: no retries).

    The output goes to ``$SLURM_CI_DIR/jobs/<job name>-<job id>.out`` (given on the command line, it
    overrides the script's ``#SBATCH --output``), so that tests leave nothing in the repository.
    """
    JOB_DIR.mkdir(parents=True, exist_ok=True)
    PROBE_DIR.mkdir(parents=True, exist_ok=True)
    argv = ["sbatch", "--parsable", f"--output={JOB_DIR}/%x-%j.out", *options, str(script)]
    job_id = run(argv, env=env).strip().split(";")[0]
    record = run(["scontrol", "show", "job", "-o", job_id]).strip()
    return wait(job_id, Path(_field(record, "StdOut")), timeout)


def render(
    path: Path, shape: JobShape, command: Sequence[str], *, name: str, time_limit: str = "00:02:00", **kw: str
) -> Path:
    """Write the planner's batch script for ``shape`` running ``command`` (launcher chosen at run time)."""
    layout = RankLayout.from_shape(shape)
    path.write_text(render_sbatch(layout, list(command), job_name=name, time=time_limit, environ={}, **kw))
    return path


def sbatch_directives(script: Path) -> dict[str, str]:
    """The ``#SBATCH --name=value`` lines of a batch script (short options are not used in jobs/)."""
    found: dict[str, str] = {}
    for line in script.read_text().splitlines():
        if not line.startswith("#SBATCH"):
            if line.strip() and not line.startswith("#"):
                break  # sbatch stops reading directives at the first command
            continue
        for word in line.split()[1:]:
            name, _, value = word.lstrip("-").partition("=")
            found[name] = value
    return found


def nodes_have_own_hostnames() -> bool:
    """Whether each slurmd runs in its own UTS namespace (``slurm-ci.sh`` falls back when it cannot)."""
    return not (CI_DIR / "run" / "shared-hostname").exists()


def daemon_logs(lines: int = 40) -> str:
    """The last lines of every daemon log, for a failure report."""
    parts = []
    for path in sorted((CI_DIR / "log").glob("*")):
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {path}\n" + "\n".join(tail))
    return "\n".join(parts)
