"""The sample-to-insert rate limiter (``tfdata.RateLimiter``, ``rate_limiter=`` of a buffer).

The two predicates are checked against their exact reference in tests/naive.py; the buffer
against the promise the limiter makes (samples within the error buffer of the ratio at every
point), with real threads; waits that time out change nothing; the counts survive a
checkpoint; a waiting thread lets others run."""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tfdata
from tfdata import FormatError, PrioritizedReplayBuffer, RateLimiter, ReplayBuffer

from . import naive
from .conftest import until

SPEC = {"id": "i8", "obs": ("f4", (3,)), "reward": "f4", "terminated": "?", "truncated": "?"}
LAYOUTS = ["aos", "soa", (("id", "reward"), ("obs",))]
# dyadic values: float and rational arithmetic agree exactly, so the predicates must too
SPIS = [0.25, 0.5, 1.0, 1.5, 2.0, 4.0, 8.0]


def rows(ids) -> dict:
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 3, 1).astype(np.float32),
            "reward": ids.astype(np.float32), "terminated": ids % 7 == 6,
            "truncated": np.zeros(len(ids), bool)}


def row(i: int) -> dict:
    return {"id": i, "obs": np.full(3, i, np.float32), "reward": float(i),
            "terminated": i % 7 == 6, "truncated": False}


def in_bounds(m: dict, lim: RateLimiter) -> bool:
    """The limiter's promise for a snapshot of its counts."""
    i, s = m["inserts"], m["samples"]
    lo, hi = naive.limiter_bounds_naive(i, lim.samples_per_insert, lim.min_size_to_sample,
                                        lim.error_buffer)
    if s == 0:
        return lo <= 0
    return lo <= s <= hi and i >= lim.min_size_to_sample


# -- the predicates against the reference -----------------------------------------------------------
@settings(max_examples=400, deadline=None)
@given(spi=st.sampled_from(SPIS), min_size=st.integers(1, 50), extra=st.sampled_from([0, 0.5, 1, 3, 10]),
       inserts=st.integers(0, 400), samples=st.integers(0, 2000), n=st.integers(1, 64),
       unbounded=st.booleans())
def test_predicates_match_reference(spi, min_size, extra, inserts, samples, n, unbounded):
    eb = None if unbounded else max(1.0, spi) + extra
    lim = RateLimiter(spi, min_size, eb) if eb is not None else RateLimiter.min_size(min_size)
    lim.inserts, lim.samples = inserts, samples
    for side, pred in (("sample", lim.can_sample), ("insert", lim.can_insert)):
        want = naive.limiter_allows_naive(side, inserts, samples, n,
                                          1.0 if eb is None else spi, min_size, eb)
        assert pred(n) is want, (side, inserts, samples, n, spi, min_size, eb)


@settings(max_examples=150, deadline=None)
@given(spi=st.sampled_from(SPIS), min_size=st.integers(1, 30), extra=st.sampled_from([0, 1, 5]),
       ops=st.lists(st.tuples(st.booleans(), st.integers(1, 8)), max_size=300))
def test_allowed_steps_keep_the_promise(spi, min_size, extra, ops):
    """Any sequence of steps the predicates allow keeps samples within the error buffer."""
    eb = max(1.0, spi) + extra
    lim = RateLimiter(spi, min_size, eb)
    for is_sample, n in ops:
        if is_sample:
            if lim.can_sample(n):
                lim.samples += n
        elif lim.can_insert(n):
            lim.inserts += n
        assert in_bounds(lim.metrics(), lim), (lim.metrics(), spi, min_size, eb)


def test_limiter_state_dict():
    lim = RateLimiter(2.0, 4, 4.0)  # min_diff 4, max_diff 12
    lim.load_state_dict({"inserts": 10, "samples": 9})
    assert lim.state_dict() == {"inserts": 10, "samples": 9}
    for bad in ({"inserts": 10}, {"inserts": 1, "samples": True}, {"inserts": -1, "samples": 0}, None,
                {"inserts": 10, "samples": 7}, {"inserts": 3, "samples": 1}):  # (the last two: unreachable)
        with pytest.raises(ValueError, match="rate_limiter state"):
            lim.load_state_dict(bad)
    assert lim.state_dict() == {"inserts": 10, "samples": 9}
    buf = ReplayBuffer(SPEC, 16, rate_limiter=lim)
    lim.load_state_dict({"inserts": 5, "samples": 2})  # bound: under the buffer's lock
    assert lim.metrics()["inserts"] == 5
    buf.extend(rows([0]))  # a row held: no inserts cannot be (the buffer's rows count)
    with pytest.raises(ValueError, match="inserts must be >= the 1 rows held"):
        lim.load_state_dict({"inserts": 0, "samples": 0})
    assert lim.metrics()["inserts"] == 6


@settings(max_examples=150, deadline=None)
@given(spi=st.sampled_from(SPIS + [0.3, 3.7]), min_size=st.integers(1, 30),
       extra=st.sampled_from([0, 1, 5, None]),
       ops=st.lists(st.tuples(st.sampled_from("sic"), st.integers(1, 8)), max_size=300))
def test_every_reachable_count_is_a_valid_state(spi, min_size, extra, ops):
    """The counts check refuses nothing the limiter's own steps can reach (clears included)."""
    from tfdata.replay.limiter import counts_problem

    eb = None if extra is None else max(1.0, spi) + extra
    lim = RateLimiter(spi, min_size, eb) if eb is not None else RateLimiter.min_size(min_size)
    for op, n in ops:
        if op == "s" and lim.can_sample(n):
            lim.samples += n
        elif op == "i" and lim.can_insert(n):
            lim.inserts += n
        elif op == "c":
            lim.inserts = lim.samples = 0
        assert counts_problem(lim.inserts, lim.samples, 0, spi, min_size, eb) is None, \
            (lim.inserts, lim.samples, spi, min_size, eb)
        assert lim.check_state(lim.state_dict(), 0) == lim.state_dict()


