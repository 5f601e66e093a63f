"""The device front: every public call that takes arrays, made to take cupy arrays too.

:func:`device_aware` wraps a host (numpy) implementation. A call whose arguments hold no cupy array
goes straight through (one cheap test per argument). A call with cupy arrays is checked (all arrays
of one kind, on the current device), then takes one path:

* **direct**: the MPI is CUDA-aware (:func:`~mpicomm.gpu.cuda_aware.cuda_awareness`), the call is
  blocking, and it is a data-movement call with a direct implementation (:mod:`mpicomm.gpu.direct`);
  device pointers go to MPI after the caller's current stream is synchronised.
* **staged**: everything else; through pinned host buffers around the host implementation
  (:mod:`mpicomm.gpu.staged`), or the chunked pipeline for large element-wise reductions
  (:mod:`mpicomm.gpu.pipeline`).

The path each call took is counted in :data:`PATHS` (for tests and ``info``).
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from ..core.arrays import any_device_array, array_kind, is_device_array
from ..core.work import Work, completed
from ..errors import ArgumentTypeError
from .backend import backend
from .cuda_aware import cuda_awareness
from .staged import StagedWork, Staging

__all__ = ["PATHS", "device_aware"]

#: Calls per (function, path) in this process, e.g. ``PATHS["all_reduce", "staged"]``.
PATHS: Counter[tuple[str, str]] = Counter()

F = TypeVar("F", bound=Callable[..., Any])

#: Roles of array arguments: read (copied down), written (copied up), or both.
READ, WRITE, BOTH = "read", "write", "both"


def device_aware(
    roles: dict[str, str],
    direct: Callable[..., Any] | None = None,
    pipelined: Callable[..., Any] | None = None,
    result: Callable[[Any], Any] | None = None,
) -> Callable[[F], F]:
    """Make a host implementation take cupy arrays in the arguments named in ``roles``.

    Args:
        roles: Argument name -> :data:`READ`, :data:`WRITE` or :data:`BOTH`; a list argument's
            arrays all take the role.
        direct: The direct implementation (same signature), for CUDA-aware MPIs and blocking calls;
            it returns ``NotImplemented`` where it cannot serve a call (the call is then staged).
        pipelined: A staged implementation for large messages; returns ``NotImplemented`` to fall
            back to the generic staging.
        result: Maps a host call's returned arrays to device arrays (for calls that allocate).
    """

    def wrap(host: F) -> F:
        sig = inspect.signature(host)
        name = host.__name__

        @functools.wraps(host)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not (any_device_array(args) or (kwargs and any_device_array(kwargs.values()))):
                return host(*args, **kwargs)
            bound = sig.bind(*args, **kwargs)
            _check_kinds(name, bound.arguments, roles)
            blocking = not bound.arguments.get("async_op", False)
            for path, impl in (("direct", direct), ("pipelined", pipelined)):
                if impl is None or (path == "direct" and not (blocking and cuda_awareness().aware)):
                    continue
                done = impl(*bound.args, **bound.kwargs)
                if done is not NotImplemented:
                    PATHS[name, path] += 1
                    return done
            PATHS[name, "staged"] += 1
            return _staged(host, bound, roles, result)

        return call  # type: ignore[return-value]

    return wrap


def _device_arrays(arguments: dict[str, Any], roles: dict[str, str]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for arg in roles:
        value = arguments.get(arg)
        items = value if isinstance(value, (list, tuple)) else [value]
        found.extend((f"{arg}[{i}]" if items is value else arg, x) for i, x in enumerate(items))
    return [(a, x) for a, x in found if x is not None]


def _check_kinds(fn: str, arguments: dict[str, Any], roles: dict[str, str]) -> None:
    """All arrays of a call on one side (host or device), device ones on the current device."""
    arrays = _device_arrays(arguments, roles)
    host = next((a for a, x in arrays if array_kind(x) == "host"), None)
    dev = next((a for a, x in arrays if is_device_array(x)), None)
    if host is not None and dev is not None:
        raise ArgumentTypeError(
            f"{fn}: {dev} is a cupy array and {host} a numpy array; expected the arrays of one call all on "
            "the GPU or all on the host (move one with cupy.asarray or .get())"
        )
    be = backend()
    for arg, x in arrays:
        if is_device_array(x):
            be.check_device(x, fn, arg)


def _staged(
    host: Callable[..., Any], bound: inspect.BoundArguments, roles: dict[str, str], result: Any
) -> Any:
    stage = Staging()
    shown: list[Any] = []
    try:
        for arg, role in roles.items():
            value = bound.arguments.get(arg)
            if value is None:
                continue
            read, write = role in (READ, BOTH), role in (WRITE, BOTH)
            if isinstance(value, (list, tuple)):
                bound.arguments[arg] = [stage.host(x, read, write) for x in value]
                shown.extend(value if write else [])
            else:
                bound.arguments[arg] = stage.host(value, read, write)
                shown.extend([value] if write else [])
        stage.download()
        out = host(*bound.args, **bound.kwargs)
    except BaseException:
        stage.release()
        raise
    if isinstance(out, Work):
        if result is None:
            return StagedWork(out, stage.upload, shown)
        try:  # calls that allocate their outputs finish here, and hand back a completed Work
            out.wait()
        finally:
            stage.upload()
        return completed(list(result(out.result())))
    stage.upload()
    return result(out) if result is not None and out is not None else out
