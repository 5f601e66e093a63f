"""The front door's C form (``mpicomm/front/_door.c``) serves numpy calls as the Python one does.

Each test builds both forms of one door around the same host (``_Plan.python``, the wrapper
``python -m mpicomm.front.gen_doors`` writes for it, and ``_Plan.in_c``) and holds them to the same
results: the arguments the host sees, the watchdog's token while it runs, what a failure raises,
and every call that the C form hands to the Python one (other array kinds, a bad ``async_op``, a
missing argument, another thread).
"""

from __future__ import annotations

import copy
import functools
import gc
import importlib.util
import inspect
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest

import mpicomm
from mpicomm import _mpi
from mpicomm.core import watchdog
from mpicomm.errors import ArgumentError, ArgumentTypeError, CommunicationError, DistError
from mpicomm.front import _doors, door, gen_doors

pytestmark = pytest.mark.skipif(
    not door._c_doors(),
    reason="the C module is not built (or MPICOMM_C=0): the Python wrapper serves every call",
)


class Probe:
    """A host that records what it was given and which tokens were live while it ran."""

    def __init__(self, raises: BaseException | None = None) -> None:
        self.raises = raises
        self.seen: list[tuple[Any, ...]] = []

    def host(self, tensor: Any, others: Any = None, group: Any = None, async_op: bool = False) -> str:
        live = [t for t in watchdog._live if t[1].name == "probe"]
        self.seen.append((tensor, others, group, async_op, live))
        if self.raises is not None:
            raise self.raises
        return "done"


