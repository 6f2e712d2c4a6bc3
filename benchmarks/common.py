"""Shared fixtures of the benchmark suite: the two row specs, fast filling, and the baselines.

Baselines live here so that every benchmark class can put them next to tfdata in the *same*
run (``layout="numpy"`` or ``"memcpy"``): on a noisy machine only ratios measured side by side
mean anything.

A note on asv_runner (>= 0.3): when a benchmark class has a ``setup``, every timed call is
preceded by a fresh ``teardown()``/``setup()`` and timed on its own (``number`` is forced to 1).
So ``setup`` must be cheap after its first run: big filled buffers are built once per process
and kept in a module-level cache (:func:`filled_buffer`), and the kernels are warmed once
(:func:`warm_kernels`). asv runs each parameter combination in its own process, so the cache
never leaks state from one benchmark into another.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import statistics
import sys
import tempfile
import time

import numpy as np

import tfdata

#: CartPole-like transition: 46 bytes of data per row (48 in the AoS record).
CARTPOLE = tfdata.Spec({
    "obs": ("f4", (4,)),
    "action": "i8",
    "reward": "f4",
    "next_obs": ("f4", (4,)),
    "terminated": "?",
    "truncated": "?",
})

#: Atari-like transition: two stacks of four 84x84 uint8 frames, 56,462 bytes of data per row.
IMAGE = tfdata.Spec({
    "obs": ("u1", (4, 84, 84)),
    "action": "i8",
    "reward": "f4",
    "next_obs": ("u1", (4, 84, 84)),
    "terminated": "?",
    "truncated": "?",
})

TFDATA_LAYOUTS = ["aos", "soa"]
#: tfdata's layouts plus the hand-written numpy baseline (:class:`NumpyBuffer`).
LAYOUTS = TFDATA_LAYOUTS + ["numpy"]
#: the fields a training step samples together: one record group of the ``"groups"`` layout
HOT = ["obs", "action", "reward", "terminated", "truncated"]
#: named layouts of benchmark parameters: ``"groups"`` is column groups, the hot fields in one
#: record array and ``next_obs`` alone (both benchmark specs have these fields)
GROUPINGS = {"groups": [HOT, ["next_obs"]]}
CAPACITIES = [10_000, 1_000_000]
IMAGE_CAPACITY = 20_000

# rows per extend when filling: big enough to amortise the call, small enough to stay in cache
_FILL_CHUNK = {CARTPOLE: 65_536, IMAGE: 1_000}


# -- data -----------------------------------------------------------------------------------
def random_rows(spec: tfdata.Spec, n: int, seed: int = 0) -> dict:
    """``n`` rows of random data, one C-contiguous array per field, of the field's exact dtype."""
    rng = np.random.default_rng(seed)
    out = {}
    for f in spec:
        shape = (n,) + f.shape
        kind = f.dtype.kind
        if kind == "b":
            out[f.name] = rng.random(shape) < 0.5
        elif kind == "u" and f.dtype.itemsize == 1:
            out[f.name] = rng.integers(0, 256, shape, dtype=f.dtype)
        elif kind in "iu":
            out[f.name] = rng.integers(0, 2, shape, dtype=f.dtype)  # a Discrete(2) action
        else:
            out[f.name] = rng.standard_normal(shape, dtype=np.float32).astype(f.dtype, copy=False)
    return out


def one_row(spec: tfdata.Spec, seed: int = 0) -> dict:
    """One row as a gymnasium step gives it: arrays for shaped fields, Python scalars otherwise."""
    rows = random_rows(spec, 1, seed)
    return {name: (v[0].copy() if v.ndim > 1 else v[0].item()) for name, v in rows.items()}


_CHUNKS: dict = {}


def fill_chunk(spec: tfdata.Spec) -> dict:
    """The cached block of random rows used to fill buffers of ``spec``."""
    chunk = _CHUNKS.get(spec)
    if chunk is None:
        chunk = _CHUNKS[spec] = random_rows(spec, _FILL_CHUNK.get(spec, 65_536), seed=1)
    return chunk


