"""torch.distributed's backend names: ``Backend``, the deprecated ``reduce_op``, the ``is_*_available`` calls.

Every backend a torch program names (``"gloo"``, ``"nccl"``, ``"GLOO"``, ``"cpu:gloo,cuda:nccl"``, ...)
is served by MPI. The check of a name and the name a group keeps are :mod:`mpicomm.core.labels`'s
(:func:`mpicomm.new_group` checks its ``backend`` there, with nothing installed at run time);
``Backend.backend_list`` is that module's list.
"""

from __future__ import annotations

import warnings
from typing import Any, ClassVar

from .. import _mpi
from ..core.labels import BACKEND_NAMES, BackendWarning, backend_name, names_in
from ..core.reduce_op import ReduceOp
from ..errors import ArgumentError, ArgumentTypeError

__all__ = [
    "Backend",
    "BackendWarning",
    "backend_name",
    "is_available",
    "is_backend_available",
    "is_gloo_available",
    "is_mpi_available",
    "is_nccl_available",
    "is_ucc_available",
    "is_xccl_available",
    "reduce_op",
]


class Backend(str):
    """torch's ``Backend``: backend names as lower-case strings (``Backend.GLOO == "gloo"``).

    ``Backend(name)`` parses ``name`` as torch does: a known name in any case gives the lower-case
    constant, anything else the lower-cased string. Every one of them runs on MPI in mpicomm.

    Example:
        >>> from mpicomm import Backend
        >>> Backend("GLOO") == Backend.GLOO == "gloo"
        True
        >>> Backend.NCCL
        'nccl'
    """

    UNDEFINED: ClassVar[str] = "undefined"
    GLOO: ClassVar[str] = "gloo"
    NCCL: ClassVar[str] = "nccl"
    UCC: ClassVar[str] = "ucc"
    MPI: ClassVar[str] = "mpi"
    XCCL: ClassVar[str] = "xccl"
    FAKE: ClassVar[str] = "fake"
    backend_list: ClassVar[list[str]] = BACKEND_NAMES  # core's list: new_group checks names against it
    default_device_backend_map: ClassVar[dict[str, str]] = {
        "cpu": GLOO,
        "cuda": NCCL,
        "xpu": XCCL,
        "mps": GLOO,
    }

    def __new__(cls, name: str) -> Backend:
        """Parse ``name`` (any case) into a backend name.

        Raises:
            ArgumentError: ``name`` is not a string (torch raises ValueError too).
        """
        if not isinstance(name, str):
            raise ArgumentError(f"Backend: name is {name!r}; expected a string such as 'gloo' or 'mpi'")
        return super().__new__(cls, name.lower())


def is_available() -> bool:
    """Whether mpicomm can communicate: mpi4py imports (starts nothing).

    Example:
        >>> import mpicomm
        >>> mpicomm.is_available()
        True
    """
    try:
        _mpi.load()
    except ImportError:
        return False
    return True


def is_mpi_available() -> bool:
    """Whether the MPI backend is available; the same as :func:`is_available` (MPI is the only one).

    Example:
        >>> import mpicomm
        >>> mpicomm.is_mpi_available()
        True
    """
    return is_available()


def is_backend_available(backend: str) -> bool:
    """Whether mpicomm serves ``backend`` (torch's ``is_backend_available``).

    True for every name torch knows (``Backend.backend_list``, ``"undefined"`` too, as torch answers),
    device lists included, where MPI is available (every one runs on MPI); False for any other name.

    Raises:
        ArgumentTypeError: ``backend`` is not a string.

    Example:
        >>> import mpicomm
        >>> mpicomm.is_backend_available("cpu:gloo,cuda:nccl"), mpicomm.is_backend_available("tcp")
        (True, False)
    """
    if not isinstance(backend, str):
        raise ArgumentTypeError(
            f"is_backend_available: backend is {backend!r}; expected a str such as 'gloo'"
        )
    names = names_in(backend.strip().lower())
    return names is not None and is_available()


def is_gloo_available() -> bool:
    """True where MPI is available: mpicomm serves the ``gloo`` name on MPI (torch's function of that name).

    Example:
        >>> import mpicomm
        >>> mpicomm.is_gloo_available()
        True
    """
    return is_available()


def is_nccl_available() -> bool:
    """True where MPI is available: mpicomm serves the ``nccl`` name on MPI, CUDA arrays included.

    CUDA arrays go through CUDA-aware MPI or are staged through the host (see docs/gpu.rst).

    A program that picks ``"nccl"`` when this is True gets MPI under that name; :func:`get_backend`
    answers ``"nccl"``.

    Example:
        >>> import mpicomm
        >>> mpicomm.is_nccl_available()
        True
    """
    return is_available()


def is_ucc_available() -> bool:
    """True where MPI is available: mpicomm serves the ``ucc`` name on MPI.

    Example:
        >>> import mpicomm
        >>> mpicomm.is_ucc_available()
        True
    """
    return is_available()


def is_xccl_available() -> bool:
    """True where MPI is available: mpicomm serves the ``xccl`` name on MPI.

    Example:
        >>> import mpicomm
        >>> mpicomm.is_xccl_available()
        True
    """
    return is_available()


class _ReduceOpAlias:
    """torch's deprecated ``reduce_op``: ``reduce_op.SUM`` is ``ReduceOp.SUM``, with a FutureWarning."""

    _NAMES = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG", "PREMUL_SUM")

    def __getattr__(self, name: str) -> Any:
        if name not in self._NAMES:
            raise AttributeError(f"reduce_op has no member {name!r}; expected one of {list(self._NAMES)}")
        warnings.warn(
            "reduce_op is deprecated (as in torch.distributed); use ReduceOp instead",
            FutureWarning,
            stacklevel=2,
        )
        return getattr(ReduceOp, name)

    def __repr__(self) -> str:
        return "mpicomm.reduce_op"


#: torch's deprecated alias of :class:`~mpicomm.ReduceOp`.
reduce_op = _ReduceOpAlias()
