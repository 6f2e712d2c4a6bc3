"""Minari datasets in and out (tfdata.datasets): real datasets made with Minari's DataCollector
on gymnasium environments, every converted row checked against the episodes as Minari's own
API gives them; n-step returns against a naive reference; round trips; refusals of spaces and
of hostile files built with h5py; the memory bound, in a subprocess."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

minari = pytest.importorskip("minari", reason="the minari extra (minari, h5py) is not installed")
h5py = pytest.importorskip("h5py", reason="the minari extra (minari, h5py) is not installed")
gym = pytest.importorskip("gymnasium")

import tfdata  # noqa: E402
from tfdata.datasets import from_minari, to_minari  # noqa: E402
from tfdata.datasets.minari_format import minari_space  # noqa: E402
from tfdata.errors import FormatError  # noqa: E402

GROUPS = [["obs", "next_obs"], ["action", "reward", "terminated", "truncated"], ["episode", "step"]]
LAYOUTS = ["aos", "soa", GROUPS]
LAYOUT_IDS = ["aos", "soa", "groups"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("minari_root"))
    old = os.environ.get("MINARI_DATASETS_PATH")
    os.environ["MINARI_DATASETS_PATH"] = path
    yield path
    if old is None:
        del os.environ["MINARI_DATASETS_PATH"]
    else:
        os.environ["MINARI_DATASETS_PATH"] = old


def _collect(env, episodes: int, dataset_id: str, **create):
    """A Minari dataset made by Minari's DataCollector with a random policy."""
    collector = minari.DataCollector(env, record_infos=False)
    collector.action_space.seed(0)
    for i in range(episodes):
        collector.reset(seed=i)
        done = False
        while not done:
            _, _, term, trunc, _ = collector.step(collector.action_space.sample())
            done = term or trunc
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Minari's warnings about metadata left out
        return collector.create_dataset(dataset_id, algorithm_name="random", author="tfdata tests",
                                        author_email="tests@example.org", code_permalink="https://example.org",
                                        description="a random policy", **create)


@pytest.fixture(scope="module")
def cartpole(root):
    return _collect(gym.make("CartPole-v1"), 4, "cartpole/random-v0")


@pytest.fixture(scope="module")
def pendulum(root):
    return _collect(gym.make("Pendulum-v1", max_episode_steps=25), 3, "pendulum/random-v0")


@pytest.fixture(scope="module")
def pong(root):
    ale_py = pytest.importorskip("ale_py", reason="the ALE (atari extra) is not installed")
    gym.register_envs(ale_py)
    # Atari frames: an image space, which Minari stores JPEG-encoded
    return _collect(gym.make("ALE/Pong-v5", max_episode_steps=6), 2, "pong/random-v0")


@pytest.fixture(params=["cartpole", "pendulum", "pong"])
def minari_dataset(request):
    return request.getfixturevalue(request.param)


def _out(tmp_path, layout, name="out"):
    return str(tmp_path / (name + ".npy" if layout == "aos" else name))


def _check_rows(ds, m) -> None:
    """Every row of ``ds`` against the episodes of ``m`` as Minari's API gives them."""
    r = 0
    for ep in m.iterate_episodes():
        for t in range(len(ep.rewards)):
            row = {k: ds.field(k)[r] for k in ds.spec.names}
            assert np.array_equal(row["obs"], ep.observations[t])
            assert np.array_equal(row["next_obs"], ep.observations[t + 1])
            assert np.array_equal(row["action"], ep.actions[t])
            assert row["reward"] == ep.rewards[t] and row["reward"].dtype == ep.rewards.dtype
            assert row["terminated"] == ep.terminations[t] and row["truncated"] == ep.truncations[t]
            assert row["episode"] == ep.id and row["step"] == t
            r += 1
    assert r == len(ds) == m.total_steps


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_every_row_is_minaris_transition(minari_dataset, tmp_path, layout):
    out = _out(tmp_path, layout)
    from_minari(minari_dataset, out, layout)
    with tfdata.MmapDataset.open(out) as ds:
        assert ds.spec["obs"].shape == minari_dataset.observation_space.shape
        assert ds.spec["obs"].dtype == minari_dataset.observation_space.dtype
        _check_rows(ds, minari_dataset)


