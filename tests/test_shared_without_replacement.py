"""SharedReplayBuffer(sampler="without_replacement"): the learner's pool over rows that writer
processes publish. Within a pass no row is returned twice; one writer gives the batches of a
ReplayBuffer with the same rows; a killed writer wedges nothing; checkpoints keep the pass."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest

from tfdata import FormatError, ReplayBuffer
from tfdata.errors import WriterLostWarning
from tfdata.kernels import _pool
from tfdata.shared import SharedReplayBuffer, SharedWriter

from . import naive
from .conftest import row
from .test_shared import ID_SPEC, _dying_worker, consistent, id_rows
from .test_without_replacement import Model

FORK = mp.get_context("fork")
WOR = "without_replacement"


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    return tmp_path


def wor(cap, **kw) -> SharedReplayBuffer:
    kw.setdefault("seed", 3)
    return SharedReplayBuffer(ID_SPEC, cap, sampler=WOR, **kw)


# -- the kernel against its reference ----------------------------------------------------------
def test_pool_fold_draw_matches_reference():
    """Random publications on 1-3 shards (laps included) and draws, against the reference: the
    published rows of each shard joined in order (each slot once a lap behind), then
    ``pool_sample_naive``'s draws with the pass refilled by the held slots of every shard."""
    rng = np.random.default_rng(5)
    for trial in range(120):
        S, span = int(rng.integers(1, 4)), int(rng.integers(1, 9))
        cap = S * span + int(rng.integers(0, 3))  # a pool may be longer than the shards
        pool, inpool = np.zeros(cap, np.uint32), np.zeros(cap, np.uint8)
        meta, folded = np.zeros(3, np.int64), np.zeros(S, np.int64)
        heads, scratch = np.zeros(S, np.uint64), np.zeros(7 * S + 8, np.int64)
        state = np.array([naive.mix64(trial), 0], np.uint64)
        ref, ref_m, ref_passes, ref_folded = [0] * cap, 0, 0, [0] * S
        for step in range(25):
            for g in range(S):
                if rng.random() < 0.5:
                    heads[g] += int(rng.integers(0, 3 * span))
            held = [min(int(h), span) for h in heads]
            total = sum(held)
            batch = int(rng.integers(0, total + 2))
            idx = np.zeros(batch, np.int64)
            key, ctr = int(state[0]), int(state[1])
            got = _pool.pool_fold_draw(heads, span, pool, inpool, meta, folded, scratch, state, idx)
            # the reference: joins, then draws over the live slots
            ref_m = _ref_fold(ref, ref_m, ref_folded, heads, span)
            assert folded.tolist() == ref_folded and int(meta[2]) == total
            if batch > total:
                assert got == -3 and int(state[1]) == ctr and int(meta[0]) == ref_m
                continue
            live = [g * span + j for g in range(S) for j in range(held[g])]
            ref, ref_m, passes, ref_idx, ref_ctr = naive.pool_sample_naive(
                ref, ref_m, ref_passes, 0, 0, 0, key, ctr, batch, live=live)
            assert got == passes - ref_passes, (trial, step)
            ref_passes = passes
            np.testing.assert_array_equal(idx, ref_idx, err_msg=f"trial {trial} step {step}")
            assert int(meta[0]) == ref_m and int(meta[1]) == ref_passes and int(state[1]) == ref_ctr
            np.testing.assert_array_equal(pool[:ref_m], ref[:ref_m])
            assert sorted(np.flatnonzero(inpool).tolist()) == sorted(ref[:ref_m])


def _ref_fold(ref, ref_m, ref_folded, heads, span):
    """The reference's join of the rows published since (each slot once a lap behind)."""
    members = set(ref[:ref_m])
    for g in range(len(heads)):
        h, lo = int(heads[g]), ref_folded[g]
        for r in range(lo, min(h, lo + span)):
            s = g * span + r % span
            if s not in members:
                ref[ref_m] = s
                members.add(s)
                ref_m += 1
        ref_folded[g] = max(lo, h)
    return ref_m


