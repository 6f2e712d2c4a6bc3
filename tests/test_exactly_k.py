"""sampler="exactly_k": every row delivered in exactly k batches, then its slot is free.

The kernels are checked against their pure-Python references (the same pool, the same draws);
the buffer against ``naive.ExactlyKModel`` (a ring of ids, the policy's rule) over random
interleavings of writes, samples, clears and state round trips, and against the rule itself:
no row twice in a batch, no row delivered more than k times, every row written delivered
exactly k times once it is drained, nothing lost beyond the policy's counters."""

from __future__ import annotations

import collections
import json
import multiprocessing as mp
import os
import signal
import threading
import time

import numpy as np
import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tfdata import FormatError, PrioritizedReplayBuffer, ReplayBuffer, SharedReplayBuffer, SharedWriter
from tfdata.errors import WriterLostWarning
from tfdata.kernels import _replays

from . import naive
from .conftest import same_state, until

SPEC = {"id": "i8", "obs": ("f4", (3,)), "reward": "f4", "terminated": "?", "truncated": "?"}
GROUPS = (("id", "reward"), ("obs",))
LAYOUTS = ["aos", "soa", GROUPS]


def rows(ids) -> dict:
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 3, 1).astype(np.float32),
            "reward": ids.astype(np.float32), "terminated": ids % 7 == 6,
            "truncated": np.zeros(len(ids), bool)}


def one(i) -> dict:
    return {k: v[0] for k, v in rows([i]).items()}


def ek(cap, k=2, policy="block", layout="aos", seed=0, **kw) -> ReplayBuffer:
    return ReplayBuffer(SPEC, cap, layout=layout, seed=seed, sampler="exactly_k", replays=k,
                        policy=policy, **kw)


class Waits:
    """Every wait on a sampler's condition (where blocked writes and samples short of rows
    wait), recorded as ``(thread, timeout given, notified)``; while ``allowed`` is False a wait
    fails at once instead (a call that must not wait). What the tests assert about waiting,
    instead of how long a call took."""

    def __init__(self, sampler, allowed: bool = True):
        self.log, self.allowed = [], allowed
        self._wait = sampler.waits.cond.wait
        sampler.waits.cond.wait = self.wait

    def wait(self, timeout=None):
        if not self.allowed:
            raise AssertionError("a call waited on the sampler's condition")
        notified = self._wait(timeout)
        self.log.append((threading.get_ident(), timeout, notified))
        return notified


# -- the kernels against their references ----------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_kernels_match_reference(dtype):
    rng = np.random.default_rng(5)
    for trial in range(120):
        cap = int(rng.integers(1, 40))
        k = int(rng.integers(1, 5 if dtype == np.uint8 else 700))
        pool = np.zeros(cap, np.uint32)
        rem = np.zeros(cap, dtype)
        meta = np.zeros(1, np.int64)
        ref_pool, ref_m, ref_rem = [0] * cap, 0, [0] * cap
        state = np.array([naive.mix64(trial), 0], np.uint64)
        cursor = 0
        for step in range(40):
            if rng.random() < 0.3:
                count = int(rng.integers(0, cap + 1))
                got = _replays.replays_write(pool, rem, meta, cursor, count, k)
                ref_pool, ref_m, ref_rem, lost = naive.exactly_k_write_naive(
                    ref_pool, ref_m, ref_rem, cursor, count, k)
                assert got == lost
                cursor = (cursor + count) % cap
            elif rng.random() < 0.4:  # runs anywhere, in one call (a shared region's catch-up)
                runs = [(int(rng.integers(0, cap)), int(rng.integers(0, min(3, cap + 1))))
                        for _ in range(int(rng.integers(0, 4)))]
                got = _replays.replays_write_spans(pool, rem, meta, np.array(runs, np.int64).reshape(-1, 2), k)
                lost = 0
                for start, count in runs:
                    ref_pool, ref_m, ref_rem, one = naive.exactly_k_write_naive(
                        ref_pool, ref_m, ref_rem, start, count, k)
                    lost += one
                assert got == lost
            else:
                b = int(rng.integers(0, ref_m + 1))
                idx = np.empty(b, np.int64)
                counter = int(state[1])
                freed = _replays.replays_sample(pool, rem, meta, state, idx)
                ref_pool, ref_m, ref_rem, ref_idx, ref_ctr, ref_freed = naive.exactly_k_sample_naive(
                    ref_pool, ref_m, ref_rem, int(state[0]), counter, b)
                np.testing.assert_array_equal(idx, ref_idx)
                assert freed == ref_freed and int(state[1]) == ref_ctr
                assert len(set(idx.tolist())) == b
            assert meta[0] == ref_m
            assert pool[:ref_m].tolist() == ref_pool[:ref_m]
            assert rem.tolist() == ref_rem
            # the invariant: the pool holds exactly the slots with deliveries left
            assert sorted(pool[:ref_m].tolist()) == [s for s in range(cap) if rem[s]]


def test_place_kernel_matches_reference():
    rng = np.random.default_rng(21)
    for trial in range(400):
        cap = int(rng.integers(1, 30))
        rem = (rng.random(cap) < rng.random()).astype(np.uint8) * rng.integers(1, 4, cap).astype(np.uint8)
        free = int(np.count_nonzero(rem == 0))
        if rng.random() < 0.3:
            free = int(rng.integers(0, free + 1))  # fewer free than held: still inside
        start = int(rng.integers(0, cap))
        n = int(rng.integers(0, 2 * cap + 2))
        runs = np.zeros((int(rng.integers(1, 4)), 2), np.int64)  # tiny: several calls
        out = np.zeros(4, np.int64)
        slots, pos, f, moved = [], start, free, 0
        while len(slots) < n:
            r = _replays.replays_place(rem, pos, n - len(slots), f, runs, out)
            assert r >= 1
            for i in range(r):
                d, c = runs[i]
                assert 0 <= d and d + c <= cap  # a run never crosses the ring's end
                slots += list(range(d, d + c))
            pos, f, moved = int(out[0]), int(out[1]), moved + int(out[3])
        want, want_pos, want_moved = naive.exactly_k_place_naive(rem.tolist(), start, n, free)
        assert slots == want and pos == want_pos and moved == want_moved
        assert (start + moved) % cap == pos
        taken = slots[:free]  # the first ``free`` rows take free slots, each once
        assert len(set(taken)) == len(taken) and all(rem[s] == 0 for s in taken)


