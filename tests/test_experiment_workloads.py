"""experiments/workloads.py: the winner of a cell, the decision table written from the cells, and
a smoke run of the whole experiment (tiny sizes) with and without hybrid groupings."""

from __future__ import annotations

import json
import sys
import types

import pytest

import tfdata
from . import experiment, render_again



@pytest.fixture(scope="module")
def wl():
    return experiment("workloads")


def test_setup_runs_before_every_call_untimed(wl, monkeypatch):
    """interleaved_latencies(setups=...): the setup precedes each timed call, warm-up included,
    and its time is not in the figures. The clock is the test's: it moves by one second in each
    setup and never in a call, so a setup inside a timed span shows whatever the machine's load."""
    import time

    m = sys.modules["_timing"]

    class Clock:
        ns = 0

        def perf_counter_ns(self):
            return self.ns

        def __getattr__(self, name):
            return getattr(time, name)

    clock = Clock()
    monkeypatch.setattr(m, "time", clock)
    log = []

    def setup(arg):
        log.append("setup")
        clock.ns += 10**9

    def fn(arg):
        assert log and log[-1] == "setup"  # each call right after its own setup
        log.append("call")

    out = m.interleaved_latencies({"a": fn, "b": lambda arg: None}, [None], budget_s=0.0, lo=6, hi=6, rounds=2,
                                  warmup=2, setups={"a": setup})[None]
    assert log == ["setup", "call"] * 8  # 2 warm-up calls, 6 timed
    assert out["a"]["n"] == 6 and out["a"]["median_us"] == out["a"]["p99_us"] == 0  # no setup timed
    assert clock.ns == 8 * 10**9


def raw_entry(kind, cap, seed, times):
    """One run_config result: ``times`` is {op: {layout: median µs}}."""
    return {"kind": kind, "capacity": cap, "seed": seed, "layout_order": [], "fill": {}, "errors": {},
            "ops": {op: {lay: {"median_us": t, "p99_us": 2 * t, "n": 7} for lay, t in per.items()}
                    for op, per in times.items()}}


def test_judge_needs_every_seed_and_the_margin(wl):
    clear = wl.judge({"aos": [10.0, 11.0, 12.0], "soa": [1.0, 1.1, 1.3]})
    assert clear["winner"] == "soa" and clear["tied"] == ["soa"] and clear["runner_up"] == "aos"
    assert clear["advantage"]["mean"] == pytest.approx((10 / 1 + 11 / 1.1 + 12 / 1.3) / 3)
    # one seed the other way round: no winner, though the mean favours soa
    split = wl.judge({"aos": [10.0, 11.0, 1.0], "soa": [1.0, 1.0, 2.0]})
    assert split["best"] == "soa" and split["winner"] == "tie" and set(split["tied"]) == {"aos", "soa"}
    # every seed agrees but within the 3% margin: a tie
    close = wl.judge({"aos": [1.02, 1.02, 1.02], "soa": [1.0, 1.0, 1.0]})
    assert close["winner"] == "tie"
    # three layouts: the best must beat both; a third layout it does not beat joins the tie
    three = wl.judge({"aos": [5.0, 5.0], "soa": [1.0, 1.0], "hybrid_next": [1.01, 0.99]})
    assert three["winner"] == "tie" and set(three["tied"]) == {"soa", "hybrid_next"}
    assert wl.judge({"aos": [5.0, 5.0], "soa": [2.0, 2.0], "hybrid_next": [1.0, 1.0]})["winner"] == "hybrid_next"


