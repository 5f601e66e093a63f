"""``async_op=True`` on the direct and the pipelined device paths: queued on the engine (issue 41, 1 and 8).

Each test forces one path: ``direct`` (``MPICOMM_CUDA_AWARE=1``: the fake cupy's memory is host memory,
which MPICH carries) or ``pipelined`` (not CUDA-aware, ``MPICOMM_STAGING_CHUNK=4K`` and messages of
many chunks). Every collective the path serves runs with ``async_op=True`` on every rank, on some
ranks only and on none (the MPI calls must not depend on it), and every rank checks its result
against numpy. On the fake cupy (tests/fakecupy), whose streams run their work only when waited for,
the stream-order tests check that the engine waits for the caller's stream as it was at the call
(and not for work queued after it), for cupy arrays and a torch-like tensor written on a side
stream, and that a consumer stream reads the results after ``wait()``. Whether the call returns
before the peers arrive and ``wait(timeout)`` are checked with peers that join only once rank 0
has posted. CPU emulation, not GPU verification.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fakecupy import testing
from fakecupy.testing import inputs, world
from mpi4py import MPI

import mpicomm
from mpicomm import CommunicationError
from mpicomm.core import lane
from mpicomm.front import device as front
from mpicomm.gpu import cuda_aware
from mpicomm.gpu.posted import DeviceWork


def _load(name: str) -> Any:
    """A sibling test module by its path (tests/gpu/test_paths_gpu.py loads these modules too)."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"gpu_async_paths_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_kinds = _load("test_gpu_mixed_kinds")
SideStreamTensor = _load("test_gpu_producer_stream").SideStreamTensor
make, get = _kinds.make, _kinds.get

#: Elements per rank: many 4 KiB chunks of float64 (512 elements each) and a bit.
K = 5 * 512 + 3

#: Which ranks ask for a Work.
ASYNC: dict[str, Callable[[int, int], bool]] = {
    "all": lambda r, n: True,
    "rank0": lambda r, n: r == 0,
    "rank1": lambda r, n: r == 1,
    "none": lambda r, n: False,
}

#: The calls each path serves (a layout after the dash: strided arrays, uneven splits, in place).
CALLS = {
    "direct": [
        "broadcast",
        "broadcast-strided",
        "all_gather_into_tensor",
        "all_gather_into_tensor-in-place",
        "all_gather_into_tensor-strided",
        "all_to_all_single",
        "all_to_all_single-uneven",
    ],
    "pipelined": [
        "all_reduce",
        "all_reduce-strided",
        "broadcast",
        "reduce",
        "all_to_all_single",
        "all_to_all_single-strided",
    ],
}

_MULTIPLE = MPI.Query_thread() == MPI.THREAD_MULTIPLE
# validation mode takes neither path asynchronously nor the direct path (the last test but one checks)
pytestmark = pytest.mark.usefixtures("validation_off")


