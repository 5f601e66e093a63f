"""The bench's "torchrec" report: skipped with a message without torchrec; its lines and goal verdict."""

from __future__ import annotations

import argparse

import pytest

import mpicomm
from mpicomm.apps.bench import run, torchrec_step
from mpicomm.apps.bench.harness import Env


def test_the_report_is_asked_by_name_only() -> None:
    assert "torchrec" in run.REPORTS and run.REPORT_RUNS["torchrec"] is torchrec_step.torchrec_step
    assert "torchrec" not in run.CPU_REPORTS


@pytest.mark.skipif(torchrec_step.has_torchrec(), reason="torchrec is installed")
def test_without_torchrec_it_says_so_and_measures_nothing() -> None:
    world = mpicomm.init()
    args = argparse.Namespace(rounds=1, gate=0.0, gate_wait=0.0)
    res = torchrec_step.torchrec_step(world.comm, Env(world.comm, world.rank(), world.size()), args)
    assert set(res) == {"skipped"}
    assert torchrec_step.torchrec_step_lines(res).startswith("torchrec: skipped, torchrec is not installed")


def _stats(median_ms: float, min_ms: float) -> dict[str, float]:
    return {"median": median_ms / 1e3, "min": min_ms / 1e3, "cpu": median_ms / 2e3}


@pytest.mark.parametrize(("ours", "verdict"), [(9.0, "0.90x, reached"), (12.0, "1.20x, NOT reached")])
def test_the_lines_give_each_contender_against_gloo_and_the_verdict(ours: float, verdict: str) -> None:
    steps = {"mpicomm": _stats(ours, 8.0), "mpicomm polling": _stats(15.0, 9.0), "gloo": _stats(10.0, 10.0)}
    text = torchrec_step.torchrec_step_lines(
        {"world_size": 2, "check": True, "sleeping_waits": 1, "steps": steps}
    )
    assert "2 ranks" in text and "check ok" in text
    assert "mpicomm polling" in text and " 1.50 ( 0.90)" in text
    assert text.endswith(f"<= 1x gloo (median): {verdict}")
