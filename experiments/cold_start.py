"""Cold start: what do ``import tfdata`` and the first calls cost, with and without numba's cache?

A training loop imports tfdata once and then pays, once, for loading (or compiling) the kernels of
what it uses. This experiment measures each stage in fresh processes:

* ``python``: the interpreter alone (``python -c pass``, wall clock of the whole process);
* ``import numpy``, then ``import tfdata`` (which must not import numba or compile anything);
* the first ``ReplayBuffer`` built (this imports numba and the kernel modules), its first
  ``extend``, its first ``sample`` (the kernels of uniform sampling), the first sample of a
  ``PrioritizedReplayBuffer`` (tree kernels), and a second ``sample`` (the steady cost, for scale);
* for each layout, with numba's on-disk kernel cache **warm** (filled by an earlier process) and
  **cold** (an empty cache directory: every kernel compiles).

    python experiments/cold_start.py --quick    # 2 repetitions, ~1 minute
    python experiments/cold_start.py            # 5 repetitions, a few minutes

Writes ``reports/cold_start/`` (``README.md``, ``results.json``, ``cold_start.png``); the numba
caches it fills are scratch folders there, deleted at the end. Only the public tfdata API.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
from _recording import RunRecord, report_dir, write_json  # noqa: E402
from _render import write_report as write_methodology_report  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "cold_start"
REPS = {"full": 5, "quick": 2}           # fresh processes per (layout, cache) condition
LAYOUTS = ("aos", "soa")
CACHES = ("warm", "cold")
CAPACITY = 1000
BATCH = 32
SPEC = {"obs": ("f4", (4,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (4,)),
        "terminated": "?", "truncated": "?"}
STAGES = ("import_numpy", "import_tfdata", "build", "first_extend", "first_sample",
          "first_prioritized_sample", "second_sample")
LABELS = {"import_numpy": "import numpy", "import_tfdata": "import tfdata",
          "build": "first ReplayBuffer()", "first_extend": "first extend", "first_sample": "first sample",
          "first_prioritized_sample": "first prioritized sample", "second_sample": "second sample"}
TIMEOUT_S = 600
OUT_DIR = report_dir(EXPERIMENT)

# The measured program: runs in a fresh interpreter, prints one JSON line.
PROBE = r"""
import json, sys, time
t = time.perf_counter
r = {}
a = t(); import numpy as np; r["import_numpy"] = t() - a
a = t(); import tfdata; r["import_tfdata"] = t() - a
r["numba_imported_by_import"] = "numba" in sys.modules
spec, layout, cap, batch = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
spec = {k: (v[0], tuple(v[1])) if isinstance(v, list) else v for k, v in spec.items()}
a = t(); buf = tfdata.ReplayBuffer(spec, cap, layout=layout, seed=0); r["build"] = t() - a
rows = {k: np.zeros((cap,) + (v[1] if isinstance(v, tuple) else ()),
                    v[0] if isinstance(v, tuple) else v) for k, v in spec.items()}
