"""The kernels of :class:`tfdata.nn.SAC` besides the matrix products: bias and ReLU, the
tanh-squashed Gaussian and its backward pass, the critic's target and loss, the minimum of the
twin critics, the temperature's gradient, Polyak averaging, and the whole actor for a few rows
(acting).

The batched matrix products of the update are numpy's (its BLAS, ``matmul`` into preallocated
arrays): at SAC's sizes (batch 256 by 256 units) they are faster than compiled loops
(``reports/sac/``). Every kernel writes into arrays it is given and allocates nothing; all are
generic in the float type (float32 in use, float64 for the checks against torch). Arrays named
``(B, n)`` are C-contiguous.
"""

from __future__ import annotations

import math

from .. import _kernel_cache

_kernel_cache.install()  # before the first kernel is defined, as tfdata.kernels does

from numba import njit  # noqa: E402

from .._config import NN_OPTIONS  # noqa: E402

#: CleanRL's bounds of the actor's log standard deviation
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
# the log-probability's constant, log(sqrt(2 pi)), as torch.distributions.Normal takes it
_LOG_SQRT_2PI = math.log(math.sqrt(2.0 * math.pi))


@njit(**NN_OPTIONS)
def bias_act(h, b, relu):
    """``h += b`` row by row, then ``max(h, 0)`` if ``relu``.

    Parameters
    ----------
    h : ndarray of float, shape (B, n)
        Updated in place.
    b : ndarray of float, shape (n,)
    relu : bool
    """
    rows, n = h.shape
    for i in range(rows):
        for j in range(n):
            v = h[i, j] + b[j]
            h[i, j] = 0.0 if (relu and v < 0.0) else v  # NaN stays NaN, as torch's relu


@njit(**NN_OPTIONS)
def relu_backward(g, h):
    """``g *= (h > 0)``: through a ReLU, as torch takes its gradient (0 at 0).

    Parameters
    ----------
    g : ndarray of float, shape (B, n)
        d loss / d (the ReLU's output); becomes d loss / d (its input).
    h : ndarray of float, shape (B, n)
        The ReLU's output.
    """
    rows, n = g.shape
    for i in range(rows):
        for j in range(n):
            if h[i, j] <= 0.0:
                g[i, j] = 0.0


@njit(**NN_OPTIONS)
def column_sums(g, out):
    """``out[j] = sum_i g[i, j]`` (a bias's gradient).

    Parameters
    ----------
    g : ndarray of float, shape (B, n)
    out : ndarray of float, shape (n,)
    """
    rows, n = g.shape
    for j in range(n):
        out[j] = 0.0
    for i in range(rows):
        for j in range(n):
            out[j] += g[i, j]


@njit(**NN_OPTIONS)
def squashed_gaussian(head, eps, scale, bias, t, std, y, action, logp):
    """CleanRL's ``Actor.get_action``: the tanh-squashed Gaussian sample and its log-probability.

    ``log_std = -5 + 3.5 * (tanh(head[:, A:]) + 1)``, ``x = mean + exp(log_std) * eps``,
    ``action = tanh(x) * scale + bias``, and ``logp`` the Normal's log-density of ``x`` minus
    ``log(scale * (1 - tanh(x)**2) + 1e-6)``, summed over the action's elements.

    Parameters
    ----------
    head : ndarray of float, shape (B, 2A)
        The actor's output: the means, then the unsquashed log standard deviations.
    eps : ndarray of float, shape (B, A)
        Standard normal draws.
    scale, bias : ndarray of float, shape (A,)
        ``(high - low) / 2`` and ``(high + low) / 2`` of the action space.
    t, std, y : ndarray of float, shape (B, A)
        Written for the backward pass: ``tanh(head[:, A:])``, the standard deviations, ``tanh(x)``.
    action : ndarray of float, shape (B, A) (any strides)
        Written.
    logp : ndarray of float, shape (B,)
        Written.
    """
    rows, n = eps.shape
    half = 0.5 * (LOG_STD_MAX - LOG_STD_MIN)
    for i in range(rows):
        total = 0.0
        for a in range(n):
            mean = head[i, a]
            ti = math.tanh(head[i, n + a])
            log_std = LOG_STD_MIN + half * (ti + 1.0)
            s = math.exp(log_std)
            x = mean + s * eps[i, a]
            yi = math.tanh(x)
            d = x - mean
            total += (-(d * d) / (2.0 * (s * s)) - math.log(s) - _LOG_SQRT_2PI
                      - math.log(scale[a] * (1.0 - yi * yi) + 1e-6))
            t[i, a], std[i, a], y[i, a] = ti, s, yi
            action[i, a] = yi * scale[a] + bias[a]
        logp[i] = total


