"""The public ``KeyedJaggedArray`` and ``KJTAllToAll``: the jagged all-to-all on the arrays users hold.

The classes of :mod:`mpicomm.jagged` work on numpy or cupy arrays. These subclasses also take torch
tensors (CPU or CUDA) and any array kind the front door views (:mod:`mpicomm.front.kinds`) for
values, lengths, offsets and weights, keep zero-copy numpy or cupy views of them inside, and answer
in the caller's kind: a KeyedJaggedArray built from torch tensors gives torch tensors from
``values()``, ``lengths()``, ``offsets()`` and ``weights()``, and the KeyedJaggedArray that
:class:`KJTAllToAll` returns for it does too (torch CUDA in, torch CUDA out).

Device arrays take one of two paths (:data:`mpicomm.front.device.PATHS` counts them):

* **direct** (a CUDA-aware MPI): the counts message on the host, then one blocking ``Alltoallv``
  each of lengths, values and weights on the device memory itself; every rank announces it in the
  counts message, so all ranks take the blocking path (CUDA-aware MPIs do not take device memory
  in non-blocking collectives) or all raise one error.
* **staged** (any other MPI): the same MPI calls as the host path on pinned host buffers, between a
  download and an upload on mpicomm's copy streams (:mod:`mpicomm.gpu.staged`), so staged device
  ranks and host ranks mix in one exchange.

Either way the recat (key, then source order) runs on the device
(:func:`mpicomm.jagged.device.segment_index`); only the per-key value offsets (one number per key)
come to the host, for the counts message.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.groups import ProcessGroup
from ..gpu.backend import backend
from ..gpu.cuda_aware import cuda_awareness
from ..gpu.staged import StagedWork, Staging
from ..jagged import exchange, keyed, kjt
from ..jagged.device import is_device, namespace, segment_index
from ..objects.devbufs import CudaBuffer
from . import kinds
from .device import PATHS

__all__ = ["KJTAllToAll", "KJTAllToAllAwaitable", "KeyedJaggedArray", "jagged_all_to_all_direct"]

_NAME = "KeyedJaggedArray"
_FN = "KJTAllToAll"


def _array(x: Any, arg: str) -> Any:
    """``x`` as the jagged code takes it: a numpy array (host) or a cupy array on the current device."""
    kind = kinds.kind_of(x)
    if kind in (kinds.NUMPY, kinds.OTHER, kinds.LIST):
        return x
    view = x if kind == kinds.CUPY else kinds.view(x, kind, _NAME, arg, write=False)
    if is_device(view):
        backend().check_device(view, _NAME, arg)
    return view


class KeyedJaggedArray(keyed.KeyedJaggedArray):  # noqa: D101 (the host class's docstring)
    __doc__ = keyed.KeyedJaggedArray.__doc__

    def __init__(
        self,
        keys: Sequence[str],
        values: Any,
        weights: Any = None,
        lengths: Any = None,
        offsets: Any = None,
        stride: int | None = None,
        stride_per_key_per_rank: Sequence[Sequence[int]] | None = None,
        *,
        stride_per_key: Sequence[int] | None = None,
        length_per_key: Sequence[int] | None = None,
        offset_per_key: Sequence[int] | None = None,
        index_per_key: Mapping[str, int] | None = None,
    ) -> None:
        self._model: Any = values if kinds.kind_of(values) == kinds.TORCH else None
        super().__init__(
            keys,
            _array(values, "values"),
            _array(weights, "weights"),
            _array(lengths, "lengths"),
            _array(offsets, "offsets"),
            stride,
            stride_per_key_per_rank,
            stride_per_key=stride_per_key,
            length_per_key=length_per_key,
            offset_per_key=offset_per_key,
            index_per_key=index_per_key,
        )

    def _answer(self, x: Any) -> Any:
        model = self.__dict__.get("_model")
        return x if model is None or x is None else kinds.like(x, model)

    def values(self) -> Any:
        """The concatenated rows (a torch tensor if the array was built from torch tensors)."""
        return self._answer(super().values())

    def weights(self) -> Any:
        """The per-value weights, or None (torch tensors in, torch tensors out)."""
        return self._answer(super().weights())

    def weights_or_none(self) -> Any:
        """The same as :meth:`weights` (torchrec's name)."""
        return self.weights()

    def lengths(self) -> Any:
        """Row lengths, key-major (torch tensors in, torch tensors out)."""
        return self._answer(super().lengths())

    def offsets(self) -> Any:
        """Row offsets, key-major, one more than the lengths (torch tensors in, torch tensors out)."""
        return self._answer(super().offsets())


class KJTAllToAllAwaitable(kjt.KJTAllToAllAwaitable):  # noqa: D101 (the host class's docstring)
    __doc__ = kjt.KJTAllToAllAwaitable.__doc__
    __slots__ = ()  # the host class's object, seen through this class (see KJTAllToAll.__call__)

    def wait(self) -> KeyedJaggedArray:
        """Block until the data has arrived and return this rank's KeyedJaggedArray, in the input's kind."""
        out: Any = super().wait()
        if type(out) is not KeyedJaggedArray:
            out.__class__ = KeyedJaggedArray  # the same object, seen through the front's accessors
            out._model = self._model
        front: KeyedJaggedArray = out
        return front


class _DevicePath:
    """The device data step of :class:`KJTAllToAll` (see the module): direct or staged."""

    @staticmethod
    def direct() -> bool:
        """Whether device memory goes to MPI as it is (a CUDA-aware MPI)."""
        return cuda_awareness().aware

    @staticmethod
    def start(call: kjt._Call, placed: bool, direct: bool) -> kjt.KJTAllToAllAwaitable:
        """Move ``call``'s data; ``placed``: the host's placed path (Alltoallw, indexed types)."""
        be = backend()
        kja = call.kja
        src = _each(be.contiguous, (kja._lengths, kja._values, kja._weights))
        dst = _receive_arrays(call, src)
        if direct:
            be.current_stream().synchronize()  # mpi4py hands the pointers over without waiting
            call.a2a._moves(call, _each(CudaBuffer, src), _each(CudaBuffer, dst))
            PATHS[_FN, "direct"] += 1
            return _recat_later(call, dst)
        stage = Staging()
        try:
            hs = _each(lambda x: stage.host(x, True, False), src)
            hd = _each(lambda x: stage.host(x, False, True), dst)
            stage.download()
            if placed:
                host = keyed.KeyedJaggedArray._trusted(
                    kja._keys, hs[1], hs[0], hs[2], kja._stride, kja._spkpr
                )
                inner = call.a2a._start_in_place(call._replace(kja=host), into=hd)
            else:
                call.a2a._moves(call, hs, hd)
        except BaseException:
            stage.release()
            raise
        PATHS[_FN, "staged"] += 1
        if not placed or inner._work is None:
            stage.upload()
            return _recat_later(call, dst) if not placed else _placed(call, dst, None)
        return _placed(call, dst, (inner._work, stage))


def _each(f: Any, xs: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """``f`` of each of lengths, values and weights (weights may be None)."""
    return f(xs[0]), f(xs[1]), None if xs[2] is None else f(xs[2])


def _receive_arrays(call: kjt._Call, src: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """New device arrays for what this rank receives: lengths, values and weights (or None)."""
    xp, total = namespace(src[1]), call.arrived.total
    lens, vals, w = src
    out_l = xp.empty(call.recv.total, dtype=lens.dtype)
    out_v = xp.empty((total, *vals.shape[1:]), dtype=vals.dtype)
    out_w = None if w is None else xp.empty((total, *w.shape[1:]), dtype=w.dtype)
    return out_l, out_v, out_w


def _recat_later(call: kjt._Call, dst: tuple[Any, Any, Any]) -> kjt.KJTAllToAllAwaitable:
    """An awaitable whose ``wait()`` puts the received (source, key) segments in (key, source) order.

    The gathers are device kernels on the caller's current stream; their indices come from the
    counts the host already has (no pass over the lengths, no host copy of the values).
    """
    lay = call.a2a._layout
    out: list[keyed.KeyedJaggedArray] = []

    def finish() -> None:
        lengths, values, weights = dst
        if not lay.identity:
            xp = namespace(values)
            rows = _device_rows(xp, call, values.device.id)
            index = segment_index(xp, call.arrived.values_sk.reshape(-1), lay.perm, call.arrived.total)
            lengths, values = lengths[rows], values[index]
            weights = None if weights is None else weights[index]
        out.append(_output(call, lengths, values, weights))

    return kjt.KJTAllToAllAwaitable(None, out, finish)


def _device_rows(xp: Any, call: kjt._Call, device: int) -> Any:
    """The lengths' recat index on ``device``: made once per receive plan (it depends on its shape only)."""
    recv, lay = call.recv, call.a2a._layout
    if recv.device_rows is None or recv.device_rows[0] != device:
        recv.device_rows = (device, segment_index(xp, recv.rows_sk.reshape(-1), lay.perm, recv.total))
    return recv.device_rows[1]


def _placed(call: kjt._Call, dst: tuple[Any, Any, Any], pending: Any) -> kjt.KJTAllToAllAwaitable:
    """An awaitable for the staged placed path: MPI already puts segments in order; upload when done.

    The output holds the device arrays the upload fills: the staged Work uploads once MPI's
    operation completes (in ``wait()``, or an ``is_completed()`` that finds it done).
    """
    out = [_output(call, *dst)]
    if pending is None:
        return kjt.KJTAllToAllAwaitable(None, out)
    work, stage = pending
    return kjt.KJTAllToAllAwaitable(StagedWork(work, stage, []), out)


def _output(call: kjt._Call, lengths: Any, values: Any, weights: Any) -> keyed.KeyedJaggedArray:
    keys = call.kja._keys[call.a2a._layout.key_range]
    return keyed.KeyedJaggedArray._trusted(keys, values, lengths, weights, call.recv.stride, call.recv.table)


class KJTAllToAll(kjt.KJTAllToAll):  # noqa: D101 (the host class's docstring)
    __doc__ = kjt.KJTAllToAll.__doc__
    _device = _DevicePath()

    def __call__(self, kja: keyed.KeyedJaggedArray) -> KJTAllToAllAwaitable:
        """Start the exchange of ``kja``; the handle's ``wait()`` gives this rank's output.

        See the class docstring for the contract; the output takes ``kja``'s array kind.
        """
        model = kja.__dict__.get("_model") if isinstance(kja, KeyedJaggedArray) else None
        if model is not None:  # the numpy arrays inside, seen through the base class's accessors
            host = copy.copy(kja)
            host.__class__ = keyed.KeyedJaggedArray
            kja = host
        handle: Any = super().__call__(kja)
        handle.__class__ = KJTAllToAllAwaitable  # the same object (no new one per call), the front's wait()
        handle._model = model
        front: KJTAllToAllAwaitable = handle
        return front


def jagged_all_to_all_direct(
    values: Any,
    lengths: Any,
    send_splits: Sequence[int],
    group: ProcessGroup | None = None,
    async_op: bool = False,
) -> Any:
    """``jagged_all_to_all``'s direct path: what the front door calls for a blocking call on a CUDA-aware MPI.

    Contiguous copies of strided inputs (on the current stream), then
    :func:`mpicomm.jagged.exchange.jagged_all_to_all_direct`; ``NotImplemented`` for ``async_op``.
    """
    if async_op:
        return NotImplemented
    be = backend()
    if is_device(values) and is_device(lengths):
        values, lengths = be.contiguous(values), be.contiguous(lengths)
    return exchange.jagged_all_to_all_direct(
        values, lengths, send_splits, group, CudaBuffer, lambda: be.current_stream().synchronize()
    )
