"""Fail-fast: one rank's failure ends the whole MPI job within seconds, never a hang.

These tests launch real jobs (``mpiexec -n 3``) from scripts written into ``tmp_path``: the abort hook
of :mod:`mpicomm.core.failure`, its opt-out, and the multi-rank pytest harness of ``tests/mpi/conftest.py``
(one report, fail-fast with ``-x``, deadlocks ended by pytest-timeout).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
MPIEXEC = BIN / "mpiexec"
REPO = Path(__file__).resolve().parents[2]
HARNESS = REPO / "tests" / "mpi" / "conftest.py"

pytestmark = [
    pytest.mark.skipif(not MPIEXEC.exists(), reason=f"no mpiexec next to {sys.executable}"),
    pytest.mark.process,
]


@dataclass
class Job:
    rc: int | None
    out: str
    err: str
    seconds: float
    timed_out: bool

    @property
    def text(self) -> str:
        return self.out + self.err

    def describe(self) -> str:
        head = f"rc={self.rc} after {self.seconds:.1f}s, timed out: {self.timed_out}"
        return f"{head}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"


def _environment(extra: dict[str, str] | None) -> dict[str, str]:
    # a clean launch: no variables of an enclosing MPI job, no validation or opt-out unless asked
    drop = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPIEXEC_", "MPICOMM_", "PYTEST_")
    keep = ("OMPI_ALLOW_RUN_AS_ROOT", "PRTE_MCA_rmaps_default_mapping_policy")  # Open MPI as root, 8 ranks
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop) or k.startswith(keep)}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def _mpiexec_flags() -> list[str]:
    try:
        version = subprocess.run([str(MPIEXEC), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return (
        ["--oversubscribe"] if re.search(r"open ?mpi|openrte", version.stdout + version.stderr, re.I) else []
    )


def run_job(
    args: list[str],
    *,
    n: int = 3,
    timeout: float = 20,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> Job:
    """``mpiexec -n n args...``; after ``timeout`` seconds the whole job is killed and reported."""
    cmd = [str(MPIEXEC), *_mpiexec_flags(), "-n", str(n), *args]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment(env),
        cwd=cwd or REPO,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return Job(proc.returncode, out, err, time.monotonic() - start, False)
    except subprocess.TimeoutExpired:
        seconds = time.monotonic() - start
        for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                out, err = proc.communicate(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            out, err = "", ""
        return Job(proc.returncode, out, err, seconds, True)


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


RANK_ONE_RAISES = """
    import numpy as np
    import mpicomm

    mpicomm.init()
    x = np.ones(2)
    mpicomm.all_reduce(x)


    def compute_step():
        raise RuntimeError("boom from rank one")


    if mpicomm.get_rank() == 1:
        compute_step()
    mpicomm.barrier()  # ranks 0 and 2 wait here for rank 1, which never comes
    print("unreachable", flush=True)
