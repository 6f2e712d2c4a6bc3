"""Ingestion: how many rows per second reach a learner from worker processes through a
``tfdata.SharedReplayBuffer``, against workers sending rows through a ``multiprocessing.Queue``,
and what do writers cost the learner's ``sample``?

A self-contained experiment (one file, parameters at the top). Three questions, one run:

1. **Throughput.** 1, 2 or 4 worker processes send precomputed rows (CartPole-like or Atari-like
   image rows), one row per call or one vector-env step of 8 rows per call, and the learner takes
   them as batches of 256 rows, each row exactly once. Transports: ``shm-aos`` / ``shm-soa``
   (``SharedReplayBuffer(mode="fifo", policy="block")``, workers ``SharedWriter.push`` /
   ``extend``, learner ``batches(256)``) and ``queue`` (the naive baseline: workers ``put`` a
   dict per call into one ``multiprocessing.Queue``; the learner ``get``\\ s and copies rows into
   preallocated batch arrays). Every row id is checked to arrive exactly once, in its writer's
   order, and the content of sampled rows against what was sent; any mismatch stops the run.
2. **Sample latency while workers write.** ``sample(256)`` (image rows: 32) of a prefilled
   replay-mode ``SharedReplayBuffer`` while 1, 2, 4 workers ``extend`` flat out, or paced at a
   fixed total rate (as real environments produce rows), against the same learner sampling a
   single-process ``tfdata.ReplayBuffer`` of the same capacity and the ``SharedReplayBuffer``
   with no writer, in the same run.
3. **Memory.** Peak RSS of the learner and of each worker per condition, and the region size.

    python experiments/ingestion.py --quick     # about a minute: 2 repetitions, 1/8 of the rows
    python experiments/ingestion.py             # the full run: 5 repetitions, ~10 minutes (2 cores)
    python experiments/ingestion.py --report-only   # README.md and plots again from results.json

Workers are real processes started with the ``spawn`` method (what macOS, Windows and CUDA
users get; a fresh interpreter, so a worker's memory is its own). A pool of 4 workers is started
once per repetition and driven by commands; each measurement releases its workers with an event
once all are ready (data generated, writer attached). Writes only under ``reports/ingest/``
(``README.md``, ``results.json``, ``*.png``); a quick run under ``reports/quick/ingest/``, and
both under ``$TFDATA_REPORTS_DIR/ingest/`` when that is set (as ``tfdata run`` does). The shared
regions it makes live in ``/dev/shm`` for the duration of a condition and are removed. Only the
public tfdata API.
"""

from __future__ import annotations

import os

os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")  # spawned workers write no .pyc either
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import multiprocessing as mp  # noqa: E402
import queue as queue_mod  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from functools import partial  # noqa: E402

