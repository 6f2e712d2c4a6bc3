"""SharedReplayBuffer(sampler="exactly_k"): writers write the next free slot of their shard
(per-slot ``taken`` / ``released`` counters), publish a log of the slots they wrote, and the
learner folds the log into its pool. No head-of-line blocking: a writer waits only when no slot
of its shard is free.

The kernels against their pure-Python references (tests/naive.py), then real writer processes
and a learner: the stall of the ring design is gone, exact counts, drop counts, a killed writer,
a closed buffer, the rate limiter, and equality with a ReplayBuffer given the same rows."""

from __future__ import annotations

import collections
import itertools
import json
import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest

from tfdata import RateLimiter, ReplayBuffer, SharedReplayBuffer, SharedWriter
from tfdata.shared import region_nbytes
from tfdata.errors import SharedBufferError, WriterLostWarning
from tfdata.kernels import _replays

from . import naive

SPEC = {"id": "i8", "obs": ("f4", (3,)), "reward": "f4"}


def rows(ids) -> dict:
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 3, 1).astype(np.float32),
            "reward": ids.astype(np.float32)}


def one(i) -> dict:
    return {k: v[0] for k, v in rows([i]).items()}


# -- the kernels against their references ----------------------------------------------------------
def test_claim_fold_release_match_references():
    """A simulated run: writers claim free slots from their cursors, log them and publish; the
    learner folds the logs, draws, releases; every step against the references."""
    rng = np.random.default_rng(3)
    for trial in range(120):
        shards, cap, k = int(rng.integers(1, 4)), int(rng.integers(1, 9)), int(rng.integers(1, 4))
        n = shards * cap
        taken, released, log = (np.zeros(n, np.uint64) for _ in range(3))
        heads = np.zeros(shards, np.uint64)
        folded = np.zeros(shards, np.int64)
        pool, rem, meta = np.zeros(n, np.uint32), np.zeros(n, np.uint8), np.zeros(1, np.int64)
        cursors = [0] * shards
        state = np.array([naive.mix64(trial), 0], np.uint64)
        for step in range(40):
            for s in range(shards):
                want = int(rng.integers(0, cap + 2))
                out = np.full(cap + 1, -7, np.int64)
                got = _replays.replays_claim(taken, released, s * cap, cap, cursors[s], want, out)
                ref = naive.exactly_k_claim_naive(taken.tolist(), released.tolist(), s * cap,
                                                   cap, cursors[s], min(want, cap + 1))
                assert out[:got].tolist() == ref
                if got and rng.random() < 0.15:  # a writer dies after logging and taking
                    before = taken.copy()
                    _replays.replays_log(taken, log, s * cap, cap, int(heads[s]), out[:got])
                    want, wfreed = naive.exactly_k_recover_naive(
                        taken.tolist(), released.tolist(), log.tolist(), s * cap, cap,
                        int(heads[s]), int(heads[s]) + got)
                    freed = _replays.replays_recover(taken, released, log, s * cap, cap,
                                                     int(heads[s]), int(heads[s]) + got)
                    assert freed == wfreed == got and taken.tolist() == want == before.tolist()
                elif got:
                    cursors[s] = (int(out[got - 1]) + 1) % cap
                    want = naive.exactly_k_log_naive(taken.tolist(), log.tolist(), s * cap, cap,
                                                     int(heads[s]), out[:got].tolist())
                    assert _replays.replays_log(taken, log, s * cap, cap, int(heads[s]), out[:got]) == got
                    assert (taken.tolist(), log.tolist()) == want
                    heads[s] += got
            # the learner hears the rows published: their slots from the logs, as runs (a few
            # at a time: several calls), each joining the pool with k deliveries
            want, want_folded, ok = naive.exactly_k_log_slots_naive(
                [int(h) for h in heads], log.tolist(), folded.tolist(), cap)
            assert ok
            ref_pool, ref_m, ref_rem = pool.tolist(), int(meta[0]), rem.tolist()
            for g in want:
                ref_pool, ref_m, ref_rem, lost = naive.exactly_k_write_naive(
                    ref_pool, ref_m, ref_rem, g, 1, k)
                assert lost == 0
            spans = np.zeros((int(rng.integers(1, 4)), 2), np.int64)
            slots = []
            while True:
                r = _replays.replays_log_spans(heads, log, folded, cap, spans)
                assert r >= 0
                for g, c in spans[:r].tolist():
                    slots += range(g, g + c)
                assert _replays.replays_write_spans(pool, rem, meta, spans[:r], k) == 0
                if r < spans.shape[0]:
                    break
            assert slots == want and folded.tolist() == want_folded
            assert meta[0] == ref_m and pool[:ref_m].tolist() == ref_pool[:ref_m]
            assert rem.tolist() == ref_rem
            b = int(rng.integers(0, int(meta[0]) + 1))
            idx = np.empty(b, np.int64)
            assert _replays.replays_sample(pool, rem, meta, state, idx) >= 0
            want_rel, want_freed = naive.exactly_k_release_naive(rem.tolist(), released.tolist(),
                                                                  idx.tolist())
            assert _replays.replays_release(rem, released, idx) == want_freed
            assert released.tolist() == want_rel
            # the invariant: a slot is free iff it is not awaiting replay nor published unfolded
            assert ((taken == released) == (rem == 0)).all()


