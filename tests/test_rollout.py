"""RolloutBuffer: GAE against the references (pure Python, CleanRL's loop in numpy and torch),
minibatch permutations and gathers, every layout bit for bit, bad input, state, memory."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tfdata
from tfdata import RolloutBuffer, SpecError, StaleBatchError

from . import naive

BASE = {"obs": ("f4", (4,)), "action": "i8", "log_prob": "f4", "reward": "f4", "value": "f4",
        "terminated": "?"}
TRUNC = dict(BASE, truncated="?")
FINAL = dict(TRUNC, final_value="f4")
SPECS = {"base": BASE, "trunc": TRUNC, "final": FINAL}
# odd widths and a field wider than the fixed-size copies (the memcpy path), and column groups
WIDE = dict(FINAL, frame=("u1", (3, 7, 7)), flag="u1", d="f8")
GROUPING = [["obs", "action", "reward", "value"], ["advantage", "terminated"]]
LAYOUTS = ["aos", "soa", GROUPING]
LAYOUT_IDS = ["aos", "soa", "groups"]


def random_rollout(spec: tfdata.Spec, T: int, E: int, rng, p_term=0.1, p_trunc=0.1) -> list:
    """T steps of E envs, every field random (flags with the given rates)."""
    steps = []
    for _ in range(T):
        step = {}
        for f in spec:
            shape = (E,) + f.shape
            if f.name == "terminated":
                step[f.name] = rng.random(E) < p_term
            elif f.name == "truncated":
                step[f.name] = rng.random(E) < p_trunc
            elif f.dtype.kind == "f":
                step[f.name] = rng.standard_normal(shape).astype(f.dtype)
            elif f.dtype.kind == "b":
                step[f.name] = rng.random(shape) < 0.5
            else:
                step[f.name] = rng.integers(0, 100, shape).astype(f.dtype)
        steps.append(step)
    return steps


def stacked(steps: list, name: str) -> np.ndarray:
    return np.stack([s[name] for s in steps])


def filled(spec, T, E, rng, layout="aos", **kw) -> tuple:
    buf = RolloutBuffer(spec, num_steps=T, num_envs=E, layout=layout, seed=kw.pop("seed", 5), **kw)
    steps = random_rollout(buf.spec, T, E, rng)
    for s in steps:
        buf.add(s)
    return buf, steps


def reference(steps: list, spec: tfdata.Spec, last_values, gamma=0.99, lam=0.95):
    return naive.gae_naive(stacked(steps, "reward"), stacked(steps, "value"),
                           stacked(steps, "terminated"),
                           stacked(steps, "truncated") if "truncated" in spec else None,
                           stacked(steps, "final_value") if "final_value" in spec else None,
                           last_values, gamma, lam)


def bits(a) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


# -- GAE against the pure-Python reference ------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("kind", SPECS)
@pytest.mark.parametrize("E", [1, 2, 3, 8])
def test_gae_equals_the_reference_bit_for_bit(layout, kind, E):
    rng = np.random.default_rng(E)
    spec = tfdata.Spec(SPECS[kind])
    for T in (1, 2, 17):
        buf, steps = filled(spec, T, E, rng, layout)
        last = rng.standard_normal(E).astype(np.float32)
        for gamma, lam in ((0.99, 0.95), (1.0, 1.0), (0.0, 0.5), (0.9, 0.0)):
            buf.compute_returns_and_advantages(last, gamma=gamma, gae_lambda=lam)
            adv, ret = reference(steps, spec, last, gamma, lam)
            assert np.array_equal(bits(buf.field("advantage")), bits(adv)), (T, gamma, lam)
            assert np.array_equal(bits(buf.field("return")), bits(ret)), (T, gamma, lam)


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 12), E=st.integers(1, 8), kind=st.sampled_from(sorted(SPECS)),
       seed=st.integers(0, 2**32 - 1), p=st.sampled_from([0.0, 0.2, 0.5, 1.0]),
       q=st.sampled_from([0.0, 0.3, 1.0]),
       gamma=st.floats(0, 1), lam=st.floats(0, 1))
def test_gae_hypothesis(T, E, kind, seed, p, q, gamma, lam):
    rng = np.random.default_rng(seed)
    spec = tfdata.Spec(SPECS[kind])
    buf = RolloutBuffer(spec, num_steps=T, num_envs=E, seed=0)
    steps = random_rollout(spec, T, E, rng, p, q)
    for s in steps:
        buf.add(s)
    last = rng.standard_normal(E).astype(np.float32)
    buf.compute_returns_and_advantages(last, gamma=gamma, gae_lambda=lam)
    adv, ret = reference(steps, spec, last, gamma, lam)
    assert np.array_equal(bits(buf.field("advantage")), bits(adv))
    assert np.array_equal(bits(buf.field("return")), bits(ret))


def test_episode_end_at_every_position():
    """One env per position of the end: each env's only flag at its own step, terminated,
    truncated without and with a final value; the cut and the bootstrap are where they belong."""
    T = 9
    for kind in ("base", "trunc", "final"):
        spec = tfdata.Spec(SPECS[kind])
        for which in ("terminated", "truncated"):
            if which not in spec:
                continue
            buf = RolloutBuffer(spec, num_steps=T, num_envs=T, seed=0)
            rng = np.random.default_rng(1)
            steps = random_rollout(spec, T, T, rng, 0.0, 0.0)
            for t, s in enumerate(steps):
                s[which][t] = True  # env t ends at step t
                buf.add(s)
            last = rng.standard_normal(T).astype(np.float32)
            buf.compute_returns_and_advantages(last)
            adv, ret = reference(steps, spec, last)
            assert np.array_equal(bits(buf.field("advantage")), bits(adv))
            assert np.array_equal(bits(buf.field("return")), bits(ret))
            a = buf.field("advantage")
            v, r = stacked(steps, "value"), stacked(steps, "reward")
            for e in range(T):  # the ending row: reward (+ gamma * final value) - value
                boot = (np.float32(0.99) * stacked(steps, "final_value")[e, e]
                        if which == "truncated" and "final_value" in spec else np.float32(0))
                assert a[e, e] == (r[e, e] + boot) - v[e, e]


def test_gae_in_float32_by_hand():
    """Two steps, one env, small numbers: the formula written out."""
    spec = tfdata.Spec(BASE)
    buf = RolloutBuffer(spec, num_steps=2, num_envs=1, seed=0)
    for r, v in ((1.0, 0.5), (2.0, 0.25)):
        buf.add({"obs": np.zeros((1, 4), np.float32), "action": [0], "log_prob": [0.0],
                 "reward": np.float32([r]), "value": np.float32([v]), "terminated": [False]})
    buf.compute_returns_and_advantages(np.float32([4.0]), gamma=0.5, gae_lambda=0.5)
    d1 = 2.0 + 0.5 * 4.0 - 0.25
    d0 = 1.0 + 0.5 * 0.25 - 0.5
    assert buf.field("advantage")[1, 0] == np.float32(d1)
    assert buf.field("advantage")[0, 0] == np.float32(d0 + 0.25 * d1)
    assert buf.field("return")[0, 0] == np.float32(d0 + 0.25 * d1 + 0.5)


# -- against CleanRL's loop (numpy float32 arrays and torch float32 tensors) ----------------------


def cleanrl_gae(rewards, values, dones, next_value, next_done, gamma, gae_lambda):
    """cleanrl/ppo.py's GAE loop verbatim, over numpy float32 arrays or torch float32 tensors
    alike (``args.*`` Python floats; ``dones[t]`` is the flag of the observation at t)."""
    num_steps = rewards.shape[0]
    advantages = rewards * 0
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    returns = advantages + values
    return advantages, returns


def cleanrl_inputs(steps, spec):
    """CleanRL's arrays from our rows: its ``dones[t]`` is the flag of the step *before* t (the
    ``next_done`` stored with obs t), i.e. our row t - 1's ``terminated | truncated``; its
    ``next_done`` our last row's."""
    ended = stacked(steps, "terminated").copy()
    if "truncated" in spec:
        ended |= stacked(steps, "truncated")
    ended = ended.astype(np.float32)
    dones = np.zeros_like(ended)
    dones[1:] = ended[:-1]
    return stacked(steps, "reward"), stacked(steps, "value"), dones, ended[-1]


