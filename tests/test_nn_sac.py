"""tfdata.nn.SAC: its kernels against tests/naive.py, its update against CleanRL's torch update
(sac_continuous_action.py) from the same parameters, batch and Gaussian draws, its state as
untrusted input, and no allocation after the first update.

float64 learners are compared with torch float64 to 1e-9 (sums in another order); float32
ones with torch float32 on gradients and losses, within a small multiple of float32 rounding of
the magnitudes involved. Parameters after an Adam step are compared in float64 only: Adam's
first steps move a parameter by about ``lr * sign(gradient)``, so a float32 rounding difference
in a near-zero gradient can move it by ``2 * lr``.
"""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from tfdata.nn import SAC
from tfdata.nn import _sac_kernels as K

from . import naive

OBS, ACT = 5, 3
LOW, HIGH = np.array([-2.0, -1.0, 0.0]), np.array([2.0, 0.5, 3.0])


def batch_of(rng, n, obs_dim=OBS, low=LOW, high=HIGH, dtype=np.float32):
    return {"obs": rng.standard_normal((n, obs_dim)).astype(dtype),
            "next_obs": rng.standard_normal((n, obs_dim)).astype(dtype),
            "action": rng.uniform(low, high, (n, len(low))).astype(dtype),
            "reward": rng.standard_normal(n).astype(dtype),
            "terminated": rng.random(n) < 0.3}


# -- kernels against the naive references ------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_elementwise_kernels(dtype):
    rng = np.random.default_rng(1)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    for relu in (True, False):
        h = rng.standard_normal((7, 5)).astype(dtype)
        h[3, 2] = np.nan  # stays NaN through ReLU, as torch's
        b = rng.standard_normal(5).astype(dtype)
        want = naive.sac_bias_act_naive(h, b, relu)
        K.bias_act(h, b, relu)
        np.testing.assert_allclose(h, want, rtol=tol, atol=tol)
    g = rng.standard_normal((6, 4)).astype(dtype)
    h = np.maximum(rng.standard_normal((6, 4)), 0).astype(dtype)
    sums = np.zeros(4, dtype)
    K.column_sums(g, sums)
    np.testing.assert_allclose(sums, g.astype(np.float64).sum(0), rtol=tol, atol=tol)
    want = np.where(h > 0, g, 0)
    K.relu_backward(g, h)
    np.testing.assert_array_equal(g, want)

    n = 9
    reward = rng.standard_normal(n).astype(dtype)
    term = rng.random(n) < 0.5
    q1, q2 = rng.standard_normal((n, 1)).astype(dtype), rng.standard_normal((n, 1)).astype(dtype)
    q2[0] = q1[0]  # a tie
    logp = rng.standard_normal(n).astype(dtype)
    out = np.zeros(n, dtype)
    K.critic_target(reward, term, q1, q2, logp, 0.3, 0.97, out)
    np.testing.assert_allclose(out, naive.sac_critic_target_naive(reward, term, q1, q2, logp, 0.3, 0.97),
                               rtol=tol, atol=tol)
    target = rng.standard_normal(n).astype(dtype)
    g = np.zeros((n, 1), dtype)
    loss = K.mse_backward(q1, target, g)
    want_loss, want_g = naive.sac_mse_backward_naive(q1, target)
    assert loss == pytest.approx(want_loss, rel=tol)
    np.testing.assert_allclose(g, want_g, rtol=tol, atol=tol)
    g1, g2 = np.zeros((n, 1), dtype), np.zeros((n, 1), dtype)
    loss = K.min_backward(q1, q2, logp, 0.3, g1, g2)
    want_loss, w1, w2 = naive.sac_min_backward_naive(q1, q2, logp, 0.3)
    assert loss == pytest.approx(want_loss, rel=tol, abs=tol)
    np.testing.assert_allclose(g1, w1, rtol=tol)
    np.testing.assert_allclose(g2, w2, rtol=tol)
    assert g1[0, 0] == g2[0, 0] == pytest.approx(-0.5 / n)  # torch splits a tie

    gi1, gi2 = rng.standard_normal((n, 7)).astype(dtype), rng.standard_normal((n, 7)).astype(dtype)
    ga = np.zeros((n, 3), dtype)
    K.action_gradient(gi1, gi2, 4, ga)
    np.testing.assert_allclose(ga, gi1[:, 4:] + gi2[:, 4:], rtol=tol)
    la, grad = np.array([0.4], dtype), np.zeros(1, dtype)
    loss = K.temperature_gradient(logp, -3.0, la, grad)
    assert loss == pytest.approx(naive.sac_temperature_naive(logp, -3.0, 0.4), rel=tol)
    assert grad[0] == pytest.approx(loss, rel=tol)
    tgt, src = rng.standard_normal(11).astype(dtype), rng.standard_normal(11).astype(dtype)
    want = 0.005 * src.astype(np.float64) + 0.995 * tgt.astype(np.float64)
    K.polyak(tgt, src, dtype(0.005), dtype(0.995))
    np.testing.assert_allclose(tgt, want, rtol=tol, atol=tol)
    x = np.zeros((3, 4), dtype)
    assert K.first_nonfinite(x) == -1
    x[2, 1] = np.nan
    assert K.first_nonfinite(x) == 9
    x[1, 3] = -np.inf
    assert K.first_nonfinite(x) == 7


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_squashed_gaussian_and_backward(dtype):
    rng = np.random.default_rng(2)
    n, a = 33, 3
    # float32 away from tanh's saturation, where 1 - tanh(x)**2 rounds to 0 (in torch as well)
    head = (rng.standard_normal((n, 2 * a)) * (2 if dtype == np.float64 else 0.5)).astype(dtype)
    eps = rng.standard_normal((n, a)).astype(dtype)
    scale, bias = np.array([2.0, 0.75, 1.5], dtype), np.array([0.0, -0.25, 1.5], dtype)
    t, std, y, act = (np.zeros((n, a), dtype) for _ in range(4))
    logp = np.zeros(n, dtype)
    K.squashed_gaussian(head, eps, scale, bias, t, std, y, act, logp)
    wt, wstd, wy, wact, wlogp = naive.sac_squashed_gaussian_naive(head, eps, scale, bias)
    tol = 2e-5 if dtype == np.float32 else 1e-10
    for got, want in ((t, wt), (std, wstd), (y, wy), (act, wact)):
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(logp, wlogp, rtol=tol, atol=50 * tol)  # log(1e-6) near the bounds
    g_action = rng.standard_normal((n, a)).astype(dtype)
    g_head = np.zeros((n, 2 * a), dtype)
    K.squashed_gaussian_backward(g_action, 0.07, eps, t, std, y, scale, g_head)
    want = naive.sac_squashed_gaussian_backward_naive(g_action, 0.07, head, eps, scale)
    np.testing.assert_allclose(g_head, want, rtol=50 * tol, atol=50 * tol * np.abs(want).max())


