"""tests/atari.py: real ALE rollouts give frame stacks as gymnasium documents them (what the
frame-stack buffer's exactness tests rely on)."""

from __future__ import annotations

import numpy as np
import pytest

from .atari import GAMES, rollout


def _with_env_axis(d, num_envs):
    keys = ("obs", "next_obs", "terminated", "truncated")
    return [d[k][:, None] if num_envs == 1 else d[k] for k in keys]


@pytest.mark.parametrize("num_envs", [1, 2])
@pytest.mark.parametrize("game", list(GAMES))
def test_stacks_shift_and_episodes_restart_padded(game, num_envs):
    d = rollout(game, 400 // num_envs, num_envs=num_envs)
    obs, nxt, term, trunc = _with_env_axis(d, num_envs)
    assert obs.dtype == np.uint8 and obs.shape[1:] == (num_envs, 4, 84, 84) and nxt.shape == obs.shape
    assert d["reward"].dtype == np.float32 and d["action"].dtype == np.int64
    done = term | trunc
    assert done[:-1].any(), "the rollout must cross an episode end"
    # within an episode the next observation is the following one
    cont = ~done[:-1]
    assert np.array_equal(nxt[:-1][cont], obs[1:][cont])
    # every step pushes one new frame: the stack shifts by one, episode ends included
    assert np.array_equal(nxt[:, :, :-1], obs[:, :, 1:])
    for t, e in zip(*np.nonzero(done[:-1])):
        first = obs[t + 1, e]  # an episode's first observation: its first frame repeated
        assert (first == first[-1]).all()
        assert not np.array_equal(nxt[t, e], first)  # the final observation, not the reset one
    assert not (obs[:, :, :-1] == obs[:, :, -1:]).all(axis=(2, 3, 4)).all(), "frames must change"


def test_zero_padding_and_determinism():
    d = rollout("Breakout", 300, padding_type="zero")
    again = rollout("Breakout", 300, padding_type="zero", seed=1)
    done = d["terminated"] | d["truncated"]
    assert (d["obs"][0, :3] == 0).all() and d["obs"][0, 3].any()
    for t in np.flatnonzero(done[:-1]):
        assert (d["obs"][t + 1, :3] == 0).all() and d["obs"][t + 1, 3].any()
    # a fresh run with the same arguments gives the same arrays; another seed does not
    from .atari import _cached

    _cached.cache_clear()
    same = rollout("Breakout", 300, padding_type="zero")
    assert all(np.array_equal(d[k], same[k]) for k in ("obs", "next_obs", "action", "reward", "terminated"))
    assert not np.array_equal(d["obs"], again["obs"])
    assert not d["obs"].flags.writeable
