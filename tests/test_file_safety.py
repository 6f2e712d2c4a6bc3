"""Files under careless and hostile use: nothing on disk is destroyed, no special file hangs.

Each test is a case found by trying tfdata as a careless user and as an attacker handing it
files (the repros of the "nothing is lost" issue); each failed on tfdata 0.1. The rules they
check are in ARCHITECTURE.md ("Nothing is lost").
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tfdata
from tfdata.errors import FormatError, SpecError

from .test_nothing_lost import snapshot

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rows(lo: int, hi: int) -> dict:
    ids = np.arange(lo, hi, dtype=np.int64)
    return {"id": ids, "x": (ids[:, None] * np.ones(3)).astype(np.float32)}


def ids_of(path) -> np.ndarray:
    with tfdata.MmapDataset.open(str(path)) as ds:
        return np.array(ds.field("id"))


# -- existing paths are refused unless asked, and then only datasets --------------------------

@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_save_refuses_an_existing_path_and_leaves_it(tmp_path, layout):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "main.py").write_text("print('mine')\n")
    f = tmp_path / "u.npy"
    f.write_bytes(b"my notes, not a dataset")
    before = snapshot(str(tmp_path))
    for target in (proj, f):
        with pytest.raises(FileExistsError, match="exists"):
            tfdata.io.save(str(target), rows(0, 5), layout=layout)
        with pytest.raises(FileExistsError, match="not a tfdata"):
            tfdata.io.save(str(target), rows(0, 5), layout=layout, overwrite=True)
        with pytest.raises(FileExistsError):
            tfdata.io.Writer(str(target), {"id": "i8"}, layout)
        with pytest.raises(FileExistsError):
            tfdata.io.create(str(target), {"id": "i8"}, 4, layout, overwrite=True)
    assert snapshot(str(tmp_path)) == before


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_overwrite_replaces_a_dataset_of_the_same_layout(tmp_path, layout):
    p = tmp_path / "d"
    tfdata.io.save(str(p), rows(0, 10), layout=layout)
    tfdata.io.save(str(p), rows(100, 103), layout=layout, overwrite=True)
    assert ids_of(p).tolist() == [100, 101, 102]
    assert sorted(os.listdir(tmp_path)) == ["d"]  # no temporary or old name left behind


def test_an_soa_directory_holding_other_files_is_not_replaced(tmp_path):
    p = tmp_path / "d"
    tfdata.io.save(str(p), rows(0, 10), layout="soa")
    (p / "README.txt").write_text("notes about this data")
    before = snapshot(str(tmp_path))
    with pytest.raises(FileExistsError, match="README.txt"):
        tfdata.io.save(str(p), rows(0, 3), layout="soa", overwrite=True)
    assert snapshot(str(tmp_path)) == before


def test_a_failed_save_leaves_the_old_file(tmp_path):
    # a name numpy cannot write into a header raised after the old file had been emptied
    p = tmp_path / "u.npy"
    tfdata.io.save(str(p), rows(0, 10))
    before = snapshot(str(tmp_path))
    with pytest.raises(SpecError, match="观测"):
        tfdata.io.save(str(p), {"观测": np.arange(4)}, overwrite=True)
    assert snapshot(str(tmp_path)) == before


def test_a_save_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    p = tmp_path / "u.npy"
    tfdata.io.save(str(p), rows(0, 10))
    before = snapshot(str(tmp_path))

    def boom(self, records):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tfdata.io.Writer, "append_records", boom)
    monkeypatch.setattr(tfdata.io.Writer, "append", boom)
    with pytest.raises(OSError, match="No space"):
        tfdata.io.save(str(p), rows(0, 3), overwrite=True)
    assert snapshot(str(tmp_path)) == before


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_a_refused_second_writer_truncates_nothing(tmp_path, layout):
    p = str(tmp_path / "a")
    w1 = tfdata.io.Writer(p, {"id": "i8"}, layout)
    w1.append({"id": np.arange(1, 101)})
    w1.commit()
    with pytest.raises(FileExistsError):
        tfdata.io.Writer(p, {"id": "i8"}, layout)
    with pytest.raises(RuntimeError, match="another writer"):
        tfdata.io.Writer(p, {"id": "i8"}, layout, overwrite=True)
    with pytest.raises(RuntimeError, match="another writer"):
        tfdata.io.Writer.open(p)
    assert ids_of(p).tolist() == list(range(1, 101))
    w1.close()
    assert sorted(os.listdir(tmp_path)) == ["a"]


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_convert_onto_itself_is_refused(tmp_path, layout):
    src = tmp_path / "d"
    tfdata.io.save(str(src), rows(0, 50), layout=layout)
    before = snapshot(str(tmp_path))
    for dst in (src, tmp_path / "." / "d", src / "inner" if layout == "soa" else src):
        with pytest.raises(ValueError, match="onto itself"):
            tfdata.io.convert(str(src), str(dst), layout, overwrite=True)
    os.symlink(src, tmp_path / "alias")
    with pytest.raises(ValueError, match="onto itself"):
        tfdata.io.convert(str(src), str(tmp_path / "alias"), layout, overwrite=True)
    os.unlink(tmp_path / "alias")
    assert snapshot(str(tmp_path)) == before
    tfdata.io.convert(str(src), str(tmp_path / "copy"), "soa" if layout == "aos" else "aos")
    assert ids_of(tmp_path / "copy").tolist() == list(range(50))


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_a_spill_file_never_replaces_anything(tmp_path, layout):
    victim = tmp_path / "replay.npy"
    tfdata.io.save(str(victim), rows(0, 10), layout=layout)  # even a dataset of ours
    before = snapshot(str(tmp_path))
    with pytest.raises(FileExistsError, match="spill_path"):
        tfdata.ReplayBuffer({"id": "i8"}, 64, layout=layout, spill_path=str(victim), hot_rows=8)
    assert snapshot(str(tmp_path)) == before


# -- replacing a mapped file never faults its readers ------------------------------------------

_READER = textwrap.dedent("""
    import os, sys, numpy as np, tfdata
    path, layout = sys.argv[1], sys.argv[2]
    ds = tfdata.MmapDataset.open(path)
    loader = tfdata.DataLoader(ds, 100, shuffle=True, seed=0, prefetch=1)
    it = iter(loader)
    first = next(it)["id"].copy()
    # another writer replaces the dataset with a shorter one while this loader holds the map
    tfdata.io.save(path, {"id": np.arange(5, dtype=np.int64),
                          "x": np.zeros((5, 3), np.float32)}, layout=layout, overwrite=True)
    seen = np.concatenate([first] + [b["id"].copy() for b in it])
    assert sorted(seen.tolist()) == list(range(100_000)), "old rows changed"
    print("ok", len(tfdata.MmapDataset.open(path)))