def _limited(cls=ReplayBuffer):
    lim = RateLimiter(2.0, 4, 6.0, timeout=0.2)  # min_diff 2, max_diff 14
    buf = cls(SPEC, 32, seed=3, rate_limiter=lim)
    buf.extend(rows(range(7)))
    buf.sample(5)
    return buf


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
@pytest.mark.parametrize("counts, field", [
    ({"inserts": 2 ** 63 - 1, "samples": 5}, "inserts"),  # every insert would time out
    ({"inserts": 8, "samples": 2 ** 63 - 1}, "samples"),  # every sample would time out
    ({"inserts": 13, "samples": 11}, "inserts"),  # 26 - 11 = 15 > max_diff 14
    ({"inserts": 7, "samples": 13}, "samples"),  # 14 - 13 = 1 < min_diff 2
    ({"inserts": 8, "samples": 0}, "inserts"),  # 16 > 14: the case in small
    ({"inserts": 7, "samples": 0}, None),  # in bounds: loads
    ({"inserts": 10, "samples": 6}, None),
])
def test_counts_the_limiter_cannot_reach_are_refused(tmp_path, cls, counts, field):
    # a checkpoint whose insert count was 2**63 - 1 was in range and loaded; after that every
    # insert timed out (the difference was beyond max_diff for ever)
    buf = _limited(cls)
    state = buf.state_dict()
    state["rate_limiter"] = counts
    other = _limited(cls)
    before = other.state_dict()
    if field is None:
        other.load_state_dict(state)
        other.sample(2)  # neither side waits for ever
        other.extend(rows([50]))
    else:
        with pytest.raises(ValueError, match=f"rate_limiter state: {field} = {counts[field]}"):
            other.load_state_dict(state)
        after = other.state_dict()
        assert after["rate_limiter"] == before["rate_limiter"] and after["writer"] == before["writer"]
        np.testing.assert_array_equal(after["data"]["id"], before["data"]["id"])
    path = tmp_path / "ck"
    buf.save(path)
    _edit(path, lambda d: d["state"].update(rate_limiter=counts))
    if field is None:
        assert cls.load(path).rate_limiter.state_dict() == counts
        return
    with pytest.raises(FormatError, match=f"state\\.rate_limiter\\.{field}: expected") as exc:
        cls.load(path)
    assert "state.json" in str(exc.value)


def test_a_limiter_without_error_buffer_takes_any_count_above_the_rows():
    lim = RateLimiter.min_size(4)
    buf = ReplayBuffer(SPEC, 32, rate_limiter=lim)
    buf.extend(rows(range(2)))
    state = buf.state_dict()
    state["rate_limiter"] = {"inserts": 2 ** 63 - 1, "samples": 0}  # inserts never wait
    buf.load_state_dict(state)
    buf.extend(rows([9]))
    state["rate_limiter"] = {"inserts": 3, "samples": 1}
    with pytest.raises(ValueError, match="samples = 1: expected 0 while inserts"):
        buf.load_state_dict(state)


def test_min_size_only_gates_sampling():
    lim = RateLimiter.min_size(5)
    assert not lim.can_sample(1) and lim.can_insert(10 ** 9)
    lim.inserts = 5
    assert lim.can_sample(10 ** 6) and lim.can_insert(10 ** 9)
    assert lim.params() == {"samples_per_insert": 1.0, "min_size_to_sample": 5,
                            "error_buffer": None, "timeout": None}


# -- arguments ------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, kw, match", [
    ((0.0, 1, 1.0), {}, "samples_per_insert"),
    ((-1.0, 1, 1.0), {}, "samples_per_insert"),
    ((float("nan"), 1, 1.0), {}, "samples_per_insert"),
    ((1.0, 0, 1.0), {}, "min_size_to_sample"),
    ((2.0, 1, 1.5), {}, "error_buffer must be >= max"),
    ((0.5, 1, 0.5), {}, "error_buffer must be >= max"),
    ((1.0, 1, float("inf")), {}, "error_buffer"),
    ((1.0, 1, 1.0), {"timeout": 0.0}, "timeout"),
    ((1.0, 1, 1.0), {"timeout": -1}, "timeout"),
])
def test_bad_arguments(args, kw, match):
    with pytest.raises(ValueError, match=match):
        RateLimiter(*args, **kw)


@pytest.mark.parametrize("args", [("1", 1, 1.0), (1.0, 1.5, 1.0), (1.0, True, 1.0), (1.0, 1, "2")])
def test_bad_argument_types(args):
    with pytest.raises(TypeError):
        RateLimiter(*args)


def test_one_limiter_per_buffer():
    lim = RateLimiter(1.0, 2, 4.0)
    a = ReplayBuffer(SPEC, 16, rate_limiter=lim)
    with pytest.raises(ValueError, match="already serves"):
        ReplayBuffer(SPEC, 16, rate_limiter=lim)
    with pytest.raises(TypeError, match="rate_limiter must be"):
        ReplayBuffer(SPEC, 16, rate_limiter={"samples_per_insert": 1.0})
    with pytest.raises(ValueError, match="min_size_to_sample must be <= capacity"):
        ReplayBuffer(SPEC, 16, rate_limiter=RateLimiter(1.0, 17, 4.0))
    assert a.rate_limiter is lim


def test_calls_that_can_never_proceed_raise_at_once():
    lim = RateLimiter(2.0, 4, 3.0, timeout=30)
    buf = ReplayBuffer(SPEC, 64, rate_limiter=lim)
    buf.extend(rows(range(4)))  # up to the minimum: free
    with pytest.raises(ValueError, match="2 \\* error_buffer"):
        buf.sample(7)  # 7 > 2 * 3: sampling can never run that far ahead
    with pytest.raises(ValueError, match="can never proceed"):
        buf.extend(rows(range(4, 8)))  # 4 rows count 8 samples > 2 * 3
    small = ReplayBuffer(SPEC, 8, rate_limiter=RateLimiter(1.0, 1, 100.0))
    with pytest.raises(ValueError, match="larger than the capacity"):
        small.sample(9)
    for m in (lim.metrics(), small.rate_limiter.metrics()):  # at once: no call waited
        assert (m["sample_waits"], m["insert_waits"], m["timeouts"]) == (0, 0, 0)
    assert len(buf) == 4 and lim.metrics()["inserts"] == 4 and lim.metrics()["samples"] == 0