def test_kernels_stay_inside_their_arrays_whatever_they_hold():
    z64 = lambda n: np.zeros(n, np.uint64)  # noqa: E731
    out = np.zeros(4, np.int64)
    assert _replays.replays_claim(z64(4), z64(3), 0, 4, 0, 1, out) == -1
    assert _replays.replays_claim(z64(4), z64(4), 2, 4, 0, 1, out) == -1  # shard past the end
    assert _replays.replays_claim(z64(4), z64(4), 0, 4, 4, 1, out) == -1  # cursor out of it
    assert _replays.replays_claim(z64(4), z64(4), 0, 4, 3, 9, out) == 4
    assert out.tolist() == [3, 0, 1, 2]
    assert _replays.replays_log(z64(4), z64(4), 0, 4, 0, np.array([4])) == -1  # not of the shard
    assert _replays.replays_log(z64(4), z64(4), 0, 4, 0, np.array([-1])) == -1
    assert _replays.replays_log(z64(4), z64(3), 0, 4, 0, np.array([1])) == -1
    folded = np.zeros(2, np.int64)
    spans = np.zeros((4, 2), np.int64)
    log = z64(4)
    # a head behind what was heard, or further ahead than the shard holds: untrusted
    assert _replays.replays_log_spans(np.array([3, 0], np.uint64), log,
                                      np.array([5, 0], np.int64), 2, spans) == -2
    assert _replays.replays_log_spans(np.array([3, 0], np.uint64), log, folded, 2, spans) == -2
    assert _replays.replays_log_spans(np.array([3, 0], np.uint64), log, folded, 2,
                                      np.zeros((0, 2), np.int64)) == -1
    # a log entry out of the shard: the rows before it are given first
    log[:] = [1, (1 << 32) | 7, 0, 0]
    assert _replays.replays_log_spans(np.array([2, 0], np.uint64), log, folded, 2, spans) == 1
    assert folded.tolist() == [1, 0] and spans[0].tolist() == [1, 1]
    assert _replays.replays_log_spans(np.array([2, 0], np.uint64), log, folded, 2, spans) == -2
    log[:] = [1, (3 << 32) | 0, 0, 0]  # a stale entry (another position's tag)
    assert _replays.replays_log_spans(np.array([2, 0], np.uint64), log, folded, 2, spans) == -2
    assert folded.tolist() == [1, 0]
    log[:] = [1, (1 << 32) | 0, 0, 0]
    assert _replays.replays_log_spans(np.array([2, 0], np.uint64), log, folded, 2, spans) == 1
    assert folded.tolist() == [2, 0] and spans[0].tolist() == [0, 1]
    # recover: only fresh entries of begun positions, slots inside the shard
    t, r, lg = np.array([1, 1, 0, 0], np.uint64), z64(4), np.array([(5 << 32) | 9, (5 << 32) | 1, 0, 0], np.uint64)
    assert _replays.replays_recover(t, r, lg, 0, 2, 5, 7) == 1 and t.tolist() == [1, 0, 0, 0]
    assert _replays.replays_recover(t, r, lg, 3, 2, 5, 7) == -1
    assert _replays.replays_recover(t, r, z64(3), 0, 2, 5, 7) == -1
    assert _replays.replays_log_spans(np.array([2, 0], np.uint64), log, folded, 3, spans) == -1
    rem = np.zeros(4, np.uint8)
    assert _replays.replays_release(rem, z64(4), np.array([4])) == -1
    assert _replays.replays_release(rem, z64(4), np.array([-1])) == -1
    assert _replays.replays_release(rem, z64(3), np.array([0])) == -1


