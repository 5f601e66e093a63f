"""One clock for every rank: each rank's offset to rank 0's ``perf_counter_ns``, from MPI round trips.

Rank ``r`` sends a message to rank 0 at ``a`` (its own clock), rank 0 answers with its clock ``b``, and
``r`` receives the answer at ``c``. If the two halves of the trip took as long as each other, rank 0 read
``b`` when ``r``'s clock read ``(a + c) / 2``: the offset is ``b - (a + c) / 2``, within half the round
trip. Of :data:`SAMPLES` trips the one with the shortest round trip is kept (the one least delayed by
the network or the scheduler), as NTP and Score-P do. Samples at the start and the end of a run give
the drift between them (:func:`offset_at` interpolates).
"""

from __future__ import annotations

import itertools
import time
from time import perf_counter_ns
from typing import Any

import numpy as np

__all__ = ["SAMPLES", "estimate", "offset_at", "together"]

#: Round trips per rank; the shortest one's estimate is kept.
SAMPLES = 8
#: The tag of the trips, on the recorder's own communicator (a Dup: never matches a user's message).
_TAG = 4343


def estimate(comm: Any, samples: int = SAMPLES) -> tuple[int, int, int]:
    """This rank's ``(local ns, offset ns, round trip ns)``: rank 0's clock is local + offset (collective).

    Rank 0 answers each other rank in turn, ``samples`` times; its own offset is 0.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    buf = np.zeros(1, np.int64)
    if rank == 0:
        for peer in range(1, size):
            for _ in range(samples):
                comm.Recv(buf, peer, _TAG)
                buf[0] = perf_counter_ns()
                comm.Send(buf, peer, _TAG)
        return perf_counter_ns(), 0, 0
    best = (0, 0, -1)
    for _ in range(samples):
        a = perf_counter_ns()
        comm.Send(buf, 0, _TAG)
        comm.Recv(buf, 0, _TAG)
        c = perf_counter_ns()
        if best[2] < 0 or c - a < best[2]:
            mid = (a + c) // 2
            best = (mid, int(buf[0]) - mid, c - a)
    return best


def offset_at(clock: list[tuple[int, int, int]] | list[list[int]], t: float) -> float:
    """The offset at local time ``t``: linear between the samples around it, the nearest one outside them.

    Example:
        >>> offset_at([(0, 100, 5), (1000, 200, 5)], 500)
        150.0
        >>> offset_at([(0, 100, 5)], 9e9), offset_at([], 3)
        (100.0, 0.0)
    """
    if not clock:
        return 0.0
    points = sorted((float(s[0]), float(s[1])) for s in clock)
    if t <= points[0][0]:
        return points[0][1]
    for (t0, o0), (t1, o1) in itertools.pairwise(points):
        if t <= t1:
            return o0 + (o1 - o0) * (t - t0) / (t1 - t0) if t1 > t0 else o1
    return points[-1][1]


def together(comm: Any, seconds: float) -> bool:
    """Whether every rank of ``comm`` reached this point within ``seconds`` (a barrier that cannot hang)."""
    req = comm.Ibarrier()
    deadline = time.monotonic() + seconds
    while not req.Test():
        if time.monotonic() > deadline:
            return False  # the request stays posted; the communicator is not freed by the caller then
        time.sleep(0.0005)
    return True
