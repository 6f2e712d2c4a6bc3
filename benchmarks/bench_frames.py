"""Atari-sized rows: stacked frames stored one frame per row (``frame_stack=4``).

What each class measures, with the layout as its first parameter:

* ``FrameSample``: ``sample(32)`` of obs and next_obs stacks (4 x 84 x 84 uint8 each) rebuilt
  from one stored frame per row (``"aos"``, ``"soa"``), against a ``ReplayBuffer`` that stores
  both stacks whole (``"full"``) and a memcpy of the batch's bytes (``"memcpy"``: 1.8 MB,
  contiguous, from a pool as large as the frame buffer, so from DRAM as the rows are).
  Target: the frame buffer within 1.3x of the memcpy.
* ``FramePush``: ``push`` of one transition (two stacks, checked for continuity) into a full
  ring, against the full-stack buffer and a hand-written numpy buffer that writes one frame and
  the small fields and checks nothing (``"numpy"``). Target: within 1.2x of the numpy write.
* ``FrameMemory``: bytes per transition that ``plan_memory`` gives at 1M rows (frames and
  bookkeeping included) and the peak RSS of building and filling 10,000 rows.
  Target: at most 1.05x one 84x84 frame plus the other fields.

The data are one consistent stream as gymnasium's ``FrameStackObservation`` (reset padding)
returns it: frames are random bytes, episodes end every 1,000 steps on average and the block's
last row ends one, so a block can be written again and again.
"""

from __future__ import annotations

import gc

import numpy as np
import psutil

import tfdata

from .common import MemcpyReference, first_time, warm_kernels

K = 4
FRAME = (84, 84)
SPEC = tfdata.Spec({
    "obs": ("u1", (K,) + FRAME),
    "action": "i8",
    "reward": "f4",
    "next_obs": ("u1", (K,) + FRAME),
    "terminated": "?",
    "truncated": "?",
})
CAPACITY = 20_000
BLOCK = 2_000
MEAN_EPISODE = 1_000
# one call per reading (asv forces number=1 with a setup): many readings
_MANY = (200, 2000, 2.0)


