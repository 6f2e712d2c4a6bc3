"""Frame stacks with everything else: n-step, sequences, prioritized and without-replacement
sampling, vector envs, column groups, projections, elision of other next fields, a rate limiter,
clear, state dicts, spill files, allocators, memory budgets and plans, columns, statistics and
relabelling. Every batch is compared with the oracle: a buffer of the same options and seed that
stores the whole ``obs`` and ``next_obs`` stacks (frames from ``naive.FrameStackEnv`` carry their
``(env, episode, step)`` in every pixel, so a frame from the wrong row shows).
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import tfdata
from tfdata.errors import MemoryBudgetError, SpecError

from . import naive
from .test_frames import spec_of, steps_of

LAYOUTS = {"aos": "aos", "soa": "soa",
           "groups": [["obs", "action", "reward"], ["terminated", "truncated"]],
           "groups2": [["action", "reward", "terminated"], ["next_obs", "truncated"]]}


class Twin:
    """A frame-stacked buffer and its oracle, fed the same steps of a ``FrameStackEnv``."""

    def __init__(self, k=4, num_envs=1, capacity=None, cls=tfdata.ReplayBuffer, spec=None, seed=3,
                 p_end=0.15, padding="reset", env_seed=0, frame=(3, 2), dtype="u1", **kw):
        self.k, self.e = k, num_envs
        self.spec = spec or spec_of(k, frame, dtype)
        self.capacity = capacity or 6 * num_envs
        fs = kw.pop("frame_kw", {})
        self.a = cls(self.spec, self.capacity, num_envs=num_envs, seed=seed, frame_stack={"obs": k},
                     frame_padding=padding, **kw, **fs)
        self.b = cls(self.spec, self.capacity, num_envs=num_envs, seed=seed, **kw)
        self.env = naive.FrameStackEnv(num_envs, k, frame=frame, padding=padding, p_end=p_end,
                                       dtype=np.dtype(dtype))
        self.rng = np.random.default_rng(env_seed)
        self.t = 0

    def steps(self, n: int) -> list:
        out = steps_of(self.env, self.rng, n)
        self.t += n
        return out

    def feed(self, n: int, chunk: int = 1, extra=None) -> None:
        todo = self.steps(n)
        for i in range(0, n, chunk):
            part = todo[i:i + chunk]
            batch = {f: np.concatenate([s[f] for s in part]) for f in part[0]}
            if extra is not None:
                batch.update(extra(batch))
            if len(part) == 1 and self.e == 1 and self.rng.random() < 0.5:
                row = {f: v[0] for f, v in batch.items()}
                self.a.push(row)
                self.b.push(row)
            else:
                self.a.extend(batch)
                self.b.extend(batch)

    def same(self, x, y, names=None, versions: bool = True) -> None:
        names = list(self.spec) if names is None else names
        assert set(x.keys()) == set(y.keys()) == set(names)
        for f in names:
            assert np.array_equal(np.asarray(x[f]), np.asarray(y[f])), f
        for attr in ("indices", "weights", "discounts", "mask") + (("versions",) if versions else ()):
            u, v = getattr(x, attr, None), getattr(y, attr, None)
            assert (u is None) == (v is None), attr
            if u is not None:
                assert np.array_equal(np.asarray(u), np.asarray(v)), attr

    def check(self, batch_size: int, times: int = 3, fields=None) -> None:
        for _ in range(times):
            self.same(self.a.sample(batch_size, fields=fields), self.b.sample(batch_size, fields=fields),
                      fields)


# -- n-step -------------------------------------------------------------------------------------
@pytest.mark.parametrize("num_envs", [1, 2])
@pytest.mark.parametrize("layout", ["aos", "soa", "groups"])
def test_n_step_windows_across_episode_ends_and_the_newest_row(num_envs, layout):
    """n_step=3: next_obs is the stack of the window's last row's next step (an episode's final
    observation, the pending next frame of the newest row, or the next row's frame), in every
    window position; every slot sampled once per check (batch of all slots, by index)."""
    tw = Twin(k=3, num_envs=num_envs, capacity=7 * num_envs, n_step=3, p_end=0.25,
              layout=LAYOUTS[layout])
    for t in range(30):
        tw.feed(1)
        n = len(tw.a)
        x, y = tw.a.sample(n), tw.b.sample(n)
        tw.same(x, y)
        if t % 5 == 4:
            tw.same(tw.a.sample(n, fields=["next_obs"]), tw.b.sample(n, fields=["next_obs"]),
                    ["next_obs"])
    # the windows did cross episode ends and did reach the newest row
    assert (x.discounts < 0.99 ** 2 * 0.9999).any() and (x.discounts < 1).any()


def test_n_step_with_prioritized_and_ends_in_every_window_position():
    tw = Twin(k=2, num_envs=2, capacity=8, cls=tfdata.PrioritizedReplayBuffer, n_step=3, p_end=0.4)
    for t in range(25):
        tw.feed(1)
        if len(tw.a) >= 4:
            x, y = tw.a.sample(4), tw.b.sample(4)
            tw.same(x, y)
            p = np.abs(np.sin(np.arange(4) + t)) + 0.1
            tw.a.update_priorities(x, p)
            tw.b.update_priorities(y, p)


# -- sequences ----------------------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["mask", "reject"])
@pytest.mark.parametrize("num_envs", [1, 3])
def test_sample_sequences(policy, num_envs):
    tw = Twin(k=3, num_envs=num_envs, capacity=9 * num_envs, p_end=0.08)
    projections = [None, ["obs"], ["next_obs"], ["action", "terminated"], ["obs", "next_obs"],
                   ["next_obs", "reward"]]
    done = 0
    for t in range(40):
        tw.feed(1)
        if len(tw.a) >= 3 * num_envs:
            f = projections[t % len(projections)]
            try:
                x = tw.a.sample_sequences(3, 3, policy=policy, fields=f)
            except ValueError as exc:  # "reject" with no slice held: the oracle agrees
                assert policy == "reject" and "found no slice" in str(exc)
                with pytest.raises(ValueError, match="found no slice"):
                    tw.b.sample_sequences(3, 3, policy=policy, fields=f)
                continue
            y = tw.b.sample_sequences(3, 3, policy=policy, fields=f)
            tw.same(x, y, f)
            done += 1
    assert done > 20


def test_sequences_of_a_prioritized_buffer():
    tw = Twin(k=4, num_envs=2, capacity=12, cls=tfdata.PrioritizedReplayBuffer, p_end=0.1)
    tw.feed(20)
    for t in range(6):
        x, y = tw.a.sample_sequences(4, 3), tw.b.sample_sequences(4, 3)
        tw.same(x, y)
        p = np.arange(4.0) * (t + 1)
        tw.a.update_priorities(x, p)
        tw.b.update_priorities(y, p)


# -- samplers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["aos", "soa", "groups"])
def test_prioritized_with_update_priorities(layout):
    tw = Twin(k=4, num_envs=2, capacity=12, cls=tfdata.PrioritizedReplayBuffer, layout=LAYOUTS[layout],
              alpha=0.7, beta_steps=10)
    for t in range(20):
        tw.feed(1)
        if len(tw.a) >= 5:
            x, y = tw.a.sample(5), tw.b.sample(5)
            tw.same(x, y)
            p = (np.arange(5) * 7 + t) % 5 + 0.5
            tw.a.update_priorities(x, p)
            tw.b.update_priorities(y, p)
    assert np.array_equal(tw.a.priorities(), tw.b.priorities())


def test_without_replacement():
    tw = Twin(k=3, num_envs=2, capacity=10, sampler="without_replacement")
    for t in range(24):
        tw.feed(1)
        if len(tw.a) >= 3:
            tw.check(3, times=2)
    x, y = tw.a.sample(len(tw.a)), tw.b.sample(len(tw.b))
    tw.same(x, y)


def test_exactly_k_is_refused_clearly():
    spec = spec_of(4)
    for kw in ({}, {"replays": 2, "policy": "drop"}):
        with pytest.raises(ValueError, match=r"sampler='exactly_k'.* with frame_stack=True: .*not "
                                             r"in stream order.*cannot be rebuilt"):
            tfdata.ReplayBuffer(spec, 16, sampler="exactly_k", frame_stack=4, **kw)
    with pytest.raises(ValueError, match="sampler='exactly_k'"):
        tfdata.ReplayBuffer.plan_memory(spec, 16, sampler="exactly_k", frame_stack=4)
    with pytest.raises(ValueError, match="sampler='exactly_k'"):
        tfdata.memory.max_capacity(spec, "1MB", sampler="exactly_k", frame_stack=4)


# -- vector envs, layouts, projections -----------------------------------------------------------
@pytest.mark.parametrize("num_envs", [1, 2, 3, 4])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_num_envs_and_layouts_with_every_projection(num_envs, layout):
    tw = Twin(k=3, num_envs=num_envs, capacity=5 * num_envs, layout=LAYOUTS[layout], p_end=0.2)
    projections = [None, ["obs"], ["next_obs"], ["action"], ["obs", "next_obs"], ["reward", "obs"],
                   ["terminated", "next_obs"], ["truncated", "reward", "action"]]
    for t in range(14):
        tw.feed(1, chunk=1)
        if len(tw.a) >= 2:
            f = projections[t % len(projections)]
            tw.check(2, times=1, fields=f)
    tw.feed(9, chunk=3)  # steps in one extend, across the wrap
    for f in projections:
        tw.check(len(tw.a), times=1, fields=f)


def test_several_stacked_fields_of_different_depths():
    """Two stacked fields (K = 4 and 2) share the depth bookkeeping, whichever is named first:
    each stack reads the depth capped at the largest K - 1."""
    frame_o, frame_p = (3, 2), (2,)
    spec = {"obs": ("u1", (4,) + frame_o), "next_obs": ("u1", (4,) + frame_o),
            "pix": ("i2", (2,) + frame_p), "next_pix": ("i2", (2,) + frame_p),
            "action": "i8", "reward": "f4", "terminated": "?", "truncated": "?"}
    for order in (("obs", "pix"), ("pix", "obs")):
        fs = {n: spec[n][1][0] for n in order}
        a = tfdata.ReplayBuffer(spec, 12, seed=1, frame_stack=fs, num_envs=2,
                                frame_padding={"pix": "zero"})
        b = tfdata.ReplayBuffer(spec, 12, seed=1, num_envs=2)
        eo = naive.FrameStackEnv(2, 4, frame=frame_o, p_end=0.2)
        rng = np.random.default_rng(5)
        carry = [None, None]  # per stream: the next row's pix stack, None at an episode's start
        count = 0
        for t in range(30):
            s = eo.step(rng)
            obs, nxt = [], []
            for e in range(2):
                count += 1
                q = carry[e]
                if q is None:  # an episode's first row: zero padding, then its first frame
                    q = [np.zeros(frame_p, np.int16), np.full(frame_p, count, np.int16)]
                count += 1
                new = np.full(frame_p, count, np.int16)
                obs.append(np.stack(q))
                nxt.append(np.stack([q[1], new]))
                carry[e] = None if s["terminated"][e] or s["truncated"][e] else [q[1], new]
            step = dict(s, pix=np.stack(obs), next_pix=np.stack(nxt), action=np.arange(2) + t,
                        reward=np.zeros(2, np.float32))
            a.extend(step)
            b.extend(step)
            if len(a) >= 4:
                x, y = a.sample(len(a)), b.sample(len(b))
                for f in spec:
                    assert np.array_equal(x[f], y[f]), (order, t, f)


# -- elide_next of another pair, rate limiter ------------------------------------------------------
def test_elide_next_of_another_pair_together_with_frame_stack():
    spec = spec_of(3)
    spec.update(state=("f4", (2,)), next_state=("f4", (2,)))
    state = {}

    def extra(batch):
        n = batch["obs"].shape[0]
        cur = np.stack([state.get(i, np.zeros(2, np.float32)) for i in range(n)])
        nxt = tw.rng.random((n, 2)).astype(np.float32)
        ends = batch["terminated"] | batch["truncated"]
        for i in range(n):
            state[i] = tw.rng.random(2).astype(np.float32) if ends[i] else nxt[i]
        return {"state": cur, "next_state": nxt}

    tw = Twin(k=3, num_envs=2, capacity=8, spec=spec, elide_next=True, p_end=0.3)
    assert set(tw.a.storage.spec.names) == {"obs", "action", "reward", "terminated", "truncated", "state"}
    for t in range(20):
        tw.feed(1, extra=extra)
        if len(tw.a) >= 3:
            tw.check(3, times=1)
            tw.check(3, times=1, fields=["next_state", "next_obs"])
            tw.check(3, times=1, fields=["next_state"])
    with pytest.raises(SpecError, match="not stored"):
        tw.a.column("next_state")
    with pytest.raises(SpecError, match="frame_stack"):
        tw.a.column("next_obs")


def test_rate_limiter():
    def lim():
        return tfdata.RateLimiter(samples_per_insert=1.5, min_size_to_sample=4, error_buffer=50.0,
                                  timeout=0.5)

    tw = Twin(k=3, num_envs=1, capacity=10, frame_kw={"rate_limiter": lim()})
    tw.b = tfdata.ReplayBuffer(tw.spec, 10, seed=3, rate_limiter=lim())
    tw.feed(6)
    for t in range(10):
        tw.check(2, times=2)
        tw.feed(2)
    assert tw.a.rate_limiter.state_dict() == tw.b.rate_limiter.state_dict()


# -- clear, state dicts --------------------------------------------------------------------------
@pytest.mark.parametrize("wipe", [False, True])
def test_clear_then_continue(wipe):
    tw = Twin(k=4, num_envs=2, capacity=10, n_step=2)
    tw.feed(17)  # wrapped: hist holds frames
    tw.a.clear(wipe=wipe)
    tw.b.clear(wipe=wipe)
    assert len(tw.a) == 0
    st = tw.a.state_dict()["frames"]
    assert st["steps"] == 0 and (st["prev"] == -1).all() and st["depth"].shape == (0,)
    if wipe:
        assert not any(h.any() for h in st["hist"].values())
    # the stream restarts: its next row must start an episode
    tw.env = naive.FrameStackEnv(2, 4, p_end=0.15)
    for t in range(12):
        tw.feed(1)
        tw.check(2, times=1)
    # a stream that does not restart is refused after a clear
    tw.a.clear()
    with pytest.raises(SpecError, match="starts an episode"):
        tw.a.extend(tw.steps(1)[0])


@pytest.mark.parametrize("target", ["aos", "soa", "groups"])
def test_state_dict_round_trip_into_another_layout(target):
    tw = Twin(k=3, num_envs=2, capacity=8, layout="aos", n_step=2, p_end=0.3)
    tw.feed(11)  # wrapped
    c = tfdata.ReplayBuffer(tw.spec, 8, num_envs=2, seed=9, frame_stack=3, n_step=2,
                            layout=LAYOUTS[target])
    c.load_state_dict(tw.a.state_dict())
    for _ in range(3):
        x = c.sample(5)
        tw.same(x, tw.a.sample(5))
        tw.same(x, tw.b.sample(5))
    # all three continue from the same stream
    for t in range(8):
        step = tw.steps(1)[0]
        for buf in (tw.a, tw.b, c):
            buf.extend(step)
        x, y, z = tw.a.sample(6), tw.b.sample(6), c.sample(6)
        tw.same(x, y)
        tw.same(x, z)


def test_state_dict_refusals_change_nothing():
    tw = Twin(k=3, num_envs=2, capacity=8)
    tw.feed(7)
    good = tw.a.state_dict()
    c = tfdata.ReplayBuffer(tw.spec, 8, num_envs=2, seed=1, frame_stack=3)
    before = c.state_dict()

    def bad(change, match):
        st = tw.a.state_dict()
        change(st["frames"])
        with pytest.raises(ValueError, match=match):
            c.load_state_dict(st)
        after = c.state_dict()
        assert after["frames"]["steps"] == before["frames"]["steps"]
        assert np.array_equal(after["frames"]["prev"], before["frames"]["prev"])

    # 7 steps of 2 streams written: the 8 slots are full, so at least 4 steps
    bad(lambda f: f.__setitem__("steps", 3), "frames.steps")
    bad(lambda f: f.__setitem__("steps", -1), "frames.steps")
    bad(lambda f: f.__setitem__("steps", True), "frames.steps")
    bad(lambda f: f.__setitem__("depth", np.full(8, 3, np.uint8)), "frames.depth")
    bad(lambda f: f.__setitem__("depth", f["depth"][:-1]), "frames.depth")
    bad(lambda f: f.__setitem__("prev", np.array([-2, 0], np.int16)), "frames.prev")
    bad(lambda f: f.__setitem__("prev", np.array([0, 3], np.int16)), "frames.prev")
    bad(lambda f: f["hist"].__setitem__("obs", np.zeros((3, 2, 3, 2), np.uint8)), "frames.hist")
    bad(lambda f: f.__setitem__("hist", {}), "frames.hist")
    bad(lambda f: f.__setitem__("stacks", {"obs": 4}), "frames.stacks")
    # before the ring wraps, the steps are exactly the rows held over num_envs
    part = Twin(k=3, num_envs=2, capacity=8)
    part.feed(2)
    st = part.a.state_dict()
    for steps in (1, 3, 40):
        st["frames"]["steps"] = steps
        with pytest.raises(ValueError, match="has not wrapped"):
            c.load_state_dict(st)
    st = dict(good)
    st.pop("frames")
    with pytest.raises(ValueError, match="frame-stack bookkeeping"):
        c.load_state_dict(st)
    c.load_state_dict(good)
    tw.same(c.sample(4), tw.a.sample(4))


# -- spill, allocators, budgets, plans -----------------------------------------------------------
@pytest.mark.parametrize("layout", ["aos", "soa", "groups"])
@pytest.mark.parametrize("num_envs", [1, 2])
def test_a_spilling_frame_buffer_equals_the_ram_one(tmp_path, layout, num_envs):
    """Sample by sample: spill file with 3 rows kept resident, the frame buffer in RAM, and the
    oracle; the hot part is what the plan says."""
    tw = Twin(k=4, num_envs=num_envs, capacity=8 * num_envs, layout=LAYOUTS[layout])
    spill = tfdata.ReplayBuffer(tw.spec, tw.capacity, num_envs=num_envs, seed=3, frame_stack=4,
                                layout=LAYOUTS[layout], spill_path=tmp_path / "rows", hot_rows=3)
    plan = tfdata.ReplayBuffer.plan_memory(tw.spec, tw.capacity, num_envs=num_envs, frame_stack=4,
                                           layout=LAYOUTS[layout], spill_path=tmp_path / "x",
                                           hot_rows=3)
    assert spill.nbytes_parts == plan
    assert plan["storage"] < tw.a.nbytes_parts["storage"]
    for t in range(30):
        step = tw.steps(1)[0]
        for buf in (tw.a, tw.b, spill):
            buf.extend(step)
        if len(spill) >= 3:
            x = spill.sample(3)
            tw.same(x, tw.a.sample(3))
            tw.same(x, tw.b.sample(3))
    tw.same(spill.sample(4, fields=["obs"]), tw.a.sample(4, fields=["obs"]), ["obs"])
    tw.same(spill.sample_sequences(2, 3), tw.a.sample_sequences(2, 3))


def _handles():
    out = []
    for name in ("numpy", "jemalloc", "mimalloc"):
        ok, _ = tfdata.alloc.available(name)
        if ok:
            out.append(name)
    return out


@pytest.mark.parametrize("allocator", _handles())
@pytest.mark.parametrize("cls", [tfdata.ReplayBuffer, tfdata.PrioritizedReplayBuffer])
def test_allocator_bytes_equal_nbytes_and_the_plan(allocator, cls):
    spec = spec_of(4, (5, 3))
    opts = dict(frame_stack=4, num_envs=2, n_step=2, layout="aos", stats=["obs"],
                frame_padding=np.full((5, 3), 9, np.uint8))
    with tfdata.alloc.open(allocator) as a:
        buf = cls(spec, 20, allocator=a, **opts)
        plan = cls.plan_memory(spec, 20, **opts)
        assert buf.nbytes_parts == plan
        assert a.live_bytes == buf.nbytes == sum(plan.values())
        env = naive.FrameStackEnv(2, 4, frame=(5, 3), padding=np.full((5, 3), 9, np.uint8))
        rng = np.random.default_rng(0)
        for s in steps_of(env, rng, 15):
            buf.extend(s)
        buf.sample(3)
        buf.sample(2, fields=["next_obs"])
        buf.sample_sequences(2, 3)
        planned = cls.plan_memory(spec, 20, **opts, batch_sizes=[3, (2, None, ["next_obs"]), (2, 3)])
        assert buf.nbytes_parts == planned
        assert a.live_bytes == buf.nbytes
        del buf
        gc.collect()
        assert a.live_bytes == 0


@pytest.mark.parametrize("num_envs", [1, 2, 3])
@pytest.mark.parametrize("k", [2, 4])
def test_plan_counts_one_frame_per_row_and_equals_the_allocation(num_envs, k):
    frame = (6, 5)
    spec = spec_of(k, frame)
    fb = 30
    for cap in (k * num_envs, 7 * num_envs, 50 * num_envs):
        plan = tfdata.ReplayBuffer.plan_memory(spec, cap, frame_stack=k, num_envs=num_envs)
        full = tfdata.ReplayBuffer.plan_memory(spec, cap, num_envs=num_envs)
        # rows: one frame (no next frame) plus a record of the other fields
        other = tfdata.Spec({f: v for f, v in spec.items() if "obs" not in f}).aos_dtype.itemsize
        assert plan["storage"] == cap * (fb + other)
        assert full["storage"] - plan["storage"] >= cap * (2 * k - 1) * fb
        # bookkeeping: that of a buffer of single frames with next_obs elided, plus a depth byte
        # per row, K - 1 frames per stream, the padding frame, prev and its scratch (int16 each)
        single = dict(spec, obs=("u1", frame), next_obs=("u1", frame))
        elided = tfdata.ReplayBuffer.plan_memory(single, cap, num_envs=num_envs, elide_next=True)
        assert plan["bookkeeping"] - elided["bookkeeping"] == cap + (k - 1) * num_envs * fb + fb + 4 * num_envs
        with tfdata.alloc.open("numpy") as a:
            buf = tfdata.ReplayBuffer(spec, cap, frame_stack=k, num_envs=num_envs, allocator=a)
            assert buf.nbytes_parts == plan and a.live_bytes == sum(plan.values())
            del buf
    with pytest.raises(ValueError, match=f"at least {k * num_envs}"):
        tfdata.ReplayBuffer.plan_memory(spec, (k - 1) * num_envs, frame_stack=k, num_envs=num_envs)


@pytest.mark.parametrize("num_envs", [1, 2, 3])
def test_max_capacity_counts_frames(num_envs):
    k, frame = 4, (10, 10)
    spec = spec_of(k, frame)
    opts = dict(frame_stack=k, num_envs=num_envs)
    for budget in (3000, 9000, 40_000, 250_000):
        cap = tfdata.memory.max_capacity(spec, budget, batch_size=8, **opts)
        if cap == 0:  # not even K steps per stream fit
            need = sum(tfdata.ReplayBuffer.plan_memory(spec, k * num_envs, batch_sizes=[8], **opts).values())
            assert need > budget
            continue
        assert cap % num_envs == 0 and cap >= k * num_envs
        plan = tfdata.ReplayBuffer.plan_memory(spec, cap, batch_sizes=[8], **opts)
        more = tfdata.ReplayBuffer.plan_memory(spec, cap + num_envs, batch_sizes=[8], **opts)
        assert sum(plan.values()) <= budget < sum(more.values())
        with tfdata.alloc.open("numpy") as a:
            buf = tfdata.ReplayBuffer(spec, cap, allocator=a, **opts)
            env = naive.FrameStackEnv(num_envs, k, frame=frame)
            for s in steps_of(env, np.random.default_rng(0), 2 * k):
                buf.extend(s)
            buf.sample(8)
            assert a.live_bytes == buf.nbytes == sum(plan.values())
            del buf
        # the frames are what a budget buys: far more rows than storing the stacks
        assert cap > 5 * tfdata.memory.max_capacity(spec, budget, batch_size=8, num_envs=num_envs)
    assert tfdata.memory.max_capacity(spec, 1000, **opts) == 0


def test_memory_budget_refuses_construction_with_the_largest_fitting_capacity():
    spec = spec_of(4, (8, 8))
    want = tfdata.memory.max_capacity(spec, "20KB", frame_stack=4, num_envs=2)
    assert want > 8
    with pytest.raises(MemoryBudgetError, match=f"the largest capacity that fits is {want}\\b"):
        tfdata.ReplayBuffer(spec, 1000, frame_stack=4, num_envs=2, memory_budget="20KB")
    buf = tfdata.ReplayBuffer(spec, want, frame_stack=4, num_envs=2, memory_budget="20KB")
    assert buf.nbytes <= 20 * 1024
    with pytest.raises(MemoryBudgetError, match="no capacity fits"):
        tfdata.ReplayBuffer(spec, 1000, frame_stack=4, num_envs=2, memory_budget=500)


def test_a_final_table_growth_over_budget_is_refused_and_changes_nothing():
    """The next_obs of stacked obs is elided: episode ends keep their final frame in a table
    that grows; a growth over the budget is refused before anything is written."""
    tw = Twin(k=2, num_envs=1, capacity=400, p_end=1.0)  # every row ends an episode
    plan = sum(tfdata.ReplayBuffer.plan_memory(tw.spec, 400, frame_stack=2).values())
    buf = tfdata.ReplayBuffer(tw.spec, 400, seed=3, frame_stack=2, memory_budget=plan + 64)
    steps = tw.steps(60)
    done = 0
    with pytest.raises(MemoryBudgetError, match="episode-final"):
        for s in steps:
            before = buf.state_dict()
            buf.extend(s)
            done += 1
    assert 0 < done < 60
    after = buf.state_dict()
    assert after["writer"] == before["writer"]
    for key in ("depth", "prev"):
        assert np.array_equal(after["frames"][key], before["frames"][key])
    assert after["frames"]["steps"] == before["frames"]["steps"]
    for f in before["data"]:
        assert np.array_equal(after["data"][f], before["data"][f])
    # what is held is what the accepted writes gave
    for s in steps[:done]:
        tw.a.extend(s)
    want = tw.a.state_dict()
    for key in ("writer", "frames", "episodes", "data"):
        for sub, v in want[key].items():
            if isinstance(v, dict):
                for name in v:
                    assert np.array_equal(after[key][sub][name], v[name]), (key, sub, name)
            else:
                assert np.array_equal(after[key][sub], v), (key, sub)


# -- columns, statistics, relabelling --------------------------------------------------------------
@pytest.mark.parametrize("layout", ["aos", "soa", "groups"])
def test_column_gives_the_stored_frames(layout):
    tw = Twin(k=3, num_envs=2, capacity=8, layout=LAYOUTS[layout])
    tw.feed(3)
    col = tw.a.column("obs")
    assert col.segments[0].shape[1:] == (3, 2) and len(col.segments) == 1
    assert np.array_equal(np.asarray(col), np.asarray(tw.b.column("obs"))[:, -1])
    tw.feed(3)  # wrapped: two segments, oldest first
    col = tw.a.column("obs")
    assert len(col.segments) == 2
    assert np.array_equal(np.asarray(col), np.asarray(tw.b.column("obs"))[:, -1])
    assert np.array_equal(np.asarray(tw.a.column("action")), np.asarray(tw.b.column("action")))
    with pytest.raises(SpecError, match="'next_obs' is not stored: with frame_stack it is rebuilt "
                                        "from the frames of 'obs'"):
        tw.a.column("next_obs")
    with pytest.raises(SpecError, match="'next_obs' is not stored: with frame_stack"):
        tw.a.column_stats("next_obs")


def test_stats_of_a_stacked_field_are_frame_statistics():
    tw = Twin(k=3, num_envs=2, capacity=10, frame_kw={"stats": ["obs", "reward"]}, p_end=0.3)
    tw.feed(9)  # wrapped
    frames = np.asarray(tw.b.column("obs"))[:, -1].astype(np.float64)
    st = tw.a.stats("obs")
    assert st.count == len(tw.a) and st.mean.shape == (3, 2)
    assert np.allclose(st.mean, frames.mean(0)) and np.allclose(st.var, frames.var(0))
    assert np.array_equal(st.min, frames.min(0)) and np.array_equal(st.max, frames.max(0))
    once = tw.a.column_stats("obs")
    assert np.allclose(once.mean, st.mean) and once.mean.shape == (3, 2)
    # normalize broadcasts the frame statistics over a batch of stacks
    batch = tw.a.sample(4)
    assert st.normalize(batch["obs"]).shape == (4, 3, 3, 2)
    assert np.allclose(tw.a.stats("reward").mean, tw.b.column_stats("reward").mean)
    with pytest.raises(SpecError, match="'next_obs' is not stored.*frame_stack"):
        tfdata.ReplayBuffer(tw.spec, 10, frame_stack=3, stats=["next_obs"])


def test_update_field_refusals_and_relabelling():
    tw = Twin(k=3, num_envs=2, capacity=8)
    tw.feed(6)
    before = tw.a.state_dict()
    for name, match in (("obs", "stored one frame per row with frame_stack"),
                        ("next_obs", "not stored: with frame_stack"),
                        ("terminated", "episode flag"), ("truncated", "episode flag")):
        with pytest.raises(SpecError, match=match):
            tw.a.update_field(name, [0, 1], np.zeros((2,) + tfdata.Spec(tw.spec)[name].shape,
                                                     tfdata.Spec(tw.spec)[name].dtype))
    after = tw.a.state_dict()
    for f in before["data"]:
        assert np.array_equal(before["data"][f], after["data"][f])
    # the other fields relabel as in the oracle
    for buf in (tw.a, tw.b):
        buf.update_field("reward", [3, 0, 5], np.array([7.0, 8.0, 9.0], np.float32))
        buf.update_field("action", [1], [42])
    tw.check(6)


def test_bad_padding_frames_are_refused():
    spec = spec_of(3, dtype="f4")
    with pytest.raises(ValueError, match="must be finite"):
        tfdata.ReplayBuffer(spec, 12, frame_stack=3, frame_padding=np.full((3, 2), np.nan, np.float32))
    with pytest.raises(ValueError, match="must be finite"):
        tfdata.ReplayBuffer(spec, 12, frame_stack=3, frame_padding={"obs": [[np.inf, 0]] * 3})
    spec = {"obs": ("c8", (3, 2)), "terminated": "?", "truncated": "?"}
    with pytest.raises(SpecError, match="'reset' or 'zero'"):
        tfdata.ReplayBuffer(spec, 12, frame_stack=3, frame_padding=np.zeros(2, np.complex64))


# -- other frames, no next field --------------------------------------------------------------------
@pytest.mark.parametrize("dtype,frame", [("u1", (5,)), ("f4", (3,)), ("i2", (2, 3)), ("f8", (2, 2)),
                                         ("?", (4,)), ("u2", (7,))])
@pytest.mark.parametrize("layout", ["aos", "groups"])
def test_frames_of_every_width(dtype, frame, layout):
    """Frames of 4 to 32 bytes are copied as words of 1 to 8 bytes (in a record at any offset)."""
    spec = spec_of(3, frame, dtype)
    tw = Twin(k=3, num_envs=2, capacity=8, spec=spec, frame=frame, dtype=dtype, n_step=2,
              layout=LAYOUTS[layout], p_end=0.25)
    for t in range(12):
        tw.feed(1)
        n = len(tw.a)
        tw.same(tw.a.sample(n), tw.b.sample(n))
        tw.same(tw.a.sample(2, fields=["next_obs"]), tw.b.sample(2, fields=["next_obs"]), ["next_obs"])


@pytest.mark.parametrize("n_step", [None, 2])
def test_a_stacked_field_without_a_next_field(tmp_path, n_step):
    spec = spec_of(3, next_obs=False)
    tw = Twin(k=3, num_envs=2, capacity=8, spec=spec, n_step=n_step, p_end=0.3)
    assert set(tw.a.storage.spec.names) == {"obs", "action", "reward", "terminated", "truncated"}
    for t in range(15):
        step = tw.steps(1)[0]
        step.pop("next_obs")
        tw.a.extend(step)
        tw.b.extend(step)
        if len(tw.a) >= 3:
            tw.same(tw.a.sample(3), tw.b.sample(3))
            tw.same(tw.a.sample_sequences(2, 2), tw.b.sample_sequences(2, 2))
    tw.a.save(tmp_path / "ck")
    loaded = tfdata.ReplayBuffer.load(tmp_path / "ck")
    tw.same(loaded.sample(4), tw.a.sample(4))
