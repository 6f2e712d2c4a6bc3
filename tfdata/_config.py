"""Configuration read once at import: numba options, the kernel cache location, the default layout.

This module must not import numba: ``import tfdata`` stays cheap and compiles nothing.
The kernels package imports numba and reads :data:`NJIT_OPTIONS` from here.
"""

from __future__ import annotations

import os
import tempfile

#: Options of every private kernel. ``cache=True`` writes compiled machine code next to the
#: source (or into ``NUMBA_CACHE_DIR``) so a new process loads kernels in milliseconds;
#: ``nogil=True`` lets another Python thread run while a kernel works; bounds are checked by the
#: Python wrappers once per call, never per element inside kernels.
NJIT_OPTIONS = dict(cache=True, nogil=True, boundscheck=False, error_model="numpy")

#: Options of the network kernels (tfdata.nn): as NJIT_OPTIONS, plus the floating-point freedoms
#: that let LLVM vectorise a dot product (reassociation, fused multiply-add). No assumption that
#: values are finite: a NaN or inf in an input, or in a weight that meets a nonzero input,
#: propagates (the backward pass skips exact zeros, so a NaN weight times a zero does not).
NN_OPTIONS = dict(NJIT_OPTIONS, fastmath={"reassoc", "contract", "nsz", "arcp"})

#: Options of small helpers that are inlined into kernels (never called from Python).
INLINE_OPTIONS = dict(inline="always", boundscheck=False, error_model="numpy")

LAYOUTS = ("aos", "soa")
#: Chosen by measurement (see ARCHITECTURE.md, "Default layout"): a whole-row copy is one cache
#: miss per sampled row, a column store pays one miss per field per row.
DEFAULT_LAYOUT = "aos"

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def _writable_dir(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:
        return False
    return os.access(path, os.W_OK | os.X_OK)


def cache_dir_fallback() -> str | None:
    """Return a writable directory for numba's cache when the package directory is read-only.

    Returns None when numba can cache beside the sources (its default), or when the user set
    ``NUMBA_CACHE_DIR`` (their choice wins).
    """
    if os.environ.get("NUMBA_CACHE_DIR"):
        return None
    if os.access(os.path.join(_PKG_DIR, "kernels"), os.W_OK | os.X_OK):
        return None
    candidates = []
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        candidates.append(os.path.join(xdg, "tfdata", "numba"))
    home = os.path.expanduser("~")
    if home and home != "~":
        candidates.append(os.path.join(home, ".cache", "tfdata", "numba"))
    candidates.append(os.path.join(tempfile.gettempdir(), f"tfdata-numba-{os.getuid()}"))
    for path in candidates:
        if _writable_dir(path):
            return path
    return None


def install_cache_dir() -> None:
    """Point numba's cache at a writable place if the installed package is read-only.

    Must run before numba is imported; if numba is already imported, its config is patched
    instead (the cache locator reads it when a kernel is first decorated).
    """
    path = cache_dir_fallback()
    if path is None:
        return
    os.environ["NUMBA_CACHE_DIR"] = path
    import sys

    numba_config = sys.modules.get("numba.core.config")
    if numba_config is not None:
        numba_config.CACHE_DIR = path


def resolve_layout(layout: str | None) -> str:
    """Return the layout name to use: the argument, else ``TFDATA_LAYOUT``, else the default.
    (A grouping is resolved against a spec by :func:`tfdata.storage.resolve_layout`.)"""
    source = "layout argument"
    if layout is None:
        layout = os.environ.get("TFDATA_LAYOUT")
        source = "TFDATA_LAYOUT environment variable"
        if not layout:
            return DEFAULT_LAYOUT
    if not isinstance(layout, str) or layout.lower() not in LAYOUTS:
        groups = "" if source.startswith("TFDATA") else " (or a list of groups of field names)"
        raise ValueError(f"{source}: expected one of {LAYOUTS!r}{groups}, got {layout!r}")
    return layout.lower()
