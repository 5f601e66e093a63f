"""Host staging bookkeeping: the buffer pool (reuse, growth, cap) and chunk plans (sizes, alignment)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mpicomm.errors import ArgumentError, ArgumentTypeError
from mpicomm.gpu.staging import (
    DEFAULT_CHUNK_BYTES,
    HostBufferPool,
    PoolStats,
    chunk_bytes,
    plan_chunks,
    size_class,
)

KiB, MiB = 1 << 10, 1 << 20


class CountingAllocator:
    """A numpy allocator that records every size it was asked for (stands in for pinned memory)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, nbytes: int) -> np.ndarray:
        self.sizes.append(nbytes)
        return np.zeros(nbytes, np.uint8)


# ---- size classes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nbytes", "size"),
    [
        (0, 4 * KiB),
        (1, 4 * KiB),
        (4 * KiB, 4 * KiB),
        (4 * KiB + 1, 8 * KiB),
        (MiB - 1, MiB),
        (MiB, MiB),
        (64 * KiB, 64 * KiB),
        (64 * KiB + 1, 80 * KiB),
        (MiB + 1, MiB + 256 * KiB),
        (5 * MiB, 5 * MiB),
        (2100 * MiB, 2560 * MiB),
    ],
)
def test_size_class_is_a_power_of_two_to_64_kib_then_a_quarter_step(nbytes: int, size: int) -> None:
    assert size_class(nbytes) == size


@given(st.integers(0, 1 << 40))
def test_size_class_fits_the_request_with_at_most_a_quarter_more(nbytes: int) -> None:
    size = size_class(nbytes)
    assert size >= nbytes and size >= 4 * KiB
    if nbytes > 64 * KiB:
        assert size <= nbytes * 1.25 and size % (1 << ((nbytes - 1).bit_length() - 3)) == 0
    else:
        assert size & (size - 1) == 0 and size <= max(4 * KiB, 2 * nbytes)


def test_a_request_over_the_cap_gets_exactly_its_size_and_is_not_kept() -> None:
    sizes: list[int] = []

    def alloc(n: int) -> np.ndarray:
        sizes.append(n)
        return np.empty(n, np.uint8)

    pool = HostBufferPool(alloc, cap_bytes=MiB)
    with pool.borrow(3 * MiB + 5) as buf:
        assert buf.nbytes == 3 * MiB + 5
    assert sizes == [3 * MiB + 5] and pool.stats().bytes_held == 0


# ---- the pool -----------------------------------------------------------------------------------------


def test_pool_reuses_a_buffer_of_the_same_size_class() -> None:
    alloc = CountingAllocator()
    pool = HostBufferPool(alloc)
    for n in (3000, 4096, 1, 0, 2500):
        with pool.borrow(n) as buf:
            assert buf.nbytes == n and buf.dtype == np.uint8
    assert alloc.sizes == [4 * KiB]
    assert pool.stats() == PoolStats(
        allocations=1, reuses=4, overflows=0, evictions=0, bytes_held=4 * KiB, bytes_in_use=0
    )


def test_pool_lends_the_same_memory_again_and_keeps_contents_of_views_apart() -> None:
    pool = HostBufferPool()
    a = pool.acquire(100)
    a[:] = 7
    pool.release(a)
    b = pool.acquire(50)
    assert np.may_share_memory(a, b)  # the same pooled buffer
    assert (b == 7).all()  # contents are not cleared: the caller overwrites them
    pool.release(b)


def test_pool_grows_a_new_buffer_for_each_concurrent_request() -> None:
    alloc = CountingAllocator()
    pool = HostBufferPool(alloc)
    lent = [pool.acquire(1000) for _ in range(3)]
    assert alloc.sizes == [4 * KiB] * 3
    assert not any(np.may_share_memory(x, y) for i, x in enumerate(lent) for y in lent[i + 1 :])
    assert pool.stats().bytes_in_use == 3 * 4 * KiB
    for buf in lent:
        pool.release(buf)
    for _ in range(3):  # a steady workload allocates nothing more
        lent = [pool.acquire(1000) for _ in range(3)]
        for buf in lent:
            pool.release(buf)
    st_ = pool.stats()
    assert (st_.allocations, st_.reuses, st_.bytes_held, st_.bytes_in_use) == (3, 9, 12 * KiB, 0)


