"""PPO on CartPole-v1: can tfdata's on-policy data layer and a torch-free PPO train CleanRL's PPO
as well as CleanRL does, faster and in less memory?

Loops with CleanRL's ``ppo.py`` algorithm, hyperparameters and time-limit semantics (a truncated
episode ends the return as a failure does: no bootstrap), the same environments:

* ``torch``: a faithful port of CleanRL's loop: torch tensors of shape (num_steps, num_envs) for
  storage, GAE as a Python loop over time, ``torch.distributions.Categorical``, the clipped policy
  and value losses, ``clip_grad_norm_`` and Adam with a linearly annealed learning rate.
* ``torch_tfdata``: the same torch agent and update, but storage, GAE and the shuffled minibatches
  come from ``tfdata.RolloutBuffer`` (its batches reach torch through ``torch.from_numpy``). The
  buffer stores ``terminated`` and ``truncated`` and no ``final_value``, so its GAE cuts at both
  without a bootstrap, exactly as CleanRL's loop over ``done = terminated | truncated``.
* ``edge``: ``tfdata.nn.PPO`` (numba kernels: forward, sampling, loss, backward, Adam) over the
  same ``RolloutBuffer`` with the same semantics; its process never imports torch (checked).

Targets: the edge loop and the torch loop over tfdata's buffer learn as CleanRL's loop does (no
significant difference in final and whole-run mean return over 5 seeds); the edge loop runs at
least 3x CleanRL's steps per second in at most half its peak memory.

A separate, optional improvement, measured apart from the targets: ``edge_bootstrap`` is
``edge`` whose buffer also stores ``final_value``, the critic's value of ``info["final_obs"]``
where an episode was truncated, so GAE bootstraps through the time limit.
``torch_tfdata_bootstrap`` (not run by default) does the same in the torch loop over tfdata's
buffer.

Every (variant, seed) runs in a fresh process (its own peak memory, no shared caches), variants
alternating seed by seed, with one thread for torch and OpenMP.

    python experiments/ppo_cartpole.py --quick   # 1 seed, 24,576 steps: about a minute
    python experiments/ppo_cartpole.py           # 5 seeds, 500k steps (CleanRL's run)

Needs gymnasium >= 1.1 (``AutoresetMode``) and torch 2.13.0 CPU (the ``ppo`` extra). Writes
``reports/ppo/`` (README.md, results.json, learning.png, speed.png). Only the public tfdata API.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from functools import partial

import numpy as np

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
from _plots import hbar_stack, hbar_values, learning_curves, panels_figure  # noqa: E402
from _recording import RunRecord, report_dir, write_json  # noqa: E402
from _render import hand_written, p_value as _p, pm as _pm, table, write_report as write_methodology_report  # noqa: E402
from _stats import permutation_test, return_curve, seed_curves, summary as _ms  # noqa: E402
from _timing import peak_rss_hwm as _peak_rss, rss_statm as _rss_now, run_in_fresh_processes  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "ppo"
ENV_ID = "CartPole-v1"
# CleanRL's ppo.py defaults (github.com/vwxyzjn/cleanrl, cleanrl/ppo.py, class Args): the
# configuration of its published CartPole-v1 runs.
HP = {
    "total_timesteps": 500_000,
    "learning_rate": 2.5e-4,
    "adam_eps": 1e-5,
    "num_envs": 4,
    "num_steps": 128,               # batch 512
    "anneal_lr": True,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "num_minibatches": 4,           # minibatch 128
    "update_epochs": 4,
    "norm_adv": True,
    "clip_coef": 0.2,
    "clip_vloss": True,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
    "target_kl": None,
    "hidden": (64, 64),             # separate actor and critic MLPs, tanh
}
VARIANTS = {
    # name: (learner, storage); "tfdata" has CleanRL's time-limit semantics (truncated stored, no
    # final_value), "tfdata-bootstrap" adds final_value (GAE bootstraps truncated episodes)
    "torch": ("torch", "torch"),
    "torch_tfdata": ("torch", "tfdata"),
    "edge": ("numba", "tfdata"),
    "edge_bootstrap": ("numba", "tfdata-bootstrap"),
    "torch_tfdata_bootstrap": ("torch", "tfdata-bootstrap"),   # on request (--variants)
}
DEFAULT_VARIANTS = ["torch", "torch_tfdata", "edge", "edge_bootstrap"]
COLORS = {"torch": "tab:blue", "torch_tfdata": "tab:orange", "edge": "tab:green",
          "edge_bootstrap": "tab:red", "torch_tfdata_bootstrap": "tab:purple"}
REFERENCE = "torch"
TWIN = "torch_tfdata"               # the torch loop on the same data layer as the edge loop
EDGE = "edge"
EDGE_BOOTSTRAP = "edge_bootstrap"
TWIN_BOOTSTRAP = "torch_tfdata_bootstrap"
# the targets' learning comparisons: same semantics as CleanRL's loop
LEARNING_TARGETS = [(EDGE, REFERENCE), (TWIN, REFERENCE)]
# the time-limit bootstrap's effect: same loop with and without it
BOOTSTRAP_PAIRS = [(EDGE_BOOTSTRAP, EDGE), (TWIN_BOOTSTRAP, TWIN)]
SEEDS = {"full": [0, 1, 2, 3, 4], "quick": [0]}
STEPS = {"full": HP["total_timesteps"], "quick": 48 * 512}
TARGETS = {"sps_ratio": 3.0, "peak_rss_ratio": 0.5, "alpha": 0.05}
LAST_EPISODES = 100                 # final return = mean of the last 100 episodes
CURVE_BINS = 50
BARE_ENV_STEPS = 2_000              # vector steps of the bare env.step loop (per run)
TIMEOUT_S = 3600
OUT_DIR = report_dir(EXPERIMENT)
SECTIONS = ("env", "act", "buffer_add", "gae", "minibatch", "update", "other")
SECTION_HELP = {
    "env": "`envs.step` of the 4 environments (autoreset included)",
    "act": "policy forward and action sampling (and the critic's value of `final_obs` at truncations)",
    "buffer_add": "storing the step (tensor conversions in the torch loop, `RolloutBuffer.add`)",
    "gae": "the last value and GAE (a Python loop over 128 steps in torch, one compiled call in tfdata)",
    "minibatch": "permutation and gather of a minibatch (indexing in torch, `RolloutBuffer.minibatches`)",
    "update": "loss, backward, gradient clipping, Adam, learning-rate annealing",
    "other": "the rest of the loop (episode statistics, loop control)",
}


# ---------------------------------------------------------------------------------------------
# The environments (identical in every variant)
# ---------------------------------------------------------------------------------------------
def make_envs(gym, num_envs: int):
    """CleanRL's vector env: ``RecordEpisodeStatistics`` around each CartPole-v1, stepped in
    turn, reset in the same step (``SAME_STEP``, gymnasium 0.29's behaviour, which CleanRL's
    loop was written for: the observation of a finished episode is ``info["final_obs"]``)."""
    def thunk():
        return gym.wrappers.RecordEpisodeStatistics(gym.make(ENV_ID))

    return gym.vector.SyncVectorEnv([thunk for _ in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def finished_episodes(info) -> list:
    """(env index, return, length) of the episodes that ended in this vector step."""
    fi = info.get("final_info")
    if not fi or "_episode" not in fi:
        return []
    ep = fi["episode"]
    return [(int(e), float(ep["r"][e]), int(ep["l"][e])) for e in np.flatnonzero(fi["_episode"])]


def bare_env_us(gym, num_envs: int, seed: int, n: int) -> float:
    """µs per vector step of a loop that only steps the environments (fixed random actions):
    the floor of any loop over these environments."""
    envs = make_envs(gym, num_envs)
    envs.reset(seed=seed + 7_919)
    actions = np.random.default_rng(seed).integers(0, 2, size=(n, num_envs))
    step = envs.step
    for k in range(min(n, 100)):  # warm-up
        step(actions[k])
    t0 = time.perf_counter_ns()
    for k in range(n):
        step(actions[k])
    dt = time.perf_counter_ns() - t0
    envs.close()
    return dt / n / 1e3


# ---------------------------------------------------------------------------------------------
# Learners (runs in a worker process)
# ---------------------------------------------------------------------------------------------
def torch_agent(obs_size: int, n_actions: int, hidden=(64, 64)):
    """CleanRL's ``Agent``: critic and actor MLPs obs-64-64-out with tanh, orthogonal weights
    (sqrt(2) hidden, 1.0 critic head, 0.01 actor head), zero biases; the critic is built first,
    as in CleanRL, so the same torch seed gives the same weights."""
    import torch
    from torch import nn
    from torch.distributions.categorical import Categorical

    def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
        torch.nn.init.orthogonal_(layer.weight, std)
        torch.nn.init.constant_(layer.bias, bias_const)
        return layer

    h1, h2 = hidden

    class Agent(nn.Module):
        def __init__(self):
            super().__init__()
            self.critic = nn.Sequential(layer_init(nn.Linear(obs_size, h1)), nn.Tanh(),
                                        layer_init(nn.Linear(h1, h2)), nn.Tanh(),
                                        layer_init(nn.Linear(h2, 1), std=1.0))
            self.actor = nn.Sequential(layer_init(nn.Linear(obs_size, h1)), nn.Tanh(),
                                       layer_init(nn.Linear(h1, h2)), nn.Tanh(),
                                       layer_init(nn.Linear(h2, n_actions), std=0.01))

        def get_value(self, x):
            return self.critic(x)

        def get_action_and_value(self, x, action=None):
            logits = self.actor(x)
            probs = Categorical(logits=logits)
            if action is None:
                action = probs.sample()
            return action, probs.log_prob(action), probs.entropy(), self.critic(x)

    return Agent()


def torch_update(agent, optimizer, hp, mb_obs, mb_actions, mb_logprobs, mb_advantages, mb_returns, mb_values):
    """One CleanRL minibatch step: clipped surrogate, clipped value loss, entropy bonus, backward,
    global gradient-norm clip over both networks, Adam. Returns CleanRL's logged statistics."""
    import torch
    from torch import nn

    _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb_obs, mb_actions.long())
    logratio = newlogprob - mb_logprobs
    ratio = logratio.exp()
    with torch.no_grad():
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > hp["clip_coef"]).float().mean().item()
    if hp["norm_adv"]:
        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
    pg_loss1 = -mb_advantages * ratio
    pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - hp["clip_coef"], 1 + hp["clip_coef"])
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()
    newvalue = newvalue.view(-1)
    if hp["clip_vloss"]:
        v_loss_unclipped = (newvalue - mb_returns) ** 2
        v_clipped = mb_values + torch.clamp(newvalue - mb_values, -hp["clip_coef"], hp["clip_coef"])
        v_loss_clipped = (v_clipped - mb_returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - mb_returns) ** 2).mean()
    entropy_loss = entropy.mean()
    loss = pg_loss - hp["ent_coef"] * entropy_loss + v_loss * hp["vf_coef"]
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(agent.parameters(), hp["max_grad_norm"])
    optimizer.step()
    return {"approx_kl": float(approx_kl), "old_approx_kl": float(old_approx_kl), "clipfrac": clipfrac}


