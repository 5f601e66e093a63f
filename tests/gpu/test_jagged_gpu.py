"""The jagged all-to-all on cupy arrays on a real GPU, checked against the numpy reference.

Run by ``make test-gpu`` / ``scripts/gpu-window.sh test`` at 2 and 4 ranks sharing one GPU, on the
path ``MPICOMM_CUDA_AWARE`` (or the MPI's own answer) gives: staged under the MPICH wheel or with
``MPICOMM_CUDA_AWARE=0``, direct under the CUDA-aware Open MPI. The same checks as
tests/mpi/test_jagged_device.py, which runs them on the CPU with the fake cupy. Skipped
(conftest.py) where cupy or a GPU is missing.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpi.test_jagged_device import on_device, one_key_per_rank, to_host
from unit.test_jagged_reference import SAME_ON_EVERY_RANK, check_output, global_inputs, reference_all_to_all

import mpicomm
from mpicomm import KeyedJaggedArray, KJTAllToAll
from mpicomm.front import device as front
from mpicomm.gpu.cuda_aware import cuda_awareness
from mpicomm.gpu.device import bind_device
from mpicomm.jagged.kjt import _Placement


@pytest.fixture(autouse=True, scope="module")
def bound() -> None:
    bind_device()


@pytest.fixture
def cp() -> Any:  # cupy is imported only on a GPU machine
    import cupy

    return cupy


def the_path() -> str:
    return "direct" if cuda_awareness().aware else "staged"


@pytest.mark.parametrize("min_values", [0, 2**62], ids=["in_place", "gather"])
@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_kjt_on_cupy_matches_the_numpy_reference(cp: Any, min_values: int, data: st.DataObject) -> None:
    world = mpicomm.init()
    inputs, splits, stagger = data.draw(global_inputs(world.size()))
    want = reference_all_to_all(inputs, splits, stagger)[world.rank()]
    saved, _Placement.min_values = _Placement.min_values, min_values
    try:
        handle = KJTAllToAll(splits, stagger=stagger)(on_device(cp, inputs[world.rank()]))
        check_output(to_host(cp, handle.wait()), want)
    finally:
        _Placement.min_values = saved


def test_a_large_exchange_with_weights_matches_the_reference(cp: Any) -> None:
    world = mpicomm.init()
    n, r = world.size(), world.rank()
    rng = np.random.default_rng(11)
    lengths = [rng.integers(0, 40, 4 * n * 64) for _ in range(n)]  # 4 keys per rank, 64 slots
    values = [rng.random(int(x.sum())).astype(np.float32) for x in lengths]
    keys = [f"k{i}" for i in range(4 * n)]
    host = [KeyedJaggedArray(keys, v, v * 2, lengths=x) for v, x in zip(values, lengths, strict=True)]
    want = KJTAllToAll([4] * n)(host[r]).wait()  # the numpy path, itself checked against the reference
    front.PATHS.clear()
    dev = KeyedJaggedArray(
        keys, cp.asarray(values[r]), cp.asarray(values[r] * 2), lengths=cp.asarray(lengths[r])
    )
    got = KJTAllToAll([4] * n)(dev).wait()
    np.testing.assert_array_equal(got.values().get(), want.values())
    np.testing.assert_array_equal(got.weights().get(), want.weights())
    np.testing.assert_array_equal(got.lengths().get(), want.lengths())
    assert dict(front.PATHS) == ({} if n == 1 else {("KJTAllToAll", the_path()): 1})


def test_work_on_a_side_stream_is_waited_for(cp: Any) -> None:
    """The input is written on a non-default current stream just before the call."""
    world = mpicomm.init()
    n, r = world.size(), world.rank()
    with cp.cuda.Stream(non_blocking=True):
        kja = one_key_per_rank(cp, world)
        big = cp.ones(1 << 24, cp.float32).cumsum()  # keeps the stream busy for a while
        kja.values()[:] = 10.0 * r + cp.arange(n) + big[:1] - 1
        out = KJTAllToAll([1] * n)(kja).wait()
        assert out.values().get().tolist() == [10.0 * s + r for s in range(n)]


def test_torch_cuda_tensors_in_give_torch_cuda_tensors_out() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("this torch has no CUDA")
    world = mpicomm.init()
    n, r = world.size(), world.rank()
    dev = torch.device("cuda", torch.cuda.current_device())
    values = torch.arange(n, dtype=torch.float32, device=dev) + 10 * r
    kja = KeyedJaggedArray(
        [f"k{i}" for i in range(n)], values, lengths=torch.ones(n, dtype=torch.int64, device=dev)
    )
    out = KJTAllToAll([1] * n)(kja).wait()
    assert isinstance(out.values(), torch.Tensor) and out.values().device.type == "cuda"
    assert out.values().cpu().tolist() == [10.0 * s + r for s in range(n)]
    assert isinstance(out.lengths(), torch.Tensor) and out.lengths().device.type == "cuda"


def test_jagged_all_to_all_on_cupy_matches_the_numpy_path(cp: Any) -> None:
    world = mpicomm.init()
    n, r = world.size(), world.rank()
    rng = np.random.default_rng(3 + r)
    lengths = rng.integers(0, 5, 3 * n)
    values = rng.random((int(lengths.sum()), 2))
    want = mpicomm.jagged_all_to_all(values, lengths, [3] * n)
    got = mpicomm.jagged_all_to_all(cp.asarray(values), cp.asarray(lengths), [3] * n)
    assert isinstance(got.values, cp.ndarray) and isinstance(got.lengths, cp.ndarray)
    np.testing.assert_array_equal(got.values.get(), want.values)
    np.testing.assert_array_equal(got.lengths.get(), want.lengths)
    assert got.splits == want.splits
