"""The bench's staged-cost report (``--ops gpu_cost``, issue 35 item 2) on the fake cupy, one process.

The hand-written sequence must do what a staged call does (copy down, MPI, copy up) and give the
same result; the report must run on the fake, time every contender and say that it is no GPU figure.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import fakecupy
import numpy as np
import pytest

import mpicomm
from mpicomm.apps.bench import gpu
from mpicomm.apps.bench.harness import Env


@pytest.fixture
def cp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "0")
    yield from fakecupy.fixture()


@pytest.mark.parametrize("op", ["all_reduce", "broadcast"])
def test_the_hand_written_sequence_moves_the_data_as_mpicomm_does(cp: Any, op: str) -> None:
    comm = mpicomm.init().comm
    d = cp.asarray(np.arange(1024, dtype=np.float32))
    mine = cp.asarray(np.arange(1024, dtype=np.float32))
    gpu.hand_written(cp, comm, op, d)()
    if op == "all_reduce":
        mpicomm.all_reduce(mine)
    else:
        mpicomm.broadcast(mine, src=0)
    np.testing.assert_array_equal(d.get(), mine.get())  # one rank: the data come back unchanged
    assert d.get()[5] == 5.0


def test_the_cost_report_times_every_contender_on_the_fake(cp: Any) -> None:
    world = mpicomm.init()
    ctl = world.comm.Dup()
    try:
        args = argparse.Namespace(iters=3, rounds=2, sample_time=0.001, gate=0.0, gate_wait=0.0)
        res = gpu.cost_report(ctl, Env(world.comm, world.rank(), world.size()), args)
    finally:
        ctl.Free()
    assert res["check"] and res["fake"] and len(res["rows"]) == 2 * len(gpu.COST_SIZES)
    for row in res["rows"]:
        assert {"mpicomm cupy", "hand-written", "mpicomm foreign", "mpicomm numpy"} <= set(row["times"])
        assert all(t > 0 for t in row["times"].values())
    text = gpu.cost_lines(res)
    assert "fake cupy (CPU emulation, not a GPU measurement)" in text
    assert "all_reduce 4 KiB staged <= 1.3x hand-written" in text
