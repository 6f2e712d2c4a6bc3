"""Offline RL: what do a Minari dataset's conversion, its batches, batches mixed with online data
and transforms on sample cost in tfdata, against Minari's own API and numpy?

Offline and offline-to-online methods sample a large, read-only dataset millions of times (RLPD
draws every batch half from the dataset, half from the online buffer). This experiment measures,
in one run and interleaved in time, on a CartPole-shaped dataset that Minari itself writes
(``minari.create_dataset_from_buffers``; episodes of random length, 66-byte transitions):

* **conversion**: ``tfdata.datasets.from_minari`` (AoS and SoA) against reading every episode with
  Minari's API (``iterate_episodes``) and against building the transition arrays a numpy loop
  needs from it; wall time and the growth of peak resident memory, each in a fresh forked process
  after a warm-up (imports and kernels), against the bound ``from_minari`` states;
* **sampling 256 transitions**: a converted ``MmapDataset`` drawn by ``MixedReplayBuffer`` (one
  source), against ``MinariDataset.sample_episodes`` (256 episodes, one step of each) and a
  numpy gather over the arrays in memory (``rng.integers`` and fancy indexing);
* **a mixed batch** (128 rows from the dataset, 128 from a ``ReplayBuffer``) against one uniform
  ``sample(256)`` of one buffer (of the dataset's rows; and of both sources' rows, twice as many,
  which is what the mixed batch reads from), and against the two samples taken apart and
  concatenated;
* **a transform on sample**: ``Normalize("obs")`` (compiled, in the sample path) against the same
  buffer's sample without it, and against normalising with numpy after the gather.

    python experiments/offline.py --quick     # 100k steps, about 2 minutes
    python experiments/offline.py             # 1M steps, about 10 minutes

Writes ``reports/offline/`` (``README.md``, ``results.json``, ``offline.png``); the Minari and
tfdata datasets it builds are scratch under it, deleted at the end. Only the public tfdata API,
plus numpy, minari, h5py and matplotlib.
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings
from functools import partial

import numpy as np

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
from _plots import hbar_medians, panels_figure  # noqa: E402
from _recording import RunRecord, parse_seeds, read_results, report_dir, seeds_parser, write_json  # noqa: E402
from _render import md_table  # noqa: E402
from _render import write_report as write_methodology_report  # noqa: E402
from _timing import fresh_pages_allocator, interleaved_latencies, peak_rss_hwm, remove, rss_statm, run_forked  # noqa: E402

# -- Parameters ----------------------------------------------------------------------------------
EXPERIMENT = "offline"
STEPS = {"full": 1_000_000, "quick": 100_000}      # transitions in the dataset
EPISODE_LEN = (10, 500)                           # uniform episode lengths (CartPole's range)
LAYOUTS = ("aos", "soa")
NAMES = {"aos": "AoS", "soa": "SoA"}
BATCH = 256
CONVERT_REPS = {"full": 3, "quick": 1}            # fresh processes per conversion arm
BUDGET_S = {"full": 1.0, "quick": 0.15}           # timed seconds per (candidate, round set)
CALLS = {"full": (200, 20_000), "quick": (40, 3_000)}
MINARI_CALLS = {"full": (10, 200), "quick": (3, 20)}
ROUNDS = {"full": 6, "quick": 3}
WARMUP = 5
TARGETS = {"vs_minari": 20.0, "vs_numpy": 1.2, "mixed": 1.2, "transform": 1.3}
DATASET_ID = "cartpole/offline-experiment-v0"
OUT_DIR = report_dir(EXPERIMENT)


# -- The dataset ---------------------------------------------------------------------------------
def make_minari_dataset(root: str, steps: int, seed: int):
    """A CartPole-shaped Minari dataset of ``steps`` transitions, written by Minari itself."""
    os.environ["MINARI_DATASETS_PATH"] = root
    import minari
    from minari.data_collector import EpisodeBuffer

    rng = np.random.default_rng(seed)
    episodes, n = [], 0
    while n < steps:
        t = int(min(rng.integers(EPISODE_LEN[0], EPISODE_LEN[1] + 1), steps - n))
        term, trunc = np.zeros(t, bool), np.zeros(t, bool)
        (trunc if t == EPISODE_LEN[1] else term)[-1] = True
        episodes.append(EpisodeBuffer(
            id=len(episodes), observations=rng.standard_normal((t + 1, 4)).astype(np.float32),
            actions=rng.integers(0, 2, t), rewards=np.ones(t), terminations=term, truncations=trunc))
        n += t
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Minari's notes on eval_env and missing fields
        return minari.create_dataset_from_buffers(
            DATASET_ID, episodes, env="CartPole-v1", algorithm_name="uniform random",
            author="tfdata experiments", author_email="experiments@example.org",
            code_permalink="https://example.org/experiments/offline.py")


def minari_arrays(ds) -> dict:
    """The transitions as numpy arrays in memory, built from Minari's episodes (what a numpy
    training loop over a Minari dataset holds)."""
    parts = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")}
    for ep in ds.iterate_episodes():
        parts["obs"].append(ep.observations[:-1])
        parts["next_obs"].append(ep.observations[1:])
        parts["action"].append(ep.actions)
        parts["reward"].append(ep.rewards)
        parts["terminated"].append(ep.terminations)
        parts["truncated"].append(ep.truncations)
    return {k: np.concatenate(v) for k, v in parts.items()}


# -- Conversion: each arm in a fresh forked process ------------------------------------------------
def conversion_bound(chunk_bytes: int = 16 << 20) -> int:
    """The resident growth ``from_minari``'s docstring states for ``chunk_bytes`` (its default)."""
    from tfdata.datasets import minari_format as mf

    return 4 * chunk_bytes + 2 * mf.MAX_H5_CHUNK + mf.H5_CACHE


