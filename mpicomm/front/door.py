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

The wrapper is a generated Python function. Where the C module is built (and ``MPICOMM_C`` is
not 0), the public call is its C form, ``door`` of ``mpicomm.core._cmpi``: for a call whose
arrays are all numpy it does steps 1 and 5 and the watchdog's token in C and calls the host
directly (about 0.09 us a call where the Python wrapper takes 0.17 us); every other call goes on to
the Python wrapper. It carries the host's name, docstring and ``__wrapped__``, so
``inspect.signature``, ``help`` and the docs see the host's signature.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..core import cmpi, validation, watchdog
from ..core.calls import check_flag, failed
from ..core.work import Work
from . import kinds
from .device import BOTH, READ, WRITE, Bound, on_device

__all__ = ["BOTH", "READ", "WRITE", "front_door"]

F = TypeVar("F", bound=Callable[..., Any])


_KINDS = kinds._KINDS
_PLAIN = (kinds.NUMPY, kinds.OTHER, kinds.LIST)
_PLAIN_SCALAR = frozenset((kinds.NUMPY, kinds.OTHER))


def front_door(
    fn: str,
    roles: dict[str, str],
    *,
    direct: Callable[..., Any] | None = None,
    pipelined: Callable[..., Any] | None = None,
    returns: str | None = None,
    validated: bool = True,
    sparse: Callable[..., Any] | None = None,
) -> Callable[[F], F]:
    """Make ``host`` the public call ``fn``, taking every array kind in the arguments of ``roles``.

    The wrapper is generated with ``host``'s own parameters (as ``dataclasses`` generates
    ``__init__``), so that a numpy call costs one function call, one dictionary lookup per array
    argument and a ``try``: about 0.15 us, where a generic ``*args, **kwargs`` wrapper cost 0.4 us.

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

    Returns:
        The decorator.
    """

    def wrap(host: F) -> F:
        plan = _Plan(fn, host, roles, direct, pipelined, returns, validated, sparse)
        python = functools.update_wrapper(plan.generate(), host)
        fast = plan.in_c(python)
        return functools.update_wrapper(fast, host) if fast is not None else python  # type: ignore[return-value]

    return wrap


