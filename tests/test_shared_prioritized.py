"""SharedReplayBuffer(prioritized=True): the learner's priority trees over rows that writer
processes publish, through the same sampler contract as PrioritizedReplayBuffer.

The reference is the single-process buffer: with one writer, the same rows, seed and priority
updates give the same batches, weights and priorities bit for bit. With many real writer
processes overwriting their rings, every sampled row is whole and weights follow the trees."""

from __future__ import annotations

import multiprocessing as mp
import time

import numpy as np
import pytest

from tfdata import PrioritizedReplayBuffer, Spec
from tfdata.errors import MemoryBudgetError, SharedBufferError, SpecError
from tfdata.shared import SharedReplayBuffer, SharedWriter

from .conftest import CARTPOLE, assert_batches_equal, random_rows, row
from .test_shared import ID_SPEC, consistent, id_rows

SPEC = Spec(CARTPOLE)

FORK = mp.get_context("fork")


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("cap", [1, 7, 33])
def test_one_writer_samples_as_a_prioritized_buffer(layout, cap, shm_dir):
    """Rows published (by extend and push, wrapping the ring), then sampled and reprioritised:
    batches, weights, every priority and the beta schedule equal those of the single-process
    buffer that was given the same rows one push at a time."""
    rng = np.random.default_rng(cap)
    kw = dict(alpha=0.7, beta=0.4, beta_final=1.0, beta_steps=9)
    ref = PrioritizedReplayBuffer(CARTPOLE, cap, layout=layout, seed=5, **kw)
    with SharedReplayBuffer(CARTPOLE, cap, layout=layout, seed=5, prioritized=True, **kw) as buf, \
            SharedWriter(buf.name, 0) as w:
        for step in range(8):
            # at most a ring's worth between samples: a fold skips rows lapped before it
            rows = random_rows(SPEC, int(rng.integers(1, cap + 1)), rng)
            for i in range(len(rows["action"])):  # a fold gives each row what a push gives it
                ref.push(row(rows, i))
            w.extend(rows)
            one = row(random_rows(SPEC, 1, rng), 0)
            ref.push(one)
            w.push(one)
            for b in (1, min(5, len(ref))):
                got, want = buf.sample(b, copy=True), ref.sample(b, copy=True)
                assert_batches_equal(dict(got), dict(want))
                np.testing.assert_array_equal(got.indices, want.indices)
                np.testing.assert_array_equal(got.weights, want.weights)
                # versions count the folds that wrote a slot, not the write calls: equal as
                # "overwritten since?" detectors, not as numbers (see the next test)
                np.testing.assert_array_equal(got.versions, buf.sampler.version[got.indices])
                p = rng.random(b) * 3
                buf.update_priorities(got, p)
                ref.update_priorities(want, p)
            np.testing.assert_array_equal(buf.priorities()[:len(ref)], ref.priorities())
            assert buf.beta == ref.beta


def test_an_update_for_an_overwritten_row_is_refused(shm_dir):
    with SharedReplayBuffer(CARTPOLE, 4, seed=0, prioritized=True) as buf, SharedWriter(buf.name, 0) as w:
        rng = np.random.default_rng(0)
        w.extend(random_rows(SPEC, 4, rng))
        b = buf.sample(4)
        w.extend(random_rows(SPEC, 4, rng))  # every slot overwritten
        buf.sample(1)  # folds the new rows in
        before = buf.priorities()
        with pytest.raises(ValueError, match="stale"):
            buf.update_priorities(b, np.ones(4))
        np.testing.assert_array_equal(buf.priorities(), before)
        with pytest.raises(ValueError, match="priorit"):
            buf.update_priorities(buf.sample(2), [np.nan, 1.0])
        with pytest.raises(SpecError):
            buf.update_priorities(np.zeros((2, 2), np.int64), [1.0, 1.0])


