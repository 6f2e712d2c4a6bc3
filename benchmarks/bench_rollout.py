"""On-policy rollouts (``tfdata.RolloutBuffer``): GAE, minibatch gathers and vector steps, next to
CleanRL's own code for the same work.

The rollout is CleanRL's PPO on CartPole (``cleanrl/ppo.py``): 4 envs x 128 steps, minibatches
of 128 rows (4 per epoch); a bigger one, 8 x 2048, for GAE; an Atari-sized row (``obs`` uint8
``(4, 84, 84)``) for the gather. Rows hold ``obs``, ``action`` (int64), ``log_prob``,
``reward``, ``value`` (float32), ``terminated``, ``truncated`` (bool), and the buffer's own
``advantage`` and ``return``.

* ``GAE``: ``time_gae``, one ``compute_returns_and_advantages(last_values)`` (validation and
  one compiled call) for ``(steps, envs)`` of ``(128, 4)`` and ``(2048, 8)``; ``impl`` first
  where the layout would be, as the other files put the layout: ``"aos"`` / ``"soa"`` (tfdata),
  ``"cleanrl_numpy"`` (CleanRL's Python loop over time on numpy float32 arrays of shape
  ``(steps, envs)``), ``"cleanrl_torch"`` (the same loop on torch float32 tensors, as CleanRL
  runs it; skipped without torch) and ``"njit_call"`` (the bare call of a trivial ``@njit``
  function with the kernel's 13 arguments: the floor of any compiled call). Target (128 x 4):
  tfdata at most 4 µs a call.
* ``Minibatch``: ``time_next``, one minibatch of 128 rows gathered into the output ring (the
  iterator's step: the permutation of each epoch, drawn once per 4 minibatches, included) for
  ``row`` ``"cartpole"`` (obs float32 (4,)) and ``"atari"`` (obs uint8 (4, 84, 84)); baseline
  ``"memcpy"``: ``np.copyto`` of the same number of bytes (the AoS record bytes of 128 rows)
  from a pool as large as the rollout. Target: at most 1.2x memcpy.
* ``Add``: ``time_add``, one vector step of 4 envs (``RolloutBuffer.add``: validation and the
  writes of every field), against ``"numpy"``, CleanRL's storage: one preallocated array per
  field, ``obs[step] = next_obs`` and so on (no checks).
* ``Compile``: ``track_first_rollout``, seconds of building a buffer, adding 128 steps, the
  first GAE and the first epoch of minibatches in a fresh interpreter, with the kernels loaded
  from the cache (``"warm"``) or compiled (``"cold"``, an empty ``NUMBA_CACHE_DIR``).
* ``Memory``: ``peakmem_rollouts``, a process that runs 20 rollouts of 128 x 4 (add, GAE, 4
  epochs of 4 minibatches); ``track_nbytes``, the buffer's ``nbytes`` after them.
"""

from __future__ import annotations

import functools
import json
import os

import numpy as np

import tfdata

from .common import MemcpyReference, child_seconds, first_call_seconds, first_time

CARTPOLE_ROLLOUT = tfdata.Spec({"obs": ("f4", (4,)), "action": "i8", "log_prob": "f4",
                                "reward": "f4", "value": "f4", "terminated": "?", "truncated": "?"})
ATARI_ROLLOUT = tfdata.Spec({"obs": ("u1", (4, 84, 84)), "action": "i8", "log_prob": "f4",
                             "reward": "f4", "value": "f4", "terminated": "?", "truncated": "?"})
ROWS = {"cartpole": CARTPOLE_ROLLOUT, "atari": ATARI_ROLLOUT}
GAMMA, LAMBDA = 0.99, 0.95
STEPS, ENVS, MINIBATCHES = 128, 4, 4
_MANY_SAMPLES = (200, 2000, 2.0)


