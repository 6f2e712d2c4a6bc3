"""The compressed cold tier of a spilling frame-stacked buffer (``compress_cold=True``).

Batches equal those of the same spilling buffer without the tier and of a RAM buffer that stores
the whole stacks, with 0, 50% and 90% of the rows cold, across wraps, episode ends, vector envs,
n-step, sequences, prioritized sampling and projections; cold frames are read from the compressed
copies (the file's cold frames are scribbled over and the batches do not change); memory figures
and refused options.

Blocks are 4 or 3 slots (a partial last block) and the cache holds 2 blocks, so that a sample
spans many blocks, passes and evictions; one test runs the shipped block size.
"""

from __future__ import annotations

import numpy as np
import pytest

import tfdata
from tfdata.storage import cold as coldmod

from . import naive
from .test_frames import spec_of, steps_of

LAYOUTS = ["aos", "soa", [["action", "reward"], ["terminated", "truncated"]]]
FRAME = (6, 5)


@pytest.fixture
def small_blocks(monkeypatch):
    pytest.importorskip("zstandard")  # the compress extra
    monkeypatch.setattr(coldmod, "BLOCK", 4)
    monkeypatch.setattr(coldmod, "CACHE_BYTES", 1)  # 2 blocks


def spill(tmp_path, name, layout):
    return tmp_path / (name + (".npy" if layout == "aos" else ""))


def trio(tmp_path, spec, capacity, hot, num_envs=1, layout="aos", cls=tfdata.ReplayBuffer, **kw):
    """The cold-tier buffer, the same spilling buffer without the tier, and the RAM buffer that
    stores whole stacks."""
    k = spec["obs"][1][0]
    common = dict(num_envs=num_envs, seed=7, layout=layout, **kw)
    a = cls(spec, capacity, frame_stack=k, spill_path=spill(tmp_path, "a", layout), hot_rows=hot,
            compress_cold=True, **common)
    b = cls(spec, capacity, frame_stack=k, spill_path=spill(tmp_path, "b", layout), hot_rows=hot,
            **common)
    c = cls(spec, capacity, **common)
    return a, b, c


def same(x, y, names):
    np.testing.assert_array_equal(np.asarray(x.indices), np.asarray(y.indices))
    for f in names:
        np.testing.assert_array_equal(np.asarray(x[f]), np.asarray(y[f]), err_msg=f)
    for attr in ("discounts", "weights", "mask"):
        u, v = getattr(x, attr, None), getattr(y, attr, None)
        if u is not None or v is not None:
            np.testing.assert_array_equal(u, v, err_msg=attr)


def put_all(bufs, step, num_envs):
    for buf in bufs:
        if num_envs == 1:
            buf.push({k: v[0] for k, v in step.items()})
        else:
            buf.extend(step)


def scribble(buf, name="obs"):
    """Overwrite the file's frames of every slot whose compressed copy is valid: a batch that
    still equals the reference read them from the copies."""
    info = buf.cold_info[name]
    col = buf.storage.field(name)
    # every slot of a block whose copy is valid from offset 0 to its end (the test knows the
    # tier's tables: ColdFrames.cold_from; the storage field is the frame column)
    tier = buf._cold[name]  # noqa: SLF001 (a test may look inside)
    hit = 0
    for b in range(tier.nblocks):
        lo = int(tier.cold_from[b])
        start = b * tier.block
        n = min(tier.block, buf.capacity - start)
        if lo < n:
            col[start + lo:start + n] ^= 0x5A
            hit += n - lo
    assert info["blocks"] > 0
    return hit


