"""Slurm hostlist and tasks-per-node expansion, as scontrol show hostnames and Slurm's env give them."""

from __future__ import annotations

import pytest

from mpicomm.errors import ArgumentError, ArgumentTypeError
from mpicomm.planner import expand_hostlist, expand_tasks_per_node


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("gpu[01-04,07],login1", ["gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "login1"]),
        ("n[1-2]", ["n1", "n2"]),
        ("vm", ["vm"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
        ("a[1,3],b[2-3]x,c", ["a1", "a3", "b2x", "b3x", "c"]),
        (" n[1-1] ", ["n1"]),
    ],
)
def test_expand_hostlist(text: str, names: list[str]) -> None:
    assert expand_hostlist(text) == names


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("n[1-2", "unmatched '['"),
        ("n1-2]", "unmatched ']'"),
        ("n[[1]]", "nested brackets"),
        ("n[3-1]", "runs backwards"),
        ("n[a-b]", "has the range 'a-b'"),
        ("n1,,n2", "empty name"),
        ("", "hostlist is empty"),
    ],
)
def test_expand_hostlist_rejects_malformed_lists(text: str, words: str) -> None:
    with pytest.raises(ArgumentError) as info:
        expand_hostlist(text)
    assert str(info.value).startswith("expand_hostlist: ") and words in str(info.value)


def test_expand_hostlist_wants_a_string() -> None:
    with pytest.raises(ArgumentTypeError, match="hostlist is list; expected a string"):
        expand_hostlist(["n1"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "counts"),
    [("4(x2)", [4, 4]), ("8", [8]), ("2(x3),1", [2, 2, 2, 1]), ("3,4(x2),1", [3, 4, 4, 1])],
)
def test_expand_tasks_per_node(text: str, counts: list[int]) -> None:
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["4(2)", "x", "", "4(x)"])
def test_expand_tasks_per_node_rejects_other_text(text: str) -> None:
    with pytest.raises(ArgumentError, match="expected N or N\\(xM\\)"):
        expand_tasks_per_node(text)
