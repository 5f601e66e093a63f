"""Slurm hostlists (``gpu[01-04,07],login1``) and task counts (``4(x2),3``), expanded."""

from __future__ import annotations

import re

from ..errors import ArgumentError, ArgumentTypeError

__all__ = ["expand_hostlist", "expand_tasks_per_node"]

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def _split_top(text: str, fn: str) -> list[str]:
    """Split at commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ArgumentError(
                    f"{fn}: hostlist {text!r} has nested brackets at {i}; expected name[ranges]"
                )
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ArgumentError(f"{fn}: hostlist {text!r} has an unmatched ']' at {i}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ArgumentError(f"{fn}: hostlist {text!r} has an unmatched '['")
    parts.append(text[start:])
    return parts


def _expand_ranges(body: str, text: str, fn: str) -> list[str]:
    """``01-04,07`` -> ``['01', '02', '03', '04', '07']``; the width of the lower bound pads every number."""
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise ArgumentError(
                f"{fn}: hostlist {text!r} has the range {item!r}; expected N or N-M with digits"
            )
        lo_text, hi_text = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise ArgumentError(f"{fn}: hostlist {text!r} has the range {item!r} that runs backwards")
        width = len(lo_text)
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def _expand_one(item: str, text: str, fn: str) -> list[str]:
    """Expand every bracket group of one host pattern, leftmost group outermost."""
    names = [""]
    rest = item
    while rest:
        open_at = rest.find("[")
        if open_at < 0:
            names = [n + rest for n in names]
            break
        close_at = rest.index("]", open_at)
        prefix, body = rest[:open_at], rest[open_at + 1 : close_at]
        names = [n + prefix + r for n in names for r in _expand_ranges(body, text, fn)]
        rest = rest[close_at + 1 :]
    return names


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a Slurm hostlist into node names, in order (as ``scontrol show hostnames`` does).

    Ranges keep the zero padding of their lower bound; a name may have several bracket groups.

    Args:
        hostlist: e.g. ``"gpu[01-04,07],login1"`` or ``"rack[1-2]-n[1-2]"``.

    Returns:
        The node names.

    Raises:
        ArgumentTypeError: ``hostlist`` is not a string.
        ArgumentError: unbalanced or nested brackets, an empty name, a malformed or backwards range.

    Example:
        >>> expand_hostlist("gpu[01-04,07],login1")
        ['gpu01', 'gpu02', 'gpu03', 'gpu04', 'gpu07', 'login1']
        >>> expand_hostlist("r[1-2]-n[8-9]")
        ['r1-n8', 'r1-n9', 'r2-n8', 'r2-n9']
    """
    fn = "expand_hostlist"
    if not isinstance(hostlist, str):
        raise ArgumentTypeError(f"{fn}: hostlist is {type(hostlist).__name__}; expected a string")
    text = hostlist.strip()
    if not text:
        raise ArgumentError(f"{fn}: hostlist is empty; expected at least one node name")
    out: list[str] = []
    for item in _split_top(text, fn):
        item = item.strip()
        if not item:
            raise ArgumentError(f"{fn}: hostlist {text!r} has an empty name; expected names between commas")
        out.extend(_expand_one(item, text, fn))
    return out


def expand_tasks_per_node(value: str) -> list[int]:
    """Expand Slurm's ``SLURM_TASKS_PER_NODE`` syntax into one count per node.

    Args:
        value: e.g. ``"4(x2)"``, ``"2(x3),1"`` or ``"8"``.

    Returns:
        The task count of each node, in node order.

    Raises:
        ArgumentError: the text does not follow that syntax.

    Example:
        >>> expand_tasks_per_node("4(x2),3")
        [4, 4, 3]
    """
    out: list[int] = []
    for item in str(value).split(","):
        m = _TASKS.match(item.strip())
        if not m:
            raise ArgumentError(
                f"expand_tasks_per_node: value {value!r} has the item {item!r}; expected N or N(xM)"
            )
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out