def _reset_peak() -> None:
    # VmHWM back to the current RSS (Linux 4.0+), so the peak measured is the arm's own
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def convert_arm(arm: str, src: str, scratch: str, small: str) -> dict:
    import time

    import minari

    import tfdata.datasets

    fresh_pages_allocator()
    dst = os.path.join(scratch, f"convert-{arm}")
    ds = minari.load_dataset(DATASET_ID)
    # warm-up on a small dataset: imports, h5py's and tfdata's first calls, numba's kernels
    tfdata.datasets.from_minari(small, dst + "-warm", layout="aos")
    remove(dst + "-warm")  # an AoS dataset is one file
    for _ in ds.iterate_episodes(episode_indices=[0]):
        pass
    _reset_peak()
    rss0 = rss_statm()
    t0 = time.perf_counter()
    if arm in LAYOUTS:
        tfdata.datasets.from_minari(src, dst, layout=arm)
    elif arm == "minari_iterate":
        for ep in ds.iterate_episodes():
            ep.observations.sum()  # every array read
    elif arm == "minari_arrays":
        arrays = minari_arrays(ds)
        assert len(arrays["obs"]) == ds.total_steps
    wall = time.perf_counter() - t0
    peak = peak_rss_hwm() - rss0
    if arm in LAYOUTS:
        remove(dst)
    return {"arm": arm, "wall_s": wall, "peak_growth": peak, "steps": int(ds.total_steps)}


def measure_conversion(src: str, scratch: str, small: str, reps: int) -> list:
    arms = LAYOUTS + ("minari_iterate", "minari_arrays")
    out = []
    for r in range(reps):
        for arm in arms[r % len(arms):] + arms[:r % len(arms)]:
            res = run_forked(convert_arm, arm, src, scratch, small)
            if "error" in res:
                raise RuntimeError(f"conversion arm {arm}: {res['error']}")
            res["rep"] = r
            out.append(res)
            print(f"  convert {arm}: {res['wall_s']:.2f} s, peak +{res['peak_growth'] / 2**20:.1f} MiB", flush=True)
    return out


