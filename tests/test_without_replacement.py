"""sampler="without_replacement": every live row once per pass while rows are inserted.

The kernel is checked against its pure-Python reference (the same pool, the same draws); the
buffer against a model of the rule that knows nothing of the algorithm: a row is returned only
if it is live and not drawn yet in its pass, never twice in a batch, and a pass ends only when
every live row of it was drawn."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

import tfdata
from tfdata import FormatError, ReplayBuffer
from tfdata.kernels import _pool
from tfdata.kernels._rng import draw_varying
from tfdata.replay.samplers.uniform import UniformSampler
from tfdata.replay.samplers.without_replacement import WithoutReplacementSampler

from . import naive

SPEC = {"id": "i8", "obs": ("f4", (3,)), "reward": "f4", "terminated": "?", "truncated": "?"}
GROUPS = (("id", "reward"), ("obs",))
LAYOUTS = ["aos", "soa", GROUPS]


def rows(ids) -> dict:
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "obs": np.repeat(ids[:, None], 3, 1).astype(np.float32),
            "reward": ids.astype(np.float32), "terminated": ids % 7 == 6,
            "truncated": np.zeros(len(ids), bool)}


WOR_NAME = "without_replacement"


def wor(cap, layout="aos", seed=0, **kw) -> ReplayBuffer:
    return ReplayBuffer(SPEC, cap, layout=layout, seed=seed, sampler="without_replacement", **kw)


# -- the kernel against its reference --------------------------------------------------------------
def test_pool_sample_matches_reference():
    rng = np.random.default_rng(3)
    for trial in range(150):
        cap = int(rng.integers(1, 40))
        pool = np.zeros(cap, np.uint32)
        inpool = np.zeros(cap, np.uint8)
        meta = np.zeros(3, np.int64)
        _pool.pool_clear(pool, inpool, meta)
        ref_pool, ref_m, ref_passes = [0] * cap, 0, 0
        state = np.array([naive.mix64(trial), 0], np.uint64)
        written, n = 0, 0  # rows written in all; live slots
        for step in range(30):
            if rng.random() < 0.5 or n == 0:  # write some rows (up to two laps)
                k = int(rng.integers(1, 2 * cap + 1))
                start, count = written % cap, min(k, cap)
                written += k
                n = min(cap, written)
                start = (written - count) % cap
            else:
                start, count = written % cap, 0
            if n == 0:
                continue
            batch = int(rng.integers(0, n + 1))
            idx = np.zeros(batch, np.int64)
            key, ctr = int(state[0]), int(state[1])
            got = _pool.pool_sample(pool, inpool, meta, start, count, n, state, idx)
            ref_pool, ref_m, passes, ref_idx, ref_ctr = naive.pool_sample_naive(
                ref_pool, ref_m, ref_passes, start, count, n, key, ctr, batch)
            assert got == passes - ref_passes, (trial, step)
            ref_passes = passes
            np.testing.assert_array_equal(idx, ref_idx, err_msg=f"trial {trial} step {step}")
            assert int(meta[0]) == ref_m and int(meta[1]) == ref_passes and int(state[1]) == ref_ctr
            np.testing.assert_array_equal(pool[:ref_m], ref_pool[:ref_m])
            assert sorted(np.flatnonzero(inpool).tolist()) == sorted(ref_pool[:ref_m])
            assert set(np.unique(inpool).tolist()) <= {0, 1}
            assert len(set(idx.tolist())) == batch  # never a row twice in a batch


def test_pool_kernels_refuse_bad_arguments_and_stay_in_bounds():
    cap = 8
    pool, inpool, meta = np.zeros(cap, np.uint32), np.zeros(cap, np.uint8), np.zeros(3, np.int64)
    _pool.pool_clear(pool, inpool, meta)
    state = np.array([1, 0], np.uint64)
    idx = np.zeros(3, np.int64)
    before = (pool.copy(), inpool.copy(), meta.copy(), state.copy())
    for args in [(0, 0, 0), (0, 0, 9), (8, 0, 4), (0, 9, 4), (-1, 0, 4), (0, 0, 2)]:  # n < batch too
        assert _pool.pool_sample(pool, inpool, meta, *args, state, idx) == -1, args
    assert _pool.pool_sample(pool, inpool[:7], meta, 0, 0, 4, state, idx) == -1
    assert _pool.pool_sample(pool, inpool, meta[:2], 0, 0, 4, state, idx) == -1  # no live-rows word
    meta[0] = 9  # more entries than the pool has
    assert _pool.pool_sample(pool, inpool, meta, 0, 0, 4, state, idx) == -1
    meta[0] = 0
    for a, b in zip(before, (pool, inpool, meta, state)):
        np.testing.assert_array_equal(a, b)
    assert _pool.pool_sample(pool, inpool, meta, 6, 4, 5, state, idx) == -2  # slot 6 written, n = 5
    # a corrupt pool: an entry far outside the arrays, or one not flagged, is refused
    _pool.pool_clear(pool, inpool, meta)
    pool[:] = 10 ** 9
    meta[0] = cap
    assert _pool.pool_sample(pool, inpool, meta, 0, 0, cap, state, idx) == -2
    pool[:] = 3
    assert _pool.pool_sample(pool, inpool, meta, 0, 0, cap, state, idx) == -2
    # pool_load: a slot not held or given twice empties the pool and says which
    _pool.pool_clear(pool, inpool, meta)
    assert _pool.pool_load(pool, inpool, meta, np.array([3, 1, 3]), 5) == 3
    assert meta[0] == 0 and (inpool == 0).all()
    assert _pool.pool_load(pool, inpool, meta, np.array([3, 9]), 5) == 2
    assert _pool.pool_load(pool, inpool, meta, np.arange(9), 9) == -1  # more than the capacity
    assert _pool.pool_load(pool, inpool, meta, np.array([4, 0, 2]), 5) == 0
    assert list(pool[:3]) == [4, 0, 2] and meta[0] == 3 and inpool[4] == 1 and inpool[1] == 0



def test_pool_sample_refuses_a_written_slot_that_is_not_live():
    cap = 8
    pool, inpool, meta = np.zeros(cap, np.uint32), np.zeros(cap, np.uint8), np.zeros(3, np.int64)
    _pool.pool_clear(pool, inpool, meta)
    state = np.array([1, 0], np.uint64)
    idx = np.zeros(2, np.int64)
    assert _pool.pool_sample(pool, inpool, meta, 5, 1, 5, state, idx) == -2  # slot n itself
    assert _pool.pool_sample(pool, inpool, meta, 3, 3, 5, state, idx) == -2  # slots 3, 4, 5
    assert int(state[1]) == 0 and not (inpool[5:] != 0).any()


def unmix64(r: int) -> int:
    """The word ``z`` with ``naive.mix64(z) == r`` (each step of mix64 is a bijection)."""
    def unshift(y, s):
        x = y
        for _ in range(64 // s + 1):
            x = y ^ (x >> s)
        return x

    m = naive.MASK64
    r = unshift(r, 31)
    r = (r * pow(0x94D049BB133111EB, -1, 1 << 64)) & m
    r = unshift(r, 27)
    r = (r * pow(0xBF58476D1CE4E5B9, -1, 1 << 64)) & m
    return unshift(r, 30)


def test_draw_rejects_exactly_the_words_below_the_threshold():
    """``_rng.draw_varying`` is ``draw_one`` with the threshold computed lazily: a word whose low product
    is exactly the threshold is kept, one just below it redrawn (found by inverting mix64;
    random words reach the boundary once in 2**32), and large bounds, where about a quarter
    of the words are rejected, give the reference's draws."""
    for nn in (3, 1000003, 3 * 2 ** 30 + 7, 2 ** 32 - 5):
        t = (2 ** 32 - nn) % nn
        inv = pow(nn, -1, 1 << 32)
        for low, kept in ((t, True), (t - 1, False), (nn - 1, True)):
            x = (low * inv) & 0xFFFFFFFF  # top word with (x * nn) mod 2**32 == low
            assert (x * nn) & 0xFFFFFFFF == low
            key = unmix64((x << 32) | 0x1234567)
            assert naive.mix64(key) >> 32 == x
            r, ctr = draw_varying(np.uint64(nn), np.uint64(key), np.uint64(0))
            ref, ref_ctr = naive.draw_indices(key, 0, nn, 1)
            assert (int(r), int(ctr)) == (int(ref[0]), ref_ctr), (nn, low)
            assert (int(ctr) == 1) == kept and (not kept or int(r) == (x * nn) >> 32)
        key = naive.mix64(nn)
        ctr = 0
        for _ in range(200):
            r, c = draw_varying(np.uint64(nn), np.uint64(key), np.uint64(ctr))
            ref, ref_ctr = naive.draw_indices(key, ctr, nn, 1)
            assert (int(r), int(c)) == (int(ref[0]), ref_ctr)
            ctr = ref_ctr


