"""numba's cache of tfdata's kernels: where it lives (:mod:`tfdata._config`) and when an entry is stale.

numba stamps a cached kernel with its own source file only; :func:`install` puts a locator in
front of numba's own ones, for this package's files, whose stamp also holds a digest of every
tfdata source the kernel's module imports, directly or not (see docs/design/kernels.md, "The
kernel cache"). A ``NUMBA_CACHE_LOCATOR_CLASSES`` set by the user replaces numba's list of
locators, this one included. numba is imported only in :func:`install`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import sys

from . import _config

PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_PKG = os.path.basename(PKG_DIR)

# ``from X import names`` (names in parentheses may span lines) and ``import X``, anywhere in a
# file, functions included. A match in a docstring can only add a file to a digest (an edit of it
# then recompiles for nothing), never hide one.
_FROM = re.compile(r"^[ \t]*from[ \t]+([.\w]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_IMPORT = re.compile(r"^[ \t]*import[ \t]+([^\n]+)", re.M)
_COMMENT = re.compile(r"#[^\n]*")


def _module_file(target: str) -> str | None:
    """The file of the module or package at ``target`` (a path without ``.py``), if any."""
    for candidate in (target + ".py", os.path.join(target, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _in_package(path: str) -> bool:
    return path.startswith(PKG_DIR + os.sep)


def _imports(path: str, text: str) -> tuple:
    """The files of this package that the source ``text`` of ``path`` imports."""
    out = set()
    for module, names in _FROM.findall(text):
        level = len(module) - len(module.lstrip("."))
        if level:
            base = os.path.dirname(path)
            for _ in range(level - 1):
                base = os.path.dirname(base)
            parts = [p for p in module[level:].split(".") if p]
        elif module == _PKG or module.startswith(_PKG + "."):
            base, parts = os.path.dirname(PKG_DIR), module.split(".")
        else:
            continue
        target = os.path.join(base, *parts)
        own = _module_file(target)
        for name in _COMMENT.sub("", names).strip("()").split(","):
            name = name.split(" as ")[0].strip()
            sub = _module_file(os.path.join(target, name)) if name.isidentifier() else None
            if sub is not None:  # ``from . import _config``: a module
                out.add(sub)
            elif own is not None:  # a name defined in (or re-exported by) the module
                out.add(own)
    for names in _IMPORT.findall(text):
        for name in _COMMENT.sub("", names).split(","):
            name = name.split(" as ")[0].strip()
            if name == _PKG or name.startswith(_PKG + "."):
                found = _module_file(os.path.join(os.path.dirname(PKG_DIR), *name.split(".")))
                if found is not None:
                    out.add(found)
    return tuple(sorted(os.path.abspath(p) for p in out if _in_package(os.path.abspath(p))))


@functools.lru_cache(maxsize=None)
def _scan(path: str, mtime_ns: int, size: int) -> tuple:
    """``(sha256 of the file, the files it imports)``, memoised on the file's stamp."""
    with open(path, "rb") as f:
        data = f.read()
    return hashlib.sha256(data).digest(), _imports(path, data.decode("utf-8", "replace"))


def sources_digest(roots) -> str:
    """sha256 over the content of ``roots`` and of every package file they import, transitively
    (each file named by its path inside the package, so that a copy of the package elsewhere
    gets the same digest)."""
    seen = {}
    todo = [os.path.abspath(p) for p in roots]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        st = os.stat(path)
        seen[path], deps = _scan(path, st.st_mtime_ns, st.st_size)
        todo.extend(deps)
    h = hashlib.sha256()
    for path in sorted(seen):
        h.update(os.path.relpath(path, PKG_DIR).encode())
        h.update(seen[path])
    return h.hexdigest()


def install() -> None:
    """Point numba's cache at a writable place (:func:`tfdata._config.install_cache_dir`) and put
    the locator of this package's kernels first in numba's list; once per process. Call before
    the first kernel is defined (numba stamps an entry when the decorator runs)."""
    _config.install_cache_dir()
    from numba.core import caching

    # numba's list of locator classes (``CacheImpl._locator_classes``; ``_CacheImpl`` before 0.62),
    # tried in order for every cached function; a class attribute, shared by its subclasses
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
    classes = getattr(impl, "_locator_classes")
    if any(getattr(cls, "tfdata_sources", False) for cls in classes):
        return
    fallbacks = tuple(classes)

    class SourcesLocator(getattr(caching, "_CacheLocator")):
        """numba's locator for a file of this package, its stamp extended by
        :func:`sources_digest` of the file and of the module the function is made for."""

        tfdata_sources = True

        def __init__(self, inner, roots):
            self.inner = inner
            self.roots = roots

        def ensure_cache_path(self):
            self.inner.ensure_cache_path()

        def get_cache_path(self):
            return self.inner.get_cache_path()

        def get_disambiguator(self):
            return self.inner.get_disambiguator()

        def get_source_stamp(self):
            return self.inner.get_source_stamp(), sources_digest(self.roots)

        @classmethod
        def from_function(cls, py_func, py_file):
            path = os.path.abspath(py_file)
            if not (_in_package(path) and os.path.isfile(path)):
                return None  # not ours (or in a zip): numba's own locators
            roots = [path]
            module = sys.modules.get(getattr(py_func, "__module__", None) or "")
            made_for = os.path.abspath(getattr(module, "__file__", None) or path)
            if made_for != path and _in_package(made_for):
                roots.append(made_for)
            for fallback in fallbacks:
                inner = fallback.from_function(py_func, py_file)
                if inner is not None:
                    return cls(inner, tuple(roots))
            return None

    classes.insert(0, SourcesLocator)
