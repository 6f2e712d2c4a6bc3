"""SharedReplayBuffer.column / column_stats: the rows every shard holds, read while writer
processes write; rows a writer overwrites during a pass are left out of the statistics."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

import tfdata.replay.columns as columns
from tfdata import ReplayBuffer
from tfdata.errors import SharedBufferError, SpecError
from tfdata.shared import SharedReplayBuffer, SharedWriter

from . import naive
from .test_columns import close
from .test_shared_nstep import SPEC, id_rows

FORK = mp.get_context("fork")
GROUPS = (("obs", "reward"), ("id", "terminated"))
LAYOUTS = ["aos", "soa", GROUPS]
CAP = 50


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    return tmp_path


def three_shards(layout):
    """Shard 0 wrapped (130 rows written, the last 50 held), shard 1 20 rows, shard 2 none."""
    buf = SharedReplayBuffer(SPEC, 3 * CAP, num_writers=3, layout=layout)
    with SharedWriter(buf.name, 0) as w0, SharedWriter(buf.name, 1) as w1:
        w0.extend(id_rows(np.arange(130)))
        w1.extend(id_rows(np.arange(20) + 1000))
    return buf


HELD = np.r_[np.arange(80, 130), np.arange(1000, 1020)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=["aos", "soa", "groups"])
def test_column_and_stats_over_the_shards(layout, shm_dir):
    with three_shards(layout) as buf:
        col = buf.column("id")
        np.testing.assert_array_equal(np.asarray(col), HELD)  # shard by shard, oldest first
        assert len(col) == len(buf) == 70 and col.shape == (70,)
        assert [len(s) for s in col.segments] == [20, 30, 20]  # shard 0 wrapped: two views
        with pytest.raises(ValueError):
            col.segments[0][0] = 1  # read-only
        rows = id_rows(HELD)
        for name in SPEC.names:
            np.testing.assert_array_equal(np.asarray(buf.column(name)), rows[name])
            got = buf.column_stats(name)
            n, want = naive.column_stats_naive(rows[name])
            assert got.count == n == 70
            close(np.stack([got.mean.reshape(-1), got.var.reshape(-1), got.std.reshape(-1),
                            got.min.reshape(-1), got.max.reshape(-1)]), want, name)


def test_stats_are_the_same_bits_on_every_layout_and_as_a_replay_buffer(shm_dir):
    outs = []
    for layout in LAYOUTS:
        with three_shards(layout) as buf:
            outs.append([buf.column_stats(n) for n in ("obs", "reward", "terminated")])
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            np.testing.assert_array_equal(a.mean, b.mean)
            np.testing.assert_array_equal(a.var, b.var)
    # one shard: the rows in the same slots as a ReplayBuffer's, the same bits
    for layout in LAYOUTS:
        rb = ReplayBuffer(SPEC, CAP, layout=layout)
        rb.extend(id_rows(np.arange(73) * 1.37))
        with SharedReplayBuffer(SPEC, CAP, layout=layout) as buf:
            with SharedWriter(buf.name, 0) as w:
                w.extend(id_rows(np.arange(73) * 1.37))
            for name in ("obs", "reward"):
                a, b = buf.column_stats(name), rb.column_stats(name)
                assert a.count == b.count == CAP
                for k in ("mean", "var", "min", "max"):
                    np.testing.assert_array_equal(getattr(a, k), getattr(b, k), err_msg=name)


def test_empty_buffer_and_refusals(shm_dir):
    with SharedReplayBuffer(SPEC, 2 * CAP, num_writers=2) as buf:
        assert len(buf.column("obs")) == 0 and buf.column("obs").segments == ()
        st = buf.column_stats("reward")
        assert st.count == 0 and np.isnan(st.mean)
        with pytest.raises(SpecError, match="nope"):
            buf.column("nope")
        with pytest.raises(SpecError, match="nope"):
            buf.column_stats("nope")
        with pytest.raises(NotImplementedError, match="writer processes"):
            buf.update_field("reward", [0], [1.0])
    with pytest.raises(NotImplementedError, match="stats="):
        SharedReplayBuffer(SPEC, CAP, stats=["reward"])
    with SharedReplayBuffer(SPEC, 8, mode="fifo") as fifo:
        with pytest.raises(SharedBufferError, match="FIFO"):
            fifo.column("id")
        with pytest.raises(SharedBufferError, match="FIFO"):
            fifo.column_stats("id")


def test_rows_overwritten_during_a_pass_are_left_out(shm_dir, monkeypatch):
    """A writer overwrites 10 of the oldest rows during the first pass: the pass is repeated
    over the rows then held (60..109) without twice as many of the oldest (rows 80..109)."""
    real = columns.scan_ranges
    calls = []
    with SharedReplayBuffer(SPEC, CAP) as buf, SharedWriter(buf.name, 0) as w:
        w.extend(id_rows(np.arange(2 * CAP)))  # full: rows 50..99 held

        def racing(field, view, ranges):
            calls.append(ranges.copy())
            if len(calls) == 1:
                w.extend(id_rows(np.arange(2 * CAP, 2 * CAP + 10)))  # rows 50..59 overwritten
            return real(field, view, ranges)

        monkeypatch.setattr(columns, "scan_ranges", racing)
        got = buf.column_stats("id")
        assert len(calls) == 2
        np.testing.assert_array_equal(calls[0], [[0, CAP]])
        kept = np.arange(80, 110)  # held after the first pass: 60..109, the 20 oldest left out
        np.testing.assert_array_equal(calls[1], [[0, 10], [30, CAP]])  # slot of row i: i % 50
        n, want = naive.column_stats_naive(kept)
        assert got.count == n == 30
        assert got.min[()] == 80 and got.max[()] == 109 and got.mean[()] == want[0, 0]

        def lapping(field, view, ranges):  # a writer that laps the ring during every pass
            w.extend(id_rows(np.arange(CAP) + 10 ** 6 + 1000 * len(calls)))
            calls.append(ranges)
            return real(field, view, ranges)

        monkeypatch.setattr(columns, "scan_ranges", lapping)
        calls.clear()
        with pytest.raises(SharedBufferError, match="faster than 16 passes"):
            buf.column_stats("id")
        assert len(calls) == 16


def _writer(name, allowed, stop, errors):
    """Extends 8 rows at a time, never past ``allowed[0]`` rows (the learner's pace, not the
    machine's)."""
    try:
        with SharedWriter(name, 0) as w:
            i = 0
            while not stop.is_set():
                if i + 8 <= allowed[0]:
                    w.extend(id_rows(np.arange(i, i + 8)))
                    i += 8
                else:
                    time.sleep(0)
    except BaseException as exc:
        errors.put(repr(exc))


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_stats_count_whole_consecutive_rows_while_a_process_writes(layout, shm_dir):
    """A writer process laps a 4096-row shard continually, up to W rows during each call: each
    result is the statistics of consecutive whole rows (ids, and rewards equal to them, from
    min to max, none torn). The rule bounds the count whatever the machine's speed: a pass
    leaves out the rows in flight (8 at most) and twice the rows begun during the pass before
    (W in all: 2 * W), and a pass that fails has more than twice as many begun as the one
    before, so with W rows in all the 16 passes never run out."""
    cap, W = 4096, 512
    errors, stop = FORK.Queue(), FORK.Event()
    allowed = FORK.RawArray("q", [cap])
    with SharedReplayBuffer(SPEC, cap, layout=layout) as buf:
        proc = FORK.Process(target=_writer, args=(buf.name, allowed, stop, errors))
        proc.start()
        try:
            deadline = time.monotonic() + 60
            while len(buf) < cap and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(buf) == cap, errors.get() if not errors.empty() else "no rows"
            calls = raced = 0
            deadline = time.monotonic() + 300
            while calls < 400 or (raced < 3 and time.monotonic() < deadline):
                stats = []
                for name in ("id", "reward"):
                    allowed[0] = buf.writers()[0]["published"] + W  # W more during this call
                    stats.append(buf.column_stats(name))
                for st in stats:
                    lo, hi = int(st.min[()]), int(st.max[()])
                    assert hi - lo + 1 == st.count, (lo, hi, st.count)  # consecutive, no torn row
                    assert st.mean[()] == pytest.approx((lo + hi) / 2, rel=1e-12)
                    assert cap - 2 * W - 8 <= st.count <= cap
                    raced += st.count < cap - 8  # a pass repeated: the writer overwrote rows
                calls += 2
            assert raced >= 3, "no pass was repeated: the writer did not race the reader"
        finally:
            stop.set()
            proc.join(30)
        assert errors.empty(), errors.get()