def test_pool_keeps_one_free_list_per_size_class() -> None:
    alloc = CountingAllocator()
    pool = HostBufferPool(alloc)
    for n in (MiB, 10, 3 * MiB, MiB, 10, 3 * MiB):
        with pool.borrow(n):
            pass
    assert alloc.sizes == [MiB, 4 * KiB, 3 * MiB]
    assert pool.stats().reuses == 3 and pool.stats().bytes_held == MiB + 4 * KiB + 3 * MiB


def test_pool_evicts_idle_buffers_largest_first_to_stay_under_its_cap() -> None:
    alloc = CountingAllocator()
    pool = HostBufferPool(alloc, cap_bytes=5 * MiB)
    for n in (4 * MiB, MiB):
        with pool.borrow(n):
            pass
    assert pool.stats().bytes_held == 5 * MiB
    with pool.borrow(2 * MiB):  # 2 MiB more needs room: the idle 4 MiB buffer goes, the 1 MiB one stays
        pass
    got = pool.stats()
    assert got.evictions == 1 and got.bytes_held == 3 * MiB and got.overflows == 0
    with pool.borrow(MiB):
        pass
    assert pool.stats().reuses == 1


def test_pool_hands_out_one_off_buffers_when_lent_memory_fills_the_cap() -> None:
    alloc = CountingAllocator()
    pool = HostBufferPool(alloc, cap_bytes=8 * KiB)
    a, b = pool.acquire(4 * KiB), pool.acquire(4 * KiB)
    c = pool.acquire(4 * KiB)  # both kept buffers are lent: c is a one-off
    got = pool.stats()
    assert (got.allocations, got.overflows, got.bytes_held, got.bytes_in_use) == (2, 1, 8 * KiB, 8 * KiB)
    c[:] = 1
    for buf in (a, b, c):
        pool.release(buf)
    assert pool.stats().bytes_held == 8 * KiB and pool.stats().bytes_in_use == 0
    assert len(alloc.sizes) == 3


def test_pool_request_larger_than_the_cap_is_a_one_off() -> None:
    pool = HostBufferPool(cap_bytes=MiB)
    with pool.borrow(2 * MiB) as buf:
        assert buf.nbytes == 2 * MiB
    assert pool.stats() == PoolStats(0, 0, 1, 0, 0, 0)


def test_pool_with_zero_cap_keeps_nothing() -> None:
    pool = HostBufferPool(cap_bytes=0)
    for _ in range(2):
        with pool.borrow(10):
            pass
    assert pool.stats().overflows == 2 and pool.stats().bytes_held == 0


def test_pool_release_twice_is_an_error() -> None:
    pool = HostBufferPool()
    buf = pool.acquire(64)
    pool.release(buf)
    with pytest.raises(ArgumentError, match="already released"):
        pool.release(buf)


def test_pool_clear_frees_idle_buffers_only() -> None:
    pool = HostBufferPool()
    lent = pool.acquire(10)
    with pool.borrow(MiB):
        pass
    pool.clear()
    assert pool.stats().bytes_held == 4 * KiB and pool.stats().bytes_in_use == 4 * KiB
    pool.release(lent)
    with pool.borrow(10):
        pass
    assert pool.stats().reuses == 1


def test_pool_is_consistent_under_threads() -> None:
    pool = HostBufferPool(cap_bytes=64 * MiB)

    def work(seed: int) -> None:
        for n in np.random.default_rng(seed).integers(0, 3 * MiB, 200):
            with pool.borrow(int(n)) as buf:
                buf[:1] = 1 if buf.nbytes else buf[:1]

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = pool.stats()
    assert got.bytes_in_use == 0
    assert got.allocations + got.reuses + got.overflows == 800
    # each thread holds one buffer at a time: at most 4 per size class (4 KiB .. 4 MiB is 11 classes),
    # which fits the cap, so nothing is evicted
    assert got.allocations <= 4 * 11 and got.evictions == 0 and got.overflows == 0
    assert got.bytes_held <= 64 * MiB


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"allocator": 3}, ArgumentTypeError, "allocator is a int"),
        ({"cap_bytes": 1.5}, ArgumentTypeError, "cap_bytes is a float"),
        ({"cap_bytes": True}, ArgumentTypeError, "cap_bytes is a bool"),
        ({"cap_bytes": -1}, ArgumentError, "cap_bytes is -1; expected 0 or more"),
    ],
)
def test_pool_checks_its_arguments(kwargs: dict[str, object], error: type[Exception], words: str) -> None:
    with pytest.raises(error) as info:
        HostBufferPool(**kwargs)  # type: ignore[arg-type]
    assert str(info.value).startswith("HostBufferPool: ") and words in str(info.value)