def test_a_directory_path_and_a_filtered_dataset(cartpole, tmp_path):
    top = os.path.dirname(cartpole.spec.data_path)  # the directory holding data/
    from_minari(top, str(tmp_path / "a"), "soa")
    with tfdata.MmapDataset.open(str(tmp_path / "a")) as ds:
        _check_rows(ds, cartpole)
    kept = cartpole.filter_episodes(lambda ep: ep.id % 2 == 1)
    from_minari(kept, str(tmp_path / "b"), "soa")
    with tfdata.MmapDataset.open(str(tmp_path / "b")) as ds:
        assert sorted(set(ds.field("episode").tolist())) == [1, 3]
        _check_rows(ds, kept)


def test_small_chunks_split_long_episodes_the_same(pendulum, tmp_path):
    from_minari(pendulum, str(tmp_path / "whole"), "soa")
    from_minari(pendulum, str(tmp_path / "chunks"), "soa", chunk_bytes=100)  # a few rows a chunk
    with tfdata.MmapDataset.open(str(tmp_path / "whole")) as a, tfdata.MmapDataset.open(str(tmp_path / "chunks")) as b:
        for name in a.spec.names:
            assert np.array_equal(a.field(name), b.field(name))


def _naive_nstep(m, n: int, gamma: float) -> list:
    """(return, next observation, terminated, truncated, steps) of every step, over the episodes."""
    out = []
    for ep in m.iterate_episodes():
        T = len(ep.rewards)
        for t in range(T):
            ret, k = 0.0, 0
            while k < n and t + k < T:
                ret += gamma ** k * float(ep.rewards[t + k])
                k += 1
                if ep.terminations[t + k - 1] or ep.truncations[t + k - 1]:
                    break
            last = t + k - 1
            out.append((ret, ep.observations[last + 1], ep.terminations[last], ep.truncations[last], k))
    return out


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_nstep_returns_over_the_converted_rows(pendulum, cartpole, tmp_path, layout):
    for m in (pendulum, cartpole):
        out = _out(tmp_path, layout, m.spec.dataset_id.replace("/", "_"))
        from_minari(m, out, layout)
        want = _naive_nstep(m, 3, 0.9)
        with tfdata.MmapDataset.open(out) as ds:
            buf = tfdata.ReplayBuffer(ds.spec, len(ds), n_step=3, gamma=0.9, seed=3, layout=layout)
            buf.extend(ds.rows(0, len(ds)))
            batch = buf.sample(min(256, len(ds)))
            for i, idx in enumerate(batch.indices.tolist()):
                ret, nxt, term, trunc, k = want[idx]
                assert batch["reward"][i] == pytest.approx(ret, rel=1e-6)
                assert np.array_equal(batch["next_obs"][i], nxt)
                assert batch["terminated"][i] == term and batch["truncated"][i] == trunc
                assert batch.discounts[i] == pytest.approx(0.9 ** k, rel=1e-6)


def _same_episodes(a, b) -> None:
    assert a.total_episodes == b.total_episodes
    for x, y in zip(a.iterate_episodes(), b.iterate_episodes()):
        for k in ("observations", "actions", "rewards", "terminations", "truncations"):
            assert np.array_equal(getattr(x, k), getattr(y, k)), k
            assert getattr(x, k).dtype == getattr(y, k).dtype, k


@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_to_minari_of_from_minari_has_the_same_episodes(minari_dataset, tmp_path, layout):
    out = _out(tmp_path, layout)
    from_minari(minari_dataset, out, layout)
    new_id = minari_dataset.spec.dataset_id.replace("-v0", f"-{LAYOUT_IDS[LAYOUTS.index(layout)]}-v0")
    with tfdata.MmapDataset.open(out) as ds, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        back = to_minari(ds, new_id, observation_space=minari_dataset.observation_space,
                         action_space=minari_dataset.action_space)
    again = minari.load_dataset(new_id)
    _same_episodes(minari_dataset, again)
    assert back.total_steps == minari_dataset.total_steps
    if layout != "aos":  # the metadata kept in the manifest goes back into Minari's
        assert again.storage.metadata["author"] == {"tfdata tests"}
        assert again.storage.metadata["algorithm_name"] == "random"