a = t(); buf.extend(rows); r["first_extend"] = t() - a
a = t(); buf.sample(batch); r["first_sample"] = t() - a
a = t(); buf.sample(batch); r["second_sample"] = t() - a
per = tfdata.PrioritizedReplayBuffer(spec, cap, layout=layout, seed=0)
per.extend(rows)
a = t(); per.sample(batch); r["first_prioritized_sample"] = t() - a
r["peak_rss"] = tfdata.memory.snapshot(uss=False)["peak_rss"]
print(json.dumps(r))
"""


def _env(cache_dir: str) -> dict:
    env = dict(os.environ)
    env["NUMBA_CACHE_DIR"] = cache_dir  # tfdata honours a cache directory the user chose
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def probe(layout: str, cache_dir: str) -> dict:
    spec = json.dumps({k: (list(v) if isinstance(v, tuple) else v) for k, v in SPEC.items()})
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", PROBE, spec, layout, str(CAPACITY), str(BATCH)],
                         env=_env(cache_dir), capture_output=True, text=True, timeout=TIMEOUT_S)
    wall = time.perf_counter() - t0
    if out.returncode:
        raise RuntimeError(f"probe failed ({layout}): {out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["process_wall"] = wall
    return r


def bare_python() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True, timeout=60)
    return time.perf_counter() - t0


def measure(reps: int, scratch: str) -> list:
    raw = []
    for rep in range(reps):
        for i, layout in enumerate(LAYOUTS):
            # alternate the order of conditions between repetitions (A/B/B/A)
            order = CACHES if (rep + i) % 2 == 0 else CACHES[::-1]
            for cache in order:
                d = os.path.join(scratch, f"{cache}-{layout}-{rep}")
                if cache == "warm":
                    d = os.path.join(scratch, f"warm-{layout}")
                    if not os.path.isdir(d):
                        probe(layout, d)  # fills the cache: the process a warm start follows
                r = probe(layout, d)
                r.update(rep=rep, layout=layout, cache=cache, python=bare_python())
                raw.append(r)
                print(f"  rep {rep} {layout} {cache}: import tfdata {r['import_tfdata'] * 1e3:.0f} ms, first "
                      f"sample {r['first_sample'] * 1e3:.0f} ms, process {r['process_wall']:.2f} s", flush=True)
                if cache == "cold":
                    shutil.rmtree(d, ignore_errors=True)
    return raw


def summarise(raw: list) -> dict:
    agg = {}
    for layout in LAYOUTS:
        for cache in CACHES:
            rows = [r for r in raw if r["layout"] == layout and r["cache"] == cache]
            cell = {}
            for k in STAGES + ("process_wall", "python", "peak_rss"):
                v = np.array([r[k] for r in rows], float)
                cell[k] = {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if len(v) > 1 else 0.0,
                           "median": float(np.median(v)), "n": int(len(v))}
            cell["numba_imported_by_import"] = any(r["numba_imported_by_import"] for r in rows)
            agg[f"{layout}/{cache}"] = cell
    return agg


def plot(agg: dict) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.2))
    keys = [f"{lay}/{c}" for lay in LAYOUTS for c in CACHES]
    left = np.zeros(len(keys))
    colors = plt.cm.tab10(np.arange(len(STAGES)))
    for s, color in zip(STAGES, colors):
        vals = np.array([agg[k][s]["mean"] for k in keys])
        ax.barh(keys, vals, left=left, color=color, label=LABELS[s])
        left += vals
    ax.set_xlabel("seconds (mean over repetitions), stages in order")
    ax.set_title("Cold start: import and first calls, numba cache warm or cold")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    name = "cold_start.png"
    fig.savefig(os.path.join(OUT_DIR, name), dpi=110)
    plt.close(fig)
    return name


def ms(cell) -> str:
    return f"{cell['mean'] * 1e3:.0f} ± {cell['std'] * 1e3:.0f}"


def write_report(agg: dict, run: dict, png: str) -> None:
    n = agg[f"{LAYOUTS[0]}/warm"]["import_tfdata"]["n"]
    L = ["# Cold start: import and first calls\n",
         f"Made by `experiments/cold_start.py` ({run['mode']} run, command `{run['command']}`, {n} fresh "
         f"processes per condition, {run['wall_clock_s']:.0f} s). Raw numbers: `results.json`.\n",
         "## Findings\n"]
    w, c = agg["aos/warm"], agg["aos/cold"]
    first_warm = sum(w[s]["mean"] for s in STAGES[2:6])
    first_cold = sum(c[s]["mean"] for s in STAGES[2:6])
    L.append(f"* `import tfdata` takes {ms(w['import_tfdata'])} ms after numpy ({ms(w['import_numpy'])} ms), and "
             + ("imports no numba" if not any(a["numba_imported_by_import"] for a in agg.values())
                else "**imports numba**") + f"; the interpreter alone starts in {ms(w['python'])} ms.")
    L.append(f"* Everything before the first batches (first buffer, extend, uniform and prioritized sample), "
             f"AoS: {first_warm * 1e3:.0f} ms with a warm kernel cache, {first_cold:.1f} s with a cold one "
             f"({first_cold / first_warm:.0f}x): the cache is what makes `import tfdata` in a training loop "
             "cheap after the first run on a machine.")
    L.append(f"* With a warm cache most of that is two one-time costs: the first `ReplayBuffer()` imports numba "
             f"({w['build']['mean'] * 1e3:.0f} ms with the kernel modules), and the first kernel call of the "
             f"process, here the first `extend`, takes {w['first_extend']['mean'] * 1e3:.0f} ms (the first call of any numba "
             f"kernel in a process has a fixed set-up cost even when the kernel comes from the cache); later first calls load their kernel in {w['first_sample']['mean'] * 1e3:.0f} ms.")
    L.append(f"* For scale: a second `sample({BATCH})` takes {w['second_sample']['median'] * 1e6:.0f} µs (median).")
    L.append("")
    L.append(f"![{png}]({png})\n")
    L.append("## Stages (ms, mean ± std over fresh processes)\n")
    L.append("| layout | cache | " + " | ".join(LABELS[s] for s in STAGES[:-1])
             + " | second sample (µs, median) | whole process (s) | peak RSS (MiB) |")
    L.append("|---|---|" + "---:|" * (len(STAGES) + 2))
    for layout in LAYOUTS:
        for cache in CACHES:
            a = agg[f"{layout}/{cache}"]
            L.append(f"| {layout} | {cache} | " + " | ".join(
                ms(a[s]) if s != "second_sample" else f"{a[s]['median'] * 1e6:.0f}" for s in STAGES)
                     + f" | {a['process_wall']['mean']:.2f} | {a['peak_rss']['mean'] / 2**20:.0f} |")
    L.append("")
    L.append("## Method\n")
    L.append(f"* Each condition is a fresh `python -c` process (the probe in the script) timing its own stages "
             f"with `time.perf_counter`; `NUMBA_CACHE_DIR` points at a scratch folder: **warm** = a folder an "
             f"earlier process of the same layout filled, **cold** = an empty folder (deleted after). Spec: "
             f"CartPole-like rows, capacity {CAPACITY}, batch {BATCH}. Conditions alternate order between "
             "repetitions. The first `ReplayBuffer()` imports numba and loads (warm) or compiles (cold) the "
             "kernel modules it binds; later stages load or compile what they call first.")
    L.append("* Not measured: a cold *operating-system* file cache (the files were read recently by the "
             "previous process); an installed wheel (this runs from the checkout).")
    L.append("")
    write_methodology_report(OUT_DIR, L, run)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 repetitions (about a minute)")
    ap.add_argument("--reps", type=int, default=None)
    args = ap.parse_args()
    mode = "quick" if args.quick else "full"
    reps = args.reps or REPS[mode]
    os.makedirs(OUT_DIR, exist_ok=True)
    scratch = os.path.join(OUT_DIR, ".numba_scratch")
    shutil.rmtree(scratch, ignore_errors=True)
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=list(range(reps)),
                    command="python experiments/cold_start.py" + (" --quick" if args.quick else ""),
                    parameters={"capacity": CAPACITY, "batch": BATCH, "layouts": LAYOUTS, "caches": CACHES})
    try:
        raw = measure(reps, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    agg = summarise(raw)
    png = plot(agg)
    run = rec.finish()
    write_json(os.path.join(OUT_DIR, "results.json"), {"methodology": run, "summary": agg, "raw": raw})
    write_report(agg, run, png)
    print(f"{mode} run {rec.run_name} done in {run['wall_clock_s']:.0f} s; report: "
          f"{os.path.relpath(OUT_DIR)}/README.md", flush=True)


if __name__ == "__main__":
    main()
