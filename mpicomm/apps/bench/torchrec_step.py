"""The bench's "torchrec" report: a table-wise DLRM training step on backend "mpicomm" against gloo.

Issue 42's goal: the step takes at most 1.0x gloo's time. The model is torchrec's DLRM with
:data:`TABLES` embedding tables sharded table-wise by DistributedModelParallel (fused SGD on the
tables, SGD on the dense part). A step makes five ``all_to_all_single`` calls with split sizes, all
``async_op=True`` (the KJT's lengths splits, its lengths and values, the pooled embeddings forward
and their gradients backward) and DDP's ``all_reduce`` of the dense gradients.

Three contenders, each on its own copy of the model, interleaved (alternating order, the quiet gate,
max over ranks): ``mpicomm`` as ``init_process_group("mpicomm")`` leaves MPICH (long waits sleep
where the node is oversubscribed, :mod:`mpicomm.c10d.waiting`; the report prints which), ``mpicomm
polling`` (MPICH's default, switched on for its samples
only) and ``gloo``. Each sample times :data:`STEPS` steps and also reads the process's CPU time, which
shows what a polling wait costs a shared machine. Before timing, one step of each on the same model
and batch is checked: equal losses (bitwise at one and two ranks, float32 rounding from three).
Needs torchrec (``make .venv-torchrec/.installed``); without it the report says so and measures
nothing.

Example::

    mpiexec -n 2 .venv-torchrec/bin/python -m mpi4py -m mpicomm.bench --ops torchrec --rounds 10
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .harness import Env, largest, quiet_gate

if TYPE_CHECKING:
    from mpi4py import MPI

__all__ = ["has_torchrec", "torchrec_step", "torchrec_step_lines"]

#: Tables, rows per table, embedding width, batch per rank, steps per sample.
TABLES, ROWS, DIM, BATCH, STEPS = 8, 1000, 16, 64, 10
#: The goal: the mpicomm step over gloo's.
GOAL = 1.0
CASES = ("mpicomm", "mpicomm polling", "gloo")


def _model(pg: Any) -> tuple[Any, Any]:
    """A table-wise sharded DLRM on ``pg`` and the dense part's optimizer (same seed every time)."""
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.types import ShardingEnv, ShardingType
    from torchrec.models.dlrm import DLRM
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    torch.manual_seed(0)
    names = [f"t{i}" for i in range(TABLES)]
    configs = [
        EmbeddingBagConfig(name=t, embedding_dim=DIM, num_embeddings=ROWS, feature_names=[f"f_{t}"])
        for t in names
    ]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("cpu"))
    model = DLRM(embedding_bag_collection=ebc, dense_in_features=4, dense_arch_layer_sizes=[16, DIM],
                 over_arch_layer_sizes=[16, 1])  # fmt: skip
    apply_optimizer_in_backward(torch.optim.SGD, model.sparse_arch.parameters(), {"lr": 0.1})
    wise = {t: ParameterConstraints(sharding_types=[ShardingType.TABLE_WISE.value]) for t in names}
    size = pg.size()
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=size, compute_device="cpu"), constraints=wise
    )
    sharders: list[Any] = [EmbeddingBagCollectionSharder()]
    plan = planner.collective_plan(model, sharders, pg)
    env = ShardingEnv.from_process_group(pg)
    dmp = DistributedModelParallel(model, env=env, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = [p for n, p in dmp.named_parameters() if "sparse_arch" not in n]
    return dmp, torch.optim.SGD(dense, lr=0.1)


def _batches(rank: int, n: int) -> list[tuple[Any, Any, Any]]:
    """``n`` batches of this rank: dense features, a KJT of 0-2 ids per table and sample, labels."""
    import torch
    from torchrec import KeyedJaggedTensor

    out = []
    for step in range(n):
        g = torch.Generator().manual_seed(1000 * step + rank)
        lengths = torch.randint(0, 3, (TABLES * BATCH,), generator=g)
        values = torch.randint(0, ROWS, (int(lengths.sum()),), generator=g)
        keys = [f"f_t{i}" for i in range(TABLES)]
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)
        out.append((torch.randn(BATCH, 4, generator=g), kjt, torch.rand(BATCH, generator=g)))
    return out


def _step(model: tuple[Any, Any], batch: tuple[Any, Any, Any]) -> float:
    import torch

    dmp, opt = model
    x, kjt, y = batch
    opt.zero_grad()
    loss = torch.nn.functional.binary_cross_entropy_with_logits(dmp(x, kjt).squeeze(-1), y)
    loss.backward()  # type: ignore[no-untyped-call]
    opt.step()
    return float(loss.item())


