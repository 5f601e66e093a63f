"""A dropped staged ``Work`` that the garbage collector frees in the middle of ``reap()``.

``StagedWork.__del__`` hands the dropped operation to ``reap()``. The collector runs finalisers at
any allocation, so a ``__del__`` can run inside ``reap()`` itself; if the two shared a lock, that
thread would wait for itself for ever (a rank hung, the others waiting in their next collective).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from mpicomm.core.work import Work
from mpicomm.gpu import staged


class _Pending(Work):
    """An operation that never completes (as a dropped ``irecv`` nobody sends to)."""

    __slots__ = ()

    def is_completed(self) -> bool:
        return False


class _Stage:
    """Stands in for a Staging: counts what reap() does with it."""

    def __init__(self) -> None:
        self.uploads = self.releases = 0

    def upload(self) -> None:
        self.uploads += 1

    def release(self) -> None:
        self.releases += 1


@pytest.fixture
def orphans() -> Iterator[Any]:
    before = list(staged._Orphans.works)
    staged._Orphans.works.clear()
    thresholds = gc.get_threshold()
    yield staged._Orphans.works
    gc.set_threshold(*thresholds)
    staged._Orphans.works.clear()
    staged._Orphans.works.extend(before)


def _dropped_in_a_cycle(stage: _Stage) -> None:
    work = staged.StagedWork(_Pending([]), stage, [])  # type: ignore[arg-type]
    work._shown.append(work)  # a cycle: only the collector frees it


def test_a_work_freed_by_the_collector_inside_reap_does_not_hang_the_thread(orphans: Any) -> None:
    thresholds = gc.get_threshold()
    stages = [_Stage() for _ in range(3)]
    orphans.append((_Pending([]), stages[0]))  # one still pending, so that reap() has work to do
    done = threading.Event()

    def run() -> None:
        gc.collect()
        gc.disable()
        for s in stages[1:]:
            _dropped_in_a_cycle(s)  # garbage that waits for the next collection
        gc.set_threshold(1)
        gc.enable()
        staged.reap()  # its first allocation collects: the two __del__ run inside it
        done.set()

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)
    gc.set_threshold(*thresholds)
    gc.collect()
    assert done.is_set(), "reap() hung: a __del__ run inside it waited for a lock that reap() held"
    assert {id(stage) for _, stage in orphans} == {id(s) for s in stages}, "pending ones are kept"
    assert all(s.uploads == s.releases == 0 for s in stages)


def test_reap_uploads_what_completed_and_keeps_what_did_not(orphans: Any) -> None:
    done, failed, pending = _Stage(), _Stage(), _Stage()
    ok, bad = Work([]), Work([])
    ok._done = bad._done = True
    bad._error = RuntimeError("peer failed")
    orphans.extend([(ok, done), (bad, failed), (_Pending([]), pending)])
    staged.reap()
    assert (done.uploads, done.releases) == (1, 0)
    assert (failed.uploads, failed.releases) == (0, 1)
    assert [stage for _, stage in staged._Orphans.works] == [pending]
    assert staged.orphans() == 1


class _Watched(Work):
    """An operation whose wait records the watchdog's tokens, then completes."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        super().__init__([])
        self.seen: list[Any] = []

    def is_completed(self) -> bool:
        return True

    def wait(self, timeout: Any = None) -> bool:
        from mpicomm.core import watchdog

        self.seen.append(list(watchdog._live))
        return True


def test_a_staged_wait_is_timed_by_the_watchdog_through_its_upload() -> None:
    """StagedWork.wait puts its own token (Work.wait's site, its timeout) on the list, then takes it off."""
    from mpicomm.core import watchdog

    inner, stage = _Watched(), _Stage()
    work = staged.StagedWork(inner, stage, [])  # type: ignore[arg-type]
    before = list(watchdog._live)
    assert work.wait(timeout=7.0) is True
    assert stage.uploads == 1
    (tokens,) = inner.seen  # is_completed() is True: one wait, untimed, inside the staged one
    (token,) = [t for t in tokens if t not in before]
    assert token[1] is watchdog.WAIT and token[3] == 7.0
    assert watchdog._live == before
