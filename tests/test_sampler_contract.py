"""A sampler written outside the package plugs into ReplayBuffer through the public contract
(tfdata.replay.samplers): nothing in tfdata names it, and everything else still works with it:
every layout, the generated push, extend, n-step windows, clear, state round trips, and
checkpoints (saved by its name and config, loaded with ``samplers=[RecentSampler]``, continuing
exactly; a hostile checkpoint of it refused naming the field)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tfdata import FormatError, ReplayBuffer, Spec
from tfdata.replay.samplers import (Sampler, StateError, config_keys, config_value, state_int,
                                    state_part)

from .conftest import LAYOUTS

SPEC = Spec({"obs": ("f4", (3,)), "reward": "f4", "terminated": "?", "truncated": "?",
             "next_obs": ("f4", (3,))})


class RecentSampler(Sampler):
    """Uniform over the ``window`` newest rows: knows the newest slot from the write hooks, draws
    with numpy from ``(seed, counter)`` and gathers through the storage (no layout). Saved by its
    name and config (``window``), its state the RNG position and ``newest``."""

    hears_writes = True
    name = "recent"

    def __init__(self, window: int, seed: int):
        super().__init__(seed)
        self.window = window
        self.newest = -1

    def config(self) -> dict:
        return {"window": self.window}

    @classmethod
    def from_config(cls, config, seed):
        config_keys(config, ("window",), cls.name)  # exactly its options
        return cls(config_value(config, "window", "int", 1, 1 << 32), seed)

    def on_write(self, spans, n, extra) -> None:
        dst, _, count = spans[-1]
        self.newest = dst + count - 1

    def slot_hook(self):
        def on_write(slot, _self=self):
            _self.newest = slot

        return on_write

    def on_clear(self) -> None:
        self.newest = -1

    def sample(self, n, out, arrays) -> None:
        k = min(self.window, n)
        back = np.random.default_rng([self.seed, self.counter]).integers(0, k, out.indices.shape[0])
        self.state[1] += np.uint64(1)
        out.indices[:] = (self.newest - back) % self.capacity
        self.storage.gather(out.indices, out)

    def extra_state(self, size) -> dict:
        return {"newest": self.newest}

    def check_state(self, state, size, capacity):
        rng = super().check_state(state, size, capacity)
        state_part(state, ("newest",), self.name)
        newest = state_int(state, "newest", "recent.newest", -1, capacity - 1)
        if (newest < 0) != (size == 0):  # a row is written exactly when one is held
            raise StateError("recent.newest", "-1 exactly when no row is held", newest)
        return rng, newest

    def load_state(self, checked) -> None:
        rng, newest = checked
        super().load_state(rng)
        self.newest = newest


def rows(rng, n):
    return {"obs": rng.random((n, 3), np.float32), "reward": rng.random(n).astype(np.float32),
            "terminated": rng.random(n) < 0.2, "truncated": np.zeros(n, bool),
            "next_obs": rng.random((n, 3), np.float32)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_outside_sampler_plugs_in(layout):
    buf = ReplayBuffer(SPEC, 20, layout=layout, sampler=RecentSampler(4, seed=1))
    rng = np.random.default_rng(0)
    data = rows(rng, 27)  # wraps
    for i in range(27):
        buf.push({k: (v[i] if v[i].ndim else v[i].item()) for k, v in data.items()})
    newest = 26 % 20
    b = buf.sample(8)
    assert set(b.indices.tolist()) <= {(newest - j) % 20 for j in range(4)}
    for k in SPEC.names:  # the rows are the stored rows of those slots
        np.testing.assert_array_equal(b[k], buf.storage.field(k)[b.indices])
    np.testing.assert_array_equal(buf.storage.field("obs")[newest], data["obs"][26])


def test_the_generated_push_calls_its_slot_hook():
    fast = ReplayBuffer(SPEC, 10, sampler=RecentSampler(2, seed=3))
    assert hasattr(fast._fast_push, "__source__")  # the per-spec push, not the generic one
    fast.push({"obs": np.ones(3, np.float32), "reward": 1.0, "terminated": False,
               "truncated": False, "next_obs": np.ones(3, np.float32)})
    assert fast.sampler.newest == 0
    fast.extend(rows(np.random.default_rng(1), 5))
    assert fast.sampler.newest == 5


def test_layouts_agree_and_state_round_trips():
    out = []
    for layout in LAYOUTS:
        buf = ReplayBuffer(SPEC, 16, layout=layout, n_step=3, gamma=0.5, sampler=RecentSampler(5, seed=2))
        buf.extend(rows(np.random.default_rng(4), 23))
        out.append([buf.sample(6, copy=True) for _ in range(3)])
        state = buf.state_dict()
        assert state["recent"] == {"newest": buf.sampler.newest}  # its state, under its name
        other = ReplayBuffer(SPEC, 16, layout=layout, n_step=3, gamma=0.5, sampler=RecentSampler(5, seed=7))
        other.load_state_dict(state)
        assert other.sampler.newest == buf.sampler.newest
        a, b = buf.sample(6), other.sample(6)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.discounts, b.discounts)
    for x, y in zip(*out):
        np.testing.assert_array_equal(x.indices, y.indices)
        for k in SPEC.names:
            np.testing.assert_array_equal(x[k], y[k])
        np.testing.assert_array_equal(x.discounts, y.discounts)  # n-step works over any sampler


def test_clear_reaches_the_sampler_and_seed_conflicts_are_refused():
    buf = ReplayBuffer(SPEC, 8, sampler=RecentSampler(2, seed=0))
    buf.extend(rows(np.random.default_rng(0), 3))
    buf.clear()
    assert buf.sampler.newest == -1 and len(buf) == 0
    with pytest.raises(ValueError, match="seed"):
        ReplayBuffer(SPEC, 8, seed=1, sampler=RecentSampler(2, seed=0))


# -- checkpoints ----------------------------------------------------------------------------------
GROUPS = [["obs", "next_obs"], ["reward", "terminated", "truncated"]]


def recent(layout, seed=2):
    buf = ReplayBuffer(SPEC, 16, layout=layout, n_step=3, gamma=0.5, sampler=RecentSampler(5, seed=seed))
    buf.extend(rows(np.random.default_rng(4), 23))
    buf.sample(6)
    return buf


def same(a, b) -> None:
    np.testing.assert_array_equal(a.indices, b.indices)
    for k in SPEC.names:
        np.testing.assert_array_equal(a[k], b[k])
    np.testing.assert_array_equal(a.discounts, b.discounts)


@pytest.mark.parametrize("layout", LAYOUTS + [GROUPS])
def test_an_outside_sampler_saves_loads_and_continues_exactly(tmp_path, layout):
    saved, twin = recent(layout), recent(layout)  # twin: the same buffer, never saved
    saved.save(tmp_path / "ck")
    doc = json.loads((tmp_path / "ck" / "state.json").read_text())
    assert doc["config"]["sampler"] == "recent" and doc["config"]["window"] == 5
    assert doc["state"]["recent"] == {"newest": saved.sampler.newest}
    back = ReplayBuffer.load(tmp_path / "ck", samplers=[RecentSampler])
    assert type(back.sampler) is RecentSampler and back.sampler.window == 5
    assert back.sampler.newest == twin.sampler.newest and back.config == twin.config
    more = rows(np.random.default_rng(9), 6)
    for step in range(4):  # samples, then writes and samples: the same as the buffer never saved
        for _ in range(2):
            same(back.sample(6), twin.sample(6))
        back.extend({k: v[step:step + 1] for k, v in more.items()})
        twin.extend({k: v[step:step + 1] for k, v in more.items()})
    # into another layout too
    other = ReplayBuffer.load(tmp_path / "ck", samplers=[RecentSampler], layout="soa")
    again = recent(layout)
    same(other.sample(6), again.sample(6))


def test_an_outside_sampler_needs_to_be_given_to_load(tmp_path):
    recent("aos").save(tmp_path / "ck")
    with pytest.raises(FormatError, match=r"config\.sampler: the sampler 'recent' is neither one "
                                          r"of tfdata's.*samplers=\[YourSampler\]"):
        ReplayBuffer.load(tmp_path / "ck")
    with pytest.raises(TypeError, match="sampler classes"):
        ReplayBuffer.load(tmp_path / "ck", samplers=[RecentSampler(3, seed=0)])

    class Impostor(RecentSampler):
        name = "uniform"

    with pytest.raises(ValueError, match="'uniform' of UniformSampler"):
        ReplayBuffer.load(tmp_path / "ck", samplers=[Impostor])


def test_a_sampler_without_a_name_is_not_saved(tmp_path):
    class Nameless(RecentSampler):
        name = None

    buf = ReplayBuffer(SPEC, 8, sampler=Nameless(2, seed=0))
    buf.extend(rows(np.random.default_rng(0), 3))
    assert buf.config["sampler"] is None
    with pytest.raises(TypeError, match="Nameless has no name"):
        buf.save(tmp_path / "ck")
    assert not (tmp_path / "ck").exists()


def _config(key, value):
    return lambda d: d["config"].__setitem__(key, value)


def _state(key, value):
    return lambda d: d["state"]["recent"].__setitem__(key, value)


@pytest.mark.parametrize("edit, field", [
    (_config("window", 0), "config.window: expected an int in [1, 4294967296], got int 0"),
    (_config("window", 2.0), "config.window: expected an int"),
    (_config("window", True), "config.window: expected an int"),
    (lambda d: d["config"].pop("window"), "config.window: expected a value"),
    (_config("depth", 3), "config.depth: expected no such key"),
    (_state("newest", 16), "state.recent.newest: expected an int in [-1, 15], got int 16"),
    (_state("newest", -1), "state.recent.newest: expected -1 exactly when no row is held, got -1"),
    (_state("newest", "7"), "state.recent.newest: expected an int"),
    (_state("newest", [7]), "state.recent.newest: expected an int"),
    (_state("seed", 7), "state.recent.seed: expected no such key"),
    (_state("older", 7), "state.recent: expected an object of the keys ['newest']"),
    (lambda d: d["state"]["recent"].pop("newest"), "state.recent: expected an object of the keys"),
    (lambda d: d["state"].__setitem__("recent", 3), "state.recent: expected an object"),
    (lambda d: d["state"].pop("recent"), "the state of sampler 'recent'"),
])
def test_a_hostile_checkpoint_of_an_outside_sampler_is_refused(tmp_path, edit, field):
    recent("aos").save(tmp_path / "saved")
    path = tmp_path / "ck"
    shutil.copytree(tmp_path / "saved", path)
    doc = json.loads((path / "state.json").read_text())
    edit(doc)
    (path / "state.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError) as err:
        ReplayBuffer.load(path, samplers=[RecentSampler])
    assert field in str(err.value) and str(path) in str(err.value), str(err.value)


def test_the_arrays_of_an_outside_samplers_state_are_bounded(tmp_path):
    """An array in its part is read only within the bound a checkpoint's capacity justifies
    (from the header, before its data), then checked by its check_state like any value."""
    from tfdata.replay.samplers import STATE_BYTES_BASE, STATE_BYTES_PER_SLOT

    recent("aos").save(tmp_path / "saved")
    too_big = (STATE_BYTES_PER_SLOT * 16 + STATE_BYTES_BASE) // 8 + 1
    for n, field in ((too_big, "expected at most"), (3, "state.recent.newest: expected an int")):
        path = tmp_path / f"ck{n}"
        shutil.copytree(tmp_path / "saved", path)
        np.save(path / "arrays" / "big.npy", np.zeros(n, np.int64))
        doc = json.loads((path / "state.json").read_text())
        doc["state"]["recent"]["newest"] = {"$array": "arrays/big.npy"}
        (path / "state.json").write_text(json.dumps(doc))
        with pytest.raises(FormatError, match=field):
            ReplayBuffer.load(path, samplers=[RecentSampler])


# -- shared memory: the same sampler object over the shards of a region ----------------------------
def _recent_writer(name, data, steps, go, done, errors):
    """A writer process: at each step, the rows of that step (then waits for the learner)."""
    from tfdata.shared import SharedWriter

    try:
        with SharedWriter(name, 0) as w:
            for lo, hi in steps:
                go.wait(60)
                go.clear()
                if hi - lo == 1:
                    w.push({k: (v[lo] if v[lo].ndim else v[lo].item()) for k, v in data.items()})
                else:
                    w.extend({k: v[lo:hi] for k, v in data.items()})
                done.set()
    except BaseException as exc:  # pragma: no cover - reported to the test
        errors.put(repr(exc))
        done.set()


def _steps(counts):
    out, at = [], 0
    for c in counts:
        out.append((at, at + c))
        at += c
    return out


class RecentOnWrite(RecentSampler):
    """RecentSampler without its one-row hook: it hears every write through on_write."""

    name = "recent_on_write"

    def slot_hook(self):
        return None


@pytest.mark.parametrize("layout, cls", [(layout, RecentSampler) for layout in LAYOUTS]
                         + [("aos", RecentOnWrite)])
def test_an_outside_sampler_runs_on_a_shared_buffer(tmp_path, monkeypatch, layout, cls):
    """RecentSampler, unchanged, on a SharedReplayBuffer whose writer is another process: it
    hears the published rows through its write hooks before each sample, and its batches are
    those of a ReplayBuffer given the same rows; saved, loaded (samplers=[RecentSampler]) and
    continued as the buffer never saved."""
    import multiprocessing as mp

    from tfdata.shared import SharedReplayBuffer

    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    ctx = mp.get_context("fork")
    counts = [5, 1, 9, 1, 7, 20, 1, 3]  # pushes and extends, wrapping the ring of 16
    data = rows(np.random.default_rng(3), sum(counts))
    ref = ReplayBuffer(SPEC, 16, layout=layout, sampler=cls(5, seed=11))
    go, done, errors = ctx.Event(), ctx.Event(), ctx.Queue()
    with SharedReplayBuffer(SPEC, 16, layout=layout, sampler=cls(5, seed=11)) as buf:
        p = ctx.Process(target=_recent_writer, args=(buf.name, data, _steps(counts), go, done, errors))
        p.start()
        try:
            for step, (lo, hi) in enumerate(_steps(counts)):
                done.clear()
                go.set()
                assert done.wait(60)
                assert errors.empty(), errors.get()
                ref.extend({k: v[lo:hi] for k, v in data.items()})
                for b in (1, 4):
                    got, want = buf.sample(b, copy=True), ref.sample(b, copy=True)
                    same_rows(got, want)
                if step == 5:  # save mid-run; the loaded buffer continues as the one saved
                    buf.save(tmp_path / "ck")
                    twin = {"state": ref.state_dict()}
        finally:
            p.join(60)
        assert p.exitcode == 0
        assert buf.redraws == 0 and buf.sampler.newest == ref.sampler.newest
        doc = json.loads((tmp_path / "ck" / "state.json").read_text())
        assert doc["config"]["sampler"] == cls.name and doc["config"]["window"] == 5
        assert doc["state"][cls.name] == {"newest": twin["state"][cls.name]["newest"]}
    with pytest.raises(FormatError, match=r"samplers=\[YourSampler\]"):
        SharedReplayBuffer.load(tmp_path / "ck")
    again = ReplayBuffer(SPEC, 16, layout=layout, sampler=cls(5, seed=0))
    again.extend({k: v[:_steps(counts)[5][1]] for k, v in data.items()})
    again.load_state_dict(twin["state"])
    with SharedReplayBuffer.load(tmp_path / "ck", samplers=[cls]) as back:
        assert type(back.sampler) is cls and back.sampler.window == 5
        for _ in range(3):
            same_rows(back.sample(4, copy=True), again.sample(4, copy=True))


def same_rows(a, b) -> None:
    np.testing.assert_array_equal(a.indices, b.indices)
    for k in SPEC.names:
        np.testing.assert_array_equal(a[k], b[k])


def test_a_shared_buffer_refuses_what_a_sampler_object_does_not_combine_with(tmp_path, monkeypatch):
    from tfdata.shared import SharedReplayBuffer

    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="own seed"):
        SharedReplayBuffer(SPEC, 8, seed=1, sampler=RecentSampler(2, seed=0))
    with pytest.raises(NotImplementedError, match="n_step"):
        SharedReplayBuffer(SPEC, 8, n_step=3, sampler=RecentSampler(2, seed=0))
    assert list(tmp_path.iterdir()) == []

    class Nameless(RecentSampler):
        name = None

    with SharedReplayBuffer(SPEC, 8, sampler=Nameless(2, seed=0)) as buf:
        with pytest.raises(TypeError, match="Nameless has no name"):
            buf.save(tmp_path / "ck")
        with pytest.raises(NotImplementedError, match="sample_sequences"):
            buf.sample_sequences(2, 2)
    assert not (tmp_path / "ck").exists()


def _racing_writer(name, stop, errors):
    from tfdata.shared import SharedWriter

    from .test_shared import id_rows

    try:
        with SharedWriter(name, 0) as w:
            i = 0
            while not stop.is_set():
                w.extend(id_rows(np.arange(i, i + 5)))
                i += 5
    except BaseException as exc:  # pragma: no cover - reported to the test
        errors.put(repr(exc))


def test_an_outside_sampler_never_returns_a_torn_row(tmp_path, monkeypatch):
    """A writer process overwrites its ring flat out while RecentSampler (its window the whole
    ring, so its draws reach the rows being overwritten) samples: every row is whole, the
    batches holding a torn row were drawn again whole, and the sampler heard every write."""
    import multiprocessing as mp
    import time

    from tfdata.shared import SharedReplayBuffer

    from .test_shared import ID_SPEC, consistent

    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    ctx = mp.get_context("fork")
    stop, errors = ctx.Event(), ctx.Queue()
    with SharedReplayBuffer(ID_SPEC, 8, sampler=RecentSampler(8, seed=4)) as buf:
        p = ctx.Process(target=_racing_writer, args=(buf.name, stop, errors))
        p.start()
        try:
            deadline = time.monotonic() + 120
            while len(buf) < 8 and time.monotonic() < deadline:
                time.sleep(0.01)
            n = 0
            while (n < 2000 or buf.redraws == 0) and time.monotonic() < deadline:
                b = buf.sample(8)
                assert consistent(b).all()
                # rows of one snapshot of the ring (a batch torn anywhere was drawn again whole)
                assert int(b["id"].max()) - int(b["id"].min()) < 8
                n += 1
        finally:
            stop.set()
            p.join(30)
        assert errors.empty(), errors.get()
        assert buf.redraws > 0 and buf.redraws % 8 == 0, "the writer never raced the reader"


@pytest.mark.parametrize("edit, field", [
    (_config("window", 0), "config.window: expected an int in [1, 4294967296], got int 0"),
    (_config("depth", 3), "config.depth: expected no such key"),
    (_state("newest", 16), "state.recent.newest: expected an int in [-1, 15], got int 16"),
    (_state("newest", -1), "state.recent.newest: expected -1 exactly when no row is held, got -1"),
    (_state("seed", 7), "state.recent.seed: expected no such key"),
    (lambda d: d["state"].pop("recent"), "state: expected"),
    (_config("sampler", "other"), "config.sampler: the sampler 'other' is neither"),
])
def test_a_hostile_shared_checkpoint_of_an_outside_sampler_is_refused(tmp_path, monkeypatch, edit,
                                                                      field):
    from tfdata.shared import SharedReplayBuffer, SharedWriter

    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    with SharedReplayBuffer(SPEC, 16, sampler=RecentSampler(5, seed=2)) as buf, \
            SharedWriter(buf.name, 0) as w:
        w.extend(rows(np.random.default_rng(4), 23))
        buf.sample(4)
        buf.save(tmp_path / "saved")
    path = tmp_path / "ck"
    shutil.copytree(tmp_path / "saved", path)
    doc = json.loads((path / "state.json").read_text())
    edit(doc)
    (path / "state.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError) as err:
        SharedReplayBuffer.load(path, samplers=[RecentSampler])
    assert field in str(err.value) and str(path) in str(err.value), str(err.value)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("tfdata")] == []  # no region


def test_a_shared_buffer_refuses_slots_no_shard_holds(tmp_path, monkeypatch):
    """A user's sampler drawing in [0, n) as if the rows held were the first n slots: over two
    shards partly filled they are not, and the batch is refused naming the slot."""
    from tfdata.shared import SharedReplayBuffer, SharedWriter

    class FirstN(RecentSampler):
        name = "first_n"

        def sample(self, n, out, arrays):
            out.indices[:] = np.arange(out.indices.shape[0]) % n
            self.storage.gather(out.indices, out)

    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    with SharedReplayBuffer(SPEC, 16, num_writers=2, sampler=FirstN(2, seed=0)) as buf, \
            SharedWriter(buf.name, 0) as w0, SharedWriter(buf.name, 1) as w1:
        w0.extend(rows(np.random.default_rng(0), 3))
        w1.extend(rows(np.random.default_rng(1), 3))
        assert buf.sample(3).indices.tolist() == [0, 1, 2]  # shard 0's rows
        with pytest.raises(ValueError, match="drew slot 3, which holds no row"):
            buf.sample(6)
        assert buf.sampler.newest == 10  # heard shard 1's rows (slots 8, 9, 10)


def test_an_outside_sampler_under_a_rate_limiter_on_a_shared_buffer(tmp_path, monkeypatch):
    """The limiter is a gate around the sample, whatever the sampler: a sample waits for rows
    inserted, and the counts survive a checkpoint with the sampler's state."""
    from tfdata import RateLimiter
    from tfdata.shared import SharedReplayBuffer, SharedWriter

    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    lim = RateLimiter(1.0, 4, 8, timeout=0.2)
    with SharedReplayBuffer(SPEC, 16, sampler=RecentSampler(3, seed=1), rate_limiter=lim) as buf, \
            SharedWriter(buf.name, 0) as w:
        with pytest.raises(TimeoutError):
            buf.sample(2)  # fewer than min_size_to_sample rows inserted
        w.extend(rows(np.random.default_rng(0), 6))
        b = buf.sample(2)
        assert set(b.indices.tolist()) <= {3, 4, 5}
        buf.save(tmp_path / "ck")
        newest, samples = buf.sampler.newest, buf.rate_limiter.samples
    with SharedReplayBuffer.load(tmp_path / "ck", samplers=[RecentSampler]) as back:
        assert back.sampler.newest == newest and back.rate_limiter.samples == samples
        assert set(back.sample(2).indices.tolist()) <= {3, 4, 5}