def _sample(ctl: MPI.Intracomm, run: Callable[[], None]) -> tuple[float, float]:
    """Seconds and CPU seconds per step of one sample (max over ranks)."""
    ctl.Barrier()
    t0, c0 = time.perf_counter(), time.process_time()
    run()
    wall, cpu = (time.perf_counter() - t0) / STEPS, (time.process_time() - c0) / STEPS
    return largest(ctl, wall), largest(ctl, cpu)


def has_torchrec() -> bool:
    """Whether torchrec is importable (a folder named torchrec on the path, as tests/torchrec, is not it)."""
    spec = importlib.util.find_spec("torchrec")
    return spec is not None and spec.origin is not None


def torchrec_step(ctl: MPI.Intracomm, e: Env, args: argparse.Namespace) -> dict[str, Any]:
    """Run the report on every rank (see the module's docstring); rank 0's results count."""
    if not has_torchrec():
        return {"skipped": "torchrec is not installed (make .venv-torchrec/.installed, then its python)"}
    import torch.distributed as dist

    import mpicomm.torch  # noqa: F401  # registers the backend

    from ...c10d import waiting

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("mpicomm")
    gloo = dist.new_group(backend="gloo")
    sleeping = waiting.heavy_yield()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            res = _measure(ctl, e, {"mpicomm": dist.group.WORLD, "gloo": gloo}, args, sleeping)
    finally:
        dist.destroy_process_group(gloo)
        if started:
            dist.destroy_process_group()
    return res


def _measure(
    ctl: MPI.Intracomm, e: Env, pgs: dict[str, Any], args: argparse.Namespace, sleeping: int | None
) -> dict[str, Any]:
    from ...c10d import waiting

    first = _batches(e.rank, 1)[0]
    losses = {k: _step(_model(pg), first) for k, pg in pgs.items()}
    check = losses["mpicomm"] == losses["gloo"] or (
        e.n > 2 and abs(losses["mpicomm"] - losses["gloo"]) <= 1e-5 * abs(losses["gloo"])
    )
    models = {
        "mpicomm": _model(pgs["mpicomm"]),
        "mpicomm polling": _model(pgs["mpicomm"]),
        "gloo": _model(pgs["gloo"]),
    }
    batches = _batches(e.rank, STEPS)

    def run(case: str) -> Callable[[], None]:
        def steps() -> None:
            for b in batches:
                _step(models[case], b)

        return steps

    switch = sleeping is not None  # MPICH with the tool interface: polling can be switched on for a sample
    cases = [c for c in CASES if switch or c != "mpicomm polling"]
    for c in cases:
        run(c)()  # warm-up: first steps allocate and plan
    wall: dict[str, list[float]] = {c: [] for c in cases}
    cpu: dict[str, list[float]] = {c: [] for c in cases}
    for r in range(args.rounds):
        for c in cases if r % 2 == 0 else cases[::-1]:
            quiet_gate(ctl, args.gate, args.gate_wait)
            if c == "mpicomm polling":
                waiting.set_heavy_yield(0)
            try:
                w, t = _sample(ctl, run(c))
            finally:
                if c == "mpicomm polling":
                    waiting.set_heavy_yield(sleeping or 0)
            wall[c].append(w)
            cpu[c].append(t)
    stats = {
        c: {"median": statistics.median(wall[c]), "min": min(wall[c]), "cpu": statistics.median(cpu[c])}
        for c in cases
    }
    return {"world_size": e.n, "check": bool(check), "sleeping_waits": sleeping, "steps": stats}


def torchrec_step_lines(res: dict[str, Any]) -> str:
    """The report's lines: per contender ms per step median (min), CPU ms per step; the goal's verdict."""
    if "skipped" in res:
        return f"torchrec: skipped, {res['skipped']}"
    steps = res["steps"]
    gloo = steps["gloo"]
    out = [
        f"torchrec: table-wise DLRM step ({TABLES} tables x {ROWS} rows x {DIM}, batch {BATCH} a rank), "
        f"{res['world_size']} ranks, ms per step median (min), CPU ms per step; check "
        f"{'ok' if res['check'] else 'FAILED'}; init_process_group left MPICH's waits "
        f"{ {1: 'sleeping', 0: 'polling'}.get(res.get('sleeping_waits'), 'as they were') }"  # type: ignore[arg-type]
    ]
    for case, s in steps.items():
        out.append(
            f"  {case:<16} {s['median'] * 1e3:8.2f} ({s['min'] * 1e3:7.2f})  cpu {s['cpu'] * 1e3:7.2f}"
            f"  x gloo {s['median'] / gloo['median']:5.2f} ({s['min'] / gloo['min']:5.2f})"
        )
    ratio = steps["mpicomm"]["median"] / gloo["median"]
    verdict = "reached" if ratio <= GOAL else "NOT reached"
    out.append(f"  target table-wise step <= {GOAL:g}x gloo (median): {ratio:.2f}x, {verdict}")
    return "\n".join(out)
