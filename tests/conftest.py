"""What every test session shares: each test starts with the garbage collected and the rest frozen;
the ``process`` mark on the one-process tests (tests/unit) that start processes.

``make check`` leaves the marked tests out (``-m "not process"``): they wait for jobs, launchers and
timeouts, and take nearly all of tests/unit's time. So that the mark stays true, every process a
test starts through :mod:`subprocess` is recorded, and a test of tests/unit without the mark that
started one fails, naming the command. The process still starts: the test runs as it would, and its
verdict asks for the missing mark. (A test that runs a command another way, as ``os.system`` in a
pickle, carries the mark by hand: ``os`` functions stay unwrapped, since pickles name them.) This
lives here, not in tests/unit/conftest.py: two conftest modules of one session (tests/unit and
tests/gpu, without packages) would both import as ``conftest``.
"""

from __future__ import annotations

import gc
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def _collected_and_frozen() -> None:
    """Collect what earlier tests left, then freeze what is alive (:func:`gc.freeze`) for this test.

    Every collection then walks only what this test made: a full one walks every object of the
    session (torch's, the test modules', pytest's reports), and the fake-GPU tests collect after
    each test so that a dropped Work cannot keep its staging buffers (tests/fakecupy/testing.py):
    0.1-0.4 s a test, most of the multi-rank suite's time. What a test leaves behind it still finds;
    an object alive here that only a later collection would free (a cycle) stays, a little memory.
    """
    gc.collect()
    gc.freeze()


#: The commands started since the current test began.
_STARTED: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "process: starts processes (mpiexec, python); not in make check")
    # what run, call, check_output and Popen itself reach on POSIX
    execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]

    def recorded(popen: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> Any:
        _STARTED.append(" ".join(map(str, args)) if isinstance(args, (list, tuple)) else str(args))
        return execute_child(popen, args, *rest, **kwargs)

    subprocess.Popen._execute_child = recorded  # type: ignore[attr-defined]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    _STARTED.clear()  # before setup: what a module's fixtures start counts for its first test
    yield


@pytest.fixture(autouse=True)
def _processes_are_marked(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if request.node.path.parent.name != "unit":  # the one-process tests: tests/unit
        return
    if _STARTED and request.node.get_closest_marker("process") is None:
        started = "\n  ".join(_STARTED[:5])
        pytest.fail(
            f"this test started {len(_STARTED)} process(es) without the 'process' mark "
            f"(add @pytest.mark.process, or pytest.mark.process to the module's pytestmark):\n  {started}",
            pytrace=False,
        )
