"""The device side of the front door: a call with device arrays takes the direct or the staged path.

A call whose arguments hold device arrays (cupy arrays, or torch CUDA tensors and other device
objects already viewed as the GPU backend's arrays by :mod:`mpicomm.front.kinds`) is checked (all
arrays on one side, device ones on the current device), then takes one path:

* **direct**: the MPI is CUDA-aware (:func:`~mpicomm.gpu.cuda_aware.cuda_awareness`), the call is
  blocking, and it is a data-movement call with a direct implementation (``mpicomm.gpu.direct``);
  device pointers go to MPI after the caller's current stream is synchronised.
* **staged**: everything else; through pinned host buffers around the host implementation
  (``mpicomm.gpu.staged``), or the chunked pipeline for large element-wise reductions
  (``mpicomm.gpu.pipeline``).

The path each call took is counted in :data:`PATHS` (for tests and ``info``).
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from ..core.work import Work, completed
from ..errors import ArgumentTypeError
from ..gpu.backend import backend
from ..gpu.cuda_aware import cuda_awareness
from ..gpu.staged import StagedWork, Staging
from . import kinds

__all__ = ["BOTH", "PATHS", "READ", "WRITE", "on_device"]

#: Calls per (function, path) in this process, e.g. ``PATHS["all_reduce", "staged"]``.
PATHS: Counter[tuple[str, str]] = Counter()

#: Roles of array arguments: read (input), written (output), or both (the front door names them).
READ, WRITE, BOTH = "read", "write", "both"


def on_device(
    fn: str,
    host: Callable[..., Any],
    bound: inspect.BoundArguments,
    roles: dict[str, str],
    direct: Callable[..., Any] | None,
    pipelined: Callable[..., Any] | None,
    returns: str | None,
) -> Any:
    """Run ``fn`` on the device arrays in ``bound`` by the first path that serves it (see the module).

    Args:
        fn: The public name.
        host: The host implementation.
        bound: The call's arguments, device arrays as the backend's arrays.
        roles: Argument name -> role (``read``, ``write``, ``both``).
        direct: The direct implementation, or None.
        pipelined: The pipelined implementation, or None.
        returns: Whether (the argument whose kind) the call allocates arrays: they are made device arrays.

    Returns:
        What the host implementation returns, with allocated arrays on the device.

    Raises:
        ArgumentTypeError: host and device arrays mixed in one call.
        ArgumentError: a device array on another device than the current one.
    """
    _check_sides(fn, bound.arguments, roles)
    blocking = not bound.arguments.get("async_op", False)
    for path, impl in (("direct", direct), ("pipelined", pipelined)):
        if impl is None or (path == "direct" and not (blocking and cuda_awareness().aware)):
            continue
        done = impl(*bound.args, **bound.kwargs)
        if done is not NotImplemented:
            PATHS[fn, path] += 1
            return done
    PATHS[fn, "staged"] += 1
    return _staged(host, bound, roles, returns is not None)


def _arrays(arguments: dict[str, Any], roles: dict[str, str]) -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    for arg in roles:
        value = arguments.get(arg)
        items = value if isinstance(value, (list, tuple)) else [value]
        found.extend((f"{arg}[{i}]" if items is value else arg, x) for i, x in enumerate(items))
    return [(a, x) for a, x in found if x is not None]


def _check_sides(fn: str, arguments: dict[str, Any], roles: dict[str, str]) -> None:
    """All arrays of a call on one side (host or device), device ones on the current device."""
    arrays = _arrays(arguments, roles)
    host = next((a for a, x in arrays if isinstance(x, np.ndarray)), None)
    dev = next((a for a, x in arrays if kinds.kind_of(x) == kinds.CUPY), None)
    if host is not None and dev is not None:
        raise ArgumentTypeError(
            f"{fn}: {dev} is a device array and {host} a host array; expected the arrays of one call all on "
            "the GPU or all on the host (move one with cupy.asarray / .get(), or tensor.cuda() / .cpu())"
        )
    be = backend()
    for arg, x in arrays:
        if kinds.kind_of(x) == kinds.CUPY:
            be.check_device(x, fn, arg)


def _on_device(res: Any) -> Any:
    """A host result's arrays as device arrays (other fields, such as a list of splits, stay)."""
    be = backend()
    if isinstance(res, tuple) and hasattr(res, "_fields"):
        return type(res)(*(be.asarray(v) if isinstance(v, np.ndarray) else v for v in res))
    return [be.asarray(v) if isinstance(v, np.ndarray) else v for v in res]


def _staged(
    host: Callable[..., Any], bound: inspect.BoundArguments, roles: dict[str, str], allocates: bool
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
        if not allocates:
            return StagedWork(out, stage.upload, shown)
        try:  # calls that allocate their outputs finish here, and hand back a completed Work
            out.wait()
        finally:
            stage.upload()
        return completed(list(_on_device(out.result())))
    stage.upload()
    return _on_device(out) if allocates and out is not None else out
