"""Barriers: ``barrier`` (with ``timeout=``, bounded) and ``monitored_barrier`` (names the missing ranks).

A barrier that times out cannot be taken back in MPI: the error is raised, and an uncaught error ends
the whole job (mpicomm's abort hook), which is what a user who sets a timeout wants.
"""

from __future__ import annotations

import datetime
import time
from typing import Any

import numpy as np

from .. import _mpi
from ..core import validation
from ..core.calls import collective
from ..core.groups import ProcessGroup, resolve, timeout_seconds, warn_non_member
from ..core.watchdog import DEFAULT_TIMEOUT, Site, default_timeout, timed
from ..core.work import Work
from ..errors import CommunicationError

__all__ = ["barrier", "monitored_barrier", "timed_barrier", "wait_until"]

#: Tag of monitored_barrier's messages on a group's internal communicator.
TAG = 20280
_POLL = 0.0005


def wait_until(requests: list[Any], deadline: float) -> list[bool]:
    """Poll ``requests`` until all complete or ``time.monotonic()`` passes ``deadline``.

    Args:
        requests: MPI requests.
        deadline: A ``time.monotonic()`` value.

    Returns:
        Which requests completed, in order.
    """
    done = [False] * len(requests)
    while True:
        for i, req in enumerate(requests):
            if not done[i]:
                done[i] = bool(req.Test())
        if all(done) or time.monotonic() > deadline:
            return done
        time.sleep(_POLL)


@timed(Site("monitored_barrier"), "group", "timeout")
def monitored_barrier(
    group: ProcessGroup | None = None,
    timeout: datetime.timedelta | float | None = None,
    wait_all_ranks: bool = False,
) -> None:
    """A barrier that tells which ranks did not arrive within ``timeout`` (torch.distributed's).

    Group rank 0 waits for a message from every other rank, then answers each. If some did not
    arrive in time, rank 0 raises naming them (all of them: MPI waits for every rank at once, so
    ``wait_all_ranks`` changes nothing) and the ranks that did arrive raise too, naming the same
    ranks. A rank that gets no answer from rank 0 within twice ``timeout`` raises naming rank 0.

    Args:
        group: The process group; ``None`` for the world.
        timeout: A ``timedelta`` or seconds; ``None`` for the group's timeout, as in torch (the
            default, 30 minutes, for a group made without one; ``MPICOMM_TIMEOUT`` changes it).
        wait_all_ranks: Accepted for torch compatibility; every missing rank is always named.

    Raises:
        CommunicationError: ranks did not arrive in time (a RuntimeError, as torch's).
        ArgumentTypeError: a bad ``timeout``.

    Example:
        >>> import mpicomm
        >>> mpicomm.monitored_barrier(timeout=60)
    """
    fn = "monitored_barrier"
    seconds = timeout_seconds(timeout, fn)
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return
    if g.size() == 1:
        return
    limit = seconds
    if limit is None:  # the group's timeout, as torch's
        limit = g.timeout if g.timeout is not None else default_timeout() or DEFAULT_TIMEOUT
    if g.rank() == 0:
        _collect(g, limit, fn, wait_all_ranks)
    else:
        _report(g, limit, fn)


def _collect(g: ProcessGroup, limit: float, fn: str, wait_all_ranks: bool) -> None:
    comm, peers = g.internal, range(1, g.size())
    tokens = np.zeros((g.size(), 1), np.int64)
    requests = [comm.Irecv([tokens[p], _mpi.MPI.INT64_T], p, TAG) for p in peers]
    arrived = wait_until(requests, time.monotonic() + limit)
    missing = [g.ranks[p] for p, ok in zip(peers, arrived, strict=True) if not ok]
    for req, ok in zip(requests, arrived, strict=True):
        if not ok:  # so that a late rank's message is not taken by a later monitored_barrier
            req.Cancel()
            req.Wait()
    answer = np.array([len(missing), *missing] + [0] * (g.size() - 1 - len(missing)), np.int64)
    sends = [
        comm.Isend([answer, _mpi.MPI.INT64_T], p, TAG) for p, ok in zip(peers, arrived, strict=True) if ok
    ]
    _mpi.MPI.Request.Waitall(sends)
    if missing:
        raise CommunicationError(
            f"{fn}: world ranks {missing} of group {g.name} did not arrive within {limit:g} s; "
            f"expected every rank of the group (torch says: "
            f"{_torch_words(g, missing, limit, wait_all_ranks)})"
        )


