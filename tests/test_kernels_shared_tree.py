"""The learner-side kernels of a shared buffer (tfdata/kernels/_shared_tree.py) against their
references in tests/naive.py, on random shards, heads, reserves and trees."""

from __future__ import annotations

import numpy as np
import pytest

from tfdata import kernels

from . import naive

NO_EPISODES = np.zeros(0, np.uint32)  # shard streams end episodes at flagged rows


def tree_of(leaves: np.ndarray):
    """The kernels' tree of ``leaves``: ``(sums, mm, leaves32)``."""
    return naive.block_tree(leaves, naive.tree_leaves(len(leaves)))


def shard_geo(heads: np.ndarray, cap: int) -> np.ndarray:
    """The geometry of shard streams (tfdata/kernels/_streams.py): ``[shards, cap]`` then the
    heads snapshot of ``read_heads``."""
    shards = len(heads)
    geo = np.zeros(2 + 7 * shards, np.int64)
    geo[:2] = shards, cap
    kernels.read_heads(np.asarray(heads).astype(np.uint64), cap, geo[2:])
    return geo


def f32(x: np.ndarray) -> np.ndarray:
    """Leaves the tree stores exactly (float32 values), as float64."""
    return naive.leaf32(x).astype(np.float64)


@pytest.mark.parametrize("seed", range(20))
def test_the_prioritized_catch_up_matches_the_reference(seed):
    """The rows published since the last sample listed (published_spans), then each given what
    a push gives it (overwrite_max_spans, the prioritized sampler's one-row hook over them): the
    fold of the reference."""
    from tfdata.kernels._shared_tree import overwrite_max_spans, published_spans

    rng = np.random.default_rng(seed)
    shards, cap = int(rng.integers(1, 4)), int(rng.integers(1, 9))
    slots = shards * cap
    folded = rng.integers(0, 3 * cap, shards)
    heads = folded + rng.integers(0, 3 * cap, shards)  # some shards lapped since the last fold
    leaves = f32(np.where(rng.random(slots) < 0.8, rng.random(slots) + 0.1, 0.0))
    version = rng.integers(250, 256, slots).astype(np.uint8)  # and wraps modulo 256
    want = naive.fold_published_naive(leaves, version, heads.tolist(), folded.tolist(), cap)
    s, mm, lv = tree_of(leaves)
    v, f = version.copy(), folded.astype(np.int64).copy()
    scratch = np.zeros(7 * shards + 4, np.int64)
    spans = np.zeros((2 * shards, 2), np.int64)
    held, m = published_spans(heads.astype(np.uint64), cap, scratch, f, spans)
    overwrite_max_spans(s, mm, lv, v, spans[:m])
    np.testing.assert_array_equal(lv[:slots], want[0])
    for got, ref in zip((s, mm, lv), tree_of(want[0])):  # the whole tree, as a fresh build
        np.testing.assert_array_equal(got[1:], ref[1:])
    # sums[0], no node, counts the rows folded
    assert s[0] == sum(max(0, h - max(f, h - cap)) for f, h in zip(folded.tolist(), heads.tolist()))
    np.testing.assert_array_equal(v, want[1])
    np.testing.assert_array_equal(f, want[2])
    assert held == want[3]
    np.testing.assert_array_equal(scratch[shards:2 * shards], heads)  # the snapshot it read