@pytest.mark.parametrize("kind", ["base", "trunc"])
@pytest.mark.parametrize("gamma,lam", [(0.99, 0.95), (0.97, 0.9), (1.0, 1.0), (0.5, 0.3)])
def test_gae_equals_cleanrl_numpy_and_torch_bit_for_bit(kind, gamma, lam):
    rng = np.random.default_rng(11)
    spec = tfdata.Spec(SPECS[kind])
    T, E = 128, 4
    for layout in ("aos", "soa"):
        buf, steps = filled(spec, T, E, rng, layout)
        last = (rng.standard_normal(E) * 10).astype(np.float32)
        rewards, values, dones, next_done = cleanrl_inputs(steps, spec)
        buf.compute_returns_and_advantages(last, next_done, gamma=gamma, gae_lambda=lam)
        adv, ret = cleanrl_gae(rewards, values, dones, last, next_done, gamma, lam)
        assert adv.dtype == np.float32
        assert np.array_equal(bits(buf.field("advantage")), bits(adv))
        assert np.array_equal(bits(buf.field("return")), bits(ret))
        torch = pytest.importorskip("torch")
        t = torch.from_numpy
        with torch.no_grad():
            adv_t, ret_t = cleanrl_gae(t(rewards), t(values), t(dones), t(last), t(next_done),
                                       gamma, lam)
        assert adv_t.dtype == torch.float32
        assert np.array_equal(bits(buf.field("advantage")), bits(adv_t.numpy()))
        assert np.array_equal(bits(buf.field("return")), bits(ret_t.numpy()))


def test_last_values_as_a_torch_tensor_and_float64():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    spec = tfdata.Spec(BASE)
    buf, steps = filled(spec, 8, 3, rng)
    last = rng.standard_normal(3)
    buf.compute_returns_and_advantages(last)  # float64: rounded to float32 once
    a64 = buf.field("advantage").copy()
    buf.compute_returns_and_advantages(torch.tensor(last, dtype=torch.float32))
    assert np.array_equal(buf.field("advantage"), a64)
    buf.compute_returns_and_advantages(torch.tensor(last, dtype=torch.float32),
                                       torch.tensor(stacked(steps, "terminated")[-1]).float())
    assert np.array_equal(buf.field("advantage"), a64)
    adv, _ = reference(steps, spec, last.astype(np.float32))
    assert np.array_equal(bits(a64), bits(adv))


# -- layouts --------------------------------------------------------------------------------------


