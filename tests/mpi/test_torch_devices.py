"""The device torch reads from a group (``pg._device_types``), on mpicomm as on gloo, for CPU tensors.

A group written in Python gets no device from torch (``[]``), and torch's callers that read it failed:
DCP's ``async_save`` refused the group, ``set_model_state_dict(..., broadcast_from_rank0=True)`` raised
IndexError, ``_get_pg_default_device`` raised. Each runs here on an mpicomm group and on a gloo group of
the same ranks, with equal results.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torchpair
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    set_model_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

pytestmark = pytest.mark.mpi


both = pytest.fixture(scope="module")(torchpair.mpicomm_and_gloo)


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _full(model: nn.Module) -> dict[str, torch.Tensor]:
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}


def _shared_dir(tmp_path: Path, name: str) -> str:
    """One directory for all ranks: rank 0's ``tmp_path`` (one machine in the tests)."""
    path = [str(tmp_path / name)]
    dist.broadcast_object_list(path, src=0)
    return path[0]


@pytest.mark.parametrize("backend", ["mpicomm", "gloo"])
def test_the_group_reports_the_cpu_device(both: dict[str, Any], backend: str) -> None:
    pg = both[backend]
    assert torch.device("cpu") in pg._device_types
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        assert dist.distributed_c10d._get_pg_default_device(pg) == torch.device("cpu")
    assert dist.distributed_c10d._get_object_coll_device(pg) == "cpu"
    if backend == "mpicomm" and not torch.cuda.is_available():
        assert pg._device_types == [torch.device("cpu")]  # never cuda on a CPU-only torch


def _async_save_then_resume(pg: Any, where: str) -> dict[str, torch.Tensor]:
    mesh = DeviceMesh.from_group(pg, "cpu")
    model = _model(0)
    fully_shard(model, mesh=mesh)
    dcp.async_save({"model": get_model_state_dict(model)}, checkpoint_id=where, process_group=pg).result()
    resumed = _model(1)
    fully_shard(resumed, mesh=mesh)
    state = {"model": get_model_state_dict(resumed)}
    dcp.load(state, checkpoint_id=where, process_group=pg)
    resumed.load_state_dict(state["model"])
    return _full(resumed)


def test_dcp_async_save_and_resume_as_on_gloo(both: dict[str, Any], tmp_path: Path) -> None:
    ours = _async_save_then_resume(both["mpicomm"], _shared_dir(tmp_path, "ours"))
    theirs = _async_save_then_resume(both["gloo"], _shared_dir(tmp_path, "theirs"))
    reference = {k: v for k, v in _model(0).state_dict().items()}
    for name, want in reference.items():
        assert torch.equal(ours[name], want) and torch.equal(theirs[name], want), name


def _resume_from_rank0(pg: Any) -> dict[str, torch.Tensor]:
    mesh = DeviceMesh.from_group(pg, "cpu")
    full = _model(0).state_dict() if dist.get_rank() == 0 else {}
    model = _model(1)
    fully_shard(model, mesh=mesh)
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=opts)
    return _full(model)


def test_full_state_dict_resume_with_broadcast_from_rank0_as_on_gloo(both: dict[str, Any]) -> None:
    ours, theirs = _resume_from_rank0(both["mpicomm"]), _resume_from_rank0(both["gloo"])
    for name, want in _model(0).state_dict().items():
        assert torch.equal(ours[name], want) and torch.equal(theirs[name], want), name


@pytest.mark.parametrize("backend", ["mpicomm", "gloo"])
def test_sharded_tensor_gathers_cpu_shards(both: dict[str, Any], backend: str) -> None:
    """torchrec's path: ShardedTensor gathers where the backend's device map says (cuda on CPU torch)."""
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    rank, size = dist.get_rank(), dist.get_world_size()
    spec = ChunkShardingSpec(dim=0, placements=[f"rank:{r}/cpu" for r in range(size)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        st = sharded_tensor.empty(spec, 2 * size, 3, process_group=both[backend])
        st.local_shards()[0].tensor.fill_(float(rank))
        out = torch.empty(2 * size, 3) if rank == 0 else None
        st.gather(dst=0, out=out)
    if rank == 0:
        want = torch.arange(size, dtype=torch.float32).repeat_interleave(2)[:, None].expand(-1, 3)
        assert out is not None and torch.equal(out, want), out


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a CPU-only torch")
@pytest.mark.parametrize("backend", ["mpicomm", "gloo"])
def test_split_group_refuses_as_on_gloo_on_a_cpu_only_torch(both: dict[str, Any], backend: str) -> None:
    """torch's split_group needs an accelerator-bound default group: on CPU-only torch it refuses gloo too.

    With gloo as torch's default group the refusal is the same (checked by hand at 2 ranks: gloo's
    default group, and ``init_process_group("gloo", device_id=torch.device("cpu"))`` is refused by
    torch itself, "must be an accelerator with an index"). Past the device check (a default group
    bound to ``cpu:0`` by hand; gloo as the default group refuses the same there), torch's next check
    needs an accelerator: both refuse there too.
    """
    everyone = [list(range(dist.get_world_size()))]
    with pytest.raises(RuntimeError, match="No device associated with the default pg"):
        dist.split_group(parent_pg=both[backend], split_ranks=everyone)
    default = dist.distributed_c10d._get_default_group()
    default.bound_device_id = torch.device("cpu", 0)
    try:
        with pytest.raises(RuntimeError, match="does not support splitting"):
            dist.split_group(parent_pg=both[backend], split_ranks=everyone)
    finally:
        default.bound_device_id = None
