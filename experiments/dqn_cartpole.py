"""DQN on CartPole-v1 with tfdata inside the loop: does the buffer matter, and can the loop drop torch?

Two questions, one script.

1. **Buffer swap, everything else identical.** CleanRL's DQN (torch MLP on the CPU, one thread)
   with the replay buffer chosen by a flag: stable-baselines3's ``ReplayBuffer`` (what CleanRL
   uses), or tfdata's (AoS, SoA, prioritized, 3-step). The time inside buffer calls is measured in
   the loop, where caches are cold, and gives the Amdahl bound: the loop can get at most
   ``1 / (1 - buffer share)`` faster from any buffer.
2. **The edge loop: no torch.** The same algorithm, hyperparameters and network as numba kernels
   (``tfdata.nn.DQN``: forward, backward, Adam) over the tfdata buffer: a loop for a 512 MB device.
   Goals: learning equal to the torch variant within seed noise, at least 5x its steps per second,
   at most half its peak memory.

Every (variant, seed) runs in a fresh process (its own peak memory, no shared caches); runs
alternate variants seed by seed so slow drift of the machine hits all of them alike.

    python experiments/dqn_cartpole.py --quick   # 1 seed, 30k steps: about a minute
    python experiments/dqn_cartpole.py           # 5 seeds, 500k steps (CleanRL's run): about 40 minutes

Needs the ``rl`` and ``torch`` extras (gymnasium, torch 2.13.0 CPU, stable-baselines3). Writes
``reports/dqn/`` (README.md, results.json, learning.png, speed.png). Only the public tfdata API.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import numpy as np

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
from _recording import RunRecord, report_dir, write_json  # noqa: E402
from _render import write_report as write_methodology_report  # noqa: E402
from _stats import permutation_test, return_curve as _return_curve  # noqa: E402
from _timing import run_in_fresh_processes  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "dqn"
ENV_ID = "CartPole-v1"
# CleanRL's dqn.py defaults (github.com/vwxyzjn/cleanrl, cleanrl/dqn.py, class Args), the
# configuration of its published CartPole-v1 runs.
HP = {
    "total_timesteps": 500_000,
    "learning_rate": 2.5e-4,
    "buffer_size": 10_000,
    "gamma": 0.99,
    "tau": 1.0,                      # hard target update
    "target_network_frequency": 500,
    "batch_size": 128,
    "start_e": 1.0,
    "end_e": 0.05,
    "exploration_fraction": 0.5,
    "learning_starts": 10_000,
    "train_frequency": 10,
    "hidden": (120, 84),
}
# extra knobs of the tfdata-only variants (not CleanRL's)
PER = {"alpha": 0.6, "beta": 0.4, "beta_final": 1.0}
N_STEP = 3
VARIANTS = {
    # name: (learner, buffer)
    "torch+sb3": ("torch", "sb3"),
    "torch+tfdata-aos": ("torch", "aos"),
    # CleanRL's own call, one vector-env step: the arrays it hands stable-baselines3, to extend
    "torch+tfdata-aos-extend": ("torch", "aos-extend"),
    "torch+tfdata-soa": ("torch", "soa"),
    "torch+tfdata-per": ("torch", "per"),
    "torch+tfdata-nstep3": ("torch", "nstep"),
    "edge (numba+tfdata-aos)": ("numba", "aos"),
}
REFERENCE = "torch+sb3"
SAME_BUFFER = "torch+tfdata-aos"   # the torch twin of the edge loop
EDGE = "edge (numba+tfdata-aos)"
SEEDS = {"full": [0, 1, 2, 3, 4], "quick": [0]}
STEPS = {"full": HP["total_timesteps"], "quick": 30_000}
LAST_EPISODES = 100               # final return = mean of the last 100 episodes
CURVE_BINS = 50
TIMEOUT_S = 3600
OUT_DIR = report_dir(EXPERIMENT)
SECTIONS = ("act", "env", "buffer_add", "buffer_sample", "update", "other")


# ---------------------------------------------------------------------------------------------
# The measured loop (runs in a worker process)
# ---------------------------------------------------------------------------------------------
def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _torch_learner(hp, obs_dim, n_actions, seed, weighted):
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(seed)

    def qnet():
        h1, h2 = hp["hidden"]
        return nn.Sequential(nn.Linear(obs_dim, h1), nn.ReLU(), nn.Linear(h1, h2), nn.ReLU(),
                             nn.Linear(h2, n_actions))

    q, target = qnet(), qnet()
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=hp["learning_rate"])

    def act(obs):
        # CleanRL runs this forward with autograd on; no_grad is the faster, fair baseline
        with torch.no_grad():
            return int(q(torch.from_numpy(obs).unsqueeze(0)).argmax(dim=1).item())

    def train(o, a, r, no, d, disc, w):
        with torch.no_grad():
            target_max, _ = target(no).max(dim=1)
            td_target = r + disc * target_max * (1 - d)
        old_val = q(o).gather(1, a).squeeze(1)
        if w is None:
            loss = F.mse_loss(td_target, old_val)
        else:
            loss = (w * (old_val - td_target) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return (old_val - td_target).abs().detach().numpy() if weighted else None

    def sync():
        for tp, qp in zip(target.parameters(), q.parameters()):
            tp.data.copy_(hp["tau"] * qp.data + (1.0 - hp["tau"]) * tp.data)

    versions = {"torch": torch.__version__}
    return act, train, sync, versions


def run_worker(variant: str, seed: int, total: int, learning_starts: int) -> dict:
    t_start = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    learner, kind = VARIANTS[variant]
    hp = dict(HP, total_timesteps=total, learning_starts=learning_starts)
    import gymnasium as gym

    import tfdata

    env = gym.make(ENV_ID)
    obs_dim = env.observation_space.shape[0]
    n_actions = int(env.action_space.n)
    versions = {"gymnasium": gym.__version__, "tfdata": tfdata.__version__, "numpy": np.__version__}
    gamma, batch_size = hp["gamma"], hp["batch_size"]
    weighted = kind == "per"

    def build(seed):
        """Learner and buffer of this variant: act, update, sync, add, sample, and the buffer."""
        last_batch = [None]
        np.random.seed(seed)  # stable-baselines3 samples from numpy's global generator (CleanRL seeds it too)
        # -- learner
        if learner == "torch":
            import torch

            act, train_step, sync, v = _torch_learner(hp, obs_dim, n_actions, seed, weighted)
            versions.update(v)
        else:
            net = tfdata.nn.DQN((obs_dim, *hp["hidden"], n_actions), lr=hp["learning_rate"],
                                gamma=gamma, seed=seed)
            act, sync = net.act, net.sync_target

        # -- buffer
        if kind == "sb3":
            import stable_baselines3
            from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer

            versions["stable_baselines3"] = stable_baselines3.__version__
            rb = SB3Buffer(hp["buffer_size"], env.observation_space, env.action_space, device="cpu",
                           handle_timeout_termination=False)
            info = [{}]

            def add(obs, next_obs, action, reward, terminated, truncated):
                # CleanRL hands SB3 arrays with a leading env dimension
                rb.add(obs[None], next_obs[None], np.array([action]), np.array([reward]),
                       np.array([terminated]), info)

            def sample():
                d = rb.sample(batch_size)
                return (d.observations, d.actions, d.rewards.flatten(), d.next_observations,
                        d.dones.flatten(), gamma, None)
        else:
            spec = tfdata.Spec.from_spaces(env.observation_space, env.action_space)
            options = {"layout": "soa" if kind == "soa" else "aos", "seed": seed}
            extend = kind == "aos-extend"
            if kind == "per":
                n_train = max(1, (total - learning_starts) // hp["train_frequency"])
                rb = tfdata.PrioritizedReplayBuffer(spec, hp["buffer_size"], beta_steps=n_train, **PER, **options)
            elif kind == "nstep":
                rb = tfdata.ReplayBuffer(spec, hp["buffer_size"], n_step=N_STEP, gamma=gamma, **options)
            else:
                rb = tfdata.ReplayBuffer(spec, hp["buffer_size"], **options)
            push, extend_rows = rb.push, rb.extend

            def add(obs, next_obs, action, reward, terminated, truncated):
                push({"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                      "terminated": terminated, "truncated": truncated})

            if extend:
                def add(obs, next_obs, action, reward, terminated, truncated):  # noqa: F811
                    # the arrays CleanRL builds for stable-baselines3: float64 reward, int64 action
                    extend_rows({"obs": obs[None], "action": np.array([action]),
                                 "reward": np.array([reward]), "next_obs": next_obs[None],
                                 "terminated": np.array([terminated]),
                                 "truncated": np.array([truncated])})

            if learner == "torch":
                from_numpy = torch.from_numpy

                def sample():
                    b = rb.sample(batch_size)
                    last_batch[0] = b  # update_priorities takes the Batch
                    disc = from_numpy(b.discounts) if b.discounts is not None else gamma
                    w = from_numpy(b.weights) if b.weights is not None else None
                    return (from_numpy(b["obs"]), from_numpy(b["action"]).unsqueeze(1), from_numpy(b["reward"]),
                            from_numpy(b["next_obs"]), from_numpy(b["terminated"]).float(), disc, w)
            else:
                def sample():
                    return rb.sample(batch_size)

        if learner == "torch":
            def update(data):
                td = train_step(*data)
                if weighted:
                    rb.update_priorities(last_batch[0], td)
        else:
            def update(batch):
                net.train(batch)
                if weighted:
                    rb.update_priorities(batch, net.td_errors)

        return act, update, sync, add, sample, rb

    # Warm-up, before the clock: a throwaway learner and buffer of the same types run every call
    # once, so numba kernels are loaded (or compiled, on a cold cache) and torch has made its
    # first-call allocations; the cost is in setup_s, not in the loop.
    w_act, w_update, w_sync, w_add, w_sample, _ = build(seed + 10_000)
    w_obs = env.observation_space.sample().astype(np.float32)
    for k in range(max(batch_size, N_STEP + 1) + 1):
        w_add(w_obs, w_obs, k % n_actions, 1.0, k % 50 == 49, False)
    w_act(w_obs)
    w_update(w_sample())
    w_sync()
    del w_act, w_update, w_sync, w_add, w_sample
    act, update, sync, add, sample, rb = build(seed)

    rss_ready = _rss_now()
    setup_s = time.perf_counter() - t_start

    # -- the loop (CleanRL's, one environment) ------------------------------------------------
    rng = np.random.default_rng(seed)        # exploration draws
    slope = (hp["end_e"] - hp["start_e"]) / (hp["exploration_fraction"] * total)
    start_e, end_e = hp["start_e"], hp["end_e"]
    train_freq, target_freq = hp["train_frequency"], hp["target_network_frequency"]
    pc = time.perf_counter_ns
    acc = dict.fromkeys(SECTIONS, 0)
    t_act = t_env = t_add = t_sample = t_update = 0
    n_add = n_sample = n_greedy = 0
    episodes = []                            # (global step at its end, return, length)
    ep_return, ep_len = 0.0, 0
    obs, _ = env.reset(seed=seed)
    t_loop = pc()
    t_train = None
    for step in range(total):
        eps = max(slope * step + start_e, end_e)
        t0 = pc()
        if rng.random() < eps:
            action = int(rng.integers(n_actions))
        else:
            action = act(obs)
            n_greedy += 1
        t1 = pc()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        t2 = pc()
        add(obs, next_obs, action, reward, terminated, truncated)
        t3 = pc()
        n_add += 1
        ep_return += reward
        ep_len += 1
        if terminated or truncated:
            episodes.append((step, ep_return, ep_len))
            ep_return, ep_len = 0.0, 0
            obs, _ = env.reset()
        else:
            obs = next_obs
        t4 = pc()
        t_act += t1 - t0
        t_env += (t2 - t1) + (t4 - t3)
        t_add += t3 - t2
        if step > learning_starts:
            if t_train is None:
                t_train = t0
            if step % train_freq == 0:
                t5 = pc()
                data = sample()
                t6 = pc()
                update(data)
                t7 = pc()
                t_sample += t6 - t5
                t_update += t7 - t6
                n_sample += 1
            if step % target_freq == 0:
                t8 = pc()
                sync()
                t_update += pc() - t8
    t_end = pc()
    wall = (t_end - t_loop) / 1e9
    acc.update(act=t_act / 1e9, env=t_env / 1e9, buffer_add=t_add / 1e9, buffer_sample=t_sample / 1e9,
               update=t_update / 1e9)
    acc["other"] = max(0.0, wall - sum(acc[k] for k in SECTIONS[:-1]))
    train_wall = (t_end - t_train) / 1e9 if t_train is not None else 0.0
    snap = tfdata.memory.snapshot()
    return {
        "variant": variant, "seed": seed, "total_steps": total, "learning_starts": learning_starts,
        "episodes": episodes,
        "final_return": float(np.mean([e[1] for e in episodes[-LAST_EPISODES:]])) if episodes else None,
        "mean_return": float(np.mean([e[1] for e in episodes])) if episodes else None,
        "wall_s": wall, "train_wall_s": train_wall, "setup_s": setup_s,
        "sps": total / wall, "train_sps": (total - learning_starts - 1) / train_wall if train_wall else None,
        "sections_s": acc, "n_add": n_add, "n_sample": n_sample, "n_greedy": n_greedy,
        "buffer_add_us": acc["buffer_add"] / max(n_add, 1) * 1e6,
        "buffer_sample_us": acc["buffer_sample"] / max(n_sample, 1) * 1e6,
        "update_us": acc["update"] / max(n_sample, 1) * 1e6,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_ready_bytes": rss_ready, "rss_end_bytes": snap["rss"],
        "buffer_nbytes": int(getattr(rb, "nbytes", 0)) if kind != "sb3" else int(
            sum(getattr(rb, k).nbytes for k in ("observations", "next_observations", "actions",
                                                 "rewards", "dones", "timeouts"))),
        "torch_imported": "torch" in sys.modules, "numba_imported": "numba" in sys.modules,
        "versions": versions, "load_start": load_start,
        "load_end": [round(x, 2) for x in os.getloadavg()],
    }


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------
def run_all(variants, seeds, total, learning_starts, log) -> list[dict]:
    def describe(r):
        share = (r['sections_s']['buffer_add'] + r['sections_s']['buffer_sample']) / r['wall_s']
        return (f"final return {r['final_return']:.1f}, {r['sps']:.0f} steps/s, buffer {100 * share:.1f}%"
                f", peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB")

    return run_in_fresh_processes(__file__, list(variants), seeds,
                                  ["--steps", str(total), "--learning-starts", str(learning_starts)],
                                  timeout_s=TIMEOUT_S, describe=describe, log=log)


def curve(episodes, total, bins=CURVE_BINS):
    """See :func:`_stats.return_curve` (this experiment's number of bins)."""
    return _return_curve(episodes, total, bins)


def _ms(values) -> dict:
    v = np.asarray([x for x in values if x is not None], dtype=float)
    if v.size == 0:
        return {"mean": None, "std": None, "median": None, "n": 0}
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0,
            "median": float(np.median(v)), "n": int(v.size)}


