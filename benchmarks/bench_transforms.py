"""Transforms on sample (:mod:`tfdata.transforms`): a transform in the sample path against the
same sample without it, and against the same transform in numpy after the gather.

Every class takes the layout first; ``variant`` is ``"plain"`` (``sample`` without the
transform), ``"tfdata"`` (``sample`` with it) or ``"numpy"`` (``sample`` without it, then the
transform written in numpy on the batch, as a training loop would): the baselines of the same
run. Target (issue 36): ``Normalize`` within 1.3x of ``"plain"``.
"""

from __future__ import annotations

import numpy as np

import tfdata

from .common import CARTPOLE, TFDATA_LAYOUTS, fill, fill_chunk, first_time, warm_kernels

_MANY_SAMPLES = (200, 2000, 2.0)
_BUFFERS: dict = {}


def _buffer(key, make):
    buf = _BUFFERS.get(key)
    if buf is None:
        buf = _BUFFERS[key] = make()
    return buf


class SampleNormalized:
    """Draw 256 CartPole rows from 1M with ``obs`` normalized by the running statistics of the
    rows held (``stats=["obs"]``): ``Normalize("obs")`` in the sample path, or numpy's
    ``(obs - mean) / sqrt(var + eps)`` after the gather with the same statistics."""

    params = [TFDATA_LAYOUTS, ["plain", "tfdata", "numpy"]]
    param_names = ["layout", "variant"]
    repeat = _MANY_SAMPLES
    capacity = 1_000_000

    def setup(self, layout, variant):
        warm_kernels()

        def make():
            ts = [tfdata.Normalize("obs")] if variant == "tfdata" else None
            buf = tfdata.ReplayBuffer(CARTPOLE, self.capacity, layout=layout, seed=0,
                                      stats=["obs"], transforms=ts)
            fill(buf, self.capacity, fill_chunk(CARTPOLE))
            return buf

        buf = _buffer(("normalize", layout, variant), make)
        if variant == "numpy":
            def op(buf=buf, eps=1e-8):
                batch = buf.sample(256)
                s = buf.stats("obs")
                return ((batch["obs"] - s.mean) / np.sqrt(s.var + eps)).astype(np.float32)
            self.op = op
        else:
            self.op = lambda: buf.sample(256)
        if first_time("normalize", layout, variant):
            for _ in range(3):  # the output ring, the statistics' first pass
                self.op()

    def time_sample(self, layout, variant):
        self.op()

    def peakmem_sample(self, layout, variant):
        for _ in range(100):
            self.op()


def numpy_shift(images: np.ndarray, pad: int, rng: np.random.Generator) -> np.ndarray:
    """DrQ's random shift in numpy: the batch padded with its edges, one crop per row."""
    n, h, w = images.shape[0], images.shape[-2], images.shape[-1]
    padded = np.pad(images, ((0, 0), (0, 0), (pad, pad), (pad, pad)), mode="edge")
    off = rng.integers(0, 2 * pad + 1, size=(n, 2))
    out = np.empty_like(images)
    for i in range(n):
        out[i] = padded[i, :, off[i, 0]:off[i, 0] + h, off[i, 1]:off[i, 1] + w]
    return out


class RandomShift:
    """Draw 128 rows of four 84x84 uint8 frames (channels first) from 5,000 with DrQ's random
    shift (pad 4): ``RandomShift("obs")`` in the sample path, or :func:`numpy_shift` after the
    gather."""

    params = [TFDATA_LAYOUTS, ["plain", "tfdata", "numpy"]]
    param_names = ["layout", "variant"]
    repeat = (50, 500, 2.0)
    spec = tfdata.Spec({"obs": ("u1", (4, 84, 84)), "action": "i8", "reward": "f4"})
    capacity = 5_000

    def setup(self, layout, variant):
        warm_kernels()

        def make():
            ts = [tfdata.RandomShift("obs", 4, seed=0)] if variant == "tfdata" else None
            buf = tfdata.ReplayBuffer(self.spec, self.capacity, layout=layout, seed=0, transforms=ts)
            rng = np.random.default_rng(0)
            for start in range(0, self.capacity, 500):
                buf.extend({"obs": rng.integers(0, 256, (500, 4, 84, 84), dtype=np.uint8),
                            "action": np.zeros(500, np.int64), "reward": np.zeros(500, np.float32)})
            return buf

        buf = _buffer(("shift", layout, variant), make)
        if variant == "numpy":
            rng = np.random.default_rng(0)
            self.op = lambda: numpy_shift(buf.sample(128)["obs"], 4, rng)
        else:
            self.op = lambda: buf.sample(128)
        if first_time("shift", layout, variant):
            for _ in range(3):
                self.op()

    def time_sample(self, layout, variant):
        self.op()

    def peakmem_sample(self, layout, variant):
        for _ in range(20):
            self.op()
