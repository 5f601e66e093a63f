"""Reductions, broadcast, gathers, scatters and barrier, checked against numpy at any world size.

Every rank builds the global input (one slice per rank) from the shared seed, runs the collective on its
own slice and compares with a plain numpy reduction of the global input. Values are small integers,
halves or small Gaussian integers, so every sum and product is exact in every dtype and in any order.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from reference import OP_KINDS, UFUNCS

import mpicomm
from mpicomm import ReduceOp

INTS = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
FLOATS = [np.float32, np.float64, np.longdouble]
COMPLEXES = [np.complex64, np.complex128, np.clongdouble]
REDUCIBLE = [np.bool_, *INTS, *FLOATS, *COMPLEXES]
MOVABLE = [*REDUCIBLE, np.float16]

FACTOR = {"i": 3, "u": 3, "f": 0.5, "c": 0.5 - 1j}


def values(rng: np.random.Generator, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
    """Random values of ``dtype`` whose sums and products over <= 8 ranks are exact."""
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dt.kind == "u":
        return rng.integers(0, 4, shape).astype(dt)
    if dt.kind == "i":
        return rng.integers(-3, 4, shape).astype(dt)
    if dt.kind == "f":
        return (rng.integers(-4, 5, shape) / 2).astype(dt)
    return (rng.integers(-2, 3, shape) + 1j * rng.integers(-2, 3, shape)).astype(dt)


def make_op(name: str, dtype: Any) -> ReduceOp:
    op: ReduceOp = getattr(ReduceOp, name)
    return op(FACTOR[np.dtype(dtype).kind]) if name == "PREMUL_SUM" else op


def reference(name: str, data: np.ndarray, factor: Any = None) -> np.ndarray:
    """numpy's answer for reducing ``data`` over axis 0 (the ranks) in its own dtype."""
    dt, w = data.dtype, data.shape[0]
    if name in UFUNCS:
        return UFUNCS[name].reduce(data, axis=0, dtype=dt)
    if name == "PREMUL_SUM":
        return np.add.reduce(data * np.asarray(factor).astype(dt), axis=0, dtype=dt)
    total = np.add.reduce(data, axis=0, dtype=dt)
    if dt.kind in "fc":
        return total / dt.type(w)
    return np.trunc(total.astype(np.float64) / w).astype(dt)  # AVG on integers truncates toward 0


def valid_pairs() -> list[Any]:
    return [
        pytest.param(name, dt, id=f"{name}-{np.dtype(dt).name}")
        for name, kinds in OP_KINDS.items()
        for dt in REDUCIBLE
        if np.dtype(dt).kind in kinds
    ]


def rows_of(sizes: np.ndarray) -> np.ndarray:
    """Start offsets of consecutive pieces of the given sizes."""
    return np.concatenate([[0], np.cumsum(sizes)]).astype(int)


# ------------------------------------------------------------------------------------------ all_reduce


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize(("name", "dtype"), valid_pairs())
def test_all_reduce_matches_numpy_for_every_op_and_dtype(world, rng, name, dtype):
    data = values(rng, dtype, (world.size(), 2, 3))
    x = data[world.rank()].copy()
    op = make_op(name, dtype)
    assert mpicomm.all_reduce(x, op=op) is None
    assert x.dtype == data.dtype and x.shape == (2, 3)
    np.testing.assert_array_equal(x, reference(name, data, op.factor))


@pytest.mark.mpi(min_size=1)
def test_all_reduce_bool_ops_are_logical(world, rng):
    data = rng.integers(0, 2, (world.size(), 16)).astype(bool)
    expected = {
        "SUM": data.any(axis=0),
        "MAX": data.any(axis=0),
        "BOR": data.any(axis=0),
        "PRODUCT": data.all(axis=0),
        "MIN": data.all(axis=0),
        "BAND": data.all(axis=0),
        "BXOR": data.sum(axis=0) % 2 == 1,
    }
    for name, want in expected.items():
        x = data[world.rank()].copy()
        mpicomm.all_reduce(x, op=getattr(ReduceOp, name))
        assert x.dtype == np.bool_
        np.testing.assert_array_equal(x, want, err_msg=name)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_all_reduce_avg_on_integers_truncates_toward_zero(world, dtype):
    w = world.size()
    # rank 0 holds sums that are not multiples of w; the other ranks add zeros
    sums = np.array([-(w + 1), w + 1, -(2 * w - 1), 2 * w - 1, -w, 0], dtype=dtype)
    x = sums.copy() if world.rank() == 0 else np.zeros_like(sums)
    mpicomm.all_reduce(x, op=ReduceOp.AVG)
    expected = [int(s / w) for s in sums.tolist()]  # Python's int() truncates toward zero
    assert x.tolist() == expected
    if w >= 2:
        assert x[0] == -1  # floor division would give -2


