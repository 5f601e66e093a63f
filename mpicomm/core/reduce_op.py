"""``ReduceOp``: torch.distributed's reduction operators, every one of them on every MPI.

SUM, PRODUCT, MIN, MAX and the bitwise ops map to MPI's predefined operators. AVG is an MPI sum divided
by the group size afterwards; PREMUL_SUM multiplies each rank's input by a factor before the sum. Both
work on any MPI, where torch has them only on NCCL. float16 and bfloat16 (``ml_dtypes.bfloat16``) are
reduced in float32 by the collectives (:mod:`mpicomm.dense.half`); this module only checks them.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .. import _mpi
from ..errors import ArgumentTypeError, ReductionTypeError
from .buffers import datatype

__all__ = ["ReduceOp", "is_half", "supports_complex"]

# numpy type characters MPI has a reduction for; float16 and bfloat16 are reduced in float32 instead.
_REDUCIBLE = frozenset("?bBhHiIlLqQfdgFDG")
_FLOAT16 = np.dtype(np.float16)

# dtype.kind each operator accepts: b bool, i/u integers, f floats, c complex.
_KINDS = {
    "SUM": "biufc",
    "PRODUCT": "biufc",
    "MIN": "biuf",
    "MAX": "biuf",
    "BAND": "biu",
    "BOR": "biu",
    "BXOR": "biu",
    "AVG": "iufc",
    "PREMUL_SUM": "iufc",
}

# The MPI operator behind each name; bools use the logical operators (SUM on bools is OR, as NCCL does).
_MPI_NAMES = {
    "SUM": ("SUM", "LOR"),
    "PRODUCT": ("PROD", "LAND"),
    "MIN": ("MIN", "LAND"),
    "MAX": ("MAX", "LOR"),
    "BAND": ("BAND", "LAND"),
    "BOR": ("BOR", "LOR"),
    "BXOR": ("BXOR", "LXOR"),
    "AVG": ("SUM", "LOR"),
    "PREMUL_SUM": ("SUM", "LOR"),
}


class ReduceOp:
    """A reduction operator: ``ReduceOp.SUM``, ``ReduceOp.AVG``, ``ReduceOp.PREMUL_SUM(0.5)``, ...

    Members: SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR, AVG and PREMUL_SUM.

    * On bool arrays SUM and MAX are logical OR, PRODUCT and MIN logical AND, BXOR logical XOR.
    * AVG divides the sum by the group size. On integers the quotient is truncated toward zero
      (``-7 / 2 -> -3``), the rule torch's Gloo backend uses; the sum itself wraps on overflow as
      MPI's does. AVG on bools is refused, as on NCCL.
    * ``PREMUL_SUM(factor)`` gives ``sum over ranks of factor * x``. On integer arrays the factor must
      be an integer. Without a factor it is refused.
    * MIN and MAX are not defined on complex numbers; the bitwise ops only on bools and integers.
    * float16 and bfloat16 (``ml_dtypes.bfloat16``) take every operator floats take: they are
      widened to float32, reduced there and rounded back once to nearest even, so the result is the
      exactly rounded float32 result (see docs/torch.rst for the precision).
    * Structured, byte-swapped and other dtypes MPI cannot reduce are refused by every operator.

    Example:
        >>> from mpicomm import ReduceOp
        >>> ReduceOp.PREMUL_SUM(0.5)
        ReduceOp.PREMUL_SUM(0.5)
    """

    __slots__ = ("_ops", "_plain", "factor", "name")

    SUM: ClassVar[ReduceOp]
    PRODUCT: ClassVar[ReduceOp]
    MIN: ClassVar[ReduceOp]
    MAX: ClassVar[ReduceOp]
    BAND: ClassVar[ReduceOp]
    BOR: ClassVar[ReduceOp]
    BXOR: ClassVar[ReduceOp]
    AVG: ClassVar[ReduceOp]
    PREMUL_SUM: ClassVar[ReduceOp]

    def __init__(self, name: str, factor: float | complex | None = None) -> None:
        self.name = name
        self.factor = factor
        # a bare MPI reduction, with no local pre- or post-step (not AVG or PREMUL_SUM)
        self._plain = name not in ("AVG", "PREMUL_SUM")
        # dtype -> (MPI datatype, MPI operator); read directly by all_reduce's fast path
        self._ops: dict[np.dtype[Any], tuple[Any, Any]] = {}

    def __call__(self, factor: float | complex) -> ReduceOp:
        """``ReduceOp.PREMUL_SUM(factor)``: the pre-multiplied sum with the given factor.

        Raises:
            ArgumentTypeError: called on another operator, or ``factor`` is not a number.
        """
        if self.name != "PREMUL_SUM":
            raise ArgumentTypeError(f"ReduceOp.{self.name}: takes no factor; only PREMUL_SUM does")
        if isinstance(factor, np.ndarray) and factor.size == 1:
            factor = factor.reshape(()).item()
        if isinstance(factor, bool) or not isinstance(factor, (int, float, complex, np.number)):
            raise ArgumentTypeError(
                f"ReduceOp.PREMUL_SUM: factor is {factor!r}; expected a number or a 1-element array"
            )
        return ReduceOp("PREMUL_SUM", factor)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReduceOp) and other.name == self.name and other.factor == self.factor

    def __hash__(self) -> int:
        return hash((self.name, self.factor))

    def __repr__(self) -> str:
        return f"ReduceOp.{self.name}" + ("" if self.factor is None else f"({self.factor!r})")

    def mpi_op(self, dtype: np.dtype[Any], fn: str) -> tuple[Any, Any]:
        """The MPI datatype and operator that carry out this reduction on ``dtype``.

        Raises:
            ReductionTypeError: the operator is not defined on ``dtype``, or PREMUL_SUM lacks a factor.
        """
        pair = self._ops.get(dtype)
        if pair is None:
            self.check(dtype, fn)
            if is_half(dtype):  # the collectives widen halves first; a path that does not must refuse
                raise ReductionTypeError(f"{fn}: op {self!r} on dtype {dtype}; expected a float32 array here")
            full, logical = _MPI_NAMES[self.name]
            mop = getattr(_mpi.MPI, logical if dtype.kind == "b" else full)
            pair = self._ops[dtype] = (datatype(dtype), mop)
        return pair

    def check(self, dtype: np.dtype[Any], fn: str) -> None:
        """Check that this operator is defined on ``dtype`` (float16 and bfloat16 count as floats).

        Raises:
            ReductionTypeError: it is not, or PREMUL_SUM lacks a factor.
        """
        if self.name == "PREMUL_SUM" and self.factor is None:
            raise ReductionTypeError(
                f"{fn}: op is ReduceOp.PREMUL_SUM without a factor; expected ReduceOp.PREMUL_SUM(factor)"
            )
        half = is_half(dtype)
        if not half and (not dtype.isnative or dtype.char not in _REDUCIBLE):
            raise ReductionTypeError(
                f"{fn}: op {self!r} on dtype {dtype}, which MPI cannot reduce; expected a native-endian "
                "bool, integer, float16/bfloat16/32/64/128 or complex dtype (structured dtypes can "
                "still be moved by broadcast, all_gather, all_to_all, send/recv)"
            )
        if dtype.kind == "c" and "c" not in _KINDS[self.name]:
            torch_fn = "all_reduce" if fn.startswith("all_reduce") else fn
            raise ReductionTypeError(
                f"{fn}: op {self!r} on complex dtype {dtype}; expected SUM, PRODUCT, AVG or PREMUL_SUM on "
                f"complex arrays (torch says: {torch_fn} does not support {self.name} on complex tensors)"
            )
        if ("f" if half else dtype.kind) not in _KINDS[self.name]:
            kinds = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}
            allowed = ", ".join(kinds[k] for k in _KINDS[self.name])
            raise ReductionTypeError(
                f"{fn}: op {self!r} on dtype {dtype}; expected one of the dtype kinds: {allowed}"
            )
        if self.factor is not None and dtype.kind in "iu" and not _is_integral(self.factor):
            raise ReductionTypeError(
                f"{fn}: op {self!r} on integer dtype {dtype}; expected an integer factor"
            )
        if isinstance(self.factor, (complex, np.complexfloating)) and dtype.kind != "c":
            raise ReductionTypeError(f"{fn}: op {self!r} on real dtype {dtype}; expected a real factor")

    @property
    def needs_local_work(self) -> bool:
        """Whether the op pre-multiplies (PREMUL_SUM) or post-divides (AVG) around the MPI sum."""
        return self.name in ("AVG", "PREMUL_SUM")


def is_half(dtype: object) -> bool:
    """Whether ``dtype`` is float16 or bfloat16 (``ml_dtypes.bfloat16``, recognised by name).

    Example:
        >>> import numpy as np
        >>> is_half(np.dtype(np.float16)), is_half(np.dtype(np.float32))
        (True, False)
    """
    return isinstance(dtype, np.dtype) and (dtype == _FLOAT16 or dtype.name == "bfloat16")


def _is_integral(x: float | complex) -> bool:
    return isinstance(x, (int, np.integer))


for _name in _KINDS:
    setattr(ReduceOp, _name, ReduceOp(_name))


def premultiply(op: ReduceOp, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``factor * x`` for PREMUL_SUM (into ``out`` when given); ``x`` itself for other operators."""
    if op.factor is None:
        return x
    if out is None:
        out = np.empty_like(x)
    np.multiply(x, np.asarray(op.factor).astype(x.dtype), out=out)
    return out


