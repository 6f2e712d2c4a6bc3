"""Sum-tree shape for proportional prioritized replay: binary or k-ary (k = 4, 8, 16)?

A self-contained experiment (one file, parameters at the top, cleanrl style). It answers one
design question for the upcoming prioritized replay buffer: in float64, on this machine, which
tree shape samples and updates fastest?

* ``binary``: implicit array, root at 1, children of i at 2i and 2i+1, leaves at P..2P-1 with P
  the next power of two >= capacity.
* ``k4``, ``k8``, ``k16``: k-ary trees stored level by level; the k children of a node are
  contiguous and every child block starts on a multiple of k elements of a 64-byte aligned array,
  so one node's children fill half a cache line (k=4), one line (k=8) or two lines (k=16). Levels
  are only as wide as needed (no padding of the leaf level to a power of k).
* ``numpy``: the vectorised baseline one writes without numba: ``np.cumsum`` of the leaves plus
  ``np.searchsorted`` to sample, a per-level loop over the binary tree to update. A second numpy
  sampler (``numpy_descent``) descends the binary tree one level per numpy pass instead.

Operations (all kernels are ``@njit(cache=True, nogil=True)`` and allocate nothing; scratch
arrays are passed in):

* ``sample``: stratified batch of B draws, draw i targets u_i = (i + r_i) * total / B; the whole
  batch descends level by level (every draw advances one level per pass);
* ``sample_bl``: the same descent written without a data-dependent branch (the direction is
  computed as 0/1, so the CPU cannot mispredict it, but also cannot run ahead of the loads);
* ``sample_one``, ``sample_one_bl``: the controls: each draw descends root to leaf before the
  next starts;
* ``update``: B leaves set, then parents recomputed from their children level by level up to the
  root (no incremental adds, so no drift); sum tree only;
* ``update_one``: the control: each leaf walks up to the root before the next;
* ``update_fused``: like ``update`` but one pass maintains the sum, min and max trees together;
* ``update_fused_one``: the fused update one leaf at a time (a control, but also a candidate).

A shape is judged by one replay step, sample(B) + fused update(B), in kernel, each shape with its
fastest sampler and fastest fused update (level by level or one at a time, branchy or not).

Every kernel takes a 2-D block of m batches. ``kernel`` timing runs m = M batches per call (about
1 ms) and divides: what the work costs inside a larger numba kernel (all ops). ``call`` timing
runs m = 1 and times each call from Python, numba dispatch included (sample, update, fused).

Before any timing, every candidate is checked against a slow numpy reference (searchsorted on the
cumsum of the leaves) for capacities 1, 7, 33, 1000 and 2**20, with zero leaves.

The candidates (the kernels, the tree classes, the numpy baseline) and that check are in
``_sumtree_candidates.py``; this file holds the parameters, the timing and the analysis.

    python experiments/sumtree_shape.py --quick     # < 1 minute
    python experiments/sumtree_shape.py             # the full run, < 8 minutes
    python experiments/sumtree_shape.py --seeds 0,1,2

Writes only under ``reports/sumtree/``: ``README.md``, ``results.json``, ``sumtree_shape.png``
(and numba's kernel cache in ``reports/sumtree/.numba_cache`` unless NUMBA_CACHE_DIR is set).
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time

sys.dont_write_bytecode = True  # write nothing outside reports/sumtree (no __pycache__)
from _plots import pyplot  # noqa: E402
from _recording import RunRecord, machine_brief, report_dir, seeds_parser, write_json  # noqa: E402
from _render import fmt_kib_mib as mib, fmt_sig as fmt, machine_bullet, md_table, produced_by  # noqa: E402
from _render import hand_written, sysfs_cache_bytes  # noqa: E402
from _timing import SliceTimer, block_size, latency_stats, run_rounds  # noqa: E402

OUT_DIR = report_dir("sumtree")
# before numba is imported (by the candidates): cache=True kernels write their cache here
os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(OUT_DIR, ".numba_cache"))

import numpy as np  # noqa: E402
from _sumtree_candidates import (ALIGN, FUSED_OPS, SAMPLE_OPS, SHAPES, UPDATE_OPS,  # noqa: E402
                                 NumpyTree, Tree, check_all, noop)

# ---------------------------------------------------------------------------------------------
# Parameters (the shapes binary, k4, k8, k16 and their operations are _sumtree_candidates')
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "sumtree_shape"
OPS = SAMPLE_OPS + UPDATE_OPS              # all timed in kernel mode
CALL_OPS = ("sample", "update", "update_fused")  # also timed per call from Python
SIZES = {"full": (2**10, 2**20, 2**22), "quick": (2**10, 2**20)}
BATCHES = (32, 256)
DEFAULT_SEEDS = {"full": (0, 1, 2, 3, 4), "quick": (0,)}
ROUNDS = {"full": 4, "quick": 2}           # each candidate's budget is split in rounds; the
BUDGET_S = {"full": 0.30, "quick": 0.05}   # order of candidates changes every round (A/B/A/B)
MIN_CALLS_PER_SLICE = 3
WARMUP_CALLS = 2                           # untimed calls at the start of every slice
BLOCK_TARGET_S = 1e-3                      # kernel mode: m batches per call so a call is ~1 ms
N_ROWS = 4096                              # pre-drawn batches (uniforms, update indices/values)
ZERO_FRAC = 0.05                           # share of zero priorities in timing data
TEST_CAPACITIES = (1, 7, 33, 1000, 2**20)
TEST_BATCHES = (1, 32, 256)
TEST_SEED = 12345
TIE_MARGIN = 0.03                          # a shape "wins" only beyond 3% and in every seed

COLORS = {"binary": "tab:blue", "k4": "tab:orange", "k8": "tab:green", "k16": "tab:red",
          "numpy": "tab:gray", "numpy_descent": "silver"}
SHORT = {"sample": "lvl", "sample_bl": "lvl-bl", "sample_one": "one", "sample_one_bl": "one-bl",
         "update_fused": "lvl", "update_fused_one": "one"}
OP_TITLES = {
    "sample": "sample: stratified, whole batch descends level by level, branchy",
    "sample_bl": "sample_bl: the same, branchless (direction computed as 0/1)",
    "sample_one": "sample_one: one draw root-to-leaf at a time, branchy (control)",
    "sample_one_bl": "sample_one_bl: one draw at a time, branchless (control)",
    "update": "update: set B leaves, recompute parents level by level (sum tree only)",
    "update_one": "update_one: each leaf walks to the root before the next (control)",
    "update_fused": "update_fused: sum, min and max trees in one pass, level by level",
    "update_fused_one": "update_fused_one: the same, one leaf at a time (control)",
}


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------
class Candidate(SliceTimer):
    """One (implementation, op, mode) in one (seed, size, batch): callables and their samples."""

    def __init__(self, impl, op, mode, fn, arglist, per_call):
        super().__init__(fn, arglist, per_call,  # per_call: batches per call
                         warmup=WARMUP_CALLS, min_calls=MIN_CALLS_PER_SLICE)
        self.impl, self.op, self.mode = impl, op, mode


def make_candidates(trees, ntree, R, OI, OP, IDX, PR, u, pos) -> list[Candidate]:
    cands = []
    for shape, tree in trees.items():
        for op in OPS:
            if op.startswith("sample"):
                fn = tree.sample_fn(op)

                def mk(s, m, tree=tree):
                    return tree.sample_args(R[s:s + m], OI[s:s + m], OP[s:s + m], u, pos)
            else:
                fn = tree.update_fn(op)

                def mk(s, m, tree=tree, op=op):
                    return tree.update_args(op, IDX[s:s + m], PR[s:s + m], pos)
            if op in CALL_OPS:
                cands.append(Candidate(shape, op, "call", fn, [mk(s, 1) for s in range(N_ROWS)],
                                       1))
            M = block_size(fn, mk, BLOCK_TARGET_S, N_ROWS)
            cands.append(Candidate(shape, op, "kernel", fn,
                                   [mk(s, M) for s in range(0, N_ROWS, M)], M))
    cands.append(Candidate("numpy", "sample", "call", ntree.sample,
                           [(R[s],) for s in range(N_ROWS)], 1))
    cands.append(Candidate("numpy_descent", "sample", "call", ntree.sample_descent,
                           [(R[s],) for s in range(N_ROWS)], 1))
    for op in ("update", "update_fused"):
        cands.append(Candidate("numpy", op, "call", getattr(ntree, op),
                               [(IDX[s], PR[s]) for s in range(N_ROWS)], 1))
    t = trees["k8"]
    cands.append(Candidate("floor", "noop", "call", noop,
                           [(t.s, t.off, t.kk, R[s:s + 1], OI[s:s + 1], OP[s:s + 1], u, pos)
                            for s in range(N_ROWS)], 1))
    return cands


def stats_of(times_ns: list[float]) -> dict:
    s = latency_stats(times_ns)
    return {"count": s["n"], **{k: s[k] for k in ("median_us", "p99_us", "mean_us", "min_us")}}


def run_seed(seed: int, mode: str, log) -> list[dict]:
    rows = []
    for n in SIZES[mode]:
        rng = np.random.default_rng([seed, n])
        leaves = rng.random(n)
        leaves[rng.random(n) < ZERO_FRAC] = 0.0
        t0 = time.perf_counter()
        trees = {shape: Tree(shape, leaves) for shape in SHAPES}
        ntree = NumpyTree(leaves, max(BATCHES))
        build_s = time.perf_counter() - t0
        for B in BATCHES:
            rng = np.random.default_rng([seed, n, B])
            R = rng.random((N_ROWS, B))
            IDX = rng.integers(0, n, (N_ROWS, B))
            PR = rng.random((N_ROWS, B))
            PR[rng.random((N_ROWS, B)) < ZERO_FRAC] = 0.0
            OI, OP = np.zeros((N_ROWS, B), dtype=np.int64), np.zeros((N_ROWS, B))
            u, pos = np.zeros(B), np.zeros(B, dtype=np.int64)
            load0 = os.getloadavg()
            cands = make_candidates(trees, ntree, R, OI, OP, IDX, PR, u, pos)
            run_rounds(cands, ROUNDS[mode], int(BUDGET_S[mode] / ROUNDS[mode] * 1e9),
                       lambda rnd: rnd * 7 + seed * 3)
            for c in cands:
                rows.append({"seed": seed, "n": n, "batch": B, "impl": c.impl, "op": c.op,
                             "mode": c.mode, "batches_per_call": c.per_call,
                             **stats_of(c.times_ns)})
            log(f"  seed {seed}  n=2^{int(math.log2(n))}  B={B}: {len(cands)} candidates, "
                f"load {load0[0]:.2f} -> {os.getloadavg()[0]:.2f}, build {build_s:.2f} s")
        del trees, ntree
        gc.collect()
    return rows


def software_brief(run: dict) -> dict:
    """This report's software keys, from the environment the run recorded."""
    sw = run["environment"]["software"]
    return {"python": sw["python"], "numpy": sw["numpy"], "numba": sw["numba"],
            "llvmlite": sw["llvmlite"], "git_commit": sw["git"]["commit"],
            "git_dirty_tracked_files": sw["git"]["dirty"],
            "numba_env": [k for k in sw["env_vars_set"] if k.startswith("NUMBA_")]}