"""


# --------------------------------------------------------------------------------------------------
# the abort hook


def test_uncaught_exception_ends_the_job(tmp_path: Path) -> None:
    job = run_job([sys.executable, str(script(tmp_path, "job.py", RANK_ONE_RAISES))])
    assert not job.timed_out, "the job hung instead of aborting\n" + job.describe()
    assert job.rc != 0, job.describe()
    assert job.seconds < 20
    assert "unreachable" not in job.out
    # the failing rank's traceback, every line prefixed with its rank
    assert "[rank 1] Traceback (most recent call last):" in job.err, job.describe()
    assert "[rank 1] RuntimeError: boom from rank one" in job.err, job.describe()
    assert re.search(r"\[rank 1\] +File .*job\.py.*, in compute_step", job.err), job.describe()
    assert "[rank 1] mpicomm: uncaught exception, aborting the MPI job" in job.err
    assert "[rank 0]" not in job.err and "[rank 2]" not in job.err


def test_uncaught_exception_in_a_thread_ends_the_job(tmp_path: Path) -> None:
    body = """
        import threading
        import mpicomm

        mpicomm.init()
        if mpicomm.get_rank() == 1:
            def worker():
                raise ValueError("thread on rank one failed")
            t = threading.Thread(target=worker)
            t.start()
            t.join()
        mpicomm.barrier()
        print("unreachable", mpicomm.get_rank(), flush=True)
    """
    job = run_job([sys.executable, str(script(tmp_path, "thread.py", body))])
    assert not job.timed_out, "the job hung instead of aborting\n" + job.describe()
    assert job.rc != 0 and job.seconds < 20, job.describe()
    assert "[rank 1] ValueError: thread on rank one failed" in job.err, job.describe()


def test_thread_hook_never_returns_to_the_program(tmp_path: Path) -> None:
    """After a fatal error in a thread, the rank must not go on running the program.

    MPICH's MPI_Abort, called from a thread other than the main one, returns (the process manager
    kills the job a moment later); the hook must not let the rank continue meanwhile. A stand-in
    for MPI whose Abort returns makes this deterministic, in one process without a launcher.
    """
    body = """
        import sys, threading, types
        import mpicomm
        from mpicomm import _mpi
        from mpicomm.core import failure

        world = mpicomm.init()
        failure.install_abort_hook()  # init installs it only above one rank


        class World:
            def Get_rank(self):
                return 0

            def Abort(self, code=0):
                sys.stderr.write(f"Abort({code}) called\\n")
                sys.stderr.flush()


        real, _mpi.MPI = _mpi.MPI, types.SimpleNamespace(COMM_WORLD=World())


        def worker():
            raise ValueError("fatal in a thread")


        t = threading.Thread(target=worker)
        t.start()
        t.join()
        _mpi.MPI = real
        print("the rank went on after the fatal error", flush=True)
    """
    path = script(tmp_path, "thread_hook.py", body)
    proc = subprocess.Popen(
        [sys.executable, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_environment(None),
        cwd=REPO,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # blocking until the process manager kills the rank is fine too
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    assert "Abort(1) called" in err, err
    assert "ValueError: fatal in a thread" in err, err
    assert "went on" not in out, f"the rank kept running after the fatal error\n{out}\n{err}"
    assert proc.returncode != 0


def test_exception_in_rank_zero_ends_the_job(tmp_path: Path) -> None:
    body = RANK_ONE_RAISES.replace("get_rank() == 1", "get_rank() == 0").replace("rank one", "rank zero")
    job = run_job([sys.executable, str(script(tmp_path, "zero.py", body))])
    assert not job.timed_out, job.describe()
    assert job.rc != 0 and job.seconds < 20
    assert "[rank 0] RuntimeError: boom from rank zero" in job.err, job.describe()


def test_sys_exit_with_an_error_code_on_one_rank_ends_the_job_under_the_mpi4py_runner(tmp_path: Path) -> None:
    """``sys.exit(3)`` on one rank never reaches an excepthook, so mpicomm's hook cannot see it
    (documented); ``python -m mpi4py`` turns the non-zero exit into MPI_Abort, as the docs advise."""
    body = """
        import sys
        import mpicomm

        mpicomm.init()
        if mpicomm.get_rank() == 1:
            sys.exit(3)
        mpicomm.barrier()
    """
    job = run_job([sys.executable, "-m", "mpi4py", str(script(tmp_path, "exit.py", body))], timeout=10)
    assert not job.timed_out, "rank 1's sys.exit(3) left ranks 0 and 2 hanging\n" + job.describe()
    assert job.rc != 0


def test_opt_out_with_the_mpi4py_runner_still_ends_the_job(tmp_path: Path) -> None:
    """MPICOMM_ABORT_ON_EXCEPTION=0 removes mpicomm's hook; ``python -m mpi4py`` then aborts instead."""
    path = script(tmp_path, "job.py", RANK_ONE_RAISES)
    job = run_job([sys.executable, "-m", "mpi4py", str(path)], env={"MPICOMM_ABORT_ON_EXCEPTION": "0"})
    assert not job.timed_out, job.describe()
    assert job.rc != 0 and job.seconds < 20, job.describe()
    assert "RuntimeError: boom from rank one" in job.err, job.describe()
    assert "in compute_step" in job.err
    # mpicomm's hook stayed out of it: no rank prefix, no mpicomm abort line
    assert "mpicomm: uncaught exception" not in job.err, job.describe()
    assert "[rank 1]" not in job.err


