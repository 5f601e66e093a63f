"""``mpicomm.jagged_all_to_all``: the jagged all-to-all behind the front door.

Its own module, apart from :mod:`mpicomm.front.collectives`: the jagged machinery (and the object
collectives' device buffers it uses) loads with the first jagged call, not with a program's first
numpy all_reduce (issue 44).
"""

from __future__ import annotations

from ..core.engine_gate import gate
from ..jagged import exchange
from . import jagged
from .door import READ, front_door

__all__ = ["jagged_all_to_all"]

jagged_all_to_all = front_door(
    "jagged_all_to_all",
    {"values": READ, "lengths": READ},
    direct=jagged.jagged_all_to_all_direct,
    returns="values",
)(gate("jagged_all_to_all", queued=False)(exchange.jagged_all_to_all))
