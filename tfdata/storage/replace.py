"""Creating and replacing dataset paths.

The rule (ARCHITECTURE.md, "Nothing is lost"): no call deletes or truncates a path it did not
create, unless the path is a tfdata artifact of the same kind and the caller asked to
overwrite it. Everything is written under a temporary name this call creates exclusively beside
the target, then renamed into place; a process that has the old file mapped keeps its inode, so
replacing a dataset never takes the pages from under a reader (truncating it did: SIGBUS).
"""

from __future__ import annotations

import os
import tempfile

from ..errors import FormatError
from ..spec import Spec
from .layout import resolve_layout
from .manifest import MANIFEST, directory_files, read_group_manifest, read_manifest
from .npy import read_npy_header
from .paths import check_directory, check_regular, fsync_dir, remove_names


def dataset_layout(layout, spec: Spec):
    """The layout of a dataset file: ``"aos"``, ``"soa"`` or a grouping normalised for ``spec``
    (:func:`tfdata.storage.resolve_layout`; no default here: ValueError for None)."""
    if layout is None or (isinstance(layout, str) and layout not in ("aos", "soa")):
        raise ValueError(f"layout: expected 'aos', 'soa' or a list of groups (lists of field "
                         f"names), got {str(layout)[:100]!r}")
    return resolve_layout(layout, spec)


def _kind(layout) -> str:
    return layout.upper() if isinstance(layout, str) else "grouped"


def check_replaceable(path: str, layout, overwrite: bool) -> bool:
    """Whether ``path`` exists, refusing (FileExistsError) what may not be replaced.

    An existing path may be replaced only with ``overwrite=True`` and only if it is a dataset of
    the same kind: for ``"aos"`` a regular file (not a link) with a readable NPY header of a 1-D
    structured array; for ``"soa"`` (a grouping) a directory (not a link) with a valid SoA
    (grouped, of any grouping) manifest that holds nothing but the manifest and the files it
    names.
    """
    if not os.path.lexists(path):
        return False
    if not overwrite:
        raise FileExistsError(f"{path}: exists; tfdata replaces a path only when asked "
                              f"(overwrite=True), and only a tfdata dataset of the same layout")
    try:
        if layout == "aos":
            h = read_npy_header(path, allow_tail=True, follow=False)
            if h.dtype.names is None or len(h.shape) != 1:
                raise FormatError(f"{path}: holds {h.dtype}{list(h.shape)}, not a 1-D record array")
        else:
            check_directory(path, follow=False)
            files = ([f for _, f in read_manifest(path)[1]] if layout == "soa"
                     else [f for f, _, _ in read_group_manifest(path)[3]])
            known = {MANIFEST, MANIFEST + ".tmp"} | {os.path.basename(f) for f in files}
            extra = sorted(set(os.listdir(path)) - known)
            if extra:
                raise FormatError(f"{path}: holds files that are not part of the dataset "
                                  f"({', '.join(extra[:5])}{', ...' if len(extra) > 5 else ''})")
            for f in files:
                if os.path.lexists(f):
                    check_regular(f, follow=False)
    except (FormatError, OSError) as exc:
        raise FileExistsError(f"{path}: exists and is not a tfdata {_kind(layout)} dataset, so "
                              f"it is not replaced ({exc})") from None
    return True


def _remove_dataset_dir(path: str) -> None:
    """Delete a dataset directory this module checked (``check_replaceable``) and moved aside:
    its manifest and the files it names, then the directory if nothing else is left."""
    try:
        names = [os.path.basename(f) for f in directory_files(path)]
    except (FormatError, OSError):
        names = []
    remove_names(path, names + [MANIFEST, MANIFEST + ".tmp"])


class Staged:
    """A new dataset written under a temporary name beside ``path`` (made exclusively by this
    object: ``mkstemp`` / ``mkdtemp``, a dot name), then renamed into place by :meth:`publish`.
    :meth:`discard` removes the temporary name and nothing else."""

    def __init__(self, path: str, layout, overwrite: bool, what: str = "dataset"):
        self.path = path
        self.layout = layout
        self.overwrite = overwrite
        check_replaceable(path, layout, overwrite)
        parent = os.path.dirname(os.path.abspath(path))
        self.parent = parent
        prefix = "." + os.path.basename(os.path.abspath(path))[:100] + "."
        if layout != "aos":  # a directory
            self.tmp = tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=parent)
        else:
            fd, self.tmp = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=parent)
            os.close(fd)

    def publish(self) -> None:
        """Rename the new dataset into place (replacing the old one only as checked)."""
        if self.tmp is None:
            return
        path, tmp = self.path, self.tmp
        if check_replaceable(path, self.layout, self.overwrite):  # again: it may have appeared
            if self.layout == "aos":
                os.replace(tmp, path)
            else:  # a directory cannot replace a non-empty one: move the old one aside first
                aside = tempfile.mkdtemp(prefix="." + os.path.basename(os.path.abspath(path))[:100]
                                         + ".", suffix=".old", dir=self.parent)
                os.rename(path, aside)  # onto the empty directory just made
                os.rename(tmp, path)
                _remove_dataset_dir(aside)
        else:
            os.rename(tmp, path)
        self.tmp = None
        fsync_dir(self.parent)

    def discard(self) -> None:
        """Remove the temporary name (a file, or a directory and the files written into it)."""
        tmp, self.tmp = self.tmp, None
        if tmp is None:
            return
        try:
            if self.layout != "aos":
                for name in os.listdir(tmp):  # only this object's writers wrote here
                    os.unlink(os.path.join(tmp, name))
                os.rmdir(tmp)
            else:
                os.unlink(tmp)
        except OSError:
            pass
