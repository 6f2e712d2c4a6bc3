"""Every code example of the guide runs as a test (sybil), collected by ``python3 dev.py test``.

Each page runs top to bottom in one namespace, in a fresh temporary directory (examples write
files). Two conventions of the markdown sources, invisible on the site:

- ``<!-- invisible-code-block: python ... -->``: code run before or after the visible
  examples: the variables a fragment takes as given (``obs``, ``td_errors``), or checks of
  what it printed in its comments.
- ``<!-- run-with: "500_000" -> "1_024" -->`` just before an example: it runs with these
  replacements, so that a training loop or a buffer of gigabytes runs in seconds; every
  replaced text must occur in the example.

An example that imports an optional dependency (torch, ray, gymnasium, Stable-Baselines3, the
ALE, zstandard, Minari) runs where it is installed and is skipped with the reason only when the import
fails; so are the page's later examples, which build on it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import unittest

from sybil import Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser
from sybil.region import Lexeme

#: the top-level modules of the optional extras
OPTIONAL = {"torch", "ray", "gymnasium", "stable_baselines3", "ale_py", "zstandard", "mujoco", "cv2",
            "minari", "h5py"}

_RUN_WITH = re.compile(r"<!--\s*run-with:((?:(?!-->).)*)-->\s*\Z", re.S)
_PAIR = re.compile(r'"((?:[^"\\]|\\.)*)"\s*->\s*"((?:[^"\\]|\\.)*)"')
_MISSING = "__tfdata_docs_missing__"


def _evaluate(example) -> None:
    __tracebackhide__ = True
    namespace = example.namespace
    if namespace.get(_MISSING):
        raise unittest.SkipTest(f"an earlier example of this page needs {namespace[_MISSING]}, "
                                "which is not installed")
    try:
        PythonEvaluator()(example)
    except ModuleNotFoundError as exc:
        top = (exc.name or "").partition(".")[0]
        if top not in OPTIONAL:
            raise
        namespace[_MISSING] = top
        raise unittest.SkipTest(f"needs {top}, which is not installed") from None


class GuideCodeBlockParser(PythonCodeBlockParser):
    """Python code blocks, visible and invisible, with a ``run-with`` comment's replacements."""

    def __call__(self, document):
        for region in super().__call__(document):
            m = _RUN_WITH.search(document.text, 0, region.start)
            if m is not None:
                source = str(region.parsed)
                for old, new in _PAIR.findall(m.group(1)):
                    if old not in source:
                        raise ValueError(f"{document.path}: run-with replaces {old!r}, which the "
                                         f"example at line {document.text.count(chr(10), 0, region.start) + 1} "
                                         "does not hold")
                    source = source.replace(old, new)
                region.parsed = Lexeme(source, region.parsed.offset, region.parsed.line_offset)
            region.evaluator = _evaluate
            yield region


def _setup(namespace: dict) -> None:
    namespace["__tfdata_docs_cwd__"] = os.getcwd()
    namespace["__tfdata_docs_tmp__"] = tmp = tempfile.mkdtemp(prefix="tfdata-docs-")
    os.chdir(tmp)


def _teardown(namespace: dict) -> None:
    os.chdir(namespace["__tfdata_docs_cwd__"])
    shutil.rmtree(namespace["__tfdata_docs_tmp__"], ignore_errors=True)


pytest_collect_file = Sybil(
    parsers=[GuideCodeBlockParser(), SkipParser()],
    patterns=["getting-started.md", "guide/*.md"],
    setup=_setup,
    teardown=_teardown,
).pytest()
