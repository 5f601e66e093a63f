"""Calls that make groups always agree (issue 34, finding 2): with validation off, ranks that pass
different arguments to new_group, split_group, new_subgroups, new_subgroups_by_enumeration,
init_device_mesh, DeviceMesh or DeviceMesh._flatten all raise the same error, where before each got a
group holding other ranks than it thought (rank 0's "two-member" group held only itself, and its
all_reduce returned 1.0 instead of 2.0). A local mistake on one rank is raised on every rank too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import ArgumentError, CrossRankMismatchError, MpicommError
from mpicomm.core import validation

pytestmark = pytest.mark.usefixtures("validation_off")


def _same_everywhere(call: Callable[[], Any], cls: type[BaseException] = CrossRankMismatchError) -> str:
    """Run ``call``, which must raise ``cls`` on this rank; the message must be the same on every rank."""
    with pytest.raises(cls) as info:
        call()
    text = str(info.value)
    every = MPI.COMM_WORLD.allgather(text)
    assert all(t == every[0] for t in every), every
    x = np.ones(1)  # still in step
    mpicomm.all_reduce(x)
    assert x[0] == MPI.COMM_WORLD.Get_size()
    return text


@pytest.mark.mpi(min_size=2)
def test_init_device_mesh_with_other_shapes_raises_on_every_rank(world):
    w = world.size()
    shape = (1, w) if world.rank() == 0 else (w, 1)
    text = _same_everywhere(lambda: mpicomm.init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp")))
    assert text.startswith("DeviceMesh: the ranks passed different arguments: mesh differs"), text


@pytest.mark.mpi(min_size=2)
def test_split_group_with_other_splits_raises_on_every_rank(world):
    w = world.size()
    split = [[r] for r in range(w)] if world.rank() == 0 else [list(range(w))]
    text = _same_everywhere(lambda: mpicomm.split_group(split_ranks=split))
    assert "split_group: the ranks passed different arguments: split_ranks differs" in text


@pytest.mark.mpi(min_size=2)
def test_new_group_with_other_ranks_raises_on_every_rank(world):
    ranks = [0] if world.rank() == 0 else list(range(world.size()))
    text = _same_everywhere(lambda: mpicomm.new_group(ranks))
    assert (
        "new_group: the ranks passed different arguments: ranks differs: rank 0: [0], rank 1: [0, 1" in text
    )


@pytest.mark.mpi(min_size=2)
def test_new_subgroups_with_other_sizes_raises_on_every_rank_before_any_other_collective(world):
    size = 1 if world.rank() == 0 else None  # None would split by node first: a collective of its own
    text = _same_everywhere(lambda: mpicomm.new_subgroups(size))
    assert "new_subgroups: the ranks passed different arguments: group_size differs" in text


@pytest.mark.mpi(min_size=2)
def test_new_subgroups_by_enumeration_with_other_lists_raises_on_every_rank(world):
    w = world.size()
    lists = [list(range(w))] if world.rank() == 0 else [[r] for r in range(w)]
    text = _same_everywhere(lambda: mpicomm.new_subgroups_by_enumeration(lists))
    assert "new_subgroups_by_enumeration: the ranks passed different arguments" in text


@pytest.mark.mpi(min_size=2)
def test_flatten_with_other_names_raises_on_every_rank(world):
    w = world.size()
    mesh = mpicomm.init_device_mesh("cpu", (1, w), mesh_dim_names=("dp", "tp"))
    name = "flat_a" if world.rank() == 0 else "flat_b"
    text = _same_everywhere(lambda: mesh._flatten(name))
    assert "DeviceMesh._flatten: the ranks passed different arguments: mesh_dim_name differs" in text


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("call", ["new_group", "split_group", "init_device_mesh", "new_subgroups"])
def test_a_local_mistake_on_one_rank_is_raised_on_every_rank(world, call):
    w, bad = world.size(), world.rank() == world.size() - 1
    calls: dict[str, Callable[[], Any]] = {
        "new_group": lambda: mpicomm.new_group([w + 5] if bad else [0]),
        "split_group": lambda: mpicomm.split_group(split_ranks=[[0, 0]] if bad else [list(range(w))]),
        "init_device_mesh": lambda: mpicomm.init_device_mesh("cpu", (w + 1,) if bad else (w,)),
        "new_subgroups": lambda: mpicomm.new_subgroups("two" if bad else w),
    }
    text = _same_everywhere(calls[call], MpicommError)
    assert f"found on rank {w - 1}" in text, text


@pytest.mark.mpi(min_size=1)
def test_groups_made_alike_still_work_and_every_call_agrees_once(world):
    w, r = world.size(), world.rank()
    before = validation._Flag.exchanges
    g = mpicomm.new_group(list(range(w)))
    mine = mpicomm.split_group(split_ranks=[list(range(w))])
    mesh = mpicomm.init_device_mesh("cpu", (w, 1), mesh_dim_names=("dp", "tp"))
    flat = mesh._flatten()
    assert validation._Flag.exchanges - before == 4  # one agreement each (the mesh's: in DeviceMesh)
    for group in (g, mine, mesh.get_group("dp"), flat.get_group()):
        x = np.array([float(r + 1)])
        mpicomm.all_reduce(x, group=group)
        assert x[0] == w * (w + 1) / 2


def test_fingerprint_keeps_short_values_and_digests_long_ones():
    assert validation.fingerprint([[0, 1], [2, 3]]) == [[0, 1], [2, 3]]
    a, b = validation.fingerprint(list(range(500))), validation.fingerprint([*range(499), 500])
    assert isinstance(a, str) and a.startswith("sha256:") and a != b and len(a) < 160


@pytest.mark.mpi(min_size=2)
def test_a_long_mesh_that_differs_is_told_by_its_digest(world):
    """A large grid travels as a digest; two that differ in one place still disagree."""
    w = world.size()
    names = [f"d{i}" for i in range(40)] if world.rank() else [f"d{i}" for i in range(39)] + ["x"]
    with pytest.raises(CrossRankMismatchError):
        validation.agree(world, "example", {"names": validation.fingerprint(names), "w": w})
    with pytest.raises(ArgumentError):  # the same local mistake everywhere needs no agreement to fail
        mpicomm.init_device_mesh("cpu", (w + 1,))
