import numpy as np
import pytest

import mpicomm


@pytest.mark.mpi(min_size=1)
def test_all_reduce_sum_matches_numpy(world, rng):
    w, r = world.size, world.rank
    data = rng.standard_normal((w, 5))
    x = data[r].copy()
    mpicomm.all_reduce(x)
    np.testing.assert_allclose(x, data.sum(axis=0))


@pytest.mark.mpi(min_size=2)
def test_fails_on_rank_one(world):
    if world.rank == 1 and __import__("os").environ.get("MPICOMM_SELFTEST_FAIL"):
        raise AssertionError("deliberate failure on rank 1")
    mpicomm.barrier()
