"""Shared-memory buffers (``tfdata.SharedReplayBuffer`` / ``tfdata.SharedWriter``).

Every class takes the layout first; ``buffer="local"`` is the single-process
``tfdata.ReplayBuffer`` of the same layout doing the same operation, so each figure has its
baseline inside the same run.

* ``Push`` / ``Extend``: a ``SharedWriter`` writing one CartPole row (as a gymnasium step gives
  it) or one vector-env step of 8 rows into a full replay shard of 100,000 slots, in this
  process; ``local``: ``ReplayBuffer.push`` / ``extend`` of the same rows into a full buffer.
* ``Sample``: ``sample(256)`` from a full 1M-row CartPole buffer with no writer attached:
  ``shared`` (1 shard), ``shared4`` (the same rows in 4 shards, as 4 writers leave them) and
  ``local``.
* ``PrioritizedStep``: the training step of ``bench_prioritized.SampleUpdateLoop``
  (``b = sample(256)`` then ``update_priorities(b, p)``, fresh uniform priorities each step, the
  garbage collector on, ``track_step`` the median of 2000 steps in µs) on a prioritized buffer
  of CartPole rows filled by ``extend`` in chunks of 1,000 rows: ``shared``
  (``prioritized=True``, one shard, its writer closed), ``shared+writer`` (the same, while one
  writer process pushes one row per call as fast as it can: every step folds the rows published
  since the last one and redraws the rows it copied while they were being overwritten) and
  ``local`` (``PrioritizedReplayBuffer``).
* ``FifoRoundTrip``: ``extend`` 256 rows into a FIFO buffer and ``get_batch(256)`` them back;
  ``local``: ``ReplayBuffer.extend`` 256 rows + ``sample(256)``.
* ``FirstCalls``: ``track_first_calls_cold_cache``, the first push, extend, sample and
  get_batch of a fresh process with an empty numba cache (the one-off compile of the
  shared-memory kernels of a layout).
* ``Ingest``: ``track_ingest_ratio``, rows/s delivered to a learner by 2 worker processes through
  the shared buffer (FIFO, ``push`` one CartPole row per call, learner ``batches(256)``) over the
  same through one ``multiprocessing.Queue`` (``put`` a dict per row, learner ``get`` and copy
  into 256-row arrays), measured alternately in one child process (3 rounds, median of the
  per-round ratios); ``track_ingest_rows_per_s``, the shared buffer's rows/s. The full
  experiment is ``experiments/ingestion.py`` (reports/ingest/).

Clean-up: asv_runner ends every benchmark process with ``os._exit``, which skips the finalizer
that removes a buffer's region from ``/dev/shm``; buffers here are cached per process (setup runs
before every timed call), so each region is also handed to a reaper (a small child process that
removes the regions it was given when this process ends, however it ends).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import tfdata

from . import bench_prioritized
from .common import (CAPACITIES, CARTPOLE, TFDATA_LAYOUTS, fill, fill_chunk, filled_buffer,
                     first_time, one_row, random_rows, warm_kernels)

_MANY_SAMPLES = (200, 2000, 2.0)   # one call per sample (asv forces number=1 with a setup)
WRITE_CAPACITY = 100_000
SAMPLE_CAPACITY = 1_000_000
STEP_ROWS = 8
BATCH = 256

# -- clean-up -------------------------------------------------------------------------------
_REAPER_CODE = r"""
import shutil, sys
paths = [line.rstrip("\n") for line in sys.stdin]   # until every writer of the pipe is gone
for p in paths:
    shutil.rmtree(p, ignore_errors=True)