# -- the numpy baseline ---------------------------------------------------------------------
class NumpyBuffer:
    """The replay buffer people write by hand: one preallocated numpy array per field.

    ``push`` assigns ``arr[i] = value`` field by field, ``extend`` assigns slices, and ``sample``
    draws ``rng.integers(0, n, batch)`` and fancy-indexes every field (new arrays each call).
    No validation and no lock: the cheapest honest baseline.
    """

    def __init__(self, spec: tfdata.Spec, capacity: int, seed: int = 0):
        self.spec = spec
        self.capacity = capacity
        self.arrays = {f.name: np.zeros((capacity,) + f.shape, dtype=f.dtype) for f in spec}
        self._items = list(self.arrays.items())
        self.cursor = 0
        self.size = 0
        self.rng = np.random.default_rng(seed)
        self.indices = None

    def __len__(self) -> int:
        return self.size

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def push(self, row) -> None:
        i = self.cursor
        for name, arr in self._items:
            arr[i] = row[name]
        i += 1
        self.cursor = 0 if i == self.capacity else i
        if self.size < self.capacity:
            self.size += 1

    def extend(self, batch) -> None:
        cap = self.capacity
        n = len(batch[self._items[0][0]])
        skip = max(0, n - cap)  # more rows than capacity: only the last ``cap`` survive
        start = (self.cursor + skip) % cap
        left = n - skip
        first = min(left, cap - start)
        for name, arr in self._items:
            src = batch[name]
            arr[start:start + first] = src[skip:skip + first]
            if left > first:
                arr[:left - first] = src[skip + first:]
        self.cursor = (start + left) % cap
        self.size = min(self.size + n, cap)

    def sample(self, batch_size: int, fields=None) -> dict:
        idx = self.rng.integers(0, self.size, batch_size)
        self.indices = idx
        if fields is not None:  # a projection: index only these columns
            return {name: self.arrays[name][idx] for name in fields}
        return {name: arr[idx] for name, arr in self._items}


