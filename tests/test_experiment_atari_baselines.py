"""experiments/_atari_baselines.py: the memory baselines (stable-baselines3's ReplayBuffer, a
numpy buffer of full stacks) plan the bytes their dtypes say, make them resident when filled with
real frames, and sample."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from .atari import rollout
from . import REPO, experiment

STACK = 4 * 84 * 84


@pytest.fixture(scope="module")
def ab():
    return experiment("_atari_baselines")


def _kinds(ab):
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        return ["numpy"]
    return list(ab.KINDS)


def test_planned_bytes_follow_the_dtypes(ab):
    per_row = {"numpy": 2 * STACK + 8 + 4 + 1 + 1,             # obs, next_obs, int64, f4, 2 bools
               "sb3": 2 * STACK + 8 + 4 + 4 + 4,               # SB3: action int64, reward/done/timeout f4
               "sb3-optimized": STACK + 8 + 4 + 4 + 4}         # next_obs read from the next row
    for kind in _kinds(ab):
        assert ab.planned_bytes(kind, 1_000_000) == per_row[kind] * 1_000_000, kind


# measure() in a fresh interpreter: a process forked from a test worker inherits its heap, and
# what it allocates then depends on what ran in that worker before
MEASURE = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import _atari_baselines as ab
d = dict(np.load(sys.argv[2]))
print(json.dumps(ab.measure(sys.argv[3], 400, 400, d, 5)))
"""


def test_filled_buffers_are_resident_and_sample(ab, tmp_path):
    d = rollout("Breakout", 300)
    np.savez(tmp_path / "d.npz", **{k: np.asarray(v) for k, v in d.items()})
    for kind in _kinds(ab):
        proc = subprocess.run([sys.executable, "-c", MEASURE, os.path.join(REPO, "experiments"),
                               str(tmp_path / "d.npz"), kind], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        assert r["arrays_bytes"] == ab.planned_bytes(kind, 400)
        assert r["build_rss_growth"] < 0.25 * r["arrays_bytes"]  # np.zeros: nothing resident yet
        assert r["fill_rss_growth"] > 0.8 * r["arrays_bytes"]   # every page written
        assert r["sample32_us_median"] > 0


def test_numpy_buffer_keeps_transitions(ab):
    d = rollout("Breakout", 300)
    buf = ab.NumpyStackBuffer(128)
    for i in range(200):
        ab.add("numpy", buf, d, i)
    assert len(buf) == 128 and buf.pos == 200 - 128
    assert np.array_equal(buf.obs[5], d["obs"][128 + 5]) and np.array_equal(buf.next_obs[100], d["next_obs"][100])
    s = buf.sample(32, np.random.default_rng(0))
    assert s["obs"].shape == (32, 4, 84, 84) and s["next_obs"].dtype == np.uint8
