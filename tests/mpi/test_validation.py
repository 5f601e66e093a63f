"""Validation mode: mistakes only visible across ranks raise the same CrossRankMismatchError everywhere.

Each test makes every rank pass arguments that are fine locally but disagree with another rank's,
turns validation on, and checks that every rank raises CrossRankMismatchError (also a ValueError)
with the same message, which starts with the function's name and names what differs. After each test
the ranks must still be in step. Valid calls must keep working with validation on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import CrossRankMismatchError, MpicommError, ReduceOp

pytestmark = pytest.mark.mpi(min_size=2)


@pytest.fixture(autouse=True)
def validating(request: pytest.FixtureRequest, world: mpicomm.ProcessGroup) -> Iterator[None]:
    mpicomm.set_validation(True)
    request.addfinalizer(lambda: mpicomm.set_validation(False))
    yield
    assert mpicomm.is_validation_enabled()
    # still in step: the same test on every rank, and a validated collective that works
    names = MPI.COMM_WORLD.allgather(request.node.nodeid)
    assert names == [names[0]] * len(names), f"ranks are in different tests: {names}"
    x = np.ones(2)
    mpicomm.all_reduce(x)
    assert x.tolist() == [float(world.size())] * 2
    mpicomm.barrier()


def mismatch(call: Callable[[], Any], fn: str, *words: str) -> str:
    """Run ``call`` on every rank; every rank must raise the same CrossRankMismatchError."""
    with pytest.raises(CrossRankMismatchError) as info:
        call()
    exc = info.value
    assert isinstance(exc, MpicommError) and isinstance(exc, ValueError)
    msg = str(exc)
    everyone = MPI.COMM_WORLD.allgather(msg)
    assert everyone == [msg] * len(everyone), f"ranks raised different messages: {everyone}"
    assert msg.startswith(f"{fn}: "), msg
    for word in words:
        assert word in msg, f"{word!r} not in {msg!r}"
    return msg


def per_rank(values: list[Any]) -> str:
    """The ``rank 0: a, rank 1: b`` listing the messages use."""
    return ", ".join(f"rank {i}: {v}" for i, v in enumerate(values))


# --------------------------------------------------------------------------------------------------
# different ops


def _odd_max(r: int) -> ReduceOp:
    return ReduceOp.MAX if r % 2 else ReduceOp.SUM


REDUCING: dict[str, Callable[[int, int, Any, np.ndarray], Any]] = {
    "all_reduce": lambda w, r, op, x: mpicomm.all_reduce(x, op=op),
    "reduce": lambda w, r, op, x: mpicomm.reduce(x, dst=0, op=op),
    "reduce_scatter": lambda w, r, op, x: mpicomm.reduce_scatter(x, [x.copy() for _ in range(w)], op=op),
    "reduce_scatter_tensor": lambda w, r, op, x: mpicomm.reduce_scatter_tensor(
        x, np.concatenate([x] * w), op=op
    ),
}


@pytest.mark.parametrize("fn", sorted(REDUCING))
def test_different_ops(world: mpicomm.ProcessGroup, fn: str) -> None:
    w, r = world.size(), world.rank()
    x = np.full(3, float(r))
    before = x.copy()
    ops = [repr(_odd_max(i)) for i in range(w)]
    mismatch(lambda: REDUCING[fn](w, r, _odd_max(r), x), fn, "op", per_rank(ops))
    assert (x == before).all(), "a refused call changed its array"


@pytest.mark.parametrize("fn", sorted(REDUCING))
def test_different_premul_factors(world: mpicomm.ProcessGroup, fn: str) -> None:
    w, r = world.size(), world.rank()
    op = ReduceOp.PREMUL_SUM(2.0 if r == w - 1 else 0.5)
    x = np.ones(2)
    mismatch(lambda: REDUCING[fn](w, r, op, x), fn, "op", "PREMUL_SUM(0.5)", "PREMUL_SUM(2.0)")
    assert (x == 1.0).all(), "PREMUL_SUM scaled the input before validation refused the call"


# --------------------------------------------------------------------------------------------------
# different dtypes


def _dt(r: int) -> Any:
    return np.float32 if r == 1 else np.float64


MOVING: dict[str, Callable[[int, int, Any], Any]] = {
    "all_reduce": lambda w, r, dt: mpicomm.all_reduce(np.zeros(2, dt)),
    "reduce": lambda w, r, dt: mpicomm.reduce(np.zeros(2, dt), dst=0),
    "broadcast": lambda w, r, dt: mpicomm.broadcast(np.zeros(2, dt), src=0),
    "all_gather": lambda w, r, dt: mpicomm.all_gather([np.zeros(2, dt) for _ in range(w)], np.zeros(2, dt)),
    "all_gather_into_tensor": lambda w, r, dt: mpicomm.all_gather_into_tensor(
        np.zeros(2 * w, dt), np.zeros(2, dt)
    ),
    "gather": lambda w, r, dt: mpicomm.gather(
        np.zeros(2, dt), [np.zeros(2, dt) for _ in range(w)] if r == 0 else None, dst=0
    ),
    "scatter": lambda w, r, dt: mpicomm.scatter(
        np.zeros(2, dt), [np.zeros(2, dt) for _ in range(w)] if r == 0 else None, src=0
    ),
    "reduce_scatter": lambda w, r, dt: mpicomm.reduce_scatter(
        np.zeros(2, dt), [np.zeros(2, dt) for _ in range(w)]
    ),
    "reduce_scatter_tensor": lambda w, r, dt: mpicomm.reduce_scatter_tensor(
        np.zeros(2, dt), np.zeros(2 * w, dt)
    ),
    "all_to_all": lambda w, r, dt: mpicomm.all_to_all(
        [np.zeros(1, dt) for _ in range(w)], [np.zeros(1, dt) for _ in range(w)]
    ),
    "all_to_all_single": lambda w, r, dt: mpicomm.all_to_all_single(np.zeros(w, dt), np.zeros(w, dt)),
}


@pytest.mark.parametrize("fn", sorted(MOVING))
def test_different_dtypes(world: mpicomm.ProcessGroup, fn: str) -> None:
    w, r = world.size(), world.rank()
    dtypes = [np.dtype(_dt(i)).name for i in range(w)]
    mismatch(lambda: MOVING[fn](w, r, _dt(r)), fn, "dtype", per_rank(dtypes))


def test_same_itemsize_different_kind(world: mpicomm.ProcessGroup) -> None:
    """int64 and float64 have the same size, so MPI would not notice; validation does."""
    r = world.rank()
    dt = np.int64 if r == 0 else np.float64
    mismatch(lambda: mpicomm.broadcast(np.zeros(2, dt), src=0), "broadcast", "dtype", "int64", "float64")


# --------------------------------------------------------------------------------------------------
# different counts


def _n(r: int) -> int:
    return 3 if r == 0 else 2


COUNTED: dict[str, Callable[[int, int, int], Any]] = {
    "all_reduce": lambda w, r, n: mpicomm.all_reduce(np.zeros(n)),
    "reduce": lambda w, r, n: mpicomm.reduce(np.zeros(n), dst=0),
    "broadcast": lambda w, r, n: mpicomm.broadcast(np.zeros(n), src=0),
    "all_gather_into_tensor": lambda w, r, n: mpicomm.all_gather_into_tensor(np.zeros(n * w), np.zeros(n)),
    "reduce_scatter_tensor": lambda w, r, n: mpicomm.reduce_scatter_tensor(np.zeros(n), np.zeros(n * w)),
}


@pytest.mark.parametrize("fn", sorted(COUNTED))
def test_different_counts(world: mpicomm.ProcessGroup, fn: str) -> None:
    w, r = world.size(), world.rank()
    mismatch(lambda: COUNTED[fn](w, r, _n(r)), fn, "count", per_rank([_n(i) for i in range(w)]))


def test_all_reduce_async_validates_at_the_call(world: mpicomm.ProcessGroup) -> None:
    r = world.rank()
    mismatch(lambda: mpicomm.all_reduce(np.zeros(_n(r)), async_op=True), "all_reduce", "count")


# --------------------------------------------------------------------------------------------------
# uneven exchanges whose sizes do not pair up


def test_all_to_all_single_splits_do_not_match(world: mpicomm.ProcessGroup) -> None:
    """Rank 1's input split for rank 0 is 1 row, but rank 0 expects 2 rows from rank 1."""
    w, r = world.size(), world.rank()
    in_splits = [1] * w
    out_splits = [1] * w
    if r == 0:
        out_splits[1] = 2  # locally consistent: rank 0's output simply has one more row
    out = np.zeros(sum(out_splits))
    inp = np.zeros(sum(in_splits))
    mismatch(
        lambda: mpicomm.all_to_all_single(out, inp, out_splits, in_splits),
        "all_to_all_single",
        "rank 1 sends 1",
        "to rank 0",
        "expects 2 from rank 1",
    )


