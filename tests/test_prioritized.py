"""PrioritizedReplayBuffer and the tree kernels against slow references."""

from __future__ import annotations

import numpy as np
import pytest

from tfdata import PrioritizedReplayBuffer, SpecError
from tfdata import kernels

from . import naive
from .conftest import CARTPOLE, assert_batches_equal, random_rows


def trees(capacity):
    """An empty tree in the kernels' layout (see tfdata/kernels/_tree.py): sums, min/max, leaves."""
    size = naive.tree_leaves(capacity)
    sums, mm, leaves = naive.block_tree(np.zeros(0), size)
    return sums, mm, leaves, size


def assert_tree(tree, leaves, size):
    """The kernels' arrays equal a fresh bottom-up build of ``leaves`` (float64, rounded to
    float32 as the tree stores them), bit for bit (``sums[0]``, no node, counts rows written)."""
    ref = naive.block_tree(leaves, size)
    for got, want in zip(tree, ref):
        np.testing.assert_array_equal(got[1:], want[1:])
    np.testing.assert_array_equal(tree[1][0], ref[1][0])
    np.testing.assert_array_equal(tree[2][0], ref[2][0])


@pytest.mark.parametrize("capacity", [1, 7, 33, 1000])
def test_tree_updates_match_a_fresh_build(capacity):
    rng = np.random.default_rng(capacity)
    s, mm, lv, size = trees(capacity)
    leaves = np.zeros(capacity)
    for step in range(80):
        op = step % 5
        if op == 0:
            slots = rng.integers(0, capacity, 5)
            vals = rng.random(5) * 10
            kernels.tree_set(s, mm, lv, slots, vals)
            for a, b in zip(slots, vals):
                leaves[a] = b
        elif op == 1:
            start = int(rng.integers(0, capacity))
            count = int(rng.integers(0, capacity - start + 1))
            v = float(rng.random())
            kernels.tree_fill(s, mm, lv, start, count, v)
            leaves[start:start + count] = v
        elif op == 2:
            start = int(rng.integers(0, capacity))
            vals = rng.random(int(rng.integers(0, capacity - start + 1)))
            kernels.tree_fill_values(s, mm, lv, start, vals)
            leaves[start:start + len(vals)] = vals
        elif op == 3:  # many slots in one call (levels recomputed whole once narrower than it)
            slots = rng.integers(0, capacity, int(rng.integers(1, 3 * capacity + 2)))
            vals = (10.0 ** rng.uniform(-30, 30, len(slots)) + 1e-6) ** 0.6
            kernels.tree_set(s, mm, lv, slots, vals)
            for a, b in zip(slots, vals):
                leaves[a] = b
        else:  # empty a slot again
            slot = int(rng.integers(0, capacity))
            kernels.tree_set(s, mm, lv, np.array([slot]), np.zeros(1))
            leaves[slot] = 0.0
        # recomputed from children every time: bit-identical to a fresh build, no drift
        assert_tree((s, mm, lv), leaves, size)
    kernels.tree_build(s, mm, lv, leaves[:3].copy())
    assert_tree((s, mm, lv), leaves[:3], size)


@pytest.mark.parametrize("capacity", [1, 7, 33, 1000])
def test_overwrite_max_gives_the_live_maximum(capacity):
    """A new row's leaf is the largest leaf of the other slots (1.0 when none is live), read on
    the way up without writing the eviction first; its version grows by one."""
    rng = np.random.default_rng(capacity + 1)
    s, mm, lv, size = trees(capacity)
    version = np.full(capacity, 254, np.uint8)  # and wraps modulo 256
    leaves = np.zeros(capacity)
    for step in range(3 * capacity + 5):
        slot = int(rng.integers(0, capacity))
        if step % 3 == 0:  # change some other leaves, the maximum among them
            others = rng.integers(0, capacity, 3)
            vals = 10.0 ** rng.uniform(-5, 5, 3)
            kernels.tree_set(s, mm, lv, others, vals)
            leaves[others] = naive.leaf32(vals)
        kernels.tree_overwrite_max(s, mm, lv, version, slot)
        rest = np.delete(naive.leaf32(leaves), slot)
        rest = rest[rest > 0]
        leaves[slot] = rest.max() if rest.size else 1.0
        assert_tree((s, mm, lv), leaves, size)
        assert s[0] == step + 1  # rows written
    assert version.dtype == np.uint8


