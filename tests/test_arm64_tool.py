"""``python3 dev.py arm64`` (tools/arm64.py): the parts that can be checked without building a root.

The command itself needs root, debootstrap and qemu and takes minutes; it is run by hand (its
output is quoted where the determinism check is discussed, docs/design/determinism.md).
"""

from __future__ import annotations

import importlib.util
import os
import struct
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def arm64():
    spec = importlib.util.spec_from_file_location("arm64_tool", os.path.join(ROOT, "tools", "arm64.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _binfmt_fields(line: str) -> dict:
    name, kind, offset, magic, mask, interpreter, flags = line[1:].split(":")
    decode = lambda s: bytes(s.encode("ascii").decode("unicode_escape"), "latin-1")  # noqa: E731
    return {"name": name, "kind": kind, "offset": offset, "magic": decode(magic), "mask": decode(mask),
            "interpreter": interpreter, "flags": flags}


def _elf_header(machine: int, e_type: int = 2, klass: int = 2, data: int = 1) -> bytes:
    ident = b"\x7fELF" + bytes([klass, data, 1, 0]) + bytes(8)
    return ident + struct.pack("<HH", e_type, machine)


def _matches(fields: dict, header: bytes) -> bool:
    magic, mask = fields["magic"], fields["mask"]
    return all((h & m) == (g & m) for h, g, m in zip(header[:len(magic)], magic, mask))


def test_binfmt_line_matches_aarch64_executables_only(arm64):
    f = _binfmt_fields(arm64.BINFMT_LINE)
    assert f["kind"] == "M" and f["offset"] == "" and len(f["magic"]) == len(f["mask"]) == 20
    assert "F" in f["flags"]  # the interpreter is opened at registration: a chroot needs no copy
    assert f["interpreter"].endswith("qemu-aarch64-static")
    assert _matches(f, _elf_header(183))            # EM_AARCH64, an executable
    assert _matches(f, _elf_header(183, e_type=3))  # a position-independent one
    assert not _matches(f, _elf_header(62))         # x86-64
    assert not _matches(f, _elf_header(40))         # 32-bit ARM's machine number
    assert not _matches(f, _elf_header(183, klass=1))  # a 32-bit ELF
    assert not _matches(f, _elf_header(183, data=2))   # big-endian
    assert not _matches(f, _elf_header(183, e_type=1))  # a relocatable object


def test_subset_names_existing_test_files(arm64):
    assert len(set(arm64.SUBSET)) == len(arm64.SUBSET)
    for path in arm64.SUBSET:
        assert os.path.isfile(os.path.join(ROOT, path)), path
    # the determinism check is part of every emulated run
    assert "tests/test_determinism.py" in arm64.SUBSET


def test_the_root_needs_only_what_tfdata_and_its_tests_import(arm64):
    assert {"numpy", "numba", "llvmlite", "psutil", "pytest", "hypothesis"} <= set(arm64.PACKAGES)
    assert not {"torch", "ray"} & set(arm64.PACKAGES)  # no aarch64 build pinned here: tests skip


def test_copied_files_are_the_tracked_ones(arm64):
    files = set(arm64.tracked_files())
    for needed in ("tfdata/__init__.py", "tests/determinism.py", "tests/fixtures/determinism/golden.json",
                   "pyproject.toml"):
        assert needed in files
    assert not any(p.endswith((".nbi", ".nbc", ".pyc")) for p in files)


def test_default_root_is_outside_the_checkout(arm64):
    assert not os.path.abspath(arm64.DEFAULT_ROOT).startswith(ROOT + os.sep)


def test_dev_py_names_the_command():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "dev.py")], capture_output=True, text=True)
    assert out.returncode != 0 and "dev.py arm64" in out.stderr


def test_subset_covers_every_family_the_emulated_run_must_check(arm64):
    """Core sampling on every layout (column groups included), prioritized, n-step (episodes), frames, checkpoints,
    rollouts and GAE, the nn kernels of DQN, PPO and SAC."""
    for name in ("test_buffer", "test_groups", "test_kernels", "test_prioritized", "test_episodes", "test_frames",
                 "test_checkpoint", "test_rollout", "test_nn", "test_nn_ppo", "test_nn_sac"):
        assert f"tests/{name}.py" in arm64.SUBSET, name


def test_emulated_is_the_host_machine_not_aarch64(arm64, monkeypatch):
    for machine, emulated in (("x86_64", True), ("aarch64", False), ("arm64", False)):
        monkeypatch.setattr(arm64.platform, "machine", lambda m=machine: m)
        assert arm64.emulated() is emulated, machine


@pytest.mark.parametrize("text,flags", [("enabled\ninterpreter /usr/bin/qemu-aarch64-static\nflags: F\n", "F"),
                                        ("enabled\ninterpreter /usr/bin/qemu-aarch64-static\nflags: OC\n", "OC"),
                                        ("disabled\ninterpreter /usr/bin/qemu-aarch64-static\nflags: F\n", None),
                                        (None, None)])
def test_binfmt_flags_of_an_enabled_registration_only(arm64, monkeypatch, tmp_path, text, flags):
    monkeypatch.setattr(arm64, "BINFMT", str(tmp_path))
    if text is not None:
        (tmp_path / "qemu-aarch64").write_text(text)
    assert arm64._binfmt_flags() == flags


def _no_debootstrap(monkeypatch, arm64):
    calls = []
    monkeypatch.setattr(arm64.subprocess, "call", lambda cmd, *a, **k: calls.append(cmd) or 1)
    return calls


def test_a_root_it_did_not_build_is_refused_and_left(arm64, monkeypatch, tmp_path):
    calls = _no_debootstrap(monkeypatch, arm64)
    root = tmp_path / "root"
    root.mkdir()
    (root / "mine").write_text("keep")
    with pytest.raises(SystemExit, match="not a root this command built"):
        arm64.ensure_root(str(root))
    assert (root / "mine").read_text() == "keep" and not calls
    (root / arm64.STAMP).write_text("debootstrap ...\n")  # one it built: used as it is
    arm64.ensure_root(str(root))
    assert not calls and (root / "mine").exists()


def test_an_unfinished_root_is_removed_only_when_this_command_made_it(arm64, monkeypatch, tmp_path):
    calls = _no_debootstrap(monkeypatch, arm64)
    root = tmp_path / "root"
    partial = tmp_path / "root.partial"
    partial.mkdir()
    (partial / "mine").write_text("keep")
    with pytest.raises(SystemExit, match="was not made by this command"):
        arm64.ensure_root(str(root))
    assert (partial / "mine").read_text() == "keep" and not calls and not root.exists()
    (partial / (arm64.STAMP + ".building")).write_text("debootstrap in progress\n")  # its own: started again
    with pytest.raises(SystemExit, match="debootstrap failed"):
        arm64.ensure_root(str(root))
    assert not (partial / "mine").exists() and calls and calls[0][0] == "debootstrap"
    assert not root.exists()  # never renamed into place unfinished
