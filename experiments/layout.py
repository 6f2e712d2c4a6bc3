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

from _envs import ROW_KINDS, build_filled, fill, make_chunk  # noqa: E402
from _plots import column_legend, grouped_bars, latency_lines, log_axes, pyplot, ratio_curves  # noqa: E402
from _plots import save_figure  # noqa: E402
from _recording import RunRecord, cache_placement, parse_seeds, peak_rss_bytes, report_dir  # noqa: E402
from _recording import read_results, seeds_parser, write_json  # noqa: E402
from _render import crossing_summary, crossing_text, fmt_axis, fmt_bytes, fmt_count, fmt_rate, fmt_us  # noqa: E402
from _render import hand_written, md_table, produced_by, run_cache_size, text_table  # noqa: E402
from _render import write_report as write_methodology_report  # noqa: E402
from _stats import crossings, gmean, mean_std, ratio_summary, seed_summary, verdict as _verdict  # noqa: E402
from _timing import calls_for_budget, fresh_pages_allocator, gc_paused, interleaved_latencies  # noqa: E402
from _timing import latency_stats, rotated, rss_bytes, run_forked, time_calls  # noqa: E402

# -- Parameters ----------------------------------------------------------------------------------
EXPERIMENT = "layout"
IMPLS = ("aos", "soa", "numpy")  # two tfdata layouts and the plain numpy baseline
LAYOUTS = ("aos", "soa")
BATCH_SIZES = (32, 256, 1024)
# the row kinds (tiny, cartpole, medium, image) are _envs.ROW_KINDS, shared with workloads.py

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
VNAME = {"aos": "**AoS**", "soa": "**SoA**", "tie": "tie", "numpy": "**numpy**"}  # verdicts in tables


# -- The plain numpy baseline --------------------------------------------------------------------
class NumpyBuffer:
    """The hand-written buffer tfdata replaces: per-field arrays, a cursor, numpy's RNG."""

    def __init__(self, spec: tfdata.Spec, capacity: int, seed: int):
        self.arrays = {f.name: np.zeros((capacity,) + f.shape, dtype=f.dtype) for f in spec}
        self.capacity = capacity
        self.cursor = 0
        self.size = 0
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.size

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


# -- Rows and buffers ----------------------------------------------------------------------------
def make_spec(kind: str) -> tfdata.Spec:
    return tfdata.Spec(ROW_KINDS[kind] if kind in ROW_KINDS else FIELD_KINDS[kind])


def env_row(chunk: dict, i: int = 0) -> dict:
    """One row as a gymnasium loop hands it over: arrays for obs, Python scalars for the rest."""
    return {name: col[i] if col.ndim > 1 else col[i].item() for name, col in chunk.items()}


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


def verdict(ratios: list[float], a: str, b: str) -> str:
    """``ratios`` are time(a) / time(b) per seed."""
    return _verdict(ratios, a, b, VERDICT_MARGIN)


# -- Memory: one fresh forked process per (kind, capacity, impl) ---------------------------------
def _memory_probe(kind: str, capacity: int, impl: str, sampler: str | None = None,
                  batches=BATCH_SIZES) -> dict:
    fresh = fresh_pages_allocator()
    spec = make_spec(kind)
    chunk = make_chunk(spec, min(EXTEND_ROWS, capacity), np.random.default_rng(0),
                       STREAM_FLAGS if sampler else None)
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
            "rss_build_bytes": r1 - r0, "rss_fill_bytes": r2 - r0, "rss_after_samples_bytes": r3 - r0,
            "probe_peak_rss_bytes": peak_rss_bytes(), "fresh_mmap_allocations": fresh}


def measure_memory(kind: str, capacity: int, impl: str, sampler: str | None = None,
                   batches=BATCH_SIZES) -> dict:
    return run_forked(_memory_probe, kind, capacity, impl, sampler, batches)


# -- Timing: one (row kind, capacity, seed), all impls interleaved -------------------------------
def warm_kernels() -> float:
    """Load (or compile) every kernel used, so no measurement pays for it."""
    t0 = time.perf_counter()
    pools = {32: np.abs(np.random.default_rng(0).standard_normal((PRIORITY_POOL, 32)))}
    cases = ([(k, "uniform", None) for k in ROW_KINDS]
             + [(k, s, STREAM_FLAGS) for k in dict.fromkeys(k for m in SAMPLER_CAPACITIES.values() for k in m)
                for s in SAMPLERS] + [(k, "uniform", None) for k in FIELD_KINDS])
    for kind, sampler, flags in cases:
        spec = make_spec(kind)
        chunk = make_chunk(spec, 64, np.random.default_rng(0), flags)
        for layout in LAYOUTS:
            buf = build_sampler(sampler, layout, spec, 64, 0)
            buf.extend(chunk)
            if kind in ROW_KINDS and flags is None:
                buf.push(env_row(chunk))
            sampler_call(sampler, buf, pools)(32)
    return time.perf_counter() - t0


def sample_latencies(calls: dict, batches, mode: str, budget_s: float) -> dict:
    """``{batch: {key: stats}}`` of ``calls[key](batch)``, the keys alternating in rounds."""
    return interleaved_latencies(calls, batches, budget_s=budget_s, lo=MIN_CALLS[mode],
                                 hi=MAX_CALLS[mode], rounds=ROUNDS[mode], warmup=WARMUP_CALLS)