# -- one thread: counts, timeouts that change nothing ---------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
def test_counts_and_timeouts_change_nothing(layout):
    lim = RateLimiter(2.0, 4, 4.0, timeout=0.05)
    buf = ReplayBuffer(SPEC, 32, layout=layout, seed=1, rate_limiter=lim)
    with pytest.raises(TimeoutError, match="sample of 2 rows.*inserts=0, samples=0"):
        buf.sample(2)
    assert len(buf) == 0 and lim.metrics()["timeouts"] == 1
    for i in range(4):
        buf.push(row(i))
    buf.extend(rows([4, 5]))  # (4 + 2) * 2 - 0 = 12 <= max_diff = 2 * 4 + 4: allowed
    m = lim.metrics()
    assert (m["inserts"], m["samples"]) == (6, 0)
    before = buf.state_dict()
    with pytest.raises(TimeoutError, match="insert of 1 rows"):
        buf.push(row(6))  # 7 * 2 - 0 = 14 > 12
    with pytest.raises(TimeoutError, match="insert of 2 rows"):
        buf.extend(rows([6, 7]))
    with pytest.raises(ValueError, match="can never proceed"):
        buf.extend(rows(range(6, 30)))  # a large extend (the other generated path): 48 > 2 * 4
    after = buf.state_dict()
    assert len(buf) == 6 and after["writer"] == before["writer"]
    for k in before["data"]:
        np.testing.assert_array_equal(before["data"][k], after["data"][k])
    assert after["rate_limiter"] == {"inserts": 6, "samples": 0}
    buf.sample(4)
    b = buf.sample(4)  # 12 - 4 - 4 = 4 >= min_diff = 8 - 4
    assert b["id"].shape == (4,)
    with pytest.raises(TimeoutError, match="sample of 1 rows"):
        buf.sample(1)
    m = lim.metrics()
    assert (m["inserts"], m["samples"], m["timeouts"]) == (6, 8, 4)
    assert m["insert_waits"] == 2 and m["sample_waits"] == 2 and m["sample_wait_s"] > 0.09
    assert m["insert_wait_s"] > 0.09
    buf.push(row(6))
    assert lim.metrics()["inserts"] == 7


def test_large_extend_waits_and_times_out():
    lim = RateLimiter(1.0, 4, 40.0, timeout=0.05)
    buf = ReplayBuffer(SPEC, 128, rate_limiter=lim)
    buf.extend(rows(range(40)))  # 40 - 0 <= 4 + 40
    before = buf.state_dict()
    with pytest.raises(TimeoutError, match="insert of 20 rows"):
        buf.extend(rows(range(40, 60)))  # 60 > 44: the generated path for large batches
    assert len(buf) == 40 and lim.state_dict() == {"inserts": 40, "samples": 0}
    np.testing.assert_array_equal(buf.state_dict()["data"]["id"], before["data"]["id"])
    buf.sample(20)
    buf.extend(rows(range(40, 60)))
    assert len(buf) == 60 and lim.state_dict() == {"inserts": 60, "samples": 20}


def test_sample_waits_for_rows_not_only_the_limiter():
    lim = RateLimiter.min_size(1, timeout=0.05)
    buf = ReplayBuffer(SPEC, 16, rate_limiter=lim)
    buf.push(row(0))
    with pytest.raises(TimeoutError):
        buf.sample(2)  # the limiter allows it, one row is held: waits for a second
    buf.push(row(1))
    assert buf.sample(2)["id"].shape == (2,)


def test_clear_resets_counts():
    lim = RateLimiter(1.0, 2, 2.0, timeout=0.05)
    buf = ReplayBuffer(SPEC, 16, rate_limiter=lim)
    buf.extend(rows(range(3)))
    buf.sample(2)
    buf.clear()
    m = lim.metrics()
    assert (m["inserts"], m["samples"]) == (0, 0) and len(buf) == 0
    with pytest.raises(TimeoutError):
        buf.sample(1)


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_paths_count_rows(layout):
    """Every write path counts its rows: the generated push and extend (small, large), the
    generic ones, prioritized pushes with priorities; every sample path its batch."""
    lim = RateLimiter.min_size(1)
    buf = PrioritizedReplayBuffer(SPEC, 64, layout=layout, seed=0, rate_limiter=lim)
    buf.push(row(0))                                  # generated push
    buf.push({**row(1), "reward": np.float64(1)})     # generic push
    buf.push(row(2), priority=2.0)                    # prioritized, given priority
    buf.extend(rows([3, 4]))                          # generated extend
    buf.extend(rows(range(5, 25)))                    # large extend
    buf.extend(rows([25, 26]), priorities=[1.0, 2.0])
    buf.extend({k: v.tolist() for k, v in rows([27]).items()})  # generic extend
    assert lim.metrics()["inserts"] == len(buf) == 28
    buf.sample(3)
    buf.sample(2, fields=["id"])
    buf.sample_sequences(2, 3)
    assert lim.metrics()["samples"] == 7


# -- threads -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("spi, batch, chunk, samplers", [(4.0, 8, 1, 1), (0.5, 4, 3, 1), (2.0, 16, 4, 1),
                                                         (4.0, 8, 1, 2)])
