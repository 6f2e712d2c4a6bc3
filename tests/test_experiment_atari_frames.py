"""experiments/atari_frames.py: its references (the numpy ring of full stacks and its n-step
windows), the comparison that must catch a wrong byte, the repeated real block that must stay a
continuous stream, the memory bookkeeping, and a smoke run of the whole experiment on real
(tiny) Atari streams."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tfdata

from .atari import rollout
from . import experiment



@pytest.fixture(scope="module")
def af():
    pytest.importorskip("zstandard", reason="the compress extra")
    return experiment("atari_frames")


def test_exactness_run_compares_real_streams(af):
    """One and two environments, a truncating stream, rings that wrap: every comparison equal,
    and comparisons of every kind actually made."""
    for d, E, cap in ((rollout("Breakout", 300), 1, 40), (rollout("Pong", 150, num_envs=2), 2, 48)):
        rows = af.rows_of(d, E)
        r = af.exactness_run(rows, E, cap, checks=20, seed=0)
        assert r["rows_written"] == len(rows["action"]) and r["wraps"] > 3
        assert r["episode_ends"] > 0
        for k in ("uniform", "n_step", "prioritized"):
            assert r[k]["mismatches"] == 0, r[k]["first_mismatches"]
            assert r[k]["batches"] >= 20 and r[k]["rows"] == r[k]["batches"] * af.BATCH
        if E == 1:
            assert r["pushes"] > 0 and r["extends"] > 0
    assert rollout("Pong", 150, num_envs=2)["truncated"].any()


def test_a_wrong_reference_is_caught(af, monkeypatch):
    """The comparisons are not vacuous: a reference that gives a row's next frame one step late
    (a classic frame-stack bug), or one n-step reward too many, shows up as mismatches."""
    d = rollout("Breakout", 200)
    rows = af.rows_of(d, 1)
    real_gather, real_nstep = af.NaiveRing.gather, af.NaiveRing.nstep

    def late(self, idx):
        out = real_gather(self, idx)
        out["next_obs"] = out["obs"].copy()
        return out
    monkeypatch.setattr(af.NaiveRing, "gather", late)
    r = af.exactness_run(rows, 1, 64, checks=5, seed=0)
    assert r["uniform"]["mismatches"] > 0 and r["prioritized"]["mismatches"] > 0
    assert r["uniform"]["first_mismatches"][0]["field"] == "next_obs"
    monkeypatch.setattr(af.NaiveRing, "gather", real_gather)
    monkeypatch.setattr(af.NaiveRing, "nstep", lambda self, idx, n, g: real_nstep(self, idx, n + 1, g))
    r = af.exactness_run(rows, 1, 64, checks=5, seed=0)
    assert r["n_step"]["mismatches"] > 0 and r["uniform"]["mismatches"] == 0


def test_tally_names_the_field_and_rows(af):
    t = af.Tally()
    a = {"obs": np.zeros((4, 2, 3), np.uint8), "reward": np.ones(4, np.float32)}
    b = {"obs": a["obs"].copy(), "reward": a["reward"].copy()}
    t.same("here", a, b, ("obs", "reward"))
    assert t.mismatches == [] and t.batches == 1 and t.rows == 4
    b["obs"][2, 1, 1] = 1
    b["reward"] = b["reward"].astype(np.float64)  # same values, another dtype: a mismatch too
    t.same("there", a, b, ("obs", "reward"))
    assert t.mismatches == [{"where": "there", "field": "obs", "rows": [2]},
                            {"where": "there", "field": "reward", "rows": "shape/dtype"}]


def test_naive_nstep_windows(af):
    """Windows stop at an episode end and at the stream's newest row; discounts gamma**k."""
    E, cap = 2, 8
    ring = af.NaiveRing(cap, E)
    n = 10  # rows 0..9; stream 0: rows 0,2,4,6,8; stream 1: 1,3,5,7,9
    rows = {"obs": np.zeros((n, 4, 84, 84), np.uint8), "next_obs": np.zeros((n, 4, 84, 84), np.uint8),
            "action": np.arange(n), "reward": np.arange(1, n + 1, dtype=np.float32),
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
    rows["next_obs"][:, -1, 0, 0] = np.arange(n)  # marks each row's next frame
    rows["truncated"][3] = True
    ring.write(rows)
    g = 0.5
    # slots: row r at r % 8; rows 0, 1 overwritten by 8, 9
    out = ring.nstep(np.array([2, 3, 4, 6 % cap]), 3, g)  # rows 2, 3, 4, 6
    # row 2: rows 2, 4, 6 (three rows); row 3: truncated (one row); row 4: 4, 6, 8; row 6: 6, 8 (8 newest)
    assert out["reward"].tolist() == [3 + g * 5 + g * g * 7, 4, 5 + g * 7 + g * g * 9, 7 + g * 9]
    assert out["discounts"].tolist() == [g ** 3, g, g ** 3, g ** 2]
    assert out["next_obs"][:, -1, 0, 0].tolist() == [6, 3, 8, 8]
    assert out["truncated"].tolist() == [False, True, False, False]


def test_repeated_block_is_a_continuous_stream(af):
    """The block ends with an episode end and starts at a reset: written again and again (in
    chunks that never cross its end), a frame buffer that checks continuity takes it."""
    d = rollout("Breakout", 300)
    block = af.repeatable_block(d)
    n = len(block["action"])
    assert block["terminated"][-1] or block["truncated"][-1]
    sizes = [len(c["action"]) for c in af.chunks_of(block, 3 * n + 5, 100)]
    assert sum(sizes) == 3 * n + 5 and max(sizes) <= 100
    buf = tfdata.ReplayBuffer(af.SPEC, 256, frame_stack=af.FRAMES, seed=0)
    for c in af.chunks_of(block, 3 * n + 5, 100):
        buf.extend(c)  # a SpecError if a repetition did not continue the stream
    full = tfdata.ReplayBuffer(af.SPEC, 256, frame_stack=af.FRAMES, seed=0)
    af.fill_whole_blocks(full, block, 256)
    assert len(full) == 256 and len(buf) == 256
    checked = af.CheckedNumpyFrameBuffer(16)
    for r in af.row_dicts(block) * 2:
        checked.push(r)
    broken = af.row_dicts(block)[1]
    with pytest.raises(ValueError, match="continue"):
        checked.push(broken)  # after the block's last row (an episode end) comes a reset
    with pytest.raises(SystemExit, match="no episode end"):
        af.repeatable_block({k: v[:3] for k, v in d.items() if k in af.FIELDS})


def test_memory_bookkeeping(af):
    one = af.NumpyFrameBuffer(10)
    d = rollout("Breakout", 20)
    rows = af.row_dicts(af.rows_of(d, 1))
    for r in rows[:12]:
        one.push(r)
    assert one.i == 2 and np.array_equal(one.frames[1], d["obs"][11][-1]) and one.nbytes == 10 * af.ONE_FRAME_ROW
    for kind in af.MEMORY_KINDS:
        if kind.startswith("SB3") and not af.have("stable_baselines3"):
            continue
        n = af.fits(kind, 1 << 30)
        assert af.planned_row_bytes(kind, n) <= 1 << 30 < af.planned_row_bytes(kind, n + 64), kind
    # tfdata's frames: plan_memory counts the frames once per row
    per_row = af.planned_row_bytes("tfdata frames AoS", 100_000) / 100_000
    assert af.FRAME_BYTES < per_row < 2 * af.FRAME_BYTES


def test_page_cache_readers(af, tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 1 << 20, dtype=np.uint8).tobytes())
    cached = af.cached_bytes(str(path))
    if cached is None:
        pytest.skip("mincore not available here")
    assert 0 < cached <= 1 << 20
    af.drop_page_cache(str(path))  # must not fail; whether pages go depends on the file system
    assert af.cached_bytes(str(path)) <= 1 << 20


