"""Replay buffer operations: push, extend, sample (whole rows or some fields), build+fill, and
sampling tail latency.

Every class takes the layout as its first parameter; ``"numpy"`` is the hand-written baseline
of :mod:`benchmarks.common` (``"memcpy"`` the raw copy floor for image rows, ``"floor"`` the bare
compiled sampling loop of :class:`Sample`), so each figure has its ratio to the baseline inside
the same run. Buffers are filled before anything is timed:
the first touch of fresh memory costs page faults that would swamp the operation itself.
"""

from __future__ import annotations

import gc
from functools import partial

import numpy as np
import psutil

import tfdata

from .common import (CAPACITIES, CARTPOLE, HOT, IMAGE, IMAGE_CAPACITY, LAYOUTS, build_and_fill,
                     fill_chunk, filled_buffer, first_time, memcpy_reference, new_buffer, one_row,
                     p99_over_median, random_rows, warm_kernels)

# every operation below is timed one call per sample (asv forces number=1 when a class has a
# setup), so take many samples: the median of thousands of single calls is stable
_MANY_SAMPLES = (200, 2000, 2.0)

_ROWS: dict = {}


def _cached_rows(key, make):
    value = _ROWS.get(key)
    if value is None:
        value = _ROWS[key] = make()
    return value


class Push:
    """Append one CartPole row, as a gymnasium step returns it, to a full buffer (cursor wraps)."""

    params = [LAYOUTS, CAPACITIES]
    param_names = ["layout", "capacity"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, capacity):
        warm_kernels()
        self.buf = filled_buffer(layout, CARTPOLE, capacity)
        self.row = _cached_rows("push", lambda: one_row(CARTPOLE, seed=2))

    def time_push(self, layout, capacity):
        self.buf.push(self.row)


def env_rows(values: str, count: int = 1024) -> list:
    """``count`` CartPole rows as one gymnasium environment hands them to user code: ``obs`` and
    ``next_obs`` float32 views of consecutive rows of one larger array, and the scalars as
    CartPole-v1 returns them (``"python"``: a Python int action, float reward and bools) or as
    numpy scalars (``"numpy"``: ``action_space.sample()``'s int64, a float64 reward, numpy bool
    flags, as wrappers and vector envs give them)."""
    rng = np.random.default_rng(6)
    obs = rng.standard_normal((count + 1, 4), dtype=np.float32)
    actions, rewards, ends = rng.integers(0, 2, count), rng.random(count), rng.random(count) < 0.05
    rows = []
    for k in range(count):
        if values == "python":
            a, r, t, tr = int(actions[k]), float(rewards[k]), bool(ends[k]), False
        else:
            a, r, t, tr = actions[k], np.float64(rewards[k]), ends[k], np.bool_(False)
        rows.append({"obs": obs[k], "action": a, "reward": r, "next_obs": obs[k + 1],
                     "terminated": t, "truncated": tr})
    return rows


class PushEnvRow:
    """Append one CartPole row as an environment hands it (:func:`env_rows`: observations that
    are views of a larger array, Python or numpy scalars), a different row each call, to a full
    buffer of 1M rows (the cursor wraps). ``"numpy"`` is the hand-written ring's push."""

    params = [LAYOUTS + ["groups"], ["python", "numpy"]]
    param_names = ["layout", "values"]
    repeat = _MANY_SAMPLES
    capacity = 1_000_000

    def setup(self, layout, values):
        warm_kernels()
        self.push = filled_buffer(layout, CARTPOLE, self.capacity).push
        self.rows = _cached_rows(("env", values), partial(env_rows, values))
        self.k = _cached_rows(("env-k", layout, values), lambda: [0])
        if first_time("env-row", layout, values):
            for row in self.rows:
                self.push(row)

    def time_push(self, layout, values):
        k = self.k[0]
        self.push(self.rows[k & 1023])
        self.k[0] = k + 1