# -- writer processes and a learner ---------------------------------------------------------------
FORK = mp.get_context("fork")
SHARD = 1_000_000  # shard s writes ids s * SHARD + i


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    return tmp_path


def _endless_writer(name, shard, errors, seed):
    """Writes ids ``shard * SHARD + i`` in pushes and extends of random sizes until the owner
    closes the buffer (SharedBufferError: the normal end)."""
    try:
        rng = np.random.default_rng(seed)
        with SharedWriter(name, shard, timeout=60) as w:
            i = 0
            while True:
                k = int(rng.integers(1, 6))
                ids = np.arange(i, i + k) + SHARD * shard
                if k == 1:
                    w.push(one(ids[0]))
                else:
                    w.extend(rows(ids))
                i += k
    except SharedBufferError:
        pass
    except BaseException as exc:  # reported to the test, which fails
        errors.put(f"shard {shard}: {exc!r}")


def _ids(batch) -> list:
    """The batch's ids, each row checked whole (a row overwritten while copied fails)."""
    ids = batch["id"]
    np.testing.assert_array_equal(batch["obs"], np.repeat(ids[:, None], 3, 1).astype(np.float32))
    np.testing.assert_array_equal(batch["reward"], ids.astype(np.float32))
    assert len(set(ids.tolist())) == len(ids)
    return ids.tolist()


def _check_counts(buf, seen, k):
    """Every published row delivered at most k times; those delivered fewer are exactly the rows
    awaiting replay (len); the slots released are the rows delivered k times."""
    info = buf.writers()
    published = {s * SHARD + i for w in info for s in [w["shard"]] for i in range(w["published"])}
    assert set(seen) <= published
    assert max(seen.values()) <= k
    short = [i for i in published if seen.get(i, 0) < k]
    assert len(short) == len(buf) <= buf.capacity
    assert buf.sampler.released == sum(1 for i in published if seen.get(i, 0) == k)
    assert sum(seen.values()) == buf.sampler.delivered


@pytest.mark.parametrize("k, writers", [(1, 1), (3, 2)])
def test_no_stall_with_small_shards_and_random_order(k, writers, shm_dir):
    """The ring design stalled here (a writer waiting for its oldest row, still awaiting, while
    fewer rows than a batch awaited): shards barely larger than the batch, writers that never
    stop, a long run of samples with no TimeoutError."""
    cap, B, n_batches = 40, 32, 1500 if k == 1 else 800
    errors = FORK.Queue()
    with SharedReplayBuffer(SPEC, cap * writers, num_writers=writers, seed=1, sampler="exactly_k",
                            replays=k, policy="block", timeout=60) as buf:
        procs = [FORK.Process(target=_endless_writer, args=(buf.name, s, errors, s))
                 for s in range(writers)]
        for p in procs:
            p.start()
        seen = collections.Counter()
        for _ in range(n_batches):
            seen.update(_ids(buf.sample(B)))  # a TimeoutError fails the test
        buf.close()  # wakes the writers waiting for a free slot
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        assert errors.empty(), errors.get()
        _check_counts(buf, seen, k)
        assert buf.sampler.delivered == n_batches * B


