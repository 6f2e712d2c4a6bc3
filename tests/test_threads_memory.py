"""Steady state allocates nothing; one writer and concurrent samplers never see a torn row."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

from tfdata import PrioritizedReplayBuffer, ReplayBuffer

from .conftest import CARTPOLE, random_rows, row


@pytest.mark.parametrize("batch_size", [256, 1024])
def test_steady_state_allocates_nothing(layout, batch_size):
    buf = ReplayBuffer(CARTPOLE, 5000, layout=layout, seed=0)
    rows = random_rows(buf.spec, 1000, np.random.default_rng(0))
    one = row(rows, 0)
    py_row = {"obs": rows["obs"][1], "action": 3, "reward": 0.5, "next_obs": rows["next_obs"][1],
              "terminated": False, "truncated": True}
    buf.extend(rows)
    buf.extend(rows)
    for _ in range(3):  # warm: compile, allocate this batch size's output ring
        buf.push(one)
        buf.sample(batch_size)
    batch_bytes = batch_size * buf.spec.row_nbytes
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for i in range(300):
            buf.push(one)
            buf.push(py_row)
            buf.extend(rows)
            buf.sample(batch_size)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # a single allocated batch, or one row per push, would exceed these bounds many times over
    assert current - base < 1024, current - base
    assert peak - base < min(2048, batch_bytes // 4), peak - base


SEQ_SPEC = {"a": ("i8", (64,)), "b": "f8", "c": ("i4", (7,)), "d": ("i2", (33,))}


def seq_rows(start: int, n: int) -> dict:
    ids = np.arange(start, start + n)
    return {
        "a": np.repeat(ids[:, None], 64, axis=1).astype(np.int64),
        "b": ids.astype(np.float64),
        "c": np.repeat(ids[:, None], 7, axis=1).astype(np.int32),
        "d": np.repeat(ids[:, None] % 30000, 33, axis=1).astype(np.int16),
    }


def torn_rows(batch) -> int:
    ids = batch["a"][:, 0]
    ok = (batch["a"] == ids[:, None]).all(1)
    ok &= batch["b"] == ids
    ok &= (batch["c"] == ids[:, None]).all(1)
    ok &= (batch["d"] == (ids % 30000)[:, None]).all(1)
    return int((~ok).sum())


def hammer(buf, seconds: float, n_samplers: int = 2, min_sampled: int = 0) -> tuple[int, int]:
    """A writer pushes and extends rows that carry their id in every field; samplers check them,
    for ``seconds`` and then until ``min_sampled`` rows were sampled (at most 60 s more: a loaded
    machine slows the threads, it must not fail the check)."""
    stop = threading.Event()
    torn, sampled = [0] * n_samplers, [0] * n_samplers
    errors = []

    def writer():
        k = 200
        try:
            while not stop.is_set():
                for _ in range(10):
                    r = seq_rows(k, 1)
                    buf.push({name: v[0] for name, v in r.items()})
                    k += 1
                buf.extend(seq_rows(k, 50))
                k += 50
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def sampler(i):
        try:
            while not stop.is_set():
                b = buf.sample(128, copy=True)
                torn[i] += torn_rows(b)
                sampled[i] += 128
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=sampler, args=(i,)) for i in range(n_samplers)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    deadline = time.monotonic() + 60
    while sum(sampled) < min_sampled and time.monotonic() < deadline and not errors:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join(10)
    assert not errors, errors
    return sum(torn), sum(sampled)


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_no_torn_rows_with_one_writer_and_two_samplers(layout, cls):
    buf = cls(SEQ_SPEC, 200, layout=layout, seed=0)
    buf.extend(seq_rows(0, 200))
    buf.sample(128)  # compile (cold cache) or load the kernel before the clock starts
    torn, sampled = hammer(buf, 1.5, min_sampled=10_001)
    assert sampled > 10_000
    assert torn == 0


def test_torn_rows_are_detected_without_the_lock():
    """Control: with the lock replaced by a no-op, the same hammer does see torn rows,
    so the test above can fail."""
    buf = ReplayBuffer(SEQ_SPEC, 200, layout="soa", seed=0)
    buf.extend(seq_rows(0, 200))
    buf.sample(128)
    buf._lock = contextlib.nullcontext()
    torn = 0
    deadline = time.monotonic() + 20
    while torn == 0 and time.monotonic() < deadline:
        torn, _ = hammer(buf, 1.0, n_samplers=1)
    assert torn > 0


def _progress_of_other_thread_during(action) -> int:
    """How far a counting thread gets while ``action`` runs in this thread.

    The switch interval is raised to 1 s, so this thread keeps the GIL unless it releases it
    itself: the count can only move while ``action`` runs if ``action`` releases the GIL.
    """
    counter = [0]
    stop = threading.Event()

    def count():
        while not stop.is_set():
            counter[0] += 1
            if counter[0] % 64 == 0:
                time.sleep(0)  # hand the GIL back to the main thread

    old = sys.getswitchinterval()
    sys.setswitchinterval(1.0)
    t = threading.Thread(target=count)
    try:
        t.start()
        time.sleep(0.02)
        before = counter[0]
        action()
        during = counter[0] - before
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    return during


def test_kernels_release_the_gil(layout):
    """A Python thread runs while one large sample is gathered (nogil kernels)."""
    buf = ReplayBuffer({"img": ("u1", (4, 84, 84))}, 1000, layout=layout, seed=0)
    buf.extend({"img": np.ones((1000, 4, 84, 84), np.uint8)})
    buf.sample(1000)
    assert _progress_of_other_thread_during(lambda: buf.sample(1000)) > 100


def test_gil_probe_can_fail():
    """Control: a GIL-holding action of similar length lets the other thread make no progress."""
    def busy():
        end = time.perf_counter() + 0.03
        while time.perf_counter() < end:
            pass

    assert _progress_of_other_thread_during(busy) == 0


def test_output_rings_are_per_thread(layout):
    buf = ReplayBuffer(CARTPOLE, 100, layout=layout, seed=0, ring_size=1)
    buf.extend(random_rows(buf.spec, 100, np.random.default_rng(0)))
    mine = buf.sample(16)
    kept = mine.copy()
    other = []
    t = threading.Thread(target=lambda: other.extend(buf.sample(16) for _ in range(5)))
    t.start()
    t.join()
    assert all(b is not mine for b in other)
    np.testing.assert_array_equal(mine.indices, kept.indices)
    np.testing.assert_array_equal(mine["obs"], kept["obs"])


def test_prioritized_steady_state_allocates_nothing(layout):
    buf = PrioritizedReplayBuffer(CARTPOLE, 5000, layout=layout, seed=0)
    rows = random_rows(buf.spec, 1000, np.random.default_rng(0))
    one = row(rows, 0)
    buf.extend(rows)
    buf.extend(rows)
    prios = np.linspace(0.1, 2.0, 256)
    for _ in range(3):
        buf.push(one)
        b = buf.sample(256)
        buf.update_priorities(b, prios)
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(200):
            buf.push(one)
            buf.extend(rows)
            b = buf.sample(256)
            buf.update_priorities(b, prios)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert current - base < 1024, current - base
    assert peak - base < 2048, peak - base  # one batch of float64 priorities would be 2048


@pytest.mark.parametrize("elide", [False, True])
def test_nstep_and_elided_sampling_allocate_nothing(layout, elide):
    from .test_episodes import VEC, Streams

    buf = ReplayBuffer(VEC, 4000, layout=layout, num_envs=2, n_step=3, elide_next=elide, seed=0)
    streams = Streams(VEC, 2, np.random.default_rng(0))
    buf.extend(streams.steps(2500))
    for _ in range(3):
        buf.sample(256)
        buf.sample_sequences(16, 8)
    tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(300):
            buf.sample(256)
            buf.sample_sequences(16, 8)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert current - base < 1024, current - base
    assert peak - base < 2048, peak - base  # one batch of rewards alone would be 1024


@pytest.mark.parametrize("kind", ["plain", "nstep", "elided", "per", "vector", "stats", "groups"])
def test_a_dropped_buffer_is_freed_at_once(layout, kind):
    # no reference cycle: `del buf` frees the storage without waiting for the cyclic collector
    import gc
    import weakref

    kw = {"nstep": {"n_step": 3}, "elided": {"elide_next": True}, "vector": {"num_envs": 2},
          "stats": {"stats": ["obs", "reward"]}}.get(kind, {})
    if kind == "groups":
        layout = [["obs", "action", "reward"], ["next_obs"]]
    cls = PrioritizedReplayBuffer if kind == "per" else ReplayBuffer
    enabled = gc.isenabled()
    gc.disable()
    try:
        buf = cls(CARTPOLE, 10, layout=layout, seed=0, **kw)
        rows = random_rows(buf.spec, 4, np.random.default_rng(0))
        rows["obs"][1:] = rows["next_obs"][:-1]  # a continuous stream, for elision
        rows["terminated"][:] = rows["truncated"][:] = False
        buf.extend(rows)
        if kind != "vector":
            buf.push(row(rows, 3) | {"obs": rows["next_obs"][3]})
        buf.sample(2)
        ref, store = weakref.ref(buf), weakref.ref(buf.storage)
        del buf
        assert ref() is None
        assert store() is None  # no part keeps the rows alive either (episodes held the writer)
    finally:
        if enabled:
            gc.enable()