def test_pool_fold_redraw_matches_reference_and_never_repeats_a_slot():
    """A batch, then rows of it drawn again with rows published in between (slots of the batch
    among them), against ``pool_redraw_naive``: the batch never holds a slot twice, whether the
    pass ended in the batch's draws, in a redraw, or a writer republished one of its slots."""
    rng = np.random.default_rng(11)
    ended = republished = 0
    for trial in range(300):
        S, span = int(rng.integers(1, 4)), int(rng.integers(1, 9))
        cap = S * span + int(rng.integers(0, 3))
        pool, inpool = np.zeros(cap, np.uint32), np.zeros(cap, np.uint8)
        meta, folded = np.zeros(3, np.int64), np.zeros(S, np.int64)
        heads, scratch = np.zeros(S, np.uint64), np.zeros(7 * S + 8, np.int64)
        state = np.array([naive.mix64(trial), 0], np.uint64)
        ref, ref_m, ref_passes, ref_folded = [0] * cap, 0, 0, [0] * S
        heads[:] = rng.integers(1, 2 * span, S)
        for step in range(12):
            held = [min(int(h), span) for h in heads]
            live = [g * span + j for g in range(S) for j in range(held[g])]
            batch = int(rng.integers(1, len(live) + 1))
            idx = np.zeros(batch, np.int64)
            key, ctr = int(state[0]), int(state[1])
            got = _pool.pool_fold_draw(heads, span, pool, inpool, meta, folded, scratch, state, idx)
            ref_m = _ref_fold(ref, ref_m, ref_folded, heads, span)
            ref, ref_m, passes, ref_idx, _ = naive.pool_sample_naive(
                ref, ref_m, ref_passes, 0, 0, 0, key, ctr, batch, live=live)
            assert got == passes - ref_passes
            ended += got > 0
            ref_passes = passes
            np.testing.assert_array_equal(idx, ref_idx)
            for _ in range(int(rng.integers(0, 4))):  # rows torn during the copy, drawn again
                if rng.random() < 0.5:  # a writer published meanwhile (maybe a batch row's slot)
                    g = int(rng.integers(0, S))
                    heads[g] += int(rng.integers(1, span + 1))
                    republished += any(g * span <= s < (g + 1) * span for s in idx)
                i = int(rng.integers(0, batch))
                key, ctr = int(state[0]), int(state[1])
                got = _pool.pool_fold_redraw(heads, span, pool, inpool, meta, folded, scratch,
                                             state, idx, i)
                ref_m = _ref_fold(ref, ref_m, ref_folded, heads, span)
                held = [min(int(h), span) for h in heads]
                live = [g * span + j for g in range(S) for j in range(held[g])]
                ref, ref_m, passes, ref_idx, ref_ctr = naive.pool_redraw_naive(
                    ref, ref_m, ref_passes, key, ctr, ref_idx, i, live)
                assert got == passes - ref_passes, (trial, step)
                ended += got > 0
                ref_passes = passes
                np.testing.assert_array_equal(idx, ref_idx, err_msg=f"trial {trial} step {step}")
                assert len(set(idx.tolist())) == batch, "a slot twice in a batch"
                assert int(meta[0]) == ref_m and int(meta[1]) == ref_passes
                assert int(state[1]) == ref_ctr
                np.testing.assert_array_equal(pool[:ref_m], ref[:ref_m])
                assert sorted(np.flatnonzero(inpool).tolist()) == sorted(ref[:ref_m])
                assert set(np.unique(inpool).tolist()) <= {0, 1}
            if rng.random() < 0.5:
                heads[int(rng.integers(0, S))] += int(rng.integers(0, 2 * span))
    assert ended > 100 and republished > 100  # the cases the test is about happened