# -- Sampling ------------------------------------------------------------------------------------
def sampling_calls(ds_minari, arrays: dict, datasets: dict, seed: int) -> tuple:
    """The candidates of the sampling study: name -> fn(batch)."""
    import tfdata

    rng = np.random.default_rng(seed)
    n = len(arrays["obs"])
    names = tuple(arrays)

    def numpy_gather(b):
        idx = rng.integers(0, n, b)
        return {k: arrays[k][idx] for k in names}

    def minari_sample(b):
        eps = ds_minari.sample_episodes(b)
        t = [int(rng.integers(0, len(e.rewards))) for e in eps]
        return {"obs": np.stack([e.observations[i] for e, i in zip(eps, t)]),
                "next_obs": np.stack([e.observations[i + 1] for e, i in zip(eps, t)]),
                "action": np.array([e.actions[i] for e, i in zip(eps, t)]),
                "reward": np.array([e.rewards[i] for e, i in zip(eps, t)]),
                "terminated": np.array([e.terminations[i] for e, i in zip(eps, t)]),
                "truncated": np.array([e.truncations[i] for e, i in zip(eps, t)])}

    calls = {"numpy": numpy_gather}
    for layout, d in datasets.items():
        calls[f"tfdata {layout}"] = tfdata.MixedReplayBuffer({"offline": d}, seed=seed).sample
    return calls, {"minari": minari_sample}


def online_buffer(dataset, layout: str, seed: int, **kw):
    """A ReplayBuffer of the dataset's spec holding the dataset's rows (the online side)."""
    import tfdata

    n = len(dataset)
    buf = tfdata.ReplayBuffer(dataset.spec, n, layout=layout, seed=seed, **kw)
    for a in range(0, n, 65536):
        buf.extend(dataset.rows(a, min(n, a + 65536)))
    return buf


def both_rows_buffer(dataset, layout: str, seed: int):
    """A ReplayBuffer holding the dataset's rows twice: as many rows as a mixed batch of the
    dataset and a buffer of its rows reads from."""
    import tfdata

    n = len(dataset)
    buf = tfdata.ReplayBuffer(dataset.spec, 2 * n, layout=layout, seed=seed)
    for _ in range(2):
        for a in range(0, n, 65536):
            buf.extend(dataset.rows(a, min(n, a + 65536)))
    return buf


def mixed_calls(dataset, buf, both, seed: int) -> dict:
    import tfdata

    mixed = tfdata.MixedReplayBuffer({"offline": dataset, "online": buf},
                                     {"offline": 0.5, "online": 0.5}, seed=seed)
    alone = tfdata.MixedReplayBuffer({"offline": dataset}, seed=seed)
    half = BATCH // 2

    def apart(b):
        x, y = alone.sample(half), buf.sample(b - half)
        return {k: np.concatenate((x[k], y[k])) for k in x}

    return {"mixed": mixed.sample, "one buffer": buf.sample, "one buffer, both sources' rows": both.sample,
            "two samples concatenated": apart}


def transform_calls(dataset, layout: str, seed: int) -> dict:
    import tfdata
    from tfdata.transforms import Normalize

    plain = online_buffer(dataset, layout, seed, stats=["obs"])
    norm = online_buffer(dataset, layout, seed, stats=["obs"], transforms=[Normalize("obs")])
    eps = 1e-8

    def numpy_after(b):
        batch = plain.sample(b)
        st = plain.stats("obs")
        return ((batch["obs"] - st.mean) / np.sqrt(st.var + eps)).astype(np.float32)

    return {"Normalize in the sample": norm.sample, "sample without": plain.sample,
            "numpy after the gather": numpy_after}


def timed(calls: dict, mode: str, lo_hi=None) -> dict:
    lo, hi = lo_hi or CALLS[mode]
    return interleaved_latencies(calls, [BATCH], budget_s=BUDGET_S[mode], lo=lo, hi=hi,
                                 rounds=ROUNDS[mode], warmup=WARMUP)[BATCH]


# -- Analysis ------------------------------------------------------------------------------------
def ratio(stats: dict, a: str, b: str) -> float:
    return stats[a]["median_us"] / stats[b]["median_us"]


def verdict(ok: bool) -> str:
    return "met" if ok else "**missed**"


