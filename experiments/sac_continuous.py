"""SAC on continuous control: can tfdata's replay buffer and a torch-free SAC train CleanRL's SAC as
well as CleanRL does, faster and in less memory?

CleanRL's ``sac_continuous_action.py`` (github.com/vwxyzjn/cleanrl, ``cleanrl/sac_continuous_action.py``:
its algorithm, its ``Args`` defaults and its loop) with the learner and the replay buffer chosen per
variant:

* ``torch``: a faithful port of CleanRL's script: the ``Actor`` (256-256 ReLU, mean and log-std heads,
  log-std squashed by tanh into [-5, 2], a tanh-squashed Gaussian scaled to the action bounds) and the
  twin ``SoftQNetwork``s with their target copies, the critic update every step, the delayed policy
  update (``policy_frequency`` actor updates every ``policy_frequency`` steps), automatic entropy
  tuning, Polyak averaging; stable-baselines3's ``ReplayBuffer`` as CleanRL uses it
  (``handle_timeout_termination=False``; the next observation of a truncated step is the episode's
  final observation, ``real_next_obs``, and ``done`` is ``terminated``). torch on the CPU, one thread.
* ``torch_tfdata``: the same agent and update over ``tfdata.ReplayBuffer`` (AoS, one ``push`` per
  step, batches to torch through ``torch.from_numpy``).
* ``edge``: ``tfdata.nn.SAC`` (numba kernels) over the same tfdata buffer; the process never imports
  torch (asserted at the end of every run).

Environments: ``Pendulum-v1``, 5 seeds, 20,000 steps (the budget of rl-baselines3-zoo's tuned SAC on
Pendulum-v1, ``hyperparams/sac.yml``), CleanRL's ``learning_starts`` of 5,000 kept; and ``Hopper-v5``
(gymnasium's MuJoCo task, CleanRL's default ``Hopper-v4`` in its current version), 3 seeds, a fixed
budget that fits this machine: 20,000 steps, the same 15,000 training steps as on Pendulum (the early
phase of learning, not CleanRL's 1M steps; ``BUDGETS`` says why).

Targets (ratios inside one run): no difference detected in learning between the variants (final and
whole-run mean return, permutation tests, 5 seeds on Pendulum); ``edge`` at least 2x the steps per
second of ``torch`` in at most half its peak RSS on Pendulum; ``torch_tfdata`` at least 1.0x ``torch``
(the buffer's share of a step says how much a buffer can matter); on Hopper the same ratios, and where
the time goes (environment step, act, buffer add, sample, update; the update against a bare BLAS
floor of its matrix products).

Every (variant, seed) runs in a fresh process (its own peak memory as ``VmHWM``, no shared caches),
variants alternating seed by seed, one thread for torch, OpenMP and BLAS.

    python experiments/sac_continuous.py --quick    # Pendulum, 1 seed, 2,500 steps: under 2 minutes
    python experiments/sac_continuous.py            # Pendulum 5 seeds, Hopper 3 seeds, 20k steps: 60-90 min
    python experiments/sac_continuous.py --render reports/sac/results.json   # the report again, no runs

Needs the ``sac`` extra (gymnasium >= 1.1, mujoco, torch 2.13.0 CPU, stable-baselines3). Writes
``reports/sac/`` (README.md, results.json, learning and speed plots per environment). Only the public
tfdata API.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import sys
import time
import warnings
from functools import partial

import numpy as np

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
from _plots import hbar_stack, hbar_values, learning_curves, panels_figure  # noqa: E402
from _recording import RunRecord, drop_stale_plots, report_dir, write_json  # noqa: E402
from _render import hand_written, p_value as _p, pm as _pm, table  # noqa: E402
from _render import write_report as write_methodology_report  # noqa: E402
from _stats import permutation_test, return_curve, seed_curves, summary as _ms  # noqa: E402
from _timing import peak_rss_hwm as _peak_rss, rss_statm as _rss_now, run_in_fresh_processes  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "sac"
# CleanRL's sac_continuous_action.py defaults (github.com/vwxyzjn/cleanrl,
# cleanrl/sac_continuous_action.py, class Args); total_timesteps and learning_starts per environment
# in ENVS
HP = {
    "buffer_size": 1_000_000,
    "gamma": 0.99,
    "tau": 0.005,
    "batch_size": 256,
    "learning_starts": 5_000,
    "policy_lr": 3e-4,
    "q_lr": 1e-3,
    "policy_frequency": 2,
    "target_network_frequency": 1,
    "alpha": 0.2,
    "autotune": True,
    "hidden": (256, 256),
}
# environment -> steps and learning_starts per run, seeds, report file stem. Pendulum: the 20k steps
# of rl-baselines3-zoo's tuned SAC (hyperparams/sac.yml, Pendulum-v1: n_timesteps 20000), CleanRL's
# learning_starts. Hopper: a budget the machine runs in the time the whole run may take (the README
# says why); CleanRL's learning_starts
ENVS = {
    "Pendulum-v1": {"steps": 20_000, "learning_starts": 5_000, "seeds": [0, 1, 2, 3, 4], "slug": "pendulum"},
    "Hopper-v5": {"steps": 20_000, "learning_starts": 5_000, "seeds": [0, 1, 2], "slug": "hopper"},
}
# why each budget (the report prints it)
BUDGETS = {
    "Pendulum-v1": "20,000 steps: rl-baselines3-zoo's budget for SAC on Pendulum-v1 (hyperparams/sac.yml, "
                   "n_timesteps 20000), enough to converge; CleanRL's learning_starts (5,000) kept",
    "Hopper-v5": "20,000 steps, CleanRL's learning_starts (5,000) kept: 15,000 training steps, as on Pendulum. "
                 "With the Pendulum runs (5 seeds x 3 variants) the whole run then stays within about 90 "
                 "minutes of this 2-core machine; CleanRL's 1M steps would take hours per run (below: what a "
                 "training step of CleanRL's loop took). The comparison covers the early phase of learning, "
                 "not CleanRL's final scores",
}
QUICK = {"Pendulum-v1": {"steps": 2_500, "learning_starts": 1_000, "seeds": [0]}}
VARIANTS = {
    # name: (learner, buffer)
    "torch": ("torch", "sb3"),
    "torch_tfdata": ("torch", "tfdata"),
    "edge": ("numba", "tfdata"),
}
REFERENCE = "torch"
TWIN = "torch_tfdata"                 # the torch learner on the edge loop's buffer
EDGE = "edge"
COLORS = {"torch": "tab:blue", "torch_tfdata": "tab:orange", "edge": "tab:green"}
TARGETS = {"sps_ratio": 2.0, "peak_rss_ratio": 0.5, "twin_sps_ratio": 1.0, "alpha": 0.05}
LAST_EPISODES = 10                    # final return = mean of the last 10 episodes
CURVE_BINS = 40
BARE_ENV_STEPS = 2_000                # steps of the bare env.step loop (per run)
BLAS_REPEATS = 30                     # repetitions of the BLAS floor (its median is kept)
TIMEOUT_S = 3 * 3600
OUT_DIR = report_dir(EXPERIMENT)
SECTIONS = ("env", "act", "buffer_add", "sample", "update", "other")
SECTION_HELP = {
    "env": "`envs.step` (one environment, autoreset in the same step)",
    "act": "the policy's action (uniform random actions before `learning_starts`)",
    "buffer_add": "storing the transition (SB3's `ReplayBuffer.add`, tfdata's `push`)",
    "sample": "a batch of 256 (SB3's `sample` with its tensors, tfdata's `sample` and `torch.from_numpy`)",
    "update": "the critic update, the delayed actor and entropy updates, Polyak averaging",
    "other": "the rest of the loop (the final observation of a truncated episode, episode statistics)",
}


# ---------------------------------------------------------------------------------------------
# The environments (identical in every variant)
# ---------------------------------------------------------------------------------------------
def make_envs(gym, env_id: str, seed: int):
    """CleanRL's ``make_env``: ``RecordEpisodeStatistics`` around the task, its action space seeded,
    in a one-environment ``SyncVectorEnv`` that resets in the same step (``SAME_STEP``, gymnasium
    0.29's behaviour, which CleanRL's loop was written for: the observation a finished episode ended
    on is ``info["final_obs"]``). The observation space is declared float32, as CleanRL does before
    building its buffer."""
    def thunk():
        env = gym.wrappers.RecordEpisodeStatistics(gym.make(env_id))
        env.action_space.seed(seed)
        return env

    envs = gym.vector.SyncVectorEnv([thunk], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.single_observation_space.dtype = np.float32
    return envs


def finished_episodes(info) -> list:
    """(return, length) of the episodes that ended in this vector step."""
    fi = info.get("final_info")
    if not fi or "_episode" not in fi:
        return []
    ep = fi["episode"]
    return [(float(ep["r"][e]), int(ep["l"][e])) for e in np.flatnonzero(fi["_episode"])]


def bare_env_us(gym, env_id: str, seed: int, n: int) -> float:
    """µs per step of a loop that only steps the environment (pre-drawn random actions): the floor of
    any loop over it."""
    envs = make_envs(gym, env_id, seed + 7_919)
    envs.reset(seed=seed + 7_919)
    space = envs.single_action_space
    actions = np.random.default_rng(seed).uniform(space.low, space.high, size=(n, 1) + space.shape)
    actions = actions.astype(np.float32)
    step = envs.step
    for k in range(min(n, 100)):  # warm-up
        step(actions[k])
    t0 = time.perf_counter_ns()
    for k in range(n):
        step(actions[k])
    dt = time.perf_counter_ns() - t0
    envs.close()
    return dt / n / 1e3


def update_products(obs_dim: int, act_dim: int, hidden=(256, 256), batch: int = 256,
                    policy_frequency: int = 2) -> list:
    """The matrix products of one cycle of ``policy_frequency`` SAC training steps (that many critic
    updates, then that many actor updates, each followed by the temperature's draw from the updated
    actor) as ``(m, k, n)`` shapes: the least arithmetic any implementation of CleanRL's update
    does. Backward passes compute only the gradients the update needs; an actor update's forward
    pass is the previous temperature draw's (the same actor, other noise), so a cycle has one actor
    forward for the temperature of its own."""
    B, (h1, h2) = batch, hidden
    q_in = obs_dim + act_dim

    def fwd(d_in, d_out):       # x @ W1, h1 @ W2, h2 @ W3
        return [(B, d_in, h1), (B, h1, h2), (B, h2, d_out)]

    def bwd_weights(d_in, d_out):   # dW3, dW2, dW1
        return [(h2, B, d_out), (h1, B, h2), (d_in, B, h1)]

    def bwd_inputs(d_in, d_out, to_input):  # dh2, dh1 (and dx when the input's gradient is needed)
        return [(B, d_out, h2), (B, h2, h1)] + ([(B, h1, d_in)] if to_input else [])

    actor = fwd(obs_dim, 2 * act_dim)          # mean and log-std heads as one product
    critic_update = (actor + 2 * fwd(q_in, 1)
                     + 2 * (fwd(q_in, 1) + bwd_weights(q_in, 1) + bwd_inputs(q_in, 1, False)))
    actor_update = (actor + 2 * (fwd(q_in, 1) + bwd_inputs(q_in, 1, True))
                    + bwd_weights(obs_dim, 2 * act_dim) + bwd_inputs(obs_dim, 2 * act_dim, False))
    return policy_frequency * critic_update + policy_frequency * actor_update + actor


def blas_floor_us(obs_dim: int, act_dim: int, hidden=(256, 256), repeats: int = BLAS_REPEATS) -> dict:
    """µs per training step of the hidden-layer products of :func:`update_products` (every
    dimension at least the narrowest hidden layer: at batch 256 and 256 units, 33 products of
    256 x 256 x 256 per cycle of 2 steps, over 95% of the arithmetic) as bare float32 ``np.matmul``
    calls into preallocated outputs (numpy's BLAS, one thread): the median of ``repeats`` cycles,
    divided by the cycle's steps. The thin products (an input of a few floats, a critic's one
    output) are left out: numpy sends some of them to slow paths that no implementation needs, and
    a floor must not be above what can be done.

    Returns
    -------
    dict
        Per training step: ``us``, ``products`` (how many timed), ``gflop`` (theirs),
        ``gflop_step`` (every product's).
    """
    rng = np.random.default_rng(0)
    p = HP["policy_frequency"]
    shapes = update_products(obs_dim, act_dim, hidden, HP["batch_size"], p)
    wide = [s for s in shapes if min(s) >= min(hidden)]
    ops = [(rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32),
            np.empty((m, n), np.float32)) for m, k, n in wide]
    matmul = np.matmul
    for a, b, o in ops:
        matmul(a, b, out=o)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for a, b, o in ops:
            matmul(a, b, out=o)
        times.append(time.perf_counter_ns() - t0)
    return {"us": float(np.median(times)) / 1e3 / p, "products": len(ops) / p,
            "gflop": 2 * sum(m * k * n for m, k, n in wide) / 1e9 / p,
            "gflop_step": 2 * sum(m * k * n for m, k, n in shapes) / 1e9 / p}


# ---------------------------------------------------------------------------------------------
# CleanRL's agent and update (torch; runs in a worker process)
# ---------------------------------------------------------------------------------------------
LOG_STD_MAX = 2
LOG_STD_MIN = -5


def torch_networks(obs_dim: int, act_dim: int, action_low, action_high, hidden=(256, 256)):
    """CleanRL's ``SoftQNetwork`` and ``Actor`` classes (torch's default ``nn.Linear``
    initialisation, as CleanRL)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    h1, h2 = hidden

    class SoftQNetwork(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(obs_dim + act_dim, h1)
            self.fc2 = nn.Linear(h1, h2)
            self.fc3 = nn.Linear(h2, 1)

        def forward(self, x, a):
            x = torch.cat([x, a], 1)
            x = F.relu(self.fc1(x))
            x = F.relu(self.fc2(x))
            return self.fc3(x)

    class Actor(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(obs_dim, h1)
            self.fc2 = nn.Linear(h1, h2)
            self.fc_mean = nn.Linear(h2, act_dim)
            self.fc_logstd = nn.Linear(h2, act_dim)
            high, low = np.asarray(action_high, np.float32), np.asarray(action_low, np.float32)
            self.register_buffer("action_scale", torch.tensor((high - low) / 2.0, dtype=torch.float32))
            self.register_buffer("action_bias", torch.tensor((high + low) / 2.0, dtype=torch.float32))

        def forward(self, x):
            x = F.relu(self.fc1(x))
            x = F.relu(self.fc2(x))
            mean = self.fc_mean(x)
            log_std = torch.tanh(self.fc_logstd(x))
            log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)
            return mean, log_std

        def get_action(self, x):
            mean, log_std = self(x)
            std = log_std.exp()
            normal = torch.distributions.Normal(mean, std)
            x_t = normal.rsample()
            y_t = torch.tanh(x_t)
            action = y_t * self.action_scale + self.action_bias
            log_prob = normal.log_prob(x_t)
            log_prob -= torch.log(self.action_scale * (1 - y_t.pow(2)) + 1e-6)
            log_prob = log_prob.sum(1, keepdim=True)
            mean = torch.tanh(mean) * self.action_scale + self.action_bias
            return action, log_prob, mean

    return Actor, SoftQNetwork


class TorchSAC:
    """CleanRL's networks, optimizers and update, built in CleanRL's order (actor, qf1, qf2, the
    targets copied from them), so the same torch seed gives CleanRL's weights."""

    def __init__(self, obs_dim, act_dim, action_low, action_high, hp):
        import torch
        import torch.nn.functional as F

        self.torch, self.F, self.hp = torch, F, hp
        Actor, SoftQNetwork = torch_networks(obs_dim, act_dim, action_low, action_high, hp["hidden"])
        self.actor = Actor()
        self.qf1, self.qf2 = SoftQNetwork(), SoftQNetwork()
        self.qf1_target, self.qf2_target = SoftQNetwork(), SoftQNetwork()
        self.qf1_target.load_state_dict(self.qf1.state_dict())
        self.qf2_target.load_state_dict(self.qf2.state_dict())
        self.q_optimizer = torch.optim.Adam(list(self.qf1.parameters()) + list(self.qf2.parameters()), lr=hp["q_lr"])
        self.actor_optimizer = torch.optim.Adam(list(self.actor.parameters()), lr=hp["policy_lr"])
        if hp["autotune"]:
            self.target_entropy = -torch.prod(torch.Tensor((act_dim,))).item()
            self.log_alpha = torch.zeros(1, requires_grad=True)
            self.alpha = self.log_alpha.exp().item()
            self.a_optimizer = torch.optim.Adam([self.log_alpha], lr=hp["q_lr"])
        else:
            self.alpha = hp["alpha"]
        self.qf_loss = self.actor_loss = self.alpha_loss = None

    def act(self, obs):
        """A sampled action for the (num_envs, obs_dim) observations, as numpy. CleanRL runs this
        forward with autograd on; no_grad is the faster, fair baseline (the same numbers)."""
        with self.torch.no_grad():
            actions, _, _ = self.actor.get_action(self.torch.Tensor(obs))
        return actions.numpy()

    def update(self, observations, actions, next_observations, rewards, dones, global_step):
        """CleanRL's training step at ``global_step`` on one batch (tensors; ``rewards`` and
        ``dones`` flat)."""
        torch, F, hp = self.torch, self.F, self.hp
        actor, qf1, qf2 = self.actor, self.qf1, self.qf2
        with torch.no_grad():
            next_state_actions, next_state_log_pi, _ = actor.get_action(next_observations)
            qf1_next_target = self.qf1_target(next_observations, next_state_actions)
            qf2_next_target = self.qf2_target(next_observations, next_state_actions)
            min_qf_next_target = torch.min(qf1_next_target, qf2_next_target) - self.alpha * next_state_log_pi
            next_q_value = rewards + (1 - dones) * hp["gamma"] * min_qf_next_target.view(-1)
        qf1_a_values = qf1(observations, actions).view(-1)
        qf2_a_values = qf2(observations, actions).view(-1)
        qf1_loss = F.mse_loss(qf1_a_values, next_q_value)
        qf2_loss = F.mse_loss(qf2_a_values, next_q_value)
        qf_loss = qf1_loss + qf2_loss
        self.q_optimizer.zero_grad()
        qf_loss.backward()
        self.q_optimizer.step()
        self.qf_loss = qf_loss
        if global_step % hp["policy_frequency"] == 0:  # TD3's delayed update, compensated
            for _ in range(hp["policy_frequency"]):
                pi, log_pi, _ = actor.get_action(observations)
                min_qf_pi = torch.min(qf1(observations, pi), qf2(observations, pi))
                actor_loss = ((self.alpha * log_pi) - min_qf_pi).mean()
                self.actor_optimizer.zero_grad()
                actor_loss.backward()
                self.actor_optimizer.step()
                self.actor_loss = actor_loss
                if hp["autotune"]:
                    with torch.no_grad():
                        _, log_pi, _ = actor.get_action(observations)
                    alpha_loss = (-self.log_alpha.exp() * (log_pi + self.target_entropy)).mean()
                    self.a_optimizer.zero_grad()
                    alpha_loss.backward()
                    self.a_optimizer.step()
                    self.alpha = self.log_alpha.exp().item()
                    self.alpha_loss = alpha_loss
        if global_step % hp["target_network_frequency"] == 0:
            tau = hp["tau"]
            for param, target_param in zip(qf1.parameters(), self.qf1_target.parameters()):
                target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)
            for param, target_param in zip(qf2.parameters(), self.qf2_target.parameters()):
                target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)


