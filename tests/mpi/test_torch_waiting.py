"""How the backend waits, for torchrec's table-wise step: sleeping MPICH waits, all-to-alls in flight.

``init_process_group("mpicomm")`` sets MPICH's ``MPIR_CVAR_ENABLE_HEAVY_YIELD`` through MPI's tool
interface (``mpicomm.c10d.waiting``) where the node is oversubscribed, so a rank waiting for a late
peer sleeps as gloo's waits do instead of polling a core it shares; where each rank has a core it
leaves MPICH polling (faster there). A user who set the variable in the environment keeps their
value. An ``async_op`` ``all_to_all_single`` (torchrec's KJT and pooled
embeddings) runs on mpicomm's communication thread: several in flight, then waited, give gloo's rows.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torchpair

import mpicomm
import mpicomm.torch
from mpicomm import _mpi
from mpicomm.c10d import waiting
from mpicomm.c10d.work import Running

pytestmark = pytest.mark.mpi


def _mpich() -> bool:
    mpicomm.init()
    return _mpi.MPI is not None and "MPICH" in _mpi.MPI.Get_library_version()


def _default_group_leaves(monkeypatch: pytest.MonkeyPatch, oversubscribed: bool) -> int | None:
    """MPICH's variable after ``init_process_group("mpicomm")`` on a node (not) oversubscribed, from 0."""
    for name in waiting._NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(waiting._State, "done", False)
    monkeypatch.setattr(waiting, "oversubscribed", lambda world_size, cores=None: oversubscribed)
    w = mpicomm.init()
    saved, before = w.timeout, waiting.heavy_yield()
    assert waiting.set_heavy_yield(0)
    dist.init_process_group("mpicomm")
    try:
        value = waiting.heavy_yield()
        t = torch.full((3,), float(dist.get_rank()))
        dist.all_reduce(t)  # calls still run, with either kind of wait
        size = dist.get_world_size()
        assert t.tolist() == [size * (size - 1) / 2] * 3
    finally:
        dist.destroy_process_group()
        w.timeout = saved
        waiting.set_heavy_yield(before or 0)
    return value


@pytest.mark.skipif(not _mpich(), reason="MPICH's variable")
def test_the_default_group_turns_on_sleeping_waits_where_the_node_is_oversubscribed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _default_group_leaves(monkeypatch, oversubscribed=True) == 1


@pytest.mark.skipif(not _mpich(), reason="MPICH's variable")
def test_the_default_group_leaves_mpichs_polling_where_each_rank_has_a_core(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _default_group_leaves(monkeypatch, oversubscribed=False) == 0


def test_oversubscribed_counts_the_launchers_ranks_on_the_node_else_the_world(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waiting, "launcher_variables", lambda: {"LOCAL_WORLD_SIZE": ("4", "MPI_LOCALNRANKS")})
    assert waiting.oversubscribed(1, cores=2) and not waiting.oversubscribed(64, cores=4)
    monkeypatch.setattr(waiting, "launcher_variables", dict)
    assert waiting.oversubscribed(3, cores=2) and not waiting.oversubscribed(2, cores=2)


def test_a_value_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting._State, "done", False)
    monkeypatch.setenv(waiting.CVAR, "0")
    before = waiting.heavy_yield()
    assert waiting.sleep_in_long_waits(8, cores=1) is False
    assert waiting.heavy_yield() == before


def _uneven_all_to_alls(pg: object, calls: int) -> list[torch.Tensor]:
    """``calls`` uneven all_to_all_single in flight (rank i sends i + j + k + 1 rows to j), then waited."""
    w, r = dist.get_world_size(), dist.get_rank()
    pending = []
    for k in range(calls):
        sends = [i + r + k + 1 for i in range(w)]
        recv = [r + j + k + 1 for j in range(w)]
        rows = torch.arange(sum(sends) * 2, dtype=torch.float32).reshape(-1, 2) + 1000 * r + 100 * k
        out = torch.empty(sum(recv), 2)
        work = dist.all_to_all_single(out, rows, recv, sends, group=pg, async_op=True)
        pending.append((work, out))
    for work, out in pending:
        work.wait()
        assert work.get_future().wait()[0] is out
    return [out for _, out in pending]


def test_async_all_to_alls_run_on_the_communication_thread_and_match_gloo() -> None:
    with contextlib.contextmanager(torchpair.mpicomm_and_gloo)() as both:
        w, r = dist.get_world_size(), dist.get_rank()
        probe = dist.all_to_all_single(torch.empty(w), torch.zeros(w), async_op=True)
        assert probe is not None
        probe.wait()
        assert isinstance(probe, Running)  # torch's Work for a queued call, not a completed one
        ours, theirs = _uneven_all_to_alls(both["mpicomm"], 3), _uneven_all_to_alls(both["gloo"], 3)
        torchpair.assert_same(ours, theirs)
        for k, out in enumerate(ours):  # the rows rank j sent here: its block for rank r
            want = []
            for j in range(w):
                sends_j = [i + j + k + 1 for i in range(w)]
                block = np.arange(sum(sends_j) * 2, dtype=np.float32).reshape(-1, 2) + 1000 * j + 100 * k
                want.append(block[sum(sends_j[:r]) : sum(sends_j[: r + 1])])
            np.testing.assert_array_equal(out.numpy(), np.concatenate(want))
