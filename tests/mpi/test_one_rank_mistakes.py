"""Validation mode: a mistake that only rank 0 makes raises the same error on every rank, at once.

Without this, rank 0's local check raised while the other ranks waited in the validation exchange
forever: a user who caught the error, or called ``sys.exit`` after it, hung the job. Each test
makes rank 0 alone pass a wrong argument, checks that every rank raises the same class with the
same message, and that the ranks are still in step afterwards (a collective works). A hang would end
the run through pytest-timeout, so "no hang" needs no timing assertion.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import (
    ArgumentError,
    ArgumentTypeError,
    CrossRankMismatchError,
    MpicommError,
    ReduceOp,
    jagged_all_to_all,
)
from mpicomm.errors import DtypeMismatchError, ReductionTypeError
from mpicomm.jagged import KeyedJaggedArray, KJTAllToAll


@pytest.fixture(autouse=True)
def validating(world: mpicomm.ProcessGroup) -> Iterator[None]:
    mpicomm.set_validation(True)
    yield
    mpicomm.set_validation(False)
    x = np.ones(2)
    mpicomm.all_reduce(x)
    assert x.tolist() == [float(world.size())] * 2


def everywhere(call: Callable[[], Any], cls: type[BaseException], *words: str) -> str:
    """Every rank raises ``cls`` with the same message, which holds ``words``."""
    with pytest.raises(cls) as info:
        call()
    message = str(info.value)
    for word in words:
        assert word in message
    messages = MPI.COMM_WORLD.allgather(f"{type(info.value).__name__}: {message}")
    assert messages == [messages[0]] * len(messages)
    return message


def _bad_on_zero(good: Any, bad: Any) -> Any:
    return bad if mpicomm.get_rank() == 0 else good


def _a2a_single(w: int) -> Callable[[], Any]:
    out_splits = _bad_on_zero([1] * w, [2] + [1] * (w - 1))
    return lambda: mpicomm.all_to_all_single(np.empty(w), np.ones(w), out_splits, [1] * w)


def _a2a_float_splits(w: int) -> Callable[[], Any]:
    splits = _bad_on_zero([1] * w, [1.5] * w)
    return lambda: mpicomm.all_to_all_single(np.empty(w), np.ones(w), [1] * w, splits)


def _all_reduce_read_only(w: int) -> Callable[[], Any]:
    x = np.ones(3)
    x.flags.writeable = mpicomm.get_rank() != 0
    return lambda: mpicomm.all_reduce(x)


def _all_reduce_band_on_floats(w: int) -> Callable[[], Any]:
    op = _bad_on_zero(ReduceOp.SUM, ReduceOp.BAND)
    return lambda: mpicomm.all_reduce(np.ones(3), op=op)


def _broadcast_bad_src(w: int) -> Callable[[], Any]:
    return lambda: mpicomm.broadcast(np.ones(2), src=_bad_on_zero(0, w + 5))


def _all_gather_short_list(w: int) -> Callable[[], Any]:
    outs = [np.empty(2) for _ in range(_bad_on_zero(w, w + 1))]
    return lambda: mpicomm.all_gather(outs, np.ones(2))


def _coalesced_mixed_dtypes(w: int) -> Callable[[], Any]:
    # a DtypeMismatchError is a ValueError too (torch's type): every rank must raise that class
    arrays = [np.ones(2), np.ones(2, _bad_on_zero(np.float64, np.float32))]
    return lambda: mpicomm.all_reduce_coalesced(arrays)


def _scatter_short_list(w: int) -> Callable[[], Any]:
    parts = [np.ones(2)] * (w + 1) if mpicomm.get_rank() == 0 else None
    return lambda: mpicomm.scatter(np.empty(2), parts, src=0)


def _rst_wrong_output(w: int) -> Callable[[], Any]:
    out = np.empty(_bad_on_zero(2, 3))
    return lambda: mpicomm.reduce_scatter_tensor(out, np.ones(2 * w))


def _barrier_string_flag(w: int) -> Callable[[], Any]:
    return lambda: mpicomm.barrier(async_op=_bad_on_zero(False, "no"))


def _all_to_all_short_list(w: int) -> Callable[[], Any]:
    n = _bad_on_zero(w, w + 1)
    return lambda: mpicomm.all_to_all([np.empty(1) for _ in range(n)], [np.ones(1) for _ in range(n)])


def _jagged_split_sum(w: int) -> Callable[[], Any]:
    splits = _bad_on_zero([1] * w, [2] + [1] * (w - 1))
    return lambda: jagged_all_to_all(np.ones(w), np.ones(w, np.int64), splits)


def _kjt_not_a_kja(w: int) -> Callable[[], Any]:
    kja = KeyedJaggedArray(["a"], np.arange(1, dtype=np.int64), lengths=np.ones(1, np.int64))
    arg = _bad_on_zero(kja, {"a": [0]})
    return lambda: KJTAllToAll([1] + [0] * (w - 1))(arg).wait()


def _object_bcast_bad_src(w: int) -> Callable[[], Any]:
    objs = [1]
    return lambda: mpicomm.broadcast_object_list(objs, src=_bad_on_zero(0, w + 5))


def _new_group_bad_rank(w: int) -> Callable[[], Any]:
    return lambda: mpicomm.new_group(_bad_on_zero(list(range(w)), [0, w + 3]))


def _split_group_bad_rank(w: int) -> Callable[[], Any]:
    return lambda: mpicomm.split_group(split_ranks=_bad_on_zero([list(range(w))], [[0, w + 3]]))


def _mesh_bad_shape(w: int) -> Callable[[], Any]:
    return lambda: mpicomm.init_device_mesh("cpu", _bad_on_zero((w,), (w + 1,)))


def _flatten_a_dimension(w: int) -> Callable[[], Any]:
    mesh = mpicomm.init_device_mesh("cpu", (1, w), mesh_dim_names=("dp", "tp"))
    return lambda: mesh._flatten(_bad_on_zero("both", "tp"))


MISTAKES: dict[str, tuple[Callable[[int], Callable[[], Any]], type[BaseException], tuple[str, ...]]] = {
    "all_to_all_single output_split_sizes": (_a2a_single, ArgumentError, ("all_to_all_single", "rank 0")),
    "all_to_all_single float splits": (_a2a_float_splits, ArgumentTypeError, ("input_split_sizes",)),
    "all_reduce read-only": (_all_reduce_read_only, ArgumentError, ("all_reduce",)),
    "all_reduce BAND on floats": (_all_reduce_band_on_floats, ReductionTypeError, ("BAND",)),
    "broadcast bad src": (_broadcast_bad_src, ArgumentError, ("broadcast", "src")),
    "all_gather list length": (_all_gather_short_list, ArgumentError, ("all_gather",)),
    "scatter list length": (_scatter_short_list, ArgumentError, ("scatter",)),
    "all_reduce_coalesced mixed dtypes": (_coalesced_mixed_dtypes, DtypeMismatchError, ("tensors[1]",)),
    "reduce_scatter_tensor output": (_rst_wrong_output, ArgumentError, ("reduce_scatter_tensor",)),
    "barrier async_op='no'": (_barrier_string_flag, ArgumentTypeError, ("barrier", "async_op", "'no'")),
    "all_to_all list length": (_all_to_all_short_list, ArgumentError, ("all_to_all",)),
    "jagged_all_to_all split sum": (_jagged_split_sum, ArgumentError, ("jagged_all_to_all", "send_splits")),
    "KJTAllToAll input type": (_kjt_not_a_kja, ArgumentTypeError, ("KJTAllToAll",)),
    "broadcast_object_list bad src": (_object_bcast_bad_src, ArgumentError, ("broadcast_object_list", "src")),
    "new_group bad rank": (_new_group_bad_rank, ArgumentError, ("new_group",)),
    "init_device_mesh bad shape": (_mesh_bad_shape, ArgumentError, ("init_device_mesh", "mesh_shape")),
    "DeviceMesh._flatten a dimension's name": (_flatten_a_dimension, ArgumentError, ("_flatten", "'tp'")),
    "split_group bad rank": (_split_group_bad_rank, ArgumentError, ("split_group", "split_ranks[0]")),
}  # fmt: skip


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", sorted(MISTAKES))
def test_a_mistake_on_rank_0_only_raises_the_same_error_on_every_rank(
    world: mpicomm.ProcessGroup, name: str
) -> None:
    make, cls, words = MISTAKES[name]
    message = everywhere(make(world.size()), cls, *words)
    assert "found on rank 0" in message


@pytest.mark.mpi(min_size=2)
def test_new_group_with_different_member_lists_is_caught(world: mpicomm.ProcessGroup) -> None:
    members = _bad_on_zero(list(range(world.size())), [0])
    everywhere(lambda: mpicomm.new_group(members), CrossRankMismatchError, "new_group", "ranks differs")


@pytest.mark.mpi(min_size=2)
def test_split_group_with_different_lists_is_caught(world: mpicomm.ProcessGroup) -> None:
    lists = _bad_on_zero([list(range(world.size()))], [[0]])
    everywhere(
        lambda: mpicomm.split_group(split_ranks=lists), CrossRankMismatchError, "split_group", "split_ranks"
    )


@pytest.mark.mpi(min_size=2)
def test_device_meshes_that_differ_across_ranks_are_caught(world: mpicomm.ProcessGroup) -> None:
    grid = np.arange(world.size())
    mesh = _bad_on_zero(grid, grid[::-1])
    everywhere(lambda: mpicomm.DeviceMesh("cpu", mesh), CrossRankMismatchError, "DeviceMesh", "mesh")


@pytest.mark.mpi(min_size=2)
def test_mistakes_on_several_ranks_report_the_lowest_and_count_the_others(
    world: mpicomm.ProcessGroup,
) -> None:
    w = world.size()
    message = everywhere(
        lambda: mpicomm.all_to_all_single(np.empty(w), np.ones(w), [2] + [1] * (w - 1), [1] * w),
        ArgumentError,
        "found on rank 0",
    )
    assert f"and {w - 1} more rank(s) failed" in message


def test_flags_take_bools_only(world: mpicomm.ProcessGroup) -> None:
    with pytest.raises(ArgumentTypeError, match="set_validation: enabled is 'no'"):
        mpicomm.set_validation("no")  # type: ignore[arg-type]
    assert mpicomm.is_validation_enabled()
    mpicomm.set_validation(False)
    for flag in ("no", 1, None):
        with pytest.raises(ArgumentTypeError, match="barrier: async_op is"):
            mpicomm.barrier(async_op=flag)  # type: ignore[arg-type]
        with pytest.raises(ArgumentTypeError, match="all_reduce: async_op is"):
            mpicomm.all_reduce(np.ones(2), async_op=flag)  # type: ignore[arg-type]
    mpicomm.set_validation(True)


def test_an_mpi_error_becomes_a_communication_error_naming_the_function(world: mpicomm.ProcessGroup) -> None:
    mpicomm.set_validation(False)
    from mpicomm.core.calls import collective

    @collective("probe")
    def probe(group: Any = None) -> None:
        # a destination MPI itself refuses (MPI_ERR_RANK), found locally on every rank: no peer waits
        world.comm.Send([np.ones(4), MPI.DOUBLE], dest=world.size() + 5, tag=0)

    with pytest.raises(mpicomm.CommunicationError, match="probe: MPI reported an error") as info:
        probe()
    assert isinstance(info.value.__cause__, MPI.Exception)
    assert isinstance(info.value, MpicommError)
    mpicomm.set_validation(True)
