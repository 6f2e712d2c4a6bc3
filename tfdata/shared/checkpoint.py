"""Save and load of a :class:`tfdata.SharedReplayBuffer` (replay mode):
:meth:`SharedReplayBuffer.save` and :meth:`SharedReplayBuffer.load` call :func:`save_shared`
and :func:`load_shared`.

The checkpoint directory is that of :mod:`tfdata.replay.checkpoint` (the format and what a load
checks: docs/design/checkpoints.md), written and read with the same helpers
(:mod:`tfdata.replay.checkpoint_files`, :mod:`tfdata.replay.checkpoint_checker`); its state
is per shard (below).
"""

from __future__ import annotations

import os
import shutil

import numpy as np

from ..errors import FormatError, SharedBufferError, SpecError
from ..replay.checkpoint_checker import MAX_CAPACITY, MAX_RING_SIZE, MAX_SHORT_N_STEP
from ..replay.checkpoint_files import FORMAT, VERSION
from ..replay.samplers import shown as _show, state_key
from ..replay.samplers.exactly_k import OPTIONS as _EXACTLY_K_KEYS
from ..replay.samplers.prioritized import OPTIONS as _PRIORITIZED_KEYS
from ..replay.samplers.prioritized import EPOCH_RULE, odd_epoch
from ..replay.samplers.prioritized import leaves32 as _leaves32
from ..replay.samplers.without_replacement import read_undrawn as _read_undrawn
from ..spec import Spec
from ..storage import file_name, storage_nbytes

# the names the code below is written with
from ..replay.checkpoint_checker import (Checker as _Checker, available_memory as _available_memory,
                                         open_document as _open_document,
                                         sampler_part as _sampler_part, show_layout as _show_layout)
from ..replay.checkpoint_files import (ARRAYS as _ARRAYS, Arrays as _Arrays, begin as _begin,
                                       encode as _encode, finish as _finish, open_rows as _open_rows)

__all__ = ["save_shared", "load_shared", "MAX_WRITERS"]


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
    from ..replay.episodes import resolve_next_of, resolve_roles

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
        from ..replay.limiter import RateLimiter

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
        from ..replay.frames import resolve_frames
        from ..replay import shared_frames

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
        k = odd_epoch(versions)
        if k >= 0:
            c.fail("state.prioritized.versions", EPOCH_RULE, f"slot {k} = {int(versions[k])}, "
                   f"slot 0 = {int(versions[0])}", show=True)
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
