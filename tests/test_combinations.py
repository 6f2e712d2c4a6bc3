"""Every combination of the replay buffers' options either works or is refused.

The table is :mod:`tfdata.replay.combinations`. For every pair of options (and the triples
that matter), on every buffer class, the constructor either refuses with exactly the table's
message (which names both options), or the buffer runs: a writer thread fills it with
episodes of two-frame stacks (so frame stacks, elision and n-step all have real streams to
read) while this thread samples, then state dicts and checkpoints are round-tripped into twins
that must continue with the same batches. Every sampled row is checked against the rows as
pushed (by its id), and against what the sampler promises (rows held; no row twice in a batch
for without-replacement and exactly-k). Everything that may wait runs under a deadline: a hang
fails the test instead of stalling the suite.
"""

from __future__ import annotations

import itertools
import threading
import time

import numpy as np
import pytest

import tfdata
from tfdata.replay import combinations
from tfdata.transforms import ScaleReward
from tfdata.shared import SharedReplayBuffer, SharedWriter

SPEC = {"id": "i8", "obs": ("f4", (2, 3)), "action": "i8", "reward": "f4",
        "next_obs": ("f4", (2, 3)), "terminated": "?", "truncated": "?"}
CAP, B, STEPS, DEADLINE = 32, 4, 40, 60.0
GROUPS = [["id", "action", "reward"], ["obs", "terminated", "truncated"]]


def limiter(spi):
    return tfdata.RateLimiter(spi, 8, 8.0, timeout=DEADLINE)


# each option: its values, as (label, constructor keywords, facets); the first value of
# "sampler" is the default (uniform), every other option's values are all non-default
SINGLE = {
    "sampler": [("uniform", {}, {}),
                ("without_replacement", {"sampler": "without_replacement"},
                 {"sampler": "without_replacement"}),
                ("exactly_k", {"sampler": "exactly_k", "replays": 2, "timeout": DEADLINE},
                 {"sampler": "exactly_k", "stream_order": False, "replays": 2, "policy": "block"}),
                ("exactly_k_drop", {"sampler": "exactly_k", "replays": 2, "policy": "drop"},
                 {"sampler": "exactly_k", "stream_order": False, "replays": 2, "policy": "drop"}),
                ("exactly_k_overwrite", {"sampler": "exactly_k", "replays": 2, "policy": "overwrite"},
                 {"sampler": "exactly_k", "stream_order": False, "replays": 2,
                  "policy": "overwrite"}),
                ("prioritized", {"prioritized": True}, {"sampler": "prioritized", "prioritized": True})],
    "rate_limiter": [("limiter2", {"rate_limiter": 2.0}, {"rate_limiter": 2.0}),
                     ("limiter1", {"rate_limiter": 1.0}, {"rate_limiter": 1.0})],
    "n_step": [("n_step", {"n_step": 3}, {"n_step": 3})],
    "elide_next": [("elide_next", {"elide_next": True}, {"elide_next": True})],
    "frame_stack": [("frame_stack", {"frame_stack": 2}, {"frame_stack": True})],
    "spill": [("spill", {"spill": True}, {"spill": True})],
    "compress_cold": [("compress_cold", {"compress_cold": True}, {"compress_cold": True})],
    "stats": [("stats", {"stats": ["reward"]}, {"stats": True})],
    "layout": [("soa", {"layout": "soa"}, {}), ("groups", {"layout": GROUPS}, {})],
    "num_envs": [("num_envs", {"num_envs": 2}, {})],
}
SHARED = {
    "sampler": [("uniform", {}, {}),
                ("without_replacement", {"sampler": "without_replacement"},
                 {"sampler": "without_replacement"}),
                ("exactly_k", {"sampler": "exactly_k", "replays": 2, "timeout": 2.0},
                 {"sampler": "exactly_k", "stream_order": False, "replays": 2, "policy": "block"}),
                ("exactly_k_drop", {"sampler": "exactly_k", "replays": 2, "policy": "drop",
                                    "timeout": 2.0},
                 {"sampler": "exactly_k", "stream_order": False, "replays": 2, "policy": "drop"}),
                ("exactly_k_overwrite", {"sampler": "exactly_k", "replays": 2,
                                         "policy": "overwrite"},
                 {"sampler": "exactly_k", "stream_order": False, "replays": 2,
                  "policy": "overwrite"})],
    "prioritized": [("prioritized", {"prioritized": True}, {"prioritized": True})],
    "mode": [("fifo", {"mode": "fifo"}, {"fifo": True})],
    "rate_limiter": SINGLE["rate_limiter"],
    "n_step": SINGLE["n_step"],
    "frame_stack": SINGLE["frame_stack"],
    "stats": SINGLE["stats"],
    "layout": SINGLE["layout"],
    # an identity (x * 1.0, rounded back): the batches' checks hold; the path runs the transform
    "transforms": [("transforms", {"transforms": [ScaleReward(1.0)]}, {"transforms": True})],
}
# triples where three options meet in one mechanism
SINGLE_TRIPLES = [
    ("exactly_k", "limiter2", "num_envs"), ("exactly_k_drop", "limiter1", "num_envs"),
    ("frame_stack", "spill", "compress_cold"), ("prioritized", "frame_stack", "spill"),
    ("without_replacement", "frame_stack", "limiter2"), ("frame_stack", "n_step", "elide_next"),
    ("prioritized", "limiter2", "n_step"), ("exactly_k", "limiter2", "stats"),
    ("frame_stack", "num_envs", "n_step"), ("spill", "elide_next", "num_envs"),
]
SHARED_TRIPLES = [("exactly_k", "limiter2", "soa"), ("prioritized", "frame_stack", "n_step"),
                  ("without_replacement", "limiter2", "groups")]