class TorchLearner:
    """The torch agent behind the numpy interface of ``tfdata.nn.PPO`` (act, value, lr, train),
    for the loop over tfdata's buffer."""

    def __init__(self, obs_size, n_actions, hp, seed):
        import torch

        torch.set_num_threads(1)
        torch.manual_seed(seed)
        self.torch, self.hp = torch, hp
        self.agent = torch_agent(obs_size, n_actions, hp["hidden"])
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=hp["learning_rate"], eps=hp["adam_eps"])
        self.stats = {}

    @property
    def lr(self):
        return self.optimizer.param_groups[0]["lr"]

    @lr.setter
    def lr(self, value):
        self.optimizer.param_groups[0]["lr"] = value

    def act(self, obs):
        with self.torch.no_grad():
            action, logprob, _, value = self.agent.get_action_and_value(self.torch.from_numpy(obs))
        return action.numpy(), logprob.numpy(), value.view(-1).numpy()

    def value(self, obs):
        with self.torch.no_grad():
            return self.agent.get_value(self.torch.from_numpy(obs)).view(-1).numpy()

    def train(self, mb):
        f = self.torch.from_numpy
        self.stats = torch_update(self.agent, self.optimizer, self.hp, f(mb["obs"]), f(mb["action"]),
                                  f(mb["log_prob"]), f(mb["advantage"]), f(mb["return"]), f(mb["value"]))