"""
_reaper = None


def _reap_at_exit(path: str) -> None:
    """Have ``path`` removed when this process ends, even through ``os._exit``."""
    global _reaper
    if _reaper is None:
        _reaper = subprocess.Popen([sys.executable, "-c", _REAPER_CODE], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                                   cwd=tempfile.gettempdir())
    _reaper.stdin.write(path + "\n")
    _reaper.stdin.flush()


_SHARED: dict = {}


def shared_buffer(layout: str, capacity: int, *, shards: int = 1, mode: str = "replay",
                  fill_rows: bool = True):
    """``(buffer, writers)``: a shared buffer of CartPole rows, built once per process and
    cached; replay buffers are filled (every page touched), by writers of this process that
    stay attached (``writers[s]`` writes shard ``s``)."""
    key = (layout, capacity, shards, mode, fill_rows)
    hit = _SHARED.get(key)
    if hit is not None:
        return hit
    buf = tfdata.SharedReplayBuffer(CARTPOLE, capacity, num_writers=shards, mode=mode,
                                    layout=layout, seed=0)
    _reap_at_exit(buf.path)
    writers = [tfdata.SharedWriter(buf.name, s) for s in range(shards)]
    if fill_rows:
        for w in writers:
            fill(w, capacity // shards, fill_chunk(CARTPOLE))
    _SHARED[key] = (buf, writers)
    return buf, writers


def _warm_shared() -> None:
    """Load the shared-memory kernels (writer and learner, both layouts) once per process."""
    if not first_time("warm-shared"):
        return
    rows = random_rows(CARTPOLE, 31)  # with the push, 32 rows: half the FIFO's capacity
    for layout in TFDATA_LAYOUTS:
        for mode in ("replay", "fifo"):
            with tfdata.SharedReplayBuffer(CARTPOLE, 64, mode=mode, layout=layout, seed=0) as buf:
                _reap_at_exit(buf.path)
                with tfdata.SharedWriter(buf.name, 0) as w:
                    w.push(one_row(CARTPOLE))
                    w.extend(rows)
                    if mode == "fifo":
                        buf.get_batch(32)
                    else:
                        buf.sample(32)


# -- writer ---------------------------------------------------------------------------------
class Push:
    """One CartPole row per call into a full ring: ``SharedWriter.push`` vs ``ReplayBuffer.push``."""

    params = [TFDATA_LAYOUTS, ["shared", "local"]]
    param_names = ["layout", "buffer"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, buffer):
        warm_kernels()
        _warm_shared()
        if buffer == "shared":
            self.push = shared_buffer(layout, WRITE_CAPACITY)[1][0].push
        else:
            self.push = filled_buffer(layout, CARTPOLE, WRITE_CAPACITY).push
        self.row = one_row(CARTPOLE, seed=2)
        if first_time("push", layout, buffer):
            for _ in range(100):
                self.push(self.row)

    def time_push(self, layout, buffer):
        self.push(self.row)

    def peakmem_push(self, layout, buffer):
        self.push(self.row)


class Extend:
    """One vector-env step (8 CartPole rows, one array per field) per call into a full ring."""

    params = [TFDATA_LAYOUTS, ["shared", "local"]]
    param_names = ["layout", "buffer"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, buffer):
        warm_kernels()
        _warm_shared()
        if buffer == "shared":
            self.extend = shared_buffer(layout, WRITE_CAPACITY)[1][0].extend
        else:
            self.extend = filled_buffer(layout, CARTPOLE, WRITE_CAPACITY).extend
        self.step = random_rows(CARTPOLE, STEP_ROWS, seed=3)
        if first_time("extend", layout, buffer):
            for _ in range(100):
                self.extend(self.step)

    def time_extend(self, layout, buffer):
        self.extend(self.step)

    def peakmem_extend(self, layout, buffer):
        self.extend(self.step)


# -- learner --------------------------------------------------------------------------------
class Sample:
    """``sample(256)`` from 1M CartPole rows, no writer attached: the protocol's own cost.

    ``shared``: one shard; ``shared4``: four shards of 250,000 (what 4 writers leave);
    ``local``: ``tfdata.ReplayBuffer``.
    """

    params = [TFDATA_LAYOUTS, ["shared", "shared4", "local"]]
    param_names = ["layout", "buffer"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, layout, buffer):
        warm_kernels()
        _warm_shared()
        if buffer == "local":
            buf = filled_buffer(layout, CARTPOLE, SAMPLE_CAPACITY)
        else:
            buf, writers = shared_buffer(layout, SAMPLE_CAPACITY, shards=4 if buffer == "shared4" else 1)
            for w in writers:  # no writer attached while sampling
                w.close()
        self.sample = buf.sample
        if first_time("sample", layout, buffer):
            for _ in range(3):
                self.sample(BATCH)

    def time_sample(self, layout, buffer):
        self.sample(BATCH)

    def peakmem_sample(self, layout, buffer):
        self.sample(BATCH)


class SampleFeatures:
    """``sample(256)`` from 1M CartPole rows with the replay features over shared memory (one
    shard, no writer attached), beside the single-process buffer with the same options.

    ``prioritized``: ``prioritized=True`` vs ``PrioritizedReplayBuffer`` (the shared learner
    first folds newly published rows: none here); ``nstep3``: ``n_step=3`` windows over the
    shard vs ``ReplayBuffer(n_step=3)``. Skipped on commits whose shared buffer has neither.
    """

    params = [TFDATA_LAYOUTS, ["shared", "local"], ["prioritized", "nstep3"]]
    param_names = ["layout", "buffer", "feature"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, layout, buffer, feature):
        warm_kernels()
        _warm_shared()
        opts = {"prioritized": True} if feature == "prioritized" else {"n_step": 3, "gamma": 0.99}
        if buffer == "local":
            cls = tfdata.PrioritizedReplayBuffer if feature == "prioritized" else tfdata.ReplayBuffer
            buf = cls(CARTPOLE, SAMPLE_CAPACITY, layout=layout, seed=0,
                      **({} if feature == "prioritized" else opts))
            fill(buf, SAMPLE_CAPACITY, fill_chunk(CARTPOLE))
        else:
            try:
                buf = tfdata.SharedReplayBuffer(CARTPOLE, SAMPLE_CAPACITY, layout=layout, seed=0, **opts)
            except TypeError:  # a commit before these options existed
                raise NotImplementedError from None
            _reap_at_exit(buf.path)
            with tfdata.SharedWriter(buf.name, 0) as w:
                fill(w, SAMPLE_CAPACITY, fill_chunk(CARTPOLE))
            self._keep = buf
        self.sample = buf.sample
        for _ in range(3):  # the shared learner folds the 1M published rows here
            self.sample(BATCH)

    def time_sample(self, layout, buffer, feature):
        self.sample(BATCH)


def _push_until_stopped(name: str, row: dict, stop, parent: int, seconds: float) -> None:
    """A writer process: push ``row`` into shard 0 of region ``name``, one row per call, until
    ``stop`` is set, the parent is gone (asv ends it with ``os._exit``: no teardown) or
    ``seconds`` have passed."""
    end = time.monotonic() + seconds
    with tfdata.SharedWriter(name, 0) as w:
        push = w.push
        while not stop.is_set() and os.getppid() == parent and time.monotonic() < end:
            for _ in range(256):
                push(row)


class PrioritizedStep(bench_prioritized.SampleUpdateLoop):
    """The step of a prioritized training loop, ``b = sample(256)`` then
    ``update_priorities(b, p)``, over shared memory and in one process.

    The step, its priorities and its timing are :class:`bench_prioritized.SampleUpdateLoop`'s
    (uniform priorities, the collector on, the median of 2000 steps after 200 untimed ones, in
    µs), and so is the fill: CartPole rows by ``extend`` in chunks of 1,000, here through a
    ``SharedWriter`` of this process. ``shared``: ``SharedReplayBuffer(prioritized=True)``, one
    shard, its writer closed once the buffer is full (the first step folds every row in, before
    timing). ``shared+writer``: the same, with one writer process (forked in ``setup``) pushing
    one row per call, as fast as it can, while the steps are timed. ``local``:
    ``PrioritizedReplayBuffer``, the same options (with one writer, ``shared`` draws the same
    batches as ``local``: the same rows, seed and priorities). Every buffer is built in this
    benchmark's process and removed in ``teardown`` (and by the reaper if the process ends
    first).
    """

    params = [TFDATA_LAYOUTS, ["local", "shared", "shared+writer"], CAPACITIES]
    param_names = ["layout", "buffer", "capacity"]
    writer_seconds = 300  # the writer process stops by itself after this, whatever happens

    def setup(self, layout, buffer, capacity):
        self.writer = self.shared = None
        if buffer == "local":
            super().setup(layout, capacity, "uniform")
            return
        p = bench_prioritized
        p.warm_prioritized()
        _warm_shared()
        try:
            buf = tfdata.SharedReplayBuffer(CARTPOLE, capacity, layout=layout, seed=0,
                                            prioritized=True, alpha=p.ALPHA, beta=p.BETA, eps=p.EPS)
        except TypeError:  # a commit whose shared buffer has no priorities
            raise NotImplementedError from None
        self.shared = buf
        _reap_at_exit(buf.path)
        with tfdata.SharedWriter(buf.name, 0) as w:
            chunk = random_rows(CARTPOLE, 1000, seed=1)
            for _ in range(0, capacity, 1000):
                w.extend(chunk)
        self.buf, self.rng = buf, np.random.default_rng(6)
        self.step = self._step(layout, "uniform")
        self.step()  # the first of the 200 untimed steps folds every row in (all pages touched)
        if buffer == "shared+writer":
            ctx = mp.get_context("fork")  # the child has this process's kernels loaded
            self.stop = ctx.Event()
            self.writer = ctx.Process(target=_push_until_stopped, daemon=True,
                                      args=(buf.name, one_row(CARTPOLE, seed=2), self.stop,
                                            os.getpid(), self.writer_seconds))
            self.writer.start()
            end = time.monotonic() + 60
            while buf.writers()[0]["published"] == capacity:  # until the writer pushes
                if not self.writer.is_alive() or time.monotonic() > end:
                    raise RuntimeError("the writer process published no row")
                time.sleep(0.01)
        for _ in range(199):
            self.step()

    def teardown(self, layout, buffer, capacity):
        if self.writer is not None:
            self.stop.set()
            self.writer.join(30)
            if self.writer.is_alive():
                self.writer.kill()
                self.writer.join()
        if self.shared is not None:
            self.shared.close()

    def track_step(self, layout, buffer, capacity):
        return bench_prioritized.SampleUpdateLoop.track_step(self, layout, capacity, "uniform")

    track_step.unit = "µs"


class FifoRoundTrip:
    """``extend`` 256 CartPole rows into a FIFO buffer and ``get_batch(256)`` them, in one process.

    ``local``: ``ReplayBuffer.extend`` of the same 256 rows and ``sample(256)``.
    """

    params = [TFDATA_LAYOUTS, ["shared", "local"]]
    param_names = ["layout", "buffer"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, buffer):
        warm_kernels()
        _warm_shared()
        self.rows = random_rows(CARTPOLE, BATCH, seed=4)
        if buffer == "shared":
            buf, writers = shared_buffer(layout, 16 * BATCH, mode="fifo", fill_rows=False)
            self.put, self.take = writers[0].extend, buf.get_batch
        else:
            buf = filled_buffer(layout, CARTPOLE, 16 * BATCH)
            self.put, self.take = buf.extend, buf.sample
        if first_time("fifo", layout, buffer):
            for _ in range(20):  # every slot written once (pages touched), output ring made
                self.round_trip()

    def round_trip(self):
        self.put(self.rows)
        self.take(BATCH)

    def time_round_trip(self, layout, buffer):
        self.round_trip()

    def peakmem_round_trip(self, layout, buffer):
        self.round_trip()


# -- compile --------------------------------------------------------------------------------
FIRST_CALLS = r"""
import time
import numpy as np
import tfdata
spec = tfdata.Spec(%(spec)s)
layout = %(layout)r
rows = {f.name: np.zeros((64,) + f.shape, f.dtype) for f in spec}
row = {k: (v[0] if v.ndim > 1 else v[0].item()) for k, v in rows.items()}
t = 0.0
for mode in ("replay", "fifo"):
    with tfdata.SharedReplayBuffer(spec, 128, mode=mode, layout=layout, seed=0) as buf:
        t0 = time.perf_counter()   # numba imported and storage built by now
        with tfdata.SharedWriter(buf.name, 0) as w:
            w.push(row)
            w.extend(rows)
        if mode == "fifo":
            buf.get_batch(32)
        else:
            buf.sample(32)
        t += time.perf_counter() - t0