def _random_transitions(rng, lengths, obs_shape=(3,), last_open=False) -> dict:
    """Episodes of the given lengths as rows whose next_obs is the next row's obs."""
    cols = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "episode", "step")}
    for e, T in enumerate(lengths):
        obs = rng.standard_normal((T + 1, *obs_shape)).astype(np.float32)
        obs[0, 0] = np.nan  # a NaN is a value, kept bit for bit
        cols["obs"].append(obs[:-1])
        cols["next_obs"].append(obs[1:])
        cols["action"].append(rng.integers(0, 4, T))
        cols["reward"].append(rng.standard_normal(T).astype(np.float32))
        end = np.zeros(T, bool)
        if not (last_open and e == len(lengths) - 1):
            end[-1] = True
        split = bool(rng.random() < 0.5)
        cols["terminated"].append(end & split)
        cols["truncated"].append(end & (not split))
        cols["episode"].append(np.full(T, e, np.int64))
        cols["step"].append(np.arange(T, dtype=np.int64))
    return {k: np.concatenate(v) for k, v in cols.items()}


def _spaces(obs_shape=(3,)):
    return dict(observation_space=gym.spaces.Box(-np.inf, np.inf, obs_shape, np.float32),
                action_space=gym.spaces.Discrete(4))


@pytest.mark.parametrize("chunk_bytes", [16 << 20, 100])  # 100: episodes across chunks
@pytest.mark.parametrize("with_ids", [True, False])
def test_from_minari_of_to_minari_is_the_same_rows(root, tmp_path, with_ids, chunk_bytes):
    rng = np.random.default_rng(7)
    cols = _random_transitions(rng, [5, 1, 9, 3], last_open=not with_ids)
    if not with_ids:
        cols = {k: v for k, v in cols.items() if k not in ("episode", "step")}
    src = tfdata.ArrayDataset(cols)
    dsid = f"rt/ids{int(with_ids)}-c{chunk_bytes}-v0"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        to_minari(src, dsid, chunk_bytes=chunk_bytes, **_spaces())
    out = str(tmp_path / "back")
    from_minari(minari.load_dataset(dsid), out, "soa")
    with tfdata.MmapDataset.open(out) as ds:
        assert len(ds) == len(src)
        for name in src.spec.names:
            a, b = src.field(name), ds.field(name)
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), name


def test_to_minari_of_a_replay_buffer_in_stream_order(root, tmp_path):
    rng = np.random.default_rng(3)
    cols = _random_transitions(rng, [4, 6, 5, 7])  # 22 rows into a ring of 16: the oldest are gone
    cols = {k: v for k, v in cols.items() if k not in ("episode", "step")}
    buf = tfdata.ReplayBuffer({k: (v.dtype, v.shape[1:]) for k, v in cols.items()}, 16)
    buf.extend(cols)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = to_minari(buf, "rt/buffer-v0", **_spaces())
    kept = {k: v[-16:] for k, v in cols.items()}  # rows 6.. in stream order: the second episode's tail
    eps = list(m.iterate_episodes())
    assert [len(e.rewards) for e in eps] == [4, 5, 7]
    r = 0
    for e in eps:
        T = len(e.rewards)
        assert np.array_equal(e.observations[:-1], kept["obs"][r:r + T], equal_nan=True)
        assert np.array_equal(e.observations[-1], kept["next_obs"][r + T - 1], equal_nan=True)
        assert np.array_equal(e.actions, kept["action"][r:r + T])
        r += T


def test_metadata_kept_in_the_manifest(pong, cartpole, tmp_path):
    for m in (cartpole, pong):
        out = str(tmp_path / m.spec.dataset_id.replace("/", "_"))
        from_minari(m, out, "soa")
        raw = json.load(open(os.path.join(m.spec.data_path, "metadata.json")))
        with tfdata.MmapDataset.open(out) as ds:
            meta = ds.metadata
            for key in ("dataset_id", "env_spec", "algorithm_name", "code_permalink", "minari_version",
                        "total_episodes", "total_steps", "data_format"):
                assert meta[key] == raw[key], key
            assert list(meta["author"]) == raw["author"] and list(meta["author_email"]) == raw["author_email"]
            with pytest.raises(TypeError):
                meta["author"] = "someone else"  # read-only
            space = minari_space(meta["observation_space"])
            assert space == m.observation_space  # an image space's bounds kept as scalars
    from_minari(cartpole, str(tmp_path / "c.npy"), "aos")
    with tfdata.MmapDataset.open(str(tmp_path / "c.npy")) as ds:
        assert dict(ds.metadata) == {}  # an AoS file has no manifest


# -- refusals --------------------------------------------------------------------------------


class _DictObs(gym.ObservationWrapper):
    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gym.spaces.Dict({"state": env.observation_space})

    def observation(self, obs):
        return {"state": obs}