# ---------------------------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------------------------
def numpy_op(op: str) -> str:
    """numpy's counterpart of kernel operation ``op`` (numpy has no controls)."""
    return "sample" if op.startswith("sample") else ("update_fused" if "fused" in op else "update")


def aggregate(rows: list[dict], seeds) -> dict:
    """Per (n, batch, impl, op, mode): median over seeds of the per-seed medians and p99s, plus
    per-seed ratios (same seed, same data, interleaved in time) against binary and numpy."""
    idx = {(r["seed"], r["n"], r["batch"], r["impl"], r["op"], r["mode"]): r for r in rows}
    keys = sorted({(r["n"], r["batch"], r["impl"], r["op"], r["mode"]) for r in rows}, key=str)
    out = {}
    for (n, B, impl, op, mode) in keys:
        per = [idx[(s, n, B, impl, op, mode)] for s in seeds]
        e = {"n": n, "batch": B, "impl": impl, "op": op, "mode": mode,
             "median_us": float(np.median([p["median_us"] for p in per])),
             "p99_us": float(np.median([p["p99_us"] for p in per])),
             "median_us_per_seed": [p["median_us"] for p in per],
             "p99_us_per_seed": [p["p99_us"] for p in per],
             "samples_per_seed": [p["count"] for p in per],
             "batches_per_call": [p["batches_per_call"] for p in per]}
        if impl in SHAPES:
            rb = [p["median_us"] / idx[(s, n, B, "binary", op, mode)]["median_us"]
                  for s, p in zip(seeds, per)]
            e["vs_binary"] = float(np.median(rb))
            e["vs_binary_per_seed"] = rb
            # numpy speedup = numpy's time per call / this time (numpy has one mode: call)
            rn = [idx[(s, n, B, "numpy", numpy_op(op), "call")]["median_us"] / p["median_us"]
                  for s, p in zip(seeds, per)]
            e["numpy_speedup"] = float(np.median(rn))
        out[f"{n}|{B}|{impl}|{op}|{mode}"] = e
    return out