def test_update_kernel_checks_everything_before_writing():
    """tree_update: priorities first (whole batch), then slots, then versions (8-bit count and
    epoch, as :func:`tfdata.kernels._tree.stale_mask` says); on a fault the position and kind
    come back and nothing is written."""
    from tfdata.kernels import _tree

    s, mm, lv, size = trees(40)
    kernels.tree_set(s, mm, lv, np.arange(40), np.ones(40))
    version = (np.arange(40) * 7).astype(np.uint8)
    before = [a.copy() for a in (s, mm, lv, version)]
    slots = np.array([3, 50, 7, 9])
    epoch = 1000
    pri = np.array([1.0, 2.0, np.nan, 4.0])
    vers = version[[3, 0, 7, 8]].astype(np.uint32) | np.uint32(epoch << 8)
    args = (s, mm, lv, version)
    low, high = 0.0, 1e30

    def update(vs, check, laps, n=40):
        return _tree.tree_update(*args, slots, pri, vs, check, laps, n, low, high, 0.0, 1.0,
                                 np.zeros(3, np.float32))  # powers 3 at a time: 2 chunks

    assert update(vers, True, epoch) == 4 * 2 + _tree.BAD_PRIORITY
    pri[2] = 3.0
    assert update(vers, True, epoch) == 4 * 1 + _tree.BAD_SLOT
    slots[1] = 0
    assert update(vers, True, epoch) == 4 * 3 + _tree.STALE  # slot 9's count differs
    assert update(vers, True, epoch, n=5) == 4 * 2 + _tree.BAD_SLOT
    vers[3] = int(version[9]) | (epoch << 8)
    for laps, ok in ((epoch + 253, True), (epoch + 254, False), (epoch - 1, False)):
        assert np.array_equal(_tree.stale_mask(version, slots, vers, laps), np.full(4, not ok))
        if not ok:  # every row: the ring was lapped too often to trust an 8-bit count
            assert update(vers, True, laps) == 4 * 0 + _tree.STALE
    for a, b in zip((s, mm, lv, version), before):
        np.testing.assert_array_equal(a, b)
    assert update(vers, True, epoch + 253) == 0
    leaves = np.ones(40)
    leaves[slots] = pri
    assert_tree((s, mm, lv), leaves, size)


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("capacity", [1, 7, 33])
def test_sample_matches_stratified_reference(layout, capacity):
    # alpha=1, eps=0.5 and integer priorities: half-integer leaves, so every sum is exact and the
    # tree descent must agree with searchsorted on the cumulative sums
    buf = PrioritizedReplayBuffer(CARTPOLE, capacity, alpha=1.0, eps=0.5, beta=0.7,
                                  layout=layout, seed=3)
    rng = np.random.default_rng(0)
    data = random_rows(buf.spec, capacity, rng)
    buf.extend(data, priorities=rng.integers(0, 9, capacity).astype(float))
    key, counter = naive.key_of(3), 0
    for _ in range(10):
        leaves = buf.priorities()
        b = buf.sample(min(5, capacity) if capacity > 1 else 1)
        ref, counter = naive.stratified_slots(key, counter, leaves, len(b.indices))
        np.testing.assert_array_equal(b.indices, ref)
        assert_batches_equal(b, {k: v[ref] for k, v in data.items()})
        # bit for bit: each weight is float32 of the float64 power (Python's, the C library's)
        expected_w = [np.float32((float(leaves.min()) / float(leaves[j])) ** 0.7) for j in ref]
        np.testing.assert_array_equal(b.weights, np.array(expected_w, np.float32))
        buf.update_priorities(b.indices, rng.integers(0, 9, len(b.indices)).astype(float))


