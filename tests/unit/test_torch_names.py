"""torch's names that need no communication: Backend parsing, backend_name's rules and its one
warning, the deprecated reduce_op, DebugLevel from the environment, and Future chaining."""

from __future__ import annotations

import warnings

import pytest

import mpicomm
from mpicomm.c10d.backend_names import backend_name
from mpicomm.core import labels  # the name check (and its warn-once flag) lives in core


def test_backend_parses_any_case_to_the_lower_case_name():
    assert mpicomm.Backend("GLOO") == "gloo" == mpicomm.Backend.GLOO
    assert mpicomm.Backend("Nccl") == mpicomm.Backend.NCCL and isinstance(mpicomm.Backend("mpi"), str)
    with pytest.raises(ValueError, match="Backend: name is 3; expected a string"):
        mpicomm.Backend(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("given", "name"),
    [
        (None, "mpi"),
        ("mpi", "mpi"),
        ("GLOO", "gloo"),
        ("nccl", "nccl"),
        ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl"),
    ],
)
def test_backend_name_keeps_torchs_names_lower_cased(given, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mpicomm.BackendWarning)
        assert backend_name(given, "init_process_group") == name


@pytest.mark.parametrize("given", ["nosuch", "gloo,nccl", "cpu:nosuch"])
def test_backend_name_refuses_unknown_names(given):
    with pytest.raises(mpicomm.ArgumentError, match=rf"new_group: backend is '{given}'; expected one of"):
        backend_name(given, "new_group")
    with pytest.raises(mpicomm.ArgumentTypeError, match="new_group: backend is 7; expected a str"):
        backend_name(7, "new_group")


def test_a_name_other_than_mpi_warns_once_per_process(monkeypatch):
    monkeypatch.setattr(labels._Warned, "once", False)
    with pytest.warns(mpicomm.BackendWarning, match="backend 'gloo' is served by MPI"):
        backend_name("gloo", "init_process_group")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        backend_name("nccl", "new_group")  # already warned: silent
        backend_name("mpi", "new_group")


def test_reduce_op_is_the_deprecated_alias_of_reduce_op():
    with pytest.warns(FutureWarning, match="reduce_op is deprecated"):
        assert mpicomm.reduce_op.MAX is mpicomm.ReduceOp.MAX
    with pytest.raises(AttributeError, match="reduce_op has no member 'MEAN'"):
        _ = mpicomm.reduce_op.MEAN


def test_debug_level_follows_the_environment(monkeypatch):
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "info")
    mpicomm.set_debug_level_from_env()
    assert mpicomm.get_debug_level() is mpicomm.DebugLevel.INFO
    monkeypatch.setenv("TORCH_DISTRIBUTED_DEBUG", "LOUD")
    with pytest.raises(
        mpicomm.ArgumentError, match="TORCH_DISTRIBUTED_DEBUG is 'LOUD'; expected OFF, INFO or DETAIL"
    ):
        mpicomm.set_debug_level_from_env()
    mpicomm.set_debug_level(mpicomm.DebugLevel.OFF)
    assert mpicomm.get_debug_level() is mpicomm.DebugLevel.OFF


def test_future_then_runs_callbacks_in_order_and_passes_errors():
    first = mpicomm.Future()
    first.set_result([1, 2])
    assert first.done() and first.value() == [1, 2]
    chained = first.then(lambda f: [x * 3 for x in f.wait()]).then(lambda f: sum(f.value()))
    assert chained.wait() == 9

    def boom(f: mpicomm.Future) -> None:
        raise KeyError("no")

    failed = first.then(boom).then(lambda f: "never")
    with pytest.raises(KeyError, match="no"):
        failed.wait()
