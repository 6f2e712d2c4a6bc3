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
