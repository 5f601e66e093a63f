"""The registered backend on CUDA tensors (a GPU window): ``init_process_group("cpu:mpicomm,cuda:mpicomm")``.

CUDA tensors go through mpicomm's GPU paths (direct or staged), ordered after torch's current stream.
Each rank binds one GPU (its node-local rank modulo the device count); results are checked against
the same program on CPU tensors, which the CPU suite checks against numpy and gloo.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip(
        "this torch has no CUDA (the CPU wheel): the registered backend's GPU half needs one",
        allow_module_level=True,
    )

import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402

import mpicomm  # noqa: E402
import mpicomm.torch  # noqa: E402


@pytest.fixture(scope="module")
def dev() -> Iterator[Any]:
    w = mpicomm.init()
    saved = w.timeout
    device = torch.device("cuda", mpicomm.get_node_local_rank() % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("cpu:mpicomm,cuda:mpicomm")
    yield device
    dist.destroy_process_group()
    w.timeout = saved


def test_collectives_on_cuda_tensors_match_numpy(dev: Any) -> None:
    r, w = dist.get_rank(), dist.get_world_size()
    g = np.random.default_rng(3).integers(-4, 5, (w, 4 * w)).astype(np.float32)
    side = torch.cuda.Stream(dev)
    t = torch.zeros(4 * w, device=dev)
    with torch.cuda.stream(side):
        torch.cuda._sleep(10**7)  # the input is written late on torch's current stream
        t.copy_(torch.from_numpy(g[r]).to(dev, non_blocking=True))
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
    torch.cuda.synchronize()
    np.testing.assert_allclose(t.cpu().numpy(), g.sum(0) / w, rtol=1e-6)
    out = torch.empty(w * 4 * w, device=dev)
    dist.all_gather_into_tensor(out, torch.from_numpy(g[r]).to(dev))
    np.testing.assert_array_equal(out.cpu().numpy(), g.reshape(-1))
    rs = torch.empty(4, device=dev)
    dist.reduce_scatter_tensor(rs, torch.from_numpy(g[r]).to(dev))
    np.testing.assert_array_equal(rs.cpu().numpy(), g.sum(0)[4 * r : 4 * r + 4])
    b = torch.from_numpy(g[r]).to(dev)
    dist.broadcast(b, src=w - 1)
    np.testing.assert_array_equal(b.cpu().numpy(), g[w - 1])


def test_ddp_on_cuda_matches_ddp_on_cpu(dev: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel

    def run(device: Any) -> list[Any]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device)
        ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(dist.get_rank())
        for _ in range(3):
            opt.zero_grad()
            ddp(torch.randn(5, 8, generator=gen).to(device)).sum().backward()
            opt.step()
        return [p.detach().cpu() for p in model.parameters()]

    for a, b in zip(run(dev), run(torch.device("cpu")), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # cuBLAS and CPU kernels round apart
