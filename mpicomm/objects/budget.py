"""The work budget of one safe-mode stream: what loading it may cost, bounded by its size in bytes.

A pickle of a few hundred bytes can ask for far more work than its size, with nothing but allowed
classes: ``list(range(2**20))`` called 400 times, ``str()`` of a list that holds the same list
twice per level through memo references (2**40 items to print from 40 levels), a tuple key nested
so deep that hashing it overflows the C stack. Safe mode gives every stream a budget of
:data:`UNITS_PER_BYTE` units per byte received plus :data:`MIN_UNITS` (a unit is about one Python
object made, visited or hashed), charges every call of an allowed class and every hash of a
container key before it runs, and measures the loaded object before handing it over:

* a call is charged the items it would make or visit (``len`` of a ``range``, ``str`` or ``bytes``
  argument, ``bytes(n) / 8``, the expanded size of a container argument);
* a tuple or frozenset used as a dict key or set member is charged its expanded size;
* the result (and every container argument of a call) is walked once per distinct container: it
  is refused if it holds itself (a cycle, which the object's own ``repr``, ``==`` or ``copy`` may
  follow), is nested more than :data:`MAX_DEPTH` deep, or would expand (every shared reference
  counted each time, as ``str()``, ``==`` or ``json.dumps`` count it) past the budget.

So loading a stream costs time and memory within a small constant times its bytes, and so does
printing or comparing what it loaded.
"""

from __future__ import annotations

import datetime
from collections import deque
from collections.abc import Collection, Iterable
from typing import Any

import numpy as np

from ..errors import UnpicklingRefusedError

__all__ = ["MAX_DEPTH", "MIN_UNITS", "UNITS_PER_BYTE", "Budget", "brief", "measure"]

#: Work units a stream may spend per byte received.
UNITS_PER_BYTE = 32
#: Work units every stream may spend, however short.
MIN_UNITS = 1 << 17
#: Deepest nesting of containers a safe-mode object may have (the sender's pickler recurses per
#: level, so streams it writes stay far below).
MAX_DEPTH = 10_000

#: Types that hold no other object (their repr and hash cost at most their length).
_LEAVES = frozenset(
    {int, float, complex, bool, type(None), str, bytes, bytearray, range, np.ndarray, type(Ellipsis)}
    | {datetime.date, datetime.datetime, datetime.time, datetime.timedelta, datetime.timezone}
)
_SIZED = (str, bytes, bytearray)


def refuse(what: str) -> UnpicklingRefusedError:
    """The error safe mode raises for ``what``."""
    return UnpicklingRefusedError(f"safe mode refused to unpickle {what}")


def brief(value: object) -> str:
    """A short description of a value from the stream, for messages (never its full ``repr``).

    Example:
        >>> brief("x" * 100), brief([1, 2]), brief(12)
        ("'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... (100 characters)", 'a list', '12')
    """
    if isinstance(value, int) and value.bit_length() > 128:  # repr of a huge int is slow, even refused
        return f"an int of {value.bit_length()} bits"
    if isinstance(value, (int, float, bool, type(None))) and not isinstance(value, np.generic):
        return repr(value)
    if isinstance(value, _SIZED):
        unit = "characters" if isinstance(value, str) else "bytes"
        text = repr(value[:40])
        return text if len(value) <= 40 else f"{text}... ({len(value)} {unit})"
    if isinstance(value, type):
        return f"the class {value.__module__}.{value.__qualname__}"
    return f"a {type(value).__qualname__}"


