"""Compile budget: how many kernel specializations does a workload compile, and what does a cold compile cost?

tfdata's kernels are numba functions cached on disk (``cache=True``): the first process on a
machine compiles every specialization it calls (one per kernel and argument types), later ones load
them. The count is what the cold cost follows, and what deleting twin kernels should bring down.
Per workload, each in a fresh process on an empty ``NUMBA_CACHE_DIR`` (cold) and again warm:

* **specializations**: the compiled signatures of every numba dispatcher of a tfdata module,
  summed, and the kernels with the most. A helper that is not inlined compiles, and counts, only
  when its caller compiles: warm, the caller loads whole and the helper gets no signature, so a
  warm count is a lower bound;
* **compiles**: numba's ``"numba:compile"`` events of tfdata kernels (cache misses), and the wall
  and CPU time inside the outermost ones; the **cold and warm process** times (wall, and CPU of
  the process and its children): cold minus warm is the compile cost a user meets;
* **cache files**: ``.nbc`` files of the cold cache (one per specialization of a cached kernel).

Workloads (only tfdata's public API): ``dqn``, the edge loop of ``dqn_cartpole.py``, short
(``tfdata.nn.DQN`` on CartPole-v1 over an AoS ``ReplayBuffer``); ``ppo``, the edge loop of
``ppo_cartpole.py``, short (``tfdata.nn.PPO`` over a ``RolloutBuffer`` of 4 environments); and
``suite``: ``pytest -q -p no:cacheprovider`` (no ``-x``: a failing test must not cut the count
short) with ``TFDATA_COUNT_COMPILES`` set, which makes ``tests/conftest.py`` write the counts of
the pytest process at the session's end (what only its subprocesses compile is in the cache files
alone). By default on the checkout's cache (a lower bound unless it was empty, which the report
says); ``--cold`` on an empty one (20-40 minutes on a 2-core machine).

    python experiments/compile_budget.py                 # dqn and ppo, cold and warm: a minute or two
    python experiments/compile_budget.py suite --cold    # the suite's budget figures
    python experiments/compile_budget.py all --cold      # everything (python3 dev.py compile all --cold)

Needs the ``rl`` extra (gymnasium). Writes ``reports/compile_budget/`` (``README.md``,
``results.json``; the suite's output in ``run.log``, not committed); a run of some workloads keeps
the others' figures from the last ``results.json``. Standard library only, so that
``tests/conftest.py`` and ``tests/test_compile_budget.py`` can load :class:`CompileCounter`.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "compile_budget"
WORKLOADS = ("dqn", "ppo", "suite")
#: results.json keys: the suite's count on an empty cache and on a warm one are kept apart
ENTRIES = ("dqn", "ppo", "suite", "suite_warm")
LOOPS = ("dqn", "ppo")
#: The suite's budget (issue 31): at least 40% fewer specializations than before its refactoring.
#: The issue's 495 is the count of cache files a cold suite left at commit 603dd8a (this command
#: there: 493 cache files, 530 specializations in the pytest process); the baseline is this
#: command's cold suite at commit 2e6f0a5, before the refactoring.
BUDGET = {  # measure: (the issue's figure or None, baseline, target)
    "cache_files": (495, 505, int(495 * 0.6)),
    "specializations": (None, 542, int(542 * 0.6)),
}
BUDGET_LABELS = {"cache_files": "cache files of a cold suite, all processes (the issue's measure)",
                 "specializations": "specializations in the pytest process, cold"}
ISSUE_CHECK = {"commit": "603dd8a", "cache_files": 493, "specializations": 530}
BASELINE_COMMIT = "2e6f0a5"
DQN = {"steps": 600, "learning_starts": 200, "train_frequency": 4, "target_frequency": 100,
       "batch_size": 128, "buffer_size": 10_000, "hidden": (120, 84), "lr": 2.5e-4, "gamma": 0.99}
PPO = {"num_envs": 4, "num_steps": 128, "iterations": 3, "num_minibatches": 4, "update_epochs": 2,
       "hidden": (64, 64), "lr": 2.5e-4, "gamma": 0.99, "gae_lambda": 0.95}
# no -x: a test that fails (a timeout on a loaded machine) must not cut the count short
SUITE_ARGS = ("-q", "-p", "no:cacheprovider")
TOP = 15                              # kernels listed by specializations
TIMEOUT_S = {"dqn": 1800, "ppo": 1800, "suite": 4 * 3600}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(os.environ.get("TFDATA_REPORTS_DIR") or os.path.join(ROOT, "reports"), EXPERIMENT)
ENV_COUNT = "TFDATA_COUNT_COMPILES"  # read by tests/conftest.py


# ---------------------------------------------------------------------------------------------
# The counter (runs inside the measured process)
# ---------------------------------------------------------------------------------------------
def _is_tfdata(module) -> bool:
    return isinstance(module, str) and (module == "tfdata" or module.startswith("tfdata."))


def kernel_name(dispatcher) -> str:
    """``module:qualname`` of a dispatcher's Python function (``tfdata.kernels.aos:aos.gather``)."""
    f = dispatcher.py_func
    return f"{f.__module__}:{f.__qualname__}"