def test_pool_fold_redraw_refuses_bad_arguments():
    pool, inpool, meta = np.zeros(8, np.uint32), np.zeros(8, np.uint8), np.zeros(3, np.int64)
    heads, folded, scratch = np.array([3, 2], np.uint64), np.zeros(2, np.int64), np.zeros(14, np.int64)
    state, idx = np.array([1, 0], np.uint64), np.array([0, 4], np.int64)
    for i in (-1, 2):
        assert _pool.pool_fold_redraw(heads, 4, pool, inpool, meta, folded, scratch, state, idx, i) == -1
    assert not meta.any() and not folded.any() and int(state[1]) == 0
    big = np.zeros(6, np.int64)  # more rows than the shards hold
    assert _pool.pool_fold_redraw(heads, 4, pool, inpool, meta, folded, scratch, state, big, 0) == -3
    assert folded.tolist() == [3, 2] and int(state[1]) == 0
    idx[1] = 10 ** 9  # a batch slot outside the arrays: refused, never read
    assert _pool.pool_fold_redraw(heads, 4, pool, inpool, meta, folded, scratch, state, idx, 0) == -2
    meta[0] = 3
    pool[:3] = [100, 0, 4]  # a corrupt pool entry met by the scan
    idx[:] = [1, 0]
    inpool[[0, 4]] = 1
    assert _pool.pool_fold_redraw(heads, 4, pool, inpool, meta, folded, scratch, state, idx, 0) == -2
    assert set(np.unique(inpool).tolist()) <= {0, 1}


def test_pool_fold_draw_refuses_disagreeing_arrays():
    pool, inpool, meta = np.zeros(8, np.uint32), np.zeros(8, np.uint8), np.zeros(3, np.int64)
    heads, folded, scratch = np.array([3, 2], np.uint64), np.zeros(2, np.int64), np.zeros(14, np.int64)
    state, idx = np.array([1, 0], np.uint64), np.zeros(2, np.int64)
    for args in [(5, pool, inpool, meta, folded, scratch),  # 2 shards of 5 > 8 slots
                 (4, pool, inpool[:7], meta, folded, scratch), (4, pool, inpool, meta[:2], folded, scratch),
                 (4, pool, inpool, meta, folded[:1], scratch), (4, pool, inpool, meta, folded, scratch[:13]),
                 (0, pool, inpool, meta, folded, scratch)]:
        assert _pool.pool_fold_draw(heads, *args, state, idx) == -1
    assert not meta.any() and not folded.any() and int(state[1]) == 0
    meta[0] = 3
    folded[:] = [3, 2]  # nothing published since: the pool is drawn as it is
    pool[:3] = [100, 10 ** 9, 100]  # slots beyond the arrays in a corrupt pool: refused, never read
    assert _pool.pool_fold_draw(heads, 4, pool, inpool, meta, folded, scratch, state,
                                np.zeros(3, np.int64)) == -2


# -- one writer: the batches of a ReplayBuffer -------------------------------------------------
@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_one_writer_samples_as_a_replay_buffer_and_follows_the_rule(layout, shm_dir):
    cap = 16
    rng = np.random.default_rng(7)
    ref = ReplayBuffer(ID_SPEC, cap, layout=layout, seed=3, sampler=WOR)
    model, nid = Model(cap), 0
    with wor(cap, layout=layout) as buf, SharedWriter(buf.name, 0) as w:
        for step in range(250):
            if rng.random() < 0.3 or len(ref) == 0:
                k = int(rng.choice([1, 3, cap, cap + 5, 3 * cap]))
                rows = id_rows(np.arange(nid, nid + k))
                nid += k
                if k == 1:
                    ref.push(row(rows, 0))
                    w.push(row(rows, 0))
                else:
                    ref.extend(rows)
                    w.extend(rows)
                model.write(rows["id"])
            else:
                b = int(rng.integers(1, len(ref) + 1))
                got, want = buf.sample(b, copy=True), ref.sample(b, copy=True)
                np.testing.assert_array_equal(got.indices, want.indices)
                np.testing.assert_array_equal(got["id"], want["id"])
                assert consistent(got).all()
                model.check_batch(got["id"])
                assert buf.sampler.passes == ref.sampler.passes == model.passes
        assert model.passes > 10


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "rate limiter"])
def test_a_batch_larger_than_the_rows_says_sampling_is_without_replacement(limited, shm_dir):
    """The refusal of a batch larger than the rows held (or, with a rate limiter, than the
    capacity) says what this sampler does: distinct rows, not 'with replacement'."""
    from tfdata import RateLimiter

    kw = dict(rate_limiter=RateLimiter(1.0, 1, 40, timeout=1)) if limited else {}
    with wor(8, **kw) as buf, SharedWriter(buf.name, 0) as w:
        w.extend(id_rows(np.arange(5)))
        for b in (9,) if limited else (6, 9):
            with pytest.raises(ValueError, match="drawn without replacement .*a batch never holds") as e:
                buf.sample(b)
            assert "with replacement" not in str(e.value).replace("without replacement", "")
        assert sorted(buf.sample(5)["id"].tolist()) == list(range(5))