def test_a_closed_buffer_wakes_a_blocked_writer_process(shm_dir):
    errors = FORK.Queue()
    with SharedReplayBuffer(SPEC, 8, seed=0, sampler="exactly_k", replays=2) as buf:
        p = FORK.Process(target=_endless_writer, args=(buf.name, 0, errors, 0))
        p.start()
        deadline = time.monotonic() + 20
        while buf.writers()[0]["published"] < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # the writer waits: no slot of its shard is free
        assert buf.writers()[0]["published"] == 8 and p.is_alive()
        buf.close()
        p.join(120)
        # ended by SharedBufferError: its 60 s TimeoutError would be in errors
        assert p.exitcode == 0 and errors.empty(), errors.get() if not errors.empty() else p.exitcode


def test_a_closed_buffer_wakes_a_blocked_writer_thread(shm_dir):
    buf = SharedReplayBuffer(SPEC, 4, seed=0, sampler="exactly_k", replays=1)
    w = SharedWriter(buf.name, 0)
    w.extend(rows(range(4)))
    got = []

    def push():
        try:
            w.push(one(9))
        except BaseException as exc:  # noqa: BLE001
            got.append(exc)

    t = threading.Thread(target=push, daemon=True)
    t.start()
    time.sleep(0.2)
    assert t.is_alive()
    buf.close()
    t.join(120)  # the writer has no timeout: only the close ends its wait
    assert not t.is_alive() and isinstance(got[0], SharedBufferError) and "closed" in str(got[0])
    w.close()


def _killed_after(name, shard, n):
    w = SharedWriter(name, shard)
    for i in range(n):
        w.push(one(shard * SHARD + i))
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_killed_writer_leaves_the_others_going(shm_dir):
    """Shard 0's writer is killed with its shard full of rows awaiting replay: the learner
    delivers them, then shard 1's rows only; its samples never wait on the dead writer."""
    k = 2
    errors = FORK.Queue()
    with SharedReplayBuffer(SPEC, 32, num_writers=2, seed=0, sampler="exactly_k", replays=k,
                            timeout=60) as buf:
        dead = FORK.Process(target=_killed_after, args=(buf.name, 0, 16))
        dead.start()
        dead.join(30)
        assert dead.exitcode == -signal.SIGKILL
        live = FORK.Process(target=_endless_writer, args=(buf.name, 1, errors, 1))
        live.start()
        seen = collections.Counter()
        with pytest.warns(WriterLostWarning, match="shard 0"):
            for _ in range(400):
                seen.update(_ids(buf.sample(8)))
                time.sleep(0.001)  # let the learner's liveness check run
        buf.close()
        live.join(30)
        assert live.exitcode == 0 and errors.empty()
        assert all(seen[i] == k for i in range(16))  # the dead writer's rows, all delivered
        _check_counts(buf, seen, k)


