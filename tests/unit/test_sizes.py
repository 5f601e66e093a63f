"""One size parser (mpicomm.sizes) for the planner spec, the bench's --sizes and MPICOMM_STAGING_CHUNK."""

from __future__ import annotations

import argparse

import pytest

from mpicomm.apps.bench.harness import parse_size as bench_size
from mpicomm.errors import ArgumentError, ArgumentTypeError
from mpicomm.gpu.staging import chunk_bytes
from mpicomm.planner.io import parse_spec
from mpicomm.sizes import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "nbytes"),
    [
        ("80GiB", 80 << 30),
        ("80G", 80 << 30),
        ("80GB", 80 << 30),
        ("4M", 4 << 20),
        ("4 mib", 4 << 20),
        ("512K", 512 << 10),
        ("1T", 1 << 40),
        ("8", 8),
        ("8B", 8),
        ("1_048_576", 1 << 20),
        ("1.5K", 1536),
        (".5M", 512 << 10),
        (0, 0),
        (12345, 12345),
    ],
)
def test_sizes_in_binary_units(text: object, nbytes: int) -> None:
    assert parse_size(text, "f", "x") == nbytes


@pytest.mark.parametrize("text", ["banana", "", "4X", "-1K", "4 M B", "1.0001K", "0x10", "K"])
def test_bad_sizes_name_the_function_argument_and_value(text: str) -> None:
    with pytest.raises(ArgumentError, match=r"^f: x is ") as info:
        parse_size(text, "f", "x")
    assert repr(text) in str(info.value)


@pytest.mark.parametrize("value", [True, 1.5, None, [1]])
def test_non_sizes_are_type_errors(value: object) -> None:
    with pytest.raises(ArgumentTypeError, match=r"^f: x is .*expected an int of bytes or a size"):
        parse_size(value, "f", "x")


def test_negative_ints_are_refused() -> None:
    with pytest.raises(ArgumentError, match=r"^f: x is -1; expected a byte count >= 0"):
        parse_size(-1, "f", "x")


def test_format_round_trips() -> None:
    for n in (0, 1, 1023, 1024, 3 << 20, 80 << 30, 5 << 40):
        assert parse_size(format_size(n), "f", "x") == n


def test_the_three_users_share_it() -> None:
    assert bench_size("64K") == 64 << 10 and bench_size("1.5K") == 1536
    with pytest.raises(argparse.ArgumentTypeError, match="multiple of 4"):
        bench_size("6")
    assert chunk_bytes({"MPICOMM_STAGING_CHUNK": "80KiB"}) == 80 << 10
    spec = parse_spec(
        {
            "topology": {"world_size": 2, "compute_device": "cuda", "hbm_cap": "80GiB", "ddr_cap": "512G"},
            "options": [
                {"name": "t", "partition_by": "device", "num_shards": 2, "hbm": "4M", "ddr": 0},
                {"name": "u", "partition_by": "device", "shards": [{"hbm": "1GiB", "perf": 1}]},
            ],
        }
    )
    assert spec.topology.hbm_cap == 80 << 30 and spec.topology.ddr_cap == 512 << 30
    assert spec.options[0].total_storage.hbm == 8 << 20
    assert spec.options[1].shards[0].storage.hbm == 1 << 30


def test_a_bad_size_in_a_spec_names_the_file_and_key() -> None:
    doc = {"topology": {"world_size": 1, "ddr_cap": "lots"}, "options": []}
    with pytest.raises(
        ArgumentError, match=r"^spec.toml: \[topology\] ddr_cap is 'lots'; expected a byte count"
    ):
        parse_spec(doc, "spec.toml")
    doc = {
        "topology": {"world_size": 1},
        "options": [{"name": "t", "partition_by": "device", "num_shards": 1, "ddr": "2Q"}],
    }
    with pytest.raises(ArgumentError, match=r"^spec.toml: options\[0\].ddr is '2Q'"):
        parse_spec(doc, "spec.toml")
