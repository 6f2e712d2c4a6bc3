"""Save and load of a :class:`tfdata.ReplayBuffer` or :class:`tfdata.PrioritizedReplayBuffer`.

The format of a checkpoint directory, what a save may replace and everything a load checks
before it allocates are in docs/design/checkpoints.md. The directory and the array encoding are
:mod:`tfdata.replay.checkpoint_files`'s, the checks of untrusted JSON values
:mod:`tfdata.replay.checkpoint_checker`'s; what each part saves and how it is checked is the
part's (a sampler's ``from_config`` and ``check_state``, the ``read_*`` functions of
:mod:`tfdata.replay.episodes`, :mod:`tfdata.replay.frames`, :mod:`tfdata.replay.limiter` and
:mod:`tfdata.replay.columns`).
"""

from __future__ import annotations

import os
import shutil

import numpy as np

from ..errors import FormatError, SharedBufferError, SpecError
from ..spec import Spec
from ..storage import file_name, storage_nbytes
from . import columns, episodes, frames as frame_stacks, limiter
from .checkpoint_checker import (MAX_CAPACITY, MAX_RING_SIZE, MAX_SHORT_N_STEP, OVERRIDES, Checker,
                                 available_memory, open_document, sampler_part, show_layout)
from .checkpoint_files import (ARRAYS, FORMAT, STATE_LIMIT, VERSION, Arrays, begin, encode, finish,
                               open_rows)
from .samplers import shown as _show, state_key
from .samplers.exactly_k import OPTIONS as _EXACTLY_K_KEYS
from .samplers.prioritized import OPTIONS as _PRIORITIZED_KEYS
from .samplers.prioritized import leaves32 as _leaves32
from .samplers.without_replacement import read_undrawn as _read_undrawn
from .state import STATE_FORMAT, STATE_KEYS

# the names the shared-memory part below is written with
from .checkpoint_checker import (Checker as _Checker, available_memory as _available_memory,
                                 open_document as _open_document, sampler_part as _sampler_part,
                                 show_layout as _show_layout)
from .checkpoint_files import (ARRAYS as _ARRAYS, Arrays as _Arrays, begin as _begin,
                               encode as _encode, finish as _finish, open_rows as _open_rows)

__all__ = ["save", "load", "save_shared", "load_shared", "FORMAT", "VERSION", "STATE_LIMIT",
           "MAX_RING_SIZE", "MAX_CAPACITY", "MAX_SHORT_N_STEP", "MAX_WRITERS"]


def save(buffer, path, overwrite: bool = False) -> None:
    """Write ``buffer`` to the checkpoint directory ``path`` (docs/design/checkpoints.md).

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
    path, tmp, stem, parent = begin(path, overwrite)
    storage = buffer.storage
    rows_name = file_name(storage.layout, "rows")
    try:
        os.mkdir(os.path.join(tmp, ARRAYS))
        with buffer.snapshot() as state:
            state.pop("data")
            size = state["writer"]["size"]
            step = chunk_rows(storage.spec.row_nbytes)
            with Writer(os.path.join(tmp, rows_name), storage.spec, storage.layout) as w:
                for start in range(0, size, step):
                    storage.append_to(w, start, min(size, start + step))
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
    (docs/design/checkpoints.md); the buffer's planned memory must fit ``memory_budget`` (else
    MemoryBudgetError), or without one the memory available on the machine (else FormatError).

    Raises
    ------
    FileNotFoundError
        ``path`` or its ``state.json`` does not exist.
    tfdata.errors.FormatError
        Anything wrong with the checkpoint: the message names the file and the field.
    """
    bad = set(overrides) - set(OVERRIDES) - {"stats", "layout"}
    if bad:
        raise TypeError(f"load: unexpected keyword(s) {sorted(bad)}; allowed: "
                        f"{OVERRIDES + ('stats', 'layout', 'samplers')}")
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

    path, spath, doc, c = open_document(path)
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
        c.fail("state.layout", f"{show_layout(layout)} (config.layout)", st["layout"])
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
        c.fail("rows", f"{file_name(saved['layout'], 'rows')} (layout {show_layout(layout)}"
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
    if budget is None and need > available_memory():
        raise FormatError(f"{spath}: config.capacity {cap} would make the buffer hold {need} bytes "
                          f"({plan}), more than the memory available on this machine "
                          f"({available_memory()} bytes); refused before allocating")

    has_flags = "terminated" in roles and "truncated" in roles
    # exactly-k writes rows off stream order: such a buffer keeps no episode numbers
    tracks = saved["episodes"] is not None
    arrays = Arrays(path, c)
    rpath, ds = open_rows(path, rows_name)
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
            state[key] = part = sampler_part(c, arrays, st[key], key, cap)
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
