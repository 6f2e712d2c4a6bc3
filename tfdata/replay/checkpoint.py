"""Checkpoints of replay buffers: a directory other tools can read, written without a second copy.

Layout of a checkpoint directory (format ``tfdata.checkpoint`` 1.0)::

    state.json        format, version, buffer class and constructor config (the sampler's name
                      and options among it), spec, writer cursor and size, each part's state:
                      the sampler's RNG seed and counter and what it keeps (under its name), the
                      scalars of the episode bookkeeping, of the frame stacks, of the rate
                      limiter, the row count of each field's running statistics; arrays are
                      {"$array": "arrays/<name>.npy"}
    arrays/*.npy      per-slot arrays: episode numbers, priorities (leaves), write versions, ...;
                      and the statistics of each ``stats=`` field (mean, var, min, max: float64
                      of the field's shape)
    rows.npy | rows/  the first ``size`` physical rows of the storage, as a tfdata dataset file
                      in the buffer's layout (AoS ``.npy``, SoA directory, or for column groups a
                      grouped directory of the stored fields' grouping)

This module knows the directory format, the array encoding and the generic checks of JSON
values (:class:`_Checker`: types and bounds, every failure a FormatError naming the file and the
field; :class:`_Arrays`: bounded reads of ``.npy`` files). What each part saves and how it is
checked is the part's: the sampler's config and state its class's
(:mod:`tfdata.replay.samplers`: ``from_config`` and ``check_state``), the episode bookkeeping's,
the frame stacks', the rate limiter's and the running statistics' their modules' ``read_*``
functions (:mod:`tfdata.replay.episodes`, :mod:`tfdata.replay.frames`,
:mod:`tfdata.replay.limiter`, :mod:`tfdata.replay.columns`).

Saving
------
Saving holds the buffer's lock and streams the rows from the storage into the file in chunks
of at most 16 MiB (AoS records are written straight from the storage's memory), so the peak
memory of a save is the buffer plus one chunk. A sampler is saved by its ``name`` and
``config()`` (absent: the buffer's default sampler, uniform for a ``ReplayBuffer``); one without
a name, or with the name of one of tfdata's samplers but another class, is refused (TypeError,
before any file is written).

*Nothing that is not a checkpoint is ever replaced or deleted.* An existing ``path`` is refused
(``FileExistsError``) unless ``overwrite=True`` and ``path`` is a checkpoint directory: a real
directory (not a link) whose ``state.json`` is a ``tfdata.checkpoint`` document and which holds
nothing but checkpoint files (``state.json``, the ``arrays/*.npy`` it names, ``rows.npy`` or
``rows/`` with its manifest and the field files the manifest names), each a regular file. Any
other file in it (a project directory with sources, a file at ``path``) makes the save refuse and
leaves ``path`` untouched.

The new checkpoint is written into a directory this call creates exclusively beside ``path``
(``tempfile.mkdtemp``, a dot name); every file is flushed (``fsync``) and so are the directories.
Then an existing checkpoint is renamed aside to a second name this call creates, the new one is
renamed into place, the parent directory is flushed, and the old one is deleted file by file,
only after checking again that it holds nothing but checkpoint files (if it does not, it is left
under its dot name, with a warning). A failure at any point before the rename removes only the
temporary directory and leaves ``path`` as it was. No other name is ever deleted (earlier
versions removed ``path + ".tmp-checkpoint"`` and ``path + ".old-checkpoint"``: no longer).

Loading
-------
A checkpoint is untrusted input. Nothing read from it reaches a constructor, an allocation size
or a path before it is checked, and every problem is a :class:`~tfdata.errors.FormatError`
naming the file and the field (only a missing ``path`` or ``state.json`` is
``FileNotFoundError``). Checked, in this order, before anything is allocated:

* files: ``state.json``, ``arrays/``, each array file, ``rows.npy`` or ``rows/`` and every entry
  of ``rows/`` and ``arrays/`` must be a regular file (or directory), never a symbolic link, a
  FIFO or a device (checked with ``lstat`` before opening; array files are opened with
  ``O_NOFOLLOW | O_NONBLOCK``, so a FIFO cannot block the load);
* ``state.json``: at most 8 MiB, standard JSON (no NaN or Infinity, integers of at most 40
  digits), nested no deeper than the format needs (deeper is a FormatError, never a
  RecursionError); exactly the keys of the format at every level;
* the class and the sampler: the class one of the allow-list :func:`load` is given; the sampler
  ``config.sampler`` names (absent: the class's default; the default named is refused) one of
  tfdata's or one of the classes given to ``load(path, samplers=[...])``, an allow-list too (a
  checkpoint never makes tfdata import or call anything else); any other name is a FormatError
  saying how to pass its class. The state holds exactly the sampler part of that sampler (its
  name, for a sampler that keeps more than its RNG): a state saved with another sampler is
  refused naming both samplers, and ``PrioritizedReplayBuffer.load`` of a ``ReplayBuffer``
  raises TypeError, before anything is built;
* ``config``: exact JSON types (a bool is not an int): ``capacity`` int in ``[1, 2**32 - 1]``;
  ``layout`` ``"aos"``, ``"soa"`` or a grouping of the spec's fields in normal form (a list of
  at most as many lists as there are fields, each field exactly once, by name, groups in spec
  order within: :func:`tfdata.storage.check_layout`, which names an unknown or repeated field);
  ``ring_size`` int in ``[1, 64]``; ``num_envs`` int ``>= 1`` dividing ``capacity``; ``n_step``
  null or int in ``[1, max(capacity, 1024)]``; ``gamma`` float in ``[0, 1]``; ``next_of`` and
  ``roles`` objects of field names (roles: ``reward``, ``terminated``, ``truncated``);
  ``elide_next`` bool; ``stats`` (present only for a buffer that keeps statistics),
  ``frame_stack`` and ``frame_padding``, ``rate_limiter``: as their parts read them. Every
  other key is the sampler's, checked by its class's ``from_config`` (exactly its options:
  ``replays``, ``policy``, ``timeout`` for exactly-k; ``alpha``, ``beta``, ``beta_final``,
  ``beta_steps``, ``eps`` for a ``PrioritizedReplayBuffer``). ``spill_path``, ``hot_rows``,
  ``hot_bytes``, ``allocator`` and ``memory_budget`` are refused: *loading never writes outside
  the checkpoint directory* (where a buffer spills is the caller's choice, through the keywords
  of :func:`load`);
* spec: at most 32 dimensions per field, each in ``[1, 2**31 - 1]``, at most ``2**31 - 1``
  bytes per row, dtype strings in numpy's canonical form of a bool or numeric type, names
  non-empty strings of at most 1024 characters;
* state: capacity, layout (normalised) and num_envs equal the config's; writer ``size`` in
  ``[0, capacity]`` and a multiple of num_envs, ``cursor`` in ``[0, capacity)``, a multiple of
  num_envs (but for a sampler whose writes are placed off stream order: exactly-k) and equal to
  ``size`` until the ring is full; sampler ``seed`` and ``counter`` in ``[0, 2**64 - 1]``; the
  sampler's part (top-level values are JSON values or arrays, which hold at most
  :data:`~tfdata.replay.samplers.STATE_BYTES_PER_SLOT` bytes per slot in all, plus
  :data:`~tfdata.replay.samplers.STATE_BYTES_BASE`, from the headers)
  checked by the sampler ``from_config`` built (``check_state``: bounds, dtypes and shapes,
  against its config and the rows held); the episode bookkeeping, the frame stacks, the rate
  limiter's counts and the statistics by their parts;
* arrays: each header is read with :func:`tfdata.io.read_npy_header` (no pickle) and must have
  exactly the dtype and shape the state needs (episode numbers ``uint32[size]``, ...) before its
  data is read;
* rows: the dataset's fields equal the spec's and it holds ``size`` rows;
* memory: without a ``memory_budget``, the bytes the buffer would hold
  (:meth:`ReplayBuffer.plan_memory`, with the ``spill_path`` / ``hot_rows`` / ``hot_bytes``
  given to :func:`load`) must fit the memory available on the machine (FormatError): a
  checkpoint of a few kilobytes cannot make a load allocate more than the machine has. A
  ``memory_budget`` given to :func:`load` is the caller's limit: the constructor refuses a plan
  over it with :class:`~tfdata.MemoryBudgetError`, before allocating.

Then the buffer is built, the rows are mapped and copied in 16 MiB chunks (releasing each
chunk's pages), and ``load_state_dict`` validates again before a byte of the buffer is
written. Last, once the rows are in memory, the episode numbers must be what inserting those
rows gave, the elided-next bookkeeping and the frame stacks' depths must agree with the rows'
episode ends (:class:`tfdata.replay.episodes.EpisodeOrder`,
:func:`tfdata.replay.frames.check_order`), and each saved statistic must equal its
recomputation from the rows bit for bit (:func:`tfdata.replay.columns.compare_state`);
otherwise the new buffer is dropped and FormatError raised. A checkpoint written before
statistics existed (no ``config.stats``) loads without them, or with those asked for by
``load(path, stats=[...])``, computed from the rows. No pickle anywhere: JSON and ``.npy`` read
by tfdata's own header check.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import stat
import tempfile
import warnings

import numpy as np

from ..errors import FormatError, SharedBufferError, SpecError
from ..spec import Field, Spec
from ..storage import check_layout, file_name, storage_nbytes
from ..storage.files import fsync_dir
from . import columns, episodes, frames as frame_stacks, limiter
from .samplers import (RNG_KEYS, STATE_BYTES_BASE, STATE_BYTES_PER_SLOT, StateError,
                       shown as _show, state_key)
from .samplers.exactly_k import OPTIONS as _EXACTLY_K_KEYS, ExactlyKSampler
from .samplers.prioritized import OPTIONS as _PRIORITIZED_KEYS, PrioritizedSampler, read_scalars
from .samplers.prioritized import leaves32 as _leaves32
from .samplers.without_replacement import read_undrawn as _read_undrawn
from .state import STATE_FORMAT, STATE_KEYS

FORMAT = "tfdata.checkpoint"
VERSION = (1, 0)
_STATE = "state.json"
_ARRAYS = "arrays"
_SAFE = re.compile(r"^arrays/[A-Za-z0-9_][A-Za-z0-9_.\-]*\.npy$")
_SAFE_STEM = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,150}$")
#: Largest ``state.json`` accepted: the arrays are separate files, so a state holds the spec,
#: the config and a few scalars (about 100 bytes per field).
STATE_LIMIT = 8 << 20
#: Largest ``ring_size`` accepted from a checkpoint. A buffer allocates ``ring_size`` output
#: batches at the first sample of each batch size; the default is 2, and a larger ring only
#: lets a batch live longer. A checkpoint of a few kilobytes must not make the first sample
#: allocate gigabytes.
MAX_RING_SIZE = 64
MAX_CAPACITY = (1 << 32) - 1
#: ``n_step`` accepted from a checkpoint: at most ``max(capacity, MAX_SHORT_N_STEP)``.
MAX_SHORT_N_STEP = 1024
_U64 = (1 << 64) - 1
_MAX_NDIM = 32
_MAX_DIM = (1 << 31) - 1
_MAX_ROW_BYTES = (1 << 31) - 1
_MAX_NAME = 1024
_MAX_INT_DIGITS = 40
_DTYPE = re.compile(r"^[<>|=][biufc][0-9]{1,2}$")
# the buffer's own config keys (every other key is its sampler's), and those a checkpoint of an
# earlier version may lack
_CONFIG_KEYS = ("capacity", "layout", "ring_size", "num_envs", "n_step", "gamma", "next_of",
                "elide_next", "roles")
_CONFIG_OPTIONAL = ("stats", "sampler", "rate_limiter", "frame_stack", "frame_padding")
_OVERRIDES = ("spill_path", "hot_rows", "hot_bytes", "allocator", "memory_budget")


# -- files -------------------------------------------------------------------------------------


def _lstat(path: str, missing: str | None = None) -> os.stat_result:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        raise FormatError(f"{path}: missing{missing or ''}") from None


def _regular(path: str) -> os.stat_result:
    """Refuse a link, FIFO, device, socket or directory at ``path`` (FormatError), unopened."""
    st = _lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise FormatError(f"{path}: is a symbolic link; a checkpoint holds no links (tfdata never "
                          f"follows one out of a checkpoint directory)")
    if not stat.S_ISREG(st.st_mode):
        raise FormatError(f"{path}: not a regular file (a directory, FIFO, socket or device)")
    return st


def _directory(path: str) -> None:
    st = _lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise FormatError(f"{path}: is a symbolic link; a checkpoint holds no links (tfdata never "
                          f"follows one out of a checkpoint directory)")
    if not stat.S_ISDIR(st.st_mode):
        raise FormatError(f"{path}: not a directory")


def _open_regular(path: str):
    """``path`` opened for reading, refused unless a regular file: no link is followed and a FIFO
    does not block (``O_NONBLOCK``); the type is checked again on the open descriptor."""
    _regular(path)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise FormatError(f"{path}: cannot be opened ({exc.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FormatError(f"{path}: not a regular file")
    return os.fdopen(fd, "rb")


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise ValueError(f"integer of {len(text)} digits")
    return int(text)


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


def _read_state(spath: str) -> dict:
    """The JSON object in ``state.json``, bounded in size and nesting; FileNotFoundError if
    there is none (the directory is not a checkpoint), FormatError for anything else wrong."""
    if not os.path.lexists(spath):
        raise FileNotFoundError(f"{os.path.dirname(spath)}: not a tfdata checkpoint (no {_STATE})")
    with _open_regular(spath) as f:
        data = f.read(STATE_LIMIT + 1)
    if len(data) > STATE_LIMIT:
        raise FormatError(f"{spath}: larger than {STATE_LIMIT} bytes; not a checkpoint's state")
    try:
        doc = json.loads(data, parse_int=_parse_int, parse_constant=_no_constant)
    except RecursionError:  # deeper than the parser's stack: no state of ours is
        raise FormatError(f"{spath}: JSON nested too deeply; not a checkpoint's state") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{spath}: not valid JSON ({str(exc)[:200]})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise FormatError(f"{spath}: format is not {FORMAT!r}")
    return doc


def _array_refs(doc) -> set:
    """Every ``{"$array": name}`` string in ``doc`` (an explicit stack: no recursion)."""
    refs, stack = set(), [doc]
    while stack:
        obj = stack.pop()
        if isinstance(obj, dict):
            if set(obj) == {"$array"} and isinstance(obj["$array"], str):
                refs.add(obj["$array"])
            stack.extend(obj.values())
        elif isinstance(obj, list):
            stack.extend(obj)
    return refs


def _checkpoint_files(path: str) -> tuple[list, list]:
    """``(files, dirs)`` of the checkpoint directory ``path``, relative, deepest first; raises
    FormatError if ``path`` is not one or holds anything else (see the module docstring)."""
    _directory(path)
    doc = _read_state(os.path.join(path, _STATE))
    files, dirs = [_STATE], []
    names = set(os.listdir(path))
    extra = names - {_STATE, _ARRAYS, "rows.npy", "rows"}
    if {"rows.npy", "rows"} <= names:
        extra.add("rows")
    if _ARRAYS in names:
        _directory(os.path.join(path, _ARRAYS))
        refs = _array_refs(doc)
        for name in os.listdir(os.path.join(path, _ARRAYS)):
            rel = f"{_ARRAYS}/{name}"
            if rel not in refs or not _SAFE.match(rel):
                extra.add(rel)
                continue
            _regular(os.path.join(path, rel))
            files.append(rel)
        dirs.append(_ARRAYS)
    if "rows.npy" in names:
        _regular(os.path.join(path, "rows.npy"))
        files.append("rows.npy")
    elif "rows" in names:
        rows = os.path.join(path, "rows")
        _directory(rows)
        mpath = os.path.join(rows, "manifest.json")
        with _open_regular(mpath) as f:
            text = f.read(1 << 20)
        try:
            manifest = json.loads(text, parse_int=_parse_int, parse_constant=_no_constant)
            fields = manifest["fields"]
            known = {e["file"] for e in fields if isinstance(e.get("file"), str)}
            # a grouped directory names its files per group
            known |= {e["file"] for e in manifest.get("groups", ())
                      if isinstance(e, dict) and isinstance(e.get("file"), str)}
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
            raise FormatError(f"{mpath}: not a tfdata manifest") from None
        known |= {"manifest.json", "manifest.json.tmp"}
        for name in os.listdir(rows):
            if name not in known or "/" in name:
                extra.add(f"rows/{name}")
                continue
            _regular(os.path.join(rows, name))
            files.append(f"rows/{name}")
        dirs.append("rows")
    if extra:
        shown = sorted(extra)
        raise FormatError(f"{path}: holds files that are not part of a checkpoint "
                          f"({', '.join(shown[:5])}{', ...' if len(shown) > 5 else ''})")
    return files[::-1], dirs


def _check_replaceable(path: str) -> None:
    try:
        _checkpoint_files(path)
    except (FormatError, OSError) as exc:
        raise FileExistsError(f"{path}: exists and is not a tfdata checkpoint directory, so it is "
                              f"not replaced ({exc})") from None


def _remove_checkpoint(path: str) -> None:
    """Delete the checkpoint directory ``path`` (moved aside by this module) file by file, after
    checking that it holds only checkpoint files; otherwise leave it, with a warning."""
    try:
        files, dirs = _checkpoint_files(path)
    except (FormatError, OSError) as exc:
        warnings.warn(f"{path}: the replaced checkpoint was left there: it holds more than a "
                      f"checkpoint ({exc})", RuntimeWarning, stacklevel=3)
        return
    try:
        for rel in files:
            os.unlink(os.path.join(path, rel))
        for rel in dirs:
            os.rmdir(os.path.join(path, rel))
        os.rmdir(path)
    except OSError as exc:  # a file appeared meanwhile: it stays
        warnings.warn(f"{path}: the replaced checkpoint could not be removed completely ({exc})",
                      RuntimeWarning, stacklevel=3)


# -- saving ------------------------------------------------------------------------------------


def _write_npy(path: str, arr: np.ndarray) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
    with os.fdopen(fd, "wb") as f:
        # asarray, not ascontiguousarray: that makes a 0-d array (a statistic of a scalar) 1-d
        np.lib.format.write_array(f, np.asarray(arr, order="C"), allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def _encode(obj, base: str, prefix: str, arrays: list):
    """JSON-able copy of ``obj`` with every ndarray written to ``arrays/<name>.npy``."""
    if isinstance(obj, np.ndarray):
        # the key path names the file where it is a safe file name (a field name may not be)
        stem = prefix if _SAFE_STEM.match(prefix) else f"a{len(arrays)}"
        rel = f"{_ARRAYS}/{stem}.npy"
        if rel in arrays:
            rel = f"{_ARRAYS}/a{len(arrays)}.npy"
        _write_npy(os.path.join(base, rel), obj)
        arrays.append(rel)
        return {"$array": rel}
    if isinstance(obj, dict):
        return {k: _encode(v, base, f"{prefix}.{k}" if prefix else str(k), arrays) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v, base, f"{prefix}.{i}", arrays) for i, v in enumerate(obj)]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _begin(path, overwrite: bool) -> tuple:
    """Check that ``path`` may be written (see the module docstring) and create this call's
    temporary directory beside it; returns ``(path, tmp, stem, parent)``."""
    path = os.fspath(path)
    path = path.rstrip(os.sep) or path
    if os.path.lexists(path):
        if not overwrite:
            raise FileExistsError(f"{path}: exists; a checkpoint replaces an existing path only "
                                  f"when asked (overwrite=True), and only a tfdata checkpoint")
        _check_replaceable(path)
    parent = os.path.dirname(os.path.abspath(path))
    stem = "." + os.path.basename(os.path.abspath(path))[:100] + "."
    tmp = tempfile.mkdtemp(prefix=stem, suffix=".tmp", dir=parent)  # exclusively this call's
    return path, tmp, stem, parent


def _finish(tmp: str, path: str, stem: str, parent: str, overwrite: bool, doc: dict,
            rows_name: str) -> None:
    """Write ``state.json``, flush every file and directory, publish ``tmp`` at ``path``."""
    text = json.dumps(doc, indent=1, allow_nan=False)
    fd = os.open(os.path.join(tmp, _STATE), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    for d in (os.path.join(tmp, _ARRAYS), os.path.join(tmp, rows_name), tmp):
        if os.path.isdir(d):
            fsync_dir(d)
    _publish(tmp, path, stem, parent, overwrite)


def save(buffer, path, overwrite: bool = False) -> None:
    """Write ``buffer`` to the checkpoint directory ``path`` (see the module docstring).

    Raises
    ------
    FileExistsError
        ``path`` exists and ``overwrite`` is False, or it is not a checkpoint directory holding
        only checkpoint files. Nothing is changed.
    """
    from ..storage.files import Writer, chunk_rows

    reason = type(buffer).unsaved_reason(buffer.sampler)
    if reason is not None:  # before any file
        raise TypeError(f"save: {reason}; a checkpoint could not rebuild it (nothing was written)")
    path, tmp, stem, parent = _begin(path, overwrite)
    storage = buffer.storage
    rows_name = file_name(storage.layout, "rows")
    try:
        os.mkdir(os.path.join(tmp, _ARRAYS))
        with buffer.snapshot() as state:
            state.pop("data")
            size = state["writer"]["size"]
            step = chunk_rows(storage.spec.row_nbytes)
            with Writer(os.path.join(tmp, rows_name), storage.spec, storage.layout) as w:
                for start in range(0, size, step):
                    storage.append_to(w, start, min(size, start + step))
            arrays: list = []
            doc = {"format": FORMAT, "version": list(VERSION), "class": type(buffer).__name__,
                   "config": _encode(buffer.config, tmp, "config", arrays), "rows": rows_name,
                   "state": _encode(state, tmp, "", arrays)}
        _finish(tmp, path, stem, parent, overwrite, doc, rows_name)
    except BaseException:
        # the temporary directory is this call's own (mkdtemp, mode 0700): nothing else is removed
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _publish(tmp: str, path: str, stem: str, parent: str, overwrite: bool) -> None:
    """Rename the complete checkpoint ``tmp`` to ``path``, replacing only a checkpoint."""
    if not os.path.lexists(path):
        # a directory that appeared meanwhile makes this fail unless it is empty (nothing lost)
        os.rename(tmp, path)
        fsync_dir(parent)
        return
    if not overwrite:  # it appeared while this call was writing
        raise FileExistsError(f"{path}: exists; not replaced (overwrite=False)")
    _check_replaceable(path)  # again: it may have changed while this call was writing
    aside = tempfile.mkdtemp(prefix=stem, suffix=".old", dir=parent)
    os.rename(path, aside)  # onto the empty directory just made: a name only this call knows
    try:
        os.rename(tmp, path)
    except BaseException:
        os.rename(aside, path)  # put the old checkpoint back
        raise
    fsync_dir(parent)
    _remove_checkpoint(aside)


# -- loading: validation of state.json -------------------------------------------------------


def _show_layout(layout) -> str:
    return repr(layout) if isinstance(layout, str) else str([list(g) for g in layout])[:200]


class _Checker:
    """Validation of one ``state.json``: every failure is a FormatError naming the file and the
    field (a dotted path from the top of the document). The parts' readers
    (:func:`tfdata.replay.frames.read_state`, ...) are given one."""

    def __init__(self, spath: str):
        self.spath = spath

    def fail(self, where: str, expected: str, got=None, *, show: bool = True):
        tail = f", got {_show(got)}" if show else ""
        raise FormatError(f"{self.spath}: {where}: expected {expected}{tail}")

    def obj(self, where: str, v, keys, optional=()) -> dict:
        if not isinstance(v, dict):
            self.fail(where, "an object", v)
        unknown = set(v) - set(keys) - set(optional)
        if unknown:
            shown = sorted(str(k)[:40] for k in unknown)[:5]
            self.fail(where, f"only the keys {sorted(set(keys) | set(optional))}; unknown "
                      f"{shown}", show=False)
        missing = [k for k in keys if k not in v]
        if missing:
            self.fail(where, f"the keys {list(keys)}; missing {missing}", show=False)
        return v

    def integer(self, where: str, v, lo: int, hi: int) -> int:
        if type(v) is not int or not lo <= v <= hi:  # a bool is not an int
            self.fail(where, f"an int in [{lo}, {hi}]", v)
        return v

    def opt_int(self, where: str, v, lo: int, hi: int):
        return None if v is None else self.integer(where, v, lo, hi)

    def real(self, where: str, v, lo: float, hi: float, lo_open: bool = False) -> float:
        if (type(v) is not float or not math.isfinite(v) or v < lo or v > hi
                or (lo_open and v == lo)):
            self.fail(where, f"a float in {'(' if lo_open else '['}{lo}, {hi}]", v)
        return v

    def flag(self, where: str, v) -> bool:
        if type(v) is not bool:
            self.fail(where, "true or false", v)
        return v

    def choice(self, where: str, v, options) -> str:
        if type(v) is not str or v not in options:
            self.fail(where, f"one of {list(options)}", v)
        return v

    def layout(self, where: str, v, spec: Spec):
        """A layout: ``"aos"``, ``"soa"`` or a grouping of ``spec``'s fields in normal form
        (bounded before it is iterated); returns it normalised (a grouping as a tuple)."""
        if not isinstance(v, (str, list)):
            self.fail(where, "'aos', 'soa' or a list of groups of field names", v)
        try:
            return check_layout(v, spec, where)
        except ValueError as exc:  # SpecError too: it names the field
            raise FormatError(f"{self.spath}: {str(exc)[:300]}") from None

    def names(self, where: str, v, spec: Spec, keys=None) -> dict:
        """An object of str to str, every value (and key, unless ``keys``) a field of ``spec``."""
        if not isinstance(v, dict):
            self.fail(where, "an object of field names", v)
        for k, name in v.items():
            if keys is not None and k not in keys:
                self.fail(where, f"keys among {list(keys)}", k)
            if keys is None and k not in spec:
                self.fail(f"{where} key", f"a field of the spec {list(spec.names)}", k)
            if type(name) is not str or name not in spec:
                self.fail(f"{where}[{k[:40]!r}]", f"a field of the spec {list(spec.names)}", name)
        return v

    def caught(self, exc: Exception, where: str) -> FormatError:
        """The FormatError of a part's TypeError or ValueError: a sampler's ``from_config``
        (``config.<key>: ...``) or ``check_state`` (:class:`StateError`: ``state.<field>``)."""
        if isinstance(exc, StateError):
            tail = "" if exc.got is None else f", got {exc.got}"
            return FormatError(f"{self.spath}: state.{exc.field}: expected {exc.expected}{tail}")
        text = str(exc)[:300]
        return FormatError(f"{self.spath}: {text if text.startswith(where) else f'{where}: {text}'}")

    # -- the buffer's own parts --------------------------------------------------------------
    def spec(self, v) -> Spec:
        self.obj("state.spec", v, ("fields",))
        fields = v["fields"]
        if not isinstance(fields, list) or not fields:
            self.fail("state.spec.fields", "a non-empty list", fields)
        out, row = [], 0
        for i, f in enumerate(fields):
            where = f"state.spec.fields[{i}]"
            self.obj(where, f, ("name", "dtype", "shape"))
            name, dtype, shape = f["name"], f["dtype"], f["shape"]
            if type(name) is not str or not 1 <= len(name) <= _MAX_NAME:
                self.fail(f"{where}.name", f"a string of 1 to {_MAX_NAME} characters", name)
            if type(dtype) is not str or not _DTYPE.match(dtype):
                self.fail(f"{where}.dtype", "a numpy dtype string of a bool or numeric type "
                          "('<f4', '|b1', ...)", dtype)
            if (not isinstance(shape, list) or len(shape) > _MAX_NDIM
                    or any(type(d) is not int or not 1 <= d <= _MAX_DIM for d in shape)):
                self.fail(f"{where}.shape", f"a list of at most {_MAX_NDIM} ints in [1, {_MAX_DIM}]",
                          shape)
            try:
                field = Field(name, np.dtype(dtype), tuple(shape))
            except (SpecError, TypeError, ValueError) as exc:
                self.fail(f"{where}.dtype", f"a bool or numeric dtype ({str(exc)[:200]})", dtype)
            if field.dtype.str != dtype:  # canonical: what a save writes for this dtype
                self.fail(f"{where}.dtype", f"{field.dtype.str!r} (numpy's canonical form)", dtype)
            row += field.dtype.itemsize * math.prod(shape)
            if row > _MAX_ROW_BYTES:
                self.fail("state.spec", f"rows of at most {_MAX_ROW_BYTES} bytes",
                          f"{row} bytes up to field {i}", show=False)
            out.append(field)
        try:
            return Spec(out)
        except SpecError as exc:
            raise FormatError(f"{self.spath}: state.spec: {str(exc)[:300]}") from None

    def config(self, v, spec: Spec) -> tuple:
        """``(the buffer's config, the sampler's)``: the buffer's own keys checked here and by
        the parts that have options (statistics, frame stacks, rate limiter); every other key
        is the sampler's, for its ``from_config``."""
        if isinstance(v, dict):
            for k in _OVERRIDES:
                if k in v:
                    raise FormatError(
                        f"{self.spath}: config: {k!r} is not accepted from a checkpoint (loading "
                        f"never writes outside the checkpoint directory nor takes memory settings "
                        f"from a file; pass {k}= to load)")
        own = _CONFIG_KEYS + _CONFIG_OPTIONAL
        self.obj("config", v, _CONFIG_KEYS, optional=set(v) if isinstance(v, dict) else ())
        c = "config."
        cap = self.integer(c + "capacity", v["capacity"], 1, MAX_CAPACITY)
        layout = self.layout(c + "layout", v["layout"], spec)
        self.integer(c + "ring_size", v["ring_size"], 1, MAX_RING_SIZE)
        envs = self.integer(c + "num_envs", v["num_envs"], 1, cap)
        if cap % envs:
            self.fail(c + "num_envs", f"a divisor of the capacity {cap}", envs)
        # a window never takes more rows than a stream holds, but each sample loops n_step
        # times: bounded by the capacity (or 1024, for small buffers with long windows)
        self.opt_int(c + "n_step", v["n_step"], 1, max(cap, MAX_SHORT_N_STEP))
        self.real(c + "gamma", v["gamma"], 0.0, 1.0)
        self.names(c + "next_of", v["next_of"], spec)
        self.flag(c + "elide_next", v["elide_next"])
        self.names(c + "roles", v["roles"], spec, keys=("reward", "terminated", "truncated"))
        if "stats" in v:
            columns.read_names(self, c + "stats", v["stats"], spec)
        if "frame_stack" in v or "frame_padding" in v:
            frame_stacks.read_config(self, v, spec)
        if "rate_limiter" in v:
            limiter.read_config(self, v["rate_limiter"], cap)
        buffer = {k: v[k] for k in own if k in v and k != "sampler"}
        return dict(buffer, layout=layout), {k: x for k, x in v.items() if k not in own}

    def sampler(self, v) -> dict:
        """``state.sampler``: the RNG's seed and counter (every sampler's)."""
        self.obj("state.sampler", v, RNG_KEYS)
        for k in RNG_KEYS:
            self.integer(f"state.sampler.{k}", v[k], 0, _U64)
        return v

    # -- what the shared-memory part reads of the samplers and the limiter -------------------
    def exactly_k_config(self, v: dict) -> None:
        """``replays``, ``policy``, ``timeout``: present exactly when ``config.sampler`` is
        ``"exactly_k"`` (checked by :meth:`ExactlyKSampler.from_config`)."""
        if v.get("sampler") != "exactly_k":
            for k in _EXACTLY_K_KEYS:
                if k in v:
                    self.fail("config." + k, "absent (config.sampler is not 'exactly_k')", v[k])
            return
        try:
            ExactlyKSampler.from_config({k: v[k] for k in _EXACTLY_K_KEYS if k in v}, 0)
        except (TypeError, ValueError) as exc:
            raise self.caught(exc, "config") from None

    def prioritized_config(self, v: dict) -> None:
        """The settings of a prioritized sampler in ``config`` (checked by
        :meth:`PrioritizedSampler.from_config`)."""
        try:
            PrioritizedSampler.from_config({k: v[k] for k in _PRIORITIZED_KEYS}, 0)
        except (TypeError, ValueError) as exc:
            raise self.caught(exc, "config") from None

    def prioritized_scalars(self, pri, config: dict) -> int:
        return read_scalars(self, pri, config)

    def limiter_config(self, v, cap: int) -> None:
        limiter.read_config(self, v, cap)

    def limiter_state(self, v, size: int, params: dict | None = None) -> dict:
        return limiter.read_state(self, v, size, params)


