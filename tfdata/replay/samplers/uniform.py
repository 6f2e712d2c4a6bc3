"""Uniform sampling with replacement over the rows held."""

from __future__ import annotations

from . import Sampler


class UniformSampler(Sampler):
    """Every row held is equally likely; rows are drawn with replacement.

    ``sample`` draws and gathers in one kernel call of the storage's layout; ``sample_slices``
    draws uniform starts (the streams' ``kernels.slices``, :mod:`tfdata.kernels._streams`).
    """

    projects = True
    name = "uniform"
    rule = "rows are drawn uniformly with replacement"

    def sample(self, n: int, out, arrays: dict) -> None:
        # the kernels of the output's source: the storage's, or a projection's (span kernels)
        out.kernels.sample_uniform(out.store, n, self.state, out.indices, out.kernel_out)

    def sample_call(self, n: int, out, arrays: dict):
        # the kernel's entry point for these very arguments: no frame of this method and no
        # lookup of the kernel by the arguments' types per call (the RNG state is updated in
        # place, so the bound arrays stay this sampler's)
        from functools import partial

        from ...kernels import strided

        args = (out.store, n, self.state, out.indices, out.kernel_out)
        return partial(strided(out.kernels.sample_uniform, args, ()), *args)

    def draw_call(self, out, arrays: dict):
        # the same entry point, with the rows held an argument of each call
        from ...kernels import strided

        store, state, idx, rows = out.store, self.state, out.indices, out.kernel_out
        entry = strided(out.kernels.sample_uniform, (store, 0, state, idx, rows), ())

        def call(n):
            entry(store, n, state, idx, rows)

        return call

    def sample_slices(self, n, streams, geo, reject, max_draws, out, arrays,
                      part=None) -> int:
        mask = arrays["mask"]
        idx = out.indices.reshape(mask.shape)
        if part is not None:
            idx, mask = idx[part], mask[part]
        term, trunc = streams.flags
        return streams.kernels.slices(geo, n, self.state, streams.episode, term, trunc, reject,
                                      max_draws, idx, mask)