def edge_learner(tfdata, obs_size, n_actions, hp, seed):
    """``tfdata.nn.PPO`` with CleanRL's hyperparameters (numba kernels, no torch)."""
    return tfdata.nn.PPO(obs_size=obs_size, n_actions=n_actions, hidden=hp["hidden"], lr=hp["learning_rate"],
                         eps=hp["adam_eps"], clip_coef=hp["clip_coef"], clip_vloss=hp["clip_vloss"],
                         ent_coef=hp["ent_coef"], vf_coef=hp["vf_coef"], max_grad_norm=hp["max_grad_norm"],
                         norm_adv=hp["norm_adv"], seed=seed)


def rollout_spec(tfdata, obs_size: int, bootstrap: bool):
    """The rollout rows: what CleanRL stores, plus both gymnasium flags and, with ``bootstrap``,
    the critic's value of ``info["final_obs"]`` for truncated episodes."""
    fields = {"obs": ("f4", (obs_size,)), "action": "i8", "log_prob": "f4", "value": "f4", "reward": "f4",
              "terminated": "?", "truncated": "?"}
    if bootstrap:
        fields["final_value"] = "f4"
    return tfdata.Spec(fields)


# ---------------------------------------------------------------------------------------------
# The measured loops (run in a worker process)
# ---------------------------------------------------------------------------------------------
def cleanrl_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """CleanRL's GAE loop, verbatim in its logic (torch tensors of shape (num_steps, num_envs);
    ``dones[t]`` is the flag of the observation at t, ``next_done`` of the one after the last)."""
    import torch

    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages, advantages + values


class Clock:
    """Per-section time of the loop (``perf_counter_ns`` deltas, summed)."""

    def __init__(self):
        self.ns = dict.fromkeys(SECTIONS, 0)