class _Plan:
    """One public call: its generated wrapper, and the slow path for arrays other than numpy."""

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
        self.site = watchdog.Site(fn)

    def in_c(self, python: Callable[..., Any]) -> Any:
        """The C door (``door`` of ``mpicomm.core._cmpi``) in front of ``python``; None without the C module.

        It serves a call whose arrays are all numpy as ``python`` does (the watchdog's token, the
        thread check, the host with the caller's arguments, errors through :meth:`failed_in_c`)
        at about half the cost, and hands every other call to ``python``. Not used where the C
        module is not built or ``MPICOMM_C=0``.
        """
        if not _c_doors():
            return None
        from ..core import _cmpi  # type: ignore[attr-defined]

        params = self.signature.parameters.values()
        defaults = tuple(_MISSING if p.default is p.empty else p.default for p in params)
        group = self.names.index("group") if "group" in self.names else -1
        threads, flags = watchdog._Threads, validation._Flag  # the C door reads two of their slots
        owner, exchanges = vars(type(threads))["owner"], vars(type(flags))["exchanges"]
        return _cmpi.door(
            self.host, python, self.failed_in_c, self.site, watchdog._live, threads, owner,
            flags, exchanges, np.ndarray, _KINDS, _PLAIN_SCALAR, kinds.LIST, tuple(self.names),
            defaults, _MISSING, tuple(pos for pos, _, _ in self.slots), self.flag, group,
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
        return failed(self.fn, exc, before, self.validated, self.signature, given[:positional], kwargs)

    def generate(self) -> Callable[..., Any]:
        """The wrapper, with ``host``'s parameters.

        For ``all_reduce`` it reads::

        def all_reduce(tensor, op=_d_op, group=_d_group, async_op=_d_async_op):
            before = _state.exchanges
            _tok = (_me := _ident(), _site, group, None)          # the watchdog's token
            if _me != _T.owner and _T.owner is not None:          # below MPI_THREAD_MULTIPLE:
                _other_thread()                                    # the owning thread only
            _push(_tok)
            try:
                if (type(tensor) is _ND or ... in _PLAIN or ...) and (async_op is False or ...):
                    return _host(tensor, op, group, async_op)          # numpy: straight through
                if _get(type(tensor)) is _TORCH and (async_op is False or async_op is True):
                    try:                                               # a plain CPU tensor:
                        _e = _views(id(tensor))                        # its kept numpy view, if
                        _v_tensor = _e[1] if _e is not None and tensor.data_ptr() == _e[2] and ... \
                            else _torch_numpy(tensor)                  # unchanged, else a new view
                    except (RuntimeError, TypeError):
                        return _slow([tensor, op, group, async_op])
                    out = _host(_v_tensor, op, group, async_op)
                    return out if out is None else _answer(out, {id(_v_tensor): tensor}, None)
                return _slow([tensor, op, group, async_op])            # every other kind
            except Exception as exc:
                raise _failed(exc, before, [tensor, op, group, async_op])
            finally:
                _pop(_tok)                                         # the call is over
        """
        env: dict[str, Any] = {
            "_host": self.host,
            "_slow": self.slow,
            "_failed": self._failed,
            "_answer": _answer,
            "_state": validation._Flag,
            "_get": _KINDS.get,
            "_PLAIN": _PLAIN_SCALAR,
            "_TORCH": kinds.TORCH,
            "_ND": np.ndarray,
            "_LIST": kinds.LIST,
            "_all_numpy": _all_numpy,
            "_views": _VIEWS.get,
            "_torch_numpy": _torch_numpy,
            "_push": watchdog._live.append,
            "_pop": watchdog._live.remove,
            "_site": self.site,
            "_ident": watchdog._get_ident,
            "_T": watchdog._Threads,
            "_other_thread": watchdog._other_thread,
        }
        arrays = [name for _, name, _ in self.slots]
        heads: list[str] = []
        passes: list[str] = []
        torch_passes: list[str] = []
        for name, p in self.signature.parameters.items():
            default = ""
            if p.default is not p.empty:
                env[f"_d_{name}"] = p.default
                default = f"=_d_{name}"
            keyword = p.kind is p.KEYWORD_ONLY
            if keyword and "*" not in heads:
                heads.append("*")
            heads.append(name + default)
            viewed = f"_v_{name}" if name in arrays else name
            passes.append(f"{name}={name}" if keyword else name)
            torch_passes.append(f"{name}={viewed}" if keyword else viewed)
        flag = ["(async_op is False or async_op is True)"] if self.flag >= 0 else []
        # a numpy array first, by identity: cheaper than the kinds' dictionary and the set
        numpy_test = " and ".join(
            [
                f"(type({a}) is _ND or (_k_{a} := _get(type({a}))) in _PLAIN"
                f" or (_k_{a} is _LIST and _all_numpy({a})))"
                for a in arrays
            ]
            + flag
        )
        # the first argument's kind is bound here unless it is a numpy array (the numpy test ran to it)
        torch_test = " and ".join(
            [
                f"type({a}) is not _ND and _k_{a} is _TORCH" if i == 0 else f"_get(type({a})) is _TORCH"
                for i, a in enumerate(arrays)
            ]
            + flag
        )
        values = f"[{', '.join(self.names)}]"
        seen = ", ".join(f"id(_v_{a}): {a}" for a in arrays)
        group = "group" if "group" in self.names else "None"
        lines = [
            f"def {self.fn}({', '.join(heads)}):",
            "    before = _state.exchanges",
            # the watchdog's token (watchdog.serial's check and its number, inline: a thread's ident
            # tells its tokens from every other thread's, at half the cost of serial's call)
            f"    _tok = (_me := _ident(), _site, {group}, None)",
            "    if _me != _T.owner and _T.owner is not None:",
            "        _other_thread()",
            "    _push(_tok)",
            "    try:",
            f"        if {numpy_test}:",
            f"            return _host({', '.join(passes)})",
            f"        if {torch_test}:",
            "            try:",
            *(line for a in arrays for line in _cached_view(a)),
            "            except (RuntimeError, TypeError):",
            f"                return _slow({values})",
            f"            out = _host({', '.join(torch_passes)})",
            f"            return out if out is None else _answer(out, {{{seen}}}, {self.returns})",
            f"        return _slow({values})",
            "    except Exception as exc:",
            f"        raise _failed(exc, before, {values})",
            "    finally:",
            "        _pop(_tok)",
        ]
        exec(compile("\n".join(lines) + "\n", f"<front door: {self.fn}>", "exec"), env)
        call: Callable[..., Any] = env[self.fn]
        return call

    def _failed(self, exc: Exception, before: int, values: list[Any]) -> Exception:
        return failed(self.fn, exc, before, self.validated, self.signature, tuple(values), {})

    def slow(self, values: list[Any]) -> Any:
        """A call with arrays other than numpy (``values``: every parameter, in order)."""
        flag = self.flag
        if flag >= 0 and values[flag] is not True and values[flag] is not False:
            check_flag(self.fn, tuple(values), {}, flag)
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
            elif kind not in _PLAIN_SCALAR:
                values[pos] = view = self._view(value, arg, role != READ, seen)
                device = device or kinds.kind_of(view) == kinds.CUPY
        if device:
            bound = Bound(self.names, values, self.positional)
            out = on_device(self.fn, self.host, bound, self.roles, self.direct, self.pipelined, self.returns)
        else:
            out = self.host(*values)
        if out is None:
            return None
        return _answer(out, seen, seen.get(id(values[self.model])) if self.model >= 0 else None)

    def _view(self, x: Any, arg: str, write: bool, seen: dict[int, Any]) -> Any:
        kind = kinds.kind_of(x)
        if kind in _PLAIN:
            return x
        v = kinds.view(x, kind, self.fn, arg, write)
        seen[id(v)] = x
        return v


_MISSING = object()  # the C door's mark of a parameter without a default


@functools.lru_cache(maxsize=1)
def _c_doors() -> bool:
    """Whether public calls get the C door: the C module is built and not switched off (``MPICOMM_C=0``)."""
    if cmpi.switched_off():
        return False
    try:
        from ..core import _cmpi  # type: ignore[attr-defined]
    except ImportError:
        return False
    return hasattr(_cmpi, "door")


#: CPU tensors' numpy views (by address, :func:`mpicomm.front.kinds.cpu_view`: the storage stays
#: resizable), by the tensor's id, with the pointer, shape, strides, dtype and storage size they were
#: made for: a hit costs ~0.4 us where making the view costs ~0.6 us with warm caches, and several
#: times that after a >= 1 MiB transfer has emptied L1 and L2 (docs/benchmarks.rst, "torch tensors
#: with cold caches"). An entry holds its tensor weakly and leaves when the tensor dies, so no other
#: tensor can be served it under a reused id and no dead tensor's memory is held; at most 8 entries
#: are kept. Any change of the tensor's memory or layout (``resize_``, ``set_``, ``transpose_``,
#: ``.data =``, ``untyped_storage().resize_``) changes one of the five, and the view is made again.
_VIEWS: dict[int, tuple[Any, ...]] = {}
_VIEW_ENTRIES = 8


def _cached_view(a: str) -> list[str]:
    """The front door's lines that set ``_v_{a}`` to the numpy view of the CPU tensor ``a``."""
    test = (
        f"{a}.data_ptr() == _e[2] and {a}.shape == _e[3] and {a}.stride() == _e[4] and {a}.dtype is _e[5]"
        f" and {a}.untyped_storage().nbytes() == _e[6]"
    )
    return [
        f"                _e = _views(id({a}))",
        f"                _v_{a} = _e[1] if _e is not None and {test} else _torch_numpy({a})",
    ]


def _torch_numpy(t: Any) -> np.ndarray:
    """``t``'s numpy view by address (TypeError or RuntimeError where refused), kept in :data:`_VIEWS`."""
    view = kinds.cpu_view(t, keep=False)  # the entry holds the tensor weakly: so must the view
    facts = (t.data_ptr(), t.shape, t.stride(), t.dtype, t.untyped_storage().nbytes())
    kinds.keep_view(_VIEWS, _VIEW_ENTRIES, t, view, *facts)
    return view


def _all_numpy(value: Any) -> bool:
    """Whether ``value`` is a list or tuple of numpy arrays only (the list forms' fast path)."""
    if _KINDS.get(type(value)) is not kinds.LIST:
        return False
    for v in value:  # noqa: SIM110 (a plain loop: a generator costs more than the short list it checks)
        if type(v) is not np.ndarray:
            return False
    return True


def _answer(out: Any, seen: dict[int, Any], model: Any) -> Any:
    """``out`` with the views replaced by the caller's arrays and new arrays in ``model``'s kind."""
    if isinstance(out, Work):
        if not out._done:  # the views need not hold the caller's arrays (the kept ones do not): the Work does
            out._keep = (out._keep, list(seen.values()))
        for attr in ("_result", "_shown"):  # a staged Work shows the device arrays it wrote
            if hasattr(out, attr):
                setattr(out, attr, _mapped(getattr(out, attr), seen, model))
        return out
    if model is None or out is None:
        return out
    return _mapped(out, seen, model)


def _mapped(value: Any, seen: dict[int, Any], model: Any) -> Any:
    if isinstance(value, list):
        return [_mapped(v, seen, model) for v in value]
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named result such as JaggedResult
        return type(value)(*(_mapped(v, seen, model) for v in value))
    original = seen.get(id(value))
    if original is not None:
        return original
    if model is not None and kinds.kind_of(value) in (kinds.NUMPY, kinds.CUPY):
        return kinds.like(value, model)
    return value