def _torch_words(g: ProcessGroup, missing: list[int], limit: float, wait_all_ranks: bool) -> str:
    """The sentence of torch's Gloo for the same failure (group ranks), which torch programs match on."""
    ms = round(limit * 1000)
    if ms == 0:
        return "Rank 0 timed out in monitoredBarrier after 0 ms"
    ranks = [g.group_rank(r) for r in missing]
    if wait_all_ranks and len(ranks) > 1:
        return f"Ranks {', '.join(map(str, ranks))} failed to pass monitoredBarrier in {ms} ms"
    return f"Rank {ranks[0]} failed to pass monitoredBarrier in {ms} ms"


def _report(g: ProcessGroup, limit: float, fn: str) -> None:
    comm = g.internal
    token, answer = np.ones(1, np.int64), np.zeros(g.size(), np.int64)
    send = comm.Isend([token, _mpi.MPI.INT64_T], 0, TAG)
    recv = comm.Irecv([answer, _mpi.MPI.INT64_T], 0, TAG)
    if not all(wait_until([send, recv], time.monotonic() + 2 * limit)):
        raise CommunicationError(
            f"{fn}: group rank 0 (world rank {g.ranks[0]}) of group {g.name} did not answer within "
            f"{2 * limit:g} s; expected it to arrive"
        )
    if answer[0]:
        missing = answer[1 : 1 + answer[0]].tolist()
        raise CommunicationError(
            f"{fn}: world ranks {missing} of group {g.name} did not arrive within {limit:g} s "
            f"(reported by world rank {g.ranks[0]}); expected every rank of the group (torch says: Rank "
            f"{g.rank()} successfully reached monitoredBarrier, but received errors while waiting for "
            "send/recv from rank 0)"
        )


def timed_barrier(g: ProcessGroup, seconds: float, validated: bool = False) -> None:
    """``barrier(timeout=...)``: the whole call, validation included, bounded by ``seconds``.

    Each step (validation mode's exchange, then ``MPI_Ibarrier``) is posted non-blocking and polled
    until it completes or the deadline passes.

    Raises:
        CommunicationError: it did not complete within ``seconds``.
        CrossRankMismatchError: (``validated``) ranks are in different calls.
    """
    deadline = time.monotonic() + seconds

    def wait(request: Any) -> None:
        if not wait_until([request], deadline)[0]:
            # MPI may still write its buffers: keep them alive (those completed since are let go)
            _ABANDONED[:] = [r for r in _ABANDONED if not r.Test()]
            _ABANDONED.append(request)
            raise CommunicationError(
                f"barrier: not every rank of group {g.name} (world ranks {g.ranks}) entered within "
                f"{seconds:g} s; expected all of them (Timed out after {seconds:g} s; monitored_barrier "
                "names the missing ranks; the barrier stays posted, so do not use this group again, as "
                "torch's group is closed after a timeout)"
            )

    if validated:
        validation.check(g, "barrier", {}, wait=wait)
    wait(g.comm.Ibarrier())


#: Requests given up on by a timed barrier: MPI owns their buffers until they complete, if ever.
_ABANDONED: list[Any] = []


@collective("barrier")
def barrier(
    group: ProcessGroup | None = None,
    async_op: bool = False,
    device_ids: Any = None,
    timeout: datetime.timedelta | float | None = None,
) -> Work | None:
    """Block until every rank of the group has entered the barrier.

    Args:
        group: The process group; ``None`` for the world.
        async_op: Return a Work (over ``MPI_Ibarrier``) instead of blocking.
        device_ids: Accepted for torch compatibility and ignored.
        timeout: A ``timedelta`` or seconds: raise if the barrier has not completed by then (a
            blocking call only); None: the group's own timeout, if it was made with one.
            :func:`monitored_barrier` also names the missing ranks.

    Returns:
        A Work if ``async_op``, else None.

    Raises:
        CommunicationError: the barrier did not complete within ``timeout``.

    Example:
        >>> import mpicomm
        >>> mpicomm.barrier()
    """
    seconds = timeout_seconds(timeout, "barrier")
    g = resolve(group, "barrier")
    if g.comm is None:
        warn_non_member(g, "barrier")
        return None
    if seconds is None:
        seconds = g.timeout  # init_process_group(timeout=) or new_group(timeout=)
    if seconds is not None and not async_op:
        timed_barrier(g, seconds, validation._Flag.on)  # bounded, validation exchange included
        return None
    if validation._Flag.on:
        validation.check(g, "barrier", {})
    request = g.comm.Ibarrier()  # never MPI_Barrier: a blocking one would not match a timed one
    if async_op:
        return Work([request], fn="barrier")
    request.Wait()
    return None