@pytest.mark.parametrize(
    ("nbytes", "error"), [(-1, ArgumentError), (2.0, ArgumentTypeError), ("8", ArgumentTypeError)]
)
def test_acquire_checks_nbytes(nbytes: object, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"HostBufferPool\.acquire: nbytes"):
        HostBufferPool().acquire(nbytes)  # type: ignore[arg-type]


def test_pool_rejects_an_allocator_that_returns_the_wrong_thing() -> None:
    pool = HostBufferPool(lambda n: np.empty(n // 8, np.float64))
    with pytest.raises(ArgumentTypeError, match="expected a 1-D uint8 numpy array of 4096 bytes"):
        pool.acquire(10)
    assert pool.stats().bytes_held == 0


# ---- MPICOMM_STAGING_CHUNK ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "size"),
    [
        (None, DEFAULT_CHUNK_BYTES),
        ("", DEFAULT_CHUNK_BYTES),
        ("1", 1),
        ("65536", 65536),
        ("512K", 512 * KiB),
        ("512kib", 512 * KiB),
        ("4M", 4 * MiB),
        (" 8 MiB ", 8 * MiB),
        ("1G", 1 << 30),
        ("100b", 100),
        ("4.5M", 4 * MiB + 512 * KiB),  # the shared parser (mpicomm.sizes) takes exact fractions
    ],
)
def test_chunk_bytes_reads_sizes_with_binary_units(value: str | None, size: int) -> None:
    env = {} if value is None else {"MPICOMM_STAGING_CHUNK": value}
    assert chunk_bytes(env) == size


def test_default_chunk_is_4_mib() -> None:
    assert chunk_bytes({}) == 4 * MiB


@pytest.mark.parametrize("value", ["0", "0M", "-4M", "4 X", "0.5B", "M", "2G", "4 M B", "0x10"])
def test_chunk_bytes_rejects_bad_values_naming_variable_and_value(value: str) -> None:
    with pytest.raises(ArgumentError) as info:
        chunk_bytes({"MPICOMM_STAGING_CHUNK": value})
    assert "MPICOMM_STAGING_CHUNK" in str(info.value) and repr(value) in str(info.value)


def test_chunk_bytes_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPICOMM_STAGING_CHUNK", "64K")
    assert chunk_bytes() == 64 * KiB
    assert plan_chunks(200 * KiB).chunk_bytes == 64 * KiB


# ---- chunk plans --------------------------------------------------------------------------------------


def test_empty_message_has_no_chunks() -> None:
    plan = plan_chunks(0, itemsize=8, chunk=MiB)
    assert len(plan) == 0 and plan.chunks == () and plan.buffer_bytes == 0


def test_one_byte_message_is_one_chunk() -> None:
    plan = plan_chunks(1, chunk=MiB)
    assert [(c.index, c.start, c.stop, c.buffer) for c in plan] == [(0, 0, 1, 0)] and plan.buffer_bytes == 1


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_exact_multiple_gives_equal_chunks(count: int) -> None:
    plan = plan_chunks(count * MiB, itemsize=4, chunk=MiB)
    assert len(plan) == count
    assert all(c.nbytes == MiB for c in plan)
    assert [c.buffer for c in plan] == [i % 2 for i in range(count)]


def test_one_byte_over_a_multiple_adds_a_one_element_chunk() -> None:
    plan = plan_chunks(2 * MiB + 2, itemsize=2, chunk=MiB)
    assert [c.nbytes for c in plan] == [MiB, MiB, 2]


def test_chunks_are_aligned_down_to_whole_elements() -> None:
    plan = plan_chunks(12 * 100, itemsize=12, chunk=1000)  # 1000 is not a multiple of 12: 996 is
    assert plan.chunk_bytes == 996
    assert all(c.start % 12 == 0 and c.nbytes % 12 == 0 for c in plan)


def test_element_larger_than_the_chunk_gives_one_element_per_chunk() -> None:
    plan = plan_chunks(3 * 64, itemsize=64, chunk=10)
    assert [(c.start, c.stop) for c in plan] == [(0, 64), (64, 128), (128, 192)]


def test_chunks_rotate_through_the_requested_number_of_buffers() -> None:
    plan = plan_chunks(7, chunk=1, buffers=3)
    assert [c.buffer for c in plan] == [0, 1, 2, 0, 1, 2, 0]
    assert [c.buffer for c in plan_chunks(5, chunk=1, buffers=1)] == [0] * 5


@given(
    count=st.integers(0, 5000),
    itemsize=st.sampled_from([1, 2, 4, 8, 12, 16, 24]),
    chunk=st.integers(1, 4096),
    buffers=st.integers(1, 4),
)
def test_chunk_plan_tiles_the_message_in_order(count: int, itemsize: int, chunk: int, buffers: int) -> None:
    nbytes = count * itemsize
    plan = plan_chunks(nbytes, itemsize=itemsize, chunk=chunk, buffers=buffers)
    starts = [c.start for c in plan]
    stops = [c.stop for c in plan]
    assert starts == ([0, *stops[:-1]] if stops else [])  # contiguous, no gaps or overlaps
    assert (stops[-1] if stops else 0) == nbytes
    assert all(0 < c.nbytes <= plan.chunk_bytes and c.nbytes % itemsize == 0 for c in plan)
    assert all(c.nbytes == plan.chunk_bytes for c in plan.chunks[:-1])
    assert plan.chunk_bytes % itemsize == 0 and plan.chunk_bytes >= itemsize
    assert plan.chunk_bytes <= max(chunk, itemsize)
    assert [c.index for c in plan] == list(range(len(plan)))
    assert [c.buffer for c in plan] == [i % buffers for i in range(len(plan))]
    assert plan.buffer_bytes == max((c.nbytes for c in plan), default=0)


def test_chunk_plan_drives_a_double_buffered_copy() -> None:
    """Copy a message through two pooled buffers chunk by chunk, as the staged path will."""
    rng = np.random.default_rng(7)
    src = rng.standard_normal(10_001)
    dst = np.empty_like(src)
    pool = HostBufferPool()
    plan = plan_chunks(src.nbytes, itemsize=src.itemsize, chunk=16 * KiB)
    raw_src, raw_dst = src.view(np.uint8), dst.view(np.uint8)
    staging = [pool.acquire(plan.buffer_bytes) for _ in range(plan.buffers)]
    for c in plan:
        buf = staging[c.buffer][: c.nbytes]
        buf[:] = raw_src[c.start : c.stop]
        raw_dst[c.start : c.stop] = buf
    for buf in staging:
        pool.release(buf)
    np.testing.assert_array_equal(dst, src)
    assert pool.stats().allocations == 2 and len(plan) == -(-src.nbytes // (16 * KiB))


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"nbytes": -1}, ArgumentError, "nbytes is -1"),
        ({"nbytes": 10, "itemsize": 0}, ArgumentError, "itemsize is 0"),
        ({"nbytes": 10, "chunk": 0}, ArgumentError, "chunk is 0"),
        ({"nbytes": 10, "buffers": 0}, ArgumentError, "buffers is 0"),
        ({"nbytes": 10, "itemsize": 4}, ArgumentError, "not a multiple of itemsize 4"),
        ({"nbytes": 10.0}, ArgumentTypeError, "nbytes is a float"),
        ({"nbytes": 10, "itemsize": True}, ArgumentTypeError, "itemsize is a bool"),
        ({"nbytes": 10, "chunk": "4M"}, ArgumentTypeError, "chunk is a str"),
    ],
)
def test_plan_chunks_checks_its_arguments(
    kwargs: dict[str, object], error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as info:
        plan_chunks(**kwargs)  # type: ignore[arg-type]
    assert str(info.value).startswith("plan_chunks: ") and words in str(info.value)
