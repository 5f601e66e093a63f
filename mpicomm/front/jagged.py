"""The public ``KeyedJaggedArray`` and ``KJTAllToAll``: the jagged all-to-all on the arrays users hold.

The classes of :mod:`mpicomm.jagged` work on numpy arrays. These subclasses take torch CPU tensors
(and any array kind the front door views, :mod:`mpicomm.front.kinds`) for values, lengths, offsets
and weights, keep numpy views of them inside (no copy), and answer in the caller's kind: a
KeyedJaggedArray built from torch tensors gives torch tensors from ``values()``, ``lengths()``,
``offsets()`` and ``weights()``, and the KeyedJaggedArray that :class:`KJTAllToAll` returns for it
does too. Device arrays are refused with a clear message: the jagged all-to-all runs on the host.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..errors import ArgumentTypeError
from ..jagged import keyed, kjt
from . import kinds

__all__ = ["KJTAllToAll", "KJTAllToAllAwaitable", "KeyedJaggedArray"]

_NAME = "KeyedJaggedArray"


def _host(x: Any, arg: str) -> Any:
    """``x`` as a numpy array if it is an array of another kind the host can read in place."""
    kind = kinds.kind_of(x)
    if kind in (kinds.NUMPY, kinds.OTHER, kinds.LIST):
        return x
    view = kinds.view(x, kind, _NAME, arg, write=False)
    if not isinstance(view, np.ndarray):
        raise ArgumentTypeError(
            f"{_NAME}: {arg} is a device array; expected host memory (the jagged all-to-all runs on the "
            "host: move it with .cpu() or .get())"
        )
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
            _host(values, "values"),
            _host(weights, "weights"),
            _host(lengths, "lengths"),
            _host(offsets, "offsets"),
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
    __slots__ = ("_model",)

    def __init__(self, inner: kjt.KJTAllToAllAwaitable, model: Any) -> None:
        super().__init__(inner._work, inner._out, inner._finish)
        self._model = model

    def wait(self) -> KeyedJaggedArray:
        """Block until the data has arrived and return this rank's KeyedJaggedArray, in the input's kind."""
        out: Any = super().wait()
        if type(out) is not KeyedJaggedArray:
            out.__class__ = KeyedJaggedArray  # the same object, seen through the front's accessors
            out._model = self._model
        front: KeyedJaggedArray = out
        return front


class KJTAllToAll(kjt.KJTAllToAll):  # noqa: D101 (the host class's docstring)
    __doc__ = kjt.KJTAllToAll.__doc__

    def __call__(self, kja: keyed.KeyedJaggedArray) -> KJTAllToAllAwaitable:
        """Start the exchange of ``kja``; the handle's ``wait()`` gives this rank's output.

        See the class docstring for the contract; the output takes ``kja``'s array kind.
        """
        model = kja.__dict__.get("_model") if isinstance(kja, KeyedJaggedArray) else None
        if model is not None:  # the numpy arrays inside, seen through the base class's accessors
            host = copy.copy(kja)
            host.__class__ = keyed.KeyedJaggedArray
            kja = host
        return KJTAllToAllAwaitable(super().__call__(kja), model)
