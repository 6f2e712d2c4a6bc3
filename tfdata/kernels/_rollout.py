"""Kernels of the rollout buffer (:class:`tfdata.RolloutBuffer`): generalized advantage estimation
over a time-major rollout, and a minibatch's rows of an epoch's permutation (drawn by
:func:`tfdata.kernels._rng.permutation`, the loader's shuffle).

The GAE kernel reads and writes ``(num_steps, num_envs)`` views of single fields, whatever the
layout: contiguous columns (SoA, a column group of one field) or strided views into records (AoS,
a record group). numba compiles one specialization per combination of contiguity; the source is
one. Nothing here allocates.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .._config import NJIT_OPTIONS

_ONE = np.float32(1.0)
_ZERO = np.float32(0.0)


@njit(**NJIT_OPTIONS)
def gae(reward, value, terminated, truncated, final_value, use_final, last_values, last_dones,
        check_dones, gamma, gamma_lambda, advantage, returns):
    """Generalized advantage estimates and returns of a full rollout, in float32, in CleanRL's
    operation order.

    For each env ``e``, from ``t = T - 1`` down to 0 (``lastgaelam`` starts at 0)::

        ended = terminated[t, e] or truncated[t, e]
        nextvalues = final_value[t, e] if truncated and use_final and not terminated
                     else (last_values[e] if t == T - 1 else value[t + 1, e])
        boot = 0 if terminated or (truncated and not use_final) else 1
        delta = reward[t, e] + gamma * nextvalues * boot - value[t, e]
        lastgaelam = delta + gamma_lambda * cont * lastgaelam     (cont = 0 if ended else 1)
        advantage[t, e] = lastgaelam; returns[t, e] = lastgaelam + value[t, e]

    (left to right, every product and sum rounded to float32, as CleanRL's
    ``delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]`` and
    ``advantages[t] = lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal *
    lastgaelam``). Without truncations ``boot == cont == 1 - terminated``: exactly CleanRL's loop.

    Parameters
    ----------
    reward, value, final_value : ndarray of float32, shape (T, E)
        Any strides. ``final_value`` is read only where ``truncated`` and ``use_final``.
    terminated, truncated : ndarray of bool, shape (T, E)
        Any strides (a spec without ``truncated`` passes ``terminated`` twice).
    use_final : bool
        Bootstrap a truncated step from ``final_value`` (else a truncation cuts like a
        termination).
    last_values : ndarray of float32, shape (E,)
        The critic's value of the observation after the last step.
    last_dones : ndarray of float32, shape (E,)
        The caller's flag of each env's last step (CleanRL's ``next_done``); checked when
        ``check_dones``: each must be 0 or 1 and equal ``terminated | truncated`` of row T - 1.
    gamma, gamma_lambda : float32
        The discount and ``float32(gamma * gae_lambda)`` (the product taken in double precision,
        as Python does in CleanRL).
    advantage, returns : ndarray of float32, shape (T, E)
        Outputs, any strides.

    Returns
    -------
    int
        0 when done. Otherwise nothing was written and the value names the first problem, for an
        env ``e``: ``1 + e`` (``last_values[e]`` not finite), ``1 + E + e`` (``last_dones[e]``
        not 0 or 1), ``1 + 2E + e`` (``last_dones[e]`` disagrees with the last row's flags).
    """
    T = reward.shape[0]
    E = reward.shape[1]
    # every check before any write: a refused call changes nothing
    for e in range(E):
        if not math.isfinite(last_values[e]):
            return 1 + e
    if check_dones:
        for e in range(E):
            d = last_dones[e]
            if d != _ZERO and d != _ONE:
                return 1 + E + e
        for e in range(E):
            ended = terminated[T - 1, e] or truncated[T - 1, e]
            if ended != (last_dones[e] == _ONE):
                return 1 + 2 * E + e
    # time outer, envs inner: the envs' recurrences are independent, so their latency chains
    # overlap and rows are read in memory order (env outer, one chain at a time, was slower:
    # docs/design/rollouts.md); the running
    # ``lastgaelam`` of env e is the advantage just written at row t + 1
    for t in range(T - 1, -1, -1):
        last = t == T - 1
        for e in range(E):
            if last:
                nextvalues = last_values[e]
                lastgaelam = _ZERO
            else:
                nextvalues = value[t + 1, e]
                lastgaelam = advantage[t + 1, e]
            term = terminated[t, e]
            trunc = truncated[t, e]
            if term:
                boot = _ZERO
            elif trunc:
                if use_final:
                    boot = _ONE
                    nextvalues = final_value[t, e]
                else:
                    boot = _ZERO
            else:
                boot = _ONE
            cont = _ZERO if (term or trunc) else _ONE
            v = value[t, e]
            delta = reward[t, e] + gamma * nextvalues * boot - v
            lastgaelam = delta + gamma_lambda * cont * lastgaelam
            advantage[t, e] = lastgaelam
            returns[t, e] = lastgaelam + v
    return 0


@njit(**NJIT_OPTIONS)
def take(perm, start, idx):
    """``idx[:] = perm[start:start + len(idx)]`` (a minibatch's rows; the caller checks the
    range)."""
    for i in range(idx.shape[0]):
        idx[i] = perm[start + i]


__all__ = ["gae", "take"]
