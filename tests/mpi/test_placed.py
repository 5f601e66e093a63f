"""List entries laid out every way, for gather (one ``MPI_Gatherv`` into them), scatter, all_gather.

gather's displacements are measured from the entry lowest in memory (``mpicomm.dense.placed``), so
the tests lay entries out in every order within one buffer, leave gaps, mix in empty entries and
strided entries (those go through a temporary), use the root's own entry as its input or output
(``MPI_IN_PLACE`` for gather), and run blocking and asynchronous calls, on the world and on a
subgroup; scatter (pairwise) and small all_gather (one ``Allgather`` through a temporary) get the
same layouts. Every rank builds the global input from the shared seed and checks its part against
numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpicomm


def _sizes(rng: np.random.Generator, w: int) -> list[int]:
    return [int(n) for n in rng.integers(0, 6, w)]


def _slots(buf: np.ndarray, sizes: list[int], order: np.ndarray, gap: int) -> list[np.ndarray]:
    """Entries of ``sizes`` cut from ``buf`` in the given order, ``gap`` elements apart."""
    entries: list[np.ndarray] = [np.empty(0)] * len(sizes)
    start = 0
    for i in order:
        entries[i] = buf[start : start + sizes[i]]
        start += sizes[i] + gap
    return entries


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("layout", ["reversed", "shuffled", "strided"])
def test_gather_into_entries_of_one_buffer_in_any_order(world, rng, layout, async_op):
    w, r = world.size(), world.rank()
    root = w - 1
    sizes = _sizes(rng, w)
    parts = [rng.standard_normal(n) for n in sizes]
    order = np.arange(w)[::-1] if layout == "reversed" else rng.permutation(w)
    out = None
    if r == root:
        buf = np.full(2 * (sum(sizes) + 3 * w), np.nan)
        if layout == "strided":
            out = [e[::2] for e in _slots(buf, [2 * n for n in sizes], order, 1)]
        else:
            out = _slots(buf, sizes, order, 3)
    work = mpicomm.gather(parts[r].copy(), out, dst=root, async_op=async_op)
    if async_op:
        work.wait()
    if out is not None:
        for got, want in zip(out, parts, strict=True):
            np.testing.assert_array_equal(got, want)
        if layout != "strided":  # the gaps between the entries stay untouched
            assert np.isnan(buf[sum(sizes) + 3 * w :]).all()


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("async_op", [False, True])
def test_gather_with_the_roots_input_in_its_own_entry(world, rng, async_op):
    w, r = world.size(), world.rank()
    parts = rng.integers(-9, 9, (w, 3))
    buf = np.zeros((w, 3), np.int64)
    buf[r] = parts[r]
    out = list(buf) if r == 0 else None
    work = mpicomm.gather(buf[r], out, dst=0, async_op=async_op)
    if async_op:
        work.wait()
    if r == 0:
        np.testing.assert_array_equal(buf, parts)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("layout", ["reversed", "strided"])
def test_scatter_from_entries_of_one_buffer(world, rng, layout, async_op):
    w, r = world.size(), world.rank()
    src = w // 2
    sizes = _sizes(rng, w)
    parts = [rng.integers(-50, 50, n) for n in sizes]
    ins = None
    if r == src:
        buf = np.zeros(2 * (sum(sizes) + w), np.int64)
        if layout == "strided":
            ins = [e[::2] for e in _slots(buf, [2 * n for n in sizes], np.arange(w), 0)]
        else:
            ins = _slots(buf, sizes, np.arange(w)[::-1], 1)
        for e, p in zip(ins, parts, strict=True):
            e[...] = p
    out = np.full(sizes[r], -99, np.int64)
    work = mpicomm.scatter(out, ins, src=src, async_op=async_op)
    if async_op:
        work.wait()
    np.testing.assert_array_equal(out, parts[r])


@pytest.mark.mpi(min_size=1)
def test_scatter_into_the_roots_own_entry_leaves_it_and_fills_the_others(world, rng):
    w, r = world.size(), world.rank()
    parts = rng.integers(-9, 9, (w, 4))
    buf = parts.copy() if r == 0 else None
    out = buf[0] if r == 0 else np.zeros(4, parts.dtype)
    mpicomm.scatter(out, list(buf) if r == 0 else None, src=0)
    np.testing.assert_array_equal(out, parts[r])
    if r == 0:
        np.testing.assert_array_equal(buf, parts)


@pytest.mark.mpi(min_size=2)
def test_gather_and_scatter_on_a_subgroup_with_non_members(world, rng):
    w, r = world.size(), world.rank()
    members = list(range(0, w, 2)) if w > 2 else [0, 1]
    g = mpicomm.new_group(members)
    parts = rng.standard_normal((len(members), 2))
    if r not in members:
        with pytest.warns(UserWarning):
            mpicomm.gather(np.zeros(2), None, group=g)
        return
    me = members.index(r)
    root = members[-1]
    out = [np.empty(2) for _ in members] if r == root else None
    mpicomm.gather(parts[me].copy(), out, dst=root, group=g)
    if out is not None:
        np.testing.assert_array_equal(np.stack(out), parts)
    got = np.empty(2)
    ins = [p.copy() for p in parts] if r == root else None
    mpicomm.scatter(got, ins, group=g, group_src=len(members) - 1)
    np.testing.assert_array_equal(got, parts[me])


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("async_op", [False, True])
def test_small_all_gather_of_uneven_sizes_into_one_buffer_in_reverse(world, rng, async_op):
    w, r = world.size(), world.rank()
    sizes = _sizes(rng, w)
    parts = [rng.standard_normal(n).astype(np.float32) for n in sizes]
    buf = np.full(sum(sizes) + 2 * w, np.nan, np.float32)
    out = _slots(buf, sizes, np.arange(w)[::-1], 2)
    work = mpicomm.all_gather(out, parts[r].copy(), async_op=async_op)
    if async_op:
        work.wait()
    for got, want in zip(out, parts, strict=True):
        np.testing.assert_array_equal(got, want)
    assert np.isnan(buf).sum() == 2 * w


@pytest.mark.mpi(min_size=1)
def test_gather_and_scatter_of_torch_tensors(world, rng):
    torch = pytest.importorskip("torch")
    w, r = world.size(), world.rank()
    parts = rng.standard_normal((w, 3))
    out = [torch.empty(3, dtype=torch.float64) for _ in range(w)] if r == 0 else None
    mpicomm.gather(torch.from_numpy(parts[r].copy()), out, dst=0)
    if out is not None:
        np.testing.assert_array_equal(torch.stack(out).numpy(), parts)
    got = torch.zeros(3, dtype=torch.float64)
    mpicomm.scatter(got, [torch.from_numpy(p.copy()) for p in parts] if r == 0 else None, src=0)
    np.testing.assert_array_equal(got.numpy(), parts[r])
