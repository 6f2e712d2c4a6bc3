"""tfdata inside Stable-Baselines3: does the drop-in replay buffer keep SB3's speed and learning, and
how much memory does it save on Atari?

``tfdata.sb3.ReplayBuffer`` is a subclass of SB3's ``ReplayBuffer`` that SB3's algorithms take through
``replay_buffer_class=``. Three studies, each arm (SB3's own buffer or the drop-in) in fresh processes:

1. **SB3's algorithms, everything else identical.** ``DQN`` on ``CartPole-v1`` (rl-baselines3-zoo's
   hyperparameters and budget) and ``SAC`` on ``Pendulum-v1`` (the zoo's hyperparameters, half its
   budget: :data:`TASKS` says why), 3 seeds, with SB3's ``ReplayBuffer`` and with the drop-in: steps
   per second of ``learn``, peak RSS, returns (final and the curve), and the buffer's share of an SB3
   step: the buffer's ``add`` and ``sample`` are wrapped with ``perf_counter`` accumulators in both
   arms, and their time is divided by ``learn``'s. Target: the drop-in at least 1.0x SB3's steps per
   second.
2. **Atari.** SB3's ``DQN`` on Breakout (the game ``experiments/atari_frames.py`` checks first)
   through ``make_atari_env`` + ``VecFrameStack(4)``, rl-baselines3-zoo's Atari hyperparameters, with
   the buffer sizes SB3 users want (1M) and the ones they settle for (100k): bytes per transition
   planned (SB3 with ``optimize_memory_usage`` off and on, from its arrays' shapes: nothing is
   allocated; tfdata from the drop-in's ``nbytes``), peak RSS and steps per second over a fixed budget
   that trains (``learning_starts`` below it). An arm whose planned bytes do not fit this machine's RAM
   is not run, and the report says so. Target: 1M transitions in at most 1.05x the bytes of one 84x84
   frame plus the small fields. And exactness: in a run of 4 environments, every batch SB3's agent
   trains on (and more drawn at the end) is checked against the transitions the environments produced
   (the stacks SB3 passed to ``add``, with the terminal observation at episode ends): both stacks bit
   for bit, then action, reward and done.
3. **CleanRL's scripts**, which build SB3's ``ReplayBuffer`` themselves: a CleanRL-style DQN loop on
   CartPole (``cleanrl/dqn.py``: its network, hyperparameters and loop, torch) that runs with either
   class by changing its import line; the lines to change in ``dqn.py``, ``dqn_atari.py`` and
   ``sac_continuous_action.py`` are listed in the report (:data:`CLEANRL_CHANGES`).

Every (arm, seed) runs in a fresh process (its own peak memory as ``VmHWM``), the arms alternating seed
by seed, one thread for torch, OpenMP and BLAS. numba's kernel cache is filled by an unrecorded run
first.

    python experiments/sb3_buffers.py --quick    # 1 seed, tiny budgets, Atari 100k only: 1-3 minutes
    python experiments/sb3_buffers.py            # 3 seeds, the budgets below: about 30-40 minutes
    python experiments/sb3_buffers.py --parts atari   # one study (classic, atari, cleanrl)
    python experiments/sb3_buffers.py --render reports/sb3/results.json   # the report again, no runs

Needs the ``sb3`` and ``atari`` extras (stable-baselines3, torch 2.13.0 CPU, gymnasium, ale-py).
Writes ``reports/sb3/`` (README.md, results.json, learning.png, speed.png, atari_memory.png).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from functools import partial

import numpy as np

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
from _plots import hbar_values, learning_curves, panels_figure  # noqa: E402
from _recording import RunRecord, drop_stale_plots, parse_seeds, report_dir, write_json  # noqa: E402
from _render import fmt_bytes, hand_written, md_table, p_value as _p, pm as _pm  # noqa: E402
from _render import write_report as write_methodology_report  # noqa: E402
from _stats import permutation_test, return_curve, seed_curves, summary as _ms  # noqa: E402
from _timing import peak_rss_hwm as _peak_rss, rss_statm as _rss_now, run_in_fresh_processes  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "sb3"
OUT_DIR = report_dir(EXPERIMENT)
ARMS = ("sb3", "tfdata")                 # SB3's ReplayBuffer, tfdata.sb3.ReplayBuffer
MODES = ("full", "quick")
PARTS = ("classic", "atari", "cleanrl")
SEEDS = {"full": 3, "quick": 1}
TASKS = {
    # rl-baselines3-zoo (hyperparams/dqn.yml CartPole-v1, hyperparams/sac.yml Pendulum-v1); the rest
    # SB3's defaults
    "dqn-cartpole": {
        "algo": "DQN", "env": "CartPole-v1",
        "hp": {"learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000, "gamma": 0.99,
               "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128,
               "exploration_fraction": 0.16, "exploration_final_eps": 0.04,
               "policy_kwargs": {"net_arch": [256, 256]}},
        "steps": {"full": 50_000, "quick": 3_000}, "learning_starts": {"full": 1_000, "quick": 1_000},
        "budget": "50,000 steps: rl-baselines3-zoo's n_timesteps for DQN on CartPole-v1"},
    "sac-pendulum": {
        "algo": "SAC", "env": "Pendulum-v1", "hp": {"learning_rate": 1e-3},
        "steps": {"full": 10_000, "quick": 600}, "learning_starts": {"full": 100, "quick": 100},
        "budget": "10,000 steps, half of rl-baselines3-zoo's 20,000 for SAC on Pendulum-v1 (SAC learns "
                  "Pendulum within it): a training step takes about 10 ms here, and the whole run must "
                  "stay within 30-45 minutes of a shared 2-core machine"},
}
# CleanRL's dqn.py defaults (github.com/vwxyzjn/cleanrl, cleanrl/dqn.py, class Args) but the budget
CLEANRL_HP = {"learning_rate": 2.5e-4, "buffer_size": 10_000, "gamma": 0.99, "tau": 1.0,
              "target_network_frequency": 500, "batch_size": 128, "start_e": 1.0, "end_e": 0.05,
              "exploration_fraction": 0.5, "train_frequency": 10, "hidden": (120, 84)}
CLEANRL = {"env": "CartPole-v1", "steps": {"full": 100_000, "quick": 5_000},
           "learning_starts": {"full": 10_000, "quick": 1_000},
           "budget": "100,000 steps (CleanRL runs 500,000), CleanRL's learning_starts (10,000) kept: "
                     "the loop's speed and that it learns, not CleanRL's final scores"}
# the lines to change in CleanRL's scripts (github.com/vwxyzjn/cleanrl, cleanrl/<script>): (removed,
# added); the CartPole loop below runs the first change
CLEANRL_CHANGES = {
    "dqn.py": [("from stable_baselines3.common.buffers import ReplayBuffer",
                "from tfdata.sb3 import ReplayBuffer")],
    "sac_continuous_action.py": [("from stable_baselines3.common.buffers import ReplayBuffer",
                                  "from tfdata.sb3 import ReplayBuffer")],
    # CleanRL's FrameStack pads an episode's first stacks with copies of its first frame:
    # frame_padding="reset" takes them, one frame per transition (tests/test_sb3.py runs
    # dqn_atari.py's make_env and loop against SB3's buffer)
    "dqn_atari.py": [("from stable_baselines3.common.buffers import ReplayBuffer",
                      "from tfdata.sb3 import ReplayBuffer"),
                     ("        handle_timeout_termination=False,",
                      "        handle_timeout_termination=False, frame_stack=4, frame_padding=\"reset\",")],
}
# Atari: the game experiments/atari_frames.py checks first, as SB3's zoo names it (frame skip 4 in
# AtariWrapper, no sticky actions); rl-baselines3-zoo's hyperparameters (hyperparams/dqn.yml, atari)
ATARI_ENV = "BreakoutNoFrameskip-v4"
ATARI_HP = {"learning_rate": 1e-4, "batch_size": 32, "train_freq": 4, "gradient_steps": 1,
            "target_update_interval": 1000, "exploration_fraction": 0.1, "exploration_final_eps": 0.01}
ATARI_SIZES = {"full": (1_000_000, 100_000), "quick": (100_000,)}
ATARI_STEPS = {"full": 4_000, "quick": 600}
ATARI_STARTS = {"full": 2_000, "quick": 300}
ATARI_ARMS = ("sb3", "sb3-optimized", "tfdata")
FRAME_STACK = 4
FRAME_BYTES = 84 * 84
SMALL_BYTES = 8 + 4 + 1 + 1              # action, reward, terminated, truncated
ONE_FRAME_ROW = FRAME_BYTES + SMALL_BYTES
TARGET_MEMORY = 1.05                     # bytes per transition / ONE_FRAME_ROW
TARGET_SPS = 1.0                         # drop-in steps/s / SB3's
RAM_HEADROOM = 1.1                       # an arm runs when planned bytes x this fit the machine's RAM
# the exactness check: 4 environments into a small ring that wraps
CHECK = {"n_envs": 4, "buffer_size": 2_000, "steps": {"full": 4_000, "quick": 800},
         "learning_starts": {"full": 1_000, "quick": 400}, "extra_batches": {"full": 200, "quick": 20}}
LAST_EPISODES = 10                        # final return = mean of the last 10 episodes
CURVE_BINS = 25
TIMEOUT_S = 3600


# ---------------------------------------------------------------------------------------------
# Measuring a buffer inside SB3
# ---------------------------------------------------------------------------------------------
class Timed:
    """Time spent inside a buffer's ``add`` and ``sample``: both wrapped by instance attributes
    (the same wrapper in every arm), their calls counted.

    Parameters
    ----------
    rb : stable_baselines3.common.buffers.ReplayBuffer
        Its ``add`` and ``sample`` are replaced by timed calls of the originals.
    """

    def __init__(self, rb):
        self.add_ns = self.sample_ns = self.adds = self.samples = self.add_max_ns = self.sample_max_ns = 0
        add, sample, pc = rb.add, rb.sample, time.perf_counter_ns

        def timed_add(*args, **kwargs):
            t = pc()
            add(*args, **kwargs)
            d = pc() - t
            self.add_ns += d
            self.adds += 1
            if d > self.add_max_ns:  # the slowest call: the first, which loads the kernels
                self.add_max_ns = d

        def timed_sample(*args, **kwargs):
            t = pc()
            out = sample(*args, **kwargs)
            d = pc() - t
            self.sample_ns += d
            self.samples += 1
            if d > self.sample_max_ns:
                self.sample_max_ns = d
            return out

        rb.add, rb.sample = timed_add, timed_sample

    def result(self, wall_s: float) -> dict:
        busy = (self.add_ns + self.sample_ns) / 1e9
        return {"add_s": self.add_ns / 1e9, "sample_s": self.sample_ns / 1e9, "adds": self.adds,
                "samples": self.samples, "add_us": self.add_ns / 1e3 / max(1, self.adds),
                "sample_us": self.sample_ns / 1e3 / max(1, self.samples), "buffer_share": busy / wall_s,
                "slowest_add_ms": self.add_max_ns / 1e6, "slowest_sample_ms": self.sample_max_ns / 1e6}


def episode_callback(episodes: list):
    """An SB3 callback appending ``(step, return, length)`` of every finished episode (Monitor's
    ``info["episode"]``) to ``episodes``."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Episodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                ep = info.get("episode")
                if ep is not None:
                    episodes.append((self.num_timesteps, float(ep["r"]), int(ep["l"])))
            return True

    return Episodes()


