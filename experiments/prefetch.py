"""Prefetch: how much of the data loading does the DataLoader's background thread hide from a
training step, and what does it cost a loop that only reads batches?

A self-contained experiment (one file, parameters at the top, cleanrl style). A consumer loop
stands in for a training step of fixed duration while a ``tfdata.DataLoader`` over a
memory-mapped file (``tfdata.io.create`` + ``tfdata.MmapDataset.open``) prepares the batches.
For every configuration it records the share of the epoch the consumer spends waiting inside
``next(it)`` ("stall %", the analog of GPU idle time), the per-batch wait latency (median, p99)
and the wall clock of the epoch.

Grid: case (Atari-like rows with the loader's defaults; the same rows with the resident set
bounded to 64 MiB; CartPole-like rows) x order (shuffled, sequential) x consumer (sleep;
busy numpy matmul loop, which releases the GIL; busy pure-Python loop, which holds it) x step
duration (multiples of the measured prefetch=0 gather time of that case and layout) x layout
(aos, soa) x prefetch depth (0, 1, 2, 4). Then, with no step at all (a consumer that only asks for
batches): rows/s of every depth against depth 0, side by side, CartPole rows in every order,
batch 64 to 4096 (the loader must never be slower with prefetch than without).

    python experiments/prefetch.py --quick      # about a minute: small files, 2 seeds
    python experiments/prefetch.py              # the full run, under ~10 minutes, 5 seeds
    python experiments/prefetch.py --seeds 0,1,2

Writes only under ``reports/prefetch/``: ``README.md``, ``results.json`` and ``*.png`` (the last
run wins). The dataset files live in a temporary directory that is deleted at the end. Only the
public tfdata API is used, plus numpy, psutil (through the shared methodology) and matplotlib.
"""

from __future__ import annotations

import os

# One BLAS thread, set before numpy is imported: the "numpy" consumer stands for a training step
# that keeps one core busy, and the prefetch thread gets the other core of a 2-core machine. An
# explicit setting in the environment wins (and is recorded).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import gc  # noqa: E402
import math  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from functools import partial  # noqa: E402

import numpy as np  # noqa: E402

import tfdata  # noqa: E402

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
from _plots import grid_figure, lines  # noqa: E402
from _recording import RunRecord, cpu_snapshot, drop_stale_plots, other_cpu_share, parse_seeds, read_results  # noqa: E402
from _recording import report_dir, seeds_parser  # noqa: E402
from _recording import write_json  # noqa: E402
from _render import fmt_bytes, hand_written, md_table, table, write_report as write_methodology_report  # noqa: E402
from _stats import mean_std  # noqa: E402
from _timing import SliceTimer, rotated, run_rounds  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "prefetch"
PREFETCH = (0, 1, 2, 4)
LAYOUTS = ("aos", "soa")
ORDERS = ("shuffled", "sequential")
CONSUMERS = ("sleep", "numpy", "python")
ROW_KINDS = {
    # a CartPole-v1 transition: 46 bytes of data, a 48-byte AoS record
    "cartpole": {"obs": ("f4", (4,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (4,)),
                 "terminated": "?", "truncated": "?"},
    # an Atari transition with obs and next_obs frame stacks: 56,462 bytes of data
    "image": {"obs": ("u1", (4, 84, 84)), "action": "i8", "reward": "f4",
              "next_obs": ("u1", (4, 84, 84)), "terminated": "?", "truncated": "?"},
}
DEFAULT = "default"  # resident_bytes left at the loader's default ("auto")
BOUND = 64 << 20     # the explicit resident bound of the "image-bounded" case
# A case is a row kind, a loader setting and the orders measured. With the loader's default
# (resident_bytes="auto") a shuffled epoch leaves the whole file mapped and a sequential one keeps
# about 64 MiB of a larger file mapped (pages behind are released, pages ahead read ahead). The
# image files are larger than 64 MiB: "image-bounded" sets resident_bytes=64 MiB explicitly, so a
# shuffled epoch measures the mapped bytes as it gathers and releases the whole map when they pass
# the bound (shuffled only). The cartpole files are under 64 MiB and stay mapped in any case.
CASES = {
    "image": {"kind": "image", "resident_bytes": DEFAULT, "orders": ("shuffled", "sequential")},
    "image-bounded": {"kind": "image", "resident_bytes": BOUND, "orders": ("shuffled",)},
    "cartpole": {"kind": "cartpole", "resident_bytes": DEFAULT, "orders": ("shuffled", "sequential")},
}
# Batch sizes: large enough that a shuffled gather takes a few hundred µs, so that steps of
# 0.5x its duration are still longer than the overshoot of time.sleep (~80 µs here).
BATCH = {"cartpole": 8192, "image": 64}
# Rows per file: 64 batches per epoch in full mode (image 231 MB, cartpole 25 MB per layout),
# 20 in quick mode (image 72 MB, still above the 64 MiB bound; cartpole 8 MB).
ROWS = {"full": {"cartpole": 524_288, "image": 4096},
        "quick": {"cartpole": 163_840, "image": 1280}}
# Step duration = multiple x the shuffled prefetch=0 gather time of the (case, layout).
# 1.2x: the target, prefetch hides >= 90% of the gather time once the step is 1.2x the gather
STEP_MULTS = {"full": (0.5, 1.2, 2.0), "quick": (0.5, 1.2, 2.0)}
HIDDEN_TARGET = 0.9
# the no-op consumer: rows/s of every depth vs depth 0 (target >= 0.9x), CartPole rows
COST_BATCHES = (64, 256, 1024, 4096)
COST_ORDERS = {"sequential": False, "shuffled": True, "block": "block"}
COST_ROUNDS = {"full": 41, "quick": 9}
COST_TARGET = 0.9
DEFAULT_SEEDS = {"full": 5, "quick": 2}
CALIB_EPOCHS = {"full": 5, "quick": 3}  # prefetch=0 epochs that measure the gather time (min)
MAIN = ("image", "shuffled", "aos")   # the headline: default loader, shuffled, default layout
MATMUL_N = 96        # float32 matrices of the numpy consumer: one matmul is ~15-30 µs
PY_CHUNK = 50        # loop iterations of the Python consumer between two clock reads (~2 µs)
MARGIN_PP = 2.0      # a stall difference counts when every seed agrees and it exceeds 2 points
PAGE = 4096

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = report_dir(EXPERIMENT)
MULT_COLORS = {0.25: "tab:gray", 0.5: "tab:red", 1.0: "tab:orange", 1.2: "tab:orange", 2.0: "tab:green",
               4.0: "tab:blue"}
LAYOUT_COLORS = {"aos": "tab:blue", "soa": "tab:orange"}
LNAME = {"aos": "AoS", "soa": "SoA"}


def case_label(case: str) -> str:
    c = CASES[case]
    rb = ("loader defaults" if c["resident_bytes"] == DEFAULT
          else f"resident_bytes={fmt_bytes(c['resident_bytes'])}" if c["resident_bytes"] else "resident_bytes=None")
    return f"{c['kind']} rows, {rb}"


def loader_options(case: str) -> dict:
    rb = CASES[case]["resident_bytes"]
    return {} if rb == DEFAULT else {"resident_bytes": rb}


def case_orders():
    return [(case, o) for case in CASES for o in CASES[case]["orders"]]


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
def make_spec(kind: str) -> tfdata.Spec:
    return tfdata.Spec(ROW_KINDS[kind])


def create_file(directory: str, kind: str, layout: str, rows: int, seed: int) -> str:
    """Write a dataset of ``rows`` random rows with ``tfdata.io.create``, 8 MiB at a time."""
    spec = make_spec(kind)
    path = os.path.join(directory, f"{kind}_{layout}" + (".npy" if layout == "aos" else ""))
    cols = tfdata.io.create(path, spec, rows, layout=layout)
    rng = np.random.default_rng([seed, list(ROW_KINDS).index(kind)])
    chunk = max(1, (8 << 20) // spec.row_nbytes)
    for s in range(0, rows, chunk):
        e = min(rows, s + chunk)
        for f in spec:
            shape = (e - s,) + f.shape
            if f.dtype == np.uint8:
                cols[f.name][s:e] = rng.integers(0, 256, shape, dtype=np.uint8)
            elif f.dtype.kind == "f":
                cols[f.name][s:e] = rng.standard_normal(shape, dtype=np.float32)
            elif f.dtype.kind == "b":
                cols[f.name][s:e] = rng.random(shape) < 0.05
            else:
                cols[f.name][s:e] = rng.integers(0, 2, shape)
    for v in cols.values():
        if hasattr(v, "flush"):
            v.flush()
    del cols  # unmap: the data is in the file
    return path


def file_bytes(path: str) -> int:
    if os.path.isdir(path):
        return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path))
    return os.path.getsize(path)


