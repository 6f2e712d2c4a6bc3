"""Shared-memory buffers: writers in other processes, exact-once FIFO, no torn rows, dead writers.

Multi-process tests start real processes (fork, and one spawn) that attach by name; nothing is
mocked. References: tests/naive.py (``shared_sample_slots``, ``fifo_merge``, ``draw_indices``) and
a plain ReplayBuffer given the same rows.
"""

from __future__ import annotations

import collections
import multiprocessing as mp
import os
import signal
import threading
import time
import tracemalloc
import warnings

import numpy as np
import pytest

import tfdata
from tfdata import ReplayBuffer, SpecError
from tfdata.errors import FormatError, SharedBufferError, WriterLostWarning
from tfdata.shared import SharedReplayBuffer, SharedWriter, region_nbytes

from . import naive
from .conftest import CARTPOLE, ODD, assert_batches_equal, random_rows, row

FORK = mp.get_context("fork")
# every field carries the row's id, so a row mixed from two writes is visible
ID_SPEC = {"id": "i8", "a": ("i8", (64,)), "b": "f8", "c": ("i2", (33,)), "d": "?"}


def id_rows(ids) -> dict:
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "a": np.repeat(ids[:, None], 64, axis=1), "b": ids.astype(np.float64),
            "c": np.repeat((ids % 30000)[:, None], 33, axis=1).astype(np.int16), "d": ids % 2 == 1}


def consistent(batch) -> np.ndarray:
    ids = np.asarray(batch["id"])
    ok = (np.asarray(batch["a"]) == ids[:, None]).all(1)
    ok &= np.asarray(batch["b"]) == ids
    ok &= (np.asarray(batch["c"]) == (ids % 30000)[:, None]).all(1)
    ok &= np.asarray(batch["d"]) == (ids % 2 == 1)
    return ok


def region_bytes(buf) -> bytes:
    return bytes(buf._region.map.at(0, np.uint8, (buf.nbytes,)))


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    """Regions of a test go to its own directory, so leftovers are visible and never shared."""
    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    return tmp_path


# -- one process --------------------------------------------------------------------------
@pytest.mark.parametrize("cap", [1, 7, 33])
def test_one_writer_samples_as_a_replay_buffer(layout, spec, cap, shm_dir):
    """Same seed, same rows (wrapping included): bit-identical batches to a ReplayBuffer."""
    rng = np.random.default_rng(cap)
    ref = ReplayBuffer(spec, cap, layout=layout, seed=5)
    with SharedReplayBuffer(spec, cap, layout=layout, seed=5) as buf, SharedWriter(buf.name, 0) as w:
        for step in range(6):
            rows = random_rows(spec, int(rng.integers(1, 2 * cap + 2)), rng)
            ref.extend(rows)
            w.extend(rows)
            one = row(random_rows(spec, 1, rng), 0)
            ref.push(one)
            w.push(one)
            assert len(buf) == len(ref)
            for b in (1, min(5, len(ref))):
                got, want = buf.sample(b, copy=True), ref.sample(b, copy=True)
                assert_batches_equal(dict(got), dict(want))
                np.testing.assert_array_equal(got.indices, want.indices)


def test_sample_matches_the_reference_and_is_layout_free(spec, shm_dir):
    rng = np.random.default_rng(0)
    cap, shards = 7, 3
    streams = [random_rows(spec, n, rng) for n in (3, 7, 12)]  # part full, full, wrapped
    out = {}
    for layout in ("aos", "soa"):
        with SharedReplayBuffer(spec, cap * shards, num_writers=shards, layout=layout, seed=9) as buf:
            for s, rows in enumerate(streams):
                with SharedWriter(buf.name, s) as w:
                    w.extend(rows)
            state = buf.sampler.state.copy()
            b = buf.sample(15, copy=True)
            slots, counter = naive.shared_sample_slots(int(state[0]), int(state[1]), [3, 7, 7], cap, 15)
            np.testing.assert_array_equal(b.indices, slots)
            assert buf.sampler.counter == counter
            for i, g in enumerate(slots):
                s, j = divmod(int(g), cap)
                n = len(streams[s][spec.names[0]])
                src = j if n <= cap else (n - cap) + (j - n) % cap  # row of the stream in slot j
                for f in spec.names:
                    np.testing.assert_array_equal(b[f][i], streams[s][f][src], err_msg=f)
            out[layout] = b
    assert_batches_equal(dict(out["aos"]), dict(out["soa"]))


def test_fifo_delivers_in_publication_order_exactly_once(layout, shm_dir):
    rng = np.random.default_rng(1)
    with SharedReplayBuffer(ID_SPEC, 3 * 33, num_writers=3, mode="fifo", layout=layout) as buf:
        writers = [SharedWriter(buf.name, s) for s in range(3)]
        published = [[] for _ in writers]
        got = []
        next_id = 0
        for _ in range(60):
            s = int(rng.integers(3))
            k = int(rng.integers(1, 9))
            if buf.writers()[s]["queued"] + k > 33:
                k = 33 - buf.writers()[s]["queued"]
            if k:
                ids = np.arange(next_id, next_id + k) + 1_000_000 * s
                writers[s].extend(id_rows(ids))
                stamp = int(buf._region.stamps[s * 33 + (writers[s].published - 1) % 33])
                published[s] += [(stamp, int(i)) for i in ids]
                next_id += k
            if rng.random() < 0.3 and len(buf) >= 4:
                b = buf.get_batch(4)
                assert consistent(b).all()
                got += [int(i) for i in b["id"]]
        for w in writers:
            w.close()
        for b in buf.batches(5, timeout=10):
            assert consistent(b).all()
            got += [int(i) for i in b["id"]]
        want = [r for _, r in naive.fifo_merge(published)]
        assert got == want
        assert len(buf) == 0 and [w["queued"] for w in buf.writers()] == [0, 0, 0]