def buffer_nbytes(rb) -> int:
    """Bytes a buffer holds: the drop-in's ``nbytes``; SB3's numpy arrays."""
    if hasattr(rb, "nbytes"):
        return int(rb.nbytes)
    return int(sum(v.nbytes for v in vars(rb).values() if isinstance(v, np.ndarray)))


def _setup(threads: int = 1):
    import torch

    torch.set_num_threads(threads)
    import gymnasium as gym
    import stable_baselines3

    versions = {"torch": torch.__version__, "gymnasium": gym.__version__,
                "stable_baselines3": stable_baselines3.__version__, "numpy": np.__version__}
    try:
        import tfdata

        versions["tfdata"] = tfdata.__version__
    except ImportError:
        pass
    return versions


def buffer_args(arm: str, **kwargs) -> dict:
    """The algorithm's buffer arguments of an arm: nothing for SB3's own buffer, the drop-in's class
    and its ``replay_buffer_kwargs`` for tfdata's."""
    if arm == "tfdata":
        import tfdata.sb3

        return {"replay_buffer_class": tfdata.sb3.ReplayBuffer, "replay_buffer_kwargs": kwargs}
    return {}


def _finish(r: dict, t_start: float, load_start) -> dict:
    r.update(peak_rss_bytes=_peak_rss(), process_wall_s=time.perf_counter() - t_start, load_start=load_start,
             load_end=[round(x, 2) for x in os.getloadavg()])
    return r


# ---------------------------------------------------------------------------------------------
# 1. SB3's DQN and SAC (runs in a worker process)
# ---------------------------------------------------------------------------------------------
def classic_worker(task: str, arm: str, seed: int, mode: str) -> dict:
    t_start, load_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    versions = _setup()
    import stable_baselines3 as sb3

    t = TASKS[task]
    total, starts = t["steps"][mode], t["learning_starts"][mode]
    rss0 = _rss_now()
    model = getattr(sb3, t["algo"])("MlpPolicy", t["env"], learning_starts=starts, seed=seed, device="cpu",
                                    verbose=0, **t["hp"], **buffer_args(arm, seed=seed))
    timed = Timed(model.replay_buffer)
    episodes: list = []
    rss_ready = _rss_now()
    t0 = time.perf_counter()
    model.learn(total, callback=episode_callback(episodes))
    wall = time.perf_counter() - t0
    last = [e[1] for e in episodes[-LAST_EPISODES:]]
    return _finish({"study": "classic", "task": task, "arm": arm, "seed": seed, "total_steps": total,
                    "learning_starts": starts, "learn_s": wall, "sps": total / wall, **timed.result(wall),
                    "episodes": episodes, "final_return": float(np.mean(last)) if last else None,
                    "mean_return": float(np.mean([e[1] for e in episodes])) if episodes else None,
                    "rss_before_model_bytes": rss0, "rss_ready_bytes": rss_ready,
                    "buffer_class": type(model.replay_buffer).__module__ + "." + type(model.replay_buffer).__name__,
                    "buffer_nbytes": buffer_nbytes(model.replay_buffer), "versions": versions},
                   t_start, load_start)