def frame_block(n: int = BLOCK, seed: int = 0) -> dict:
    """``n`` consecutive transitions of one stream with stacks of ``K`` frames: row ``r`` has
    frame ``r`` as its newest, its stack padded with its episode's first frame (reset padding),
    and ``next_obs`` ending with frame ``r + 1`` (an ending row's final observation)."""
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (n + 1,) + FRAME, dtype=np.uint8)
    ends = np.zeros(n, bool)
    ends[rng.choice(n - 1, n // MEAN_EPISODE - 1, replace=False)] = True
    ends[-1] = True
    starts = np.zeros(n, np.int64)  # each row's episode's first row
    first = 0
    for r in range(n):
        starts[r] = first
        if ends[r]:
            first = r + 1
    r = np.arange(n)[:, None]
    back = np.arange(K - 1, -1, -1)[None, :]
    obs = frames[np.maximum(r - back, starts[:, None])]
    nxt = frames[np.maximum(r + 1 - back, starts[:, None])]
    return {"obs": obs, "next_obs": nxt, "action": rng.integers(0, 18, n),
            "reward": rng.standard_normal(n).astype(np.float32), "terminated": ends.copy(),
            "truncated": np.zeros(n, bool)}


_CACHE = {}


def _block() -> dict:
    if "block" not in _CACHE:
        _CACHE["block"] = frame_block()
    return _CACHE["block"]


def _buffer(layout: str):
    """A full ring of ``CAPACITY`` rows, built once per process."""
    if layout not in _CACHE:
        block = _block()
        if layout == "full":
            buf = tfdata.ReplayBuffer(SPEC, CAPACITY, layout="aos", seed=0)
        else:
            buf = tfdata.ReplayBuffer(SPEC, CAPACITY, layout=layout, seed=0, frame_stack=K)
        for _ in range(CAPACITY // BLOCK + 1):
            buf.extend(block)
        _CACHE[layout] = buf
    return _CACHE[layout]


class _Numpy:
    """A hand-written one-frame-per-row ring: writes the newest frame and the small fields,
    checks nothing, keeps no episode bookkeeping."""

    def __init__(self, capacity: int):
        self.frames = np.zeros((capacity,) + FRAME, np.uint8)
        self.action = np.zeros(capacity, np.int64)
        self.reward = np.zeros(capacity, np.float32)
        self.terminated = np.zeros(capacity, bool)
        self.truncated = np.zeros(capacity, bool)
        self.frames.fill(1)
        self.i = 0

    def push(self, row) -> None:
        i = self.i
        self.frames[i] = row["obs"][-1]
        self.action[i] = row["action"]
        self.reward[i] = row["reward"]
        self.terminated[i] = row["terminated"]
        self.truncated[i] = row["truncated"]
        self.i = i + 1 if i + 1 < self.frames.shape[0] else 0


class FrameSample:
    params = [["aos", "soa", "full", "memcpy"], [32]]
    param_names = ["layout", "batch"]
    repeat = _MANY
    timeout = 600

    def setup(self, layout, batch):
        warm_kernels()
        if layout == "memcpy":
            if "memcpy" not in _CACHE:
                out_bytes = 2 * batch * K * FRAME[0] * FRAME[1] + batch * 14
                _CACHE["memcpy"] = MemcpyReference(out_bytes, CAPACITY * FRAME[0] * FRAME[1])
            self.op = _CACHE["memcpy"].copy
            return
        buf = _buffer(layout)
        if first_time("sample", layout, batch):
            for _ in range(20):
                buf.sample(batch)
        self.op = lambda: buf.sample(batch)

    def time_sample(self, layout, batch):
        self.op()


class FramePush:
    params = [["aos", "soa", "full", "numpy"]]
    param_names = ["layout"]
    repeat = _MANY
    timeout = 600

    def setup(self, layout):
        warm_kernels()
        key = ("push", layout)
        if key not in _CACHE:
            block = _block()
            rows = [{f: (v[i] if v.ndim > 1 else v[i].item()) for f, v in block.items()}
                    for i in range(BLOCK)]
            buf = _Numpy(CAPACITY) if layout == "numpy" else _buffer(layout)
            _CACHE[key] = [buf, rows, 0]
            for row in rows:  # the ring is full, the block starts an episode: a continuous stream
                buf.push(row)
        self.state = _CACHE[key]

    def time_push(self, layout):
        s = self.state
        i = s[2]
        s[0].push(s[1][i])
        s[2] = i + 1 if i + 1 < BLOCK else 0


class FrameMemory:
    params = [["aos", "soa", "full"]]
    param_names = ["layout"]
    timeout = 600

    def _options(self, layout):
        return {"layout": "aos"} if layout == "full" else {"layout": layout, "frame_stack": K}

    def track_bytes_per_row_1m(self, layout):
        plan = tfdata.ReplayBuffer.plan_memory(SPEC, 1_000_000, **self._options(layout))
        return sum(plan.values()) / 1_000_000
    track_bytes_per_row_1m.unit = "bytes"

    def track_over_one_frame(self, layout):
        """Bytes per row over one frame plus the other fields' bytes (target <= 1.05)."""
        per_row = self.track_bytes_per_row_1m(layout)
        return per_row / (FRAME[0] * FRAME[1] + 8 + 4 + 1 + 1)
    track_over_one_frame.unit = "ratio"

    def peakmem_fill_10k(self, layout):
        block = _block()
        buf = tfdata.ReplayBuffer(SPEC, 10_000, seed=0, **self._options(layout))
        for _ in range(10_000 // BLOCK):
            buf.extend(block)
        gc.collect()
        self.rss = psutil.Process().memory_info().rss
