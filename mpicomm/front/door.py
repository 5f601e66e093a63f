"""The front door: the one wrapper between a public call that takes arrays and the data path it takes.

:func:`front_door` wraps a host (numpy) implementation from ``mpicomm.dense`` or
``mpicomm.jagged`` once, at import. Each call then does, in one Python frame:

1. **Recognise** the kind of every array argument (:mod:`mpicomm.front.kinds`): one dictionary
   lookup per argument. A call whose arrays are all numpy goes straight to the host code.
2. **View** other kinds as the data paths take them: a torch CPU tensor or an
   ``__array_interface__`` object as a zero-copy numpy view; a cupy array, a torch CUDA tensor or a
   ``__cuda_array_interface__``/DLPack device object as a device array.
3. **Choose the path** for device arrays (:mod:`mpicomm.front.device`): direct to a CUDA-aware
   MPI, or staged through pinned host memory.
4. **Answer in the caller's kind**: arrays a call allocates come back as the kind of the argument
   named by ``returns`` (torch in, torch out); a :class:`~mpicomm.Work`'s result lists the caller's
   own arrays, not the views.
5. **Fail alike**: an error MPI reports becomes a :class:`~mpicomm.CommunicationError` naming the
   call; with validation mode on, a mistake seen on one rank is sent into the validation exchange
   so that every rank raises it (``mpicomm.core.calls``); ``async_op`` must be a bool.

Where each part is:

- the Python wrapper of each call, with the host's own parameters, is a function in
  ``mpicomm/front/_doors.py``, written ahead of time by ``python -m mpicomm.front.gen_doors``
  (:mod:`mpicomm.front.gen_doors`): numpy and torch CPU tensors inline, the rest to
  ``_Plan.slow``, here;
- what the wrappers call besides the host is in :mod:`mpicomm.front.door_parts`;
- the C form, ``mpicomm/front/_door.c`` (the extension ``mpicomm.front._door``): where it is built
  and ``MPICOMM_C`` is not 0, the public call is a ``Door`` that serves a call whose arrays are
  all numpy itself (steps 1 and 5 and the watchdog's token in C, then the host, about 0.09 us a
  call where the Python wrapper takes 0.17 us) and hands every other call to the Python wrapper.

Either form carries the host's name, docstring and ``__wrapped__``, so ``inspect.signature``,
``help`` and the docs see the host's signature.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any, TypeVar

import numpy as np

from ..core import busy, calls, cmpi, groups, validation, watchdog
from . import kinds
from .device import BOTH, READ, WRITE, Bound, on_device
from .door_parts import PLAIN_SCALAR, answer

__all__ = ["BOTH", "READ", "WRITE", "front_door"]

F = TypeVar("F", bound=Callable[..., Any])


_KINDS = kinds._KINDS
_PLAIN = (kinds.NUMPY, kinds.OTHER, kinds.LIST)


def front_door(
    fn: str,
    roles: dict[str, str],
    *,
    direct: Callable[..., Any] | None = None,
    pipelined: Callable[..., Any] | None = None,
    returns: str | None = None,
    validated: bool = True,
    sparse: Callable[..., Any] | None = None,
    fast: Callable[..., Any] | None = None,
) -> Callable[[F], F]:
    """Make ``host`` the public call ``fn``, taking every array kind in the arguments of ``roles``.

    The wrapper has ``host``'s own parameters (written ahead of time into
    :mod:`mpicomm.front._doors`), so that a numpy call costs one function call, one ``type`` check
    per array argument and a ``try``: about 0.15 us, where a generic ``*args, **kwargs`` wrapper
    cost 0.4 us.

    Args:
        fn: The public name, for messages.
        roles: Argument name -> ``READ``, ``WRITE`` or ``BOTH``; a list argument's
            arrays all take the role.
        direct: The device implementation for CUDA-aware MPIs (same signature); it returns
            ``NotImplemented`` where it cannot serve a call, which is then staged.
        pipelined: A staged implementation for large messages, or ``NotImplemented``.
        returns: The argument whose kind the arrays the call allocates take (``None``: the call
            allocates none).
        validated: Whether the call takes part in validation mode's exchange (False for
            point-to-point calls).
        sparse: The implementation (same signature) for a torch sparse COO tensor in the first
            array argument; without one, sparse tensors are refused by name.
        fast: A C function that serves the call's common numpy case whole (for broadcast,
            ``mpicomm.core.fast.broadcast_in_c``): the C door calls it with every parameter,
            positionally, in the host's order, where it would call the host, and calls the host
            where it returns ``NotImplemented`` (which it does before any MPI call). The host's
            parameters must all be positional-or-keyword. The Python wrapper calls the host alone.

    Returns:
        The decorator.
    """

    def wrap(host: F) -> F:
        plan = _Plan(fn, host, roles, direct, pipelined, returns, validated, sparse, fast)
        _PLANS[fn] = plan  # for the generator of the wrappers
        python = functools.update_wrapper(plan.python(), host)
        c_form = plan.in_c(python)
        return functools.update_wrapper(c_form, host) if c_form is not None else python  # type: ignore[return-value]

    return wrap


class _Plan:
    """One public call: what its wrappers are given, and the slow path for arrays other than numpy."""

    def __init__(
        self,
        fn: str,
        host: Callable[..., Any],
        roles: dict[str, str],
        direct: Callable[..., Any] | None,
        pipelined: Callable[..., Any] | None,
        returns: str | None,
        validated: bool,
        sparse: Callable[..., Any] | None = None,
        fast: Callable[..., Any] | None = None,
    ) -> None:
        self.fn, self.host, self.roles, self.validated = fn, host, roles, validated
        self.direct, self.pipelined, self.returns = direct, pipelined, returns
        self.signature = inspect.signature(host)
        params = list(self.signature.parameters.values())
        if any(p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) for p in params):
            raise TypeError(f"front_door: {fn} takes *args or positional-only parameters")
        self.names = [p.name for p in params]
        self.positional = sum(p.kind is p.POSITIONAL_OR_KEYWORD for p in params)  # keyword-only ones follow
        self.slots = [(self.names.index(arg), arg, role) for arg, role in roles.items()]
        self.flag = self.names.index("async_op") if "async_op" in self.names else -1
        self.model = self.names.index(returns) if returns is not None else -1
        self.sparse = sparse
        if fast is not None and self.positional != len(params):
            raise TypeError(f"front_door: {fn} takes keyword-only parameters: no fast entry")
        self.fast = fast
        self.site = watchdog.Site(fn)
        self.defaults = tuple(p.default for p in params if p.default is not p.empty)
        # at MPI_THREAD_MULTIPLE a call holds its group (mpicomm.core.busy) unless it takes a tag:
        # MPI matches point-to-point calls by tag, so threads may share their group
        self.exclusive = "tag" not in self.names

    @property
    def shape(self) -> str:
        """What the call's wrapper is written for: its parameters, array arguments and ``returns``.

        Example:
            >>> def host(tensor, op=None, *, async_op=False): ...
            >>> _Plan("f", host, {"tensor": READ}, None, None, None, True).shape
            '(tensor, op=, *, async_op=) arrays tensor, returns None'
        """
        heads: list[str] = []
        for p in self.signature.parameters.values():
            if p.kind is p.KEYWORD_ONLY and "*" not in heads:
                heads.append("*")
            heads.append(p.name + ("=" if p.default is not p.empty else ""))
        arrays = ", ".join(name for _, name, _ in self.slots)
        return f"({', '.join(heads)}) arrays {arrays}, returns {self.returns}"

    def in_c(self, python: Callable[..., Any]) -> Any:
        """The C door (``mpicomm/front/_door.c``) in front of ``python``; None without it.

        It serves a call whose arrays are all numpy as ``python`` does (the watchdog's token, the
        thread check, the group's hold at ``MPI_THREAD_MULTIPLE``, the fast entry if any, then
        the host with the caller's arguments, errors through :meth:`failed_in_c`) at about half
        the cost, and hands every other call to ``python``. Not used where the C module is not
        built or ``MPICOMM_C=0``.
        """
        c = _c_door()
        if c is None:
            return None
        params = self.signature.parameters.values()
        defaults = tuple(_MISSING if p.default is p.empty else p.default for p in params)
        group = self.names.index("group") if "group" in self.names else -1
        threads, flags, state = watchdog._Threads, validation._Flag, groups._State  # it reads their slots
        slots = vars(type(threads))
        owner, engine, exchanges = slots["owner"], slots["engine"], vars(type(flags))["exchanges"]
        return c.door(
            self.host, python, self.failed_in_c, self.site, watchdog._live, threads, owner,
            flags, exchanges, np.ndarray, _KINDS, PLAIN_SCALAR, kinds.LIST, tuple(self.names),
            defaults, _MISSING, tuple(pos for pos, _, _ in self.slots), self.flag, group,
            self.exclusive, engine, state, vars(type(state))["world"], groups.ProcessGroup,
            busy._BUSY, busy._RACED, busy.race, busy.settle, self.fast,
        )  # fmt: skip

    def failed_in_c(
        self, exc: Exception, before: int, given: tuple[Any, ...], kwnames: tuple[str, ...] | None
    ) -> Exception:
        """What the Python wrapper raises for ``exc``, from the C door's call with ``given``.

        The C door raises it (with ``exc`` as its context, as the wrapper's ``except`` block does).
        """
        keywords = kwnames or ()
        positional = len(given) - len(keywords)
        kwargs = dict(zip(keywords, given[positional:], strict=True))
        return calls.failed(self.fn, exc, before, self.validated, self.signature, given[:positional], kwargs)

    def python(self) -> Callable[..., Any]:
        """The Python wrapper: its factory in :mod:`mpicomm.front._doors`, given this plan.

        Raises:
            RuntimeError: The module holds no wrapper written for the host's parameters and the
                call's roles (run ``python -m mpicomm.front.gen_doors``).
        """
        factory = getattr(_doors, self.fn, None)
        if factory is not None and _doors is not None and _doors.SHAPES.get(self.fn) == self.shape:
            made: Callable[..., Any] = factory(self)
            return made
        why = (
            f"front_door: mpicomm/front/_doors.py holds no wrapper of {self.fn} for {self.shape}"
            f"{_DOORS_FAILED}: run python -m mpicomm.front.gen_doors"
        )
        if not _Regenerating.on:
            raise RuntimeError(why)

        def stale(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError(why)

        return stale

    def failed(self, exc: Exception, before: int, values: list[Any]) -> Exception:
        """What the wrapper raises for ``exc`` (``values``: every parameter, in order)."""
        return calls.failed(self.fn, exc, before, self.validated, self.signature, tuple(values), {})

    def slow(self, values: list[Any]) -> Any:
        """A call with arrays other than numpy (``values``: every parameter, in order)."""
        flag = self.flag
        if flag >= 0 and values[flag] is not True and values[flag] is not False:
            calls.check_flag(self.fn, tuple(values), {}, flag)
        first = values[self.slots[0][0]]
        if self.sparse is not None and kinds.kind_of(first) == kinds.TORCH and first.is_sparse:
            return self.sparse(*values)
        seen: dict[int, Any] = {}  # id(view) -> the caller's array
        device = False
        for pos, arg, role in self.slots:
            value = values[pos]
            kind = _KINDS.get(type(value))
            if kind is kinds.TORCH:  # the common case first: a plain CPU tensor
                view = kinds.cpu_numpy(value)
                if view is None:
                    view = self._view(value, arg, role != READ, seen)
                    device = device or kinds.kind_of(view) == kinds.CUPY
                seen[id(view)] = value
                values[pos] = view
            elif kind is kinds.LIST:
                views = [self._view(x, f"{arg}[{i}]", role != READ, seen) for i, x in enumerate(value)]
                device = device or any(kinds.kind_of(v) == kinds.CUPY for v in views)
                if any(v is not x for v, x in zip(views, value, strict=True)):
                    values[pos] = views  # else the caller's list stays, for the host checks
            elif kind not in PLAIN_SCALAR:
                values[pos] = view = self._view(value, arg, role != READ, seen)
                device = device or kinds.kind_of(view) == kinds.CUPY
        if device:
            bound = Bound(self.names, values, self.positional)
            out = on_device(self.fn, self.host, bound, self.roles, self.direct, self.pipelined, self.returns)
        else:
            out = self.host(*values)
        if out is None:
            return None
        return answer(out, seen, seen.get(id(values[self.model])) if self.model >= 0 else None)

    def _view(self, x: Any, arg: str, write: bool, seen: dict[int, Any]) -> Any:
        kind = kinds.kind_of(x)
        if kind in _PLAIN:
            return x
        v = kinds.view(x, kind, self.fn, arg, write)
        seen[id(v)] = x
        return v


_MISSING = object()  # the C door's mark of a parameter without a default


def _load_doors() -> tuple[ModuleType | None, str]:
    """The wrappers' module, or None and why: one the generator has yet to rewrite may not import.

    Every call then refuses to be made, naming the generator, which imports the calls regardless.
    """
    try:
        return importlib.import_module(f"{__package__}._doors"), ""
    except ImportError as exc:
        return None, f" (it does not import: {exc})"


_doors, _DOORS_FAILED = _load_doors()


@functools.lru_cache(maxsize=1)
def _c_door() -> Any:
    """The C door's module, ``mpicomm.front._door``; None where not built or ``MPICOMM_C=0``."""
    if cmpi.switched_off():
        return None
    try:
        from . import _door  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _door


def _c_doors() -> bool:
    """Whether public calls get the C door."""
    return _c_door() is not None


#: Every call made with :func:`front_door`, by name: what ``python -m mpicomm.front.gen_doors`` writes
#: the wrappers of.
_PLANS: dict[str, _Plan] = {}


class _Regenerating:
    on = False  # whether a wrapper missing from _doors is allowed (while the generator imports the calls)


@contextlib.contextmanager
def regenerating() -> Iterator[None]:
    """Within: a call whose wrapper :mod:`mpicomm.front._doors` lacks gets one that raises when called.

    Only the generator (:mod:`mpicomm.front.gen_doors`) needs this, to import the calls whose
    wrappers it is about to write.
    """
    before, _Regenerating.on = _Regenerating.on, True
    try:
        yield
    finally:
        _Regenerating.on = before
