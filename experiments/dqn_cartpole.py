"""DQN on CartPole-v1 with tfdata inside the loop: does the buffer matter, can the loop drop torch,
and how should the replay ratio be held?

CleanRL's DQN (``cleanrl/dqn.py``, its hyperparameters) with the learner, the buffer and the
training schedule chosen per variant. Two studies, each with its own report:

``--study buffers`` (the default; ``reports/dqn/``):

1. **Buffer swap, everything else identical.** The torch MLP on the CPU (one thread) with the
   replay buffer chosen by a flag: stable-baselines3's ``ReplayBuffer`` (what CleanRL uses), or
   tfdata's (AoS, SoA, prioritized, 3-step). The time inside buffer calls is measured in the loop,
   where caches are cold, and gives the Amdahl bound: the loop can get at most
   ``1 / (1 - buffer share)`` faster from any buffer.
2. **The edge loop: no torch.** The same algorithm, hyperparameters and network as numba kernels
   (``tfdata.nn.DQN``: forward, backward, Adam) over the tfdata buffer: a loop for a 512 MB device.
   Goals: learning equal to the torch variant within seed noise, at least 5x its steps per second,
   at most half its peak memory.

``--study replay_ratio`` (``reports/replay_ratio/``): the edge loop with the replay ratio (rows
sampled per row inserted) held three ways. CleanRL sets it by a fixed train frequency: one batch
of 128 every 10 environment steps, 12.8 on average, every row replayed a Poisson-like random
number of times. tfdata can instead hold the ratio with a rate limiter (``tfdata.RateLimiter``:
the actor's ``push`` and the learner's ``sample`` each wait while they would run ahead), which
lets actor and learner run in two threads, and can replay every row exactly k times
(``sampler="exactly_k"``). Does learning change, per environment step and per second?

* ``fixed-10``: CleanRL's loop, one thread (the edge loop of the first study).
* ``limiter-R`` (R = 6.4, 12.8, 25.6): an actor thread (act, env step, push) and a learner thread
  (sample, update), the ratio held by ``RateLimiter(R, min_size_to_sample=learning_starts,
  error_buffer=4 batches)``.
* ``exactly-13`` against ``limiter-13``: two threads, every row replayed exactly 13 times
  (``policy="block"``: the actor waits for free slots) against uniform sampling at the same ratio.

In the two-thread variants the target network is copied every ``500 * R / 128`` updates (500
environment steps' worth, as CleanRL) and the actor acts with its own copy of the online network,
refreshed after every update under a lock, so actor and learner never share a workspace. Thread
timing makes those runs not bit-reproducible; the single-thread runs are.

Every (variant, seed) runs in a fresh process (its own peak memory, no shared caches); runs
alternate variants seed by seed so slow drift of the machine hits all of them alike.

    python experiments/dqn_cartpole.py --quick                        # 1 seed, 30k steps: about a minute
    python experiments/dqn_cartpole.py                                # 5 seeds, 500k steps: about 40 minutes
    python experiments/dqn_cartpole.py --study replay_ratio [--quick]  # the replay-ratio variants
    python experiments/dqn_cartpole.py --render reports/dqn/results.json   # the report again, no runs

Needs the ``rl`` and ``torch`` extras (gymnasium, torch 2.13.0 CPU, stable-baselines3). Writes
README.md, results.json, learning.png and speed.png in the study's report folder. Only the public
tfdata API.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from functools import partial

import numpy as np

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
from _plots import hbar_stack, hbar_values, learning_curves, panels_figure  # noqa: E402
from _recording import RunRecord, report_dir, write_json  # noqa: E402
from _render import hand_written, md_table, p_value as _p, pm as _pm  # noqa: E402
from _render import write_report as write_methodology_report  # noqa: E402
from _stats import permutation_test, return_curve, seed_curves, summary as _ms  # noqa: E402
from _timing import rss_statm as _rss_now, run_in_fresh_processes  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
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
ERROR_BATCHES = 4        # the rate limiter's error buffer, in batches of samples
WAIT_S = 0.05            # each wait's timeout: a thread then checks whether the run is over
VARIANTS = {
    # name: (learner, buffer, schedule); schedule "fixed" is CleanRL's one-thread loop (a batch
    # every train_frequency steps), ("limiter", R) and ("exactly_k", k) run actor and learner in
    # two threads
    "torch+sb3": ("torch", "sb3", "fixed"),
    "torch+tfdata-aos": ("torch", "aos", "fixed"),
    # CleanRL's own call, one vector-env step: the arrays it hands stable-baselines3, to extend
    "torch+tfdata-aos-extend": ("torch", "aos-extend", "fixed"),
    "torch+tfdata-soa": ("torch", "soa", "fixed"),
    "torch+tfdata-per": ("torch", "per", "fixed"),
    "torch+tfdata-nstep3": ("torch", "nstep", "fixed"),
    "edge (numba+tfdata-aos)": ("numba", "aos", "fixed"),
    "fixed-10": ("numba", "aos", "fixed"),  # the edge loop under its name in the replay-ratio study
    "limiter-6.4": ("numba", "aos", ("limiter", 6.4)),
    "limiter-12.8": ("numba", "aos", ("limiter", 12.8)),
    "limiter-25.6": ("numba", "aos", ("limiter", 25.6)),
    "limiter-13": ("numba", "aos", ("limiter", 13.0)),
    "exactly-13": ("numba", "aos", ("exactly_k", 13)),
}
EDGE = "edge (numba+tfdata-aos)"
SAME_BUFFER = "torch+tfdata-aos"   # the torch twin of the edge loop
STUDIES = {
    # name: report folder, variants, the reference, the pairs compared (None: every variant
    # against the reference, and the edge loop against its torch twin), learning_starts per mode
    "buffers": {"report": "dqn", "reference": "torch+sb3", "pairs": None,
                "variants": ["torch+sb3", "torch+tfdata-aos", "torch+tfdata-aos-extend", "torch+tfdata-soa",
                             "torch+tfdata-per", "torch+tfdata-nstep3", EDGE],
                "learning_starts": {"full": HP["learning_starts"], "quick": HP["learning_starts"]}},
    "replay_ratio": {"report": "replay_ratio", "reference": "fixed-10",
                     "pairs": [("limiter-12.8", "fixed-10"), ("limiter-6.4", "fixed-10"),
                               ("limiter-25.6", "fixed-10"), ("exactly-13", "limiter-13")],
                     "variants": ["fixed-10", "limiter-6.4", "limiter-12.8", "limiter-25.6", "limiter-13",
                                  "exactly-13"],
                     "learning_starts": {"full": HP["learning_starts"], "quick": 2_000}},
}
SEEDS = {"full": [0, 1, 2, 3, 4], "quick": [0]}
STEPS = {"full": HP["total_timesteps"], "quick": 30_000}
LAST_EPISODES = 100               # final return = mean of the last 100 episodes
CURVE_BINS = 50
TIMEOUT_S = 3600
OUT_DIRS = {name: report_dir(s["report"]) for name, s in STUDIES.items()}
STUDY_OF = {s["report"]: name for name, s in STUDIES.items()}  # results.json names its report
SECTIONS = ("act", "env", "buffer_add", "buffer_sample", "update", "other")


# ---------------------------------------------------------------------------------------------
# The measured loop (runs in a worker process)
# ---------------------------------------------------------------------------------------------
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
    learner, kind, schedule = VARIANTS[variant]
    hp = dict(HP, total_timesteps=total, learning_starts=learning_starts)
    import gymnasium as gym

    import tfdata

    env = gym.make(ENV_ID)
    obs_dim = env.observation_space.shape[0]
    n_actions = int(env.action_space.n)
    versions = {"gymnasium": gym.__version__, "tfdata": tfdata.__version__, "numpy": np.__version__}
    gamma, batch_size = hp["gamma"], hp["batch_size"]
    weighted = kind == "per"
    if schedule == "fixed":
        held = {}
    elif schedule[0] == "limiter":
        held = {"rate_limiter": lambda: tfdata.RateLimiter(schedule[1], learning_starts, ERROR_BATCHES * batch_size,
                                                           timeout=WAIT_S)}
    else:
        held = {"sampler": "exactly_k", "replays": schedule[1], "policy": "block", "timeout": WAIT_S}

    def build(seed):
        """Learner and buffer of this variant: act, update, sync, add, sample, the buffer and the
        numba learner (None for torch)."""
        last_batch = [None]
        net = None
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
            options.update({k: v() if callable(v) else v for k, v in held.items()})
            if kind == "per":
                n_train = max(1, (total - learning_starts) // hp["train_frequency"])
                rb = tfdata.PrioritizedReplayBuffer(spec, hp["buffer_size"], beta_steps=n_train, **PER, **options)
            elif kind == "nstep":
                rb = tfdata.ReplayBuffer(spec, hp["buffer_size"], n_step=N_STEP, gamma=gamma, **options)
            else:
                rb = tfdata.ReplayBuffer(spec, hp["buffer_size"], **options)
            push, extend_rows = rb.push, rb.extend

            if kind == "aos-extend":
                def add(obs, next_obs, action, reward, terminated, truncated):
                    # the arrays CleanRL builds for stable-baselines3: float64 reward, int64 action
                    extend_rows({"obs": obs[None], "action": np.array([action]),
                                 "reward": np.array([reward]), "next_obs": next_obs[None],
                                 "terminated": np.array([terminated]),
                                 "truncated": np.array([truncated])})
            else:
                def add(obs, next_obs, action, reward, terminated, truncated):
                    push({"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                          "terminated": terminated, "truncated": truncated})

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

        return act, update, sync, add, sample, rb, net

    # Warm-up, before the clock: a throwaway learner and buffer of the same types run every call
    # once, so numba kernels are loaded (or compiled, on a cold cache) and torch has made its
    # first-call allocations; the cost is in setup_s, not in the loop. A held ratio samples once
    # learning_starts rows are in.
    w_act, w_update, w_sync, w_add, w_sample, _, _ = build(seed + 10_000)
    w_obs = env.observation_space.sample().astype(np.float32)
    n_warm = max(batch_size, N_STEP + 1) + 1 if schedule == "fixed" else max(learning_starts, batch_size)
    for k in range(n_warm):
        w_add(w_obs, w_obs, k % n_actions, 1.0, schedule == "fixed" and k % 50 == 49, False)
    w_act(w_obs)
    w_update(w_sample())
    w_sync()
    del w_act, w_update, w_sync, w_add, w_sample
    act, update, sync, add, sample, rb, net = build(seed)

    rss_ready = _rss_now()
    setup_s = time.perf_counter() - t_start
    loop = one_thread_loop if schedule == "fixed" else two_thread_loop
    r = loop(env, hp, seed, total, schedule, act=act, update=update, sync=sync, add=add, sample=sample, rb=rb,
             net=net)
    wall, acc, episodes, train_wall = r["wall"], r["sections_s"], r["episodes"], r["train_wall"]
    n_add, n_sample = total, r["updates"]
    snap = tfdata.memory.snapshot()
    lim = getattr(rb, "rate_limiter", None)
    return {
        "variant": variant, "seed": seed, "total_steps": total, "learning_starts": learning_starts,
        "episodes": episodes,
        "final_return": float(np.mean([e[1] for e in episodes[-LAST_EPISODES:]])) if episodes else None,
        "mean_return": float(np.mean([e[1] for e in episodes])) if episodes else None,
        "wall_s": wall, "train_wall_s": train_wall, "setup_s": setup_s,
        "sps": total / wall, "train_sps": (total - learning_starts - 1) / train_wall if train_wall else None,
        "sections_s": acc, "n_add": n_add, "n_sample": n_sample, "n_greedy": r["n_greedy"],
        "updates": n_sample, "replay_ratio": n_sample * batch_size / max(1, total - learning_starts),
        "actor_waits": r.get("actor_waits"), "learner_waits": r.get("learner_waits"),
        "limiter": lim.metrics() if lim is not None else None,
        "exactly_k": ({"dropped": rb.sampler.dropped, "lost_replays": rb.sampler.lost_replays,
                       "delivered": rb.sampler.delivered} if held.get("sampler") == "exactly_k" else None),
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


class Episodes:
    """The episodes of one environment: ``ended``, ``(global step at its end, return, length)``
    of each one ended, and the return and length of the one running."""

    def __init__(self):
        self.ended, self.ret, self.len = [], 0.0, 0

    def step(self, env, step, next_obs, reward, terminated, truncated):
        """Count one environment step; the observation to act on next (the env reset when the
        episode ended)."""
        self.ret += reward
        self.len += 1
        if not (terminated or truncated):
            return next_obs
        self.ended.append((step, self.ret, self.len))
        self.ret, self.len = 0.0, 0
        return env.reset()[0]


def one_thread_loop(env, hp, seed, total, schedule, *, act, update, sync, add, sample, rb, net) -> dict:
    """CleanRL's loop, one environment: act, step, add; a batch every train_frequency steps after
    learning_starts; the target copied every target_network_frequency steps."""
    n_actions = int(env.action_space.n)
    learning_starts = hp["learning_starts"]
    rng = np.random.default_rng(seed)        # exploration draws
    slope = (hp["end_e"] - hp["start_e"]) / (hp["exploration_fraction"] * total)
    start_e, end_e = hp["start_e"], hp["end_e"]
    train_freq, target_freq = hp["train_frequency"], hp["target_network_frequency"]
    pc = time.perf_counter_ns
    acc = dict.fromkeys(SECTIONS, 0)
    t_act = t_env = t_add = t_sample = t_update = 0
    n_sample = n_greedy = 0
    episodes = Episodes()
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
        obs = episodes.step(env, step, next_obs, reward, terminated, truncated)
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
    return {"wall": wall, "sections_s": acc, "episodes": episodes.ended, "train_wall": train_wall,
            "updates": n_sample, "n_greedy": n_greedy}


def two_thread_loop(env, hp, seed, total, schedule, *, act, update, sync, add, sample, rb, net) -> dict:
    """An actor thread (act with its own copy of the online network, step, push) and a learner
    thread (sample, update, copy the weights to the actor); the buffer's rate limiter or
    exactly-k sampler makes each wait (a TimeoutError every WAIT_S, then retried) while it would
    run ahead."""
    import tfdata

    n_actions = int(env.action_space.n)
    learning_starts, B = hp["learning_starts"], hp["batch_size"]
    updates_per_sync = max(1, round(hp["target_network_frequency"] * schedule[1] / B))
    slope = (hp["end_e"] - hp["start_e"]) / (hp["exploration_fraction"] * total)
    start_e, end_e = hp["start_e"], hp["end_e"]
    episodes = Episodes()
    counts = {"updates": 0, "actor_waits": 0, "learner_waits": 0}
    pc = time.perf_counter_ns
    times = dict.fromkeys(SECTIONS[:-1], 0)
    actor = tfdata.nn.DQN((env.observation_space.shape[0], *hp["hidden"], n_actions), seed=seed)
    actor.online.copy_from(net.online)
    weights = threading.Lock()
    done = threading.Event()
    failure = []

    def act_loop():
        try:
            rng = np.random.default_rng(seed)
            obs, _ = env.reset(seed=seed)
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
                while True:  # the push waits while the actor would run ahead of the learner
                    try:
                        add(obs, next_obs, action, reward, terminated, truncated)
                        break
                    except TimeoutError:
                        counts["actor_waits"] += 1
                        if failure:
                            return
                t3 = pc()
                obs = episodes.step(env, step, next_obs, reward, terminated, truncated)
                t4 = pc()
                times["act"] += t1 - t0
                times["env"] += (t2 - t1) + (t4 - t3)
                times["buffer_add"] += t3 - t2
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failure.append(e)
        finally:
            done.set()

    def learn_loop():
        try:
            while True:
                if schedule[0] == "exactly_k" and len(rb) < learning_starts:  # no minimum size of its own
                    if done.is_set():
                        return
                    time.sleep(0.001)
                    continue
                t5 = pc()
                try:
                    batch = sample()
                except TimeoutError:
                    # the limiter (or exactly-k) has no batch for us yet: over if the actor is
                    counts["learner_waits"] += 1
                    if done.is_set():
                        return
                    continue
                t6 = pc()
                update(batch)
                with weights:
                    actor.online.copy_from(net.online)
                counts["updates"] += 1
                if counts["updates"] % updates_per_sync == 0:
                    sync()
                times["buffer_sample"] += t6 - t5
                times["update"] += pc() - t6
        except BaseException as e:  # noqa: BLE001
            failure.append(e)

    t_loop = pc()
    threads = [threading.Thread(target=act_loop), threading.Thread(target=learn_loop)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failure:
        raise failure[0]
    wall = (pc() - t_loop) / 1e9
    return {"wall": wall, "sections_s": {k: v / 1e9 for k, v in times.items()}, "episodes": episodes.ended,
            "train_wall": None, "updates": counts["updates"], "n_greedy": None,
            "actor_waits": counts["actor_waits"], "learner_waits": counts["learner_waits"]}


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------
def run_all(variants, seeds, total, learning_starts, log) -> list[dict]:
    def describe(r):
        share = (r["sections_s"]["buffer_add"] + r["sections_s"]["buffer_sample"]) / r["wall_s"]
        one_thread = "other" in r["sections_s"]  # two threads' sections overlap: no share of the wall clock
        return (f"final return {r['final_return']:.1f}, {r['sps']:.0f} steps/s"
                + (f", buffer {100 * share:.1f}%" if one_thread else "")
                + f", replay ratio {r['replay_ratio']:.2f}, peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB")

    return run_in_fresh_processes(__file__, list(variants), seeds,
                                  ["--steps", str(total), "--learning-starts", str(learning_starts)],
                                  timeout_s=TIMEOUT_S, describe=describe, log=log)


# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------
def summarise(runs, variants, total) -> dict:
    out = {}
    for v in variants:
        rs = [r for r in runs if r["variant"] == v]
        if not rs:
            continue
        buf_share = [(r["sections_s"]["buffer_add"] + r["sections_s"]["buffer_sample"]) / r["wall_s"] for r in rs]
        col = lambda key: _ms(r.get(key) for r in rs)  # noqa: E731
        out[v] = {
            **{k: col(k) for k in ("final_return", "mean_return", "sps", "train_sps", "wall_s", "train_wall_s",
                                   "setup_s", "replay_ratio", "updates")},
            "buffer_share": _ms(buf_share),
            "amdahl_bound": _ms(1.0 / (1.0 - s) for s in buf_share),
            **{k: col(k) for k in ("buffer_add_us", "buffer_sample_us", "update_us")},
            "sections_share": {k: _ms(r["sections_s"][k] / r["wall_s"] for r in rs) for k in rs[0]["sections_s"]},
            "sections_us": {k: _ms(r["sections_s"][k] / r["total_steps"] * 1e6 for r in rs)
                            for k in rs[0]["sections_s"]},
            **{k: col(k) for k in ("peak_rss_bytes", "rss_ready_bytes", "buffer_nbytes")},
            "torch_imported": any(r["torch_imported"] for r in rs),
            **dict(zip(("curve_mean", "curve_std"), seed_curves([r["episodes"] for r in rs], total, CURVE_BINS))),
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


def comparisons(agg, study: dict) -> list[dict]:
    ref = study["reference"]
    pairs = study["pairs"] or [(v, ref) for v in agg if v != ref] + [(EDGE, SAME_BUFFER)]
    rows = []
    for a, b in pairs:
        if a not in agg or b not in agg:
            continue
        A, B = agg[a], agg[b]
        two = len(A["finals"]) > 1 and len(B["finals"]) > 1
        rows.append({"variant": a, "against": b,
                     "final_diff": A["final_return"]["mean"] - B["final_return"]["mean"],
                     "final_p": permutation_test(A["finals"], B["finals"]) if two else None,
                     "mean_diff": A["mean_return"]["mean"] - B["mean_return"]["mean"],
                     "mean_p": permutation_test(A["means"], B["means"]) if two else None,
                     "sps_ratio": A["sps"]["mean"] / B["sps"]["mean"],
                     "train_sps_ratio": (A["train_sps"]["mean"] / B["train_sps"]["mean"]
                                         if A["train_sps"]["mean"] and B["train_sps"]["mean"] else None),
                     "peak_rss_ratio": A["peak_rss_bytes"]["mean"] / B["peak_rss_bytes"]["mean"]})
    return rows


# ---------------------------------------------------------------------------------------------
# Report (from results.json alone: --render redoes it without running anything)
# ---------------------------------------------------------------------------------------------
def plot(agg, total, study: str, out_dir: str) -> list[str]:
    """The learning curves and the speed figure, declared with the generic kinds of _plots."""
    reference, vs = STUDIES[study]["reference"], list(agg)
    # AoS and SoA runs coincide (same batches): draw AoS dashed so both stay visible
    curves = {f"{v} ({a['final_return']['n']} seeds)":
              (a["curve_mean"], a["curve_std"], dict(lw=1.6 if v in (EDGE, reference) else 1.0,
                                                     ls="--" if v == SAME_BUFFER else "-"), {}) for v, a in agg.items()}
    sps = partial(hbar_values, labels=vs, values=[agg[v]["sps"]["mean"] for v in vs],
                  xerr=[agg[v]["sps"]["std"] for v in vs], xlabel="steps per second (whole run)")
    if study == "buffers":  # steps/s, where the time goes, peak memory
        speed = [partial(sps, color=["tab:green" if v == EDGE else "tab:blue" for v in vs]),
                 partial(hbar_stack, labels=vs, xlabel="µs per environment step, by section", legend=dict(fontsize=7),
                         parts={k: [agg[v]["sections_share"][k]["mean"] * 1e6 / agg[v]["sps"]["mean"] for v in vs]
                                for k in SECTIONS}, tick_labels=False),
                 partial(hbar_values, labels=vs, values=[agg[v]["peak_rss_bytes"]["mean"] / 2**20 for v in vs],
                         color=["tab:green" if v == EDGE else "tab:gray" for v in vs],
                         xlabel="peak RSS of the process (MiB)", tick_labels=False)]
    else:  # steps/s, final return
        speed = [sps, partial(hbar_values, labels=vs, values=[agg[v]["final_return"]["mean"] for v in vs],
                              xerr=[agg[v]["final_return"]["std"] for v in vs], color="tab:green", tick_labels=False,
                              xlabel=f"final return (last {LAST_EPISODES} episodes)")]
    title = (f"DQN on {ENV_ID}, CleanRL hyperparameters" if study == "buffers" else
             f"DQN on {ENV_ID}: replay ratio by limiter, exactly-k replay")
    return [panels_figure(out_dir, "learning.png", (8, 4.5),
                          [partial(learning_curves, x=return_curve([], total, CURVE_BINS)[0], curves=curves, title=title)]),
            panels_figure(out_dir, "speed.png", (13, 4.2) if study == "buffers" else (11, 4), speed)]


def _ratio(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def comparisons_table(comps, wide: bool) -> list[str]:
    """Every comparison of two variants: learning (permutation tests), speed, and with ``wide``
    the training-phase speed and peak memory."""
    head = ["variant", "against", "final return diff", "p", "mean return diff", "p", "steps/s ratio"]
    rows = [[c["variant"], c["against"], f"{c['final_diff']:+.1f}", _p(c["final_p"]), f"{c['mean_diff']:+.1f}",
             _p(c["mean_p"]), f"{c['sps_ratio']:.2f}"]
            + ([_ratio(c.get("train_sps_ratio")), f"{c['peak_rss_ratio']:.2f}"] if wide else []) for c in comps]
    return md_table(head + (["training steps/s ratio", "peak RSS ratio"] if wide else []), rows,
                    "ll" + "r" * (len(head) - 2 + 2 * wide)) + [""]


def report_buffers(res: dict, agg: dict, pngs: list) -> list[str]:
    """The buffers study's report, from its results.json."""
    run, comps = res["methodology"], res["comparisons"]
    n_seeds = max(a["final_return"]["n"] for a in agg.values())
    L = [f"# DQN on {ENV_ID}: tfdata inside a real training loop\n",
         f"Made by `experiments/dqn_cartpole.py` ({run['mode']} run, command `{run['command']}`, {n_seeds} "
         f"seed(s) per variant, {run['parameters']['total_steps']:,} environment steps each, "
         f"{run['wall_clock_s']:.0f} s in all). Raw numbers and every episode: `results.json`.\n"]
    hl = headline(agg, comps)
    if hl:
        L.append(f"<!-- headline: {hl} -->\n")
    L += hand_written(OUT_DIRS["buffers"], "findings")
    same = res.get("same_episodes_aos_soa")
    if same:
        L.append(f"AoS and SoA runs with the same seed produced identical episodes in {sum(same.values())} of "
                 f"{len(same)} seeds.\n")
    c = next((r for r in comps if r["variant"] == EDGE and r["against"] == SAME_BUFFER), None)
    if c:
        goals = [("learning equal within seed noise (no significant difference, α = 0.05)",
                  None if c["final_p"] is None else c["final_p"] >= 0.05 and (c["mean_p"] or 0) >= 0.05,
                  f"final p = {_p(c['final_p'])}, whole-run p = {_p(c['mean_p'])}"),
                 ("at least 5x the steps per second", c["sps_ratio"] >= 5.0,
                  f"{c['sps_ratio']:.2f}x (training phase {_ratio(c['train_sps_ratio'])}x)"),
                 ("at most half the peak memory", c["peak_rss_ratio"] <= 0.5, f"{c['peak_rss_ratio']:.2f}x")]
        L.append("## Goals of the edge loop (against torch with the same buffer)\n")
        L += md_table(["goal", "met?", "measured"],
                      [[g, "n/a" if ok is None else "yes" if ok else "**no**", m] for g, ok, m in goals], "lll")
        L.append("")
    L += hand_written(OUT_DIRS["buffers"], "variants")
    L += [f"![{p}]({p})\n" for p in pngs]
    L.append("## Every variant (mean ± std over seeds)\n")
    L += md_table(["variant", "final return", "mean return", "steps/s", "steps/s training", "wall (s)",
                   "training wall (s)", "buffer share", "Amdahl bound", "add (µs)", "sample (µs)", "update (µs)",
                   "peak RSS (MiB)", "buffer (KiB)"],
                  [[v, _pm(a["final_return"], "{:.1f}"), _pm(a["mean_return"], "{:.1f}"), _pm(a["sps"]),
                    _pm(a["train_sps"]), _pm(a["wall_s"], "{:.1f}"), _pm(a["train_wall_s"], "{:.1f}"),
                    _pm(a["buffer_share"], "{:.1f}", 100) + "%", f"{a['amdahl_bound']['mean']:.3f}",
                    _pm(a["buffer_add_us"], "{:.1f}"), _pm(a["buffer_sample_us"], "{:.1f}"), _pm(a["update_us"]),
                    _pm(a["peak_rss_bytes"], "{:.0f}", 2**-20), f"{a['buffer_nbytes']['mean'] / 1024:.0f}"]
                   for v, a in agg.items()], "l" + "r" * 13)
    L.append("")
    L.append("Where the time goes (share of the loop's wall clock, mean over seeds):\n")
    L += md_table(["variant", *SECTIONS], [[v, *(f"{100 * a['sections_share'][k]['mean']:.1f}%" for k in SECTIONS)]
                                           for v, a in agg.items()], "l" + "r" * len(SECTIONS))
    L.append("")
    L.append("## Comparisons\n")
    L += comparisons_table(comps, wide=True)
    L += hand_written(OUT_DIRS["buffers"], "method")
    return L


