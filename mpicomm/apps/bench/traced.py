"""What tracing costs: ``mpicomm.all_reduce`` recorded as under ``MPICOMM_TRACE`` against the untraced call.

The traced contender is :func:`mpicomm.trace.traced`'s wrapper around the untraced call, recording
into a bench-own bounded recorder (a ring of 4,096 rows, never written to a file), so that the row
says what a traced small call costs whether or not the bench itself runs with ``MPICOMM_TRACE``.
"""

from __future__ import annotations

from functools import partial

import mpicomm

from ...trace import CALLS, Recorder, traced, untraced
from .harness import Buffers, Contender, Env, _data

__all__ = ["_traced"]


def _traced(e: Env, c: int, who: str, m: Buffers) -> Contender:
    """all_reduce traced (one row recorded per call) against all_reduce untraced."""
    x = m.take("x", c, partial(_data, c, e.rank))
    plain = untraced(mpicomm.all_reduce)
    if who == "untraced":
        return partial(plain, x), [x]
    rec = Recorder(capacity=1 << 12, ring=True)
    rec.unsynced = False  # no clock comparison: the bench measures the recording alone
    return partial(traced("all_reduce", plain, CALLS["all_reduce"], rec), x), [x]
