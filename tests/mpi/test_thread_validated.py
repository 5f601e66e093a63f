"""Validation mode at ``MPI_THREAD_MULTIPLE``: a race seen on one rank raises the same error on every rank.

Without validation, a rank whose threads took turns on a group gets the data that the overlapping
threads of another rank paired wrongly, and returns it; only the rank that saw the overlap raises
(tests/mpi/test_thread_one_group.py). In validation mode every call that holds its group ends with
one agreement across the group on whether it is raced on any rank (``mpicomm.core.busy.settle``):
from the first call that can have been paired wrongly on, every rank raises the same DistError.

Under ``python -m mpi4py`` MPI runs at ``MPI_THREAD_MULTIPLE``. Each test makes its own groups (a
raced group stays raced). Every rank builds the expected sums from the ranks' values.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from ranks import as_numpy as _values
from ranks import full_numpy as _numpy
from ranks import full_torch as _torch
from ranks import in_threads

import mpicomm
from mpicomm.core import busy
from mpicomm.errors import CommunicationError, CrossRankMismatchError, DistError

pytestmark = pytest.mark.skipif(
    MPI.Query_thread() < MPI.THREAD_MULTIPLE,
    reason="needs MPI_THREAD_MULTIPLE (tests/unit/test_thread_level.py)",
)

ROUNDS = 60


@pytest.fixture
def validated(world: mpicomm.ProcessGroup) -> Iterator[None]:
    saved = mpicomm.is_validation_enabled()
    mpicomm.set_validation(True)
    yield
    mpicomm.set_validation(saved)


def _same_everywhere(texts: list[str]) -> None:
    """Every rank holds the same list of texts (compared by digest over the world group).

    Group names are each rank's own (``group<N>`` counts the groups made on that rank, which earlier
    tests in the same process may have made on some ranks only), so they are left out.
    """
    same = [re.sub(r"group\d+", "group", text) for text in texts]
    digest = hashlib.sha256("\n".join(same).encode()).digest()
    mine = np.frombuffer(digest, np.uint8).astype(np.int64)
    low, high = mine.copy(), mine.copy()
    mpicomm.all_reduce(low, op=mpicomm.ReduceOp.MIN)
    mpicomm.all_reduce(high, op=mpicomm.ReduceOp.MAX)
    assert np.array_equal(low, high), f"the ranks' errors differ; this rank's: {texts}"


def _outcome(make: Callable[[float], Any], value: float, want: float, group: mpicomm.ProcessGroup) -> str:
    """One all_reduce on ``group``: "right", "WRONG" (returned without error) or the DistError's text."""
    x = make(value)
    try:
        mpicomm.all_reduce(x, group=group)
    except DistError as exc:
        return str(exc)
    return "right" if np.all(_values(x) == want) else "WRONG"


@pytest.mark.usefixtures("validated")
@pytest.mark.parametrize("make", [_numpy, _torch], ids=["numpy-C-door", "torch-python-wrapper"])
def test_threads_that_overlap_on_rank_0_only_raise_on_every_rank(
    world: mpicomm.ProcessGroup, make: Callable[[float], Any]
) -> None:
    """Rank 0's threads overlap (A inside, B comes); the others' take turns in the other order (B, A).

    So the first call pairs rank 0's A with the others' B: without validation the others would
    return the wrongly paired sum silently (the gap of test_thread_one_group). Here every rank
    raises the same error for both calls.
    """
    n, r = world.size(), world.rank()
    make(0.0)  # skips before any group is made where torch is missing
    group = mpicomm.new_group(list(range(n)), timeout=60)
    signal = MPI.COMM_WORLD.Dup()  # rank 0 tells the others when its race is marked
    got: dict[str, str] = {}
    b_done = threading.Event()
    values = {"a": 1.0, "b": 100.0}

    def call(name: str) -> None:
        got[name] = _outcome(make, values[name] + r, n * values[name] + sum(range(n)), group)

    def a() -> None:
        if r != 0 and not b_done.wait(60):
            raise AssertionError("thread B never ended")
        call("a")

    def b() -> None:
        if r == 0:  # until A is inside: it waits there for the others' first call
            deadline = time.monotonic() + 60
            while busy._BUSY.get(group) is None and "a" not in got:
                assert time.monotonic() < deadline, "thread A never came"
                time.sleep(0.001)
        else:
            signal.Recv(np.empty(1), source=0, tag=11)
        try:
            call("b")
        finally:
            b_done.set()

    def tell() -> None:  # rank 0: once B has marked the group raced, let the others' B call
        if r != 0:
            return
        deadline = time.monotonic() + 60
        while group not in busy._RACED and "a" not in got:
            assert time.monotonic() < deadline, "thread B never raced"
            time.sleep(0.001)
        for peer in range(1, n):
            signal.Send(np.zeros(1), dest=peer, tag=11)

    in_threads(a, b, tell, names=("thread-A", "thread-B", "teller"), timeout=120)
    signal.Free()
    assert "WRONG" not in got.values(), got
    if n == 1:  # no peer to pair wrongly with: each call is right, or raised where they overlapped
        assert all(v == "right" or "two threads called on group" in v for v in got.values()), got
    else:
        for name in ("a", "b"):
            text = got[name]
            assert text.startswith(f"all_reduce: two threads called on group {group.name} at once on "), got
            assert f"world rank {group.ranks[0]} (thread 'thread-B' called all_reduce" in text, got
            assert "thread 'thread-A' was inside all_reduce on it" in text, got
            assert "validation mode found it as this call ended" in text, got
            assert busy._AGREED.get(group)
        assert got["a"] == got["b"]
        _same_everywhere([got["a"], got["b"]])
    assert group not in busy._BUSY
    x = np.array([float(r)])  # the world was never raced: it still works on every rank
    mpicomm.all_reduce(x)
    assert x[0] == sum(range(n))
    mpicomm.destroy_process_group(group)


