"""torch.distributed's backend ``"mpicomm"`` (``import mpicomm.torch``): every method torch calls.

The default group is made as a user would, ``dist.init_process_group("mpicomm")`` under ``mpiexec``
with no MASTER_ADDR/PORT, rank or world size. Every rank builds the global input from a shared seed and
checks its own result against numpy; where gloo runs the same call (a gloo side group on the store the
MPI rendezvous made) the results are compared too.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch._C._distributed_c10d as C
import torch.distributed as dist

import mpicomm
import mpicomm.torch
from mpicomm.c10d.registered import MpicommProcessGroup
from mpicomm.c10d.registration import _mpi_rendezvous
from mpicomm.core import groups

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def gloo() -> Iterator[Any]:
    """torch's default group on mpicomm (as a user makes it) and a gloo group of the same ranks."""
    w = mpicomm.init()
    saved = w.timeout
    assert "MASTER_ADDR" not in os.environ and "MASTER_PORT" not in os.environ
    dist.init_process_group("mpicomm")
    yield dist.new_group(backend="gloo")
    dist.destroy_process_group()
    w.timeout = saved


def _g(seed: int, w: int, *shape: int) -> np.ndarray:
    """Every rank's input, shape (w, *shape): small integers as float32, so every sum is exact."""
    return np.random.default_rng(seed).integers(-4, 5, (w, *shape)).astype(np.float32)


def _np(t: torch.Tensor) -> np.ndarray:
    return np.array(t.tolist(), dtype=np.float32)


def test_init_takes_rank_and_size_from_mpi(gloo: Any) -> None:
    pg = dist.group.WORLD
    assert isinstance(pg, MpicommProcessGroup)
    assert (dist.get_rank(), dist.get_world_size()) == (mpicomm.get_rank(), mpicomm.get_world_size())
    assert dist.get_backend() == "mpicomm" and pg.getBackendName() == "mpicomm"
    assert pg.group_name == pg.getGroupName() and pg.group_name != ""
    assert pg.mpicomm_group is mpicomm.init()


@pytest.mark.parametrize(
    ("op", "ref"),
    [
        (dist.ReduceOp.SUM, lambda g: g.sum(0)),
        (dist.ReduceOp.AVG, lambda g: g.sum(0) / len(g)),
        (dist.ReduceOp.MAX, lambda g: g.max(0)),
        (dist.ReduceOp.MIN, lambda g: g.min(0)),
        (dist.ReduceOp.PRODUCT, lambda g: g.prod(0)),
        (dist._make_nccl_premul_sum(0.5), lambda g: (0.5 * g).sum(0)),
    ],
    ids=["sum", "avg", "max", "min", "product", "premul_sum"],
)
def test_all_reduce_every_op(gloo: Any, op: Any, ref: Any) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    g = _g(1, w, 7)
    t = torch.tensor(g[r])
    dist.all_reduce(t, op=op)
    np.testing.assert_allclose(_np(t), ref(g), rtol=1e-6)


