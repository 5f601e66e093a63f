"""The front door: every public call that takes arrays, for every array kind users hold.

- ``collectives``: the public calls (``all_reduce``, ``all_to_all_single``, ``send``, ...,
  ``batch_isend_irecv``, ``jagged_all_to_all``), each a host implementation behind the door.
- ``coalesced``: ``all_reduce_coalesced`` and ``all_gather_coalesced`` (torch's signatures).
- ``sparse``: ``all_reduce_sparse``: torch sparse COO tensors summed by gathering indices and
  values, then coalescing (as torch's Gloo does in ``all_reduce``).
- ``door``: ``front_door``, the one wrapper: array kinds recognised once, viewed for the data
  paths, the path chosen, results in the caller's kind, failures alike on every rank. Its Python
  wrappers are in ``_doors`` (written by ``gen_doors``: ``python -m mpicomm.front.gen_doors``),
  what they call in ``door_parts``, its C form in ``_door.c`` (the extension ``_door``).
- ``kinds``: what an array is (numpy, torch, cupy, ``__array_interface__``,
  ``__cuda_array_interface__``, DLPack) and its zero-copy view; imports neither torch nor cupy.
- ``device``: device arrays to the direct (CUDA-aware MPI) or staged (pinned host) path.
- ``objects``: the GPU hooks of the object collectives (device arrays inside objects travel as
  device buffers, direct or staged), which :func:`mpicomm.wiring.objects` gives them.

May import: the data paths (``mpicomm.dense``, ``mpicomm.jagged``, ``mpicomm.objects``,
``mpicomm.gpu``), ``mpicomm.core``, ``mpicomm.errors``. Nothing above it imports it but
``mpicomm/__init__.py``, the torch room (``mpicomm.c10d``) and the programs in ``mpicomm.apps``.
"""

from typing import Any as _Any

from ..core import engine_gate as _gate


def _precheck(fn: str, signature: _Any, args: tuple[_Any, ...], kw: dict[str, _Any]) -> None:
    """An asynchronous call's arguments, checked before it is queued (:mod:`mpicomm.front.prechecks`).

    Handed to the engine here, where every door (collectives, coalesced) passes first; the checks
    load with the first asynchronous call.
    """
    from .prechecks import check

    check(fn, signature, args, kw)


def _message(fn: str, signature: _Any, args: tuple[_Any, ...], kw: dict[str, _Any]) -> _Any:
    """A blocking send/recv as the engine's in-MPI lane takes it (:mod:`mpicomm.front.lane_message`)."""
    from .lane_message import message

    return message(fn, signature, args, kw)


_gate.precheck(_precheck, _message)
