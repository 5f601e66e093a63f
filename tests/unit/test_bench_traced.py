"""The bench's ``all_reduce_traced`` row: a traced and an untraced all_reduce, both reducing."""

from __future__ import annotations

import numpy as np

import mpicomm
from mpicomm.apps.bench.harness import Buffers, Env
from mpicomm.apps.bench.run import OPS
from mpicomm.apps.bench.traced import _traced
from mpicomm.trace import RECORDER, untraced


def test_both_contenders_reduce_and_only_the_traced_one_records() -> None:
    world = mpicomm.init()
    env = Env(world.comm, world.rank(), world.size())
    traced_call, (x,) = _traced(env, 2, "traced", Buffers(False))
    plain_call, (y,) = _traced(env, 2, "untraced", Buffers(False))
    before_x, before_y = x.copy(), y.copy()
    traced_call()
    plain_call()
    np.testing.assert_array_equal(x, before_x * world.size())
    np.testing.assert_array_equal(y, before_y * world.size())
    assert RECORDER.n == 0  # the bench's own recorder took the call, not the process's
    assert untraced(traced_call.func) is untraced(mpicomm.all_reduce)
    assert plain_call.func is untraced(mpicomm.all_reduce)
    assert OPS["all_reduce_traced"].a == "traced" and OPS["all_reduce_traced"].b == "untraced"