# -- the rule, on buffers ---------------------------------------------------------------------------
class Model:
    """The rule as sets of row ids: ``undrawn`` rows of the current pass; a sample's rows must
    come from it (or from the next pass once it is empty), none twice in a batch; a pass that
    a batch empties is followed at once by the next (rows written after it join the next)."""

    def __init__(self, cap):
        self.cap, self.slots, self.undrawn, self.passes = cap, {}, set(), 0
        self.written = 0

    def write(self, ids):
        for i in ids:
            slot = self.written % self.cap
            old = self.slots.get(slot)
            if old is not None:
                self.undrawn.discard(old)  # an overwritten row is gone
            self.slots[slot] = int(i)
            self.undrawn.add(int(i))  # a row written during a pass joins it
            self.written += 1

    def check_batch(self, got):
        taken = []
        for i in got:
            i = int(i)
            if not (self.undrawn - set(taken)):  # the pass is over: a new one, every live row
                self.undrawn = set(self.slots.values())
                self.passes += 1
            assert i in self.undrawn and i not in taken, (i, sorted(self.undrawn), taken)
            assert i in self.slots.values()  # live
            self.undrawn.discard(i)
            taken.append(i)
        if taken and not self.undrawn:  # the batch ended the pass: the next one begins now
            self.undrawn = set(self.slots.values())
            self.passes += 1


