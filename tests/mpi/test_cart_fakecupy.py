"""CartGrid's calls on cupy arrays, on the fake cupy (tests/fakecupy): staged through host memory.

CPU emulation of the staged path, not GPU verification. The same checks as for numpy: the box
stencil against the serial one, bit for bit, and scatter/gather of uneven blocks. The fake's
staging buffers are poisoned when lent, so a ghost layer the exchange failed to write shows.
"""

from __future__ import annotations

from typing import Any

import gridref
import numpy as np
import pytest

import mpicomm
from mpicomm.front import device as front

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("periodic", [True, False])
def test_box_stencil_on_device_blocks_equals_the_serial_stencil(cp: Any, periodic: bool) -> None:
    grid = mpicomm.CartGrid((0, 0), periodic=periodic)
    shape, width, steps, seed = (13, 11), 1, 3, 21
    whole = gridref.initial(shape, width, seed)
    where = grid.block_slices(whole.shape, width=width)
    d = cp.asarray(whole[where])
    for _ in range(steps):
        assert grid.exchange_halos(d, width=width) is None
        host = d.get()
        gridref.step(host, width)
        d = cp.asarray(host)
    want = gridref.serial(shape, width, (periodic, periodic), steps, seed)[where]
    np.testing.assert_array_equal(d.get()[1:-1, 1:-1], want[1:-1, 1:-1])
    assert front.PATHS["exchange_halos", "staged"] == steps


def test_async_exchange_of_a_device_block_is_complete_after_wait(cp: Any) -> None:
    grid = mpicomm.CartGrid((0, 0), periodic=True)
    whole = gridref.initial((9, 8), 1, 4)
    where = grid.block_slices(whole.shape, width=1)
    d = cp.asarray(whole[where])
    work = grid.exchange_halos(d, async_op=True)
    assert work is not None and work.wait()
    gridref.wrap(whole, 1, (True, True))
    np.testing.assert_array_equal(d.get(), whole[where])


def test_scatter_and_gather_of_device_arrays_through_out(cp: Any) -> None:
    rank = mpicomm.get_rank()
    grid = mpicomm.CartGrid((0,))
    whole = np.arange(29.0)
    where = grid.block_slices(whole.shape)
    out = cp.full(where[0].stop - where[0].start, -1.0)
    got = grid.scatter_blocks(cp.asarray(whole) if rank == 0 else None, out=out)
    assert got is out
    np.testing.assert_array_equal(out.get(), whole[where])
    full = cp.zeros(29)
    back = grid.gather_blocks(out, out=full)
    if rank == 0:
        assert back is full
        np.testing.assert_array_equal(full.get(), whole)
    else:
        assert back is None
        np.testing.assert_array_equal(full.get(), np.zeros(29))  # not the root's: left as it was
