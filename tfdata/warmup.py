"""Compile and cache, ahead of time, the kernels of the edge loops (``python -m tfdata warmup``).

The first process that calls a kernel with a given set of argument types compiles it (numba,
``cache=True``) and writes the machine code to the kernel cache; later processes load it. On a
small board a cold first step of a loop takes seconds of compiling: an installer or a first-boot
step runs ``python -m tfdata warmup`` once, and every later process starts warm.

Each loop is driven through tfdata's public calls with the value types a gymnasium loop hands
them (numba specializes a kernel on each argument's dtype, number of dimensions, contiguity and
write flag), so the specializations compiled here are the ones the real loop asks for; neither
gymnasium nor torch is needed:

* ``dqn``: :class:`tfdata.nn.DQN` over an AoS :class:`tfdata.ReplayBuffer` with CartPole-v1's
  spec (``Spec.from_spaces``); rows pushed as gymnasium gives them (float32 observation arrays,
  a Python int action, a Python or numpy float reward, bool flags); act, sample, train, sync.
* ``ppo``: :class:`tfdata.nn.PPO` over a :class:`tfdata.RolloutBuffer` of 4 CartPole
  environments (a vector environment's arrays); act, add, GAE, minibatches, train, reset.
* ``sac``: :class:`tfdata.nn.SAC` over an AoS ``ReplayBuffer`` with Pendulum-v1's spec
  (observation float32 (3,), action float32 (1,) in [-2, 2]); rows pushed from a one-env vector
  environment's arrays; act, sample, train with and without the policy update.

When the cache is stale, numba compiles again (see docs/design/kernels.md, "The kernel cache"):
an entry is keyed by its signature and by the target (LLVM triple, CPU name, CPU features), and
its file by the Python version; a new numba version or an edit of a tfdata source
(:mod:`tfdata._kernel_cache`) empties a kernel's index. Running ``warmup`` again after an
upgrade, or on another CPU, compiles what changed and loads the rest.

This module imports numba only inside functions (``import tfdata`` stays free of it).
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from . import _config

#: The loops, in the order ``all`` runs them: name -> what it drives.
LOOPS = {
    "dqn": "tfdata.nn.DQN over an AoS ReplayBuffer (CartPole-v1's spec): act, push, sample, train, sync",
    "ppo": "tfdata.nn.PPO over a RolloutBuffer of 4 CartPole-v1 envs: act, add, GAE, minibatches, train",
    "sac": "tfdata.nn.SAC over an AoS ReplayBuffer (Pendulum-v1's spec): act, push, sample, train",
}

# The loops' hyperparameters where they decide a call's argument types or paths (the sizes of
# experiments/compile_budget.py's workloads and experiments/sac_continuous.py's CleanRL values);
# capacities are small: no kernel is specialized on a size
DQN = {"hidden": (120, 84), "batch_size": 128, "capacity": 1024, "lr": 2.5e-4, "gamma": 0.99}
PPO = {"num_envs": 4, "num_steps": 128, "iterations": 2, "num_minibatches": 4, "update_epochs": 2,
       "hidden": (64, 64), "lr": 2.5e-4, "gamma": 0.99, "gae_lambda": 0.95}
SAC = {"hidden": (256, 256), "batch_size": 256, "capacity": 1024, "gamma": 0.99, "tau": 0.005,
       "policy_lr": 3e-4, "q_lr": 1e-3, "alpha": 0.2, "autotune": True, "policy_frequency": 2,
       "target_network_frequency": 1}
CARTPOLE_OBS, CARTPOLE_ACTIONS = 4, 2
PENDULUM_OBS, PENDULUM_LOW, PENDULUM_HIGH = 3, -2.0, 2.0


class CacheNotWritable(RuntimeError):
    """The kernel cache directory cannot be created or written."""


# ---------------------------------------------------------------------------------------------
# The specs gymnasium's spaces give (Spec.from_spaces), without gymnasium
# ---------------------------------------------------------------------------------------------
def cartpole_spec():
    """``Spec.from_spaces`` of CartPole-v1: ``Box(4,) float32`` observations, ``Discrete(2)``."""
    from .spec import Spec

    return Spec({"obs": ("f4", (CARTPOLE_OBS,)), "action": "i8", "reward": "f4",
                 "next_obs": ("f4", (CARTPOLE_OBS,)), "terminated": "?", "truncated": "?"})


def pendulum_spec():
    """``Spec.from_spaces`` of Pendulum-v1: ``Box(3,) float32`` observations, a ``Box(-2, 2, (1,),
    float32)`` action (its bounds kept on the field)."""
    from .spec import Field, Spec

    low, high = np.full(1, PENDULUM_LOW, np.float32), np.full(1, PENDULUM_HIGH, np.float32)
    return Spec([Field("obs", np.float32, (PENDULUM_OBS,)),
                 Field("action", np.float32, (1,), low=low, high=high),
                 Field("reward", np.float32, ()), Field("next_obs", np.float32, (PENDULUM_OBS,)),
                 Field("terminated", np.bool_, ()), Field("truncated", np.bool_, ())])


# ---------------------------------------------------------------------------------------------
# The loops: public calls only, with gymnasium's value types. ``mark(name)`` is called when the
# first step (the first act and store) and the first update (the first train) are complete.
# ---------------------------------------------------------------------------------------------
def _nothing(name: str) -> None:
    pass


def loop_dqn(mark=_nothing, seed: int = 0) -> None:
    """The edge DQN loop (experiments/compile_budget.py ``workload_dqn``), short.

    CartPole's ``step`` returns a fresh float32 array of shape (4,), a Python float reward and
    Python bool flags; the action is a Python int (random, or ``DQN.act``'s)."""
    from . import nn
    from .replay.buffer import ReplayBuffer

    hp = DQN
    rng = np.random.default_rng(seed)
    rb = ReplayBuffer(cartpole_spec(), hp["capacity"], layout="aos", seed=seed)
    net = nn.DQN((CARTPOLE_OBS, *hp["hidden"], CARTPOLE_ACTIONS), lr=hp["lr"], gamma=hp["gamma"], seed=seed)

    def observation():
        return rng.uniform(-0.05, 0.05, CARTPOLE_OBS).astype(np.float32)

    obs = observation()
    for step in range(hp["batch_size"] + 8):
        action = int(rng.integers(CARTPOLE_ACTIONS)) if step % 2 else net.act(obs)
        next_obs = observation()
        # the reward as CartPole gives it (a Python float) and as a wrapper may (numpy floats);
        # the flags as Python and numpy bools, an episode ending both ways
        reward = (1.0, np.float64(1.0), np.float32(1.0))[step % 3]
        terminated, truncated = step % 10 == 9, step % 25 == 24
        if step % 4 > 1:
            terminated, truncated = np.bool_(terminated), np.bool_(truncated)
        rb.push({"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                 "terminated": terminated, "truncated": truncated})
        if step == 0:
            mark("first_step")
        obs = observation() if terminated or truncated else next_obs
    for _ in range(2):
        net.train(rb.sample(hp["batch_size"]))
        mark("first_update")
        net.sync_target()


def loop_ppo(mark=_nothing, seed: int = 0) -> None:
    """The edge PPO loop (experiments/compile_budget.py ``workload_ppo``), short.

    A gymnasium vector environment's step gives float32 observations of shape (E, 4), float64
    rewards and bool flags of shape (E,); ``PPO.act``'s outputs go into ``add`` as they are.
    Two rollouts: ``add`` takes its checked path first, its fast path after."""
    from . import nn
    from .rollout import RolloutBuffer
    from .spec import Spec

    hp = PPO
    E, T = hp["num_envs"], hp["num_steps"]
    rng = np.random.default_rng(seed)
    spec = Spec({"obs": ("f4", (CARTPOLE_OBS,)), "action": "i8", "log_prob": "f4", "value": "f4",
                 "reward": "f4", "terminated": "?", "truncated": "?"})
    learner = nn.PPO(obs_size=CARTPOLE_OBS, n_actions=CARTPOLE_ACTIONS, hidden=hp["hidden"], lr=hp["lr"],
                     seed=seed)
    buf = RolloutBuffer(spec, num_steps=T, num_envs=E, layout="aos", seed=seed)

    def observations():
        return rng.uniform(-0.05, 0.05, (E, CARTPOLE_OBS)).astype(np.float32)

    next_obs = observations()
    next_done = np.zeros(E, bool)
    k = 0
    for iteration in range(hp["iterations"]):
        learner.lr = (1.0 - iteration / hp["iterations"]) * hp["lr"]  # annealed, as ppo_cartpole.py
        for _ in range(T):
            actions, log_probs, values = learner.act(next_obs)
            obs = next_obs
            next_obs = observations()
            reward = np.ones(E)  # float64, as a vector environment's
            terminated = (np.arange(E) + k) % 23 == 22
            truncated = (np.arange(E) + k) % 57 == 56
            buf.add({"obs": obs, "action": actions, "log_prob": log_probs, "value": values,
                     "reward": reward, "terminated": terminated, "truncated": truncated})
            if k == 0:
                mark("first_step")
            k += 1
            next_done = terminated | truncated
        buf.compute_returns_and_advantages(learner.value(next_obs), next_done, gamma=hp["gamma"],
                                           gae_lambda=hp["gae_lambda"])
        for mb in buf.minibatches(hp["num_minibatches"], epochs=hp["update_epochs"]):
            learner.train(mb)
            mark("first_update")
        buf.reset()


def loop_sac(mark=_nothing, seed: int = 0) -> None:
    """The edge SAC loop (experiments/sac_continuous.py, variant ``edge``), short.

    A one-env vector environment gives float32 observations of shape (1, 3), float64 rewards
    and bool flags of shape (1,); the actions are a float32 (1, 1) array (the space's samples,
    or ``SAC.act(obs[0])[None]``); ``push`` takes row 0 of each. ``train`` runs on a step with
    the policy update and on one without."""
    from . import nn
    from .replay.buffer import ReplayBuffer

    hp = SAC
    rng = np.random.default_rng(seed)
    spec = pendulum_spec()
    rb = ReplayBuffer(spec, hp["capacity"], layout="aos", seed=seed)
    low, high = np.full(1, PENDULUM_LOW, np.float32), np.full(1, PENDULUM_HIGH, np.float32)
    learner = nn.SAC(PENDULUM_OBS, low, high, hidden=hp["hidden"], gamma=hp["gamma"], tau=hp["tau"],
                     policy_lr=hp["policy_lr"], q_lr=hp["q_lr"], alpha=hp["alpha"], autotune=hp["autotune"],
                     policy_frequency=hp["policy_frequency"],
                     target_network_frequency=hp["target_network_frequency"], seed=seed)

    def observations():
        return rng.uniform(-1.0, 1.0, (1, PENDULUM_OBS)).astype(np.float32)

    obs = observations()
    for step in range(hp["batch_size"] + 8):
        if step % 2 == 0:
            actions = learner.act(obs[0])[None]
        else:  # the space's samples: float32
            actions = np.array([rng.uniform(low, high).astype(np.float32)])
        next_obs = observations()
        rewards = -rng.random(1)  # float64
        terminations, truncations = np.zeros(1, bool), np.array([step % 200 == 199])
        real_next_obs = next_obs.copy()
        rb.push({"obs": obs[0], "action": actions[0], "reward": rewards[0], "next_obs": real_next_obs[0],
                 "terminated": terminations[0], "truncated": truncations[0]})
        if step == 0:
            mark("first_step")
        obs = next_obs
    for step in (hp["policy_frequency"], hp["policy_frequency"] + 1):
        learner.train(rb.sample(hp["batch_size"]), step=step)
        mark("first_update")


RUNNERS = {"dqn": loop_dqn, "ppo": loop_ppo, "sac": loop_sac}


# ---------------------------------------------------------------------------------------------
# Where the cache is, and what a run compiled or loaded
# ---------------------------------------------------------------------------------------------
def cache_location() -> tuple[list, str]:
    """``(directories, how)``: where this process's kernels are cached, found as tfdata and numba
    find it (``NUMBA_CACHE_DIR`` if set, by the user or by :func:`tfdata._config.install_cache_dir`
    when the package is read-only; else ``__pycache__`` beside the kernel sources). Imports no
    numba; call before the first kernel is built."""
    _config.install_cache_dir()
    chosen = os.environ.get("NUMBA_CACHE_DIR")
    if chosen:
        return [os.path.abspath(chosen)], "NUMBA_CACHE_DIR"
    pkg = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(pkg, sub, "__pycache__") for sub in ("kernels", "nn")], "beside the sources"


def check_writable(directories) -> None:
    """Raise :class:`CacheNotWritable` naming the first directory that cannot be created or
    written (numba would otherwise fall back to another place, or cache nothing, silently)."""
    for path in directories:
        try:
            os.makedirs(path, exist_ok=True)
            tempfile.TemporaryFile(dir=path).close()
        except OSError as exc:
            raise CacheNotWritable(
                f"the kernel cache directory {path} is not writable ({exc.strerror or exc}); set "
                "NUMBA_CACHE_DIR to a writable directory (before the first tfdata kernel runs, "
                "and the same for the processes that should load the kernels)") from None


def _dispatchers() -> list:
    """The numba dispatchers of tfdata's kernels with an on-disk cache (found among the objects
    the garbage collector tracks: kernels made from templates live in closures)."""
    if "numba" not in sys.modules:
        return []
    from numba.core.dispatcher import Dispatcher

    found = {}
    for obj in gc.get_objects():
        # type() rather than isinstance: a proxy object's __class__ may run code
        if issubclass(type(obj), Dispatcher):
            module = getattr(obj.py_func, "__module__", None) or ""
            if (module == "tfdata" or module.startswith("tfdata.")) and obj.stats.cache_path:
                found[id(obj)] = obj
    return list(found.values())


def _counts() -> tuple[int, int, set]:
    """(specializations compiled, loaded from the cache, cache directories) in this process."""
    compiled = loaded = 0
    paths = set()
    for d in _dispatchers():
        stats = d.stats
        compiled += sum(stats.cache_misses.values())
        loaded += sum(stats.cache_hits.values())
        paths.add(stats.cache_path)
    return compiled, loaded, paths


def target() -> dict:
    """What numba keys a cache entry on besides the signature: its code generator's
    ``magic_tuple()`` (LLVM target triple, CPU name, CPU features; the features as a digest),
    with the numba and Python versions. Imports numba."""
    import numba
    from numba.core.registry import cpu_target

    triple, cpu, features = cpu_target.target_context.codegen().magic_tuple()
    return {"triple": triple, "cpu_name": cpu,
            "cpu_features_sha256": hashlib.sha256(features.encode()).hexdigest()[:16],
            "numba": numba.__version__, "python": "%d.%d" % sys.version_info[:2]}


def warm(loops, log=None) -> dict:
    """Compile (or load) and cache the kernels of ``loops`` in this process.

    Parameters
    ----------
    loops : sequence of str
        Names of :data:`LOOPS`.
    log : callable, optional
        Called with one line of text per loop as it finishes.

    Returns
    -------
    dict
        ``{"loops": {name: {"compiled", "loaded", "seconds", "cpu_seconds"}}, "total": {...},
        "cache_dirs": [...], "cache": how it was chosen, "target": :func:`target`}``. ``compiled``
        counts the specializations this loop compiled and wrote to the cache (a kernel's and the
        cached helpers compiled inside it), ``loaded`` those read from the cache; a kernel an
        earlier loop of the same call already holds counts in neither.

    Raises
    ------
    CacheNotWritable
        Before anything is compiled.
    ValueError
        An unknown loop name.
    """
    unknown = [name for name in loops if name not in RUNNERS]
    if unknown:
        raise ValueError(f"unknown loop {unknown[0]!r}: expected one of {', '.join(LOOPS)} (or all)")
    directories, how = cache_location()
    check_writable(directories)
    out, total = {}, {"compiled": 0, "loaded": 0, "seconds": 0.0, "cpu_seconds": 0.0}
    paths = set()
    compiled0, loaded0, _ = _counts()
    for name in loops:
        t0, c0 = time.perf_counter(), time.process_time()
        RUNNERS[name]()
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        compiled1, loaded1, seen = _counts()
        paths |= seen
        r = {"compiled": compiled1 - compiled0, "loaded": loaded1 - loaded0,
             "seconds": round(seconds, 3), "cpu_seconds": round(cpu, 3)}
        compiled0, loaded0 = compiled1, loaded1
        out[name] = r
        for key in total:
            total[key] += r[key]
        if log is not None:
            log(f"{name}: compiled {r['compiled']}, loaded {r['loaded']} kernel specializations "
                f"in {r['seconds']:.1f} s (CPU {r['cpu_seconds']:.1f} s)")
    total = {k: round(v, 3) if isinstance(v, float) else v for k, v in total.items()}
    return {"loops": out, "total": total, "cache_dirs": sorted(paths) or directories, "cache": how,
            "target": target()}


# ---------------------------------------------------------------------------------------------
# First-step latency (cold or warm): measured in fresh processes
# ---------------------------------------------------------------------------------------------
def first_step(loop: str, since: float | None = None) -> dict:
    """Run ``loop`` once in this process and return, in seconds from ``since`` (a
    ``time.perf_counter()`` value taken before ``import tfdata``; default: this call), when its
    first step and its first update were complete:

    * ``first_step``: the buffer and the learner built, the first action taken and its
      transition stored (dqn, sac: ``act`` and ``push``; ppo: ``act`` and ``add`` of one vector
      step of 4 environments);
    * ``first_update``: the first training step done (dqn, sac: after ``batch_size`` pushes, one
      ``sample`` and one ``train``; ppo: after a full rollout of 128 steps, GAE and one
      minibatch's ``train``).

    Both include compiling (cold cache) or loading (warm) the kernels met on the way. Meant
    for a fresh process: kernels loaded earlier in the process cost nothing here.
    """
    t0 = time.perf_counter() if since is None else since
    marks = {}

    def mark(name: str) -> None:
        marks.setdefault(name, round(time.perf_counter() - t0, 4))

    RUNNERS[loop](mark)
    return marks


#: The measured program: a timer started before ``import tfdata``, then :func:`first_step`.
PROBE = ("import time; t = time.perf_counter()\n"
         "import json, sys\n"
         "from tfdata import warmup\n"
         "print(json.dumps(warmup.first_step(sys.argv[1], since=t)))\n")


def _child(args: list, cache_dir: str) -> tuple:
    """Run ``python args`` with ``NUMBA_CACHE_DIR=cache_dir`` and this tfdata on the path: (last
    line of its output as JSON, wall seconds, CPU seconds of the process)."""
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    before, t0 = os.times(), time.perf_counter()
    out = subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=3600)
    wall, after = time.perf_counter() - t0, os.times()
    if out.returncode:
        raise RuntimeError(f"{' '.join(args[:3])} failed (exit {out.returncode}):\n{out.stderr[-3000:]}")
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return json.loads(out.stdout.strip().splitlines()[-1]), round(wall, 3), round(cpu, 3)


def measure(loops, log=None) -> dict:
    """Cold and warm start of ``loops``, each in fresh processes on its own empty cache
    directory (a temporary one, deleted after):

    * ``cold``: :func:`first_step` on the empty cache (its marks, and the whole process's wall
      and CPU seconds);
    * ``warmup``: ``python -m tfdata warmup LOOP --json`` on another empty cache: what it compiled,
      in how long (in the process, and the whole process);
    * ``warm``: :func:`first_step` on the cache the warm-up filled;
    * ``again``: the warm-up run a second time (everything loaded).

    Sequential, one process at a time. Returns ``{loop: {"cold", "warmup", "warm", "again"}}``.
    """
    results = {}
    for loop in loops:
        scratch = tempfile.mkdtemp(prefix=f"tfdata-warmup-{loop}-")
        try:
            cold_dir, warm_dir = os.path.join(scratch, "cold"), os.path.join(scratch, "warm")
            os.makedirs(cold_dir)
            os.makedirs(warm_dir)
            r = {}
            marks, wall, cpu = _child(["-c", PROBE, loop], cold_dir)
            r["cold"] = dict(marks, process_s=wall, process_cpu_s=cpu)
            for key in ("warmup", "again"):
                doc, wall, cpu = _child(["-m", "tfdata", "warmup", loop, "--json"], warm_dir)
                r[key] = dict(doc["loops"][loop], process_s=wall, process_cpu_s=cpu)
                if key == "warmup":
                    marks, wall, cpu = _child(["-c", PROBE, loop], warm_dir)
                    r["warm"] = dict(marks, process_s=wall, process_cpu_s=cpu)
            r["cache_files"] = sum(f.endswith(".nbc") for _, _, fs in os.walk(warm_dir) for f in fs)
            results[loop] = r
            if log is not None:
                log(f"{loop}: cold first step {r['cold']['first_step']:.2f} s, first update "
                    f"{r['cold']['first_update']:.2f} s; warm {r['warm']['first_step']:.2f} s, "
                    f"{r['warm']['first_update']:.2f} s; warmup compiled {r['warmup']['compiled']} in "
                    f"{r['warmup']['process_s']:.1f} s (CPU {r['warmup']['process_cpu_s']:.1f} s), "
                    f"again {r['again']['process_s']:.1f} s")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return results
