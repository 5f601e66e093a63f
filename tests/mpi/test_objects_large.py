"""An object over 2 GiB: broadcast at 2 ranks (about 4.3 GB of memory in all), marked slow.

MPI counts are C ints: a single message over 2**31 - 1 bytes fails on MPI libraries without MPI-4
large counts (Open MPI 5.0). mpicomm cuts every message into pieces of at most 1 GiB, which this test
checks with a real 2 GiB + 64 byte array.
"""

from __future__ import annotations

import numpy as np
import pytest

import mpicomm

NBYTES = 2**31 + 64
STEP = 16 << 20  # words per block when filling and checking, so no temporary is large
MIX = np.uint64(0x9E3779B97F4A7C15)


def _block(start: int, stop: int) -> np.ndarray:
    return np.arange(start, stop, dtype=np.uint64) * MIX


def _fill(x: np.ndarray) -> None:
    words = x.view(np.uint64)
    for start in range(0, words.size, STEP):
        stop = min(start + STEP, words.size)
        words[start:stop] = _block(start, stop)


def _matches(x: np.ndarray) -> bool:
    words = x.view(np.uint64)
    return all(
        np.array_equal(words[s : min(s + STEP, words.size)], _block(s, min(s + STEP, words.size)))
        for s in range(0, words.size, STEP)
    )


@pytest.mark.slow
@pytest.mark.mpi(min_size=1)
def test_broadcast_of_an_object_over_2_gib(world: mpicomm.ProcessGroup) -> None:
    if world.size() != 2:
        pytest.skip(f"runs at 2 ranks only (about 4.3 GB of memory); this run has {world.size()}")
    if world.rank() == 0:
        big = np.empty(NBYTES, np.uint8)
        _fill(big)
        objs: list[object] = [{"name": "big", "data": big}, "tail"]
    else:
        objs = [None, None]
    mpicomm.broadcast_object_list(objs, src=0)
    assert objs[1] == "tail"
    got = objs[0]
    assert isinstance(got, dict) and got["name"] == "big"
    assert got["data"].dtype == np.uint8 and got["data"].shape == (NBYTES,)
    ok = _matches(got["data"]) if world.rank() == 1 else True
    del objs, got
    assert mpicomm.get_world_size() == 2
    flags = [None, None]
    mpicomm.all_gather_object(flags, ok)
    assert flags == [True, True]