def _values(options):
    return {label: (opt, kw, fc) for opt, vals in options.items() for label, kw, fc in vals}


def _cases(options, triples):
    by_label = _values(options)
    names = list(options)
    cases = []
    for a, b in itertools.combinations(names, 2):
        for va, vb in itertools.product(options[a], options[b]):
            if va[0] != "uniform" and vb[0] != "uniform":
                cases.append((va[0], vb[0]))
    for label in by_label:  # each option alone too
        if label != "uniform":
            cases.append((label,))
    cases += triples
    return cases


def _facets(buffer, labels, options):
    by_label = _values(options)
    o = {}
    for lab in labels:
        o.update(by_label[lab][2])
    if "rate_limiter" in o:
        o["rate_limiter"] = limiter(o["rate_limiter"]).params()
    if buffer == "ReplayBuffer" and o.get("sampler") == "prioritized":
        buffer = "PrioritizedReplayBuffer"
    return combinations.facets(buffer, **o)


def _kwargs(labels, options):
    by_label = _values(options)
    kw = {}
    for lab in labels:
        kw.update(by_label[lab][1])
    return kw


# -- streams --------------------------------------------------------------------------------
class Stream:
    """Episodes of ``num_envs`` streams whose rows carry unique ids and frames: ``obs`` is the
    stack of the last two frames (the first frame repeated at an episode's start), ``next_obs``
    the stack one frame on; every frame is ``[frame id, env, step]``."""

    def __init__(self, num_envs, seed):
        self.rng = np.random.default_rng(seed)
        self.E = num_envs
        self.next_id = 0
        self.next_frame = 0
        self.stacks = [None] * num_envs
        self.left = [0] * num_envs
        self.rows = {}
        self.pushed = 0  # rows the buffer has taken (the writer counts them after each call)

    def _frame(self, e, t):
        f = np.array([self.next_frame, e, t], np.float32)
        self.next_frame += 1
        return f

    def step(self) -> dict:
        out = {k: [] for k in SPEC}
        for e in range(self.E):
            if self.left[e] == 0:
                f = self._frame(e, 0)
                self.stacks[e] = np.stack([f, f])
                self.left[e] = int(self.rng.integers(2, 7))
            obs = self.stacks[e]
            nxt = np.stack([obs[1], self._frame(e, obs[1][2] + 1)])
            self.left[e] -= 1
            end = self.left[e] == 0
            term = bool(end and self.rng.random() < 0.5)
            row = {"id": self.next_id, "obs": obs, "action": int(self.rng.integers(0, 4)),
                   "reward": np.float32(self.rng.random()), "next_obs": nxt, "terminated": term,
                   "truncated": bool(end and not term)}
            self.rows[self.next_id] = row
            self.next_id += 1
            self.stacks[e] = nxt
            for k in SPEC:
                out[k].append(row[k])
        return {k: np.asarray(v, dtype=np.dtype(SPEC[k][0] if isinstance(SPEC[k], tuple) else SPEC[k]))
                for k, v in out.items()}


