"""The file format: writer, commit, crash consistency (SIGKILL), conversion, hostile files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfdata
from tfdata.errors import FormatError, SpecError

from .conftest import CARTPOLE, LAYOUTS, ODD, random_rows

ID_SPEC = {"id": "i8", "x": ("f4", (3,)), "flag": "?", "small": ("u1", (5,))}


def id_rows(start: int, n: int) -> dict:
    """Rows whose every field is a function of the row id, so a torn or shifted row shows."""
    ids = np.arange(start, start + n, dtype=np.int64)
    return {"id": ids, "x": (ids[:, None] * np.array([1, 2, 3])).astype(np.float32), "flag": ids % 3 == 0,
            "small": ((ids[:, None] + np.arange(5)) % 251).astype(np.uint8)}


def check_id_rows(ds, rows: int) -> None:
    assert len(ds) == rows
    want = id_rows(0, rows)
    for k, v in want.items():
        np.testing.assert_array_equal(ds.field(k), v, err_msg=k)


def dataset_path(tmp_path, layout, name="d"):
    return str(tmp_path / (name + (".npy" if layout == "aos" else "")))


def test_append_commit_and_reopen(tmp_path, layout):
    path = dataset_path(tmp_path, layout)
    w = tfdata.io.Writer(path, ID_SPEC, layout)
    w.append(id_rows(0, 10))
    assert len(tfdata.MmapDataset.open(path)) == 0  # appended, not committed
    assert w.commit() == 10
    w.append(id_rows(10, 5))
    check_id_rows(tfdata.MmapDataset.open(path), 10)  # the uncommitted tail is invisible
    w.close(commit=False)
    w = tfdata.io.Writer.open(path)
    assert w.rows == 10
    w.append(id_rows(10, 7))  # overwrites the uncommitted tail
    w.close()
    check_id_rows(tfdata.MmapDataset.open(path), 17)


def test_files_are_plain_numpy_with_page_aligned_data(tmp_path, layout):
    path = dataset_path(tmp_path, layout)
    with tfdata.io.Writer(path, ID_SPEC, layout) as w:
        w.append(id_rows(0, 33))
        w.commit()
        w.append(id_rows(33, 4))  # committed on close
    files = [path] if layout == "aos" else [os.path.join(path, f"{k}.npy") for k in ID_SPEC]
    for f in files:
        h = tfdata.io.read_npy_header(f)
        assert h.offset % 4096 == 0
        # AoS: the version comment in the header; SoA: in the manifest, field headers pure NPY
        assert h.version == ((1, 0) if layout == "aos" else None)
        header = open(f, "rb").read(h.offset)
        assert (b"# tfdata" in header) == (layout == "aos")
        arr = np.load(f, mmap_mode="r", allow_pickle=False)
        assert arr.shape[0] == 37
    if layout == "aos":
        rec = np.load(path, allow_pickle=False)
        np.testing.assert_array_equal(rec["id"], np.arange(37))
    check_id_rows(tfdata.MmapDataset.open(path), 37)


def test_a_rejected_batch_writes_nothing(tmp_path, layout):
    path = dataset_path(tmp_path, layout)
    with tfdata.io.Writer(path, ID_SPEC, layout) as w:
        w.append(id_rows(0, 3))
        bad = id_rows(3, 2)
        bad["x"] = bad["x"][:, :2]
        with pytest.raises(SpecError, match="'x'"):
            w.append(bad)
        assert w.pending == 3
        w.append(id_rows(3, 2))
    check_id_rows(tfdata.MmapDataset.open(path), 5)


def test_exception_inside_with_commits_nothing_more(tmp_path):
    path = dataset_path(tmp_path, "aos")
    with pytest.raises(RuntimeError):
        with tfdata.io.Writer(path, ID_SPEC) as w:
            w.append(id_rows(0, 4))
            w.commit()
            w.append(id_rows(4, 4))
            raise RuntimeError("boom")
    check_id_rows(tfdata.MmapDataset.open(path), 4)


def test_one_writer_at_a_time(tmp_path, layout):
    path = dataset_path(tmp_path, layout)
    w = tfdata.io.Writer(path, ID_SPEC, layout)
    w.commit()
    with pytest.raises(RuntimeError, match="another writer"):
        tfdata.io.Writer.open(path)
    w.close()
    tfdata.io.Writer.open(path).close()


def test_appending_to_a_plain_numpy_file_is_refused(tmp_path):
    p = str(tmp_path / "plain.npy")
    np.save(p, np.zeros(3, [("a", "f4")]))
    with pytest.raises(FormatError, match="not written by tfdata"):
        tfdata.io.Writer.open(p)


def test_unknown_major_version_is_refused(tmp_path):
    path = dataset_path(tmp_path, "aos")
    tfdata.io.save(path, id_rows(0, 3))
    raw = bytearray(open(path, "rb").read())
    i = raw.index(b"# tfdata 1.0")
    raw[i:i + 12] = b"# tfdata 2.0"
    open(path, "wb").write(bytes(raw))
    with pytest.raises(FormatError, match="tfdata format 2.0 is not supported"):
        tfdata.MmapDataset.open(path)


@pytest.mark.parametrize("src_layout,dst_layout", [("aos", "soa"), ("soa", "aos"), ("aos", "aos")])
def test_convert_between_layouts(tmp_path, src_layout, dst_layout):
    spec = tfdata.Spec(ODD)
    cols = random_rows(spec, 1000, np.random.default_rng(0))
    src = dataset_path(tmp_path, src_layout, "src")
    dst = dataset_path(tmp_path, dst_layout, "dst")
    tfdata.io.save(src, cols, layout=src_layout)
    tfdata.io.convert(src, dst, dst_layout, chunk_bytes=4096)  # many chunks
    ds = tfdata.MmapDataset.open(dst)
    assert ds.layout == dst_layout and len(ds) == 1000
    for k, v in cols.items():
        np.testing.assert_array_equal(ds.field(k), v)


def test_convert_copies_a_plain_numpy_file_into_the_format(tmp_path):
    rec = np.zeros(50, [("obs", "f4", (4,)), ("done", "?")])  # packed 17-byte records
    rec["obs"] = np.arange(200).reshape(50, 4)
    np.save(tmp_path / "plain.npy", rec)
    tfdata.io.convert(str(tmp_path / "plain.npy"), str(tmp_path / "t.npy"), "aos")
    w = tfdata.io.Writer.open(str(tmp_path / "t.npy"))
    w.append({"obs": np.ones((2, 4), "f4"), "done": np.array([True, False])})
    w.close()
    ds = tfdata.MmapDataset.open(str(tmp_path / "t.npy"))
    np.testing.assert_array_equal(ds.field("obs")[:50], rec["obs"])
    assert len(ds) == 52


# -- crash consistency ----------------------------------------------------------------------------

_CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    import tfdata
    {source}
    ID_SPEC = {spec!r}
    path, layout, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rng = np.random.default_rng(seed)
    w = tfdata.io.Writer.open(path) if os.path.exists(path) else tfdata.io.Writer(path, ID_SPEC, layout)
    print("ready", flush=True)
    while True:
        n = int(rng.integers(1, 200))
        w.append(id_rows(w.rows + w.pending, n))
        if rng.random() < 0.5:
            print(w.commit(), flush=True)
""")