def test_squashed_gaussian_backward_is_the_gradient():
    """Finite differences of sum(g_action * action) + c * sum(logp) in float64."""
    rng = np.random.default_rng(3)
    n, a = 4, 2
    head = rng.standard_normal((n, 2 * a))
    eps = rng.standard_normal((n, a))
    scale, bias = np.array([1.5, 0.5]), np.array([0.5, -1.0])
    g_action = rng.standard_normal((n, a))

    def f(hd):
        _, _, _, act, logp = naive.sac_squashed_gaussian_naive(hd, eps, scale, bias)
        return float((g_action * act).sum() + 0.3 * logp.sum())

    t, std, y, act = (np.zeros((n, a)) for _ in range(4))
    logp = np.zeros(n)
    K.squashed_gaussian(head, eps, scale, bias, t, std, y, act, logp)
    g = np.zeros((n, 2 * a))
    K.squashed_gaussian_backward(g_action, 0.3, eps, t, std, y, scale, g)
    h = 1e-6
    for idx in np.ndindex(head.shape):
        up, down = head.copy(), head.copy()
        up[idx] += h
        down[idx] -= h
        assert g[idx] == pytest.approx((f(up) - f(down)) / (2 * h), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("deterministic", [False, True])
def test_act_against_naive(deterministic):
    sac = SAC(OBS, LOW, HIGH, hidden=(16, 8), seed=4, dtype="float64")
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, OBS))
    state = sac.state_dict()["rng"]
    gen = np.random.Generator(np.random.PCG64())
    gen.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": state[0], "inc": state[1]},
                               "has_uint32": state[2], "uinteger": state[3]}
    eps = gen.standard_normal((3, ACT))
    got = sac.act(x, deterministic=deterministic).copy()
    want = naive.sac_actor_act_naive(sac.layers("actor"), x, eps, sac.action_scale, sac.action_bias,
                                     deterministic)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    one = sac.act(x[1], deterministic=True)
    assert one.shape == (ACT,)
    assert ((one >= LOW) & (one <= HIGH)).all()


