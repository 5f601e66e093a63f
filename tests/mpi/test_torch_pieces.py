"""The backend's large all_reduce in pieces (mpicomm.core.pieces): the result of one call, on every rank.

The piece size is set to 64 bytes here, so that small tensors go in several pieces (the real size is
24 MiB). Every rank builds the global input from a shared seed and checks its result against numpy;
at 1-2 ranks the sums are also compared bitwise with gloo's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import mpicomm
import mpicomm.torch
from mpicomm.core import pieces

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def gloo() -> Iterator[Any]:
    """torch's default group on mpicomm and a gloo group of the same ranks; pieces of 64 bytes."""
    w = mpicomm.init()
    saved = w.timeout
    dist.init_process_group("mpicomm")
    pieces.reload({pieces.PIECE_ENV_VAR: "64"})
    yield dist.new_group(backend="gloo")
    pieces.reload()
    dist.destroy_process_group()
    w.timeout = saved


def _g(seed: int, w: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((w, n)).astype(np.float32)


@pytest.mark.parametrize(
    ("op", "ref"),
    [
        (dist.ReduceOp.SUM, lambda g: g.sum(0)),
        (dist.ReduceOp.AVG, lambda g: g.sum(0) / len(g)),
        (dist.ReduceOp.MAX, lambda g: g.max(0)),
        (dist._make_nccl_premul_sum(0.5), lambda g: (0.5 * g).sum(0)),  # type: ignore[attr-defined]
    ],
    ids=["sum", "avg", "max", "premul_sum"],
)
def test_pieces_give_the_whole_result_whatever_async_op_ranks_pass(gloo: Any, op: Any, ref: Any) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    g = _g(5, w, 50)  # 200 bytes: four pieces, of 13, 13, 13 and 11 elements
    t = torch.tensor(g[r])
    made = pieces.made()
    work = dist.all_reduce(t, op=op, async_op=r % 2 == 1)  # ranks differ in async_op
    if work is not None:
        assert work.wait() and work.is_completed() and work.exception() is None
        assert work.get_future().wait()[0] is t
    if pieces._State.module is not None:  # the C calls count their pieces
        assert pieces.made() - made == 4  # equal pieces: no fifth call for a short tail
    np.testing.assert_allclose(t.numpy(), ref(g), rtol=1e-5, atol=1e-6)


def test_pieces_match_gloo_bitwise(gloo: Any) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    x = torch.tensor(_g(6, w, 77)[r])
    a, b = x.clone(), x.clone()
    work = dist.all_reduce(a, async_op=True)
    doubled = work.get_future().then(lambda f: f.value()[0] * 2)  # completed on the communication thread
    dist.all_reduce(b, group=gloo)
    work.wait()
    if w <= 2:  # two addends: one order; from three ranks gloo's ring sums in another order
        assert torch.equal(a, b)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(doubled.wait(), a * 2)


def test_a_strided_tensor_is_reduced_in_a_copy_and_written_back(gloo: Any) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    g = _g(7, w, 60)
    for async_op in (False, True):
        base = torch.zeros(60, 2)
        base[:, 1] = torch.tensor(g[r])
        column = base[:, 1]  # stride 2: not contiguous
        work = dist.all_reduce(column, async_op=async_op)
        if work is not None:
            work.wait()
        np.testing.assert_allclose(base[:, 1].numpy(), g.sum(0), rtol=1e-5, atol=1e-6)
        assert not base[:, 0].any()  # the other column untouched


def test_ddp_buckets_in_pieces_give_gloo_s_gradients(gloo: Any) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    x = torch.tensor(_g(8, w, 4 * 12)[r]).reshape(4, 12)
    grads = []
    for pg in (dist.group.WORLD, gloo):
        torch.manual_seed(0)
        net = nn.parallel.DistributedDataParallel(
            nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 3)), process_group=pg
        )
        for _ in range(2):  # the second step runs on the buckets DDP rebuilt after the first
            net.zero_grad()
            net(x).square().mean().backward()
        grads.append([torch.clone(p.grad) for p in net.parameters() if p.grad is not None])
    for a, b in zip(*grads, strict=True):
        if w <= 2:
            assert torch.equal(a, b)
        torch.testing.assert_close(a, b)


def test_ddp_buckets_on_huge_pages_keep_gloo_s_gradients(gloo: Any) -> None:
    # buckets of 4 MiB and more are the same tensors at every step: from the second, the backend
    # backs them with huge pages (mpicomm.c10d.huge); the gradients stay gloo's
    from mpicomm.c10d import huge
    from mpicomm.core import pages

    r, w = dist.get_rank(), dist.get_world_size()
    x = torch.tensor(_g(9, w, 4 * 256)[r]).reshape(4, 256)
    grads, before = [], huge.collapsed()
    pieces.reload()  # whole 4 MiB buckets (this file's 64-byte pieces would make 65,536 calls of each)
    for pg in (dist.group.WORLD, gloo):
        torch.manual_seed(0)
        net = nn.parallel.DistributedDataParallel(  # 256 x 4096 + 4096 x 256: two 4 MiB weights
            nn.Sequential(nn.Linear(256, 4096), nn.ReLU(), nn.Linear(4096, 256)), process_group=pg
        )
        for _ in range(4):  # buckets rebuilt after the first step, reused from then on
            net.zero_grad()
            net(x).square().mean().backward()
        grads.append([torch.clone(p.grad) for p in net.parameters() if p.grad is not None])
    pieces.reload({pieces.PIECE_ENV_VAR: "64"})
    if pages._State.on and pages._COLLAPSE not in pages._State.refused:  # the kernel takes it
        assert huge.collapsed() > before
    for a, b in zip(*grads, strict=True):
        if w <= 2:
            assert torch.equal(a, b)
        torch.testing.assert_close(a, b)
