from __future__ import annotations

import os
import time

import numpy as np
import pytest

import tfdata

LAYOUTS = ["aos", "soa"]
CARTPOLE = {
    "obs": ("f4", (4,)),
    "action": "i8",
    "reward": "f4",
    "next_obs": ("f4", (4,)),
    "terminated": "?",
    "truncated": "?",
}
# awkward widths: 1, 2, 3, 4, 8, 12 and 24 bytes, so every word-size path of the kernels runs
ODD = {
    "a": ("u1", (3,)),
    "b": "i2",
    "c": ("f4", (3,)),
    "d": "f8",
    "e": "?",
    "f": ("i8", (3,)),
    "g": "i4",
}


def pytest_configure(config):
    """With ``TFDATA_COUNT_COMPILES=<file>``, count the kernel specializations this session
    compiles and write them to ``<file>`` at its end (``experiments/compile_budget.py``)."""
    path = os.environ.get("TFDATA_COUNT_COMPILES")
    if path:
        import importlib.util

        source = os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments", "compile_budget.py")
        module_spec = importlib.util.spec_from_file_location("compile_budget", source)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        config._tfdata_compile_counter = (path, module.CompileCounter())


def pytest_unconfigure(config):
    path, counter = getattr(config, "_tfdata_compile_counter", (None, None))
    if counter is not None:
        counter.write(path)


def until(condition, seconds: float = 60) -> bool:
    """Poll ``condition`` until it holds; ``seconds`` only turns a hang into a failure."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


def same_state(a, b) -> None:
    """Two state dicts are equal: the same keys, arrays equal element for element."""
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            same_state(a[key], b[key])
        elif isinstance(a[key], np.ndarray):
            np.testing.assert_array_equal(a[key], b[key])
        else:
            assert a[key] == b[key], key


@pytest.fixture
def shm_dir(tmp_path, monkeypatch):
    """Shared regions of a test go to a directory of its own, so leftovers are visible and
    never shared."""
    d = tmp_path / "shm"
    d.mkdir()
    monkeypatch.setenv("TFDATA_SHM_DIR", str(d))
    return d


@pytest.fixture(params=LAYOUTS)
def layout(request):
    return request.param


@pytest.fixture(params=[CARTPOLE, ODD], ids=["cartpole", "odd"])
def spec(request):
    return tfdata.Spec(request.param)


def random_rows(spec: tfdata.Spec, n: int, rng: np.random.Generator, start: int = 0) -> dict:
    """n rows of exact dtypes; field values encode the row number where the dtype allows."""
    out = {}
    for f in spec:
        shape = (n,) + f.shape
        if f.dtype.kind == "b":
            out[f.name] = rng.random(shape) < 0.5
        elif f.dtype.kind in "iu":
            info = np.iinfo(f.dtype)
            out[f.name] = rng.integers(max(info.min, -1000), min(info.max, 1000), shape, dtype=f.dtype)
        else:
            out[f.name] = rng.standard_normal(shape).astype(f.dtype)
    return out


def row(batch: dict, i: int) -> dict:
    return {k: v[i] for k, v in batch.items()}


def assert_batches_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
        assert a[k].dtype == b[k].dtype, k


def traced_growth(call, calls: int, windows: int = 3) -> list:
    """``(current, peak)`` bytes tracemalloc saw grow over each of ``windows`` runs of ``calls``
    calls of ``call()``: allocation by ``call`` shows in every window, a one-off allocation of
    something else in the process (a finalizer, another test's thread) in one at most, so a
    test bounds the smallest."""
    import tracemalloc

    grown = []
    tracemalloc.start()
    try:
        for _ in range(windows):
            base, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            for _ in range(calls):
                call()
            current, peak = tracemalloc.get_traced_memory()
            grown.append((current - base, peak - base))
    finally:
        tracemalloc.stop()
    return grown


def sample_until_redraw(buf, check, rows: int = 640, seconds: float = 300) -> int:
    """Sample 64 rows at a time from a shared buffer being overwritten, checking each batch, until
    ``rows`` rows and at least one redraw of a torn row (capped at ``seconds``, not timed);
    returns the rows sampled."""
    sampled = 0
    deadline = time.monotonic() + seconds
    while (sampled < rows or buf.redraws == 0) and time.monotonic() < deadline:
        check(buf.sample(64))
        sampled += 64
    return sampled

