"""The documentation site: built by Sphinx, opened in a real browser (headless Chromium, Debian's
``chromium`` package), every local link and image of the built HTML resolving to a file; and
the README, short, its example the one the guide runs.

The site is built into a temporary directory by the test itself (``python3 dev.py docs``, which
CI runs after the tests, builds it with warnings as errors). Skipped with the reason when
Sphinx (the ``docs`` extra) or Chromium is missing.
"""

from __future__ import annotations

import html.parser
import os
import re
import shutil
import subprocess
import sys
import urllib.parse

import pytest

from . import REPO

DOCS = os.path.join(REPO, "docs")


def _python_blocks(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.S)


def test_readme_is_short_and_its_example_runs_in_the_guide():
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the details to docs/guide/"
    readme = _python_blocks(os.path.join(REPO, "README.md"))
    assert len(readme) == 1, "the README has one example"
    # docs/conftest.py runs getting-started.md's examples: the README's is one of them, verbatim
    assert readme[0] in _python_blocks(os.path.join(DOCS, "getting-started.md"))


_MD_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s#]+)(?:#[^)]*)?\)")


def test_local_links_of_the_readme_and_the_guide_resolve():
    """As they are read on the repository's web page (the site rewrites them at build time)."""
    pages = [os.path.join(REPO, "README.md"), os.path.join(DOCS, "getting-started.md"),
             os.path.join(DOCS, "index.md"), os.path.join(DOCS, "reports.md")]
    guide = os.path.join(DOCS, "guide")
    pages += [os.path.join(guide, f) for f in sorted(os.listdir(guide)) if f.endswith(".md")]
    broken = []
    for page in pages:
        with open(page, encoding="utf-8") as f:
            for target in _MD_LINK.findall(f.read()):
                if "://" in target or target.startswith("mailto:"):
                    continue
                if not os.path.exists(os.path.join(os.path.dirname(page), target)):
                    broken.append(f"{os.path.relpath(page, REPO)}: {target}")
    assert not broken, broken


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site built into a temporary directory."""
    for module in ("sphinx", "myst_parser", "numpydoc", "pydata_sphinx_theme"):
        pytest.importorskip(module, reason=f"{module} is not installed (the docs extra)")
    out = tmp_path_factory.mktemp("html")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", DOCS, str(out)],
                          cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


class _Refs(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs: list[tuple[str, str]] = []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if value and ((tag == "a" and name == "href") or (tag == "img" and name == "src")
                          or (tag == "link" and name == "href") or (tag == "script" and name == "src")):
                self.refs.append((tag, value))


def test_every_local_link_and_image_of_the_site_resolves(site):
    broken, images = [], 0
    for folder, dirs, files in os.walk(site):
        dirs[:] = [d for d in dirs if d != "_static"]  # the theme's files (templates among them)
        for name in files:
            if not name.endswith(".html"):
                continue
            page = os.path.join(folder, name)
            parser = _Refs()
            with open(page, encoding="utf-8") as f:
                parser.feed(f.read())
            for tag, ref in parser.refs:
                url = urllib.parse.urlsplit(ref)
                if url.scheme or url.netloc or not url.path:  # external, or an anchor here
                    continue
                images += tag == "img"
                target = os.path.normpath(os.path.join(folder, urllib.parse.unquote(url.path)))
                if not os.path.exists(target):
                    broken.append(f"{os.path.relpath(page, site)}: <{tag}> {ref}")
    assert not broken, broken[:50]
    assert images >= 30  # the reports' plots are on the site


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    why = "chromium is not installed (Debian: apt-get install chromium; python3 dev.py system --browser)"
    if os.environ.get("TFDATA_REQUIRE_BROWSER") == "1":  # CI installs it: a missing one fails
        pytest.fail(f"TFDATA_REQUIRE_BROWSER=1 but {why}")
    pytest.skip(why)


def _dom(page) -> str:
    """The page's DOM after Chromium loaded it and ran its scripts."""
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("path, title, phrases", [
    ("index.html", "tfdata", ["Replay buffers and datasets for reinforcement learning",
                              "Getting started", "User guide", "API reference"]),
    ("api/generated/tfdata.ReplayBuffer.html", "tfdata.ReplayBuffer",
     ["A fixed-capacity circular replay buffer with uniform sampling", "Parameters",
      "sample"]),
    ("guide/replay-buffers.html", "Replay buffers and samplers",
     ["Strict input", "Your own sampler", "update_field"]),
])
def test_pages_render_in_a_browser(site, path, title, phrases):
    page = site / path
    assert page.exists(), path
    dom = _dom(page)
    m = re.search(r"<title>(.*?)</title>", dom, re.S)
    assert m and title in html.unescape(m.group(1)), (m and m.group(1))
    text = html.unescape(re.sub(r"<[^>]+>", " ", dom))
    text = re.sub(r"\s+", " ", text)
    for phrase in phrases:
        assert phrase in text, f"{path}: {phrase!r} not shown"
    # the theme's scripts ran: the navigation bar holds the site's sections
    assert "bd-header" in dom and "Reports" in text
