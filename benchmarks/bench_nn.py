"""The torch-free learner (``tfdata.nn``): DQN train step, greedy action, forward, backward,
memory and compile time, next to torch doing the same work.

The network and update are CleanRL's CartPole DQN (``cleanrl/dqn.py``): Q-network 4-120-84-2
(``Linear``/``ReLU``), batch 128, Adam with lr 2.5e-4, gamma 0.99, a target network, the squared
TD loss (``F.mse_loss``); batches are sampled from a full 10,000-row tfdata ``ReplayBuffer`` of
CartPole rows (CleanRL's buffer size; the spec of :data:`benchmarks.common.CARTPOLE`).

What each class measures, with the layout as its first parameter wherever a batch comes from a
buffer (AoS fields are strided views of the sampled records, SoA fields contiguous columns):

* ``TrainStep``: ``time_train``, one DQN update on a batch of 128 (sampled in ``setup``, not
  timed). ``"tfdata"``: ``DQN.train(batch)`` (one compiled call, ``nn._mlp_kernels.dqn_step``:
  target forward, online forward, TD loss, backward, Adam). ``"torch"``: CleanRL's update
  (``nn.Sequential`` 4-120-84-2 and its target, ``F.mse_loss``, ``torch.optim.Adam``), the batch
  converted with ``torch.from_numpy`` (zero copy, AoS fields as strided tensors) inside the timed
  call. Target: tfdata's time <= 1/3 of torch's (the ratio of one run's figures).
* ``Act``: ``time_act``, the greedy action for one observation: ``DQN.act(obs)`` against
  ``q(torch.from_numpy(obs).unsqueeze(0)).argmax().item()`` under ``torch.no_grad()``. No
  layout: one observation is one small contiguous array whatever the buffer.
* ``Forward`` / ``Backward``: ``time_forward`` and ``time_backward``, ``MLP.forward(x)`` and
  ``MLP.backward(x, grad_out)`` of the Q-network for batches of 1, 32, 128 and 1024, ``x`` the
  ``obs`` field of a batch sampled from the buffer (strided for AoS, contiguous for SoA) and
  ``grad_out`` random. ``Backward`` reuses the layer outputs of one untimed ``forward``.
* ``Memory``: ``peakmem_train``, the peak RSS of a process that builds a 10,000-row buffer (AoS)
  and a learner and runs 100 train steps (sample + update), tfdata against torch; numba and the
  buffer kernels are loaded in both, torch is imported in torch's, tfdata's network kernels in
  tfdata's. ``track_nbytes`` (tfdata only): ``DQN.nbytes`` after those steps and an act, the
  bytes the learner keeps (both networks' parameters and gradients, Adam's moments, and the
  workspaces of batch 128 and 1). No layout: it changes the buffer by 20 KB.
* ``Compile``: ``track_first_train_and_act``, seconds of ``DQN((4, 120, 84, 2))`` + the first
  ``train`` of a batch of 128 + the first ``act``, in a fresh interpreter (numba imported
  before the clock starts): ``"cold"``, an empty ``NUMBA_CACHE_DIR`` (the one-off compile of
  ``dqn_step`` and ``mlp_argmax``), and ``"warm"``, the kernels loaded from the cache. The
  batch has the array types of a sampled AoS batch (the default layout; an SoA batch compiles
  the same code for contiguous arrays, in about the same time).

PPO (``tfdata.nn.PPO`` against CleanRL's ``ppo.py`` agent and update on CartPole: actor and
critic 4-64-64-{2,1} tanh, minibatch 128 of a 512-step rollout, Adam lr 2.5e-4 eps 1e-5, clip 0.2,
clipped value loss, ent_coef 0.01, vf_coef 0.5, max_grad_norm 0.5):

* ``PPOTrain``: ``time_train``, one minibatch update. The minibatch's fields are ``"aos"``: views
  of one record array (what an AoS rollout buffer's gather gives), or ``"soa"``: one contiguous
  array per field. ``"tfdata"``: ``PPO.train(mb)`` (one compiled call, ``nn._ppo_kernels.ppo_train``);
  ``"torch"``: CleanRL's loop body (``get_action_and_value``, ratio, clipped losses, entropy,
  ``backward``, ``clip_grad_norm_``, ``Adam.step``), the fields converted with
  ``torch.from_numpy`` inside the timed call. A 512-row rollout takes 16 of these (4 epochs of 4).
* ``PPOAct``: ``time_act``, the action, log-probability and value of 4 observations (one vector
  step of 4 CartPole envs; ``PPO.act`` against CleanRL's ``get_action_and_value`` under
  ``no_grad``), and ``time_value`` (the critic alone: bootstrap values). 128 acts per rollout.
* ``PPOMemory``: ``peakmem_train``, peak RSS of a process that builds an agent and runs 100
  updates and acts; ``track_nbytes`` (tfdata only): ``PPO.nbytes`` after them.
* ``PPOCompile``: ``track_first_train_and_act``, seconds of ``PPO(4, 2)`` + first ``train`` (AoS
  field types) + first ``act`` + first ``value`` in a fresh interpreter, cold and warm cache.

SAC (``tfdata.nn.SAC`` against CleanRL's ``sac_continuous_action.py`` at its Hopper sizes: 11
observations, 3 actions in [-1, 1], actor 11-256-256-(3 mean, 3 log-std) and twin critics
14-256-256-1 with Polyak targets, ReLU, batch 256, gamma 0.99, tau 0.005, Adam lr 3e-4 (actor) and
1e-3 (critics, temperature), autotuned temperature, policy_frequency 2; batches sampled from a full
10,000-row tfdata ``ReplayBuffer`` of :data:`HOPPER` rows):

* ``SACTrain``: ``time_train``, **two consecutive updates**, global steps ``2k + 1`` (the critics
  and the targets) and ``2k + 2`` (the same, then two actor updates, each followed by a
  temperature update), on one batch of 256 sampled in ``setup``: CleanRL does a policy update
  every 2nd step, so one reading is the cost of two environment steps' learning, and half of it
  the mean update. ``"tfdata"``: ``SAC.train(batch, step)``; ``"torch"``: CleanRL's update lines
  (:class:`TorchSAC`), the fields converted with ``torch.from_numpy`` inside the timed call.
* ``SACFloor``: ``time_pair``, the BLAS floor of that pair: only the matrix products the two
  updates perform (:func:`sac_products`, from the network sizes), each a numpy ``matmul`` of
  float32 arrays of the same shapes and memory orders as ``SAC`` uses, into preallocated arrays.
  ``SACTrain`` / ``SACFloor`` is what the rest of the update (kernels, Python, Adam) costs on top.
* ``MatMul``: ``time_matmul``, one product at the shapes behind ``SAC``'s split between BLAS and
  loops: (256x256)@(256x256) (a hidden layer of the batch), (1x256)@(256x256) (the same layer
  for one observation, acting), (256x14)@(14x256) (the critics' first layer); ``"numba"``, the
  compiled loops of :func:`matmul_ikj` (i-k-j, the inner loop contiguous), against ``"numpy"``,
  ``np.matmul(a, b, out=c)`` (BLAS). float32, C-contiguous, one thread.
* ``SACAct``: ``time_act``, an action for one observation (shape (11,)): ``SAC.act(obs)`` (the
  compiled row-by-row actor) against CleanRL's ``actor.get_action(obs[None])`` under
  ``torch.no_grad()`` (which also computes the log-probability and the squashed mean).
* ``SACMemory``: ``peakmem_train``, peak RSS of a process that builds a 10,000-row Hopper buffer
  (AoS) and a learner and runs 10 sample + train steps and an act; ``track_nbytes``:
  ``SAC.nbytes`` after them (parameters, targets, gradients, Adam's moments, workspaces of batch
  256 and 1) against :attr:`TorchSAC.nbytes` (the torch agent's parameters, buffers, gradients
  and optimizer state; autograd's activations are freed after each backward, not counted).
* ``SACCompile``: ``track_first_train_and_act``, seconds of ``SAC(11, ...)`` + a first pair of
  ``train`` calls (steps 1 and 2: every kernel of the update) on a batch of AoS field views + the
  first ``act``, in a fresh interpreter, cold and warm cache.

numpy's BLAS is pinned to one thread in every SAC and MatMul process (:func:`single_thread_blas`,
as ``OPENBLAS_NUM_THREADS=1`` would at start), as torch is to one.

Torch runs with ``torch.set_num_threads(1)`` (``OMP_NUM_THREADS=1`` set before torch is
imported, if unset): the single core of a small device, and a fair match for tfdata's
single-threaded kernels. Where torch cannot be imported its cases are skipped
(``NotImplementedError`` in ``setup``).

As everywhere in this suite, asv_runner calls ``setup`` before every timed call (see
:mod:`benchmarks.common`): buffers and learners are built once per process and kept in
module-level caches, and the kernels (and torch's first-call allocations) are warmed once.
Learners keep training from reading to reading on fresh random batches (the target network
is never synced: a stationary regression).
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import json
import os

import numpy as np

import tfdata

from .common import (CARTPOLE, TFDATA_LAYOUTS, build_and_fill, child_seconds, filled_buffer,
                     first_call_seconds, first_time, one_row, warm_kernels)

#: CleanRL's CartPole Q-network and hyperparameters
SIZES = (4, 120, 84, 2)
BATCH = 128
LR = 2.5e-4
GAMMA = 0.99
CAPACITY = 10_000

IMPLS = ["tfdata", "torch"]
FORWARD_BATCHES = [1, 32, 128, 1024]
#: the buffer of the Memory benchmarks: the default layout
MEMORY_LAYOUT = "aos"

# every operation below is timed one call per reading (asv forces number=1 when a class has a
# setup), so take many readings: the median of thousands of single calls is stable
_MANY_SAMPLES = (200, 2000, 2.0)


# -- torch --------------------------------------------------------------------------------------
def require_torch():
    """The ``torch`` module, one thread; ``NotImplementedError`` (asv's skip) if not importable."""
    if importlib.util.find_spec("torch") is None:
        raise NotImplementedError("torch is not installed")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch
    except ImportError as exc:
        raise NotImplementedError(f"torch cannot be imported: {exc}") from None
    torch.set_num_threads(1)
    return torch


class TorchDQN:
    """CleanRL's ``dqn.py`` learner in torch, with :class:`tfdata.nn.DQN`'s ``train``/``act``.

    ``train`` converts the batch with ``torch.from_numpy`` (zero copy) and runs CleanRL's
    update as written there; ``act`` is the greedy action under ``torch.no_grad()``.
    """

    def __init__(self, torch, seed: int = 0):
        from torch import nn

        torch.manual_seed(seed)

        def qnet():
            return nn.Sequential(nn.Linear(SIZES[0], SIZES[1]), nn.ReLU(),
                                 nn.Linear(SIZES[1], SIZES[2]), nn.ReLU(),
                                 nn.Linear(SIZES[2], SIZES[3]))

        self.torch = torch
        self.mse_loss = torch.nn.functional.mse_loss
        self.q, self.target = qnet(), qnet()
        self.target.load_state_dict(self.q.state_dict())
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=LR)

    def train(self, batch) -> None:
        torch = self.torch
        from_numpy = torch.from_numpy
        obs = from_numpy(batch["obs"])
        actions = from_numpy(batch["action"]).unsqueeze(1)
        rewards = from_numpy(batch["reward"])
        next_obs = from_numpy(batch["next_obs"])
        dones = from_numpy(batch["terminated"]).float()
        with torch.no_grad():
            target_max, _ = self.target(next_obs).max(dim=1)
            td_target = rewards + GAMMA * target_max * (1 - dones)
        old_val = self.q(obs).gather(1, actions).squeeze()
        loss = self.mse_loss(td_target, old_val)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()

    def act(self, obs) -> int:
        with self.torch.no_grad():
            return self.q(self.torch.from_numpy(obs).unsqueeze(0)).argmax().item()