def test_all_reduce_matches_gloo_bitwise_and_async_future(gloo: Any) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    x = torch.tensor(np.random.default_rng(2).standard_normal((w, 33)).astype(np.float32)[r])
    a, b = x.clone(), x.clone()
    work = dist.all_reduce(a, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    dist.all_reduce(b, group=gloo)
    assert work.wait() and work.is_completed()  # the call runs on mpicomm's communication thread
    if w <= 2:  # two addends: one order; from three ranks gloo's ring sums in another order
        assert torch.equal(a, b)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(fut.wait(), a * 2)
    # an async caller's Work keeps its own outputs across later calls (blocking calls share one Work)
    c, d = torch.ones(2), torch.ones(3)
    held = dist.all_reduce(c, async_op=True)
    dist.all_reduce(d)
    assert held.get_future().value()[0] is c


def test_broadcast_reduce_gather_scatter_with_roots(gloo: Any) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    g = _g(3, w, 4)
    root = w - 1
    t = torch.tensor(g[r])
    dist.broadcast(t, src=root)
    np.testing.assert_array_equal(_np(t), g[root])
    t = torch.tensor(g[r])
    dist.reduce(t, dst=root, op=dist.ReduceOp.MAX)
    np.testing.assert_array_equal(_np(t), g.max(0) if r == root else g[r])
    outs = [torch.empty(4) for _ in range(w)] if r == root else None
    dist.gather(torch.tensor(g[r]), outs, dst=root)
    if outs is not None:
        np.testing.assert_array_equal(np.stack([_np(o) for o in outs]), g)
    out = torch.empty(4)
    dist.scatter(out, [torch.tensor(row) for row in g] if r == root else None, src=root)
    np.testing.assert_array_equal(_np(out), g[r])


def test_gathers_reduce_scatters_and_all_to_alls(gloo: Any) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    g = _g(4, w, w * 2)
    outs = [torch.empty(w * 2) for _ in range(w)]
    dist.all_gather(outs, torch.tensor(g[r]))
    np.testing.assert_array_equal(np.stack([_np(o) for o in outs]), g)
    flat = torch.empty(w * w * 2)
    dist.all_gather_into_tensor(flat, torch.tensor(g[r]))
    np.testing.assert_array_equal(_np(flat), g.reshape(-1))
    out = torch.empty(2)
    dist.reduce_scatter_tensor(out, torch.tensor(g[r]), op=dist.ReduceOp.AVG)
    np.testing.assert_allclose(_np(out), g.sum(0)[2 * r : 2 * r + 2] / w, rtol=1e-6)
    out = torch.empty(2)
    dist.reduce_scatter(out, [torch.tensor(g[r, 2 * i : 2 * i + 2]) for i in range(w)])
    np.testing.assert_array_equal(_np(out), g.sum(0)[2 * r : 2 * r + 2])
    # uneven all_to_all_single: rank i sends i + j + 1 rows to rank j
    sends = [[i + j + 1 for j in range(w)] for i in range(w)]
    rows = [(10 * i + np.arange(sum(sends[i]))[:, None] + np.zeros(2)).astype(np.float32) for i in range(w)]
    recv = [sends[j][r] for j in range(w)]
    out = torch.empty(sum(recv), 2)
    dist.all_to_all_single(out, torch.tensor(rows[r]), recv, sends[r])
    want = np.concatenate([rows[j][sum(sends[j][:r]) : sum(sends[j][: r + 1])] for j in range(w)])
    np.testing.assert_array_equal(np.array(out.tolist(), np.float32), want)
    outs = [torch.empty(2) for _ in range(w)]
    dist.all_to_all(outs, [torch.tensor(g[r, 2 * j : 2 * j + 2]) for j in range(w)])
    np.testing.assert_array_equal(np.stack([_np(o) for o in outs]), g[:, 2 * r : 2 * r + 2])


def test_old_and_new_method_names_and_coalesced_forms(gloo: Any) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    pg = dist.group.WORLD
    g = _g(5, w, w)
    for name in ("all_gather_single", "_allgather_base"):
        out = torch.empty(w * w)
        assert getattr(pg, name)(out, torch.tensor(g[r]), C.AllgatherOptions()).wait()
        np.testing.assert_array_equal(_np(out), g.reshape(-1))
    for name in ("reduce_scatter_single", "_reduce_scatter_base"):
        out = torch.empty(1)
        opts = C.ReduceScatterOptions()
        opts.reduceOp = dist.ReduceOp.SUM
        getattr(pg, name)(out, torch.tensor(g[r]), opts).wait()
        np.testing.assert_array_equal(_np(out), g.sum(0)[r : r + 1])
    for name in ("all_to_all_single", "alltoall_base"):
        out = torch.empty(w)
        getattr(pg, name)(out, torch.tensor(g[r]), [], [], C.AllToAllOptions()).wait()
        np.testing.assert_array_equal(_np(out), g[:, r])
    outs = [torch.empty(w * w), torch.empty(2 * w)]
    work = pg.all_gather_single_coalesced(outs, [torch.tensor(g[r]), torch.ones(2) * r], C.AllgatherOptions())
    assert [o.data_ptr() for o in work.get_future().value()] == [o.data_ptr() for o in outs]
    np.testing.assert_array_equal(_np(outs[1]), np.repeat(np.arange(w), 2).astype(np.float32))
    outs = [torch.empty(1), torch.empty(1)]
    opts = C.ReduceScatterOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    pg.reduce_scatter_single_coalesced(outs, [torch.tensor(g[r]), torch.tensor(-g[r])], opts).wait()
    np.testing.assert_array_equal(_np(outs[0]), g.max(0)[r : r + 1])
    np.testing.assert_array_equal(_np(outs[1]), (-g).max(0)[r : r + 1])
    a, b = torch.tensor(g[r]), torch.ones(3)
    pg.allreduce_coalesced([a, b], C.AllreduceCoalescedOptions()).wait()
    np.testing.assert_array_equal(_np(a), g.sum(0))
    np.testing.assert_array_equal(_np(b), np.full(3, w, np.float32))
    # all_gather_coalesced: outs[rank][i] receives that rank's i-th tensor
    outs2 = [[torch.empty(2), torch.empty(1)] for _ in range(w)]
    dist.all_gather_coalesced(outs2, [torch.full((2,), float(r)), torch.full((1,), -float(r))])
    assert [float(o[0][1]) for o in outs2] == [float(i) for i in range(w)]
    assert [float(o[1][0]) for o in outs2] == [-float(i) for i in range(w)]


def test_point_to_point_any_source_and_batch(gloo: Any) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    if w == 1:
        pytest.skip("point-to-point needs two ranks")
    nxt, prv = (r + 1) % w, (r - 1) % w
    got = torch.zeros(3)
    reqs = dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, torch.full((3,), float(r)), nxt), dist.P2POp(dist.irecv, got, prv)]
    )
    for q in reqs:
        q.wait()
    np.testing.assert_array_equal(_np(got), np.full(3, prv, np.float32))
    # torch's C++ side waits with timedelta(0) for "no timeout" (kNoTimeout): not "time out at once"
    got = torch.zeros(1000)
    recv = dist.irecv(got, prv, tag=5)
    dist.barrier()  # the receive is posted well before its message is sent
    send = dist.isend(torch.full((1000,), float(r)), nxt, tag=5)
    assert recv.wait(datetime.timedelta(0)) and send.wait(datetime.timedelta(0))
    assert float(got[999]) == float(prv)
    if r == 1:
        dist.send(torch.full((2,), 9.0), 0, tag=3)
    elif r == 0:
        buf = torch.zeros(2)
        assert dist.recv(buf, tag=3) == 1  # any source: the sender's rank
        np.testing.assert_array_equal(_np(buf), [9.0, 9.0])
    dist.barrier()


