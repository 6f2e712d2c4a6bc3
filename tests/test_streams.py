"""Streams (tfdata/replay/streams.py, tfdata/kernels/_streams.py): n-step windows and sequence
slices, written once for a ring of interleaved streams (one process) and for shards of streams
(shared memory), against one reference.

Two levels. The kernels of both kinds run the same streams, laid out once as a ring and once
as shards, and must give the same windows and slices, each equal to the geometry-free
reference of tests/naive.py (the slots that follow a start in its stream, and the flags). The
buffers: the feature x {one process, shared} matrix below runs each feature on a
``ReplayBuffer`` (or ``PrioritizedReplayBuffer``) and on a ``SharedReplayBuffer`` with one
writer, given the same rows; each batch is checked against the reference computed from the
rows' ids, and the two sides' batches must be equal bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdata import PrioritizedReplayBuffer, ReplayBuffer, kernels
from tfdata.shared import SharedReplayBuffer, SharedWriter

from . import naive
from .test_shared_nstep import EPISODE, SPEC, id_rows

NO_EPISODES = np.zeros(0, np.uint32)


# -- kernels: the same streams as a ring and as shards ---------------------------------------
class Layouts:
    """``E`` streams of ``T`` steps written, ``cap`` slots per stream: in a ring of ``E * cap``
    slots (step ``t`` of stream ``e`` in slot ``(t * E + e) % C``) and in ``E`` shards
    (``e * cap + t % cap``), with the same rewards and flags, and each kind's geometry."""

    def __init__(self, rng, num_envs: int, cap: int, steps: int):
        self.E, self.cap, self.T = num_envs, cap, steps
        C = self.C = num_envs * cap
        n = steps * num_envs
        reward = rng.standard_normal(n).astype(np.float32)  # time-major, as written
        term, trunc = rng.random(n) < 0.15, rng.random(n) < 0.05
        self.ring = {k: np.zeros(C, v.dtype) for k, v in (("reward", reward), ("term", term), ("trunc", trunc))}
        self.shard = {k: np.zeros(C, v.dtype) for k, v in self.ring.items()}
        for t in range(steps):
            for e in range(num_envs):
                for k, v in (("reward", reward), ("term", term), ("trunc", trunc)):
                    self.ring[k][self.ring_slot(t, e)] = v[t * num_envs + e]
                    self.shard[k][self.shard_slot(t, e)] = v[t * num_envs + e]
        # the ring's episode numbers, stamped as a buffer stamps its writes
        self.episode = np.zeros(C, np.uint32)
        args = (term, trunc, max(0, n - C), (max(0, n - C)) % C, np.zeros(num_envs, np.uint32),
                self.episode)
        kernels.strided(kernels.stamp_episodes, args, (0, 1), (0, 1))(*args)  # as Episodes does
        self.cursor = n % C
        self.ring_geo = np.array([self.cursor, num_envs, C], np.int64)
        self.heads = [steps] * num_envs
        self.shard_geo = np.zeros(2 + 7 * num_envs, np.int64)
        self.shard_geo[:2] = num_envs, cap
        kernels.read_heads(np.array(self.heads, np.uint64), cap, self.shard_geo[2:])
        self.held = [(t, e) for t in range(max(0, steps - cap), steps) for e in range(num_envs)]

    def ring_slot(self, t, e):
        return (t * self.E + e) % self.C

    def shard_slot(self, t, e):
        return e * self.cap + t % self.cap

    def to_shard(self, slot):
        """The shard slot of the row in ring slot ``slot``."""
        e = slot % self.E
        t = [t for (t, f) in self.held if f == e and self.ring_slot(t, e) == slot][0]
        return self.shard_slot(t, e)

    def forward(self, kind, slot):
        if kind == "ring":
            return naive.ring_forward(slot, self.cursor, self.E, self.C)
        return naive.shard_forward(slot, self.heads, self.cap)


def run_nstep(kind, lay, idx, n, gamma):
    a = lay.ring if kind == "ring" else lay.shard
    geo = lay.ring_geo if kind == "ring" else lay.shard_geo
    B = len(idx)
    acc, ret = np.zeros(B), np.zeros(B, np.float32)
    t_out, r_out = np.zeros(B, bool), np.zeros(B, bool)
    disc, last = np.zeros(B, np.float32), np.zeros(B, np.int64)
    args = (geo, idx, n, gamma, a["reward"], a["term"], a["trunc"], acc, ret, t_out, r_out, disc, last)
    kernels.strided(kernels.BY_STREAMS[kind].nstep, args, kernels.NSTEP_STRIDED)(*args)
    return ret, disc, last, t_out, r_out


