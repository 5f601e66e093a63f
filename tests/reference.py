"""What the tests check the library against, written from the docs, never imported from mpicomm."""

from __future__ import annotations

import numpy as np

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

# The numpy ufunc that computes each plain MPI reduction (AVG and PREMUL_SUM are sums around it).
UFUNCS = {
    "SUM": np.add,
    "PRODUCT": np.multiply,
    "MIN": np.minimum,
    "MAX": np.maximum,
    "BAND": np.bitwise_and,
    "BOR": np.bitwise_or,
    "BXOR": np.bitwise_xor,
}