def edge_learner(tfdata, obs_dim, action_low, action_high, hp, seed):
    """``tfdata.nn.SAC`` with CleanRL's hyperparameters (numba kernels, no torch)."""
    return tfdata.nn.SAC(obs_dim, action_low, action_high, hidden=hp["hidden"], gamma=hp["gamma"], tau=hp["tau"],
                         policy_lr=hp["policy_lr"], q_lr=hp["q_lr"], alpha=hp["alpha"], autotune=hp["autotune"],
                         policy_frequency=hp["policy_frequency"],
                         target_network_frequency=hp["target_network_frequency"], seed=seed)


# ---------------------------------------------------------------------------------------------
# The variants: act, add, sample, update over one learner and one buffer
# ---------------------------------------------------------------------------------------------
class Parts:
    """What the loop calls: ``act(obs) -> (1, A) actions``, ``add(obs, real_next_obs, actions,
    rewards, terminations, truncations, infos)``, ``sample() -> data``, ``update(data, step)``; and
    the learner, the buffer and its bytes."""

    def __init__(self, act, add, sample, update, learner, buffer, buffer_nbytes):
        self.act, self.add, self.sample, self.update = act, add, sample, update
        self.learner, self.buffer, self.buffer_nbytes = learner, buffer, buffer_nbytes