def test_sampling_frequencies_follow_priorities():
    buf = PrioritizedReplayBuffer({"x": "i8"}, 8, alpha=0.6, eps=1e-6, seed=11)
    pri = np.array([0.1, 0.5, 1.0, 2.0, 4.0, 0.0, 3.0, 0.7])
    buf.extend({"x": np.arange(8)}, priorities=pri)
    counts = np.zeros(8)
    for _ in range(12_000):
        counts += np.bincount(buf.sample(8).indices, minlength=8)
    p = (pri + 1e-6) ** 0.6
    expected = p / p.sum() * counts.sum()
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 24.32, (counts, expected)  # chi-square 0.999 quantile, 7 dof


def test_new_rows_get_the_current_maximum():
    buf = PrioritizedReplayBuffer({"x": "i8"}, 4, alpha=1.0, eps=1e-9, seed=0)
    buf.push({"x": 0})
    assert buf.priorities()[0] == pytest.approx(1.0)  # empty buffer: 1.0
    buf.extend({"x": np.array([1, 2])}, priorities=[5.0, 3.0])
    buf.push({"x": 3})
    assert buf.priorities()[3] == pytest.approx(5.0)
    buf.update_priorities([1], [2.0])  # the maximum decreases: new rows follow it down
    buf.push({"x": 4})  # overwrites slot 0 (priority 1.0)
    assert buf.priorities()[0] == pytest.approx(5.0)  # slot 3 still holds 5.0
    buf.update_priorities([3, 0], [0.5, 0.5])
    buf.push({"x": 5})  # overwrites slot 1 (2.0): live max is now slot 2's 3.0
    assert buf.priorities()[1] == pytest.approx(3.0)
    buf.extend({"x": np.array([6, 7])})  # overwrites slots 2 (3.0) and 3: max excludes them
    np.testing.assert_allclose(buf.priorities(), [0.5, 3.0, 3.0, 3.0])


def test_priorities_survive_wrap_around(layout):
    buf = PrioritizedReplayBuffer({"x": "i8"}, 5, alpha=1.0, eps=1e-9, seed=0, layout=layout)
    buf.extend({"x": np.arange(3)}, priorities=[1.0, 2.0, 3.0])
    buf.extend({"x": np.arange(3, 7)}, priorities=[4.0, 5.0, 6.0, 7.0])
    np.testing.assert_allclose(buf.priorities(), [6.0, 7.0, 3.0, 4.0, 5.0])
    assert buf.state_dict()["data"]["x"].tolist() == [5, 6, 2, 3, 4]


def test_aos_and_soa_identical():
    bufs = [PrioritizedReplayBuffer(CARTPOLE, 33, layout=lay, seed=9, beta_steps=10)
            for lay in ("aos", "soa")]
    rng = np.random.default_rng(1)
    for step in range(15):
        data = random_rows(bufs[0].spec, 7, rng)
        for b in bufs:
            b.extend(data)
        a, s = (b.sample(min(16, len(b))) for b in bufs)
        np.testing.assert_array_equal(a.indices, s.indices)
        np.testing.assert_array_equal(a.weights, s.weights)
        assert_batches_equal(a, s)
        new = rng.random(len(a.indices)) * 3
        for b, batch in zip(bufs, (a, s)):
            b.update_priorities(batch.indices, new)


def test_beta_schedule():
    buf = PrioritizedReplayBuffer({"x": "i8"}, 8, beta=0.4, beta_final=1.0, beta_steps=4, seed=0)
    buf.extend({"x": np.arange(8)})
    betas = []
    for _ in range(6):
        betas.append(buf.beta)
        buf.sample(2)
    np.testing.assert_allclose(betas, [0.4, 0.55, 0.7, 0.85, 1.0, 1.0])
    assert PrioritizedReplayBuffer({"x": "i8"}, 8, beta=0.3).beta == 0.3


