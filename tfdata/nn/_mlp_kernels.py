"""A small multilayer perceptron: forward, backward, Adam and the DQN temporal-difference loss.

Every kernel writes into arrays it is given and allocates nothing. All parameters of a network live in one flat array ``params``; a ``table`` of int64, shape
``(layers, 5)``, says where: row ``l`` is ``(n_in, n_out, w_off, b_off, a_off)``. Layer ``l``'s
weight is ``params[w_off : w_off + n_out * n_in]`` seen as ``(n_out, n_in)`` row-major (as
torch's ``Linear.weight``), its bias ``params[b_off : b_off + n_out]``, and its
output for row ``b`` of a batch is ``acts[b, a_off : a_off + n_out]``. Hidden layers apply ReLU,
the last layer is linear. The kernels are generic in the float type: float32 in use, float64 for
finite-difference checks.
"""

from __future__ import annotations

import math

from .. import _kernel_cache

_kernel_cache.install()  # before the first kernel is defined, as tfdata.kernels does

from numba import njit  # noqa: E402

from .._config import NN_OPTIONS  # noqa: E402

# the layer helpers: compiled once per signature and called, not inlined (docs/design/nn.md)
INLINE_NN = dict(NN_OPTIONS)
del INLINE_NN["cache"]


# inlined as IR (tiny): a helper compiled on its own would add a specialization per caller
@njit(**dict(INLINE_NN, inline="always"))
def _row(src, idx, k):
    """Row ``idx[k]`` of ``src``, or row ``k`` when ``idx`` is None (a branch numba prunes)."""
    if idx is None:
        return src[k]
    return src[idx[k]]


@njit(**INLINE_NN)
def axpy_rows(dst, src, idx, coef, count):
    """``dst += sum(coef[k] * src[idx[k]] for k < count)``, eight rows per pass over ``dst``.

    The sparse product all layers are built from: ``idx`` lists only the nonzero terms. ``idx``
    None: rows ``0 .. count-1`` (the dense products of :mod:`tfdata.nn._ppo_kernels`; ``coef``
    may be strided).
    """
    n = dst.shape[0]
    k = 0
    while k + 8 <= count:
        r0 = _row(src, idx, k)
        r1 = _row(src, idx, k + 1)
        r2 = _row(src, idx, k + 2)
        r3 = _row(src, idx, k + 3)
        r4 = _row(src, idx, k + 4)
        r5 = _row(src, idx, k + 5)
        r6 = _row(src, idx, k + 6)
        r7 = _row(src, idx, k + 7)
        c0 = coef[k]
        c1 = coef[k + 1]
        c2 = coef[k + 2]
        c3 = coef[k + 3]
        c4 = coef[k + 4]
        c5 = coef[k + 5]
        c6 = coef[k + 6]
        c7 = coef[k + 7]
        for i in range(n):
            dst[i] += (c0 * r0[i] + c1 * r1[i] + c2 * r2[i] + c3 * r3[i]
                       + c4 * r4[i] + c5 * r5[i] + c6 * r6[i] + c7 * r7[i])
        k += 8
    while k + 4 <= count:
        r0 = _row(src, idx, k)
        r1 = _row(src, idx, k + 1)
        r2 = _row(src, idx, k + 2)
        r3 = _row(src, idx, k + 3)
        c0 = coef[k]
        c1 = coef[k + 1]
        c2 = coef[k + 2]
        c3 = coef[k + 3]
        for i in range(n):
            dst[i] += c0 * r0[i] + c1 * r1[i] + c2 * r2[i] + c3 * r3[i]
        k += 4
    while k < count:
        r0 = _row(src, idx, k)
        c0 = coef[k]
        for i in range(n):
            dst[i] += c0 * r0[i]
        k += 1


@njit(**INLINE_NN)
def _nonzeros(values, idx, coef):
    """List the nonzero entries of ``values`` (1-D): positions into ``idx``, values into ``coef``;
    return how many."""
    count = 0
    for i in range(values.shape[0]):
        v = values[i]
        if v != 0.0:
            idx[count] = i
            coef[count] = v
            count += 1
    return count


@njit(**INLINE_NN)
def _dense(inp, wt, bias, out, relu, tmp, idx, coef):
    """``out = inp @ wt.T + bias`` (then ReLU): :func:`rows_dense` for a wide input (8 or
    more), else a sum of the transposed weight's rows (kept in ``tmp``) over each row's nonzero
    inputs (docs/design/nn.md says why).
    """
    batch = inp.shape[0]
    n_out, n_in = wt.shape
    if n_in < 8:
        wtt = tmp[:n_in * n_out].reshape((n_in, n_out))
        for j in range(n_out):
            for i in range(n_in):
                wtt[i, j] = wt[j, i]
        for b in range(batch):
            count = _nonzeros(inp[b], idx, coef)
            ob = out[b]
            for j in range(n_out):
                ob[j] = bias[j]
            axpy_rows(ob, wtt, idx, coef, count)
    else:
        rows_dense(inp, wt, bias, out)
    if relu:
        for b in range(batch):
            for j in range(n_out):
                if out[b, j] < 0.0:
                    out[b, j] = 0.0