def test_place_kernel_stays_inside_its_arrays():
    runs, out = np.zeros((2, 2), np.int64), np.zeros(4, np.int64)
    rem = np.ones(5, np.uint8)
    assert _replays.replays_place(rem, 0, 3, 2, runs, out) == -2  # promised free slots: none
    for start, n, free in ((5, 1, 0), (-1, 1, 0), (0, -1, 0), (0, 1, 6), (0, 1, -1)):
        assert _replays.replays_place(rem, start, n, free, runs, out) == -1
    assert _replays.replays_place(np.ones(0, np.uint8), 0, 1, 0, runs, out) == -1
    assert _replays.replays_place(rem, 0, 1, 0, np.zeros((0, 2), np.int64), out) == -1
    assert _replays.replays_place(rem, 0, 1, 0, runs, np.zeros(3, np.int64)) == -1
    assert _replays.replays_place(rem, 3, 4, 0, runs, out) == 2  # no free: 3, 4 | 0, 1
    assert runs.tolist() == [[3, 2], [0, 2]] and out.tolist() == [2, 0, 4, 4]


def test_load_and_clear():
    rem = np.array([0, 0, 2, 0, 1, 0], np.uint8)
    pool, meta = np.zeros(6, np.uint32), np.zeros(1, np.int64)
    assert _replays.replays_load(pool, rem, meta, np.array([4, 1]), np.array([3, 1])) == 0
    assert rem.tolist() == [0, 1, 0, 0, 3, 0] and pool[:2].tolist() == [4, 1] and meta[0] == 2
    for slots, counts, bad in (([4, 4], [1, 1], 2), ([6], [1], 1), ([-1], [1], 1), ([1], [0], 1),
                               ([1], [256], 1)):
        assert _replays.replays_load(pool, rem, meta, np.array(slots), np.array(counts)) == bad
        assert meta[0] == 0 and not rem.any()
    assert _replays.replays_load(pool, rem, meta, np.array([1]), np.array([1, 2])) == -1
    rem[:] = 3
    meta[0] = 5
    _replays.replays_clear(rem, meta)
    assert meta[0] == 0 and not rem.any()


def test_kernels_stay_inside_their_arrays_whatever_they_hold():
    cap = 8
    state = np.array([1, 0], np.uint64)
    for pool_vals, rem_vals, m in (([100] * cap, [1] * cap, cap), ([3] * cap, [0] * cap, cap),
                                   ([2**32 - 1] * cap, [1] * cap, 4)):
        pool, rem = np.array(pool_vals, np.uint32), np.array(rem_vals, np.uint8)
        meta = np.array([m], np.int64)
        assert _replays.replays_sample(pool, rem, meta, state, np.empty(2, np.int64)) == -2
    pool, rem = np.zeros(cap, np.uint32), np.zeros(cap, np.uint8)
    for m in (-1, cap + 1, 2**40):
        meta = np.array([m], np.int64)
        assert _replays.replays_sample(pool, rem, meta, state, np.empty(1, np.int64)) == -1
        assert _replays.replays_write(pool, rem, meta, 0, 1, 1) == -1
    meta = np.array([1], np.int64)
    assert _replays.replays_sample(pool, rem, meta, state, np.empty(2, np.int64)) == -1  # B > m
    assert _replays.replays_sample(pool, np.zeros(cap - 1, np.uint8), meta, state, np.empty(1, np.int64)) == -1
    meta = np.array([cap], np.int64)  # a full pool cannot take a free slot
    assert _replays.replays_write(pool, rem, meta, 0, 1, 1) == -2
    meta = np.array([0], np.int64)
    for start, count, k in ((cap, 1, 1), (-1, 1, 1), (0, cap + 1, 1), (0, 1, 0), (0, 1, 256)):
        assert _replays.replays_write(pool, rem, meta, start, count, k) == -1
        spans = np.array([[0, 1], [start, count]], np.int64)
        assert _replays.replays_write_spans(pool, rem, meta, spans, k) == -1 and not rem.any()
    assert not rem.any() and meta[0] == 0
    meta = np.array([cap], np.int64)
    assert _replays.replays_write_spans(pool, rem, meta, np.array([[0, 1]], np.int64), 1) == -2


# -- options --------------------------------------------------------------------------------------
def test_options_are_checked():
    for kw, word in (({"replays": 0}, "replays"), ({"replays": 65536}, "replays"),
                     ({"replays": 2.0}, "replays"), ({"replays": True}, "replays"),
                     ({"policy": "wait"}, "policy"), ({"timeout": 0}, "timeout"),
                     ({"timeout": float("inf")}, "timeout"), ({"timeout": -1.0}, "timeout")):
        with pytest.raises(ValueError, match=word):
            ReplayBuffer(SPEC, 8, sampler="exactly_k", **kw)
    for sampler in (None, "uniform", "without_replacement"):
        with pytest.raises(ValueError, match="replays=.*exactly_k"):
            ReplayBuffer(SPEC, 8, sampler=sampler, replays=2)
        with pytest.raises(ValueError, match="policy="):
            ReplayBuffer(SPEC, 8, sampler=sampler, policy="drop")
        with pytest.raises(ValueError, match="timeout="):
            ReplayBuffer(SPEC, 8, sampler=sampler, timeout=1.0)
    with pytest.raises(TypeError):
        PrioritizedReplayBuffer(SPEC, 8, replays=2)
    for kw, word in (({"n_step": 3}, "n_step"), ({"elide_next": True}, "elide_next")):
        spec = dict(SPEC, next_obs=("f4", (3,)))
        for policy in ("block", "drop", "overwrite"):
            with pytest.raises(ValueError, match=f"exactly_k.*{word}.*stream order"):
                ReplayBuffer(spec, 8, sampler="exactly_k", policy=policy, **kw)
        ReplayBuffer(spec, 8, **kw)  # fine without exactly_k
    b = ek(8, k=300)
    assert b.sampler.remaining.dtype == np.uint16 and ek(8, k=255).sampler.remaining.dtype == np.uint8