def loop_cleanrl(envs, hp, seed, total, clock, episodes):
    """CleanRL's ppo.py loop on torch tensors. Returns the number of iterations."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    np.random.seed(seed)  # CleanRL shuffles minibatch indices with numpy's global generator
    obs_shape = envs.single_observation_space.shape
    T, E = hp["num_steps"], hp["num_envs"]
    batch_size, minibatch_size = T * E, T * E // hp["num_minibatches"]
    num_iterations = total // batch_size
    agent = torch_agent(obs_shape[0], int(envs.single_action_space.n), hp["hidden"])
    optimizer = torch.optim.Adam(agent.parameters(), lr=hp["learning_rate"], eps=hp["adam_eps"])
    obs = torch.zeros((T, E) + obs_shape)
    actions = torch.zeros((T, E))
    logprobs = torch.zeros((T, E))
    rewards = torch.zeros((T, E))
    dones = torch.zeros((T, E))
    values = torch.zeros((T, E))
    pc, ns = time.perf_counter_ns, clock.ns
    global_step = 0
    next_obs, _ = envs.reset(seed=seed)
    next_obs = torch.Tensor(next_obs)
    next_done = torch.zeros(E)
    for iteration in range(1, num_iterations + 1):
        t0 = pc()
        if hp["anneal_lr"]:
            optimizer.param_groups[0]["lr"] = (1.0 - (iteration - 1.0) / num_iterations) * hp["learning_rate"]
        ns["update"] += pc() - t0
        for step in range(T):
            global_step += E
            t0 = pc()
            obs[step] = next_obs
            dones[step] = next_done
            t1 = pc()
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            a = action.cpu().numpy()
            t2 = pc()
            values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob
            t3 = pc()
            next_obs, reward, terminations, truncations, infos = envs.step(a)
            t4 = pc()
            next_done = np.logical_or(terminations, truncations)
            rewards[step] = torch.tensor(reward).view(-1)
            next_obs, next_done = torch.Tensor(next_obs), torch.Tensor(next_done)
            t5 = pc()
            ns["buffer_add"] += (t1 - t0) + (t3 - t2) + (t5 - t4)
            ns["act"] += t2 - t1
            ns["env"] += t4 - t3
            for _, r, length in finished_episodes(infos):
                episodes.append((global_step, r, length))
        t0 = pc()
        with torch.no_grad():
            next_value = agent.get_value(next_obs).reshape(1, -1)
            advantages, returns = cleanrl_gae(rewards, values, dones, next_value, next_done,
                                              hp["gamma"], hp["gae_lambda"])
        b_obs = obs.reshape((-1,) + obs_shape)
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)
        b_inds = np.arange(batch_size)
        ns["gae"] += pc() - t0
        for epoch in range(hp["update_epochs"]):
            t0 = pc()
            np.random.shuffle(b_inds)
            ns["minibatch"] += pc() - t0
            for start in range(0, batch_size, minibatch_size):
                t0 = pc()
                mb_inds = b_inds[start:start + minibatch_size]
                mb = (b_obs[mb_inds], b_actions[mb_inds], b_logprobs[mb_inds], b_advantages[mb_inds],
                      b_returns[mb_inds], b_values[mb_inds])
                t1 = pc()
                torch_update(agent, optimizer, hp, *mb)
                ns["minibatch"] += t1 - t0
                ns["update"] += pc() - t1
    return num_iterations


def loop_tfdata(envs, hp, seed, total, clock, episodes, learner, buf, bootstrap):
    """The same loop over ``tfdata.RolloutBuffer``: ``learner`` is a :class:`TorchLearner` or a
    ``tfdata.nn.PPO`` (same interface). Without ``bootstrap`` (the buffer has no ``final_value``)
    GAE cuts at terminated and truncated alike, as CleanRL's loop; with it, ``final_value`` = the
    critic's value of ``info["final_obs"]`` where truncated. Returns the number of iterations."""
    T, E = hp["num_steps"], hp["num_envs"]
    num_iterations = total // (T * E)
    final_value = np.zeros(E, np.float32)
    pc, ns = time.perf_counter_ns, clock.ns
    act, value_of, add, step_envs = learner.act, learner.value, buf.add, envs.step
    global_step = 0
    next_obs, _ = envs.reset(seed=seed)
    next_done = np.zeros(E, bool)
    for iteration in range(1, num_iterations + 1):
        t0 = pc()
        if hp["anneal_lr"]:
            learner.lr = (1.0 - (iteration - 1.0) / num_iterations) * hp["learning_rate"]
        ns["update"] += pc() - t0
        for step in range(T):
            global_step += E
            t0 = pc()
            actions, log_probs, values = act(next_obs)
            t1 = pc()
            obs = next_obs
            next_obs, reward, terminated, truncated, infos = step_envs(actions)
            t2 = pc()
            if bootstrap and truncated.any():
                # value() has its own output: act's outputs (views) stay as they are
                final_obs = next_obs.copy()  # a full (E, obs) batch; final_value is read only where truncated
                for e in np.flatnonzero(truncated):
                    final_obs[e] = infos["final_obs"][e]
                final_value[:] = value_of(final_obs)
            t3 = pc()
            row = {"obs": obs, "action": actions, "log_prob": log_probs, "value": values,
                   "reward": reward, "terminated": terminated, "truncated": truncated}
            if bootstrap:
                row["final_value"] = final_value
            add(row)
            next_done = terminated | truncated
            t4 = pc()
            ns["act"] += (t1 - t0) + (t3 - t2)
            ns["env"] += t2 - t1
            ns["buffer_add"] += t4 - t3
            for _, r, length in finished_episodes(infos):
                episodes.append((global_step, r, length))
        t0 = pc()
        buf.compute_returns_and_advantages(value_of(next_obs), next_done, gamma=hp["gamma"],
                                           gae_lambda=hp["gae_lambda"])
        ns["gae"] += pc() - t0
        # permutations continue the buffer's own seeded stream, rollout after rollout
        batches = iter(buf.minibatches(hp["num_minibatches"], epochs=hp["update_epochs"]))
        while True:
            t0 = pc()
            mb = next(batches, None)
            t1 = pc()
            ns["minibatch"] += t1 - t0
            if mb is None:
                break
            learner.train(mb)
            ns["update"] += pc() - t1
        buf.reset()
    return num_iterations