@njit(**INLINE_NN)
def rows_dense(inp, wt, bias, out):
    """``out = inp @ wt.T + bias``: dot products along the inputs, four rows sharing each
    weight load. The wide layers of the ReLU networks and every layer of a tanh network acting
    on a few observations (:mod:`tfdata.nn._ppo_kernels`)."""
    batch = inp.shape[0]
    n_out, n_in = wt.shape
    b = 0
    while b + 4 <= batch:
        i0 = inp[b]
        i1 = inp[b + 1]
        i2 = inp[b + 2]
        i3 = inp[b + 3]
        for j in range(n_out):
            wr = wt[j]
            s0 = s1 = s2 = s3 = bias[j]
            for i in range(n_in):
                wi = wr[i]
                s0 += i0[i] * wi
                s1 += i1[i] * wi
                s2 += i2[i] * wi
                s3 += i3[i] * wi
            out[b, j] = s0
            out[b + 1, j] = s1
            out[b + 2, j] = s2
            out[b + 3, j] = s3
        b += 4
    while b < batch:
        i0 = inp[b]
        for j in range(n_out):
            wr = wt[j]
            s0 = bias[j]
            for i in range(n_in):
                s0 += i0[i] * wr[i]
            out[b, j] = s0
        b += 1


@njit(**INLINE_NN)
def _dense_backward(inp, wt, d, gw, gb, prev, has_prev, relu_in, tmp, idx, coef):
    """Gradients of one layer given ``d`` = d loss / d output, shape (batch, n_out).

    Adds ``d.T @ inp`` into ``gw`` (n_out, n_in) and ``d.sum(0)`` into ``gb``; if ``has_prev``,
    writes ``(d @ wt) * (inp > 0)`` into ``prev`` (batch, n_in): the gradient at the previous
    layer's output through its ReLU (``relu_in``). Both skip the zeros of ``d``; a narrow input
    accumulates the transposed weight gradient in ``tmp``.
    """
    batch = inp.shape[0]
    n_out, n_in = wt.shape
    if n_in < 8:
        for k in range(n_in * n_out):
            tmp[k] = 0.0
        for b in range(batch):
            for j in range(n_out):
                gb[j] += d[b, j]
            for i in range(n_in):
                xi = inp[b, i]
                row = i * n_out
                for j in range(n_out):
                    tmp[row + j] += xi * d[b, j]
        for i in range(n_in):
            for j in range(n_out):
                gw[j, i] += tmp[i * n_out + j]
    for j in range(n_out if n_in >= 8 else 0):
        count = _nonzeros(d[:, j], idx, coef)
        s = 0.0
        for k in range(count):
            s += coef[k]
        gb[j] += s
        axpy_rows(gw[j], inp, idx, coef, count)
    if has_prev:
        for b in range(batch):
            count = _nonzeros(d[b], idx, coef)
            pb = prev[b]
            for i in range(n_in):
                pb[i] = 0.0
            axpy_rows(pb, wt, idx, coef, count)
            if relu_in:
                # ReLU passes no gradient where the unit was off (torch's choice at exactly 0 too)
                for i in range(n_in):
                    if inp[b, i] <= 0.0:
                        pb[i] = 0.0


@njit(**NN_OPTIONS)
def mlp_forward(params, table, x, acts, tmp, idx, coef):
    """Forward pass of every row of ``x``.

    Parameters
    ----------
    params : ndarray of float, shape (n_params,)
    table : ndarray of int64, shape (layers, 5)
    x : ndarray of float, shape (batch, n_in of layer 0)
    acts : ndarray of float, shape (batch * sum of n_out,)
        Output: every layer's output (after ReLU for hidden layers), layer ``l``'s as a
        C-contiguous ``(batch, n_out)`` block at ``batch * a_off`` (so every kernel loop runs
        over unit-stride memory); the network's output is the last block.
    tmp : ndarray of float, shape (>= largest n_in * n_out,)
    idx : ndarray of int64, shape (>= max(batch, widest layer, n_in),)
    coef : ndarray of float, shape like ``idx``
        Scratch.
    """
    n_layers = table.shape[0]
    batch = x.shape[0]
    for layer in range(n_layers):
        n_in, n_out, w, bo, a = table[layer, 0], table[layer, 1], table[layer, 2], table[layer, 3], table[layer, 4]
        wt = params[w:w + n_out * n_in].reshape((n_out, n_in))
        out = acts[batch * a:batch * (a + n_out)].reshape((batch, n_out))
        if layer == 0:
            _dense(x, wt, params[bo:bo + n_out], out, n_layers > 1, tmp, idx, coef)
        else:
            pa = table[layer - 1, 4]
            inp = acts[batch * pa:batch * (pa + n_in)].reshape((batch, n_in))
            _dense(inp, wt, params[bo:bo + n_out], out, layer < n_layers - 1, tmp, idx, coef)