def test_subgroup_is_made_by_its_members_only(gloo: Any) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    ranks = list(range(w - 1, -1, -2))  # every other rank from the top: rank 0 left out at even sizes
    made = len(groups._State.groups)
    sub = dist.new_group(ranks)
    if r not in ranks:
        assert sub == dist.GroupMember.NON_GROUP_MEMBER
        assert len(groups._State.groups) == made  # torch never called the creator here
    else:
        assert isinstance(sub, MpicommProcessGroup) and dist.get_process_group_ranks(sub) == sorted(ranks)
        t = torch.tensor([float(r)])
        dist.all_reduce(t, group=sub)
        assert float(t[0]) == float(sum(ranks))
        t = torch.tensor([float(r)])
        dist.broadcast(t, src=max(ranks), group=sub)  # src is a world rank in torch's API
        assert float(t[0]) == float(max(ranks))
    dist.barrier()


def test_mixed_backend_string_is_refused_clearly(gloo: Any) -> None:
    with pytest.raises(mpicomm.ArgumentError, match=r"cuda.*nccl.*expected 'mpicomm' for every device"):
        dist.new_group(backend="cpu:mpicomm,cuda:nccl")


def test_given_rank_or_size_is_checked_against_mpi(gloo: Any) -> None:
    w = dist.get_world_size()
    with pytest.raises(mpicomm.ArgumentError, match=f"world_size is {w + 1}; expected {w}"):
        next(_mpi_rendezvous(f"mpicomm://?world_size={w + 1}"))
    with pytest.raises(mpicomm.ArgumentError, match="rank is 99"):
        next(_mpi_rendezvous("mpicomm://?rank=99"))