@pytest.mark.mpi(min_size=1)
def test_all_reduce_avg_on_random_integers_matches_truncated_mean(world, rng):
    data = rng.integers(-50, 51, (world.size(), 40)).astype(np.int64)
    x = data[world.rank()].copy()
    mpicomm.all_reduce(x, op=ReduceOp.AVG)
    np.testing.assert_array_equal(x, np.trunc(data.sum(axis=0) / world.size()).astype(np.int64))


@pytest.mark.mpi(min_size=1)
def test_all_reduce_premul_sum_accepts_a_one_element_array_factor(world, rng):
    data = values(rng, np.float64, (world.size(), 5))
    x = data[world.rank()].copy()
    mpicomm.all_reduce(x, op=ReduceOp.PREMUL_SUM(np.array([0.25])))
    np.testing.assert_array_equal(x, (0.25 * data).sum(axis=0))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0, 2), (1, 1, 1, 5)], ids=str)
def test_all_reduce_handles_scalars_and_empty_arrays(world, rng, shape):
    data = values(rng, np.float64, (world.size(), *shape))
    x = data[world.rank(), ...].copy()  # a 0-d array, not a numpy scalar, for shape ()
    mpicomm.all_reduce(x, op=ReduceOp.MAX)
    assert x.shape == shape
    np.testing.assert_array_equal(x, data.max(axis=0))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize(
    ("op", "dtype", "words"),
    [
        (ReduceOp.AVG, np.bool_, "expected one of the dtype kinds"),
        (ReduceOp.MIN, np.complex128, "all_reduce does not support MIN on complex tensors"),
        (ReduceOp.BAND, np.float64, "expected one of the dtype kinds"),
        (ReduceOp.BXOR, np.float16, "expected one of the dtype kinds"),
        (ReduceOp.PREMUL_SUM, np.float64, "without a factor"),
        (ReduceOp.PREMUL_SUM(0.5), np.int32, "expected an integer factor"),
    ],
    ids=["avg-bool", "min-complex", "band-float", "bxor-float16", "premul-no-factor", "premul-int"],
)
def test_all_reduce_refuses_ops_undefined_on_the_dtype(world, op, dtype, words):
    x = np.ones(3, dtype=dtype)
    with pytest.raises(mpicomm.ReductionTypeError, match=words):
        mpicomm.all_reduce(x, op=op)
    assert (x == 1).all()


@pytest.mark.mpi(min_size=1)
def test_all_reduce_refuses_read_only_and_writes_strided_arrays_after_a_first_call(world):
    x = np.ones(4)
    mpicomm.all_reduce(x)  # a first call with this op and dtype, so later calls take the quick path
    frozen = np.ones(4)
    frozen.flags.writeable = False
    with pytest.raises(mpicomm.ArgumentError, match="read-only"):
        mpicomm.all_reduce(frozen)
    base = np.zeros(8)
    base[::2] = 1
    mpicomm.all_reduce(base[::2])  # written through, the gaps untouched
    assert base.tolist() == [world.size(), 0] * 4
    x[:] = 1
    mpicomm.all_reduce(x)
    assert (x == world.size()).all()