@njit(**NN_OPTIONS)
def mlp_argmax(params, table, x, acts, tmp, idx, coef, out):
    """Forward pass, then the index of the largest output of every row (greedy actions).

    Parameters
    ----------
    params, table, x, acts, tmp, idx, coef
        As for :func:`mlp_forward`.
    out : ndarray of int64, shape (>= batch,)
        Output: ``argmax`` of each row's network output (the first one on ties, as numpy).
    """
    mlp_forward(params, table, x, acts, tmp, idx, coef)
    batch = x.shape[0]
    last = table.shape[0] - 1
    n_out = table[last, 1]
    q = acts[batch * table[last, 4]:batch * (table[last, 4] + n_out)].reshape((batch, n_out))
    for b in range(batch):
        best = 0
        for j in range(1, n_out):
            if q[b, j] > q[b, best]:
                best = j
        out[b] = best


@njit(**NN_OPTIONS)
def mlp_backward(params, table, x, acts, grad_out, grads, work, tmp, idx, coef):
    """Gradient of a loss with respect to every parameter, given its gradient at the output.

    Parameters
    ----------
    params, table, x
        As for :func:`mlp_forward`.
    acts : ndarray of float, shape (batch * sum of n_out,)
        The outputs :func:`mlp_forward` wrote for this ``x`` and ``params``.
    grad_out : ndarray of float, shape (batch, n_out of the last layer)
        d loss / d output.
    grads : ndarray of float, shape (n_params,)
        Output: d loss / d params (overwritten, not accumulated).
    work : ndarray of float, shape (2 * batch * widest layer,)
        Scratch for the gradient at each layer's output.
    tmp, idx, coef
        Scratch, as for :func:`mlp_forward`.
    """
    n_layers = table.shape[0]
    batch = x.shape[0]
    half = work.shape[0] // 2
    for k in range(grads.shape[0]):
        grads[k] = 0.0
    cur = 0
    for layer in range(n_layers - 1, -1, -1):
        n_in, n_out, w, bo = table[layer, 0], table[layer, 1], table[layer, 2], table[layer, 3]
        wt = params[w:w + n_out * n_in].reshape((n_out, n_in))
        gw = grads[w:w + n_out * n_in].reshape((n_out, n_in))
        gb = grads[bo:bo + n_out]
        if layer == n_layers - 1:
            d = work[cur * half:cur * half + batch * n_out].reshape((batch, n_out))
            for b in range(batch):
                for j in range(n_out):
                    d[b, j] = grad_out[b, j]
        d = work[cur * half:cur * half + batch * n_out].reshape((batch, n_out))
        if layer == 0:
            # no gradient at the input is needed: ``d`` stands in for the unused ``prev``
            _dense_backward(x, wt, d, gw, gb, d, False, False, tmp, idx, coef)
        else:
            prev = work[(1 - cur) * half:(1 - cur) * half + batch * n_in].reshape((batch, n_in))
            pa = table[layer - 1, 4]
            inp = acts[batch * pa:batch * (pa + n_in)].reshape((batch, n_in))
            _dense_backward(inp, wt, d, gw, gb, prev, True, True, tmp, idx, coef)
        cur = 1 - cur


@njit(**NN_OPTIONS)
def adam_step(params, grads, m, v, lr, beta1, beta2, eps, step):
    """One Adam update in place, as ``torch.optim.Adam`` (no weight decay, no amsgrad).

    Parameters
    ----------
    params, grads, m, v : ndarray of float, shape (n_params,)
        Parameters (updated), their gradient, and the first and second moments (updated).
    lr, beta1, beta2, eps : float
    step : int
        Number of this update, starting at 1 (for the bias corrections).
    """
    bc1 = 1.0 - beta1 ** step
    bc2_sqrt = math.sqrt(1.0 - beta2 ** step)
    step_size = lr / bc1
    for k in range(params.shape[0]):
        g = grads[k]
        m[k] += (g - m[k]) * (1.0 - beta1)
        v[k] = v[k] * beta2 + (1.0 - beta2) * g * g
        params[k] -= step_size * m[k] / (math.sqrt(v[k]) / bc2_sqrt + eps)


