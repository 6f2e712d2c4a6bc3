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

* ``ColdSample``: ``time_sample``, ``sample(32)`` of ``obs`` and ``next_obs`` stacks
  (``uint8[4, 84, 84]`` each) from a full frame-stacked buffer of 20,000 Breakout rows (one
  stored frame per row: 141 MB of frames) that spills to a file with 50% or 90% of its rows
  cold (``hot_rows`` 10,000 or 2,000). ``tier``:

  - ``"zstd"``: ``compress_cold=True``, cold frames read from their compressed blocks (zstd,
    blocks of 16 slots, decompressed into the tier's cache);
  - ``"spill"``: the same spilling buffer without the tier: cold pages released with
    ``MADV_DONTNEED`` and read back from the page cache (which holds the whole file here);
  - ``"disk"``: ``"spill"`` with the file's pages dropped from the page cache before every
    timed call (``fsync`` once, then ``posix_fadvise(POSIX_FADV_DONTNEED)`` after the cold part
    of the map is released): cold frames come from the disk, as on a machine whose page cache
    cannot hold the file (Linux only; elsewhere it is ``"spill"``);
  - ``"ram"``: the frame-stacked buffer in RAM (the reference: every frame resident).

  ``track_ratio``: the tier's compression ratio (raw frames / compressed bytes of the blocks
  held; 1 for the other tiers). ``track_resident_mib``: the buffer's own memory as
  :attr:`~tfdata.ReplayBuffer.nbytes` counts it (hot rows, bookkeeping, the tier, the output
  ring), in MiB.

Frames of ``ColdSample``: ``ALE/Breakout-v5`` through gymnasium's ``AtariPreprocessing`` (frame skip 4, 84x84
grayscale, up to 30 no-ops) and ``FrameStackObservation(4)``, a random policy, seed 0, episodes
back to back; generated once per machine (20,001 steps, ~15 s) into the temporary directory and
reused (the newest frame of each step and the final frames; the stacks are rebuilt as the
wrapper builds them, checked against it while generating). Without ``ale-py`` (the ``atari``
extra) the benchmark is skipped (``NotImplementedError``).