def test_cells_and_decision_from_measurements(wl):
    kc = [("tiny", 10_000), ("cartpole", 10_000)]
    raw = []
    for seed, j in enumerate((1.0, 1.02, 0.98)):
        for kind, cap in kc:
            raw.append(raw_entry(kind, cap, seed, {
                "scan_reward": {"aos": 10 * j, "soa": 1.0},             # soa everywhere, 10x
                "sample_full": {"aos": 1.0, "soa": 2 * j},               # aos everywhere, 2x
                "update_reward": {"aos": 1.0, "soa": 1.0 * j},           # never clear
                # the crossover: aos for the tiny row, soa for cartpole
                "offline_epoch": {"aos": 1.0, "soa": 3.0} if kind == "tiny" else {"aos": 4.0, "soa": 1.0},
                "dqn_k1_m100": {"aos": 200.0 * j, "soa": 100.0},         # medians of 100-step blocks
                # a second op of the family: soa for tiny, aos for cartpole
                "dqn_k4_m100": {"aos": 200.0, "soa": 100.0} if kind == "tiny" else {"aos": 100.0, "soa": 300.0},
            }))
    cells = wl.aggregate(raw, kc, ["aos", "soa"])
    get = {(c["op"], c["kind"]): c for c in cells}
    assert len(cells) == 12
    assert get[("scan_reward", "tiny")]["winner"] == "soa"
    assert get[("scan_reward", "tiny")]["soa_over_aos"]["mean"] == pytest.approx(0.1, rel=0.01)
    assert get[("sample_full", "cartpole")]["winner"] == "aos"
    assert get[("update_reward", "tiny")]["winner"] == "tie"
    assert [get[("offline_epoch", k)]["winner"] for k in ("tiny", "cartpole")] == ["aos", "soa"]
    dqn = get[("dqn_k1_m100", "tiny")]  # per env step: the block's median / m
    assert dqn["layouts"]["soa"]["median_us_mean"] == pytest.approx(1.0)
    assert dqn["layouts"]["aos"]["per_seed"] == pytest.approx([2.0, 2.04, 1.96])

    rows = {r["layout"]: r for r in wl.decision_rows(cells, ["aos", "soa"])}
    assert [i["op"] for i in rows["soa"]["always"]] == ["scan_reward", "dqn_k1_m100"]
    assert [i["op"] for i in rows["aos"]["always"]] == ["sample_full"]
    assert [(i["op"], i["where"]) for i in rows["aos"]["some"]] == [("dqn_k4_m100", "cartpole 1e4"),
                                                                    ("offline_epoch", "tiny 1e4")]
    assert [i["op"] for i in rows["tie"]["always"]] == ["update_reward"]
    assert rows["soa"]["always"][0]["advantage_gmean"] == pytest.approx(10.0, rel=0.01)

    text = wl.choose_sentences(cells, ["aos", "soa"])
    aos, soa = (next(t for t in text if t.startswith(f"**Choose {n}**")) for n in ("AoS", "SoA"))
    assert "whole-row sampling (2 of 2 cells" in aos and "column scans" not in aos
    assert "column scans (2 of 2 cells" in soa
    # the family's majority, and where the other layout wins (configuration: how many of its operations)
    assert "DQN-like loop (3 of 4 cells, 2.00-2.00x; but AoS for cartpole 1e4 (1 of 2), 3.00-3.00x)" in soa
    depends = next(t for t in text if t.startswith("**Depends"))
    assert "offline-RL epoch" in depends and "AoS for tiny 1e4" in depends and "SoA for cartpole 1e4" in depends
    assert any(t.startswith("**A grouping**: not measured") for t in text)
    head = wl.headline(cells, ["aos", "soa"])
    assert head.startswith("Crossover map, 12 cells") and "AoS wins 4, SoA wins 6, 2 tied" in head
    assert "DQN-like loop: SoA 3/4, AoS 1/4 (up to 2.0x)" in head


@pytest.mark.parametrize("hybrid", [False, True], ids=["aos-soa", "fake-hybrid"])
def test_smoke_run(wl, tmp_path, monkeypatch, hybrid):
    """The whole experiment at tiny sizes writes its report, data and plots; with groupings
    refused (a stand-in for a tfdata without them) it measures AoS and SoA and says so; with
    groupings accepted (a stand-in that stores them as SoA) they get columns of their own."""
    monkeypatch.setattr(wl, "OUT_DIR", str(tmp_path))
    monkeypatch.setitem(wl.CAPACITIES, "quick", {"tiny": (2_000,), "cartpole": (2_000,)})
    for table, v in ((wl.BUDGET_S, 0.002), (wl.MIN_CALLS, 2), (wl.MAX_CALLS, 20), (wl.ROUNDS, 2)):
        monkeypatch.setitem(table, "quick", v)
    monkeypatch.setattr(wl, "WARMUP_CALLS", 1)
    def replay_buffer(spec, capacity, layout=None, **kw):
        if isinstance(layout, list) and not hybrid:  # a tfdata without column groups
            raise ValueError(f"layout argument: expected one of ('aos', 'soa'), got {layout!r}")
        return tfdata.ReplayBuffer(spec, capacity, layout="soa" if isinstance(layout, list) else layout, **kw)

    monkeypatch.setattr(wl, "tfdata", types.SimpleNamespace(Spec=tfdata.Spec, ReplayBuffer=replay_buffer))
    wl.main(["--quick", "--seeds", "2"])
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["schema_version"] == 1 and res["methodology"]["seeds"] == [0, 1]
    assert res["hybrid"]["available"] is hybrid
    layouts = {lay for c in res["cells"] for lay in c["layouts"]}
    report = (tmp_path / "README.md").read_text()
    assert "<!-- headline: Crossover map" in report and "### Decision table" in report
    if hybrid:
        assert layouts == {"aos", "soa", "hybrid_next", "hybrid_obs"}
        assert "Hybrid groupings measured" in report and "| **hybrid (obs apart)** |" in report
        cart = [c for c in res["cells"] if c["kind"] == "cartpole"]
        assert all(set(c["hybrid_over_best_base"]) == {"hybrid_next", "hybrid_obs"} for c in cart)
        assert all("hybrid_next" not in c["layouts"] for c in res["cells"] if c["kind"] == "tiny")
    else:
        assert layouts == {"aos", "soa"}
        assert "hybrid not available in this tfdata" in report
        assert res["methodology"]["parameters"]["layouts"] == ["aos", "soa"]
    ops = {c["op"] for c in res["cells"]}
    assert ops == set(wl.OPS)  # every operation measured (obs ones on cartpole only)
    assert {c["kind"] for c in res["cells"] if c["op"] == "scan_obs"} == {"cartpole"}
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["crossover_map.png", "operations.png", "workloads.png"]
    assert not [r["errors"] for r in res["raw"] if r["errors"]]


def test_render_gives_back_the_published_report(wl, tmp_path, monkeypatch):
    """--render writes the published README.md again from its results.json alone, byte for byte
    (its hand-written parts taken from the README already in the folder)."""
    rendered, published = render_again(wl, "workloads", tmp_path, monkeypatch)
    assert rendered == published
    assert sorted(p.name for p in tmp_path.glob("*.png")) == ["crossover_map.png", "operations.png", "workloads.png"]
