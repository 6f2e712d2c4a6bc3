"""Determinism against the golden file written on x86-64 (tests/determinism.py): every batch,
priority, GAE value and checkpoint array bit for bit, the learners' parameters within the
tolerance; every checkpoint fixture (of any machine) loads and continues; a checkpoint in the
other byte order, or with unaligned data, is refused naming the file and the field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import tfdata
from tfdata.errors import FormatError

from . import determinism as det

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def golden():
    doc, values = det.load_golden()
    return doc, values


@pytest.fixture(scope="module")
def computed():
    return det.cases()


def _failures(results, cls):
    return [f"{r['name']}: {r['status']} {r['detail']}" for r in results
            if r["class"] == cls and r["status"] not in ("equal", "within")]


# -- the golden file -----------------------------------------------------------------------------


def test_golden_file_is_well_formed(golden):
    doc, values = golden
    det.check_golden(doc, values)
    entries = doc["entries"]
    assert doc["written_on"]["byteorder"] == "little"
    # every family of the check is there, and only the learners are float
    for prefix in ("uniform/aos/", "uniform/soa/", "uniform/groups/", "sequences/", "without_replacement/",
                   "exactly_k/", "nstep/", "frames/", "prioritized/soa/tree", "shared/", "rollout/gae",
                   "rollout/minibatch/", "checkpoint/prioritized-nstep-soa/saved",
                   "checkpoint/frames-groups/continue/", "nn/dqn", "nn/ppo", "nn/sac"):
        assert any(k.startswith(prefix) for k in entries), prefix
    assert {k for k, e in entries.items() if e["class"] == det.FLOAT} == set(det.TOLERANCE)
    assert set(values) == set(det.TOLERANCE)


def test_fixtures_are_small_and_hold_the_x86_64_checkpoints():
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(det.FIXTURES) for f in fs)
    assert total < 1 << 20, total
    kinds = {(m, k) for m, k, _ in det.checkpoint_fixtures()}
    assert {("x86_64", k) for k in det.CHECKPOINT_KINDS} <= kinds


# -- this machine against the golden file --------------------------------------------------------


def test_exact_entries_are_bit_identical(golden, computed):
    doc, values = golden
    results = det.compare(computed.entries, computed.values, doc, values)
    bad = _failures(results, det.EXACT)
    assert not bad, "\n".join(bad)


def test_float_entries_are_within_tolerance(golden, computed):
    doc, values = golden
    results = det.compare(computed.entries, computed.values, doc, values)
    bad = _failures(results, det.FLOAT)
    assert not bad, "\n".join(bad)
    assert all(r["status"] in ("equal", "within") for r in results if r["class"] == det.FLOAT)


def test_layouts_give_the_same_batches(computed):
    e = computed.entries
    for i in range(4):
        assert e[f"uniform/aos/{i}"]["sha256"] == e[f"uniform/soa/{i}"]["sha256"] == e[f"uniform/groups/{i}"]["sha256"]
    for i in range(2):
        assert e[f"sequences/aos/{i}"]["sha256"] == e[f"sequences/groups/{i}"]["sha256"]


@pytest.mark.parametrize("fixture", det.checkpoint_fixtures(), ids=lambda f: f"{f[0]}-{f[1]}")
def test_checkpoint_fixture_loads_and_continues(golden, fixture):
    """A checkpoint saved on any machine holds the golden arrays and continues (pushes, samples,
    priority updates) with the golden batches."""
    machine, kind, path = fixture
    results = det.check_checkpoint(path, kind, golden[0])
    assert {r["name"] for r in results} == {k for k in golden[0]["entries"]
                                            if k.startswith(f"checkpoint/{kind}/")}
    bad = _failures(results, det.EXACT)
    assert not bad, "\n".join(bad)


# -- the comparison itself -----------------------------------------------------------------------


def test_compare_reports_what_differs(golden, computed):
    doc, values = golden
    entries = json.loads(json.dumps(computed.entries))
    vals = {k: v.copy() for k, v in computed.values.items()}
    name = "uniform/soa/2"
    changed = det.Recorder()
    parts = {k: np.zeros(1) for k in entries[name]["parts"]}
    changed.exact(name, parts)
    entries[name] = changed.entries[name]
    vals["nn/ppo"] = vals["nn/ppo"] * np.float32(1.001)  # far outside rtol 1e-4
    vals["nn/dqn"] = vals["nn/dqn"] + np.float32(1e-9)  # within
    entries["nn/dqn"]["sha256"] = "0" * 64
    entries["nn/ppo"]["sha256"] = "0" * 64
    del entries["rollout/gae"]
    res = {r["name"]: r for r in det.compare(entries, vals, doc, values)}
    assert res[name]["status"] == "MISMATCH" and "indices" in res[name]["detail"]
    assert res["nn/ppo"]["status"] == "MISMATCH"
    assert res["nn/dqn"]["status"] == "within"
    assert res["rollout/gae"]["status"] == "MISSING"
    assert not det.passed(list(res.values()))


def test_script_check_passes_and_writes_json(tmp_path):
    out = tmp_path / "out.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "determinism.py"), "--check",
                           "--json", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["passed"] and doc["results"]
    assert "MISMATCH" not in proc.stdout


# -- byte order and alignment of a checkpoint ----------------------------------------------------

SPEC = {"obs": ("f4", (4,)), "action": "i8", "reward": "f4", "terminated": "?", "truncated": "?"}


def _saved(tmp_path, layout):
    buf = tfdata.PrioritizedReplayBuffer(SPEC, 8, layout=layout, seed=1)
    rng = np.random.default_rng(0)
    for t in range(10):
        buf.push({"obs": rng.random(4, dtype=np.float32), "action": t, "reward": np.float32(t),
                  "terminated": False, "truncated": t == 4})
    path = tmp_path / "ck"
    buf.save(path)
    return path


def _rows_file(path, layout) -> str:
    return str(path / "rows.npy") if layout == "aos" else str(path / "rows" / ("obs.npy" if layout == "soa" else "0-obs.npy"))


def _write_npy(fpath: str, arr: np.ndarray, pad: int = 0) -> None:
    """``arr`` as an NPY 1.0 file whose data starts ``pad`` bytes after numpy's 64-byte boundary."""
    text = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (
        np.lib.format.dtype_to_descr(arr.dtype), arr.shape)
    hlen = -(-(10 + len(text) + 1) // 64) * 64 - 10 + pad
    header = b"\x93NUMPY\x01\x00" + hlen.to_bytes(2, "little") + (text.ljust(hlen - 1) + "\n").encode("latin1")
    os.unlink(fpath)
    with open(fpath, "wb") as f:
        f.write(header + np.ascontiguousarray(arr).tobytes())


LAYOUTS = {"aos": "aos", "soa": "soa", "groups": [["obs", "action"]]}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_rows_in_the_other_byte_order_are_refused(tmp_path, layout):
    path = _saved(tmp_path, LAYOUTS[layout])
    fpath = _rows_file(path, layout)
    if layout == "groups":
        assert os.path.exists(fpath), os.listdir(path / "rows")
    arr = np.load(fpath)
    swapped = arr.astype(arr.dtype.newbyteorder(">"))
    _write_npy(fpath, swapped)
    with pytest.raises(FormatError, match=r"stored big-endian \(>(f4|i8)\).*little-endian") as e:
        tfdata.ReplayBuffer.load(path)
    assert fpath in str(e.value)
    if layout != "soa":  # a record names the field
        assert "field 'obs'" in str(e.value) or "field 'action'" in str(e.value)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_unaligned_rows_are_refused(tmp_path, layout):
    path = _saved(tmp_path, LAYOUTS[layout])
    fpath = _rows_file(path, layout)
    _write_npy(fpath, np.load(fpath), pad=2)
    with pytest.raises(FormatError, match=r"data starts at byte \d+, not a multiple of (4|8)") as e:
        tfdata.ReplayBuffer.load(path)
    assert fpath in str(e.value)


def test_aligned_rows_written_by_numpy_still_load(tmp_path):
    """The check is of the data's alignment, not of tfdata's own page-sized header: a file
    whose data starts at numpy's 64-byte boundary (another page size) loads the same."""
    path = _saved(tmp_path, "aos")
    want = tfdata.ReplayBuffer.load(path).sample(4, copy=True)
    fpath = _rows_file(path, "aos")
    _write_npy(fpath, np.load(fpath))
    got = tfdata.ReplayBuffer.load(path).sample(4, copy=True)
    np.testing.assert_array_equal(got.indices, want.indices)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("pad,match", [(0, r"stored big-endian \(>f8\)"), (4, r"not a multiple of 8")])
def test_state_arrays_in_the_other_byte_order_or_unaligned_are_refused(tmp_path, pad, match):
    path = _saved(tmp_path, "soa")
    fpath = str(path / "arrays" / "prioritized.leaves.npy")
    arr = np.load(fpath)
    _write_npy(fpath, arr.astype(">f8") if pad == 0 else arr, pad=pad)
    with pytest.raises(FormatError, match=match) as e:
        tfdata.ReplayBuffer.load(path)
    assert fpath in str(e.value) and "state.prioritized.leaves" in str(e.value)


def test_a_refused_checkpoint_is_left_as_it_was(tmp_path):
    path = _saved(tmp_path, "aos")
    fpath = _rows_file(path, "aos")
    _write_npy(fpath, np.load(fpath), pad=4)
    before = open(fpath, "rb").read()
    with pytest.raises(FormatError):
        tfdata.ReplayBuffer.load(path)
    assert open(fpath, "rb").read() == before
    shutil.rmtree(path)


def _with_field_order(dtype: np.dtype, field: str, order: str) -> np.dtype:
    """``dtype`` (a record) with ``field`` alone in byte order ``order`` (offsets kept)."""
    formats = [dtype.fields[n][0].newbyteorder(order) if n == field else dtype.fields[n][0] for n in dtype.names]
    return np.dtype({"names": list(dtype.names), "formats": formats,
                     "offsets": [dtype.fields[n][1] for n in dtype.names], "itemsize": dtype.itemsize})


@pytest.mark.parametrize("field", ["action", "reward"])
def test_the_field_in_the_other_byte_order_is_the_one_named(tmp_path, field):
    """A record whose other fields are native: the message names the swapped field, not the
    record's first one."""
    path = _saved(tmp_path, "aos")
    fpath = _rows_file(path, "aos")
    arr = np.load(fpath)
    _write_npy(fpath, arr.astype(_with_field_order(arr.dtype, field, ">")))
    with pytest.raises(FormatError, match=rf"rows.npy: field '{field}': stored big-endian") as e:
        tfdata.ReplayBuffer.load(path)
    assert "field 'obs'" not in str(e.value)


@pytest.mark.parametrize("layout,field,dtype", [("aos", "action", "int64"), ("groups", "action", "int64"),
                                                ("soa", None, "float32")])
def test_unaligned_data_names_the_field_whose_alignment_it_misses(tmp_path, layout, field, dtype):
    """A record's alignment is its most aligned field's: the message names that field and its dtype."""
    path = _saved(tmp_path, LAYOUTS[layout])
    fpath = _rows_file(path, layout)
    _write_npy(fpath, np.load(fpath), pad=4 if dtype == "int64" else 2)
    with pytest.raises(FormatError) as e:
        tfdata.ReplayBuffer.load(path)
    msg = str(e.value)
    assert f"(the alignment of {dtype})" in msg, msg
    if field is not None:
        assert f"field '{field}'" in msg, msg


def test_compare_fails_on_an_entry_the_golden_file_lacks(golden, computed):
    """A new entry (a case added without writing the golden file again) is reported and fails."""
    doc, values = golden
    entries = dict(computed.entries)
    rec = det.Recorder()
    rec.exact("uniform/aos/new", {"indices": np.arange(3)})
    entries.update(rec.entries)
    results = det.compare(entries, computed.values, doc, values)
    res = {r["name"]: r for r in results}
    assert res["uniform/aos/new"]["status"] == "EXTRA"
    assert not det.passed(results)


def test_compare_reports_float_values_of_another_shape(golden, computed):
    doc, values = golden
    entries = json.loads(json.dumps(computed.entries))
    vals = dict(computed.values)
    entries["nn/dqn"]["sha256"] = "0" * 64
    for cut in (vals["nn/dqn"][:-1], vals["nn/dqn"][:1]):  # the second would broadcast
        vals["nn/dqn"] = cut
        res = {r["name"]: r for r in det.compare(entries, vals, doc, values)}
        assert res["nn/dqn"]["status"] == "MISMATCH" and "shape" in res["nn/dqn"]["detail"]


def _damaged(doc, values, how):
    doc = json.loads(json.dumps(doc))
    values = dict(values)
    exact = next(k for k, e in doc["entries"].items() if e["class"] == det.EXACT)
    if how == "sha256":
        doc["entries"][exact]["sha256"] = doc["entries"][exact]["sha256"][:-1] + "g"
    elif how == "class":
        doc["entries"][exact]["class"] = "approximate"
    elif how == "float without tolerance":
        doc["entries"][exact] = dict(doc["entries"]["nn/dqn"])
        values[exact] = values["nn/dqn"]
    elif how == "values dtype":
        values["nn/dqn"] = values["nn/dqn"].astype(np.float64)
    elif how == "values size":
        values["nn/dqn"] = values["nn/dqn"][:-1]
    elif how == "values missing":
        del values["nn/ppo"]
    elif how == "version":
        doc["version"] = det.VERSION + 1
    return doc, values


@pytest.mark.parametrize("how", ["sha256", "class", "float without tolerance", "values dtype", "values size",
                                 "values missing", "version"])
def test_check_golden_refuses_a_damaged_golden_file(golden, how):
    doc, values = _damaged(*golden, how)
    with pytest.raises(ValueError, match="golden"):
        det.check_golden(doc, values)


def test_written_checkpoints_are_the_golden_ones_and_replace_only_checkpoints(tmp_path, golden):
    """``--write-checkpoint DIR`` writes checkpoints that hold the golden arrays, replaces a
    checkpoint written before, and refuses (leaving it as it is) anything else in the way."""
    out = tmp_path / "machine"
    for _ in range(2):  # the second time over the first
        det.checkpoint_cases(det.Recorder(), str(out))
        for kind in det.CHECKPOINT_KINDS:
            bad = _failures(det.check_checkpoint(str(out / kind), kind, golden[0]), det.EXACT)
            assert not bad, "\n".join(bad)
    mine = out / det.CHECKPOINT_KINDS[-1]
    shutil.rmtree(mine)
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        det.checkpoint_cases(det.Recorder(), str(out))
    assert os.listdir(mine) == ["notes.txt"] and (mine / "notes.txt").read_text() == "mine"