# ---------------------------------------------------------------------------------------------
# 2. Atari (planning in the parent; runs and the exactness check in worker processes)
# ---------------------------------------------------------------------------------------------
def sb3_bytes_per_row(optimized: bool, obs_shape=(FRAME_STACK, 84, 84), obs_itemsize: int = 1,
                      action_dim: int = 1, action_itemsize: int = 8) -> int:
    """Bytes per transition of SB3's ``ReplayBuffer`` from the shapes of its arrays (nothing
    allocated): ``observations`` and, unless ``optimize_memory_usage``, ``next_observations`` of
    ``obs_shape``; ``actions`` (``action_dim``, int64 for a ``Discrete`` space); ``rewards``,
    ``dones`` and ``timeouts`` (float32 each). The Atari runs check it against the arrays SB3 built."""
    obs = int(np.prod(obs_shape)) * obs_itemsize
    return obs * (1 if optimized else 2) + action_dim * action_itemsize + 3 * 4


def make_atari(n_envs: int, seed: int):
    """SB3's Atari pipeline: ``make_atari_env`` (Monitor, AtariWrapper: no-op starts, frame skip 4,
    84x84 grey, a life lost ends the agent's episode, rewards clipped) and ``VecFrameStack(4)``
    (padded with zeros after a reset); DQN adds ``VecTransposeImage`` (channels first)."""
    import ale_py
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    return VecFrameStack(make_atari_env(ATARI_ENV, n_envs=n_envs, seed=seed), n_stack=FRAME_STACK), ale_py.__version__


def atari_model(arm: str, env, size: int, starts: int, seed: int):
    from stable_baselines3 import DQN

    kw = {"optimize_memory_usage": True, "replay_buffer_kwargs": {"handle_timeout_termination": False}} \
        if arm == "sb3-optimized" else buffer_args(arm, frame_stack=FRAME_STACK, seed=seed)
    return DQN("CnnPolicy", env, buffer_size=size, learning_starts=starts, seed=seed, device="cpu", verbose=0,
               **ATARI_HP, **kw)


def atari_worker(arm: str, size: int, seed: int, mode: str) -> dict:
    t_start, load_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    versions = _setup()
    env, versions["ale_py"] = make_atari(1, seed)
    total, starts = ATARI_STEPS[mode], ATARI_STARTS[mode]
    rss0 = _rss_now()
    model = atari_model(arm, env, size, starts, seed)
    rb = model.replay_buffer
    rss_ready = _rss_now()
    timed = Timed(rb)
    episodes: list = []
    t0 = time.perf_counter()
    model.learn(total, callback=episode_callback(episodes))
    wall = time.perf_counter() - t0
    nbytes = buffer_nbytes(rb)
    r = {"study": "atari", "task": f"atari-{size}", "arm": arm, "size": size, "seed": seed, "total_steps": total,
         "learning_starts": starts, "learn_s": wall, "sps": total / wall, **timed.result(wall),
         "episodes": episodes, "rss_before_model_bytes": rss0, "rss_ready_bytes": rss_ready,
         "buffer_nbytes": nbytes, "bytes_per_transition": nbytes / size, "obs_shape": list(rb.obs_shape),
         "versions": versions}
    if arm != "tfdata":  # the planned bytes are SB3's arrays
        r["planned_bytes_per_row"] = sb3_bytes_per_row(arm == "sb3-optimized", rb.obs_shape)
    return _finish(r, t_start, load_start)


def _key(obs, next_obs) -> bytes:
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    h.update(np.ascontiguousarray(obs).tobytes())
    h.update(np.ascontiguousarray(next_obs).tobytes())
    return h.digest()


class StackCheck:
    """Every transition SB3 hands the buffer (``add``: obs and next_obs stacks, action, reward, done as
    SB3 stores it), and every batch the buffer returns checked against them: both stacks of each row
    bit for bit (the dtype included), then its action, reward and done."""

    def __init__(self, rb, n_envs: int):
        self.seen: dict = {}
        self.batches = self.rows = self.stack_mismatches = self.field_mismatches = self.padded_rows = 0
        self.adds = self.episode_ends = 0
        add, sample = rb.add, rb.sample
        handle_timeout = bool(getattr(rb, "handle_timeout_termination", False))

        def checked_add(obs, next_obs, action, reward, done, infos):
            for i in range(n_envs):
                timeout = handle_timeout and infos[i].get("TimeLimit.truncated", False)
                d = float(np.float32(done[i]) * (1 - np.float32(timeout)))
                self.seen.setdefault(_key(obs[i], next_obs[i]), set()).add(
                    (int(np.asarray(action[i]).ravel()[0]), float(np.float32(reward[i])), d))
                self.episode_ends += bool(done[i])
            self.adds += 1
            add(obs, next_obs, action, reward, done, infos)

        def checked_sample(batch_size, env=None):
            b = sample(batch_size, env=env)
            self.check(b)
            return b

        rb.add, rb.sample = checked_add, checked_sample
        self.sample = checked_sample

    def check(self, b) -> None:
        obs, nxt = b.observations.numpy(), b.next_observations.numpy()
        act, rew, done = b.actions.numpy().reshape(len(obs), -1), b.rewards.numpy().ravel(), b.dones.numpy().ravel()
        self.batches += 1
        for i in range(len(obs)):
            self.rows += 1
            self.padded_rows += bool(not obs[i][0].any())
            small = self.seen.get(_key(obs[i], nxt[i]))
            if small is None or obs.dtype != np.uint8:
                self.stack_mismatches += 1
            elif (int(act[i, 0]), float(np.float32(rew[i])), float(done[i])) not in small:
                self.field_mismatches += 1

    def result(self) -> dict:
        return {"batches": self.batches, "rows": self.rows, "stack_mismatches": self.stack_mismatches,
                "field_mismatches": self.field_mismatches, "rows_with_zero_padding": self.padded_rows,
                "distinct_transitions": len(self.seen), "add_calls": self.adds, "episode_ends": self.episode_ends}