def test_every_layout_gives_the_same_advantages_and_minibatches():
    rng = np.random.default_rng(3)
    spec = tfdata.Spec(WIDE)
    T, E = 16, 4
    steps = random_rollout(spec, T, E, rng)
    last = rng.standard_normal(E).astype(np.float32)
    grouping = [["obs", "action", "frame", "flag"], ["reward", "value", "advantage", "return"], ["d", "truncated"]]
    results = []
    for layout in ("aos", "soa", grouping, GROUPING):
        buf = RolloutBuffer(spec, num_steps=T, num_envs=E, layout=layout, seed=9)
        for s in steps:
            buf.add(s)
        buf.compute_returns_and_advantages(last)
        got = {name: buf.field(name).copy() for name in buf.fields}
        batches = [(b.indices.copy(), {k: np.array(v) for k, v in b.items()})
                   for b in buf.minibatches(8, epochs=3, seed=21)]
        batches += [(b.indices.copy(), {k: np.array(v) for k, v in b.items()})
                    for b in buf.minibatches(4, epochs=2)]  # the buffer's own stream
        results.append((got, batches))
    first = results[0]
    for other in results[1:]:
        for name in first[0]:
            assert first[0][name].tobytes() == other[0][name].tobytes(), name
        assert len(first[1]) == len(other[1]) == 24 + 8
        for (i0, f0), (i1, f1) in zip(first[1], other[1]):
            assert np.array_equal(i0, i1)
            for name in f0:
                assert f0[name].tobytes() == f1[name].tobytes(), name


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_field_views_are_time_major_views_of_the_rows(layout):
    rng = np.random.default_rng(4)
    spec = tfdata.Spec(FINAL)
    buf, steps = filled(spec, 5, 3, rng, layout)
    for name in spec.names:
        view = buf.field(name)
        assert view.shape == (5, 3) + spec[name].shape and view.dtype == spec[name].dtype
        assert np.array_equal(view, stacked(steps, name))
    assert buf.field("advantage").shape == (5, 3)
    with pytest.raises(SpecError, match="advantag"):
        buf.field("advantages")
    buf.compute_returns_and_advantages(np.zeros(3, np.float32))
    mb = next(iter(buf.minibatches(1, seed=0)))  # one minibatch of all rows
    rows = mb.indices
    for name in buf.fields:  # row t * E + e is step t of env e
        flat = buf.field(name).reshape((15,) + buf.field(name).shape[2:])
        assert np.array_equal(mb[name], flat[rows])


# -- minibatches ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_minibatches_equal_the_reference(layout):
    rng = np.random.default_rng(5)
    spec = tfdata.Spec(FINAL)
    T, E = 12, 4
    buf, steps = filled(spec, T, E, rng, layout)
    buf.compute_returns_and_advantages(rng.standard_normal(E).astype(np.float32))
    fields = {name: buf.field(name).copy() for name in buf.fields}
    for seed, n, epochs in ((0, 4, 4), (123456789123, 6, 2), (2**64 - 1, 1, 3), (7, 48, 1)):
        want = naive.rollout_minibatches_naive(fields, seed, n, epochs)
        got = [(b.indices.copy(), {k: np.array(v) for k, v in b.items()})
               for b in buf.minibatches(n, epochs=epochs, seed=seed)]
        assert len(got) == n * epochs
        for (rows, f), (wrows, wf) in zip(got, want):
            assert np.array_equal(rows, wrows)
            for name in wf:
                assert f[name].tobytes() == wf[name].tobytes()


def test_each_epoch_is_a_permutation_and_the_seed_decides():
    rng = np.random.default_rng(6)
    buf, _ = filled(tfdata.Spec(BASE), 128, 4, rng)
    buf.compute_returns_and_advantages(np.zeros(4, np.float32))
    runs = []
    for _ in range(2):
        epochs = []
        for k, b in enumerate(buf.minibatches(4, epochs=4, seed=42)):
            if k % 4 == 0:
                epochs.append([])
            assert b.indices.shape == (128,)
            epochs[-1].append(b.indices.copy())
        runs.append([np.concatenate(e) for e in epochs])
    for order in runs[0]:  # every row once per epoch
        assert np.array_equal(np.sort(order), np.arange(512))
    assert all(np.array_equal(a, b) for a, b in zip(*runs))  # the seed decides
    assert not np.array_equal(runs[0][0], runs[0][1])  # epochs differ
    assert not np.array_equal(runs[0][0], np.arange(512))
    other = np.concatenate([b.indices.copy() for b in buf.minibatches(4, seed=43)])
    assert not np.array_equal(other, runs[0][0])


def test_the_buffers_own_stream_continues_and_is_its_seed():
    rng = np.random.default_rng(7)
    spec = tfdata.Spec(BASE)
    a, steps = filled(spec, 8, 2, rng, seed=99)
    a.compute_returns_and_advantages(np.zeros(2, np.float32))
    first = [b.indices.copy() for b in a.minibatches(2, epochs=2)]
    second = [b.indices.copy() for b in a.minibatches(2, epochs=1)]
    want = naive.rollout_permutations(99, 16, 3)
    assert [list(np.concatenate(first[0:2])), list(np.concatenate(first[2:4])),
            list(np.concatenate(second))] == want
    # a seeded call leaves the buffer's own stream alone
    b = RolloutBuffer(spec, num_steps=8, num_envs=2, seed=99)
    for s in steps:
        b.add(s)
    b.compute_returns_and_advantages(np.zeros(2, np.float32))
    list(b.minibatches(2, seed=5))
    assert [list(x.indices) for x in b.minibatches(2, epochs=1)] == [list(x) for x in first[:2]]


def test_views_and_the_ring():
    rng = np.random.default_rng(8)
    buf, _ = filled(tfdata.Spec(BASE), 8, 4, rng, ring_size=2)
    buf.compute_returns_and_advantages(np.zeros(4, np.float32))
    it = buf.minibatches(4, epochs=1, seed=0)
    b0 = next(it)
    rows0, adv0 = b0.indices.copy(), b0["advantage"].copy()
    b1 = next(it)
    assert np.array_equal(b0.indices, rows0) and np.array_equal(b0["advantage"], adv0)  # still valid
    kept = b0
    b2 = next(it)  # reuses b0's slot while it is held: b0 is retired
    with pytest.raises(StaleBatchError):
        kept["advantage"]
    assert b2.indices.shape == (8,) and b1.indices.shape == (8,)
    assert not np.shares_memory(b1["obs"], b2["obs"])
    c = b2.copy()
    next(it)
    assert c.indices.shape == (8,)
    with pytest.raises(StopIteration):
        next(it)
    # a batch held by one name only (no second reference) is retired as well
    del b0, b1, b2, kept
    it = buf.minibatches(4, epochs=1, seed=0)
    held = next(it)
    next(it)
    next(it)
    with pytest.raises(StaleBatchError):
        held["advantage"]


