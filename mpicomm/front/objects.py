"""The GPU hooks of the object collectives: how :mod:`mpicomm.objects.devbufs` reaches the GPU backend.

The object collectives sit beside :mod:`mpicomm.gpu` (neither imports the other); this module, above
both, tells them the backend, whether this rank hands device memory to MPI (the same CUDA-awareness
decision as every other device call), the pinned buffer pool of the staged path, and how a device
array of any kind (torch CUDA tensor, ``__cuda_array_interface__`` object) is viewed as the
backend's array. Nothing here runs until an object holds a device array.
"""

from __future__ import annotations

from typing import Any

from ..gpu import staged
from ..gpu.backend import backend
from ..gpu.cuda_aware import cuda_awareness
from ..objects.devbufs import Hooks
from ..objects.tensors import CpuView
from . import kinds

__all__: list[str] = []


def _direct() -> bool:
    return bool(cuda_awareness().aware)


def _view(x: Any) -> Any:
    return kinds.view(x, kinds.kind_of(x), "object collectives", "a device array inside an object", False)


Hooks.backend = backend
Hooks.direct = _direct
Hooks.pool = staged.pool
Hooks.view = _view
CpuView.view = kinds.cpu_view
