"""scripts/where-ranks-were.py on the log of a real 2-rank run that times out under our test harness."""

from __future__ import annotations

import os
import runpy
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "where-ranks-were.py"

# One rank times out after 2 s, the other only after 30 s: the launcher ends the job when the first
# one exits (os._exit after its stack dump), so the log holds exactly one dump, from the rank chosen.
# Equal timeouts would race: whichever rank dumps first gets the other killed, mid-dump or before.
HANG = """
import time

import pytest
from mpi4py import MPI


@pytest.mark.timeout(2 if MPI.COMM_WORLD.rank == {late} else 30)
def test_rank_one_is_late():
    comm = MPI.COMM_WORLD
    if comm.rank == 1:
        time.sleep(60)  # rank 1 stuck here
    comm.Barrier()  # rank 0 waits here
"""


def _line_of(marker: str) -> int:
    return next(i for i, line in enumerate(HANG.splitlines(), 1) if marker in line)


@pytest.fixture(scope="module")
def where() -> Callable[[list[str]], dict[int, str]]:
    func: Callable[[list[str]], dict[int, str]] = runpy.run_path(str(SCRIPT))["where"]
    return func


@pytest.mark.process
@pytest.mark.parametrize("late", [0, 1])
def test_names_the_line_the_rank_that_timed_out_was_stuck_on(
    tmp_path: Path, where: Callable[[list[str]], dict[int, str]], late: int
) -> None:
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent))
    if mpiexec is None:
        pytest.skip("no mpiexec next to this Python (the venv's MPI wheel provides one)")
    shutil.copy(ROOT / "tests" / "mpi" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_hang.py").write_text(HANG.format(late=late))
    flags = (
        ["--oversubscribe"]
        if "open" in subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout.lower()
        else []
    )
    pytest_args = "-m pytest --with-mpi -x --timeout-method thread -p no:cacheprovider"
    run = subprocess.run(
        [mpiexec, *flags, "-n", "2", sys.executable, "-m", "mpi4py", *pytest_args.split(), "test_hang.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert run.returncode != 0
    found = where((run.stdout + run.stderr).splitlines())
    assert sorted(found) == [late], run.stdout + run.stderr
    line = _line_of("rank 1 stuck here" if late == 1 else "rank 0 waits here")
    assert found[late].startswith(f"test_hang.py:{line} test_rank_one_is_late"), found


def test_a_log_without_a_timeout_gives_nothing(where: Callable[[list[str]], dict[int, str]]) -> None:
    assert where(["== tests/mpi on 2 ranks ==", "[rank 1] FAILED x.py::t", "3 passed"]) == {}


def test_a_rank_that_printed_no_dump_is_named(where: Callable[[list[str]], dict[int, str]]) -> None:
    dump = [
        "+++++++++++++++ Timeout +++++++++++++++",
        "~~~~~~~~~~ Stack of MainThread (140) ~~~~~~~~~~",
        '  File "/x/tests/mpi/test_a.py", line 5, in test_a',
        '  File "/x/mpicomm/objects/wire.py", line 255, in agree',
        "+++++++++++++++ Timeout +++++++++++++++",
    ]
    log = ["== tests/mpi on 2 ranks ==", "== tests/mpi on 3 ranks ==", *dump]
    log += [f"[rank 1] {line}" for line in dump]
    found = where(log)
    assert found[0] == found[1] == "mpi/test_a.py:5 test_a > objects/wire.py:255 agree"
    assert sorted(found) == [0, 1, 2] and found[2].startswith("no stack dump"), found


def test_a_prefix_after_rank_zeros_unfinished_progress_line_is_that_ranks(
    where: Callable[[list[str]], dict[int, str]],
) -> None:
    log = [
        "test_a.py [rank 1] +++++++++++++++ Timeout +++++++++++++++",
        "[rank 1] ~~~~~~~~~~ Stack of MainThread (140) ~~~~~~~~~~",
        '[rank 1]   File "/x/tests/mpi/test_a.py", line 7, in test_a',
        "[rank 1] +++++++++++++++ Timeout +++++++++++++++",
    ]
    assert where(log) == {1: "mpi/test_a.py:7 test_a"}


def test_rank_zeros_lines_that_quote_another_ranks_dump_are_rank_zeros(
    where: Callable[[list[str]], dict[int, str]],
) -> None:
    quoted = [
        "E         [rank 1] +++++++++++++++ Timeout +++++++++++++++",
        "E         [rank 1] ~~~~~~~~~~ Stack of MainThread (140) ~~~~~~~~~~",
        'E         [rank 1]   File "/x/tests/mpi/test_a.py", line 7, in test_a',
        "E         [rank 1] +++++++++++++++ Timeout +++++++++++++++",
    ]
    assert where(quoted) == {}
