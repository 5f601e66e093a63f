"""Node-local ranks and device binding on real MPI processes (all ranks of these runs share one node)."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator

import pytest

import mpicomm
from mpicomm.gpu import device


@pytest.fixture(autouse=True)
def fresh_local_rank() -> Iterator[None]:
    device.reset_local_rank()
    yield
    device.reset_local_rank()


@pytest.mark.mpi(min_size=1)
def test_local_ranks_on_one_node_are_0_to_n_minus_1_in_world_order(world: mpicomm.ProcessGroup) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the launcher's MPI_LOCALRANKID (hydra) must agree with MPI
        mine = device.local_rank()
    everyone = world.comm.allgather(mine)
    assert sorted(everyone) == list(range(world.size()))
    assert everyone[world.rank()] == mine
    # the shared-memory split orders a node's ranks by world rank, and every rank is on this node
    assert everyone == list(range(world.size()))


@pytest.mark.mpi(min_size=1)
def test_local_rank_agrees_with_the_launcher_variable_when_set(world: mpicomm.ProcessGroup) -> None:
    announced = device.env_local_rank(os.environ)
    mine = device.local_rank()
    if announced is not None:
        # the launcher's numbers are a permutation of the node-local ranks (Hydra and srun: the same
        # order; Open MPI 5's mpirun: its own, e.g. 0, 2, 1)
        launcher = world.comm.allgather(announced[1])
        assert sorted(launcher) == list(range(world.size())), launcher
        if announced[0] != "OMPI_COMM_WORLD_LOCAL_RANK":
            assert announced[1] == mine, announced
    # the same answer on a second call, without another collective
    assert device.local_rank() == mine
    world.comm.Barrier()


@pytest.mark.mpi(min_size=1)
def test_local_rank_is_the_rank_in_new_node_group(world: mpicomm.ProcessGroup) -> None:
    node = mpicomm.new_node_group()
    try:
        assert device.local_rank() == node.rank()
        assert node.size() == world.size()
    finally:
        mpicomm.destroy_process_group(node)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("count", [1, 2, 3])
def test_bind_device_spreads_ranks_round_robin(world: mpicomm.ProcessGroup, count: int) -> None:
    if not _no_cupy():
        pytest.skip("cupy is installed: binding for real is tests/gpu's job")
    picks = world.comm.allgather(device.bind_device("cuda", device_count=count, env={}))
    assert picks == [r % count for r in range(world.size())]
    per_device = [picks.count(d) for d in range(count)]
    assert max(per_device) - min(per_device) <= 1  # ranks share devices evenly


@pytest.mark.mpi(min_size=1)
def test_bind_device_counts_cuda_visible_devices_without_cupy(world: mpicomm.ProcessGroup) -> None:
    if not _no_cupy():
        pytest.skip("cupy is installed: binding for real is tests/gpu's job")
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}
    picks = world.comm.allgather(device.bind_device(env=env))
    assert picks == [r % 2 for r in range(world.size())]
    assert [device.physical_device(i, env) for i in picks] == [
        ("GPU-aaaa", "GPU-bbbb")[r % 2] for r in range(world.size())
    ]


def _no_cupy() -> bool:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return True
    return False


@pytest.mark.mpi(min_size=1)
def test_cuda_awareness_is_the_same_decision_on_every_rank(world: mpicomm.ProcessGroup) -> None:
    from mpicomm.gpu import cuda_aware

    cuda_aware.reset_cuda_awareness()
    facts = cuda_aware.gather_mpi_facts()
    mine = cuda_aware.cuda_awareness()
    assert mine == cuda_aware.decide(dict(os.environ), facts)
    everyone = world.comm.allgather((mine.aware, mine.source, mine.reason))
    assert everyone == [everyone[0]] * world.size()
