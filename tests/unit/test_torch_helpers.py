"""torch's small helpers, checked against torch itself where torch answers the same question:
supports_complex, get_pg_count, is_torchelastic_launched, the DistError classes, and
is_backend_available for single names (for device lists torch asks about NCCL itself, which its CPU
wheel lacks; mpicomm serves every name on MPI). tests/mpi/test_timeouts.py catches a real timeout as a
DistBackendError."""

from __future__ import annotations

import numpy as np
import pytest

import mpicomm

torch_dist = pytest.importorskip("torch.distributed")

OPS = ["SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG"]


@pytest.mark.parametrize("name", OPS)
def test_supports_complex_says_what_all_reduce_does_on_complex_arrays(name):
    op = getattr(mpicomm.ReduceOp, name)
    x = np.array([1 + 2j, 3 - 1j])
    try:
        mpicomm.all_reduce(x, op=op)
        reduced = True
    except mpicomm.ReductionTypeError:
        reduced = False
    assert mpicomm.supports_complex(op) is reduced
    # torch's own answer, where torch's backends and MPI agree (PRODUCT: MPI has it, torch refuses)
    if name != "PRODUCT":
        assert reduced is torch_dist.supports_complex(getattr(torch_dist.ReduceOp, name))
    premul = mpicomm.ReduceOp.PREMUL_SUM(2.0)
    assert mpicomm.supports_complex(premul)


def test_supports_complex_refuses_what_is_not_a_reduce_op():
    with pytest.raises(mpicomm.ArgumentTypeError, match="supports_complex: reduceOp is 'sum'; expected"):
        mpicomm.supports_complex("sum")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "name",
    ["gloo", "NCCL", "mpi", "ucc", "xccl", "undefined", "cpu:gloo,cuda:nccl", "cuda:nccl"],
    ids=lambda name: f"name={name}",  # an id "mpi" would make pytest-mpi skip it as an MPI test
)
def test_every_name_torch_knows_is_available_on_mpi(name):
    assert mpicomm.is_backend_available(name) is True
    if ":" not in name:
        assert name.lower() in torch_dist.Backend.backend_list


@pytest.mark.parametrize("name", ["tcp", "gloo,nccl", "cpu:tcp"])
def test_a_name_torch_does_not_serve_is_not_available_as_in_torch(name):
    assert mpicomm.is_backend_available(name) is False
    if ":" not in name and "," not in name:
        assert torch_dist.is_backend_available(name) is False


def test_is_backend_available_names_a_bad_argument():
    with pytest.raises(mpicomm.ArgumentTypeError, match="is_backend_available: backend is 3; expected a str"):
        mpicomm.is_backend_available(3)  # type: ignore[arg-type]


def test_the_per_backend_questions_answer_whether_mpi_is_there():
    answers = [
        f()
        for f in (
            mpicomm.is_gloo_available,
            mpicomm.is_nccl_available,
            mpicomm.is_ucc_available,
            mpicomm.is_xccl_available,
        )
    ]
    assert answers == [mpicomm.is_available()] * 4 == [True] * 4


def test_get_pg_count_counts_the_live_groups():
    world = mpicomm.init()
    start = mpicomm.get_pg_count()
    assert start >= 1 and world in mpicomm.core.groups._State.groups
    a, b = mpicomm.new_group(), mpicomm.new_node_group()
    assert mpicomm.get_pg_count() == start + 2
    mpicomm.destroy_process_group(a)
    assert mpicomm.get_pg_count() == start + 1
    mpicomm.destroy_process_group(b)
    assert mpicomm.get_pg_count() == start


@pytest.mark.parametrize("value", [None, "", "job-7"])
def test_is_torchelastic_launched_reads_the_variable_torch_reads(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    else:
        monkeypatch.setenv("TORCHELASTIC_RUN_ID", value)
    assert mpicomm.is_torchelastic_launched() is torch_dist.is_torchelastic_launched() is (value is not None)


def test_dist_error_classes_stand_where_torchs_do():
    for ours, theirs in [
        (mpicomm.DistError, torch_dist.DistError),
        (mpicomm.DistBackendError, torch_dist.DistBackendError),
        (mpicomm.DistNetworkError, torch_dist.DistNetworkError),
        (mpicomm.DistStoreError, torch_dist.DistStoreError),
    ]:
        bases = {b.__name__ for b in theirs.__mro__} & {"DistError", "RuntimeError", "Exception"}
        assert bases <= {b.__name__ for b in ours.__mro__}, ours
        assert issubclass(ours, mpicomm.MpicommError)
    assert issubclass(mpicomm.CommunicationError, mpicomm.DistBackendError)
