"""The torch backend's calls in torch's profiler: ``mpicomm:all_reduce`` with its sizes, as gloo's show.

:func:`label_methods` runs once, at the import of the backend: while torch's profiler runs, each c10d
method of the backend's process group runs inside a profiler event ``mpicomm:<call>`` whose inputs are
its tensors and its bytes (their shapes show with ``record_shapes=True``). The labelled methods are
put in place when the profiler starts and the plain ones back when it stops, so that without a
profiler the methods are the plain ones and a call costs nothing more.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = ["LABELS", "label_methods", "tensors"]

#: c10d's method name -> the call name the profiler shows (torch.distributed's names, as gloo's).
LABELS = {
    "allreduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "reduce": "reduce",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor_coalesced",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "broadcast": "broadcast",
    "allgather": "all_gather",
    "allgather_coalesced": "all_gather_coalesced",
    "all_gather_single": "all_gather_into_tensor",
    "_allgather_base": "all_gather_into_tensor",
    "all_gather_single_coalesced": "all_gather_into_tensor_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "gather": "gather",
    "scatter": "scatter",
    "all_to_all_single": "all_to_all_single",
    "alltoall_base": "all_to_all_single",
    "alltoall": "all_to_all",
    "barrier": "barrier",
    "send": "send",
    "recv": "recv",
    "recv_anysource": "recv_anysource",
}


def tensors(args: tuple[Any, ...]) -> list[Any]:
    """The tensors among a call's arguments (in lists too), in order.

    Example:
        >>> import torch
        >>> [tuple(t.shape) for t in tensors(([torch.zeros(2, 3)], None, torch.ones(1)))]
        [(2, 3), (1,)]
    """
    found: list[Any] = []
    for x in args:
        if isinstance(x, (list, tuple)):
            found += tensors(tuple(x))
        elif hasattr(x, "shape") and hasattr(x, "element_size"):
            found.append(x)
    return found


def label_methods(cls: type) -> None:
    """Name each method of :data:`LABELS` that ``cls`` defines in torch's profiler, while one runs.

    The labelled methods are put in place when torch's profiler starts and the plain ones back when it
    stops (torch's Python profiler calls ``_run_on_profiler_start``/``_stop`` of
    ``torch.autograd.profiler``, which are chained here), so that a call without a profiler costs
    nothing more. Where a torch lacks those two, each call reads the profiler's flag instead.
    """
    import torch.autograd.profiler as prof

    plain = {m: f for m in LABELS if callable(f := cls.__dict__.get(m))}
    labelled = {m: _labelled(f, f"mpicomm:{LABELS[m]}") for m, f in plain.items()}
    start, stop = getattr(prof, "_run_on_profiler_start", None), getattr(prof, "_run_on_profiler_stop", None)
    if start is None or stop is None:
        for m, f in plain.items():
            setattr(cls, m, _checked(f, labelled[m], prof))
        return

    def on_start() -> None:
        start()
        _put(cls, labelled)

    def on_stop() -> None:
        stop()
        _put(cls, plain)

    prof._run_on_profiler_start, prof._run_on_profiler_stop = on_start, on_stop
    if prof._is_profiler_enabled:
        _put(cls, labelled)


def _put(cls: type, methods: dict[str, Callable[..., Any]]) -> None:
    for m, f in methods.items():
        setattr(cls, m, f)


def _labelled(f: Callable[..., Any], label: str) -> Callable[..., Any]:
    """``f`` inside a profiler event named ``label`` whose inputs are the call's tensors and its bytes.

    The tensors are the event's inputs, as torch records an operator's: with ``record_shapes=True``
    their shapes and dtypes show in the trace (``Input Dims``), as gloo's collectives' do.
    """
    from torch._C._autograd import _record_function_with_args_enter as enter
    from torch._C._autograd import _record_function_with_args_exit as leave

    @functools.wraps(f)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        found = tensors(args)
        handle = enter(label, *found, sum(t.numel() * t.element_size() for t in found))
        try:
            return f(self, *args, **kwargs)
        finally:
            leave(handle)

    method.__mpicomm_plain__ = f  # type: ignore[attr-defined]
    return method


def _checked(f: Callable[..., Any], labelled: Callable[..., Any], prof: Any) -> Callable[..., Any]:
    @functools.wraps(f)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not prof._is_profiler_enabled:  # one module attribute read when no profiler runs
            return f(self, *args, **kwargs)
        return labelled(self, *args, **kwargs)

    return method