print(t)
"""


def _run_child(code: str, env: dict | None = None, timeout: float = 300) -> str:
    """Run ``code`` in a fresh interpreter in an empty cwd; return its last line of output."""
    cwd = tempfile.mkdtemp(prefix="tfdata-bench-")
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=timeout)
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed ({proc.returncode}):\n{proc.stderr}")
    return proc.stdout.strip().splitlines()[-1]


def _spec_literal() -> str:
    return repr({f.name: (f.dtype.str, f.shape) for f in CARTPOLE})


class FirstCalls:
    """First push, extend, sample and get_batch of a fresh process, numba cache empty."""

    params = [TFDATA_LAYOUTS]
    param_names = ["layout"]
    unit = "seconds"
    timeout = 600

    def track_first_calls_cold_cache(self, layout):
        cache = tempfile.mkdtemp(prefix="tfdata-numba-cold-")
        try:
            code = FIRST_CALLS % {"spec": _spec_literal(), "layout": layout}
            return float(_run_child(code, env={**os.environ, "NUMBA_CACHE_DIR": cache}))
        finally:
            shutil.rmtree(cache, ignore_errors=True)


# -- ingestion through processes ------------------------------------------------------------
# Runs in a child interpreter: 2 forked workers, CartPole rows, one row per call; rounds alternate
# shm-aos, shm-soa and queue. Prints one JSON line: rows/s per round and transport.
INGEST = r"""
import json, multiprocessing as mp, os, sys, time
import numpy as np
import tfdata
spec = tfdata.Spec(%(spec)s)
WORKERS, BATCH, ROUNDS = 2, 256, %(rounds)d
ROWS = {"shm": %(shm_rows)d, "queue": %(queue_rows)d}      # per round, all workers
rng = np.random.default_rng(0)
pool = [{f.name: (rng.standard_normal(f.shape).astype(f.dtype) if f.shape else
                  (1.0 if f.dtype.kind == "f" else False if f.dtype.kind == "b" else 0))
         for f in spec} for _ in range(64)]