# -- learners -----------------------------------------------------------------------------------
def new_learner(impl: str):
    """A fresh learner, seed 0: :class:`tfdata.nn.DQN` or :class:`TorchDQN`."""
    if impl == "torch":
        return TorchDQN(require_torch())
    return tfdata.nn.DQN(SIZES, lr=LR, gamma=GAMMA, seed=0)


def warm_learner(layout: str, impl: str):
    """A new learner of ``impl`` that has trained on 3 batches of 128 of ``layout`` and acted once.

    The buffer kernels are loaded first (:func:`benchmarks.common.warm_kernels`), for every
    contender; the steps then load (on a cold cache, compile) tfdata's network kernels for this
    layout's array types, or make torch's first-call allocations and lazy imports, and allocate
    the learner's own state (tfdata's workspaces, Adam's moments in both).
    """
    warm_kernels()
    buf = filled_buffer(layout, CARTPOLE, CAPACITY)
    net = new_learner(impl)
    for _ in range(3):
        net.train(buf.sample(BATCH))
    net.act(one_row(CARTPOLE)["obs"])
    return net


@functools.lru_cache(maxsize=None)  # one per (layout, impl) and process
def learner(layout: str, impl: str):
    """The warmed learner of (layout, impl) that this process's benchmark keeps training."""
    return warm_learner(layout, impl)


