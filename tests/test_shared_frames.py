"""SharedReplayBuffer(frame_stack=): frame stacks stored one frame per row in shared memory.

The oracle is a SharedReplayBuffer that stores the whole ``obs`` and ``next_obs`` stacks: with
the same seed and rows, the batches are bit for bit the same (one writer, and several shards
written in turn). With real writer processes lapping their shards while the learner samples,
every stack equals what its writer pushed for that row: frames carry ``(writer, episode, step)``
in every pixel (``naive.frame_of``) and each row's ``id`` names the step of its newest frame, so
a frame of another writer, episode, step or lap shows.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from tfdata import FormatError, SharedBufferError, SpecError
from tfdata.shared import SharedReplayBuffer, SharedWriter, region_nbytes

from . import naive

FORK = mp.get_context("fork")
K = 4
FRAME = (3, 2)
LAYOUTS = ["aos", "soa", [["id", "reward"], ["terminated", "truncated"]]]
PAD = np.full(FRAME, 77, np.uint8)


def spec_of(k=K, frame=FRAME, next_obs=True):
    s = {"id": "i8", "obs": ("u1", (k,) + tuple(frame))}
    if next_obs:
        s["next_obs"] = ("u1", (k,) + tuple(frame))
    s.update(reward="f4", terminated="?", truncated="?")
    return s


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    d = tmp_path / "shm"
    d.mkdir()
    monkeypatch.setenv("TFDATA_SHM_DIR", str(d))
    return d


class WriterEnv(naive.FrameStackEnv):
    """One stream of FrameStackEnv whose frames name the writer ``w``."""

    def __init__(self, w, k=K, **kw):
        self.w = w
        super().__init__(1, k, **kw)

    def _frame(self, env):
        return naive.frame_of(self.w, self.episode[env], self.t[env], self.frame, self.dtype)


def take(env, rng, n, next_obs=True) -> dict:
    """``n`` consecutive transitions of ``env`` as arrays; ``id`` = writer, episode and step of
    the newest obs frame."""
    out = []
    for _ in range(n):
        i = env.w * 10**9 + env.episode[0] * 10**5 + env.t[0]
        s = env.step(rng)
        row = {"id": np.array([i]), "obs": s["obs"]}
        if next_obs:
            row["next_obs"] = s["next_obs"]
        row.update(reward=rng.random(1).astype(np.float32), terminated=s["terminated"],
                   truncated=s["truncated"])
        out.append(row)
    return {f: np.concatenate([r[f] for r in out]) for f in out[0]}


def one(rows, i) -> dict:
    return {f: v[i] for f, v in rows.items()}


def check_stacks(batch, k=K, padding="reset", frame=FRAME, gamma=None) -> None:
    """Every row's stacks are what its writer pushed: the FrameStackObservation stacks of the
    step its id names (``next_obs``: of the step after; n-step, ``gamma``: after the window's
    ``k`` steps, from ``batch.discounts``)."""
    ids = np.asarray(batch["id"])
    after = np.ones(ids.shape[0], np.int64)
    if gamma is not None:
        after = np.rint(np.log(np.asarray(batch.discounts, np.float64)) / np.log(gamma)).astype(np.int64)
    for i, x in enumerate(ids.tolist()):
        w, rest = divmod(x, 10**9)
        ep, t = divmod(rest, 10**5)
        if "obs" in batch:
            np.testing.assert_array_equal(batch["obs"][i], naive.stack_of(w, ep, t, k, padding, frame),
                                          err_msg=f"obs of row {i}, id {x}")
        if "next_obs" in batch:
            np.testing.assert_array_equal(batch["next_obs"][i],
                                          naive.stack_of(w, ep, t + int(after[i]), k, padding, frame),
                                          err_msg=f"next_obs of row {i}, id {x}")


def same(x, y, names) -> None:
    np.testing.assert_array_equal(np.asarray(x.indices), np.asarray(y.indices))
    for f in names:
        np.testing.assert_array_equal(np.asarray(x[f]), np.asarray(y[f]), err_msg=f)


def region_bytes(buf) -> bytes:
    with open(os.path.join(buf.path, "region"), "rb") as f:
        return f.read()


# -- one writer: the full-stack buffer's batches ------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS, ids=["aos", "soa", "groups"])
@pytest.mark.parametrize("padding", ["reset", "zero", "value"])
def test_one_writer_equals_full_stacks(layout, padding, shm_dir):
    pad = PAD if padding == "value" else padding
    spec = spec_of()
    cap = 9
    rng = np.random.default_rng(len(padding))
    env = WriterEnv(0, padding=pad, p_end=0.2)
    with SharedReplayBuffer(spec, cap, seed=5, layout=layout, frame_stack=K, frame_padding=pad,
                            final_frames=cap) as a, \
            SharedReplayBuffer(spec, cap, seed=5, layout=layout) as b, \
            SharedWriter(a.name, 0) as wa, SharedWriter(b.name, 0) as wb:
        for step in range(40):
            m = int(rng.integers(1, cap + 4))  # pushes, extends, wraps, writes longer than the ring
            rows = take(env, rng, m)
            if m < 3:
                for i in range(m):
                    wa.push(one(rows, i))
                    wb.push(one(rows, i))
            else:
                assert wa.extend(rows) == wb.extend(rows)
            n = len(a)
            same(a.sample(n), b.sample(n), spec)
            x = a.sample(5, copy=True)
            same(x, b.sample(5), spec)
            check_stacks(x, padding=pad)
            if step % 5 == 0:
                for fields in (["next_obs", "reward"], ["obs"], ["id", "terminated"]):
                    same(a.sample(3, fields=fields), b.sample(3, fields=fields), fields)


def test_several_shards_equal_full_stacks(shm_dir):
    """Shards written in turn from this process: the draws and every stack of a buffer of three
    shards equal the full-stack one's (a stack never leaves its shard)."""
    spec = spec_of()
    shards, cap = 3, 6
    rng = np.random.default_rng(7)
    envs = [WriterEnv(w, p_end=0.25) for w in range(shards)]
    with SharedReplayBuffer(spec, shards * cap, num_writers=shards, seed=1, frame_stack=K,
                            final_frames=cap) as a, \
            SharedReplayBuffer(spec, shards * cap, num_writers=shards, seed=1) as b:
        wa = [SharedWriter(a.name, s) for s in range(shards)]
        wb = [SharedWriter(b.name, s) for s in range(shards)]
        for step in range(60):
            s = int(rng.integers(shards))
            rows = take(envs[s], rng, int(rng.integers(1, cap + 2)))
            wa[s].extend(rows)
            wb[s].extend(rows)
            n = len(a)
            x = a.sample(n)
            same(x, b.sample(n), spec)
            check_stacks(x)
        for w in wa + wb:
            w.close()