def tfdata_dispatchers() -> list:
    """Every live numba dispatcher whose function is defined in a tfdata module.

    Found among all objects the garbage collector tracks, so kernels held in tuples, dicts or
    closures (the layout kernels ``kernels._sample.specialize`` builds) count as well as module
    attributes. Empty if numba was never imported (then nothing compiled).
    """
    if "numba" not in sys.modules:
        return []
    from numba.core.dispatcher import Dispatcher

    found = {}
    for obj in gc.get_objects():
        # type() rather than isinstance: a proxy object's __class__ may run code
        if issubclass(type(obj), Dispatcher) and _is_tfdata(getattr(obj.py_func, "__module__", None)):
            found[id(obj)] = obj
    return list(found.values())


def kernel_counts(cached: bool | None = None) -> dict:
    """Kernel name -> number of compiled signatures (loaded from the cache or compiled), for every
    tfdata dispatcher with at least one; sorted by name. ``cached``: only the dispatchers with
    (True) or without (False) ``cache=True``."""
    counts = {}
    for d in tfdata_dispatchers():
        n = len(d.signatures)
        if n and (cached is None or _caches(d) == cached):
            name = kernel_name(d)
            counts[name] = counts.get(name, 0) + n
    return dict(sorted(counts.items()))


def _caches(dispatcher) -> bool:
    from numba.core.caching import NullCache

    return not isinstance(getattr(dispatcher, "_cache", None), NullCache)


def cache_files(cache_dir: str | None) -> int | None:
    """Number of ``.nbc`` files (one per cached specialization) under ``cache_dir``."""
    if not cache_dir or not os.path.isdir(cache_dir):
        return None
    return sum(f.endswith(".nbc") for _, _, files in os.walk(cache_dir) for f in files)