# -- benchmarks ---------------------------------------------------------------------------------
class TrainStep:
    """One DQN update on a batch of 128 CartPole rows from a full 10,000-row buffer.

    ``"tfdata"``: ``DQN.train(batch)``; ``"torch"``: CleanRL's update, ``torch.from_numpy``
    conversion included. The batch is sampled in ``setup`` (a fresh one per reading).
    Target: tfdata <= 1/3 of torch's time.
    """

    params = [TFDATA_LAYOUTS, IMPLS]
    param_names = ["layout", "impl"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, layout, impl):
        self.net = learner(layout, impl)
        self.buf = filled_buffer(layout, CARTPOLE, CAPACITY)
        self.batch = self.buf.sample(BATCH)

    def time_train(self, layout, impl):
        self.net.train(self.batch)


class Act:
    """The greedy action for one CartPole observation (float32, shape (4,))."""

    params = [IMPLS]
    param_names = ["impl"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, impl):
        self.net = learner("aos", impl)
        self.obs = one_row(CARTPOLE, seed=2)["obs"]

    def time_act(self, impl):
        self.net.act(self.obs)


@functools.lru_cache(maxsize=None)
def sampled_obs(layout: str, batch: int) -> np.ndarray:
    """The ``obs`` field of one batch sampled from the full buffer of ``layout``, per process."""
    # the only sample of this size in the process: its output ring slot is never reused
    return filled_buffer(layout, CARTPOLE, CAPACITY).sample(batch)["obs"]


@functools.lru_cache(maxsize=None)
def mlp_with_forward(layout: str, batch: int):
    """The Q-network (seed 0) and its input ``x``, after one forward of ``x`` (kernels loaded)."""
    warm_kernels()
    net = tfdata.nn.MLP(SIZES, seed=0)
    x = sampled_obs(layout, batch)
    net.forward(x)
    return net, x


class Forward:
    """``MLP.forward(x)`` of the 4-120-84-2 Q-network, ``x`` a sampled batch's ``obs`` field."""

    params = [TFDATA_LAYOUTS, FORWARD_BATCHES]
    param_names = ["layout", "batch"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, layout, batch):
        self.net, self.x = mlp_with_forward(layout, batch)

    def time_forward(self, layout, batch):
        self.net.forward(self.x)


class Backward:
    """``MLP.backward(x, grad_out)`` after one ``forward(x)``, ``grad_out`` N(0, 1) float32."""

    params = [TFDATA_LAYOUTS, FORWARD_BATCHES]
    param_names = ["layout", "batch"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, layout, batch):
        self.net, self.x = mlp_with_forward(layout, batch)
        self.grad_out = np.random.default_rng(5).standard_normal((batch, SIZES[-1]),
                                                                 dtype=np.float32)
        if first_time("backward", layout, batch):
            self.net.backward(self.x, self.grad_out)  # loads the kernel

    def time_backward(self, layout, batch):
        self.net.backward(self.x, self.grad_out)


def train_run(impl: str, steps: int):
    """Build and fill a 10,000-row AoS buffer and a learner, run ``steps`` sample + train steps
    and one act; return the learner."""
    buf = build_and_fill(MEMORY_LAYOUT, CARTPOLE, CAPACITY)
    net = new_learner(impl)
    for _ in range(steps):
        net.train(buf.sample(BATCH))
    net.act(one_row(CARTPOLE)["obs"])
    return net


class Memory:
    """Memory of a learner: peak RSS of build + 100 train steps, and the bytes ``DQN`` keeps.

    ``peakmem_train``: the process's peak RSS while building a 10,000-row buffer (AoS) and a
    learner and running 100 sample + train steps (numba and the buffer kernels loaded in every
    case; torch imported in torch's, the network kernels loaded in tfdata's). ``track_nbytes``:
    ``DQN.nbytes`` after those steps and an act (tfdata only: torch has no such figure). No
    layout: at 10,000 rows the two differ by 20 KB (48 or 46 bytes a row).
    """

    params = [IMPLS]
    param_names = ["impl"]
    timeout = 300
    steps = 100

    def setup(self, impl):
        if first_time("memory", impl):
            warm_learner(MEMORY_LAYOUT, impl)  # a throwaway learner, freed before the run

    def peakmem_train(self, impl):
        train_run(impl, self.steps)

    def track_nbytes(self, impl):
        return train_run(impl, self.steps).nbytes

    track_nbytes.unit = "bytes"
    # asv_runner's per-benchmark skip (checked before setup): no torch process is started
    track_nbytes.skip_params = [("torch",)]


# -- compile time -------------------------------------------------------------------------------
FIRST_TRAIN_AND_ACT = """
import json, time
import numpy as np
import numba  # imported before the clock starts (bench_startup.ImportNumba measures it)
import tfdata
spec = tfdata.Spec.from_dict(json.loads(%(spec)r))
# the array types of a sampled AoS batch (field views of records), without the buffer's kernels
records = np.zeros(%(batch)d, spec.aos_dtype)
batch = {f.name: records[f.name] for f in spec}
rng = np.random.default_rng(0)
batch["obs"][...] = rng.standard_normal(batch["obs"].shape)
batch["next_obs"][...] = rng.standard_normal(batch["next_obs"].shape)
batch["reward"][...] = rng.standard_normal(batch["reward"].shape)
batch["action"][...] = rng.integers(0, 2, batch["action"].shape)
obs = np.array(batch["obs"][0])
t0 = time.perf_counter()
net = tfdata.nn.DQN(%(sizes)r, seed=0)
net.train(batch)
net.act(obs)
print(time.perf_counter() - t0)
""" % {"spec": json.dumps(CARTPOLE.to_dict()), "batch": BATCH, "sizes": SIZES}

IMPORTS = """
import time
t0 = time.perf_counter()
import numba
import tfdata
print(time.perf_counter() - t0)
"""




