"""Bad arguments: every rank raises locally, before any MPI call, with a message that says what went wrong.

Each case passes the same mistake on every rank (or, for root-only arguments, a mistake on every
rank), checks the mpicomm class *and* the built-in it subclasses, and checks the message: it starts
with the function's name, names the argument and what came, and says what was expected. After each
test an autouse fixture checks that the ranks are still in step (same test on every rank, and a
working all_reduce and barrier).
"""

from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import mpicomm
from mpicomm import (
    ArgumentError,
    ArgumentTypeError,
    GroupError,
    MpicommError,
    ReduceOp,
    ReductionTypeError,
)

# each rank raises its own mistake locally; validation mode would raise the lowest failing rank's on
# every rank instead (tests/mpi/test_one_rank_mistakes.py checks that)
pytestmark = [pytest.mark.mpi(min_size=2), pytest.mark.usefixtures("validation_off")]


# --------------------------------------------------------------------------------------------------
# helpers


@contextlib.contextmanager
def fails(cls: type[MpicommError], builtin: type[Exception], fn: str, *words: str) -> Iterator[Any]:
    """Expect ``cls`` (also a ``builtin``), with a message ``"<fn>: ...expected..."`` holding ``words``.

    Argument errors follow the shape documented in mpicomm.errors,
    ``"<function>: <argument> <what came>; expected <what was expected>"``; a GroupError (a group in
    the wrong state) need not say "expected".
    """
    with pytest.raises(cls) as info:
        yield info
    exc = info.value
    assert isinstance(exc, MpicommError), type(exc).__mro__
    assert isinstance(exc, builtin), type(exc).__mro__
    msg = str(exc)
    assert msg.startswith(f"{fn}: "), f"message does not start with the function name {fn!r}: {msg!r}"
    if not issubclass(cls, GroupError):
        assert "expected" in msg, f"message does not say what was expected: {msg!r}"
    for word in words:
        assert word in msg, f"{word!r} not in message {msg!r}"


def z(n: int = 1, dtype: Any = np.float64) -> np.ndarray:
    return np.zeros(n, dtype)


def ro(n: int = 1, dtype: Any = np.float64) -> np.ndarray:
    a = np.zeros(n, dtype)
    a.flags.writeable = False
    return a


def strided(n: int = 1, dtype: Any = np.float64) -> np.ndarray:
    a = np.zeros(2 * n, dtype)[::2]
    assert not a.flags.c_contiguous
    return a


def fortran(rows: int = 2, cols: int = 3) -> np.ndarray:
    a = np.zeros((rows, cols), order="F")
    assert not a.flags.c_contiguous
    return a


