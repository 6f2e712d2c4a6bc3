"""Checkpoints: save, load, continue exactly; bounded memory; corrupt checkpoints."""

from __future__ import annotations

import json
import os
import tracemalloc

import numpy as np
import pytest

import tfdata
from tfdata.errors import FormatError

from .conftest import CARTPOLE, LAYOUTS

VARIANTS = {
    "plain": (tfdata.ReplayBuffer, {}),
    "nstep": (tfdata.ReplayBuffer, {"n_step": 3, "gamma": 0.9}),
    "elided-2env": (tfdata.ReplayBuffer, {"elide_next": True, "num_envs": 2}),
    "per": (tfdata.PrioritizedReplayBuffer, {"alpha": 0.7, "beta": 0.5, "beta_steps": 20}),
    "per-nstep": (tfdata.PrioritizedReplayBuffer, {"n_step": 2}),
}


class Streams:
    """Vector-env steps of consistent CartPole-like rows: next_obs is the next obs of its stream."""

    def __init__(self, rng, num_envs: int):
        self.rng = rng
        self.obs = rng.random((num_envs, 4)).astype(np.float32)

    def take(self, n: int) -> list:
        rng, e = self.rng, self.obs.shape[0]
        out = []
        for _ in range(n):
            nxt = rng.random((e, 4)).astype(np.float32)
            term = rng.random(e) < 0.1
            trunc = (rng.random(e) < 0.05) & ~term
            out.append({"obs": self.obs, "action": rng.integers(0, 2, e), "reward": rng.random(e).astype(np.float32),
                        "next_obs": nxt, "terminated": term, "truncated": trunc})
            self.obs = np.where((term | trunc)[:, None], rng.random((e, 4)).astype(np.float32), nxt)
        return out


def steps(rng, num_envs: int, n: int, start: int = 0) -> list:
    return Streams(rng, num_envs).take(n)


def same_future(a, b, rng_steps, per: bool) -> None:
    for i in range(6):
        m = min(5, len(a))
        x, y = a.sample(m), b.sample(m)
        np.testing.assert_array_equal(x.indices, y.indices)
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)
        if x.discounts is not None:
            np.testing.assert_array_equal(x.discounts, y.discounts)
        if per:
            np.testing.assert_array_equal(x.weights, y.weights)
            p = np.linspace(0.1, 2.0, m) * (i + 1)
            a.update_priorities(x, p)
            b.update_priorities(y, p)
        if i < len(rng_steps):
            a.extend(rng_steps[i])
            b.extend(rng_steps[i])


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("capacity,n_steps", [(2, 1), (14, 5), (14, 40), (66, 20)])
def test_save_load_continues_exactly(tmp_path, layout, variant, capacity, n_steps):
    cls, kw = VARIANTS[variant]
    num_envs = kw.get("num_envs", 1)
    rng = np.random.default_rng(capacity * 100 + n_steps)
    buf = cls(CARTPOLE, capacity, layout=layout, seed=5, **kw)
    streams = Streams(rng, num_envs)
    for s in streams.take(n_steps):
        buf.extend(s)
    buf.sample(min(3, len(buf)))  # the RNG counter (and the beta schedule) has moved
    buf.save(tmp_path / "ck")
    back = tfdata.ReplayBuffer.load(tmp_path / "ck")
    assert type(back) is cls and back.layout == layout and len(back) == len(buf)
    assert repr(back) == repr(buf)
    later = streams.take(6)
    same_future(buf, back, later, per=cls is tfdata.PrioritizedReplayBuffer)
    # and the whole state agrees after the same future
    sa, sb = buf.state_dict(), back.state_dict()
    for k in sa["data"]:
        np.testing.assert_array_equal(sa["data"][k], sb["data"][k])
    assert sa["writer"] == sb["writer"] and sa["sampler"] == sb["sampler"]


def test_a_checkpoint_loads_into_the_layout_it_was_saved_in_and_is_a_dataset(tmp_path):
    buf = tfdata.ReplayBuffer(CARTPOLE, 10, layout="soa", seed=0)
    for s in steps(np.random.default_rng(0), 1, 12, 0):
        buf.extend(s)
    buf.save(tmp_path / "ck")
    ds = tfdata.MmapDataset.open(tmp_path / "ck" / "rows")  # the rows are a plain dataset
    np.testing.assert_array_equal(ds.field("obs"), buf.state_dict()["data"]["obs"])
    state = json.loads((tmp_path / "ck" / "state.json").read_text())
    assert state["state"]["writer"] == {"cursor": 2, "size": 10}


