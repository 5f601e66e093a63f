"""Property tests: random shapes, dtypes and split sizes (zeros included), checked against numpy.

Under MPI every rank must run the same examples in the same order, or the collectives would pair up
wrongly. Hence: derandomized generation, no example database, no shrinking (a failing rank would
shrink alone) and no deadline. Each example draws the global quantities (a W x W split matrix, a
shape, a dtype, a seed) from the same strategy on every rank, and every rank derives its own part.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from reference import OP_KINDS, UFUNCS

import mpicomm
from mpicomm import ReduceOp

SAME_ON_EVERY_RANK = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=15,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)

REDUCIBLE = ["?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f4", "f8", "c8", "c16"]
# what can be moved but not reduced: half floats, the other byte order, records
MOVABLE = [*REDUCIBLE, "f2", ">i4", ">f8", "record"]
RECORD = np.dtype([("a", "<i2"), ("b", "<f8")])

shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)
seeds = st.integers(0, 2**32 - 1)


def dtype_of(spec: str) -> np.dtype[Any]:
    return RECORD if spec == "record" else np.dtype(spec)


def values(seed: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
    """Random values whose sums and products over <= 8 ranks are exact in ``dtype`` (always an array,
    also for shape ``()``)."""
    rng = np.random.default_rng(seed)
    if dtype.names:
        out = np.zeros(shape, dtype)
        for name in dtype.names:
            out[name] = rng.integers(-50, 50, shape)
        return out
    kind = dtype.kind
    if kind == "b":
        raw: Any = rng.integers(0, 2, shape)
    elif kind == "u":
        raw = rng.integers(0, 4, shape)
    elif kind == "i":
        raw = rng.integers(-3, 4, shape)
    elif kind == "f":
        raw = rng.integers(-4, 5, shape) / 2
    else:
        raw = rng.integers(-2, 3, shape) + 1j * rng.integers(-2, 3, shape)
    return np.asarray(raw).astype(dtype)


def offsets(sizes: Any) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(int)


def split_matrix(data: st.DataObject, w: int, most: int = 3) -> np.ndarray:
    """A W x W matrix of non-negative sizes, zeros included: entry [i][j] is what i sends to j."""
    flat = data.draw(st.lists(st.integers(0, most), min_size=w * w, max_size=w * w), label="sizes")
    return np.array(flat, dtype=int).reshape(w, w)


# --------------------------------------------------------------------------------------- reductions


@pytest.mark.mpi(min_size=1)
@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_all_reduce_equals_numpy_reduction(world, data):
    name = data.draw(st.sampled_from(list(OP_KINDS)), label="op")
    allowed = [s for s in REDUCIBLE if dtype_of(s).kind in OP_KINDS[name]]
    dt = dtype_of(data.draw(st.sampled_from(allowed), label="dtype"))
    shape = data.draw(shapes, label="shape")
    seed = data.draw(seeds, label="seed")
    w, r = world.size(), world.rank()
    glob = values(seed, dt, (w, *shape))
    x = glob[r, ...].copy()
    op: ReduceOp = getattr(ReduceOp, name)
    if name == "PREMUL_SUM":
        op = op(2 if dt.kind in "iu" else 0.5)
    mpicomm.all_reduce(x, op=op)
    if name in UFUNCS:
        want = UFUNCS[name].reduce(glob, axis=0, dtype=dt)
    elif name == "PREMUL_SUM":
        want = np.add.reduce(glob * np.asarray(op.factor).astype(dt), axis=0, dtype=dt)
    else:
        total = np.add.reduce(glob, axis=0, dtype=dt)
        want = total / dt.type(w) if dt.kind in "fc" else np.trunc(total / w).astype(dt)
    assert x.shape == shape and x.dtype == dt
    np.testing.assert_array_equal(x, want)


@pytest.mark.mpi(min_size=1)
@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_reduce_scatter_lists_equal_numpy_sums(world, data):
    w, r = world.size(), world.rank()
    sizes = data.draw(st.lists(st.integers(0, 4), min_size=w, max_size=w), label="sizes")
    dt = dtype_of(data.draw(st.sampled_from(["i4", "u8", "f4", "f8", "c16"]), label="dtype"))
    adjacent = data.draw(st.booleans(), label="views of one buffer")
    seed = data.draw(seeds, label="seed")
    starts = offsets(sizes)
    glob = values(seed, dt, (w, int(starts[-1])))
    mine = glob[r].copy()
    ins = [mine[starts[i] : starts[i + 1]] for i in range(w)]
    if not adjacent:
        ins = [a.copy() for a in ins]
    out = np.empty(sizes[r], dt)
    mpicomm.reduce_scatter(out, ins)
    np.testing.assert_array_equal(out, glob[:, starts[r] : starts[r + 1]].sum(axis=0, dtype=dt))


@pytest.mark.mpi(min_size=1)
@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_reduce_scatter_tensor_equals_chunked_sum(world, data):
    w, r = world.size(), world.rank()
    chunk = data.draw(shapes, label="chunk shape")
    dt = dtype_of(data.draw(st.sampled_from(REDUCIBLE), label="dtype"))
    stacked = data.draw(st.booleans(), label="stacked input")
    seed = data.draw(seeds, label="seed")
    glob = values(seed, dt, (w, w, *chunk))  # glob[k][i]: rank k's chunk for rank i
    n = int(np.prod(chunk))
    inp = glob[r].copy() if stacked else glob[r].reshape(w * n)
    out = np.empty(chunk, dt)
    op = ReduceOp.MAX if dt.kind != "c" else ReduceOp.SUM
    mpicomm.reduce_scatter_tensor(out, inp, op=op)
    ufunc = np.maximum if dt.kind != "c" else np.add
    np.testing.assert_array_equal(out, ufunc.reduce(glob[:, r], axis=0, dtype=dt))


# ------------------------------------------------------------------------------------ moving data


@pytest.mark.mpi(min_size=1)
@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_all_to_all_single_routes_every_row(world, data):
    w, r = world.size(), world.rank()
    sizes = split_matrix(data, w)
    row = data.draw(st.lists(st.integers(0, 3), max_size=2).map(tuple), label="row shape")
    dt = dtype_of(data.draw(st.sampled_from(MOVABLE), label="dtype"))
    seed = data.draw(seeds, label="seed")
    inputs = [values(seed + i, dt, (int(sizes[i].sum()), *row)) for i in range(w)]
    want = np.concatenate([inputs[j][offsets(sizes[j])[r] : offsets(sizes[j])[r + 1]] for j in range(w)])
    out = np.zeros((int(sizes[:, r].sum()), *row), dt)
    mpicomm.all_to_all_single(out, inputs[r], sizes[:, r].tolist(), sizes[r].tolist())
    np.testing.assert_array_equal(out, want)


@pytest.mark.mpi(min_size=1)
@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_all_to_all_lists_deliver_each_piece(world, data):
    w, r = world.size(), world.rank()
    sizes = split_matrix(data, w)
    dt = dtype_of(data.draw(st.sampled_from(MOVABLE), label="dtype"))
    seed = data.draw(seeds, label="seed")
    pieces = [[values(seed + w * i + j, dt, (int(sizes[i][j]),)) for j in range(w)] for i in range(w)]
    outs = [np.zeros(int(sizes[j][r]), dt) for j in range(w)]
    mpicomm.all_to_all(outs, pieces[r])
    for j in range(w):
        np.testing.assert_array_equal(outs[j], pieces[j][r])


@pytest.mark.mpi(min_size=1)
@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_all_gather_and_gather_collect_uneven_pieces(world, data):
    w, r = world.size(), world.rank()
    sizes = data.draw(st.lists(st.integers(0, 4), min_size=w, max_size=w), label="sizes")
    dt = dtype_of(data.draw(st.sampled_from(MOVABLE), label="dtype"))
    root = data.draw(st.integers(0, w - 1), label="root")
    seed = data.draw(seeds, label="seed")
    parts = [values(seed + i, dt, (sizes[i],)) for i in range(w)]
    outs = [np.zeros(n, dt) for n in sizes]
    mpicomm.all_gather(outs, parts[r])
    for got, want in zip(outs, parts, strict=True):
        np.testing.assert_array_equal(got, want)
    outs = [np.zeros(n, dt) for n in sizes] if r == root else None
    mpicomm.gather(parts[r], outs, dst=root)
    if r == root:
        for got, want in zip(outs, parts, strict=True):
            np.testing.assert_array_equal(got, want)


@pytest.mark.mpi(min_size=1)
@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_scatter_and_broadcast_deliver_the_roots_data(world, data):
    w, r = world.size(), world.rank()
    sizes = data.draw(st.lists(st.integers(0, 4), min_size=w, max_size=w), label="sizes")
    shape = data.draw(shapes, label="broadcast shape")
    dt = dtype_of(data.draw(st.sampled_from(MOVABLE), label="dtype"))
    root = data.draw(st.integers(0, w - 1), label="root")
    seed = data.draw(seeds, label="seed")
    parts = [values(seed + i, dt, (sizes[i],)) for i in range(w)]
    out = np.zeros(sizes[r], dt)
    mpicomm.scatter(out, parts if r == root else None, src=root)
    np.testing.assert_array_equal(out, parts[r])
    whole = values(seed + w, dt, shape)
    x = whole.copy() if r == root else np.zeros(shape, dt)
    mpicomm.broadcast(x, src=root)
    np.testing.assert_array_equal(x, whole)


@pytest.mark.mpi(min_size=1)
@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_all_gather_into_tensor_stacks_every_input(world, data):
    w, r = world.size(), world.rank()
    shape = data.draw(shapes, label="input shape")
    dt = dtype_of(data.draw(st.sampled_from(MOVABLE), label="dtype"))
    flat = data.draw(st.booleans(), label="flat output")
    seed = data.draw(seeds, label="seed")
    glob = values(seed, dt, (w, *shape))
    out = np.zeros(w * int(np.prod(shape)), dt) if flat else np.zeros((w, *shape), dt)
    mpicomm.all_gather_into_tensor(out, glob[r, ...].copy())
    np.testing.assert_array_equal(out.reshape(glob.shape), glob)


# ------------------------------------------------------------------------------------------- groups


@pytest.mark.mpi(min_size=1)
@SAME_ON_EVERY_RANK
@given(data=st.data())
def test_all_reduce_in_a_random_subgroup_sums_its_members_only(world, data):
    w, r = world.size(), world.rank()
    members = data.draw(st.lists(st.booleans(), min_size=w, max_size=w), label="membership")
    ranks = [i for i, m in enumerate(members) if m]
    seed = data.draw(seeds, label="seed")
    glob = values(seed, np.dtype("i8"), (w, 3))
    group = mpicomm.new_group(ranks)
    try:
        x = glob[r].copy()
        if r in ranks:
            mpicomm.all_reduce(x, group=group)
            np.testing.assert_array_equal(x, glob[ranks].sum(axis=0))
            assert group.rank() == ranks.index(r) and group.size() == len(ranks)
        else:
            with pytest.warns(UserWarning, match="not a member"):
                assert mpicomm.all_reduce(x, group=group) is None
            np.testing.assert_array_equal(x, glob[r])
    finally:
        mpicomm.destroy_process_group(group)
