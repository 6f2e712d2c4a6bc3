"""Edge profile: what does tfdata do in a 512 MiB, one-CPU box?

tfdata's premise is a small board running a real-time policy loop. This experiment puts each part
of such a loop in a box of that size, one fresh process at a time, and measures:

* **the edge loops**, to completion, each in a fresh process in the box: DQN on CartPole-v1
  (``tfdata.nn.DQN`` over an AoS ``ReplayBuffer``), PPO on CartPole-v1 (``tfdata.nn.PPO`` over a
  ``RolloutBuffer`` of 4 environments) and SAC on Pendulum-v1 (``tfdata.nn.SAC`` over a
  ``ReplayBuffer``), none importing torch: completed or OOM-killed, the peak RSS of the process
  (``VmHWM``) and of the box (the cgroup's ``memory.max_usage_in_bytes``), steps per second;
* **the numba runtime alone**: a process that imports numpy, numba and tfdata and loads the
  kernels a loop used from a warm cache, with no buffer, learner or environment, against the same
  process after ``import numpy`` alone (the method section says exactly what is counted);
* **the largest replay capacity** of CartPole rows and of Atari rows (84x84 uint8 frames, stacks
  of 4 stored as one frame per row, ``frame_stack={"obs": 4}``) beside the DQN learner in the box:
  ``tfdata.memory.max_capacity`` of 512 MiB minus the learner process's measured footprint minus
  a margin, then verified by filling a buffer that large in the box, with the learner running,
  and sampling from it; and 1.1 times that capacity, to show what the limit does;
* **microbenchmarks** in the box: ``push`` of one CartPole row as gymnasium hands it,
  ``extend`` of 1,000 rows, ``sample(256)``, and prioritized ``sample(256)`` with
  ``update_priorities``, on AoS and SoA, against plain numpy arrays for push and sample;
* **first-step latency**, cold (an empty ``NUMBA_CACHE_DIR``: every kernel compiles) and warm (a
  filled one): from launching a fresh process to its first environment step, and to its first
  training update;
* the machine: CPU model and flags (ARM: ``Features``, ``CPU part``), board model, cores, RAM, OS,
  kernel, versions, governors, temperatures before and after, whether the CPU throttled, whether
  this runs under emulation, and the limits in force.

The box is a cgroup made for each measured process: with cgroup v1 (under the cgroup this process
is in, one per controller), ``memory.limit_in_bytes`` and ``memory.memsw.limit_in_bytes`` (no
swap) of 512 MiB, ``cpu.cfs_quota_us`` = ``cpu.cfs_period_us`` (one CPU of time) and
``cpuset.cpus`` one core; with the unified hierarchy (cgroup v2) ``memory.max``,
``memory.swap.max`` = 0 and ``cpu.max``. Each is removed when its process ends. Making one needs
root (and the memory controller enabled): where it cannot be made, or with ``--no-cgroup`` or
``TFDATA_EDGE_NO_CGROUP=1``, every process runs unconfined and the results say "limit not
enforced".

    python experiments/edge_profile.py            # the board budget (``python3 dev.py edge``): a few minutes
    python experiments/edge_profile.py --quick    # tiny budgets: checks that it all runs, a minute or two

Needs numpy, numba, psutil and gymnasium (``pip install -e ".[rl]"`` in a clone); matplotlib,
where installed, draws the plots. Writes ``reports/edge/<machine>/`` (``README.md``,
``results.json``, plots), ``<machine>`` a stable name of this machine (the board's model on a
board). Runs the checkout's tfdata. Only tfdata's public API is measured.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _siblings() -> None:
    """experiments/ on the path, for the sibling modules (a test imports this file, then takes
    experiments/ off the path again)."""
    if HERE not in sys.path:
        sys.path.insert(0, HERE)

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "edge"
MIB = 1 << 20
BOX_BYTES = 512 * MIB
#: what the capacity budget leaves free beside the buffer and the learner's measured peak: the
#: page cache the box is charged for (the interpreter's libraries, numba's cache files), the
#: allocator's slack, and the temporary arrays of filling and sampling
MARGIN_BYTES = 48 * MIB
LOOPS = ("dqn", "ppo", "sac")
LOOP_TITLES = {"dqn": "DQN, CartPole-v1", "ppo": "PPO, CartPole-v1 (4 envs)", "sac": "SAC, Pendulum-v1"}
# environment steps per loop run: long enough for steady figures, short enough for a board
STEPS = {"full": {"dqn": 50_000, "ppo": 50_176, "sac": 10_000},   # PPO: 98 iterations of 512 steps
         "quick": {"dqn": 400, "ppo": 1_024, "sac": 320}}
# CleanRL's hyperparameters (dqn.py, ppo.py, sac_continuous_action.py), as experiments/dqn_cartpole.py,
# ppo_cartpole.py and sac_continuous.py use them; learning starts earlier in the quick budget
HP = {
    "dqn": {"buffer_size": 10_000, "batch_size": 128, "lr": 2.5e-4, "gamma": 0.99, "hidden": (120, 84),
            "learning_starts": {"full": 10_000, "quick": 200}, "train_frequency": 10,
            "target_frequency": {"full": 500, "quick": 100}, "start_e": 1.0, "end_e": 0.05,
            "exploration_fraction": 0.5},
    "ppo": {"num_envs": 4, "num_steps": 128, "num_minibatches": 4, "update_epochs": {"full": 4, "quick": 1},
            "hidden": (64, 64), "lr": 2.5e-4, "gamma": 0.99, "gae_lambda": 0.95},
    "sac": {"buffer_size": 1_000_000, "batch_size": 256, "hidden": (256, 256), "gamma": 0.99, "tau": 0.005,
            "policy_lr": 3e-4, "q_lr": 1e-3, "alpha": 0.2, "autotune": True, "policy_frequency": 2,
            "target_network_frequency": 1, "learning_starts": {"full": 5_000, "quick": 260}},
}
LATENCY_REPS = {"full": {"cold": 1, "warm": 2}, "quick": {"cold": 1, "warm": 1}}
CARTPOLE = {"obs": ("f4", (4,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (4,)),
            "terminated": "?", "truncated": "?"}
FRAMES_K = 4
ATARI = {"obs": ("u1", (FRAMES_K, 84, 84)), "action": "i8", "reward": "f4",
         "next_obs": ("u1", (FRAMES_K, 84, 84)), "terminated": "?", "truncated": "?"}
ATARI_OPTIONS = {"layout": "aos", "frame_stack": {"obs": FRAMES_K}}
ATARI_BATCH = 32
ATARI_EPISODE = 100                    # steps of the synthetic episode written again and again
FILL_CHUNK = {"cartpole": 10_000, "atari": ATARI_EPISODE}
VERIFY_STEPS = {"full": 2_000, "quick": 300}  # loop steps with the filled buffer (learner training)
OVER = 1.1                             # the capacity tried beyond the computed one
MICRO = {"capacity": 100_000, "batch": 256, "extend": 1_000,
         "budget_s": {"full": 0.4, "quick": 0.03}, "rounds": {"full": 4, "quick": 1}}
TIMEOUT_S = 3600
ENV_NO_CGROUP = "TFDATA_EDGE_NO_CGROUP"


# ---------------------------------------------------------------------------------------------
# The box: a cgroup per measured process
# ---------------------------------------------------------------------------------------------
CG = "/sys/fs/cgroup"


def _write(path: str, value) -> None:
    with open(path, "w") as f:
        f.write(str(value))


def _readf(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _own_cgroup(controller: str) -> str:
    """This process's cgroup of a v1 controller ('/' on most boards), from /proc/self/cgroup."""
    for line in (_readf("/proc/self/cgroup") or "").splitlines():
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            return path
    return "/"


