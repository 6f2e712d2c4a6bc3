"""Baselines for the memory of an Atari replay buffer: what the usual buffers cost, measured.

* ``sb3``: stable-baselines3's ``ReplayBuffer`` for ``Box(0, 255, (4, 84, 84), uint8)``
  observations, storing ``observations`` and ``next_observations`` (two 4-frame stacks a row);
* ``sb3-optimized``: the same with ``optimize_memory_usage=True`` (next_obs read from the next
  row; SB3 requires ``handle_timeout_termination=False`` with it);
* ``numpy``: a hand-written numpy buffer that stores the full obs and next_obs stacks (what a
  naive DQN buffer does), sampled with fancy indexing.

And the references ``experiments/atari_frames.py`` checks and times tfdata against: the full
stacks in a ring placed as tfdata places rows (:class:`NaiveRing`, with its own n-step windows),
and a hand-written one-frame-per-row ring with and without tfdata's checks
(:class:`NumpyFrameBuffer`, :class:`CheckedNumpyFrameBuffer`).

Each measurement runs in a fresh forked process (:func:`_timing.run_forked`; the 3,000
source transitions, 170 MB, are resident before and after, so they cancel out): resident
memory (RSS) before the buffer is built, after it is built (SB3 and numpy allocate with
``np.zeros``: pages become resident only when written) and after ``fill`` transitions were added
one at a time through the buffer's own ``add``; then the time of ``sample(32)`` (SB3: its public
``sample``, which returns torch tensors; numpy: obs and next_obs gathered with fancy indexing).
The bytes a buffer plans for a capacity are measured from the arrays of a small instance
(``nbytes`` per row) and scaled, so a 1M-transition plan needs no 56 GB allocation.

The transitions are real: ``atari_transitions`` (ALE Breakout, random policy) gives a few
thousand, added in a cycle until ``fill`` rows are in (RSS does not depend on the bytes written,
only on the pages touched).

    python experiments/_atari_baselines.py                 # 100k rows each, JSON + table
    python experiments/_atari_baselines.py --fill 20000    # smaller

Public APIs only (stable-baselines3, numpy, gymnasium). Needs the ``dqn`` and ``atari`` extras.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
from _envs import ATARI_FIELDS, atari_transitions  # noqa: E402
from _render import text_table  # noqa: E402
from _timing import fresh_pages_allocator, rss_bytes, run_forked  # noqa: E402

OBS_SHAPE = (4, 84, 84)
FRAME = OBS_SHAPE[1:]
KINDS = ("sb3", "sb3-optimized", "numpy")
BATCH = 32


class NumpyStackBuffer:
    """The naive Atari buffer: every transition's obs and next_obs stacks stored in full.

    Parameters
    ----------
    capacity : int
        Rows.
    obs_shape : tuple
        Of one observation (``(4, 84, 84)``).

    Attributes
    ----------
    obs, next_obs : numpy.ndarray
        uint8 ``(capacity, *obs_shape)``.
    action : numpy.ndarray
        int64 ``(capacity,)``.
    reward : numpy.ndarray
        float32 ``(capacity,)``.
    terminated, truncated : numpy.ndarray
        bool ``(capacity,)``.
    """

    def __init__(self, capacity: int, obs_shape=OBS_SHAPE):
        self.capacity, self.pos, self.full = capacity, 0, False
        self.obs = np.zeros((capacity, *obs_shape), np.uint8)
        self.next_obs = np.zeros((capacity, *obs_shape), np.uint8)
        self.action = np.zeros(capacity, np.int64)
        self.reward = np.zeros(capacity, np.float32)
        self.terminated = np.zeros(capacity, bool)
        self.truncated = np.zeros(capacity, bool)

    def add(self, obs, next_obs, action, reward, terminated, truncated) -> None:
        i = self.pos
        self.obs[i], self.next_obs[i] = obs, next_obs
        self.action[i], self.reward[i] = action, reward
        self.terminated[i], self.truncated[i] = terminated, truncated
        self.pos = (i + 1) % self.capacity
        self.full = self.full or self.pos == 0

    def __len__(self) -> int:
        return self.capacity if self.full else self.pos

    def sample(self, batch_size: int, rng) -> dict:
        """Uniform rows, gathered into new arrays (obs and next_obs uint8 ``(batch, 4, 84, 84)``)."""
        idx = rng.integers(0, len(self), batch_size)
        return {"obs": self.obs[idx], "next_obs": self.next_obs[idx], "action": self.action[idx],
                "reward": self.reward[idx], "terminated": self.terminated[idx], "truncated": self.truncated[idx]}


class NaiveRing:
    """The full stacks the environments returned, in a hand-written numpy ring of full stacks
    (``_atari_baselines.NumpyStackBuffer``): row ``g`` (in write order) at slot ``g % capacity``,
    as tfdata places rows. Reads by slot; computes n-step windows itself."""

    def __init__(self, capacity: int, num_envs: int):
        self.buf = NumpyStackBuffer(capacity)
        self.capacity, self.num_envs, self.written = capacity, num_envs, 0
        self.row = np.full(capacity, -1, np.int64)  # slot -> row number held

    def write(self, rows: dict) -> None:
        for i in range(len(rows["action"])):
            self.buf.add(*(rows[f][i] for f in ("obs", "next_obs", "action", "reward", "terminated", "truncated")))
            self.row[self.written % self.capacity] = self.written
            self.written += 1

    def gather(self, idx) -> dict:
        return {f: getattr(self.buf, f)[idx] for f in ATARI_FIELDS}

    def nstep(self, idx, n: int, gamma: float) -> dict:
        """Windows of up to ``n`` rows of each start row's stream, stopping after an episode end
        or at the stream's newest row; the return summed in float64 in order, ``gamma ** k``."""
        b, cap, E = self.buf, self.capacity, self.num_envs
        out = self.gather(idx)
        disc = np.empty(len(idx), np.float32)
        for i, s in enumerate(np.asarray(idx)):
            g, acc, gk = int(self.row[s]), 0.0, 1.0
            assert g >= 0, "a sampled slot holds no row"
            for k in range(n):
                j = g % cap
                acc += gk * float(b.reward[j])
                if b.terminated[j] or b.truncated[j] or k == n - 1 or g + E >= self.written:
                    break
                gk *= gamma
                g += E
            disc[i] = gk * gamma
            out["reward"][i] = acc
            out["next_obs"][i], out["terminated"][i], out["truncated"][i] = b.next_obs[j], b.terminated[j], b.truncated[j]
        out["discounts"] = disc
        return out


