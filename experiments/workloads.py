"""AoS, SoA or a grouping of fields: which layout wins which workload? Column scans, single-field
updates, projected sampling and mixed training loops, by row kind and capacity: a crossover map.

A self-contained experiment (one file, parameters at the top, cleanrl style). The layout
experiment (``experiments/layout.py``) answers the question for whole-row sampling and writes,
where AoS wins almost everywhere. But RL code also works on columns: normalisation statistics,
relabelling rewards, reading one field for an auxiliary loss. This experiment times, on the
same buffers and interleaved in time:

* **operations** (per call): ``column_stats`` of ``reward`` and of ``obs`` (numpy's mean over
  ``buf.column(name)`` as a reference), ``update_field`` of ``reward`` on 256 random live rows,
  ``sample(B)`` of whole rows against ``sample(B, fields=...)`` of one field and of about half
  the row's bytes, and a read of the running statistics (``stats=``) after ``extend(1000)``;
* **mixed workloads**: (a) a DQN-like loop per env step: ``extend`` one vector-env step of
  ``NUM_ENVS`` rows, ``sample(B)`` every k steps, ``buf.stats("obs")`` every m steps; (b) an
  offline-RL epoch: ``column_stats`` of ``obs`` and ``reward`` over the whole buffer, then
  ``ceil(N / B)`` uniform batches; (c) an auxiliary loss: ``sample(B)`` for the TD loss and
  ``sample(B, fields=["obs"])`` for the auxiliary one, per training step;

for the tiny, CartPole, medium and image rows of the layout experiment, in ``layout="aos"``,
``"soa"`` and, when this tfdata accepts them, hybrid groupings (``layout=[[...], [...]]``: each
group a record array, groups side by side). The groupings are probed once at start; the report
says which were available.

From the per-seed medians it builds a crossover map: for each (workload, row kind, capacity)
which layout wins and by how much, with the spread across seeds, and a decision table written
from the data.

    python experiments/workloads.py --quick     # about 1 minute: part of python3 dev.py demo
    python experiments/workloads.py             # the full run: 6-7 minutes for AoS and SoA (two
                                                # groupings as well: roughly twice that)
    python experiments/workloads.py --seeds 0,1,2

Writes ``reports/workloads/README.md``, ``results.json`` and ``*.png`` (``tfdata run workloads
--quick`` writes under ``reports/quick/``). Only the public tfdata API is used, plus numpy and
matplotlib.
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

import tfdata

from _envs import ROW_KINDS, build_filled, make_chunk  # noqa: E402
from _plots import grouped_bars, pyplot, save_figure  # noqa: E402
from _recording import RunRecord, cache_placement, parse_seeds, read_results, report_dir, seeds_parser  # noqa: E402
from _recording import write_json  # noqa: E402
from _render import fmt_bytes, fmt_count, fmt_us, md_table, produced_by, text_table  # noqa: E402
from _render import hand_written, write_report as write_methodology_report  # noqa: E402
from _stats import gmean, mean_std, ratio_summary  # noqa: E402
from _timing import gc_paused, interleaved_latencies, rotated, time_calls  # noqa: E402

# -- Parameters ----------------------------------------------------------------------------------
EXPERIMENT = "workloads"
BASE_LAYOUTS = ("aos", "soa")
# Hybrid groupings (lists of field groups) per row kind. The tiny row has two fields: each of its
# groupings is AoS or SoA, so it has none.
GROUPINGS = {
    # the fields a DQN step samples together in one record, next_obs (as big as obs) apart
    "hybrid_next": {k: [["obs", "action", "reward", "terminated", "truncated"], ["next_obs"]]
                    for k in ("cartpole", "medium", "image")},
    # the normalised / scanned field alone, the rest in one record
    "hybrid_obs": {k: [["obs"], ["action", "reward", "next_obs", "terminated", "truncated"]]
                   for k in ("cartpole", "medium", "image")},
}
LABELS = {"aos": "AoS", "soa": "SoA", "hybrid_next": "hybrid (next_obs apart)",
          "hybrid_obs": "hybrid (obs apart)", "tie": "tie"}
SHORT = {"aos": "AoS", "soa": "SoA", "hybrid_next": "H-next", "hybrid_obs": "H-obs"}
COLORS = {"aos": "tab:blue", "soa": "tab:orange", "hybrid_next": "tab:green", "hybrid_obs": "tab:purple"}

# (row kind -> capacities): a cache-resident one and one beyond L3 where memory allows
CAPACITIES = {
    "full": {"tiny": (10_000, 1_000_000), "cartpole": (10_000, 1_000_000), "medium": (10_000, 100_000),
             "image": (10_000,)},
    "quick": {"tiny": (1_000_000,), "cartpole": (10_000, 1_000_000), "medium": (10_000,), "image": (2_000,)},
}
BATCH = {"tiny": 256, "cartpole": 256, "medium": 256, "image": 32}  # image: Atari DQN's batch
# the field a training loop normalises (stats=, the auxiliary loss, one-field projection); the
# tiny row has no observation, so its reward stands in
NORM_FIELD = {"tiny": "reward", "cartpole": "obs", "medium": "obs", "image": "obs"}
# about half the row's bytes (the report prints the exact share)
HALF_FIELDS = {"tiny": ["action"], "cartpole": ["obs", "action"],
               "medium": ["obs", "action", "reward", "terminated", "truncated"],
               "image": ["obs", "action", "reward", "terminated", "truncated"]}
NUM_ENVS = 8                 # rows per env step (a vector env); capacities are multiples of it
FILL_ROWS = 1000             # rows per extend while filling; also the extend before a stats read
STEP_POOL = 64               # distinct pre-made env steps, cycled
UPDATE_ROWS, UPDATE_POOL = 256, 64   # update_field: rows per call, pre-drawn (slots, values) pairs
DQN = ((1, 100), (1, 1000), (4, 100), (4, 1000))  # (sample every k steps, stats read every m steps)

DEFAULT_SEEDS = {"full": 5, "quick": 3}
BUDGET_S = {"full": 0.3, "quick": 0.04}    # timed seconds per (op, layout, config, seed)
MIN_CALLS = {"full": 5, "quick": 3}        # ... at least this many calls (slow ones take longer)
MAX_CALLS = {"full": 5000, "quick": 1000}
ROUNDS = {"full": 4, "quick": 2}           # calls split in rounds, the layouts alternating
WARMUP_CALLS = 10                          # untimed calls before a cheap op's measurement
HEAVY_NS = 5_000_000                       # an op slower than this gets one warm-up call
VERDICT_MARGIN = 0.03  # a winner needs every seed on its side and a mean ratio beyond 1 +- 3%

OUT_DIR = report_dir(EXPERIMENT)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- The operations and workloads: what one timed call does --------------------------------------
def _op(family: str, label: str, unit: str = "call", per: int = 1, kinds=None) -> dict:
    return {"family": family, "label": label, "unit": unit, "per": per, "kinds": kinds}


WITH_OBS = ("cartpole", "medium", "image")
OPS = {
    "scan_reward": _op("column scans", "column_stats('reward')"),
    "scan_obs": _op("column scans", "column_stats('obs')", kinds=WITH_OBS),
    "numpy_reward": _op("column scans (numpy reference)", "numpy mean of column('reward')"),
    "numpy_obs": _op("column scans (numpy reference)", "numpy mean of column('obs')", kinds=WITH_OBS),
    "update_reward": _op("relabelling", f"update_field('reward', {UPDATE_ROWS} rows)"),
    "sample_one": _op("projected sampling", "sample(B, fields=[obs])"),
    "sample_half": _op("projected sampling", "sample(B, fields=~half the bytes)"),
    "sample_full": _op("whole-row sampling", "sample(B)"),
    "extend_step": _op("writes", f"extend({NUM_ENVS} rows: one env step)"),
    "stats_read": _op("running-statistics reads", f"stats(obs) after extend({FILL_ROWS})"),
    **{f"dqn_k{k}_m{m}": _op("DQN-like loop", f"DQN step: sample every {k}, stats every {m}", "env step", m)
       for k, m in DQN},
    "offline_epoch": _op("offline-RL epoch", "offline epoch: column_stats + N/B batches", "epoch"),
    "aux_loss": _op("auxiliary loss", "aux step: sample(B) + sample(B, fields=[obs])", "step"),
}
MIXED = ("DQN-like loop", "offline-RL epoch", "auxiliary loss")


def ops_for(kind: str) -> list[str]:
    return [op for op, d in OPS.items() if d["kinds"] is None or kind in d["kinds"]]


def make_spec(kind: str) -> tfdata.Spec:
    return tfdata.Spec(ROW_KINDS[kind])


def op_call(op: str, buf, kind: str, pools: dict):
    """``(fn, setup)``: ``fn(_)`` is one timed call of ``op`` on ``buf``, ``setup(_)`` (or None)
    runs untimed before it."""
    b, f = BATCH[kind], NORM_FIELD[kind]
    one, half = [f], HALF_FIELDS[kind]
    if op.startswith("scan_"):
        name = op[5:]
        return (lambda _: buf.column_stats(name)), None
    if op.startswith("numpy_"):
        name = op[6:]

        def numpy_mean(_):  # one or two segments (the ring wrapped), weighted by their rows
            segs = buf.column(name).segments
            return sum(s.mean(axis=0) * len(s) for s in segs) / len(buf)

        return numpy_mean, None
    if op == "update_reward":
        pos = [0]

        def update(_):
            idx, vals = pools["update"][pos[0] % UPDATE_POOL]
            pos[0] += 1
            buf.update_field("reward", idx, vals)

        return update, None
    if op == "extend_step":
        steps, pos = pools["steps"], [0]

        def extend(_):
            buf.extend(steps[pos[0] % STEP_POOL])
            pos[0] += 1

        return extend, None
    if op == "sample_full":
        return (lambda _: buf.sample(b)), None
    if op == "sample_one":
        return (lambda _: buf.sample(b, fields=one)), None
    if op == "sample_half":
        return (lambda _: buf.sample(b, fields=half)), None
    if op == "stats_read":
        def write(_):  # pending relabels folded in first, so the read pays for this extend only
            buf.stats(f)
            buf.extend(pools["chunk"])

        return (lambda _: buf.stats(f)), write
    if op.startswith("dqn_"):
        k, m = (int(x[1:]) for x in op.split("_")[1:])
        steps, pos = pools["steps"], [0]

        def block(_):  # m env steps, then the statistics read of every m steps
            i = pos[0]
            for s in range(1, m + 1):
                buf.extend(steps[i % STEP_POOL])
                i += 1
                if s % k == 0:
                    buf.sample(b)
            buf.stats(f)
            pos[0] = i

        return block, None
    if op == "offline_epoch":
        names = ("obs", "reward") if "obs" in buf.spec else ("reward",)
        n_batches = -(-len(buf) // b)

        def epoch(_):
            for name in names:
                buf.column_stats(name)
            for _ in range(n_batches):
                buf.sample(b)

        return epoch, None
    if op == "aux_loss":
        def aux(_):
            buf.sample(b)
            buf.sample(b, fields=one)

        return aux, None
    raise KeyError(op)


def make_pools(capacity: int, rng: np.random.Generator, chunk: dict) -> dict:
    """Inputs drawn before timing: env steps (views of ``chunk``), update_field slots and values."""
    steps = [{k: v[i * NUM_ENVS:(i + 1) * NUM_ENVS] for k, v in chunk.items()} for i in range(STEP_POOL)]
    update = [(rng.choice(capacity, UPDATE_ROWS, replace=False).astype(np.int64),
               rng.standard_normal(UPDATE_ROWS, dtype=np.float32)) for _ in range(UPDATE_POOL)]
    return {"chunk": chunk, "steps": steps, "update": update}


# -- Layouts: the two fixed ones, and the groupings this tfdata accepts --------------------------
def probe_groupings() -> dict:
    """Build a small buffer with every grouping: ``{name: {kind: "ok" or the error}}``."""
    out = {}
    for name, per_kind in GROUPINGS.items():
        out[name] = {}
        for kind, groups in per_kind.items():
            try:
                tfdata.ReplayBuffer(make_spec(kind), NUM_ENVS, layout=groups)
                out[name][kind] = "ok"
            except Exception as exc:  # any refusal means: not available
                out[name][kind] = f"{type(exc).__name__}: {exc}"
    return out


def layout_arg(name: str, kind: str, probe: dict):
    """What ``layout=`` gets for candidate ``name`` and row ``kind``; None: not measured."""
    if name in BASE_LAYOUTS:
        return name
    return GROUPINGS[name].get(kind) if probe.get(name, {}).get(kind) == "ok" else None


def build(name: str, kind: str, capacity: int, seed: int, probe: dict):
    return tfdata.ReplayBuffer(make_spec(kind), capacity, layout=layout_arg(name, kind, probe), seed=seed,
                               num_envs=NUM_ENVS, stats=[NORM_FIELD[kind]])


def warm_kernels(candidates: list, probe: dict) -> float:
    """Load (or compile) every kernel used, so no measurement pays for it."""
    import time

    t0 = time.perf_counter()
    for kind in ROW_KINDS:
        spec = make_spec(kind)
        chunk = make_chunk(spec, FILL_ROWS, np.random.default_rng(0))
        pools = make_pools(FILL_ROWS, np.random.default_rng(1), chunk)
        for name in candidates:
            if layout_arg(name, kind, probe) is None:
                continue
            buf = build(name, kind, FILL_ROWS, 0, probe)
            buf.extend(chunk)
            for op in ops_for(kind):
                if op.startswith("dqn_") and not op.endswith("_m100"):
                    continue  # the same calls as m=100, longer
                fn, setup = op_call(op, buf, kind, pools)
                if setup:
                    setup(None)
                fn(None)
    return time.perf_counter() - t0


# -- Measurement: one (row kind, capacity, seed), every layout interleaved -----------------------
def run_config(kind: str, capacity: int, seed: int, mode: str, order_key: int, candidates: list,
               probe: dict) -> dict:
    spec = make_spec(kind)
    rng = np.random.default_rng([seed, list(ROW_KINDS).index(kind), capacity])
    chunk = make_chunk(spec, FILL_ROWS, rng)
    pools = make_pools(capacity, rng, chunk)
    names = rotated([c for c in candidates if layout_arg(c, kind, probe) is not None], order_key)
    out = {"kind": kind, "capacity": capacity, "seed": seed, "layout_order": names, "fill": {}, "ops": {},
           "errors": {}}
    bufs = build_filled(names, lambda n: build(n, kind, capacity, seed, probe), chunk, capacity, out["fill"])
    with gc_paused():
        for oi, op in enumerate(ops_for(kind)):
            calls, setups, probe_ns = {}, {}, {}
            for name in rotated(names, oi):
                fn, setup = op_call(op, bufs[name], kind, pools)
                try:  # one untimed call: a layout that refuses the op is left out of it
                    probe_ns[name] = int(time_calls(fn, None, 1, setup)[0])
                except Exception as exc:
                    out["errors"][f"{op}/{name}"] = f"{type(exc).__name__}: {exc}"
                    continue
                calls[name], setups[name] = fn, setup
            if not calls:
                continue
            heavy = max(probe_ns.values()) > HEAVY_NS
            out["ops"][op] = interleaved_latencies(
                calls, [None], budget_s=BUDGET_S[mode], lo=MIN_CALLS[mode], hi=MAX_CALLS[mode],
                rounds=ROUNDS[mode], warmup=1 if heavy else WARMUP_CALLS, setups=setups)[None]
    del bufs
    return out


# -- Aggregation: per (op, row kind, capacity), who wins and by how much --------------------------
def config_info(kind: str, capacity: int) -> dict:
    spec = make_spec(kind)
    aos = spec.aos_dtype.itemsize * capacity
    return {"row_nbytes": spec.row_nbytes, "aos_storage_bytes": aos, "cache_placement": cache_placement(aos)}


def judge(per_seed: dict) -> dict:
    """Winner of one cell from per-seed times ``{layout: [t_seed, ...]}`` (same seeds).

    The best layout has the lowest mean; it *wins* when it is faster than every other layout in
    every seed, by more than the margin on the mean ratio; otherwise the cell is a tie between it
    and the layouts it does not clearly beat.
    """
    lays = list(per_seed)
    mean = {k: mean_std(v)[0] for k, v in per_seed.items()}
    best = min(lays, key=mean.get)
    # time(k) / time(best) per seed; the verdict names best when it is above 1 + margin in every seed
    vs = {k: ratio_summary([o / b for o, b in zip(per_seed[k], per_seed[best])], k, best, VERDICT_MARGIN)
          for k in lays if k != best}
    tied = [best] + [k for k, r in vs.items() if r["faster"] != best]
    runner = min(vs, key=lambda k: vs[k]["mean"]) if vs else None
    return {"best": best, "winner": best if len(tied) == 1 else "tie", "tied": tied, "runner_up": runner,
            "advantage": vs.get(runner), "versus_best": vs}


def aggregate(raw: list, kinds_caps: list, candidates: list) -> list:
    cells = []
    for op, d in OPS.items():
        for kind, cap in kinds_caps:
            runs = [r for r in raw if r["kind"] == kind and r["capacity"] == cap and op in r["ops"]]
            if not runs:
                continue
            lays = [c for c in candidates if all(c in r["ops"][op] for r in runs)]
            per = {c: [r["ops"][op][c]["median_us"] / d["per"] for r in runs] for c in lays}
            layouts = {}
            for c in lays:
                m, sd = mean_std(per[c])
                p99 = mean_std([r["ops"][op][c]["p99_us"] / d["per"] for r in runs])[0]
                layouts[c] = {"median_us_mean": m, "median_us_std": sd, "p99_us_mean": p99, "per_seed": per[c],
                              "calls_per_seed": [r["ops"][op][c]["n"] for r in runs]}
            cell = {"op": op, "family": d["family"], "unit": d["unit"], "kind": kind, "capacity": cap,
                    **config_info(kind, cap), "seeds": [r["seed"] for r in runs], "layouts": layouts,
                    **judge(per)}
            if "aos" in per and "soa" in per:
                cell["soa_over_aos"] = ratio_summary([s / a for s, a in zip(per["soa"], per["aos"])], "soa",
                                                     "aos", VERDICT_MARGIN)
            cell["hybrid_over_best_base"] = {
                h: ratio_summary([t / min(a, s) for t, a, s in zip(per[h], per["aos"], per["soa"])], h, "base",
                                 VERDICT_MARGIN)
                for h in lays if h not in BASE_LAYOUTS and "aos" in per and "soa" in per}
            cells.append(cell)
    return cells


# -- The crossover map and the decision table, from the cells ------------------------------------
def where(cells, family=None) -> str:
    """'tiny 1e4, cartpole 1e6' for cells of one operation; for cells of several operations of a
    family (``family``: all that family's cells), each configuration once with how many of its
    operations these cells are, 'cartpole 1e6 (2 of 4)'."""
    cfgs = list(dict.fromkeys((c["kind"], c["capacity"]) for c in cells))
    if family is None or len(cfgs) == len(cells) and len({c["op"] for c in family}) == 1:
        return ", ".join(f"{k} {fmt_count(cap)}" for k, cap in cfgs)
    count = lambda cs, kc: sum((c["kind"], c["capacity"]) == kc for c in cs)  # noqa: E731
    return ", ".join(f"{k} {fmt_count(cap)} ({count(cells, (k, cap))} of {count(family, (k, cap))})"
                     for k, cap in cfgs)


def decision_rows(cells: list, candidates: list) -> list:
    """Per candidate layout: the ops it wins in every measured (row kind, capacity), the ops it
    wins only for some, and by how much (next best's time / its time)."""
    rows = []
    by_op = {}
    for c in cells:
        by_op.setdefault(c["op"], []).append(c)
    for lay in candidates:
        always, some = [], []
        for op, cs in by_op.items():
            won = [c for c in cs if c["winner"] == lay]
            if not won:
                continue
            adv = [c["advantage"]["mean"] for c in won]
            item = {"op": op, "label": OPS[op]["label"], "family": OPS[op]["family"], "cells": len(won),
                    "of": len(cs), "where": where(won), "advantage_gmean": gmean(adv),
                    "advantage_min": min(adv), "advantage_max": max(adv),
                    "elsewhere": {c["kind"] + " " + fmt_count(c["capacity"]): c["winner"] for c in cs
                                  if c["winner"] != lay}}
            (always if len(won) == len(cs) else some).append(item)
        rows.append({"layout": lay, "always": always, "some": some})
    ties = [op for op, cs in by_op.items() if all(c["winner"] == "tie" for c in cs)]
    rows.append({"layout": "tie", "always": [{"op": op, "label": OPS[op]["label"], "family": OPS[op]["family"]}
                                             for op in ties], "some": []})
    return rows


def x_range(item: dict) -> str:
    lo, hi, g = item["advantage_min"], item["advantage_max"], item["advantage_gmean"]
    return f"{g:.2f}x" if hi - lo < 0.005 else f"{g:.2f}x ({lo:.2f}-{hi:.2f})"


def decision_table(rows: list) -> list:
    """Rows of the decision table: per layout, the operations it wins everywhere and those it wins
    only for some row kinds or capacities (with where), each with its factor over the next best."""
    out = []
    for r in rows:
        if r["layout"] == "tie":
            if r["always"]:
                out.append(["no clear winner", "; ".join(i["label"] for i in r["always"]), ""])
            continue
        always = "<br>".join(f"{i['label']}: {x_range(i)}" for i in r["always"]) or "-"
        some = "<br>".join(f"{i['label']}: {i['where']} ({i['cells']} of {i['of']}), {x_range(i)}"
                           for i in r["some"]) or "-"
        out.append([f"**{LABELS[r['layout']]}**", always, some])
    return out


def family_winners(cells: list, candidates: list) -> dict:
    """``{family: {"n": cells, layout or "tie": [cells it wins]}}``, the numpy reference left out."""
    out = {}
    for c in cells:
        if c["family"].endswith("(numpy reference)"):
            continue
        f = out.setdefault(c["family"], {"n": 0})
        f["n"] += 1
        f.setdefault(c["winner"], []).append(c)
    return out


def choose_sentences(cells: list, candidates: list) -> list[str]:
    """'Choose AoS when ...', 'SoA when ...', 'a grouping when ...', and the families whose winner
    depends on the row kind or capacity, from the cells: a layout is chosen for a family of
    operations when it wins more than half of that family's cells."""
    fams = family_winners(cells, candidates)
    major = {f: next((k for k in candidates if len(w.get(k, [])) * 2 > w["n"]), None) for f, w in fams.items()}
    out = []

    def span(cs):
        adv = [c["advantage"]["mean"] for c in cs]
        return f"{min(adv):.2f}-{max(adv):.2f}x"

    def wins(f, k):
        w = fams[f].get(k, [])
        every = [c for cs in fams[f].values() if isinstance(cs, list) for c in cs]
        but = [f"{LABELS[o]} for {where(fams[f][o], every)}, {span(fams[f][o])}" for o in candidates
               if o != k and fams[f].get(o)]
        return f"{f} ({len(w)} of {fams[f]['n']} cells, {span(w)}" + (f"; but {', '.join(but)}" if but else "") + ")"

    for k in candidates:
        mine = [f for f, m in major.items() if m == k]
        if k in BASE_LAYOUTS or mine:
            what = "; ".join(wins(f, k) for f in mine) if mine else "none of these workloads"
            out.append(f"**Choose {LABELS[k]}** when the buffer's time goes to {what}.")
    groupings = [k for k in candidates if k not in BASE_LAYOUTS]
    if not groupings:
        out.append("**A grouping**: not measured (hybrid not available in this tfdata, see above).")
    elif not any(major[f] in groupings for f in major):
        won = [c for c in cells if c["winner"] in groupings]
        out.append("**A grouping** wins no family of operations; " + (
            "it wins " + ", ".join(f"{OPS[c['op']]['label']} on {c['kind']} {fmt_count(c['capacity'])} "
                                   f"({LABELS[c['winner']]}, {c['advantage']['mean']:.2f}x)" for c in won)
            if won else "it wins no cell") + ".")
    mixed = [f for f, m in major.items() if m is None]
    if mixed:
        parts = []
        for f in mixed:
            for op in dict.fromkeys(c["op"] for k in candidates + ["tie"] for c in fams[f].get(k, [])):
                by = {k: [c for c in fams[f].get(k, []) if c["op"] == op] for k in candidates + ["tie"]}
                parts.append(f"{OPS[op]['label']}: " + ", ".join(f"{LABELS[k]} for {where(cs)}"
                                                                 for k, cs in by.items() if cs))
        out.append("**Depends on the row kind and capacity** (" + ", ".join(mixed) + ": no layout wins more than "
                   "half of the cells): " + "; ".join(parts) + ".")
    return out


def family_lines(cells: list, candidates: list) -> list[str]:
    """Per family of operations: who wins how many cells, and the range of the winning factor."""
    out = []
    fams = list(dict.fromkeys(OPS[c["op"]]["family"] for c in cells))
    for fam in fams:
        cs = [c for c in cells if c["family"] == fam]
        wins = {k: [c for c in cs if c["winner"] == k] for k in candidates + ["tie"]}
        parts = []
        for k, won in wins.items():
            if not won:
                continue
            if k == "tie":
                parts.append(f"{len(won)} tied")
            else:
                adv = [c["advantage"]["mean"] for c in won]
                parts.append(f"{LABELS[k]} wins {len(won)} (by {min(adv):.2f}-{max(adv):.2f}x)")
        soa = [c["soa_over_aos"]["mean"] for c in cs if "soa_over_aos" in c]
        out.append(f"**{fam}** ({len(cs)} cells): " + ", ".join(parts)
                   + (f"; SoA/AoS time ratio {min(soa):.2f}-{max(soa):.2f} (geometric mean {gmean(soa):.2f})"
                      if soa else "") + ".")
    return out


def headline(cells: list, candidates: list) -> str:
    """One line for the reports index: the wins overall, then per family of operations."""
    n = len(cells)
    w = {k: sum(c["winner"] == k for c in cells) for k in candidates + ["tie"]}
    head = f"Crossover map, {n} cells (operation x row kind x capacity): " + ", ".join(
        f"{LABELS[k]} wins {v}" if k != "tie" else f"{v} tied" for k, v in w.items() if v or k in BASE_LAYOUTS)
    parts = []
    for f, by in family_winners(cells, candidates).items():
        ranked = sorted((k for k in candidates if by.get(k)), key=lambda k: -len(by[k]))
        txt = ", ".join(f"{LABELS[k]} {len(by[k])}/{by['n']}" for k in ranked) or "all tied"
        if ranked:
            txt += f" (up to {max(c['advantage']['mean'] for c in by[ranked[0]]):.1f}x)"
        parts.append(f"{f}: {txt}")
    return head + ". " + "; ".join(parts) + "."


# -- Formatting -----------------------------------------------------------------------------------
def fmt_time(us: float) -> str:
    """'12.3 µs', '4.56 ms', '1.23 s'."""
    if math.isnan(us):
        return "?"
    if us < 1000:
        return f"{fmt_us(us)} µs"
    if us < 1e6:
        return f"{fmt_us(us / 1e3)} ms"
    return f"{us / 1e6:.2f} s"


def pm(s: dict) -> str:
    """'12.3 µs ± 0.45 µs': mean ± std across seeds of a layout's per-seed medians."""
    return f"{fmt_time(s['median_us_mean'])} ± {fmt_time(s['median_us_std'])}"


def cell_text(c: dict) -> str:
    """A crossover-map cell: the winner and its factor over the next best, or the tie."""
    if c["winner"] == "tie":
        return "tie (" + "/".join(SHORT[k] for k in c["tied"]) + ")"
    a = c["advantage"]
    return f"**{SHORT[c['winner']]}** {a['mean']:.2f}x ± {a['std']:.2f}"


def configs_of(cells: list) -> list:
    return list(dict.fromkeys((c["kind"], c["capacity"]) for c in cells))


# -- Figures --------------------------------------------------------------------------------------
def plot_map(cells: list, candidates: list, mode: str, n_seeds: int) -> str:
    """crossover_map.png: SoA/AoS per (op, config) as colour, the winner written in each cell; one
    more panel per grouping (its time over the better of AoS and SoA)."""
    plt = pyplot()
    ops = list(dict.fromkeys(c["op"] for c in cells))
    cfgs = configs_of(cells)
    get = {(c["op"], c["kind"], c["capacity"]): c for c in cells}
    get_cfg = {(c["kind"], c["capacity"]): c for c in cells}  # placement as measured, on the run's machine
    hybrids = [h for h in candidates if h not in BASE_LAYOUTS]
    panels = [("soa_over_aos", None, "SoA / AoS time (<1: SoA faster)")] + [
        ("hybrid", h, f"{LABELS[h]} / better of AoS, SoA") for h in hybrids]
    fig, axes = plt.subplots(1, len(panels), figsize=(1.1 * len(cfgs) * len(panels) + 4.5, 0.42 * len(ops) + 2.4),
                             squeeze=False, layout="constrained")
    lim = math.log10(20)
    for ax, (key, h, title) in zip(axes[0], panels):
        z = np.full((len(ops), len(cfgs)), np.nan)
        for i, op in enumerate(ops):
            for j, (k, cap) in enumerate(cfgs):
                c = get.get((op, k, cap))
                r = None if c is None else (c.get("soa_over_aos") if h is None else
                                            c["hybrid_over_best_base"].get(h))
                if r is None:
                    ax.text(j, i, "n/a", ha="center", va="center", fontsize=7, color="0.5")
                    continue
                z[i, j] = math.log10(r["mean"])
                ax.text(j, i, f"{r['mean']:.2f}\n{SHORT.get(c['winner'], 'tie')}", ha="center", va="center",
                        fontsize=6.5, color="white" if abs(z[i, j]) > 0.75 else "black")  # readable on dark cells
        im = ax.imshow(np.clip(z, -lim, lim), cmap="PuOr_r", vmin=-lim, vmax=lim, aspect="auto")
        ax.set_xticks(range(len(cfgs)), [f"{k}\n{fmt_count(cap)}" for k, cap in cfgs], fontsize=7.5)
        ax.set_yticks(range(len(ops)), [OPS[o]["label"] for o in ops] if ax is axes[0][0] else [], fontsize=7.5)
        ax.set_title(title, fontsize=9)
    cb = fig.colorbar(im, ax=list(axes[0]), shrink=0.8, pad=0.01)
    ticks = [0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20]
    cb.set_ticks([math.log10(t) for t in ticks], labels=[f"{t:g}" for t in ticks])
    cb.set_label("time ratio (log scale; colour clipped at 20x)", fontsize=8)
    fig.suptitle(f"Crossover map ({mode} run, {n_seeds} seeds): number = mean of per-seed time ratios,\n"
                 "second line = the winner over all layouts (tie: none beats the others in every seed "
                 f"by > {VERDICT_MARGIN:.0%})", fontsize=9)
    return save_figure(fig, OUT_DIR, "crossover_map.png")


def plot_bars(cells: list, candidates: list, families, name: str, title: str, mode: str, n_seeds: int) -> str:
    """Per op a panel: each layout's time over AoS's (per-seed ratios, mean ± std) per config."""
    plt = pyplot()
    ops = [o for o in dict.fromkeys(c["op"] for c in cells) if OPS[o]["family"] in families]
    ncol = 3
    nrow = -(-len(ops) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(15, 3.3 * nrow + 0.9), squeeze=False)
    for ax, op in zip(axes.flat, ops):
        cs = [c for c in cells if c["op"] == op]
        lays = [k for k in candidates if k != "aos" and any(k in c["layouts"] for c in cs)]  # AoS: the line at 1
        series = {}
        for k in lays:
            hs, es = [], []
            for c in cs:
                if k in c["layouts"] and "aos" in c["layouts"]:
                    r = [t / a for t, a in zip(c["layouts"][k]["per_seed"], c["layouts"]["aos"]["per_seed"])]
                    m, sd = mean_std(r)
                else:
                    m, sd = float("nan"), 0.0
                hs.append(m)
                es.append(sd)
            series[k] = (hs, es)
        grouped_bars(ax, [f"{c['kind']}\n{fmt_count(c['capacity'])}" for c in cs], series, COLORS, LABELS,
                     width=0.7 / max(1, len(lays)), log_base=1.0,
                     notes=[SHORT.get(c["winner"], "tie") for c in cs])
        ax.set_title(f"{OPS[op]['label']}", fontsize=9)
        ax.set_ylabel(f"time per {OPS[op]['unit']} / AoS's", fontsize=8)
    for ax in list(axes.flat)[len(ops):]:
        ax.axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle(f"{title} ({mode} run, {n_seeds} seeds): time over AoS's time (the line at 1); bar = mean of "
                 "per-seed ratios, error bar = std; above: the winner over all layouts", fontsize=9.5)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    return save_figure(fig, OUT_DIR, name)


# -- Report ---------------------------------------------------------------------------------------
def write_report(cells: list, rows: list, probe: dict, candidates: list, run: dict, files: list,
                 raw: list) -> None:
    mode, seeds = run["mode"], run["seeds"]
    cfgs = configs_of(cells)
    get = {(c["op"], c["kind"], c["capacity"]): c for c in cells}
    get_cfg = {(c["kind"], c["capacity"]): c for c in cells}  # placement as measured, on the run's machine
    ops = list(dict.fromkeys(c["op"] for c in cells))
    hybrids = [h for h in candidates if h not in BASE_LAYOUTS]
    bullets = lambda lines: "- " + "\n- ".join(lines) + "\n" if lines else ""  # noqa: E731
    hybrid_note = hybrid_text(probe, hybrids)
    L = ["# AoS, SoA or a grouping: which layout wins which workload (column scans, relabelling, projected "
         "sampling, mixed training loops)?\n",
         f"<!-- headline: {headline(cells, candidates)} -->\n",
         produced_by(mode, run["run_name"], len(seeds), run["wall_clock_s"], run["started_utc"])
         + " Every table and figure below comes from that run; a rerun rewrites them and keeps the hand-written "
         "text. "
         + ("The published report is the full run (`python experiments/workloads.py`)." if mode == "quick" else
            "`tfdata run workloads --quick` writes a smaller run under `reports/quick/`."), "",
         "## Answer\n", headline(cells, candidates) + "\n", hybrid_note + "\n",
         "By family of operations (a cell is one (operation, row kind, capacity); a winner is faster than every "
         f"other layout in every seed, by more than {VERDICT_MARGIN:.0%} on the mean ratio; the factor is the next "
         "best layout's time over the winner's):\n", bullets(family_lines(cells, candidates)),
         "### Decision table\n", bullets(choose_sentences(cells, candidates)),
         "Per operation (written from the winners in the crossover map below; the factor is the next best "
         "layout's time over the winner's, geometric mean and range over the cells it wins):\n"]
    L += md_table(["choose", "it wins every measured row kind and capacity of", "it wins only some cells of"],
                  decision_table(rows), "lll")
    L += ["", *hand_written(OUT_DIR, "also"),
          "## Crossover map\n", "![crossover_map.png](crossover_map.png)\n",
          "The winner of each cell and its factor over the next best layout (mean ± std across seeds of the "
          "per-seed ratio); a tie lists the layouts none of which beats the others clearly. Short names: "
          + ", ".join(f"{SHORT[k]} = {LABELS[k]}" for k in candidates) + ".\n"]
    L += md_table(["operation", *(f"{k} {fmt_count(cap)}" for k, cap in cfgs)],
                  [[OPS[op]["label"], *(cell_text(get[(op, k, cap)]) if (op, k, cap) in get else "n/a"
                                        for k, cap in cfgs)] for op in ops], "l" + "l" * len(cfgs))
    L += ["", "SoA/AoS time ratio (mean ± std across seeds; below 1: SoA faster):\n"]
    L += md_table(["operation", *(f"{k} {fmt_count(cap)}" for k, cap in cfgs)],
                  [[OPS[op]["label"], *(f"{get[(op, k, cap)]['soa_over_aos']['mean']:.2f} ± "
                                        f"{get[(op, k, cap)]['soa_over_aos']['std']:.2f}"
                                        if (op, k, cap) in get and "soa_over_aos" in get[(op, k, cap)] else "n/a"
                                        for k, cap in cfgs)] for op in ops], "l" + "r" * len(cfgs))
    L += ["", "## Operations\n", "![operations.png](operations.png)\n"]
    L += times_table(cells, [o for o in ops if OPS[o]["family"] not in MIXED], candidates)
    L += ["", "## Mixed workloads\n",
          *hand_written(OUT_DIR, "mixed"),
          "![workloads.png](workloads.png)\n"]
    L += times_table(cells, [o for o in ops if OPS[o]["family"] in MIXED], candidates)
    L += ["", *hand_written(OUT_DIR, "dqn parts")]
    L += dqn_parts_table(cells, candidates)
    L += ["", "## What is compared\n"]
    L += md_table(["row kind", "fields", "data bytes/row", "AoS record", "B", "field normalised",
                   "half-row projection (share of the row's bytes)", "capacities (AoS storage, where it fits)"],
                  [[k, ", ".join(f"{f.name} {f.dtype.str[1:]}{list(f.shape) if f.shape else ''}" for f in spec),
                    spec.row_nbytes, spec.aos_dtype.itemsize, BATCH[k], NORM_FIELD[k],
                    f"{', '.join(HALF_FIELDS[k])} "
                    f"({sum(spec[n].nbytes for n in HALF_FIELDS[k]) / spec.row_nbytes:.0%})",
                    "; ".join(f"{cap:,} ({fmt_bytes(get_cfg[k, cap]['aos_storage_bytes'])}, "
                              f"{get_cfg[k, cap]['cache_placement']})" for kk, cap in cfgs if kk == k)]
                   for k in dict.fromkeys(k for k, _ in cfgs) for spec in [make_spec(k)]], "llrrrlll")
    L += ["", "Layouts: `ReplayBuffer(spec, capacity, layout=..., num_envs=" f"{NUM_ENVS}, stats=[field])` with "
          "`layout=\"aos\"` (one record array), `\"soa\"` (one array per field)"
          + (", and the groupings " + "; ".join(f"{LABELS[h]} `{GROUPINGS[h]['cartpole']}`" for h in GROUPINGS)
             + " (each group a record array, groups side by side; the tiny row has no grouping distinct from "
             "AoS and SoA)" if GROUPINGS else "") + ". " + hybrid_note + "\n",
          *hand_written(OUT_DIR, "operations")]
    L += hand_written(OUT_DIR, "method")
    busy = run.get("machine_busy_fraction")
    cv = [c["advantage"]["std"] / c["advantage"]["mean"] for c in cells if c["advantage"]]
    spread = (f"Across seeds, the winner's factor over the next best varies by {np.median(cv):.0%} (coefficient "
              f"of variation, median over cells; worst {max(cv):.0%})." if cv else "")
    L += [(f"The machine was busy {busy:.0%} of the run (both CPUs together) while this experiment kept one "
           "busy. " if busy is not None else "") + spread + "\n"]
    errs = {k: v for r in raw for k, v in r["errors"].items()}
    if errs:
        L += ["## Refused operations\n", "Layouts that raised on an operation (left out of that operation):\n",
              bullets([f"`{k}`: {v}" for k, v in errs.items()])]
    write_methodology_report(OUT_DIR, L, run)


def hybrid_text(probe: dict, hybrids: list) -> str:
    if hybrids:
        return "Hybrid groupings measured: " + ", ".join(
            f"{LABELS[h]} ({', '.join(k for k, v in probe[h].items() if v == 'ok')})" for h in hybrids) + "."
    errors = [v for per in probe.values() for v in per.values() if v != "ok"]
    first = errors[0] if len(errors[0]) <= 100 else errors[0][:97] + "..."
    return ("**hybrid not available in this tfdata**: `ReplayBuffer(spec, 8, layout=[[...], [...]])` raised "
            f"`{first}` (for each of the {len(errors)} groupings and row kinds probed; the messages are in "
            "`results.json`), so the groupings are left out of every table and figure; rerun this experiment with a "
            "tfdata that has them.")


def times_table(cells: list, ops: list, candidates: list) -> list[str]:
    rows = []
    for op in ops:
        for c in [c for c in cells if c["op"] == op]:
            rows.append([OPS[op]["label"], f"{c['kind']} {fmt_count(c['capacity'])}",
                         *(pm(c["layouts"][k]) if k in c["layouts"] else "n/a" for k in candidates),
                         cell_text(c)])
    return md_table(["operation", "rows", *(f"{LABELS[k]} (median per call, step or epoch)" for k in candidates),
                     "winner"], rows, "ll" + "r" * len(candidates) + "l")


def dqn_parts_table(cells: list, candidates: list) -> list[str]:
    get = {(c["op"], c["kind"], c["capacity"]): c for c in cells}
    get_cfg = {(c["kind"], c["capacity"]): c for c in cells}  # placement as measured, on the run's machine
    parts = ["extend_step", "sample_full", "stats_read", "dqn_k1_m100", "dqn_k4_m100"]
    rows = []
    for k, cap in configs_of(cells):
        row = [f"{k} {fmt_count(cap)}"]
        for op in parts:
            c = get.get((op, k, cap))
            row.append(" / ".join(fmt_time(c["layouts"][lay]["median_us_mean"]) if c and lay in c["layouts"]
                                  else "n/a" for lay in candidates))
        rows.append(row)
    head = " / ".join(SHORT[k] for k in candidates)
    return md_table(["rows", *(f"{OPS[op]['label']} ({head})" for op in parts)], rows, "l" + "r" * len(parts))


def print_table(cells: list, candidates: list) -> None:
    cfgs = configs_of(cells)
    get = {(c["op"], c["kind"], c["capacity"]): c for c in cells}
    get_cfg = {(c["kind"], c["capacity"]): c for c in cells}  # placement as measured, on the run's machine
    ops = list(dict.fromkeys(c["op"] for c in cells))
    def short(c):
        return "tie" if c["winner"] == "tie" else f"{SHORT[c['winner']]} {c['advantage']['mean']:.2f}x"

    print("\n" + text_table(["operation", *(f"{k} {fmt_count(cap)}" for k, cap in cfgs)],
                            [[OPS[op]["label"], *(short(get[(op, k, cap)]) if (op, k, cap) in get else "-"
                                                  for k, cap in cfgs)] for op in ops]) + "\n", flush=True)


def render(path: str) -> list[str]:
    """The plots and README.md of ``OUT_DIR`` from a results.json; returns the plots' names."""
    res = read_results(path, int_keys=True)
    run, cells = res["methodology"], res["cells"]
    mode, n_seeds, candidates = run["mode"], len(run["seeds"]), run["parameters"]["layouts"]
    os.makedirs(OUT_DIR, exist_ok=True)
    files = [plot_map(cells, candidates, mode, n_seeds),
             plot_bars(cells, candidates, [f for f in dict.fromkeys(d["family"] for d in OPS.values())
                                           if f not in MIXED], "operations.png", "Operations", mode, n_seeds),
             plot_bars(cells, candidates, MIXED, "workloads.png", "Mixed workloads", mode, n_seeds)]
    write_report(cells, res["decision"], res["hybrid"]["probe"], candidates, run, files, res["raw"])
    return files


# -- Main -----------------------------------------------------------------------------------------
def main(argv=None) -> None:
    args = seeds_parser(__doc__, "small grid, short timing budgets (about 1 minute)",
                        "number of seeds (0..N-1) or a comma list, e.g. 0,1,2 "
                        f"(default {DEFAULT_SEEDS['full']} full, {DEFAULT_SEEDS['quick']} quick)").parse_args(argv)
    if args.render:
        render(args.render)
        return
    mode = "quick" if args.quick else "full"
    seeds = parse_seeds(args.seeds, DEFAULT_SEEDS[mode])
    command = " ".join(["python experiments/workloads.py", *(sys.argv[1:] if argv is None else argv)])
    kinds_caps = [(k, c) for k, caps in CAPACITIES[mode].items() for c in caps]
    probe = probe_groupings()
    candidates = list(BASE_LAYOUTS) + [h for h in GROUPINGS if any(v == "ok" for v in probe[h].values())]
    params = {"layouts": candidates, "groupings": GROUPINGS, "grouping_probe": probe,
              "hybrid_available": len(candidates) > len(BASE_LAYOUTS), "row_kinds": ROW_KINDS,
              "capacities": CAPACITIES[mode], "batch": BATCH, "norm_field": NORM_FIELD, "half_fields": HALF_FIELDS,
              "num_envs": NUM_ENVS, "fill_rows": FILL_ROWS, "step_pool": STEP_POOL, "update_rows": UPDATE_ROWS,
              "update_pool": UPDATE_POOL, "dqn_k_m": DQN, "budget_s": BUDGET_S[mode], "min_calls": MIN_CALLS[mode],
              "max_calls": MAX_CALLS[mode], "rounds": ROUNDS[mode], "warmup_calls": WARMUP_CALLS,
              "heavy_ns": HEAVY_NS, "verdict_margin": VERDICT_MARGIN,
              "ops": {op: {k: v for k, v in d.items() if k != "kinds"} for op, d in OPS.items()}}
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=seeds, command=command, parameters=params)
    os.makedirs(OUT_DIR, exist_ok=True)
    log = lambda msg: print(f"[{rec.elapsed():6.1f}s] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    log(f"run {rec.run_name}: {len(kinds_caps)} (row kind, capacity) x {len(OPS)} operations x layouts "
        f"{candidates} x {len(seeds)} seeds; {hybrid_text(probe, candidates[len(BASE_LAYOUTS):])}")
    params["kernel_warmup_s"] = round(warm_kernels(candidates, probe), 2)
    log(f"kernels ready ({params['kernel_warmup_s']} s)")
    raw = []
    for si, seed in enumerate(seeds):  # seeds outermost: drift over the run shows as spread across seeds
        for ci, (kind, cap) in enumerate(kinds_caps):
            raw.append(run_config(kind, cap, seed, mode, si + ci, candidates, probe))
            s = raw[-1]["ops"].get("sample_full", {})
            log(f"seed {seed} {kind:<8} cap {cap:>10,}: sample(B) median µs "
                + " ".join(f"{k} {v['median_us']:.1f}" for k, v in s.items()))
    cells = aggregate(raw, kinds_caps, candidates)
    rows = decision_rows(cells, candidates)
    print_table(cells, candidates)
    run = rec.finish()
    write_json(os.path.join(OUT_DIR, "results.json"),
               {"methodology": run, "hybrid": {"available": params["hybrid_available"], "probe": probe,
                                               "note": hybrid_text(probe, candidates[len(BASE_LAYOUTS):])},
                "cells": cells, "decision": rows, "headline": headline(cells, candidates), "raw": raw})
    files = render(os.path.join(OUT_DIR, "results.json"))
    rel = os.path.relpath(OUT_DIR, ROOT)
    print(f"{mode} run {rec.run_name} done in {run['wall_clock_s']:.0f} s; report: {rel}/README.md, "
          f"data: {rel}/results.json, plots: {', '.join(files)}", flush=True)


if __name__ == "__main__":
    main()
