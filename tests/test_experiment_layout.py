"""experiments/layout.py: ``--render`` writes the published report again from its results.json."""

from __future__ import annotations

import os

import pytest

from . import REPO, experiment



@pytest.fixture(scope="module")
def lay():
    return experiment("layout")


def test_render_gives_back_the_published_report(lay, tmp_path, monkeypatch):
    """--render writes the published README.md again from its results.json alone, byte for byte
    (its hand-written parts taken from the README already in the folder), and every plot it names."""
    published = os.path.join(REPO, "reports", "layout")
    with open(os.path.join(published, "README.md"), encoding="utf-8") as f:
        text = f.read()
    (tmp_path / "README.md").write_text(text, encoding="utf-8")
    monkeypatch.setattr(lay, "OUT_DIR", str(tmp_path))
    lay.main(["--render", os.path.join(published, "results.json")])
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == text
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == sorted(n for n in os.listdir(published) if n.endswith(".png"))