class NumpyFrameBuffer:
    """The hand-written one-frame-per-row ring: writes the newest frame and the small fields,
    checks nothing, keeps no episode bookkeeping (so it cannot rebuild stacks at episode starts:
    the floor of what writing a transition costs, not a usable buffer).

    Attributes
    ----------
    frames : numpy.ndarray
        uint8 ``(capacity, 84, 84)``.
    action, reward, terminated, truncated : numpy.ndarray
        int64, float32, bool, bool ``(capacity,)``.
    """

    def __init__(self, capacity: int):
        self.frames = np.zeros((capacity, *FRAME), np.uint8)
        self.action = np.zeros(capacity, np.int64)
        self.reward = np.zeros(capacity, np.float32)
        self.terminated = np.zeros(capacity, bool)
        self.truncated = np.zeros(capacity, bool)
        self.i = 0

    def push(self, row) -> None:
        i = self.i
        self.frames[i] = row["obs"][-1]
        self.action[i] = row["action"]
        self.reward[i] = row["reward"]
        self.terminated[i] = row["terminated"]
        self.truncated[i] = row["truncated"]
        self.i = i + 1 if i + 1 < len(self.action) else 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.frames, self.action, self.reward, self.terminated, self.truncated))


class CheckedNumpyFrameBuffer(NumpyFrameBuffer):
    """:class:`NumpyFrameBuffer` plus, in numpy, the checks tfdata's push makes before it writes:
    ``next_obs[:-1] == obs[1:]``, and ``obs`` continues the stream (equal to the previous row's
    ``next_obs``; after an episode end, its older frames equal its newest: reset padding). What
    checking costs when written by hand (it reads both stacks and the previous one)."""

    def __init__(self, capacity: int):
        super().__init__(capacity)
        self.prev = None  # the previous row's next_obs; None: the next row starts an episode

    def push(self, row) -> None:
        obs, nxt = row["obs"], row["next_obs"]
        ok = (obs[:-1] == obs[-1]).all() if self.prev is None else np.array_equal(obs, self.prev)
        if not ok or not np.array_equal(nxt[:-1], obs[1:]):
            raise ValueError("the row does not continue its stream")
        super().push(row)
        self.prev = None if row["terminated"] or row["truncated"] else nxt


def make_buffer(kind: str, capacity: int, num_actions: int = 4):
    """A buffer of ``kind`` (see :data:`KINDS`) for Atari observations."""
    if kind == "numpy":
        return NumpyStackBuffer(capacity)
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    obs_space = spaces.Box(0, 255, OBS_SHAPE, np.uint8)
    optimized = kind == "sb3-optimized"
    return ReplayBuffer(capacity, obs_space, spaces.Discrete(num_actions), device="cpu", n_envs=1,
                        optimize_memory_usage=optimized, handle_timeout_termination=not optimized)


def buffer_arrays_bytes(buf) -> int:
    """Bytes of the numpy arrays a buffer holds (its attributes)."""
    return int(sum(v.nbytes for v in vars(buf).values() if isinstance(v, np.ndarray)))


def planned_bytes(kind: str, capacity: int) -> int:
    """Bytes ``kind`` allocates for ``capacity`` rows, from the arrays of a 1,000-row instance."""
    small = 1000
    return buffer_arrays_bytes(make_buffer(kind, small)) * capacity // small


