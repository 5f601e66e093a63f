"""The jagged all-to-all across ranks: the worked examples, the numpy reference at any size, and errors.

Every rank builds the global input (all ranks' KeyedJaggedArrays) from the same seed or hypothesis
draw, runs the collective on its own part and checks its output against the plain-numpy reference of
tests/unit/test_jagged_reference.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi4py import MPI
from unit.test_jagged_reference import (
    SAME_ON_EVERY_RANK,
    check_output,
    global_inputs,
    received_rows,
    reference_all_to_all,
    stagger_order,
)

import mpicomm
from mpicomm import jagged_all_to_all
from mpicomm.core.control import allgather_texts
from mpicomm.core.work import Work
from mpicomm.errors import ArgumentError, ArgumentTypeError, CrossRankMismatchError
from mpicomm.jagged import (
    JaggedResult,
    KeyedJaggedArray,
    KJTAllToAll,
    KJTAllToAllAwaitable,
)
from mpicomm.jagged.kjt import _Placement


@pytest.fixture(autouse=True, params=["gather", "in_place"])
def placement(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run every test on both paths: Ialltoallv plus a numpy recat, and Ialltoallw into place."""
    saved = _Placement.min_values
    _Placement.min_values = 0 if request.param == "in_place" else 2**62
    try:
        yield request.param
    finally:
        _Placement.min_values = saved


def kja(keys: list[str], lengths: list[int], values: list[int], **kw: object) -> KeyedJaggedArray:
    return KeyedJaggedArray(
        keys, np.array(values, dtype=np.int64), lengths=np.array(lengths, dtype=np.int64), **kw
    )  # type: ignore[arg-type]


def only_at(world: mpicomm.ProcessGroup, size: int) -> None:
    if world.size() != size:
        pytest.skip(f"needs exactly {size} ranks")


# --------------------------------------------------------------------------------------------------
# the worked examples of the reference semantics, §2.6-2.9

SEED_INPUT = [
    kja(["A", "B", "C"], [1, 0, 2, 0, 1, 1, 1, 1, 0], [100, 101, 102, 200, 201, 300, 301]),
    kja(["A", "B", "C"], [1, 1, 0, 0, 1, 2, 1, 1, 0], [103, 104, 202, 203, 204, 302, 303]),
]


@pytest.mark.mpi(min_size=2)
def test_seed_example_2_6_orders_by_key_then_source(world: mpicomm.ProcessGroup) -> None:
    only_at(world, 2)
    out = KJTAllToAll([2, 1])(SEED_INPUT[world.rank()]).wait()
    if world.rank() == 0:
        assert out == kja(
            ["A", "B"],
            [1, 0, 2, 1, 1, 0, 0, 1, 1, 0, 1, 2],
            [100, 101, 102, 103, 104, 200, 201, 202, 203, 204],
        )
        assert out.offsets().tolist() == [0, 1, 1, 3, 4, 5, 5, 5, 6, 7, 7, 8, 10]
        assert out.length_per_key() == [5, 5] and out.offset_per_key() == [0, 5, 10]
    else:
        assert out == kja(["C"], [1, 1, 0, 1, 1, 0], [300, 301, 302, 303])
        assert out.length_per_key() == [4] and out.offset_per_key() == [0, 4]
    assert out.stride() == 6


@pytest.mark.mpi(min_size=2)
def test_variable_batch_per_rank_2_7_sums_the_strides(world: mpicomm.ProcessGroup) -> None:
    only_at(world, 2)
    rank1 = kja(["A", "B", "C"], [1, 1, 0, 2, 1, 0], [103, 104, 202, 203, 302])
    out = KJTAllToAll([2, 1])([SEED_INPUT[0], rank1][world.rank()]).wait()
    if world.rank() == 0:
        assert out == kja(
            ["A", "B"], [1, 0, 2, 1, 1, 0, 1, 1, 0, 2], [100, 101, 102, 103, 104, 200, 201, 202, 203]
        )
    else:
        assert out == kja(["C"], [1, 1, 0, 1, 0], [300, 301, 302])
    assert out.stride() == 5