class Budget:
    """The units one stream may still spend (see the module docstring)."""

    __slots__ = ("left", "total")

    def __init__(self, size: int) -> None:
        self.total = self.left = MIN_UNITS + UNITS_PER_BYTE * size

    def spend(self, units: int, what: str) -> None:
        """Take ``units`` from the budget.

        Raises:
            UnpicklingRefusedError: the budget is spent.
        """
        self.left -= units
        if self.left < 0:
            raise refuse(
                f"{what}: it asks for {units} more units of work, past the stream's budget of "
                f"{self.total} ({UNITS_PER_BYTE} per byte received, at least {MIN_UNITS}): an "
                "amplifying stream (shared references, ranges, repeated calls)"
            )

    def charge_call(self, name: str, cls: type, args: Iterable[Any]) -> None:
        """Charge a call of the allowed class ``cls`` the items it makes or visits, before it runs."""
        for a in args:
            if type(a) in _LEAVES:
                if isinstance(a, (range, *_SIZED)):
                    self.spend(len(a), f"a call of {name} over {brief(a)}")
                elif isinstance(a, int) and cls in (bytes, bytearray) and a > 0:
                    self.spend(a // 8, f"a call of {name}({a})")
            else:
                self.spend(measure(a, self.left, f"an argument of {name}"), f"a call of {name}")

    def charge_key(self, key: object, what: str) -> None:
        """Charge hashing ``key`` (a dict key or set member): its expanded size if it is a container."""
        if isinstance(key, (tuple, frozenset)):
            self.spend(measure(key, self.left, what), what)


def _children(x: Any) -> Collection[Any] | None:
    """The objects ``x`` refers to that ``repr``/``==``/``hash`` follow; None for a leaf."""
    kind = type(x)
    if kind in _LEAVES:
        return None
    if isinstance(x, (list, tuple, set, frozenset, deque)):
        return x
    if isinstance(x, dict):
        return [*x.keys(), *x.values()]
    if isinstance(x, slice):
        return (x.start, x.stop, x.step)
    if isinstance(x, (np.ndarray, np.generic, np.dtype, type)):
        return None
    state = getattr(x, "__dict__", None)
    return (state,) if isinstance(state, dict) and state else None


def measure(root: object, limit: int, what: str) -> int:
    """The expanded size of ``root``: its objects, shared references counted each time.

    Each distinct container is entered once, however often it is shared, and each reference looked
    at once, so this costs time linear in the containers and references, not in the expanded size.

    Args:
        root: The object.
        limit: The largest expanded size accepted.
        what: What ``root`` is, for messages.

    Returns:
        The expanded size (at most ``limit``).

    Raises:
        UnpicklingRefusedError: ``root`` holds itself, is nested over :data:`MAX_DEPTH` deep, or
            expands past ``limit``.

    Example:
        >>> a = [1, 2]; b = [a, a]; measure([b, b], 100, "x")  # 1 + 2 * (1 + 2 * (1 + 2))
        15
    """
    if _children(root) is None:
        return 1
    sizes: dict[int, int] = {}
    heights: dict[int, int] = {}
    open_ = -1  # entered, not yet left: an ancestor of the object being entered
    # (object, its container children, the units of its leaves, its depth); None children: not entered
    todo: list[tuple[Any, list[Any] | None, int, int]] = [(root, None, 0, 1)]
    while todo:
        node, inner, units, depth = todo.pop()
        key = id(node)
        if inner is not None:  # leaving: every container child is measured by now
            size = units + sum([sizes[id(k)] for k in inner])
            height = 1 + max([heights[id(k)] for k in inner], default=0)
            if height > MAX_DEPTH:
                raise refuse(f"{what}: containers nested over {MAX_DEPTH} deep")
            if size > limit:
                raise refuse(
                    f"{what}: an object that expands to more than {limit} items (shared references "
                    "counted each time, as str(), == and copies count them)"
                )
            sizes[key], heights[key] = size, height
            continue
        if key in sizes:
            continue
        if depth > MAX_DEPTH:
            raise refuse(f"{what}: containers nested over {MAX_DEPTH} deep")
        sizes[key] = open_
        kids = _children(node) or ()
        units, inner = 1 + len(kids), []
        if not set(map(type, kids)) <= _LEAVES:  # the common case, a container of leaves, at C speed
            for k in kids:
                if type(k) in _LEAVES:
                    continue
                grand = _children(k)
                if grand is None:
                    continue
                kk = id(k)
                if kk not in sizes and set(map(type, grand)) <= _LEAVES:  # a container of leaves
                    sizes[kk], heights[kk] = 1 + len(grand), 1
                elif sizes.get(kk) == open_:
                    raise refuse(f"{what}: an object that holds itself (a cycle of references)")
                inner.append(k)
            units -= len(inner)
        todo.append((node, inner, units, depth))
        todo.extend([(k, None, 0, depth + 1) for k in inner if id(k) not in sizes])
    return sizes[id(root)]
