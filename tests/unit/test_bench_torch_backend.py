"""The bench's "torch_backend" report, run tiny in one process: every row timed and checked, goals judged."""

from __future__ import annotations

import argparse
import math

import pytest

import mpicomm
from mpicomm.apps.bench import run, torch_backend, torch_steps
from mpicomm.apps.bench.harness import Env

pytest.importorskip("torch")


def _args() -> argparse.Namespace:
    return argparse.Namespace(rounds=2, sample_time=0.001, iters=0, gate=0.0, gate_wait=0.0)


def test_the_report_times_every_contender_and_checks_results(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    world = mpicomm.init()
    monkeypatch.setattr(torch_backend, "SIZES", (8, 4 << 10))
    monkeypatch.setattr(torch_steps, "MODELS", {"tiny": ((8, 16, 4), 4)})
    ctl = world.comm.Dup()
    try:
        res = torch_backend.torch_backend(ctl, Env(world.comm, world.rank(), world.size()), _args())
    finally:
        ctl.Free()
    assert not dist.is_initialized()  # the report leaves torch as it found it
    assert res["check"] is True
    assert [r["size"] for r in res["all_reduce"]] == [8, 4 << 10]
    for row in res["all_reduce"]:
        for case in torch_backend.CASES:
            assert row[case]["min"] <= row[case]["median"] and math.isfinite(row[case]["median"])
    (ddp,) = res["ddp"]
    assert ddp["model"] == "tiny" and ddp["params"] == 8 * 16 + 16 + 16 * 4 + 4 and ddp["check"]
    assert set(ddp) >= set(torch_steps.DDP_CASES) and ddp["buckets"] == [(8 * 16 + 16 + 16 * 4 + 4) * 4]
    (fsdp,) = res["fsdp"]
    assert fsdp["model"] == "tiny" and fsdp["check"] and fsdp["mpicomm"]["min"] > 0
    assert fsdp["mpicomm prefetch"]["min"] > 0 and fsdp["gloo prefetch"]["min"] > 0
    assert set(res["split"]) == {"direct", "pg", "dist", "AllreduceOptions()", "opts.reduceOp"}
    text = torch_backend.torch_backend_lines(res)
    assert "8 B on a one-rank group (mins)" in text and "torch's Python wrapper" in text
    assert "hidden mpicomm" in text and "FSDP2 step, tiny" in text and "explicit prefetching" in text
    assert text.count("target ") == 3  # 8 B added, 8 B vs gloo, the DDP model (no size >= 1 MiB here)
    assert "MPI thread level" in text and "torch intra-op threads" in text
    from mpicomm.c10d import waiting

    assert res["algorithm"] == waiting.read_cvar(torch_steps.ALGO)  # MPICH's selection left as it was
    if res["algorithm"] not in (None, torch_steps.P2P):  # MPICH: the point-to-point cases ran
        assert {"mpicomm p2p", "comm p2p"} <= set(ddp) and "mpicomm p2p/gloo" in text


def test_the_p2p_cases_switch_mpichs_allreduce_for_their_call_only() -> None:
    from mpicomm.c10d import waiting

    mpicomm.init()
    was = waiting.read_cvar(torch_steps.ALGO)
    if was is None:
        pytest.skip("MPI offers no MPIR_CVAR_ALLREDUCE_POSIX_INTRA_ALGORITHM (not MPICH)")
    seen: list[int | None] = []

    def fail() -> None:
        seen.append(waiting.read_cvar(torch_steps.ALGO))
        raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        torch_steps._switched(fail, was)()
    assert seen == [torch_steps.P2P] and waiting.read_cvar(torch_steps.ALGO) == was  # restored on error too


def _row(size: int, direct: float, backend: float, gloo: float) -> dict[str, object]:
    us = {"direct": direct, "pg": direct, "backend": backend, "gloo": gloo}
    return {"size": size, "check": True, **{k: {"median": v * 1e-6, "min": v * 1e-6} for k, v in us.items()}}


def test_the_verdicts_follow_the_goals() -> None:
    stats = {"median": 1e-6, "min": 1e-6}
    res = {
        "world_size": 2,
        "all_reduce": [_row(8, 2.0, 6.0, 300.0), _row(1 << 20, 100.0, 104.0, 900.0)],
        "split": {k: stats for k in ("direct", "pg", "dist", "AllreduceOptions()", "opts.reduceOp")},
        "ddp": [
            {
                "model": "m",
                "params": 10,
                "check": True,
                **{k: stats for k in torch_steps.DDP_CASES},
            }
        ],
    }
    lines = torch_backend.torch_backend_lines(res).splitlines()
    goals = [ln for ln in lines if "target " in ln]
    assert goals[0].endswith("NOT reached") and "adds <= 3 us" in goals[0]  # +4 us
    assert goals[1].endswith(": reached") and "50.0x" in goals[1]  # gloo 300 us vs 6 us
    assert goals[2].endswith(": reached") and "1.040x" in goals[2]
    assert goals[3].endswith("NOT reached") and "1.00x" in goals[3]


def test_the_report_is_asked_by_name_only() -> None:
    assert "torch_backend" in run.REPORTS and "torch_backend" in run.REPORT_RUNS
    assert "torch_backend" not in run.CPU_REPORTS


def test_the_hidden_share_is_the_communication_not_added_to_the_step() -> None:
    def ms(v: float) -> dict[str, float]:
        return {"median": v * 1e-3, "min": v * 1e-3}

    row = {"mpicomm": ms(120), "gloo": ms(200), "compute": ms(100), "comm": ms(80), "comm gloo": ms(100)}
    share = torch_steps.hidden(row)
    assert share["mpicomm"] == pytest.approx(0.75)  # 20 ms of 80 added: three quarters hidden
    assert share["gloo"] == pytest.approx(0.0)  # all of gloo's 100 ms added
