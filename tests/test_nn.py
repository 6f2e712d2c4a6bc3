"""tfdata.nn (MLP, Adam, DQN) and its kernels against tests/naive.py, finite differences and torch.

Tolerances. float32 results are compared with float64 references, or with torch, which sums in
another order. A float32 dot product of n terms is off by at most about n * 6e-8 times the sum of
the absolute values of its terms (typically sqrt(n) * 6e-8); the widest layer here has 120 inputs,
so 1e-5 of that sum (2e-5 against torch, whose own result is rounded too) bounds it with margin.
:func:`close32` checks exactly that, the sums of absolute terms coming from the references run on
absolute values, so cancellation to a small output does not make a relative test meaningless. A
wrong kernel (a dropped row, bias or ReLU) is off by O(0.01..1), far above it. float64 results
are held to 1e-11 against the references; finite differences to 1e-6 (the network is linear in
each parameter between ReLU kinks, so only rounding, about 1e-16 / h, separates them). Adam in
float32 moves each parameter by about lr per step whatever the gradient's size, so its results
are compared to a small fraction of lr.
"""

from __future__ import annotations

import re
import tracemalloc

import numpy as np
import pytest

import tfdata
from tfdata import Batch
from tfdata.nn import _mlp_kernels as _mlp
from tfdata.nn import DQN, MLP, Adam

from . import naive
from .conftest import CARTPOLE, random_rows

ARCHS = [(1, 1), (3, 1), (4, 120, 84, 2), (7, 33, 1), (5, 9, 9, 9, 3)]
BATCHES = [1, 3, 4, 5, 7, 33, 128]
# C arrays, a field of a record array (what an AoS batch gives) and a strided view; each extra
# array layout is another numba specialisation to compile, so Fortran order is left out
LAYOUTS = ["C", "record", "strided"]
CARTPOLE_NET = (4, 120, 84, 2)


def arch_id(sizes):
    return "x".join(map(str, sizes))


def archs():
    return [pytest.param(s, id=arch_id(s)) for s in ARCHS]


def split(sizes, flat):
    """[(weight (n_out, n_in), bias)] of a flat vector, by the documented layout (layer by layer,
    weight row-major then bias): independent of MLP.table."""
    out, off = [], 0
    for n_in, n_out in zip(sizes, sizes[1:]):
        w = flat[off:off + n_in * n_out].reshape(n_out, n_in)
        off += n_in * n_out
        out.append((w, flat[off:off + n_out]))
        off += n_out
    assert off == len(flat)
    return out


def wb(net, flat=None):
    layers = split(net.sizes, net.params if flat is None else flat)
    return [w for w, _ in layers], [b for _, b in layers]


def as_layout(x, layout):
    """The same values as a C array, a field of a record array (an AoS batch) or a strided view."""
    if layout == "C":
        return np.ascontiguousarray(x)
    if layout == "record":
        rec = np.zeros(len(x), dtype=[("obs", x.dtype, (x.shape[1],)), ("x", "f8")])
        rec["obs"] = x
        return rec["obs"]
    if layout == "strided":
        big = np.full((2 * len(x), x.shape[1] + 3), np.nan, x.dtype)
        big[::2, 2:2 + x.shape[1]] = x
        return big[::2, 2:2 + x.shape[1]]
    raise ValueError(layout)


def magnitude(weights, biases, x):
    """Per output, the sum of absolute values of the terms that make it (through every layer)."""
    return naive.mlp_forward_naive([np.abs(w) for w in weights], [np.abs(b) for b in biases],
                                   np.abs(x))[-1]


def close32(actual, expected, mag, rel=1e-5):
    """float32 ``actual`` within ``rel`` of the sum of absolute terms ``mag`` of float64 ``expected``."""
    actual = np.asarray(actual, np.float64)
    bad = np.abs(actual - expected) > rel * mag + 1e-30
    assert not bad.any(), (f"{bad.sum()} of {bad.size} off; worst "
                           f"{np.max(np.abs(actual - expected) / (mag + 1e-30)):.3g} of the magnitude")


def grad_magnitude(weights, biases, x, grad_out):
    """Sums of absolute terms of every gradient (the backward reference on absolute values)."""
    return naive.mlp_backward_naive([np.abs(w) for w in weights], [np.abs(b) for b in biases],
                                    np.abs(x), np.abs(grad_out))


def data(rng, batch, n_in, dtype=np.float32):
    return rng.standard_normal((batch, n_in)).astype(dtype)


def make_batch(rng, n, n_in, n_actions, *, discounts=False, weights=False):
    fields = {"obs": data(rng, n, n_in), "next_obs": data(rng, n, n_in),
              "action": rng.integers(0, n_actions, n), "reward": rng.standard_normal(n).astype(np.float32),
              "terminated": rng.random(n) < 0.3}
    return Batch(fields, np.arange(n),
                 weights=(rng.random(n) + 0.1).astype(np.float32) if weights else None,
                 discounts=(0.99 ** rng.integers(1, 4, n)).astype(np.float32) if discounts else None)


def snapshot(*arrays):
    return [np.array(a, copy=True) for a in arrays]


def assert_unchanged(before, arrays):
    for a, b in zip(before, arrays):
        np.testing.assert_array_equal(a, b)


# -- layout and initialisation -----------------------------------------------------------------


@pytest.mark.parametrize("sizes", archs())
def test_table_and_layer_views(sizes):
    net = MLP(sizes, seed=0)
    off, col = 0, 0
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        assert tuple(net.table[i]) == (n_in, n_out, off, off + n_in * n_out, col)
        w, b = net.layer(i)
        assert w.shape == (n_out, n_in) and b.shape == (n_out,)
        assert np.shares_memory(w, net.params) and np.shares_memory(b, net.params)
        ref_w, ref_b = split(sizes, net.params)[i]
        np.testing.assert_array_equal(w, ref_w)
        np.testing.assert_array_equal(b, ref_b)
        off += n_in * n_out + n_out
        col += n_out
    assert net.n_params == off == net.params.size == net.grad.size
    assert net.params.dtype == net.grad.dtype == np.float32
    assert MLP(sizes, dtype="float64").params.dtype == np.float64


def test_init_follows_torch_linear_bounds():
    net = MLP((7, 120, 84, 3), seed=1)
    for i, (w, b) in enumerate(split(net.sizes, net.params)):
        bound = 1 / np.sqrt(w.shape[1])
        for a in (w, b):
            assert np.all(np.abs(a) <= bound)
        # uniform over the whole interval, not a point or a narrower one
        assert w.max() > 0.95 * bound and w.min() < -0.95 * bound
        assert abs(np.std(w) - bound / np.sqrt(3)) < 0.1 * bound / np.sqrt(3)
        assert abs(np.mean(w)) < 0.1 * bound
    assert len(np.unique(net.params)) > 0.99 * net.n_params


def test_init_seeds():
    a, b, c = MLP(CARTPOLE_NET, seed=3), MLP(CARTPOLE_NET, seed=3), MLP(CARTPOLE_NET, seed=4)
    np.testing.assert_array_equal(a.params, b.params)
    assert np.mean(a.params == c.params) < 0.01
    assert np.mean(MLP(CARTPOLE_NET).params == MLP(CARTPOLE_NET).params) < 0.01
    d1, d2 = DQN(CARTPOLE_NET, seed=5), DQN(CARTPOLE_NET, seed=5)
    np.testing.assert_array_equal(d1.online.params, d2.online.params)
    np.testing.assert_array_equal(d1.online.params, d1.target.params)
    assert not np.shares_memory(d1.online.params, d1.target.params)
    a.reset_parameters(4)
    np.testing.assert_array_equal(a.params, c.params)


# -- forward, argmax and backward against the references -----------------------------------------


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("sizes", archs())
def test_forward_matches_reference(sizes, batch):
    rng = np.random.default_rng(batch)
    net = MLP(sizes, seed=batch)
    x = data(rng, batch, sizes[0])
    weights, biases = wb(net)
    ref = naive.mlp_forward_naive(weights, biases, x)[-1]
    mag = magnitude(weights, biases, x)
    for layout in LAYOUTS:
        out = net.forward(as_layout(x, layout))
        assert out.shape == (batch, sizes[-1]) and out.dtype == np.float32
        close32(out, ref, mag)
    # float64 networks: the same arithmetic to float64 rounding
    net64 = MLP(sizes, seed=batch, dtype="float64")
    x64 = x.astype(np.float64)
    ref64 = naive.mlp_forward_naive(*wb(net64), x64)[-1]
    np.testing.assert_allclose(net64.forward(x64), ref64, rtol=1e-12, atol=1e-12)