@njit(**NN_OPTIONS)
def td_loss(q, q_next, actions, rewards, terminated, discounts, weights, grad_out, td):
    """DQN's squared temporal-difference loss and its gradient at the online network's output.

    Target ``y = reward + discount * (1 - terminated) * max_a q_next[a]``; loss
    ``mean(weight * (q[action] - y) ** 2)``, as ``F.mse_loss`` when every weight is 1.

    Parameters
    ----------
    q : ndarray of float, shape (batch, >= n_actions offset + n_actions)
        Online network outputs for ``obs`` (a view of the last layer's columns of ``acts``).
    q_next : ndarray of float, shape (batch, n_actions)
        Target network outputs for ``next_obs``.
    actions : ndarray of int, shape (batch,)
        Each in ``[0, n_actions)`` (checked by the caller).
    rewards : ndarray of float32, shape (batch,)
    terminated : ndarray of bool, shape (batch,)
    discounts : ndarray of float32, shape (batch,)
        ``gamma`` for one-step targets, ``gamma ** k`` for n-step windows of k rows.
    weights : ndarray of float32, shape (batch,)
        Importance weights (ones for uniform sampling).
    grad_out : ndarray of float, shape (batch, n_actions)
        Output: d loss / d q.
    td : ndarray of float, shape (batch,)
        Output: ``|q[action] - y|`` (new priorities for a prioritized buffer).

    Returns
    -------
    float
        The loss.
    """
    batch = q.shape[0]
    n_actions = q_next.shape[1]
    loss = 0.0
    for b in range(batch):
        best = q_next[b, 0]
        for j in range(1, n_actions):
            if q_next[b, j] > best:
                best = q_next[b, j]
        y = rewards[b]
        if not terminated[b]:
            y += discounts[b] * best
        a = actions[b]
        err = q[b, a] - y
        loss += weights[b] * err * err
        for j in range(n_actions):
            grad_out[b, j] = 0.0
        grad_out[b, a] = 2.0 * weights[b] * err / batch
        td[b] = abs(err)
    return loss / batch


@njit(**NN_OPTIONS)
def dqn_step(params, target_params, table, obs, next_obs, actions, rewards, terminated, discounts,
             weights, acts, acts_target, grad_out, td, grads, work, tmp, idx, coef, m, v, lr, beta1,
             beta2, eps, step):
    """One DQN update in a single call: target forward, online forward, TD loss, backward, Adam.

    The same arithmetic as :func:`mlp_forward` (target on ``next_obs``, online on ``obs``),
    :func:`td_loss`, :func:`mlp_backward` and :func:`adam_step` in turn.

    Parameters
    ----------
    params, target_params : ndarray of float32, shape (n_params,)
        Online (updated in place) and target network parameters, both laid out by ``table``.
    obs, next_obs, actions, rewards, terminated, discounts, weights
        The batch, as for :func:`td_loss` (``obs``/``next_obs`` shape (batch, n_in)).
    acts, acts_target : ndarray of float32, shape (batch * sum of n_out,)
        Layer outputs of the online and target networks (written).
    grad_out : ndarray of float32, shape (batch, n_actions)
    td : ndarray of float32, shape (batch,)
        Output: ``|q[action] - y|``.
    grads, work, tmp, idx, coef
        As for :func:`mlp_backward`.
    m, v, lr, beta1, beta2, eps, step
        As for :func:`adam_step`.

    Returns
    -------
    loss : float
        The loss before the update.
    bad : int
        -1, or the first row whose action is not in ``[0, n_actions)``: then nothing was
        updated (the kernels index by action without bounds checks).
    """
    batch = obs.shape[0]
    last = table.shape[0] - 1
    n_out = table[last, 1]
    for b in range(batch):
        if actions[b] < 0 or actions[b] >= n_out:
            return 0.0, b
    a = batch * table[last, 4]
    mlp_forward(target_params, table, next_obs, acts_target, tmp, idx, coef)
    mlp_forward(params, table, obs, acts, tmp, idx, coef)
    q = acts[a:a + batch * n_out].reshape((batch, n_out))
    q_next = acts_target[a:a + batch * n_out].reshape((batch, n_out))
    loss = td_loss(q, q_next, actions, rewards, terminated, discounts, weights, grad_out, td)
    mlp_backward(params, table, obs, acts, grad_out, grads, work, tmp, idx, coef)
    adam_step(params, grads, m, v, lr, beta1, beta2, eps, step)
    return loss, -1
