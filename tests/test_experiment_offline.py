"""experiments/offline.py: the Minari dataset it writes, the bound it checks against, and a --quick run
of the whole experiment into a temporary reports folder (every study ran, the converted rows equal
Minari's transitions, the report renders again from its results.json alone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from . import REPO, experiment

pytest.importorskip("minari")
pytest.importorskip("h5py")


@pytest.fixture(scope="module")
def off():
    return experiment("offline")


def test_dataset_is_minaris_and_the_transitions_follow_episodes(off, tmp_path, monkeypatch):
    """The dataset is written by Minari and read back by it; the numpy arrays the baseline gathers
    from are its episodes' transitions (next_obs the following observation, one row per step)."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    ds = off.make_minari_dataset(str(tmp_path), 3000, seed=1)
    assert ds.total_steps == 3000
    eps = list(ds.iterate_episodes())
    assert all(off.EPISODE_LEN[0] <= len(e.rewards) <= off.EPISODE_LEN[1] for e in eps[:-1])
    assert all(bool(e.terminations[-1]) != bool(e.truncations[-1]) or len(e.rewards) < off.EPISODE_LEN[0]
               for e in eps)
    arrays = off.minari_arrays(ds)
    assert len(arrays["obs"]) == 3000
    first = eps[0]
    t = len(first.rewards)
    np.testing.assert_array_equal(arrays["next_obs"][:t - 1], arrays["obs"][1:t])
    np.testing.assert_array_equal(arrays["next_obs"][t - 1], first.observations[t])
    assert off.conversion_bound() > 4 * (16 << 20)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("reports")
    env = dict(os.environ, TFDATA_REPORTS_DIR=str(out))
    proc = subprocess.run([sys.executable, os.path.join(REPO, "experiments", "offline.py"), "--quick"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "offline"


def test_quick_run_writes_the_report(quick_run):
    d = quick_run
    assert set(os.listdir(d)) == {"README.md", "results.json", "offline.png"}  # the scratch is gone
    res = json.loads((d / "results.json").read_text())
    m = res["methodology"]
    assert m["mode"] == "quick" and m["experiment"] == "offline" and m["parameters"]["steps"] == 100_000
    s = res["summary"]
    assert s["rows_identical"] == {"aos": True, "soa": True}
    assert set(s["conversion"]) == {"aos", "soa", "minari_iterate", "minari_arrays"}
    assert all(c["wall_s"] > 0 and c["peak_growth"] >= 0 for c in s["conversion"].values())
    assert set(res["sample"]) == {"numpy", "tfdata aos", "tfdata soa", "minari"}
    for layout in ("aos", "soa"):
        assert set(res["mixed"][layout]) == {"mixed", "one buffer", "one buffer, both sources' rows",
                                            "two samples concatenated"}
        assert set(res["transform"][layout]) == {"Normalize in the sample", "sample without",
                                                 "numpy after the gather"}
        assert all(v["n"] > 0 for v in res["mixed"][layout].values())
    text = (d / "README.md").read_text()
    for part in ("## Findings", "## Conversion", "## sample(256)", "## A mixed batch", "## Normalize on sample",
                 "## Method", "## Machine and run", "| Mode / command | quick", "![offline.png](offline.png)"):
        assert part in text


def test_report_renders_again_from_results(off, quick_run, tmp_path, monkeypatch):
    monkeypatch.setattr(off, "OUT_DIR", str(tmp_path))
    off.main(["--render", str(quick_run / "results.json")])
    assert (tmp_path / "README.md").read_text() == (quick_run / "README.md").read_text()
