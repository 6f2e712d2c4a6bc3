"""experiments/layout.py: ``--render`` writes the published report again from its results.json."""

from __future__ import annotations

import os

import pytest

from . import REPO, experiment, render_again



@pytest.fixture(scope="module")
def lay():
    return experiment("layout")


def test_render_gives_back_the_published_report(lay, tmp_path, monkeypatch):
    """--render writes the published README.md again from its results.json alone, byte for byte
    (its hand-written parts taken from the README already in the folder), and every plot it names."""
    rendered, published = render_again(lay, "layout", tmp_path, monkeypatch)
    assert rendered == published
    published = os.path.join(REPO, "reports", "layout")
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert pngs == sorted(n for n in os.listdir(published) if n.endswith(".png"))