@pytest.mark.parametrize(
    ("how", "installed"),
    [
        ("default", True),
        ("env-off", False),
        ("env-on", True),
        ("argument-off", False),
    ],
)
def test_hook_installed_unless_opted_out(tmp_path: Path, how: str, installed: bool) -> None:
    body = f"""
        import sys, threading
        from pathlib import Path
        import mpicomm

        mpicomm.init({"abort_on_exception=False" if how == "argument-off" else ""})
        plain = sys.excepthook is sys.__excepthook__ and threading.excepthook is threading.__excepthook__
        Path(sys.argv[1], f"rank{{mpicomm.get_rank()}}").write_text(f"hooked={{not plain}}")
        mpicomm.barrier()
    """
    env = {"env-off": {"MPICOMM_ABORT_ON_EXCEPTION": "0"}, "env-on": {"MPICOMM_ABORT_ON_EXCEPTION": "1"}}
    path = script(tmp_path, "hook.py", body)
    job = run_job([sys.executable, str(path), str(tmp_path)], n=2, env=env.get(how))
    assert job.rc == 0 and not job.timed_out, job.describe()
    for rank in range(2):
        assert (tmp_path / f"rank{rank}").read_text() == f"hooked={installed}", job.describe()


def test_validation_switched_on_by_environment(tmp_path: Path) -> None:
    """MPICOMM_VALIDATE=1: a cross-rank mismatch raises the same error on both ranks, no hang."""
    body = """
        import sys
        from pathlib import Path
        import numpy as np
        import mpicomm

        rank = mpicomm.init().rank()
        assert mpicomm.is_validation_enabled()
        try:
            mpicomm.all_reduce(np.zeros(2 + rank))
        except mpicomm.CrossRankMismatchError as exc:
            Path(sys.argv[1], f"rank{rank}").write_text(str(exc))
        mpicomm.barrier()
    """
    path = script(tmp_path, "validate.py", body)
    job = run_job([sys.executable, str(path), str(tmp_path)], n=2, env={"MPICOMM_VALIDATE": "1"})
    assert job.rc == 0 and not job.timed_out, job.describe()
    msgs = [(tmp_path / f"rank{rank}").read_text() for rank in range(2)]
    assert msgs[0] == msgs[1], msgs
    assert msgs[0].startswith("all_reduce: ") and "count differs: rank 0: 2, rank 1: 3" in msgs[0], msgs


# --------------------------------------------------------------------------------------------------
# the multi-rank pytest harness (tests/mpi/conftest.py)

SUMMARY = re.compile(r"^=+ .*\b(passed|failed|error|errors|skipped|no tests ran)\b.* in [\d.]+s.* =+$", re.M)


def harness(
    tmp_path: Path, tests: str, *, timeout_s: int = 60, env: dict[str, str] | None = None, wall: float = 30
) -> Job:
    """Run a pytest file under the project's MPI harness: ``mpiexec -n 3 python -m mpi4py -m pytest``."""
    shutil.copy(HARNESS, tmp_path / "conftest.py")
    (tmp_path / "test_job.py").write_text(textwrap.dedent(tests))
    args = [
        sys.executable,
        "-m",
        "mpi4py",
        "-m",
        "pytest",
        "--with-mpi",
        "-x",
        "--timeout",
        str(timeout_s),
        "--timeout-method",
        "thread",
        "-p",
        "no:cacheprovider",
        "--color=no",
        "test_job.py",
        "--rootdir",
        str(tmp_path),
        "-c",
        os.devnull,
    ]
    return run_job(args, timeout=wall, cwd=tmp_path, env=env)


FAILS_ON_RANK_ONE = """
    import os
    import pytest
    import mpicomm

    @pytest.mark.mpi(min_size=2)
    def test_first(world):
        mpicomm.barrier()

    @pytest.mark.mpi(min_size=2)
    def test_fails_on_rank_one(world):
        if os.environ.get("FAIL_ON_RANK_ONE") and world.rank() == 1:
            assert world.rank() == 0, "rank one disagrees with the others"
        mpicomm.barrier()

    @pytest.mark.mpi(min_size=2)
    def test_last(world):
        mpicomm.barrier()
"""


def test_harness_passing_run_gives_one_report(tmp_path: Path) -> None:
    job = harness(tmp_path, FAILS_ON_RANK_ONE)
    assert job.rc == 0 and not job.timed_out, job.describe()
    summaries = SUMMARY.findall(job.text)
    assert len(summaries) == 1, "expected one summary line (rank 0's)\n" + job.describe()
    assert re.search(r"=+ 3 passed in ", job.text), job.describe()
    assert "[rank" not in job.text