def check_batch(batch, stream, *, n_step, distinct, newest, pushed):
    """``pushed``: rows the buffer had taken before the sample began (a ring holds the newest
    ``newest`` rows of at least that many)."""
    ids = np.asarray(batch["id"])
    assert ((ids >= 0) & (ids < stream.next_id)).all(), ids
    if newest is not None:
        assert (ids >= pushed - newest).all(), (ids, pushed)
    if distinct:
        assert len(set(ids.tolist())) == len(ids), ids
    fields = ("obs", "action") if n_step else ("obs", "action", "reward", "next_obs",
                                               "terminated", "truncated")
    for j, i in enumerate(ids.tolist()):
        for f in fields:
            np.testing.assert_array_equal(np.asarray(batch[f][j]), stream.rows[i][f], err_msg=f"{f} of row {i}")


def assert_same(a, b):
    assert set(a.keys()) == set(b.keys())
    for k in a.keys():
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
    np.testing.assert_array_equal(a.indices, b.indices)


# -- one process ----------------------------------------------------------------------------
def build_single(kw, tmp_path, tag):
    kw = dict(kw)
    cls = tfdata.PrioritizedReplayBuffer if kw.pop("prioritized", False) else tfdata.ReplayBuffer
    if "rate_limiter" in kw:
        kw["rate_limiter"] = limiter(kw["rate_limiter"])
    if kw.pop("spill", False):
        kw.update(spill_path=tmp_path / f"spill-{tag}", hot_rows=8)
    return cls, cls(SPEC, CAP, seed=3, **kw)


def can_sample(buf):
    """Whether a sample of B would go on now, from public state only (a single learner)."""
    lim = buf.rate_limiter
    if lim is not None and not lim.can_sample(B):
        return False
    sampler = buf.sampler
    if getattr(sampler, "name", None) == "exactly_k":
        # both: a write's hooks add to the rows awaiting replay before it moves the rows held
        # (len), and a first sample checks len before it takes the lock; read in this order,
        # both only grow between this thread's samples
        return sampler.awaiting >= B and len(buf) >= B
    return len(buf) >= B


def run(stream, *, learner_check, writer_step, sample, can):
    """A writer thread writes STEPS steps while this thread samples whenever ``can()``, and a
    few times after the last write; fails on a hang. A sample that times out ends the run once
    the writer is done (a shared learner's wait polls shared memory: it may begin just before
    the last row), and is tried again while it writes (a slow writer, not a hang)."""
    errors = []
    E = stream.E

    def write():
        try:
            for _ in range(STEPS):
                writer_step(stream.step() if E > 1 else {k: v[0] for k, v in stream.step().items()})
                stream.pushed += E
        except BaseException as exc:  # re-raised by the test
            errors.append(exc)

    t = threading.Thread(target=write, daemon=True)
    t0 = time.monotonic()
    t.start()
    batches = after = 0
    while True:
        assert time.monotonic() - t0 < DEADLINE, "the writer and the learner made no progress"
        done = not t.is_alive()
        after += done
        if can() and after <= 8:
            pushed = stream.pushed
            try:
                batch = sample()
            except TimeoutError:
                if done:
                    break
                continue
            learner_check(batch, pushed)
            batches += 1
        elif done:
            break
        else:
            time.sleep(0.0005)
    t.join()
    if errors:
        raise errors[0]
    return batches


SINGLE_CASES = _cases(SINGLE, SINGLE_TRIPLES)


