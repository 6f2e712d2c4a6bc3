"""Frame-stacked buffers on real Atari frames: the compressed cold tier of a spilling buffer.

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

Frames: ``ALE/Breakout-v5`` through gymnasium's ``AtariPreprocessing`` (frame skip 4, 84x84
grayscale, up to 30 no-ops) and ``FrameStackObservation(4)``, a random policy, seed 0, episodes
back to back; generated once per machine (20,001 steps, ~15 s) into the temporary directory and
reused (the newest frame of each step and the final frames; the stacks are rebuilt as the
wrapper builds them, checked against it while generating). Without ``ale-py`` (the ``atari``
extra) the benchmark is skipped (``NotImplementedError``).

    asv run --python=same --show-stderr -b bench_frames
"""

from __future__ import annotations

import os
import shutil
import tempfile

import numpy as np

import tfdata

from .common import first_time, warm_kernels

K = 4
FRAME = (84, 84)
ROWS = 20_000
BATCH = 32
SPEC = tfdata.Spec({
    "obs": ("u1", (K,) + FRAME),
    "next_obs": ("u1", (K,) + FRAME),
    "action": "i8",
    "reward": "f4",
    "terminated": "?",
    "truncated": "?",
})
_CACHE: dict = {}
_DIR: list = []


def _tmpdir() -> str:
    if not _DIR:
        import atexit

        path = tempfile.mkdtemp(prefix="tfdata-bench-frames-")
        atexit.register(shutil.rmtree, path, True)
        _DIR.append(path)
    return _DIR[0]


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
    buf = _CACHE.get(key)
    if buf is not None:
        return buf
    data = atari_frames()
    kw = dict(layout=layout, seed=0, frame_stack=K)
    if tier != "ram":
        path = os.path.join(_tmpdir(), f"spill-{layout}-{cold}-{tier}" + (".npy" if layout == "aos" else ""))
        kw.update(spill_path=path, hot_rows=max(1, round(ROWS * (1 - cold))),
                  compress_cold=tier == "zstd")
    buf = tfdata.ReplayBuffer(SPEC, ROWS, **kw)
    stacks, finals = Stacks(), list(data["finals"])
    for start in range(0, ROWS, 1000):  # (one step more: the last row's next frame)
        buf.extend(transitions(data, start, min(start + 1000, ROWS), stacks, finals))
    _CACHE[key] = buf
    return buf


def drop_cold_pages(buf) -> bool:
    """Release the cold part of a spilling buffer's map and drop its file's pages from the page
    cache (the pages it maps stay: the hot rows); False where that is not possible."""
    if not hasattr(os, "posix_fadvise"):
        return False
    spill = buf._spill  # noqa: SLF001 (a benchmark reaches into the policy to empty the cache)
    spill._release(spill.written, spill.written + spill.capacity - spill.hot_rows)  # noqa: SLF001
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
