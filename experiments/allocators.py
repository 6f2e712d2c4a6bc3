"""Allocators: does the allocator behind tfdata's arrays matter, and where?

A self-contained experiment (one file, parameters at the top, cleanrl style). Five allocators of
``tfdata.alloc`` are compared:

* ``numpy``: the system malloc (glibc) through numpy, which advises transparent huge pages for
  arrays of 4 MiB and more;
* ``jemalloc``: Debian's libjemalloc2 through ctypes;
* ``mimalloc``: Debian's libmimalloc2.0 through ctypes;
* ``hugepages``: one anonymous mmap per array, ``MADV_HUGEPAGE``, start aligned to 2 MiB;
* ``nohugepages``: one anonymous mmap per array, ``MADV_NOHUGEPAGE`` (the no-huge-page control).

Cases, each measured in a fresh process per (allocator, layout, seed):

``cartpole``
    A ``ReplayBuffer`` of CartPole-like rows (1M rows full, 200k quick), both layouts:
    construction time, first fill with ``extend`` in chunks (faults the pages in), a second fill
    (pages already resident: the steady ``extend`` rate), peak RSS, ``push`` rate, the latency of
    single ``sample(256)`` calls (p50 / p99 / p99.9) and the time of ``sample(4096)``.
``image``
    A ~2 GiB buffer of image-like rows (4x84x84 uint8 observation, AoS; 256 MiB in quick mode):
    construction, first fill, second fill, random gathers ``sample(256)`` / ``sample(4096)``, and
    ``tfdata.memory.snapshot()["huge"]`` (AnonHugePages) to show whether huge pages were used.
``churn``
    What a loop that does not preallocate does: a fixed, seeded sequence of allocations of
    log-uniform random sizes (4 KiB .. 4 MiB) through ``alloc.empty``, one byte written per 4 KiB
    page, a sliding window of the last K arrays kept alive (older ones freed). RSS over the run,
    final and peak RSS against the live bytes, allocations per second, and RSS after
    ``Allocator.trim()``.

    python experiments/allocators.py --quick                      # ~2-3 min, 2 seeds, small sizes
    python experiments/allocators.py                              # full run, 5 seeds, ~13 min
    python experiments/allocators.py --render reports/alloc/results.json   # redo report + plots
    python experiments/allocators.py --allocators numpy,mimalloc  # a subset

Full runs write ``reports/alloc/`` (``README.md``, ``results.json``, ``*.png``); quick runs
write ``reports/alloc/quick/`` so they never replace a full report. Only the public tfdata API
is used (``tfdata.ReplayBuffer``, ``tfdata.alloc``, ``tfdata.memory``), plus numpy and matplotlib.

Debian's jemalloc loads only if ``GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096`` is in the
environment before Python starts: the main process re-executes itself with it
(``tfdata.alloc.reexec_with_tunables``) and starts every measurement process with
``tfdata.alloc.tunable_env()``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import time
from functools import partial

import numpy as np

import tfdata
from tfdata import alloc as talloc
from tfdata import memory as tmem

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
from _plots import bar_series, panels_figure, survival, traces  # noqa: E402
from _recording import RunRecord, cpu_snapshot, library_versions, other_cpu_share, parse_seeds, peak_rss_bytes  # noqa: E402
from _recording import drop_stale_plots, read_results, report_dir, seeds_parser, thp_settings, write_json  # noqa: E402
from _render import hand_written, markdown as methodology_markdown, table  # noqa: E402
from _stats import mean_std  # noqa: E402
from _timing import rotated  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "alloc"
ALLOCATORS = talloc.NAMES  # numpy, jemalloc, mimalloc, hugepages, nohugepages
REFERENCE = "numpy"        # differences are stated against the default allocator
LAYOUTS = ("aos", "soa")
SEEDS = {"full": 5, "quick": 2}
SPECS = {
    # a CartPole-v1 transition: 46 bytes of data, a 48-byte AoS record
    "cartpole": {"obs": ("f4", (4,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (4,)),
                 "terminated": "?", "truncated": "?"},
    # an Atari frame stack without next_obs (a frame store): 28,238 bytes of data per row
    "image": {"obs": ("u1", (4, 84, 84)), "action": "i8", "reward": "f4",
              "terminated": "?", "truncated": "?"},
}
ROWS = {"full": {"cartpole": 1_000_000, "image": 76_000},      # image: ~2.0 GiB
        "quick": {"cartpole": 200_000, "image": 9_500}}        # image: ~256 MiB
CASE_LAYOUTS = {"cartpole": LAYOUTS, "image": ("aos",)}        # image rows: obs is 99.9% of a row
FILL_CHUNK = {"cartpole": 10_000, "image": 500}                # rows per extend call
PUSHES = {"full": 50_000, "quick": 10_000}                     # single-row pushes timed
LAT_BATCH = 256
LAT_CALLS = {"full": 100_000, "quick": 20_000}                 # sample(256) calls timed one by one
GATHER_BATCHES = (256, 4096)
GATHER_SECONDS = {"full": 1.0, "quick": 0.3}                   # per batch size (at least GATHER_MIN calls)
GATHER_MIN = 10
CHURN = {"full": {"allocations": 60_000, "window": 256},
         "quick": {"allocations": 8_000, "window": 256}}
CHURN_MIN, CHURN_MAX = 4 << 10, 4 << 20                        # log-uniform sizes, bytes
CHURN_POINTS = 200                                             # RSS samples over a churn run
PAGE = 4096
HIST_EDGES_NS = np.logspace(3, 9, 301)                         # 1 µs .. 1 s, 50 bins per decade
MARGIN = 0.05              # a difference counts when every seed agrees in sign and it exceeds 5%
WORKER_TIMEOUT_S = 900

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# under tfdata's CLI (TFDATA_REPORTS_DIR set) both modes write report_dir("alloc")
OUT_DIRS = ({"full": report_dir("alloc"), "quick": report_dir("alloc")} if os.environ.get("TFDATA_REPORTS_DIR")
            else {"full": report_dir("alloc"), "quick": os.path.join(report_dir("alloc"), "quick")})
COLORS = {"numpy": "tab:blue", "jemalloc": "tab:orange", "mimalloc": "tab:green",
          "hugepages": "tab:red", "nohugepages": "tab:purple"}


# ---------------------------------------------------------------------------------------------
# Measurement (runs in a fresh worker process)
# ---------------------------------------------------------------------------------------------
def source_chunk(kind: str, n: int, seed: int) -> dict:
    """``n`` rows of random data for ``extend`` (allocated before anything is measured)."""
    rng = np.random.default_rng(seed)
    spec = SPECS[kind]
    out = {}
    for name, s in spec.items():
        dtype, shape = (s, ()) if isinstance(s, str) else s
        dtype = np.dtype(dtype)
        full = (n, *shape)
        if dtype == np.bool_:
            out[name] = rng.random(full) < 0.01
        elif dtype.kind == "u":
            out[name] = rng.integers(0, 256, full, dtype=dtype)
        elif dtype.kind == "i":
            out[name] = rng.integers(0, 2, full).astype(dtype)
        else:
            out[name] = rng.standard_normal(full).astype(dtype)
    return out


def one_row(chunk: dict, i: int) -> dict:
    return {k: (v[i] if v.ndim > 1 else v[i].item()) for k, v in chunk.items()}


def snap() -> dict:
    s = tmem.snapshot(uss=False)
    return {k: s[k] for k in ("rss", "peak_rss", "huge", "minor_faults", "major_faults")}


def latency_stats(ns: np.ndarray) -> dict:
    ns = np.asarray(ns, dtype=np.float64)
    return {"calls": int(ns.size), "mean_us": float(ns.mean() / 1e3),
            "p50_us": float(np.percentile(ns, 50) / 1e3), "p90_us": float(np.percentile(ns, 90) / 1e3),
            "p99_us": float(np.percentile(ns, 99) / 1e3), "p999_us": float(np.percentile(ns, 99.9) / 1e3),
            "max_us": float(ns.max() / 1e3)}


def fill(buf, chunk: dict, rows: int, step: int) -> float:
    t0 = time.perf_counter()
    done = 0
    while done < rows:
        n = min(step, rows - done)
        buf.extend(chunk if n == step else {k: v[:n] for k, v in chunk.items()})
        done += n
    return time.perf_counter() - t0


def timed_gathers(buf, batch: int, seconds: float) -> dict:
    t = time.perf_counter_ns
    a = t()
    buf.sample(batch)  # first call of this size: allocates and faults in its output ring
    first_us = (t() - a) / 1e3
    ns = []
    end = time.perf_counter() + seconds
    while len(ns) < GATHER_MIN or time.perf_counter() < end:
        a = t()
        buf.sample(batch)
        ns.append(t() - a)
    out = latency_stats(np.array(ns))
    out["first_call_us"] = first_us
    out["rows_per_s"] = batch / (float(np.median(ns)) / 1e9)
    return out


def warm_up(kind: str, name: str, layout: str) -> None:
    """Compile the kernels and load the allocator's library before anything is timed."""
    talloc.get(name)
    spec = SPECS[kind]
    chunk = source_chunk(kind, 4096, seed=999)
    w = tfdata.ReplayBuffer(spec, 8192, layout=layout, seed=999, allocator=name)
    w.extend(chunk)
    w.extend(chunk)
    w.push(one_row(chunk, 0))
    for b in GATHER_BATCHES:
        w.sample(b)
    del w, chunk
    gc.collect()