def check_worker(arm: str, seed: int, mode: str) -> dict:
    t_start, load_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    versions = _setup()
    n_envs = CHECK["n_envs"]
    env, versions["ale_py"] = make_atari(n_envs, seed)
    model = atari_model(arm, env, CHECK["buffer_size"], CHECK["learning_starts"][mode], seed)
    chk = StackCheck(model.replay_buffer, n_envs)
    t0 = time.perf_counter()
    model.learn(CHECK["steps"][mode])
    in_training = chk.batches
    for _ in range(CHECK["extra_batches"][mode]):
        chk.sample(ATARI_HP["batch_size"])
    return _finish({"study": "check", "task": "atari-check", "arm": arm, "seed": seed, "n_envs": n_envs,
                    "buffer_size": CHECK["buffer_size"], "total_steps": CHECK["steps"][mode],
                    "learning_starts": CHECK["learning_starts"][mode], "learn_s": time.perf_counter() - t0,
                    "batches_in_training": in_training, **chk.result(), "versions": versions}, t_start, load_start)


# ---------------------------------------------------------------------------------------------
# 3. A CleanRL-style DQN loop (runs in a worker process)
# ---------------------------------------------------------------------------------------------
def cleanrl_dqn(arm: str, seed: int, mode: str) -> dict:
    """CleanRL's ``dqn.py`` on CartPole-v1: its QNetwork, epsilon schedule and loop; the buffer built by
    CleanRL's own line, the class chosen by the import (:data:`CLEANRL_CHANGES`)."""
    t_start, load_start = time.perf_counter(), [round(x, 2) for x in os.getloadavg()]
    versions = _setup()
    import gymnasium as gym
    import torch
    import torch.nn.functional as F
    from torch import nn

    if arm == "sb3":
        from stable_baselines3.common.buffers import ReplayBuffer
    else:
        from tfdata.sb3 import ReplayBuffer
    args = dict(CLEANRL_HP, total_timesteps=CLEANRL["steps"][mode], learning_starts=CLEANRL["learning_starts"][mode])
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    device = torch.device("cpu")

    def make_env():
        env = gym.wrappers.RecordEpisodeStatistics(gym.make(CLEANRL["env"]))
        env.action_space.seed(seed)
        return env

    # gymnasium 0.29's same-step reset, which CleanRL's loop was written for
    envs = gym.vector.SyncVectorEnv([make_env], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)

    class QNetwork(nn.Module):
        def __init__(self, env):
            super().__init__()
            h1, h2 = args["hidden"]
            self.network = nn.Sequential(nn.Linear(int(np.prod(env.single_observation_space.shape)), h1), nn.ReLU(),
                                         nn.Linear(h1, h2), nn.ReLU(), nn.Linear(h2, env.single_action_space.n))

        def forward(self, x):
            return self.network(x)

    def linear_schedule(start_e, end_e, duration, t):
        return max(end_e, start_e + (end_e - start_e) / duration * t)

    q_network = QNetwork(envs).to(device)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args["learning_rate"])
    target_network = QNetwork(envs).to(device)
    target_network.load_state_dict(q_network.state_dict())
    rss_ready = _rss_now()
    rb = ReplayBuffer(args["buffer_size"], envs.single_observation_space, envs.single_action_space, device,
                      handle_timeout_termination=False)
    timed = Timed(rb)
    episodes = []
    t0 = time.perf_counter()
    obs, _ = envs.reset(seed=seed)
    for global_step in range(args["total_timesteps"]):
        epsilon = linear_schedule(args["start_e"], args["end_e"], args["exploration_fraction"] * args["total_timesteps"],
                                  global_step)
        if random.random() < epsilon:
            actions = np.array([envs.single_action_space.sample() for _ in range(envs.num_envs)])
        else:
            q_values = q_network(torch.Tensor(obs).to(device))
            actions = torch.argmax(q_values, dim=1).cpu().numpy()
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        fi = infos.get("final_info")
        if fi and "_episode" in fi:
            for e in np.flatnonzero(fi["_episode"]):
                episodes.append((global_step, float(fi["episode"]["r"][e]), int(fi["episode"]["l"][e])))
        real_next_obs = next_obs.copy()
        for idx, trunc in enumerate(truncations):
            if trunc:
                real_next_obs[idx] = infos["final_obs"][idx]
        rb.add(obs, real_next_obs, actions, rewards, terminations, infos)
        obs = next_obs
        if global_step > args["learning_starts"]:
            if global_step % args["train_frequency"] == 0:
                data = rb.sample(args["batch_size"])
                with torch.no_grad():
                    target_max, _ = target_network(data.next_observations).max(dim=1)
                    td_target = data.rewards.flatten() + args["gamma"] * target_max * (1 - data.dones.flatten())
                old_val = q_network(data.observations).gather(1, data.actions).squeeze()
                loss = F.mse_loss(td_target, old_val)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if global_step % args["target_network_frequency"] == 0:
                for tp, qp in zip(target_network.parameters(), q_network.parameters()):
                    tp.data.copy_(args["tau"] * qp.data + (1.0 - args["tau"]) * tp.data)
    wall = time.perf_counter() - t0
    total = args["total_timesteps"]
    last = [e[1] for e in episodes[-LAST_EPISODES:]]
    return _finish({"study": "cleanrl", "task": "cleanrl-dqn", "arm": arm, "seed": seed, "total_steps": total,
                    "learning_starts": args["learning_starts"], "learn_s": wall, "sps": total / wall,
                    **timed.result(wall), "episodes": episodes,
                    "final_return": float(np.mean(last)) if last else None,
                    "mean_return": float(np.mean([e[1] for e in episodes])) if episodes else None,
                    "rss_ready_bytes": rss_ready, "buffer_class": f"{ReplayBuffer.__module__}.{ReplayBuffer.__name__}",
                    "buffer_nbytes": buffer_nbytes(rb), "versions": versions}, t_start, load_start)


def warmup_worker() -> dict:
    """Fill numba's kernel cache for the spaces the runs use (CartPole, Pendulum, Atari stacks): a few
    rows added to the drop-in and sampled. Not recorded."""
    _setup()
    import gymnasium as gym
    import tfdata.sb3

    spaces = [(gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2), {}),
              (gym.spaces.Box(-8.0, 8.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32), {}),
              (gym.spaces.Box(0, 255, (FRAME_STACK, 84, 84), np.uint8), gym.spaces.Discrete(4),
               {"frame_stack": FRAME_STACK})]
    for obs_space, act_space, kw in spaces:
        for n_envs in (1, CHECK["n_envs"]):
            rb = tfdata.sb3.ReplayBuffer(256, obs_space, act_space, device="cpu", n_envs=n_envs, **kw)
            o = np.zeros((n_envs, *obs_space.shape), obs_space.dtype)
            a = np.array([act_space.sample() for _ in range(n_envs)])
            for _ in range(8):
                rb.add(o, o, a, np.zeros(n_envs, np.float32), np.zeros(n_envs, bool), [{} for _ in range(n_envs)])
            rb.sample(4)
    return {"study": "warmup"}


