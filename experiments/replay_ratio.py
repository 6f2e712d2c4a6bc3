"""Replay ratio on DQN / CartPole-v1: a sample-to-insert rate limiter against a fixed train
frequency, and exactly-k replay against uniform replay at the same ratio.

The question. How often each transition is replayed (the replay ratio: rows sampled per row
inserted) is set in CleanRL's DQN by a fixed train frequency: one batch of 128 every 10
environment steps, 12.8 on average, with every row replayed a Poisson-like random number of
times. tfdata can instead hold the ratio with a rate limiter (``tfdata.RateLimiter``: the actor's
``push`` and the learner's ``sample`` each wait while they would run ahead), which lets actor and
learner run in two threads, and can replay every row exactly k times (``sampler="exactly_k"``).
Does learning change, per environment step (sample efficiency) and per second (wall clock)?

Variants (all: the torch-free edge loop, ``tfdata.nn.DQN`` over a ``tfdata.ReplayBuffer``,
CleanRL's ``dqn.py`` hyperparameters otherwise):

* ``fixed-10``: CleanRL's loop, one thread, a batch every 10 steps after ``learning_starts``
  (replay ratio 12.8).
* ``limiter-R`` (R = 6.4, 12.8, 25.6): an actor thread (act, env step, push) and a learner thread
  (sample, update), the ratio held by ``RateLimiter(R, min_size_to_sample=learning_starts,
  error_buffer=4 batches)``.
* ``exactly-13`` against ``limiter-13``: two threads, every row replayed exactly 13 times
  (``sampler="exactly_k", replays=13, policy="block"``: the actor waits for free slots) against
  uniform sampling held at the same ratio by the limiter.

The target network is copied every 500 environment steps' worth of updates (CleanRL: every 500
steps, i.e. every ``500 * R / 128`` updates). In the two-thread variants the actor acts with its
own copy of the online network, refreshed after every update (under a lock; CleanRL's single
loop acts with the network of the last update too), so actor and learner never share a
workspace. Thread timing makes those runs not bit-reproducible; the single-thread run is.

Every (variant, seed) runs in a fresh process; variants rotate seed by seed.

    python experiments/replay_ratio.py --quick   # 1 seed, 30k steps
    python experiments/replay_ratio.py           # 5 seeds, 500k steps (CleanRL's run)

Needs the ``rl`` extra (gymnasium). Writes ``reports/replay_ratio/`` (README.md, results.json,
learning.png, speed.png). Only the public tfdata API.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import threading
import time

import numpy as np

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
from _recording import RunRecord, report_dir, write_json  # noqa: E402
from _render import md_table, write_report as write_methodology_report  # noqa: E402
from _stats import permutation_test, return_curve  # noqa: E402
from _timing import run_in_fresh_processes  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "replay_ratio"
ENV_ID = "CartPole-v1"
# CleanRL's dqn.py defaults (github.com/vwxyzjn/cleanrl, cleanrl/dqn.py, class Args)
HP = {
    "total_timesteps": 500_000,
    "learning_rate": 2.5e-4,
    "buffer_size": 10_000,
    "gamma": 0.99,
    "target_network_frequency": 500,
    "batch_size": 128,
    "start_e": 1.0,
    "end_e": 0.05,
    "exploration_fraction": 0.5,
    "learning_starts": 10_000,
    "train_frequency": 10,
    "hidden": (120, 84),
}
ERROR_BATCHES = 4        # the limiter's error buffer, in batches of samples
WAIT_S = 0.05            # each wait's timeout: a thread then checks whether the run is over
VARIANTS = {
    # name: (schedule, replay ratio, exactly-k replays or None)
    "fixed-10": ("fixed", HP["batch_size"] / HP["train_frequency"], None),
    "limiter-6.4": ("limiter", 6.4, None),
    "limiter-12.8": ("limiter", 12.8, None),
    "limiter-25.6": ("limiter", 25.6, None),
    "limiter-13": ("limiter", 13.0, None),
    "exactly-13": ("exactly_k", 13.0, 13),
}
REFERENCE = "fixed-10"
PAIRS = [("limiter-12.8", "fixed-10"), ("limiter-6.4", "fixed-10"), ("limiter-25.6", "fixed-10"),
         ("exactly-13", "limiter-13")]
SEEDS = {"full": [0, 1, 2, 3, 4], "quick": [0]}
STEPS = {"full": HP["total_timesteps"], "quick": 30_000}
LEARNING_STARTS = {"full": HP["learning_starts"], "quick": 2_000}
LAST_EPISODES = 100
CURVE_BINS = 50
TIMEOUT_S = 3600
OUT_DIR = report_dir(EXPERIMENT)


# ---------------------------------------------------------------------------------------------
# The measured loop (runs in a worker process)
# ---------------------------------------------------------------------------------------------
def run_worker(variant: str, seed: int, total: int, learning_starts: int) -> dict:
    import gymnasium as gym

    import tfdata

    schedule, ratio, replays = VARIANTS[variant]
    env = gym.make(ENV_ID)
    obs_dim, n_actions = env.observation_space.shape[0], int(env.action_space.n)
    B, gamma = HP["batch_size"], HP["gamma"]
    sizes = (obs_dim, *HP["hidden"], n_actions)
    spec = tfdata.Spec.from_spaces(env.observation_space, env.action_space)

    def make_buffer(seed):
        if schedule == "fixed":
            return tfdata.ReplayBuffer(spec, HP["buffer_size"], seed=seed)
        if schedule == "limiter":
            lim = tfdata.RateLimiter(ratio, learning_starts, ERROR_BATCHES * B, timeout=WAIT_S)
            return tfdata.ReplayBuffer(spec, HP["buffer_size"], seed=seed, rate_limiter=lim)
        return tfdata.ReplayBuffer(spec, HP["buffer_size"], seed=seed, sampler="exactly_k",
                                   replays=replays, policy="block", timeout=WAIT_S)

    # warm-up, before the clock: load (or compile) every kernel the run calls
    w_net = tfdata.nn.DQN(sizes, lr=HP["learning_rate"], gamma=gamma, seed=seed + 10_000)
    w_rb = make_buffer(seed + 10_000)  # a buffer of the variant's kind: its kernels too
    w_obs = np.zeros(obs_dim, np.float32)
    for k in range(max(learning_starts, B)):  # what every variant lets in before sampling
        w_rb.push({"obs": w_obs, "action": k % n_actions, "reward": 1.0, "next_obs": w_obs,
                   "terminated": False, "truncated": False})
    w_net.train(w_rb.sample(B))
    w_net.act(w_obs)
    del w_net, w_rb

    net = tfdata.nn.DQN(sizes, lr=HP["learning_rate"], gamma=gamma, seed=seed)
    rb = make_buffer(seed)
    updates_per_sync = max(1, round(HP["target_network_frequency"] * ratio / B))
    slope = (HP["end_e"] - HP["start_e"]) / (HP["exploration_fraction"] * total)
    start_e, end_e = HP["start_e"], HP["end_e"]
    episodes = []                            # (global step at its end, return, length)
    counts = {"updates": 0, "actor_waits": 0, "learner_waits": 0}
    pc = time.perf_counter_ns
    times = {"act": 0, "env": 0, "push": 0, "sample": 0, "update": 0}

    def row(obs, next_obs, action, reward, terminated, truncated):
        return {"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                "terminated": terminated, "truncated": truncated}

    t_loop = pc()
    if schedule == "fixed":
        # CleanRL's loop: one thread
        rng = np.random.default_rng(seed)
        obs, _ = env.reset(seed=seed)
        ep_return, ep_len = 0.0, 0
        for step in range(total):
            t0 = pc()
            eps = max(slope * step + start_e, end_e)
            action = int(rng.integers(n_actions)) if rng.random() < eps else net.act(obs)
            t1 = pc()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            t2 = pc()
            rb.push(row(obs, next_obs, action, reward, terminated, truncated))
            t3 = pc()
            ep_return += reward
            ep_len += 1
            if terminated or truncated:
                episodes.append((step, ep_return, ep_len))
                ep_return, ep_len = 0.0, 0
                obs, _ = env.reset()
            else:
                obs = next_obs
            t4 = pc()
            times["act"] += t1 - t0
            times["env"] += (t2 - t1) + (t4 - t3)
            times["push"] += t3 - t2
            if step > learning_starts and step % HP["train_frequency"] == 0:
                t5 = pc()
                batch = rb.sample(B)
                t6 = pc()
                net.train(batch)
                counts["updates"] += 1
                if counts["updates"] % updates_per_sync == 0:
                    net.sync_target()
                times["sample"] += t6 - t5
                times["update"] += pc() - t6
    else:
        # two threads: the actor acts with its own copy of the online network
        actor = tfdata.nn.DQN(sizes, seed=seed)
        actor.online.copy_from(net.online)
        weights = threading.Lock()
        done = threading.Event()
        failure = []

        def act_loop():
            try:
                rng = np.random.default_rng(seed)
                obs, _ = env.reset(seed=seed)
                ep_return, ep_len = 0.0, 0
                for step in range(total):
                    t0 = pc()
                    eps = max(slope * step + start_e, end_e)
                    if rng.random() < eps:
                        action = int(rng.integers(n_actions))
                    else:
                        with weights:
                            action = actor.act(obs)
                    t1 = pc()
                    next_obs, reward, terminated, truncated, _ = env.step(action)
                    t2 = pc()
                    r = row(obs, next_obs, action, reward, terminated, truncated)
                    while True:  # the push waits while the actor would run ahead of the learner
                        try:
                            rb.push(r)
                            break
                        except TimeoutError:
                            counts["actor_waits"] += 1
                            if failure:
                                return
                    t3 = pc()
                    ep_return += reward
                    ep_len += 1
                    if terminated or truncated:
                        episodes.append((step, ep_return, ep_len))
                        ep_return, ep_len = 0.0, 0
                        obs, _ = env.reset()
                    else:
                        obs = next_obs
                    t4 = pc()
                    times["act"] += t1 - t0
                    times["env"] += (t2 - t1) + (t4 - t3)
                    times["push"] += t3 - t2
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                failure.append(e)
            finally:
                done.set()

        def learn_loop():
            try:
                while True:
                    if schedule == "exactly_k" and len(rb) < learning_starts:
                        if done.is_set():
                            return
                        time.sleep(0.001)
                        continue
                    t5 = pc()
                    try:
                        batch = rb.sample(B)
                    except TimeoutError:
                        # the limiter (or exactly-k) has no batch for us yet: over if the actor is
                        counts["learner_waits"] += 1
                        if done.is_set():
                            return
                        continue
                    t6 = pc()
                    net.train(batch)
                    with weights:
                        actor.online.copy_from(net.online)
                    counts["updates"] += 1
                    if counts["updates"] % updates_per_sync == 0:
                        net.sync_target()
                    times["sample"] += t6 - t5
                    times["update"] += pc() - t6
            except BaseException as e:  # noqa: BLE001
                failure.append(e)

        threads = [threading.Thread(target=act_loop), threading.Thread(target=learn_loop)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if failure:
            raise failure[0]
    wall = (pc() - t_loop) / 1e9
    lim = getattr(rb, "rate_limiter", None)
    sampler = rb.sampler
    return {
        "variant": variant, "seed": seed, "total_steps": total, "learning_starts": learning_starts,
        "episodes": episodes,
        "final_return": float(np.mean([e[1] for e in episodes[-LAST_EPISODES:]])) if episodes else None,
        "mean_return": float(np.mean([e[1] for e in episodes])) if episodes else None,
        "wall_s": wall, "sps": total / wall, "updates": counts["updates"],
        "replay_ratio": counts["updates"] * B / max(1, total - learning_starts),
        "actor_waits": counts["actor_waits"], "learner_waits": counts["learner_waits"],
        "limiter": lim.metrics() if lim is not None else None,
        "exactly_k": ({"dropped": sampler.dropped, "lost_replays": sampler.lost_replays,
                       "delivered": sampler.delivered} if schedule == "exactly_k" else None),
        "sections_s": {k: v / 1e9 for k, v in times.items()},
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "versions": {"gymnasium": gym.__version__, "tfdata": tfdata.__version__, "numpy": np.__version__},
        "load": [round(x, 2) for x in os.getloadavg()],
    }


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------
def run_all(variants, seeds, total, learning_starts, log) -> list[dict]:
    def describe(r):
        return (f"final return {r['final_return']:.1f}, mean {r['mean_return']:.1f}, {r['sps']:.0f} steps/s, "
                f"replay ratio {r['replay_ratio']:.2f}, {r['peak_rss_bytes'] / 2**20:.0f} MiB")

    return run_in_fresh_processes(__file__, list(variants), seeds,
                                  ["--steps", str(total), "--learning-starts", str(learning_starts)],
                                  timeout_s=TIMEOUT_S, describe=describe, log=log)


# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------
def _ms(values) -> dict:
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if v.size == 0:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0, "n": int(v.size)}


def summarise(runs, variants, total) -> dict:
    out = {}
    for v in variants:
        rs = [r for r in runs if r["variant"] == v]
        if not rs:
            continue
        curves = [return_curve(r["episodes"], total, CURVE_BINS)[1] for r in rs]
        out[v] = {
            "final_return": _ms(r["final_return"] for r in rs),
            "mean_return": _ms(r["mean_return"] for r in rs),
            "sps": _ms(r["sps"] for r in rs),
            "wall_s": _ms(r["wall_s"] for r in rs),
            "replay_ratio": _ms(r["replay_ratio"] for r in rs),
            "updates": _ms(r["updates"] for r in rs),
            "peak_rss_bytes": _ms(r["peak_rss_bytes"] for r in rs),
            "sections_us": {k: _ms(r["sections_s"][k] / r["total_steps"] * 1e6 for r in rs)
                            for k in rs[0]["sections_s"]},
            "curve_mean": np.nanmean(curves, axis=0).tolist(),
            "curve_std": (np.nanstd(curves, axis=0, ddof=1).tolist() if len(curves) > 1
                          else [0.0] * len(curves[0])),
            "finals": [r["final_return"] for r in rs], "means": [r["mean_return"] for r in rs],
        }
    return out


def comparisons(agg) -> list[dict]:
    rows = []
    for a, b in PAIRS:
        if a not in agg or b not in agg:
            continue
        A, B = agg[a], agg[b]
        two = len(A["finals"]) > 1 and len(B["finals"]) > 1
        rows.append({"variant": a, "against": b,
                     "final_diff": A["final_return"]["mean"] - B["final_return"]["mean"],
                     "final_p": permutation_test(A["finals"], B["finals"]) if two else None,
                     "mean_diff": A["mean_return"]["mean"] - B["mean_return"]["mean"],
                     "mean_p": permutation_test(A["means"], B["means"]) if two else None,
                     "sps_ratio": A["sps"]["mean"] / B["sps"]["mean"]})
    return rows


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def plot(agg, total) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = return_curve([], total, CURVE_BINS)[0]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for v, a in agg.items():
        m, s = np.asarray(a["curve_mean"]), np.asarray(a["curve_std"])
        ax.plot(x, m, label=f"{v} ({a['final_return']['n']} seeds)", lw=1.8 if v == REFERENCE else 1.1)
        ax.fill_between(x, m - s, m + s, alpha=0.12)
    ax.set_xlabel("environment step")
    ax.set_ylabel("episodic return (mean ± std over seeds)")
    ax.set_title(f"DQN on {ENV_ID}: replay ratio by limiter, exactly-k replay")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT_DIR, "learning.png"), dpi=110)
    plt.close(fig)

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    vs = list(agg)
    ax1.barh(vs, [agg[v]["sps"]["mean"] for v in vs], xerr=[agg[v]["sps"]["std"] for v in vs])
    ax1.set_xlabel("environment steps per second (whole run)")
    ax1.invert_yaxis()
    ax2.barh(vs, [agg[v]["final_return"]["mean"] for v in vs],
             xerr=[agg[v]["final_return"]["std"] for v in vs], color="tab:green")
    ax2.set_xlabel(f"final return (last {LAST_EPISODES} episodes)")
    ax2.set_yticklabels([])
    ax2.invert_yaxis()
    fig.tight_layout()
    fig.savefig(os.path.join(OUT_DIR, "speed.png"), dpi=110)
    plt.close(fig)
    return ["learning.png", "speed.png"]


def _pm(cell, fmt="{:.0f}") -> str:
    return "n/a" if cell["mean"] is None else (fmt + " ± " + fmt).format(cell["mean"], cell["std"])


def _p(p) -> str:
    return "n/a (1 seed)" if p is None else f"{p:.2f}"


def _verdict(c) -> str:
    ps = [p for p in (c["final_p"], c["mean_p"]) if p is not None]
    if not ps:
        return "not tested (1 seed)"
    return "no difference detected" if min(ps) >= 0.05 else "**differs** (p < 0.05)"


def write_report(agg, comps, run, pngs, total, learning_starts) -> None:
    n_seeds = max(a["final_return"]["n"] for a in agg.values())
    L = [f"# Replay ratio on DQN / {ENV_ID}: a rate limiter, exactly-k replay\n",
         f"Made by `experiments/replay_ratio.py` ({run['mode']} run, command `{run['command']}`, {n_seeds} "
         f"seed(s) per variant, {total:,} environment steps each, learning from step {learning_starts:,}, "
         f"{run['wall_clock_s']:.0f} s in all). Raw numbers and every episode: `results.json`.\n",
         ]
    for e in run.get("earlier_runs", []):
        L.append(f"Runs of other variants come from an earlier run, kept as they were (`--add`): command "
                 f"`{e['command']}`, started {e['started_utc']}, tfdata commit "
                 f"{(e['environment']['software']['git']['commit'] or '?')[:12]}, load average "
                 f"{e['load_average_start']} / {e['load_average_end']}.\n")
    L.append("## Findings\n")
    for c in comps:
        L.append(f"* **{c['variant']}** against {c['against']}: final return {c['final_diff']:+.1f} "
                 f"(p = {_p(c['final_p'])}), mean return over the run {c['mean_diff']:+.1f} "
                 f"(p = {_p(c['mean_p'])}): {_verdict(c)}; {c['sps_ratio']:.2f}x the steps per second.")
    L.append("")
    L.append("## Results (mean ± std over seeds)\n")
    header = ["variant", "final return", "mean return", "replay ratio measured", "updates", "steps/s",
              "wall (s)", "peak RSS (MiB)"]
    rows = [[v, _pm(a["final_return"]), _pm(a["mean_return"], "{:.1f}"),
             _pm(a["replay_ratio"], "{:.2f}"), _pm(a["updates"]), _pm(a["sps"]), _pm(a["wall_s"], "{:.1f}"),
             f"{a['peak_rss_bytes']['mean'] / 2**20:.0f}"] for v, a in agg.items()]
    L += md_table(header, rows, "l" + "r" * (len(header) - 1))
    L.append("")
    L.append("Time per environment step by section (µs, summed over threads: in the two-thread variants "
             "sections overlap, so they add up to more than the wall clock):\n")
    secs = list(next(iter(agg.values()))["sections_us"])
    L += md_table(["variant", *secs], [[v, *(f"{a['sections_us'][k]['mean']:.1f}" for k in secs)]
                                       for v, a in agg.items()], "l" + "r" * len(secs))
    L.append("")
    L += [f"![learning curves]({pngs[0]})\n", f"![speed and final return]({pngs[1]})\n"]
    L += ["## Method\n",
          f"* CleanRL's DQN hyperparameters (`cleanrl/dqn.py`), {ENV_ID}, the torch-free learner "
          "(`tfdata.nn.DQN`) and a `tfdata.ReplayBuffer` of 10,000 rows (AoS).",
          f"* Limiter variants: `RateLimiter(R, min_size_to_sample={learning_starts}, "
          f"error_buffer={ERROR_BATCHES} x 128)`; the actor's push and the learner's sample wait "
          f"(timeout {WAIT_S} s, then retried); the learner copies its online network to the actor's "
          "after every update. Exactly-k: `sampler=\"exactly_k\", replays=13, policy=\"block\"`; the "
          "learner starts when the buffer holds `learning_starts` rows.",
          "* Replay ratio measured = updates x 128 / environment steps after `learning_starts`. "
          "Exactly-k replays every row, those inserted before learning starts too, hence "
          "13 x steps / (steps - learning_starts) for `exactly-13`.",
          f"* Final return: mean of the last {LAST_EPISODES} episodes; mean return: over every episode "
          "of the run (area under the learning curve: sample efficiency). Exact two-sided "
          "permutation tests over seeds (every split), alpha 0.05.",
          "* Each (variant, seed) in a fresh process; the order of variants rotates seed by seed. "
          "Two-thread runs are not bit-reproducible (thread timing decides which rows a batch "
          "sees); the single-thread run is.\n"]
    write_methodology_report(OUT_DIR, L, run)


def publish(runs, run, variants, total, learning_starts) -> None:
    agg = summarise(runs, variants, total)
    comps = comparisons(agg)
    pngs = plot(agg, total)
    write_json(os.path.join(OUT_DIR, "results.json"),
               {"methodology": run,
                "summary": {v: {k: x for k, x in a.items() if k not in ("curve_mean", "curve_std")}
                            for v, a in agg.items()},
                "curves": {v: {"mean": a["curve_mean"], "std": a["curve_std"]} for v, a in agg.items()},
                "comparisons": comps, "runs": runs})
    write_report(agg, comps, run, pngs, total, learning_starts)


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, 30k steps")
    ap.add_argument("--seeds", type=int, nargs="*", default=None)
    ap.add_argument("--steps", type=int, default=None, help="environment steps per run")
    ap.add_argument("--learning-starts", type=int, default=None)
    ap.add_argument("--variants", nargs="*", default=None, help=f"subset of: {', '.join(VARIANTS)}")
    ap.add_argument("--render", default=None, metavar="RESULTS_JSON",
                    help="rewrite the report and plots from a results.json (no runs)")
    ap.add_argument("--add", default=None, metavar="RESULTS_JSON",
                    help="run the variants given and add them to the runs of this results.json (its "
                         "other variants kept as they were; both run records are kept)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    mode = "quick" if args.quick else "full"
    total = args.steps or STEPS[mode]
    learning_starts = args.learning_starts if args.learning_starts is not None else LEARNING_STARTS[mode]
    if args.render:
        with open(args.render, encoding="utf-8") as f:
            data = json.load(f)
        runs = data["runs"]
        publish(runs, data["methodology"], [v for v in VARIANTS if any(r["variant"] == v for r in runs)],
                runs[0]["total_steps"], runs[0]["learning_starts"])
        return
    if args.worker:
        r = run_worker(args.worker, args.seed, total, learning_starts)
        print("RESULT " + json.dumps(r), flush=True)
        return
    variants = args.variants or list(VARIANTS)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    seeds = args.seeds if args.seeds is not None else SEEDS[mode]
    os.makedirs(OUT_DIR, exist_ok=True)
    command = "python experiments/replay_ratio.py" + (" --quick" if args.quick else "")
    extra = " ".join(a for a in sys.argv[1:] if a != "--quick")
    if extra:
        command += " " + extra
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=seeds, command=command,
                    parameters={"hyperparameters": HP, "env": ENV_ID, "total_steps": total,
                                "learning_starts": learning_starts, "variants": variants,
                                "error_batches": ERROR_BATCHES, "wait_s": WAIT_S})
    runs = run_all(variants, seeds, total, learning_starts, lambda s: print(s, flush=True))
    run = rec.finish(child_peak_rss_bytes=max(r["peak_rss_bytes"] for r in runs))
    if args.add:  # the earlier runs of other variants, and their run record beside this one
        with open(args.add, encoding="utf-8") as f:
            old = json.load(f)
        kept = [r for r in old["runs"] if r["variant"] not in variants]
        if any(r["total_steps"] != total or r["learning_starts"] != learning_starts for r in kept):
            raise SystemExit("--add: the earlier runs used other --steps / --learning-starts")
        earlier = old["methodology"]
        run["earlier_runs"] = earlier.get("earlier_runs", []) + [{k: v for k, v in earlier.items()
                                                                  if k != "earlier_runs"}]
        runs = kept + runs
        variants = [v for v in VARIANTS if any(r["variant"] == v for r in runs)]
    publish(runs, run, variants, total, learning_starts)
    print(f"{mode} run {rec.run_name} done in {run['wall_clock_s']:.0f} s; report: "
          f"{os.path.relpath(OUT_DIR)}/README.md", flush=True)


if __name__ == "__main__":
    main()
