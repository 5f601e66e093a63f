"""torch's groups on mpicomm: their timeouts, their destruction, and torch's object collectives in safe mode.

- torch passes its 30-minute default to the backend when the user gave no timeout; the group then
  keeps mpicomm's default (None: ``MPICOMM_TIMEOUT``, else 30 minutes), a user's timeout is kept, and
  a huge one is clamped (``timedelta(days=10**6)`` overflowed torch's store);
- a group torch destroys frees its communicators (MPICH holds about 2,000: new_group/destroy in a loop
  aborted the job after about 1,020 groups) and refuses calls afterwards with mpicomm's GroupError;
- with safe mode on, torch's object collectives on this backend load no callable from the stream.
"""

from __future__ import annotations

import datetime
import os
import tempfile
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

import mpicomm
import mpicomm.torch
from mpicomm.c10d import options
from mpicomm.core import groups
from mpicomm.errors import GroupError, UnpicklingRefusedError

pytestmark = pytest.mark.mpi


@pytest.fixture
def torch_world() -> Iterator[Any]:
    """torch's default group on mpicomm, started without a timeout; destroyed after the test."""
    w = mpicomm.init()
    saved = w.timeout
    dist.init_process_group("mpicomm")
    yield dist.group.WORLD
    if dist.is_initialized():
        dist.destroy_process_group()
    w.timeout = saved


def _sum_check(pg: Any) -> None:
    t = torch.full((3,), float(dist.get_rank()))
    dist.all_reduce(t, group=pg)
    n = dist.get_world_size(pg)
    members = dist.get_process_group_ranks(pg)
    assert torch.equal(t, torch.full((3,), float(sum(members)))), (t, n)


def test_torchs_default_timeout_leaves_mpicomms_default_and_a_users_is_kept(torch_world: Any) -> None:
    assert torch_world.mpicomm_group.timeout is None  # MPICOMM_TIMEOUT (or 30 minutes) applies
    everyone = list(range(dist.get_world_size()))
    assert dist.new_group(everyone).mpicomm_group.timeout is None
    thirty = dist.new_group(everyone, timeout=datetime.timedelta(minutes=30))  # the user's 30 minutes
    assert thirty.mpicomm_group.timeout == 1800.0
    huge = dist.new_group(everyone, timeout=datetime.timedelta(days=10**6))
    assert huge.mpicomm_group.timeout == options.LONGEST_TIMEOUT.total_seconds()
    _sum_check(huge)


def test_a_huge_timeout_starts_the_default_group() -> None:
    w = mpicomm.init()
    saved = w.timeout
    dist.init_process_group("mpicomm", timeout=datetime.timedelta(days=10**6))
    try:
        assert dist.group.WORLD.mpicomm_group.timeout == options.LONGEST_TIMEOUT.total_seconds()
        _sum_check(None)
    finally:
        dist.destroy_process_group()
        w.timeout = saved


CYCLES = 2200  # MPICH's ~2,048 communicators ran out after ~1,020 groups (each holds two)


def test_groups_torch_destroys_free_their_communicators(torch_world: Any) -> None:
    everyone = list(range(dist.get_world_size()))
    before = len(groups._State.groups)
    for _ in range(CYCLES):
        dist.destroy_process_group(dist.new_group(everyone))
    assert len(groups._State.groups) == before
    pg = dist.new_group(everyone)
    _sum_check(pg)
    dist.destroy_process_group(pg)
    with pytest.raises(GroupError, match=r"all_reduce: group torch:.* was destroyed"):
        pg.allreduce([torch.ones(1)])
    assert pg.mpicomm_group.comm is None


def test_the_default_group_torch_destroys_refuses_calls_and_mpicomm_goes_on(torch_world: Any) -> None:
    dist.destroy_process_group()
    with pytest.raises(GroupError, match="all_reduce: group world was destroyed"):
        torch_world.allreduce([torch.ones(1)])
    x = np.ones(2)
    mpicomm.all_reduce(x)  # mpicomm's own world lives on
    assert x[0] == mpicomm.get_world_size()
    dist.init_process_group("mpicomm")  # and torch may start again
    _sum_check(None)


class _Payload:
    """Unpickling it calls ``os.mkdir(path)``: what safe mode must never run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (self.path,))


@pytest.fixture
def safe(torch_world: Any) -> Iterator[str]:
    """Safe mode on; yields a path the payload would create (the same on every rank)."""
    name = [f"mpicomm-safe-{os.getpid()}"]
    dist.broadcast_object_list(name, src=0)  # before safe mode: a plain string either way
    was = mpicomm.is_safe_unpickling()
    mpicomm.set_safe_unpickling(True)
    path = os.path.join(tempfile.gettempdir(), name[0])
    yield path
    mpicomm.set_safe_unpickling(was)
    dist.barrier()
    assert not os.path.exists(path), "the payload ran"


def test_safe_mode_loads_plain_objects_through_torchs_object_collectives(safe: str) -> None:
    obj = [{"rank": 0, "values": np.arange(3), "name": "x"}] if dist.get_rank() == 0 else [None]
    dist.broadcast_object_list(obj, src=0)
    assert obj[0]["name"] == "x" and np.array_equal(obj[0]["values"], np.arange(3))
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, (dist.get_rank(), "ok"))
    assert out == [(r, "ok") for r in range(dist.get_world_size())]


def test_safe_mode_refuses_a_payload_in_every_object_collective(safe: str) -> None:
    rank, size = dist.get_rank(), dist.get_world_size()
    evil = _Payload(safe)
    obj = [evil if rank == 0 else None]
    if rank == 0:
        dist.broadcast_object_list(obj, src=0)  # the source unpickles nothing
    else:
        with pytest.raises(UnpicklingRefusedError):
            dist.broadcast_object_list(obj, src=0)
    with pytest.raises(UnpicklingRefusedError):  # every rank loads every rank's object
        dist.all_gather_object([None] * size, evil)
    if rank == 0:
        with pytest.raises(UnpicklingRefusedError):
            dist.gather_object(evil, [None] * size, dst=0)
    else:
        dist.gather_object(evil, None, dst=0)
    with pytest.raises(UnpicklingRefusedError):  # every rank loads its own share, the source too
        dist.scatter_object_list([None], [evil] * size if rank == 0 else None, src=0)
    if size > 1:
        if rank == 0:
            dist.send_object_list([evil], dst=1)
        elif rank == 1:
            with pytest.raises(UnpicklingRefusedError):
                dist.recv_object_list([None], src=0)