@pytest.mark.parametrize("layout", LAYOUTS, ids=["aos", "soa", "groups"])
@pytest.mark.parametrize("num_envs", [1, 3])
@pytest.mark.parametrize("cold", [0.0, 0.5, 0.9])
def test_batches_equal_without_the_tier_and_full_stacks(tmp_path, small_blocks, layout, num_envs, cold):
    k = 4
    spec = spec_of(k, FRAME)
    cap = 30 * num_envs  # 30 steps per stream: with blocks of 4, the last block is partial for 3 envs
    hot = max(1, round(cap * (1 - cold)))
    env = naive.FrameStackEnv(num_envs, k, frame=FRAME, p_end=0.08)
    rng = np.random.default_rng(num_envs)
    a, b, c = trio(tmp_path, spec, cap, hot, num_envs, layout)
    for t, step in enumerate(steps_of(env, rng, 100)):  # the ring wraps three times
        put_all((a, b, c), step, num_envs)
        if len(a) >= 8:
            x, y, z = a.sample(8), b.sample(8), c.sample(8)
            same(x, y, spec)
            same(x, z, spec)
            if t % 5 == 0:
                for f in (["next_obs", "action"], ["obs"]):
                    same(a.sample(4, fields=f), c.sample(4, fields=f), f)
                    b.sample(4, fields=f)
    info = a.cold_info["obs"]
    if cold >= 0.5:
        assert info["decompressed"] > 0 and info["blocks"] > 0
    else:
        assert info["blocks"] == 0  # nothing is cold
    assert a.state_dict()["data"].keys() == b.state_dict()["data"].keys()
    for f, v in a.state_dict()["data"].items():  # the file holds every row as without the tier
        np.testing.assert_array_equal(v, b.state_dict()["data"][f])


@pytest.mark.parametrize("variant", ["nstep", "per", "per_nstep", "zero", "value"])
def test_variants(tmp_path, small_blocks, variant):
    k, num_envs = 3, 2
    spec = spec_of(k, FRAME)
    cls = tfdata.PrioritizedReplayBuffer if variant.startswith("per") else tfdata.ReplayBuffer
    kw = {"n_step": 3} if "nstep" in variant else {}
    pad = {"zero": "zero", "value": np.full(FRAME, 9, np.uint8)}.get(variant, "reset")
    if variant in ("zero", "value"):
        kw["frame_padding"] = pad
    cap = 26 * num_envs
    env = naive.FrameStackEnv(num_envs, k, frame=FRAME, padding=pad, p_end=0.1)
    rng = np.random.default_rng(11)
    full_kw = {key: v for key, v in kw.items() if key != "frame_padding"}
    a = cls(spec, cap, num_envs=num_envs, seed=3, frame_stack=k, spill_path=tmp_path / "a.npy",
            hot_rows=5, compress_cold=True, **kw)
    c = cls(spec, cap, num_envs=num_envs, seed=3, **full_kw)
    for t, step in enumerate(steps_of(env, rng, 90)):
        a.extend(step)
        c.extend(step)
        if len(a) >= 10:
            x, y = a.sample(10), c.sample(10)
            same(x, y, spec)
            if cls is tfdata.PrioritizedReplayBuffer:
                p = rng.random(10) + 0.1
                a.update_priorities(x, p)
                c.update_priorities(y, p)
    assert a.cold_info["obs"]["decompressed"] > 0


@pytest.mark.parametrize("num_envs", [1, 3])
def test_sequences(tmp_path, small_blocks, num_envs):
    k = 4
    spec = spec_of(k, FRAME)
    cap = 24 * num_envs
    env = naive.FrameStackEnv(num_envs, k, frame=FRAME, p_end=0.1)
    rng = np.random.default_rng(5)
    a, b, c = trio(tmp_path, spec, cap, 3 * num_envs, num_envs, "soa")
    for t, step in enumerate(steps_of(env, rng, 70)):
        put_all((a, b, c), step, num_envs)
        if len(a) >= 6 * num_envs:
            x, y = a.sample_sequences(4, 5), c.sample_sequences(4, 5)
            same(x, y, spec)
            x, y = a.sample_sequences(3, 4, fields=["next_obs"]), c.sample_sequences(3, 4, fields=["next_obs"])
            same(x, y, ["next_obs"])


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_cold_frames_come_from_the_copies(tmp_path, small_blocks, layout):
    """The file's frames of the compressed slots are scribbled over: batches do not change (and
    the same scribble shows in the buffer without the tier, so it does reach the batches)."""
    k, num_envs = 4, 3
    spec = spec_of(k, FRAME)
    cap = 20 * num_envs
    env = naive.FrameStackEnv(num_envs, k, frame=FRAME, p_end=0.1)
    rng = np.random.default_rng(2)
    a, b, c = trio(tmp_path, spec, cap, 6, num_envs, layout)
    for step in steps_of(env, rng, 45):
        put_all((a, b, c), step, num_envs)
    assert scribble(a) > cap // 2
    for _ in range(20):
        same(a.sample(16), c.sample(16), spec)
    col_a, col_b = a.storage.field("obs"), b.storage.field("obs")
    col_b[...] = col_a  # the scribbled file, without the tier
    assert any(not np.array_equal(b.sample(16)["obs"], c.sample(16)["obs"]) for _ in range(20))