@njit(**NN_OPTIONS)
def squashed_gaussian_backward(g_action, c_logp, eps, t, std, y, scale, g_head):
    """The gradient of ``sum(g_action * action) + c_logp * sum(logp)`` with respect to the actor's
    output ``head``, from what :func:`squashed_gaussian` kept.

    Parameters
    ----------
    g_action : ndarray of float, shape (B, A)
        d loss / d action.
    c_logp : float
        d loss / d logp of every row (``alpha / B`` for the mean of ``alpha * logp - min Q``).
    eps, t, std, y : ndarray of float, shape (B, A)
        As :func:`squashed_gaussian` used and wrote them.
    scale : ndarray of float, shape (A,)
    g_head : ndarray of float, shape (B, 2A)
        Written: d loss / d mean, then d loss / d (unsquashed log std).
    """
    rows, n = eps.shape
    half = 0.5 * (LOG_STD_MAX - LOG_STD_MIN)
    for i in range(rows):
        for a in range(n):
            yi = y[i, a]
            one = 1.0 - yi * yi
            g_y = g_action[i, a] * scale[a] + c_logp * (2.0 * yi * scale[a]) / (scale[a] * one + 1e-6)
            g_x = g_y * one
            # the Normal's quadratic term has no gradient: x - mean is std * eps exactly
            g_log_std = g_x * eps[i, a] * std[i, a] - c_logp
            g_head[i, a] = g_x
            g_head[i, n + a] = g_log_std * half * (1.0 - t[i, a] * t[i, a])


@njit(**NN_OPTIONS)
def critic_target(reward, terminated, q1, q2, logp, alpha, gamma, out):
    """``out = reward + (1 - terminated) * gamma * (min(q1, q2) - alpha * logp)``.

    Parameters
    ----------
    reward : ndarray of float, shape (B,)
    terminated : ndarray of bool, shape (B,)
    q1, q2 : ndarray of float, shape (B, 1)
        The target critics at the next observation and the next action.
    logp : ndarray of float, shape (B,)
        The next action's log-probability.
    alpha, gamma : float
    out : ndarray of float, shape (B,)
    """
    for i in range(out.shape[0]):
        a, b = q1[i, 0], q2[i, 0]
        m = (a if a < b else b) - alpha * logp[i]
        out[i] = reward[i] + ((0.0 if terminated[i] else 1.0) * gamma) * m


@njit(**NN_OPTIONS)
def mse_backward(q, target, g):
    """``mean((q - target)**2)``, returned, and its gradient ``2 (q - target) / B`` into ``g``.

    Parameters
    ----------
    q, g : ndarray of float, shape (B, 1)
    target : ndarray of float, shape (B,)
    """
    rows = q.shape[0]
    total = 0.0
    for i in range(rows):
        d = q[i, 0] - target[i]
        total += d * d
        g[i, 0] = 2.0 * d / rows
    return total / rows


@njit(**NN_OPTIONS)
def min_backward(q1, q2, logp, alpha, g1, g2):
    """The actor's loss ``mean(alpha * logp - min(q1, q2))``, returned, and its gradient with
    respect to ``q1`` and ``q2`` (``-1/B`` to the smaller, half to each on a tie, as torch).

    Parameters
    ----------
    q1, q2, g1, g2 : ndarray of float, shape (B, 1)
    logp : ndarray of float, shape (B,)
    alpha : float
    """
    rows = q1.shape[0]
    c = -1.0 / rows
    total = 0.0
    for i in range(rows):
        a, b = q1[i, 0], q2[i, 0]
        if a < b:
            g1[i, 0], g2[i, 0] = c, 0.0
        elif b < a:
            g1[i, 0], g2[i, 0] = 0.0, c
        else:
            g1[i, 0] = g2[i, 0] = 0.5 * c
        total += alpha * logp[i] - (a if a < b else b)
    return total / rows


