"""The serial reference of the Cartesian-grid tests: a box stencil on the whole grid in one process.

The global array carries a frame of ``width`` layers: on a non-periodic axis the frame is a fixed
boundary; on a periodic one it is refilled before every step, axis by axis from the last axis, each
axis spanning the frame of the axes filled before it (what ``CartGrid.exchange_halos`` does across
ranks, so the corners agree too). The stencil is the same arithmetic on a rank's block and on the
whole grid, in the same order, so the two are equal bit for bit.
"""

from __future__ import annotations

import itertools

import numpy as np


def initial(shape: tuple[int, ...], width: int, seed: int) -> np.ndarray:
    """The whole grid: ``shape`` interior cells inside a frame of ``width``, all random."""
    return np.random.default_rng(seed).random(tuple(n + 2 * width for n in shape))


def wrap(p: np.ndarray, width: int, periodic: tuple[bool, ...]) -> None:
    """Fill the frame of the periodic axes of ``p`` from the opposite side of its interior, in place."""
    w, nd = width, p.ndim
    for axis in reversed(range(nd)):
        if not periodic[axis]:
            continue
        around = [slice(None) if b > axis else slice(w, p.shape[b] - w) for b in range(nd)]
        n = p.shape[axis]

        def at(lo: int, hi: int, axis: int = axis, around: list[slice] = around) -> tuple[slice, ...]:
            return (*around[:axis], slice(lo, hi), *around[axis + 1 :])

        p[at(n - w, n)] = p[at(w, 2 * w)]
        p[at(0, w)] = p[at(n - 2 * w, n - w)]


def step(u: np.ndarray, width: int) -> None:
    """One box-stencil step on the interior of ``u`` (its ``width`` layers around read, not written).

    Every cell of the ``(2 width + 1) ** ndim`` box around a point has its own weight, so a ghost
    cell or a corner that is wrong, or taken from the wrong side, changes the answer.
    """
    w, nd = width, u.ndim
    inner = tuple(slice(w, n - w) for n in u.shape)
    new = np.zeros(u[inner].shape)
    for k, offset in enumerate(itertools.product(range(-w, w + 1), repeat=nd)):
        shifted = tuple(slice(w + o, n - w + o) for o, n in zip(offset, u.shape, strict=True))
        new += (1.0 / (k + 3)) * u[shifted]
    u[inner] = new


def serial(
    shape: tuple[int, ...], width: int, periodic: tuple[bool, ...], steps: int, seed: int
) -> np.ndarray:
    """The whole grid (frame included) after ``steps`` steps in one process."""
    p = initial(shape, width, seed)
    for _ in range(steps):
        wrap(p, width, periodic)
        step(p, width)
    return p