def objects(n: int = 2) -> np.ndarray:
    a = np.empty(n, dtype=object)
    a[:] = [1.0, "x"] * (n // 2) + [None] * (n % 2)
    return a


LIST = [1.0, 2.0]


def _sparse() -> Any:
    import torch

    return torch.sparse_coo_tensor([[0]], [1.0], (2,))


@dataclass(frozen=True)
class Case:
    id: str
    call: Callable[[int, int], Any]  # (world size, rank) -> makes the call
    exc: type[MpicommError]
    builtin: type[Exception]
    fn: str
    words: tuple[str, ...]  # str.format'ed with w, r, w1 (w + 1), nxt (next rank)

    def check(self, w: int, r: int) -> None:
        names = {"w": w, "r": r, "w1": w + 1, "nxt": (r + 1) % w}
        words = [word.format(**names) for word in self.words]
        with fails(self.exc, self.builtin, self.fn, *words):
            self.call(w, r)


def _params(cases: list[Case]) -> list[Any]:
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    return [pytest.param(c, id=c.id) for c in cases]


def zl(w: int, n: int = 1, dtype: Any = np.float64) -> list[np.ndarray]:
    return [np.zeros(n, dtype) for _ in range(w)]


@pytest.fixture(autouse=True)
def _still_in_step(request: pytest.FixtureRequest, world: mpicomm.ProcessGroup) -> Iterator[None]:
    yield
    names = MPI.COMM_WORLD.allgather(request.node.nodeid)
    assert names == [names[0]] * len(names), f"ranks are in different tests: {names}"
    x = np.ones(3)
    mpicomm.all_reduce(x)
    assert x.tolist() == [float(world.size())] * 3
    mpicomm.barrier()


TE, AE, RE = ArgumentTypeError, ArgumentError, ReductionTypeError

# --------------------------------------------------------------------------------------------------
# wrong types: a list instead of an array, a non-list instead of a list, Python objects

WRONG_TYPE = [
    Case(
        "all_reduce",
        lambda w, r: mpicomm.all_reduce(LIST),
        TE,
        TypeError,
        "all_reduce",
        ("tensor", "list", "numpy.ndarray"),
    ),
    Case(
        "reduce",
        lambda w, r: mpicomm.reduce(LIST, dst=0),
        TE,
        TypeError,
        "reduce",
        ("tensor", "list", "numpy.ndarray"),
    ),
    Case(
        "broadcast",
        lambda w, r: mpicomm.broadcast(LIST, src=0),
        TE,
        TypeError,
        "broadcast",
        ("tensor", "list", "numpy.ndarray"),
    ),
    Case(
        "all_gather",
        lambda w, r: mpicomm.all_gather(zl(w, 2), LIST),
        TE,
        TypeError,
        "all_gather",
        ("tensor", "list", "numpy.ndarray"),
    ),
    Case(
        "all_gather-list-is-array",
        lambda w, r: mpicomm.all_gather(z(2 * w), z(2)),
        TE,
        TypeError,
        "all_gather",
        ("tensor_list", "ndarray", "list"),
    ),
    Case(
        "all_gather-entry-is-list",
        lambda w, r: mpicomm.all_gather([list(LIST)] * w, z(2)),
        TE,
        TypeError,
        "all_gather",
        ("tensor_list[0]", "list", "numpy.ndarray"),
    ),
    Case(
        "all_gather_into_tensor-output",
        lambda w, r: mpicomm.all_gather_into_tensor(LIST * w, z(2)),
        TE,
        TypeError,
        "all_gather_into_tensor",
        ("output_tensor", "list", "numpy.ndarray"),
    ),
    Case(
        "all_gather_into_tensor-input",
        lambda w, r: mpicomm.all_gather_into_tensor(z(2 * w), LIST),
        TE,
        TypeError,
        "all_gather_into_tensor",
        ("input_tensor", "list", "numpy.ndarray"),
    ),
    Case(
        "all_gather_single",
        lambda w, r: mpicomm.all_gather_single(z(2 * w), LIST),
        TE,
        TypeError,
        "all_gather_into_tensor",
        ("input_tensor", "list"),
    ),
    Case(
        "gather",
        lambda w, r: mpicomm.gather(LIST, zl(w, 2) if r == 0 else None, dst=0),
        TE,
        TypeError,
        "gather",
        ("tensor", "list", "numpy.ndarray"),
    ),
    Case(
        "scatter",
        lambda w, r: mpicomm.scatter(LIST, zl(w, 2) if r == 0 else None, src=0),
        TE,
        TypeError,
        "scatter",
        ("tensor", "list", "numpy.ndarray"),
    ),
    Case(
        "reduce_scatter-output",
        lambda w, r: mpicomm.reduce_scatter(LIST, zl(w, 2)),
        TE,
        TypeError,
        "reduce_scatter",
        ("output", "list", "numpy.ndarray"),
    ),
    Case(
        "reduce_scatter-input_list",
        lambda w, r: mpicomm.reduce_scatter(z(1), z(w)),
        TE,
        TypeError,
        "reduce_scatter",
        ("input_list", "ndarray", "list"),
    ),
    Case(
        "reduce_scatter-entry",
        lambda w, r: mpicomm.reduce_scatter(z(1), [[0.0]] * w),
        TE,
        TypeError,
        "reduce_scatter",
        ("input_list[0]", "list"),
    ),
    Case(
        "reduce_scatter_tensor-output",
        lambda w, r: mpicomm.reduce_scatter_tensor(LIST, z(2 * w)),
        TE,
        TypeError,
        "reduce_scatter_tensor",
        ("output", "list", "numpy.ndarray"),
    ),
    Case(
        "reduce_scatter_tensor-input",
        lambda w, r: mpicomm.reduce_scatter_tensor(z(1), [0.0] * w),
        TE,
        TypeError,
        "reduce_scatter_tensor",
        ("input", "list", "numpy.ndarray"),
    ),
    Case(
        "reduce_scatter_single",
        lambda w, r: mpicomm.reduce_scatter_single(LIST, z(2 * w)),
        TE,
        TypeError,
        "reduce_scatter_tensor",
        ("output", "list"),
    ),
    Case(
        "all_to_all-output-entry",
        lambda w, r: mpicomm.all_to_all([[0.0]] * w, zl(w)),
        TE,
        TypeError,
        "all_to_all",
        ("output_tensor_list[0]", "list", "numpy.ndarray"),
    ),
    Case(
        "all_to_all-input-not-list",
        lambda w, r: mpicomm.all_to_all(zl(w), z(w)),
        TE,
        TypeError,
        "all_to_all",
        ("input_tensor_list", "ndarray", "list"),
    ),
    Case(
        "all_to_all_single-output",
        lambda w, r: mpicomm.all_to_all_single([0.0] * w, z(w)),
        TE,
        TypeError,
        "all_to_all_single",
        ("output", "list", "numpy.ndarray"),
    ),
    Case(
        "all_to_all_single-input",
        lambda w, r: mpicomm.all_to_all_single(z(w), [0.0] * w),
        TE,
        TypeError,
        "all_to_all_single",
        ("input", "list", "numpy.ndarray"),
    ),
    Case(
        "send",
        lambda w, r: mpicomm.send(LIST, dst=(r + 1) % w),
        TE,
        TypeError,
        "send",
        ("tensor", "list", "numpy.ndarray"),
    ),
    Case(
        "isend",
        lambda w, r: mpicomm.isend(LIST, dst=(r + 1) % w),
        TE,
        TypeError,
        "isend",
        ("tensor", "list", "numpy.ndarray"),
    ),
    Case(
        "recv",
        lambda w, r: mpicomm.recv(LIST, src=(r + 1) % w),
        TE,
        TypeError,
        "recv",
        ("tensor", "list", "numpy.ndarray"),
    ),
    Case(
        "irecv",
        lambda w, r: mpicomm.irecv(LIST, src=(r + 1) % w),
        TE,
        TypeError,
        "irecv",
        ("tensor", "list", "numpy.ndarray"),
    ),
    Case(
        "all_reduce_coalesced",
        lambda w, r: mpicomm.all_reduce_coalesced([LIST]),
        TE,
        TypeError,
        "all_reduce_coalesced",
        ("tensors[0]", "list", "numpy.ndarray"),
    ),
    Case(
        "all_gather_coalesced",
        lambda w, r: mpicomm.all_gather_coalesced([[z(2)] for _ in range(w)], [LIST]),
        TE,
        TypeError,
        "all_gather_coalesced",
        ("input_tensor_list[0]", "list", "numpy.ndarray"),
    ),
    Case(
        "all_reduce_sparse",
        lambda w, r: mpicomm.all_reduce_sparse(LIST),
        TE,
        TypeError,
        "all_reduce_sparse",
        ("tensor", "list", "sparse COO"),
    ),
    Case(
        "all_reduce-tuple",
        lambda w, r: mpicomm.all_reduce((1.0, 2.0)),
        TE,
        TypeError,
        "all_reduce",
        ("tensor", "tuple"),
    ),
    Case(
        "all_reduce-scalar",
        lambda w, r: mpicomm.all_reduce(np.float64(1.0)),
        TE,
        TypeError,
        "all_reduce",
        ("tensor", "float64"),
    ),
]


OBJECTS = [
    Case(
        "all_reduce_sparse",
        lambda w, r: mpicomm.all_reduce_sparse(objects()),
        TE,
        TypeError,
        "all_reduce_sparse",
        ("tensor", "ndarray", "sparse COO"),
    ),
    Case(
        "all_reduce_coalesced",
        lambda w, r: mpicomm.all_reduce_coalesced([objects()]),
        TE,
        TypeError,
        "all_reduce_coalesced",
        ("tensors[0]", "object"),
    ),
    Case(
        "all_gather_coalesced",
        lambda w, r: mpicomm.all_gather_coalesced([[z(2)] for _ in range(w)], [objects()]),
        TE,
        TypeError,
        "all_gather_coalesced",
        ("input_tensor_list[0]", "object"),
    ),
    Case(
        "all_reduce",
        lambda w, r: mpicomm.all_reduce(objects()),
        TE,
        TypeError,
        "all_reduce",
        ("tensor", "object"),
    ),
    Case(
        "reduce", lambda w, r: mpicomm.reduce(objects(), dst=0), TE, TypeError, "reduce", ("tensor", "object")
    ),
    Case(
        "broadcast",
        lambda w, r: mpicomm.broadcast(objects(), src=0),
        TE,
        TypeError,
        "broadcast",
        ("tensor", "object"),
    ),
    Case(
        "all_gather",
        lambda w, r: mpicomm.all_gather(zl(w, 2), objects()),
        TE,
        TypeError,
        "all_gather",
        ("tensor", "object"),
    ),
    Case(
        "all_gather-list",
        lambda w, r: mpicomm.all_gather([objects() for _ in range(w)], z(2)),
        TE,
        TypeError,
        "all_gather",
        ("tensor_list[0]", "object"),
    ),
    Case(
        "all_gather_into_tensor",
        lambda w, r: mpicomm.all_gather_into_tensor(z(2 * w), objects()),
        TE,
        TypeError,
        "all_gather_into_tensor",
        ("input_tensor", "object"),
    ),
    Case(
        "all_gather_into_tensor-output",
        lambda w, r: mpicomm.all_gather_into_tensor(objects(2 * w), z(2)),
        TE,
        TypeError,
        "all_gather_into_tensor",
        ("output_tensor", "object"),
    ),
    Case(
        "gather",
        lambda w, r: mpicomm.gather(objects(), zl(w, 2) if r == 0 else None, dst=0),
        TE,
        TypeError,
        "gather",
        ("tensor", "object"),
    ),
    Case(
        "scatter",
        lambda w, r: mpicomm.scatter(objects(), zl(w, 2) if r == 0 else None, src=0),
        TE,
        TypeError,
        "scatter",
        ("tensor", "object"),
    ),
    Case(
        "reduce_scatter",
        lambda w, r: mpicomm.reduce_scatter(z(2), [objects() for _ in range(w)]),
        TE,
        TypeError,
        "reduce_scatter",
        ("input_list[0]", "object"),
    ),
    Case(
        "reduce_scatter_tensor",
        lambda w, r: mpicomm.reduce_scatter_tensor(z(2), objects(2 * w)),
        TE,
        TypeError,
        "reduce_scatter_tensor",
        ("input", "object"),
    ),
    Case(
        "all_to_all",
        lambda w, r: mpicomm.all_to_all(zl(w, 2), [objects() for _ in range(w)]),
        TE,
        TypeError,
        "all_to_all",
        ("input_tensor_list[0]", "object"),
    ),
    Case(
        "all_to_all_single",
        lambda w, r: mpicomm.all_to_all_single(z(2 * w), objects(2 * w)),
        TE,
        TypeError,
        "all_to_all_single",
        ("input", "object"),
    ),
    Case(
        "send",
        lambda w, r: mpicomm.send(objects(), dst=(r + 1) % w),
        TE,
        TypeError,
        "send",
        ("tensor", "object"),
    ),
    Case(
        "isend",
        lambda w, r: mpicomm.isend(objects(), dst=(r + 1) % w),
        TE,
        TypeError,
        "isend",
        ("tensor", "object"),
    ),
    Case(
        "recv",
        lambda w, r: mpicomm.recv(objects(), src=(r + 1) % w),
        TE,
        TypeError,
        "recv",
        ("tensor", "object"),
    ),
    Case(
        "irecv",
        lambda w, r: mpicomm.irecv(objects(), src=(r + 1) % w),
        TE,
        TypeError,
        "irecv",
        ("tensor", "object"),
    ),
]


# --------------------------------------------------------------------------------------------------
# input and output dtypes that differ

F4, F8 = np.float32, np.float64

DTYPE_MISMATCH = [
    Case(
        "all_gather",
        lambda w, r: mpicomm.all_gather(zl(w, 2, F4), z(2, F8)),
        TE,
        TypeError,
        "all_gather",
        ("tensor_list", "float32", "float64"),
    ),
    Case(
        "all_gather-within-list",
        lambda w, r: mpicomm.all_gather([z(2, F8), *zl(w - 1, 2, F4)], z(2, F8)),
        TE,
        TypeError,
        "all_gather",
        ("tensor_list[1]", "float32", "float64"),
    ),
    Case(
        "all_gather_into_tensor",
        lambda w, r: mpicomm.all_gather_into_tensor(z(2 * w, F4), z(2)),
        TE,
        TypeError,
        "all_gather_into_tensor",
        ("output_tensor", "float32", "float64"),
    ),
    Case(
        "reduce_scatter",
        lambda w, r: mpicomm.reduce_scatter(z(2, F4), zl(w, 2, F8)),
        TE,
        TypeError,
        "reduce_scatter",
        ("input_list", "float32", "float64"),
    ),
    Case(
        "reduce_scatter_tensor",
        lambda w, r: mpicomm.reduce_scatter_tensor(z(2, F4), z(2 * w)),
        TE,
        TypeError,
        "reduce_scatter_tensor",
        ("input", "float32", "float64"),
    ),
    Case(
        "all_to_all",
        lambda w, r: mpicomm.all_to_all(zl(w, 1, F4), zl(w, 1, F8)),
        TE,
        TypeError,
        "all_to_all",
        ("input_tensor_list", "float32", "float64"),
    ),
    Case(
        "all_to_all_single",
        lambda w, r: mpicomm.all_to_all_single(z(w, F4), z(w, F8)),
        TE,
        TypeError,
        "all_to_all_single",
        ("input", "float32", "float64"),
    ),
    Case(
        "all_to_all_single-int",
        lambda w, r: mpicomm.all_to_all_single(z(w, np.int32), z(w, np.int64)),
        TE,
        TypeError,
        "all_to_all_single",
        ("input", "int32", "int64"),
    ),
    Case(
        "all_to_all_single-byteorder",
        lambda w, r: mpicomm.all_to_all_single(z(w, ">f8"), z(w, "<f8")),
        TE,
        TypeError,
        "all_to_all_single",
        ("input",),
    ),
]


# --------------------------------------------------------------------------------------------------
# sizes and list lengths

SIZES = [
    Case(
        "all_gather-own-entry",
        lambda w, r: mpicomm.all_gather([z(3) if i == r else z(2) for i in range(w)], z(2)),
        AE,
        ValueError,
        "all_gather",
        ("tensor_list[{r}]", "3", "2"),
    ),
    Case(
        "all_gather-length",
        lambda w, r: mpicomm.all_gather(zl(w + 1, 2), z(2)),
        AE,
        ValueError,
        "all_gather",
        ("tensor_list", "{w1} entries", "{w}"),
    ),
    Case(
        "all_gather-empty-list",
        lambda w, r: mpicomm.all_gather([], z(2)),
        AE,
        ValueError,
        "all_gather",
        ("tensor_list", "0 entries", "{w}"),
    ),
    Case(
        "all_gather_into_tensor-bigger",
        lambda w, r: mpicomm.all_gather_into_tensor(z(2 * w + 1), z(2)),
        AE,
        ValueError,
        "all_gather_into_tensor",
        ("output_tensor", "2"),
    ),
    Case(
        "all_gather_into_tensor-smaller",
        lambda w, r: mpicomm.all_gather_into_tensor(z(2), z(2)),
        AE,
        ValueError,
        "all_gather_into_tensor",
        ("output_tensor",),
    ),
    Case(
        "reduce_scatter-own-entry",
        lambda w, r: mpicomm.reduce_scatter(z(2), [z(3) if i == r else z(2) for i in range(w)]),
        AE,
        ValueError,
        "reduce_scatter",
        ("input_list[{r}]", "3", "2"),
    ),
    Case(
        "reduce_scatter-length",
        lambda w, r: mpicomm.reduce_scatter(z(2), zl(w - 1, 2)),
        AE,
        ValueError,
        "reduce_scatter",
        ("input_list", "entries", "{w}"),
    ),
    Case(
        "reduce_scatter_tensor",
        lambda w, r: mpicomm.reduce_scatter_tensor(z(2), z(2 * w + 1)),
        AE,
        ValueError,
        "reduce_scatter_tensor",
        ("input", "2"),
    ),
    Case(
        "all_to_all-output-length",
        lambda w, r: mpicomm.all_to_all(zl(w + 1), zl(w)),
        AE,
        ValueError,
        "all_to_all",
        ("output_tensor_list", "{w1} entries", "{w}"),
    ),
    Case(
        "all_to_all-input-length",
        lambda w, r: mpicomm.all_to_all(zl(w), zl(w - 1)),
        AE,
        ValueError,
        "all_to_all",
        ("input_tensor_list", "entries", "{w}"),
    ),
    Case(
        "all_to_all_single-output-rows",
        lambda w, r: mpicomm.all_to_all_single(z(w + 1), z(w)),
        AE,
        ValueError,
        "all_to_all_single",
        ("output", "{w1}", "{w}"),
    ),
    Case(
        "all_to_all_single-input-rows",
        lambda w, r: mpicomm.all_to_all_single(z(w), z(w + 1)),
        AE,
        ValueError,
        "all_to_all_single",
        ("input", "{w1}", "{w}"),
    ),
    Case(
        "all_to_all_single-row-size",
        lambda w, r: mpicomm.all_to_all_single(np.zeros((w, 3)), np.zeros((w, 2))),
        AE,
        ValueError,
        "all_to_all_single",
        ("rows", "3", "2"),
    ),
    # this rank's own entry is visible locally: what it sends itself must fit what it receives
    Case(
        "all_to_all-own-entry",
        lambda w, r: mpicomm.all_to_all([z(2) if j == r else z(1) for j in range(w)], zl(w)),
        AE,
        ValueError,
        "all_to_all",
        ("tensor_list[{r}]", "2", "1"),
    ),
    Case(
        "all_to_all_single-own-split",
        lambda w, r: mpicomm.all_to_all_single(
            z(w + 1), z(w), [2 if j == r else 1 for j in range(w)], [1] * w
        ),
        AE,
        ValueError,
        "all_to_all_single",
        ("split", "{r}"),
    ),
    Case(
        "all_to_all_single-0d",
        lambda w, r: mpicomm.all_to_all_single(z(w), np.zeros(())),
        AE,
        ValueError,
        "all_to_all_single",
        ("input", "0-dimensional"),
    ),
]


# --------------------------------------------------------------------------------------------------
# outputs that overlap inputs (MPI forbids aliased send and receive buffers)


def _misaligned_slot(w: int, r: int) -> Any:
    out = z(2 * w)
    return mpicomm.all_gather_into_tensor(out, out[1:3])  # overlaps, but is no rank's own slot


ALIASED = [
    Case(
        "all_to_all_single",
        lambda w, r: (lambda x: mpicomm.all_to_all_single(x, x))(z(w)),
        AE,
        ValueError,
        "all_to_all_single",
        ("input", "output", "overlaps"),
    ),
    Case(
        "all_to_all_single-views",
        lambda w, r: (lambda x: mpicomm.all_to_all_single(x[:w], x[w // 2 : w // 2 + w]))(z(2 * w)),
        AE,
        ValueError,
        "all_to_all_single",
        ("input", "output", "overlaps"),
    ),
    Case(
        "reduce_scatter_tensor",
        lambda w, r: (lambda x: mpicomm.reduce_scatter_tensor(x[:2], x))(z(2 * w)),
        AE,
        ValueError,
        "reduce_scatter_tensor",
        ("input", "output", "overlaps"),
    ),
    Case(
        "all_gather_into_tensor",
        _misaligned_slot,
        AE,
        ValueError,
        "all_gather_into_tensor",
        ("input_tensor", "output_tensor", "overlaps"),
    ),
    Case(
        "all_to_all-same-list",
        lambda w, r: (lambda xs: mpicomm.all_to_all(xs, xs))(zl(w)),
        AE,
        ValueError,
        "all_to_all",
        ("input_tensor_list", "output_tensor_list", "overlap"),
    ),
    Case(
        "all_gather-input-is-another-entry",
        lambda w, r: (lambda xs: mpicomm.all_gather(xs, xs[(r + 1) % w]))(zl(w, 2)),
        AE,
        ValueError,
        "all_gather",
        ("tensor", "overlap"),
    ),
]


# --------------------------------------------------------------------------------------------------
# all_to_all_single split sizes


def a2a(out_splits: Any = None, in_splits: Any = None, rows: int | None = None) -> Callable[..., Any]:
    def call(w: int, r: int) -> Any:
        n = w if rows is None else rows
        o = out_splits(w) if callable(out_splits) else out_splits
        i = in_splits(w) if callable(in_splits) else in_splits
        return mpicomm.all_to_all_single(z(n), z(n), output_split_sizes=o, input_split_sizes=i)

    return call


SPLITS = [
    Case(
        "output-too-long",
        a2a(lambda w: [1] * w + [0]),
        AE,
        ValueError,
        "all_to_all_single",
        ("output_split_sizes", "{w1} entries", "{w}"),
    ),
    Case(
        "input-too-short",
        a2a(None, lambda w: [1] * (w - 1)),
        AE,
        ValueError,
        "all_to_all_single",
        ("input_split_sizes", "entries", "{w}"),
    ),
    Case(
        "output-wrong-sum",
        a2a(lambda w: [1] * (w - 1) + [2]),
        AE,
        ValueError,
        "all_to_all_single",
        ("output_split_sizes", "sums to {w1}", "{w}"),
    ),
    Case(
        "input-wrong-sum",
        a2a(None, lambda w: [0] * w),
        AE,
        ValueError,
        "all_to_all_single",
        ("input_split_sizes", "sums to 0", "{w}"),
    ),
    Case(
        "output-negative",
        a2a(lambda w: [2, -1] + [1] * (w - 2)),
        AE,
        ValueError,
        "all_to_all_single",
        ("output_split_sizes", "-1"),
    ),
    Case(
        "input-negative",
        a2a(None, lambda w: [-1] * (w - 1) + [2 * w - 1]),
        AE,
        ValueError,
        "all_to_all_single",
        ("input_split_sizes", "-1"),
    ),
    Case(
        "output-floats",
        a2a(lambda w: [1.0] * w),
        TE,
        TypeError,
        "all_to_all_single",
        ("output_split_sizes", "1.0"),
    ),
    Case(
        "input-fraction",
        a2a(None, lambda w: [0.5, 1.5] + [1] * (w - 2)),
        TE,
        TypeError,
        "all_to_all_single",
        ("input_split_sizes", "0.5"),
    ),
    Case(
        "input-strings",
        a2a(None, lambda w: ["1"] * w),
        TE,
        TypeError,
        "all_to_all_single",
        ("input_split_sizes", "'1'"),
    ),
    Case(
        "output-none-entry",
        a2a(lambda w: [None] + [1] * (w - 1), None, rows=None),
        TE,
        TypeError,
        "all_to_all_single",
        ("output_split_sizes", "None"),
    ),
    Case(
        "output-nested", a2a(lambda w: [[1]] * w), TE, TypeError, "all_to_all_single", ("output_split_sizes",)
    ),
    Case(
        "output-numpy-floats",
        a2a(lambda w: np.ones(w)),
        TE,
        TypeError,
        "all_to_all_single",
        ("output_split_sizes",),
    ),
    # a bare integer is not a list of splits
    Case(
        "output-scalar", a2a(lambda w: w), TE, TypeError, "all_to_all_single", ("output_split_sizes", "{w}")
    ),
    Case(
        "input-scalar", a2a(None, lambda w: 1), TE, TypeError, "all_to_all_single", ("input_split_sizes", "1")
    ),
]


# --------------------------------------------------------------------------------------------------
# roots and peers: out of range, not an int, both spellings given, no peer at all


def _x() -> np.ndarray:
    return z(2)


ROOTS = [
    Case(
        "broadcast-src-too-big",
        lambda w, r: mpicomm.broadcast(_x(), src=w),
        AE,
        ValueError,
        "broadcast",
        ("src", "{w}"),
    ),
    Case(
        "broadcast-src-negative",
        lambda w, r: mpicomm.broadcast(_x(), src=-1),
        AE,
        ValueError,
        "broadcast",
        ("src", "-1"),
    ),
    Case(
        "broadcast-group_src",
        lambda w, r: mpicomm.broadcast(_x(), group_src=w),
        AE,
        ValueError,
        "broadcast",
        ("group_src", "{w}"),
    ),
    Case(
        "broadcast-src-str",
        lambda w, r: mpicomm.broadcast(_x(), src="0"),
        TE,
        TypeError,
        "broadcast",
        ("src", "'0'"),
    ),
    Case(
        "broadcast-src-float",
        lambda w, r: mpicomm.broadcast(_x(), src=1.5),
        TE,
        TypeError,
        "broadcast",
        ("src", "1.5"),
    ),
    Case(
        "broadcast-both",
        lambda w, r: mpicomm.broadcast(_x(), src=0, group_src=0),
        AE,
        ValueError,
        "broadcast",
        ("src=0", "group_src=0"),
    ),
    Case(
        "reduce-dst-too-big",
        lambda w, r: mpicomm.reduce(_x(), dst=w),
        AE,
        ValueError,
        "reduce",
        ("dst", "{w}"),
    ),
    Case(
        "reduce-group_dst-negative",
        lambda w, r: mpicomm.reduce(_x(), group_dst=-1),
        AE,
        ValueError,
        "reduce",
        ("group_dst", "-1"),
    ),
    Case(
        "reduce-both",
        lambda w, r: mpicomm.reduce(_x(), dst=0, group_dst=0),
        AE,
        ValueError,
        "reduce",
        ("dst=0", "group_dst=0"),
    ),
    Case(
        "gather-dst-too-big",
        lambda w, r: mpicomm.gather(_x(), None, dst=w),
        AE,
        ValueError,
        "gather",
        ("dst", "{w}"),
    ),
    Case(
        "gather-both",
        lambda w, r: mpicomm.gather(_x(), None, dst=0, group_dst=0),
        AE,
        ValueError,
        "gather",
        ("dst=0", "group_dst=0"),
    ),
    Case(
        "scatter-src-negative",
        lambda w, r: mpicomm.scatter(_x(), None, src=-1),
        AE,
        ValueError,
        "scatter",
        ("src", "-1"),
    ),
    Case(
        "scatter-both",
        lambda w, r: mpicomm.scatter(_x(), None, src=0, group_src=0),
        AE,
        ValueError,
        "scatter",
        ("src=0", "group_src=0"),
    ),
    Case("send-dst-too-big", lambda w, r: mpicomm.send(_x(), dst=w), AE, ValueError, "send", ("dst", "{w}")),
    Case("send-no-dst", lambda w, r: mpicomm.send(_x()), AE, ValueError, "send", ("dst",)),
    Case(
        "send-both",
        lambda w, r: mpicomm.send(_x(), dst=(r + 1) % w, group_dst=(r + 1) % w),
        AE,
        ValueError,
        "send",
        ("dst={nxt}", "group_dst={nxt}"),
    ),
    Case(
        "isend-dst-negative", lambda w, r: mpicomm.isend(_x(), dst=-7), AE, ValueError, "isend", ("dst", "-7")
    ),
    Case("isend-no-dst", lambda w, r: mpicomm.isend(_x()), AE, ValueError, "isend", ("dst",)),
    Case(
        "isend-both",
        lambda w, r: mpicomm.isend(_x(), dst=(r + 1) % w, group_dst=(r + 1) % w),
        AE,
        ValueError,
        "isend",
        ("dst={nxt}", "group_dst={nxt}"),
    ),
    Case("recv-src-too-big", lambda w, r: mpicomm.recv(_x(), src=w), AE, ValueError, "recv", ("src", "{w}")),
    Case(
        "recv-group_src-too-big",
        lambda w, r: mpicomm.recv(_x(), group_src=w),
        AE,
        ValueError,
        "recv",
        ("group_src", "{w}"),
    ),
    Case(
        "recv-both",
        lambda w, r: mpicomm.recv(_x(), src=(r + 1) % w, group_src=(r + 1) % w),
        AE,
        ValueError,
        "recv",
        ("src={nxt}", "group_src={nxt}"),
    ),
    Case(
        "irecv-src-negative", lambda w, r: mpicomm.irecv(_x(), src=-7), AE, ValueError, "irecv", ("src", "-7")
    ),
    Case(
        "irecv-both",
        lambda w, r: mpicomm.irecv(_x(), src=(r + 1) % w, group_src=(r + 1) % w),
        AE,
        ValueError,
        "irecv",
        ("src={nxt}", "group_src={nxt}"),
    ),
    Case(
        "send-to-self", lambda w, r: mpicomm.send(_x(), dst=r), AE, ValueError, "send", ("dst", "{r}", "self")
    ),
    Case(
        "send-to-self-group_dst",
        lambda w, r: mpicomm.send(_x(), group_dst=r),
        AE,
        ValueError,
        "send",
        ("dst", "{r}", "self"),
    ),
    Case(
        "isend-to-self",
        lambda w, r: mpicomm.isend(_x(), dst=r),
        AE,
        ValueError,
        "isend",
        ("dst", "{r}", "self"),
    ),
]


# --------------------------------------------------------------------------------------------------
# outputs MPI cannot write into: read-only (strided outputs are written through: tests/mpi/test_strided.py)


def _outputs(m: Callable[[], np.ndarray], what: str) -> list[Case]:
    """One case per output argument of every call, with ``m()`` (6 elements) as the bad output."""
    n = 6
    return [
        Case(
            f"all_reduce-{what}",
            lambda w, r: mpicomm.all_reduce(m()),
            AE,
            ValueError,
            "all_reduce",
            ("tensor", what),
        ),
        Case(
            f"reduce-{what}",
            lambda w, r: mpicomm.reduce(m(), dst=0),
            AE,
            ValueError,
            "reduce",
            ("tensor", what),
        ),
        Case(
            f"broadcast-{what}",
            lambda w, r: mpicomm.broadcast(m(), src=0),
            AE,
            ValueError,
            "broadcast",
            ("tensor", what),
        ),
        Case(
            f"all_gather-{what}",
            lambda w, r: mpicomm.all_gather([m() for _ in range(w)], z(n)),
            AE,
            ValueError,
            "all_gather",
            ("tensor_list[0]", what),
        ),
        Case(
            f"all_gather_into_tensor-{what}",
            lambda w, r: mpicomm.all_gather_into_tensor(m(), z(1)),
            AE,
            ValueError,
            "all_gather_into_tensor",
            ("output_tensor", what),
        ),
        Case(
            f"scatter-{what}",
            lambda w, r: mpicomm.scatter(m(), [z(n) for _ in range(w)] if r == 0 else None, src=0),
            AE,
            ValueError,
            "scatter",
            ("tensor", what),
        ),
        Case(
            f"reduce_scatter-{what}",
            lambda w, r: mpicomm.reduce_scatter(m(), [z(n) for _ in range(w)]),
            AE,
            ValueError,
            "reduce_scatter",
            ("output", what),
        ),
        Case(
            f"reduce_scatter_tensor-{what}",
            lambda w, r: mpicomm.reduce_scatter_tensor(m(), z(n * w)),
            AE,
            ValueError,
            "reduce_scatter_tensor",
            ("output", what),
        ),
        Case(
            f"all_to_all-{what}",
            lambda w, r: mpicomm.all_to_all([m() for _ in range(w)], [z(n) for _ in range(w)]),
            AE,
            ValueError,
            "all_to_all",
            ("output_tensor_list[0]", what),
        ),
        Case(
            f"all_to_all_single-{what}",
            lambda w, r: mpicomm.all_to_all_single(
                m(), z(n), output_split_sizes=[n] + [0] * (w - 1), input_split_sizes=[n] + [0] * (w - 1)
            ),
            AE,
            ValueError,
            "all_to_all_single",
            ("output", what),
        ),
        Case(
            f"recv-{what}",
            lambda w, r: mpicomm.recv(m(), src=(r + 1) % w),
            AE,
            ValueError,
            "recv",
            ("tensor", what),
        ),
        Case(
            f"irecv-{what}",
            lambda w, r: mpicomm.irecv(m(), src=(r + 1) % w),
            AE,
            ValueError,
            "irecv",
            ("tensor", what),
        ),
    ]


def _tagged(cases: list[Case], tag: str) -> list[Case]:
    return [Case(f"{c.id}-{tag}", c.call, c.exc, c.builtin, c.fn, c.words) for c in cases]


OUTPUTS = _outputs(lambda: ro(6), "read-only")


# --------------------------------------------------------------------------------------------------
# reductions: op not a ReduceOp, op not defined on the dtype

REDUCERS: dict[str, Callable[[np.ndarray, Any, int], Any]] = {
    "all_reduce": lambda x, op, w: mpicomm.all_reduce(x, op=op),
    "reduce": lambda x, op, w: mpicomm.reduce(x, dst=0, op=op),
    "reduce_scatter": lambda x, op, w: mpicomm.reduce_scatter(x, [x.copy() for _ in range(w)], op=op),
    "reduce_scatter_tensor": lambda x, op, w: mpicomm.reduce_scatter_tensor(
        x,
        np.concatenate([x] * w).astype(x.dtype),
        op=op,  # concatenate makes byte order native
    ),
}


def _reduction(
    fn: str,
    x: Callable[[], np.ndarray],
    op: Any,
    exc: type[MpicommError],
    builtin: type[Exception],
    words: tuple[str, ...],
    tag: str,
) -> Case:
    return Case(f"{fn}-{tag}", lambda w, r: REDUCERS[fn](x(), op, w), exc, builtin, fn, words)


def _arr(dtype: Any, n: int = 2) -> Callable[[], np.ndarray]:
    return lambda: np.zeros(n, dtype)


REDUCTIONS: list[Case] = []
for _fn in REDUCERS:
    REDUCTIONS += [
        _reduction(_fn, _arr(F8), "sum", TE, TypeError, ("op", "'sum'", "ReduceOp"), "op-str"),
        _reduction(_fn, _arr(F8), None, TE, TypeError, ("op", "None", "ReduceOp"), "op-none"),
        _reduction(_fn, _arr(F8), MPI.SUM, TE, TypeError, ("op", "ReduceOp"), "op-mpi4py"),
        _reduction(_fn, _arr(F8), ReduceOp, TE, TypeError, ("op", "ReduceOp"), "op-class"),
        _reduction(
            _fn, _arr(F8), ReduceOp.PREMUL_SUM, RE, TypeError, ("PREMUL_SUM", "factor"), "premul-no-factor"
        ),
        _reduction(
            _fn,
            _arr(np.int64),
            ReduceOp.PREMUL_SUM(0.5),
            RE,
            TypeError,
            ("PREMUL_SUM", "int64", "integer factor"),
            "premul-float-factor-on-int",
        ),
        _reduction(
            _fn,
            _arr(F8),
            ReduceOp.PREMUL_SUM(1j),
            RE,
            TypeError,
            ("PREMUL_SUM", "float64", "real factor"),
            "premul-complex-factor-on-float",
        ),
        _reduction(
            _fn,
            _arr(F8),
            ReduceOp.PREMUL_SUM(np.complex64(1j)),
            RE,
            TypeError,
            ("PREMUL_SUM", "float64", "real factor"),
            "premul-complex64-factor-on-float",
        ),
        _reduction(_fn, _arr(np.bool_), ReduceOp.AVG, RE, TypeError, ("AVG", "bool"), "avg-bool"),
        _reduction(
            _fn, _arr(np.complex128), ReduceOp.MIN, RE, TypeError, ("MIN", "complex128"), "min-complex"
        ),
        _reduction(_fn, _arr(np.complex64), ReduceOp.MAX, RE, TypeError, ("MAX", "complex64"), "max-complex"),
        _reduction(
            _fn, _arr(np.dtype(">f8")), ReduceOp.SUM, RE, TypeError, ("SUM", ">f8"), "sum-byteswapped"
        ),
        _reduction(
            _fn,
            _arr(np.dtype([("a", "i4"), ("b", "f4")])),
            ReduceOp.SUM,
            RE,
            TypeError,
            ("SUM",),
            "sum-structured",
        ),
    ]
    for _name in ("BAND", "BOR", "BXOR"):
        for _dt in (np.float64, np.float32, np.complex128):
            REDUCTIONS.append(
                _reduction(
                    _fn,
                    _arr(_dt),
                    getattr(ReduceOp, _name),
                    RE,
                    TypeError,
                    (_name, np.dtype(_dt).name),
                    f"{_name.lower()}-{np.dtype(_dt).name}",
                )
            )


# --------------------------------------------------------------------------------------------------
# the group argument

GROUP_CALLS: dict[str, Callable[[int, int, Any], Any]] = {
    "all_reduce": lambda w, r, g: mpicomm.all_reduce(z(2), group=g),
    "all_reduce_sparse": lambda w, r, g: mpicomm.all_reduce_sparse(_sparse(), group=g),
    "all_reduce_coalesced": lambda w, r, g: mpicomm.all_reduce_coalesced([z(2)], group=g),
    "all_gather_coalesced": lambda w, r, g: mpicomm.all_gather_coalesced(
        [[z(2)] for _ in range(w)], [z(2)], group=g
    ),
    "reduce": lambda w, r, g: mpicomm.reduce(z(2), group=g),
    "broadcast": lambda w, r, g: mpicomm.broadcast(z(2), group=g),
    "barrier": lambda w, r, g: mpicomm.barrier(group=g),
    "all_gather": lambda w, r, g: mpicomm.all_gather(zl(w, 2), z(2), group=g),
    "all_gather_into_tensor": lambda w, r, g: mpicomm.all_gather_into_tensor(z(2 * w), z(2), group=g),
    "gather": lambda w, r, g: mpicomm.gather(z(2), zl(w, 2) if r == 0 else None, group=g),
    "scatter": lambda w, r, g: mpicomm.scatter(z(2), zl(w, 2) if r == 0 else None, group=g),
    "reduce_scatter": lambda w, r, g: mpicomm.reduce_scatter(z(2), zl(w, 2), group=g),
    "reduce_scatter_tensor": lambda w, r, g: mpicomm.reduce_scatter_tensor(z(2), z(2 * w), group=g),
    "all_to_all": lambda w, r, g: mpicomm.all_to_all(zl(w), zl(w), group=g),
    "all_to_all_single": lambda w, r, g: mpicomm.all_to_all_single(z(w), z(w), group=g),
    "send": lambda w, r, g: mpicomm.send(z(2), dst=(r + 1) % w, group=g),
    "isend": lambda w, r, g: mpicomm.isend(z(2), dst=(r + 1) % w, group=g),
    "recv": lambda w, r, g: mpicomm.recv(z(2), src=(r + 1) % w, group=g),
    "irecv": lambda w, r, g: mpicomm.irecv(z(2), src=(r + 1) % w, group=g),
    "get_rank": lambda w, r, g: mpicomm.get_rank(g),
    "get_world_size": lambda w, r, g: mpicomm.get_world_size(g),
    "new_node_group": lambda w, r, g: mpicomm.new_node_group(g),
    "broadcast_object_list": lambda w, r, g: mpicomm.broadcast_object_list([r], group=g),
    "all_gather_object": lambda w, r, g: mpicomm.all_gather_object([None] * w, r, group=g),
    "gather_object": lambda w, r, g: mpicomm.gather_object(r, [None] * w if r == 0 else None, group=g),
    "scatter_object_list": lambda w, r, g: mpicomm.scatter_object_list([None], list(range(w)), group=g),
    "send_object_list": lambda w, r, g: mpicomm.send_object_list([r], dst=(r + 1) % w, group=g),
    "recv_object_list": lambda w, r, g: mpicomm.recv_object_list([None], src=(r + 1) % w, group=g),
}

# Everything in mpicomm.__all__ that moves data: each must have bad-input cases.
COMMUNICATING = sorted(
    name
    for name in mpicomm.__all__
    if name not in {"all_gather_single", "reduce_scatter_single", "reduce_op"}
    and name.split("_")[0]
    in {"all", "reduce", "broadcast", "barrier", "gather", "scatter", "send", "recv", "isend", "irecv"}
)


# --------------------------------------------------------------------------------------------------
# the tests


def test_every_communicating_call_is_covered() -> None:
    assert set(COMMUNICATING) >= {"all_reduce", "send", "barrier", "all_to_all_single"}
    typed = {c.fn for c in WRONG_TYPE}
    objs = {c.fn for c in OBJECTS}
    for name in COMMUNICATING:
        assert name in GROUP_CALLS, f"{name} has no bad-group case"
        # barrier takes no array; the object collectives take Python objects (their bad arguments
        # are tested in tests/mpi/test_objects.py)
        if name != "barrier" and "object" not in name:
            assert name in typed, f"{name} has no wrong-type case"
            assert name in objs, f"{name} has no object-dtype case"


@pytest.mark.parametrize("case", _params(WRONG_TYPE))
def test_wrong_type(world: mpicomm.ProcessGroup, case: Case) -> None:
    case.check(world.size(), world.rank())


@pytest.mark.parametrize("case", _params(OBJECTS))
def test_python_objects(world: mpicomm.ProcessGroup, case: Case) -> None:
    case.check(world.size(), world.rank())


@pytest.mark.parametrize("case", _params(DTYPE_MISMATCH))
def test_dtype_mismatch(world: mpicomm.ProcessGroup, case: Case) -> None:
    case.check(world.size(), world.rank())


@pytest.mark.parametrize("case", _params(SIZES))
def test_sizes(world: mpicomm.ProcessGroup, case: Case) -> None:
    case.check(world.size(), world.rank())


@pytest.mark.parametrize("case", _params(ALIASED))
def test_aliased_buffers(world: mpicomm.ProcessGroup, case: Case) -> None:
    case.check(world.size(), world.rank())


def test_all_gather_into_tensor_in_place_idiom_is_fine(world: mpicomm.ProcessGroup) -> None:
    """The contrast case: the input *is* this rank's slot of the output (torch's in-place idiom)."""
    w, r = world.size(), world.rank()
    out = np.zeros(2 * w)
    out[2 * r : 2 * r + 2] = r
    mpicomm.all_gather_into_tensor(out, out[2 * r : 2 * r + 2])
    assert out.tolist() == [float(i) for i in range(w) for _ in range(2)]


@pytest.mark.parametrize("case", _params(SPLITS))
def test_split_sizes(world: mpicomm.ProcessGroup, case: Case) -> None:
    case.check(world.size(), world.rank())


@pytest.mark.parametrize("case", _params(ROOTS))
def test_roots_and_peers(world: mpicomm.ProcessGroup, case: Case) -> None:
    case.check(world.size(), world.rank())


@pytest.mark.parametrize("case", _params(OUTPUTS))
def test_unwritable_outputs(world: mpicomm.ProcessGroup, case: Case) -> None:
    case.check(world.size(), world.rank())


@pytest.mark.parametrize("case", _params(REDUCTIONS))
def test_reductions(world: mpicomm.ProcessGroup, case: Case) -> None:
    case.check(world.size(), world.rank())


EVERY_OP = [
    ReduceOp.SUM,
    ReduceOp.PRODUCT,
    ReduceOp.MIN,
    ReduceOp.MAX,
    ReduceOp.BAND,
    ReduceOp.BOR,
    ReduceOp.BXOR,
    ReduceOp.AVG,
    ReduceOp.PREMUL_SUM(2.0),
]


@pytest.mark.parametrize("fn", sorted(REDUCERS))
def test_float16_refused_by_the_bitwise_ops(world: mpicomm.ProcessGroup, fn: str) -> None:
    """float16 reduces like the other floats (in float32): the bitwise ops refuse it as they refuse floats."""
    for op in EVERY_OP[4:7]:
        with fails(RE, TypeError, fn, "op", op.name, "float16"):
            REDUCERS[fn](np.ones(4, np.float16), op, world.size())


ASYNC = {
    "all_reduce": (
        lambda w, r: mpicomm.all_reduce(ro(6), async_op=True),
        AE,
        ValueError,
        ("tensor", "read-only"),
    ),
    "all_reduce-op": (
        lambda w, r: mpicomm.all_reduce(z(2), op=ReduceOp.BAND, async_op=True),
        RE,
        TypeError,
        ("BAND", "float64"),
    ),
    "reduce": (lambda w, r: mpicomm.reduce(z(2), dst=w, async_op=True), AE, ValueError, ("dst",)),
    "broadcast": (lambda w, r: mpicomm.broadcast(LIST, async_op=True), TE, TypeError, ("tensor",)),
    "barrier": (lambda w, r: mpicomm.barrier(group="world", async_op=True), TE, TypeError, ("group",)),
    "all_gather": (
        lambda w, r: mpicomm.all_gather([z(3) if i == r else z(2) for i in range(w)], z(2), async_op=True),
        AE,
        ValueError,
        ("tensor_list[{r}]",),
    ),
    "all_gather_into_tensor": (
        lambda w, r: mpicomm.all_gather_into_tensor(z(1), z(2), async_op=True),
        AE,
        ValueError,
        ("output_tensor",),
    ),
    "gather": (lambda w, r: mpicomm.gather(z(2), None, dst=-1, async_op=True), AE, ValueError, ("dst",)),
    "scatter": (
        lambda w, r: mpicomm.scatter(ro(2), None, async_op=True),
        AE,
        ValueError,
        ("tensor", "read-only"),
    ),
    "reduce_scatter": (
        lambda w, r: mpicomm.reduce_scatter(z(2), zl(w, 2), op="sum", async_op=True),
        TE,
        TypeError,
        ("op",),
    ),
    "reduce_scatter_tensor": (
        lambda w, r: mpicomm.reduce_scatter_tensor(
            z(2, np.float16), z(2 * w, np.float16), op=ReduceOp.BOR, async_op=True
        ),
        RE,
        TypeError,
        ("float16",),
    ),
    "all_to_all": (
        lambda w, r: mpicomm.all_to_all(zl(w), zl(w + 1), async_op=True),
        AE,
        ValueError,
        ("input_tensor_list",),
    ),
    "all_to_all_single": (
        lambda w, r: mpicomm.all_to_all_single(z(w), z(w), output_split_sizes=[1] * w + [0], async_op=True),
        AE,
        ValueError,
        ("output_split_sizes",),
    ),
}


@pytest.mark.parametrize("fn", sorted(ASYNC))
def test_async_op_raises_at_the_call(world: mpicomm.ProcessGroup, fn: str) -> None:
    """async_op=True checks the same arguments, before any MPI call, at the call: the front door's and
    the host's (checked on the caller's thread before the call is queued, mpicomm.front.prechecks),
    never later and never as another error."""
    call, exc, builtin, words = ASYNC[fn]
    with fails(exc, builtin, fn.split("-")[0], *[x.format(r=world.rank()) for x in words]):
        work = call(world.size(), world.rank())
        work.wait()


@pytest.mark.parametrize("op", ["sum", "read-only", "objects"])
def test_all_reduce_checks_after_a_cached_call(world: mpicomm.ProcessGroup, op: str) -> None:
    """all_reduce's cached fast path (a second call with the same op and dtype) still checks."""
    warm = np.ones(6)
    mpicomm.all_reduce(warm)  # caches (SUM, float64)
    assert warm[0] == world.size()
    bad = {
        "sum": (lambda: mpicomm.all_reduce(np.ones(6), op="sum"), TE, TypeError, ("op", "'sum'")),
        "read-only": (lambda: mpicomm.all_reduce(ro(6)), AE, ValueError, ("tensor", "read-only")),
        "objects": (lambda: mpicomm.all_reduce(objects(6)), TE, TypeError, ("tensor", "object")),
    }
    call, exc, builtin, words = bad[op]
    with fails(exc, builtin, "all_reduce", *words):
        call()


def test_read_only_input_is_fine(world: mpicomm.ProcessGroup) -> None:
    """Inputs are only read: read-only and non-contiguous inputs are accepted (the contrast case)."""
    w, r = world.size(), world.rank()
    src = np.full(4, float(r))
    src.flags.writeable = False
    out = np.empty(4 * w)
    mpicomm.all_gather_into_tensor(out, src)
    assert out.tolist() == [float(i) for i in range(w) for _ in range(4)]
    out2 = np.empty(2 * w)
    mpicomm.all_gather_into_tensor(out2, np.full(4, float(r))[::2])
    assert out2.tolist() == [float(i) for i in range(w) for _ in range(2)]


# ---- root-only list arguments: the root and the other ranks make different mistakes, all raise


@pytest.mark.parametrize("missing", [None, []], ids=["none", "empty"])
def test_gather_list_missing_on_dst_and_given_elsewhere(world: mpicomm.ProcessGroup, missing: Any) -> None:
    w, r = world.size(), world.rank()
    dst = w - 1
    if r == dst:
        with fails(AE, ValueError, "gather", "gather_list", repr(missing), "root"):
            mpicomm.gather(z(2), missing, dst=dst)
    else:
        with fails(AE, ValueError, "gather", "gather_list", f"rank {r}", f"root {dst}", "None"):
            mpicomm.gather(z(2), zl(w, 2), dst=dst)


@pytest.mark.parametrize("missing", [None, []], ids=["none", "empty"])
def test_scatter_list_missing_on_src_and_given_elsewhere(world: mpicomm.ProcessGroup, missing: Any) -> None:
    w, r = world.size(), world.rank()
    src = w - 1
    if r == src:
        with fails(AE, ValueError, "scatter", "scatter_list", repr(missing), "root"):
            mpicomm.scatter(z(2), missing, src=src)
    else:
        with fails(AE, ValueError, "scatter", "scatter_list", f"rank {r}", f"root {src}", "None"):
            mpicomm.scatter(z(2), zl(w, 2), src=src)


ROOT_LIST_MISTAKES = {
    # name: (make the root's list from w, exception, builtin, words)
    "length": (lambda w: zl(w + 1, 2), AE, ValueError, ("{arg}", "{w1} entries", "{w}")),
    "dtype": (lambda w: zl(w, 2, F4), TE, TypeError, ("{arg}", "float32", "float64")),
    "own-size": (lambda w: zl(w, 3), AE, ValueError, ("{arg}[0]", "3", "2")),
    "entry-is-list": (lambda w: [[0.0, 0.0]] * w, TE, TypeError, ("{arg}[0]", "list")),
    "not-a-list": (lambda w: z(2 * w), TE, TypeError, ("{arg}", "ndarray")),
    "objects": (lambda w: [objects() for _ in range(w)], TE, TypeError, ("{arg}[0]", "object")),
}


@pytest.mark.parametrize("mistake", sorted(ROOT_LIST_MISTAKES))
@pytest.mark.parametrize("fn", ["gather", "scatter"])
def test_root_list_checked_on_root(world: mpicomm.ProcessGroup, fn: str, mistake: str) -> None:
    """The root checks its list; the others pass a list too (a mistake there), so every rank raises."""
    w, r = world.size(), world.rank()
    make, exc, builtin, words = ROOT_LIST_MISTAKES[mistake]
    arg = f"{fn}_list"
    call = mpicomm.gather if fn == "gather" else mpicomm.scatter
    if r == 0:
        names = {"arg": arg, "w": w, "w1": w + 1}
        with fails(exc, builtin, fn, *[x.format(**names) for x in words]):
            call(z(2), make(w), 0)
    else:
        with fails(AE, ValueError, fn, arg, f"rank {r}", "None"):
            call(z(2), zl(w, 2), 0)


def test_gather_list_read_only_on_dst(world: mpicomm.ProcessGroup) -> None:
    w, r = world.size(), world.rank()
    if r == 0:
        with fails(AE, ValueError, "gather", "gather_list[0]", "read-only"):
            mpicomm.gather(z(2), [ro(2) for _ in range(w)], dst=0)
    else:
        for _ in range(2):
            with fails(AE, ValueError, "gather", "gather_list", "None"):
                mpicomm.gather(z(2), zl(w, 2), dst=0)


# ---- sub-groups: a world rank that is not a member, group ranks out of range


@pytest.fixture(scope="module")
def tail() -> mpicomm.ProcessGroup:
    """World ranks 1..W-1: a group whose ranks need translating (world rank 0 is not in it)."""
    mpicomm.init()
    return mpicomm.new_group(range(1, mpicomm.get_world_size()))


@pytest.fixture(scope="module")
def head() -> mpicomm.ProcessGroup:
    """World ranks 0..W-2 (world rank W-1 is not in it)."""
    mpicomm.init()
    return mpicomm.new_group(range(mpicomm.get_world_size() - 1))


SUBGROUP_ROOT_CALLS: dict[str, Callable[[Any, dict[str, int]], Any]] = {
    "broadcast": lambda g, kw: mpicomm.broadcast(z(2), group=g, **kw),
    "reduce": lambda g, kw: mpicomm.reduce(z(2), group=g, **kw),
    "gather": lambda g, kw: mpicomm.gather(z(2), None, group=g, **kw),
    "scatter": lambda g, kw: mpicomm.scatter(z(2), None, group=g, **kw),
    "send": lambda g, kw: mpicomm.send(z(2), group=g, **kw),
    "isend": lambda g, kw: mpicomm.isend(z(2), group=g, **kw),
    "recv": lambda g, kw: mpicomm.recv(z(2), group=g, **kw),
    "irecv": lambda g, kw: mpicomm.irecv(z(2), group=g, **kw),
}
ROOT_ARG = {
    "broadcast": "src",
    "reduce": "dst",
    "gather": "dst",
    "scatter": "src",
    "send": "dst",
    "isend": "dst",
    "recv": "src",
    "irecv": "src",
}


def _non_member_does_nothing(call: Callable[[], Any], fn: str) -> None:
    with pytest.warns(UserWarning, match=f"{fn}: this rank is not a member"):
        assert call() in (None, -1)


@pytest.mark.parametrize("fn", sorted(SUBGROUP_ROOT_CALLS))
def test_root_not_in_subgroup(world: mpicomm.ProcessGroup, tail: mpicomm.ProcessGroup, fn: str) -> None:
    arg = ROOT_ARG[fn]
    kw = {arg: 0}  # world rank 0 is not a member of `tail`
    call = SUBGROUP_ROOT_CALLS[fn]
    if not tail.is_member:
        _non_member_does_nothing(lambda: call(tail, kw), fn)
        return
    with fails(AE, ValueError, fn, arg, "world rank 0", "not part of group", tail.name):
        call(tail, kw)


@pytest.mark.parametrize("fn", sorted(SUBGROUP_ROOT_CALLS))
def test_root_not_in_prefix_subgroup(
    world: mpicomm.ProcessGroup, head: mpicomm.ProcessGroup, fn: str
) -> None:
    w = world.size()
    arg = ROOT_ARG[fn]
    kw = {arg: w - 1}  # the last world rank is not a member of `head`
    call = SUBGROUP_ROOT_CALLS[fn]
    if not head.is_member:
        _non_member_does_nothing(lambda: call(head, kw), fn)
        return
    with fails(AE, ValueError, fn, arg, str(w - 1)):
        call(head, kw)


@pytest.mark.parametrize("fn", sorted(SUBGROUP_ROOT_CALLS))
def test_group_rank_out_of_subgroup_range(
    world: mpicomm.ProcessGroup, tail: mpicomm.ProcessGroup, fn: str
) -> None:
    arg = "group_" + ROOT_ARG[fn]
    size = world.size() - 1
    kw = {arg: size}
    call = SUBGROUP_ROOT_CALLS[fn]
    if not tail.is_member:
        _non_member_does_nothing(lambda: call(tail, kw), fn)
        return
    with fails(AE, ValueError, fn, arg, str(size), f"< {size}"):
        call(tail, kw)


@pytest.mark.parametrize("fn", ["broadcast", "send"])
def test_non_integer_root_in_subgroup(
    world: mpicomm.ProcessGroup, tail: mpicomm.ProcessGroup, fn: str
) -> None:
    """A non-integer world rank is a type error on a sub-group too, as it is on the world group."""
    arg = ROOT_ARG[fn]
    kw = {arg: 1.5}
    call = SUBGROUP_ROOT_CALLS[fn]
    if not tail.is_member:
        _non_member_does_nothing(lambda: call(tail, kw), fn)
        return
    with fails(TE, TypeError, fn, arg, "1.5"):
        call(tail, kw)


# ---- point-to-point: receive from self, tags


def _pending_self_message(world: mpicomm.ProcessGroup, tag: int) -> Any:
    """Post a send to self on mpicomm's own communicator, so that a wrongly accepted receive from
    self completes (and the test fails) instead of hanging."""
    return world.comm.Isend([np.full(2, 7.0), MPI.DOUBLE], world.rank(), tag)


def _drain_self_message(world: mpicomm.ProcessGroup, req: Any, tag: int) -> None:
    """Receive the self message unless the library took it; it may take a moment to show up."""
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        if world.comm.Iprobe(world.rank(), tag):
            world.comm.Recv([np.empty(2), MPI.DOUBLE], world.rank(), tag)
            break
    req.Wait()


@pytest.mark.parametrize("fn", ["recv", "irecv"])
@pytest.mark.parametrize("how", ["src", "group_src"])
def test_receive_from_self(world: mpicomm.ProcessGroup, fn: str, how: str) -> None:
    """send/isend to self are refused, so a receive from self could never complete: refuse it too."""
    tag = 11
    req = _pending_self_message(world, tag)
    try:
        call = getattr(mpicomm, fn)
        with fails(AE, ValueError, fn, "src", str(world.rank())):
            work = call(np.empty(2), tag=tag, **{how: world.rank()})
            if fn == "irecv":
                work.wait()
    finally:
        _drain_self_message(world, req, tag)


P2P = {
    "send": lambda w, r, tag: mpicomm.send(z(2), dst=(r + 1) % w, tag=tag),
    "isend": lambda w, r, tag: mpicomm.isend(z(2), dst=(r + 1) % w, tag=tag),
    "recv": lambda w, r, tag: mpicomm.recv(z(2), src=(r + 1) % w, tag=tag),
    "irecv": lambda w, r, tag: mpicomm.irecv(z(2), src=(r + 1) % w, tag=tag),
}


@pytest.mark.parametrize("tag", ["1", 1.0, None, True], ids=["str", "float", "none", "bool"])
@pytest.mark.parametrize("fn", sorted(P2P))
def test_tag_of_wrong_type(world: mpicomm.ProcessGroup, fn: str, tag: Any) -> None:
    with fails(TE, TypeError, fn, "tag", repr(tag), "int"):
        P2P[fn](world.size(), world.rank(), tag)


@pytest.mark.parametrize("which", ["negative", "above-tag-ub"])
@pytest.mark.parametrize("fn", sorted(P2P))
def test_tag_out_of_range(world: mpicomm.ProcessGroup, fn: str, which: str) -> None:
    """An int tag outside 0..MPI_TAG_UB has the right type and a wrong value: ArgumentError."""
    ub = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)
    tag = -1 if which == "negative" else ub + 1
    with fails(AE, ValueError, fn, "tag", str(tag)):
        P2P[fn](world.size(), world.rank(), tag)


# ---- the group argument


@pytest.mark.parametrize("bad", ["world", 0, "mpi4py"])
@pytest.mark.parametrize("fn", sorted(GROUP_CALLS))
def test_group_of_wrong_type(world: mpicomm.ProcessGroup, fn: str, bad: str) -> None:
    group = {"world": "world", 0: 0, "mpi4py": MPI.COMM_WORLD}[bad]
    with fails(TE, TypeError, fn, "group", "ProcessGroup"):
        GROUP_CALLS[fn](world.size(), world.rank(), group)


@pytest.fixture(scope="module")
def destroyed() -> mpicomm.ProcessGroup:
    mpicomm.init()
    g = mpicomm.new_group()
    mpicomm.destroy_process_group(g)
    return g


@pytest.mark.parametrize("fn", sorted(GROUP_CALLS))
def test_destroyed_group(world: mpicomm.ProcessGroup, destroyed: mpicomm.ProcessGroup, fn: str) -> None:
    with fails(GroupError, RuntimeError, fn, "group", destroyed.name, "destroyed"):
        GROUP_CALLS[fn](world.size(), world.rank(), destroyed)


# ---- group management calls


NEW_GROUP = [
    Case(
        "rank-too-big", lambda w, r: mpicomm.new_group([0, w]), AE, ValueError, "new_group", ("ranks", "{w}")
    ),
    Case("rank-negative", lambda w, r: mpicomm.new_group([-1]), AE, ValueError, "new_group", ("ranks", "-1")),
    Case("twice", lambda w, r: mpicomm.new_group([0, 0]), AE, ValueError, "new_group", ("ranks", "twice")),
    Case("str-rank", lambda w, r: mpicomm.new_group(["0"]), TE, TypeError, "new_group", ("ranks", "'0'")),
    Case(
        "float-rank", lambda w, r: mpicomm.new_group([0.0, 1.0]), TE, TypeError, "new_group", ("ranks", "0.0")
    ),
    Case("not-iterable", lambda w, r: mpicomm.new_group(3), TE, TypeError, "new_group", ("ranks", "int")),
    Case(
        "get_global_rank-range",
        lambda w, r: mpicomm.get_global_rank(mpicomm.init(), w),
        AE,
        ValueError,
        "get_global_rank",
        ("group_rank", "{w}"),
    ),
    Case(
        "get_group_rank-not-member",
        lambda w, r: mpicomm.get_group_rank(mpicomm.init(), w),
        AE,
        ValueError,
        "get_group_rank",
        ("global", "{w}"),
    ),
    Case("init-not-a-comm", lambda w, r: mpicomm.init(42), TE, TypeError, "init", ("comm", "int")),
]


@pytest.mark.parametrize("case", _params(NEW_GROUP))
def test_group_management(world: mpicomm.ProcessGroup, case: Case) -> None:
    case.check(world.size(), world.rank())


def test_init_on_another_communicator(world: mpicomm.ProcessGroup) -> None:
    """After init, a different communicator is refused (COMM_SELF differs from the world at W > 1)."""
    with pytest.raises(GroupError) as info:
        mpicomm.init(MPI.COMM_SELF)
    assert isinstance(info.value, RuntimeError)
    assert str(info.value).startswith("init: ") and "destroy_process_group" in str(info.value)
    assert mpicomm.init(MPI.COMM_WORLD) is world  # the same communicator is fine


def test_new_group_from_a_generator(world: mpicomm.ProcessGroup) -> None:
    """``ranks`` is typed ``Iterable[int]``: a one-shot iterator must work like the list."""
    g = mpicomm.new_group(r for r in range(world.size()))
    try:
        assert g.size() == world.size() and g.ranks == list(range(world.size()))
    finally:
        mpicomm.destroy_process_group(g)


def test_errors_leave_no_pending_messages(world: mpicomm.ProcessGroup) -> None:
    """After a burst of refused calls, nothing was sent: no message waits on mpicomm's communicator."""
    w, r = world.size(), world.rank()
    for call in (
        lambda: mpicomm.send(LIST, dst=(r + 1) % w),
        lambda: mpicomm.isend(ro(2), dst=w),
        lambda: mpicomm.all_gather_into_tensor(z(2 * w + 1), z(2)),
        lambda: mpicomm.all_to_all_single(z(w), z(w), input_split_sizes=[w] + [-1] * (w - 1)),
        lambda: mpicomm.reduce_scatter(z(2), zl(w, 2), op=ReduceOp.BAND),
    ):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(MpicommError):
                call()
    mpicomm.barrier()
    for comm in (world.comm, getattr(world, "internal", None)):
        if comm is not None:
            assert not comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