def headline(agg, comps) -> str | None:
    c = next((r for r in comps if r["variant"] == EDGE and r["against"] == SAME_BUFFER), None)
    ref = agg.get(STUDIES["buffers"]["reference"])
    if c is None or ref is None:
        return None
    return (f"buffer share of the torch loop {100 * ref['buffer_share']['mean']:.1f}% (Amdahl bound "
            f"{ref['amdahl_bound']['mean']:.2f}x); edge loop without torch: {c['sps_ratio']:.1f}x steps/s, "
            f"{c['peak_rss_ratio']:.2f}x peak memory, final return {agg[EDGE]['final_return']['mean']:.0f} vs "
            f"{agg[SAME_BUFFER]['final_return']['mean']:.0f}")


def report_ratio(res: dict, agg: dict, pngs: list) -> list[str]:
    """The replay-ratio study's report, from its results.json."""
    run = res["methodology"]
    n_seeds = max(a["final_return"]["n"] for a in agg.values())
    L = [f"# Replay ratio on DQN / {ENV_ID}: a rate limiter, exactly-k replay\n",
         f"Made by `{run['command']}` ({run['mode']} run, {n_seeds} seed(s) per variant, "
         f"{run['parameters']['total_steps']:,} environment steps each, learning from step "
         f"{run['parameters']['learning_starts']:,}, {run['wall_clock_s']:.0f} s in all). Raw numbers and every "
         "episode: `results.json`.\n"]
    for e in run.get("earlier_runs", []):
        L.append(f"Runs of other variants come from an earlier run, kept as they were (`--add`): command "
                 f"`{e['command']}`, started {e['started_utc']}, tfdata commit "
                 f"{(e['environment']['software']['git']['commit'] or '?')[:12]}, load average "
                 f"{e['load_average_start']} / {e['load_average_end']}.\n")
    L += hand_written(OUT_DIRS["replay_ratio"], "findings")
    L.append("## Comparisons\n")
    L += comparisons_table(res["comparisons"], wide=False)
    L.append("## Results (mean ± std over seeds)\n")
    L += md_table(["variant", "final return", "mean return", "replay ratio measured", "updates", "steps/s",
                   "wall (s)", "peak RSS (MiB)"],
                  [[v, _pm(a["final_return"]), _pm(a["mean_return"], "{:.1f}"), _pm(a["replay_ratio"], "{:.2f}"),
                    _pm(a["updates"]), _pm(a["sps"]), _pm(a["wall_s"], "{:.1f}"),
                    f"{a['peak_rss_bytes']['mean'] / 2**20:.0f}"] for v, a in agg.items()], "l" + "r" * 7)
    L.append("")
    L.append("Time per environment step by section (µs, summed over threads: in the two-thread variants "
             "sections overlap, so they add up to more than the wall clock):\n")
    secs = list(dict.fromkeys(k for a in agg.values() for k in a["sections_us"]))
    L += md_table(["variant", *secs], [[v, *(f"{a['sections_us'][k]['mean']:.1f}" if k in a["sections_us"] else ""
                                             for k in secs)] for v, a in agg.items()], "l" + "r" * len(secs))
    L.append("")
    L += [f"![learning curves]({pngs[0]})\n", f"![speed and final return]({pngs[1]})\n"]
    L += hand_written(OUT_DIRS["replay_ratio"], "method")
    return L


