"""A shared writer's one-row push, through plain stores (x86-64: ``ORDERED_STORES``) or through
the seqlock kernels: the same steps in the same order (the reserve before any byte of the row,
the head after the last), the same words, rows and batches."""

from __future__ import annotations

import time

import numpy as np
import pytest

import tfdata.shared.writer as writer_module
from tfdata.shared import SharedReplayBuffer, SharedWriter

from .test_shared import ID_SPEC, consistent, id_rows

CAP = 13


@pytest.fixture(params=[True, False], ids=["stores", "kernels"])
def ordered(request, monkeypatch):
    if request.param and not writer_module.ORDERED_STORES:
        pytest.skip("this CPU may reorder stores: a push always calls the kernels")
    monkeypatch.setattr(writer_module, "ORDERED_STORES", request.param)
    return request.param


def one_rows(n: int, first: int = 0) -> list:
    """``n`` rows as a loop hands them over: arrays are views of rows of larger arrays."""
    b = id_rows(np.arange(first, first + n))
    return [{"id": int(b["id"][i]), "a": b["a"][i], "b": float(b["b"][i]), "c": b["c"][i],
             "d": bool(b["d"][i])} for i in range(n)]


@pytest.mark.parametrize("mode", ["replay", "fifo"])
def test_a_push_reserves_before_its_bytes_and_publishes_after(layout, mode, ordered, shm_dir,
                                                               monkeypatch):
    seen, slow = [], []
    publish, checked, hooks = SharedWriter._publish_one, SharedWriter._checked_push, writer_module.store_hooks

    def before_publish(slot):
        # the row is in its slot, reserved and not yet published
        state = buf.writers()[0]
        seen.append((state["published"], state["torn"], int(buf._region.storage.field("id")[slot])))

    def spy_publish(self, slot):
        before_publish(slot)
        publish(self, slot)

    def spy_hooks(*args):
        on_begin, on_write = hooks(*args)

        def spy_write(slot):
            before_publish(slot)
            on_write(slot)

        return on_begin, spy_write

    def spy_checked(self, row):
        slow.append(row)
        checked(self, row)

    monkeypatch.setattr(SharedWriter, "_publish_one", spy_publish)
    monkeypatch.setattr(writer_module, "store_hooks", spy_hooks)
    monkeypatch.setattr(SharedWriter, "_checked_push", spy_checked)
    n = 2 * CAP + 5 if mode == "replay" else CAP
    with SharedReplayBuffer(ID_SPEC, CAP, mode=mode, layout=layout, seed=3) as buf:
        stamps = buf._region.stamps  # publication times, kept by a FIFO
        assert stamps.shape[0] == (CAP if mode == "fifo" else 0)
        with SharedWriter(buf.name, 0) as w:
            for i, r in enumerate(one_rows(n)):
                t0 = time.monotonic_ns()
                w.push(r)
                assert buf.writers()[0]["torn"] == 0
                if stamps.shape[0]:
                    assert t0 <= int(stamps[i % CAP]) <= time.monotonic_ns()
            assert not slow, "the rows took the generic path: the one-row hooks went untested"
            assert seen == [(i, 1, i) for i in range(n)]
            state = buf.writers()[0]
            assert (state["published"], state["dropped"], state["torn"]) == (n, 0, 0)
            if mode == "fifo":
                got = buf.get_batch(CAP)
                np.testing.assert_array_equal(np.asarray(got["id"]), np.arange(CAP))
            else:
                ids = np.concatenate([np.array(buf.sample(8)["id"]) for _ in range(50)])
                assert set(ids.tolist()) == set(range(n - CAP, n))


def test_stores_and_kernels_leave_the_same_buffer(layout, shm_dir, monkeypatch):
    """Two buffers pushed the same rows, one through each path, hold the same words and rows
    and give the same batches."""
    out = []
    for flag in (True, False):
        if flag and not writer_module.ORDERED_STORES:
            continue
        monkeypatch.setattr(writer_module, "ORDERED_STORES", flag)
        with SharedReplayBuffer(ID_SPEC, 2 * CAP, num_writers=2, layout=layout, seed=9) as buf:
            with SharedWriter(buf.name, 0) as w0, SharedWriter(buf.name, 1) as w1:
                for a, b in zip(one_rows(20), one_rows(20, 1000)):
                    w0.push(a)
                    w1.push(b)
                batches = [buf.sample(16, copy=True) for _ in range(20)]
                assert all(consistent(bt).all() for bt in batches)
                words = [{k: s[k] for k in ("published", "dropped", "torn")} for s in buf.writers()]
                out.append((words, [np.asarray(bt["id"]).copy() for bt in batches],
                            np.asarray(buf._region.storage.field("a")).copy()))
    if len(out) == 2:
        (wa, ba, ra), (wb, bb, rb) = out
        assert wa == wb
        np.testing.assert_array_equal(ra, rb)
        for x, y in zip(ba, bb):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("closing", ["buffer", "writer"])
def test_a_push_after_a_close_is_refused_and_writes_nothing(closing, ordered, shm_dir):
    with SharedReplayBuffer(ID_SPEC, CAP, layout="aos", seed=0) as buf:
        w = SharedWriter(buf.name, 0)
        rows = one_rows(3)
        w.push(rows[0])
        (buf if closing == "buffer" else w).close()
        with pytest.raises(Exception, match="closed"):
            w.push(rows[1])
        if closing == "buffer":
            assert w.published == 1
            w.close()
            with pytest.raises(Exception, match="closed"):
                w.push(rows[2])
            return
        state = buf.writers()[0]
        assert (state["published"], state["torn"]) == (1, 0)
        w2 = SharedWriter(buf.name, 0)  # the shard is free, and continues after the one row
        w2.push(rows[1])
        assert buf.writers()[0]["published"] == 2
        w2.close()


def test_a_push_to_a_full_fifo_shard_waits_then_times_out_and_overwrites_nothing(ordered, shm_dir):
    with SharedReplayBuffer(ID_SPEC, 4, mode="fifo", layout="aos", seed=0) as buf:
        with SharedWriter(buf.name, 0, timeout=0.05) as w:
            rows = one_rows(6)
            for r in rows[:4]:
                w.push(r)
            with pytest.raises(TimeoutError):
                w.push(rows[4])
            state = buf.writers()[0]
            assert (state["published"], state["torn"]) == (4, 0)
            got = buf.get_batch(2)  # room for two more
            np.testing.assert_array_equal(np.asarray(got["id"]), [0, 1])
            w.push(rows[4])
            w.push(rows[5])
            got = buf.get_batch(4)
            np.testing.assert_array_equal(np.asarray(got["id"]), [2, 3, 4, 5])
