"""Save and load of every buffer: :class:`tfdata.ReplayBuffer`,
:class:`tfdata.PrioritizedReplayBuffer` and :class:`tfdata.SharedReplayBuffer`.

This module keeps what every checkpoint shares: the directory (written beside ``path``, renamed
into place; :mod:`tfdata.replay.checkpoint_files`), the array encoding, the top of
``state.json`` and the buffer class and sampler it names (an allow-list), the rows file. What
differs between a ring of streams and the shards of a region is the buffer class's checkpoint
part, ``cls.CHECKPOINT`` (:class:`tfdata.replay.state.RingCheckpoint`,
:class:`tfdata.shared.state.ShardCheckpoint`), whose contract is

- save: ``unsaved_reason(buffer)`` (None: it can be saved), ``saved_rows(state)`` (the rows
  ``[0, n)`` of the storage a checkpoint holds, given the state ``buffer.snapshot()`` yields)
  and ``settle(buffer, state)`` (the state as written, once the rows are copied);
- load: ``options(given)`` (the caller's keywords, checked: their errors), ``read(c, arrays,
  doc, cls, sampler, known, options)`` (every check of ``state.json`` and its arrays, before
  anything is built; returns a plan: ``rows_name``, ``rows_why``, ``stored``, ``rows``,
  ``rows_of``) and ``build(c, plan, ds, cls, options)`` (the buffer, built and filled from the
  open rows ``ds``, after their checks).

The format and everything a load checks: docs/design/checkpoints.md.
"""

from __future__ import annotations

import os
import shutil

from ..errors import FormatError
from ..storage import file_name
from .checkpoint_checker import (MAX_CAPACITY, MAX_RING_SIZE, MAX_SHORT_N_STEP, Checker,
                                 open_document)
from .checkpoint_files import ARRAYS, FORMAT, STATE_LIMIT, VERSION, Arrays, begin, encode, finish, open_rows
from .samplers import shown as _show

# FORMAT, VERSION, STATE_LIMIT and the MAX_ limits are re-exported (their modules define them)
__all__ = ["save", "load", "FORMAT", "VERSION", "STATE_LIMIT", "MAX_RING_SIZE", "MAX_CAPACITY",
           "MAX_SHORT_N_STEP"]


def save(buffer, path, overwrite: bool = False) -> None:
    """Write ``buffer`` to the checkpoint directory ``path`` (docs/design/checkpoints.md).

    Raises
    ------
    FileExistsError
        ``path`` exists and ``overwrite`` is False, or it is not a checkpoint directory holding
        only checkpoint files. Nothing is changed.
    """
    from ..storage.files import Writer, chunk_rows

    part = type(buffer).CHECKPOINT
    reason = part.unsaved_reason(buffer)
    if reason is not None:  # before any file
        raise TypeError(f"save: {reason}; a checkpoint could not rebuild it (nothing was written)")
    path, tmp, stem, parent = begin(path, overwrite)
    storage = buffer.storage
    rows_name = file_name(storage.layout, "rows")
    try:
        os.mkdir(os.path.join(tmp, ARRAYS))
        with buffer.snapshot() as state:
            rows = part.saved_rows(state)
            step = chunk_rows(storage.spec.row_nbytes)
            with Writer(os.path.join(tmp, rows_name), storage.spec, storage.layout) as w:
                for start in range(0, rows, step):
                    storage.append_to(w, start, min(rows, start + step))
            state = part.settle(buffer, state)
            arrays: list = []
            doc = {"format": FORMAT, "version": list(VERSION), "class": type(buffer).__name__,
                   "config": encode(buffer.config, tmp, "config", arrays), "rows": rows_name,
                   "state": encode(state, tmp, "", arrays)}
        finish(tmp, path, stem, parent, overwrite, doc, rows_name)
    except BaseException:
        # the temporary directory is this call's own (mkdtemp, mode 0700): nothing else is removed
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _sampler_class(c: Checker, cls, config, known: dict) -> tuple:
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


def _named(cls, config) -> str:
    """The sampler a checkpoint's class and config name (for messages; not checked)."""
    named = config.get("sampler", cls.DEFAULT_SAMPLER) if isinstance(config, dict) else None
    return named if type(named) is str else cls.DEFAULT_SAMPLER if named is None else _show(named)


def load(path, classes: dict, want, samplers=(), **options):
    """Rebuild the buffer saved in ``path``; raises :class:`FormatError` for a bad checkpoint.

    ``classes``: ``{name: class}`` of the buffer classes a checkpoint may name (an allow-list:
    a checkpoint never makes tfdata import or call anything else). ``want``: the class the
    buffer must be an instance of (TypeError naming both classes and their samplers, before
    anything is built, for a checkpoint of another); its ``CHECKPOINT`` part checks
    ``options``. ``samplers``: sampler classes (of the user's) a checkpoint may name besides
    tfdata's, by their ``name`` (an allow-list too); each is rebuilt by its ``from_config`` and
    its state checked by its ``check_state``. ``options``: the loading class's keywords
    (:meth:`tfdata.ReplayBuffer.load`, :meth:`tfdata.SharedReplayBuffer.load`). Everything
    read from ``path`` is validated before the buffer is built (docs/design/checkpoints.md).

    Raises
    ------
    FileNotFoundError
        ``path`` or its ``state.json`` does not exist.
    tfdata.errors.FormatError
        Anything wrong with the checkpoint: the message names the file and the field.
    """
    part = want.CHECKPOINT
    options = part.options(options)  # the caller's settings: their errors are theirs
    known = {name: k.sampler_classes(samplers) for name, k in classes.items()}
    path, spath, doc, c = open_document(path)
    name = doc["class"]
    if type(name) is not str or name not in classes:
        raise FormatError(f"{spath}: unknown buffer class {_show(name)} (known: {sorted(classes)})")
    cls = classes[name]
    if not issubclass(cls, want):  # the caller's class, not the file's fault
        raise TypeError(f"{path}: holds a {name} (sampler {_named(cls, doc['config'])!r}), "
                        f"not a {want.__name__}; nothing was built (load it with "
                        f"ReplayBuffer.load, which returns the class saved)")
    if doc["rows"] not in ("rows.npy", "rows"):
        raise FormatError(f"{spath}: rows must be 'rows.npy' or 'rows', got {_show(doc['rows'])}")
    sampler = _sampler_class(c, cls, doc["config"], known[name])
    plan = part.read(c, Arrays(path, c), doc, cls, sampler, known, options)
    if doc["rows"] != plan["rows_name"]:
        c.fail("rows", plan["rows_why"], doc["rows"])
    rpath, ds = open_rows(path, plan["rows_name"])
    with ds:
        if ds.spec != plan["stored"]:
            raise FormatError(f"{rpath}: fields {ds.spec} differ from the buffer's {plan['stored']}")
        if len(ds) != plan["rows"]:
            raise FormatError(f"{rpath}: holds {len(ds)} rows, {plan['rows_of']}")
        return part.build(c, plan, ds, cls, options)