def test_the_mpi_rendezvous_gives_every_rank_one_shared_store(gloo: Any) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    store, rank, size = next(_mpi_rendezvous("mpicomm://"))
    assert (rank, size) == (r, w)
    store.set(f"from{r}", str(r * 7))
    assert [int(store.get(f"from{i}")) for i in range(w)] == [i * 7 for i in range(w)]
    dist.barrier()  # rank 0 serves the store: nobody leaves while another still reads


def test_barrier_timeout_option_and_group_timeout(gloo: Any) -> None:
    opts = dist.BarrierOptions()
    opts.timeout = datetime.timedelta(seconds=30)
    assert dist.group.WORLD.barrier(opts).wait()
    sub = dist.new_group(list(range(dist.get_world_size())), timeout=datetime.timedelta(seconds=42))
    assert sub.mpicomm_group.timeout == 42.0


def test_one_entry_lists_only(gloo: Any) -> None:
    with pytest.raises(mpicomm.ArgumentError, match="allreduce: tensors has 2 entries; expected 1"):
        dist.group.WORLD.allreduce([torch.ones(1), torch.ones(1)], dist.AllreduceOptions())


class _CountingOptions:
    """Torch's AllreduceOptions as the group sees it, counting each option's reads."""

    def __init__(self, op: Any, async_op: bool) -> None:
        self._op, self._async, self.reads = op, async_op, {"reduceOp": 0, "asyncOp": 0}

    @property
    def reduceOp(self) -> Any:  # noqa: N802 - c10d's name
        self.reads["reduceOp"] += 1
        return self._op

    @property
    def asyncOp(self) -> bool:  # noqa: N802 - c10d's name
        self.reads["asyncOp"] += 1
        return self._async


@pytest.mark.parametrize("async_op", [False, True], ids=["blocking", "async"])
def test_allreduce_reads_each_option_once_and_answers_the_right_work(gloo: Any, async_op: bool) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    g = _g(3, w, 5)
    pg = dist.group.WORLD
    # what opts.reduceOp gives: a ReduceOp (its .op the enum), PREMUL_SUM's with its factor
    red = dist.ReduceOp
    cases = [
        (red(red.SUM), g.sum(0)),
        (red(red.MAX), g.max(0)),
        (dist._make_nccl_premul_sum(2.0), (2.0 * g).sum(0)),
    ]
    works = []
    for op, ref in cases:
        t, opts = torch.tensor(g[r]), _CountingOptions(op, async_op)
        work = pg.allreduce([t], opts)
        assert opts.reads == {"reduceOp": 1, "asyncOp": 1}  # pybind reads cost 0.1-0.5 us each
        assert work.wait() and work.get_future().value()[0] is t  # async: on the communication thread
        np.testing.assert_allclose(_np(t), ref, rtol=1e-6)
        works.append(work)
    # a blocking caller drops its Work: one per group serves them all; an async one keeps its own
    assert (works[0] is works[1]) is (not async_op)
    t = torch.ones(3)
    assert pg.allreduce([t]).get_future().value()[0] is t  # C++ callers' default options: SUM
    assert _np(t).tolist() == [w] * 3