def get(agg, n, B, impl, op, mode="kernel", field="median_us"):
    e = agg.get(f"{n}|{B}|{impl}|{op}|{mode}")
    return None if e is None else e.get(field)


def best_op(agg, n, B, shape, ops) -> str:
    """The shape's fastest implementation among ``ops`` (in-kernel medians)."""
    return min(ops, key=lambda op: get(agg, n, B, shape, op))


def step_cost(agg, n, B, shape, seed_i=None):
    """One prioritized-replay step in kernel: the shape's fastest sampler (of the four) plus its
    fastest fused update (of the two), median µs (or one seed's medians of the same two)."""
    ops = (best_op(agg, n, B, shape, SAMPLE_OPS), best_op(agg, n, B, shape, FUSED_OPS))
    es = [agg[f"{n}|{B}|{shape}|{op}|kernel"] for op in ops]
    return sum(e["median_us"] if seed_i is None else e["median_us_per_seed"][seed_i] for e in es)


def verdicts(agg, sizes, seeds) -> dict:
    """Per (n, batch): which shape has the cheapest step, and is it a clear win?"""
    out = {}
    for n in sizes:
        for B in BATCHES:
            costs = {s: step_cost(agg, n, B, s) for s in SHAPES}
            best = min(costs, key=costs.get)
            runner = min((s for s in SHAPES if s != best), key=costs.get)
            clear = all(step_cost(agg, n, B, best, i) * (1 + TIE_MARGIN)
                        < step_cost(agg, n, B, runner, i) for i in range(len(seeds)))
            out[f"{n}|{B}"] = {"n": n, "batch": B, "step_us": costs, "best": best,
                               "sampler": {s: best_op(agg, n, B, s, SAMPLE_OPS) for s in SHAPES},
                               "updater": {s: best_op(agg, n, B, s, FUSED_OPS) for s in SHAPES},
                               "runner_up": runner, "clear": clear,
                               "best_vs_binary": costs[best] / costs["binary"],
                               "runner_vs_best": costs[runner] / costs[best]}
    return out


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def size_label(n):
    return f"2^{int(math.log2(n))}" if n > 1 else "1"


