"""Episodes, vector-env streams, n-step returns, sequence slices and next-field elision.

Every sample is checked against :class:`tests.naive.StreamModel`, which keeps the raw streams as
pushed and computes windows and slices from the rows' flags. The failures this guards against
are the ones other libraries shipped: windows that cross an episode end, the write cursor, the
ring wrap or another environment's stream (FastTD3 #6, SB3 PR #2144, tianshou #135), wrong gamma
exponents, and invalid next observations in memory-saving modes (SB3 #1503, #1853, #934, cpprb #97).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from tfdata import PrioritizedReplayBuffer, ReplayBuffer, Spec, SpecError

from . import naive
from .conftest import LAYOUTS, assert_batches_equal

VEC = Spec({"obs": ("f4", (3,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (3,)),
            "terminated": "?", "truncated": "?"})
# odd widths and offsets: the next-field copies take the byte path
BYTES = Spec({"terminated": "?", "obs": ("u1", (5,)), "reward": "f8", "truncated": "?",
              "next_obs": ("u1", (5,)), "action": "i2"})


class Streams:
    """Continuous streams for ``num_envs`` environments: obs of step t+1 = next_obs of step t
    unless step t ended the episode. Values are unique, so any mix-up shows."""

    def __init__(self, spec: Spec, num_envs: int, rng: np.random.Generator,
                 p_term: float = 0.15, p_trunc: float = 0.1):
        self.spec, self.num_envs, self.rng = spec, num_envs, rng
        self.p_term, self.p_trunc = p_term, p_trunc
        self.counter = 0
        self.obs = np.stack([self._fresh() for _ in range(num_envs)])

    def _fresh(self) -> np.ndarray:
        f = self.spec["obs"]
        self.counter += 1
        return ((np.arange(int(np.prod(f.shape))) + 7 * self.counter) % 251).astype(f.dtype).reshape(f.shape)

    def steps(self, m: int) -> dict:
        rows = {name: [] for name in self.spec.names}
        for _ in range(m):
            for e in range(self.num_envs):
                nxt = self._fresh()
                term = bool(self.rng.random() < self.p_term)
                trunc = bool(not term and self.rng.random() < self.p_trunc)
                rows["obs"].append(self.obs[e].copy())
                rows["next_obs"].append(nxt)
                rows["action"].append(self.counter)
                rows["reward"].append(float(self.rng.integers(-8, 9)) / 4)
                rows["terminated"].append(term)
                rows["truncated"].append(trunc)
                self.obs[e] = self._fresh() if term or trunc else nxt
        return {f.name: np.array(rows[f.name], dtype=f.dtype).reshape((-1,) + f.shape) for f in self.spec}


def expected_nstep(model: naive.StreamModel, idx, n: int, gamma: float):
    rows = [model.nstep(int(s), n, gamma) for s in idx]
    fields = {k: np.stack([r["row"][k] for r in rows]) for k in rows[0]["row"]}
    return fields, np.array([r["discount"] for r in rows], np.float32)


def check_sample(batch, model, n_step, gamma, spec):
    n = 1 if n_step is None else n_step
    fields, discounts = expected_nstep(model, batch.indices, n, gamma)
    fields = {k: fields[k].astype(spec[k].dtype) for k in spec.names}
    assert_batches_equal(dict(batch), fields)
    if n_step is None:
        assert batch.discounts is None
    else:
        np.testing.assert_array_equal(batch.discounts, discounts)


# -- the property test: random streams against the raw-stream reference ---------------------
class EpisodeMachine(RuleBasedStateMachine):
    """Two buffers on the same seed, one full and one elided (layouts drawn independently),
    must both match the reference on every sample and every slice."""

    @initialize(steps_held=st.sampled_from([1, 7, 33]), num_envs=st.sampled_from([1, 2, 3]),
                layouts=st.tuples(st.sampled_from(LAYOUTS), st.sampled_from(LAYOUTS)),
                n_step=st.sampled_from([None, 1, 2, 3, 5]), gamma=st.sampled_from([0.5, 0.9, 1.0]),
                spec=st.sampled_from([VEC, BYTES]), seed=st.integers(0, 2**63))
    def setup(self, steps_held, num_envs, layouts, n_step, gamma, spec, seed):
        cap = steps_held * num_envs
        self.spec, self.n_step, self.gamma = spec, n_step, gamma
        kw = dict(num_envs=num_envs, n_step=n_step, gamma=gamma, seed=seed)
        self.full = ReplayBuffer(spec, cap, layout=layouts[0], **kw)
        self.elided = ReplayBuffer(spec, cap, layout=layouts[1], elide_next=True, **kw)
        self.model = naive.StreamModel(cap, num_envs)
        self.streams = Streams(spec, num_envs, np.random.default_rng(seed % 2**32))
        self.key, self.counter = naive.key_of(seed), 0

    @rule(m=st.integers(0, 12))
    def extend(self, m):
        data = self.streams.steps(m)
        for b in (self.full, self.elided):
            b.extend(data)
        self.model.extend(data)

    @precondition(lambda self: self.model.num_envs == 1)
    @rule()
    def push(self):
        data = self.streams.steps(1)
        row = {k: v[0] for k, v in data.items()}
        for b in (self.full, self.elided):
            b.push(row)
        self.model.extend(data)

    @precondition(lambda self: self.model.size > 0)
    @rule(bs=st.integers(1, 40))
    def sample(self, bs):
        bs = min(bs, self.model.size)
        idx, self.counter = naive.draw_indices(self.key, self.counter, self.model.size, bs)
        for b in (self.full, self.elided):
            batch = b.sample(bs)
            np.testing.assert_array_equal(batch.indices, idx)
            check_sample(batch, self.model, self.n_step, self.gamma, self.spec)

    @precondition(lambda self: self.model.size > 0)
    @rule(bs=st.integers(1, 6), length=st.integers(1, 6), reject=st.booleans())
    def sequences(self, bs, length, reject):
        policy = "reject" if reject else "mask"
        model = self.model
        # as for sample: at most the rows held, and no slice longer than a stream can hold
        bs, length = min(bs, model.size), min(length, model.capacity // model.num_envs)
        valid = [s for s in range(model.size) if model.slice_valid(s, length)]
        if reject and not valid:
            for b in (self.full, self.elided):
                with pytest.raises(ValueError, match="slice"):
                    b.sample_sequences(bs, length, policy=policy)
            return  # a refused sample consumes no randomness
        starts = []
        for _ in range(bs):
            s, self.counter = naive.draw_one(self.key, self.counter, model.size)
            while reject and s not in valid:
                s, self.counter = naive.draw_one(self.key, self.counter, model.size)
            starts.append(s)
        for b in (self.full, self.elided):
            batch = b.sample_sequences(bs, length, policy=policy)
            assert batch.indices.shape == (bs, length) and batch.mask.shape == (bs, length)
            np.testing.assert_array_equal(batch.indices[:, 0], starts)
            for i, s in enumerate(starts):
                rows, mask = model.slice(s, length)
                np.testing.assert_array_equal(batch.mask[i], mask)
                for name in self.spec.names:
                    np.testing.assert_array_equal(batch[name][i], np.stack([r[name] for r in rows]),
                                                  err_msg=name)

    @rule(swap=st.booleans())
    def round_trip(self, swap):
        # a state loads into the other layout and continues identically
        for attr in ("full", "elided"):
            b = getattr(self, attr)
            other = {"aos": "soa", "soa": "aos"}[b.layout] if swap else b.layout
            new = ReplayBuffer(self.spec, b.capacity, layout=other, num_envs=b.num_envs,
                               n_step=self.n_step, gamma=self.gamma, elide_next=b.elide_next, seed=3)
            new.load_state_dict(b.state_dict())
            setattr(self, attr, new)

    @rule()
    def clear(self):
        for b in (self.full, self.elided):
            b.clear()
        self.model.clear()
        # a new stream after clear: the first row needs no continuity with the old one
        self.streams.obs = np.stack([self.streams._fresh() for _ in range(self.model.num_envs)])


TestEpisodeMachine = EpisodeMachine.TestCase
TestEpisodeMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


# -- the storage scheme and hand-checked windows ---------------------------------------------
def test_streams_are_interleaved_step_by_step(layout):
    buf = ReplayBuffer(VEC, 6, layout=layout, num_envs=3)
    s = Streams(VEC, 3, np.random.default_rng(0), p_term=0, p_trunc=0)
    data = [s.steps(1) for _ in range(3)]
    for d in data:
        buf.extend(d)
    # 3 steps into 2 step-slots: step 2 overwrote step 0; env e of step t is at slot (3t + e) % 6
    act = buf.storage.field("action")
    np.testing.assert_array_equal(act[0:3], data[2]["action"])
    np.testing.assert_array_equal(act[3:6], data[1]["action"])


def handmade(layout, n_step, **kw):
    """One stream, capacity 8: rewards 1..10 with a termination at step 2 and a truncation
    at step 5, so slot s holds step s (s < 8 after 8 pushes) and the windows are known."""
    buf = ReplayBuffer(VEC, 8, layout=layout, n_step=n_step, gamma=0.5, seed=0, **kw)
    for t in range(8):
        buf.push({"obs": np.full(3, t, np.float32), "action": t, "reward": float(t + 1),
                  "next_obs": np.full(3, t + 1 if t not in (2, 5) else 100 + t, np.float32),
                  "terminated": t == 2, "truncated": t == 5})
    return buf


def window(buf, slot):
    """Sample until ``slot`` comes up; return its row of the batch (sampling is uniform)."""
    for _ in range(200):
        b = buf.sample(8)
        hit = np.flatnonzero(b.indices == slot)
        if hit.size:
            i = hit[0]
            return {k: b[k][i] for k in b}, b.discounts[i]
    raise AssertionError("slot never sampled")


@pytest.mark.parametrize("elide", [False, True])
def test_nstep_windows_by_hand(layout, elide):
    buf = handmade(layout, 3, elide_next=elide)
    # slot 0: steps 0,1,2; step 2 terminates: return 1 + .5*2 + .25*3, no bootstrap
    r, d = window(buf, 0)
    assert (r["reward"], r["terminated"], r["truncated"], d) == (2.75, True, False, 0.125)
    assert r["next_obs"][0] == 102 and r["obs"][0] == 0
    # slot 2: the terminal step alone
    r, d = window(buf, 2)
    assert (r["reward"], r["terminated"], d) == (3.0, True, 0.5)
    # slot 3: steps 3,4,5; step 5 is truncated: bootstrap from its final observation
    r, d = window(buf, 3)
    assert (r["reward"], r["terminated"], r["truncated"], d) == (4 + 2.5 + 1.5, False, True, 0.125)
    assert r["next_obs"][0] == 105
    # slot 6: steps 6,7 and the write cursor: two steps, bootstrap from step 7's next obs
    r, d = window(buf, 6)
    assert (r["reward"], r["terminated"], r["truncated"], d) == (7 + 4.0, False, False, 0.25)
    assert r["next_obs"][0] == 8
    # slot 7: the newest row, one step
    r, d = window(buf, 7)
    assert (r["reward"], d) == (8.0, 0.5) and r["next_obs"][0] == 8


def test_nstep_never_crosses_the_wrap_into_older_rows(layout):
    buf = handmade(layout, 4)
    for t in range(8, 11):  # steps 8..10 overwrite slots 0..2; the cursor is at slot 3
        buf.push({"obs": np.full(3, t, np.float32), "action": t, "reward": float(t + 1),
                  "next_obs": np.full(3, t + 1, np.float32), "terminated": False, "truncated": False})
    r, d = window(buf, 1)  # steps 9, 10: then the cursor (slot 3 holds the *older* step 3)
    assert (r["reward"], d) == (10 + 5.5, 0.25) and r["next_obs"][0] == 11
    r, d = window(buf, 6)  # steps 6, 7, 8, 9 across the physical wrap: same stream, newer rows
    assert (r["reward"], d) == (7 + 4 + 2.25 + 1.25, 0.5 ** 4) and r["next_obs"][0] == 10


def test_nstep_never_crosses_another_environment(layout):
    buf = ReplayBuffer(VEC, 8, layout=layout, num_envs=2, n_step=4, gamma=1.0, seed=1)
    for t in range(3):
        buf.extend({"obs": np.zeros((2, 3), np.float32), "action": np.array([t, t]),
                    "reward": np.array([1.0, 100.0], np.float32),
                    "next_obs": np.zeros((2, 3), np.float32), "terminated": np.zeros(2, bool),
                    "truncated": np.zeros(2, bool)})
    b = buf.sample(6)
    expected = np.where(b.indices % 2 == 0, 1.0, 100.0) * (3 - b.indices // 2)
    np.testing.assert_array_equal(b["reward"], expected)


# -- elision ---------------------------------------------------------------------------------
def test_elision_stores_no_next_field(layout):
    buf = ReplayBuffer(VEC, 16, layout=layout, elide_next=True)
    assert "next_obs" not in buf.storage.spec.names
    full = ReplayBuffer(VEC, 1024, layout=layout)
    cut = ReplayBuffer(VEC, 1024, layout=layout, elide_next=True)
    assert cut.nbytes < full.nbytes


@pytest.mark.parametrize("num_envs", [1, 2])
def test_elision_refuses_a_broken_stream_and_changes_nothing(layout, num_envs):
    buf = ReplayBuffer(VEC, 8 * num_envs, layout=layout, num_envs=num_envs, elide_next=True, seed=0)
    s = Streams(VEC, num_envs, np.random.default_rng(1), p_term=0, p_trunc=0)
    buf.extend(s.steps(3))
    before = buf.state_dict()
    bad = s.steps(1)
    bad["obs"][-1] += 1  # the last env's obs no longer continues its stream
    with pytest.raises(SpecError, match="obs.*next_obs|continuous"):
        buf.extend(bad)
    inner = s.steps(2)
    inner["obs"][num_envs] += 1  # a break between the two steps of one extend
    with pytest.raises(SpecError, match="continuous"):
        buf.extend(inner)
    after = buf.state_dict()
    assert_states_equal(before, after)


def assert_states_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], dict):
            assert_states_equal(a[k], b[k])
        elif isinstance(a[k], np.ndarray):
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        else:
            assert a[k] == b[k], k


def test_elision_final_table_grows_and_recycles(layout):
    # every row ends an episode: the final table must hold one entry per held row
    spec = VEC
    full = ReplayBuffer(spec, 1000, layout=layout, seed=5)
    cut = ReplayBuffer(spec, 1000, layout=layout, elide_next=True, seed=5)
    s = Streams(spec, 1, np.random.default_rng(2), p_term=1.0)
    for _ in range(5):
        data = s.steps(700)
        full.extend(data)
        cut.extend(data)
        assert_batches_equal(dict(full.sample(256)), dict(cut.sample(256)))
    entries = cut._episodes.free.shape[0]  # the final table's
    assert entries >= 1000 and cut._episodes.n_free == entries - 1000


# -- bad configurations and inputs -----------------------------------------------------------
def test_configuration_errors():
    with pytest.raises(ValueError, match="multiple of num_envs=4.*8 or 12"):
        ReplayBuffer(VEC, 10, num_envs=4)
    no_flags = {"obs": ("f4", (3,)), "reward": "f4"}
    with pytest.raises(SpecError, match="n_step needs episode boundaries.*terminated"):
        ReplayBuffer(no_flags, 8, n_step=3)
    with pytest.raises(SpecError, match="sample_sequences needs"):
        ReplayBuffer(no_flags, 8).sample_sequences(1, 2)
    int_reward = {"obs": ("f4", (3,)), "reward": "i4", "terminated": "?", "truncated": "?"}
    with pytest.raises(SpecError, match="'reward'.*float scalar.*int32"):
        ReplayBuffer(int_reward, 8, n_step=3)
    with pytest.raises(SpecError, match="elide_next=True but no field is the next"):
        ReplayBuffer(int_reward, 8, elide_next=True)
    with pytest.raises(SpecError, match="next_of.*'next_obs'.*dtype and shape"):
        ReplayBuffer({"obs": ("f4", (3,)), "next_obs": ("f8", (3,)), "terminated": "?",
                      "truncated": "?"}, 8, next_of={"next_obs": "obs"})
    with pytest.raises(SpecError, match="'done'.*bool scalar"):
        ReplayBuffer({"done": "f4", "truncated": "?"}, 8, roles={"terminated": "done"})
    with pytest.raises(ValueError, match="gamma must be in"):
        ReplayBuffer(VEC, 8, n_step=2, gamma=1.5)


def test_vector_rows_must_come_in_whole_steps(layout):
    buf = ReplayBuffer(VEC, 12, layout=layout, num_envs=3, n_step=2)
    s = Streams(VEC, 3, np.random.default_rng(0))
    buf.extend(s.steps(2))
    before = buf.state_dict()
    part = {k: v[:2] for k, v in s.steps(1).items()}
    with pytest.raises(SpecError, match="num_envs=3.*whole steps of 3 rows.*got 2"):
        buf.extend(part)
    with pytest.raises(SpecError, match="push appends one row.*num_envs=3"):
        buf.push({k: v[0] for k, v in s.steps(1).items()})
    assert_states_equal(before, buf.state_dict())


def test_reject_without_any_valid_slice_consumes_no_randomness(layout):
    buf = ReplayBuffer(VEC, 64, layout=layout, seed=9)
    twin = ReplayBuffer(VEC, 64, layout=layout, seed=9)
    data = Streams(VEC, 1, np.random.default_rng(0), p_term=1.0).steps(40)  # episodes of 1 step
    buf.extend(data)
    twin.extend(data)
    with pytest.raises(ValueError, match="no slice of 2 steps within one episode"):
        buf.sample_sequences(4, 2, policy="reject")
    with pytest.raises(ValueError, match="holds 40 steps"):
        buf.sample_sequences(4, 41, policy="reject")
    assert_batches_equal(dict(buf.sample(8)), dict(twin.sample(8)))
    with pytest.raises(ValueError, match="policy must be"):
        buf.sample_sequences(4, 2, policy="pad")


def test_prioritized_nstep_matches_reference_and_layouts():
    outs = []
    for layout in LAYOUTS:
        for elide in (False, True):
            buf = PrioritizedReplayBuffer(VEC, 60, layout=layout, num_envs=2, n_step=3, gamma=0.9,
                                          elide_next=elide, seed=4)
            model = naive.StreamModel(60, 2)
            s = Streams(VEC, 2, np.random.default_rng(3))
            for _ in range(4):
                data = s.steps(11)
                buf.extend(data)
                model.extend(data)
                b = buf.sample(min(32, len(buf)))
                check_sample(b, model, 3, 0.9, VEC)
                buf.update_priorities(b, np.abs(b["reward"]) + 0.1)
            outs.append(buf.sample(48, copy=True))
            seq = buf.sample_sequences(2, 2)  # the subclass does what its parent does
            assert seq.indices.shape == (2, 2) and seq.weights.shape == (2,)
    for o in outs[1:]:
        assert_batches_equal(dict(o), dict(outs[0]))
        np.testing.assert_array_equal(o.weights, outs[0].weights)


def test_gymnasium_vector_env_same_step_autoreset(layout):
    gym = pytest.importorskip("gymnasium")
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    envs = SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(4)],
                         autoreset_mode=AutoresetMode.SAME_STEP)
    spec = Spec.from_spaces(envs.single_observation_space, envs.single_action_space)
    kw = dict(layout=layout, num_envs=4, n_step=3, seed=0)
    full, cut = ReplayBuffer(spec, 400, **kw), ReplayBuffer(spec, 400, elide_next=True, **kw)
    obs, _ = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(300):
        action = rng.integers(0, 2, 4)
        nxt, reward, term, trunc, info = envs.step(action)
        final = nxt.copy()
        done = term | trunc
        if done.any():  # SAME_STEP: the returned obs is the reset one; the final one is in info
            final[done] = np.stack(info["final_obs"][done])
        step = {"obs": obs, "action": action, "reward": reward, "next_obs": final,
                "terminated": term, "truncated": trunc}
        full.extend(step)
        cut.extend(step)
        obs = nxt
    envs.close()
    assert_batches_equal(dict(full.sample(128)), dict(cut.sample(128)))
    a, b = full.sample_sequences(8, 10), cut.sample_sequences(8, 10)
    assert_batches_equal(dict(a), dict(b))


def test_clear_wipe_also_forgets_the_kept_next_values(layout):
    buf = ReplayBuffer(VEC, 32, layout=layout, elide_next=True)
    buf.extend(Streams(VEC, 1, np.random.default_rng(0), p_term=0.5).steps(20))
    ep = buf.episodes
    assert any(a.any() for a in ep.finals.values()) and ep.pending["next_obs"].any()
    buf.clear(wipe=True)
    assert not any(a.any() for a in ep.finals.values()) and not ep.pending["next_obs"].any()
    assert not buf.storage.field("obs").any() and len(buf) == 0


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", ["mask", "reject"])
def test_prioritized_sequences_match_the_reference(layout, policy):
    """Slice starts drawn in proportion to their priority (stratified; with "reject", redrawn
    from the whole mass until the slice fits), rows and masks as for uniform slices, weights and
    versions of the start rows, and update_priorities(batch) setting the starts' priorities."""
    buf = PrioritizedReplayBuffer(VEC, 40, layout=layout, num_envs=2, alpha=0.8, beta=0.5,
                                  beta_final=1.0, beta_steps=6, seed=9)
    model = naive.StreamModel(40, 2)
    s = Streams(VEC, 2, np.random.default_rng(8))
    key, counter = naive.key_of(9), 0
    rng = np.random.default_rng(1)
    for step in range(6):
        data = s.steps(7)
        buf.extend(data)
        model.extend(data)
        n, length = len(buf), 3
        leaves = buf.priorities()
        valid = {x for x in range(n) if model.slice_valid(x, length)} if policy == "reject" else None
        if valid is not None and not valid:
            continue
        starts, counter = naive.prioritized_slice_starts(key, counter, leaves, 5, n, valid)
        beta = buf.beta
        batch = buf.sample_sequences(5, length, policy=policy)
        np.testing.assert_array_equal(batch.indices[:, 0], starts)
        for i, st0 in enumerate(starts):
            rows, mask = model.slice(st0, length)
            np.testing.assert_array_equal(batch.mask[i], mask)
            for name in VEC.names:
                np.testing.assert_array_equal(batch[name][i], np.stack([r[name] for r in rows]))
        want = ((leaves.min() / leaves[starts]) ** beta).astype(np.float32)
        np.testing.assert_allclose(batch.weights, want, rtol=1e-6)
        np.testing.assert_array_equal(batch.versions, buf.sampler.version[starts])
        assert buf.beta > beta or beta == buf.beta_final  # a sequence sample advances the schedule
        p = rng.random(5) + 0.1
        buf.update_priorities(batch, p)
        got = buf.priorities()
        last = {int(x): v for x, v in zip(starts, p)}  # a slot listed twice takes its last priority
        for slot, v in last.items():
            assert got[slot] == pytest.approx((v + buf.eps) ** buf.alpha)


def test_prioritized_sequences_refuse_like_the_parent():
    """The same refusals as ReplayBuffer.sample_sequences, and a refused reject draws nothing."""
    buf = PrioritizedReplayBuffer(VEC, 8, num_envs=2, seed=0)
    s = Streams(VEC, 2, np.random.default_rng(0))
    with pytest.raises(ValueError, match="empty"):
        buf.sample_sequences(1, 2)
    buf.extend(s.steps(2))
    counter = buf.sampler.counter
    with pytest.raises(ValueError, match="slice"):
        buf.sample_sequences(2, 3, policy="reject")
    assert buf.sampler.counter == counter
    with pytest.raises(ValueError, match="policy"):
        buf.sample_sequences(2, 2, policy="pad")