def test_writes_after_compression_invalidate_copies(tmp_path, small_blocks):
    """Writes one row at a time and in chunks that start and end mid-block, with fewer hot rows
    than a block (slots of a block are overwritten while its copy is still held)."""
    k = 3
    spec = spec_of(k, FRAME)
    rng = np.random.default_rng(9)
    for hot in (1, 2, 5):
        env = naive.FrameStackEnv(1, k, frame=FRAME, p_end=0.05)
        a = tfdata.ReplayBuffer(spec, 23, seed=1, frame_stack=k, spill_path=tmp_path / f"a{hot}.npy",
                                hot_rows=hot, compress_cold=True)
        c = tfdata.ReplayBuffer(spec, 23, seed=1)
        steps = steps_of(env, rng, 120)
        i = 0
        while i < len(steps):
            n = int(rng.integers(1, 9))
            part = steps[i:i + n]
            batch = {f: np.concatenate([s[f] for s in part]) for f in part[0]}
            a.extend(batch)
            c.extend(batch)
            i += n
            same(a.sample(len(a)), c.sample(len(c)), spec)
        # a write longer than the ring
        more = steps_of(env, rng, 30)
        batch = {f: np.concatenate([s[f] for s in more]) for f in spec}
        a.extend(batch)
        c.extend(batch)
        same(a.sample(23), c.sample(23), spec)
        assert a.cold_info["obs"]["blocks"] > 0


def test_shipped_block_size(tmp_path):
    pytest.importorskip("zstandard")
    k = 4
    spec = spec_of(k, (10, 12))
    cap = 300
    env = naive.FrameStackEnv(1, k, frame=(10, 12), p_end=0.02)
    rng = np.random.default_rng(4)
    a, b, c = trio(tmp_path, spec, cap, 30, 1, "aos")
    assert a.cold_info["obs"]["block"] == coldmod.BLOCK == 16
    for step in steps_of(env, rng, 420):
        put_all((a, b, c), step, 1)
    for _ in range(5):
        x, z = a.sample(32), c.sample(32)
        same(x, z, spec)
    info = a.cold_info["obs"]
    # positions [120, 390) are cold: blocks 8..18 (the last of 12 slots) and 0..4 whole (block 7
    # is entered in its middle); the cursor (slot 120) is in block 7, whose copy of the previous
    # lap is held for the slots not overwritten yet, from offset 120 - 112
    assert info["blocks"] == 17 and int(a._cold["obs"].cold_from[7]) == 8  # noqa: SLF001
    assert info["ratio"] > 2


def test_clear_and_load_state(tmp_path, small_blocks):
    k, num_envs = 4, 2
    spec = spec_of(k, FRAME)
    cap = 20 * num_envs
    env = naive.FrameStackEnv(num_envs, k, frame=FRAME, p_end=0.1)
    rng = np.random.default_rng(3)
    a, b, c = trio(tmp_path, spec, cap, 4, num_envs, "soa")
    steps = steps_of(env, rng, 80)
    for step in steps[:50]:
        put_all((a, b), step, num_envs)
    fixed = a.nbytes_parts["cold"] - a._cold["obs"].compressed  # noqa: SLF001
    a.clear()
    assert a.cold_info["obs"]["blocks"] == 0 and a.nbytes_parts["cold"] == fixed
    a.load_state_dict(b.state_dict())  # the rows as they were: compressed on load
    assert a.cold_info["obs"]["blocks"] == (cap - 4) // 4  # every cold block (the cursor at a block's start)
    for step in steps[50:]:
        same(a.sample(8), b.sample(8), spec)
        put_all((a, b), step, num_envs)
    a.clear()
    b.clear()
    env = naive.FrameStackEnv(num_envs, k, frame=FRAME, p_end=0.1)
    for step in steps_of(env, rng, 50):
        put_all((a, b), step, num_envs)
        if len(a) >= 8:
            same(a.sample(8), b.sample(8), spec)
    assert a.cold_info["obs"]["decompressed"] > 0