def run_worker(variant: str, seed: int, mode: str) -> dict:
    """One run named ``study:task:arm``; a run that raises is recorded with its error (the report
    lists it) instead of ending the experiment."""
    study, task, arm = variant.split(":")
    try:
        return _run_worker(study, task, arm, seed, mode)
    except Exception as exc:
        import traceback

        return {"study": study, "task": task, "arm": arm, "seed": seed, "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-3000:], "peak_rss_bytes": _peak_rss(), "versions": {}}


def _run_worker(study: str, task: str, arm: str, seed: int, mode: str) -> dict:
    if study == "classic":
        return classic_worker(task, arm, seed, mode)
    if study == "atari":
        return atari_worker(arm, int(task.rsplit("-", 1)[1]), seed, mode)
    if study == "check":
        return check_worker(arm, seed, mode)
    if study == "cleanrl":
        return cleanrl_dqn(arm, seed, mode)
    return warmup_worker()


# ---------------------------------------------------------------------------------------------
# Planning and running (parent process)
# ---------------------------------------------------------------------------------------------
def ram_bytes() -> int:
    with open("/proc/meminfo") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("MemTotal"))


def atari_plan(mode: str, ram: int) -> list[dict]:
    """Per (size, arm): SB3's planned bytes from its arrays' shapes (tfdata's come from its run), and
    whether the arm runs: SB3's arms only where their planned bytes x RAM_HEADROOM fit ``ram``."""
    out = []
    for size in ATARI_SIZES[mode]:
        for arm in ATARI_ARMS:
            planned = sb3_bytes_per_row(arm == "sb3-optimized") * size if arm != "tfdata" else None
            fits = planned is None or planned * RAM_HEADROOM <= ram
            out.append({"size": size, "arm": arm, "planned_bytes": planned, "runs": fits,
                        "why_not": None if fits else f"planned {planned / 1e9:.1f} GB > this machine's "
                                                     f"{ram / 1e9:.1f} GB of RAM"})
    return out


def describe(r: dict) -> str:
    if "error" in r:
        return f"FAILED: {r['error'][:300]}"
    if r["study"] == "check":
        return (f"{r['rows']:,} rows checked, {r['stack_mismatches']} stack / {r['field_mismatches']} field "
                f"mismatches")
    ret = f", final return {r['final_return']:.1f}" if r.get("final_return") is not None else ""
    return (f"{r['sps']:.0f} steps/s, buffer share {100 * r['buffer_share']:.1f}%, peak RSS "
            f"{r['peak_rss_bytes'] / 2**20:.0f} MiB{ret}")


def run_all(mode: str, parts, seeds: list, plan: list, log) -> list[dict]:
    run = partial(run_in_fresh_processes, __file__, timeout_s=TIMEOUT_S, describe=describe, log=log)
    args = ["--mode", mode]
    if "tfdata" in ARMS:  # the kernel cache first: no run compiles in its setup
        run_in_fresh_processes(__file__, ["warmup:-:-"], [0], args, timeout_s=TIMEOUT_S, describe=lambda r: "",
                               log=lambda s: log("numba cache warmed up"))
    runs = []
    if "classic" in parts:
        for task in TASKS:
            runs += run([f"classic:{task}:{a}" for a in ARMS], seeds, args)
    if "cleanrl" in parts:
        runs += run([f"cleanrl:cleanrl-dqn:{a}" for a in ARMS], seeds, args)
    if "atari" in parts:
        runs += run([f"check:atari-check:{a}" for a in ARMS], seeds[:1], args)
        for size in ATARI_SIZES[mode]:
            arms = [p["arm"] for p in plan if p["size"] == size and p["runs"]]
            runs += run([f"atari:atari-{size}:{a}" for a in arms], seeds[:1], args)
    return runs


# ---------------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------------
def summarise(runs: list) -> dict:
    """Per task, per arm: mean ± std over seeds of every figure, the curve, and the comparison of the
    drop-in with SB3's buffer (per-seed steps/s ratios, permutation tests of the returns). Failed runs
    are left out (:func:`failures`)."""
    runs = [r for r in runs if "error" not in r]
    out = {}
    for task in dict.fromkeys(r["task"] for r in runs if r["study"] in ("classic", "cleanrl")):
        arms = {}
        for arm in ARMS:
            rs = sorted((r for r in runs if r["task"] == task and r["arm"] == arm), key=lambda r: r["seed"])
            if not rs:
                continue
            total = rs[0]["total_steps"]
            mean, std = seed_curves([r["episodes"] for r in rs], total, CURVE_BINS)
            arms[arm] = {k: _ms([r[k] for r in rs]) for k in
                         ("sps", "learn_s", "buffer_share", "add_us", "sample_us", "slowest_add_ms",
                          "slowest_sample_ms", "peak_rss_bytes", "final_return", "mean_return", "buffer_nbytes")}
            arms[arm].update(seeds=[r["seed"] for r in rs], total_steps=total, curve_mean=mean, curve_std=std,
                             buffer_class=rs[0]["buffer_class"], learning_starts=rs[0]["learning_starts"])
        comp = None
        if len(arms) == 2:
            by = {arm: {r["seed"]: r for r in runs if r["task"] == task and r["arm"] == arm} for arm in ARMS}
            common = sorted(set(by["sb3"]) & set(by["tfdata"]))
            ratios = [by["tfdata"][s]["sps"] / by["sb3"][s]["sps"] for s in common]
            rss = [by["tfdata"][s]["peak_rss_bytes"] / by["sb3"][s]["peak_rss_bytes"] for s in common]
            test = lambda k: (permutation_test([by["tfdata"][s][k] for s in common],  # noqa: E731
                                               [by["sb3"][s][k] for s in common]) if len(common) > 1 else None)
            comp = {"seeds": common, "sps_ratio": _ms(ratios, extremes=True), "sps_ratio_per_seed": ratios,
                    "peak_rss_ratio": _ms(rss), "final_diff": arms["tfdata"]["final_return"]["mean"]
                    - arms["sb3"]["final_return"]["mean"], "final_p": test("final_return"),
                    "mean_diff": arms["tfdata"]["mean_return"]["mean"] - arms["sb3"]["mean_return"]["mean"],
                    "mean_p": test("mean_return"), "target_sps": TARGET_SPS,
                    "met": bool(np.mean(ratios) >= TARGET_SPS)}
        out[task] = {"arms": arms, "comparison": comp}
    return out