# ---------------------------------------------------------------------------------------------
# The consumer: touch the batch, then a step of fixed duration
# ---------------------------------------------------------------------------------------------
def touch_batch(batch) -> int:
    """Read one element per 4 KiB page of every field of the batch (a few µs when mapped).

    A zero-copy batch is a view of the file: its pages may not be mapped yet, and a real step
    reads them. This makes those page faults land where a real step would meet them, without
    adding the cost of a full copy. Timed separately from the step's compute.
    """
    acc = 0
    for arr in batch.values():
        if arr.shape[0] == 0:
            continue
        a = arr.reshape(arr.shape[0], -1)  # a view: inner dimensions are contiguous
        if a.shape[1] == 0:
            continue
        rs = max(1, PAGE // max(1, abs(arr.strides[0])))
        cs = max(1, PAGE // a.itemsize)
        acc += int(np.count_nonzero(a[::rs, ::cs]))
    return acc


_A = np.random.default_rng(0).standard_normal((MATMUL_N, MATMUL_N), dtype=np.float32)
_B = _A.T.copy()
_C = np.empty_like(_A)
_pc = time.perf_counter_ns


# Every step lasts a fixed time: it runs until ``deadline`` (a perf_counter_ns value) and returns
# the units of work it did, so a step slowed by the loader shows as less work, not a longer step.
def work_sleep(deadline: int, overshoot_ns: int = 0) -> int:
    left = deadline - _pc() - overshoot_ns
    if left > 0:
        time.sleep(left / 1e9)  # sleeps without the GIL
    return 0


def work_numpy(deadline: int, overshoot_ns: int = 0) -> int:
    a, b, c, mm, pc = _A, _B, _C, np.matmul, _pc
    n = 0
    while pc() < deadline:
        mm(a, b, out=c)  # float32 BLAS: numpy releases the GIL inside
        n += 1
    return n


def work_python(deadline: int, overshoot_ns: int = 0) -> int:
    pc = _pc
    n = 0
    while pc() < deadline:  # bytecode: holds the GIL (dropped on the 5 ms switch request only)
        x = 0
        for i in range(PY_CHUNK):
            x += i
        n += 1
    return n


WORK = {"sleep": work_sleep, "numpy": work_numpy, "python": work_python}


def calibrate_consumers() -> dict:
    """Wake-up overshoot of time.sleep, and the work rate of the busy steps alone (no loader)."""
    req = 300_000
    xs = []
    for _ in range(60):
        t0 = _pc()
        time.sleep(req / 1e9)
        xs.append(_pc() - t0 - req)
    out = {"sleep_overshoot_ns": int(np.median(xs))}
    for name in ("numpy", "python"):
        rates = []
        for _ in range(7):
            t0 = _pc()
            n = WORK[name](t0 + 5_000_000)
            rates.append(n / ((_pc() - t0) / 1e9))
        out[f"{name}_units_per_s"] = float(np.median(rates))
    return out


# ---------------------------------------------------------------------------------------------
# One epoch
# ---------------------------------------------------------------------------------------------
def prepare_residency(ds, loader) -> None:
    """Put the map in the same state before every timed epoch, whatever ran before it.

    A file above the loader's resident bound starts with nothing mapped (``release_all``, as the
    loader itself leaves it after a release); any other file starts fully mapped (``touch``), the
    steady state of a dataset the loader never releases.
    """
    cfg = loader.config
    bound = getattr(cfg, "resident_limit", cfg.resident_bytes)  # "auto" resolved for this order
    bound = bound if isinstance(bound, (int, np.integer)) else None
    if bound is not None and ds.mapped_nbytes > bound:
        ds.release_all()
    else:
        ds.touch(0, len(ds))


def run_epoch(ds, case: str, order: str, prefetch: int, seed: int, consumer: str | None,
              step_ns: int = 0, overshoot_ns: int = 0, check: bool = False) -> dict:
    """One timed epoch; every wait, touch and step timed.

    The loader is used as a training loop uses it: its first epoch (epoch 0 of ``seed``) is
    started untimed and closed after ``prefetch + 2`` batches (so the ring buffers have been
    written once, as after any earlier epoch); the timed epoch is epoch 1, which the loader
    starts from scratch (permutation, thread start, first gather). All depths of a seed see the
    same batches.
    """
    kind = CASES[case]["kind"]
    loader = tfdata.DataLoader(ds, BATCH[kind], shuffle=(order == "shuffled"), seed=seed,
                               prefetch=prefetch, **loader_options(case))
    n = len(loader)
    warm = iter(loader)
    for _ in range(min(n, prefetch + 2)):
        next(warm)
    warm.close()
    del warm
    prepare_residency(ds, loader)
    waits = np.zeros(n, np.int64)
    touches = np.zeros(n, np.int64)
    steps = np.zeros(n, np.int64)
    units = np.zeros(n, np.int64)
    work = WORK[consumer] if consumer else None
    seen = np.zeros(len(ds), np.int64) if check else None
    pc = _pc
    gc.collect()
    gc.disable()
    try:
        t0 = pc()
        it = iter(loader)
        t_iter = pc()
        k = 0
        t_first = t_last = t_iter
        while True:
            a = pc()
            try:
                batch = next(it)
            except StopIteration:
                t_stop = pc() - a
                break
            b = pc()
            touch_batch(batch)
            c = pc()
            if work is not None:
                units[k] = work(c + step_ns, overshoot_ns)
            d = pc()
            waits[k], touches[k], steps[k] = b - a, c - b, d - c
            if k == 0:
                t_first = b
            t_last = d
            if check:
                np.add.at(seen, batch.indices, 1)
            k += 1
        t_end = pc()
    finally:
        gc.enable()
        loader.close()
    if k != n:
        raise RuntimeError(f"{case}/{order}/prefetch={prefetch}: {k} batches, expected {n}")
    if check and not (seen == 1).all():
        raise RuntimeError(f"{case}/{order}/prefetch={prefetch}: the epoch did not yield every row "
                           f"exactly once ({int((seen == 0).sum())} missing, {int((seen > 1).sum())} repeated)")
    epoch = t_end - t0
    stall = (t_iter - t0) + int(waits.sum()) + t_stop
    steady_window = t_last - t_first
    w_us = waits / 1e3
    rest = w_us[1:] if n > 1 else w_us
    step_total = int(steps.sum())
    return {
        "batches": n,
        "epoch_s": epoch / 1e9,
        "stall_pct": 100.0 * stall / epoch,
        "stall_steady_pct": (100.0 * int(waits[1:].sum()) / steady_window if steady_window > 0
                             else float("nan")),
        "stall_touch_pct": 100.0 * (stall + int(touches.sum())) / epoch,
        "first_wait_us": ((t_iter - t0) + waits[0]) / 1e3,
        "iter_us": (t_iter - t0) / 1e3,
        "stop_us": t_stop / 1e3,
        "wait_median_us": float(np.median(w_us)),
        "wait_mean_us": float(w_us.mean()),
        "wait_steady_mean_us": float(rest.mean()),
        "wait_steady_median_us": float(np.median(rest)),
        "wait_steady_p99_us": float(np.percentile(rest, 99)),
        "wait_steady_max_us": float(rest.max()),
        "touch_median_us": float(np.median(touches) / 1e3),
        "touch_mean_us": float(touches.mean() / 1e3),
        "step_median_us": float(np.median(steps) / 1e3),
        "step_mean_us": float(steps.mean() / 1e3),
        "work_units_per_s": float(units.sum() / (step_total / 1e9)) if step_total > 0 else 0.0,
    }


def _forever(loader):
    """Batches of epoch after epoch, without end."""
    while True:
        yield from loader


def noop_cost(datasets: dict, rounds: int) -> dict:
    """Rows/s of every depth for a consumer that only calls ``next()`` (no touch, no step).

    For each (layout, order, batch), one running iterator per depth (epochs follow one another,
    so epoch starts are included in proportion), timed side by side: each round times a chunk of
    about 5 ms of batches of every depth (:class:`SliceTimer`, :func:`run_rounds`: the order
    rotates every round, odd rounds run backwards, garbage collector off). Returns
    ``{(layout, order, batch): {depth: {"rows_per_s", "ratio"}}}``: rows/s from the median chunk,
    the ratio to depth 0 the median over rounds of the two chunks' time ratio.
    """
    out = {}
    for lay in LAYOUTS:
        ds = datasets[("cartpole", lay)]
        for order, shuffle in COST_ORDERS.items():
            for batch in COST_BATCHES:
                per_chunk = None  # ~5 ms of depth 0's batches, sized on its untimed chunk
                timers = []
                for p in PREFETCH:
                    it = _forever(tfdata.DataLoader(ds, batch, shuffle=shuffle, seed=0, prefetch=p))

                    if per_chunk is None:
                        t0 = time.perf_counter_ns()
                        for _ in range(64):
                            next(it)
                        per_chunk = max(4, int(64 * 5e6 / max(time.perf_counter_ns() - t0, 1)))

                    def chunk(it=it, m=per_chunk):
                        for _ in range(m):
                            next(it)

                    chunk()  # untimed: the epoch under way, the pages mapped
                    timers.append(SliceTimer(chunk, [()], per_chunk, warmup=0, min_calls=1))
                run_rounds(timers, rounds, 1, lambda r: r)  # one chunk per depth per round
                base = np.array(timers[0].times_ns)
                # rows/s from the median chunk; the ratio paired by round (a slow spell of the
                # machine hits both chunks of a round)
                out[(lay, order, batch)] = {
                    p: {"rows_per_s": batch / (float(np.median(t.times_ns)) / 1e9),
                        "ratio": float(np.median(base / np.array(t.times_ns)))}
                    for p, t in zip(PREFETCH, timers)}
                del timers
                gc.collect()  # their iterators, and any prefetch thread, end here
    return out


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------
def model_stall(g: float, s: float) -> tuple[float, float]:
    """Stall % of an ideal loader with gather time g and step s: serial (prefetch=0) and fully
    overlapped (prefetch >= 1, a free core, no overhead)."""
    serial = 100.0 * g / (g + s)
    overlap = 100.0 * max(0.0, g - s) / max(g, s)
    return serial, overlap


METRICS = ("stall_pct", "stall_steady_pct", "stall_touch_pct", "epoch_s", "first_wait_us",
           "wait_median_us", "wait_steady_median_us", "wait_steady_p99_us", "wait_steady_max_us",
           "wait_steady_mean_us", "touch_median_us", "step_median_us", "step_mean_us",
           "work_units_per_s")


def key_of(c: dict) -> tuple:
    return (c["case"], c["order"], c["consumer"], c["mult"], c["layout"], c["prefetch"])


def aggregate(raw: list[dict], calib: dict) -> list[dict]:
    groups: dict = {}
    for r in raw:
        groups.setdefault(key_of(r), []).append(r)
    case_names = list(CASES)
    cells = []
    for key in sorted(groups, key=lambda k: (case_names.index(k[0]), ORDERS.index(k[1]),
                                             CONSUMERS.index(k[2]), k[3], LAYOUTS.index(k[4]), k[5])):
        case, order, consumer, mult, layout, p = key
        runs = sorted(groups[key], key=lambda r: r["seed"])
        c = {"case": case, "order": order, "consumer": consumer, "mult": mult, "layout": layout,
             "prefetch": p, "seeds": [r["seed"] for r in runs], "step_target_us": runs[0]["step_target_us"],
             "batches": runs[0]["batches"]}
        for m in METRICS:
            c[m] = dict(zip(("mean", "std"), mean_std([r[m] for r in runs])))
            c[m]["per_seed"] = [r[m] for r in runs]
        cells.append(c)
    # paired comparisons with depth 0 and depth 1 of the same seed
    index = {key_of(c): c for c in cells}
    for c in cells:
        k = key_of(c)[:5]
        # the ideal loader, with g as the consumer met it in this configuration at depth 0 (the
        # gather time moves with the machine's load; the calibrated g only set the step)
        base = index.get(k + (0,))
        g = base["wait_steady_mean_us"]["mean"] if base is not None else calib[c["case"]][c["layout"]]["gather_us"]
        s = c["step_mean_us"]["mean"] + c["touch_median_us"]["mean"]
        c["gather_here_us"] = g
        c["model_stall_serial_pct"], c["model_stall_overlap_pct"] = model_stall(g, s)
        for name, ref in (("vs_p0", index.get(k + (0,))), ("vs_p1", index.get(k + (1,)))):
            if ref is None or ref is c:
                continue
            d = [a - b for a, b in zip(c["stall_pct"]["per_seed"], ref["stall_pct"]["per_seed"])]
            sp = [b / a for a, b in zip(c["epoch_s"]["per_seed"], ref["epoch_s"]["per_seed"])]
            c[name] = {"stall_diff_pp": mean_std(d), "stall_diff_per_seed": d,
                       "lower": bool(d) and all(x < -MARGIN_PP for x in d),
                       "higher": bool(d) and all(x > MARGIN_PP for x in d),
                       "epoch_speedup": mean_std(sp)}
        base = index.get(k + (0,))
        if base is not None and base is not c:
            red = [1 - a / b if b > 0 else float("nan")
                   for a, b in zip(c["stall_pct"]["per_seed"], base["stall_pct"]["per_seed"])]
            c["vs_p0"]["stall_reduction"] = mean_std(red)
            # the share of the depth-0 wait per batch (batches 2..n) this depth removes
            hid = [1 - a / b if b > 0 else float("nan")
                   for a, b in zip(c["wait_steady_mean_us"]["per_seed"], base["wait_steady_mean_us"]["per_seed"])]
            c["vs_p0"]["hidden"] = mean_std(hid)
            c["vs_p0"]["hidden_per_seed"] = hid
            if c["consumer"] != "sleep":
                rel = [a / b if b > 0 else float("nan")
                       for a, b in zip(c["work_units_per_s"]["per_seed"], base["work_units_per_s"]["per_seed"])]
                c["work_vs_p0"] = dict(zip(("mean", "std"), mean_std(rel)))
                c["work_vs_p0"]["per_seed"] = rel
    return cells


# ---------------------------------------------------------------------------------------------
# Formatting
# ---------------------------------------------------------------------------------------------
def fmt_us(x: float) -> str:
    if x is None or math.isnan(x):
        return "?"
    if x >= 10_000:
        return f"{x / 1000:.1f} ms"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def fmt_pm(m: dict, digits: int = 1) -> str:
    if m["mean"] is None or math.isnan(m["mean"]):
        return "?"
    return f"{m['mean']:.{digits}f} ± {m['std']:.{digits}f}"


def fmt_mult(m: float) -> str:
    return f"{m:g}x"


def reference_mult(mults) -> float:
    return 1.0 if 1.0 in mults else 1.2 if 1.2 in mults else max(mults)


def ref_depth() -> int:
    return 2 if 2 in PREFETCH else PREFETCH[-1]


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------
def _range_err(c: dict, metric: str):
    """Error bar from the smallest to the largest per-seed value (never below zero on a log axis)."""
    v = c[metric]["per_seed"]
    m = c[metric]["mean"]
    return [m - min(v)], [max(v) - m]


def plot(cells: list[dict], calib: dict, mults, mode: str, n_seeds: int) -> list[str]:
    """The report's figures: grids of panels of the generic kind ``_plots.lines`` (stall % and
    the wait in next() over the prefetch depth)."""
    idx = {key_of(c): c for c in cells}
    xs, depths = list(range(len(PREFETCH))), [str(p) for p in PREFETCH]
    files = []

    def stall(case, order, consumer, layout, i, j):
        series = []
        for mult in mults:
            cs = [idx[(case, order, consumer, mult, layout, p)] for p in PREFETCH]
            color = MULT_COLORS.get(mult)
            series.append({"y": [c["stall_pct"]["mean"] for c in cs], "yerr": [c["stall_pct"]["std"] for c in cs],
                           "marker": "o", "capsize": 3, "color": color,
                           "label": f"step {fmt_mult(mult)} ({fmt_us(cs[0]['step_target_us'])} µs)"})
            if order == "shuffled":
                series.append({"y": [cs[0]["model_stall_serial_pct"]] + [c["model_stall_overlap_pct"] for c in cs[1:]],
                               "plain": True, "ls": ":", "color": color, "alpha": 0.6})
        return partial(lines, xs=xs, xticks=depths, series=series, ylim=(0, 100),
                       title=f"{LNAME[layout]} (calibrated gather {fmt_us(calib[case][layout]['gather_us'])} µs/batch)"
                       if i == 0 else None, ylabel=f"{consumer} step: stall %" if j == 0 else None, ylabel_fontsize=9,
                       xlabel="prefetch depth" if i == len(CONSUMERS) - 1 else None,
                       legend={"fontsize": 7, "loc": "upper right"})
    for case, order in case_orders():
        model = ("\ndotted: ideal loader, g/(g+s) at depth 0 and max(0, g-s)/max(g, s) with full overlap "
                 "(g: mean wait at depth 0 of the same configuration)" if order == "shuffled" else "")
        files.append(grid_figure(
            OUT_DIR, f"stall_{case}_{order}.png", (10, 3.0 * len(CONSUMERS) + 1.3),
            [[stall(case, order, consumer, layout, i, j) for j, layout in enumerate(LAYOUTS)]
             for i, consumer in enumerate(CONSUMERS)], sharex=True, sharey=True, dpi=100, suptitle_fontsize=8.5,
            top=0.955 if order == "shuffled" else 0.965,
            suptitle=f"{case_label(case)}, {order} order, batch {BATCH[CASES[case]['kind']]}: stall % = time in next() "
                     f"/ epoch time\n{mode} run, {n_seeds} seeds, mean ± std across seeds; rows: sleep / numpy (GIL "
                     f"released) / pure Python (GIL held) step{model}"))

    ref = max(mults)  # the longest step: where the loader can keep up
    shuffled_cases = [case for case, o in case_orders() if o == "shuffled"]

    def latency(case, consumer, i, j):
        series = []
        for layout in LAYOUTS:
            cs = [idx[(case, "shuffled", consumer, ref, layout, p)] for p in PREFETCH]
            for metric, ls, mk, lab in (("wait_steady_median_us", "-", "o", "median"),
                                        ("wait_steady_p99_us", ":", "^", "p99")):
                err = [[_range_err(c, metric)[k][0] for c in cs] for k in (0, 1)]
                series.append({"y": [c[metric]["mean"] for c in cs], "yerr": err, "color": LAYOUT_COLORS[layout],
                               "ls": ls, "marker": mk, "capsize": 2, "label": f"{LNAME[layout]} {lab}"})
        return partial(lines, xs=xs, xticks=depths, series=series, yscale="log", grid_which="both",
                       title=f"{case}, {consumer} step", ylabel="wait in next(), µs (log)" if j == 0 else None,
                       xlabel="prefetch depth" if i == len(shuffled_cases) - 1 else None,
                       legend={"fontsize": 7} if i == 0 and j == 0 else None)
    files.append(grid_figure(
        OUT_DIR, "latency.png", (12, 3.2 * len(shuffled_cases) + 0.8),
        [[latency(case, consumer, i, j) for j, consumer in enumerate(CONSUMERS)] for i, case in enumerate(shuffled_cases)],
        sharex=True, sharey=True, dpi=100, suptitle_fontsize=9, top=0.955,
        suptitle=f"Per-batch wait in next() (batches 2..n of the epoch), shuffled order, step {fmt_mult(ref)} "
                 f"the gather time\n{mode} run, {n_seeds} seeds: mean of per-seed median / p99, bars from the "
                 "smallest to the largest seed"))
    return files


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
# -- the tables: (header, align, cell) per column (_render.table) -----------------------------
def _marked(s: str, v: dict | None) -> str:
    """A stall cell marked against depth 0: bold when lower in every seed, an arrow when higher."""
    return f"**{s}**" if v and v["lower"] else f"{s} ↑" if v and v["higher"] else s


def stall_table(idx, case, order, layout, mults, with_model: bool) -> list[str]:
    recs = [{"consumer": c, "mult": m, "cs": [idx[(case, order, c, m, layout, p)] for p in PREFETCH]}
            for c in CONSUMERS for m in mults]
    cols = [("consumer", "l", "{consumer}"), ("step", "l", lambda r: fmt_mult(r["mult"])),
            ("step µs", "r", lambda r: fmt_us(r["cs"][0]["step_target_us"]))]
    cols += [("g µs", "r", lambda r: fmt_us(r["cs"][0]["gather_here_us"]))] if with_model else []
    cols += [(f"depth {p}", "r", lambda r, k=k: _marked(fmt_pm(r["cs"][k]["stall_pct"]), r["cs"][k].get("vs_p0")))
             for k, p in enumerate(PREFETCH)]
    cols += [("ideal: serial / overlap", "r", lambda r: f"{r['cs'][0]['model_stall_serial_pct']:.0f} / "
              f"{r['cs'][1]['model_stall_overlap_pct']:.0f}")] if with_model else []
    return table(recs, cols)


def overview_table(idx, mults) -> list[str]:
    d = ref_depth()

    def cell(r, case, lay):
        c0, c = (idx[(case, "shuffled", r["consumer"], r["mult"], lay, p)] for p in (0, d))
        return _marked(f"{c0['stall_pct']['mean']:.0f} → {c['stall_pct']['mean']:.0f}", c["vs_p0"])
    cols = [(f"{case} {LNAME[lay]}", "r", lambda r, case=case, lay=lay: cell(r, case, lay))
            for case, o in case_orders() if o == "shuffled" for lay in LAYOUTS]
    return table([{"consumer": c, "mult": m} for c in CONSUMERS for m in mults],
                 [("consumer", "l", "{consumer}"), ("step", "l", lambda r: fmt_mult(r["mult"]))] + cols)


def _speedup(c) -> str:
    sp = c.get("vs_p0", {}).get("epoch_speedup")
    return "" if sp is None else f"{sp[0]:.2f}x"


DETAIL_COLUMNS = [("consumer", "l", "{consumer}"), ("step", "r", lambda c: fmt_mult(c["mult"])),
                  ("layout", "l", lambda c: LNAME[c["layout"]]), ("depth", "r", "{prefetch}"),
                  ("stall %", "r", lambda c: fmt_pm(c["stall_pct"])),
                  ("steady stall %", "r", lambda c: fmt_pm(c["stall_steady_pct"])),
                  ("stall + touch %", "r", "{stall_touch_pct[mean]:.1f}"),
                  ("first wait µs", "r", lambda c: fmt_us(c["first_wait_us"]["mean"])),
                  ("wait median µs", "r", lambda c: fmt_us(c["wait_steady_median_us"]["mean"])),
                  ("wait p99 µs", "r", lambda c: fmt_us(c["wait_steady_p99_us"]["mean"])),
                  ("epoch ms", "r", lambda c: f"{1e3 * c['epoch_s']['mean']:.1f} ± {1e3 * c['epoch_s']['std']:.1f}"),
                  ("epoch speed-up vs depth 0", "r", _speedup),
                  ("step µs", "r", lambda c: fmt_us(c["step_mean_us"]["mean"])),
                  ("touch µs", "r", lambda c: fmt_us(c["touch_median_us"]["mean"])),
                  ("work vs depth 0", "r", lambda c: "" if c.get("work_vs_p0") is None
                   else f"{100 * c['work_vs_p0']['mean']:.0f}%")]


def detail_table(idx, case, order, mults) -> list[str]:
    return table([idx[(case, order, consumer, mult, layout, p)] for consumer in CONSUMERS for mult in mults
                  for layout in LAYOUTS for p in PREFETCH], DETAIL_COLUMNS, empty="  ")


def cases_table(meta: dict, calib: dict) -> list[str]:
    def fields(r):
        return ", ".join(f"{f.name} {f.dtype.str[1:]}{list(f.shape) if f.shape else ''}" for f in r["spec"])

    def resident(r):
        rb = CASES[r["case"]]["resident_bytes"]
        return '"auto" (default)' if rb == DEFAULT else fmt_bytes(rb) if rb else "None"
    recs = [{"case": c, "kind": CASES[c]["kind"], "spec": make_spec(CASES[c]["kind"]),
             "rows": meta["rows"][CASES[c]["kind"]]} for c in CASES]
    return table(recs, [
        ("case", "l", "{case}"), ("fields", "l", fields),
        ("bytes/row (AoS record)", "r", lambda r: f"{r['spec'].row_nbytes} ({r['spec'].aos_dtype.itemsize})"),
        ("rows", "r", "{rows:,}"), ("batch", "r", lambda r: BATCH[r["kind"]]),
        ("batches/epoch", "r", lambda r: -(-r["rows"] // BATCH[r["kind"]])),
        ("file AoS / SoA", "r", lambda r: " / ".join(fmt_bytes(meta["file_bytes"][r["kind"]][lay]) for lay in LAYOUTS)),
        ("loader `resident_bytes`", "l", resident),
        ("g at depth 0, AoS / SoA", "r", lambda r: " / ".join(fmt_us(calib[r["case"]][lay]["gather_us"])
                                                              for lay in LAYOUTS) + " µs")])


def hidden_section(idx, mults) -> list[str]:
    """The share of the depth-0 wait each depth removes, for the steps of at least 1.2x g."""
    long_steps = [m for m in mults if m >= 1.2]
    if not long_steps:
        return []
    rows, met, total = [], 0, 0
    for cs_, o in case_orders():
        if o != "shuffled":
            continue
        for lay in LAYOUTS:
            for cons in CONSUMERS:
                for m in long_steps:
                    cells = [idx[(cs_, o, cons, m, lay, p)] for p in PREFETCH[1:]]
                    hs = [c["vs_p0"]["hidden"] for c in cells]
                    best = max(h[0] for h in hs)
                    total += 1
                    met += best >= HIDDEN_TARGET
                    rows.append([cs_, LNAME[lay], cons, fmt_mult(m),
                                 fmt_us(idx[(cs_, o, cons, m, lay, 0)]["wait_steady_mean_us"]["mean"])]
                                + [f"{100 * h[0]:.0f} ± {100 * h[1]:.0f}" for h in hs]
                                + ["yes" if best >= HIDDEN_TARGET else "no"])
    L = ["## Hidden share of the gather\n",
         f"Share of the depth-0 wait per batch (batches 2..n, mean over the epoch) that prefetch removes, "
         f"`1 - wait(depth) / wait(depth 0)`, paired by seed, mean ± std across seeds, for the steps of at "
         f"least 1.2x the gather time. Target: at least {100 * HIDDEN_TARGET:.0f}% at some depth. Met in "
         f"**{met} of {total}** shuffled configurations.\n"]
    L.extend(md_table(["case", "layout", "step", "step x g", "wait at depth 0 µs"]
                      + [f"hidden % depth {p}" for p in PREFETCH[1:]] + ["≥ 90%?"], rows,
                      "lllrr" + "r" * len(PREFETCH[1:]) + "l"))
    L.append("")
    return L


def cost_section(cost: dict) -> list[str]:
    """Rows/s of a consumer that only asks for batches, every depth against depth 0."""
    rows, ratios = [], []
    for (lay, order, batch), per in cost.items():
        rs = [per[p]["ratio"] for p in PREFETCH[1:]]
        ratios.extend(rs)
        rows.append([LNAME[lay], order, batch, f"{per[0]['rows_per_s'] / 1e6:.1f}"]
                    + [f"{r:.2f}" for r in rs])
    low = sum(r < COST_TARGET for r in ratios)
    L = ["## Cost to a consumer that only reads batches\n",
         "A loop that does nothing but `next(it)` (no touch, no step), CartPole rows from the mapped files "
         "above, every depth of a (layout, order, batch) measured side by side: chunks of ~5 ms of batches, "
         f"{COST_ROUNDS['full']} rounds ({COST_ROUNDS['quick']} in quick mode) in a rotated order; rows/s from the median chunk; epochs follow one "
         f"another in each iterator. Ratio: depth 0's chunk time over the depth's in the same round, median "
         f"over rounds. Target: at least {COST_TARGET:g}x. "
         f"Ratios: {min(ratios):.2f} to {max(ratios):.2f} (median {float(np.median(ratios)):.2f}); "
         f"**{len(ratios) - low} of {len(ratios)}** at or above the target.\n"]
    L.extend(md_table(["layout", "order", "batch", "depth 0 M rows/s"] + [f"depth {p} / depth 0" for p in PREFETCH[1:]],
                      rows, "llrr" + "r" * len(PREFETCH[1:])))
    L.append("")
    return L


def write_report(res: dict, files: list) -> None:
    """README.md from results.json: the tables; the conclusions and the method's prose are the
    hand-written parts of the full report (kept when a rerun rewrites it)."""
    run, cells, calib, meta = res["methodology"], res["cells"], res["calibration"], res["files"]
    cost = {(c["layout"], c["order"], c["batch"]): {int(p): v for p, v in c["by_depth"].items()}
            for c in res["noop_cost"]}
    mults, seeds, mode = run["parameters"]["step_multiples"], run["seeds"], run["mode"]
    idx = {key_of(c): c for c in cells}
    d = ref_depth()
    L = []
    L.append("# Prefetch: how much data loading does the DataLoader hide?\n")
    L.append(f"> Produced by the **{mode}** run `{run['run_name']}` ({len(seeds)} seeds, "
             f"{run['wall_clock_s']:.0f} s wall clock, started {run['started_utc']}). Every table and figure "
             "below comes from that run's `results.json`; rerunning rewrites them.\n")
    case, order, layout = MAIN
    kind = CASES[case]["kind"]
    L.append("## Answer\n")
    L.append(f"**Stall %** is the share of an epoch the training loop spends inside `next(it)` waiting for a "
             f"batch (the analog of GPU idle time). Main case: {case_label(case)}, {order}, {LNAME[layout]} "
             f"memory-mapped file, batch {BATCH[kind]}, gather {fmt_us(calib[case][layout]['gather_us'])} µs "
             f"per batch at depth 0 when calibrated; the step lasts {fmt_mult(min(mults))} to {fmt_mult(max(mults))} "
             f"that. Mean ± std across {len(seeds)} seeds; **bold**: lower than depth 0 by more than "
             f"{MARGIN_PP:g} points in every seed, ↑: higher in every seed. *g*: the mean wait per batch of the "
             "same configuration at depth 0 in this run (the gather time the consumer met). Last column: an "
             "ideal loader, g/(g+s) at depth 0 and max(0, g−s)/max(g, s) with full overlap (s = achieved "
             "step + touch).\n")
    L.extend(stall_table(idx, case, order, layout, mults, True))
    L.append("")
    L.append(f"Every shuffled case, stall % at depth 0 → depth {d} (**bold**: lower in every seed by more than "
             f"{MARGIN_PP:g} points, ↑: higher):\n")
    L.extend(overview_table(idx, mults))
    L.append("")
    L.extend(hidden_section(idx, mults))
    L.extend(cost_section(cost))
    L.extend(hand_written(OUT_DIR, "conclusions"))
    L.append("## Reproduce\n")
    L.append("```sh\n.venv/bin/python experiments/prefetch.py --quick     # about a minute: 2 seeds, small files\n"
             ".venv/bin/python experiments/prefetch.py             # full run (< ~10 min), 5 seeds\n"
             ".venv/bin/python experiments/prefetch.py --seeds 0,1,2\n"
             ".venv/bin/python experiments/prefetch.py --render reports/prefetch/results.json  # the report again\n```\n")
    L.append("Files: `README.md` (this), `results.json` (every number, per seed; `schema_version` field), "
             + ", ".join(f"`{f}`" for f in files) + ".\n")
    L.extend(hand_written(OUT_DIR, "method"))
    L.append("## Cases\n")
    L.extend(cases_table(meta, calib))
    L.append("")

    for cs_, o in case_orders():
        L.append(f"## {cs_}, {o}\n")
        L.append(f"{case_label(cs_)}, {o} order.\n")
        L.append(f"![stall_{cs_}_{o}.png](stall_{cs_}_{o}.png)\n")
        for lay in LAYOUTS:
            L.append(f"**{LNAME[lay]}** (g = {fmt_us(calib[cs_][lay]['gather_us'])} µs per batch at depth 0, "
                     "shuffled), stall %:\n")
            L.extend(stall_table(idx, cs_, o, lay, mults, o == "shuffled"))
            L.append("")
        L.append("<details><summary>Details: steady stall, first wait, wait latency, epoch time, achieved "
                 "step, work</summary>\n")
        L.extend(detail_table(idx, cs_, o, mults))
        L.append("\n</details>\n")

    L.append("## Per-batch wait latency\n")
    L.append("![latency.png](latency.png)\n")

    shares = [x for x in res["seed_log"] if x.get("other_processes_cpu_share") is not None]
    if shares:
        L.append("Share of the machine's CPUs used by processes other than this one while each seed was measured "
                 "(`/proc/stat` busy time minus this process's CPU time): "
                 + ", ".join(f"seed {x['seed']} {100 * x['other_processes_cpu_share']:.0f}%" for x in shares) + ".\n")
    write_methodology_report(OUT_DIR, L, run)


def print_summary(cells, mults) -> None:
    idx = {key_of(c): c for c in cells}
    print()
    print(f"{'case':<13}{'order':<11}{'consumer':<8}{'step':>6} {'layout':<7}| stall % at depth "
          + "  ".join(f"{p:>5}" for p in PREFETCH))
    print("-" * 84)
    for cs_, o in case_orders():
        for cons in CONSUMERS:
            for m in mults:
                for lay in LAYOUTS:
                    vals = "  ".join(f"{idx[(cs_, o, cons, m, lay, p)]['stall_pct']['mean']:>5.1f}" for p in PREFETCH)
                    print(f"{cs_:<13}{o:<11}{cons:<8}{fmt_mult(m):>6} {lay:<7}| {'':<16}{vals}")
    print(flush=True)


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
def main(argv=None) -> None:
    ap = seeds_parser(__doc__, "small files, 2 seeds, 2 step durations (~1 min)",
                      "number of seeds (0..N-1) or a comma list, e.g. 0,1,2 "
                      f"(default {DEFAULT_SEEDS['full']} full, {DEFAULT_SEEDS['quick']} quick)")
    args = ap.parse_args(argv)
    if args.render:
        render(args.render)
        return
    mode = "quick" if args.quick else "full"
    seeds = parse_seeds(args.seeds, DEFAULT_SEEDS[mode])
    mults = STEP_MULTS[mode]
    command = " ".join(["python experiments/prefetch.py", *(sys.argv[1:] if argv is None else argv)])
    params = {"prefetch_depths": PREFETCH, "layouts": LAYOUTS, "orders": ORDERS, "consumers": CONSUMERS,
              "cases": CASES, "row_kinds": ROW_KINDS, "batch_sizes": BATCH, "rows": ROWS[mode],
              "step_multiples": mults, "calibration_epochs": CALIB_EPOCHS[mode], "matmul_n": MATMUL_N,
              "python_chunk": PY_CHUNK, "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS"),
              "switch_interval_s": sys.getswitchinterval(), "margin_pp": MARGIN_PP}
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=seeds, command=command, parameters=params)
    os.makedirs(OUT_DIR, exist_ok=True)
    log = lambda msg: print(f"[{rec.elapsed():6.1f}s] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    configs = [(cs_, o, cons, m, lay, p) for cs_, o in case_orders() for cons in CONSUMERS
               for m in mults for lay in LAYOUTS for p in PREFETCH]
    log(f"run {rec.run_name}: {len(configs)} configurations x {len(seeds)} seeds")

    tmp = tempfile.mkdtemp(prefix="tfdata-prefetch-")
    datasets = {}
    raw = []
    seed_log = []
    try:
        # -- files: one per (row kind, layout); each case opens its own map of it, so one case's
        # page release does not unmap another's
        meta = {"rows": ROWS[mode], "file_bytes": {}}
        t0 = time.perf_counter()
        for k in dict.fromkeys(c["kind"] for c in CASES.values()):
            meta["file_bytes"][k] = {}
            for lay in LAYOUTS:
                path = create_file(tmp, k, lay, ROWS[mode][k], seed=0)
                meta["file_bytes"][k][lay] = file_bytes(path)
                for cs_ in CASES:
                    if CASES[cs_]["kind"] == k:
                        datasets[(cs_, lay)] = tfdata.MmapDataset.open(path)
        params["file_creation_s"] = round(time.perf_counter() - t0, 2)
        log(f"files written ({params['file_creation_s']} s)")

        def ds_of(case, lay):
            return datasets[(case, lay)]

        # -- warm-up: kernels, page cache, and a check that every epoch yields each row once
        t0 = time.perf_counter()
        for cs_, o in case_orders():
            for lay in LAYOUTS:
                for p in (0, 2):
                    run_epoch(ds_of(cs_, lay), cs_, o, p, seed=12345, consumer=None, check=True)
        params["warmup_s"] = round(time.perf_counter() - t0, 2)
        log(f"warm-up done ({params['warmup_s']} s)")

        # -- gather time g per (case, layout), and the consumers' overshoot / work rates
        calib = {}
        for cs_ in CASES:
            calib[cs_] = {}
            for lay in LAYOUTS:
                eps = [run_epoch(ds_of(cs_, lay), cs_, "shuffled", 0, seed=1000 + i, consumer=None)
                       for i in range(CALIB_EPOCHS[mode])]
                # the fastest epoch: load from other processes only ever slows an epoch down
                calib[cs_][lay] = {"gather_us": float(min(e["wait_steady_mean_us"] for e in eps)),
                                   "gather_median_us": float(np.median([e["wait_steady_median_us"] for e in eps])),
                                   "first_wait_us": float(np.median([e["first_wait_us"] for e in eps])),
                                   "epochs": eps}
                log(f"gather {cs_}/{lay}: {calib[cs_][lay]['gather_us']:.0f} µs per batch of "
                    f"{BATCH[CASES[cs_]['kind']]}")
        cons_cal = calibrate_consumers()
        params["consumer_calibration"] = cons_cal
        log("consumers: sleep overshoot {:.0f} µs, {:.0f} matmuls/s, {:.0f} Python chunks/s".format(
            cons_cal["sleep_overshoot_ns"] / 1e3, cons_cal["numpy_units_per_s"], cons_cal["python_units_per_s"]))

        # -- measurement
        ref = reference_mult(mults)
        for si, seed in enumerate(seeds):
            order_list = rotated(configs, si * len(configs) // len(seeds) + si)
            if si % 2:
                order_list.reverse()
            t_seed = time.perf_counter()
            snap = cpu_snapshot()
            for cs_, o, cons, m, lay, p in order_list:
                step_us = m * calib[cs_][lay]["gather_us"]
                r = run_epoch(ds_of(cs_, lay), cs_, o, p, seed, cons, step_ns=int(step_us * 1e3),
                              overshoot_ns=cons_cal["sleep_overshoot_ns"])
                r.update({"case": cs_, "order": o, "consumer": cons, "mult": m, "layout": lay, "prefetch": p,
                          "seed": seed, "step_target_us": step_us})
                raw.append(r)
            wall = time.perf_counter() - t_seed
            seed_log.append({"seed": seed, "wall_s": round(wall, 1), "load_average_end": list(os.getloadavg()),
                             "other_processes_cpu_share": other_cpu_share(snap, cpu_snapshot(), wall)})
            main_c = sorted((r for r in raw if r["seed"] == seed and (r["case"], r["order"], r["layout"]) == MAIN
                             and r["consumer"] == "sleep" and r["mult"] == ref), key=lambda r: r["prefetch"])
            oc = seed_log[-1]["other_processes_cpu_share"]
            log(f"seed {seed} done ({wall:.0f} s, load {os.getloadavg()[0]:.2f}, other processes "
                f"{'?' if oc is None else f'{100 * oc:.0f}%'} of the CPUs); main "
                f"case, sleep step {fmt_mult(ref)}: stall % "
                + " ".join(f"depth {r['prefetch']}: {r['stall_pct']:.1f}" for r in main_c))
        t0 = time.perf_counter()
        cost = noop_cost(datasets, COST_ROUNDS[mode])
        params["noop_cost_s"] = round(time.perf_counter() - t0, 1)
        log(f"no-op consumer: depth / depth 0 rows/s {min(r['ratio'] for v in cost.values() for r in v.values()):.2f} "
            f"to {max(r['ratio'] for v in cost.values() for r in v.values()):.2f}")
    finally:
        for ds in datasets.values():
            ds.close()
        datasets.clear()
        gc.collect()
        shutil.rmtree(tmp, ignore_errors=True)

    cells = aggregate(raw, calib)
    print_summary(cells, mults)
    run = rec.finish()
    path = os.path.join(OUT_DIR, "results.json")
    write_json(path, {"methodology": run, "calibration": calib, "consumer_calibration": cons_cal, "files": meta,
                      "seed_log": seed_log, "cells": cells, "raw": raw,
                      "noop_cost": [{"layout": k[0], "order": k[1], "batch": k[2],
                                     "by_depth": {str(p): v for p, v in per.items()}} for k, per in cost.items()]})
    files = render(path)
    rel = os.path.relpath(OUT_DIR, ROOT)
    print(f"{mode} run {rec.run_name} done in {run['wall_clock_s']:.0f} s; report: {rel}/README.md, "
          f"data: {rel}/results.json, plots: {', '.join(files)}", flush=True)


def render(path: str) -> list[str]:
    """The plots and README.md of ``OUT_DIR`` from a results.json; returns the plots' names."""
    res = read_results(path)
    run = res["methodology"]
    os.makedirs(OUT_DIR, exist_ok=True)
    files = plot(res["cells"], res["calibration"], run["parameters"]["step_multiples"], run["mode"], len(run["seeds"]))
    drop_stale_plots(OUT_DIR, files)
    write_report(res, files)
    return files


if __name__ == "__main__":
    main()