def measure_buffer(job: dict) -> dict:
    kind, name, layout, seed, mode = job["case"], job["allocator"], job["layout"], job["seed"], job["mode"]
    rows = ROWS[mode][kind]
    step = FILL_CHUNK[kind]
    warm_up(kind, name, layout)
    chunk = source_chunk(kind, step, seed)
    gc.collect()
    gc.disable()
    res = {}
    s0 = snap()
    tmem.reset_peak()
    t0 = time.perf_counter()
    buf = tfdata.ReplayBuffer(SPECS[kind], rows, layout=layout, seed=seed, allocator=name)
    res["construct_ms"] = (time.perf_counter() - t0) * 1e3
    s1 = snap()
    res["first_fill_s"] = fill(buf, chunk, rows, step)
    s2 = snap()
    res["refill_s"] = fill(buf, chunk, rows, step)
    s3 = snap()
    res["nbytes"] = int(buf.nbytes)
    res["nbytes_parts"] = {k: int(v) for k, v in buf.nbytes_parts.items()}
    res["rss_baseline"] = s0["rss"]
    res["huge_baseline"] = s0["huge"]
    res["rss_after_construct_over_baseline"] = s1["rss"] - s0["rss"]
    res["rss_after_fill_over_baseline"] = s2["rss"] - s0["rss"]
    res["peak_rss_fill_over_baseline"] = s3["peak_rss"] - s0["rss"]
    res["huge_after_fill"] = s2["huge"]
    res["minor_faults_construct"] = s1["minor_faults"] - s0["minor_faults"]
    res["minor_faults_first_fill"] = s2["minor_faults"] - s1["minor_faults"]
    res["minor_faults_refill"] = s3["minor_faults"] - s2["minor_faults"]
    res["first_fill_rows_per_s"] = rows / res["first_fill_s"]
    res["extend_rows_per_s"] = rows / res["refill_s"]
    res["extend_bytes_per_s"] = res["nbytes_parts"].get("storage", res["nbytes"]) / res["refill_s"]
    res["first_touch_s"] = res["first_fill_s"] - res["refill_s"]
    res["construct_and_first_fill_s"] = res["construct_ms"] / 1e3 + res["first_fill_s"]

    if kind == "cartpole":
        # push: single rows, as an environment loop would
        row_list = [one_row(chunk, i) for i in range(64)]
        n = PUSHES[mode]
        t0 = time.perf_counter()
        for i in range(n):
            buf.push(row_list[i & 63])
        res["push_per_s"] = n / (time.perf_counter() - t0)
        # sample(256): one call at a time, each timed
        buf.sample(LAT_BATCH)
        calls = LAT_CALLS[mode]
        ns = np.empty(calls, np.int64)
        t = time.perf_counter_ns
        sample = buf.sample
        for i in range(calls):
            a = t()
            sample(LAT_BATCH)
            ns[i] = t() - a
        res["sample256_latency"] = latency_stats(ns)
        res["sample256_hist"] = np.histogram(np.clip(ns, HIST_EDGES_NS[0], HIST_EDGES_NS[-1] - 1),
                                             HIST_EDGES_NS)[0].tolist()
        res["gather"] = {str(b): timed_gathers(buf, b, GATHER_SECONDS[mode]) for b in (4096,)}
    else:
        res["gather"] = {str(b): timed_gathers(buf, b, GATHER_SECONDS[mode]) for b in GATHER_BATCHES}
    s4 = snap()
    gc.enable()
    res["huge_end"] = s4["huge"]
    res["rss_end_over_baseline"] = s4["rss"] - s0["rss"]
    res["peak_rss_over_baseline"] = s4["peak_rss"] - s0["rss"]
    res["allocator_stats"] = talloc.get(name).stats()
    res["nbytes_end"] = int(buf.nbytes)  # with the output rings sampling allocated
    res["nbytes_parts_end"] = {k: int(v) for k, v in buf.nbytes_parts.items()}
    return res


