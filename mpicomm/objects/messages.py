"""What every object call shares: argument checks agreed across ranks, a list pickled into one message."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core import validation
from ..core.groups import ProcessGroup, resolve
from ..errors import ArgumentError, ArgumentTypeError, MpicommError
from .devbufs import Incoming, Outgoing, own_copy, words
from .pickling import check_device, describe, dumps, error_kind, is_safe_unpickling, loads, place
from .wire import agree, as_bytes, check_header

I8 = np.int64

#: An argument problem found on one rank, raised on every rank through the agreement: (kind, message).
Problem = tuple[int, str] | None


def _start(
    group: ProcessGroup | None, fn: str, device: object, safe: object
) -> tuple[ProcessGroup, Any, bool, Problem]:
    """The group, device and safe flag of a call, and this rank's problem with ``device``/``safe``.

    A bad ``group`` raises at once (no message can be exchanged without it); a bad ``device`` or
    ``safe``, which may be bad on one rank only, is returned to be raised through the agreement.
    """
    g = resolve(group, fn)
    try:
        where = check_device(device, fn)
        if safe is not None and not isinstance(safe, bool):
            raise ArgumentTypeError(
                f"{fn}: safe is {safe!r}; expected True, False or None (the global setting)"
            )
    except (ArgumentError, ArgumentTypeError) as exc:
        return g, None, True, (error_kind(exc), str(exc))
    return g, where, is_safe_unpickling() if safe is None else safe, None


def _list_problem(x: object, fn: str, arg: str, none_ok: bool = False) -> Problem:
    if (x is None and none_ok) or isinstance(x, list):
        return None
    expected = "a list or None" if none_ok else "a list"
    return 4, f"{fn}: {arg} is a {type(x).__qualname__}; expected {expected}"


def _validate(g: ProcessGroup, fn: str, agree: dict[str, Any]) -> None:
    """With validation mode on: check that every rank is in the same call with the same root."""
    if validation._Flag.on:
        validation.check(g, fn, agree)


def _agree(g: ProcessGroup, kind: int, msg: str, fatal: BaseException | None = None) -> None:
    """The status agreement; a rank whose unpickling raised a BaseException re-raises that one."""
    try:
        agree(g, kind, msg)
    except MpicommError:
        if fatal is not None:
            raise fatal from None
        raise


def _pickle(objs: list[Any], fn: str, arg: str, rank: int) -> tuple[int, str, list[bytes], list[list[Any]]]:
    """Pickle each object: (0, "", streams, buffers of each), or (kind, message, [], []) on a failure.

    ``rank`` is this rank's world rank, for the message.
    """
    streams: list[bytes] = []
    buffers: list[list[Any]] = []
    for i, obj in enumerate(objs):
        try:
            stream, bufs = dumps(obj)
        except Exception as exc:
            what = type(obj).__qualname__
            return 2, f"{fn}: {arg}[{i}] (a {what}) cannot be pickled on rank {rank}: {describe(exc)}", [], []
        streams.append(stream)
        buffers.append(bufs)
    return 0, "", streams, buffers


def _unpickle(
    stream: Any, sizes: list[int], buffers: list[Any], safe: bool, device: Any, names: list[str], rank: int
) -> tuple[int, str, list[Any], BaseException | None]:
    """Unpickle consecutive objects of ``sizes`` bytes; ``names[i]`` names object i in a message.

    Returns (kind, message, objects, fatal): ``fatal`` is a ``BaseException`` that is not an
    ``Exception`` (``SystemExit``, ``KeyboardInterrupt`` from a ``__setstate__``), which this rank
    re-raises after the agreement. ``rank`` is this rank's world rank.
    """
    it = iter(buffers)
    out = []
    start = 0
    try:
        for size in sizes:
            out.append(place(loads(stream[start : start + size], it, safe), device))
            start += size
    except BaseException as exc:  # the other ranks must hear of it before it propagates
        msg = f"{names[len(out)]} cannot be unpickled on rank {rank}: {describe(exc)}"
        return error_kind(exc), msg, [], None if isinstance(exc, Exception) else exc
    return 0, "", out, None


def _own_copy(buffers: list[Any]) -> list[Any]:
    """Copies of this rank's own buffers (device ones on the device): never shared with the input."""
    return [own_copy(b) for b in buffers]