def summarise(runs, variants, total) -> dict:
    out = {}
    for v in variants:
        rs = [r for r in runs if r["variant"] == v]
        buf_share = [(r["sections_s"]["buffer_add"] + r["sections_s"]["buffer_sample"]) / r["wall_s"] for r in rs]
        curves = [curve(r["episodes"], total)[1] for r in rs]
        out[v] = {
            "final_return": _ms(r["final_return"] for r in rs),
            "mean_return": _ms(r["mean_return"] for r in rs),
            "sps": _ms(r["sps"] for r in rs),
            "train_sps": _ms(r["train_sps"] for r in rs),
            "wall_s": _ms(r["wall_s"] for r in rs),
            "train_wall_s": _ms(r["train_wall_s"] for r in rs),
            "setup_s": _ms(r["setup_s"] for r in rs),
            "buffer_share": _ms(buf_share),
            "amdahl_bound": _ms(1.0 / (1.0 - s) for s in buf_share),
            "buffer_add_us": _ms(r["buffer_add_us"] for r in rs),
            "buffer_sample_us": _ms(r["buffer_sample_us"] for r in rs),
            "update_us": _ms(r["update_us"] for r in rs),
            "sections_share": {k: _ms(r["sections_s"][k] / r["wall_s"] for r in rs) for k in SECTIONS},
            "peak_rss_bytes": _ms(r["peak_rss_bytes"] for r in rs),
            "rss_ready_bytes": _ms(r["rss_ready_bytes"] for r in rs),
            "buffer_nbytes": _ms(r["buffer_nbytes"] for r in rs),
            "torch_imported": any(r["torch_imported"] for r in rs),
            "curve_mean": np.nanmean(curves, axis=0).tolist() if curves else [],
            "curve_std": (np.nanstd(curves, axis=0, ddof=1).tolist() if len(curves) > 1
                          else [0.0] * len(curves[0]) if curves else []),
            "seeds": [r["seed"] for r in rs],
            "finals": [r["final_return"] for r in rs],
            "means": [r["mean_return"] for r in rs],
        }
    return out


