"""Device arrays inside object collectives over real MPI, with the fake cupy (tests/fakecupy) active.

Every rank builds every rank's objects from a shared seed (numpy), puts them on the "device", runs
the call and checks that what it received are cupy arrays on its current device with the reference
contents: nested, several, zero-size, non-contiguous, every plain dtype, small and large, safe mode
on and off, on the staged path (``MPICOMM_CUDA_AWARE=0``), the direct path (``=1``: the MPICH wheel
carries the fake's host pointers as a CUDA-aware MPI would carry device pointers) and with ranks
mixing the two. Every device array travels out of band as device memory: its bytes are never in the
pickle stream, and on the direct path no byte crosses to the host. The fake proves plumbing and
stream order, never GPU behaviour (tests/gpu/test_objects_gpu.py does that on a GPU).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterator
from typing import Any

import fakecupy
import numpy as np
import pytest
from standin import ForeignDeviceArray

import mpicomm
from mpicomm import ObjectCollectiveError, UnpicklingRefusedError
from mpicomm.core import control
from mpicomm.gpu import cuda_aware, staged
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


@pytest.fixture(params=["staged", "direct", "mixed"])
def path(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, world: mpicomm.ProcessGroup
) -> Iterator[str]:
    """Each call on the staged path, the direct path, and mixed (rank 0 direct, the others staged)."""
    direct = request.param == "direct" or (request.param == "mixed" and world.rank() == 0)
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "1" if direct else "0")
    cuda_aware.reset_cuda_awareness()
    yield str(request.param)
    cuda_aware.reset_cuda_awareness()
    assert staged.pool().stats().bytes_in_use == 0  # every pinned buffer given back


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
    cp: Any, safe: bool, path: str, world: mpicomm.ProcessGroup
) -> None:
    r, src = world.rank(), world.size() - 1
    objs = [on_device(cp, host_object(src)), "text", [cp.arange(3)]] if r == src else [None] * 3
    mpicomm.broadcast_object_list(objs, src=src, safe=safe)
    if r != src:
        check(cp, objs[0], host_object(src))
        assert objs[1] == "text"
        check(cp, objs[2], [np.arange(3)])


def test_all_gather_object_gives_every_rank_every_ranks_arrays(
    cp: Any, safe: bool, path: str, world: mpicomm.ProcessGroup
) -> None:
    out: list[Any] = [None] * world.size()
    mpicomm.all_gather_object(out, on_device(cp, host_object(world.rank())), safe=safe)
    for s in range(world.size()):
        check(cp, out[s], host_object(s))


def test_gather_and_scatter_objects_carry_cupy_arrays(
    cp: Any, safe: bool, path: str, world: mpicomm.ProcessGroup
) -> None:
    r, n = world.rank(), world.size()
    root = n - 1  # on the mixed path the root is staged and rank 0 direct (or both rank 0 at 1 rank)
    gathered: list[Any] | None = [None] * n if r == root else None
    mpicomm.gather_object(on_device(cp, host_object(r)), gathered, dst=root, safe=safe)
    if gathered is not None:
        for s in range(n):
            check(cp, gathered[s], host_object(s))
    for src in {0, root}:  # a direct source and a staged one
        out: list[Any] = [None]
        inputs = [on_device(cp, host_object(s)) for s in range(n)] if r == src else None
        mpicomm.scatter_object_list(out, inputs, src=src, safe=safe)
        check(cp, out[0], host_object(r))


@pytest.mark.mpi(min_size=2)
def test_send_and_recv_object_list_carry_cupy_arrays(
    cp: Any, safe: bool, path: str, world: mpicomm.ProcessGroup
) -> None:
    r, n = world.rank(), world.size()
    for a, b in ((0, n - 1), (n - 1, 0)):  # mixed: direct to staged, then staged to direct
        if r == a:
            mpicomm.send_object_list([on_device(cp, host_object(a)), cp.ones(2)], dst=b)
        elif r == b:
            got: list[Any] = [None, None]
            assert mpicomm.recv_object_list(got, src=a, safe=safe) == a
            check(cp, got, [host_object(a), np.ones(2)])


def test_a_kernel_still_queued_when_the_call_starts_is_seen(
    cp: Any, path: str, world: mpicomm.ProcessGroup
) -> None:
    """The sender's arrays are written by work on its current stream that has not run yet."""
    big = np.arange(OUT_OF_BAND_MIN // 4, dtype=np.float32)
    x, y = cp.zeros(big.shape, cp.float32), cp.zeros(3, cp.int64)
    cp._fake.later(x, big)
    cp._fake.later(y, [7, 8, 9])
    out: list[Any] = [None] * world.size()
    mpicomm.all_gather_object(out, {"x": x, "y": y, "view": x[::3]})
    for got in out:
        check(cp, got, {"x": big, "y": np.array([7, 8, 9]), "view": big[::3]})
    z = cp.zeros(5, cp.int16)
    cp._fake.later(z, np.arange(5))
    objs = [{"z": z}] if world.rank() == 0 else [None]
    mpicomm.broadcast_object_list(objs, src=0)
    check(cp, objs[0], {"z": np.arange(5, dtype=np.int16)})


def test_foreign_device_arrays_come_back_as_cupy_arrays(
    cp: Any, safe: bool, path: str, world: mpicomm.ProcessGroup
) -> None:
    """Arrays that expose only ``__cuda_array_interface__`` (a torch CUDA tensor's stand-in)."""
    r, n = world.rank(), world.size()
    rng = np.random.default_rng(7)
    want = [rng.random((4, 3)) + s for s in range(n)]
    out: list[Any] = [None] * n
    mine = [ForeignDeviceArray(want[r].copy()), ForeignDeviceArray(want[r][:, 1])]  # one contiguous, one not
    mpicomm.all_gather_object(out, mine, safe=safe)
    for s in range(n):
        check(cp, out[s], [want[s], want[s][:, 1]])


def test_the_direct_path_moves_no_array_byte_through_the_host_or_the_stream(
    cp: Any, monkeypatch: pytest.MonkeyPatch, world: mpicomm.ProcessGroup
) -> None:
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "1")
    cuda_aware.reset_cuda_awareness()
    r, n = world.rank(), world.size()
    marks = [np.full(OUT_OF_BAND_MIN // 8 + 3, 1234.5 + s) for s in range(n)]
    copies: list[int] = []
    real = cp.cuda.runtime.memcpyAsync

    def counted(dst: int, src: int, size: int, kind: int, stream: int) -> None:
        copies.append(kind)
        real(dst, src, size, kind, stream)

    device = [cp.asarray(m) for m in marks]
    word = np.array([0x5A5A5A5A5A5A5A5A], np.int64)
    small = cp.asarray(word)
    monkeypatch.setattr(cp.cuda.runtime, "memcpyAsync", counted)

    def refuse(*args: Any, **kwargs: Any) -> None:
        pytest.fail("a device array was copied to the host")

    monkeypatch.setattr(cp.ndarray, "get", refuse)
    monkeypatch.setattr(cp, "asnumpy", refuse)
    stream, buffers = dumps({"x": device[r], "s": small})
    assert marks[r].tobytes()[:64] not in stream and word.tobytes() not in stream
    assert all(not isinstance(b, memoryview) for b in buffers)
    out: list[Any] = [None] * n
    mpicomm.all_gather_object(out, {"x": device[r], "s": small})
    objs = [{"x": device[r]}] if r == 0 else [None]
    mpicomm.broadcast_object_list(objs, src=0)
    assert copies.count(1) == 0 and copies.count(2) == 0  # no host-to-device or device-to-host copy
    monkeypatch.undo()
    cuda_aware.reset_cuda_awareness()
    for s in range(n):
        check(cp, out[s], {"x": marks[s], "s": np.array([0x5A5A5A5A5A5A5A5A], np.int64)})
    check(cp, objs[0], {"x": marks[0]})


def test_arrays_come_back_on_the_receivers_current_device(
    cp: Any, monkeypatch: pytest.MonkeyPatch, path: str, world: mpicomm.ProcessGroup
) -> None:
    monkeypatch.setenv("FAKECUPY_DEVICE_COUNT", "2")
    mine = world.rank() % 2
    with cp.cuda.Device(mine):
        out: list[Any] = [None] * world.size()
        mpicomm.all_gather_object(out, cp.arange(4) + world.rank())
        for s, got in enumerate(out):
            assert isinstance(got, cp.ndarray) and got.device.id == mine
            assert got.get().tolist() == [s, s + 1, s + 2, s + 3]


def test_device_cpu_gives_numpy_arrays(cp: Any, path: str, world: mpicomm.ProcessGroup) -> None:
    out: list[Any] = [None] * world.size()
    mpicomm.all_gather_object(out, {"a": cp.arange(3) * world.rank()}, device="cpu")
    for s, got in enumerate(out):
        assert type(got["a"]) is np.ndarray and got["a"].tolist() == [0, s, 2 * s]


def test_a_device_array_claim_past_the_payload_cap_is_refused_everywhere(
    cp: Any, monkeypatch: pytest.MonkeyPatch, world: mpicomm.ProcessGroup
) -> None:
    """Device buffers count against MPICOMM_MAX_PAYLOAD like host ones, before anything is allocated."""
    monkeypatch.setattr(control._Cap, "value", OUT_OF_BAND_MIN)  # MPICOMM_MAX_PAYLOAD, read once
    out: list[Any] = [None] * world.size()
    with pytest.raises(ObjectCollectiveError, match="MPICOMM_MAX_PAYLOAD"):
        mpicomm.all_gather_object(out, cp.zeros(OUT_OF_BAND_MIN + 1, cp.uint8))


# --------------------------------------------------------------------------------------------------
# the pickle itself: out of band, and what safe mode lets through


def test_every_device_array_travels_out_of_band_never_in_the_stream(cp: Any) -> None:
    big = np.arange(OUT_OF_BAND_MIN // 8, dtype=np.float64)
    small = np.array([0x1122334455667788, 7], np.int64)
    stream, buffers = dumps({"big": cp.asarray(big), "small": cp.asarray(small), "none": cp.zeros((0, 2))})
    assert [b.nbytes for b in buffers] == [big.nbytes, small.nbytes, 0]
    assert big.tobytes()[:64] not in stream and small.tobytes()[:8] not in stream and len(stream) < 1000
    got = loads(stream, buffers, safe=True)
    assert isinstance(got["big"], cp.ndarray) and isinstance(got["small"], cp.ndarray)
    np.testing.assert_array_equal(got["big"].get(), big)
    np.testing.assert_array_equal(got["small"].get(), small)
    assert got["none"].shape == (0, 2)


class Reduce:
    """Pickles as ``fn(*args)``: what a forged stream can ask of the unpickler."""

    def __init__(self, fn: Any, args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> Any:
        return self.fn, self.args


def test_safe_mode_rebuilds_only_with_checked_arguments(cp: Any) -> None:
    def stream(*args: Any) -> bytes:
        marker = pickle.PickleBuffer(bytearray(1))  # out of band: loaded as the buffer the list gives
        return pickle.dumps(
            Reduce(tensors.from_device, (marker, *args)), protocol=5, buffer_callback=lambda b: False
        )

    def load(*args: Any) -> Any:
        return loads(stream(*args), [cp.zeros(24, cp.uint8)], safe=True)

    assert load("<f8", (3,), tensors.CUPY, False).shape == (3,)
    forged = [
        ("<f8", (3,), tensors.CUPY, True),  # requires_grad on a cupy array
        ("<f8", (4,), tensors.CUPY, False),  # more elements than the buffer holds
        ("<f8", (2,), tensors.CUPY, False),  # fewer
        ("|O", (3,), tensors.CUPY, False),  # Python objects
        ("<U3", (2,), tensors.CUPY, False),  # not numbers
        ("<f8", (3,), "cupy.cuda", False),  # an unknown tag
        ("<f8", [3], tensors.CUPY, False),  # not a tuple
        ("<f8", (-3, -1), tensors.CUPY, False),  # negative sizes
        ("<f8", (3,) + (1,) * 70, tensors.CUPY, False),  # too many dimensions
        ("<f8", (3,), tensors.CUPY),  # a missing argument
    ]
    for args in forged:
        with pytest.raises(UnpicklingRefusedError, match="safe mode refused"):
            load(*args)
    with pytest.raises(UnpicklingRefusedError, match="safe mode refused"):  # a host buffer, not a device one
        loads(stream("<f8", (3,), tensors.CUPY, False), [np.zeros(24, np.uint8)], safe=True)
    with pytest.raises(UnpicklingRefusedError, match="safe mode refused"):  # a device array, not bytes
        loads(stream("<f8", (3,), tensors.CUPY, False), [cp.zeros(3, cp.float64)], safe=True)
    with pytest.raises(UnpicklingRefusedError, match="safe mode refused"):  # a numpy array, not a buffer
        loads(
            pickle.dumps(Reduce(tensors.from_device, (np.zeros(24, np.uint8), "<f8", (3,), "cupy", False))),
            safe=True,
        )


def test_cupy_arrays_of_other_dtypes_keep_cupys_pickling(cp: Any) -> None:
    assert tensors.reduce_tensor(cp.zeros(2, dtype=[("a", "i4")])) is NotImplemented
    assert tensors.reduce_tensor(np.zeros(2)) is NotImplemented


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("claim", [2 * 2**50 + 1, -3], ids=["huge-device-buffer", "negative-word"])
def test_a_forged_device_buffer_size_is_refused_before_anything_is_allocated(
    cp: Any, claim: int, path: str, world: mpicomm.ProcessGroup
) -> None:
    """A header word that claims a device buffer past the payload cap (or a negative one) is refused."""
    from mpi4py import MPI

    from mpicomm.objects.p2p import P2P_TAG

    stream, _ = dumps(0)
    if world.rank() == 0:
        header = np.array([0, 1, len(stream), 1, len(stream), claim], np.int64)
        message = np.concatenate([header.view(np.uint8), np.frombuffer(stream, np.uint8)])
        world.internal.Send([message, MPI.BYTE], 1, P2P_TAG)
    elif world.rank() == 1:
        used = cp.get_default_memory_pool().used_bytes()
        with pytest.raises(ObjectCollectiveError, match="group rank 0"):
            mpicomm.recv_object_list([None], src=0)
        assert cp.get_default_memory_pool().used_bytes() == used
    MPI.COMM_WORLD.Barrier()


def test_a_receiver_that_cannot_hold_device_arrays_fails_on_every_rank_without_a_hang(
    cp: Any, monkeypatch: pytest.MonkeyPatch, path: str, world: mpicomm.ProcessGroup
) -> None:
    """A rank whose GPU backend fails receives into host memory, and every rank raises the same error."""
    from mpicomm.objects.devbufs import Hooks

    if world.rank() == world.size() - 1 and world.size() > 1:

        def broken() -> Any:
            raise RuntimeError("no GPU here")

        monkeypatch.setattr(Hooks, "backend", broken)
    objs = [{"x": cp.arange(5)}] if world.rank() == 0 else [None]
    if world.size() == 1:
        mpicomm.broadcast_object_list(objs, src=0)
        return
    with pytest.raises(ObjectCollectiveError, match=r"cannot be received on rank .*no GPU here") as err:
        mpicomm.broadcast_object_list(objs, src=0)
    assert "safe mode" not in str(err.value)
    same_everywhere(str(err.value))


def test_ranks_may_mix_host_and_device_arrays_in_one_call(
    cp: Any, safe: bool, path: str, world: mpicomm.ProcessGroup
) -> None:
    """Even ranks send cupy arrays, odd ranks numpy arrays: each buffer's flag says where it goes."""
    r, n = world.rank(), world.size()
    want = [host_object(s) for s in range(n)]
    mine = on_device(cp, want[r]) if r % 2 == 0 else want[r]
    out: list[Any] = [None] * n
    mpicomm.all_gather_object(out, mine, safe=safe)
    for s in range(n):
        if s % 2 == 0:
            check(cp, out[s], want[s])
        else:
            assert type(out[s]["nested"]["big"]) is np.ndarray
            np.testing.assert_array_equal(out[s]["nested"]["big"], want[s]["nested"]["big"])


# --------------------------------------------------------------------------------------------------
# a device copy that fails on one rank, after the others have started: every rank raises, none hangs


def same_everywhere(text: str) -> None:
    """Every rank of the world holds the same ``text`` (compared by a digest, without pickle)."""
    from mpi4py import MPI

    digest = np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint8)
    every = np.empty((MPI.COMM_WORLD.Get_size(), digest.size), np.uint8)
    MPI.COMM_WORLD.Allgather(digest, every)
    assert (every == digest).all(), text


def object_call(call: str, cp: Any, world: mpicomm.ProcessGroup) -> None:
    """Run ``call`` with a device array from every sender (rank 0 the source or destination)."""
    r, n = world.rank(), world.size()
    x = cp.arange(1000, dtype=cp.float64) + r
    if call == "broadcast":
        mpicomm.broadcast_object_list([{"x": x}] if r == 0 else [None], src=0)
    elif call == "all_gather":
        mpicomm.all_gather_object([None] * n, {"x": x})
    elif call == "gather":
        mpicomm.gather_object({"x": x}, [None] * n if r == 0 else None, dst=0)
    elif call == "scatter":
        mpicomm.scatter_object_list([None], [{"x": x + s} for s in range(n)] if r == 0 else None, src=0)
    elif r == 0:
        mpicomm.send_object_list([{"x": x}], dst=1)
    elif r == 1:
        mpicomm.recv_object_list([None], src=0)


CALLS = ["broadcast", "all_gather", "gather", "scatter", "p2p"]


@pytest.fixture
def staged_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The staged path on every rank (device buffers go through pinned host copies)."""
    monkeypatch.setenv("MPICOMM_CUDA_AWARE", "0")
    cuda_aware.reset_cuda_awareness()
    yield
    cuda_aware.reset_cuda_awareness()
    assert staged.pool().stats().bytes_in_use == 0  # every pinned buffer given back


def broken(*args: Any) -> None:
    raise RuntimeError("injected copy failure")


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("call", CALLS)
def test_a_sender_whose_device_copy_fails_makes_every_rank_raise(
    cp: Any, call: str, staged_path: None, monkeypatch: pytest.MonkeyPatch, world: mpicomm.ProcessGroup
) -> None:
    """A sender cannot stage its device buffers: it says so before any buffer moves, nobody waits."""
    from mpi4py import MPI

    from mpicomm.gpu.backend import backend

    failing = 1 if call == "gather" else 0  # the gather's destination stages nothing
    if world.rank() == failing:
        monkeypatch.setattr(backend(), "to_host", broken)
    if call == "p2p" and world.rank() > 1:
        MPI.COMM_WORLD.Barrier()
        return
    with pytest.raises(
        ObjectCollectiveError, match=rf"cannot be staged to send on rank {failing}.*injected"
    ) as err:
        object_call(call, cp, world)
    if call == "p2p":
        MPI.COMM_WORLD.Barrier()
    else:
        same_everywhere(str(err.value))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("call", CALLS)
def test_a_receiver_whose_device_upload_fails_makes_every_rank_raise(
    cp: Any, call: str, staged_path: None, monkeypatch: pytest.MonkeyPatch, world: mpicomm.ProcessGroup
) -> None:
    """Rank 1 receives but cannot upload: it still takes part, then every rank raises its error."""
    from mpi4py import MPI

    from mpicomm.gpu.backend import backend

    r = world.rank()
    if r == 1 or (r == 0 and call in ("all_gather", "gather")):
        monkeypatch.setattr(backend(), "to_device", broken)
    if call == "p2p" and r != 1:
        object_call(call, cp, world)  # the sender has returned before the receiver fails
        MPI.COMM_WORLD.Barrier()
        return
    want = 0 if call in ("all_gather", "gather") else 1
    with pytest.raises(ObjectCollectiveError, match=rf"cannot be received on rank {want}.*injected") as err:
        object_call(call, cp, world)
    if call == "p2p":
        MPI.COMM_WORLD.Barrier()
    else:
        same_everywhere(str(err.value))


@pytest.mark.mpi(min_size=2)
def test_a_receiver_whose_second_upload_fails_lets_the_first_finish_before_its_buffer_goes_back(
    cp: Any, staged_path: None, monkeypatch: pytest.MonkeyPatch, world: mpicomm.ProcessGroup
) -> None:
    """An upload queued before the failing one still reads its pinned buffer: it must run first.

    Otherwise the buffer goes back to the pool (and on to another call, or is freed) with a copy
    from it still queued on the stream.
    """
    from mpicomm.gpu.backend import backend

    be = backend()
    done: list[int] = []

    def second_fails(dev: Any, host: np.ndarray, stream: Any) -> None:
        done.append(1)
        if len(done) == 2:
            raise RuntimeError("injected copy failure")
        be_to_device(dev, host, stream)

    be_to_device = be.to_device
    r = world.rank()
    if r == 1:
        monkeypatch.setattr(be, "to_device", second_fails)
    x, y = cp.arange(1000, dtype=cp.float64), cp.arange(2000, dtype=cp.float64)  # two device buffers
    with pytest.raises(ObjectCollectiveError, match=r"cannot be received on rank 1.*injected"):
        mpicomm.broadcast_object_list([{"x": x, "y": y}] if r == 0 else [None], src=0)
    if r == 1:
        assert len(done) == 2
        assert cp._fake.pending() == 0, "a queued upload still reads a pinned buffer given back"