def python_form(plan: Any, folder: Path) -> Callable[..., Any]:
    """``plan``'s Python wrapper, written by the generator into a module as ``_doors`` is."""
    path = folder / f"doors_{plan.fn}.py"
    path.write_text(gen_doors.render([plan]))
    # a module of mpicomm.front by name, wherever its file is: its relative imports are _doors' own
    spec = importlib.util.spec_from_file_location(f"mpicomm.front._test_doors_{plan.fn}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with mock.patch.object(door, "_doors", module):
        python: Callable[..., Any] = plan.python()
    return python


def both(probe: Probe) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The Python wrapper and the C door of the call ``probe`` around ``probe.host``."""
    roles = {"tensor": door.BOTH, "others": door.READ}
    plan = door._Plan("probe", probe.host, roles, None, None, None, True, None)
    python = python_form(plan, _Written.folder)
    c = plan.in_c(python)
    assert c is not None
    return python, c


class _Written:
    folder = Path()  # where python_form writes, the test's own tmp_path


@pytest.fixture(autouse=True)
def _started(tmp_path: Path) -> None:
    mpicomm.init()
    _Written.folder = tmp_path


def test_the_c_door_is_built_beside_the_front_door_and_the_python_wrappers_are_in_doors() -> None:
    from mpicomm.core import _cmpi  # type: ignore[attr-defined]
    from mpicomm.front import _door  # type: ignore[attr-defined]

    assert type(mpicomm.all_reduce) is _door.Door and _door.Door.__module__ == "mpicomm.front._door"
    assert not hasattr(_cmpi, "door")  # core keeps the MPI calls only
    for name, plan in door._PLANS.items():
        if not plan.host.__module__.startswith("mpicomm."):
            continue
        code = plan.python().__code__
        assert code.co_name == name and code.co_filename == _doors.__file__, name
        assert code.co_firstlineno > 1 and inspect.getsourcefile(getattr(_doors, name)) == _doors.__file__


def test_the_public_calls_are_c_doors_with_the_face_of_their_host() -> None:
    for name in ("all_reduce", "broadcast", "sendrecv", "all_gather", "jagged_all_to_all"):
        call = getattr(mpicomm, name)
        host = inspect.unwrap(call)
        assert type(call).__name__ == "Door", name
        assert inspect.isroutine(call) and callable(call), name
        assert inspect.signature(call) == inspect.signature(host), name
        assert (call.__name__, call.__doc__, call.__module__) == (
            host.__name__,
            host.__doc__,
            host.__module__,
        )
        assert f"<function {name} " in repr(call)
        assert inspect.getsource(call) == inspect.getsource(host)
        assert copy.copy(call) is call and copy.deepcopy({"call": call})["call"] is call


def test_a_door_whose_name_is_not_a_str_still_has_a_repr() -> None:
    _, c = both(Probe())
    functools.update_wrapper(c, Probe.host)
    for name in (5, b"probe", None):
        c.__qualname__ = name
        assert repr(c) == "<function (mpicomm front door)>"
        with pytest.raises(TypeError, match="__qualname__"):
            copy.copy(c)
    c.__qualname__ = "probe"
    assert repr(c) == "<function probe (mpicomm front door)>" and copy.copy(c) is c


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((), {}),
        ((None,), {}),
        ((), {"others": [np.zeros(1)], "async_op": True}),
        ((None, "g"), {"async_op": False}),
        ((), {"group": "g"}),
    ],
)
def test_a_numpy_call_reaches_the_host_with_the_same_arguments_and_a_live_token(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    x = np.arange(3.0)
    seen = []
    for form in both(probe := Probe()):
        assert form(x, *args, **kwargs) == "done"
        seen.append(probe.seen.pop())
        assert not [t for t in watchdog._live if t[1].name == "probe"]  # the token left with the call
    (py, c) = seen
    assert py[0] is x and c[0] is x
    for a, b in zip(py[1:4], c[1:4], strict=True):
        assert a is b or (isinstance(a, list) and a == b)
    group = kwargs.get("group", args[1] if len(args) > 1 else None)
    for live in (py[4], c[4]):  # one token, of this thread, naming the group
        assert len(live) == 1
        assert live[0][0] == threading.get_ident() and live[0][2] == group and live[0][3] is None


def test_calls_the_c_door_does_not_serve_get_the_python_wrappers_answer() -> None:
    torch = pytest.importorskip("torch")
    python, c = both(probe := Probe())
    t = torch.arange(3.0)
    assert c(t) == "done"  # a torch tensor: seen by the host as its numpy view
    got = probe.seen.pop()[0]
    assert type(got) is np.ndarray and got.ctypes.data == t.data_ptr()
    assert c(np.zeros(2), [t]) == "done"  # a list holding a tensor
    for bad in ({"async_op": 1}, {"async_op": None}):
        with pytest.raises(ArgumentTypeError) as in_python:
            python(np.zeros(2), **bad)
        with pytest.raises(ArgumentTypeError) as in_c:
            c(np.zeros(2), **bad)
        assert (
            str(in_c.value)
            == str(in_python.value)
            == f"probe: async_op is {bad['async_op']!r}; expected True or False"
        )
    with pytest.raises(TypeError) as missing:
        c()
    assert "tensor" in str(missing.value)
    with pytest.raises(TypeError):
        c(np.zeros(2), 1, 2, 3, 4)  # too many arguments
    with pytest.raises(TypeError):
        c(np.zeros(2), nonsense=1)


@pytest.mark.parametrize("kind", ["argument", "mpi-error", "interrupt"])
def test_a_failing_host_raises_what_the_python_wrapper_raises_and_its_token_leaves(kind: str) -> None:
    MPI = _mpi.MPI
    made: dict[str, Callable[[], BaseException]] = {
        "argument": lambda: ArgumentError("probe: tensor is wrong; expected right"),
        "mpi-error": lambda: MPI.Exception(MPI.ERR_OTHER),
        "interrupt": lambda: KeyboardInterrupt(),
    }
    raised = []
    for form in both(Probe(raises=(error := made[kind]()))):
        with pytest.raises(BaseException) as info:
            try:  # called while the caller handles an error of its own: the context stays the call's
                raise ValueError("the caller's")
            except ValueError:
                form(np.zeros(2), async_op=False)
        raised.append(info.value)
        assert not [t for t in watchdog._live if t[1].name == "probe"]
    py, c = raised
    assert type(py) is type(c) and str(py) == str(c)
    if kind == "mpi-error":
        assert isinstance(c, CommunicationError) and c.__cause__ is error
        assert py.__context__ is c.__context__ is error
        assert str(c).startswith("probe: MPI reported an error")
    else:
        assert c is error
        assert type(c.__context__) is ValueError  # raised as it came, with the caller's as context


def test_a_call_from_another_thread_below_multiple_is_refused_by_both(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # below MPI_THREAD_MULTIPLE the calls belong to the thread that started MPI (this one, here)
    monkeypatch.setattr(watchdog._Threads, "owner", threading.get_ident())
    monkeypatch.setattr(watchdog._Threads, "level", "serialized")
    errors: list[str] = []

    def call(form: Callable[..., Any]) -> None:
        try:
            form(np.zeros(2))
        except DistError as exc:
            errors.append(str(exc))

    for form in both(probe := Probe()):
        th = threading.Thread(target=call, args=(form,), name="other")
        th.start()
        th.join()
    assert len(errors) == 2 and errors[0] == errors[1] and "thread 'other'" in errors[0]
    assert probe.seen == []
    for form in both(probe):  # the owner's own calls go on
        assert form(np.zeros(2)) == "done"


def test_a_call_from_another_thread_during_the_tokens_allocation_leaves_this_calls_token_intact(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cached thread ident stays alive while the token is made, whatever runs meanwhile.

    On CPython 3.10 and 3.11 the token's allocation may collect garbage, and a collection runs
    Python code (here a ``gc.callbacks`` hook) in which another thread calls the door and replaces
    the cached ident: the token must still hold this thread's ident, never a freed int.
    """
    monkeypatch.setattr(watchdog._Threads, "owner", None)  # MPI_THREAD_MULTIPLE: any thread may call
    held: list[int] = []
    errors: list[BaseException] = []

    def host(tensor: Any, group: Any = None) -> int:
        held.extend(t[0] for t in watchdog._live if t[1].name == "probe")
        return 1

    plan = door._Plan("probe", host, {"tensor": door.BOTH}, None, None, None, True, None)
    c = plan.in_c(python_form(plan, _Written.folder))
    x = np.zeros(2)
    armed = [False]

    def other_thread_calls(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and armed[0]:
            armed[0] = False
            th = threading.Thread(target=lambda: errors.extend(_raised(c, x)))
            th.start()
            th.join()

    keep = [(i, i, i, i) for i in range(100_000)]  # no free 4-tuple: the token's is a new allocation
    threshold = gc.get_threshold()
    gc.callbacks.append(other_thread_calls)
    try:
        gc.collect()
        gc.set_threshold(1)
        armed[0] = True
        assert c(x) == 1
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(other_thread_calls)
    del keep
    assert errors == [] and len(held) == 2  # the other thread's call, then this one's
    assert held[-1] == threading.get_ident() and held[0] != held[-1]
    assert [type(t[0]) for t in watchdog._live] == [int] * len(watchdog._live)


def _raised(call: Callable[..., Any], *args: Any) -> list[BaseException]:
    try:
        call(*args)
    except BaseException as exc:  # reported to the test's thread
        return [exc]
    return []


class Fast:
    """A fast entry that records the parameters it was given and answers ``answer``."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.seen: list[tuple[Any, ...]] = []

    def __call__(self, *params: Any) -> Any:
        live = [t for t in watchdog._live if t[1].name == "probe"]
        self.seen.append((*params, len(live)))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def with_fast(probe: Probe, fast: Fast) -> Callable[..., Any]:
    """The C door of ``probe.host`` with the fast entry ``fast``."""
    roles = {"tensor": door.BOTH, "others": door.READ}
    plan = door._Plan("probe", probe.host, roles, None, None, None, True, None, fast)
    c = plan.in_c(python_form(plan, _Written.folder))
    assert c is not None
    return c


def test_the_fast_entry_gets_every_parameter_in_order_and_answers_for_the_host() -> None:
    x, others = np.zeros(2), [np.ones(1)]
    c = with_fast(probe := Probe(), fast := Fast("fast"))
    assert c(x) == "fast" and fast.seen.pop() == (x, None, None, False, 1)  # defaults filled, token live
    assert c(x, others, async_op=True) == "fast" and fast.seen.pop() == (x, others, None, True, 1)
    assert c(async_op=False, group=None, tensor=x) == "fast" and fast.seen.pop() == (x, None, None, False, 1)
    assert probe.seen == [] and watchdog._live == []


def test_the_host_serves_what_the_fast_entry_does_not_and_what_does_not_bind_plainly() -> None:
    x = np.zeros(2)
    c = with_fast(probe := Probe(), fast := Fast(NotImplemented))
    assert c(x, async_op=True) == "done"  # NotImplemented: the host, with the caller's own arguments
    assert fast.seen.pop() == (x, None, None, True, 1) and probe.seen.pop()[:4] == (x, None, None, True)
    for args, kwargs in (((x,), {"nonsense": 1}), ((x, None), {"others": None})):  # unknown, repeated
        with pytest.raises(TypeError):
            c(*args, **kwargs)
    assert fast.seen == [] and probe.seen == []
    with pytest.raises(TypeError):
        c()  # no tensor: the Python wrapper's TypeError, before either
    assert fast.seen == []


def test_a_failing_fast_entry_raises_what_a_failing_host_raises() -> None:
    MPI = _mpi.MPI
    failures = []
    error = MPI.Exception(MPI.ERR_OTHER)
    for form in (with_fast(Probe(), Fast(error)), both(Probe(error))[1]):
        with pytest.raises(CommunicationError) as info:
            form(np.zeros(2))
        failures.append(str(info.value))
        assert watchdog._live == []
    assert failures[0] == failures[1] and "probe" in failures[0]


def test_a_host_with_keyword_only_parameters_takes_no_fast_entry() -> None:
    def host(tensor: Any, *, group: Any = None) -> None: ...

    with pytest.raises(TypeError, match="keyword-only"):
        door._Plan("probe", host, {"tensor": door.BOTH}, None, None, None, True, None, Fast(None))
