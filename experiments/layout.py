"""AoS or SoA: which layout samples faster, by row size, batch size, capacity, sampler and number
of fields, where does the answer flip, and what does each layout cost in memory?

A self-contained experiment (one file, parameters at the top, cleanrl style). It compares, in the
same run and interleaved in time:

* ``tfdata.ReplayBuffer(layout="aos")``: one structured array, a sampled row is one copy;
* ``tfdata.ReplayBuffer(layout="soa")``: one array per field, a sampled row is one copy per field;
* ``numpy``: the plain baseline people write by hand, one array per field, ``rng.integers`` and
  fancy indexing (a fresh output array per field per call, no input validation).

For every row kind x capacity x batch size it records the per-call latency of ``sample`` (median,
p99, mean, across seeds), the throughput of ``push`` and ``extend(1000)``, the storage bytes, and
the RSS growth of building and filling one buffer (measured in a fresh forked process).

Two further grids (AoS vs SoA, interleaved the same way):

* **samplers**: uniform ``ReplayBuffer.sample``, prioritized (``PrioritizedReplayBuffer``:
  ``sample`` + ``update_priorities`` per call) and n-step (``ReplayBuffer(n_step=3)``), on an
  episode stream, for the cartpole and medium rows at a cache-resident and a beyond-cache capacity;
* **fields**: a 64-byte float32 row split into 1, 2, 4, 8 or 16 fields (uniform sampling, with the
  numpy baseline).

From the measured medians it locates where the SoA/AoS ratio crosses 1 along each dimension (row
size, field count, capacity, batch size), by interpolating between measured points.

    python experiments/layout.py --quick      # under ~2 minutes: the demo (python3 dev.py demo)
    python experiments/layout.py              # the full run, under ~15 minutes
    python experiments/layout.py --seeds 0,1,2

Writes ``reports/layout/README.md``, ``results.json`` and ``*.png`` (the last run wins: the
published report is a full run; ``tfdata run layout --quick`` writes under ``reports/quick/``).
Only the public tfdata API is used, plus numpy, psutil and matplotlib.
"""

from __future__ import annotations

import gc
import os
import sys
import time

import numpy as np

import tfdata

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
from _methodology import (RunRecord, cache_placement, cache_size, calls_for_budget, crossings,  # noqa: E402
                          fmt_bytes, fmt_count, fmt_rate, fmt_us, fresh_pages_allocator, gc_paused,
                          gmean, interleaved_latencies, latency_stats, log_axes, mean_std,
                          parse_seeds, peak_rss_bytes, pyplot, ratio_summary, report_dir,
                          rotated, rss_bytes, run_forked, save_figure, seed_summary,
                          seeds_parser, time_calls, verdict as _verdict, write_json,
                          write_report as write_methodology_report)

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "layout"
IMPLS = ("aos", "soa", "numpy")  # two tfdata layouts and the plain numpy baseline
LAYOUTS = ("aos", "soa")
BATCH_SIZES = (32, 256, 1024)