def test_ring_size_is_how_long_a_batch_stays_valid():
    rng = np.random.default_rng(8)
    spec = tfdata.Spec(BASE)
    buf, _ = filled(spec, 8, 4, rng, ring_size=3)
    buf.compute_returns_and_advantages(np.zeros(4, np.float32))
    it = buf.minibatches(8, epochs=1, seed=0)
    held = next(it)
    rows = held.indices.copy()
    next(it)
    next(it)
    assert np.array_equal(held.indices, rows)  # two more: still valid with 3 slots
    next(it)
    with pytest.raises(StaleBatchError):
        held.indices
    plan = RolloutBuffer.plan_memory(spec, 8, 4, batch_sizes=[4], ring_size=3)
    assert buf.nbytes_parts == plan


def test_an_iterator_stops_when_the_buffer_moves_on():
    rng = np.random.default_rng(9)
    buf, steps = filled(tfdata.Spec(BASE), 4, 2, rng)
    buf.compute_returns_and_advantages(np.zeros(2, np.float32))
    it = buf.minibatches(2, epochs=2, seed=0)
    next(it)
    buf.reset()
    with pytest.raises(RuntimeError, match="invalidated"):
        next(it)
    for s in steps:
        buf.add(s)
    buf.compute_returns_and_advantages(np.zeros(2, np.float32))
    it = buf.minibatches(2, seed=0)
    it2 = buf.minibatches(2, seed=0)
    with pytest.raises(RuntimeError, match="invalidated"):
        next(it)
    assert len(list(it2)) == 2
    assert list(buf.minibatches(2, epochs=0)) == []
    # a load replaces the rows and the generator under a running iterator: it stops too
    state = buf.state_dict()
    it = buf.minibatches(2, epochs=2, seed=0)
    next(it)
    buf.load_state_dict(state)
    with pytest.raises(RuntimeError, match="invalidated"):
        next(it)


# -- bad input changes nothing --------------------------------------------------------------------


def snapshot(buf) -> tuple:
    """Everything a refused call must leave alone: the counts, the generator and every byte of
    every field, rows not yet added included."""
    return (buf.steps, buf.computed, {name: buf.field(name).tobytes() for name in buf.fields},
            buf.state_dict()["rng"])


def test_spec_checks():
    for bad, match in ((dict(BASE, advantage="f4"), "'advantage'.*adds this field"),
                       (dict(BASE, **{"return": "f4"}), "'return'"),
                       ({k: v for k, v in BASE.items() if k != "value"}, "'value' is missing"),
                       (dict(BASE, reward="f8"), "'reward': expected float32 of shape \\(\\), got float64"),
                       (dict(BASE, value=("f4", (1,))), "'value'.*got float32 of shape \\(1,\\)"),
                       (dict(BASE, terminated="f4"), "'terminated': expected bool"),
                       (dict(BASE, truncated="u1"), "'truncated': expected bool"),
                       (dict(FINAL, final_value="f8"), "'final_value'")):
        with pytest.raises(SpecError, match=match):
            RolloutBuffer(bad, num_steps=4, num_envs=2)
    with pytest.raises(SpecError):
        RolloutBuffer(42, num_steps=4, num_envs=2)
    for kw, err in ((dict(num_steps=0, num_envs=2), ValueError), (dict(num_steps=2.0, num_envs=2), TypeError),
                    (dict(num_steps=4, num_envs=True), TypeError), (dict(num_steps=2**16, num_envs=2**16), ValueError)):
        with pytest.raises(err):
            RolloutBuffer(BASE, **kw)
    with pytest.raises(TypeError, match="seed"):
        RolloutBuffer(BASE, num_steps=4, num_envs=2, seed=1.5)
    with pytest.raises(ValueError):
        RolloutBuffer(BASE, num_steps=4, num_envs=2, layout="rows")
    with pytest.raises(SpecError, match="unknown field"):
        RolloutBuffer(BASE, num_steps=4, num_envs=2, layout=[["obs", "nope"]])


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_bad_add_changes_nothing(layout):
    rng = np.random.default_rng(10)
    spec = tfdata.Spec(TRUNC)
    buf = RolloutBuffer(spec, num_steps=3, num_envs=2, layout=layout, seed=0)
    good = random_rollout(spec, 3, 2, rng)
    buf.add(good[0])
    before = snapshot(buf)
    bads = [
        ({k: v for k, v in good[1].items() if k != "reward"}, "missing.*'reward'"),
        (dict(good[1], rewards=good[1]["reward"]), "unknown field 'rewards'"),
        (dict(good[1], advantage=np.zeros(2, np.float32)), "unknown field 'advantage'"),
        (dict(good[1], obs=np.zeros((2, 5), np.float32)), "'obs'"),
        (dict(good[1], action=np.zeros(2, np.float32) + 0.5), "'action'.*float"),
        (dict(good[1], terminated=np.array([0, 2])), "'terminated'"),
        ({k: v[:1] for k, v in good[1].items()}, "expected 2 rows"),
        ({k: np.concatenate([v, v]) for k, v in good[1].items()}, "expected 2 rows"),
        (dict(good[1], value=np.zeros(3, np.float32)), "leading dimensions differ"),
        ("not a mapping", "mapping"),
    ]
    for step, match in bads:
        with pytest.raises(SpecError, match=match):
            buf.add(step)
        assert snapshot(buf) == before
    buf.add(good[1])
    buf.add(good[2])
    full = snapshot(buf)
    with pytest.raises(RuntimeError, match="full"):
        buf.add(good[0])
    assert snapshot(buf) == full