@pytest.mark.parametrize("seed", range(10))
def test_draw_prioritized_matches_the_stratified_reference(seed):
    rng = np.random.default_rng(seed)
    slots, batch = int(rng.integers(1, 40)), int(rng.integers(1, 9))
    leaves = f32(np.where(rng.random(slots) < 0.7, rng.random(slots) + 0.05, 0.0))
    leaves[rng.integers(0, slots)] = 0.5  # at least one live leaf
    s, mm, lv = tree_of(leaves)
    version = rng.integers(0, 9, slots).astype(np.uint8)
    state = np.array([naive.key_of(seed), 3], np.uint64)
    idx, u = np.zeros(batch, np.int64), np.zeros(batch)
    w, v = np.zeros(batch, np.float32), np.zeros(batch, np.uint32)
    ring = int(rng.integers(1, 2 * slots + 1))  # sums[0] (no node) counts rows written: the epoch
    s[0] = float(int(rng.integers(0, 40)) * ring + int(rng.integers(0, ring)))
    assert kernels.draw_prioritized(s, mm, lv, version, ring, state, 0.6, idx, u, w, v) == 0
    want, counter = naive.stratified_slots(naive.key_of(seed), 3, leaves, batch, slots)
    np.testing.assert_array_equal(idx, want)
    assert int(state[1]) == counter
    live = leaves[leaves > 0]
    np.testing.assert_allclose(w, (live.min() / leaves[idx]) ** 0.6, rtol=1e-6)
    np.testing.assert_array_equal(v, (int(s[0]) // ring) << 8 | version[idx].astype(np.uint32))
    empty = np.zeros_like(s)
    assert kernels.draw_prioritized(empty, mm, lv, version, ring, state, 0.6, idx, u, w, v) == -1


@pytest.mark.parametrize("seed", range(20))
def test_torn_after_copy_matches_the_writer_windows(seed):
    rng = np.random.default_rng(seed)
    shards, cap, batch = int(rng.integers(1, 4)), int(rng.integers(1, 9)), 12
    heads = rng.integers(0, 4 * cap, shards)
    reserved = heads + rng.integers(0, cap + 2, shards)
    scratch = np.zeros(7 * shards + batch, np.int64)
    kernels.read_heads(heads.astype(np.uint64), cap, scratch)
    idx = rng.integers(0, shards * cap, batch)
    mark = np.zeros(batch, np.int64)
    torn = kernels.torn_after_copy(reserved.astype(np.uint64), cap, scratch, idx, mark)
    busy = naive.writer_windows(heads.tolist(), reserved.tolist(), cap)
    want = np.array([int(int(x) in busy) for x in idx])
    np.testing.assert_array_equal(mark, want)
    assert torn == want.sum()


@pytest.mark.parametrize("seed", range(20))
def test_shard_streams_nstep_matches_the_reference(seed):
    rng = np.random.default_rng(seed)
    shards, cap, n, gamma = int(rng.integers(1, 4)), int(rng.integers(1, 9)), int(rng.integers(1, 5)), 0.7
    slots = shards * cap
    heads = rng.integers(1, 3 * cap, shards)
    geo = shard_geo(heads, cap)
    reward = rng.random(slots).astype(np.float32)
    term, trunc = rng.random(slots) < 0.2, rng.random(slots) < 0.1
    held = [s * cap + j for s in range(shards) for j in range(min(int(heads[s]), cap))]
    idx = np.array(rng.choice(held, 10), np.int64)
    acc, ret = np.zeros(10), np.zeros(10, np.float32)
    t_out, r_out = np.zeros(10, bool), np.zeros(10, bool)
    disc, last = np.zeros(10, np.float32), np.zeros(10, np.int64)
    args = (geo, idx, n, gamma, reward, term, trunc, acc, ret, t_out, r_out, disc, last)
    kernels.strided(kernels.SHARDS.nstep, args, kernels.NSTEP_STRIDED)(*args)
    for i, start in enumerate(idx):
        g, k, j = naive.nstep_forward(naive.shard_forward(int(start), heads.tolist(), cap), n, gamma,
                                      reward, term, trunc)
        assert ret[i] == np.float32(g) and last[i] == j and disc[i] == np.float32(gamma ** k)
        assert t_out[i] == term[j] and r_out[i] == trunc[j]
        assert j // cap == start // cap  # never leaves its shard


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("reject", [False, True])
def test_shard_streams_slices_match_the_reference(seed, reject):
    rng = np.random.default_rng(seed)
    shards, cap, length, batch = int(rng.integers(1, 4)), int(rng.integers(2, 9)), int(rng.integers(1, 4)), 6
    slots = shards * cap
    heads = rng.integers(1, 3 * cap, shards)
    geo = shard_geo(heads, cap)
    term, trunc = rng.random(slots) < 0.15, rng.random(slots) < 0.05
    state = np.array([naive.key_of(seed), 0], np.uint64)
    idx, mask = np.zeros((batch, length), np.int64), np.zeros((batch, length), bool)
    got = kernels.SHARDS.slices(geo, 0, state, NO_EPISODES, term, trunc, reject, 10_000, idx, mask)
    if reject and got >= 0:
        return  # no slice of that length exists here: refused (the buffer restores the counter)
    assert got == -1
    starts, counter = naive.shard_slice_starts(naive.key_of(seed), 0, heads.tolist(), cap, batch,
                                               length, term, trunc, reject)
    np.testing.assert_array_equal(idx[:, 0], starts)
    assert int(state[1]) == counter
    for b, s in enumerate(starts):
        want_idx, want_mask = naive.slice_forward(int(s), naive.shard_forward(int(s), heads.tolist(), cap),
                                                  length, term, trunc)
        np.testing.assert_array_equal(idx[b], want_idx)
        np.testing.assert_array_equal(mask[b], want_mask)
        assert (idx[b] // cap == s // cap).all()  # never leaves its shard


@pytest.mark.parametrize("seed", range(10))
def test_shard_streams_slices_prioritized_match_the_reference(seed):
    rng = np.random.default_rng(seed)
    shards, cap, length, batch = 2, 8, 3, 5
    slots = shards * cap
    heads = np.array([12, 5])
    geo = shard_geo(heads, cap)
    held = np.zeros(slots, bool)
    held[:8] = True
    held[8:13] = True
    leaves = f32(np.where(held, rng.random(slots) + 0.1, 0.0))
    s, mm, lv = tree_of(leaves)
    version = rng.integers(0, 5, slots).astype(np.uint8)
    term, trunc = rng.random(slots) < 0.2, np.zeros(slots, bool)
    state = np.array([naive.key_of(seed), 0], np.uint64)
    idx, mask = np.zeros((batch, length), np.int64), np.zeros((batch, length), bool)
    u, w, v = np.zeros(batch), np.zeros(batch, np.float32), np.zeros(batch, np.uint32)
    s[0] = float(3 * cap + 5)  # rows written so far: epoch 3 of a shard's ring of cap rows
    assert kernels.SHARDS.slices_prioritized(geo, 0, s, mm, lv, version, cap, state, 0.5, NO_EPISODES,
                                             term, trunc, False, 10, idx, mask, u, w, v) == -1
    starts, _ = naive.stratified_slots(naive.key_of(seed), 0, leaves, batch, slots)
    np.testing.assert_array_equal(idx[:, 0], starts)
    for b, st0 in enumerate(starts):
        want_idx, want_mask = naive.slice_forward(int(st0), naive.shard_forward(int(st0), heads.tolist(), cap),
                                                  length, term, trunc)
        np.testing.assert_array_equal(idx[b], want_idx)
        np.testing.assert_array_equal(mask[b], want_mask)
    np.testing.assert_allclose(w, (leaves[held].min() / leaves[starts]) ** 0.5, rtol=1e-6)
    np.testing.assert_array_equal(v, 3 << 8 | version[starts].astype(np.uint32))
