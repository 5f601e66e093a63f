"""The GPU hooks of the object collectives: how :mod:`mpicomm.objects.devbufs` reaches the GPU backend.

The object collectives sit beside :mod:`mpicomm.gpu` (neither imports the other);
:func:`mpicomm.wiring.objects`, above both, gives them the backend, :func:`direct` (whether this rank
hands device memory to MPI: the same CUDA-awareness decision as every other device call), the
pinned buffer pool of the staged path, and :func:`view` (how a device array of any kind, a torch
CUDA tensor or a ``__cuda_array_interface__`` object, is viewed as the backend's array). Nothing
here runs until an object holds a device array.
"""

from __future__ import annotations

from typing import Any

from ..gpu.cuda_aware import cuda_awareness
from . import kinds

__all__ = ["direct", "view"]


def direct() -> bool:
    """Whether this rank hands device memory to MPI as it is (a CUDA-aware MPI)."""
    return bool(cuda_awareness().aware)


def view(x: Any) -> Any:
    """A device array of any kind inside an object, as the GPU backend's array (zero-copy)."""
    return kinds.view(x, kinds.kind_of(x), "object collectives", "a device array inside an object", False)