@pytest.mark.mpi(min_size=4)
def test_all_reduce_reference_vectors_at_four_ranks(world):
    if world.size() != 4:
        pytest.skip("the §1.1 test vectors are for exactly 4 ranks")
    r = world.rank()
    cases = {
        ReduceOp.SUM: [10, 20],
        ReduceOp.AVG: [2.5, 5],
        ReduceOp.PREMUL_SUM(0.5): [5, 10],
        ReduceOp.MAX: [4, 8],
        ReduceOp.MIN: [1, 2],
        ReduceOp.PRODUCT: [24, 384],
    }
    for op, want in cases.items():
        x = np.array([r + 1, 2 * (r + 1)], dtype=np.float32)
        mpicomm.all_reduce(x, op=op)
        assert x.tolist() == want, op
    for op, want in {ReduceOp.BXOR: 4, ReduceOp.BOR: 7, ReduceOp.BAND: 0}.items():
        x = np.array([r + 1], dtype=np.int64)
        mpicomm.all_reduce(x, op=op)
        assert x.tolist() == [want], op


# ---------------------------------------------------------------------------------------------- reduce


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("SUM", np.float64),
        ("MAX", np.int32),
        ("AVG", np.int64),
        ("AVG", np.float32),
        ("PREMUL_SUM", np.complex128),
        ("BXOR", np.uint8),
        ("PRODUCT", np.bool_),
    ],
    ids=lambda v: v if isinstance(v, str) else np.dtype(v).name,
)
def test_reduce_gives_result_on_dst_and_leaves_others_unchanged(world, rng, name, dtype):
    data = values(rng, dtype, (world.size(), 3, 2))
    dst = world.size() - 1
    x = data[world.rank()].copy()
    op = make_op(name, dtype)
    assert mpicomm.reduce(x, dst=dst, op=op) is None
    if world.rank() == dst:
        np.testing.assert_array_equal(x, reference(name, data, op.factor))
    else:
        np.testing.assert_array_equal(x, data[world.rank()])


@pytest.mark.mpi(min_size=1)
def test_reduce_defaults_to_rank_zero_and_takes_group_dst(world, rng):
    data = values(rng, np.int64, (world.size(), 4))
    x = data[world.rank()].copy()
    mpicomm.reduce(x)
    np.testing.assert_array_equal(x, data.sum(axis=0) if world.rank() == 0 else data[world.rank()])
    dst = world.size() // 2
    y = data[world.rank()].copy()
    mpicomm.reduce(y, group_dst=dst, op=ReduceOp.MIN)
    np.testing.assert_array_equal(y, data.min(axis=0) if world.rank() == dst else data[world.rank()])


# ------------------------------------------------------------------------------------------- broadcast


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", MOVABLE, ids=lambda d: np.dtype(d).name)
def test_broadcast_copies_src_to_every_rank(world, rng, dtype):
    data = values(rng, dtype, (2, 3))
    src = world.size() - 1
    x = data.copy() if world.rank() == src else np.zeros_like(data)
    assert mpicomm.broadcast(x, src=src) is None
    np.testing.assert_array_equal(x, data)


