"""Import is cheap, compiles nothing, and survives a read-only install."""

from __future__ import annotations

import os
import shutil
import stat
import pathlib
import subprocess
import sys
import tempfile

import pytest

import tfdata

PKG = os.path.dirname(tfdata.__file__)


def run_py(code: str, env=None, cwd=None, user=None) -> str:
    full_env = dict(os.environ)
    full_env.pop("NUMBA_CACHE_DIR", None)
    full_env.update(env or {})
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env,
                         cwd=cwd, timeout=300, user=user)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_import_does_not_import_numba():
    out = run_py("import sys, tfdata; print('numba' in sys.modules)")
    assert out.strip() == "False"


def test_building_a_buffer_compiles_nothing():
    code = ("import tfdata\n"
            "b = tfdata.ReplayBuffer({'x': 'f4'}, 4)\n"
            "from tfdata.kernels import aos, soa, draw_indices\n"
            "print(sum(len(k.signatures) for k in (aos.gather, aos.sample_uniform, soa.gather,"
            " soa.sample_uniform, draw_indices)))\n")
    assert run_py(code).strip() == "0"


def test_read_only_package_falls_back_to_a_writable_cache():
    """A real read-only copy of the package, imported by a user who cannot write to it
    (as root, the child runs as 'nobody', since root ignores file permissions)."""
    user = None
    if os.geteuid() == 0:
        user = 65534
        try:  # the checkout may sit in a directory other users cannot enter
            ok = subprocess.run([sys.executable, "-c", "import numpy"], user=user,
                                capture_output=True, timeout=120).returncode == 0
        except PermissionError:
            ok = False
        if not ok:
            pytest.skip("this interpreter cannot be run by an unprivileged user here; "
                        "test_read_only_package_as_root_is_simulated covers the decision")
    base = tempfile.mkdtemp(prefix="tfdata-ro-")
    try:
        os.chmod(base, 0o777)
        _read_only_case(pathlib.Path(base), user)
    finally:
        for root, dirs, _ in os.walk(base):
            for d in dirs:
                os.chmod(os.path.join(root, d), 0o755)
        shutil.rmtree(base)


def test_read_only_package_as_root_is_simulated(tmp_path, monkeypatch):
    """As root, permissions do not stop writes; check the fallback decision itself."""
    from tfdata import _config

    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(_config.os, "access", lambda path, mode: not path.startswith(_config._PKG_DIR))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _config.cache_dir_fallback() == os.path.join(str(tmp_path), "tfdata", "numba")
    monkeypatch.setenv("NUMBA_CACHE_DIR", "/somewhere/the/user/chose")
    assert _config.cache_dir_fallback() is None


def test_user_cache_dir_wins_and_is_used(tmp_path):
    code = ("import tfdata, numpy as np\n"
            "b = tfdata.ReplayBuffer({'x': 'f4'}, 4, seed=0)\n"
            "b.push({'x': 1.0}); b.sample(1)\n")
    run_py(code, env={"NUMBA_CACHE_DIR": str(tmp_path)})
    cached = [f for _, _, files in os.walk(tmp_path) for f in files]
    assert any(f.endswith(".nbi") for f in cached)


def _read_only_case(tmp_path, user):
    site = tmp_path / "site"
    shutil.copytree(PKG, site / "tfdata", ignore=shutil.ignore_patterns("__pycache__"))
    for root, dirs, files in os.walk(site):
        for name in dirs + files:
            p = os.path.join(root, name)
            os.chmod(p, os.stat(p).st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    os.chmod(site, 0o555)
    os.makedirs(tmp_path / "xdg")
    os.chmod(tmp_path / "xdg", 0o777)
    code = ("import tfdata, os\n"
            "b = tfdata.ReplayBuffer({'x': 'f4'}, 4, seed=0)\n"
            "b.push({'x': 1.0}); print(b.sample(1)['x'][0]); print(os.environ['NUMBA_CACHE_DIR'])\n")
    out = run_py(code, env={"PYTHONPATH": str(site), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
                            "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(tmp_path)},
                 cwd=str(tmp_path), user=user)
    assert out.splitlines()[0] == "1.0"
    assert out.splitlines()[1].startswith(str(tmp_path / "xdg"))
