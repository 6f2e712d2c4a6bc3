"""tfdata.nn's tanh MLP and PPO (nn._ppo_kernels) against tests/naive.py, finite differences and torch.

Tolerances as in tests/test_nn.py: float32 results against float64 references within a small
multiple of float32 rounding of the magnitudes involved; float64 kernels to 1e-10; finite
differences to 1e-6 (tanh networks are smooth, the loss is smooth away from its clip kinks,
which the data keeps clear of). Adam in float32 moves a parameter by about lr per step, and by
up to lr * |gradient error| / eps where the gradient is near zero, so parameters after a step
are compared to a fraction of lr.
"""

from __future__ import annotations

import math
import re
import tracemalloc

import numpy as np
import pytest

import tfdata
from tfdata import Batch
from tfdata.nn import _ppo_kernels as _ppo
from tfdata.nn import MLP, PPO, orthogonal

from . import naive

TANH_ARCHS = [(1, 1), (3, 2), (4, 64, 64, 2), (4, 64, 64, 1), (7, 33, 1), (5, 9, 9, 9, 3), (12, 5, 20, 3)]
BATCHES = [1, 3, 4, 5, 8, 33, 128]
LAYOUTS = ["C", "record", "strided"]


def arch_id(sizes):
    return "x".join(map(str, sizes))


def as_layout(x, layout):
    if layout == "C":
        return np.ascontiguousarray(x)
    if layout == "record":
        rec = np.zeros(len(x), dtype=[("obs", x.dtype, (x.shape[1],)), ("x", "f8")])
        rec["obs"] = x
        return rec["obs"]
    big = np.full((2 * len(x), x.shape[1] + 3), np.nan, x.dtype)
    big[::2, 2:2 + x.shape[1]] = x
    return big[::2, 2:2 + x.shape[1]]


def split(sizes, flat):
    """[(weight (n_out, n_in), bias)] of a flat vector by the documented layout."""
    out, off = [], 0
    for n_in, n_out in zip(sizes, sizes[1:]):
        w = flat[off:off + n_in * n_out].reshape(n_out, n_in)
        off += n_in * n_out
        out.append((w, flat[off:off + n_out]))
        off += n_out
    assert off == len(flat)
    return out


def wb(sizes, flat):
    layers = split(sizes, flat)
    return [w for w, _ in layers], [b for _, b in layers]


def flatten(grads):
    return np.concatenate([np.concatenate([dw.ravel(), db]) for dw, db in grads])


def tanh_net(sizes, seed, dtype="float32"):
    net = MLP(sizes, activation="tanh", dtype=dtype)
    # a wider spread than layer_init's, so that tanh is well into its nonlinear range
    net.reset_orthogonal(seed, gain=1.5, out_gain=1.0)
    rng = np.random.default_rng(seed + 100)
    net.params[...] += rng.normal(0, 0.1, net.n_params)  # nonzero biases too
    return net


def magnitude(sizes, flat, x):
    """Per output, the sum of absolute values of the terms that make it (tanh bounded by 1)."""
    w, b = wb(sizes, np.abs(np.asarray(flat, np.float64)))
    h = np.abs(np.asarray(x, np.float64))
    for i, (wi, bi) in enumerate(zip(w, b)):
        h = h @ wi.T + bi
        if i < len(w) - 1:
            h = np.ones_like(h)
    return h


def close32(actual, expected, mag, rel=1e-5):
    actual = np.asarray(actual, np.float64)
    bad = np.abs(actual - expected) > rel * mag + 1e-30
    assert not bad.any(), (f"{bad.sum()} of {bad.size} off; worst "
                           f"{np.max(np.abs(actual - expected) / (mag + 1e-30)):.3g} of the magnitude")


# -- tanh, orthogonal initialisation -------------------------------------------------------------


def test_tanh_approximation_is_float32_accurate():
    x = np.concatenate([np.linspace(-20, 20, 400_001), [0.0, -0.0, 1e-30, 3e-4, 4e-4, 7.9, 7.91, 1e4, -1e4]])
    a = x.astype(np.float32)
    ref = np.tanh(a.astype(np.float64))
    _ppo._tanh_row(a)
    err = np.abs(a - ref)
    # a few float32 ulps of the result (ulp of 1.0 is 1.2e-7), far below any real error
    assert err.max() < 3e-7, err.max()
    assert np.all(np.abs(a) <= 1.0)
    neg = -x.astype(np.float32)
    _ppo._tanh_row(neg)
    np.testing.assert_array_equal(neg, -a)  # odd
    d = x.copy()
    _ppo._tanh_row(d)
    np.testing.assert_allclose(d, np.tanh(x), rtol=1e-15, atol=0)  # float64: math.tanh


def test_tanh_of_nan_is_nan():
    a = np.array([np.nan, 1.0], np.float32)
    _ppo._tanh_row(a)
    assert np.isnan(a[0]) and abs(a[1] - np.tanh(1.0)) < 3e-7


@pytest.mark.parametrize("shape", [(64, 4), (4, 64), (64, 64), (2, 64), (1, 64), (7, 3)])
@pytest.mark.parametrize("gain", [1.0, math.sqrt(2), 0.01])
def test_orthogonal(shape, gain):
    w = orthogonal(shape, gain, np.random.default_rng(0))
    assert w.shape == shape
    rows, cols = shape
    gram = w @ w.T if rows <= cols else w.T @ w
    np.testing.assert_allclose(gram, gain ** 2 * np.eye(min(shape)), atol=1e-12 * max(1, gain ** 2))
    np.testing.assert_array_equal(w, orthogonal(shape, gain, np.random.default_rng(0)))
    assert not np.array_equal(w, orthogonal(shape, gain, np.random.default_rng(1)))


@pytest.mark.parametrize("shape", [(64, 4), (4, 64), (64, 64), (2, 64)])
def test_orthogonal_follows_torch(shape):
    torch = pytest.importorskip("torch")
    # torch.nn.init.orthogonal_ on the same normal matrix (its code, as of torch 2.x)
    normal = np.random.default_rng(3).standard_normal(shape)
    rows, cols = shape
    flat = torch.from_numpy(normal.copy())
    if rows < cols:
        flat = flat.t()
    q, r = torch.linalg.qr(flat)
    q = q * torch.diag(r, 0).sign()
    if rows < cols:
        q = q.t()
    np.testing.assert_allclose(orthogonal(shape, 2.0, np.random.default_rng(3)), 2.0 * q.numpy(), atol=1e-12)


def test_ppo_init_is_cleanrl_layer_init():
    agent = PPO(4, 3, seed=0)
    assert agent.actor.sizes == (4, 64, 64, 3) and agent.critic.sizes == (4, 64, 64, 1)
    assert agent.actor.activation == agent.critic.activation == "tanh"
    for net, out_gain in ((agent.actor, 0.01), (agent.critic, 1.0)):
        for i in range(3):
            w, b = net.layer(i)
            gain = out_gain if i == 2 else math.sqrt(2)
            gram = w @ w.T if w.shape[0] <= w.shape[1] else w.T @ w
            np.testing.assert_allclose(gram, gain ** 2 * np.eye(min(w.shape)), atol=1e-5 * gain ** 2)
            assert not b.any()
    # the nets see the flat arrays: actor first, critic after
    assert np.shares_memory(agent.actor.params, agent.params)
    assert np.shares_memory(agent.critic.grad, agent.grad)
    np.testing.assert_array_equal(agent.params[:agent.split], agent.actor.params)
    np.testing.assert_array_equal(agent.params[agent.split:], agent.critic.params)
    np.testing.assert_array_equal(PPO(4, 3, seed=0).params, agent.params)
    assert not np.array_equal(PPO(4, 3, seed=1).params, agent.params)
    # actor and critic do not share their hidden weights
    assert not np.array_equal(agent.actor.layer(1)[0], agent.critic.layer(1)[0])