def test_bad_sampler_arguments_change_nothing(shm_dir):
    with pytest.raises(ValueError, match="sampler must be one of .* got 'bogus'"):
        SharedReplayBuffer(ID_SPEC, 8, sampler="bogus")
    with pytest.raises(ValueError, match="sampler='without_replacement' with prioritized=True"):
        SharedReplayBuffer(ID_SPEC, 8, sampler=WOR, prioritized=True)
    with pytest.raises(ValueError, match="sampler='without_replacement' with mode='fifo'"):
        SharedReplayBuffer(ID_SPEC, 8, sampler=WOR, mode="fifo")
    assert os.listdir(shm_dir) == []
    spec = dict(ID_SPEC, terminated="?", truncated="?")
    with SharedReplayBuffer(spec, 8, sampler=WOR) as buf, SharedWriter(buf.name, 0) as w:
        w.extend({**id_rows(np.arange(8)), "terminated": np.zeros(8, bool), "truncated": np.zeros(8, bool)})
        with pytest.raises(NotImplementedError, match="without_replacement.*no sequences"):
            buf.sample_sequences(2, 3)
        assert buf.sampler.undrawn == 0 and buf.sampler.passes == 0  # nothing added
        assert sorted(buf.sample(8)["id"].tolist()) == list(range(8))
        assert buf.nbytes_parts["bookkeeping"] >= 5 * 8 + 8


