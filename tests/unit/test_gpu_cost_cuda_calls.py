"""The staged-cost report counts the CUDA calls of one call of each contender on the fake cupy (issue 35).

A small staged call makes no more CUDA calls than the same copies written by hand on the caller's
stream (copy, synchronise, MPI, copy, synchronise): each costs microseconds on a GPU, as much as the
call's own Python.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import fakecupy
import pytest

import mpicomm
from mpicomm.apps.bench import gpu
from mpicomm.apps.bench.harness import Env


@pytest.fixture
def cp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "0")
    yield from fakecupy.fixture()


def test_the_report_counts_as_many_cuda_calls_for_mpicomm_as_by_hand(cp: Any) -> None:
    world = mpicomm.init()
    ctl = world.comm.Dup()
    try:
        args = argparse.Namespace(iters=2, rounds=2, sample_time=0.001, gate=0.0, gate_wait=0.0)
        res = gpu.cost_report(ctl, Env(world.comm, world.rank(), world.size()), args)
    finally:
        ctl.Free()
    first = {r["op"]: r["cuda"] for r in res["rows"] if r["size"] == gpu.COST_SIZES[0]}
    assert first["all_reduce"]["mpicomm cupy"] == {"memcpyAsync": 2, "streamSynchronize": 2}
    assert first["broadcast"]["mpicomm cupy"] == {
        "memcpyAsync": 1,
        "streamSynchronize": 1,
    }  # one rank: the root
    assert first["all_reduce"]["mpicomm foreign"] == {
        "memcpyAsync": 2,
        "streamSynchronize": 2,
        "pointerGetAttributes": 1,
    }
    assert first["all_reduce"]["hand-written"] == {"memcpyAsync": 2, "streamSynchronize": 2}
    assert first["all_reduce"]["mpicomm numpy"] == {}
    assert (
        "CUDA calls in one all_reduce of 4 KiB (the fake's count): cupy 4, hand-written 4"
        in gpu.cost_lines(res)
    )
