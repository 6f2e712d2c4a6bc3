"""Minari datasets (:mod:`tfdata.datasets`): converting one into tfdata's format beside reading
it through Minari's API, and sampling 256 transitions from the converted dataset beside
Minari's ``sample_episodes`` and a numpy gather over the same arrays in memory, in the same run.

The dataset is CartPole-like (float32 observations of 4, int64 actions, float64 rewards, as
Minari's ``DataCollector`` records CartPole-v1): ``EPISODES`` episodes of ``STEPS`` steps,
written with h5py in Minari 0.5.4's layout. Needs the optional minari and h5py
(``pip install tfdata[minari]``); without them every case is skipped. asv's own environments
do not install them: run ``asv run --python=same -b bench_minari`` in one that has them.
"""

from __future__ import annotations

import json
import os

import numpy as np

from .common import tmpdir, warm_kernels

EPISODES = 400  # sample_episodes draws without replacement: more than a batch
STEPS = 250
BATCH = 256
_MANY_SAMPLES = (200, 2000, 2.0)
_CACHE: dict = {}


def _imports():
    try:
        import h5py
        import minari

        from tfdata.datasets import from_minari
    except ImportError:
        raise NotImplementedError("minari and h5py are not installed") from None
    return h5py, minari, from_minari


def _source() -> str:
    """The Minari data directory, written once per process."""
    if "src" in _CACHE:
        return _CACHE["src"]
    h5py = _imports()[0]
    top = tmpdir("minari")  # each asv process writes its own copy
    data = os.path.join(top, "data")
    os.makedirs(data)
    obs_space = {"type": "Box", "dtype": "float32", "shape": [4],
                 "low": [-4.8, -1e30, -0.42, -1e30], "high": [4.8, 1e30, 0.42, 1e30]}
    with open(os.path.join(data, "metadata.json"), "w") as f:
        json.dump({"total_episodes": EPISODES, "total_steps": EPISODES * STEPS, "data_format": "hdf5",
                   "jpeg_encoding": True, "dataset_id": "bench/cartpole-v0", "minari_version": "0.5.4",
                   "observation_space": json.dumps(obs_space),
                   "action_space": json.dumps({"type": "Discrete", "dtype": "int64", "start": 0, "n": 2})}, f)
    rng = np.random.default_rng(0)
    with h5py.File(os.path.join(data, "main_data.hdf5"), "w", track_order=True) as f:
        for i in range(EPISODES):  # as Minari writes an episode: chunked, resizable datasets
            g = f.create_group(f"episode_{i}")
            g.attrs["id"], g.attrs["total_steps"] = i, STEPS
            done = np.zeros(STEPS, bool)
            done[-1] = True
            for key, value in (("observations", rng.standard_normal((STEPS + 1, 4)).astype(np.float32)),
                               ("actions", rng.integers(0, 2, STEPS)), ("rewards", np.ones(STEPS)),
                               ("terminations", done), ("truncations", np.zeros(STEPS, bool))):
                g.create_dataset(key, data=value, chunks=True, maxshape=(None, *value.shape[1:]))
            g.create_group("infos")
    _CACHE["src"] = top
    return top


def _converted(layout: str):
    """The converted dataset, opened, once per process."""
    key = ("ds", layout)
    if key not in _CACHE:
        import tfdata

        out = os.path.join(_source(), "converted" + (".npy" if layout == "aos" else ""))
        _imports()[2](_source(), out, layout)
        _CACHE[key] = tfdata.MmapDataset.open(out)
    return _CACHE[key]


class Convert:
    """``from_minari`` of the whole dataset (``layout`` "aos" / "soa"), against reading the same
    transitions through Minari's API (``iterate_episodes``, each episode's observations split into
    ``obs`` and ``next_obs``: "minari")."""

    params = [["aos", "soa", "minari"]]
    param_names = ["layout"]
    number = 1
    repeat = (3, 10, 20.0)
    timeout = 300

    def setup(self, layout):
        _imports()
        warm_kernels()
        self.src = _source()
        self.out = os.path.join(self.src, "out" + (".npy" if layout == "aos" else ""))
        self.minari = _imports()[1].MinariDataset(os.path.join(self.src, "data"))

    def _run(self, layout):
        if layout == "minari":
            return [(ep.observations[:-1], ep.actions, ep.rewards, ep.observations[1:],
                     ep.terminations, ep.truncations) for ep in self.minari.iterate_episodes()]
        _imports()[2](self.src, self.out, layout, overwrite=True)
        return None

    def time_convert(self, layout):
        self._run(layout)

    def peakmem_convert(self, layout):
        self._run(layout)


class Sample:
    """256 transitions drawn uniformly: gathered from the converted ``MmapDataset`` ("aos",
    "soa", its page cache warm), through Minari's API ("minari": ``sample_episodes(256)``, then
    one random step of each), and a numpy fancy-index gather over the same arrays in memory
    ("numpy", the floor)."""

    params = [["aos", "soa", "minari", "numpy"]]
    param_names = ["layout"]
    repeat = _MANY_SAMPLES

    def setup(self, layout):
        _imports()
        warm_kernels()
        self.rng = np.random.default_rng(1)
        if layout == "minari":
            self.minari = _imports()[1].MinariDataset(os.path.join(_source(), "data"))
            self.minari.set_seed(1)
            return
        ds = _converted("soa" if layout == "numpy" else layout)
        self.n = len(ds)
        if layout == "numpy":
            self.arrays = {name: np.array(ds.field(name)) for name in ds.spec.names}
        else:
            self.ds, self.out = ds, ds.new_output(BATCH)
            ds.touch(0, len(ds))

    def _run(self, layout):
        if layout == "minari":
            eps = self.minari.sample_episodes(BATCH)
            picks = [(ep, int(self.rng.integers(len(ep.rewards)))) for ep in eps]
            return [(ep.observations[t], ep.actions[t], ep.rewards[t], ep.observations[t + 1],
                     ep.terminations[t], ep.truncations[t]) for ep, t in picks]
        idx = self.rng.integers(0, self.n, BATCH)
        if layout == "numpy":
            return {name: a[idx] for name, a in self.arrays.items()}
        self.ds.gather(idx, self.out)
        return self.out

    def time_sample(self, layout):
        self._run(layout)

    def peakmem_sample(self, layout):
        self._run(layout)
