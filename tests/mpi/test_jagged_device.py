"""The jagged all-to-all on device arrays over real MPI, with the fake cupy (tests/fakecupy) active.

Every rank builds the global input from the same hypothesis draw or seed, copies its part to the
"device", runs the collective and checks its slice against the plain-numpy reference of
tests/unit/test_jagged_reference.py. Both device paths run: staged (pinned host buffers around the
host path's MPI calls) and direct (device memory to MPI: the fake's memory is host memory, so the
MPICH wheel carries it as a CUDA-aware MPI would). This proves plumbing, stream order and the MPI
calls, never GPU behaviour (tests/gpu/test_jagged_gpu.py does that on a GPU).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fakecupy
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from standin import ForeignDeviceArray
from unit.test_jagged_reference import (
    SAME_ON_EVERY_RANK,
    RankInput,
    check_output,
    global_inputs,
    received_rows,
    reference_all_to_all,
)

import mpicomm
from mpicomm import KeyedJaggedArray, KJTAllToAll
from mpicomm.errors import ArgumentError, ArgumentTypeError, CrossRankMismatchError
from mpicomm.front import device as front
from mpicomm.gpu import cuda_aware, staged
from mpicomm.jagged import KeyedJaggedArray as HostKJA
from mpicomm.jagged.kjt import _Placement


@pytest.fixture(autouse=True)
def cp() -> Iterator[Any]:
    """The fake cupy, active for each test (mpicomm's backend and pool use it)."""
    yield from fakecupy.fixture()


@pytest.fixture(params=["staged", "direct"])
def path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each device test on both paths: MPICOMM_CUDA_AWARE=0 (staged) and =1 (direct)."""
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "1" if request.param == "direct" else "0")
    cuda_aware.reset_cuda_awareness()
    front.PATHS.clear()
    yield request.param
    cuda_aware.reset_cuda_awareness()


@pytest.fixture(params=["gather", "in_place"])
def placement(request: pytest.FixtureRequest) -> Iterator[str]:
    """The host's two protocols, which a staged device rank must follow (small and large exchanges)."""
    saved = _Placement.min_values
    _Placement.min_values = 0 if request.param == "in_place" else 2**62
    try:
        yield request.param
    finally:
        _Placement.min_values = saved


def on_device(cp: Any, inp: RankInput) -> KeyedJaggedArray:
    """This rank's input as a KeyedJaggedArray of device arrays (through the public class)."""
    host = inp.to_kja()
    w = host.weights()
    return KeyedJaggedArray(
        host.keys(),
        cp.asarray(host.values()),
        None if w is None else cp.asarray(w),
        lengths=cp.asarray(host.lengths()),
        stride=None if host.keys() else host.stride(),
        stride_per_key_per_rank=host.stride_per_key_per_rank(),
    )


def to_host(cp: Any, out: Any) -> HostKJA:
    """The output's device arrays, checked to be device arrays, copied into a numpy KeyedJaggedArray."""
    assert isinstance(out.values(), cp.ndarray) and isinstance(out.lengths(), cp.ndarray)
    w = out.weights()
    assert w is None or isinstance(w, cp.ndarray)
    return HostKJA._trusted(
        out.keys(),
        out.values().get(),
        out.lengths().get(),
        None if w is None else w.get(),
        out.stride(),
        out.stride_per_key_per_rank(),
    )


def expected_path(path: str, world: mpicomm.ProcessGroup) -> dict[tuple[str, str], int]:
    return {} if world.size() == 1 else {("KJTAllToAll", path): 1}


# --------------------------------------------------------------------------------------------------
# the reference, on both paths and both protocols


@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_kjt_on_device_matches_the_numpy_reference(
    cp: Any, path: str, placement: str, data: st.DataObject
) -> None:
    """VBE, weights, zero-key ranks, staggers, dtypes: whatever the draw gives, on every path."""
    world = mpicomm.init()
    inputs, splits, stagger = data.draw(global_inputs(world.size()))
    want = reference_all_to_all(inputs, splits, stagger)[world.rank()]
    handle = KJTAllToAll(splits, stagger=stagger)(on_device(cp, inputs[world.rank()]))
    check_output(to_host(cp, handle.wait()), want)
    assert handle.is_completed()
    assert staged.pool().stats().bytes_in_use == 0  # every pinned buffer is back


def one_key_per_rank(cp: Any, world: mpicomm.ProcessGroup, weighted: bool = False) -> KeyedJaggedArray:
    """Key k goes to rank k: one slot of one value, 10 * rank + k (weights: the value / 2)."""
    n, r = world.size(), world.rank()
    values = cp.asarray(10.0 * r + np.arange(n))
    return KeyedJaggedArray(
        [f"k{i}" for i in range(n)],
        values,
        values / 2 if weighted else None,
        lengths=cp.ones(n, dtype=cp.int64),
    )


def test_each_call_counts_the_path_it_took(cp: Any, path: str, world: mpicomm.ProcessGroup) -> None:
    n, r = world.size(), world.rank()
    out = KJTAllToAll([1] * n)(one_key_per_rank(cp, world, weighted=True)).wait()
    assert out.values().get().tolist() == [10.0 * s + r for s in range(n)]
    assert out.weights().get().tolist() == [5.0 * s + r / 2 for s in range(n)]
    assert dict(front.PATHS) == expected_path(path, world)


def test_a_kernel_still_queued_when_the_call_starts_is_seen(
    cp: Any, path: str, placement: str, world: mpicomm.ProcessGroup
) -> None:
    """The input is written by work on the current stream that has not run yet: the call waits for it."""
    n, r = world.size(), world.rank()
    kja = one_key_per_rank(cp, world)
    cp._fake.later(kja.values(), 10.0 * r + 100 + np.arange(n))  # a late kernel on the current stream
    out = KJTAllToAll([1] * n)(kja).wait()
    assert out.values().get().tolist() == [10.0 * s + 100 + r for s in range(n)]


def test_the_direct_path_moves_no_values_through_the_host(
    cp: Any, monkeypatch: pytest.MonkeyPatch, world: mpicomm.ProcessGroup
) -> None:
    """Direct: what comes to the host is the key offsets (and the checks' min and max), never the values."""
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "1")
    cuda_aware.reset_cuda_awareness()
    n = world.size()
    rng = np.random.default_rng(7)
    lengths = rng.integers(0, 50, 4 * n)
    values = cp.asarray(rng.random(int(lengths.sum())))
    kja = KeyedJaggedArray([f"k{i}" for i in range(4 * n)], values, lengths=cp.asarray(lengths))
    pulled: list[int] = []
    copies: list[int] = []
    get, memcpy = cp.ndarray.get, cp.cuda.runtime.memcpyAsync
    monkeypatch.setattr(
        cp.ndarray, "get", lambda self, *a, **k: pulled.append(self.nbytes) or get(self, *a, **k)
    )
    monkeypatch.setattr(cp.cuda.runtime, "memcpyAsync", lambda *a: copies.append(a[2]) or memcpy(*a))
    out = KJTAllToAll([4] * n)(kja).wait()
    out.values().size  # noqa: B018 - the recat has run
    assert copies == [] and sum(pulled) <= 8 * (4 * n + 1), (pulled, copies)
    cuda_aware.reset_cuda_awareness()


