"""The key schedule of the kernels' counter-based generator (the generator itself is
:mod:`tfdata.kernels._rng`): shared by the samplers and the loader, numpy-free."""

from __future__ import annotations

MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """splitmix64's finaliser on a Python int (the key schedule of the kernels' generator)."""
    x &= MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)