def summarise(conv: list, sample: dict, mixed: dict, transform: dict, bound: int) -> dict:
    arms = {}
    for r in conv:
        arms.setdefault(r["arm"], []).append(r)
    conversion = {a: {"wall_s": float(np.median([r["wall_s"] for r in rs])),
                      "peak_growth": int(max(r["peak_growth"] for r in rs)),
                      "steps_per_s": float(rs[0]["steps"] / np.median([r["wall_s"] for r in rs]))}
                  for a, rs in arms.items()}
    s = {"conversion": conversion, "bound_bytes": bound, "ratios": {}}
    for layout in LAYOUTS:
        t = f"tfdata {layout}"
        s["ratios"][layout] = {
            "minari_over_tfdata": ratio(sample, "minari", t),
            "tfdata_over_numpy": ratio(sample, t, "numpy"),
            "mixed_over_one": ratio(mixed[layout], "mixed", "one buffer"),
            "mixed_over_both": ratio(mixed[layout], "mixed", "one buffer, both sources' rows"),
            "apart_over_mixed": ratio(mixed[layout], "two samples concatenated", "mixed"),
            "normalize_over_plain": ratio(transform[layout], "Normalize in the sample", "sample without"),
            "numpy_after_over_normalize": ratio(transform[layout], "numpy after the gather",
                                                "Normalize in the sample"),
            "within_bound": conversion[layout]["peak_growth"] <= bound,
        }
    return s


def plot(sample: dict, mixed: dict, transform: dict) -> str:
    colors = {"numpy": "tab:gray", "tfdata aos": "tab:blue", "tfdata soa": "tab:cyan",
              "mixed": "tab:blue", "one buffer": "tab:gray", "one buffer, both sources' rows": "tab:olive",
              "two samples concatenated": "tab:orange",
              "Normalize in the sample": "tab:blue", "sample without": "tab:gray",
              "numpy after the gather": "tab:orange"}
    fast = {k: v for k, v in sample.items() if k != "minari"}
    return panels_figure(OUT_DIR, "offline.png", (16, 4.2), [
        partial(hbar_medians, stats=fast, colors=colors, ref="numpy", target=TARGETS["vs_numpy"],
                title=f"sample({BATCH}) of a converted dataset\n(Minari's API: "
                      f"{sample['minari']['median_us'] / 1e3:.0f} ms, off the axis)"),
        partial(hbar_medians, stats=mixed["aos"], colors=colors, ref="one buffer", target=TARGETS["mixed"],
                title=f"a mixed batch, {BATCH // 2} + {BATCH // 2} rows (AoS)"),
        partial(hbar_medians, stats=transform["aos"], colors=colors, ref="sample without",
                target=TARGETS["transform"], title="Normalize(\"obs\") on sample (AoS)"),
    ])


def us(st: dict) -> str:
    return f"{st['median_us']:.1f}"