def test_saving_again_replaces_the_checkpoint(tmp_path):
    buf = tfdata.ReplayBuffer(CARTPOLE, 10, seed=0)
    ss = steps(np.random.default_rng(0), 1, 12, 0)
    buf.extend(ss[0])
    buf.save(tmp_path / "ck")
    for s in ss[1:]:
        buf.extend(s)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        buf.save(tmp_path / "ck")
    assert len(tfdata.ReplayBuffer.load(tmp_path / "ck")) == 1
    buf.save(tmp_path / "ck", overwrite=True)
    assert len(tfdata.ReplayBuffer.load(tmp_path / "ck")) == 10
    assert sorted(os.listdir(tmp_path)) == ["ck"]


def test_save_makes_no_copy_of_the_rows(tmp_path, layout):
    # 20 MB of rows: a copy of the data (or of a field) would show in tracemalloc's peak
    buf = tfdata.ReplayBuffer(CARTPOLE, 400_000, layout=layout, seed=0)
    rows = {k: np.repeat(v, 400_000 // 1, axis=0)[:400_000] for k, v in steps(np.random.default_rng(0), 1, 1, 0)[0].items()}
    buf.extend(rows)
    tracemalloc.start()
    try:
        buf.save(tmp_path / "ck")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 0.1 * buf.nbytes + (1 << 20), (peak, buf.nbytes)


def test_load_type_check_and_corrupt_checkpoints(tmp_path):
    buf = tfdata.ReplayBuffer(CARTPOLE, 8, seed=0)
    buf.extend(steps(np.random.default_rng(0), 1, 1, 0)[0])
    buf.save(tmp_path / "ck")
    with pytest.raises(TypeError, match="not a PrioritizedReplayBuffer"):
        tfdata.PrioritizedReplayBuffer.load(tmp_path / "ck")
    doc = json.loads((tmp_path / "ck" / "state.json").read_text())

    def broken(change, match, exc=FormatError):
        d = json.loads(json.dumps(doc))
        change(d)
        (tmp_path / "ck" / "state.json").write_text(json.dumps(d))
        with pytest.raises(exc, match=match):
            tfdata.ReplayBuffer.load(tmp_path / "ck")

    broken(lambda d: d.update(version=[2, 0]), "version")
    broken(lambda d: d.update(**{"class": "os.system"}), "unknown buffer class")
    broken(lambda d: d["state"]["episodes"].update(episode={"$array": "../../etc/passwd"}), "not a file under arrays")
    broken(lambda d: d["state"]["writer"].update(size=5, cursor=5), "holds 1 rows, the state says 5")
    broken(lambda d: d["state"]["writer"].update(size=5), "writer.cursor")
    broken(lambda d: d["config"].update(capacity=0), "config.capacity")
    broken(lambda d: d.update(rows="/etc"), "rows must be")
    broken(lambda d: d["state"]["sampler"].update(counter=-1), "sampler.counter")
    (tmp_path / "ck" / "state.json").write_text(json.dumps(doc))
    assert len(tfdata.ReplayBuffer.load(tmp_path / "ck")) == 1
    os.remove(tmp_path / "ck" / "state.json")
    with pytest.raises(FileNotFoundError, match="not a tfdata checkpoint"):
        tfdata.ReplayBuffer.load(tmp_path / "ck")


# -- checkpoints written before the replay core was split into parts --------------------------
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "checkpoints")


@pytest.mark.parametrize("name", ["uniform-aos", "nstep-soa", "elided-2env-aos", "per-soa", "per-nstep-aos"])
def test_old_checkpoint_continues_the_same_samples(tmp_path, name):
    """tests/fixtures/make_checkpoints.py wrote these with the code of its commit, and recorded the
    batches each buffer drew next; today's code must load them and draw exactly those batches."""
    from .fixtures.make_checkpoints import continuation

    import shutil

    path = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), path)
    with open(os.path.join(FIXTURES, "expected.json"), encoding="utf-8") as f:
        expected = json.load(f)[name]
    buf = tfdata.ReplayBuffer.load(str(path))
    assert continuation(buf) == expected
