"""The coalesced collectives (``all_reduce_coalesced``, ``all_gather_coalesced``): one MPI call, many arrays.

Both pack the caller's arrays into one contiguous buffer, make one MPI call on it and unpack into the
caller's arrays, as torch's Gloo backend does. The host (numpy) implementations; the public calls
are these behind the front door (:mod:`mpicomm.front.coalesced`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..core import validation
from ..core.buffers import check_array, check_array_list, check_output, message
from ..core.groups import ProcessGroup, resolve, warn_non_member
from ..core.reduce_op import ReduceOp
from ..core.work import Work, completed
from ..errors import ArgumentError, DtypeMismatchError
from . import reductions

__all__ = ["all_gather_coalesced", "all_reduce_coalesced"]


def _real(dtype: Any) -> np.dtype[Any]:
    """The real dtype a complex dtype is made of (``complex64 -> float32``); other dtypes as they are."""
    d = np.dtype(dtype)
    return np.empty(0, d).real.dtype if d.kind == "c" else d


def _arrays(xs: object, fn: str, arg: str, output: bool) -> list[np.ndarray]:
    """``xs`` checked as a list of arrays of one dtype (a complex dtype mixes with its real one).

    As in torch, ``complex64`` mixes with ``float32``; another mix raises ValueError, as torch's does.
    """
    if isinstance(xs, np.ndarray):
        xs = [xs]
    if not isinstance(xs, (list, tuple)):
        return check_array_list(xs, fn, arg, None, output)
    check = check_output if output else check_array
    arrays = [check(x, fn, f"{arg}[{i}]") for i, x in enumerate(xs)]
    for i, a in enumerate(arrays):
        if _real(a.dtype) != _real(arrays[0].dtype):
            raise DtypeMismatchError(
                f"{fn}: {arg}[{i}] has dtype {a.dtype}; expected {arrays[0].dtype}, the dtype of {arg}[0] "
                "(the arrays of one call share a dtype; a complex dtype mixes with its real one)"
            )
    return arrays


def _reals(a: np.ndarray) -> int:
    """How many real elements ``a`` holds (two per complex element)."""
    return a.size * (2 if a.dtype.kind == "c" else 1)


def _pack(arrays: Sequence[np.ndarray], dtype: np.dtype[Any]) -> np.ndarray:
    """The arrays' elements in one contiguous buffer of the real ``dtype`` (complex as pairs)."""
    if not arrays:
        return np.empty(0, dtype)
    return np.concatenate([np.ascontiguousarray(a).reshape(-1).view(dtype) for a in arrays])


def _unpack(flat: np.ndarray, arrays: Sequence[np.ndarray]) -> None:
    offset = 0
    for a in arrays:
        n = _reals(a)
        a[...] = flat[offset : offset + n].view(a.dtype).reshape(a.shape)
        offset += n


def _then(inner: Work | None, keep: Any, result: list[Any], finish: Callable[[], None], fn: str) -> Work:
    """A Work of the call ``fn`` that completes ``inner`` (None: nothing was sent), then runs ``finish``."""
    if inner is None:
        finish()
        return completed(result)

    def done() -> None:
        inner._complete()
        if inner.exception() is not None:
            raise inner.exception()  # type: ignore[misc]
        finish()

    return Work(inner._requests, keep=(inner, keep), result=result, finish=done, fn=fn)


