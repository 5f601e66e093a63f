"""The training steps of the bench's "torch_backend" report: DDP and FSDP2 on mpicomm against gloo.

Per model (:data:`MODELS`) it times whole steps (forward, backward, SGD) interleaved with the
report's sampling (:func:`samples`):

* ``mpicomm`` and ``gloo``: ``DistributedDataParallel`` on the registered backend and on gloo;
* ``compute``: the same DDP model with a comm hook that hands each bucket back untouched (DDP's
  bucketing and copies, no communication): the step's floor;
* ``comm`` and ``comm gloo``: the model's bucket all_reduces (the sizes DDP made, recorded by that
  hook) made blocking, one after the other, with nothing to overlap;
* ``mpicomm p2p`` and ``comm p2p``: ``mpicomm`` and ``comm`` with MPICH's intra-node allreduce switched
  (through MPI's tool interface, for these samples only) from its shared-memory "release_gather"
  algorithm to its point-to-point one ("mpir"). Below ``MPI_THREAD_MULTIPLE`` (mpicomm's default
  level is serialized) MPICH picks release_gather, whose ranks spin on shared flags without yielding:
  on a 2-core machine shared with other jobs a 16 MiB all_reduce took 8-13x what it took at
  ``MPI_THREAD_MULTIPLE``, where MPICH does not offer it (docs/benchmarks.rst, 28 Nov 2026 evening).

The share of the all_reduce time hidden behind backward is ``1 - (step - compute) / comm`` (1: the
step costs what its computation does; 0: the whole communication is added to it), for mpicomm and
gloo each. The FSDP2 row times a step of the same MLP under ``fully_shard`` (each Linear, then the
whole) on a 1-D DeviceMesh of each backend, with FSDP2's defaults and (``prefetch``) with explicit
forward and backward prefetching and async unshards. Before timing, one step of each is checked: every
gradient (and FSDP2's parameters) equal to gloo's.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from .harness import Env, everywhere

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["DDP_CASES", "MODELS", "ddp_rows", "fsdp_rows", "hidden"]

#: The DDP models: name -> (layer widths of the MLP, batch size).
MODELS: dict[str, tuple[tuple[int, ...], int]] = {
    "mlp 265k": ((512, 256, 512, 4), 32),  # 264,964 parameters: one ~1 MiB gradient bucket
    "mlp 25M": ((1024, 4096, 4096, 1024, 10), 8),  # 25,196,554 parameters: three buckets, 16-64 MiB
}
#: The DDP contenders, in the table's order (the ``p2p`` ones where MPICH's algorithm can be switched).
DDP_CASES = ("mpicomm", "gloo", "compute", "comm", "comm gloo", "mpicomm p2p", "comm p2p")
#: MPICH's intra-node allreduce selection, and its value for the point-to-point algorithm ("mpir").
ALGO, P2P = "MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM", 0

Samples = dict[str, list[float]]
Sampler = Callable[["MPI.Intracomm", dict[str, Callable[[], object]], argparse.Namespace], Samples]
Stats = Callable[[dict[str, list[float]]], dict[str, dict[str, float]]]


def _model(widths: tuple[int, ...]) -> Any:
    """The MLP of ``widths`` (ReLU between layers), the same initial weights on every rank."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(widths)):
        layers += [nn.Linear(a, b)] + ([nn.ReLU()] if i < len(widths) - 2 else [])
    return nn.Sequential(*layers)


