"""Every documented wait of a SharedReplayBuffer honours its timeout from the very first call,
before any row exists: the call waits for a writer process that starts late and returns its
rows, or raises TimeoutError once the timeout has passed (never "empty buffer" at once), and
a timed-out call leaves the buffer working. No assertion on speed: the writer starts only when
told, well after the call began; the only time asserted is the lower bound a timeout sets."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

from tfdata import RateLimiter
from tfdata.shared import SharedReplayBuffer, SharedWriter

FORK = mp.get_context("fork")
SPEC = {"x": "i8", "terminated": "?", "truncated": "?"}
ROWS = 8  # the writer's rows; every call below needs 4 (sequences: 2 slices of 3)


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    return tmp_path


def _late_writer(name, go, stop, errors):
    """Attaches and writes ROWS rows only once told (then 0.3 s later), then stays attached
    until stopped (a limiter's wait ends early when every writer is gone)."""
    try:
        go.wait()
        time.sleep(0.3)  # the learner's call is already waiting
        with SharedWriter(name, 0, timeout=60) as w:
            for i in range(ROWS):
                w.push({"x": 100 + i, "terminated": False, "truncated": False})
            stop.wait(60)
    except BaseException as exc:
        errors.put(repr(exc))


def _limiter(timeout):
    return RateLimiter(1.0, 4, 8, timeout=timeout)


# (name, buffer options given the timeout, the call given the timeout)
WAITS = [
    ("exactly_k sample", lambda t: dict(sampler="exactly_k", timeout=t),
     lambda buf, t: buf.sample(4)["x"]),
    ("exactly_k sample of some fields", lambda t: dict(sampler="exactly_k", timeout=t),
     lambda buf, t: buf.sample(4, fields=["x"])["x"]),
    ("exactly_k sample, replays=3, drop", lambda t: dict(sampler="exactly_k", timeout=t, replays=3,
                                                         policy="drop"),
     lambda buf, t: buf.sample(4)["x"]),
    ("limiter sample", lambda t: dict(rate_limiter=_limiter(t)),
     lambda buf, t: buf.sample(4)["x"]),
    ("min-size limiter sample", lambda t: dict(rate_limiter=RateLimiter.min_size(4, timeout=t)),
     lambda buf, t: buf.sample(4)["x"]),
    ("limiter without_replacement sample",
     lambda t: dict(sampler="without_replacement", rate_limiter=_limiter(t)),
     lambda buf, t: buf.sample(4)["x"]),
    ("limiter prioritized sample", lambda t: dict(prioritized=True, rate_limiter=_limiter(t)),
     lambda buf, t: buf.sample(4)["x"]),
    ("limiter exactly_k sample",
     lambda t: dict(sampler="exactly_k", timeout=t, rate_limiter=_limiter(t)),
     lambda buf, t: buf.sample(4)["x"]),
    ("limiter sample_sequences", lambda t: dict(rate_limiter=_limiter(t)),
     lambda buf, t: buf.sample_sequences(2, 3)["x"]),
    ("fifo get_batch", lambda t: dict(mode="fifo"),
     lambda buf, t: buf.get_batch(4, timeout=t)["x"]),
    ("fifo get_batch partial", lambda t: dict(mode="fifo"),
     lambda buf, t: buf.get_batch(4, timeout=t, partial=True)["x"]),
    ("fifo batches", lambda t: dict(mode="fifo"),
     lambda buf, t: next(iter(buf.batches(4, timeout=t)))["x"]),
]
IDS = [w[0] for w in WAITS]


def _run(options, call, timeout, shm_dir, *, time_out: bool):
    errors, go, stop = FORK.Queue(), FORK.Event(), FORK.Event()
    with SharedReplayBuffer(SPEC, 16, seed=1, **options(timeout)) as buf:
        proc = FORK.Process(target=_late_writer, args=(buf.name, go, stop, errors))
        proc.start()
        try:
            assert len(buf) == 0
            if time_out:  # the writer starts only after the call gave up
                t0 = time.monotonic()
                with pytest.raises(TimeoutError):
                    call(buf, timeout)
                assert time.monotonic() - t0 >= timeout  # waited out, not refused at once
                assert len(buf) == 0
                go.set()
                deadline = time.monotonic() + 60
                while buf.writers()[0]["published"] < ROWS and time.monotonic() < deadline:
                    time.sleep(0.01)
                assert buf.writers()[0]["published"] == ROWS, errors.get() if not errors.empty() else ""
            else:  # the first call starts before the writer does
                go.set()
            got = call(buf, timeout)
            assert set(got.ravel().tolist()) <= set(range(100, 100 + ROWS))
        finally:
            go.set()
            stop.set()
            proc.join(60)
        assert errors.empty(), errors.get()


@pytest.mark.parametrize("name,options,call", WAITS, ids=IDS)
def test_the_first_call_waits_for_a_writer_that_starts_late(name, options, call, shm_dir):
    _run(options, call, 60.0, shm_dir, time_out=False)


@pytest.mark.parametrize("name,options,call", WAITS, ids=IDS)
def test_the_first_call_times_out_before_any_row_then_the_buffer_works(name, options, call,
                                                                       shm_dir):
    _run(options, call, 0.5, shm_dir, time_out=True)


# -- a writer's first call ---------------------------------------------------------------------
def _big_first_extend(name, timeout, out):
    """One extend of 24 rows into a shard of 16 slots: it writes what fits and waits for the
    learner, which has taken nothing yet."""
    try:
        with SharedWriter(name, 0, timeout=timeout) as w:
            t0 = time.monotonic()
            try:
                w.extend({"x": 100 + np.arange(24), "terminated": np.zeros(24, bool),
                          "truncated": np.zeros(24, bool)})
                out.put(("ok", time.monotonic() - t0, w.published))
            except TimeoutError:
                out.put(("timeout", time.monotonic() - t0, w.published))
    except BaseException as exc:
        out.put(("error", repr(exc), 0))


@pytest.mark.parametrize("options", [dict(mode="fifo"), dict(sampler="exactly_k", timeout=60.0)],
                         ids=["fifo block", "exactly_k block"])
@pytest.mark.parametrize("time_out", [False, True], ids=["learner starts late", "times out"])
def test_a_writers_first_extend_waits_for_a_learner_that_starts_late(options, time_out, shm_dir):
    out = FORK.Queue()
    timeout = 0.5 if time_out else 60.0
    with SharedReplayBuffer(SPEC, 16, seed=1, **options) as buf:
        proc = FORK.Process(target=_big_first_extend, args=(buf.name, timeout, out))
        proc.start()
        deadline = time.monotonic() + 60
        while buf.writers()[0]["published"] < 16 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert buf.writers()[0]["published"] == 16  # the shard is full: the writer waits
        if time_out:
            kind, waited, published = out.get(timeout=60)
            assert (kind, published) == ("timeout", 16) and waited >= timeout
        else:
            time.sleep(0.3)  # the writer is waiting for room
            got = [buf.get_batch(8, timeout=60)["x"] if buf.mode == "fifo" else buf.sample(8)["x"]
                   for _ in range(3)]
            kind, waited, published = out.get(timeout=60)
            assert (kind, published) == ("ok", 24)
            assert set(np.concatenate(got).tolist()) <= set(range(100, 124))
        proc.join(60)
        assert proc.exitcode == 0
