"""A replay buffer's state dict: each part's state gathered, and a state checked as a whole.

:func:`gather` asks every part for its state; :func:`restore` asks every part to check its own
state (against its settings and the other parts': the writer's cursor and size, the rows) and
applies them only when all agree, so a refused state changes nothing. :class:`RingCheckpoint`
is the checkpoint part of such a buffer (the contract: :mod:`tfdata.replay.checkpoint`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import SpecError
from ..spec import Spec
from .samplers import RNG_KEYS, sampler_name, state_key
from .writers import RingWriter
from ..transforms import check_states, from_config

STATE_FORMAT = "tfdata.ReplayBuffer"
STATE_VERSION = 1
#: the keys of a state dict that are not a sampler's: every other key is the part a sampler
#: keeps beyond its RNG position, under its name (:func:`tfdata.replay.samplers.state_key`)
STATE_KEYS = frozenset({"format", "version", "spec", "capacity", "layout", "writer", "sampler",
                        "data", "num_envs", "episodes", "frames", "stats", "rate_limiter",
                        "transforms"})


def gather(parts, copy: bool) -> dict:
    """The state dict of ``parts`` (lock held): the rows as views (``copy=False``) or copies."""
    plan, size = parts.plan, parts.writer.size
    state = {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "spec": plan.spec.to_dict(),
        "capacity": plan.capacity,
        "layout": plan.layout,
        "writer": parts.writer.state_dict(),
        "sampler": parts.sampler.state_dict(),
        "data": parts.storage.state_dict(size, copy),
        "num_envs": plan.num_envs,
        "episodes": None if parts.episodes is None else parts.episodes.state_dict(size, copy),
    }
    if parts.frame_stacks is not None:
        state["frames"] = parts.frame_stacks.state_dict(size, copy)
    key = state_key(parts.sampler)
    if key is not None:  # what the sampler keeps beyond its RNG position, under its name
        state[key] = parts.sampler.extra_state(size)
    if parts.stats is not None:
        state["stats"] = parts.stats.state_dict()
    if parts.limiter is not None:
        state["rate_limiter"] = parts.limiter.state_dict()
    if parts.sample_transforms:  # their RNG positions (None for a transform without state)
        state["transforms"] = [t.state_dict() for t in parts.sample_transforms]
    return state


def check_sampler_part(sampler, state: Mapping) -> None:
    """ValueError unless the sampler part of ``state`` (its keys beyond :data:`STATE_KEYS`) is
    exactly ``sampler``'s (:func:`~tfdata.replay.samplers.state_key`, or none for a sampler
    with nothing beyond its RNG): a sampler never sees another sampler's state, which it would
    drop (an exactly-k pool loaded by a uniform buffer: rows delivered sampled again) or
    misread. The message names both samplers."""
    own = state_key(sampler)
    parts = [k for k in state if k not in STATE_KEYS]
    if parts == ([own] if own else []):
        return
    mine = sampler_name(sampler)
    if not parts:
        saved, what = "uniform", "no sampler state beyond the RNG"
    elif len(parts) == 1:
        saved, what = str(parts[0])[:60], f"its {str(parts[0])[:60]!r} entry"
    else:
        saved = " and ".join(repr(str(p)[:60]) for p in parts[:4])
        what = "entries of several samplers"
    hint = ("build a PrioritizedReplayBuffer" if saved == "prioritized"
            else f"build the buffer with sampler={saved!r}")
    raise ValueError(f"sampler state: this state was saved by a buffer sampling with {saved!r} "
                     f"({what}), but this buffer samples with {mine!r}"
                     + (f" (its {own!r} entry is missing)" if own and own not in parts else "")
                     + f": a sampler's state loads only into the same sampler (another would "
                     f"drop or misread it, e.g. sample again rows already delivered); {hint} "
                     f"to load it")


def sampler_state(sampler, state: Mapping) -> dict:
    """The flat state of ``sampler`` in the buffer state dict ``state`` (whose sampler part is
    ``sampler``'s, see :func:`check_sampler_part`): its RNG position (``state["sampler"]``)
    and what it keeps (under its :func:`~tfdata.replay.samplers.state_key`), as one dict."""
    rng, key = state.get("sampler"), state_key(sampler)
    if not isinstance(rng, Mapping):
        raise ValueError(f"sampler state: 'sampler' must be a dict of {list(RNG_KEYS)}, got "
                         f"{type(rng).__name__}")
    if key is None:
        return dict(rng)
    own = state[key]
    if not isinstance(own, Mapping):
        raise ValueError(f"sampler state: {key!r} must be a dict, got {type(own).__name__}")
    clash = [k for k in own if k in rng]
    if clash:
        raise ValueError(f"sampler state: {key!r} holds {clash[:2]}, the keys of the RNG position")
    return {**rng, **own}


def _limiter_counts(limiter, state, size: int) -> dict:
    """The rate limiter's counts from a state (checked); a state without them (saved from a
    buffer without a limiter) starts balanced: the rows held inserted, and the samples the
    ratio expects of them beyond the minimum size."""
    if state is None:
        beyond = max(0, size - limiter.min_size_to_sample)
        return {"inserts": size, "samples": int(beyond * limiter.samples_per_insert)}
    return limiter.check_state(state, size)


def restore(parts, state: Mapping, release=None, records=None) -> None:
    """Check ``state`` as a whole against ``parts``, then load it under the lock (see
    ``ReplayCore.load_state_dict``)."""
    plan = parts.plan
    if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
        raise ValueError(f"not a {STATE_FORMAT} state dict")
    if state.get("version") != STATE_VERSION:
        raise ValueError(f"unsupported state version {state.get('version')!r} "
                         f"(this tfdata reads version {STATE_VERSION})")
    spec = Spec.from_dict(state["spec"])
    if spec != plan.spec:
        raise SpecError(f"state spec {spec} differs from this buffer's spec {plan.spec}")
    if state["capacity"] != plan.capacity:
        raise ValueError(f"state capacity {state['capacity']} differs from this buffer's "
                         f"capacity {plan.capacity}")
    if state.get("num_envs", 1) != plan.num_envs:
        raise ValueError(f"state num_envs {state.get('num_envs')} differs from this buffer's "
                         f"{plan.num_envs}")
    check_sampler_part(parts.sampler, state)
    writer = RingWriter(plan.capacity, plan.num_envs)
    writer.load_state_dict(state["writer"])
    size = writer.size
    sampler = parts.sampler.check_state(sampler_state(parts.sampler, state), size, plan.capacity)
    data = state["data"]
    for f in parts.storage.spec:
        arr = data.get(f.name) if isinstance(data, Mapping) else None
        if not isinstance(arr, np.ndarray):
            raise SpecError(f"state data: field {f.name!r} missing or not an ndarray")
        if arr.shape != (size,) + f.shape or arr.dtype != f.dtype:
            raise SpecError(f"state data: field {f.name!r}: expected {f.dtype}{(size,) + f.shape}, "
                            f"got {arr.dtype}{arr.shape}")
    episodes = None
    if parts.episodes is not None:
        episodes = parts.episodes.check_state(state.get("episodes"), size)
    frames = None
    if parts.frame_stacks is not None:  # its counters against the writer's and the rows'
        ends = None
        if size:  # whether each stream's newest row ended an episode (num_envs reads)
            newest = (writer.cursor - plan.num_envs + np.arange(plan.num_envs)) % plan.capacity
            ends = data[plan.roles["terminated"]][newest] | data[plan.roles["truncated"]][newest]
        frames = parts.frame_stacks.check_state(state.get("frames"), size, writer.cursor, ends)
    if parts.stats is not None:  # against the state's rows: a refused state changes nothing
        parts.stats.check_state(state.get("stats"), size, data)
    counts = None
    if parts.limiter is not None:
        counts = _limiter_counts(parts.limiter, state.get("rate_limiter"), size)
    transforms = check_states(parts.sample_transforms, state.get("transforms"))
    with parts.lock:
        for t, st in zip(parts.sample_transforms, transforms):
            if st is not None:
                t.load_state(st)
        if counts is not None:
            parts.limiter.load_state(counts)
        parts.storage.load_state_dict(data, size, release, records)
        parts.writer.load_state_dict(writer.state_dict())
        parts.sampler.load_state(sampler)
        if episodes is not None:
            parts.episodes.load_state(episodes, size)
        if frames is not None:
            parts.frame_stacks.load_state(frames, size)
        for c in parts.cold.values():  # compressed from the rows just loaded
            c.rebuild(parts.writer.cursor, size)
        if parts.stats is not None:
            parts.stats.rebuild()  # from the rows just loaded


class RingCheckpoint:
    """The checkpoint part of a buffer over a ring of streams (:class:`tfdata.ReplayBuffer`,
    :class:`tfdata.PrioritizedReplayBuffer`): its rows are the ``size`` oldest slots, its state
    the state dict of :func:`gather` (the contract: :mod:`tfdata.replay.checkpoint`)."""

    # -- save ---------------------------------------------------------------------------------
    @staticmethod
    def unsaved_reason(buffer) -> str | None:
        for t in buffer.transforms:
            reason = t.unsaved_reason()
            if reason is not None:
                return reason
        return type(buffer).unsaved_reason(buffer.sampler)

    @staticmethod
    def saved_rows(state: dict) -> int:
        state.pop("data")  # the rows go from the storage to the rows file
        return state["writer"]["size"]

    @staticmethod
    def settle(buffer, state: dict) -> dict:
        return state

    # -- load ---------------------------------------------------------------------------------
    @staticmethod
    def options(given: dict) -> dict:
        """``spill_path`` and ``hot_rows`` / ``hot_bytes`` (a checkpoint does not record where a
        buffer spilled), ``allocator`` and ``memory_budget`` (not recorded either), ``stats`` (a
        list of fields, or None, instead of ``config.stats``) and ``layout``."""
        from .. import alloc
        from .._budget import parse_bytes
        from .checkpoint_checker import OVERRIDES

        bad = set(given) - set(OVERRIDES) - {"stats", "layout", "transforms"}
        if bad:
            raise TypeError(f"load: unexpected keyword(s) {sorted(bad)}; allowed: "
                            f"{OVERRIDES + ('stats', 'layout', 'samplers', 'transforms')}")
        given = dict(given)
        allowed = given.pop("transforms", ())
        allowed = () if allowed is None else allowed
        if isinstance(allowed, (str, bytes)) or not hasattr(allowed, "__iter__"):
            raise TypeError(f"load: transforms must be a list of functions, got "
                            f"{type(allowed).__name__}")
        wanted = {"stats": given.pop("stats")} if "stats" in given else {}
        layout = given.pop("layout", None)
        budget = given.get("memory_budget")
        if given.get("allocator") is not None:
            given["allocator"] = alloc.resolve(given["allocator"])
        return {"wanted": wanted, "layout": layout, "rest": given, "transforms": list(allowed),
                "budget": None if budget is None else parse_bytes("memory_budget", budget)}

    @staticmethod
    def read(c, arrays, doc, cls, sampler, known, options) -> dict:
        """Check ``doc``'s config and state (what the constructor derives from them too,
        without building anything); the state's arrays are read by :meth:`build`."""
        from ..errors import FormatError
        from ..storage import file_name, resolve_layout
        from . import limiter
        from .checkpoint_checker import available_memory, show_layout
        from .episodes import resolve_next_of, resolve_roles
        from .samplers import shown

        name, st = doc["class"], doc["state"]
        sname, scls = sampler
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
        c.obj("state", st, state_keys, optional=("stats", "transforms"))
        if st["format"] != STATE_FORMAT or type(st["version"]) is not int or st["version"] != 1:
            raise FormatError(f"{c.spath}: state: format {shown(st['format'])} version "
                              f"{shown(st['version'])} is not a tfdata.ReplayBuffer state of "
                              f"version 1")
        spec = c.spec(st["spec"])
        config, sampler_config = c.config(doc["config"], spec)
        if "transforms" in config:  # user functions resolved only among the caller's
            config["transforms"] = from_config(config["transforms"], options["transforms"],
                                               f"{c.spath}: config.transforms")
        cap, layout, envs = config["capacity"], config["layout"], config["num_envs"]
        for k, want in (("capacity", cap), ("num_envs", envs)):
            if type(st[k]) is not type(want) or st[k] != want:
                c.fail(f"state.{k}", f"{want!r} (config.{k})", st[k])
        if c.layout("state.layout", st["layout"], spec) != layout:
            c.fail("state.layout", f"{show_layout(layout)} (config.layout)", st["layout"])
        rng = dict(c.sampler(st["sampler"]))
        try:  # the sampler's own options, by its class (a sampler given to load: its check)
            sm = scls.from_config(sampler_config, rng["seed"])
        except (TypeError, ValueError, KeyError, OverflowError) as exc:
            raise c.caught(exc, "config") from None
        writer = c.obj("state.writer", st["writer"], ("cursor", "size"))
        size = c.integer("state.writer.size", writer["size"], 0, cap)
        cursor = c.integer("state.writer.cursor", writer["cursor"], 0, cap - 1)
        if size % envs:
            c.fail("state.writer.size", f"a multiple of num_envs {envs}", size)
        # a sampler that places a step's rows in free slots (exactly-k): they need not be
        # adjacent, so its cursor (past the last slot written) need not be a multiple of num_envs
        in_steps = getattr(sm, "stream_order", True)
        if (in_steps and cursor % envs) or (size < cap and cursor != size):
            c.fail("state.writer.cursor", f"{size} (the size, until the ring is full)"
                   if size < cap else f"a multiple of num_envs {envs}", cursor)

        # what the constructor derives from the config, checked without building anything
        opts = {**{k: v for k, v in config.items() if k != "capacity"}, **cls.sampler_options(sm)}
        try:
            roles = resolve_roles(spec, config["roles"])
            next_of = resolve_next_of(spec, config["next_of"])
            cls.plan_memory(spec, cap, **opts)
            # what the saved buffer stored, and in which layout (a stacked field's frames are a
            # column of their own: its rows file is a grouped directory even for "aos")
            saved = cls.plan_storage(spec, cap, **opts)
        except (SpecError, ValueError, TypeError, KeyError, OverflowError) as exc:
            raise FormatError(f"{c.spath}: config: {str(exc)[:300]}") from None
        wanted = options["wanted"]
        if wanted:  # the caller's: checked as the constructor checks it, errors theirs
            cls.plan_memory(spec, cap, **{**opts, **wanted})
            config = {**config, **wanted}
            opts = {**opts, **wanted}
        if config["roles"] != roles or config["next_of"] != next_of:
            c.fail("config.roles/next_of", f"the resolved roles {roles} and next_of {next_of}",
                   show=False)
        if options["layout"] is not None:  # the caller's layout (their error, not the file's)
            config["layout"] = opts["layout"] = resolve_layout(options["layout"], spec)
        rest = options["rest"]
        spill = {k: rest[k] for k in ("spill_path", "hot_rows", "hot_bytes") if k in rest}
        plan = cls.plan_memory(spec, cap, **opts, **spill)  # the caller's spill settings: theirs
        need = int(sum(plan.values()))
        # a memory_budget is the caller's: the constructor refuses it (MemoryBudgetError, before
        # allocating), since the file is not at fault; without one the machine's memory bounds it
        if options["budget"] is None and need > available_memory():
            raise FormatError(f"{c.spath}: config.capacity {cap} would make the buffer hold {need} "
                              f"bytes ({plan}), more than the memory available on this machine "
                              f"({available_memory()} bytes); refused before allocating")
        rows_name = file_name(saved["layout"], "rows")
        if limited:  # rebuilt as an object for the constructor (its counts: checked by build)
            config = dict(config, rate_limiter=limiter.RateLimiter(**config["rate_limiter"]))
        return {"rows_name": rows_name, "stored": saved["stored"], "rows": size,
                "rows_why": f"{rows_name} (layout {show_layout(layout)}"
                            + (", frames stored as a column)" if saved["frames"] else ")"),
                "rows_of": f"the state says {size}", "arrays": arrays, "doc": doc, "spec": spec,
                "config": config, "sampler": sm, "key": key, "rng": rng, "cursor": cursor,
                "roles": roles, "saved": saved, "saved_layout": layout, "limited": limited,
                "framed": framed}

    @staticmethod
    def build(c, p: dict, ds, cls, options):
        """Read the state's arrays (each part's reader), build the buffer and load the rows of
        ``ds`` into it, then check what needs the rows loaded (episode order, frame stacks,
        statistics)."""
        from ..errors import FormatError
        from . import columns, episodes, frames as frame_stacks, limiter
        from .checkpoint_checker import sampler_part

        arrays, st, doc, spec, config = p["arrays"], p["doc"]["state"], p["doc"], p["spec"], p["config"]
        cap, envs, size, cursor = config["capacity"], config["num_envs"], p["rows"], p["cursor"]
        roles, saved, key, sm = p["roles"], p["saved"], p["key"], p["sampler"]
        stored = saved["stored"]
        episodes_ = None
        if saved["episodes"] is not None:  # exactly-k writes off stream order: no episode numbers
            # (with frame_stack: over the stored frames, next fields of stacked fields elided)
            ep_spec, ep_next, ep_elide = saved["episodes"]
            episodes_ = episodes.read_state(c, arrays, st["episodes"], ep_next, ep_spec, ep_elide,
                                            envs, size)
        elif st["episodes"] is not None:
            c.fail("state.episodes", "null (the spec has no terminated and truncated fields, "
                   "or sampler='exactly_k')" if "terminated" in roles and "truncated" in roles
                   else "null (the spec has no terminated and truncated fields)", st["episodes"])
        state = {"format": STATE_FORMAT, "version": 1, "spec": spec.to_dict(), "capacity": cap,
                 "layout": p["saved_layout"],
                 "writer": {"cursor": cursor, "size": size}, "sampler": p["rng"],
                 "num_envs": envs, "episodes": episodes_}
        if key is not None:  # what the sampler keeps, checked by the sampler itself
            state[key] = part = sampler_part(c, arrays, st[key], key, cap)
            try:
                sm.check_state({**p["rng"], **part}, size, cap)
            except (TypeError, ValueError, KeyError, IndexError, OverflowError) as exc:
                raise c.caught(exc, f"state.{key}") from None
        frames = None
        if p["framed"]:
            frames = state["frames"] = frame_stacks.read_state(
                c, arrays, st["frames"], saved["frames"]["stacks"], spec, envs, size, cap, cursor)
        # statistics of a stacked field are of its frames: the stored shape
        stats = columns.read_state(c, arrays, st.get("stats"), doc["config"].get("stats"), stored,
                                   size)
        if p["limited"]:  # checked with the config
            state["rate_limiter"] = limiter.read_state(c, st["rate_limiter"], size,
                                                       doc["config"]["rate_limiter"])
        buf = c.rebuild(cls, spec, **config, **cls.sampler_options(sm), **options["rest"])
        if "transforms" in config and "transforms" not in st:
            c.fail("state.transforms", "a list of the transforms' states (config.transforms "
                   "lists transforms)", show=False)
        if "transforms" in st:  # their RNG positions, checked by each (JSON values only)
            try:
                state["transforms"] = check_states(buf.transform_parts, st["transforms"])
            except (TypeError, ValueError) as exc:
                raise c.caught(exc, "state.transforms") from None
            state["transforms"] = st["transforms"]
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
            raise FormatError(f"{c.spath}: {type(exc).__name__}: {str(exc)[:300]}") from None
        finally:
            state["data"] = None
        if order is not None:
            # against the flags as loaded, in memory: reading them from the mapped file first
            # would fault in every page of an AoS file twice
            order.finish()
        if frames is not None:
            store = buf.storage
            frame_stacks.check_order(c, frames, store.field(roles["terminated"]),
                                     store.field(roles["truncated"]), cursor, size, envs, cap)
        # the state's statistics were left out of load_state_dict (which would compute them from
        # the mapped rows first): the buffer computed them from the rows in memory; they must agree
        columns.compare_state(c, arrays, st.get("stats"), stats, buf)
        return buf
