"""Short real Atari rollouts for tests: the ALE (with its ROMs) through gymnasium's DQN wrappers.

    from .atari import rollout
    d = rollout("Breakout")          # skips the test when the ``atari`` extra is missing

:func:`rollout` gives the transitions exactly as the environments produced them (see
``atari_transitions`` in ``experiments/_envs.py``, which it calls: one definition of how
the environment is built): ``gymnasium.make("ALE/<Game>-v5", frameskip=1)`` +
``AtariPreprocessing(frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30)`` +
``FrameStackObservation(4, padding_type)``, episodes ending by termination or truncation, the
final observation of an episode in ``next_obs``. Results are cached per argument set and
read-only (a test cannot spoil another's data); a few hundred steps take well under a second.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The games the tests use, and for each the arguments that give episode ends within 400 steps
#: (a random Breakout loses its 5 lives in about 200 steps; Pong's episodes last thousands, so it
#: is truncated).
GAMES = {"Breakout": {}, "Pong": {"max_episode_steps": 150}}


def _envs():
    spec = importlib.util.spec_from_file_location("_tfdata_experiments_envs",
                                                  os.path.join(REPO, "experiments", "_envs.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@functools.lru_cache(maxsize=16)
def _cached(game, steps, num_envs, seed, epsilon, padding_type, max_episode_steps, frames_only):
    out = _envs().atari_transitions(game, steps, num_envs=num_envs, seed=seed, epsilon=epsilon,
                                    padding_type=padding_type, max_episode_steps=max_episode_steps,
                                    frames_only=frames_only)
    for v in out.values():
        if hasattr(v, "setflags"):
            v.setflags(write=False)
    return out


def rollout(game: str = "Breakout", steps: int = 400, *, num_envs: int = 1, seed: int = 0, epsilon: float = 1.0,
            padding_type: str = "reset", max_episode_steps: int | None = -1, frames_only: bool = False) -> dict:
    """A short real ALE rollout (skips the calling test when ale_py, gymnasium or OpenCV is missing).

    Parameters
    ----------
    game : str
        "Breakout", "Pong", or any ALE game.
    steps : int
        Vector steps T.
    num_envs : int
        E; with E > 1 the arrays have an env axis after the time axis.
    seed : int
        Environment i is seeded ``seed + i``; the same arguments give the same arrays.
    epsilon : float
        Probability of a random action (else a fixed action per environment).
    padding_type : str
        "reset" (the first frame of an episode repeated) or "zero".
    max_episode_steps : int or None
        Truncate episodes after this many agent steps; -1 (default): the game's entry in
        :data:`GAMES` (Pong: 150), None: no limit but the v5 one.
    frames_only : bool
        Keep only the newest frame of each observation.

    Returns
    -------
    dict
        Read-only ``obs``, ``next_obs``: uint8 ``(T, [E,] 4, 84, 84)``; ``action``: int64 ``(T, [E])``;
        ``reward``: float32 ``(T, [E])``; ``terminated``, ``truncated``: bool ``(T, [E])``; and
        ``num_actions``, ``env_id``.
    """
    for mod in ("ale_py", "gymnasium", "cv2"):
        pytest.importorskip(mod, reason=f"real Atari frames need the atari extra ({mod} missing)")
    if max_episode_steps == -1:
        max_episode_steps = GAMES.get(game, {}).get("max_episode_steps")
    return _cached(game, steps, num_envs, seed, epsilon, padding_type, max_episode_steps, frames_only)
