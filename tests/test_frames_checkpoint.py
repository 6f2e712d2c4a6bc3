"""Checkpoints of frame-stacked buffers: a loaded buffer continues exactly (the same batches as
the original and as the oracle that stores whole stacks), into any layout; a checkpoint is
untrusted input, so every part of ``frame_stack``, ``frame_padding`` and ``state.frames`` is
checked (FormatError naming the file and the field, nothing created or changed; the config and
the arrays before any buffer is built).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfdata
from tfdata.errors import FormatError
from tfdata.replay import frames as frames_mod

from . import naive
from .test_checkpoint_hostile import _mutate_array, _mutate_state, _normal, array_file, edit
from .test_frames import spec_of, steps_of
from .test_frames_everything import LAYOUTS, Twin
from .test_nothing_lost import snapshot
from .conftest import same_state

PAD = np.full((3, 2), 7, np.uint8)


def framed(kind: str = "plain", layout="aos", num_envs: int = 2, steps: int = 7):
    """A filled frame buffer (and its oracle) of a kind: "plain" (value padding, stats of the
    frames, wrapped), "nstep" (partly filled), "per" (prioritized, priorities updated), "wor"
    (without replacement, mid pass), "limited" (a rate limiter)."""
    kw = {}
    cls = tfdata.ReplayBuffer
    if kind == "plain":
        kw = dict(padding=PAD, frame_kw={"stats": ["obs", "reward"]})
    elif kind == "nstep":
        kw = dict(n_step=3, capacity=12 * num_envs)
    elif kind == "per":
        kw = dict(cls=tfdata.PrioritizedReplayBuffer, beta_steps=7)
    elif kind == "wor":
        kw = dict(sampler="without_replacement")
    elif kind == "limited":
        kw = dict(frame_kw={"rate_limiter": tfdata.RateLimiter(samples_per_insert=2.0,
                                                               min_size_to_sample=2,
                                                               error_buffer=100.0)})
    kw.setdefault("capacity", 4 * num_envs)
    tw = Twin(k=3, num_envs=num_envs, layout=LAYOUTS[layout], p_end=0.25, **kw)
    if kind == "limited":
        tw.b = tfdata.ReplayBuffer(tw.spec, tw.capacity, num_envs=num_envs, seed=3, layout=LAYOUTS[layout],
                                   rate_limiter=tfdata.RateLimiter(samples_per_insert=2.0,
                                                                   min_size_to_sample=2,
                                                                   error_buffer=100.0))
    tw.feed(steps)
    for _ in range(2):
        x, y = tw.a.sample(2), tw.b.sample(2)
        if kind == "per":
            tw.a.update_priorities(x, [0.5, 3.0])
            tw.b.update_priorities(y, [0.5, 3.0])
    return tw


def go_on(tw, loaded, steps: int = 6) -> None:
    """The original, the loaded buffer and the oracle give the same batches as the streams go on.

    (Write versions of a prioritized buffer are compared between the original and the oracle
    only: a load restarts their epoch at the lap boundary, frame stacks or not.)"""
    for t in range(steps):
        for f in (None, ["obs"], ["next_obs", "action"]):
            x, y = loaded.sample(2, fields=f), tw.a.sample(2, fields=f)
            tw.same(x, y, f, versions=False)
            tw.same(y, tw.b.sample(2, fields=f), f)
        if tw.a.n_step is None:
            x, y = loaded.sample_sequences(2, 2), tw.a.sample_sequences(2, 2)
            tw.same(x, y, versions=False)
            tw.same(y, tw.b.sample_sequences(2, 2))
        step = tw.steps(1)[0]
        for buf in (tw.a, tw.b, loaded):
            buf.extend(step)


@pytest.mark.parametrize("kind", ["plain", "nstep", "per", "wor", "limited"])
@pytest.mark.parametrize("layout", ["aos", "soa", "groups"])
def test_a_loaded_buffer_continues_exactly(tmp_path, kind, layout):
    tw = framed(kind, layout)
    tw.a.save(tmp_path / "ck")
    loaded = tfdata.ReplayBuffer.load(tmp_path / "ck")
    assert type(loaded) is type(tw.a) and loaded.config == tw.a.config
    assert loaded.nbytes_parts["storage"] == tw.a.nbytes_parts["storage"]
    go_on(tw, loaded)
    if kind == "plain":
        assert np.array_equal(loaded.stats("obs").mean, tw.a.stats("obs").mean)


@pytest.mark.parametrize("source,target", [("aos", "soa"), ("soa", "groups"), ("groups", "aos"),
                                           ("aos", "groups2")])
def test_load_into_another_layout(tmp_path, source, target):
    tw = framed("nstep", source, num_envs=3, steps=9)
    tw.a.save(tmp_path / "ck")
    loaded = tfdata.ReplayBuffer.load(tmp_path / "ck", layout=LAYOUTS[target])
    want = tfdata.storage.resolve_layout(LAYOUTS[target], tfdata.Spec(tw.spec))
    assert loaded.layout == want
    go_on(tw, loaded)


def test_a_checkpoint_of_an_empty_and_of_a_cleared_buffer(tmp_path):
    tw = Twin(k=4, num_envs=2, capacity=8)
    tw.a.save(tmp_path / "empty")
    tw.feed(9)  # wrapped: hist holds frames
    tw.a.clear()
    tw.a.save(tmp_path / "cleared")
    for path in ("empty", "cleared"):
        loaded = tfdata.ReplayBuffer.load(tmp_path / path)
        assert len(loaded) == 0 and loaded.state_dict()["frames"]["steps"] == 0
        fresh = Twin(k=4, num_envs=2, capacity=8)  # same seed, no sample drawn yet
        for t in range(10):
            step = fresh.steps(1)[0]
            for buf in (loaded, fresh.a, fresh.b):
                buf.extend(step)
            x = loaded.sample(2)
            fresh.same(x, fresh.a.sample(2))
            fresh.same(x, fresh.b.sample(2))


def test_spill_and_stats_given_to_load(tmp_path):
    tw = framed("plain", "aos")
    tw.a.save(tmp_path / "ck")
    loaded = tfdata.ReplayBuffer.load(tmp_path / "ck", spill_path=tmp_path / "spill", hot_rows=2,
                                      stats=["obs"])
    assert loaded.stats("obs").mean.shape == (3, 2)
    go_on(tw, loaded, 3)


# -- hostile checkpoints ------------------------------------------------------------------------
def _set(*keys_value):
    *keys, value = keys_value

    def change(ck):
        def apply(doc):
            d = doc
            for k in keys[:-1]:
                d = d[k]
            d[keys[-1]] = value

        edit(ck, apply)

    return change


def _drop(*keys):
    def change(ck):
        def apply(doc):
            d = doc
            for k in keys[:-1]:
                d = d[k]
            d.pop(keys[-1])

        edit(ck, apply)

    return change


def _array(*keys, change):
    def apply(ck):
        p = array_file(ck, *keys)
        a = np.load(p)
        os.unlink(p)
        np.save(p, change(a.copy()))

    return apply


def _at(i, v):
    def change(a):
        a.reshape(-1)[i] = v
        return a

    return change


@pytest.fixture()
def no_build(monkeypatch):
    """Counts the frame bookkeeping built (a buffer being constructed)."""
    built = []
    init = frames_mod.FrameStacks.__init__

    def counting(self, *args, **kw):
        built.append(1)
        init(self, *args, **kw)

    monkeypatch.setattr(frames_mod.FrameStacks, "__init__", counting)
    return built


def _check_all(tmp_path, cases, built, *, before_build: bool, kind="plain", layout="aos"):
    """Each case on a fresh copy of one checkpoint: FormatError naming the checkpoint and
    matching the case, nothing on disk created or changed, and (``before_build``) no buffer
    built."""
    tw = framed(kind, layout)
    ck = tmp_path / "ck"
    tw.a.save(ck)
    pristine = tmp_path / "pristine"
    shutil.copytree(ck, pristine)
    failures = []
    for change, match in cases:
        shutil.rmtree(ck)
        shutil.copytree(pristine, ck)
        change(ck)
        before = snapshot(str(tmp_path))
        built.clear()
        try:
            tfdata.ReplayBuffer.load(ck)
            failures.append(f"{match}: loaded")
        except FormatError as exc:
            if match not in str(exc) or str(ck) not in str(exc):
                failures.append(f"{match}: {exc}")
        except BaseException as exc:  # noqa: BLE001 - reported
            failures.append(f"{match}: {type(exc).__name__}: {exc}")
        if snapshot(str(tmp_path)) != before:
            failures.append(f"{match}: files changed")
        if before_build and built:
            failures.append(f"{match}: a buffer was built before the refusal")
    assert not failures, "\n".join(failures)


def test_hostile_frame_config(tmp_path, no_build):
    fs, fp = ("config", "frame_stack"), ("config", "frame_padding")
    cases = [
        (_set(*fs, {"pixels": 3}), "config.frame_stack key"),
        (_set(*fs, {"obs": 3, "pixels": 3}), "config.frame_stack key"),
        (_set(*fs, {"obs": 1}), "config.frame_stack['obs']"),
        (_set(*fs, {"obs": 65}), "config.frame_stack['obs']"),
        (_set(*fs, {"obs": 10**30}), "config.frame_stack['obs']"),
        (_set(*fs, {"obs": True}), "config.frame_stack['obs']"),
        (_set(*fs, {"obs": 3.0}), "config.frame_stack['obs']"),
        (_set(*fs, {"obs": 2}), "stack depth of field 'obs'"),  # the field is a stack of 3
        (_set(*fs, {"action": 2}), "stack depth of field 'action'"),
        (_set(*fs, {}), "config.frame_stack"),
        (_set(*fs, [["obs", 3]]), "config.frame_stack"),
        (_set(*fs, "obs"), "config.frame_stack"),
        (lambda ck: (_set(*fs, {"next_obs": 3})(ck), _set(*fp, {"next_obs": "reset"})(ck)),
         "next field"),  # the next field of obs: refused by the plan
        (_drop(*fs), "unknown ['frames']"),  # no frame_stack: no frames state
        (lambda ck: (_drop(*fs)(ck), _drop("state", "frames")(ck)), "config.frame_stack: expected present"),
        (_drop(*fp), "config.frame_padding: expected present"),
        (_set(*fp, {}), "config.frame_padding"),
        (_set(*fp, {"obs": "reset", "action": "zero"}), "config.frame_padding"),
        (_set(*fp, {"obs": "edge"}), "config.frame_padding['obs']"),
        (_set(*fp, {"obs": [[7, 7], [7, 7]]}), "config.frame_padding['obs']"),  # (2, 2), not (3, 2)
        (_set(*fp, {"obs": [[7, 7, 7]] * 3}), "config.frame_padding['obs']"),
        (_set(*fp, {"obs": [7] * 6}), "config.frame_padding['obs']"),
        (_set(*fp, {"obs": [[[7], [7]]] * 3}), "config.frame_padding['obs'] value"),
        (_set(*fp, {"obs": [[7, 256]] * 3}), "config.frame_padding['obs'] value 1"),
        (_set(*fp, {"obs": [[7, 7], [-1, 7], [7, 7]]}), "config.frame_padding['obs'] value 2"),
        (_set(*fp, {"obs": [[7, 7.0]] * 3}), "config.frame_padding['obs'] value 1"),
        (_set(*fp, {"obs": [[True, 7]] * 3}), "config.frame_padding['obs'] value 0"),
        (_set(*fp, {"obs": [[7, "7"]] * 3}), "config.frame_padding['obs'] value 1"),
        (_set(*fp, {"obs": [[7, None]] * 3}), "config.frame_padding['obs'] value 1"),
        (_set(*fp, {"obs": {"$array": "arrays/frames.depth.npy"}}), "config.frame_padding['obs']"),
        (_set(*fp, {"obs": json.loads("[" * 200 + "]" * 200)}), "config.frame_padding['obs']"),
        (_set("config", "sampler", "exactly_k"), "config"),
    ]
    _check_all(tmp_path, cases, no_build, before_build=True)


def test_hostile_float_padding(tmp_path, no_build):
    spec = spec_of(3, dtype="f2")
    buf = tfdata.ReplayBuffer(spec, 6, frame_stack=3, frame_padding=np.full((3, 2), 0.5, np.float16))
    buf.save(tmp_path / "ck")
    no_build.clear()
    for bad, match in (([[0.5, 1e6]] * 3, "value 1"), ([[0.5, 1]] * 3, "value 1"),
                       ([[0.5, False]] * 3, "value 1")):
        edit(tmp_path / "ck", lambda d: d["config"]["frame_padding"].__setitem__("obs", bad))
        with pytest.raises(FormatError, match=f"frame_padding\\['obs'\\] {match}: expected finite floats"):
            tfdata.ReplayBuffer.load(tmp_path / "ck")
    assert not no_build
    # NaN and Infinity are not JSON: refused by the parser
    p = tmp_path / "ck" / "state.json"
    text = p.read_text()
    p.write_text(text.replace('"frame_padding": {"obs": [[0.5, false]', '"frame_padding": {"obs": [[0.5, NaN]'))
    with pytest.raises(FormatError, match="not valid JSON|NaN"):
        tfdata.ReplayBuffer.load(tmp_path / "ck")


def test_hostile_frames_state_before_any_buffer_is_built(tmp_path, no_build):
    f = ("state", "frames")
    cases = [
        (_drop(*f), "state"),
        (_set(*f, None), "state.frames"),
        (_set(*f, "extra", 1), "state.frames"),
        (_drop(*f, "hist"), "state.frames"),
        (_set(*f, "stacks", {"obs": 4}), "state.frames.stacks"),
        (_set(*f, "stacks", {"obs": 3.0}), "state.frames.stacks"),
        (_set(*f, "stacks", {"obs": True}), "state.frames.stacks"),
        (_set(*f, "steps", -1), "state.frames.steps"),
        (_set(*f, "steps", 2**62), "state.frames.steps"),
        (_set(*f, "steps", 10**39), "state.frames.steps"),
        (_set(*f, "steps", 2.0), "state.frames.steps"),
        (_set(*f, "steps", True), "state.frames.steps"),
        (_set(*f, "steps", 3), "state.frames.steps"),  # 8 rows of 2 streams held: at least 4
        (_set(*f, "steps", 8), "state.frames.steps"),  # 7 steps: cursor 6; 8 would end at 0
        (_set(*f, "steps", 9), "state.frames.steps"),
        (_array(*f[1:], "depth", change=_at(5, 3)), "state.frames.depth[5]"),  # K - 1 = 2
        (_array(*f[1:], "depth", change=_at(0, 255)), "state.frames.depth[0]"),
        (_array(*f[1:], "depth", change=lambda a: a[:-1]), "state.frames.depth"),
        (_array(*f[1:], "depth", change=lambda a: a.astype(np.int64)), "state.frames.depth"),
        (_array(*f[1:], "depth", change=lambda a: np.zeros(10**6, np.uint8)), "state.frames.depth"),
        (_array(*f[1:], "prev", change=_at(1, -2)), "state.frames.prev[1]"),
        (_array(*f[1:], "prev", change=_at(0, 3)), "state.frames.prev[0]"),
        (_array(*f[1:], "prev", change=_at(0, 32767)), "state.frames.prev[0]"),
        (_array(*f[1:], "prev", change=lambda a: a.astype(np.int32)), "state.frames.prev"),
        (_array(*f[1:], "prev", change=lambda a: np.zeros(3, np.int16)), "state.frames.prev"),
        (_array(*f[1:], "hist", "obs", change=lambda a: a[:, :1]), "state.frames.hist['obs']"),
        (_array(*f[1:], "hist", "obs", change=lambda a: np.zeros((3, 2, 3, 2), np.uint8)),
         "state.frames.hist['obs']"),
        (_array(*f[1:], "hist", "obs", change=lambda a: a.reshape(2, 2, 6)), "state.frames.hist['obs']"),
        (_array(*f[1:], "hist", "obs", change=lambda a: a.astype(np.int8)), "state.frames.hist['obs']"),
        (_set(*f, "hist", {}), "state.frames.hist"),
        (_set(*f, "hist", {"obs": {"$array": "arrays/../../x.npy"}}), "arrays/"),
        (_set(*f, "depth", {"$array": "/etc/passwd"}), "arrays/"),
        # the stats of a stacked field are of its frames: shape (3, 2), not the stack's
        (_array("stats", "obs", "mean", change=lambda a: np.zeros((3, 3, 2))), "state.stats['obs'].mean"),
    ]
    _check_all(tmp_path, cases, no_build, before_build=True)


def test_hostile_frames_state_against_the_rows(tmp_path, no_build):
    """Depths and prev that the rows' episode ends do not give: refused once the rows are in
    memory (as the episode numbers are), the buffer dropped, nothing on disk changed."""
    f = ("frames",)
    tw = framed("plain", "aos")
    st = tw.a.state_dict()
    term = st["data"]["terminated"] | st["data"]["truncated"]
    cursor = st["writer"]["cursor"]
    assert frames_mod.depth_break(st["frames"]["depth"], st["data"]["terminated"],
                                  st["data"]["truncated"], st["frames"]["prev"], cursor, 8, 2, 8,
                                  st["frames"]["steps"], 2) is None
    # a row right after an episode end has depth 0; raise it; one not after an end: change it
    order = [(cursor + i) % 8 for i in range(8)]
    after_end = next(order[i] for i in range(2, 8) if term[order[i - 2]])
    mid = next(order[i] for i in range(2, 8) if not term[order[i - 2]])
    d = st["frames"]["depth"]
    cases = [
        (_array(*f, "depth", change=_at(after_end, 1)), f"state.frames.depth[{after_end}]"),
        (_array(*f, "depth", change=_at(mid, (int(d[mid]) + 1) % 3)), "state.frames.depth["),
        (_array(*f, "prev", change=lambda a: np.where(a == -1, 0, -1).astype(np.int16)),
         "state.frames.prev["),
    ]
    _check_all(tmp_path, cases, no_build, before_build=False)


def test_the_oldest_rows_depth_is_bounded_by_its_step(tmp_path):
    """Before the ring wraps, row t of a stream has at most t steps before it (the stream
    started at the buffer's first row): a larger depth would reach frames never written."""
    tw = Twin(k=4, num_envs=1, capacity=8, p_end=0.0)
    tw.feed(3)
    tw.a.save(tmp_path / "ck")
    _array("frames", "depth", change=lambda a: np.array([1, 2, 3], np.uint8))(tmp_path / "ck")
    with pytest.raises(FormatError, match=r"state.frames.depth\[0\]"):
        tfdata.ReplayBuffer.load(tmp_path / "ck")



@pytest.mark.parametrize("num_envs", [1, 3])
def test_steps_must_end_at_the_writers_cursor(tmp_path, num_envs):
    """Issue 30: ``state.frames.steps`` edited from 45 to 46 with the cursor unchanged loaded,
    and the stacks that read ``hist`` (indexed by step) were wrong. The steps written must
    end at the writer's cursor: ``cursor == steps * num_envs % capacity``."""
    tw = Twin(k=4, num_envs=num_envs, capacity=16 * num_envs, p_end=0.1)
    tw.feed(45)
    st = tw.a.state_dict()
    assert st["frames"]["steps"] == 45 and st["writer"]["cursor"] == 45 * num_envs % (16 * num_envs)
    tw.a.save(tmp_path / "ck")
    for steps in (46, 44, 47):
        edit(tmp_path / "ck", lambda d: d["state"]["frames"].__setitem__("steps", steps))
        with pytest.raises(FormatError, match=r"state\.frames\.steps: expected a count of steps "
                                              r"whose rows end at the writer's cursor"):
            tfdata.ReplayBuffer.load(tmp_path / "ck")
        bad = tw.a.state_dict()
        bad["frames"]["steps"] = steps
        other = Twin(k=4, num_envs=num_envs, capacity=16 * num_envs, p_end=0.1, env_seed=1)
        other.feed(20)
        before = other.a.state_dict()
        with pytest.raises(ValueError, match=f"state frames.steps {steps}: .*cursor"):
            other.a.load_state_dict(bad)
        same_state(before, other.a.state_dict())
    edit(tmp_path / "ck", lambda d: d["state"]["frames"].__setitem__("steps", 45))
    go_on(tw, tfdata.ReplayBuffer.load(tmp_path / "ck"))


def test_frame_counters_against_the_writer_in_a_state_dict():
    """A state dict (trusted less than a checkpoint's rows check, more than nothing): each
    depth at most its row's step number, each stream's ``prev`` its newest row's depth, or -1
    exactly when that row ended an episode; refused naming the entry, nothing changed."""
    tw = Twin(k=4, num_envs=2, capacity=12, p_end=0.3)
    tw.feed(4)  # 8 of 12 rows: row t of a stream has step number t
    good = tw.a.state_dict()
    fr, data = good["frames"], good["data"]
    newest = [(good["writer"]["cursor"] - 2 + e) % 12 for e in range(2)]
    ended = [bool(data["terminated"][s] | data["truncated"][s]) for s in newest]

    def bad_prev(e):
        p = fr["prev"].copy()
        p[e] = 0 if ended[e] else -1  # (the newest row's depth when it did not end: not -1)
        return p

    cases = [(("depth", np.where(np.arange(8) == 2, 2, fr["depth"]).astype(np.uint8)), "frames.depth[2] = 2"),
             (("prev", bad_prev(0)), "frames.prev[0]"), (("prev", bad_prev(1)), "frames.prev[1]")]
    for (key, value), match in cases:
        state = tw.a.state_dict()
        state["frames"][key] = value
        other = Twin(k=4, num_envs=2, capacity=12, p_end=0.3, env_seed=2)
        other.feed(7)
        before = other.a.state_dict()
        with pytest.raises(ValueError, match=match.replace("[", "\\[")):
            other.a.load_state_dict(state)
        same_state(before, other.a.state_dict())
    empty = Twin(k=4, num_envs=2, capacity=12).a
    state = empty.state_dict()
    state["frames"]["prev"] = np.array([-1, 1], np.int16)
    with pytest.raises(ValueError, match=r"frames.prev\[1\] = 1: expected -1 \(no row held\)"):
        tw.a.load_state_dict(state)
    tw.a.load_state_dict(good)


def test_rows_file_of_the_wrong_layout(tmp_path):
    """A frame buffer stores its frames as a column: an "aos" buffer's rows are a grouped
    directory, and a checkpoint that names rows.npy is refused."""
    tw = framed("plain", "aos")
    tw.a.save(tmp_path / "ck")
    edit(tmp_path / "ck", lambda d: d.__setitem__("rows", "rows.npy"))
    with pytest.raises(FormatError, match=r"rows: expected rows \(layout 'aos', frames stored as a column\)"):
        tfdata.ReplayBuffer.load(tmp_path / "ck")


# -- fuzzing ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pristine_frames(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine-frames")
    out = {}
    for kind, layout in (("plain", "soa"), ("nstep", "aos")):
        tw = framed(kind, layout)
        ck = root / f"{kind}-{layout}"
        tw.a.save(ck)
        out[(kind, layout)] = ck
    return out


@settings(max_examples=int(os.environ.get("TFDATA_FUZZ_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_frame_checkpoints_load_faithfully_or_raise_format_error(pristine_frames, data):
    """As tests/test_checkpoint_hostile.py fuzzes other checkpoints: a mutated frame checkpoint
    loads into a buffer that saves back to exactly what the files say, or raises FormatError;
    nothing on disk changes."""
    which = data.draw(st.sampled_from(sorted(pristine_frames)))
    root = tempfile.mkdtemp(prefix="ckfuzz-frames-")
    try:
        sentinel = os.path.join(root, "sentinel.bin")
        with open(sentinel, "wb") as f:
            f.write(bytes(range(256)))
        ck = os.path.join(root, "ck")
        shutil.copytree(pristine_frames[which], ck)
        with open(os.path.join(ck, "state.json")) as f:
            doc = json.load(f)
        arrays = sorted(os.listdir(os.path.join(ck, "arrays")))
        frames_arrays = [a for a in arrays if a.startswith("frames.")]
        for _ in range(data.draw(st.integers(1, 2))):
            pick = data.draw(st.integers(0, 3))
            if pick == 0:
                _mutate_array(data, os.path.join(ck, "arrays", data.draw(st.sampled_from(frames_arrays))),
                              sentinel)
            elif pick == 1:
                _mutate_array(data, os.path.join(ck, "arrays", data.draw(st.sampled_from(arrays))),
                              sentinel)
            else:
                # a first mutation may have deleted or replaced what a second would pick
                state = doc.get("state") if isinstance(doc, dict) else None
                subs = [state.get("frames") if isinstance(state, dict) else None,
                        doc.get("config") if isinstance(doc, dict) else None, doc]
                sub = data.draw(st.sampled_from([x for x in subs if isinstance(x, dict) and x]))
                _mutate_state(data, sub, sentinel)
        with open(os.path.join(ck, "state.json"), "w") as f:
            json.dump(doc, f)
        before = snapshot(root)
        try:
            buf = tfdata.ReplayBuffer.load(ck)
        except FormatError:
            buf = None
        assert snapshot(root) == before
        if buf is not None:
            again = os.path.join(tempfile.mkdtemp(prefix="ckfuzz-frames-again-"), "ck")
            try:
                buf.save(again)
                assert _normal(again) == _normal(ck)
                buf.sample(1)
            finally:
                shutil.rmtree(os.path.dirname(again))
    finally:
        shutil.rmtree(root)
