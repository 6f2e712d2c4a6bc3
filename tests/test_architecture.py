"""The architecture rules that a test can enforce (ARCHITECTURE.md, "Invariants" and "Code").

- The import graph of tfdata is acyclic, imports inside functions included.
- No module reads another module's private attributes (``other._x``), except a package's own
  modules reading its ``__init__``-level names.
- Only storage and the kernels name a layout: no ``layout == "aos"``-style branch elsewhere.
- A sampler defined outside the package plugs into ReplayBuffer through the public contract.
- No comment or docstring of tfdata carries a timing figure (ns, µs, ms, s): it points to the
  report or design record that holds it.
- ARCHITECTURE.md stays a map (at most 400 lines), every design record is indexed in
  docs/design/README.md, and the local links of both resolve.
"""

from __future__ import annotations

import ast
import io
import os
import re
import tokenize

import numpy as np

import tfdata

PKG = os.path.dirname(os.path.abspath(tfdata.__file__))


def modules() -> dict:
    """``{"tfdata.x.y": path}`` for every module of the package."""
    out = {}
    for root, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(root, f), os.path.dirname(PKG))[:-3].replace(os.sep, ".")
                out[rel[:-len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(root, f)
    return out


def imports(name: str, path: str, known: dict) -> set:
    """tfdata modules ``name`` imports anywhere in its body (functions included)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            # ``from pkg import name``: the package itself, unless every name is a submodule
            targets = subs + ([base] if any(t not in known for t in subs) else [])
        else:
            continue
        for t in targets:
            while t and t not in known:  # tfdata.kernels.aos.gather -> tfdata.kernels.aos
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith("tfdata"):
                out.add(t)
    return out


def graph() -> dict:
    """``{module: modules it imports}`` over the whole package."""
    known = modules()
    return {m: imports(m, p, known) for m, p in known.items()}


def find_cycle(g: dict):
    WHITE, GREY, BLACK = 0, 1, 2
    color = {m: WHITE for m in g}
    stack = []

    def visit(m):
        color[m] = GREY
        stack.append(m)
        for d in sorted(g[m]):
            if color.get(d) == GREY:
                return stack[stack.index(d):] + [d]
            if color.get(d) == WHITE:
                found = visit(d)
                if found:
                    return found
        stack.pop()
        color[m] = BLACK
        return None

    for m in sorted(g):
        if color[m] == WHITE:
            found = visit(m)
            if found:
                return found
    return None


def test_import_graph_is_acyclic():
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    g = graph()
    assert "tfdata.replay.core" in g["tfdata.replay.buffer"]  # imports are seen ...
    assert "tfdata.replay.checkpoint" in g["tfdata.replay.core"]  # ... inside functions too


def private_reads(name: str, path: str, known: dict) -> list:
    """``(line, text)`` of every place module ``name`` reads a private name of another module:
    ``from .x import _y``, ``x._y`` for an imported tfdata module ``x``, and ``obj._y`` for any
    object but ``self``/``cls`` when ``_y`` is not an attribute this module itself defines."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    own = set()  # private names this module defines: its classes' attributes, its globals
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.ClassDef):
            pass
    for node in ast.walk(tree):  # __slots__ entries are attributes too
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__slots__" for t in node.targets):
            own.update(e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant))
    modules_here = set()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for a in node.names:
                if f"{base}.{a.name}" in known:
                    modules_here.add(a.asname or a.name)
                elif a.name.startswith("_") and not a.name.startswith("__"):
                    out.append((node.lineno, f"from {base} import {a.name}"))
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            attr = node.attr
            if not attr.startswith("_") or attr.startswith("__"):
                continue
            obj = node.value
            if isinstance(obj, ast.Name) and obj.id in ("self", "cls"):
                continue
            if isinstance(obj, ast.Name) and obj.id in modules_here:
                out.append((node.lineno, f"{obj.id}.{attr}"))
            elif attr not in own:
                out.append((node.lineno, f"{ast.unparse(obj)}.{attr}"))
    return out


def test_no_module_reads_another_modules_private_names():
    known = modules()
    found = {m: private_reads(m, p, known) for m, p in known.items()}
    found = {m: v for m, v in found.items() if v}
    assert not found, found


