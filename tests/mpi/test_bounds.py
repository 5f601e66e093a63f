"""Bounded and exact: lengths whose sums wrap are refused, sizes are checked before any copy.

Every rank makes the same mistake here, so each raises on its own and no rank waits; the tests pass
at any number of ranks.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import mpicomm
from mpicomm import ArgumentError, jagged_all_to_all
from mpicomm.jagged import KeyedJaggedArray, KJTAllToAll

WRAPPING = {
    "uint64 [2**64-1, 3]": np.array([2**64 - 1, 3], np.uint64),
    "int64 partial sums past 2**63": np.array([2**62, 2**62, 2**62, 2**62], np.int64),
    "uint64 entries of 2**63": np.array([2**63, 2**63], np.uint64),
}


@pytest.mark.parametrize("name", sorted(WRAPPING))
def test_keyed_jagged_array_refuses_lengths_whose_sum_wraps(name: str) -> None:
    lengths = WRAPPING[name]
    with pytest.raises(ArgumentError, match=r"KeyedJaggedArray: lengths describe .* past int64"):
        KeyedJaggedArray([f"k{i}" for i in range(lengths.size)], np.zeros(2), lengths=lengths)


def test_keyed_jagged_array_refuses_uint64_offsets_that_decrease() -> None:
    with pytest.raises(ArgumentError, match="KeyedJaggedArray: offsets describe"):
        KeyedJaggedArray(["a", "b"], np.zeros(3), offsets=np.array([0, 5, 3], np.uint64))


def test_uint64_lengths_that_fit_give_exact_per_key_lengths() -> None:
    kja = KeyedJaggedArray(["a", "b"], np.arange(5.0), lengths=np.array([2, 3], np.uint64))
    assert kja.length_per_key() == [2, 3]


@pytest.mark.parametrize("name", sorted(WRAPPING))
def test_jagged_all_to_all_refuses_lengths_whose_sum_wraps(world: mpicomm.ProcessGroup, name: str) -> None:
    lengths = np.resize(WRAPPING[name], world.size() * WRAPPING[name].size)
    with pytest.raises(ArgumentError, match=r"jagged_all_to_all: lengths describe .* past int64"):
        jagged_all_to_all(np.zeros(2), lengths, [WRAPPING[name].size] * world.size())


def test_kjt_all_to_all_never_sees_wrapped_lengths(world: mpicomm.ProcessGroup) -> None:
    # the KeyedJaggedArray refuses them at construction, before any exchange can start
    with pytest.raises(ArgumentError, match="past int64"):
        KJTAllToAll([2] + [0] * (world.size() - 1))(
            KeyedJaggedArray(["a", "b"], np.zeros(2), lengths=np.array([2**64 - 1, 3], np.uint64))
        )


def _stride0(rows: int) -> np.ndarray:
    """``rows`` elements of 8 bytes that take 8 bytes of memory (a 32 GiB copy if made contiguous)."""
    return np.broadcast_to(np.float64(1.0), (rows,))


def _size_mistakes(w: int) -> dict[str, Callable[[], Any]]:
    big = _stride0(w << 32)
    return {
        "all_to_all_single": lambda: mpicomm.all_to_all_single(np.empty(w), big),
        "all_gather_into_tensor": lambda: mpicomm.all_gather_into_tensor(np.empty(w), big),
        "reduce_scatter_tensor": lambda: mpicomm.reduce_scatter_tensor(np.empty(1), big),
        "all_to_all": lambda: mpicomm.all_to_all([np.empty(1) for _ in range(w)], [big] * w),
        "all_gather": lambda: mpicomm.all_gather([np.empty(1) for _ in range(w)], big),
    }


@pytest.mark.parametrize(
    "fn", ["all_to_all_single", "all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all", "all_gather"]
)
def test_sizes_are_checked_before_a_strided_input_is_copied(world: mpicomm.ProcessGroup, fn: str) -> None:
    call = _size_mistakes(world.size())[fn]
    tracemalloc.start()
    try:
        with pytest.raises(ArgumentError, match=fn):
            call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{fn} allocated {peak} bytes before refusing"
