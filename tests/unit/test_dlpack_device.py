"""A torch CUDA tensor is taken by DLPack with torch's current device set to the tensor's device.

torch's ``__dlpack__`` makes the consumer's stream wait for torch's current stream of torch's
*current* device; :func:`mpicomm.gpu.backend._device_of_tensor` makes that the tensor's device. No
GPU here: a tensor subclass that says it is on CUDA stands in, and ``torch.cuda.device`` is recorded.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
import pytest

from mpicomm.gpu import backend

torch = pytest.importorskip("torch")


class _SaysCuda(torch.Tensor):  # type: ignore[misc]
    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    @property
    def device(self) -> Any:  # type: ignore[override]
        return "cuda:3"


def test_a_cuda_tensor_is_viewed_with_its_device_current_in_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Any] = []

    def device(d: Any) -> Any:
        made.append(d)
        return contextlib.nullcontext()

    monkeypatch.setattr(torch.cuda, "device", device)
    x = torch.zeros(2).as_subclass(_SaysCuda)
    with backend._device_of_tensor(x):
        pass
    assert made == ["cuda:3"]


def test_the_backend_takes_the_dlpack_inside_the_tensors_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """CupyBackend.wrap calls cupy's from_dlpack with torch's current device set to the tensor's."""
    current: list[Any] = []

    @contextlib.contextmanager
    def device(d: Any) -> Any:
        current.append(d)
        try:
            yield
        finally:
            current.pop()

    class _Cupy:
        def from_dlpack(self, x: Any) -> Any:
            return ("viewed", list(current))

    monkeypatch.setattr(torch.cuda, "device", device)
    wrapper = backend.CupyBackend.__new__(backend.CupyBackend)  # no cupy here: a stand-in
    wrapper.cp = _Cupy()
    x = torch.zeros(2).as_subclass(_SaysCuda)
    assert wrapper.wrap(x, "all_reduce", "tensor") == ("viewed", ["cuda:3"])
    assert current == []


@pytest.mark.parametrize("make", [lambda: np.zeros(2), lambda: torch.zeros(2)], ids=["numpy", "torch-cpu"])
def test_other_arrays_change_no_device(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device", lambda d: pytest.fail(f"torch.cuda.device({d}) called"))
    assert isinstance(backend._device_of_tensor(make()), contextlib.nullcontext)
