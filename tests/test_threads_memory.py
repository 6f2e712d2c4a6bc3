"""Steady state allocates nothing; one writer and concurrent samplers never see a torn row."""

from __future__ import annotations

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


def hammer(buf, n_samplers: int = 2, min_sampled: int = 0, min_written: int = 0,
           until_torn: bool = False, cap_s: float = 300) -> tuple[int, int]:
    """A writer pushes and extends rows that carry their id in every field; samplers check them
    until ``min_sampled`` rows were sampled while the writer wrote ``min_written`` rows (with
    ``until_torn``: until a torn row was seen). Returns ``(torn, sampled)``. ``cap_s`` only
    turns a hang into a failure: the threads stop on what they did, not after a time."""
    stop = threading.Event()
    torn, sampled, written = [0] * n_samplers, [0] * n_samplers, [0]
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
                written[0] = k - 200
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

    def done():
        if until_torn:
            return sum(torn) > 0
        return sum(sampled) >= min_sampled and written[0] >= min_written

    threads = [threading.Thread(target=writer)] + [
        threading.Thread(target=sampler, args=(i,)) for i in range(n_samplers)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + cap_s
    try:
        while not done() and not errors and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    return sum(torn), sum(sampled)


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_no_torn_rows_with_one_writer_and_two_samplers(layout, cls):
    buf = cls(SEQ_SPEC, 200, layout=layout, seed=0)
    buf.extend(seq_rows(0, 200))
    buf.sample(128)  # compile (cold cache) or load the kernel before the threads start
    # without the lock a torn row shows within some 30,000 rows written (the control below):
    # a thousand laps of the 200-row ring and a million rows sampled meanwhile
    torn, sampled = hammer(buf, min_sampled=1_000_000, min_written=200_000)
    assert sampled >= 1_000_000
    assert torn == 0


class NoLock:
    """A lock that excludes nothing (the control below)."""

    def acquire(self, *a):
        return True

    def release(self):
        pass

    __enter__ = acquire

    def __exit__(self, *exc):
        pass


def test_torn_rows_are_detected_without_the_lock():
    """Control: with the lock replaced by a no-op, the same hammer does see torn rows,
    so the test above can fail."""
    buf = ReplayBuffer(SEQ_SPEC, 200, layout="soa", seed=0)
    buf.extend(seq_rows(0, 200))
    buf.sample(128)
    buf._gate.lock = buf._lock = NoLock()
    torn, _ = hammer(buf, n_samplers=1, until_torn=True)
    assert torn > 0


def _released_mid_copy(out, action, attempts: int | None = None, cap_s: float = 60) -> bool:
    """Whether another Python thread ran while ``action`` was copying into ``out``.

    ``action`` fills ``out`` (zeroed before each attempt) with ones, first row first and last
    row last, in one native call. A watching thread reads ``out``'s first and last byte while
    the attempt is under way: the first written and the last not yet is a moment inside that
    call, and the watcher can only have run Python then if the call had released the GIL. A
    call that holds the GIL can never be seen so, however the threads are scheduled. The
    attempts repeat until the watcher saw one (a loaded machine may not run it in time), at
    most ``attempts`` times or for ``cap_s`` seconds.
    """
    state = {"gen": 0, "armed": False}
    armed, stop, seen = threading.Event(), threading.Event(), threading.Event()
    first = (0,) * out.ndim
    last = (-1,) * out.ndim

    def watch():
        while True:
            armed.wait()  # asleep between attempts
            if stop.is_set():
                return
            gen, on = state["gen"], state["armed"]
            a, b = out[first], out[last]
            if on and a == 1 and b == 0 and state["armed"] and state["gen"] == gen:
                seen.set()
                return
            time.sleep(0)  # hand the GIL back: the main thread wants it after the call

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    deadline = time.monotonic() + cap_s
    n = 0
    try:
        while not seen.is_set() and time.monotonic() < deadline and (attempts is None or n < attempts):
            out[...] = 0
            state["gen"] += 1
            state["armed"] = True
            armed.set()
            action()
            state["armed"] = False
            armed.clear()
            assert out[first] == 1 and out[last] == 1, "the action did not fill out"
            n += 1
    finally:
        stop.set()
        armed.set()
        t.join(60)
    return seen.is_set()


def test_kernels_release_the_gil(layout):
    """A Python thread runs while a large sample is being gathered (nogil kernels)."""
    buf = ReplayBuffer({"img": ("u1", (4, 84, 84))}, 1000, layout=layout, seed=0, ring_size=1)
    buf.extend({"img": np.ones((1000, 4, 84, 84), np.uint8)})
    out = buf.sample(1000)["img"]  # ring_size=1: every sample of 1000 rows gathers into it
    assert _released_mid_copy(out, lambda: buf.sample(1000))


def test_gil_probe_can_fail():
    """Control: the same copy compiled without nogil is never seen mid-copy; with nogil it is."""
    from numba import njit

    def fill(src, dst):
        for i in range(dst.shape[0]):
            for j in range(dst.shape[1]):
                dst[i, j] = src[i, j]

    holding, releasing = njit(nogil=False)(fill), njit(nogil=True)(fill)
    src = np.ones((1000, 4 * 84 * 84), np.uint8)
    out = np.zeros_like(src)
    holding(src, out)
    releasing(src, out)  # compiled before the attempts
    assert not _released_mid_copy(out, lambda: holding(src, out), attempts=200)
    assert _released_mid_copy(out, lambda: releasing(src, out))


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
