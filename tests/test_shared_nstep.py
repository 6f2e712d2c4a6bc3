"""SharedReplayBuffer(n_step=): n-step transitions over writer streams (one per shard).

The reference is ReplayBuffer(n_step=) (PrioritizedReplayBuffer with prioritized=True): with one
writer the batches are the same bit for bit. With real writer processes overwriting their rings
while the learner samples, every window is one writer's consecutive rows within one episode:
a window read while a writer overwrote it would mix rows of two laps and fail the check."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

from tfdata import PrioritizedReplayBuffer, ReplayBuffer, Spec, SpecError
from tfdata.shared import SharedReplayBuffer, SharedWriter

from .conftest import assert_batches_equal, row, sample_until_redraw

FORK = mp.get_context("fork")
# every field is a function of the row's id: a window can be recomputed from its first id
SPEC = Spec({"id": "i8", "obs": ("f8", (4,)), "reward": "f8", "next_obs": ("f8", (4,)),
             "terminated": "?", "truncated": "?"})
EPISODE = 7  # rows with id % 7 == 6 end an episode (terminated); id % 11 == 10 are truncated


def id_rows(ids) -> dict:
    ids = np.asarray(ids, np.int64)
    term = ids % EPISODE == EPISODE - 1
    return {"id": ids, "obs": np.repeat(ids[:, None], 4, 1).astype(np.float64),
            "reward": ids.astype(np.float64), "next_obs": np.repeat(ids[:, None] + 1, 4, 1).astype(np.float64),
            "terminated": term, "truncated": (ids % 11 == 10) & ~term}


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("cap", [5, 32])
def test_one_writer_gives_the_single_process_windows(layout, prioritized, cap, shm_dir):
    kw = dict(n_step=3, gamma=0.9)
    if prioritized:
        ref = PrioritizedReplayBuffer(SPEC, cap, layout=layout, seed=2, alpha=0.6, **kw)
    else:
        ref = ReplayBuffer(SPEC, cap, layout=layout, seed=2, **kw)
    rng = np.random.default_rng(cap)
    start = 0
    with SharedReplayBuffer(SPEC, cap, layout=layout, seed=2, prioritized=prioritized, **kw) as buf, \
            SharedWriter(buf.name, 0) as w:
        for step in range(8):
            m = int(rng.integers(1, cap + 1))  # a fold skips rows lapped before it (see SharedReplayBuffer)
            rows = id_rows(np.arange(start, start + m))
            start += m
            for i in range(m):
                ref.push(row(rows, i))
            w.extend(rows)
            for b in (1, min(4, len(ref))):
                got, want = buf.sample(b, copy=True), ref.sample(b, copy=True)
                assert_batches_equal(dict(got), dict(want))
                np.testing.assert_array_equal(got.indices, want.indices)
                np.testing.assert_array_equal(got.discounts, want.discounts)
                if prioritized:
                    np.testing.assert_array_equal(got.weights, want.weights)
                    p = rng.random(b) + 0.5
                    buf.update_priorities(got, p)
                    ref.update_priorities(want, p)


def test_options_are_checked_before_the_region_exists(shm_dir):
    with pytest.raises(SpecError, match="n_step"):
        SharedReplayBuffer({"x": "f4"}, 8, n_step=3)
    with pytest.raises(ValueError, match="gamma"):
        SharedReplayBuffer(SPEC, 8, n_step=3, gamma=1.5)
    with pytest.raises(ValueError, match="n_step=3 with mode=.fifo.: a FIFO delivers the rows as written"):
        SharedReplayBuffer(SPEC, 8, n_step=3, mode="fifo")
    assert list(shm_dir.iterdir()) == []


def check_windows(batch, n: int, gamma: float, shards: int, cap: int) -> None:
    """Every window is consecutive ids of one writer within one episode, recomputed from its
    first id; its length k agrees with the discount."""
    ids = np.asarray(batch["id"])
    disc = np.asarray(batch.discounts, np.float64)
    k = np.rint(np.log(disc) / np.log(gamma)).astype(np.int64)
    assert ((k >= 1) & (k <= n)).all()
    for i, r in enumerate(ids):
        ks = int(k[i])
        window = np.arange(r, r + ks)
        want = sum(gamma ** j * float(x) for j, x in enumerate(window))
        assert batch["reward"][i] == pytest.approx(want, rel=1e-12), (r, ks)
        last = window[-1]
        ends = (window % EPISODE == EPISODE - 1) | (window % 11 == 10)
        assert not ends[:-1].any(), (r, ks)  # no window crosses an episode end
        assert batch["terminated"][i] == (last % EPISODE == EPISODE - 1)
        np.testing.assert_array_equal(batch["next_obs"][i], np.full(4, last + 1.0))
        np.testing.assert_array_equal(batch["obs"][i], np.full(4, float(r)))


def _writer(name, shard, stop, errors):
    try:
        with SharedWriter(name, shard) as w:
            i = 0
            while not stop.is_set():
                w.extend(id_rows(np.arange(i, i + 16) + 1_000_000 * shard))
                i += 16
    except BaseException as exc:
        errors.put(f"shard {shard}: {exc!r}")


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("prioritized", [False, True])
def test_windows_stay_whole_while_writer_processes_overwrite(layout, prioritized, shm_dir):
    errors, stop = FORK.Queue(), FORK.Event()
    n, gamma, cap = 4, 0.5, 64
    with SharedReplayBuffer(SPEC, 2 * cap, num_writers=2, layout=layout, seed=1, n_step=n,
                            gamma=gamma, prioritized=prioritized) as buf:
        procs = [FORK.Process(target=_writer, args=(buf.name, s, stop, errors)) for s in range(2)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 60
        while len(buf) < 2 * cap and time.monotonic() < deadline:
            time.sleep(0.01)
        sampled = sample_until_redraw(buf, lambda b: check_windows(b, n, gamma, 2, cap))
        stop.set()
        for p in procs:
            p.join(30)
        assert errors.empty(), errors.get()
        redraws = buf.redraws
    assert sampled >= 640  # the checks are slow Python; the point is the race (next line)
    assert redraws > 0, "no window was ever redrawn: the writers did not race the reader"


# -- sequences ------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("policy", ["mask", "reject"])
def test_one_writer_gives_the_single_process_slices(layout, prioritized, policy, shm_dir):
    cap = 24
    if prioritized:
        ref = PrioritizedReplayBuffer(SPEC, cap, layout=layout, seed=4, alpha=0.6)
    else:
        ref = ReplayBuffer(SPEC, cap, layout=layout, seed=4)
    rng = np.random.default_rng(1)
    start = 0
    with SharedReplayBuffer(SPEC, cap, layout=layout, seed=4, prioritized=prioritized) as buf, \
            SharedWriter(buf.name, 0) as w:
        for step in range(6):
            m = int(rng.integers(1, cap + 1))
            rows = id_rows(np.arange(start, start + m))
            start += m
            for i in range(m):
                ref.push(row(rows, i))
            w.extend(rows)
            if len(ref) < 4:
                continue
            got, want = buf.sample_sequences(3, 4, policy=policy, copy=True), \
                ref.sample_sequences(3, 4, policy=policy, copy=True)
            assert_batches_equal(dict(got), dict(want))
            np.testing.assert_array_equal(got.indices, want.indices)
            np.testing.assert_array_equal(got.mask, want.mask)
            if prioritized:
                np.testing.assert_array_equal(got.weights, want.weights)
                p = rng.random(3) + 0.5
                buf.update_priorities(got, p)
                ref.update_priorities(want, p)


def test_sequence_refusals(shm_dir):
    with SharedReplayBuffer(SPEC, 8, seed=0) as buf, SharedWriter(buf.name, 0) as w:
        with pytest.raises(ValueError, match="empty"):
            buf.sample_sequences(1, 2)
        w.extend(id_rows(np.arange(5)))  # ids 0..5: an episode of 7 rows never fits in 5
        counter = buf.sampler.counter
        with pytest.raises(ValueError, match="slice"):
            buf.sample_sequences(2, 6, policy="reject")
        assert buf.sampler.counter == counter  # a refused sample consumes no randomness
        with pytest.raises(ValueError, match="length"):
            buf.sample_sequences(1, 9)
        with pytest.raises(ValueError, match="policy"):
            buf.sample_sequences(1, 2, policy="pad")
    with SharedReplayBuffer({"x": "f4"}, 8) as flat:
        with pytest.raises(SpecError, match="terminated"):
            flat.sample_sequences(1, 2)


def check_slices(batch) -> None:
    """Every slice is consecutive ids of one writer, within one episode, then masked repeats."""
    ids, mask = np.asarray(batch["id"]), np.asarray(batch.mask)
    for b in range(ids.shape[0]):
        k = int(mask[b].sum())
        assert mask[b, :k].all() and not mask[b, k:].any()
        window = ids[b, :k]
        np.testing.assert_array_equal(window, window[0] + np.arange(k))  # one stream, no gap
        ends = (window % EPISODE == EPISODE - 1) | (window % 11 == 10)
        assert not ends[:-1].any()  # within one episode
        assert (ids[b, k:] == window[-1]).all()  # the rest repeat the last valid row
        np.testing.assert_array_equal(batch["reward"][b], ids[b].astype(np.float64))  # rows whole


@pytest.mark.parametrize("prioritized", [False, True])
def test_slices_stay_whole_while_writer_processes_overwrite(prioritized, shm_dir):
    errors, stop = FORK.Queue(), FORK.Event()
    cap = 64
    with SharedReplayBuffer(SPEC, 2 * cap, num_writers=2, seed=1, prioritized=prioritized) as buf:
        procs = [FORK.Process(target=_writer, args=(buf.name, s, stop, errors)) for s in range(2)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 60
        while len(buf) < 2 * cap and time.monotonic() < deadline:
            time.sleep(0.01)
        sampled = 0
        deadline = time.monotonic() + 300  # a cap: until 320 slices and a redraw, not for a time
        while (sampled < 320 or buf.redraws == 0) and time.monotonic() < deadline:
            for policy in ("mask", "reject"):
                check_slices(buf.sample_sequences(16, 5, policy=policy))
                sampled += 16
        stop.set()
        for p in procs:
            p.join(30)
        assert errors.empty(), errors.get()
        redraws = buf.redraws
    assert sampled >= 320
    assert redraws > 0, "no slice was ever redrawn: the writers did not race the reader"