def test_stacks_without_a_next_field(shm_dir):
    spec = spec_of(next_obs=False)
    rng = np.random.default_rng(3)
    env = WriterEnv(1, p_end=0.2)
    with SharedReplayBuffer(spec, 16, num_writers=2, seed=2, frame_stack=K) as a, \
            SharedReplayBuffer(spec, 16, num_writers=2, seed=2) as b, \
            SharedWriter(a.name, 1) as wa, SharedWriter(b.name, 1) as wb:
        for _ in range(12):
            rows = take(env, rng, 3, next_obs=False)
            wa.extend(rows)
            wb.extend(rows)
            x = a.sample(len(a))
            same(x, b.sample(len(b)), spec)
            check_stacks(x)


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("n_step", [None, 3])
def test_n_step_and_prioritized_equal_full_stacks(layout, prioritized, n_step, shm_dir):
    """n-step: obs the window's first row's stack, next_obs its last row's next stack;
    prioritized: the same weights, and priorities updated alike."""
    if not (prioritized or n_step):
        return
    spec = spec_of()
    rng = np.random.default_rng(3)
    kw = dict(n_step=n_step, gamma=0.9, seed=4, layout=layout, prioritized=prioritized)
    with SharedReplayBuffer(spec, 10, frame_stack=K, final_frames=10, **kw) as a, \
            SharedReplayBuffer(spec, 10, **kw) as b, \
            SharedWriter(a.name, 0) as wa, SharedWriter(b.name, 0) as wb:
        env = WriterEnv(0, p_end=0.2)
        for _ in range(25):
            rows = take(env, rng, int(rng.integers(1, 11)))  # a fold skips rows lapped before it
            wa.extend(rows)
            wb.extend(rows)
            for size in (1, min(4, len(a)), len(a)):
                x, y = a.sample(size), b.sample(size)
                same(x, y, spec)
                check_stacks(x, gamma=0.9 if n_step else None)
                if n_step:
                    np.testing.assert_array_equal(x.discounts, y.discounts)
                if prioritized:
                    np.testing.assert_array_equal(x.weights, y.weights)
                    p = rng.random(size) + 0.5
                    a.update_priorities(x, p)
                    b.update_priorities(y, p)
            for fields in (["next_obs"], ["obs", "reward"]):
                same(a.sample(3, fields=fields), b.sample(3, fields=fields), fields)


# -- writer processes -----------------------------------------------------------------------
def _write_all(names, seed, n, errors):
    """One writer process: the same rows to the shard 0 of every buffer named."""
    try:
        rng = np.random.default_rng(seed)
        env = WriterEnv(0, p_end=0.2)
        writers = [SharedWriter(name, 0) for name in names]
        done = 0
        while done < n:
            m = int(rng.integers(1, 6))
            rows = take(env, rng, m)
            for w in writers:
                if m == 1:
                    w.push(one(rows, 0))
                else:
                    w.extend(rows)
            done += m
        for w in writers:
            w.close()
    except BaseException as exc:
        errors.put(repr(exc))


def test_writer_process_gives_the_full_stack_batches(shm_dir):
    spec = spec_of()
    errors = FORK.Queue()
    with SharedReplayBuffer(spec, 20, seed=11, frame_stack=K, final_frames=20) as a, \
            SharedReplayBuffer(spec, 20, seed=11) as b:
        p = FORK.Process(target=_write_all, args=([a.name, b.name], 4, 57, errors))
        p.start()
        p.join(30)
        assert errors.empty(), errors.get()
        assert a.writers()[0]["published"] == b.writers()[0]["published"] >= 57
        for size in (20, 7, 1, 20):
            x = a.sample(size)
            same(x, b.sample(size), spec)
            check_stacks(x)