def worker(wid, n, name, q, ready, go):
    if name is not None:
        w = tfdata.SharedWriter(name, wid)
        send = w.push
    else:
        send = q.put
    ready.put(wid)
    go.wait()
    base = wid << 32
    for i in range(n):
        r = pool[i & 63].copy()   # a fresh dict per row (a queued dict is pickled later)
        r["action"] = base + i
        send(r)
    if name is not None:
        w.close()

def run(transport, ctx, q):
    total = ROWS["queue" if transport == "queue" else "shm"]
    per = total // WORKERS
    ready, go = ctx.Queue(), ctx.Event()
    buf = None
    if transport != "queue":
        buf = tfdata.SharedReplayBuffer(spec, 65536, num_writers=WORKERS, mode="fifo",
                                        layout=transport[4:], seed=0)
    try:
        procs = [ctx.Process(target=worker, args=(w, per, None if buf is None else buf.name, q, ready, go),
                             daemon=True) for w in range(WORKERS)]
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=60)
        ids = np.empty(total, np.int64)
        pos = 0
        t0 = time.perf_counter()
        go.set()
        if buf is not None:
            for b in buf.batches(BATCH, timeout=60):
                a = b["action"]
                ids[pos:pos + len(a)] = a
                pos += len(a)
                if pos == total:
                    break
        else:
            out = {f.name: np.empty((BATCH,) + f.shape, f.dtype) for f in spec}
            items = list(out.items())
            i = 0
            while pos < total:
                item = q.get(timeout=60)
                for k, arr in items:
                    arr[i] = item[k]
                i += 1
                if i == BATCH:
                    ids[pos:pos + BATCH] = out["action"]
                    pos += BATCH
                    i = 0
        t1 = time.perf_counter()
        for p in procs:
            p.join(timeout=60)
    finally:
        if buf is not None:
            buf.close()
    want = np.sort(np.concatenate([(w << 32) + np.arange(per) for w in range(WORKERS)]))
    if pos != total or not np.array_equal(np.sort(ids), want):
        raise SystemExit(f"{transport}: rows lost or repeated")
    return total / (t1 - t0)

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    for layout in ("aos", "soa"):  # kernels loaded before forking: workers inherit them
        with tfdata.SharedReplayBuffer(spec, 64, mode="fifo", layout=layout) as b:
            with tfdata.SharedWriter(b.name, 0) as w:
                w.push(pool[0])
            b.get_batch(1)
    q = ctx.Queue()
    order = ["shm-aos", "shm-soa", "queue"]
    res = {t: [] for t in order}
    for r in range(ROUNDS):
        for t in order[r %% 3:] + order[:r %% 3]:
            res[t].append(run(t, ctx, q))
    print(json.dumps(res))