def _header(kind: int, streams: list[bytes], buffers: list[Any], stream_size: int) -> np.ndarray:
    return np.array([kind, len(streams), stream_size, len(buffers), *map(len, streams), *words(buffers)], I8)


def _message(kind: int, streams: list[bytes], buffers: list[Any], msg: str) -> tuple[np.ndarray, Any]:
    """The header and the stream to send: the joined pickles, or the error message on failure."""
    if kind:
        text = msg.encode()
        return _header(kind, [], [], len(text)), as_bytes(text)
    stream = streams[0] if len(streams) == 1 else b"".join(streams)
    return _header(0, streams, buffers, len(stream)), as_bytes(stream)


def _pickle_list(objs: Any, fn: str, rank: int, problem: Problem) -> tuple[int, str, list[bytes], list[Any]]:
    """Pickle a list to send (broadcast, send): an argument problem or an empty list is an error.

    Buffers are flattened; ``rank`` is this rank's world rank, for the message.
    """
    if problem is not None:
        return problem[0], problem[1], [], []
    if not objs:
        msg = (
            f"{fn}: object_list is empty on the sending rank {rank}; expected at least one object "
            "(and the same length on the receiving ranks)"
        )
        return 1, msg, [], []
    kind, msg, streams, buffers = _pickle(objs, fn, "object_list", rank)
    return kind, msg, streams, [b for bufs in buffers for b in bufs]


def _ready(
    kind: int, msg: str, streams: list[bytes], buffers: list[Any], fn: str, g: ProcessGroup
) -> tuple[int, str, np.ndarray, Any, Outgoing | None]:
    """(kind, message, header, stream, staged buffers) to send, made before anything is sent.

    The sender checks its own header as the receivers will (a payload past the cap) and stages its
    device buffers (pinned copies, stream synchronised) first: a failure of either is sent in place of
    the objects, so every receiver raises it instead of waiting for buffers that never come.
    """
    header, stream = _message(kind, streams, buffers, msg)
    if kind:
        return kind, msg, header, stream, None
    try:
        check_header(fn, header, g.rank())
    except MpicommError as exc:
        kind, msg = error_kind(exc), str(exc)
    kind, msg, outgoing = _stage(kind, msg, buffers, fn, g.ranks[g.rank()])
    if kind:
        header, stream = _message(kind, [], [], msg)
    return kind, msg, header, stream, outgoing


def _stage(
    kind: int, msg: str, buffers: list[Any], fn: str, rank: int, needed: bool = True
) -> tuple[int, str, Outgoing | None]:
    """This rank's buffers staged to send (see :class:`Outgoing`), or the failure as (kind, message).

    Nothing is staged after a failure, for no buffers or when ``needed`` is false; ``rank`` is this
    rank's world rank, for the message.
    """
    if kind or not buffers or not needed:
        return kind, msg, None
    try:
        return 0, "", Outgoing(buffers)
    except Exception as exc:
        why = describe(exc, where=True)
        return 2, f"{fn}: the device arrays cannot be staged to send on rank {rank}: {why}", None


def _received(incoming: Incoming, fn: str, rank: int) -> tuple[list[Any], int, str]:
    """The received buffers, or a failure to allocate or upload device buffers as (kind, message).

    ``rank`` is this rank's world rank, for the message.
    """
    bufs, exc = incoming.result()
    if exc is None:
        return bufs, 0, ""
    why = describe(exc, where=True)
    return [], 2, f"{fn}: the device arrays sent cannot be received on rank {rank}: {why}"
