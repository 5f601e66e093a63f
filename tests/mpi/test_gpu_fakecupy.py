"""The staged and pipelined GPU paths on the fake cupy (tests/fakecupy), over real MPI, at any size.

The real ``CupyBackend`` runs on a numpy-backed cupy whose streams are maximally lazy (a missing wait
reads stale data) and whose staging buffers are poisoned when lent (bytes MPI did not write show).
Each test names the defect of issue 24 it would have caught. Not GPU verification: tests/gpu is.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fakecupy import testing
from fakecupy.testing import inputs, world

import mpicomm
from mpicomm import CommunicationError
from mpicomm.core import watchdog
from mpicomm.front import device as front
from mpicomm.gpu import backend as gpu_backend
from mpicomm.gpu import pipeline, staged
from mpicomm.gpu.staging import HostBufferPool

try:  # in the dev venv (mpicomm[torch]); the GPU image may lack it: float16 only there
    import ml_dtypes

    HALVES: list[Any] = [np.float16, ml_dtypes.bfloat16]
except ImportError:
    HALVES = [np.float16]


@pytest.fixture
def chunk4k(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from testing.chunk_size(monkeypatch, "4K")


def later(cp: Any, d: Any, values: np.ndarray) -> None:
    """The input is written by a kernel still queued on the caller's stream when the call starts."""
    cp._fake.later(d, values)


# ---- fix 1: float16 / bfloat16 all_reduce of many chunks --------------------------------------------


@pytest.mark.parametrize("dtype", HALVES)
def test_half_all_reduce_of_many_chunks_is_bitwise_the_host_result(
    cp: Any, chunk4k: None, dtype: Any
) -> None:
    r, n = world()
    x = inputs(n, 3 * 2048 + 5).astype(dtype)  # 2048 halves a 4 KiB chunk: 4 chunks
    d = cp.zeros(x.shape[1], dtype=dtype)
    later(cp, d, x[r])
    mpicomm.all_reduce(d)
    want = x[r].copy()
    mpicomm.all_reduce(want)
    assert d.get().tobytes() == want.tobytes()
    assert front.PATHS["all_reduce", "pipelined"] == 1


# ---- item 3 and fix 3: pipelined reduce (reduce_scatter_tensor staged whole: issue 35); every layout ----


@pytest.mark.parametrize("layout", ["contiguous", "strided", "offset", "mixed"])
def test_pipelined_calls_match_numpy_whatever_each_ranks_layout(cp: Any, chunk4k: None, layout: str) -> None:
    r, n = world()
    count = 3 * 512 + 7  # float64: 4 chunks of 4 KiB
    x = inputs(n, n * count)
    mine = layout if layout != "mixed" else ("strided" if r % 2 == 0 else "contiguous")

    def dev(values: np.ndarray) -> Any:
        if mine == "strided":
            base = cp.full(2 * values.size, -9.0)
            v = base[::2]
        elif mine == "offset":
            v = cp.full(values.size + 3, -9.0)[3:]
        else:
            v = cp.zeros(values.size)
        later(cp, v, values)
        return v

    d = dev(x[r][:count])
    mpicomm.all_reduce(d)
    np.testing.assert_array_equal(d.get(), x[:, :count].sum(axis=0))
    b = dev(x[r][:count])
    mpicomm.broadcast(b, src=n - 1)
    np.testing.assert_array_equal(b.get(), x[n - 1][:count])
    red = dev(x[r][:count])
    mpicomm.reduce(red, dst=0)
    np.testing.assert_array_equal(red.get(), x[:, :count].sum(axis=0) if r == 0 else x[r][:count])
    out = dev(np.full(count, -1.0))
    mpicomm.reduce_scatter_tensor(out, dev(x[r]))
    np.testing.assert_array_equal(out.get(), x.sum(axis=0)[r * count : (r + 1) * count])
    for fn in ("all_reduce", "broadcast", "reduce"):
        assert front.PATHS[fn, "pipelined"] == 1, fn
    assert front.PATHS["reduce_scatter_tensor", "staged"] == 1  # not chunked on the wire (core.chunks)


