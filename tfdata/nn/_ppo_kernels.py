"""tanh multilayer perceptrons and PPO (CleanRL's ``ppo.py`` update) as kernels.

Every kernel writes into arrays it is given and allocates nothing. Parameters are laid out as in
:mod:`tfdata.nn._mlp_kernels`; hidden layers apply tanh, the last layer is linear. Two layouts
of the layer outputs (docs/design/nn.md says why):

* **feature-major** (training, :func:`tanh_forward`, :func:`tanh_backward`, :func:`ppo_train`):
  the input is first transposed into ``xT`` (n_in, batch) and layer ``l``'s output is a
  C-contiguous ``(n_out, batch)`` block at ``batch * a_off`` of ``acts``.
* **batch-major** (acting on a few observations, :func:`ppo_act`, :func:`ppo_value`): layer
  ``l``'s output is a ``(batch, n_out)`` block.

tanh of float32 is Eigen's rational approximation (clamped to +-7.9053; within a few float32
ulps of ``tanh``, and vectorisable); float64 networks (gradient checks) use ``math.tanh``. Its
derivative is taken as ``1 - y**2`` of the output ``y``, as torch does.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .._config import NN_OPTIONS
from ..kernels._rng import GOLDEN, mix64
from ._mlp_kernels import INLINE_NN, adam_step, axpy_rows, rows_dense

# Eigen's generic_fast_tanh_float (float32 constants, so the arithmetic stays float32)
_CLAMP = np.float32(7.90531110763549805)
_TINY = np.float32(0.0004)
_A1 = np.float32(4.89352455891786e-03)
_A3 = np.float32(6.37261928875436e-04)
_A5 = np.float32(1.48572235717979e-05)
_A7 = np.float32(5.12229709037114e-08)
_A9 = np.float32(-8.60467152213735e-11)
_A11 = np.float32(2.00018790482477e-13)
_A13 = np.float32(-2.76076847742355e-16)
_B0 = np.float32(4.89352518554385e-03)
_B2 = np.float32(2.26843463243900e-03)
_B4 = np.float32(1.18534705686654e-04)
_B6 = np.float32(1.19825839466702e-06)
_TWO53 = 1.0 / 9007199254740992.0
_S11 = np.uint64(11)
_ONE = np.uint64(1)


@njit(**INLINE_NN)
def _tanh_row(a):
    """``a = tanh(a)`` in place, ``a`` 1-D contiguous."""
    if a.itemsize == 8:
        for k in range(a.shape[0]):
            a[k] = math.tanh(a[k])
        return
    for k in range(a.shape[0]):
        x0 = a[k]
        x = min(max(x0, -_CLAMP), _CLAMP)
        x2 = x * x
        p = x2 * _A13 + _A11
        p = p * x2 + _A9
        p = p * x2 + _A7
        p = p * x2 + _A5
        p = p * x2 + _A3
        p = p * x2 + _A1
        p = p * x
        q = x2 * _B6 + _B4
        q = q * x2 + _B2
        q = q * x2 + _B0
        a[k] = x0 if abs(x0) < _TINY else p / q


@njit(**INLINE_NN)
def _fm_forward(wt, bias, xT, outT, tanh):
    """Feature-major layer: ``outT = wt @ xT + bias[:, None]`` (then tanh).

    wt (n_out, n_in), xT (n_in, batch), outT (n_out, batch)."""
    n_out = wt.shape[0]
    batch = xT.shape[1]
    for j in range(n_out):
        o = outT[j]
        bj = bias[j]
        for b in range(batch):
            o[b] = bj
        axpy_rows(o, xT, None, wt[j], wt.shape[1])
        if tanh:
            _tanh_row(o)


@njit(**INLINE_NN)
def _fm_backward(wt, xT, dT, gw, gb, prevT, has_prev, tanh_in):
    """Gradients of one feature-major layer given ``dT`` = d loss / d output, (n_out, batch).

    Writes ``gw = dT @ xT.T`` (n_out, n_in) and ``gb = dT.sum(1)``; if ``has_prev``, writes
    ``prevT = (wt.T @ dT) * (1 - xT**2)`` (n_in, batch): the gradient before the previous
    layer's tanh (``tanh_in``; its output is this layer's input ``xT``).
    """
    n_out, n_in = wt.shape
    batch = xT.shape[1]
    for j in range(n_out):
        d = dT[j]
        # accumulators of the array's float type (a Python 0.0 would make them float64): a
        # zero read back from the output
        gb[j] = 0.0
        zero = gb[j]
        s = zero
        for b in range(batch):
            s += d[b]
        gb[j] = s
        i = 0
        while i + 4 <= n_in:
            x0 = xT[i]
            x1 = xT[i + 1]
            x2 = xT[i + 2]
            x3 = xT[i + 3]
            s0 = s1 = s2 = s3 = zero
            for b in range(batch):
                db = d[b]
                s0 += db * x0[b]
                s1 += db * x1[b]
                s2 += db * x2[b]
                s3 += db * x3[b]
            gw[j, i] = s0
            gw[j, i + 1] = s1
            gw[j, i + 2] = s2
            gw[j, i + 3] = s3
            i += 4
        while i < n_in:
            x0 = xT[i]
            s0 = zero
            for b in range(batch):
                s0 += d[b] * x0[b]
            gw[j, i] = s0
            i += 1
    if has_prev:
        wtt = wt.T
        for i in range(n_in):
            p = prevT[i]
            for b in range(batch):
                p[b] = 0.0
            axpy_rows(p, dT, None, wtt[i], n_out)
            if tanh_in:
                y = xT[i]
                for b in range(batch):
                    p[b] -= p[b] * y[b] * y[b]  # * (1 - y**2), in the array's float type


@njit(**INLINE_NN)
def _net_forward(params, table, xT, acts):
    """Every layer of a tanh network, feature-major (see the module docstring)."""
    n_layers = table.shape[0]
    batch = xT.shape[1]
    for layer in range(n_layers):
        n_in, n_out, w, bo, a = table[layer, 0], table[layer, 1], table[layer, 2], table[layer, 3], table[layer, 4]
        wt = params[w:w + n_out * n_in].reshape((n_out, n_in))
        out = acts[batch * a:batch * (a + n_out)].reshape((n_out, batch))
        if layer == 0:
            _fm_forward(wt, params[bo:bo + n_out], xT, out, n_layers > 1)
        else:
            pa = table[layer - 1, 4]
            inp = acts[batch * pa:batch * (pa + n_in)].reshape((n_in, batch))
            _fm_forward(wt, params[bo:bo + n_out], inp, out, layer < n_layers - 1)


@njit(**INLINE_NN)
def _net_backward(params, table, xT, acts, dT, grads, work):
    """d loss / d params of a tanh network into ``grads`` (overwritten), given ``dT`` (n_out,
    batch) at its output and the ``acts`` of its forward pass; ``work`` (2 * batch * widest)."""
    n_layers = table.shape[0]
    batch = xT.shape[1]
    half = work.shape[0] // 2
    cur = 0
    for layer in range(n_layers - 1, -1, -1):
        n_in, n_out, w, bo = table[layer, 0], table[layer, 1], table[layer, 2], table[layer, 3]
        wt = params[w:w + n_out * n_in].reshape((n_out, n_in))
        gw = grads[w:w + n_out * n_in].reshape((n_out, n_in))
        gb = grads[bo:bo + n_out]
        d = dT
        if layer < n_layers - 1:
            d = work[cur * half:cur * half + batch * n_out].reshape((n_out, batch))
        if layer == 0:
            _fm_backward(wt, xT, d, gw, gb, d, False, False)
        else:
            prev = work[(1 - cur) * half:(1 - cur) * half + batch * n_in].reshape((n_in, batch))
            pa = table[layer - 1, 4]
            inp = acts[batch * pa:batch * (pa + n_in)].reshape((n_in, batch))
            _fm_backward(wt, inp, d, gw, gb, prev, True, True)
            cur = 1 - cur


@njit(**INLINE_NN)
def _transpose_in(x, xT):
    for b in range(x.shape[0]):
        for i in range(x.shape[1]):
            xT[i, b] = x[b, i]


@njit(**NN_OPTIONS)
def tanh_forward(params, table, x, xT, acts):
    """Forward pass of a tanh network, feature-major.

    Parameters
    ----------
    params : ndarray of float, shape (n_params,)
    table : ndarray of int64, shape (layers, 5)
    x : ndarray of float, shape (batch, n_in)
    xT : ndarray of float, shape (n_in, batch)
        Output: ``x`` transposed (the backward pass reads it).
    acts : ndarray of float, shape (batch * sum of n_out,)
        Output: layer ``l``'s output (after tanh for hidden layers) as a C-contiguous
        ``(n_out, batch)`` block at ``batch * a_off``; the network's output is the last block.
    """
    _transpose_in(x, xT)
    _net_forward(params, table, xT, acts)


@njit(**NN_OPTIONS)
def tanh_backward(params, table, xT, acts, grad_out, grads, dT, work):
    """Gradient of a loss with respect to every parameter of a tanh network.

    Parameters
    ----------
    params, table
        As for :func:`tanh_forward`.
    xT, acts
        What :func:`tanh_forward` wrote for this input and ``params``.
    grad_out : ndarray of float, shape (batch, n_out)
        d loss / d output.
    grads : ndarray of float, shape (n_params,)
        Output (overwritten).
    dT : ndarray of float, shape (n_out, batch)
        Scratch: ``grad_out`` transposed.
    work : ndarray of float, shape (2 * batch * widest layer,)
        Scratch.
    """
    _transpose_in(grad_out, dT)
    _net_backward(params, table, xT, acts, dT, grads, work)


@njit(**INLINE_NN)
def _rows_forward(params, table, x, acts):
    """Every layer of a tanh network, batch-major: layer ``l``'s output is a C-contiguous
    ``(batch, n_out)`` block at ``batch * a_off`` of ``acts``."""
    n_layers = table.shape[0]
    batch = x.shape[0]
    for layer in range(n_layers):
        n_in, n_out, w, bo, a = table[layer, 0], table[layer, 1], table[layer, 2], table[layer, 3], table[layer, 4]
        wt = params[w:w + n_out * n_in].reshape((n_out, n_in))
        bias = params[bo:bo + n_out]
        out = acts[batch * a:batch * (a + n_out)].reshape((batch, n_out))
        if layer == 0:
            rows_dense(x, wt, bias, out)
        else:
            pa = table[layer - 1, 4]
            rows_dense(acts[batch * pa:batch * (pa + n_in)].reshape((batch, n_in)), wt, bias, out)
        if layer < n_layers - 1:
            for b in range(batch):
                _tanh_row(out[b])


@njit(**NN_OPTIONS)
def ppo_value(params_c, table_c, obs, acts_c, values):
    """Critic values of a few observations (batch-major).

    Parameters
    ----------
    params_c : ndarray of float32, shape (critic params,)
    table_c : ndarray of int64, shape (layers, 5)
    obs : ndarray of float32, shape (E, obs_size)
    acts_c : ndarray of float32, shape (E * sum of critic n_out,)
        Scratch (layer outputs).
    values : ndarray of float32, shape (E,)
        Output.

    Returns
    -------
    int
        -1, or the first row whose value is NaN or inf (from NaN or inf in obs or params).
    """
    _rows_forward(params_c, table_c, obs, acts_c)
    batch = obs.shape[0]
    a = table_c[table_c.shape[0] - 1, 4]
    bad = -1
    for b in range(batch):
        values[b] = acts_c[batch * a + b]
        if bad < 0 and not math.isfinite(values[b]):
            bad = b
    return bad


@njit(**NN_OPTIONS)
def ppo_act(params_a, params_c, table_a, table_c, obs, acts_a, acts_c, actions, log_probs,
            values, rng, sample):
    """Actor and critic forward of a few observations, a categorical action from each row's
    softmax, its log-probability, and the critic's value.

    Parameters
    ----------
    params_a, params_c : ndarray of float32
        Actor and critic parameters, laid out by ``table_a`` and ``table_c``.
    obs : ndarray of float32, shape (E, obs_size)
    acts_a, acts_c : ndarray of float32, shape (E * sum of n_out,)
        Scratch (batch-major layer outputs).
    actions : ndarray of int64, shape (E,)
        Output; when ``sample`` is False, input (the actions to score).
    log_probs, values : ndarray of float32, shape (E,)
        Output: ``logits[a] - logsumexp(logits)`` of each row's action, and the critic's value.
    rng : ndarray of uint64, shape (2,)
        ``[key, counter]``: row ``b``'s uniform is word ``counter + b`` (53 bits, float64); the
        action is the first ``k`` whose cumulative probability exceeds it. Advanced by E.
    sample : bool
        Draw the actions (True) or score the given ones.

    Returns
    -------
    int
        -1, or the first row whose probabilities are not numbers (NaN logits), sampling or
        not: then the generator's counter is left as it was.
    """
    _rows_forward(params_a, table_a, obs, acts_a)
    ppo_value(params_c, table_c, obs, acts_c, values)
    batch = obs.shape[0]
    last = table_a.shape[0] - 1
    n_act = table_a[last, 1]
    a0 = batch * table_a[last, 4]
    key = rng[0]
    ctr = rng[1]
    bad = -1
    for b in range(batch):
        z = acts_a[a0 + b * n_act:a0 + (b + 1) * n_act]
        zmax = np.float64(z[0])
        for k in range(1, n_act):
            zmax = max(zmax, np.float64(z[k]))
        s = 0.0
        for k in range(n_act):
            s += math.exp(z[k] - zmax)
        lse = zmax + math.log(s)
        if sample:
            u = np.float64(mix64(key + ctr * GOLDEN) >> _S11) * _TWO53
            ctr += _ONE
            # the first k whose cumulative probability exceeds u; rounding can leave the total
            # below u: then the last action of nonzero probability
            act = -1
            cum = 0.0
            for k in range(n_act):
                p = math.exp(z[k] - lse)
                cum += p
                if p > 0.0:
                    act = k
                    if u < cum:
                        break
            if act < 0:
                # NaN logits (NaN in obs or params): no distribution to draw from
                bad = b if bad < 0 else bad
                act = 0
            actions[b] = act
        elif math.isnan(lse):
            # NaN logits (as act < 0 above: a finite lse leaves the largest logit p >= 1/n)
            bad = b if bad < 0 else bad
        log_probs[b] = z[actions[b]] - lse
    if bad < 0:
        rng[1] = ctr
    return bad


@njit(**NN_OPTIONS)
def ppo_train(params, grads, m, v, split, table_a, table_c, obs, actions, old_log_probs,
              advantages, returns, old_values, xT, acts_a, acts_c, dA, dC, work, hp, cst, step, stats):
    """One PPO update (CleanRL's ``ppo.py``) on a minibatch in a single call.

    Actor and critic forward (feature-major), the clipped surrogate loss with per-minibatch
    advantage normalisation, the (clipped) value loss and the entropy bonus, the gradient
    through both networks, the global gradient-norm clip (``torch.nn.utils.clip_grad_norm_``)
    and one Adam step over both networks' parameters.

    Parameters
    ----------
    params, grads, m, v : ndarray of float, shape (n_params,)
        Actor parameters ``[:split]`` then critic ``[split:]`` (updated), their gradient
        (written, after clipping) and Adam's moments (updated).
    split : int
    table_a, table_c : ndarray of int64, shape (layers, 5)
        Actor (output n_actions) and critic (output 1) layouts, offsets relative to their part.
    obs : ndarray of float, shape (B, obs_size)
    actions : ndarray of int, shape (B,)
    old_log_probs, advantages, returns, old_values : ndarray of float, shape (B,)
    xT : ndarray of float, shape (obs_size, B)
    acts_a, acts_c : ndarray of float, shape (B * sum of n_out,)
        Feature-major layer outputs (written).
    dA : ndarray of float, shape (n_actions, B)
    dC : ndarray of float, shape (1, B)
        Written: d loss / d logits and d loss / d value.
    work : ndarray of float, shape (2 * B * widest layer,)
    hp : ndarray of float64, shape (10,)
        ``lr, beta1, beta2, eps, clip_coef, ent_coef, vf_coef, max_grad_norm (< 0: no clip),
        norm_adv, clip_vloss``.
    cst : ndarray of the network's float type, shape (3,)
        ``clip_coef, 1 - clip_coef, 1 + clip_coef`` rounded to that type (torch's float32
        clamp bounds).
    step : int
        Adam's step number (from 1).
    stats : ndarray of float64, shape (8,)
        Written: ``loss, pg_loss, v_loss, entropy, old_approx_kl, approx_kl, clipfrac,
        grad_norm`` (the norm before clipping).

    Returns
    -------
    int
        -1; or the first row whose action is not in ``[0, n_actions)``; or
        ``-3 - (field * B + row)`` for the first NaN or inf of field 0 ``obs``, 1
        ``old_log_probs``, 2 ``advantages``, 3 ``returns``, 4 ``old_values``; or -2 when the
        gradient is not finite (NaN or inf in the minibatch or the networks). In both cases
        nothing was updated (``params``, ``m``, ``v``, ``stats``; ``grads`` is scratch then).
    """
    batch = obs.shape[0]
    la = table_a.shape[0] - 1
    lc = table_c.shape[0] - 1
    n_act = table_a[la, 1]
    for b in range(batch):
        if actions[b] < 0 or actions[b] >= n_act:
            return b
    # NaN or inf in a float field (math.isfinite: fastmath's reassociation may cancel an
    # x - x test)
    for f in range(5):
        for b in range(batch):
            if f == 0:
                for i in range(obs.shape[1]):
                    if not math.isfinite(obs[b, i]):
                        return -3 - b
            else:
                x = (old_log_probs[b] if f == 1 else advantages[b] if f == 2
                     else returns[b] if f == 3 else old_values[b])
                if not math.isfinite(x):
                    return -3 - (f * batch + b)
    pa = params[:split]
    pc = params[split:]
    _transpose_in(obs, xT)
    _net_forward(pa, table_a, xT, acts_a)
    _net_forward(pc, table_c, xT, acts_c)
    logits = acts_a[batch * table_a[la, 4]:batch * (table_a[la, 4] + n_act)].reshape((n_act, batch))
    vals = acts_c[batch * table_c[lc, 4]:batch * (table_c[lc, 4] + 1)]
    c = cst[0]  # the clip range in the network's float type, as torch's clamp bounds
    lo = cst[1]
    hi = cst[2]
    ent_coef = hp[5]
    vf_coef = hp[6]
    norm_adv = hp[8] != 0.0
    clip_vloss = hp[9] != 0.0
    mean = 0.0
    std = 1.0
    if norm_adv:
        for b in range(batch):
            mean += advantages[b]
        mean /= batch
        var = 0.0
        for b in range(batch):
            dv = advantages[b] - mean
            var += dv * dv
        std = math.sqrt(var / (batch - 1)) + 1e-8
    # rounded to the network's float type (torch's float32 mean and std), via a scratch cell
    dC[0, 0] = mean
    mean_f = dC[0, 0]
    dC[0, 0] = std
    std_f = dC[0, 0]
    inv_b = 1.0 / batch
    pg = vl = ent = okl = kl = cf = 0.0
    for b in range(batch):
        a = actions[b]
        zmax = logits[0, b]
        for k in range(1, n_act):
            zmax = max(zmax, logits[k, b])
        s = 0.0
        for k in range(n_act):
            s += math.exp(logits[k, b] - zmax)
        lse = zmax + math.log(s)
        h = 0.0
        for k in range(n_act):
            lp = logits[k, b] - lse
            h -= math.exp(lp) * lp
        logratio = (logits[a, b] - lse) - old_log_probs[b]
        ratio = math.exp(logratio)
        okl -= logratio
        kl += (ratio - 1.0) - logratio
        if abs(ratio - 1.0) > c:
            cf += 1.0
        ent += h
        adv = advantages[b]
        if norm_adv:
            adv = (adv - mean_f) / std_f
        pg1 = -adv * ratio
        pg2 = -adv * min(max(ratio, lo), hi)
        pg += max(pg1, pg2)
        # torch.max splits the gradient on ties; clamp passes it on [lo, hi] inclusive
        w1 = 1.0 if pg1 > pg2 else (0.5 if pg1 == pg2 else 0.0)
        w2 = 1.0 - w1
        inr = 1.0 if lo <= ratio <= hi else 0.0
        g_logp = -adv * (w1 + w2 * inr) * inv_b * ratio
        ge = ent_coef * inv_b
        for k in range(n_act):
            lp = logits[k, b] - lse
            p = math.exp(lp)
            g = ge * p * (lp + h) - g_logp * p
            if k == a:
                g += g_logp
            dA[k, b] = g
        vb = vals[b]
        rb = returns[b]
        du = vb - rb
        lu = du * du
        if clip_vloss:
            ov = old_values[b]
            dd = vb - ov
            vc = ov + min(max(dd, -c), c)
            dcl = vc - rb
            lcl = dcl * dcl
            vl += max(lu, lcl)
            wu = 1.0 if lu > lcl else (0.5 if lu == lcl else 0.0)
            wc = 1.0 - wu
            gv = wu * du
            if -c <= dd <= c:
                gv += wc * dcl
        else:
            vl += lu
            gv = du
        dC[0, b] = vf_coef * inv_b * gv  # d(0.5 * vf_coef * mean(sq)) = vf_coef * diff / B
    pg *= inv_b
    vl *= 0.5 * inv_b
    ent *= inv_b
    _net_backward(pa, table_a, xT, acts_a, dA, grads[:split], work)
    _net_backward(pc, table_c, xT, acts_c, dC, grads[split:], work)
    total = 0.0
    for k in range(grads.shape[0]):
        g = np.float64(grads[k])
        total += g * g
    total = math.sqrt(total)
    if not math.isfinite(total):
        return -2  # NaN or inf in a field or in the networks: the update would spread it
    stats[0] = pg - ent_coef * ent + vf_coef * vl
    stats[1] = pg
    stats[2] = vl
    stats[3] = ent
    stats[4] = okl * inv_b
    stats[5] = kl * inv_b
    stats[6] = cf * inv_b
    stats[7] = total
    max_norm = hp[7]
    if max_norm >= 0.0:
        # torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1
        coef = max_norm / (total + 1e-6)
        if coef < 1.0:
            for k in range(grads.shape[0]):
                grads[k] *= coef
    adam_step(params, grads, m, v, hp[0], hp[1], hp[2], hp[3], step)
    return -1
