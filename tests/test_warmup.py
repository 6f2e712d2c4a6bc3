"""``python -m tfdata warmup``: after it, the real edge loops compile nothing.

Each loop is warmed on its own empty ``NUMBA_CACHE_DIR`` in a fresh process that cannot import
gymnasium or torch; then the real loop (experiments/compile_budget.py's workloads, and a SAC loop
as experiments/sac_continuous.py's edge loop, with gymnasium's environments) runs in another
fresh process on that cache under compile_budget's ``CompileCounter``, which must count no compile
of a tfdata kernel. Also: bad arguments, a cache directory that is not writable, a second warm-up
that only loads, and a cache entry that is not used under another CPU name or numba version.
"""

from __future__ import annotations

import glob
import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tfdata import cli, warmup

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUDGET = os.path.join(REPO, "experiments", "compile_budget.py")

# the warm-up as a board without gymnasium or torch runs it: importing either fails
WARMUP = """
import sys
sys.modules["gymnasium"] = sys.modules["torch"] = None
from tfdata import cli
sys.exit(cli.main(["warmup", *sys.argv[1:]]))
"""

# a real loop under the compile counter: the compiles, the specializations loaded, the cache
# directories of tfdata's kernels in this process
REAL = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("compile_budget", {BUDGET!r})
budget = importlib.util.module_from_spec(spec)
spec.loader.exec_module(budget)
counter = budget.CompileCounter()