@pytest.mark.parametrize("k", [1, 2])
def test_rate_limiter_across_processes(k, shm_dir):
    """2 writer processes and the learner with exactly-k and a limiter at k samples per
    insert: the counts stay within the limiter's bounds after every sample, every row is
    delivered at most k times, the ones delivered fewer are those awaiting. 300 samples, and
    more until the learner has waited for the writers at least once (time cap: 300 s): how
    often it waits depends on the machine."""
    B, min_size, eb = 8, 32, 16.0
    lim = RateLimiter(float(k), min_size, eb, timeout=60)
    errors = FORK.Queue()
    with SharedReplayBuffer(SPEC, 128, num_writers=2, seed=0, sampler="exactly_k", replays=k,
                            timeout=60, rate_limiter=lim) as buf:
        procs = [FORK.Process(target=_endless_writer, args=(buf.name, s, errors, s)) for s in range(2)]
        for p in procs:
            p.start()
        seen = collections.Counter()
        slack = 5 * k  # a writer checks and then writes up to 5 rows, no lock between processes
        deadline = time.monotonic() + 300
        for i in itertools.count():
            if i >= 300 and (buf.rate_limiter.metrics()["sample_waits"]
                             or time.monotonic() > deadline):
                break
            seen.update(_ids(buf.sample(B)))
            m = buf.rate_limiter.metrics()
            lo, hi = naive.limiter_bounds_naive(m["inserts"], float(k), min_size, eb)
            assert lo - slack <= m["samples"] <= hi + slack, (m, lo, hi)
        buf.close()
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        assert errors.empty(), errors.get()
        assert buf.rate_limiter.metrics()["sample_waits"] > 0
        _check_counts(buf, seen, k)


# -- one writer: the batches of a ReplayBuffer ------------------------------------------------------
@pytest.mark.parametrize("k, cap, layout, policy", [(1, 16, "aos", "drop"), (3, 24, "soa", "drop"),
                                                    (2, 16, "aos", "block"), (3, 24, "soa", "block")])
def test_one_writer_gives_the_batches_of_a_replay_buffer(k, cap, layout, policy, shm_dir):
    """The same rows pushed and extended between the same samples: the same slots, the same
    batches, the same drops (the same next-free rule, the same pool order, the same seed).
    "block" pushes take the generated push, "drop" ones the generic path; "block" writes only
    what fits (neither buffer waits)."""
    rng = np.random.default_rng(k)
    rb = ReplayBuffer(SPEC, cap, seed=5, sampler="exactly_k", replays=k, policy=policy)
    with SharedReplayBuffer(SPEC, cap, seed=5, sampler="exactly_k", replays=k, policy=policy,
                            timeout=None, layout=layout) as buf, SharedWriter(buf.name, 0) as w:
        nid = batches = 0
        for step in range(600):
            if rng.random() < 0.5:
                n = int(rng.integers(1, 7))
                if policy == "block" and rb.sampler.free < n:
                    continue
                if n == 1:
                    rb.push(one(nid))
                    w.push(one(nid))
                else:
                    rb.extend(rows(range(nid, nid + n)))
                    w.extend(rows(range(nid, nid + n)))
                nid += n
            else:
                b = int(rng.integers(1, 9))
                if rb.sampler.awaiting < b:
                    with pytest.raises(ValueError):
                        buf.sample(b)
                    continue
                x, y = rb.sample(b), buf.sample(b)
                assert x["id"].tolist() == y["id"].tolist()
                assert x.indices.tolist() == y.indices.tolist()
                batches += 1
        assert rb.sampler.dropped == w.dropped and (policy == "block" or w.dropped > 0)
        assert batches > 100
        assert len(buf) == rb.sampler.awaiting


# -- checkpoints -------------------------------------------------------------------------------------
def _script(rng, steps):
    """A fixed interleaving: ("w", first id, n) writes and ("s", batch) samples."""
    out, nid = [], 0
    for _ in range(steps):
        if rng.random() < 0.5:
            n = int(rng.integers(1, 7))
            out.append(("w", nid, n))
            nid += n
        else:
            out.append(("s", int(rng.integers(1, 9))))
    return out


def _play(buf, w, script):
    got = []
    for op in script:
        if op[0] == "w":
            w.push(one(op[1])) if op[2] == 1 else w.extend(rows(range(op[1], op[1] + op[2])))
        elif len(buf) >= op[1]:
            b = buf.sample(op[1])
            got.append((_ids(b), b.indices.tolist()))
    return got


