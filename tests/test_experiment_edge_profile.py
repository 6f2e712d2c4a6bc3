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


def _box_kind_or_skip(edge) -> str:
    """The box kind; skips where no cgroup may be made (not root, no controller), but a limit
    the kernel refused as invalid is the box's own error, not the machine's."""
    kind, reason = edge.box_kind(False)
    if kind is None:
        assert "Invalid argument" not in reason, reason
        pytest.skip(reason)
    return kind


def test_the_box_holds_every_limit_it_states(edge):
    """Read back from the cgroup's own files: 512 MiB of memory (and of memory plus swap where the
    kernel accounts swap), one CPU of time, one core."""
    kind = _box_kind_or_skip(edge)
    box = edge.Box(kind, f"tfdata-edge-test-limits-{os.getpid()}").make()
    try:
        read = lambda d, f: open(os.path.join(box.dirs[d], f)).read().strip()  # noqa: E731
        if kind == "v1":
            assert int(read("memory", "memory.limit_in_bytes")) == edge.BOX_BYTES
            if os.path.exists(os.path.join(box.dirs["memory"], "memory.memsw.limit_in_bytes")):
                assert int(read("memory", "memory.memsw.limit_in_bytes")) == edge.BOX_BYTES
            assert read("cpu", "cpu.cfs_quota_us") == read("cpu", "cpu.cfs_period_us")
            if "cpuset" in box.dirs:
                assert read("cpuset", "cpuset.cpus").isdigit()  # one core
        else:
            assert int(read("unified", "memory.max")) == edge.BOX_BYTES
            quota, period = read("unified", "cpu.max").split()
            assert quota == period
        assert box.limits and all(v not in (None, "") for v in box.limits.values())
    finally:
        box.remove()


def test_a_child_beyond_the_limit_is_reported_oom_killed(edge, tmp_path):
    """A buffer larger than the box, filled in it: the run says OOM-killed, not failed or completed."""
    kind = _box_kind_or_skip(edge)
    runner = edge.Runner(kind, str(tmp_path), lambda m: None)
    rows = 2 * edge.BOX_BYTES // 40  # 46-byte CartPole rows: about twice the box
    r = runner.run("fill", {"kind": "cartpole", "capacity": rows, "budget": "quick"}, cache=str(tmp_path / "numba"),
                   timeout=300)
    assert r["limit_enforced"] is True
    assert not r["completed"] and r["oom_killed"], {k: r.get(k) for k in ("returncode", "box", "output_tail")}


