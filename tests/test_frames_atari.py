"""Frame stacks on real Atari frames: ALE Breakout and Pong through gymnasium's
``AtariPreprocessing`` and ``FrameStackObservation`` (``tests/atari.py``), written into a
frame-stacked buffer, a buffer that stores the stacks whole (same seed) and a plain list of the
transitions; every sampled batch must equal both, bit for bit, across episode ends,
truncations, vector envs and several laps of the ring."""

from __future__ import annotations

import numpy as np
import pytest

import tfdata

from .atari import rollout

SPEC = {"obs": ("u1", (4, 84, 84)), "next_obs": ("u1", (4, 84, 84)), "action": "i8", "reward": "f4",
        "terminated": "?", "truncated": "?"}
FIELDS = ("obs", "next_obs", "action", "reward", "terminated", "truncated")


@pytest.mark.parametrize("game", ["Breakout", "Pong"])
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_real_frames_equal_full_stacks(game, num_envs, layout):
    d = rollout(game, 300 if num_envs == 1 else 200, num_envs=num_envs)
    assert (np.asarray(d["terminated"]) | np.asarray(d["truncated"])).any()
    if game == "Pong":  # cut at 150 steps (tests/atari.py): truncations
        assert np.asarray(d["truncated"]).any()
    cap = 64 * num_envs  # several laps of the ring
    a = tfdata.ReplayBuffer(SPEC, cap, num_envs=num_envs, layout=layout, seed=7, frame_stack=4)
    b = tfdata.ReplayBuffer(SPEC, cap, num_envs=num_envs, layout=layout, seed=7)
    rows = []  # the transitions by slot, as the environment returned them (the naive buffer)
    steps = d["obs"].shape[0]
    compared = 0
    for t in range(steps):
        if num_envs == 1:
            row = {f: d[f][t] for f in FIELDS}
            a.push(row)
            b.push(row)
            rows.append(row)
        else:
            step = {f: d[f][t] for f in FIELDS}
            a.extend(step)
            b.extend(step)
            rows.extend({f: step[f][i] for f in FIELDS} for i in range(num_envs))
        if len(a) >= 32 and t % 3 == 0:
            x, y = a.sample(32), b.sample(32)
            start = max(0, len(rows) - cap)
            for i, slot in enumerate(np.asarray(x.indices).tolist()):
                # the slot's row: the newest write to it
                r = start + (slot - start) % cap
                for f in FIELDS:
                    assert np.array_equal(np.asarray(x[f][i]), np.asarray(rows[r][f])), (f, t, slot)
            for f in FIELDS:
                assert np.array_equal(np.asarray(x[f]), np.asarray(y[f])), f
            compared += 32
    assert compared >= 600 if num_envs == 1 else compared >= 150
    assert a.nbytes_parts["storage"] * 7 < b.nbytes_parts["storage"]
