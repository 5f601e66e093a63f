"""The registered backend's CUDA half on the CPU stand-ins: device arrays take mpicomm's GPU paths.

The torch ProcessGroup of ``backend="mpicomm"`` hands each tensor to mpicomm's front door unchanged, so
a device tensor takes the direct (CUDA-aware MPI) or staged (pinned host) path. No CUDA torch exists
here: the fake cupy's arrays (tests/fakecupy) stand in for device tensors, with their input still
queued on the caller's stream when the call starts. CPU emulation of the plumbing, not GPU verification
(that is tests/gpu/test_torch_backend_gpu.py on a GPU).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch._C._distributed_c10d as C
import torch.distributed as dist
from fakecupy import testing
from fakecupy.testing import inputs, world

import mpicomm
from mpicomm.c10d.registration import process_group
from mpicomm.front import device as front
from mpicomm.gpu import cuda_aware

pytestmark = pytest.mark.mpi


@pytest.fixture(params=["1", "0"], ids=["direct", "staged"])
def cp(fake: Any, monkeypatch: pytest.MonkeyPatch, request: Any) -> Iterator[Any]:
    testing.use_staged(monkeypatch, aware=request.param)
    yield fake
    fake._fake.drain()
    cuda_aware.reset_cuda_awareness()


def _paths(fn: str) -> int:
    return sum(n for (name, path), n in front.PATHS.items() if name == fn and path != "host")


def test_collectives_of_the_registered_group_take_the_gpu_paths(cp: Any) -> None:
    r, n = world()
    pg = process_group(mpicomm.init())
    x = inputs(n, 4 * n)
    d = cp.zeros(4 * n)
    cp._fake.later(d, x[r])  # still queued on the caller's stream: the path must wait for it
    opts = C.AllreduceOptions()
    opts.reduceOp = dist._make_nccl_premul_sum(0.5)
    assert pg.allreduce([d], opts).wait()
    np.testing.assert_array_equal(d.get(), 0.5 * x.sum(0))
    b = cp.asarray(x[r])
    bopts = C.BroadcastOptions()
    bopts.rootRank = n - 1
    pg.broadcast([b], bopts).wait()
    np.testing.assert_array_equal(b.get(), x[n - 1])
    out = cp.zeros(n * 4 * n)
    pg.all_gather_single(out, cp.asarray(x[r]), C.AllgatherOptions()).wait()
    np.testing.assert_array_equal(out.get(), x.reshape(-1))
    rs = cp.zeros(4)
    ropts = C.ReduceScatterOptions()
    ropts.reduceOp = dist.ReduceOp.AVG
    pg.reduce_scatter_single(rs, cp.asarray(x[r]), ropts).wait()
    np.testing.assert_array_equal(rs.get(), x.sum(0)[4 * r : 4 * r + 4] / n)
    a2a = cp.zeros(4 * n)
    pg.all_to_all_single(a2a, cp.asarray(x[r]), [], [], C.AllToAllOptions()).wait()
    np.testing.assert_array_equal(a2a.get(), x[:, 4 * r : 4 * r + 4].reshape(-1))
    for fn in (
        "all_reduce",
        "broadcast",
        "all_gather_into_tensor",
        "reduce_scatter_tensor",
        "all_to_all_single",
    ):
        assert _paths(fn) >= 1, (fn, dict(front.PATHS))
        assert front.PATHS[fn, "host"] == 0, fn


def test_point_to_point_of_the_registered_group_on_device_arrays(cp: Any) -> None:
    r, n = world()
    if n == 1:
        pytest.skip("point-to-point needs two ranks")
    pg = process_group(mpicomm.init())
    x = inputs(n, 6)
    got = cp.zeros(6)
    sent = pg.send([cp.asarray(x[r])], (r + 1) % n, 4)
    assert pg.recv([got], (r - 1) % n, 4).wait(datetime.timedelta(seconds=60))
    assert sent.wait()
    np.testing.assert_array_equal(got.get(), x[(r - 1) % n])