def atari_summary(runs: list, plan: list, ram: int) -> dict:
    """The memory table (every size and arm, planned, measured where run) and the exactness checks."""
    runs = [r for r in runs if "error" not in r]
    rows = []
    for p in plan:
        r = next((x for x in runs if x["study"] == "atari" and x["size"] == p["size"] and x["arm"] == p["arm"]), None)
        planned = p["planned_bytes"] if p["planned_bytes"] is not None else (r["buffer_nbytes"] if r else None)
        row = {**p, "planned_bytes": planned,
               "bytes_per_transition": None if planned is None else planned / p["size"],
               "vs_one_frame": None if planned is None else planned / p["size"] / ONE_FRAME_ROW}
        if r is not None:
            row.update(sps=r["sps"], peak_rss_bytes=r["peak_rss_bytes"], rss_ready_bytes=r["rss_ready_bytes"],
                       rss_before_model_bytes=r["rss_before_model_bytes"], buffer_share=r["buffer_share"],
                       add_us=r["add_us"], sample_us=r["sample_us"], measured_buffer_nbytes=r["buffer_nbytes"],
                       planned_matches_arrays=(None if r.get("planned_bytes_per_row") is None else
                                               r["planned_bytes_per_row"] * p["size"] == r["buffer_nbytes"]),
                       total_steps=r["total_steps"], learning_starts=r["learning_starts"], samples=r["samples"])
        rows.append(row)
    checks = {r["arm"]: {k: v for k, v in r.items() if k not in ("versions",)} for r in runs if r["study"] == "check"}
    tf1m = next((x for x in rows if x["arm"] == "tfdata" and x["size"] == max(s["size"] for s in rows)), None)
    target = None
    if tf1m is not None and tf1m["vs_one_frame"] is not None:
        target = {"size": tf1m["size"], "vs_one_frame": tf1m["vs_one_frame"], "target": TARGET_MEMORY,
                  "met": tf1m["vs_one_frame"] <= TARGET_MEMORY, "bytes": tf1m["planned_bytes"],
                  "exact": bool(checks) and all(c["stack_mismatches"] == 0 and c["field_mismatches"] == 0
                                                for c in checks.values())}
    return {"ram_bytes": ram, "one_frame_row_bytes": ONE_FRAME_ROW, "rows": rows, "checks": checks, "target": target}


# ---------------------------------------------------------------------------------------------
# The report (README.md and plots from results.json: --render redoes it without running anything)
# ---------------------------------------------------------------------------------------------
TITLES = {"dqn-cartpole": "SB3 DQN on CartPole-v1", "sac-pendulum": "SB3 SAC on Pendulum-v1",
          "cleanrl-dqn": "CleanRL-style DQN on CartPole-v1"}
COLORS = {"sb3": "tab:blue", "sb3-optimized": "tab:cyan", "tfdata": "tab:orange"}
LABELS = {"sb3": "SB3 ReplayBuffer", "sb3-optimized": "SB3, optimize_memory_usage", "tfdata": "tfdata.sb3.ReplayBuffer"}


def plot(res: dict, out_dir: str) -> list[str]:
    pngs = []
    summ, at = res["summary"], res["atari"]
    if summ:
        panels = []
        for task, s in summ.items():
            total = next(iter(s["arms"].values()))["total_steps"]
            curves = {f"{LABELS[a]} ({len(x['seeds'])} seed{'s' * (len(x['seeds']) != 1)})":
                      (x["curve_mean"], x["curve_std"], {"color": COLORS[a], "lw": 1.4}, {"color": COLORS[a]})
                      for a, x in s["arms"].items()}
            panels.append(partial(learning_curves, x=return_curve([], total, CURVE_BINS)[0], curves=curves,
                                  title=TITLES[task]))
        pngs.append(panels_figure(out_dir, "learning.png", (5 * len(panels), 4.2), panels))
        labels = [f"{TITLES[t].split(' on ')[0]}: {a}" for t, s in summ.items() for a in s["arms"]]
        cells = [x for s in summ.values() for x in s["arms"].items()]
        colors = [COLORS[a] for a, _ in cells]
        pngs.append(panels_figure(out_dir, "speed.png", (14, 0.5 * len(labels) + 2), [
            partial(hbar_values, labels=labels, values=[x["sps"]["mean"] for _, x in cells],
                    xerr=[x["sps"]["std"] for _, x in cells], color=colors, xlabel="steps per second (learn)"),
            partial(hbar_values, labels=labels, values=[100 * x["buffer_share"]["mean"] for _, x in cells],
                    xerr=[100 * x["buffer_share"]["std"] for _, x in cells], color=colors, tick_labels=False,
                    xlabel="buffer add + sample, % of the step"),
            partial(hbar_values, labels=labels, values=[x["peak_rss_bytes"]["mean"] / 2**20 for _, x in cells],
                    color=colors, tick_labels=False, xlabel="peak RSS of the process (MiB)")]))
    if at and at["rows"]:
        rows = [r for r in at["rows"] if r["planned_bytes"] is not None]
        labels = [f"{r['size']:,}: {LABELS[r['arm']]}" + ("" if r["runs"] else " (not run)") for r in rows]
        pngs.append(panels_figure(out_dir, "atari_memory.png", (9, 0.45 * len(rows) + 2), [
            partial(hbar_values, labels=labels, values=[r["planned_bytes"] / 1e9 for r in rows],
                    color=[COLORS[r["arm"]] for r in rows], vline=(at["ram_bytes"] / 1e9, "this machine's RAM"),
                    xlabel="bytes the buffer holds when full (GB, planned)")]))
    return pngs


def _gb(b) -> str:
    return "n/a" if b is None else f"{b / 1e9:.2f} GB"


def headline(res: dict) -> str | None:
    parts = []
    for task in ("dqn-cartpole", "sac-pendulum"):
        c = (res["summary"].get(task) or {}).get("comparison")
        if c:
            parts.append(f"{TITLES[task].split(' on ')[0]} {c['sps_ratio']['mean']:.2f}x steps/s")
    t = (res["atari"] or {}).get("target")
    if t:
        sb3 = {r["arm"]: r["planned_bytes"] for r in res["atari"]["rows"] if r["size"] == t["size"]}
        parts.append(f"{t['size']:,} Atari transitions in {_gb(t['bytes'])} ({t['vs_one_frame']:.3f}x one frame) "
                     f"against SB3's {_gb(sb3.get('sb3'))} ({_gb(sb3.get('sb3-optimized'))} optimized)"
                     + (", batches bit-identical" if t["exact"] else ""))
    if not parts:
        return None
    return "drop-in against SB3's ReplayBuffer: " + "; ".join(parts)


def classic_section(task: str, s: dict) -> list[str]:
    arms, c = s["arms"], s["comparison"]
    x = next(iter(arms.values()))
    L = [f"### {TITLES[task]}\n",
         f"{x['total_steps']:,} steps, learning from step {x['learning_starts']:,}; "
         f"{len(x['seeds'])} seed(s) per arm.\n"]
    L += md_table(["arm", "buffer class", "steps/s", "buffer share", "add (µs)", "sample (µs)",
                   "slowest add / sample (ms)", "peak RSS (MiB)", "buffer (MiB)", f"final return (last {LAST_EPISODES})",
                   "mean return"],
                  [[LABELS[a], f"`{v['buffer_class']}`", _pm(v["sps"]), _pm(v["buffer_share"], "{:.1f}", 100) + "%",
                    _pm(v["add_us"], "{:.1f}"), _pm(v["sample_us"], "{:.1f}"),
                    f"{v['slowest_add_ms']['mean']:.1f} / {v['slowest_sample_ms']['mean']:.1f}",
                    _pm(v["peak_rss_bytes"], "{:.0f}", 2**-20), f"{v['buffer_nbytes']['mean'] / 2**20:.1f}",
                    _pm(v["final_return"], "{:.1f}"), _pm(v["mean_return"], "{:.1f}")] for a, v in arms.items()],
                  "ll" + "r" * 9)
    L.append("")
    if c:
        L.append(f"Drop-in against SB3's buffer: **{c['sps_ratio']['mean']:.2f}x** the steps per second (per seed "
                 f"{', '.join(f'{r:.2f}' for r in c['sps_ratio_per_seed'])}; target {c['target_sps']:.1f}x: "
                 f"{'met' if c['met'] else '**not met**'}), {c['peak_rss_ratio']['mean']:.2f}x the peak RSS; final "
                 f"return {c['final_diff']:+.1f} (p = {_p(c['final_p'])}), mean return over the run "
                 f"{c['mean_diff']:+.1f} (p = {_p(c['mean_p'])}).\n")
    return L