def test_harness_failure_on_rank_one_ends_the_job(tmp_path: Path) -> None:
    job = harness(tmp_path, FAILS_ON_RANK_ONE, env={"FAIL_ON_RANK_ONE": "1"})
    assert not job.timed_out, "the failure on rank 1 left the job hanging\n" + job.describe()
    assert job.rc != 0, job.describe()
    assert job.seconds < 30
    assert "[rank 1] FAILED test_job.py::test_fails_on_rank_one" in job.err, job.describe()
    assert re.search(r"^\[rank 1\] E +AssertionError: rank one disagrees with the others$", job.err, re.M), (
        job.describe()
    )
    # one report: no rank but rank 0 prints a pytest summary, and the others print nothing of their own
    assert len(SUMMARY.findall(job.text)) <= 1, job.describe()
    assert "[rank 0]" not in job.text and "[rank 2]" not in job.text
    assert "test_last" not in job.text


DEADLOCK = """
    import pytest
    import mpicomm

    @pytest.mark.mpi(min_size=2)
    def test_rank_zero_skips_the_barrier(world):
        if world.rank() != 0:
            mpicomm.barrier()
"""


@pytest.fixture(scope="module")
def deadlock(tmp_path_factory: pytest.TempPathFactory) -> Job:
    """One deadlocked job under ``--timeout 5`` for the two tests that read it (5 s and more each)."""
    return harness(tmp_path_factory.mktemp("deadlock"), DEADLOCK, timeout_s=5)


def test_harness_deadlock_ends_the_job(deadlock: Job) -> None:
    job = deadlock
    assert not job.timed_out, "a deadlock outlived --timeout 5\n" + job.describe()
    assert job.rc != 0 and job.seconds < 30, job.describe()


def test_harness_deadlock_says_it_timed_out(deadlock: Job) -> None:
    """The report of a deadlock names the timeout and the test, so the user knows what happened."""
    job = deadlock
    assert not job.timed_out, job.describe()
    assert job.rc != 0
    assert "Timeout" in job.text, "nothing in the output says a test timed out\n" + job.describe()
    assert "test_rank_zero_skips_the_barrier" in job.text, job.describe()


def test_harness_deadlock_ends_without_the_abort_hook(tmp_path: Path) -> None:
    """--timeout alone must end a deadlock, also with mpicomm's abort hook switched off."""
    job = harness(tmp_path, DEADLOCK, timeout_s=2, env={"MPICOMM_ABORT_ON_EXCEPTION": "0"}, wall=15)
    assert not job.timed_out, "with MPICOMM_ABORT_ON_EXCEPTION=0 the deadlock hung\n" + job.describe()
    assert job.rc != 0


def test_harness_notices_ranks_that_ran_different_tests(tmp_path: Path) -> None:
    tests = """
        import pytest
        import mpicomm

        @pytest.mark.mpi(min_size=2)
        def test_skipped_on_rank_one(world):
            if world.rank() == 1:
                pytest.skip("only rank 1 skips")
    """
    job = harness(tmp_path, tests)
    assert not job.timed_out, job.describe()
    assert job.rc != 0, "a rank that skipped what the others ran went unnoticed\n" + job.describe()
    assert "ranks ran different tests" in job.err, job.describe()


def test_traceback_reaches_the_terminal_under_torchs_exception_hook(tmp_path: Path) -> None:
    """torch's ``init_process_group`` wraps ``sys.excepthook`` and runs the previous hook (ours) with
    ``sys.stderr`` swapped for a buffer it prints after the hook returns; ours aborts and never
    returns, so the traceback must go to the process's own stderr or the job ends with only Abort(1)."""
    pytest.importorskip("torch")
    body = """
        import sys
        import mpicomm
        import torch.distributed as dist

        rank = mpicomm.init().rank()  # mpicomm's abort hook first, torch's wraps it
        store = dist.FileStore(sys.argv[1], 2)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
        assert sys.excepthook.__name__ == "_distributed_excepthook", sys.excepthook


        def train_step():
            raise RuntimeError("loss is nan on rank one")


        if rank == 1:
            train_step()
        mpicomm.barrier()  # rank 0 waits here for rank 1, which never comes
        print("unreachable", flush=True)
    """
    path = script(tmp_path, "torch_hook.py", body)
    job = run_job([sys.executable, str(path), str(tmp_path / "store")], n=2, timeout=60)
    assert not job.timed_out, "the job hung instead of aborting\n" + job.describe()
    assert job.rc != 0 and "unreachable" not in job.out, job.describe()
    assert "[rank 1] RuntimeError: loss is nan on rank one" in job.err, job.describe()
    assert re.search(r"\[rank 1\] +File .*torch_hook\.py.*, in train_step", job.err), job.describe()
    assert "[rank 1] mpicomm: uncaught exception, aborting the MPI job" in job.err, job.describe()