class _Arrays:
    """Reads the ``{"$array": ...}`` references of a checkpoint: the name, the file, its header
    and exactly the dtype and shape the state needs, before any data is read."""

    def __init__(self, path: str, check: _Checker):
        self.path = path
        self.check = check
        self.dir_checked = False

    def header(self, where: str, ref):
        """``(file path, header)`` of the array reference ``ref``, checked."""
        from ..storage.files import read_npy_header

        c = self.check
        if not isinstance(ref, dict) or set(ref) != {"$array"}:
            c.fail(where, 'an array reference {"$array": "arrays/<name>.npy"}', ref)
        rel = ref["$array"]
        if type(rel) is not str or not _SAFE.match(rel):
            raise FormatError(f"{c.spath}: {where}: array reference {_show(rel)} is not a file "
                              f"under arrays/")
        if not self.dir_checked:
            _directory(os.path.join(self.path, _ARRAYS))
            self.dir_checked = True
        fpath = os.path.join(self.path, rel)
        _regular(fpath)
        return fpath, read_npy_header(fpath)

    def fail(self, ref: dict, text: str):
        """FormatError naming the array file of ``ref`` (read, so checked) and ``text``."""
        raise FormatError(f"{os.path.join(self.path, ref['$array'])}: {text}")

    def length(self, where: str, ref) -> int:
        """Rows of the 1-D array ``ref`` (from its header; nothing else is read)."""
        fpath, h = self.header(where, ref)
        if len(h.shape) != 1:
            raise FormatError(f"{fpath}: {where}: expected a 1-D array, the file holds "
                              f"{h.dtype}{list(h.shape)}")
        return h.shape[0]

    def read(self, where: str, ref, dtype, shape: tuple) -> np.ndarray:
        fpath, h = self.header(where, ref)
        dtype = np.dtype(dtype)
        if h.dtype != dtype or tuple(h.shape) != tuple(shape):
            raise FormatError(f"{fpath}: {where}: expected {dtype}{list(shape)}, the file holds "
                              f"{h.dtype}{list(h.shape)}")
        out = np.empty(shape, dtype)
        view = memoryview(out).cast("B") if out.nbytes else None
        with _open_regular(fpath) as f:
            if os.fstat(f.fileno()).st_size < h.offset + out.nbytes:
                raise FormatError(f"{fpath}: truncated")
            f.seek(h.offset)
            if view is not None and f.readinto(view) != out.nbytes:
                raise FormatError(f"{fpath}: truncated")
        return out

    def any(self, where: str, ref, limit: int) -> np.ndarray:
        """The array ``ref`` whatever its shape, of a bool or numeric dtype and at most
        ``limit`` bytes (from the header, before anything is read): what a part whose arrays
        its own check validates may hold."""
        fpath, h = self.header(where, ref)
        dt = h.dtype
        if dt.kind not in "biuf" or dt.fields is not None or dt.subdtype is not None:
            raise FormatError(f"{fpath}: {where}: expected an array of a bool or numeric dtype, "
                              f"the file holds {dt}{list(h.shape)}")
        nbytes = dt.itemsize * math.prod(h.shape)
        if nbytes > limit:
            raise FormatError(f"{fpath}: {where}: expected at most {limit} bytes (what is left of "
                              f"the {STATE_BYTES_PER_SLOT} bytes per slot, plus "
                              f"{STATE_BYTES_BASE}, a sampler's arrays may hold in all), the "
                              f"file holds {dt}{list(h.shape)}")
        return self.read(where, ref, dt, tuple(h.shape))