def _race(name, shard, stop, errors):
    try:
        rng = np.random.default_rng(shard)
        env = WriterEnv(shard, p_end=0.15)
        with SharedWriter(name, shard) as w:
            while not stop.is_set():
                m = int(rng.integers(1, 4))
                rows = take(env, rng, m)
                if m == 1:
                    w.push(one(rows, 0))
                else:
                    w.extend(rows)
    except BaseException as exc:
        errors.put(f"shard {shard}: {exc!r}")


@pytest.mark.parametrize("kw", [{}, dict(n_step=3, gamma=0.5, prioritized=True)], ids=["uniform", "per-nstep"])
def test_stacks_stay_whole_while_writer_processes_lap_their_shards(kw, shm_dir):
    spec = spec_of()
    errors, stop = FORK.Queue(), FORK.Event()
    shards, cap = 3, 12
    with SharedReplayBuffer(spec, shards * cap, num_writers=shards, seed=3, frame_stack=K,
                            final_frames=cap, **kw) as buf:
        procs = [FORK.Process(target=_race, args=(buf.name, s, stop, errors)) for s in range(shards)]
        for p in procs:
            p.start()
        try:
            deadline = time.monotonic() + 20
            while len(buf) < shards * cap and time.monotonic() < deadline:
                time.sleep(0.01)
            def done():  # 3000 rows sampled, every writer lapped, a stack redrawn
                return (sampled >= 3000 and buf.redraws > 0
                        and all(w["published"] > 10 * cap for w in buf.writers()))

            sampled = 0
            deadline = time.monotonic() + 300  # a cap: the loop runs until done, not for a time
            while not done() and time.monotonic() < deadline:
                b = buf.sample(32)
                check_stacks(b, gamma=kw.get("gamma"))
                sampled += 32
        finally:
            stop.set()
            for p in procs:
                p.join(30)
        assert errors.empty(), errors.get()
        assert sampled >= 3000
        assert {w["published"] > 10 * cap for w in buf.writers()} == {True}  # every writer lapped
        assert buf.redraws > 0, "no stack was ever redrawn: the writers did not race the reader"


# -- a write in flight: what the learner must not return ----------------------------------------
class _Stopped(Exception):
    pass


class _StopBeforePublish:
    """The kernels of a writer, except that publishing fails: the rows (and their frame
    bookkeeping) are written, the head is not moved, as if the writer died mid-write."""

    def __init__(self, k):
        self.k = k

    def __getattr__(self, name):
        return getattr(self.k, name)

    def shard_publish(self, *args):
        raise _Stopped


@pytest.mark.parametrize("m,n_step", [(1, None), (2, None), (5, None), (2, 3)])
def test_rows_whose_stacks_read_a_write_in_flight_are_never_sampled(m, n_step, shm_dir):
    """A write of ``m`` rows stored but not published: the rows it overwrites, the rows whose
    stacks read them as older frames (up to K - 1 after them), and the newest published row
    (its pending next frame was replaced; n-step: every window that ends there) must be drawn
    again, every time."""
    spec = spec_of()
    cap = 10
    rng = np.random.default_rng(m)
    env = WriterEnv(0, p_end=0.0)  # one long episode: every row's stack reads K - 1 rows back
    kw = {} if n_step is None else dict(n_step=n_step, gamma=0.5)
    with SharedReplayBuffer(spec, cap, seed=4, frame_stack=K, **kw) as buf:
        w = SharedWriter(buf.name, 0)
        w.extend(take(env, rng, 2 * cap + 3))  # lapped: hist is in use
        head = w.published
        w._k = _StopBeforePublish(w._k)
        with pytest.raises(_Stopped):
            w.extend(take(env, rng, m))
        rows = {r % cap: r for r in range(head - cap, head)}  # slot -> row held
        overwritten = set(range(head - cap, head - cap + m))
        unsafe = {r for r in range(head - cap, head) if any(r - j in overwritten for j in range(K))}
        for r in range(head - (n_step or 1), head):  # next frame: the newest row's pending
            unsafe.add(r)
        seen = set()
        for _ in range(60):
            b = buf.sample(8)
            check_stacks(b, gamma=kw.get("gamma"))
            seen.update(rows[int(x)] for x in b.indices)
        assert not seen & unsafe, sorted(seen & unsafe)
        assert seen == set(rows.values()) - unsafe  # every other row is drawn (480 draws)
        assert buf.redraws > 0