import numpy as np  # noqa: E402

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
import tfdata  # noqa: E402
from tfdata.shared import SharedReplayBuffer, SharedWriter  # noqa: E402
from _plots import bar_series, grid_figure, lines, panels_figure  # noqa: E402
from _recording import RunRecord, report_dir, write_json  # noqa: E402
from _render import hand_written, table, write_report as write_methodology_report  # noqa: E402
from _stats import summary  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "ingestion"
REPORT = "ingest"
OUT_DIR = report_dir("ingest")  # reports/ingest/ (a quick run: see main)
REPS = {"full": 5, "quick": 2}           # repetitions (seeds 0..reps-1); a fresh worker pool each
START_METHOD = "spawn"
WORKERS = (1, 2, 4)
TRANSPORTS = ("shm-aos", "shm-soa", "queue")
KINDS = ("cartpole", "image")
UNITS = ("row", "step")                  # one row per call, or one vector-env step per call
STEP_ROWS = 8                            # rows of one vector-env step
BATCH = 256                              # rows per learner batch (throughput)
SPECS = {
    # a CartPole-v1 transition: 46 bytes of data, a 48-byte AoS record. "action" carries the
    # row id (worker << 32 | row number), which is how exact-once delivery is checked.
    "cartpole": {"obs": ("f4", (4,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (4,)),
                 "terminated": "?", "truncated": "?"},
    # an Atari transition with obs and next_obs frame stacks: 56,462 bytes of data
    "image": {"obs": ("u1", (4, 84, 84)), "action": "i8", "reward": "f4",
              "next_obs": ("u1", (4, 84, 84)), "terminated": "?", "truncated": "?"},
}
# rows per condition (all workers together), per (kind, unit, transport family), in full mode:
# chosen so that a condition takes about 1-3 s on a 2-core machine. Quick mode divides by 8.
ROWS = {
    ("cartpole", "row", "shm"): 655_360, ("cartpole", "row", "queue"): 131_072,
    ("cartpole", "step", "shm"): 3_145_728, ("cartpole", "step", "queue"): 524_288,
    ("image", "row", "shm"): 163_840, ("image", "row", "queue"): 32_768,
    ("image", "step", "shm"): 196_608, ("image", "step", "queue"): 24_576,
}
QUICK_DIVISOR = 8
FIFO_CAPACITY = {"cartpole": 65_536, "image": 2_048}   # rows of the FIFO region (all shards)
POOL_ROWS = {"cartpole": 1024, "image": 64}            # distinct precomputed rows per worker
CHECK_EVERY = 16                         # content check of every 16th batch ...
CHECK_STRIDE = {"cartpole": 1, "image": 16}   # ... all its rows (cartpole), every 16th (image)
# sample latency
LAT_LAYOUTS = ("aos", "soa")
LAT_CAPACITY = {"cartpole": 100_000, "image": 2_000}   # rows (4 shards in the shared buffer)
LAT_BATCH = {"cartpole": 256, "image": 32}
LAT_SECONDS = {"full": 1.0, "quick": 0.25}             # sampling time per condition
LAT_SETTLE_S = 0.05                      # writers run this long before sampling starts
PACE = {"cartpole": 20_000, "image": 2_000}            # rows/s of all paced writers together
LAT_CONDITIONS = (("local", 0, False), ("shm-idle", 0, False),
                  ("shm+1", 1, False), ("shm+2", 2, False), ("shm+4", 4, False),
                  ("shm+1 paced", 1, True), ("shm+2 paced", 2, True), ("shm+4 paced", 4, True))
MAX_CALLS = 400_000
TIMEOUT_S = 300                          # a condition that takes longer than this has hung
TARGET_THROUGHPUT = 10.0                 # shm / queue, CartPole rows
TARGET_LATENCY = 1.5                     # sample latency with writers / single-process buffer


def spec_of(kind: str) -> tfdata.Spec:
    return tfdata.Spec(SPECS[kind])


def rows_for(kind: str, unit: str, transport: str, quick: bool) -> int:
    n = ROWS[(kind, unit, "queue" if transport == "queue" else "shm")]
    if quick:
        n //= QUICK_DIVISOR
    # every worker count gets a whole number of steps and batches per worker
    unit_rows = max(WORKERS) * BATCH * STEP_ROWS
    return max(unit_rows, n // unit_rows * unit_rows)


def make_pool(kind: str, seed: int) -> dict:
    """The precomputed rows every worker sends (the same for all workers of a repetition)."""
    rng = np.random.default_rng([seed, 12345])
    n = POOL_ROWS[kind]
    out = {}
    for f in spec_of(kind):
        shape = (n,) + f.shape
        if f.dtype.kind == "b":
            out[f.name] = rng.random(shape) < 0.1
        elif f.dtype.kind == "u":
            out[f.name] = rng.integers(0, 256, shape, dtype=f.dtype)
        elif f.dtype.kind == "i":
            out[f.name] = rng.integers(0, 2, shape, dtype=f.dtype)
        else:
            out[f.name] = rng.standard_normal(shape).astype(f.dtype)
    return out


def row_dicts(pool: dict) -> list:
    """One dict per pool row as a gymnasium step gives it (arrays for shaped fields, Python
    scalars otherwise)."""
    n = len(pool["action"])
    return [{k: (v[j] if v.ndim > 1 else v[j].item()) for k, v in pool.items()} for j in range(n)]


def step_dicts(pool: dict) -> list:
    """One dict of 8-row arrays per vector-env step of the pool."""
    n = len(pool["action"]) // STEP_ROWS
    return [{k: v[j * STEP_ROWS:(j + 1) * STEP_ROWS] for k, v in pool.items()} for j in range(n)]


# ---------------------------------------------------------------------------------------------
# Worker processes
# ---------------------------------------------------------------------------------------------
def _peak_rss() -> int:
    return int(tfdata.memory.snapshot(uss=False)["peak_rss"])


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_ticks(pids) -> tuple:
    """(busy ticks of all CPUs, ticks used by ``pids``): their difference over an interval is the
    CPU time other processes of the machine took (Linux /proc; zeros elsewhere)."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        busy = sum(v[:8]) - v[3] - v[4]   # all but idle and iowait
    except (OSError, ValueError, IndexError):
        return 0, 0
    own = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            own += int(fields[11]) + int(fields[12])  # utime + stime, all threads
        except (OSError, ValueError, IndexError):
            pass
    return busy, own


def other_cpus(before: tuple, after: tuple, seconds: float) -> float:
    """CPUs' worth of time that processes outside this experiment used between two cpu_ticks()."""
    return max(0.0, ((after[0] - before[0]) - (after[1] - before[1])) / _TICK / max(seconds, 1e-9))


def _start_peak() -> int:
    """Reset the peak RSS to the current RSS (this phase alone); returns the current RSS."""
    tfdata.memory.reset_peak()
    return int(tfdata.memory.snapshot(uss=False)["rss"])


def _warm_writer() -> None:
    """Load every kernel a writer calls (both layouts, both modes, both kinds), off the clock."""
    for kind in KINDS:
        pool = make_pool(kind, 0)
        row, step = row_dicts(pool)[0], step_dicts(pool)[0]
        for layout in ("aos", "soa"):
            for mode in ("fifo", "replay"):
                with SharedReplayBuffer(spec_of(kind), 16, mode=mode, layout=layout, seed=0) as buf:
                    with SharedWriter(buf.name, 0) as w:
                        w.push(row)
                        w.extend(step)
                        if mode == "fifo":
                            buf.get_batch(9)
                        else:
                            buf.sample(4)


def _ingest(cmd: dict, conn, queue, go) -> dict:
    """Send ``cmd["rows"]`` rows, then report. Ids: ``wid << 32 | row number``."""
    rss0 = _start_peak()
    kind, unit, n, wid = cmd["kind"], cmd["unit"], cmd["rows"], cmd["wid"]
    pool = make_pool(kind, cmd["seed"])
    base = wid << 32
    writer = None
    if cmd["transport"] != "queue":
        writer = SharedWriter(cmd["name"], cmd["shard"], timeout=TIMEOUT_S)
        send = writer.push if unit == "row" else writer.extend
    else:
        send = queue.put
    if unit == "row":
        rows = row_dicts(pool)
        mask = len(rows) - 1
    else:
        rows = step_dicts(pool)
        mask = len(rows) - 1
        ids = np.arange(base, base + n, dtype=np.int64)
    conn.send(("ready", os.getpid()))
    go.wait()
    t0 = time.perf_counter()
    if unit == "row":
        for i in range(n):
            r = rows[i & mask].copy()   # a fresh dict per row: a queued dict is pickled later
            r["action"] = base + i
            send(r)
    else:
        for k in range(n // STEP_ROWS):
            s = rows[k & mask].copy()
            s["action"] = ids[k * STEP_ROWS:(k + 1) * STEP_ROWS]
            send(s)
    t1 = time.perf_counter()
    if writer is not None:
        writer.close()
    peak = _peak_rss()
    return {"send_s": t1 - t0, "peak_rss": peak, "peak_growth": peak - rss0}


def _write(cmd: dict, conn, go, stop) -> dict:
    """Extend steps into a replay shard until told to stop, flat out or paced."""
    rss0 = _start_peak()
    pool = make_pool(cmd["kind"], cmd["seed"])
    steps = step_dicts(pool)
    mask = len(steps) - 1
    rate = cmd["rate"]  # rows/s of this worker, or None (flat out)
    w = SharedWriter(cmd["name"], cmd["shard"])
    extend = w.extend
    conn.send(("ready", os.getpid()))
    go.wait()
    t0 = time.perf_counter()
    k = 0
    if rate is None:
        while not stop[0]:
            extend(steps[k & mask])
            k += 1
    else:
        interval = STEP_ROWS / rate
        nxt = t0
        while not stop[0]:
            extend(steps[k & mask])
            k += 1
            nxt += interval
            d = nxt - time.perf_counter()
            if d > 0:
                time.sleep(d)
    elapsed = time.perf_counter() - t0
    w.close()
    peak = _peak_rss()
    return {"rows": k * STEP_ROWS, "seconds": elapsed, "peak_rss": peak, "peak_growth": peak - rss0}


def worker_main(idx: int, conn, queue, go, stop) -> None:
    """A pool worker: warms up, then runs commands from the learner until told to quit."""
    try:
        _warm_writer()
        queue.put(("hello", idx))  # starts this process's queue feeder thread, off the clock
        conn.send(("hello", os.getpid()))
        while True:
            cmd = conn.recv()
            if cmd is None:
                break
            if cmd["op"] == "ingest":
                res = _ingest(cmd, conn, queue, go)
            else:
                res = _write(cmd, conn, go, stop)
            conn.send(("done", res))
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except Exception:
            pass
        raise


# ---------------------------------------------------------------------------------------------
# The learner side
# ---------------------------------------------------------------------------------------------
class Pool:
    """``max(WORKERS)`` spawned workers, one pipe each, one shared queue, a go event, a stop flag."""

    def __init__(self, n: int):
        ctx = mp.get_context(START_METHOD)
        self.queue = ctx.Queue()
        self.go = ctx.Event()
        self.stop = ctx.RawArray("b", 1)
        self.conns, self.procs = [], []
        t0 = time.perf_counter()
        for i in range(n):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(i, child, self.queue, self.go, self.stop),
                            daemon=True, name=f"ingest-worker-{i}")
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        for i in range(n):
            self.recv(i, "hello")
        for _ in range(n):
            tag, _i = self.queue.get(timeout=TIMEOUT_S)
            assert tag == "hello"
        self.startup_s = time.perf_counter() - t0

    def recv(self, i: int, want: str):
        conn = self.conns[i]
        if not conn.poll(TIMEOUT_S):
            raise RuntimeError(f"worker {i} sent nothing within {TIMEOUT_S} s (waiting for {want!r})")
        tag, payload = conn.recv()
        if tag == "error":
            raise RuntimeError(f"worker {i} failed:\n{payload}")
        if tag != want:
            raise RuntimeError(f"worker {i} sent {tag!r}, expected {want!r}")
        return payload

    def send(self, i: int, cmd: dict) -> None:
        self.conns[i].send(cmd)

    def alive(self, n: int) -> bool:
        return all(p.exitcode is None for p in self.procs[:n])

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
            except OSError:
                pass
        for p in self.procs:
            p.join(timeout=30)
            if p.exitcode is None:
                p.terminate()
                p.join(timeout=10)
        for c in self.conns:
            c.close()
        self.queue.close()
        self.queue.cancel_join_thread()


def warm_learner() -> None:
    """Load the learner's kernels (FIFO plan and gather, shared and local sampling) off the clock."""
    for kind in KINDS:
        spec = spec_of(kind)
        pool = make_pool(kind, 0)
        for layout in ("aos", "soa"):
            with SharedReplayBuffer(spec, 64, mode="fifo", layout=layout, seed=0) as buf:
                with SharedWriter(buf.name, 0) as w:
                    w.extend({k: v[:32] for k, v in pool.items()})
                for _ in buf.batches(16):
                    pass
            with SharedReplayBuffer(spec, 64, mode="replay", layout=layout, seed=0) as buf:
                with SharedWriter(buf.name, 0) as w:
                    w.extend({k: v[:32] for k, v in pool.items()})
                buf.sample(16)
            local = tfdata.ReplayBuffer(spec, 64, layout=layout, seed=0)
            local.extend({k: v[:32] for k, v in pool.items()})
            local.sample(16)


def check_content(fields, ids: np.ndarray, pool: dict, stride: int) -> None:
    """Every checked row holds exactly the pool row its id says (no torn or mixed rows)."""
    sel = slice(None, None, stride)
    j = (ids[sel] & 0xFFFFFFFF) % len(pool["action"])
    for name, want in pool.items():
        if name == "action":
            continue
        got = fields[name][sel]
        if not np.array_equal(got, want[j]):
            bad = int(np.flatnonzero(~np.all((got == want[j]).reshape(len(j), -1), axis=1))[0])
            raise AssertionError(f"row id {int(ids[sel][bad]):#x}: field {name!r} does not hold what "
                                 f"its writer sent")


def verify_ids(ids: np.ndarray, workers: int, per_worker: int, what: str) -> None:
    """Every id ``w << 32 | i`` (``i < per_worker``) exactly once, each writer's in its order."""
    total = workers * per_worker
    if len(ids) != total:
        raise AssertionError(f"{what}: {len(ids)} rows delivered, {total} sent")
    wid = ids >> 32
    seq = ids & 0xFFFFFFFF
    for w in range(workers):
        mine = seq[wid == w]
        if len(mine) != per_worker or not np.array_equal(mine, np.arange(per_worker)):
            got = np.unique(mine)
            raise AssertionError(
                f"{what}: worker {w} sent rows 0..{per_worker - 1}; delivered {len(mine)} "
                f"({len(got)} distinct, {per_worker - len(np.intersect1d(got, np.arange(per_worker)))} "
                f"missing){'' if np.all(np.diff(mine) > 0) else ', out of order'}")
    if np.any((wid < 0) | (wid >= workers)):
        raise AssertionError(f"{what}: rows from unknown writers")


def _watchdog(pool: Pool, n: int, done: threading.Event) -> None:
    """Queue transport: if a worker dies or the condition hangs, wake the learner's get()."""
    t0 = time.monotonic()
    while not done.wait(0.5):
        if not pool.alive(n) or time.monotonic() - t0 > TIMEOUT_S:
            pool.queue.put(None)
            return


def run_ingest(pool: Pool, transport: str, kind: str, unit: str, workers: int, total: int,
               seed: int) -> dict:
    spec = spec_of(kind)
    per_worker = total // workers
    data_pool = make_pool(kind, seed)
    stride = CHECK_STRIDE[kind]
    ids = np.empty(total, np.int64)
    buf = None
    ages = []
    rss0 = _start_peak()  # the learner's memory for this condition: buffer, batches, queue items
    try:
        cmd = {"op": "ingest", "transport": transport, "kind": kind, "unit": unit,
               "rows": per_worker, "seed": seed}
        if transport != "queue":
            buf = SharedReplayBuffer(spec, FIFO_CAPACITY[kind], num_writers=workers, mode="fifo",
                                     policy="block", layout=transport.split("-")[1], seed=seed)
            cmd["name"] = buf.name
        for w in range(workers):
            pool.send(w, dict(cmd, wid=w, shard=w))
        for w in range(workers):
            pool.recv(w, "ready")
        load1 = os.getloadavg()[0]
        pids = [os.getpid()] + [p.pid for p in pool.procs]
        pos = 0
        nb = 0
        if buf is not None:
            ticks0 = cpu_ticks(pids)
            t0 = time.perf_counter()
            pool.go.set()
            for batch in buf.batches(BATCH, timeout=TIMEOUT_S):
                a = batch["action"]
                k = len(a)
                if pos + k > total:
                    raise AssertionError(f"{transport}: more rows delivered than sent")
                ids[pos:pos + k] = a
                pos += k
                nb += 1
                ages.append(batch.metrics["oldest_age_s"])
                if nb % CHECK_EVERY == 0:
                    check_content(batch, a, data_pool, stride)
                if pos == total:
                    break
            t1 = time.perf_counter()
        else:
            q = pool.queue
            get = q.get
            out = {f.name: np.empty((BATCH,) + f.shape, f.dtype) for f in spec}
            items = list(out.items())
            out_ids = out["action"]
            i = 0
            done = threading.Event()
            dog = threading.Thread(target=_watchdog, args=(pool, workers, done), daemon=True)
            dog.start()
            ticks0 = cpu_ticks(pids)
            t0 = time.perf_counter()
            pool.go.set()
            try:
                if unit == "row":
                    while pos < total:
                        item = get()
                        if item is None:
                            raise RuntimeError("queue transport: a worker died or the run hung")
                        for name, arr in items:
                            arr[i] = item[name]
                        i += 1
                        if i == BATCH:
                            ids[pos:pos + BATCH] = out_ids
                            pos += BATCH
                            i = 0
                            nb += 1
                            if nb % CHECK_EVERY == 0:
                                check_content(out, out_ids, data_pool, stride)
                else:
                    while pos < total:
                        item = get()
                        if item is None:
                            raise RuntimeError("queue transport: a worker died or the run hung")
                        j = i + STEP_ROWS
                        for name, arr in items:
                            arr[i:j] = item[name]
                        i = j
                        if i == BATCH:
                            ids[pos:pos + BATCH] = out_ids
                            pos += BATCH
                            i = 0
                            nb += 1
                            if nb % CHECK_EVERY == 0:
                                check_content(out, out_ids, data_pool, stride)
                t1 = time.perf_counter()
            finally:
                done.set()
                dog.join()
        ticks1 = cpu_ticks(pids)
        learner_peak = _peak_rss()
        res = [pool.recv(w, "done") for w in range(workers)]
    finally:
        pool.go.clear()
        region = buf.nbytes if buf is not None else 0
        if buf is not None:
            leftover = len(buf)
            states = [s["state"] for s in buf.writers()]
            published = sum(s["published"] for s in buf.writers())
            buf.close()
    what = f"{transport} {kind} {unit} x{workers}"
    verify_ids(ids[:pos], workers, per_worker, what)
    if buf is not None:
        if leftover or published != total or any(s != "finished" for s in states):
            raise AssertionError(f"{what}: after the run {leftover} rows queued, {published} "
                                 f"published (sent {total}), writer states {states}")
    else:
        try:
            extra = pool.queue.get(timeout=0.02)
        except queue_mod.Empty:
            pass
        else:
            raise AssertionError(f"{what}: more rows in the queue than sent ({extra!r:.80})")
    seconds = t1 - t0
    return {"transport": transport, "kind": kind, "unit": unit, "workers": workers, "rows": total,
            "batches": nb, "seconds": seconds, "rows_per_s": total / seconds,
            "worker_send_s_max": max(r["send_s"] for r in res),
            "learner_peak_rss": learner_peak, "learner_peak_growth": learner_peak - rss0,
            "worker_peak_rss_max": max(r["peak_rss"] for r in res),
            "worker_peak_growth_max": max(r["peak_growth"] for r in res),
            "region_nbytes": region, "oldest_age_s_median": float(np.median(ages)) if ages else None,
            "load1": load1, "other_cpus": other_cpus(ticks0, ticks1, seconds), "verified": True}


def sample_times(sample, batch: int, seconds: float) -> np.ndarray:
    clock = time.perf_counter_ns
    times = np.empty(MAX_CALLS, np.int64)
    end = clock() + int(seconds * 1e9)
    n = 0
    while n < MAX_CALLS:
        a = clock()
        sample(batch)
        b = clock()
        times[n] = b - a
        n += 1
        if b >= end:
            break
    return times[:n]


def run_latency(pool: Pool, kind: str, layout: str, rep: int, seconds: float) -> list:
    spec = spec_of(kind)
    cap, batch = LAT_CAPACITY[kind], LAT_BATCH[kind]
    data = make_pool(kind, rep)
    fill = {k: np.concatenate([v] * (-(-cap // len(v))))[:cap] for k, v in data.items()}
    local = tfdata.ReplayBuffer(spec, cap, layout=layout, seed=rep)
    local.extend(fill)
    shards = max(WORKERS)
    out = []
    with SharedReplayBuffer(spec, cap, num_writers=shards, mode="replay", layout=layout,
                            seed=rep) as shm:
        per = cap // shards
        for s in range(shards):  # prefilled by this process, then the workers take the shards over
            with SharedWriter(shm.name, s) as w:
                w.extend({k: v[s * per:(s + 1) * per] for k, v in fill.items()})
        for _ in range(20):
            local.sample(batch)
            shm.sample(batch)
        conds = list(LAT_CONDITIONS)
        r = rep % len(conds)
        conds = conds[r:] + conds[:r]  # rotate the order between repetitions
        for name, n, paced in conds:
            load1 = os.getloadavg()[0]
            tfdata.memory.reset_peak()
            redraws0 = shm.redraws
            res = []
            if n:
                rate = PACE[kind] / n if paced else None
                for w in range(n):
                    pool.send(w, {"op": "write", "kind": kind, "name": shm.name, "shard": w,
                                  "seed": rep, "rate": rate})
                for w in range(n):
                    pool.recv(w, "ready")
                pool.go.set()
                time.sleep(LAT_SETTLE_S)
            pids = [os.getpid()] + [p.pid for p in pool.procs]
            ticks0, c0 = cpu_ticks(pids), time.perf_counter()
            try:
                t = sample_times(local.sample if name == "local" else shm.sample, batch, seconds)
                ticks1, c1 = cpu_ticks(pids), time.perf_counter()
            finally:
                if n:
                    pool.stop[0] = 1
                    res = [pool.recv(w, "done") for w in range(n)]
                    pool.go.clear()
                    pool.stop[0] = 0
            out.append({
                "kind": kind, "layout": layout, "condition": name, "writers": n, "paced": paced,
                "batch": batch, "capacity": cap, "calls": int(len(t)),
                "median_ns": float(np.median(t)), "p99_ns": float(np.percentile(t, 99)),
                "mean_ns": float(t.mean()), "redraws": int(shm.redraws - redraws0),
                "rows_written": int(sum(x["rows"] for x in res)),
                "write_rows_per_s": (sum(x["rows"] / x["seconds"] for x in res) if res else 0.0),
                "learner_peak_rss": _peak_rss(),
                "worker_peak_rss_max": max((x["peak_rss"] for x in res), default=None),
                "region_nbytes": shm.nbytes if name != "local" else local.nbytes,
                "processes": 1 + n, "load1": load1, "other_cpus": other_cpus(ticks0, ticks1, c1 - c0)})
    return out


def _per_call_us(f, calls: int, blocks: int = 5) -> float:
    clock = time.perf_counter
    per = []
    for _ in range(blocks):
        t0 = clock()
        for _ in range(calls):
            f()
        per.append((clock() - t0) / calls * 1e6)
    return float(np.median(per))


def per_call_costs(seed: int, calls: int) -> dict:
    """In this process, alone: what one send costs through each transport (CartPole rows)."""
    from multiprocessing.reduction import ForkingPickler  # what multiprocessing.Queue pickles with
    import pickle

    spec = spec_of("cartpole")
    pool = make_pool("cartpole", seed)
    row, step = row_dicts(pool)[1], step_dicts(pool)[1]
    out = {}
    for layout in ("aos", "soa"):
        with SharedReplayBuffer(spec, 1 << 16, mode="replay", layout=layout, seed=seed) as buf:
            with SharedWriter(buf.name, 0) as w:
                out[f"SharedWriter.push, 1 row ({layout}, replay ring)"] = _per_call_us(lambda: w.push(row), calls)
                out[f"SharedWriter.extend, {STEP_ROWS}-row step ({layout}, replay ring)"] = \
                    _per_call_us(lambda: w.extend(step), calls)
        local = tfdata.ReplayBuffer(spec, 1 << 16, layout=layout, seed=seed)
        out[f"ReplayBuffer.push, 1 row ({layout}, for scale)"] = _per_call_us(lambda: local.push(row), calls)
    out["pickle + unpickle of a row dict (what a Queue put + get serialises)"] = \
        _per_call_us(lambda: pickle.loads(ForkingPickler.dumps(row)), calls)
    out[f"pickle + unpickle of a {STEP_ROWS}-row step dict"] = \
        _per_call_us(lambda: pickle.loads(ForkingPickler.dumps(step)), calls)
    return out


def measure(reps: int, quick: bool) -> tuple[list, list, list, list]:
    ingest, latency, pools, costs = [], [], [], []
    seconds = LAT_SECONDS["quick" if quick else "full"]
    warm_learner()
    for rep in range(reps):
        c = per_call_costs(rep, 2000 if quick else 10000)
        c["rep"] = rep
        costs.append(c)
        pool = Pool(max(WORKERS))
        pools.append({"rep": rep, "startup_s": pool.startup_s})
        print(f"rep {rep}: {len(pool.procs)} workers ({START_METHOD}) ready in {pool.startup_s:.1f} s",
              flush=True)
        try:
            cell = 0
            for kind in KINDS:
                for unit in UNITS:
                    for workers in WORKERS:
                        r = (rep + cell) % len(TRANSPORTS)
                        order = TRANSPORTS[r:] + TRANSPORTS[:r]  # rotate: A/B alternation
                        cell += 1
                        for transport in order:
                            total = rows_for(kind, unit, transport, quick)
                            x = run_ingest(pool, transport, kind, unit, workers, total, rep)
                            x["rep"] = rep
                            ingest.append(x)
                            print(f"  {kind:8} {unit:4} x{workers} {transport:7}: {x['rows_per_s']:>12,.0f} "
                                  f"rows/s ({x['rows']} rows in {x['seconds']:.2f} s, exact-once ok)",
                                  flush=True)
            for kind in KINDS:
                for layout in LAT_LAYOUTS:
                    for x in run_latency(pool, kind, layout, rep, seconds):
                        x["rep"] = rep
                        latency.append(x)
                        print(f"  latency {kind:8} {layout} {x['condition']:12}: median "
                              f"{x['median_ns'] / 1e3:8.1f} us, p99 {x['p99_ns'] / 1e3:8.1f} us "
                              f"({x['calls']} calls, writers {x['write_rows_per_s']:,.0f} rows/s)", flush=True)
        finally:
            pool.close()
    return ingest, latency, pools, costs


# ---------------------------------------------------------------------------------------------
# Summaries, plots, report
# ---------------------------------------------------------------------------------------------
def stats(v) -> dict:
    return summary(v, extremes=True)


def summarise(ingest: list, latency: list, costs: list) -> dict:
    thr, ratios = {}, {}
    for kind in KINDS:
        for unit in UNITS:
            for w in WORKERS:
                cell = [x for x in ingest if x["kind"] == kind and x["unit"] == unit and x["workers"] == w]
                for t in TRANSPORTS:
                    xs = [x for x in cell if x["transport"] == t]
                    thr[f"{kind}/{unit}/{w}/{t}"] = {
                        "rows_per_s": stats([x["rows_per_s"] for x in xs]),
                        "learner_peak_rss_max": max(x["learner_peak_rss"] for x in xs),
                        "learner_peak_growth_max": max(x["learner_peak_growth"] for x in xs),
                        "worker_peak_rss_max": max(x["worker_peak_rss_max"] for x in xs),
                        "worker_peak_growth_max": max(x["worker_peak_growth_max"] for x in xs),
                        "region_nbytes": xs[0]["region_nbytes"], "rows": xs[0]["rows"],
                        "other_cpus": stats([x["other_cpus"] for x in xs])}
                q = {x["rep"]: x["rows_per_s"] for x in cell if x["transport"] == "queue"}
                for t in TRANSPORTS[:2]:
                    per_rep = [x["rows_per_s"] / q[x["rep"]] for x in cell if x["transport"] == t]
                    ratios[f"{kind}/{unit}/{w}/{t}"] = stats(per_rep)
    lat, lat_ratio = {}, {}
    for kind in KINDS:
        for layout in LAT_LAYOUTS:
            cell = [x for x in latency if x["kind"] == kind and x["layout"] == layout]
            local = {x["rep"]: x for x in cell if x["condition"] == "local"}
            idle = {x["rep"]: x for x in cell if x["condition"] == "shm-idle"}
            for name, n, paced in LAT_CONDITIONS:
                xs = [x for x in cell if x["condition"] == name]
                key = f"{kind}/{layout}/{name}"
                lat[key] = {"median_ns": stats([x["median_ns"] for x in xs]),
                            "p99_ns": stats([x["p99_ns"] for x in xs]),
                            "calls": stats([x["calls"] for x in xs]),
                            "redraws": stats([x["redraws"] for x in xs]),
                            "write_rows_per_s": stats([x["write_rows_per_s"] for x in xs]),
                            "learner_peak_rss_max": max(x["learner_peak_rss"] for x in xs),
                            "worker_peak_rss_max": max((x["worker_peak_rss_max"] or 0) for x in xs) or None,
                            "region_nbytes": xs[0]["region_nbytes"], "processes": 1 + n}
                lat_ratio[key] = {
                    "median": stats([x["median_ns"] / local[x["rep"]]["median_ns"] for x in xs]),
                    "p99": stats([x["p99_ns"] / local[x["rep"]]["p99_ns"] for x in xs]),
                    "median_vs_idle": stats([x["median_ns"] / idle[x["rep"]]["median_ns"] for x in xs]),
                    "p99_vs_idle": stats([x["p99_ns"] / idle[x["rep"]]["p99_ns"] for x in xs])}
    per_call = {k: stats([c[k] for c in costs]) for k in costs[0] if k != "rep"} if costs else {}
    load = {"ingest": stats([x["other_cpus"] for x in ingest]), "latency": stats([x["other_cpus"] for x in latency])}
    return {"throughput": thr, "ratio_vs_queue": ratios, "latency": lat, "latency_ratio_vs_local": lat_ratio,
            "per_call_us": per_call, "other_cpus": load}


def plot(summary: dict) -> list:
    """The report's figures, declared as panels of the generic kinds of _plots."""
    thr, rat, lr = summary["throughput"], summary["ratio_vs_queue"], summary["latency_ratio_vs_local"]
    colors = {"shm-aos": "tab:blue", "shm-soa": "tab:green", "queue": "tab:red"}
    names = [panels_figure(OUT_DIR, "throughput.png", (15, 4.2), [partial(
        lines, xs=WORKERS, yscale="log", grid_which="both", xlabel="worker processes", title_fontsize=10,
        title=f"{kind}, one {'row' if unit == 'row' else f'{STEP_ROWS}-row step'} per call",
        series=[{"y": [thr[f"{kind}/{unit}/{w}/{t}"]["rows_per_s"]["mean"] for w in WORKERS],
                 "yerr": [thr[f"{kind}/{unit}/{w}/{t}"]["rows_per_s"]["std"] for w in WORKERS],
                 "marker": "o", "capsize": 3, "label": t, "color": colors[t]} for t in TRANSPORTS],
        ylabel="rows/s delivered to the learner (log)" if i == 0 else None, legend={"fontsize": 8} if i == 0 else None)
        for i, (kind, unit) in enumerate([(k, u) for k in KINDS for u in UNITS])], sharex=True,
        suptitle=f"Ingestion throughput, batches of {BATCH} rows, exact-once (mean ± std over repetitions)")]
    names.append(panels_figure(OUT_DIR, "ratio_vs_queue.png", (11, 4.2), [partial(
        lines, xs=WORKERS, yscale="log", grid_which="both", xlabel="worker processes", title_fontsize=10,
        title=f"{kind}: shared memory / multiprocessing.Queue" +
              (f" (target {TARGET_THROUGHPUT:g}x dotted)" if kind == "cartpole" else ""),
        series=[{"y": [rat[f"{kind}/{unit}/{w}/{t}"]["mean"] for w in WORKERS],
                 "yerr": [rat[f"{kind}/{unit}/{w}/{t}"]["std"] for w in WORKERS], "marker": "o", "capsize": 3,
                 "ls": ls, "color": colors[t], "label": f"{t}, {unit} per call"}
                for unit, ls in zip(UNITS, ("-", "--")) for t in TRANSPORTS[:2]],
        hlines=[(TARGET_THROUGHPUT if kind == "cartpole" else 1.0, dict(color="k", lw=0.8, ls=":"))],
        ylabel="throughput ratio (log)" if i == 0 else None, legend={"fontsize": 8} if i == 0 else None)
        for i, kind in enumerate(KINDS)], sharey=True))
    conds = [c[0] for c in LAT_CONDITIONS[1:]]
    x, width = np.arange(len(conds)), 0.38

    def ratio_bars(kind, stat, k, layout):
        cells = [lr[f"{kind}/{layout}/{c}"][stat] for c in conds]
        mid = np.array([c["median"] for c in cells])
        return {"at": x + (k - 0.5) * width, "heights": mid, "width": width, "capsize": 2, "label": layout,
                "yerr": [mid - np.array([c["min"] for c in cells]), np.array([c["max"] for c in cells]) - mid],
                "color": "tab:blue" if layout == "aos" else "tab:green"}
    names.append(grid_figure(OUT_DIR, "latency_ratio.png", (13, 7.5), [[partial(
        bar_series, ticks=(x, conds), tick_kw={"rotation": 20, "fontsize": 8},
        series=[ratio_bars(kind, stat, k, layout) for k, layout in enumerate(LAT_LAYOUTS)],
        hlines=[(TARGET_LATENCY, dict(color="k", lw=0.8, ls=":")), (1.0, dict(color="grey", lw=0.6))],
        yscale={"value": "log"} if stat == "p99" else None, ylabel=f"{stat} / ReplayBuffer's {stat}",
        title=f"{kind}: sample({LAT_BATCH[kind]}), {stat} per call (target {TARGET_LATENCY}x dotted)",
        grid={"axis": "y", "which": "both", "alpha": 0.3}, legend={"fontsize": 8} if (row, col) == (0, 0) else None)
        for col, kind in enumerate(KINDS)] for row, stat in enumerate(("median", "p99"))], sharex=True, top=1.0,
        suptitle="Learner sample latency over a single-process ReplayBuffer (bars: median over repetitions, "
                 "whiskers: min-max)", suptitle_fontsize=10))
    return names


def _rate(v: float) -> str:
    return f"{v / 1e6:.2f}M" if v >= 1e6 else f"{v / 1e3:.1f}k"


def _ms(c: dict, scale: float = 1.0, fmt: str = ".2f") -> str:
    return f"{c['mean'] * scale:{fmt}} ± {c['std'] * scale:{fmt}}"


def write_report(summary: dict, run: dict, pngs: list, pools: list, nreps: int) -> None:
    thr, rat = summary["throughput"], summary["ratio_vs_queue"]
    lat, lr = summary["latency"], summary["latency_ratio_vs_local"]
    costs = summary["per_call_us"]
    L = ["# Ingestion: worker processes to learner through shared memory\n",
         f"Made by `experiments/ingestion.py` ({run['mode']} run, command `{run['command']}`, "
         f"{nreps} repetition(s), {run['wall_clock_s']:.0f} s). Raw numbers: `results.json`.\n"]
    L.extend(hand_written(OUT_DIR, "findings"))
    for p in pngs:
        L.append(f"![{p}]({p})\n")

    L.append(f"## Throughput (rows/s delivered to the learner, batches of {BATCH}; mean ± std, median)\n")
    def rate(r, t):
        s = thr[f"{r['key']}/{t}"]["rows_per_s"]
        return f"{_rate(s['mean'])} ± {_rate(s['std'])} ({_rate(s['median'])})"
    L += table([{"kind": k, "unit": u, "w": w, "key": f"{k}/{u}/{w}"} for k in KINDS for u in UNITS for w in WORKERS],
               [("rows", "l", "{kind}"), ("per call", "l", lambda r: "1 row" if r["unit"] == "row" else f"{STEP_ROWS}-row step"),
                ("workers", "r", "{w}")] + [(t, "r", partial(rate, t=t)) for t in TRANSPORTS]
               + [(f"{t} / queue", "r", partial(lambda r, t: "{mean:.1f} ± {std:.1f} ({median:.1f})".format(
                   **rat[f"{r['key']}/{t}"]), t=t)) for t in TRANSPORTS[:2]]
               + [("other processes' CPUs", "r", lambda r: f"{np.mean([thr[r['key'] + '/' + t]['other_cpus']['mean'] for t in TRANSPORTS]):.2f}")])
    L.append("")
    L.append(f"## Sample latency while workers write (µs per call; mean ± std over repetitions of the per-run median / p99)\n")
    recs = [{"kind": k, "layout": lay, "name": name, "writers": n, "a": lat[f"{k}/{lay}/{name}"],
             "r": lr[f"{k}/{lay}/{name}"]} for k in KINDS for lay in LAT_LAYOUTS for name, n, _ in LAT_CONDITIONS]
    L += table(recs, [("rows", "l", lambda r: f"{r['kind']} (batch {LAT_BATCH[r['kind']]})"), ("layout", "l", "{layout}"),
                      ("condition", "l", lambda r: "ReplayBuffer, no writer" if r["name"] == "local" else r["name"]),
                      ("processes", "r", "{a[processes]}"),
                      ("writers' rows/s", "r", lambda r: _rate(r["a"]["write_rows_per_s"]["mean"]) if r["writers"] else "-"),
                      ("median µs", "r", lambda r: _ms(r["a"]["median_ns"], 1e-3, ".1f")),
                      ("p99 µs", "r", lambda r: _ms(r["a"]["p99_ns"], 1e-3, ".1f"))]
               + [(head, "r", partial(lambda r, k: "{mean:.2f} ({median:.2f})".format(**r["r"][k]), k=k))
                  for head, k in (("median / local", "median"), ("p99 / local", "p99"),
                                  ("median / shm-idle", "median_vs_idle"), ("p99 / shm-idle", "p99_vs_idle"))]
               + [("redraws per run", "r", "{a[redraws][mean]:.0f}")])
    L.append("")
    L.append("## Memory (peak RSS, largest over repetitions and sending units)\n")
    L.append("Peak RSS of the process during the condition, and in parentheses its growth over the RSS at "
             "the condition's start (what the transport itself added). The processes live for a whole "
             "repetition, so the absolute figures include heap kept from earlier conditions (the learner's, "
             "from the latency part of the previous repetition, whose buffers it built).\n")
    def mib(x, fmt=".0f"):
        return f"{x / 2**20:{fmt}}"
    recs = [{"rows": k, "w": w, "t": t, **{f: max(thr[f"{k}/{u}/{w}/{t}"][f] for u in UNITS) for f in (
        "region_nbytes", "learner_peak_rss_max", "learner_peak_growth_max", "worker_peak_rss_max", "worker_peak_growth_max")}}
            for k in KINDS for w in WORKERS for t in TRANSPORTS]
    rings = [{"rows": f"{k}, replay ring while sampling", "w": 4, "t": "shm-aos", "ring": lat[f"{k}/aos/shm+4"]} for k in KINDS]
    L += table(recs + rings, [
        ("rows", "l", "{rows}"), ("workers", "r", "{w}"), ("transport", "l", "{t}"),
        ("region (`buf.nbytes`)", "r", lambda r: f"{mib(r['ring']['region_nbytes'], '.1f')} MiB" if "ring" in r else
         "-" if r["t"] == "queue" else f"{mib(r['region_nbytes'], '.1f')} MiB"),
        ("learner peak RSS (growth)", "r", lambda r: f"{mib(r['ring']['learner_peak_rss_max'])} MiB" if "ring" in r else
         f"{mib(r['learner_peak_rss_max'])} MiB ({mib(r['learner_peak_growth_max'], '+.0f')})"),
        ("largest worker peak RSS (growth)", "r", lambda r: f"{mib(r['ring']['worker_peak_rss_max'] or 0)} MiB"
         if "ring" in r else f"{mib(r['worker_peak_rss_max'])} MiB ({mib(r['worker_peak_growth_max'], '+.0f')})")])
    L.append("")
    if costs:
        L.append("## Per-call cost of the sending side (one process, no contention; µs per call, median of 5 blocks)\n")
        L.append("What bounds one worker: a worker that does nothing but send can make at most 1e6 / cost calls "
                 "per second. The queue's cost is paid twice, by the worker (pickle) and by the learner "
                 "(unpickle), plus a pipe write and read.\n")
        L += table([{"name": name, **c} for name, c in costs.items()],
                   [("operation", "l", "{name}"), ("µs per call (mean ± std over repetitions)", "r", "{mean:.2f} ± {std:.2f}"),
                    ("rows/s at that cost", "r", lambda r: _rate((STEP_ROWS if "step" in r["name"] else 1) * 1e6 / r["mean"]))])
        L.append("")
    L.extend(hand_written(OUT_DIR, "method"))
    write_methodology_report(OUT_DIR, L, run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 repetitions, 1/8 of the rows (about a minute)")
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--report-only", action="store_true",
                    help="rewrite README.md and the plots from the results.json already there (no measuring)")
    args = ap.parse_args()
    mode = "quick" if args.quick else "full"
    reps = args.reps or REPS[mode]
    global OUT_DIR
    if args.quick and not os.environ.get("TFDATA_REPORTS_DIR"):
        # run directly: a quick run goes where `tfdata run --quick` puts it, never over the
        # published full report
        OUT_DIR = os.path.join(os.path.dirname(report_dir("ingest")), "quick", REPORT)
    os.makedirs(OUT_DIR, exist_ok=True)
    if args.report_only:
        import json

        with open(os.path.join(OUT_DIR, "results.json"), encoding="utf-8") as f:
            done = json.load(f)
        raw = done["raw"]
        summary = summarise(raw["ingest"], raw["latency"], raw["per_call_us"])
        write_report(summary, done["methodology"], plot(summary), done["pools"], len(done["methodology"]["seeds"]))
        print(f"rewrote {os.path.relpath(OUT_DIR)}/README.md from its results.json", flush=True)
        return
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=list(range(reps)),
                    command="python experiments/ingestion.py" + (" --quick" if args.quick else ""),
                    parameters={"start_method": START_METHOD, "workers": WORKERS, "transports": TRANSPORTS,
                                "kinds": KINDS, "units": UNITS, "step_rows": STEP_ROWS, "batch": BATCH,
                                "rows": {"/".join(k): v // (QUICK_DIVISOR if args.quick else 1)
                                         for k, v in ROWS.items()},
                                "fifo_capacity": FIFO_CAPACITY, "pool_rows": POOL_ROWS,
                                "latency_capacity": LAT_CAPACITY, "latency_batch": LAT_BATCH,
                                "latency_seconds": LAT_SECONDS[mode], "pace_rows_per_s": PACE,
                                "cpus": os.cpu_count()})
    ingest, latency, pools, costs = measure(reps, args.quick)
    summary = summarise(ingest, latency, costs)
    pngs = plot(summary)
    child_peak = max([x["worker_peak_rss_max"] for x in ingest]
                     + [x["worker_peak_rss_max"] for x in latency if x["worker_peak_rss_max"]])
    run = rec.finish(child_peak_rss_bytes=child_peak)
    write_json(os.path.join(OUT_DIR, "results.json"),
               {"methodology": run, "summary": summary, "pools": pools,
                "raw": {"ingest": ingest, "latency": latency, "per_call_us": costs}})
    write_report(summary, run, pngs, pools, reps)
    print(f"{mode} run {rec.run_name} done in {run['wall_clock_s']:.0f} s; report: "
          f"{os.path.relpath(OUT_DIR)}/README.md", flush=True)


if __name__ == "__main__":
    main()