def build(variant, envs, hp, seed, versions) -> Parts:
    """The learner and buffer of ``variant`` for ``envs``, the buffer's sampling seeded by ``seed``
    (the torch learner's weights come from torch's global generator, seeded by the caller)."""
    learner_kind, storage = VARIANTS[variant]
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    obs_dim, act_dim = int(np.prod(obs_space.shape)), int(np.prod(act_space.shape))
    batch_size = hp["batch_size"]
    if learner_kind == "torch":
        import torch

        versions["torch"] = torch.__version__
        learner = TorchSAC(obs_dim, act_dim, act_space.low, act_space.high, hp)
        act = learner.act
    else:
        import tfdata

        learner = edge_learner(tfdata, obs_dim, act_space.low, act_space.high, hp, seed)

        def act(obs):
            return learner.act(obs[0])[None]

    if storage == "sb3":
        import stable_baselines3
        from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer

        versions["stable_baselines3"] = stable_baselines3.__version__
        rb = SB3ReplayBuffer(hp["buffer_size"], obs_space, act_space, "cpu", n_envs=envs.num_envs,
                             handle_timeout_termination=False)
        nbytes = int(sum(getattr(rb, k).nbytes for k in ("observations", "next_observations", "actions",
                                                          "rewards", "dones", "timeouts")))

        def add(obs, real_next_obs, actions, rewards, terminations, truncations, infos):
            rb.add(obs, real_next_obs, actions, rewards, terminations, infos)

        def sample():
            return rb.sample(batch_size)

        def update(data, step):
            learner.update(data.observations, data.actions, data.next_observations, data.rewards.flatten(),
                           data.dones.flatten(), step)
    else:
        import tfdata

        versions["tfdata"] = tfdata.__version__
        spec = tfdata.Spec.from_spaces(obs_space, act_space)
        rb = tfdata.ReplayBuffer(spec, hp["buffer_size"], layout="aos", seed=seed)
        nbytes = int(rb.nbytes)
        push = rb.push

        def add(obs, real_next_obs, actions, rewards, terminations, truncations, infos):
            push({"obs": obs[0], "action": actions[0], "reward": rewards[0], "next_obs": real_next_obs[0],
                  "terminated": terminations[0], "truncated": truncations[0]})

        if learner_kind == "torch":
            from_numpy = torch.from_numpy

            def sample():
                b = rb.sample(batch_size)
                return (from_numpy(b["obs"]), from_numpy(b["action"]), from_numpy(b["next_obs"]),
                        from_numpy(b["reward"]), from_numpy(b["terminated"]).float())

            def update(data, step):
                learner.update(*data, step)
        else:
            def sample():
                return rb.sample(batch_size)

            def update(batch, step):
                learner.train(batch, step=step)
    return Parts(act, add, sample, update, learner, rb, nbytes)