def plot(agg, sizes, run_name, path) -> None:
    """Six panels against the number of leaves: one step's cost (absolute, then relative to
    binary), and four operations relative to binary; dashed = the small batch, solid = the big."""
    from matplotlib.lines import Line2D

    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(16, 9.2))
    x = list(range(len(sizes)))  # evenly spaced categories (2^20 and 2^22 would collide)
    ls = {BATCHES[0]: "--", BATCHES[-1]: "-"}

    def setup(ax, title, log):
        ax.set_xticks(x)
        ax.set_xticklabels([f"{size_label(n)} leaves" for n in sizes])
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_yscale("log")
        else:
            ax.axhline(1.0, color="black", lw=0.8)

    def shape_lines(ax, value):  # value(n, B, shape)
        for B in BATCHES:
            for shape in SHAPES:
                ax.plot(x, [value(n, B, shape) for n in sizes], ls[B], marker="o",
                        color=COLORS[shape], lw=1.8)

    # absolute cost of one step, numpy and the call floor for scale
    ax = axes[0][0]
    for B in BATCHES:
        for shape in SHAPES:
            ax.plot(x, [step_cost(agg, n, B, shape) for n in sizes], ls[B], marker="o",
                    color=COLORS[shape], lw=1.8)
        ax.plot(x, [get(agg, n, B, "numpy", "sample", "call")
                    + get(agg, n, B, "numpy", "update_fused", "call") for n in sizes], ls[B],
                marker="s", color=COLORS["numpy"], lw=1.2)
    ax.plot(x, [get(agg, n, BATCHES[-1], "floor", "noop", "call") for n in sizes], ":",
            color="black", lw=1)
    setup(ax, "one replay step: sample + fused update (best implementation\nper shape), "
          "median µs in kernel (numpy: per call)", True)
    ax.set_ylabel("µs (log scale)")
    # the rest relative to binary
    shape_lines(axes[0][1], lambda n, B, s: step_cost(agg, n, B, s) / step_cost(agg, n, B, "binary"))
    setup(axes[0][1], "one replay step, time / binary's time\n(< 1: faster than binary)", False)
    for ax, op, title in ((axes[0][2], "sample", "sample, level by level, branchy"),
                          (axes[1][0], "sample_bl", "sample, level by level, branchless"),
                          (axes[1][1], "update", "update, sum tree only"),
                          (axes[1][2], "update_fused", "update, sum + min + max fused")):
        ref_op = "sample" if op.startswith("sample") else op  # branchless vs binary's branchy
        shape_lines(ax, lambda n, B, s, op=op, ref_op=ref_op: get(agg, n, B, s, op)
                    / get(agg, n, B, "binary", ref_op))
        setup(ax, f"{title}\nin-kernel time / binary's"
              + (" branchy sample" if op == "sample_bl" else "") + " time", False)
    axes[1][0].set_ylabel("ratio")
    h = [Line2D([], [], color=COLORS[s], lw=2, marker="o", label=s) for s in SHAPES]
    h += [Line2D([], [], color=COLORS["numpy"], marker="s", label="numpy baseline"),
          Line2D([], [], color="gray", lw=1.8, ls="-", label=f"batch {BATCHES[-1]}"),
          Line2D([], [], color="gray", lw=1.8, ls="--", label=f"batch {BATCHES[0]}"),
          Line2D([], [], color="black", ls=":", lw=1, label="numba no-op call from Python")]
    fig.legend(handles=h, loc="lower center", ncol=8, fontsize=9.5, frameon=False)
    fig.suptitle(f"Sum-tree shape, float64: median time per batch (medians over seeds)   "
                 f"[{run_name}]", fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(res: dict, path: str) -> None:
    agg, meth, sizes, ver = res["summary"], res["methodology"], res["sizes"], res["verdicts"]
    seeds, machine, sw = meth["seeds"], meth["machine"], meth["software"]
    grid = [(n, B) for n in sizes for B in BATCHES]
    L = ["# Sum-tree shape for prioritized replay: binary or k-ary?\n",
         produced_by(meth["mode"], meth["run_name"], len(seeds), meth["wall_s"], meth["started_utc"])
         + " Every number below comes from that run (`results.json`); a rerun rewrites the tables and keeps "
         "the hand-written answer.\n",
         "## Answer\n", *hand_written(os.path.dirname(path), "answer")]
    w = L.append
    hn = 2**20 if 2**20 in sizes else sizes[-1]
    w(f"### Headline: {size_label(hn)} leaves, batch 256\n")
    w(f"Median µs per batch of 256. *In kernel* = the work alone (M batches per call, time / M), what it "
      f"costs inside a larger numba kernel; *per call* = one call from Python, numba dispatch included (a "
      f"no-op call with the same arguments: {fmt(get(agg, hn, 256, 'floor', 'noop', 'call'))} µs). [x] = "
      f"time / binary's time in the same column (median of per-seed ratios; < 1 is faster than binary).\n")

    def cell(impl, op, mode="kernel"):
        v, r = get(agg, hn, 256, impl, op, mode), get(agg, hn, 256, impl, op, mode, "vs_binary")
        return "-" if v is None else fmt(v) + (f" [{r:.2f}]" if r is not None else "")

    head = [("sample", "kernel"), ("sample_bl", "kernel"), ("sample", "call"), ("update", "kernel"),
            ("update", "call"), ("update_fused", "kernel"), ("update_fused", "call")]
    L += md_table(["shape", "sample in kernel (branchy)", "sample in kernel (branchless)",
                   "sample per call (branchy)", "update in kernel", "update per call",
                   "fused update in kernel", "fused update per call"],
                  [[s] + [cell(s, op, mode) for op, mode in head] for s in SHAPES]
                  + [["numpy", "", "", f"{cell('numpy', 'sample', 'call')} (cumsum + searchsorted)", "",
                      cell("numpy", "update", "call"), "", cell("numpy", "update_fused", "call")],
                     ["numpy, per-level descent", "", "", cell("numpy_descent", "sample", "call"),
                      "", "", "", ""]], "l" + "r" * 7)
    L[-1] += "\n"
    w("### The criterion: one replay step\n")
    w("In-kernel median µs of one prioritized-replay step = the shape's fastest sampler + its fastest fused "
      "sum/min/max update, same batch; in brackets which ones (`lvl` = batch level by level, `one` = one "
      "draw / one leaf at a time, `bl` = branchless). Each shape is judged by its best implementation "
      "here:\n")
    L += md_table(["leaves", "batch", *SHAPES, "fastest", "fastest / binary", "runner-up / fastest",
                   "clear?"],
                  [[size_label(n), B]
                   + [f"{fmt(v['step_us'][s])} ({SHORT[v['sampler'][s]]} + {SHORT[v['updater'][s]]})"
                      for s in SHAPES]
                   + [f"**{v['best']}**", f"{v['best_vs_binary']:.2f}",
                      f"{v['runner_vs_best']:.2f} ({v['runner_up']})", "yes" if v["clear"] else "no"]
                   for n, B in grid for v in [ver[f"{n}|{B}"]]], "lr" + "r" * len(SHAPES) + "lrrl")
    w(f"\n*clear* = the fastest shape's step is more than {TIE_MARGIN:.0%} cheaper than the "
      f"runner-up's in every seed.\n")

    w("## All results\n")
    w("In kernel: median µs per batch (median over seeds of per-seed medians) [time / binary's time]; numpy "
      "column: numpy's per-call median for the same operation. Per call: median / p99 µs and (x) = "
      "numpy's per-call time / this one (how many times faster than numpy).\n")
    for op in OPS:
        w(f"### {OP_TITLES[op]}\n")
        L += md_table(["leaves", "batch", *SHAPES, "numpy (per call)"],
                      [[size_label(n), B]
                       + [f"{fmt(get(agg, n, B, s, op))} [{get(agg, n, B, s, op, field='vs_binary'):.2f}]"
                          for s in SHAPES] + [fmt(get(agg, n, B, "numpy", numpy_op(op), "call"))]
                       for n, B in grid], "lr" + "r" * (len(SHAPES) + 1))
        if op in CALL_OPS:
            w("\nPer call from Python: median / p99 µs [median / binary's median] (x faster "
              "than numpy):\n")
            L += md_table(["leaves", "batch", *SHAPES],
                          [[size_label(n), B] + [
                              f"{fmt(get(agg, n, B, s, op, 'call'))} / "
                              f"{fmt(get(agg, n, B, s, op, 'call', 'p99_us'))} "
                              f"[{get(agg, n, B, s, op, 'call', 'vs_binary'):.2f}] "
                              f"({get(agg, n, B, s, op, 'call', 'numpy_speedup'):.1f}x)" for s in SHAPES]
                           for n, B in grid], "lr" + "r" * len(SHAPES))
        w("")

    w("### numpy baselines and the call floor, per call (median / p99 µs)\n")
    pairs = (("numpy", "sample"), ("numpy_descent", "sample"), ("numpy", "update"),
             ("numpy", "update_fused"), ("floor", "noop"))
    L += md_table(["leaves", "batch", "numpy sample (cumsum + searchsorted)", "numpy per-level descent",
                   "numpy update (per-level loop)", "numpy fused update", "numba no-op call"],
                  [[size_label(n), B] + [f"{fmt(get(agg, n, B, i, o, 'call'))} / "
                                         f"{fmt(get(agg, n, B, i, o, 'call', 'p99_us'))}" for i, o in pairs]
                   for n, B in grid], "lr" + "r" * 5)
    w("")
    w("### Batch level by level vs one at a time; fused vs sum only (in kernel)\n")
    w("Time ratios of medians: one-at-a-time / level-by-level (> 1: level by level is faster), "
      "fused / sum-only update.\n")
    quotients = (("sample_one", "sample"), ("sample_one_bl", "sample_bl"), ("update_one", "update"),
                 ("update_fused_one", "update_fused"), ("update_fused", "update"))
    L += md_table(["leaves", "batch", "shape", "sample branchy: one / level",
                   "sample branchless: one / level", "update: one / level",
                   "fused update: one / level", "fused / sum only (level)"],
                  [[size_label(n), B, s] + [f"{get(agg, n, B, s, a) / get(agg, n, B, s, b):.2f}"
                                            for a, b in quotients]
                   for n, B in grid for s in SHAPES], "lrl" + "r" * 5)
    w("")
    w("![sumtree_shape.png](sumtree_shape.png)\n")

    w("## Method\n")
    w(machine_bullet(machine))
    w(f"* **Software.** Python {sw['python']}, numpy {sw['numpy']}, numba {sw['numba']} "
      f"(llvmlite {sw['llvmlite']}); repository commit `{(sw['git_commit'] or '?')[:12]}`"
      f"{' (other files of the checkout had uncommitted changes)' if sw['git_dirty_tracked_files'] else ''}. "
      f"Kernels are `@njit(cache=True, nogil=True)`, default numba options (no fastmath).")
    la0, la1 = meth["loadavg_start"], meth["loadavg_end"]
    w(f"* **Load.** Load average (1 / 5 / 15 min) {la0[0]:.2f} / {la0[1]:.2f} / {la0[2]:.2f} at the start, "
      f"{la1[0]:.2f} / {la1[1]:.2f} / {la1[2]:.2f} at the end (the run itself keeps one of the 2 cores "
      f"busy); values before every (seed, size, batch) block are in `results.json`. The machine is shared "
      f"and noisy, hence medians, interleaving and per-seed ratios.")
    w(f"* **Seeds and repetitions.** Seeds {', '.join(map(str, seeds))}. Each seed draws its own leaves "
      f"(uniform in [0, 1), {ZERO_FRAC:.0%} zeros), uniforms r_i and update indices (uniform over the "
      f"leaves, duplicates possible) and values ({ZERO_FRAC:.0%} zeros): {N_ROWS} pre-drawn batches used "
      f"in turn, identical for all shapes. Each candidate is timed for {BUDGET_S[meth['mode']]} s per "
      f"seed, split in {ROUNDS[meth['mode']]} rounds; in each round all {meth['candidates_per_config']} "
      f"candidates of a (seed, size, batch) run one after another in a rotated order, reversed every "
      f"other round (A B C ... then ... C B A), so drift of the machine hits all of them. {WARMUP_CALLS} "
      f"untimed calls start every slice; the garbage collector is off while timing. Sample counts per "
      f"candidate are in `results.json` (`samples_per_seed`).")
    w(f"* **Two timings.** *In kernel*: each call processes M consecutive batches (M a power of two, "
      f"chosen once so a call takes about {BLOCK_TARGET_S * 1e3:.0f} ms) and call time / M is one "
      f"sample; its p99 is therefore a p99 of M-batch means. This is what the tree costs inside a larger "
      f"numba kernel (tfdata samples and gathers in one kernel). *Per call*: each call processes one "
      f"batch and is timed alone with `time.perf_counter_ns`, Python to numba dispatch included; done "
      f"for sample (branchy), update and fused update. numpy is timed per call only.")
    w("* **Statistics.** Per seed: median and p99 of the samples. Tables: the median over seeds of "
      "those. Ratios: per seed (same data, same rounds), then the median over seeds.")
    w("* **Updates.** Leaves set in batch order (last write wins for duplicates), then every ancestor is "
      "recomputed from its children (level by level for the whole batch; duplicated parents are "
      "recomputed redundantly, harmless). The sum-only update leaves the min/max trees stale during "
      "timing, which does not change any cost.")
    w("* **Not measured.** Drawing the uniforms (pre-drawn), IS weights, gathering rows, interleaving "
      "sum/min/max in one array (the fused update here touches three separate arrays), software "
      "prefetch. The numpy baseline recomputes the cumsum on every sample because priorities change "
      "between samples in prioritized replay.")
    w("")
    w("Tree layouts (bytes of one tree; the fused update touches three) and levels below the root:\n")
    fp = res["footprint"]
    L += md_table(["leaves", *SHAPES], [[size_label(n)] + [
        f"{mib(fp[str(n)][s]['bytes'])}, {fp[str(n)][s]['depth']} levels" for s in SHAPES]
        for n in sizes], "l" * (len(SHAPES) + 1))
    w("")
    l2, l3 = (sysfs_cache_bytes(machine, lv) for lv in (2, 3))
    if l2 and l3:
        w(f"2^10 leaves are cache resident for every shape (16 KiB or less per tree). At 2^20 a "
          f"tree (9-16 MiB) is far beyond L2 ({mib(l2)}) but within the shared L3 ({mib(l3)}); "
          f"the three trees of the fused update (27-48 MiB) are not. At 2^22 (37-64 MiB per "
          f"tree) everything is beyond L3. L3 is also shared with whatever else runs on the "
          f"host.\n")
    w("## Correctness (asserted before timing)\n")
    c = res["correctness"]
    w(f"Every kernel (4 shapes x {', '.join(OPS)}) and the numpy samplers and updates were checked against "
      f"a slow reference (`np.searchsorted(np.cumsum(leaves), u, side='right')`, overshoot clamped to the "
      f"last non-zero leaf) for capacities {', '.join(map(str, TEST_CAPACITIES))} and batches "
      f"{', '.join(map(str, TEST_BATCHES))}, with three leaf sets per capacity: integers 0-10 with 30% "
      f"zeros and zero first and last leaves (all sums and subtractions exact, so every draw must equal "
      f"the reference exactly); reals spanning 6 decades with 30% zeros; a single 1e-300 leaf among zeros "
      f"(also exact). Uniform rows include r = 0 (u = 0) and r = 1 - 2^-53 (u at or rounding past the "
      f"total). Asserted: no draw on a zero-priority leaf, index in range, returned priority = the leaf, "
      f"level-by-level draws = one-at-a-time draws of the same arithmetic, binary branchless = binary "
      f"branchy, and after three batches of updates (duplicates, zero values) the leaves follow "
      f"last-write-wins and the sum, min and max trees are bit-identical to a fresh build of the final "
      f"leaves (so no drift); then the updated trees are sampled and checked again. {c['cases']} "
      f"(capacity, leaf set, batch) cases, {c['draws']:,} draws and {c['update_checks']} updates checked "
      f"in {c['seconds']:.1f} s. {c['boundary_mismatches']} real-valued draws differ from the reference; "
      f"the check allows that only within 1e-9 x total of the chosen leaf's edges (the tree's partial "
      f"sums round differently from the cumsum).\n")
    w("## Reproduce\n")
    w("```sh\n.venv/bin/python experiments/sumtree_shape.py --quick   # < 1 min\n"
      ".venv/bin/python experiments/sumtree_shape.py           # full run, < 8 min\n"
      ".venv/bin/python experiments/sumtree_shape.py --seeds 0,1,2\n```\n")
    w("Files: `README.md` (this, generated), `results.json` (every per-seed number, the methodology, the "
      "correctness summary, the verdicts), `sumtree_shape.png`. numba's kernel cache goes to "
      "`reports/sumtree/.numba_cache/` unless `NUMBA_CACHE_DIR` is set.\n")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(L))


