"""Derived datatypes from numpy strides (mpicomm.core.layouts), checked on MPI_COMM_SELF against numpy."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import mpicomm
from mpicomm import _mpi
from mpicomm.core import buffers, layouts

RNG = np.random.default_rng(15)
BASE = RNG.standard_normal((5, 6, 4))
VIEWS = {
    "column": lambda a: a[:, 0],
    "every-other": lambda a: a[:, ::2],
    "transposed": lambda a: a.T,
    "reversed": lambda a: a[::-1, ::-2, 1],
    "box": lambda a: a[1:4, 2:5, ::3],
    "scalar-rows": lambda a: a[:, :, 0].T,
}


def _self_copy(send: np.ndarray, recv: np.ndarray) -> None:
    mpicomm.init()
    spec, post = buffers.recv_message(recv)
    _mpi.MPI.COMM_SELF.Sendrecv(buffers.message(send), 0, 0, spec, 0, 0)
    if post is not None:
        post()


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_a_strided_view_travels_in_place_both_ways(name: str) -> None:
    src = VIEWS[name](BASE)
    target = np.full_like(BASE, np.nan)
    _self_copy(src, VIEWS[name](target))
    np.testing.assert_array_equal(VIEWS[name](target), src)
    untouched = np.ones(BASE.shape, bool)
    VIEWS[name](untouched)[...] = False
    assert np.isnan(target[untouched]).all()


def test_span_and_regular() -> None:
    a = np.zeros((3, 4))
    assert layouts.span(a[:, 1])[1] == 2 * 32 + 8
    assert layouts.span(a[::-1, ::-1]) == (a.__array_interface__["data"][0], a.nbytes)
    assert layouts.regular(a[:, ::2]) and layouts.regular(a.T)
    assert not layouts.regular(np.lib.stride_tricks.as_strided(a, (3, 3), (8, 8)))


def test_rows_describe_dim_0_runs_or_decline() -> None:
    mpicomm.init()
    elem = buffers.datatype(np.dtype(np.float64))
    a = np.zeros((6, 4))
    _, dt = layouts.rows(a[:, 1:3], elem, readonly=True)  # type: ignore[misc]
    assert dt.Get_extent() == (0, 32) and dt.Get_size() == 16
    assert layouts.rows(a[::-1], elem, readonly=True) is None  # dim 0 steps backwards: the caller copies


@pytest.mark.process
def test_cache_is_bounded_and_freed_at_finalize() -> None:
    code = (
        "import numpy as np, mpicomm\n"
        "from mpi4py import MPI\n"
        "from mpicomm.core import layouts\n"
        "for n in range(2, layouts.CACHE_SIZE + 30):\n"
        "    mpicomm.broadcast(np.zeros((n, 2))[:, 0], src=0)\n"
        "    assert layouts.cached() <= layouts.CACHE_SIZE\n"
        "assert layouts.cached() == layouts.CACHE_SIZE\n"
        "MPI.Finalize()\n"
        "print('left', layouts.cached())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "left 0"