# --------------------------------------------------------------------------------------------------
# ranks that mix kinds


@pytest.mark.mpi(min_size=2)
def test_staged_device_ranks_and_host_ranks_mix_in_one_exchange(
    cp: Any, placement: str, monkeypatch: pytest.MonkeyPatch, world: mpicomm.ProcessGroup
) -> None:
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "0")
    cuda_aware.reset_cuda_awareness()
    rng = np.random.default_rng(3)
    n, r = world.size(), world.rank()
    inputs = [
        RankInput(
            ["a", "b", "c", "d"][: 2 * (n > 1) + 2],
            {k: [rng.integers(0, 9, int(rng.integers(0, 4))) for _ in range(3)] for k in "abcd"},
            stride=3,
        )
        for _ in range(n)
    ]
    for i in inputs:
        i.rows = {k: i.rows[k] for k in i.keys}
    splits = [len(inputs[0].keys)] + [0] * (n - 1)  # all keys to rank 0; the others get none
    mine = inputs[r]
    kja = on_device(cp, mine) if r % 2 == 0 else mine.to_kja()
    out = KJTAllToAll(splits)(kja).wait()
    want = reference_all_to_all(inputs, splits)[r]
    check_output(to_host(cp, out) if r % 2 == 0 else out, want)
    cuda_aware.reset_cuda_awareness()


