"""Uniform sampling with replacement over the rows held."""

from __future__ import annotations

from . import Sampler


class UniformSampler(Sampler):
    """Every row held is equally likely; rows are drawn with replacement.

    ``sample`` draws and gathers in one kernel call of the storage's layout; ``sample_slices``
    draws uniform starts (see :func:`tfdata.kernels.sample_slices`).
    """

    projects = True
    name = "uniform"
    rule = "rows are drawn uniformly with replacement"

    def bind(self, storage, capacity: int, num_envs: int, allocator) -> None:
        super().bind(storage, capacity, num_envs, allocator)
        from ... import kernels  # numba is imported when the first buffer is built

        self._slices = kernels.sample_slices

    def sample(self, n: int, out, arrays: dict) -> None:
        # the kernels of the output's source: the storage's, or a projection's (span kernels)
        out.kernels.sample_uniform(out.store, n, self.state, out.indices, out.kernel_out)

    def sample_slices(self, n, cursor, episode, reject, max_draws, out, arrays) -> int:
        mask = arrays["mask"]
        return self._slices(n, cursor, self.num_envs, self.capacity, self.state, episode, reject,
                            max_draws, out.indices.reshape(mask.shape), mask)