def test_tfdatas_samplers_as_objects_on_a_shared_buffer(tmp_path, monkeypatch):
    """A UniformSampler or PrioritizedSampler object draws as the sampler of that name does
    (the same class, kernels and catch-up; the same versions: a prioritized epoch counts laps of
    a shard either way)."""
    from tfdata.replay.samplers.prioritized import PrioritizedSampler
    from tfdata.replay.samplers.uniform import UniformSampler
    from tfdata.shared import SharedReplayBuffer, SharedWriter

    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    data = rows(np.random.default_rng(0), 40)
    for obj, named in ((UniformSampler(7), {}),
                       (PrioritizedSampler(0.6, 0.4, 1.0, None, 1e-6, seed=7),
                        {"prioritized": True, "alpha": 0.6, "beta": 0.4})):
        with SharedReplayBuffer(SPEC, 16, num_writers=2, sampler=obj) as a, \
                SharedReplayBuffer(SPEC, 16, num_writers=2, seed=7, **named) as b:
            for buf in (a, b):
                for s, n in ((0, 5), (1, 11)):
                    with SharedWriter(buf.name, s) as w:
                        w.extend({k: v[:n] for k, v in data.items()})
            assert type(b.sampler) is type(obj)
            for _ in range(3):
                ga, gb = a.sample(6), b.sample(6)
                same_rows(ga, gb)
                if named:
                    np.testing.assert_array_equal(ga.versions, gb.versions)


def test_a_shared_buffer_runs_tfdatas_samplers_by_name_unchanged(tmp_path, monkeypatch):
    """``SharedReplayBuffer(sampler=...)`` by name holds the single-process sampler of that
    name (no shared twin), bound as a ReplayBuffer binds it."""
    from tfdata import PrioritizedReplayBuffer, ReplayBuffer
    from tfdata.shared import SharedReplayBuffer

    monkeypatch.setenv("TFDATA_SHM_DIR", str(tmp_path))
    for kw in ({}, {"sampler": "without_replacement"}, {"sampler": "exactly_k"},
               {"prioritized": True}):
        ref = (PrioritizedReplayBuffer(SPEC, 16, seed=1) if kw.get("prioritized")
               else ReplayBuffer(SPEC, 16, seed=1, **kw))
        with SharedReplayBuffer(SPEC, 16, num_writers=2, seed=1, **kw) as buf:
            assert type(buf.sampler) is type(ref.sampler)
            assert not type(buf.sampler).__name__.startswith("Shared")