def test_fifo_metrics(shm_dir):
    with SharedReplayBuffer(ID_SPEC, 8, num_writers=2, mode="fifo", policy="drop") as buf:
        w0, w1 = SharedWriter(buf.name, 0), SharedWriter(buf.name, 1)
        assert w0.extend(id_rows(range(6))) == 4  # room for 4: the newest 2 are dropped
        w1.push(row(id_rows([100]), 0))
        time.sleep(0.02)
        b = buf.get_batch(3)
        m = b.metrics
        assert list(b["id"]) == [0, 1, 2]
        assert m["rows"] == 3 and m["queued"] == 2
        assert m["dropped"] == 2 and m["dropped_since"] == 2
        assert m["oldest_age_s"] >= 0.02 and m["ingest_rows_per_s"] > 0
        assert w0.extend(id_rows([6, 7])) == 2
        b = buf.get_batch(3)
        assert list(b["id"]) == [3, 100, 6] and b.metrics["dropped_since"] == 0
        assert buf.writers()[0]["dropped"] == 2 and w0.dropped == 2


def test_fifo_block_waits_and_times_out(shm_dir):
    """A full shard makes the writer wait; a timeout says how many of the first rows went in."""
    with SharedReplayBuffer(ID_SPEC, 4, mode="fifo") as buf:
        w = SharedWriter(buf.name, 0, timeout=0.05)
        w.extend(id_rows(range(3)))
        w.push(row(id_rows([99]), 0))  # the fourth slot
        before = region_bytes(buf)
        with pytest.raises(TimeoutError, match="took no row.* 0 of 1 rows written"):
            w.push(row(id_rows([98]), 0))
        with pytest.raises(TimeoutError, match="0 of 2 rows written") as info:
            w.extend(id_rows([4, 5]))
        assert info.value.written == 0 and region_bytes(buf) == before
        assert [int(i) for i in buf.get_batch(1)["id"]] == [0]
        with pytest.raises(TimeoutError, match="1 of 2 rows written") as info:
            w.extend(id_rows([4, 5]))
        assert info.value.written == 1
        assert [int(i) for i in buf.get_batch(4)["id"]] == [1, 2, 99, 4]
        with pytest.raises(TimeoutError, match="0 rows queued"):
            buf.get_batch(1, timeout=0.01)
        with pytest.raises(ValueError, match="larger than the queue's capacity"):
            buf.get_batch(5)


@pytest.mark.parametrize("bad, match", [
    ({"id": 1.5}, "field 'id'.*float"),
    ({"a": np.zeros(63, np.int64)}, "field 'a'.*shape"),
    ({"c": np.full(33, 70000)}, "field 'c'"),
    ({"b": "x"}, "field 'b'"),
    ({"idd": 1}, "unknown field 'idd'"),
])
def test_bad_rows_raise_and_change_nothing(layout, bad, match, shm_dir):
    for mode in ("replay", "fifo"):
        with SharedReplayBuffer(ID_SPEC, 6, num_writers=2, mode=mode, layout=layout) as buf:
            w = SharedWriter(buf.name, 1)
            w.extend(id_rows([1, 2]))
            before = region_bytes(buf)
            good = row(id_rows([3]), 0)
            one = {**good, **bad}
            if "idd" in bad:
                del one["id"]
            with pytest.raises(SpecError, match=match):
                w.push(one)
            batch = {k: np.stack([v, v]) if isinstance(v, np.ndarray) else [v, v] for k, v in one.items()}
            with pytest.raises(SpecError, match=match):
                w.extend(batch)
            assert region_bytes(buf) == before
            assert w.published == 2 and len(buf) == 2


def test_attach_errors_and_close(shm_dir):
    buf = SharedReplayBuffer(ID_SPEC, 4, num_writers=2, name="attach-test")
    assert buf.path == os.path.join(str(shm_dir), "tfdata-shm-attach-test")
    with pytest.raises(FileExistsError):
        SharedReplayBuffer(ID_SPEC, 4, num_writers=2, name="attach-test")
    w = SharedWriter("attach-test", 0)
    with pytest.raises(SharedBufferError, match="live writer"):
        SharedWriter("attach-test", 0)
    with pytest.raises(ValueError, match="shard must be in"):
        SharedWriter("attach-test", 2)
    with pytest.raises(FileNotFoundError, match="no shared buffer"):
        SharedWriter("no-such-buffer", 0)
    with pytest.raises(ValueError, match="name must be"):
        SharedWriter("no spaces!", 0)
    SharedWriter(buf.path, 1).close()  # by path too
    w.push(row(id_rows([1]), 0))
    buf.close()
    assert not os.path.exists(buf.path) and buf.closed
    with pytest.raises(SharedBufferError, match="closed by its owner"):
        w.push(row(id_rows([2]), 0))
    w.close()
    with pytest.raises(SharedBufferError, match="closed"):
        w.push(row(id_rows([2]), 0))


def test_wrong_mode_and_arguments(shm_dir):
    with pytest.raises(ValueError, match="multiple of num_writers"):
        SharedReplayBuffer(ID_SPEC, 10, num_writers=3)
    with pytest.raises(ValueError, match="policy applies to mode='fifo'"):
        SharedReplayBuffer(ID_SPEC, 10, policy="drop")
    with pytest.raises(ValueError, match="policy must be"):
        SharedReplayBuffer(ID_SPEC, 10, mode="fifo", policy="overwrite")
    with pytest.raises(ValueError, match="mode must be"):
        SharedReplayBuffer(ID_SPEC, 10, mode="lifo")
    with SharedReplayBuffer(ID_SPEC, 10) as buf:
        with pytest.raises(SharedBufferError, match="use sample"):
            buf.get_batch(1)
        with pytest.raises(ValueError, match="empty"):
            buf.sample(1)
        with SharedWriter(buf.name, 0) as w:
            w.extend(id_rows([1, 2]))
        with pytest.raises(ValueError, match="larger than the 2 rows held"):
            buf.sample(3)
        buf.sample(1)
        for bad in (True, 1.0, 0, -1):
            with pytest.raises((TypeError, ValueError), match="batch_size"):
                buf.sample(bad)
    with SharedReplayBuffer(ID_SPEC, 10, mode="fifo") as buf:
        with pytest.raises(SharedBufferError, match="use get_batch"):
            buf.sample(1)
    with pytest.raises(TypeError, match="seed"):
        SharedReplayBuffer(ID_SPEC, 10, seed=1.5)
    with pytest.raises(ValueError, match="ring_size"):
        SharedReplayBuffer(ID_SPEC, 10, ring_size=0)
    assert not os.listdir(shm_dir)  # refused constructions leave no region behind


