"""Datasets on disk: reading, writing, creating and converting tfdata's files.

The public face of :mod:`tfdata.storage.files` (the file formats, mapping, :class:`Writer`,
:func:`save`, :func:`create`) plus :func:`convert`, which streams one dataset into another and
so sits above both (in :mod:`tfdata.dataset`). See :mod:`tfdata.storage.files` for the formats
and the rules every call that writes follows.
"""

from __future__ import annotations

from .dataset import convert
from .storage.files import *  # noqa: F403
from .storage.files import __all__ as _files_all

__all__ = [*_files_all, "convert"]