def write_report(s: dict, sample: dict, mixed: dict, transform: dict, run: dict, png: str) -> None:
    steps = run["parameters"]["steps"]
    c, R = s["conversion"], s["ratios"]
    L = ["# Offline RL: Minari datasets, mixed batches, transforms on sample\n",
         f"Made by `experiments/offline.py` ({run['mode']} run, command `{run['command']}`, "
         f"{run['wall_clock_s']:.0f} s). Raw numbers: `results.json`. A CartPole-shaped dataset of "
         f"{steps:,} transitions written by Minari (`create_dataset_from_buffers`).\n",
         "## Findings\n"]
    for layout in LAYOUTS:
        r = R[layout]
        L.append(f"* **{NAMES[layout]}**: `sample({BATCH})` of the converted dataset is "
                 f"{r['minari_over_tfdata']:,.0f}x faster than Minari's API (target ≥ {TARGETS['vs_minari']:.0f}x: "
                 f"{verdict(r['minari_over_tfdata'] >= TARGETS['vs_minari'])}) and "
                 f"{r['tfdata_over_numpy']:.2f}x a numpy gather over arrays in memory (target ≤ "
                 f"{TARGETS['vs_numpy']}x: {verdict(r['tfdata_over_numpy'] <= TARGETS['vs_numpy'])}); a mixed batch "
                 f"costs {r['mixed_over_one']:.3f}x one uniform sample (target ≤ {TARGETS['mixed']}x: "
                 f"{verdict(r['mixed_over_one'] <= TARGETS['mixed'])}; {r['mixed_over_both']:.3f}x one sample "
                 f"of a buffer of both sources' rows); `Normalize` in the sample costs "
                 f"{r['normalize_over_plain']:.3f}x the sample without it (target ≤ {TARGETS['transform']}x: "
                 f"{verdict(r['normalize_over_plain'] <= TARGETS['transform'])}).")
    same = s.get("rows_identical", {})
    L.append("* Every converted row equals the transition built from Minari's episodes ("
             + ", ".join(f"{NAMES[lay]}: {'yes' if ok else '**no**'}" for lay, ok in same.items()) + ").")
    bound = s["bound_bytes"]
    L.append(f"* Conversion: {c['aos']['steps_per_s'] / 1e6:.2f} M steps/s (AoS) and "
             f"{c['soa']['steps_per_s'] / 1e6:.2f} M steps/s (SoA), peak resident growth "
             f"{c['aos']['peak_growth'] / 2**20:.1f} / {c['soa']['peak_growth'] / 2**20:.1f} MiB against the "
             f"stated bound of {bound / 2**20:.0f} MiB ("
             f"{verdict(all(c[lay]['peak_growth'] <= bound for lay in LAYOUTS))}); Minari's own "
             f"`iterate_episodes` reads the same episodes at {c['minari_iterate']['steps_per_s'] / 1e6:.2f} M steps/s, "
             f"and building the numpy arrays from it grows the peak by "
             f"{c['minari_arrays']['peak_growth'] / 2**20:.0f} MiB (the whole dataset, and more while it is joined).")
    L.append("")
    L.append(f"![{png}]({png})\n")
    L.append("## Conversion (median wall time, largest peak growth over fresh processes)\n")
    label = {"aos": "`from_minari`, AoS", "soa": "`from_minari`, SoA",
             "minari_iterate": "Minari `iterate_episodes`", "minari_arrays": "Minari episodes to numpy arrays"}
    L += md_table(["arm", "seconds", "M steps/s", "peak RSS growth (MiB)"],
                  [[label[a], f"{v['wall_s']:.2f}", f"{v['steps_per_s'] / 1e6:.2f}", f"{v['peak_growth'] / 2**20:.1f}"]
                   for a, v in c.items()], "lrrr")
    L.append("")
    L.append(f"## sample({BATCH}) (µs per call: median, p99)\n")
    L += md_table(["candidate", "median", "p99"], [[k, us(v), f"{v['p99_us']:.1f}"] for k, v in sample.items()], "lrr")
    L.append("")
    for title, res in (("A mixed batch", mixed), ("Normalize on sample", transform)):
        L.append(f"## {title} (µs per call, median)\n")
        keys = list(res[LAYOUTS[0]])
        L += md_table(["layout"] + keys, [[lay] + [us(res[lay][k]) for k in keys] for lay in LAYOUTS],
                      "l" + "r" * len(keys))
        L.append("")
    L.append("## Method\n")
    L.append(f"* The dataset: {steps:,} transitions in episodes of uniform random length in "
             f"{EPISODE_LEN}, float32 observations (4), int64 actions, float64 rewards, written by Minari "
             "0.5's `create_dataset_from_buffers` (its HDF5 backend, the default). `from_minari` turns it into "
             "rows `obs, action, reward, next_obs, terminated, truncated, episode, step` (66 bytes).")
    L.append("* Conversion: each arm in a fresh forked process, after a warm-up (imports, a conversion of a "
             "small dataset, one episode read), with the peak resident set reset (`/proc/self/clear_refs`) "
             "just before; the growth is the peak minus the resident set at the start. The bound is the one "
             "`from_minari`'s docstring states for its default `chunk_bytes`.")
    L.append("* Sampling: all candidates draw fresh indices each call; tfdata's batches are views into its "
             "output ring (no allocation), numpy's fancy indexing allocates its outputs. Minari has no "
             "transition sampler: `sample_episodes(256)` and one random step of each episode is the closest "
             "its API gives. Candidates alternate in rounds (the order rotated each round) so machine load "
             "hits them alike; medians of every call.")
    L.append("* The mixed batch: `MixedReplayBuffer({'offline': dataset, 'online': buffer})`, half each, "
             "against `buffer.sample(256)` on a `ReplayBuffer` holding the same rows (the target's "
             "comparison), against the same on a `ReplayBuffer` holding those rows twice (as many rows "
             "as the mixed batch reads from: each source alone is larger than the last-level cache (its "
             "size is in the machine table below), and two of them leave fewer of a batch's rows in "
             "it than one; this comparison takes that out) and against a "
             "one-source sample of 128 from the dataset plus `buffer.sample(128)` joined with "
             "`np.concatenate`. `Normalize`: a `ReplayBuffer(stats=['obs'], transforms=[Normalize('obs')])` "
             "against the same buffer without the transform, and against it followed by numpy's "
             "`(x - mean) / sqrt(var + eps)` with the buffer's statistics.")
    L.append("* Not measured: a dataset larger than the page cache (the converted file is read from memory "
             "here), image datasets, Minari's arrow backend.")
    L.append("")
    write_methodology_report(OUT_DIR, L, run)


