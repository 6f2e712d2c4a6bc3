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
from .conftest import same_state

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



def later(buf, ids, delay: float = 0.3) -> threading.Thread:
    """A writer thread that extends ``buf`` with ``ids`` after ``delay`` seconds."""
    def write():
        time.sleep(delay)
        buf.extend(rows(ids))

    t = threading.Thread(target=write, daemon=True)
    t.start()
    return t


# -- waits from the first call on ---------------------------------------------------------------
@pytest.mark.parametrize("fields", [None, ["id"]])
def test_exactly_k_with_a_timeout_waits_for_the_first_rows(fields):
    # the case: an empty exactly-k buffer with timeout=5.0 refused sample(4) at once
    # ("cannot sample from an empty buffer") instead of waiting for the writer thread
    b = ReplayBuffer({"x": "i8"}, 32, sampler="exactly_k", timeout=30.0, seed=0)

    def write():
        time.sleep(0.3)
        b.extend({"x": np.arange(8)})

    t = threading.Thread(target=write, daemon=True)
    t.start()
    batch = b.sample(4, fields=fields and ["x"])
    t.join(30)
    got = batch["x"].tolist()
    assert len(set(got)) == 4 and set(got) <= set(range(8))  # distinct rows of the writer's


def test_exactly_k_waits_for_more_rows_than_held_and_its_ring_exists():
    b = build("exactly_k", timeout=30.0, replays=1)
    b.extend(rows(range(3)))
    b.sample(2)  # the ring of 2 exists: the locked check is the one that must let it wait
    t = later(b, range(3, 9))
    got = b.sample(2)["id"].tolist()  # 1 row awaits: waits for the writer
    t.join(30)
    assert len(set(got)) == 2
    t = later(b, range(9, 20))
    got = b.sample(12)["id"].tolist()  # more than the rows held (9): waits, never refused
    t.join(30)
    assert len(set(got)) == 12


def test_exactly_k_wait_times_out_on_an_empty_buffer_and_changes_nothing():
    b = build("exactly_k", timeout=0.2)
    before = b.state_dict()
    with pytest.raises(TimeoutError, match="await replay"):
        b.sample(4)
    same_state(before, b.state_dict())
    with pytest.raises(ValueError, match="larger than the capacity 32"):
        b.sample(33)  # no wait can give it: refused at once
    same_state(before, b.state_dict())
    with pytest.raises(TimeoutError, match="await replay"):
        b.sample(32)  # the capacity can hold it: it waits for rows like any other
    same_state(before, b.state_dict())
    c = build("exactly_k")  # no timeout: no wait, refused at once (documented)
    with pytest.raises(ValueError, match="empty buffer"):
        c.sample(4)


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_rate_limiter_waits_for_the_first_rows(sampler):
    b = build(sampler, rate_limiter=RateLimiter.min_size(4, timeout=30.0))
    t = later(b, range(8))
    got = b.sample(4)["id"].tolist()
    t.join(30)
    assert set(got) <= set(range(8))
    if sampler in ("without_replacement", "exactly_k"):
        assert len(set(got)) == 4


@pytest.mark.parametrize("sampler, policy", [  # (without replacement refuses "reject" at once)
    ("uniform", "mask"), ("uniform", "reject"), ("without_replacement", "mask"),
    ("prioritized", "mask"), ("prioritized", "reject")])
def test_a_rate_limiter_waits_for_the_first_rows_of_slices(sampler, policy):
    b = build(sampler, rate_limiter=RateLimiter.min_size(4, timeout=30.0))
    t = later(b, range(8))
    batch = b.sample_sequences(4, 3, policy=policy)
    t.join(30)
    ids = batch["id"]
    assert ids.shape == (4, 3) and set(ids.reshape(-1).tolist()) <= set(range(8))
    for s, m in zip(ids, batch.mask):  # consecutive rows of the stream while valid
        valid = s[m]
        assert (np.diff(valid) == 1).all()


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_a_rate_limited_wait_times_out_on_an_empty_buffer_and_changes_nothing(sampler):
    b = build(sampler, rate_limiter=RateLimiter.min_size(4, timeout=0.2))
    before = b.state_dict()
    with pytest.raises(TimeoutError, match="nothing was sampled"):
        b.sample(4)
    same_state(before, b.state_dict())
    if sampler != "exactly_k":
        with pytest.raises(TimeoutError, match="nothing was sampled"):
            b.sample_sequences(2, 3)
        same_state(before, b.state_dict())


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
