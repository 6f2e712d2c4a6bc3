"""The release: ``python -m build`` makes an sdist and a wheel of the version in
``tfdata.__version__`` (the one place it is written), the wheel holds the package and nothing
else, and it installs into a clean virtual environment where the kernels compile and sample.

The build runs on a copy of the tracked files, so nothing is written into the checkout."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

import tfdata

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tracked(dst: str) -> None:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in out.decode().split("\0"):
        src = os.path.join(ROOT, rel)
        if rel and os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dst, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dst, rel))


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    if not os.path.exists(os.path.join(ROOT, ".git")):  # a directory, or a file in a worktree
        pytest.skip("not a git checkout: the tracked files are what is released")
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    _tracked(str(src))
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--sdist", "--wheel",
                    "--outdir", str(out), str(src)], check=True, capture_output=True)
    return out


def test_one_version_in_the_changelog_the_package_and_the_files_built(dist):
    v = tfdata.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", v)
    names = sorted(os.listdir(dist))
    assert names == [f"tfdata-{v}-py3-none-any.whl", f"tfdata-{v}.tar.gz"], names
    with open(os.path.join(ROOT, "CHANGELOG.md"), encoding="utf-8") as f:
        releases = re.findall(r"^## (\d+\.\d+\.\d+) - \d{4}-\d{2}-\d{2}$", f.read(), re.M)
    assert releases and releases[0] == v, releases  # the newest release is this version
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        toml = tomllib.load(f)
    # written once: pyproject reads tfdata.__version__
    assert "version" not in toml["project"] and "version" in toml["project"]["dynamic"]
    assert toml["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "tfdata.__version__"}


def test_the_wheel_holds_the_package_and_nothing_else(dist):
    v = tfdata.__version__
    with zipfile.ZipFile(os.path.join(dist, f"tfdata-{v}-py3-none-any.whl")) as z:
        names = z.namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"tfdata", f"tfdata-{v}.dist-info"}, top
    assert not [n for n in names if "__pycache__" in n or n.endswith((".pyc", ".nbi", ".nbc"))]
    tracked = subprocess.run(["git", "ls-files", "tfdata"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    assert sorted(n for n in names if n.startswith("tfdata/")) == sorted(tracked)
    meta = [n for n in names if n.endswith("METADATA")]
    with zipfile.ZipFile(os.path.join(dist, f"tfdata-{v}-py3-none-any.whl")) as z:
        text = z.read(meta[0]).decode()
    assert f"Version: {v}" in text
    requires = sorted(re.findall(r"^Requires-Dist: ([A-Za-z0-9_.-]+)[^;\n]*$", text, re.M))
    assert requires == ["numba", "numpy", "psutil"], requires  # the rest only in extras


def test_the_sdist_holds_the_sources_and_no_build_artifacts(dist):
    v = tfdata.__version__
    with tarfile.open(os.path.join(dist, f"tfdata-{v}.tar.gz")) as t:
        names = [n.split("/", 1)[1] for n in t.getnames() if "/" in n]
    for need in ("pyproject.toml", "README.md", "tfdata/__init__.py", "tfdata/kernels/_episodes.py"):
        assert need in names, need
    assert not [n for n in names if "__pycache__" in n or n.startswith((".asv/", "build/"))]


def test_the_wheel_installs_into_a_clean_venv_and_samples(dist, tmp_path):
    """A new virtual environment (no site packages), the wheel and its three dependencies:
    import, build a buffer, write, sample (the kernels compile there)."""
    v = tfdata.__version__
    venv = tmp_path / "venv"
    # nothing of this checkout on the path (pip would find tfdata there and install nothing)
    env = {k: val for k, val in os.environ.items() if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR")}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                    os.path.join(dist, f"tfdata-{v}-py3-none-any.whl")], check=True, env=env,
                   cwd=str(tmp_path))
    code = (
        "import importlib.metadata as m, os, numpy as np, tfdata\n"
        "assert os.path.dirname(tfdata.__file__).startswith(os.path.realpath(os.environ['VENV']))\n"
        "assert tfdata.__version__ == m.version('tfdata') == os.environ['V']\n"
        "spec = tfdata.Spec({'obs': ('f4', (4,)), 'action': 'i8', 'reward': 'f4',"
        " 'terminated': '?', 'truncated': '?'})\n"
        "for layout in ('aos', 'soa'):\n"
        "    b = tfdata.ReplayBuffer(spec, 100, layout=layout, seed=0)\n"
        "    rows = {k: np.zeros((50,) + f.shape, f.dtype) for k, f in zip(spec.names, spec)}\n"
        "    rows['action'][:] = np.arange(50)\n"
        "    b.extend(rows)\n"
        "    s = b.sample(32)\n"
        "    assert s['action'].shape == (32,) and (s['action'] < 50).all()\n"
        "print('ok')\n")
    env.update(VENV=str(venv), V=v)
    out = subprocess.run([py, "-c", code], cwd=str(tmp_path), env=env, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