def _stepper(net: Any, x: Any) -> Callable[[], None]:
    """One training step of ``net`` on ``x``: forward, backward (DDP's all_reduce), SGD update."""
    import torch

    opt = torch.optim.SGD(net.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        net(x).square().mean().backward()
        opt.step()

    return step


class _Buckets:
    """The comm hook of the ``compute`` case: each bucket back as it is, its size recorded once."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.recording = True

    def hook(self, state: object, bucket: Any) -> Any:
        import torch

        buf = bucket.buffer()
        if self.recording:
            self.sizes.append(buf.numel())
        fut: torch.futures.Future[Any] = torch.futures.Future()
        fut.set_result(buf)
        return fut


def _switched(fn: Callable[[], object], default: int) -> Callable[[], None]:
    """``fn`` with MPICH's intra-node allreduce set to its point-to-point algorithm while it runs.

    Nothing is pending between steps (DDP waits for its buckets before backward returns), so no
    call of another case runs under the switch.
    """
    from ...c10d import waiting

    def run() -> None:
        waiting.write_cvar(ALGO, P2P)
        try:
            fn()
        finally:
            waiting.write_cvar(ALGO, default)

    return run


def _input(e: Env, widths: tuple[int, ...], batch: int) -> Any:
    import torch

    return torch.from_numpy(np.random.default_rng(e.rank).standard_normal((batch, widths[0]), np.float32))


def _equal(a: list[Any], b: list[Any]) -> bool:
    """Equal at 2 ranks (a sum of two is exact in any order); MPI and gloo may order 3+ apart."""
    import torch

    return len(a) == len(b) and all(
        x is not None and y is not None and torch.allclose(x, y, rtol=1e-5, atol=1e-7)
        for x, y in zip(a, b, strict=True)
    )


def ddp_rows(
    ctl: MPI.Intracomm, e: Env, gloo: Any, args: argparse.Namespace, samples: Sampler, stats: Stats
) -> list[dict[str, Any]]:
    """Per model: DDP step times on mpicomm, gloo and without communication, and the buckets' all_reduces."""
    import torch
    import torch._C._distributed_c10d as c10d
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from ...c10d import waiting

    default = waiting.read_cvar(ALGO)
    p2p = default is not None and default != P2P
    rows = []
    for name, (widths, batch) in MODELS.items():
        buckets = _Buckets()
        nets = {
            "mpicomm": DistributedDataParallel(_model(widths)),
            "gloo": DistributedDataParallel(_model(widths), process_group=gloo),
            "compute": DistributedDataParallel(_model(widths)),
        }
        if p2p:
            nets["mpicomm p2p"] = DistributedDataParallel(_model(widths))
        # torch checks the hook's annotations as objects (this module's are strings)
        _Buckets.hook.__annotations__.update(
            {"bucket": c10d.GradBucket, "return": torch.futures.Future[torch.Tensor]}
        )
        nets["compute"].register_comm_hook(None, buckets.hook)
        x = _input(e, widths, batch)
        steps: dict[str, Callable[[], object]] = {k: _stepper(net, x) for k, net in nets.items()}
        if p2p:
            steps["mpicomm p2p"] = _switched(steps["mpicomm p2p"], default or 0)
        for step in steps.values():
            step()  # DDP buckets by parameter order at first, then by the order gradients came
        buckets.sizes.clear()
        steps["compute"]()
        buckets.recording = False
        grads = {k: [p.grad for p in net.parameters()] for k, net in nets.items()}
        ok = all(_equal(g, grads["gloo"]) for k, g in grads.items() if k.startswith("mpicomm"))
        flats = [torch.zeros(n) for n in buckets.sizes]

        def comm(group: Any = None, flats: list[Any] = flats) -> None:
            for t in flats:
                dist.all_reduce(t, group=group)

        steps["comm"] = comm
        steps["comm gloo"] = partial(comm, gloo)
        if p2p:
            steps["comm p2p"] = _switched(comm, default or 0)
        params = sum(p.numel() for p in nets["gloo"].parameters())
        times = stats(samples(ctl, steps, args))
        rows.append(
            {
                "model": name,
                "params": params,
                "buckets": [n * 4 for n in buckets.sizes],
                "check": everywhere(ctl, ok),
                "algorithm": default,
                **times,
            }
        )
    return rows


def hidden(row: dict[str, Any], stat: str = "median") -> dict[str, float]:
    """The share of each backend's all_reduce time hidden behind backward (1 - exposed / comm)."""
    floor = row["compute"][stat]
    return {
        k: 1.0 - (row[k][stat] - floor) / row[c][stat] if row[c][stat] > 0 else 0.0
        for k, c in (("mpicomm", "comm"), ("gloo", "comm gloo"), ("mpicomm p2p", "comm p2p"))
        if k in row
    }


def fsdp_rows(
    ctl: MPI.Intracomm, e: Env, gloo: Any, args: argparse.Namespace, samples: Sampler, stats: Stats
) -> list[dict[str, Any]]:
    """The FSDP2 step of the largest model on mpicomm and on gloo (parameters checked after one step)."""
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard

    name, (widths, batch) = list(MODELS.items())[-1]
    meshes = {
        "mpicomm": init_device_mesh("cpu", (dist.get_world_size(),)),
        "gloo": DeviceMesh.from_group(gloo, "cpu"),
    }
    nets = {}
    for k, mesh in [*meshes.items(), *[(f"{k} prefetch", m) for k, m in meshes.items()]]:
        model = _model(widths)
        layers = [fully_shard(layer, mesh=mesh) for layer in model if isinstance(layer, nn.Linear)]
        nets[k] = fully_shard(model, mesh=mesh)
        if k.endswith("prefetch"):  # explicit prefetching, the unshards async (queued on the engine)
            for before, after in itertools.pairwise(layers):
                before.set_modules_to_forward_prefetch([after])
                after.set_modules_to_backward_prefetch([before])
            nets[k]._set_unshard_async_op(True)
    x = _input(e, widths, batch)
    steps: dict[str, Callable[[], object]] = {k: _stepper(net, x) for k, net in nets.items()}
    for step in steps.values():
        step()
    shards = {k: [p.to_local() for p in net.parameters()] for k, net in nets.items()}
    ok = all(_equal(v, shards["gloo"]) for v in shards.values())
    times = stats(samples(ctl, steps, args))
    return [{"model": name, "check": everywhere(ctl, ok), **times}]


def step_lines(res: dict[str, Any], goal: float) -> tuple[list[str], list[tuple[str, bool]]]:
    """The DDP and FSDP2 lines of the report and their verdicts (mpicomm at most ``goal`` x gloo)."""
    out = [
        "  DDP step, ms, median (min): on mpicomm, on gloo, without communication (compute), the "
        "buckets' all_reduces alone (comm); hidden = share of comm hidden behind backward; p2p = MPICH's "
        "point-to-point intra-node allreduce instead of its default selection"
    ]
    verdicts = []
    for row in res["ddp"]:
        ms = {k: (row[k]["median"] * 1e3, row[k]["min"] * 1e3) for k in DDP_CASES if k in row}
        text = "  ".join(f"{k} {m:.1f} ({lo:.1f})" for k, (m, lo) in ms.items())
        ratio = ms["mpicomm"][0] / ms["gloo"][0]
        share = hidden(row)
        check = "" if row["check"] else "  CHECK FAILED"
        sizes = ", ".join(f"{b / 2**20:.1f}" for b in row.get("buckets", []))
        shares = ", ".join(f"{k} {v:.2f}" for k, v in share.items())
        p2p = f", mpicomm p2p/gloo {ms['mpicomm p2p'][0] / ms['gloo'][0]:.2f}x" if "mpicomm p2p" in ms else ""
        out.append(
            f"  {row['model']} ({row['params']:,}; buckets MiB: {sizes}): {text}; mpicomm/gloo {ratio:.2f}x"
            f"{p2p}; hidden {shares}{check}"
        )
        verdicts.append((f"DDP {row['model']}: <= {goal:g}x gloo ({ratio:.2f}x)", ratio <= goal))
    for row in res.get("fsdp", []):
        ratio = row["mpicomm"]["median"] / row["gloo"]["median"]
        check = "" if row["check"] else "  CHECK FAILED"
        out.append(
            f"  FSDP2 step, {row['model']}: mpicomm {row['mpicomm']['median'] * 1e3:.1f} "
            f"({row['mpicomm']['min'] * 1e3:.1f}) ms, gloo {row['gloo']['median'] * 1e3:.1f} "
            f"({row['gloo']['min'] * 1e3:.1f}) ms; mpicomm/gloo {ratio:.2f}x{check}"
        )
        if "mpicomm prefetch" in row:
            pre = {k: row[f"{k} prefetch"]["median"] * 1e3 for k in ("mpicomm", "gloo")}
            out.append(
                f"  FSDP2 step with explicit prefetching (async unshards): mpicomm {pre['mpicomm']:.1f} ms, "
                f"gloo {pre['gloo']:.1f} ms; mpicomm/gloo {pre['mpicomm'] / pre['gloo']:.2f}x"
            )
    return out, verdicts
