"""experiments/frame_codecs.py: the decision rule, the check that catches a codec returning wrong
bytes, and a smoke run of the whole experiment on real (tiny) Atari streams."""

from __future__ import annotations

import json

import numpy as np
import pytest

from . import experiment



@pytest.fixture(scope="module")
def fc():
    return experiment("frame_codecs")


def frames(n=64, seed=0):
    """Frame-like data: a fixed background, a moving square, some noise (compressible, not trivial)."""
    rng = np.random.default_rng(seed)
    F = np.zeros((n, 84, 84), np.uint8)
    F[:, 70:, :] = 87
    for t in range(n):
        F[t, 10 + t % 50:14 + t % 50, 20:24] = 200
    F[rng.random(F.shape) < 0.01] = 255
    return F


def row(name, package, block, mib, fetch, compress=1000.0, error=None):
    return {"candidate": name, "package": package, "block": block, "error": error, "ratio": 1.0,
            "bytes_per_1m_frames": mib * 2**20, "fetch_us_median": fetch, "compress_mbps": compress}


def test_decide_memory_first_then_fetch_then_dependencies(fc):
    fp = {"lz4": {"new_dependencies": []}, "zstandard": {"new_dependencies": []},
          "blosc2": {"new_dependencies": ["a", "b"]}}
    slack = fc.MEMORY_SLACK * fc.BOARD_BYTES / 2**20
    rows = [row("small but slow", "zstandard", 256, 20, 90.0),
            row("too big, fastest", "lz4", 1, 20 + slack + 1, 1.0),
            row("fast", "blosc2", 16, 30, 8.0),
            row("tie, fewer deps", "zstandard", 16, 35, 8.0 * (1 + fc.TIE) * 0.99),
            row("beyond the tie", "lz4", 16, 36, 8.0 * (1 + fc.TIE) * 1.05),
            row("wrong", "lz4", 64, 10, 0.5, error="bytes differ"),
            row("slow compress", "lz4", 64, 10, 0.5, compress=fc.COMPRESS_FLOOR_MBPS / 2),
            row("reference", "-", 1, 1, 0.1)]
    d = fc.decide(rows, fp)
    assert d["best_bytes_per_1m_frames"] == 20 * 2**20  # the wrong, slow and reference rows do not count
    assert d["fastest"] == {"candidate": "fast", "block": 16}
    assert d["chosen"] == {"candidate": "tie, fewer deps", "package": "zstandard", "block": 16}
    assert ("too big, fastest", 1) not in d["eligible"] and ("beyond the tie", 16) not in d["ties"]
    fp["blosc2"]["new_dependencies"] = []  # without the dependency handicap the fastest wins
    assert fc.decide(rows, fp)["chosen"]["candidate"] == "fast"


def _codecs(fc):
    have = tuple(p for p in fc.PACKAGES if fc.installed(p))
    if not have:
        pytest.skip("no codec package installed (lz4, zstandard, blosc2)")
    return [c for c, _ in fc.make_candidates({}, have)] + [fc.Uncompressed()]


@pytest.mark.parametrize("B", [1, 16, 64])
def test_every_codec_round_trips_and_fetches_stacks(fc, B):
    F = frames()
    starts = np.arange(0, len(F) - fc.STACK + 1, 3)
    for codec in _codecs(fc):
        if "delta" in codec.name:
            continue  # blosc2's DELTA filter: see test_wrong_bytes_are_caught
        m = fc.measure_once(codec, F, B, starts, verify=True)
        assert "error" not in m, (codec.name, m.get("error"))
        assert m["raw_bytes"] == len(F) // B * B * fc.FRAME_BYTES
        assert m["compressed_bytes"] < m["raw_bytes"] or codec.package == "-"
        assert len(m["fetch_ns"]) == len(starts) and (m["into_ns"] > 0).all()


def test_wrong_bytes_are_caught(fc):
    """A codec that returns wrong bytes (here: one pixel of one frame) is reported, on each path."""
    F = frames()
    base = _codecs(fc)[-1]  # uncompressed: blocks are copies

    def corrupt(comp):
        x = bytearray(comp)
        x[7056 * 3 + 5] ^= 1
        return bytes(x)

    starts = np.arange(0, len(F) - fc.STACK + 1)
    bad_alloc = fc.Codec("bad alloc", "-", "", base.compress, lambda c: corrupt(base.alloc(c)), base.into)
    assert "alloc decompression" in fc.measure_once(bad_alloc, F, 16, starts, verify=True)["error"]
    bad_into = fc.Codec("bad into", "-", "", base.compress, base.alloc,
                        lambda c, dst: base.into(corrupt(c), dst))
    assert "into a buffer" in fc.measure_once(bad_into, F, 16, starts, verify=True)["error"]
    bad_fetch = fc.Uncompressed()
    bad_fetch.store = lambda comps, B: np.frombuffer(corrupt(b"".join(comps)), np.uint8).reshape(-1, 84, 84)
    assert "fetched stacks differ" in fc.measure_once(bad_fetch, F, 16, starts, verify=True)["error"]


@pytest.mark.parametrize("only", [None, "zstandard"], ids=["installed", "zstandard-only"])
def test_smoke_run(fc, tmp_path, monkeypatch, only):
    """The whole experiment on real ALE frames at tiny sizes writes its report, data and plot; with
    only the compress extra's package (what CI installs) it measures that one and says so."""
    pytest.importorskip("ale_py", reason="the atari extra")
    pytest.importorskip("cv2", reason="the atari extra")
    _codecs(fc)
    if only is not None:
        if not fc.installed(only):
            pytest.skip(f"{only} not installed")
        real = fc.installed
        monkeypatch.setattr(fc, "installed", lambda p: real(p) and (p not in fc.PACKAGES or p == only))
    monkeypatch.setattr(fc, "OUT_DIR", str(tmp_path))
    monkeypatch.setattr(fc, "BLOCKS", (1, 16))
    monkeypatch.setitem(fc.FRAMES, "quick", 200)
    monkeypatch.setitem(fc.DICT_FRAMES, "quick", 200)
    monkeypatch.setitem(fc.FETCHES, "quick", 8)
    fc.main(["--quick"])
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["schema_version"] == 1 and res["methodology"]["mode"] == "quick"
    rows = res["rows"]
    assert {r["block"] for r in rows} == {1, 16}
    measured = [r for r in rows if "ratio" in r]
    assert measured and all(r["ratio"] > 1 for r in measured if r["package"] != "-")
    assert res["decision"]["chosen"] is not None
    report = (tmp_path / "README.md").read_text()
    assert "<!-- headline: " in report and "## Answer" in report and "### Blocks of 16 frames" in report
    assert (tmp_path / "frame_codecs.png").exists()
    packages = {r["package"] for r in measured} - {"-"}
    if only is not None:
        assert packages == {only} and res["decision"]["chosen"]["package"] == only
        assert "**Not measured: lz4, blosc2 (not installed).**" in report