class MemcpyReference:
    """``np.copyto(dst, src)`` of ``nbytes`` contiguous bytes: the floor for a gather of that size.

    The source is read from a pool as large as the buffer being compared, at a random
    cache-line-aligned offset per call, so, like the rows a sample gathers, it comes from DRAM
    rather than from a cache that the previous call warmed.
    """

    def __init__(self, nbytes: int, pool_nbytes: int, seed: int = 0, n_offsets: int = 4096):
        self.nbytes = nbytes
        self.pool = np.empty(pool_nbytes, dtype=np.uint8)
        self.pool.fill(0x5A)  # touch every page before timing
        self.dst = np.zeros(nbytes, dtype=np.uint8)
        rng = np.random.default_rng(seed)
        offsets = rng.integers(0, (pool_nbytes - nbytes) // 64 + 1, n_offsets) * 64
        self._srcs = [self.pool[o:o + nbytes] for o in offsets.tolist()]
        self._k = 0

    def copy(self) -> None:
        k = self._k
        self._k = (k + 1) % len(self._srcs)
        np.copyto(self.dst, self._srcs[k])


# -- building and filling -------------------------------------------------------------------
def new_buffer(layout: str, spec: tfdata.Spec, capacity: int, seed: int = 0):
    """An empty buffer: ``tfdata.ReplayBuffer`` for "aos"/"soa" (or a name of
    :data:`GROUPINGS`), :class:`NumpyBuffer` for "numpy"."""
    if layout == "numpy":
        return NumpyBuffer(spec, capacity, seed=seed)
    return tfdata.ReplayBuffer(spec, capacity, layout=GROUPINGS.get(layout, layout), seed=seed)


def fill(buf, capacity: int, chunk: dict) -> None:
    """Extend ``buf`` with ``capacity`` rows, reusing ``chunk`` (exact dtypes) block by block."""
    chunk_rows = len(next(iter(chunk.values())))
    done = 0
    while done < capacity:
        n = min(chunk_rows, capacity - done)
        buf.extend(chunk if n == chunk_rows else {k: v[:n] for k, v in chunk.items()})
        done += n


def build_and_fill(layout: str, spec: tfdata.Spec, capacity: int, seed: int = 0):
    buf = new_buffer(layout, spec, capacity, seed=seed)
    fill(buf, capacity, fill_chunk(spec))
    return buf


_FILLED: dict = {}


def filled_buffer(layout: str, spec: tfdata.Spec, capacity: int):
    """A full buffer, built once per process and cached (every page touched before timing)."""
    key = (layout, spec, capacity)
    buf = _FILLED.get(key)
    if buf is None:
        buf = _FILLED[key] = build_and_fill(layout, spec, capacity)
    return buf


_MEMCPY: dict = {}


def memcpy_reference(nbytes: int, pool_nbytes: int) -> MemcpyReference:
    key = (nbytes, pool_nbytes)
    ref = _MEMCPY.get(key)
    if ref is None:
        ref = _MEMCPY[key] = MemcpyReference(nbytes, pool_nbytes)
    return ref


_WARM = False


def warm_kernels() -> None:
    """Load (or compile) the sampling kernels of both layouts, once per process.

    Done for every benchmark, the baselines included, so that every process being compared
    has numba imported and the same kernels resident.
    """
    global _WARM
    if _WARM:
        return
    rows = random_rows(CARTPOLE, 64)
    for layout in TFDATA_LAYOUTS:
        buf = tfdata.ReplayBuffer(CARTPOLE, 64, layout=layout, seed=0)
        buf.extend(rows)
        buf.sample(32)
    _WARM = True


_ONCE: set = set()


def first_time(*key) -> bool:
    """True the first time it is called with ``key`` in this process (for one-off warm-ups)."""
    if key in _ONCE:
        return False
    _ONCE.add(key)
    return True


def p99_over_median(step, calls: int) -> float:
    """Time ``step()`` ``calls`` times, one call per reading; return p99 / median."""
    clock = time.perf_counter_ns
    times = []
    append = times.append
    for _ in range(calls):
        t0 = clock()
        step()
        append(clock() - t0)
    times = np.asarray(times, dtype=np.float64)
    return float(np.percentile(times, 99) / np.median(times))


def read_through(path: str) -> None:
    """Read every byte of the file (or the directory's files) once: the page cache holds them."""
    if os.path.isfile(path):
        files = [path]
    else:
        files = [os.path.join(path, f) for f in sorted(os.listdir(path))]
    buf = bytearray(4 << 20)
    for name in files:
        if os.path.isdir(name):
            read_through(name)
            continue
        with open(name, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass


def first_call_seconds(code: str, *args: str, cache: str, runs: int) -> float:
    """Median seconds ``code`` (with ``args``) prints over ``runs`` fresh interpreters:
    ``cache="warm"`` with numba's kernel cache as it is, ``"cold"`` with an empty
    ``NUMBA_CACHE_DIR`` for each run (so every kernel it calls is compiled)."""
    times = []
    for _ in range(runs):
        if cache == "warm":
            times.append(child_seconds(code, *args))
            continue
        numba_cache = tempfile.mkdtemp(prefix="tfdata-numba-cold-")
        try:
            env = {**os.environ, "NUMBA_CACHE_DIR": numba_cache}
            times.append(child_seconds(code, *args, env=env))
        finally:
            shutil.rmtree(numba_cache, ignore_errors=True)
    return statistics.median(times)


def child_seconds(code: str, *args: str, env: dict | None = None) -> float:
    """Run ``code`` (with ``args``) in a fresh interpreter, in an empty cwd (so that ``import
    tfdata`` is the installed package); return the seconds it prints last."""
    cwd = tempfile.mkdtemp(prefix="tfdata-bench-")
    try:
        proc = subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed ({proc.returncode}):\n{proc.stderr}")
    return float(proc.stdout.strip().splitlines()[-1])


# -- temporary files ----------------------------------------------------------------------------
_TMPDIRS: dict = {}  # (pid, name): path, made by that process
_TMP_PREFIX = "tfdata-bench-files-"


def tmpdir(name: str) -> str:
    """This process's temporary directory for the files of ``name`` (a benchmark module), made
    once per process as ``tfdata-bench-files-<pid>-<name>-*`` in the temporary directory.

    It is removed at exit, and, since asv's forkserver ends each benchmark's process with
    ``os._exit`` (no exit handler runs), by the next process that makes one: every directory of
    this pattern whose process is no longer running is removed first. Without that, each forked
    benchmark left its files behind, gigabytes over one quick pass (the spill files of
    ``bench_frames.ColdSample`` alone: 141 MB per case), until the disk was full.
    """
    import atexit

    pid = os.getpid()
    path = _TMPDIRS.get((pid, name))
    if path is None:
        if not any(p == pid for p, _ in _TMPDIRS):
            atexit.register(remove_tmpdirs)
        _remove_orphans()
        path = _TMPDIRS[(pid, name)] = tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{pid}-{name}-")
    return path


def remove_tmpdirs() -> None:
    """Remove the directories :func:`tmpdir` made in this process."""
    pid = os.getpid()
    for key in [k for k in _TMPDIRS if k[0] == pid]:
        shutil.rmtree(_TMPDIRS.pop(key), ignore_errors=True)


def _remove_orphans() -> None:
    import psutil

    top = tempfile.gettempdir()
    for entry in os.listdir(top):
        if not entry.startswith(_TMP_PREFIX):
            continue
        pid = entry[len(_TMP_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(os.path.join(top, entry), ignore_errors=True)