def _one_core() -> str:
    """The last CPU this process may run on (cpuset.cpus of the box)."""
    try:
        return str(max(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return "0"


class Box:
    """A cgroup made for one measured process: 512 MiB and one CPU.

    ``kind`` is ``"v1"`` or ``"v2"``; :meth:`make` creates the cgroup directories and writes the
    limits (raising ``OSError`` when it cannot), :meth:`join` is the child's ``preexec_fn``,
    :meth:`counters` reads what the kernel counted, :meth:`remove` deletes the directories.
    """

    def __init__(self, kind: str, name: str):
        self.kind, self.name = kind, name
        self.dirs: dict = {}
        self.limits: dict = {}

    def make(self) -> "Box":
        try:
            self._make_v1() if self.kind == "v1" else self._make_v2()
        except OSError:
            self.remove()
            raise
        return self

    def _mk(self, key: str, path: str) -> str:
        os.mkdir(path)
        self.dirs[key] = path
        return path

    def _make_v1(self) -> None:
        mem = self._mk("memory", os.path.join(CG, "memory", _own_cgroup("memory").lstrip("/"), self.name))
        _write(os.path.join(mem, "memory.limit_in_bytes"), BOX_BYTES)
        self.limits["memory.limit_in_bytes"] = int(_readf(os.path.join(mem, "memory.limit_in_bytes")))
        sw = os.path.join(mem, "memory.memsw.limit_in_bytes")
        if os.path.exists(sw):  # no swap beyond the limit (set after the memory limit, never below it)
            _write(sw, BOX_BYTES)
            self.limits["memory.memsw.limit_in_bytes"] = int(_readf(sw))
        cpu = self._mk("cpu", os.path.join(CG, "cpu", _own_cgroup("cpu").lstrip("/"), self.name))
        period = int(_readf(os.path.join(cpu, "cpu.cfs_period_us")) or 100_000)
        _write(os.path.join(cpu, "cpu.cfs_quota_us"), period)
        self.limits["cpu.cfs_quota_us / cpu.cfs_period_us"] = (
            f"{_readf(os.path.join(cpu, 'cpu.cfs_quota_us'))} / {period}")
        if os.path.isdir(os.path.join(CG, "cpuset")):
            parent = os.path.join(CG, "cpuset", _own_cgroup("cpuset").lstrip("/"))
            cs = self._mk("cpuset", os.path.join(parent, self.name))
            _write(os.path.join(cs, "cpuset.mems"), _readf(os.path.join(parent, "cpuset.mems")) or "0")
            _write(os.path.join(cs, "cpuset.cpus"), _one_core())
            self.limits["cpuset.cpus"] = _readf(os.path.join(cs, "cpuset.cpus"))

    def _make_v2(self) -> None:
        ctrl = os.path.join(CG, "cgroup.subtree_control")
        have = (_readf(ctrl) or "").split()
        for c in ("memory", "cpu", "cpuset"):
            if c not in have and c in (_readf(os.path.join(CG, "cgroup.controllers")) or "").split():
                try:
                    _write(ctrl, f"+{c}")
                except OSError:
                    if c != "cpuset":
                        raise
        d = self._mk("unified", os.path.join(CG, self.name))
        _write(os.path.join(d, "memory.max"), BOX_BYTES)
        self.limits["memory.max"] = int(_readf(os.path.join(d, "memory.max")))
        if os.path.exists(os.path.join(d, "memory.swap.max")):
            _write(os.path.join(d, "memory.swap.max"), 0)
            self.limits["memory.swap.max"] = _readf(os.path.join(d, "memory.swap.max"))
        _write(os.path.join(d, "cpu.max"), "100000 100000")
        self.limits["cpu.max"] = _readf(os.path.join(d, "cpu.max"))
        if os.path.exists(os.path.join(d, "cpuset.cpus")):
            try:
                _write(os.path.join(d, "cpuset.cpus"), _one_core())
                self.limits["cpuset.cpus"] = _readf(os.path.join(d, "cpuset.cpus"))
            except OSError:
                pass

    def procs_files(self) -> list:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def join(self) -> None:
        """In the child between fork and exec: move this process into the box (raw writes only)."""
        pid = str(os.getpid()).encode()
        for path in self.procs_files():
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)

    def counters(self) -> dict:
        """What the kernel counted for the box: peak usage, limit hits, OOM kills."""
        if self.kind == "v1":
            mem = self.dirs["memory"]
            oom = dict(line.split() for line in (_readf(os.path.join(mem, "memory.oom_control")) or "").splitlines()
                       if len(line.split()) == 2)
            num = lambda f: int(_readf(os.path.join(mem, f)) or -1)  # noqa: E731
            # with memsw limited as much as memory, the kernel may count a hit on either
            failcnt = max(num("memory.failcnt"), num("memory.memsw.failcnt")
                          if os.path.exists(os.path.join(mem, "memory.memsw.failcnt")) else -1)
            return {"max_usage_bytes": num("memory.max_usage_in_bytes"), "failcnt": failcnt,
                    "memsw_max_usage_bytes": num("memory.memsw.max_usage_in_bytes")
                    if os.path.exists(os.path.join(mem, "memory.memsw.max_usage_in_bytes")) else None,
                    "oom_kill": int(oom["oom_kill"]) if "oom_kill" in oom else None,
                    "under_oom": int(oom["under_oom"]) if "under_oom" in oom else None}
        d = self.dirs["unified"]
        ev = dict(line.split() for line in (_readf(os.path.join(d, "memory.events")) or "").splitlines())
        peak = _readf(os.path.join(d, "memory.peak"))
        return {"max_usage_bytes": int(peak) if peak else None, "failcnt": int(ev.get("max", -1)),
                "memsw_max_usage_bytes": None, "oom_kill": int(ev["oom_kill"]) if "oom_kill" in ev else None,
                "under_oom": None}

    def remove(self) -> None:
        for key in list(self.dirs)[::-1]:
            for _ in range(50):  # the kernel frees a cgroup a moment after its last process exits
                try:
                    os.rmdir(self.dirs[key])
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            self.dirs.pop(key)


def box_kind(forced_off: bool) -> tuple:
    """Which cgroups this machine lets us make: ("v1" | "v2" | None, reason in words), by making
    and removing a test one."""
    if forced_off:
        return None, "turned off (--no-cgroup or TFDATA_EDGE_NO_CGROUP=1)"
    if sys.platform != "linux":
        return None, "not Linux"
    if os.path.isdir(os.path.join(CG, "memory")) and os.path.isdir(os.path.join(CG, "cpu")):
        kind = "v1"
    elif "memory" in (_readf(os.path.join(CG, "cgroup.controllers")) or "").split():
        kind = "v2"
    else:
        return None, "no cgroup memory controller (cgroup v1 memory/cpu, or v2 with memory)"
    try:
        Box(kind, f"tfdata-edge-{os.getpid()}-probe").make().remove()
    except OSError as e:
        return None, f"cannot make a cgroup ({kind}: {e.strerror or e}); run as root to enforce the limit"
    return kind, f"cgroup {kind}"


class Runner:
    """Runs measured children: fresh interpreters of this file (``--child TASK``), each in a box
    of its own (or unconfined), and collects what they report and what the box counted."""

    def __init__(self, kind: str | None, scratch: str, log):
        self.kind, self.scratch, self.log = kind, scratch, log
        self.n = 0

    @staticmethod
    def env(cache: str) -> dict:
        """A measured process's environment: numba's cache at ``cache``, one BLAS/OpenMP thread, the
        checkout's tfdata first on the path."""
        env = dict(os.environ, NUMBA_CACHE_DIR=cache, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   MKL_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
                       [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        return env

    def run(self, task: str, args: dict, *, cache: str, boxed: bool = True, timeout: float = TIMEOUT_S) -> dict:
        self.n += 1
        out = os.path.join(self.scratch, f"child-{self.n}.json")
        env = self.env(cache)
        box = box_error = None
        if boxed and self.kind:
            try:
                box = Box(self.kind, f"tfdata-edge-{os.getpid()}-{self.n}").make()
            except OSError as e:  # made once at the start: say so and run this one unconfined
                box_error = str(e)
                self.log(f"    {task}: no cgroup ({e}): runs unconfined")
        cmd = [sys.executable, os.path.abspath(__file__), "--child", task, "--out", out, "--args",
               json.dumps(dict(args, t_spawn=time.monotonic()))]
        t0 = time.monotonic()
        popen = dict(env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            try:
                p = subprocess.Popen(cmd, preexec_fn=box.join if box else None, **popen)
            except subprocess.SubprocessError as e:  # the child could not move into the box
                if box is None:
                    raise
                box_error = f"the child could not join the cgroup ({e})"
                self.log(f"    {task}: {box_error}: runs unconfined")
                box.remove()
                box = None
                p = subprocess.Popen(cmd, **popen)
            try:
                text, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                text, _ = p.communicate()
            wall = time.monotonic() - t0
            counters = box.counters() if box else None
        finally:
            limits = box.limits if box else None
            if box:
                box.remove()
        r = {}
        if p.returncode == 0 and os.path.exists(out):
            with open(out, encoding="utf-8") as f:
                r = json.load(f)
        oom = bool(counters and counters.get("oom_kill")) or (box is not None and p.returncode == -9)
        r.update(task=task, returncode=p.returncode, completed=p.returncode == 0 and bool(r),
                 oom_killed=oom, process_wall_s=round(wall, 3), box=counters, limits=limits,
                 limit_enforced=box is not None, box_error=box_error)
        if not r["completed"]:
            r["output_tail"] = (text or "")[-3000:]
            self.log(f"    {task}: exit {p.returncode}" + (" (OOM-killed)" if oom else "")
                     + ("" if oom else f"\n{r['output_tail']}"))
        return r


# ---------------------------------------------------------------------------------------------
# The warm cache: the ONE place it is produced
# ---------------------------------------------------------------------------------------------
def produce_warm_cache(runner: Runner, cache_dir: str, loops) -> dict:
    """Fill ``cache_dir`` with the kernels of ``loops`` the way a board's installer or first boot
    would: ``python -m tfdata warmup <loops> --json`` with ``NUMBA_CACHE_DIR=cache_dir``,
    unconfined. Where this tfdata has no ``warmup`` (an older checkout), each loop's latency probe
    is run once in the cache directory instead."""
    os.makedirs(cache_dir, exist_ok=True)
    cmd = [sys.executable, "-m", "tfdata", "warmup", *loops, "--json"]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=runner.env(cache_dir), cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    wall = round(time.monotonic() - t0, 3)
    if p.returncode == 0:
        try:
            report = json.loads(p.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            report = {"stdout": p.stdout[-2000:]}
        total = report.get("total") or {}
        return {"how": "`python -m tfdata warmup " + " ".join(loops) + "` in the cache directory, unconfined",
                "process_wall_s": wall, "compiled": total.get("compiled"), "loaded": total.get("loaded"),
                "warmup": {k: report.get(k) for k in ("loops", "total", "target")}}
    runner.log(f"    tfdata warmup unavailable (exit {p.returncode}): the loops' probes fill the cache")
    out = {}
    for name in loops:
        r = runner.run("loop", {"loop": name, "budget": "quick"}, cache=cache_dir, boxed=False)
        out[name] = {"completed": r["completed"], "process_wall_s": r["process_wall_s"]}
    return {"how": "each loop's latency probe run once in the cache directory, unconfined (no `tfdata warmup` "
                   f"in this tfdata: exit {p.returncode})", "loops": out}


# ---------------------------------------------------------------------------------------------
# Child side: what runs in the box
# ---------------------------------------------------------------------------------------------
def _status(key: str) -> int | None:
    """A ``/proc/self/status`` line in bytes (``VmRSS``, ``VmHWM``); None where unreadable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    if key == "VmHWM":
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return None


def _since(t_spawn: float) -> float:
    return round(time.monotonic() - t_spawn, 4)


def _hp(name: str, budget: str) -> dict:
    """The loop's hyperparameters for a budget (per-budget entries resolved)."""
    return {k: (v[budget] if isinstance(v, dict) else v) for k, v in HP[name].items()}


def _cached_kernels() -> dict:
    """``{module:qualname: [signatures]}`` of every tfdata kernel with ``cache=True`` compiled or
    loaded in this process (found among the objects the garbage collector tracks)."""
    if "numba" not in sys.modules:
        return {}
    import gc

    from numba.core.caching import NullCache
    from numba.core.dispatcher import Dispatcher

    out = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), Dispatcher):
            f = obj.py_func
            mod = getattr(f, "__module__", "") or ""
            if (mod == "tfdata" or mod.startswith("tfdata.")) and obj.signatures \
                    and not isinstance(getattr(obj, "_cache", None), NullCache):
                out[f"{mod}:{f.__qualname__}"] = list(obj.signatures)
    return out


def loop_dqn(hp: dict, steps: int, seed: int, t_spawn: float, big=None) -> dict:
    """CleanRL's DQN loop on CartPole-v1, torch-free: epsilon-greedy act, push, sample, train,
    sync. ``big``: a (name, buffer, spec) already filled, to train from instead of a new buffer."""
    import gymnasium as gym
    import numpy as np

    import tfdata

    env = gym.make("CartPole-v1")
    n_actions = int(env.action_space.n)
    spec = tfdata.Spec.from_spaces(env.observation_space, env.action_space)
    rb = tfdata.ReplayBuffer(spec, hp["buffer_size"], layout="aos", seed=seed) if big is None else big
    net = tfdata.nn.DQN((env.observation_space.shape[0], *hp["hidden"], n_actions), lr=hp["lr"],
                        gamma=hp["gamma"], seed=seed)
    built = {"rss_built_bytes": _status("VmRSS"), "buffer_nbytes": int(rb.nbytes), "learner_nbytes": int(net.nbytes)}
    rng = np.random.default_rng(seed)
    obs, _ = env.reset(seed=seed)
    ret, returns, updates = 0.0, [], 0
    first_step = first_update = t_train = None
    span = hp["exploration_fraction"] * steps
    t0 = time.perf_counter()
    for step in range(steps):
        eps = max(hp["end_e"], hp["start_e"] + (hp["end_e"] - hp["start_e"]) * step / span)
        action = int(rng.integers(n_actions)) if rng.random() < eps else net.act(obs)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        rb.push({"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                 "terminated": terminated, "truncated": truncated})
        ret += reward
        if terminated or truncated:
            returns.append(ret)
            ret = 0.0
            obs, _ = env.reset()
        else:
            obs = next_obs
        if first_step is None:
            first_step = _since(t_spawn)
        if step >= hp["learning_starts"]:
            if step % hp["train_frequency"] == 0:
                if t_train is None:
                    t_train = time.perf_counter()
                net.train(rb.sample(hp["batch_size"]))
                updates += 1
                if first_update is None:
                    first_update = _since(t_spawn)
            if step % hp["target_frequency"] == 0:
                net.sync_target()
    t1 = time.perf_counter()
    return dict(built, steps=steps, updates=updates, loop_wall_s=t1 - t0,
                train_wall_s=(t1 - t_train) if t_train else None, train_steps=steps - hp["learning_starts"],
                first_step_s=first_step, first_update_s=first_update, episodes=len(returns),
                final_return=float(np.mean(returns[-10:])) if returns else None)


def loop_ppo(hp: dict, steps: int, seed: int, t_spawn: float) -> dict:
    """CleanRL's PPO loop on 4 CartPole-v1 environments, torch-free: act, add, GAE, minibatches,
    train."""
    import gymnasium as gym
    import numpy as np

    import tfdata

    E, T = hp["num_envs"], hp["num_steps"]
    envs = gym.vector.SyncVectorEnv([lambda: gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1"))
                                     for _ in range(E)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    obs_size = envs.single_observation_space.shape[0]
    spec = tfdata.Spec({"obs": ("f4", (obs_size,)), "action": "i8", "log_prob": "f4", "value": "f4",
                        "reward": "f4", "terminated": "?", "truncated": "?"})
    learner = tfdata.nn.PPO(obs_size=obs_size, n_actions=int(envs.single_action_space.n),
                            hidden=hp["hidden"], lr=hp["lr"], seed=seed)
    buf = tfdata.RolloutBuffer(spec, num_steps=T, num_envs=E, layout="aos", seed=seed)
    built = {"rss_built_bytes": _status("VmRSS"), "buffer_nbytes": int(buf.nbytes), "learner_nbytes": None}
    iterations = max(1, steps // (E * T))
    next_obs, _ = envs.reset(seed=seed)
    returns, updates = [], 0
    first_step = first_update = None
    t0 = time.perf_counter()
    for _ in range(iterations):
        for _ in range(T):
            actions, log_probs, values = learner.act(next_obs)
            obs = next_obs
            next_obs, reward, terminated, truncated, info = envs.step(actions)
            buf.add({"obs": obs, "action": actions, "log_prob": log_probs, "value": values,
                     "reward": reward, "terminated": terminated, "truncated": truncated})
            fi = info.get("final_info") or {}
            if "_episode" in fi:
                returns.extend(float(r) for r in fi["episode"]["r"][fi["_episode"]])
            if first_step is None:
                first_step = _since(t_spawn)
        next_done = terminated | truncated
        buf.compute_returns_and_advantages(learner.value(next_obs), next_done, gamma=hp["gamma"],
                                           gae_lambda=hp["gae_lambda"])
        for mb in buf.minibatches(hp["num_minibatches"], epochs=hp["update_epochs"]):
            learner.train(mb)
            updates += 1
            if first_update is None:
                first_update = _since(t_spawn)
        buf.reset()
    t1 = time.perf_counter()
    n = iterations * E * T
    return dict(built, steps=n, updates=updates, loop_wall_s=t1 - t0, train_wall_s=t1 - t0, train_steps=n,
                first_step_s=first_step, first_update_s=first_update, episodes=len(returns),
                final_return=float(np.mean(returns[-10:])) if returns else None)


def loop_sac(hp: dict, steps: int, seed: int, t_spawn: float) -> dict:
    """CleanRL's SAC loop on Pendulum-v1, torch-free: random actions until learning starts, then
    the policy's; push, sample and train at every step after that."""
    import gymnasium as gym
    import numpy as np

    import tfdata

    env = gym.make("Pendulum-v1")
    env.action_space.seed(seed)
    obs_dim = int(np.prod(env.observation_space.shape))
    low, high = env.action_space.low, env.action_space.high
    spec = tfdata.Spec.from_spaces(env.observation_space, env.action_space)
    rb = tfdata.ReplayBuffer(spec, hp["buffer_size"], layout="aos", seed=seed)
    learner = tfdata.nn.SAC(obs_dim, low, high, hidden=hp["hidden"], gamma=hp["gamma"], tau=hp["tau"],
                            policy_lr=hp["policy_lr"], q_lr=hp["q_lr"], alpha=hp["alpha"], autotune=hp["autotune"],
                            policy_frequency=hp["policy_frequency"],
                            target_network_frequency=hp["target_network_frequency"], seed=seed)
    built = {"rss_built_bytes": _status("VmRSS"), "buffer_nbytes": int(rb.nbytes),
             "learner_nbytes": int(learner.nbytes)}
    obs, _ = env.reset(seed=seed)
    obs = obs.astype(np.float32)
    ret, returns, updates = 0.0, [], 0
    first_step = first_update = t_train = None
    t0 = time.perf_counter()
    for step in range(steps):
        if step < hp["learning_starts"]:
            action = env.action_space.sample()
        else:
            action = learner.act(obs)
        next_obs, reward, terminated, truncated, _ = env.step(action)
        next_obs = next_obs.astype(np.float32)
        rb.push({"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                 "terminated": terminated, "truncated": truncated})
        ret += float(reward)
        if terminated or truncated:
            returns.append(ret)
            ret = 0.0
            obs, _ = env.reset()
            obs = obs.astype(np.float32)
        else:
            obs = next_obs
        if first_step is None:
            first_step = _since(t_spawn)
        if step > hp["learning_starts"]:
            if t_train is None:
                t_train = time.perf_counter()
            learner.train(rb.sample(hp["batch_size"]), step=step)
            updates += 1
            if first_update is None:
                first_update = _since(t_spawn)
    t1 = time.perf_counter()
    return dict(built, steps=steps, updates=updates, loop_wall_s=t1 - t0,
                train_wall_s=(t1 - t_train) if t_train else None, train_steps=steps - hp["learning_starts"] - 1,
                first_step_s=first_step, first_update_s=first_update, episodes=len(returns),
                final_return=float(np.mean(returns[-10:])) if returns else None)


LOOP_FUNCS = {"dqn": loop_dqn, "ppo": loop_ppo, "sac": loop_sac}


def child_loop(a: dict) -> dict:
    """One loop run: ``budget`` "full" (the measured run) or "quick" (the latency probe)."""
    rss0 = _status("VmRSS")
    name, budget = a["loop"], a["budget"]
    import gymnasium  # noqa: F401
    import numpy  # noqa: F401

    import tfdata  # noqa: F401

    r = {"rss_start_bytes": rss0, "rss_imported_bytes": _status("VmRSS"), "imported_s": _since(a["t_spawn"])}
    cpu0 = time.process_time()
    r.update(LOOP_FUNCS[name](_hp(name, budget), STEPS[budget][name], 0, a["t_spawn"]))
    # the CPU time the loop got per second of its wall clock: below 1, another process held the
    # core (a shared machine) and steps per second are low by about that factor
    r["cpu_share"] = (time.process_time() - cpu0) / r["loop_wall_s"] if r["loop_wall_s"] > 0 else None
    r["rss_end_bytes"] = _status("VmRSS")
    r["vm_hwm_bytes"] = _status("VmHWM")
    r["torch_imported"] = "torch" in sys.modules
    if a.get("kernels_out"):
        import pickle

        with open(a["kernels_out"], "wb") as f:
            pickle.dump({"kernels": _cached_kernels(),
                         "modules": sorted(m for m in sys.modules if m == "tfdata" or m.startswith("tfdata."))}, f)
    return r


def child_runtime(a: dict) -> dict:
    """The numba runtime alone: RSS after the interpreter starts, after ``import numpy``, after
    ``import numba``, after tfdata's modules the loop imported, and after loading (from the warm
    cache) every cached kernel specialization the loop used; no buffer, learner or environment."""
    import importlib
    import pickle

    r = {"rss_python_bytes": _status("VmRSS")}
    import numpy  # noqa: F401

    r["rss_numpy_bytes"] = _status("VmRSS")
    import numba  # noqa: F401

    r["rss_numba_bytes"] = _status("VmRSS")
    with open(a["kernels"], "rb") as f:
        k = pickle.load(f)
    for m in k["modules"]:
        importlib.import_module(m)
    r["rss_tfdata_bytes"] = _status("VmRSS")
    import gc

    from numba.core.dispatcher import Dispatcher

    found = {}
    for obj in gc.get_objects():
        if issubclass(type(obj), Dispatcher):
            f = obj.py_func
            found[f"{f.__module__}:{f.__qualname__}"] = obj
    t0 = time.perf_counter()
    loaded = missing = 0
    for name, sigs in k["kernels"].items():
        d = found.get(name)
        if d is None:
            missing += 1
            continue
        for s in sigs:
            d.compile(s)  # from the cache when warm: compiles nothing
            loaded += 1
    r["load_s"] = time.perf_counter() - t0
    r["rss_kernels_bytes"] = _status("VmRSS")
    hits = sum(sum(found[n].stats.cache_hits.values()) for n in k["kernels"] if n in found)
    misses = sum(sum(found[n].stats.cache_misses.values()) for n in k["kernels"] if n in found)
    r.update(kernels=len(k["kernels"]), specializations=loaded, kernels_not_found=missing, cache_hits=hits,
             cache_misses=misses, vm_hwm_bytes=_status("VmHWM"), gymnasium_imported="gymnasium" in sys.modules)
    return r


def atari_block(n: int, seed: int = 0) -> dict:
    """One synthetic Atari episode of ``n`` steps (random 84x84 frames; stacks of 4 that overlap
    as a real stream's do, the first frame repeated before the episode starts), ending in a
    termination: written again right after itself, the stream stays continuous."""
    import numpy as np

    rng = np.random.default_rng(seed)
    g = rng.integers(0, 256, (n + 1, 84, 84), dtype=np.uint8)
    idx = np.maximum(np.arange(n + 1)[:, None] - (FRAMES_K - 1) + np.arange(FRAMES_K)[None, :], 0)
    stacks = g[idx]                                          # (n + 1, K, 84, 84)
    term = np.zeros(n, bool)
    term[-1] = True
    return {"obs": stacks[:n], "action": rng.integers(0, 4, n), "reward": rng.random(n, dtype=np.float32),
            "next_obs": stacks[1:], "terminated": term, "truncated": np.zeros(n, bool)}


def cartpole_chunk(n: int, seed: int = 0) -> dict:
    import numpy as np

    rng = np.random.default_rng(seed)
    obs = rng.standard_normal((n, 4), dtype=np.float32)
    return {"obs": obs, "action": rng.integers(0, 2, n), "reward": np.ones(n, np.float32),
            "next_obs": obs + np.float32(0.01), "terminated": rng.random(n) < 0.02, "truncated": np.zeros(n, bool)}


def child_capacity(a: dict) -> dict:
    """The capacities that fit a budget (``tfdata.memory.max_capacity``) and the bytes planned."""
    import tfdata

    out = {}
    for kind, spec, batch, opts in (("cartpole", CARTPOLE, HP["dqn"]["batch_size"], {"layout": "aos"}),
                                    ("atari", ATARI, ATARI_BATCH, ATARI_OPTIONS)):
        cap = int(tfdata.memory.max_capacity(spec, a["budget"], batch_size=batch, **opts))
        parts = tfdata.ReplayBuffer.plan_memory(spec, max(cap, 1), batch_sizes=(batch,), **opts) if cap else {}
        out[kind] = {"capacity": cap, "planned_bytes": int(sum(parts.values())), "planned_parts": parts,
                     "batch": batch, "options": {k: v for k, v in opts.items()}}
    return out


def child_fill(a: dict) -> dict:
    """Beside the DQN learner (its environment, network and loop), a buffer of ``capacity`` rows of
    ``kind`` filled to the brim, then the loop run ``steps`` steps: CartPole rows are the loop's own
    buffer (trained from); Atari rows a second buffer, sampled (batch 32) at every step."""
    import numpy as np

    import tfdata

    kind, cap = a["kind"], int(a["capacity"])
    r = {"rss_start_bytes": _status("VmRSS")}
    t0 = time.perf_counter()
    if kind == "cartpole":
        buf = tfdata.ReplayBuffer(CARTPOLE, cap, layout="aos", seed=0)
        chunk = cartpole_chunk(FILL_CHUNK[kind])
        done = 0
        while done < cap:
            m = min(len(chunk["action"]), cap - done)
            buf.extend(chunk if m == len(chunk["action"]) else {k: v[:m] for k, v in chunk.items()})
            done += m
    else:
        buf = tfdata.ReplayBuffer(ATARI, cap, seed=0, **ATARI_OPTIONS)
        block = atari_block(ATARI_EPISODE)
        done = 0
        while done < cap:
            m = min(ATARI_EPISODE, cap - done)
            buf.extend(block if m == ATARI_EPISODE else {k: v[:m] for k, v in block.items()})
            done += m
        del block
    r.update(fill_s=time.perf_counter() - t0, rows=len(buf), buffer_nbytes=int(buf.nbytes),
             rss_filled_bytes=_status("VmRSS"))
    hp = dict(_hp("dqn", "quick"), learning_starts=0 if kind == "cartpole" else 200)
    steps = VERIFY_STEPS[a["budget"]]
    if kind == "cartpole":
        r["loop"] = loop_dqn(hp, steps, 0, a["t_spawn"], big=buf)
        samples = r["loop"]["updates"]
    else:
        samples = 0
        out = loop_dqn(hp, steps, 0, a["t_spawn"])
        for _ in range(steps):
            buf.sample(ATARI_BATCH)
            samples += 1
        r["loop"] = out
    x = buf.sample(ATARI_BATCH)
    r.update(samples=samples, sample_ok=bool(np.asarray(x.indices).size == ATARI_BATCH),
             rss_end_bytes=_status("VmRSS"), vm_hwm_bytes=_status("VmHWM"))
    return r


def child_micro(a: dict) -> dict:
    """push, extend(1000), sample(256), prioritized sample(256) + update_priorities, on AoS and
    SoA, and plain numpy arrays for push and sample; per-call medians."""
    import numpy as np

    import tfdata
    from _timing import gc_paused, interleaved_latencies

    cap, batch, ext = MICRO["capacity"], MICRO["batch"], MICRO["extend"]
    budget_s, rounds = MICRO["budget_s"][a["budget"]], MICRO["rounds"][a["budget"]]
    fill = cartpole_chunk(cap)
    chunk = cartpole_chunk(ext, seed=1)
    # one row as gymnasium hands it: float32 observations, a Python int action, a Python float
    # reward, Python bools
    o = np.array([0.01, -0.02, 0.03, 0.04], np.float32)
    row = {"obs": o, "action": 1, "reward": 1.0, "next_obs": o + np.float32(0.01), "terminated": False,
           "truncated": False}
    calls = {}
    for layout in ("aos", "soa"):
        rb = tfdata.ReplayBuffer(CARTPOLE, cap, layout=layout, seed=0)
        rb.extend(fill)
        per = tfdata.PrioritizedReplayBuffer(CARTPOLE, cap, layout=layout, seed=0)
        per.extend(fill)
        prios = np.random.default_rng(0).random(batch) + 0.1
        calls[f"push/{layout}"] = (lambda _, rb=rb: rb.push(row))
        calls[f"extend/{layout}"] = (lambda _, rb=rb: rb.extend(chunk))
        calls[f"sample/{layout}"] = (lambda _, rb=rb: rb.sample(batch))

        def pri(_, per=per):
            b = per.sample(batch)
            per.update_priorities(b.indices, prios)

        calls[f"prioritized/{layout}"] = pri

    # plain numpy: one preallocated array per field, written in place; a sample draws indices
    # and gathers each field (what a hand-written buffer does)
    arrays = {k: np.array(v) for k, v in fill.items()}
    pos = [0]
    rng = np.random.default_rng(0)

    def np_push(_):
        i = pos[0]
        for k, v in row.items():
            arrays[k][i] = v
        pos[0] = (i + 1) % cap

    def np_sample(_):
        idx = rng.integers(0, cap, batch)
        return {k: v[idx] for k, v in arrays.items()}

    calls["push/numpy"], calls["sample/numpy"] = np_push, np_sample
    with gc_paused():
        res = interleaved_latencies(calls, [0], budget_s=budget_s, lo=50, hi=200_000, rounds=rounds, warmup=20)[0]
    return {"stats": res, "capacity": cap, "batch": batch, "extend_rows": ext, "vm_hwm_bytes": _status("VmHWM")}


CHILD_TASKS = {"loop": child_loop, "runtime": child_runtime, "capacity": child_capacity, "fill": child_fill,
               "micro": child_micro}


def child_main(task: str, out: str, args: dict) -> None:
    r = CHILD_TASKS[task](args)
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(r, f, default=lambda o: o.item() if hasattr(o, "item") else str(o))
    os.replace(tmp, out)


# ---------------------------------------------------------------------------------------------
# The run (parent)
# ---------------------------------------------------------------------------------------------
def measure(mode: str, runner: Runner, scratch: str, log) -> dict:
    res = {}
    warm = os.path.join(scratch, "numba-warm")
    log("1. warm cache")
    res["warm_cache"] = produce_warm_cache(runner, warm, LOOPS)

    log("2. loops, to completion (warm cache)")
    loops = {}
    for name in LOOPS:
        kfile = os.path.join(scratch, f"kernels-{name}.pkl")
        r = runner.run("loop", {"loop": name, "budget": mode, "kernels_out": kfile}, cache=warm)
        r["kernels_file"] = kfile if os.path.exists(kfile) else None
        if r["completed"]:
            r["sps"] = r["steps"] / r["loop_wall_s"]
            r["sps_training"] = (r["train_steps"] / r["train_wall_s"]) if r.get("train_wall_s") else None
            log(f"    {name}: {r['steps']:,} steps, {r['sps']:,.0f} steps/s, peak RSS "
                f"{r['vm_hwm_bytes'] / MIB:.0f} MiB" + (f", box peak {r['box']['max_usage_bytes'] / MIB:.0f} MiB"
                                                        if r["box"] else ""))
        loops[name] = r
    res["loops"] = loops

    log("3. numba runtime alone")
    runtime = {}
    for name in LOOPS:
        kfile = loops[name].get("kernels_file")
        if kfile:
            runtime[name] = runner.run("runtime", {"kernels": kfile}, cache=warm)
            rt = runtime[name]
            if rt["completed"]:
                rt["runtime_bytes"] = rt["rss_kernels_bytes"] - rt["rss_numpy_bytes"]
                log(f"    {name}: {rt['runtime_bytes'] / MIB:.0f} MiB over python+numpy "
                    f"({rt['specializations']} specializations, {rt['cache_misses']} cache misses)")
    res["runtime"] = runtime

    log("4. largest capacity beside the learner")
    res["capacity"] = capacities(runner, warm, loops.get("dqn", {}), mode, log)

    log("5. microbenchmarks")
    res["micro"] = runner.run("micro", {"budget": mode}, cache=warm)

    log("6. first-step latency, cold and warm")
    lat = []
    reps = LATENCY_REPS[mode]
    for rep in range(max(reps.values())):
        for i, name in enumerate(LOOPS):
            order = ("cold", "warm") if (rep + i) % 2 == 0 else ("warm", "cold")
            for cache in order:
                if rep >= reps[cache]:
                    continue
                d = warm
                if cache == "cold":
                    d = os.path.join(scratch, f"numba-cold-{name}-{rep}")
                    os.makedirs(d)
                r = runner.run("loop", {"loop": name, "budget": "quick"}, cache=d)
                if cache == "cold":
                    shutil.rmtree(d, ignore_errors=True)
                lat.append({"loop": name, "cache": cache, "rep": rep, "completed": r["completed"],
                            "oom_killed": r["oom_killed"], "imported_s": r.get("imported_s"),
                            "first_step_s": r.get("first_step_s"), "first_update_s": r.get("first_update_s"),
                            "process_wall_s": r["process_wall_s"], "vm_hwm_bytes": r.get("vm_hwm_bytes"),
                            "box_max_usage_bytes": (r["box"] or {}).get("max_usage_bytes")})
                if r["completed"]:
                    log(f"    {name} {cache}: first step {r['first_step_s']:.2f} s, first update "
                        f"{r['first_update_s']:.2f} s")
    res["latency"] = lat
    return res


def capacities(runner: Runner, warm: str, dqn: dict, mode: str, log) -> dict:
    """Budget = box - the DQN learner process's peak without its buffer - margin; the capacities
    ``max_capacity`` gives for it; each verified by filling it beside the learner in the box, and
    1.1 times it tried (full mode)."""
    if not dqn.get("completed"):
        return {"error": "the DQN loop did not complete: no footprint to subtract"}
    footprint = dqn["vm_hwm_bytes"] - dqn["buffer_nbytes"]
    budget = BOX_BYTES - footprint - MARGIN_BYTES
    # a learner that leaves no budget, or a capacity child that fails, is a finding of the
    # report, not a crash that loses the rest of the run
    if budget <= 0:
        return {"error": f"the DQN learner's footprint ({footprint / MIB:.0f} MiB) and the margin "
                         f"({MARGIN_BYTES / MIB:.0f} MiB) leave no room for a buffer in {BOX_BYTES / MIB:.0f} MiB"}
    out = {"box_bytes": BOX_BYTES, "learner_footprint_bytes": footprint, "margin_bytes": MARGIN_BYTES,
           "budget_bytes": budget}
    plan = runner.run("capacity", {"budget": budget}, cache=warm, boxed=False)
    if not plan.get("completed"):
        return {"error": f"max_capacity failed for a budget of {budget:,} bytes (exit {plan.get('returncode')}): "
                         f"{(plan.get('output_tail') or '').strip()[-300:]}"}
    whole = runner.run("capacity", {"budget": BOX_BYTES}, cache=warm, boxed=False) if mode == "full" else {}
    if mode == "full" and not whole.get("completed"):
        log(f"    max_capacity of the whole box failed (exit {whole.get('returncode')}): not tried")
        whole = {}
    for kind in ("cartpole", "atari"):
        c = plan[kind]
        entry = dict(c)
        log(f"    {kind}: max_capacity {c['capacity']:,} rows ({c['planned_bytes'] / MIB:.0f} MiB planned)")
        # beyond the computed capacity: 1.1 times it, and a buffer planned to fill the whole box
        # (with the learner beside it, the limit must stop it)
        tries = [("fit", c["capacity"])] + ([("over", int(c["capacity"] * OVER))] if mode == "full" else []) \
            + ([("whole_box", whole[kind]["capacity"])] if whole else [])
        for label, cap in tries:
            if cap < 1:  # not one batch fits: nothing to fill (a buffer of no rows is refused)
                log(f"    {kind} {label}: a capacity of {cap} rows, not tried")
                continue
            r = runner.run("fill", {"kind": kind, "capacity": cap, "budget": mode}, cache=warm)
            keep = {k: r.get(k) for k in ("completed", "oom_killed", "returncode", "rows", "fill_s", "samples",
                                          "sample_ok", "buffer_nbytes", "vm_hwm_bytes", "rss_filled_bytes",
                                          "box", "limit_enforced", "process_wall_s")}
            keep["capacity"] = cap
            keep["what_happened"] = ("completed: filled, sampled and trained beside it"
                                     if r["completed"] else
                                     "OOM-killed by the box's memory limit" if r["oom_killed"] else
                                     f"failed (exit {r['returncode']}): {(r.get('output_tail') or '')[-300:]}")
            entry[label] = keep
            log(f"    {kind} {label} ({cap:,} rows): {keep['what_happened']}")
        out[kind] = entry
    return out


# ---------------------------------------------------------------------------------------------
# Summary and report
# ---------------------------------------------------------------------------------------------
def _median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def summarise(res: dict) -> dict:
    s = {"loops": {}, "latency": {}}
    for name, r in res["loops"].items():
        rt = res["runtime"].get(name, {})
        s["loops"][name] = {
            "completed": r["completed"], "oom_killed": r["oom_killed"], "steps": r.get("steps"),
            "sps": r.get("sps"), "sps_training": r.get("sps_training"), "peak_rss_bytes": r.get("vm_hwm_bytes"),
            "box_max_usage_bytes": (r["box"] or {}).get("max_usage_bytes"), "box_failcnt": (r["box"] or {}).get("failcnt"),
            "buffer_nbytes": r.get("buffer_nbytes"), "final_return": r.get("final_return"),
            "episodes": r.get("episodes"), "torch_imported": r.get("torch_imported"), "cpu_share": r.get("cpu_share"),
            "runtime_bytes": rt.get("runtime_bytes"), "runtime_cache_misses": rt.get("cache_misses")}
    for name in LOOPS:
        for cache in ("cold", "warm"):
            rows = [x for x in res["latency"] if x["loop"] == name and x["cache"] == cache and x["completed"]]
            s["latency"][f"{name}/{cache}"] = {
                "n": len(rows), "first_step_s": _median([x["first_step_s"] for x in rows]),
                "first_update_s": _median([x["first_update_s"] for x in rows]),
                "imported_s": _median([x["imported_s"] for x in rows]),
                "peak_rss_bytes": max((x["vm_hwm_bytes"] for x in rows if x["vm_hwm_bytes"]), default=None)}
    return s


def _mib(b) -> str:
    return "-" if b is None else f"{b / MIB:.0f}"


def _s(x, nd=2) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def headline_caveat(machine: dict, limits: dict) -> str:
    emu = machine["emulation"]
    if emu["emulated"]:
        return ("> **Timings under emulation mean nothing about ARM hardware.** This run was emulated "
                f"({'; '.join(emu['evidence'])}): its times only show that the command works; none is a finding "
                "and the report shows none. Memory figures are the emulated process's.")
    fam = machine["cpu"]["family"] or machine["machine"]
    enforced = "under a cgroup limit" if limits["enforced"] else "**without** the limit (it could not be enforced)"
    if fam != "arm":
        host = "VM" if machine.get("hypervisor") else "machine"
        return (f"> **These are {machine['machine']} figures measured {enforced} on a shared "
                f"{machine['logical_cpus']}-core {host}, not a board.** They say what tfdata does in a 512 MiB, "
                "one-CPU box; an ARM board's speeds differ, its memory figures should be close.")
    return f"> Measured on {machine.get('board_model') or machine['cpu']['model']}, {enforced}."


def methodology_rows(machine: dict, freq: dict, limits: dict, run: dict) -> list:
    cpu = machine["cpu"]
    v = machine["versions"]
    flags = cpu["features"] if cpu["family"] == "arm" else cpu["flags"]
    simd = [f for f in (flags or []) if f in ("sse4_2", "avx", "avx2", "avx512f", "fma", "asimd", "neon", "sve",
                                               "sve2", "asimddp", "fphp", "asimdhp", "atomics")]
    temps = lambda t: ", ".join(f"{k} {v:.1f} °C" for k, v in (t or {}).items()) or "not readable"  # noqa: E731
    govs = sorted(set(machine["governors"].values()))
    return [
        ("Machine (report folder)", f"`{machine['slug']}`"),
        ("Board", machine["board_model"] or "none (no /proc/device-tree/model)"),
        ("CPU", f"{cpu['model']} ({machine['machine']})"
         + (f", implementer {cpu['cpu_implementer']}, CPU part {cpu['cpu_part']}" if cpu["cpu_part"] else "")),
        ("CPU flags / features", f"{len(flags or [])} listed ({'Features' if cpu['family'] == 'arm' else 'flags'} "
                                 f"of /proc/cpuinfo, all in results.json); SIMD among them: {', '.join(simd) or 'none'}"),
        ("Cores", f"{machine['logical_cpus']} logical CPUs"
         + (f", virtual machine ({machine['hypervisor']})" if machine.get("hypervisor") else "")),
        ("RAM", f"{machine['mem_total_bytes'] / MIB:,.0f} MiB, swap {(machine['swap_total_bytes'] or 0) / MIB:,.0f} MiB"),
        ("OS / kernel", f"{machine['os']['distribution'] or machine['os']['system']} / {machine['os']['kernel']}"),
        ("Python / numpy / numba / llvmlite / gymnasium",
         f"{v['python']} / {v['numpy']} / {v['numba']} / {v['llvmlite']} / {v['gymnasium']}"),
        ("CPU frequency governor", ", ".join(govs) or "not readable (no cpufreq)"),
        ("Temperatures before / after", f"{temps(freq['temperatures_before_c'])} / {temps(freq['temperatures_after_c'])}"),
        ("CPU throttled during the run", f"{freq['throttled']} ({freq['how']})"),
        ("Emulated", ("**yes**: " + "; ".join(machine["emulation"]["evidence"])) if machine["emulation"]["emulated"]
         else "no" + (f" ({'; '.join(machine['emulation']['evidence'])})" if machine["emulation"]["evidence"] else "")
         if machine["emulation"]["emulated"] is False else "unknown"),
        ("Limits in force", limits["text"]),
        ("Run", f"{run['mode']}: `{run['command']}`, {run['wall_clock_s']:.0f} s, started {run['started_utc']}"),
    ]


def findings(res: dict, s: dict, emulated: bool) -> list:
    """The report's first section, in words from the figures (no timing under emulation)."""
    L = []
    loops = [s["loops"][n] for n in LOOPS if n in s["loops"]]
    done = [n for n in LOOPS if s["loops"].get(n, {}).get("completed")]
    peaks = [x["peak_rss_bytes"] for x in loops if x["peak_rss_bytes"]]
    rts = [x["runtime_bytes"] for x in loops if x["runtime_bytes"]]
    L.append(f"* {len(done)} of {len(LOOPS)} edge loops ran to completion in the box"
             + (f"; peak RSS {min(peaks) / MIB:.0f}-{max(peaks) / MIB:.0f} MiB" if peaks else "")
             + (f", of which the numba runtime alone (numba, LLVM and the loop's kernels over python+numpy) is "
                f"{min(rts) / MIB:.0f}-{max(rts) / MIB:.0f} MiB: the buffers, networks and environments are the rest"
                if rts else "") + ".")
    if not emulated and done:
        share = lambda n: ("" if s["loops"][n].get("cpu_share") is None  # noqa: E731
                           else f" (CPU share {s['loops'][n]['cpu_share']:.2f})")
        L.append("* Steps per second in one CPU: " + ", ".join(
            f"{n.upper()} {s['loops'][n]['sps']:,.0f}{share(n)}" for n in done)
                 + ". A CPU share below 1 means another process held the core for that part of the run: "
                   "those speeds are low by about that factor.")
    cap = res["capacity"]
    if "budget_bytes" in cap:
        parts = []
        for kind, what in (("cartpole", "CartPole rows"), ("atari", "Atari rows (one 84x84 frame stored per row)")):
            c = cap.get(kind) or {}
            if "capacity" in c:
                ok = (c.get("fit") or {}).get("completed")
                parts.append(f"{c['capacity']:,} {what}, " + ("verified in the box" if ok else "**not** verified"))
        L.append(f"* Beside the DQN learner, a {cap['budget_bytes'] / MIB:.0f} MiB budget holds " + "; ".join(parts) + ".")
        over = [f"{kind} x{OVER}: {'fit' if c['over']['completed'] else 'OOM-killed' if c['over']['oom_killed'] else 'failed'}"
                for kind, c in ((k, cap.get(k) or {}) for k in ("cartpole", "atari")) if c.get("over")]
        whole = [f"{kind}: {'OOM-killed' if c['whole_box']['oom_killed'] else 'not killed'}"
                 for kind, c in ((k, cap.get(k) or {}) for k in ("cartpole", "atari")) if c.get("whole_box")]
        if over or whole:
            L.append("* Beyond it: " + "; ".join(over) + (" (the budget counts the learner's RSS, more than the box is "
                                                           "charged for)" if over else "")
                     + ("; a buffer of 512 MiB beside the learner: " + ", ".join(whole) if whole else "") + ".")
    if not emulated:
        lat = s["latency"]
        pairs = [(n, lat[f"{n}/cold"]["first_update_s"], lat[f"{n}/warm"]["first_update_s"]) for n in LOOPS]
        pairs = [p for p in pairs if p[1] and p[2]]
        if pairs:
            L.append("* First training update after launch, cold numba cache against warm: " + ", ".join(
                f"{n.upper()} {c:.1f} s against {w:.1f} s" for n, c, w in pairs)
                     + ": a cache filled ahead of time (a first-boot step) is what makes a board's first start quick.")
    return L


def write_report(out_dir: str, res: dict, s: dict, machine: dict, freq: dict, limits: dict, run: dict,
                 plots: list) -> None:
    from _render import md_table
    from _render import write_report as write_methodology_report

    emulated = bool(machine["emulation"]["emulated"])
    L = [f"# Edge profile: tfdata in a 512 MiB, one-CPU box ({machine['slug']})\n",
         headline_caveat(machine, limits) + "\n",
         f"Made by `experiments/edge_profile.py` (`python3 dev.py edge`; {run['mode']} run, "
         f"{run['wall_clock_s']:.0f} s). Raw numbers: `results.json`."
         + ("" if limits["enforced"] else " **Limit not enforced**: " + limits["reason"] + ".") + "\n",
         "## Findings\n"] + findings(res, s, emulated) + ["", "## The edge loops, to completion\n"]
    rows = []
    for name in LOOPS:
        x = s["loops"].get(name)
        if not x:
            continue
        status = "completed" if x["completed"] else ("**OOM-killed**" if x["oom_killed"] else "**failed**")
        rows.append([LOOP_TITLES[name], status, f"{x['steps'] or 0:,}",
                     "-" if emulated or x["sps"] is None else f"{x['sps']:,.0f}",
                     "-" if emulated or x["sps_training"] is None else f"{x['sps_training']:,.0f}",
                     "-" if emulated or x.get("cpu_share") is None else f"{x['cpu_share']:.2f}",
                     _mib(x["peak_rss_bytes"]), _mib(x["box_max_usage_bytes"]),
                     "-" if x["box_failcnt"] is None else x["box_failcnt"], _mib(x["runtime_bytes"]),
                     f"{(x['buffer_nbytes'] or 0) / MIB:.1f}",
                     "-" if x["final_return"] is None else f"{x['final_return']:.0f}"])
    L += md_table(["loop", "status", "steps", "steps/s", "steps/s training", "CPU share", "peak RSS (MiB)",
                   "box peak (MiB)", "box limit hits", "numba runtime (MiB)", "buffer (MiB)",
                   "final return (last 10 episodes)"], rows, "llrrrrrrrrrr") + [""]
    L.append("* Peak RSS: the process's own `VmHWM`. Box peak: the cgroup's `memory.max_usage_in_bytes` "
             "(v2: `memory.peak`): the pages charged to the box, its process's anonymous memory and the page cache "
             "it brought in. It can be below the RSS: pages of files (the interpreter, numpy's and numba's "
             "libraries) another process already had in the page cache stay charged to that process's cgroup, "
             "yet count in this one's RSS. On a board with nothing else running, the RSS is the figure to "
             "budget. Box limit hits: `memory.failcnt` (or `memory.memsw.failcnt` where larger: times usage "
             "reached the limit and the kernel had to reclaim; not kills). Buffer: the bytes it holds (`nbytes`; pages never written are never resident). No loop "
             "imports torch.")
    L.append("* Steps per second: environment steps over the loop's wall clock (setup outside); training: "
             "from the first update on. CPU share: the process's CPU time over the loop's wall clock (below 1: "
             "another process held the core, and the speeds are low by about that factor). One seed, one run "
             "per loop. Final return: a sanity check of the loop, "
             "not a learning result (one seed).")
    rt = res["runtime"]
    if rt:
        L += ["", "## The numba runtime alone\n"]
        rrows = [[name, _mib(r.get("rss_python_bytes")), _mib(r.get("rss_numpy_bytes")), _mib(r.get("rss_numba_bytes")),
                  _mib(r.get("rss_tfdata_bytes")), _mib(r.get("rss_kernels_bytes")),
                  f"{r.get('kernels', '-')} / {r.get('specializations', '-')}", r.get("cache_misses", "-"),
                  f"**{_mib(r.get('runtime_bytes'))}**"] for name, r in rt.items() if r.get("completed")]
        L += md_table(["kernels of", "python", "+ numpy", "+ numba", "+ tfdata modules", "+ kernels loaded",
                       "kernels / specializations", "cache misses", "numba runtime (MiB)"], rrows, "lrrrrrrrr") + [""]
        L.append("* Definition: one fresh process in the box, warm cache; `VmRSS` after the interpreter starts, "
                 "after `import numpy`, after `import numba`, after importing every tfdata module the loop's "
                 "process had imported, and after loading every cached kernel specialization the loop used "
                 "(`Dispatcher.compile(signature)`, served from the cache: 0 misses means nothing compiled). No "
                 "buffer, learner, environment or gymnasium. **numba runtime = RSS with the kernels loaded minus "
                 "RSS after `import numpy`**: what running tfdata's kernels costs a process that already has "
                 "numpy.")
    cap = res["capacity"]
    L += ["", "## The largest replay capacity beside the learner\n"]
    if "error" in cap:
        L.append(f"Not measured: {cap['error']}.")
    else:
        L.append(f"Budget = box {cap['box_bytes'] / MIB:.0f} MiB − the DQN learner process's footprint "
                 f"{cap['learner_footprint_bytes'] / MIB:.0f} MiB (its peak RSS in the loop above minus its "
                 f"buffer's bytes) − margin {cap['margin_bytes'] / MIB:.0f} MiB = **{cap['budget_bytes'] / MIB:.0f} MiB**; "
                 "capacity = `tfdata.memory.max_capacity(spec, budget, batch_size=...)`. The margin leaves room "
                 "for the page cache the box is charged for, the allocator's slack and the temporaries of "
                 "filling and sampling.\n")
        crow = []
        for kind, title in (("cartpole", "CartPole rows (AoS)"), ("atari", "Atari rows: 84x84 uint8, stacks of 4 "
                                                                          "stored as one frame (`frame_stack`)")):
            c = cap.get(kind)
            if not c:
                continue
            for label in ("fit", "over", "whole_box"):
                t = c.get(label)
                if not t:
                    continue
                crow.append([title if label == "fit" else "", {"fit": "max_capacity", "over": f"× {OVER}",
                                                                "whole_box": "a buffer of 512 MiB"}[label],
                             f"{t['capacity']:,}", f"{c['planned_bytes'] / MIB:.0f}" if label == "fit" else "",
                             t["what_happened"], _mib(t["vm_hwm_bytes"]), _mib((t["box"] or {}).get("max_usage_bytes")),
                             "-" if not t["box"] else t["box"]["failcnt"],
                             "-" if emulated or t["fill_s"] is None else f"{t['fill_s']:.1f}"])
        L += md_table(["rows", "capacity", "rows", "planned (MiB)", "in the box", "peak RSS (MiB)", "box peak (MiB)",
                       "box limit hits", "fill (s)"], crow, "llrrlrrrr") + [""]
        L.append(f"* Verified: a fresh process in the box runs the DQN loop (environment, `tfdata.nn.DQN`, "
                 f"warm kernels) beside a buffer of that capacity filled to the brim (extends of "
                 f"{FILL_CHUNK['cartpole']:,} CartPole rows, or of a {ATARI_EPISODE}-step synthetic Atari episode "
                 "again and again), then runs the loop: with CartPole rows the filled buffer is the loop's own "
                 "(trained from); with Atari rows it sits beside the loop's own buffer and is sampled (batch "
                 f"{ATARI_BATCH}) at every step. The DQN learner is the MLP of CartPole: an Atari learner (a "
                 "CNN) would take more, and tfdata.nn has none.")
        killed = [t for c in (cap.get("cartpole") or {}, cap.get("atari") or {}) for t in c.values()
                  if isinstance(t, dict) and t.get("oom_killed") and t.get("box")]
        if any(t["box"].get("failcnt") == 0 for t in killed):
            L.append("* This kernel's `failcnt` stayed 0 even for the processes the box OOM-killed (its peak reached "
                     "the limit and `memory.oom_control` counted the kill): read limit hits with the box peak.")
        if any("over" in (cap.get(k) or {}) for k in ("cartpole", "atari")):
            L.append(f"* Beyond it: {OVER} times the capacity, and the capacity `max_capacity` gives for the "
                     "whole box (512 MiB of buffer, the learner beside it): what the limit does. The computed "
                     "capacity budgets the learner's RSS, which is more than the box is charged for (see the box "
                     f"peak above): {OVER} times it can still fit.")
    L += ["", "## Microbenchmarks (in the box)\n"]
    mi = res["micro"]
    if emulated:
        L.append("Not shown: timed under emulation (in `results.json` only, as a check that they run).")
    elif not mi.get("completed"):
        L.append("Failed: see `results.json`.")
    else:
        st = mi["stats"]
        mrows = []
        for op, title in (("push", "push (one CartPole row, as gymnasium hands it)"),
                          ("extend", f"extend ({mi['extend_rows']:,} rows)"),
                          ("sample", f"sample({mi['batch']}) uniform"),
                          ("prioritized", f"prioritized sample({mi['batch']}) + update_priorities")):
            cells = [st.get(f"{op}/{lay}") for lay in ("aos", "soa", "numpy")]
            mrows.append([title] + ["-" if c is None else f"{c['median_us']:.2f}" for c in cells])
        L += md_table(["operation", "AoS (µs)", "SoA (µs)", "plain numpy (µs)"], mrows, "lrrr") + [""]
        L.append(f"* Medians of per-call times (`time.perf_counter_ns` around each call, interleaved in rounds), "
                 f"buffers of {mi['capacity']:,} CartPole rows filled first (push overwrites). Plain numpy: one "
                 "preallocated array per field written in place for push; `rng.integers` and a fancy index per "
                 "field for sample.")
    L += ["", "## First-step latency, cold and warm\n"]
    if emulated:
        L.append("Not shown: timed under emulation (in `results.json` only).")
    else:
        lrows = []
        for name in LOOPS:
            for cache in ("cold", "warm"):
                x = s["latency"][f"{name}/{cache}"]
                lrows.append([LOOP_TITLES[name], cache, x["n"], _s(x["imported_s"]), _s(x["first_step_s"]),
                              _s(x["first_update_s"]), _mib(x["peak_rss_bytes"])])
        L += md_table(["loop", "numba cache", "processes", "imports done (s)", "first step (s)", "first update (s)",
                       "peak RSS (MiB)"], lrows, "llrrrrr") + [""]
        L.append("* From launching a fresh process in the box (before the interpreter starts) to the end of its first "
                 "environment step (act, step, store) and to the end of its first training update, median over the "
                 "processes. The probe is the loop with a tiny budget (learning starts after "
                 f"{HP['dqn']['learning_starts']['quick']} DQN steps, {HP['sac']['learning_starts']['quick']} SAC "
                 "steps, one PPO rollout of 128 steps x 4 environments): the first update includes those steps. "
                 "Cold: an empty `NUMBA_CACHE_DIR`, every kernel compiles; warm: the cache "
                 f"{res['warm_cache']['how'].split(' in the cache directory')[0]} filled beforehand "
                 "(`produce_warm_cache` in the script).")
    L += [""] + [f"![{p}]({p})\n" for p in plots]
    L += ["## Method\n",
          "* **The box.** " + limits["how"],
          "* Every measured process is a fresh interpreter of `experiments/edge_profile.py --child ...`, with "
          "`OMP_NUM_THREADS=1`, numba's cache in a scratch folder, the checkout's tfdata on `PYTHONPATH`.",
          "* Not measured: a cold operating-system file cache; more than one seed; an Atari learner.", "",
          "## The machine, the limits, the run\n"]
    L += md_table(["", ""], methodology_rows(machine, freq, limits, run), "ll") + [""]
    os.makedirs(out_dir, exist_ok=True)
    write_methodology_report(out_dir, L, run)


def plot(out_dir: str, s: dict, res: dict, emulated: bool) -> list:
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    fig, ax = plt.subplots(figsize=(8, 3.6))
    labels, vals, colors = [], [], []
    for name in LOOPS:
        x = s["loops"].get(name) or {}
        for key, lab, col in (("runtime_bytes", "numba runtime", "tab:orange"), ("peak_rss_bytes", "peak RSS", "tab:blue"),
                              ("box_max_usage_bytes", "box peak", "tab:gray")):
            if x.get(key) is not None:
                labels.append(f"{name}: {lab}")
                vals.append(x[key] / MIB)
                colors.append(col)
    cap = res["capacity"]
    if "budget_bytes" in cap:
        labels.append("capacity budget")
        vals.append(cap["budget_bytes"] / MIB)
        colors.append("tab:green")
    if vals:
        ax.barh(labels[::-1], vals[::-1], color=colors[::-1])
        ax.axvline(BOX_BYTES / MIB, color="red", ls="--", label="512 MiB box")
        ax.set_xlabel("MiB")
        ax.legend(loc="lower right", fontsize=8)
        ax.set_title("Memory in the box")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "memory.png"), dpi=110)
        names.append("memory.png")
    plt.close(fig)
    if not emulated:
        fig, ax = plt.subplots(figsize=(8, 3.2))
        y, w = range(len(LOOPS)), 0.38
        for j, cache in enumerate(("cold", "warm")):
            v = [s["latency"][f"{n}/{cache}"]["first_update_s"] or 0 for n in LOOPS]
            ax.barh([i + (j - 0.5) * w for i in y], v, height=w, label=f"{cache} cache")
        ax.set_yticks(list(y), [LOOP_TITLES[n] for n in LOOPS])
        ax.set_xlabel("seconds from launch to the first training update")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "latency.png"), dpi=110)
        plt.close(fig)
        names.append("latency.png")
    return names


def limits_summary(kind: str | None, reason: str, res: dict) -> dict:
    got = next((r.get("limits") for r in res["loops"].values() if r.get("limits")), None)
    if kind is None:
        return {"enforced": False, "kind": None, "reason": reason, "limits": None,
                "text": f"**limit not enforced** ({reason}): every process ran unconfined",
                "how": f"Not made: {reason}. Every process ran unconfined; figures of memory are what each "
                       "process used, and nothing stopped it from using more."}
    how = ("A cgroup per measured process, made for it and removed after it: " + (
        "cgroup v1, under the cgroup the run is in (one directory per controller): memory "
        "`memory.limit_in_bytes` = 512 MiB and `memory.memsw.limit_in_bytes` = 512 MiB (where the kernel has "
        "swap accounting: no swap beyond the limit), cpu `cpu.cfs_quota_us` = `cpu.cfs_period_us` (one CPU of "
        "time), cpuset `cpuset.cpus` = one core; the process is moved in between fork and exec (its "
        "`cgroup.procs`), so the interpreter's start is inside. Peak: `memory.max_usage_in_bytes`; limit hits: "
        "`memory.failcnt`; OOM kills: `memory.oom_control`'s `oom_kill` (and an exit by SIGKILL)."
        if kind == "v1" else
        "cgroup v2 at the root of the unified hierarchy: `memory.max` = 512 MiB, `memory.swap.max` = 0, "
        "`cpu.max` = `100000 100000` (one CPU), `cpuset.cpus` one core where the controller is on; the process is "
        "moved in between fork and exec. Peak: `memory.peak`; limit hits: `memory.events` max; OOM kills: "
        "`memory.events` oom_kill."))
    return {"enforced": True, "kind": kind, "reason": reason, "limits": got,
            "text": f"cgroup {kind}: " + ", ".join(f"`{k}` = {v}" for k, v in (got or {}).items()), "how": how}


def main(argv=None) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny budgets: checks that everything runs")
    ap.add_argument("--no-cgroup", action="store_true", help="run unconfined (the results say so)")
    ap.add_argument("--render", metavar="RESULTS_JSON", help="write README.md and the plots again from a "
                    "results.json (nothing measured)")
    ap.add_argument("--child", choices=sorted(CHILD_TASKS), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--args", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    _siblings()
    if args.child:
        return child_main(args.child, args.out, json.loads(args.args))
    from _recording import FrequencySampler, RunRecord, edge_machine, read_results, report_dir, write_json

    if args.render:
        d = read_results(args.render)
        out_dir = os.path.dirname(os.path.abspath(args.render))
        plots = plot(out_dir, d["summary"], d["raw"], bool(d["machine"]["emulation"]["emulated"]))
        write_report(out_dir, d["raw"], d["summary"], d["machine"], d["throttling"], d["limits"], d["methodology"],
                     plots)
        return print(f"report: {os.path.relpath(out_dir)}/README.md")
    mode = "quick" if args.quick else "full"
    machine = edge_machine()
    out_dir = os.path.join(report_dir(EXPERIMENT), machine["slug"])
    forced = args.no_cgroup or os.environ.get(ENV_NO_CGROUP, "") not in ("", "0")
    kind, reason = box_kind(forced)
    log = lambda m: print(m, flush=True)  # noqa: E731
    log(f"edge profile ({mode}) of {machine['slug']}: box {'cgroup ' + kind if kind else 'NOT enforced: ' + reason}")
    command = "python experiments/edge_profile.py" + (" --quick" if args.quick else "") + (
        " --no-cgroup" if args.no_cgroup else "")
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=[0], command=command, lean=True,
                    parameters={"box_bytes": BOX_BYTES, "margin_bytes": MARGIN_BYTES, "steps": STEPS[mode],
                                "hp": HP, "latency_reps": LATENCY_REPS[mode], "micro": MICRO, "over": OVER,
                                "verify_steps": VERIFY_STEPS[mode]})
    sampler = FrequencySampler().start()
    scratch = tempfile.mkdtemp(prefix="tfdata-edge-")
    try:
        res = measure(mode, Runner(kind, scratch, log), scratch, log)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    freq = sampler.stop()
    for r in res["loops"].values():
        r.pop("kernels_file", None)
    limits = limits_summary(kind, reason, res)
    s = summarise(res)
    peak = max([r.get("vm_hwm_bytes") or 0 for r in res["loops"].values()] or [0]) or None
    run = rec.finish(child_peak_rss_bytes=peak)
    os.makedirs(out_dir, exist_ok=True)
    write_json(os.path.join(out_dir, "results.json"),
               {"methodology": run, "machine": machine, "throttling": freq, "limits": limits, "summary": s, "raw": res})
    plots = plot(out_dir, s, res, bool(machine["emulation"]["emulated"]))
    write_report(out_dir, res, s, machine, freq, limits, run, plots)
    log(f"{mode} run done in {run['wall_clock_s']:.0f} s; report: {os.path.relpath(out_dir)}/README.md")


if __name__ == "__main__":
    main()
