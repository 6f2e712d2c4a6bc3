"""Random push / extend / sample / clear / state round-trips against a plain Python model."""

from __future__ import annotations

import numpy as np
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tfdata import ReplayBuffer, Spec

from . import naive
from .conftest import ODD, assert_batches_equal, random_rows, row

SPEC = Spec(ODD)


class BufferMachine(RuleBasedStateMachine):
    @initialize(capacity=st.sampled_from([1, 2, 7, 33]), layout=st.sampled_from(["aos", "soa"]),
                seed=st.integers(0, 2**64 - 1))
    def setup(self, capacity, layout, seed):
        self.buf = ReplayBuffer(SPEC, capacity, layout=layout, seed=seed)
        self.model = naive.RingModel(capacity)
        self.key, self.counter = naive.key_of(seed), 0
        self.rng = np.random.default_rng(seed % 2**32)

    @rule()
    def push(self):
        r = row(random_rows(SPEC, 1, self.rng), 0)
        self.buf.push(r)
        self.model.push(r)

    @rule(n=st.integers(0, 80))
    def extend(self, n):
        data = random_rows(SPEC, n, self.rng)
        self.buf.extend(data)
        self.model.extend(data)

    @precondition(lambda self: self.model.size > 0)
    @rule(data=st.data())
    def sample(self, data):
        bs = data.draw(st.integers(1, self.model.size))
        copy = data.draw(st.booleans())
        batch = self.buf.sample(bs, copy=copy)
        idx, self.counter = naive.draw_indices(self.key, self.counter, self.model.size, bs)
        np.testing.assert_array_equal(batch.indices, idx)
        assert_batches_equal(batch, self.model.rows(idx))

    @rule()
    def clear(self):
        self.buf.clear()
        self.model.clear()

    @rule(layout=st.sampled_from(["aos", "soa"]))
    def round_trip(self, layout):
        state = self.buf.state_dict()
        self.buf = ReplayBuffer(SPEC, self.model.capacity, layout=layout, seed=1)
        self.buf.load_state_dict(state)

    @invariant()
    def same_size(self):
        if hasattr(self, "buf"):
            assert len(self.buf) == self.model.size
            w = self.buf.state_dict()["writer"]
            assert w == {"cursor": self.model.cursor, "size": self.model.size}


BufferMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestBufferMachine = BufferMachine.TestCase


class PrioritizedMachine(RuleBasedStateMachine):
    """The prioritized buffer against a list of leaves with the documented rules.

    alpha=1, eps=0.5 and integer priorities make every leaf a half-integer, so tree sums are
    exact and the sampled slots must equal the cumulative-sum reference."""

    @initialize(capacity=st.sampled_from([1, 2, 7, 33]), layout=st.sampled_from(["aos", "soa"]),
                seed=st.integers(0, 2**63))
    def setup(self, capacity, layout, seed):
        from tfdata import PrioritizedReplayBuffer

        self.cls = PrioritizedReplayBuffer
        self.buf = PrioritizedReplayBuffer({"x": "i8"}, capacity, alpha=1.0, eps=0.5, beta=0.5,
                                           layout=layout, seed=seed)
        self.capacity = capacity
        self.leaves = np.zeros(capacity)
        self.data = np.zeros(capacity, np.int64)
        self.cursor = self.size = self.next_x = 0
        self.key, self.counter = naive.key_of(seed), 0

    def _write(self, n, priorities):
        slots = [(self.cursor + i) % self.capacity for i in range(n)][-self.capacity:]
        for s in slots:
            self.leaves[s] = 0.0
        live_max = self.leaves.max()
        for i, s in enumerate(slots):
            if priorities is None:
                self.leaves[s] = live_max if live_max > 0 else 1.0
            else:
                self.leaves[s] = priorities[len(priorities) - len(slots) + i] + 0.5
        xs = np.arange(self.next_x, self.next_x + n)
        for s, x in zip(slots, xs[-len(slots):]):
            self.data[s] = x
        self.next_x += n
        self.cursor = (self.cursor + n) % self.capacity
        self.size = min(self.size + n, self.capacity)
        return xs

    @rule(explicit=st.booleans(), p=st.integers(0, 8))
    def push(self, explicit, p):
        x = self._write(1, [p] if explicit else None)[0]
        self.buf.push({"x": int(x)}, priority=float(p) if explicit else None)

    @rule(n=st.integers(0, 40), explicit=st.booleans(), data=st.data())
    def extend(self, n, explicit, data):
        pri = data.draw(st.lists(st.integers(0, 8), min_size=n, max_size=n)) if explicit else None
        xs = self._write(n, pri)
        self.buf.extend({"x": xs}, priorities=None if pri is None else np.array(pri, float))

    @precondition(lambda self: self.size > 0)
    @rule(data=st.data())
    def sample_and_update(self, data):
        bs = data.draw(st.integers(1, self.size))
        b = self.buf.sample(bs)
        live = self.leaves[:self.size]
        idx, self.counter = naive.stratified_slots(self.key, self.counter, live, bs)
        np.testing.assert_array_equal(b.indices, idx)
        np.testing.assert_array_equal(b["x"], self.data[idx])
        np.testing.assert_allclose(b.weights, (live.min() / live[idx]) ** 0.5, rtol=1e-6)
        new = data.draw(st.lists(st.integers(0, 8), min_size=bs, max_size=bs))
        self.buf.update_priorities(b, np.array(new, float))
        for s, p in zip(idx, new):
            self.leaves[s] = p + 0.5

    @rule()
    def clear(self):
        self.buf.clear()
        self.leaves[:] = 0.0
        self.cursor = self.size = 0

    @rule(layout=st.sampled_from(["aos", "soa"]))
    def round_trip(self, layout):
        state = self.buf.state_dict()
        self.buf = self.cls({"x": "i8"}, self.capacity, alpha=1.0, eps=0.5, beta=0.5,
                            layout=layout, seed=1)
        self.buf.load_state_dict(state)

    @invariant()
    def same_priorities(self):
        if hasattr(self, "buf"):
            np.testing.assert_array_equal(self.buf.priorities(), self.leaves[:self.size])


PrioritizedMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestPrioritizedMachine = PrioritizedMachine.TestCase
