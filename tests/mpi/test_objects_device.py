"""cupy arrays inside object collectives over real MPI, with the fake cupy (tests/fakecupy) active.

Every rank builds every rank's objects from a shared seed (numpy), puts them on the "device", runs
the call and checks that what it received are cupy arrays on its current device with the reference
contents: nested, several, zero-size, non-contiguous, every plain dtype, small (in the stream) and
large (out of band), safe mode on and off. The fake proves plumbing and stream order, never GPU
behaviour (tests/gpu/test_objects_gpu.py does that on a GPU).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import fakecupy
import numpy as np
import pytest

import mpicomm
from mpicomm import UnpicklingRefusedError
from mpicomm.objects import tensors
from mpicomm.objects.pickling import OUT_OF_BAND_MIN, dumps, loads

DTYPES = [
    "bool",
    "int8",
    "uint16",
    "int32",
    "int64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]


@pytest.fixture(autouse=True)
def cp() -> Iterator[Any]:
    """The fake cupy, active for each test."""
    yield from fakecupy.fixture()


@pytest.fixture(params=[True, False], ids=["safe", "unsafe"])
def safe(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def host_object(rank: int) -> dict[str, Any]:
    """Rank ``rank``'s object as numpy arrays, the same on every rank (the reference)."""
    rng = np.random.default_rng(100 + rank)
    big = rng.random(OUT_OF_BAND_MIN // 8 + 17)  # out of band
    grid = rng.integers(-9, 9, (6, 5)).astype(np.int32)
    return {
        "rank": rank,
        "dtypes": [rng.integers(0, 2, 7).astype(d) for d in DTYPES],
        "nested": {"big": big, "pair": (grid, np.zeros((0, 3), np.float32))},
        "views": [grid[::2, 1:4], grid.T, big[5:-5:3]],  # made non-contiguous on the device below
        "scalar0d": np.array(3.5),
    }


def on_device(cp: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """The same object with every array a cupy array; the views are views of device arrays."""
    grid, big = cp.asarray(obj["nested"]["pair"][0]), cp.asarray(obj["nested"]["big"])
    return {
        "rank": obj["rank"],
        "dtypes": [cp.asarray(x) for x in obj["dtypes"]],
        "nested": {"big": big, "pair": (grid, cp.zeros((0, 3), cp.float32))},
        "views": [grid[::2, 1:4], grid.T, big[5:-5:3]],
        "scalar0d": cp.asarray(obj["scalar0d"]),
    }


def check(cp: Any, got: Any, want: Any) -> None:
    """``got`` has cupy arrays on the current device where ``want`` has numpy arrays, equal to them."""
    if isinstance(want, np.ndarray):
        assert isinstance(got, cp.ndarray), type(got)
        assert got.device.id == cp.cuda.Device().id
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.get(), want)
    elif isinstance(want, dict):
        assert got.keys() == want.keys()
        for k in want:
            check(cp, got[k], want[k])
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            check(cp, g, w)
    else:
        assert got == want


def test_broadcast_object_list_rebuilds_cupy_arrays_on_every_rank(
    cp: Any, safe: bool, world: mpicomm.ProcessGroup
) -> None:
    r, src = world.rank(), world.size() - 1
    objs = [on_device(cp, host_object(src)), "text", [cp.arange(3)]] if r == src else [None] * 3
    mpicomm.broadcast_object_list(objs, src=src, safe=safe)
    if r != src:
        check(cp, objs[0], host_object(src))
        assert objs[1] == "text"
        check(cp, objs[2], [np.arange(3)])


def test_all_gather_object_gives_every_rank_every_ranks_arrays(
    cp: Any, safe: bool, world: mpicomm.ProcessGroup
) -> None:
    out: list[Any] = [None] * world.size()
    mpicomm.all_gather_object(out, on_device(cp, host_object(world.rank())), safe=safe)
    for s in range(world.size()):
        check(cp, out[s], host_object(s))


def test_gather_and_scatter_objects_carry_cupy_arrays(
    cp: Any, safe: bool, world: mpicomm.ProcessGroup
) -> None:
    r, n = world.rank(), world.size()
    gathered: list[Any] | None = [None] * n if r == 0 else None
    mpicomm.gather_object(on_device(cp, host_object(r)), gathered, dst=0, safe=safe)
    if gathered is not None:
        for s in range(n):
            check(cp, gathered[s], host_object(s))
    out: list[Any] = [None]
    inputs = [on_device(cp, host_object(s)) for s in range(n)] if r == 0 else None
    mpicomm.scatter_object_list(out, inputs, src=0, safe=safe)
    check(cp, out[0], host_object(r))


@pytest.mark.mpi(min_size=2)
def test_send_and_recv_object_list_carry_cupy_arrays(
    cp: Any, safe: bool, world: mpicomm.ProcessGroup
) -> None:
    r, n = world.rank(), world.size()
    if r == 0:
        mpicomm.send_object_list([on_device(cp, host_object(0)), cp.ones(2)], dst=n - 1)
    elif r == n - 1:
        got: list[Any] = [None, None]
        assert mpicomm.recv_object_list(got, src=0, safe=safe) == 0
        check(cp, got, [host_object(0), np.ones(2)])


def test_a_kernel_still_queued_when_the_call_starts_is_seen(cp: Any, world: mpicomm.ProcessGroup) -> None:
    """The source's array is written by work on its current stream that has not run yet."""
    big = np.arange(OUT_OF_BAND_MIN // 4, dtype=np.float32)
    x, y = cp.zeros(big.shape, cp.float32), cp.zeros(3, cp.int64)
    cp._fake.later(x, big)
    cp._fake.later(y, [7, 8, 9])
    out: list[Any] = [None] * world.size()
    mpicomm.all_gather_object(out, {"x": x, "y": y})
    for got in out:
        check(cp, got, {"x": big, "y": np.array([7, 8, 9])})


def test_arrays_come_back_on_the_receivers_current_device(
    cp: Any, monkeypatch: pytest.MonkeyPatch, world: mpicomm.ProcessGroup
) -> None:
    monkeypatch.setenv("FAKECUPY_DEVICE_COUNT", "2")
    mine = world.rank() % 2
    with cp.cuda.Device(mine):
        out: list[Any] = [None] * world.size()
        mpicomm.all_gather_object(out, cp.arange(4) + world.rank())
        for s, got in enumerate(out):
            assert isinstance(got, cp.ndarray) and got.device.id == mine
            assert got.get().tolist() == [s, s + 1, s + 2, s + 3]


def test_device_cpu_gives_numpy_arrays(cp: Any, world: mpicomm.ProcessGroup) -> None:
    out: list[Any] = [None] * world.size()
    mpicomm.all_gather_object(out, {"a": cp.arange(3) * world.rank()}, device="cpu")
    for s, got in enumerate(out):
        assert type(got["a"]) is np.ndarray and got["a"].tolist() == [0, s, 2 * s]


# --------------------------------------------------------------------------------------------------
# the pickle itself: out of band, and what safe mode lets through


def test_large_cupy_arrays_travel_out_of_band_small_ones_in_the_stream(cp: Any) -> None:
    big = np.arange(OUT_OF_BAND_MIN // 8, dtype=np.float64)
    stream, buffers = dumps({"big": cp.asarray(big), "small": cp.arange(4)})
    assert [b.nbytes for b in buffers] == [big.nbytes]
    assert big.tobytes()[:64] not in stream and len(stream) < 1000
    got = loads(stream, buffers, safe=True)
    assert isinstance(got["big"], cp.ndarray) and isinstance(got["small"], cp.ndarray)
    np.testing.assert_array_equal(got["big"].get(), big)


class Reduce:
    """Pickles as ``fn(*args)``: what a forged stream can ask of the unpickler."""

    def __init__(self, fn: Any, args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> Any:
        return self.fn, self.args


def test_safe_mode_rebuilds_only_with_checked_arguments(cp: Any) -> None:
    good = pickle.dumps(Reduce(tensors.from_numpy, (np.arange(3), tensors.CUPY, False)))
    assert isinstance(loads(good, safe=True), cp.ndarray)
    forged = [
        (np.arange(3), tensors.CUPY, True),  # requires_grad on a cupy array
        (np.array(["a"]), tensors.CUPY, False),  # not numbers
        (np.arange(3), "cupy.cuda", False),  # an unknown tag
        ([1, 2], tensors.CUPY, False),  # not an array
    ]
    for args in forged:
        with pytest.raises(UnpicklingRefusedError, match="safe mode refused"):
            loads(pickle.dumps(Reduce(tensors.from_numpy, args)), safe=True)


def test_cupy_arrays_of_other_dtypes_keep_cupys_pickling(cp: Any) -> None:
    assert tensors.reduce_tensor(cp.zeros(2, dtype=[("a", "i4")])) is NotImplemented
    assert tensors.reduce_tensor(np.zeros(2)) is NotImplemented
