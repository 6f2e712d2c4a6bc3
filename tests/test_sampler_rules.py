"""What every sampler promises about waits and refusals (issue 30).

* A documented wait honours its timeout from the first call on, before any row exists too:
  exactly-k with a ``timeout``, and every sampler with a rate limiter, for ``sample`` and
  ``sample_sequences``. A writer thread that starts later ends the wait; without one the call
  times out and changes nothing.
* A batch larger than the rows held is refused with a message that says what the sampler does
  (its ``rule``), not "with replacement" for samplers that draw without it.

No test asserts on speed: waits are long enough for a loaded machine, and the assertions are
what the rules guarantee (the batch's rows, the refusal, the unchanged state)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from tfdata import PrioritizedReplayBuffer, RateLimiter, ReplayBuffer

SPEC = {"id": "i8", "obs": ("f4", (3,)), "terminated": "?", "truncated": "?"}
SAMPLERS = ["uniform", "without_replacement", "exactly_k", "prioritized"]


def rows(ids) -> dict:
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 3, 1).astype(np.float32),
            "terminated": np.zeros(len(ids), bool), "truncated": np.zeros(len(ids), bool)}


def build(sampler: str, cap: int = 32, **kw):
    if sampler == "prioritized":
        return PrioritizedReplayBuffer(SPEC, cap, seed=0, **kw)
    return ReplayBuffer(SPEC, cap, seed=0, sampler=sampler, **kw)


def same_state(a, b) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            same_state(a[key], b[key])
        elif isinstance(a[key], np.ndarray):
            np.testing.assert_array_equal(a[key], b[key])
        else:
            assert a[key] == b[key], key


def later(buf, ids, delay: float = 0.3) -> threading.Thread:
    """A writer thread that extends ``buf`` with ``ids`` after ``delay`` seconds."""
    def write():
        time.sleep(delay)
        buf.extend(rows(ids))

    t = threading.Thread(target=write, daemon=True)
    t.start()
    return t


# -- refusals say what the sampler does ------------------------------------------------------------
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_batch_larger_than_the_rows_says_the_samplers_rule(sampler):
    b = build(sampler)
    b.extend(rows(range(5)))
    before = b.state_dict()
    with pytest.raises(ValueError, match="batch_size 6 is larger than the 5 rows held") as err:
        b.sample(6)
    msg = str(err.value)
    same_state(before, b.state_dict())
    if sampler in ("without_replacement", "exactly_k"):
        # the message used to say "sampling is with replacement" for every sampler
        assert "with replacement" not in msg and "without replacement" in msg
    else:
        assert "with replacement" in msg
    if sampler == "exactly_k":
        assert "exactly 1 batch" in msg
    if sampler == "prioritized":
        assert "priorities" in msg
    assert b.sampler.rule in msg  # the sampler's own words, not a guess from its type
    if sampler != "exactly_k":
        with pytest.raises(ValueError, match="larger than the 5 rows held") as err:
            b.sample_sequences(6, 2)
        assert b.sampler.rule in str(err.value)
        same_state(before, b.state_dict())


def test_an_empty_buffer_says_the_samplers_rule():
    for sampler in SAMPLERS:
        b = build(sampler)
        with pytest.raises(ValueError, match="empty buffer") as err:
            b.sample(1)
        assert b.sampler.rule in str(err.value)