def require_torch():
    """The ``torch`` module, one thread; ``NotImplementedError`` (asv's skip) if not importable."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        import torch
    except ImportError as exc:
        raise NotImplementedError(f"torch cannot be imported: {exc}") from None
    torch.set_num_threads(1)
    return torch


def random_step(spec: tfdata.Spec, envs: int, rng) -> dict:
    """One vector step of exact dtypes (flags rare, as in CartPole)."""
    step = {}
    for f in spec:
        shape = (envs,) + f.shape
        if f.dtype.kind == "b":
            step[f.name] = rng.random(envs) < 0.02
        elif f.dtype.kind == "f":
            step[f.name] = rng.standard_normal(shape).astype(f.dtype)
        else:
            step[f.name] = rng.integers(0, 2 if f.name == "action" else 255, shape).astype(f.dtype)
    return step


@functools.lru_cache(maxsize=None)
@functools.lru_cache(maxsize=None)
def full_rollout(layout: str, row: str, steps: int, envs: int):
    """A full, computed rollout of ``row`` rows (built once per process: asv reruns ``setup``
    before every timed call, see benchmarks/common.py, and a fresh buffer would time a first,
    cold call)."""
    spec = ROWS[row]
    rng = np.random.default_rng(0)
    buf = tfdata.RolloutBuffer(spec, num_steps=steps, num_envs=envs, layout=layout, seed=0)
    for _ in range(steps):
        buf.add(random_step(spec, envs, rng))
    buf.compute_returns_and_advantages(np.zeros(envs, np.float32), gamma=GAMMA, gae_lambda=LAMBDA)
    return buf


def cleanrl_gae(rewards, values, dones, next_value, next_done, num_steps, gamma=GAMMA,
                gae_lambda=LAMBDA):
    """cleanrl/ppo.py's loop (numpy arrays or torch tensors alike)."""
    advantages = rewards * 0
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


@functools.lru_cache(maxsize=None)
def _trivial():
    from numba import njit

    @njit(cache=False, nogil=True)
    def call13(a, b, c, d, e, f, g, h, i, j, k, m, n):
        return 0

    return call13


class GAE:
    """One ``compute_returns_and_advantages`` against CleanRL's loop (numpy, torch) and the bare
    call of a trivial ``@njit`` function with as many arguments. Target: <= 4 µs at 128 x 4."""

    params = [["aos", "soa", "cleanrl_numpy", "cleanrl_torch", "njit_call"], ["128x4", "2048x8"]]
    param_names = ["impl", "shape"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, impl, shape):
        steps, envs = map(int, shape.split("x"))
        self.last = np.zeros(envs, np.float32)
        if impl in ("aos", "soa"):
            self.buf = full_rollout(impl, "cartpole", steps, envs)
            return
        buf = full_rollout("soa", "cartpole", steps, envs)
        rng = np.random.default_rng(1)
        arrays = [np.array(buf.field("reward")), np.array(buf.field("value")),
                  (rng.random((steps, envs)) < 0.02).astype(np.float32), self.last,
                  np.zeros(envs, np.float32)]
        if impl == "cleanrl_torch":
            torch = require_torch()
            arrays = [torch.from_numpy(a) for a in arrays]
            self.no_grad = torch.no_grad
        if impl == "njit_call":
            f = _trivial()
            a = buf.field("reward")
            self.args = (a, a, buf.field("terminated"), buf.field("terminated"), a, False, self.last,
                         self.last, False, np.float32(GAMMA), np.float32(GAMMA * LAMBDA), a, a)
            f(*self.args)
            self.f = f
        self.arrays, self.steps = arrays, steps

    def time_gae(self, impl, shape):
        if impl in ("aos", "soa"):
            self.buf.compute_returns_and_advantages(self.last)
        elif impl == "cleanrl_numpy":
            cleanrl_gae(*self.arrays, self.steps)
        elif impl == "cleanrl_torch":
            with self.no_grad():
                cleanrl_gae(*self.arrays, self.steps)
        else:
            self.f(*self.args)


#: the running minibatch iterator of each (layout, row) in this process
_ITERATORS: dict = {}


class Minibatch:
    """One minibatch of 128 rows from a computed 128 x 4 rollout, against ``np.copyto`` of the
    same bytes. Target: <= 1.2x memcpy."""

    params = [["aos", "soa", "memcpy"], ["cartpole", "atari"]]
    param_names = ["layout", "row"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, layout, row):
        m = STEPS * ENVS // MINIBATCHES
        if layout == "memcpy":
            spec = ROWS[row]
            self.ref = memcpy_for(row, m * spec.aos_dtype.itemsize, STEPS * ENVS * spec.aos_dtype.itemsize)
            return
        self.buf = full_rollout(layout, row, STEPS, ENVS)
        self.it = _ITERATORS.get((layout, row))
        if self.it is None:  # one endless run of epochs; the first minibatch builds the ring
            self.it = _ITERATORS[layout, row] = self.buf.minibatches(MINIBATCHES, epochs=10**9, seed=0)
            next(self.it)

    def time_next(self, layout, row):
        if layout == "memcpy":
            self.ref.copy()
        else:
            next(self.it)


