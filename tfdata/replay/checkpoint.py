"""Save and load of a :class:`tfdata.ReplayBuffer` or :class:`tfdata.PrioritizedReplayBuffer`.

The format of a checkpoint directory, what a save may replace and everything a load checks
before it allocates are in docs/design/checkpoints.md. The directory and the array encoding are
:mod:`tfdata.replay.checkpoint_files`'s, the checks of untrusted JSON values
:mod:`tfdata.replay.checkpoint_checker`'s; what each part saves and how it is checked is the
part's (a sampler's ``from_config`` and ``check_state``, the ``read_*`` functions of
:mod:`tfdata.replay.episodes`, :mod:`tfdata.replay.frames`, :mod:`tfdata.replay.limiter` and
:mod:`tfdata.replay.columns`). A :class:`tfdata.SharedReplayBuffer` is saved and loaded by
:mod:`tfdata.shared.checkpoint`.
"""

from __future__ import annotations

import os
import shutil

from ..errors import FormatError, SpecError
from ..storage import file_name
from . import columns, episodes, frames as frame_stacks, limiter
from .checkpoint_checker import (MAX_CAPACITY, MAX_RING_SIZE, MAX_SHORT_N_STEP, OVERRIDES, Checker,
                                 available_memory, open_document, sampler_part, show_layout)
from .checkpoint_files import (ARRAYS, FORMAT, STATE_LIMIT, VERSION, Arrays, begin, encode, finish,
                               open_rows)
from .samplers import shown as _show, state_key
from .state import STATE_FORMAT, STATE_KEYS

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
