"""A frame-stacked buffer against the oracle (the same options storing whole stacks) over random
interleavings of pushes and extends of random sizes (longer than the ring too), episode ends and
truncations, refused writes, clear, state round trips into other layouts, samples and slices of
random sizes and fields; 1 to 3 streams, stacks of 2 to 5 frames, capacities from ``K *
num_envs`` up, every padding mode, with and without n-step."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import tfdata
from tfdata.errors import SpecError
from tfdata.replay.frames import depth_break

from . import naive
from .test_frames import spec_of, steps_of
from .test_frames_everything import LAYOUTS

FIELDS = [None, ["obs"], ["next_obs"], ["action", "reward"], ["obs", "next_obs", "terminated"],
          ["next_obs", "truncated"]]


def same(x, y, names) -> None:
    assert set(x.keys()) == set(y.keys())
    for f in names:
        assert np.array_equal(np.asarray(x[f]), np.asarray(y[f])), f
    # (not versions: a prioritized state round trip restarts their epoch at the lap boundary,
    # with or without frame stacks)
    for attr in ("indices", "discounts", "mask", "weights"):
        u, v = getattr(x, attr, None), getattr(y, attr, None)
        assert (u is None) == (v is None)
        if u is not None:
            assert np.array_equal(np.asarray(u), np.asarray(v)), attr


class FrameMachine(RuleBasedStateMachine):
    @initialize(num_envs=st.integers(1, 3), k=st.integers(2, 5), extra=st.sampled_from([0, 0, 1, 3]),
                layout=st.sampled_from(sorted(LAYOUTS)), padding=st.sampled_from(["reset", "zero", "value"]),
                n_step=st.sampled_from([None, None, 2, 3]), seed=st.integers(0, 2**32 - 1),
                prioritized=st.booleans())
    def setup(self, num_envs, k, extra, layout, padding, n_step, seed, prioritized):
        self.e, self.k = num_envs, k
        self.cap = num_envs * (k + extra)
        self.spec = spec_of(k)
        self.pad = np.full((3, 2), 77, np.uint8) if padding == "value" else padding
        self.opts = dict(num_envs=num_envs, n_step=n_step)
        self.cls = tfdata.PrioritizedReplayBuffer if prioritized else tfdata.ReplayBuffer
        self.buf = self.cls(self.spec, self.cap, seed=seed, layout=LAYOUTS[layout],
                                       frame_stack=k, frame_padding=self.pad, **self.opts)
        self.oracle = self.cls(self.spec, self.cap, seed=seed, **self.opts)
        self.env = naive.FrameStackEnv(num_envs, k, padding=self.pad, p_end=0.2)
        self.rng = np.random.default_rng(seed)
        self.t = 0

    def _write(self, steps: list) -> None:
        batch = {f: np.concatenate([s[f] for s in steps]) for f in steps[0]}
        batch["action"] = np.arange(batch["obs"].shape[0], dtype=np.int64) + 1000 * self.t
        batch["reward"] = self.rng.random(batch["obs"].shape[0]).astype(np.float32)
        self.t += 1
        if len(steps) == 1 and self.e == 1 and self.rng.random() < 0.5:
            row = {f: v[0] for f, v in batch.items()}
            self.buf.push(row)
            self.oracle.push(row)
        else:
            self.buf.extend(batch)
            self.oracle.extend(batch)

    @rule(n=st.sampled_from([1, 1, 2, 3, "held", "held+1", "2held+3"]),
          p_end=st.sampled_from([0.0, 0.1, 0.3, 1.0]))
    def write(self, n, p_end):
        held = self.cap // self.e
        n = {"held": held, "held+1": held + 1, "2held+3": 2 * held + 3}.get(n, n)
        self.env.p_end = p_end
        self._write(steps_of(self.env, self.rng, n))

    @rule(data=st.data())
    def refused_write(self, data):
        """A step whose stack does not continue its stream (or whose next_obs is not obs shifted)
        is refused and changes nothing; the stream then goes on."""
        self.env.p_end = 0.2
        step = steps_of(self.env, self.rng, 1)[0]
        bad = {f: v.copy() for f, v in step.items()}
        which = data.draw(st.sampled_from(["obs", "next_obs"]))
        e = data.draw(st.integers(0, self.e - 1))
        pos = data.draw(st.integers(0, self.k - 2))  # an older frame: the newest may be anything
        bad[which][e, pos] ^= 1
        bad["action"] = np.zeros(self.e, np.int64)
        bad["reward"] = np.zeros(self.e, np.float32)
        before = self.buf.state_dict()
        with pytest.raises(SpecError):
            self.buf.extend(bad)
        after = self.buf.state_dict()
        assert before["writer"] == after["writer"]
        for key in ("depth", "prev"):
            assert np.array_equal(before["frames"][key], after["frames"][key])
        assert before["frames"]["steps"] == after["frames"]["steps"]
        for f in before["data"]:
            assert np.array_equal(before["data"][f], after["data"][f])
        self._write([step])

    @precondition(lambda self: len(self.oracle) > 0)
    @rule(data=st.data())
    def sample(self, data):
        n = len(self.oracle)
        bs = data.draw(st.integers(1, n))
        fields = data.draw(st.sampled_from(FIELDS))
        x = self.buf.sample(bs, fields=fields)
        y = self.oracle.sample(bs, fields=fields)
        same(x, y, fields or list(self.spec))

    @precondition(lambda self: len(self.oracle) > 0)
    @rule(data=st.data())
    def sample_sequences(self, data):
        n = len(self.oracle)
        bs = data.draw(st.integers(1, n))
        length = data.draw(st.integers(1, self.cap // self.e))
        fields = data.draw(st.sampled_from(FIELDS))
        x = self.buf.sample_sequences(bs, length, fields=fields)
        y = self.oracle.sample_sequences(bs, length, fields=fields)
        same(x, y, fields or list(self.spec))

    @precondition(lambda self: len(self.oracle) > 0)
    @rule()
    def every_row(self):
        n = len(self.oracle)
        x, y = self.buf.sample(n), self.oracle.sample(n)
        same(x, y, list(self.spec))

    @precondition(lambda self: len(self.oracle) > 0 and self.cls is tfdata.PrioritizedReplayBuffer)
    @rule(data=st.data())
    def update_priorities(self, data):
        bs = data.draw(st.integers(1, len(self.oracle)))
        x, y = self.buf.sample(bs), self.oracle.sample(bs)
        same(x, y, list(self.spec))
        p = np.asarray(data.draw(st.lists(st.floats(0, 10), min_size=bs, max_size=bs)))
        self.buf.update_priorities(x, p)
        self.oracle.update_priorities(y, p)

    @rule(wipe=st.booleans())
    def clear(self, wipe):
        self.buf.clear(wipe=wipe)
        self.oracle.clear(wipe=wipe)
        for i in range(self.e):  # every stream starts a new episode (new frames, not old ones)
            self.env.episode[i] += 1
            self.env.t[i] = 0
            self.env.queues[i] = self.env._reset(i)

    @rule(layout=st.sampled_from(sorted(LAYOUTS)))
    def round_trip(self, layout):
        state = self.buf.state_dict()
        self.buf = self.cls(self.spec, self.cap, layout=LAYOUTS[layout], frame_stack=self.k,
                                       frame_padding=self.pad, **self.opts)
        self.buf.load_state_dict(state)

    @invariant()
    def bookkeeping(self):
        if not hasattr(self, "buf"):
            return
        assert len(self.buf) == len(self.oracle)
        st_ = self.buf.state_dict()
        fr, w, data = st_["frames"], st_["writer"], st_["data"]
        assert depth_break(fr["depth"], data["terminated"], data["truncated"], fr["prev"], w["cursor"],
                           w["size"], self.e, self.cap, fr["steps"], self.k - 1) is None
        assert np.array_equal(np.asarray(self.buf.column("obs")), np.asarray(self.oracle.column("obs"))[:, -1])


FrameMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
TestFrameMachine = FrameMachine.TestCase