def layouts_identical(runs) -> dict | None:
    """Per seed: did the AoS and SoA runs with the torch learner produce the same episodes?
    (Same seed, same batches bit for bit, whichever layout: the whole run must coincide.)"""
    out = {}
    for r in runs:
        if r["variant"] == "torch+tfdata-aos":
            twin = [x for x in runs if x["variant"] == "torch+tfdata-soa" and x["seed"] == r["seed"]]
            if twin:
                out[r["seed"]] = twin[0]["episodes"] == r["episodes"]
    return out or None


def comparisons(agg) -> list[dict]:
    rows = []
    pairs = [(v, REFERENCE) for v in agg if v != REFERENCE] + [(EDGE, SAME_BUFFER)]
    for a, b in pairs:
        if a not in agg or b not in agg:
            continue
        A, B = agg[a], agg[b]
        row = {"variant": a, "against": b,
               "final_diff": A["final_return"]["mean"] - B["final_return"]["mean"],
               "final_p": permutation_test(A["finals"], B["finals"]) if len(A["finals"]) > 1 else None,
               "mean_diff": A["mean_return"]["mean"] - B["mean_return"]["mean"],
               "mean_p": permutation_test(A["means"], B["means"]) if len(A["means"]) > 1 else None,
               "sps_ratio": A["sps"]["mean"] / B["sps"]["mean"],
               "train_sps_ratio": (A["train_sps"]["mean"] / B["train_sps"]["mean"]
                                   if A["train_sps"]["mean"] and B["train_sps"]["mean"] else None),
               "peak_rss_ratio": A["peak_rss_bytes"]["mean"] / B["peak_rss_bytes"]["mean"]}
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def plot(agg, total) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    x = curve([], total)[0]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for v, a in agg.items():
        m, s = np.asarray(a["curve_mean"]), np.asarray(a["curve_std"])
        # AoS and SoA runs coincide (same batches): draw AoS dashed so both stay visible
        ax.plot(x, m, label=f"{v} ({a['final_return']['n']} seeds)", lw=1.6 if v in (EDGE, REFERENCE) else 1.0,
                ls="--" if v == SAME_BUFFER else "-")
        ax.fill_between(x, m - s, m + s, alpha=0.15)
    ax.set_xlabel("environment step")
    ax.set_ylabel("episodic return (mean ± std over seeds)")
    ax.set_title(f"DQN on {ENV_ID}, CleanRL hyperparameters")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT_DIR, "learning.png"), dpi=110)
    plt.close(fig)
    names.append("learning.png")

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(13, 4.2))
    vs = list(agg)
    sps = [agg[v]["sps"]["mean"] for v in vs]
    err = [agg[v]["sps"]["std"] for v in vs]
    ax1.barh(vs, sps, xerr=err, color=["tab:green" if v == EDGE else "tab:blue" for v in vs])
    ax1.set_xlabel("steps per second (whole run)")
    ax1.invert_yaxis()
    left = np.zeros(len(vs))
    for k in SECTIONS:
        us = np.array([agg[v]["sections_share"][k]["mean"] * 1e6 / agg[v]["sps"]["mean"] for v in vs])
        ax2.barh(vs, us, left=left, label=k)
        left += us
    ax2.set_xlabel("µs per environment step, by section")
    ax2.set_yticklabels([])
    ax2.invert_yaxis()
    ax2.legend(fontsize=7)
    rss = [agg[v]["peak_rss_bytes"]["mean"] / 2**20 for v in vs]
    ax3.barh(vs, rss, color=["tab:green" if v == EDGE else "tab:gray" for v in vs])
    ax3.set_xlabel("peak RSS of the process (MiB)")
    ax3.set_yticklabels([])
    ax3.invert_yaxis()
    fig.tight_layout()
    fig.savefig(os.path.join(OUT_DIR, "speed.png"), dpi=110)
    plt.close(fig)
    names.append("speed.png")
    return names


