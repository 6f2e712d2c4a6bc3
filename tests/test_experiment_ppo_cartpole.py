"""experiments/ppo_cartpole.py: the port of CleanRL's GAE, the episode bookkeeping on gymnasium's
SAME_STEP vector env, the comparisons and targets, and a small run of the whole experiment."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tfdata
from . import REPO, experiment

HAVE_ROLLOUT = hasattr(tfdata, "RolloutBuffer")
HAVE_PPO = hasattr(tfdata.nn, "PPO")


@pytest.fixture(scope="module")
def ppo():
    return experiment("ppo_cartpole")


def naive_gae(rewards, values, dones_after, last_values, gamma, lam):
    """Per row, float64: ``dones_after[t, e]`` ends the episode after row t (no bootstrap)."""
    T, E = rewards.shape
    adv = np.zeros((T, E))
    for e in range(E):
        last = 0.0
        for t in reversed(range(T)):
            nxt = last_values[e] if t == T - 1 else values[t + 1, e]
            cont = 0.0 if dones_after[t, e] else 1.0
            delta = rewards[t, e] + gamma * nxt * cont - values[t, e]
            last = delta + gamma * lam * cont * last
            adv[t, e] = last
    return adv


def episode_data(T=64, E=4, seed=0):
    rng = np.random.default_rng(seed)
    rewards = rng.standard_normal((T, E)).astype(np.float32)
    values = rng.standard_normal((T, E)).astype(np.float32)
    terminated = rng.random((T, E)) < 0.05
    truncated = ~terminated & (rng.random((T, E)) < 0.05)
    last_values = rng.standard_normal(E).astype(np.float32)
    return rewards, values, terminated, truncated, last_values


def cleanrl_layout(ppo, rewards, values, done_after, last_values):
    """CleanRL's tensors: dones[t] is the flag of the observation at t (the previous step's)."""
    torch = pytest.importorskip("torch")
    dones = np.zeros_like(done_after, dtype=np.float32)
    dones[1:] = done_after[:-1]
    adv, ret = ppo.cleanrl_gae(torch.from_numpy(rewards), torch.from_numpy(values), torch.from_numpy(dones),
                               torch.from_numpy(last_values).reshape(1, -1),
                               torch.from_numpy(done_after[-1].astype(np.float32)), 0.99, 0.95)
    return adv.numpy(), ret.numpy()


def test_cleanrl_gae_is_the_textbook_recursion(ppo):
    rewards, values, term, trunc, last_values = episode_data()
    done = term | trunc
    adv, ret = cleanrl_layout(ppo, rewards, values, done, last_values)
    ref = naive_gae(rewards.astype(float), values.astype(float), done, last_values.astype(float), 0.99, 0.95)
    np.testing.assert_allclose(adv, ref, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ret, adv + values, rtol=1e-6)


@pytest.mark.skipif(not HAVE_ROLLOUT, reason="tfdata.RolloutBuffer not built yet")
def test_buffer_without_final_value_is_cleanrl(ppo):
    """The claim of torch_tfdata and edge (the default tfdata variants): tfdata's GAE over both
    flags and no final_value equals CleanRL's loop over done = terminated | truncated (float32,
    same operation order)."""
    assert ppo.VARIANTS["torch_tfdata"][1] == ppo.VARIANTS["edge"][1] == "tfdata"
    rewards, values, term, trunc, last_values = episode_data(seed=3)
    T, E = rewards.shape
    adv, ret = cleanrl_layout(ppo, rewards, values, term | trunc, last_values)
    buf = tfdata.RolloutBuffer(ppo.rollout_spec(tfdata, 4, bootstrap=False), num_steps=T, num_envs=E)
    obs = np.zeros((E, 4), np.float32)
    for t in range(T):
        buf.add({"obs": obs, "action": np.zeros(E, np.int64), "log_prob": np.zeros(E, np.float32),
                 "value": values[t], "reward": rewards[t], "terminated": term[t], "truncated": trunc[t]})
    buf.compute_returns_and_advantages(last_values, term[-1] | trunc[-1], gamma=0.99, gae_lambda=0.95)
    np.testing.assert_allclose(buf.field("advantage"), adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(buf.field("return"), ret, rtol=1e-5, atol=1e-5)


class FakeVectorEnv:
    """A deterministic stand-in for the SAME_STEP vector env: random observations, reward 1,
    terminations and truncations at fixed steps, ``info["final_obs"]`` where an episode ended."""

    def __init__(self, E=4, seed=0):
        self.E, self.rng, self.k = E, np.random.default_rng(seed), 0
        self.log = []   # (obs given, reward, terminated, truncated, final_obs) per step

    def reset(self, seed=None):
        self.obs = self.rng.standard_normal((self.E, 4)).astype(np.float32)
        return self.obs, {}

    def step(self, actions):
        self.k += 1
        e = np.arange(self.E)
        terminated = self.k % 11 == e
        truncated = ~terminated & (self.k % 7 == e)
        final_obs = self.rng.standard_normal((self.E, 4)).astype(np.float32)
        self.obs = self.rng.standard_normal((self.E, 4)).astype(np.float32)
        self.log.append((np.ones(self.E), terminated, truncated, final_obs))
        return self.obs, np.ones(self.E), terminated, truncated, {"final_obs": final_obs}


class StubLearner:
    """act's values and value() differ (sum vs 2 * first coordinate): a loop that stores the wrong
    one is caught."""
    lr = 0.0

    def __init__(self):
        self.value_calls = 0

    def act(self, obs):
        return np.zeros(len(obs), np.int64), np.zeros(len(obs), np.float32), obs.sum(1).astype(np.float32)

    def value(self, obs):
        self.value_calls += 1
        return (2 * obs[:, 0]).astype(np.float32)

    def train(self, mb):
        pass


@pytest.mark.skipif(not HAVE_ROLLOUT, reason="tfdata.RolloutBuffer not built yet")
@pytest.mark.parametrize("bootstrap", [False, True])
def test_loop_stores_what_each_semantics_needs(ppo, bootstrap):
    """The tfdata loop itself: without bootstrap (torch_tfdata, edge) its advantages are CleanRL's
    recursion over done = terminated | truncated; with it (edge_bootstrap) final_value is the
    critic's value of final_obs where truncated and GAE bootstraps from it there."""
    T, E = 16, 4
    hp = dict(ppo.HP, num_steps=T, num_envs=E, num_minibatches=2, update_epochs=1)
    envs, learner = FakeVectorEnv(E), StubLearner()
    buf = tfdata.RolloutBuffer(ppo.rollout_spec(tfdata, 4, bootstrap), num_steps=T, num_envs=E, seed=0)
    assert ("final_value" in buf.spec) == bootstrap
    obs0 = envs.reset()[0].copy()
    envs.rng = np.random.default_rng(0)  # the loop's reset draws the same first observations
    assert ppo.loop_tfdata(envs, hp, 0, T * E, ppo.Clock(), [], learner, buf, bootstrap) == 1
    np.testing.assert_array_equal(buf.field("obs")[0], obs0)
    reward = np.stack([s[0] for s in envs.log]).astype(np.float32)
    term = np.stack([s[1] for s in envs.log])
    trunc = np.stack([s[2] for s in envs.log])
    assert trunc.any() and term.any()
    values = buf.field("obs").sum(-1).astype(np.float32)
    np.testing.assert_array_equal(buf.field("value"), values)
    last = (2 * envs.obs[:, 0]).astype(np.float32)
    if bootstrap:
        fv = np.stack([2 * s[3][:, 0] for s in envs.log]).astype(np.float32)
        np.testing.assert_array_equal(buf.field("final_value")[trunc], fv[trunc])
        # a truncated row's GAE: reward + gamma * final_value - value, then cut
        g = 0.99
        np.testing.assert_allclose(buf.field("advantage")[trunc], (reward + g * fv - values)[trunc], rtol=1e-5, atol=1e-5)
    else:
        assert learner.value_calls == 1  # only the last value: no critic call at truncations
        ref = naive_gae(reward.astype(float), values.astype(float), term | trunc, last.astype(float), 0.99, 0.95)
        np.testing.assert_allclose(buf.field("advantage"), ref, rtol=1e-5, atol=1e-5)