class Compile:
    """``DQN((4, 120, 84, 2))`` + first ``train(batch of 128)`` + first ``act``, fresh interpreter.

    ``"cold"``: an empty ``NUMBA_CACHE_DIR``, the compile of the network kernels (one run: it
    takes seconds, a second run would double this benchmark's share of a quick CI run);
    ``"warm"``: loaded from the kernel cache (median of 3). ``setup`` runs a child first, so
    the OS page cache and the ``.pyc`` files are warm: for "warm" the measured child once (it
    fills the kernel cache), for "cold" just ``import numba, tfdata``.
    """

    params = [["cold", "warm"]]
    param_names = ["cache"]
    unit = "seconds"
    timeout = 300
    runs = {"cold": 1, "warm": 3}

    def setup(self, cache):
        child_seconds(FIRST_TRAIN_AND_ACT if cache == "warm" else IMPORTS)

    def track_first_train_and_act(self, cache):
        return first_call_seconds(FIRST_TRAIN_AND_ACT, cache=cache, runs=self.runs[cache])


# -- PPO ----------------------------------------------------------------------------------------
#: CleanRL ppo.py's CartPole agent: 4 observations, 2 actions, 4 envs, minibatch 128
PPO_OBS, PPO_ACTIONS, PPO_ENVS, PPO_BATCH = 4, 2, 4, 128
PPO_FIELDS = [("obs", "f4", (PPO_OBS,)), ("action", "i8"), ("log_prob", "f4"), ("advantage", "f4"),
              ("return", "f4"), ("value", "f4"), ("reward", "f4"), ("terminated", "?")]


def ppo_minibatch(layout: str, seed: int = 0, batch: int = PPO_BATCH) -> dict:
    """A minibatch as a rollout buffer of ``layout`` gives one: ``"aos"`` field views of one
    record array, ``"soa"`` one contiguous array per field. Old log-probs near uniform's."""
    rng = np.random.default_rng(seed)
    rec = np.zeros(batch, dtype=np.dtype(PPO_FIELDS, align=True))  # as tfdata's AoS records
    rec["obs"] = rng.standard_normal((batch, PPO_OBS))
    rec["action"] = rng.integers(0, PPO_ACTIONS, batch)
    rec["log_prob"] = np.log(0.5) + rng.normal(0, 0.05, batch)
    rec["advantage"] = rng.standard_normal(batch)
    rec["return"] = rng.standard_normal(batch)
    rec["value"] = rng.normal(0, 0.5, batch)
    names = ["obs", "action", "log_prob", "advantage", "return", "value"]
    if layout == "aos":
        return {k: rec[k] for k in names}
    return {k: np.ascontiguousarray(rec[k]) for k in names}


class TorchPPO:
    """CleanRL's ``ppo.py`` Agent (critic and actor ``nn.Sequential`` with ``layer_init``) and its
    minibatch update, with :class:`tfdata.nn.PPO`'s ``train``/``act``/``value``."""

    def __init__(self, torch, seed: int = 0):
        from torch import nn
        from torch.distributions.categorical import Categorical

        torch.manual_seed(seed)

        def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
            torch.nn.init.orthogonal_(layer.weight, std)
            torch.nn.init.constant_(layer.bias, bias_const)
            return layer

        self.torch, self.Categorical = torch, Categorical
        self.critic = nn.Sequential(layer_init(nn.Linear(PPO_OBS, 64)), nn.Tanh(),
                                    layer_init(nn.Linear(64, 64)), nn.Tanh(),
                                    layer_init(nn.Linear(64, 1), std=1.0))
        self.actor = nn.Sequential(layer_init(nn.Linear(PPO_OBS, 64)), nn.Tanh(),
                                   layer_init(nn.Linear(64, 64)), nn.Tanh(),
                                   layer_init(nn.Linear(64, PPO_ACTIONS), std=0.01))
        self.params = list(self.critic.parameters()) + list(self.actor.parameters())
        self.optimizer = torch.optim.Adam(self.params, lr=LR, eps=1e-5)
        self.stats = {}

    def act(self, obs):
        torch = self.torch
        with torch.no_grad():
            x = torch.from_numpy(obs)
            probs = self.Categorical(logits=self.actor(x))
            action = probs.sample()
            return action.numpy(), probs.log_prob(action).numpy(), self.critic(x).flatten().numpy()

    def value(self, obs):
        with self.torch.no_grad():
            return self.critic(self.torch.from_numpy(obs)).flatten().numpy()

    def train(self, mb) -> float:
        torch = self.torch
        from_numpy = torch.from_numpy
        obs, actions = from_numpy(mb["obs"]), from_numpy(mb["action"])
        logprobs, advantages = from_numpy(mb["log_prob"]), from_numpy(mb["advantage"])
        returns, values = from_numpy(mb["return"]), from_numpy(mb["value"])
        logits = self.actor(obs)
        probs = self.Categorical(logits=logits)
        newlogprob, entropy, newvalue = probs.log_prob(actions), probs.entropy(), self.critic(obs)
        logratio = newlogprob - logprobs
        ratio = logratio.exp()
        with torch.no_grad():
            old_approx_kl = (-logratio).mean()
            approx_kl = ((ratio - 1) - logratio).mean()
            clipfrac = ((ratio - 1.0).abs() > 0.2).float().mean().item()
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        pg_loss1 = -advantages * ratio
        pg_loss2 = -advantages * torch.clamp(ratio, 1 - 0.2, 1 + 0.2)
        pg_loss = torch.max(pg_loss1, pg_loss2).mean()
        newvalue = newvalue.view(-1)
        v_loss_unclipped = (newvalue - returns) ** 2
        v_clipped = values + torch.clamp(newvalue - values, -0.2, 0.2)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
        entropy_loss = entropy.mean()
        loss = pg_loss - 0.01 * entropy_loss + v_loss * 0.5
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 0.5)
        self.optimizer.step()
        self.stats = {"old_approx_kl": old_approx_kl, "approx_kl": approx_kl, "clipfrac": clipfrac}
        return loss.item()


def new_ppo(impl: str):
    """A fresh agent, seed 0: :class:`tfdata.nn.PPO` or :class:`TorchPPO`."""
    if impl == "torch":
        return TorchPPO(require_torch())
    return tfdata.nn.PPO(PPO_OBS, PPO_ACTIONS, lr=LR, seed=0)


