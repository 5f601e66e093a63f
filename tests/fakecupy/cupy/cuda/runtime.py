# ruff: noqa: N802, N803, N816 - the fake keeps cupy's own names
"""Fake ``cupy.cuda.runtime``: device count, asynchronous copies queued on fake streams, pointer facts."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from typing import Any

from .. import _memory

memcpyHostToHost, memcpyHostToDevice, memcpyDeviceToHost, memcpyDeviceToDevice, memcpyDefault = range(5)
memoryTypeUnregistered, memoryTypeHost, memoryTypeDevice, memoryTypeManaged = range(4)
is_hip = False


def _no_streams(ptr: int) -> Any:
    raise CUDARuntimeError("fake cupy: cupy.cuda is not imported")


_stream_of: Callable[[int], Any] = _no_streams  # replaced by cupy.cuda (the stream registry lives there)
_event_of: Callable[[int], Any] = _no_streams  # likewise, the events
#: fake-only: while a dict (``counting()``), the CUDA runtime calls made, by name: the runtime's
#: functions and the stream and event methods alike (each is one runtime call in cupy)
CALLS: dict[str, int] | None = None


def _count(name: str) -> None:
    if CALLS is not None:
        CALLS[name] = CALLS.get(name, 0) + 1


class CUDARuntimeError(RuntimeError):
    """What cupy raises for a failing CUDA runtime call."""


def getDeviceCount() -> int:
    """``FAKECUPY_DEVICE_COUNT`` (default 1), less where ``CUDA_VISIBLE_DEVICES`` hides some."""
    count = int(os.environ.get("FAKECUPY_DEVICE_COUNT", "1"))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    if count < 1:
        raise CUDARuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
    return count


def getDevice() -> int:
    return int(_current.device)


class _NoState:
    device = 0


_current: Any = _NoState()  # cupy.cuda's thread-local state, set when it is imported (a C call in cupy)


def setDevice(device: int) -> None:
    from . import Device

    Device(device).use()


def runtimeGetVersion() -> int:
    return 12080


def driverGetVersion() -> int:
    return 12080


def deviceSynchronize() -> None:
    from . import Device

    Device().synchronize()


def streamSynchronize(stream: int) -> None:
    _stream_of(stream).synchronize()


def eventRecord(event: int, stream: int) -> None:
    """Record the event (handle) on the stream (handle; 0 and 1: the legacy default stream)."""
    _event_of(event).record(_stream_of(stream))


def streamWaitEvent(stream: int, event: int, flags: int = 0) -> None:
    """The stream's later work waits for the event's recorded point."""
    _stream_of(stream).wait_event(_event_of(event))


def _side(ptr: int, size: int, want_device: bool, what: str, kind: int) -> None:
    region = _memory.find(ptr)
    on_device = region is not None and region[3] == _memory.DEVICE
    if kind != memcpyDefault and on_device != want_device:
        where = "device" if on_device else "host"
        raise CUDARuntimeError(
            f"cudaErrorInvalidValue: memcpy kind {kind}: {what} {ptr:#x} is {where} memory"
        )
    if region is not None and ptr + size > region[1]:
        raise CUDARuntimeError(
            f"cudaErrorInvalidValue: memcpy of {size} bytes at {what} {ptr:#x} runs "
            f"{ptr + size - region[1]} bytes past its {region[3]} allocation"
        )


def memcpyAsync(dst: int, src: int, size: int, kind: int, stream: int) -> None:
    """Queue a copy of ``size`` bytes on ``stream``; checks each side's memory kind and bounds now."""
    _count("memcpyAsync")
    if kind not in range(5):
        raise CUDARuntimeError(f"cudaErrorInvalidMemcpyDirection: {kind}")
    if size < 0:
        raise CUDARuntimeError(f"cudaErrorInvalidValue: size {size}")
    _side(src, size, kind in (memcpyDeviceToHost, memcpyDeviceToDevice), "src", kind)
    _side(dst, size, kind in (memcpyHostToDevice, memcpyDeviceToDevice), "dst", kind)
    _stream_of(stream).launch(lambda: ctypes.memmove(dst, src, size))


def memcpy(dst: int, src: int, size: int, kind: int) -> None:
    """A blocking copy: queued on the null stream, which then runs."""
    memcpyAsync(dst, src, size, kind, 0)
    _stream_of(0).synchronize()


class PointerAttributes:
    def __init__(self, type: int, device: int, devicePointer: int, hostPointer: int) -> None:
        self.type, self.device, self.devicePointer, self.hostPointer = (
            type,
            device,
            devicePointer,
            hostPointer,
        )


def pointerGetAttributes(ptr: int) -> PointerAttributes:
    _count("pointerGetAttributes")
    region = _memory.find(ptr)
    if region is None:
        return PointerAttributes(memoryTypeUnregistered, -2, 0, ptr)
    if region[3] == _memory.PINNED:
        return PointerAttributes(memoryTypeHost, 0, ptr, ptr)
    return PointerAttributes(memoryTypeDevice, region[2], ptr, 0)