# -- insert checks ----------------------------------------------------------------------------
def test_refused_writes_change_nothing_in_the_region(shm_dir):
    spec = spec_of(k=3)
    rng = np.random.default_rng(1)
    env = WriterEnv(0, k=3, p_end=0.0)
    with SharedReplayBuffer(spec, 12, seed=0, frame_stack=3) as buf, SharedWriter(buf.name, 0) as w:
        late = take(WriterEnv(0, k=3, p_end=0.0), rng, 5)
        before = region_bytes(buf)
        with pytest.raises(SpecError, match="starts an episode"):
            w.push(one(late, 4))  # mid-episode: its older frames are not in the shard
        assert region_bytes(buf) == before
        w.extend(take(env, rng, 4))
        good = take(env, rng, 2)
        before = region_bytes(buf)
        bad = {f: v.copy() for f, v in good.items()}
        bad["obs"][1, 0] ^= 1  # an older frame that is not the stream's
        with pytest.raises(SpecError, match="shard 0, row 1 of the write.*frames 0..1 of the stack differ"):
            w.extend(bad)
        bad = {f: v.copy() for f, v in good.items()}
        bad["next_obs"][0, 1] ^= 1
        with pytest.raises(SpecError, match="shifted by one frame"):
            w.extend(bad)
        bad = {f: v[:1].copy() for f, v in good.items()}
        bad["obs"][0, -1] ^= 1  # the newest frame is not the previous row's next frame
        bad["next_obs"][0, -2] ^= 1
        with pytest.raises(SpecError, match="newest frame of 'obs' differs"):
            w.extend(bad)
        bad = {f: v.copy() for f, v in good.items()}
        bad["obs"][1, -1] ^= 1  # nor within the write
        bad["next_obs"][1, -2] ^= 1
        with pytest.raises(SpecError, match="row 1 of the write: the newest frame"):
            w.extend(bad)
        with pytest.raises(SpecError, match="obs"):
            w.push({**one(good, 0), "obs": np.zeros((2,) + FRAME, np.uint8)})  # the spec's own check
        assert region_bytes(buf) == before
        w.extend(good)  # and the stream goes on
        check_stacks(buf.sample(len(buf)), k=3)


def test_a_full_final_table_refuses_the_write(shm_dir):
    spec = spec_of()
    rng = np.random.default_rng(2)
    env = WriterEnv(0, p_end=1.0)  # every row ends an episode
    with SharedReplayBuffer(spec, 8, seed=0, frame_stack=K, final_frames=3) as buf, \
            SharedWriter(buf.name, 0) as w:
        w.extend(take(env, rng, 3))
        before = region_bytes(buf)
        with pytest.raises(SharedBufferError, match="final_frames=3 .* full"):
            w.push(one(take(env, rng, 1), 0))
        assert region_bytes(buf) == before
    # episodes of 3 rows in a shard of 8: at most 3 ends held, a table of 3 is enough for ever
    env = WriterEnv(0, p_end=0.0)
    with SharedReplayBuffer(spec, 8, seed=0, frame_stack=K, final_frames=3) as buf, \
            SharedWriter(buf.name, 0) as w:
        for _ in range(30):
            rows = take(env, rng, 3)
            rows["truncated"][-1] = True
            env.episode[0] += 1
            env.t[0] = 0
            env.queues[0] = env._reset(0)
            w.extend(rows)
            check_stacks(buf.sample(len(buf)))


# -- memory ---------------------------------------------------------------------------------
def test_region_holds_one_frame_per_row(shm_dir):
    spec = spec_of(frame=(84, 84))
    cap, shards = 1000, 4
    full = region_nbytes(spec, cap, num_writers=shards)
    plan = region_nbytes(spec, cap, num_writers=shards, frame_stack=K)
    with SharedReplayBuffer(spec, cap, num_writers=shards, frame_stack=K) as buf:
        assert buf.nbytes == plan == buf.nbytes_parts["shared_region"]
    frame = 84 * 84
    per_row = plan / cap
    # a frame, the small fields, depth and final index, the hist, finals and pending per shard
    assert frame <= per_row <= frame * (1 + 3 * shards / cap + 1 / 32) + 64
    assert full / plan > 7.5, full / plan
    for kw in (dict(layout="soa"), dict(layout=[["id", "reward"]]), dict(final_frames=7)):
        with SharedReplayBuffer(spec_of(), 16, num_writers=2, frame_stack=K, **kw) as buf:
            assert buf.nbytes == region_nbytes(spec_of(), 16, num_writers=2, frame_stack=K, **kw)


# -- options --------------------------------------------------------------------------------
def test_options_are_refused_before_the_region_exists(shm_dir):
    spec = spec_of()
    cases = [
        (dict(mode="fifo"), ValueError, "frame_stack=True with mode='fifo'"),
        (dict(sampler="exactly_k"), ValueError, "sampler='exactly_k'.*not in stream order"),
        (dict(sampler="without_replacement"), NotImplementedError, "sampler='without_replacement'"),
        (dict(final_frames=0), ValueError, "final_frames"),
        (dict(final_frames=17), ValueError, r"final_frames: expected an int in \[1, 16\]"),
        (dict(num_writers=8), ValueError, "fewer than a stack of 4"),
        (dict(frame_padding="edge"), ValueError, "'reset', 'zero'"),
    ]
    for kw, exc, match in cases:
        with pytest.raises(exc, match=match):
            SharedReplayBuffer(spec, 16, frame_stack=K, **kw)
    with pytest.raises(ValueError, match="final_frames is given but frame_stack is None"):
        SharedReplayBuffer(spec, 16, final_frames=3)
    with pytest.raises(SpecError, match="stack of 3 frames"):
        SharedReplayBuffer(spec, 16, frame_stack=3)
    with pytest.raises(SpecError, match="episode boundaries"):
        SharedReplayBuffer({"obs": ("u1", (4, 2))}, 16, frame_stack=4)
    assert list(shm_dir.iterdir()) == []