@pytest.mark.mpi(min_size=2)
def test_vbe_2_8_carries_stride_per_key_per_rank(world: mpicomm.ProcessGroup) -> None:
    only_at(world, 2)
    inputs = [
        kja(["A", "B", "C"], [1, 2, 1, 0], [100, 101, 102, 200], stride_per_key_per_rank=[[2], [1], [1]]),
        kja(
            ["A", "B", "C"],
            [3, 0, 2, 1, 1],
            [103, 104, 105, 201, 202, 300, 301],
            stride_per_key_per_rank=[[1], [2], [2]],
        ),
    ]
    out = KJTAllToAll([2, 1])(inputs[world.rank()]).wait()
    if world.rank() == 0:
        want = kja(["A", "B"], [1, 2, 3, 1, 0, 2], [100, 101, 102, 103, 104, 105, 200, 201, 202],
                   stride_per_key_per_rank=[[2, 1], [1, 2]])  # fmt: skip
    else:
        want = kja(["C"], [0, 1, 1], [300, 301], stride_per_key_per_rank=[[1, 2]])
    assert out == want and out.stride() == 3


@pytest.mark.mpi(min_size=2)
def test_rank_with_zero_keys_2_9_still_gets_the_stride(world: mpicomm.ProcessGroup) -> None:
    only_at(world, 2)
    out = KJTAllToAll([0, 3])(SEED_INPUT[world.rank()]).wait()
    if world.rank() == 0:
        assert out.keys() == [] and out.lengths().size == 0 and out.values().size == 0
    else:
        assert out.keys() == ["A", "B", "C"]
        assert out.lengths().tolist() == [1, 0, 2, 1, 1, 0, 0, 1, 1, 0, 1, 2, 1, 1, 0, 1, 1, 0]
    assert out.stride() == 6


def test_all_strides_zero_move_nothing(world: mpicomm.ProcessGroup) -> None:
    keys = [f"k{i}" for i in range(world.size())]
    empty = KeyedJaggedArray(keys, np.empty(0, np.float32), lengths=np.empty(0, np.int32))
    out = KJTAllToAll([1] * world.size())(empty).wait()
    assert out.keys() == [keys[world.rank()]] and out.stride() == 0
    assert out.values().dtype == np.float32 and out.lengths().dtype == np.int32


def test_world_size_one_returns_the_input(world: mpicomm.ProcessGroup) -> None:
    solo = mpicomm.new_group([world.ranks[0]])
    if solo.is_member:
        out = KJTAllToAll([3], group=solo)(SEED_INPUT[0]).wait()
        assert out is SEED_INPUT[0]


@pytest.mark.mpi(min_size=4)
def test_stagger_two_at_four_ranks_orders_sources_0_2_1_3(world: mpicomm.ProcessGroup) -> None:
    only_at(world, 4)
    r = world.rank()
    mine = kja(["A", "B", "C", "D"], [1, 1, 1, 1], [10 * r, 10 * r + 1, 10 * r + 2, 10 * r + 3])
    out = KJTAllToAll([1, 1, 1, 1], stagger=2)(mine).wait()
    assert out.values().tolist() == [10 * s + r for s in (0, 2, 1, 3)]


# --------------------------------------------------------------------------------------------------
# the reference at every size


@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_kjt_all_to_all_matches_numpy_reference(data: st.DataObject) -> None:
    world = mpicomm.init()
    inputs, splits, stagger = data.draw(global_inputs(world.size()))
    handle = KJTAllToAll(splits, stagger=stagger)(inputs[world.rank()].to_kja())
    assert isinstance(handle, KJTAllToAllAwaitable)
    check_output(handle.wait(), reference_all_to_all(inputs, splits, stagger)[world.rank()])
    assert handle.is_completed()


