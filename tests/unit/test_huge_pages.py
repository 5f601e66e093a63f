"""Huge pages under large host buffers (mpicomm.core.pages): the backend's collapse of reused all_reduce
tensors (mpicomm.c10d.huge), once each, contents kept; the front door's hint on torch tensors it views."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from mpicomm.c10d import huge  # noqa: E402
from mpicomm.core import pages  # noqa: E402
from mpicomm.front import kinds  # noqa: E402


def _huge_kib(t: Any) -> int:
    """AnonHugePages of the mappings that overlap ``t``'s memory (/proc/self/smaps), in KiB.

    A hint splits a mapping where its 2 MiB pages begin: the tensor's memory may span three.
    """
    lo_t, hi_t = t.data_ptr(), t.data_ptr() + t.nbytes
    inside, kib = False, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:  # a mapping's first line: its address range
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < hi_t and lo_t < hi
            elif inside and head == "AnonHugePages:":
                kib += int(line.split()[1])
    return kib


def _thp_allowed() -> bool:
    """Whether the kernel gives huge pages where asked (THP "always" or "madvise", not "never")."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def test_a_tensor_reduced_twice_is_collapsed_once_and_keeps_its_values() -> None:
    t = torch.arange(3 << 20, dtype=torch.float32)  # 12 MiB
    want = t.clone()
    before = huge.collapsed()
    huge.reused(t)
    assert huge.collapsed() == before  # once: a tensor of one step only is left alone
    huge.reused(t)
    huge.reused(t)
    if pages._COLLAPSE not in pages._State.refused and _thp_allowed():  # Linux >= 6.1, THP not "never"
        assert huge.collapsed() == before + 1
        assert _huge_kib(t) >= 8 << 10  # at least four of its six 2 MiB pages
    assert torch.equal(t, want)


def test_small_and_strided_tensors_are_left_alone() -> None:
    small = torch.zeros((1 << 20) - 1)  # one float32 under 4 MiB
    strided = torch.zeros(2, 3 << 20)[:, ::2]
    before = huge.collapsed()
    for t in (small, strided):
        huge.reused(t)
        huge.reused(t)
    assert huge.collapsed() == before
    assert (small.data_ptr(), small.nbytes) not in huge._State.seen


def test_the_front_door_hints_a_large_fresh_tensor_before_its_first_touch() -> None:
    t = torch.empty(3 << 20)  # 12 MiB, not touched yet
    view = kinds.cpu_view(t)
    if pages._State.on and pages._HUGEPAGE not in pages._State.refused and _thp_allowed():
        view[:] = 1.0  # the first touch: faults in 2 MiB pages (unhinted: none)
        assert _huge_kib(t) >= 2 << 10  # the kernel may find fewer free 2 MiB pages than the six
    assert float(t.sum()) == 3 << 20 or not pages._State.on


def test_the_front_door_s_threshold_is_the_pages_module_s() -> None:
    assert kinds._HUGE == pages.SMALLEST