class Recorder:
    """Stands in for the kernels module of a network: records every kernel call's arguments.

    The direct kernel tests take the trailing scratch arguments from a real call, so they follow
    the documented leading ones only (params, table, x, acts, grad_out, grads, work)."""

    def __init__(self):
        self.calls = {}

    def __getattr__(self, name):
        kernel = getattr(_mlp, name)

        def call(*args):
            self.calls[name] = args
            return kernel(*args)
        return call


@pytest.mark.parametrize("batch", [1, 5, 33])
@pytest.mark.parametrize("sizes", archs())
def test_forward_kernel_writes_every_layer(sizes, batch):
    net = MLP(sizes, seed=0)
    x = data(np.random.default_rng(0), batch, sizes[0])
    net._k = rec = Recorder()
    net.forward(x)
    params, table, _, acts, *rest = rec.calls["mlp_forward"]
    assert params is net.params and table is net.table and acts.size == batch * sum(sizes[1:])
    acts = np.full_like(acts, np.nan)  # every value is written
    _mlp.mlp_forward(params, table, x, acts, *rest)
    weights, biases = wb(net)
    outs = naive.mlp_forward_naive(weights, biases, x)
    start = 0
    for layer, ref in enumerate(outs):  # layer l's output: a C (batch, n_out) block
        n = ref.size
        mag = magnitude(weights[:layer + 1], biases[:layer + 1], x)
        close32(acts[start:start + n].reshape(ref.shape), ref, mag)
        start += n
    assert start == acts.size


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("sizes", archs())
def test_backward_matches_reference(sizes, batch):
    rng = np.random.default_rng(batch + 100)
    net = MLP(sizes, seed=batch)
    x = data(rng, batch, sizes[0])
    g = data(rng, batch, sizes[-1])
    weights, biases = wb(net)
    ref = naive.mlp_backward_naive(weights, biases, x, g)
    mag = grad_magnitude(weights, biases, x, g)
    for layout in LAYOUTS:
        net.grad[...] = np.nan  # overwritten, not accumulated
        xv = as_layout(x, layout)
        net.forward(xv)
        out = net.backward(xv, g)
        assert out is net.grad
        for (gw, gb), (rw, rb), (mw, mb) in zip(split(sizes, net.grad), ref, mag):
            close32(gw, rw, mw)
            close32(gb, rb, mb)
    net64 = MLP(sizes, seed=batch, dtype="float64")
    net64.forward(x.astype(np.float64))
    net64.backward(x.astype(np.float64), g.astype(np.float64))
    ref64 = naive.mlp_backward_naive(*wb(net64), x, g)
    for (gw, gb), (rw, rb) in zip(split(sizes, net64.grad), ref64):
        np.testing.assert_allclose(gw, rw, rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(gb, rb, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("sizes", archs())
def test_backward_kernel_needs_no_clean_scratch(sizes):
    batch = 6
    net = MLP(sizes, seed=1)
    x = data(np.random.default_rng(1), batch, sizes[0])
    g = data(np.random.default_rng(2), batch, sizes[-1])
    net._k = rec = Recorder()
    net.forward(x)
    net.backward(x, g)
    params, table, _, acts, _, grads, work, *rest = rec.calls["mlp_backward"]
    assert grads is net.grad and work.size >= 2 * batch * max(sizes[1:])
    grads = np.full_like(grads, np.nan)
    work = np.full_like(work, np.nan)
    _mlp.mlp_backward(params, table, x, acts, g, grads, work, *rest)
    first = grads.copy()
    _mlp.mlp_backward(params, table, x, acts, g, grads, work, *rest)
    np.testing.assert_array_equal(grads, first)  # overwritten, not accumulated
    weights, biases = wb(net)
    ref = naive.mlp_backward_naive(weights, biases, x, g)
    mag = grad_magnitude(weights, biases, x, g)
    for (gw, gb), (rw, rb), (mw, mb) in zip(split(sizes, grads), ref, mag):
        close32(gw, rw, mw)
        close32(gb, rb, mb)


def test_backward_uses_the_forward_of_its_batch_size():
    net = MLP((5, 9, 9, 9, 3), seed=2)
    rng = np.random.default_rng(2)
    x5, x3, g5 = data(rng, 5, 5), data(rng, 3, 5), data(rng, 5, 3)
    net.forward(x5)
    net.forward(x3)  # another batch size: its own workspace
    net.backward(x5, g5)
    weights, biases = wb(net)
    ref = naive.mlp_backward_naive(weights, biases, x5, g5)
    mag = grad_magnitude(weights, biases, x5, g5)
    for (gw, gb), (rw, rb), (mw, mb) in zip(split(net.sizes, net.grad), ref, mag):
        close32(gw, rw, mw)
        close32(gb, rb, mb)


@pytest.mark.parametrize("sizes", [(9, 4, 2), (5, 2, 2, 1), (8, 4, 4, 2)], ids=arch_id)
def test_backward_input_wider_than_hidden_layers(sizes):
    """Regression: the backward scratch once had no room for an input wider than every layer."""
    net = MLP(sizes, seed=0)
    x = data(np.random.default_rng(0), 3, sizes[0])
    net.forward(x)
    net.backward(x, np.ones((3, sizes[-1]), np.float32))
    ref = naive.mlp_backward_naive(*wb(net), x, np.ones((3, sizes[-1])))
    for (gw, gb), (rw, rb) in zip(split(sizes, net.grad), ref):
        np.testing.assert_allclose(gw, rw, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(gb, rb, rtol=1e-4, atol=1e-5)


# -- gradient check by central finite differences (float64) -------------------------------------


def away_from_kinks(net, rng, batch, margin=1e-4):
    """Inputs whose hidden pre-activations are all at least ``margin`` from 0 (redrawn until so)."""
    for _ in range(100):
        x = rng.standard_normal((batch, net.n_in))
        pre = naive.mlp_preactivations_naive(*wb(net), x)
        if all(np.abs(p).min() > margin for p in pre):
            return x
    raise AssertionError("no input away from the ReLU kinks")


@pytest.mark.parametrize("sizes, n_checked", [
    pytest.param((1, 1), None, id="1x1"),
    pytest.param((3, 1), None, id="3x1"),
    pytest.param((7, 33, 1), None, id="7x33x1"),
    pytest.param((5, 9, 9, 9, 3), None, id="5x9x9x9x3"),
    pytest.param(CARTPOLE_NET, 400, id="cartpole"),
])
def test_gradient_matches_finite_differences(sizes, n_checked):
    """Loss sum(out * R); the network is piecewise linear in each single parameter, so away from
    the ReLU kinks the central difference is exact up to rounding (about 1e-16 / h)."""
    rng = np.random.default_rng(7)
    net = MLP(sizes, seed=7, dtype="float64")
    batch = 5
    x = away_from_kinks(net, rng, batch)
    r = rng.standard_normal((batch, net.n_out))
    net.forward(x)
    analytic = net.backward(x, r).copy()
    h = 1e-6
    idx = np.arange(net.n_params) if n_checked is None else rng.choice(net.n_params, n_checked, replace=False)
    numeric = np.empty(len(idx))
    p = net.params
    for n, k in enumerate(idx):
        old = p[k]
        p[k] = old + h
        up = float(np.sum(net.forward(x) * r))
        p[k] = old - h
        down = float(np.sum(net.forward(x) * r))
        p[k] = old
        numeric[n] = (up - down) / (2 * h)
    scale = np.abs(analytic).max()
    np.testing.assert_allclose(analytic[idx], numeric, rtol=1e-6, atol=1e-8 * scale)
    assert np.abs(analytic[idx]).max() > 1e-3  # the check saw real gradients


# -- argmax ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("sizes", [(3, 1), (4, 120, 84, 2), (5, 9, 9, 9, 3), (6, 17, 7)], ids=arch_id)
def test_argmax_matches_numpy(sizes, batch):
    net = MLP(sizes, seed=batch)
    x = data(np.random.default_rng(batch), batch, sizes[0])
    for layout in ("C", "record"):
        q = net.forward(as_layout(x, layout)).copy()
        a = net.argmax(as_layout(x, layout))
        assert a.dtype == np.int64 and a.shape == (batch,)
        np.testing.assert_array_equal(a, np.argmax(q, axis=1))


def test_argmax_first_index_on_ties():
    net = MLP((4, 16, 5), seed=0)
    x = data(np.random.default_rng(0), 9, 4)
    w, b = net.layer(1)
    w[...] = 0
    b[...] = 0
    np.testing.assert_array_equal(net.argmax(x), 0)
    # a tie between outputs 1 and 3 that beats the others: the first, 1 (not 0, not the last)
    b[...] = [0, 1, 0, 1, -1]
    np.testing.assert_array_equal(net.argmax(x), 1)
    w[...] = np.random.default_rng(1).uniform(-0.1, 0.1, w.shape).astype(np.float32)
    w[3] = w[1]
    b[...] = [0, 10, 0, 10, 9]
    q = net.forward(x)
    assert np.all(q[:, 1] == q[:, 3]) and np.all(q[:, 1] > q[:, [0, 2, 4]].max(axis=1))
    np.testing.assert_array_equal(net.argmax(x), 1)
    d = DQN((4, 16, 5), seed=0)
    d.online.copy_from(net)
    assert all(d.act(row) == 1 for row in x)


def test_act_is_greedy():
    d = DQN(CARTPOLE_NET, seed=3)
    x = data(np.random.default_rng(3), 64, 4)
    q = naive.mlp_forward_naive(*wb(d.online), x)[-1]
    margin = np.abs(q[:, 0] - q[:, 1])
    assert (margin > 1e-4).all() and len(set(np.argmax(q, axis=1))) == 2
    acts = [d.act(row) for row in x]
    assert all(type(a) is int for a in acts)
    np.testing.assert_array_equal(acts, np.argmax(q, axis=1))
    # float64 and list observations are converted
    np.testing.assert_array_equal([d.act(row.astype(np.float64)) for row in x], acts)
    assert d.act(list(map(float, x[0]))) == acts[0]
    # act uses the online network
    d.target.params[...] = 0
    np.testing.assert_array_equal([d.act(row) for row in x], acts)


# -- Adam and the TD loss -------------------------------------------------------------------------


@pytest.mark.parametrize("lr, betas, eps", [(1e-3, (0.9, 0.999), 1e-8), (2.5e-4, (0.9, 0.999), 1e-8),
                                            (0.1, (0.5, 0.9), 1e-3), (1e-2, (0.0, 0.0), 1e-6)])
def test_adam_matches_reference(lr, betas, eps):
    rng = np.random.default_rng(0)
    p0 = rng.standard_normal(301)
    # gradients of very different sizes (1e-6 is near eps), each parameter keeping its own size
    # (else the float64 moments' rounding, relative to the largest gradient seen, is what shows)
    scale = rng.choice([1e-6, 1.0, 100.0], 301)
    grads = [rng.standard_normal(301) * scale for _ in range(5)]
    grads[2][:10] = 0  # a zero gradient: m and v decay
    ref_p, ref_m, ref_v = naive.adam_naive(p0, grads, lr, betas, eps)
    p = p0.copy()
    opt = Adam(p, lr=lr, betas=betas, eps=eps)
    for g in grads:
        opt.step(g)
    assert opt.t == 5 and opt.params is p
    np.testing.assert_allclose(p, ref_p, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(opt.m, ref_m, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(opt.v, ref_v, rtol=1e-12, atol=1e-300)
    # float32: each step moves a parameter by at most about lr (per step), to float32 rounding
    p32 = p0.astype(np.float32)
    opt32 = Adam(p32, lr=lr, betas=betas, eps=eps)
    for g in grads:
        opt32.step(g.astype(np.float32))
    ref32, _, _ = naive.adam_naive(p0.astype(np.float32), [g.astype(np.float32) for g in grads], lr, betas, eps)
    np.testing.assert_allclose(p32, ref32, rtol=1e-6, atol=1e-4 * lr)


def test_adam_kernel_direct():
    rng = np.random.default_rng(1)
    p = rng.standard_normal(17)
    g1, g2 = rng.standard_normal(17), rng.standard_normal(17)
    m, v = np.zeros(17), np.zeros(17)
    q = p.copy()
    _mlp.adam_step(q, g1, m, v, 0.01, 0.9, 0.999, 1e-8, 1)
    _mlp.adam_step(q, g2, m, v, 0.01, 0.9, 0.999, 1e-8, 2)
    ref_p, ref_m, ref_v = naive.adam_naive(p, [g1, g2], 0.01)
    np.testing.assert_allclose(q, ref_p, rtol=1e-13)
    np.testing.assert_allclose(m, ref_m, rtol=1e-13)
    np.testing.assert_allclose(v, ref_v, rtol=1e-13)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("batch", [1, 5, 128])
def test_td_loss_kernel_matches_reference(batch, dtype):
    rng = np.random.default_rng(batch)
    n_actions = 3
    q = rng.standard_normal((batch, n_actions)).astype(dtype)
    q_next = rng.standard_normal((batch, n_actions)).astype(dtype)
    actions = rng.integers(0, n_actions, batch)
    rewards = rng.standard_normal(batch).astype(np.float32)
    terminated = rng.random(batch) < 0.4
    terminated[0] = True
    discounts = (0.9 ** rng.integers(1, 4, batch)).astype(np.float32)
    weights = (rng.random(batch) + 0.1).astype(np.float32)
    grad = np.full((batch, n_actions), np.nan, dtype)
    td = np.full(batch, np.nan, dtype)
    loss = _mlp.td_loss(q, q_next, actions, rewards, terminated, discounts, weights, grad, td)
    ref_loss, ref_grad, ref_td = naive.td_loss_naive(q, q_next, actions, rewards, terminated, discounts, weights)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    assert loss == pytest.approx(ref_loss, rel=rtol)
    np.testing.assert_allclose(grad, ref_grad, rtol=rtol, atol=rtol * np.abs(ref_grad).max())
    np.testing.assert_allclose(td, ref_td, rtol=rtol, atol=rtol * ref_td.max())


@pytest.mark.parametrize("batch", [1, 7, 64])
@pytest.mark.parametrize("discounts, weights", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["plain", "nstep", "prioritized", "nstep-prioritized"])
def test_dqn_train_matches_reference(batch, discounts, weights):
    rng = np.random.default_rng(batch)
    d = DQN((4, 32, 16, 3), lr=1e-3, gamma=0.9, seed=batch)
    d.target.params[...] = MLP((4, 32, 16, 3), seed=99).params  # target differs from online
    b = make_batch(rng, batch, 4, 3, discounts=discounts, weights=weights)
    w0, wt = wb(d.online, d.online.params.copy()), wb(d.target, d.target.params.copy())
    p0 = d.online.params.astype(np.float64)
    q = naive.mlp_forward_naive(*w0, b["obs"])[-1]
    q_next = naive.mlp_forward_naive(*wt, b["next_obs"])[-1]
    disc = b.discounts if discounts else np.full(batch, 0.9)
    wts = b.weights if weights else np.ones(batch)
    ref_loss, ref_gq, ref_td = naive.td_loss_naive(q, q_next, b["action"], b["reward"], b["terminated"], disc, wts)
    ref_grads = naive.mlp_backward_naive(*w0, b["obs"], ref_gq)
    target_before = d.target.params.copy()

    loss = d.train(b)

    assert isinstance(loss, float)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    np.testing.assert_allclose(d.td_errors, ref_td, rtol=1e-5, atol=1e-5 * ref_td.max())
    flat = np.concatenate([np.concatenate([gw.ravel(), gb]) for gw, gb in ref_grads])
    np.testing.assert_allclose(d.online.grad, flat, rtol=1e-4, atol=1e-5 * np.abs(flat).max())
    ref_p, _, _ = naive.adam_naive(p0, [d.online.grad.astype(np.float64)], 1e-3)
    np.testing.assert_allclose(d.online.params, ref_p, rtol=1e-6, atol=1e-7)
    assert np.abs(d.online.params - p0).max() > 5e-4  # a step was taken
    np.testing.assert_array_equal(d.target.params, target_before)


def test_dqn_train_equals_its_parts():
    """DQN.train (one compiled call) does what target.forward, online.forward, the TD loss,
    online.backward and Adam.step do in turn, for plain, n-step and weighted batches and an
    AoS (non-contiguous) one."""
    rng = np.random.default_rng(8)
    d = DQN(CARTPOLE_NET, lr=1e-3, gamma=0.95, seed=8)
    d.target.reset_parameters(9)
    online, target = MLP(CARTPOLE_NET), MLP(CARTPOLE_NET)
    online.copy_from(d.online)
    target.copy_from(d.target)
    opt = Adam(online.params, lr=1e-3)
    for step in range(4):
        b = make_batch(rng, 33, 4, 2, discounts=step == 1, weights=step >= 2)
        if step == 3:
            b = Batch({k: as_layout(v, "record") if v.ndim == 2 else v for k, v in b.items()},
                      b.indices, weights=b.weights)
        q_next = target.forward(b["next_obs"])
        q = online.forward(b["obs"])
        grad_out = np.zeros((33, 2), np.float32)
        td = np.zeros(33, np.float32)
        disc = b.discounts if b.discounts is not None else np.full(33, 0.95, np.float32)
        w = b.weights if b.weights is not None else np.ones(33, np.float32)
        loss = _mlp.td_loss(q, q_next, b["action"], b["reward"], b["terminated"], disc, w, grad_out, td)
        online.backward(b["obs"], grad_out)
        opt.step(online.grad)
        assert d.train(b) == pytest.approx(loss, rel=1e-6)
        np.testing.assert_allclose(d.td_errors, td, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(d.online.grad, online.grad, rtol=1e-5, atol=1e-6 * np.abs(online.grad).max())
        np.testing.assert_allclose(d.online.params, online.params, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(d.optim.m, opt.m, rtol=1e-5, atol=1e-6 * np.abs(opt.m).max())
        assert d.optim.t == opt.t == step + 1
    np.testing.assert_array_equal(d.target.params, target.params)


# -- against torch ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    return torch


def torch_net(torch, net):
    """nn.Sequential of Linear/ReLU holding a copy of ``net``'s parameters (float32)."""
    layers = []
    pairs = split(net.sizes, net.params)
    for i, (w, b) in enumerate(pairs):
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w.copy()))
            lin.bias.copy_(torch.from_numpy(b.copy()))
        layers.append(lin)
        if i < len(pairs) - 1:
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers)


def torch_flat(seq, grad=False):
    return np.concatenate([(p.grad if grad else p).detach().numpy().ravel() for p in seq.parameters()])


@pytest.mark.parametrize("batch", [1, 5, 128])
@pytest.mark.parametrize("sizes", archs())
def test_forward_backward_match_torch(torch, sizes, batch):
    net = MLP(sizes, seed=batch)
    rng = np.random.default_rng(batch)
    x = data(rng, batch, sizes[0])
    g = data(rng, batch, sizes[-1])
    seq = torch_net(torch, net)
    xt = torch.from_numpy(x)
    out_t = seq(xt)
    out_t.backward(torch.from_numpy(g))
    weights, biases = wb(net)
    out = net.forward(as_layout(x, "record"))
    close32(out, out_t.detach().numpy().astype(np.float64), magnitude(weights, biases, x), rel=2e-5)
    net.backward(as_layout(x, "record"), g)
    mag = grad_magnitude(weights, biases, x, g)
    flat_mag = np.concatenate([np.concatenate([mw.ravel(), mb]) for mw, mb in mag])
    close32(net.grad, torch_flat(seq, grad=True).astype(np.float64), flat_mag, rel=2e-5)


@pytest.mark.parametrize("lr, betas", [(2.5e-4, (0.9, 0.999)), (1e-2, (0.8, 0.99))])
def test_adam_matches_torch(torch, lr, betas):
    rng = np.random.default_rng(4)
    p0 = rng.standard_normal(1000).astype(np.float32)
    grads = [(rng.standard_normal(1000) * rng.choice([1e-4, 1.0, 30.0], 1000)).astype(np.float32) for _ in range(5)]
    p = p0.copy()
    opt = Adam(p, lr=lr, betas=betas)
    pt = torch.nn.Parameter(torch.from_numpy(p0.copy()))
    opt_t = torch.optim.Adam([pt], lr=lr, betas=betas)
    for g in grads:
        opt.step(g)
        pt.grad = torch.from_numpy(g.copy())
        opt_t.step()
    # both in float32: the parameters agree to a few float32 roundings of them and of the step
    np.testing.assert_allclose(p, pt.detach().numpy(), rtol=2e-7, atol=1e-3 * lr)
    state = opt_t.state[pt]
    # the moments are running sums with cancellation: rounding is relative to the gradients
    g_max = np.abs(np.array(grads)).max(axis=0)
    close32(opt.m, state["exp_avg"].numpy().astype(np.float64), g_max, rel=1e-6)
    close32(opt.v, state["exp_avg_sq"].numpy().astype(np.float64), g_max ** 2, rel=1e-6)
    assert np.abs(p - p0).max() > 4 * lr  # the steps moved the parameters


def cleanrl_step(torch, q_net, target_net, opt, batch, gamma):
    """CleanRL dqn.py's update; n-step discounts and importance weights when the batch has them."""
    F = torch.nn.functional
    obs = torch.from_numpy(np.ascontiguousarray(batch["obs"]))
    next_obs = torch.from_numpy(np.ascontiguousarray(batch["next_obs"]))
    actions = torch.from_numpy(np.asarray(batch["action"], np.int64))
    rewards = torch.from_numpy(np.asarray(batch["reward"]))
    dones = torch.from_numpy(np.asarray(batch["terminated"])).float()
    discount = gamma if batch.discounts is None else torch.from_numpy(batch.discounts)
    with torch.no_grad():
        target_max, _ = target_net(next_obs).max(dim=1)
        td_target = rewards + discount * target_max * (1 - dones)
    old_val = q_net(obs).gather(1, actions.view(-1, 1)).squeeze(1)
    if batch.weights is None:
        loss = F.mse_loss(td_target, old_val)
    else:
        loss = (torch.from_numpy(batch.weights) * (td_target - old_val) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    grads = torch_flat(q_net, grad=True)
    opt.step()
    return float(loss.detach()), (old_val - td_target).abs().detach().numpy(), grads


@pytest.mark.parametrize("discounts, weights", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["plain", "nstep", "prioritized", "nstep-prioritized"])
def test_dqn_train_matches_cleanrl_in_torch(torch, discounts, weights):
    """Four updates of the CartPole network (batch 128, lr 2.5e-4) with a target sync after the
    second. Adam's first steps move each parameter by about lr (m / sqrt(v) is near +-1 whatever
    the gradient's size), so the parameters agree to float32 rounding plus a small fraction of
    lr; loss, TD errors and gradients agree to float32 summation order."""
    gamma = 0.99
    d = DQN(CARTPOLE_NET, lr=2.5e-4, gamma=gamma, seed=11)
    q_net, target_net = torch_net(torch, d.online), torch_net(torch, d.target)
    opt = torch.optim.Adam(q_net.parameters(), lr=2.5e-4)
    rng = np.random.default_rng(11)
    p0 = d.online.params.copy()
    for step in range(4):
        b = make_batch(rng, 128, 4, 2, discounts=discounts, weights=weights)
        if step == 1:
            b = Batch({k: as_layout(v, "record") if v.ndim == 2 else v for k, v in b.items()},
                      b.indices, weights=b.weights, discounts=b.discounts)
        loss_t, td_t, grads_t = cleanrl_step(torch, q_net, target_net, opt, b, gamma)
        loss = d.train(b)
        assert loss == pytest.approx(loss_t, rel=1e-5)
        np.testing.assert_allclose(d.td_errors, td_t, rtol=1e-5, atol=1e-5 * td_t.max())
        np.testing.assert_allclose(d.online.grad, grads_t, rtol=1e-4, atol=1e-5 * np.abs(grads_t).max())
        np.testing.assert_allclose(d.online.params, torch_flat(q_net), rtol=1e-6, atol=1e-3 * 2.5e-4)
        if step == 1:
            d.sync_target()
            target_net.load_state_dict(q_net.state_dict())
        np.testing.assert_allclose(d.target.params, torch_flat(target_net), rtol=1e-6, atol=1e-3 * 2.5e-4)
    assert np.abs(d.online.params - p0).max() > 2 * 2.5e-4


# -- behaviour ------------------------------------------------------------------------------------


def test_copy_from_and_sync_target():
    a, b = MLP(CARTPOLE_NET, seed=1), MLP(CARTPOLE_NET, seed=2)
    b.copy_from(a)
    np.testing.assert_array_equal(a.params, b.params)
    assert not np.shares_memory(a.params, b.params)
    a.params[0] += 1  # a copy, not an alias
    assert b.params[0] != a.params[0]

    d = DQN((4, 16, 2), lr=1e-2, seed=0)
    rng = np.random.default_rng(0)
    b = make_batch(rng, 32, 4, 2)
    start = d.online.params.copy()
    d.train(b)
    assert not np.array_equal(d.online.params, start)
    np.testing.assert_array_equal(d.target.params, start)  # the target waits for sync_target
    d.sync_target()
    np.testing.assert_array_equal(d.target.params, d.online.params)
    d.train(b)
    assert not np.array_equal(d.target.params, d.online.params)


def test_mlp_state_dict_round_trip():
    a = MLP((5, 9, 9, 9, 3), seed=1)
    state = a.state_dict()
    assert state["sizes"] == [5, 9, 9, 9, 3] and state["dtype"] == "float32"
    a.params[...] += 1  # the state holds a copy
    b = MLP((5, 9, 9, 9, 3), seed=2)
    b.load_state_dict(state)
    np.testing.assert_array_equal(b.params, MLP((5, 9, 9, 9, 3), seed=1).params)
    x = data(np.random.default_rng(0), 7, 5)
    a.load_state_dict(b.state_dict())
    np.testing.assert_array_equal(a.forward(x).copy(), b.forward(x))


def test_adam_state_dict_round_trip():
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(50).astype(np.float32) for _ in range(6)]
    p = rng.standard_normal(50).astype(np.float32)
    a = Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6)
    for g in grads[:3]:
        a.step(g)
    state = a.state_dict()
    q = p.copy()
    b = Adam(q)  # other hyperparameters, restored by the state
    b.load_state_dict(state)
    assert (b.t, b.lr, tuple(b.betas), b.eps) == (3, 0.01, (0.8, 0.99), 1e-6)
    for g in grads[3:]:
        a.step(g)
        b.step(g)
    np.testing.assert_array_equal(q, p)
    np.testing.assert_array_equal(b.m, a.m)
    np.testing.assert_array_equal(b.v, a.v)


def test_dqn_state_dict_round_trip():
    rng = np.random.default_rng(5)
    batches = [make_batch(rng, 33, 4, 2, discounts=i % 2 == 1) for i in range(6)]
    a = DQN((4, 32, 2), lr=1e-3, gamma=0.9, seed=0)
    for b in batches[:3]:
        a.train(b)
    a.sync_target()
    a.train(batches[3])
    state = a.state_dict()
    c = DQN((4, 32, 2), lr=1.0, gamma=0.5, seed=1)  # everything else comes from the state
    c.load_state_dict(state)
    assert c.gamma == 0.9 and c.optim.lr == 1e-3 and c.optim.t == 4
    for b in batches[4:]:
        assert a.train(b) == c.train(b)
        np.testing.assert_array_equal(a.td_errors, c.td_errors)
    for x, y in ((a.online, c.online), (a.target, c.target)):
        np.testing.assert_array_equal(x.params, y.params)
    np.testing.assert_array_equal(a.optim.m, c.optim.m)
    np.testing.assert_array_equal(a.optim.v, c.optim.v)
    assert not np.array_equal(a.online.params, state["online"]["params"])  # the state is a copy


def test_dqn_load_state_dict_into_a_used_object():
    rng = np.random.default_rng(5)
    b = make_batch(rng, 16, 4, 2)
    a = DQN((4, 8, 2), gamma=0.9, seed=0)
    c = DQN((4, 8, 2), gamma=0.5, seed=1)
    c.train(b)  # builds c's workspace for batch 16
    c.load_state_dict(a.state_dict())
    assert a.train(b) == c.train(b)


def test_dqn_learns_a_fixed_batch():
    """Fitting Q(obs, action) to fixed targets (the target network is never synced): the loss
    must fall below 5% of its start (it reaches about 1% with these settings)."""
    rng = np.random.default_rng(0)
    b = make_batch(rng, 64, 4, 2)
    d = DQN((4, 64, 2), lr=3e-3, gamma=0.9, seed=0)
    losses = [d.train(b) for _ in range(600)]
    assert losses[0] > 0.3
    assert losses[-1] < 0.05 * losses[0], (losses[0], losses[-1])
    assert np.mean(losses[-50:]) < np.mean(losses[:50])


def test_dqn_with_a_real_buffer():
    """Batches straight from tfdata buffers (AoS views, n-step discounts, importance weights)."""
    spec = tfdata.Spec(CARTPOLE)
    rng = np.random.default_rng(0)
    rows = random_rows(spec, 200, rng)
    rows["action"] = rng.integers(0, 2, 200)
    for buf in (tfdata.ReplayBuffer(spec, 256, layout="aos", seed=0, n_step=3, gamma=0.9),
                tfdata.PrioritizedReplayBuffer(spec, 256, layout="aos", seed=0)):
        buf.extend(rows)
        batch = buf.sample(33)
        assert not batch["obs"].flags.c_contiguous or buf.layout != "aos"
        d = DQN(CARTPOLE_NET, gamma=0.9, seed=0)
        d.target.reset_parameters(1)
        q = naive.mlp_forward_naive(*wb(d.online), batch["obs"])[-1]
        q_next = naive.mlp_forward_naive(*wb(d.target), batch["next_obs"])[-1]
        disc = batch.discounts if batch.discounts is not None else np.full(33, 0.9)
        w = batch.weights if batch.weights is not None else np.ones(33)
        ref_loss, _, ref_td = naive.td_loss_naive(q, q_next, batch["action"], batch["reward"],
                                                  batch["terminated"], disc, w)
        assert d.train(batch) == pytest.approx(ref_loss, rel=1e-5)
        np.testing.assert_allclose(d.td_errors, ref_td, rtol=1e-5, atol=1e-5 * ref_td.max())
        if batch.weights is not None:
            buf.update_priorities(batch, d.td_errors)


def test_steady_state_reuses_memory():
    net = MLP(CARTPOLE_NET, seed=0)
    rng = np.random.default_rng(0)
    x1, x2 = data(rng, 33, 4), data(rng, 33, 4)
    out1 = net.forward(x1)
    ptr = out1.__array_interface__["data"][0]
    ref2 = naive.mlp_forward_naive(*wb(net), x2)[-1]
    out2 = net.forward(x2)
    assert out2.__array_interface__["data"][0] == ptr and np.shares_memory(out1, out2)
    np.testing.assert_allclose(out1, ref2, rtol=1e-4, atol=1e-5)  # out1 now holds x2's outputs
    a1, a2 = net.argmax(x1), net.argmax(x2)
    assert np.shares_memory(a1, a2)
    g = np.ones((33, 2), np.float32)
    assert net.backward(x2, g) is net.backward(x2, g) is net.grad
    nbytes = net.nbytes
    net.forward(x1)
    assert net.nbytes == nbytes

    d = DQN(CARTPOLE_NET, seed=0)
    b = make_batch(rng, 512, 4, 2, weights=True)
    d.train(b)
    d.act(b["obs"][0])
    td, params, grad = d.td_errors, d.online.params, d.online.grad
    ptrs = [a.__array_interface__["data"][0] for a in (td, params, grad, d.target.params)]
    nbytes = d.nbytes
    # numpy reports every array it allocates to tracemalloc: 50 updates, actions and forwards at
    # batch 512 must not hold even one (512,) float32 array (2 kB) at a time
    tracemalloc.start()
    try:
        for _ in range(50):
            d.train(b)
            d.act(b["obs"][0])
            d.online.forward(b["obs"])
            d.online.argmax(b["obs"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2048, peak
    assert [a.__array_interface__["data"][0] for a in (d.td_errors, d.online.params, d.online.grad,
                                                        d.target.params)] == ptrs
    assert d.td_errors is td and d.online.params is params and d.optim.params is params
    assert d.nbytes == nbytes


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [(4,), (), (4, 0, 2), (4, True), (4, -2), (4, 2.0), (True, 2), ("4", 2)],
                         ids=str)
def test_mlp_rejects_bad_sizes(sizes):
    msg = r"sizes must be at least two positive ints .*got " + re.escape(repr(tuple(sizes)))
    with pytest.raises(ValueError, match=msg):
        MLP(sizes)
    with pytest.raises(ValueError, match="sizes must be"):
        DQN(sizes)


@pytest.mark.parametrize("dtype", ["float16", "int32", "complex64"])
def test_mlp_rejects_bad_dtype(dtype):
    with pytest.raises(TypeError, match=f"dtype must be float32 or float64, got {dtype}"):
        MLP((4, 2), dtype=dtype)


BAD_X = [
    (np.zeros((5, 3), np.float32), ValueError, r"x: expected shape (batch >= 1, 4), got (5, 3)"),
    (np.zeros(4, np.float32), ValueError, r"x: expected shape (batch >= 1, 4), got (4,)"),
    (np.zeros((2, 5, 4), np.float32), ValueError, r"x: expected shape (batch >= 1, 4), got (2, 5, 4)"),
    (np.zeros((0, 4), np.float32), ValueError, r"x: expected shape (batch >= 1, 4), got (0, 4)"),
    (np.zeros((5, 4), np.float64), TypeError, r"x: expected dtype float32, got float64"),
    (np.zeros((5, 4), np.int64), TypeError, r"x: expected dtype float32, got int64"),
]


@pytest.mark.parametrize("x, exc, msg", BAD_X, ids=[m for _, _, m in BAD_X])
def test_forward_and_backward_reject_bad_x(x, exc, msg):
    net = MLP((4, 8, 2), seed=0)
    good = data(np.random.default_rng(0), 5, 4)
    net.forward(good)
    net.backward(good, np.ones((5, 2), np.float32))
    before = snapshot(net.params, net.grad)
    for call in (lambda: net.forward(x), lambda: net.argmax(x),
                 lambda: net.backward(x, np.ones((len(x), 2), np.float32))):
        with pytest.raises(exc, match=re.escape(msg)):
            call()
    assert_unchanged(before, (net.params, net.grad))


BAD_GRAD_OUT = [
    np.ones((5, 3), np.float32), np.ones((2, 5), np.float32), np.ones((4, 2), np.float32),
    np.ones(10, np.float32), np.ones((5, 2), np.float64), np.ones((5, 2), np.int32),
]


@pytest.mark.parametrize("g", BAD_GRAD_OUT, ids=lambda g: f"{g.dtype}{list(g.shape)}")
def test_backward_rejects_bad_grad_out(g):
    net = MLP((4, 8, 2), seed=0)
    x = data(np.random.default_rng(0), 5, 4)
    net.forward(x)
    net.backward(x, np.ones((5, 2), np.float32))
    before = snapshot(net.params, net.grad)
    msg = f"grad_out: expected float32 of shape (5, 2), got {g.dtype} of shape {g.shape}"
    with pytest.raises(ValueError, match=re.escape(msg)):
        net.backward(x, g)
    assert_unchanged(before, (net.params, net.grad))


@pytest.mark.parametrize("g", [np.ones(9, np.float32), np.ones(10, np.float64), np.ones((10, 1), np.float32),
                               np.ones(10, np.float16)], ids=lambda g: f"{g.dtype}{list(g.shape)}")
def test_adam_rejects_bad_grad(g):
    p = np.arange(10, dtype=np.float32)
    opt = Adam(p, lr=0.1)
    opt.step(np.ones(10, np.float32))
    before = snapshot(p, opt.m, opt.v)
    msg = f"grad: expected float32 of shape (10,), got {g.dtype} of shape {g.shape}"
    with pytest.raises(ValueError, match=re.escape(msg)):
        opt.step(g)
    assert_unchanged(before, (p, opt.m, opt.v))
    assert opt.t == 1


LR_RANGE = "lr must be finite and in (0.0, 1000.0], got"
EPS_RANGE = "eps must be finite and >= 1.1754943508222875e-38, got"


@pytest.mark.parametrize("kwargs, msg", [
    ({"lr": 0}, f"{LR_RANGE} 0.0"),
    ({"lr": -1e-3}, f"{LR_RANGE} -0.001"),
    ({"lr": float("nan")}, f"{LR_RANGE} nan"),
    # inf or 1e308 made every parameter inf in one step; 1e4 is past the documented bound
    ({"lr": float("inf")}, f"{LR_RANGE} inf"),
    ({"lr": 1e308}, f"{LR_RANGE} 1e+308"),
    ({"lr": 1e4}, f"{LR_RANGE} 10000.0"),
    ({"eps": 0.0}, f"{EPS_RANGE} 0.0"),
    ({"eps": float("inf")}, f"{EPS_RANGE} inf"),
    ({"eps": 1e-300}, f"{EPS_RANGE} 1e-300"),
    ({"betas": (1.0, 0.999)}, "betas must be two floats in [0, 1), got (1.0, 0.999)"),
    ({"betas": (0.9, 1.0)}, "betas must be two floats in [0, 1), got (0.9, 1.0)"),
    ({"betas": (-0.1, 0.999)}, "betas must be two floats in [0, 1), got (-0.1, 0.999)"),
    ({"betas": (0.9, 1.5)}, "betas must be two floats in [0, 1), got (0.9, 1.5)"),
    ({"betas": (0.9,)}, "betas must be two floats in [0, 1), got (0.9,)"),
    ({"betas": (0.9, 0.99, 0.9)}, "betas must be two floats in [0, 1), got (0.9, 0.99, 0.9)"),
    ({"betas": ("0.9", 0.999)}, "betas must be two floats in [0, 1), got ('0.9', 0.999)"),
    ({"betas": 0.9}, "betas must be two floats in [0, 1), got 0.9"),
], ids=lambda v: str(v))
def test_adam_rejects_bad_hyperparameters(kwargs, msg):
    with pytest.raises(ValueError, match=re.escape(msg)):
        Adam(np.zeros(3, np.float32), **kwargs)
    with pytest.raises(ValueError, match=re.escape(msg)):
        DQN((4, 2), **kwargs)


@pytest.mark.parametrize("kwargs", [{"lr": "1e-3"}, {"lr": True}, {"eps": None}], ids=str)
def test_adam_rejects_hyperparameters_of_the_wrong_type(kwargs):
    (name, value), = kwargs.items()
    msg = f"{name} must be a number, got {type(value).__name__} {value!r}"
    with pytest.raises(TypeError, match=re.escape(msg)):
        Adam(np.zeros(3, np.float32), **kwargs)
    with pytest.raises(TypeError, match=re.escape(msg)):
        DQN((4, 2), **kwargs)


def test_adam_bounds_keep_a_step_finite():
    """The extremes accepted (lr 1e3, eps 2**-126) on the gradients the bounds are about: a
    gradient whose square underflows float32's second moment to 0 (the step is then m / eps),
    a large one and an ordinary one; every parameter stays finite."""
    p = np.zeros(4, np.float32)
    opt = Adam(p, lr=1e3, eps=float(np.finfo(np.float32).tiny), betas=(0.0, 0.999))
    g = np.array([1e-23, -1e-30, 1e18, 1.0], np.float32)
    for _ in range(3):
        opt.step(g)
    assert opt.v[0] == 0 and np.isfinite(p).all() and (np.abs(p) > 0).all()
    # and just past them: refused
    with pytest.raises(ValueError, match="lr must be"):
        Adam(p, lr=np.nextafter(1e3, np.inf))
    with pytest.raises(ValueError, match="eps must be"):
        Adam(p, eps=np.nextafter(np.finfo(np.float32).tiny, 0, dtype=np.float64))


def adam_state(**change):
    opt = Adam(np.arange(5, dtype=np.float32), lr=0.01)
    opt.step(np.ones(5, np.float32))
    state = opt.state_dict()
    state.update(change)
    return state


@pytest.mark.parametrize("change, match", [
    ({"lr": float("inf")}, "state['lr']: expected a finite float in [0.0, 1000.0], got inf"),
    ({"lr": 1e308}, "state['lr']: expected a finite float in [0.0, 1000.0], got 1e+308"),
    ({"lr": -1.0}, "state['lr']: expected a finite float in [0.0, 1000.0], got -1.0"),
    ({"lr": "0.1"}, "state['lr']: expected a finite float in [0.0, 1000.0], got '0.1'"),
    ({"eps": float("inf")}, "state['eps']: expected a finite float >= 1.1754943508222875e-38, got inf"),
    ({"eps": 0.0}, "state['eps']: expected a finite float >= 1.1754943508222875e-38, got 0.0"),
    ({"betas": [1.0, 0.9]}, "state['betas']: expected two floats in [0, 1), got [1.0, 0.9]"),
    ({"betas": [0.9]}, "state['betas']: expected two floats in [0, 1), got [0.9]"),
    ({"t": 2 ** 70}, f"state['t']: expected an int in [0, {2 ** 62}], got {2 ** 70}"),
    ({"t": 2 ** 62 + 1}, f"state['t']: expected an int in [0, {2 ** 62}], got {2 ** 62 + 1}"),
    ({"t": -1}, f"state['t']: expected an int in [0, {2 ** 62}], got -1"),
    ({"t": 1.0}, f"state['t']: expected an int in [0, {2 ** 62}], got 1.0"),
    ({"t": True}, f"state['t']: expected an int in [0, {2 ** 62}], got True"),
    ({"m": np.zeros(3)}, "state['m']: expected finite floats of shape (5,), got float64 of shape (3,)"),
    ({"m": np.array([0, 0, np.nan, 0, 0])}, "state['m']: expected finite floats of shape (5,), got nan at index 2"),
    ({"m": np.array([0, 0, 0, 1e39, 0])}, "state['m']: expected finite floats of shape (5,), got 1e+39 at index 3"),
    ({"v": np.array([0, -1.0, 0, 0, 0])}, "state['v']: expected finite floats of shape (5,) >= 0, got -1.0 at index 1"),
    ({"v": np.zeros(5, np.int64)}, "state['v']: expected finite floats of shape (5,) >= 0, got int64 of shape (5,)"),
], ids=str)
def test_adam_load_state_dict_rejects_bad_state_and_changes_nothing(change, match):
    p = np.arange(5, dtype=np.float32)
    opt = Adam(p, lr=0.1, betas=(0.5, 0.9), eps=1e-6)
    opt.step(np.full(5, 0.5, np.float32))
    before = snapshot(p, opt.m, opt.v)
    hyper = (opt.t, opt.lr, opt.betas, opt.eps)
    with pytest.raises(ValueError, match=re.escape(match)):
        opt.load_state_dict(adam_state(**change))
    assert_unchanged(before, (p, opt.m, opt.v))
    assert (opt.t, opt.lr, opt.betas, opt.eps) == hyper
    opt.load_state_dict(adam_state())  # a good state still loads


def test_adam_load_state_dict_names_missing_fields():
    opt = Adam(np.zeros(5, np.float32))
    state = adam_state()
    del state["eps"]
    with pytest.raises(ValueError, match=re.escape("state: missing field 'eps'")):
        opt.load_state_dict(state)
    with pytest.raises(ValueError, match=re.escape("state: expected a mapping, got list")):
        opt.load_state_dict([1, 2])
    assert opt.t == 0 and opt.lr == 1e-3


def test_adam_state_at_the_bounds_loads_and_steps():
    """lr 0 (a rate annealed to 0) loads; the largest step count accepted, 2**62, still steps
    (the kernel's int64 step number is t + 1; beta ** t underflows to 0)."""
    p = np.arange(5, dtype=np.float32)
    opt = Adam(p)
    opt.load_state_dict(adam_state(lr=0.0))
    opt.step(np.ones(5, np.float32))
    np.testing.assert_array_equal(p, np.arange(5, dtype=np.float32))
    opt.load_state_dict(adam_state(t=2 ** 62, lr=1e-3))
    opt.step(np.ones(5, np.float32))
    assert opt.t == 2 ** 62 + 1 and np.isfinite(p).all() and not np.array_equal(p, np.arange(5))
    with pytest.raises(ValueError, match="state\\['t'\\]"):
        opt.load_state_dict(adam_state(t=2 ** 62 + 1))
    with pytest.raises(ValueError, match="state\\['lr'\\]"):
        opt.load_state_dict(adam_state(lr=np.nextafter(1e3, np.inf)))


@pytest.mark.parametrize("params", [[1.0, 2.0], np.zeros((2, 3), np.float32), np.zeros(3, np.int64)],
                         ids=["list", "2d", "int"])
def test_adam_rejects_bad_params(params):
    with pytest.raises(TypeError, match="params: expected a 1-D float ndarray"):
        Adam(params)


@pytest.mark.parametrize("gamma", [-0.1, 1.01, float("nan")])
def test_dqn_rejects_bad_gamma(gamma):
    with pytest.raises(ValueError, match="gamma must be in"):
        DQN((4, 2), gamma=gamma)


@pytest.mark.parametrize("gamma", ["0.9", True, None])
def test_dqn_rejects_a_gamma_of_the_wrong_type(gamma):
    with pytest.raises(TypeError, match=re.escape(f"gamma must be a number, got {type(gamma).__name__}")):
        DQN((4, 2), gamma=gamma)


@pytest.mark.parametrize("seed, exc", [(-1, ValueError), (2 ** 64, ValueError), (1.5, TypeError),
                                       ("1", TypeError), (True, TypeError)], ids=str)
def test_mlp_and_dqn_reject_bad_seeds(seed, exc):
    for make in (lambda: MLP((4, 2), seed=seed), lambda: DQN((4, 2), seed=seed),
                 lambda: MLP((4, 2)).reset_parameters(seed)):
        with pytest.raises(exc, match="^seed must be"):
            make()
    MLP((4, 2), seed=2 ** 64 - 1)  # the largest accepted


def test_mlp_refuses_more_parameters_than_int64_offsets_hold():
    # (the layer table's int64 offsets overflowed with an OverflowError naming nothing)
    with pytest.raises(ValueError, match=re.escape(f"sizes: expected at most 2**63 - 1 parameters, got "
                                                   f"{2 ** 64 + 2 ** 32} from (4294967296, 4294967296)")):
        MLP((2 ** 32, 2 ** 32))


def test_mlp_load_state_dict_rejects_bad_params_and_changes_nothing():
    net = MLP((4, 8, 2), seed=0)
    before = net.params.copy()
    for params, got in ((np.where(np.arange(58) == 7, np.nan, 0.0), "nan at index 7"),
                        (np.where(np.arange(58) == 3, np.inf, 0.0), "inf at index 3"),
                        (np.full(58, 1e39), "1e+39 at index 0"),  # inf once stored as float32
                        (np.zeros(58, np.int64), "int64 of shape (58,)"),
                        (np.zeros((58, 1)), "float64 of shape (58, 1)")):
        state = {**net.state_dict(), "params": params}
        with pytest.raises(ValueError, match=re.escape(f"state['params']: expected finite floats of "
                                                       f"shape (58,), got {got}")):
            net.load_state_dict(state)
    for change, match in (({"sizes": "4,8,2"}, "state['sizes']: expected [4, 8, 2] (58 params), got '4,8,2'"),
                          ({"sizes": [4.0, 8, 2]}, "state['sizes']: expected [4, 8, 2]"),
                          ({"sizes": None}, "state['sizes']: expected [4, 8, 2]")):
        with pytest.raises(ValueError, match=re.escape(match)):
            net.load_state_dict({**net.state_dict(), **change})
    state = net.state_dict()
    del state["params"]
    with pytest.raises(ValueError, match=re.escape("state: missing field 'params'")):
        net.load_state_dict(state)
    np.testing.assert_array_equal(net.params, before)


def dqn_state(**change):
    d = DQN((4, 8, 2), lr=1e-3, gamma=0.9, seed=1)
    d.train(make_batch(np.random.default_rng(3), 16, 4, 2))
    state = d.state_dict()
    for key, value in change.items():
        if "." in key:
            outer, inner = key.split(".")
            state[outer] = {**state[outer], inner: value}
        else:
            state[key] = value
    return state


@pytest.mark.parametrize("change, match", [
    ({"gamma": 2.0}, "state['gamma']: expected a float in [0, 1], got 2.0"),
    ({"gamma": float("nan")}, "state['gamma']: expected a float in [0, 1], got nan"),
    ({"gamma": "0.9"}, "state['gamma']: expected a float in [0, 1], got '0.9'"),
    ({"optim.lr": float("inf")}, "state['optim.lr']: expected a finite float in [0.0, 1000.0], got inf"),
    ({"optim.lr": 1e308}, "state['optim.lr']: expected a finite float in [0.0, 1000.0], got 1e+308"),
    ({"optim.eps": float("inf")}, "state['optim.eps']: expected a finite float >= "),
    ({"optim.t": 2 ** 70}, f"state['optim.t']: expected an int in [0, {2 ** 62}], got {2 ** 70}"),
    ({"optim.betas": (0.9, 1.0)}, "state['optim.betas']: expected two floats in [0, 1), got (0.9, 1.0)"),
    ({"optim.v": -np.ones(58)}, "state['optim.v']: expected finite floats of shape (58,) >= 0, got -1.0 at index 0"),
    ({"online.params": np.full(58, np.nan)}, "state['online.params']: expected finite floats of shape (58,), got nan"),
    # the online network is fine and differs from ours: a refused target must not leave it loaded
    ({"target.sizes": [4, 9, 2]}, "state['target.sizes']: expected [4, 8, 2] (58 params), got [4, 9, 2]"),
    ({"target.activation": "tanh"}, "state['target.activation']: expected 'relu', got 'tanh'"),
    ({"optim": [1, 2]}, "state['optim']: expected a mapping, got list"),
    ({"gamma": None}, "state['gamma']: expected a float in [0, 1], got None"),
], ids=str)
def test_dqn_load_state_dict_rejects_bad_state_and_changes_nothing(change, match):
    d = DQN((4, 8, 2), lr=2e-3, gamma=0.5, seed=0)
    d.train(make_batch(np.random.default_rng(2), 16, 4, 2))
    d.sync_target()
    before = snapshot(d.online.params, d.target.params, d.optim.m, d.optim.v)
    hyper = (d.gamma, d.optim.t, d.optim.lr, d.optim.betas, d.optim.eps)
    with pytest.raises(ValueError, match=re.escape(match)):
        d.load_state_dict(dqn_state(**change))
    assert_unchanged(before, (d.online.params, d.target.params, d.optim.m, d.optim.v))
    assert (d.gamma, d.optim.t, d.optim.lr, d.optim.betas, d.optim.eps) == hyper
    d.load_state_dict(dqn_state())
    assert d.gamma == 0.9 and d.optim.lr == 1e-3


def test_dqn_load_state_dict_names_missing_fields():
    d = DQN((4, 8, 2), seed=0)
    state = dqn_state()
    del state["optim"]["t"]
    with pytest.raises(ValueError, match=re.escape("state: missing field 'optim.t'")):
        d.load_state_dict(state)
    del state["gamma"]
    with pytest.raises(ValueError, match=re.escape("state: missing field 'gamma'")):
        d.load_state_dict(state)
    assert d.optim.t == 0


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_dqn_act_refuses_non_finite_q_values(bad):
    d = DQN((4, 8, 2), seed=0)
    with pytest.raises(ValueError, match=r"obs: the Q-values are \[nan, nan\].*no action is greedy"):
        d.act(np.array([0.5, np.nan, 0.0, 0.0]))
    d.online.layer(1)[1][1] = bad  # an output bias: that Q-value is not finite whatever obs is
    with pytest.raises(ValueError, match=r"obs: the Q-values are \[.*(nan|inf)\]"):
        d.act(np.zeros(4))
    d.online.layer(1)[1][1] = 0.0
    assert d.act(np.zeros(4)) in (0, 1)


def bad_batches(n=6):
    def change(**kv):
        b = make_batch(np.random.default_rng(0), n, 4, 2)
        fields = dict(b)
        fields.update(kv)
        return Batch(fields, b.indices)

    rng = np.random.default_rng(1)
    return [
        (change(reward=rng.standard_normal(n)), ValueError,
         f"batch['reward']: expected float32 of shape ({n},), got float64 of shape ({n},)"),
        (change(reward=np.ones(n - 1, np.float32)), ValueError,
         f"batch['reward']: expected float32 of shape ({n},), got float32 of shape ({n - 1},)"),
        (change(terminated=np.zeros(n, np.int64)), ValueError,
         f"batch['terminated']: expected bool of shape ({n},), got int64 of shape ({n},)"),
        (change(next_obs=np.zeros((n, 5), np.float32)), ValueError,
         f"batch['next_obs']: expected float32 of shape ({n}, 4), got float32 of shape ({n}, 5)"),
        (change(next_obs=np.zeros((n, 4), np.float64)), ValueError,
         f"batch['next_obs']: expected float32 of shape ({n}, 4), got float64 of shape ({n}, 4)"),
        (change(action=np.zeros(n, np.float32)), ValueError,
         f"batch['action']: expected ints of shape ({n},), got float32 of shape ({n},)"),
        (change(action=np.zeros((n, 1), np.int64)), ValueError,
         f"batch['action']: expected ints of shape ({n},), got int64 of shape ({n}, 1)"),
        (change(obs=np.zeros((n, 5), np.float32), next_obs=np.zeros((n, 5), np.float32)), ValueError,
         f"batch['obs']: expected float32 of shape (batch >= 1, 4), got float32 of shape ({n}, 5)"),
        (change(obs=np.zeros((n, 4), np.float64)), ValueError,
         f"batch['obs']: expected float32 of shape (batch >= 1, 4), got float64 of shape ({n}, 4)"),
    ]


@pytest.mark.parametrize("i", range(len(bad_batches())))
def test_dqn_train_rejects_bad_batches(i):
    batch, exc, msg = bad_batches()[i]
    d = DQN((4, 8, 2), seed=0)
    good = make_batch(np.random.default_rng(2), 6, 4, 2)
    d.train(good)
    d.online.params[...] = MLP((4, 8, 2), seed=3).params  # online and target differ
    before = snapshot(d.online.params, d.target.params, d.optim.m, d.optim.v, d.td_errors)
    with pytest.raises(exc, match=re.escape(msg)):
        d.train(batch)
    assert_unchanged(before, (d.online.params, d.target.params, d.optim.m, d.optim.v, d.td_errors))
    assert d.optim.t == 1


@pytest.mark.parametrize("action", [2, -1])
def test_dqn_train_rejects_actions_out_of_range(action):
    d = DQN((4, 8, 2), seed=0)
    b = make_batch(np.random.default_rng(0), 6, 4, 2)
    fields = dict(b)
    fields["action"] = np.array([0, 1, 0, 1, 0, action])
    before = d.online.params.copy()
    with pytest.raises(ValueError, match="action"):
        d.train(Batch(fields, b.indices))
    np.testing.assert_array_equal(d.online.params, before)


@pytest.mark.parametrize("attr", ["discounts", "weights"])
def test_dqn_train_rejects_short_discounts_or_weights(attr):
    d = DQN((4, 8, 2), seed=0)
    b = make_batch(np.random.default_rng(0), 6, 4, 2)
    setattr(b, attr, np.ones(5, np.float32))
    before = d.online.params.copy()
    with pytest.raises(ValueError, match=attr):
        d.train(b)
    np.testing.assert_array_equal(d.online.params, before)


def test_dqn_act_rejects_wrong_observation_size():
    d = DQN((4, 8, 2), seed=0)
    with pytest.raises(ValueError, match="obs"):
        d.act(np.array([0.5], np.float32))


def test_state_dict_and_copy_from_reject_mismatches():
    a, b = MLP((4, 8, 2), seed=0), MLP((4, 9, 2), seed=1)
    before = a.params.copy()
    with pytest.raises(ValueError, match=re.escape("copy_from: expected a network of sizes (4, 8, 2)")):
        a.copy_from(b)
    msg = "copy_from: expected a network of sizes (4, 8, 2) and dtype float32"
    with pytest.raises(ValueError, match=re.escape(msg)):
        a.copy_from(MLP((4, 8, 2), dtype="float64"))
    with pytest.raises(ValueError, match=re.escape("state['sizes']: expected [4, 8, 2] (58 params), got [4, 9, 2]")):
        a.load_state_dict(b.state_dict())
    np.testing.assert_array_equal(a.params, before)
    opt = Adam(a.params)
    with pytest.raises(ValueError, match=re.escape("state['m']: expected finite floats of shape (58,), "
                                                   "got float64 of shape (3,)")):
        opt.load_state_dict({"t": 1, "m": np.zeros(3), "v": np.zeros(58), "lr": 1.0, "betas": (0.9, 0.9), "eps": 1.0})
    assert opt.t == 0 and opt.lr == 1e-3 and not opt.m.any()
