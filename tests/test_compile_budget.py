"""The compile counter of ``experiments/compile_budget.py`` (``python3 dev.py compile``) counts
right: a kernel called with two argument types in a fresh process on an empty numba cache is
named with exactly two specializations, a numba function outside tfdata is not counted, and a
warm process loads what the cold one compiled. The pytest hook of ``tests/conftest.py``
(``TFDATA_COUNT_COMPILES``) writes the same counts for a session."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "experiments", "compile_budget.py")
KERNEL = "tfdata.kernels._columns:first_bad_slot"
PROBE_ENV = "TFDATA_COMPILE_BUDGET_PROBE"

# one tfdata kernel called with int64 and int32 slots (two specializations) and with arguments it
# cannot compile for (no specialization), and a numba function defined here, outside tfdata,
# which must not be counted
PROGRAM = f"""
import importlib.util, json, sys
import numpy as np
spec = importlib.util.spec_from_file_location("compile_budget", {SCRIPT!r})
budget = importlib.util.module_from_spec(spec)
spec.loader.exec_module(budget)
counter = budget.CompileCounter()
from numba import njit
from tfdata.kernels._columns import first_bad_slot

@njit
def not_tfdata(x):
    return x + 1

table = np.empty(16, np.int64)
assert first_bad_slot(np.arange(3, dtype=np.int64), 5, table) == -1
assert first_bad_slot(np.array([0, 2, 2], dtype=np.int32), 5, table) == 5
assert first_bad_slot(np.arange(4, dtype=np.int64), 5, table) == -1  # no third specialization
try:
    first_bad_slot(np.arange(3, dtype=np.float64), 5, "not an array")  # a compile that fails
except Exception as e:
    assert type(e).__name__ == "TypingError", e
else:
    raise AssertionError("compiled")
not_tfdata(1)
print(json.dumps(counter.result()))
"""


def _env(cache_dir, **extra) -> dict:
    env = dict(os.environ)
    env.pop("TFDATA_COUNT_COMPILES", None)  # a suite being counted must not count this process
    env.update(NUMBA_CACHE_DIR=str(cache_dir), **extra)
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _run(cache_dir) -> dict:
    out = subprocess.run([sys.executable, "-c", PROGRAM], env=_env(cache_dir), capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_counter_names_the_kernel_with_its_two_specializations(tmp_path):
    cache = tmp_path / "numba"
    cold = _run(cache)
    assert cold["by_kernel"] == {KERNEL: 2}, cold["by_kernel"]
    assert cold["specializations"] == 2 and cold["kernels"] == 1
    assert cold["uncached_by_kernel"] == {}  # the kernel has cache=True
    assert cold["compiles_by_kernel"] == {KERNEL: 2}  # both compiled here, nothing else of tfdata
    assert cold["failed_compiles"] == 1 and cold["nested_compiles"] == 0
    assert cold["cache_files"] == 2
    assert cold["compile_wall_s"] > 0 and cold["compile_self_s_by_kernel"][KERNEL] > 0

    warm = _run(cache)  # loads both from the cache the cold process wrote
    assert warm["by_kernel"] == {KERNEL: 2}
    assert warm["compiles"] == 0 and warm["compiles_by_kernel"] == {}
    assert warm["cache_files"] == 2


def test_probe_for_the_pytest_hook():
    """Run by the next test in a pytest of its own; skipped in the suite."""
    if os.environ.get(PROBE_ENV) != "1":
        pytest.skip("runs inside test_pytest_hook_writes_the_session_counts")
    from tfdata.kernels._columns import first_bad_slot

    table = np.empty(16, np.int64)
    assert first_bad_slot(np.arange(3, dtype=np.int64), 5, table) == -1
    assert first_bad_slot(np.arange(3, dtype=np.int32), 5, table) == -1


def test_pytest_hook_writes_the_session_counts(tmp_path):
    counts = tmp_path / "counts.json"
    env = _env(tmp_path / "numba", **{PROBE_ENV: "1", "TFDATA_COUNT_COMPILES": str(counts)})
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          f"{__file__}::test_probe_for_the_pytest_hook"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(counts.read_text())
    assert result["by_kernel"] == {KERNEL: 2}, result["by_kernel"]
    assert result["compiles"] == 2 and result["cache_files"] == 2