def ppo_obs(seed: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((PPO_ENVS, PPO_OBS), dtype=np.float32)


@functools.lru_cache(maxsize=None)  # one per (layout, impl) and process
def ppo_agent(layout: str, impl: str):
    """An agent of ``impl`` that has trained on 3 minibatches of ``layout``, acted and valued
    once (kernels loaded, workspaces and Adam's moments allocated)."""
    agent = new_ppo(impl)
    for seed in range(3):
        agent.train(ppo_minibatch(layout, seed))
    agent.act(ppo_obs())
    agent.value(ppo_obs())
    return agent


@functools.lru_cache(maxsize=None)
def timed_minibatch(layout: str) -> dict:
    """The minibatch the timed updates repeat (PPO takes 4 epochs over each row)."""
    return ppo_minibatch(layout, seed=3)


class PPOTrain:
    """One PPO minibatch update (128 rows): ``PPO.train(mb)`` against CleanRL's loop body.
    Target: a 512-step rollout's 16 updates + 128 acts well under 15 ms (3x torch's loop)."""

    params = [TFDATA_LAYOUTS, IMPLS]
    param_names = ["layout", "impl"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, layout, impl):
        self.agent = ppo_agent(layout, impl)
        self.mb = timed_minibatch(layout)

    def time_train(self, layout, impl):
        self.agent.train(self.mb)


class PPOAct:
    """Actions, log-probabilities and values of 4 observations (one vector-env step), and the
    critic's values alone."""

    params = [IMPLS]
    param_names = ["impl"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, impl):
        self.agent = ppo_agent("aos", impl)
        self.obs = ppo_obs()

    def time_act(self, impl):
        self.agent.act(self.obs)

    def time_value(self, impl):
        self.agent.value(self.obs)


def ppo_run(impl: str, steps: int):
    """Build an agent, run ``steps`` minibatch updates (AoS fields), an act and a value."""
    agent = new_ppo(impl)
    mb = ppo_minibatch("aos")
    for _ in range(steps):
        agent.train(mb)
    agent.act(ppo_obs())
    agent.value(ppo_obs())
    return agent


class PPOMemory:
    """Peak RSS of building an agent and 100 updates + an act; ``PPO.nbytes`` after them."""

    params = [IMPLS]
    param_names = ["impl"]
    timeout = 300
    steps = 100

    def setup(self, impl):
        if first_time("ppo_memory", impl):
            warm_kernels()
            ppo_run(impl, 2)  # a throwaway agent: kernels (or torch) loaded before the run

    def peakmem_train(self, impl):
        ppo_run(impl, self.steps)

    def track_nbytes(self, impl):
        return ppo_run(impl, self.steps).nbytes

    track_nbytes.unit = "bytes"
    track_nbytes.skip_params = [("torch",)]


PPO_FIRST_TRAIN_AND_ACT = """
import time
import numpy as np
import numba  # imported before the clock starts
import tfdata
rec = np.zeros(%(batch)d, dtype=np.dtype(%(fields)r, align=True))
rng = np.random.default_rng(0)
rec["obs"] = rng.standard_normal(rec["obs"].shape)
rec["action"] = rng.integers(0, 2, %(batch)d)
rec["log_prob"] = np.log(0.5)
mb = {k: rec[k] for k in ("obs", "action", "log_prob", "advantage", "return", "value")}
obs = rng.standard_normal((4, 4)).astype(np.float32)
t0 = time.perf_counter()
agent = tfdata.nn.PPO(4, 2, seed=0)
agent.train(mb)
agent.act(obs)
agent.value(obs)
print(time.perf_counter() - t0)
""" % {"batch": PPO_BATCH, "fields": PPO_FIELDS}


class PPOCompile:
    """``PPO(4, 2)`` + first ``train`` (AoS field types) + first ``act`` and ``value``, in a
    fresh interpreter: ``"cold"`` (empty ``NUMBA_CACHE_DIR``) and ``"warm"`` (median of 3)."""

    params = [["cold", "warm"]]
    param_names = ["cache"]
    unit = "seconds"
    timeout = 300
    runs = {"cold": 1, "warm": 3}

    def setup(self, cache):
        child_seconds(PPO_FIRST_TRAIN_AND_ACT if cache == "warm" else IMPORTS)

    def track_first_train_and_act(self, cache):
        return first_call_seconds(PPO_FIRST_TRAIN_AND_ACT, cache=cache, runs=self.runs[cache])


# -- SAC ----------------------------------------------------------------------------------------
#: CleanRL sac_continuous_action.py's sizes, with Hopper's spaces: 11 observations, 3 actions
SAC_OBS, SAC_ACTIONS, SAC_HIDDEN, SAC_BATCH = 11, 3, (256, 256), 256
SAC_LOW, SAC_HIGH = -np.ones(SAC_ACTIONS), np.ones(SAC_ACTIONS)
SAC_GAMMA, SAC_TAU, SAC_POLICY_LR, SAC_Q_LR, SAC_POLICY_FREQUENCY = 0.99, 0.005, 3e-4, 1e-3, 2
#: a Hopper transition (float32 observations and actions), 106 bytes of data per row
HOPPER = tfdata.Spec({
    "obs": ("f4", (SAC_OBS,)),
    "action": ("f4", (SAC_ACTIONS,)),
    "reward": "f4",
    "next_obs": ("f4", (SAC_OBS,)),
    "terminated": "?",
    "truncated": "?",
})
#: train steps of the SAC memory benchmark
SAC_MEMORY_STEPS = 10
# one reading is milliseconds (two updates, or their products): 10 to 100 readings, 5 s at most
_SAC_SAMPLES = (10, 100, 5.0)

_BLAS_SET_THREADS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                     "openblas_set_num_threads64_", "openblas_set_num_threads")


@functools.lru_cache(maxsize=None)
def single_thread_blas() -> bool:
    """Set every OpenBLAS loaded in this process (numpy's) to one thread, once per process.

    ``OPENBLAS_NUM_THREADS=1`` does it only if set before numpy is imported, and asv imports the
    benchmark modules before any ``setup``. True if one was found (Linux; elsewhere, or with
    another BLAS, run with the environment variables set).
    """
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return False
    found = False
    for path in sorted(paths):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in _BLAS_SET_THREADS:
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(1)
                found = True
                break
    return found


