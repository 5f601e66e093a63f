"""Two threads on one group at ``MPI_THREAD_MULTIPLE``: wrong data never goes unreported, no call hangs.

MPI matches a group's collectives by their order on each rank; two threads calling on one group at
once enter in orders that differ between ranks and got each other's data, silently (issue 44, item
6). Now a call on a group another thread's call is inside marks the group raced on that rank, waits
its turn and takes part (no rank waits for a call that never comes), and every call on a raced
group raises a DistError naming the call, the group and both threads (``mpicomm.core.busy``). A
rank whose threads happened to take turns sees no race and can still get the data its peers paired
wrongly; the rank where they overlapped raises (``_never_silent``). Validation mode turns that into
the same error on every rank: tests/mpi/test_thread_validated.py. These tests run with it off.

Under ``python -m mpi4py`` MPI runs at ``MPI_THREAD_MULTIPLE``. Each test makes its own groups (a
raced group stays raced). Every rank builds the expected sums from the ranks' values.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from ranks import as_numpy as _values
from ranks import full_numpy as _numpy
from ranks import full_torch as _torch
from ranks import in_threads

import mpicomm
from mpicomm.core import busy, engine
from mpicomm.errors import ArgumentTypeError, DistError

pytestmark = [
    pytest.mark.skipif(
        MPI.Query_thread() < MPI.THREAD_MULTIPLE,
        reason="needs MPI_THREAD_MULTIPLE (tests/unit/test_thread_level.py)",
    ),
    pytest.mark.usefixtures("validation_off"),  # what a rank sees alone (validation mode: the other file)
]

ROUNDS = 150


def _hammer(
    make: Callable[[float], Any], groups: list[mpicomm.ProcessGroup], n: int, r: int
) -> tuple[dict[int, list[str]], list[str]]:
    """Two threads, ROUNDS all_reduces each on ``groups[t]``: per thread the outcome of each call."""
    outcomes: dict[int, list[str]] = {0: [], 1: []}
    messages: list[str] = []

    def work(t: int) -> None:
        for i in range(ROUNDS):
            x = make(1000.0 * t + i + r / 8)
            try:
                mpicomm.all_reduce(x, group=groups[t])
            except DistError as exc:  # the program goes on: every rank makes every call
                outcomes[t].append("raised")
                messages.append(str(exc))
                continue
            want = sum(1000.0 * t + i + s / 8 for s in range(n))
            outcomes[t].append("right" if np.all(_values(x) == want) else "WRONG")

    in_threads(lambda: work(0), lambda: work(1), names=("hammer0", "hammer1"), timeout=120)
    return outcomes, messages


def _never_silent(outcomes: list[str]) -> None:
    """No wrong data goes unreported: wherever a rank got wrong data, some rank's calls raised.

    A rank can get wrong data without seeing a race itself: its threads took turns there while
    they overlapped on another rank, which paired its calls differently. Only that other rank can
    see it, and its calls raise (the world group, never raced here, carries the counts).
    """
    counts = np.array([outcomes.count("WRONG"), outcomes.count("raised")], dtype=np.int64)
    mpicomm.all_reduce(counts)
    assert counts[0] == 0 or counts[1] > 0, f"wrong data on some rank and no call raised: {outcomes}"


@pytest.mark.parametrize("make", [_numpy, _torch], ids=["numpy-C-door", "torch-python-wrapper"])
def test_two_threads_hammering_one_group_get_right_data_or_the_error(
    world: mpicomm.ProcessGroup, make: Callable[[float], Any]
) -> None:
    n, r = world.size(), world.rank()
    make(0.0)  # skips before any group is made where torch is missing
    group = mpicomm.new_group(list(range(n)), timeout=60)
    outcomes, messages = _hammer(make, [group, group], n, r)
    assert [len(outcomes[t]) for t in range(2)] == [ROUNDS, ROUNDS]
    _never_silent(outcomes[0] + outcomes[1])
    for text in messages:
        assert "all_reduce: two threads called on group " + group.name in text, text
        assert "thread 'hammer" in text and "was inside all_reduce on it" in text, text
    if messages:  # raced here: from then on every call on the group raises, after taking part
        assert busy._RACED.get(group)
        with pytest.raises(DistError, match="two threads called on group"):
            mpicomm.all_reduce(make(1.0), group=group)
    else:
        mpicomm.all_reduce(make(1.0), group=group)  # the other ranks' last call
    assert group not in busy._BUSY
    # the world was never raced: it still works on every rank
    x = np.array([float(r)])
    mpicomm.all_reduce(x)
    assert x[0] == sum(range(n))
    mpicomm.destroy_process_group(group)


def test_two_threads_on_their_own_groups_are_never_refused(world: mpicomm.ProcessGroup) -> None:
    n, r = world.size(), world.rank()
    groups = [mpicomm.new_group(list(range(n)), timeout=60) for _ in range(2)]
    outcomes, messages = _hammer(_numpy, groups, n, r)
    assert not messages
    assert outcomes == {0: ["right"] * ROUNDS, 1: ["right"] * ROUNDS}
    assert not busy._RACED.get(groups[0]) and not busy._RACED.get(groups[1])
    for g in groups:
        mpicomm.destroy_process_group(g)


def test_a_call_while_another_thread_is_inside_raises_and_so_does_that_one(
    world: mpicomm.ProcessGroup,
) -> None:
    """Rank 0 comes late, so on every other rank thread A is inside all_reduce when thread B calls."""
    n, r = world.size(), world.rank()
    group = mpicomm.new_group(list(range(n)), timeout=60)
    got: dict[str, Any] = {}
    a_done = threading.Event()

    def a() -> None:
        if r == 0:
            time.sleep(0.5)
        x = np.array([1.0])
        try:
            mpicomm.all_reduce(x, group=group)
            got["a"] = float(x[0])
        except DistError as exc:
            got["a"] = str(exc)
        a_done.set()

    def b() -> None:
        while busy._BUSY.get(group) is None and not a_done.wait(0.001):
            pass  # until A is inside (on rank 0 it may be done first)
        x = np.array([1.0])
        try:
            mpicomm.all_reduce(x, group=group)
            got["b"] = float(x[0])
        except DistError as exc:
            got["b"] = str(exc)

    in_threads(a, b, names=("thread-A", "thread-B"))
    for name in ("a", "b"):  # each call either gave the right sum or raised the error
        assert got[name] == float(n) or "two threads called on group" in str(got[name]), got
    if r != 0 and n > 1:
        for name in ("a", "b"):
            text = str(got[name])
            assert f"all_reduce: two threads called on group {group.name} at once on this rank" in text, got
            assert "thread 'thread-B' called all_reduce" in text, got
            assert "thread 'thread-A' was inside all_reduce" in text, got
    assert group not in busy._BUSY
    mpicomm.destroy_process_group(group)


def test_the_hold_is_let_go_when_a_call_raises(world: mpicomm.ProcessGroup) -> None:
    n = world.size()
    group = mpicomm.new_group(list(range(n)), timeout=60)
    with pytest.raises(ArgumentTypeError, match="all_reduce"):
        mpicomm.all_reduce(np.ones(2), op="no such op", group=group)
    assert group not in busy._BUSY

    def other() -> None:  # another thread's call is then neither refused nor raced
        x = np.ones(2)
        mpicomm.all_reduce(x, group=group)
        assert x.tolist() == [n, n]

    in_threads(other)
    assert group not in busy._RACED
    mpicomm.destroy_process_group(group)


def test_calls_taken_one_after_the_other_by_threads_and_async_calls_are_not_raced(
    world: mpicomm.ProcessGroup,
) -> None:
    """Threads that take turns (ordered by the program), and the engine running queued calls."""
    n, r = world.size(), world.rank()
    group = mpicomm.new_group(list(range(n)), timeout=60)
    results: list[float] = []

    def step(value: float) -> None:
        x = np.array([value + r])
        work = mpicomm.all_reduce(x, group=group, async_op=True)
        mpicomm.all_reduce(np.ones(1), group=group)  # queued behind it: waits, on the same thread
        work.wait()
        results.append(float(x[0]))

    for value in (1.0, 2.0):
        in_threads(functools.partial(step, value))
    step(3.0)
    engine.drain()
    want = [n * v + sum(range(n)) for v in (1.0, 2.0, 3.0)]
    assert results == want
    assert group not in busy._RACED and group not in busy._BUSY
    mpicomm.destroy_process_group(group)


def test_point_to_point_threads_share_a_group(world: mpicomm.ProcessGroup) -> None:
    """A sending and a receiving thread on one group (calls that take a tag are not held)."""
    n, r = world.size(), world.rank()
    if n < 2:
        pytest.skip("needs a peer")
    group = mpicomm.new_group(list(range(n)), timeout=60)
    right, left = (r + 1) % n, (r - 1) % n
    got: list[float] = []

    def sender() -> None:
        for i in range(50):
            mpicomm.send(np.array([float(r * 100 + i)]), dst=right, group=group, tag=7)

    def receiver() -> None:
        for _ in range(50):
            y = np.empty(1)
            mpicomm.recv(y, src=left, group=group, tag=7)
            got.append(float(y[0]))

    in_threads(sender, receiver)
    assert got == [float(left * 100 + i) for i in range(50)]
    assert group not in busy._RACED
    mpicomm.destroy_process_group(group)


def test_object_collectives_of_two_threads_on_one_group_give_right_data_or_the_error(
    world: mpicomm.ProcessGroup,
) -> None:
    """The calls outside the front door (``core.calls.collective``: objects, barrier) hold their group too."""
    n, r = world.size(), world.rank()
    group = mpicomm.new_group(list(range(n)), timeout=60)
    outcomes: list[str] = []

    def work(t: int) -> None:
        for i in range(40):
            out: list[Any] = [None] * n
            try:
                mpicomm.all_gather_object(out, (t, i, r), group=group)
            except DistError as exc:
                assert "all_gather_object: two threads called on group" in str(exc), exc
                outcomes.append("raised")
                continue
            outcomes.append("right" if out == [(t, i, s) for s in range(n)] else "WRONG")

    in_threads(lambda: work(0), lambda: work(1), timeout=120)
    assert len(outcomes) == 80, outcomes
    _never_silent(outcomes)
    assert group not in busy._BUSY
    mpicomm.destroy_process_group(group)
