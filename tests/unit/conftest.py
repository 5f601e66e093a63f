"""One-process tests, and the ``process`` mark on those that start processes (``mpiexec``, ``python``).

``make check`` leaves the marked tests out (``-m "not process"``): they wait for jobs, launchers and
timeouts, and take nearly all of this folder's time. So that the mark stays true, every process a
test starts through :mod:`subprocess` is recorded, and a test without the mark that started one
fails, naming the command. The process still starts: the test runs as it would, and its verdict
asks for the missing mark. (A test that runs a command another way, as ``os.system`` in a pickle,
carries the mark by hand: ``os`` functions stay unwrapped, since pickles name them.)
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

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
    if _STARTED and request.node.get_closest_marker("process") is None:
        started = "\n  ".join(_STARTED[:5])
        pytest.fail(
            f"this test started {len(_STARTED)} process(es) without the 'process' mark "
            f"(add @pytest.mark.process, or pytest.mark.process to the module's pytestmark):\n  {started}",
            pytrace=False,
        )
