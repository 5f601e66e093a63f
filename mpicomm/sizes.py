"""One parser of byte sizes (``"80GiB"``, ``"4M"``, ``4194304``) for the planner, the bench and staging.

Shared by the planner spec, the bench's ``--sizes`` and ``MPICOMM_STAGING_CHUNK``. Pure Python: no MPI,
no numpy.

Units are binary, as in Slurm and torchrec: ``K``/``KB``/``KiB`` are 1024 bytes, ``M``/``MB``/``MiB``
2**20, ``G`` 2**30, ``T`` 2**40; ``B`` or no unit means bytes. Case and a space before the unit do not
matter; a fraction (``"1.5G"``) must come to a whole number of bytes.
"""

from __future__ import annotations

import re

from .errors import ArgumentError, ArgumentTypeError

__all__ = ["format_size", "parse_size"]

# a pattern, compiled (and cached by re) on the first size parsed, not at import (issue 44)
_SIZE = r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgt]?)(i?b)?\s*"
_SHIFT = {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}
EXAMPLES = "4194304, 512K, 4M, 4MiB or 80GiB"


def parse_size(value: object, fn: str, arg: str) -> int:
    """Bytes from an int or a size string; never negative.

    Args:
        value: An int (bytes) or a string such as ``"80GiB"``, ``"4M"``, ``"512 KiB"``, ``"8"``.
        fn: The function or file the value belongs to, for the message.
        arg: The argument, key or variable, for the message.

    Returns:
        The number of bytes.

    Raises:
        ArgumentTypeError: ``value`` is neither an int nor a string (a bool, a float, None).
        ArgumentError: a string that is not a size, a negative int, or a fraction of a byte.

    Example:
        >>> parse_size("80GiB", "f", "x"), parse_size("4M", "f", "x"), parse_size(8, "f", "x")
        (85899345920, 4194304, 8)
        >>> parse_size("1.5 kb", "f", "x")
        1536
        >>> parse_size("banana", "spec", "ddr_cap")
        Traceback (most recent call last):
        ...
        mpicomm.errors.ArgumentError: spec: ddr_cap is 'banana'; expected a byte count such as ...
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ArgumentTypeError(
            f"{fn}: {arg} is {value!r}, a {type(value).__name__}; expected an int of bytes or a size such "
            f"as {EXAMPLES}"
        )
    if isinstance(value, int):
        if value < 0:
            raise ArgumentError(f"{fn}: {arg} is {value}; expected a byte count >= 0")
        return value
    m = re.fullmatch(_SIZE, value.replace("_", ""), re.IGNORECASE)
    if m is None:
        raise ArgumentError(f"{fn}: {arg} is {value!r}; expected a byte count such as {EXAMPLES}")
    number, unit = str(m[1]), str(m[2]).lower()
    if "." not in number:
        return int(number) << _SHIFT[unit]
    whole, _, frac = number.partition(".")
    scaled = (int(whole or "0") * 10 ** len(frac) + int(frac or "0")) << _SHIFT[unit]
    nbytes, rest = divmod(scaled, 10 ** len(frac))
    if rest:
        raise ArgumentError(f"{fn}: {arg} is {value!r}; expected a whole number of bytes")
    return int(nbytes)


def format_size(nbytes: int) -> str:
    """The shortest exact binary form: ``80GiB``, ``4MiB``, ``1536B``.

    Example:
        >>> format_size(85899345920), format_size(1536), format_size(0)
        ('80GiB', '1536B', '0B')
    """
    for shift, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if nbytes and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift}{unit}"
    return f"{nbytes}B"