@pytest.mark.parametrize("op", ["AVG", "MAX", "PREMUL_SUM"])
def test_pipelined_reductions_take_every_op_as_the_host_does(cp: Any, chunk4k: None, op: str) -> None:
    r, n = world()
    x = inputs(n, 2 * n * 512 + 3 * n)
    rop = mpicomm.ReduceOp.PREMUL_SUM(2.0) if op == "PREMUL_SUM" else getattr(mpicomm.ReduceOp, op)
    for fn in ("all_reduce", "reduce_scatter_tensor"):
        host = x[r].copy()
        if fn == "all_reduce":
            d = cp.asarray(x[r])
            mpicomm.all_reduce(d, op=rop)
            mpicomm.all_reduce(host, op=rop)
        else:
            m = x.shape[1] // n
            d, host_out = cp.zeros(m), np.zeros(m)
            mpicomm.reduce_scatter_tensor(d, cp.asarray(x[r]), op=rop)
            mpicomm.reduce_scatter_tensor(host_out, host, op=rop)
            host = host_out
        assert d.get().tobytes() == host.tobytes(), fn
    assert front.PATHS["all_reduce", "pipelined"] == 1


def test_subgroups_pipelined_and_staged_leave_non_members_alone(cp: Any, chunk4k: None) -> None:
    r, n = world()
    members = list(range(0, n, 2))
    sub = mpicomm.new_group(members)
    x = inputs(n, 2048)
    keep = cp.full(2048, -3.0)
    small = cp.full(4, -3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = cp.asarray(x[r]) if r in members else keep
        mpicomm.all_reduce(d, group=sub)
        out = cp.full(4 * len(members), -3.0) if r in members else small
        mpicomm.all_gather_into_tensor(out, cp.asarray(x[r][:4]), group=sub)
    if r in members:
        np.testing.assert_array_equal(d.get(), x[members].sum(axis=0))
        np.testing.assert_array_equal(out.get(), x[members][:, :4].reshape(-1))
    else:  # fix 2: nothing uploaded from a (poisoned, or earlier call's) pinned buffer
        np.testing.assert_array_equal(keep.get(), -3.0)
        np.testing.assert_array_equal(small.get(), -3.0)


def test_validation_passes_host_and_device_arrays_mixed_in_a_pipelined_call(cp: Any, chunk4k: None) -> None:
    """Issue 35: a host rank sends the device ranks' chunks, so validation finds every chunk alike."""
    r, n = world()
    x = inputs(n, 2048)
    a = x[r].copy() if r == 0 else cp.asarray(x[r])
    mpicomm.set_validation(True)
    try:
        mpicomm.all_reduce(a)
    finally:
        mpicomm.set_validation(False)
    np.testing.assert_array_equal(a if r == 0 else a.get(), x.sum(axis=0))
    d = cp.asarray(x[r])
    mpicomm.set_validation(True)
    try:
        mpicomm.all_reduce(d)  # all device: validation passes, every chunk checked
    finally:
        mpicomm.set_validation(False)
    np.testing.assert_array_equal(d.get(), x.sum(axis=0))


# ---- fix 2: short receives keep the rest; fix 15: rooted calls copy only what they need -------------


@pytest.mark.parametrize("blocking", [True, False])
def test_a_short_receive_leaves_the_rest_of_the_array_as_it_was(cp: Any, blocking: bool) -> None:
    r, n = world()
    if n == 1:
        pytest.skip("point-to-point needs two ranks")
    x = inputs(n, 3)
    got = cp.full(8, -1.0)
    work = mpicomm.isend(cp.asarray(x[r]), dst=(r + 1) % n)
    if blocking:
        mpicomm.recv(got, src=(r - 1) % n)
    else:
        assert mpicomm.irecv(got, src=(r - 1) % n).wait()
    assert work.wait()
    np.testing.assert_array_equal(got.get(), np.concatenate([x[(r - 1) % n], np.full(5, -1.0)]))


def test_rooted_calls_copy_only_what_each_rank_reads_and_writes(
    cp: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    r, n = world()
    be = gpu_backend.backend()
    moved: dict[str, int] = {"down": 0, "up": 0}
    to_host, to_device = be.to_host, be.to_device
    monkeypatch.setattr(
        be, "to_host", lambda h, d, s: (moved.__setitem__("down", moved["down"] + 1), to_host(h, d, s))
    )
    monkeypatch.setattr(
        be, "to_device", lambda d, h, s: (moved.__setitem__("up", moved["up"] + 1), to_device(d, h, s))
    )
    x = inputs(n, 6)
    b = cp.asarray(x[r])
    mpicomm.broadcast(b, src=0)
    assert moved == ({"down": 1, "up": 0} if r == 0 else {"down": 0, "up": 1})
    moved.update(down=0, up=0)
    red = cp.asarray(x[r])
    mpicomm.reduce(red, dst=0)
    assert moved == ({"down": 1, "up": 1} if r == 0 else {"down": 1, "up": 0})
    moved.update(down=0, up=0)
    gl = [cp.full(6, -1.0) for _ in range(n)] if r == 0 else None
    mpicomm.gather(cp.asarray(x[r]), gl, dst=0)
    assert moved == ({"down": 1, "up": n} if r == 0 else {"down": 1, "up": 0})
    if gl is not None:
        np.testing.assert_array_equal(np.stack([g.get() for g in gl]), x)


# ---- fix 4: asynchronous work overlaps with the caller's later kernels ------------------------------


@pytest.mark.parametrize("how", ["wait", "poll"])
def test_async_upload_does_not_wait_for_kernels_queued_after_the_call(cp: Any, how: str) -> None:
    r, n = world()
    x = inputs(n, 100)
    d = cp.zeros(100)
    later(cp, d, x[r])
    work = mpicomm.all_reduce(d, async_op=True)
    unrelated = cp.zeros(1)
    later(cp, unrelated, np.ones(1))  # the caller's next kernel, queued after the call
    if how == "wait":
        assert work.wait()
    else:
        while not work.is_completed():
            pass
    assert cp.cuda.get_current_stream().pending >= 1, "the upload waited for a kernel queued after the call"
    np.testing.assert_array_equal(d.get(), x.sum(axis=0))
    assert work.is_success()


# ---- fix 7: pinned memory under the cap, freed -------------------------------------------------------


def test_pinned_memory_stays_under_the_pool_cap_and_is_freed(cp: Any) -> None:
    r, n = world()
    gc.collect()
    base = cp._fake.totals()["pinned"]
    cap = 256 << 10
    staged._Pool.value = HostBufferPool(lambda nbytes: gpu_backend.backend().pinned(nbytes), cap_bytes=cap)
    cp._fake.reset_peaks()
    count = (1 << 20) // 8 + 3 * n  # about 1 MiB a side: over the cap
    count -= count % n
    x = inputs(n, count)
    out = cp.zeros(count)
    mpicomm.all_to_all_single(out, cp.asarray(x[r]))
    per = count // n
    np.testing.assert_array_equal(
        out.get(), np.concatenate([x[s][per * r : per * (r + 1)] for s in range(n)])
    )
    assert cp._fake.peaks()["pinned"] - base <= 2 * count * 8 + cap + (64 << 10)
    watchdog.forget()
    gc.collect()
    assert cp._fake.totals()["pinned"] - base <= cap


# ---- fix 8 and a failing chunk: buffers go back only when no copy can still run -----------------------


def test_a_failing_chunk_returns_buffers_only_after_the_copies(
    cp: Any, chunk4k: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    r, n = world()
    calls = [0]
    real = pipeline.reductions.all_reduce

    def fail_third(h: Any, op: Any, group: Any) -> Any:
        calls[0] += 1
        if calls[0] == 3:
            raise RuntimeError("chunk 3 failed")  # on every rank, before its MPI call
        return real(h, op, group)

    monkeypatch.setattr(pipeline.reductions, "all_reduce", fail_third)
    x = inputs(n, 6 * 512)
    d = cp.asarray(x[r])
    with pytest.raises(RuntimeError, match="chunk 3 failed"):
        mpicomm.all_reduce(d)
    pool = staged.pool()
    assert pool.stats().bytes_in_use == 0
    again = [pool.acquire(4096) for _ in range(2)]
    for buf in again:
        buf.fill(7)
    for stream in gpu_backend.backend().copy_streams():
        stream.synchronize()  # a copy still queued for the failed call would land now
    for buf in again:
        assert (buf == 7).all(), "a late copy wrote into a buffer lent to someone else"
        pool.release(buf)


# ---- fix 9: a failed asynchronous operation, a dropped handle ----------------------------------------


def test_a_failed_async_receive_reports_failure_and_writes_nothing(cp: Any) -> None:
    r, n = world()
    if n == 1:
        pytest.skip("point-to-point needs two ranks")
    got = cp.full(4, -1.0)
    work = mpicomm.irecv(got, src=(r - 1) % n)
    sent = mpicomm.isend(np.arange(10.0), dst=(r + 1) % n)  # longer than the receive: truncated
    with pytest.raises(CommunicationError):
        work.wait()
    assert not work.is_success() and work.exception() is not None
    sent.wait()
    np.testing.assert_array_equal(got.get(), -1.0)


def test_a_dropped_async_handle_gives_its_buffers_back(cp: Any) -> None:
    r, n = world()
    x = inputs(n, 50)
    d = cp.asarray(x[r])
    mpicomm.all_reduce(d, async_op=True)  # the handle is dropped at once
    watchdog.forget()
    gc.collect()
    mpicomm.barrier()
    while staged.orphans():
        staged.reap()
    assert staged.pool().stats().bytes_in_use == 0
    np.testing.assert_array_equal(d.get(), x.sum(axis=0))  # the operation still completed and uploaded


# ---- the GPU window (H200, 26 Nov 2026): all_to_all_single pipelined, block by block ----------------


@pytest.mark.parametrize("layout", ["contiguous", "strided", "offset", "mixed"])
@pytest.mark.parametrize("row", [1, 3])
def test_pipelined_all_to_all_single_matches_numpy_whatever_the_layout(
    cp: Any, chunk4k: None, layout: str, row: int
) -> None:
    r, n = world()
    rows = n * (700 // row + 1)  # float64 blocks of ~5.6 KiB: two chunks of 4 KiB / n or more each
    x = inputs(n, rows * row).reshape(n, rows, row)
    mine = layout if layout != "mixed" else ("strided" if r % 2 == 0 else "contiguous")

    def dev(values: np.ndarray) -> Any:
        if mine == "strided":
            v = cp.full((values.shape[0], 2 * row), -9.0)[:, ::2]
        elif mine == "offset":
            v = cp.full(values.size + 5, -9.0)[5:].reshape(values.shape)
        else:
            v = cp.zeros(values.shape)
        later(cp, v, values)
        return v

    out = dev(np.full((rows, row), -1.0))
    mpicomm.all_to_all_single(out, dev(x[r]))
    k = rows // n  # block j of rank s's input comes to rank j as block s of its output
    want = x[:, r * k : (r + 1) * k, :].reshape(rows, row)
    np.testing.assert_array_equal(out.get(), want)
    assert front.PATHS["all_to_all_single", "pipelined"] == 1


def test_all_to_all_single_pipelines_only_equal_splits_of_two_chunks(cp: Any, chunk4k: None) -> None:
    r, n = world()
    x = inputs(n, n * 4096)
    small = cp.asarray(x[r][: n * 16])  # one chunk: the generic staged path
    got = cp.zeros(n * 16)
    mpicomm.all_to_all_single(got, small)
    np.testing.assert_array_equal(got.get(), x[:, r * 16 : (r + 1) * 16].reshape(-1))
    splits = [4096] * n  # explicit splits (even ones): the generic staged path too
    big, out = cp.asarray(x[r]), cp.zeros(n * 4096)
    mpicomm.all_to_all_single(out, big, output_split_sizes=splits, input_split_sizes=splits)
    np.testing.assert_array_equal(out.get(), x[:, r * 4096 : (r + 1) * 4096].reshape(-1))
    assert front.PATHS["all_to_all_single", "pipelined"] == 0
    assert front.PATHS["all_to_all_single", "staged"] == 2
    mpicomm.all_to_all_single(out, big)
    np.testing.assert_array_equal(out.get(), x[:, r * 4096 : (r + 1) * 4096].reshape(-1))
    assert front.PATHS["all_to_all_single", "pipelined"] == 1


def test_validation_passes_host_and_device_ranks_mixed_in_a_pipelined_all_to_all(
    cp: Any, chunk4k: None
) -> None:
    """Issue 35: the host rank sends strided column chunks, the ones the device ranks' pipeline sends."""
    r, n = world()
    x = inputs(n, n * 4096)
    inp = x[r].copy() if r == 0 else cp.asarray(x[r])
    out = np.zeros(n * 4096) if r == 0 else cp.zeros(n * 4096)
    mpicomm.set_validation(True)
    try:
        mpicomm.all_to_all_single(out, inp)
    finally:
        mpicomm.set_validation(False)
    got = out if r == 0 else out.get()
    np.testing.assert_array_equal(got, x[:, r * 4096 : (r + 1) * 4096].reshape(-1))