ROW_KINDS = {
    # 2 scalar fields: 12 bytes of data, 16-byte AoS record (rounded up to 8-byte words)
    "tiny": {"action": "i8", "reward": "f4"},
    # a CartPole-v1 transition
    "cartpole": {"obs": ("f4", (4,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (4,)),
                 "terminated": "?", "truncated": "?"},
    # a 64-float observation (MuJoCo-like state)
    "medium": {"obs": ("f4", (64,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (64,)),
               "terminated": "?", "truncated": "?"},
    # an Atari frame stack, obs and next_obs stored (as a naive DQN buffer does)
    "image": {"obs": ("u1", (4, 84, 84)), "action": "i8", "reward": "f4",
              "next_obs": ("u1", (4, 84, 84)), "terminated": "?", "truncated": "?"},
}
# 1e4 rows is the "cache-resident" capacity for small rows; 1e6 (and 1e7 for the tiny row, whose
# 1e6 rows are only 16 MB) is "beyond cache". The report states where each one really lands.
CAPACITIES = {
    "full": {"tiny": (10_000, 1_000_000, 10_000_000), "cartpole": (10_000, 1_000_000),
             "medium": (10_000, 100_000), "image": (10_000,)},
    "quick": {"tiny": (10_000, 1_000_000), "cartpole": (10_000, 1_000_000),
              "medium": (10_000,), "image": (5_000,)},
}
DEFAULT_SEEDS = {"full": 5, "quick": 3}
SAMPLE_BUDGET_S = {"full": 1.0, "quick": 0.12}  # timed seconds per (config, impl, batch, seed)
MIN_CALLS = {"full": 60, "quick": 20}          # at least this many timed calls ...
MAX_CALLS = {"full": 20_000, "quick": 5_000}    # ... and at most this many
ROUNDS = {"full": 8, "quick": 3}                # calls are split in rounds, impls alternate
WARMUP_CALLS = 10                               # untimed calls before each measurement
WRITE_BUDGET_S = {"full": 0.25, "quick": 0.04}  # timed seconds per push / extend measurement
MIN_WRITE_CALLS = {"full": 20, "quick": 5}
EXTEND_ROWS = 1000                              # rows per extend call (and per fill call)
RING_SIZE = 2                                   # tfdata's default output ring
VERDICT_MARGIN = 0.03  # a winner needs every seed on its side and a mean ratio beyond 1 +- 3%

# -- sampler grid: AoS vs SoA for each sampler, on an episode stream ---------------------------
SAMPLERS = ("uniform", "prioritized", "nstep")
SAMPLER_LABELS = {"uniform": "uniform", "prioritized": "prioritized (sample + update_priorities)",
                  "nstep": "n-step (n=3)"}
SAMPLER_CAPACITIES = {  # (row kind -> capacities): one cache-resident, one beyond L3
    "full": {"cartpole": (10_000, 1_000_000), "medium": (10_000, 100_000)},
    "quick": {"cartpole": (10_000, 1_000_000), "medium": (10_000, 100_000)},
}
SAMPLER_BATCHES = {"full": (32, 256), "quick": (32, 256)}
N_STEP, GAMMA = 3, 0.99
TERMINATED_P, TRUNCATED_P = 0.01, 0.0  # the stream: an episode ends with probability 0.01 per row
STREAM_FLAGS = {"terminated": TERMINATED_P, "truncated": TRUNCATED_P}
PRIORITY_POOL = 64                      # pre-drawn |N(0,1)| priority vectors, cycled per call
# -- field-count grid: the same 64 bytes of float32 in 1..16 fields ----------------------------
FIELD_COUNTS = (1, 2, 4, 8, 16)
FIELD_ROW_FLOATS = 16                   # 16 x float32 = 64 bytes of data per row
FIELD_CAPACITIES = {"full": (10_000, 1_000_000), "quick": (10_000, 1_000_000)}
FIELD_BATCHES = {"full": (32, 256), "quick": (256,)}
FIELD_KINDS = {f"f{n}": {f"x{i}": ("f4", (FIELD_ROW_FLOATS // n,)) if n < FIELD_ROW_FLOATS else "f4"
                         for i in range(n)} for n in FIELD_COUNTS}
# timed seconds per (config, sampler/impl, batch, seed) in the two extra grids
EXTRA_BUDGET_S = {"full": 0.4, "quick": 0.1}

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = report_dir(EXPERIMENT)
COLORS = {"aos": "tab:blue", "soa": "tab:orange", "numpy": "tab:gray"}
LABELS = {"aos": "tfdata AoS", "soa": "tfdata SoA", "numpy": "numpy baseline"}


# ---------------------------------------------------------------------------------------------
# The plain numpy baseline
# ---------------------------------------------------------------------------------------------
class NumpyBuffer:
    """The hand-written buffer tfdata replaces: per-field arrays, a cursor, numpy's RNG."""

    def __init__(self, spec: tfdata.Spec, capacity: int, seed: int):
        self.arrays = {f.name: np.zeros((capacity,) + f.shape, dtype=f.dtype) for f in spec}
        self.capacity = capacity
        self.cursor = 0
        self.size = 0
        self.rng = np.random.default_rng(seed)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def push(self, row) -> None:
        i = self.cursor
        for name, a in self.arrays.items():
            a[i] = row[name]
        self.cursor = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def extend(self, batch) -> None:  # n <= capacity
        i = self.cursor
        n = len(next(iter(batch.values())))
        first = min(n, self.capacity - i)
        for name, a in self.arrays.items():
            v = batch[name]
            a[i:i + first] = v[:first]
            if n > first:
                a[:n - first] = v[first:]
        self.cursor = (i + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int) -> dict:
        idx = self.rng.integers(0, self.size, batch_size)
        return {name: a[idx] for name, a in self.arrays.items()}


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def make_spec(kind: str) -> tfdata.Spec:
    return tfdata.Spec(ROW_KINDS[kind] if kind in ROW_KINDS else FIELD_KINDS[kind])


def make_chunk(spec: tfdata.Spec, n: int, rng: np.random.Generator, flag_p=None) -> dict:
    """``n`` random rows, one array per field, exact dtypes. ``flag_p``: probability of True per
    bool field (default 0.05 for every one)."""
    out = {}
    for f in spec:
        shape = (n,) + f.shape
        if f.dtype.kind == "f":
            out[f.name] = rng.standard_normal(shape, dtype=np.float32).astype(f.dtype, copy=False)
        elif f.dtype.kind == "b":
            out[f.name] = rng.random(shape) < (flag_p or {}).get(f.name, 0.05)
        elif f.dtype == np.uint8:
            out[f.name] = rng.integers(0, 256, shape, dtype=np.uint8)
        else:
            out[f.name] = rng.integers(0, 4, shape).astype(f.dtype)
    return out


def env_row(chunk: dict, i: int = 0) -> dict:
    """One row as a gymnasium loop hands it over: arrays for obs, Python scalars for the rest."""
    row = {}
    for name, col in chunk.items():
        v = col[i]
        row[name] = v if col.ndim > 1 else v.item()
    return row


def build(impl: str, spec: tfdata.Spec, capacity: int, seed: int):
    if impl == "numpy":
        return NumpyBuffer(spec, capacity, seed)
    return tfdata.ReplayBuffer(spec, capacity, layout=impl, seed=seed, ring_size=RING_SIZE)


def build_sampler(sampler: str, layout: str, spec: tfdata.Spec, capacity: int, seed: int):
    """A tfdata buffer for ``sampler`` ("uniform", "prioritized", "nstep") in ``layout``."""
    if sampler == "prioritized":
        return tfdata.PrioritizedReplayBuffer(spec, capacity, layout=layout, seed=seed,
                                              ring_size=RING_SIZE)
    if sampler == "nstep":
        return tfdata.ReplayBuffer(spec, capacity, layout=layout, seed=seed, ring_size=RING_SIZE,
                                   n_step=N_STEP, gamma=GAMMA)
    return tfdata.ReplayBuffer(spec, capacity, layout=layout, seed=seed, ring_size=RING_SIZE)


def sampler_call(sampler: str, buf, pools: dict):
    """The per-step call a training loop makes with ``sampler``: ``fn(batch_size)``.

    Prioritized: ``sample`` then ``update_priorities(batch, |N(0,1)|)``; the priorities are drawn
    beforehand (``pools[batch_size]``, cycled) so numpy's RNG is not in the timed call.
    """
    if sampler != "prioritized":
        return buf.sample
    pos = {b: 0 for b in pools}

    def call(b):
        batch = buf.sample(b)
        i = pos[b] = (pos[b] + 1) % PRIORITY_POOL
        buf.update_priorities(batch, pools[b][i])

    return call


def fill(buf, chunk: dict, capacity: int) -> None:
    n = len(next(iter(chunk.values())))
    for _ in range(capacity // n):
        buf.extend(chunk)
    rest = capacity % n
    if rest:
        buf.extend({k: v[:rest] for k, v in chunk.items()})


def verdict(ratios: list[float], a: str, b: str) -> str:
    """``ratios`` are time(a) / time(b) per seed."""
    return _verdict(ratios, a, b, VERDICT_MARGIN)


# ---------------------------------------------------------------------------------------------
# Memory: one fresh forked process per (kind, capacity, impl)
# ---------------------------------------------------------------------------------------------
def _memory_probe(kind: str, capacity: int, impl: str, sampler: str | None = None,
                  batches=BATCH_SIZES) -> dict:
    fresh = fresh_pages_allocator()
    spec = make_spec(kind)
    flag_p = STREAM_FLAGS if sampler else None
    chunk = make_chunk(spec, min(EXTEND_ROWS, capacity), np.random.default_rng(0), flag_p)
    gc.collect()
    r0 = rss_bytes()
    buf = build_sampler(sampler, impl, spec, capacity, 0) if sampler else build(impl, spec, capacity, 0)
    r1 = rss_bytes()
    fill(buf, chunk, capacity)
    r2 = rss_bytes()
    for b in batches:  # tfdata allocates its output ring here; numpy's outputs are temporary
        buf.sample(b)
        buf.sample(b)
    r3 = rss_bytes()
    # tfdata: rows + bookkeeping (+ priority trees), not the output rings
    parts = getattr(buf, "nbytes_parts", None)
    storage = sum(v for k, v in parts.items() if k != "output_rings") if parts else buf.nbytes
    return {"storage_bytes": int(storage), "nbytes_parts": dict(parts) if parts else None,
            "rss_build_bytes": r1 - r0, "rss_fill_bytes": r2 - r0,
            "rss_after_samples_bytes": r3 - r0,
            "probe_peak_rss_bytes": peak_rss_bytes(),
            "fresh_mmap_allocations": fresh}


def measure_memory(kind: str, capacity: int, impl: str, sampler: str | None = None,
                   batches=BATCH_SIZES) -> dict:
    return run_forked(_memory_probe, kind, capacity, impl, sampler, batches)


# ---------------------------------------------------------------------------------------------
# Timing: one (row kind, capacity, seed), all impls interleaved
# ---------------------------------------------------------------------------------------------
def run_config(kind: str, capacity: int, seed: int, mode: str, order_key: int) -> dict:
    spec = make_spec(kind)
    rng = np.random.default_rng([seed, list(ROW_KINDS).index(kind), capacity])
    chunk = make_chunk(spec, min(EXTEND_ROWS, capacity), rng)
    row = env_row(chunk, 0)
    order = rotated(IMPLS, order_key)
    out = {"kind": kind, "capacity": capacity, "seed": seed, "impl_order": order,
           "fill": {}, "push": {}, "extend": {}, "sample": {}}

    bufs = {}
    for impl in order:
        gc.collect()
        t0 = time.perf_counter()
        bufs[impl] = buf = build(impl, spec, capacity, seed)
        fill(buf, chunk, capacity)
        dt = time.perf_counter() - t0
        out["fill"][impl] = {"seconds": dt, "rows_per_s": capacity / dt}
        assert (len(buf) if impl != "numpy" else buf.size) == capacity

    with gc_paused():
        for op, arg, rows in (("push", row, 1), ("extend", chunk, EXTEND_ROWS)):
            for impl in order:
                fn = getattr(bufs[impl], op)
                n = calls_for_budget(fn, arg, WRITE_BUDGET_S[mode], MIN_WRITE_CALLS[mode], 100_000,
                                     WARMUP_CALLS)
                s = latency_stats(time_calls(fn, arg, n))
                s["rows_per_s"] = rows * 1e6 / s["median_us"]
                s["rows_per_s_mean"] = rows * 1e6 / s["mean_us"]
                out[op][impl] = s
        out["sample"] = sample_latencies({i: bufs[i].sample for i in order}, BATCH_SIZES, mode,
                                         SAMPLE_BUDGET_S[mode])
    del bufs
    gc.collect()
    return out


def warm_kernels() -> float:
    """Load (or compile) every kernel used, so no measurement pays for it."""
    t0 = time.perf_counter()
    for kind in ROW_KINDS:
        spec = make_spec(kind)
        chunk = make_chunk(spec, 64, np.random.default_rng(0))
        for layout in LAYOUTS:
            buf = tfdata.ReplayBuffer(spec, 64, layout=layout, seed=0)
            buf.extend(chunk)
            buf.push(env_row(chunk))
            buf.sample(32)
    pools = {32: np.abs(np.random.default_rng(0).standard_normal((PRIORITY_POOL, 32)))}
    for kind in dict.fromkeys(k for m in SAMPLER_CAPACITIES.values() for k in m):
        spec = make_spec(kind)
        chunk = make_chunk(spec, 64, np.random.default_rng(0), STREAM_FLAGS)
        for sampler in SAMPLERS:
            for layout in LAYOUTS:
                buf = build_sampler(sampler, layout, spec, 64, 0)
                buf.extend(chunk)
                sampler_call(sampler, buf, pools)(32)
    for kind in FIELD_KINDS:
        spec = make_spec(kind)
        chunk = make_chunk(spec, 64, np.random.default_rng(0))
        for layout in LAYOUTS:
            buf = tfdata.ReplayBuffer(spec, 64, layout=layout, seed=0)
            buf.extend(chunk)
            buf.sample(32)
    return time.perf_counter() - t0


def sample_latencies(calls: dict, batches, mode: str, budget_s: float) -> dict:
    """``{batch: {key: stats}}`` of ``calls[key](batch)``, the keys alternating in rounds."""
    return interleaved_latencies(calls, batches, budget_s=budget_s, lo=MIN_CALLS[mode],
                                 hi=MAX_CALLS[mode], rounds=ROUNDS[mode], warmup=WARMUP_CALLS)


def run_sampler_config(kind: str, capacity: int, seed: int, mode: str, order_key: int) -> dict:
    """Every (sampler, layout) on the same episode stream, interleaved in time."""
    spec = make_spec(kind)
    rng = np.random.default_rng([seed, 100 + list(ROW_KINDS).index(kind), capacity])
    chunk = make_chunk(spec, min(EXTEND_ROWS, capacity), rng, STREAM_FLAGS)
    pools = {b: np.abs(rng.standard_normal((PRIORITY_POOL, b))) for b in SAMPLER_BATCHES[mode]}
    keys = rotated([f"{s}/{l}" for s in SAMPLERS for l in LAYOUTS], order_key)
    out = {"kind": kind, "capacity": capacity, "seed": seed, "order": keys, "fill": {}, "sample": {}}
    bufs, calls = {}, {}
    for key in keys:
        sampler, layout = key.split("/")
        gc.collect()
        t0 = time.perf_counter()
        bufs[key] = buf = build_sampler(sampler, layout, spec, capacity, seed)
        fill(buf, chunk, capacity)
        dt = time.perf_counter() - t0
        out["fill"][key] = {"seconds": dt, "rows_per_s": capacity / dt}
        assert len(buf) == capacity
        calls[key] = sampler_call(sampler, buf, pools)
    with gc_paused():
        out["sample"] = sample_latencies(calls, SAMPLER_BATCHES[mode], mode, EXTRA_BUDGET_S[mode])
    del bufs, calls
    gc.collect()
    return out


def run_field_config(n_fields: int, capacity: int, seed: int, mode: str, order_key: int) -> dict:
    """AoS, SoA and numpy on the 64-byte row split into ``n_fields`` fields (uniform sampling)."""
    kind = f"f{n_fields}"
    spec = make_spec(kind)
    rng = np.random.default_rng([seed, 200 + n_fields, capacity])
    chunk = make_chunk(spec, min(EXTEND_ROWS, capacity), rng)
    order = rotated(IMPLS, order_key)
    out = {"n_fields": n_fields, "capacity": capacity, "seed": seed, "impl_order": order, "sample": {}}
    bufs = {}
    for impl in order:
        gc.collect()
        bufs[impl] = buf = build(impl, spec, capacity, seed)
        fill(buf, chunk, capacity)
    with gc_paused():
        out["sample"] = sample_latencies({i: bufs[i].sample for i in order}, FIELD_BATCHES[mode], mode,
                                         EXTRA_BUDGET_S[mode])
    del bufs
    gc.collect()
    return out


# ---------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------
def aggregate(raw: list[dict], memory: dict, kinds_caps: list[tuple[str, int]]) -> dict:
    configs = []
    for kind, cap in kinds_caps:
        runs = [r for r in raw if r["kind"] == kind and r["capacity"] == cap]
        spec = make_spec(kind)
        aos_bytes = spec.aos_dtype.itemsize * cap
        c = {"kind": kind, "capacity": cap, "row_nbytes": spec.row_nbytes,
             "aos_itemsize": spec.aos_dtype.itemsize, "aos_storage_bytes": aos_bytes,
             "cache_placement": cache_placement(aos_bytes), "memory": memory.get((kind, cap), {}),
             "fill": {}, "push": {}, "extend": {}, "sample": {}}
        for impl in IMPLS:
            c["fill"][impl] = dict(zip(("rows_per_s_mean", "rows_per_s_std"),
                                       mean_std([r["fill"][impl]["rows_per_s"] for r in runs])))
            for op in ("push", "extend"):
                c[op][impl] = dict(zip(("rows_per_s_mean", "rows_per_s_std"),
                                       mean_std([r[op][impl]["rows_per_s"] for r in runs])))
                c[op][impl]["median_us_mean"] = mean_std([r[op][impl]["median_us"] for r in runs])[0]
        for op in ("push", "extend"):
            # throughput ratio SoA/AoS (>1: SoA faster); verdict on time ratios
            rs = [r[op]["aos"]["median_us"] / r[op]["soa"]["median_us"] for r in runs]
            c[op]["soa_vs_aos"] = {**ratio_summary(rs, "soa", "aos", VERDICT_MARGIN),
                                   "faster": verdict([1 / x for x in rs], "soa", "aos")}
        for b in BATCH_SIZES:
            s = {}
            for impl in IMPLS:
                per_seed = [r["sample"][b][impl] for r in runs]
                s[impl] = seed_summary(per_seed, ns_per_row=mean_std(
                    [p["median_us"] for p in per_seed])[0] * 1e3 / b)
            s["ratios"] = {f"{n}/{d}": ratio(runs, b, n, d, n, d)
                           for n, d in (("soa", "aos"), ("numpy", "aos"), ("numpy", "soa"))}
            best = [min(r["sample"][b]["aos"]["median_us"], r["sample"][b]["soa"]["median_us"])
                    for r in runs]
            s["ratios"]["numpy/best_tfdata"] = ratio_summary(
                [r["sample"][b]["numpy"]["median_us"] / bt for r, bt in zip(runs, best)], "numpy",
                "tfdata", VERDICT_MARGIN)
            c["sample"][b] = s
        configs.append(c)
    return {"configs": configs}


def ratio(runs: list[dict], b: int, num: str, den: str, a_name: str, b_name: str) -> dict:
    """time(num)/time(den) per seed, on medians; verdict names ``a_name`` (num) / ``b_name``."""
    rs = [r["sample"][b][num]["median_us"] / r["sample"][b][den]["median_us"] for r in runs]
    return ratio_summary(rs, a_name, b_name, VERDICT_MARGIN)


def aggregate_samplers(raw: list[dict], memory: dict, kinds_caps, batches) -> list[dict]:
    configs = []
    for kind, cap in kinds_caps:
        runs = [r for r in raw if r["kind"] == kind and r["capacity"] == cap]
        spec = make_spec(kind)
        c = {"kind": kind, "capacity": cap, "row_nbytes": spec.row_nbytes,
             "aos_storage_bytes": spec.aos_dtype.itemsize * cap,
             "cache_placement": cache_placement(spec.aos_dtype.itemsize * cap),
             "memory": memory.get((kind, cap), {}), "fill": {}, "sample": {}}
        keys = [f"{s}/{l}" for s in SAMPLERS for l in LAYOUTS]
        for key in keys:
            c["fill"][key] = dict(zip(("rows_per_s_mean", "rows_per_s_std"),
                                      mean_std([r["fill"][key]["rows_per_s"] for r in runs])))
        for b in batches:
            sb = {key: seed_summary([r["sample"][b][key] for r in runs]) for key in keys}
            sb["ratios"] = {s: ratio(runs, b, f"{s}/soa", f"{s}/aos", "soa", "aos") for s in SAMPLERS}
            c["sample"][b] = sb
        configs.append(c)
    return configs


def aggregate_fields(raw: list[dict], caps, batches) -> list[dict]:
    configs = []
    for cap in caps:
        for n in FIELD_COUNTS:
            runs = [r for r in raw if r["n_fields"] == n and r["capacity"] == cap]
            spec = make_spec(f"f{n}")
            c = {"n_fields": n, "field_floats": FIELD_ROW_FLOATS // n, "capacity": cap,
                 "row_nbytes": spec.row_nbytes, "aos_itemsize": spec.aos_dtype.itemsize,
                 "cache_placement": cache_placement(spec.aos_dtype.itemsize * cap), "sample": {}}
            for b in batches:
                sb = {i: seed_summary([r["sample"][b][i] for r in runs]) for i in IMPLS}
                sb["ratios"] = {"soa/aos": ratio(runs, b, "soa", "aos", "soa", "aos"),
                                "numpy/aos": ratio(runs, b, "numpy", "aos", "numpy", "aos"),
                                "numpy/soa": ratio(runs, b, "numpy", "soa", "numpy", "soa")}
                c["sample"][b] = sb
            configs.append(c)
    return configs


# ---------------------------------------------------------------------------------------------
# Crossovers: where the SoA/AoS ratio crosses 1 along one dimension
# ---------------------------------------------------------------------------------------------
def crossover_series(agg: dict) -> list[dict]:
    """One series per (dimension, fixed other parameters): the ratio curve and its crossings."""
    series = []

    def add(dim, label, xlab, pts, group):
        pts = sorted(pts, key=lambda p: p[0])
        xs = [p[0] for p in pts]
        ys = [p[1]["mean"] for p in pts]
        series.append({"dimension": dim, "series": label, "x_label": xlab, "group": group,
                       "xs": xs, "ys": ys, "std": [p[1]["std"] for p in pts],
                       "verdicts": [p[1]["faster"] for p in pts],
                       "crossings": crossings(xs, ys, [p[1]["faster"] for p in pts], "soa_faster_below")})

    main = agg["configs"]
    kinds = list(dict.fromkeys(c["kind"] for c in main))
    smallest = [min((c for c in main if c["kind"] == k), key=lambda c: c["capacity"]) for k in kinds]
    for b in BATCH_SIZES:
        add("row size", f"uniform, batch {b}, smallest capacity of each row kind", "data bytes per row",
            [(c["row_nbytes"], c["sample"][b]["ratios"]["soa/aos"]) for c in smallest], b)
    for cap in dict.fromkeys(c["capacity"] for c in agg["fields"]):
        for b in FIELD_BATCHES[agg["mode"]]:
            add("field count", f"uniform, 64 B row, capacity {fmt_count(cap)}, batch {b}", "fields",
                [(c["n_fields"], c["sample"][b]["ratios"]["soa/aos"]) for c in agg["fields"]
                 if c["capacity"] == cap], (cap, b))
    for kind in kinds:
        cs = [c for c in main if c["kind"] == kind]
        if len(cs) > 1:
            for b in BATCH_SIZES:
                add("capacity", f"uniform, {kind}, batch {b}", "capacity (rows)",
                    [(c["capacity"], c["sample"][b]["ratios"]["soa/aos"]) for c in cs], (kind, b))
    for c in main:
        add("batch size", f"uniform, {c['kind']}, capacity {fmt_count(c['capacity'])}", "batch size",
            [(b, c["sample"][b]["ratios"]["soa/aos"]) for b in BATCH_SIZES], (c["kind"], c["capacity"]))
    sc = agg["samplers"]
    skinds = list(dict.fromkeys(c["kind"] for c in sc))
    for sampler in SAMPLERS:
        for kind in skinds:
            cs = [c for c in sc if c["kind"] == kind]
            for b in SAMPLER_BATCHES[agg["mode"]]:
                add("capacity, per sampler", f"{sampler}, {kind}, batch {b}", "capacity (rows)",
                    [(c["capacity"], c["sample"][b]["ratios"][sampler]) for c in cs], (sampler, kind, b))
        n_caps = min(sum(c["kind"] == k for c in sc) for k in skinds)
        for j in range(n_caps):
            cs = [[c for c in sc if c["kind"] == k][j] for k in skinds]
            where = "cache-resident" if j == 0 else "beyond cache"
            for b in SAMPLER_BATCHES[agg["mode"]]:
                add("row size, per sampler",
                    f"{sampler}, {where} (" + ", ".join(f"{c['kind']} {fmt_count(c['capacity'])}" for c in cs)
                    + f"), batch {b}", "data bytes per row",
                    [(c["row_nbytes"], c["sample"][b]["ratios"][sampler]) for c in cs], (sampler, j, b))
    return series


def fmt_x(x: float, xlab: str) -> str:
    if xlab.startswith("capacity"):
        return f"{x:,.0f}" if x < 1e4 else f"{x / 1e3:,.0f}k" if x < 1e6 else f"{x / 1e6:.2g}M"
    if xlab.startswith("data bytes"):
        return f"{x:,.0f} B"
    return f"{x:.3g}"


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def plot(agg: dict, mode: str, n_seeds: int) -> list[str]:
    plt = pyplot()
    files = []
    kinds = list(dict.fromkeys(c["kind"] for c in agg["configs"]))
    for kind in kinds:
        cs = [c for c in agg["configs"] if c["kind"] == kind]
        fig, axes = plt.subplots(1, len(cs), figsize=(max(7.5, 4.6 * len(cs) + 0.6), 4.8),
                                 squeeze=False, sharey=True)
        for ax, c in zip(axes[0], cs):
            for impl in IMPLS:
                med = [c["sample"][b][impl]["median_us_mean"] for b in BATCH_SIZES]
                sd = [c["sample"][b][impl]["median_us_std"] for b in BATCH_SIZES]
                p99 = [c["sample"][b][impl]["p99_us_mean"] for b in BATCH_SIZES]
                ax.errorbar(BATCH_SIZES, med, yerr=sd, color=COLORS[impl], marker="o", capsize=3,
                            label=f"{LABELS[impl]} median")
                ax.plot(BATCH_SIZES, p99, color=COLORS[impl], ls=":", marker=".", alpha=0.7,
                        label=f"{LABELS[impl]} p99")
            log_axes(ax, BATCH_SIZES, "batch size")
            ax.set_title(f"capacity {c['capacity']:,} ({fmt_bytes(c['aos_storage_bytes'])}, "
                         f"{c['cache_placement']})", fontsize=9)
        axes[0][0].set_ylabel("sample() latency per call, µs (log)")
        handles, labels = axes[0][0].get_legend_handles_labels()
        order = [labels.index(f"{LABELS[i]} {w}") for i in IMPLS for w in ("median", "p99")]
        fig.legend([handles[i] for i in order], [labels[i] for i in order], loc="lower center",
                   ncol=len(IMPLS), fontsize=8, frameon=False)
        c0 = cs[0]
        fig.suptitle(f"{kind} row ({c0['row_nbytes']} B of data, {c0['aos_itemsize']} B AoS record): "
                     f"sample() latency per call\n{mode} run, {n_seeds} seeds; solid = median "
                     f"(error bar: std across seeds), dotted = p99", fontsize=9.5)
        fig.tight_layout(rect=(0, 0.11, 1, 1))
        files.append(save_figure(fig, OUT_DIR, f"latency_{kind}.png"))

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    markers = dict(zip(kinds, "osD^v"))
    kcolors = dict(zip(kinds, ("tab:green", "tab:red", "tab:purple", "tab:brown", "tab:cyan")))
    styles = ["-", "--", ":"]
    for ax, key, title in ((axes[0], "soa/aos", "SoA / AoS median latency (>1: AoS faster)"),
                           (axes[1], "numpy/best_tfdata",
                            "numpy / faster tfdata layout (>1: tfdata faster)")):
        for kind in kinds:
            cs = [c for c in agg["configs"] if c["kind"] == kind]
            for i, c in enumerate(cs):
                m = [c["sample"][b]["ratios"][key]["mean"] for b in BATCH_SIZES]
                sd = [c["sample"][b]["ratios"][key]["std"] for b in BATCH_SIZES]
                ax.errorbar(BATCH_SIZES, m, yerr=sd, marker=markers[kind], ls=styles[i % 3],
                            color=kcolors[kind], capsize=2,
                            label=f"{kind}, capacity {fmt_count(c['capacity'])}")
        ax.axhline(1.0, color="k", lw=0.8)
        log_axes(ax, BATCH_SIZES, "batch size", ysubs=(1, 1.5, 2, 3, 5, 7))
        ax.set_title(title, fontsize=10)
    # one legend column per row kind, padded with blanks so capacities line up
    from matplotlib.lines import Line2D

    handles, labels = axes[0].get_legend_handles_labels()
    rows = max(sum(c["kind"] == k for c in agg["configs"]) for k in kinds)
    h2, l2 = [], []
    for kind in kinds:
        mine = [(h, lab) for h, lab in zip(handles, labels) if lab.startswith(f"{kind},")]
        mine += [(Line2D([], [], alpha=0), "")] * (rows - len(mine))
        h2 += [h for h, _ in mine]
        l2 += [lab for _, lab in mine]
    fig.legend(h2, l2, loc="lower center", ncol=len(kinds), fontsize=8, frameon=False)
    fig.suptitle(f"sample() median-latency ratios, {mode} run, {n_seeds} seeds "
                 "(mean ± std of per-seed ratios; line style = capacity)", fontsize=10)
    fig.tight_layout(rect=(0, 0.04 + 0.035 * rows, 1, 1))
    files.append(save_figure(fig, OUT_DIR, "ratios.png"))
    return files


def plot_extra(agg: dict, mode: str, n_seeds: int) -> list[str]:
    """samplers.png, fields.png and crossovers.png."""
    plt = pyplot()
    files = []

    # -- samplers: median latency per sampler and layout, one panel per (kind, capacity) ------
    sc = agg["samplers"]
    sb = SAMPLER_BATCHES[mode]
    fig, axes = plt.subplots(len(sb), len(sc), figsize=(3.6 * len(sc) + 0.8, 3.4 * len(sb) + 0.6),
                             squeeze=False)
    width = 0.38
    for row, b in enumerate(sb):
        for ax, c in zip(axes[row], sc):
            xs = np.arange(len(SAMPLERS))
            for j, layout in enumerate(LAYOUTS):
                med = [c["sample"][b][f"{s}/{layout}"]["median_us_mean"] for s in SAMPLERS]
                sd = [c["sample"][b][f"{s}/{layout}"]["median_us_std"] for s in SAMPLERS]
                ax.bar(xs + (j - 0.5) * width, med, width, yerr=sd, capsize=2, color=COLORS[layout],
                       label=LABELS[layout])
            for x, smp in zip(xs, SAMPLERS):
                r = c["sample"][b]["ratios"][smp]
                top = max(c["sample"][b][f"{smp}/{l}"]["median_us_mean"] for l in LAYOUTS)
                ax.text(x, top * 1.02, f"{r['mean']:.2f}x", ha="center", va="bottom", fontsize=8)
            ax.set_xticks(xs, ["uniform", "prioritized", "n-step"], fontsize=8)
            ax.set_title(f"{c['kind']}, capacity {c['capacity']:,}, batch {b}\n"
                         f"({fmt_bytes(c['aos_storage_bytes'])}, {c['cache_placement']})", fontsize=8.5)
            ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
            ax.grid(True, axis="y", alpha=0.3)
        axes[row][0].set_ylabel("median µs per call")
    h, l = axes[0][0].get_legend_handles_labels()
    fig.legend(h, l, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(f"AoS vs SoA per sampler ({mode} run, {n_seeds} seeds; bar = mean of per-seed medians, "
                 "error bar = std; label = SoA/AoS)", fontsize=9.5)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    files.append(save_figure(fig, OUT_DIR, "samplers.png"))

    # -- fields: latency vs number of fields -------------------------------------------------
    fc = agg["fields"]
    caps = list(dict.fromkeys(c["capacity"] for c in fc))
    fb = FIELD_BATCHES[mode]
    fig, axes = plt.subplots(len(caps), len(fb), figsize=(5.2 * len(fb) + 0.6, 4.0 * len(caps) + 0.8),
                             squeeze=False)
    for ax, (cap, b) in zip(axes.flat, [(cap, b) for cap in caps for b in fb]):
        cs = [c for c in fc if c["capacity"] == cap]
        for impl in IMPLS:
            med = [c["sample"][b][impl]["median_us_mean"] for c in cs]
            sd = [c["sample"][b][impl]["median_us_std"] for c in cs]
            p99 = [c["sample"][b][impl]["p99_us_mean"] for c in cs]
            ax.errorbar(FIELD_COUNTS, med, yerr=sd, color=COLORS[impl], marker="o", capsize=3,
                        label=f"{LABELS[impl]} median")
            ax.plot(FIELD_COUNTS, p99, color=COLORS[impl], ls=":", marker=".", alpha=0.7,
                    label=f"{LABELS[impl]} p99")
        log_axes(ax, FIELD_COUNTS, "fields in the 64-byte row", ysubs=(1, 2, 5))
        ax.set_ylabel("sample() µs per call (log)")
        ax.set_title(f"capacity {cap:,} ({fmt_bytes(64 * cap)}, {cs[0]['cache_placement']}), batch {b}",
                     fontsize=9)
    h, l = axes[0][0].get_legend_handles_labels()
    fig.legend(h, l, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(f"16 float32 (64 B) per row, split into 1..16 fields: uniform sample() latency "
                 f"({mode} run, {n_seeds} seeds)", fontsize=9.5)
    fig.tight_layout(rect=(0, 0.05 + 0.05 / len(caps), 1, 1))
    files.append(save_figure(fig, OUT_DIR, "fields.png"))

    # -- crossovers: ratio curves, crossings marked ------------------------------------------
    series = agg["crossovers"]
    panels = [("row size", "uniform: SoA/AoS by row size\n(smallest capacity of each row kind)", None),
              ("field count", "uniform: SoA/AoS by number of fields\n(64-byte row)", None),
              ("capacity", "uniform: SoA/AoS by capacity", 256),
              ("capacity, per sampler", "per sampler: SoA/AoS by capacity", 256)]
    fig, axes = plt.subplots(2, 2, figsize=(12, 9.5))
    cmap = plt.get_cmap("tab10")
    for ax, (dim, title, only_b) in zip(axes.flat, panels):
        ss = [x for x in series if x["dimension"] == dim]
        if only_b is not None:
            ss = [x for x in ss if x["group"][-1] == only_b] or ss
        for i, x in enumerate(ss):
            col = cmap(i % 10)
            ax.errorbar(x["xs"], x["ys"], yerr=x["std"], marker="o", ms=4, capsize=2, color=col,
                        label=(x["series"].replace("uniform, ", "")
                               .replace(", smallest capacity of each row kind", "")
                               if dim in ("row size", "field count", "capacity") else x["series"]))
            for cr in x["crossings"]:
                ax.plot([cr["x"]], [1.0], marker="X", ms=11, color=col, mec="k",
                        alpha=1.0 if cr["significant"] else 0.5)
                ax.annotate(fmt_x(cr["x"], x["x_label"]), (cr["x"], 1.0), xytext=(4, -14),
                            textcoords="offset points", fontsize=7, color=col)
        ax.axhline(1.0, color="k", lw=0.9)
        fc = dim == "field count"
        log_axes(ax, FIELD_COUNTS if fc else None, ss[0]["x_label"] if ss else "",
                 ysubs=(1, 1.5, 2, 3, 5, 7), base=2 if fc else 10)
        ax.set_ylabel("SoA / AoS median latency (>1: AoS faster)")
        ax.set_title(title + (f", batch {only_b}" if only_b else ""), fontsize=9.5)
        ax.legend(fontsize=6.5, loc="best", frameon=False, ncol=1 if len(ss) <= 6 else 2)
    fig.suptitle(f"Where does SoA/AoS cross 1? ({mode} run, {n_seeds} seeds; mean ± std of per-seed "
                 "ratios; X = interpolated crossing, faded when one side is a tie)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    files.append(save_figure(fig, OUT_DIR, "crossovers.png"))
    return files


def sample_table(agg: dict, kind: str) -> list[str]:
    lines = ["| capacity | batch | AoS median µs | SoA median µs | numpy median µs | "
             "p99 µs AoS / SoA / numpy | SoA/AoS | numpy/AoS | numpy/SoA | faster layout |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for c in agg["configs"]:
        if c["kind"] != kind:
            continue
        for b in BATCH_SIZES:
            s = c["sample"][b]
            cell = [f"{fmt_us(s[i]['median_us_mean'])} ± {fmt_us(s[i]['median_us_std'])}" for i in IMPLS]
            p99 = " / ".join(fmt_us(s[i]["p99_us_mean"]) for i in IMPLS)
            r = s["ratios"]
            v = r["soa/aos"]["faster"]
            v = {"aos": "**AoS**", "soa": "**SoA**", "tie": "tie"}[v]
            lines.append(f"| {c['capacity']:,} | {b} | {cell[0]} | {cell[1]} | {cell[2]} | {p99} | "
                         f"{r['soa/aos']['mean']:.2f} ± {r['soa/aos']['std']:.2f} | "
                         f"{r['numpy/aos']['mean']:.2f} | {r['numpy/soa']['mean']:.2f} | {v} |")
    return lines


def conclusions(agg: dict) -> list[str]:
    cells = [(c, b) for c in agg["configs"] for b in BATCH_SIZES]
    n = len(cells)
    by = {"aos": [], "soa": [], "tie": []}
    for c, b in cells:
        by[c["sample"][b]["ratios"]["soa/aos"]["faster"]].append((c, b))

    def where(items):
        return ", ".join(f"{c['kind']} {fmt_count(c['capacity'])} batch {b} "
                         f"(SoA/AoS {c['sample'][b]['ratios']['soa/aos']['mean']:.2f})" for c, b in items)

    out = []
    ratios = [c["sample"][b]["ratios"]["soa/aos"]["mean"] for c, b in cells]
    out.append(f"**Sampling, AoS vs SoA.** Of {n} configurations (row kind x capacity x batch size), "
               f"AoS samples faster in {len(by['aos'])}, SoA in {len(by['soa'])}, and {len(by['tie'])} "
               f"{'is a tie' if len(by['tie']) == 1 else 'are ties'} (within {VERDICT_MARGIN:.0%} or seeds "
               f"disagree). SoA/AoS median-latency ratio: "
               f"geometric mean {gmean(ratios):.2f}, range {min(ratios):.2f} to {max(ratios):.2f}.")
    if by["soa"]:
        out.append(f"**SoA wins** in: {where(by['soa'])}.")
    else:
        out.append("**SoA wins nowhere** in this grid.")
    if by["tie"]:
        def why(c, b):
            r = c["sample"][b]["ratios"]["soa/aos"]
            if all(x < 1 for x in r["per_seed"]) or all(x > 1 for x in r["per_seed"]):
                return f"within {VERDICT_MARGIN:.0%}"
            return "seeds disagree: " + ", ".join(f"{x:.2f}" for x in r["per_seed"])

        out.append("Ties: " + ", ".join(
            f"{c['kind']} {fmt_count(c['capacity'])} batch {b} (SoA/AoS "
            f"{c['sample'][b]['ratios']['soa/aos']['mean']:.2f}; {why(c, b)})" for c, b in by["tie"]) + ".")

    kinds = list(dict.fromkeys(c["kind"] for c in agg["configs"]))
    per_kind = []
    for kind in kinds:
        rs = [c["sample"][b]["ratios"]["soa/aos"]["mean"] for c, b in cells if c["kind"] == kind]
        row = agg["configs"][[c["kind"] for c in agg["configs"]].index(kind)]
        per_kind.append(f"{kind} ({row['row_nbytes']} B, {len(make_spec(kind))} fields): "
                        f"{gmean(rs):.2f} ({min(rs):.2f}-{max(rs):.2f})")
    out.append("**By row size** (SoA/AoS, geometric mean and range over capacities and batch sizes): "
               + "; ".join(per_kind) + ".")
    by_b = [f"batch {b}: {gmean([c['sample'][b]['ratios']['soa/aos']['mean'] for c in agg['configs']]):.2f}"
            for b in BATCH_SIZES]
    out.append("**By batch size** (SoA/AoS, geometric mean over row kinds and capacities): "
               + "; ".join(by_b) + ".")
    caps = []
    for kind in kinds:
        cs = [c for c in agg["configs"] if c["kind"] == kind]
        if len(cs) > 1:
            caps.append(f"{kind} " + " -> ".join(
                f"{fmt_count(c['capacity'])}: {gmean([c['sample'][b]['ratios']['soa/aos']['mean'] for b in BATCH_SIZES]):.2f}"
                for c in cs))
    if caps:
        out.append("**By capacity** (SoA/AoS, geometric mean over batch sizes): " + "; ".join(caps) + ".")

    crossovers = []
    for c in agg["configs"]:
        vs = [c["sample"][b]["ratios"]["soa/aos"]["faster"] for b in BATCH_SIZES]
        if "aos" in vs and "soa" in vs:
            crossovers.append(f"{c['kind']} {fmt_count(c['capacity'])} ("
                              + ", ".join(f"{b}: {v}" for b, v in zip(BATCH_SIZES, vs)) + ")")
    kind_winners = {}
    for c, b in cells:
        kind_winners.setdefault(c["kind"], set()).add(c["sample"][b]["ratios"]["soa/aos"]["faster"])
    if not by["soa"] and len(by["aos"]) >= len(by["tie"]):
        out.append("**Why (an interpretation consistent with these numbers, not measured directly).** "
                   "AoS gathers a sampled row with one copy from one place; SoA makes one copy per field, "
                   "each from a different array (2 for the tiny row, 6 for the others), so a sampled row "
                   "costs several independent random memory accesses instead of one or two, plus a "
                   "separate loop per field. That overhead is largest relative to the bytes moved when "
                   "rows are small and many-fielded and the buffer is beyond cache, and it disappears "
                   "when each field is a long contiguous run (the image row's 28 KB frame stacks).")
    if crossovers:
        out.append("**Crossover** (the faster layout changes with batch size): " + "; ".join(crossovers) + ".")
    elif not by["soa"]:
        out.append("**No crossover**: no row size, batch size or capacity in this grid makes SoA "
                   "the faster layout" + (" (some are ties)." if by["tie"] else "."))
    else:
        flips = [k for k, w in kind_winners.items() if "soa" in w]
        out.append("**No crossover within a (row kind, capacity) across batch sizes**; SoA wins only "
                   f"for: {', '.join(flips)}.")

    np_rs = [(c, b, c["sample"][b]["ratios"]["numpy/best_tfdata"]) for c, b in cells]
    np_wins = [(c, b) for c, b, r in np_rs if r["faster"] == "numpy"]
    np_ties = [(c, b) for c, b, r in np_rs if r["faster"] == "tie"]
    vals = [r["mean"] for _, _, r in np_rs]
    out.append(f"**numpy baseline.** numpy / faster-tfdata-layout latency: geometric mean {gmean(vals):.2f}, "
               f"range {min(vals):.2f} to {max(vals):.2f}; tfdata is faster in "
               f"{n - len(np_wins) - len(np_ties)} of {n} configurations.")
    if np_wins:
        out.append("**numpy wins** in: " + ", ".join(
            f"{c['kind']} {fmt_count(c['capacity'])} batch {b} "
            f"({c['sample'][b]['ratios']['numpy/best_tfdata']['mean']:.2f})" for c, b in np_wins) + ".")
    else:
        out.append("**numpy wins nowhere** in this grid" + (
            "; ties: " + ", ".join(f"{c['kind']} {fmt_count(c['capacity'])} batch {b}" for c, b in np_ties)
            if np_ties else "") + ".")

    np_soa = [(c, b) for c, b in cells if c["sample"][b]["ratios"]["numpy/soa"]["faster"] == "numpy"]
    if np_soa:
        out.append("numpy is faster than tfdata **SoA** (not AoS) in: " + ", ".join(
            f"{c['kind']} {fmt_count(c['capacity'])} batch {b} "
            f"(numpy/SoA {c['sample'][b]['ratios']['numpy/soa']['mean']:.2f})" for c, b in np_soa) + ".")

    mem = []
    for kind in kinds:
        c = next(c for c in agg["configs"] if c["kind"] == kind)
        pad = c["aos_itemsize"] / c["row_nbytes"] - 1
        mem.append(f"{kind} {c['aos_itemsize']} vs {c['row_nbytes']} B/row (+{pad:.1%})")
    out.append("**Memory.** Storage is allocated once; AoS pays record padding to a multiple of 8 bytes, "
               "SoA and numpy store the data bytes only: " + "; ".join(mem) + ". RSS grows by about the "
               "storage bytes when a buffer is filled, not when it is built (pages are zero-mapped "
               "until written); tfdata adds its output ring per batch size used "
               f"({RING_SIZE} x batch x row bytes), numpy allocates a fresh batch per call instead.")
    push_r = [c["push"]["numpy"]["rows_per_s_mean"] / max(c["push"][l]["rows_per_s_mean"] for l in LAYOUTS)
              for c in agg["configs"]]
    ext_r = [c["extend"]["numpy"]["rows_per_s_mean"] / max(c["extend"][l]["rows_per_s_mean"] for l in LAYOUTS)
             for c in agg["configs"]]
    def write_wins(op):
        wins = {"aos": [], "soa": [], "tie": []}
        for c in agg["configs"]:
            wins[c[op]["soa_vs_aos"]["faster"]].append(f"{c['kind']} {fmt_count(c['capacity'])}")
        return wins

    push_sa = [c["push"]["soa_vs_aos"]["mean"] for c in agg["configs"]]
    ext_sa = [c["extend"]["soa_vs_aos"]["mean"] for c in agg["configs"]]
    pw, ew = write_wins("push"), write_wins("extend")

    def wins_text(w):
        return "; ".join(f"{'SoA' if k == 'soa' else 'AoS' if k == 'aos' else 'tie'}: {', '.join(v)}"
                         for k, v in w.items() if v)

    head = "**Writes: SoA wins extend.**" if ew["soa"] else "**Writes.**"
    out.append(f"{head} extend(1000) rows/s, SoA/AoS {min(ext_sa):.2f}-{max(ext_sa):.2f}x "
               f"({wins_text(ew)}); in SoA a block of rows lands as one contiguous copy per field, in AoS "
               f"as one strided copy per field into the records. push rows/s, SoA/AoS "
               f"{min(push_sa):.2f}-{max(push_sa):.2f}x ({wins_text(pw)}); a single row's cost is mostly "
               f"per-call Python work (validation, lock), the same for both layouts. The "
               f"unvalidated numpy baseline pushes {min(push_r):.1f}-{max(push_r):.1f}x and extends "
               f"{min(ext_r):.2f}-{max(ext_r):.2f}x the rows/s of the faster tfdata layout.")
    return out


def short_answer(agg: dict) -> str:
    """The answer in three sentences, from the data."""
    cells = [(c, b) for c in agg["configs"] for b in BATCH_SIZES]
    rat = {(c["kind"], c["capacity"], b): c["sample"][b]["ratios"]["soa/aos"] for c, b in cells}
    n = len(cells)
    wins = {k: [key for key, r in rat.items() if r["faster"] == k] for k in ("aos", "soa", "tie")}
    hi = max(rat, key=lambda k: rat[k]["mean"])
    lo = min(rat, key=lambda k: rat[k]["mean"])
    name = lambda k: f"{k[0]} row, capacity {k[1]:,}, batch {k[2]}"  # noqa: E731
    g = gmean([r["mean"] for r in rat.values()])
    if not wins["soa"]:
        head = (f"**AoS samples faster.** It wins {len(wins['aos'])} of {n} configurations and loses none"
                + (f" ({len(wins['tie'])} tied)" if wins["tie"] else "") + ".")
    elif len(wins["soa"]) > len(wins["aos"]):
        head = f"**SoA samples faster in most configurations** ({len(wins['soa'])} of {n}; AoS {len(wins['aos'])})."
    else:
        head = (f"**AoS samples faster in most configurations** ({len(wins['aos'])} of {n}); SoA wins "
                f"{len(wins['soa'])}: " + "; ".join(name(k) for k in wins["soa"]) + ".")
    kinds = list(dict.fromkeys(c["kind"] for c in agg["configs"]))
    per_kind = {k: gmean([r["mean"] for key, r in rat.items() if key[0] == k]) for k in kinds}
    kw, kn = max(per_kind, key=per_kind.get), min(per_kind, key=per_kind.get)
    desc = lambda k: (f"{k} row ({make_spec(k).row_nbytes} B in {len(make_spec(k))} fields, "  # noqa: E731
                      f"{per_kind[k]:.2f}x)")
    body = (f" A SoA sample takes {g:.2f}x as long as an AoS one on geometric mean, from {rat[lo]['mean']:.2f}x "
            f"({name(lo)}) to {rat[hi]['mean']:.2f}x ({name(hi)}). By row kind the gap is widest for the "
            f"{desc(kw)} and smallest for the {desc(kn)}.")
    pads = [(c["aos_itemsize"] / c["row_nbytes"] - 1, c["kind"]) for c in agg["configs"]]
    pad, pk = max(pads)
    ext = [c["extend"]["soa_vs_aos"]["faster"] for c in agg["configs"]]
    ext_txt = (f"; SoA extends faster in {ext.count('soa')} of {len(ext)} (row kind, capacity) pairs"
               if ext.count("soa") else "")
    mem = (f" In memory SoA is never larger and saves the AoS record padding, which matters only for "
           f"rows whose fields do not fill 8-byte words ({pk}: AoS is {pad:.0%} larger){ext_txt}. "
           "The hand-written numpy baseline is slower than the faster tfdata layout in "
           f"{sum(c['sample'][b]['ratios']['numpy/best_tfdata']['faster'] == 'tfdata' for c, b in cells)} "
           f"of {n} configurations.")
    return head + body + mem


VNAME = {"aos": "**AoS**", "soa": "**SoA**", "tie": "tie", "numpy": "**numpy**"}


def sampler_findings(agg: dict) -> list[str]:
    sc, mode = agg["samplers"], agg["mode"]
    out = []
    for smp in SAMPLERS:
        cells = [(c, b, c["sample"][b]["ratios"][smp]) for c in sc for b in SAMPLER_BATCHES[mode]]
        rs = [r["mean"] for _, _, r in cells]
        w = {k: sum(r["faster"] == k for _, _, r in cells) for k in ("aos", "soa", "tie")}
        lo = min(cells, key=lambda t: t[2]["mean"])
        hi = max(cells, key=lambda t: t[2]["mean"])
        out.append(f"{SAMPLER_LABELS[smp]}: SoA/AoS geometric mean {gmean(rs):.2f}, from {lo[2]['mean']:.2f} "
                   f"({lo[0]['kind']} {fmt_count(lo[0]['capacity'])} batch {lo[1]}) to {hi[2]['mean']:.2f} "
                   f"({hi[0]['kind']} {fmt_count(hi[0]['capacity'])} batch {hi[1]}); AoS faster in "
                   f"{w['aos']}, SoA in {w['soa']}, tie in {w['tie']} of {len(cells)}")
    return out


def field_findings(agg: dict) -> list[str]:
    fc, mode = agg["fields"], agg["mode"]
    out = []
    for cap in dict.fromkeys(c["capacity"] for c in fc):
        cs = {c["n_fields"]: c for c in fc if c["capacity"] == cap}
        n0, n1 = FIELD_COUNTS[0], FIELD_COUNTS[-1]
        for b in FIELD_BATCHES[mode]:
            a0, a1 = (cs[n]["sample"][b]["aos"]["median_us_mean"] for n in (n0, n1))
            s0, s1 = (cs[n]["sample"][b]["soa"]["median_us_mean"] for n in (n0, n1))
            u0, u1 = (cs[n]["sample"][b]["numpy"]["median_us_mean"] for n in (n0, n1))
            rr = " -> ".join(f"{cs[n]['sample'][b]['ratios']['soa/aos']['mean']:.2f}" for n in FIELD_COUNTS)
            out.append(f"capacity {fmt_count(cap)}, batch {b}: from {n0} to {n1} fields AoS goes "
                       f"{fmt_us(a0)} -> {fmt_us(a1)} µs ({a1 / a0:.2f}x), SoA {fmt_us(s0)} -> {fmt_us(s1)} µs "
                       f"({s1 / s0:.2f}x, +{(s1 - s0) / (n1 - n0):.2f} µs per extra field, "
                       f"{(s1 - s0) / (n1 - n0) * 1e3 / b:.1f} ns per field per sampled row), numpy "
                       f"{fmt_us(u0)} -> {fmt_us(u1)} µs ({u1 / u0:.2f}x); SoA/AoS by field count "
                       f"{', '.join(map(str, FIELD_COUNTS))}: {rr}")
    return out


def crossing_text(x: dict) -> str:
    if not x["crossings"]:
        vs = set(x["verdicts"])
        if vs == {"aos"}:
            who = "AoS faster at every point"
        elif vs == {"soa"}:
            who = "SoA faster at every point"
        elif vs == {"tie"}:
            who = "ties at every point"
        else:
            side = "above" if min(x["ys"]) > 1 else "below" if max(x["ys"]) < 1 else "on both sides of"
            who = f"ratio stays {side} 1; " + ", ".join(f"{fmt_x(a, x['x_label'])}: {v}"
                                                        for a, v in zip(x["xs"], x["verdicts"]))
        return f"no crossover in the measured range ({who})"
    parts = []
    for cr in x["crossings"]:
        lo, hi = cr["between"]
        below = "SoA" if cr["soa_faster_below"] else "AoS"
        above = "AoS" if cr["soa_faster_below"] else "SoA"
        parts.append(f"**≈ {fmt_x(cr['x'], x['x_label'])}** (between {fmt_x(lo, x['x_label'])} and "
                     f"{fmt_x(hi, x['x_label'])}: {below} faster below, {above} above; verdicts "
                     f"{cr['verdicts'][0]} / {cr['verdicts'][1]}"
                     + ("" if cr["significant"] else "; one side is a tie, so within noise") + ")")
    return "; ".join(parts)


def crossover_findings(agg: dict) -> tuple[list[str], dict]:
    """Per dimension: how many series cross, and the significant crossings."""
    by = {}
    for x in agg["crossovers"]:
        by.setdefault(x["dimension"], []).append(x)
    lines = []
    for dim, ss in by.items():
        sig = [(x, cr) for x in ss for cr in x["crossings"] if cr["significant"]]
        weak = [(x, cr) for x in ss for cr in x["crossings"] if not cr["significant"]]
        txt = f"{dim}: {len(ss)} ratio curves, "
        if not sig and not weak:
            txt += "no crossover in the measured range"
        else:
            txt += ((f"{len(sig)} clear crossing(s) (a winner on each side): "
                     + "; ".join(f"{x['series']} at ≈ {fmt_x(cr['x'], x['x_label'])}" for x, cr in sig))
                    if sig else "no clear crossing")
            txt += ((f"; {len(weak)} crossing(s) within noise (one side a tie): "
                       + "; ".join(f"{x['series']} at ≈ {fmt_x(cr['x'], x['x_label'])}" for x, cr in weak)
                       if weak else ""))
        lines.append(txt)
    return lines, by


def extra_sections(agg: dict, run: dict) -> list[str]:
    mode = run["mode"]
    L = []
    # -- samplers ----------------------------------------------------------------------------
    L.append("## Samplers: uniform, prioritized, n-step\n")
    L.append(f"The same row kinds on an **episode stream** (`terminated` true with probability "
             f"{TERMINATED_P}, `truncated` with probability {TRUNCATED_P}, fresh random data per seed), "
             "each buffer filled to capacity, all six (sampler, layout) buffers of a configuration "
             "built together and timed interleaved in rounds, exactly as above:\n")
    L.append("* **uniform**: `ReplayBuffer(spec, cap, layout=...).sample(batch)`;")
    L.append("* **prioritized**: `PrioritizedReplayBuffer(spec, cap, layout=..., seed=...)` (alpha 0.6, "
             "beta 0.4); one timed call is `batch = buf.sample(b); buf.update_priorities(batch, p)` "
             f"with `p = |N(0, 1)|` of length b, drawn before timing ({PRIORITY_POOL} vectors per seed, "
             "cycled) so numpy's RNG is not in the timed call;")
    L.append(f"* **n-step**: `ReplayBuffer(spec, cap, layout=..., n_step={N_STEP}, gamma={GAMMA})`, "
             "`sample(batch)` (returns the discounted n-step reward and the window's last "
             "`next_obs`/flags).")
    L.append(f"\nPer (configuration, sampler, layout, batch, seed): {WARMUP_CALLS} warm-up calls, then "
             f"calls for {EXTRA_BUDGET_S[mode]} s (at least {MIN_CALLS[mode]}) in {ROUNDS[mode]} "
             "rounds. The numpy baseline is not part of this grid (it has no prioritized or n-step "
             "counterpart here).\n")
    L.append("![samplers.png](samplers.png)\n")
    L.append("- " + "\n- ".join(sampler_findings(agg)) + "\n")
    offs = ", ".join(f"{k} `next_obs` at byte {make_spec(k).aos_dtype.fields['next_obs'][1]} of a "
                     f"{make_spec(k).aos_dtype.itemsize}-byte record"
                     for k in dict.fromkeys(c["kind"] for c in agg["samplers"]))
    L.append("A fact about the layouts that bears on n-step (the link to speed is an interpretation, "
             "not measured): after the gather, n-step re-reads the next fields (`next_obs`) at each "
             "window's last row, copying them in the widest word that divides their offset and width. "
             f"In AoS the offset is the field's position in the record ({offs}), in SoA it is 0, so "
             "the AoS re-read of a 4-byte-aligned `next_obs` moves 4-byte words and the SoA one 8-byte "
             "words.\n")
    L.append("| row kind | capacity | batch | sampler | AoS median µs | SoA median µs | p99 µs AoS / SoA | "
             "SoA/AoS | faster layout |")
    L.append("|---|---:|---:|---|---:|---:|---:|---:|---|")
    for c in agg["samplers"]:
        for b in SAMPLER_BATCHES[mode]:
            sb = c["sample"][b]
            for smp in SAMPLERS:
                a, o = sb[f"{smp}/aos"], sb[f"{smp}/soa"]
                r = sb["ratios"][smp]
                L.append(f"| {c['kind']} | {c['capacity']:,} ({c['cache_placement']}) | {b} | {smp} | "
                         f"{fmt_us(a['median_us_mean'])} ± {fmt_us(a['median_us_std'])} | "
                         f"{fmt_us(o['median_us_mean'])} ± {fmt_us(o['median_us_std'])} | "
                         f"{fmt_us(a['p99_us_mean'])} / {fmt_us(o['p99_us_mean'])} | "
                         f"{r['mean']:.2f} ± {r['std']:.2f} | {VNAME[r['faster']]} |")
    L.append("")
    L.append("Memory of the sampler buffers (fresh forked process per buffer, as above; storage = "
             "everything `nbytes_parts` counts except the output rings: rows and bookkeeping, and for "
             "prioritized also the priority trees (a `(2P, 4)` float64 array, P = capacity rounded up "
             "to a power of two) and the slot versions; RSS after sampling includes the output rings of "
             f"batch sizes {', '.join(map(str, SAMPLER_BATCHES[mode]))}):\n")
    L.append("| row kind | capacity | sampler | layout | storage | RSS after build | RSS after fill | "
             "RSS after sampling | first fill rows/s |")
    L.append("|---|---:|---|---|---:|---:|---:|---:|---:|")
    for c in agg["samplers"]:
        for smp in SAMPLERS:
            for layout in LAYOUTS:
                key = f"{smp}/{layout}"
                m = c["memory"].get(key, {})
                fl = fmt_rate(c["fill"][key]["rows_per_s_mean"])
                if not m or "error" in m:
                    L.append(f"| {c['kind']} | {c['capacity']:,} | {smp} | {layout} | ? | ? | ? | "
                             f"{m.get('error', '?')} | {fl} |")
                    continue
                L.append(f"| {c['kind']} | {c['capacity']:,} | {smp} | {layout} | "
                         f"{fmt_bytes(m['storage_bytes'])} | {fmt_bytes(m['rss_build_bytes'])} | "
                         f"{fmt_bytes(m['rss_fill_bytes'])} | {fmt_bytes(m['rss_after_samples_bytes'])} | {fl} |")
    L.append("")

    # -- fields ------------------------------------------------------------------------------
    L.append("## Number of fields (same 64 bytes per row)\n")
    L.append(f"A row of {FIELD_ROW_FLOATS} float32 (64 bytes, no padding in either layout) split into "
             + ", ".join(f"{n} field{'s' if n > 1 else ''} of float32[{FIELD_ROW_FLOATS // n}]"
                         if n < FIELD_ROW_FLOATS else f"{n} float32 scalars" for n in FIELD_COUNTS)
             + ". Uniform `sample(batch)` only (no sampler needs flags here), with the numpy baseline, "
             f"interleaved AoS / SoA / numpy in rounds; {EXTRA_BUDGET_S[mode]} s of calls per "
             "(configuration, implementation, batch, seed). Storage is identical for all field counts "
             "(64 B per row in both layouts), so no memory table.\n")
    L.append("![fields.png](fields.png)\n")
    L.append("- " + "\n- ".join(field_findings(agg)) + "\n")
    L.append("| capacity | batch | fields | AoS median µs | SoA median µs | numpy median µs | "
             "p99 µs AoS / SoA / numpy | SoA/AoS | numpy/AoS | faster layout |")
    L.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for c in agg["fields"]:
        for b in FIELD_BATCHES[mode]:
            sb = c["sample"][b]
            cell = [f"{fmt_us(sb[i]['median_us_mean'])} ± {fmt_us(sb[i]['median_us_std'])}" for i in IMPLS]
            r = sb["ratios"]
            L.append(f"| {c['capacity']:,} ({c['cache_placement']}) | {b} | {c['n_fields']} | "
                     f"{' | '.join(cell)} | {' / '.join(fmt_us(sb[i]['p99_us_mean']) for i in IMPLS)} | "
                     f"{r['soa/aos']['mean']:.2f} ± {r['soa/aos']['std']:.2f} | {r['numpy/aos']['mean']:.2f} | "
                     f"{VNAME[r['soa/aos']['faster']]} |")
    L.append("")

    # -- crossovers --------------------------------------------------------------------------
    L.append("## Crossovers\n")
    L.append("Where the SoA/AoS median-latency ratio crosses 1 along each dimension, with everything "
             "else fixed. A crossing is interpolated linearly in log(x) and log(ratio) between the two "
             "measured points whose mean ratios lie on opposite sides of 1; it is a **clear** crossing "
             f"when both neighbours have a verdict (every seed on one side, beyond ±{VERDICT_MARGIN:.0%}) "
             "and the verdicts differ, and \"within noise\" when one neighbour is a tie. Nothing is "
             "extrapolated: a curve that stays on one side of 1 has no crossover in the measured range. "
             "The row-size curves of the main grid also change the number of fields (tiny 2, the "
             "others 6); the field-count grid holds the row size fixed.\n")
    L.append("![crossovers.png](crossovers.png)\n")
    lines, by = crossover_findings(agg)
    L.append("Summary:\n")
    L.append("- " + "\n- ".join(lines) + "\n")
    for dim, ss in by.items():
        L.append(f"### By {dim}\n")
        L.append(f"| series | SoA/AoS at measured {ss[0]['x_label']} | crossover |")
        L.append("|---|---|---|")
        for x in ss:
            pts = ", ".join(f"{fmt_x(a, x['x_label'])}: {y:.2f}" for a, y in zip(x["xs"], x["ys"]))
            L.append(f"| {x['series']} | {pts} | {crossing_text(x)} |")
        L.append("")
    return L


def write_report(agg: dict, run: dict, files: list[str]) -> None:
    mode, seeds = run["mode"], run["seeds"]
    n_seeds = len(seeds)
    L = []
    L.append("# AoS or SoA: which replay-buffer layout samples faster (by row size, batch, capacity, "
             "sampler and number of fields), where does it flip, and what does each cost?\n")
    L.append(f"> Produced by the **{mode}** run `{run['run_name']}` ({n_seeds} seeds, "
             f"{run['wall_clock_s']:.0f} s wall clock, started {run['started_utc']}). Every table, figure "
             f"and conclusion below comes from that run; rerunning overwrites this directory. "
             + ("The published report is the full run (`python experiments/layout.py`)."
                if mode == "quick" else "The quick demo (`python3 dev.py demo`) writes a smaller run "
                "to the same place."))
    L.append("")
    L.append("## Answer\n")
    L.append(short_answer(agg) + "\n")
    cl, _ = crossover_findings(agg)
    L.append("**Samplers** (SoA/AoS median latency, cartpole and medium rows, cache-resident and "
             "beyond-cache capacities; details in [Samplers](#samplers-uniform-prioritized-n-step)):\n")
    L.append("- " + "\n- ".join(sampler_findings(agg)) + "\n")
    L.append("**Number of fields** (64-byte row, uniform; details in "
             "[Number of fields](#number-of-fields-same-64-bytes-per-row)):\n")
    L.append("- " + "\n- ".join(field_findings(agg)) + "\n")
    L.append("**Crossovers** (where SoA/AoS crosses 1; details in [Crossovers](#crossovers)):\n")
    L.append("- " + "\n- ".join(cl) + "\n")
    L.append("Headline figures (median µs per `sample()` call, mean ± std across seeds):\n")
    L.append("| row kind | capacity | batch | tfdata AoS | tfdata SoA | numpy | SoA/AoS |")
    L.append("|---|---:|---:|---:|---:|---:|---:|")
    for kind, b in (("cartpole", 256), ("image", 32), ("tiny", 256), ("medium", 256)):
        cs = [c for c in agg["configs"] if c["kind"] == kind]
        if not cs:
            continue
        c = cs[-1]  # the largest capacity of that row kind
        sb = c["sample"][b]
        L.append(f"| {kind} | {c['capacity']:,} | {b} | "
                 + " | ".join(f"{fmt_us(sb[i]['median_us_mean'])} ± {fmt_us(sb[i]['median_us_std'])}"
                              for i in IMPLS)
                 + f" | {sb['ratios']['soa/aos']['mean']:.2f} |")
    L.append("")
    L.append("Details (all from this run):\n")
    for line in conclusions(agg):
        L.append(f"- {line}")
    L.append("")
    L.append("## Reproduce\n")
    L.append("```sh\npython3 dev.py demo                                  # = python experiments/layout.py --quick"
             "  (< ~2 min)\n.venv/bin/python experiments/layout.py               # full run (< ~15 min), "
             "the published one\n.venv/bin/python experiments/layout.py --seeds 0,1,2  # explicit seeds\n```\n")
    L.append("Files: `README.md` (this), `results.json` (every number, per seed; `schema_version` "
             "field), " + ", ".join(f"`{f}`" for f in files) + ".\n")

    L.append("## What is compared\n")
    L.append("* **tfdata AoS**: `tfdata.ReplayBuffer(spec, capacity, layout=\"aos\")`, one structured array; "
             "a sampled row is one contiguous copy of the whole record.")
    L.append("* **tfdata SoA**: `layout=\"soa\"`, one array per field; a sampled row is one copy per field, "
             "each from a different array.")
    L.append("* **numpy baseline**: what one writes by hand: one array per field, "
             "`idx = rng.integers(0, size, batch)`, `{k: a[idx] for k, a in arrays.items()}`. It allocates "
             "fresh output arrays every call and validates nothing on push/extend.")
    L.append("")
    L.append("tfdata's `sample(batch)` is called with its defaults (`copy=False`): it returns views into a "
             f"preallocated output ring of {RING_SIZE} batches, drawing indices with its counter-based RNG "
             "inside the same numba kernel that gathers the rows.\n")
    L.append("| row kind | fields | data bytes/row | AoS record bytes | capacities (AoS storage, where it fits) |")
    L.append("|---|---|---:|---:|---|")
    for kind in dict.fromkeys(c["kind"] for c in agg["configs"]):
        cs = [c for c in agg["configs"] if c["kind"] == kind]
        spec = make_spec(kind)
        fields = ", ".join(f"{f.name} {f.dtype.str[1:]}{list(f.shape) if f.shape else ''}" for f in spec)
        caps = "; ".join(f"{c['capacity']:,} ({fmt_bytes(c['aos_storage_bytes'])}, {c['cache_placement']})"
                         for c in cs)
        L.append(f"| {kind} | {fields} | {spec.row_nbytes} | {spec.aos_dtype.itemsize} | {caps} |")
    env_cpu = run["environment"]["cpu"]
    l2, l3 = cache_size(2), cache_size(3)
    L.append(f"\nBatch sizes: {', '.join(map(str, BATCH_SIZES))}. Cache placement compares the AoS "
             f"storage with this machine's L2 ({fmt_bytes(l2) if l2 else '?'} per core) and L3 "
             f"({fmt_bytes(l3) if l3 else '?'}, shared): a \"cache-resident\" 10,000-row buffer of a "
             "large row is not cache-resident.\n")

    L.append("## Method\n")
    L.append(f"* **Seeds.** Each seed is a full repetition: fresh buffers, seed-specific random data, "
             f"sampler seed = seed, and a different order of the three implementations. Seeds: "
             f"{', '.join(map(str, seeds))}; seeds run one after another (outer loop), so the spread "
             "across seeds includes drift of the machine over the run.")
    L.append(f"* **Fill before timing.** Every buffer is filled to capacity with `extend` of "
             f"{EXTEND_ROWS}-row chunks before anything is timed; kernels are loaded (or compiled) once "
             f"before the first measurement ({run['parameters'].get('kernel_warmup_s', float('nan')):.1f} s).")
    L.append(f"* **Sample latency.** Each `sample(batch)` call is timed alone with `time.perf_counter_ns` "
             f"(Python call overhead included, as a training loop sees it). Per (configuration, implementation, "
             f"seed): {WARMUP_CALLS} untimed warm-up calls, then as many calls as fit "
             f"{SAMPLE_BUDGET_S[mode]} s (at least {MIN_CALLS[mode]}, at most {MAX_CALLS[mode]:,}), split into "
             f"{ROUNDS[mode]} rounds in which the three implementations alternate, so load changes hit all of "
             "them. The garbage collector is off while timing.")
    L.append("* **Statistics.** Per seed: median, p99 and mean of the per-call times. Tables give the mean ± "
             "std across seeds of the per-seed medians; p99 is the mean of per-seed p99s (with fewer than "
             "~100 calls a p99 is close to the maximum; the call counts are in `results.json`). Ratios are "
             "computed per seed on medians (same seed, same data, interleaved in time), then averaged.")
    L.append(f"* **Verdict.** A layout is called faster when it is faster in every seed and the mean ratio "
             f"is beyond 1 ± {VERDICT_MARGIN:.0%}; anything else is a tie.")
    L.append(f"* **Writes.** `push` of one gymnasium-style row (arrays for observations, Python scalars for "
             f"the rest) and `extend` of {EXTEND_ROWS} rows, timed per call on a full buffer (overwriting), "
             f"~{WRITE_BUDGET_S[mode]} s each; rows/s = rows per call / median call time. \"First fill\" is "
             "build + fill from empty, which also pays the first-touch page faults.")
    L.append("* **Memory.** For each (row kind, capacity, implementation), a fresh forked process records "
             "its RSS (psutil) before building, after building, after filling, and after one sample of "
             "every batch size (twice, so both slots of tfdata's output ring exist); storage bytes are `buf.nbytes` (numpy: sum of array bytes).")
    L.append("")

    L.append("## Sample latency\n")
    for f in files:
        if f.startswith("latency_"):
            L.append(f"![{f}]({f})\n")
    L.append("![ratios.png](ratios.png)\n")
    for kind in dict.fromkeys(c["kind"] for c in agg["configs"]):
        L.append(f"### {kind}\n")
        L.extend(sample_table(agg, kind))
        L.append("")

    L.extend(extra_sections(agg, run))

    L.append("## Write throughput (rows/s, mean ± std across seeds)\n")
    L.append("| row kind | capacity | push AoS | push SoA | push numpy | extend(1000) AoS | extend SoA | "
             "extend numpy | first fill AoS / SoA / numpy |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c in agg["configs"]:
        p = [f"{fmt_rate(c['push'][i]['rows_per_s_mean'])} ± {fmt_rate(c['push'][i]['rows_per_s_std'])}"
             for i in IMPLS]
        e = [f"{fmt_rate(c['extend'][i]['rows_per_s_mean'])} ± {fmt_rate(c['extend'][i]['rows_per_s_std'])}"
             for i in IMPLS]
        fl = " / ".join(fmt_rate(c["fill"][i]["rows_per_s_mean"]) for i in IMPLS)
        L.append(f"| {c['kind']} | {c['capacity']:,} | {' | '.join(p)} | {' | '.join(e)} | {fl} |")
    L.append("")

    L.append("## Memory\n")
    L.append("| row kind | capacity | impl | storage | RSS after build | RSS after fill | fill RSS / storage | "
             "RSS after sampling each batch size twice |")
    L.append("|---|---:|---|---:|---:|---:|---:|---:|")
    for c in agg["configs"]:
        for impl in IMPLS:
            m = c["memory"].get(impl, {})
            if not m or "error" in m:
                L.append(f"| {c['kind']} | {c['capacity']:,} | {impl} | ? | ? | ? | ? | {m.get('error', '?')} |")
                continue
            L.append(f"| {c['kind']} | {c['capacity']:,} | {impl} | {fmt_bytes(m['storage_bytes'])} | "
                     f"{fmt_bytes(m['rss_build_bytes'])} | {fmt_bytes(m['rss_fill_bytes'])} | "
                     f"{m['rss_fill_bytes'] / m['storage_bytes']:.2f} | {fmt_bytes(m['rss_after_samples_bytes'])} |")
    big = max(agg["configs"], key=lambda c: c["aos_itemsize"])
    ring = RING_SIZE * max(BATCH_SIZES) * big["aos_itemsize"]
    L.append("\nRSS figures are growth over the probe process's RSS just before the buffer was built "
             "(the fill data was already allocated); in the probe, glibc's mmap threshold is pinned to "
             "4 KiB so every array gets pages of its own (otherwise a small buffer reuses freed heap "
             "and shows no growth). A tfdata output ring holds "
             f"{RING_SIZE} x batch x record bytes per batch size: for the {big['kind']} row and batch "
             f"{max(BATCH_SIZES)} that alone is {fmt_bytes(ring)}, which is why the last column grows "
             "for tfdata and not for numpy (whose batches are freed after each call).\n")

    L.append("## Caveats\n")
    L.append("* One machine, a small shared virtual machine (see below): absolute times move with the host; "
             "the interleaved ratios are the robust part. The load average and CPU steal during the run "
             "are recorded below.")
    cv_abs = [s[i]["median_us_std"] / s[i]["median_us_mean"] for c in agg["configs"]
              for s in c["sample"].values() for i in IMPLS]
    cv_rat = [s["ratios"]["soa/aos"]["std"] / s["ratios"]["soa/aos"]["mean"] for c in agg["configs"]
              for s in c["sample"].values()]
    spread = (f"Across seeds, a per-seed median latency varies by {np.median(cv_abs):.0%} (coefficient of "
              f"variation, median over configurations; worst {max(cv_abs):.0%}), the SoA/AoS ratio by "
              f"{np.median(cv_rat):.0%} (worst {max(cv_rat):.0%}).")
    busy = run.get("machine_busy_fraction")
    if busy is not None and busy > 0.6:
        L.append(f"* The machine was not idle: both CPUs together were busy {busy:.0%} of the run while "
                 "this experiment kept one busy, so other processes competed for the second core, memory "
                 f"bandwidth and the shared L3. {spread}")
    else:
        L.append(f"* {spread}")
    L.append("* The numpy baseline uses numpy's PCG64 generator and allocates each batch; tfdata uses a "
             "counter-based generator inside the kernel and reuses its output ring. The comparison is of "
             "the two ways of getting a batch, not of the gather alone.")
    L.append("* `push`/`extend` of tfdata include input validation (dtype, shape, safe casts); numpy's do not.")
    L.append("* Buffers are full when sampled; multi-threaded use, `copy=True`, `sample_sequences` and "
             "the n-step/prioritized writes (extend with priorities, episode bookkeeping) are not timed. "
             "The prioritized timing includes `update_priorities`, as a training step does; its tree "
             "work does not depend on the layout, so it dilutes the layout difference.")
    L.append("* The n-step and prioritized grids use an episode stream whose rows repeat every "
             f"{EXTEND_ROWS} rows (the fill chunk is reused); the field-count grid changes the number "
             "of fields only, not the field widths' alignment (every field is a multiple of 4 bytes).")
    L.append("")
    write_methodology_report(OUT_DIR, L, run)


def print_table(agg: dict) -> None:
    print()
    print(f"{'row':<9}{'capacity':>10}{'batch':>6} | {'median µs: AoS':>14}{'SoA':>9}{'numpy':>9} | "
          f"{'SoA/AoS':>7}{'np/AoS':>7}  faster")
    print("-" * 86)
    for c in agg["configs"]:
        for b in BATCH_SIZES:
            s = c["sample"][b]
            r = s["ratios"]
            print(f"{c['kind']:<9}{c['capacity']:>10,}{b:>6} | {fmt_us(s['aos']['median_us_mean']):>14}"
                  f"{fmt_us(s['soa']['median_us_mean']):>9}{fmt_us(s['numpy']['median_us_mean']):>9} | "
                  f"{r['soa/aos']['mean']:>7.2f}{r['numpy/aos']['mean']:>7.2f}  {r['soa/aos']['faster']}")
    print()
    print(f"{'row':<9}{'capacity':>10} | {'storage AoS':>12}{'SoA':>11} | {'RSS fill AoS':>12}{'SoA':>11}"
          f"{'numpy':>11} | {'push rows/s AoS':>15}{'SoA':>8}{'numpy':>8}")
    print("-" * 106)
    for c in agg["configs"]:
        m = c["memory"]
        g = lambda impl, k: fmt_bytes(m[impl][k]) if impl in m and k in m[impl] else "?"  # noqa: E731
        print(f"{c['kind']:<9}{c['capacity']:>10,} | {g('aos', 'storage_bytes'):>12}{g('soa', 'storage_bytes'):>11} | "
              f"{g('aos', 'rss_fill_bytes'):>12}{g('soa', 'rss_fill_bytes'):>11}{g('numpy', 'rss_fill_bytes'):>11} | "
              f"{fmt_rate(c['push']['aos']['rows_per_s_mean']):>15}{fmt_rate(c['push']['soa']['rows_per_s_mean']):>8}"
              f"{fmt_rate(c['push']['numpy']['rows_per_s_mean']):>8}")
    print()
    mode = agg["mode"]
    print(f"{'row':<9}{'capacity':>10}{'batch':>6} | " + "".join(f"{s + ' SoA/AoS':>22}" for s in SAMPLERS))
    print("-" * 92)
    for c in agg["samplers"]:
        for b in SAMPLER_BATCHES[mode]:
            r = c["sample"][b]["ratios"]
            print(f"{c['kind']:<9}{c['capacity']:>10,}{b:>6} | "
                  + "".join(f"{r[s]['mean']:>16.2f} {r[s]['faster']:>5}" for s in SAMPLERS))
    print()
    print(f"{'fields':>6}{'capacity':>10}{'batch':>6} | {'median µs: AoS':>14}{'SoA':>9}{'numpy':>9} | "
          f"{'SoA/AoS':>7}  faster")
    print("-" * 74)
    for c in agg["fields"]:
        for b in FIELD_BATCHES[mode]:
            s = c["sample"][b]
            print(f"{c['n_fields']:>6}{c['capacity']:>10,}{b:>6} | {fmt_us(s['aos']['median_us_mean']):>14}"
                  f"{fmt_us(s['soa']['median_us_mean']):>9}{fmt_us(s['numpy']['median_us_mean']):>9} | "
                  f"{s['ratios']['soa/aos']['mean']:>7.2f}  {s['ratios']['soa/aos']['faster']}")
    print()
    for line in crossover_findings(agg)[0]:
        print("crossovers, " + line)
    print(flush=True)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
def main(argv=None) -> None:
    args = seeds_parser(__doc__, "small grid, short timing budgets (under ~2 minutes)",
                        "number of seeds (0..N-1) or a comma list, e.g. 0,1,2 "
                        f"(default {DEFAULT_SEEDS['full']} full, {DEFAULT_SEEDS['quick']} quick)"
                        ).parse_args(argv)
    mode = "quick" if args.quick else "full"
    seeds = parse_seeds(args.seeds, DEFAULT_SEEDS[mode])
    command = " ".join(["python experiments/layout.py", *(sys.argv[1:] if argv is None else argv)])
    kinds_caps = [(k, c) for k, caps in CAPACITIES[mode].items() for c in caps]
    params = {"impls": IMPLS, "batch_sizes": BATCH_SIZES, "row_kinds": ROW_KINDS,
              "capacities": CAPACITIES[mode], "sample_budget_s": SAMPLE_BUDGET_S[mode],
              "min_calls": MIN_CALLS[mode], "max_calls": MAX_CALLS[mode], "rounds": ROUNDS[mode],
              "warmup_calls": WARMUP_CALLS, "write_budget_s": WRITE_BUDGET_S[mode],
              "extend_rows": EXTEND_ROWS, "ring_size": RING_SIZE, "verdict_margin": VERDICT_MARGIN,
              "samplers": SAMPLERS, "sampler_capacities": SAMPLER_CAPACITIES[mode],
              "sampler_batch_sizes": SAMPLER_BATCHES[mode], "n_step": N_STEP, "gamma": GAMMA,
              "stream_flag_probability": STREAM_FLAGS, "priority_pool": PRIORITY_POOL,
              "field_counts": FIELD_COUNTS, "field_row_floats": FIELD_ROW_FLOATS,
              "field_capacities": FIELD_CAPACITIES[mode], "field_batch_sizes": FIELD_BATCHES[mode],
              "extra_sample_budget_s": EXTRA_BUDGET_S[mode]}
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=seeds, command=command, parameters=params)
    os.makedirs(OUT_DIR, exist_ok=True)
    log = lambda msg: print(f"[{rec.elapsed():6.1f}s] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    log(f"run {rec.run_name}: {len(kinds_caps)} (row kind, capacity) x {len(BATCH_SIZES)} batch sizes "
        f"x {len(IMPLS)} implementations x {len(seeds)} seeds")

    params["kernel_warmup_s"] = round(warm_kernels(), 2)
    log(f"kernels ready ({params['kernel_warmup_s']} s)")

    memory = {}
    for kind, cap in kinds_caps:
        memory[(kind, cap)] = {impl: measure_memory(kind, cap, impl) for impl in IMPLS}
    sampler_kc = [(k, c) for k, caps in SAMPLER_CAPACITIES[mode].items() for c in caps]
    smemory = {}
    for kind, cap in sampler_kc:
        smemory[(kind, cap)] = {f"{smp}/{l}": measure_memory(kind, cap, l, smp, SAMPLER_BATCHES[mode])
                                for smp in SAMPLERS for l in LAYOUTS}
    log("memory probes done")

    raw = []
    for si, seed in enumerate(seeds):
        for ci, (kind, cap) in enumerate(kinds_caps):
            raw.append(run_config(kind, cap, seed, mode, order_key=si + ci))
            s = raw[-1]["sample"][256]
            log(f"seed {seed} {kind:<8} cap {cap:>10,}: batch 256 median µs "
                + " ".join(f"{i} {s[i]['median_us']:.1f}" for i in IMPLS))

    log(f"sampler grid: {len(sampler_kc)} (row kind, capacity) x {len(SAMPLERS)} samplers x "
        f"{len(LAYOUTS)} layouts x {len(SAMPLER_BATCHES[mode])} batch sizes")
    raw_s = []
    for si, seed in enumerate(seeds):
        for ci, (kind, cap) in enumerate(sampler_kc):
            raw_s.append(run_sampler_config(kind, cap, seed, mode, order_key=si + ci))
            s = raw_s[-1]["sample"][SAMPLER_BATCHES[mode][-1]]
            log(f"seed {seed} {kind:<8} cap {cap:>10,}: batch {SAMPLER_BATCHES[mode][-1]} median µs "
                + " ".join(f"{k} {v['median_us']:.1f}" for k, v in s.items()))
    field_kc = [(n, cap) for cap in FIELD_CAPACITIES[mode] for n in FIELD_COUNTS]
    log(f"field grid: {len(field_kc)} (fields, capacity) x {len(IMPLS)} impls x "
        f"{len(FIELD_BATCHES[mode])} batch sizes")
    raw_f = []
    for si, seed in enumerate(seeds):
        for ci, (n, cap) in enumerate(field_kc):
            raw_f.append(run_field_config(n, cap, seed, mode, order_key=si + ci))
        s = raw_f[-1]["sample"][FIELD_BATCHES[mode][-1]]
        log(f"seed {seed} fields done; last (16 fields, cap {field_kc[-1][1]:,}) median µs "
            + " ".join(f"{k} {v['median_us']:.1f}" for k, v in s.items()))

    agg = aggregate(raw, memory, kinds_caps)
    agg["mode"] = mode
    agg["samplers"] = aggregate_samplers(raw_s, smemory, sampler_kc, SAMPLER_BATCHES[mode])
    agg["fields"] = aggregate_fields(raw_f, FIELD_CAPACITIES[mode], FIELD_BATCHES[mode])
    agg["crossovers"] = crossover_series(agg)
    print_table(agg)
    files = plot(agg, mode, len(seeds)) + plot_extra(agg, mode, len(seeds))
    child_peak = max((m.get("probe_peak_rss_bytes", 0) for mem in (memory, smemory)
                      for per in mem.values() for m in per.values()), default=None)
    run = rec.finish(child_peak_rss_bytes=child_peak)
    write_json(os.path.join(OUT_DIR, "results.json"),
               {"methodology": run, "configs": agg["configs"], "samplers": agg["samplers"],
                "fields": agg["fields"], "crossovers": agg["crossovers"], "raw": raw,
                "raw_samplers": raw_s, "raw_fields": raw_f})
    write_report(agg, run, files)
    rel = os.path.relpath(OUT_DIR, ROOT)
    print(f"{mode} run {rec.run_name} done in {run['wall_clock_s']:.0f} s; "
          f"report: {rel}/README.md, data: {rel}/results.json, plots: {', '.join(files)}", flush=True)


if __name__ == "__main__":
    main()
