"""KJTAllToAll's plan cache: repeated shapes reuse a plan, changed shapes never get a stale one.

Every rank builds all ranks' inputs from a shared seed, runs one KJTAllToAll object through a
sequence of calls whose shapes repeat and change (batch sizes, lengths with the same totals, keys,
VBE tables, weights, dtypes, other ranks' shapes only), and checks each output against the plain
numpy reference of tests/unit/test_jagged_reference.py, on both data paths.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI
from unit.test_jagged_reference import RankInput, check_output, reference_all_to_all

import mpicomm
from mpicomm.core import cmpi
from mpicomm.jagged import KeyedJaggedArray, KJTAllToAll
from mpicomm.jagged.hot import Repeat
from mpicomm.jagged.kjt import _Placement
from mpicomm.jagged.wire import _fingerprint


@pytest.fixture(autouse=True, params=["gather", "in_place"])
def placement(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run every test on both paths: Ialltoallv plus a numpy recat, and Ialltoallw into place."""
    saved = _Placement.min_values
    _Placement.min_values = 0 if request.param == "in_place" else 2**62
    try:
        yield request.param
    finally:
        _Placement.min_values = saved


def everyone(
    world: int,
    seed: int,
    strides: list[int],
    *,
    keys: list[str],
    vbe: list[dict[str, int]] | None = None,
    weighted: bool = False,
    dtype: Any = np.int64,
    shuffle: bool = False,
) -> list[RankInput]:
    """All ranks' inputs: rank r has ``strides[r]`` slots per key (or ``vbe[r][key]``), lengths 0-3.

    ``shuffle`` permutes each rank's lengths over its slots: the same totals, other per-key counts.
    """
    inputs = []
    for r in range(world):
        rng = np.random.default_rng([seed, r])
        slots = {k: (vbe[r][k] if vbe is not None else strides[r]) for k in keys}
        lens = rng.integers(0, 4, sum(slots.values()))
        if shuffle:
            lens = rng.permutation(lens)
        it = iter(lens.tolist())
        rows = {k: [rng.integers(0, 1000, next(it)).astype(dtype) for _ in range(slots[k])] for k in keys}
        weights = None
        if weighted:
            weights = {k: [np.full(x.size, 0.5 + r, np.float32) for x in rows[k]] for k in keys}
        inputs.append(RankInput(keys, rows, weights, vbe is not None, np.int64, strides[r], slots, dtype))
    return inputs


def run(a2a: KJTAllToAll, inputs: list[RankInput], splits: list[int], rank: int) -> None:
    """One call of ``a2a`` on this rank's input, checked against the reference."""
    check_output(a2a(inputs[rank].to_kja()).wait(), reference_all_to_all(inputs, splits)[rank])


def plans(a2a: KJTAllToAll) -> tuple[int, list[int]]:
    """Send plans held, and receive plans held by each."""
    held = a2a._send.values()
    return len(held), [len(p.recv) for p in held]