def atari_section(at: dict) -> list[str]:
    L = ["## Atari: SB3 DQN on Breakout, 1M and 100k transitions\n",
         f"`make_atari_env(\"{ATARI_ENV}\")` + `VecFrameStack(4)`, rl-baselines3-zoo's hyperparameters; one seed. "
         f"Bytes per transition planned for a full buffer: SB3 from its arrays' shapes (checked against the arrays "
         f"of every SB3 run), tfdata from the drop-in's `nbytes` in its run. Reference: one 84x84 frame plus the "
         f"small fields, {ONE_FRAME_ROW:,} B. This machine: {at['ram_bytes'] / 1e9:.1f} GB of RAM; an arm runs only "
         f"when its planned bytes x {RAM_HEADROOM} fit.\n"]
    L += md_table(["size", "buffer", "planned", "bytes / transition", "x one frame", "run?", "steps/s",
                   "buffer share", "peak RSS", "RSS after building"],
                  [[f"{r['size']:,}", LABELS[r["arm"]], _gb(r["planned_bytes"]),
                    "n/a" if r["bytes_per_transition"] is None else f"{r['bytes_per_transition']:,.0f}",
                    "n/a" if r["vs_one_frame"] is None else f"{r['vs_one_frame']:.3f}",
                    "yes" if r["runs"] and "sps" in r else ("no: " + r["why_not"] if r["why_not"] else "no"),
                    f"{r['sps']:.1f}" if "sps" in r else "", f"{100 * r['buffer_share']:.1f}%" if "sps" in r else "",
                    fmt_bytes(r["peak_rss_bytes"]) if "sps" in r else "",
                    fmt_bytes(r["rss_ready_bytes"]) if "sps" in r else ""] for r in at["rows"]], "llrrrlrrrr")
    L.append("")
    run = [r for r in at["rows"] if "sps" in r]
    if run:
        L.append(f"Each run: {run[0]['total_steps']:,} steps, training from step {run[0]['learning_starts']:,} "
                 f"(a batch of {ATARI_HP['batch_size']} every {ATARI_HP['train_freq']} steps). Peak RSS counts the "
                 "pages written in that budget (a buffer's arrays are taken from the OS untouched and become "
                 "resident as rows are written), not a full buffer: the planned bytes are what a full buffer "
                 "holds.\n")
    t = at.get("target")
    if t:
        L.append(f"**Target** ({t['size']:,} transitions in at most {t['target']}x one frame plus the small fields): "
                 f"{t['vs_one_frame']:.3f}x, {_gb(t['bytes'])}: {'met' if t['met'] else '**not met**'}.\n")
    if at["checks"]:
        L.append("### The stacks SB3's agent sees\n")
        c0 = next(iter(at["checks"].values()))
        L.append(f"{c0['n_envs']} environments, a ring of {c0['buffer_size']:,} transitions (it wraps), "
                 f"{c0['total_steps']:,} steps learning from {c0['learning_starts']:,}. Every transition SB3 passed to "
                 "`add` is recorded (both stacks as hashed bytes; action, reward and done as SB3 stores them, done "
                 "without timeouts); every batch `sample` returned, during training and after it, is checked row "
                 "by row: both stacks bit for bit, then the small fields.\n")
        L += md_table(["buffer", "batches (in training)", "rows", "stack mismatches", "field mismatches",
                       "rows with zero padding", "episode ends added"],
                      [[LABELS[a], f"{c['batches']:,} ({c['batches_in_training']:,})", f"{c['rows']:,}",
                        c["stack_mismatches"], c["field_mismatches"], f"{c['rows_with_zero_padding']:,}",
                        f"{c['episode_ends']:,}"] for a, c in at["checks"].items()], "lrrrrrr")
        L.append("")
    return L


def cleanrl_section(res: dict) -> list[str]:
    L = ["## CleanRL's scripts\n",
         "CleanRL's `dqn.py`, `dqn_atari.py` and `sac_continuous_action.py` build SB3's `ReplayBuffer` "
         "themselves. The lines to change:\n"]
    for script, changes in CLEANRL_CHANGES.items():
        L.append(f"`{script}`:\n")
        L.append("```diff")
        for old, new in changes:
            L += [f"-{old}", f"+{new}"]
        L.append("```\n")
    L.append("In `dqn_atari.py` the drop-in then stores one frame per transition (`frame_stack=4`), its stacks "
             "padded as CleanRL's `FrameStack` pads them (`frame_padding=\"reset\"`: copies of an episode's first "
             "frame; SB3's `VecFrameStack` pads with zeros, the default). `optimize_memory_usage=True` is accepted "
             "and has no effect. CleanRL puts the final observation back only at truncations: at a termination "
             "it passes the next episode's first stack as `next_obs`, and the drop-in keeps `obs` shifted by one "
             "frame with that stack's newest frame instead (the loss multiplies it by `1 - done`); every other "
             "row and field is SB3's buffer's, checked in `tests/test_sb3.py` through `dqn_atari.py`'s "
             "`make_env`.\n")
    s = res["summary"].get("cleanrl-dqn")
    if s:
        L.append(f"The first change, run: CleanRL's DQN loop on CartPole-v1 (full run: {CLEANRL['budget']}), the buffer "
                 "built by CleanRL's own line, `ReplayBuffer(args.buffer_size, envs.single_observation_space, "
                 "envs.single_action_space, device, handle_timeout_termination=False)`.\n")
        L += classic_section("cleanrl-dqn", s)[1:]
    return L


