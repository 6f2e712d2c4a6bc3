"""experiments/sb3_buffers.py: SB3's planned Atari bytes against the arrays SB3 builds, which arms
the plan runs, the timing wrapper, the stack check catching a wrong byte, and a --quick run of the
whole experiment into a temporary reports folder (files, methodology, both arms of every study)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from . import REPO, experiment


@pytest.fixture(scope="module")
def sb():
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("torch")
    return experiment("sb3_buffers")


def test_planned_bytes_are_sb3s_arrays(sb):
    """The bytes per transition planned from shapes equal the arrays of a small SB3 buffer, with and
    without optimize_memory_usage (rows scale linearly: the plan for 1M allocates nothing)."""
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer

    obs = spaces.Box(0, 255, (4, 84, 84), np.uint8)
    for optimized in (False, True):
        rb = ReplayBuffer(100, obs, spaces.Discrete(4), device="cpu", optimize_memory_usage=optimized,
                          handle_timeout_termination=not optimized)
        assert sb.buffer_nbytes(rb) == 100 * sb.sb3_bytes_per_row(optimized)
    assert sb.sb3_bytes_per_row(False) * 1_000_000 > 56e9 and sb.sb3_bytes_per_row(True) * 1_000_000 > 28e9


def test_plan_runs_only_what_fits(sb):
    plan = sb.atari_plan("full", 24 * 2**30)
    runs = {(p["size"], p["arm"]): p["runs"] for p in plan}
    assert runs == {(1_000_000, "sb3"): False, (1_000_000, "sb3-optimized"): False, (1_000_000, "tfdata"): True,
                    (100_000, "sb3"): True, (100_000, "sb3-optimized"): True, (100_000, "tfdata"): True}
    assert all("RAM" in p["why_not"] for p in plan if not p["runs"])
    assert {p["size"] for p in sb.atari_plan("quick", 24 * 2**30)} == {100_000}


def test_timed_counts_calls_and_time(sb):
    rb = SimpleNamespace(add=lambda *a, **k: None, sample=lambda n, env=None: n)
    t = sb.Timed(rb)
    rb.add(1, 2)
    assert rb.sample(5) == 5 and rb.sample(7, env=None) == 7
    r = t.result(1.0)
    assert (r["adds"], r["samples"]) == (1, 2) and 0 <= r["buffer_share"] < 1 and r["add_us"] >= 0


class FakeBatch(SimpleNamespace):
    pass


def _torch_batch(obs, nxt, act, rew, done):
    import torch

    return FakeBatch(observations=torch.from_numpy(obs), next_observations=torch.from_numpy(nxt),
                     actions=torch.from_numpy(act), rewards=torch.from_numpy(rew), dones=torch.from_numpy(done))


def test_stack_check_catches_a_wrong_byte(sb):
    """Rows equal to what add saw pass; a changed byte in a stack, or a wrong reward, is counted."""
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 255, (2, 4, 84, 84), dtype=np.uint8)
    nxt = rng.integers(0, 255, (2, 4, 84, 84), dtype=np.uint8)
    act, rew, done = np.array([1, 3]), np.array([0.5, 1.0]), np.array([False, True])
    batch = [None]
    rb = SimpleNamespace(add=lambda *a: None, sample=lambda n, env=None: batch[0], handle_timeout_termination=True)
    chk = sb.StackCheck(rb, 2)
    rb.add(obs, nxt, act, rew, done, [{}, {"TimeLimit.truncated": False}])
    good = (obs.copy(), nxt.copy(), act.reshape(2, 1), rew.astype(np.float32).reshape(2, 1),
            done.astype(np.float32).reshape(2, 1))
    batch[0] = _torch_batch(*good)
    rb.sample(2)
    assert (chk.stack_mismatches, chk.field_mismatches, chk.rows) == (0, 0, 2)
    bad = [a.copy() for a in good]
    bad[1][1, 3, 40, 40] ^= 1
    bad[3][0, 0] = 0.25
    batch[0] = _torch_batch(*bad)
    rb.sample(2)
    assert (chk.stack_mismatches, chk.field_mismatches) == (1, 1)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """The whole experiment in quick mode (1 seed, tiny budgets, Atari 100k), every run in its own
    process, into a temporary reports folder."""
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("torch")
    pytest.importorskip("ale_py")
    out = tmp_path_factory.mktemp("reports")
    env = dict(os.environ, TFDATA_REPORTS_DIR=str(out))
    proc = subprocess.run([sys.executable, os.path.join(REPO, "experiments", "sb3_buffers.py"), "--quick"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "sb3"


def test_quick_run_writes_the_report(quick_run):
    d = quick_run
    assert {"README.md", "results.json", "learning.png", "speed.png", "atari_memory.png"} <= set(os.listdir(d))
    res = json.loads((d / "results.json").read_text())
    m = res["methodology"]
    assert m["mode"] == "quick" and m["seeds"] == [0] and m["experiment"] == "sb3"
    assert m["environment"]["cpu"]["logical_cpus"] and m["wall_clock_s"] > 0
    # no run failed: the CleanRL loop passes gymnasium's info dict to either buffer
    assert not res["failures"], [(f["task"], f["arm"], f["error"]) for f in res["failures"]]
    # both arms of every study ran (a failed run would be listed with its error, not summarised)
    for task in ("dqn-cartpole", "sac-pendulum"):
        arms = res["summary"][task]["arms"]
        assert set(arms) == {"sb3", "tfdata"}, res.get("failures")
        assert arms["tfdata"]["buffer_class"] == "tfdata.sb3.ReplayBuffer"
        assert 0 < arms["tfdata"]["buffer_share"]["mean"] < 1 and arms["sb3"]["sps"]["mean"] > 0
    assert {(r["task"], r["arm"]) for r in res["runs"] if r["study"] == "cleanrl"} == {
        ("cleanrl-dqn", "sb3"), ("cleanrl-dqn", "tfdata")}
    at = res["atari"]
    ran = {r["arm"] for r in at["rows"] if "sps" in r}
    assert ran == {"sb3", "sb3-optimized", "tfdata"} and {r["size"] for r in at["rows"]} == {100_000}
    assert all(r["planned_matches_arrays"] for r in at["rows"] if r["arm"] != "tfdata")
    for arm in ("sb3", "tfdata"):
        c = at["checks"][arm]
        assert c["rows"] > 0 and c["stack_mismatches"] == 0 and c["field_mismatches"] == 0
    text = (d / "README.md").read_text()
    for part in ("## Targets", "## SB3's DQN and SAC with either buffer", "## Atari", "## CleanRL's scripts",
                 "+from tfdata.sb3 import ReplayBuffer", "## Machine and run", "| Mode / command | quick"):
        assert part in text
    assert "<!-- hand-written" not in text
