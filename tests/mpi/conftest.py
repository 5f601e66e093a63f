"""Multi-rank test harness: run under ``mpiexec -n N python -m mpi4py -m pytest --with-mpi -x``.

* One report: only rank 0 keeps pytest's terminal reporter. Any other rank that sees a failure
  prints it at once, prefixed with its rank, and (with ``-x``) stops; ``python -m mpi4py`` then calls
  ``MPI_Abort`` so that the whole job ends within seconds instead of hanging in a collective.
* Deadlocks end through pytest-timeout's thread method (``--timeout N --timeout-method thread``).
* At the end every rank reports its counts to rank 0, which checks that all ranks ran the same tests.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _pytest._io import TerminalWriter

import mpicomm

RANK = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))


class _RankStderr(io.TextIOBase):
    """stderr with every line prefixed by the rank, for what other ranks must still say."""

    def __init__(self) -> None:
        self._pending = ""

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        sys.stderr.write("".join(f"[rank {RANK}] {line}\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        if self._pending:
            sys.stderr.write(f"[rank {RANK}] {self._pending}\n")
            self._pending = ""
        sys.stderr.flush()


class _QuietReporter:
    """Stands in for pytest's terminal reporter on ranks other than 0.

    The progress and the summary come from rank 0 only, but plugins that write to the terminal
    directly (pytest-timeout's "Timeout" report and stack dump before it kills a deadlocked rank)
    still reach stderr, prefixed with the rank.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._tw = TerminalWriter(_RankStderr())

    def write_line(self, line: str, **markup: bool) -> None:
        self._tw.line(line)

    def write_sep(self, sep: str, title: str | None = None, **markup: bool) -> None:
        self._tw.sep(sep, title)

    def section(self, title: str, sep: str = "=", **markup: bool) -> None:
        self._tw.sep(sep, title)

    def write(self, content: str, **markup: bool) -> None:
        self._tw.write(content)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "mpi: multi-rank test (pytest-mpi)")
    if RANK != 0:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)
            config.pluginmanager.register(_QuietReporter(config), "terminalreporter")


class _Counts:
    outcomes: dict[str, int] = {}  # noqa: RUF012


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" or report.outcome != "passed":
        key = report.outcome if report.when == "call" or report.failed else "skipped"
        _Counts.outcomes[key] = _Counts.outcomes.get(key, 0) + 1
    if RANK != 0 and report.failed:
        text = "".join(f"[rank {RANK}] {line}\n" for line in report.longreprtext.splitlines())
        sys.stderr.write(f"[rank {RANK}] FAILED {item.nodeid} ({report.when})\n{text}")
        sys.stderr.flush()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus != 0 or not mpicomm.is_initialized():
        return
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    everyone = comm.gather(dict(_Counts.outcomes), root=0)
    if comm.rank == 0 and everyone is not None and any(c != everyone[0] for c in everyone):
        sys.stderr.write(f"ranks ran different tests: {everyone}\n")
        session.exitstatus = 1


@pytest.fixture
def world() -> mpicomm.ProcessGroup:
    """The world group (MPI is initialised on first use)."""
    return mpicomm.init()


@pytest.fixture
def rng() -> np.random.Generator:
    """A generator with the same seed on every rank, so every rank can build the global input."""
    return np.random.default_rng(20261121)


@pytest.fixture(scope="module")
def fake() -> Iterator[Any]:
    """The fake cupy (tests/fakecupy) for a module's tests: CPU emulation, never GPU verification."""
    from fakecupy import testing

    yield from testing.activate()


@pytest.fixture
def cp(fake: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The fake cupy on the staged path for one test, its staging buffers checked back afterwards.

    A module that runs its tests on other paths (direct, both) defines a ``cp`` of its own.
    """
    from fakecupy import testing

    yield from testing.staged_fake(fake, monkeypatch)


#: Validation mode as the run asked for it (``MPICOMM_VALIDATE``, read as mpicomm reads it).
VALIDATE = os.environ.get("MPICOMM_VALIDATE", "0") not in ("", "0")


@pytest.fixture(autouse=True)
def _validation_as_the_run_asked() -> None:
    """Each test starts in the validation mode of the run, whatever an earlier test left behind.

    Fixtures that turn validation on for their tests turn it off afterwards; without this, a run
    with ``MPICOMM_VALIDATE=1`` went on unvalidated from the first such test.
    """
    if mpicomm.is_validation_enabled() != VALIDATE:
        mpicomm.set_validation(VALIDATE)


@pytest.fixture
def validation_off(world: mpicomm.ProcessGroup) -> Iterator[None]:
    """Validation mode off for one test, then as it was: for tests of what reaches MPI unchecked.

    A module takes it for every test with ``pytestmark = pytest.mark.usefixtures("validation_off")``.
    """
    saved = mpicomm.is_validation_enabled()
    mpicomm.set_validation(False)
    yield
    mpicomm.set_validation(saved)


@pytest.fixture(params=[False, True], ids=["plain", "validated"])
def validated(request: pytest.FixtureRequest, world: mpicomm.ProcessGroup) -> Iterator[bool]:
    """One test with validation off, then on, whatever MPICOMM_VALIDATE says; then as it was.

    For a mistake both modes catch with different words (validation names every rank's value), or
    that validation mode takes another path for.
    """
    saved = mpicomm.is_validation_enabled()
    mpicomm.set_validation(request.param)
    try:
        yield request.param
    finally:
        mpicomm.set_validation(saved)