@pytest.mark.parametrize("priorities,error,message", [
    (np.array([1.0, np.nan]), ValueError, r"finite and >= 0, got nan at position 1"),
    (np.array([-0.5, 1.0]), ValueError, r"got -0.5 at position 0"),
    (np.array([1e300, 1.0]), ValueError, r"priority 1e\+300 at position 0"),
    (np.array([1.0, 1.0, 1.0]), SpecError, r"expected priorities of shape \(2,\), got shape \(3,\)"),
    (np.array([[1.0, 1.0]]), SpecError, r"expected priorities of shape \(2,\), got shape \(1, 2\)"),
    ([1.0, 1.0, 1.0], SpecError, r"expected priorities of shape \(2,\), got shape \(3,\)"),
    (np.array(["a", "b"]), SpecError, r"priorities must be numbers"),
])
@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_bad_updates_of_a_batch_change_nothing(shm_dir, layout, priorities, error, message):
    """A batch as sampled takes the update's short path (float64 priorities of its shape) or the
    checked one (anything else): the single-process buffer's refusals, word for word, and
    nothing changed."""
    with SharedReplayBuffer(CARTPOLE, 8, layout=layout, seed=0, prioritized=True) as buf, \
            SharedWriter(buf.name, 0) as w:
        w.extend(random_rows(SPEC, 5, np.random.default_rng(0)))
        batch = buf.sample(2)
        first = buf.priorities()
        buf.update_priorities(batch, np.array([3.0, 0.5]))  # the short path writes
        assert not np.array_equal(buf.priorities(), first)
        batch = buf.sample(2)
        before = buf.priorities()
        with pytest.raises(error, match=message):
            buf.update_priorities(batch, priorities)
        np.testing.assert_array_equal(buf.priorities(), before)


def test_settings_are_checked_before_the_region_exists(shm_dir):
    with pytest.raises(ValueError, match="FIFO"):
        SharedReplayBuffer(CARTPOLE, 8, mode="fifo", prioritized=True)
    with pytest.raises(ValueError, match="alpha"):
        SharedReplayBuffer(CARTPOLE, 8, prioritized=True, alpha=-1.0)
    with pytest.raises(MemoryBudgetError):
        SharedReplayBuffer(CARTPOLE, 1 << 16, prioritized=True, memory_budget="1MB")
    assert list(shm_dir.iterdir()) == []
    with SharedReplayBuffer(CARTPOLE, 8) as plain:
        with pytest.raises(SharedBufferError, match="prioritized"):
            plain.update_priorities([0], [1.0])


def test_budget_counts_trees_and_rings(shm_dir):
    with SharedReplayBuffer(CARTPOLE, 1024, prioritized=True, memory_budget="200KB") as buf, \
            SharedWriter(buf.name, 0) as w:
        parts = buf.nbytes_parts
        # float32 leaves (one block of alignment slack), float64 sums and float32 min/max over
        # the 64 blocks of 16 leaves, and the update's float32 scratch, one value per block
        assert parts["shared_region"] == buf.nbytes
        assert parts["trees"] == 4 * (1024 + 16) + 2 * 64 * 16 + 4 * 64
        w.extend(random_rows(SPEC, 1024, np.random.default_rng(0)))
        buf.sample(16)
        assert buf.nbytes_parts["output_rings"] > 0
        with pytest.raises(MemoryBudgetError):
            buf.sample(1000)  # its ring would pass the budget: refused before allocating
        assert 1000 not in buf._local.rings