@pytest.mark.mpi(min_size=2)
def test_direct_device_ranks_and_host_ranks_fail_alike_on_every_rank(
    cp: Any, monkeypatch: pytest.MonkeyPatch, world: mpicomm.ProcessGroup
) -> None:
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "1")
    cuda_aware.reset_cuda_awareness()
    n, r = world.size(), world.rank()
    kja = one_key_per_rank(cp, world)
    if r == n - 1:
        kja = KeyedJaggedArray(kja.keys(), kja.values().get(), lengths=kja.lengths().get())
    with pytest.raises(
        CrossRankMismatchError, match=r"KJTAllToAll: ranks .* pass device arrays to a CUDA-aware"
    ):
        KJTAllToAll([1] * n)(kja).wait()
    cuda_aware.reset_cuda_awareness()


# --------------------------------------------------------------------------------------------------
# other device array kinds through the front door


def test_a_foreign_device_array_travels_and_comes_back_as_a_device_array(
    cp: Any, path: str, world: mpicomm.ProcessGroup
) -> None:
    """A torch CUDA tensor's stand-in (only ``__cuda_array_interface__``) for values, lengths, weights."""
    n, r = world.size(), world.rank()
    values = 10.0 * r + np.arange(2 * n)
    weights = values.astype(np.float32) / 4
    lengths = np.ones(2 * n, dtype=np.int32)
    kja = KeyedJaggedArray(
        [f"k{i}" for i in range(n)],
        ForeignDeviceArray(values),
        ForeignDeviceArray(weights),
        lengths=ForeignDeviceArray(lengths),
    )
    assert isinstance(kja.values(), cp.ndarray)  # viewed without a copy
    out = KJTAllToAll([1] * n)(kja).wait()
    assert isinstance(out.values(), cp.ndarray)
    assert out.values().get().tolist() == [10.0 * s + j for s in range(n) for j in (2 * r, 2 * r + 1)]
    assert out.lengths().get().tolist() == [1] * (2 * n) and out.lengths().dtype == np.int32
    np.testing.assert_array_equal(out.weights().get(), out.values().get().astype(np.float32) / 4)


# --------------------------------------------------------------------------------------------------
# KeyedJaggedArray on device arrays: the same checks and methods as on numpy


def test_device_construction_checks_name_the_argument(cp: Any) -> None:
    v = cp.arange(3)
    with pytest.raises(ArgumentError, match="KeyedJaggedArray: lengths has a negative entry -1"):
        KeyedJaggedArray(["a"], v, lengths=cp.asarray([4, -1]))
    with pytest.raises(ArgumentError, match="lengths sum to 2; expected 3, the number of values"):
        KeyedJaggedArray(["a"], v, lengths=cp.asarray([1, 1]))
    with pytest.raises(ArgumentTypeError, match="lengths has dtype float64; expected an integer dtype"):
        KeyedJaggedArray(["a"], v, lengths=cp.asarray([1.0, 2.0]))
    with pytest.raises(ArgumentTypeError, match="values is a device array and lengths is not"):
        KeyedJaggedArray(["a"], v, lengths=np.array([1, 2]))
    with pytest.raises(ArgumentTypeError, match="values is a host array and weights is a device array"):
        KeyedJaggedArray(["a"], np.arange(3), cp.ones(3), lengths=np.array([1, 2]))
    with pytest.raises(ArgumentError, match="offsets decrease"):
        KeyedJaggedArray(["a"], v, offsets=cp.asarray([0, 3, 2]))
    with pytest.raises(ArgumentError, match="expected it to start with 0"):
        KeyedJaggedArray(["a"], v, offsets=cp.asarray([1, 3, 3]))
    with pytest.raises(ArgumentError, match="past int64"):
        KeyedJaggedArray(["a"], v, lengths=cp.asarray([2**63 - 1, 2**63 - 1], dtype=cp.uint64))