def test_memory_is_planned_and_counted():
    for k, per in ((3, 9), (300, 10)):  # pool 4, deliveries left 1 or 2, last write's lap 4
        plan = ReplayBuffer.plan_memory(SPEC, 1000, sampler="exactly_k", replays=k)
        # no episode numbers (rows are off stream order): only the sampler's bytes
        assert plan["bookkeeping"] == per * 1000
        b = ek(1000, k=k)
        assert b.nbytes_parts["bookkeeping"] == plan["bookkeeping"]


def test_sequences_are_refused():
    b = ek(16)
    b.extend(rows(range(8)))
    with pytest.raises(NotImplementedError, match="exactly_k"):
        b.sample_sequences(2, 3)


# -- exact counts ---------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("policy", ["block", "drop", "overwrite"])
def test_every_row_delivered_exactly_k_times(k, policy):
    rng = np.random.default_rng(k * 7 + len(policy))
    cap, B = 24, 5
    b = ek(cap, k=k, policy=policy, seed=3, timeout=0.001)
    seen = collections.Counter()
    written = []
    nid = 0
    for step in range(400):
        if rng.random() < 0.5:
            n = int(rng.integers(1, 8))
            ids = list(range(nid, nid + n))
            nid += n
            try:
                b.extend(rows(ids)) if n > 1 else b.push(one(ids[0]))
            except TimeoutError:
                continue
            written += ids
        elif b.sampler.awaiting >= B:
            got = b.sample(B)["id"].tolist()
            assert len(set(got)) == B
            seen.update(got)
    while b.sampler.awaiting >= 1:  # drain
        seen.update(b.sample(1)["id"].tolist())
    s = b.sampler
    assert max(seen.values()) <= k
    if policy != "overwrite":
        delivered = {i for i, c in seen.items() if c == k}
        assert set(seen) <= set(written)
        assert s.lost_replays == 0
        if policy == "block":
            assert s.dropped == 0 and delivered == set(written)
        else:
            assert len(written) - len(delivered) == s.dropped > 0
            assert all(c == k for c in seen.values())
    else:
        assert s.dropped == 0 and s.lost_replays > 0
        assert sum(seen.values()) + s.lost_replays == k * len(written)
    assert s.delivered == sum(seen.values())


def test_k1_is_exact_once_fifo_in_random_order():
    b = ek(64, k=1, seed=9)
    b.extend(rows(range(60)))
    got = []
    while b.sampler.awaiting:
        got += b.sample(min(7, b.sampler.awaiting))["id"].tolist()
    assert sorted(got) == list(range(60)) and got != list(range(60))


def test_sample_short_of_rows_raises_at_once_with_counts():
    b = ek(16, k=1)
    b.extend(rows(range(3)))
    nbytes = b.nbytes
    # timeout=None: a batch larger than the rows held is refused by the buffer, before its
    # output ring is built (only a sampler with a timeout waits for rows, up to the capacity)
    assert not b.sampler.waits_for_rows
    with pytest.raises(ValueError, match=r"batch_size 5 is larger than the 3 rows held; rows are "
                                         r"drawn without replacement"):
        b.sample(5)
    assert b.nbytes == nbytes
    ring = b.sample(2)
    kept = ring["id"].tolist()
    before = b.state_dict()
    Waits(b.sampler, allowed=False)  # timeout=None: refused at once, it never waits
    with pytest.raises(ValueError, match=r"batch of 2 distinct rows, but 1 rows await.*only with a timeout"):
        b.sample(2)
    same_state(before, b.state_dict())
    assert ring["id"].tolist() == kept  # a refused sample took no slot of the output ring
    b.extend(rows(range(3, 5)))
    b.sample(2)
    assert ring["id"].tolist() == kept  # ring_size=2: the batch before is still intact



# -- the model: random interleavings, every policy ------------------------------------------------
class ExactlyKMachine(RuleBasedStateMachine):
    @initialize(cap=st.sampled_from([1, 2, 6, 13]), k=st.sampled_from([1, 2, 3]),
                policy=st.sampled_from(["block", "drop", "overwrite"]),
                layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**64 - 1))
    def setup(self, cap, k, policy, layout, seed):
        self.args = dict(cap=cap, k=k, policy=policy, seed=seed)
        self.buf = ek(cap, k=k, policy=policy, layout=layout, seed=seed, timeout=0.001)
        self.model = naive.ExactlyKModel(cap, k, policy, seed)
        self.nid = 0
        self.seen = collections.Counter()

    def _write(self, n, push):
        ids = list(range(self.nid, self.nid + n))
        self.nid += n
        before = self.buf.state_dict() if self.args["policy"] == "block" else None
        ok = self.model.write(ids)
        if ok:
            self.buf.push(one(ids[0])) if push else self.buf.extend(rows(ids))
        else:
            with pytest.raises((TimeoutError, ValueError)):
                self.buf.push(one(ids[0])) if push else self.buf.extend(rows(ids))
            same_state(before, self.buf.state_dict())

    @rule()
    def push(self):
        self._write(1, True)

    @rule(n=st.integers(1, 30))
    def extend(self, n):
        self._write(n, False)

    @rule(data=st.data())
    def sample(self, data):
        if self.model.size == 0:
            return
        bs = data.draw(st.integers(1, self.model.size))
        want = self.model.sample(bs)
        if want is None:
            before = self.buf.state_dict()
            with pytest.raises((ValueError, TimeoutError), match="await replay"):
                self.buf.sample(bs)  # the timeout given: it waited for writes, then raised
            same_state(before, self.buf.state_dict())
            return
        batch = self.buf.sample(bs)
        np.testing.assert_array_equal(batch.indices, want[0])
        assert batch["id"].tolist() == want[1]
        self.seen.update(want[1])

    @rule()
    def clear(self):
        self.buf.clear()
        self.model.clear()

    @rule(layout=st.sampled_from(LAYOUTS))
    def round_trip(self, layout):
        state = self.buf.state_dict()
        a = self.args
        self.buf = ek(a["cap"], k=a["k"], policy=a["policy"], layout=layout, seed=1, timeout=0.001)
        self.buf.load_state_dict(state)

    @invariant()
    def agrees(self):
        if not hasattr(self, "buf"):
            return
        s, m = self.buf.sampler, self.model
        assert (s.delivered, s.dropped, s.lost_replays, s.awaiting) == (m.delivered, m.dropped, m.lost, m.m)
        assert s.counts().tolist() == m.remaining
        assert (self.buf.writer.cursor, len(self.buf)) == (m.cursor, m.size)
        assert not self.seen or max(self.seen.values()) <= self.args["k"]


ExactlyKMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
TestExactlyKMachine = ExactlyKMachine.TestCase


# -- layouts, checkpoints ---------------------------------------------------------------------------
def _script(b, rng_seed=4, steps=120):
    rng = np.random.default_rng(rng_seed)
    out, nid = [], 0
    for _ in range(steps):
        if rng.random() < 0.55:
            n = int(rng.integers(1, 6))
            b.extend(rows(range(nid, nid + n)))
            nid += n
        elif b.sampler.awaiting >= 4:
            batch = b.sample(4)
            out.append((batch.indices.copy(), {k: batch[k].copy() for k in SPEC}))
    return out


def test_layouts_give_bit_identical_batches():
    runs = [_script(ek(20, k=3, policy="overwrite", layout=lay, seed=11)) for lay in LAYOUTS]
    assert len(runs[0]) > 20
    for other in runs[1:]:
        for (ia, ba), (ib, bb) in zip(runs[0], other):
            np.testing.assert_array_equal(ia, ib)
            for k in SPEC:
                assert ba[k].tobytes() == bb[k].tobytes()


@pytest.mark.parametrize("policy", ["block", "drop", "overwrite"])
def test_checkpoint_mid_way_continues_exactly(tmp_path, policy):
    a = ek(32, k=3, policy=policy, seed=5, timeout=0.5)
    b = ek(32, k=3, policy=policy, seed=5, timeout=0.5)
    rng = np.random.default_rng(0)
    for buf in (a, b):
        buf.extend(rows(range(30)))
        for _ in range(6):
            buf.sample(5)
    a.save(tmp_path / "ck")
    c = ReplayBuffer.load(tmp_path / "ck", layout="soa")
    assert c.config == dict(a.config, layout="soa") and c.sampler.policy == policy and c.sampler.timeout == 0.5
    nid = 30
    for step in range(60):
        if rng.random() < 0.5:
            for buf in (b, c):
                if policy == "block" and buf.sampler.free == 0:
                    continue
                buf.push(one(nid))
            nid += 1
        elif b.sampler.awaiting >= 3:
            x, y = b.sample(3), c.sample(3)
            assert x["id"].tolist() == y["id"].tolist()
    for f in ("delivered", "dropped", "lost_replays", "awaiting"):
        assert getattr(b.sampler, f) == getattr(c.sampler, f)


def _saved(tmp_path):
    b = ek(16, k=3, policy="drop", seed=2)
    b.extend(rows(range(12)))
    b.sample(5)
    b.save(tmp_path / "ck")
    return tmp_path / "ck"


def _edit(path, fn):
    import json

    doc = json.loads((path / "state.json").read_text())
    fn(doc)
    (path / "state.json").write_text(json.dumps(doc))


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["config"].update(replays=0), "config.replays"),
    (lambda d: d["config"].update(replays=70000), "config.replays"),
    (lambda d: d["config"].update(policy="wait"), "config.policy"),
    (lambda d: d["config"].update(timeout=-1.0), "config.timeout"),
    (lambda d: d["config"].pop("policy"), "config.policy"),
    (lambda d: d["config"].update(sampler="without_replacement"), "state|config.replays"),
    (lambda d: d["config"].update(sampler="uniform"), "config.sampler"),
    (lambda d: d["state"]["exactly_k"].update(dropped=-1), "state.exactly_k.dropped"),
    (lambda d: d["state"]["exactly_k"].update(delivered=1.5), "state.exactly_k.delivered"),
    (lambda d: d["state"]["exactly_k"].pop("lost_replays"), "state.exactly_k"),
])
def test_hostile_config_and_state_are_refused(tmp_path, edit, field):
    path = _saved(tmp_path)
    _edit(path, edit)
    with pytest.raises(FormatError, match=field.replace(".", r"\.") + ":"):
        ReplayBuffer.load(path)


@pytest.mark.parametrize("slots, counts, word", [
    ([0, 0], [1, 1], "twice"), ([12], [1], "not a row held"), ([-1], [1], "not a row held"),
    ([1], [4], r"counts\[0\]"), ([1], [0], r"counts\[0\]"), ([1, 2], [1], "counts"),
])
def test_hostile_pool_is_refused(tmp_path, slots, counts, word):
    path = _saved(tmp_path)
    part = {}

    def find(d):
        part.update(d["state"]["exactly_k"])

    _edit(path, find)
    for name, vals in (("slots", slots), ("counts", counts)):
        ref = part[name]
        np.save(path / ref["$array"], np.array(vals, np.int64))
    with pytest.raises(FormatError, match=word):
        ReplayBuffer.load(path)


def test_state_dict_round_trip_refuses_bad_states():
    b = ek(16, k=2, seed=1)
    b.extend(rows(range(10)))
    b.sample(3)
    good = b.state_dict()
    for mutate, word in ((lambda p: p.update(counts=np.array([3] * len(p["slots"]))), "counts"),
                         (lambda p: p.update(slots=p["slots"][:1]), "counts"),
                         (lambda p: p.update(slots=np.full(len(p["slots"]), 3)), "twice"),
                         (lambda p: p.update(dropped=-2), "dropped"),
                         (lambda p: p.pop("delivered"), "exactly_k")):
        state = b.state_dict()
        mutate(state["exactly_k"])
        c = ek(16, k=2, seed=1)
        c.extend(rows(range(10)))
        before = c.state_dict()
        with pytest.raises(ValueError, match=word):
            c.load_state_dict(state)
        same_state(before, c.state_dict())
    c = ek(16, k=2, seed=8)
    c.load_state_dict(good)
    assert c.sample(3)["id"].tolist() == b.sample(3)["id"].tolist()


# -- threads --------------------------------------------------------------------------------------
def test_blocked_writer_is_released_by_a_sample():
    b = ek(4, k=1, policy="block", seed=0)
    b.extend(rows(range(4)))
    done = threading.Event()

    def write():
        b.push(one(99))
        done.set()

    t = threading.Thread(target=write, daemon=True)
    t.start()
    assert until(lambda: b.sampler.waits.writers == 1)  # no free slot: the write waits
    assert not done.is_set()
    b.sample(1)  # frees a slot (k=1): the writer goes on
    assert done.wait(60)
    t.join(60)
    assert 99 in b.column("id").__array__().tolist()