def warm_up(parts: Parts, envs, hp) -> None:
    """Every call of the loop on a throwaway learner and buffer of the run's types (numba kernels
    loaded, or compiled on a cold cache; torch's first-call allocations), before the clock: a batch
    of rows added, then two training steps (one with the delayed policy update, one without)."""
    rng = np.random.default_rng(12_345)
    space = envs.single_action_space
    shape = (1,) + envs.single_observation_space.shape
    for k in range(hp["batch_size"] + 1):
        obs = rng.standard_normal(shape).astype(np.float32)
        actions = rng.uniform(space.low, space.high, (1,) + space.shape).astype(np.float32)
        parts.add(obs, obs, actions, np.ones(1), np.array([k % 50 == 49]), np.array([k % 70 == 69]), {})
    parts.act(obs)
    for step in (hp["policy_frequency"], hp["policy_frequency"] + 1):
        parts.update(parts.sample(), step)


# ---------------------------------------------------------------------------------------------
# The measured loop (runs in a worker process)
# ---------------------------------------------------------------------------------------------
def loop(envs, parts: Parts, seed, total, learning_starts) -> dict:
    """CleanRL's loop: random actions before ``learning_starts``, the policy's after; the truncated
    step's ``real_next_obs`` from ``final_obs``; a batch and a training step at every step after
    ``learning_starts``. Returns the sections' seconds, the episodes and the loop's wall clock."""
    act, add, sample, update, step_envs = parts.act, parts.add, parts.sample, parts.update, envs.step
    space = envs.single_action_space
    num_envs = envs.num_envs
    pc = time.perf_counter_ns
    t_act = t_env = t_add = t_sample = t_update = 0
    episodes = []
    obs, _ = envs.reset(seed=seed)
    t_loop = pc()
    t_train = None
    for global_step in range(total):
        t0 = pc()
        if global_step < learning_starts:
            actions = np.array([space.sample() for _ in range(num_envs)])
        else:
            actions = act(obs)
        t1 = pc()
        next_obs, rewards, terminations, truncations, infos = step_envs(actions)
        t2 = pc()
        for r, length in finished_episodes(infos):
            episodes.append((global_step, r, length))
        real_next_obs = next_obs.copy()
        for idx, trunc in enumerate(truncations):
            if trunc:
                real_next_obs[idx] = infos["final_obs"][idx]
        t3 = pc()
        add(obs, real_next_obs, actions, rewards, terminations, truncations, infos)
        t4 = pc()
        obs = next_obs
        t_act += t1 - t0
        t_env += t2 - t1
        t_add += t4 - t3
        if global_step > learning_starts:
            if t_train is None:
                t_train = t0
            t5 = pc()
            data = sample()
            t6 = pc()
            update(data, global_step)
            t_sample += t6 - t5
            t_update += pc() - t6
    t_end = pc()
    wall = (t_end - t_loop) / 1e9
    secs = {"env": t_env / 1e9, "act": t_act / 1e9, "buffer_add": t_add / 1e9, "sample": t_sample / 1e9,
            "update": t_update / 1e9}
    secs["other"] = max(0.0, wall - sum(secs.values()))
    return {"wall": wall, "sections_s": secs, "episodes": episodes,
            "train_wall": (t_end - t_train) / 1e9 if t_train is not None else 0.0}


