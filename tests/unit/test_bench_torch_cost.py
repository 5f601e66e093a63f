"""The bench's "torch_cost" report: it times both kinds, checks results, and says whether the goal holds."""

from __future__ import annotations

import math

import pytest

import mpicomm
from mpicomm.apps.bench import torch_cost

pytest.importorskip("torch")


def test_the_report_times_every_case_warm_and_cold(monkeypatch: pytest.MonkeyPatch) -> None:
    mpicomm.init()
    monkeypatch.setattr(torch_cost, "REPS", 40)
    monkeypatch.setattr(torch_cost, "BLOCK", 10)
    res = torch_cost._measure()
    assert res["check"] is True
    for mode in ("warm_us", "cold_us"):
        assert set(res[mode]) == {
            "all_reduce numpy",
            "all_reduce torch",
            "all_to_all_single numpy",
            "all_to_all_single torch",
            "nothing",
            "tensor.data_ptr()",
            "tensor.numpy()",
        }
        assert all(math.isfinite(v) and v > 0 for v in res[mode].values())
    for key in ("all_reduce_added_warm_us", "all_to_all_single_added_cold_us"):
        assert math.isfinite(res[key])
    text = torch_cost.torch_cost_lines(res)
    assert text.count("target <= 1.5 us") == 2
    assert "one torch attribute read" in text


def test_the_verdict_follows_the_worse_of_warm_and_cold() -> None:
    base = {"nothing": 1.0, "tensor.data_ptr()": 2.0, "tensor.numpy()": 9.0}
    res = {
        "target_us": 1.5,
        "cold_us": base,
        "all_reduce_added_warm_us": 0.4,
        "all_reduce_added_cold_us": 1.2,
        "all_to_all_single_added_warm_us": 0.9,
        "all_to_all_single_added_cold_us": 6.0,
    }
    lines = torch_cost.torch_cost_lines(res).splitlines()
    assert lines[1].strip().startswith("all_reduce") and lines[1].endswith(": reached")
    assert lines[2].strip().startswith("all_to_all_single") and lines[2].endswith("NOT reached")
    assert "read 1.00 us, tensor.numpy() 8.00 us" in lines[3]