def test_repeated_shapes_reuse_a_plan_and_changed_shapes_get_a_new_one(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    splits = [2] * w
    keys = [f"k{i}" for i in range(2 * w)]
    a2a = KJTAllToAll(splits)
    base = [2 + (s % 3) for s in range(w)]
    one = (1, [1]) if w > 1 else (0, [])  # at one rank nothing moves and nothing is planned
    run(a2a, everyone(w, 1, base, keys=keys), splits, r)
    assert plans(a2a) == one
    for seed in (2, 3):  # same shape, new lengths: the plan is reused
        run(a2a, everyone(w, seed, base, keys=keys), splits, r)
    run(a2a, everyone(w, 2, base, keys=keys, shuffle=True), splits, r)  # same totals, other per-key counts
    run(a2a, everyone(w, 4, base, keys=[f"x{i}" for i in range(2 * w)]), splits, r)  # renamed keys
    assert plans(a2a) == one
    shifted = base[1:] + base[:1]  # the same strides, moved one rank along: every rank's shape changes
    run(a2a, everyone(w, 5, shifted, keys=keys), splits, r)
    others = [base[0]] + [b + 1 for b in base[1:]]  # on rank 0 only what it receives changes
    run(a2a, everyone(w, 6, others, keys=keys), splits, r)
    vbe = [{k: base[s] + (i % 2) for i, k in enumerate(keys)} for s in range(w)]
    run(a2a, everyone(w, 7, base, keys=keys, vbe=vbe), splits, r)
    swapped = [{k: base[s] + 1 - (i % 2) for i, k in enumerate(keys)} for s in range(w)]  # same totals
    run(a2a, everyone(w, 8, base, keys=keys, vbe=swapped), splits, r)
    run(a2a, everyone(w, 9, base, keys=keys, weighted=True), splits, r)
    run(a2a, everyone(w, 10, base, keys=keys, dtype=np.float32), splits, r)
    run(a2a, everyone(w, 11, base, keys=keys), splits, r)  # back to the first shape, served from cache
    sends, recvs = plans(a2a)
    assert sends <= _Placement.plans and all(n <= 8 for n in recvs)


def test_plans_of_two_exchanges_with_different_splits_stay_apart(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    keys = [f"k{i}" for i in range(2 * w)]
    first, second = [2] * w, [2 * w] + [0] * (w - 1)
    a, b = KJTAllToAll(first), KJTAllToAll(second)
    strides = [1 + s for s in range(w)]
    for seed in range(3):  # the same input shape through both, interleaved
        inputs = everyone(w, seed, strides, keys=keys)
        run(a, inputs, first, r)
        run(b, inputs, second, r)


def test_the_plan_cache_is_bounded(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    keys = [f"k{i}" for i in range(w)]
    a2a = KJTAllToAll([1] * w)
    for stride in range(_Placement.plans + 4):  # more shapes of this rank than the cache holds
        run(a2a, everyone(w, stride, [stride] * w, keys=keys), [1] * w, r)
    assert plans(a2a)[0] == (_Placement.plans if w > 1 else 0)
    for other in range(12):  # one shape on rank 0, more shapes of the others than a send plan keeps
        strides = [3] + [3 + other] * (w - 1)
        run(a2a, everyone(w, other, strides, keys=keys), [1] * w, r)
    assert all(n <= 8 for n in plans(a2a)[1])
    run(a2a, everyone(w, 99, [0] * w, keys=keys), [1] * w, r)  # an evicted shape comes back right


@pytest.mark.mpi(min_size=2)
@pytest.mark.usefixtures("validation_off")  # rank 0 forges the wire by hand, outside validation's exchange
def test_forged_per_key_counts_are_refused_before_allocating(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    keys = [f"k{i}" for i in range(w)]
    mine = KeyedJaggedArray(keys, np.zeros(w), lengths=np.ones(w, np.int64))
    a2a = KJTAllToAll([1] * w)
    lay = a2a._layout
    for forged, words in ((2**50, "values"), (-3, "values"), (-1, "batch slots")):
        if r == 0:  # speaks the counts message by hand: agreement, then forged counts
            fp = np.array([a2a._fp, -a2a._fp], np.int64)
            world.internal.Allreduce([fp, MPI.INT64_T], [np.empty_like(fp), MPI.INT64_T], op=MPI.MAX)
            header = lay.empty_header()
            header[:, 1] = _fingerprint(*_dtype_parts(mine))
            header[:, 2], header[:, 3] = a2a._fp, 1
            header[:, 4], header[:, lay.values0] = 1, 1
            header[:, 4 if words == "batch slots" else lay.values0] = forged
            world.internal.Alltoall([header, MPI.INT64_T], [np.empty_like(header), MPI.INT64_T])
        else:
            fresh = KJTAllToAll([1] * w)
            with pytest.raises(mpicomm.CommunicationError, match=f"KJTAllToAll: .*{words}.*rank 0") as info:
                fresh(mine)
            assert str(forged) in str(info.value)
        MPI.COMM_WORLD.Barrier()


def _dtype_parts(kja: KeyedJaggedArray) -> tuple[Any, ...]:
    v = kja.values()
    return (str(kja.lengths().dtype), v.dtype.str, v.shape[1:], None)


def test_narrow_lengths_whose_total_passes_their_dtype_move_right(world: mpicomm.ProcessGroup) -> None:
    # uint16 lengths of 40,000 and 30,000 values per key: their running sum passes 65,535
    w, r = world.size(), world.rank()
    keys = ["a", "b"]
    sizes = {"a": 40000, "b": 30000}

    def rows(s: int) -> dict[str, list[np.ndarray]]:
        return {k: [np.full(n, 10 * s + i, np.int8)] for i, (k, n) in enumerate(sizes.items())}

    slots = dict.fromkeys(keys, 1)
    inputs = [RankInput(keys, rows(s), None, False, np.uint16, 1, slots, np.int8) for s in range(w)]
    splits = [2] + [0] * (w - 1)
    got = KJTAllToAll(splits)(inputs[r].to_kja()).wait()
    check_output(got, reference_all_to_all(inputs, splits)[r])


def _held(a2a: KJTAllToAll) -> tuple[int, int]:
    """Sent and Arrived entries held over all plans of ``a2a``."""
    sends = a2a._send.values()
    return sum(len(p.sent) for p in sends), sum(len(r.arrived) for p in sends for r in p.recv.values())


def test_repeated_value_counts_reuse_the_counts_message_and_new_counts_are_never_served_stale(
    world: mpicomm.ProcessGroup,
) -> None:
    w, r = world.size(), world.rank()
    splits, keys = [2] * w, [f"k{i}" for i in range(2 * w)]
    a2a = KJTAllToAll(splits)
    base = [2 + (s % 3) for s in range(w)]
    first = everyone(w, 21, base, keys=keys)
    run(a2a, first, splits, r)
    held = _held(a2a)
    for _ in range(3):  # the same lengths: the same Sent and Arrived, nothing new made
        run(a2a, first, splits, r)
    assert _held(a2a) == held
    # each key's rows reversed: the same value counts per key, other lengths (sent inline here)
    reversed_rows = [replace(x, rows={k: v[::-1] for k, v in x.rows.items()}) for x in first]
    # the same shape with other counts, then counts that keep every total: each gets its own plan
    others = (everyone(w, 22, base, keys=keys), everyone(w, 21, base, keys=keys, shuffle=True))
    for inputs in (reversed_rows, *others):
        run(a2a, inputs, splits, r)
        run(a2a, first, splits, r)  # and the first counts, served again, still give the right output
    if w > 1:
        assert _held(a2a)[0] <= 4 and _held(a2a)[1] <= 4  # bounded (see repeat._ARRIVED)


def test_lengths_inline_or_not_mix_across_ranks(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    splits, keys = [1] * w, [f"k{i}" for i in range(w)]
    a2a = KJTAllToAll(splits)
    cap = a2a._layout.cap
    for strides in ([1] * w, [cap + 1] + [1] * (w - 1), [cap] * w, [cap + 1] * w):
        run(a2a, everyone(w, sum(strides), strides, keys=keys, weighted=True), splits, r)
    # narrow and unsigned lengths travel inline as int64 and come back in their own dtype
    for dtype in (np.uint16, np.int32, np.uint64):
        inputs = everyone(w, 30, [2] * w, keys=keys)
        for x in inputs:
            x.lengths_dtype = dtype
        got = a2a(inputs[r].to_kja()).wait()
        assert got.lengths().dtype == dtype
        check_output(got, reference_all_to_all(inputs, splits)[r])


@pytest.mark.mpi(min_size=2)
@pytest.mark.usefixtures("validation_off")  # rank 0 forges the wire by hand, outside validation's exchange
@pytest.mark.parametrize("forged", ["flag 2", "over the cap"])
def test_forged_inline_lengths_are_refused(world: mpicomm.ProcessGroup, forged: str) -> None:
    w, r = world.size(), world.rank()
    keys = [f"k{i}" for i in range(w)]
    mine = KeyedJaggedArray(keys, np.zeros(w), lengths=np.ones(w, np.int64))
    a2a = KJTAllToAll([1] * w)
    lay = a2a._layout
    if r == 0:  # agreement, then a counts message with a forged inline part
        fp = np.array([a2a._fp, -a2a._fp], np.int64)
        world.internal.Allreduce([fp, MPI.INT64_T], [np.empty_like(fp), MPI.INT64_T], op=MPI.MAX)
        rows = 1 if forged == "flag 2" else lay.cap + 1
        header = lay.empty_header()
        header[:, 1] = _fingerprint(*_dtype_parts(mine))
        header[:, 2], header[:, 3], header[:, 4] = a2a._fp, rows, rows
        header[:, lay.inline_col] = 2 if forged == "flag 2" else 1
        world.internal.Alltoall([header, MPI.INT64_T], [np.empty_like(header), MPI.INT64_T])
    else:
        words = "the inline flag 2" if forged == "flag 2" else f"{lay.cap + 1} batch slots inline"
        with pytest.raises(mpicomm.CommunicationError, match=f"KJTAllToAll: rank 0 sends {words}"):
            a2a(mine)
    MPI.COMM_WORLD.Barrier()


def _repeats(a2a: KJTAllToAll) -> int:
    """Sent entries holding a repeat (a message checked once, served again without the lookups)."""
    return sum(isinstance(s.hot, Repeat) for p in a2a._send.values() for s in p.sent.values())


def _shifted(inputs: list[RankInput], i: int) -> list[RankInput]:
    """The same lengths, every value plus ``1000 * i``."""
    return [replace(x, rows={k: [a + 1000 * i for a in v] for k, v in x.rows.items()}) for x in inputs]


@pytest.mark.parametrize("weighted", [False, True])
def test_a_repeated_message_moves_each_calls_values_and_gives_fresh_arrays(
    world: mpicomm.ProcessGroup, placement: str, weighted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    w, r = world.size(), world.rank()
    answers: list[Any] = []  # what the C call of a repeat answered (True: done, False: another message)

    def counted(*args: Any, c: Any = cmpi.kjt_repeat) -> Any:
        answers.append(c(*args))
        return answers[-1]

    monkeypatch.setattr(cmpi, "kjt_repeat", counted)
    splits, keys = [2] * w, [f"k{i}" for i in range(2 * w)]
    a2a = KJTAllToAll(splits)
    first = everyone(w, 41, [2 + (s % 3) for s in range(w)], keys=keys, weighted=weighted)
    outs = []
    for i in range(4):  # the same counts every call, other values each call
        got = a2a(_shifted(first, i)[r].to_kja()).wait()
        check_output(got, reference_all_to_all(_shifted(first, i), splits)[r])
        outs.append(got)
    if w > 1:  # the third call on took the repeat on the gather path, never on the placed one
        assert _repeats(a2a) == (1 if placement == "gather" else 0)
        # one C call each without weights (NotImplemented without the C module), none with them
        fused, c = placement == "gather" and not weighted, cmpi.bound() is None
        assert answers == ([] if not fused else [True, True] if c else [NotImplemented] * 2)
    outs[2].lengths()[:] = 7  # each call's output owns its arrays
    outs[2].values()[:] = 7
    check_output(outs[3], reference_all_to_all(_shifted(first, 3), splits)[r])
    # only the last rank's lengths change: this rank sends the same message, receives another one
    changed = [*first[:-1], everyone(w, 42, [2 + ((w - 1) % 3)] * w, keys=keys, weighted=weighted)[-1]]
    for _ in range(3):
        run(a2a, changed, splits, r)
    run(a2a, first, splits, r)
    if w > 1 and fused and c and r < w - 1:  # the same message sent, another received: the general path
        assert answers[2] is False