# -- against CleanRL's torch update --------------------------------------------------------------
def torch_agent(sac, torch):
    """CleanRL's Actor and SoftQNetworks holding ``sac``'s parameters, with its optimizers."""
    nn = torch.nn
    F = torch.nn.functional
    dt = torch.float64 if sac.dtype == np.float64 else torch.float32
    A = sac.action_dim

    class Actor(nn.Module):
        def __init__(self):
            super().__init__()
            h1, h2 = sac.hidden
            self.fc1, self.fc2 = nn.Linear(sac.obs_dim, h1), nn.Linear(h1, h2)
            self.fc_mean, self.fc_logstd = nn.Linear(h2, A), nn.Linear(h2, A)
            # from the bounds, as CleanRL computes them (not SAC's own scale and bias)
            self.register_buffer("action_scale", torch.tensor((sac.action_high - sac.action_low) / 2.0))
            self.register_buffer("action_bias", torch.tensor((sac.action_high + sac.action_low) / 2.0))

        def forward(self, x):
            x = F.relu(self.fc1(x))
            x = F.relu(self.fc2(x))
            mean = self.fc_mean(x)
            log_std = torch.tanh(self.fc_logstd(x))
            log_std = -5 + 0.5 * (2 - (-5)) * (log_std + 1)
            return mean, log_std

        def get_action(self, x, eps):
            mean, log_std = self(x)
            std = log_std.exp()
            normal = torch.distributions.Normal(mean, std)
            x_t = mean + eps * std  # Normal.rsample with these draws
            y_t = torch.tanh(x_t)
            action = y_t * self.action_scale + self.action_bias
            log_prob = normal.log_prob(x_t)
            log_prob -= torch.log(self.action_scale * (1 - y_t.pow(2)) + 1e-6)
            return action, log_prob.sum(1, keepdim=True)

    class SoftQNetwork(nn.Module):
        def __init__(self):
            super().__init__()
            h1, h2 = sac.hidden
            self.fc1, self.fc2, self.fc3 = (nn.Linear(sac.obs_dim + A, h1), nn.Linear(h1, h2),
                                            nn.Linear(h2, 1))

        def forward(self, x, a):
            x = torch.cat([x, a], 1)
            return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))

    actor = Actor().to(dt)
    qs = [SoftQNetwork().to(dt) for _ in range(4)]
    with torch.no_grad():
        (w1, b1), (w2, b2), (w3, b3) = sac.layers("actor")
        for lin, (w, b) in ((actor.fc1, (w1, b1)), (actor.fc2, (w2, b2)),
                            (actor.fc_mean, (w3[:A], b3[:A])), (actor.fc_logstd, (w3[A:], b3[A:]))):
            lin.weight.copy_(torch.tensor(w))
            lin.bias.copy_(torch.tensor(b))
        for q, name in zip(qs, ("q1", "q2", "q1_target", "q2_target")):
            for lin, (w, b) in zip((q.fc1, q.fc2, q.fc3), sac.layers(name)):
                lin.weight.copy_(torch.tensor(w))
                lin.bias.copy_(torch.tensor(b))
    log_alpha = torch.zeros(1, dtype=dt, requires_grad=True)
    return {"actor": actor, "qf1": qs[0], "qf2": qs[1], "qf1_target": qs[2], "qf2_target": qs[3],
            "q_opt": torch.optim.Adam(list(qs[0].parameters()) + list(qs[1].parameters()), lr=1e-3),
            "actor_opt": torch.optim.Adam(list(actor.parameters()), lr=3e-4),
            "log_alpha": log_alpha, "a_opt": torch.optim.Adam([log_alpha], lr=1e-3),
            "alpha": log_alpha.exp().item(), "target_entropy": -float(A)}