def test_mlp_rejects_bad_activation():
    with pytest.raises(ValueError, match="activation"):
        MLP((4, 2), activation="sigmoid")


# -- tanh forward and backward -------------------------------------------------------------------


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("sizes", TANH_ARCHS, ids=arch_id)
def test_tanh_forward_matches_reference(sizes, batch):
    net = tanh_net(sizes, batch)
    x = np.random.default_rng(batch).standard_normal((batch, sizes[0])).astype(np.float32)
    ref = naive.tanh_mlp_forward_naive(*wb(sizes, net.params), x)[-1]
    mag = magnitude(sizes, net.params, x)
    for layout in LAYOUTS:
        out = net.forward(as_layout(x, layout))
        assert out.shape == (batch, sizes[-1]) and out.dtype == np.float32
        close32(out, ref, mag)
    np.testing.assert_array_equal(net.argmax(x), np.argmax(net.forward(x), axis=1))
    net64 = tanh_net(sizes, batch, "float64")
    ref64 = naive.tanh_mlp_forward_naive(*wb(sizes, net64.params), x)[-1]
    np.testing.assert_allclose(net64.forward(x.astype(np.float64)), ref64, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("sizes", TANH_ARCHS, ids=arch_id)
def test_tanh_backward_matches_reference(sizes, batch):
    rng = np.random.default_rng(batch + 7)
    net = tanh_net(sizes, batch)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    g = rng.standard_normal((batch, sizes[-1])).astype(np.float32)
    ref = flatten(naive.tanh_mlp_backward_naive(*wb(sizes, net.params), x, g))
    # magnitudes: the reference on absolute values (tanh' <= 1 stands in for every derivative)
    w, b = wb(sizes, np.abs(net.params.astype(np.float64)))
    mag = flatten(naive.mlp_backward_naive(w, b, np.abs(x) + 1, np.abs(g)))
    net.forward(as_layout(x, "record"))
    close32(net.backward(x, g), ref, mag + np.abs(ref))
    net64 = tanh_net(sizes, batch, "float64")
    net64.forward(x.astype(np.float64))
    ref64 = flatten(naive.tanh_mlp_backward_naive(*wb(sizes, net64.params), x, g))
    np.testing.assert_allclose(net64.backward(x.astype(np.float64), g.astype(np.float64)), ref64,
                               rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("sizes", [(3, 2), (4, 64, 64, 2), (5, 9, 9, 9, 3)], ids=arch_id)
def test_tanh_gradient_matches_finite_differences(sizes):
    rng = np.random.default_rng(1)
    net = tanh_net(sizes, 1, "float64")
    x = rng.standard_normal((9, sizes[0]))
    r = rng.standard_normal((9, sizes[-1]))
    net.forward(x)
    analytic = net.backward(x, r).copy()
    idx = rng.choice(net.n_params, size=min(net.n_params, 150), replace=False)
    p, h = net.params, 1e-6
    numeric = np.zeros(len(idx))
    for n, k in enumerate(idx):
        old = p[k]
        p[k] = old + h
        up = float(np.sum(net.forward(x) * r))
        p[k] = old - h
        down = float(np.sum(net.forward(x) * r))
        p[k] = old
        numeric[n] = (up - down) / (2 * h)
    np.testing.assert_allclose(analytic[idx], numeric, rtol=1e-6, atol=1e-8 * np.abs(analytic).max())
    assert np.abs(analytic[idx]).max() > 1e-3


# -- the PPO loss: kernel against the reference and finite differences ----------------------------


def minibatch(rng, agent_or_sizes, b, *, spread=0.3, n_actions=2, obs_size=4):
    """A minibatch whose old log-probs and values are near (but not at) the networks': some
    ratios and value changes fall outside the clip range, most inside."""
    obs = rng.standard_normal((b, obs_size)).astype(np.float32)
    return {"obs": obs, "action": rng.integers(0, n_actions, b),
            "log_prob": (np.log(1.0 / n_actions) + rng.normal(0, spread, b)).astype(np.float32),
            "advantage": rng.normal(0.5, 2.0, b).astype(np.float32),
            "return": rng.normal(0, 1.0, b).astype(np.float32),
            "value": rng.normal(0, spread, b).astype(np.float32)}


def kernel_ws(agent_sizes_a, agent_sizes_c, b, dtype):
    a = MLP(agent_sizes_a, activation="tanh", dtype=dtype)
    c = MLP(agent_sizes_c, activation="tanh", dtype=dtype)
    width = max(a.width, c.width)
    return a, c, (np.zeros((agent_sizes_a[0], b), dtype), np.zeros(b * a.n_units, dtype),
                  np.zeros(b * c.n_units, dtype), np.zeros((agent_sizes_a[-1], b), dtype),
                  np.zeros((1, b), dtype), np.zeros(2 * b * width, dtype))


def run_kernel(params, a, c, mb, ws, *, lr=0.0, clip=0.2, ent=0.01, vf=0.5, mgn=-1.0, norm_adv=True,
               clip_vloss=True, step=1):
    """_ppo_kernels.ppo_train on a flat float64/float32 parameter vector; returns (grads, stats,
    m, v, bad) and updates params (not at all when lr is 0)."""
    dtype = params.dtype
    grads, m, v = np.zeros_like(params), np.zeros_like(params), np.zeros_like(params)
    hp = np.array([lr, 0.9, 0.999, 1e-5, clip, ent, vf, mgn, float(norm_adv), float(clip_vloss)])
    cst = np.array([clip, dtype.type(1) - dtype.type(clip), dtype.type(1) + dtype.type(clip)], dtype)
    stats = np.zeros(8)
    f = {k: np.asarray(mb[k], dtype) if k != "action" else mb[k] for k in mb}
    bad = _ppo.ppo_train(params, grads, m, v, a.n_params, a.table, c.table, f["obs"], f["action"],
                         f["log_prob"], f["advantage"], f["return"], f["value"], *ws, hp, cst, step, stats)
    return grads, stats, m, v, bad


def reference_grads(sizes_a, sizes_c, params, mb, split_at, **kw):
    """Loss, stats and flat gradient (actor then critic) by tests/naive.py, float64."""
    wa, ba = wb(sizes_a, params[:split_at])
    wc, bc = wb(sizes_c, params[split_at:])
    logits = naive.tanh_mlp_forward_naive(wa, ba, mb["obs"])[-1]
    values = naive.tanh_mlp_forward_naive(wc, bc, mb["obs"])[-1][:, 0]
    loss, stats, dl, dv = naive.ppo_loss_naive(logits, values, mb["action"], mb["log_prob"],
                                               mb["advantage"], mb["return"], mb["value"], **kw)
    ga = flatten(naive.tanh_mlp_backward_naive(wa, ba, mb["obs"], dl))
    gc = flatten(naive.tanh_mlp_backward_naive(wc, bc, mb["obs"], dv[:, None]))
    return loss, stats, np.concatenate([ga, gc])


LOSS_CASES = [dict(), dict(norm_adv=False), dict(clip_vloss=False), dict(clip_coef=0.05, ent_coef=0.2, vf_coef=1.3),
              dict(norm_adv=False, clip_vloss=False, ent_coef=0.0)]


def flat_params(sizes_a, sizes_c, seed, dtype):
    a, c = tanh_net(sizes_a, seed, dtype), tanh_net(sizes_c, seed + 1, dtype)
    return np.concatenate([a.params, c.params]), a.n_params


@pytest.mark.parametrize("case", range(len(LOSS_CASES)))
@pytest.mark.parametrize("b", [2, 5, 128])
@pytest.mark.parametrize("n_actions", [2, 3])
def test_ppo_kernel_matches_reference_float64(case, b, n_actions):
    kw = LOSS_CASES[case]
    sizes_a, sizes_c = (4, 16, 9, n_actions), (4, 16, 9, 1)
    rng = np.random.default_rng(b * 10 + case)
    params, split_at = flat_params(sizes_a, sizes_c, b, "float64")
    mb = minibatch(rng, None, b, n_actions=n_actions)
    a, c, ws = kernel_ws(sizes_a, sizes_c, b, "float64")
    p0 = params.copy()
    kkw = dict(clip=kw.get("clip_coef", 0.2), ent=kw.get("ent_coef", 0.01), vf=kw.get("vf_coef", 0.5),
               norm_adv=kw.get("norm_adv", True), clip_vloss=kw.get("clip_vloss", True))
    grads, stats, *_ , bad = run_kernel(params, a, c, mb, ws, **kkw)
    assert bad == -1
    np.testing.assert_array_equal(params, p0)  # lr 0
    loss, ref_stats, ref_grads = reference_grads(sizes_a, sizes_c, p0, mb, split_at, **kw)
    assert stats[0] == pytest.approx(loss, rel=1e-10, abs=1e-12)
    for i, name in enumerate(("pg_loss", "v_loss", "entropy", "old_approx_kl", "approx_kl", "clipfrac")):
        assert stats[i + 1] == pytest.approx(ref_stats[name], rel=1e-10, abs=1e-12), name
    np.testing.assert_allclose(grads, ref_grads, rtol=1e-9, atol=1e-12 * np.abs(ref_grads).max())
    assert stats[7] == pytest.approx(np.linalg.norm(ref_grads), rel=1e-10)
    if b == 128:
        # the data exercises every branch: clipped ratios and values, both signs of advantage
        assert 0 < ref_stats["clipfrac"] < 1


@pytest.mark.parametrize("case", range(len(LOSS_CASES)))
def test_ppo_gradient_matches_finite_differences(case):
    kw = LOSS_CASES[case]
    kkw = dict(clip=kw.get("clip_coef", 0.2), ent=kw.get("ent_coef", 0.01), vf=kw.get("vf_coef", 0.5),
               norm_adv=kw.get("norm_adv", True), clip_vloss=kw.get("clip_vloss", True))
    sizes_a, sizes_c = (4, 16, 9, 3), (4, 16, 9, 1)
    rng = np.random.default_rng(case)
    params, _ = flat_params(sizes_a, sizes_c, 5, "float64")
    b = 24
    mb = minibatch(rng, None, b, n_actions=3)
    a, c, ws = kernel_ws(sizes_a, sizes_c, b, "float64")
    analytic, stats, *_ = run_kernel(params, a, c, mb, ws, **kkw)
    assert 0 < stats[6]  # some ratios clipped
    idx = rng.choice(len(params), size=200, replace=False)
    h = 1e-6
    numeric = np.zeros(len(idx))
    for n, k in enumerate(idx):
        old = params[k]
        params[k] = old + h
        up = run_kernel(params, a, c, mb, ws, **kkw)[1][0]
        params[k] = old - h
        down = run_kernel(params, a, c, mb, ws, **kkw)[1][0]
        params[k] = old
        numeric[n] = (up - down) / (2 * h)
    np.testing.assert_allclose(analytic[idx], numeric, rtol=1e-5, atol=1e-7 * np.abs(analytic).max())
    assert np.abs(analytic[idx]).max() > 1e-3


def test_grad_norm_clip_matches_reference():
    sizes_a, sizes_c = (4, 16, 9, 2), (4, 16, 9, 1)
    rng = np.random.default_rng(3)
    params, split_at = flat_params(sizes_a, sizes_c, 3, "float64")
    mb = minibatch(rng, None, 32)
    a, c, ws = kernel_ws(sizes_a, sizes_c, 32, "float64")
    raw = run_kernel(params, a, c, mb, ws)[0]
    norm = np.linalg.norm(raw)
    for max_norm in (norm / 10, norm * 0.999, norm * 10):
        grads, stats, *_ = run_kernel(params, a, c, mb, ws, mgn=max_norm)
        ref, ref_norm = naive.clip_grad_norm_naive(raw, max_norm)
        np.testing.assert_allclose(grads, ref, rtol=1e-12, atol=1e-15)
        assert stats[7] == pytest.approx(ref_norm, rel=1e-12)
    # clamped at 1: a norm below max_norm leaves the gradient as it is
    np.testing.assert_array_equal(run_kernel(params, a, c, mb, ws, mgn=norm * 10)[0], raw)


def test_clipfrac_counts_ratios_strictly_outside_the_clip_range():
    """CleanRL's ``((ratio - 1).abs() > clip_coef)``: a ratio of exactly 1 with clip_coef 0 (the
    first update of an epoch with a zero clip range) is not clipped. A zero actor gives logits of
    exactly 0, so the old log-prob -log(n) makes every ratio exactly 1 in float64."""
    sizes_a, sizes_c = (4, 16, 9, 3), (4, 16, 9, 1)
    rng = np.random.default_rng(4)
    params, split_at = flat_params(sizes_a, sizes_c, 4, "float64")
    params[:split_at] = 0.0
    mb = minibatch(rng, None, 16, n_actions=3)
    mb["log_prob"] = np.full(16, -math.log(3.0))
    a, c, ws = kernel_ws(sizes_a, sizes_c, 16, "float64")
    for clip in (0.0, 0.2):
        stats = run_kernel(params, a, c, mb, ws, clip=clip)[1]
        _, ref_stats, _ = reference_grads(sizes_a, sizes_c, params, mb, split_at, clip_coef=clip)
        assert stats[6] == ref_stats["clipfrac"] == 0.0
        assert stats[5] == 0.0 and stats[4] == 0.0  # approx_kl, old_approx_kl of ratio 1


def test_ppo_kernel_adam_step_float64():
    sizes_a, sizes_c = (4, 16, 9, 2), (4, 16, 9, 1)
    rng = np.random.default_rng(4)
    params, split_at = flat_params(sizes_a, sizes_c, 4, "float64")
    p0 = params.copy()
    mb = minibatch(rng, None, 32)
    a, c, ws = kernel_ws(sizes_a, sizes_c, 32, "float64")
    grads, *_ = run_kernel(params, a, c, mb, ws, lr=1e-3, mgn=0.5)
    _, _, ref_grads = reference_grads(sizes_a, sizes_c, p0, mb, split_at)
    clipped, _ = naive.clip_grad_norm_naive(ref_grads, 0.5)
    ref_p, _, _ = naive.adam_naive(p0, [clipped], 1e-3, eps=1e-5)
    np.testing.assert_allclose(params, ref_p, rtol=1e-10, atol=1e-13)


# -- PPO.train (float32) against the reference ---------------------------------------------------


@pytest.mark.parametrize("b", [2, 7, 128])
def test_train_matches_reference(b):
    agent = PPO(4, 2, seed=b, lr=1e-3)
    rng = np.random.default_rng(b)
    mb = minibatch(rng, agent, b)
    p0 = agent.params.astype(np.float64)
    loss = agent.train(mb)
    ref_loss, ref_stats, ref_grads = reference_grads(agent.actor.sizes, agent.critic.sizes, p0, mb, agent.split)
    assert loss == pytest.approx(ref_loss, rel=1e-4, abs=1e-6)
    for k, v in ref_stats.items():
        assert agent.stats[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    clipped, norm = naive.clip_grad_norm_naive(ref_grads, 0.5)
    assert agent.stats["grad_norm"] == pytest.approx(norm, rel=1e-4)
    np.testing.assert_allclose(agent.grad, clipped, rtol=1e-3, atol=1e-5 * np.abs(clipped).max())
    ref_p, _, _ = naive.adam_naive(p0, [clipped], 1e-3, eps=1e-5)
    np.testing.assert_allclose(agent.params, ref_p, rtol=1e-6, atol=0.05 * 1e-3)


def test_train_without_grad_norm_clip_matches_reference():
    """max_grad_norm=None: the raw gradient goes to Adam (CleanRL without the clip)."""
    agent = PPO(4, 2, seed=3, lr=1e-3, max_grad_norm=None)
    rng = np.random.default_rng(3)
    mb = minibatch(rng, agent, 64)
    mb["return"] = (mb["return"] * 10).astype(np.float32)  # a norm above CleanRL's 0.5
    p0 = agent.params.astype(np.float64)
    agent.train(mb)
    _, _, ref_grads = reference_grads(agent.actor.sizes, agent.critic.sizes, p0, mb, agent.split)
    assert np.linalg.norm(ref_grads) > 0.5
    assert agent.stats["grad_norm"] == pytest.approx(np.linalg.norm(ref_grads), rel=1e-4)
    np.testing.assert_allclose(agent.grad, ref_grads, rtol=1e-3, atol=1e-5 * np.abs(ref_grads).max())
    ref_p, _, _ = naive.adam_naive(p0, [ref_grads], 1e-3, eps=1e-5)
    np.testing.assert_allclose(agent.params, ref_p, rtol=1e-6, atol=0.05 * 1e-3)


def test_train_fields_in_records_equal_contiguous():
    """A minibatch of record-array views (what an AoS rollout buffer gives) trains exactly as
    its contiguous copy."""
    rng = np.random.default_rng(0)
    mb = minibatch(rng, None, 64)
    rec = np.zeros(64, dtype=[("obs", "f4", (4,)), ("action", "i8"), ("log_prob", "f4"), ("advantage", "f4"),
                              ("return", "f4"), ("value", "f4"), ("reward", "f4")])
    for k, v in mb.items():
        rec[k] = v
    views = Batch({k: rec[k] for k in mb}, np.arange(64))
    a1, a2 = PPO(4, 2, seed=1), PPO(4, 2, seed=1)
    for _ in range(3):
        assert a1.train(mb) == a2.train(views)
    np.testing.assert_array_equal(a1.params, a2.params)
    assert a1.stats == a2.stats
    a3 = PPO(4, 2, seed=1)
    a3.train({**mb, "action": mb["action"].astype(np.int32)})  # any int dtype
    a4 = PPO(4, 2, seed=1)
    a4.train(mb)
    np.testing.assert_array_equal(a3.params, a4.params)


# -- against torch (CleanRL's ppo.py update) ------------------------------------------------------


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    return torch


def torch_seq(torch, net):
    layers = []
    for i, (w, b) in enumerate(split(net.sizes, net.params)):
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w.copy()))
            lin.bias.copy_(torch.from_numpy(b.copy()))
        layers.append(lin)
        if i < len(net.sizes) - 2:
            layers.append(torch.nn.Tanh())
    return torch.nn.Sequential(*layers)


class TorchCleanRL:
    """CleanRL ppo.py's Agent and the body of its minibatch loop, as written there."""

    def __init__(self, torch, agent: PPO):
        self.torch = torch
        self.actor, self.critic = torch_seq(torch, agent.actor), torch_seq(torch, agent.critic)
        # CleanRL's Agent defines the critic first: agent.parameters() is critic then actor
        self.parameters = list(self.critic.parameters()) + list(self.actor.parameters())
        self.optimizer = torch.optim.Adam(self.parameters, lr=agent.lr, eps=1e-5)
        self.clip_coef, self.ent_coef, self.vf_coef = agent.clip_coef, agent.ent_coef, agent.vf_coef
        self.max_grad_norm, self.norm_adv, self.clip_vloss = agent.max_grad_norm, agent.norm_adv, agent.clip_vloss

    def flat(self, grad=False):
        """Actor then critic, weight then bias per layer (tfdata's order)."""
        out = []
        for seq in (self.actor, self.critic):
            for m in seq:
                if isinstance(m, self.torch.nn.Linear):
                    for t in (m.weight, m.bias):
                        out.append((t.grad if grad else t).detach().numpy().ravel())
        return np.concatenate(out).astype(np.float64)

    def step(self, mb, lr):
        torch = self.torch
        from torch.distributions.categorical import Categorical
        self.optimizer.param_groups[0]["lr"] = lr
        t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in mb.items()}
        logits = self.actor(t["obs"])
        probs = Categorical(logits=logits)
        newlogprob = probs.log_prob(t["action"].long())
        entropy = probs.entropy()
        newvalue = self.critic(t["obs"])
        logratio = newlogprob - t["log_prob"]
        ratio = logratio.exp()
        with torch.no_grad():
            old_approx_kl = (-logratio).mean()
            approx_kl = ((ratio - 1) - logratio).mean()
            clipfrac = ((ratio - 1.0).abs() > self.clip_coef).float().mean().item()
        mb_advantages = t["advantage"]
        if self.norm_adv:
            mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
        pg_loss1 = -mb_advantages * ratio
        pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - self.clip_coef, 1 + self.clip_coef)
        pg_loss = torch.max(pg_loss1, pg_loss2).mean()
        newvalue = newvalue.view(-1)
        if self.clip_vloss:
            v_loss_unclipped = (newvalue - t["return"]) ** 2
            v_clipped = t["value"] + torch.clamp(newvalue - t["value"], -self.clip_coef, self.clip_coef)
            v_loss_clipped = (v_clipped - t["return"]) ** 2
            v_loss_max = torch.max(v_loss_unclipped, v_loss_clipped)
            v_loss = 0.5 * v_loss_max.mean()
        else:
            v_loss = 0.5 * ((newvalue - t["return"]) ** 2).mean()
        entropy_loss = entropy.mean()
        loss = pg_loss - self.ent_coef * entropy_loss + v_loss * self.vf_coef
        self.optimizer.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.parameters, self.max_grad_norm)
        grads = self.flat(grad=True)
        self.optimizer.step()
        stats = {"pg_loss": pg_loss.item(), "v_loss": v_loss.item(), "entropy": entropy_loss.item(),
                 "old_approx_kl": old_approx_kl.item(), "approx_kl": approx_kl.item(), "clipfrac": clipfrac,
                 "grad_norm": norm.item()}
        return loss.item(), stats, grads