def report(res: dict, pngs: list, out_dir: str) -> list[str]:
    run = res["methodology"]
    L = ["# tfdata inside Stable-Baselines3: the drop-in replay buffer\n",
         f"Made by `experiments/sb3_buffers.py` ({run['mode']} run, command `{run['command']}`, "
         f"{run['wall_clock_s']:.0f} s in all). Raw numbers and every episode: `results.json`.\n"]
    hl = headline(res)
    if hl:
        L.append(f"<!-- headline: {hl} -->\n")
    L += hand_written(out_dir, "findings")
    goals = []
    for task in ("dqn-cartpole", "sac-pendulum", "cleanrl-dqn"):
        c = (res["summary"].get(task) or {}).get("comparison")
        if c:
            goals.append([f"{TITLES[task]}: the drop-in at least {TARGET_SPS:.1f}x SB3's steps per second",
                          "yes" if c["met"] else "**no**", f"{c['sps_ratio']['mean']:.2f}x"])
    t = (res["atari"] or {}).get("target")
    if t:
        goals.append([f"{t['size']:,} Atari transitions in at most {TARGET_MEMORY}x one frame plus the small fields",
                      "yes" if t["met"] else "**no**", f"{t['vs_one_frame']:.3f}x ({_gb(t['bytes'])})"])
    checks = (res["atari"] or {}).get("checks") or {}
    if "tfdata" in checks:
        c = checks["tfdata"]
        ok = c["stack_mismatches"] == 0 and c["field_mismatches"] == 0
        goals.append(["the stacks SB3's agent sees bit-identical", "yes" if ok else "**no**",
                      f"{c['rows']:,} rows, {c['stack_mismatches'] + c['field_mismatches']} mismatches"])
    if goals:
        L.append("## Targets\n")
        L += md_table(["target", "met?", "measured"], goals, "lll")
        L.append("")
    L += [f"![{p}]({p})\n" for p in pngs]
    if any(t in res["summary"] for t in TASKS):
        L.append("## SB3's DQN and SAC with either buffer\n")
        L.append("Steps per second of `learn`; buffer share: time inside the buffer's `add` and `sample` over "
                 "`learn`'s (both wrapped by the same `perf_counter` accumulator in both arms).\n")
        for task in TASKS:
            if task in res["summary"]:
                L.append(f"Budget of the full run: {TASKS[task]['budget']}.\n")
                L += classic_section(task, res["summary"][task])
    if res["atari"]:
        L += atari_section(res["atari"])
    if res["parameters"].get("cleanrl") or "cleanrl-dqn" in res["summary"]:
        L += cleanrl_section(res)
    if res.get("failures"):
        L.append("## Runs that failed\n")
        L += md_table(["run", "seed", "error"], [[f"{f['task']}: {LABELS.get(f['arm'], f['arm'])}", f["seed"],
                                                  f"`{f['error'][:300]}`"] for f in res["failures"]], "lrl")
        L.append("")
    L += hand_written(out_dir, "method")
    return L


def render(res: dict) -> list[str]:
    """README.md and the plots from a results.json; returns the plots' names."""
    out_dir = OUT_DIR
    os.makedirs(out_dir, exist_ok=True)
    pngs = plot(res, out_dir)
    drop_stale_plots(out_dir, pngs)
    write_methodology_report(out_dir, report(res, pngs, out_dir), res["methodology"])
    return pngs


def publish(runs: list, run: dict, plan: list, ram: int, parts) -> dict:
    versions = {}
    for r in runs:
        versions.update(r.get("versions", {}))
    summ = summarise(runs)
    res = {"methodology": run, "versions": versions, "parameters": run["parameters"],
           "summary": {t: {"arms": {a: {k: v for k, v in x.items() if k not in ("curve_mean", "curve_std")}
                                    for a, x in s["arms"].items()}, "comparison": s["comparison"]}
                       for t, s in summ.items()},
           "curves": {t: {a: {"mean": x["curve_mean"], "std": x["curve_std"]} for a, x in s["arms"].items()}
                      for t, s in summ.items()},
           "atari": atari_summary(runs, plan, ram) if "atari" in parts else None,
           "failures": [{k: r[k] for k in ("study", "task", "arm", "seed", "error", "traceback")}
                        for r in runs if "error" in r],
           "runs": runs}
    path = os.path.join(OUT_DIR, "results.json")
    write_json(path, res)
    with open(path, encoding="utf-8") as f:
        render(_with_curves(json.load(f)))
    return res


def _with_curves(res: dict) -> dict:
    """results.json keeps the curves apart from the summary; the report reads them together."""
    for t, s in res["summary"].items():
        for a, x in s["arms"].items():
            x["curve_mean"], x["curve_std"] = res["curves"][t][a]["mean"], res["curves"][t][a]["std"]
    return res


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, tiny budgets, Atari 100k only (1-3 minutes)")
    ap.add_argument("--seeds", default=None, help="a count N (seeds 0..N-1) or a comma list")
    ap.add_argument("--parts", nargs="*", default=list(PARTS), choices=PARTS, help="the studies to run")
    ap.add_argument("--render", default=None, metavar="RESULTS_JSON",
                    help="rewrite the report and plots from a results.json (no runs)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="full", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.render:
        with open(args.render, encoding="utf-8") as f:
            render(_with_curves(json.load(f)))
        print(f"report rewritten: {os.path.relpath(OUT_DIR)}/README.md", flush=True)
        return
    if args.worker:
        r = run_worker(args.worker, args.seed, args.mode)
        print("RESULT " + json.dumps(r), flush=True)
        return
    mode = "quick" if args.quick else "full"
    seeds = parse_seeds(args.seeds, SEEDS[mode])
    # one thread for torch's intra-op pool, OpenMP and numpy's BLAS in every worker
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = "1"
    os.makedirs(OUT_DIR, exist_ok=True)
    given = sys.argv[1:] if argv is None else list(argv)
    ram = ram_bytes()
    plan = atari_plan(mode, ram)
    parts = [p for p in PARTS if p in args.parts]
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=seeds, command=" ".join(["python experiments/sb3_buffers.py", *given]),
                    lean=True, parameters={
                        "parts": parts, "tasks": {t: {k: (v[mode] if isinstance(v, dict) and mode in v else v)
                                                      for k, v in x.items()} for t, x in TASKS.items()},
                        "cleanrl": {"hyperparameters": CLEANRL_HP, "env": CLEANRL["env"],
                                    "steps": CLEANRL["steps"][mode], "learning_starts": CLEANRL["learning_starts"][mode]}
                        if "cleanrl" in parts else None,
                        "atari": {"env": ATARI_ENV, "hyperparameters": ATARI_HP, "sizes": ATARI_SIZES[mode],
                                  "steps": ATARI_STEPS[mode], "learning_starts": ATARI_STARTS[mode],
                                  "check": {k: (v[mode] if isinstance(v, dict) else v) for k, v in CHECK.items()}},
                        "targets": {"sps_ratio": TARGET_SPS, "atari_bytes_vs_one_frame": TARGET_MEMORY},
                        "last_episodes": LAST_EPISODES, "ram_headroom": RAM_HEADROOM})
    log = lambda s: print(s, flush=True)  # noqa: E731
    for p in plan:
        if not p["runs"] and "atari" in parts:
            log(f"atari-{p['size']}:{p['arm']} not run: {p['why_not']}")
    runs = run_all(mode, parts, seeds, plan, log)
    run = rec.finish(child_peak_rss_bytes=max(r["peak_rss_bytes"] for r in runs))
    publish(runs, run, plan, ram, parts)
    print(f"{mode} run {rec.run_name} done in {run['wall_clock_s']:.0f} s; report: "
          f"{os.path.relpath(OUT_DIR)}/README.md", flush=True)


if __name__ == "__main__":
    main()
