"""A torchrec DLRM trained with DistributedModelParallel on mpicomm and on gloo: equal losses and weights.

Eight tables, two of each sharding type torchrec's sharder offers on CPU (table-wise, column-wise,
table-column-wise and data parallel, set by planner constraints), fused SGD on the tables and SGD on the
dense part. The same program runs on torch's default group ("mpicomm") and on a gloo group of the same
ranks, in one process; at one and two ranks the results are bit-identical (a sum of two numbers has one
order), from three they agree to float32 rounding. Runs in its own venv (``make test-torchrec``:
torchrec 1.8.0 and fbgemm-gpu-cpu 1.8.0 beside torch 2.13 CPU).
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torchpair

import mpicomm.torch  # noqa: F401  # registers the backend

torchrec = pytest.importorskip("torchrec")

from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor  # noqa: E402
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder  # noqa: E402
from torchrec.distributed.model_parallel import DistributedModelParallel  # noqa: E402
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology  # noqa: E402
from torchrec.distributed.types import ShardingEnv, ShardingType  # noqa: E402
from torchrec.models.dlrm import DLRM  # noqa: E402
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward  # noqa: E402

pytestmark = pytest.mark.mpi

DIM, ROWS, BATCH, STEPS = 8, 40, 6, 4
# the CPU sharder's types (row-wise needs a GPU kernel in torchrec 1.8)
KINDS = [
    ShardingType.TABLE_WISE,
    ShardingType.COLUMN_WISE,
    ShardingType.TABLE_COLUMN_WISE,
    ShardingType.DATA_PARALLEL,
]
TABLES = [f"t{i}" for i in range(2 * len(KINDS))]


groups = pytest.fixture(scope="module")(torchpair.mpicomm_and_gloo)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    tables = [
        EmbeddingBagConfig(name=t, embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f"f_{t}"])
        for t in TABLES
    ]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    return DLRM(embedding_bag_collection=ebc, dense_in_features=4, dense_arch_layer_sizes=[16, DIM],
                over_arch_layer_sizes=[16, 1])  # fmt: skip


def _batch(rank: int, step: int) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    lengths = torch.randint(0, 3, (len(TABLES) * BATCH,), generator=g)
    values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=[f"f_{t}" for t in TABLES], values=values, lengths=lengths)
    return torch.randn(BATCH, 4, generator=g), kjt, torch.rand(BATCH, generator=g)


def _train(pg: Any) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = _model()
    apply_optimizer_in_backward(torch.optim.SGD, model.sparse_arch.parameters(), {"lr": 0.1})
    constraints = {
        t: ParameterConstraints(sharding_types=[KINDS[i % len(KINDS)].value]) for i, t in enumerate(TABLES)
    }
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=dist.get_world_size(pg), compute_device="cpu"), constraints=constraints
    )
    sharders: list[Any] = [EmbeddingBagCollectionSharder()]
    plan = planner.collective_plan(model, sharders, pg)
    env = ShardingEnv.from_process_group(pg)
    dmp = DistributedModelParallel(model, env=env, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = [p for n, p in dmp.named_parameters() if "sparse_arch" not in n]
    opt = torch.optim.SGD(dense, lr=0.1)
    losses = []
    for step in range(STEPS):
        x, kjt, y = _batch(dist.get_rank(), step)
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(dmp(x, kjt).squeeze(-1), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    state = {}
    for name, value in dmp.state_dict().items():
        if hasattr(value, "local_shards"):
            for i, shard in enumerate(value.local_shards()):
                state[f"{name}#{i}"] = shard.tensor.detach().clone()
        elif hasattr(value, "to_local"):
            state[name] = value.to_local().detach().clone()
        else:
            state[name] = value.detach().clone()
    return losses, state


def test_dlrm_with_every_cpu_sharding_type_trains_on_mpicomm_as_on_gloo(groups: dict[str, Any]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, theirs = _train(groups["mpicomm"]), _train(groups["gloo"])
    torchpair.assert_same(ours[0], theirs[0], names=[f"loss {i}" for i in range(len(ours[0]))])
    assert ours[1].keys() == theirs[1].keys() and ours[1]
    names = list(ours[1])
    torchpair.assert_same([ours[1][n] for n in names], [theirs[1][n] for n in names], names=names)