def test_memory(tmp_path, small_blocks):
    k = 4
    spec = spec_of(k, (16, 16))
    cap, hot = 200, 40
    frame = 256
    opts = dict(frame_stack=k, spill_path=tmp_path / "p.npy", hot_rows=hot)
    plan = tfdata.ReplayBuffer.plan_memory(spec, cap, compress_cold=True, **opts)
    plain = tfdata.ReplayBuffer.plan_memory(spec, cap, **opts)
    fixed, bound = coldmod.planned_nbytes(cap, hot, frame)
    assert bound == (cap - hot + 4) * frame
    assert plan == dict(plain, cold=fixed + bound)
    a = tfdata.ReplayBuffer(spec, cap, seed=0, compress_cold=True, **opts)
    assert a.nbytes_parts == dict(plain, cold=fixed)
    env = naive.FrameStackEnv(1, k, frame=(16, 16), p_end=0.05)
    rng = np.random.default_rng(0)
    for step in steps_of(env, rng, 500):
        a.extend(step)
    tier = a._cold["obs"]  # noqa: SLF001
    held = [blob for blob in tier.blobs if blob is not None]
    import sys

    assert tier.compressed == sum(sys.getsizeof(x) for x in held)
    assert a.nbytes_parts["cold"] == fixed + tier.compressed
    assert a.nbytes_parts["cold"] <= plan["cold"]
    info = a.cold_info["obs"]
    assert info["raw_bytes"] == len(held) * 4 * frame and info["compressed_bytes"] == sum(map(len, held))
    assert info["ratio"] > 3  # synthetic frames: a few distinct bytes each
    assert len(held) == (cap - hot) // 4