def all_reduce_coalesced(
    tensors: list[np.ndarray] | np.ndarray,
    op: ReduceOp = ReduceOp.SUM,
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Work | None:
    """Reduce every array of ``tensors`` over the group in one MPI call; each gets the result in place.

    The host side of :func:`mpicomm.all_reduce_coalesced` (its docstring has the rank table).

    Args:
        tensors: Arrays of one dtype (or one array), any shapes, the same list on every rank.
        op: The reduction (see :class:`~mpicomm.ReduceOp`).
        group: The process group; ``None`` for the world.
        async_op: Return a Work at once; the call runs on mpicomm's communication thread
            (the same MPI call as a blocking one, so ranks may differ in ``async_op``;
            docs/sharp-bits).

    Returns:
        A Work if ``async_op``, else None.

    Raises:
        ArgumentTypeError: an entry is not an array.
        ArgumentError: the arrays have different dtypes (a ValueError, as torch's), or one is read-only.
        ReductionTypeError: ``op`` is not defined on the dtype (also a ValueError, as torch raises for
            MAX on complex tensors).

    Example:
        >>> import numpy as np, mpicomm
        >>> a, b = np.ones(2), np.full(3, 2.0)
        >>> mpicomm.all_reduce_coalesced([a, b])
        >>> float(b[0]) == 2.0 * mpicomm.get_world_size()
        True
    """
    fn = "all_reduce_coalesced"
    g = resolve(group, fn)
    arrays = _arrays(tensors, fn, "tensors", output=True)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    dtypes = {a.dtype for a in arrays}
    if type(op) is ReduceOp:
        for d in sorted(dtypes, key=lambda d: d.kind != "c"):  # a complex dtype first, for its message
            op.check(d, fn)
    packed = _pack(arrays, _real(arrays[0].dtype) if arrays else np.dtype(np.float32))
    inner = reductions.all_reduce(packed, op, g, async_op) if packed.size else None
    if async_op:
        return _then(inner, packed, list(arrays), lambda: _unpack(packed, arrays), fn)
    _unpack(packed, arrays)
    return None


def all_gather_coalesced(
    output_tensors: list[np.ndarray],
    input_tensor_list: list[np.ndarray],
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Work | None:
    """Gather every rank's ``input_tensor_list`` into ``output_tensors`` in one MPI call.

    ``output_tensors`` is torch's ``output_tensor_lists`` flattened rank by rank: entry
    ``r * k + i`` receives rank ``r``'s ``input_tensor_list[i]`` (``k`` inputs per rank).

    ======  ==================  ====================================
    rank    input_tensor_list   output_tensors (every rank)
    ======  ==================  ====================================
    0       [[1, 1], [2]]       [[1, 1], [2], [3, 3], [5]]
    1       [[3, 3], [5]]       [[1, 1], [2], [3, 3], [5]]
    ======  ==================  ====================================

    Args:
        output_tensors: ``W * k`` writeable arrays, entry ``r * k + i`` the size of input ``i``.
        input_tensor_list: ``k`` arrays of one dtype, the same sizes on every rank.
        group: The process group; ``None`` for the world.
        async_op: Return a Work at once; the call runs on mpicomm's communication thread
            (the same MPI call as a blocking one, so ranks may differ in ``async_op``;
            docs/sharp-bits).

    Returns:
        A Work if ``async_op``, else None.

    Raises:
        ArgumentTypeError: an entry is not an array, or outputs and inputs differ in dtype.
        ArgumentError: a wrong number or size of outputs, or mixed dtypes among the inputs.

    Example:
        >>> import numpy as np, mpicomm
        >>> w, r = mpicomm.get_world_size(), mpicomm.get_rank()
        >>> outs = [np.empty(1) for _ in range(w)]
        >>> mpicomm.all_gather_coalesced([[o] for o in outs], [np.array([float(r)])])
        >>> [float(o[0]) for o in outs] == [float(i) for i in range(w)]
        True
    """
    fn = "all_gather_coalesced"
    g = resolve(group, fn)
    if g.comm is None:
        warn_non_member(g, fn)
        return None
    inputs = _arrays(input_tensor_list, fn, "input_tensor_list", output=False)
    outputs = _arrays(output_tensors, fn, "output_tensor_lists", output=True)
    k, w = len(inputs), g.size()
    _check_outputs(fn, inputs, outputs, w)
    dtype = _real(inputs[0].dtype) if inputs else np.dtype(np.uint8)
    packed = _pack(inputs, dtype)
    if validation._Flag.on:
        validation.check(g, fn, {"dtype": str(dtype), "count": packed.size})
    gathered = np.empty(w * packed.size, dtype)

    def unpack() -> None:
        for r in range(w):
            _unpack(gathered[r * packed.size : (r + 1) * packed.size], outputs[r * k : (r + 1) * k])

    inner = None
    if packed.size:
        send, recv = message(packed), message(gathered)
        g.comm.Allgather(send, recv)  # blocking whatever async_op: ranks may differ in it
    if async_op:
        return _then(inner, (packed, gathered), list(outputs), unpack, fn)
    unpack()
    return None


def _check_outputs(fn: str, inputs: list[np.ndarray], outputs: list[np.ndarray], w: int) -> None:
    k = len(inputs)
    if len(outputs) != w * k:
        raise ArgumentError(
            f"{fn}: output_tensor_lists holds {len(outputs)} arrays; expected {w} lists (the group size) "
            f"of {k} (the length of input_tensor_list)"
        )
    for j, out in enumerate(outputs):
        src = inputs[j % k]
        if _real(out.dtype) != _real(src.dtype):
            raise ArgumentError(
                f"{fn}: output_tensor_lists[{j // k}][{j % k}] has dtype {out.dtype}; expected {src.dtype}, "
                f"the dtype of input_tensor_list[{j % k}]"
            )
        if _reals(out) != _reals(src):
            raise ArgumentError(
                f"{fn}: output_tensor_lists[{j // k}][{j % k}] has {out.size} elements of {out.dtype}; "
                f"expected the {src.size} of {src.dtype} of input_tensor_list[{j % k}]"
            )
