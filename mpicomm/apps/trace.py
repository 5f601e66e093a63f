"""``python -m mpicomm trace DIR``: merge a traced run's files and print where the time went.

A run with ``MPICOMM_TRACE=DIR`` leaves one Chrome-trace file per rank in ``DIR`` and, from rank 0,
the merged ``DIR/mpicomm-trace.json`` (open it in https://ui.perfetto.dev). This command merges the
rank files again (after a run whose ranks could not meet at exit, say), prints the summary table per
call and per call site with the imbalance (:mod:`mpicomm.trace.summary`), and with ``--plot`` writes
a PNG of the time per call and rank. It needs no MPI.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Sequence

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mpicomm trace",
        description="Merge the trace of a run made with MPICOMM_TRACE=DIR and print where its time went.",
    )
    parser.add_argument("where", metavar="DIR", help="the trace directory (or a merged mpicomm-trace.json)")
    parser.add_argument(
        "--plot", metavar="PNG", help="write a bar chart of time per call and rank (matplotlib)"
    )
    parser.add_argument("--sites", type=int, default=10, help="call sites listed (default 10)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Print the summary of a traced run; returns 1 when there is no trace to read.

    Example:
        >>> main(["/nonexistent/trace/dir"])
        1
    """
    from ..trace.output import load
    from ..trace.summary import summarise, table

    args = _parser().parse_args(argv)
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print("mpicomm trace: --plot needs matplotlib (pip install mpicomm[plot])", file=sys.stderr)
        return 1
    try:
        doc = load(args.where)
    except (FileNotFoundError, NotADirectoryError) as exc:
        print(f"mpicomm trace: {exc}", file=sys.stderr)
        return 1
    print(table(summarise(doc), args.sites))
    if args.plot:
        from ..trace.plot import plot

        plot(doc, args.plot)
        print(f"wrote {args.plot}")
    return 0