@pytest.mark.parametrize("settings", [dict(), dict(norm_adv=False, clip_vloss=False),
                                      dict(ent_coef=0.1, clip_coef=0.1, max_grad_norm=5.0),
                                      dict(n_actions=4, obs_size=8, hidden=(32, 48))],
                         ids=["cleanrl", "plain", "coefs", "shape"])
def test_train_matches_cleanrl_in_torch(torch, settings):
    settings = dict(settings)
    n_actions, obs_size = settings.pop("n_actions", 2), settings.pop("obs_size", 4)
    agent = PPO(obs_size, n_actions, seed=7, lr=2.5e-4, **settings)
    ref = TorchCleanRL(torch, agent)
    np.testing.assert_array_equal(ref.flat(), agent.params)
    rng = np.random.default_rng(11)
    lrs = [2.5e-4, 2.5e-4, 1e-3, 1e-3, 2e-4, 3e-3, 0.0, 1e-3]
    saw_clip = saw_big = False
    for step, lr in enumerate(lrs):
        mb = minibatch(rng, agent, 128, spread=0.4, n_actions=n_actions, obs_size=obs_size)
        # old log-probs and values near the current networks' (as in a real rollout), but off
        lp, val = agent.log_prob(mb["obs"], mb["action"])
        mb["log_prob"] = (lp + rng.normal(0, 0.15, 128)).astype(np.float32)
        mb["value"] = (val + rng.normal(0, 0.3, 128)).astype(np.float32)
        mb["return"] = (mb["return"] * 3).astype(np.float32)  # big value errors: the grad norm gets clipped
        agent.lr = lr
        loss = agent.train(mb)
        loss_t, stats_t, grads_t = ref.step(mb, lr)
        assert loss == pytest.approx(loss_t, rel=1e-4, abs=1e-6), step
        for k, v in stats_t.items():
            assert agent.stats[k] == pytest.approx(v, rel=1e-4, abs=2e-6), (step, k)
        np.testing.assert_allclose(agent.grad, grads_t, rtol=1e-3, atol=1e-5 * np.abs(grads_t).max())
        # Adam moves each parameter by about lr: a small fraction of it
        np.testing.assert_allclose(agent.params, ref.flat(), rtol=1e-5, atol=0.02 * max(lrs))
        saw_clip |= 0 < stats_t["clipfrac"]
        saw_big |= stats_t["grad_norm"] > (agent.max_grad_norm or np.inf)
    assert saw_clip
    if settings.get("max_grad_norm") is None:
        assert saw_big  # the grad-norm clip was exercised
    assert agent.optim.t == len(lrs)


