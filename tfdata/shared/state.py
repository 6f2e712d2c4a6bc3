"""What a checkpoint of a replay region keeps and restores: the configuration, a snapshot of
the state as of the shards' heads, the rows writers overwrote while they were copied, and the
restore of a new region (called by :mod:`tfdata.shared.checkpoint` through the buffer)."""

from __future__ import annotations

import contextlib

import numpy as np

from .._checks import check_slot_list
from ..errors import SharedBufferError
from ..replay import shared_frames
from ..replay.frames import padding_config
from ..replay.samplers import state_key
from .region import CURSOR, HEAD, RESERVED, SAMPLES

__all__ = ["ShardCheckpoint"]


class ShardCheckpoint:
    """The checkpoint part of a :class:`~tfdata.SharedReplayBuffer` over its ``region``: its
    ``sampler``, ``lock``, compiled ``kernels`` and rate ``limiter`` (or None), the buffer's
    ``name`` (for messages), ``ring_size`` and ``prioritized``, ``episodes`` (the buffer's
    ``n_step``, ``gamma``, ``next_of`` and ``roles``), ``rows`` (its
    :class:`~tfdata.shared.streams.ShardRows`, which catch the sampler up on the rows
    published) and ``given`` (the sampler is an object the caller gave: saved by its name and
    ``config()``)."""

    def __init__(self, region, sampler, lock, kernels, limiter, name: str, ring_size: int,
                 prioritized: bool, episodes: dict, rows, given: bool):
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
        self._rows = rows
        self._given = given

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
        elif self._rows.kind == "without_replacement":
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
        return cfg

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
            self._rows.catch_up(scratch)
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
            yield state

    def overwritten_since(self, heads: list) -> list:
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

    def settle_frames(self, state: dict) -> None:
        """After the rows of a :meth:`snapshot` were copied (frame stacks only): the rows the
        checkpoint keeps (``heads``, ``dropped``) and its ``frames`` part, from the frame arrays
        copied with the heads and frames read now (see
        :func:`tfdata.replay.shared_frames.checkpoint_state`)."""
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

    def restore(self, ds, heads: list, dropped: list, counter: int, priorities=None,
                undrawn=None, samples: int | None = None, exactly_k=None, frames=None) -> None:
        """Fill this new buffer (no writer attached yet) from a checked checkpoint: rows from
        the dataset ``ds`` (every slot), shard heads, the sampler's counter and, prioritized,
        ``(leaves, versions, samples)``; without replacement, ``(slots, passes)`` of the pass
        (the saved slots: a shard's rows moved to its first slots are mapped, the rows left out
        leave the pass); ``samples``: the rate limiter's count of rows sampled (its inserts are
        the heads restored: rows left out at the save are not counted); ``exactly_k``: the
        checked ``(slots, counts, delivered, released, cursors)`` (every row of ``heads`` folded,
        ``dropped`` all 0); ``frames``: the checked frame part (see
        :func:`tfdata.replay.shared_frames.restore`). Used by
        :func:`tfdata.shared.checkpoint.load_shared`."""
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
        self._rows.published[:] = new_heads  # every row restored was heard before the save
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