def test_bad_compute_changes_nothing():
    rng = np.random.default_rng(12)
    spec = tfdata.Spec(TRUNC)
    buf = RolloutBuffer(spec, num_steps=3, num_envs=3, seed=0)
    steps = random_rollout(spec, 3, 3, rng)
    steps[-1]["terminated"][:] = [True, False, False]
    steps[-1]["truncated"][:] = [False, True, False]
    for s in steps[:2]:
        buf.add(s)
    with pytest.raises(RuntimeError, match="2 of 3 steps"):
        buf.compute_returns_and_advantages(np.zeros(3, np.float32))
    with pytest.raises(RuntimeError, match="not computed"):
        buf.minibatches(1)
    buf.add(steps[2])
    # a refused first call leaves the rollout not computed (minibatches still refused)
    fresh = snapshot(buf)
    with pytest.raises(SpecError, match="finite"):
        buf.compute_returns_and_advantages(np.float32([0, np.nan, 0]))
    with pytest.raises(SpecError, match="env 1: expected True"):
        buf.compute_returns_and_advantages(np.zeros(3, np.float32), [True, False, False])
    assert not buf.computed and snapshot(buf) == fresh
    with pytest.raises(RuntimeError, match="not computed"):
        buf.minibatches(1)
    buf.compute_returns_and_advantages(np.ones(3, np.float32), [True, True, False])
    before = snapshot(buf)
    bads = [
        ((np.zeros(2, np.float32),), {}, SpecError, r"last_values: expected floats of shape \(3,\), got float32 of shape \(2,\)"),
        ((np.zeros((1, 3), np.float32),), {}, SpecError, r"shape \(1, 3\)"),
        ((np.zeros(3, np.int64),), {}, SpecError, "last_values.*int64"),
        (([0, 0, 0],), {}, SpecError, "last_values.*int64"),
        (("abc",), {}, SpecError, "last_values"),
        ((None,), {}, SpecError, "last_values"),
        ((np.float32([0, np.nan, 0]),), {}, SpecError, "finite.*nan for env 1"),
        ((np.float64([0, 0, np.inf]),), {}, SpecError, "finite.*inf for env 2"),
        ((np.zeros(3), [True, True]), {}, SpecError, r"last_dones.*shape \(3,\)"),
        ((np.zeros(3), [1, 2, 0]), {}, SpecError, "last_dones.*2.0 for env 1"),
        ((np.zeros(3), np.float32([1, 1, 0.5])), {}, SpecError, "last_dones.*0.5 for env 2"),
        ((np.zeros(3), [True, False, False]), {}, SpecError, "env 1: expected True"),
        ((np.zeros(3), [True, True, True]), {}, SpecError, "env 2: expected False"),
        ((np.zeros(3), ["a", "b", "c"]), {}, SpecError, "last_dones"),
        ((np.zeros(3),), dict(gamma=1.5), ValueError, r"gamma: expected a float in \[0, 1\], got 1.5"),
        ((np.zeros(3),), dict(gamma=float("nan")), ValueError, "gamma"),
        ((np.zeros(3),), dict(gae_lambda=-0.1), ValueError, "gae_lambda"),
        ((np.zeros(3),), dict(gae_lambda="0.9"), TypeError, "gae_lambda"),
        ((np.zeros(3),), dict(gamma=True), TypeError, "gamma"),
        ((np.zeros(3),), dict(gamma=np.array([0.9, 0.9])), TypeError, "gamma: expected a float"),
        ((np.zeros(3),), dict(gamma=np.float64(np.nan)), ValueError, "gamma"),
    ]
    for args, kw, err, match in bads:
        with pytest.raises(err, match=match):
            buf.compute_returns_and_advantages(*args, **kw)
        assert snapshot(buf) == before
    # and the good call still gives the reference (the cached discounts are right after refusals)
    buf.compute_returns_and_advantages(np.ones(3, np.float32), np.array([1, 1, 0], np.uint8))
    assert snapshot(buf) == before
    buf.compute_returns_and_advantages(np.ones(3, np.float32), gamma=0.9, gae_lambda=0.8)
    adv, _ = reference(steps, spec, np.ones(3, np.float32), 0.9, 0.8)
    assert np.array_equal(bits(buf.field("advantage")), bits(adv))
    buf.compute_returns_and_advantages(np.ones(3, np.float32))  # back to the defaults
    buf.compute_returns_and_advantages(np.ones(3, np.float32), gamma=np.float64(0.9), gae_lambda=1 - 0.2)
    adv2, _ = reference(steps, spec, np.ones(3, np.float32), 0.9, 1 - 0.2)
    assert np.array_equal(bits(buf.field("advantage")), bits(adv2))
    # a refusal of one discount caches neither: after a good gamma next to a bad lambda, that
    # gamma with the lambda in use is computed with that gamma (and the same for lambda)
    for bad, good in ((dict(gamma=0.5, gae_lambda=2.0), dict(gamma=0.5, gae_lambda=0.95)),
                      (dict(gamma=2.0, gae_lambda=0.5), dict(gamma=0.99, gae_lambda=0.5))):
        buf.compute_returns_and_advantages(np.ones(3, np.float32))  # the defaults, cached
        with pytest.raises(ValueError):
            buf.compute_returns_and_advantages(np.ones(3, np.float32), **bad)
        buf.compute_returns_and_advantages(np.ones(3, np.float32), **good)
        want, _ = reference(steps, spec, np.ones(3, np.float32), good["gamma"], good["gae_lambda"])
        assert np.array_equal(bits(buf.field("advantage")), bits(want))