def test_state_round_trip_continues(layout):
    a = PrioritizedReplayBuffer(CARTPOLE, 33, layout=layout, seed=4, beta_steps=50)
    rng = np.random.default_rng(2)
    a.extend(random_rows(a.spec, 40, rng))
    b0 = a.sample(8)
    a.update_priorities(b0.indices, rng.random(8))
    state = a.state_dict()
    for other in ("aos", "soa"):
        b = PrioritizedReplayBuffer(CARTPOLE, 33, layout=other, seed=0, beta_steps=50)
        b.load_state_dict(state)
        c = PrioritizedReplayBuffer(CARTPOLE, 33, layout=layout, seed=0, beta_steps=50)
        c.load_state_dict(state)
        for _ in range(3):
            x, y = b.sample(8), c.sample(8)
            np.testing.assert_array_equal(x.indices, y.indices)
            np.testing.assert_array_equal(x.weights, y.weights)
            assert_batches_equal(x, y)
        np.testing.assert_array_equal(b.priorities(), c.priorities())


@pytest.mark.parametrize("indices,priorities,error,message", [
    ([0, 1], [1.0, np.nan], ValueError, r"finite and >= 0, got nan at position 1"),
    ([0, 1], [np.inf, 1.0], ValueError, r"got inf at position 0"),
    ([0, 1], [1.0, -0.5], ValueError, r"got -0.5 at position 1"),
    ([0, 9], [1.0, 1.0], ValueError, r"indices must be in \[0, 5\), got values in \[0, 9\]"),
    ([-1, 2], [1.0, 1.0], ValueError, r"indices must be in \[0, 5\)"),
    ([0, 1, 2], [1.0, 1.0], SpecError, r"expected priorities of shape \(3,\), got shape \(2,\)"),
    ([0.0, 1.0], [1.0, 1.0], SpecError, r"indices must be a 1-D integer array"),
    ([[0, 1]], [1.0, 1.0], SpecError, r"indices must be a 1-D integer array"),
    ([0, 1], ["a", "b"], SpecError, r"priorities must be numbers"),
])
def test_bad_updates_change_nothing(layout, indices, priorities, error, message):
    buf = PrioritizedReplayBuffer({"x": "i8"}, 8, seed=0, layout=layout)
    buf.extend({"x": np.arange(5)}, priorities=[1, 2, 3, 4, 5])
    before = buf.priorities()
    with pytest.raises(error, match=message):
        buf.update_priorities(indices, priorities)
    np.testing.assert_array_equal(buf.priorities(), before)


def test_bad_push_priorities_change_nothing():
    buf = PrioritizedReplayBuffer({"x": "i8"}, 4, seed=0)
    buf.push({"x": 1})
    before = buf.state_dict()
    for bad in (-1.0, np.nan, "x"):
        with pytest.raises((ValueError, TypeError)):
            buf.push({"x": 2}, priority=bad)
    with pytest.raises(SpecError, match=r"shape \(2,\)"):
        buf.extend({"x": np.arange(2)}, priorities=[1.0])
    after = buf.state_dict()
    assert after["writer"] == before["writer"]
    np.testing.assert_array_equal(after["prioritized"]["leaves"], before["prioritized"]["leaves"])


@pytest.mark.parametrize("bad,message", [
    ({"obs": np.zeros(5, np.float32)}, "obs"),          # wrong shape
    ({"action": 1.5}, "action"),                        # lossy cast
    ({"rewrd": 1.0}, "rewrd"),                          # misspelled field
])
def test_bad_rows_change_nothing_on_the_fast_path(layout, bad, message):
    """A row the per-spec push rejects goes to the generic path, which raises before the row or
    its priority is written: rows, trees, versions and cursor as they were."""
    buf = PrioritizedReplayBuffer(CARTPOLE, 5, layout=layout, seed=0)
    rng = np.random.default_rng(0)
    good = {k: (v[0] if v[0].ndim else v[0].item()) for k, v in random_rows(buf.spec, 1, rng).items()}
    for _ in range(7):  # wrapped: the next push would overwrite a live row
        buf.push(good)
    before = buf.state_dict()
    tree, version = [a.copy() for a in buf.sampler.trees], buf.sampler.version.copy()
    row = dict(good)
    if "rewrd" in bad:
        row["rewrd"] = row.pop("reward")
    else:
        row.update(bad)
    with pytest.raises(SpecError, match=message):
        buf.push(row)
    after = buf.state_dict()
    assert after["writer"] == before["writer"]
    assert_batches_equal(after["data"], before["data"])
    for got, want in zip(buf.sampler.trees, tree):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(buf.sampler.version, version)


