"""The checkpoint part of a replay region (:class:`ShardCheckpoint`; the contract of a
buffer's checkpoint part: :mod:`tfdata.replay.checkpoint`): the configuration, a snapshot of the
state as of the shards' heads, the rows writers overwrote while they were copied, the checks of
a checkpoint's state before a region is created and the restore of a new region.

A SharedReplayBuffer's checkpoint has the files of any checkpoint; its state says, per shard, the
rows its writer had published when the save began ("heads") and how many of the oldest of them
the writer was overwriting while the rows were copied ("dropped": left out). Rows are every slot
of the region, in slot order. Without replacement, config.sampler is "without_replacement"
(absent: uniform) and state.without_replacement holds the pass as for a ReplayBuffer (undrawn
slots of held rows, each once; passes), every published row added before the save. With frame
stacks, config has frame_stack, frame_padding and final_frames, the rows are the stored ones (one
frame per row, no elided next field) and state.frames holds what the kept rows' stacks read
besides them (:func:`_read_frames`); heads and dropped then say which rows were kept
(:meth:`ShardCheckpoint.finish` may leave out more than the rows overwritten).
"""

from __future__ import annotations

import contextlib

import numpy as np

from .._checks import check_slot_list
from ..errors import FormatError, SharedBufferError, SpecError
from ..replay import limiter
from . import frames as shared_frames
from ..replay.checkpoint_checker import available_memory, sampler_part, show_layout
from ..replay.frames import padding_config, resolve_frames
from ..replay.samplers import state_key
from ..replay.samplers.exactly_k import OPTIONS as _EXACTLY_K_KEYS, ExactlyKSampler
from ..replay.samplers.prioritized import OPTIONS as _PRIORITIZED_KEYS
from ..replay.samplers.prioritized import EPOCH_RULE, PrioritizedSampler, leaves32, odd_epoch, read_scalars
from ..replay.samplers.without_replacement import read_undrawn
from ..storage import file_name, storage_nbytes
from ..transforms import Normalize, check_states, from_config
from .region import CURSOR, HEAD, RESERVED, SAMPLES

__all__ = ["ShardCheckpoint", "MAX_WRITERS"]

_CONFIG = ("capacity", "layout", "ring_size", "num_writers", "prioritized", "n_step",
           "gamma", "next_of", "roles")
_STATE = ("format", "version", "spec", "capacity", "layout", "num_writers", "heads",
          "dropped", "sampler", "prioritized")
# frame stacks (config keys present together, with state.frames: see shared/frames.py)
_FRAME_KEYS = ("frame_stack", "frame_padding", "final_frames")
MAX_WRITERS = 4096
_MAX_HEAD = (1 << 62) - 1


def _read_transforms(c, config: dict, st: dict, options: dict):
    """``(descriptions, states)`` of config.transforms and state.transforms (None: the buffer
    has none), the user functions resolved only among those given to load; the states are
    checked by the parts once the buffer is rebuilt."""
    if "transforms" not in config:
        if "transforms" in st:
            c.fail("state.transforms", "absent (config.transforms lists no transforms)", show=False)
        return None
    got = from_config(config["transforms"], options["transforms"], f"{c.spath}: config.transforms")
    for i, t in enumerate(got):
        if isinstance(t, Normalize):  # the constructor would refuse it: the file's error
            c.fail(f"config.transforms[{i}]", "a transform a SharedReplayBuffer runs (not "
                   "normalize: it keeps no running statistics)", t.name)
    if "transforms" not in st:
        c.fail("state.transforms", "a list of the transforms' states (config.transforms lists "
               "transforms)", show=False)
    return got, st["transforms"]


