"""Start-up costs, each measured in fresh interpreters (``sys.executable -c ...``).

* ``ImportNumba``: ``import numba`` alone, the floor any numba-based library pays.
* ``FirstSample``: ``import tfdata`` + build a small buffer + first ``sample`` with a warm kernel
  cache, that minus ``import numba`` (what tfdata itself adds), and the first ``sample`` call
  alone (loading the cached kernel, most of the difference).
* ``ColdCompile``: the first ``sample`` with an empty numba cache (``NUMBA_CACHE_DIR`` pointed
  at a fresh temporary directory): the one-off compile a new install or a new Python pays.

Times are taken inside the child with ``perf_counter`` (interpreter start-up excluded) and
reported as the median of a few runs, after one discarded run that warms the OS page cache,
the ``.pyc`` files and the kernel cache. Children run in a temporary working directory so that
``import tfdata`` resolves to the installed package, never to a source tree in the cwd.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile

_SPEC = ('{"obs": ("f4", (4,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (4,)), '
         '"terminated": "?", "truncated": "?"}')

IMPORT_NUMBA = """
import time
t0 = time.perf_counter()
import numba
print(time.perf_counter() - t0)
"""

# everything a user runs before the first batch comes back
IMPORT_AND_FIRST_SAMPLE = """
import time
t0 = time.perf_counter()
import numpy as np
import tfdata
spec = tfdata.Spec(%(spec)s)
buf = tfdata.ReplayBuffer(spec, 1000, layout=%(layout)r, seed=0)
buf.extend({f.name: np.zeros((64,) + f.shape, f.dtype) for f in spec})
buf.sample(32)
print(time.perf_counter() - t0)
"""

# only the first sample call (numba already imported by the buffer's construction)
FIRST_SAMPLE_ONLY = """
import time
import numpy as np
import tfdata
spec = tfdata.Spec(%(spec)s)
buf = tfdata.ReplayBuffer(spec, 1000, layout=%(layout)r, seed=0)
buf.extend({f.name: np.zeros((64,) + f.shape, f.dtype) for f in spec})
t0 = time.perf_counter()
buf.sample(32)
print(time.perf_counter() - t0)
"""


def _run(code: str, env: dict | None = None) -> float:
    """Run ``code`` in a fresh interpreter; return the float it prints last."""
    cwd = tempfile.mkdtemp(prefix="tfdata-bench-")
    try:
        proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=300)
    finally:
        shutil.rmtree(cwd, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed ({proc.returncode}):\n{proc.stderr}")
    return float(proc.stdout.strip().splitlines()[-1])


def _code(template: str, layout: str) -> str:
    return template % {"spec": _SPEC, "layout": layout}


class ImportNumba:
    unit = "seconds"
    runs = 7
    timeout = 300

    def setup(self):
        _run(IMPORT_NUMBA)

    def track_import_numba(self):
        return statistics.median(_run(IMPORT_NUMBA) for _ in range(self.runs))


class FirstSample:
    """``import tfdata`` + a 1000-row buffer + extend(64) + first ``sample(32)``, warm kernel cache."""

    params = [["aos", "soa"]]
    param_names = ["layout"]
    unit = "seconds"
    runs = 7
    timeout = 300

    def setup(self, layout):
        _run(_code(IMPORT_AND_FIRST_SAMPLE, layout))  # warms (or refreshes) the kernel cache
        _run(IMPORT_NUMBA)

    def track_import_and_first_sample(self, layout):
        code = _code(IMPORT_AND_FIRST_SAMPLE, layout)
        return statistics.median(_run(code) for _ in range(self.runs))

    def track_overhead_over_import_numba(self, layout):
        """Median of the above minus median of ``import numba``, runs interleaved."""
        code = _code(IMPORT_AND_FIRST_SAMPLE, layout)
        ours, numba = [], []
        for _ in range(self.runs):
            ours.append(_run(code))
            numba.append(_run(IMPORT_NUMBA))
        return statistics.median(ours) - statistics.median(numba)

    def track_first_sample_only(self, layout):
        """Just the first ``sample(32)`` (numba already imported): loading the cached kernel."""
        code = _code(FIRST_SAMPLE_ONLY, layout)
        return statistics.median(_run(code) for _ in range(self.runs))


class ColdCompile:
    """First ``sample(32)`` with an empty kernel cache: the one-off JIT compile of a layout."""

    params = [["aos", "soa"]]
    param_names = ["layout"]
    unit = "seconds"
    runs = 3
    timeout = 600

    def setup(self, layout):
        _run(IMPORT_NUMBA)  # page cache warm: measure the compile, not the disk

    def track_first_sample_cold_cache(self, layout):
        code = _code(FIRST_SAMPLE_ONLY, layout)
        times = []
        for _ in range(self.runs):
            cache = tempfile.mkdtemp(prefix="tfdata-numba-cold-")
            try:
                times.append(_run(code, env={**os.environ, "NUMBA_CACHE_DIR": cache}))
            finally:
                shutil.rmtree(cache, ignore_errors=True)
        return statistics.median(times)