@pytest.mark.parametrize("kwargs,message", [
    ({"alpha": -1}, "alpha"), ({"beta": float("nan")}, "beta"), ({"eps": 0}, "eps"),
    ({"beta_steps": 0}, "beta_steps"), ({"alpha": "x"}, "alpha"),
])
def test_bad_construction(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        PrioritizedReplayBuffer({"x": "i8"}, 4, **kwargs)


def test_clear_forgets_priorities():
    buf = PrioritizedReplayBuffer({"x": "i8"}, 4, seed=0, alpha=1.0, eps=1e-9)
    buf.extend({"x": np.arange(4)}, priorities=[9, 9, 9, 9])
    buf.clear()
    buf.push({"x": 1})
    assert buf.priorities()[0] == pytest.approx(1.0)


def test_stale_batches_are_refused(layout):
    buf = PrioritizedReplayBuffer({"x": "i8"}, 4, seed=0, layout=layout, alpha=1.0, eps=1e-9)
    buf.extend({"x": np.arange(4)}, priorities=[1, 2, 3, 4])
    b = buf.sample(4, copy=True)
    buf.update_priorities(b, np.ones(4))  # fresh: accepted
    buf.push({"x": 9})  # overwrites slot 0
    before = buf.priorities()
    if 0 in b.indices:
        with pytest.raises(ValueError, match=r"stale batch: slots \[0"):
            buf.update_priorities(b, np.full(4, 5.0))
        np.testing.assert_array_equal(buf.priorities(), before)
    fresh = buf.sample(4)
    buf.update_priorities(fresh, np.full(4, 2.0))
    assert set(np.flatnonzero(np.isclose(buf.priorities(), 2.0))) == set(fresh.indices.tolist())


def test_a_batch_held_while_8_bit_versions_come_round_is_stale(layout):
    """Versions are 8 bits per slot: after 256 laps of the ring a slot's count is back to its
    value at the sample, and the epoch in ``batch.versions`` refuses the batch (the 253/254-lap
    edge is tested on the kernel); a batch sampled afterwards is accepted."""
    buf = PrioritizedReplayBuffer({"x": "i8"}, 4, seed=0, layout=layout, alpha=1.0, eps=1e-9)
    buf.extend({"x": np.arange(4)})
    old = buf.sample(4, copy=True)
    for _ in range(256):
        buf.extend({"x": np.arange(4)})
    assert np.array_equal(buf.sampler.v8, np.ones(4, np.uint8))  # 257 writes per slot
    before = buf.priorities()
    with pytest.raises(ValueError, match="stale batch"):
        buf.update_priorities(old, np.full(4, 3.0))
    np.testing.assert_array_equal(buf.priorities(), before)
    fresh = buf.sample(4)
    buf.update_priorities(fresh, np.full(4, 3.0))
    np.testing.assert_array_equal(buf.priorities(), np.full(4, np.float32(3.0 + 1e-9)))


def test_sequence_versions_carry_the_epoch(layout):
    """The start rows' versions of ``sample_sequences`` are those a row sample gives now (the
    epoch, laps of the ring, in bits 8 and up); an update of a held sequence batch whose start
    rows were overwritten since is refused, a fresh one accepted."""
    buf = PrioritizedReplayBuffer(CARTPOLE, 16, layout=layout, seed=2)
    rows = random_rows(buf.spec, 16 * 3 + 5, np.random.default_rng(1))
    rows["terminated"][:] = rows["truncated"][:] = False
    for a in range(0, 16 * 3 + 5, 16):  # a lap per extend (an extend keeps its last 16 rows)
        buf.extend({k: v[a:a + 16] for k, v in rows.items()})
    b = buf.sample_sequences(4, 3)
    assert buf.sampler.epoch() == 3 and (b.versions >> 8 == 3).all()
    np.testing.assert_array_equal(b.versions, buf.sampler.version[b.indices[:, 0]])
    old = buf.sample_sequences(4, 3, copy=True)
    buf.extend({k: v[:16] for k, v in rows.items()})  # a lap: every start row overwritten
    before = buf.priorities()
    with pytest.raises(ValueError, match="stale batch"):
        buf.update_priorities(old, np.full(4, 2.0))
    np.testing.assert_array_equal(buf.priorities(), before)
    fresh = buf.sample_sequences(4, 3)
    assert (fresh.versions >> 8 == 4).all()
    buf.update_priorities(fresh, np.full(4, 2.0))


def test_fast_push_sets_what_the_checked_push_sets(layout):
    """The per-spec push with its one-kernel priority update against the generic path: same rows,
    trees, versions and samples, through wrap-around and overwrites of the maximum."""
    import types

    rng = np.random.default_rng(4)
    rows = random_rows(PrioritizedReplayBuffer(CARTPOLE, 7, seed=0).spec, 40, rng)
    fast = PrioritizedReplayBuffer(CARTPOLE, 7, layout=layout, alpha=0.7, seed=1)
    slow = PrioritizedReplayBuffer(CARTPOLE, 7, layout=layout, alpha=0.7, seed=1)
    for i in range(40):
        row = {k: (v[i] if v[i].ndim else v[i].item()) for k, v in rows.items()}
        fast.push(row)
        slow.push(types.MappingProxyType(row))  # not a dict: the generic path
        if i % 5 == 4:  # move the maximum around, so new rows must follow it
            b = fast.sample(3)
            p = rng.random(3) * 4
            fast.update_priorities(b, p)
            slow.update_priorities(slow.sample(3), p)
    assert "on_write(p)" in fast._fast_push.__source__
    for a, b in zip(fast.sampler.trees, slow.sampler.trees):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(fast.sampler.version, slow.sampler.version)
    assert_batches_equal(fast.state_dict()["data"], slow.state_dict()["data"])
    assert_batches_equal(dict(fast.sample(5)), dict(slow.sample(5)))


@pytest.mark.parametrize("priorities,error,message", [
    (np.array([1.0, np.nan]), ValueError, r"finite and >= 0, got nan at position 1"),
    (np.array([-0.5, 1.0]), ValueError, r"got -0.5 at position 0"),
    (np.array([1.0, 1.0, 1.0]), SpecError, r"expected priorities of shape \(2,\), got shape \(3,\)"),
    (np.array([[1.0, 1.0]]), SpecError, r"expected priorities of shape \(2,\), got shape \(1, 2\)"),
])
def test_bad_updates_of_a_batch_change_nothing(layout, priorities, error, message):
    """A batch as sampled with float64 priorities takes the update's short path: the same
    checks, the same refusals, nothing changed."""
    buf = PrioritizedReplayBuffer({"x": "i8"}, 8, seed=0, layout=layout)
    buf.extend({"x": np.arange(5)}, priorities=[1, 2, 3, 4, 5])
    before = buf.priorities()
    batch = buf.sample(2)
    with pytest.raises(error, match=message):
        buf.update_priorities(batch, priorities)
    np.testing.assert_array_equal(buf.priorities(), before)


def test_a_batch_updates_as_its_slots_do(layout):
    """update_priorities(batch, p) with float64 p (the short path), with a list (the checked
    path) and with the batch's indices: the same priorities; a stale batch is refused on the
    short path too, changing nothing."""
    bufs = [PrioritizedReplayBuffer(CARTPOLE, 64, seed=3, layout=layout) for _ in range(3)]
    rng = np.random.default_rng(0)
    for _ in range(5):
        rows = random_rows(bufs[0].spec, 40, rng)
        p = rng.random(16) * 4
        for k, buf in enumerate(bufs):
            buf.extend(rows)
            b = buf.sample(16)
            buf.update_priorities(b if k < 2 else b.indices, p if k == 0 else p.tolist())
        a, c, d = (buf.priorities() for buf in bufs)
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(a, d)
    buf = bufs[0]
    b = buf.sample(16)
    buf.extend(random_rows(buf.spec, 64, rng))  # every slot overwritten
    before = buf.priorities()
    with pytest.raises(ValueError, match="stale batch"):
        buf.update_priorities(b, np.ones(16))
    np.testing.assert_array_equal(buf.priorities(), before)
