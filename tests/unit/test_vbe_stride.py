"""A VBE stride that contradicts the table raises a clear error (issue 22, item 6)."""

from __future__ import annotations

import numpy as np
import pytest

from mpicomm import ArgumentError
from mpicomm.jagged import KeyedJaggedArray

TABLE = [[1, 0], [2, 1]]  # key a: 1 slot, key b: 3 slots (two ranks' columns)


def _kja(stride: int | None) -> KeyedJaggedArray:
    lengths = np.ones(4, np.int64)
    return KeyedJaggedArray(
        ["a", "b"], np.arange(4), lengths=lengths, stride=stride, stride_per_key_per_rank=TABLE
    )


@pytest.mark.parametrize("stride", [0, 1, 2, 4, 100])
def test_a_vbe_stride_that_contradicts_the_table_raises(stride: int) -> None:
    with pytest.raises(ArgumentError, match=rf"KeyedJaggedArray: stride is {stride} .*expected 3"):
        _kja(stride)


@pytest.mark.parametrize("stride", [None, 3])
def test_a_vbe_stride_that_matches_the_table_or_none_is_the_largest_key(stride: int | None) -> None:
    kja = _kja(stride)
    assert kja.stride() == 3 and kja.stride_per_key_per_rank() == TABLE
