"""FSDP2's explicit prefetching on torch's backend "mpicomm": same results as gloo, all_gathers in flight.

``set_modules_to_forward_prefetch`` makes a module's pre-forward start the next module's unshard (its
``all_gather_into_tensor``) before its own forward runs; with ``unshard_async_op`` set that all_gather
is posted with ``async_op=True`` and waited at the next module's pre-forward. The backend queues such
an all_gather on mpicomm's communication thread (``MpicommProcessGroup.all_gather_single``), so it
moves while the current module computes. Results are compared with the same program on gloo: bitwise
at one and two ranks, to float32 rounding from three (tests/torchpair.py).
"""

from __future__ import annotations

import datetime
import itertools
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torchpair
from torch import nn

from mpicomm.c10d.registered import MpicommProcessGroup
from mpicomm.c10d.work import Done, Running

pytestmark = pytest.mark.mpi

both = pytest.fixture(scope="module")(torchpair.mpicomm_and_gloo)
_keys = itertools.count()


def _mesh(pg: Any) -> Any:
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if pg is dist.group.WORLD:
        return init_device_mesh("cpu", (dist.get_world_size(),))
    return DeviceMesh.from_group(pg, "cpu")


def _sharded(pg: Any, prefetch: bool, async_unshard: bool) -> tuple[nn.Module, list[Any]]:
    """A four-layer MLP under ``fully_shard`` (each Linear, then the whole), the same weights everywhere.

    With ``prefetch`` each layer's forward prefetches the next layer and its backward the one before.
    """
    from torch.distributed.fsdp import fully_shard

    mesh = _mesh(pg)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(8, 16),
        nn.ReLU(),
        nn.Linear(16, 24),
        nn.ReLU(),
        nn.Linear(24, 16),
        nn.ReLU(),
        nn.Linear(16, 4),
    )
    layers: list[Any] = [fully_shard(m, mesh=mesh) for m in model if isinstance(m, nn.Linear)]
    fully_shard(model, mesh=mesh)
    if prefetch:
        for before, after in itertools.pairwise(layers):
            before.set_modules_to_forward_prefetch([after])
            after.set_modules_to_backward_prefetch([before])
    model._set_unshard_async_op(async_unshard)  # type: ignore[operator]  # FSDPModule's
    return model, layers


def _batches(n: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(2000 + dist.get_rank())
    return [torch.randn(6, 8, generator=g) for _ in range(n)]


def _train(model: nn.Module, steps: int) -> list[torch.Tensor]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for x in _batches(steps):
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
    return [p.full_tensor().detach().clone() for p in model.parameters()]  # type: ignore[attr-defined]


class _Spy:
    """Records each all_gather_into_tensor the backend gets: whether async, and the Work it answered."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[bool, Any]] = []
        real = MpicommProcessGroup.all_gather_single

        def spy(pg: MpicommProcessGroup, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
            work = real(pg, output, input, opts)
            self.calls.append((opts is not None and bool(opts.asyncOp), work))
            return work

        monkeypatch.setattr(MpicommProcessGroup, "all_gather_single", spy)  # torch calls it by this name


@pytest.mark.parametrize("async_unshard", [True, False], ids=["async_unshard", "blocking_unshard"])
def test_fsdp2_explicit_prefetch_matches_gloo(
    both: dict[str, Any], monkeypatch: pytest.MonkeyPatch, async_unshard: bool
) -> None:
    spy = _Spy(monkeypatch)
    ours = _train(_sharded(both["mpicomm"], True, async_unshard)[0], 3)
    theirs = _train(_sharded(both["gloo"], True, async_unshard)[0], 3)
    torchpair.assert_same(ours, theirs)
    # and both equal the program without prefetching (prefetching moves calls, not results)
    torchpair.assert_same(ours, _train(_sharded(both["gloo"], False, False)[0], 3))
    if dist.get_world_size() > 1:  # one rank's FSDP2 gathers nothing
        posted = [isinstance(work, Running) for is_async, work in spy.calls if is_async]
        if async_unshard:  # every unshard posted async, queued on the communication thread
            assert posted and all(posted), spy.calls
        else:  # the blocking unshards answer completed Works
            assert not posted and all(isinstance(w, Done) for _, w in spy.calls), spy.calls


@pytest.mark.usefixtures("validation_off")  # validation mode: no overlap
def test_fsdp2_prefetched_all_gather_is_in_flight_during_the_previous_forward(
    both: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 prefetches; the others unshard each layer at its own forward, after rank 0 says so.

    Rank 0's forward of layer 0 runs after its pre-forward posted layer 1's all_gather. The other
    ranks post theirs only at layer 1's pre-forward, and their layer 0 forward first waits on the
    store for rank 0's word, given after rank 0 looked at its Work: that all_gather cannot have
    completed when rank 0 looked, and rank 0's forward ran while it was pending (no timing involved).
    """
    spy = _Spy(monkeypatch)
    r, n = dist.get_rank(), dist.get_world_size()
    store = dist.distributed_c10d._get_default_store()
    key = f"fsdp-prefetch-{next(_keys)}"
    model, layers = _sharded(dist.group.WORLD, prefetch=r == 0, async_unshard=r == 0)
    seen: dict[str, Any] = {}

    def look(module: nn.Module, args: Any) -> None:
        if r == 0:
            try:
                if n > 1:  # one rank's FSDP2 gathers nothing
                    is_async, work = spy.calls[-1]
                    seen.update(is_async=is_async, work=work, pending=not work.is_completed())
            finally:
                store.set(key, "looked")  # in a finally: a failed look must not hang the others
        else:
            store.wait([key], datetime.timedelta(seconds=30))

    hooks = [layers[0].register_forward_pre_hook(look)]
    try:
        ours = _train(model, 1)
    finally:
        for h in hooks:
            h.remove()
    theirs = _train(_sharded(both["gloo"], False, False)[0], 1)
    torchpair.assert_same(ours, theirs)
    if r == 0 and n > 1:
        # layer 1's all_gather: posted async, on the communication thread, still running in layer 0's forward
        assert seen["is_async"] and isinstance(seen["work"], Running), seen
        assert seen["pending"], seen
        assert seen["work"].wait(), seen  # and it completed afterwards