# -- Main ----------------------------------------------------------------------------------------
def check_rows(datasets: dict, arrays: dict) -> dict:
    """Every converted row against the transitions built from Minari's episodes: equal bytes."""
    out = {}
    for layout, d in datasets.items():
        out[layout] = all(np.array_equal(d.field(k), v) for k, v in arrays.items()) and len(d) == len(arrays["obs"])
    return out


def render(res: dict) -> None:
    png = plot(res["sample"], res["mixed"], res["transform"])
    write_report(res["summary"], res["sample"], res["mixed"], res["transform"], res["methodology"], png)


def main(argv=None) -> None:
    ap = seeds_parser(__doc__, "100k steps (about 2 minutes)", "one seed: the dataset's and the samplers'")
    args = ap.parse_args(argv)
    if args.render:
        os.makedirs(OUT_DIR, exist_ok=True)
        render(read_results(args.render))
        return
    mode = "quick" if args.quick else "full"
    seed = parse_seeds(args.seeds, 1)[0]
    steps = STEPS[mode]
    os.makedirs(OUT_DIR, exist_ok=True)
    scratch = os.path.join(OUT_DIR, ".scratch")
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=[seed],
                    command="python experiments/offline.py" + (" --quick" if args.quick else ""),
                    parameters={"steps": steps, "batch": BATCH, "layouts": LAYOUTS, "episode_len": EPISODE_LEN})
    saved = os.environ.get("MINARI_DATASETS_PATH")
    try:
        import minari

        import tfdata
        import tfdata.datasets

        print(f"writing a Minari dataset of {steps:,} steps", flush=True)
        small_root = os.path.join(scratch, "minari-small")
        make_minari_dataset(small_root, 2000, seed + 1)
        make_minari_dataset(os.path.join(scratch, "minari"), steps, seed)  # leaves its root set
        ds_minari = minari.load_dataset(DATASET_ID)
        conv = measure_conversion(os.path.join(scratch, "minari", DATASET_ID), scratch,
                                  os.path.join(small_root, DATASET_ID), CONVERT_REPS[mode])
        datasets = {}
        for layout in LAYOUTS:
            path = os.path.join(scratch, f"converted-{layout}")
            tfdata.datasets.from_minari(ds_minari, path, layout=layout)
            datasets[layout] = tfdata.MmapDataset.open(path)
            datasets[layout].touch(0, len(datasets[layout]))  # in the page cache: sampling, not the disk
        arrays = minari_arrays(ds_minari)
        same = check_rows(datasets, arrays)
        print("sampling", flush=True)
        calls, slow = sampling_calls(ds_minari, arrays, datasets, seed)
        sample = timed(calls, mode)
        sample.update(timed(slow, mode, MINARI_CALLS[mode]))
        mixed, transform = {}, {}
        for layout in LAYOUTS:
            print(f"mixed and transforms, {layout}", flush=True)
            buf = online_buffer(datasets[layout], layout, seed)
            both = both_rows_buffer(datasets[layout], layout, seed)
            mixed[layout] = timed(mixed_calls(datasets[layout], buf, both, seed), mode)
            del buf, both
            transform[layout] = timed(transform_calls(datasets[layout], layout, seed), mode)
        s = summarise(conv, sample, mixed, transform, conversion_bound())
        s["rows_identical"] = same
        for d in datasets.values():
            d.close()
        run = rec.finish()
        res = {"methodology": run, "summary": s, "sample": sample, "mixed": mixed, "transform": transform,
               "conversion": conv}
        write_json(os.path.join(OUT_DIR, "results.json"), res)
        render(res)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if saved is None:
            os.environ.pop("MINARI_DATASETS_PATH", None)
        else:
            os.environ["MINARI_DATASETS_PATH"] = saved
    print(f"{mode} run {rec.run_name} done in {run['wall_clock_s']:.0f} s; report: "
          f"{os.path.relpath(OUT_DIR)}/README.md", flush=True)


if __name__ == "__main__":
    main()