def _sampler_part(c: _Checker, arrays: _Arrays, part, key: str, capacity: int) -> dict:
    """``state.<key>``, what a sampler keeps beyond its RNG position, decoded for its
    ``check_state``: an object whose top-level array references are read (bool or numeric
    arrays of at most :data:`STATE_BYTES_PER_SLOT` bytes per slot, plus
    :data:`STATE_BYTES_BASE`, in all, from the headers) and whose other values are JSON
    values."""
    w = f"state.{key}"
    if not isinstance(part, dict):
        c.fail(w, "an object (what the sampler keeps beyond its RNG position)", part)
    room = STATE_BYTES_PER_SLOT * capacity + STATE_BYTES_BASE
    out = {}
    for k, v in part.items():
        if k in RNG_KEYS:
            c.fail(f"{w}.{k}", "no such key (the RNG position is state.sampler)", v)
        if isinstance(v, dict) and "$array" in v:
            v = arrays.any(f"{w}.{k}", v, room)
            room -= v.nbytes
        out[k] = v
    return out


def _sampler_class(c: _Checker, cls, config, known: dict) -> tuple:
    """``(name, class)`` of the sampler a checkpoint of ``cls`` names (``config.sampler``;
    absent: the class's default), among ``known`` (tfdata's and those given to :func:`load`)."""
    default = cls.DEFAULT_SAMPLER
    if not isinstance(config, dict) or "sampler" not in config:
        return default, known[default]
    named = config["sampler"]
    if type(named) is str and named in known and named != default:
        return named, known[named]
    others = sorted(k for k in known if k != default)
    if not others:
        c.fail("config.sampler", f"absent (a {cls.__name__} samples with {default!r})", named)
    if type(named) is not str:
        c.fail("config.sampler", f"one of {others} (absent: {default})", named)
    given = sorted(set(known) - set(cls.SAMPLERS))
    raise FormatError(
        f"{c.spath}: config.sampler: the sampler {_show(named)} is neither one of tfdata's "
        f"({', '.join(sorted(cls.SAMPLERS))}) nor one given to load"
        f"{f' ({given})' if given else ''}; if it is a sampler class of yours, pass it: "
        f"{cls.__name__}.load(path, samplers=[YourSampler]) (a checkpoint never makes tfdata "
        f"import or call anything it is not given)")