@pytest.mark.parametrize("labels", SINGLE_CASES, ids=["+".join(c) for c in SINGLE_CASES])
def test_single_process(labels, tmp_path):
    kw = _kwargs(labels, SINGLE)
    o = _facets("ReplayBuffer", labels, SINGLE)
    refused = combinations.refusal(o)
    if refused is not None:
        with pytest.raises(refused[0]) as info:
            build_single(kw, tmp_path, "a")
        assert str(info.value) == refused[1]
        assert list(tmp_path.iterdir()) == []  # nothing created
        return
    if kw.get("compress_cold"):
        pytest.importorskip("zstandard")
    cls, buf = build_single(kw, tmp_path, "a")
    E = kw.get("num_envs", 1)
    stream = Stream(E, 0)
    distinct = o["sampler"] in ("without_replacement", "exactly_k")
    rng = np.random.default_rng(1)

    def check(batch, pushed):
        check_batch(batch, stream, n_step=o["n_step"], distinct=distinct,
                    newest=CAP if o["stream_order"] else None, pushed=pushed)
        if o["sampler"] == "prioritized":
            try:
                buf.update_priorities(batch, rng.random(B) + 0.1)
            except ValueError as exc:  # the writer thread overwrote a row since the sample
                assert "stale batch" in str(exc)

    writer_step = buf.extend if E > 1 else buf.push
    n = run(stream, learner_check=check, writer_step=writer_step,
            sample=lambda: buf.sample(B), can=lambda: can_sample(buf))
    assert n > 0 or o["sampler"] == "exactly_k"
    if o["frame_stack"] or o["n_step"] or o["elide_next"]:
        if can_sample(buf) and o["stream_order"]:
            s = buf.sample_sequences(2, 3)
            assert s["obs"].shape == (2, 3, 2, 3)
    # the state round trip: a twin built alike continues with the same batches
    state = buf.state_dict()
    _, twin = build_single(kw, tmp_path, "b")
    twin.load_state_dict(state)
    # and a checkpoint
    buf.save(tmp_path / "ckpt")
    spill = {"spill_path": tmp_path / "spill-c", "hot_rows": 8} if kw.get("spill") else {}
    loaded = cls.load(tmp_path / "ckpt", **spill)
    for _ in range(2):
        if not can_sample(buf):
            break
        want = buf.sample(B, copy=True)
        assert_same(want, twin.sample(B, copy=True))
        assert_same(want, loaded.sample(B, copy=True))
        check_batch(want, stream, n_step=o["n_step"], distinct=distinct,
                    newest=CAP if o["stream_order"] else None, pushed=stream.pushed)


# -- shared memory --------------------------------------------------------------------------
def build_shared(kw):
    kw = dict(kw)
    if "rate_limiter" in kw:
        kw["rate_limiter"] = tfdata.RateLimiter(kw["rate_limiter"], 8, 8.0, timeout=2.0)
    if "frame_stack" in kw:  # an episode ends every 2-6 rows: room for every final frame held
        kw["final_frames"] = CAP
    return SharedReplayBuffer(SPEC, CAP, seed=3, **kw)


SHARED_CASES = _cases(SHARED, SHARED_TRIPLES)


@pytest.mark.parametrize("labels", SHARED_CASES, ids=["+".join(c) for c in SHARED_CASES])
def test_shared(labels, tmp_path, shm_dir):
    kw = _kwargs(labels, SHARED)
    o = _facets("SharedReplayBuffer", labels, SHARED)
    refused = combinations.refusal(o)
    if refused is not None:
        with pytest.raises(refused[0]) as info:
            build_shared(kw)
        assert str(info.value) == refused[1]
        assert list(shm_dir.iterdir()) == []  # no region was made
        return
    fifo = o["fifo"]
    distinct = fifo or o["sampler"] in ("without_replacement", "exactly_k")
    rng = np.random.default_rng(1)
    stream = Stream(1, 0)
    delivered = []
    # the writer may wait for the learner up to DEADLINE (the learner compiles its kernels at
    # its first sample); the learner's own wait ends 2 s after the last write
    with build_shared(kw) as buf, SharedWriter(buf.name, 0, timeout=DEADLINE) as w:
        def check(batch, pushed):
            check_batch(batch, stream, n_step=o["n_step"], distinct=distinct,
                        newest=CAP if o["stream_order"] and not fifo else None, pushed=pushed)
            delivered.extend(np.asarray(batch["id"]).tolist())
            if o["prioritized"]:
                try:
                    buf.update_priorities(batch, rng.random(B) + 0.1)
                except ValueError as exc:  # the writer thread overwrote a row since the sample
                    assert "stale batch" in str(exc)

        def sample():
            return buf.get_batch(B, timeout=DEADLINE) if fifo else buf.sample(B)

        def can():
            if fifo:
                return len(buf) >= B
            if o["sampler"] == "exactly_k" or o["rate_limiter"] is not None:
                return True  # the sample waits for what it needs (a timeout once writes end)
            return len(buf) >= B

        run(stream, learner_check=check, writer_step=w.push, sample=sample, can=can)
        if fifo:  # every row exactly once, in order
            assert delivered == list(range(len(delivered)))
            return
        assert delivered, "no batch was sampled"
        if o["sampler"] == "exactly_k":
            counts = np.bincount(np.asarray(delivered))
            assert counts.max() <= 2
        buf.save(tmp_path / "ckpt")
        with SharedReplayBuffer.load(tmp_path / "ckpt") as loaded:
            if o["sampler"] == "exactly_k" or o["rate_limiter"] is not None:
                return  # their samples would wait for rows or inserts no writer brings
            for _ in range(2):
                want = buf.sample(B, copy=True)
                assert_same(want, loaded.sample(B, copy=True))