def test_finished_episodes_match_the_steps(ppo):
    """Episode returns and lengths read from final_info equal those counted step by step
    (CartPole pays 1 per step), and final_obs is given exactly where an episode ended."""
    gym = pytest.importorskip("gymnasium")
    envs = ppo.make_envs(gym, 4)
    envs.reset(seed=1)
    rng = np.random.default_rng(0)
    counted, length = [], np.zeros(4, int)
    read = []
    for _ in range(400):
        _, reward, term, trunc, info = envs.step(rng.integers(0, 2, 4))
        length += 1
        done = term | trunc
        for e in np.flatnonzero(done):
            counted.append((int(e), float(length[e]), int(length[e])))
            assert info["final_obs"][e].shape == (4,)
        length[done] = 0
        read += ppo.finished_episodes(info)
    envs.close()
    assert len(counted) > 10
    assert sorted(read) == sorted(counted)


def fake_run(variant, seed, final, mean, sps, rss, steps=4096):
    secs = dict.fromkeys(["env", "act", "buffer_add", "gae", "minibatch", "update", "other"], 0.1)
    return {"variant": variant, "seed": seed, "steps": steps, "total_steps": steps,
            "episodes": [[100, mean, int(mean)], [steps - 1, final, int(final)]],
            "final_return": final, "mean_return": mean, "sps": sps, "wall_s": steps / sps, "setup_s": 1.0,
            "sections_s": secs, "bare_env_us_per_vector_step": 35.0, "bare_env_sps": 4 / 35e-6,
            "peak_rss_bytes": rss, "rss_ready_bytes": rss, "buffer_nbytes": 1024, "torch_imported": variant != "edge"}