def _check_files(path: str, rows_name: str) -> str:
    """Refuse links and special files at the rows dataset, in an SoA rows directory and in
    ``arrays/`` (the directories themselves included), before anything is opened."""
    adir = os.path.join(path, _ARRAYS)
    if os.path.lexists(adir):
        _directory(adir)
        for name in os.listdir(adir):
            _regular(os.path.join(adir, name))
    rpath = os.path.join(path, rows_name)
    if rows_name == "rows.npy":
        _regular(rpath)
        return rpath
    _directory(rpath)
    for name in os.listdir(rpath):
        _regular(os.path.join(rpath, name))
    return rpath


def _open_document(path) -> tuple:
    """``(path, state.json path, document, checker)`` of the checkpoint directory ``path``, its
    top level and version checked."""
    path = os.fspath(path)
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path}: no such checkpoint")
    if not os.path.isdir(path):
        raise FormatError(f"{path}: not a checkpoint directory")
    spath = os.path.join(path, _STATE)
    doc = _read_state(spath)
    c = _Checker(spath)
    c.obj("(top level)", doc, ("format", "version", "class", "config", "rows", "state"))
    version = doc["version"]
    if (not isinstance(version, list) or len(version) != 2
            or any(type(x) is not int for x in version) or version[0] != VERSION[0] or version[1] < 0):
        raise FormatError(f"{spath}: checkpoint version {_show(version)} is not supported "
                          f"(this tfdata reads {VERSION[0]}.x)")
    return path, spath, doc, c


