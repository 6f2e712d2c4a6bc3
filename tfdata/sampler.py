"""Samplers: which rows a batch takes. Hold the counter-based RNG state, never data."""

from __future__ import annotations

import secrets

import numpy as np

_MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """splitmix64's finaliser on a Python int (the key schedule of the kernels' generator)."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class UniformSampler:
    """Uniform sampling with replacement, from a counter-based generator.

    Parameters
    ----------
    seed : int or None
        Any int (reduced mod 2**64). None draws one from the OS; it is recorded in
        :meth:`state_dict`, so any run can be replayed.

    Attributes
    ----------
    state : ndarray of uint64, shape (2,)
        ``[key, counter]`` as the kernels read and advance it; ``key = splitmix64(seed)``.
    """

    def __init__(self, seed: int | None = None):
        if seed is None:
            seed = secrets.randbits(63)
        if isinstance(seed, (bool, float)) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        self.seed = int(seed) & _MASK64
        self.state = np.array([splitmix64(self.seed), 0], dtype=np.uint64)

    @property
    def counter(self) -> int:
        """Number of 64-bit random words consumed so far."""
        return int(self.state[1])

    def state_dict(self) -> dict:
        return {"seed": self.seed, "counter": self.counter}

    def load_state_dict(self, state: dict) -> None:
        seed, counter = int(state["seed"]), int(state["counter"])
        if not (0 <= seed <= _MASK64 and 0 <= counter <= _MASK64):
            raise ValueError(f"sampler state: seed and counter must be uint64, got {seed}, {counter}")
        self.seed = seed
        self.state[0] = splitmix64(seed)
        self.state[1] = counter