def warm_up(tfdata, hp, learner, buf, obs_size, bootstrap):
    """Run every call of the loop once on a throwaway learner and buffer of the same types
    (numba kernels loaded or compiled, torch's first-call allocations), before the clock."""
    T, E = hp["num_steps"], hp["num_envs"]
    rng = np.random.default_rng(0)
    for t in range(T):
        o = rng.standard_normal((E, obs_size)).astype(np.float32)
        a, lp, v = learner.act(o)
        row = {"obs": o, "action": a, "log_prob": lp, "value": v, "reward": np.ones(E),
               "terminated": np.arange(E) == t % E, "truncated": np.zeros(E, bool)}
        if bootstrap:
            row["final_value"] = learner.value(o).copy()
        buf.add(row)
    buf.compute_returns_and_advantages(learner.value(o), row["terminated"], gamma=hp["gamma"],
                                       gae_lambda=hp["gae_lambda"])
    for mb in buf.minibatches(hp["num_minibatches"], epochs=1, seed=0):
        learner.train(mb)
    buf.reset()


def warm_up_torch(hp, obs_size, n_actions):
    """The torch loop's calls once on a throwaway agent (torch's first-call allocations), before
    the clock; the run's own agent is built afterwards from the run's seed."""
    import torch

    agent = torch_agent(obs_size, n_actions, hp["hidden"])
    opt = torch.optim.Adam(agent.parameters(), lr=hp["learning_rate"], eps=hp["adam_eps"])
    n = hp["num_steps"] * hp["num_envs"] // hp["num_minibatches"]
    with torch.no_grad():
        agent.get_action_and_value(torch.zeros(hp["num_envs"], obs_size))
    torch_update(agent, opt, hp, torch.randn(n, obs_size), torch.zeros(n), torch.full((n,), -0.69),
                 torch.randn(n), torch.randn(n), torch.randn(n))


def run_worker(variant: str, seed: int, total: int) -> dict:
    t_start = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    learner_kind, storage = VARIANTS[variant]
    hp = dict(HP, total_timesteps=total)
    import gymnasium as gym

    versions = {"gymnasium": gym.__version__, "numpy": np.__version__}
    E = hp["num_envs"]
    bare_us = bare_env_us(gym, E, seed, BARE_ENV_STEPS)
    envs = make_envs(gym, E)
    obs_size = envs.single_observation_space.shape[0]
    n_actions = int(envs.single_action_space.n)
    bootstrap = storage == "tfdata-bootstrap"  # else CleanRL's semantics
    clock, episodes = Clock(), []
    buf = None
    if storage == "torch":  # CleanRL's loop: no tfdata in the process
        import torch

        versions["torch"] = torch.__version__
        torch.set_num_threads(1)
        warm_up_torch(hp, obs_size, n_actions)
        rss_ready = _rss_now()
        setup_s = time.perf_counter() - t_start
        t_loop = time.perf_counter_ns()
        iterations = loop_cleanrl(envs, hp, seed, total, clock, episodes)
    else:
        import tfdata

        versions["tfdata"] = tfdata.__version__
        spec = rollout_spec(tfdata, obs_size, bootstrap)

        def build(s):
            if learner_kind == "torch":
                lrn = TorchLearner(obs_size, n_actions, hp, s)
            else:
                lrn = edge_learner(tfdata, obs_size, n_actions, hp, s)
            return lrn, tfdata.RolloutBuffer(spec, num_steps=hp["num_steps"], num_envs=E, layout="aos", seed=s)

        warm_up(tfdata, hp, *build(seed + 10_000), obs_size, bootstrap)
        learner, buf = build(seed)
        if learner_kind == "torch":
            versions["torch"] = sys.modules["torch"].__version__
        rss_ready = _rss_now()
        setup_s = time.perf_counter() - t_start
        t_loop = time.perf_counter_ns()
        iterations = loop_tfdata(envs, hp, seed, total, clock, episodes, learner, buf, bootstrap)
    wall = (time.perf_counter_ns() - t_loop) / 1e9
    envs.close()
    secs = {k: v / 1e9 for k, v in clock.ns.items()}
    secs["other"] = max(0.0, wall - sum(secs[k] for k in SECTIONS if k != "other"))
    steps = iterations * hp["num_steps"] * E
    torch_imported = "torch" in sys.modules
    if learner_kind == "numba":
        assert not torch_imported, "the edge loop imported torch"
    return {
        "variant": variant, "seed": seed, "bootstrap": bootstrap, "total_steps": total, "steps": steps, "iterations": iterations,
        "episodes": episodes,
        "final_return": float(np.mean([e[1] for e in episodes[-LAST_EPISODES:]])) if episodes else None,
        "mean_return": float(np.mean([e[1] for e in episodes])) if episodes else None,
        "wall_s": wall, "setup_s": setup_s, "sps": steps / wall, "sections_s": secs,
        "bare_env_us_per_vector_step": bare_us, "bare_env_sps": E / bare_us * 1e6,
        "peak_rss_bytes": _peak_rss(),
        # getrusage's figure, for the record: a child started by vfork + exec (subprocess) starts
        # from its parent's peak, so it cannot go below the driver's (about 110 MiB here)
        "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_ready_bytes": rss_ready, "rss_end_bytes": _rss_now(),
        "buffer_nbytes": int(buf.nbytes) if buf is not None else None,
        "torch_imported": torch_imported, "numba_imported": "numba" in sys.modules,
        "versions": versions, "load_start": load_start, "load_end": [round(x, 2) for x in os.getloadavg()],
    }


# ---------------------------------------------------------------------------------------------
# Driver and analysis
# ---------------------------------------------------------------------------------------------
def run_all(variants, seeds, total, log) -> list[dict]:
    def describe(r):
        return (f"final return {r['final_return']:.1f}, mean {r['mean_return']:.1f}, {r['sps']:.0f} steps/s, "
                f"peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB")

    return run_in_fresh_processes(__file__, list(variants), seeds, ["--steps", str(total)],
                                  timeout_s=TIMEOUT_S, describe=describe, log=log)