@pytest.mark.parametrize("layout", LAYOUTS, ids=["aos", "soa", "groups"])
def test_interleaved_writes_and_samples_follow_the_rule(layout):
    rng = np.random.default_rng(11)
    for cap in (1, 5, 16):
        buf, model, next_id = wor(cap, layout, seed=cap), Model(cap), 0
        for step in range(300):
            op = rng.random()
            if op < 0.3 or len(buf) == 0:
                k = int(rng.integers(1, 2 * cap + 2))
                ids = np.arange(next_id, next_id + k)
                next_id += k
                if k == 1 and rng.random() < 0.5:
                    buf.push({f: v[0] for f, v in rows(ids).items()})
                else:
                    buf.extend(rows(ids))
                model.write(ids)
            else:
                b = buf.sample(int(rng.integers(1, len(buf) + 1)))
                model.check_batch(b["id"])
                np.testing.assert_array_equal(b["reward"], b["id"].astype(np.float32))
        assert buf.sampler.passes == model.passes > 3



def test_a_pass_that_ends_with_a_batch_is_followed_at_once_by_the_next():
    """Every row drawn at the end of a batch: the pass is over (``passes`` counts it) and the
    next begins, so a row written before the next sample joins the new pass at a random place
    and is drawn once in it (not first, as the end of the pass that was over, then again)."""
    firsts = set()
    for seed in range(16):
        buf = wor(4, seed=seed)
        buf.extend(rows(np.arange(4)))
        assert sorted(buf.sample(4)["id"].tolist()) == [0, 1, 2, 3]
        assert buf.sampler.passes == 1 and buf.sampler.undrawn == 4
        buf.push({f: v[0] for f, v in rows([99]).items()})  # over row 0 (drawn)
        got = np.concatenate([buf.sample(2)["id"], buf.sample(2)["id"]])
        assert sorted(got.tolist()) == [1, 2, 3, 99], (seed, got)
        assert buf.sampler.passes == 2
        firsts.add(int(got[0]))
    assert len(firsts) > 1  # the new row's place is random


NEXT_SPEC = {"id": "i8", "obs": ("f4", (3,)), "next_obs": ("f4", (3,)), "reward": "f4",
             "terminated": "?", "truncated": "?"}