def test_a_dict_space_is_refused_naming_it(root, tmp_path):
    m = _collect(_DictObs(gym.make("CartPole-v1")), 2, "dict/random-v0")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError, match="observation space is a Dict space.*Box, Discrete"):
        from_minari(m, str(tmp_path / "out"), "soa")
    assert sorted(os.listdir(tmp_path)) == before


def _write_minari(data_dir, episodes, meta=None, *, obs_chunks=True):
    """A Minari hdf5 dataset written with h5py directly, as Minari 0.5.4 lays it out."""
    os.makedirs(data_dir, exist_ok=True)
    obs_shape = episodes[0]["observations"].shape[1:]
    doc = {"total_episodes": len(episodes), "total_steps": sum(len(e["rewards"]) for e in episodes),
           "data_format": "hdf5", "jpeg_encoding": True, "dataset_id": "h5/made-v0",
           "observation_space": json.dumps({"type": "Box", "dtype": "float32", "shape": list(obs_shape),
                                            "low": (-np.ones(obs_shape)).tolist(), "high": np.ones(obs_shape).tolist()}),
           "action_space": json.dumps({"type": "Discrete", "dtype": "int64", "start": 0, "n": 2})}
    doc.update(meta or {})
    with open(os.path.join(data_dir, "metadata.json"), "w") as f:
        json.dump(doc, f)
    with h5py.File(os.path.join(data_dir, "main_data.hdf5"), "w") as f:
        for i, ep in enumerate(episodes):
            g = f.create_group(f"episode_{i}")
            g.attrs["id"] = i
            for k, v in ep.items():
                g.create_dataset(k, data=v, chunks=True if obs_chunks else None)
            g.create_group("infos")


def _episodes(rng, lengths, obs_shape=(4,)):
    return [{"observations": rng.standard_normal((T + 1, *obs_shape)).astype(np.float32),
             "actions": rng.integers(0, 2, T), "rewards": rng.standard_normal(T),
             "terminations": np.arange(T) == T - 1, "truncations": np.zeros(T, bool)} for T in lengths]


