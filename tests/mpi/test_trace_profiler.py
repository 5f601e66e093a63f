"""The torch backend's calls in torch's profiler: ``mpicomm:<call>`` events with their tensors' shapes.

Each rank profiles a few calls through ``backend="mpicomm"`` and finds one event per call, named as
torch.distributed names the call, whose input shapes (``record_shapes=True``) are the call's tensors;
outside the profiler the process group's methods are the plain ones again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

import mpicomm  # noqa: E402
import mpicomm.torch  # noqa: E402
from mpicomm.c10d.registered import MpicommProcessGroup  # noqa: E402

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def default_group() -> Iterator[None]:
    w = mpicomm.init()
    saved = w.timeout
    dist.init_process_group("mpicomm")
    yield
    dist.destroy_process_group()
    w.timeout = saved


def _profiled(fn: Any) -> list[Any]:
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        fn()
    return [e for e in prof.events() if e.name.startswith("mpicomm:")]


def test_backend_calls_are_profiler_events(default_group: None) -> None:
    w, r = dist.get_world_size(), dist.get_rank()
    rng = np.random.default_rng(43)
    data = rng.standard_normal((w, 5))
    t = torch.tensor(data[r])
    out = torch.empty(5 * w, dtype=t.dtype)

    def calls() -> None:
        dist.all_reduce(t)
        dist.all_gather_into_tensor(out, torch.tensor(data[r]))
        dist.barrier()

    events = _profiled(calls)
    assert [e.name for e in events] == [
        "mpicomm:all_reduce",
        "mpicomm:all_gather_into_tensor",
        "mpicomm:barrier",
    ]
    assert events[0].input_shapes[0] == [5]
    assert events[1].input_shapes[:2] == [[5 * w], [5]]
    np.testing.assert_allclose(t.numpy(), data.sum(axis=0))
    np.testing.assert_array_equal(out.numpy(), data.reshape(-1))
    assert not hasattr(MpicommProcessGroup.allreduce, "__mpicomm_plain__")  # the plain method again


def test_no_events_without_a_profiler(default_group: None) -> None:
    t = torch.ones(2)
    dist.all_reduce(t)
    assert MpicommProcessGroup.allreduce.__name__ == "allreduce"
    assert not hasattr(MpicommProcessGroup.allreduce, "__mpicomm_plain__")
    assert float(t[0]) == dist.get_world_size()