def test_all_to_all_single_splits_counted_in_rows(world: mpicomm.ProcessGroup) -> None:
    """With rows of 3 elements the message's numbers must say rows, or count elements."""
    w, r = world.size(), world.rank()
    in_splits = [1] * w
    out_splits = [1] * w
    if r == 0:
        out_splits[1] = 2
    out = np.zeros((sum(out_splits), 3))
    inp = np.zeros((sum(in_splits), 3))
    msg = mismatch(
        lambda: mpicomm.all_to_all_single(out, inp, out_splits, in_splits),
        "all_to_all_single",
        "rank 1",
        "rank 0",
    )
    assert ("sends 1 row" in msg and "expects 2" in msg) or (
        "sends 3 elements" in msg and "expects 6" in msg
    ), msg


def test_all_to_all_single_row_sizes_differ(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    cols = 2 if r == 0 else 3
    mismatch(
        lambda: mpicomm.all_to_all_single(np.zeros((w, cols)), np.zeros((w, cols))),
        "all_to_all_single",
        "row",
    )


def test_all_to_all_sizes_do_not_match(world: mpicomm.ProcessGroup) -> None:
    """The last rank sends 2 elements to rank 0, which expects 1."""
    w, r = world.size(), world.rank()
    last = w - 1
    ins = [np.zeros(2 if (r == last and j == 0) else 1) for j in range(w)]
    outs = [np.zeros(1) for _ in range(w)]
    mismatch(
        lambda: mpicomm.all_to_all(outs, ins),
        "all_to_all",
        f"rank {last} sends 2",
        "to rank 0",
        f"expects 1 from rank {last}",
    )


def test_all_gather_sizes_do_not_match(world: mpicomm.ProcessGroup) -> None:
    """Rank 1 contributes 3 elements; rank 0 made room for 2."""
    w, r = world.size(), world.rank()
    mine = np.full(3 if r == 1 else 2, float(r))
    outs = [np.zeros(3 if (j == 1 and r != 0) else 2) for j in range(w)]
    outs[r] = np.zeros(mine.size)
    mismatch(
        lambda: mpicomm.all_gather(outs, mine),
        "all_gather",
        "rank 1 sends 3",
        "to rank 0",
        "expects 2 from rank 1",
    )


def test_reduce_scatter_sizes_do_not_match(world: mpicomm.ProcessGroup) -> None:
    """Rank 0 sends 2 elements for rank 1, whose output holds 3."""
    w, r = world.size(), world.rank()
    out = np.zeros(3 if r == 1 else 2)
    ins = [np.zeros(out.size if j == r else 2) for j in range(w)]
    mismatch(
        lambda: mpicomm.reduce_scatter(out, ins),
        "reduce_scatter",
        "rank 0 sends 2",
        "to rank 1",
        "expects 3 from rank 0",
    )


def test_gather_sizes_do_not_match(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    mine = np.zeros(3 if r == 1 else 2)
    outs = [np.zeros(2) for _ in range(w)] if r == 0 else None
    mismatch(
        lambda: mpicomm.gather(mine, outs, dst=0),
        "gather",
        "rank 1 sends 3",
        "to rank 0",
        "expects 2 from rank 1",
    )


def test_scatter_sizes_do_not_match(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    out = np.zeros(3 if r == 1 else 2)
    parts = [np.zeros(2) for _ in range(w)] if r == 0 else None
    mismatch(
        lambda: mpicomm.scatter(out, parts, src=0),
        "scatter",
        "rank 0 sends 2",
        "to rank 1",
        "expects 3 from rank 0",
    )


# --------------------------------------------------------------------------------------------------
# different roots


def _root(r: int, w: int) -> int:
    return w - 1 if r == 0 else 0


ROOTED: dict[str, tuple[str, Callable[[int, int, int], Any]]] = {
    "broadcast": ("src", lambda w, r, root: mpicomm.broadcast(np.zeros(2), src=root)),
    "reduce": ("dst", lambda w, r, root: mpicomm.reduce(np.zeros(2), dst=root)),
    "gather": (
        "dst",
        lambda w, r, root: mpicomm.gather(
            np.zeros(2), [np.zeros(2) for _ in range(w)] if r == root else None, dst=root
        ),
    ),
    "scatter": (
        "src",
        lambda w, r, root: mpicomm.scatter(
            np.zeros(2), [np.zeros(2) for _ in range(w)] if r == root else None, src=root
        ),
    ),
}


@pytest.mark.parametrize("fn", sorted(ROOTED))
def test_different_roots(world: mpicomm.ProcessGroup, fn: str) -> None:
    w, r = world.size(), world.rank()
    arg, call = ROOTED[fn]
    roots = [_root(i, w) for i in range(w)]
    mismatch(lambda: call(w, r, _root(r, w)), fn, arg, per_rank(roots))


def test_different_roots_group_src(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    mismatch(lambda: mpicomm.broadcast(np.zeros(2), group_src=_root(r, w)), "broadcast", "src")


# --------------------------------------------------------------------------------------------------
# different functions


CALLS: dict[str, Callable[[int, int], Any]] = {
    "all_reduce": lambda w, r: mpicomm.all_reduce(np.zeros(2)),
    "broadcast": lambda w, r: mpicomm.broadcast(np.zeros(2), src=0),
    "barrier": lambda w, r: mpicomm.barrier(),
    "all_gather_into_tensor": lambda w, r: mpicomm.all_gather_into_tensor(np.zeros(2 * w), np.zeros(2)),
    "reduce_scatter_tensor": lambda w, r: mpicomm.reduce_scatter_tensor(np.zeros(2), np.zeros(2 * w)),
    "all_to_all_single": lambda w, r: mpicomm.all_to_all_single(np.zeros(w), np.zeros(w)),
}
PAIRS = [
    ("all_reduce", "broadcast"),
    ("barrier", "all_reduce"),
    ("all_gather_into_tensor", "reduce_scatter_tensor"),
    ("all_to_all_single", "barrier"),
]


@pytest.mark.parametrize(("first", "others"), PAIRS, ids=[f"{a}-vs-{b}" for a, b in PAIRS])
def test_different_functions(world: mpicomm.ProcessGroup, first: str, others: str) -> None:
    """Rank 0 calls one function and the others another: every rank names both."""
    w, r = world.size(), world.rank()
    mine = first if r == 0 else others
    names = [first if i == 0 else others for i in range(w)]
    with pytest.raises(CrossRankMismatchError) as info:
        CALLS[mine](w, r)
    msg = str(info.value)
    everyone = MPI.COMM_WORLD.allgather(msg)
    assert everyone == [msg] * w, f"ranks raised different messages: {everyone}"
    assert "different functions" in msg and per_rank(names) in msg, msg


# --------------------------------------------------------------------------------------------------
# valid calls still work, with the right results


def test_valid_calls_pass(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    x = np.full(3, r + 1.0)
    mpicomm.all_reduce(x, op=ReduceOp.MAX)
    assert (x == w).all()
    x = np.full(2, r + 1.0)
    mpicomm.all_reduce(x, op=ReduceOp.PREMUL_SUM(2.0))
    assert (x == w * (w + 1)).all()
    x = np.full(2, 7, np.int64) * (r + 1)
    mpicomm.all_reduce(x, op=ReduceOp.AVG)
    assert (x == (7 * w * (w + 1) // 2) // w).all()

    y = np.full(2, float(r))
    mpicomm.reduce(y, dst=w - 1)
    if r == w - 1:
        assert (y == w * (w - 1) / 2).all()

    b = np.arange(4.0) if r == w - 1 else np.zeros(4)
    mpicomm.broadcast(b, src=w - 1)
    assert b.tolist() == [0.0, 1.0, 2.0, 3.0]

    uneven = [np.zeros(j + 1) for j in range(w)]
    mpicomm.all_gather(uneven, np.full(r + 1, float(r)))
    assert [u.tolist() for u in uneven] == [[float(j)] * (j + 1) for j in range(w)]

    flat = np.zeros(2 * w)
    mpicomm.all_gather_into_tensor(flat, np.full(2, float(r)))
    assert flat.tolist() == [float(j) for j in range(w) for _ in range(2)]

    got = [np.zeros(j + 1) for j in range(w)] if r == 0 else None
    mpicomm.gather(np.full(r + 1, float(r)), got, dst=0)
    if r == 0:
        assert got is not None and [g.tolist() for g in got] == [[float(j)] * (j + 1) for j in range(w)]

    part = np.zeros(r + 1)
    parts = [np.full(j + 1, float(j)) for j in range(w)] if r == 0 else None
    mpicomm.scatter(part, parts, src=0)
    assert part.tolist() == [float(r)] * (r + 1)

    out = np.zeros(r + 1)
    mpicomm.reduce_scatter(out, [np.ones(j + 1) for j in range(w)])
    assert (out == w).all()

    out2 = np.zeros(2)
    mpicomm.reduce_scatter_tensor(out2, np.arange(2.0 * w))
    assert out2.tolist() == [2.0 * r * w, (2.0 * r + 1) * w]

    # uneven all_to_all_single: rank i sends i+1 rows to every rank
    inp = np.full((w * (r + 1), 2), float(r))
    res = np.zeros((sum(j + 1 for j in range(w)), 2))
    mpicomm.all_to_all_single(res, inp, [j + 1 for j in range(w)], [r + 1] * w)
    assert res[:, 0].tolist() == [float(j) for j in range(w) for _ in range(j + 1)]

    outs = [np.zeros(r + 1) for _ in range(w)]
    mpicomm.all_to_all(outs, [np.full(j + 1, float(r)) for j in range(w)])
    assert [o.tolist() for o in outs] == [[float(j)] * (r + 1) for j in range(w)]

    work = mpicomm.all_reduce(np.ones(2), async_op=True)
    assert work is not None and work.wait()
    mpicomm.barrier()


def test_valid_calls_on_a_subgroup(world: mpicomm.ProcessGroup) -> None:
    """Validation runs on the group's communicator: a mismatch inside a sub-group is caught there."""
    w = world.size()
    sub = mpicomm.new_group(range(1, w)) if w > 2 else mpicomm.new_group(range(w))
    try:
        if not sub.is_member:
            with pytest.warns(UserWarning):
                assert mpicomm.all_reduce(np.zeros(2), group=sub) is None
            return
        x = np.ones(2)
        mpicomm.all_reduce(x, group=sub)
        assert (x == sub.size()).all()
        n = 3 if sub.rank() == 0 else 2
        with pytest.raises(CrossRankMismatchError) as info:
            mpicomm.all_reduce(np.zeros(n), group=sub)
        everyone = sub.comm.allgather(str(info.value))
        assert everyone == [str(info.value)] * sub.size()
        assert "count" in str(info.value)
    finally:
        mpicomm.destroy_process_group(sub)


def test_validation_flag_is_per_call(world: mpicomm.ProcessGroup) -> None:
    """set_validation(False) turns the check off: matching calls work either way."""
    mpicomm.set_validation(False)
    try:
        assert not mpicomm.is_validation_enabled()
        x = np.ones(2)
        mpicomm.all_reduce(x)
        assert (x == world.size()).all()
    finally:
        mpicomm.set_validation(True)
    assert mpicomm.is_validation_enabled()