def _mutations():
    """(name, change(data_dir), field the message must name)."""

    def h5(fn):
        def change(d):
            with h5py.File(os.path.join(d, "main_data.hdf5"), "a") as f:
                fn(f)
        return change

    def replace(key, value, episode=1):
        def fn(f):
            del f[f"episode_{episode}/{key}"]
            f[f"episode_{episode}"].create_dataset(key, data=value)
        return h5(fn)

    def meta(text):
        def change(d):
            with open(os.path.join(d, "metadata.json"), "w") as f:
                f.write(text)
        return change

    def truncate(d):
        p = os.path.join(d, "main_data.hdf5")
        size = os.path.getsize(p)
        with open(p, "r+b") as f:
            f.truncate(size // 2)

    def not_hdf5(d):
        with open(os.path.join(d, "main_data.hdf5"), "wb") as f:
            f.write(b"this is not HDF5" * 100)

    def external(f):
        del f["episode_1/actions"]
        f["episode_1/actions"] = h5py.ExternalLink("/etc/hostname", "/x")

    def soft(f):
        del f["episode_1/rewards"]
        f["episode_1/rewards"] = h5py.SoftLink("/episode_0/rewards")

    def episode_is_dataset(f):
        del f["episode_1"]
        f.create_dataset("episode_1", data=np.zeros(3))

    def big_chunks(f):
        del f["episode_1/observations"]
        f["episode_1"].create_dataset("observations", shape=(7, 4), dtype="f4", maxshape=(None, 4),
                                      chunks=(1 << 21, 4))

    def sparse(f):  # a huge declared shape over storage never written (chunked, contiguous)
        del f["episode_1/observations"], f["episode_2/observations"]
        f["episode_1"].create_dataset("observations", shape=(7 << 20, 4), dtype="f4", chunks=(4096, 4))
        f["episode_2"].create_dataset("observations", shape=(7 << 20, 4), dtype="f4")

    def long_episode(f):  # 40 steps written: more than the 15 the metadata counts in all
        for k in ("actions", "rewards", "terminations", "truncations", "observations"):
            del f[f"episode_1/{k}"]
        g = f["episode_1"]
        g["observations"], g["actions"] = np.zeros((41, 4), np.float32), np.zeros(40, np.int64)
        g["rewards"], g["terminations"], g["truncations"] = np.zeros(40), np.zeros(40, bool), np.zeros(40, bool)

    def edit_meta(**changes):  # the metadata as written, with some entries changed
        def change(d):
            path = os.path.join(d, "metadata.json")
            with open(path) as f:
                doc = json.load(f)
            doc.update(changes)
            with open(path, "w") as f:
                json.dump(doc, f)
        return change

    def flags_of_two(f):  # in every episode: the first episode's dtype is the same int8
        for i in range(3):
            flags = np.zeros(f[f"episode_{i}/terminations"].shape[0], np.int8)
            flags[-1] = 2
            del f[f"episode_{i}/terminations"]
            f[f"episode_{i}"].create_dataset("terminations", data=flags)

    sparse_steps = 1 << 17  # 2 MiB of observations declared, none stored

    def sparse_consistent(f):  # every dataset of the episode declared, of consistent shapes
        g = f["episode_1"]
        for k in ("actions", "rewards", "terminations", "truncations", "observations"):
            del g[k]
        g.create_dataset("observations", shape=(sparse_steps + 1, 4), dtype="f4", chunks=(4096, 4))
        for k, dt in (("actions", "i8"), ("rewards", "f8"), ("terminations", "?"), ("truncations", "?")):
            g.create_dataset(k, shape=(sparse_steps,), dtype=dt, chunks=(4096,))

    def sparse_everywhere(d):
        h5(sparse_consistent)(d)
        edit_meta(total_steps=4 + sparse_steps + 5)(d)

    box5 = json.dumps({"type": "Box", "dtype": "float32", "shape": [5], "low": [-1.0] * 5, "high": [1.0] * 5})
    compound = np.zeros(6, dtype=[("a", "f4"), ("b", "i4")])
    return [
        ("observations not of the space's shape", edit_meta(observation_space=box5), "episode_0/observations"),
        ("other observation dtype", replace("observations", np.zeros((7, 4), np.float64)), "episode_1/observations"),
        ("other action dtype", replace("actions", np.zeros(6, np.int32)), "episode_1/actions"),
        ("flags of 2 in every episode", h5(flags_of_two), "episode_0/terminations"),
        ("sparse dataset of consistent shapes", sparse_everywhere, "episode_1/observations"),
        ("total_episodes not an int", edit_meta(total_episodes="3"), "total_episodes"),
        ("jpeg_encoding not a bool", edit_meta(jpeg_encoding="false"), "jpeg_encoding"),
        ("truncated", truncate, "main_data.hdf5"),
        ("not hdf5", not_hdf5, "main_data.hdf5"),
        ("missing observations", h5(lambda f: f["episode_1"].__delitem__("observations")), "episode_1/observations"),
        ("missing truncations", h5(lambda f: f["episode_1"].__delitem__("truncations")), "episode_1/truncations"),
        ("missing episode", h5(lambda f: f.__delitem__("episode_2")), "episode_2"),
        ("observations not T+1", replace("observations", np.zeros((6, 4), np.float32)), "episode_1/observations"),
        ("rewards longer than actions", replace("rewards", np.zeros(9)), "episode_1/rewards"),
        ("string actions", replace("actions", np.array([b"left"] * 6)), "episode_1/actions"),
        ("compound rewards", replace("rewards", compound), "episode_1/rewards"),
        ("other observation shape", replace("observations", np.zeros((7, 5), np.float32)), "episode_1/observations"),
        ("flags of 2", replace("terminations", np.full(6, 2, np.int8)), "episode_1/terminations"),
        ("external link", h5(external), "episode_1/actions"),
        ("soft link", h5(soft), "episode_1/rewards"),
        ("episode is a dataset", h5(episode_is_dataset), "episode_1"),
        ("absurd chunks", h5(big_chunks), "episode_1/observations"),
        ("sparse huge dataset", h5(sparse), "episode_1/observations"),
        ("steps beyond the metadata's", h5(long_episode), "more than the 15 the metadata counts"),
        ("huge metadata", meta("[" + "0," * (9 << 20) + "0]"), "metadata.json"),
        ("malformed metadata", meta('{"total_episodes": 3,'), "metadata.json"),
        ("metadata not an object", meta("[1, 2]"), "metadata.json"),
        ("total_steps wrong", meta(json.dumps({"total_episodes": 3, "total_steps": 99, "data_format": "hdf5"})),
         "total_steps"),
        ("space not serialized", meta(json.dumps({"total_episodes": 3, "observation_space": "{"})),
         "observation_space"),
    ]


@pytest.mark.parametrize("name,change,field", _mutations(), ids=[m[0] for m in _mutations()])
def test_hostile_files_are_refused_and_leave_nothing(tmp_path, name, change, field):
    data = str(tmp_path / "src" / "data")
    _write_minari(data, _episodes(np.random.default_rng(0), [4, 6, 5]))
    change(data)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    tfdata.io.save(str(out_dir / "old"), {"x": np.arange(3)}, "soa")  # an existing dataset
    before = {p: open(os.path.join(r, p), "rb").read() for r, _, fs in os.walk(out_dir) for p in fs}
    for target, overwrite in ((out_dir / "new", False), (out_dir / "old", True)):
        with pytest.raises(FormatError) as info:
            from_minari(os.path.dirname(data), str(target), "soa", overwrite=overwrite)
        msg = str(info.value)
        assert field in msg, msg
        assert ("metadata.json" in msg) or ("main_data.hdf5" in msg), msg
    after = {p: open(os.path.join(r, p), "rb").read() for r, _, fs in os.walk(out_dir) for p in fs}
    assert after == before and sorted(os.listdir(out_dir)) == ["old"]


def test_an_arrow_dataset_is_refused_saying_how_to_convert(tmp_path):
    data = str(tmp_path / "src" / "data")
    _write_minari(data, _episodes(np.random.default_rng(0), [3]), {"data_format": "arrow"})
    with pytest.raises(NotImplementedError, match="arrow.*hdf5.*create_dataset_from_buffers"):
        from_minari(data, str(tmp_path / "out"), "soa")
    assert not os.path.exists(tmp_path / "out")


def test_to_minari_refusals_change_nothing(root, tmp_path):
    rng = np.random.default_rng(1)
    cols = _random_transitions(rng, [3, 4])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        to_minari(tfdata.ArrayDataset(cols), "refuse/taken-v0", **_spaces())
    taken = os.path.join(root, "refuse", "taken-v0")
    before = {os.path.join(r, f): open(os.path.join(r, f), "rb").read() for r, _, fs in os.walk(taken) for f in fs}
    broken = dict(cols, next_obs=cols["next_obs"].copy())
    broken["next_obs"][1, 0] += 1
    ends_inside = dict(cols, terminated=cols["terminated"].copy())
    ends_inside["terminated"][1] = True  # row 1 ends an episode that rows 2.. continue
    steps_jump = dict(cols, step=cols["step"].copy())
    steps_jump["step"][5] += 3
    cases = [
        ("refuse/g-v0", tfdata.ArrayDataset(ends_inside), _spaces(), "row 1 ends an episode"),
        ("refuse/h-v0", tfdata.ArrayDataset(steps_jump), _spaces(), "rows 4 and 5 of one episode"),
        ("refuse/taken-v0", tfdata.ArrayDataset(cols), _spaces(), "exists"),
        ("refuse/a-v0", tfdata.ArrayDataset(dict(cols, extra=np.zeros(7))), _spaces(), "extra"),
        ("refuse/b-v0", tfdata.ArrayDataset({k: v for k, v in cols.items() if k != "reward"}), _spaces(), "reward"),
        ("refuse/c-v0", tfdata.ArrayDataset(broken), _spaces(), "next_obs of row 1 is not the obs of row 2"),
        ("refuse/d-v0", tfdata.ArrayDataset(cols), _spaces((5,)), "observation space"),
        ("refuse/e-v0", tfdata.ArrayDataset(cols), {}, "observation_space"),
        ("refuse/i-v0", tfdata.ArrayDataset(cols),
         dict(_spaces(), observation_space=gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)),
         "field 'obs' is float32.*observation space"),
        ("refuse/j-v0", tfdata.ArrayDataset(dict(cols, terminated=cols["terminated"].astype(np.float32))),
         _spaces(), "field 'terminated'"),
        ("refuse/k-v0", tfdata.ArrayDataset(dict(cols, truncated=np.stack([cols["truncated"]] * 2, 1))),
         _spaces(), "field 'truncated'"),
    ]
    for dsid, src, spaces, match in cases:
        with pytest.raises(ValueError, match=match):
            to_minari(src, dsid, **spaces)
        if dsid != "refuse/taken-v0":
            assert not os.path.exists(os.path.join(root, *dsid.split("/")))
    buf = tfdata.ReplayBuffer({k: (v.dtype, v.shape[1:]) for k, v in cols.items()}, 8, num_envs=2)
    with pytest.raises(NotImplementedError, match="num_envs=2"):
        to_minari(buf, "refuse/f-v0", **_spaces())
    after = {os.path.join(r, f): open(os.path.join(r, f), "rb").read() for r, _, fs in os.walk(taken) for f in fs}
    assert after == before