@pytest.mark.mpi(min_size=1)
def test_broadcast_takes_group_src_and_defaults_to_rank_zero(world, rng):
    data = rng.standard_normal((world.size(), 5))
    for kwargs, root in [({}, 0), ({"group_src": world.size() // 2}, world.size() // 2)]:
        x = data[world.rank()].copy()
        mpicomm.broadcast(x, **kwargs)
        np.testing.assert_array_equal(x, data[root])


@pytest.mark.mpi(min_size=1)
def test_broadcast_with_both_src_and_group_src_is_refused(world):
    with pytest.raises(mpicomm.ArgumentError, match="both src=0 and group_src=0"):
        mpicomm.broadcast(np.zeros(2), src=0, group_src=0)


# ------------------------------------------------------------------------------------------ all_gather


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("dtype", [np.float64, np.int16, np.bool_, np.float16, np.complex64])
def test_all_gather_uneven_sizes_fill_every_slot(world, rng, dtype):
    w, r = world.size(), world.rank()
    sizes = rng.integers(0, 5, w)
    parts = [values(rng, dtype, (int(n),)) for n in sizes]
    out = [np.full(int(n), 7, dtype=dtype) for n in sizes]
    assert mpicomm.all_gather(out, parts[r].copy()) is None
    for got, want in zip(out, parts, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.mpi(min_size=1)
def test_all_gather_into_differently_shaped_outputs_of_the_right_size(world, rng):
    w, r = world.size(), world.rank()
    parts = [rng.standard_normal((2, 3)) for _ in range(w)]
    out = [np.empty(6) if i % 2 else np.empty((3, 2)) for i in range(w)]
    mpicomm.all_gather(out, parts[r])
    for got, want in zip(out, parts, strict=True):
        np.testing.assert_array_equal(got.reshape(-1), want.reshape(-1))


@pytest.mark.mpi(min_size=1)
def test_all_gather_sends_a_non_contiguous_input(world, rng):
    w, r = world.size(), world.rank()
    mats = rng.standard_normal((w, 4, 3))
    out = [np.empty(4) for _ in range(w)]
    mpicomm.all_gather(out, mats[r][:, 1])
    for i in range(w):
        np.testing.assert_array_equal(out[i], mats[i][:, 1])


@pytest.mark.mpi(min_size=1)
def test_all_gather_into_chunks_of_one_buffer_with_the_input_in_its_own_slot(world, rng):
    w, r = world.size(), world.rank()
    data = rng.standard_normal((w, 3))
    buf = np.zeros((w, 3))
    buf[r] = data[r]
    chunks = list(buf)  # views of one buffer; this rank's input is its own output slot
    mpicomm.all_gather(chunks, chunks[r])
    np.testing.assert_array_equal(buf, data)


@pytest.mark.mpi(min_size=2)
def test_all_gather_reference_vectors_at_two_ranks(world):
    if world.size() != 2:
        pytest.skip("the §1.6 test vectors are for exactly 2 ranks")
    r = world.rank()
    out = [np.empty(2, np.int64), np.empty(2, np.int64)]
    mpicomm.all_gather(out, np.array([[1, 2], [3, 4]][r]))
    assert [o.tolist() for o in out] == [[1, 2], [3, 4]]
    out = [np.empty(2, np.int64), np.empty(3, np.int64)]
    mpicomm.all_gather(out, np.array([[1, 2], [3, 4, 5]][r]))
    assert [o.tolist() for o in out] == [[1, 2], [3, 4, 5]]
    flat, stacked = np.empty(4, np.int64), np.empty((2, 2), np.int64)
    mpicomm.all_gather_into_tensor(flat, np.array([1 + 2 * r, 2 + 2 * r]))
    mpicomm.all_gather_into_tensor(stacked, np.array([1 + 2 * r, 2 + 2 * r]))
    assert flat.tolist() == [1, 2, 3, 4]
    assert stacked.tolist() == [[1, 2], [3, 4]]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["flat", "stacked"])
@pytest.mark.parametrize("dtype", [np.float32, np.uint16, np.float16, np.complex128])
def test_all_gather_into_tensor_concatenates_in_rank_order(world, rng, layout, dtype):
    w, r = world.size(), world.rank()
    data = values(rng, dtype, (w, 2, 3))
    out = np.empty((w * 2, 3) if layout == "flat" else (w, 2, 3), dtype=dtype)
    assert mpicomm.all_gather_into_tensor(out, data[r].copy()) is None
    np.testing.assert_array_equal(out.reshape(data.shape), data)


@pytest.mark.mpi(min_size=1)
def test_all_gather_single_is_all_gather_into_tensor(world, rng):
    assert mpicomm.all_gather_single is mpicomm.all_gather_into_tensor
    data = rng.standard_normal((world.size(), 3))
    out = np.empty_like(data)
    mpicomm.all_gather_single(out, data[world.rank()])
    np.testing.assert_array_equal(out, data)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["flat", "stacked"])
def test_all_gather_into_tensor_in_place_from_its_own_slot(world, rng, layout):
    # torch's idiom: the input is this rank's chunk of the output
    w, r = world.size(), world.rank()
    data = rng.standard_normal((w, 2, 2))
    out = np.zeros((w * 2, 2) if layout == "flat" else (w, 2, 2))
    mine = out[2 * r : 2 * r + 2] if layout == "flat" else out[r]
    mine[...] = data[r]
    mpicomm.all_gather_into_tensor(out, mine)
    np.testing.assert_array_equal(out.reshape(data.shape), data)


@pytest.mark.mpi(min_size=1)
def test_all_gather_into_tensor_zero_elements_is_a_no_op(world):
    out = np.empty((world.size(), 0))
    assert mpicomm.all_gather_into_tensor(out, np.empty(0)) is None


# ------------------------------------------------------------------------------------ gather, scatter


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("root", ["first", "last"])
def test_gather_uneven_sizes_arrive_on_dst_only(world, rng, root):
    w, r = world.size(), world.rank()
    dst = 0 if root == "first" else w - 1
    sizes = rng.integers(0, 5, w)
    parts = [rng.standard_normal(int(n)) for n in sizes]
    out = [np.full(int(n), np.nan) for n in sizes] if r == dst else None
    assert mpicomm.gather(parts[r], out, dst=dst) is None
    if r == dst:
        for got, want in zip(out, parts, strict=True):
            np.testing.assert_array_equal(got, want)


@pytest.mark.mpi(min_size=1)
def test_gather_takes_group_dst(world, rng):
    w, r = world.size(), world.rank()
    dst = w // 2
    parts = values(rng, np.int32, (w, 2, 2))
    out = [np.empty((2, 2), np.int32) for _ in range(w)] if r == dst else []
    mpicomm.gather(parts[r], out, group_dst=dst)
    if r == dst:
        np.testing.assert_array_equal(np.stack(out), parts)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("root", ["first", "last"])
def test_scatter_uneven_sizes_give_each_rank_its_piece(world, rng, root):
    w, r = world.size(), world.rank()
    src = 0 if root == "first" else w - 1
    sizes = rng.integers(0, 5, w)
    parts = [values(rng, np.int64, (int(n),)) for n in sizes]
    out = np.full(int(sizes[r]), -99, dtype=np.int64)
    assert mpicomm.scatter(out, [p.copy() for p in parts] if r == src else None, src=src) is None
    np.testing.assert_array_equal(out, parts[r])


@pytest.mark.mpi(min_size=1)
def test_scatter_takes_group_src_and_non_contiguous_inputs(world, rng):
    w, r = world.size(), world.rank()
    src = w // 2
    mats = rng.standard_normal((w, 3, 4))
    out = np.empty(3)
    mpicomm.scatter(out, [m[:, 2] for m in mats] if r == src else None, group_src=src)
    np.testing.assert_array_equal(out, mats[r][:, 2])


# ------------------------------------------------------------------------------------- reduce_scatter


def _split_inputs(layout: str, global_rows: list[np.ndarray]) -> list[np.ndarray]:
    """This rank's input_list: views of one buffer, or separately allocated arrays."""
    if layout == "separate":
        return [p.copy() for p in global_rows]
    buf = np.concatenate(global_rows)
    starts = rows_of(np.array([len(p) for p in global_rows]))
    return [buf[starts[i] : starts[i + 1]] for i in range(len(global_rows))]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["views", "separate"])
@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("SUM", np.float64),
        ("SUM", np.int32),
        ("MAX", np.float32),
        ("BOR", np.uint16),
        ("AVG", np.int64),
        ("AVG", np.complex128),
        ("PREMUL_SUM", np.float64),
        ("PREMUL_SUM", np.int16),
        ("PRODUCT", np.bool_),
    ],
    ids=lambda v: v if isinstance(v, str) else np.dtype(v).name,
)
def test_reduce_scatter_uneven_sizes_match_numpy(world, rng, layout, name, dtype):
    w, r = world.size(), world.rank()
    sizes = rng.integers(0, 4, w)
    starts = rows_of(sizes)
    data = values(rng, dtype, (w, int(starts[-1])))  # data[k] is rank k's whole input
    ins = _split_inputs(layout, [data[r][starts[i] : starts[i + 1]] for i in range(w)])
    before = [a.copy() for a in ins]
    out = np.empty(int(sizes[r]), dtype=dtype)
    op = make_op(name, dtype)
    assert mpicomm.reduce_scatter(out, ins, op=op) is None
    want = reference(name, data[:, starts[r] : starts[r + 1]], op.factor)
    np.testing.assert_array_equal(out, want)
    for a, b in zip(ins, before, strict=True):
        np.testing.assert_array_equal(a, b)  # inputs are not modified (PREMUL_SUM included)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("name", ["SUM", "AVG", "PREMUL_SUM"])
