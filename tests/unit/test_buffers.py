"""mpicomm.core.buffers: argument checks, dtype -> MPI datatype, split sizes, aliasing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import ArgumentError, ArgumentTypeError, MpicommError
from mpicomm.core import buffers
from mpicomm.core.buffers import as_int_list, datatype

BOOLS = [np.bool_]
INTS = [np.byte, np.short, np.intc, np.int_, np.longlong, np.int8, np.int16, np.int32, np.int64]
UINTS = [np.ubyte, np.ushort, np.uintc, np.uint, np.ulonglong, np.uint8, np.uint16, np.uint32, np.uint64]
FLOATS = [np.single, np.double, np.longdouble, np.float32, np.float64]
COMPLEX = [np.csingle, np.cdouble, np.clongdouble, np.complex64, np.complex128]
NAMED = BOOLS + INTS + UINTS + FLOATS + COMPLEX


@pytest.fixture(scope="module", autouse=True)
def mpi() -> None:
    mpicomm.init()  # world size 1, no launcher


def _id(t: Any) -> str:
    d = np.dtype(t)
    return d.name if d.char not in "lLqQ" else f"{d.name}-{d.char}"


def self_copy(x: np.ndarray) -> np.ndarray:
    """Send ``x`` to this process on COMM_SELF with ``datatype(x.dtype)`` and return what arrived."""
    dt = datatype(x.dtype)
    out = np.zeros_like(x)
    MPI.COMM_SELF.Sendrecv([x, dt], 0, 5, [out, dt], 0, 5)
    return out


# --------------------------------------------------------------------------------------------------
# dtype -> MPI datatype


@pytest.mark.parametrize("t", NAMED, ids=[_id(t) for t in NAMED])
def test_named_types_map_to_the_matching_predefined_datatype(t: Any) -> None:
    dtype = np.dtype(t)
    dt = datatype(dtype)
    assert dt.is_predefined, f"{dtype} should travel as MPI's own type (reductions need it)"
    assert dt.Get_size() == dtype.itemsize
    assert np.dtype(dt.tocode()) == dtype, f"{dtype} mapped to {dt.Get_name()}"
    assert datatype(np.dtype(t)) is dt, "the datatype is made once per dtype"


@pytest.mark.parametrize("t", NAMED, ids=[_id(t) for t in NAMED])
def test_named_types_round_trip(t: Any) -> None:
    dtype = np.dtype(t)
    if dtype.kind == "b":
        x = np.array([True, False, True])
    elif dtype.kind in "iu":
        info = np.iinfo(dtype)
        x = np.array([info.min, info.max, 0, 1], dtype)
    elif dtype.kind == "f":
        info = np.finfo(dtype)
        x = np.array([info.min, info.max, info.tiny, -0.0, np.inf, 1 + info.eps], dtype)
    else:
        info = np.finfo(dtype)
        x = np.array([complex(float(info.max), -1.0), 1j * info.tiny, 1 + info.eps], dtype)
    np.testing.assert_array_equal(self_copy(x), x)


def test_float16_moves_bit_exact() -> None:
    bits = np.array(
        [0x0000, 0x8000, 0x0001, 0x03FF, 0x3C00, 0x7BFF, 0x7C00, 0xFC00, 0x7E01, 0xFFFF], np.uint16
    )
    x = bits.view(np.float16)  # zeros, subnormals, one, max, infinities, NaN payloads
    dt = datatype(x.dtype)
    assert dt.Get_size() == 2
    assert (self_copy(x).view(np.uint16) == bits).all()
    # MPI has no float16 reduction: the collectives reduce it in float32, mpi_op itself refuses it
    with pytest.raises(mpicomm.ReductionTypeError):
        mpicomm.ReduceOp.SUM.mpi_op(np.dtype(np.float16), "all_reduce")


@pytest.mark.parametrize(
    "dtype",
    [
        np.dtype([("a", "<i4"), ("b", "<f8"), ("c", "S3")]),
        np.dtype([("a", "u1"), ("b", "<f8")], align=True),  # with padding
        np.dtype(">f8"),
        np.dtype(">i4"),
        np.dtype("U4"),
        np.dtype("M8[ms]"),
        np.dtype("V5"),
    ],
    ids=["structured", "aligned-struct", "big-endian-f8", "big-endian-i4", "unicode", "datetime", "void5"],
)
def test_other_dtypes_move_as_bytes(dtype: np.dtype[Any]) -> None:
    dt = datatype(dtype)
    assert not dt.is_predefined
    assert dt.Get_size() == dtype.itemsize
    assert dt.Get_extent() == (0, dtype.itemsize)
    assert dt.Get_envelope()[-1] == MPI.COMBINER_CONTIGUOUS
    raw = np.random.default_rng(3).integers(0, 256, 7 * dtype.itemsize, dtype=np.uint8)
    x = raw.view(dtype)
    assert x.shape == (7,)
    got = self_copy(x)
    assert got.tobytes() == x.tobytes(), "every byte of every element arrives"
    assert datatype(dtype) is dt


def test_byte_swapped_values_survive() -> None:
    x = np.array([1.5, -2.25, 1e300], dtype=">f8")
    got = self_copy(x)
    assert got.dtype == x.dtype and got.tolist() == [1.5, -2.25, 1e300]


def test_message() -> None:
    x = np.arange(4, dtype=np.int16)
    msg = buffers.message(x)
    assert msg[0] is x and msg[1] == datatype(x.dtype)


# --------------------------------------------------------------------------------------------------
# as_int_list: split sizes


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([1, 2, 3], [1, 2, 3]),
        ((0, 5), [0, 5]),
        (np.array([4, 0, 1], np.int32), [4, 0, 1]),
        (np.array([7], np.uint64), [7]),
        ([np.int64(2), np.int8(1)], [2, 1]),
        ([], []),
        (range(3), [0, 1, 2]),
        ([2**40], [2**40]),
    ],
    ids=["list", "tuple", "int32-array", "uint64-array", "numpy-scalars", "empty", "range", "big"],
)
def test_as_int_list_accepts(values: Any, expected: list[int]) -> None:
    got = as_int_list(values, "all_to_all_single", "input_split_sizes")
    assert got == expected
    assert all(type(v) is int for v in got), "plain Python ints, ready for MPI"


@pytest.mark.parametrize(
    "values",
    [[1.0, 2.0], [0.5], np.ones(2), ["1"], [None, 1], [[1], [2]], 3, [True, False], [1, "a"], [1j]],
    ids=["floats", "fraction", "float-array", "str", "none", "nested", "scalar", "bools", "mixed", "complex"],
)
def test_as_int_list_refuses_non_integers(values: Any) -> None:
    with pytest.raises(ArgumentTypeError) as info:
        as_int_list(values, "all_to_all_single", "output_split_sizes")
    msg = str(info.value)
    assert isinstance(info.value, TypeError) and isinstance(info.value, MpicommError)
    assert msg.startswith("all_to_all_single: output_split_sizes is ") and "expected" in msg


@pytest.mark.parametrize("values", [[1, -1], [-3], np.array([0, -2, -5])], ids=["one", "only", "array"])
def test_as_int_list_refuses_negatives(values: Any) -> None:
    with pytest.raises(ArgumentError) as info:
        as_int_list(values, "all_to_all_single", "input_split_sizes")
    msg = str(info.value)
    assert isinstance(info.value, ValueError)
    assert msg.startswith("all_to_all_single: input_split_sizes has a negative entry")
    assert str(min(np.asarray(values).tolist())) in msg and "expected >= 0" in msg


# --------------------------------------------------------------------------------------------------
# the argument checks every call shares


def test_check_array() -> None:
    x = np.zeros(3)
    assert buffers.check_array(x, "f", "x") is x
    view = np.zeros(6)[::2]
    assert buffers.check_array(view, "f", "x") is view  # inputs may have any layout
    with pytest.raises(ArgumentTypeError, match=r"^f: x is a builtins\.list; expected a numpy\.ndarray$"):
        buffers.check_array([1.0], "f", "x")
    with pytest.raises(ArgumentTypeError, match=r"^f: x has dtype object; expected a dtype without"):
        buffers.check_array(np.array([None]), "f", "x")
    with pytest.raises(ArgumentTypeError, match=r"^f: x is a builtins\.int"):
        buffers.check_array(3, "f", "x")


def test_check_output() -> None:
    x = np.zeros(3)
    assert buffers.check_output(x, "g", "out") is x
    r = np.zeros(3)
    r.flags.writeable = False
    with pytest.raises(ArgumentError, match=r"^g: out is read-only; expected a writeable array$"):
        buffers.check_output(r, "g", "out")
    # strided outputs are written through (derived datatypes), so they are accepted
    buffers.check_output(np.zeros((3, 2), order="F"), "g", "out")
    buffers.check_output(np.zeros(6)[::3], "g", "out")
    buffers.check_output(np.zeros((3, 1), order="F"), "g", "out")
    buffers.check_output(np.zeros(0)[::2], "g", "out")


def test_check_array_list() -> None:
    xs = [np.zeros(2), np.zeros(3)]
    assert buffers.check_array_list(xs, "h", "xs", 2, output=True) == xs
    assert buffers.check_array_list(tuple(xs), "h", "xs", None, output=False) == xs
    with pytest.raises(ArgumentTypeError, match=r"^h: xs is a ndarray; expected a list of numpy arrays$"):
        buffers.check_array_list(np.zeros(2), "h", "xs", 2, output=False)
    with pytest.raises(ArgumentError, match=r"^h: xs has 2 entries; expected 3 \(the group size\)$"):
        buffers.check_array_list(xs, "h", "xs", 3, output=False)
    with pytest.raises(ArgumentTypeError, match=r"^h: xs\[1\] has dtype float32; expected float64"):
        buffers.check_array_list([np.zeros(1), np.zeros(1, np.float32)], "h", "xs", 2, output=False)
    r = np.zeros(1)
    r.flags.writeable = False
    with pytest.raises(ArgumentError, match=r"^h: xs\[1\] is read-only"):
        buffers.check_array_list([np.zeros(1), r], "h", "xs", 2, output=True)
    assert buffers.check_array_list([np.zeros(1), r], "h", "xs", 2, output=False)[1] is r


def test_check_same_dtype() -> None:
    buffers.check_same_dtype(np.zeros(1), np.zeros(2), "k", "a", "b")
    with pytest.raises(ArgumentTypeError, match=r"^k: b has dtype int32; expected float64, the dtype of a$"):
        buffers.check_same_dtype(np.zeros(1), np.zeros(1, np.int32), "k", "a", "b")


def test_send_view_and_row_size() -> None:
    x = np.arange(6.0)
    assert buffers.send_view(x) is x
    v = buffers.send_view(x[::2])
    assert v.flags.c_contiguous and v.tolist() == [0.0, 2.0, 4.0]
    f = np.asfortranarray(np.arange(6.0).reshape(2, 3))
    assert buffers.send_view(f).tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    assert buffers.row_size(np.zeros(5)) == 1
    assert buffers.row_size(np.zeros((4, 3, 2))) == 6
    assert buffers.row_size(np.zeros((4, 0))) == 0


def test_check_disjoint() -> None:
    base = np.zeros(10)
    buffers.check_disjoint(base[:5], base[5:], "all_to_all_single", "output", "input")
    buffers.check_disjoint(np.zeros(3), np.zeros(3), "f", "output", "input")
    for out, inp in (
        (base, base),
        (base[:6], base[5:]),
        (base[::2], base[4:5]),
        (base.reshape(2, 5), base[3:4]),
    ):
        with pytest.raises(ArgumentError) as info:
            buffers.check_disjoint(out, inp, "all_to_all_single", "output", "input")
        msg = str(info.value)
        assert isinstance(info.value, ValueError)
        assert (
            msg.startswith("all_to_all_single: input overlaps output") and "expected separate arrays" in msg
        )
