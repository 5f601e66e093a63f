"""The two scripts of docs/torch.rst, written as torch.distributed and torchrec users write them, run
under mpiexec at 1-4 ranks; their printed results are checked against plain numpy references."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.process

SCRIPTS = Path(__file__).resolve().parents[2] / "docs" / "scripts"
MPIEXEC = Path(sys.executable).parent / "mpiexec"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(script: str, ranks: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "PYTEST_"))}
    env["OMP_NUM_THREADS"] = "1"
    version = subprocess.run([str(MPIEXEC), "--version"], capture_output=True, text=True, check=False)
    flags = ["--oversubscribe"] if "open" in (version.stdout + version.stderr).lower() else []
    cmd = [
        str(MPIEXEC),
        *flags,
        "-n",
        str(ranks),
        sys.executable,
        "-m",
        "mpi4py",
        str(SCRIPTS / f"{script}.py"),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, done.stdout  # one report, from rank 0
    result: dict[str, Any] = json.loads(lines[0])
    return result


def _train_reference(m: ModuleType, world: int) -> tuple[np.ndarray, float]:
    """The training loop of train_step.py, every rank at once, in plain numpy."""
    w = m.initial_weights()
    shard = -(-m.FEATURES // world)
    momentum = np.zeros(shard * world, np.float32)
    losses = []
    for step in range(m.STEPS):
        grads, losses = [], []
        for r in range(world):
            x, y = m.batch_for(r, step)
            err = x @ w - y
            grads.append((2.0 / m.BATCH) * (x.T @ err).astype(np.float32))
            losses.append(float(np.mean(err**2)))
        padded = np.zeros(shard * world, np.float32)
        padded[: m.FEATURES] = np.sum(grads, axis=0) / world
        momentum = 0.9 * momentum + padded
        w = w - m.LR * momentum[: m.FEATURES]
    return w, float(np.mean(losses))


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_torch_distributed_training_script_runs_unchanged_but_for_the_import(ranks: int) -> None:
    m = _load("train_step")
    got = _run("train_step", ranks)
    weights, loss = _train_reference(m, ranks)
    assert got["world_size"] == ranks and got["backend"] == "mpi" and got["local_rank"] == 0
    np.testing.assert_allclose(got["weights"], weights, rtol=1e-4, atol=1e-5)
    assert got["loss"] == pytest.approx(loss, rel=1e-4)
    assert got["losses"] == [pytest.approx(got["loss"])] * ranks  # the AVG all_reduce left it on every rank
    assert got["received_equal"] and got["evens"] == (ranks + 1) // 2
    assert len(got["half_grad"]) == m.FEATURES


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_torchrec_sharding_script_runs_unchanged_but_for_the_import(ranks: int) -> None:
    m = _load("shard_tables")
    got = _run("shard_tables", ranks)
    from mpicomm.planner import GreedyPerfPartitioner, Topology

    topology = Topology(world_size=ranks, compute_device="cuda", hbm_cap=1 << 30)
    plan = GreedyPerfPartitioner().partition(m.sharding_options(), topology)
    want_plan = {o.name: o.shards[0].rank for o in plan}
    assert got["plan"] == want_plan and len(set(want_plan.values())) == min(ranks, len(m.TABLES))
    batches = [m.local_features(r) for r in range(ranks)]
    for r in range(ranks):
        # rank r holds the features of its tables, in plan order, with every source rank's bags in turn
        keys = [f"f_{name}" for name in m.TABLES if want_plan[name] == r]
        want = {k: [bag.tolist() for b in batches for bag in b[k]] for k in keys}
        assert got["features"][r] == want
    assert got["stride"] == m.BATCH * ranks
