"""Checkpoints under careless and hostile use: saving never destroys what is not a checkpoint,
and a checkpoint is untrusted input (every field checked, no link followed, no file outside it
written, no allocation it does not justify).

Each test here failed on the code before the rules of :mod:`tfdata.checkpoint` were adopted.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfdata
from tfdata.errors import FormatError

from .conftest import CARTPOLE
from .test_checkpoint import Streams
from .test_nothing_lost import snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOFLAGS = {"x": "i8", "y": ("f4", (2,))}


def filled(kind: str, layout: str = "aos"):
    """A small buffer with rows, a moved RNG and (prioritized) a moved beta schedule."""
    rng = np.random.default_rng(2)  # episode ends in the rows held, one in the newest step
    if kind == "per":  # wrapped ring, two streams, elided next fields, n-step, statistics
        buf = tfdata.PrioritizedReplayBuffer(CARTPOLE, 8, layout=layout, seed=3, elide_next=True,
                                             num_envs=2, n_step=2, beta_steps=5,
                                             stats=["obs", "reward"])
        for s in Streams(rng, 2).take(7):
            buf.extend(s)
    elif kind == "nstep":  # partly filled
        buf = tfdata.ReplayBuffer(CARTPOLE, 10, layout=layout, seed=4, n_step=3)
        for s in Streams(rng, 1).take(6):
            buf.extend(s)
    else:  # no episode bookkeeping
        buf = tfdata.ReplayBuffer(NOFLAGS, 6, layout=layout, seed=5)
        buf.extend({"x": np.arange(4), "y": rng.random((4, 2)).astype(np.float32)})
    buf.sample(2)
    return buf


def checkpoint(tmp_path, kind: str = "per", layout: str = "aos", name: str = "ck"):
    buf = filled(kind, layout)
    path = tmp_path / name
    buf.save(path)
    return path, buf


def edit(ck, change) -> None:
    p = os.path.join(ck, "state.json")
    with open(p) as f:
        doc = json.load(f)
    change(doc)
    with open(p, "w") as f:
        json.dump(doc, f)


def array_file(ck, *keys) -> str:
    with open(os.path.join(ck, "state.json")) as f:
        ref = json.load(f)["state"]
    for k in keys:
        ref = ref[k]
    return os.path.join(ck, ref["$array"])


def same_state(a, b) -> None:
    sa, sb = a.state_dict(), b.state_dict()

    def eq(x, y, where):
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), where
        elif isinstance(x, dict):
            assert x.keys() == y.keys(), where
            for k in x:
                eq(x[k], y[k], f"{where}.{k}")
        else:
            assert x == y, where

    eq(sa, sb, "state")


# -- saving: nothing that is not a checkpoint is replaced ---------------------------------------


def test_save_refuses_a_project_directory_and_leaves_it_byte_for_byte(tmp_path):
    proj = tmp_path / "proj"
    (proj / "src").mkdir(parents=True)
    (proj / "src" / "main.py").write_text("print('my work')\n")
    (proj / "README.md").write_text("# notes\n")
    np.save(proj / "data.npy", np.arange(10))
    # even a directory with a checkpoint's state.json, as long as it holds anything else
    lookalike = tmp_path / "lookalike"
    checkpoint(tmp_path, "nstep", name="lookalike")
    (lookalike / "notes.txt").write_text("mine")
    buf = filled("nstep")
    before = snapshot(tmp_path)
    for target in (proj, lookalike):
        with pytest.raises(FileExistsError):
            buf.save(target)
        with pytest.raises(FileExistsError, match="not a tfdata checkpoint"):
            buf.save(target, overwrite=True)
    assert snapshot(tmp_path) == before


def test_save_refuses_a_file_and_a_link(tmp_path):
    (tmp_path / "ck").write_bytes(b"precious bytes")
    real, _ = checkpoint(tmp_path, "nstep", name="real")
    os.symlink(real, tmp_path / "link")  # a link to a checkpoint is not a checkpoint directory
    buf = filled("nstep")
    before = snapshot(tmp_path)
    for target in ("ck", "link"):
        with pytest.raises(FileExistsError):
            buf.save(tmp_path / target)
        with pytest.raises(FileExistsError):
            buf.save(tmp_path / target, overwrite=True)
    assert snapshot(tmp_path) == before


def test_save_over_a_checkpoint_needs_overwrite(tmp_path, layout):
    ck, old = checkpoint(tmp_path, "per", layout)
    before = snapshot(tmp_path)
    buf = filled("nstep", layout)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        buf.save(ck)
    assert snapshot(tmp_path) == before
    same_state(tfdata.ReplayBuffer.load(ck), old)
    buf.save(ck, overwrite=True)
    same_state(tfdata.ReplayBuffer.load(ck), buf)
    assert sorted(os.listdir(tmp_path)) == ["ck"]  # no temporary or old copy left beside it


def test_user_directories_named_like_the_old_temporaries_survive(tmp_path):
    for name in ("ck.tmp-checkpoint", "ck.old-checkpoint"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "thesis.tex").write_text(f"{name}: years of work")
    before = snapshot(tmp_path)
    buf = filled("nstep")
    buf.save(tmp_path / "ck")
    buf.save(tmp_path / "ck", overwrite=True)
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("ck" + os.sep) and k != "ck"} == before


def _fail_writer(monkeypatch):
    def boom(self, *a, **k):
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(tfdata.io.Writer, "append", boom)
    monkeypatch.setattr(tfdata.io.Writer, "append_records", boom)


def _fail_state(monkeypatch):
    real = json.dumps

    def boom(obj, *a, **k):
        if isinstance(obj, dict) and obj.get("format") == "tfdata.checkpoint":
            raise ValueError("injected")
        return real(obj, *a, **k)

    monkeypatch.setattr(json, "dumps", boom)
    real_dump = json.dump

    def boom_dump(obj, *a, **k):
        if isinstance(obj, dict) and obj.get("format") == "tfdata.checkpoint":
            raise ValueError("injected")
        return real_dump(obj, *a, **k)

    monkeypatch.setattr(json, "dump", boom_dump)


def _fail_publish(ck):
    def install(monkeypatch):
        real = os.rename
        calls = []

        def rename(src, dst, *a, **k):
            # the first rename onto the checkpoint's name is the new one moving in
            if os.fspath(dst) == os.fspath(ck) and not calls:
                calls.append(src)
                raise OSError(5, "Input/output error (injected)")
            return real(src, dst, *a, **k)

        monkeypatch.setattr(os, "rename", rename)

    return install


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_a_failed_save_leaves_the_old_checkpoint_and_nothing_else(tmp_path, layout):
    ck, old = checkpoint(tmp_path, "per", layout)
    buf = filled("nstep", layout)
    before = snapshot(tmp_path)
    for fail in (_fail_writer, _fail_state, _fail_publish(ck)):
        with pytest.MonkeyPatch.context() as mp:
            fail(mp)
            with pytest.raises((OSError, ValueError)):
                buf.save(ck, overwrite=True)
        assert snapshot(tmp_path) == before, fail
    same_state(tfdata.ReplayBuffer.load(ck), old)
    # a failure with nothing at the path leaves nothing there
    with pytest.MonkeyPatch.context() as mp:
        _fail_publish(tmp_path / "new")(mp)
        with pytest.raises(OSError):
            buf.save(tmp_path / "new")
    assert snapshot(tmp_path) == before


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd")
def test_save_flushes_every_file_and_the_directory_after_the_rename(tmp_path, monkeypatch):
    ck, _ = checkpoint(tmp_path, "per", "soa")
    buf = filled("per", "soa")
    events = []
    real_fsync, real_fdatasync, real_rename = os.fsync, os.fdatasync, os.rename

    def record(kind, real):
        def call(fd):
            st_ = os.fstat(fd)
            events.append((kind, st_.st_ino))
            return real(fd)
        return call

    def rename(src, dst, *a, **k):
        real_rename(src, dst, *a, **k)
        events.append(("rename", os.fspath(dst)))

    monkeypatch.setattr(os, "fsync", record("sync", real_fsync))
    monkeypatch.setattr(os, "fdatasync", record("sync", real_fdatasync))
    monkeypatch.setattr(os, "rename", rename)
    buf.save(ck, overwrite=True)
    synced = {ino for kind, ino in events if kind == "sync"}
    for dirpath, _, files in os.walk(ck):
        for name in files:
            assert os.stat(os.path.join(dirpath, name)).st_ino in synced, name  # data durable
    into_place = max(i for i, e in enumerate(events) if e == ("rename", os.fspath(ck)))
    parent = os.stat(tmp_path).st_ino
    assert ("sync", parent) in events[into_place:]  # the rename itself is durable


def test_field_names_that_are_not_file_names_round_trip(tmp_path):
    # array files were named after fields; such a checkpoint was then refused by load
    spec = {"obs é": ("f4", (2,)), "next_obs é": ("f4", (2,)), "terminated": "?", "truncated": "?"}
    buf = tfdata.ReplayBuffer(spec, 8, layout="aos", seed=0, elide_next=True)
    obs = np.arange(12, dtype=np.float32).reshape(6, 2)
    buf.extend({"obs é": obs[:-1], "next_obs é": obs[1:], "terminated": np.zeros(5, bool),
                "truncated": np.arange(5) == 4})
    buf.save(tmp_path / "ck")
    same_state(tfdata.ReplayBuffer.load(tmp_path / "ck"), buf)
    assert sorted(os.listdir(tmp_path)) == ["ck"]


# -- loading: nothing is written, nothing large is allocated ------------------------------------


def test_a_config_naming_a_spill_file_is_refused_and_the_file_survives(tmp_path):
    sentinel = tmp_path / "sentinel.bin"
    sentinel.write_bytes(bytes(range(256)) * 64)
    ck, _ = checkpoint(tmp_path, "nstep")
    for extra in ({"spill_path": str(sentinel), "hot_rows": 2},
                  {"spill_path": "../sentinel.bin", "hot_bytes": 64},
                  {"memory_budget": 1 << 40}, {"allocator": "numpy"}, {"seed": 1}):
        edit(ck, lambda d: d["config"].update(extra))
        before = snapshot(tmp_path)
        with pytest.raises(FormatError, match="config"):
            tfdata.ReplayBuffer.load(ck)
        assert snapshot(tmp_path) == before
        edit(ck, lambda d: [d["config"].pop(k) for k in extra])
    assert sentinel.read_bytes() == bytes(range(256)) * 64
    assert len(tfdata.ReplayBuffer.load(ck)) == 6


def test_a_huge_ring_size_is_refused(tmp_path):
    ck, _ = checkpoint(tmp_path, "nstep")
    for bad in (65, 10**6, 2**62):
        edit(ck, lambda d: d["config"].update(ring_size=bad))
        with pytest.raises(FormatError, match="ring_size"):
            tfdata.ReplayBuffer.load(ck)
    edit(ck, lambda d: d["config"].update(ring_size=64))  # the bound itself is accepted
    assert tfdata.ReplayBuffer.load(ck).ring_size == 64


def test_a_huge_capacity_is_refused_before_any_allocation(tmp_path):
    ck, _ = checkpoint(tmp_path, "noflags")
    cap = 2**32 - 1
    edit(ck, lambda d: (d["config"].update(capacity=cap), d["state"].update(capacity=cap)))
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match=f"capacity {cap}.*bytes"):
            tfdata.ReplayBuffer.load(ck)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak
    # a capacity that fits the machine but not the caller's memory_budget: the caller's limit
    cap = 10**6
    edit(ck, lambda d: (d["config"].update(capacity=cap), d["state"].update(capacity=cap)))
    with pytest.raises(tfdata.MemoryBudgetError):
        tfdata.ReplayBuffer.load(ck, memory_budget="1MB")
    assert tfdata.ReplayBuffer.load(ck).capacity == cap


# -- links and special files ----------------------------------------------------------------


def _targets(kind: str, layout: str):
    """(name inside the checkpoint, is a directory) of every file and directory load reads."""
    out = [("state.json", False), ("arrays", True), (("arrays", "episodes", "episode"), False)]
    if layout == "aos":
        out.append(("rows.npy", False))
    else:
        out += [("rows", True), ("rows/obs.npy", False), ("rows/manifest.json", False)]
    return out


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_links_in_a_checkpoint_are_refused(tmp_path, layout):
    ck, _ = checkpoint(tmp_path, "per", layout)
    outside = tmp_path / "outside"
    shutil.copytree(ck, outside)  # valid content: a reader that follows the link loads it
    failures = []
    for name, _ in _targets("per", layout):
        p = array_file(ck, *name[1:]) if isinstance(name, tuple) else os.path.join(ck, name)
        rel = os.path.relpath(p, ck)
        moved = p + ".moved"
        os.rename(p, moved)
        os.symlink(os.path.join(outside, rel), p)
        try:
            tfdata.ReplayBuffer.load(ck)
            failures.append(f"{rel}: loaded through a link")
        except FormatError as exc:
            if "link" not in str(exc):
                failures.append(f"{rel}: {exc}")
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(f"{rel}: {type(exc).__name__}: {exc}")
        os.unlink(p)
        os.rename(moved, p)
    assert not failures, failures
    assert len(tfdata.ReplayBuffer.load(ck)) == 8


_FIFO_PROBE = """
import sys
import tfdata
from tfdata.errors import FormatError
try:
    tfdata.ReplayBuffer.load(sys.argv[1])