# -- the cases of the issue, and the waits the table cannot see ----------------------------
def test_exactly_k_with_a_limiter_below_its_replays_is_refused():
    """Accepted before, and then an actor pushing and a learner sampling both waited for ever."""
    with pytest.raises(ValueError, match=r"sampler='exactly_k' \(replays=4, policy='block'\) with "
                                         r"rate_limiter=RateLimiter\(samples_per_insert=1,"):
        tfdata.ReplayBuffer({"x": "i8"}, 32, sampler="exactly_k", replays=4, policy="block",
                            rate_limiter=tfdata.RateLimiter(1.0, 8, 16.0))
    for spi, policy in [(5.0, "block"), (5.0, "drop"), (4.5, "overwrite")]:
        with pytest.raises(ValueError, match="samples_per_insert = replays"):
            tfdata.ReplayBuffer({"x": "i8"}, 32, sampler="exactly_k", replays=4, policy=policy,
                                rate_limiter=tfdata.RateLimiter(spi, 8, 16.0))
    with pytest.raises(ValueError, match="samples_per_insert = replays"):
        tfdata.ReplayBuffer.plan_memory({"x": "i8"}, 32, sampler="exactly_k", replays=4,
                                        rate_limiter=tfdata.RateLimiter(1.0, 8, 16.0))
    # at the ratio, or below it where writers never wait for slots: built
    tfdata.ReplayBuffer({"x": "i8"}, 32, sampler="exactly_k", replays=4,
                        rate_limiter=tfdata.RateLimiter(4.0, 8, 16.0))
    tfdata.ReplayBuffer({"x": "i8"}, 32, sampler="exactly_k", replays=4, policy="drop",
                        rate_limiter=tfdata.RateLimiter(1.0, 8, 16.0))


@pytest.mark.parametrize("policy", ["block", "drop", "overwrite"])
def test_exactly_k_at_its_ratio_runs_with_an_actor_and_a_learner_thread(policy):
    """The issue's buffer with samples_per_insert = replays: an actor thread pushes 400 rows, the
    learner samples sample(4) while rows can come; nothing hangs, no row is delivered more than
    replays times, and the counts stay within the limiter's bounds."""
    k, n = 4, 400
    lim = tfdata.RateLimiter(float(k), 8, 16.0, timeout=DEADLINE)
    buf = tfdata.ReplayBuffer({"x": "i8"}, 32, sampler="exactly_k", replays=k, policy=policy,
                              rate_limiter=lim, seed=0)
    errors, seen = [], []

    def actor():
        try:
            for i in range(n):
                buf.push({"x": i})
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=actor, daemon=True)
    t0 = time.monotonic()
    t.start()
    while t.is_alive() or can_sample(buf):
        assert time.monotonic() - t0 < DEADLINE, "the actor and the learner made no progress"
        if can_sample(buf):
            seen.extend(buf.sample(4)["x"].tolist())
            m = lim.metrics()
            assert m["samples"] <= m["inserts"] * k - (k * 8 - 16.0)
        else:
            time.sleep(0.0005)
    t.join()
    assert not errors, errors
    counts = np.bincount(seen, minlength=n)
    assert counts.max() <= k
    if policy == "block":  # every row but the last ones awaiting replay got all its deliveries
        assert (counts == k).sum() >= n - 32


def test_a_limited_sample_waiting_for_rows_no_insert_can_bring_raises():
    """min_size_to_sample 1, error_buffer 4, 4 samples per insert: inserts stop at 2 rows until
    something is sampled, and sample(4) waits for 4 rows: each would wait for the other for ever
    (until the timeout). The sample raises ValueError at once instead, naming the counts (the
    timeout only turns a regression into a TimeoutError rather than a hang)."""
    lim = tfdata.RateLimiter(4.0, 1, 4.0, timeout=DEADLINE)
    buf = tfdata.ReplayBuffer({"x": "i8"}, 32, rate_limiter=lim)
    buf.push({"x": 0})
    buf.push({"x": 1})
    assert not lim.can_insert(1)
    before = buf.state_dict()
    with pytest.raises(ValueError, match=r"a sample of 4 rows waits for rows \(2 can be drawn now\), "
                                         r"and an insert of 1 rows waits for samples"):
        buf.sample(4)
    after = buf.state_dict()
    assert after["sampler"] == before["sampler"] and lim.metrics()["samples"] == 0
    buf.sample(2)  # what can proceed still does