def summarise(runs, variants, total) -> dict:
    out = {}
    for v in variants:
        rs = [r for r in runs if r["variant"] == v]
        if not rs:
            continue
        curve_mean, curve_std = seed_curves([r["episodes"] for r in rs], total, CURVE_BINS)
        out[v] = {
            "final_return": _ms(r["final_return"] for r in rs),
            "mean_return": _ms(r["mean_return"] for r in rs),
            "sps": _ms(r["sps"] for r in rs),
            "wall_s": _ms(r["wall_s"] for r in rs),
            "setup_s": _ms(r["setup_s"] for r in rs),
            "sections_share": {k: _ms(r["sections_s"][k] / r["wall_s"] for r in rs) for k in SECTIONS},
            # µs per environment step (one transition), by section
            "sections_us": {k: _ms(1e6 * r["sections_s"][k] / r["steps"] for r in rs) for k in SECTIONS},
            "bare_env_us_per_step": _ms(r["bare_env_us_per_vector_step"] / HP["num_envs"] for r in rs),
            "bare_env_sps": _ms(r["bare_env_sps"] for r in rs),
            "peak_rss_bytes": _ms(r["peak_rss_bytes"] for r in rs),
            "rss_ready_bytes": _ms(r["rss_ready_bytes"] for r in rs),
            "buffer_nbytes": _ms(r["buffer_nbytes"] for r in rs),
            "episodes": _ms(len(r["episodes"]) for r in rs),
            "torch_imported": any(r["torch_imported"] for r in rs),
            "curve_mean": curve_mean,
            "curve_std": curve_std,
            "seeds": [r["seed"] for r in rs],
            "sps_by_seed": {r["seed"]: r["sps"] for r in rs},
            "finals": [r["final_return"] for r in rs],
            "means": [r["mean_return"] for r in rs],
        }
    return out


def comparisons(agg) -> list[dict]:
    """Each variant against torch (same semantics: the targets; ``edge_bootstrap`` for its speed);
    the edge loop against its torch twin on the same data layer (the learner alone); each
    bootstrap variant against the same loop without it (the time-limit bootstrap alone)."""
    pairs = [(v, REFERENCE) for v in agg if v != REFERENCE and v != TWIN_BOOTSTRAP] + [(EDGE, TWIN)] \
        + BOOTSTRAP_PAIRS
    rows = []
    for a, b in pairs:
        if a not in agg or b not in agg:
            continue
        A, B = agg[a], agg[b]
        enough = len(A["finals"]) > 1 and len(B["finals"]) > 1
        rows.append({
            "variant": a, "against": b,
            "final_diff": A["final_return"]["mean"] - B["final_return"]["mean"],
            "final_p": permutation_test(A["finals"], B["finals"]) if enough else None,
            "mean_diff": A["mean_return"]["mean"] - B["mean_return"]["mean"],
            "mean_p": permutation_test(A["means"], B["means"]) if enough else None,
            "sps_ratio": A["sps"]["mean"] / B["sps"]["mean"],
            # the two runs of a seed ran back to back, under about the same load: their ratio
            "sps_ratio_per_seed": [A["sps_by_seed"][s] / B["sps_by_seed"][s] for s in A["seeds"] if s in B["sps_by_seed"]],
            "peak_rss_ratio": A["peak_rss_bytes"]["mean"] / B["peak_rss_bytes"]["mean"],
        })
    return rows