# -- writer processes --------------------------------------------------------------------------
def _allowed_writer(name, shard, allowed, stop, errors):
    """Pushes rows with unique ids, one at a time, never more than ``allowed[shard]`` (the
    learner raises it as it samples: the writer's pace is the learner's, whatever the
    machine's speed)."""
    try:
        with SharedWriter(name, shard) as w:
            i = 0
            while not stop.is_set():
                if i < allowed[shard]:
                    w.push(row(id_rows([i + 1_000_000 * shard]), 0))
                    i += 1
                else:
                    time.sleep(0)
    except BaseException as exc:
        errors.put(f"shard {shard}: {exc!r}")


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_two_writer_processes_no_row_twice_in_a_pass(layout, shm_dir):
    """Two processes overwrite their rings while the learner samples: every row whole, and no
    row twice within a pass (batches of 1 near a pass's end, so the boundary is known: a
    batch smaller than the undrawn rows cannot end its pass, unless rows torn by a writer
    were drawn again from the pool; a batch that redrew and ended a pass starts the check
    afresh, its rows still distinct). The writers write a row per 4 rows sampled (an eighth
    each), so that every pass ends whatever the machine's speed (writers that lap their rings
    between two samples keep every slot in the pool); runs until 3 passes ended (time cap:
    300 s)."""
    errors, stop = FORK.Queue(), FORK.Event()
    cap = 2 * 256
    allowed = FORK.RawArray("q", [256, 256])
    with wor(cap, num_writers=2, layout=layout) as buf:
        procs = [FORK.Process(target=_allowed_writer, args=(buf.name, s, allowed, stop, errors))
                 for s in range(2)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 60
        while len(buf) < cap and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(buf) == cap, errors.get() if not errors.empty() else "no rows"
        seen, passes, sampled = set(), buf.sampler.passes, 0
        first = passes
        deadline = time.monotonic() + 300
        while buf.sampler.passes < first + 3 and time.monotonic() < deadline:
            redraws = buf.redraws
            allowed[0] = allowed[1] = 256 + sampled // 8
            b = buf.sample(64 if buf.sampler.undrawn > 64 else 1)
            sampled += len(b.indices)
            assert consistent(b).all()
            ids = b["id"].tolist()
            assert len(set(ids)) == len(ids), "a row twice in a batch"
            if buf.sampler.passes != passes:  # a batch of 1 ended the pass
                assert (len(ids) == 1 and buf.sampler.passes == passes + 1) or buf.redraws > redraws
                passes, seen = buf.sampler.passes, set()
                continue
            assert not seen & set(ids), ("a row twice in a pass", seen & set(ids))
            seen |= set(ids)
        stop.set()
        for p in procs:
            p.join(30)
        assert errors.empty(), errors.get()
    assert sampled > 2 * cap and passes >= first + 3


def test_a_killed_writer_does_not_wedge_the_learner(shm_dir):
    cap, n_ok = 33, 40  # shard 0 wrapped; its writer dies while overwriting 5 slots
    with wor(2 * cap, num_writers=2, seed=1) as buf:
        p = FORK.Process(target=_dying_worker, args=(buf.name, 0, n_ok, 5))
        p.start()
        p.join(30)
        assert p.exitcode == -signal.SIGKILL
        with SharedWriter(buf.name, 1) as w:
            w.extend(id_rows(1_000_000 + np.arange(10)))
        with pytest.warns(WriterLostWarning, match="shard 0"):
            assert buf.lost_writers[0]["torn"] == 5
        held = set(range(n_ok - cap + 5, n_ok)) | set((1_000_000 + np.arange(10)).tolist())
        ids = np.asarray(buf.storage.field("id"))
        returned = [int(buf.sample(1)["id"][0])]  # the first sample adds every published row
        first = buf.sampler.passes
        while buf.sampler.passes < first + 4:  # nothing is published now: the pool is exact
            undrawn = set(ids[buf.sampler.pool[:buf.sampler.undrawn]].tolist())
            p0 = buf.sampler.passes
            got = int(buf.sample(1)["id"][0])
            assert got in held  # never a torn slot (its old row was being overwritten)
            if buf.sampler.passes == p0:
                assert got in undrawn, "a row not undrawn in its pass"
            returned.append(got)
            assert len(returned) < 10_000, "the learner is wedged"
        assert set(returned) == held and len(returned) < 5 * len(held)
        assert buf.redraws >= 5


def test_slots_left_torn_never_make_a_batch_repeat_a_slot(shm_dir):
    """A killed writer leaves 8 of 64 slots torn for good: every pass draws them, finds them
    torn and draws again, in batches during which the pass ends (at their end, in the middle,
    or in a redraw). No batch holds a slot twice (nothing moves any more: the same batches on
    every machine)."""
    cap = 64
    with wor(cap, seed=5) as buf:
        p = FORK.Process(target=_dying_worker, args=(buf.name, 0, 100, 8))
        p.start()
        p.join(30)
        assert p.exitcode == -signal.SIGKILL
        with pytest.warns(WriterLostWarning, match="shard 0"):
            assert buf.lost_writers[0]["torn"] == 8
        crossed = 0
        for t in range(400):
            passes, redraws = buf.sampler.passes, buf.redraws
            b = buf.sample([32, 17, 5, 56][t % 4])
            assert len(set(b.indices.tolist())) == len(b.indices), ("a slot twice", t)
            assert consistent(b).all() and len(set(b["id"].tolist())) == len(b.indices)
            crossed += buf.sampler.passes > passes and buf.redraws > redraws
        assert crossed > 50


def test_a_writer_lapping_its_shard_never_makes_a_batch_repeat_a_row(shm_dir):
    """A writer process overwrites its 64 slots while the learner samples batches of 32: no
    batch ever holds a slot, or a row (ids are unique), twice, counted over batches in which a
    pass ended and a row torn by the writer was drawn again (the old rule repeated a slot
    within a few dozen batches). The writer may write 16 rows per batch: the passes end at the
    learner's pace; it writes them while the learner samples, so rows are torn and drawn
    again. Runs until 100 such batches (time cap: 300 s)."""
    errors, stop = FORK.Queue(), FORK.Event()
    allowed = FORK.RawArray("q", [64])
    cap, want = 64, 100
    with wor(cap) as buf:
        proc = FORK.Process(target=_allowed_writer, args=(buf.name, 0, allowed, stop, errors))
        proc.start()
        try:
            deadline = time.monotonic() + 60
            while len(buf) < cap and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(buf) == cap, errors.get() if not errors.empty() else "no rows"
            crossed = batches = 0
            deadline = time.monotonic() + 300
            while crossed < want and time.monotonic() < deadline:
                passes, redraws = buf.sampler.passes, buf.redraws
                allowed[0] += 16
                b = buf.sample(32)
                batches += 1
                ids = b["id"].tolist()
                assert len(set(b.indices.tolist())) == 32, ("a slot twice in a batch", batches)
                assert len(set(ids)) == 32 and consistent(b).all(), ("a row twice", batches)
                crossed += buf.sampler.passes > passes and buf.redraws > redraws
        finally:
            stop.set()
            proc.join(30)
        assert errors.empty(), errors.get()
    assert crossed >= want, f"{crossed} batches crossed a pass boundary and redrew, of {batches}"


# -- checkpoints -------------------------------------------------------------------------------
def mid_pass(shm_dir, cap=24, dropped=0):
    buf = wor(2 * cap, num_writers=2)
    ws = [SharedWriter(buf.name, s) for s in range(2)]
    ws[0].extend(id_rows(np.arange(40)))
    ws[1].extend(id_rows(1000 + np.arange(10)))
    buf.sample(9)
    ws[0].extend(id_rows(np.arange(40, 45)))  # published since the last sample: in the save
    if dropped:  # shard 0's writer begins overwriting its oldest rows as the save runs
        ws[0]._k.shard_begin(ws[0]._words, ws[0].published + dropped)
    return buf, ws


def undrawn_ids(buf) -> set:
    slots = buf.sampler.pool[:buf.sampler.undrawn]
    return set(np.asarray(buf.storage.field("id"))[slots].tolist())


def test_checkpoint_continues_the_pass(shm_dir, tmp_path):
    a, ws = mid_pass(shm_dir)
    a.save(tmp_path / "ck")
    doc = json.loads((tmp_path / "ck" / "state.json").read_text())
    assert doc["config"]["sampler"] == WOR
    b = SharedReplayBuffer.load(tmp_path / "ck", layout="soa")
    assert b.sampler.passes == a.sampler.passes and undrawn_ids(a) == undrawn_ids(b)
    wb = [SharedWriter(b.name, s) for s in range(2)]
    for t in range(30):
        if t % 4 == 0:
            for w in (ws[0], wb[0]):
                w.extend(id_rows(np.arange(100 + 7 * t, 107 + 7 * t)))
        np.testing.assert_array_equal(a.sample(5)["id"], b.sample(5)["id"])
    assert a.sampler.passes == b.sampler.passes > 1
    for w in ws + wb:
        w.close()
    a.close()
    b.close()


def test_checkpoint_leaves_out_the_rows_being_overwritten(shm_dir, tmp_path):
    a, ws = mid_pass(shm_dir, dropped=5)
    a.save(tmp_path / "ck")
    b = SharedReplayBuffer.load(tmp_path / "ck")
    # shard 0 held rows 21..44; 21..25 were being overwritten: left out, the rest moved
    assert undrawn_ids(b) == undrawn_ids(a) - set(range(21, 26))
    ids = np.asarray(b.storage.field("id"))
    np.testing.assert_array_equal(ids[:19], np.arange(26, 45))
    drawn = []
    start = b.sampler.passes
    while b.sampler.passes == start:
        drawn += b.sample(1)["id"].tolist()
    assert sorted(drawn) == sorted(undrawn_ids(a) - set(range(21, 26)))
    for w in ws:
        w.close()
    a.close()
    b.close()


def test_hostile_pass_in_a_checkpoint_is_refused(shm_dir, tmp_path):
    a, ws = mid_pass(shm_dir)
    a.save(tmp_path / "ck")
    doc_path = tmp_path / "ck" / "state.json"
    good = doc_path.read_text()
    doc = json.loads(good)
    arr = doc["state"]["without_replacement"]["undrawn"]
    assert isinstance(arr, dict)  # an array file: edit the file it names
    files = sorted((tmp_path / "ck").rglob("*.npy"))
    target = next(f for f in files if "undrawn" in f.name)
    saved = np.load(target)
    for bad, match in [(np.append(saved, saved[0]), "undrawn"),  # a slot twice
                       (np.append(saved[1:], 24 + 20), "slot 44"),  # shard 1 holds 10 rows
                       (np.append(saved[1:], -1), "undrawn")]:
        np.save(target, bad.astype(np.int64))
        with pytest.raises(FormatError, match=match):
            SharedReplayBuffer.load(tmp_path / "ck")
    np.save(target, saved)
    for edit, field in [({"sampler": "exactly_once"}, "config.sampler")]:
        doc2 = json.loads(good)
        doc2["config"].update(edit)
        doc_path.write_text(json.dumps(doc2))
        with pytest.raises(FormatError, match=field):
            SharedReplayBuffer.load(tmp_path / "ck")
    doc_path.write_text(good)
    SharedReplayBuffer.load(tmp_path / "ck").close()
    for w in ws:
        w.close()
    a.close()


def test_one_writer_n_step_and_projection_as_a_replay_buffer(shm_dir):
    """n-step windows and projected batches over the same draws as a ReplayBuffer's."""
    from .test_without_replacement import SPEC as NSPEC, rows as nrows

    ref = ReplayBuffer(NSPEC, 20, seed=4, sampler=WOR, n_step=3, gamma=0.5)
    with SharedReplayBuffer(NSPEC, 20, seed=4, sampler=WOR, n_step=3, gamma=0.5) as buf, \
            SharedWriter(buf.name, 0) as w:
        nid = 0
        for step in range(40):
            k = [25, 3, 7][step % 3]
            r = nrows(np.arange(nid, nid + k))
            nid += k
            ref.extend(r)
            w.extend(r)
            for fields in (None, ["reward"]):
                got, want = buf.sample(6, fields=fields), ref.sample(6, fields=fields)
                np.testing.assert_array_equal(got.indices, want.indices)
                np.testing.assert_array_equal(got["reward"], want["reward"])
                np.testing.assert_array_equal(got.discounts, want.discounts)
        assert buf.sampler.passes == ref.sampler.passes > 5


def test_checkpoint_while_writer_processes_write(shm_dir, tmp_path):
    """A save while two processes overwrite their rings: the loaded buffer's pass holds only
    rows it holds, each once, and finishes by returning each of them once. Each writer may
    begin 32 rows during the save, so the save is never lapped whole (at full speed it can
    be, on a loaded machine) and the pass it keeps is not empty."""
    errors, stop = FORK.Queue(), FORK.Event()
    allowed = FORK.RawArray("q", [128, 128])
    with wor(2 * 128, num_writers=2) as buf:
        procs = [FORK.Process(target=_allowed_writer, args=(buf.name, s, allowed, stop, errors))
                 for s in range(2)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 60
        while len(buf) < 2 * 128 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(buf) == 2 * 128, errors.get() if not errors.empty() else "no rows"
        for _ in range(3):
            allowed[0] += 25
            allowed[1] += 25
            buf.sample(50)
        for s, info in enumerate(buf.writers()):
            allowed[s] = info["published"] + 32
        buf.save(tmp_path / "ck")
        stop.set()
        for p in procs:
            p.join(30)
        assert errors.empty(), errors.get()
    with SharedReplayBuffer.load(tmp_path / "ck") as b:
        n0, start = b.sampler.undrawn, b.sampler.passes
        assert 0 < n0 <= len(b), (n0, len(b), json.loads((tmp_path / "ck" / "state.json").read_text())["state"]["dropped"])
        got = []
        while b.sampler.passes == start:
            got += b.sample(1)["id"].tolist()
        assert len(got) == n0 == len(set(got))
        assert set(got) <= set(np.asarray(b.storage.field("id")).tolist())