"""


class Ingest:
    """Rows/s from 2 worker processes to a learner, shared buffer vs ``multiprocessing.Queue``
    (CartPole rows, one per call; see the module docstring). Measured once per run in a child
    interpreter (``setup_cache``), the transports alternating over 3 rounds."""

    params = [TFDATA_LAYOUTS]
    param_names = ["layout"]
    timeout = 600
    rounds = 3

    def setup_cache(self):
        code = INGEST % {"spec": _spec_literal(), "rounds": self.rounds, "shm_rows": 131_072,
                         "queue_rows": 24_576}
        before = set(os.listdir(tfdata.shared.shm_dir()))
        try:
            res = json.loads(_run_child(code, timeout=540))
        finally:  # a child that failed or timed out may leave its region behind
            for name in set(os.listdir(tfdata.shared.shm_dir())) - before:
                if name.startswith("tfdata-shm-") or name.startswith(".tfdata-shm-"):
                    shutil.rmtree(os.path.join(tfdata.shared.shm_dir(), name), ignore_errors=True)
        return res

    def track_ingest_ratio(self, res, layout):
        return statistics.median(s / q for s, q in zip(res[f"shm-{layout}"], res["queue"]))

    track_ingest_ratio.unit = "ratio"

    def track_ingest_rows_per_s(self, res, layout):
        return statistics.median(res[f"shm-{layout}"])

    track_ingest_rows_per_s.unit = "rows/s"