# ---------------------------------------------------------------------------------------------
def main() -> None:
    args = seeds_parser(__doc__, "< 1 minute demo run", "comma-separated seeds",
                        raw=False, render=False).parse_args()
    mode = "quick" if args.quick else "full"
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else DEFAULT_SEEDS[mode]
    command = (f"python experiments/sumtree_shape.py{' --quick' if args.quick else ''}"
               + (f" --seeds {args.seeds}" if args.seeds else ""))
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=list(seeds), command=command)
    t_start = time.perf_counter()
    load_start = os.getloadavg()
    os.makedirs(OUT_DIR, exist_ok=True)

    def log(msg):
        print(f"[{time.perf_counter() - t_start:6.1f} s] {msg}", flush=True)

    log(f"{rec.run_name}: load average {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}")
    t0 = time.perf_counter()
    correctness = check_all(TEST_CAPACITIES, TEST_BATCHES, TEST_SEED)  # also compiles every kernel
    correctness["seconds"] = time.perf_counter() - t0
    log(f"correctness OK: {correctness}")

    rows, loads = [], []
    for seed in seeds:
        loads.append({"seed": seed, "loadavg": list(os.getloadavg())})
        rows += run_seed(seed, mode, log)
    sizes = list(SIZES[mode])
    agg = aggregate(rows, seeds)
    ver = verdicts(agg, sizes, seeds)
    footprint = {str(n): {s: Tree.footprint(n, s) for s in SHAPES} for n in sizes}
    run = rec.finish()
    # the shared methodology (tfdata's reports index and SCHEMA.md), plus this report's own keys
    meth = {**run, "wall_s": run["wall_clock_s"], "loadavg_start": run["load_average_start"],
            "loadavg_end": run["load_average_end"], "loadavg_per_seed_start": loads,
            "parameters": {"sizes": sizes, "batches": list(BATCHES), "rounds": ROUNDS[mode],
                           "budget_s_per_candidate_per_seed": BUDGET_S[mode],
                           "block_target_s": BLOCK_TARGET_S, "warmup_calls": WARMUP_CALLS,
                           "min_calls_per_slice": MIN_CALLS_PER_SLICE, "n_rows": N_ROWS,
                           "zero_frac": ZERO_FRAC, "test_capacities": list(TEST_CAPACITIES),
                           "test_batches": list(TEST_BATCHES), "align_bytes": ALIGN,
                           "tie_margin": TIE_MARGIN},
            "candidates_per_config": len(SHAPES) * (len(OPS) + len(CALL_OPS)) + 5,
            "machine": machine_brief(), "software": software_brief(run)}
    res = {"methodology": meth, "sizes": sizes, "correctness": correctness,
           "footprint": footprint, "verdicts": ver, "summary": agg, "per_seed": rows}
    # wall time is recorded before the report/plot are written (they take ~1-2 s)
    write_json(os.path.join(OUT_DIR, "results.json"), res)
    res["schema_version"] = 1
    plot(agg, sizes, rec.run_name, os.path.join(OUT_DIR, "sumtree_shape.png"))
    write_report(res, os.path.join(OUT_DIR, "README.md"))
    log(f"done in {time.perf_counter() - t_start:.0f} s; wrote README.md, results.json, "
        f"sumtree_shape.png under reports/sumtree/")


if __name__ == "__main__":
    main()