def test_what_is_not_implemented_says_so(shm_dir):
    spec = spec_of()
    rng = np.random.default_rng(0)
    with SharedReplayBuffer(spec, 16, frame_stack=K) as buf, SharedWriter(buf.name, 0) as w:
        w.extend(take(WriterEnv(0, p_end=0.0), rng, 6))
        with pytest.raises(NotImplementedError, match="sample_sequences .* frame_stack"):
            buf.sample_sequences(2, 3)
        with pytest.raises(SpecError, match="'next_obs' is not stored: with frame_stack"):
            buf.column("next_obs")
        assert np.asarray(buf.column("obs")).shape == (6,) + FRAME  # the frames stored
        assert buf.config["frame_stack"] == {"obs": K} and buf.config["final_frames"] == 2


def test_take_over(shm_dir):
    spec = spec_of()
    rng = np.random.default_rng(5)
    env = WriterEnv(0, p_end=0.3)
    with SharedReplayBuffer(spec, 8, seed=0, frame_stack=K, final_frames=8) as buf:
        with SharedWriter(buf.name, 0) as w:
            w.extend(take(env, rng, 5))
        with SharedWriter(buf.name, 0) as w:  # a new writer continues the stream
            w.extend(take(env, rng, 6))
        check_stacks(buf.sample(len(buf)))
        w = SharedWriter(buf.name, 0)
        w._k = _StopBeforePublish(w._k)
        with pytest.raises(_Stopped):
            w.extend(take(env, rng, 2))
        w._finalizer.detach()  # as if the process died holding the shard
        os.close(w._lockfd)
        with pytest.raises(SharedBufferError, match="died while writing rows 11..12"):
            SharedWriter(buf.name, 0)
        check_stacks(buf.sample(len(buf)))  # the published rows stay sampled


def test_a_tampered_region_description_is_refused(shm_dir):
    spec = spec_of()
    with SharedReplayBuffer(spec, 16, frame_stack=K) as buf:
        path = os.path.join(buf.path, "region.json")
        doc = json.load(open(path))
        for bad in ({**doc["frames"], "stacks": {"obs": 5}}, {**doc["frames"], "final_frames": 99},
                    {**doc["frames"], "padding": {"obs": "edge"}}, "x",
                    {**doc["frames"], "roles": {"terminated": "id"}}):
            with open(path, "w") as f:
                json.dump({**doc, "frames": bad}, f)
            with pytest.raises(FormatError, match="not a valid shared buffer description"):
                SharedWriter(buf.name, 0)