def _exactly_k_config(c, v: dict) -> None:
    """``replays``, ``policy``, ``timeout``: present exactly when ``config.sampler`` is
    ``"exactly_k"`` (checked by :meth:`ExactlyKSampler.from_config`)."""
    if v.get("sampler") != "exactly_k":
        for k in _EXACTLY_K_KEYS:
            if k in v:
                c.fail("config." + k, "absent (config.sampler is not 'exactly_k')", v[k])
        return
    try:
        ExactlyKSampler.from_config({k: v[k] for k in _EXACTLY_K_KEYS if k in v}, 0)
    except (TypeError, ValueError) as exc:
        raise c.caught(exc, "config") from None


def _held_slots(c, where: str, slots: np.ndarray, held: np.ndarray, per: int) -> None:
    """Refuse ``slots`` unless each is a slot of a row a shard held (``held`` rows per shard
    of ``per`` slots, from its first), none twice."""
    bad = (slots < 0) | (slots >= per * held.shape[0])
    bad[~bad] = slots[~bad] % per >= held[slots[~bad] // per]
    if bad.any() or np.unique(slots).shape[0] != slots.shape[0]:
        i = int(np.argmax(bad)) if bad.any() else None
        c.fail(where, "slots of rows the shards held, each once",
               f"slot {int(slots[i])} at position {i}" if i is not None else "a slot twice")


def _read_pool(c, arrays, part, heads: list, per: int, replays: int) -> tuple:
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
    _held_slots(c, w + "slots", slots, held, per)
    bad = np.flatnonzero((counts < 1) | (counts > replays))
    if bad.size:
        c.fail(f"{w}counts[{int(bad[0])}]", f"an int in [1, {replays}] (config.replays)",
               int(counts[bad[0]]))
    if part["released"] != sum(heads) - m:
        c.fail(w + "released", f"{sum(heads) - m} (the rows published, sum of state.heads, less "
               f"the {m} awaiting replay)", part["released"])
    return slots, counts, part["delivered"], part["released"], list(cursors)



def _read_frames(c, arrays, part, spec, frames: dict, cap: int, shards: int) -> dict:
    """``state.frames`` of a :class:`tfdata.SharedReplayBuffer` with ``frame_stack``: ``stacks``
    (the config's), ``depth`` uint8[capacity] in ``[0, K - 1]``, ``final_slots`` int64 (at most
    the capacity, from the header), ascending slots, ``finals`` (one array of final frames per
    next field of a stacked field, a row per final slot), ``pending`` (one frame per shard) and
    ``back`` (``K - 1`` frames per shard, per stacked field). Their agreement with the rows is
    checked once the rows are open (:func:`tfdata.shared.frames.check_checkpoint`)."""
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



class ShardCheckpoint:
    """The checkpoint part of a :class:`~tfdata.SharedReplayBuffer` over its ``region``: its
    ``sampler``, ``lock``, compiled ``kernels`` and rate ``limiter`` (or None), the buffer's
    ``name`` (for messages), ``ring_size`` and ``prioritized``, ``episodes`` (the buffer's
    ``n_step``, ``gamma``, ``next_of`` and ``roles``), ``streams`` (its
    :class:`~tfdata.shared.streams.ShardStreams`, which catch the sampler up on the rows
    published), ``given`` (the sampler is an object the caller gave: saved by its name and
    ``config()``) and ``transforms`` (the bound parts of ``transforms=``: their descriptions
    in the config, their states, a RandomShift's counter, in the state)."""

    def __init__(self, region, sampler, lock, kernels, limiter, name: str, ring_size: int,
                 prioritized: bool, episodes: dict, streams, given: bool, transforms=()):
        self._region = region
        self._sampler = sampler
        self._lock = lock
        self._k = kernels
        self._limiter = limiter
        self.name = name
        self._ring_size = ring_size
        self._prioritized = prioritized
        self._capacity = region.shards * region.cap
        self._n_step, self._gamma = episodes["n_step"], episodes["gamma"]
        self._next_of, self._roles = episodes["next_of"], episodes["roles"]
        self._streams = streams
        self._given = given
        self._transforms = list(transforms)

    def config(self) -> dict:
        """The constructor's keyword arguments that rebuild this buffer (what a checkpoint keeps)."""
        r = self._region
        cfg = {"capacity": self._capacity, "layout": r.layout, "ring_size": self._ring_size,
               "num_writers": r.shards, "prioritized": self._prioritized,
               "n_step": self._n_step, "gamma": self._gamma, "next_of": dict(self._next_of),
               "roles": dict(self._roles)}
        fr = r.frames
        if fr is not None:  # absent: no frame stacks (checkpoints as before)
            cfg.update(frame_stack=dict(fr.stacks), frame_padding=padding_config(fr.frames),
                       final_frames=fr.final_frames)
        if self._given:  # a sampler object (a user's too): its name (None: never saved), config()
            name = getattr(self._sampler, "name", None)
            cfg["sampler"] = name if isinstance(name, str) and name else None
            if cfg["sampler"] is not None:
                cfg.update(self._sampler.config())
        elif self._streams.sampling == "without_replacement":
            cfg["sampler"] = self._sampler.name  # absent: uniform (checkpoints as before)
        if r.exactly_k:
            sm = self._sampler
            cfg.update(sampler="exactly_k", replays=sm.replays, policy=r.policy, timeout=sm.timeout)
        if self._prioritized:
            sm = self._sampler
            cfg.update(alpha=sm.alpha, beta=sm.beta_start, beta_final=sm.beta_final,
                       beta_steps=sm.beta_steps, eps=sm.eps)
        if self._limiter is not None:  # its parameters; the counts are in the state
            cfg["rate_limiter"] = self._limiter.params()
        if self._transforms:  # absent: none (checkpoints as before)
            cfg["transforms"] = [t.desc.config() for t in self._transforms]
        return cfg

    # -- save (the contract of tfdata.replay.checkpoint) -----------------------------------
    @staticmethod
    def unsaved_reason(buffer) -> str | None:
        return buffer.unsaved_reason()

    @staticmethod
    def saved_rows(state: dict) -> int:
        return state["capacity"]  # every slot, in slot order

    @staticmethod
    def settle(buffer, state: dict) -> dict:
        buffer.settle(state)
        return state

    @contextlib.contextmanager
    def snapshot(self):
        """Hold the lock, fold what the writers published (prioritized, without replacement,
        exactly-k: then the heads are the positions folded), read every shard's
        head, and yield the state as of those heads (views of the live arrays; valid inside the
        ``with``). Rows are the storage's; :meth:`overwritten_since` says which of them a writer
        touched since."""
        if self._region.mode == "fifo":
            raise SharedBufferError(f"shared buffer {self.name!r} is a FIFO queue: its rows are "
                                    f"in flight, not a state to checkpoint")
        r = self._region
        scratch = np.zeros(7 * r.shards + 1, np.int64)
        with self._lock:
            # the sampler hears every published row first (exactly-k: from the shards' logs):
            # the heads are the positions heard
            self._streams.catch_up(scratch)
            state = {"format": "tfdata.SharedReplayBuffer", "version": 1,
                     "spec": r.spec.to_dict(), "capacity": self._capacity, "layout": r.layout,
                     "num_writers": r.shards, "heads": [int(h) for h in scratch[r.shards:2 * r.shards]],
                     "dropped": None, "sampler": self._sampler.state_dict(), "prioritized": None}
            if self._prioritized:
                sm = self._sampler
                state["prioritized"] = {"alpha": sm.alpha, "eps": sm.eps, "samples": sm.samples,
                                        "leaves": sm.live_leaves(self._capacity), "versions": sm.version}
            if self._limiter is not None:  # inserts as of the heads saved
                state["rate_limiter"] = {"inserts": sum(state["heads"]),
                                         "samples": self._limiter.samples}
            # what the sampler keeps beyond its RNG, given the rows held (without replacement:
            # the pass; the priorities and an exactly-k pool have parts of their own)
            key = None if self._prioritized or r.exactly_k else state_key(self._sampler)
            if key is not None:
                state[key] = self._sampler.extra_state(int(scratch[:r.shards].sum()))
            if r.exactly_k:  # the pool in its order, the deliveries left, and the shards' own
                sm = self._sampler
                pool = sm.extra_state(0)
                state["exactly_k"] = {"slots": pool["slots"], "counts": pool["counts"],
                                      "delivered": sm.delivered, "released": sm.released,
                                      "cursors": [int(r.words(s)[CURSOR]) for s in range(r.shards)]}
            if r.frames is not None:  # as of the heads; settled by settle_frames after the rows
                state["frame_copies"] = shared_frames.copies(r.frames)
            if self._transforms:  # their RNG positions (None for a transform without state)
                state["transforms"] = [t.state_dict() for t in self._transforms]
            yield state

    def finish(self, state: dict) -> None:
        """After the rows of a :meth:`snapshot` were copied: per shard, the oldest rows a writer
        began overwriting since (``dropped``: left out; refused with a sampler object, whose
        state may name slots), the frames the rows kept read, the priorities in the form on
        disk (leaves float64, versions uint64: the trees hold float32 and uint32)."""
        state["dropped"] = self._overwritten(state["heads"])
        if any(state["dropped"]) and self._given:
            # a load moves a shard's kept rows to its first slots, which a state naming slots
            # (a sampler of the user's) cannot follow: refused, nothing written
            raise SharedBufferError(
                f"save: writers overwrote {state['dropped']} of the oldest rows of each shard "
                f"while they were copied; with a sampler object ({type(self._sampler).__name__}"
                f", whose state may name slots) the rows must keep their slots: save again, "
                f"or while the writers pause")
        if "frame_copies" in state:  # frame stacks: what the kept rows' stacks read
            self._settle_frames(state)
        pri = state.get("prioritized")
        if pri is not None:
            pri["leaves"] = np.asarray(pri["leaves"], np.float64)
            pri["versions"] = np.asarray(pri["versions"], np.uint64)

    def _overwritten(self, heads: list) -> list:
        """Per shard, how many of the rows held at ``heads`` its writer has begun overwriting
        since (the oldest of them: a writer overwrites in order). Exactly-k: none (a writer
        writes only free slots, never a row awaiting replay)."""
        r = self._region
        if r.exactly_k:
            return [0] * r.shards
        out = []
        for s, h in enumerate(heads):
            begun = int(r.reserved[s])  # read after the copy it judges
            held = min(h, r.cap)
            out.append(max(0, min(held, begun - r.cap - max(0, h - r.cap))))
        return out

    def _settle_frames(self, state: dict) -> None:
        """After the rows of a :meth:`snapshot` were copied (frame stacks only): the rows the
        checkpoint keeps (``heads``, ``dropped``) and its ``frames`` part, from the frame arrays
        copied with the heads and frames read now (see
        :func:`tfdata.shared.frames.checkpoint_state`)."""
        r = self._region
        old = state["heads"]
        heads, dropped, frames = shared_frames.checkpoint_state(
            r.frames, r.storage, r.reserved, old, state.pop("frame_copies"), self._k)
        state.update(heads=heads, dropped=dropped, frames=frames)
        pri = state["prioritized"]
        if pri is not None and heads != old:
            # a shard that keeps its slots (dropped 0) but not its newest row: that slot's
            # leaf goes (the others of a shard moved to its first slots are rebuilt by restore)
            leaves = np.array(pri["leaves"], copy=True)  # a copy: never the live trees
            for s, (h, was, t) in enumerate(zip(heads, old, dropped)):
                if t == 0:
                    for q in range(h, was):
                        leaves[s * r.cap + q % r.cap] = 0.0
            pri["leaves"] = leaves
        if "rate_limiter" in state:  # inserts as of the heads kept
            state["rate_limiter"]["inserts"] = sum(heads)

    # -- load (the contract of tfdata.replay.checkpoint) -----------------------------------
    @staticmethod
    def options(given: dict) -> dict:
        """``name``, ``dir``, ``memory_budget`` (the new region's) and ``layout`` (another layout
        for the new region: the rows are copied field by field)."""
        from .._budget import parse_bytes

        bad = set(given) - {"name", "dir", "memory_budget", "layout", "transforms"}
        if bad:
            raise TypeError(f"load: unexpected keyword(s) {sorted(bad)}; allowed: name, dir, "
                            f"memory_budget, layout, samplers, transforms")
        allowed = given.get("transforms", ())
        allowed = () if allowed is None else allowed
        if isinstance(allowed, (str, bytes)) or not hasattr(allowed, "__iter__"):
            raise TypeError(f"load: transforms must be a list of functions, got "
                            f"{type(allowed).__name__}")
        rest = {k: v for k, v in given.items() if k not in ("layout", "transforms")}
        budget = rest.get("memory_budget")
        if budget is not None:
            parse_bytes("memory_budget", budget)  # the caller's error, not the file's
        return {"layout": given.get("layout"), "rest": rest, "budget": budget,
                "transforms": list(allowed)}

    @staticmethod
    def read(c, arrays, doc, cls, sampler, known, options) -> dict:
        """Check ``doc``'s config and state and read its arrays, before the region exists."""
        from ..kernels._tree import MAX_LEAF, MIN_LEAF, tree_nbytes
        from ..replay.episodes import resolve_next_of, resolve_roles
        from ..storage import resolve_layout

        limited = isinstance(doc["config"], dict) and "rate_limiter" in doc["config"]
        v = doc["config"]
        sname, scls = sampler
        # a sampler of the user's (given to load): its options are the config's keys beside the
        # buffer's, its part of the state under its state key
        ucls = None if sname in cls.SAMPLERS else scls
        ukey = None if ucls is None else state_key(ucls)
        ucfg = None
        if ucls is not None:
            own = set(_CONFIG) | {"sampler", "rate_limiter", "transforms"}
            ucfg = {k: x for k, x in v.items() if k not in own}
            v = doc["config"] = {k: x for k, x in v.items() if k in own}
            if v.get("prioritized") is not False:
                c.fail("config.prioritized", f"false (config.sampler is {sname!r})", v.get("prioritized"))
        ek, wor = sname == "exactly_k", sname == "without_replacement"
        if (ek or wor) and v.get("prioritized") is not False:
            c.fail("config.sampler", "'without_replacement' or 'exactly_k' with prioritized false "
                   "(absent: uniform)", v["sampler"])
        framed = isinstance(v, dict) and any(k in v for k in _FRAME_KEYS)
        st = c.obj("state", doc["state"], _STATE + (("rate_limiter",) if limited else ())
                   + (("without_replacement",) if wor else ()) + (("exactly_k",) if ek else ())
                   + (("frames",) if framed else ()) + ((ukey,) if ukey else ()),
                   optional=("transforms",))
        if st["format"] != "tfdata.SharedReplayBuffer" or st["version"] != 1 or type(st["version"]) is not int:
            c.fail("state.format", "a tfdata.SharedReplayBuffer state of version 1", st["format"])
        spec = c.spec(st["spec"])
        cf = "config."
        v = doc["config"]
        c.no_overrides(v, ("name", "dir"))
        prioritized = isinstance(v, dict) and v.get("prioritized") is True
        config = c.obj("config", v, _CONFIG + (_PRIORITIZED_KEYS if prioritized else ())
                       + (_FRAME_KEYS if framed else ()),
                       optional=("rate_limiter", "sampler", "transforms") + _EXACTLY_K_KEYS)
        _exactly_k_config(c, config)  # replays, policy, timeout: present exactly with exactly_k
        transforms = _read_transforms(c, config, st, options)
        if ek and config["policy"] == "overwrite":
            c.fail("config.policy", "'block' or 'drop' (a SharedReplayBuffer)", config["policy"])
        cap, layout, shards = c.streams(config, spec, "num_writers", MAX_WRITERS)
        c.flag(cf + "prioritized", config["prioritized"])
        if prioritized:
            try:
                PrioritizedSampler.from_config({k: config[k] for k in _PRIORITIZED_KEYS}, 0)
            except (TypeError, ValueError) as exc:
                raise c.caught(exc, "config") from None
        if limited:
            limiter.read_config(c, config["rate_limiter"], cap)
        saved_layout = layout
        if options["layout"] is not None:  # the caller's layout (their error, not the file's)
            layout = resolve_layout(options["layout"], spec)
        for k, want in (("capacity", cap), ("num_writers", shards)):
            if type(st[k]) is not type(want) or st[k] != want:
                c.fail(f"state.{k}", f"{want!r} (config.{k})", st[k])
        if c.layout("state.layout", st["layout"], spec) != saved_layout:
            c.fail("state.layout", f"{show_layout(saved_layout)} (config.layout)", st["layout"])
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
        rate_limiter = counts = None
        if limited:  # the counts: inserts are the heads' sum (what the writers published)
            counts = limiter.read_state(c, st["rate_limiter"], sum(min(h, per) for h in heads))
            if counts["inserts"] != sum(heads):
                c.fail("state.rate_limiter.inserts", f"{sum(heads)} (the sum of state.heads)",
                       counts["inserts"])
            rate_limiter = limiter.RateLimiter(**config["rate_limiter"])
        try:
            roles = resolve_roles(spec, config["roles"])
            next_of = resolve_next_of(spec, config["next_of"])
        except (SpecError, ValueError, TypeError, KeyError) as exc:
            raise FormatError(f"{c.spath}: config: {str(exc)[:300]}") from None
        if config["roles"] != roles or config["next_of"] != next_of:
            c.fail("config.roles/next_of", f"the resolved roles {roles} and next_of {next_of}", show=False)
        frames = frame_part = final_frames = None
        stored_spec, stored_layout = spec, saved_layout
        if framed:
            if type(config["final_frames"]) is not int:
                c.fail(cf + "final_frames", "an int", config["final_frames"])
            try:
                frames = resolve_frames(spec, config["frame_stack"], config["frame_padding"], next_of,
                                        "terminated" in roles and "truncated" in roles)
                if frames is None:
                    raise ValueError("frame_stack: None")
                final_frames = shared_frames.check_options(spec, frames, per, config["final_frames"])
            except (SpecError, ValueError, TypeError) as exc:
                raise FormatError(f"{c.spath}: config.frame_stack / frame_padding / final_frames: "
                                  f"{str(exc)[:300]}") from None
            stored_spec, stored_layout = shared_frames.stored(spec, frames, saved_layout)
            frame_part = _read_frames(c, arrays, st["frames"], spec, frames, cap, shards)
        pri = None
        if prioritized:
            pri = st["prioritized"]
            read_scalars(c, pri, config)
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
        if options["budget"] is None and need > available_memory():
            raise FormatError(f"{c.spath}: config.capacity {cap} would need {need} bytes, more than the "
                              f"memory available on this machine; refused before allocating")
        leaves = versions = None
        if prioritized:
            raw = arrays.read("state.prioritized.leaves", pri["leaves"], np.float64, (cap,))
            versions = arrays.read("state.prioritized.versions", pri["versions"], np.uint64, (cap,))
            k = odd_epoch(versions)
            if k >= 0:
                c.fail("state.prioritized.versions", EPOCH_RULE, f"slot {k} = {int(versions[k])}, "
                       f"slot 0 = {int(versions[0])}", show=True)
            leaves, bad = leaves32(raw)
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
            part = read_undrawn(c, arrays, st["without_replacement"], "without_replacement", cap,
                                 ring=False)
            slots = part["undrawn"]
            _held_slots(c, "state.without_replacement.undrawn", slots,
                        np.minimum(np.asarray(heads, np.int64), per), per)
            undrawn = (slots, part["passes"])
        user = user_state = None
        if ucls is not None:  # built by its class, its state checked by itself, before the region
            if framed or config["n_step"] is not None:
                c.fail("config.sampler", "a sampler of tfdata's (n_step and frame_stack are not built "
                       "for a sampler object)", sname)
            try:
                user = ucls.from_config(ucfg, sampler["seed"])
            except (TypeError, ValueError, KeyError, OverflowError) as exc:
                raise c.caught(exc, "config") from None
            part = {} if ukey is None else sampler_part(c, arrays, st[ukey], ukey, cap)
            size = sum(min(h, per) - t for h, t in zip(heads, dropped))
            try:
                user_state = user.check_state({**sampler, **part}, size, cap)
            except (TypeError, ValueError, KeyError, IndexError, OverflowError) as exc:
                raise c.caught(exc, f"state.{ukey or 'sampler'}") from None
        replays = None
        if ek:
            replays = _read_pool(c, arrays, st["exactly_k"], heads, per, config["replays"])
        return {"rows_name": file_name(stored_layout, "rows"), "stored": stored_spec, "rows": cap,
                "rows_why": f"{file_name(stored_layout, 'rows')} (layout {show_layout(stored_layout)})",
                "rows_of": f"the region has {cap} slots", "spec": spec, "config": config,
                "layout": layout, "per": per, "heads": heads, "dropped": dropped,
                "sampler": sampler, "rate_limiter": rate_limiter, "counts": counts,
                "frames": frames, "frame_part": frame_part, "final_frames": final_frames,
                "roles": roles, "pri": pri, "leaves": leaves, "versions": versions,
                "undrawn": undrawn, "replays": replays, "user": user, "user_state": user_state,
                "wor": wor, "ek": ek, "transforms": transforms}

    @staticmethod
    def build(c, p: dict, ds, cls, options):
        """Check the frames against the rows ``ds``, create the region and restore into it."""
        config, heads, dropped = p["config"], p["heads"], p["dropped"]
        if p["frame_part"] is not None:  # the frames agree with the rows they belong to
            roles = p["roles"]
            bad = shared_frames.check_checkpoint(
                p["frame_part"], heads, dropped, p["per"], max(p["frames"]["stacks"].values()) - 1,
                p["final_frames"], ds.field(roles["terminated"]), ds.field(roles["truncated"]))
            if bad is not None:
                c.fail(f"state.{bad[0]}", bad[1], bad[2])
        kw = {k: config[k] for k in ("ring_size", "num_writers", "prioritized", "n_step",
                                     "gamma", "next_of", "roles")}
        kw["layout"] = p["layout"]
        if p["pri"] is not None:
            kw.update({k: config[k] for k in _PRIORITIZED_KEYS})
        if p["rate_limiter"] is not None:
            kw["rate_limiter"] = p["rate_limiter"]
        if p["wor"]:
            kw["sampler"] = config["sampler"]
        if p["ek"]:
            kw.update({k: config[k] for k in ("sampler",) + _EXACTLY_K_KEYS})
        if p["frames"] is not None:
            kw.update({k: config[k] for k in _FRAME_KEYS})
        if p["transforms"] is not None:
            kw["transforms"] = p["transforms"][0]
        user = p["user"]
        if user is not None:
            kw["sampler"] = user
        buf = c.rebuild(cls, p["spec"], config["capacity"],
                        seed=None if user is not None else p["sampler"]["seed"], **kw,
                        **options["rest"])
        try:
            states = None
            if p["transforms"] is not None:  # their RNG positions, checked by each part
                try:
                    states = check_states(list(buf.transform_parts), p["transforms"][1])
                except (TypeError, ValueError) as exc:
                    raise c.caught(exc, "state.transforms") from None
            buf.restore(ds, p)
            if user is not None:
                user.load_state(p["user_state"])
            for t, s in zip(buf.transform_parts, states or ()):
                if s is not None:
                    t.load_state(s)
        except BaseException:
            buf.close()
            raise
        return buf

    def restore(self, ds, p: dict) -> None:
        """Fill this new buffer (no writer attached yet) from the checked checkpoint ``p`` (the
        plan of :meth:`read`): rows from the dataset ``ds`` (every slot), shard heads, the
        sampler's counter and, prioritized, the leaves and versions; without replacement, the
        pass (the saved slots: a shard's rows moved to its first slots are mapped, the rows left
        out leave the pass); the rate limiter's count of rows sampled (its inserts are the heads
        restored: rows left out at the save are not counted); exactly-k: the pool (every row of
        the heads folded, nothing dropped); the frame part (see
        :func:`tfdata.shared.frames.restore`)."""
        heads, dropped, counter, undrawn = p["heads"], p["dropped"], p["sampler"]["counter"], p["undrawn"]
        priorities = None if p["pri"] is None else (p["leaves"], p["versions"], p["pri"]["samples"])
        samples = None if p["rate_limiter"] is None else p["counts"]["samples"]
        exactly_k, frames = p["replays"], p["frame_part"]
        r, st = self._region, self._region.storage
        cap = r.cap
        if any(int(w) for w in r.heads):
            raise SharedBufferError("restore: the buffer already holds rows")
        names = r.stored_spec.names
        st.load_state_dict({n: ds.field(n) for n in names}, self._capacity, ds.release,
                           ds.records)
        leaves = versions = None
        if priorities is not None:
            leaves, versions = priorities[0].copy(), priorities[1].copy()
        new_heads = []
        for s, (h, t) in enumerate(zip(heads, dropped)):
            held = min(h, cap)
            if t == 0:
                new_heads.append(h)
                continue
            # the oldest t rows were being overwritten: keep rows [h - held + t, h), from slot 0
            keep = held - t
            src = s * cap + (np.arange(h - held + t, h, dtype=np.int64) % cap)
            dst = slice(s * cap, s * cap + keep)
            for n in names:
                st.field(n)[dst] = ds.field(n)[src]
            if leaves is not None:
                lv, vv = leaves[src].copy(), versions[src].copy()
                leaves[s * cap:s * cap + cap] = 0.0
                leaves[dst], versions[dst] = lv, vv
            new_heads.append(keep)
        if frames is not None:  # before the heads: nothing of a shard is held until then
            shared_frames.restore(r.frames, st, frames, heads, dropped)
        for s, h in enumerate(new_heads):
            w = r.words(s)
            w[RESERVED] = h
            w[HEAD] = h
        self._sampler.state[1] = counter
        self._streams.published[:] = new_heads  # every row restored was heard before the save
        if priorities is not None:
            self._sampler.set_trees(leaves, versions, priorities[2])
        if samples is not None and self._limiter is not None:
            self._limiter.samples = samples
            r.ctrl[SAMPLES] = samples

        if undrawn is not None:
            slots = np.asarray(undrawn[0], np.int64)
            keep = np.ones(slots.shape[0], bool)
            for s, (h, t) in enumerate(zip(heads, dropped)):
                if t == 0:
                    continue
                # the rows kept moved to the shard's first slots: row q to slot s*cap + q - first
                lo = h - min(h, cap)
                first = lo + t
                mine = slots // cap == s
                q = lo + (slots[mine] - s * cap - lo) % cap  # the row each slot held
                keep[mine] = q >= first
                slots[mine] = s * cap + q - first
            self._sampler.set_pass(check_slot_list(slots[keep], self._capacity,
                                                   "state.without_replacement.undrawn"),
                                   undrawn[1], self._capacity)
        if exactly_k is not None:
            slots, counts, delivered, released, cursors = exactly_k
            # the slots awaiting replay are taken once and not released; every other slot free
            r.taken[:] = 0
            r.released[:] = 0
            r.taken[slots] = 1
            for s, c in enumerate(cursors):
                r.words(s)[CURSOR] = c
            sm = self._sampler
            sm.load_pool(slots, counts)
            sm.delivered, sm.released = delivered, released