@pytest.mark.parametrize("policy, k", [("drop", 3), ("block", 1)])
def test_checkpoint_mid_way_continues_exactly(policy, k, shm_dir, tmp_path):
    """Saved part way (rows awaiting replay, some delivered fewer than k times), loaded into a
    new region: with the same writes and samples after, the same batches and slots as the
    saved buffer, and the same counts."""
    rng = np.random.default_rng(k)
    head, tail = _script(rng, 300), _script(rng, 300)
    tail = [("w", op[1] + 10_000, op[2]) if op[0] == "w" else op for op in tail]
    head += [("w", 5_000 + i, 1) for i in range(5)]  # rows awaiting replay at the save
    cap = 24
    with SharedReplayBuffer(SPEC, cap, seed=4, sampler="exactly_k", replays=k, policy=policy,
                            timeout=None) as buf, SharedWriter(buf.name, 0, timeout=0.01) as w:
        def play(b, wr, script):
            got = []
            for op in script:
                try:
                    got += _play(b, wr, [op])
                except TimeoutError as exc:  # block: the shard filled up, the first rows in
                    got.append(("full", exc.written))
            return got

        play(buf, w, head)
        assert 0 < len(buf) and buf.sampler.released > 0
        buf.save(tmp_path / "ck")
        with SharedReplayBuffer.load(tmp_path / "ck") as back, SharedWriter(back.name, 0, timeout=0.01) as w2:
            back.save(tmp_path / "ck2")  # the same state again, cursors and pool order included
            saved = [json.loads((tmp_path / d / "state.json").read_text())["state"] for d in ("ck", "ck2")]
            assert saved[0]["exactly_k"]["cursors"] == saved[1]["exactly_k"]["cursors"]
            for d in ("ck", "ck2"):
                part = json.loads((tmp_path / d / "state.json").read_text())["state"]["exactly_k"]
                saved.append([np.load(tmp_path / d / part[n]["$array"]).tolist() for n in ("slots", "counts")])
            assert saved[2] == saved[3] and saved[0]["heads"] == saved[1]["heads"]
            assert len(back) == len(buf) and back.sampler.released == buf.sampler.released
            assert back.config == buf.config
            d0 = w.dropped
            a, b = play(buf, w, tail), play(back, w2, tail)
            assert a == b and len(a) > 40
            assert back.sampler.delivered == buf.sampler.delivered
            assert w2.dropped == w.dropped - d0 and (policy == "block" or w2.dropped > 0)
            assert len(back) == len(buf)


def test_hostile_exactly_k_checkpoints_are_refused(shm_dir, tmp_path):
    import json

    from tfdata import FormatError

    with SharedReplayBuffer(SPEC, 8, num_writers=2, seed=0, sampler="exactly_k", replays=2,
                            timeout=None) as buf:
        with SharedWriter(buf.name, 0) as w:
            w.extend(rows(range(3)))
        buf.sample(2)
        buf.save(tmp_path / "ck")
    doc = json.loads((tmp_path / "ck" / "state.json").read_text())
    assert doc["state"]["exactly_k"]["released"] == 0 and doc["state"]["heads"] == [3, 0]

    def broken(edit, what, arrays=None):
        d = json.loads(json.dumps(doc))
        edit(d)
        p = tmp_path / f"bad-{what}"
        os.system(f"cp -r {tmp_path / 'ck'} {p}")
        (p / "state.json").write_text(json.dumps(d))
        if arrays is not None:
            name, values = arrays
            np.save(p / d["state"]["exactly_k"][name]["$array"], np.asarray(values, np.int64))
        before = sorted(os.listdir(shm_dir))
        with pytest.raises(FormatError, match=what):
            SharedReplayBuffer.load(p)
        assert sorted(os.listdir(shm_dir)) == before  # no region was created

    ek = lambda d: d["state"]["exactly_k"]  # noqa: E731
    broken(lambda d: ek(d).__setitem__("released", 1), "released")
    broken(lambda d: ek(d).__setitem__("delivered", -1), "delivered")
    broken(lambda d: ek(d).__setitem__("cursors", [0, 4]), "cursors")
    broken(lambda d: ek(d).__setitem__("cursors", [0]), "cursors")
    broken(lambda d: ek(d).pop("slots"), "exactly_k")
    broken(lambda d: d["state"].pop("exactly_k"), "exactly_k")
    broken(lambda d: d["state"]["dropped"].__setitem__(0, 1), "dropped")
    broken(lambda d: d["config"].__setitem__("policy", "overwrite"), "policy")
    broken(lambda d: d["config"].__setitem__("replays", 0), "replays")
    broken(lambda d: d["config"].pop("timeout"), "timeout")
    broken(lambda d: None, "slots", ("slots", [0, 0, 1]))          # a slot twice
    broken(lambda d: None, "slots", ("slots", [0, 1, 3]))          # slot 3: shard 0 holds 3 rows
    broken(lambda d: None, "slots", ("slots", [0, 1, 99]))         # out of the region
    broken(lambda d: None, "counts", ("counts", [1, 3, 1]))        # more than replays
    broken(lambda d: None, "counts", ("counts", [1, 0, 1]))
    with SharedReplayBuffer.load(tmp_path / "ck") as back:  # the file itself loads
        assert len(back) == 3