def goals(comps) -> list[tuple] | None:
    """The targets, all against CleanRL's torch loop: (goal, met or None, measured). Learning for
    the edge loop and for the torch loop over tfdata's buffer (both with CleanRL's semantics);
    speed and memory for the edge loop."""
    rows = []
    for v, ref in LEARNING_TARGETS:
        c = _cmp(comps, v, ref)
        if c is None:
            continue
        ps = [p for p in (c["final_p"], c["mean_p"]) if p is not None]
        rows.append((f"learning: `{v}` not significantly different from `{ref}` (final and whole-run mean "
                     f"return, permutation tests, α = {TARGETS['alpha']})",
                     (min(ps) >= TARGETS["alpha"]) if ps else None,
                     f"final return {c['final_diff']:+.1f} (p = {_p(c['final_p'])}), whole-run mean "
                     f"{c['mean_diff']:+.1f} (p = {_p(c['mean_p'])})"))
    c = _cmp(comps, EDGE, REFERENCE)
    if c is not None:
        rows += [
            (f"speed: `{EDGE}` at least {TARGETS['sps_ratio']:.0f}x the steps per second of `{REFERENCE}`",
             c["sps_ratio"] >= TARGETS["sps_ratio"],
             f"{c['sps_ratio']:.2f}x (mean steps/s over seeds; per seed {_range(c['sps_ratio_per_seed'])})"),
            (f"memory: `{EDGE}` at most half the peak RSS of `{REFERENCE}`",
             c["peak_rss_ratio"] <= TARGETS["peak_rss_ratio"], f"{c['peak_rss_ratio']:.2f}x"),
        ]
    return rows or None


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
def plot(agg, total) -> list[str]:
    """The learning curves and the speed figure, declared with the generic kinds of _plots."""
    vs = list(agg)
    colors = [COLORS.get(v, "tab:gray") for v in vs]
    curves = {f"{v} ({a['final_return']['n']} seeds)":
              (a["curve_mean"], a["curve_std"], dict(lw=1.8 if v in (EDGE, REFERENCE) else 1.0,
                                                     ls="--" if _bootstraps(v) else "-", color=COLORS.get(v)),
               dict(color=COLORS.get(v))) for v, a in agg.items()}
    return [panels_figure(OUT_DIR, "learning.png", (8, 4.5), [partial(
                learning_curves, x=return_curve([], total, CURVE_BINS)[0], curves=curves,
                title=f"PPO on {ENV_ID}, CleanRL ppo.py hyperparameters")]),
            panels_figure(OUT_DIR, "speed.png", (14, 4.2), [
                partial(hbar_values, labels=vs, values=[agg[v]["sps"]["mean"] for v in vs],
                        xerr=[agg[v]["sps"]["std"] for v in vs], color=colors, xlabel="environment steps per second",
                        vline=(np.mean([agg[v]["bare_env_sps"]["mean"] for v in vs]), " bare env.step loop")),
                partial(hbar_stack, labels=vs, parts={k: [agg[v]["sections_us"][k]["mean"] for v in vs] for k in SECTIONS},
                        vline=np.mean([agg[v]["bare_env_us_per_step"]["mean"] for v in vs]), tick_labels=False,
                        xlabel="µs per environment step, by section (dotted: the bare env.step loop)",
                        legend=dict(fontsize=7, ncol=len(SECTIONS), loc="lower center", bbox_to_anchor=(0.5, 1.0),
                                    frameon=False, handlelength=1.0, columnspacing=0.8)),
                partial(hbar_values, labels=vs, values=[agg[v]["peak_rss_bytes"]["mean"] / 2**20 for v in vs],
                        color=colors, xlabel="peak RSS of the run's process (MiB)", tick_labels=False)])]


def _bootstraps(variant) -> bool:
    """Whether a variant's GAE bootstraps truncated episodes (False for names of older runs)."""
    return VARIANTS.get(variant, ("", ""))[1] == "tfdata-bootstrap"


def _range(xs) -> str:
    return "n/a" if not xs else f"{min(xs):.2f}x" if len(xs) == 1 else f"{min(xs):.2f}-{max(xs):.2f}x"


def _cmp(comps, a, b):
    return next((c for c in comps if c["variant"] == a and c["against"] == b), None)


def headline(agg, comps) -> str | None:
    c = _cmp(comps, EDGE, REFERENCE)
    if c is None:
        return None
    return (f"edge PPO (tfdata.nn.PPO + RolloutBuffer, no torch) against CleanRL's torch loop: "
            f"{c['sps_ratio']:.1f}x steps/s, {c['peak_rss_ratio']:.2f}x peak RSS, final return "
            f"{agg[EDGE]['final_return']['mean']:.0f} vs {agg[REFERENCE]['final_return']['mean']:.0f} "
            f"(p = {_p(c['final_p'])})")


VARIANT_COLUMNS = [
    ("variant", "l", "{variant}"), ("final return", "r", lambda a: _pm(a["final_return"], "{:.1f}")),
    ("mean return", "r", lambda a: _pm(a["mean_return"], "{:.1f}")), ("episodes", "r", "{episodes[mean]:.0f}"),
    ("steps/s", "r", lambda a: _pm(a["sps"])), ("wall (s)", "r", lambda a: _pm(a["wall_s"], "{:.1f}")),
    ("setup (s)", "r", lambda a: _pm(a["setup_s"], "{:.1f}")),
    ("peak RSS (MiB)", "r", lambda a: _pm(a["peak_rss_bytes"], "{:.0f}", 2**-20)),
    ("RSS at start of loop (MiB)", "r", lambda a: _pm(a["rss_ready_bytes"], "{:.0f}", 2**-20)),
    ("buffer (KiB)", "r", lambda a: "" if a["buffer_nbytes"]["mean"] is None else f"{a['buffer_nbytes']['mean'] / 1024:.0f}"),
    ("torch imported", "l", lambda a: "yes" if a["torch_imported"] else "no"),
    ("time-limit bootstrap", "l", lambda a: "yes" if _bootstraps(a["variant"]) else "no (as CleanRL)")]