def test_bad_minibatch_arguments():
    rng = np.random.default_rng(13)
    buf, _ = filled(tfdata.Spec(BASE), 6, 2, rng)
    buf.compute_returns_and_advantages(np.zeros(2, np.float32))
    before = snapshot(buf)
    for args, kw, err, match in (((5,), {}, ValueError, "n must divide the 12 rows"),
                                 ((0,), {}, ValueError, "n must be"),
                                 ((13,), {}, ValueError, "n must be"),
                                 ((2.0,), {}, TypeError, "n must be an int"),
                                 ((2,), dict(epochs=-1), ValueError, "epochs"),
                                 ((2,), dict(seed=1.0), TypeError, "seed"),
                                 ((2,), dict(seed="x"), TypeError, "seed")):
        with pytest.raises(err, match=match):
            buf.minibatches(*args, **kw)
        assert snapshot(buf) == before
    assert buf.nbytes_parts["output_rings"] == 0  # refused calls built no ring


# -- reset, state ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_reset_and_a_second_rollout(layout):
    rng = np.random.default_rng(14)
    spec = tfdata.Spec(FINAL)
    buf, _ = filled(spec, 6, 2, rng, layout)
    buf.compute_returns_and_advantages(np.zeros(2, np.float32))
    list(buf.minibatches(3, epochs=2))
    buf.reset()
    assert not buf.full and buf.steps == 0 and len(buf) == 0 and not buf.computed
    with pytest.raises(RuntimeError):
        buf.minibatches(3)
    steps = random_rollout(spec, 6, 2, rng)
    for k, s in enumerate(steps):
        buf.add(s)
        assert buf.steps == k + 1 and buf.full == (k == 5) and len(buf) == 2 * (k + 1)  # rows
    last = rng.standard_normal(2).astype(np.float32)
    buf.compute_returns_and_advantages(last)
    adv, ret = reference(steps, spec, last)
    assert np.array_equal(bits(buf.field("advantage")), bits(adv))
    assert np.array_equal(bits(buf.field("return")), bits(ret))


@pytest.mark.parametrize("src", LAYOUTS, ids=LAYOUT_IDS)
@pytest.mark.parametrize("dst", LAYOUTS, ids=LAYOUT_IDS)
def test_state_dict_round_trip_across_layouts(src, dst):
    rng = np.random.default_rng(15)
    spec = tfdata.Spec(FINAL)
    a, steps = filled(spec, 6, 2, rng, src, seed=3)
    a.compute_returns_and_advantages(np.ones(2, np.float32))
    list(a.minibatches(2))  # the own stream moved
    state = a.state_dict()
    b = RolloutBuffer(spec, num_steps=6, num_envs=2, layout=dst, seed=8)
    b.load_state_dict(state)
    assert b.full and b.computed and b.seed == 3
    for name in a.fields:
        assert a.field(name).tobytes() == b.field(name).tobytes()
    ga = [(x.indices.copy(), x["advantage"].copy()) for x in a.minibatches(4, epochs=2)]
    gb = [(x.indices.copy(), x["advantage"].copy()) for x in b.minibatches(4, epochs=2)]
    assert all(np.array_equal(i, j) and np.array_equal(u, v) for (i, u), (j, v) in zip(ga, gb))
    # a partial rollout continues
    c = RolloutBuffer(spec, num_steps=6, num_envs=2, layout=src, seed=0)
    for s in steps[:4]:
        c.add(s)
    d = RolloutBuffer(spec, num_steps=6, num_envs=2, layout=dst, seed=1)
    d.load_state_dict(c.state_dict())
    assert d.steps == 4 and not d.computed
    for s in steps[4:]:
        d.add(s)
    d.compute_returns_and_advantages(np.ones(2, np.float32))
    assert d.field("advantage").tobytes() == a.field("advantage").tobytes()


def test_hostile_states_change_nothing():
    rng = np.random.default_rng(16)
    spec = tfdata.Spec(TRUNC)
    buf, _ = filled(spec, 4, 2, rng)
    buf.compute_returns_and_advantages(np.zeros(2, np.float32))
    good = buf.state_dict()
    other, _ = filled(spec, 4, 2, rng, seed=77)
    before = snapshot(other)

    def with_(**kw):
        s = dict(good)
        s.update(kw)
        return s

    data = good["data"]
    hostile = [
        ([1, 2], TypeError, "mapping"),
        (with_(format="x"), ValueError, "format"),
        (with_(version=2), ValueError, "version"),
        (with_(version=True), ValueError, "version"),
        (with_(spec={"fields": [{"name": "x"}]}), SpecError, "spec"),
        (with_(spec=tfdata.Spec(BASE).to_dict()), SpecError, "spec"),
        (with_(spec="junk"), SpecError, "spec"),
        (with_(num_steps=5), ValueError, "num_steps"),
        (with_(num_envs=2.0), ValueError, "num_envs"),
        (with_(steps=5), ValueError, "steps"),
        (with_(steps=-1), ValueError, "steps"),
        (with_(steps=True), ValueError, "steps"),
        (with_(steps=3), ValueError, "computed"),  # computed with a partial rollout
        (with_(computed=1), ValueError, "computed"),
        (with_(rng={"seed": -1, "counter": 0}), ValueError, "seed"),
        (with_(rng={"seed": 0, "counter": 2**64}), ValueError, "counter"),
        (with_(rng={"seed": 0}), ValueError, "rng"),
        (with_(rng={"seed": 0.5, "counter": 0}), ValueError, "seed"),
        (with_(data=None), ValueError, "data"),
        (with_(data={k: v for k, v in data.items() if k != "value"}), SpecError, "'value'.*missing"),
        (with_(data=dict(data, extra=data["value"])), SpecError, "unknown field 'extra'"),
        (with_(data=dict(data, value=data["value"][:-1])), SpecError, r"'value'.*float32\(8,\)"),
        (with_(data=dict(data, value=data["value"].astype(np.float64))), SpecError, "'value'"),
        (with_(data=dict(data, obs=data["obs"].reshape(8, 2, 2))), SpecError, "'obs'"),
        (with_(data=dict(data, advantage=list(data["advantage"]))), SpecError, "'advantage'.*list"),
        (with_(steps=2, computed=False), SpecError, r"float32\(4"),  # the arrays hold 4 steps
        # more steps than the buffer holds, with arrays to match
        (with_(steps=5, computed=False, data={k: np.concatenate([v, v[:2]]) for k, v in data.items()}),
         ValueError, r"state\['steps'\]: expected an int in \[0, 4\], got 5"),
    ]
    for state, err, match in hostile:
        with pytest.raises(err, match=match):
            other.load_state_dict(state)
        assert snapshot(other) == before
    other.load_state_dict(good)
    assert snapshot(other) == snapshot(buf)


