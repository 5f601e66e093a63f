"""Huge pages under the tensors DDP reduces at every step.

Why: torch's CPU allocator maps a large tensor with 4 KiB pages (numpy asks the kernel for 2 MiB
pages under its large arrays; torch only with ``THP_MEM_ALLOC_ENABLE=1`` set before it starts).
MPI's copies between ranks walk every page: DDP's three buckets of the 25M-parameter MLP (16, 64
and 16 MiB), all-reduced through the backend on 2 ranks, took 40 ms on 4 KiB pages and 28-29 ms once
the same tensors were backed by huge pages (the 2-core machine, one run, 29 Nov 2026).

What: the second time the backend's ``allreduce`` with ``asyncOp`` (DDP's buckets, the same tensors
at every step) sees a contiguous CPU tensor of at least 4 MiB at the same address and size, it asks
the kernel to back the whole 2 MiB pages inside it with huge pages (:func:`mpicomm.core.pages.collapse`,
``madvise(MADV_COLLAPSE)``, Linux 6.1 and later). The contents stay as they were; it costs about
1 ms per MiB once. A tensor all-reduced once (a fresh one each step) is never touched. Where the
kernel refuses (an older kernel, transparent huge pages set to ``never``), nothing is asked again.
``MPICOMM_HUGE_PAGES=0`` turns it off.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ..core import pages

__all__ = ["collapsed", "reused"]

_LIMIT = 256  # tensors remembered; the table starts afresh past it


class _State:
    seen: ClassVar[dict[tuple[int, int], bool]] = {}  # (address, bytes) -> collapsed
    done = 0


def reused(t: Any) -> None:
    """Note one ``allreduce`` of ``t``; at its second, back it with huge pages (see the module).

    Example:
        >>> import torch
        >>> from mpicomm.c10d import huge
        >>> t = torch.zeros(3 << 20)  # 12 MiB
        >>> huge.reused(t); huge.reused(t)
        >>> huge.collapsed() >= 0
        True
    """
    if t.nbytes < pages.SMALLEST or not t.is_cpu or not t.is_contiguous():
        return
    key = (t.data_ptr(), t.nbytes)
    state = _State.seen.get(key)
    if state is None:
        if len(_State.seen) >= _LIMIT:
            _State.seen.clear()
        _State.seen[key] = False
    elif not state:
        _State.seen[key] = True
        _State.done += pages.collapse(*key)


def collapsed() -> int:
    """How many tensors were given huge pages so far.

    Example:
        >>> from mpicomm.c10d import huge
        >>> huge.collapsed() >= 0
        True
    """
    return _State.done