def test_device_methods_agree_with_numpy(cp: Any) -> None:
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 4, 12)
    values = rng.random(int(lengths.sum()))
    weights = rng.random(int(lengths.sum())).astype(np.float32)
    keys = ["a", "b", "c", "d"]
    host = KeyedJaggedArray(keys, values, weights, lengths=lengths)
    dev = KeyedJaggedArray(keys, cp.asarray(values), cp.asarray(weights), lengths=cp.asarray(lengths))
    assert dev.offset_per_key() == host.offset_per_key() and dev.length_per_key() == host.length_per_key()
    np.testing.assert_array_equal(dev.offsets().get(), host.offsets())
    for d, h in zip(dev.split([1, 3]), host.split([1, 3]), strict=True):
        np.testing.assert_array_equal(d.values().get(), h.values())
    p_dev, p_host = dev.permute([3, 1]), host.permute([3, 1])
    assert isinstance(p_dev.values(), cp.ndarray)
    np.testing.assert_array_equal(p_dev.values().get(), p_host.values())
    np.testing.assert_array_equal(p_dev.weights().get(), p_host.weights())
    np.testing.assert_array_equal(p_dev.lengths().get(), p_host.lengths())
    both = KeyedJaggedArray.concat([dev.split([2, 2])[1], dev.split([2, 2])[0]])
    np.testing.assert_array_equal(both.values().get(), host.permute([2, 3, 0, 1]).values())
    assert [r.get().tolist() for r in dev["c"]] == [r.tolist() for r in host["c"]]
    assert dev == KeyedJaggedArray(keys, cp.asarray(values), cp.asarray(weights), lengths=cp.asarray(lengths))
    assert dev != host  # the same numbers in another memory
    with pytest.raises(ArgumentTypeError, match="expected all on the host or all on the GPU"):
        KeyedJaggedArray.concat([host, dev])


# --------------------------------------------------------------------------------------------------
# jagged_all_to_all on device arrays


def rows_everywhere(world: mpicomm.ProcessGroup, seed: int) -> tuple[list[Any], list[Any], list[list[int]]]:
    """Every rank's rows (lengths, 3-wide values) and splits, the same on every rank."""
    rng = np.random.default_rng(seed)
    lengths, values, splits = [], [], []
    for _ in range(world.size()):
        cells = rng.integers(0, 4, world.size())
        lens = rng.integers(0, 3, int(cells.sum())).astype(np.int32)
        lengths.append(lens)
        values.append(rng.random((int(lens.sum()), 3)))
        splits.append(cells.tolist())
    return lengths, values, splits


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("strided", [False, True])
def test_jagged_all_to_all_on_device_matches_the_reference(
    cp: Any, path: str, world: mpicomm.ProcessGroup, seed: int, strided: bool
) -> None:
    lengths, values, splits = rows_everywhere(world, seed)
    r = world.rank()
    vals = cp.asarray(values[r])
    if strided:  # a view with gaps between rows: made contiguous on the device first
        wide = cp.zeros((vals.shape[0], 6))
        wide[:, ::2] = vals
        vals = wide[:, ::2]
    got = mpicomm.jagged_all_to_all(vals, cp.asarray(lengths[r]), splits[r])
    assert isinstance(got.values, cp.ndarray) and isinstance(got.lengths, cp.ndarray)
    want_l, want_v = received_rows(r, lengths, values, splits)
    np.testing.assert_array_equal(got.lengths.get(), want_l)
    np.testing.assert_array_equal(got.values.get(), want_v)
    assert got.lengths.dtype == np.int32 and got.splits == [splits[s][r] for s in range(world.size())]
    # validation mode never takes the direct path: its device calls run the host path's exchange, staged
    taken = "staged" if mpicomm.is_validation_enabled() else path
    assert dict(front.PATHS) == {("jagged_all_to_all", taken): 1}


def test_jagged_all_to_all_async_on_device_is_staged(cp: Any, path: str, world: mpicomm.ProcessGroup) -> None:
    lengths, values, splits = rows_everywhere(world, 5)
    r = world.rank()
    work = mpicomm.jagged_all_to_all(cp.asarray(values[r]), cp.asarray(lengths[r]), splits[r], async_op=True)
    got_l, got_v, _ = work.result()
    want_l, want_v = received_rows(r, lengths, values, splits)
    np.testing.assert_array_equal(got_v.get(), want_v)
    np.testing.assert_array_equal(got_l.get(), want_l)
    assert dict(front.PATHS) == {("jagged_all_to_all", "staged"): 1}  # CUDA-aware MPIs: no async on device


def test_jagged_all_to_all_of_a_foreign_device_array(cp: Any, path: str, world: mpicomm.ProcessGroup) -> None:
    lengths, values, splits = rows_everywhere(world, 9)
    r = world.rank()
    got = mpicomm.jagged_all_to_all(ForeignDeviceArray(values[r]), ForeignDeviceArray(lengths[r]), splits[r])
    want_l, want_v = received_rows(r, lengths, values, splits)
    assert isinstance(got.values, cp.ndarray)
    np.testing.assert_array_equal(got.values.get(), want_v)
    np.testing.assert_array_equal(got.lengths.get(), want_l)