@pytest.fixture(params=["direct", "pipelined"])
def path(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def cp(fake: Any, monkeypatch: pytest.MonkeyPatch, path: str) -> Iterator[Any]:
    chunked = testing.chunk_size(monkeypatch, "4K")
    next(chunked)
    yield from testing.staged_fake(fake, monkeypatch, aware="1" if path == "direct" else "0")
    next(chunked, None)
    cuda_aware.reset_cuda_awareness()


def _finish(work: Any, flag: bool, shown: Any) -> None:
    """``flag``: a DeviceWork showing ``shown``, waited for; else None (the blocking call ran)."""
    if not flag:
        assert work is None
        return
    assert isinstance(work, DeviceWork), work
    assert work.exception() is None
    assert work.wait()
    assert work.is_completed()
    assert work.result()[0] is shown


def _strided(cp: Any, values: np.ndarray) -> Any:
    return make(cp, "cupy-strided", values)


def run(call: str, cp: Any, flag: bool) -> str:
    """One call with ``async_op=flag``, checked against numpy; the public name it made."""
    r, n = world()
    name, _, layout = call.partition("-")
    x = inputs(n, n * K)  # row s: rank s's input
    a = {"async_op": flag}
    dev = _strided if layout == "strided" else cp.asarray
    if name == "all_reduce":
        t = dev(cp, x[r, :K]) if layout else cp.asarray(x[r, :K])
        _finish(mpicomm.all_reduce(t, **a), flag, t)
        np.testing.assert_array_equal(get(t), x[:, :K].sum(axis=0))
    elif name == "reduce":
        t = cp.asarray(x[r, :K])
        _finish(mpicomm.reduce(t, dst=n - 1, **a), flag, t)
        np.testing.assert_array_equal(get(t), x[:, :K].sum(axis=0) if r == n - 1 else x[r, :K])
    elif name == "broadcast":
        t = dev(cp, x[r, :K]) if layout else cp.asarray(x[r, :K])
        _finish(mpicomm.broadcast(t, src=n - 1, **a), flag, t)
        np.testing.assert_array_equal(get(t), x[n - 1, :K])
    elif name == "all_gather_into_tensor":
        if layout == "in-place":
            out = cp.asarray(np.where(np.arange(n * K) // K == r, x[:, :K].reshape(-1), -1.0))
            inp = out[r * K : (r + 1) * K]
        else:
            out = _strided(cp, np.zeros(n * K)) if layout else cp.zeros(n * K)
            inp = cp.asarray(x[r, :K])
        _finish(mpicomm.all_gather_into_tensor(out, inp, **a), flag, out)
        np.testing.assert_array_equal(get(out), x[:, :K].reshape(-1))
    elif name == "all_to_all_single" and layout == "uneven":
        sends = [(r + s) % 3 + 1 for s in range(n)]  # rank r sends sends[s] elements to rank s
        recvs = [(s + r) % 3 + 1 for s in range(n)]
        inp = cp.asarray(x[r, : sum(sends)])
        out = cp.zeros(sum(recvs))
        _finish(mpicomm.all_to_all_single(out, inp, recvs, sends, **a), flag, out)
        offs = [sum((s + q) % 3 + 1 for q in range(r)) for s in range(n)]
        want = np.concatenate([x[s, offs[s] : offs[s] + recvs[s]] for s in range(n)])
        np.testing.assert_array_equal(get(out), want)
    elif name == "all_to_all_single":
        out = _strided(cp, np.zeros(n * K)) if layout else cp.zeros(n * K)
        inp = cp.asarray(x[r])
        _finish(mpicomm.all_to_all_single(out, inp, **a), flag, out)
        np.testing.assert_array_equal(get(out), x[:, r * K : (r + 1) * K].reshape(-1))
    else:
        raise AssertionError(call)
    return name


def _cases() -> list[tuple[str, str, str]]:
    return [(p, call, which) for p, calls in CALLS.items() for call in calls for which in ASYNC]


@pytest.mark.parametrize(("path", "call", "which"), _cases())  # path: the fixture's value, per case
def test_every_call_of_the_path_with_ranks_differing_in_async_op(
    cp: Any, path: str, call: str, which: str
) -> None:
    """The call takes the forced path on every rank, its async ranks get a DeviceWork, results match."""
    r, n = world()
    name = run(call, cp, ASYNC[which](r, n))
    assert front.PATHS[name, path] == 1, dict(front.PATHS)
    assert sum(front.PATHS.values()) == 1


@pytest.mark.parametrize("path", ["pipelined"])
@pytest.mark.parametrize("which", list(ASYNC))
def test_an_async_pipelined_call_with_a_host_rank_goes_whole(cp: Any, path: str, which: str) -> None:
    """Rank 0 holds numpy: the engine hears "one call" and sends the message whole, as blocking ranks do."""
    r, n = world()
    x = inputs(n, K)
    flag = ASYNC[which](r, n)
    t = x[r].copy() if r == 0 else cp.asarray(x[r])
    work = mpicomm.all_reduce(t, async_op=flag)
    if flag:
        assert work.wait()
    np.testing.assert_array_equal(get(t), x.sum(axis=0))
    if r != 0:  # queued whole (the answer heard on the engine), or asked here and staged whole
        assert front.PATHS["all_reduce", "pipelined" if flag else "staged"] == 1, dict(front.PATHS)
        assert isinstance(work, DeviceWork) or not flag


def _one_call(path: str, cp: Any, t: Any, out: Any, src: int) -> Any:
    """The async call the stream tests make: a broadcast into (or from) ``t``, or a gather into ``out``."""
    if out is None:
        return mpicomm.broadcast(t, src=src, async_op=True)
    return mpicomm.all_gather_into_tensor(out, t, async_op=True)


@pytest.mark.parametrize("gather", [False, True])
def test_the_engine_waits_for_the_producer_stream_as_it_was_at_the_call(
    cp: Any, path: str, gather: bool
) -> None:
    """A kernel queued on the current stream before the call is read; one queued after is not waited for."""
    if gather and path == "pipelined":
        pytest.skip("all_gather_into_tensor is not pipelined")
    r, n = world()
    x = inputs(n, K)
    producer = cp.cuda.Stream(non_blocking=True)
    t = cp.zeros(K)
    other = cp.zeros(K)
    out = cp.zeros(n * K) if gather else None
    with producer:
        cp._fake.later(t, x[r])  # not run yet: the engine must wait for it
        work = _one_call(path, cp, t, out, 0)
        cp._fake.later(other, np.ones(K))  # queued after the call: never waited for by it
    assert isinstance(work, DeviceWork)
    assert work.wait()
    if hasattr(producer, "pending"):  # the fake's queue: the engine ran it up to the call's event only
        assert producer.pending >= 1
    with cp.cuda.Stream(non_blocking=True) as consumer:  # a consumer stream reads after wait()
        got = (out if gather else t) * 1.0
        consumer.synchronize()
    want = x.reshape(-1) if gather else x[0]
    np.testing.assert_array_equal(got.get(), want)
    producer.synchronize()
    np.testing.assert_array_equal(other.get(), np.ones(K))


def test_a_torch_like_tensor_written_on_its_side_stream_is_read_after_that_work(cp: Any, path: str) -> None:
    """torch's ``with torch.cuda.stream(side)``: the DLPack handshake orders the call's event after it."""
    r, n = world()
    x = inputs(n, K)
    side = cp.cuda.Stream(non_blocking=True)
    t = SideStreamTensor(cp, x[r], side)
    with cp.cuda.Stream(non_blocking=True):  # cupy's current stream: neither the side one nor the engine's
        work = mpicomm.broadcast(t, src=n - 1, async_op=True)
    assert isinstance(work, DeviceWork)
    assert work.wait()
    assert work.result()[0] is t
    np.testing.assert_array_equal(t.values(), x[n - 1])
    assert front.PATHS["broadcast", path] == 1


def _needs_p2p_beside_the_queue() -> None:
    """Skip unless a send/recv can run while a collective is queued: multiple, or MPICH's lane."""
    mpicomm.all_reduce(np.zeros(1), async_op=True).wait()  # starts the engine (and the lane)
    if not _MULTIPLE and lane.started() is None:
        pytest.skip(f"point-to-point beside a queued collective: multiple, or the lane ({lane._Lane.why})")


def test_the_call_returns_before_the_peers_arrive_and_wait_timeout_raises(cp: Any, path: str) -> None:
    """The peers join only after rank 0 has posted, timed out a wait, and told them: no deadlock."""
    _needs_p2p_beside_the_queue()
    r, n = world()
    x = inputs(n, K)
    t = cp.asarray(x[r])
    if r == 0:
        work = mpicomm.broadcast(t, src=n - 1, async_op=True)
        pending = n == 1 or not work.is_completed()
        if n > 1:
            with pytest.raises(CommunicationError, match="did not complete within"):
                work.wait(timeout=0.05)
        for peer in range(1, n):
            mpicomm.send(np.array([float(pending)]), peer)  # sent while the broadcast is queued
        assert work.wait()
        assert pending
    else:
        flag = np.zeros(1)
        mpicomm.recv(flag, 0)
        assert flag[0] == 1.0
        mpicomm.broadcast(t, src=n - 1)
    np.testing.assert_array_equal(t.get(), x[n - 1])
    assert front.PATHS["broadcast", path] == 1


def test_async_calls_and_a_blocking_one_run_in_program_order(cp: Any, path: str) -> None:
    """Several async calls on one array, then a blocking one: each reads what the one before wrote."""
    r, n = world()
    x = inputs(n, K)
    t = cp.asarray(x[r])
    works = [mpicomm.broadcast(t, src=s % n, async_op=(r + s) % 2 == 0) for s in range(3)]
    mpicomm.broadcast(t, src=0)
    for w in works:
        assert w is None or w.wait()
    np.testing.assert_array_equal(t.get(), x[0])
    assert front.PATHS["broadcast", path] == 4


@pytest.mark.parametrize("mode", ["validation", "no-engine"])
def test_async_calls_run_at_the_call_in_validation_mode_and_without_the_engine(
    cp: Any, path: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Validation mode checks every call at the call; ``MPICOMM_ENGINE=0``: a complete Work on return."""
    from mpicomm.core import engine_work

    r, n = world()
    x = inputs(n, K)
    t = cp.asarray(x[r])
    if mode == "validation":
        mpicomm.set_validation(True)
    else:
        monkeypatch.setattr(engine_work._Q, "enabled", False)
    try:
        work = mpicomm.broadcast(t, src=n - 1, async_op=True)
        assert work.is_completed()
        assert work.result()[0] is t
    finally:
        mpicomm.set_validation(False)
    np.testing.assert_array_equal(t.get(), x[n - 1])
    took = "pipelined" if mode == "validation" else path  # validation mode: never direct
    assert front.PATHS["broadcast", took] == 1, dict(front.PATHS)


def test_a_callback_on_the_engine_sees_the_results(cp: Any, path: str) -> None:
    """``then_on_engine`` (the torch backend's futures): called with the Work once the data is in place."""
    r, n = world()
    x = inputs(n, K)
    t = cp.asarray(x[r])
    seen: list[Any] = []
    work = mpicomm.broadcast(t, src=n - 1, async_op=True)
    work.then_on_engine(lambda w: seen.append((w, w.exception(), t.get()[:5].copy())))
    assert work.wait()
    assert len(seen) == 1 and seen[0][0] is work and seen[0][1] is None
    np.testing.assert_array_equal(seen[0][2], x[n - 1, :5])
    np.testing.assert_array_equal(t.get(), x[n - 1])