@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_trailing_dimensions_travel_with_the_values(data: st.DataObject) -> None:
    world = mpicomm.init()
    inputs, splits, stagger = data.draw(global_inputs(world.size()))
    for i in inputs:
        i.rows = {k: [np.stack([x, x + 1], axis=1) for x in rows] for k, rows in i.rows.items()}
    flat = inputs[world.rank()].to_kja()
    values = flat.values() if flat.values().ndim == 2 else flat.values().reshape(0, 2)  # a rank with no rows
    mine = KeyedJaggedArray(flat.keys(), values, lengths=flat.lengths(), weights=flat.weights(),
                            stride=None if flat.keys() else flat.stride(),
                            stride_per_key_per_rank=flat.stride_per_key_per_rank())  # fmt: skip
    got = KJTAllToAll(splits, stagger=stagger)(mine).wait()
    want = reference_all_to_all(inputs, splits, stagger)[world.rank()]
    assert got.values().shape[1:] == (2,) or got.values().size == 0
    np.testing.assert_array_equal(got.values().reshape(-1, 2), want["values"].reshape(-1, 2))
    assert got.lengths().tolist() == want["lengths"]


def migrate(
    world: mpicomm.ProcessGroup, seed: int
) -> tuple[list[np.ndarray], list[list[int]], list[np.ndarray]]:
    """All ranks' particles (rows of 3-D positions, a row per cell) and where each cell goes."""
    rng = np.random.default_rng(seed)
    lengths, splits, values = [], [], []
    for _ in range(world.size()):
        cells = rng.integers(0, 4, world.size())  # cells destined for each rank
        lens = rng.integers(0, 3, int(cells.sum()))
        lengths.append(lens)
        splits.append(cells.tolist())
        values.append(rng.random((int(lens.sum()), 3)))
    return lengths, splits, values


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_jagged_all_to_all_moves_rows_like_the_reference(
    world: mpicomm.ProcessGroup, seed: int, async_op: bool
) -> None:
    lengths, splits, values = migrate(world, seed)
    r = world.rank()
    got = jagged_all_to_all(values[r], lengths[r], splits[r], async_op=async_op)
    if async_op:
        assert isinstance(got, Work)
        got = JaggedResult(*got.result())
    assert isinstance(got, JaggedResult)
    want_l, want_v = received_rows(r, lengths, values, splits)
    assert got.splits == [splits[s][r] for s in range(world.size())]
    np.testing.assert_array_equal(got.lengths, want_l)
    np.testing.assert_array_equal(got.values, want_v)
    assert got.values.shape[1:] == (3,)


# --------------------------------------------------------------------------------------------------
# errors, the same on every rank


@pytest.fixture
def validating() -> Iterator[None]:
    saved = mpicomm.is_validation_enabled()
    mpicomm.set_validation(True)
    try:
        yield
    finally:
        mpicomm.set_validation(saved)  # as it was: under MPICOMM_VALIDATE=1 the rest runs validated too


#: What every validation mismatch message says after the function's name.
FOUND = "validation found ranks that disagree: "


def per_rank(world: mpicomm.ProcessGroup, value: Callable[[int], object]) -> str:
    """What a validation message lists after ``... differs: ``: each rank's value, in rank order."""
    return ", ".join(f"rank {r}: {value(r)}" for r in range(world.size()))


def mismatch_on_every_rank(call: Callable[[], object], words: str, validated: bool) -> None:
    """``call`` raises CrossRankMismatchError matching ``words``; validated, the same text on every rank."""
    with pytest.raises(CrossRankMismatchError, match=words) as info:
        call()
    if validated:
        texts = [t.decode() for _, t in allgather_texts(MPI.COMM_WORLD, 0, str(info.value).encode())]
        assert all(t == texts[0] for t in texts), texts