def test_reduce_scatter_in_place_into_its_own_input_slot(world, rng, name):
    w, r = world.size(), world.rank()
    data = values(rng, np.float64, (w, w, 2))  # data[k][i]: what rank k contributes to rank i
    ins = list(data[r].copy())
    op = make_op(name, np.float64)
    mpicomm.reduce_scatter(ins[r], ins, op=op)
    np.testing.assert_array_equal(ins[r], reference(name, data[:, r], op.factor))


@pytest.mark.mpi(min_size=1)
def test_reduce_scatter_views_in_reverse_order_of_one_buffer(world, rng):
    w, r = world.size(), world.rank()
    data = values(rng, np.float64, (w, w, 3))  # data[k][i]: what rank k sends to rank i
    buf = data[r][::-1].copy()  # rank i's piece lies at row w-1-i
    ins = [buf[w - 1 - i] for i in range(w)]
    out = np.empty(3)
    mpicomm.reduce_scatter(out, ins)
    np.testing.assert_array_equal(out, data[:, r].sum(axis=0))


@pytest.mark.mpi(min_size=2)
def test_reduce_scatter_reference_vector_at_two_ranks(world):
    if world.size() != 2:
        pytest.skip("the §1.7 test vector is for exactly 2 ranks")
    lists = [[[1, 2], [3, 4, 5]], [[10, 20], [30, 40, 50]]][world.rank()]
    out = np.empty(2 + world.rank(), np.int64)
    mpicomm.reduce_scatter(out, [np.array(a) for a in lists])
    assert out.tolist() == [[11, 22], [33, 44, 55]][world.rank()]
    out = np.empty(2, np.int64)
    mpicomm.reduce_scatter_tensor(out, np.array([0, 1, 2, 3]))
    assert out.tolist() == [[0, 2], [4, 6]][world.rank()]


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["flat", "stacked"])
@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("SUM", np.float64),
        ("MIN", np.int8),
        ("AVG", np.int32),
        ("AVG", np.float32),
        ("PREMUL_SUM", np.complex64),
        ("BXOR", np.bool_),
    ],
    ids=lambda v: v if isinstance(v, str) else np.dtype(v).name,
)
def test_reduce_scatter_tensor_gives_rank_r_chunk_r(world, rng, layout, name, dtype):
    w, r = world.size(), world.rank()
    data = values(rng, dtype, (w, w, 2, 2))  # data[k][i]: rank k's chunk for rank i
    inp = data[r].reshape(w * 2, 2) if layout == "flat" else data[r].copy()
    before = inp.copy()
    out = np.empty((2, 2), dtype=dtype)
    op = make_op(name, dtype)
    assert mpicomm.reduce_scatter_tensor(out, inp, op=op) is None
    np.testing.assert_array_equal(out, reference(name, data[:, r], op.factor))
    np.testing.assert_array_equal(inp, before)