@functools.lru_cache(maxsize=None)
def memcpy_for(row, nbytes, pool):
    return MemcpyReference(nbytes, pool)


class NumpyRollout:
    """CleanRL's storage: one preallocated array per field, written by index (no checks)."""

    def __init__(self, spec, steps, envs):
        self.arrays = {f.name: np.zeros((steps, envs) + f.shape, f.dtype) for f in spec}
        self.t, self.steps = 0, steps

    def add(self, step):
        t = self.t
        for name, a in self.arrays.items():
            a[t] = step[name]
        self.t = (t + 1) % self.steps


@functools.lru_cache(maxsize=None)
def _add_target(layout: str):
    """The buffer :class:`Add` writes, one per process (asv reruns ``setup`` before every timed
    call; a fresh buffer each time would time a cold first ``add`` into untouched pages)."""
    if layout == "numpy":
        return NumpyRollout(CARTPOLE_ROLLOUT, STEPS, ENVS)
    return tfdata.RolloutBuffer(CARTPOLE_ROLLOUT, num_steps=STEPS, num_envs=ENVS, layout=layout,
                                seed=0)


class Add:
    """One vector step of 4 envs (CartPole rows): ``RolloutBuffer.add`` against CleanRL's
    per-field array writes."""

    params = [["aos", "soa", "numpy"]]
    param_names = ["layout"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, layout):
        self.step = random_step(CARTPOLE_ROLLOUT, ENVS, np.random.default_rng(2))
        self.buf = _add_target(layout)

    def time_add(self, layout):
        buf = self.buf
        if layout != "numpy" and buf.full:
            buf.reset()
        buf.add(self.step)


FIRST_ROLLOUT = """
import json, time
import numpy as np
import numba
import tfdata
spec = tfdata.Spec.from_dict(json.loads(%(spec)r))
rng = np.random.default_rng(0)
steps = [{"obs": rng.standard_normal((4, 4)).astype(np.float32), "action": np.zeros(4, np.int64),
          "log_prob": np.zeros(4, np.float32), "reward": np.ones(4, np.float32),
          "value": np.zeros(4, np.float32), "terminated": np.zeros(4, bool),
          "truncated": np.zeros(4, bool)} for _ in range(128)]
t0 = time.perf_counter()
buf = tfdata.RolloutBuffer(spec, num_steps=128, num_envs=4, seed=0)
for s in steps:
    buf.add(s)
buf.compute_returns_and_advantages(np.zeros(4, np.float32))
for mb in buf.minibatches(4, epochs=1, seed=0):
    pass
print(time.perf_counter() - t0)
""" % {"spec": json.dumps(CARTPOLE_ROLLOUT.to_dict())}


class Compile:
    """Build + 128 adds + first GAE + first epoch of minibatches in a fresh interpreter (AoS):
    ``"warm"`` kernels from the cache (median of 3), ``"cold"`` compiled (an empty
    ``NUMBA_CACHE_DIR``, one run)."""

    params = [["cold", "warm"]]
    param_names = ["cache"]
    unit = "seconds"
    timeout = 300
    runs = {"cold": 1, "warm": 3}

    def setup(self, cache):
        if first_time("rollout-compile", cache):
            child_seconds(FIRST_ROLLOUT)

    def track_first_rollout(self, cache):
        return first_call_seconds(FIRST_ROLLOUT, cache=cache, runs=self.runs[cache])


def rollouts(n: int):
    rng = np.random.default_rng(3)
    steps = [random_step(CARTPOLE_ROLLOUT, ENVS, rng) for _ in range(STEPS)]
    buf = tfdata.RolloutBuffer(CARTPOLE_ROLLOUT, num_steps=STEPS, num_envs=ENVS, seed=0)
    last = np.zeros(ENVS, np.float32)
    for _ in range(n):
        buf.reset()
        for s in steps:
            buf.add(s)
        buf.compute_returns_and_advantages(last)
        for mb in buf.minibatches(MINIBATCHES, epochs=4):
            pass
    return buf


class Memory:
    """20 rollouts of 128 x 4 (add, GAE, 4 epochs of 4 minibatches): the peak RSS of the process,
    and the buffer's ``nbytes`` (rows, bookkeeping, one output ring)."""

    timeout = 300

    def setup(self):
        if first_time("rollout-memory"):
            rollouts(1)  # load the kernels before the measured run

    def peakmem_rollouts(self):
        rollouts(20)

    def track_nbytes(self):
        return rollouts(1).nbytes

    track_nbytes.unit = "bytes"