def add(kind: str, buf, d: dict, i: int) -> None:
    if kind == "numpy":
        buf.add(d["obs"][i], d["next_obs"][i], d["action"][i], d["reward"][i], d["terminated"][i], d["truncated"][i])
    else:  # SB3's add: arrays with an env axis; done = terminated or truncated
        done = bool(d["terminated"][i] or d["truncated"][i])
        buf.add(d["obs"][i][None], d["next_obs"][i][None], np.array([[d["action"][i]]]),
                np.array([d["reward"][i]]), np.array([done]), [{"TimeLimit.truncated": bool(d["truncated"][i])}])


def _mmap_threshold(nbytes: int) -> None:
    """glibc's M_MMAP_THRESHOLD (best effort: nothing elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, nbytes)
    except (OSError, AttributeError):
        pass


def measure(kind: str, capacity: int, fill: int, d: dict, samples: int) -> dict:
    """In the calling (fresh) process: RSS around building and filling, then ``sample(32)`` times."""
    # fresh pages for the buffer (a forked child could otherwise reuse heap pages its parent
    # touched), then a high threshold again before sampling: with 4 KiB every batch would page-fault
    fresh = fresh_pages_allocator()
    if kind != "numpy":  # what SB3 imports (torch) is resident before the buffer is built
        import stable_baselines3  # noqa: F401
        import torch  # noqa: F401
    # a small buffer of the kind first: what its first construction initialises once (torch's
    # device, the spaces) is not counted as the buffer's (it depends on what ran before)
    make_buffer(kind, 8, int(d["num_actions"]))
    rng = np.random.default_rng(0)
    r0 = rss_bytes()
    buf = make_buffer(kind, capacity, int(d["num_actions"]))
    r1 = rss_bytes()
    n = len(d["obs"])
    t0 = time.perf_counter()
    for i in range(fill):
        add(kind, buf, d, i % n)
    fill_s = time.perf_counter() - t0
    r2 = rss_bytes()
    _mmap_threshold(32 << 20)
    sample = (lambda: buf.sample(BATCH, rng)) if kind == "numpy" else (lambda: buf.sample(BATCH))
    for _ in range(20):
        sample()
    ts = np.empty(samples, np.int64)
    pc = time.perf_counter_ns
    for k in range(samples):
        t = pc()
        sample()
        ts[k] = pc() - t
    return {"kind": kind, "capacity": capacity, "filled": fill, "fresh_pages_allocator": fresh, "rss_before": r0, "rss_after_build": r1, "rss_after_fill": r2,
            "build_rss_growth": r1 - r0, "fill_rss_growth": r2 - r0,
            "arrays_bytes": buffer_arrays_bytes(buf), "fill_s": fill_s, "add_us": fill_s / fill * 1e6,
            "sample32_us_median": float(np.median(ts)) / 1e3, "sample32_us_p99": float(np.percentile(ts, 99)) / 1e3,
            "samples_timed": samples}


def run(fill: int = 100_000, capacity: int | None = None, source_steps: int = 3000, samples: int = 2000,
        plan_for: int = 1_000_000, kinds=KINDS, log=print) -> dict:
    """Every kind in its own forked process, filled with ``fill`` real transitions (cycled from a
    ``source_steps`` Breakout rollout) in a buffer of ``capacity`` (default ``fill``) rows."""
    capacity = capacity or fill
    d = atari_transitions("Breakout", source_steps, seed=0)
    out = {"source": {"game": "Breakout", "policy": "random", "transitions": source_steps,
                      "episode_ends": int((d["terminated"] | d["truncated"]).sum())},
           "plan_for": plan_for, "results": []}
    for kind in kinds:
        r = run_forked(measure, kind, capacity, fill, d, samples)
        r["planned_bytes"] = planned_bytes(kind, plan_for)
        r["planned_bytes_per_row"] = planned_bytes(kind, 1000) / 1000
        out["results"].append(r)
        log(f"{kind}: {json.dumps({k: r.get(k) for k in ('fill_rss_growth', 'arrays_bytes', 'sample32_us_median', 'error')})}")
    return out


def table(out: dict) -> str:
    mib = lambda b: f"{b / 2**20:,.0f} MiB"  # noqa: E731
    rows = [[r["kind"], mib(r["rss_after_build"] - r["rss_before"]), mib(r["fill_rss_growth"]), mib(r["arrays_bytes"]),
             f"{r['planned_bytes'] / 2**30:,.1f} GiB", f"{r['add_us']:.1f}",
             f"{r['sample32_us_median']:.0f} ({r['sample32_us_p99']:.0f})"] for r in out["results"] if "error" not in r]
    return text_table(["buffer", "RSS after build", f"RSS after {out['results'][0]['filled']:,} rows",
                       "arrays (planned)", f"planned for {out['plan_for']:,}", "add µs", "sample(32) µs (p99)"], rows)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fill", type=int, default=100_000)
    ap.add_argument("--capacity", type=int, default=None)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--json", default=None, help="write the measurements to this file")
    a = ap.parse_args()
    res = run(a.fill, a.capacity, samples=a.samples)
    print(table(res))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(res, f, indent=1)
