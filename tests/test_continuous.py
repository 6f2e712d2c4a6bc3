"""Continuous actions end to end: gymnasium ``Box`` action spaces through ``Spec.from_spaces``
(a float vector field with its bounds), vector environments, every sampler, n-step, both
layouts, shared memory, checkpoints and ``RolloutBuffer``.

Real environments: Pendulum-v1 (action ``Box(-2, 2, (1,), float32)``) and, with MuJoCo
installed, Hopper-v5 (``Box(-1, 1, (3,), float32)``); the samplers are checked with a
Pendulum-like spec whose actions are 1-D and 3-D float32 vectors. References: tests/naive.py
(``RingModel``, ``draw_indices``, ``StreamModel.nstep``, ``gae_naive``,
``rollout_minibatches_naive``) and, for shared memory, a ReplayBuffer given the same rows.
"""

from __future__ import annotations

import collections
import json
import os

import numpy as np
import pytest

from tfdata import (Field, FormatError, PrioritizedReplayBuffer, ReplayBuffer, RolloutBuffer, Spec,
                    SpecError)
from tfdata.shared import SharedReplayBuffer, SharedWriter

from . import naive
from .conftest import assert_batches_equal, row

SAMPLERS = ["uniform", "without_replacement", "exactly_k", "prioritized"]


def pendulum_like(a: int = 1) -> Spec:
    """Pendulum's transition spec, with an action of ``a`` dimensions in [-2, 2]."""
    return Spec([Field("obs", "f4", (3,)), Field("action", "f4", (a,), low=-2.0, high=2.0),
                 Field("reward", "f4"), Field("next_obs", "f4", (3,)), Field("terminated", "?"),
                 Field("truncated", "?")])


def id_rows(ids, a: int = 1) -> dict:
    """Rows whose every field is a function of the row's id (exact in float32), so a sampled row
    can be checked against the row pushed: ``obs[0]`` holds the id."""
    ids = np.asarray(ids, np.int64)
    x = ids.astype(np.float32)
    action = -2.0 + ((ids[:, None] * 7 + np.arange(a)) % 33).astype(np.float32) / 8
    return {"obs": np.stack([x, x / 4, -x], 1), "action": action.astype(np.float32),
            "reward": -x / 2, "next_obs": np.stack([x + 1, (x + 1) / 4, -x - 1], 1),
            "terminated": ids % 7 == 6, "truncated": ids % 11 == 10}


def check_ids(batch, a: int) -> np.ndarray:
    """The ids of ``batch``'s rows, after checking every field against the row pushed."""
    ids = np.asarray(batch["obs"])[:, 0].astype(np.int64)
    assert_batches_equal({k: np.asarray(batch[k]) for k in batch.keys()}, id_rows(ids, a))
    return ids


def make(sampler: str, spec: Spec, cap: int, layout: str, **kw):
    if sampler == "prioritized":
        return PrioritizedReplayBuffer(spec, cap, layout=layout, seed=3, **kw)
    if sampler == "exactly_k":
        kw["replays"] = 2
    return ReplayBuffer(spec, cap, layout=layout, seed=3, sampler=sampler, **kw)


# -- Spec.from_spaces --------------------------------------------------------------------------
def test_pendulum_action_is_a_bounded_float32_vector():
    gym = pytest.importorskip("gymnasium")
    env = gym.make("Pendulum-v1")
    spec = Spec.from_spaces(env.observation_space, env.action_space)
    assert spec == pendulum_like(1)
    act = spec["action"]
    assert act.dtype == np.float32 and act.shape == (1,)
    np.testing.assert_array_equal(act.low, env.action_space.low)
    np.testing.assert_array_equal(act.high, env.action_space.high)
    assert act.low.dtype == np.float64 and act.low.shape == (1,) and not act.low.flags.writeable
    # observations carry no bounds: often infinite, and an image's would be a frame's size
    assert spec["obs"].low is None and spec["next_obs"].high is None
    assert spec["reward"].low is None
    rollout = RolloutBuffer.spec_from_spaces(env.observation_space, env.action_space)
    np.testing.assert_array_equal(rollout["action"].high, [2.0])


