"""torch's ``Work`` for the registered backend: handles torch's C++ side can wait on and read.

torch's C++ call sites (DDP's reducer, comm hooks, functional collectives) wait on a Work's *future*,
never on the Work itself, and read its ``value()`` as the list of output tensors. So a collective of
the registered group completes before it returns, and its Work holds the outputs: the future it
gives is already complete. A point-to-point transfer cannot complete before it returns (two ranks
that both send first would wait for each other), so its Work waits for mpicomm's own Work when torch
waits on it or asks for its future.
"""

from __future__ import annotations

import contextlib
import datetime
from typing import Any

import torch
from torch._C._distributed_c10d import Work as _TorchWork

from ..core.work import Work

__all__ = ["Done", "Pending", "Running"]

_ZERO = datetime.timedelta(0)


class Done(_TorchWork):
    """A completed collective: ``wait`` returns at once, the future holds ``outputs``.

    Example:
        >>> import torch
        >>> from mpicomm.c10d.work import Done
        >>> w = Done([torch.ones(1)])
        >>> w.wait() and w.is_completed() and float(w.get_future().value()[0][0])
        1.0
    """

    def __init__(self, outputs: list[Any]) -> None:
        super().__init__()
        self._outputs = outputs

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Return True: the collective completed before its call returned."""
        return True

    def is_completed(self) -> bool:
        """Always True."""
        return True

    def is_success(self) -> bool:
        """Always True: a failed collective raised instead of returning a Work."""
        return True

    def exception(self) -> None:
        """None: a failed collective raised instead."""
        return None

    def result(self) -> list[Any]:
        """The output tensors."""
        return self._outputs

    def get_future(self) -> torch.futures.Future[list[Any]]:
        """A completed future whose value is the list of output tensors (what torch's C++ reads)."""
        fut: torch.futures.Future[list[Any]] = torch.futures.Future()
        fut.set_result(self._outputs)
        return fut

    def source_rank(self) -> int:
        """-1: a collective has no source."""
        return -1

    _source_rank = source_rank


class Pending(_TorchWork):
    """A point-to-point transfer in flight: torch's ``wait`` (and ``get_future``) wait for mpicomm's Work.

    Args:
        work: mpicomm's Work of the transfer.
        outputs: The tensors the future answers.
        ranks: The group's world ranks, to give ``_source_rank`` as a group rank (what torch expects).

    Example:
        >>> import torch, mpicomm
        >>> from mpicomm.core.work import completed
        >>> from mpicomm.c10d.work import Pending
        >>> Pending(completed(), [torch.ones(1)], [0]).wait()
        True
    """

    def __init__(self, work: Work, outputs: list[Any], ranks: list[int]) -> None:
        super().__init__()
        self._work = work
        self._outputs = outputs
        self._ranks = ranks

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Wait for the transfer (a positive timeout bounds the wait) and return True.

        torch's C++ side passes ``timedelta(0)`` for "no timeout" (c10d's ``kNoTimeout``).
        """
        if timeout is not None and timeout <= _ZERO:
            timeout = None
        return self._work.wait(timeout)

    def is_completed(self) -> bool:
        """Whether the transfer has completed (tests it once)."""
        return self._work.is_completed()

    def is_success(self) -> bool:
        """Whether the transfer completed without an error."""
        return self._work.is_success()

    def exception(self) -> BaseException | None:
        """The transfer's error, if it failed."""
        return self._work.exception()

    def result(self) -> list[Any]:
        """The tensors, once the transfer completed."""
        self._work.wait()
        return self._outputs

    def get_future(self) -> torch.futures.Future[list[Any]]:
        """The transfer's future; asking for it waits for the transfer (torch's C++ waits on futures)."""
        self._work.wait()
        fut: torch.futures.Future[list[Any]] = torch.futures.Future()
        fut.set_result(self._outputs)
        return fut

    def source_rank(self) -> int:
        """The group rank the receive came from (any-source receives)."""
        world_rank = self._work.source_rank()
        return self._ranks.index(world_rank) if world_rank in self._ranks else world_rank

    _source_rank = source_rank


class Running(Pending):
    """A collective queued on mpicomm's communication thread: its future completes when the call has run.

    The engine completes the future on its own thread (DDP's bucket callbacks then run there, as on
    gloo's threads), so torch's C++ side, which waits on futures, never needs ``wait`` to be called.

    Args:
        work: mpicomm's Work of the queued call (:class:`mpicomm.core.engine.EngineWork`).
        outputs: The tensors the future answers.

    Example:
        >>> import torch, mpicomm
        >>> t = torch.ones(2)
        >>> w = Running(mpicomm.all_reduce(t, async_op=True), [t])
        >>> w.wait() and float(w.get_future().wait()[0][0]) == mpicomm.get_world_size()
        True
    """

    def __init__(self, work: Work, outputs: list[Any]) -> None:
        super().__init__(work, outputs, [])
        self._future: torch.futures.Future[list[Any]] = torch.futures.Future()
        then = getattr(work, "then_on_engine", None)
        if then is not None:
            then(self._settle)
        else:  # a Work complete on return (MPICOMM_ENGINE=0, or a rank outside the group); its wait
            # runs what it owes on completion (a 16-bit all_reduce's copy back from its wide twin)
            with contextlib.suppress(Exception):  # the Work keeps its error: _settle hands it on
                work.wait()
            self._settle(work)

    def _settle(self, work: Work) -> None:
        error = work.exception()
        if error is None:
            self._future.set_result(self._outputs)
        else:
            self._future.set_exception(error)  # type: ignore[arg-type]  # the stubs say list[Any]

    def get_future(self) -> torch.futures.Future[list[Any]]:
        """The future torch's C++ side waits on (completed by the communication thread)."""
        return self._future

    def source_rank(self) -> int:
        """-1: a collective has no source."""
        return -1

    _source_rank = source_rank