def test_blocked_write_times_out_and_changes_nothing():
    b = ek(4, k=2, policy="block", seed=0, timeout=0.15)
    b.extend(rows(range(4)))
    before = b.state_dict()
    waits = Waits(b.sampler)
    t = time.monotonic()
    with pytest.raises(TimeoutError, match="nothing was written"):
        b.extend(rows([7, 8]))
    assert time.monotonic() - t >= 0.15  # waited the timeout out
    assert waits.log and all(0 < timeout <= 0.15 for _, timeout, _ in waits.log)  # and no longer
    with pytest.raises(TimeoutError):
        b.push(one(7))
    same_state(before, b.state_dict())
    with pytest.raises(ValueError, match="never fit"):
        b.extend(rows(range(5)))


@pytest.mark.parametrize("how", ["push", "extend"])
def test_sampler_waits_for_a_writer_thread_with_a_timeout(how):
    b = ek(16, k=1, seed=0, timeout=60.0)
    b.extend(rows(range(6)))
    b.sample(4)  # 2 rows await; a sample needs batch_size <= len(buffer) as with any sampler
    waits = Waits(b.sampler)

    def write():
        assert until(lambda: b.sampler.waits.samplers == 1)  # the sample waits for rows
        if how == "extend":
            b.extend(rows(range(6, 8)))
        else:  # the generated push, with the gate's one-row form
            b.push(one(6))
            b.push(one(7))

    t = threading.Thread(target=write, daemon=True)
    t.start()
    batch = b.sample(4)  # waits for the writer thread
    t.join(60)
    assert len(set(batch["id"].tolist())) == 4
    assert waits.log and all(notified for _, _, notified in waits.log)  # woken by the write, not the timeout
    c = ek(16, k=1, seed=0, timeout=0.1)
    c.extend(rows(range(4)))
    c.sample(2)
    with pytest.raises(TimeoutError, match="await replay"):
        c.sample(3)


def _consistent(part, size, k):
    """``part`` (a state's ``exactly_k``) with ``delivered`` making its counters agree with its
    pool and the rows held: every delivery owed to the rows written is made, lost or still owed
    (``size + lost_replays`` rows written: enough for any pool)."""
    owed = int(np.sum(part["counts"]))
    part["delivered"] = (size + part["lost_replays"]) * k - part["lost_replays"] - owed
    return part


def _with_pool(b, slots, counts):
    """``b`` with the rows ``slots`` awaiting ``counts`` deliveries, every other slot free."""
    state = b.state_dict()
    state["exactly_k"].update(slots=np.array(slots, np.int64), counts=np.array(counts, np.int64))
    _consistent(state["exactly_k"], len(b), b.sampler.replays)
    b.load_state_dict(state)
    return b


def test_a_sample_that_would_deadlock_a_blocked_writer_raises():
    b = ek(4, k=2, policy="block", seed=0, timeout=60.0)
    b.extend(rows(range(4)))
    _with_pool(b, [0, 2], [1, 2])  # 2 rows await, 2 slots free: a write of 3 waits
    waits, errors = Waits(b.sampler), []

    def write():
        try:
            b.extend(rows([9, 10, 11]))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    assert until(lambda: b.sampler.waits.writers == 1)
    with pytest.raises(ValueError, match="writer"):
        b.sample(3)  # the writer waits for this sample: it cannot wait for the writer
    assert not [w for w in waits.log if w[0] == threading.get_ident()]  # refused without waiting
    end = time.monotonic() + 60
    while t.is_alive() and time.monotonic() < end:
        if b.sampler.awaiting:
            b.sample(1)
        t.join(0.05)
    assert not t.is_alive() and not errors, errors
    assert {9, 10, 11} <= set(b.column("id").__array__().tolist())