def test_budget_refuses_compression_not_rows(tmp_path, small_blocks):
    """A memory budget that holds the buffer but only part of the copies: blocks beyond it stay
    in the file, the buffer never exceeds the budget, batches are unchanged."""
    k = 4
    spec = spec_of(k, (16, 16))
    cap, hot = 200, 40
    opts = dict(frame_stack=k, hot_rows=hot, seed=0)
    plan = tfdata.ReplayBuffer.plan_memory(spec, cap, spill_path="p", compress_cold=True,
                                           batch_sizes=[8], **opts)
    fixed_only = sum(plan.values()) - coldmod.planned_nbytes(cap, hot, 256)[1]
    budget = fixed_only + 4500  # room for some of the copies only
    a = tfdata.ReplayBuffer(spec, cap, spill_path=tmp_path / "a.npy", compress_cold=True,
                            memory_budget=budget, **opts)
    c = tfdata.ReplayBuffer(spec, cap, frame_stack=k, seed=0)
    env = naive.FrameStackEnv(1, k, frame=(16, 16), p_end=0.05)
    rng = np.random.default_rng(0)
    for s in steps_of(env, rng, 400):
        a.extend(s)
        c.extend(s)
        if len(a) >= 8:
            same(a.sample(8), c.sample(8), spec)
        assert a.nbytes <= budget
    info = a.cold_info["obs"]
    assert info["refused"] > 0 and 0 < info["blocks"] < (cap - hot) // 4
    assert info["shed"] > 0  # the episode-final table grew into the room the copies had taken
    held, tier = info["blocks"], a._cold["obs"]  # noqa: SLF001
    free = budget - a.nbytes
    # a new output ring larger than the room left, smaller than the room and the copies
    size = next(b for b in range(1, 200)
                if free < tfdata.ReplayBuffer.plan_memory(
                    spec, cap, batch_sizes=[(b, None, ["action"])])["output_rings"]
                <= free + tier.compressed // 2)
    with pytest.raises(tfdata.MemoryBudgetError):  # more than the copies could free: none dropped
        a.sample(cap, fields=["obs"])
    assert a.cold_info["obs"]["blocks"] == held
    a.sample(size, fields=["action"])  # copies are dropped to make room
    assert 0 < a.cold_info["obs"]["blocks"] < held and a.nbytes <= budget
    no_rings = fixed_only - plan["output_rings"]
    with pytest.raises(tfdata.MemoryBudgetError):  # the tables and the cache alone do not fit
        tfdata.ReplayBuffer(spec, cap, spill_path=tmp_path / "b.npy", compress_cold=True,
                            memory_budget=no_rings - 1, **opts)
    assert not (tmp_path / "b.npy").exists()
    tfdata.ReplayBuffer(spec, cap, spill_path=tmp_path / "b.npy", compress_cold=True,
                        memory_budget=no_rings, **opts)


def test_refused_options(tmp_path, monkeypatch):
    spec = spec_of(4, FRAME)
    with pytest.raises(ValueError, match="needs frame_stack"):
        tfdata.ReplayBuffer(spec, 40, spill_path=tmp_path / "a.npy", hot_rows=4, compress_cold=True)
    with pytest.raises(ValueError, match="needs spill_path"):
        tfdata.ReplayBuffer(spec, 40, frame_stack=4, compress_cold=True)
    with pytest.raises(TypeError, match="True or False"):
        tfdata.ReplayBuffer(spec, 40, frame_stack=4, spill_path=tmp_path / "a.npy", hot_rows=4,
                            compress_cold="zstd")
    with pytest.raises(ValueError, match="needs frame_stack"):
        tfdata.ReplayBuffer.plan_memory(spec, 40, compress_cold=True)
    import sys

    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard raises ImportError
    with pytest.raises(ImportError, match=r"tfdata\[compress\]"):
        tfdata.ReplayBuffer(spec, 40, frame_stack=4, spill_path=tmp_path / "a.npy", hot_rows=4,
                            compress_cold=True)
    assert not (tmp_path / "a.npy").exists()  # refused before the file was made
    # without the tier, spilling works as before
    tfdata.ReplayBuffer(spec, 40, frame_stack=4, spill_path=tmp_path / "a.npy", hot_rows=4)


def test_kernels_against_reference():
    """The cold kernels, every mode, against ``naive.cold_stacks_naive`` on random bookkeeping,
    cold tables (garbage included) and caches; and LIST + ALL + COLD passes give the stacks of
    the storage-only kernels when the cache holds the blocks' frames."""
    from tfdata.kernels import RING_STACKS, cold_frame_stacks, cold_next_frame_stacks
    from tfdata.kernels._cold import ALL, COLD, LIST

    def flagged(kernel, at):
        """``kernel`` with its flags (``at``, ``at + 1``) typed as of any stride, as the
        buffers call it."""
        return lambda *args: tfdata.kernels.call_strided(kernel, (at, at + 1), *args)

    rng = np.random.default_rng(0)
    for trial in range(400):
        k = int(rng.integers(2, 5))
        e = int(rng.integers(1, 4))
        cap = e * int(rng.integers(k, 12))
        width = int(rng.integers(1, 4))
        block = int(rng.integers(1, 6))
        nb = -(-cap // block)
        steps = int(rng.integers(cap // e, 4 * cap // e))
        cursor = (steps * e) % cap
        depth = rng.integers(0, k + 2, cap).astype(np.uint8)  # beyond k-1 too: bounded
        src = rng.integers(0, 2**16, (cap, width + 2)).astype(np.uint64)
        hist = rng.integers(0, 2**16, (k - 1, e, width)).astype(np.uint64)
        pad = rng.integers(0, 2**16, width).astype(np.uint64)
        pmode = int(rng.integers(0, 3))
        cold_from = rng.integers(-2, block + 2, nb).astype(np.int32)
        ncache = int(rng.integers(1, 4))
        cache = rng.integers(0, 2**16, (ncache, block, width)).astype(np.uint64)
        filled = rng.integers(-1, block + 2, ncache).astype(np.int64)
        cache_map = rng.integers(-2, ncache + 2, nb).astype(np.int32)
        rows = rng.integers(0, cap, int(rng.integers(1, 9))).astype(np.int64)
        term = rng.random(cap) < 0.2
        trunc = rng.random(cap) < 0.1
        finals = rng.integers(0, 2**16, (3, width)).astype(np.uint64)
        final_idx = rng.integers(-1, 5, cap).astype(np.int32)
        pending = rng.integers(0, 2**16, (e, width)).astype(np.uint64)
        off = int(rng.integers(0, 3))
        for nxt in (False, True):
            args = (rows, cursor, steps, e, cap, depth, src, off, hist, pad, pmode)
            extra = (term, trunc, final_idx, finals, pending) if nxt else ()
            npos = k - 1 if nxt else k
            for mode in (LIST, ALL, COLD):
                dst = rng.integers(0, 2**16, (rows.shape[0], k * width)).astype(np.uint64)
                mark = rng.integers(0, 3, nb).astype(np.int32)
                need = np.full(int(rng.integers(1, nb + 1)), -7, np.int32)  # short: a bound
                reach = rng.integers(-1, block + 1, nb).astype(np.int32)
                pre = int(rng.integers(0, 2))
                want_dst, want_need, want_mark, want_reach = naive.cold_stacks_naive(
                    rows, cursor, steps, e, cap, depth, src, off, hist, pad, pmode, extra, cold_from,
                    block, cache_map, cache, filled, mode, mark, 2, need, reach, pre, dst, npos)
                kern = flagged(cold_next_frame_stacks, 11) if nxt else cold_frame_stacks
                got = kern(*args, *extra, cold_from, block, cache_map, cache, filled, mode, mark, 2, need,
                           reach, pre, dst)
                assert got == len(want_need), trial
                np.testing.assert_array_equal(dst, want_dst, err_msg=str((trial, nxt, mode)))
                np.testing.assert_array_equal(need[:got], want_need, err_msg=str(trial))
                np.testing.assert_array_equal(mark, want_mark, err_msg=str(trial))
                np.testing.assert_array_equal(reach, want_reach, err_msg=str(trial))
            # passes with a valid tier: the cache holds the blocks' frames -> the plain stacks
            cf = rng.integers(0, block + 1, nb).astype(np.int32)
            plain = np.zeros((rows.shape[0], k * width), np.uint64)
            kp = flagged(RING_STACKS.next_stacks, 9) if nxt else RING_STACKS.stacks
            kp(np.array([cursor, e, cap], np.int64), steps, *args[:1], *args[5:], *extra, plain)
            dst = np.full_like(plain, 0xABCD)
            mark = np.zeros(nb, np.int32)
            need = np.zeros(nb, np.int32)
            reach = np.zeros(nb, np.int32)
            kern = flagged(cold_next_frame_stacks, 11) if nxt else cold_frame_stacks
            cmap = np.full(nb, -1, np.int32)
            csh = np.zeros((1, block, width), np.uint64)
            fill = np.zeros(1, np.int64)
            count = kern(*args, *extra, cf, block, cmap, csh, fill, LIST, mark, 1, need, reach, 0, dst)
            assert len(set(need[:count].tolist())) == count
            mode = ALL
            for b in list(need[:count]) or [None]:  # a cache of one block: a pass per block
                cmap[:] = -1
                csh[...] = 0xEEEE
                if b is not None:  # decompressed up to the frame reach says, no further
                    start = b * block
                    n = int(reach[b])
                    assert 1 <= n <= min(block, cap - start)
                    csh[0, :n] = src[start:start + n, off:off + width]
                    cmap[b] = 0
                    fill[0] = n
                kern(*args, *extra, cf, block, cmap, csh, fill, mode, mark, 1, need, reach, 0, dst)
                mode = COLD
            np.testing.assert_array_equal(dst, plain, err_msg=str((trial, nxt)))


def test_assign_against_reference():
    """The cache's slot assignment on random states (garbage included) against
    ``naive.cold_assign_naive``; and on a consistent cache: every block of a pass ends up cached,
    in a slot of its own."""
    from tfdata.kernels._cold import cold_assign

    rng = np.random.default_rng(1)
    for trial in range(2000):
        nb = int(rng.integers(1, 12))
        nc = int(rng.integers(1, 5))
        count = int(rng.integers(0, 10))
        need = rng.integers(-2, nb + 2, max(count, 1)).astype(np.int32)
        start = int(rng.integers(0, count + 1))
        cache_map = rng.integers(-2, nc + 2, nb).astype(np.int32)
        slot_block = rng.integers(-2, nb + 2, nc).astype(np.int64)
        reach = rng.integers(0, 5, nb).astype(np.int32)
        filled = rng.integers(0, 5, nc).astype(np.int64)
        slot_used = rng.integers(0, 5, nc).astype(np.int64)
        slot_pass = rng.integers(0, 3, nc).astype(np.int64)
        pass_id, clock = int(rng.integers(0, 3)), 10
        want = naive.cold_assign_naive(need, reach, start, count, cache_map, slot_block, filled,
                                       slot_used, slot_pass, pass_id, clock)
        todo = np.full(nc, -5, np.int32)
        got = cold_assign(need, reach, start, count, cache_map, slot_block, filled, slot_used,
                          slot_pass, pass_id, clock, todo)
        assert got[0] == want[0] and got[2] == want[2], trial
        np.testing.assert_array_equal(todo[:got[1]], want[1])
        for arr, w in zip((cache_map, slot_block, filled, slot_used, slot_pass), want[3:]):
            np.testing.assert_array_equal(arr, w, err_msg=str(trial))
    # consistent states: passes over distinct blocks, as a sample makes them
    nb, nc = 20, 3
    cache_map = np.full(nb, -1, np.int32)
    slot_block = np.full(nc, -1, np.int64)
    filled = np.zeros(nc, np.int64)
    used, passes = np.zeros(nc, np.int64), np.zeros(nc, np.int64)
    clock, pid = 0, 0
    for trial in range(300):
        need = rng.permutation(nb)[:int(rng.integers(0, 8))].astype(np.int32)
        reach = rng.integers(1, 5, nb).astype(np.int32)
        i = 0
        while True:
            pid += 1
            todo = np.zeros(nc, np.int32)
            j, n, clock = cold_assign(need, reach, i, len(need), cache_map, slot_block, filled, used,
                                      passes, pid, clock, todo)
            assert j - i <= nc and (j > i or i == len(need))
            for b in need[i:j]:
                assert slot_block[cache_map[b]] == b and filled[cache_map[b]] >= reach[b]
            i = j
            if i >= len(need):
                break
        held = [b for b in range(nb) if cache_map[b] >= 0]
        assert sorted(cache_map[held].tolist()) == sorted(set(cache_map[held].tolist()))


def test_a_sample_allocates_no_frames(tmp_path, small_blocks):
    """Blocks are decompressed into the cache: a steady-state sample allocates a few small
    Python objects (the codec's reader, views), never a block or a stack (16 KiB blocks here)."""
    import tracemalloc

    k, frame = 4, (64, 64)
    spec = spec_of(k, frame)
    env = naive.FrameStackEnv(1, k, frame=frame, p_end=0.05)
    rng = np.random.default_rng(0)
    a = tfdata.ReplayBuffer(spec, 200, seed=0, frame_stack=k, spill_path=tmp_path / "a.npy",
                            hot_rows=20, compress_cold=True)
    for step in steps_of(env, rng, 250):
        a.extend(step)
    for _ in range(20):
        a.sample(16)
    before = a.cold_info["obs"]["decompressed"]
    tracemalloc.start()
    try:
        for _ in range(20):
            tracemalloc.reset_peak()
            cur = tracemalloc.get_traced_memory()[0]
            a.sample(16)
            assert tracemalloc.get_traced_memory()[1] - cur < 8192
    finally:
        tracemalloc.stop()
    assert a.cold_info["obs"]["decompressed"] > before + 100  # blocks were decompressed


def test_threads_share_the_cache(tmp_path, small_blocks):
    """Three threads sample at once through a cache of two blocks: every batch's stacks are those
    the full-stack buffer holds at the batch's slots."""
    import threading

    k, num_envs = 4, 2
    spec = spec_of(k, FRAME)
    cap = 40 * num_envs
    env = naive.FrameStackEnv(num_envs, k, frame=FRAME, p_end=0.1)
    rng = np.random.default_rng(8)
    a, _, c = trio(tmp_path, spec, cap, 6, num_envs, "aos")
    for step in steps_of(env, rng, 130):
        put_all((a, c), step, num_envs)
    obs, nxt = c.storage.field("obs"), c.storage.field("next_obs")
    bad, done = [], []

    def run():
        try:
            for _ in range(150):
                x = a.sample(12, copy=True)
                idx = np.asarray(x.indices)
                if not (np.array_equal(x["obs"], obs[idx]) and np.array_equal(x["next_obs"], nxt[idx])):
                    bad.append(idx)
            done.append(1)
        except Exception as exc:  # noqa: BLE001 (reported below)
            bad.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad and len(done) == 3
    assert a.cold_info["obs"]["decompressed"] > 300