def test_box_actions_of_every_dtype():
    pytest.importorskip("gymnasium")
    from gymnasium import spaces

    obs = spaces.Box(-np.inf, np.inf, (3,), np.float32)
    low, high = np.array([-1, -2, -np.inf]), np.array([1, 0.5, np.inf])
    for dtype in (np.float32, np.float64, np.float16):
        f = Spec.from_spaces(obs, spaces.Box(low.astype(dtype), high.astype(dtype), (3,), dtype))["action"]
        assert f.dtype == dtype and f.shape == (3,)
        np.testing.assert_array_equal(f.low, low.astype(dtype))
        np.testing.assert_array_equal(f.high, high.astype(dtype))
    # integer Boxes keep their dtype, without bounds; a scalar Box keeps shape ()
    f = Spec.from_spaces(obs, spaces.Box(0, 9, (2,), np.int32))["action"]
    assert f.dtype == np.int32 and f.shape == (2,) and f.low is None
    f = Spec.from_spaces(obs, spaces.Box(-1, 1, (), np.float32))["action"]
    assert f.shape == () and f.low.shape == () and float(f.high) == 1.0
    s = Spec.from_spaces(obs, spaces.Dict({"steer": spaces.Box(-1, 1, (1,), np.float32),
                                           "gear": spaces.Discrete(3)}))
    assert s["action.steer"].high.tolist() == [1.0] and s["action.gear"].low is None


def test_hopper_action():
    gym = pytest.importorskip("gymnasium")
    pytest.importorskip("mujoco")
    env = gym.make("Hopper-v5")
    spec = Spec.from_spaces(env.observation_space, env.action_space)
    assert spec["obs"].shape == (11,) and spec["obs"].dtype == np.float64
    assert spec["action"].dtype == np.float32 and spec["action"].shape == (3,)
    assert spec["action"].low.tolist() == [-1.0] * 3 and spec["action"].high.tolist() == [1.0] * 3
    env.close()


# -- bounds: checked, serialised, and read back as untrusted input -------------------------------
@pytest.mark.parametrize("kw, match", [
    (dict(low=-1.0), "both low and high"),
    (dict(high=[1, 1, 1]), "both low and high"),
    (dict(low=[0, 0], high=1), r"low: expected shape \(3,\)"),
    (dict(low=0, high=np.ones((1, 3))), r"high: expected shape \(3,\)"),
    (dict(low=[0, np.nan, 0], high=1), "NaN"),
    (dict(low=[0, 2, 0], high=1), r"low <= high.*index \(1,\)"),
    (dict(low="a", high=1), "real numbers"),
    (dict(low=[0j, 0, 0], high=1), "real numbers"),
    (dict(low=object(), high=1), "real numbers"),
])
def test_bounds_are_checked(kw, match):
    with pytest.raises(SpecError, match="field 'action': .*" + match):
        Field("action", "f4", (3,), **kw)


def test_bounds_only_on_float_fields_and_not_in_equality():
    with pytest.raises(SpecError, match="floating-point fields, got dtype int64"):
        Field("action", "i8", (), low=0, high=3)
    a = Field("action", "f4", (2,), low=-1, high=[1, np.inf])
    b = Field("action", "f4", (2,))
    assert a == b and hash(a) == hash(b)  # metadata: the schema is the same
    assert a.high.tolist() == [1.0, np.inf] and a.low.tolist() == [-1.0, -1.0]
    assert Spec([a]) == Spec([b])


def test_bounds_round_trip_through_json():
    spec = Spec([Field("obs", "f8", (2, 2), low=[[-np.inf, 0], [1, 2]], high=np.inf),
                 Field("action", "f4", (3,), low=-2, high=[2, 3, 4]), Field("x", "i8")])
    text = json.dumps(spec.to_dict(), allow_nan=False)  # strict JSON: infinities as strings
    back = Spec.from_dict(json.loads(text))
    assert back == spec
    for f, g in zip(spec, back):
        for side in ("low", "high"):
            if getattr(f, side) is None:
                assert getattr(g, side) is None
            else:
                np.testing.assert_array_equal(getattr(g, side), getattr(f, side))
    assert spec.to_dict()["fields"][0]["low"] == ["-inf", 0.0, 1.0, 2.0]
    assert "low" not in spec.to_dict()["fields"][2]  # fields without bounds: the format as before