def test_comparisons_and_targets(ppo):
    runs = []
    for s in range(5):
        runs.append(fake_run("torch", s, 400 + s, 150 + s, 7000, 330 << 20))
        runs.append(fake_run("torch_tfdata", s, 402 + s, 151 + s, 8000, 340 << 20))
        # edge: clearly worse learning, 3.5x faster, 0.4x memory
        runs.append(fake_run("edge", s, 100 + s, 50 + s, 24500, 132 << 20))
        # the bootstrap: clearly better than edge at the end, the same whole-run mean
        runs.append(fake_run("edge_bootstrap", s, 200 + s, 50 + (s + 2) % 5, 24000, 133 << 20))
    agg = ppo.summarise(runs, ["torch", "torch_tfdata", "edge", "edge_bootstrap"], 4096)
    comps = ppo.comparisons(agg)
    pairs = {(c["variant"], c["against"]): c for c in comps}
    assert set(pairs) == {("torch_tfdata", "torch"), ("edge", "torch"), ("edge_bootstrap", "torch"),
                          ("edge", "torch_tfdata"), ("edge_bootstrap", "edge")}
    c = pairs[("edge", "torch")]
    assert c["final_p"] == pytest.approx(2 / 252) and c["sps_ratio"] == pytest.approx(3.5)
    assert c["peak_rss_ratio"] == pytest.approx(0.4)
    assert pairs[("torch_tfdata", "torch")]["final_p"] > 0.05
    b = pairs[("edge_bootstrap", "edge")]
    assert b["final_p"] == pytest.approx(2 / 252) and b["final_diff"] == pytest.approx(100)
    assert b["mean_p"] == pytest.approx(1.0) and b["mean_diff"] == pytest.approx(0)
    g = ppo.goals(comps)
    # learning: edge vs torch, torch_tfdata vs torch; speed, memory: edge vs torch
    assert ["`edge`" in goal and "`torch_tfdata`" not in goal for goal, _, _ in g] == [True, False, True, True]
    assert [ok for _, ok, _ in g] == [False, True, True, True]
    # the bootstrap variant is never a target
    assert not any("edge_bootstrap" in goal for goal, _, _ in g)
    # torch_tfdata learning differently and edge slower than 3x and heavier than half: all missed
    for r in runs:
        if r["variant"] == "edge":
            r["sps"], r["wall_s"], r["peak_rss_bytes"] = 20000, 4096 / 20000, 200 << 20
        if r["variant"] == "torch_tfdata":
            r["final_return"] = 300 + r["seed"]
    met = [ok for _, ok, _ in ppo.goals(ppo.comparisons(ppo.summarise(runs, ["torch", "torch_tfdata", "edge"], 4096)))]
    assert met == [False, False, False, False]


@pytest.mark.skipif(not (HAVE_ROLLOUT and HAVE_PPO), reason="tfdata.RolloutBuffer / tfdata.nn.PPO not built yet")
def test_small_run_writes_the_report(tmp_path):
    """Two rollouts per variant, one seed, every variant in its own process: the report, plots and
    results are written where TFDATA_REPORTS_DIR says, and the edge process never imported torch."""
    pytest.importorskip("torch")
    pytest.importorskip("gymnasium")
    env = dict(os.environ, TFDATA_REPORTS_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, os.path.join(REPO, "experiments", "ppo_cartpole.py"), "--quick",
                          "--steps", "1024"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    d = tmp_path / "ppo"
    assert {"README.md", "results.json", "learning.png", "speed.png"} <= set(os.listdir(d))
    res = json.loads((d / "results.json").read_text())
    by = {r["variant"]: r for r in res["raw"]}
    assert set(by) == {"torch", "torch_tfdata", "edge", "edge_bootstrap"}
    assert by["edge"]["torch_imported"] is False and by["edge_bootstrap"]["torch_imported"] is False
    assert by["torch_tfdata"]["torch_imported"] is True
    # CleanRL's semantics in every variant but edge_bootstrap, whose buffer has one more field
    assert {v: r["bootstrap"] for v, r in by.items()} == {"torch": False, "torch_tfdata": False, "edge": False,
                                                         "edge_bootstrap": True}
    assert by["edge"]["buffer_nbytes"] == by["torch_tfdata"]["buffer_nbytes"] < by["edge_bootstrap"]["buffer_nbytes"]
    for r in by.values():
        assert r["steps"] == 1024 and r["iterations"] == 2 and r["episodes"]
        assert 20 << 20 < r["peak_rss_bytes"] < 2 << 30
        assert sum(r["sections_s"].values()) == pytest.approx(r["wall_s"], rel=0.05)
    text = (d / "README.md").read_text()
    # tables from results.json; findings are hand-written in the full report: a new folder points there
    assert "## Targets" in text and "## Every variant" in text and "## Comparisons" in text
    assert "| edge_bootstrap | edge |" in text and "<!-- hand-written" not in text
    assert "*Findings: written by hand in the published report, `reports/ppo/README.md`.*" in text
