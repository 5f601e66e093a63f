"""torch's ProcessGroup methods attach on first use, by name (mpicomm.core.late)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mpicomm
from mpicomm.core.late import LateMethods


def test_the_late_names_are_exactly_the_methods_pg_methods_attaches() -> None:
    from mpicomm.c10d import pg_methods

    assert set(mpicomm._TORCH_GROUP_METHODS) == set(pg_methods.METHODS)


def test_a_group_class_has_no_getattr_hook() -> None:
    # a __getattr__ anywhere on the class costs every attribute read of every group
    assert not any("__getattr__" in vars(k) for k in mpicomm.ProcessGroup.__mro__)
    assert issubclass(mpicomm.ProcessGroup, LateMethods)


@pytest.mark.process
def test_import_mpicomm_attaches_nothing_until_a_torch_method_is_read() -> None:
    code = (
        "import sys, mpicomm\n"
        "assert 'mpicomm.c10d.pg_methods' not in sys.modules\n"
        "g = mpicomm.ProcessGroup\n"
        "assert 'allreduce' not in vars(g)\n"
        "assert callable(g.allreduce)\n"  # the class-level read runs the loader
        "assert 'mpicomm.c10d.pg_methods' in sys.modules and 'allreduce' in vars(g)\n"
        "assert g.allreduce is vars(g)['allreduce'] and callable(g.broadcast)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
