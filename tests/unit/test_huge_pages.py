"""The backend's huge pages under reused all_reduce tensors (mpicomm.c10d.huge): contents kept, once each."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from mpicomm.c10d import huge  # noqa: E402


def _huge_kib(address: int) -> int:
    """AnonHugePages of the mapping that holds ``address`` (/proc/self/smaps), in KiB."""
    inside, kib = False, 0
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:  # a mapping's first line: its address range
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "AnonHugePages:":
                kib = int(line.split()[1])
    return kib


def test_a_tensor_reduced_twice_is_collapsed_once_and_keeps_its_values() -> None:
    t = torch.arange(3 << 20, dtype=torch.float32)  # 12 MiB
    want = t.clone()
    before = huge.collapsed()
    huge.reused(t)
    assert huge.collapsed() == before  # once: a tensor of one step only is left alone
    huge.reused(t)
    huge.reused(t)
    if huge._State.on:  # the kernel took it (Linux >= 6.1, THP not "never")
        assert huge.collapsed() == before + 1
        assert _huge_kib(t.data_ptr()) >= 8 << 10  # at least four of its six 2 MiB pages
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
