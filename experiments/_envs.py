"""What the experiments feed the buffers: the row kinds of the layout experiments (``ROW_KINDS``,
random rows of a spec, buffers filled to a capacity) and real Atari transitions
(:func:`atari_transitions`: the ALE through gymnasium's DQN wrappers, exactly as the environments
gave them), as rows a buffer takes (:func:`rows_of`) and as a block written again and again
with the stream staying continuous (:func:`repeatable_block`, :func:`chunks_of`, :func:`row_dicts`).

numpy, gymnasium and ale_py are imported inside the functions. This module imports no sibling
module: ``tests/atari.py`` loads it by its path.
"""

from __future__ import annotations

import time

# -- rows and buffers -------------------------------------------------------------------------
#: The row kinds the layout experiments share (``tfdata.Spec(ROW_KINDS[kind])``), smallest first.
ROW_KINDS = {
    # 2 scalar fields: 12 bytes of data, 16-byte AoS record (rounded up to 8-byte words)
    "tiny": {"action": "i8", "reward": "f4"},
    # a CartPole-v1 transition
    "cartpole": {"obs": ("f4", (4,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (4,)),
                 "terminated": "?", "truncated": "?"},
    # a 64-float observation (MuJoCo-like state)
    "medium": {"obs": ("f4", (64,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (64,)),
               "terminated": "?", "truncated": "?"},
    # an Atari frame stack, obs and next_obs stored (as a naive DQN buffer does)
    "image": {"obs": ("u1", (4, 84, 84)), "action": "i8", "reward": "f4",
              "next_obs": ("u1", (4, 84, 84)), "terminated": "?", "truncated": "?"},
}


def make_chunk(spec, n: int, rng, flag_p=None) -> dict:
    """``n`` random rows of ``spec``, one array per field, exact dtypes.

    Parameters
    ----------
    spec : tfdata.Spec
    n : int
    rng : numpy.random.Generator
    flag_p : dict, optional
        Probability of True per bool field (default 0.05 for every one).

    Returns
    -------
    dict
        Field name -> array of shape ``(n, *field.shape)`` and the field's dtype: floats
        standard normal, uint8 uniform over 0..255, other integers in 0..3.
    """
    import numpy as np

    out = {}
    for f in spec:
        shape = (n,) + f.shape
        if f.dtype.kind == "f":
            out[f.name] = rng.standard_normal(shape, dtype=np.float32).astype(f.dtype, copy=False)
        elif f.dtype.kind == "b":
            out[f.name] = rng.random(shape) < (flag_p or {}).get(f.name, 0.05)
        elif f.dtype == np.uint8:
            out[f.name] = rng.integers(0, 256, shape, dtype=np.uint8)
        else:
            out[f.name] = rng.integers(0, 4, shape).astype(f.dtype)
    return out


def fill(buf, chunk: dict, capacity: int) -> None:
    """Fill ``buf`` with ``capacity`` rows: ``extend(chunk)`` repeated, then the part that is left."""
    n = len(next(iter(chunk.values())))
    for _ in range(capacity // n):
        buf.extend(chunk)
    rest = capacity % n
    if rest:
        buf.extend({k: v[:rest] for k, v in chunk.items()})


def build_filled(keys, make, chunk: dict, capacity: int, fill_rates: dict | None = None) -> dict:
    """``{key: make(key)}`` each filled to ``capacity`` (:func:`fill`), built in the order of
    ``keys``; the first fill's time (build + fill, page faults included) goes to
    ``fill_rates[key]`` (``seconds``, ``rows_per_s``)."""
    import gc

    bufs = {}
    for key in keys:
        gc.collect()
        t0 = time.perf_counter()
        bufs[key] = buf = make(key)
        fill(buf, chunk, capacity)
        dt = time.perf_counter() - t0
        if fill_rates is not None:
            fill_rates[key] = {"seconds": dt, "rows_per_s": capacity / dt}
        assert len(buf) == capacity
    return bufs


# -- real Atari transitions -------------------------------------------------------------------
#: The extra that brings what :func:`atari_transitions` needs.
ATARI_EXTRA = "atari"


def atari_env_id(game: str) -> str:
    """``"ALE/<Game>-v5"`` from a game name given in any case (``"breakout"`` -> Breakout)."""
    name = game[4:] if game.startswith("ALE/") else game
    name = name.split("-v")[0]
    return f"ALE/{name[:1].upper()}{name[1:]}-v5"


def make_atari_env(game: str, *, stack: int = 4, padding_type="reset", frame_skip: int = 4,
                   screen_size: int = 84, noop_max: int = 30, repeat_action_probability: float = 0.25,
                   max_episode_steps: int | None = None, terminal_on_life_loss: bool = False):
    """One Atari environment with DQN's preprocessing, as gymnasium documents it.

    ``gymnasium.make("ALE/<Game>-v5", frameskip=1, repeat_action_probability=...)`` (the ALE
    skips no frame itself: :class:`~gymnasium.wrappers.AtariPreprocessing` does, with the max over
    the last two frames), then ``AtariPreprocessing(frame_skip, screen_size, grayscale_obs=True,
    noop_max, terminal_on_life_loss)``, then, when ``max_episode_steps`` is given, a
    ``TimeLimit`` counted in agent steps (after the frame skip), then
    ``FrameStackObservation(stack, padding_type=...)``.

    Parameters
    ----------
    game : str
        ``"Breakout"``, ``"pong"``, ``"ALE/Seaquest-v5"``...
    stack : int
        Frames per observation.
    padding_type : str or array
        ``FrameStackObservation``'s: "reset" repeats the first frame of an episode, "zero" pads
        with zeros.
    frame_skip, screen_size, noop_max, terminal_on_life_loss
        ``AtariPreprocessing``'s.
    repeat_action_probability : float
        Sticky actions (0.25 is the v5 default).
    max_episode_steps : int, optional
        Truncate episodes after this many agent steps (None: the v5 limit of 108,000 frames).

    Returns
    -------
    gymnasium.Env
        Observations uint8 of shape ``(stack, screen_size, screen_size)``.

    Raises
    ------
    ImportError
        When gymnasium, ale_py or OpenCV is missing, naming the extra that installs them.
    """
    try:
        import ale_py
        import cv2  # noqa: F401  (AtariPreprocessing's resize)
        import gymnasium as gym
    except ImportError as exc:
        raise ImportError(f"real Atari frames need the {ATARI_EXTRA!r} extra (gymnasium, ale-py, "
                          f"opencv-python-headless): pip install -e '.[{ATARI_EXTRA}]' ({exc})") from exc
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, TimeLimit

    gym.register_envs(ale_py)
    env = gym.make(atari_env_id(game), frameskip=1, repeat_action_probability=repeat_action_probability)
    env = AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size,
                             terminal_on_life_loss=terminal_on_life_loss, grayscale_obs=True)
    if max_episode_steps is not None:
        env = TimeLimit(env, max_episode_steps)
    return FrameStackObservation(env, stack, padding_type=padding_type)


def atari_transitions(game: str, steps: int, *, num_envs: int = 1, seed: int = 0, epsilon: float = 1.0,
                      stack: int = 4, padding_type="reset", frame_skip: int = 4, screen_size: int = 84,
                      noop_max: int = 30, repeat_action_probability: float = 0.25,
                      max_episode_steps: int | None = None, frames_only: bool = False) -> dict:
    """Real Atari transitions, exactly as the environments gave them.

    ``num_envs`` environments of :func:`make_atari_env` in a ``gymnasium.vector.SyncVectorEnv``
    with ``autoreset_mode=SAME_STEP``: an environment whose episode ends (terminated or truncated)
    is reset within the same step, its last observation taken from ``info["final_obs"]``. So
    ``next_obs[t]`` is the observation that followed ``obs[t]`` (the final one at an episode's
    end), and ``obs[t + 1]`` is ``next_obs[t]`` except after an episode's end, where it is the
    first observation of the next episode (its earlier frames padded as ``padding_type`` says).

    The policy: with probability ``epsilon`` a uniformly random action, else a fixed action drawn
    once per environment (``epsilon=1``: the random policy). Environment ``i`` is seeded with
    ``seed + i``, the policy with ``seed``: the same arguments give the same arrays.

    Parameters
    ----------
    game : str
        E.g. ``"Breakout"``, ``"Pong"`` (see :func:`atari_env_id`).
    steps : int
        Vector steps T (``T * num_envs`` transitions).
    num_envs : int
        E, environments stepped together.
    seed : int
    epsilon : float
        Probability of a random action, in [0, 1].
    stack, padding_type, frame_skip, screen_size, noop_max, repeat_action_probability, max_episode_steps
        As for :func:`make_atari_env`; a small ``max_episode_steps`` forces truncations.
    frames_only : bool
        Keep only the newest frame of ``obs`` and ``next_obs`` (``stack`` times less memory: a
        stream of frames for compression measurements).

    Returns
    -------
    dict
        ``obs``: uint8 ``(T, [E,] stack, S, S)`` (``(T, [E,] S, S)`` with ``frames_only``; the E
        axis only when ``num_envs > 1``; S = ``screen_size``), ``next_obs`` the same,
        ``action``: int64 ``(T, [E])``, ``reward``: float32 ``(T, [E])`` (unclipped),
        ``terminated``, ``truncated``: bool ``(T, [E])``; and ``num_actions`` (int) and ``env_id``
        (str).
    """
    if steps < 1 or num_envs < 1:
        raise ValueError(f"steps and num_envs: expected >= 1, got steps={steps}, num_envs={num_envs}")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon: expected a probability in [0, 1], got {epsilon}")
    import gymnasium as gym
    import numpy as np

    kw = dict(stack=stack, padding_type=padding_type, frame_skip=frame_skip, screen_size=screen_size,
              noop_max=noop_max, repeat_action_probability=repeat_action_probability,
              max_episode_steps=max_episode_steps)
    make_atari_env(game, **kw).close()  # a clear ImportError before the vector env hides it
    envs = gym.vector.SyncVectorEnv([lambda: make_atari_env(game, **kw) for _ in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        n_actions = int(envs.single_action_space.n)
        obs_shape = (screen_size, screen_size) if frames_only else (stack, screen_size, screen_size)
        out = {"obs": np.empty((steps, num_envs, *obs_shape), np.uint8),
               "next_obs": np.empty((steps, num_envs, *obs_shape), np.uint8),
               "action": np.empty((steps, num_envs), np.int64),
               "reward": np.empty((steps, num_envs), np.float32),
               "terminated": np.empty((steps, num_envs), bool),
               "truncated": np.empty((steps, num_envs), bool)}
        keep = (lambda o: o[..., -1, :, :]) if frames_only else (lambda o: o)
        rng = np.random.default_rng(seed)
        fixed = rng.integers(n_actions, size=num_envs)
        obs, _ = envs.reset(seed=seed)
        for t in range(steps):
            explore = rng.random(num_envs) < epsilon
            action = np.where(explore, rng.integers(n_actions, size=num_envs), fixed)
            nxt, reward, terminated, truncated, info = envs.step(action)
            out["obs"][t] = keep(obs)
            out["next_obs"][t] = keep(nxt)
            done = terminated | truncated
            for i in np.flatnonzero(done):  # the episode's last observation, before the reset
                out["next_obs"][t, i] = keep(info["final_obs"][i])
            out["action"][t], out["reward"][t] = action, reward
            out["terminated"][t], out["truncated"][t] = terminated, truncated
            obs = nxt
    finally:
        envs.close()
    if num_envs == 1:
        out = {k: v[:, 0] for k, v in out.items()}
    out["num_actions"], out["env_id"] = n_actions, atari_env_id(game)
    return out


# -- rows of a real stream --------------------------------------------------------------------
#: The fields of an Atari transition, in the order of the buffers' specs.
ATARI_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def rows_of(d: dict, num_envs: int) -> dict:
    """The transitions as rows in the order a buffer takes them (step-major, env fastest)."""
    import numpy as np

    cut = 1 if num_envs == 1 else 2
    return {f: np.ascontiguousarray(d[f].reshape((-1,) + d[f].shape[cut:])) for f in ATARI_FIELDS}


def repeatable_block(d: dict) -> dict:
    """The rows of a one-environment stream from its first row (a reset) to its last episode end:
    written again right after itself, the stream stays continuous (the next row is a reset)."""
    import numpy as np

    done = np.flatnonzero(d["terminated"] | d["truncated"])
    if done.size == 0:
        raise SystemExit("the stream has no episode end; collect more steps")
    n = int(done[-1]) + 1
    return {f: d[f][:n] for f in ATARI_FIELDS}


def chunks_of(block: dict, total: int, size: int):
    """``total`` rows of ``block`` repeated, as chunks of at most ``size`` rows (never across the
    block's end, so every chunk is continuous)."""
    n, done, p = len(block["action"]), 0, 0
    while done < total:
        m = min(size, n - p, total - done)
        yield {f: v[p:p + m] for f, v in block.items()}
        done += m
        p = (p + m) % n


def row_dicts(block: dict) -> list:
    """One push argument per row (obs/next_obs views, small fields as Python scalars)."""
    return [{"obs": block["obs"][i], "action": int(block["action"][i]), "reward": float(block["reward"][i]),
             "next_obs": block["next_obs"][i], "terminated": bool(block["terminated"][i]),
             "truncated": bool(block["truncated"][i])} for i in range(len(block["action"]))]