def run_config(kind: str, capacity: int, seed: int, mode: str, order_key: int) -> dict:
    spec = make_spec(kind)
    rng = np.random.default_rng([seed, list(ROW_KINDS).index(kind), capacity])
    chunk = make_chunk(spec, min(EXTEND_ROWS, capacity), rng)
    order = rotated(IMPLS, order_key)
    out = {"kind": kind, "capacity": capacity, "seed": seed, "impl_order": order,
           "fill": {}, "push": {}, "extend": {}, "sample": {}}
    bufs = build_filled(order, lambda impl: build(impl, spec, capacity, seed), chunk, capacity, out["fill"])
    with gc_paused():
        for op, arg, rows in (("push", env_row(chunk, 0), 1), ("extend", chunk, EXTEND_ROWS)):
            for impl in order:
                fn = getattr(bufs[impl], op)
                n = calls_for_budget(fn, arg, WRITE_BUDGET_S[mode], MIN_WRITE_CALLS[mode], 100_000,
                                     WARMUP_CALLS)
                s = out[op][impl] = latency_stats(time_calls(fn, arg, n))
                s["rows_per_s"] = rows * 1e6 / s["median_us"]
                s["rows_per_s_mean"] = rows * 1e6 / s["mean_us"]
        out["sample"] = sample_latencies({i: bufs[i].sample for i in order}, BATCH_SIZES, mode,
                                         SAMPLE_BUDGET_S[mode])
    del bufs
    gc.collect()
    return out


def run_sampler_config(kind: str, capacity: int, seed: int, mode: str, order_key: int) -> dict:
    """Every (sampler, layout) on the same episode stream, interleaved in time."""
    spec = make_spec(kind)
    rng = np.random.default_rng([seed, 100 + list(ROW_KINDS).index(kind), capacity])
    chunk = make_chunk(spec, min(EXTEND_ROWS, capacity), rng, STREAM_FLAGS)
    pools = {b: np.abs(rng.standard_normal((PRIORITY_POOL, b))) for b in SAMPLER_BATCHES[mode]}
    keys = rotated([f"{s}/{l}" for s in SAMPLERS for l in LAYOUTS], order_key)
    out = {"kind": kind, "capacity": capacity, "seed": seed, "order": keys, "fill": {}, "sample": {}}
    bufs = build_filled(keys, lambda key: build_sampler(*key.split("/"), spec, capacity, seed), chunk,
                        capacity, out["fill"])
    calls = {key: sampler_call(key.split("/")[0], bufs[key], pools) for key in keys}
    with gc_paused():
        out["sample"] = sample_latencies(calls, SAMPLER_BATCHES[mode], mode, EXTRA_BUDGET_S[mode])
    del bufs, calls
    gc.collect()
    return out


def run_field_config(n_fields: int, capacity: int, seed: int, mode: str, order_key: int) -> dict:
    """AoS, SoA and numpy on the 64-byte row split into ``n_fields`` fields (uniform sampling)."""
    spec = make_spec(f"f{n_fields}")
    rng = np.random.default_rng([seed, 200 + n_fields, capacity])
    chunk = make_chunk(spec, min(EXTEND_ROWS, capacity), rng)
    order = rotated(IMPLS, order_key)
    out = {"n_fields": n_fields, "capacity": capacity, "seed": seed, "impl_order": order, "sample": {}}
    bufs = build_filled(order, lambda impl: build(impl, spec, capacity, seed), chunk, capacity)
    with gc_paused():
        out["sample"] = sample_latencies({i: bufs[i].sample for i in order}, FIELD_BATCHES[mode], mode,
                                         EXTRA_BUDGET_S[mode])
    del bufs
    gc.collect()
    return out


# -- Aggregation ---------------------------------------------------------------------------------
def rates(values) -> dict:
    """Mean and std across seeds of per-seed rows/s."""
    return dict(zip(("rows_per_s_mean", "rows_per_s_std"), mean_std(values)))


def ratio(runs: list[dict], b: int, num: str, den: str, a_name: str, b_name: str) -> dict:
    """time(num)/time(den) per seed, on medians; verdict names ``a_name`` (num) / ``b_name``."""
    rs = [r["sample"][b][num]["median_us"] / r["sample"][b][den]["median_us"] for r in runs]
    return ratio_summary(rs, a_name, b_name, VERDICT_MARGIN)


def config_info(kind: str, cap: int) -> dict:
    """Row size, AoS record and storage bytes of (row kind, capacity), and where that fits."""
    spec = make_spec(kind)
    aos_bytes = spec.aos_dtype.itemsize * cap
    return {"row_nbytes": spec.row_nbytes, "aos_itemsize": spec.aos_dtype.itemsize,
            "aos_storage_bytes": aos_bytes, "cache_placement": cache_placement(aos_bytes)}


def aggregate(raw: list[dict], memory: dict, kinds_caps: list[tuple[str, int]]) -> dict:
    configs = []
    for kind, cap in kinds_caps:
        runs = [r for r in raw if r["kind"] == kind and r["capacity"] == cap]
        c = {"kind": kind, "capacity": cap, **config_info(kind, cap), "memory": memory.get((kind, cap), {}),
             "fill": {}, "push": {}, "extend": {}, "sample": {}}
        for impl in IMPLS:
            c["fill"][impl] = rates([r["fill"][impl]["rows_per_s"] for r in runs])
            for op in ("push", "extend"):
                c[op][impl] = rates([r[op][impl]["rows_per_s"] for r in runs])
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


