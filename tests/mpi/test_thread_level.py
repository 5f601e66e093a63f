"""Two threads, each with its own group, run collectives at once and get the right answers.

Under ``python -m mpi4py`` MPI runs at ``MPI_THREAD_MULTIPLE`` (mpi4py started it before mpicomm),
so mpicomm leaves the calls to any thread. Every rank computes the reference from the ranks' seeds.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from ranks import in_threads

import mpicomm
from mpicomm.core import watchdog

pytestmark = pytest.mark.skipif(
    MPI.Query_thread() < MPI.THREAD_MULTIPLE,
    reason="needs MPI_THREAD_MULTIPLE (tests/unit/test_thread_level.py)",
)


def test_mpicomm_leaves_a_multiple_level_to_every_thread(world: mpicomm.ProcessGroup) -> None:
    assert watchdog._Threads.owner is None and watchdog._Threads.level == "multiple"


def test_two_threads_run_collectives_on_their_own_groups(world: mpicomm.ProcessGroup) -> None:
    n, r, rounds = world.size(), world.rank(), 200
    groups = [mpicomm.new_group(list(range(n))) for _ in range(2)]
    got: dict[int, list[np.ndarray]] = {0: [], 1: []}

    def work(t: int) -> None:
        for i in range(rounds):
            x = np.full(3, float(r * 10 + t + i), np.float64)
            mpicomm.all_reduce(x, group=groups[t])
            out = [np.empty(2, np.int64) for _ in range(n)]
            mpicomm.all_gather(out, np.array([r, t * 1000 + i]), group=groups[t])
            got[t].append(np.concatenate([x, *out]))

    in_threads(lambda: work(0), lambda: work(1))
    for t in range(2):
        assert len(got[t]) == rounds
        for i, row in enumerate(got[t]):
            want_sum = sum(s * 10 + t + i for s in range(n))
            want = np.concatenate([np.full(3, want_sum), *[np.array([s, t * 1000 + i]) for s in range(n)]])
            np.testing.assert_array_equal(row, want)
    for g in groups:
        mpicomm.destroy_process_group(g)