# -- memory ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_plan_equals_allocation(layout):
    spec = tfdata.Spec(WIDE)
    buf = RolloutBuffer(spec, num_steps=16, num_envs=4, layout=layout, seed=0)
    assert buf.nbytes_parts == RolloutBuffer.plan_memory(spec, 16, 4, layout=layout)
    rng = np.random.default_rng(17)
    for s in random_rollout(spec, 16, 4, rng):
        buf.add(s)
    buf.compute_returns_and_advantages(np.zeros(4, np.float32))
    list(buf.minibatches(4))
    list(buf.minibatches(8, epochs=2))
    plan = RolloutBuffer.plan_memory(spec, 16, 4, layout=layout, batch_sizes=[16, 8])
    assert buf.nbytes_parts == plan
    assert buf.nbytes == sum(plan.values())
    assert plan["output_rings"] > 0


def test_steady_state_allocates_nothing():
    """A second rollout (add, GAE, minibatches of the buffer's stream and seeded) holds no new
    memory. 512 envs: any array the size of a step's field (2 kB for float32), of a minibatch's
    column or of its row numbers would show in tracemalloc's peak (numpy reports its arrays to
    it); what remains below the bound is the interpreter's and numba's transient objects (the
    unboxing of an SoA store's tuple: about 1 kB)."""
    rng = np.random.default_rng(18)
    spec = tfdata.Spec(FINAL)
    T, E = 8, 512
    for layout in LAYOUTS:
        buf = RolloutBuffer(spec, num_steps=T, num_envs=E, layout=layout, seed=0)
        steps = random_rollout(spec, T, E, rng)
        last = np.ones(E, np.float32)
        done = stacked(steps, "terminated")[-1] | stacked(steps, "truncated")[-1]
        ptrs = {name: buf.field(name).__array_interface__["data"][0] for name in buf.fields}

        def add():
            buf.reset()
            for s in steps:
                buf.add(s)

        def gae():
            buf.compute_returns_and_advantages(last, done)

        def epochs():
            for mb in buf.minibatches(4, epochs=4):
                mb["advantage"]
            for mb in buf.minibatches(2, epochs=2, seed=1):
                mb["obs"]

        for phase in (add, gae, epochs):
            phase()  # the first rollout builds the rings
        nbytes = buf.nbytes
        for phase in (add, gae, epochs):
            tracemalloc.start()
            try:
                for _ in range(2):
                    phase()
                current, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert peak < 2048 and current < 512, (layout, phase.__name__, current, peak)
        assert buf.nbytes == nbytes
        assert {name: buf.field(name).__array_interface__["data"][0] for name in buf.fields} == ptrs


# -- gymnasium ------------------------------------------------------------------------------------


def test_from_spaces_cartpole():
    gym = pytest.importorskip("gymnasium")
    env = gym.make("CartPole-v1")
    base = tfdata.Spec.from_spaces(env.observation_space, env.action_space, next_obs=False)
    spec = tfdata.Spec(list(base.fields) + [tfdata.Field("value", "f4"), tfdata.Field("log_prob", "f4")])
    buf = RolloutBuffer(spec, num_steps=16, num_envs=1, seed=0)
    obs, _ = env.reset(seed=0)
    for _ in range(16):
        action = env.action_space.sample()
        nxt, reward, terminated, truncated, _ = env.step(action)
        buf.add({"obs": obs[None], "action": [action], "reward": [reward], "terminated": [terminated],
                 "truncated": [truncated], "value": [0.0], "log_prob": [-0.69]})
        obs = nxt
        if terminated or truncated:
            obs, _ = env.reset()
    buf.compute_returns_and_advantages(np.zeros(1))
    rewards = buf.field("reward")[:, 0].tolist()
    assert rewards == [1.0] * 16
    mb = next(iter(buf.minibatches(2, seed=0)))
    assert mb["obs"].shape == (8, 4) and mb["obs"].dtype == np.float32
    assert set(mb) == set(spec.names) | {"advantage", "return"}