def average(x: np.ndarray, size: int) -> None:
    """Divide a sum by the group size in place; integers truncate toward zero."""
    if x.dtype.kind in "fc":
        np.divide(x, size, out=x)
        return
    q = np.floor_divide(x, size)
    # floor rounds negative non-exact quotients down; truncation wants them one higher
    q += (q < 0) & (q * size != x)
    x[...] = q


def supports_complex(reduceOp: ReduceOp) -> bool:  # noqa: N803 - torch's argument name
    """Whether ``reduceOp`` reduces complex arrays (torch's ``supports_complex``).

    SUM, AVG, PREMUL_SUM and PRODUCT do (torch's backends refuse PRODUCT; MPI has it); MIN, MAX and
    the bitwise operators do not, and raise :class:`~mpicomm.ReductionTypeError` on complex arrays.

    Raises:
        ArgumentTypeError: ``reduceOp`` is not a :class:`ReduceOp`.

    Example:
        >>> from mpicomm import ReduceOp, supports_complex
        >>> supports_complex(ReduceOp.SUM), supports_complex(ReduceOp.MAX)
        (True, False)
    """
    if not isinstance(reduceOp, ReduceOp):
        raise ArgumentTypeError(
            f"supports_complex: reduceOp is {reduceOp!r}; expected a mpicomm.ReduceOp such as ReduceOp.SUM"
        )
    return "c" in _KINDS[reduceOp.name]
