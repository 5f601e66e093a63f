"""Jagged all-to-all: torchrec's KJTAllToAll over MPI (counts first, then the values).

- ``keyed``: ``KeyedJaggedArray``, torchrec's KeyedJaggedTensor on numpy or cupy arrays.
- ``keyed_ops``: its torchrec methods (``split``, ``permute``, ``concat``, ``kja["key"]``, ...), vectorised.
- ``jagged_array``: ``JaggedArray``, one key's rows (torchrec's JaggedTensor).
- ``wire``: the counts message both exchanges start with, and the checks they share.
- ``exchange``: the host side of ``mpicomm.jagged_all_to_all`` (rows of one jagged array to each
  rank; the public call is the front door's, :mod:`mpicomm.front.collectives`).
- ``kjt``: ``KJTAllToAll`` and its awaitable.
- ``plan``: what a call of one shape computes once (counts message template, displacements, recat
  indices, datatypes), in bounded caches; the checks on received counts.
- ``repeat``: what a call with the same per-key value counts as a recent one reuses (its counts
  message, value displacements, value recat index and indexed datatypes), in bounded caches.
- ``placement``: putting (source, key) segments in (key, source) order (MPI indexed types or a recat gather).
- ``device``: the arrays' own namespace (numpy or cupy) and the recat index built on the device; the
  device data paths themselves (direct or staged) are the front door's (:mod:`mpicomm.front.jagged`).

May import: ``mpicomm.core``, ``mpicomm.errors``, ``mpicomm._mpi``.
"""

from __future__ import annotations

from ..core.calls import collective
from .exchange import JaggedResult
from .exchange import jagged_all_to_all as _host_jagged_all_to_all
from .jagged_array import JaggedArray
from .keyed import KeyedJaggedArray
from .kjt import KJTAllToAll, KJTAllToAllAwaitable

__all__ = [
    "JaggedArray",
    "JaggedResult",
    "KJTAllToAll",
    "KJTAllToAllAwaitable",
    "KeyedJaggedArray",
    "jagged_all_to_all",
]

#: The host (numpy) call under its old import path, as it was before the front door: one-rank
#: mistakes and MPI errors handled as in every collective. ``mpicomm.jagged_all_to_all`` is the
#: front door's and also takes torch tensors and device arrays.
jagged_all_to_all = collective("jagged_all_to_all")(_host_jagged_all_to_all)