def test_hostile_region_descriptions(shm_dir):
    buf = SharedReplayBuffer(ID_SPEC, 4, name="hostile")
    doc = os.path.join(buf.path, "region.json")
    good = open(doc).read()
    for text, match in [("{", "not valid JSON"), ('{"format": "pickle"}', "format is not"),
                        (good.replace('"version": 1', '"version": 2'), "version 2"),
                        (good.replace('"num_writers": 1', '"num_writers": 0'), "not a valid")]:
        with open(doc, "w") as f:
            f.write(text)
        with pytest.raises(FormatError, match=match):
            SharedWriter("hostile", 0)
    with open(doc, "w") as f:
        f.write(good.replace('"shard_capacity": 4', '"shard_capacity": 4000'))
    with pytest.raises(FormatError, match="region file holds"):
        SharedWriter("hostile", 0)
    buf.close()


def test_region_size_and_steady_state_allocates_nothing(layout, shm_dir):
    with SharedReplayBuffer(CARTPOLE, 4096, num_writers=2, layout=layout, seed=0) as buf:
        assert buf.nbytes == region_nbytes(CARTPOLE, 4096, num_writers=2, layout=layout)
        row_bytes = buf.spec.aos_dtype.itemsize if layout == "aos" else buf.spec.row_nbytes
        assert 4096 * row_bytes < buf.nbytes <= 4096 * row_bytes + 2 * 4096  # + control words
        w = SharedWriter(buf.name, 1)
        rows = random_rows(buf.spec, 8, np.random.default_rng(0))
        one = row(rows, 0)
        for _ in range(300):
            w.extend(rows)
            w.push(one)
        buf.sample(256)
        tracemalloc.start()
        try:
            base, _ = tracemalloc.get_traced_memory()
            for _ in range(300):
                w.extend(rows)
                w.push(one)
                buf.sample(256)
            current, _ = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert current - base < 1024, current - base
        w.close()


@pytest.mark.parametrize("kw", [{}, {"prioritized": True}], ids=["uniform", "prioritized"])
def test_bookkeeping_counts_the_shard_rows_arrays(kw, shm_dir):
    """The shard rows part's arrays (its scratch: a heads snapshot and one mark per row of the
    largest batch) are bytes of this process: counted, and growing with the batch they serve."""
    with SharedReplayBuffer(CARTPOLE, 1024, num_writers=2, seed=0, **kw) as buf, \
            SharedWriter(buf.name, 0) as w:
        w.extend(random_rows(buf.spec, 600, np.random.default_rng(0)))
        buf.sample(4)
        before = buf.nbytes_parts
        buf.sample(500)
        after = buf.nbytes_parts
        assert after["bookkeeping"] - before["bookkeeping"] >= 8 * (500 - 4)
        assert after["bookkeeping"] >= 8 * (7 * 2 + 500)

