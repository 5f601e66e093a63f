"""One program on torch's backend "mpicomm" and on gloo, in the same processes: the groups and the comparison.

The torch tests that compare mpicomm with gloo (tests/mpi/test_torch_compile.py, test_torch_programs.py,
test_torch_devices.py, tests/torchrec/test_dlrm.py) share this set-up: torch's default group on
"mpicomm" and a gloo group of the same ranks (on the store of the MPI rendezvous), and the rule for
equal results: bitwise at one and two ranks, where a sum of two numbers has one order; from three,
gloo's ring and MPI's reduction add in other orders, so float32 rounding (float16's where gradients
travel as float16).

A test module makes the fixture with one line::

    both = pytest.fixture(scope="module")(torchpair.mpicomm_and_gloo)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

import mpicomm
import mpicomm.torch  # registers the backend

__all__ = ["assert_same", "mpicomm_and_gloo"]


def mpicomm_and_gloo() -> Iterator[dict[str, Any]]:
    """torch's default group on mpicomm and a gloo group of the same ranks, by backend name.

    Restores the world group's timeout afterwards (torch's default group sets it).
    """
    w = mpicomm.init()
    saved = w.timeout
    dist.init_process_group("mpicomm")
    try:
        yield {"mpicomm": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    finally:
        dist.destroy_process_group()
        w.timeout = saved


def assert_same(
    ours: Sequence[Any], theirs: Sequence[Any], half: bool = False, names: Sequence[str] = ()
) -> None:
    """Tensors (or floats) equal bitwise at 1-2 ranks; to float32 rounding from 3 (float16's if ``half``)."""
    assert len(ours) == len(theirs)
    rtol, atol = (1e-2, 2e-3) if half else (1e-5, 1e-6)
    for i, (x, y) in enumerate(zip(ours, theirs, strict=True)):
        a, b, what = torch.as_tensor(x), torch.as_tensor(y), names[i] if names else i
        if dist.get_world_size() <= 2:
            assert torch.equal(a, b), (what, (a - b).abs().max())
        else:
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=f"{what}: not close")
