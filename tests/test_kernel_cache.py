"""numba's cache of tfdata's kernels notices an edit of a file a kernel imports
(:mod:`tfdata._kernel_cache`): numba alone stamps an entry with the kernel's own file only."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import tfdata

PKG = os.path.dirname(tfdata.__file__)

HELPER = '''from numba import njit

from .._config import INLINE_OPTIONS

OFFSET = {offset}


@njit(**INLINE_OPTIONS)
def helper(x):
    return x + OFFSET
'''

KERNEL = '''from numba import njit

from .._config import NJIT_OPTIONS
from ._probe_helper import helper


@njit(**NJIT_OPTIONS)
def probe(x):
    return helper(x)
'''

# the result, the cache hits and misses of this process, and the locator of the network kernels
RUN = '''
from tfdata.kernels import _probe
from tfdata.nn import _mlp_kernels
result = _probe.probe(1)
stats = _probe.probe.stats
print(result, sum(stats.cache_hits.values()), sum(stats.cache_misses.values()),
      type(_mlp_kernels.adam_step._cache._impl.locator).__name__)
'''


def _run(site, cache) -> list:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "PYTHON"))}
    env.update(PYTHONPATH=str(site), NUMBA_CACHE_DIR=str(cache), PYTHONDONTWRITEBYTECODE="1")
    out = subprocess.run([sys.executable, "-c", RUN], capture_output=True, text=True, env=env,
                         cwd=str(site.parent), timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def _entries(cache) -> set:
    return {f for _, _, files in os.walk(cache) for f in files if "_probe" in f}


def test_an_edit_of_an_imported_helper_recompiles_the_kernel(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(PKG, site / "tfdata", ignore=shutil.ignore_patterns("__pycache__"))
    kernels = site / "tfdata" / "kernels"
    (kernels / "_probe_helper.py").write_text(HELPER.format(offset=1))
    (kernels / "_probe.py").write_text(KERNEL)
    cache = tmp_path / "cache"

    assert _run(site, cache) == ["2", "0", "1", "SourcesLocator"]  # compiled and cached
    assert _run(site, cache)[:3] == ["2", "1", "0"]  # loaded from the cache
    first = _entries(cache)
    assert first

    # only the helper's file changes: numba's own stamp of _probe.py is the same
    (kernels / "_probe_helper.py").write_text(HELPER.format(offset=10))
    assert _run(site, cache)[:3] == ["11", "0", "1"]  # recompiled, not the stale 2
    assert _run(site, cache)[:3] == ["11", "1", "0"]  # and cached again
    assert _entries(cache) == first  # overwritten in place: the cache did not grow