class Extend:
    """Append 1000 CartPole rows (one array per field, exact dtypes) to a full buffer."""

    params = [LAYOUTS, CAPACITIES]
    param_names = ["layout", "capacity"]
    repeat = _MANY_SAMPLES
    rows = 1000

    def setup(self, layout, capacity):
        warm_kernels()
        self.buf = filled_buffer(layout, CARTPOLE, capacity)
        self.batch = _cached_rows("extend", lambda: random_rows(CARTPOLE, self.rows, seed=3))

    def time_extend(self, layout, capacity):
        self.buf.extend(self.batch)


# -- the floor of a uniform sample: RNG and record copy in one compiled call, no Python -------
_GOLDEN = 0x9E3779B97F4A7C15
_FLOOR: dict = {}


def _floor_kernel():
    """The bare loop a uniform sample cannot beat, compiled once per process (not cached).

    One njit call that does a sample's whole work: draws ``len(idx)`` uniform rows with the
    counter RNG tfdata uses (splitmix64's finaliser, Lemire's multiply-shift with rejection)
    into ``idx``, then copies each row with numba's whole-record assignment ``out[i] = rec[j]``
    (the fastest gather measured here, see ../shared/performance-notes.md; drawing and copying
    in one loop was 1.6-2.3x slower). No lock, no checks, no output ring, no batch object.
    """
    kernel = _FLOOR.get("kernel")
    if kernel is None:
        import numpy as np
        from numba import njit

        golden, m1, m2 = (np.uint64(v) for v in (_GOLDEN, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))
        s27, s30, s31, s32 = (np.uint64(v) for v in (27, 30, 31, 32))
        low32, two32, one = np.uint64(0xFFFFFFFF), np.uint64(1 << 32), np.uint64(1)

        @njit(nogil=True, boundscheck=False, error_model="numpy")
        def sample_floor(records, n, state, idx, out):
            nn = np.uint64(n)
            threshold = (two32 - nn) % nn
            key, ctr = state[0], state[1]
            for i in range(idx.shape[0]):
                while True:
                    z = key + ctr * golden
                    ctr += one
                    z = (z ^ (z >> s30)) * m1
                    z = (z ^ (z >> s27)) * m2
                    z = z ^ (z >> s31)
                    m = (z >> s32) * nn
                    if (m & low32) >= threshold:
                        break
                idx[i] = np.int64(m >> s32)
            state[1] = ctr
            for i in range(idx.shape[0]):  # a pass of its own: more rows' misses in flight
                out[i] = records[idx[i]]

        kernel = _FLOOR["kernel"] = sample_floor
    return kernel


def _floor_records(capacity: int):
    """``capacity`` CartPole rows in one aligned structured array (48 B records), filled."""
    import numpy as np

    key = ("records", capacity)
    records = _FLOOR.get(key)
    if records is None:
        chunk = fill_chunk(CARTPOLE)
        dtype = np.dtype([(f.name, f.dtype, f.shape) for f in CARTPOLE], align=True)
        records = np.zeros(capacity, dtype)
        rows = len(next(iter(chunk.values())))
        for start in range(0, capacity, rows):
            stop = min(capacity, start + rows)
            for name, values in chunk.items():
                records[name][start:stop] = values[:stop - start]
        _FLOOR[key] = records
    return records


def sample_floor(capacity: int, batch: int):
    """A callable doing :func:`_floor_kernel`'s sample of ``batch`` rows from ``capacity``.

    One per process and shape, like the buffers of :func:`filled_buffer`: asv calls ``setup``
    before every timed call, and a fresh RNG state would draw the same (cache-hot) rows each time.
    """
    import numpy as np

    key = ("op", capacity, batch)
    op = _FLOOR.get(key)
    if op is None:
        records = _floor_records(capacity)
        state = np.array([_GOLDEN, 0], np.uint64)
        idx = np.zeros(batch, np.int64)
        out = np.zeros(batch, records.dtype)
        op = _FLOOR[key] = partial(_floor_kernel(), records, capacity, state, idx, out)
    return op