@pytest.mark.mpi(min_size=1)
def test_reduce_scatter_single_is_reduce_scatter_tensor(world, rng):
    assert mpicomm.reduce_scatter_single is mpicomm.reduce_scatter_tensor
    w, r = world.size(), world.rank()
    data = values(rng, np.int64, (w, w * 3))
    out = np.empty(3, np.int64)
    mpicomm.reduce_scatter_single(out, data[r])
    np.testing.assert_array_equal(out, data.sum(axis=0)[3 * r : 3 * r + 3])


# --------------------------------------------------------------------------------------------- barrier


@pytest.mark.mpi(min_size=1)
def test_barrier_returns_none_on_every_rank(world):
    assert mpicomm.barrier() is None
    assert mpicomm.barrier(group=world, device_ids=[0]) is None


@pytest.mark.mpi(min_size=1)
def test_all_reduce_writes_fortran_ordered_arrays_after_a_first_call(world):
    # the answer must not depend on earlier calls (the cached fast path takes C-contiguous arrays only)
    mpicomm.all_reduce(np.ones(4), op=ReduceOp.MAX)  # the (MAX, float64) pair is now cached
    fortran = np.arange(6.0).reshape(3, 2).T * (world.rank() + 1)
    mpicomm.all_reduce(fortran, op=ReduceOp.MAX)
    assert fortran.tolist() == (np.arange(6.0).reshape(3, 2).T * world.size()).tolist()