def test_a_limited_sample_that_waits_for_rows_wakes_when_an_insert_brings_them():
    """The check above raises only when no insert may proceed: a sample short of rows whose
    writer is still allowed to insert waits for it (a writer thread that starts late)."""
    lim = tfdata.RateLimiter(1.0, 1, 8.0, timeout=DEADLINE)
    buf = tfdata.ReplayBuffer({"x": "i8"}, 32, rate_limiter=lim, seed=0)

    def late():
        time.sleep(0.3)
        for i in range(8):
            buf.push({"x": i})

    t = threading.Thread(target=late, daemon=True)
    t.start()
    assert buf.sample(4)["x"].shape == (4,)
    t.join()


def test_a_limited_sample_is_stuck_when_no_step_of_num_envs_rows_may_insert():
    """With num_envs=2 an insert writes 2 rows: a sample short of rows waits for ever once an
    insert of 2 rows is refused, even while one of 1 row would still pass the ratio."""
    lim = tfdata.RateLimiter(1.0, 1, 2.0, timeout=2.0)  # inserts up to inserts - samples <= 3
    buf = tfdata.ReplayBuffer({"x": "i8"}, 32, num_envs=2, rate_limiter=lim)
    buf.extend({"x": np.array([0, 1])})
    assert lim.can_insert(1) and not lim.can_insert(2)
    with pytest.raises(ValueError, match=r"a sample of 4 rows waits for rows \(2 can be drawn now\), "
                                         r"and an insert of 2 rows waits for samples"):
        buf.sample(4)
    assert lim.metrics()["samples"] == 0


def test_a_limited_exactly_k_sample_waits_for_rows_awaiting_replay_not_rows_held():
    """The limiter waits for the rows an exactly-k batch can draw (those awaiting replay), not
    the rows held: with 3 rows held of which 1 awaits replay, sample(2) waits for a writer
    thread's insert (the sampler itself, without a timeout, would refuse at once)."""
    lim = tfdata.RateLimiter(1.0, 1, 2.0, timeout=DEADLINE)  # min_diff -1: passes with 1 row owed
    buf = tfdata.ReplayBuffer({"x": "i8"}, 8, sampler="exactly_k", replays=1, rate_limiter=lim,
                              seed=0)
    for i in range(3):
        buf.push({"x": i})
    first = buf.sample(2, copy=True)["x"].tolist()
    assert len(buf) == 3 and buf.sampler.awaiting == 1
    got, errors = [], []

    def learner():
        try:
            got.extend(buf.sample(2)["x"].tolist())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=learner, daemon=True)
    t.start()
    t0 = time.monotonic()
    while lim.metrics()["sample_waits"] == 0 and t.is_alive():  # the sample is waiting
        assert time.monotonic() - t0 < DEADLINE
        time.sleep(0.001)
    assert not errors, errors
    buf.push({"x": 3})
    t.join(DEADLINE)
    assert not t.is_alive() and not errors, errors
    assert sorted(first + got) == [0, 1, 2, 3]  # each row once (replays=1), the new one too


def test_limited_exactly_k_batches_at_the_bounds_are_sampled():
    """The largest batches the refusals below let through do run: the pool bound and the
    capacity bound are tight (one row more is refused), and a policy whose writers never wait
    for slots is not held to the capacity bound."""
    lim = tfdata.RateLimiter(4.0, 8, 16.0)  # inserts stop at 12 rows: 12 await replay
    buf = tfdata.ReplayBuffer({"x": "i8"}, 32, sampler="exactly_k", replays=4, rate_limiter=lim)
    for i in range(12):
        buf.push({"x": i})
    assert not lim.can_insert(1)
    assert sorted(buf.sample(12)["x"].tolist()) == list(range(12))
    # capacity 64 >= k * min_size_to_sample - error_buffer + batch = 4 * 16 - 16 + 16
    for policy, batch in (("block", 16), ("drop", 17)):
        lim = tfdata.RateLimiter(4.0, 16, 16.0)  # inserts stop at 20 rows
        buf = tfdata.ReplayBuffer({"x": "i8"}, 64, sampler="exactly_k", replays=4, policy=policy,
                                  rate_limiter=lim)
        for i in range(20):
            buf.push({"x": i})
        assert not lim.can_insert(1)
        rows = buf.sample(batch)["x"].tolist()
        assert len(set(rows)) == batch and set(rows) <= set(range(20)), policy


