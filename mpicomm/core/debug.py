"""torch.distributed's debug level: ``DebugLevel``, ``get_debug_level``, ``set_debug_level(_from_env)``.

torch reads ``TORCH_DISTRIBUTED_DEBUG`` (``OFF``, ``INFO``, ``DETAIL``) to add checks and logs to its
collectives. mpicomm keeps the level so that programs (and torch's tests) that read or set it run
unchanged; mpicomm's own cross-rank checks are switched by validation mode
(:func:`~mpicomm.set_validation`, ``MPICOMM_VALIDATE``), and ``DETAIL`` turns that on too.
"""

from __future__ import annotations

import enum
import os

from ..errors import ArgumentError
from . import validation

__all__ = ["DebugLevel", "get_debug_level", "set_debug_level", "set_debug_level_from_env"]


class DebugLevel(enum.Enum):
    """torch's ``DebugLevel``: OFF, INFO or DETAIL.

    Example:
        >>> from mpicomm import DebugLevel
        >>> DebugLevel["DETAIL"].name
        'DETAIL'
    """

    OFF = 0
    INFO = 1
    DETAIL = 2


class _Level:
    level = DebugLevel.OFF
    # whether DETAIL turned validation mode on (so that OFF turns it off again)
    validating = False


def get_debug_level() -> DebugLevel:
    """The current debug level (torch's ``get_debug_level``).

    Example:
        >>> import mpicomm
        >>> mpicomm.get_debug_level() in list(mpicomm.DebugLevel)
        True
    """
    return _Level.level


def set_debug_level(level: DebugLevel) -> None:
    """Set the debug level; ``DETAIL`` also turns mpicomm's validation mode on.

    Args:
        level: A :class:`DebugLevel`.

    Raises:
        ArgumentError: ``level`` is not a DebugLevel.

    Example:
        >>> import mpicomm
        >>> mpicomm.set_debug_level(mpicomm.DebugLevel.OFF)
    """
    if not isinstance(level, DebugLevel):
        raise ArgumentError(f"set_debug_level: level is {level!r}; expected a mpicomm.DebugLevel")
    _Level.level = level
    if level is DebugLevel.DETAIL and not validation.is_validation_enabled():
        validation.set_validation(True)
        _Level.validating = True
    elif level is not DebugLevel.DETAIL and _Level.validating:
        validation.set_validation(False)
        _Level.validating = False


def set_debug_level_from_env() -> None:
    """Set the debug level from ``TORCH_DISTRIBUTED_DEBUG`` (unset: OFF), as torch does.

    Raises:
        ArgumentError: the variable holds another word.

    Example:
        >>> import mpicomm
        >>> mpicomm.set_debug_level_from_env()
    """
    word = os.environ.get("TORCH_DISTRIBUTED_DEBUG", "OFF").strip().upper() or "OFF"
    if word not in DebugLevel.__members__:
        raise ArgumentError(
            f"set_debug_level_from_env: TORCH_DISTRIBUTED_DEBUG is {word!r}; expected OFF, INFO or DETAIL"
        )
    set_debug_level(DebugLevel[word])