@pytest.mark.parametrize("sb3", [False, True], ids=["no-sb3", "sb3"])
def test_smoke_run(af, tmp_path, monkeypatch, sb3):
    """The whole experiment at tiny sizes writes its report, data and plots; without
    stable-baselines3 it measures the rest and says so."""
    for mod in ("ale_py", "cv2"):
        pytest.importorskip(mod, reason="the atari extra")
    if sb3:
        pytest.importorskip("stable_baselines3", reason="the dqn extra")
    else:
        real = af.have
        monkeypatch.setattr(af, "have", lambda m: m != "stable_baselines3" and real(m))
    monkeypatch.setattr(af, "OUT_DIR", str(tmp_path))
    monkeypatch.setitem(af.STREAMS, "quick", {"E1": (1, 400, None, 0), "E2-trunc": (2, 60, 20, 30)})
    for table, value in ((af.CHECKS, 4), (af.RSS_FILL, 3000), (af.SPEED_ROWS, 600), (af.SPEED_FULL_ROWS, 200),
                         (af.SPEED_ROUNDS, 2), (af.SPEED_SLICE_MS, 2), (af.COLD_ROWS, 480), (af.COLD_ROUNDS, 1),
                         (af.COLD_CALLS, 2), (af.DISK_CALLS, 1)):
        monkeypatch.setitem(table, "quick", value)
    assert af.main(["--quick"]) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["schema_version"] == 1 and res["methodology"]["mode"] == "quick"
    tot = res["exactness_totals"]
    assert tot["all"]["mismatches"] == 0 and tot["all"]["batches"] > 0
    assert {r["stream"] for r in res["exactness"]} == {"E1", "E2-trunc"}
    kinds = {r["kind"] for r in res["memory"]}
    assert ("SB3" in kinds) == sb3 and "tfdata frames AoS" in kinds and "numpy one frame" in kinds
    aos = next(r for r in res["memory"] if r["kind"] == "tfdata frames AoS")
    assert aos["measured"]["rss_bytes_per_row"] > af.FRAME_BYTES / 2 and aos["fits"]["1"] > 100_000
    assert set(res["speed"]["sample"]) >= {"tfdata frames AoS", "memcpy (DRAM)", "memcpy (hot cache)"}
    assert ("SB3" in res["speed"]["push"]) == sb3
    assert {r["cold_fraction"] for r in res["cold_sampling"]} == set(af.COLD_FRACTIONS)
    assert all(r["ratio"] > 1 for r in res["cold_ratios"])
    report = (tmp_path / "README.md").read_text()
    assert "<!-- headline: " in report and "## Targets" in report and "## 1. Exactness" in report
    assert "## 4. The compressed cold tier" in report and "## Machine and run" in report
    assert ("stable-baselines3 is not installed" in report) != sb3
    for png in ("memory.png", "speed.png", "cold.png"):
        assert (tmp_path / png).exists()
        (tmp_path / png).unlink()
    # --render rewrites the report and plots from results.json alone
    saved = tmp_path / "saved.json"
    saved.write_text((tmp_path / "results.json").read_text())
    (tmp_path / "README.md").unlink()
    assert af.main(["--render", str(saved)]) == 0
    assert (tmp_path / "README.md").read_text() == report
    assert all((tmp_path / png).exists() for png in ("memory.png", "speed.png", "cold.png"))
