"""What the tests check the library against, written from the docs, never imported from mpicomm."""

from __future__ import annotations

# The documented table: the dtype kinds (b bool, i int, u uint, f float, c complex) each ReduceOp takes.
OP_KINDS = {
    "SUM": "biufc",
    "PRODUCT": "biufc",
    "MIN": "biuf",
    "MAX": "biuf",
    "BAND": "biu",
    "BOR": "biu",
    "BXOR": "biu",
    "AVG": "iufc",
    "PREMUL_SUM": "iufc",
}