def test_kernel_fifo_plan_against_reference():
    from tfdata import kernels

    rng = np.random.default_rng(3)
    for trial in range(50):
        shards, cap = int(rng.integers(1, 5)), int(rng.integers(1, 9))
        tails = rng.integers(0, 20, shards).astype(np.uint64)
        heads = (tails + rng.integers(0, cap + 1, shards)).astype(np.uint64)
        stamps = np.zeros(shards * cap, np.uint64)
        published = []
        for s in range(shards):
            rows = list(range(int(tails[s]), int(heads[s])))
            st = np.sort(rng.integers(0, 50, len(rows)))  # ties across shards are common
            for r, t in zip(rows, st):
                stamps[s * cap + r % cap] = t
            published.append([(int(t), r) for r, t in zip(rows, st)])
        want = naive.fifo_merge(published)
        batch = int(rng.integers(1, 12))
        cursors = np.zeros(2 * shards, np.int64)
        slots, info = np.zeros(batch, np.int64), np.zeros(4, np.int64)
        dropped = np.zeros(shards, np.uint64)
        for partial in (False, True):
            k = kernels.fifo_plan(heads, tails, dropped, stamps, cap, batch, partial, cursors, slots, info)
            take = min(batch, len(want)) if partial or len(want) >= batch else 0
            assert k == take and info[0] == len(want)
            assert [(int(g) // cap, int(g) % cap) for g in slots[:k]] == [(s, r % cap) for s, r in want[:k]]
            got_tails = [int(tails[s]) + sum(1 for b, _ in want[:k] if b == s) for s in range(shards)]
            assert list(cursors[:shards]) == got_tails


def test_sample_skips_slots_being_written(layout, shm_dir):
    """Rows a writer has begun and not published are never sampled (nor are the rows their
    slots held); every other held row is, uniformly (reference: naive.shared_sample_slots)."""
    with SharedReplayBuffer(ID_SPEC, 14, num_writers=2, layout=layout, seed=4) as buf:
        with SharedWriter(buf.name, 0) as w0:
            w0.extend(id_rows(range(3)))  # shard 0 holds rows 0..2 in slots 0..2
        w = SharedWriter(buf.name, 1)
        w.extend(id_rows(100 + np.arange(10)))  # rows 3..9 stay: row r in slot 7 + r % 7
        buf._k.shard_begin(w._words, 12)  # rows 10, 11 begun: slots 10 and 11 (rows 3, 4)
        assert buf.writers()[1]["torn"] == 2 and buf.writers()[0]["torn"] == 0
        state = buf.sampler.state.copy()
        ids = np.concatenate([np.array(buf.sample(10)["id"]) for _ in range(200)])
        assert set(ids) == {0, 1, 2, 105, 106, 107, 108, 109}
        # draws follow the reference; a draw that lands in flight is drawn again
        slots, _ = naive.shared_sample_slots(int(state[0]), int(state[1]), [3, 7], 7, 10)
        buf.sampler.state[:] = state
        got = buf.sample(10).indices
        assert all(int(g) not in (10, 11) for g in got)
        keep = np.array([g not in (10, 11) for g in slots])
        assert not keep.all()  # the seed makes at least one draw land in flight
        np.testing.assert_array_equal(got[keep], slots[keep])  # untouched draws are the reference's
        w.extend(id_rows([110, 111]))  # published: everything is back
        ids = np.concatenate([np.array(buf.sample(10)["id"]) for _ in range(200)])
        assert set(ids) == {0, 1, 2} | set(range(105, 112))
        assert buf.writers()[1]["torn"] == 0
        w.close()


def test_control_word_positions_agree_with_the_kernels():
    from tfdata.kernels import _shared
    from tfdata.shared import region

    assert (region.HEAD, region.DROPPED, region.RESERVED) == (_shared.HEAD, _shared.DROPPED,
                                                              _shared.RESERVED)


# -- real processes -------------------------------------------------------------------------
def _fifo_worker(name, shard, n, cap, seed, errors):
    try:
        rng = np.random.default_rng(seed)
        with SharedWriter(name, shard, timeout=60) as w:
            i = 0
            while i < n:
                k = min(int(rng.integers(1, cap + 1)), n - i)
                ids = np.arange(i, i + k) + 1_000_000 * shard
                if k == 1 and rng.random() < 0.5:
                    w.push(row(id_rows(ids), 0))
                else:
                    w.extend(id_rows(ids))
                i += k
    except BaseException as exc:  # reported to the test, which fails
        errors.put(f"shard {shard}: {exc!r}")


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_fifo_exact_once_with_worker_processes(layout, shm_dir):
    """3 processes write known streams through 7-slot shards (so they block often); the learner
    sees every row exactly once, each shard in order, and the counts match."""
    n, cap = 3000, 7
    errors = FORK.Queue()
    with SharedReplayBuffer(ID_SPEC, 3 * cap, num_writers=3, mode="fifo", layout=layout) as buf:
        procs = [FORK.Process(target=_fifo_worker, args=(buf.name, s, n, cap, s, errors)) for s in range(3)]
        for p in procs:
            p.start()
        got = []
        for b in buf.batches(5, timeout=60):
            assert consistent(b).all()
            got.append(np.array(b["id"]))
        for p in procs:
            p.join(30)
        assert errors.empty(), errors.get()
        ids = np.concatenate(got)
        assert len(ids) == 3 * n and len(np.unique(ids)) == 3 * n
        for s in range(3):
            mine = ids[ids // 1_000_000 == s] - 1_000_000 * s
            np.testing.assert_array_equal(mine, np.arange(n))  # each shard in its own order
        assert [w["published"] for w in buf.writers()] == [n] * 3
        assert [w["state"] for w in buf.writers()] == ["finished"] * 3


def _replay_worker(name, shard, stop, errors):
    try:
        with SharedWriter(name, shard) as w:
            i = 0
            while not stop.is_set():
                w.extend(id_rows(np.arange(i, i + 64) + 1_000_000 * shard))
                w.push(row(id_rows([i + 64 + 1_000_000 * shard]), 0))
                i += 65
    except BaseException as exc:
        errors.put(f"shard {shard}: {exc!r}")


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_no_torn_rows_while_worker_processes_write(layout, shm_dir):
    """Two processes overwrite their rings as fast as they can while the learner samples. Every
    sampled row is whole; reading the same memory without the protocol (the control) does see
    rows mixed from two writes, so this test can fail. Runs until 10,000 rows were sampled and
    the control saw a torn row (time cap: 300 s), not for a fixed time: the count reached in
    a given time depends on the machine."""
    errors, stop = FORK.Queue(), FORK.Event()
    with SharedReplayBuffer(ID_SPEC, 2 * 512, num_writers=2, layout=layout, seed=0) as buf:
        procs = [FORK.Process(target=_replay_worker, args=(buf.name, s, stop, errors)) for s in range(2)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 60
        while len(buf) < 2 * 512 and time.monotonic() < deadline:
            time.sleep(0.01)
        fields = {f: buf.storage.field(f) for f in ID_SPEC}
        sampled = torn_raw = 0
        deadline = time.monotonic() + 300
        while (sampled < 10_000 or torn_raw == 0) and time.monotonic() < deadline:
            b = buf.sample(256)
            assert consistent(b).all(), b["id"][~consistent(b)]
            sampled += 256
            idx = np.random.default_rng(sampled).integers(0, 1024, 256)
            raw = {f: v[idx] for f, v in fields.items()}  # no protocol: field by field
            torn_raw += int((~consistent(raw)).sum())
        stop.set()
        for p in procs:
            p.join(30)
        assert errors.empty(), errors.get()
    assert sampled >= 10_000
    assert torn_raw > 0, "the control saw no torn row: the writers did not race the reader"


def _dying_worker(name, shard, n_ok, n_torn):
    w = SharedWriter(name, shard)
    w.extend(id_rows(np.arange(n_ok) + 1_000_000 * shard))
    # begin writing n_torn rows, write junk into their slots, and die before publishing them
    r = w._region
    w._k.shard_begin(w._words, w.published + n_torn)
    start = w._base + w.published % w._cap
    r.storage.write_rows(start, w.spec.check_batch(id_rows(np.full(n_torn, -1)))[1], 0, n_torn)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("mode", ["replay", "fifo"])
def test_a_writer_killed_mid_write_corrupts_nothing_and_is_reported(layout, mode, shm_dir):
    cap = 33
    n_ok = 40 if mode == "replay" else 20  # replay: the ring has wrapped; the torn slots held rows
    with SharedReplayBuffer(ID_SPEC, 2 * cap, num_writers=2, mode=mode, layout=layout, seed=1) as buf:
        p = FORK.Process(target=_dying_worker, args=(buf.name, 0, n_ok, 5))
        p.start()
        p.join(30)
        assert p.exitcode == -signal.SIGKILL
        with SharedWriter(buf.name, 1) as w:
            w.extend(id_rows(1_000_000 + np.arange(10)))
        state = buf.writers()[0]
        assert state["state"] == "dead" and state["torn"] == 5 and state["published"] == n_ok
        with pytest.warns(WriterLostWarning, match="shard 0 .* died"):
            lost = buf.lost_writers
        assert lost == [{"shard": 0, "pid": p.pid, "published": n_ok, "torn": 5}]
        if mode == "replay":
            ids = np.concatenate([np.array(buf.sample(32)["id"]) for _ in range(200)])
            assert (ids >= 0).all()  # no junk row
            held = set(range(n_ok - cap, n_ok)) - set(range(n_ok - cap, n_ok - cap + 5))
            assert set(ids[ids < 1_000_000]) == held  # the 5 slots being overwritten are out
        else:
            ids = np.concatenate([np.array(b["id"]) for b in buf.batches(8, timeout=10)])
            assert sorted(ids[ids < 1_000_000]) == list(range(n_ok))
        # a new writer takes the dead writer's shard over and rewrites the torn slots
        with SharedWriter(buf.name, 0) as w:
            assert w.published == n_ok
            w.extend(id_rows(np.arange(n_ok, n_ok + 5)))
        assert buf.writers()[0]["torn"] == 0 and buf.writers()[0]["state"] == "finished"
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the same death is reported once
            buf.lost_writers


def _spawn_worker(name, n):
    import numpy as np  # noqa: F401 - a fresh interpreter

    from tfdata.shared import SharedWriter as W

    with W(name, 0) as w:
        w.extend(id_rows(np.arange(n)))
        try:
            w.push({"id": 1.5, "a": np.zeros(64, np.int64), "b": 0.0, "c": np.zeros(33, np.int16),
                    "d": False})
        except SpecError as exc:
            assert "field 'id'" in str(exc)
        else:
            raise AssertionError("a float id was accepted")


def test_a_spawned_process_attaches_by_name(shm_dir):
    ctx = mp.get_context("spawn")
    with SharedReplayBuffer(ID_SPEC, 64, mode="fifo", layout="soa") as buf:
        p = ctx.Process(target=_spawn_worker, args=(buf.name, 50))
        p.start()
        ids = np.concatenate([np.array(b["id"]) for b in buf.batches(16, timeout=120)])
        p.join(60)
        assert p.exitcode == 0
        np.testing.assert_array_equal(ids, np.arange(50))
        assert buf.writers()[0]["published"] == 50


def _close_in_child(buf):
    buf.close()  # the child's copy of the owner object (fork): must leave the region alone


def test_a_forked_child_does_not_remove_the_region(shm_dir):
    with SharedReplayBuffer(ID_SPEC, 4) as buf:
        p = FORK.Process(target=_close_in_child, args=(buf,))
        p.start()
        p.join(30)
        assert p.exitcode == 0 and os.path.isdir(buf.path) and not buf._region.closed
        SharedWriter(buf.name, 0).close()
    assert not os.path.exists(buf.path)


def _owner_killed(conn):
    buf = SharedReplayBuffer(ID_SPEC, 4, name="orphan")
    with SharedWriter(buf.name, 0) as w:
        w.extend(id_rows([1, 2]))
    conn.send(buf.path)
    os.kill(os.getpid(), signal.SIGKILL)


def test_regions_of_dead_owners_are_swept(shm_dir):
    """A learner killed without closing leaves its region; the next buffer built removes it,
    and never a region whose owner lives."""
    from tfdata.shared import sweep

    live = SharedReplayBuffer(ID_SPEC, 4)
    here, there = FORK.Pipe()
    p = FORK.Process(target=_owner_killed, args=(there,))
    p.start()
    path = here.recv()
    p.join(30)
    assert p.exitcode == -signal.SIGKILL and os.path.isdir(path)
    w = SharedWriter("orphan", 1 - 1)  # attaching to an orphan works until it is swept
    with SharedReplayBuffer(ID_SPEC, 4) as other:
        assert not os.path.exists(path) and os.path.isdir(live.path) and os.path.isdir(other.path)
    with pytest.raises(SharedBufferError, match="closed by its owner"):
        w.push(row(id_rows([3]), 0))
    assert sweep() == [] and os.path.isdir(live.path)
    live.close()
    assert not os.listdir(shm_dir)


def _learner_then_killed(conn):
    buf = SharedReplayBuffer(ID_SPEC, 4, mode="fifo", name="doomed")
    conn.send(buf.path)
    conn.recv()  # the writer is attached
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_blocked_writer_learns_that_the_learner_died(shm_dir):
    here, there = FORK.Pipe()
    p = FORK.Process(target=_learner_then_killed, args=(there,))
    p.start()
    here.recv()
    w = SharedWriter("doomed", 0, timeout=20)  # a failure, not a hang, if the death goes unseen
    w.extend(id_rows(range(4)))  # the queue is full
    here.send("go")
    p.join(30)
    with pytest.raises(SharedBufferError, match="has ended: no one will take rows .0 of 1"):
        w.push(row(id_rows([4]), 0))
    w.close()
    from tfdata.shared import sweep

    assert len(sweep()) == 1 and not os.listdir(shm_dir)


def _write_with_inherited(w, conn):
    try:
        w.push(row(id_rows([7]), 0))
    except SharedBufferError as exc:
        conn.send(str(exc))
    else:
        conn.send("written")


def test_a_forked_child_cannot_write_through_its_parents_writer(shm_dir):
    with SharedReplayBuffer(ID_SPEC, 4) as buf, SharedWriter(buf.name, 0) as w:
        w.push(row(id_rows([1]), 0))
        here, there = FORK.Pipe()
        p = FORK.Process(target=_write_with_inherited, args=(w, there))
        p.start()
        assert "made before a fork" in here.recv()
        p.join(30)
        assert w.published == 1 and len(buf) == 1
        w.push(row(id_rows([2]), 0))  # the parent's writer still works
        assert len(buf) == 2


def test_public_names():
    assert tfdata.SharedReplayBuffer is SharedReplayBuffer and tfdata.SharedWriter is SharedWriter


# -- review: tests added for bugs found and for mutants the suite missed -----------------------
def _slot_of(shard: int, row: int, cap: int) -> int:
    return shard * cap + row % cap


def test_fifo_batch_indices_are_the_slots(layout, shm_dir):
    """``batch.indices`` of a FIFO batch are the region slots its rows came from (slot
    ``shard * C + row % C``), as get_batch documents; wrapped rows and a partial batch too."""
    cap = 5
    with SharedReplayBuffer(ID_SPEC, 2 * cap, num_writers=2, mode="fifo", layout=layout) as buf:
        w0, w1 = SharedWriter(buf.name, 0), SharedWriter(buf.name, 1)
        slot = {}
        w1.extend(id_rows([10, 11, 12]))  # shard 1, rows 0..2
        slot.update({10: _slot_of(1, 0, cap), 11: _slot_of(1, 1, cap), 12: _slot_of(1, 2, cap)})
        w0.extend(id_rows([0, 1]))  # shard 0, rows 0..1
        slot.update({0: _slot_of(0, 0, cap), 1: _slot_of(0, 1, cap)})
        b = buf.get_batch(5)
        assert sorted(int(i) for i in b["id"]) == [0, 1, 10, 11, 12]
        assert list(b.indices) == [slot[int(i)] for i in b["id"]]
        w1.extend(id_rows([13, 14, 15, 16]))  # shard 1, rows 3..6: slots 8, 9, then 5, 6 (wrapped)
        slot.update({13 + j: _slot_of(1, 3 + j, cap) for j in range(4)})
        b = buf.get_batch(4, copy=True)
        assert list(b["id"]) == [13, 14, 15, 16] and list(b.indices) == [8, 9, 5, 6]
        w0.push(row(id_rows([2]), 0))  # shard 0, row 2
        w0.close()
        w1.close()
        b = buf.get_batch(3, timeout=0, partial=True)
        assert list(b["id"]) == [2] and list(b.indices) == [_slot_of(0, 2, cap)]


@pytest.mark.parametrize("kwargs", [{"seed": "1"}, {"seed": 1.5}])
def test_a_refused_buffer_leaves_no_region(kwargs, shm_dir):
    """An argument refused by the constructor leaves nothing in the directory, even while the
    exception (and its traceback, which holds the half-built object) is alive; the name is free."""
    with pytest.raises(TypeError, match="seed") as info:
        SharedReplayBuffer(ID_SPEC, 4, name="refused", **kwargs)
    assert os.listdir(shm_dir) == []
    SharedReplayBuffer(ID_SPEC, 4, name="refused", seed=1).close()
    assert info.value is not None and os.listdir(shm_dir) == []


def _blocking_worker(name, shard, n, conn):
    try:
        with SharedWriter(name, shard, timeout=3) as w:
            w.extend(id_rows(np.arange(n)))
        conn.send("done")
    except BaseException as exc:
        conn.send(repr(exc))


def test_fifo_batch_larger_than_a_shard_cannot_deadlock(shm_dir):
    """get_batch accepts any batch up to the capacity, but a shard holds only C rows: with the
    other shard's writer finished, a writer blocked on its full shard and a learner waiting for
    a batch of more than C rows wait on each other. Such a batch must be refused at once, or
    every row must still be delivered."""
    with SharedReplayBuffer(ID_SPEC, 2 * 4, num_writers=2, mode="fifo") as buf:
        SharedWriter(buf.name, 1).close()  # shard 1's writer is done (it wrote nothing)
        here, there = FORK.Pipe()
        p = FORK.Process(target=_blocking_worker, args=(buf.name, 0, 20, there))
        p.start()
        try:
            try:
                ids = np.concatenate([np.array(b["id"]) for b in buf.batches(6, timeout=60)])
            except ValueError as exc:  # refused up front, naming the shard capacity
                assert "shard" in str(exc)
            else:
                np.testing.assert_array_equal(ids, np.arange(20))
                assert here.recv() == "done"
        finally:
            p.kill()
            p.join(10)


class _StepClock:
    """A monotonic clock that advances ``step`` seconds at every read, as on a loaded machine
    where a thread is preempted between two reads; ``sleep`` returns at once."""

    def __init__(self, step: float):
        self.now, self.step = 1000.0, step

    def monotonic(self) -> float:
        self.now += self.step
        return self.now

    monotonic_ns = staticmethod(time.monotonic_ns)

    def sleep(self, seconds: float) -> None:
        pass


def test_partial_get_batch_returns_the_queued_rows_when_its_timeout_ends(shm_dir, monkeypatch):
    """get_batch(partial=True, timeout=t) returns the rows queued when the timeout ends; it
    raises TimeoutError only with nothing queued. The deadline must be judged once per round:
    reading the clock twice let the deadline fall between the partial check and the raise."""
    from tfdata.shared import fifo

    with SharedReplayBuffer(ID_SPEC, 8, mode="fifo") as buf, SharedWriter(buf.name, 0) as w:
        w.extend(id_rows([7, 8]))
        for step in (0.01, 0.004, 0.0015):
            monkeypatch.setattr(fifo, "time", _StepClock(step))
            b = buf.get_batch(5, timeout=0.015, partial=True)
            monkeypatch.undo()
            assert list(b["id"]) == [7, 8]
            w.extend(id_rows([7, 8]))


def _writer_with_forked_child(name, conn):
    w = SharedWriter(name, 0)
    w.extend(id_rows([1, 2]))
    r, wfd = os.pipe()
    pid = os.fork()  # e.g. an environment worker the rollout process forks
    if pid == 0:
        os.write(wfd, b"x")  # running: whatever it does at fork is done
        time.sleep(5)
        os._exit(0)
    os.read(r, 1)
    conn.send(pid)
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_dead_writer_is_seen_dead_while_its_forked_child_lives(shm_dir):
    """A child forked by a writer process inherits its descriptors; the writer's lock must not
    outlive the writer in it, or its death is never noticed and the shard cannot be taken over."""
    with SharedReplayBuffer(ID_SPEC, 8, num_writers=2) as buf:
        here, there = FORK.Pipe()
        p = FORK.Process(target=_writer_with_forked_child, args=(buf.name, there))
        p.start()
        child = here.recv()
        try:
            deadline = time.monotonic() + 10
            while p.exitcode is None and time.monotonic() < deadline:  # not join(timeout): that
                time.sleep(0.005)  # waits on a pipe the grandchild inherited too
            assert p.exitcode == -signal.SIGKILL
            assert buf.writers()[0]["state"] == "dead"
            with pytest.warns(WriterLostWarning):
                assert [d["shard"] for d in buf.lost_writers] == [0]
            with SharedWriter(buf.name, 0) as w:
                assert w.published == 2
        finally:
            os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize("k", [1, 2])
def test_a_takeover_writing_fewer_rows_keeps_the_dead_writers_slots_out(layout, k, shm_dir):
    """A writer killed while writing rows 40..44 of a wrapped 33-slot shard left junk in their
    slots (which held rows 7..11). A new writer that writes only k rows rewrites k of those
    slots; the other 5 - k still hold junk and must stay out of samples (and count as torn)."""
    cap = 33
    with SharedReplayBuffer(ID_SPEC, 2 * cap, num_writers=2, layout=layout, seed=3) as buf:
        p = FORK.Process(target=_dying_worker, args=(buf.name, 0, 40, 5))
        p.start()
        p.join(30)
        assert p.exitcode == -signal.SIGKILL
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WriterLostWarning)
            with SharedWriter(buf.name, 0) as w:
                if k == 1:
                    w.push(row(id_rows([40]), 0))
                else:
                    w.extend(id_rows([40, 41]))
            assert buf.writers()[0]["torn"] == 5 - k
            ids = np.concatenate([np.array(buf.sample(32)["id"]) for _ in range(200)])
        assert (ids >= 0).all(), f"{int((ids < 0).sum())} junk rows sampled"
        assert set(ids) == set(range(12, 40 + k))


def _dying_worker_wrapping(name, shard, n_ok, n_torn):
    """As _dying_worker, writing the junk rows where a writer puts them: wrapping at the end
    of the shard."""
    w = SharedWriter(name, shard)
    w.extend(id_rows(np.arange(n_ok) + 1_000_000 * shard))
    w._k.shard_begin(w._words, w.published + n_torn)
    junk = w.spec.check_batch(id_rows(np.full(n_torn, -1)))[1]
    for j in range(n_torn):
        w._region.storage.write_rows(w._base + (w.published + j) % w._cap, junk, j, 1)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("n_ok, shard", [(64, 0), (40, 1)])
def test_a_writer_killed_mid_write_keeps_its_slots_out_on_any_shard_and_across_the_wrap(
        layout, n_ok, shard, shm_dir):
    """As the killed-writer test, with the 5 slots in flight wrapping past the end of the shard
    (rows 64..68 of 33 slots: slots 31, 32, 0, 1, 2), and on shard 1 whose head's slot differs
    from shard 0's (the window is per shard)."""
    cap = 33
    with SharedReplayBuffer(ID_SPEC, 2 * cap, num_writers=2, layout=layout, seed=2) as buf:
        other = 1 - shard
        with SharedWriter(buf.name, other) as w:
            w.extend(id_rows(1_000_000 * other + np.arange(3)))  # another head's slot: 3
        p = FORK.Process(target=_dying_worker_wrapping, args=(buf.name, shard, n_ok, 5))
        p.start()
        p.join(30)
        assert p.exitcode == -signal.SIGKILL
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", WriterLostWarning)
            ids = np.concatenate([np.array(buf.sample(32)["id"]) for _ in range(300)])
        mine = ids[ids // 1_000_000 == shard] - 1_000_000 * shard
        assert (ids >= 0).all(), f"{int((ids < 0).sum())} junk rows sampled"
        assert set(mine) == set(range(n_ok - cap + 5, n_ok))


def _attach_close_loop(name, stop):
    while not stop.is_set():
        SharedWriter(name, 0).close()


def test_a_writer_that_closes_is_never_reported_dead(shm_dir):
    """A writer process attaches and closes over and over while the learner watches: between the
    learner's reads of the state word and of the lock, a writer may finish; it is then
    finished, never dead, and no WriterLostWarning is raised. Runs until each state was seen
    1,000 times (time cap: 300 s), not for a fixed time: the writer may start late."""
    stop = FORK.Event()
    with SharedReplayBuffer(ID_SPEC, 4) as buf:
        p = FORK.Process(target=_attach_close_loop, args=(buf.name, stop))
        p.start()
        try:
            states = collections.Counter()
            deadline = time.monotonic() + 300
            with warnings.catch_warnings():
                warnings.simplefilter("error", WriterLostWarning)
                while (min(states["attached"], states["finished"]) < 1000
                       and time.monotonic() < deadline):
                    states[buf.writers()[0]["state"]] += 1
                    buf.lost_writers
        finally:
            stop.set()
            p.join(30)
        assert states["dead"] == 0 and min(states["attached"], states["finished"]) >= 1000, states
        assert buf.lost_writers == []


def _blocked_writer(name, conn):
    try:
        with SharedWriter(name, 0, timeout=60) as w:
            conn.send("attached")
            w.extend(id_rows(np.arange(6)))  # the shard holds 2: blocks after 2 rows
        conn.send("finished")
    except BaseException as exc:
        conn.send(repr(exc))


def test_a_writer_blocked_on_a_full_shard_fails_when_the_owner_closes(shm_dir):
    """Writers still attached get SharedBufferError at their next write: a writer already
    waiting for room too, saying how many rows went in, not after its timeout (60 s: the
    message tells the close from the timeout, whatever the machine's speed)."""
    here, there = FORK.Pipe()
    buf = SharedReplayBuffer(ID_SPEC, 2, mode="fifo")
    p = FORK.Process(target=_blocked_writer, args=(buf.name, there))
    p.start()
    try:
        assert here.recv() == "attached"
        while buf.writers()[0]["queued"] < 2:
            time.sleep(0.005)
        time.sleep(0.05)  # the writer is waiting for room now
        buf.close()
        assert here.poll(120), "the blocked writer did not notice the close"
        msg = here.recv()
        assert "SharedBufferError" in msg and "closed by its owner" in msg and "2 of 6" in msg
    finally:
        p.kill()
        p.join(10)


def test_fifo_metrics_oldest_age_is_the_batchs_oldest_row(shm_dir):
    with SharedReplayBuffer(ID_SPEC, 4, num_writers=1, mode="fifo") as buf, SharedWriter(buf.name, 0) as w:
        w.push(row(id_rows([0]), 0))
        time.sleep(0.2)
        w.push(row(id_rows([1]), 0))
        b = buf.get_batch(2)
        assert list(b["id"]) == [0, 1] and b.metrics["oldest_age_s"] >= 0.2


def _use_and_close(mode):
    with SharedReplayBuffer(ID_SPEC, 2 * 16, num_writers=2, mode=mode) as buf:
        for _ in range(3):
            with SharedWriter(buf.name, 1) as w:
                w.push(row(id_rows([1]), 0))
                w.extend(id_rows([2, 3]))
            SharedWriter(buf.name, 1).close()  # the lock was released (else SharedBufferError)


def _fd_targets() -> list:
    return sorted(os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{fd}"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
@pytest.mark.parametrize("mode", ["replay", "fifo"])
def test_closed_buffers_and_writers_leave_no_descriptor(mode, shm_dir):
    """Every descriptor a buffer or a writer opened (owner lock, writer lock, the maps' own)
    is closed once they are closed and collected; a closed writer's shard can be attached
    again at once."""
    import gc

    _use_and_close(mode)  # imports and compiles first
    gc.collect()
    before = _fd_targets()
    for _ in range(3):
        _use_and_close(mode)
    gc.collect()
    assert _fd_targets() == before
    assert os.listdir(shm_dir) == []


def _attach_and_drop(name):
    w = SharedWriter(name, 0)
    w.push(row(id_rows([1]), 0))
    w.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
@pytest.mark.parametrize("mode", ["replay", "fifo"])
def test_a_dropped_writer_unmaps_without_the_cyclic_gc(mode, shm_dir):
    """A writer that is closed and dropped lets go of its map of the region (and the descriptor
    the map keeps) at once, by reference counting: a worker that drops its writer must not pin
    the region's shared memory, after the owner removed it, until a cyclic collection."""
    import gc

    with SharedReplayBuffer(ID_SPEC, 8, mode=mode) as buf:
        _attach_and_drop(buf.name)  # imports and compiles first
        gc.collect()
        before = _fd_targets()
        gc.disable()
        try:
            for _ in range(3):
                _attach_and_drop(buf.name)
            after = _fd_targets()
        finally:
            gc.enable()
        assert after == before


def test_fifo_every_shards_tail_advances(shm_dir):
    """Rows delivered are gone from every shard's queue, the last shard's too."""
    with SharedReplayBuffer(ID_SPEC, 3 * 4, num_writers=3, mode="fifo") as buf:
        ws = [SharedWriter(buf.name, s) for s in range(3)]
        for s, w in enumerate(ws):
            w.extend(id_rows(100 * s + np.arange(3)))
        got = [int(i) for _ in range(3) for i in buf.get_batch(3)["id"]]
        assert sorted(got) == [0, 1, 2, 100, 101, 102, 200, 201, 202]
        assert len(buf) == 0 and [d["queued"] for d in buf.writers()] == [0, 0, 0]
        with pytest.raises(TimeoutError):
            buf.get_batch(1, timeout=0.02)
        for w in ws:
            w.extend(id_rows([7, 7, 7, 7]))  # the shard is free again: room for 4 each
            w.close()
        assert len(buf) == 12


def test_a_death_is_reported_once(shm_dir):
    with SharedReplayBuffer(ID_SPEC, 2 * 8, num_writers=2) as buf:
        p = FORK.Process(target=_dying_worker, args=(buf.name, 0, 3, 1))
        p.start()
        p.join(30)
        with pytest.warns(WriterLostWarning) as record:
            first = buf.lost_writers
            second = buf.lost_writers
            buf.writers()
        assert len([r for r in record if issubclass(r.category, WriterLostWarning)]) == 1
        assert first == second == [{"shard": 0, "pid": p.pid, "published": 3, "torn": 1}]


def test_partial_get_batch_returns_at_once_when_every_writer_is_done(shm_dir):
    """partial=True: 'at once when every writer has finished or died and fewer rows remain',
    even without a timeout (none given: a call that waited for one would never return; a
    thread lets the test fail instead of hanging)."""
    with SharedReplayBuffer(ID_SPEC, 2 * 8, num_writers=2, mode="fifo") as buf:
        with SharedWriter(buf.name, 0) as w:
            w.extend(id_rows([1, 2]))
        SharedWriter(buf.name, 1).close()
        got = []
        t = threading.Thread(target=lambda: got.append(buf.get_batch(5, partial=True, copy=True)),
                             daemon=True)
        t.start()
        t.join(120)
        assert not t.is_alive(), "get_batch(partial=True) waited with every writer done"
        assert list(got[0]["id"]) == [1, 2]


def test_hostile_region_policy_and_spec_are_format_errors(shm_dir):
    """A region.json whose policy or spec is not one this tfdata writes is a FormatError naming
    the file (a writer must not quietly take an unknown policy for "block")."""
    import json

    buf = SharedReplayBuffer(ID_SPEC, 4, mode="fifo", name="hostile-doc")
    doc = os.path.join(buf.path, "region.json")
    good = json.load(open(doc))
    for key, value in [("policy", "overwrite"), ("spec", 5), ("spec", {"fields": []})]:
        with open(doc, "w") as f:
            json.dump({**good, key: value}, f)
        with pytest.raises(FormatError, match="region.json"):
            SharedWriter("hostile-doc", 0)
    buf.close()


def test_a_blocked_writer_learns_of_the_learners_death_before_its_timeout(shm_dir):
    """As test_a_blocked_writer_learns_that_the_learner_died, with a writer timeout, so that a
    writer that never checks fails this test (TimeoutError) instead of hanging the suite."""
    here, there = FORK.Pipe()
    p = FORK.Process(target=_learner_then_killed, args=(there,))
    p.start()
    here.recv()
    with SharedWriter("doomed", 0, timeout=60) as w:
        w.extend(id_rows(range(4)))  # the queue is full
        here.send("go")
        p.join(30)
        with pytest.raises(SharedBufferError, match="has ended: no one will take rows .0 of 2"):
            w.extend(id_rows([4, 5]))


@pytest.mark.parametrize("sizes", [(7, 3, 12), (12, 7, 5)])
def test_sample_matches_the_reference_with_any_shard_part_full(layout, sizes, shm_dir):
    """As test_sample_matches_the_reference_and_is_layout_free, with a shard that is not yet
    full after a full one: held rows are numbered shard by shard, so a draw past a full shard
    lands at ``shard * C`` plus its rank in that shard, whatever the earlier shards hold."""
    rng = np.random.default_rng(1)
    cap = 7
    spec = tfdata.Spec(ODD)
    streams = [random_rows(spec, n, rng) for n in sizes]
    with SharedReplayBuffer(spec, 3 * cap, num_writers=3, layout=layout, seed=11) as buf:
        for s, rows in enumerate(streams):
            with SharedWriter(buf.name, s) as w:
                w.extend(rows)
        state = buf.sampler.state.copy()
        b = buf.sample(16, copy=True)  # 17 and 19 rows held
        counts = [min(n, cap) for n in sizes]
        slots, counter = naive.shared_sample_slots(int(state[0]), int(state[1]), counts, cap, 16)
        np.testing.assert_array_equal(b.indices, slots)
        assert buf.sampler.counter == counter
        for i, g in enumerate(slots):
            s, j = divmod(int(g), cap)
            n = sizes[s]
            src = j if n <= cap else (n - cap) + (j - n) % cap  # the stream's row in slot j
            for f in spec.names:
                np.testing.assert_array_equal(b[f][i], streams[s][f][src], err_msg=f)