def _open_rows(path: str, rows_name: str) -> tuple:
    """``(rows path, MmapDataset)`` of a checkpoint's rows, files checked first (links and
    special files refused), every failure a FormatError naming the file."""
    from ..dataset import MmapDataset

    rpath = _check_files(path, rows_name)
    try:
        return rpath, MmapDataset.open(rpath)
    except FileNotFoundError as exc:  # a file the manifest names
        raise FormatError(f"{rpath}: incomplete ({exc})") from None
    except RecursionError:
        raise FormatError(f"{rpath}: manifest nested too deeply") from None
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{rpath}: {str(exc)[:300]}") from None


def _available_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().available)


def _named(cls, config) -> str:
    """The sampler a checkpoint's class and config name (for messages; not checked)."""
    named = config.get("sampler", cls.DEFAULT_SAMPLER) if isinstance(config, dict) else None
    return named if type(named) is str else cls.DEFAULT_SAMPLER if named is None else _show(named)


def load(path, classes: dict, want=None, samplers=(), **overrides):
    """Rebuild the buffer saved in ``path``; raises :class:`FormatError` for a bad checkpoint.

    ``classes``: ``{name: class}`` of the buffer classes a checkpoint may name (an allow-list:
    a checkpoint never makes tfdata import or call anything else). ``want``: a class the
    buffer must be an instance of (``PrioritizedReplayBuffer.load``): TypeError naming both
    classes and their samplers, before anything is built, for a checkpoint of another.
    ``samplers``: sampler classes (of the user's) a checkpoint may name besides tfdata's, by
    their ``name`` (an allow-list too); each is rebuilt by its ``from_config`` and its state
    checked by its ``check_state``.
    ``overrides``: ``spill_path`` and ``hot_rows`` / ``hot_bytes`` to rebuild a buffer larger
    than memory as a spilling buffer (a checkpoint does not record where a buffer spilled);
    ``allocator`` and ``memory_budget`` as for the buffer's constructor (not recorded either);
    ``stats``, a list of fields (or None) to keep running statistics of instead of the
    checkpoint's ``config.stats`` (computed from the rows; those the checkpoint saved are
    still checked for the fields in both). ``layout`` to rebuild it in another layout than the
    one saved (``"aos"``, ``"soa"`` or a grouping of the spec's fields: the rows are copied
    field by field, the samples are the same). Everything read from ``path`` is validated first
    (see the module docstring); the buffer's planned memory must fit ``memory_budget`` (else
    MemoryBudgetError), or without one the memory available on the machine (else FormatError).

    Raises
    ------
    FileNotFoundError
        ``path`` or its ``state.json`` does not exist.
    tfdata.errors.FormatError
        Anything wrong with the checkpoint: the message names the file and the field.
    """
    bad = set(overrides) - set(_OVERRIDES) - {"stats", "layout"}
    if bad:
        raise TypeError(f"load: unexpected keyword(s) {sorted(bad)}; allowed: "
                        f"{_OVERRIDES + ('stats', 'layout', 'samplers')}")
    from .. import alloc
    from .._budget import parse_bytes
    from ..storage import resolve_layout
    from .episodes import resolve_next_of, resolve_roles

    # the caller's own settings: their errors are theirs, not the checkpoint's
    overrides = dict(overrides)
    wanted = {"stats": overrides.pop("stats")} if "stats" in overrides else {}
    new_layout = overrides.pop("layout", None)
    budget = overrides.get("memory_budget")
    budget = None if budget is None else parse_bytes("memory_budget", budget)
    if overrides.get("allocator") is not None:
        overrides["allocator"] = alloc.resolve(overrides["allocator"])
    known = {name: k.sampler_classes(samplers) for name, k in classes.items()}

    path, spath, doc, c = _open_document(path)
    name = doc["class"]
    if type(name) is not str or name not in classes:
        raise FormatError(f"{spath}: unknown buffer class {_show(name)} (known: {sorted(classes)})")
    cls = classes[name]
    if want is not None and not issubclass(cls, want):  # the caller's class, not the file's fault
        raise TypeError(f"{path}: holds a {name} (sampler {_named(cls, doc['config'])!r}), "
                        f"not a {want.__name__}; nothing was built (load it with "
                        f"ReplayBuffer.load, which returns the class saved)")
    st = doc["state"]
    # the sampler, and its part of the state, before the state's keys
    sname, scls = _sampler_class(c, cls, doc["config"], known[name])
    key = state_key(scls)
    if isinstance(st, dict):  # a state saved with another sampler than the class and config say
        parts = {state_key(s) for k in known.values() for s in k.values()} | {key}
        held = [k for k in st if k not in STATE_KEYS and k in parts]
        if held != ([key] if key else []):
            saved = " and ".join(repr(k) for k in held) or repr("uniform")
            c.fail("state", f"the state of sampler {sname!r}, which class {name} and "
                   f"config.sampler name; it holds the state of sampler {saved} (a sampler's "
                   f"state loads only into the same sampler)", show=False)
    state_keys = ("format", "version", "spec", "capacity", "layout", "writer", "sampler",
                  "num_envs", "episodes") + ((key,) if key else ())
    limited = isinstance(doc["config"], dict) and "rate_limiter" in doc["config"]
    state_keys += ("rate_limiter",) if limited else ()
    framed = isinstance(doc["config"], dict) and "frame_stack" in doc["config"]
    state_keys += ("frames",) if framed else ()
    c.obj("state", st, state_keys, optional=("stats",))
    if st["format"] != STATE_FORMAT or type(st["version"]) is not int or st["version"] != 1:
        raise FormatError(f"{spath}: state: format {_show(st['format'])} version "
                          f"{_show(st['version'])} is not a tfdata.ReplayBuffer state of version 1")
    spec = c.spec(st["spec"])
    config, sampler_config = c.config(doc["config"], spec)
    cap, layout, envs = config["capacity"], config["layout"], config["num_envs"]
    for k, want in (("capacity", cap), ("num_envs", envs)):
        if type(st[k]) is not type(want) or st[k] != want:
            c.fail(f"state.{k}", f"{want!r} (config.{k})", st[k])
    if c.layout("state.layout", st["layout"], spec) != layout:
        c.fail("state.layout", f"{_show_layout(layout)} (config.layout)", st["layout"])
    rows_name = doc["rows"]
    if rows_name not in ("rows.npy", "rows"):
        raise FormatError(f"{spath}: rows must be 'rows.npy' or 'rows', got {_show(rows_name)}")
    rng = dict(c.sampler(st["sampler"]))
    try:  # the sampler's own options, by its class (a sampler given to load: its check)
        sampler = scls.from_config(sampler_config, rng["seed"])
    except (TypeError, ValueError, KeyError, OverflowError) as exc:
        raise c.caught(exc, "config") from None
    writer = c.obj("state.writer", st["writer"], ("cursor", "size"))
    size = c.integer("state.writer.size", writer["size"], 0, cap)
    cursor = c.integer("state.writer.cursor", writer["cursor"], 0, cap - 1)
    if size % envs:
        c.fail("state.writer.size", f"a multiple of num_envs {envs}", size)
    # a sampler that places a step's rows in free slots (exactly-k): they need not be adjacent,
    # so its cursor (past the last slot written) need not be a multiple of num_envs
    in_steps = getattr(sampler, "stream_order", True)
    if (in_steps and cursor % envs) or (size < cap and cursor != size):
        c.fail("state.writer.cursor", f"{size} (the size, until the ring is full)"
               if size < cap else f"a multiple of num_envs {envs}", cursor)

    # what the constructor derives from the config, checked without building anything
    opts = {**{k: v for k, v in config.items() if k != "capacity"}, **cls.sampler_options(sampler)}
    try:
        roles = resolve_roles(spec, config["roles"])
        next_of = resolve_next_of(spec, config["next_of"])
        cls.plan_memory(spec, cap, **opts)
        # what the saved buffer stored, and in which layout (a stacked field's frames are a
        # column of their own: its rows file is a grouped directory even for "aos")
        saved = cls.plan_storage(spec, cap, **opts)
    except (SpecError, ValueError, TypeError, KeyError, OverflowError) as exc:
        raise FormatError(f"{spath}: config: {str(exc)[:300]}") from None
    if rows_name != file_name(saved["layout"], "rows"):
        c.fail("rows", f"{file_name(saved['layout'], 'rows')} (layout {_show_layout(layout)}"
               + (", frames stored as a column)" if saved["frames"] else ")"), rows_name)
    if wanted:  # the caller's: checked as the constructor checks it, errors theirs
        cls.plan_memory(spec, cap, **{**opts, **wanted})
        config = {**config, **wanted}
        opts = {**opts, **wanted}
    if config["roles"] != roles or config["next_of"] != next_of:
        c.fail("config.roles/next_of", f"the resolved roles {roles} and next_of {next_of}",
               show=False)
    if new_layout is not None:  # the caller's layout (their error, not the file's)
        config["layout"] = opts["layout"] = resolve_layout(new_layout, spec)
    spill = {k: overrides[k] for k in ("spill_path", "hot_rows", "hot_bytes") if k in overrides}
    plan = cls.plan_memory(spec, cap, **opts, **spill)  # the caller's spill settings: theirs
    need = int(sum(plan.values()))
    # a memory_budget is the caller's: the constructor refuses it (MemoryBudgetError, before
    # allocating), since the file is not at fault; without one the machine's memory bounds it
    if budget is None and need > _available_memory():
        raise FormatError(f"{spath}: config.capacity {cap} would make the buffer hold {need} bytes "
                          f"({plan}), more than the memory available on this machine "
                          f"({_available_memory()} bytes); refused before allocating")

    has_flags = "terminated" in roles and "truncated" in roles
    # exactly-k writes rows off stream order: such a buffer keeps no episode numbers
    tracks = saved["episodes"] is not None
    arrays = _Arrays(path, c)
    rpath, ds = _open_rows(path, rows_name)
    with ds:
        stored = saved["stored"]
        if ds.spec != stored:
            raise FormatError(f"{rpath}: fields {ds.spec} differ from the buffer's {stored}")
        if size != len(ds):
            raise FormatError(f"{rpath}: holds {len(ds)} rows, the state says {size}")
        episodes_ = None
        if tracks:
            # (with frame_stack: over the stored frames, next fields of stacked fields elided)
            ep_spec, ep_next, ep_elide = saved["episodes"]
            episodes_ = episodes.read_state(c, arrays, st["episodes"], ep_next, ep_spec, ep_elide,
                                            envs, size)
        elif st["episodes"] is not None:
            c.fail("state.episodes", "null (the spec has no terminated and truncated fields, "
                   "or sampler='exactly_k')" if has_flags else
                   "null (the spec has no terminated and truncated fields)", st["episodes"])
        state = {"format": STATE_FORMAT, "version": 1, "spec": spec.to_dict(),
                 "capacity": cap, "layout": layout, "writer": {"cursor": cursor, "size": size},
                 "sampler": rng, "num_envs": envs, "episodes": episodes_}
        if key is not None:  # what the sampler keeps, checked by the sampler itself
            state[key] = part = _sampler_part(c, arrays, st[key], key, cap)
            try:
                sampler.check_state({**rng, **part}, size, cap)
            except (TypeError, ValueError, KeyError, IndexError, OverflowError) as exc:
                raise c.caught(exc, f"state.{key}") from None
        frames = None
        if framed:
            frames = state["frames"] = frame_stacks.read_state(
                c, arrays, st["frames"], saved["frames"]["stacks"], spec, envs, size, cap, cursor)
        # statistics of a stacked field are of its frames: the stored shape
        stats = columns.read_state(c, arrays, st.get("stats"), doc["config"].get("stats"), stored,
                                   size)
        if limited:  # checked with the config; rebuilt as an object for the constructor
            state["rate_limiter"] = limiter.read_state(c, st["rate_limiter"], size,
                                                       config["rate_limiter"])
            config = dict(config, rate_limiter=limiter.RateLimiter(**config["rate_limiter"]))
        try:
            buf = cls(spec, **config, **cls.sampler_options(sampler), **overrides)
        except (SpecError, ValueError, TypeError, KeyError, OverflowError) as exc:
            raise FormatError(f"{spath}: cannot rebuild the buffer ({type(exc).__name__}: "
                              f"{str(exc)[:300]})") from None
        state["data"] = {name: ds.field(name) for name in stored.names}
        release = ds.release
        order = None
        if episodes_ is not None:
            store = buf.storage
            order = episodes.EpisodeOrder(c, episodes_, store.field(roles["terminated"]),
                                          store.field(roles["truncated"]),
                                          ds.field(roles["terminated"]),
                                          ds.field(roles["truncated"]), cursor, size, cap)
            order.ahead(max(1, (16 << 20) // max(1, stored.row_nbytes)))  # the copy's first chunk

            def release(start, stop, _order=order, _release=ds.release):
                _order.ahead(2 * stop - start)  # the next chunk, before the copy reads it
                _release(start, stop)
        try:
            buf.load_state_dict(state, release=release, records=ds.records)
        except (SpecError, ValueError, TypeError, KeyError, OverflowError) as exc:
            raise FormatError(f"{spath}: {type(exc).__name__}: {str(exc)[:300]}") from None
        finally:
            state["data"] = None
    if order is not None:
        # against the flags as loaded, in memory: reading them from the mapped file first would
        # fault in every page of an AoS file twice (a third of the load's time)
        order.finish()
    if frames is not None:
        store = buf.storage
        frame_stacks.check_order(c, frames, store.field(roles["terminated"]),
                                 store.field(roles["truncated"]), cursor, size, envs, cap)
    # the state's statistics were left out of load_state_dict (which would compute them from the
    # mapped rows first): the buffer computed them from the rows in memory; they must agree
    columns.compare_state(c, arrays, st.get("stats"), stats, buf)
    return buf


def _widen_priorities(state: dict) -> None:
    """The prioritized arrays of ``state`` in the checkpoint's form: leaves float64, versions
    uint64 (the trees hold float32 leaves and uint32 versions; the form on disk is unchanged)."""
    pri = state.get("prioritized")
    if pri is not None:
        pri["leaves"] = np.asarray(pri["leaves"], np.float64)
        pri["versions"] = np.asarray(pri["versions"], np.uint64)


# -- shared-memory buffers ----------------------------------------------------------------------
# A SharedReplayBuffer's checkpoint has the same files; its state says, per shard, the rows its
# writer had published when the save began ("heads") and how many of the oldest of them the
# writer was overwriting while the rows were copied ("dropped": left out). Rows are every slot of
# the region, in slot order.
# Without replacement, config.sampler is "without_replacement" (absent: uniform) and
# state.without_replacement holds the pass as for a ReplayBuffer (undrawn slots of held rows,
# each once; passes), every published row added before the save.
# With frame stacks, config has frame_stack, frame_padding and final_frames, the rows are the
# stored ones (one frame per row, no elided next field) and state.frames holds what the kept
# rows' stacks read besides them (_read_shared_frames); heads and dropped then say which rows
# were kept (SharedReplayBuffer.settle_frames may leave out more than the rows overwritten).
_SHARED_CONFIG = ("capacity", "layout", "ring_size", "num_writers", "prioritized", "n_step",
                  "gamma", "next_of", "roles")
_SHARED_STATE = ("format", "version", "spec", "capacity", "layout", "num_writers", "heads",
                 "dropped", "sampler", "prioritized")
# frame stacks (config keys present together, with state.frames: see replay/shared_frames.py)
_FRAME_KEYS = ("frame_stack", "frame_padding", "final_frames")
MAX_WRITERS = 4096
_MAX_HEAD = (1 << 62) - 1


def _shared_sampler(c: _Checker, v, samplers) -> tuple:
    """``(name, class)`` of a sampler of the user's that a shared checkpoint's config names
    (``config.sampler`` neither absent nor one of tfdata's), among ``samplers`` (the classes
    given to load, ``{name: class}``: an allow-list); ``(None, None)`` otherwise."""
    if not isinstance(v, dict) or "sampler" not in v:
        return None, None
    named = v["sampler"]
    if named in ("without_replacement", "exactly_k"):
        return None, None
    if type(named) is str and named in samplers:
        return named, samplers[named]
    given = sorted(samplers)
    if type(named) is not str:
        c.fail("config.sampler", "'without_replacement', 'exactly_k' or the name of a sampler "
               "given to load (absent: uniform)", named)
    raise FormatError(
        f"{c.spath}: config.sampler: the sampler {_show(named)} is neither one of tfdata's "
        f"(without_replacement, exactly_k) nor one given to load"
        f"{f' ({given})' if given else ''}; if it is a sampler class of yours, pass it: "
        f"SharedReplayBuffer.load(path, samplers=[YourSampler]) (a checkpoint never makes "
        f"tfdata import or call anything it is not given)")


def save_shared(buffer, path, overwrite: bool = False) -> None:
    """Write a :class:`tfdata.SharedReplayBuffer` (replay mode) to the checkpoint directory
    ``path``: the rows each shard held when the save began, less the oldest rows a writer was
    overwriting while they were copied. Same file rules as :func:`save`."""
    from ..storage.files import Writer, chunk_rows

    reason = buffer.unsaved_reason()
    if reason is not None:  # before any file
        raise TypeError(f"save: {reason}; a checkpoint could not rebuild it (nothing was written)")
    path, tmp, stem, parent = _begin(path, overwrite)
    storage = buffer.storage
    rows_name = file_name(storage.layout, "rows")
    try:
        os.mkdir(os.path.join(tmp, _ARRAYS))
        with buffer.snapshot() as state:
            slots = storage.capacity
            step = chunk_rows(storage.spec.row_nbytes)
            with Writer(os.path.join(tmp, rows_name), storage.spec, storage.layout) as w:
                for start in range(0, slots, step):
                    storage.append_to(w, start, min(slots, start + step))
            state["dropped"] = buffer.overwritten_since(state["heads"])
            if any(state["dropped"]) and getattr(buffer, "_given", False):
                # a load moves a shard's kept rows to its first slots, which a state naming
                # slots (a sampler of the user's) cannot follow: refused, nothing written
                raise SharedBufferError(
                    f"save: writers overwrote {state['dropped']} of the oldest rows of each shard "
                    f"while they were copied; with a sampler object ({type(buffer.sampler).__name__}"
                    f", whose state may name slots) the rows must keep their slots: save again, "
                    f"or while the writers pause")
            if "frame_copies" in state:  # frame stacks: what the kept rows' stacks read
                buffer.settle_frames(state)
            _widen_priorities(state)
            arrays: list = []
            doc = {"format": FORMAT, "version": list(VERSION), "class": type(buffer).__name__,
                   "config": _encode(buffer.config, tmp, "config", arrays), "rows": rows_name,
                   "state": _encode(state, tmp, "", arrays)}
        _finish(tmp, path, stem, parent, overwrite, doc, rows_name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # this call's own directory, nothing else
        raise


def _read_shared_replays(c: _Checker, arrays: _Arrays, part, heads: list, per: int,
                         replays: int) -> tuple:
    """``state.exactly_k`` of a :class:`tfdata.SharedReplayBuffer`: the pool (``slots``,
    ``counts``: int64 arrays, at most the rows held, from the headers before anything is read;
    each slot a row a shard held, none twice; each count in ``[1, replays]``), the counters
    ``delivered`` and ``released`` (every row published awaits replay or was released:
    ``released == sum(heads) - len(slots)``) and the writers' ``cursors`` (one per shard, in
    ``[0, shard capacity)``). Returns ``(slots, counts, delivered, released, cursors)``."""
    w = "state.exactly_k."
    c.obj("state.exactly_k", part, ("slots", "counts", "delivered", "released", "cursors"))
    c.integer(w + "delivered", part["delivered"], 0, (1 << 63) - 1)
    c.integer(w + "released", part["released"], 0, (1 << 63) - 1)
    cursors = part["cursors"]
    if not isinstance(cursors, list) or len(cursors) != len(heads):
        c.fail(w + "cursors", f"a list of {len(heads)} ints", cursors)
    for s, cur in enumerate(cursors):
        c.integer(f"{w}cursors[{s}]", cur, 0, per - 1)
    held = np.minimum(np.asarray(heads, np.int64), per)
    m = arrays.length(w + "slots", part["slots"])
    if m > int(held.sum()):
        c.fail(w + "slots", f"at most {int(held.sum())} slots (the rows held)", f"{m} slots", show=False)
    slots = arrays.read(w + "slots", part["slots"], np.int64, (m,))
    counts = arrays.read(w + "counts", part["counts"], np.int64, (m,))
    bad = (slots < 0) | (slots >= per * len(heads))
    bad[~bad] = slots[~bad] % per >= held[slots[~bad] // per]
    if bad.any() or np.unique(slots).shape[0] != m:
        i = int(np.argmax(bad)) if bad.any() else None
        c.fail(w + "slots", "slots of rows the shards held, each once",
               f"slot {int(slots[i])} at position {i}" if i is not None else "a slot twice")
    bad = np.flatnonzero((counts < 1) | (counts > replays))
    if bad.size:
        c.fail(f"{w}counts[{int(bad[0])}]", f"an int in [1, {replays}] (config.replays)",
               int(counts[bad[0]]))
    if part["released"] != sum(heads) - m:
        c.fail(w + "released", f"{sum(heads) - m} (the rows published, sum of state.heads, less "
               f"the {m} awaiting replay)", part["released"])
    return slots, counts, part["delivered"], part["released"], list(cursors)


def _read_shared_frames(c: _Checker, arrays: _Arrays, part, spec: Spec, frames: dict, cap: int,
                        shards: int) -> dict:
    """``state.frames`` of a :class:`tfdata.SharedReplayBuffer` with ``frame_stack``: ``stacks``
    (the config's), ``depth`` uint8[capacity] in ``[0, K - 1]``, ``final_slots`` int64 (at most
    the capacity, from the header), ascending slots, ``finals`` (one array of final frames per
    next field of a stacked field, a row per final slot), ``pending`` (one frame per shard) and
    ``back`` (``K - 1`` frames per shard, per stacked field). Their agreement with the rows is
    checked once the rows are open (:func:`tfdata.replay.shared_frames.check_checkpoint`)."""
    w = "state.frames."
    nexts = [n for n in frames["next"].values() if n is not None]
    c.obj("state.frames", part, ("stacks", "depth", "final_slots", "finals", "pending", "back"))
    if part["stacks"] != frames["stacks"]:
        c.fail(w + "stacks", f"{frames['stacks']} (config.frame_stack)", part["stacks"])
    kmax = max(frames["stacks"].values()) - 1
    depth = arrays.read(w + "depth", part["depth"], np.uint8, (cap,))
    if cap and int(depth.max()) > kmax:
        c.fail(w + "depth", f"values in [0, {kmax}]", int(depth.max()))
    m = arrays.length(w + "final_slots", part["final_slots"])
    if m > cap:
        c.fail(w + "final_slots", f"at most {cap} slots", f"{m} slots", show=False)
    slots = arrays.read(w + "final_slots", part["final_slots"], np.int64, (m,))
    if m and (int(slots[0]) < 0 or int(slots[-1]) >= cap or (np.diff(slots) <= 0).any()):
        c.fail(w + "final_slots", f"ascending slots in [0, {cap})", slots.tolist()[:10])
    out = {"depth": depth, "final_slots": slots, "finals": {}, "pending": {}, "back": {}}
    for key, names, lead in (("finals", nexts, (m,)), ("pending", nexts, (shards,)),
                             ("back", list(frames["stacks"]), None)):
        c.obj(w + key, part[key], names)
        for n in names:
            f = spec[n]
            shape = (shards, frames["stacks"][n] - 1) if lead is None else lead
            out[key][n] = arrays.read(f"{w}{key}[{n!r}]", part[key][n], f.dtype, shape + f.shape[1:])
    return out


def load_shared(path, cls, **overrides):
    """Rebuild a :class:`tfdata.SharedReplayBuffer` saved with :func:`save_shared` in a new region;
    writers attach to it and continue each shard after its saved rows. Validated as :func:`load`
    validates (every problem a FormatError naming the file and the field) before the region is
    created. ``overrides``: ``name``, ``dir``, ``memory_budget``, and ``layout`` (another layout
    for the new region: the rows are copied field by field)."""
    bad = set(overrides) - {"name", "dir", "memory_budget", "layout", "samplers"}
    if bad:
        raise TypeError(f"load: unexpected keyword(s) {sorted(bad)}; allowed: name, dir, "
                        f"memory_budget, layout, samplers")
    overrides = dict(overrides)
    new_layout = overrides.pop("layout", None)
    # the caller's allow-list of samplers of theirs, {name: class} (checked by the caller)
    samplers = overrides.pop("samplers", None) or {}
    from .._budget import parse_bytes
    from ..storage import resolve_layout
    from ..kernels._tree import MAX_LEAF, MIN_LEAF, tree_nbytes
    from .episodes import resolve_next_of, resolve_roles

    if overrides.get("memory_budget") is not None:
        parse_bytes("memory_budget", overrides["memory_budget"])  # the caller's error, not the file's
    path, spath, doc, c = _open_document(path)
    if doc["class"] != cls.__name__:
        raise FormatError(f"{spath}: class: expected {cls.__name__!r}, got {_show(doc['class'])}")
    limited = isinstance(doc["config"], dict) and "rate_limiter" in doc["config"]
    v = doc["config"]
    # a sampler of the user's (given to load): its options are the config's keys beside the
    # buffer's, its part of the state under its state key
    uname, ucls = _shared_sampler(c, v, samplers)
    ukey = None if ucls is None else state_key(ucls)
    ucfg = None
    if ucls is not None:
        own = set(_SHARED_CONFIG) | {"sampler", "rate_limiter"}
        ucfg = {k: x for k, x in v.items() if k not in own}
        v = doc["config"] = {k: x for k, x in v.items() if k in own}
        if v.get("prioritized") is not False:
            c.fail("config.prioritized", f"false (config.sampler is {uname!r})", v.get("prioritized"))
    named = isinstance(v, dict) and "sampler" in v and ucls is None  # before the state's keys
    ek = named and v["sampler"] == "exactly_k" and v.get("prioritized") is False
    wor = named and not ek
    if wor and (v["sampler"] != "without_replacement" or v.get("prioritized") is not False):
        c.fail("config.sampler", "'without_replacement' or 'exactly_k' with prioritized false "
               "(absent: uniform)", v["sampler"])
    framed = isinstance(v, dict) and any(k in v for k in _FRAME_KEYS)
    st = c.obj("state", doc["state"], _SHARED_STATE + (("rate_limiter",) if limited else ())
               + (("without_replacement",) if wor else ()) + (("exactly_k",) if ek else ())
               + (("frames",) if framed else ()) + ((ukey,) if ukey else ()))
    if st["format"] != "tfdata.SharedReplayBuffer" or st["version"] != 1 or type(st["version"]) is not int:
        c.fail("state.format", "a tfdata.SharedReplayBuffer state of version 1", st["format"])
    spec = c.spec(st["spec"])
    cf = "config."
    v = doc["config"]
    if isinstance(v, dict):
        for k in ("spill_path", "hot_rows", "hot_bytes", "allocator", "memory_budget", "name", "dir"):
            if k in v:
                raise FormatError(f"{spath}: config: {k!r} is not accepted from a checkpoint "
                                  f"(pass {k}= to load)")
    prioritized = isinstance(v, dict) and v.get("prioritized") is True
    config = c.obj("config", v, _SHARED_CONFIG + (_PRIORITIZED_KEYS if prioritized else ())
                   + (_FRAME_KEYS if framed else ()),
                   optional=("rate_limiter", "sampler") + _EXACTLY_K_KEYS)
    c.exactly_k_config(config)  # replays, policy, timeout: present exactly with exactly_k
    if ek and config["policy"] == "overwrite":
        c.fail("config.policy", "'block' or 'drop' (a SharedReplayBuffer)", config["policy"])
    cap = c.integer(cf + "capacity", config["capacity"], 1, MAX_CAPACITY)
    layout = c.layout(cf + "layout", config["layout"], spec)
    c.integer(cf + "ring_size", config["ring_size"], 1, MAX_RING_SIZE)
    shards = c.integer(cf + "num_writers", config["num_writers"], 1, min(MAX_WRITERS, cap))
    if cap % shards:
        c.fail(cf + "num_writers", f"a divisor of the capacity {cap}", shards)
    c.flag(cf + "prioritized", config["prioritized"])
    c.opt_int(cf + "n_step", config["n_step"], 1, max(cap, MAX_SHORT_N_STEP))
    c.real(cf + "gamma", config["gamma"], 0.0, 1.0)
    c.names(cf + "next_of", config["next_of"], spec)
    c.names(cf + "roles", config["roles"], spec, keys=("reward", "terminated", "truncated"))
    if prioritized:
        c.prioritized_config(config)
    if limited:
        c.limiter_config(config["rate_limiter"], cap)
    saved_layout = layout
    if new_layout is not None:  # the caller's layout (their error, not the file's)
        layout = resolve_layout(new_layout, spec)
    for k, want in (("capacity", cap), ("num_writers", shards)):
        if type(st[k]) is not type(want) or st[k] != want:
            c.fail(f"state.{k}", f"{want!r} (config.{k})", st[k])
    if c.layout("state.layout", st["layout"], spec) != saved_layout:
        c.fail("state.layout", f"{_show_layout(saved_layout)} (config.layout)", st["layout"])
    per = cap // shards
    heads, dropped = st["heads"], st["dropped"]
    if not isinstance(heads, list) or len(heads) != shards:
        c.fail("state.heads", f"a list of {shards} ints", heads)
    if not isinstance(dropped, list) or len(dropped) != shards:
        c.fail("state.dropped", f"a list of {shards} ints", dropped)
    for s in range(shards):
        h = c.integer(f"state.heads[{s}]", heads[s], 0, _MAX_HEAD)
        # exactly-k: a writer never writes a row awaiting replay, so nothing is left out
        c.integer(f"state.dropped[{s}]", dropped[s], 0, 0 if ek else min(h, per))
    sampler = c.sampler(st["sampler"])
    limiter = None
    if limited:  # the counts: inserts are the heads' sum (what the writers published)
        from .limiter import RateLimiter

        counts = c.limiter_state(st["rate_limiter"], sum(min(h, per) for h in heads))
        if counts["inserts"] != sum(heads):
            c.fail("state.rate_limiter.inserts", f"{sum(heads)} (the sum of state.heads)",
                   counts["inserts"])
        limiter = RateLimiter(**config["rate_limiter"])
    try:
        roles = resolve_roles(spec, config["roles"])
        next_of = resolve_next_of(spec, config["next_of"])
    except (SpecError, ValueError, TypeError, KeyError) as exc:
        raise FormatError(f"{spath}: config: {str(exc)[:300]}") from None
    if config["roles"] != roles or config["next_of"] != next_of:
        c.fail("config.roles/next_of", f"the resolved roles {roles} and next_of {next_of}", show=False)
    arrays = _Arrays(path, c)
    frames = frame_part = None
    stored_spec, stored_layout = spec, saved_layout
    if framed:
        from .frames import resolve_frames
        from . import shared_frames

        if type(config["final_frames"]) is not int:
            c.fail(cf + "final_frames", "an int", config["final_frames"])
        try:
            frames = resolve_frames(spec, config["frame_stack"], config["frame_padding"], next_of,
                                    "terminated" in roles and "truncated" in roles)
            if frames is None:
                raise ValueError("frame_stack: None")
            final_frames = shared_frames.check_options(spec, frames, per, config["final_frames"])
        except (SpecError, ValueError, TypeError) as exc:
            raise FormatError(f"{spath}: config.frame_stack / frame_padding / final_frames: "
                              f"{str(exc)[:300]}") from None
        stored_spec, stored_layout = shared_frames.stored(spec, frames, saved_layout)
        frame_part = _read_shared_frames(c, arrays, st["frames"], spec, frames, cap, shards)
    pri = None
    if prioritized:
        pri = st["prioritized"]
        c.prioritized_scalars(pri, config)
    elif st["prioritized"] is not None:
        c.fail("state.prioritized", "null (config.prioritized is false)", st["prioritized"])
    # memory: the region, the trees; a memory_budget is the caller's (the constructor checks it)
    if frames is None:
        need = storage_nbytes(spec, cap, layout) + (tree_nbytes(cap) + cap if prioritized else 0)
    else:  # one frame per row, and the frame arrays
        st_spec, st_layout = shared_frames.stored(spec, frames, layout)
        need = storage_nbytes(st_spec, cap, st_layout)
        need += sum(np.dtype(d).itemsize * int(np.prod(shape, dtype=np.int64))
                    for _, d, shape in shared_frames.region_arrays(spec, frames, shards, per, final_frames))
    if overrides.get("memory_budget") is None and need > _available_memory():
        raise FormatError(f"{spath}: config.capacity {cap} would need {need} bytes, more than the "
                          f"memory available on this machine; refused before allocating")
    leaves = versions = None
    if prioritized:
        raw = arrays.read("state.prioritized.leaves", pri["leaves"], np.float64, (cap,))
        versions = arrays.read("state.prioritized.versions", pri["versions"], np.uint64, (cap,))
        leaves, bad = _leaves32(raw)
        bad &= leaves != 0.0  # slots no shard holds have leaf 0
        for s in range(shards):
            held = slice(s * per, s * per + min(heads[s], per))
            bad[held] |= ~(leaves[held] > 0.0)  # every held row was folded before the save
        if bad.any():
            i = int(np.argmax(bad))
            c.fail("state.prioritized.leaves", f"leaves that, rounded to float32, are 0 or in "
                   f"[{MIN_LEAF}, {MAX_LEAF}], and not 0 for held rows", f"leaf {i} = {raw[i]}",
                   show=False)
    undrawn = None
    if wor:  # the pass: slots of held rows, each once
        part = _read_undrawn(c, arrays, st["without_replacement"], "without_replacement", cap,
                             ring=False)
        slots = part["undrawn"]
        held = np.minimum(np.asarray(heads, np.int64), per)
        bad = (slots < 0) | (slots >= cap)
        bad[~bad] = slots[~bad] % per >= held[slots[~bad] // per]
        if bad.any() or np.unique(slots).shape[0] != slots.shape[0]:
            i = int(np.argmax(bad)) if bad.any() else None
            c.fail("state.without_replacement.undrawn", "slots of rows the shards held, each once",
                   f"slot {int(slots[i])} at position {i}" if i is not None else "a slot twice")
        undrawn = (slots, part["passes"])
    user = None
    if ucls is not None:  # built by its class, its state checked by itself, before the region
        if framed or config["n_step"] is not None:
            c.fail("config.sampler", "a sampler of tfdata's (n_step and frame_stack are not built "
                   "for a sampler object)", uname)
        try:
            user = ucls.from_config(ucfg, sampler["seed"])
        except (TypeError, ValueError, KeyError, OverflowError) as exc:
            raise c.caught(exc, "config") from None
        part = {} if ukey is None else _sampler_part(c, arrays, st[ukey], ukey, cap)
        size = sum(min(h, per) - t for h, t in zip(heads, dropped))
        try:
            user_state = user.check_state({**sampler, **part}, size, cap)
        except (TypeError, ValueError, KeyError, IndexError, OverflowError) as exc:
            raise c.caught(exc, f"state.{ukey or 'sampler'}") from None
    replays = None
    if ek:
        replays = _read_shared_replays(c, arrays, st["exactly_k"], heads, per, config["replays"])
    rows_name = doc["rows"]
    if rows_name != file_name(stored_layout, "rows"):
        c.fail("rows", f"{file_name(stored_layout, 'rows')} (layout {_show_layout(stored_layout)})",
               rows_name)
    rpath, ds = _open_rows(path, rows_name)
    with ds:
        if ds.spec != stored_spec:
            raise FormatError(f"{rpath}: fields {ds.spec} differ from the buffer's {stored_spec}")
        if len(ds) != cap:
            raise FormatError(f"{rpath}: holds {len(ds)} rows, the region has {cap} slots")
        if frame_part is not None:  # the frames agree with the rows they belong to
            bad = shared_frames.check_checkpoint(frame_part, heads, dropped, per, max(frames["stacks"].values()) - 1,
                                                 final_frames, ds.field(roles["terminated"]),
                                                 ds.field(roles["truncated"]))
            if bad is not None:
                c.fail(f"state.{bad[0]}", bad[1], bad[2])
        kw = {k: config[k] for k in ("ring_size", "num_writers", "prioritized", "n_step",
                                     "gamma", "next_of", "roles")}
        kw["layout"] = layout
        if prioritized:
            kw.update({k: config[k] for k in _PRIORITIZED_KEYS})
        if limiter is not None:
            kw["rate_limiter"] = limiter
        if wor:
            kw["sampler"] = config["sampler"]
        if ek:
            kw.update({k: config[k] for k in ("sampler",) + _EXACTLY_K_KEYS})
        if framed:
            kw.update({k: config[k] for k in _FRAME_KEYS})
        if user is not None:
            kw["sampler"] = user
        try:
            buf = cls(spec, cap, seed=None if user is not None else sampler["seed"], **kw, **overrides)
        except (SpecError, ValueError, TypeError, KeyError, OverflowError) as exc:
            raise FormatError(f"{spath}: cannot rebuild the buffer ({type(exc).__name__}: "
                              f"{str(exc)[:300]})") from None
        try:
            buf.restore(ds, heads, dropped, sampler["counter"],
                        None if pri is None else (leaves, versions, pri["samples"]), undrawn,
                        samples=None if limiter is None else counts["samples"], exactly_k=replays,
                        frames=frame_part)
            if user is not None:
                user.load_state(user_state)
        except BaseException:
            buf.close()
            raise
    return buf
