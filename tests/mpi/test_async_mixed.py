"""Ranks may differ in ``async_op`` (torch's semantics: it is a local choice): every collective
issues the same MPI operations whether the caller asked for a Work or not.

Before issue 34, a rank that asked for a Work posted MPI's non-blocking collective while the others
made the blocking one, which MPI never matches: the job hung until the watchdog. Each test lets a
different set of ranks ask for a Work (rank 0 alone, the odd ranks, every rank but the last), on the
world group (whose blocking calls take the C fast paths) and on a subgroup, small and past 64 KiB
(where the list forms change algorithm), and checks every rank's result against numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import mpicomm

PATTERNS: dict[str, Callable[[int, int], bool]] = {
    "rank0": lambda r, w: r == 0,
    "odd": lambda r, w: r % 2 == 1,
    "all_but_last": lambda r, w: r != w - 1,
}
SIZES = [3, 9000]  # 24 B and 72 KB of float64: both sides of the list forms' 64 KiB switch


def _run(call: Callable[[bool], Any], flag: bool) -> None:
    work = call(flag)
    if flag:
        assert isinstance(work, (mpicomm.Work, mpicomm.Future)), work  # coalesced calls: a Future
        work.wait()
        assert work.done() if isinstance(work, mpicomm.Future) else work.is_completed()
    else:
        assert work is None


def _group(which: str) -> Any:
    return None if which == "world" else mpicomm.new_group(list(range(mpicomm.get_world_size())))


@pytest.fixture(params=list(PATTERNS), ids=list(PATTERNS))
def flag(request: pytest.FixtureRequest, world: mpicomm.ProcessGroup) -> bool:
    return PATTERNS[request.param](world.rank(), world.size())


@pytest.fixture(params=["world", "subgroup"])
def group(request: pytest.FixtureRequest, world: mpicomm.ProcessGroup) -> Any:
    return _group(request.param)


def _inputs(rng: np.random.Generator, w: int, n: int) -> np.ndarray:
    return rng.integers(-9, 9, size=(w, n)).astype(np.float64)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", SIZES)
def test_all_reduce_mixed_async_op(world, rng, flag, group, n):
    xs = _inputs(rng, world.size(), n)
    x = xs[world.rank()].copy()
    _run(lambda a: mpicomm.all_reduce(x, group=group, async_op=a), flag)
    np.testing.assert_array_equal(x, xs.sum(0))


@pytest.mark.mpi(min_size=2)
def test_all_reduce_mixed_async_op_float16_and_avg(world, rng, flag):
    xs = _inputs(rng, world.size(), 5)
    x = xs[world.rank()].astype(np.float16)
    _run(lambda a: mpicomm.all_reduce(x, op=mpicomm.ReduceOp.AVG, async_op=a), flag)
    np.testing.assert_allclose(x.astype(np.float64), xs.mean(0), rtol=1e-3, atol=1e-3)


@pytest.mark.mpi(min_size=2)
def test_all_reduce_mixed_async_op_strided(world, rng, flag):
    xs = _inputs(rng, world.size(), 8)
    base = np.zeros(16)
    base[::2] = xs[world.rank()]
    _run(lambda a: mpicomm.all_reduce(base[::2], async_op=a), flag)
    np.testing.assert_array_equal(base[::2], xs.sum(0))
    assert not base[1::2].any()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", SIZES)
def test_broadcast_mixed_async_op(world, rng, flag, group, n):
    xs = _inputs(rng, world.size(), n)
    src = world.size() - 1
    x = xs[world.rank()].copy()
    _run(lambda a: mpicomm.broadcast(x, src=src, group=group, async_op=a), flag)
    np.testing.assert_array_equal(x, xs[src])


@pytest.mark.mpi(min_size=2)
def test_reduce_mixed_async_op(world, rng, flag, group):
    xs = _inputs(rng, world.size(), 4)
    x = xs[world.rank()].copy()
    _run(lambda a: mpicomm.reduce(x, dst=0, op=mpicomm.ReduceOp.MAX, group=group, async_op=a), flag)
    np.testing.assert_array_equal(x, xs.max(0) if world.rank() == 0 else xs[world.rank()])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", SIZES)
def test_all_gather_into_tensor_mixed_async_op(world, rng, flag, group, n):
    xs = _inputs(rng, world.size(), n)
    out = np.empty(world.size() * n)
    _run(
        lambda a: mpicomm.all_gather_into_tensor(out, xs[world.rank()].copy(), group=group, async_op=a), flag
    )
    np.testing.assert_array_equal(out, xs.reshape(-1))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter_tensor_mixed_async_op(world, rng, flag, group, n):
    w, r = world.size(), world.rank()
    xs = rng.integers(-9, 9, size=(w, w * n)).astype(np.float64)
    out = np.empty(n)
    _run(lambda a: mpicomm.reduce_scatter_tensor(out, xs[r].copy(), group=group, async_op=a), flag)
    np.testing.assert_array_equal(out, xs.sum(0)[r * n : (r + 1) * n])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", SIZES)
def test_all_gather_list_mixed_async_op(world, rng, flag, group, n):
    xs = _inputs(rng, world.size(), n)
    outs = [np.empty(n) for _ in range(world.size())]
    _run(lambda a: mpicomm.all_gather(outs, xs[world.rank()].copy(), group=group, async_op=a), flag)
    np.testing.assert_array_equal(np.stack(outs), xs)


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter_list_mixed_async_op(world, rng, flag, group, n):
    w, r = world.size(), world.rank()
    xs = rng.integers(-9, 9, size=(w, w, n)).astype(np.float64)
    out = np.empty(n)
    _run(lambda a: mpicomm.reduce_scatter(out, [p.copy() for p in xs[r]], group=group, async_op=a), flag)
    np.testing.assert_array_equal(out, xs[:, r].sum(0))


@pytest.mark.mpi(min_size=2)
def test_all_to_all_mixed_async_op(world, rng, flag, group):
    w, r = world.size(), world.rank()
    xs = rng.integers(-9, 9, size=(w, w, 3)).astype(np.float64)
    outs = [np.empty(3) for _ in range(w)]
    _run(lambda a: mpicomm.all_to_all(outs, [p.copy() for p in xs[r]], group=group, async_op=a), flag)
    np.testing.assert_array_equal(np.stack(outs), xs[:, r])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("split", [False, True], ids=["equal", "splits"])
def test_all_to_all_single_mixed_async_op(world, rng, flag, group, split):
    w, r = world.size(), world.rank()
    xs = rng.integers(-9, 9, size=(w, w * 2)).astype(np.float64)
    out = np.empty(w * 2)
    sizes = [2] * w if split else None
    _run(
        lambda a: mpicomm.all_to_all_single(
            out, xs[r].copy(), output_split_sizes=sizes, input_split_sizes=sizes, group=group, async_op=a
        ),
        flag,
    )
    np.testing.assert_array_equal(out, xs[:, 2 * r : 2 * r + 2].reshape(-1))


@pytest.mark.mpi(min_size=2)
def test_gather_mixed_async_op(world, rng, flag, group):
    w, r = world.size(), world.rank()
    xs = _inputs(rng, w, 3)
    outs = [np.empty(3) for _ in range(w)] if r == 0 else None
    _run(lambda a: mpicomm.gather(xs[r].copy(), outs, dst=0, group=group, async_op=a), flag)
    if r == 0:
        np.testing.assert_array_equal(np.stack(outs), xs)


@pytest.mark.mpi(min_size=2)
def test_scatter_mixed_async_op(world, rng, flag, group):
    w, r = world.size(), world.rank()
    xs = _inputs(rng, w, 3)
    ins = [x.copy() for x in xs] if r == 0 else None
    out = np.empty(3)
    _run(lambda a: mpicomm.scatter(out, ins, src=0, group=group, async_op=a), flag)
    np.testing.assert_array_equal(out, xs[r])


@pytest.mark.mpi(min_size=2)
def test_barrier_mixed_async_op(world, flag, group):
    _run(lambda a: mpicomm.barrier(group=group, async_op=a), flag)


@pytest.mark.mpi(min_size=2)
def test_coalesced_mixed_async_op(world, rng, flag, group):
    w, r = world.size(), world.rank()
    xs = _inputs(rng, w, 5)
    a, b = xs[r][:2].copy(), xs[r][2:].copy()
    _run(lambda f: mpicomm.all_reduce_coalesced([a, b], group=group, async_op=f), flag)
    np.testing.assert_array_equal(np.concatenate([a, b]), xs.sum(0))
    outs = [np.empty(5) for _ in range(w)]
    _run(
        lambda f: mpicomm.all_gather_coalesced([[o] for o in outs], [xs[r].copy()], group=group, async_op=f),
        flag,
    )
    np.testing.assert_array_equal(np.stack(outs), xs)


@pytest.mark.mpi(min_size=2)
def test_torch_tensor_mixed_async_op(world, rng, flag):
    torch = pytest.importorskip("torch")
    xs = _inputs(rng, world.size(), 4)
    t = torch.from_numpy(xs[world.rank()].copy())
    _run(lambda a: mpicomm.all_reduce(t, async_op=a), flag)
    np.testing.assert_array_equal(t.numpy(), xs.sum(0))
    out = torch.empty(world.size() * 4, dtype=torch.float64)
    _run(
        lambda a: mpicomm.all_gather_into_tensor(out, torch.from_numpy(xs[world.rank()].copy()), async_op=a),
        flag,
    )
    np.testing.assert_array_equal(out.numpy(), xs.reshape(-1))


@pytest.mark.mpi(min_size=2)
def test_mixed_async_op_then_a_plain_call_still_matches(world, rng, flag):
    """After a run of mixed calls the ranks are still in step (no message left over)."""
    xs = _inputs(rng, world.size(), 3)
    for _ in range(3):
        x = xs[world.rank()].copy()
        _run(lambda a, x=x: mpicomm.all_reduce(x, async_op=a), flag)
        _run(lambda a, x=x: mpicomm.broadcast(x, src=0, async_op=a), not flag)
    y = np.ones(2)
    mpicomm.all_reduce(y)
    assert y.tolist() == [world.size()] * 2