@pytest.mark.parametrize("timeout", [None, 1.0])
def test_a_batch_larger_than_the_rows_says_what_exactly_k_does(timeout, shm_dir):
    """The refusal of a batch larger than the rows awaiting replay, or than the capacity, says
    that exactly-k batches hold distinct rows, never 'with replacement'."""
    with SharedReplayBuffer(SPEC, 8, seed=0, sampler="exactly_k", timeout=timeout) as buf, \
            SharedWriter(buf.name, 0) as w:
        w.extend(rows(range(5)))
        cases = [(9, ValueError, "capacity 8; rows are drawn without replacement from those "
                                 "awaiting replay .a batch holds distinct rows")]
        cases.append((6, ValueError if timeout is None else TimeoutError,
                      "exactly_k: a batch of 6 distinct rows, but 5 rows await replay"))
        for b, exc, match in cases:
            with pytest.raises(exc, match=match) as e:
                buf.sample(b)
            assert "with replacement" not in str(e.value)
        assert sorted(buf.sample(5)["id"].tolist()) == list(range(5))


def test_region_has_three_words_per_slot(shm_dir):
    cap = 1 << 14
    plain = region_nbytes(SPEC, cap, num_writers=2)
    ek = region_nbytes(SPEC, cap, num_writers=2, sampler="exactly_k")
    assert 24 * cap <= ek - plain <= 24 * cap + 4096 + 3 * 64
    with SharedReplayBuffer(SPEC, cap, num_writers=2, sampler="exactly_k") as buf:
        assert buf.nbytes == ek


def test_a_writer_taking_over_frees_the_slot_a_dead_writer_took(shm_dir):
    """A writer that died after taking a slot and before publishing it (simulated: its words
    stored as a killed writer's would be) leaves the slot free for the next writer of the
    shard, which then fills every slot of the shard without waiting."""
    from tfdata.kernels import shard_begin

    with SharedReplayBuffer(SPEC, 4, seed=0, sampler="exactly_k", replays=1, timeout=None) as buf:
        r = buf._region  # the words a killed writer leaves, written as its kernels would
        with SharedWriter(buf.name, 0) as w:
            w.extend(rows(range(3)))
            slots = np.empty(4, np.int64)
            assert _replays.replays_claim(r.taken, r.released, 0, 4, 3, 1, slots) == 1
            shard_begin(r.words(0), 4)
            _replays.replays_log(r.taken, r.log, 0, 4, 3, slots[:1])  # then killed: no head
        assert buf.writers()[0]["torn"] == 1
        with SharedWriter(buf.name, 0, timeout=0.2) as w2:
            w2.push(one(3))  # the slot the dead writer took: free again
            with pytest.raises(TimeoutError):
                w2.push(one(4))
        assert sorted(buf.sample(4)["id"].tolist()) == [0, 1, 2, 3]