except FormatError as exc:
    print("FormatError", exc)
    sys.exit(0)
except BaseException as exc:
    print(type(exc).__name__, exc)
    sys.exit(2)
print("loaded")
sys.exit(3)
"""


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_fifos_in_a_checkpoint_are_refused_without_blocking(tmp_path, layout):
    # in a subprocess: opening a FIFO blocks until a writer appears, for ever
    ck, _ = checkpoint(tmp_path, "per", layout)
    failures = []
    for name, is_dir in _targets("per", layout):
        if is_dir:
            continue
        p = array_file(ck, *name[1:]) if isinstance(name, tuple) else os.path.join(ck, name)
        moved = p + ".moved"
        os.rename(p, moved)
        os.mkfifo(p)
        try:
            out = subprocess.run([sys.executable, "-c", _FIFO_PROBE, str(ck)], capture_output=True,
                                 text=True, timeout=60, cwd=ROOT,
                                 env={**os.environ, "PYTHONPATH": ROOT})
            if out.returncode != 0:
                failures.append(f"{name}: {out.stdout.strip()} {out.stderr.strip()[-300:]}")
        except subprocess.TimeoutExpired:
            failures.append(f"{name}: load blocked on the FIFO")
        os.unlink(p)
        os.rename(moved, p)
    assert not failures, failures


# -- state.json: nesting, types and ranges ------------------------------------------------------


def test_deeply_nested_or_huge_json_is_a_format_error(tmp_path):
    ck, _ = checkpoint(tmp_path, "nstep")
    with open(os.path.join(ck, "state.json")) as f:
        text = f.read()
    p = os.path.join(ck, "state.json")
    cases = {
        "deep": '{"format": "tfdata.checkpoint", "config": ' + "[" * 200_000 + "]" * 200_000 + "}",
        "deep-object": '{"format": "tfdata.checkpoint", "x": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}",
        "nested-capacity": text.replace('"capacity": 10,', '"capacity": ' + "[" * 500 + "]" * 500 + ",", 1),
        "huge-int": text.replace('"capacity": 10,', '"capacity": 1' + "0" * 5000 + ",", 1),
        "nan": text.replace('"gamma": 0.99', '"gamma": NaN', 1),
    }
    failures = []
    for name, body in cases.items():
        with open(p, "w") as f:
            f.write(body)
        try:
            tfdata.ReplayBuffer.load(ck)
            failures.append(f"{name}: loaded")
        except FormatError:
            pass
        except BaseException as exc:  # noqa: BLE001 - RecursionError, ValueError: reported
            failures.append(f"{name}: {type(exc).__name__}")
    assert not failures, failures


def _set(*path_value):
    *keys, value = path_value

    def change(d):
        for k in keys[:-1]:
            d = d[k]
        d[keys[-1]] = value

    return change


def _check_all(tmp_path, kind, cases, layout="aos"):
    """Load a copy of the checkpoint once per case; every case must be a FormatError matching its
    pattern (failures collected, so one run shows them all)."""
    ck, buf = checkpoint(tmp_path, kind, layout)
    pristine = tmp_path / "pristine"
    shutil.copytree(ck, pristine)
    failures = []
    for change, match in cases:
        shutil.rmtree(ck)
        shutil.copytree(pristine, ck)
        change(ck)
        try:
            tfdata.ReplayBuffer.load(ck)
            failures.append(f"{match}: loaded")
        except FormatError as exc:
            if match not in str(exc) or str(ck) not in str(exc):
                failures.append(f"{match}: {exc}")
        except BaseException as exc:  # noqa: BLE001 - reported
            failures.append(f"{match}: {type(exc).__name__}: {exc}")
    assert not failures, "\n".join(failures)


def _state(*path_value):
    return lambda ck: edit(ck, _set(*path_value))


def test_out_of_range_writer_sampler_and_prioritized_values(tmp_path):
    cases = [
        (_state("state", "writer", "cursor", 10**30), "writer.cursor"),
        (_state("state", "writer", "cursor", -2), "writer.cursor"),
        (_state("state", "writer", "cursor", 1), "writer.cursor"),  # not a multiple of num_envs
        (_state("state", "writer", "cursor", "4"), "writer.cursor"),
        (_state("state", "writer", "size", 9), "writer.size"),
        (_state("state", "writer", "size", True), "writer.size"),
        (_state("state", "sampler", "counter", 2**64), "sampler.counter"),
        (_state("state", "sampler", "counter", -1), "sampler.counter"),
        (_state("state", "sampler", "counter", 1.5), "sampler.counter"),
        (_state("state", "sampler", "seed", [3]), "sampler.seed"),
        (_state("state", "sampler", "seed", None), "sampler.seed"),
        (_state("state", "prioritized", "samples", -1), "prioritized.samples"),
        (_state("state", "prioritized", "samples", False), "prioritized.samples"),
        (_state("state", "prioritized", "alpha", 0.5), "prioritized.alpha"),
        (_state("state", "writer", "extra", 1), "writer"),
        (_state("state", "sampler", {"seed": 1}), "sampler"),
    ]
    _check_all(tmp_path, "per", cases)


def test_out_of_range_config_and_spec(tmp_path):
    cases = [
        (_state("config", "capacity", True), "config.capacity"),
        (_state("config", "num_envs", 3), "config.num_envs"),
        (_state("config", "gamma", 2.0), "config.gamma"),
        (_state("config", "gamma", 1), "config.gamma"),
        (_state("config", "n_step", 0), "config.n_step"),
        (_state("config", "elide_next", 1), "config.elide_next"),
        (_state("config", "alpha", -1.0), "config.alpha"),
        (_state("config", "eps", 0.0), "config.eps"),
        (_state("config", "beta_steps", 0), "config.beta_steps"),
        (_state("config", "layout", "../soa"), "config.layout"),
        (_state("config", "next_of", {"next_obs": "../etc/passwd"}), "config.next_of"),
        (_state("config", "roles", {"reward": "nope"}), "config.roles"),
        (_state("config", "roles", {"evil": "obs"}), "config.roles"),
        (_state("config", "whatever", 1), "config"),
        (_state("state", "capacity", 16), "state.capacity"),
        (_state("state", "spec", "fields", 0, "dtype", "|O"), "dtype"),
        (_state("state", "spec", "fields", 0, "dtype", "<U10"), "dtype"),
        (_state("state", "spec", "fields", 0, "shape", [2**40]), "shape"),
        (_state("state", "spec", "fields", 0, "shape", [1] * 33), "shape"),
        (_state("state", "spec", "fields", 0, "name", ""), "name"),
        (_state("class", "PrioritizedReplayBuffer "), "class"),
    ]
    _check_all(tmp_path, "per", cases)


def _array(*keys, change):
    def apply(ck):
        p = array_file(ck, *keys)
        a = np.load(p)
        os.unlink(p)
        np.save(p, change(a.copy()))

    return apply


def _at(i, v):
    def change(a):
        a[i] = v
        return a

    return change


def test_bad_priorities_episode_numbers_and_bookkeeping_arrays(tmp_path):
    pri, ep = ("prioritized",), ("episodes",)
    cases = [
        (_array(*pri, "leaves", change=_at(0, np.nan)), "leaves"),
        (_array(*pri, "leaves", change=_at(1, np.inf)), "leaves"),
        (_array(*pri, "leaves", change=_at(2, 0.0)), "leaves"),
        (_array(*pri, "leaves", change=_at(3, -1.0)), "leaves"),
        (_array(*pri, "leaves", change=_at(3, 1e308)), "leaves"),
        (_array(*pri, "leaves", change=lambda a: a.astype(np.float32)), "leaves"),
        (_array(*pri, "versions", change=lambda a: a[:-1]), "versions"),
        (_array(*pri, "versions", change=lambda a: a.astype(np.int64)), "versions"),
        # another epoch in one slot: a sampler keeps one epoch, so it would save back otherwise
        (_array(*pri, "versions", change=_at(0, 0)), "versions"),
        (_array(*pri, "versions", change=_at(5, 1 << 40)), "versions"),
        (_array(*ep, "episode", change=lambda a: a + np.uint32(1) * (np.arange(a.size) == 3)), "episode"),
        (_array(*ep, "current", change=lambda a: a + np.uint32(5)), "current"),
        (_array(*ep, "final_slots", change=lambda a: np.arange(9)), "final_slots"),  # > size
        (_array(*ep, "final_slots", change=lambda a: a - 1), "final_slots"),
        (_array(*ep, "final_slots", change=lambda a: a[::-1].copy()), "final_slots"),
        (_array(*ep, "has_pending", change=lambda a: ~a), "has_pending"),
        (_array(*ep, "episode", change=lambda a: np.zeros((10**6,), np.uint32)), "episode"),
        (_state("state", "episodes", "episode", {"$array": "arrays/../../outside.npy"}), "arrays/"),
        (_state("state", "episodes", "episode", {"$array": "/etc/passwd"}), "arrays/"),
    ]
    _check_all(tmp_path, "per", cases)


# -- fuzzing: every key at every depth, and the arrays ------------------------------------------


_EDGE = st.sampled_from([None, True, False, 0, -1, 1, 2**31, 2**32, 2**63, 2**64, -(2**63), 10**30,
                         0.0, -0.0, 1.5, 1e308, float("nan"), float("inf"), "", "../../sentinel.bin",
                         "/etc/passwd", "arrays/../state.json", "aos", "soa", "rows", "rows.npy",
                         [], {}, [1, 2], {"$array": "arrays/x.npy"},
                         {"$array": "arrays/../../sentinel.bin"}])
_VALUES = st.one_of(_EDGE, st.integers(), st.floats(allow_nan=True), st.text(max_size=20),
                    st.integers(1, 400).map(lambda n: json.loads("[" * n + "]" * n)))
_KEYS = st.sampled_from(["spill_path", "hot_rows", "hot_bytes", "memory_budget", "allocator",
                         "$array", "x", "format", "fields", "capacity"])


def _paths(doc) -> list:
    """Every (container path, key) in ``doc``."""
    out, stack = [], [((), doc)]
    while stack:
        where, obj = stack.pop()
        items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
        for k, v in items:
            out.append((where, k))
            stack.append((where + (k,), v))
    return sorted(out, key=repr)


def _mutate_state(data, doc, sentinel):
    where, key = data.draw(st.sampled_from(_paths(doc)))
    obj = doc
    for k in where:
        obj = obj[k]
    action = data.draw(st.sampled_from(["set", "set", "set", "delete", "add"]))
    # a copy: sampled lists and objects are shared between examples (and must not nest in
    # themselves)
    value = copy.deepcopy(data.draw(st.one_of(_VALUES, st.just(sentinel))))
    if action == "delete":
        obj.pop(key)
    elif action == "add" and isinstance(obj, dict):
        obj[data.draw(_KEYS)] = value
    else:
        obj[key] = value


def _mutate_array(data, path, sentinel):
    try:  # a file already mutated may no longer be an array
        if os.path.islink(path):
            raise ValueError("a link")
        a = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError):
        a = np.zeros(3, np.uint32)
    how = data.draw(st.sampled_from(["dtype", "shape", "value", "value", "bytes", "link", "empty"]))
    os.unlink(path)
    if how == "link":
        os.symlink(sentinel, path)
        return
    if how == "bytes":
        with open(path, "wb") as f:
            f.write(data.draw(st.binary(max_size=300)))
        return
    if how == "empty":
        open(path, "wb").close()
        return
    with np.errstate(all="ignore"):  # casts of NaN and of large values, on purpose
        _change_array(data, how, a, path)


def _change_array(data, how, a, path):
    if how == "dtype":
        a = a.astype(data.draw(st.sampled_from(["<u4", ">u4", "<i8", "<f8", "<f4", "|b1", "<u8"])))
    elif how == "shape":
        a = a.reshape(-1) if a.ndim == 0 else a  # a statistic of a scalar field: 0-d, now (1,)
        a = data.draw(st.sampled_from([a[:-1], np.concatenate([a, a[:1]]), a.reshape(1, -1),
                                       np.zeros((0,), a.dtype), np.zeros((10**5,), a.dtype)]))
    elif a.size:
        i = data.draw(st.integers(0, a.size - 1))
        flat = a.reshape(-1)
        if a.dtype.kind == "f":
            flat[i] = data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 0.0, -1.0, 5e-324, 1e308, 2.0]))
        elif a.dtype.kind == "b":
            flat[i] = not flat[i]
        else:
            info = np.iinfo(a.dtype)
            flat[i] = data.draw(st.integers(int(info.min), int(info.max)))
    np.save(path, a)


def _normal(ck) -> tuple:
    """What a checkpoint says, with arrays by content and without the version."""
    with open(os.path.join(ck, "state.json")) as f:
        doc = json.load(f)

    def norm(o):
        if isinstance(o, dict):
            if set(o) == {"$array"}:
                a = np.load(os.path.join(ck, o["$array"]), allow_pickle=False)
                return ("array", a.dtype.str, a.shape, a.tobytes())
            return {k: norm(v) for k, v in o.items()}
        if isinstance(o, list):
            return [norm(v) for v in o]
        return o

    doc = norm(doc)
    doc.pop("version")
    rows = os.path.join(ck, doc["rows"])
    with tfdata.MmapDataset.open(rows) as ds:
        data = {n: (ds.field(n).dtype.str, ds.field(n).tobytes()) for n in ds.spec.names}
    return doc, data


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pristine")
    out = {}
    for kind, layout in (("per", "soa"), ("nstep", "aos"), ("noflags", "soa")):
        ck, _ = checkpoint(root, kind, layout, name=f"{kind}-{layout}")
        out[(kind, layout)] = ck
    return out


@settings(max_examples=int(os.environ.get("TFDATA_FUZZ_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzzed_checkpoints_load_faithfully_or_raise_format_error(pristine, data):
    """Mutate a valid checkpoint (state.json at every depth, the arrays): loading either raises
    FormatError or gives a buffer that saves back to exactly what the files say; nothing on disk
    changes, inside the checkpoint or beside it."""
    which = data.draw(st.sampled_from(sorted(pristine)))
    root = tempfile.mkdtemp(prefix="ckfuzz-")
    cwd = os.getcwd()
    try:
        sentinel = os.path.join(root, "sentinel.bin")
        with open(sentinel, "wb") as f:
            f.write(bytes(range(256)) * 16)
        ck = os.path.join(root, "ck")
        shutil.copytree(pristine[which], ck)
        with open(os.path.join(ck, "state.json")) as f:
            doc = json.load(f)
        arrays = sorted(os.listdir(os.path.join(ck, "arrays")))
        for _ in range(data.draw(st.integers(1, 3))):
            if arrays and data.draw(st.integers(0, 3)) == 0:
                _mutate_array(data, os.path.join(ck, "arrays", data.draw(st.sampled_from(arrays))),
                              sentinel)
            else:
                _mutate_state(data, doc, sentinel)
        with open(os.path.join(ck, "state.json"), "w") as f:
            json.dump(doc, f)  # NaN and Infinity are written as such: load must refuse them
        os.chdir(root)  # a relative path in the checkpoint would land here
        before = snapshot(root)
        try:
            buf = tfdata.ReplayBuffer.load(ck)
        except FormatError:
            buf = None
        assert snapshot(root) == before
        if buf is not None:
            again = os.path.join(tempfile.mkdtemp(prefix="ckfuzz-again-"), "ck")
            try:
                buf.save(again)
                assert _normal(again) == _normal(ck)
            finally:
                shutil.rmtree(os.path.dirname(again))
    finally:
        os.chdir(cwd)
        shutil.rmtree(root)


# -- the kernels of the episode check, against tests/naive.py ---------------------------------


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # numbers wrap, on purpose
@pytest.mark.parametrize("seed", range(40))
def test_episode_check_kernels_match_the_reference(seed):
    from tfdata.kernels._checkpoint import (episode_mismatch, final_mismatch_from,
                                            first_episode_break, first_final_mismatch)

    from .naive import episode_break_naive, final_mismatch_naive

    rng = np.random.default_rng(seed)
    envs = int(rng.integers(1, 4))
    cap = envs * int(rng.integers(1, 8))
    # insert steps as the buffer does; numbers start anywhere, so they wrap past 2**32
    current = rng.integers(2**32 - 3, 2**32, envs).astype(np.uint32) if seed % 3 else np.zeros(envs, np.uint32)
    episode = np.zeros(cap, np.uint32)
    term, trunc = np.zeros(cap, bool), np.zeros(cap, bool)
    cursor = size = 0
    for _ in range(int(rng.integers(0, 3 * cap // envs + 1))):
        for e in range(envs):
            s = cursor + e
            term[s], trunc[s] = rng.random() < 0.3, rng.random() < 0.1
            episode[s] = current[e]
            if term[s] or trunc[s]:
                current[e] += np.uint32(1)
        cursor, size = (cursor + envs) % cap, min(size + envs, cap)
    ep = episode[:size].copy()
    finals = np.flatnonzero(term[:size] | trunc[:size]).astype(np.int64)
    what = rng.integers(0, 5)  # corrupt one thing, or nothing
    if what == 1 and size:
        ep[rng.integers(0, size)] += np.uint32(rng.integers(1, 3))
    elif what == 2:
        current[rng.integers(0, envs)] += np.uint32(1)
    elif what == 3 and size:
        s = rng.integers(0, size)
        term[s] = not term[s]
    elif what == 4:
        finals = np.sort(np.concatenate([finals, rng.integers(0, max(size, 1), 1)]))
    want = episode_break_naive(ep, current, term, trunc, cursor, size, cap, envs)
    assert first_episode_break(ep, current, term, trunc, cursor, size, cap, envs) == want
    # chunk by chunk, in order: some chunk is non-zero exactly when a held step breaks
    cuts = [0] + sorted(int(x) for x in rng.integers(0, size + 1, 3)) + [size]
    acc = 0
    pos = 0
    for a, b in zip(cuts[:-1], cuts[1:]):
        acc |= episode_mismatch(ep, term, trunc, a, b, cursor, size, cap, envs)
        if pos >= 0:
            pos = final_mismatch_from(finals, term, trunc, a, b, pos)
    assert (acc != 0) == (0 <= want < cap)
    fwant = final_mismatch_naive(finals, term, trunc, size)
    assert first_final_mismatch(finals, term, trunc, size) == fwant
    assert (pos == finals.shape[0]) == (fwant == -1)
    if pos < 0:
        assert -1 - pos == fwant