""")


@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_replacing_a_mapped_dataset_does_not_kill_its_reader(tmp_path, layout):
    p = str(tmp_path / "d")
    tfdata.io.save(p, rows(0, 100_000), layout=layout)
    out = subprocess.run([sys.executable, "-c", _READER, p, layout], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    # before: the save truncated the file in place and the reader died of SIGBUS (-7)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.split() == ["ok", "5"]


# -- links and special files -------------------------------------------------------------------

def test_links_inside_an_soa_directory_are_refused(tmp_path):
    secret = tmp_path / "secret.npy"
    np.save(secret, np.arange(10, dtype=np.int64) * 7)
    d = tmp_path / "d"
    tfdata.io.save(str(d), {"id": np.arange(10, dtype=np.int64)}, layout="soa")
    os.unlink(d / "id.npy")
    os.symlink(secret, d / "id.npy")
    with pytest.raises(FormatError, match="symbolic link"):
        tfdata.MmapDataset.open(str(d))
    with pytest.raises(FormatError, match="symbolic link"):
        tfdata.io.Writer.open(str(d))
    os.unlink(d / "id.npy")
    tfdata.io.save(str(tmp_path / "other"), {"id": np.arange(10, dtype=np.int64)}, layout="soa")
    os.symlink(tmp_path / "other" / "manifest.json", d / "id.npy")
    os.rename(d / "manifest.json", d / "m.json")
    os.symlink(tmp_path / "other" / "manifest.json", d / "manifest.json")
    with pytest.raises(FormatError, match="symbolic link"):
        tfdata.MmapDataset.open(str(d))


def test_a_link_named_by_the_user_is_followed(tmp_path):
    tfdata.io.save(str(tmp_path / "real.npy"), rows(0, 4))
    os.symlink(tmp_path / "real.npy", tmp_path / "alias.npy")
    assert ids_of(tmp_path / "alias.npy").tolist() == [0, 1, 2, 3]
    # but appending writes in place: not through a link
    with pytest.raises(FormatError, match="symbolic link"):
        tfdata.io.Writer.open(str(tmp_path / "alias.npy"))


@pytest.mark.parametrize("where", ["file", "field", "manifest"])
def test_a_fifo_is_refused_without_blocking(tmp_path, where):
    # opening a FIFO for reading blocks until a writer appears: it used to hang for ever
    if where == "file":
        target = tmp_path / "x.npy"
        os.mkfifo(target)
        opened = target
    else:
        opened = tmp_path / "d"
        tfdata.io.save(str(opened), {"id": np.arange(4, dtype=np.int64)}, layout="soa")
        target = opened / ("id.npy" if where == "field" else "manifest.json")
        os.unlink(target)
        os.mkfifo(target)
    code = ("import sys, tfdata\n"
            "try:\n    tfdata.MmapDataset.open(sys.argv[1])\n"
            "except tfdata.FormatError as e:\n    print('refused', e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(opened)], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("refused") and "regular" in out.stdout


# -- hostile headers and manifests: FormatError naming the file --------------------------------

def _with_header(path, text: str) -> None:
    raw = bytearray(open(path, "rb").read())
    hlen = int.from_bytes(raw[8:10], "little")
    raw[10:10 + hlen] = (text.ljust(hlen - 1) + "\n").encode()
    open(path, "wb").write(bytes(raw))


@pytest.mark.parametrize("shape", [(1,) * 65, (0, 2**63 - 1), (2**40, 2**40), (0,) * 40, (2**63,),
                                   (0, 1, 2**62)])
@pytest.mark.parametrize("descr", ["'<i8'", "[('id', '<i8')]"])
def test_absurd_header_shapes_are_format_errors(tmp_path, shape, descr):
    p = tmp_path / "h.npy"
    np.save(p, np.zeros(3, np.int64))
    _with_header(p, "{'descr': %s, 'fortran_order': False, 'shape': %r, }" % (descr, shape))
    with pytest.raises(FormatError, match="h.npy"):
        tfdata.MmapDataset.open(str(p))
    with pytest.raises(FormatError, match="h.npy"):
        tfdata.io.read_npy_header(str(p))


def test_an_absurd_field_shape_in_a_manifest_is_a_format_error(tmp_path):
    d = tmp_path / "s"
    tfdata.io.save(str(d), {"a": np.zeros((0, 3))}, layout="soa")
    doc = json.loads((d / "manifest.json").read_text())
    doc["fields"][0]["shape"] = [2**63 - 1]
    (d / "manifest.json").write_text(json.dumps(doc))
    _with_header(d / "a.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (0, %d), }" % (2**63 - 1))
    with pytest.raises(FormatError, match="manifest.json"):
        tfdata.MmapDataset.open(str(d))


def test_a_deeply_nested_manifest_is_a_format_error(tmp_path):
    d = tmp_path / "d"
    tfdata.io.save(str(d), rows(0, 4), layout="soa")
    (d / "manifest.json").write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(FormatError, match="manifest.json"):
        tfdata.MmapDataset.open(str(d))
    doc = {"format": "tfdata.soa", "version": [1, 0], "rows": 4, "fields": [
        {"name": "id", "dtype": "<i8", "shape": [[[[1]]]], "file": "id.npy"}]}
    (d / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="manifest.json"):
        tfdata.MmapDataset.open(str(d))


_MANIFEST_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
    st.text(max_size=20), st.sampled_from(["../x.npy", "/etc/passwd", "id.npy", "x.npy", "<i8",
                                           "|O", "V8", "<U3", "manifest.json", ".", ""]),
    st.lists(st.integers(-3, 2**63), max_size=70), st.dictionaries(st.text(max_size=5), st.integers(),
                                                                   max_size=3))


@settings(max_examples=int(os.environ.get("TFDATA_FUZZ_EXAMPLES", "150")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_fuzzed_manifests_fail_cleanly_and_change_nothing(tmp_path_factory, data):
    top = tmp_path_factory.mktemp("fuzz")
    d = top / "d"
    tfdata.io.save(str(d), rows(0, 6), layout="soa")
    (top / "outside.npy").write_bytes(open(d / "id.npy", "rb").read())
    doc = json.loads((d / "manifest.json").read_text())
    kind = data.draw(st.sampled_from(["top", "field", "special"]))
    if kind == "top":
        doc[data.draw(st.sampled_from(["format", "version", "rows", "fields"]))] = data.draw(_MANIFEST_VALUES)
    elif kind == "field":
        f = doc["fields"][data.draw(st.integers(0, 1))]
        f[data.draw(st.sampled_from(["name", "dtype", "shape", "file"]))] = data.draw(_MANIFEST_VALUES)
    else:
        victim = d / data.draw(st.sampled_from(["id.npy", "x.npy"]))
        os.unlink(victim)
        how = data.draw(st.sampled_from(["link", "fifo", "dir", "missing"]))
        if how == "link":
            os.symlink(top / "outside.npy", victim)
        elif how == "fifo":
            os.mkfifo(victim)
        elif how == "dir":
            victim.mkdir()
    (d / "manifest.json").write_text(json.dumps(doc))
    before = snapshot(str(top))

    def hang(*_):
        raise TimeoutError("blocked opening a special file")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(20)  # a FIFO opened for reading blocks for ever: fail instead
    try:
        try:
            with tfdata.MmapDataset.open(str(d)) as ds:
                for name in ds.spec.names:
                    np.asarray(ds.field(name)).sum()
        except (FormatError, FileNotFoundError):
            pass
        try:
            tfdata.io.Writer.open(str(d)).close(commit=False)
        except (FormatError, FileNotFoundError):
            pass
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert snapshot(str(top)) == before


# -- the order of a commit's system calls ------------------------------------------------------

@pytest.mark.parametrize("layout", ["aos", "soa"])
def test_commit_flushes_data_before_any_row_count_and_the_manifest_last(tmp_path, monkeypatch, layout):
    """A SIGKILL cannot see the order of flushes (unflushed data is still in the page cache), so
    the order is checked on the calls themselves: every data write of a file is flushed before
    that file's header (offset 0) is rewritten, and an SoA manifest is replaced after all."""
    p = str(tmp_path / "d")
    w = tfdata.io.Writer(p, {"id": "i8", "x": ("f4", (3,))}, layout)
    w.append(rows(0, 10))
    w.commit()
    calls = []
    real = {n: getattr(os, n) for n in ("pwrite", "fdatasync", "fsync", "replace")}

    def rec(name):
        def f(*args):
            calls.append((name,) + tuple(a if isinstance(a, (int, str)) else None for a in args))
            return real[name](*args)
        return f

    for n in real:
        monkeypatch.setattr(os, n, rec(n))
    w.append(rows(10, 20))  # the data writes are recorded too
    w.commit()
    monkeypatch.undo()
    w.close()
    header_at = {}
    dirty = set()
    for i, c in enumerate(calls):
        if c[0] == "pwrite":
            fd, off = c[1], c[3]
            if off == 0:  # a header rewrite: the file's data must be flushed already
                assert fd not in dirty, f"header of fd {fd} rewritten before its data was flushed: {calls}"
                header_at[fd] = i
            else:
                dirty.add(fd)
        elif c[0] == "fdatasync":
            dirty.discard(c[1])
    assert header_at and not dirty, calls
    if layout == "soa":
        replaces = [i for i, c in enumerate(calls) if c[0] == "replace"]
        assert replaces and replaces[-1] > max(header_at.values()), calls
        assert calls[replaces[-1]][2].endswith("manifest.json")
    assert ids_of(p).tolist() == list(range(20))
