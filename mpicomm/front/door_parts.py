"""What the front door's wrappers call besides the host: list tests, torch views, the answer.

The wrappers (:mod:`mpicomm.front._doors`, made by :mod:`mpicomm.front.gen_doors`) and the slow path
of :mod:`mpicomm.front.door` share these. A wrapper tests a kept view's five facts (below) inline:
a call costs ~0.1 us more through a function.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.work import Work
from . import kinds

__all__ = ["PLAIN_SCALAR", "VIEWS", "VIEW_ENTRIES", "all_numpy", "answer", "torch_numpy"]

_KINDS = kinds._KINDS
PLAIN_SCALAR = frozenset((kinds.NUMPY, kinds.OTHER))

#: CPU tensors' numpy views (by address, :func:`mpicomm.front.kinds.cpu_view`: the storage stays
#: resizable), by the tensor's id, with the pointer, shape, strides, dtype and storage size they were
#: made for: a hit costs ~0.4 us where making the view costs ~0.6 us with warm caches, and several
#: times that after a >= 1 MiB transfer has emptied L1 and L2 (docs/benchmarks.rst, "torch tensors
#: with cold caches"). An entry holds its tensor weakly and leaves when the tensor dies, so no other
#: tensor can be served it under a reused id and no dead tensor's memory is held; at most 8 entries
#: are kept. Any change of the tensor's memory or layout (``resize_``, ``set_``, ``transpose_``,
#: ``.data =``, ``untyped_storage().resize_``) changes one of the five, and the view is made again.
VIEWS: dict[int, tuple[Any, ...]] = {}
VIEW_ENTRIES = 8


def all_numpy(value: Any) -> bool:
    """Whether ``value`` is a list or tuple of numpy arrays only (the list forms' fast path)."""
    if _KINDS.get(type(value)) is not kinds.LIST:
        return False
    for v in value:  # noqa: SIM110 (a plain loop: a generator costs more than the short list it checks)
        if type(v) is not np.ndarray:
            return False
    return True


def torch_numpy(t: Any) -> np.ndarray:
    """``t``'s numpy view by address (TypeError or RuntimeError where refused), kept in :data:`VIEWS`."""
    view = kinds.cpu_view(t, keep=False)  # the entry holds the tensor weakly: so must the view
    facts = (t.data_ptr(), t.shape, t.stride(), t.dtype, t.untyped_storage().nbytes())
    kinds.keep_view(VIEWS, VIEW_ENTRIES, t, view, *facts)
    return view


def answer(out: Any, seen: dict[int, Any], model: Any) -> Any:
    """``out`` with the views replaced by the caller's arrays and new arrays in ``model``'s kind."""
    if isinstance(out, Work):
        if not out._done:  # the views need not hold the caller's arrays (the kept ones do not): the Work does
            out._keep = (out._keep, list(seen.values()))
        for attr in ("_result", "_shown"):  # a staged Work shows the device arrays it wrote
            if hasattr(out, attr):
                setattr(out, attr, _mapped(getattr(out, attr), seen, model))
        return out
    if model is None or out is None:
        return out
    return _mapped(out, seen, model)


def _mapped(value: Any, seen: dict[int, Any], model: Any) -> Any:
    if isinstance(value, list):
        return [_mapped(v, seen, model) for v in value]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named result such as JaggedResult
        return type(value)(*(_mapped(v, seen, model) for v in value))
    original = seen.get(id(value))
    if original is not None:
        return original
    if model is not None and kinds.kind_of(value) in (kinds.NUMPY, kinds.CUPY):
        return kinds.like(value, model)
    return value