def measure_churn(job: dict) -> dict:
    name, seed, mode = job["allocator"], job["seed"], job["mode"]
    cfg = CHURN[mode]
    n, k = cfg["allocations"], cfg["window"]
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(math.log(CHURN_MIN), math.log(CHURN_MAX), n)).astype(np.int64)
    every = max(1, n // CHURN_POINTS)
    h = talloc.open(name)  # a private handle: its counters are the churn's alone
    # warm the code path (and load the library) with a few tiny blocks
    for _ in range(16):
        a = h.empty(PAGE, np.uint8)
        a[::PAGE] = 1
    del a
    gc.collect()
    gc.disable()
    window = [None] * k
    s0 = snap()
    tmem.reset_peak()
    trace = {"allocations": [], "t_s": [], "rss_over_baseline": [], "live_bytes": [], "huge": []}
    t0 = time.perf_counter()
    pause = 0.0  # time spent taking snapshots, taken out of the rate
    for i in range(n):
        arr = h.empty(int(sizes[i]), np.uint8)
        arr[::PAGE] = 1
        window[i % k] = arr  # drops the array allocated k steps ago
        if (i + 1) % every == 0 or i + 1 == n:
            p = time.perf_counter()
            s = snap()
            trace["allocations"].append(i + 1)
            trace["t_s"].append(p - t0 - pause)
            trace["rss_over_baseline"].append(s["rss"] - s0["rss"])
            trace["live_bytes"].append(h.live_bytes)
            trace["huge"].append(s["huge"])
            pause += time.perf_counter() - p
    del arr
    elapsed = time.perf_counter() - t0 - pause
    s_end = snap()
    st_end = h.stats()
    live_end = st_end["live_bytes"]
    h.trim()
    s_trim_live = snap()
    window = None  # noqa: F841 - frees every array
    gc.collect()
    s_free = snap()
    h.trim()
    s_free_trim = snap()
    gc.enable()
    res = {
        "allocations": n, "window": k, "elapsed_s": elapsed, "allocations_per_s": n / elapsed,
        "requested_bytes_total": int(sizes.sum()), "mean_size": float(sizes.mean()),
        "rss_baseline": s0["rss"],
        "live_bytes_end": live_end, "peak_live_bytes": st_end["peak_bytes"],
        "rss_end_over_baseline": s_end["rss"] - s0["rss"],
        "peak_rss_over_baseline": s_end["peak_rss"] - s0["rss"],
        "fragmentation_end": (s_end["rss"] - s0["rss"]) / live_end,
        "rss_after_trim_live_over_baseline": s_trim_live["rss"] - s0["rss"],
        "rss_after_free_over_baseline": s_free["rss"] - s0["rss"],
        "rss_after_free_trim_over_baseline": s_free_trim["rss"] - s0["rss"],
        "huge_end": s_end["huge"], "huge_baseline": s0["huge"],
        "minor_faults": s_end["minor_faults"] - s0["minor_faults"],
        "allocator_stats_end": st_end,
        "trace": trace,
    }
    # RSS growth: the second half of the run against the first (after the window has filled)
    half = len(trace["rss_over_baseline"]) // 2
    if half:
        res["rss_growth_second_half"] = trace["rss_over_baseline"][-1] - trace["rss_over_baseline"][half]
    h.close()
    return res


def worker(job: dict) -> None:
    ok, why = talloc.available(job["allocator"])
    if not ok:
        out = {"skipped": why}
    else:
        t0 = time.perf_counter()
        out = measure_churn(job) if job["case"] == "churn" else measure_buffer(job)
        out["worker_measure_s"] = time.perf_counter() - t0
        out["worker_peak_rss"] = peak_rss_bytes()
    sys.stdout.write("RESULT " + json.dumps(out, default=float) + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------------------------------
# Orchestration (main process)
# ---------------------------------------------------------------------------------------------
def run_worker(job: dict, log) -> dict:
    env = talloc.tunable_env()
    env.pop("_TFDATA_REEXEC", None)
    c0, t0 = cpu_snapshot(children=True), time.perf_counter()
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(job)],
                           env=env, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"failed": f"timed out after {WORKER_TIMEOUT_S} s"}
    wall = time.perf_counter() - t0
    share = other_cpu_share(c0, cpu_snapshot(children=True), wall)
    line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("RESULT ")), None)
    if p.returncode != 0 or line is None:
        tail = (p.stderr or "").strip().splitlines()[-5:]
        log(f"worker failed ({p.returncode}): {job}: {' | '.join(tail)}")
        return {"failed": f"exit {p.returncode}: {' | '.join(tail)}"}
    out = json.loads(line[len("RESULT "):])
    out["worker_wall_s"] = wall
    out["other_processes_cpu_share"] = share
    out["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    return out


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------
def get_path(d: dict, path: str):
    for p in path.split("."):
        if d is None or p not in d:
            return None
        d = d[p]
    return d


def cell_runs(raw, case, name, layout):
    return [r for r in raw if r["case"] == case and r["allocator"] == name and r["layout"] == layout
            and "result" in r]


def metric(raw, case, name, layout, path) -> dict:
    vals = {r["seed"]: get_path(r["result"], path) for r in cell_runs(raw, case, name, layout)}
    vals = {s: v for s, v in vals.items() if v is not None}
    m, s = mean_std(vals.values())
    return {"mean": m, "std": s, "per_seed": vals}


def compare(raw, case, name, layout, path, ref=REFERENCE) -> dict:
    """``name`` against ``ref`` on ``path``, paired by seed: relative difference of the means and
    whether every seed agrees in sign with a mean difference above MARGIN."""
    a = metric(raw, case, name, layout, path)
    b = metric(raw, case, ref, layout, path)
    seeds = sorted(set(a["per_seed"]) & set(b["per_seed"]))
    if not seeds or not b["mean"]:
        return {"rel": None, "consistent": False}
    diffs = [a["per_seed"][s] - b["per_seed"][s] for s in seeds]
    rel = a["mean"] / b["mean"] - 1
    same = all(d > 0 for d in diffs) or all(d < 0 for d in diffs)
    return {"rel": rel, "consistent": bool(same and abs(rel) > MARGIN and len(seeds) > 1)}


def aggregate(raw, names) -> dict:
    out = {}
    paths = {
        "cartpole": ["construct_ms", "first_fill_s", "construct_and_first_fill_s", "refill_s", "first_touch_s", "extend_rows_per_s",
                     "push_per_s", "sample256_latency.p50_us", "sample256_latency.p99_us",
                     "sample256_latency.p999_us", "sample256_latency.mean_us", "gather.4096.p50_us",
                     "gather.4096.p99_us", "gather.4096.first_call_us", "peak_rss_fill_over_baseline",
                     "rss_after_construct_over_baseline", "rss_after_fill_over_baseline",
                     "minor_faults_first_fill", "huge_after_fill", "huge_baseline", "nbytes",
                     "peak_rss_over_baseline", "minor_faults_construct"],
        "image": ["construct_ms", "first_fill_s", "construct_and_first_fill_s", "refill_s", "first_touch_s", "extend_rows_per_s",
                  "extend_bytes_per_s", "gather.256.p50_us", "gather.256.p99_us", "gather.4096.p50_us",
                  "gather.4096.p99_us", "gather.256.first_call_us", "gather.4096.first_call_us",
                  "peak_rss_fill_over_baseline", "rss_after_construct_over_baseline",
                  "rss_after_fill_over_baseline", "minor_faults_first_fill", "huge_after_fill",
                  "huge_baseline", "huge_end", "nbytes", "peak_rss_over_baseline", "minor_faults_construct"],
        "churn": ["allocations_per_s", "elapsed_s", "live_bytes_end", "rss_end_over_baseline",
                  "peak_rss_over_baseline", "fragmentation_end", "rss_after_trim_live_over_baseline",
                  "rss_after_free_over_baseline", "rss_after_free_trim_over_baseline", "huge_end",
                  "rss_growth_second_half", "minor_faults", "peak_live_bytes", "library_own_bytes_end",
                  "library_own_over_live_end", "rss_minus_library_end"],
    }
    for case, ps in paths.items():
        for lay in (CASE_LAYOUTS.get(case, (None,))):
            for name in names:
                cell = {p: metric(raw, case, name, lay, p) for p in ps}
                if name != REFERENCE:
                    cell["vs_" + REFERENCE] = {p: compare(raw, case, name, lay, p) for p in ps}
                out[f"{case}/{name}/{lay}"] = cell
    return out


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------
def mib(n) -> str:
    return "?" if n is None or (isinstance(n, float) and math.isnan(n)) else f"{n / (1 << 20):.1f}"


def ms(c, scale=1.0, digits=1) -> str:
    m, s = c["mean"], c["std"]
    if m is None or math.isnan(m):
        return "–"
    return f"{m * scale:.{digits}f} ± {s * scale:.{digits}f}"


def rel_text(cmp) -> str:
    if cmp is None or cmp["rel"] is None:
        return ""
    mark = "" if cmp["consistent"] else "~"
    return f" ({mark}{cmp['rel'] * 100:+.0f}%)"


def cellv(cells, case, name, lay, path):
    return cells.get(f"{case}/{name}/{lay}", {}).get(path)


def fmt(cells, case, name, lay, path, scale=1.0, digits=1, rel=True) -> str:
    c = cellv(cells, case, name, lay, path)
    if c is None or c["mean"] is None or math.isnan(c["mean"]):
        return "–"
    text = ms(c, scale, digits)
    if rel and name != REFERENCE:
        text += rel_text(cells[f"{case}/{name}/{lay}"].get("vs_" + REFERENCE, {}).get(path))
    return text


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------
def plot(raw, cells, names, out_dir, mode) -> list:
    """The report's figures, declared as panels of the generic kinds of _plots."""
    present = [n for n in names if any(r["allocator"] == n and "result" in r for r in raw)]
    files = []

    def mean(case, n, lay, path):
        c = cellv(cells, case, n, lay, path)
        return c if c and not math.isnan(c["mean"]) else None

    # 1. sample(256) latency: survival function (1 - CDF), pooled over seeds
    files.append(panels_figure(out_dir, "latency_sample256.png", (12, 4.5), [
        partial(survival, hists={n: [r["result"]["sample256_hist"] for r in cell_runs(raw, "cartpole", n, lay)]
                                 for n in present}, edges_ns=HIST_EDGES_NS, colors=COLORS,
                ylim=(1e-5 if mode == "full" else 1e-4, 1.2), xlim=(1, 1e5), xlabel="sample(256) call latency (µs)",
                title=f"cartpole rows, {ROWS[mode]['cartpole']:,} filled, {lay.upper()}", legend=i == 0,
                ylabel="fraction of calls slower (1 - CDF)" if i == 0 else None)
        for i, lay in enumerate(LAYOUTS)], suptitle="Latency of single sample(256) calls, pooled over seeds", sharey=True))

    # 2. steady-state throughput (cartpole), normalised to numpy per layout
    def relative(p, n):
        got = [(li, mean("cartpole", n, lay, p), cellv(cells, "cartpole", REFERENCE, lay, p))
               for li, lay in enumerate(LAYOUTS)]
        got = [(li, c, ref) for li, c, ref in got if c and ref and ref["mean"]]
        j, w = present.index(n), 0.8 / max(1, len(present))
        return {"at": [li + (j - (len(present) - 1) / 2) * w for li, _, _ in got], "width": w,
                "heights": [c["mean"] / ref["mean"] for _, c, ref in got],
                "yerr": [c["std"] / ref["mean"] for _, c, ref in got], "color": COLORS[n], "capsize": 2,
                "label": n if got and got[0][0] == 0 else None}
    metrics = [("extend_rows_per_s", "extend rows/s (refill)", True), ("push_per_s", "push rows/s", True),
               ("sample256_latency.p50_us", "sample(256) p50 time", False),
               ("sample256_latency.p99_us", "sample(256) p99 time", False),
               ("gather.4096.p50_us", "sample(4096) p50 time", False)]
    files.append(panels_figure(out_dir, "steady_state.png", (16, 4), [
        partial(bar_series, ticks=(range(len(LAYOUTS)), [lay.upper() for lay in LAYOUTS]),
                series=[relative(p, n) for n in present], hlines=[(1, dict(color="k", lw=0.8))], legend={"fontsize": 8} if i == 0 else None,
                title=f"{title}\n(÷ numpy, {'higher' if higher else 'lower'} is better)")
        for i, (p, title, higher) in enumerate(metrics)],
        suptitle=f"Steady state on a filled buffer ({ROWS[mode]['cartpole']:,} cartpole rows): "
                 "mean ± std over seeds, relative to numpy"))

    # 3. huge pages: gather time and huge bytes
    def gather(case, lay, b):
        xs = [n for n in present if mean(case, n, lay, f"gather.{b}.p50_us")]
        cs = [mean(case, n, lay, f"gather.{b}.p50_us") for n in xs]
        nb = cellv(cells, case, REFERENCE, lay, "nbytes") or cellv(cells, case, present[0], lay, "nbytes")
        size = tmem.format_bytes(nb["mean"]) if nb and not math.isnan(nb["mean"]) else "?"
        return partial(bar_series, ticks=(range(len(xs)), xs), tick_kw={"rotation": 30, "fontsize": 8},
                       series=[{"at": range(len(xs)), "heights": [c["mean"] for c in cs], "width": 0.8,
                                "yerr": [c["std"] for c in cs], "color": [COLORS[n] for n in xs], "capsize": 3}],
                       title=f"{case} {lay.upper()} ({size}): sample({b})\nmedian µs per call")

    def huge(ci, case):
        js = [j for j, n in enumerate(present) if mean(case, n, "aos", "huge_after_fill")]
        return {"at": [j + (ci - 0.5) * 0.4 for j in js], "width": 0.4, "edgecolor": "k",
                "heights": [(cellv(cells, case, present[j], "aos", "huge_after_fill")["mean"]
                             - cellv(cells, case, present[j], "aos", "huge_baseline")["mean"]) / (1 << 20) for j in js],
                "color": [COLORS[present[j]] for j in js], "alpha": 1.0 if ci else 0.5, "hatch": None if ci else "//"}
    groups = [("cartpole", "aos", "4096"), ("cartpole", "soa", "4096"), ("image", "aos", "256"), ("image", "aos", "4096")]
    files.append(panels_figure(out_dir, "gather_hugepages.png", (18, 4.3), [gather(*g) for g in groups] + [
        partial(bar_series, ticks=(range(len(present)), present), tick_kw={"rotation": 30, "fontsize": 8},
                series=[huge(ci, case) for ci, case in enumerate(("cartpole", "image"))],
                yscale={"value": "symlog", "linthresh": 1},
                title="AnonHugePages gained by the fill (MiB)\nhatched: cartpole AoS, solid: image")],
        suptitle="Random gathers from filled buffers, mean ± std over seeds of the per-seed median"))

    # 4. construction + first touch
    def fills(case, lay):
        xs = [n for n in present if mean(case, n, lay, "first_fill_s")]
        ff, rf = ([cellv(cells, case, n, lay, p) for n in xs] for p in ("first_fill_s", "refill_s"))
        cm = [cellv(cells, case, n, lay, "construct_ms")["mean"] / 1e3 for n in xs]
        x, cs = np.arange(len(xs)), [COLORS[n] for n in xs]
        return partial(bar_series, ticks=(x, xs), tick_kw={"rotation": 30, "fontsize": 8}, ylabel="seconds",
                       legend={"fontsize": 7}, title=f"{case} {lay.upper()}, {ROWS[mode][case]:,} rows: fill with extend",
                       series=[{"at": x - 0.2, "heights": cm, "width": 0.4, "color": "none", "edgecolor": "k",
                                "hatch": "xx", "label": "construction"},
                               {"at": x - 0.2, "heights": [c["mean"] for c in ff], "width": 0.4, "bottom": cm,
                                "yerr": [c["std"] for c in ff], "color": cs, "capsize": 3,
                                "label": "first fill (pages faulted in)"},
                               {"at": x + 0.2, "heights": [c["mean"] for c in rf], "width": 0.4,
                                "yerr": [c["std"] for c in rf], "color": cs, "alpha": 0.45, "capsize": 3,
                                "label": "second fill (resident)"}])
    files.append(panels_figure(out_dir, "first_touch.png", (15, 4.3),
                               [fills(*g) for g in (("cartpole", "aos"), ("cartpole", "soa"), ("image", "aos"))],
                               suptitle="Construction + first fill (first touch) against a second fill of the same "
                                        "buffer, mean ± std over seeds"))

    # 5. churn: RSS over the run, one line per seed
    by_count, by_time = [], []
    for n in present:
        for i, r in enumerate(cell_runs(raw, "churn", n, None)):
            tr = r["result"]["trace"]
            kw = dict(color=COLORS[n], lw=1, alpha=0.9 if i == 0 else 0.35, label=n if i == 0 else None)
            rss = np.array(tr["rss_over_baseline"]) / (1 << 20)
            by_count.append((np.array(tr["allocations"]), rss, kw))
            by_time.append((tr["t_s"], rss, kw))
            if len(by_count) == 1:
                by_count.append((np.array(tr["allocations"]), np.array(tr["live_bytes"]) / (1 << 20),
                                 dict(color="k", ls="--", lw=1, label=f"live bytes (seed {r['seed']})", zorder=10)))
    ylabel, c = "RSS above the baseline (MiB)", CHURN[mode]
    files.append(panels_figure(out_dir, "churn_rss.png", (14, 4.8), [
        partial(traces, lines=by_count, xlabel="allocations", ylabel=ylabel, legend={"fontsize": 8}),
        partial(traces, lines=by_time, xlabel="seconds (snapshot time excluded)", ylabel=ylabel)],
        suptitle=f"Churn: {c['allocations']:,} allocations of 4 KiB-4 MiB (log-uniform), window of "
                 f"{c['window']} live arrays; one line per seed"))
    return files


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def consistent_diffs(cells, case, names, lays, path):
    """[(name, layout, rel)] of allocators whose difference to numpy on ``path`` is consistent."""
    out = []
    for lay in lays:
        for n in names:
            if n == REFERENCE:
                continue
            cmp = cells.get(f"{case}/{n}/{lay}", {}).get("vs_" + REFERENCE, {}).get(path)
            if cmp and cmp["consistent"]:
                out.append((n, lay, cmp["rel"]))
    return out


# -- the tables: (header, align, cell) per column of a record {"cells", "case", "name", "lay", "c"} --
def records(cells, names, where, metric: str) -> list:
    """One record per (case, allocator, layout) of ``where`` whose ``metric`` was measured."""
    return [{"cells": cells, "case": case, "name": n, "lay": lay, "c": cells[f"{case}/{n}/{lay}"]}
            for case, lay in where for n in names
            if f"{case}/{n}/{lay}" in cells and not math.isnan(cells[f"{case}/{n}/{lay}"][metric]["mean"])]


def F(path: str, scale: float = 1.0, digits: int = 1, rel: bool = True):
    """A cell: mean ± std of ``path`` (and the difference to numpy)."""
    return lambda r: fmt(r["cells"], r["case"], r["name"], r["lay"], path, scale, digits, rel)


def M(path: str, digits: int = 1, mean_only: bool = False):
    """A cell: ``path`` in MiB, its mean only or mean ± std."""
    return lambda r: mib(r["c"][path]["mean"]) if mean_only else ms(r["c"][path], 1 / (1 << 20), digits)


NAME, LAYOUT = ("allocator", "l", "{name}"), ("layout", "l", lambda r: r["lay"].upper())
HUGE_GAIN = ("huge pages after fill (MiB)", "r", lambda r: mib(r["c"]["huge_after_fill"]["mean"]
                                                             - r["c"]["huge_baseline"]["mean"]))
BUFFER_COLUMNS = [NAME, LAYOUT, ("construct (ms)", "r", F("construct_ms", digits=2, rel=False)),
                  ("first fill (s)", "r", F("first_fill_s", digits=3)),
                  ("construct + first fill (s)", "r", F("construct_and_first_fill_s", digits=3)),
                  ("second fill (s)", "r", F("refill_s", digits=3)),
                  ("minor faults, first fill", "r", lambda r: f"{r['c']['minor_faults_first_fill']['mean']:,.0f}"),
                  ("RSS after construct (MiB)", "r", M("rss_after_construct_over_baseline", mean_only=True)),
                  ("peak RSS above baseline (MiB)", "r", M("peak_rss_fill_over_baseline", mean_only=True)),
                  ("buffer nbytes (MiB)", "r", M("nbytes", mean_only=True)), HUGE_GAIN]
STEADY_COLUMNS = [NAME, LAYOUT, ("extend (M rows/s, second fill)", "r", F("extend_rows_per_s", 1e-6, 2)),
                  ("push (k rows/s)", "r", F("push_per_s", 1e-3, 1)),
                  ("sample(4096) p50 (µs)", "r", F("gather.4096.p50_us")),
                  ("sample(4096) p99 (µs)", "r", F("gather.4096.p99_us")),
                  ("sample(4096) first call (µs)", "r", F("gather.4096.first_call_us", digits=0, rel=False))]
LATENCY_COLUMNS = [NAME, LAYOUT] + [(f"{q} (µs)", "r", F(f"sample256_latency.{k}_us", digits=2))
                                    for q, k in (("p50", "p50"), ("p99", "p99"), ("p99.9", "p999"), ("mean", "mean"))]
GATHER_COLUMNS = [("case", "l", lambda r: f"{r['case']} {r['lay'].upper()}"), NAME,
                  ("buffer (MiB)", "r", M("nbytes", mean_only=True)), HUGE_GAIN,
                  ("sample(256) p50 (µs)", "r", lambda r: F("sample256_latency.p50_us" if r["case"] == "cartpole"
                                                             else "gather.256.p50_us")(r)),
                  ("sample(4096) p50 (µs)", "r", F("gather.4096.p50_us")),
                  ("sample(4096) p99 (µs)", "r", F("gather.4096.p99_us")),
                  ("rows/s at 4096 (M)", "r", lambda r: f"{4096 / (r['c']['gather.4096.p50_us']['mean'] / 1e6) / 1e6:.2f}")]
CHURN_COLUMNS = [NAME, ("allocations/s", "r", F("allocations_per_s", digits=0)),
                 ("live bytes at end", "r", M("live_bytes_end")), ("RSS at end", "r", M("rss_end_over_baseline")),
                 ("fragmentation (RSS / live)", "r", lambda r: ms(r["c"]["fragmentation_end"], digits=2)),
                 ("peak RSS", "r", M("peak_rss_over_baseline")),
                 ("RSS growth, 2nd half", "r", M("rss_growth_second_half")),
                 ("after trim (window alive)", "r", M("rss_after_trim_live_over_baseline")),
                 ("after free", "r", M("rss_after_free_over_baseline")),
                 ("after free + trim", "r", M("rss_after_free_trim_over_baseline")), ("huge pages at end", "r", M("huge_end")),
                 ("library's own figure at end (× live)", "r",
                  lambda r: "–" if math.isnan(r["c"]["library_own_over_live_end"]["mean"]) else
                  f"{M('library_own_bytes_end')(r)} ({r['c']['library_own_over_live_end']['mean']:.2f}×)"),
                 ("RSS − library's own figure", "r",
                  lambda r: "–" if math.isnan(r["c"]["rss_minus_library_end"]["mean"]) else M("rss_minus_library_end")(r))]


def headline(cells, names) -> str:
    """One line for the reports index, from the measured cells."""
    steady = ("sample256_latency.p50_us", "sample256_latency.p99_us", "gather.4096.p50_us",
              "extend_rows_per_s", "push_per_s")
    diffs = [d for p in steady for d in consistent_diffs(cells, "cartpole", names, LAYOUTS, p)]
    parts = [f"steady state on 1M CartPole rows (sample, extend, push): {len(diffs)} of "
             f"{len(steady) * 2 * (len(names) - 1)} allocator/layout/metric comparisons with numpy "
             "differ consistently across seeds"]
    p = "gather.4096.p50_us"
    if have_cell(cells, "image", "hugepages", "aos", p) and have_cell(cells, "image", "nohugepages", "aos", p):
        h = cellv(cells, "image", "hugepages", "aos", p)["mean"]
        nh = cellv(cells, "image", "nohugepages", "aos", p)["mean"]
        size = tmem.format_bytes(cellv(cells, "image", "hugepages", "aos", "nbytes")["mean"])
        parts.append(f"huge pages: sample(4096) from a {size} buffer {nh / h:.2f}x slower without them")
    fr = [f"{n} {cellv(cells, 'churn', n, None, 'fragmentation_end')['mean']:.2f}x"
          for n in names if have_cell(cells, "churn", n, None, "fragmentation_end")]
    if fr:
        parts.append("churn RSS / live bytes: " + ", ".join(fr))
    return "; ".join(parts) + "."


def have_cell(cells, case, name, lay, path) -> bool:
    c = cellv(cells, case, name, lay, path)
    return c is not None and c.get("mean") is not None and not math.isnan(c["mean"])


def write_report(out_dir, run, raw, cells, names, skipped, failed, files, mode, extra) -> None:
    L = []
    L.append("# Allocators: does the allocator behind tfdata's arrays matter, and where?\n")
    L.append(f"Made by `experiments/allocators.py` ({mode} run, command `{run['command']}`, "
             f"{len(run['seeds'])} seeds, {run['wall_clock_s']:.0f} s). Raw numbers: `results.json` beside "
             "this file. " + ("This is the quick mode's report (`reports/alloc/quick/`); the full run writes "
                              "`reports/alloc/`." if mode == "quick" else
                              "`--quick` runs write `reports/alloc/quick/` instead, so they never replace "
                              "this report."))
    L.append("")
    L.append(f"<!-- headline: {headline(cells, names)} -->\n")
    L.extend(hand_written(out_dir, "question"))
    L.extend(hand_written(out_dir, "findings"))
    if skipped:
        L.append("Skipped allocators: " + "; ".join(f"**{n}**: {w}" for n, w in skipped.items()) + "\n")
    if failed:
        L.append("Failed measurements: " + "; ".join(failed) + "\n")
    L.extend(hand_written(out_dir, "method"))
    L.append("## 1. Construction and first touch\n")
    L.append("![first_touch.png](first_touch.png)\n")
    L.append(f"**cartpole, {ROWS[mode]['cartpole']:,} rows**\n")
    L += table(records(cells, names, [("cartpole", lay) for lay in LAYOUTS], "first_fill_s"), BUFFER_COLUMNS)
    L.append("")
    L.append(f"**image, {ROWS[mode]['image']:,} rows**\n")
    L += table(records(cells, names, [("image", "aos")], "first_fill_s"), BUFFER_COLUMNS)
    L.append("")
    L.append("## 2. Steady-state throughput (cartpole)\n")
    L.append("![steady_state.png](steady_state.png)\n")
    L += table(records(cells, names, [("cartpole", lay) for lay in LAYOUTS], "push_per_s"), STEADY_COLUMNS)
    L.append("")
    L.append("## 3. sample(256) latency distribution (cartpole)\n")
    L.append("![latency_sample256.png](latency_sample256.png)\n")
    L.append(f"{LAT_CALLS[mode]:,} calls per seed, each timed alone.\n")
    L += table(records(cells, names, [("cartpole", lay) for lay in LAYOUTS], "sample256_latency.p50_us"),
               LATENCY_COLUMNS)
    L.append("")
    L.append("## 4. Huge pages and random gathers\n")
    L.append("![gather_hugepages.png](gather_hugepages.png)\n")
    L.append("Median time of one call (per seed, then mean ± std across seeds); huge pages = AnonHugePages "
             "gained between the start of the phase and the end of the fill.\n")
    L += table(records(cells, names, [("cartpole", "aos"), ("cartpole", "soa"), ("image", "aos")], "gather.4096.p50_us"),
               GATHER_COLUMNS)
    L.append("")
    L.append("## 5. Churn: allocating every batch\n")
    L.append("![churn_rss.png](churn_rss.png)\n")
    L.append(f"Mean requested size {extra.get('churn_mean_size', float('nan')) / 1024:.0f} KiB. RSS values "
             "are above the RSS just before the loop (MiB).\n")
    L += table(records(cells, names, [("churn", None)], "allocations_per_s"), CHURN_COLUMNS)
    L.append("")
    L.extend(hand_written(out_dir, "limitations"))
    L.append(f"Share of the CPUs used by other processes while a measurement process ran (`results.json`, "
             f"`other_processes_cpu_share`): mean {extra.get('mean_other_share', float('nan')) * 100:.0f}%, "
             f"maximum {extra.get('max_other_share', float('nan')) * 100:.0f}%.\n")
    per_seed = {}
    for r in raw:
        v = r.get("result", {}).get("other_processes_cpu_share")
        if v is not None:
            per_seed.setdefault(r["seed"], []).append(v)
    if per_seed:
        L.append("Mean share of the CPUs used by other processes while each seed's measurements ran: "
                 + ", ".join(f"seed {s} {100 * np.mean(v):.0f}%" for s, v in sorted(per_seed.items()))
                 + ". On 2 CPUs, 50% is one core kept busy by something else.")
    L.append("")
    L.append("## Machine and run\n")
    thp = extra.get("thp", {})
    L.append("Transparent huge pages: " + ", ".join(f"`{k}` = {v}" for k, v in thp.items()) + ". "
             "Allocator libraries (Debian package versions): "
             + ", ".join(f"{k} {v}" for k, v in extra.get("library_versions", {}).items()) + ".\n")
    L.append(methodology_markdown(run))
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(L))


