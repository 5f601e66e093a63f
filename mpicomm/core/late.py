"""Methods that rooms above core attach to :class:`~mpicomm.ProcessGroup` when a group first needs one.

torch's ``ProcessGroup`` methods (``pg.allreduce([t])``, :mod:`mpicomm.c10d.pg_methods`) import the
front door and the data paths; attaching them at ``import mpicomm`` made every program pay for that
at start-up. ``import mpicomm`` puts a loader on :data:`LOADERS` instead, and the first attribute a
group lacks runs the loaders once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

__all__ = ["LOADERS", "LateMethods"]

#: Loaders that attach methods to ProcessGroup (core may not import the rooms above it).
LOADERS: list[Callable[[], object]] = []


class LateMethods:
    """A base class whose missing attributes run :data:`LOADERS` once, then are looked up again."""

    __slots__ = ()

    if not TYPE_CHECKING:  # mypy keeps checking attribute names

        def __getattr__(self, name: str) -> Any:
            while LOADERS and not name.startswith("__"):
                LOADERS.pop()()
            return object.__getattribute__(self, name)