@pytest.mark.parametrize("with_ids", [True, False])
@pytest.mark.parametrize("rows_a_chunk", [None, 1, 2, 3])
def test_to_minari_refusals_do_not_depend_on_the_chunks(root, with_ids, rows_a_chunk):
    """A row that ends an episode its next row continues, and steps that jump inside an
    episode, are refused wherever the chunks of rows read fall (here: rows 0-1 | 2-3 with two
    rows a chunk)."""
    cols = _random_transitions(np.random.default_rng(5), [4, 3])
    if not with_ids:
        cols = {k: v for k, v in cols.items() if k != "episode"}
    ends_inside = dict(cols, terminated=cols["terminated"].copy())
    ends_inside["terminated"][1] = True  # ids: episode 0 goes on at row 2
    steps_jump = dict(cols, step=cols["step"].copy())
    steps_jump["step"][2:4] += 3  # episode 0's rows 1 and 2: steps 1 and 5
    cases = [(steps_jump, "rows 1 and 2 of one episode have steps 1 and 5")]
    if with_ids:
        cases.append((ends_inside, "row 1 ends an episode"))
    for i, (src, match) in enumerate(cases):
        ds = tfdata.ArrayDataset(src)
        chunk_bytes = 16 << 20 if rows_a_chunk is None else rows_a_chunk * ds.spec.row_nbytes
        dsid = f"chunks/r{rows_a_chunk}-i{int(with_ids)}-{i}-v0"
        with pytest.raises(ValueError, match=match):
            to_minari(ds, dsid, chunk_bytes=chunk_bytes, **_spaces())
        assert not os.path.exists(os.path.join(root, *dsid.split("/")))


