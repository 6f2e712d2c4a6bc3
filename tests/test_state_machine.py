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
