"""Sphinx configuration of tfdata's documentation site.

Build it with ``python3 dev.py docs`` (warnings are errors). The reports and ARCHITECTURE.md stay
where they are in the repository; the build copies them into ``_generated/`` (git-ignored) so
that Sphinx renders them with their plots, and rewrites the links of every page that point at
them (written for GitHub, relative to the page's place in the repository) to those copies.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import sys

DOCS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(DOCS)
GENERATED = os.path.join(DOCS, "_generated")
sys.path.insert(0, ROOT)

import tfdata  # noqa: E402

project = "tfdata"
author = "the tfdata authors"
copyright = "the tfdata authors"
release = tfdata.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "numpydoc",
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = ["_build", "**/.ipynb_checkpoints", "_generated/reports/**/quick"]

# MyST: markdown pages, GitHub-style heading anchors (links such as contracts.md#adding-a-sampler)
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# the API reference: one page per public object, from the numpydoc docstrings
autosummary_generate = True
autosummary_imported_members = False
autosummary_ignore_module_all = False  # a module's __all__ is its public API
autodoc_default_options = {"members": True, "member-order": "bysource"}
autodoc_typehints = "none"  # numpydoc's Parameters sections say the types
numpydoc_show_class_members = False  # autodoc's :members: lists them
numpydoc_class_members_toctree = False
numpydoc_validation_checks: set = set()

html_theme = "pydata_sphinx_theme"
html_title = f"tfdata {release}"
html_static_path: list = []
html_theme_options = {
    "navbar_align": "left",
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "secondary_sidebar_items": ["page-toc"],
}
html_sidebars = {"index": [], "getting-started": []}
html_show_sourcelink = False
html_copy_source = False


# -- the reports and ARCHITECTURE.md, copied beside the pages ---------------------------------

#: what is copied into _generated/, as repository paths
COPIED = ("reports", "ARCHITECTURE.md")
_SKIP = {"quick", "__pycache__"}


def _copy_sources() -> None:
    """Copy the reports (their pages, plots and results) and ARCHITECTURE.md into _generated/."""
    if os.path.isdir(GENERATED):
        shutil.rmtree(GENERATED)
    for name in COPIED:
        src = os.path.join(ROOT, name)
        dst = os.path.join(GENERATED, name)
        if os.path.isdir(src):
            shutil.copytree(src, dst, ignore=lambda d, names: [n for n in names
                                                                if n in _SKIP or n.endswith(".log")])
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy2(src, dst)


def _title(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("# "):
                return line[2:].strip()
    return os.path.basename(os.path.dirname(path))


def _write_gallery() -> None:
    """_generated/gallery.md: every report, linked, with its plots (the reports' PNG files)."""
    reports = os.path.join(GENERATED, "reports")
    lines = ["# Plots of the reports", "",
             "Every report under `reports/` with the plots of its folder; a plot opens full size.", ""]
    for folder, dirs, files in sorted(os.walk(reports)):
        dirs.sort()
        if "README.md" not in files or folder == reports:
            continue
        rel = os.path.relpath(folder, GENERATED).replace(os.sep, "/")
        lines += [f"## [{_title(os.path.join(folder, 'README.md'))}]({rel}/README.md)", "",
                  f"`{rel}/`", ""]
        for png in sorted(f for f in files if f.endswith(".png")):
            lines += [f"[![{png}]({rel}/{png})]({rel}/{png})", ""]
    with open(os.path.join(GENERATED, "gallery.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


_copy_sources()
_write_gallery()

_LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?(\))")


def _repo_path(docname_path: str) -> str:
    """The repository path a source file under docs/ stands for (a copy: its original)."""
    rel = os.path.relpath(docname_path, DOCS).replace(os.sep, "/")
    if rel.startswith("_generated/"):
        return rel[len("_generated/"):]
    return "docs/" + rel


def _docs_path(repo_path: str) -> str | None:
    """Where a repository path lives under docs/ (None: outside the site)."""
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/"):]
    for name in COPIED:
        if repo_path == name or repo_path.startswith(name + "/"):
            return "_generated/" + repo_path
    return None


def rewrite_links(text: str, source_file: str) -> str:
    """Point the local links of a page, written relative to its place in the repository, at the
    pages of the site; a link to anything else in the repository (an experiment's script, a
    test) points at the file itself."""
    here = _repo_path(source_file)
    here_dir = posixpath.dirname(here)
    docs_here = os.path.relpath(os.path.dirname(source_file), DOCS).replace(os.sep, "/")

    def sub(m: re.Match) -> str:
        target = m.group(2)
        if "://" in target or target.startswith(("mailto:", "/")):
            return m.group(0)
        repo_target = posixpath.normpath(posixpath.join(here_dir, target))
        if repo_target.startswith(".."):
            return m.group(0)
        in_docs = _docs_path(repo_target)
        if in_docs is None:  # a file of the repository outside the site: link the file itself
            new = posixpath.relpath(repo_target, posixpath.join("docs", docs_here))
        else:
            new = posixpath.relpath(in_docs, docs_here or ".")
        return m.group(1) + new + (m.group(3) or "") + m.group(4)

    return _LINK.sub(sub, text)


def _source_read(app, docname, source) -> None:
    path = app.env.doc2path(docname)
    if str(path).endswith(".md"):
        source[0] = rewrite_links(source[0], str(path))


def setup(app):
    app.connect("source-read", _source_read)


# -- the API pages of the modules with optional dependencies ----------------------------------

#: module: the extra that installs its dependencies
OPTIONAL_MODULES = {"tfdata.sb3": "sb3", "tfdata.ray": "ray"}


def _write_optional_api() -> None:
    """api/optional.rst (git-ignored): an autosummary of each optional module that imports here."""
    import importlib

    lines = ["Optional modules", "================", ""]
    present, absent = [], []
    for name, extra in OPTIONAL_MODULES.items():
        try:
            importlib.import_module(name)
        except ImportError as exc:
            absent.append(f"* ``{name}``: not documented in this build ({exc}); "
                          f"``pip install 'tfdata[{extra}]'``")
        else:
            present.append(f"   {name}")
    if present:
        lines += present + [""]
    lines += absent
    text = "\n".join(lines) + "\n"
    path = os.path.join(DOCS, "api", "optional.rst")
    if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


_write_optional_api()