def run_worker(variant: str, seed: int, env_id: str, total: int, learning_starts: int) -> dict:
    t_start = time.perf_counter()
    load_start = [round(x, 2) for x in os.getloadavg()]
    learner_kind, storage = VARIANTS[variant]
    hp = dict(HP, learning_starts=learning_starts)
    import gymnasium as gym

    # declaring the observations float32 (as CleanRL does) makes gymnasium's checker warn once
    warnings.filterwarnings("ignore", module="gymnasium.utils.passive_env_checker")
    versions = {"gymnasium": gym.__version__, "numpy": np.__version__}
    if env_id.split("-")[0] in ("Hopper", "HalfCheetah", "Walker2d", "Ant", "Humanoid"):
        import mujoco

        versions["mujoco"] = mujoco.__version__
    bare_us = bare_env_us(gym, env_id, seed, BARE_ENV_STEPS)
    envs = make_envs(gym, env_id, seed)
    obs_dim = int(np.prod(envs.single_observation_space.shape))
    act_dim = int(np.prod(envs.single_action_space.shape))
    blas = blas_floor_us(obs_dim, act_dim, HP["hidden"])
    if learner_kind == "torch":
        import torch

        torch.set_num_threads(1)
    warm_up(build(variant, envs, hp, seed + 10_000, versions), envs, hp)
    # CleanRL's seeding, then its networks (torch's generator) and the buffer (SB3 samples from
    # numpy's global generator, tfdata from its own seed)
    random.seed(seed)
    np.random.seed(seed)
    if learner_kind == "torch":
        torch.manual_seed(seed)
    parts = build(variant, envs, hp, seed, versions)
    rss_ready = _rss_now()
    setup_s = time.perf_counter() - t_start
    r = loop(envs, parts, seed, total, learning_starts)
    envs.close()
    episodes, wall = r["episodes"], r["wall"]
    train_steps = max(0, total - learning_starts - 1)
    torch_imported = "torch" in sys.modules
    if learner_kind == "numba":
        assert not torch_imported, "the edge loop imported torch"
    alpha = parts.learner.alpha
    return {
        "variant": variant, "seed": seed, "env_id": env_id, "total_steps": total, "learning_starts": learning_starts,
        "train_steps": train_steps, "obs_dim": obs_dim, "act_dim": act_dim,
        "episodes": episodes,
        "final_return": float(np.mean([e[1] for e in episodes[-LAST_EPISODES:]])) if episodes else None,
        "mean_return": float(np.mean([e[1] for e in episodes])) if episodes else None,
        "alpha_final": float(alpha),
        "wall_s": wall, "train_wall_s": r["train_wall"], "setup_s": setup_s, "sps": total / wall,
        "train_sps": train_steps / r["train_wall"] if r["train_wall"] else None,
        "sections_s": r["sections_s"],
        "update_us_per_train_step": 1e6 * r["sections_s"]["update"] / max(1, train_steps),
        "sample_us_per_train_step": 1e6 * r["sections_s"]["sample"] / max(1, train_steps),
        "buffer_add_us": 1e6 * r["sections_s"]["buffer_add"] / total,
        "blas_floor": blas, "bare_env_us": bare_us, "bare_env_sps": 1e6 / bare_us,
        "peak_rss_bytes": _peak_rss(),
        # getrusage's figure, for the record: a child started by vfork + exec starts from its
        # parent's peak
        "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "rss_ready_bytes": rss_ready, "rss_end_bytes": _rss_now(), "buffer_nbytes": parts.buffer_nbytes,
        "torch_imported": torch_imported, "numba_imported": "numba" in sys.modules,
        "stable_baselines3_imported": "stable_baselines3" in sys.modules,
        "versions": versions, "load_start": load_start, "load_end": [round(x, 2) for x in os.getloadavg()],
    }


# ---------------------------------------------------------------------------------------------
# Driver and analysis
# ---------------------------------------------------------------------------------------------
def run_env(env_id, variants, seeds, total, learning_starts, log) -> list[dict]:
    def describe(r):
        share = (r["sections_s"]["buffer_add"] + r["sections_s"]["sample"]) / r["wall_s"]
        return (f"{env_id}: final return {r['final_return']:.1f}, mean {r['mean_return']:.1f}, "
                f"{r['sps']:.0f} steps/s, buffer {100 * share:.1f}%, peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB")

    return run_in_fresh_processes(__file__, list(variants), seeds,
                                  ["--env", env_id, "--steps", str(total), "--learning-starts", str(learning_starts)],
                                  timeout_s=TIMEOUT_S, describe=describe, log=log)


def summarise(runs, variants, total) -> dict:
    """Per variant: learning, speed, sections, memory (mean ± std over seeds), the learning curve."""
    out = {}
    for v in variants:
        rs = [r for r in runs if r["variant"] == v]
        if not rs:
            continue
        curve_mean, curve_std = seed_curves([r["episodes"] for r in rs], total, CURVE_BINS)
        share = [(r["sections_s"]["buffer_add"] + r["sections_s"]["sample"]) / r["wall_s"] for r in rs]
        col = lambda key: _ms(r.get(key) for r in rs)  # noqa: E731
        out[v] = {
            **{k: col(k) for k in ("final_return", "mean_return", "alpha_final", "sps", "train_sps", "wall_s",
                                   "train_wall_s", "setup_s", "update_us_per_train_step",
                                   "sample_us_per_train_step", "buffer_add_us", "bare_env_us", "bare_env_sps",
                                   "peak_rss_bytes", "rss_ready_bytes", "buffer_nbytes")},
            "episodes": _ms(len(r["episodes"]) for r in rs),
            "buffer_share": _ms(share),
            "amdahl_bound": _ms(1.0 / (1.0 - s) for s in share),
            "sections_share": {k: _ms(r["sections_s"][k] / r["wall_s"] for r in rs) for k in SECTIONS},
            # µs per environment step (whole run), by section
            "sections_us": {k: _ms(1e6 * r["sections_s"][k] / r["total_steps"] for r in rs) for k in SECTIONS},
            "blas_floor_us": _ms(r["blas_floor"]["us"] for r in rs),
            "blas_gflop": rs[0]["blas_floor"]["gflop"],
            "blas_gflop_step": rs[0]["blas_floor"]["gflop_step"],
            "blas_products": rs[0]["blas_floor"]["products"],
            "update_over_blas": _ms(r["update_us_per_train_step"] / r["blas_floor"]["us"] for r in rs),
            "torch_imported": any(r["torch_imported"] for r in rs),
            "curve_mean": curve_mean, "curve_std": curve_std,
            "seeds": [r["seed"] for r in rs],
            "sps_by_seed": {r["seed"]: r["sps"] for r in rs},
            "finals": [r["final_return"] for r in rs],
            "means": [r["mean_return"] for r in rs],
        }
    return out


