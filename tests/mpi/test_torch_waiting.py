"""Under torch's backend "mpicomm", MPICH's long waits sleep (as gloo's do) instead of polling a core.

``init_process_group("mpicomm")`` sets MPICH's ``MPIR_CVAR_ENABLE_HEAVY_YIELD`` through MPI's tool
interface (``mpicomm.c10d.waiting``); read back the same way, it is on. A user who set the variable in
the environment keeps their value.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import mpicomm
import mpicomm.torch
from mpicomm import _mpi
from mpicomm.c10d import waiting

pytestmark = pytest.mark.mpi


def _mpich() -> bool:
    mpicomm.init()
    return _mpi.MPI is not None and "MPICH" in _mpi.MPI.Get_library_version()


@pytest.mark.skipif(not _mpich(), reason="MPICH's variable")
def test_the_default_group_turns_on_mpichs_sleeping_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in waiting._NAMES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(waiting._State, "done", False)
    w = mpicomm.init()
    saved = w.timeout
    dist.init_process_group("mpicomm")
    try:
        assert waiting.heavy_yield() == 1
        t = torch.full((3,), float(dist.get_rank()))
        dist.all_reduce(t)  # calls still run, with the sleeping waits
        size = dist.get_world_size()
        assert t.tolist() == [size * (size - 1) / 2] * 3
    finally:
        dist.destroy_process_group()
        w.timeout = saved


def test_a_value_the_user_set_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting._State, "done", False)
    monkeypatch.setenv(waiting.CVAR, "0")
    before = waiting.heavy_yield()
    assert waiting.sleep_in_long_waits() is False
    assert waiting.heavy_yield() == before
