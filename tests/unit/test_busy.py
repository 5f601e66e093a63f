"""mpicomm.core.busy on its own: which call holds a group, and what a raced group raises (no MPI calls).

The threads' behaviour at ``MPI_THREAD_MULTIPLE`` with real ranks is in tests/mpi/test_thread_one_group.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from mpicomm.core import busy, watchdog
from mpicomm.errors import DistError


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    busy._BUSY.clear()
    busy._RACED.clear()


class _Group:  # stands in for a ProcessGroup: busy keys by the object, names it by .name
    def __init__(self, name: str) -> None:
        self.name = name


@pytest.fixture
def group(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(busy, "_PG", _Group)
    return _Group("g1")


def _token(site: str, group: Any, ident: int | None = None) -> tuple[Any, ...]:
    return (threading.get_ident() if ident is None else ident, watchdog.Site(site), group, None)


def test_a_call_holds_its_group_and_lets_go(group: Any) -> None:
    tok = _token("all_reduce", group)
    k = busy.hold(group, tok, None)
    assert k is group and busy._BUSY[group] is tok
    busy.let_go(k, tok)
    assert group not in busy._BUSY and not busy._RACED


def test_nested_calls_the_engine_and_other_arguments_hold_nothing(group: Any) -> None:
    outer = _token("all_reduce_coalesced", group)
    assert busy.hold(group, outer, None) is group
    assert busy.hold(group, _token("all_reduce", group), None) is busy.FREE  # same thread: nested
    me = threading.get_ident()
    assert busy.hold(group, _token("all_reduce", group), me) is busy.FREE  # the engine's thread
    assert busy.hold([1, 2], _token("all_reduce", [1, 2]), None) is busy.FREE  # the host refuses it
    assert list(busy._BUSY.items()) == [(group, outer)]


def test_a_second_thread_races_the_group_waits_and_every_call_then_raises(group: Any) -> None:
    inside = _token("broadcast", group, ident=-1)  # another thread's call, inside
    busy._BUSY[group] = inside
    held: list[Any] = []
    th = threading.Thread(
        target=lambda: held.append(busy.hold(group, _token("all_reduce", group), None)), name="second"
    )
    th.start()
    th.join(0.2)
    assert th.is_alive() and not held  # it waits while the other call is inside
    want = "thread 'second' called all_reduce on group g1 while thread with ident -1 was inside broadcast"
    assert want in busy._RACED[group]
    with pytest.raises(DistError, match=r"broadcast: two threads called on group g1 at once on this rank"):
        busy.let_go(group, inside)  # the call that was inside raises as it returns
    th.join(10)
    assert held == [group]
    with pytest.raises(DistError, match="not to be trusted"):
        busy.let_go(group, busy._BUSY[group])
    assert group not in busy._BUSY
    tok = _token("all_reduce", group)  # later calls on a raced group raise too, after taking part
    assert busy.hold(group, tok, None) is group
    with pytest.raises(DistError, match="all_reduce: two threads called on group g1"):
        busy.let_go(group, tok)


def test_the_world_is_the_key_of_group_none(monkeypatch: pytest.MonkeyPatch) -> None:
    world = _Group("world")
    monkeypatch.setattr(busy._State, "world", world)
    assert busy.key(None) is world