def test_threads_deliver_every_row_exactly_k_times():
    k, n_rows = 3, 3000
    b = ek(64, k=k, policy="block", seed=4, timeout=60.0)
    seen = collections.Counter()
    errors = []

    def write():
        try:
            for i in range(0, n_rows, 3):
                b.extend(rows(range(i, i + 3)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    end = time.monotonic() + 300  # a cap for a hang, not a time the work must take
    while (t.is_alive() or b.sampler.awaiting) and time.monotonic() < end:
        if b.sampler.awaiting >= 8:
            seen.update(b.sample(8)["id"].tolist())
        elif b.sampler.awaiting:
            seen.update(b.sample(1)["id"].tolist())
        else:
            time.sleep(0.0005)
    t.join(60)
    assert not errors, errors
    assert set(seen) == set(range(n_rows)) and set(seen.values()) == {k}


# -- with the rest --------------------------------------------------------------------------------
def test_stream_options_are_refused_and_change_nothing():
    spec = dict(SPEC, next_obs=("f4", (3,)))
    for kw in ({"n_step": 3}, {"elide_next": True}, {"n_step": 2, "elide_next": True}):
        with pytest.raises(ValueError, match="stream order"):
            ReplayBuffer(spec, 32, sampler="exactly_k", replays=1, seed=0, **kw)
    # the sampler object given is not bound by the refusal: it builds a buffer afterwards
    from tfdata.replay.samplers.exactly_k import ExactlyKSampler

    s = ExactlyKSampler(0, replays=2)
    with pytest.raises(ValueError, match="n_step"):
        ReplayBuffer(spec, 8, sampler=s, n_step=3)
    assert s.waits is None and not hasattr(s, "storage")
    b = ReplayBuffer(spec, 8, sampler=s)
    b.extend(dict(rows(range(4)), next_obs=np.zeros((4, 3), np.float32)))
    assert b.sampler.awaiting == 4 and b.episodes is None


def test_update_field_num_envs_spill_and_clear(tmp_path):
    b = ek(16, k=2, policy="drop", num_envs=2, seed=0)
    b.extend(rows(range(12)))
    b.update_field("reward", [0, 1], [5.0, 6.0])
    assert b.sampler.counts()[:2].tolist() == [2, 2]
    b.update_field("terminated", [0], [True])  # no episode numbers to keep: allowed
    b.extend(rows(range(12, 18)))  # 4 fit (two steps), one step of 2 dropped
    assert b.sampler.dropped == 2 and len(b) == 16 and b.writer.cursor == 0
    _with_pool(b, [0, 3, 4, 6, 7], [1, 1, 1, 1, 1])  # slots 1, 2, 5, 8.. free
    b.extend(rows(range(18, 22)))  # two steps: slots 1, 2 then 5, 8 (not adjacent)
    assert b.sampler.dropped == 2 and b.writer.cursor == 9
    ids = np.asarray(b.column("id"))  # slot order from the cursor: 9..15, then 0..8
    assert ids[-9:].tolist() == [0, 18, 19, 3, 4, 20, 6, 7, 21]
    assert b.column_stats("reward").count == 16
    b.clear()
    assert b.sampler.awaiting == 0 and b.sampler.dropped == 0
    b.extend(rows(range(4)))
    assert b.sampler.awaiting == 4
    s = ReplayBuffer(SPEC, 64, sampler="exactly_k", replays=1, seed=0,
                     spill_path=tmp_path / "spill.npy", hot_rows=16)
    s.extend(rows(range(64)))
    got = []
    while s.sampler.awaiting:
        got += s.sample(8)["id"].tolist()
    assert sorted(got) == list(range(64))


# -- SharedReplayBuffer: writer processes and a learner -------------------------------------------
FORK = mp.get_context("fork")
SHARD = 1_000_000  # shard s writes ids s * SHARD + i


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    return tmp_path


def _ek_writer(name, shard, n, errors, die_after=None):
    try:
        rng = np.random.default_rng(shard)
        with SharedWriter(name, shard, timeout=30) as w:
            i = 0
            while i < n:
                if die_after is not None and i >= die_after:
                    os.kill(os.getpid(), signal.SIGKILL)
                k = min(n - i, int(rng.integers(1, 6)))
                ids = np.arange(i, i + k) + SHARD * shard
                if k == 1:
                    w.push(one(ids[0]))
                else:
                    w.extend(rows(ids))
                i += k
    except BaseException as exc:  # reported to the test, which fails
        errors.put(f"shard {shard}: {exc!r}")


def _drain(buf, done, batch=8, cap_s=300):
    """Sample until ``done(seen)``; the ids seen. The cap only turns a hang into a failure (a
    bug that delivers too little): the learner stops on what it has seen, not after a time."""
    seen = collections.Counter()
    end = time.monotonic() + cap_s
    while not done(seen) and time.monotonic() < end:
        for b in (batch, 1):
            try:
                got = buf.sample(b)
            except (TimeoutError, ValueError):
                continue
            ids = got["id"].tolist()
            assert len(set(ids)) == b
            np.testing.assert_array_equal(got["obs"][:, 0], np.asarray(ids, np.float32))
            seen.update(ids)
            break
    return seen


def _exited(procs) -> bool:
    return not any(p.is_alive() for p in procs)


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_shared_writer_processes_every_row_exactly_k_times(layout, shm_dir):
    """2 writer processes through 16-slot shards (they wait for the learner often): every row
    delivered exactly k times, none lost, none dropped."""
    k, n = 3, 1500
    errors = FORK.Queue()
    with SharedReplayBuffer(SPEC, 32, num_writers=2, layout=layout, seed=0, sampler="exactly_k",
                            replays=k, policy="block", timeout=0.2) as buf:
        procs = [FORK.Process(target=_ek_writer, args=(buf.name, s, n, errors)) for s in range(2)]
        for p in procs:
            p.start()
        seen = _drain(buf, lambda seen: sum(seen.values()) >= 2 * n * k)
        for p in procs:
            p.join(30)
        assert errors.empty(), errors.get()
        want = set(range(n)) | set(range(SHARD, SHARD + n))
        assert set(seen) == want and set(seen.values()) == {k}
        assert buf.sampler.lost_replays == 0 and [w["dropped"] for w in buf.writers()] == [0, 0]
        assert buf.sampler.delivered == 2 * n * k


def test_shared_drop_counts_what_it_drops(shm_dir):
    k, n = 2, 800
    errors = FORK.Queue()
    with SharedReplayBuffer(SPEC, 16, num_writers=2, seed=0, sampler="exactly_k", replays=k,
                            policy="drop", timeout=0.2) as buf:
        procs = [FORK.Process(target=_ek_writer, args=(buf.name, s, n, errors)) for s in range(2)]
        for p in procs:
            p.start()
        # nothing is sampled until a writer has dropped rows (its shard full of rows awaiting
        # replay), then every row published is delivered once the writers are done
        assert until(lambda: sum(w["dropped"] for w in buf.writers()) > 0 or not errors.empty())

        def done(seen):
            return _exited(procs) and sum(seen.values()) == k * sum(w["published"] for w in buf.writers())

        seen = _drain(buf, done)
        for p in procs:
            p.join(30)
        assert errors.empty(), errors.get()
        info = buf.writers()
        assert sum(w["published"] for w in info) + sum(w["dropped"] for w in info) == 2 * n
        assert sum(w["dropped"] for w in info) > 0
        assert len(seen) == sum(w["published"] for w in info) and set(seen.values()) == {k}


def test_shared_a_killed_writer_does_not_wedge_the_learner(shm_dir):
    """Shard 0's writer is SIGKILLed (possibly while waiting for the learner); the learner
    delivers every row it published k times and every row of shard 1, and its samples return
    (TimeoutError after the timeout) rather than wait for the dead writer."""
    k, n = 2, 600
    errors = FORK.Queue()
    with SharedReplayBuffer(SPEC, 32, num_writers=2, seed=0, sampler="exactly_k", replays=k,
                            policy="block", timeout=0.2) as buf:
        dying = FORK.Process(target=_ek_writer, args=(buf.name, 0, n, errors, 300))
        live = FORK.Process(target=_ek_writer, args=(buf.name, 1, n, errors))
        dying.start()
        live.start()
        with pytest.warns(WriterLostWarning, match="shard 0") as lost:  # the learner reports it
            def done(seen):  # both writers gone, reported, and every row published delivered
                return (_exited([dying, live]) and any(w.category is WriterLostWarning for w in lost)
                        and sum(seen.values()) == k * sum(w["published"] for w in buf.writers()))

            seen = _drain(buf, done)
        dying.join(30)
        live.join(30)
        assert dying.exitcode == -signal.SIGKILL
        assert errors.empty(), errors.get()
        published = buf.writers()[0]["published"]
        assert 300 <= published < n
        assert set(seen) == set(range(published)) | set(range(SHARD, SHARD + n))
        assert set(seen.values()) == {k}
        # a sample with nothing to deliver times out rather than wait for the dead writer: in a
        # thread, so that a regression fails (at the join) instead of hanging
        out = []

        def sample():
            t = time.monotonic()
            try:
                buf.sample(1)
            except BaseException as exc:  # noqa: BLE001 - looked at below
                out.append((exc, time.monotonic() - t))

        probe = threading.Thread(target=sample, daemon=True)
        probe.start()
        probe.join(60)
        assert out and isinstance(out[0][0], TimeoutError) and out[0][1] >= 0.2, out


def test_shared_options_are_checked(shm_dir):
    for kw, exc in (({"policy": "overwrite"}, NotImplementedError), ({"n_step": 2}, ValueError),
                    ({"mode": "fifo"}, ValueError), ({"prioritized": True}, ValueError),
                    ({"replays": 0}, ValueError), ({"policy": "wait"}, ValueError)):
        with pytest.raises(exc):
            SharedReplayBuffer(SPEC, 8, sampler="exactly_k", **kw)
    for kw in ({"replays": 2}, {"timeout": 1.0}):
        with pytest.raises(ValueError, match="exactly_k"):
            SharedReplayBuffer(SPEC, 8, **kw)
    with pytest.raises(ValueError, match="sampler"):
        SharedReplayBuffer(SPEC, 8, sampler="bogus")
    with pytest.raises(ValueError, match="exactly_k"):  # its options with another sampler
        SharedReplayBuffer(SPEC, 8, sampler="without_replacement", replays=2)
    with SharedReplayBuffer(SPEC, 8, sampler="exactly_k", replays=2) as buf:
        with SharedWriter(buf.name, 0) as w:
            w.extend(rows(range(8)))
            with pytest.raises(TimeoutError):  # block, a writer timeout: the shard is full
                w.timeout = 0.1
                w.push(one(9))
        with pytest.raises(NotImplementedError):
            buf.sample_sequences(1, 2)
        buf.save(shm_dir / "ck")  # checkpoints: tests/test_shared_exactly_k.py
        doc_path = os.path.join(buf.path, "region.json")
        doc = json.load(open(doc_path))
        for bad in ({"policy": "overwrite"}, {"replays": 0}, {"sampler": "nope"}, {"mode": "fifo"}):
            json.dump(dict(doc, **bad), open(doc_path, "w"))
            with pytest.raises(FormatError, match="region.json"):
                SharedWriter(buf.name, 0)
        json.dump(doc, open(doc_path, "w"))


def test_a_waiting_sample_is_woken_when_a_writer_starts_waiting_for_it():
    b = ek(4, k=2, policy="block", seed=0, timeout=60.0)
    b.extend(rows(range(4)))
    _with_pool(b, [0], [1])  # one row awaits: 3 slots free
    waits = Waits(b.sampler)
    got = []

    def sample():
        try:
            b.sample(2)
        except (ValueError, TimeoutError) as exc:
            got.append(exc)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    assert until(lambda: b.sampler.waits.samplers == 1)  # the sample waits for rows
    w = threading.Thread(target=lambda: b.extend(rows([9, 10, 11, 12])), daemon=True)
    w.start()  # the writer waits for a 4th free slot: the sample can never be served
    t.join(120)
    assert got and isinstance(got[0], ValueError)
    woken = [notified for ident, _, notified in waits.log if ident == t.ident]
    assert woken and all(woken)  # woken by the writer's wait, not by its timeout
    assert until(lambda: b.sampler.waits.writers == 1)
    b.sample(1)  # frees slot 0: the writer goes on
    w.join(60)
    assert not w.is_alive()


# -- the writer skips rows awaiting replay --------------------------------------------------------
def test_no_livelock_with_random_delivery_order():
    """The ring design stalled here: the oldest row still awaited while fewer rows than a batch
    did (capacity 10,000, k=13, batch 128: after 1,016 batches). A loop that writes 10 rows
    when 10 slots are free and samples when a batch awaits always makes progress."""
    k, B, cap = 13, 128, 1000
    b = ek(cap, k=k, policy="block", seed=1)  # timeout=None: a wait would raise, not stall
    seen = collections.Counter()
    nid = samples = skipped = 0
    while samples < 20_000:
        progressed = False
        if b.sampler.free >= 10:
            skipped += bool(b.sampler.counts()[b.writer.cursor])  # the ring would wait here
            b.extend(rows(range(nid, nid + 10)))
            nid += 10
            progressed = True
        if b.sampler.awaiting >= B:
            seen.update(b.sample(B)["id"].tolist())
            samples += 1
            progressed = True
        assert progressed, (b.sampler.free, b.sampler.awaiting)
    assert skipped > 1000  # the oldest row awaited often: the ring would have stalled
    left = b.sampler.counts()
    order = np.r_[np.arange(b.writer.cursor, cap), np.arange(0, b.writer.cursor)]
    by_slot = np.empty(cap, np.int64)
    by_slot[order] = np.asarray(b.column("id"))  # column(): slot order from the cursor
    pending = {int(by_slot[s]): k - int(left[s]) for s in range(cap) if left[s]}
    assert len(pending) == b.sampler.awaiting
    assert all(seen[i] == pending.get(i, k) for i in range(nid))
    assert b.sampler.lost_replays == 0 and b.sampler.dropped == 0


def test_actor_and_learner_threads_with_block_finish():
    k, B, n_rows = 13, 32, 20_000
    b = ek(256, k=k, policy="block", seed=3, timeout=60.0)  # generous: each side waits for the other
    seen = collections.Counter()
    errors = []
    stop = threading.Event()
    written = [n_rows]

    def actor():
        try:
            for i in range(0, n_rows, 4):
                b.extend(rows(range(i, i + 4)))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            stop.set()
        # a sample that waits for the rows of a batch when the actor is done would wait out its
        # timeout: more rows (counted) while it waits for them (after the stop the learner only
        # samples batches that await, so it starts no new wait), until it has finished
        try:
            while threads[1].is_alive() and not errors:
                if b.sampler.waits.samplers and b.sampler.awaiting < B:
                    b.extend(rows(range(written[0], written[0] + 4)))
                    written[0] += 4
                else:
                    time.sleep(0.001)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    def learner():
        try:
            while True:
                if stop.is_set() and b.sampler.awaiting < B:
                    break  # drained: the rows left await fewer than a batch
                if len(b) < B:
                    time.sleep(0.001)
                    continue
                try:  # short of rows: waits (lock released) for the actor, at most the timeout
                    seen.update(b.sample(B)["id"].tolist())
                except TimeoutError:
                    if not stop.is_set():  # the actor finished while this sample waited
                        raise
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=actor, daemon=True), threading.Thread(target=learner, daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    left = b.sampler.counts()
    total = written[0]
    assert sum(seen.values()) + int(left.sum()) == k * total
    assert max(seen.values()) == k  # the rows delivered fewer times are those still awaiting:
    assert sum(1 for i in range(total) if seen[i] < k) == b.sampler.awaiting < B


def test_block_waits_only_when_no_slot_is_free():
    b = ek(8, k=2, policy="block", seed=0, timeout=30.0)
    b.extend(rows(range(8)))
    _with_pool(b, [0, 1, 2, 4, 5, 6, 7], [2] * 7)  # only slot 3 is free; cursor at 0
    waits = Waits(b.sampler, allowed=False)  # a wait here fails at once
    b.push(one(100))  # does not wait: goes to slot 3
    assert b.writer.cursor == 4 and b.sampler.counts()[3] == 2
    b.sampler.timeout = 0.05
    waits.allowed = True
    with pytest.raises(TimeoutError, match="free slots"):
        b.push(one(101))  # now none is free
    _with_pool(b, [0, 2, 3, 5, 6], [1] * 5)  # free: 1, 4, 7
    with pytest.raises(TimeoutError):
        b.extend(rows(range(4)))  # 4 rows, 3 free: waits (all or nothing), changes nothing
    assert b.writer.cursor == 4
    b.sampler.timeout = 30.0
    waits.allowed = False
    _with_pool(b, [0, 2, 3, 4, 5, 6], [1] * 6)  # free: 1, 7; the cursor's slot 4 awaits
    b.extend(rows([200, 201]))  # 7, then 1 (wrapping), without waiting for slot 4
    assert b.writer.cursor == 2
    assert b.sampler.counts().tolist() == [1, 2, 1, 1, 1, 1, 1, 2]


def test_drop_and_overwrite_count():
    d = ek(8, k=3, policy="drop", seed=0)
    d.extend(rows(range(8)))
    _with_pool(d, [0, 1, 2, 5, 6], [3] * 5)  # free: 3, 4, 7
    d.extend(rows(range(10, 15)))  # 3 written (3, 4, 7), 2 dropped
    assert d.sampler.dropped == 2 and d.sampler.lost_replays == 0 and d.writer.cursor == 0
    assert sorted(np.flatnonzero(d.sampler.counts() == 3).tolist()) == list(range(8))
    o = ek(8, k=3, policy="overwrite", seed=0)
    o.extend(rows(range(8)))
    _with_pool(o, [0, 1, 2, 5, 6], [1, 2, 3, 1, 1])  # free: 3, 4, 7; cursor 0
    o.push(one(20))  # slot 3: a free slot first, nothing lost
    assert o.sampler.lost_replays == 0 and o.writer.cursor == 4
    o.extend(rows([21, 22, 23]))  # 4, 7 free, then none: overwrite slot 0 (1 left)
    assert o.sampler.lost_replays == 1 and o.writer.cursor == 1
    o.push(one(24))  # none free: the cursor's slot 1 (2 left)
    assert o.sampler.lost_replays == 3 and o.writer.cursor == 2


@pytest.mark.parametrize("cap", [16, 1000])
def test_running_stats_follow_the_skipping_writer(cap):
    # 1000 slots: several blocks of 256 rows, so a lap missed would leave a block stale
    b = ReplayBuffer(SPEC, cap, sampler="exactly_k", replays=1, policy="overwrite", seed=0,
                     stats=["reward"])
    crossed = 0
    assert b.push.__source__.count("place(w.cursor)")  # the generated push, placing
    rng = np.random.default_rng(0)
    nid = 0
    big = max(2, cap // 5)
    for step in range(600):
        r = rng.random()
        if r < 0.2:
            n = int(rng.integers(1, big))
            b.extend(rows(range(nid, nid + n)))
            nid += n
        elif r < 0.7:  # the generated push: its sweep may cross the ring's end
            for _ in range(int(rng.integers(1, 8))):
                c = b.writer.cursor
                b.push(one(nid))
                crossed += 0 < b.writer.cursor <= c
                nid += 1
        elif b.sampler.awaiting >= 3:
            b.sample(min(b.sampler.awaiting, int(rng.integers(3, big + 3))))
        if not len(b):
            continue
        got = b.stats("reward")
        want = np.asarray(b.column("reward"), np.float64)
        assert got.count == len(b)
        np.testing.assert_allclose(got.mean, want.mean(), rtol=1e-6)
        assert got.max == want.max()
    assert crossed or cap > 16  # the case the generated push's place must report as a lap


def test_running_stats_hear_a_push_whose_sweep_crosses_the_end():
    b = ReplayBuffer(SPEC, 1000, sampler="exactly_k", replays=1, policy="block", seed=0,
                     stats=["reward"])
    b.extend(rows(range(1000)))
    state = b.state_dict()
    state["writer"]["cursor"] = 995
    state["exactly_k"].update(slots=np.arange(995, 1000), counts=np.ones(5, np.int64), delivered=995)
    b.load_state_dict(state)  # slots 995..999 await, the rest free; the cursor at 995
    assert b.stats("reward").max == 999
    for i in range(3):
        b.push(one(5000 + i))  # to slots 0, 1, 2: past the ring's end
    assert b.writer.cursor == 3
    assert b.stats("reward").max == 5002
    np.testing.assert_allclose(b.stats("reward").mean, np.asarray(b.column("reward"), np.float64).mean())
