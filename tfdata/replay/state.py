"""A replay buffer's state dict: each part's state gathered, and a state checked as a whole.

:func:`gather` asks every part for its state; :func:`restore` asks every part to check its own
state (against its settings and the other parts': the writer's cursor and size, the rows) and
applies them only when all agree, so a refused state changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import SpecError
from ..spec import Spec
from .samplers import RNG_KEYS, sampler_name, state_key
from .writers import RingWriter

STATE_FORMAT = "tfdata.ReplayBuffer"
STATE_VERSION = 1
#: the keys of a state dict that are not a sampler's: every other key is the part a sampler
#: keeps beyond its RNG position, under its name (:func:`tfdata.replay.samplers.state_key`)
STATE_KEYS = frozenset({"format", "version", "spec", "capacity", "layout", "writer", "sampler",
                        "data", "num_envs", "episodes", "frames", "stats", "rate_limiter"})


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
    with parts.lock:
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