@pytest.mark.parametrize("change, match", [
    (dict(low=[-1]), r"low: expected a list of 3 numbers"),
    (dict(low=-1), r"low: expected a list of 3 numbers .*got int"),
    (dict(low=["-inf", "nan", 0]), r"low\[1\]: expected a number or 'inf'"),
    (dict(low=[float("nan"), 0, 0]), r"low\[0\]: expected a number"),
    (dict(high=[True, 1, 1]), r"high\[0\]: expected a number"),
    (dict(high=[None, 1, 1]), r"high\[0\]: expected a number"),
    (dict(high=[10**400, 1, 1]), r"high\[0\]: integer too large"),
    (dict(low=[2, 0, 0]), "expected low <= high"),
    (dict(high=None), "bounds need both low and high"),
])
def test_hostile_bounds_are_refused(change, match):
    d = Field("action", "f4", (3,), low=-1, high=1).to_dict()
    d.update(change)
    if change.get("high", 0) is None:
        del d["high"]
    with pytest.raises(SpecError, match="field 'action': " + match):
        Field.from_dict(d)
    with pytest.raises(SpecError, match="field 'action'"):
        Spec.from_dict({"fields": [d]})


def test_bounds_survive_checkpoints(tmp_path, layout):
    spec = pendulum_like(3)
    for i, cls in enumerate((ReplayBuffer, PrioritizedReplayBuffer)):
        buf = cls(spec, 16, layout=layout, seed=0)
        buf.extend(id_rows(range(20), 3))
        buf.save(tmp_path / f"ck{i}")
        back = ReplayBuffer.load(tmp_path / f"ck{i}")
        assert type(back) is cls and back.spec == spec
        assert back.spec["action"].low.tolist() == [-2.0] * 3
        assert back.spec["action"].high.tolist() == [2.0] * 3
        assert_batches_equal(dict(back.sample(8)), dict(buf.sample(8)))
        # a state dict into a buffer of the same schema: the buffer keeps its own bounds
        other = cls(Spec([Field(f.name, f.dtype, f.shape) for f in spec]), 16, layout=layout)
        other.load_state_dict(buf.state_dict())
        assert other.spec["action"].low is None


@pytest.mark.parametrize("change, where", [
    (dict(low=["nan"] * 3), r"state.spec.fields\[1\]: field 'action': low\[0\]"),
    (dict(low=[-1, -1]), r"state.spec.fields\[1\]: field 'action': low: expected a list of 3"),
    (dict(low=[3, 3, 3]), r"state.spec.fields\[1\]: field 'action': expected low <= high"),
    (dict(high="inf"), r"state.spec.fields\[1\]: field 'action': high"),
    (dict(lo=[0, 0, 0]), r"state.spec.fields\[1\]: expected only the keys"),
])
def test_hostile_bounds_in_a_checkpoint(tmp_path, change, where):
    buf = ReplayBuffer(pendulum_like(3), 8, seed=0)
    buf.extend(id_rows(range(5), 3))
    ck = tmp_path / "ck"
    buf.save(ck)
    p = os.path.join(ck, "state.json")
    with open(p) as f:
        doc = json.load(f)
    doc["state"]["spec"]["fields"][1].update(change)
    with open(p, "w") as f:
        json.dump(doc, f)
    before = sorted(os.listdir(ck))
    with pytest.raises(FormatError, match=where):
        ReplayBuffer.load(ck)
    assert sorted(os.listdir(ck)) == before


def test_shared_region_and_its_checkpoint_keep_bounds(shm_dir, tmp_path):
    spec = pendulum_like(3)
    with SharedReplayBuffer(spec, 16, seed=0) as buf, SharedWriter(buf.name, 0) as w:
        assert w.spec["action"].high.tolist() == [2.0] * 3  # read from the region's description
        w.extend(id_rows(range(10), 3))
        buf.save(tmp_path / "ck")
    back = SharedReplayBuffer.load(tmp_path / "ck")
    try:
        assert back.spec["action"].low.tolist() == [-2.0] * 3
        check_ids(back.sample(4), 3)
    finally:
        back.close()