def comparisons(agg) -> list[dict]:
    """Each variant against CleanRL's (``torch``), and the edge loop against its torch twin on the
    same buffer (the learner alone)."""
    pairs = [(v, REFERENCE) for v in agg if v != REFERENCE] + [(EDGE, TWIN)]
    rows = []
    for a, b in pairs:
        if a not in agg or b not in agg:
            continue
        A, B = agg[a], agg[b]
        enough = len(A["finals"]) > 1 and len(B["finals"]) > 1 and None not in A["finals"] + B["finals"]
        rows.append({
            "variant": a, "against": b,
            "final_diff": A["final_return"]["mean"] - B["final_return"]["mean"],
            "final_p": permutation_test(A["finals"], B["finals"]) if enough else None,
            "mean_diff": A["mean_return"]["mean"] - B["mean_return"]["mean"],
            "mean_p": permutation_test(A["means"], B["means"]) if enough else None,
            "sps_ratio": A["sps"]["mean"] / B["sps"]["mean"],
            # the runs of a seed ran back to back, under about the same load: their ratio
            "sps_ratio_per_seed": [A["sps_by_seed"][s] / B["sps_by_seed"][s] for s in A["seeds"] if s in B["sps_by_seed"]],
            "train_sps_ratio": (A["train_sps"]["mean"] / B["train_sps"]["mean"]
                                if A["train_sps"]["mean"] and B["train_sps"]["mean"] else None),
            "peak_rss_ratio": A["peak_rss_bytes"]["mean"] / B["peak_rss_bytes"]["mean"],
        })
    return rows


def _cmp(comps, a, b):
    return next((c for c in comps if c["variant"] == a and c["against"] == b), None)


def _range(xs) -> str:
    return "n/a" if not xs else f"{min(xs):.2f}x" if len(xs) == 1 else f"{min(xs):.2f}-{max(xs):.2f}x"


def min_p(n_a: int, n_b: int) -> float:
    """The smallest p an exact two-sided permutation test of n_a against n_b values can give."""
    import math

    return 2 / math.comb(n_a + n_b, n_a)


def goals(agg, comps) -> list[tuple] | None:
    """The targets against CleanRL's torch loop: (goal, met or None, measured). Learning for the edge
    loop and for the torch loop over tfdata's buffer; speed and memory of the edge loop; speed of the
    torch loop over tfdata's buffer, with the buffer's share of CleanRL's step."""
    rows = []
    for v in (EDGE, TWIN):
        c = _cmp(comps, v, REFERENCE)
        if c is None:
            continue
        ps = [p for p in (c["final_p"], c["mean_p"]) if p is not None]
        n = (len(agg[v]["finals"]), len(agg[REFERENCE]["finals"]))
        power = "" if not ps else f"; the smallest p {n[0]} + {n[1]} seeds can give: {min_p(*n):.2f}"
        # too few seeds to detect anything at α: neither met nor missed
        testable = bool(ps) and min_p(*n) < TARGETS["alpha"]
        rows.append((f"learning: `{v}` not significantly different from `{REFERENCE}` (final and whole-run "
                     f"mean return, permutation tests, α = {TARGETS['alpha']})",
                     (min(ps) >= TARGETS["alpha"]) if testable else None,
                     f"final return {c['final_diff']:+.1f} (p = {_p(c['final_p'])}), whole-run mean "
                     f"{c['mean_diff']:+.1f} (p = {_p(c['mean_p'])}){power}"))
    c = _cmp(comps, EDGE, REFERENCE)
    if c is not None:
        rows += [
            (f"speed: `{EDGE}` at least {TARGETS['sps_ratio']:.0f}x the steps per second of `{REFERENCE}`",
             c["sps_ratio"] >= TARGETS["sps_ratio"],
             f"{c['sps_ratio']:.2f}x (whole run; per seed {_range(c['sps_ratio_per_seed'])}; training phase "
             f"{c['train_sps_ratio']:.2f}x)" if c["train_sps_ratio"] else f"{c['sps_ratio']:.2f}x"),
            (f"memory: `{EDGE}` at most {TARGETS['peak_rss_ratio']}x the peak RSS of `{REFERENCE}`",
             c["peak_rss_ratio"] <= TARGETS["peak_rss_ratio"],
             f"{c['peak_rss_ratio']:.2f}x ({agg[EDGE]['peak_rss_bytes']['mean'] / 2**20:.0f} MiB against "
             f"{agg[REFERENCE]['peak_rss_bytes']['mean'] / 2**20:.0f} MiB)"),
        ]
    c = _cmp(comps, TWIN, REFERENCE)
    if c is not None:
        ref = agg[REFERENCE]
        rows.append((f"speed: `{TWIN}` at least {TARGETS['twin_sps_ratio']:.1f}x the steps per second of "
                     f"`{REFERENCE}`", c["sps_ratio"] >= TARGETS["twin_sps_ratio"],
                     f"{c['sps_ratio']:.2f}x (per seed {_range(c['sps_ratio_per_seed'])}); the buffer's share of "
                     f"`{REFERENCE}`'s loop {100 * ref['buffer_share']['mean']:.1f}% (SB3), of `{TWIN}`'s "
                     f"{100 * agg[TWIN]['buffer_share']['mean']:.1f}% (tfdata)"))
    return rows or None


def analyse(runs) -> dict:
    """Per environment, in run order: its variants' summaries, comparisons and targets."""
    out = {}
    for env_id in dict.fromkeys(r["env_id"] for r in runs):
        rs = [r for r in runs if r["env_id"] == env_id]
        variants = [v for v in VARIANTS if any(r["variant"] == v for r in rs)]
        total = rs[0]["total_steps"]
        agg = summarise(rs, variants, total)
        comps = comparisons(agg)
        out[env_id] = {"total_steps": total, "learning_starts": rs[0]["learning_starts"], "agg": agg,
                       "comparisons": comps, "goals": goals(agg, comps)}
    return out


# ---------------------------------------------------------------------------------------------
# Report (from results.json alone: --render redoes it without running anything)
# ---------------------------------------------------------------------------------------------
def _slug(env_id: str) -> str:
    return ENVS.get(env_id, {}).get("slug") or env_id.split("-")[0].lower()


def plot(env_id, a) -> list[str]:
    """The learning curves and the speed figure of one environment."""
    agg, total = a["agg"], a["total_steps"]
    vs = list(agg)
    colors = [COLORS.get(v, "tab:gray") for v in vs]
    curves = {f"{v} ({x['final_return']['n']} seeds)":
              (x["curve_mean"], x["curve_std"], dict(lw=1.8 if v in (EDGE, REFERENCE) else 1.0, color=COLORS.get(v)),
               dict(color=COLORS.get(v))) for v, x in agg.items()}
    slug = _slug(env_id)
    bare = np.mean([agg[v]["bare_env_us"]["mean"] for v in vs])
    return [panels_figure(OUT_DIR, f"learning_{slug}.png", (8, 4.5), [partial(
                learning_curves, x=return_curve([], total, CURVE_BINS)[0], curves=curves,
                title=f"SAC on {env_id}, CleanRL sac_continuous_action.py hyperparameters")]),
            panels_figure(OUT_DIR, f"speed_{slug}.png", (14, 4.2), [
                partial(hbar_values, labels=vs, values=[agg[v]["sps"]["mean"] for v in vs],
                        xerr=[agg[v]["sps"]["std"] for v in vs], color=colors,
                        xlabel="environment steps per second (whole run)"),
                partial(hbar_stack, labels=vs, parts={k: [agg[v]["sections_us"][k]["mean"] for v in vs] for k in SECTIONS},
                        vline=bare, tick_labels=False,
                        xlabel="µs per environment step, by section (dotted: the bare env.step loop)",
                        legend=dict(fontsize=7, ncol=len(SECTIONS), loc="lower center", bbox_to_anchor=(0.5, 1.0),
                                    frameon=False, handlelength=1.0, columnspacing=0.8)),
                partial(hbar_values, labels=vs, values=[agg[v]["peak_rss_bytes"]["mean"] / 2**20 for v in vs],
                        color=colors, xlabel="peak RSS of the run's process (VmHWM, MiB)", tick_labels=False)])]


