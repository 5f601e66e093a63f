"""What the front door's wrappers call besides the host: numpy tests, torch views, the answer.

The wrappers (:mod:`mpicomm.front._doors`, made by :mod:`mpicomm.front.gen_doors`) and the slow path
of :mod:`mpicomm.front.door` share these.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..core.work import Work
from . import kinds

__all__ = ["PLAIN_SCALAR", "VIEWS", "VIEW_ENTRIES", "all_numpy", "answer", "kept_view", "numpy_like"]

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


def numpy_like(value: Any) -> bool:
    """Whether the wrapper passes ``value`` to the host as it is (its type is not ``np.ndarray``).

    A kind served as it is (``None``, a number), or a list or tuple of numpy arrays only; the
    wrappers test ``type(value) is np.ndarray`` themselves first, the common case.
    """
    kind = _KINDS.get(type(value))
    return kind in PLAIN_SCALAR or (kind is kinds.LIST and all_numpy(value))


def all_numpy(value: Any) -> bool:
    """Whether ``value`` is a list or tuple of numpy arrays only (the list forms' fast path)."""
    if _KINDS.get(type(value)) is not kinds.LIST:
        return False
    for v in value:  # noqa: SIM110 (a plain loop: a generator costs more than the short list it checks)
        if type(v) is not np.ndarray:
            return False
    return True


def kept_view(t: Any) -> np.ndarray:
    """The CPU tensor ``t``'s numpy view: the kept one while ``t`` is unchanged, else a new one, kept.

    Raises TypeError or RuntimeError where torch refuses the view (the wrapper then takes the slow
    path, which names the argument).
    """
    e = VIEWS.get(id(t))
    if (
        e is not None
        and t.data_ptr() == e[2]
        and t.shape == e[3]
        and t.stride() == e[4]
        and t.dtype is e[5]
        and t.untyped_storage().nbytes() == e[6]
    ):
        view: np.ndarray = e[1]
        return view
    return _torch_numpy(t)


def _torch_numpy(t: Any) -> np.ndarray:
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