def test_to_minari_arguments_take_precedence_over_the_sources_metadata(cartpole, tmp_path):
    out = str(tmp_path / "c")
    from_minari(cartpole, out, "soa")  # its manifest keeps Minari's metadata
    with tfdata.MmapDataset.open(out) as ds, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        to_minari(ds, "cartpole/given-v0", observation_space=cartpole.observation_space,
                  action_space=cartpole.action_space, author="someone else", description="given")
    meta = minari.load_dataset("cartpole/given-v0").storage.metadata
    assert meta["author"] == {"someone else"} and meta["description"] == "given"
    assert meta["algorithm_name"] == "random" and meta["author_email"] == {"tests@example.org"}


def _jpeg_frames(frames, mode: str) -> list:
    from PIL import Image

    out = []
    for fr in frames:
        b = io.BytesIO()
        Image.fromarray(fr, mode).save(b, format="JPEG", quality=95)
        out.append(np.frombuffer(b.getvalue(), np.uint8))
    return out


@pytest.mark.parametrize("kind", ["same frame", "L frame of as many pixels", "L frame of the same size"])
def test_jpeg_frames_of_another_size_or_mode_are_refused(tmp_path, kind):
    """An image space is stored JPEG-encoded: a frame is checked for the space's size and mode
    before its pixels are used, even when its pixel count fits the space's shape."""
    pytest.importorskip("PIL")
    rng = np.random.default_rng(2)
    shape = (32, 32, 3)
    enc = _jpeg_frames(rng.integers(0, 256, (4, *shape), dtype=np.uint8), "RGB")
    if kind == "L frame of as many pixels":  # 32 wide, 96 high: 32 * 32 * 3 values
        enc[2] = _jpeg_frames(rng.integers(0, 256, (1, 96, 32), dtype=np.uint8), "L")[0]
    elif kind == "L frame of the same size":
        enc[2] = _jpeg_frames(rng.integers(0, 256, (1, 32, 32), dtype=np.uint8), "L")[0]
    data = str(tmp_path / "src" / "data")
    os.makedirs(data)
    space = {"type": "Box", "dtype": "uint8", "shape": list(shape), "low": np.zeros(shape).tolist(),
             "high": np.full(shape, 255.0).tolist()}
    with open(os.path.join(data, "metadata.json"), "w") as f:
        json.dump({"total_episodes": 1, "total_steps": 3, "data_format": "hdf5", "jpeg_encoding": True,
                   "observation_space": json.dumps(space),
                   "action_space": json.dumps({"type": "Discrete", "dtype": "int64", "start": 0, "n": 2})}, f)
    with h5py.File(os.path.join(data, "main_data.hdf5"), "w") as f:
        g = f.create_group("episode_0")
        obs = g.create_dataset("observations", (4,), dtype=h5py.vlen_dtype(np.uint8))
        for i, e in enumerate(enc):
            obs[i] = e
        g["actions"], g["rewards"] = np.zeros(3, np.int64), np.zeros(3)
        g["terminations"], g["truncations"] = np.arange(3) == 2, np.zeros(3, bool)
        g.create_group("infos")
    out = str(tmp_path / "out")
    if kind == "same frame":
        from_minari(data, out, "soa")
        with tfdata.MmapDataset.open(out) as ds:
            assert ds.spec["obs"].shape == shape and len(ds) == 3
        return
    with pytest.raises(FormatError, match="episode_0/observations: row 2: .*expected RGB of 32x32"):
        from_minari(data, out, "soa")
    assert not os.path.exists(out)


