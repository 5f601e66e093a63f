"""Object collectives: pickled objects between ranks, their wire format and the safe unpickler.

- ``collectives``: ``broadcast_object_list``, ``all_gather_object``, ``gather_object``,
  ``scatter_object_list``.
- ``p2p``: ``send_object_list``, ``recv_object_list``.
- ``wire``: sizes and status agreement on the wire (headers bounded before allocating), large
  messages in pieces.
- ``pickling``: pickling with out-of-band arrays, the safe-mode setting and its allow-list.
- ``unpickler``: the safe unpickler (allow-list, checked calls, state and memory claims).
- ``budget``: the safe unpickler's work budget per stream (calls, hashed keys, expanded size, cycles).

May import: ``mpicomm.core``, ``mpicomm.dense`` (point-to-point peers), ``mpicomm.errors``, ``mpicomm._mpi``.
"""

from __future__ import annotations

from .collectives import all_gather_object, broadcast_object_list, gather_object, scatter_object_list
from .p2p import recv_object_list, send_object_list

__all__ = [
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "recv_object_list",
    "scatter_object_list",
    "send_object_list",
]
