"""The project's own files: extras that can never pull a CUDA build of torch."""

from __future__ import annotations

import os
import re

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = None

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# packages that depend on torch without pinning it: beside them the extra must pin torch itself
TORCH_DEPENDENTS = ("stable-baselines3", "torchrl", "tensordict", "torchvision")


def _extras() -> dict:
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].lower()


def test_torch_is_always_pinned_to_the_cpu_build():
    extras = _extras()
    for extra, reqs in extras.items():
        names = {_name(r): r for r in reqs}
        needs_pin = "torch" in names or any(d in names for d in TORCH_DEPENDENTS)
        if needs_pin:
            assert names.get("torch", "").replace(" ", "") == "torch==2.13.0", (
                f"extra {extra!r}: {reqs} can resolve torch to a CUDA build; pin torch==2.13.0 in it")


def test_runtime_dependencies_are_only_numpy_numba_psutil():
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    assert sorted(_name(d) for d in deps) == ["numba", "numpy", "psutil"]


def test_dev_script_installs_the_dqn_extra():
    with open(os.path.join(ROOT, "dev.py"), encoding="utf-8") as f:
        text = f.read()
    extras = re.search(r'EXTRAS = "([^"]+)"', text).group(1).split(",")
    assert set(extras) <= set(_extras()), extras
    assert "dqn" in extras  # the main job runs experiments/dqn_cartpole.py
    assert "ppo" in extras  # ... and experiments/ppo_cartpole.py


def test_ppo_extra_brings_a_gymnasium_with_autoreset_modes():
    """experiments/ppo_cartpole.py builds its vector env with autoreset_mode=SAME_STEP (gymnasium 1.1+)."""
    reqs = {_name(r): r for r in _extras()["ppo"]}
    assert set(reqs) == {"gymnasium", "torch"}
    assert reqs["gymnasium"].replace(" ", "") == "gymnasium>=1.1"


def test_dev_script_installs_the_ray_extra_without_torch():
    """CI runs the Ray tests (TFDATA_REQUIRE_RAY=1): dev.py installs the extra, and the extra
    brings no torch dependent that could pull a CUDA build."""
    with open(os.path.join(ROOT, "dev.py"), encoding="utf-8") as f:
        extras = re.search(r'EXTRAS = "([^"]+)"', f.read()).group(1).split(",")
    assert "ray" in extras
    names = {_name(r) for r in _extras()["ray"]}
    assert names == {"ray"}
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        assert "TFDATA_REQUIRE_RAY=1" in f.read()