class CompileCounter:
    """Counts and times the compiles of tfdata kernels in this process, from creation on.

    Listens to numba's ``"numba:compile"`` event (fired on a cache miss, around the compile of
    one signature; a kernel's compile contains the compiles of the helpers it calls). Creating it
    imports numba. :meth:`result` adds the signature counts of :func:`kernel_counts`.
    """

    def __init__(self):
        from numba.core import event

        counter = self

        class _Listener(event.Listener):
            def on_start(self, ev):
                counter._start(ev.data["dispatcher"])

            def on_end(self, ev):
                # a compile that raised added no overload (numba 0.68's Event.is_failed is inverted)
                d = ev.data["dispatcher"]
                counter._end(d, tuple(ev.data["args"]) not in d.overloads)

        self.compiles = {}        # kernel name -> compiles (cache misses) in this process
        self.nested = 0           # of those, compiles inside another's (a helper typed by its caller)
        self.failed = 0           # compiles that raised (a typing error: no specialization)
        self.self_s = {}          # kernel name -> wall seconds of its compiles, nested ones excluded
        self.wall_s = 0.0         # wall seconds inside outermost compiles
        self.cpu_s = 0.0          # CPU seconds (of the compiling thread) inside outermost compiles
        self._stack = []          # (name, wall start, seconds of nested compiles)
        self._outer = None
        self._listener = _Listener()
        event.register("numba:compile", self._listener)

    def _start(self, dispatcher) -> None:
        if not self._stack:
            self._outer = (time.perf_counter(), time.thread_time())
        self._stack.append([kernel_name(dispatcher), time.perf_counter(), 0.0])

    def _end(self, dispatcher, failed: bool) -> None:
        name, t0, nested = self._stack.pop()
        took = time.perf_counter() - t0
        if self._stack:
            self._stack[-1][2] += took
        else:
            self.wall_s += time.perf_counter() - self._outer[0]
            self.cpu_s += time.thread_time() - self._outer[1]
        if not _is_tfdata(name.split(":", 1)[0]):
            return
        if failed:
            self.failed += 1
        else:
            self.compiles[name] = self.compiles.get(name, 0) + 1
            self.nested += bool(self._stack)
        self.self_s[name] = self.self_s.get(name, 0.0) + took - nested

    def result(self) -> dict:
        """The counts of this process so far (JSON-ready)."""
        counts = kernel_counts()
        return {
            "specializations": sum(counts.values()),
            "kernels": len(counts),
            "by_kernel": counts,
            # without cache=True (helpers compiled inside their callers): no cache file, and on a
            # warm cache no signature
            "uncached_by_kernel": kernel_counts(cached=False),
            "compiles": sum(self.compiles.values()),
            "compiles_by_kernel": dict(sorted(self.compiles.items())),
            "nested_compiles": self.nested,
            "failed_compiles": self.failed,
            "compile_wall_s": round(self.wall_s, 3),
            "compile_cpu_s": round(self.cpu_s, 3),
            "compile_self_s_by_kernel": {k: round(v, 3) for k, v in sorted(self.self_s.items())},
            "cache_files": cache_files(os.environ.get("NUMBA_CACHE_DIR")),
        }

    def write(self, path: str) -> None:
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.result(), f, indent=1)
        os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------