@pytest.mark.parametrize("seed", range(12))
def test_the_same_windows_through_both_kinds(seed):
    rng = np.random.default_rng(seed)
    lay = Layouts(rng, int(rng.integers(1, 4)), int(rng.integers(1, 7)), int(rng.integers(1, 15)))
    n, gamma = int(rng.integers(1, 6)), 0.9
    starts = [lay.held[i] for i in rng.integers(0, len(lay.held), 16)]
    got = {}
    for kind, slot_of in (("ring", lay.ring_slot), ("shards", lay.shard_slot)):
        idx = np.array([slot_of(t, e) for t, e in starts], np.int64)
        got[kind] = run_nstep(kind, lay, idx, n, gamma)
        a = lay.ring if kind == "ring" else lay.shard
        ret, disc, last, t_out, r_out = got[kind]
        for i, s in enumerate(idx):
            want, k, j = naive.nstep_forward(lay.forward(kind, int(s)), n, gamma, a["reward"],
                                             a["term"], a["trunc"])
            assert ret[i] == np.float32(want) and disc[i] == np.float32(gamma ** k)
            assert last[i] == j and t_out[i] == a["term"][j] and r_out[i] == a["trunc"][j]
    r, s = got["ring"], got["shards"]
    for x, y in zip(r[:2] + r[3:], s[:2] + s[3:]):
        np.testing.assert_array_equal(x, y)  # bit for bit
    np.testing.assert_array_equal([lay.to_shard(int(j)) for j in r[2]], s[2])


def run_slices(kind, lay, state, length, reject, batch):
    a = lay.ring if kind == "ring" else lay.shard
    geo, ep = (lay.ring_geo, lay.episode) if kind == "ring" else (lay.shard_geo, NO_EPISODES)
    idx, mask = np.zeros((batch, length), np.int64), np.zeros((batch, length), bool)
    got = kernels.BY_STREAMS[kind].slices(geo, len(lay.held), state, ep, a["term"], a["trunc"],
                                          reject, 10_000, idx, mask)
    return got, idx, mask


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("reject", [False, True])
def test_the_same_slices_through_both_kinds(seed, reject):
    rng = np.random.default_rng(seed)
    lay = Layouts(rng, int(rng.integers(1, 4)), int(rng.integers(1, 7)), int(rng.integers(1, 15)))
    length, batch = int(rng.integers(1, 5)), 6
    key = naive.key_of(seed)
    out = {}
    for kind in ("ring", "shards"):
        state = np.array([key, 0], np.uint64)
        got, idx, mask = run_slices(kind, lay, state, length, reject, batch)
        a = lay.ring if kind == "ring" else lay.shard
        if reject and got >= 0:  # no slice of that length exists here
            assert not any(naive.slice_forward(lay.ring_slot(t, e), lay.forward("ring", lay.ring_slot(t, e)),
                                               length, lay.ring["term"], lay.ring["trunc"])[1].all()
                           for t, e in lay.held)
            out[kind] = None
            continue
        assert got == -1
        for b in range(batch):
            s = int(idx[b, 0])
            want_idx, want_mask = naive.slice_forward(s, lay.forward(kind, s), length, a["term"], a["trunc"])
            np.testing.assert_array_equal(idx[b], want_idx)
            np.testing.assert_array_equal(mask[b], want_mask)
            assert not reject or mask[b].all()
        out[kind] = (idx, mask, int(state[1]))
    if out["ring"] is None or out["shards"] is None:
        assert out["ring"] is out["shards"]
        return
    if lay.E == 1:  # one stream: the same draws, the same slots (more streams: other draws)
        for x, y in zip(out["ring"], out["shards"]):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("kind", ["ring", "shards"])