@pytest.mark.parametrize("final_value", [False, True])
def test_spec_from_spaces_on_a_vector_env(final_value):
    """The spec built from a real vector env's spaces takes its steps as they come (float64
    rewards, int64 actions, bool flags) and, with ``final_value``, bootstraps truncations."""
    gym = pytest.importorskip("gymnasium")
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1", max_episode_steps=7)] * 3,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    spec = RolloutBuffer.spec_from_spaces(envs.single_observation_space, envs.single_action_space,
                                          final_value=final_value)
    names = ["obs", "action", "reward", "terminated", "truncated", "log_prob", "value"]
    assert spec.names == tuple(names + ["final_value"] * final_value)
    assert spec["obs"].shape == (4,) and spec["value"].dtype == np.float32
    buf = RolloutBuffer(spec, num_steps=10, num_envs=3, seed=0)
    obs, _ = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(10):
        action = rng.integers(0, 2, 3)
        nxt, reward, terminated, truncated, info = envs.step(action)
        step = {"obs": obs, "action": action, "reward": reward, "terminated": terminated,
                "truncated": truncated, "log_prob": np.full(3, -0.69, np.float32),
                "value": np.full(3, 2.0, np.float32)}
        if final_value:
            step["final_value"] = np.full(3, 5.0, np.float32)
        buf.add(step)
        obs = nxt
    assert buf.field("truncated").any()  # episodes of 7 steps: the time limit cut some
    buf.compute_returns_and_advantages(np.full(3, 2.0, np.float32))
    ref = naive.gae_naive(buf.field("reward"), buf.field("value"), buf.field("terminated"),
                    buf.field("truncated"), buf.field("final_value") if final_value else None,
                    np.full(3, 2.0, np.float32), 0.99, 0.95)
    np.testing.assert_array_equal(buf.field("advantage"), ref[0])
    envs.close()


def test_repr_and_exports():
    assert "RolloutBuffer" in tfdata.__all__ and tfdata.RolloutBuffer is RolloutBuffer
    buf = RolloutBuffer(BASE, num_steps=2, num_envs=2, seed=0)
    assert "2 steps x 2 envs" in repr(buf)


# -- the fast path of add -------------------------------------------------------------------------


def _variants(step, rng):
    """The same step as the PPO loop may give it: gymnasium's float64 rewards, an int32 action,
    a non-contiguous obs, flags as 0/1 ints (never the fast path: their values must be checked)."""
    obs = np.zeros((step["obs"].shape[0], 8), np.float32)
    obs[:, ::2] = step["obs"]
    out = [dict(step), dict(step, reward=step["reward"].astype(np.float64)),
           dict(step, action=step["action"].astype(np.int32), obs=obs[:, ::2]),
           dict(step, terminated=step["terminated"].astype(np.int64), truncated=step["truncated"].astype(np.uint8))]
    return out[int(rng.integers(len(out)))]


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_fast_add_writes_what_the_generic_path_writes(layout):
    import types
    rng = np.random.default_rng(11)
    spec = tfdata.Spec(FINAL)
    fast = RolloutBuffer(spec, num_steps=16, num_envs=3, layout=layout, seed=0)
    slow = RolloutBuffer(spec, num_steps=16, num_envs=3, layout=layout, seed=0)
    for rollout in range(2):
        steps = [_variants(s, rng) for s in random_rollout(spec, 16, 3, rng)]
        for s in steps:
            fast.add(s)
            slow.add(types.MappingProxyType(s))  # not a dict: always the generic path
        for f in spec:
            np.testing.assert_array_equal(fast.field(f.name), stacked(steps, f.name).astype(f.dtype))
            assert fast.field(f.name).tobytes() == slow.field(f.name).tobytes()
        fast.reset()
        slow.reset()


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_fast_add_refuses_as_the_generic_path_after_fast_calls(layout):
    rng = np.random.default_rng(12)
    spec = tfdata.Spec(TRUNC)
    buf = RolloutBuffer(spec, num_steps=8, num_envs=2, layout=layout, seed=0)
    steps = random_rollout(spec, 8, 2, rng)
    # warm every dtype the fast path may learn, and the 0/1 ints into bool it must not learn
    buf.add(dict(steps[0], reward=steps[0]["reward"].astype(np.float64)))
    buf.add(steps[1])
    buf.add(dict(steps[2], reward=steps[2]["reward"].astype(np.float64)))
    ints = dict(terminated=np.array([0, 1]), truncated=np.array([1, 0], np.uint8))
    buf.add(dict(steps[3], **ints))
    g = steps[4]
    bads = [dict(g, **dict(ints, terminated=np.array([0, 2]))),
            dict(g, **dict(ints, truncated=np.array([2, 0], np.uint8))),
            dict(g, terminated=np.array([0, 2])), dict(g, truncated=np.array([2, 0], np.uint8)),
            dict(g, action=np.array([0.5, 1.0])), dict(g, reward=np.zeros(3)),
            dict(g, reward=np.zeros((2, 1))), dict(g, obs=np.zeros((1, 4), np.float32)),
            dict(g, obs=np.zeros((2, 4), object)), dict(g, truncated=np.zeros(3, bool)),
            dict(g, truncated=[True, 2]), dict(g, extra=np.zeros(2)),
            {k: v for k, v in g.items() if k != "value"}, dict(g, value=np.float32(0))]
    for bad in bads:
        ref = RolloutBuffer(spec, num_steps=8, num_envs=2, layout=layout, seed=0)
        with pytest.raises(SpecError) as expected:
            ref.add(bad)
        before = snapshot(buf)
        with pytest.raises(SpecError) as got:
            buf.add(bad)
        assert str(got.value) == str(expected.value)
        assert snapshot(buf) == before
    for s in steps[4:]:
        buf.add(s)
    full = snapshot(buf)
    with pytest.raises(RuntimeError, match="full"):
        buf.add(steps[0])
    assert snapshot(buf) == full
