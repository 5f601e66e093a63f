"""The hpc bench says when mpicomm's start-up row includes compiling its modules (no cached bytecode)."""

from __future__ import annotations

import compileall
import os
from pathlib import Path

from mpicomm.apps.bench.hpc import uncompiled

NAMES = ["__init__.py", "_mpi.py", "errors.py", "core/groups.py", "core/validation.py"]


def test_modules_without_bytecode_are_named_until_compiled_and_again_once_stale(tmp_path: Path) -> None:
    for name in NAMES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x = 1\n")
    assert uncompiled(str(tmp_path)) == NAMES
    assert compileall.compile_dir(str(tmp_path), quiet=1)
    assert uncompiled(str(tmp_path)) == []
    source = tmp_path / "core/groups.py"
    later = os.path.getmtime(source) + 10
    os.utime(source, (later, later))  # edited after it was compiled: its bytecode is stale
    assert uncompiled(str(tmp_path)) == ["core/groups.py"]
