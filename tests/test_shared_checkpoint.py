"""SharedReplayBuffer.save / load: a checkpoint of the rows each shard held, loaded into a new
region that writers attach to; the loaded buffer continues the same samples; a hostile
checkpoint is a FormatError before any region exists; saving while real writer processes
write leaves out exactly the rows they were overwriting."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from tfdata.errors import FormatError, SharedBufferError
from tfdata.shared import SharedReplayBuffer, SharedWriter

from .conftest import assert_batches_equal
from .test_shared_nstep import SPEC, id_rows

FORK = mp.get_context("fork")


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    d = tmp_path / "shm"
    d.mkdir()
    monkeypatch.setenv("TFDATA_SHM_DIR", str(d))
    return d


def same_future(a, b, prioritized: bool, n_step=None) -> None:
    for _ in range(4):
        x, y = a.sample(5, copy=True), b.sample(5, copy=True)
        assert_batches_equal(dict(x), dict(y))
        np.testing.assert_array_equal(x.indices, y.indices)
        if prioritized:
            np.testing.assert_array_equal(x.weights, y.weights)
            p = np.arange(1.0, 6.0)
            a.update_priorities(x, p)
            b.update_priorities(y, p)
        if n_step:
            np.testing.assert_array_equal(x.discounts, y.discounts)
    x, y = a.sample_sequences(3, 4, copy=True), b.sample_sequences(3, 4, copy=True)
    np.testing.assert_array_equal(x.indices, y.indices)
    np.testing.assert_array_equal(x.mask, y.mask)


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("prioritized", [False, True])
def test_save_load_continues_the_same_samples(layout, prioritized, shm_dir, tmp_path):
    kw = dict(num_writers=2, layout=layout, seed=7, prioritized=prioritized, n_step=3, gamma=0.9)
    with SharedReplayBuffer(SPEC, 2 * 16, **kw) as buf:
        with SharedWriter(buf.name, 0) as w0, SharedWriter(buf.name, 1) as w1:
            w0.extend(id_rows(np.arange(40)))  # wrapped
            w1.extend(id_rows(np.arange(9) + 1000))  # not full
        b = buf.sample(8)
        if prioritized:
            buf.update_priorities(b, np.linspace(0.5, 4, 8))
        buf.save(tmp_path / "ck")
        with SharedReplayBuffer.load(tmp_path / "ck") as back:
            assert back.config == buf.config
            assert len(back) == len(buf) and [w["published"] for w in back.writers()] == [40, 9]
            if prioritized:
                np.testing.assert_array_equal(back.priorities(), buf.priorities())
            same_future(buf, back, prioritized, n_step=3)
            with SharedWriter(back.name, 1) as w:  # a writer continues its shard after its rows
                w.extend(id_rows(np.arange(9, 12) + 1000))
                assert w.published == 12
            ids = back.sample(20)["id"]
            assert set(ids.tolist()) <= set(range(24, 40)) | set(range(1000, 1012))


def test_fifo_and_hostile_checkpoints_are_refused(shm_dir, tmp_path):
    with SharedReplayBuffer(SPEC, 8, mode="fifo") as fifo:
        with pytest.raises(SharedBufferError, match="FIFO"):
            fifo.save(tmp_path / "f")
    assert not os.path.exists(tmp_path / "f")
    with SharedReplayBuffer(SPEC, 8, num_writers=2, prioritized=True) as buf:
        with SharedWriter(buf.name, 0) as w:
            w.extend(id_rows(np.arange(6)))
        buf.sample(2)
        buf.save(tmp_path / "ck")
    doc = json.loads((tmp_path / "ck" / "state.json").read_text())

    def broken(edit, what):
        d = json.loads(json.dumps(doc))
        edit(d)
        p = tmp_path / f"bad-{what}"
        os.system(f"cp -r {tmp_path / 'ck'} {p}")
        (p / "state.json").write_text(json.dumps(d))
        before = sorted(os.listdir(shm_dir))
        with pytest.raises(FormatError, match=what):
            SharedReplayBuffer.load(p)
        assert sorted(os.listdir(shm_dir)) == before  # no region was created

    broken(lambda d: d["state"]["heads"].__setitem__(0, -1), "heads")
    broken(lambda d: d["state"]["heads"].append(3), "heads")
    broken(lambda d: d["state"]["dropped"].__setitem__(0, 5), "dropped")  # more than the 4 held
    broken(lambda d: d["config"].__setitem__("num_writers", 3), "num_writers")
    broken(lambda d: d["config"].__setitem__("capacity", 1 << 40), "capacity")
    broken(lambda d: d["config"].__setitem__("dir", "/"), "dir")
    broken(lambda d: d["config"].__setitem__("ring_size", 10 ** 9), "ring_size")
    broken(lambda d: d["state"]["sampler"].__setitem__("counter", -1), "counter")
    broken(lambda d: d["state"]["prioritized"].__setitem__("alpha", 0.1), "alpha")
    broken(lambda d: d.__setitem__("class", "ReplayBuffer"), "class")
    leaves = tmp_path / "ck" / doc["state"]["prioritized"]["leaves"]["$array"]
    bad = tmp_path / "bad-leaf"
    os.system(f"cp -r {tmp_path / 'ck'} {bad}")
    arr = np.load(leaves)
    arr[1] = np.inf
    np.save(bad / doc["state"]["prioritized"]["leaves"]["$array"], arr)
    with pytest.raises(FormatError, match="leaves"):
        SharedReplayBuffer.load(bad)
    # one slot of another epoch: the sampler keeps one, so the load would change it
    versions = tmp_path / "ck" / doc["state"]["prioritized"]["versions"]["$array"]
    bad = tmp_path / "bad-version"
    os.system(f"cp -r {tmp_path / 'ck'} {bad}")
    arr = np.load(versions)
    arr[0] ^= np.uint64(1 << 20)
    np.save(bad / doc["state"]["prioritized"]["versions"]["$array"], arr)
    with pytest.raises(FormatError, match="versions"):
        SharedReplayBuffer.load(bad)


def _writer(name, shard, allowed, stop, errors):
    """Extends 8 rows at a time, never past ``allowed[shard]`` rows (the learner's pace)."""
    try:
        with SharedWriter(name, shard) as w:
            i = 0
            while not stop.is_set():
                if i + 8 <= allowed[shard]:
                    w.extend(id_rows(np.arange(i, i + 8) + 1_000_000 * shard))
                    i += 8
                else:
                    time.sleep(0)
    except BaseException as exc:
        errors.put(f"shard {shard}: {exc!r}")


def test_save_while_writer_processes_write(shm_dir, tmp_path):
    """Two processes overwrite their rings during every save: each checkpoint holds, per shard,
    consecutive ids ending at the saved head, whole rows only (torn ones left out). Each
    writer may begin half a shard of rows during a save, so whatever the machine's speed a
    save keeps at least the other half (a writer at full speed on a loaded machine could lap
    the whole ring during one save). Saves until one left rows out (at least 8; time cap:
    300 s)."""
    errors, stop = FORK.Queue(), FORK.Event()
    cap = 4096
    allowed = FORK.RawArray("q", [cap, cap])
    with SharedReplayBuffer(SPEC, 2 * cap, num_writers=2, seed=0) as buf:
        procs = [FORK.Process(target=_writer, args=(buf.name, s, allowed, stop, errors))
                 for s in range(2)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 60
        while len(buf) < 2 * cap and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(buf) == 2 * cap, errors.get() if not errors.empty() else "no rows"
        left_out = saves = 0
        deadline = time.monotonic() + 300
        while saves < 8 or (left_out == 0 and time.monotonic() < deadline):
            for s, info in enumerate(buf.writers()):
                allowed[s] = info["published"] + cap // 2  # what a writer may begin during the save
            path = tmp_path / f"ck{saves % 2}"
            buf.save(path, overwrite=True)
            saves += 1
            doc = json.loads((path / "state.json").read_text())
            left_out += sum(doc["state"]["dropped"])
            with SharedReplayBuffer.load(path) as back:
                for s, h in enumerate(back.writers()):
                    n = min(h["published"], cap)
                    assert n >= cap // 2, (s, n, doc["state"]["dropped"])
                    ids = back.storage.field("id")[s * cap:s * cap + cap]
                    rows = np.arange(h["published"] - n, h["published"]) % cap
                    got = ids[rows] - 1_000_000 * s
                    np.testing.assert_array_equal(np.diff(got), 1)  # consecutive, in order
                    assert got[-1] == doc["state"]["heads"][s] - 1
                    rew = back.storage.field("reward")[s * cap + rows]
                    np.testing.assert_array_equal(rew, ids[rows].astype(np.float64))  # whole rows
        stop.set()
        for p in procs:
            p.join(30)
        assert errors.empty(), errors.get()
    assert left_out > 0, "no save raced a writer: the test did not exercise the left-out rows"