class ExtendStep:
    """Append one vector-env step as gymnasium returns it (CleanRL's arrays): ``rows`` rows with
    float32 observations, int64 actions, float64 rewards and bool flags (the buffer converts
    the rewards to its float32 field). ``"sb3"`` is stable-baselines3's ``ReplayBuffer.add`` of
    the same step (``rows`` envs; needs the optional stable-baselines3), ``"numpy"`` the
    hand-written baseline's ``extend``."""

    params = [LAYOUTS + ["sb3"], [1, 8, 16]]
    param_names = ["layout", "rows"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, rows):
        warm_kernels()
        rng = np.random.default_rng(4)
        obs = rng.standard_normal((rows, 4), dtype=np.float32)
        step = {"obs": obs, "action": rng.integers(0, 2, rows), "reward": np.ones(rows),
                "next_obs": obs + 1, "terminated": rng.random(rows) < 0.05,
                "truncated": np.zeros(rows, bool)}
        if layout == "sb3":
            try:
                import gymnasium as gym
                from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer
            except ImportError:
                raise NotImplementedError("stable-baselines3 is not installed") from None
            box = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
            sb = SB3Buffer(100_000, box, gym.spaces.Discrete(2), "cpu", n_envs=rows,
                           handle_timeout_termination=False)
            done, infos = step["terminated"], [{}] * rows
            self.op = partial(sb.add, step["obs"], step["next_obs"], step["action"][:, None],
                              step["reward"], done, infos)
        else:
            buf = filled_buffer(layout, CARTPOLE, CAPACITIES[0])
            self.op = partial(buf.extend, step)
        for _ in range(3):
            self.op()

    def time_extend(self, layout, rows):
        self.op()


class ExtendElidedStep:
    """:class:`ExtendStep` into a buffer that does not store ``next_obs`` (``elide_next=True``,
    ``rows`` streams, a full ring of :data:`CAPACITIES[0] <CAPACITIES>` rows): the same
    gymnasium arrays, ``obs`` continuing each stream (the step's ``obs`` is its ``next_obs``),
    one stream in 20 ending its episode (a final-table entry written, one recycled).
    ``"numpy"`` is the hand-written baseline's ``extend``, which stores ``next_obs``."""

    params = [LAYOUTS, [1, 8]]
    param_names = ["layout", "rows"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, rows):
        warm_kernels()
        rng = np.random.default_rng(4)
        obs = rng.standard_normal((rows, 4), dtype=np.float32)
        ends = np.zeros(rows, bool)
        ends[::20] = rows >= 20
        step = {"obs": obs, "action": rng.integers(0, 2, rows), "reward": np.ones(rows),
                "next_obs": obs, "terminated": ends, "truncated": np.zeros(rows, bool)}
        if rows < 20:  # one stream in 20 on average: every 20th step ends every stream
            end = dict(step, terminated=np.ones(rows, bool))
            steps = [step] * 19 + [end]
        else:
            steps = [step]
        self.ops, self.k = _cached_rows(("elided", layout, rows), partial(_elided, layout, rows, steps))

    def time_extend(self, layout, rows):
        k = self.k[0]
        self.ops[k % len(self.ops)]()
        self.k[0] = k + 1


