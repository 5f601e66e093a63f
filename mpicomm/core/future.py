"""``Future``: torch's ``Work.get_future()`` result, with ``wait``, ``value``, ``done`` and ``then``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .work import Work

__all__ = ["Future"]


class Future:
    """The value a :class:`~mpicomm.Work` ends with, as ``torch.futures.Future`` offers it.

    The value of a collective's future is the list of its output arrays (the caller's own arrays,
    written in place), as in torch. MPI makes progress only when a rank calls into it, so a callback
    given to :meth:`then` runs when this future is first waited on or found done on this rank (torch
    runs it on a backend thread as soon as the work completes); its result is the same.

    Example:
        >>> import numpy as np, mpicomm
        >>> x = np.ones(2)
        >>> fut = mpicomm.init().allreduce([x]).get_future()
        >>> doubled = fut.then(lambda f: [t * 2 for t in f.value()])
        >>> bool((doubled.wait()[0] == 2 * mpicomm.get_world_size()).all())
        True
    """

    __slots__ = ("_callback", "_done", "_error", "_parent", "_value", "_work")

    def __init__(
        self,
        work: Work | None = None,
        parent: Future | None = None,
        callback: Callable[[Future], Any] | None = None,
    ) -> None:
        self._work = work
        self._parent = parent
        self._callback = callback
        self._done = work is None and parent is None
        self._value: Any = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        """Whether the value is ready (never blocks; runs a :meth:`then` callback that can now run)."""
        if not self._done:
            if self._work is not None and not self._work.is_completed():
                return False
            if self._parent is not None and not self._parent.done():
                return False
            self._settle()
        return True

    def wait(self) -> Any:
        """Block until the value is ready and return it.

        Raises:
            Exception: the error the work or a :meth:`then` callback ended with.
        """
        if not self._done:
            if self._work is not None:
                try:
                    self._work.wait()
                except Exception as exc:
                    self._error = exc
            elif self._parent is not None:
                self._parent._settled()
            self._settle()
        if self._error is not None:
            raise self._error
        return self._value

    def value(self) -> Any:
        """The value (waits for it first, where torch requires the future to be done already)."""
        return self.wait()

    def then(self, callback: Callable[[Future], Any]) -> Future:
        """A new future whose value is ``callback(self)``, run once this one is done.

        Args:
            callback: Takes this (completed) future and returns the new value.

        Returns:
            The new future.

        Example:
            >>> import numpy as np, mpicomm
            >>> fut = mpicomm.init().allreduce([np.ones(1)]).get_future()
            >>> float(fut.then(lambda f: f.value()[0][0]).wait()) == mpicomm.get_world_size()
            True
        """
        return Future(parent=self, callback=callback)

    def set_result(self, result: Any) -> None:
        """Complete a future made with ``Future()`` (torch's ``set_result``)."""
        self._value, self._done = result, True

    def _settled(self) -> None:
        """Wait without raising: a failed parent hands its error to its children through _settle."""
        with contextlib.suppress(Exception):
            self.wait()

    def _settle(self) -> None:
        if self._done:
            return
        self._done = True
        if self._work is not None:
            if self._error is None:
                self._error = self._work.exception()
            if self._error is None:
                self._value = self._work._result
            return
        parent = self._parent
        if parent is None or self._callback is None:
            return
        if parent._error is not None:
            self._error = parent._error
            return
        try:
            self._value = self._callback(parent)
        except Exception as exc:
            self._error = exc

    def __repr__(self) -> str:
        return f"<mpicomm.Future {'done' if self._done else 'pending'}>"