def _kill_trial(path, layout, seed, rng, min_commits=0):
    import inspect

    code = _CHILD.format(source=textwrap.indent(inspect.getsource(id_rows), "    ").strip(), spec=ID_SPEC)
    proc = subprocess.Popen([sys.executable, "-c", code, path, layout, str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    assert first == "ready\n", proc.stderr.read()
    # a random point of the append / commit loop: after 0 to 3 commits the writer reported
    # (at least min_commits), then a random pause; the commits, not the pause, make a trial write
    seen = []
    for _ in range(max(min_commits, int(rng.integers(0, 4)))):
        line = proc.stdout.readline()
        assert line, proc.stderr.read()
        seen.append(int(line))
    time.sleep(0.2 * rng.random())
    proc.send_signal(signal.SIGKILL)
    out, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err
    return seen + [int(x) for x in out.split()]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sigkill_at_random_points_loses_no_committed_row(tmp_path, layout):
    path = dataset_path(tmp_path, layout)
    rng = np.random.default_rng(7)
    seen_rows = 0
    trials = int(os.environ.get("TFDATA_KILL_TRIALS", "12"))
    for trial in range(trials):
        committed = _kill_trial(path, layout, trial, rng, min_commits=1 if trial == 0 else 0)
        ds = tfdata.MmapDataset.open(path)
        rows = len(ds)
        # every commit the writer reported is there; the file may also hold one more commit that
        # completed after the last report, never a partial batch
        assert rows >= (committed[-1] if committed else seen_rows)
        check_id_rows(ds, rows)
        assert rows >= seen_rows  # a later writer appends after what it found committed
        seen_rows = rows
        ds.close()
    assert seen_rows > 0  # the trials did write something (the first one committed at least once)
    # and the file can still be appended to
    w = tfdata.io.Writer.open(path)
    w.append(id_rows(seen_rows, 3))
    w.close()
    check_id_rows(tfdata.MmapDataset.open(path), seen_rows + 3)


# -- hostile files --------------------------------------------------------------------------------


def _valid_file(tmp_path) -> bytes:
    p = str(tmp_path / "seed.npy")
    tfdata.io.save(p, id_rows(0, 20), overwrite=True)  # once per example
    return open(p, "rb").read()


@settings(max_examples=int(os.environ.get("TFDATA_FUZZ_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_headers_and_truncations_fail_cleanly(tmp_path, data):
    raw = bytearray(_valid_file(tmp_path))
    kind = data.draw(st.sampled_from(["flip", "truncate", "text", "tail", "numbers"]))
    if kind == "flip":  # random bytes of the first 4 KiB (magic, version, length, dict)
        for _ in range(data.draw(st.integers(1, 8))):
            i = data.draw(st.integers(0, 4095))
            raw[i] = data.draw(st.integers(0, 255))
    elif kind == "truncate":
        raw = raw[:data.draw(st.integers(0, len(raw) - 1))]
    elif kind == "text":  # rewrite the dict with hostile values
        shape = data.draw(st.sampled_from(["(-1,)", "(10**30,)", "(2**62,)", "(20, 3)", "()", "(True,)",
                                           "('a',)", "(21,)", "(0,)", "(1e3,)"]))
        descr = data.draw(st.sampled_from(["'|O'", "[('id', '<i8'), ('o', '|O')]", "'<f4'", "[('id', '<i8')]",
                                           "[('a', '<U3')]", "'V8'", "[('x', '<f4', (10**12,))]", "'<i8'"]))
        text = "{'descr': %s, 'fortran_order': %s, 'shape': %s, }" % (
            descr, data.draw(st.sampled_from(["False", "True"])), shape)
        hlen = int.from_bytes(raw[8:10], "little")
        raw[10:10 + hlen] = (text.ljust(hlen - 1) + "\n").encode()
    elif kind == "tail":
        raw += bytes(data.draw(st.integers(1, 100)))
    else:  # overwrite the header length field
        raw[8:10] = data.draw(st.integers(0, 65535)).to_bytes(2, "little")
    p = str(tmp_path / "fuzz.npy")
    open(p, "wb").write(bytes(raw))
    try:
        ds = tfdata.MmapDataset.open(p)
    except FormatError:
        return
    # it opened: every byte it claims must be readable, and a loader must run over it
    for name in ds.spec.names:
        np.asarray(ds.field(name)).sum()
    for _ in tfdata.DataLoader(ds, 7, shuffle=True, seed=0):
        pass


def test_hostile_soa_manifests(tmp_path):
    d = tmp_path / "s"
    tfdata.io.save(str(d), id_rows(0, 10), layout="soa")
    m = json.loads((d / "manifest.json").read_text())
    for change, match in [
        (lambda doc: doc.update(rows=-1), "rows must be"),
        (lambda doc: doc.update(rows=10**20), "manifest says"),
        (lambda doc: doc.update(version="1.0"), "version must be"),
        (lambda doc: doc.update(fields=[]), "non-empty"),
        (lambda doc: doc["fields"][0].update(dtype="|O"), "'id'"),
        (lambda doc: doc["fields"][0].update(shape=[-2]), "'id'"),
        (lambda doc: doc["fields"][0].update(file="/etc/passwd"), "plain file name"),
        (lambda doc: doc["fields"][1].update(name="id"), "duplicate"),
        (lambda doc: doc.update(format="other"), "format"),
    ]:
        doc = json.loads(json.dumps(m))
        change(doc)
        (d / "manifest.json").write_text(json.dumps(doc))
        with pytest.raises(FormatError, match=match):
            tfdata.MmapDataset.open(str(d))


def test_writer_bad_input_changes_nothing(tmp_path):
    path = dataset_path(tmp_path, "aos")
    w = tfdata.io.Writer(path, ID_SPEC)
    w.append(id_rows(0, 3))
    wrong = np.zeros(2, [("id", "<i8")])
    with pytest.raises(SpecError, match="records: expected a 1-D array of dtype"):
        w.append_records(wrong)
    with pytest.raises(SpecError, match="records"):
        w.append_records(id_rows(3, 2))  # a mapping, not records
    assert w.pending == 3
    w.close()
    check_id_rows(tfdata.MmapDataset.open(path), 3)
    with pytest.raises(ValueError, match="writer is closed"):
        w.append(id_rows(3, 1))
    with pytest.raises(ValueError, match="layout"):
        tfdata.io.Writer(str(tmp_path / "x"), ID_SPEC, layout="columns")
    soa = tfdata.io.Writer(dataset_path(tmp_path, "soa", "s"), ID_SPEC, "soa")
    with pytest.raises(ValueError, match="needs an AoS file"):
        soa.append_records(np.zeros(1, tfdata.Spec(ID_SPEC).aos_dtype))
    soa.close()


# -- the optional "metadata" object of a directory's manifest -----------------------------------


def test_metadata_is_kept_read_only_through_appends_and_convert(tmp_path):
    import tfdata

    meta = {"dataset_id": "a/b-v0", "author": ["x", "y"], "nested": {"k": [1, 2.5, None, True]}}
    path = str(tmp_path / "d")
    with tfdata.io.Writer(path, {"x": ("f4", (2,))}, "soa", metadata=meta) as w:
        w.append({"x": np.ones((3, 2), np.float32)})
    with tfdata.io.Writer.open(path) as w:  # an append keeps it
        w.append({"x": np.zeros((2, 2), np.float32)})
    tfdata.io.convert(path, str(tmp_path / "g"), [["x"]])
    tfdata.io.convert(path, str(tmp_path / "a.npy"), "aos")
    for p in (path, str(tmp_path / "g")):
        with tfdata.MmapDataset.open(p) as ds:
            assert len(ds) == 5
            got = ds.metadata
            assert got["dataset_id"] == "a/b-v0" and tuple(got["author"]) == ("x", "y")
            assert tuple(got["nested"]["k"]) == (1, 2.5, None, True)
            with pytest.raises(TypeError):
                got["dataset_id"] = "other"
            with pytest.raises(TypeError):
                got["nested"]["k"] = []
    with tfdata.MmapDataset.open(str(tmp_path / "a.npy")) as ds:
        assert dict(ds.metadata) == {}
    tfdata.io.save(str(tmp_path / "plain"), {"x": np.arange(3)}, "soa")
    with tfdata.MmapDataset.open(str(tmp_path / "plain")) as ds:  # a manifest without it
        assert dict(ds.metadata) == {}


@pytest.mark.parametrize("bad,match", [
    ({1: 2}, "not a str"), ({"a": object()}, "not a plain JSON value"), ([1], "JSON object"),
    ({"a": np.int64(1)}, "not a plain JSON value"), ({"a": "x" * (300 << 10)}, "bytes of JSON"),
])
def test_writer_refuses_metadata_that_is_not_plain_json(tmp_path, bad, match):
    import tfdata

    with pytest.raises(ValueError, match=match):
        tfdata.io.Writer(str(tmp_path / "d"), {"x": "f4"}, "soa", metadata=bad)
    with pytest.raises(ValueError, match="AoS file has no manifest"):
        tfdata.io.Writer(str(tmp_path / "a.npy"), {"x": "f4"}, "aos", metadata={"a": 1})
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("value,match", [
    ([1, 2], "JSON object"), ({"a": {"b": 1}}, None), ("deep", "nested deeper"),
    ({"k": "x" * (300 << 10)}, "bytes of JSON"),
])
def test_a_hostile_metadata_object_is_a_format_error(tmp_path, value, match):
    import json

    import tfdata

    path = str(tmp_path / "d")
    tfdata.io.save(path, {"x": np.arange(3)}, "soa")
    mpath = os.path.join(path, "manifest.json")
    doc = json.load(open(mpath))
    if value == "deep":
        value = {}
        cur = value
        for _ in range(40):
            cur["k"] = {}
            cur = cur["k"]
    doc["metadata"] = value
    with open(mpath, "w") as f:
        json.dump(doc, f)
    if match is None:
        with tfdata.MmapDataset.open(path) as ds:
            assert ds.metadata["a"]["b"] == 1
        return
    with pytest.raises(tfdata.FormatError, match=f"manifest.json: metadata.*{match}"):
        tfdata.MmapDataset.open(path)
    with pytest.raises(tfdata.FormatError, match="manifest.json: metadata"):
        tfdata.io.Writer.open(path)