# -- memory ----------------------------------------------------------------------------------

_MEMORY = """
import json, os, sys, numpy as np, h5py
sys.path.insert(0, {root!r})
from tfdata.datasets import from_minari
from tfdata.datasets import minari_format as mf
top, chunk = sys.argv[1], int(sys.argv[2])

def write(d, steps, width):
    os.makedirs(d)
    obs = json.dumps({{"type": "Box", "dtype": "float32", "shape": [width], "low": -1.0, "high": 1.0}})
    with open(os.path.join(d, "metadata.json"), "w") as f:
        json.dump({{"total_episodes": 1, "total_steps": steps, "data_format": "hdf5",
                   "observation_space": obs, "action_space": json.dumps({{"type": "Discrete", "n": 2, "start": 0}})}}, f)
    with h5py.File(os.path.join(d, "main_data.hdf5"), "w") as f:
        g = f.create_group("episode_0")
        o = g.create_dataset("observations", (steps + 1, width), "f4", chunks=(min(4096, steps + 1), width))
        for s in range(0, steps + 1, 1 << 16):  # written in pieces: the writer stays small too
            e = min(steps + 1, s + (1 << 16))
            o[s:e] = np.arange(s, e, dtype=np.float32)[:, None]
        for k, dt in (("actions", "i8"), ("rewards", "f8"), ("terminations", "?"), ("truncations", "?")):
            g.create_dataset(k, data=np.zeros(steps, dt), chunks=(min(1 << 16, steps),))

write(top + "/small", 1000, 64)
write(top + "/big", {steps}, 64)
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

from_minari(top + "/small", top + "/small.npy", chunk_bytes=chunk)  # imports and compiled checks
base = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:  # the high-water mark from here on (Linux >= 4.0)
    f.write("5")
from_minari(top + "/big", top + "/big.npy", chunk_bytes=int(sys.argv[3]) if len(sys.argv) > 3 else chunk)
peak = status("VmHWM")
size = os.path.getsize(top + "/big.npy")
print(json.dumps({{"growth": peak - base, "bound": 4 * chunk + 2 * mf.MAX_H5_CHUNK + mf.H5_CACHE,
                  "input": os.path.getsize(top + "/big/main_data.hdf5"), "output": size}}))
"""


def _memory_run(tmp_path, steps: int, *chunks) -> dict:
    code = textwrap.dedent(_MEMORY.format(root=ROOT, steps=steps))
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path), *map(str, chunks)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's clear_refs")
def test_resident_memory_stays_within_the_stated_bound(tmp_path):
    steps = 400_000  # 100 MB of observations in, 220 MB of transitions out
    r = _memory_run(tmp_path, steps, 1 << 20)
    assert r["input"] > 2 * r["bound"] and r["output"] > 4 * r["bound"]  # larger than the bound
    assert r["growth"] <= r["bound"], r
    with tfdata.MmapDataset.open(str(tmp_path / "big.npy")) as ds:  # and the rows are right
        assert len(ds) == steps
        idx = np.array([0, 1, steps // 2, steps - 1])
        assert np.array_equal(ds.field("obs")[idx, 0], idx.astype(np.float32))
        assert np.array_equal(ds.field("next_obs")[idx, 5], (idx + 1).astype(np.float32))


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's clear_refs")
def test_the_memory_measure_sees_a_whole_episode_read_at_once(tmp_path):
    # the same run with chunks of the whole episode: the measure must see it exceed the bound
    r = _memory_run(tmp_path, 400_000, 1 << 20, 1 << 30)
    assert r["growth"] > r["bound"], r