def print_summary(cells, names) -> None:
    print(f"\n{'cell':<32}{'first fill s':>14}{'extend Mrow/s':>15}{'s256 p50':>10}{'p99':>9}{'s4096 p50':>11}")
    for case in ("cartpole", "image"):
        for lay in CASE_LAYOUTS[case]:
            for n in names:
                c = cells.get(f"{case}/{n}/{lay}")
                if not c or math.isnan(c["first_fill_s"]["mean"]):
                    continue
                p50 = c.get("sample256_latency.p50_us") or c.get("gather.256.p50_us")
                p99 = c.get("sample256_latency.p99_us") or c.get("gather.256.p99_us")
                print(f"{case + '/' + n + '/' + lay:<32}{c['first_fill_s']['mean']:>14.3f}"
                      f"{c['extend_rows_per_s']['mean'] / 1e6:>15.2f}{p50['mean']:>10.1f}{p99['mean']:>9.1f}"
                      f"{c['gather.4096.p50_us']['mean']:>11.1f}")
    for n in names:
        c = cells.get(f"churn/{n}/None")
        if c and not math.isnan(c["allocations_per_s"]["mean"]):
            print(f"churn/{n:<26}{c['allocations_per_s']['mean']:>10.0f} alloc/s  fragmentation "
                  f"{c['fragmentation_end']['mean']:.2f}  peak {mib(c['peak_rss_over_baseline']['mean'])} MiB")
    print(flush=True)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