@pytest.mark.mpi(min_size=2)
def test_jagged_all_to_all_direct_and_host_ranks_fail_alike(
    cp: Any, monkeypatch: pytest.MonkeyPatch, world: mpicomm.ProcessGroup, validated: bool
) -> None:
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "1")
    cuda_aware.reset_cuda_awareness()
    lengths, values, splits = rows_everywhere(world, 1)
    r = world.rank()
    lens, vals = (lengths[r], values[r]) if r == 0 else (cp.asarray(lengths[r]), cp.asarray(values[r]))
    if validated:  # the device ranks go staged (never direct in validation mode): they meet the host rank
        got = mpicomm.jagged_all_to_all(vals, lens, splits[r])
        want_l, want_v = received_rows(r, lengths, values, splits)
        np.testing.assert_array_equal(got.lengths if r == 0 else got.lengths.get(), want_l)
        np.testing.assert_array_equal(got.values if r == 0 else got.values.get(), want_v)
    else:
        with pytest.raises(
            CrossRankMismatchError, match=r"jagged_all_to_all: ranks disagree about .* the device path"
        ):
            mpicomm.jagged_all_to_all(vals, lens, splits[r])
    cuda_aware.reset_cuda_awareness()


def test_the_host_class_points_device_arrays_to_the_public_one(cp: Any, world: mpicomm.ProcessGroup) -> None:
    from mpicomm.jagged import KJTAllToAll as HostKJTAllToAll

    if world.size() == 1:
        pytest.skip("at world size 1 the input is returned unexchanged")
    n = world.size()
    with pytest.raises(
        ArgumentTypeError, match=r"holds device arrays; expected numpy arrays here \(mpicomm\.KJTAllToAll"
    ):
        HostKJTAllToAll([1] * n)(one_key_per_rank(cp, world))


def test_a_repeated_shape_reuses_the_device_row_index(
    cp: Any, path: str, world: mpicomm.ProcessGroup
) -> None:
    n, r = world.size(), world.rank()
    a2a = KJTAllToAll([1] * n)
    first = a2a(one_key_per_rank(cp, world)).wait()
    (plan,) = [p for s in a2a._send.values() for p in s.recv.values()] or [None]
    second = a2a(one_key_per_rank(cp, world)).wait()
    assert first == second and second.values().get().tolist() == [10.0 * s + r for s in range(n)]
    if n > 1 and not a2a._layout.identity:
        assert plan is not None and plan.device_rows is not None


@pytest.mark.parametrize("vbe", [False, True], ids=["stride", "vbe"])
def test_vbe_weights_and_a_rank_without_keys_on_device(
    cp: Any, path: str, placement: str, world: mpicomm.ProcessGroup, vbe: bool
) -> None:
    """Every rank's batch differs (per key under VBE), weights travel, and the last rank gets no keys."""
    n, r = world.size(), world.rank()
    rng = np.random.default_rng(21)
    keys = [f"f{i}" for i in range(2 * n - 1)]
    inputs = []
    for _ in range(n):
        stride = int(rng.integers(0, 4))
        slots = {k: int(rng.integers(0, 4)) if vbe else stride for k in keys}
        rows = {k: [rng.integers(0, 100, int(rng.integers(0, 4))) for _ in range(slots[k])] for k in keys}
        weights = {k: [rng.random(len(x)).astype(np.float32) for x in rows[k]] for k in keys}
        inputs.append(RankInput(keys, rows, weights, vbe, np.int32, stride, slots))
    splits = [2] * (n - 1) + [1] if n > 1 else [1]
    if n > 1:  # the last rank gets none: its key goes to rank 0
        splits[0], splits[-1] = 3, 0
    out = KJTAllToAll(splits)(on_device(cp, inputs[r])).wait()
    check_output(to_host(cp, out), reference_all_to_all(inputs, splits)[r])


@pytest.mark.parametrize("seed", range(20))
def test_the_device_segment_index_equals_the_host_gather_index(cp: Any, seed: int) -> None:
    from mpicomm.jagged.device import segment_index
    from mpicomm.jagged.placement import _gather_index

    rng = np.random.default_rng(seed)
    sizes = rng.integers(0, 5, int(rng.integers(1, 30))) * (rng.random() < 0.9)  # sometimes all empty
    order = rng.permutation(sizes.size)
    want = _gather_index(sizes, order)
    assert segment_index(np, sizes, order, int(sizes.sum())).tolist() == want.tolist()
    got = segment_index(cp, sizes, order, int(sizes.sum()))
    assert isinstance(got, cp.ndarray) and got.get().tolist() == want.tolist()
