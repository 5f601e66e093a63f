"""torch programs that run with only the backend changed: each runs on gloo and on mpicomm, same process.

torch's default group is ``dist.init_process_group("mpicomm")``; gloo runs the same program on a gloo
group of the same ranks (on the store of the MPI rendezvous). Results are compared bitwise at one and
two ranks, where a sum has one order (``a + b == b + a`` in floating point); from three ranks gloo's
ring and MPI's reduction add in different orders, so the comparison allows rounding (and the data of
the DeviceMesh programs are small integers, exact in any order, so those stay bitwise).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torchpair
from torch import nn

from mpicomm.c10d.registered import MpicommProcessGroup

pytestmark = pytest.mark.mpi


both = pytest.fixture(scope="module")(torchpair.mpicomm_and_gloo)


@pytest.fixture(scope="module")
def gloo(both: dict[str, Any]) -> Any:
    """The gloo group of the same ranks (torch's default group is on mpicomm)."""
    return both["gloo"]


def _both(gloo: Any, program: Callable[[Any], list[torch.Tensor]], half: bool = False) -> list[torch.Tensor]:
    got = program(dist.group.WORLD)
    torchpair.assert_same(got, program(gloo), half)
    return got


class _Net(nn.Module):
    """A small MLP with a branch that ``unused`` leaves out (for find_unused_parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)
        self.spare = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor, unused: bool = False) -> torch.Tensor:
        h = torch.relu(self.a(x))
        return self.b(h) if unused else self.b(h) + self.spare(h)


def _batches(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * seed + dist.get_rank())
    return [torch.randn(5, 8, generator=g) for _ in range(n)]


def _ddp(variant: str) -> Callable[[Any], list[torch.Tensor]]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    from torch.distributed.algorithms.join import Join
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    def program(pg: Any) -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = _Net()
        kw: dict[str, Any] = {"process_group": pg}
        if variant == "static_graph":
            kw["static_graph"] = True
        if variant == "find_unused":
            kw["find_unused_parameters"] = True
        ddp = DistributedDataParallel(model, **kw)
        if variant == "fp16":
            ddp.register_comm_hook(pg, default_hooks.fp16_compress_hook)
        if variant == "powersgd":
            state = powerSGD_hook.PowerSGDState(
                process_group=pg, matrix_approximation_rank=1, start_powerSGD_iter=2
            )
            ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        if variant == "zero":
            opt: Any = ZeroRedundancyOptimizer(ddp.parameters(), torch.optim.SGD, process_group=pg, lr=0.05)
        else:
            opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        steps = 2 + dist.get_rank() if variant == "join" else 4
        batches = _batches(steps)

        def step(x: torch.Tensor, i: int) -> None:
            opt.zero_grad()
            if variant == "no_sync" and i % 2 == 0:
                with ddp.no_sync():
                    ddp(x).sum().backward()
                ddp(x * 0.5).sum().backward()
            else:
                ddp(x, unused=variant == "find_unused" and i % 2 == 1).sum().backward()
            opt.step()

        if variant == "join":
            with Join([ddp]):
                for i, x in enumerate(batches):
                    step(x, i)
        else:
            for i, x in enumerate(batches):
                step(x, i)
        return [p.detach().clone() for p in model.parameters()]

    return program


@pytest.mark.parametrize(
    "variant", ["plain", "no_sync", "fp16", "powersgd", "static_graph", "find_unused", "join", "zero"]
)
def test_ddp_training(gloo: Any, variant: str) -> None:
    params = _both(gloo, _ddp(variant), half=variant == "fp16")
    # data parallel: every rank holds the same parameters after the steps
    for p in params:
        copies = [torch.empty_like(p) for _ in range(dist.get_world_size())]
        dist.all_gather(copies, p)
        assert all(torch.equal(c, p) for c in copies)


def test_fsdp2_fully_shard(gloo: Any) -> None:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard

    def program(pg: Any) -> list[torch.Tensor]:
        mesh = (
            init_device_mesh("cpu", (dist.get_world_size(),))
            if pg is dist.group.WORLD
            else DeviceMesh.from_group(pg, "cpu")
        )
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        for layer in model:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for x in _batches(3, seed=1):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        return [p.full_tensor().detach().clone() for p in model.parameters()]

    _both(gloo, program)


def _meshes(pg: Any, shape: tuple[int, ...]) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    if pg is dist.group.WORLD:
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp")[: len(shape)])
        assert all(isinstance(mesh.get_group(d), MpicommProcessGroup) for d in range(len(shape)))
        return mesh
    override = dict.fromkeys(range(len(shape)), "gloo")
    return init_device_mesh(
        "cpu", shape, mesh_dim_names=("dp", "tp")[: len(shape)], backend_override=override
    )


def _dtensor_program(shape: tuple[int, ...]) -> Callable[[Any], list[torch.Tensor]]:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def program(pg: Any) -> list[torch.Tensor]:
        mesh = _meshes(pg, shape)
        w = dist.get_world_size()
        torch.manual_seed(7)  # the same full tensor on every rank: small integers, exact in any order
        full = torch.randint(-5, 6, (4 * w, 6)).float()
        shards = [Shard(0)] + [Replicate()] * (len(shape) - 1)
        d = distribute_tensor(full, mesh, shards)
        out = [d.full_tensor()]
        moved = d.redistribute(mesh, [Shard(1)] + [Shard(0)] * (len(shape) - 1))
        out.append(moved.full_tensor())
        summed = (d * 2).sum(dim=0)  # a reduction over the sharded dim: a partial, then all_reduce
        out.append(summed.full_tensor())
        if len(shape) == 2:
            out.append(moved.redistribute(mesh, [Replicate(), Replicate()]).to_local())
            sub = mesh["tp"]
            t = torch.full((3,), float(dist.get_rank()))
            dist.all_reduce(t, group=sub.get_group())
            out.append(t)
        assert torch.equal(out[0], full) and torch.equal(out[1], full)
        assert torch.equal(out[2], full.sum(0) * 2)
        return out

    return program


def test_device_mesh_1d_dtensor(gloo: Any) -> None:
    _both(gloo, _dtensor_program((dist.get_world_size(),)))


def test_device_mesh_2d_dtensor(gloo: Any) -> None:
    w = dist.get_world_size()
    if w % 2:
        pytest.skip(f"a 2-D mesh of two columns needs an even number of ranks; {w} here")
    _both(gloo, _dtensor_program((w // 2, 2)))


def test_functional_collectives_eager_and_compiled(gloo: Any) -> None:
    import torch.distributed._functional_collectives as funcol

    def body(x: torch.Tensor, pg: Any) -> list[torch.Tensor]:
        a = funcol.all_reduce(x, "sum", pg)
        b = funcol.all_gather_tensor(x, 0, pg)
        c = funcol.reduce_scatter_tensor(b, "sum", 0, pg)
        d = funcol.all_to_all_single(b, None, None, pg)
        return [funcol.wait_tensor(t) for t in (a, b, c, d)]

    def program(pg: Any) -> list[torch.Tensor]:
        x = torch.arange(6, dtype=torch.float32) + 10 * dist.get_rank()
        eager = body(x, pg)
        torch._dynamo.reset()
        compiled = torch.compile(lambda x: body(x, pg), backend="aot_eager", fullgraph=True)(x)
        for e, c in zip(eager, compiled, strict=True):
            assert torch.equal(e, c)
        return eager

    w = dist.get_world_size()
    a, b, c, _ = _both(gloo, program)
    ranks = torch.arange(w, dtype=torch.float32)
    assert torch.equal(a, torch.arange(6, dtype=torch.float32) * w + 10 * ranks.sum())
    assert torch.equal(b, torch.cat([torch.arange(6, dtype=torch.float32) + 10 * i for i in range(w)]))
    assert torch.equal(c, w * (torch.arange(6, dtype=torch.float32) + 10 * dist.get_rank()))


def test_ddp_construction_broadcasts_rank_0s_parameters(gloo: Any) -> None:
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(dist.get_rank())  # different on every rank until DDP broadcasts rank 0's
    model = _Net()
    DistributedDataParallel(model)
    torch.manual_seed(0)
    for p, q in zip(model.parameters(), _Net().parameters(), strict=True):
        assert torch.equal(p, q)