def test_act_log_prob_and_value_match_torch(torch):
    agent = PPO(4, 3, seed=2)
    agent.actor.reset_orthogonal(5, out_gain=1.0)  # logits far from uniform
    ref = TorchCleanRL(torch, agent)
    obs = np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32)
    actions, log_probs, values = agent.act(obs)
    with torch.no_grad():
        dist = torch.distributions.Categorical(logits=ref.actor(torch.from_numpy(obs)))
        lp_t = dist.log_prob(torch.from_numpy(actions)).numpy()
        v_t = ref.critic(torch.from_numpy(obs)).numpy()[:, 0]
    np.testing.assert_allclose(log_probs, lp_t, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(values, v_t, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(agent.value(obs), v_t, rtol=1e-5, atol=1e-6)


# -- act and value --------------------------------------------------------------------------------


@pytest.mark.parametrize("e", [1, 3, 4, 5, 9, 64])
def test_act_matches_reference(e):
    agent = PPO(5, 3, seed=e)
    agent.actor.reset_orthogonal(e, out_gain=2.0)  # confident, unequal probabilities
    rng = np.random.default_rng(e)
    agent.params[...] += rng.normal(0, 0.1, agent.params.size)  # nonzero biases
    obs = rng.standard_normal((e, 5)).astype(np.float32)
    logits = naive.tanh_mlp_forward_naive(*wb(agent.actor.sizes, agent.actor.params), obs)[-1]
    values = naive.tanh_mlp_forward_naive(*wb(agent.critic.sizes, agent.critic.params), obs)[-1][:, 0]
    key, ctr = int(agent._rng[0]), int(agent._rng[1])
    for layout in LAYOUTS:
        ref_actions, ctr = naive.categorical_sample_naive(key, ctr, logits)
        actions, log_probs, vals = agent.act(as_layout(obs, layout))
        assert actions.dtype == np.int64 and log_probs.dtype == vals.dtype == np.float32
        assert actions.shape == log_probs.shape == vals.shape == (e,)
        np.testing.assert_array_equal(actions, ref_actions)
        assert int(agent._rng[1]) == ctr
        logp, _ = naive.categorical_naive(logits)
        np.testing.assert_allclose(log_probs, logp[np.arange(e), actions], rtol=1e-5, atol=2e-6)
        np.testing.assert_allclose(vals, values, rtol=1e-5, atol=2e-6)
        np.testing.assert_allclose(agent.value(obs), values, rtol=1e-5, atol=2e-6)


def test_act_samples_the_softmax():
    """Frequencies of 60,000 draws from one fixed distribution against its probabilities
    (chi-square, fixed seed: deterministic)."""
    agent = PPO(2, 4, seed=0)
    w, b = agent.actor.layer(2)
    w[...] = 0.0
    probs = np.array([0.1, 0.2, 0.3, 0.4])
    b[...] = np.log(probs) + 0.7  # a shift changes nothing
    obs = np.random.default_rng(0).standard_normal((500, 2)).astype(np.float32)
    counts = np.zeros(4)
    for _ in range(120):
        actions, log_probs, _ = agent.act(obs)
        counts += np.bincount(actions, minlength=4)
        np.testing.assert_allclose(log_probs, np.log(probs)[actions], rtol=1e-6)
    expected = probs * counts.sum()
    chi2 = float(np.sum((counts - expected) ** 2 / expected))
    assert chi2 < 16.27, (chi2, counts)  # p = 0.001 for 3 degrees of freedom
    # deterministic given the seed, different across seeds
    a1, a2, a3 = PPO(4, 2, seed=3), PPO(4, 2, seed=3), PPO(4, 2, seed=4)
    a3.params[...] = a1.params
    o = np.zeros((64, 4), np.float32)
    s1 = [a1.act(o)[0].copy() for _ in range(3)]
    s2 = [a2.act(o)[0].copy() for _ in range(3)]
    s3 = [a3.act(o)[0].copy() for _ in range(3)]
    np.testing.assert_array_equal(s1, s2)
    assert not np.array_equal(s1, s3)
    assert not np.array_equal(s1[0], s1[1])


def test_act_never_draws_a_zero_probability_action():
    agent = PPO(2, 3, seed=0)
    w, b = agent.actor.layer(2)
    w[...] = 0.0
    b[...] = (0.0, -200.0, 0.0)  # exp underflows to exactly 0 in float32 and float64
    actions = np.concatenate([agent.act(np.zeros((256, 2), np.float32))[0] for _ in range(20)])
    assert set(actions.tolist()) == {0, 2}


def test_act_returns_views_and_uses_its_own_rng():
    agent = PPO(4, 2, seed=0)
    obs = np.zeros((4, 4), np.float32)
    state = np.random.get_state()
    out1 = agent.act(obs)
    out2 = agent.act(obs)
    assert all(x is y for x, y in zip(out1, out2))
    assert np.random.get_state()[1].tolist() == state[1].tolist()  # numpy's global RNG untouched
    assert agent.value(obs) is agent.value(obs)
    # value() (a bootstrap value between act and storing its output) leaves act's values alone
    values = out1[2].copy()
    agent.value(np.ones((4, 4), np.float32))
    np.testing.assert_array_equal(out1[2], values)


def test_log_prob_matches_act():
    agent = PPO(4, 3, seed=0)
    obs = np.random.default_rng(0).standard_normal((9, 4)).astype(np.float32)
    actions, log_probs, values = (a.copy() for a in agent.act(obs))
    lp, v = agent.log_prob(obs, actions)
    np.testing.assert_array_equal(lp, log_probs)
    np.testing.assert_array_equal(v, values)
    with pytest.raises(ValueError, match="actions"):
        agent.log_prob(obs, np.full(9, 3))


# -- learning -------------------------------------------------------------------------------------


def test_ppo_learns_a_bandit():
    """Obs sign decides which of 2 actions pays: the greedy probability of the right action rises."""
    agent = PPO(1, 2, seed=0, lr=3e-3)
    rng = np.random.default_rng(0)
    for _ in range(200):
        obs = rng.choice([-1.0, 1.0], size=(64, 1)).astype(np.float32)
        actions, log_probs, values = (a.copy() for a in agent.act(obs))
        reward = ((actions == 1) == (obs[:, 0] > 0)).astype(np.float32)
        agent.train({"obs": obs, "action": actions, "log_prob": log_probs, "advantage": reward - values,
                     "return": reward, "value": values})
    obs = np.array([[-1.0], [1.0]], np.float32)
    lp, _ = agent.log_prob(obs, np.array([0, 1]))
    assert np.exp(lp).min() > 0.9


# -- allocation, state, bad input -----------------------------------------------------------------


def test_no_allocation_after_the_first_call():
    agent = PPO(4, 2, seed=0)
    rng = np.random.default_rng(0)
    mb = minibatch(rng, agent, 512)
    obs = mb["obs"][:4].copy()
    agent.train(mb)
    agent.act(obs)
    agent.value(obs)
    nbytes = agent.nbytes
    ptrs = [a.__array_interface__["data"][0] for a in (agent.params, agent.grad, agent.optim.m)]
    agent.lr = 1e-4
    tracemalloc.start()
    try:
        for i in range(50):
            agent.lr = 2.5e-4 * (1 - i / 50)
            agent.train(mb)
            agent.act(obs)
            agent.value(obs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2048, peak  # not even one (512,) float32 array
    assert agent.nbytes == nbytes
    assert [a.__array_interface__["data"][0] for a in (agent.params, agent.grad, agent.optim.m)] == ptrs
    assert agent.actor.params.base is agent.params or np.shares_memory(agent.actor.params, agent.params)


def test_nbytes_counts_workspaces():
    agent = PPO(4, 2, seed=0)
    n0 = agent.nbytes
    assert n0 >= 4 * 4 * agent.params.size
    agent.train(minibatch(np.random.default_rng(0), agent, 128))
    n1 = agent.nbytes
    assert n1 > n0 + 128 * 4 * (64 * 2 * 2)  # layer outputs of both nets at least
    agent.act(np.zeros((4, 4), np.float32))
    # act's workspace for 4 observations: both networks' layer outputs, the actions (int64),
    # log-probs and values (float32), and value()'s own output (float32)
    assert agent.nbytes == n1 + 4 * 4 * (agent.actor.n_units + agent.critic.n_units) + 4 * (8 + 4 + 4 + 4)


def state_equal(s1, s2):
    assert s1.keys() == s2.keys()
    for k in s1:
        if isinstance(s1[k], dict):
            state_equal(s1[k], s2[k])
        elif isinstance(s1[k], np.ndarray):
            np.testing.assert_array_equal(s1[k], s2[k])
        else:
            assert s1[k] == s2[k], k


def test_state_dict_round_trip_continues_exactly():
    rng = np.random.default_rng(0)
    mbs = [minibatch(rng, None, 64) for _ in range(4)]
    obs = mbs[0]["obs"][:4].copy()
    a = PPO(4, 2, seed=0, ent_coef=0.02, clip_vloss=False)
    a.train(mbs[0])
    a.act(obs)
    a.lr = 1e-3
    state = a.state_dict()
    b = PPO(4, 2, seed=9)
    b.load_state_dict(state)
    state_equal(b.state_dict(), state)
    assert b.clip_vloss is False and b.ent_coef == 0.02 and b.lr == 1e-3
    for mb in mbs[1:]:
        assert a.train(mb) == b.train(mb)
        np.testing.assert_array_equal(a.act(obs)[0], b.act(obs)[0])
    np.testing.assert_array_equal(a.params, b.params)
    np.testing.assert_array_equal(a.optim.v, b.optim.v)
    assert a.state_dict()["optim"]["t"] == 4
    # the state is a copy
    state["params"][:] = 0
    assert a.params.any()


@pytest.mark.parametrize("field, value, match", [
    ("params", np.zeros(3, np.float32), "params"),
    ("params", "nan", "params"),
    ("obs_size", 5, "obs_size"),
    ("n_actions", 3, "n_actions"),
    ("hidden", [64, 32], "hidden"),
    ("hidden", 64, "hidden"),
    ("clip_coef", -0.1, "clip_coef"),
    ("ent_coef", float("nan"), "ent_coef"),
    ("max_grad_norm", 0.0, "max_grad_norm"),
    ("norm_adv", "yes", "norm_adv"),
    ("rng", [1, -1], "rng"),
    ("rng", [1], "rng"),
    ("optim.m", np.zeros(5), "optim.m"),
    ("optim.v", "neg", "optim.v"),
    ("optim.t", -1, "optim.t"),
    ("optim.lr", float("inf"), "optim.lr"),
    ("optim.betas", [0.9, 1.0], "optim.betas"),
    ("missing", None, "missing field 'rng'"),
    # accepted before, and every later train() made the parameters inf or failed naming nothing
    ("optim.lr", 1e308, r"state\['optim.lr'\]: expected a finite float in \[0.0, 1000.0\], got 1e\+308"),
    ("optim.lr", 1e4, r"state\['optim.lr'\]: .* got 10000.0"),
    ("optim.eps", float("inf"), r"state\['optim.eps'\]: expected a finite float >= 1.17\d*e-38, got inf"),
    ("optim.eps", 1e-300, r"state\['optim.eps'\]: .* got 1e-300"),
    ("optim.t", 2 ** 70, rf"state\['optim.t'\]: expected an int in \[0, {2 ** 62}\], got {2 ** 70}"),
    ("optim.t", 2 ** 63 - 1, rf"state\['optim.t'\]: .* got {2 ** 63 - 1}"),
    ("optim.m", lambda m: np.full(m.shape, 1e39), r"state\['optim.m'\]: .* got 1e\+39 at index 0"),
    ("params", lambda p: np.full(p.shape, -1e39), r"state\['params'\]: .* got -1e\+39 at index 0"),
    ("clip_coef", 1e39, r"state\['clip_coef'\]: expected a finite float in \[0.0, 3.40\d*e\+38\], got 1e\+39"),
    ("max_grad_norm", float("inf"), r"state\['max_grad_norm'\]: expected a finite float in \(0.0, 3.40\d*e\+38\], got inf"),
    ("obs_size", np.array([4, 4]), r"state\['obs_size'\]: expected 4"),
    ("hidden", [64.0, 64.0], r"state\['hidden'\]: expected \[64, 64\]"),
    ("rng", [True, 0], r"state\['rng'\]"),
    ("optim", [1, 2], r"state\['optim'\]: expected a mapping, got list"),
])
def test_load_state_dict_rejects_bad_state_and_changes_nothing(field, value, match):
    a = PPO(4, 2, seed=0)
    a.train(minibatch(np.random.default_rng(0), a, 32))
    state = a.state_dict()
    good = a.state_dict()
    if callable(value):  # of the good value: a float64 array beyond float32's range
        outer, _, inner = field.partition(".")
        holder = state[outer] if inner else state
        holder[inner or outer] = value(holder[inner or outer])
    elif field == "missing":
        del state["rng"]
    elif field.startswith("optim."):
        key = field.split(".")[1]
        state["optim"][key] = -state["optim"]["v"] - 1 if isinstance(value, str) else value
    elif isinstance(value, str) and value == "nan":
        state[field][3] = np.nan
    else:
        state[field] = value
    before = a.state_dict()
    with pytest.raises(ValueError, match=match):
        a.load_state_dict(state)
    state_equal(a.state_dict(), before)
    a.load_state_dict(good)


def test_train_rejects_bad_minibatch_and_changes_nothing():
    agent = PPO(4, 3, seed=0)
    rng = np.random.default_rng(0)
    good = minibatch(rng, agent, 16, n_actions=3)
    agent.train(good)
    state = agent.state_dict()
    stats = agent.stats
    grad = agent.grad.copy()
    cases = [
        ({"obs": good["obs"].astype(np.float64)}, "'obs'.*float32"),
        ({"obs": good["obs"][:, :3]}, "'obs'"),
        ({"obs": good["obs"][0]}, "'obs'"),
        ({"action": good["action"][:15]}, "'action'"),
        ({"action": good["action"].astype(np.float32)}, "'action'"),
        ({"action": np.where(np.arange(16) == 5, 3, good["action"])}, r"'action'.*\[0, 3\).*got 3 at row 5"),
        ({"action": np.where(np.arange(16) == 9, -1, good["action"])}, "got -1 at row 9"),
        ({"log_prob": good["log_prob"].astype(np.float64)}, "'log_prob'"),
        ({"advantage": good["advantage"][:8]}, "'advantage'"),
        ({"return": good["return"].reshape(16, 1)}, "'return'"),
        ({"value": list(good["value"])}, "'value'"),
    ]
    for change, match in cases:
        with pytest.raises(ValueError, match=match):
            agent.train({**good, **change})
    with pytest.raises(KeyError, match="'advantage'"):
        agent.train({k: v for k, v in good.items() if k != "advantage"})
    with pytest.raises(ValueError, match="B >= 2"):
        agent.train({k: v[:1] for k, v in good.items()})
    state_equal(agent.state_dict(), state)
    assert agent.stats == stats
    np.testing.assert_array_equal(agent.grad, grad)
    no_norm = PPO(4, 3, seed=0, norm_adv=False)
    no_norm.train({k: v[:1] for k, v in good.items()})  # one row is fine without normalisation


def test_act_and_value_reject_bad_obs():
    agent = PPO(4, 2, seed=0)
    rng_before = agent._rng.copy()
    for bad in (np.zeros((4, 4)), np.zeros(4, np.float32), np.zeros((4, 5), np.float32),
                np.zeros((0, 4), np.float32), [[0.0] * 4]):
        with pytest.raises(ValueError, match="obs"):
            agent.act(bad)
        with pytest.raises(ValueError, match="obs"):
            agent.value(bad)
    np.testing.assert_array_equal(agent._rng, rng_before)


@pytest.mark.parametrize("kw, match", [
    (dict(obs_size=0), "obs_size"), (dict(n_actions=1), "n_actions"), (dict(n_actions=True), "n_actions"),
    (dict(hidden=()), "hidden"), (dict(clip_coef=-1.0), "clip_coef"), (dict(max_grad_norm=0.0), "max_grad_norm"),
    (dict(lr=-1.0), "lr"), (dict(eps=0.0), "eps"), (dict(vf_coef=float("nan")), "vf_coef"),
    # accepted before: one train() then left every parameter inf (lr) or did nothing (eps)
    (dict(lr=float("inf")), r"^lr must be finite and in \(0.0, 1000.0\], got inf$"),
    (dict(lr=1e308), r"^lr must be finite and in \(0.0, 1000.0\], got 1e\+308$"),
    (dict(lr=1e4), r"^lr must be finite and in \(0.0, 1000.0\], got 10000.0$"),
    (dict(eps=float("inf")), r"^eps must be finite and >= 1.17\d*e-38, got inf$"),
    (dict(eps=1e-300), r"^eps must be finite and >= 1.17\d*e-38, got 1e-300$"),
    (dict(betas=(0.9, 1.0)), r"^betas must be two floats in \[0, 1\), got \(0.9, 1.0\)$"),
    (dict(betas=(0.9,)), r"^betas must be two floats in \[0, 1\), got \(0.9,\)$"),
    (dict(clip_coef=1e39), r"^clip_coef must be finite and in \[0.0, 3.40\d*e\+38\], got 1e\+39$"),
    (dict(ent_coef=float("inf")), r"^ent_coef must be finite and in \[0.0, 3.40\d*e\+38\], got inf$"),
    (dict(max_grad_norm=1e39), r"^max_grad_norm must be finite and in \(0.0, 3.40\d*e\+38\], got 1e\+39$"),
    (dict(seed=-1), r"^seed must be in \[0, 18446744073709551615\], got -1$"),
    (dict(seed=2 ** 64), r"^seed must be in \[0, 18446744073709551615\], got 18446744073709551616$"),
    (dict(hidden=64), r"^hidden must be a non-empty sequence of positive ints, got 64$"),
    (dict(hidden=(64, 0)), r"^hidden must be a non-empty sequence of positive ints, got \(64, 0\)$"),
    (dict(hidden=(64.0,)), r"^hidden must be a non-empty sequence of positive ints, got \(64.0,\)$"),
], ids=str)
def test_ppo_rejects_bad_arguments(kw, match):
    args = dict(obs_size=4, n_actions=2)
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        PPO(args.pop("obs_size"), args.pop("n_actions"), **args)


@pytest.mark.parametrize("kw, match", [
    # accepted before: a truthy string or None silently became a flag, a float seed was truncated
    (dict(clip_vloss="no"), "^clip_vloss must be a bool, got str 'no'$"),
    (dict(norm_adv=None), "^norm_adv must be a bool, got NoneType None$"),
    (dict(seed=1.5), "^seed must be an int, got float 1.5$"),
    (dict(lr="1e-3"), "^lr must be a number, got str '1e-3'$"),
    (dict(max_grad_norm="1"), "^max_grad_norm must be a number, got str '1'$"),
    (dict(ent_coef=True), "^ent_coef must be a number, got bool True$"),
], ids=str)
def test_ppo_rejects_arguments_of_the_wrong_type(kw, match):
    with pytest.raises(TypeError, match=match):
        PPO(4, 2, **kw)


def test_ppo_accepts_the_extremes_of_its_ranges():
    f32_max = float(np.finfo(np.float32).max)
    agent = PPO(4, 2, seed=2 ** 64 - 1, lr=1e3, eps=float(np.finfo(np.float32).tiny), clip_coef=f32_max,
                ent_coef=0.0, vf_coef=f32_max, max_grad_norm=f32_max, betas=(0.0, 0.0), hidden=[3])
    assert agent.clip_coef == agent.vf_coef == agent.max_grad_norm == f32_max
    agent.act(np.zeros((2, 4), np.float32))
    # and just past them: refused (clip_coef became an inf float32 clip range)
    past = np.nextafter(f32_max, np.inf)
    for kw in (dict(clip_coef=past), dict(vf_coef=past), dict(max_grad_norm=past), dict(seed=2 ** 64),
               dict(lr=np.nextafter(1e3, np.inf))):
        with pytest.raises(ValueError, match=f"^{next(iter(kw))} must be"):
            PPO(4, 2, **kw)


def test_lr_setter():
    agent = PPO(4, 2, seed=0)
    agent.lr = 1e-3
    assert agent.lr == agent.optim.lr == 1e-3
    # inf and nan were refused before; 1e4 (past the bound) and a string were not
    for bad, exc in ((float("nan"), ValueError), (float("inf"), ValueError), (1e4, ValueError),
                     (-1e-3, ValueError), ("1e-4", TypeError)):
        with pytest.raises(exc, match="^lr must be"):
            agent.lr = bad
    assert agent.lr == 1e-3
    agent.lr = 0.0  # annealed to 0
    assert agent.lr == 0.0


def test_optim_t_at_its_bound_still_trains():
    """The largest step count a state may hold, 2**62: train() steps with t + 1 (an int64 in the
    kernel; the bias corrections' beta ** t is 0), and one more is refused."""
    agent = PPO(4, 2, seed=0)
    mb = minibatch(np.random.default_rng(0), agent, 32)
    state = agent.state_dict()
    state["optim"]["t"] = 2 ** 62
    agent.load_state_dict(state)
    params = agent.params.copy()
    assert math.isfinite(agent.train(mb))
    assert agent.optim.t == 2 ** 62 + 1
    assert np.isfinite(agent.params).all() and not np.array_equal(agent.params, params)
    state["optim"]["t"] = 2 ** 62 + 1
    with pytest.raises(ValueError, match="optim.t"):
        agent.load_state_dict(state)


def test_import_tfdata_nn_ppo_is_public():
    assert tfdata.nn.PPO is PPO and "PPO" in tfdata.nn.__all__


@pytest.mark.parametrize("field", ["obs", "log_prob", "advantage", "return", "value"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_train_refuses_a_non_finite_minibatch(field, bad):
    agent = PPO(4, 2, seed=0)
    good = minibatch(np.random.default_rng(0), agent, 32)
    agent.train(good)
    state, stats = agent.state_dict(), agent.stats
    mb = {k: v.copy() for k, v in good.items()}
    mb[field][(5, 1) if field == "obs" else 5] = bad
    got = re.escape(str(mb["obs"][5].tolist())) if field == "obs" else bad
    with pytest.raises(ValueError, match=rf"\['{field}'\]: expected finite floats, got {got} at row 5"):
        agent.train(mb)
    state_equal(agent.state_dict(), state)
    assert agent.stats == stats
    agent.train(good)  # and it goes on


def test_act_refuses_nan_obs():
    agent = PPO(4, 2, seed=0)
    obs = np.zeros((4, 4), np.float32)
    obs[2, 1] = np.nan
    rng = agent._rng.copy()
    with pytest.raises(ValueError, match="NaN at row 2"):
        agent.act(obs)
    np.testing.assert_array_equal(agent._rng, rng)


def test_value_and_log_prob_refuse_nan_obs_as_act_does():
    """They returned NaN values and log-probabilities (a NaN bootstrap value then spreads
    through GAE into every advantage of its env)."""
    agent = PPO(4, 2, seed=0)
    obs = np.zeros((4, 4), np.float32)
    obs[2, 1] = np.nan
    rng, state = agent._rng.copy(), agent.state_dict()
    row = re.escape(str(obs[2].tolist()))
    with pytest.raises(ValueError, match=rf"^obs: the critic's value is nan at row 2 \(NaN or inf in obs {row} "):
        agent.value(obs)
    with pytest.raises(ValueError, match=rf"^obs: the actor's logits are NaN at row 2 \(NaN in obs {row} "):
        agent.log_prob(obs, np.zeros(4, np.int64))
    np.testing.assert_array_equal(agent._rng, rng)
    state_equal(agent.state_dict(), state)
    obs[2, 1] = 0.0
    assert np.isfinite(agent.value(obs)).all()
    assert np.isfinite(agent.log_prob(obs, np.zeros(4, np.int64))[0]).all()


def test_value_refuses_a_non_finite_value_from_the_parameters():
    agent = PPO(4, 2, seed=0)
    agent.critic.layer(2)[1][0] = np.inf  # the critic's output bias
    with pytest.raises(ValueError, match=r"^obs: the critic's value is inf at row 0 "):
        agent.value(np.zeros((3, 4), np.float32))


def test_log_prob_refuses_nan_logits_from_the_parameters():
    agent = PPO(4, 2, seed=0)
    agent.actor.layer(2)[1][0] = np.nan  # the actor's output bias: every row's logits are NaN
    with pytest.raises(ValueError, match=r"^obs: the actor's logits are NaN at row 0 .*no log-probability"):
        agent.log_prob(np.zeros((3, 4), np.float32), np.zeros(3, np.int64))


def test_train_refuses_non_finite_parameters():
    agent = PPO(4, 2, seed=0)
    good = minibatch(np.random.default_rng(0), agent, 32)
    agent.params[7] = np.nan  # (an inf weight can give finite gradients, as in torch)
    before = agent.state_dict()
    with pytest.raises(ValueError, match="gradient is not finite"):
        agent.train(good)
    state_equal(agent.state_dict(), before)


def test_mlp_state_dict_and_copy_from_check_the_activation():
    relu, tanh = MLP((4, 8, 2), seed=0), MLP((4, 8, 2), seed=1, activation="tanh")
    assert tanh.state_dict()["activation"] == "tanh"
    before = relu.params.copy()
    with pytest.raises(ValueError, match="state\\['activation'\\]: expected 'relu', got 'tanh'"):
        relu.load_state_dict(tanh.state_dict())
    with pytest.raises(ValueError, match="copy_from.*\\(relu\\).*\\(tanh\\)"):
        relu.copy_from(tanh)
    np.testing.assert_array_equal(relu.params, before)
    old = {k: v for k, v in tanh.state_dict().items() if k != "activation"}  # written before tanh
    relu.load_state_dict(old)
    np.testing.assert_array_equal(relu.params, tanh.params)
    t2 = MLP((4, 8, 2), activation="tanh")
    t2.load_state_dict(tanh.state_dict())
    np.testing.assert_array_equal(t2.forward(np.ones((3, 4), np.float32)), tanh.forward(np.ones((3, 4), np.float32)))
    # no sparse-product scratch: parameters and gradient only before any forward
    assert MLP((4, 8, 2), activation="tanh").nbytes == 2 * 4 * relu.n_params < MLP((4, 8, 2)).nbytes