def _pm(cell, fmt="{:.0f}", scale=1.0) -> str:
    if cell["mean"] is None:
        return "n/a"
    return (fmt + " ± " + fmt).format(cell["mean"] * scale, cell["std"] * scale)


def _learning_verdict(c) -> str:
    """How two variants' learning compares, from the permutation tests (alpha 0.05)."""
    ps = [p for p in (c["final_p"], c["mean_p"]) if p is not None]
    if not ps:
        return "learning not compared (1 seed)"
    if min(ps) >= 0.05:
        return "no difference in learning detected"
    return "**learning differs**"


def _ratio(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _p(p) -> str:
    return "n/a (1 seed)" if p is None else f"{p:.2f}"


def write_report(agg, comps, run, pngs, total, learning_starts, versions, same_layouts=None) -> None:
    n_seeds = max(a["final_return"]["n"] for a in agg.values())
    L = [f"# DQN on {ENV_ID}: tfdata inside a real training loop\n",
         f"Made by `experiments/dqn_cartpole.py` ({run['mode']} run, command `{run['command']}`, {n_seeds} "
         f"seed(s) per variant, {total:,} environment steps each, {run['wall_clock_s']:.0f} s in all). Raw numbers "
         "and every episode: `results.json`.\n"]
    hl = headline(agg, comps)
    if hl:
        L.append(f"<!-- headline: {hl} -->\n")
    edge, twin, ref = agg.get(EDGE), agg.get(SAME_BUFFER), agg.get(REFERENCE)
    L.append("## Findings\n")
    if ref:
        shares = {v: a["buffer_share"]["mean"] for v, a in agg.items() if v != EDGE}
        L.append(f"* In the torch loop the buffer is a small part: {100 * ref['buffer_share']['mean']:.1f}% of the "
                 f"run with stable-baselines3's buffer, {min(100 * s for s in shares.values()):.1f}-"
                 f"{max(100 * s for s in shares.values()):.1f}% over all torch variants, so no buffer can make "
                 f"this loop more than {ref['amdahl_bound']['mean']:.2f}x faster (Amdahl bound of the reference).")
    if ref and twin:
        c = next(r for r in comps if r["variant"] == SAME_BUFFER and r["against"] == REFERENCE)
        L.append(f"* Swapping stable-baselines3's buffer for tfdata's (AoS): buffer time per sample "
                 f"{ref['buffer_sample_us']['mean']:.0f} → {twin['buffer_sample_us']['mean']:.0f} µs, per add "
                 f"{ref['buffer_add_us']['mean']:.1f} → {twin['buffer_add_us']['mean']:.1f} µs (measured inside the "
                 f"loop); steps per second {c['sps_ratio']:.2f}x; final return {_pm(twin['final_return'])} vs "
                 f"{_pm(ref['final_return'])} (permutation test p = {_p(c['final_p'])}).")
    if same_layouts:
        n_same = sum(same_layouts.values())
        L.append(f"* AoS and SoA give the same run: with the same seed the torch learner saw identical batches and "
                 f"produced identical episodes in {n_same} of {len(same_layouts)} seeds (every episode's length "
                 "compared), as the layout contract promises.")
    if edge and twin:
        c = next(r for r in comps if r["variant"] == EDGE and r["against"] == SAME_BUFFER)
        L.append(f"* The edge loop (no torch: `tfdata.nn.DQN`, numba kernels) runs {c['sps_ratio']:.1f}x the steps "
                 f"per second of the same loop with torch ({edge['sps']['mean']:.0f} vs {twin['sps']['mean']:.0f}; "
                 f"{_ratio(c['train_sps_ratio'])}x while training) with {c['peak_rss_ratio']:.2f}x its peak memory "
                 f"({edge['peak_rss_bytes']['mean'] / 2**20:.0f} vs {twin['peak_rss_bytes']['mean'] / 2**20:.0f} MiB); "
                 f"{_learning_verdict(c)}: final return {_pm(edge['final_return'])} vs {_pm(twin['final_return'])} "
                 f"(p = {_p(c['final_p'])}), mean return over the run {_pm(edge['mean_return'])} vs "
                 f"{_pm(twin['mean_return'])} (p = {_p(c['mean_p'])}).")
        upd = twin["update_us"]["mean"] / edge["update_us"]["mean"]
        step_us = {k: 1e6 * edge["sections_share"][k]["mean"] / edge["sps"]["mean"] for k in SECTIONS}
        L.append(f"* Why not more: the update is {100 * edge['sections_share']['update']['mean']:.0f}% of the edge loop "
                 f"and {100 * twin['sections_share']['update']['mean']:.0f}% of the torch one, and one update takes "
                 f"{edge['update_us']['mean']:.0f} µs against torch's {twin['update_us']['mean']:.0f} µs ({upd:.1f}x), so the "
                 f"loop gains about what the update gains. Greedy actions are far cheaper without torch "
                 f"(act {step_us['act']:.1f} µs per step against {1e6 * twin['sections_share']['act']['mean'] / twin['sps']['mean']:.1f}), "
                 f"and gymnasium's step ({step_us['env']:.1f} µs per step) is the same in both and now "
                 f"{100 * edge['sections_share']['env']['mean']:.0f}% of the edge loop.")
        if ref:
            L.append(f"* Memory: tfdata's kernels bring numba: the torch loop with tfdata's buffer peaks at "
                     f"{twin['peak_rss_bytes']['mean'] / 2**20:.0f} MiB against {ref['peak_rss_bytes']['mean'] / 2**20:.0f} MiB "
                     f"with stable-baselines3's (which needs no numba); the edge loop, numba without torch, at "
                     f"{edge['peak_rss_bytes']['mean'] / 2**20:.0f} MiB.")
        goals = [("learning equal within seed noise (no significant difference, α = 0.05)",
                  None if c["final_p"] is None else c["final_p"] >= 0.05 and (c["mean_p"] or 0) >= 0.05),
                 ("at least 5x the steps per second", c["sps_ratio"] >= 5.0),
                 ("at most half the peak memory", c["peak_rss_ratio"] <= 0.5)]
        L.append("\n## Goals of the edge loop (against torch with the same buffer)\n")
        L.append("| goal | met? | measured |")
        L.append("|---|---|---|")
        meas = [f"final p = {_p(c['final_p'])}, whole-run p = {_p(c['mean_p'])}",
                f"{c['sps_ratio']:.2f}x (training phase {_ratio(c['train_sps_ratio'])}x)",
                f"{c['peak_rss_ratio']:.2f}x"]
        for (g, ok), m in zip(goals, meas):
            L.append(f"| {g} | {'n/a' if ok is None else 'yes' if ok else '**no**'} | {m} |")
    algo = [c for c in comps if c["against"] == REFERENCE and c["variant"] in ("torch+tfdata-per", "torch+tfdata-nstep3")]
    if algo:
        L.append("\n## The algorithm variants\n")
        for c in algo:
            a = agg[c["variant"]]
            L.append(f"* {c['variant']}: mean return over the run {c['mean_diff']:+.1f} against CleanRL's setup "
                     f"(p = {_p(c['mean_p'])}), final return {c['final_diff']:+.1f} (p = {_p(c['final_p'])}); "
                     f"add {a['buffer_add_us']['mean']:.1f} µs, sample {a['buffer_sample_us']['mean']:.0f} µs in the loop.")
        if "torch+tfdata-per" in agg and SAME_BUFFER in agg:
            L.append(f"* The prioritized buffer's push costs {agg['torch+tfdata-per']['buffer_add_us']['mean']:.0f} µs in "
                     f"the loop, against {agg[SAME_BUFFER]['buffer_add_us']['mean']:.1f} µs for the uniform buffer.")
    L.append("")
    for p in pngs:
        L.append(f"![{p}]({p})\n")
    L.append("## Every variant (mean ± std over seeds)\n")
    L.append("| variant | final return | mean return | steps/s | steps/s training | wall (s) | training wall (s) "
             "| buffer share | Amdahl bound | add (µs) | sample (µs) | update (µs) | peak RSS (MiB) | buffer (KiB) |")
    L.append("|---|" + "---:|" * 13)
    for v, a in agg.items():
        L.append(f"| {v} | {_pm(a['final_return'], '{:.1f}')} | {_pm(a['mean_return'], '{:.1f}')} | {_pm(a['sps'])} "
                 f"| {_pm(a['train_sps'])} | {_pm(a['wall_s'], '{:.1f}')} | {_pm(a['train_wall_s'], '{:.1f}')} "
                 f"| {_pm(a['buffer_share'], '{:.1f}', 100)}% | {a['amdahl_bound']['mean']:.3f} "
                 f"| {_pm(a['buffer_add_us'], '{:.1f}')} | {_pm(a['buffer_sample_us'], '{:.1f}')} "
                 f"| {_pm(a['update_us'])} | {_pm(a['peak_rss_bytes'], '{:.0f}', 2**-20)} "
                 f"| {a['buffer_nbytes']['mean'] / 1024:.0f} |")
    L.append("")
    L.append("Where the time goes (share of the loop's wall clock, mean over seeds):\n")
    L.append("| variant | " + " | ".join(SECTIONS) + " |")
    L.append("|---|" + "---:|" * len(SECTIONS))
    for v, a in agg.items():
        L.append(f"| {v} | " + " | ".join(f"{100 * a['sections_share'][k]['mean']:.1f}%" for k in SECTIONS) + " |")
    L.append("")
    L.append("## Comparisons\n")
    L.append("| variant | against | final return diff | p | mean return diff | p | steps/s ratio | training steps/s "
             "ratio | peak RSS ratio |")
    L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for c in comps:
        L.append(f"| {c['variant']} | {c['against']} | {c['final_diff']:+.1f} | {_p(c['final_p'])} | {c['mean_diff']:+.1f} "
                 f"| {_p(c['mean_p'])} | {c['sps_ratio']:.2f} | {_ratio(c['train_sps_ratio'])} "
                 f"| {c['peak_rss_ratio']:.2f} |")
    L.append("")
    L.append("## Method\n")
    L.append(f"* Algorithm and hyperparameters: CleanRL's `dqn.py` (github.com/vwxyzjn/cleanrl, defaults of its "
             f"`Args`): {HP['total_timesteps']:,} steps, buffer {HP['buffer_size']:,}, batch {HP['batch_size']}, learning "
             f"starts {HP['learning_starts']:,}, train every {HP['train_frequency']} steps, hard target update every "
             f"{HP['target_network_frequency']}, gamma {HP['gamma']}, Adam {HP['learning_rate']}, epsilon "
             f"{HP['start_e']} → {HP['end_e']} linearly over {HP['exploration_fraction']:.0%} of the run, MLP "
             f"4-{HP['hidden'][0]}-{HP['hidden'][1]}-2 with ReLU, MSE loss. This run: {total:,} steps, learning "
             f"starts {learning_starts:,}.")
    L.append("* Differences from CleanRL, the same for every variant: one `gymnasium.make` environment (CleanRL "
             "wraps it in a one-env vector env), reset by hand at episode end; greedy actions computed under "
             "`torch.no_grad()` (faster than CleanRL's forward with autograd on: the torch baseline is not "
             "handicapped); exploration draws from a seeded numpy generator. The prioritized (α "
             f"{PER['alpha']}, β {PER['beta']} → {PER['beta_final']} over the training samples, loss weighted by the "
             f"importance weights, priorities |TD error|) and {N_STEP}-step (target `r_n + gamma^k (1 - terminated) "
             "max Q_target`) variants change the algorithm and are not expected to learn alike.")
    L.append("* Learners: torch " + str(versions.get("torch")) + " on the CPU with `torch.set_num_threads(1)` and "
             "`OMP_NUM_THREADS=1`; `tfdata.nn.DQN` (numba kernels: forward, backward, Adam as torch.optim.Adam, "
             "torch's `nn.Linear` initialisation; float32; its gradients are tested against finite differences and "
             "torch in `tests/test_nn.py`). Buffers: stable-baselines3 " + str(versions.get("stable_baselines3"))
             + " `ReplayBuffer` (`handle_timeout_termination=False`, as CleanRL), tfdata `ReplayBuffer` / "
             "`PrioritizedReplayBuffer`; the tfdata batches reach torch through `torch.from_numpy` (no copy); that "
             "conversion is counted as buffer time, as SB3's own conversion is.")
    L.append("* Timing: `time.perf_counter_ns` around each call in the loop: `act` (exploration draw and greedy "
             "action), `env` (step and reset), `buffer_add`, `buffer_sample` (to tensors), `update` (loss, "
             "backward, optimizer, target sync), `other` (the loop itself). Buffer share = (add + sample) / loop "
             "wall clock; Amdahl bound = 1 / (1 - buffer share): the speed-up of this loop if buffer calls cost "
             "nothing. Steps per second over the whole loop and over the training phase (after learning starts). "
             f"The timer itself costs about {run.get('timer_overhead_ns') or 0:.0f} ns per pair of reads.")
    L.append("* Memory: peak RSS (`getrusage` max RSS) of each run's own process, which holds the interpreter, "
             "numpy, gymnasium, tfdata, and torch (torch variants) or numba (the edge loop; numba is imported by "
             "tfdata's kernels in every variant).")
    L.append("* Learning: final return = mean return of the last "
             f"{LAST_EPISODES} episodes; mean return = over every episode of the run (area under the curve). "
             "Two variants are compared with an exact two-sided permutation test of equal means over seeds (all "
             "C(10, 5) = 252 splits for 5 against 5; the smallest possible p is 2/252 = 0.008). A p above 0.05 "
             "means no difference was detected with 5 seeds, not that the variants are identical. Learning "
             f"curves: mean return of the episodes ending in each of {CURVE_BINS} step ranges, mean ± std over seeds.")
    L.append("* Each run is a fresh process; variants alternate seed by seed (the order rotates). Load average at "
             "the start and end of every run is in `results.json`.")
    L.append("")
    write_methodology_report(OUT_DIR, L, run)


def headline(agg, comps) -> str | None:
    c = next((r for r in comps if r["variant"] == EDGE and r["against"] == SAME_BUFFER), None)
    ref = agg.get(REFERENCE)
    if c is None or ref is None:
        return None
    return (f"buffer share of the torch loop {100 * ref['buffer_share']['mean']:.1f}% (Amdahl bound "
            f"{ref['amdahl_bound']['mean']:.2f}x); edge loop without torch: {c['sps_ratio']:.1f}x steps/s, "
            f"{c['peak_rss_ratio']:.2f}x peak memory, final return {agg[EDGE]['final_return']['mean']:.0f} vs "
            f"{agg[SAME_BUFFER]['final_return']['mean']:.0f}")


def publish(runs, run, versions, variants, total, learning_starts) -> None:
    """results.json, plots and README.md from the raw runs."""
    agg = summarise(runs, variants, total)
    comps = comparisons(agg)
    pngs = plot(agg, total)
    same_layouts = layouts_identical(runs)
    write_json(os.path.join(OUT_DIR, "results.json"),
               {"methodology": run, "versions": versions, "summary": {v: {k: x for k, x in a.items()
                                                                          if k not in ("curve_mean", "curve_std")}
                                                                      for v, a in agg.items()},
                "curves": {v: {"mean": a["curve_mean"], "std": a["curve_std"]} for v, a in agg.items()},
                "comparisons": comps, "same_episodes_aos_soa": same_layouts, "runs": runs})
    write_report(agg, comps, run, pngs, total, learning_starts, versions, same_layouts)


def render(path: str) -> None:
    """Redo the report of a finished run (its raw runs and methodology are kept as they were)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    runs = data["runs"]
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    publish(runs, data["methodology"], data["versions"], variants, runs[0]["total_steps"],
            runs[0]["learning_starts"])
    print(f"report rewritten: {os.path.relpath(OUT_DIR)}/README.md", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, 30k steps (about a minute)")
    ap.add_argument("--seeds", type=int, nargs="*", default=None)
    ap.add_argument("--steps", type=int, default=None, help="environment steps per run")
    ap.add_argument("--learning-starts", type=int, default=HP["learning_starts"])
    ap.add_argument("--variants", nargs="*", default=None, help=f"subset of: {', '.join(VARIANTS)}")
    ap.add_argument("--render", default=None, metavar="RESULTS_JSON",
                    help="rewrite the report and plots from a results.json (no runs)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.render:
        render(args.render)
        return
    mode = "quick" if args.quick else "full"
    total = args.steps or STEPS[mode]
    if args.worker:
        r = run_worker(args.worker, args.seed, total, args.learning_starts)
        print("RESULT " + json.dumps(r), flush=True)
        return
    variants = args.variants or list(VARIANTS)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    seeds = args.seeds if args.seeds is not None else SEEDS[mode]
    os.makedirs(OUT_DIR, exist_ok=True)
    command = "python experiments/dqn_cartpole.py" + (" --quick" if args.quick else "")
    extra = " ".join(a for a in sys.argv[1:] if a != "--quick")
    if extra:
        command += " " + extra
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=seeds, command=command,
                    parameters={"hyperparameters": HP, "env": ENV_ID, "total_steps": total,
                                "learning_starts": args.learning_starts, "variants": variants,
                                "per": PER, "n_step": N_STEP})
    runs = run_all(variants, seeds, total, args.learning_starts, lambda s: print(s, flush=True))
    run = rec.finish(child_peak_rss_bytes=max(r["peak_rss_bytes"] for r in runs))
    run["timer_overhead_ns"] = rec.timer_overhead_ns
    versions = {}
    for r in runs:
        versions.update(r["versions"])
    publish(runs, run, versions, variants, total, args.learning_starts)
    print(f"{mode} run {rec.run_name} done in {run['wall_clock_s']:.0f} s; report: "
          f"{os.path.relpath(OUT_DIR)}/README.md", flush=True)


if __name__ == "__main__":
    main()