def _writer(name, shard, stop, errors):
    try:
        with SharedWriter(name, shard) as w:
            i = 0
            while not stop.is_set():
                w.extend(id_rows(np.arange(i, i + 64) + 1_000_000 * shard))
                i += 64
    except BaseException as exc:
        errors.put(f"shard {shard}: {exc!r}")


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_writer_processes_overwrite_while_the_learner_samples(layout, shm_dir):
    """Two real processes overwrite their rings flat out while the learner samples, updates
    priorities and folds: rows are whole, weights are (p_min/p)**beta of the trees drawn from,
    and the only refusal is of rows overwritten since their sample."""
    errors, stop = FORK.Queue(), FORK.Event()
    with SharedReplayBuffer(ID_SPEC, 2 * 256, num_writers=2, layout=layout, seed=1,
                            prioritized=True, alpha=1.0, beta=0.5) as buf:
        procs = [FORK.Process(target=_writer, args=(buf.name, s, stop, errors)) for s in range(2)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 60
        while len(buf) < 512 and time.monotonic() < deadline:
            time.sleep(0.01)
        n = 0
        deadline = time.monotonic() + 300  # a cap: until 640 rows and a redraw, not for a time
        while (n < 640 or buf.redraws == 0) and time.monotonic() < deadline:
            e0 = buf.sampler.epoch()
            b = buf.sample(128)
            e1 = buf.sampler.epoch()
            assert consistent(b).all()
            # every row's version carries the epoch of its draw, a redrawn row's too
            epochs = b.versions >> 8
            assert ((epochs >= e0) & (epochs <= e1)).all(), (e0, e1, epochs)
            leaves = buf.priorities()
            want = (leaves[leaves > 0].min() / leaves[b.indices]) ** 0.5
            np.testing.assert_allclose(b.weights, want, rtol=1e-5)  # weights of the trees drawn from
            n += 128
            p = np.where(b.indices >= 256, 50.0, 1.0)
            try:
                buf.update_priorities(b, p)
            except ValueError as exc:  # rows overwritten since the sample (and folded): refused
                assert "stale" in str(exc)
        stop.set()
        for p in procs:
            p.join(30)
        assert errors.empty(), errors.get()
        redraws = buf.redraws
    assert n >= 640
    assert redraws > 0, "no row was ever redrawn: the writers did not race the reader"


def _finite_writer(name, shard, n):
    with SharedWriter(name, shard) as w:
        w.extend(id_rows(np.arange(n) + 1_000_000 * shard))


def test_priorities_steer_draws_across_writer_processes(shm_dir):
    """Rows of two real writer processes; the learner raises every shard-1 row it samples to 50
    (shard 0's stay at 1): shard 1 is then drawn in proportion to its mass, as the trees say."""
    with SharedReplayBuffer(ID_SPEC, 2 * 64, num_writers=2, seed=3, prioritized=True, alpha=1.0) as buf:
        procs = [FORK.Process(target=_finite_writer, args=(buf.name, s, 100)) for s in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        assert [w["state"] for w in buf.writers()] == ["finished"] * 2
        for _ in range(20):
            b = buf.sample(32)
            buf.update_priorities(b, np.where(b.indices >= 64, 50.0, 1.0))
        leaves = buf.priorities()
        mass1 = leaves[64:].sum() / leaves.sum()
        assert mass1 > 0.9
        drawn = np.concatenate([buf.sample(64, copy=True).indices for _ in range(50)])
        assert abs((drawn >= 64).mean() - mass1) < 0.03
        ids = buf.sample(128)["id"]
        assert set(ids // 1_000_000) <= {0, 1} and (ids % 1_000_000 >= 36).all()  # the newest 64 of 100


def test_the_catch_up_gives_each_row_what_a_push_gives_it():
    """The one-row write hook's ``rows`` form (what the shard streams call for the rows a writer
    published) over consecutive slots equals that many pushes of one row, tree for tree."""
    from tfdata import alloc
    from tfdata.replay.samplers.prioritized import PrioritizedSampler

    rng = np.random.default_rng(0)
    a, b = (PrioritizedSampler(0.7, 0.4, 1.0, None, 1e-6, seed=0) for _ in range(2))
    for s in (a, b):
        s.bind(None, 40, 1, alloc.resolve(None))
    one, rows = a.slot_hook(), b.slot_hook().rows
    for spans in ([(0, 17)], [(17, 23)], [(35, 5), (0, 4)], [(5, 9), (20, 3)], [(0, 40)], [(39, 1)]):
        for start, count in spans:
            for slot in range(start, start + count):
                one(slot)
        rows(np.array(spans, np.int64))
        idx = rng.integers(0, 40, 6)
        p = rng.random(6) * 5
        a.update(idx, p, None, 40)
        b.update(idx, p, None, 40)
        np.testing.assert_array_equal(a.leaves, b.leaves)
        np.testing.assert_array_equal(a.sums, b.sums)
        np.testing.assert_array_equal(a.mm, b.mm)
        np.testing.assert_array_equal(a.v8, b.v8)