# The workloads (each runs in a fresh process: ``compile_budget.py --child NAME --out FILE``)
# ---------------------------------------------------------------------------------------------
def workload_dqn(hp=DQN, seed: int = 0) -> None:
    """The edge DQN loop of dqn_cartpole.py, short: act, push, sample, train, sync."""
    import gymnasium as gym
    import numpy as np

    import tfdata

    env = gym.make("CartPole-v1")
    n_actions = int(env.action_space.n)
    spec = tfdata.Spec.from_spaces(env.observation_space, env.action_space)
    rb = tfdata.ReplayBuffer(spec, hp["buffer_size"], layout="aos", seed=seed)
    net = tfdata.nn.DQN((env.observation_space.shape[0], *hp["hidden"], n_actions), lr=hp["lr"],
                        gamma=hp["gamma"], seed=seed)
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    for step in range(hp["steps"]):
        action = int(rng.integers(n_actions)) if rng.random() < 0.5 else net.act(obs)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        rb.push({"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                 "terminated": terminated, "truncated": truncated})
        obs = env.reset()[0] if terminated or truncated else next_obs
        if step > hp["learning_starts"]:
            if step % hp["train_frequency"] == 0:
                net.train(rb.sample(hp["batch_size"]))
            if step % hp["target_frequency"] == 0:
                net.sync_target()


def workload_ppo(hp=PPO, seed: int = 0) -> None:
    """The edge PPO loop of ppo_cartpole.py, short: act, add, GAE, minibatches, train."""
    import gymnasium as gym
    import numpy as np

    import tfdata

    E, T = hp["num_envs"], hp["num_steps"]
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(E)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs_size = envs.single_observation_space.shape[0]
    spec = tfdata.Spec({"obs": ("f4", (obs_size,)), "action": "i8", "log_prob": "f4", "value": "f4",
                        "reward": "f4", "terminated": "?", "truncated": "?"})
    learner = tfdata.nn.PPO(obs_size=obs_size, n_actions=int(envs.single_action_space.n),
                            hidden=hp["hidden"], lr=hp["lr"], seed=seed)
    buf = tfdata.RolloutBuffer(spec, num_steps=T, num_envs=E, layout="aos", seed=seed)
    next_obs, _ = envs.reset(seed=seed)
    next_done = np.zeros(E, bool)
    for _ in range(hp["iterations"]):
        for _ in range(T):
            actions, log_probs, values = learner.act(next_obs)
            obs = next_obs
            next_obs, reward, terminated, truncated, _ = envs.step(actions)
            buf.add({"obs": obs, "action": actions, "log_prob": log_probs, "value": values,
                     "reward": reward, "terminated": terminated, "truncated": truncated})
            next_done = terminated | truncated
        buf.compute_returns_and_advantages(learner.value(next_obs), next_done, gamma=hp["gamma"],
                                           gae_lambda=hp["gae_lambda"])
        for mb in buf.minibatches(hp["num_minibatches"], epochs=hp["update_epochs"]):
            learner.train(mb)
        buf.reset()


CHILDREN = {"dqn": workload_dqn, "ppo": workload_ppo}


def child(name: str, out: str) -> None:
    t0, cpu0 = time.perf_counter(), time.process_time()
    counter = CompileCounter()
    CHILDREN[name]()
    r = counter.result()
    r.update(workload_wall_s=round(time.perf_counter() - t0, 3),
             workload_cpu_s=round(time.process_time() - cpu0, 3))
    with open(out, "w", encoding="utf-8") as f:
        json.dump(r, f)


# ---------------------------------------------------------------------------------------------
# Measurement (the parent: fresh processes, cold then warm)
# ---------------------------------------------------------------------------------------------
def _env(cache_dir: str | None, **extra) -> dict:
    env = dict(os.environ, **extra)
    if cache_dir:
        env["NUMBA_CACHE_DIR"] = cache_dir  # tfdata honours a cache directory the user chose
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _timed(cmd: list, env: dict, timeout: float) -> tuple:
    """Run ``cmd`` in ROOT; (return code, wall s, CPU s of it and its children, its output)."""
    before, t0 = os.times(), time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    wall, after = time.perf_counter() - t0, os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return out.returncode, wall, cpu, out.stdout + out.stderr


def run_loop(name: str, cache_dir: str, scratch: str, tag: str) -> dict:
    out = os.path.join(scratch, f"{name}-{tag}.json")
    load0 = os.getloadavg()[0]
    rc, wall, cpu, tail = _timed([sys.executable, os.path.abspath(__file__), "--child", name, "--out", out],
                                 _env(cache_dir), TIMEOUT_S[name])
    if rc:
        raise RuntimeError(f"workload {name} ({tag}) failed:\n{tail[-5000:]}")
    with open(out, encoding="utf-8") as f:
        r = json.load(f)
    r.update(process_wall_s=round(wall, 3), process_cpu_s=round(cpu, 3),
             load_average=[round(load0, 2), round(os.getloadavg()[0], 2)])
    return r


def measure_loop(name: str, scratch: str) -> dict:
    """One workload on an empty cache, then again on the cache that run filled."""
    cache = os.path.join(scratch, f"numba-{name}")
    os.makedirs(cache)
    cold = run_loop(name, cache, scratch, "cold")
    warm = run_loop(name, cache, scratch, "warm")
    print(f"  {name}: {cold['specializations']} specializations ({cold['compiles']} compiles, "
          f"{cold['cache_files']} cache files); process cold {cold['process_wall_s']:.1f} s, "
          f"warm {warm['process_wall_s']:.1f} s", flush=True)
    return {"cold": cold, "warm": warm}


def measure_suite(scratch: str, cold: bool, pytest_args: list) -> dict:
    out = os.path.join(scratch, "suite.json")
    cache = None
    if cold:
        cache = os.path.join(scratch, "numba-suite")
        os.makedirs(cache)
    cmd = [sys.executable, "-m", "pytest", *SUITE_ARGS, *pytest_args]
    print(f"  suite ({'empty cache' if cold else 'the checkout cache'}): {' '.join(cmd[1:])}", flush=True)
    # where the kernels are cached: numba's default is beside the sources
    cache_dir = cache or os.environ.get("NUMBA_CACHE_DIR") or os.path.join(ROOT, "tfdata")
    before = cache_files(cache_dir)
    load0 = os.getloadavg()[0]
    rc, wall, cpu, output = _timed(cmd, _env(cache, **{ENV_COUNT: out}), TIMEOUT_S["suite"])
    with open(os.path.join(OUT_DIR, "run.log"), "w", encoding="utf-8") as f:  # not committed
        f.write(output)
    if not os.path.exists(out):
        raise RuntimeError(f"the suite wrote no counts (exit {rc}):\n{output[-5000:]}")
    with open(out, encoding="utf-8") as f:
        r = json.load(f)
    r.update(cache_files_before=before, cache_files=cache_files(cache_dir))
    r.update(cache="empty" if cold or not before else "checkout", pytest_exit=rc,
             pytest_summary=output.strip().splitlines()[-1:],
             pytest_failed=[ln for ln in output.splitlines() if ln.startswith(("FAILED ", "ERROR "))],
             process_wall_s=round(wall, 1), process_cpu_s=round(cpu, 1),
             load_average=[round(load0, 2), round(os.getloadavg()[0], 2)])
    print(f"  suite: {r['specializations']} specializations in the pytest process "
          f"({r['compiles']} compiles, {r['cache_files']} cache files), exit {rc}, {wall:.0f} s", flush=True)
    return r


# ---------------------------------------------------------------------------------------------
# Analysis and report
# ---------------------------------------------------------------------------------------------
def top(by_kernel: dict, n: int = TOP) -> list:
    return sorted(by_kernel.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


def _uncached(r: dict) -> int | None:
    return sum(r["uncached_by_kernel"].values()) if "uncached_by_kernel" in r else None


def summarise(results: dict) -> dict:
    s = {}
    for name in LOOPS:
        if name in results:
            c, w = results[name]["cold"], results[name]["warm"]
            s[name] = {"specializations": c["specializations"], "kernels": c["kernels"],
                       "uncached_specializations": _uncached(c),
                       "compiles": c["compiles"], "nested_compiles": c.get("nested_compiles"),
                       "cache_files": c["cache_files"],
                       "specializations_warm": w["specializations"], "compiles_warm": w["compiles"],
                       "cold_wall_s": c["process_wall_s"], "cold_cpu_s": c["process_cpu_s"],
                       "warm_wall_s": w["process_wall_s"], "warm_cpu_s": w["process_cpu_s"],
                       "compile_cost_wall_s": round(c["process_wall_s"] - w["process_wall_s"], 2),
                       "compile_cost_cpu_s": round(c["process_cpu_s"] - w["process_cpu_s"], 2),
                       "inside_compiles_wall_s": c["compile_wall_s"], "inside_compiles_cpu_s": c["compile_cpu_s"]}
    for key in ("suite", "suite_warm"):
        if key in results:
            r = results[key]
            s[key] = {"uncached_specializations": _uncached(r)}
            s[key].update({k: r.get(k) for k in (
                "specializations", "kernels", "compiles", "nested_compiles", "failed_compiles", "cache_files",
                "cache_files_before", "cache", "pytest_exit", "pytest_summary", "pytest_failed",
                "process_wall_s", "process_cpu_s", "compile_wall_s", "compile_cpu_s")})
    return s


def _architecture(run: dict) -> str:
    cpu = run["environment"]["cpu"]  # "machine": runs before the run record was _recording's
    return cpu.get("architecture") or cpu["machine"]


def _measurement(r: dict) -> dict:
    return r["cold"] if "cold" in r else r


def _who(r: dict) -> str:
    m = _measurement(r).get("measured_by") or r.get("measured_by") or {}
    load = _measurement(r).get("load_average")
    where = f"`{m.get('command', '?')}` at commit {m.get('commit', '?')}"
    return where + (f", load average {load[0]:.1f} to {load[1]:.1f}" if load else "")


def write_report(summary: dict, results: dict, run: dict) -> None:
    from _render import md_table  # the parent only: tests load this file without experiments/ on the path

    cpus = run["environment"]["cpu"]["logical_cpus"]
    loads = [x for r in results.values() for x in (_measurement(r).get("load_average") or [])]
    loads += [run["load_average_start"][0], run["load_average_end"][0]]
    shared = max(loads) > cpus
    L = ["# Compile budget: kernel specializations and the cost of a cold compile\n",
         f"Made by `experiments/compile_budget.py` (`python3 dev.py compile`); last command `{run['command']}` "
         f"({run['wall_clock_s']:.0f} s). Raw numbers: `results.json`. Machine: {cpus} cores"
         + (f", shared (load average up to {max(loads):.0f}): wall clock includes waiting for a CPU, the CPU "
            "seconds are the steadier figure" if shared else "") + ".\n",
         "## Figures\n"]
    rows = [[f"{name} loop", a["specializations"], a["kernels"], a["compiles"], a["cache_files"],
             f"{a['cold_wall_s']:.1f} / {a['cold_cpu_s']:.1f}", f"{a['warm_wall_s']:.1f} / {a['warm_cpu_s']:.1f}",
             f"{a['inside_compiles_wall_s']:.1f} / {a['inside_compiles_cpu_s']:.1f}"]
            for name, a in ((n, summary[n]) for n in LOOPS if n in summary)]
    for key, label in (("suite", "test suite, empty cache"), ("suite_warm", "test suite, warm cache")):
        if key in summary:
            a, cold = summary[key], key == "suite"
            process = f"{a['process_wall_s']:.0f} / {a['process_cpu_s']:.0f}"
            rows.append([label, a["specializations"], a["kernels"], a["compiles"], a["cache_files"] if cold else "-",
                         process if cold else "-", "-" if cold else process,
                         f"{a['compile_wall_s']:.0f} / {a['compile_cpu_s']:.0f}"])
    L += md_table(["workload", "specializations", "kernels", "compiles", "cache files", "cold process (s, wall / CPU)",
                   "warm process (s, wall / CPU)", "inside compiles (s, wall / CPU)"], rows, "lrrrrrrr") + [""]
    for name in LOOPS:
        if name in summary:
            a = summary[name]
            helpers = (f"{a['nested_compiles']} of its {a['compiles']} compiles are helpers compiled inside "
                       "the kernel that calls them; " if a.get("nested_compiles") is not None else "")
            L.append(f"* {name} loop: a cold process costs {a['compile_cost_cpu_s']:.1f} CPU seconds more than a warm "
                     f"one ({a['compile_cost_wall_s']:.1f} s of wall clock); {helpers}a warm process loads "
                     f"{a['specializations_warm']} specializations.")
    if "suite" in summary:
        a = summary["suite"]
        parts = []
        if a.get("uncached_specializations") is not None:
            parts.append(f"{a['specializations'] - a['uncached_specializations']} of kernels with `cache=True` and "
                         f"{a['uncached_specializations']} of helpers without (compiled inside their callers, no "
                         "cache file)")
        if a.get("nested_compiles") is not None:
            parts.append(f"{a['nested_compiles']} of its {a['compiles']} compiles were of a helper inside its caller")
        L.append(f"* Test suite, empty cache: {a['specializations']} specializations in the pytest process"
                 + "".join(f"; {p}" for p in parts) + f". {a['cache_files']} cache files over all its processes "
                 "(the pytest process and the subprocesses of tests).")
    if "suite_warm" in summary:
        a = summary["suite_warm"]
        L.append(f"* On a warm cache the pytest process has {a['specializations']} specializations: the kernels "
                 "it loads by name, without the helpers compiled inside them (a lower bound).")
    for key in ("suite", "suite_warm"):
        a = summary.get(key) or {}
        if a.get("pytest_summary"):
            L.append(f"* pytest ({'empty' if key == 'suite' else 'warm'} cache): "
                     f"{a['pytest_summary'][0].strip('= ')}" + (
                         "; failed: " + ", ".join(f"`{ln.split()[1]}`" for ln in a["pytest_failed"])
                         if a.get("pytest_failed") else "") + ".")
    L.append("")
    if "suite" in summary:
        a = summary["suite"]
        L += ["## The suite's budget (issue 31: at least 40% fewer)\n",
              *md_table(["measure", f"issue's figure ({ISSUE_CHECK['commit']})", f"baseline ({BASELINE_COMMIT})",
                         "this run", "target", ""],
                        [[BUDGET_LABELS[key], f"{issue} (this command: {ISSUE_CHECK[key]})" if issue
                          else f"{ISSUE_CHECK[key]} (this command)", base, a[key], f"at most {target}",
                          "met" if a[key] <= target else "not met"]
                         for key, (issue, base, target) in BUDGET.items()], "lrrrrl"), ""]
    L.append("Measured by: " + "; ".join(f"{name}: {_who(results[name])}" for name in ENTRIES if name in results)
             + ".\n")
    L.append("## Kernels with the most specializations\n")
    for name in ENTRIES:
        if name in results:
            by = _measurement(results[name])["by_kernel"]
            L.append(f"**{name}**: " + ", ".join(f"`{k}` {v}" for k, v in top(by)) + "\n")
    L += ["## Method\n",
          "* specializations: compiled signatures of every live numba dispatcher of a tfdata module at the end "
          "of the process, summed (kernels: dispatchers with one or more). Cold, that is all it compiled; warm, "
          "a kernel loads whole from its cache file and the helpers it calls get no signature (a lower bound).",
          "* compiles: numba's `numba:compile` events of tfdata kernels (cache misses); inside compiles: wall "
          "and CPU time of the compiling thread inside the outermost ones. Cold and warm process: the whole "
          "workload process (wall, and CPU of it and its children) on an empty `NUMBA_CACHE_DIR`, then on the "
          "cache that run filled.",
          "* cache files: `.nbc` files of the cold cache, one per specialization of a `cache=True` kernel, from "
          "every process (the suite's subprocesses included); the suite's other counts are of the pytest "
          "process (`TFDATA_COUNT_COMPILES`, a hook in `tests/conftest.py`).",
          f"* One run each; numba {run['environment']['software']['numba']}, Python "
          f"{run['environment']['software']['python']}, {cpus} logical CPUs ({_architecture(run)}).",
          ""]
    with open(os.path.join(OUT_DIR, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(L))


def merge_earlier(path: str, results: dict, run: dict) -> dict:
    """``results`` plus the workloads an earlier run wrote to ``path`` and this one did not measure
    (the suite takes half an hour: a run of the loops keeps its figures). Each entry says which
    run measured it."""
    for r in results.values():
        r["measured_by"] = {"run_name": run["run_name"], "command": run["command"],
                            "commit": (run["environment"]["software"]["git"]["commit"] or "")[:10] or None}
    try:
        with open(path, encoding="utf-8") as f:
            earlier = json.load(f).get("raw", {})
    except (OSError, ValueError):
        return results
    return {name: results.get(name, earlier.get(name)) for name in ENTRIES
            if name in results or name in earlier}


def render() -> None:
    """Write README.md again from results.json (what a run does once it has written it)."""
    with open(os.path.join(OUT_DIR, "results.json"), encoding="utf-8") as f:
        data = json.load(f)
    write_report(data["summary"], data["raw"], data["methodology"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("workloads", nargs="*", help="dqn, ppo, suite or all (default: dqn ppo)")
    ap.add_argument("--cold", action="store_true", help="run the suite on an empty numba cache, timed")
    ap.add_argument("--pytest-args", default="", help="extra arguments of the suite's pytest (one string)")
    ap.add_argument("--render", action="store_true", help="only write README.md again from results.json")
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.out)
    if args.render:
        return render()
    sys.dont_write_bytecode = True  # write nothing outside reports/
    args.workloads = args.workloads or list(LOOPS)
    unknown = set(args.workloads) - {*WORKLOADS, "all"}
    if unknown:
        ap.error(f"unknown workload {', '.join(sorted(unknown))}: choose from {', '.join(WORKLOADS)} or all")
    names = list(WORKLOADS) if "all" in args.workloads else [w for w in WORKLOADS if w in args.workloads]
    command = "python experiments/compile_budget.py " + " ".join(args.workloads) + (" --cold" if args.cold else "")
    from _recording import RunRecord  # the parent only (see write_report)

    rec = RunRecord(EXPERIMENT, mode="full", seeds=[0], command=command,
                    parameters={"workloads": names, "suite_cold": args.cold, "dqn": DQN, "ppo": PPO,
                                "suite_args": list(SUITE_ARGS) + args.pytest_args.split()})
    os.makedirs(OUT_DIR, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix="tfdata-compile-budget-")
    results = {}
    try:
        for name in names:
            if name == "suite":
                r = measure_suite(scratch, args.cold, args.pytest_args.split())
                results["suite" if r["cache"] == "empty" else "suite_warm"] = r
            else:
                results[name] = measure_loop(name, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    run = rec.finish()
    path = os.path.join(OUT_DIR, "results.json")
    results = merge_earlier(path, results, run)
    summary = summarise(results)
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"schema_version": 1, "methodology": run, "summary": summary, "raw": results}, f, indent=1)
    render()
    print(json.dumps(summary, indent=1))
    print(f"report: {os.path.relpath(OUT_DIR)}/README.md", flush=True)


if __name__ == "__main__":
    main()
