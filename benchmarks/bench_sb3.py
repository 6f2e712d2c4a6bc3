"""The Stable-Baselines3 drop-in (:mod:`tfdata.sb3`): ``add`` and ``sample`` as SB3's
algorithms call them, next to SB3's own ``ReplayBuffer`` (``layout="sb3"``, the baseline) in
the same run.

Needs the optional stable-baselines3 and gymnasium (``pip install tfdata[sb3]``); without
them every case is skipped. asv's own environments do not install them: run
``asv run --python=same -b bench_sb3`` in an environment that has them.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .common import warm_kernels

_MANY_SAMPLES = (200, 2000, 2.0)
#: what the buffers hold before anything is timed (SB3's default buffer is 1M; 100k keeps the
#: setup short and is past every cache)
CAPACITY = 100_000
_BUILT: dict = {}


def _imports():
    try:
        import gymnasium as gym
        from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer

        from tfdata.sb3 import ReplayBuffer
    except ImportError:
        raise NotImplementedError("stable-baselines3 is not installed") from None
    return gym, SB3Buffer, ReplayBuffer


def _spaces(task: str):
    gym = _imports()[0]
    if task == "cartpole":
        return gym.spaces.Box(-np.inf, np.inf, (4,), np.float32), gym.spaces.Discrete(2)
    return gym.spaces.Box(-8.0, 8.0, (3,), np.float32), gym.spaces.Box(-2.0, 2.0, (1,), np.float32)


def _steps(task: str, n_envs: int) -> list:
    """The ``add`` arguments of 20 steps as SB3's ``OffPolicyAlgorithm`` passes them: float32
    observations whose ``next_obs`` is the next ``obs`` (every stream continues), actions as
    SB3 stores them, float32 rewards, bool dones (every stream's episode ends at the 20th
    step), one info dict per environment."""
    obs_space, act_space = _spaces(task)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((n_envs,) + obs_space.shape, dtype=np.float32)
    if task == "cartpole":
        action = rng.integers(0, 2, (n_envs, 1))
    else:
        action = rng.uniform(-2, 2, (n_envs, 1)).astype(np.float32)
    reward = np.ones(n_envs, np.float32)
    infos = [{} for _ in range(n_envs)]
    step = (obs, obs, action, reward, np.zeros(n_envs, bool), infos)
    end = (obs, obs, action, reward, np.ones(n_envs, bool), infos)
    return [step] * 19 + [end]


def _buffer(layout: str, task: str, n_envs: int):
    """A buffer of ``CAPACITY`` transitions, full, built once per process (asv runs ``setup``
    before every sample), with the count of ``add`` calls."""
    key = (layout, task, n_envs)
    got = _BUILT.get(key)
    if got is None:
        _, SB3Buffer, ReplayBuffer = _imports()
        obs_space, act_space = _spaces(task)
        if layout == "sb3":
            buf = SB3Buffer(CAPACITY, obs_space, act_space, "cpu", n_envs=n_envs)
        else:
            buf = ReplayBuffer(CAPACITY, obs_space, act_space, "cpu", n_envs=n_envs, layout=layout, seed=0)
        steps = _steps(task, n_envs)
        k = 0
        for k in range(CAPACITY // n_envs + 3):
            buf.add(*steps[k % len(steps)])
        got = _BUILT[key] = (buf, [partial(buf.add, *s) for s in steps], [k + 1])
    return got


class Add:
    """``add`` of one step of ``n_envs`` environments into a full buffer, as SB3's
    ``OffPolicyAlgorithm.collect_rollouts`` calls it (one stream in 20 ends an episode)."""

    params = [["aos", "soa", "sb3"], ["cartpole", "pendulum"], [1, 4]]
    param_names = ["layout", "task", "n_envs"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, task, n_envs):
        warm_kernels()
        _, self.ops, self.k = _buffer(layout, task, n_envs)

    def time_add(self, layout, task, n_envs):
        k = self.k[0]
        self.ops[k % 20]()
        self.k[0] = k + 1


class AddAfterTrainStep:
    """:class:`Add` of one environment with the caches cold, as in training: before each timed
    call ``setup`` reads 64 MiB (twice the last-level cache of the machines here), as a
    gradient step's tensors evict the buffer's code and data between two ``add`` calls."""

    params = [["aos", "soa", "sb3"], ["cartpole", "pendulum"]]
    param_names = ["layout", "task"]
    repeat = (100, 1000, 2.0)
    _junk = None

    def setup(self, layout, task):
        warm_kernels()
        _, self.ops, self.k = _buffer(layout, task, 1)
        if AddAfterTrainStep._junk is None:
            AddAfterTrainStep._junk = np.ones(8 << 20)  # 64 MiB of float64, touched
        AddAfterTrainStep._junk.sum()

    def time_add(self, layout, task):
        k = self.k[0]
        self.ops[k % 20]()
        self.k[0] = k + 1


class Sample:
    """``sample(256)`` as SB3's ``train`` calls it: SB3's ``ReplayBufferSamples`` of torch
    tensors on the CPU."""

    params = [["aos", "soa", "sb3"], ["cartpole", "pendulum"]]
    param_names = ["layout", "task"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, task):
        warm_kernels()
        buf = _buffer(layout, task, 1)[0]
        self.op = partial(buf.sample, 256)
        self.op()

    def time_sample(self, layout, task):
        self.op()