@pytest.mark.parametrize("reject", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_prioritized_starts_match_the_reference(kind, reject, seed):
    rng = np.random.default_rng(seed)
    lay = Layouts(rng, 2, 5, int(rng.integers(3, 12)))
    length, batch = 2, 5
    held = np.zeros(lay.C, bool)
    for t, e in lay.held:
        held[lay.ring_slot(t, e) if kind == "ring" else lay.shard_slot(t, e)] = True
    leaves = naive.leaf32(np.where(held, rng.random(lay.C) + 0.1, 0.0)).astype(np.float64)
    sums, mm, lv = naive.block_tree(leaves, naive.tree_leaves(lay.C))
    version = rng.integers(0, 5, lay.C).astype(np.uint8)
    a = lay.ring if kind == "ring" else lay.shard
    geo, ep = (lay.ring_geo, lay.episode) if kind == "ring" else (lay.shard_geo, NO_EPISODES)
    key = naive.key_of(seed)
    state = np.array([key, 0], np.uint64)
    idx, mask = np.zeros((batch, length), np.int64), np.zeros((batch, length), bool)
    u, w, v = np.zeros(batch), np.zeros(batch, np.float32), np.zeros(batch, np.uint32)
    ring = int(rng.integers(1, 2 * lay.C + 1))  # sums[0] (no node) counts rows written: the epoch
    sums[0] = float(int(rng.integers(0, 40)) * ring + int(rng.integers(0, ring)))
    got = kernels.BY_STREAMS[kind].slices_prioritized(geo, lay.C, sums, mm, lv, version, ring, state, 0.5,
                                                      ep, a["term"], a["trunc"], reject, 10_000, idx,
                                                      mask, u, w, v)
    fits = {s for s in np.flatnonzero(held)
            if naive.slice_forward(int(s), lay.forward(kind, int(s)), length, a["term"], a["trunc"])[1].all()}
    if reject and not fits:
        assert got >= 0
        return
    assert got == -1
    starts, counter = naive.prioritized_slice_starts(key, 0, leaves, batch, lay.C,
                                                     fits if reject else None)
    np.testing.assert_array_equal(idx[:, 0], starts)
    assert int(state[1]) == counter
    for b, s in enumerate(starts):
        want_idx, want_mask = naive.slice_forward(int(s), lay.forward(kind, int(s)), length,
                                                  a["term"], a["trunc"])
        np.testing.assert_array_equal(idx[b], want_idx)
        np.testing.assert_array_equal(mask[b], want_mask)
    np.testing.assert_allclose(w, (leaves[held].min() / leaves[starts]) ** 0.5, rtol=1e-6)
    np.testing.assert_array_equal(v, (int(sums[0]) // ring) << 8 | version[starts].astype(np.uint32))


# -- buffers: the feature x {one process, shared} matrix --------------------------------------
#: what was built once for both sides; each runs on a one-process buffer and on a shared one
FEATURES = {
    "nstep sample": dict(n_step=3, prioritized=False),
    "nstep sample, prioritized": dict(n_step=3, prioritized=True),
    "sample_sequences mask": dict(policy="mask", prioritized=False),
    "sample_sequences reject": dict(policy="reject", prioritized=False),
    "sample_sequences, prioritized starts": dict(policy="mask", prioritized=True),
    "sample_sequences reject, prioritized starts": dict(policy="reject", prioritized=True),
}
SIDES = ("one process", "shared")
CAP, GAMMA, LENGTH = 12, 0.9, 3


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    return tmp_path


def ends(i: int) -> bool:
    return i % EPISODE == EPISODE - 1 or i % 11 == 10


def reference_window(first: int, newest: int, n: int):
    """The n-step window from id ``first`` among ids up to ``newest``: (return, k, last id)."""
    ids = list(range(first, newest + 1))
    return naive.nstep_forward(ids, n, GAMMA, np.arange(newest + 1, dtype=np.float64),
                               [ends(i) for i in range(newest + 1)], [False] * (newest + 1))


def reference_slice(first: int, newest: int):
    """The slice of ``LENGTH`` ids from ``first`` among ids up to ``newest``: (ids, mask)."""
    flags = [ends(i) for i in range(newest + 1)]
    return naive.slice_forward(first, list(range(first, newest + 1)), LENGTH, flags,
                               [False] * (newest + 1))


def make(side: str, opts: dict):
    kw = dict(seed=3)
    if "n_step" in opts:
        kw.update(n_step=opts["n_step"], gamma=GAMMA)
    if side == "shared":
        return SharedReplayBuffer(SPEC, CAP, prioritized=opts["prioritized"], **kw)
    if opts["prioritized"]:
        return PrioritizedReplayBuffer(SPEC, CAP, alpha=0.6, **kw)
    return ReplayBuffer(SPEC, CAP, **kw)


def draw(buf, opts: dict, batch: int):
    if "n_step" in opts:
        return buf.sample(batch, copy=True)
    return buf.sample_sequences(batch, LENGTH, policy=opts["policy"], copy=True)


def check(batch, opts: dict, newest: int) -> None:
    """Every window or slice of ``batch`` is the reference's from its first id."""
    if "n_step" in opts:
        for i, first in enumerate(np.asarray(batch["id"])):
            want, k, last = reference_window(int(first), newest, opts["n_step"])
            assert batch["reward"][i] == want and batch.discounts[i] == np.float32(GAMMA ** k)
            np.testing.assert_array_equal(batch["next_obs"][i], np.full(4, last + 1.0))
            assert batch["terminated"][i] == (last % EPISODE == EPISODE - 1)
        return
    ids = np.asarray(batch["id"])
    for b in range(ids.shape[0]):
        want_ids, want_mask = reference_slice(int(ids[b, 0]), newest)
        np.testing.assert_array_equal(ids[b], want_ids)
        np.testing.assert_array_equal(batch.mask[b], want_mask)
        assert opts["policy"] == "mask" or want_mask.all()


def feed_and_sample(side: str, opts: dict, steps: int = 6):
    """Rows 0, 1, ... written in chunks; after each, a batch checked against the reference.
    Returns the batches (and weights)."""
    rng = np.random.default_rng(7)
    out, start = [], 0
    buf = make(side, opts)
    writer = SharedWriter(buf.name, 0) if side == "shared" else None
    try:
        for _ in range(steps):
            m = int(rng.integers(1, CAP // 2))
            rows = id_rows(np.arange(start, start + m))
            start += m
            if writer is None:
                buf.extend(rows)
            else:
                writer.extend(rows)
            if start < LENGTH + 7 and opts.get("policy") == "reject":
                continue  # maybe no whole slice yet: refused (tested elsewhere)
            batch = draw(buf, opts, 4)
            check(batch, opts, start - 1)
            out.append(batch)
            if opts["prioritized"]:
                first = batch.indices if batch.indices.ndim == 1 else batch.indices[:, 0]
                buf.update_priorities(first, np.arange(1, len(first) + 1, dtype=np.float64))
                out.append(np.asarray(batch.weights))
    finally:
        if writer is not None:
            writer.close()
        if side == "shared":
            buf.close()
    return out


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("feature", list(FEATURES))
def test_feature_matrix_against_the_reference(feature, side, shm_dir):
    assert feed_and_sample(side, FEATURES[feature])


@pytest.mark.parametrize("feature", list(FEATURES))
def test_one_writer_gives_the_one_process_batches(feature, shm_dir):
    one, shared = (feed_and_sample(side, FEATURES[feature]) for side in SIDES)
    assert len(one) == len(shared)
    for a, b in zip(one, shared):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)
            continue
        for k in a.keys():
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        np.testing.assert_array_equal(a.indices, b.indices)


# -- frame stacks: one FrameStack transform over either kind of streams -------------------------
FRAME_FEATURES = {
    "frame stacks": dict(prioritized=False),
    "frame stacks, n-step": dict(prioritized=False, n_step=3),
    "frame stacks, prioritized": dict(prioritized=True),
}


def feed_frames(side: str, opts: dict, steps: int = 6):
    """Transitions of one FrameStackEnv stream written in chunks (with episode ends); after
    each, a batch whose stacks are checked against what was pushed. Returns the batches."""
    from .test_shared_frames import K, WriterEnv, check_stacks, spec_of, take

    rng = np.random.default_rng(5)
    env = WriterEnv(0, p_end=0.2)
    kw = dict(seed=3, frame_stack=K)
    if "n_step" in opts:
        kw.update(n_step=opts["n_step"], gamma=GAMMA)
    if side == "shared":
        buf = SharedReplayBuffer(spec_of(), CAP, prioritized=opts["prioritized"], final_frames=CAP,
                                 **kw)
    elif opts["prioritized"]:
        buf = PrioritizedReplayBuffer(spec_of(), CAP, alpha=0.6, **kw)
    else:
        buf = ReplayBuffer(spec_of(), CAP, **kw)
    writer = SharedWriter(buf.name, 0) if side == "shared" else None
    out = []
    try:
        for _ in range(steps):
            rows = take(env, rng, int(rng.integers(1, CAP // 2)))
            (buf if writer is None else writer).extend(rows)
            batch = buf.sample(4, copy=True)
            check_stacks(batch, gamma=GAMMA if "n_step" in opts else None)
            out.append(batch)
            if opts["prioritized"]:
                buf.update_priorities(batch.indices, np.arange(1, 5, dtype=np.float64))
                out.append(np.asarray(batch.weights))
    finally:
        if writer is not None:
            writer.close()
        if side == "shared":
            buf.close()
    return out


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("feature", list(FRAME_FEATURES))
def test_frame_stacks_on_both_sides_against_the_pushed_stacks(feature, side, shm_dir):
    assert feed_frames(side, FRAME_FEATURES[feature])


@pytest.mark.parametrize("feature", list(FRAME_FEATURES))
def test_one_writer_gives_the_one_process_frame_stacks(feature, shm_dir):
    one, shared = (feed_frames(side, FRAME_FEATURES[feature]) for side in SIDES)
    assert len(one) == len(shared)
    for a, b in zip(one, shared):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b)
            continue
        for k in a.keys():
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        np.testing.assert_array_equal(a.indices, b.indices)


# -- the stack kernels: the same streams as a ring and as shards ----------------------------
@pytest.mark.parametrize("seed", range(8))
def test_the_same_stacks_through_both_kinds(seed):
    """Frames (one word per step, naming stream and step) laid out as a ring and as shards, with
    the same depths, overwritten frames and final tables: the stacks of the same rows are the
    same through both kinds' kernels, and the reference's."""
    rng = np.random.default_rng(seed)
    k = int(rng.integers(2, 5))
    lay = Layouts(rng, int(rng.integers(1, 4)), int(rng.integers(k, k + 4)), int(rng.integers(1, 20)))
    E, cap, T = lay.E, lay.cap, lay.T
    frame = {(t, e): 1000 * e + t + 1 for t in range(-k, T) for e in range(E)}
    depth = {(t, e): int(rng.integers(0, k)) for t in range(T) for e in range(E)}
    ring_src, shard_src = np.zeros((lay.C, 1), np.uint64), np.zeros((lay.C, 1), np.uint64)
    ring_depth, shard_depth = np.zeros(lay.C, np.uint8), np.zeros(lay.C, np.uint8)
    for t, e in lay.held:
        ring_src[lay.ring_slot(t, e)], shard_src[lay.shard_slot(t, e)] = frame[t, e], frame[t, e]
        ring_depth[lay.ring_slot(t, e)] = shard_depth[lay.shard_slot(t, e)] = depth[t, e]
    hist = np.zeros((k - 1, E, 1), np.uint64)
    for t in range(max(0, T - cap - (k - 1)), T - cap):  # the K - 1 steps overwritten last
        for e in range(E):
            hist[t % (k - 1), e] = frame[t, e]
    pad, pending = np.full(1, 7, np.uint64), np.array([[frame[T - 1, e] + 1] for e in range(E)], np.uint64)
    # one final frame per stream, at its rows' entry 0
    f_ring = np.array([[5000 + e] for e in range(E)], np.uint64)
    ring_fidx, shard_fidx = np.full(lay.C, -1, np.int32), np.full(lay.C, -1, np.int32)
    for t, e in lay.held:
        ring_fidx[lay.ring_slot(t, e)], shard_fidx[lay.shard_slot(t, e)] = e, 0
    starts = [lay.held[i] for i in rng.integers(0, len(lay.held), 12)]
    mode = int(rng.integers(3))
    got = {}
    for kind, slot_of, src, dep, fidx, table, geo, steps in (
            ("ring", lay.ring_slot, ring_src, ring_depth, ring_fidx, f_ring, lay.ring_geo, T),
            ("shards", lay.shard_slot, shard_src, shard_depth, shard_fidx, f_ring, lay.shard_geo, 0)):
        a = lay.ring if kind == "ring" else lay.shard
        rows = np.array([slot_of(t, e) for t, e in starts], np.int64)
        dst, nxt = np.zeros((12, k), np.uint64), np.zeros((12, k), np.uint64)
        ks = kernels.STACKS_BY_STREAMS[kind]
        ks.stacks(geo, steps, rows, dep, src, 0, hist, pad, mode, dst)
        kernels.call_strided(ks.next_stacks, (9, 10), geo, steps, rows, dep, src, 0, hist, pad, mode,
                             a["term"], a["trunc"], fidx, table, pending, nxt)
        for i, x in enumerate(rows.tolist()):
            stream = (naive.ring_stream(x, lay.cursor, T, E, lay.C) if kind == "ring"
                      else naive.shard_stream(x, lay.heads, cap))
            own = table if kind == "ring" else table[x // cap:x // cap + 1]
            np.testing.assert_array_equal(dst[i], naive.stack_naive(stream, dep[x], k, src, hist, pad,
                                                                    mode).reshape(-1))
            np.testing.assert_array_equal(nxt[i], naive.next_stack_naive(
                stream, x, k, dep, src, hist, pad, mode, a["term"], a["trunc"], fidx, own,
                pending).reshape(-1))
        got[kind] = dst, nxt
    np.testing.assert_array_equal(got["ring"][0], got["shards"][0])  # bit for bit
    np.testing.assert_array_equal(got["ring"][1], got["shards"][1])