@njit(**NN_OPTIONS)
def action_gradient(g_in1, g_in2, start, out):
    """``out = g_in1[:, start:] + g_in2[:, start:]``: what both critics say of the action.

    Parameters
    ----------
    g_in1, g_in2 : ndarray of float, shape (B, start + A)
        d loss / d (observation, action) through each critic.
    start : int
    out : ndarray of float, shape (B, A)
    """
    rows, n = out.shape
    for i in range(rows):
        for a in range(n):
            out[i, a] = g_in1[i, start + a] + g_in2[i, start + a]


@njit(**NN_OPTIONS)
def temperature_gradient(logp, target_entropy, log_alpha, grad):
    """The temperature's loss ``mean(-exp(log_alpha) * (logp + target_entropy))``, returned, and
    its gradient with respect to ``log_alpha`` into ``grad[0]`` (the same value: the loss is
    linear in ``exp(log_alpha)``).

    Parameters
    ----------
    logp : ndarray of float, shape (B,)
    target_entropy : float
    log_alpha, grad : ndarray of float, shape (1,)
    """
    rows = logp.shape[0]
    e = math.exp(log_alpha[0])
    total = 0.0
    for i in range(rows):
        total += logp[i] + target_entropy
    grad[0] = -e * (total / rows)
    return grad[0]


@njit(**NN_OPTIONS)
def polyak(target, source, tau, keep):
    """``target = tau * source + keep * target`` (``keep`` is ``1 - tau`` in the arrays' float).

    Parameters
    ----------
    target, source : ndarray of float, shape (n,)
    tau, keep : float of the arrays' type
    """
    for k in range(target.shape[0]):
        target[k] = tau * source[k] + keep * target[k]


@njit(**NN_OPTIONS)
def first_nonfinite(x):
    """The flat index of the first NaN or inf of ``x`` (C-contiguous, any shape), or -1."""
    flat = x.reshape(-1)
    for k in range(flat.shape[0]):
        if not math.isfinite(flat[k]):
            return k
    return -1


@njit(**NN_OPTIONS)
def actor_act(params, table, x, eps, scale, bias, deterministic, h, action):
    """The actor, row by row, for acting: the forward pass of the ReLU trunk and the heads, then
    the squashed sample (``deterministic``: ``tanh(mean) * scale + bias``). A NaN in ``x`` or in
    the parameters gives NaN actions: the caller checks them with :func:`first_nonfinite` (a
    check inside this kernel is folded away under its floating-point freedoms).

    Parameters
    ----------
    params : ndarray of float, shape (n_params,)
        The actor's parameters, laid out as ``table`` says (as :class:`~tfdata.nn.MLP`'s).
    table : ndarray of int64, shape (layers, 5)
    x : ndarray of float, shape (n, obs_dim)
    eps : ndarray of float, shape (n, A)
        Standard normal draws (not read when ``deterministic``).
    scale, bias : ndarray of float, shape (A,)
    deterministic : bool
    h : ndarray of float, shape (2, width)
        Work space: the hidden layers' outputs.
    action : ndarray of float, shape (n, A)
        Written.
    """
    layers = table.shape[0]
    n_act = action.shape[1]
    half = 0.5 * (LOG_STD_MAX - LOG_STD_MIN)
    for r in range(x.shape[0]):
        for layer in range(layers):
            n_in, n_out, w, b = table[layer, 0], table[layer, 1], table[layer, 2], table[layer, 3]
            src = x[r] if layer == 0 else h[(layer - 1) % 2]
            dst = h[layer % 2]
            for j in range(n_out):
                acc = params[b + j]
                # a row of the weight as a slice: indexed from 0, so the loads are contiguous
                # vectors (params[w + j * n_in + k] compiled to gathers)
                row = params[w + j * n_in:w + (j + 1) * n_in]
                for k in range(n_in):
                    acc += row[k] * src[k]
                dst[j] = 0 if (acc < 0 and layer < layers - 1) else acc  # NaN stays NaN
        out = (layers - 1) % 2
        for a in range(n_act):
            mean = h[out, a]
            if deterministic:
                v = math.tanh(mean) * scale[a] + bias[a]
            else:
                log_std = LOG_STD_MIN + half * (math.tanh(h[out, n_act + a]) + 1.0)
                v = math.tanh(mean + math.exp(log_std) * eps[r, a]) * scale[a] + bias[a]
            action[r, a] = v