class FakeRunner:
    """Runner.run without processes: max_capacity's answer is budget // 100 rows of either kind;
    a fill of more than ``oom_above`` rows is OOM-killed."""

    def __init__(self, oom_above=None, capacity_fails=False, whole_fails=False):
        self.calls, self.oom_above = [], oom_above
        self.capacity_fails, self.whole_fails = capacity_fails, whole_fails

    def run(self, task, args, *, cache, boxed=True, timeout=None):
        self.calls.append((task, dict(args), boxed))
        if task == "capacity":
            whole = args["budget"] == 512 << 20
            if self.capacity_fails or (whole and self.whole_fails):
                return {"task": task, "completed": False, "returncode": 1, "output_tail": "ValueError: no"}
            cap = {"capacity": args["budget"] // 100, "planned_bytes": args["budget"], "planned_parts": {}}
            return {"completed": True, "cartpole": dict(cap), "atari": dict(cap)}
        killed = self.oom_above is not None and args["capacity"] > self.oom_above
        return {"completed": not killed, "oom_killed": killed, "returncode": -9 if killed else 0,
                "rows": None if killed else args["capacity"], "box": None, "limit_enforced": boxed}


DQN_RUN = {"completed": True, "vm_hwm_bytes": 170 << 20, "buffer_nbytes": 10 << 20}


@pytest.mark.parametrize("mode", ["quick", "full"])
def test_capacity_is_planned_for_the_box_less_the_learner_and_the_margin(edge, mode):
    fake = FakeRunner(oom_above=((512 << 20) - (160 << 20) - edge.MARGIN_BYTES) // 100)
    cap = edge.capacities(fake, "cache", DQN_RUN, mode, lambda m: None)
    budget = edge.BOX_BYTES - (DQN_RUN["vm_hwm_bytes"] - DQN_RUN["buffer_nbytes"]) - edge.MARGIN_BYTES
    assert cap["budget_bytes"] == budget and cap["learner_footprint_bytes"] == 160 << 20
    plans = [(a, boxed) for task, a, boxed in fake.calls if task == "capacity"]
    assert plans[0] == ({"budget": budget}, False)  # planned outside the box
    fills = [(a, boxed) for task, a, boxed in fake.calls if task == "fill"]
    assert all(boxed for _, boxed in fills)  # every fill inside it
    for kind in ("cartpole", "atari"):
        c = cap[kind]
        assert c["capacity"] == budget // 100
        assert c["fit"]["capacity"] == budget // 100 and c["fit"]["completed"]
        assert c["fit"]["what_happened"].startswith("completed")
        if mode == "full":
            assert c["over"]["capacity"] == int(budget // 100 * edge.OVER)
            assert c["over"]["oom_killed"] and c["over"]["what_happened"] == "OOM-killed by the box's memory limit"
            assert c["whole_box"]["capacity"] == edge.BOX_BYTES // 100
        else:
            assert "over" not in c and "whole_box" not in c
    assert len(fills) == (6 if mode == "full" else 2)


@pytest.mark.parametrize("case", ["no budget", "capacity fails", "whole box fails"])
def test_capacity_that_cannot_be_planned_is_reported_not_raised(edge, case):
    fake = FakeRunner(capacity_fails=case == "capacity fails", whole_fails=case == "whole box fails")
    dqn = dict(DQN_RUN, vm_hwm_bytes=500 << 20) if case == "no budget" else DQN_RUN
    cap = edge.capacities(fake, "cache", dqn, "full", lambda m: None)
    if case == "whole box fails":
        assert all(cap[k]["fit"]["completed"] and "whole_box" not in cap[k] for k in ("cartpole", "atari"))
        return
    assert "error" in cap and "budget_bytes" not in cap, cap
    assert not [c for c in fake.calls if c[0] == "fill"]
    if case == "no budget":
        assert not fake.calls and "leave no room" in cap["error"]
    else:
        assert "ValueError: no" in cap["error"]
    # the report says so
    assert not any("budget holds" in line for line in edge.findings({"capacity": cap}, {"loops": {}, "latency": {}},
                                                                      True))


def _published(edge):
    base = os.path.join(REPO, "reports", "edge")
    machines = [d for d in sorted(os.listdir(base)) if os.path.isfile(os.path.join(base, d, "results.json"))]
    if not machines:
        pytest.skip("no published edge report")
    with open(os.path.join(base, machines[0], "results.json"), encoding="utf-8") as f:
        return json.load(f)


def test_an_emulated_run_reports_no_timing(edge, tmp_path):
    d = _published(edge)
    d["machine"]["emulation"] = {"machine": "aarch64", "cpuinfo_family": "x86", "emulated": True,
                                 "evidence": ["platform.machine() is aarch64, /proc/cpuinfo describes an x86 CPU"]}
    text = "\n".join(edge.findings(d["raw"], d["summary"], True))
    assert "Steps per second" not in text and "First training update" not in text
    assert "budget holds" in text  # memory is still reported
    (tmp_path / "results.json").write_text(json.dumps(d), encoding="utf-8")
    edge.main(["--render", str(tmp_path / "results.json")])
    readme = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "Timings under emulation mean nothing about ARM hardware" in readme
    assert readme.count("Not shown: timed under emulation") == 2  # microbenchmarks, latency
    assert "Steps per second in one CPU" not in readme and not os.path.exists(tmp_path / "latency.png")


PI5_CPUINFO = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x4
CPU part\t: 0xd0b
CPU revision\t: 1

processor\t: 1
Features\t: fp asimd
CPU implementer\t: 0x41
CPU part\t: 0xd0b

Revision\t: d04170
Serial\t\t: 0000000000000000
Model\t\t: Raspberry Pi 5 Model B Rev 1.0
"""
X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx2 fma
"""


@pytest.mark.parametrize("machine,cpuinfo,emulated", [
    ("aarch64", PI5_CPUINFO, False),   # a board
    ("aarch64", X86_CPUINFO, True),    # qemu-user on an x86-64 host
    ("x86_64", X86_CPUINFO, False),
    ("x86_64", PI5_CPUINFO, True),
    ("aarch64", "", None),             # /proc/cpuinfo says nothing
])
def test_emulation_is_read_from_the_machine_and_cpuinfo(recording, monkeypatch, machine, cpuinfo, emulated):
    real = recording._read
    monkeypatch.setattr(recording, "_read", lambda p: cpuinfo if p == "/proc/cpuinfo" else real(p))
    monkeypatch.setattr(recording.platform, "machine", lambda: machine)
    e = recording.emulation()
    assert e["emulated"] is emulated and e["machine"] == machine
    assert bool(e["evidence"]) == (emulated is not None)
    if cpuinfo is PI5_CPUINFO:
        f = recording.cpuinfo_fields()
        assert f["family"] == "arm" and f["cpu_part"] == "0xd0b" and f["processors"] == 2
        assert f["model"] == "Raspberry Pi 5 Model B Rev 1.0" and "asimddp" in f["features"]


def test_a_child_that_cannot_join_its_box_runs_unconfined_and_says_so(edge, monkeypatch, tmp_path):
    """Moving the child into the box fails between fork and exec (here: a cgroup that is gone):
    the run goes on with that process unconfined, and the result says so; the box is removed."""
    removed = []

    class GoneBox(edge.Box):
        def make(self):
            self.dirs = {"memory": str(tmp_path / "gone")}
            self.limits = {"memory.limit_in_bytes": edge.BOX_BYTES}
            return self

        def remove(self):
            removed.append(self.name)
            self.dirs = {}

    monkeypatch.setattr(edge, "Box", GoneBox)
    runner = edge.Runner("v1", str(tmp_path), lambda m: None)
    r = runner.run("capacity", {"budget": 64 << 20}, cache=str(tmp_path / "numba"), timeout=300)
    assert r["completed"] and r["cartpole"]["capacity"] > 0, r.get("output_tail")
    assert r["limit_enforced"] is False and r["box"] is None and r["limits"] is None
    assert "could not join the cgroup" in r["box_error"]
    assert len(removed) == 1