NEXT_GROUPS = (("id", "reward"), ("obs", "next_obs", "terminated", "truncated"))


def stream_rows(ids, envs) -> dict:
    """Rows of ``envs`` interleaved streams, each continuous: row ``i``'s next obs is the obs of
    row ``i + envs``, its stream's next step."""
    r = rows(ids)
    r["next_obs"] = r["obs"] + envs
    r["terminated"][:] = False
    return r


@pytest.mark.parametrize("variant", ["envs2-elided", "envs3-nstep", "spill"])
def test_vector_envs_elided_next_n_step_and_spilling_follow_the_rule(variant, tmp_path):
    """The rule with interleaved streams (rows of a step written together), elided next fields,
    n-step returns and a spilling storage: the sampler sees slots only, so every variant draws
    as a plain buffer, the same ids on every layout, projected batches included."""
    envs = {"envs2-elided": 2, "envs3-nstep": 3, "spill": 1}[variant]
    cap = 12
    drawn = []
    for k, layout in enumerate(["aos", "soa", NEXT_GROUPS]):
        kw = {"envs2-elided": {"elide_next": True}, "envs3-nstep": {"n_step": 3, "gamma": 0.5},
              "spill": {"spill_path": str(tmp_path / f"spill{k}"), "hot_rows": 4}}[variant]
        buf = ReplayBuffer(NEXT_SPEC, cap, layout=layout, seed=3, sampler="without_replacement",
                           num_envs=envs, **kw)
        rng, model, next_id, got = np.random.default_rng(1), Model(cap), 0, []
        for step in range(200):
            if rng.random() < 0.35 or len(buf) == 0:
                n = envs * int(rng.choice([1, 2, cap // envs, cap // envs + 1, 3 * cap // envs]))
                ids = np.arange(next_id, next_id + n)
                next_id += n
                r = stream_rows(ids, envs)
                if n == 1 and rng.random() < 0.5:
                    buf.push({f: v[0] for f, v in r.items()})
                else:
                    buf.extend(r)
                model.write(ids)
            else:
                projected = rng.random() < 0.3
                b = buf.sample(int(rng.integers(1, len(buf) + 1)),
                               fields=["id"] if projected else None)
                model.check_batch(b["id"])
                got.append(b["id"].copy())
                if not projected:
                    np.testing.assert_array_equal(b["obs"][:, 0], b["id"].astype(np.float32))
        assert buf.sampler.passes == model.passes > 10
        drawn.append(np.concatenate(got))
    for other in drawn[1:]:
        np.testing.assert_array_equal(drawn[0], other)

def test_every_row_once_per_pass_and_the_same_batches_on_every_layout():
    batches = []
    for layout in LAYOUTS:
        buf = wor(64, layout, seed=5)
        buf.extend(rows(np.arange(100)))  # wrapped: ids 36..99 held
        got = [buf.sample(10, copy=True)["id"] for _ in range(32)]  # 320 draws: 5 passes of 64
        batches.append(np.concatenate(got))
    for other in batches[1:]:
        np.testing.assert_array_equal(batches[0], other)
    flat = batches[0]
    # the pass boundaries fall inside batches; within any pass every id once
    seen, passes = set(), 0
    for i in flat:
        if len(seen) == 64:
            seen, passes = set(), passes + 1
        assert int(i) not in seen and 36 <= i < 100
        seen.add(int(i))
    assert passes == 4 and len(seen) == 64
    assert not (np.sort(flat[:64]) - np.arange(36, 100)).any()  # not in slot order
    assert (flat[:64] != np.arange(36, 100)).any()


def test_projection_n_step_and_clear():
    full, part = wor(32, seed=2, n_step=3, gamma=0.5), wor(32, seed=2, n_step=3, gamma=0.5)
    for b in (full, part):
        b.extend(rows(np.arange(40)))
    for _ in range(10):
        x, y = full.sample(8), part.sample(8, fields=["reward"])
        np.testing.assert_array_equal(x.indices, y.indices)
        np.testing.assert_array_equal(x["reward"], y["reward"])
        np.testing.assert_array_equal(x.discounts, y.discounts)
    with pytest.raises(NotImplementedError, match="policy='reject'"):
        full.sample_sequences(2, 3, policy="reject")
    counter, undrawn = full.sampler.counter, full.sampler.undrawn
    with pytest.raises(NotImplementedError, match="policy='reject'"):
        full.sample_sequences(2, 3, policy="reject")
    assert (full.sampler.counter, full.sampler.undrawn) == (counter, undrawn)  # nothing changed
    full.clear()
    assert full.sampler.passes == 0 and full.sampler.undrawn == 0
    full.extend(rows(np.arange(5)))
    assert sorted(full.sample(5)["id"].tolist()) == [0, 1, 2, 3, 4]


def test_memory_plan_counts_the_pool():
    buf = wor(1000)
    uni = ReplayBuffer(SPEC, 1000, seed=0)
    assert buf.nbytes_parts["bookkeeping"] - uni.nbytes_parts["bookkeeping"] == 5 * 1000
    assert ReplayBuffer.plan_memory(tfdata.Spec(SPEC), 1000, sampler="without_replacement") \
        == buf.nbytes_parts
    with pytest.raises(ValueError, match="sampler must be one of"):
        ReplayBuffer(SPEC, 8, sampler="without-replacement")
    with pytest.raises(ValueError, match="both given"):
        ReplayBuffer(SPEC, 8, seed=1, sampler=WithoutReplacementSampler(1))


# -- state and checkpoints -------------------------------------------------------------------------
def mid_pass(layout="aos") -> ReplayBuffer:
    buf = wor(24, layout, seed=9)
    buf.extend(rows(np.arange(30)))
    drawn = set(buf.sample(12).indices.tolist())
    written = {(30 + k) % 24 for k in range(8)}
    buf.push({f: v[0] for f, v in rows([500]).items()})  # written since the last sample: rows
    buf.extend(rows(np.arange(501, 508)))  # the state must add (some over rows already drawn)
    assert drawn & written and written - drawn
    return buf


def same_future(a, b, n=12):
    for _ in range(n):
        np.testing.assert_array_equal(a.sample(5)["id"], b.sample(5)["id"])
    assert a.sampler.passes == b.sampler.passes


@pytest.mark.parametrize("layout", LAYOUTS, ids=["aos", "soa", "groups"])
def test_state_dict_and_checkpoint_continue_the_pass(layout, tmp_path):
    a = mid_pass(layout)
    c = wor(24, "soa")
    c.load_state_dict(a.state_dict())  # into another layout
    a.save(tmp_path / "ck")
    doc = json.loads((tmp_path / "ck" / "state.json").read_text())
    assert doc["config"]["sampler"] == "without_replacement"
    d = ReplayBuffer.load(tmp_path / "ck")
    assert isinstance(d.sampler, WithoutReplacementSampler)
    for other in (a, c, d):  # the state dict and the save changed nothing of a's future
        same_future(mid_pass(layout), other)



def writes_and_samples(buf, cursor, first_id=1000, steps=40) -> list:
    """A fixed future of writes (one row, a few, exactly to the ring's end, more than the
    capacity) and samples of a full buffer of 24 rows at ``cursor``; the ids of every batch."""
    got, nid = [], first_id
    for t in range(steps):
        if t % 3 == 0:
            k = [1, 3, (24 - cursor) or 24, 30, 2][(t // 3) % 5]
            buf.extend(rows(np.arange(nid, nid + k)))
            nid, cursor = nid + k, (cursor + k) % 24
        else:
            got.append(buf.sample(1 + t % 9)["id"].copy())
    return got


def past_a_pass(layout="aos") -> ReplayBuffer:
    """Mid-pass after two passes completed, rows written since the last sample."""
    buf = wor(24, layout, seed=4)
    buf.extend(rows(np.arange(50)))
    for _ in range(11):
        buf.sample(5)
    buf.extend(rows(np.arange(50, 55)))
    assert buf.sampler.passes == 2 and 0 < buf.sampler.undrawn < 24
    return buf


@pytest.mark.parametrize("layout", LAYOUTS, ids=["aos", "soa", "groups"])
def test_a_used_buffer_that_loads_a_state_continues_the_pass(layout, tmp_path):
    """The loaded pass replaces everything the loading buffer had: its pool and flags, its
    laps, its passes; with writes after the load, the future is the saved buffer's."""
    state = past_a_pass(layout).state_dict()
    past_a_pass(layout).save(tmp_path / "ck")
    want = writes_and_samples(past_a_pass(layout), 55 % 24)
    used = wor(24, layout, seed=77)
    used.extend(rows(np.arange(-200, -100)))  # four laps, another pass order
    for _ in range(7):
        used.sample(8)
    used.extend(rows(np.arange(-100, -95)))  # written, not joined yet
    used.load_state_dict(state)
    assert used.sampler.passes == 2
    fresh = ReplayBuffer.load(tmp_path / "ck")
    assert fresh.sampler.passes == 2
    for buf in (used, fresh):
        got = writes_and_samples(buf, 55 % 24)
        for a, b in zip(want, got):
            np.testing.assert_array_equal(a, b)


def test_a_state_with_negative_passes_is_refused_and_changes_nothing():
    buf = past_a_pass()
    state = buf.state_dict()
    state["without_replacement"] = dict(state["without_replacement"], passes=-1)
    other = wor(24, seed=1)
    other.extend(rows(np.arange(30)))
    other.sample(4)
    before = other.state_dict()
    with pytest.raises(ValueError, match="passes"):
        other.load_state_dict(state)
    after = other.state_dict()
    np.testing.assert_array_equal(before["without_replacement"]["undrawn"],
                                  after["without_replacement"]["undrawn"])
    assert after["sampler"] == before["sampler"] and after["writer"] == before["writer"]



def test_a_state_with_a_uint64_slot_beyond_int64_names_the_slot_given():
    buf = wor(8)
    buf.extend(rows(np.arange(5)))
    state = buf.state_dict()
    for big in (2 ** 63 + 1, 2 ** 64 - 1):
        state["without_replacement"] = {"undrawn": np.array([1, big], np.uint64), "passes": 0}
        with pytest.raises(ValueError, match=f"slot {big} at position 1 is not a row held"):
            buf.load_state_dict(state)

def test_a_uniform_checkpoint_is_unchanged_and_a_foreign_sampler_is_not_saved(tmp_path):
    u = ReplayBuffer(SPEC, 8, seed=0)
    u.extend(rows(np.arange(3)))
    u.save(tmp_path / "u")
    doc = json.loads((tmp_path / "u" / "state.json").read_text())
    assert "sampler" not in doc["config"] and "without_replacement" not in doc["state"]

    class Mine(UniformSampler):
        pass

    m = ReplayBuffer(SPEC, 8, sampler=Mine(0))
    m.extend(rows(np.arange(3)))
    with pytest.raises(TypeError, match="not one of tfdata's samplers"):
        m.save(tmp_path / "m")
    assert not os.path.exists(tmp_path / "m")


def test_hostile_checkpoints_are_refused(tmp_path):
    buf = mid_pass()
    buf.save(tmp_path / "ck")
    doc = json.loads((tmp_path / "ck" / "state.json").read_text())
    ref = doc["state"]["without_replacement"]["undrawn"]["$array"]
    undrawn = np.load(tmp_path / "ck" / ref)

    def broken(what, edit=None, array=None):
        p = tmp_path / f"bad-{len(os.listdir(tmp_path))}"
        shutil.copytree(tmp_path / "ck", p)
        d = json.loads(json.dumps(doc))
        if edit is not None:
            edit(d)
        (p / "state.json").write_text(json.dumps(d))
        if array is not None:
            np.save(p / ref, array)
        with pytest.raises(FormatError, match=what):
            ReplayBuffer.load(p)

    broken("config.sampler", lambda d: d["config"].__setitem__("sampler", "prioritized"))
    broken("without_replacement", lambda d: d["config"].pop("sampler"))  # an unexpected state key
    broken("without_replacement", lambda d: d["state"].pop("without_replacement"))
    broken("passes", lambda d: d["state"]["without_replacement"].__setitem__("passes", -1))
    broken("undrawn", array=np.arange(25))  # more slots than the rows held
    broken("not a row held", array=np.r_[undrawn[:-1], 24])
    broken("given twice", array=np.r_[undrawn[:-1], undrawn[0]])
    broken("undrawn", array=undrawn.astype(np.float64))
    same_future(mid_pass(), ReplayBuffer.load(tmp_path / "ck"))  # the original still loads


# -- sequences: starts drawn without replacement ----------------------------------------------------
@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("num_envs", [1, 2])
def test_sequences_draw_starts_from_the_pass(layout, num_envs):
    """sample_sequences (policy "mask") with rows and slices interleaved: the starts are the
    reference pool's draws (the pass shared with sample()), each slice is the stream model's
    slice from its start (masked past the episode's end or the newest row), and the starts
    and sampled rows follow the rule together: no row twice in a pass."""
    from .test_episodes import Streams

    spec = tfdata.Spec({"obs": ("f4", (2,)), "next_obs": ("f4", (2,)), "action": "i8",
                        "reward": "f4", "terminated": "?", "truncated": "?"})
    cap = 12
    rng = np.random.default_rng(num_envs)
    buf = ReplayBuffer(spec, cap, layout=layout, seed=8, num_envs=num_envs, sampler=WOR_NAME)
    streams, model = Streams(spec, num_envs, rng), naive.StreamModel(cap, num_envs)
    rule, serial, nid = Model(cap), [None] * cap, 0
    pool, m, passes, pending = [0] * cap, 0, 0, 0
    key, counter = naive.key_of(8), 0
    cursor = 0
    for step in range(300):
        if rng.random() < 0.3 or model.size == 0:
            k = int(rng.choice([1, 2, cap // num_envs, cap // num_envs + 1]))
            rows = streams.steps(k)
            buf.extend(rows)
            model.extend(rows)
            n = k * num_envs
            ids = list(range(nid, nid + n))
            for j, i in enumerate(ids):
                serial[(cursor + j) % cap] = i
            cursor, nid, pending = (cursor + n) % cap, nid + n, pending + n
            rule.write(ids)
            continue
        bs = int(rng.integers(1, model.size + 1))
        start = (cursor - pending) % cap
        pool, m, p, idx, counter = naive.pool_sample_naive(pool, m, passes, start, min(pending, cap),
                                                           model.size, key, counter, bs)
        pending = 0
        if rng.random() < 0.6:
            length = int(rng.integers(1, cap // num_envs + 1))
            batch = buf.sample_sequences(bs, length)
            np.testing.assert_array_equal(batch.indices[:, 0], idx)
            for b, s0 in enumerate(idx):
                rows, mask = model.slice(int(s0), length)
                np.testing.assert_array_equal(batch.mask[b], mask)
                for name in spec.names:
                    np.testing.assert_array_equal(batch[name][b], np.stack([r[name] for r in rows]))
        else:
            np.testing.assert_array_equal(buf.sample(bs).indices, idx)
        rule.check_batch([serial[s0] for s0 in idx])
        passes = p
        assert buf.sampler.passes == passes == rule.passes and buf.sampler.counter == counter
    assert passes > 10


def test_pool_slices_refuses_disagreeing_arrays():
    cap = 8
    pool, inpool, meta = np.zeros(cap, np.uint32), np.zeros(cap, np.uint8), np.zeros(3, np.int64)
    _pool.pool_clear(pool, inpool, meta)
    state, episode = np.array([1, 0], np.uint64), np.zeros(cap, np.uint32)
    idx, mask = np.zeros((2, 3), np.int64), np.zeros((2, 3), bool)
    for args in [(0, 3, episode, idx, mask[:1]), (0, 3, episode[:7], idx, mask), (8, 1, episode, idx, mask),
                 (0, 3, episode, idx, mask), (0, 0, episode, idx, mask), (0, 1, episode, idx[:, :0], mask[:, :0])]:
        cursor, envs, ep, i, mk = args
        assert _pool.pool_slices(pool, inpool, meta, 0, 8, 8, state, cursor, envs, ep, i, mk) == -1, args
    assert int(meta[0]) == 0 and not inpool.any() and int(state[1]) == 0
    assert _pool.pool_slices(pool, inpool, meta, 0, 8, 8, state, 0, 2, episode, idx, mask) == 0
    assert len(set(idx[:, 0].tolist())) == 2 and int(meta[0]) == 6
