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
