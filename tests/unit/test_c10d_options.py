"""The one translation of c10d's options both torch adapters share (mpicomm.c10d.options)."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist

from mpicomm import ReduceOp
from mpicomm.c10d import options, pg_methods, registered
from mpicomm.errors import ArgumentError, ArgumentTypeError

_NAMES = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR")


@pytest.mark.parametrize("name", _NAMES)
def test_every_torch_reduction_in_every_form_is_ours(name: str) -> None:
    ours = getattr(ReduceOp, name)
    kind = getattr(dist.ReduceOp.RedOpType, name)
    for form in (ours, kind, dist.ReduceOp(kind), name, name.lower()):
        assert options.reduction(form, "f") is ours, form


def test_premul_sum_keeps_its_factor_as_a_number_or_a_tensor() -> None:
    for factor in (2.5, torch.tensor(2.5)):
        op = dist._make_nccl_premul_sum(factor)
        got = options.reduction(op, "f")
        assert got == ReduceOp.PREMUL_SUM(2.5), got
    with pytest.raises(ArgumentTypeError, match=r"f: op is .*PREMUL_SUM made with its factor"):
        options.reduction(dist.ReduceOp.RedOpType.PREMUL_SUM, "f")


def test_a_non_reduction_is_refused_by_name() -> None:
    for bad in ("median", 3, object()):
        with pytest.raises(ArgumentTypeError, match=r"ProcessGroup.allreduce: op is .*; expected a ReduceOp"):
            pg_methods._op(bad, None, "allreduce")


def test_both_adapters_read_options_through_the_one_translation() -> None:
    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    assert registered._reduction(opts) is pg_methods._op(None, opts, "x") is ReduceOp.MAX
    opts.reduceOp = dist.ReduceOp.SUM
    assert registered._reduction(opts) is ReduceOp.SUM


def test_roots_from_options_the_value_or_the_default() -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 2
    assert (options.root(opts), options.root(1), options.root(None, 3), options.root(True, 4)) == (2, 1, 3, 4)


def test_barrier_timeout_unset_in_torch_options_falls_back() -> None:
    opts = dist.BarrierOptions()
    assert options.barrier_timeout(opts, 7.0) == 7.0  # torch's unset timeout is not a bound
    opts.timeout = datetime.timedelta(seconds=3)
    assert options.barrier_timeout(opts, 7.0) == datetime.timedelta(seconds=3)
    opts.timeout = datetime.timedelta(days=10**6)
    assert options.barrier_timeout(opts) == options.LONGEST_TIMEOUT


def test_huge_timeouts_are_clamped_and_bad_ones_refused() -> None:
    huge = datetime.timedelta(days=10**6)
    assert options.clamped(huge) == options.LONGEST_TIMEOUT
    assert options.clamped(datetime.timedelta(seconds=5)) == datetime.timedelta(seconds=5)
    assert options.seconds(huge, "f") == options.LONGEST_TIMEOUT.total_seconds()
    assert options.seconds(None, "f") is None and options.seconds(2, "f") == 2.0
    with pytest.raises(ArgumentTypeError, match="f: timeout is 'x'"):
        options.seconds("x", "f")


def test_core_checks_backend_names_itself_with_nothing_installed_at_run_time() -> None:
    from mpicomm.c10d import backend_names
    from mpicomm.core import groups, labels

    assert not hasattr(groups, "_Labels")  # issue 40: the torch room patched core's check at import
    assert groups.check_backend.__globals__["backend_name"] is labels.backend_name
    assert backend_names.Backend.backend_list is labels.BACKEND_NAMES
    assert groups.check_backend("CPU:GLOO,cuda:nccl", "f") == "cpu:gloo,cuda:nccl"
    with pytest.raises(ArgumentError, match="f: backend is 'bogus'; expected one of"):
        groups.check_backend("bogus", "f")