# -- kernels against their references ---------------------------------------------------------
def test_kernels_against_references():
    from tfdata import kernels

    rng = np.random.default_rng(9)
    for trial in range(200):
        k = int(rng.integers(2, 5))
        shards = int(rng.integers(1, 4))
        cap = int(rng.integers(k, k + 6))
        width = 3
        slots = shards * cap
        heads = rng.integers(1, 4 * cap, shards)
        reserved = heads + rng.integers(0, cap + 2, shards) * (rng.random(shards) < 0.5)
        scratch = np.zeros(7 * shards + 16, np.int64)
        kernels.read_heads(heads.astype(np.uint64), cap, scratch)
        depth = rng.integers(0, k + 2, slots).astype(np.uint8)  # beyond K - 1 sometimes: capped
        src = rng.integers(0, 255, (slots, width + 2)).astype(np.uint8)
        hist = rng.integers(0, 255, (k - 1, shards, width)).astype(np.uint8)
        pad = rng.integers(0, 255, width).astype(np.uint8)
        term = rng.random(slots) < 0.3
        trunc = rng.random(slots) < 0.2
        f = int(rng.integers(1, 4))
        finals = rng.integers(0, 255, (shards, f, width)).astype(np.uint8)
        final_idx = rng.integers(-1, f + 1, slots).astype(np.int32)
        pending = rng.integers(0, 255, (shards, width)).astype(np.uint8)
        # held rows only: slot s * cap + r % cap for r in [head - min(head, cap), head)
        held = [s * cap + r % cap for s in range(shards) for r in range(max(0, heads[s] - cap), heads[s])]
        rows = np.array(rng.choice(held, 12), np.int64)
        mode = int(rng.integers(3))
        stored = src[:, 1:1 + width]
        dst = np.zeros((12, k * width), np.uint8)
        geo = np.concatenate([[shards, cap], scratch]).astype(np.int64)
        table = finals.reshape(shards * f, width)  # each shard's table, shard by shard
        kernels.SHARD_STACKS.stacks(geo, 0, rows, depth, src, 1, hist, pad, mode, dst)
        nxt = np.zeros_like(dst)
        kernels.call_strided(kernels.SHARD_STACKS.next_stacks, (9, 10), geo, 0, rows, depth, src, 1,
                             hist, pad, mode, term, trunc, final_idx, table, pending, nxt)
        both = np.zeros_like(dst), np.zeros_like(dst)
        kernels.call_strided(kernels.SHARD_STACKS.stack_pairs, (9, 10), geo, 0, rows, depth, src, 1,
                             hist, pad, mode, term, trunc, final_idx, table, pending, *both)
        np.testing.assert_array_equal(both[0], dst)
        np.testing.assert_array_equal(both[1], nxt)
        mark = np.zeros(12, np.int64)
        kmax = k - 1
        torn = kernels.torn_stacks(reserved.astype(np.uint64), cap, scratch, rows, depth, kmax, mark)
        for i, x in enumerate(rows.tolist()):
            stream = naive.shard_stream(x, heads, cap)
            want = naive.stack_naive(stream, depth[x], k, stored, hist, pad, mode)
            np.testing.assert_array_equal(dst[i], want.reshape(-1), err_msg=f"trial {trial}")
            want = naive.next_stack_naive(stream, x, k, depth, stored, hist, pad, mode, term, trunc,
                                          final_idx, finals[x // cap], pending)
            np.testing.assert_array_equal(nxt[i], want.reshape(-1), err_msg=f"trial {trial} next")
            assert mark[i] == naive.torn_stacks_naive(x, heads, reserved, cap, depth, kmax), trial
        assert torn == mark.sum()
        # the writer's check of its final table
        n = int(rng.integers(1, cap + 1))
        wt, wr = rng.random(n) < 0.4, rng.random(n) < 0.1
        ends = int(rng.integers(0, 3 * f))
        head = int(rng.integers(ends, ends + 3 * cap))
        final_rows = np.array([head - int(rng.integers(1, 2 * cap)) for _ in range(f)], np.int64)
        want = naive.final_ring_room_naive(np.flatnonzero(wt | wr).tolist(), cap, ends, final_rows, head)
        assert kernels.final_ring_room(wt, wr, 0, head, cap, ends, final_rows) == want, trial


def test_rate_limiter_and_memory_budget(shm_dir):
    from tfdata import MemoryBudgetError, RateLimiter

    spec = spec_of()
    rng = np.random.default_rng(0)
    lim = RateLimiter(samples_per_insert=2.0, min_size_to_sample=2, error_buffer=20, timeout=5)
    with SharedReplayBuffer(spec, 16, frame_stack=K, final_frames=16, rate_limiter=lim) as a, \
            SharedWriter(a.name, 0) as w:
        env = WriterEnv(0, p_end=0.2)
        w.extend(take(env, rng, 4))
        for _ in range(10):
            w.extend(take(env, rng, 2))
            check_stacks(a.sample(4))
        assert (a.rate_limiter.inserts, a.rate_limiter.samples) == (24, 40)
    region = region_nbytes(spec, 16, frame_stack=K)
    with SharedReplayBuffer(spec, 16, frame_stack=K, memory_budget=region + 1600) as a, \
            SharedWriter(a.name, 0) as w:
        w.extend(take(WriterEnv(0, p_end=0.0), rng, 8))
        check_stacks(a.sample(2))  # a ring of 2 x 2 rows (stacks, heads scratch) fits
        with pytest.raises(MemoryBudgetError, match="sampling batches of 8 rows"):
            a.sample(8)  # 2 x 8 rows of two stacks do not
        assert a.nbytes_parts["output_rings"] <= 1600


# -- checkpoints ----------------------------------------------------------------------------
def env_after(buf, shard: int, k=K, padding="reset") -> WriterEnv:
    """The writer env that continues shard ``shard`` of ``buf`` after its newest row (from its id
    and flags): the same episode one step on, or the next episode."""
    ids = np.asarray(buf.column("id"))
    ends = np.asarray(buf.column("terminated")) | np.asarray(buf.column("truncated"))
    mine = [i for i, x in enumerate(ids.tolist()) if x // 10**9 == shard]
    env = WriterEnv(shard, k=k, padding=padding)
    if not mine:
        return env
    w, rest = divmod(int(ids[mine[-1]]), 10**9)
    ep, t = divmod(rest, 10**5)
    if ends[mine[-1]]:
        env.episode[0], env.t[0] = ep + 1, 0
        env.queues[0] = env._reset(0)
    else:
        env.episode[0], env.t[0] = ep, t + 1
        env.queues[0] = list(naive.stack_of(w, ep, t + 1, k, padding))
    return env


@pytest.mark.parametrize("layout,kw", [("aos", {}), ("soa", {}),
                                       ("aos", dict(n_step=2, gamma=0.5, prioritized=True))])
def test_checkpoint_continues_the_same_samples(layout, kw, shm_dir, tmp_path):
    spec = spec_of()
    rng = np.random.default_rng(8)
    with SharedReplayBuffer(spec, 16, num_writers=2, seed=3, layout=layout, frame_stack=K,
                            final_frames=8, **kw) as a:
        envs = [WriterEnv(s, p_end=0.2) for s in range(2)]
        wa = [SharedWriter(a.name, s) for s in range(2)]
        wa[0].extend(take(envs[0], rng, 21))  # wrapped: its oldest stacks read the hist
        wa[1].extend(take(envs[1], rng, 5))  # not full
        a.save(tmp_path / "ck")
        for new_layout in (None, "soa" if layout == "aos" else "aos"):
            b = SharedReplayBuffer.load(tmp_path / "ck", layout=new_layout)
            assert b.config["frame_stack"] == {"obs": K} and b.config["final_frames"] == 8
            wb = [SharedWriter(b.name, s) for s in range(2)]
            for s in range(2):  # the loaded shards go on where the saved ones stood
                e = env_after(b, s)
                assert (e.episode, e.t) == (envs[s].episode, envs[s].t)
            for _ in range(12):
                x, y = a.sample(len(a)), b.sample(len(b))
                same(x, y, spec)
                check_stacks(x, gamma=kw.get("gamma"))
                if kw:
                    np.testing.assert_array_equal(x.weights, y.weights)
                    p = rng.random(len(a)) + 0.5
                    a.update_priorities(x, p)
                    b.update_priorities(y, p)
                for s in range(2):
                    rows = take(envs[s], rng, int(rng.integers(1, 4)))
                    wa[s].extend(rows)
                    wb[s].extend(rows)
            for w in wb:
                w.close()
            b.close()
            a.close()
            a = SharedReplayBuffer.load(tmp_path / "ck")  # the saved state again, for the next layout
            wa = [SharedWriter(a.name, s) for s in range(2)]
            envs = [env_after(a, s) for s in range(2)]
        for w in wa:
            w.close()


@pytest.mark.parametrize("m", [1, 3])
def test_checkpoint_while_a_write_is_in_flight(m, shm_dir, tmp_path):
    """A write stored but not published when the save runs: the rows it overwrites are left
    out, and K - 1 more (their frames become the oldest kept row's older frames), and the newest
    row (the write replaced its pending frame); the loaded rows' stacks are exact and a writer
    continues the stream after the newest kept row."""
    spec = spec_of()
    rng = np.random.default_rng(m)
    env = WriterEnv(0, p_end=0.1)
    cap = 12
    with SharedReplayBuffer(spec, cap, seed=0, frame_stack=K, final_frames=cap) as a:
        w = SharedWriter(a.name, 0)
        w.extend(take(env, rng, 3 * cap))
        env.p_end = 0.0  # the newest row continues its episode
        w.extend(take(env, rng, 1))
        head = w.published
        w._k = _StopBeforePublish(w._k)
        with pytest.raises(_Stopped):
            w.extend(take(env, rng, m))
        a.save(tmp_path / "ck")
        state = json.load(open(tmp_path / "ck" / "state.json"))["state"]
        assert state["heads"] == [head - 1] and state["dropped"] == [m + K - 1 + 1]
        b = SharedReplayBuffer.load(tmp_path / "ck")
        kept = cap - m - (K - 1) - 1
        assert len(b) == kept
        ids = np.asarray(b.column("id"))
        np.testing.assert_array_equal(ids, np.asarray(a.column("id"))[m + K - 1:cap - 1])
        check_stacks(b.sample(kept))
        e = env_after(b, 0)
        with SharedWriter(b.name, 0) as wb:
            for _ in range(8):
                wb.extend(take(e, rng, 2))
                check_stacks(b.sample(len(b)))
        b.close()


def test_checkpoints_while_writer_processes_write(shm_dir, tmp_path):
    """Saves while two writer processes write: each keeps some, all or none of a shard's rows
    (shards of 512 rows: a save's copy takes about as long as a writer's lap); every kept
    stack is exact and every shard goes on."""
    spec = spec_of()
    errors, stop = FORK.Queue(), FORK.Event()
    shards, cap = 2, 512
    with SharedReplayBuffer(spec, shards * cap, num_writers=shards, seed=3, frame_stack=K,
                            final_frames=cap) as buf:
        procs = [FORK.Process(target=_race, args=(buf.name, s, stop, errors)) for s in range(shards)]
        for p in procs:
            p.start()
        try:
            while len(buf) < shards * cap:
                time.sleep(0.01)
            for i in range(5):
                buf.save(tmp_path / f"ck{i}")
        finally:
            stop.set()
            for p in procs:
                p.join(30)
        assert errors.empty(), errors.get()
    for i in range(5):
        with SharedReplayBuffer.load(tmp_path / f"ck{i}") as b:
            if len(b):
                check_stacks(b.sample(min(len(b), 200)))
            for s in range(shards):
                with SharedWriter(b.name, s) as w:  # every shard goes on
                    w.extend(take(env_after(b, s), np.random.default_rng(s), 5))
            check_stacks(b.sample(min(len(b), 200)))


def test_a_hostile_checkpoint_is_refused_before_a_region_exists(shm_dir, tmp_path):
    spec = spec_of()
    rng = np.random.default_rng(1)
    with SharedReplayBuffer(spec, 16, seed=0, frame_stack=K, final_frames=8) as a, \
            SharedWriter(a.name, 0) as w:
        w.extend(take(WriterEnv(0, p_end=0.3), rng, 20))
        a.save(tmp_path / "ck")
    good = json.load(open(tmp_path / "ck" / "state.json"))
    arrays = tmp_path / "ck" / "arrays"

    def npy(name):
        return str(arrays / name)

    def attempt(doc=None, array=None, match=""):
        import shutil

        bad = tmp_path / "bad"
        shutil.rmtree(bad, ignore_errors=True)
        shutil.copytree(tmp_path / "ck", bad)
        if doc is not None:
            json.dump(doc, open(bad / "state.json", "w"))
        if array is not None:
            np.save(bad / "arrays" / array[0], array[1])
        with pytest.raises(FormatError, match=match):
            SharedReplayBuffer.load(bad)
        assert list(shm_dir.iterdir()) == []

    depth = np.load(npy("frames.depth.npy"))
    final_slots = np.load(npy("frames.final_slots.npy"))
    for key, value, match in (("final_frames", 0, "final_frames"), ("final_frames", True, "final_frames"),
                              ("frame_stack", {"obs": 3}, "stack of 3 frames"),
                              ("frame_padding", {"obs": "edge"}, "frame_padding")):
        doc = json.loads(json.dumps(good))
        doc["config"][key] = value
        attempt(doc, match=match)
    doc = json.loads(json.dumps(good))
    del doc["state"]["frames"]
    attempt(doc, match="state: expected the keys")
    doc = json.loads(json.dumps(good))
    doc["state"]["frames"]["stacks"] = {"obs": 3}
    attempt(doc, match="state.frames.stacks")
    attempt(array=("frames.depth.npy", np.full_like(depth, K)), match=r"frames.depth: expected values in \[0, 3\]")
    d = depth.copy()
    d[int(np.argmax(d == 1))] = 2
    attempt(array=("frames.depth.npy", d), match=r"state.frames.depth\[\d+\]")
    attempt(array=("frames.depth.npy", depth[:-1]), match="frames.depth")
    attempt(array=("frames.final_slots.npy", final_slots[:-1]), match="finals")
    other = sorted(set(final_slots.tolist()[1:]) | {int(np.setdiff1d(np.arange(16), final_slots)[0])})
    attempt(array=("frames.final_slots.npy", np.array(other, np.int64)),
            match="final_slots: expected the slots of the kept rows that end an episode")
    attempt(array=("frames.final_slots.npy", final_slots[::-1].copy()), match="ascending")
    attempt(array=("frames.back.obs.npy", np.zeros((1, 2) + FRAME, np.uint8)), match="back")
    SharedReplayBuffer.load(tmp_path / "ck").close()  # the untouched checkpoint loads


def test_prioritized_checkpoint_of_a_shard_not_full_with_a_write_in_flight(shm_dir, tmp_path):
    """The newest row is left out of the checkpoint (its pending frame was replaced) while the
    shard keeps its slots: its priority goes too, so it is never drawn after the load."""
    spec = spec_of()
    rng = np.random.default_rng(4)
    env = WriterEnv(0, p_end=0.0)
    with SharedReplayBuffer(spec, 12, seed=0, frame_stack=K, prioritized=True) as a:
        w = SharedWriter(a.name, 0)
        w.extend(take(env, rng, 8))
        a.sample(2)  # folds the rows into the trees
        w._k = _StopBeforePublish(w._k)
        with pytest.raises(_Stopped):
            w.extend(take(env, rng, 1))
        a.save(tmp_path / "ck")
        with SharedReplayBuffer.load(tmp_path / "ck") as b:
            assert len(b) == 7 and b.priorities()[7] == 0
            for _ in range(30):
                x = b.sample(7)
                assert 7 not in x.indices
                check_stacks(x)


def test_kernels_stay_in_bounds_whatever_the_shared_arrays_hold():
    """Heads, depths, final-table indices and reserves as a corrupted region could hold them:
    the stack kernels write their rows of ``dst`` only and read within their arrays."""
    from tfdata import kernels

    rng = np.random.default_rng(11)
    for trial in range(300):
        k, shards = int(rng.integers(2, 6)), int(rng.integers(1, 4))
        cap, width, f, b = int(rng.integers(k, k + 5)), 2, int(rng.integers(1, 4)), 6
        slots = shards * cap
        scratch = np.zeros(7 * shards + b, np.int64)
        scratch[:3 * shards] = rng.integers(-2**62, 2**62, 3 * shards)
        depth = rng.integers(0, 256, slots).astype(np.uint8)
        src = rng.integers(0, 255, (slots, width + 1)).astype(np.uint8)
        hist = rng.integers(0, 255, (k - 1, shards, width)).astype(np.uint8)
        pad = np.zeros(width, np.uint8)
        term, trunc = rng.random(slots) < 0.5, rng.random(slots) < 0.5
        final_idx = rng.integers(-2**31, 2**31, slots).astype(np.int32)
        finals = np.zeros((shards, f, width), np.uint8)
        pending = np.zeros((shards, width), np.uint8)
        rows = rng.integers(0, slots, b).astype(np.int64)
        guard = np.full((b + 2, k * width), 0xAB, np.uint8)
        geo = np.concatenate([[shards, cap], scratch]).astype(np.int64)
        table = finals.reshape(shards * f, width)
        ks = kernels.SHARD_STACKS
        ks.stacks(geo, 0, rows, depth, src, 1, hist, pad, 0, guard[1:-1])
        kernels.call_strided(ks.next_stacks, (9, 10), geo, 0, rows, depth, src, 1, hist, pad, 0, term,
                             trunc, final_idx, table, pending, guard[1:-1])
        kernels.call_strided(ks.stack_pairs, (9, 10), geo, 0, rows, depth, src, 1, hist, pad, 0, term,
                             trunc, final_idx, table, pending, guard[1:-1], guard[1:-1])
        assert (guard[0] == 0xAB).all() and (guard[-1] == 0xAB).all(), trial
        reserved = rng.integers(0, 2**63, shards).astype(np.uint64)
        mark = np.zeros(b + 2, np.int64)
        kernels.torn_stacks(reserved, cap, scratch, rows, depth, k - 1, mark[1:-1])
        assert mark[0] == 0 and mark[-1] == 0