@pytest.mark.mpi(min_size=2)
def test_splits_of_the_wrong_length_name_the_group_size(world: mpicomm.ProcessGroup) -> None:
    with pytest.raises(
        ArgumentError,
        match=rf"KJTAllToAll: splits has {world.size() + 1} entries; "
        rf"expected {world.size()} \(the group size\)",
    ):
        KJTAllToAll([1] * (world.size() + 1))
    with pytest.raises(ArgumentError, match="jagged_all_to_all: send_splits has 1 entries; expected"):
        jagged_all_to_all(np.arange(3), np.array([3]), [1])


@pytest.mark.mpi(min_size=2)
def test_negative_and_non_integer_splits_are_refused(world: mpicomm.ProcessGroup) -> None:
    with pytest.raises(ArgumentError, match="splits has a negative entry -1"):
        KJTAllToAll([-1] + [1] * (world.size() - 1))
    with pytest.raises(ArgumentTypeError, match="splits is"):
        KJTAllToAll([0.5] * world.size())  # type: ignore[list-item]
    with pytest.raises(
        ArgumentError, match=rf"stagger is {world.size() + 1}; expected a positive divisor of {world.size()}"
    ):
        KJTAllToAll([0] * world.size(), stagger=world.size() + 1)


@pytest.mark.mpi(min_size=2)
def test_key_count_must_equal_the_sum_of_splits(world: mpicomm.ProcessGroup) -> None:
    with pytest.raises(ArgumentError, match=r"has 3 keys; expected 2, the sum of splits"):
        KJTAllToAll([2] + [0] * (world.size() - 1))(SEED_INPUT[0])
    with pytest.raises(ArgumentTypeError, match="the input is a dict; expected a KeyedJaggedArray"):
        KJTAllToAll([3] + [0] * (world.size() - 1))({})  # type: ignore[arg-type]


@pytest.mark.mpi(min_size=2)
def test_non_integer_lengths_are_refused(world: mpicomm.ProcessGroup) -> None:
    with pytest.raises(
        ArgumentTypeError, match="jagged_all_to_all: lengths has dtype float64; expected an integer"
    ):
        jagged_all_to_all(np.arange(3), np.array([3.0]), [1] + [0] * (world.size() - 1))
    with pytest.raises(ArgumentTypeError, match="KeyedJaggedArray: lengths has dtype float32"):
        KeyedJaggedArray(["A"], np.arange(3), lengths=np.array([3.0], dtype=np.float32))


@pytest.mark.mpi(min_size=2)
def test_splits_that_differ_between_ranks_fail_on_every_rank(
    world: mpicomm.ProcessGroup, validated: bool
) -> None:
    keys = [f"k{i}" for i in range(world.size())]
    mine = KeyedJaggedArray(keys, np.empty(0), lengths=np.zeros(world.size(), np.int64))

    def splits(rank: int) -> list[int]:
        return [1] * world.size() if rank else [2, 0] + [1] * (world.size() - 2)

    words = "KJTAllToAll: ranks disagree about splits or stagger"
    if validated:
        words = f"KJTAllToAll: {FOUND}splits differs: " + per_rank(world, splits)
    mismatch_on_every_rank(lambda: KJTAllToAll(splits(world.rank()))(mine), re.escape(words), validated)


@pytest.mark.mpi(min_size=3)
def test_two_agreed_exchanges_used_crosswise_fail_on_every_rank(
    world: mpicomm.ProcessGroup, validated: bool
) -> None:
    # each object passes its first-call agreement check; then rank 0 uses the other one
    keys = ["A", "B"]
    mine = KeyedJaggedArray(keys, np.zeros(2), lengths=np.ones(2, np.int64))
    first = KJTAllToAll([1, 1] + [0] * (world.size() - 2))
    second = KJTAllToAll([1, 0, 1] + [0] * (world.size() - 3))
    assert first(mine).wait().values().tolist() == ([0.0] * world.size() if world.rank() < 2 else [])
    assert second(mine).wait().keys() == (["A"] if world.rank() == 0 else ["B"] if world.rank() == 2 else [])
    words = "KJTAllToAll: ranks disagree about splits or stagger"
    if validated:
        used = per_rank(world, lambda r: (second if r == 0 else first).splits)
        words = f"KJTAllToAll: {FOUND}splits differs: {used}"
    crosswise = second if world.rank() == 0 else first
    mismatch_on_every_rank(lambda: crosswise(mine), re.escape(words), validated)
    assert first(mine).wait().stride() == world.size()  # the group is still usable