# -- every sampler, both layouts, with float vector actions ----------------------------------
@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("a", [1, 3])
def test_every_sampler_returns_the_pushed_rows(layout, sampler, a):
    cap, B = 12, 4
    buf = make(sampler, pendulum_like(a), cap, layout)
    model = naive.RingModel(cap)
    key, counter = naive.key_of(3), 0
    start = 0
    for n in (5, 7):  # 12 rows: full, no wrap (an exactly-k buffer must not overwrite unreplayed rows)
        rows = id_rows(np.arange(start, start + n), a)
        buf.extend(rows)
        model.extend(rows)
        start += n
    seen = collections.Counter()
    for _ in range(2 * cap // B):  # two passes (exactly-k: every row twice)
        batch = buf.sample(B)
        assert batch["action"].dtype == np.float32 and batch["action"].shape == (B, a)
        ids = check_ids(batch, a)
        np.testing.assert_array_equal(ids, batch.indices)  # no wrap: row i sits in slot i
        seen.update(ids.tolist())
        if sampler == "uniform":
            ref, counter = naive.draw_indices(key, counter, cap, B)
            np.testing.assert_array_equal(batch.indices, ref)
            assert_batches_equal(dict(batch), model.rows(ref))
        if sampler in ("without_replacement", "exactly_k"):
            assert len(set(ids.tolist())) == B  # no row twice in a batch
        if sampler == "prioritized":
            assert batch.weights.dtype == np.float32 and batch.weights.shape == (B,)
            buf.update_priorities(batch, np.abs(batch["action"]).sum(1) + 0.1)
    if sampler in ("without_replacement", "exactly_k"):
        assert seen == collections.Counter({i: 2 for i in range(cap)})  # each row once a pass
    if sampler == "exactly_k":
        with pytest.raises(ValueError, match="0 rows await replay"):
            buf.sample(B)  # every row replayed twice: nothing to draw, and no timeout to wait
        buf.extend(id_rows(np.arange(start, start + B), a))  # the replayed slots are free again
        check_ids(buf.sample(B), a)


@pytest.mark.parametrize("sampler", ["uniform", "without_replacement", "prioritized"])
def test_nstep_windows_with_float_actions(layout, sampler):
    n, gamma, E, cap = 3, 0.9, 2, 16
    buf = make(sampler, pendulum_like(3), cap, layout, num_envs=E, n_step=n, gamma=gamma)
    model = naive.StreamModel(cap, E)
    start = 0
    for steps in (3, 5, 4):  # 24 rows: the ring wraps
        rows = id_rows(np.arange(start, start + steps * E), 3)
        buf.extend(rows)
        model.extend(rows)
        start += steps * E
        batch = buf.sample(6)
        want = [model.nstep(int(s), n, gamma) for s in batch.indices]
        fields = {k: np.stack([w["row"][k] for w in want]) for k in buf.spec.names}
        assert_batches_equal(dict(batch), fields)
        np.testing.assert_array_equal(batch.discounts, [w["discount"] for w in want])


def test_exactly_k_with_nstep_is_refused_clearly():
    with pytest.raises(ValueError, match="exactly_k.*n_step"):
        ReplayBuffer(pendulum_like(1), 8, sampler="exactly_k", replays=2, n_step=3)


@pytest.mark.parametrize("kind", ["uniform", "prioritized", "nstep", "exactly_k",
                                  "without_replacement"])
def test_shared_buffer_with_float_actions(shm_dir, layout, kind):
    """One writer in this process: the same batches, bit for bit, as a ReplayBuffer."""
    spec, cap = pendulum_like(3), 12
    opts = {"uniform": {}, "prioritized": {"prioritized": True}, "nstep": {"n_step": 3},
            "exactly_k": {"sampler": "exactly_k", "replays": 2},
            "without_replacement": {"sampler": "without_replacement"}}[kind]
    if kind == "prioritized":
        ref = PrioritizedReplayBuffer(spec, cap, layout=layout, seed=5)
    else:
        ref = ReplayBuffer(spec, cap, layout=layout, seed=5, **opts)
    with SharedReplayBuffer(spec, cap, layout=layout, seed=5, **opts) as buf, \
            SharedWriter(buf.name, 0) as w:
        rows = id_rows(np.arange(cap), 3)
        for i in range(cap):
            ref.push(row(rows, i))
            w.push(row(rows, i))
        for _ in range(3):
            got, want = buf.sample(4, copy=True), ref.sample(4, copy=True)
            assert_batches_equal(dict(got), dict(want))
            np.testing.assert_array_equal(got.indices, want.indices)
            if kind != "nstep":  # (n-step rows hold returns: the ReplayBuffer is the check)
                check_ids(got, 3)
            assert got["action"].shape == (4, 3) and got["action"].dtype == np.float32


# -- vector environments -------------------------------------------------------------------------
def pendulum_envs(gym, kind: str, E: int):
    make = [lambda: gym.make("Pendulum-v1", max_episode_steps=7)] * E  # short: truncations
    if kind == "async":
        return gym.vector.AsyncVectorEnv(make, context="fork")
    return gym.vector.SyncVectorEnv(make)


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_vector_env_steps_into_a_replay_buffer(layout, kind):
    gym = pytest.importorskip("gymnasium")
    E, n, gamma = 3, 3, 0.99
    envs = pendulum_envs(gym, kind, E)
    spec = Spec.from_spaces(envs.single_observation_space, envs.single_action_space)
    buf = ReplayBuffer(spec, 10 * E, layout=layout, num_envs=E, n_step=n, gamma=gamma, seed=0)
    model = naive.StreamModel(10 * E, E)
    rng = np.random.default_rng(0)
    try:
        obs, _ = envs.reset(seed=0)
        for _ in range(16):
            action = rng.uniform(-2, 2, (E, 1)).astype(np.float32)
            nxt, reward, term, trunc, info = envs.step(action)
            step = {"obs": obs, "action": action, "reward": reward, "next_obs": nxt,
                    "terminated": term, "truncated": trunc}
            buf.extend(step)  # gymnasium's (E, 1) float32 actions and float64 rewards, as they come
            model.extend({k: np.asarray(v, spec[k].dtype) for k, v in step.items()})
            obs = nxt
    finally:
        envs.close()
    batch = buf.sample(8)
    want = [model.nstep(int(s), n, gamma) for s in batch.indices]
    fields = {k: np.stack([w["row"][k] for w in want]).astype(spec[k].dtype) for k in spec.names}
    assert_batches_equal(dict(batch), fields)
    assert batch["action"].shape == (8, 1) and np.abs(batch["action"]).max() <= 2


def test_vector_env_of_3d_actions_with_float64_input(layout):
    """A Box(-2, 2, (3,)) action: float64 actions (a numpy policy's) enter the float32 field."""
    spec = pendulum_like(3)
    E = 4
    buf = ReplayBuffer(spec, 8 * E, layout=layout, num_envs=E, seed=1)
    model = naive.RingModel(8 * E)
    rng = np.random.default_rng(1)
    for t in range(10):
        rows = id_rows(np.arange(t * E, (t + 1) * E), 3)
        rows["action"] = rng.uniform(-2, 2, (E, 3))  # float64
        buf.extend(rows)
        model.extend({**rows, "action": rows["action"].astype(np.float32)})
    key, counter = naive.key_of(1), 0
    batch = buf.sample(16)
    ref, _ = naive.draw_indices(key, counter, 8 * E, 16)
    np.testing.assert_array_equal(batch.indices, ref)
    assert_batches_equal(dict(batch), model.rows(ref))
    with pytest.raises(SpecError, match=r"field 'action'.*shape"):
        buf.extend({**id_rows(range(E), 3), "action": np.zeros((E, 2), np.float32)})
    with pytest.raises(SpecError, match=r"field 'action'.*complex"):
        buf.extend({**id_rows(range(E), 3), "action": np.zeros((E, 3), np.complex64)})
    assert len(buf) == 8 * E


# -- RolloutBuffer --------------------------------------------------------------------------------
@pytest.mark.parametrize("final_value", [False, True])
def test_rollout_with_pendulum_actions(layout, final_value):
    gym = pytest.importorskip("gymnasium")
    E, T = 3, 8
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("Pendulum-v1", max_episode_steps=5)] * E,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    spec = RolloutBuffer.spec_from_spaces(envs.single_observation_space, envs.single_action_space,
                                          final_value=final_value)
    assert spec["action"].shape == (1,) and spec["action"].high.tolist() == [2.0]
    buf = RolloutBuffer(spec, T, E, layout=layout, seed=0)
    rng = np.random.default_rng(0)
    steps = []
    try:
        obs, _ = envs.reset(seed=0)
        for _ in range(T):
            action = rng.uniform(-2, 2, (E, 1)).astype(np.float32)
            nxt, reward, term, trunc, info = envs.step(action)
            step = {"obs": obs, "action": action, "reward": reward, "terminated": term,
                    "truncated": trunc,
                    "log_prob": rng.standard_normal(E).astype(np.float32),  # summed over A
                    "value": rng.standard_normal(E).astype(np.float32)}
            if final_value:
                step["final_value"] = rng.standard_normal(E).astype(np.float32)
            buf.add(step)
            steps.append(step)
            obs = nxt
    finally:
        envs.close()
    assert buf.field("action").shape == (T, E, 1)
    np.testing.assert_array_equal(buf.field("action"), np.stack([s["action"] for s in steps]))
    last = rng.standard_normal(E).astype(np.float32)
    buf.compute_returns_and_advantages(last, gamma=0.99, gae_lambda=0.95)

    def stacked(k):
        return np.stack([np.asarray(s[k], spec[k].dtype) for s in steps])

    adv, ret = naive.gae_naive(stacked("reward"), stacked("value"), stacked("terminated"),
                               stacked("truncated"), stacked("final_value") if final_value else None,
                               last, 0.99, 0.95)
    np.testing.assert_array_equal(buf.field("advantage"), adv)
    np.testing.assert_array_equal(buf.field("return"), ret)
    fields = {k: stacked(k) for k in spec.names}
    fields["advantage"], fields["return"] = adv, ret
    want = naive.rollout_minibatches_naive(fields, 7, 4, 2)
    got = [(mb.indices.copy(), {k: np.array(mb[k]) for k in mb.keys()})
           for mb in buf.minibatches(4, epochs=2, seed=7)]
    assert len(got) == len(want) == 8
    for (gi, gf), (wi, wf) in zip(got, want):
        np.testing.assert_array_equal(gi, wi)
        assert gf["action"].shape == (T * E // 4, 1) and gf["action"].dtype == np.float32
        assert_batches_equal(gf, wf)
    state = buf.state_dict()
    assert state["spec"]["fields"][1]["low"] == [-2.0]
    again = RolloutBuffer(spec, T, E, layout=layout)
    again.load_state_dict(state)
    np.testing.assert_array_equal(again.field("action"), buf.field("action"))
    with pytest.raises(SpecError, match=r"RolloutBuffer.add: field 'action'.*shape"):
        RolloutBuffer(spec, T, E).add({**steps[0], "action": np.zeros(E, np.float32)})


# -- the learner reads the bounds --------------------------------------------------------------
def test_sac_built_from_the_spec_bounds_trains_on_sampled_batches(tmp_path):
    gym = pytest.importorskip("gymnasium")
    from tfdata.nn import SAC

    env = gym.make("Pendulum-v1")
    spec = Spec.from_spaces(env.observation_space, env.action_space)
    buf = ReplayBuffer(spec, 64, seed=0)
    obs, _ = env.reset(seed=0)
    sac = SAC(spec["obs"].shape[0], spec["action"].low, spec["action"].high, hidden=(16, 16), seed=0)
    for _ in range(20):
        action = sac.act(obs)
        assert action.dtype == np.float32 and action.shape == (1,)
        assert spec["action"].low <= action <= spec["action"].high
        nxt, reward, term, trunc, _ = env.step(action)
        buf.push({"obs": obs, "action": action, "reward": reward, "next_obs": nxt,
                  "terminated": term, "truncated": trunc})
        obs = nxt
    assert np.isfinite(sac.train(buf.sample(8)))
    buf.save(tmp_path / "ck")  # a learner rebuilt from a checkpoint finds the same bounds
    back = ReplayBuffer.load(tmp_path / "ck").spec["action"]
    np.testing.assert_array_equal(SAC(3, back.low, back.high).action_high, sac.action_high)
    env.close()


def test_equal_bounds_allowed():
    """low == high is a Box gymnasium allows (a fixed component): kept, and read back."""
    f = Field("action", "f4", (2,), low=[0.0, 1.0], high=[0.0, 2.0])
    assert f.low.tolist() == [0.0, 1.0] and f.high.tolist() == [0.0, 2.0]
    assert Field.from_dict(f.to_dict()).low.tolist() == [0.0, 1.0]
