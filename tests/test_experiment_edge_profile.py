"""experiments/edge_profile.py: the tiniest run end to end without the cgroup (what a machine that
cannot make one does: it must say so, not crash), the box itself where this machine lets us make
one, the machine readers of experiments/_recording.py, and ``--render`` giving the published
report back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from . import REPO, experiment

METHODOLOGY_KEYS = ("slug", "machine", "cpu", "board_model", "logical_cpus", "mem_total_bytes", "os", "governors",
                    "temperatures_c", "emulation", "versions")


@pytest.fixture(scope="module")
def edge():
    return experiment("edge_profile")


@pytest.fixture(scope="module")
def recording():
    return experiment("_recording")


def test_tiny_run_without_the_cgroup_writes_the_report(tmp_path):
    pytest.importorskip("gymnasium")
    env = dict(os.environ, TFDATA_REPORTS_DIR=str(tmp_path), TFDATA_EDGE_NO_CGROUP="1")
    out = subprocess.run([sys.executable, os.path.join(REPO, "experiments", "edge_profile.py"), "--quick"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    machines = os.listdir(tmp_path / "edge")
    assert len(machines) == 1
    folder = tmp_path / "edge" / machines[0]
    assert {"README.md", "results.json"} <= set(os.listdir(folder))
    res = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    assert res["machine"]["slug"] == machines[0]
    assert all(k in res["machine"] for k in METHODOLOGY_KEYS)
    assert {"python", "numpy", "numba", "llvmlite"} <= set(res["machine"]["versions"])
    assert res["throttling"]["throttled"] in ("yes", "no", "unknown")
    # the cgroup's status is recorded, and every measured process says it ran unconfined
    assert res["limits"]["enforced"] is False and "TFDATA_EDGE_NO_CGROUP" in res["limits"]["reason"]
    assert all(r["limit_enforced"] is False and r["box"] is None for r in res["raw"]["loops"].values())
    for name in ("dqn", "ppo", "sac"):
        loop = res["summary"]["loops"][name]
        assert loop["completed"] and loop["torch_imported"] is False, name
        assert loop["peak_rss_bytes"] > 0 and loop["runtime_bytes"] > 0, name
        assert res["raw"]["runtime"][name]["cache_misses"] == 0, name  # the kernels came from the cache
        for cache in ("cold", "warm"):
            lat = res["summary"]["latency"][f"{name}/{cache}"]
            assert lat["n"] == 1 and 0 < lat["first_step_s"] <= lat["first_update_s"], (name, cache)
    warm = res["raw"]["warm_cache"]  # made by the command a board's first boot runs
    assert "tfdata warmup" in warm["how"] and warm["compiled"] > 0
    cap = res["raw"]["capacity"]
    for kind in ("cartpole", "atari"):
        assert cap[kind]["capacity"] > 0 and cap[kind]["fit"]["completed"], kind
        assert cap[kind]["fit"]["rows"] == cap[kind]["capacity"]
    stats = res["raw"]["micro"]["stats"]
    assert {f"{op}/{lay}" for op in ("push", "extend", "sample", "prioritized") for lay in ("aos", "soa")} <= set(stats)
    assert {"push/numpy", "sample/numpy"} <= set(stats)
    text = (folder / "README.md").read_text(encoding="utf-8")
    assert "limit not enforced" in text.lower()
    assert "not a board" in text or "Measured on" in text
    assert "Limits in force" in text and "CPU throttled during the run" in text


def _can_make_cgroups(edge) -> bool:
    kind, _ = edge.box_kind(False)
    return kind is not None


def test_the_box_limits_a_child_and_is_removed(edge, tmp_path):
    if not _can_make_cgroups(edge):
        pytest.skip("no cgroup can be made here (not root, or no memory controller)")
    kind, _ = edge.box_kind(False)
    box = edge.Box(kind, f"tfdata-edge-test-{os.getpid()}").make()
    dirs = dict(box.dirs)
    try:
        assert any("memory" in k or "limit" in k or k == "memory.max" for k in box.limits)
        assert edge.BOX_BYTES in box.limits.values()
        # a child moved in between fork and exec sees the box as its cgroup
        out = subprocess.run([sys.executable, "-c", "print(open('/proc/self/cgroup').read())"],
                             preexec_fn=box.join, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and box.name in out.stdout
        c = box.counters()
        assert c["max_usage_bytes"] is None or c["max_usage_bytes"] > 0
        assert c["oom_kill"] in (None, 0)
    finally:
        box.remove()
    assert not any(os.path.exists(d) for d in dirs.values())


def test_the_box_kind_says_why_when_turned_off(edge):
    assert edge.box_kind(True) == (None, "turned off (--no-cgroup or TFDATA_EDGE_NO_CGROUP=1)")


def test_machine_readers(recording):
    m = recording.edge_machine()
    assert all(k in m for k in METHODOLOGY_KEYS)
    assert m["slug"] == recording.machine_slug() and m["slug"] == recording.slug(m["slug"])
    assert m["emulation"]["machine"] == m["machine"]
    if m["cpu"]["family"] is not None:  # /proc/cpuinfo readable: it agrees with the interpreter here
        assert m["emulation"]["emulated"] is False
    assert recording.slug("Raspberry Pi 5 Model B Rev 1.0") == "raspberry-pi-5-model-b-rev-1-0"
    s = recording.FrequencySampler(interval_s=0.01).start()
    summary = s.stop()
    assert summary["throttled"] in ("yes", "no", "unknown") and summary["how"]


def test_render_gives_the_published_report_back(edge, tmp_path):
    base = os.path.join(REPO, "reports", "edge")
    machines = [d for d in sorted(os.listdir(base)) if os.path.isfile(os.path.join(base, d, "results.json"))]
    if not machines:
        pytest.skip("no published edge report")
    src = os.path.join(base, machines[0])
    (tmp_path / "results.json").write_bytes(open(os.path.join(src, "results.json"), "rb").read())
    edge.main(["--render", str(tmp_path / "results.json")])
    with open(os.path.join(src, "README.md"), encoding="utf-8") as f:
        assert (tmp_path / "README.md").read_text(encoding="utf-8") == f.read()