def cleanrl_update(ag, data, noise, global_step, torch, pf=2, tau=0.005, gamma=0.99, autotune=True):
    """CleanRL's update, its lines, with the Gaussian draws given; returns the gradients as
    they were after each backward pass."""
    F = torch.nn.functional
    T = {k: torch.tensor(v) for k, v in data.items()}
    dones = T["terminated"].to(T["reward"].dtype)
    eps = [torch.tensor(e) for e in noise]
    actor, qf1, qf2, alpha = ag["actor"], ag["qf1"], ag["qf2"], ag["alpha"]
    grads = {}
    with torch.no_grad():
        next_state_actions, next_state_log_pi = actor.get_action(T["next_obs"], eps[0])
        qf1_next_target = ag["qf1_target"](T["next_obs"], next_state_actions)
        qf2_next_target = ag["qf2_target"](T["next_obs"], next_state_actions)
        min_qf_next_target = torch.min(qf1_next_target, qf2_next_target) - alpha * next_state_log_pi
        next_q_value = T["reward"].flatten() + (1 - dones.flatten()) * gamma * (min_qf_next_target).view(-1)
    qf1_a_values = qf1(T["obs"], T["action"]).view(-1)
    qf2_a_values = qf2(T["obs"], T["action"]).view(-1)
    qf_loss = F.mse_loss(qf1_a_values, next_q_value) + F.mse_loss(qf2_a_values, next_q_value)
    ag["q_opt"].zero_grad()
    qf_loss.backward()
    grads["q"] = torch.cat([p.grad.flatten() for q in (qf1, qf2) for p in q.parameters()]).numpy().copy()
    ag["q_opt"].step()
    out = {"qf_loss": qf_loss.item()}
    if global_step % pf == 0:
        for it in range(pf):
            pi, log_pi = actor.get_action(T["obs"], eps[1 + 2 * it])
            min_qf_pi = torch.min(qf1(T["obs"], pi), qf2(T["obs"], pi))
            actor_loss = ((alpha * log_pi) - min_qf_pi).mean()
            ag["actor_opt"].zero_grad()
            actor_loss.backward()
            grads[f"actor{it}"] = {n: p.grad.numpy().copy() for n, p in actor.named_parameters()}
            ag["actor_opt"].step()
            out["actor_loss"] = actor_loss.item()
            if not autotune:
                continue
            with torch.no_grad():
                _, log_pi = actor.get_action(T["obs"], eps[2 + 2 * it])
            alpha_loss = (-ag["log_alpha"].exp() * (log_pi + ag["target_entropy"])).mean()
            ag["a_opt"].zero_grad()
            alpha_loss.backward()
            grads[f"alpha{it}"] = ag["log_alpha"].grad.item()
            ag["a_opt"].step()
            alpha = ag["alpha"] = ag["log_alpha"].exp().item()
            out["alpha_loss"] = alpha_loss.item()
    with torch.no_grad():
        for q, qt in ((qf1, ag["qf1_target"]), (qf2, ag["qf2_target"])):
            for param, target_param in zip(q.parameters(), qt.parameters()):
                target_param.data.copy_(tau * param.data + (1 - tau) * target_param.data)
    return out, grads


def actor_flat_grad(grads, A):
    """CleanRL's actor gradients in SAC's flat layout (the two heads one layer)."""
    g = grads
    return np.concatenate([g["fc1.weight"].ravel(), g["fc1.bias"], g["fc2.weight"].ravel(), g["fc2.bias"],
                           np.concatenate([g["fc_mean.weight"], g["fc_logstd.weight"]]).ravel(),
                           np.concatenate([g["fc_mean.bias"], g["fc_logstd.bias"]])])


def flat_params(ag, torch):
    a = ag["actor"]
    actor = torch.cat([a.fc1.weight.flatten(), a.fc1.bias, a.fc2.weight.flatten(), a.fc2.bias,
                       torch.cat([a.fc_mean.weight, a.fc_logstd.weight]).flatten(),
                       torch.cat([a.fc_mean.bias, a.fc_logstd.bias])])
    q = torch.cat([p.flatten() for name in ("qf1", "qf2") for p in ag[name].parameters()])
    qt = torch.cat([p.flatten() for name in ("qf1_target", "qf2_target") for p in ag[name].parameters()])
    return actor.detach().numpy(), q.detach().numpy(), qt.detach().numpy()


