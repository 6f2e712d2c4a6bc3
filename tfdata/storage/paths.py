"""Paths: the checks before tfdata opens a path, and the directory operations every writer
shares (flushing a rename, removing only what tfdata named)."""

from __future__ import annotations

import os
import stat

from ..errors import FormatError


def _stat(path: str, follow: bool) -> os.stat_result:
    st = os.stat(path) if follow else os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise FormatError(f"{path}: is a symbolic link; tfdata does not follow links inside a "
                          f"dataset or checkpoint directory")
    return st


def check_regular(path: str, *, follow: bool = True, what: str = "file") -> os.stat_result:
    """Refuse (FormatError) anything at ``path`` that is not a regular file, before opening it.

    ``follow=False``: a symbolic link is refused too (files inside a dataset or checkpoint
    directory: a link could make tfdata read, or write, a file elsewhere). A FIFO, socket or
    device is refused without being opened (opening a FIFO blocks until a writer appears).
    FileNotFoundError if nothing is there.
    """
    st = _stat(path, follow)
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{path}: not a regular {what} (a directory, FIFO, socket or device)")
    return st


def check_directory(path: str, *, follow: bool = True) -> None:
    """Refuse (FormatError) anything at ``path`` that is not a directory (``follow=False``: or is a
    symbolic link to one)."""
    if not stat.S_ISDIR(_stat(path, follow).st_mode):
        raise FormatError(f"{path}: not a directory")


def fsync_dir(path: str) -> None:
    """Flush a directory's entries (a rename into it), where the file system allows it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def remove_names(path: str, names) -> None:
    """Delete the files ``names`` of the directory ``path``, then the directory if that left it
    empty. Never anything else: how tfdata removes what it made (a dataset moved aside, a
    shared region), so a file of the user's in the same directory survives."""
    for name in names:
        try:
            os.unlink(os.path.join(path, name))
        except OSError:
            pass
    try:
        os.rmdir(path)
    except OSError:
        pass