class TorchSAC:
    """CleanRL's ``sac_continuous_action.py`` agent (``Actor``, two ``SoftQNetwork`` and their
    targets, three Adam optimizers, ``log_alpha``) and its update, with :class:`tfdata.nn.SAC`'s
    ``train(batch, step)``/``act(obs)``.

    ``train`` converts the batch with ``torch.from_numpy`` (zero copy) and runs CleanRL's lines
    after ``rb.sample``; ``act`` is ``actor.get_action`` of one observation under
    ``torch.no_grad()``.
    """

    def __init__(self, torch, seed: int = 0):
        nn = torch.nn
        F = torch.nn.functional
        torch.manual_seed(seed)
        h1, h2 = SAC_HIDDEN

        class SoftQNetwork(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = nn.Linear(SAC_OBS + SAC_ACTIONS, h1)
                self.fc2 = nn.Linear(h1, h2)
                self.fc3 = nn.Linear(h2, 1)

            def forward(self, x, a):
                x = torch.cat([x, a], 1)
                x = F.relu(self.fc1(x))
                x = F.relu(self.fc2(x))
                return self.fc3(x)

        log_std_max, log_std_min = 2, -5

        class Actor(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = nn.Linear(SAC_OBS, h1)
                self.fc2 = nn.Linear(h1, h2)
                self.fc_mean = nn.Linear(h2, SAC_ACTIONS)
                self.fc_logstd = nn.Linear(h2, SAC_ACTIONS)
                self.register_buffer("action_scale", torch.tensor((SAC_HIGH - SAC_LOW) / 2.0,
                                                                  dtype=torch.float32))
                self.register_buffer("action_bias", torch.tensor((SAC_HIGH + SAC_LOW) / 2.0,
                                                                 dtype=torch.float32))

            def forward(self, x):
                x = F.relu(self.fc1(x))
                x = F.relu(self.fc2(x))
                mean = self.fc_mean(x)
                log_std = self.fc_logstd(x)
                log_std = torch.tanh(log_std)
                log_std = log_std_min + 0.5 * (log_std_max - log_std_min) * (log_std + 1)
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

        self.torch, self.mse_loss = torch, F.mse_loss
        self.actor = Actor()
        self.qf1, self.qf2 = SoftQNetwork(), SoftQNetwork()
        self.qf1_target, self.qf2_target = SoftQNetwork(), SoftQNetwork()
        self.qf1_target.load_state_dict(self.qf1.state_dict())
        self.qf2_target.load_state_dict(self.qf2.state_dict())
        self.q_optimizer = torch.optim.Adam(list(self.qf1.parameters()) + list(self.qf2.parameters()),
                                            lr=SAC_Q_LR)
        self.actor_optimizer = torch.optim.Adam(list(self.actor.parameters()), lr=SAC_POLICY_LR)
        self.target_entropy = -float(SAC_ACTIONS)
        self.log_alpha = torch.zeros(1, requires_grad=True)
        self.alpha = self.log_alpha.exp().item()
        self.a_optimizer = torch.optim.Adam([self.log_alpha], lr=SAC_Q_LR)

    def train(self, batch, step: int) -> float:
        torch = self.torch
        from_numpy = torch.from_numpy
        obs, actions = from_numpy(batch["obs"]), from_numpy(batch["action"])
        next_obs, rewards = from_numpy(batch["next_obs"]), from_numpy(batch["reward"])
        dones = from_numpy(batch["terminated"]).float()
        actor, qf1, qf2, alpha = self.actor, self.qf1, self.qf2, self.alpha
        with torch.no_grad():
            next_state_actions, next_state_log_pi, _ = actor.get_action(next_obs)
            qf1_next_target = self.qf1_target(next_obs, next_state_actions)
            qf2_next_target = self.qf2_target(next_obs, next_state_actions)
            min_qf_next_target = torch.min(qf1_next_target, qf2_next_target) - alpha * next_state_log_pi
            next_q_value = rewards.flatten() + (1 - dones.flatten()) * SAC_GAMMA * (min_qf_next_target).view(-1)
        qf1_a_values = qf1(obs, actions).view(-1)
        qf2_a_values = qf2(obs, actions).view(-1)
        qf1_loss = self.mse_loss(qf1_a_values, next_q_value)
        qf2_loss = self.mse_loss(qf2_a_values, next_q_value)
        qf_loss = qf1_loss + qf2_loss
        self.q_optimizer.zero_grad()
        qf_loss.backward()
        self.q_optimizer.step()

        if step % SAC_POLICY_FREQUENCY == 0:
            for _ in range(SAC_POLICY_FREQUENCY):
                pi, log_pi, _ = actor.get_action(obs)
                qf1_pi = qf1(obs, pi)
                qf2_pi = qf2(obs, pi)
                min_qf_pi = torch.min(qf1_pi, qf2_pi)
                actor_loss = ((alpha * log_pi) - min_qf_pi).mean()
                self.actor_optimizer.zero_grad()
                actor_loss.backward()
                self.actor_optimizer.step()
                with torch.no_grad():
                    _, log_pi, _ = actor.get_action(obs)
                alpha_loss = (-self.log_alpha.exp() * (log_pi + self.target_entropy)).mean()
                self.a_optimizer.zero_grad()
                alpha_loss.backward()
                self.a_optimizer.step()
                alpha = self.alpha = self.log_alpha.exp().item()

        # target_network_frequency 1: every step
        for q, q_target in ((qf1, self.qf1_target), (qf2, self.qf2_target)):
            for param, target_param in zip(q.parameters(), q_target.parameters()):
                target_param.data.copy_(SAC_TAU * param.data + (1 - SAC_TAU) * target_param.data)
        return qf_loss.item()

    def act(self, obs):
        with self.torch.no_grad():
            action, _, _ = self.actor.get_action(self.torch.from_numpy(obs).unsqueeze(0))
            return action[0].numpy()

    @property
    def nbytes(self) -> int:
        """Bytes of the parameters and buffers of the five networks and ``log_alpha``, their
        gradients, and the three optimizers' state."""
        tensors = [self.log_alpha]
        for net in (self.actor, self.qf1, self.qf2, self.qf1_target, self.qf2_target):
            tensors += list(net.parameters()) + list(net.buffers())
        tensors += [p.grad for p in list(tensors) if p.grad is not None]
        for opt in (self.q_optimizer, self.actor_optimizer, self.a_optimizer):
            for state in opt.state.values():
                tensors += [v for v in state.values() if isinstance(v, self.torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in tensors)


def new_sac(impl: str):
    """A fresh learner, seed 0: :class:`tfdata.nn.SAC` with CleanRL's hyperparameters, or
    :class:`TorchSAC`."""
    if impl == "torch":
        return TorchSAC(require_torch())
    return tfdata.nn.SAC(SAC_OBS, SAC_LOW, SAC_HIGH, hidden=SAC_HIDDEN, gamma=SAC_GAMMA, tau=SAC_TAU,
                         policy_lr=SAC_POLICY_LR, q_lr=SAC_Q_LR,
                         policy_frequency=SAC_POLICY_FREQUENCY, seed=0)


def sac_obs(seed: int = 2) -> np.ndarray:
    """One Hopper observation, float32 (11,)."""
    return one_row(HOPPER, seed=seed)["obs"]


@functools.lru_cache(maxsize=None)  # one per (layout, impl) and process
def sac_learner(layout: str, impl: str):
    """A learner of ``impl`` that has made two updates (steps 1 and 2) on a batch of 256 of
    ``layout`` and acted once: kernels loaded, workspaces and Adam's moments allocated."""
    single_thread_blas()
    warm_kernels()
    buf = filled_buffer(layout, HOPPER, CAPACITY)
    net = new_sac(impl)
    sac_pair(net, buf.sample(SAC_BATCH))
    net.act(sac_obs())
    return net


#: CleanRL's global_step of each kept learner's last update, by id (a learner lives as long as
#: the process: :func:`sac_learner`'s cache holds it)
_SAC_STEPS: dict = {}


def sac_pair(net, batch) -> None:
    """Two consecutive updates on ``batch``: an odd step (the critics), then an even one (the
    critics, then the policy and the temperature, twice)."""
    step = _SAC_STEPS.get(id(net), 0)
    net.train(batch, step + 1)
    net.train(batch, step + 2)
    _SAC_STEPS[id(net)] = step + 2


class SACTrain:
    """Two consecutive SAC updates (steps 2k+1 and 2k+2: one without, one with the policy
    update) on a batch of 256 Hopper rows from a full 10,000-row buffer.

    ``"tfdata"``: ``SAC.train(batch, step)`` twice; ``"torch"``: CleanRL's update twice,
    ``torch.from_numpy`` conversion included. The batch is sampled in ``setup`` (a fresh one per
    reading). Half a reading is the mean update of CleanRL's loop.
    """

    params = [TFDATA_LAYOUTS, IMPLS]
    param_names = ["layout", "impl"]
    repeat = _SAC_SAMPLES
    timeout = 300

    def setup(self, layout, impl):
        self.net = sac_learner(layout, impl)
        self.batch = filled_buffer(layout, HOPPER, CAPACITY).sample(SAC_BATCH)

    def time_train(self, layout, impl):
        sac_pair(self.net, self.batch)


def net_products(sizes, forward: bool = True, weights: bool = False, inputs: bool = False,
                 first_input: bool = False) -> list:
    """The matrix products of one pass of an MLP of layer ``sizes`` over a batch of B rows.

    Returns ``[(kind, n_in, n_out)]``: per layer, ``"forward"`` (``h (B, n_in) @ W.T``, ``W``
    of shape (n_out, n_in)); backward, from the last layer, ``"weight"`` (``g.T @ h``: the
    weight gradient, (n_out, B) @ (B, n_in)) if ``weights``, and ``"input"`` (``g @ W``: the
    gradient of the layer's input, (B, n_out) @ (n_out, n_in)) for every layer but the first if
    ``inputs``, and for the first too if ``first_input``.
    """
    layers = list(zip(sizes, sizes[1:]))
    out = []
    if forward:
        out += [("forward", n_in, n_out) for n_in, n_out in layers]
    for i in range(len(layers) - 1, -1, -1):
        n_in, n_out = layers[i]
        if weights:
            out.append(("weight", n_in, n_out))
        if inputs and (i > 0 or first_input):
            out.append(("input", n_in, n_out))
    return out


def sac_products(obs_dim: int = SAC_OBS, n_act: int = SAC_ACTIONS, hidden=SAC_HIDDEN,
                 policy_frequency: int = SAC_POLICY_FREQUENCY, policy: bool = True,
                 autotune: bool = True) -> list:
    """The matrix products of one SAC update (``policy``: one with the policy update), from the
    network sizes: ``[(kind, n_in, n_out)]`` as :func:`net_products`, each over the batch.

    Critics: the actor forward at ``next_obs``, the two target critics and the two critics
    forward, the two critics backward (weight gradients; input gradients to the first layer).
    Then ``policy_frequency`` times: the actor forward (from the second time on with
    ``autotune``, the temperature's forward has just computed it: not repeated), the two critics
    forward and backward to the action (input gradients through every layer, no weight
    gradients: only the actor's parameters step), the actor backward (weight gradients), and
    with ``autotune`` the actor forward again for the temperature. CleanRL repeats that actor
    forward, and torch's autograd also computes the critics' weight gradients in the actor's
    backward (CleanRL does not freeze them): not counted, they are not needed.
    """
    actor = (obs_dim, *hidden, 2 * n_act)
    q = (obs_dim + n_act, *hidden, 1)
    out = net_products(actor)
    out += 4 * net_products(q)
    out += 2 * net_products(q, forward=False, weights=True, inputs=True)
    if policy:
        for it in range(policy_frequency):
            if it == 0 or not autotune:
                out += net_products(actor)
            out += 2 * net_products(q)
            out += 2 * net_products(q, forward=False, inputs=True, first_input=True)
            out += net_products(actor, forward=False, weights=True, inputs=True)
            if autotune:
                out += net_products(actor)
    return out


def product_operands(kind: str, n_in: int, n_out: int, batch: int, rng) -> tuple:
    """``(a, b, out)`` float32 for ``np.matmul(a, b, out=out)`` of one product of
    :func:`net_products`, in the memory orders ``tfdata.nn.SAC`` uses (``W`` C-contiguous
    (n_out, n_in); activations and gradients C-contiguous (B, n))."""
    def arr(*shape):
        return rng.standard_normal(shape, dtype=np.float32)

    if kind == "forward":
        return arr(batch, n_in), arr(n_out, n_in).T, np.zeros((batch, n_out), np.float32)
    if kind == "weight":
        return arr(batch, n_out).T, arr(batch, n_in), np.zeros((n_out, n_in), np.float32)
    return arr(batch, n_out), arr(n_out, n_in), np.zeros((batch, n_in), np.float32)


@functools.lru_cache(maxsize=None)
def floor_operands(batch: int = SAC_BATCH) -> list:
    """The operands of every product of a pair of updates (:func:`sac_products` without and
    with the policy update), allocated once per process: one set per distinct product, shared
    by its repeats, so that the working set is no larger than the update's (which reuses its
    weights and workspaces) and the floor stays a floor."""
    rng = np.random.default_rng(0)
    products = sac_products(policy=False) + sac_products(policy=True)
    sets = {p: product_operands(*p, batch, rng) for p in sorted(set(products))}
    return [sets[p] for p in products]


class SACFloor:
    """The BLAS floor of :class:`SACTrain`: the matrix products of its two updates alone.

    Each product of :func:`sac_products` (steps 2k+1 and 2k+2: 93 products, 582 million
    multiply-adds at batch 256) is one ``np.matmul(a, b, out=c)`` of float32 operands of the
    update's shapes and memory orders, preallocated, one set per distinct product (14 sets, 5.4 MB).
    One thread.
    """

    repeat = _SAC_SAMPLES
    timeout = 300

    def setup(self):
        single_thread_blas()
        self.operands = floor_operands()
        if first_time("sac_floor"):
            self.time_pair()

    def time_pair(self):
        matmul = np.matmul
        for a, b, out in self.operands:
            matmul(a, b, out=out)


@functools.lru_cache(maxsize=None)
def matmul_ikj():
    """The hand-written product ``matmul_ikj(a, b, out)``: ``out = a @ b`` by loops, compiled
    once per process (not cached, as the suite's other floors; compiled in ``setup``).

    Loop order i-k-j: each row of ``out`` accumulates the rows of ``b`` scaled by ``a[i, k]``,
    the inner loop contiguous in ``b`` and ``out`` (LLVM vectorises it; ``fastmath`` made no
    difference here). ``a`` (m, k), ``b`` (k, n), ``out`` (m, n): float32, C-contiguous.
    """
    from numba import njit

    @njit(nogil=True)
    def kernel(a, b, out):
        m, k = a.shape
        n = b.shape[1]
        for i in range(m):
            for j in range(n):
                out[i, j] = 0.0
            for p in range(k):
                aip = a[i, p]
                for j in range(n):
                    out[i, j] += aip * b[p, j]

    return kernel


#: (m, k, n) of the products ``MatMul`` times
MATMUL_SHAPES = ["256x256@256x256", "1x256@256x256", "256x14@14x256"]


def matmul_shape(name: str) -> tuple:
    left, right = name.split("@")
    m, k = (int(v) for v in left.split("x"))
    k2, n = (int(v) for v in right.split("x"))
    assert k == k2, name
    return m, k, n


class MatMul:
    """One float32 product ``a @ b`` into a preallocated ``out``: compiled loops
    (:func:`matmul_ikj`) against numpy's BLAS ``matmul``, one thread. C-contiguous operands."""

    params = [["numba", "numpy"], MATMUL_SHAPES]
    param_names = ["impl", "shape"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, impl, shape):
        single_thread_blas()
        m, k, n = matmul_shape(shape)
        rng = np.random.default_rng(0)
        self.a = rng.standard_normal((m, k), dtype=np.float32)
        self.b = rng.standard_normal((k, n), dtype=np.float32)
        self.out = np.zeros((m, n), np.float32)
        self.loops = matmul_ikj() if impl == "numba" else None  # compiled at the first call
        if first_time("matmul", impl, shape):
            self.time_matmul(impl, shape)

    def time_matmul(self, impl, shape):
        if impl == "numba":
            self.loops(self.a, self.b, self.out)
        else:
            np.matmul(self.a, self.b, out=self.out)


class SACAct:
    """An action for one Hopper observation (float32, shape (11,)): ``SAC.act(obs)`` against
    CleanRL's ``actor.get_action`` under ``torch.no_grad()``."""

    params = [IMPLS]
    param_names = ["impl"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, impl):
        self.net = sac_learner("aos", impl)
        self.obs = sac_obs()

    def time_act(self, impl):
        self.net.act(self.obs)


def sac_run(impl: str, steps: int):
    """Build and fill a 10,000-row AoS Hopper buffer and a learner, run ``steps`` sample +
    train steps (global steps 1 to ``steps``) and one act; return the learner."""
    buf = build_and_fill(MEMORY_LAYOUT, HOPPER, CAPACITY)
    net = new_sac(impl)
    for step in range(1, steps + 1):
        net.train(buf.sample(SAC_BATCH), step)
    net.act(sac_obs())
    return net


class SACMemory:
    """Memory of a SAC learner: peak RSS of build + 10 train steps + an act, and the bytes it
    keeps (``SAC.nbytes``; the torch agent's tensors, :attr:`TorchSAC.nbytes`)."""

    params = [IMPLS]
    param_names = ["impl"]
    timeout = 300
    steps = SAC_MEMORY_STEPS

    def setup(self, impl):
        single_thread_blas()
        if first_time("sac_memory", impl):
            warm_kernels()
            sac_run(impl, 2)  # a throwaway learner: kernels (or torch) loaded before the run

    def peakmem_train(self, impl):
        sac_run(impl, self.steps)

    def track_nbytes(self, impl):
        return sac_run(impl, self.steps).nbytes

    track_nbytes.unit = "bytes"


SAC_FIRST_TRAIN_AND_ACT = """
import json, time
import numpy as np
import numba  # imported before the clock starts
import tfdata
spec = tfdata.Spec.from_dict(json.loads(%(spec)r))
# the array types of a sampled AoS batch (field views of records), without the buffer's kernels
records = np.zeros(%(batch)d, spec.aos_dtype)
batch = {f.name: records[f.name] for f in spec}
rng = np.random.default_rng(0)
for name in ("obs", "next_obs", "reward"):
    batch[name][...] = rng.standard_normal(batch[name].shape)
batch["action"][...] = rng.uniform(-1, 1, batch["action"].shape)
obs = np.array(batch["obs"][0])
t0 = time.perf_counter()
sac = tfdata.nn.SAC(%(obs)d, -np.ones(%(act)d), np.ones(%(act)d), seed=0)
sac.train(batch, 1)
sac.train(batch, 2)
sac.act(obs)
print(time.perf_counter() - t0)
""" % {"spec": json.dumps(HOPPER.to_dict()), "batch": SAC_BATCH, "obs": SAC_OBS, "act": SAC_ACTIONS}


class SACCompile:
    """``SAC(11, ...)`` + first ``train`` of steps 1 and 2 (AoS field types; every kernel of the
    update) + first ``act``, in a fresh interpreter: ``"cold"`` (empty ``NUMBA_CACHE_DIR``) and
    ``"warm"`` (median of 3)."""

    params = [["cold", "warm"]]
    param_names = ["cache"]
    unit = "seconds"
    timeout = 300
    runs = {"cold": 1, "warm": 3}

    def setup(self, cache):
        child_seconds(SAC_FIRST_TRAIN_AND_ACT if cache == "warm" else IMPORTS)

    def track_first_train_and_act(self, cache):
        return first_call_seconds(SAC_FIRST_TRAIN_AND_ACT, cache=cache, runs=self.runs[cache])
