"""The front door's Python wrappers (``mpicomm/front/_doors.py``) are what their generator writes.

``python -m mpicomm.front.gen_doors`` writes one factory per public call from the hosts' parameters
and the calls' roles; ``front_door`` takes each call's wrapper from there. These fail when the
checked-in module drifts from what the generator writes (a host's parameters or a call's roles
changed without running it), and check what ``front_door`` does with a wrapper written for
something else.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

import mpicomm
from mpicomm.errors import ArgumentTypeError
from mpicomm.front import _doors, door, gen_doors

REGENERATE = "run python -m mpicomm.front.gen_doors"


def test_the_checked_in_wrappers_are_what_the_generator_writes() -> None:
    written = gen_doors.render(gen_doors.plans())
    assert Path(_doors.__file__) == gen_doors.TARGET
    assert gen_doors.TARGET.read_text() == written, f"mpicomm/front/_doors.py is out of date: {REGENERATE}"
    assert gen_doors.main(["--check"]) == 0


def test_every_public_call_has_its_wrapper_and_no_wrapper_is_left_over() -> None:
    import mpicomm.front.coalesced
    import mpicomm.front.collectives

    calls = {p.fn for p in gen_doors.plans()}
    assert {"all_reduce", "broadcast", "sendrecv", "jagged_all_to_all", "all_reduce_coalesced"} <= calls
    assert set(_doors.SHAPES) == calls
    for name in mpicomm.front.collectives.__all__:
        public = getattr(mpicomm, name)
        if hasattr(public, "__wrapped__") and name != "batch_isend_irecv":
            assert public.__name__ in calls, name
    assert mpicomm.front.coalesced  # imported for its calls


def test_a_check_that_finds_a_drift_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    stale = tmp_path / "_doors.py"
    stale.write_text(gen_doors.TARGET.read_text().replace("_push(_tok)", "_push(_tok)  # edited", 1))
    with mock.patch.object(gen_doors, "TARGET", stale):
        assert gen_doors.main(["--check"]) == 1
        assert REGENERATE in capsys.readouterr().out
        assert gen_doors.main([]) == 0
        assert gen_doors.main(["--check"]) == 0
    assert stale.read_text() == gen_doors.TARGET.read_text()


def host(tensor: Any, others: Any = None, group: Any = None, async_op: bool = False) -> str:
    return "done"


def test_a_wrapper_written_for_other_parameters_is_refused_by_name() -> None:
    plan = door._Plan("all_reduce", host, {"tensor": door.BOTH}, None, None, None, True)
    assert plan.shape != _doors.SHAPES["all_reduce"]
    with pytest.raises(RuntimeError, match=f"holds no wrapper of all_reduce for .*{REGENERATE}"):
        plan.python()
    missing = door._Plan("no_such_call", host, {"tensor": door.BOTH}, None, None, None, True)
    with pytest.raises(RuntimeError, match=f"no_such_call.*{REGENERATE}"):
        missing.python()
    with door.regenerating():  # as the generator imports the calls: a stand-in that refuses to run
        stand_in = missing.python()
    with pytest.raises(RuntimeError, match=REGENERATE):
        stand_in(np.zeros(2))
    assert not door._Regenerating.on


def _module_of(source: str, path: Path) -> Any:
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("mpicomm.front._test_doors_generated", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generator_writes_keyword_only_parameters_and_a_single_default(tmp_path: Path) -> None:
    seen: list[tuple[Any, ...]] = []

    def keyed(tensor: Any, *, async_op: bool = False) -> None:
        seen.append((tensor, async_op))

    plan = door._Plan("keyed", keyed, {"tensor": door.READ}, None, None, None, True)
    assert plan.shape == "(tensor, *, async_op=) arrays tensor, returns None"
    source = gen_doors.render([plan])
    assert "def keyed(tensor: Any, *, async_op: Any = _d_async_op) -> Any:" in source
    assert "(_d_async_op,) = plan.defaults" in source
    module = _module_of(source, tmp_path / "doors_keyed.py")
    with mock.patch.object(door, "_doors", module):
        wrapper = plan.python()
    mpicomm.init()
    x = np.zeros(2)
    assert wrapper(x) is None and wrapper(x, async_op=True) is None
    assert seen == [(x, False), (x, True)] and seen[0][0] is x
    with pytest.raises(ArgumentTypeError, match="keyed: async_op is 1; expected True or False"):
        wrapper(x, async_op=1)
    with pytest.raises(TypeError):
        wrapper(x, True)  # keyword-only, as the host's


def test_the_generator_refuses_a_parameter_its_wrapper_uses_itself() -> None:
    def clash(tensor: Any, _out: Any = None) -> None: ...

    plan = door._Plan("clash", clash, {"tensor": door.READ}, None, None, None, True)
    with pytest.raises(ValueError, match="clash has parameters \\['_out'\\]"):
        gen_doors.render([plan])


def test_a_wrappers_module_that_does_not_import_leaves_the_generator_a_way_in() -> None:
    """A ``_doors.py`` older than what it imports: calls are refused by name, and the generator still runs."""
    with mock.patch.object(door.importlib, "import_module", side_effect=ImportError("no name 'gone'")):
        module, why = door._load_doors()
    assert module is None and why == " (it does not import: no name 'gone')"
    plan = door._Plan("all_reduce", host, {"tensor": door.BOTH}, None, None, None, True)
    with (
        mock.patch.object(door, "_doors", None),
        mock.patch.object(door, "_DOORS_FAILED", why),
        pytest.raises(RuntimeError, match=f"does not import: no name 'gone'.*{REGENERATE}"),
    ):
        plan.python()