def headline(analysis) -> str | None:
    a = analysis.get("Pendulum-v1") or next(iter(analysis.values()), None)
    if a is None:
        return None
    c = _cmp(a["comparisons"], EDGE, REFERENCE)
    if c is None:
        return None
    agg = a["agg"]
    env_id = next(k for k, v in analysis.items() if v is a)
    return (f"edge SAC (tfdata.nn.SAC + ReplayBuffer, no torch) against CleanRL's torch loop on {env_id}: "
            f"{c['sps_ratio']:.1f}x steps/s, {c['peak_rss_ratio']:.2f}x peak RSS, final return "
            f"{agg[EDGE]['final_return']['mean']:.0f} vs {agg[REFERENCE]['final_return']['mean']:.0f} "
            f"(p = {_p(c['final_p'])})")


VARIANT_COLUMNS = [
    ("variant", "l", "{variant}"), ("final return", "r", lambda a: _pm(a["final_return"], "{:.1f}")),
    ("mean return", "r", lambda a: _pm(a["mean_return"], "{:.1f}")), ("episodes", "r", "{episodes[mean]:.0f}"),
    ("alpha at the end", "r", lambda a: _pm(a["alpha_final"], "{:.3f}")),
    ("steps/s", "r", lambda a: _pm(a["sps"], "{:.1f}")),
    ("steps/s training", "r", lambda a: _pm(a["train_sps"], "{:.1f}")),
    ("wall (s)", "r", lambda a: _pm(a["wall_s"], "{:.0f}")), ("setup (s)", "r", lambda a: _pm(a["setup_s"], "{:.1f}")),
    ("peak RSS (MiB)", "r", lambda a: _pm(a["peak_rss_bytes"], "{:.0f}", 2**-20)),
    ("RSS at start of loop (MiB)", "r", lambda a: _pm(a["rss_ready_bytes"], "{:.0f}", 2**-20)),
    ("buffer (MiB)", "r", lambda a: f"{a['buffer_nbytes']['mean'] / 2**20:.0f}"),
    ("torch imported", "l", lambda a: "yes" if a["torch_imported"] else "no")]


def env_section(env_id, a, pngs) -> list[str]:
    agg, comps = a["agg"], a["comparisons"]
    n_seeds = max(x["final_return"]["n"] for x in agg.values())
    L = [f"## {env_id}\n",
         f"{n_seeds} seed(s) per variant, {a['total_steps']:,} environment steps each, learning from step "
         f"{a['learning_starts']:,} (training steps: {max(0, a['total_steps'] - a['learning_starts'] - 1):,}); "
         f"final return: the mean of the last {LAST_EPISODES} episodes.\n"]
    if env_id in BUDGETS and a["total_steps"] == ENVS[env_id]["steps"]:
        L.append(f"Budget: {BUDGETS[env_id]}.\n")
    if REFERENCE in agg:
        ms = agg[REFERENCE]["update_us_per_train_step"]["mean"] / 1e3
        L.append(f"A training step of `{REFERENCE}` took {ms:.1f} ms here: CleanRL's 1M steps would take "
                 f"{ms * 1e6 / 1e3 / 3600:.1f} h per run and seed.\n")
    if a["goals"]:
        L.append(f"### Targets on {env_id} (against CleanRL's torch loop)\n")
        L += table(a["goals"], [("target", "l", lambda x: x[0]),
                                ("met?", "l", lambda x: "n/a" if x[1] is None else "yes" if x[1] else "**no**"),
                                ("measured", "l", lambda x: x[2])])
        L.append("")
    L += [f"![{p}]({p})\n" for p in pngs]
    L.append("### Every variant (mean ± std over seeds)\n")
    recs = [{"variant": v, **x} for v, x in agg.items()]
    L += table(recs, VARIANT_COLUMNS, empty="  ")
    L.append("")
    L.append("Where the time goes: µs per environment step by section, whole run (share of the loop's wall "
             "clock), mean over seeds:\n")
    L += table(recs, [("variant", "l", "{variant}")]
               + [(k, "r", partial(lambda x, k: f"{x['sections_us'][k]['mean']:.1f} "
                                                f"({100 * x['sections_share'][k]['mean']:.1f}%)", k=k)) for k in SECTIONS]
               + [("total", "r", lambda x: f"{1e6 / x['sps']['mean']:.0f}"),
                  ("bare env.step loop", "r", "{bare_env_us[mean]:.1f}"),
                  ("buffer share", "r", lambda x: f"{100 * x['buffer_share']['mean']:.1f}%"),
                  ("Amdahl bound", "r", lambda x: f"{x['amdahl_bound']['mean']:.3f}x")])
    L.append("")
    x0 = next(iter(agg.values()))
    L.append(f"The training step against a bare BLAS floor: the products of the hidden layers that a training "
             f"step needs on average ({x0['blas_products']:g} per step: a critic update, an actor update and a "
             f"temperature update, whose draw gives the next actor update its forward pass; {x0['blas_gflop']:.3f} "
             f"of the step's {x0['blas_gflop_step']:.3f} GFLOP) as float32 `np.matmul` calls into preallocated "
             "outputs, one thread, nothing else:\n")
    L += table(recs, [("variant", "l", "{variant}"),
                      ("update µs per training step", "r", lambda x: _pm(x["update_us_per_train_step"])),
                      ("sample µs per training step", "r", lambda x: _pm(x["sample_us_per_train_step"], "{:.1f}")),
                      ("add µs per step", "r", lambda x: _pm(x["buffer_add_us"], "{:.2f}")),
                      ("BLAS floor µs", "r", lambda x: _pm(x["blas_floor_us"])),
                      ("update / floor", "r", lambda x: _pm(x["update_over_blas"], "{:.2f}"))])
    L.append("")
    L.append(f"### Comparisons on {env_id}\n")
    L += table(comps, [("variant", "l", "{variant}"), ("against", "l", "{against}"),
                       ("final return diff", "r", "{final_diff:+.1f}"), ("p", "r", lambda c: _p(c["final_p"])),
                       ("mean return diff", "r", "{mean_diff:+.1f}"), ("p", "r", lambda c: _p(c["mean_p"])),
                       ("steps/s ratio", "r", "{sps_ratio:.2f}"),
                       ("per seed", "r", lambda c: _range(c["sps_ratio_per_seed"])),
                       ("training steps/s ratio", "r", lambda c: "n/a" if c["train_sps_ratio"] is None
                        else f"{c['train_sps_ratio']:.2f}"),
                       ("peak RSS ratio", "r", "{peak_rss_ratio:.2f}")])
    L.append("")
    return L