@pytest.mark.mpi(min_size=2)
def test_dtypes_or_weights_that_differ_between_ranks_fail_on_every_rank(
    world: mpicomm.ProcessGroup, validated: bool
) -> None:
    splits = [1] + [0] * (world.size() - 1)

    def dtype(rank: int) -> type[np.floating[Any]]:
        return np.float32 if rank else np.float64

    mine = KeyedJaggedArray(["A"], np.zeros(2, dtype(world.rank())), lengths=np.array([2]))
    words = "KJTAllToAll: ranks disagree about dtypes"
    if validated:  # lengths, values, their trailing shape, the weights' (none here)
        dtypes = per_rank(world, lambda r: ["int64", np.dtype(dtype(r)).str, [], None])
        words = f"KJTAllToAll: {FOUND}dtypes differs: {dtypes}"
    mismatch_on_every_rank(lambda: KJTAllToAll(splits)(mine), re.escape(words), validated)

    weights = np.ones(2) if world.rank() else None
    mine = KeyedJaggedArray(["A"], np.zeros(2), lengths=np.array([2]), weights=weights)
    words = "KJTAllToAll: ranks disagree about weights or VBE"
    if validated:
        words = f"KJTAllToAll: {FOUND}weighted differs: " + per_rank(world, lambda r: r > 0)
    mismatch_on_every_rank(lambda: KJTAllToAll(splits)(mine), re.escape(words), validated)

    def int_dtype(rank: int) -> type[np.signedinteger[Any]]:
        return np.int32 if rank else np.int64

    values = np.zeros(2, int_dtype(world.rank()))
    words = "jagged_all_to_all: ranks disagree about dtypes"
    if validated:
        dtypes = per_rank(world, lambda r: ["int64", np.dtype(int_dtype(r)).str, []])
        words = f"jagged_all_to_all: {FOUND}lengths dtype, values dtype, value shape differs: {dtypes}"
    lengths = np.array([2], np.int64)
    mismatch_on_every_rank(lambda: jagged_all_to_all(values, lengths, splits), re.escape(words), validated)


@pytest.mark.mpi(min_size=2)
def test_keys_that_differ_between_ranks_fail_under_validation(
    world: mpicomm.ProcessGroup, validating: None
) -> None:
    keys = ["A", "B"] if world.rank() else ["B", "A"]
    mine = KeyedJaggedArray(keys, np.empty(0), lengths=np.zeros(2, np.int64))
    with pytest.raises(
        CrossRankMismatchError, match="KJTAllToAll: validation found ranks that disagree: keys differ"
    ):
        KJTAllToAll([2] + [0] * (world.size() - 1))(mine)


@pytest.mark.mpi(min_size=2)
def test_validation_passes_agreeing_calls(world: mpicomm.ProcessGroup, validating: None) -> None:
    keys = [f"k{i}" for i in range(world.size())]
    mine = KeyedJaggedArray(
        keys, np.full(world.size(), world.rank()), lengths=np.ones(world.size(), np.int64)
    )
    out = KJTAllToAll([1] * world.size())(mine).wait()
    assert out.values().tolist() == list(range(world.size()))
    got = jagged_all_to_all(np.arange(world.size()), np.ones(world.size(), np.int64), [1] * world.size())
    assert isinstance(got, JaggedResult) and got.values.tolist() == [world.rank()] * world.size()


def test_stagger_order_helper_is_a_permutation(world: mpicomm.ProcessGroup) -> None:
    assert sorted(stagger_order(world.size(), 1)) == list(range(world.size()))