@pytest.mark.usefixtures("validated")
@pytest.mark.parametrize("make", [_numpy, _torch], ids=["numpy-C-door", "torch-python-wrapper"])
def test_a_hammer_overlapping_on_some_ranks_never_returns_wrong_data(
    world: mpicomm.ProcessGroup, make: Callable[[float], Any]
) -> None:
    """Two threads hammer one group; on even ranks they start together, on odd ranks one after the other.

    The odd ranks come late, so the even ranks' first call waits inside while their second thread
    comes: raced there. Every rank then raises on the same calls (the same number, the same
    message), and no call returns a wrong sum on any rank.
    """
    n, r = world.size(), world.rank()
    make(0.0)
    group = mpicomm.new_group(list(range(n)), timeout=60)
    outcomes: dict[int, list[str]] = {0: [], 1: []}
    first_done = threading.Event()

    def work(t: int) -> None:
        if r % 2:  # odd ranks: late, and their threads take turns
            if t == 1 and not first_done.wait(120):
                raise AssertionError("thread 0 never ended")
            time.sleep(0.3 if t == 0 else 0)
        for i in range(ROUNDS):
            value = 1000.0 * t + i
            outcomes[t].append(_outcome(make, value + r / 8, n * value + sum(range(n)) / 8, group))
        first_done.set()

    in_threads(lambda: work(0), lambda: work(1), names=("hammer0", "hammer1"), timeout=180)
    both = outcomes[0] + outcomes[1]
    assert len(both) == 2 * ROUNDS
    assert "WRONG" not in both, both
    raised = [o for o in both if o != "right"]
    counts = np.array([len(raised)], np.int64)
    low, high = counts.copy(), counts.copy()
    mpicomm.all_reduce(low, op=mpicomm.ReduceOp.MIN)
    mpicomm.all_reduce(high, op=mpicomm.ReduceOp.MAX)
    assert low[0] == high[0], f"ranks raised on different numbers of calls: this rank {counts[0]}"
    if n > 1:
        assert raised, "the even ranks' threads overlapped, yet no call raised"
    for text in raised:
        assert text.startswith(f"all_reduce: two threads called on group {group.name} at once on "), text
        assert "validation mode found it" in text or n == 1, text
    _same_everywhere(sorted(set(raised)))
    assert group not in busy._BUSY
    mpicomm.destroy_process_group(group)


def test_validation_without_threads_is_unchanged(world: mpicomm.ProcessGroup) -> None:
    """One thread, validation on: right sums, mismatches raise on every rank as before, nothing raced.

    With validation off no held call settles (busy's table stays empty: the doors' one test of it).
    """
    n, r = world.size(), world.rank()
    saved = mpicomm.is_validation_enabled()
    mpicomm.set_validation(False)
    try:
        assert busy._VALIDATING not in busy._RACED
        mpicomm.set_validation(True)
        assert busy._VALIDATING in busy._RACED
        group = mpicomm.new_group(list(range(n)), timeout=60)
        for i in range(20):
            x = np.full(4, float(i + r))
            mpicomm.all_reduce(x, group=group)
            assert np.all(x == n * i + sum(range(n)))
            y = np.full(2, float(r))
            mpicomm.broadcast(y, src=0, group=group)
            assert np.all(y == 0.0)
        if n > 1:  # a mistake across ranks: the same error on every rank, and the group goes on
            with pytest.raises(CrossRankMismatchError, match="count differs"):
                mpicomm.all_reduce(np.ones(3 + (r == 0)), group=group)
        out: list[Any] = [None] * n
        mpicomm.all_gather_object(out, r, group=group)
        assert out == list(range(n))
        x = np.ones(2)
        mpicomm.all_reduce(x, group=group)
        assert x.tolist() == [n, n]
        assert group not in busy._RACED and group not in busy._AGREED and group not in busy._BUSY
        mpicomm.destroy_process_group(group)
        mpicomm.set_validation(False)
        assert busy._VALIDATING not in busy._RACED
    finally:
        mpicomm.set_validation(saved)


@pytest.mark.usefixtures("validated")
def test_every_rank_agrees_once_per_call_even_inside_an_except_block(
    world: mpicomm.ProcessGroup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 calls while handling a CommunicationError of its own: its calls still agree with the others'.

    A call that itself ends in a CommunicationError skips the agreement (on every rank alike, or the
    group is broken anyway); an error the program is handling around the call is not the call's.
    """
    n, r = world.size(), world.rank()
    group = mpicomm.new_group(list(range(n)), timeout=30)  # a lost agreement ends the job
    agreed: list[bool] = []
    real = busy._agree

    def counted(token: tuple[Any, ...], k: Any) -> bool:
        agreed.append(real(token, k))
        return agreed[-1]

    monkeypatch.setattr(busy, "_agree", counted)

    def calls() -> None:
        for i in range(5):
            x = np.full(2, float(i + r))
            mpicomm.all_reduce(x, group=group)
            assert np.all(x == n * i + sum(range(n)))
            out: list[Any] = [None] * n
            mpicomm.all_gather_object(out, (i, r), group=group)
            assert out == [(i, s) for s in range(n)]

    if r == 0:
        try:
            raise CommunicationError("the program's own, handled around the calls")
        except CommunicationError:
            calls()
    else:
        calls()
    assert agreed == [False] * 10
    mpicomm.destroy_process_group(group)