def write_report(res, analysis, pngs) -> None:
    run = res["methodology"]
    L = ["# SAC on continuous control: tfdata's replay buffer and a torch-free SAC against CleanRL\n",
         f"Made by `experiments/sac_continuous.py` ({run['mode']} run, command `{run['command']}`, "
         f"{run['wall_clock_s']:.0f} s of wall clock in all, {run['wall_clock_s'] / 60:.1f} min). Raw numbers "
         "and every episode: `results.json`.\n"]
    hl = headline(analysis)
    if hl:
        L.append(f"<!-- headline: {hl} -->\n")
    L += hand_written(OUT_DIR, "findings")
    for env_id, a in analysis.items():
        L += env_section(env_id, a, pngs[env_id])
    L.append("Sections: " + "; ".join(f"`{k}`: {SECTION_HELP[k]}" for k in SECTIONS) + ".\n")
    L += hand_written(OUT_DIR, "method")
    write_methodology_report(OUT_DIR, L, run)


def render(res: dict) -> list[str]:
    """README.md and the plots from a results.json (its raw runs); returns the plots' names."""
    os.makedirs(OUT_DIR, exist_ok=True)
    analysis = analyse(res["raw"])
    pngs = {env_id: plot(env_id, a) for env_id, a in analysis.items()}
    names = [p for ps in pngs.values() for p in ps]
    drop_stale_plots(OUT_DIR, names)
    write_report(res, analysis, pngs)
    return names


def publish(runs, run, versions) -> dict:
    """results.json from the raw runs, then the report from it."""
    analysis = analyse(runs)
    res = {"methodology": run, "versions": versions,
           "envs": {env_id: {"summary": {v: {k: x for k, x in s.items() if k not in ("curve_mean", "curve_std")}
                                         for v, s in a["agg"].items()},
                             "curves": {v: {"mean": s["curve_mean"], "std": s["curve_std"]} for v, s in a["agg"].items()},
                             "comparisons": a["comparisons"], "goals": a["goals"]}
                    for env_id, a in analysis.items()},
           "raw": runs}
    path = os.path.join(OUT_DIR, "results.json")
    write_json(path, res)
    with open(path, encoding="utf-8") as f:
        render(json.load(f))
    return res


def plan(args, mode) -> dict:
    """Environment -> steps, learning_starts and seeds of this run, from the mode and the options."""
    base = QUICK if mode == "quick" else ENVS
    envs = args.envs or list(base)
    unknown = [e for e in envs if e not in ENVS]
    if unknown:
        raise SystemExit(f"unknown environments {unknown}; known: {list(ENVS)}")
    out = {}
    for e in envs:
        p = dict(ENVS[e], **base.get(e, {}))
        if args.steps is not None:
            p["steps"] = args.steps
        if args.learning_starts is not None:
            p["learning_starts"] = args.learning_starts
        if args.seeds is not None:
            p["seeds"] = list(args.seeds)
        if p["steps"] <= p["learning_starts"] + 1 or p["learning_starts"] < HP["batch_size"]:
            raise SystemExit(f"{e}: need batch_size ({HP['batch_size']}) <= learning_starts < steps - 1, got "
                             f"learning_starts {p['learning_starts']}, steps {p['steps']}")
        out[e] = {k: p[k] for k in ("steps", "learning_starts", "seeds")}
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help=f"Pendulum-v1 only, 1 seed, {QUICK['Pendulum-v1']['steps']:,} steps (under 2 minutes)")
    ap.add_argument("--seeds", type=int, nargs="*", default=None, help="seeds (every environment)")
    ap.add_argument("--steps", type=int, default=None, help="environment steps per run (every environment)")
    ap.add_argument("--learning-starts", type=int, default=None)
    ap.add_argument("--envs", nargs="*", default=None, help=f"subset of: {', '.join(ENVS)}")
    ap.add_argument("--variants", nargs="*", default=None, help=f"subset of: {', '.join(VARIANTS)}")
    ap.add_argument("--render", default=None, metavar="RESULTS_JSON",
                    help="rewrite the report and plots from a results.json (no runs)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--env", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.render:
        with open(args.render, encoding="utf-8") as f:
            render(json.load(f))
        print(f"report rewritten: {os.path.relpath(OUT_DIR)}/README.md", flush=True)
        return
    if args.worker:
        r = run_worker(args.worker, args.seed, args.env, args.steps, args.learning_starts)
        print("RESULT " + json.dumps(r), flush=True)
        return
    mode = "quick" if args.quick else "full"
    variants = args.variants or list(VARIANTS)
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    todo = plan(args, mode)
    # one thread for torch's intra-op pool, OpenMP and numpy's BLAS in every worker
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    os.makedirs(OUT_DIR, exist_ok=True)
    given = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["python experiments/sac_continuous.py", *given])
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=sorted({s for p in todo.values() for s in p["seeds"]}),
                    command=command, parameters={"hyperparameters": HP, "envs": todo, "variants": variants,
                                                 "targets": TARGETS, "last_episodes": LAST_EPISODES,
                                                 "bare_env_steps": BARE_ENV_STEPS})
    log = lambda s: print(s, flush=True)  # noqa: E731
    runs = []
    for env_id, p in todo.items():
        # numba's on-disk cache filled before anything is measured (a run after a kernel edit would
        # otherwise compile in its setup and carry LLVM's memory in its peak RSS): a short run of
        # each tfdata variant in its own process, not recorded
        warm = [v for v in variants if VARIANTS[v][1] == "tfdata"]
        if warm:
            n = HP["batch_size"] + 4
            run_in_fresh_processes(__file__, warm, p["seeds"][:1], ["--env", env_id, "--steps", str(n + 8),
                                                                    "--learning-starts", str(n)],
                                   timeout_s=TIMEOUT_S, describe=lambda r: "cache warm-up", log=lambda s: None)
        runs += run_env(env_id, variants, p["seeds"], p["steps"], p["learning_starts"], log)
    run = rec.finish(child_peak_rss_bytes=max(r["peak_rss_bytes"] for r in runs))
    versions = {}
    for r in runs:
        versions.update(r["versions"])
    publish(runs, run, versions)
    print(f"{mode} run {rec.run_name} done in {run['wall_clock_s']:.0f} s; report: "
          f"{os.path.relpath(OUT_DIR)}/README.md", flush=True)


if __name__ == "__main__":
    main()