def aggregate_samplers(raw: list[dict], memory: dict, kinds_caps, batches) -> list[dict]:
    configs = []
    keys = [f"{s}/{l}" for s in SAMPLERS for l in LAYOUTS]
    for kind, cap in kinds_caps:
        runs = [r for r in raw if r["kind"] == kind and r["capacity"] == cap]
        info = config_info(kind, cap)
        del info["aos_itemsize"]
        c = {"kind": kind, "capacity": cap, **info, "memory": memory.get((kind, cap), {}),
             "fill": {key: rates([r["fill"][key]["rows_per_s"] for r in runs]) for key in keys}, "sample": {}}
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
            info = config_info(f"f{n}", cap)
            c = {"n_fields": n, "field_floats": FIELD_ROW_FLOATS // n, "capacity": cap,
                 "row_nbytes": info["row_nbytes"], "aos_itemsize": info["aos_itemsize"],
                 "cache_placement": info["cache_placement"], "sample": {}}
            for b in batches:
                sb = {i: seed_summary([r["sample"][b][i] for r in runs]) for i in IMPLS}
                sb["ratios"] = {f"{x}/{y}": ratio(runs, b, x, y, x, y)
                                for x, y in (("soa", "aos"), ("numpy", "aos"), ("numpy", "soa"))}
                c["sample"][b] = sb
            configs.append(c)
    return configs


# -- Crossovers: where the SoA/AoS ratio crosses 1 along one dimension --------------------------
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



# -- Figures -------------------------------------------------------------------------------------
def plot(agg: dict, mode: str, n_seeds: int) -> list[str]:
    """latency_<kind>.png (latency against batch size, a panel per capacity) and ratios.png."""
    plt = pyplot()
    files = []
    kinds = list(dict.fromkeys(c["kind"] for c in agg["configs"]))
    for kind in kinds:
        cs = [c for c in agg["configs"] if c["kind"] == kind]
        fig, axes = plt.subplots(1, len(cs), figsize=(max(7.5, 4.6 * len(cs) + 0.6), 4.8),
                                 squeeze=False, sharey=True)
        for ax, c in zip(axes[0], cs):
            latency_lines(ax, BATCH_SIZES, {i: [c["sample"][b][i] for b in BATCH_SIZES] for i in IMPLS},
                          COLORS, LABELS)
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
    for ax, key, title in ((axes[0], "soa/aos", "SoA / AoS median latency (>1: AoS faster)"),
                           (axes[1], "numpy/best_tfdata", "numpy / faster tfdata layout (>1: tfdata faster)")):
        for kind in kinds:
            for i, c in enumerate(c for c in agg["configs"] if c["kind"] == kind):  # line style = capacity
                r = [c["sample"][b]["ratios"][key] for b in BATCH_SIZES]
                ax.errorbar(BATCH_SIZES, [x["mean"] for x in r], yerr=[x["std"] for x in r],
                            marker=markers[kind], ls=("-", "--", ":")[i % 3], color=kcolors[kind], capsize=2,
                            label=f"{kind}, capacity {fmt_count(c['capacity'])}")
        ax.axhline(1.0, color="k", lw=0.8)
        log_axes(ax, BATCH_SIZES, "batch size", ysubs=(1, 1.5, 2, 3, 5, 7))
        ax.set_title(title, fontsize=10)
    rows = column_legend(fig, axes[0], [f"{k}," for k in kinds], loc="lower center", fontsize=8, frameon=False)
    fig.suptitle(f"sample() median-latency ratios, {mode} run, {n_seeds} seeds "
                 "(mean ± std of per-seed ratios; line style = capacity)", fontsize=10)
    fig.tight_layout(rect=(0, 0.04 + 0.035 * rows, 1, 1))
    files.append(save_figure(fig, OUT_DIR, "ratios.png"))
    return files


