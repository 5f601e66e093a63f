"""The public ``KeyedJaggedArray`` and ``KJTAllToAll``: the jagged all-to-all on the arrays users hold.

The classes of :mod:`mpicomm.jagged` work on numpy or cupy arrays. These subclasses also take torch
tensors (CPU or CUDA) and any array kind the front door views (:mod:`mpicomm.front.kinds`) for
values, lengths, offsets and weights, keep zero-copy numpy or cupy views of them inside, and answer
in the caller's kind: a KeyedJaggedArray built from torch tensors gives torch tensors from
``values()``, ``lengths()``, ``offsets()`` and ``weights()``, and so does every object derived
from it: ``kja["key"]`` and ``to_dict()`` (a :class:`JaggedArray` whose rows are torch tensors),
``split``, ``permute``, ``concat``, ``empty_like`` and the KeyedJaggedArray that
:class:`KJTAllToAll` returns for it (torch CUDA in, torch CUDA out). Arrays built from numpy take
the host classes' paths as they are: one ``None`` check more per call.

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

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from ..core.groups import ProcessGroup
from ..gpu.backend import backend
from ..gpu.cuda_aware import cuda_awareness
from ..gpu.staged import StagedWork, Staging
from ..jagged import exchange, jagged_array, keyed, keyed_ops, kjt
from ..jagged.device import is_device, namespace, segment_index, to_host
from ..objects.devbufs import CudaBuffer
from . import kinds
from .device import PATHS

__all__ = [
    "JaggedArray",
    "KJTAllToAll",
    "KJTAllToAllAwaitable",
    "KeyedJaggedArray",
    "jagged_all_to_all_direct",
]

_NAME = "KeyedJaggedArray"
_FN = "KJTAllToAll"
_F = TypeVar("_F", bound="KeyedJaggedArray")


def _array(x: Any, arg: str) -> Any:
    """``x`` as the jagged code takes it: a numpy array (host) or a cupy array on the current device."""
    kind = kinds.kind_of(x)
    if kind in (kinds.NUMPY, kinds.OTHER, kinds.LIST):
        return x
    view = x if kind == kinds.CUPY else kinds.view(x, kind, _NAME, arg, write=False)
    if is_device(view):
        backend().check_device(view, _NAME, arg)
    return view


def _heir(model: Any, values: Any) -> Any:
    """The model of a new array that copied its values from an array built on ``model`` (not None).

    Its own values in the caller's kind (one zero-copy view), so that the copy does not keep the
    caller's tensor alive. Arrays that view their parent's memory take the parent's model itself.
    """
    return kinds.like(values, model)


class JaggedArray(jagged_array.JaggedArray):
    """One key's rows of a KeyedJaggedArray built from torch tensors, answering in torch.

    What ``kja["key"]`` and ``kja.to_dict()`` give for such an array: the host class over the same
    numpy (or cupy) views, whose accessors, rows and ``to_dense()`` are torch tensors (zero-copy).
    A KeyedJaggedArray built from numpy gives the host :class:`mpicomm.JaggedArray` itself.

    Args:
        values: The concatenated rows (a numpy or cupy array).
        lengths: One length per row.
        weights: Optional per-value weights.
        model: The caller's array whose kind the accessors answer in (None: as they are).

    Example:
        >>> import torch, mpicomm
        >>> kja = mpicomm.KeyedJaggedArray(["A"], torch.arange(3.0), lengths=torch.tensor([2, 1]))
        >>> ja = kja["A"]
        >>> ja.lengths(), ja[1], ja.to_dense()
        (tensor([2, 1]), tensor([2.]), [tensor([0., 1.]), tensor([2.])])
    """

    __slots__ = ("_model",)

    def __init__(self, values: Any, lengths: Any, weights: Any = None, model: Any = None) -> None:
        super().__init__(values, lengths, weights)
        self._model = model

    def _answer(self, x: Any) -> Any:
        return x if x is None else kinds.like(x, self._model)

    def values(self) -> Any:
        """The concatenated rows (a view of the KeyedJaggedArray's values, in the caller's kind)."""
        return self._answer(super().values())

    def lengths(self) -> Any:
        """One length per row (in the caller's kind)."""
        return self._answer(super().lengths())

    def offsets(self) -> Any:
        """``[0] + cumsum(lengths)`` (in the caller's kind)."""
        return self._answer(super().offsets())

    def weights(self) -> Any:
        """The per-value weights, or None (in the caller's kind)."""
        return self._answer(super().weights())

    def weights_or_none(self) -> Any:
        """The same as :meth:`weights` (torchrec's name)."""
        return self.weights()

    def to_dense(self) -> list[Any]:
        """The rows, each a view of :meth:`values` (torchrec's ``to_dense``: torch in, torch out)."""
        values = self.values()
        ends = super().offsets().tolist()
        return [values[ends[i] : ends[i + 1]] for i in range(len(ends) - 1)]

    def __getitem__(self, index: int | slice) -> Any:
        """Row ``index`` (a view of :meth:`values`), or a list of rows for a slice."""
        if isinstance(index, slice):
            return self.to_dense()[index]
        return self._answer(super().__getitem__(index))


class KeyedJaggedArray(keyed.KeyedJaggedArray):  # noqa: D101 (the host class's docstring)
    __doc__ = keyed.KeyedJaggedArray.__doc__
    #: The caller's array whose kind the accessors answer in; None (numpy-built, or built by the
    #: host's ``_trusted`` and not yet given one): the arrays as they are.
    _model: Any = None

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
        self._model = values if kinds.kind_of(values) == kinds.TORCH else None
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
        model = self._model
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

    # The methods below build new arrays with the host's code and give them this array's kind.

    def _jagged(self, i: int) -> jagged_array.JaggedArray:
        ja = super()._jagged(i)
        model = self._model
        return ja if model is None else JaggedArray(ja._values, ja._lengths, ja._weights, model)

    def split(self: _F, segments: Sequence[int]) -> list[_F]:
        """Cut the keys into consecutive groups of ``segments[i]`` keys (torchrec's ``split``).

        The host class's ``split``; the pieces, views of this array, answer in its kind.

        Args:
            segments: Keys per piece; non-negative, summing to the number of keys.

        Returns:
            One KeyedJaggedArray per segment.

        Raises:
            ArgumentTypeError: segments are not integers.
            ArgumentError: a negative segment, or segments that do not sum to the number of keys.
        """
        out = super().split(segments)
        model = self._model
        if model is not None:
            for piece in out:
                piece._model = model
        return out

    def permute(self: _F, indices: Sequence[int], indices_tensor: Any = None) -> _F:
        """The keys in the order ``indices``, with their rows (torchrec's ``permute``).

        The host class's ``permute``; the new array answers in this array's kind, and
        ``indices_tensor`` may be a torch tensor.

        Args:
            indices: Positions of the keys to take, in the new order; each at most once.
            indices_tensor: The same indices as an array (torchrec's argument), or None.

        Returns:
            A new KeyedJaggedArray (copies of the values).

        Raises:
            ArgumentTypeError: indices are not integers.
            ArgumentError: an index out of range or repeated.
        """
        if indices_tensor is not None and kinds.kind_of(indices_tensor) not in (kinds.NUMPY, kinds.LIST):
            indices_tensor = to_host(_array(indices_tensor, "indices_tensor"))
        out = super().permute(indices, indices_tensor)
        if self._model is not None:
            out._model = _heir(self._model, out._values)
        return out

    @classmethod
    def concat(cls: type[_F], kja_list: Sequence[keyed_ops.KeyedOps]) -> _F:
        """The keys of every array in ``kja_list``, one after the other (torchrec's ``concat``).

        The host class's ``concat``; the new array answers in torch if any of ``kja_list`` was
        built from torch tensors.

        Args:
            kja_list: KeyedJaggedArrays with distinct keys, alike in weights, VBE, stride and dtypes.

        Returns:
            A new KeyedJaggedArray.

        Raises:
            ArgumentTypeError: an entry is not a KeyedJaggedArray, or dtypes differ.
            ArgumentError: an empty list, mixed weights or VBE, strides that differ, a repeated key.
        """
        out = super().concat(kja_list)
        for p in kja_list:  # all KeyedJaggedArrays of this class: the host checked them
            if isinstance(p, KeyedJaggedArray) and p._model is not None:
                out._model = _heir(p._model, out._values)
                break
        return out

    @classmethod
    def empty_like(cls: type[_F], kja: keyed_ops.KeyedOps) -> _F:
        """No keys, with ``kja``'s stride and dtypes (torchrec's ``empty_like``), in ``kja``'s kind.

        Args:
            kja: The KeyedJaggedArray to take the stride, dtypes and kind of.

        Returns:
            A new KeyedJaggedArray with no keys.

        Raises:
            ArgumentTypeError: ``kja`` is not a KeyedJaggedArray.
        """
        out = super().empty_like(kja)
        if isinstance(kja, KeyedJaggedArray):
            out._model = kja._model  # its arrays are empty views of kja's
        return out


class KJTAllToAllAwaitable(kjt.KJTAllToAllAwaitable):  # noqa: D101 (the host class's docstring)
    __doc__ = kjt.KJTAllToAllAwaitable.__doc__
    __slots__ = ("_model",)
    _model: Any  # the caller's array whose kind the output takes (KJTAllToAll.__call__ sets it)

    def wait(self) -> KeyedJaggedArray:
        """Block until the data has arrived and return this rank's KeyedJaggedArray, in the input's kind."""
        out: KeyedJaggedArray = super().wait()  # type: ignore[assignment]  # made in KJTAllToAll._keyed
        if out._model is None and self._model is not None:  # (at world size 1, the input: it has one)
            out._model = _heir(self._model, out._values)
        return out


class _DevicePath:
    """The device data step of :class:`KJTAllToAll` (see the module): direct or staged."""

    @staticmethod
    def direct() -> bool:
        """Whether device memory goes to MPI as it is (a CUDA-aware MPI)."""
        return cuda_awareness().aware

    @staticmethod
    def start(call: kjt._Call, placed: bool, direct: bool) -> KJTAllToAllAwaitable:
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


def _recat_later(call: kjt._Call, dst: tuple[Any, Any, Any]) -> KJTAllToAllAwaitable:
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

    return KJTAllToAllAwaitable(None, out, finish)


def _device_rows(xp: Any, call: kjt._Call, device: int) -> Any:
    """The lengths' recat index on ``device``: made once per receive plan (it depends on its shape only)."""
    recv, lay = call.recv, call.a2a._layout
    if recv.device_rows is None or recv.device_rows[0] != device:
        recv.device_rows = (device, segment_index(xp, recv.rows_sk.reshape(-1), lay.perm, recv.total))
    return recv.device_rows[1]


def _placed(call: kjt._Call, dst: tuple[Any, Any, Any], pending: Any) -> KJTAllToAllAwaitable:
    """An awaitable for the staged placed path: MPI already puts segments in order; upload when done.

    The output holds the device arrays the upload fills: the staged Work uploads once MPI's
    operation completes (in ``wait()``, or an ``is_completed()`` that finds it done).
    """
    out: list[keyed.KeyedJaggedArray] = [_output(call, *dst)]
    if pending is None:
        return KJTAllToAllAwaitable(None, out)
    work, stage = pending
    return KJTAllToAllAwaitable(StagedWork(work, stage, []), out)


def _output(call: kjt._Call, lengths: Any, values: Any, weights: Any) -> KeyedJaggedArray:
    keys = call.kja._keys[call.a2a._layout.key_range]
    return KeyedJaggedArray._trusted(keys, values, lengths, weights, call.recv.stride, call.recv.table)


class KJTAllToAll(kjt.KJTAllToAll):  # noqa: D101 (the host class's docstring)
    __doc__ = kjt.KJTAllToAll.__doc__
    _device = _DevicePath()
    # the host's calls make their outputs and handles in these classes (it reads the arrays inside
    # ``kja`` only, never the accessors that answer in torch)
    _keyed = KeyedJaggedArray
    _awaitable = KJTAllToAllAwaitable

    def __call__(self, kja: keyed.KeyedJaggedArray) -> KJTAllToAllAwaitable:
        """Start the exchange of ``kja``; the handle's ``wait()`` gives this rank's output.

        See the class docstring for the contract; the output takes ``kja``'s array kind.
        """
        handle: KJTAllToAllAwaitable = super().__call__(kja)  # type: ignore[assignment]  # _awaitable's
        handle._model = kja._model if isinstance(kja, KeyedJaggedArray) else None
        return handle


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
