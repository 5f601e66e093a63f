"""Methods that rooms above core attach to :class:`~mpicomm.ProcessGroup` when a group first needs one.

torch's ``ProcessGroup`` methods (``pg.allreduce([t])``, :mod:`mpicomm.c10d.pg_methods`) import the
front door and the data paths; attaching them at ``import mpicomm`` made every program pay for that
at start-up. ``import mpicomm`` names them with :func:`later` instead: each name is a placeholder on
:class:`LateMethods` that runs its loader on first use, and the loader puts the real methods on the
group class, where every later lookup finds them first.

Placeholders by name, not a ``__getattr__`` hook: a class with ``__getattr__`` gets no fast attribute
reads from CPython (every ``group.comm`` on the hot paths cost ~300 instructions more on 3.11).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["LateMethods", "later"]


class LateMethods:
    """A base class that holds the placeholders :func:`later` makes."""

    __slots__ = ()


class _Placeholder:
    """One late name: the first read runs the loader, then reads the name again from the class below."""

    __slots__ = ("loader", "name")

    def __init__(self, name: str, loader: Callable[[], object]) -> None:
        self.name, self.loader = name, loader

    def __get__(self, obj: object, cls: type | None = None) -> Any:
        owner = type(obj) if cls is None else cls
        self.loader()
        for klass in owner.__mro__:
            if klass is LateMethods:
                break
            if self.name in vars(klass):  # the loader attached it below the placeholder
                return getattr(owner if obj is None else obj, self.name)
        raise AttributeError(
            f"{owner.__name__!r} object has no attribute {self.name!r} (its loader did not attach it)"
        )


def later(names: Iterable[str], loader: Callable[[], object]) -> None:
    """Let ``loader`` attach ``names`` to the subclasses of :class:`LateMethods` on first use of one.

    Args:
        names: The attribute names the loader sets on a subclass (e.g. ``ProcessGroup``).
        loader: Runs once per first use; must set every name in ``names`` (importing a module that
            does is enough: a second import is free).

    Example:
        >>> from mpicomm.core.late import LateMethods, later
        >>> class Group(LateMethods):
        ...     pass
        >>> later(["greet"], lambda: setattr(Group, "greet", lambda self: "hello"))
        >>> Group().greet()
        'hello'
        >>> del LateMethods.greet  # (the example's placeholder, not kept)
    """
    for name in names:
        setattr(LateMethods, name, _Placeholder(name, loader))