@pytest.mark.parametrize("pf,autotune", [(1, True), (2, True), (2, False)])
def test_updates_match_cleanrl_float64(pf, autotune):
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    sac = SAC(OBS, LOW, HIGH, hidden=(32, 24), seed=6, dtype="float64", policy_frequency=pf,
              autotune=autotune, alpha=0.2)
    ag = torch_agent(sac, torch)
    if not autotune:
        ag["alpha"] = 0.2
    rng = np.random.default_rng(7)
    for step in range(1, 5):
        data = batch_of(rng, 16, dtype=np.float64)
        noise = rng.standard_normal((1 + 2 * pf, 16, ACT))
        want, grads = cleanrl_update(ag, data, noise, step, torch, pf=pf, autotune=autotune)
        loss = sac.train(data, step, noise=noise)
        assert loss == pytest.approx(want["qf_loss"], rel=1e-9)
        np.testing.assert_allclose(sac.q_grad, grads["q"], rtol=1e-9, atol=1e-12)
        if step % pf == 0:
            np.testing.assert_allclose(sac.actor_grad, actor_flat_grad(grads[f"actor{pf - 1}"], ACT),
                                       rtol=1e-9, atol=1e-12)
            assert sac.actor_loss == pytest.approx(want["actor_loss"], rel=1e-9)
            if autotune:
                assert sac.alpha_loss == pytest.approx(want["alpha_loss"], rel=1e-9)
                assert sac._alpha_grad[0] == pytest.approx(grads[f"alpha{pf - 1}"], rel=1e-9)
        assert sac.alpha == pytest.approx(ag["alpha"], rel=1e-12)
        for got, exp in zip((sac.actor_params, sac.q_params, sac.q_target_params), flat_params(ag, torch)):
            np.testing.assert_allclose(got, exp, rtol=1e-9, atol=1e-12)