def workload_sac(total=270, learning_starts=260, seed=0):
    # experiments/sac_continuous.py's edge loop (variant "edge"), short: CleanRL's one-env vector
    # environment on Pendulum-v1, random actions before learning_starts, a push per step, a
    # sample and a train per step after it
    import gymnasium as gym
    import numpy as np
    import tfdata

    def thunk():
        env = gym.wrappers.RecordEpisodeStatistics(gym.make("Pendulum-v1"))
        env.action_space.seed(seed)
        return env

    envs = gym.vector.SyncVectorEnv([thunk], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    envs.single_observation_space.dtype = np.float32
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    rb = tfdata.ReplayBuffer(tfdata.Spec.from_spaces(obs_space, act_space), 10_000, layout="aos", seed=seed)
    learner = tfdata.nn.SAC(obs_space.shape[0], act_space.low, act_space.high, hidden=(256, 256), gamma=0.99,
                            tau=0.005, policy_lr=3e-4, q_lr=1e-3, alpha=0.2, autotune=True, policy_frequency=2,
                            target_network_frequency=1, seed=seed)
    obs, _ = envs.reset(seed=seed)
    for global_step in range(total):
        if global_step < learning_starts:
            actions = np.array([act_space.sample() for _ in range(envs.num_envs)])
        else:
            actions = learner.act(obs[0])[None]
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        real_next_obs = next_obs.copy()
        for idx, trunc in enumerate(truncations):
            if trunc:
                real_next_obs[idx] = infos["final_obs"][idx]
        rb.push({{"obs": obs[0], "action": actions[0], "reward": rewards[0], "next_obs": real_next_obs[0],
                 "terminated": terminations[0], "truncated": truncations[0]}})
        obs = next_obs
        if global_step > learning_starts:
            learner.train(rb.sample(256), step=global_step)


loop = sys.argv[1]
(workload_sac if loop == "sac" else getattr(budget, "workload_" + loop))()
r = counter.result()
r["cache_paths"] = sorted({{d.stats.cache_path for d in budget.tfdata_dispatchers() if d.stats.cache_path}})
print(json.dumps(r))
"""

# the smallest public call of a cached kernel: DQN.act (tfdata.nn._mlp_kernels.mlp_argmax)
PROBE = f"""
import importlib.util, json
spec = importlib.util.spec_from_file_location("compile_budget", {BUDGET!r})
budget = importlib.util.module_from_spec(spec)
spec.loader.exec_module(budget)
counter = budget.CompileCounter()
import numpy as np, tfdata
from tfdata import warmup
tfdata.nn.DQN((4, 120, 84, 2), seed=0).act(np.zeros(4, np.float32))
print(json.dumps({{"compiles": counter.result()["compiles_by_kernel"], "cpu_name": warmup.target()["cpu_name"]}}))
"""


def _env(cache) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NUMBA_", "PYTHONPATH")) and k != "TFDATA_COUNT_COMPILES"}
    env.update(NUMBA_CACHE_DIR=str(cache), PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = REPO
    return env


def _run(args, cache, cwd, **extra):
    env = _env(cache)
    env.update(extra)
    return subprocess.run([sys.executable, *args], env=env, cwd=str(cwd), capture_output=True, text=True,
                          timeout=900)


def _json(out) -> dict:
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _nbc(cache) -> list:
    return sorted(glob.glob(os.path.join(str(cache), "**", "*.nbc"), recursive=True))


@pytest.fixture(scope="module")
def warmed(tmp_path_factory):
    """``warmed(loop)``: (cache directory, the warm-up's JSON), the warm-up run once per module
    on an empty cache of its own, without gymnasium or torch."""
    root = tmp_path_factory.mktemp("warmup")
    done = {}

    def get(loop):
        if loop not in done:
            cache = root / loop
            cache.mkdir()
            done[loop] = cache, _json(_run(["-c", WARMUP, loop, "--json"], cache, root))
        return done[loop]

    return get


@pytest.mark.parametrize("loop", list(warmup.LOOPS))
def test_after_warmup_the_real_loop_compiles_nothing(loop, warmed, tmp_path):
    cache, first = warmed(loop)
    r = first["loops"][loop]
    assert list(first["loops"]) == [loop]
    assert r["compiled"] > 0 and r["loaded"] == 0, r  # an empty cache: everything compiled here
    assert first["cache"] == "NUMBA_CACHE_DIR"
    assert first["cache_dirs"] and all(p.startswith(str(cache) + os.sep) for p in first["cache_dirs"])
    files = _nbc(cache)
    assert len(files) == r["compiled"]  # one cache file per specialization compiled

    pytest.importorskip("gymnasium")
    real = _json(_run(["-c", REAL, loop], cache, tmp_path))
    assert real["compiles"] == 0, f"compiled after warmup {loop}: {real['compiles_by_kernel']}"
    assert real["failed_compiles"] == 0
    assert real["specializations"] > 0  # it ran tfdata's kernels, loaded from this cache
    assert real["cache_paths"] and all(p.startswith(str(cache) + os.sep) for p in real["cache_paths"])
    assert _nbc(cache) == files  # and wrote nothing there


def test_warmup_twice_loads_everything_the_second_time(warmed, tmp_path):
    cache, first = warmed("dqn")
    before = {p: os.path.getmtime(p) for p in _nbc(cache)}
    again = _json(_run(["-c", WARMUP, "dqn", "--json"], cache, tmp_path))["loops"]["dqn"]
    assert again["compiled"] == 0 and again["loaded"] > 0, again
    assert {p: os.path.getmtime(p) for p in _nbc(cache)} == before  # no entry rewritten
    out = _run(["-m", "tfdata", "warmup", "dqn"], cache, tmp_path)  # the human output
    assert out.returncode == 0, out.stderr
    assert "dqn: compiled 0, loaded" in out.stdout and "nothing to compile" in out.stdout
    assert str(cache) in out.stdout


def test_unknown_loop_is_refused_with_exit_status_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["warmup", "dqn", "a2c"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown loop 'a2c'" in err and "dqn, ppo, sac or all" in err
    with pytest.raises(ValueError, match="unknown loop 'a2c'"):
        warmup.warm(["a2c"])


def test_unknown_loop_from_the_command_line(tmp_path):
    out = _run(["-m", "tfdata", "warmup", "nope"], tmp_path / "cache", tmp_path)
    assert out.returncode == 2
    assert "unknown loop 'nope'" in out.stderr
    assert not (tmp_path / "cache").exists()  # refused before anything was made


def test_list_names_every_loop(capsys):
    assert cli.main(["warmup", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split()[0] for ln in lines] == list(warmup.LOOPS)


def test_a_cache_directory_that_cannot_be_written_is_refused(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(blocker / "cache"))  # not creatable, even by root
    assert cli.main(["warmup", "dqn"]) == 1
    err = capsys.readouterr().err
    assert f"the kernel cache directory {blocker / 'cache'} is not writable" in err
    assert "set NUMBA_CACHE_DIR to a writable directory" in err


def test_the_specs_are_the_ones_gymnasium_gives():
    gym = pytest.importorskip("gymnasium")
    import tfdata

    env = gym.make("CartPole-v1")
    assert warmup.cartpole_spec() == tfdata.Spec.from_spaces(env.observation_space, env.action_space)
    env = gym.make("Pendulum-v1")
    spec = tfdata.Spec.from_spaces(env.observation_space, env.action_space)
    ours = warmup.pendulum_spec()
    assert ours == spec
    for side in ("low", "high"):
        np.testing.assert_array_equal(getattr(ours["action"], side), getattr(spec["action"], side))
    assert env.observation_space.dtype == np.float32


def _index(cache, kernel: str) -> tuple:
    """(numba version stamp, {key: data file}) of the index of ``kernel`` in ``cache``."""
    (path,) = glob.glob(os.path.join(str(cache), "**", f"{kernel}-*.nbi"), recursive=True)
    with open(path, "rb") as f:
        version = pickle.load(f)
        rest = f.read()
    return path, version, pickle.loads(rest)[1]


def test_an_entry_is_not_used_under_another_cpu_name_or_numba_version(warmed, tmp_path):
    source, _ = warmed("dqn")
    cache = tmp_path / "cache"
    shutil.copytree(source, cache)
    kernel = "_mlp_kernels.mlp_argmax"
    argmax = "tfdata.nn._mlp_kernels:mlp_argmax"

    host = _json(_run(["-c", PROBE], cache, tmp_path))
    assert host["compiles"] == {}  # warm: loaded
    # numba keys an entry on codegen.magic_tuple(): (target triple, CPU name, CPU features)
    _, _, overloads = _index(cache, kernel)
    assert {key[1][1] for key in overloads} == {host["cpu_name"]}
    if host["cpu_name"] != "generic":
        other = _json(_run(["-c", PROBE], cache, tmp_path, NUMBA_CPU_NAME="generic"))
        assert other["cpu_name"] == "generic"
        assert other["compiles"].get(argmax) == 1  # the host's entry was not used (nor its helpers')
        _, _, overloads = _index(cache, kernel)
        assert {key[1][1] for key in overloads} == {host["cpu_name"], "generic"}  # side by side
        assert _json(_run(["-c", PROBE], cache, tmp_path))["compiles"] == {}  # the host's still loads

    # an index stamped by another numba version is empty to this one
    path, version, overloads = _index(cache, kernel)
    with open(path, "rb") as f:
        pickle.load(f)
        rest = f.read()
    with open(path, "wb") as f:
        pickle.dump("0.0.1", f, protocol=-1)
        f.write(rest)
    assert _json(_run(["-c", PROBE], cache, tmp_path))["compiles"].get(argmax) == 1
    _, version_now, overloads_now = _index(cache, kernel)
    assert version_now == version
    assert {key[1][1] for key in overloads_now} == {host["cpu_name"]}  # the index was rewritten


def test_first_step_marks_the_first_step_and_the_first_update(warmed, tmp_path):
    cache, _ = warmed("dqn")
    marks = _json(_run(["-c", warmup.PROBE, "dqn"], cache, tmp_path))
    assert set(marks) == {"first_step", "first_update"}
    assert 0 < marks["first_step"] <= marks["first_update"]


def test_loops_of_one_call_count_each_what_it_compiled(warmed, tmp_path):
    """Several loops in one call (``all`` is three): each counts only what it compiled or loaded
    itself, a loop named twice runs once, and the total is the sum (one file per compile)."""
    source, _ = warmed("dqn")
    cache = tmp_path / "cache"
    shutil.copytree(source, cache)
    before = set(_nbc(cache))
    doc = _json(_run(["-c", WARMUP, "ppo", "dqn", "ppo", "--json"], cache, tmp_path))
    assert list(doc["loops"]) == ["ppo", "dqn"]
    ppo, dqn = doc["loops"]["ppo"], doc["loops"]["dqn"]
    assert ppo["compiled"] > 0
    assert dqn["compiled"] == 0, dqn  # everything it needs was cached, or compiled by ppo just before
    new = set(_nbc(cache)) - before
    assert len(new) == ppo["compiled"] == doc["total"]["compiled"]
    assert doc["total"]["loaded"] == ppo["loaded"] + dqn["loaded"]
