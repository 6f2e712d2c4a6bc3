"""Shared helpers of the test suite."""

import importlib
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def experiment(name: str):
    """The module ``experiments/<name>.py`` (imported with experiments/ on the path, which is
    taken off again: the experiments import each other by plain name)."""
    folder = os.path.join(REPO, "experiments")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(folder)


def render_again(module, name: str, folder, monkeypatch) -> tuple:
    """Render the published report ``reports/<name>`` again from its results.json alone into
    ``folder`` (its README copied there first: the hand-written parts come from it), through
    ``module.main(["--render", ...])``; returns ``(rendered, published)`` README texts."""
    published = os.path.join(REPO, "reports", name)
    with open(os.path.join(published, "README.md"), encoding="utf-8") as f:
        text = f.read()
    (folder / "README.md").write_text(text, encoding="utf-8")
    monkeypatch.setattr(module, "OUT_DIR", str(folder))
    module.main(["--render", os.path.join(published, "results.json")])
    return (folder / "README.md").read_text(encoding="utf-8"), text