def test_the_private_read_finder_finds_them(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from .storage import _x\nfrom . import io\n\ndef f(buf):\n    io._y\n    return buf._storage\n")
    found = [t for _, t in private_reads("tfdata.m", str(src), modules())]
    assert found == ["from tfdata.storage import _x", "io._y", "buf._storage"], found


# modules outside storage/ and kernels/ that still turn a layout into arrays themselves (none;
# the list may only shrink)
LAYOUT_DEBT: set = set()
_LAYOUT_BRANCH = re.compile(r"""layout\s*[!=]=|[!=]=\s*["'](aos|soa)["']|["'](aos|soa)["']\s*[!=]=|native\s*==""")


def test_only_storage_and_kernels_branch_on_the_layout():
    found = {}
    for m, path in modules().items():
        if m.startswith(("tfdata.storage", "tfdata.kernels")) or m in LAYOUT_DEBT:
            continue
        for i, line in enumerate(open(path, encoding="utf-8"), 1):
            if _LAYOUT_BRANCH.search(line.split("#")[0]):
                found.setdefault(m, []).append((i, line.strip()))
    assert not found, found
    for m in LAYOUT_DEBT:  # the debt list names modules that still have a branch
        assert any(_LAYOUT_BRANCH.search(line) for line in open(modules()[m], encoding="utf-8")), m


ROOT = os.path.dirname(PKG)

# a figure followed by a unit of time: "3 us", "0.5 ns", "15 µs", "10 ms", "8.6 s"
_TIMING = re.compile(r"\d\s?(?:ns|µs|μs|us|ms)\b|\d\ss\b")

#: (module path under tfdata/, the line's text) of the timing figures still in comments and
#: docstrings: all in modules other work is rewriting now. Matched by text, so a line that moves
#: to another module stays allowed until it changes. The list may only shrink, to empty.
TIMING_DEBT = {
    ("replay/checkpoint.py", "dropped and FormatError raised (one pass, about 1 ms per million rows). The statistics are"),
}


def timing_lines(source: str) -> list:
    """``[(line number, text)]`` of the comment lines and docstring lines of ``source`` (any
    string that is a statement of its own) that carry a figure with a unit of time."""
    found = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and _TIMING.search(tok.string):
            found.append((tok.start[0], tok.string.strip()))
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            for i, line in enumerate(node.value.value.splitlines()):
                if _TIMING.search(line):
                    found.append((node.lineno + i, line.strip()))
    return sorted(set(found))


def test_no_timing_figures_in_comments_or_docstrings():
    allowed = {text for _, text in TIMING_DEBT}
    found = []
    for path in sorted(modules().values()):
        rel = os.path.relpath(path, PKG).replace(os.sep, "/")
        for line, text in timing_lines(open(path, encoding="utf-8").read()):
            if text not in allowed:
                found.append(f"tfdata/{rel}:{line}: {text}")
    assert not found, ("timings in comments go stale: point to the report or design record that "
                       "holds the figure instead\n" + "\n".join(found))


def test_the_timing_finder_finds_them():
    src = ('"""Module: about 3 us a call."""\n\n'
           'X = 1  # costs 0.5 ns, or 1.2µs, or 10 ms\n'
           'def f():\n    """Compiles in 8.6 s; float64s and 2 uses are not timings."""\n'
           '    return "an error message of 5 us is not a comment"\n')
    assert [line for line, _ in timing_lines(src)] == [1, 3, 5]
    assert timing_lines('"""float64s, 2 uses, GB/s, 3x."""\n# 16 samples\n') == []


def test_architecture_md_is_a_map_of_at_most_400_lines():
    with open(os.path.join(ROOT, "ARCHITECTURE.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= 400, (f"ARCHITECTURE.md has {len(lines)} lines: move a feature's design "
                               "to docs/design/<feature>.md and its figures to reports/")


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _local_links(path: str) -> list:
    with open(path, encoding="utf-8") as f:
        targets = _LINK.findall(f.read())
    return [t for t in targets if "://" not in t and not t.startswith("mailto:")]


def test_every_design_record_is_indexed_and_every_link_resolves():
    design = os.path.join(ROOT, "docs", "design")
    records = {f for f in os.listdir(design) if f.endswith(".md") and f != "README.md"}
    indexed = {os.path.normpath(t) for t in _local_links(os.path.join(design, "README.md"))}
    assert records <= indexed, f"not linked from docs/design/README.md: {sorted(records - indexed)}"
    broken = []
    for path in [os.path.join(ROOT, "ARCHITECTURE.md"), os.path.join(design, "README.md")] + \
            [os.path.join(design, f) for f in sorted(records)]:
        for target in _local_links(path):
            if not os.path.exists(os.path.join(os.path.dirname(path), target)):
                broken.append(f"{os.path.relpath(path, ROOT)}: {target}")
    assert not broken, broken
