"""A state dict or checkpoint loads only as a whole, into the sampler that saved it (issue 30).

* Every (saved sampler, loading sampler) pair: a state dict saved with one sampler loads only
  into a buffer of the same sampler; any other is refused with a message naming both, and
  changes nothing (an exactly-k or without-replacement state loaded into a uniform buffer used
  to load, dropping the pool: rows already delivered were sampled again). The same pairs for
  checkpoints, edited so that their class and config name another sampler than their state
  holds, and ``PrioritizedReplayBuffer.load`` of another sampler's checkpoint.
* Each part's state against the others': an exactly-k pool's counters against the rows held,
  a pass against the rows held (the frame stacks' and the rate limiter's in their own files).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tfdata import FormatError, PrioritizedReplayBuffer, ReplayBuffer
from tfdata.replay import core as core_mod
from .conftest import same_state

SPEC = {"id": "i8", "obs": ("f4", (3,)), "terminated": "?", "truncated": "?"}
SAMPLERS = ["uniform", "without_replacement", "exactly_k", "prioritized"]
PAIRS = [(s, t) for s in SAMPLERS for t in SAMPLERS]
PRIORITIZED_CONFIG = {"alpha": 0.6, "beta": 0.4, "beta_final": 1.0, "beta_steps": None, "eps": 1e-6}


def rows(ids) -> dict:
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 3, 1).astype(np.float32),
            "terminated": ids % 5 == 4, "truncated": np.zeros(len(ids), bool)}


def build(sampler: str, seed: int = 0, cap: int = 16):
    if sampler == "prioritized":
        return PrioritizedReplayBuffer(SPEC, cap, seed=seed)
    kw = {"replays": 2} if sampler == "exactly_k" else {}
    return ReplayBuffer(SPEC, cap, seed=seed, sampler=sampler, **kw)


def used(sampler: str, seed: int = 0):
    """A buffer of ``sampler`` whose sampler has state: rows written, some sampled."""
    b = build(sampler, seed)
    b.extend(rows(range(12)))
    b.sample(3)
    b.sample(3)
    return b



# -- state dicts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("saved, loading", PAIRS)
def test_a_state_dict_loads_only_into_its_own_sampler(saved, loading):
    a = used(saved)
    state = a.state_dict()
    b = build(loading, seed=5)
    b.extend(rows(range(100, 104)))
    if saved == loading:  # loads, and continues as the buffer it was saved from
        b.load_state_dict(state)
        for _ in range(3):
            np.testing.assert_array_equal(a.sample(4)["id"], b.sample(4)["id"])
        return
    before = b.state_dict()
    with pytest.raises(ValueError, match="sampler state") as err:
        b.load_state_dict(state)
    msg = str(err.value)
    assert f"sampling with {saved!r}" in msg and f"this buffer samples with {loading!r}" in msg, msg
    same_state(before, b.state_dict())
    np.testing.assert_array_equal(b.sample(4)["id"], build_like(loading, before).sample(4)["id"])


def build_like(sampler, state):
    b = build(sampler, seed=9)
    b.load_state_dict(state)
    return b


def test_the_issue_exactly_k_into_uniform_would_deliver_rows_again():
    a = ReplayBuffer(SPEC, 16, seed=0, sampler="exactly_k", replays=1)
    a.extend(rows(range(8)))
    delivered = set(a.sample(6)["id"].tolist())  # 6 rows delivered their one time
    u = ReplayBuffer(SPEC, 16, seed=0)
    with pytest.raises(ValueError, match="'exactly_k'.*'uniform'"):
        u.load_state_dict(a.state_dict())
    assert len(u) == 0  # before: loaded, and sampled the 6 delivered rows again
    assert delivered and a.sampler.awaiting == 2


def test_a_state_with_two_samplers_parts_is_refused():
    a = used("exactly_k")
    state = a.state_dict()
    state["without_replacement"] = used("without_replacement").state_dict()["without_replacement"]
    for b in (build("exactly_k", 3), build("without_replacement", 3), build("uniform", 3)):
        before = b.state_dict()
        with pytest.raises(ValueError, match="'without_replacement' and 'exactly_k'|'exactly_k' and "
                                             "'without_replacement'"):
            b.load_state_dict(state)
        same_state(before, b.state_dict())


def test_a_sampler_of_the_users_is_named_by_its_class():
    from tfdata.replay.samplers.uniform import UniformSampler

    class Recent(UniformSampler):
        name = None  # a sampler of the user's: no tfdata name, its class's names it

        def extra_state(self, size):
            return {"k": 3}

        def check_state(self, state, size, capacity):
            return super().check_state(state, size, capacity), state["k"]

        def load_state(self, checked):
            super().load_state(checked[0])

    mine = ReplayBuffer(SPEC, 16, sampler=Recent(0))
    mine.extend(rows(range(4)))
    assert mine.state_dict()["Recent"] == {"k": 3}  # what it keeps, under its name
    with pytest.raises(ValueError, match="'Recent'.*'uniform'"):
        build("uniform").load_state_dict(mine.state_dict())
    with pytest.raises(ValueError, match="'uniform'.*samples with 'Recent'"):
        mine.load_state_dict(used("uniform").state_dict())
    mine.load_state_dict(mine.state_dict())


# -- checkpoints ------------------------------------------------------------------------------------
def _edit(path, fn):
    doc = json.loads((path / "state.json").read_text())
    fn(doc)
    (path / "state.json").write_text(json.dumps(doc))


def _declare(loading: str):
    """An edit of a checkpoint's class and config that names ``loading`` (a valid config of it),
    leaving its state as saved."""
    def apply(doc):
        config = doc["config"]
        for k in ("sampler", "replays", "policy", "timeout", *PRIORITIZED_CONFIG):
            config.pop(k, None)
        doc["class"] = "PrioritizedReplayBuffer" if loading == "prioritized" else "ReplayBuffer"
        if loading == "prioritized":
            config.update(PRIORITIZED_CONFIG)
        elif loading == "exactly_k":
            config.update(sampler="exactly_k", replays=2, policy="block", timeout=None)
        elif loading == "without_replacement":
            config["sampler"] = loading

    return apply


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("samplers")
    out = {}
    for s in SAMPLERS:
        b = used(s)
        b.save(root / s)
        out[s] = (root / s, b)
    return out


@pytest.mark.parametrize("saved, loading", PAIRS)
def test_a_checkpoint_loads_only_its_own_samplers_state(tmp_path, checkpoints, monkeypatch, saved,
                                                        loading):
    src, original = checkpoints[saved]
    path = tmp_path / "ck"
    shutil.copytree(src, path)
    _edit(path, _declare(loading))
    if saved == loading:  # the edit changed nothing: loads and continues exactly
        b = ReplayBuffer.load(path)
        assert type(b) is type(original)
        state = original.state_dict()
        np.testing.assert_array_equal(b.sample(4)["id"], build_like(saved, state).sample(4)["id"])
        return
    built = []
    init = core_mod.ReplayCore.__init__
    monkeypatch.setattr(core_mod.ReplayCore, "__init__",
                        lambda self, *a, **kw: (built.append(1), init(self, *a, **kw))[1])
    with pytest.raises(FormatError, match=r"state\.json: state: expected the state of sampler") as err:
        ReplayBuffer.load(path)
    msg = str(err.value)
    assert f"the state of sampler {loading!r}" in msg and f"holds the state of sampler {saved!r}" in msg
    assert not built  # refused before a buffer is built


@pytest.mark.parametrize("saved", ["uniform", "without_replacement", "exactly_k"])
def test_prioritized_load_of_another_samplers_checkpoint_is_refused_before_building(
        checkpoints, monkeypatch, saved):
    path, _ = checkpoints[saved]
    built = []
    init = core_mod.ReplayCore.__init__
    monkeypatch.setattr(core_mod.ReplayCore, "__init__",
                        lambda self, *a, **kw: (built.append(1), init(self, *a, **kw))[1])
    with pytest.raises(TypeError, match=f"holds a ReplayBuffer \\(sampler {saved!r}\\), not a "
                                        f"PrioritizedReplayBuffer"):
        PrioritizedReplayBuffer.load(path)
    assert not built
    assert type(ReplayBuffer.load(checkpoints["prioritized"][0])) is PrioritizedReplayBuffer


# -- each part against the others ----------------------------------------------------------------
def _ek(cap=16, k=2, policy="drop"):
    return ReplayBuffer(SPEC, cap, seed=0, sampler="exactly_k", replays=k, policy=policy)


@pytest.mark.parametrize("fill, change, field", [
    (10, {"delivered": 3}, "delivered"),  # 10 rows held, 2 each: 20 owed = made + left
    (10, {"delivered": 0}, "delivered"),
    (10, {"lost_replays": 2}, "lost_replays"),  # not full: nothing overwritten
    (10, {"dropped": 1}, "dropped"),  # not full: nothing dropped
    (10, {"delivered": 7}, "delivered"),  # not full: more than the rows held were written
    (16, {"delivered": 1}, "delivered"),  # full: fewer than the rows held (28 < 32)
    (16, {"delivered": 6}, "delivered"),  # full: odd total with k = 2 (6 + 27 left)
    (16, {"delivered": 0}, "delivered"),  # full: fewer than the rows held were written
])
def test_exactly_k_counters_against_the_pool_and_the_rows(tmp_path, fill, change, field):
    a = _ek()
    a.extend(rows(range(fill)))
    a.sample(5)
    state = a.state_dict()
    state["exactly_k"].update(change)
    b = _ek()
    b.extend(rows(range(50, 53)))
    before = b.state_dict()
    with pytest.raises(ValueError, match=f"exactly_k.{field} = {change[field]}: expected"):
        b.load_state_dict(state)
    same_state(before, b.state_dict())
    b.load_state_dict(a.state_dict())  # the consistent state loads
    a.save(tmp_path / "ck")
    _edit(tmp_path / "ck", lambda d: d["state"]["exactly_k"].update(change))
    with pytest.raises(FormatError, match=f"state\\.exactly_k\\.{field}: expected"):
        ReplayBuffer.load(tmp_path / "ck")


def test_exactly_k_counters_of_every_policy_load_after_random_use():
    rng = np.random.default_rng(0)
    for policy in ("block", "drop", "overwrite"):
        a = _ek(8, k=3, policy=policy)
        for i in range(60):
            if rng.random() < 0.5 and (policy != "block" or a.sampler.free >= 3):
                a.extend(rows(range(i * 3, i * 3 + 3)))
            elif a.sampler.awaiting >= 2:
                a.sample(2)
            if i % 7 == 0:
                b = _ek(8, k=3, policy=policy)
                b.load_state_dict(a.state_dict())  # every reachable state is consistent


def test_a_pass_against_the_rows_held(tmp_path):
    a = ReplayBuffer(SPEC, 16, seed=0, sampler="without_replacement")
    a.extend(rows(range(6)))
    a.sample(6)  # a pass done, the next one full
    state = a.state_dict()
    assert state["without_replacement"]["passes"] == 1
    empty = ReplayBuffer(SPEC, 16, seed=0, sampler="without_replacement").state_dict()
    cases = [(dict(state, without_replacement={"undrawn": np.zeros(0, np.int64), "passes": 1}),
              "without_replacement.undrawn = 0 slots"),
             (dict(empty, without_replacement={"undrawn": np.zeros(0, np.int64), "passes": 2}),
              "without_replacement.passes = 2")]
    for bad, match in cases:
        b = ReplayBuffer(SPEC, 16, seed=1, sampler="without_replacement")
        b.extend(rows(range(9)))
        before = b.state_dict()
        with pytest.raises(ValueError, match=match):
            b.load_state_dict(bad)
        same_state(before, b.state_dict())
    a.save(tmp_path / "ck")
    undrawn = tmp_path / "ck" / json.loads((tmp_path / "ck" / "state.json").read_text())[
        "state"]["without_replacement"]["undrawn"]["$array"]
    np.save(undrawn, np.zeros(0, np.int64))
    with pytest.raises(FormatError, match=r"state\.without_replacement\.undrawn: expected at least one"):
        ReplayBuffer.load(tmp_path / "ck")