def write_report(agg, comps, run, pngs, total, versions) -> None:
    n_seeds = max(a["final_return"]["n"] for a in agg.values())
    L = [f"# PPO on {ENV_ID}: tfdata's on-policy data layer and a torch-free PPO against CleanRL\n",
         f"Made by `experiments/ppo_cartpole.py` ({run['mode']} run, command `{run['command']}`, {n_seeds} "
         f"seed(s) per variant, {total:,} environment steps each, {run['wall_clock_s']:.0f} s in all). Raw "
         "numbers and every episode: `results.json`.\n"]
    hl = headline(agg, comps)
    if hl:
        L.append(f"<!-- headline: {hl} -->\n")
    L.extend(hand_written(OUT_DIR, "findings"))
    g = goals(comps)
    if g:
        L.append("## Targets (against CleanRL's torch loop, CleanRL's time-limit semantics in every "
                 "compared loop)\n")
        L += table(g, [("target", "l", lambda x: x[0]),
                       ("met?", "l", lambda x: "n/a" if x[1] is None else "yes" if x[1] else "**no**"),
                       ("measured", "l", lambda x: x[2])])
    L.append("")
    for p in pngs:
        L.append(f"![{p}]({p})\n")
    L.append("## Every variant (mean ± std over seeds)\n")
    recs = [{"variant": v, **a} for v, a in agg.items()]
    L += table(recs, VARIANT_COLUMNS, empty="  ")
    L.append("")
    L.append("Time per environment step by section, µs (share of the loop's wall clock), mean over seeds:\n")
    L += table(recs, [("variant", "l", "{variant}")]
               + [(k, "r", partial(lambda a, k: f"{a['sections_us'][k]['mean']:.2f} "
                                                f"({100 * a['sections_share'][k]['mean']:.0f}%)", k=k)) for k in SECTIONS]
               + [("total", "r", lambda a: f"{1e6 / a['sps']['mean']:.1f}"),
                  ("bare env.step loop", "r", "{bare_env_us_per_step[mean]:.2f}")])
    L.append("")
    L.append("Sections: " + "; ".join(f"`{k}`: {SECTION_HELP[k]}" for k in SECTIONS) + ".\n")
    L.append("## Comparisons\n")
    L += table(comps, [("variant", "l", "{variant}"), ("against", "l", "{against}"),
                       ("final return diff", "r", "{final_diff:+.1f}"), ("p", "r", lambda c: _p(c["final_p"])),
                       ("mean return diff", "r", "{mean_diff:+.1f}"), ("p", "r", lambda c: _p(c["mean_p"])),
                       ("steps/s ratio", "r", "{sps_ratio:.2f}"),
                       ("per seed", "r", lambda c: _range(c["sps_ratio_per_seed"])),
                       ("peak RSS ratio", "r", "{peak_rss_ratio:.2f}")])
    L.append("")
    L.extend(hand_written(OUT_DIR, "method"))
    write_methodology_report(OUT_DIR, L, run)


def publish(runs, run, versions, variants, total) -> None:
    """results.json, plots and README.md from the raw runs."""
    agg = summarise(runs, variants, total)
    comps = comparisons(agg)
    pngs = plot(agg, total)
    write_json(os.path.join(OUT_DIR, "results.json"),
               {"methodology": run, "versions": versions,
                "summary": {v: {k: x for k, x in a.items() if k not in ("curve_mean", "curve_std")}
                            for v, a in agg.items()},
                "curves": {v: {"mean": a["curve_mean"], "std": a["curve_std"]} for v, a in agg.items()},
                "comparisons": comps, "goals": goals(comps), "raw": runs})
    write_report(agg, comps, run, pngs, total, versions)


def render(path: str) -> None:
    """Redo the report of a finished run (its raw runs and methodology are kept as they were)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    runs = data["raw"]
    variants = list(dict.fromkeys(r["variant"] for r in runs))
    publish(runs, data["methodology"], data["versions"], variants, runs[0]["total_steps"])
    print(f"report rewritten: {os.path.relpath(OUT_DIR)}/README.md", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"1 seed, {STEPS['quick']:,} steps (about a minute)")
    ap.add_argument("--seeds", type=int, nargs="*", default=None)
    ap.add_argument("--steps", type=int, default=None, help="environment steps per run")
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
        r = run_worker(args.worker, args.seed, total)
        print("RESULT " + json.dumps(r), flush=True)
        return
    variants = args.variants or list(DEFAULT_VARIANTS)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    if total < HP["num_steps"] * HP["num_envs"]:
        raise SystemExit(f"--steps: at least one rollout of {HP['num_steps'] * HP['num_envs']} steps needed, got {total}")
    seeds = args.seeds if args.seeds is not None else SEEDS[mode]
    os.makedirs(OUT_DIR, exist_ok=True)
    command = "python experiments/ppo_cartpole.py" + (" --quick" if args.quick else "")
    extra = " ".join(a for a in sys.argv[1:] if a != "--quick")
    if extra:
        command += " " + extra
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=seeds, command=command,
                    parameters={"hyperparameters": HP, "env": ENV_ID, "total_steps": total, "variants": variants,
                                "targets": TARGETS, "bare_env_steps": BARE_ENV_STEPS})
    # numba's on-disk cache filled before anything is measured (a run after a kernel edit would
    # otherwise compile in its setup and carry LLVM's memory in its peak RSS): one rollout of
    # each tfdata variant, in its own process, not recorded
    warm = [v for v in variants if VARIANTS[v][1] != "torch"]
    if warm:
        run_in_fresh_processes(__file__, warm, seeds[:1], ["--steps", str(HP["num_steps"] * HP["num_envs"])],
                               timeout_s=TIMEOUT_S, describe=lambda r: "cache warm-up", log=lambda s: None)
    runs = run_all(variants, seeds, total, lambda s: print(s, flush=True))
    run = rec.finish(child_peak_rss_bytes=max(r["peak_rss_bytes"] for r in runs))
    versions = {}
    for r in runs:
        versions.update(r["versions"])
    publish(runs, run, versions, variants, total)
    print(f"{mode} run {rec.run_name} done in {run['wall_clock_s']:.0f} s; report: "
          f"{os.path.relpath(OUT_DIR)}/README.md", flush=True)


if __name__ == "__main__":
    main()