def main(argv=None) -> None:
    ap = seeds_parser(__doc__, "small sizes, 2 seeds (a few minutes)", "number of seeds (0..N-1) or a comma list")
    ap.add_argument("--allocators", default=None, help=f"comma list, subset of {','.join(ALLOCATORS)}")
    ap.add_argument("--cases", default="cartpole,image,churn", help="comma list of cartpole,image,churn")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        worker(json.loads(args.worker))
        return
    if args.render is not None:
        render(args.render)
        return

    names = list(ALLOCATORS)
    if args.allocators:
        names = [n.strip().lower() for n in args.allocators.split(",") if n.strip()]
        bad = [n for n in names if n not in ALLOCATORS]
        if bad:
            raise SystemExit(f"--allocators: unknown {bad}; choose from {','.join(ALLOCATORS)}")
        if REFERENCE not in names:
            print(f"note: {REFERENCE} is not in --allocators: no differences against it are computed",
                  file=sys.stderr)
    if "jemalloc" in names:
        talloc.reexec_with_tunables()  # replaces this process when the tunable is missing
    mode = "quick" if args.quick else "full"
    seeds = parse_seeds(args.seeds, SEEDS[mode])
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    out_dir = OUT_DIRS[mode]
    os.makedirs(out_dir, exist_ok=True)
    argv_shown = [a for a in (sys.argv[1:] if argv is None else argv)]
    command = " ".join(["python experiments/allocators.py", *argv_shown])
    params = {"allocators": names, "reference": REFERENCE, "layouts": LAYOUTS, "specs": SPECS,
              "rows": ROWS[mode], "case_layouts": CASE_LAYOUTS, "fill_chunk": FILL_CHUNK,
              "pushes": PUSHES[mode], "latency_batch": LAT_BATCH, "latency_calls": LAT_CALLS[mode],
              "gather_batches": GATHER_BATCHES, "gather_seconds": GATHER_SECONDS[mode],
              "gather_min_calls": GATHER_MIN, "churn": CHURN[mode], "churn_size_range": [CHURN_MIN, CHURN_MAX],
              "churn_points": CHURN_POINTS, "margin": MARGIN, "cases": cases, "tunable": talloc.TUNABLE}
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=seeds, command=command, parameters=params)
    log = lambda msg: print(f"[{rec.elapsed():7.1f}s] {msg}", file=sys.stderr, flush=True)  # noqa: E731

    skipped = {}
    for n in names:
        ok, why = talloc.available(n)
        if not ok:
            skipped[n] = why
            log(f"skipping {n}: {why}")
    usable = [n for n in names if n not in skipped]
    jobs = []
    for case in cases:
        if case == "churn":
            jobs += [("churn", n, None) for n in usable]
        else:
            jobs += [(case, n, lay) for lay in CASE_LAYOUTS[case] for n in usable]
    log(f"run {rec.run_name}: {len(jobs)} jobs x {len(seeds)} seeds, output {os.path.relpath(out_dir, ROOT)}")

    raw, failed = [], []
    for si, seed in enumerate(seeds):
        order = rotated(jobs, si * max(1, len(jobs) // max(1, len(seeds))) + si)
        if si % 2:
            order.reverse()
        t_seed = time.perf_counter()
        for case, n, lay in order:
            job = {"case": case, "allocator": n, "layout": lay, "seed": seed, "mode": mode}
            out = run_worker(job, log)
            entry = {"case": case, "allocator": n, "layout": lay, "seed": seed}
            if "failed" in out:
                entry["failed"] = out["failed"]
                failed.append(f"{case}/{n}/{lay} seed {seed}: {out['failed']}")
            elif "skipped" in out:
                entry["skipped"] = out["skipped"]
                skipped.setdefault(n, out["skipped"])
            else:
                entry["result"] = out
            raw.append(entry)
        log(f"seed {seed} done in {time.perf_counter() - t_seed:.0f} s (load {os.getloadavg()[0]:.2f})")

    shares = [r["result"]["other_processes_cpu_share"] for r in raw
              if "result" in r and r["result"].get("other_processes_cpu_share") is not None]
    churn_sizes = [r["result"]["mean_size"] for r in raw if r["case"] == "churn" and "result" in r]
    extra = {"thp": thp_settings(), "library_versions": library_versions(("libjemalloc2", "libmimalloc2.0", "libc6")),
             "mean_other_share": float(np.mean(shares)) if shares else float("nan"),
             "max_other_share": float(np.max(shares)) if shares else float("nan"),
             "churn_mean_size": float(np.mean(churn_sizes)) if churn_sizes else float("nan")}
    child_peaks = [r["result"].get("worker_peak_rss") for r in raw if "result" in r]
    run = rec.finish(child_peak_rss_bytes=max([p for p in child_peaks if p] or [0]) or None)
    files = outputs(out_dir, run, raw, usable, skipped, failed, extra)
    rel = os.path.relpath(out_dir, ROOT)
    print(f"{mode} run {rec.run_name} done in {run['wall_clock_s']:.0f} s; report: {rel}/README.md, "
          f"data: {rel}/results.json, plots: {', '.join(files)}", flush=True)


def outputs(out_dir, run, raw, names, skipped, failed, extra) -> list:
    """Aggregate, print, plot, and write results.json and README.md into ``out_dir``."""
    mode = run["mode"]
    for r in raw:  # the library's own resident figure at the end of a churn, where it reports one
        x = r.get("result")
        if r["case"] == "churn" and x:
            st = x.get("allocator_stats_end", {})
            own = st.get("resident", st.get("commit"))
            if own is not None and own >= 0:
                x["library_own_bytes_end"] = own
                x["library_own_over_live_end"] = own / x["live_bytes_end"]
                x["rss_minus_library_end"] = x["rss_end_over_baseline"] - own
    cells = aggregate(raw, names)
    print_summary(cells, names)
    files = plot(raw, cells, names, out_dir, mode)
    drop_stale_plots(out_dir, files)
    write_json(os.path.join(out_dir, "results.json"),
               {"methodology": run, "system": extra, "skipped": skipped, "failed": failed,
                "cells": cells, "raw": raw})
    write_report(out_dir, run, raw, cells, names, skipped, failed, files, mode, extra)
    return files


def render(path: str) -> None:
    """Redo the tables, plots and report from a results.json (no measurement)."""
    d = read_results(path)
    run = d["methodology"]
    skipped = d.get("skipped", {})
    names = [n for n in run["parameters"]["allocators"] if n not in skipped]
    outputs(os.path.dirname(os.path.abspath(path)), run, d["raw"], names, skipped, d.get("failed", []),
            d["system"])


if __name__ == "__main__":
    main()