The data of the other classes are one consistent stream as gymnasium's ``FrameStackObservation`` (reset padding)
returns it: frames are random bytes, episodes end every 1,000 steps on average and the block's
last row ends one, so a block can be written again and again.
"""

from __future__ import annotations

import gc
import os
import tempfile

import numpy as np
import psutil

import tfdata

from .common import MemcpyReference, first_time, tmpdir, warm_kernels

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


# -- the compressed cold tier, on real Atari frames --------------------------------------------
ROWS = 20_000
BATCH = 32
_COLD: dict = {}


def atari_frames(steps: int = ROWS + 1, seed: int = 0, game: str = "Breakout") -> dict:
    """``steps`` steps of ``game`` (see the module docstring) as arrays: ``frames`` uint8
    ``(steps, 84, 84)`` (the newest frame of each step's obs), ``finals`` uint8 ``(F, 84, 84)``
    (the newest frame of next_obs of each episode-ending step), ``action`` int64, ``reward``
    float32, ``terminated``/``truncated`` bool ``(steps,)``. Cached in the temporary directory."""
    path = os.path.join(tempfile.gettempdir(), f"tfdata-bench-{game.lower()}-{steps}-{seed}.npz")
    if os.path.exists(path):
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    try:
        import ale_py
        import gymnasium as gym
        from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation
    except ImportError:
        raise NotImplementedError("needs gymnasium and ale-py (the atari extra)") from None
    gym.register_envs(ale_py)
    env = FrameStackObservation(AtariPreprocessing(gym.make(f"ALE/{game}-v5", frameskip=1),
                                                   frame_skip=4, screen_size=84, noop_max=30), K)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    out = {"frames": np.empty((steps,) + FRAME, np.uint8), "action": np.empty(steps, np.int64),
           "reward": np.empty(steps, np.float32), "terminated": np.empty(steps, bool),
           "truncated": np.empty(steps, bool)}
    finals = []
    rebuilt = Stacks()
    for t in range(steps):
        a = int(env.action_space.sample())
        nxt, r, te, tr, _ = env.step(a)
        out["frames"][t] = obs[-1]
        out["action"][t], out["reward"][t], out["terminated"][t], out["truncated"][t] = a, r, te, tr
        if te or tr:
            finals.append(nxt[-1])
        o, n = rebuilt.step(obs[-1], te or tr, nxt[-1])
        assert np.array_equal(o, obs) and np.array_equal(n, nxt), t  # the wrapper's stacks
        obs = env.reset()[0] if te or tr else nxt
    env.close()
    out["finals"] = np.array(finals, np.uint8).reshape((-1,) + FRAME)
    tmp = path + f".{os.getpid()}.tmp.npz"
    np.savez(tmp, **out)
    os.replace(tmp, path)
    return out


class Stacks:
    """FrameStackObservation's stacks (padding "reset") rebuilt from the newest frames."""

    def __init__(self):
        self.q = None

    def step(self, frame, ends: bool, final):
        if self.q is None:
            self.q = [frame] * K
        else:
            self.q = self.q[1:] + [frame]
        obs = np.stack(self.q)
        nxt = np.stack(self.q[1:] + [final])
        if ends:
            self.q = None
        return obs, nxt


def transitions(data: dict, start: int, stop: int, stacks: Stacks, finals: list) -> dict:
    """Rows ``[start, stop)`` of ``data`` with their stacks (``finals``: the final frames not
    taken yet, consumed in order)."""
    n = stop - start
    obs = np.empty((n, K) + FRAME, np.uint8)
    nxt = np.empty((n, K) + FRAME, np.uint8)
    frames = data["frames"]
    for i in range(n):
        t = start + i
        ends = bool(data["terminated"][t] or data["truncated"][t])
        final = finals.pop(0) if ends else frames[t + 1]
        obs[i], nxt[i] = stacks.step(frames[t], ends, final)
    return {"obs": obs, "next_obs": nxt, "action": data["action"][start:stop],
            "reward": data["reward"][start:stop], "terminated": data["terminated"][start:stop],
            "truncated": data["truncated"][start:stop]}


def filled(layout: str, cold: float, tier: str):
    """The full buffer of ``ROWS`` Breakout rows (built once per process)."""
    key = (layout, cold, tier)
    buf = _COLD.get(key)
    if buf is not None:
        return buf
    data = atari_frames()
    kw = dict(layout=layout, seed=0, frame_stack=K)
    if tier != "ram":
        path = os.path.join(tmpdir("frames"), f"spill-{layout}-{cold}-{tier}" + (".npy" if layout == "aos" else ""))
        kw.update(spill_path=path, hot_rows=max(1, round(ROWS * (1 - cold))),
                  compress_cold=tier == "zstd")
    buf = tfdata.ReplayBuffer(SPEC, ROWS, **kw)
    stacks, finals = Stacks(), list(data["finals"])
    for start in range(0, ROWS, 1000):  # (one step more: the last row's next frame)
        buf.extend(transitions(data, start, min(start + 1000, ROWS), stacks, finals))
    _COLD[key] = buf
    return buf


def drop_cold_pages(buf) -> bool:
    """Release the cold part of a spilling buffer's map and drop its file's pages from the page
    cache (the pages it maps stay: the hot rows); False where that is not possible."""
    if not hasattr(os, "posix_fadvise"):
        return False
    buf.release_cold()
    path = buf.spill_path
    files = [path] if os.path.isfile(path) else [os.path.join(path, f) for f in os.listdir(path)]
    for name in files:
        if name.endswith(".npy"):
            fd = os.open(name, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return True


def sync_files(buf) -> None:
    path = buf.spill_path
    files = [path] if os.path.isfile(path) else [os.path.join(path, f) for f in os.listdir(path)]
    for name in files:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class ColdSample:
    """``sample(32)`` of Atari obs + next_obs stacks from 20,000 rows, 50% or 90% cold: the
    compressed cold tier against the uncompressed spill (page cache, disk) and RAM."""

    params = [["aos", "soa"], [0.5, 0.9], ["zstd", "spill", "disk", "ram"]]
    param_names = ["layout", "cold", "tier"]
    repeat = (50, 500, 3.0)
    timeout = 600

    def setup(self, layout, cold, tier):
        warm_kernels()
        self.buf = filled(layout, cold, tier)
        if first_time("cold-sample", layout, cold, tier):
            for _ in range(20):  # the output ring, the caches
                self.buf.sample(BATCH)
            if tier == "disk":
                sync_files(self.buf)  # dirty pages cannot be dropped
        if tier == "disk":
            drop_cold_pages(self.buf)

    def time_sample(self, layout, cold, tier):
        self.buf.sample(BATCH)

    def track_ratio(self, layout, cold, tier):
        info = self.buf.cold_info
        return 1.0 if info is None else float(info["obs"]["ratio"])

    track_ratio.unit = "ratio"

    def track_resident_mib(self, layout, cold, tier):
        return self.buf.nbytes / 2**20

    track_resident_mib.unit = "MiB"
