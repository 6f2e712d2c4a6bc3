"""A sampler written outside the package plugs into ReplayBuffer through the public contract
(tfdata.replay.samplers): nothing in tfdata names it, and everything else still works with it:
both layouts, the generated push, extend, n-step windows, clear, state round trips."""

from __future__ import annotations

import numpy as np
import pytest

from tfdata import ReplayBuffer, Spec
from tfdata.replay.samplers import Sampler

from .conftest import LAYOUTS

SPEC = Spec({"obs": ("f4", (3,)), "reward": "f4", "terminated": "?", "truncated": "?",
             "next_obs": ("f4", (3,))})


class RecentSampler(Sampler):
    """Uniform over the ``window`` newest rows: knows the newest slot from the write hooks, draws
    with numpy from ``(seed, counter)`` and gathers through the storage (no layout)."""

    hears_writes = True

    def __init__(self, window: int, seed: int):
        super().__init__(seed)
        self.window = window
        self.newest = -1

    def on_write(self, spans, n, extra) -> None:
        dst, _, count = spans[-1]
        self.newest = dst + count - 1

    def slot_hook(self):
        def on_write(slot, _self=self):
            _self.newest = slot

        return on_write

    def on_clear(self) -> None:
        self.newest = -1

    def sample(self, n, out, arrays) -> None:
        k = min(self.window, n)
        back = np.random.default_rng([self.seed, self.counter]).integers(0, k, out.indices.shape[0])
        self.state[1] += np.uint64(1)
        out.indices[:] = (self.newest - back) % self.capacity
        self.storage.gather(out.indices, out)


def rows(rng, n):
    return {"obs": rng.random((n, 3), np.float32), "reward": rng.random(n).astype(np.float32),
            "terminated": rng.random(n) < 0.2, "truncated": np.zeros(n, bool),
            "next_obs": rng.random((n, 3), np.float32)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_outside_sampler_plugs_in(layout):
    buf = ReplayBuffer(SPEC, 20, layout=layout, sampler=RecentSampler(4, seed=1))
    rng = np.random.default_rng(0)
    data = rows(rng, 27)  # wraps
    for i in range(27):
        buf.push({k: (v[i] if v[i].ndim else v[i].item()) for k, v in data.items()})
    newest = 26 % 20
    b = buf.sample(8)
    assert set(b.indices.tolist()) <= {(newest - j) % 20 for j in range(4)}
    for k in SPEC.names:  # the rows are the stored rows of those slots
        np.testing.assert_array_equal(b[k], buf.storage.field(k)[b.indices])
    np.testing.assert_array_equal(buf.storage.field("obs")[newest], data["obs"][26])


def test_the_generated_push_calls_its_slot_hook():
    fast = ReplayBuffer(SPEC, 10, sampler=RecentSampler(2, seed=3))
    assert hasattr(fast._fast_push, "__source__")  # the per-spec push, not the generic one
    fast.push({"obs": np.ones(3, np.float32), "reward": 1.0, "terminated": False,
               "truncated": False, "next_obs": np.ones(3, np.float32)})
    assert fast.sampler.newest == 0
    fast.extend(rows(np.random.default_rng(1), 5))
    assert fast.sampler.newest == 5


def test_layouts_agree_and_state_round_trips():
    out = []
    for layout in LAYOUTS:
        buf = ReplayBuffer(SPEC, 16, layout=layout, n_step=3, gamma=0.5, sampler=RecentSampler(5, seed=2))
        buf.extend(rows(np.random.default_rng(4), 23))
        out.append([buf.sample(6, copy=True) for _ in range(3)])
        state = buf.state_dict()
        other = ReplayBuffer(SPEC, 16, layout=layout, n_step=3, gamma=0.5, sampler=RecentSampler(5, seed=7))
        other.load_state_dict(state)
        other.sampler.newest = buf.sampler.newest  # the sampler's own state is its business
        a, b = buf.sample(6), other.sample(6)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.discounts, b.discounts)
    for x, y in zip(*out):
        np.testing.assert_array_equal(x.indices, y.indices)
        for k in SPEC.names:
            np.testing.assert_array_equal(x[k], y[k])
        np.testing.assert_array_equal(x.discounts, y.discounts)  # n-step works over any sampler


def test_clear_reaches_the_sampler_and_seed_conflicts_are_refused():
    buf = ReplayBuffer(SPEC, 8, sampler=RecentSampler(2, seed=0))
    buf.extend(rows(np.random.default_rng(0), 3))
    buf.clear()
    assert buf.sampler.newest == -1 and len(buf) == 0
    with pytest.raises(ValueError, match="seed"):
        ReplayBuffer(SPEC, 8, seed=1, sampler=RecentSampler(2, seed=0))