def plot_extra(agg: dict, mode: str, n_seeds: int) -> list[str]:
    """samplers.png (bars per sampler and layout), fields.png (latency against the number of
    fields) and crossovers.png (the ratio curves and their crossings)."""
    plt = pyplot()
    sc, sbs = agg["samplers"], SAMPLER_BATCHES[mode]
    fig, axes = plt.subplots(len(sbs), len(sc), figsize=(3.6 * len(sc) + 0.8, 3.4 * len(sbs) + 0.6),
                             squeeze=False)
    for row, b in enumerate(sbs):
        for ax, c in zip(axes[row], sc):
            s = c["sample"][b]
            grouped_bars(ax, ["uniform", "prioritized", "n-step"],
                         {lay: ([s[f"{m}/{lay}"]["median_us_mean"] for m in SAMPLERS],
                                [s[f"{m}/{lay}"]["median_us_std"] for m in SAMPLERS]) for lay in LAYOUTS},
                         COLORS, LABELS, width=0.38, notes=[f"{s['ratios'][m]['mean']:.2f}x" for m in SAMPLERS])
            ax.set_title(f"{c['kind']}, capacity {c['capacity']:,}, batch {b}\n"
                         f"({fmt_bytes(c['aos_storage_bytes'])}, {c['cache_placement']})", fontsize=8.5)
        axes[row][0].set_ylabel("median µs per call")
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(f"AoS vs SoA per sampler ({mode} run, {n_seeds} seeds; bar = mean of per-seed medians, "
                 "error bar = std; label = SoA/AoS)", fontsize=9.5)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    files = [save_figure(fig, OUT_DIR, "samplers.png")]

    fc, fb = agg["fields"], FIELD_BATCHES[mode]
    caps = list(dict.fromkeys(c["capacity"] for c in fc))
    fig, axes = plt.subplots(len(caps), len(fb), figsize=(5.2 * len(fb) + 0.6, 4.0 * len(caps) + 0.8),
                             squeeze=False)
    for ax, (cap, b) in zip(axes.flat, [(cap, b) for cap in caps for b in fb]):
        cs = [c for c in fc if c["capacity"] == cap]
        latency_lines(ax, FIELD_COUNTS, {i: [c["sample"][b][i] for c in cs] for i in IMPLS}, COLORS, LABELS)
        log_axes(ax, FIELD_COUNTS, "fields in the 64-byte row", ysubs=(1, 2, 5))
        ax.set_ylabel("sample() µs per call (log)")
        ax.set_title(f"capacity {cap:,} ({fmt_bytes(64 * cap)}, {cs[0]['cache_placement']}), batch {b}",
                     fontsize=9)
    fig.legend(*axes[0][0].get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(f"16 float32 (64 B) per row, split into 1..16 fields: uniform sample() latency "
                 f"({mode} run, {n_seeds} seeds)", fontsize=9.5)
    fig.tight_layout(rect=(0, 0.05 + 0.05 / len(caps), 1, 1))
    files.append(save_figure(fig, OUT_DIR, "fields.png"))

    panels = [("row size", "uniform: SoA/AoS by row size\n(smallest capacity of each row kind)", None),
              ("field count", "uniform: SoA/AoS by number of fields\n(64-byte row)", None),
              ("capacity", "uniform: SoA/AoS by capacity", 256),
              ("capacity, per sampler", "per sampler: SoA/AoS by capacity", 256)]
    fig, axes = plt.subplots(2, 2, figsize=(12, 9.5))
    for ax, (dim, title, only_b) in zip(axes.flat, panels):
        ss = [x for x in agg["crossovers"] if x["dimension"] == dim]
        if only_b is not None:
            ss = [x for x in ss if x["group"][-1] == only_b] or ss
        short = dim in ("row size", "field count", "capacity")  # uniform only: drop the repeated words
        ratio_curves(ax, ss, [x["series"].replace("uniform, ", "").replace(", smallest capacity of each row kind", "")
                              if short else x["series"] for x in ss])
        fcount = dim == "field count"
        log_axes(ax, FIELD_COUNTS if fcount else None, ss[0]["x_label"] if ss else "",
                 ysubs=(1, 1.5, 2, 3, 5, 7), base=2 if fcount else 10)
        ax.set_ylabel("SoA / AoS median latency (>1: AoS faster)")
        ax.set_title(title + (f", batch {only_b}" if only_b else ""), fontsize=9.5)
        ax.legend(fontsize=6.5, loc="best", frameon=False, ncol=1 if len(ss) <= 6 else 2)
    fig.suptitle(f"Where does SoA/AoS cross 1? ({mode} run, {n_seeds} seeds; mean ± std of per-seed "
                 "ratios; X = interpolated crossing, faded when one side is a tie)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    files.append(save_figure(fig, OUT_DIR, "crossovers.png"))
    return files


# -- Findings in words ---------------------------------------------------------------------------
def where(items, key: str = "soa/aos", label: str = "SoA/AoS ") -> str:
    """'tiny 1e4 batch 32 (SoA/AoS 1.23), ...' for (config, batch) pairs."""
    return ", ".join(f"{c['kind']} {fmt_count(c['capacity'])} batch {b} "
                     f"({label}{c['sample'][b]['ratios'][key]['mean']:.2f})" for c, b in items)


def sampler_findings(agg: dict) -> list[str]:
    """Per sampler: the SoA/AoS ratio's geometric mean and range, and the wins."""
    out = []
    for smp in SAMPLERS:
        cells = [(c, b, c["sample"][b]["ratios"][smp]) for c in agg["samplers"]
                 for b in SAMPLER_BATCHES[agg["mode"]]]
        w = {k: sum(r["faster"] == k for _, _, r in cells) for k in ("aos", "soa", "tie")}
        lo, hi = (f(cells, key=lambda t: t[2]["mean"]) for f in (min, max))
        at = lambda t: f"{t[2]['mean']:.2f} ({t[0]['kind']} {fmt_count(t[0]['capacity'])} batch {t[1]})"  # noqa: E731
        out.append(f"{SAMPLER_LABELS[smp]}: SoA/AoS geometric mean {gmean([r['mean'] for _, _, r in cells]):.2f}, "
                   f"from {at(lo)} to {at(hi)}; AoS faster in {w['aos']}, SoA in {w['soa']}, tie in {w['tie']} "
                   f"of {len(cells)}")
    return out


def field_findings(agg: dict) -> list[str]:
    """Per (capacity, batch): how 1 -> 16 fields changes each implementation's latency."""
    out = []
    n0, n1 = FIELD_COUNTS[0], FIELD_COUNTS[-1]
    for cap in dict.fromkeys(c["capacity"] for c in agg["fields"]):
        cs = {c["n_fields"]: c for c in agg["fields"] if c["capacity"] == cap}
        for b in FIELD_BATCHES[agg["mode"]]:
            (a0, a1), (s0, s1), (u0, u1) = [[cs[n]["sample"][b][i]["median_us_mean"] for n in (n0, n1)]
                                            for i in IMPLS]
            rr = " -> ".join(f"{cs[n]['sample'][b]['ratios']['soa/aos']['mean']:.2f}" for n in FIELD_COUNTS)
            out.append(f"capacity {fmt_count(cap)}, batch {b}: from {n0} to {n1} fields AoS goes "
                       f"{fmt_us(a0)} -> {fmt_us(a1)} µs ({a1 / a0:.2f}x), SoA {fmt_us(s0)} -> {fmt_us(s1)} µs "
                       f"({s1 / s0:.2f}x, +{(s1 - s0) / (n1 - n0):.2f} µs per extra field, "
                       f"{(s1 - s0) / (n1 - n0) * 1e3 / b:.1f} ns per field per sampled row), numpy "
                       f"{fmt_us(u0)} -> {fmt_us(u1)} µs ({u1 / u0:.2f}x); SoA/AoS by field count "
                       f"{', '.join(map(str, FIELD_COUNTS))}: {rr}")
    return out


# -- Report --------------------------------------------------------------------------------------
def pm(s: dict, key: str = "median_us") -> str:
    """'12.3 ± 0.45': mean ± std across seeds of a per-seed statistic."""
    return f"{fmt_us(s[key + '_mean'])} ± {fmt_us(s[key + '_std'])}"


def r2(r: dict) -> str:
    """A ratio summary as '1.23 ± 0.04'."""
    return f"{r['mean']:.2f} ± {r['std']:.2f}"


def memory_cells(m: dict, cols) -> list[str]:
    """Formatted bytes of a memory probe's ``cols`` ('?' and the error where it failed)."""
    if not m or "error" in m:
        return ["?"] * (len(cols) - 1) + [m.get("error", "?")]
    return [fmt_bytes(m[k]) for k in cols]


def write_report(agg: dict, run: dict, files: list[str]) -> None:
    mode, seeds = run["mode"], run["seeds"]
    cs, sc, fc = agg["configs"], agg["samplers"], agg["fields"]
    kinds = list(dict.fromkeys(c["kind"] for c in cs))
    cross_lines, cross_by = crossing_summary(agg["crossovers"])
    bullets = lambda lines: "- " + "\n- ".join(lines) + "\n"  # noqa: E731
    L = ["# AoS or SoA: which replay-buffer layout samples faster (by row size, batch, capacity, sampler and "
         "number of fields), where does it flip, and what does each cost?\n",
         produced_by(mode, run["run_name"], len(seeds), run["wall_clock_s"], run["started_utc"])
         + " Every table and figure below comes from that run's `results.json`; a rerun rewrites them and keeps "
         "the hand-written text. "
         + ("The published report is the full run (`python experiments/layout.py`)." if mode == "quick" else
            "The quick demo (`python3 dev.py demo`) writes a smaller run to the same place."), "",
         "## Answer\n", *hand_written(OUT_DIR, "answer"),
         "Headline figures (median µs per `sample()` call, mean ± std across seeds):\n"]
    heads = [(k, b) for k, b in (("cartpole", 256), ("image", 32), ("tiny", 256), ("medium", 256)) if k in kinds]
    last = {c["kind"]: c for c in cs}  # the largest capacity of each row kind
    L += md_table(["row kind", "capacity", "batch", "tfdata AoS", "tfdata SoA", "numpy", "SoA/AoS"],
                  [[k, f"{last[k]['capacity']:,}", b, *(pm(last[k]["sample"][b][i]) for i in IMPLS),
                    f"{last[k]['sample'][b]['ratios']['soa/aos']['mean']:.2f}"] for k, b in heads], "lrrrrrr")
    L += ["", *hand_written(OUT_DIR, "details"),
          "## Reproduce\n",
          "```sh\npython3 dev.py demo                                  # = python experiments/layout.py --quick  "
          "(< ~2 min)\n.venv/bin/python experiments/layout.py               # full run (< ~15 min), the "
          "published one\n.venv/bin/python experiments/layout.py --seeds 0,1,2  # explicit seeds\n```\n",
          "Files: `README.md` (this), `results.json` (every number, per seed; `schema_version` field), "
          + ", ".join(f"`{f}`" for f in files) + ".\n",
          *hand_written(OUT_DIR, "compared")]
    L += md_table(["row kind", "fields", "data bytes/row", "AoS record bytes",
                   "capacities (AoS storage, where it fits)"],
                  [[k, ", ".join(f"{f.name} {f.dtype.str[1:]}{list(f.shape) if f.shape else ''}" for f in spec),
                    spec.row_nbytes, spec.aos_dtype.itemsize,
                    "; ".join(f"{c['capacity']:,} ({fmt_bytes(c['aos_storage_bytes'])}, {c['cache_placement']})"
                              for c in cs if c["kind"] == k)] for k in kinds for spec in [make_spec(k)]], "llrrl")
    l2, l3 = (run_cache_size(run, lv) for lv in (2, 3))
    L += [f"\nBatch sizes: {', '.join(map(str, BATCH_SIZES))}. Cache placement compares the AoS storage with this "
          f"machine's L2 ({fmt_bytes(l2) if l2 else '?'} per core) and L3 ({fmt_bytes(l3) if l3 else '?'}, "
          "shared): a \"cache-resident\" 10,000-row buffer of a large row is not cache-resident.\n",
          *hand_written(OUT_DIR, "method"),
          "## Sample latency\n", *(f"![{f}]({f})\n" for f in files if f.startswith("latency_")),
          "![ratios.png](ratios.png)\n"]
    for kind in kinds:
        L.append(f"### {kind}\n")
        L += md_table(["capacity", "batch", "AoS median µs", "SoA median µs", "numpy median µs",
                       "p99 µs AoS / SoA / numpy", "SoA/AoS", "numpy/AoS", "numpy/SoA", "faster layout"],
                      [[f"{c['capacity']:,}", b, *(pm(s[i]) for i in IMPLS),
                        " / ".join(fmt_us(s[i]["p99_us_mean"]) for i in IMPLS), r2(s["ratios"]["soa/aos"]),
                        f"{s['ratios']['numpy/aos']['mean']:.2f}", f"{s['ratios']['numpy/soa']['mean']:.2f}",
                        VNAME[s["ratios"]["soa/aos"]["faster"]]]
                       for c in cs if c["kind"] == kind for b in BATCH_SIZES for s in [c["sample"][b]]], "r" * 9 + "l")
        L.append("")

    # -- samplers
    L += ["## Samplers: uniform, prioritized, n-step\n",
          *hand_written(OUT_DIR, "samplers"),
          "![samplers.png](samplers.png)\n", bullets(sampler_findings(agg))]
    L += hand_written(OUT_DIR, "n-step words")
    L += md_table(["row kind", "capacity", "batch", "sampler", "AoS median µs", "SoA median µs", "p99 µs AoS / SoA",
                   "SoA/AoS", "faster layout"],
                  [[c["kind"], f"{c['capacity']:,} ({c['cache_placement']})", b, smp, pm(a), pm(o),
                    f"{fmt_us(a['p99_us_mean'])} / {fmt_us(o['p99_us_mean'])}", r2(r), VNAME[r["faster"]]]
                   for c in sc for b in SAMPLER_BATCHES[mode] for smp in SAMPLERS
                   for a, o, r in [(c["sample"][b][f"{smp}/aos"], c["sample"][b][f"{smp}/soa"],
                                    c["sample"][b]["ratios"][smp])]], "lrrlrrrrl")
    L += ["", *hand_written(OUT_DIR, "sampler memory")]
    L += md_table(["row kind", "capacity", "sampler", "layout", "storage", "RSS after build", "RSS after fill",
                   "RSS after sampling", "first fill rows/s"],
                  [[c["kind"], f"{c['capacity']:,}", smp, lay,
                    *memory_cells(c["memory"].get(f"{smp}/{lay}", {}), ("storage_bytes", "rss_build_bytes",
                                                                       "rss_fill_bytes", "rss_after_samples_bytes")),
                    fmt_rate(c["fill"][f"{smp}/{lay}"]["rows_per_s_mean"])]
                   for c in sc for smp in SAMPLERS for lay in LAYOUTS], "lrllrrrrr")
    # -- fields
    L += ["", "## Number of fields (same 64 bytes per row)\n",
          *hand_written(OUT_DIR, "fields"),
          "![fields.png](fields.png)\n", bullets(field_findings(agg))]
    L += md_table(["capacity", "batch", "fields", "AoS median µs", "SoA median µs", "numpy median µs",
                   "p99 µs AoS / SoA / numpy", "SoA/AoS", "numpy/AoS", "faster layout"],
                  [[f"{c['capacity']:,} ({c['cache_placement']})", b, c["n_fields"], *(pm(s[i]) for i in IMPLS),
                    " / ".join(fmt_us(s[i]["p99_us_mean"]) for i in IMPLS), r2(s["ratios"]["soa/aos"]),
                    f"{s['ratios']['numpy/aos']['mean']:.2f}", VNAME[s["ratios"]["soa/aos"]["faster"]]]
                   for c in fc for b in FIELD_BATCHES[mode] for s in [c["sample"][b]]], "r" * 9 + "l")
    # -- crossovers
    L += ["", "## Crossovers\n",
          *hand_written(OUT_DIR, "crossovers"),
          "![crossovers.png](crossovers.png)\n", "Summary:\n", bullets(cross_lines)]
    for dim, ss in cross_by.items():
        L.append(f"### By {dim}\n")
        L += md_table(["series", f"SoA/AoS at measured {ss[0]['x_label']}", "crossover"],
                      [[x["series"], ", ".join(f"{fmt_axis(a, x['x_label'])}: {y:.2f}"
                                               for a, y in zip(x["xs"], x["ys"])),
                        crossing_text(x, {"soa": "SoA", "aos": "AoS"}, "soa_faster_below")] for x in ss], "lll")
        L.append("")
    # -- writes, memory, caveats
    L.append("## Write throughput (rows/s, mean ± std across seeds)\n")
    L += md_table(["row kind", "capacity", "push AoS", "push SoA", "push numpy", "extend(1000) AoS", "extend SoA",
                   "extend numpy", "first fill AoS / SoA / numpy"],
                  [[c["kind"], f"{c['capacity']:,}",
                    *(f"{fmt_rate(c[op][i]['rows_per_s_mean'])} ± {fmt_rate(c[op][i]['rows_per_s_std'])}"
                      for op in ("push", "extend") for i in IMPLS),
                    " / ".join(fmt_rate(c["fill"][i]["rows_per_s_mean"]) for i in IMPLS)] for c in cs], "lrrrrrrrr")
    L += ["", "## Memory\n"]
    rows = []
    for c in cs:
        for impl in IMPLS:
            m = c["memory"].get(impl, {})
            cells = memory_cells(m, ("storage_bytes", "rss_build_bytes", "rss_fill_bytes", "rss_after_samples_bytes"))
            cells.insert(3, "?" if cells[0] == "?" else f"{m['rss_fill_bytes'] / m['storage_bytes']:.2f}")
            rows.append([c["kind"], f"{c['capacity']:,}", impl, *cells])
    L += md_table(["row kind", "capacity", "impl", "storage", "RSS after build", "RSS after fill",
                   "fill RSS / storage", "RSS after sampling each batch size twice"], rows, "lrlrrrrr")
    L += ["", *hand_written(OUT_DIR, "memory"),
          "## Caveats\n",
          "* One machine, a small shared virtual machine (see below): absolute times move with the host; the "
          "interleaved ratios are the robust part. The load average and CPU steal during the run are recorded "
          "below."]
    cv_abs = [s[i]["median_us_std"] / s[i]["median_us_mean"] for c in cs for s in c["sample"].values() for i in IMPLS]
    cv_rat = [s["ratios"]["soa/aos"]["std"] / s["ratios"]["soa/aos"]["mean"] for c in cs for s in c["sample"].values()]
    spread = (f"Across seeds, a per-seed median latency varies by {np.median(cv_abs):.0%} (coefficient of "
              f"variation, median over configurations; worst {max(cv_abs):.0%}), the SoA/AoS ratio by "
              f"{np.median(cv_rat):.0%} (worst {max(cv_rat):.0%}).")
    busy = run.get("machine_busy_fraction")
    L += [f"* The machine was not idle: both CPUs together were busy {busy:.0%} of the run while this experiment "
          "kept one busy, so other processes competed for the second core, memory bandwidth and the shared L3. "
          f"{spread}" if busy is not None and busy > 0.6 else f"* {spread}",
          *hand_written(OUT_DIR, "caveats")]
    write_methodology_report(OUT_DIR, L, run)


def print_table(agg: dict) -> None:
    """The main numbers on the console: sample latency and ratios, memory and push rate, the
    samplers' and the field counts' ratios, and the crossings."""
    mode = agg["mode"]
    us = lambda s, i: fmt_us(s[i]["median_us_mean"])  # noqa: E731
    print("\n" + text_table(
        ["row", "capacity", "batch", "median µs: AoS", "SoA", "numpy", "SoA/AoS", "np/AoS", "faster"],
        [[c["kind"], f"{c['capacity']:,}", b, *(us(s, i) for i in IMPLS), f"{s['ratios']['soa/aos']['mean']:.2f}",
          f"{s['ratios']['numpy/aos']['mean']:.2f}", s["ratios"]["soa/aos"]["faster"]]
         for c in agg["configs"] for b in BATCH_SIZES for s in [c["sample"][b]]]))
    mem = lambda c, i, k: fmt_bytes(c["memory"][i][k]) if k in c["memory"].get(i, {}) else "?"  # noqa: E731
    print("\n" + text_table(
        ["row", "capacity", "storage AoS", "SoA", "RSS fill AoS", "SoA", "numpy", "push rows/s AoS", "SoA", "numpy"],
        [[c["kind"], f"{c['capacity']:,}", *(mem(c, i, "storage_bytes") for i in LAYOUTS),
          *(mem(c, i, "rss_fill_bytes") for i in IMPLS), *(fmt_rate(c["push"][i]["rows_per_s_mean"]) for i in IMPLS)]
         for c in agg["configs"]]))
    print("\n" + text_table(
        ["row", "capacity", "batch", *(f"{s} SoA/AoS" for s in SAMPLERS)],
        [[c["kind"], f"{c['capacity']:,}", b, *(f"{r[s]['mean']:.2f} {r[s]['faster']}" for s in SAMPLERS)]
         for c in agg["samplers"] for b in SAMPLER_BATCHES[mode] for r in [c["sample"][b]["ratios"]]]))
    print("\n" + text_table(
        ["fields", "capacity", "batch", "median µs: AoS", "SoA", "numpy", "SoA/AoS", "faster"],
        [[c["n_fields"], f"{c['capacity']:,}", b, *(us(s, i) for i in IMPLS), f"{s['ratios']['soa/aos']['mean']:.2f}",
          s["ratios"]["soa/aos"]["faster"]] for c in agg["fields"] for b in FIELD_BATCHES[mode]
         for s in [c["sample"][b]]]) + "\n")
    for line in crossing_summary(agg["crossovers"])[0]:
        print("crossovers, " + line)
    print(flush=True)


def render(path: str) -> list[str]:
    """The plots and README.md of ``OUT_DIR`` from a results.json; returns the plots' names."""
    res = read_results(path, int_keys=True)
    run = res["methodology"]
    agg = {k: res[k] for k in ("configs", "samplers", "fields", "crossovers")}
    agg["mode"] = run["mode"]
    os.makedirs(OUT_DIR, exist_ok=True)
    files = plot(agg, run["mode"], len(run["seeds"])) + plot_extra(agg, run["mode"], len(run["seeds"]))
    write_report(agg, run, files)
    return files


# -- Main ----------------------------------------------------------------------------------------
def main(argv=None) -> None:
    args = seeds_parser(__doc__, "small grid, short timing budgets (under ~2 minutes)",
                        "number of seeds (0..N-1) or a comma list, e.g. 0,1,2 "
                        f"(default {DEFAULT_SEEDS['full']} full, {DEFAULT_SEEDS['quick']} quick)"
                        ).parse_args(argv)
    if args.render:
        render(args.render)
        return
    mode = "quick" if args.quick else "full"
    seeds = parse_seeds(args.seeds, DEFAULT_SEEDS[mode])
    command = " ".join(["python experiments/layout.py", *(sys.argv[1:] if argv is None else argv)])
    kinds_caps = [(k, c) for k, caps in CAPACITIES[mode].items() for c in caps]
    sampler_kc = [(k, c) for k, caps in SAMPLER_CAPACITIES[mode].items() for c in caps]
    field_kc = [(n, cap) for cap in FIELD_CAPACITIES[mode] for n in FIELD_COUNTS]
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

    memory = {kc: {impl: measure_memory(*kc, impl) for impl in IMPLS} for kc in kinds_caps}
    smemory = {kc: {f"{smp}/{lay}": measure_memory(*kc, lay, smp, SAMPLER_BATCHES[mode])
                    for smp in SAMPLERS for lay in LAYOUTS} for kc in sampler_kc}
    log("memory probes done")
    # seeds in the outer loop, so drift over the run shows up as spread across seeds
    raw, raw_s, raw_f = [], [], []
    for si, seed in enumerate(seeds):
        for ci, (kind, cap) in enumerate(kinds_caps):
            raw.append(run_config(kind, cap, seed, mode, order_key=si + ci))
            log(f"seed {seed} {kind:<8} cap {cap:>10,}: batch 256 median µs "
                + " ".join(f"{i} {raw[-1]['sample'][256][i]['median_us']:.1f}" for i in IMPLS))
    log(f"sampler grid: {len(sampler_kc)} (row kind, capacity) x {len(SAMPLERS)} samplers x "
        f"{len(LAYOUTS)} layouts x {len(SAMPLER_BATCHES[mode])} batch sizes")
    for si, seed in enumerate(seeds):
        for ci, (kind, cap) in enumerate(sampler_kc):
            raw_s.append(run_sampler_config(kind, cap, seed, mode, order_key=si + ci))
            log(f"seed {seed} {kind:<8} cap {cap:>10,}: batch {SAMPLER_BATCHES[mode][-1]} median µs " + " ".join(
                f"{k} {v['median_us']:.1f}" for k, v in raw_s[-1]["sample"][SAMPLER_BATCHES[mode][-1]].items()))
    log(f"field grid: {len(field_kc)} (fields, capacity) x {len(IMPLS)} impls x "
        f"{len(FIELD_BATCHES[mode])} batch sizes")
    for si, seed in enumerate(seeds):
        for ci, (n, cap) in enumerate(field_kc):
            raw_f.append(run_field_config(n, cap, seed, mode, order_key=si + ci))
        log(f"seed {seed} fields done; last (16 fields, cap {field_kc[-1][1]:,}) median µs " + " ".join(
            f"{k} {v['median_us']:.1f}" for k, v in raw_f[-1]["sample"][FIELD_BATCHES[mode][-1]].items()))

    agg = {**aggregate(raw, memory, kinds_caps), "mode": mode,
           "samplers": aggregate_samplers(raw_s, smemory, sampler_kc, SAMPLER_BATCHES[mode]),
           "fields": aggregate_fields(raw_f, FIELD_CAPACITIES[mode], FIELD_BATCHES[mode])}
    agg["crossovers"] = crossover_series(agg)
    print_table(agg)
    child_peak = max((m.get("probe_peak_rss_bytes", 0) for mem in (memory, smemory)
                      for per in mem.values() for m in per.values()), default=None)
    run = rec.finish(child_peak_rss_bytes=child_peak)
    write_json(os.path.join(OUT_DIR, "results.json"),
               {"methodology": run, "configs": agg["configs"], "samplers": agg["samplers"],
                "fields": agg["fields"], "crossovers": agg["crossovers"], "raw": raw,
                "raw_samplers": raw_s, "raw_fields": raw_f})
    files = render(os.path.join(OUT_DIR, "results.json"))
    rel = os.path.relpath(OUT_DIR, ROOT)
    print(f"{mode} run {rec.run_name} done in {run['wall_clock_s']:.0f} s; "
          f"report: {rel}/README.md, data: {rel}/results.json, plots: {', '.join(files)}", flush=True)


if __name__ == "__main__":
    main()
