"""Every place an upper layer plugs into a lower one at run time, and why each is not an argument.

Imports point one way (programs -> front door -> data paths -> core; ``tests/unit/test_package_layout.py``
checks them), and a lower layer never imports an upper one. A few lower layers still run code of an
upper one, put there at run time: each is listed in :data:`PLUGS`, with what removing it would cost.
``tests/unit/test_package_layout.py`` fails on any other (an assignment into a lower layer's
attribute from another folder, a ``setattr`` on one, an object that changes ``__class__``, a call of
a plug point from a module not listed here) and on a row whose plug is gone;
``tests/unit/test_wiring.py`` imports each lower layer alone, in a fresh process where no upper
layer runs, to check that it works without its plugs.

What is not a plug: a subclass that overrides a class attribute of its base at import time (the
front door's ``KJTAllToAll`` names its device path and the classes its outputs take; the arrows
point down), and a lower layer's function that an upper one calls with what it needs as arguments.

The object collectives' GPU hooks are set here, by :func:`objects`, which ``mpicomm`` runs before
it hands out an object collective. The other plugs stay where they are made, each named below.
``import mpicomm`` does not read this module (it would cost a file read at every start-up):
``mpicomm/__init__.py`` names torch's ``ProcessGroup`` methods itself, at import.

Example:
    >>> import mpicomm.wiring as wiring
    >>> sorted({p.into.split(".")[1] for p in wiring.PLUGS})  # the layers that receive plugs
    ['core', 'jagged', 'objects']
"""

from __future__ import annotations

__all__ = ["PLUGS", "Plug", "objects"]


class Plug:
    """One place where an upper layer plugs into a lower one at run time.

    (A plain class: ``typing.NamedTuple`` would cost ~60 us more at ``import mpicomm``.)

    Attributes:
        where: The module that plugs in (the upper layer).
        into: The lower layer's name it sets or uses (``module.attribute``).
        why: Why it is not an argument or an import at the top: what removing it costs, measured.
    """

    __slots__ = ("into", "where", "why")

    def __init__(self, where: str, into: str, why: str) -> None:
        self.where, self.into, self.why = where, into, why

    def __repr__(self) -> str:
        return f"Plug({self.where!r}, {self.into!r})"


PLUGS: tuple[Plug, ...] = (
    Plug(
        "mpicomm",
        "mpicomm.core.late.later",
        "torch's ProcessGroup methods (pg.allreduce([t]), ...) import the front door and the data paths; "
        "attached at import, `import mpicomm` + get_rank() loaded all of them (commit ac1f169). Named "
        "placeholders, not a __getattr__ hook: a group attribute read 37 -> 10 ns (commit 24216c9).",
    ),
    Plug(
        "mpicomm.c10d.pg_methods",
        "mpicomm.core.groups.ProcessGroup",
        "the loader the placeholders run: puts the methods on the group class, where every later "
        "lookup finds them first (no placeholder, no indirection after the first use).",
    ),
    Plug(
        "mpicomm.wiring",
        "mpicomm.objects.devbufs.Hooks",
        "the object collectives sit beside the GPU code and below the front door's array kinds; their "
        "public calls are theirs (no front door wrapper between the user and the pickler), so the GPU "
        "backend, CUDA-awareness, pinned pool and device view reach them here, set before mpicomm hands "
        "out an object collective. As arguments they would need a wrapper per call and a pickler that "
        "carries them; importing the GPU code with the object collectives costs every program that "
        "sends only host objects.",
    ),
    Plug(
        "mpicomm.wiring",
        "mpicomm.objects.tensors.CpuView",
        "the front door's address view of a CPU tensor (t.numpy() would pin its storage's size for "
        "ever; commit ac8efe7), set with the GPU hooks; without it the object collectives use t.numpy().",
    ),
    Plug(
        "mpicomm.c10d.startup",
        "mpicomm.core.groups._State.counter",
        "split_group on a rank in none of the subgroups counts a group as register() does on the members, "
        "so that default group names stay the same on every rank; core.groups offers no call for it "
        "(the c10d work of issue 40 may give it one; drop this row then).",
    ),
    Plug(
        "mpicomm.apps.bench.jagged",
        "mpicomm.jagged.kjt._Placement.min_values",
        "the bench forces each data path of KJTAllToAll in turn to measure both (and restores the "
        "threshold): a program's tuning of a measured constant, no argument of the public call.",
    ),
    Plug(
        "mpicomm.front.device",
        "mpicomm.core.chunks.answered",
        "a device rank whose pipeline asked every rank whether the message goes in chunks and heard "
        "`one call` runs the staged host call in this block, so that the host code, which asks the "
        "same question (one MPI_Allreduce) on host ranks, does not ask it twice. As an argument it "
        "would change the signature of every host call that asks; the mark lives in this one block.",
    ),
    Plug(
        "mpicomm.gpu.pipeline",
        "mpicomm.core.chunks.answered",
        "the same block for an async_op=True call, on mpicomm's communication thread: the pipeline asks "
        "the question there (in program order) and, hearing `one call`, sends the message whole through "
        "its buffers with the host call inside the block (issue 41, item 8), for the reason above.",
    ),
    Plug(
        "mpicomm.trace.wrap",
        "mpicomm.core.work.Work.wait",
        "only with MPICOMM_TRACE set: the timeline records when a program waits on an async call. A "
        "recorder argument on every Work would cost every untraced call (issue 43: zero cost when off).",
    ),
    Plug(
        "mpicomm.trace.wrap",
        "mpicomm.core.work.Work.is_completed",
        "only with MPICOMM_TRACE set: an async call's completion seen by polling, as Work.wait above.",
    ),
    Plug(
        "mpicomm.trace.wrap",
        "mpicomm.core.engine.EngineWork.is_completed",
        "only with MPICOMM_TRACE set: as Work.is_completed above, for the engine's Work.",
    ),
    Plug(
        "mpicomm.front",
        "mpicomm.core.engine_gate.precheck",
        "the checks a queued call makes on the caller's thread (mpicomm.front.prechecks) use the data "
        "paths' own helpers, which the engine may not import (it sits below them); passed at every "
        "call, they would change the signature of every gated host and of the inline gates (issue 41: "
        "an async call's argument error raises at the call). Also the in-MPI lane's message "
        "(mpicomm.front.lane_message).",
    ),
)


def objects() -> None:
    """Give the object collectives their GPU hooks: the GPU backend and the front door's array views.

    ``mpicomm`` runs this before it hands out an object collective (``mpicomm.all_gather_object``,
    ...); a second run only sets the same values again. Nothing is imported from the GPU code until
    this runs, and nothing there runs until an object holds a device array.

    Example:
        >>> import mpicomm.wiring
        >>> from mpicomm.objects.devbufs import Hooks
        >>> mpicomm.wiring.objects()
        >>> callable(Hooks.backend) and callable(Hooks.view)
        True
    """
    from .front import kinds
    from .front import objects as front
    from .gpu import staged
    from .gpu.backend import backend
    from .objects.devbufs import Hooks
    from .objects.tensors import CpuView

    Hooks.backend = backend
    Hooks.direct = front.direct
    Hooks.pool = staged.pool
    Hooks.view = front.view
    CpuView.view = kinds.cpu_view
