"""DDP under ``torch.compile`` (aot_eager, and the default backend, inductor) trains on mpicomm as on gloo.

DDP's C++ reducer calls the group's ``broadcast`` while it rebuilds its buckets, inside the compiled
forward; dynamo then tried to trace mpicomm's Python group and failed at step 2. mpicomm is listed in
dynamo's skip list when dynamo loads (``mpicomm.c10d.compiled``), so those frames run as they are.
inductor compiles the tiny model with the machine's C compiler: 8 s cold at 2 ranks, under a second
from its cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torchpair
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import mpicomm
import mpicomm.torch

pytestmark = pytest.mark.mpi


both = pytest.fixture(scope="module")(torchpair.mpicomm_and_gloo)


def _train(pg: Any, backend: str, steps: int = 4) -> list[torch.Tensor]:
    torch.manual_seed(0)
    model = DistributedDataParallel(
        nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), process_group=pg
    )
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        g = torch.Generator().manual_seed(10 * step + dist.get_rank())
        x, y = torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(compiled(x), y).backward()
        opt.step()
    torch._dynamo.reset()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_ddp_under_torch_compile_trains_as_on_gloo(both: dict[str, Any], backend: str) -> None:
    torchpair.assert_same(_train(both["mpicomm"], backend), _train(both["gloo"], backend))


def test_dynamo_skips_mpicomms_frames() -> None:
    import torch._dynamo.trace_rules as rules  # loaded after mpicomm.torch: the hook listed mpicomm

    package = Path(mpicomm.__file__).parent.as_posix()
    assert any(package in str(d) for d in rules.SKIP_DIRS), rules.SKIP_DIRS[-3:]