def test_threads_keep_the_ratio(layout, spi, batch, chunk, samplers):
    """One writer thread, one (or two) sampler threads: every snapshot of the counts is within
    bounds, and all finish (each side waits for the other, and none waits forever)."""
    eb = max(batch + chunk * spi, max(1.0, spi))
    lim = RateLimiter(spi, 20, eb, timeout=60)  # generous: each side waits for the other to work
    buf = ReplayBuffer(SPEC, 256, layout=layout, seed=2, rate_limiter=lim)
    total = 600
    bad, errors = [], []

    def writer():
        try:
            for i in range(0, total, chunk):
                if chunk == 1:
                    buf.push(row(i))
                else:
                    buf.extend(rows(range(i, i + chunk)))
                m = lim.metrics()
                if not in_bounds(m, lim):
                    bad.append(m)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # the writer's last insert needs samples >= total * spi - max_diff; the sampler can reach
    # that many (batch <= 2 * error_buffer), and no more are asked of it
    n_samples = math.ceil((total * spi - lim.max_diff) / batch)

    def sampler(k):
        try:
            for _ in range(k):
                buf.sample(batch)
                m = lim.metrics()
                if not in_bounds(m, lim):
                    bad.append(m)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    share = [n_samples // samplers + (j < n_samples % samplers) for j in range(samplers)]
    ts = [threading.Thread(target=writer)] + [threading.Thread(target=sampler, args=(k,)) for k in share]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    assert not errors and not bad, (errors, bad[:3])
    m = lim.metrics()
    assert m["samples"] == n_samples * batch
    assert m["inserts"] == total
    assert m["insert_waits"] + m["sample_waits"] > 0  # they did hold each other back


def thread_cpu_s(tid: int) -> float:
    """CPU seconds (user + system) the thread ``tid`` of this process has used (Linux)."""
    with open(f"/proc/self/task/{tid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc")


def run_waiting(call):
    """Start ``call`` in a thread; returns ``(thread, results, native thread id)``."""
    got, tid = [], []

    def body():
        tid.append(threading.get_native_id())
        try:
            got.append(call())
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            got.append(exc)

    t = threading.Thread(target=body)
    t.start()
    while not tid:
        time.sleep(0.001)
    return t, got, tid[0]


def python_work(seconds: float) -> int:
    n, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:  # pure Python: needs the GIL
        n += 1
    return n


@needs_proc
def test_a_waiting_thread_lets_others_run():
    """While a sample waits, another thread does Python work and the waiter burns no CPU (it
    holds neither the GIL nor a core); a push (the lock is free) wakes it."""
    lim = RateLimiter(1.0, 4, 2.0, timeout=60)
    buf = ReplayBuffer(SPEC, 16, rate_limiter=lim)
    t, got, tid = run_waiting(lambda: buf.sample(2))
    # counted under the lock the wait releases: once read, the sample is waiting
    assert until(lambda: lim.metrics()["sample_waits"] == 1)
    cpu0 = thread_cpu_s(tid)
    python_work(0.3)  # returns only if this thread ran Python while the sample waited:
    assert t.is_alive() and not got  # the sample is still waiting
    assert thread_cpu_s(tid) - cpu0 < 0.05  # a spinning wait would use about 0.15-0.3 s
    buf.extend(rows(range(4)))  # the lock is free too: a push does not wait for the sampler
    t.join(60)
    assert got and got[0]["id"].shape == (2,)
    assert lim.metrics()["sample_waits"] == 1 and lim.metrics()["sample_wait_s"] >= 0.3


@needs_proc
def test_a_waiting_writer_thread_burns_no_cpu():
    lim = RateLimiter(1.0, 2, 1.0, timeout=60)
    buf = ReplayBuffer(SPEC, 16, rate_limiter=lim)
    buf.extend(rows(range(3)))
    t, got, tid = run_waiting(lambda: buf.push(row(3)))
    assert until(lambda: lim.metrics()["insert_waits"] == 1)  # the push is waiting
    cpu0 = thread_cpu_s(tid)
    python_work(0.3)
    assert thread_cpu_s(tid) - cpu0 < 0.05 and t.is_alive() and not got
    assert buf.sample(1)["id"].shape == (1,)  # the lock is free: the sampler runs, and wakes it
    t.join(60)
    assert got == [None] and len(buf) == 4


def test_a_waiting_writer_is_woken_by_samples():
    lim = RateLimiter(1.0, 2, 1.0, timeout=60)
    buf = ReplayBuffer(SPEC, 16, rate_limiter=lim)
    buf.extend(rows(range(3)))  # diff 3 = max_diff 3
    done = threading.Event()
    t = threading.Thread(target=lambda: (buf.push(row(3)), done.set()))
    t.start()
    assert until(lambda: lim.metrics()["insert_waits"] == 1)  # the push waits
    assert not done.is_set()
    buf.sample(1)
    assert done.wait(60)
    t.join(60)
    assert lim.metrics()["insert_waits"] == 1 and len(buf) == 4


# -- with the rest ----------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("sampler", ["uniform", "without_replacement"])
def test_nstep_and_sequences(layout, sampler):
    lim = RateLimiter(1.0, 8, 8.0, timeout=0.05)
    buf = ReplayBuffer(SPEC, 32, layout=layout, seed=0, n_step=3, sampler=sampler, rate_limiter=lim)
    buf.extend(rows(range(8)))
    b = buf.sample(4)
    assert b.discounts.shape == (4,)
    if sampler == "without_replacement":  # it rejects no slices: refused, nothing counted
        with pytest.raises(NotImplementedError):
            buf.sample_sequences(2, 3, policy="reject")
        assert lim.metrics()["samples"] == 4
    s = buf.sample_sequences(2, 3)
    assert s["id"].shape == (2, 3)
    assert lim.metrics()["samples"] == 6
    with pytest.raises(TimeoutError):
        buf.sample_sequences(8, 2)  # 8 - 6 - 8 < 0
    buf.extend(rows(range(8, 16)))
    buf.sample_sequences(8, 2)
    assert lim.metrics()["samples"] == 14


NEXT_SPEC = {"obs": ("f4", (2,)), "next_obs": ("f4", (2,)), "reward": "f4", "terminated": "?",
             "truncated": "?"}


def next_rows(start: int, n: int) -> dict:
    t = np.arange(start, start + n + 1, dtype=np.float32)
    obs = np.stack([t, t], 1)
    return {"obs": obs[:-1], "next_obs": obs[1:], "reward": t[:-1], "terminated": np.zeros(n, bool),
            "truncated": np.zeros(n, bool)}


@pytest.mark.parametrize("options", [
    dict(elide_next=True), dict(num_envs=2), dict(n_step=3, gamma=0.9),
    dict(layout=[["obs", "reward"], ["next_obs"]]), dict(allocator="numpy", ring_size=3)])
def test_with_other_options(options, tmp_path):
    lim = RateLimiter(1.0, 4, 4.0, timeout=0.02)
    buf = ReplayBuffer(NEXT_SPEC, 16, seed=0, rate_limiter=lim, **options)
    buf.extend(next_rows(0, 4))
    if options.get("num_envs") == 2:  # push is refused (one row per step of 2 streams): not counted
        with pytest.raises(tfdata.SpecError):
            buf.push({k: v[0] for k, v in next_rows(4, 1).items()})
    else:
        buf.push({k: v[0] for k, v in next_rows(4, 1).items()})
    n = len(buf)
    assert lim.state_dict() == {"inserts": n, "samples": 0}
    buf.sample(4)
    step = options.get("num_envs", 1)
    k = next(k for k in range(step, 64, step)  # the smallest extend the limiter holds back
             if not naive.limiter_allows_naive("insert", n, 4, k, 1.0, 4, 4.0))
    never = min(n - 4, 4 - 4) + k > 4 + 4  # no sampling can make room: refused at once
    with pytest.raises(ValueError if never else TimeoutError):
        buf.extend(next_rows(5, k))
    assert len(buf) == n and lim.state_dict() == {"inserts": n, "samples": 4}
    buf.extend(next_rows(5, k - step))  # one step less goes in
    assert len(buf) == n + k - step


def test_with_spill(tmp_path):
    lim = RateLimiter(1.0, 4, 4.0, timeout=0.02)
    buf = ReplayBuffer(SPEC, 32, seed=0, rate_limiter=lim, spill_path=tmp_path / "rows.npy", hot_rows=8)
    buf.extend(rows(range(8)))
    with pytest.raises(TimeoutError):
        buf.push(row(8))
    buf.sample(4)
    buf.push(row(8))
    assert lim.state_dict() == {"inserts": 9, "samples": 4} and len(buf) == 9


def test_plan_memory_and_nbytes_unaffected():
    plan = ReplayBuffer.plan_memory(SPEC, 64, rate_limiter=RateLimiter(1.0, 1, 1.0))
    assert plan == ReplayBuffer.plan_memory(SPEC, 64)
    a = ReplayBuffer(SPEC, 64, rate_limiter=RateLimiter(1.0, 1, 1.0))
    assert a.nbytes == ReplayBuffer(SPEC, 64).nbytes


def test_memory_budget_and_allocator():
    lim = RateLimiter.min_size(2)
    need = sum(ReplayBuffer.plan_memory(SPEC, 64).values())
    buf = ReplayBuffer(SPEC, 64, rate_limiter=lim, memory_budget=need + 4096, allocator="numpy")
    buf.extend(rows(range(4)))
    buf.sample(2)
    assert lim.metrics()["samples"] == 2


# -- state and checkpoints ------------------------------------------------------------------------
def test_state_dict_round_trip():
    lim = RateLimiter(2.0, 4, 4.0)
    buf = ReplayBuffer(SPEC, 32, seed=3, rate_limiter=lim)
    buf.extend(rows(range(6)))
    buf.sample(5)
    state = buf.state_dict()
    other = ReplayBuffer(SPEC, 32, rate_limiter=RateLimiter(2.0, 4, 4.0))
    other.load_state_dict(state)
    assert other.rate_limiter.state_dict() == {"inserts": 6, "samples": 5}
    for bad, match in (({"inserts": 5, "samples": 0}, "inserts must be >= the 6 rows"),
                       ({"inserts": -1, "samples": 0}, "inserts must be an int"),
                       ({"inserts": 6, "samples": 1.5}, "samples must be an int"),
                       ({"inserts": 6}, "keys")):
        with pytest.raises(ValueError, match=match):
            other.load_state_dict({**state, "rate_limiter": bad})
        assert other.rate_limiter.state_dict() == {"inserts": 6, "samples": 5}
    # a state without counts (no limiter when saved) starts balanced
    plain = ReplayBuffer(SPEC, 32, seed=3)
    plain.extend(rows(range(10)))
    lim3 = RateLimiter(2.0, 4, 4.0)
    ReplayBuffer(SPEC, 32, rate_limiter=lim3).load_state_dict(plain.state_dict())
    assert lim3.state_dict() == {"inserts": 10, "samples": 12}


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_checkpoint_round_trip(tmp_path, cls):
    lim = RateLimiter(2.0, 4, 6.0, timeout=1.5)
    buf = cls(SPEC, 32, seed=3, rate_limiter=lim)
    buf.extend(rows(range(7)))
    buf.sample(5)
    buf.save(tmp_path / "ck")
    new = cls.load(tmp_path / "ck")
    assert new.rate_limiter is not lim
    assert new.rate_limiter.params() == lim.params()
    assert new.rate_limiter.state_dict() == {"inserts": 7, "samples": 5}
    np.testing.assert_array_equal(new.sample(3)["id"], buf.sample(3)["id"])
    assert new.rate_limiter.state_dict() == lim.state_dict()


def _edit(path, fn):
    spath = os.path.join(path, "state.json")
    with open(spath) as f:
        doc = json.load(f)
    fn(doc)
    with open(spath, "w") as f:
        json.dump(doc, f)


@pytest.mark.parametrize("where, edit", [
    ("config.rate_limiter.samples_per_insert", lambda d: d["config"]["rate_limiter"].update(samples_per_insert=0.0)),
    ("config.rate_limiter.samples_per_insert", lambda d: d["config"]["rate_limiter"].update(samples_per_insert="2")),
    ("config.rate_limiter.min_size_to_sample", lambda d: d["config"]["rate_limiter"].update(min_size_to_sample=33)),
    ("config.rate_limiter.min_size_to_sample", lambda d: d["config"]["rate_limiter"].update(min_size_to_sample=True)),
    ("config.rate_limiter.error_buffer", lambda d: d["config"]["rate_limiter"].update(error_buffer=1.0)),
    ("config.rate_limiter.timeout", lambda d: d["config"]["rate_limiter"].update(timeout=-1.0)),
    ("config.rate_limiter", lambda d: d["config"]["rate_limiter"].update(extra=1)),
    ("config.rate_limiter", lambda d: d["config"].update(rate_limiter=[1, 2])),
    ("state.rate_limiter.inserts", lambda d: d["state"]["rate_limiter"].update(inserts=6)),
    ("state.rate_limiter.samples", lambda d: d["state"]["rate_limiter"].update(samples=-1)),
    ("state.rate_limiter.samples", lambda d: d["state"]["rate_limiter"].update(samples=2 ** 70)),
    ("state", lambda d: d["state"].pop("rate_limiter")),
    ("state", lambda d: d["config"].pop("rate_limiter")),
])
def test_hostile_checkpoint(tmp_path, where, edit):
    buf = ReplayBuffer(SPEC, 32, seed=3, rate_limiter=RateLimiter(2.0, 4, 6.0))
    buf.extend(rows(range(7)))
    path = tmp_path / "ck"
    buf.save(path)
    _edit(path, edit)
    with pytest.raises(FormatError, match=where.replace(".", "\\.")) as exc:
        ReplayBuffer.load(path)
    assert "state.json" in str(exc.value)


# -- shared memory: writer processes and the learner ----------------------------------------------------
import multiprocessing as mp  # noqa: E402
import signal  # noqa: E402

from tfdata import SharedBufferError, SharedReplayBuffer, SharedWriter  # noqa: E402

FORK = mp.get_context("fork")


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    return tmp_path


def test_shared_refusals(shm_dir):
    with pytest.raises(ValueError, match="rate_limiter=.* with mode='fifo'"):
        SharedReplayBuffer(SPEC, 16, mode="fifo", rate_limiter=RateLimiter(1.0, 1, 1.0))
    with pytest.raises(ValueError, match="min_size_to_sample must be <= capacity"):
        SharedReplayBuffer(SPEC, 16, rate_limiter=RateLimiter(1.0, 17, 1.0))
    with pytest.raises(TypeError, match="rate_limiter must be"):
        SharedReplayBuffer(SPEC, 16, rate_limiter=2.0)
    lim = RateLimiter(1.0, 1, 1.0)
    with SharedReplayBuffer(SPEC, 16, rate_limiter=lim):
        with pytest.raises(ValueError, match="already serves"):
            SharedReplayBuffer(SPEC, 16, rate_limiter=lim)
        with pytest.raises(ValueError, match="already serves"):
            ReplayBuffer(SPEC, 16, rate_limiter=lim)
    assert not os.listdir(shm_dir)  # refused before a region was made


@pytest.mark.parametrize("layout", LAYOUTS)
def test_shared_one_process_counts_and_timeouts(layout, shm_dir):
    lim = RateLimiter(2.0, 4, 4.0, timeout=0.05)
    with SharedReplayBuffer(SPEC, 32, num_writers=2, layout=layout, seed=0, rate_limiter=lim) as buf:
        with pytest.raises(TimeoutError, match="sample of 2 rows"):
            buf.sample(2)
        w0, w1 = SharedWriter(buf.name, 0), SharedWriter(buf.name, 1)
        assert w0.rate_limiter.params() == lim.params()
        w0.extend(rows(range(3)))
        w1.push(row(100))  # 4 rows: the minimum
        w1.extend(rows([101, 102]))  # (6) * 2 - 0 = 12 <= 8 + 4
        region = bytes(buf._region.map.at(0, np.uint8, (buf.nbytes,)))
        with pytest.raises(TimeoutError, match="shard 0: .*insert of 1 rows"):
            w0.push(row(3))
        with pytest.raises(TimeoutError, match="shard 1: .*insert of 2 rows"):
            w1.extend(rows([103, 104]))
        with pytest.raises(ValueError, match="can never proceed"):
            w1.extend(rows(range(103, 110)))
        assert bytes(buf._region.map.at(0, np.uint8, (buf.nbytes,))) == region  # nothing written
        assert buf.rate_limiter.state_dict() == {"inserts": 6, "samples": 0} and len(buf) == 6
        buf.sample(4)
        buf.sample(4)
        with pytest.raises(TimeoutError, match="sample of 1 rows"):
            buf.sample(1)
        assert buf.rate_limiter.state_dict() == {"inserts": 6, "samples": 8}
        for i in range(3, 7):  # up to (10) * 2 - 8 = 12 = max_diff
            w0.push(row(i))
        with pytest.raises(TimeoutError):
            w0.push(row(7))
        m = lim.metrics()
        assert (m["sample_waits"], m["timeouts"]) == (2, 2)
        assert w0.rate_limiter.metrics()["insert_waits"] == 2
        assert w0.rate_limiter.metrics()["timeouts"] == 2
        s = buf.sample_sequences(2, 2)
        assert s["id"].shape == (2, 2) and lim.metrics()["samples"] == 10
        w0.close()
        w1.close()


def test_shared_sample_waits_for_rows(shm_dir):
    lim = RateLimiter.min_size(1, timeout=0.05)
    with SharedReplayBuffer(SPEC, 16, num_writers=2, seed=0, rate_limiter=lim) as buf:
        with SharedWriter(buf.name, 0) as w0, SharedWriter(buf.name, 1) as w1:
            w0.push(row(0))
            with pytest.raises(TimeoutError):
                buf.sample(2)  # the limiter allows it; one row is held
            w1.push(row(1))
            assert sorted(set(buf.sample(2)["id"].tolist())) <= [0, 1]
            with pytest.raises(TimeoutError):
                buf.sample(3)
            w1.extend(rows([2, 3]))
            buf.sample(3)
            assert lim.metrics()["samples"] == 5


def test_shared_prioritized_and_nstep(shm_dir):
    lim = RateLimiter(1.0, 4, 8.0, timeout=0.05)
    with SharedReplayBuffer(SPEC, 32, seed=0, prioritized=True, n_step=2, rate_limiter=lim) as buf:
        with SharedWriter(buf.name, 0) as w:
            w.extend(rows(range(8)))
            b = buf.sample(4)
            assert b.weights.shape == (4,) and b.discounts.shape == (4,)
            buf.sample(4)
            buf.sample(4)  # 8 - 8 - 4 >= min_diff = 4 - 8
            with pytest.raises(TimeoutError):
                buf.sample(4)
            assert buf.rate_limiter.state_dict() == {"inserts": 8, "samples": 12}


def test_shared_bad_region_json(shm_dir):
    with SharedReplayBuffer(SPEC, 16, rate_limiter=RateLimiter(1.0, 2, 2.0)) as buf:
        doc_path = os.path.join(buf.path, "region.json")
        with open(doc_path) as f:
            good = json.load(f)
        for bad in ({**good["rate_limiter"], "error_buffer": 0.5},
                    {**good["rate_limiter"], "timeout": True},
                    {**good["rate_limiter"], "min_size_to_sample": 17},
                    {"samples_per_insert": 1.0}, [1, 2]):
            with open(doc_path, "w") as f:
                json.dump({**good, "rate_limiter": bad}, f)
            with pytest.raises(FormatError, match="region.json.*rate_limiter"):
                SharedWriter(buf.name, 0)
    # a limiter no constructor would combine with the region's sampler (the table of
    # combinations): exactly-k delivers 2 samples per row, not 3
    with SharedReplayBuffer(SPEC, 16, sampler="exactly_k", replays=2,
                            rate_limiter=RateLimiter(2.0, 2, 4.0)) as buf:
        doc_path = os.path.join(buf.path, "region.json")
        with open(doc_path) as f:
            good = json.load(f)
        with open(doc_path, "w") as f:
            json.dump({**good, "rate_limiter": {**good["rate_limiter"], "samples_per_insert": 3.0}}, f)
        with pytest.raises(FormatError, match="region.json.*samples_per_insert = replays"):
            SharedWriter(buf.name, 0)
        with open(doc_path, "w") as f:
            json.dump(good, f)
        SharedWriter(buf.name, 0).close()


def _limited_writer(name, shard, total, chunk, errors, waits):
    try:
        with SharedWriter(name, shard) as w:
            for i in range(0, total, chunk):
                ids = np.arange(i, i + chunk) + 1_000_000 * shard
                if chunk == 1:
                    w.push(row(int(ids[0])))
                else:
                    w.extend(rows(ids))
            waits.put(w.rate_limiter.metrics()["insert_waits"])
    except BaseException as exc:  # noqa: BLE001 - reported to the learner
        errors.put(f"shard {shard}: {exc!r}")


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("spi, batch, chunk", [(4.0, 16, 1), (1.0, 8, 4)])
def test_processes_keep_the_ratio(layout, spi, batch, chunk, shm_dir):
    """2 writer processes and the learner: after every sample the counts are within the
    limiter's bounds (writers may overshoot by one write of the other writer: they check and
    write without a lock between processes), and everyone finishes."""
    writers, per_writer = 2, 400
    eb = max(batch + chunk * spi, spi)
    lim = RateLimiter(spi, 32, eb, timeout=60)  # generous: each side waits for the other to work
    errors, waits = FORK.Queue(), FORK.Queue()
    with SharedReplayBuffer(SPEC, 2 * 256, num_writers=writers, layout=layout, seed=0,
                            rate_limiter=lim) as buf:
        procs = [FORK.Process(target=_limited_writer, args=(buf.name, s, per_writer, chunk, errors, waits))
                 for s in range(writers)]
        for p in procs:
            p.start()
        total = writers * per_writer
        n_batches = math.ceil((total * spi - lim.max_diff) / batch)
        slack = (writers - 1) * chunk * spi
        seen = []
        for _ in range(n_batches):
            b = buf.sample(batch)
            assert b["id"].shape == (batch,)
            m = buf.rate_limiter.metrics()
            i, s = m["inserts"], m["samples"]
            lo, hi = naive.limiter_bounds_naive(i, spi, 32, eb)
            seen.append((i, s))
            assert s <= hi + slack and s >= lo - slack, (i, s, lo, hi)
        for p in procs:
            p.join(60)
        assert errors.empty(), errors.get()
        assert all(p.exitcode == 0 for p in procs)
        m = buf.rate_limiter.metrics()
        assert m["inserts"] == total and m["samples"] == n_batches * batch
        # the limiter held one side or the other back at times (which one is the machine's
        # scheduling: a learner that is never faster than the writers never waits)
        insert_waits = sum(waits.get(timeout=60) for _ in procs)
        assert m["sample_waits"] + insert_waits > 0
        assert len(seen) == n_batches


def _killed_writer(name, shard, n):
    w = SharedWriter(name, shard)
    w.extend(rows(np.arange(n) + 1_000_000 * shard))
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_writer_does_not_wedge_the_learner(shm_dir):
    # a timeout only so that a regression fails (TimeoutError) instead of hanging: the wait
    # must end with SharedBufferError because no writer is left
    lim = RateLimiter(1.0, 8, 8.0, timeout=60)
    with SharedReplayBuffer(SPEC, 64, num_writers=2, seed=0, rate_limiter=lim) as buf:
        p = FORK.Process(target=_killed_writer, args=(buf.name, 0, 12))
        p.start()
        p.join(30)
        assert p.exitcode == -signal.SIGKILL
        with SharedWriter(buf.name, 1) as w:
            w.extend(rows(range(4)))
        # 16 rows: 16 - 0 - B >= 8 - 8 allows 16 samples
        with pytest.warns(tfdata.WriterLostWarning):
            buf.sample(8)
        buf.sample(8)
        with pytest.raises(SharedBufferError, match="every writer is gone"):
            buf.sample(8)
        assert lim.metrics()["samples"] == 16
        # a writer that comes back lets sampling go on
        with SharedWriter(buf.name, 0) as w:
            w.extend(rows(range(100, 108)))
        buf.sample(8)


def _waiting_writer(name, conn):
    try:
        w = SharedWriter(name, 0)
        w.extend(rows(range(3)))  # 3 * 1 - 0 <= max_diff = 2 + 1
        conn.send("ready")
        sleep, told = time.sleep, []

        def first_sleep(seconds):  # the push's wait polls with sleeps: say it is waiting
            if not told:
                told.append(True)
                conn.send("waiting")
            sleep(seconds)

        time.sleep = first_sleep  # in this child process only
        w.push(row(3))  # waits for samples that never come
        conn.send("pushed")
    except SharedBufferError as exc:
        conn.send(f"SharedBufferError: {exc}")
    except BaseException as exc:  # noqa: BLE001
        conn.send(repr(exc))


@needs_proc
def test_shared_learner_waits_without_the_gil(shm_dir, monkeypatch):
    """A learner thread waiting for inserts polls with sleeps: little CPU, other threads run,
    and its lock is free (another learner thread can read the priorities meanwhile)."""
    lim = RateLimiter(1.0, 4, 8.0, timeout=60)
    sleepers, sleep = set(), time.sleep

    def recorded_sleep(seconds):  # the learner's wait polls with sleeps: its first says it waits
        sleepers.add(threading.get_ident())
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", recorded_sleep)
    with SharedReplayBuffer(SPEC, 16, seed=0, prioritized=True, rate_limiter=lim) as buf:
        t, got, tid = run_waiting(lambda: buf.sample(4))
        assert until(lambda: t.ident in sleepers)
        cpu0 = thread_cpu_s(tid)
        python_work(0.3)  # returns only if this thread ran Python while the sample waited
        probe = threading.Thread(target=buf.priorities, daemon=True)  # takes the learner's lock
        probe.start()
        probe.join(60)
        # the probe is done while the sample still waits: the waiting sample holds no lock
        assert not probe.is_alive() and t.is_alive() and not got, "the waiting sample holds the lock"
        assert thread_cpu_s(tid) - cpu0 < 0.1
        with SharedWriter(buf.name, 0) as w:
            w.extend(rows(range(4)))
        t.join(60)
        assert got and got[0]["id"].shape == (4,)
        assert lim.metrics()["sample_waits"] == 1


@settings(max_examples=40, deadline=None)
@given(spi=st.sampled_from([0.5, 1.0, 2.0]), extra=st.sampled_from([0, 2]),
       ops=st.lists(st.tuples(st.sampled_from(["push", "extend", "sample", "seq"]),
                              st.integers(1, 4)), max_size=40))
def test_one_thread_interleavings(spi, extra, ops):
    """Random calls on a real buffer: each proceeds exactly when the reference predicates (and
    the rows held) allow it, else times out having changed nothing."""
    eb = max(1.0, spi) + extra
    lim = RateLimiter(spi, 3, eb, timeout=0.001)
    buf = ReplayBuffer(SPEC, 64, seed=0, rate_limiter=lim)
    nxt = 0
    for op, k in ops:
        i, s = lim.inserts, lim.samples
        n = 1 if op == "push" else k
        side = "insert" if op in ("push", "extend") else "sample"
        if side == "insert":
            ok = naive.limiter_allows_naive("insert", i, s, n, spi, 3, eb)
            never = not ok and min(i * spi - s, spi * 3 - eb) + n * spi > spi * 3 + eb
        else:
            ok = naive.limiter_allows_naive("sample", i, s, n, spi, 3, eb) and len(buf) >= n
            never = n > 2 * eb
        before = len(buf)
        try:
            if op == "push":
                buf.push(row(nxt))
            elif op == "extend":
                buf.extend(rows(range(nxt, nxt + n)))
            elif op == "sample":
                buf.sample(n)
            else:
                buf.sample_sequences(n, 1)
        except TimeoutError:
            assert not ok and not never
            assert (lim.inserts, lim.samples, len(buf)) == (i, s, before)
            continue
        except ValueError:
            assert never
            assert (lim.inserts, lim.samples, len(buf)) == (i, s, before)
            continue
        assert ok, (op, n, i, s)
        if side == "insert":
            nxt += n
            assert (lim.inserts, lim.samples) == (i + n, s)
        else:
            assert (lim.inserts, lim.samples) == (i, s + n)
        assert in_bounds(lim.metrics(), lim)


def test_closing_the_buffer_wakes_a_waiting_writer(shm_dir):
    here, there = FORK.Pipe()
    buf = SharedReplayBuffer(SPEC, 16, seed=0, rate_limiter=RateLimiter(1.0, 2, 1.0))
    p = FORK.Process(target=_waiting_writer, args=(buf.name, there))
    p.start()
    assert here.poll(60) and here.recv() == "ready"
    assert here.poll(60) and here.recv() == "waiting"  # the push is in its wait
    buf.close()
    assert here.poll(60)
    msg = here.recv()
    p.join(60)
    assert msg.startswith("SharedBufferError") and "closed by its owner" in msg, msg


def test_shared_checkpoint_keeps_counts(shm_dir, tmp_path):
    lim = RateLimiter(2.0, 4, 6.0, timeout=0.05)
    with SharedReplayBuffer(SPEC, 32, num_writers=2, seed=0, rate_limiter=lim) as buf:
        with SharedWriter(buf.name, 0) as w0, SharedWriter(buf.name, 1) as w1:
            w0.extend(rows(range(3)))
            w1.extend(rows(range(100, 104)))
        buf.sample(5)
        buf.save(tmp_path / "ck")
        with SharedReplayBuffer.load(tmp_path / "ck") as new:
            assert new.rate_limiter.params() == lim.params()
            assert new.rate_limiter.state_dict() == {"inserts": 7, "samples": 5}
            with SharedWriter(new.name, 0) as w:
                w.push(row(3))  # (8) * 2 - 5 = 11 <= max_diff = 8 + 6
                w.push(row(4))  # (9) * 2 - 5 = 13
                with pytest.raises(TimeoutError):
                    w.push(row(5))  # (10) * 2 - 5 = 15: the restored counts hold it back
            assert new.rate_limiter.state_dict() == {"inserts": 9, "samples": 5}
        path = tmp_path / "ck"
        for edit, where in ((lambda d: d["state"]["rate_limiter"].update(inserts=6), "inserts"),
                            (lambda d: d["state"]["rate_limiter"].update(samples=-2), "samples"),
                            (lambda d: d["config"]["rate_limiter"].update(error_buffer=0.1), "error_buffer"),
                            (lambda d: d["state"].pop("rate_limiter"), "state")):
            shutil.copytree(path, tmp_path / "bad")
            _edit(tmp_path / "bad", edit)
            with pytest.raises(FormatError, match=where):
                SharedReplayBuffer.load(tmp_path / "bad")
            shutil.rmtree(tmp_path / "bad")


def test_a_limited_sample_the_sampler_refuses_takes_no_slot_of_the_output_ring():
    """As an unlimited sample: a sample the sampler refuses (after the limiter let it through)
    leaves the ring's next slot to the next sample, so the batch before it stays intact."""
    buf = ReplayBuffer(SPEC, 16, seed=0, ring_size=2, rate_limiter=RateLimiter.min_size(1))
    buf.extend(rows(range(8)))
    first = buf.sample(2)
    kept = first["id"].tolist()
    real = buf.sampler.sample

    def refuse(*args):
        raise ValueError("refused by the sampler")

    buf.sampler.sample = refuse
    with pytest.raises(ValueError, match="refused by the sampler"):
        buf.sample(2)
    buf.sampler.sample = real
    buf.sample(2)  # ring_size=2: the other slot, so the first batch is still intact
    assert first["id"].tolist() == kept
    assert buf.rate_limiter.metrics()["samples"] == 4  # the refused sample was not counted


def test_a_limited_batch_carries_the_write_position_of_its_sample():
    """update_field(name, batch) checks a limited batch's rows by the writer's position at its
    sample, cursor included: mid-ring, no row written since, nothing is stale."""
    buf = ReplayBuffer(SPEC, 8, seed=0, sampler="without_replacement",
                       rate_limiter=RateLimiter.min_size(1))
    buf.extend(rows(range(12)))  # a lap and a half: the cursor at slot 4
    assert buf.writer.cursor == 4
    b = buf.sample(8, copy=True)  # every slot, those before the cursor too
    assert b.write_position == buf.writer.position
    buf.update_field("reward", b, np.arange(8, dtype=np.float32))
    buf.push(row(12))  # slot 4 overwritten: that row of the batch is stale now
    with pytest.raises(ValueError, match="stale batch: 1 of its 8 rows"):
        buf.update_field("reward", b, np.arange(8, dtype=np.float32))


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_a_refused_limited_sample_counts_nothing(layout):
    """The gate counts a batch when it lets it through (under the lock, before the draw) and
    takes the count back when the draw is refused: a sample_sequences that finds no slice,
    and one refused after the wait (the rows cannot back it), leave the limiter's counts and
    the sampler's RNG as they were, and the next sample is allowed as before."""
    spec = {"x": "i8", "terminated": "?", "truncated": "?"}
    lim = RateLimiter(samples_per_insert=1.0, min_size_to_sample=4, error_buffer=100.0, timeout=60.0)
    buf = ReplayBuffer(spec, 32, layout=layout, seed=3, rate_limiter=lim)
    n = 16  # episodes of 2 rows: no slice of 5 steps lies in one episode
    buf.extend({"x": np.arange(n), "terminated": np.arange(n) % 2 == 1, "truncated": np.zeros(n, bool)})
    before = (lim.inserts, lim.samples, int(buf.sampler.state[1]))
    with pytest.raises(ValueError, match="found no slice"):
        buf.sample_sequences(4, 5, policy="reject")
    assert (lim.inserts, lim.samples, int(buf.sampler.state[1])) == before
    with pytest.raises(ValueError, match="no slice of length 17 exists"):
        buf.sample_sequences(2, 17, policy="reject")  # 16 steps held: refused after the wait
    assert (lim.inserts, lim.samples, int(buf.sampler.state[1])) == before
    b = buf.sample_sequences(4, 2, policy="reject")  # allowed, counted once
    assert lim.samples == before[1] + 4 and b.mask.all()
    buf.sample(3)
    assert lim.samples == before[1] + 7