def test_a_limited_exactly_k_batch_that_could_wait_for_ever_is_refused_before_its_ring(shm_dir):
    # (timeouts: a regression fails with TimeoutError instead of hanging the suite)
    lim = tfdata.RateLimiter(4.0, 8, 16.0, timeout=DEADLINE)
    buf = tfdata.ReplayBuffer({"x": "i8"}, 32, sampler="exactly_k", replays=4, rate_limiter=lim)
    nbytes = buf.nbytes
    with pytest.raises(ValueError, match="a sample of 13 distinct rows can wait for ever, since "
                                         "inserts stop while only 12 rows may await replay"):
        buf.sample(13)
    assert buf.nbytes == nbytes  # no ring was built
    lim = tfdata.RateLimiter(4.0, 16, 16.0, timeout=DEADLINE)
    buf = tfdata.ReplayBuffer({"x": "i8"}, 64, sampler="exactly_k", replays=4, rate_limiter=lim)
    with pytest.raises(ValueError, match="more than the capacity 64 may hold"):
        buf.sample(17)
    with SharedReplayBuffer({"x": "i8"}, 64, sampler="exactly_k", replays=4,
                            rate_limiter=tfdata.RateLimiter(4.0, 16, 16.0, timeout=DEADLINE)) as sb:
        with pytest.raises(ValueError, match="more than the capacity 64 may hold"):
            sb.sample(17)


def test_the_table_in_the_design_record_is_the_table_in_the_code():
    import pathlib

    text = (pathlib.Path(__file__).parents[1] / "docs" / "design" / "combinations.md").read_text()
    assert combinations.markdown() in text


def test_every_rule_is_walked():
    """Each rule of the table refuses at least one case of the walk above (a rule no case
    reaches is untested)."""
    hit = set()
    for buffer, options, cases in (("ReplayBuffer", SINGLE, SINGLE_CASES),
                                   ("SharedReplayBuffer", SHARED, SHARED_CASES)):
        for labels in cases:
            o = _facets(buffer, labels, options)
            for r in combinations.RULES:
                if o["buffer"] in r.where and r.applies(o):
                    hit.add((r.a, r.b))
                    break
    assert hit == {(r.a, r.b) for r in combinations.RULES}


@pytest.mark.parametrize("policy", ["overwrite", "drop", "block"])
def test_exactly_k_with_two_envs_saves_a_cursor_between_steps(policy, tmp_path):
    """Exactly-k places each row of a step in the next free slot, so the writer's cursor can
    stop between two environments' rows; a checkpoint of such a buffer loads and continues
    (the walk above found it refused: 'state.writer.cursor: expected a multiple of num_envs')."""
    spec = {"x": "i8"}
    for seed in range(50):
        buf = tfdata.ReplayBuffer(spec, 8, sampler="exactly_k", replays=1, policy=policy,
                                  num_envs=2, seed=seed, timeout=None if policy != "block" else 1.0)
        buf.extend({"x": np.arange(8)})  # 4 steps of 2 rows: full, every row awaiting replay
        buf.sample(1)  # frees one random slot
        if policy != "overwrite":
            buf.sample(1)  # a step needs two free slots (else it waits or is dropped)
        buf.extend({"x": np.array([100, 101])})
        if buf.writer.cursor % 2:
            break
    else:
        pytest.fail("no seed left the cursor between two steps")
    path = tmp_path / f"ckpt-{policy}"
    buf.save(path)
    loaded = tfdata.ReplayBuffer.load(path)
    twin = tfdata.ReplayBuffer(spec, 8, sampler="exactly_k", replays=1, policy=policy, num_envs=2,
                               timeout=None if policy != "block" else 1.0)
    twin.load_state_dict(buf.state_dict())
    for other in (loaded, twin):
        assert other.writer.cursor == buf.writer.cursor
    while buf.sampler.awaiting:
        want = buf.sample(1, copy=True)
        assert_same(want, loaded.sample(1, copy=True))
        assert_same(want, twin.sample(1, copy=True))