def render(res: dict) -> list[str]:
    """README.md and the plots of a study from its results.json; returns the plots' names."""
    study = STUDY_OF[res["methodology"]["experiment"]]
    out_dir = OUT_DIRS[study]
    os.makedirs(out_dir, exist_ok=True)
    agg = {v: {**a, "curve_mean": res["curves"][v]["mean"], "curve_std": res["curves"][v]["std"]}
           for v, a in res["summary"].items()}
    pngs = plot(agg, res["methodology"]["parameters"]["total_steps"], study, out_dir)
    lines = (report_buffers if study == "buffers" else report_ratio)(res, agg, pngs)
    write_methodology_report(out_dir, lines, res["methodology"])
    return pngs


def publish(study, runs, run, versions, variants, total) -> dict:
    """results.json from the raw runs, then the report from it."""
    agg = summarise(runs, variants, total)
    res = {"methodology": run, "study": study, "versions": versions,
           "summary": {v: {k: x for k, x in a.items() if k not in ("curve_mean", "curve_std")} for v, a in agg.items()},
           "curves": {v: {"mean": a["curve_mean"], "std": a["curve_std"]} for v, a in agg.items()},
           "comparisons": comparisons(agg, STUDIES[study]),
           "same_episodes_aos_soa": layouts_identical(runs), "runs": runs}
    path = os.path.join(OUT_DIRS[study], "results.json")
    write_json(path, res)
    with open(path, encoding="utf-8") as f:
        render(json.load(f))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--study", choices=list(STUDIES), default="buffers",
                    help="buffers (reports/dqn) or replay_ratio (reports/replay_ratio)")
    ap.add_argument("--quick", action="store_true", help="1 seed, 30k steps (about a minute)")
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
    if args.render:
        with open(args.render, encoding="utf-8") as f:
            render(json.load(f))
        return
    study = STUDIES[args.study]
    mode = "quick" if args.quick else "full"
    total = args.steps or STEPS[mode]
    learning_starts = args.learning_starts if args.learning_starts is not None else study["learning_starts"][mode]
    if args.worker:
        r = run_worker(args.worker, args.seed, total, learning_starts)
        print("RESULT " + json.dumps(r), flush=True)
        return
    variants = args.variants or study["variants"]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    seeds = args.seeds if args.seeds is not None else SEEDS[mode]
    out_dir = OUT_DIRS[args.study]
    os.makedirs(out_dir, exist_ok=True)
    command = "python experiments/dqn_cartpole.py " + " ".join(sys.argv[1:])
    rec = RunRecord(study["report"], mode=mode, seeds=seeds, command=command.strip(),
                    parameters={"hyperparameters": HP, "env": ENV_ID, "total_steps": total,
                                "learning_starts": learning_starts, "variants": variants, "per": PER,
                                "n_step": N_STEP, "error_batches": ERROR_BATCHES, "wait_s": WAIT_S})
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
        variants = [v for v in study["variants"] if any(r["variant"] == v for r in runs)]
    versions = {}
    for r in runs:
        versions.update(r["versions"])
    publish(args.study, runs, run, versions, variants, total)
    print(f"{mode} run {rec.run_name} done in {run['wall_clock_s']:.0f} s; report: "
          f"{os.path.relpath(out_dir)}/README.md", flush=True)


if __name__ == "__main__":
    main()
