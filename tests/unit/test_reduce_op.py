"""ReduceOp: identity, PREMUL_SUM factors, which dtypes each operator accepts, and what it computes."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from reference import OP_KINDS, UFUNCS

import mpicomm
from mpicomm import ArgumentTypeError, MpicommError, ReduceOp, ReductionTypeError
from mpicomm.core import reduce_op as ro
from mpicomm.core.buffers import datatype

NAMES = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM"]

# every numpy bool/int/uint/float/complex type, by C name and by size
BOOLS = [np.bool_]
INTS = [np.byte, np.short, np.intc, np.int_, np.longlong, np.int8, np.int16, np.int32, np.int64]
UINTS = [np.ubyte, np.ushort, np.uintc, np.uint, np.ulonglong, np.uint8, np.uint16, np.uint32, np.uint64]
FLOATS = [np.single, np.double, np.longdouble, np.float32, np.float64]
COMPLEX = [np.csingle, np.cdouble, np.clongdouble, np.complex64, np.complex128]
ALL = BOOLS + INTS + UINTS + FLOATS + COMPLEX

KINDS = OP_KINDS


@pytest.fixture(scope="module", autouse=True)
def mpi() -> None:
    mpicomm.init()  # mpi_op needs MPI; at world size 1 without a launcher


def op_of(name: str, dtype: np.dtype[Any]) -> ReduceOp:
    if name != "PREMUL_SUM":
        return getattr(ReduceOp, name)
    return ReduceOp.PREMUL_SUM(2 if dtype.kind in "iu" else 2.0)


def _id(t: Any) -> str:
    return np.dtype(t).name if np.dtype(t).char not in "lLqQ" else f"{np.dtype(t).name}-{np.dtype(t).char}"


# --------------------------------------------------------------------------------------------------
# identity


def test_members() -> None:
    for name in NAMES:
        op = getattr(ReduceOp, name)
        assert isinstance(op, ReduceOp) and op.name == name and op.factor is None
        assert repr(op) == f"ReduceOp.{name}"
    assert len({getattr(ReduceOp, n) for n in NAMES}) == len(NAMES)


def test_equality_and_hash() -> None:
    assert ReduceOp.SUM == ReduceOp.SUM
    assert ReduceOp.SUM != ReduceOp.MAX
    assert ReduceOp.SUM != "SUM" and ReduceOp.SUM != None and ReduceOp.SUM != 0  # noqa: E711
    assert ReduceOp.PREMUL_SUM(0.5) == ReduceOp.PREMUL_SUM(0.5)
    assert hash(ReduceOp.PREMUL_SUM(0.5)) == hash(ReduceOp.PREMUL_SUM(0.5))
    assert ReduceOp.PREMUL_SUM(0.5) != ReduceOp.PREMUL_SUM(0.25)
    assert ReduceOp.PREMUL_SUM(0.5) != ReduceOp.PREMUL_SUM
    assert ReduceOp.PREMUL_SUM(2) == ReduceOp.PREMUL_SUM(2.0)  # equal numbers, equal ops
    table = {ReduceOp.SUM: "s", ReduceOp.PREMUL_SUM(0.5): "p"}
    assert table[ReduceOp.PREMUL_SUM(0.5)] == "p" and table[ReduceOp.SUM] == "s"
    assert (
        len({ReduceOp.SUM, ReduceOp.SUM, ReduceOp.MAX, ReduceOp.PREMUL_SUM(1.0), ReduceOp.PREMUL_SUM(1.0)})
        == 3
    )


def test_repr_with_factor() -> None:
    assert repr(ReduceOp.PREMUL_SUM(0.5)) == "ReduceOp.PREMUL_SUM(0.5)"
    assert repr(ReduceOp.PREMUL_SUM(3)) == "ReduceOp.PREMUL_SUM(3)"
    assert repr(ReduceOp.PREMUL_SUM(1j)) == "ReduceOp.PREMUL_SUM(1j)"
    assert repr(ReduceOp.PREMUL_SUM(np.array([0.25]))) == "ReduceOp.PREMUL_SUM(0.25)"


# --------------------------------------------------------------------------------------------------
# PREMUL_SUM factors


@pytest.mark.parametrize(
    ("factor", "value"),
    [
        (0.5, 0.5),
        (3, 3),
        (1 + 2j, 1 + 2j),
        (np.float32(0.25), 0.25),
        (np.int64(4), 4),
        (np.array([0.5]), 0.5),  # a 1-element array, as torch passes a 1-element tensor
        (np.array(0.5), 0.5),  # 0-d
        (np.array([[2]]), 2),  # any shape with one element
        (np.array([1.5], np.float32), 1.5),
    ],
    ids=[
        "float",
        "int",
        "complex",
        "np.float32",
        "np.int64",
        "1-elem-array",
        "0d-array",
        "1x1-array",
        "1-elem-float32",
    ],
)
def test_premul_sum_factor(factor: Any, value: Any) -> None:
    op = ReduceOp.PREMUL_SUM(factor)
    assert op.name == "PREMUL_SUM"
    assert op.factor == value
    assert not isinstance(op.factor, np.ndarray), "an array factor is unwrapped to its number"
    assert op == ReduceOp.PREMUL_SUM(value)
    assert ReduceOp.PREMUL_SUM.factor is None, "the member itself is unchanged"


@pytest.mark.parametrize(
    "factor",
    [np.array([0.5, 0.5]), np.array([]), "0.5", None, True, np.bool_(True), [0.5], object()],
    ids=["2-elem-array", "empty-array", "str", "None", "bool", "np.bool_", "list", "object"],
)
def test_premul_sum_bad_factor(factor: Any) -> None:
    with pytest.raises(ArgumentTypeError) as info:
        ReduceOp.PREMUL_SUM(factor)
    assert isinstance(info.value, TypeError) and isinstance(info.value, MpicommError)
    msg = str(info.value)
    assert msg.startswith("ReduceOp.PREMUL_SUM: factor is"), msg
    assert "expected a number or a 1-element array" in msg


@pytest.mark.parametrize("name", [n for n in NAMES if n != "PREMUL_SUM"])
def test_factor_on_other_ops_refused(name: str) -> None:
    with pytest.raises(ArgumentTypeError) as info:
        getattr(ReduceOp, name)(0.5)
    assert isinstance(info.value, TypeError)
    assert str(info.value).startswith(f"ReduceOp.{name}: ") and "factor" in str(info.value)
    assert "PREMUL_SUM" in str(info.value)


# --------------------------------------------------------------------------------------------------
# which dtypes each operator accepts


@pytest.mark.parametrize("t", ALL, ids=[_id(t) for t in ALL])
@pytest.mark.parametrize("name", NAMES)
def test_accepted_dtype_kinds(name: str, t: Any) -> None:
    dtype = np.dtype(t)
    op = op_of(name, dtype)
    if dtype.kind in KINDS[name]:
        dt, mop = op.mpi_op(dtype, "all_reduce")
        assert dt.Get_size() == dtype.itemsize
        assert mop is not None
    else:
        with pytest.raises(ReductionTypeError) as info:
            op.mpi_op(dtype, "all_reduce")
        msg = str(info.value)
        assert isinstance(info.value, TypeError)
        assert msg.startswith("all_reduce: op ") and name in msg and str(dtype) in msg and "expected" in msg


@pytest.mark.parametrize(
    "dtype",
    [
        np.dtype(">f8"),
        np.dtype("<i4").newbyteorder(),
        np.dtype([("a", "i4")]),
        np.dtype("U3"),
        np.dtype("M8[s]"),
        np.dtype(object),
    ],
    ids=["big-endian-f8", "swapped-i4", "structured", "str", "datetime", "object"],
)
def test_unreducible_dtypes_refused_by_every_op(dtype: np.dtype[Any]) -> None:
    for name in NAMES:
        op = ReduceOp.PREMUL_SUM(2.0) if name == "PREMUL_SUM" else getattr(ReduceOp, name)
        with pytest.raises(ReductionTypeError) as info:
            op.mpi_op(dtype, "reduce")
        msg = str(info.value)
        assert msg.startswith(f"reduce: op {op!r} ") and str(dtype) in msg, msg
        assert "expected" in msg, f"the message does not say which dtypes would do: {msg!r}"


@pytest.mark.parametrize("t", [np.float64, np.int32], ids=["float64", "int32"])
def test_premul_sum_without_factor(t: Any) -> None:
    with pytest.raises(ReductionTypeError) as info:
        ReduceOp.PREMUL_SUM.mpi_op(np.dtype(t), "reduce_scatter")
    msg = str(info.value)
    assert msg.startswith("reduce_scatter: op is ReduceOp.PREMUL_SUM without a factor")
    assert "expected ReduceOp.PREMUL_SUM(factor)" in msg


@pytest.mark.parametrize("t", INTS + UINTS, ids=[_id(t) for t in INTS + UINTS])
def test_premul_sum_factor_must_be_integral_on_integers(t: Any) -> None:
    dtype = np.dtype(t)
    ReduceOp.PREMUL_SUM(3).mpi_op(dtype, "all_reduce")
    ReduceOp.PREMUL_SUM(np.int8(3)).mpi_op(dtype, "all_reduce")
    for bad in (0.5, 2.0, 1j):
        with pytest.raises(ReductionTypeError, match="integer factor"):
            ReduceOp.PREMUL_SUM(bad).mpi_op(dtype, "all_reduce")


@pytest.mark.parametrize("t", FLOATS, ids=[_id(t) for t in FLOATS])
def test_premul_sum_complex_factor_on_real_floats(t: Any) -> None:
    with pytest.raises(ReductionTypeError, match="real factor"):
        ReduceOp.PREMUL_SUM(1j).mpi_op(np.dtype(t), "all_reduce")
    # a numpy complex scalar too: np.complex64 is no subclass of Python's complex
    with pytest.raises(ReductionTypeError, match="real factor"):
        ReduceOp.PREMUL_SUM(np.complex64(1j)).mpi_op(np.dtype(t), "all_reduce")
    with pytest.raises(ReductionTypeError, match="real factor"):
        ReduceOp.PREMUL_SUM(np.array([1j], np.complex64)).mpi_op(np.dtype(t), "all_reduce")
    ReduceOp.PREMUL_SUM(0.5).mpi_op(np.dtype(t), "all_reduce")


def test_refusal_is_not_cached() -> None:
    """A refused dtype stays refused; an accepted one is cached and reused."""
    for _ in range(2):
        with pytest.raises(ReductionTypeError):
            ReduceOp.BAND.mpi_op(np.dtype(np.float64), "all_reduce")
    first = ReduceOp.BAND.mpi_op(np.dtype(np.int32), "all_reduce")
    assert ReduceOp.BAND.mpi_op(np.dtype(np.int32), "reduce") == first


# --------------------------------------------------------------------------------------------------
# what the MPI operator computes: apply it locally with MPI_Reduce_local and compare with numpy


def _reference(name: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "b":
        logical = {
            "SUM": np.logical_or,
            "MAX": np.logical_or,
            "BOR": np.logical_or,
            "PRODUCT": np.logical_and,
            "MIN": np.logical_and,
            "BAND": np.logical_and,
            "BXOR": np.logical_xor,
        }
        return logical[name](a, b)
    plain = {
        **UFUNCS,
        "AVG": np.add,
        "PREMUL_SUM": np.add,
    }
    return plain[name](a, b).astype(a.dtype)


def _values(dtype: np.dtype[Any], rng: np.random.Generator, n: int = 64) -> np.ndarray:
    if dtype.kind == "b":
        return rng.integers(0, 2, n).astype(dtype)
    if dtype.kind == "u":
        return rng.integers(0, 11, n).astype(dtype)
    if dtype.kind == "i":
        return rng.integers(-10, 11, n).astype(dtype)
    if dtype.kind == "f":
        return rng.integers(-100, 101, n).astype(dtype) / 4
    return (rng.integers(-10, 11, n) + 1j * rng.integers(-10, 11, n)).astype(dtype)


PAIRS = [(n, t) for n, t in itertools.product(NAMES, ALL) if np.dtype(t).kind in KINDS[n]]


@pytest.mark.parametrize(("name", "t"), PAIRS, ids=[f"{n}-{_id(t)}" for n, t in PAIRS])
def test_mpi_operator_computes_the_reduction(name: str, t: Any) -> None:
    dtype = np.dtype(t)
    rng = np.random.default_rng(7)
    a, b = _values(dtype, rng), _values(dtype, rng)
    dt, mop = op_of(name, dtype).mpi_op(dtype, "all_reduce")
    inout = b.copy()
    mop.Reduce_local([a, dt], [inout, dt])  # inout = a (op) inout
    np.testing.assert_array_equal(inout, _reference(name, a, b))


@pytest.mark.parametrize(
    "t",
    [np.int64, np.uint64, np.longdouble, np.clongdouble],
    ids=["int64", "uint64", "longdouble", "clongdouble"],
)
def test_wide_values_survive_the_mapping(t: Any) -> None:
    """Values that need every byte of the type: a narrower MPI type would get them wrong."""
    dtype = np.dtype(t)
    if dtype.kind in "iu":
        a = np.array([2**62 + 1, 2**40 + 3, 7], dtype)
        b = np.array([5, 2**33, 2**61], dtype)
    else:
        eps = np.finfo(dtype).eps
        a = np.array([1 + eps, 2**70, 3], dtype)
        b = np.array([eps, 1, -3], dtype)
    dt, mop = ReduceOp.SUM.mpi_op(dtype, "all_reduce")
    inout = b.copy()
    mop.Reduce_local([a, dt], [inout, dt])
    np.testing.assert_array_equal(inout, a + b)


# --------------------------------------------------------------------------------------------------
# the local parts: pre-multiplication and the integer average


def test_premultiply() -> None:
    x = np.array([1.0, -2.0, 3.0])
    assert ro.premultiply(ReduceOp.SUM, x) is x, "no factor: the input itself, no copy"
    y = ro.premultiply(ReduceOp.PREMUL_SUM(0.5), x)
    assert y is not x and y.tolist() == [0.5, -1.0, 1.5] and x.tolist() == [1.0, -2.0, 3.0]
    out = np.empty(3)
    assert ro.premultiply(ReduceOp.PREMUL_SUM(2.0), x, out=out) is out and out.tolist() == [2.0, -4.0, 6.0]
    i = np.array([1, -2, 3], np.int32)
    r = ro.premultiply(ReduceOp.PREMUL_SUM(3), i)
    assert r.dtype == np.int32 and r.tolist() == [3, -6, 9]
    c = ro.premultiply(ReduceOp.PREMUL_SUM(1j), np.array([1 + 1j], np.complex64))
    assert c.dtype == np.complex64 and c.tolist() == [-1 + 1j]


def _truncated(x: np.ndarray, size: int) -> list[int]:
    """Division truncated toward zero, in Python integers (no float rounding)."""
    return [(-(-v // size) if v < 0 else v // size) for v in (int(e) for e in x.reshape(-1))]


@pytest.mark.parametrize("t", INTS + UINTS, ids=[_id(t) for t in INTS + UINTS])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 8, 16])
def test_average_truncates_toward_zero(t: Any, size: int) -> None:
    dtype = np.dtype(t)
    info = np.iinfo(dtype)
    rng = np.random.default_rng(size)
    x = rng.integers(info.min, info.max, 200, dtype=dtype, endpoint=True)
    special = [info.min, info.max, 0, 1, size, size - 1, size + 1]
    if info.min < 0:
        special += [-1, -size, -size + 1, -size - 1, info.min + 1, -7]
    x = np.concatenate([x, np.array([v for v in special if info.min <= v <= info.max], dtype)])
    expected = _truncated(x, size)
    y = x.copy()
    ro.average(y, size)
    assert y.dtype == dtype
    assert y.tolist() == expected


def test_average_examples() -> None:
    x = np.array([-7, 7, -6, 6, -1, 1, 0], np.int64)
    ro.average(x, 2)
    assert x.tolist() == [-3, 3, -3, 3, 0, 0, 0]
    m = np.array([[-9, 9], [-10, 10]], np.int32)
    ro.average(m, 4)
    assert m.tolist() == [[-2, 2], [-2, 2]]


@pytest.mark.parametrize("t", FLOATS + COMPLEX, ids=[_id(t) for t in FLOATS + COMPLEX])
def test_average_divides_floats(t: Any) -> None:
    x = np.array([-7, 7, 1], dtype=t)
    ro.average(x, 2)
    np.testing.assert_array_equal(x, np.array([-3.5, 3.5, 0.5], dtype=t))


def test_needs_local_work() -> None:
    assert ReduceOp.AVG.needs_local_work and ReduceOp.PREMUL_SUM(2.0).needs_local_work
    assert not any(getattr(ReduceOp, n).needs_local_work for n in NAMES if n not in ("AVG", "PREMUL_SUM"))


def test_op_uses_the_shared_datatype() -> None:
    """mpi_op's datatype is the one buffers.datatype gives for the dtype (one mapping, not two)."""
    for t in ALL:
        dt, _ = ReduceOp.SUM.mpi_op(np.dtype(t), "all_reduce")
        assert dt == datatype(np.dtype(t))