def _elided(layout, rows, steps):
    """A full buffer for :class:`ExtendElidedStep` (built once per process: asv runs ``setup``
    before every sample), its extends of ``steps`` in turn and the count of calls."""
    cap = CAPACITIES[0]
    if layout == "numpy":
        buf = new_buffer("numpy", CARTPOLE, cap)
    else:
        buf = tfdata.ReplayBuffer(CARTPOLE, cap, layout=layout, num_envs=rows, elide_next=True, seed=0)
    for k in range(cap // rows + 3):  # full, every page touched
        buf.extend(steps[k % len(steps)])
    k = cap // rows + 3
    return [partial(buf.extend, s) for s in steps], [k]


class ExtendImageStep:
    """Append one vector-env step of Atari-sized rows (two 4x84x84 uint8 stacks, 56 KiB a row):
    ``rows`` rows into a full ring of :data:`IMAGE_CAPACITY`; ``"numpy"`` the hand-written
    baseline's slice assignment, the bytes-moved floor."""

    params = [LAYOUTS, [1, 8]]
    param_names = ["layout", "rows"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, rows):
        warm_kernels()
        rng = np.random.default_rng(5)
        obs = rng.integers(0, 256, (rows, 4, 84, 84), dtype=np.uint8)
        step = {"obs": obs, "action": rng.integers(0, 6, rows), "reward": np.ones(rows, np.float32),
                "next_obs": obs[:, ::-1].copy(), "terminated": rng.random(rows) < 0.05,
                "truncated": np.zeros(rows, bool)}
        self.op = partial(filled_buffer(layout, IMAGE, IMAGE_CAPACITY).extend, step)
        for _ in range(3):
            self.op()

    def time_extend(self, layout, rows):
        self.op()


class Sample:
    """Draw a uniform batch of CartPole rows from a full buffer.

    ``"floor"`` is :func:`sample_floor`: the same draws and row copies in one compiled call with
    nothing around it, what ``sample`` would cost with no Python, lock or output ring at all.
    ``"groups"``: column groups, the hot fields as 32-byte records and ``next_obs`` alone (two
    copies per row).
    """

    params = [LAYOUTS + ["groups", "floor"], CAPACITIES, [32, 256, 1024]]
    param_names = ["layout", "capacity", "batch"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, capacity, batch):
        warm_kernels()
        if layout == "floor":
            self.op = sample_floor(capacity, batch)
        else:
            self.op = partial(filled_buffer(layout, CARTPOLE, capacity).sample, batch)
        if first_time("sample", layout, capacity, batch):
            for _ in range(3):  # allocates this batch size's output ring (compiles the floor)
                self.op()

    def time_sample(self, layout, capacity, batch):
        self.op()


class SampleFields:
    """Draw 256 CartPole rows from 1M, all fields, only ``obs`` (16 of a row's 46 bytes) or the
    hot fields (``obs``, ``action``, ``reward``, ``terminated``, ``truncated``: 30 bytes):
    ``sample(256, fields=[...])`` against ``sample(256)``.

    Targets: projecting ``obs`` out of the 48-byte AoS record is not slower than the whole
    record; from SoA it is at least 2x faster than the whole SoA row (one column read instead of
    six). ``"groups"`` holds the hot fields as one record group (copied whole, see
    :class:`GroupHot`). ``"numpy"`` indexes the columns of the hand-written baseline.
    """

    params = [LAYOUTS + ["groups"], ["obs", "hot", "all"]]
    param_names = ["layout", "fields"]
    repeat = _MANY_SAMPLES
    capacity = 1_000_000
    batch = 256

    def setup(self, layout, fields):
        warm_kernels()
        buf = filled_buffer(layout, CARTPOLE, self.capacity)
        self.op = partial(buf.sample, self.batch) if fields == "all" else \
            partial(buf.sample, self.batch, fields=["obs"] if fields == "obs" else HOT)
        if first_time("fields", layout, fields):
            for _ in range(3):  # allocates the (projected) output ring
                self.op()

    def time_sample(self, layout, fields):
        self.op()


class GroupHot:
    """Column groups, first target: sampling the hot group of a grouped buffer
    (``sample(256, fields=HOT)``, 1M CartPole rows: one 32-byte record copy per row) is within
    1.1x of sampling a buffer that holds only those fields, as AoS records (``"aos-hot"``:
    ``sample(256)``). ``"numpy"``: the hand-written baseline holding only those fields."""

    params = [["groups", "aos-hot", "numpy"]]
    param_names = ["layout"]
    repeat = _MANY_SAMPLES
    capacity = 1_000_000
    batch = 256

    def setup(self, layout):
        warm_kernels()
        if layout == "groups":
            self.op = partial(filled_buffer("groups", CARTPOLE, self.capacity).sample, self.batch, fields=HOT)
        else:
            hot = CARTPOLE.subset(HOT)
            self.op = partial(filled_buffer("aos" if layout == "aos-hot" else layout, hot, self.capacity).sample,
                              self.batch)
        if first_time("group-hot", layout):
            for _ in range(3):  # allocates the output ring
                self.op()

    def time_sample(self, layout):
        self.op()


class GroupScan:
    """Column groups, second target: a scan of a field stored alone, ``next_obs.sum(axis=0)``
    over 1M CartPole rows (16 MB), is within 1.1x of the same scan in SoA. AoS scans the field
    through its 48-byte records (the whole rows are read); ``"numpy"`` is a plain array."""

    params = [["groups", "soa", "aos", "numpy"]]
    param_names = ["layout"]
    repeat = (20, 200, 2.0)
    capacity = 1_000_000

    def setup(self, layout):
        buf = filled_buffer(layout, CARTPOLE, self.capacity)
        view = buf.arrays["next_obs"] if layout == "numpy" else buf.storage.field("next_obs")
        self.op = partial(view.sum, axis=0)
        self.op()

    def time_scan(self, layout):
        self.op()


class SampleImage:
    """Draw 32 Atari-like rows (2 x uint8[4, 84, 84] each, 1.8 MB per batch) from 20,000.

    ``"memcpy"`` copies the same number of bytes, contiguous, from a pool as large as the
    buffer (random offset per call, so from DRAM as a sample is): the floor of any gather.
    """

    params = [LAYOUTS + ["memcpy"], [32]]
    param_names = ["layout", "batch"]
    repeat = (50, 1000, 3.0)
    timeout = 300

    def setup(self, layout, batch):
        warm_kernels()
        if layout == "memcpy":
            ref = memcpy_reference(batch * IMAGE.row_nbytes, IMAGE_CAPACITY * IMAGE.row_nbytes)
            self.op = ref.copy
        else:
            buf = filled_buffer(layout, IMAGE, IMAGE_CAPACITY)
            self.op = partial(buf.sample, batch)
        if first_time("image", layout, batch):
            for _ in range(3):
                self.op()

    def time_sample(self, layout, batch):
        self.op()


class Fill:
    """Build a buffer and fill it with ``capacity`` CartPole rows (fresh memory: page faults count).

    ``peakmem_fill`` is the process's peak RSS (numba and the kernels loaded in every case).
    """

    params = [LAYOUTS, CAPACITIES]
    param_names = ["layout", "capacity"]
    repeat = (5, 20, 10.0)
    timeout = 300

    def setup(self, layout, capacity):
        warm_kernels()
        fill_chunk(CARTPOLE)

    def time_fill(self, layout, capacity):
        build_and_fill(layout, CARTPOLE, capacity)

    def peakmem_fill(self, layout, capacity):
        build_and_fill(layout, CARTPOLE, capacity)


class FillFootprint:
    """Resident memory taken by building and filling 1M CartPole rows, over the raw data bytes.

    ``track_rss_growth_ratio`` is the RSS growth (psutil) across build+fill divided by
    ``spec.row_nbytes * capacity`` (46 MB): 1.0 means no overhead at all; the AoS record pads
    46 bytes of data to 48 (1.043). Only the 1M size is measured: smaller arrays come from
    allocator memory that is already resident, which makes the growth meaningless.
    """

    params = [LAYOUTS]
    param_names = ["layout"]
    capacity = 1_000_000
    timeout = 300

    def setup(self, layout):
        warm_kernels()
        fill_chunk(CARTPOLE)

    def track_rss_growth_ratio(self, layout):
        proc = psutil.Process()
        gc.collect()
        before = proc.memory_info().rss
        buf = build_and_fill(layout, CARTPOLE, self.capacity)
        grown = proc.memory_info().rss - before
        del buf
        return grown / (CARTPOLE.row_nbytes * self.capacity)

    track_rss_growth_ratio.unit = "ratio"


class SampleTail:
    """Tail latency of ``sample(256)`` from 1M CartPole rows: p99 over median of 2000 calls.

    Each call is timed on its own with ``perf_counter_ns``, garbage collector left on (as in a
    training loop), after 200 warm-up calls.
    """

    params = [LAYOUTS]
    param_names = ["layout"]
    capacity = 1_000_000
    batch = 256
    calls = 2000
    timeout = 300

    def setup(self, layout):
        warm_kernels()
        self.buf = filled_buffer(layout, CARTPOLE, self.capacity)
        for _ in range(200):
            self.buf.sample(self.batch)

    def track_p99_over_median(self, layout):
        sample, batch = self.buf.sample, self.batch
        return p99_over_median(lambda: sample(batch), self.calls)

    track_p99_over_median.unit = "ratio"