def test_update_matches_cleanrl_float32_at_its_sizes():
    """CleanRL's sizes (256-256, batch 256) in float32: gradients and losses to float32 rounding."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    sac = SAC(11, -np.ones(3), np.ones(3), seed=8)
    ag = torch_agent(sac, torch)
    rng = np.random.default_rng(9)
    data = batch_of(rng, 256, 11, -np.ones(3), np.ones(3))
    noise = rng.standard_normal((5, 256, 3)).astype(np.float32)
    want, grads = cleanrl_update(ag, data, noise, 2, torch)
    loss = sac.train(data, 2, noise=noise)
    assert loss == pytest.approx(want["qf_loss"], rel=1e-4)
    for got, exp in ((sac.q_grad, grads["q"]), (sac.actor_grad, actor_flat_grad(grads["actor1"], 3))):
        np.testing.assert_allclose(got, exp, rtol=2e-3, atol=2e-4 * np.abs(exp).max())
    assert sac.actor_loss == pytest.approx(want["actor_loss"], rel=1e-4, abs=1e-5)
    assert sac.alpha == pytest.approx(ag["alpha"], rel=1e-6)


# -- behaviour --------------------------------------------------------------------------------
def test_policy_and_target_schedule():
    sac = SAC(OBS, LOW, HIGH, hidden=(8, 8), seed=1, policy_frequency=3, target_network_frequency=2)
    rng = np.random.default_rng(0)
    actor0, target0 = sac.actor_params.copy(), sac.q_target_params.copy()
    sac.train(batch_of(rng, 4), step=1)  # neither a policy nor a target update
    assert (sac.actor_params == actor0).all() and (sac.q_target_params == target0).all()
    assert sac.alpha == 1.0 and math.isnan(sac.actor_loss)
    sac.train(batch_of(rng, 4), step=2)  # a target update only
    assert (sac.actor_params == actor0).all() and not (sac.q_target_params == target0).all()
    sac.train(batch_of(rng, 4), step=3)  # the policy, three times, and the temperature
    assert not (sac.actor_params == actor0).all()
    assert sac.actor_optim.t == 3 and sac.alpha_optim.t == 3 and sac.q_optim.t == 3
    assert sac.alpha != 1.0 and sac.updates == 3
    fixed = SAC(OBS, LOW, HIGH, hidden=(8, 8), seed=1, autotune=False, alpha=0.05)
    fixed.train(batch_of(rng, 4), step=2)
    assert fixed.alpha == 0.05 and fixed.alpha_optim.t == 0


def test_same_seed_same_updates_and_state_continues():
    rng = np.random.default_rng(0)
    batches = [batch_of(rng, 8) for _ in range(6)]
    a, b = (SAC(OBS, LOW, HIGH, hidden=(16, 16), seed=3) for _ in range(2))
    for x in batches[:3]:
        a.train(x)
        b.train(x)
    state = a.state_dict()
    c = SAC(OBS, LOW, HIGH, hidden=(16, 16), seed=99)
    c.load_state_dict(state)
    for x in batches[3:]:
        a.train(x)
        c.train(x)
    for name in ("actor_params", "q_params", "q_target_params", "log_alpha"):
        np.testing.assert_array_equal(getattr(a, name), getattr(c, name))
    np.testing.assert_array_equal(a.act(batches[0]["obs"][0]), c.act(batches[0]["obs"][0]))
    assert b.updates == 3 and c.updates == 6


def hostile_states(sac):
    good = sac.state_dict()

    def edit(key, value, sub=None):
        s = {k: (dict(v) if isinstance(v, dict) else v) for k, v in good.items()}
        if sub is None:
            s[key] = value
        else:
            s[key][sub] = value
        return s

    nan_actor = good["actor"].copy()
    nan_actor[3] = np.nan
    yield "state: missing field 'q_target'", {k: v for k, v in good.items() if k != "q_target"}
    yield "state['actor']", edit("actor", nan_actor)
    yield "state['q']", edit("q", good["q"][:-1])
    yield "state['hidden']", edit("hidden", [16, 17])
    yield "state['action_high']", edit("action_high", [2.0, 0.5, 4.0])
    yield "state['dtype']", edit("dtype", "float64")
    yield "state['gamma']", edit("gamma", 1.5)
    yield "state['tau']", edit("tau", float("nan"))
    yield "state['policy_frequency']", edit("policy_frequency", 0)
    yield "state['log_alpha']", edit("log_alpha", float("inf"))
    yield "state['alpha']", edit("alpha", 0.7)
    yield "state['q_optim.lr']", edit("q_optim", -1.0, "lr")
    yield "state['actor_optim.v']", edit("actor_optim", -np.ones_like(good["actor"]), "v")
    yield "state['updates']", edit("updates", -1)
    yield "state['rng']", edit("rng", [1, 2, 0, 0])  # an even increment
    yield "state['gamma']", edit("gamma", -0.5)
    yield "state['tau']", edit("tau", 1.5)
    yield "state['tau']", edit("tau", -0.1)
    yield "state['action_low']", edit("action_low", [-2.0, -1.0, 0.5])
    yield "state['target_network_frequency']", edit("target_network_frequency", 0)
    yield "state['rng']", edit("rng", "seed")


def test_hostile_states_refused_and_nothing_changed():
    sac = SAC(OBS, LOW, HIGH, hidden=(16, 16), seed=2)
    sac.train(batch_of(np.random.default_rng(0), 8), step=2)
    before = sac.state_dict()
    for where, state in hostile_states(sac):
        with pytest.raises(ValueError) as info:
            sac.load_state_dict(state)
        assert where in str(info.value), (where, str(info.value))
        after = sac.state_dict()
        for k, v in before.items():
            if isinstance(v, np.ndarray):
                np.testing.assert_array_equal(after[k], v)
            elif not isinstance(v, dict):
                assert after[k] == v, k


@pytest.mark.parametrize("field,value,message", [
    ("obs", np.nan, "batch['obs']: expected finite values, got nan"),
    ("next_obs", np.inf, "batch['next_obs']: expected finite values, got inf"),
    ("action", -np.inf, "batch['action']: expected finite values"),
    ("reward", np.nan, "batch['reward']: expected finite values"),
])
def test_nonfinite_batches_refused(field, value, message):
    sac = SAC(OBS, LOW, HIGH, hidden=(8, 8), seed=0)
    data = batch_of(np.random.default_rng(1), 6)
    data[field][2] = value
    before = sac.state_dict()
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        sac.train(data)
    np.testing.assert_array_equal(sac.q_params, before["q"])
    assert sac.updates == 0 and sac.q_optim.t == 0


def test_bad_batches_and_arguments():
    sac = SAC(OBS, LOW, HIGH, hidden=(8, 8), seed=0)
    data = batch_of(np.random.default_rng(1), 6)
    with pytest.raises(ValueError, match=r"batch\['action'\]: expected float32 of shape \(6, 3\)"):
        sac.train({**data, "action": data["action"][:, :2]})
    with pytest.raises(ValueError, match=r"batch\['terminated'\]: expected bool"):
        sac.train({**data, "terminated": data["terminated"].astype(np.float32)})
    with pytest.raises(ValueError, match=r"batch\['obs'\]"):
        sac.train({**data, "obs": data["obs"][:, :4]})
    with pytest.raises(ValueError, match="noise: expected finite floats of shape"):
        sac.train(data, noise=np.zeros((2, 6, 3)))
    with pytest.raises(ValueError, match=r"obs: expected shape \(5,\)"):
        sac.act(np.zeros(4))
    with pytest.raises(ValueError, match="obs: action nan at flat index 0 is not finite: obs holds nan"):
        sac.act(np.full(OBS, np.nan))
    for kwargs, message in (({"action_low": [0.0, 0.0, 0.0], "action_high": [1.0, 0.0, 1.0]},
                             "action_high: expected values above action_low"),
                            ({"action_low": [0.0, -np.inf, 0.0]}, "action_low: expected finite"),
                            ({"action_high": [1.0, 1.0]}, "action_high: expected shape"),
                            ({"hidden": (8, 0)}, "hidden"), ({"gamma": 2.0}, "gamma"),
                            ({"tau": -0.1}, "tau"), ({"policy_frequency": 0}, "policy_frequency"),
                            ({"alpha": -1.0}, "alpha"), ({"seed": -1}, "seed"),
                            ({"q_lr": 0.0}, "lr")):
        args = {"action_low": LOW, "action_high": HIGH, **kwargs}
        with pytest.raises((TypeError, ValueError), match=message):
            SAC(OBS, args.pop("action_low"), args.pop("action_high"), **args)


def test_no_allocation_after_the_first_update():
    sac = SAC(11, -np.ones(3), np.ones(3), seed=0)
    rng = np.random.default_rng(0)
    data = batch_of(rng, 256, 11, -np.ones(3), np.ones(3))
    obs = data["obs"][0]
    sac.train(data)
    sac.train(data)
    sac.act(obs)
    nbytes = sac.nbytes
    tracemalloc.start()
    try:
        for _ in range(4):
            sac.train(data)
            sac.act(obs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024, peak  # a (256, 256) float32 array would be 256 KiB
    assert sac.nbytes == nbytes


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_first_nonfinite_sees_the_last_element(dtype):
    for shape in ((1,), (5,), (3, 4)):
        x = np.zeros(shape, dtype)
        x.reshape(-1)[-1] = np.inf
        assert K.first_nonfinite(x) == x.size - 1


@pytest.mark.parametrize("field", ["obs", "next_obs", "action", "reward"])
def test_nonfinite_in_the_last_element_refused(field):
    sac = SAC(OBS, LOW, HIGH, hidden=(8, 8), seed=0)
    data = batch_of(np.random.default_rng(1), 6)
    data[field].reshape(-1)[-1] = np.nan
    with pytest.raises(ValueError, match=rf"batch\['{field}'\]: expected finite values, got nan"):
        sac.train(data)
    assert sac.updates == 0 and sac.q_optim.t == 0
    obs = np.zeros(OBS, np.float32)
    obs[-1] = np.inf
    with pytest.raises(ValueError, match=r"obs holds inf at flat index 4"):
        sac.act(obs)


def test_nonfinite_noise_and_parameters_refused():
    sac = SAC(OBS, LOW, HIGH, hidden=(8, 8), seed=0)
    data = batch_of(np.random.default_rng(1), 6)
    noise = np.zeros((5, 6, ACT))
    noise[4, 5, 2] = np.nan
    with pytest.raises(ValueError, match="noise: expected finite floats"):
        sac.train(data, noise=noise)
    assert sac.updates == 0 and sac.q_optim.t == 0
    sac.q_params[7] = np.nan  # diverged parameters: the critics' loss is NaN, nothing is stepped
    before = sac.state_dict()
    with pytest.raises(ValueError, match="the critics' loss is nan"):
        sac.train(data)
    np.testing.assert_array_equal(sac.actor_params, before["actor"])
    assert sac.q_optim.t == 0 and sac.updates == 0
    sac.actor_params[3] = np.nan
    with pytest.raises(ValueError, match="the parameters hold NaN or inf"):
        sac.act(data["obs"][0])


def test_a_bad_batch_is_refused_before_a_workspace_is_made():
    sac = SAC(OBS, LOW, HIGH, hidden=(8, 8), seed=0)
    data = batch_of(np.random.default_rng(1), 5000)
    with pytest.raises(ValueError, match=r"batch\['reward'\]"):
        sac.train({**data, "reward": data["reward"].astype(np.float64)})
    assert sac.nbytes == SAC(OBS, LOW, HIGH, hidden=(8, 8), seed=0).nbytes


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_saturated_actor_reaches_the_bounds(dtype):
    sac = SAC(OBS, LOW, HIGH, hidden=(8, 8), seed=0, dtype=dtype)
    np.testing.assert_allclose(sac.action_scale, (HIGH - LOW) / 2, rtol=1e-7)
    np.testing.assert_allclose(sac.action_bias, (HIGH + LOW) / 2, rtol=1e-7, atol=1e-7)
    w, b = sac.layers("actor")[-1]
    x = np.random.default_rng(0).standard_normal((4, OBS))
    for sign, bound in ((1, HIGH), (-1, LOW)):
        w[...] = 0
        b[:ACT] = sign * 50.0   # tanh(mean) = +-1
        b[ACT:] = -50.0         # the log std at its minimum
        for det in (True, False):
            np.testing.assert_allclose(sac.act(x, deterministic=det), np.tile(bound, (4, 1)), atol=1e-5)


def test_initialisation_is_torch_linear():
    sac = SAC(11, -np.ones(3), np.ones(3), seed=0, dtype="float64")
    for net in ("actor", "q1", "q2", "q1_target"):
        for w, b in sac.layers(net):
            bound = 1 / math.sqrt(w.shape[1])
            assert np.abs(w).max() <= bound and np.abs(b).max() <= bound
            if w.size >= 1000:  # uniform: its max near the bound, its std bound / sqrt(3)
                assert np.abs(w).max() > 0.95 * bound
                assert np.std(w) == pytest.approx(bound / math.sqrt(3), rel=0.05)
    np.testing.assert_array_equal(sac.q_target_params, sac.q_params)
    assert not np.array_equal(sac.layers("q1")[1][0], sac.layers("q2")[1][0])


def test_default_step_is_the_call_number():
    rng = np.random.default_rng(0)
    batches = [batch_of(rng, 8) for _ in range(3)]
    a, b = (SAC(OBS, LOW, HIGH, hidden=(8, 8), seed=1) for _ in range(2))
    for i, x in enumerate(batches, 1):
        a.train(x)
        b.train(x, step=i)
        np.testing.assert_array_equal(a.actor_params, b.actor_params)
        np.testing.assert_array_equal(a.q_target_params, b.q_target_params)
    c = SAC(OBS, LOW, HIGH, hidden=(8, 8), seed=1)
    c.train(batches[0])
    assert c.actor_optim.t == 0  # call 1 is step 1: no policy update


def test_deterministic_act_takes_no_draws():
    a, b = (SAC(OBS, LOW, HIGH, hidden=(8, 8), seed=5) for _ in range(2))
    obs = np.ones(OBS, np.float32)
    a.act(obs, deterministic=True)
    assert a.state_dict()["rng"] == b.state_dict()["rng"]
    np.testing.assert_array_equal(a.act(obs), b.act(obs))
    assert a.state_dict()["rng"] != SAC(OBS, LOW, HIGH, hidden=(8, 8), seed=5).state_dict()["rng"]


def test_bad_dtype_and_bounds_named():
    with pytest.raises(TypeError, match="dtype must be float32 or float64, got 'foo'"):
        SAC(OBS, LOW, HIGH, dtype="foo")
    for low in ("-1", [True, False, True], ["a", "b", "c"]):
        with pytest.raises(ValueError, match="action_low: expected finite floats"):
            SAC(OBS, low, HIGH)
