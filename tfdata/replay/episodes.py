"""Episode bookkeeping for a ring of interleaved environment streams; the design is
docs/design/nstep-and-elision.md.

With ``num_envs=E``, environment ``e``'s row of step ``t`` is in slot ``(t * E + e) %
capacity``: the next row of a slot's stream is ``slot + E`` (mod capacity), and the ``E`` slots
before the write cursor hold the newest step. ``episode[slot]`` (uint32) numbers the episodes of
each stream (a terminated or truncated row ends its number); two rows of a stream at most
``capacity / E`` steps apart are in one episode exactly when their numbers are equal. In a single
stream without elision, rows are stamped late from their stored flags (:meth:`Episodes.catch_up`).

With ``elide_next=True`` a next field (``next_obs`` of ``obs``) is not stored: it is the next
row's ``obs``, an episode-ending row's entry in the *final table*, or ``pending[e]`` for a
stream's newest row. Insert refuses a stream that is not continuous (bytewise), so samples are
those of the full mode.
"""

from __future__ import annotations

from collections.abc import Mapping

import weakref

import numpy as np

from .._checks import expect_array
from ..errors import SpecError
from ..spec import Spec
from ..storage import WORD_TYPES

ROLE_NAMES = ("reward", "terminated", "truncated")


def resolve_next_of(spec: Spec, next_of) -> dict:
    """``{next_field: source_field}``: explicit, or ``"auto"`` pairs ``next_X`` with ``X``."""
    if next_of is None:
        return {}
    if isinstance(next_of, str):
        if next_of != "auto":
            raise ValueError(f"next_of must be 'auto', None or a mapping, got {next_of!r}")
        pairs = {}
        for f in spec:
            if f.name.startswith("next_") and f.name[5:] in spec:
                src = spec[f.name[5:]]
                if src.dtype == f.dtype and src.shape == f.shape:
                    pairs[f.name] = src.name
        return pairs
    if not isinstance(next_of, Mapping):
        raise TypeError(f"next_of must be 'auto', None or a mapping, got {type(next_of).__name__}")
    pairs = {}
    for nxt, src in next_of.items():
        for name in (nxt, src):
            if name not in spec:
                raise SpecError(f"next_of: {spec.unknown_message(name)}")
        a, b = spec[nxt], spec[src]
        if a.dtype != b.dtype or a.shape != b.shape:
            raise SpecError(f"next_of: field {nxt!r} ({a.dtype}{list(a.shape)}) must have the dtype "
                            f"and shape of {src!r} ({b.dtype}{list(b.shape)})")
        if nxt == src:
            raise SpecError(f"next_of: field {nxt!r} cannot be the next of itself")
        pairs[nxt] = src
    if set(pairs) & set(pairs.values()):
        raise SpecError(f"next_of: a field cannot be both a next field and a source: {pairs}")
    return pairs


def resolve_roles(spec: Spec, roles) -> dict:
    """``{"reward": name, "terminated": name, "truncated": name}`` for the names present."""
    roles = dict(roles or {})
    unknown = set(roles) - set(ROLE_NAMES)
    if unknown:
        raise ValueError(f"roles: unknown role(s) {sorted(unknown)} (roles: {', '.join(ROLE_NAMES)})")
    out = {}
    for role in ROLE_NAMES:
        name = roles.get(role, role)
        if name in spec:
            out[role] = name
        elif role in roles:
            raise SpecError(f"roles: {role} field: {spec.unknown_message(name)}")
    for role in ("terminated", "truncated"):
        if role in out:
            f = spec[out[role]]
            if f.dtype != np.bool_ or f.shape:
                raise SpecError(f"field {f.name!r} ({role}) must be a bool scalar, got "
                                f"{f.dtype}{list(f.shape)}")
    return out


class Episodes:
    """Per-slot episode numbers, stream geometry and (optionally) elided next fields.

    Parameters
    ----------
    spec : Spec
        The row schema as the user pushes it (next fields included).
    capacity : int
        Slots; a multiple of ``num_envs``.
    num_envs : int
        Interleaved streams.
    roles : dict
        From :func:`resolve_roles`; must name ``terminated`` and ``truncated``.
    next_of : dict
        From :func:`resolve_next_of`.
    elide : bool
        Do not store the next fields.

    Attributes
    ----------
    episode : ndarray of uint32, shape (capacity,)
    current : ndarray of uint32, shape (num_envs,)
        Episode number the next row of each stream gets.
    final_idx : ndarray of int32, shape (capacity,)
        Final-table entry of episode-ending rows (elision only, else shape (0,)).
    stored_spec : Spec
        What the storage holds: ``spec`` without the elided fields.
    """

    def __init__(self, spec: Spec, capacity: int, num_envs: int, roles: dict, next_of: dict,
                 elide: bool, allocator=None, on_grow=None):
        from .. import alloc
        from ..kernels import first_discontinuity

        self.spec = spec
        self.capacity = capacity
        self.num_envs = num_envs
        self.roles = roles
        self.next_of = dict(next_of)
        self.elide = bool(elide)
        self._alloc = a = alloc.resolve(allocator)
        # called with the bytes a growth of the final table adds, before it allocates (budgets)
        self._on_grow = on_grow
        self._stamp = self._bind_stamp  # the kernel, once a first stamp asks for it
        self._first_break = first_discontinuity
        self.term_i = spec.names.index(roles["terminated"])
        self.trunc_i = spec.names.index(roles["truncated"])
        self._episode = a.zeros(capacity, np.uint32)
        self._current = a.zeros(num_envs, np.uint32)
        # slots [stamped, writer cursor) are not stamped yet (see :meth:`catch_up`)
        self.stamped = 0
        self._writer = self._term = self._trunc = None
        # a single stream without elision: an extend that does not wrap is stamped late too
        self.late = num_envs == 1 and not self.elide
        self.stored_spec = stored_spec(spec, self.next_of, self.elide)
        elided = set(self.next_of) if self.elide else set()
        # positions in the user's value list of the fields the storage keeps
        self.stored_pos = [i for i, f in enumerate(spec) if f.name not in elided]
        self.pairs = [(spec.names.index(n), spec.names.index(s), n, s) for n, s in self.next_of.items()]
        if self.elide:
            self.final_idx = a.empty(capacity, np.int32)
            self.final_idx[:] = -1
            k = _initial_finals(capacity, num_envs)
            self.finals = {n: a.zeros((k,) + spec[n].shape, spec[n].dtype) for n in self.next_of}
            self.free = a.empty(k, np.int32)
            self.free[:] = np.arange(k - 1, -1, -1, dtype=np.int32)  # a stack: pop from the end
            self.n_free = k
            self.pending = {n: a.zeros((num_envs,) + spec[n].shape, spec[n].dtype)
                            for n in self.next_of}
            self.has_pending = a.zeros(num_envs, bool)
        else:
            self.final_idx = a.zeros(0, np.int32)
            self.finals, self.pending = {}, {}
            self.n_free = 0

    @staticmethod
    def planned_nbytes(spec: Spec, capacity: int, num_envs: int, next_of: dict, elide: bool) -> int:
        """:attr:`nbytes` of a new ``Episodes`` with these arguments, without building it."""
        total = 4 * capacity + 4 * num_envs
        if elide:
            k = _initial_finals(capacity, num_envs)
            row = sum(spec[n].nbytes for n in next_of)
            total += 4 * capacity + 4 * k + num_envs + k * row + num_envs * row
        return int(total)

    # -- memory -----------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """Bookkeeping bytes: episode numbers, final table, pending values."""
        total = self._episode.nbytes + self._current.nbytes + self.final_idx.nbytes
        if self.elide:
            total += self.free.nbytes + self.has_pending.nbytes
            total += sum(a.nbytes for a in self.finals.values())
            total += sum(a.nbytes for a in self.pending.values())
        return int(total)

    # -- late stamping ----------------------------------------------------------------------
    def bind(self, writer, storage) -> None:
        """Once: the writer whose cursor ends the unstamped rows, and the storage whose stored
        ``terminated``/``truncated`` flags they are stamped from."""
        # a proxy: the writer holds these episodes, and a strong reference back would make a
        # cycle that keeps the storage (possibly gigabytes) alive until the cyclic GC runs
        self._writer = weakref.proxy(writer)
        self._term = storage.field(self.spec.names[self.term_i])
        self._trunc = storage.field(self.spec.names[self.trunc_i])
        self._bind_stamp()  # now, not at the first catch-up

    def _bind_stamp(self, *args):
        """Bind the stamp kernel, then stamp ``args`` if given. One specialization takes flags of
        any stride (a slice of one row of an AoS field is C-contiguous, a longer one strided) and
        writability (a caller's values); the flags are bool (fields checked by the writer)."""
        from ..kernels import stamp_episodes, strided

        flags = np.zeros(1, bool)
        self._stamp = strided(stamp_episodes, (flags, flags, 0, 0, self._current, self._episode),
                              (0, 1), (0, 1))
        if args:
            self._stamp(*args)

    def catch_up(self, stop: int) -> None:
        """Stamp the rows written one at a time in slots ``[stamped, stop)`` (lock held)."""
        s = self.stamped
        if s != stop:
            self._stamp(self._term[s:stop], self._trunc[s:stop], 0, s, self._current, self._episode)
            self.stamped = stop

    def wrapped(self) -> None:
        """The push that filled the last slot calls this before the cursor goes back to 0: the
        rows up to the end are stamped before the next push can overwrite their flags."""
        self.catch_up(self.capacity)
        self.stamped = 0

    def stamp_rows(self, term: np.ndarray, trunc: np.ndarray, slot: int) -> None:
        """Stamp ``n`` rows just written from ``slot`` without a wrap (several streams; lock held).
        ``term``, ``trunc``: bool ``(n,)``, the rows' flags."""
        self._stamp(term, trunc, 0, slot, self._current, self._episode)
        self.stamped = (slot + term.shape[0]) % self.capacity

    @property
    def episode(self) -> np.ndarray:
        """uint32[capacity]: each slot's episode number (stamped up to the writer's cursor)."""
        if self._writer is not None:
            self.catch_up(self._writer.cursor)
        return self._episode

    @property
    def current(self) -> np.ndarray:
        """uint32[num_envs]: each stream's episode number for its next row."""
        if self._writer is not None:
            self.catch_up(self._writer.cursor)
        return self._current

    # -- writing ----------------------------------------------------------------------------
    def ends(self, values: list) -> np.ndarray:
        """bool[n]: rows that end an episode (terminated or truncated)."""
        return np.logical_or(values[self.term_i], values[self.trunc_i])

    def check(self, values: list, n: int) -> None:
        """Refuse a write that breaks the stream geometry or (with elision) stream continuity.

        Called under the buffer's lock, before anything is written; raises SpecError.
        """
        e = self.num_envs
        if n % e:
            raise SpecError(f"this buffer interleaves num_envs={e} streams: extend takes whole "
                            f"steps of {e} rows each (time-major), got {n} rows")
        if not self.elide:
            return
        for i_next, i_src, name_next, name_src in self.pairs:
            # a kernel compares in place: no n-by-row-bytes temporary (28 MB per 1,000 images)
            r = self._first_break(_rows_bytes(values[i_src], n), _rows_bytes(values[i_next], n),
                                  values[self.term_i], values[self.trunc_i],
                                  _rows_bytes(self.pending[name_next], e), self.has_pending)
            if r < 0:
                continue
            if r < e:
                raise SpecError(
                    f"field {name_src!r} of env {r} differs from the {name_next!r} pushed with that "
                    f"stream's previous row, which did not end an episode: with elide_next=True "
                    f"{name_next!r} is read from the next row, so the stream must be continuous "
                    f"(mark the previous row terminated or truncated, or build the buffer without "
                    f"elide_next)")
            raise SpecError(
                f"row {r} (env {r % e}): field {name_src!r} differs from {name_next!r} of row "
                f"{r - e}, the same stream's previous row, which did not end an episode: with "
                f"elide_next=True the stream must be continuous")

    def reserve(self, ends, spans: list) -> None:
        """Make room in the final table for the episode ends of a write (before the write)."""
        if not self.elide:
            return
        need = int(np.count_nonzero(ends[spans[0][1]:]))
        freed = sum(int(np.count_nonzero(self.final_idx[d:d + c] >= 0)) for d, _, c in spans)
        if self.n_free + freed < need:
            self._grow(need - freed - self.n_free)

    def _grown_size(self, extra: int) -> int:
        old = self.free.shape[0]
        return max(2 * old, old + extra)

    def check_grow(self, extra: int) -> None:
        """Tell ``on_grow`` what growing the final table by ``extra`` entries would add (it
        raises to refuse); nothing changes."""
        if self._on_grow is not None:
            new = self._grown_size(extra)
            row = sum(self.spec[n].nbytes for n in self.next_of)
            self._on_grow((new - self.free.shape[0]) * (row + 4))

    def _grow(self, extra: int) -> None:
        self.check_grow(extra)
        old = self.free.shape[0]
        new = self._grown_size(extra)
        for name, table in self.finals.items():
            grown = self._alloc.zeros((new,) + table.shape[1:], table.dtype)
            grown[:old] = table
            self.finals[name] = grown
        free = self._alloc.empty(new, np.int32)
        free[:self.n_free] = self.free[:self.n_free]
        added = np.arange(new - 1, old - 1, -1, dtype=np.int32)
        free[self.n_free:self.n_free + added.shape[0]] = added
        self.free = free
        self.n_free += added.shape[0]

    def stamp_one(self, pos: int, values: list) -> None:
        """:meth:`write` for one row of a single stream without elision (values in field order)."""
        self.catch_up(pos)
        self._episode[pos] = self._current[0]
        if values[self.term_i] or values[self.trunc_i]:
            self._current[0] += np.uint32(1)
        self.stamped = pos + 1 if pos + 1 != self.capacity else 0

    def write(self, values: list, n: int, ends, spans: list) -> None:
        """Stamp episode numbers (and elided next values) of ``n`` rows written at ``spans``
        (the writer has called :meth:`catch_up` before writing them).

        ``ends`` (bool[n], from :meth:`ends`) is needed with elision only; else None.
        """
        e = self.num_envs
        dst, src, count = spans[0]
        if self.late and len(spans) == 1 and src == 0 and dst + count < self.capacity:
            return  # one stream, no wrap: stamped late from the stored flags, as pushed rows
        self._stamp(values[self.term_i], values[self.trunc_i], spans[0][1], spans[0][0],
                    self._current, self._episode)
        last = spans[-1]
        self.stamped = (last[0] + last[2]) % self.capacity
        if not self.elide:
            return
        fi = self.final_idx
        for dst, _, count in spans:  # recycle the entries of overwritten rows
            old = fi[dst:dst + count]
            freed = old[old >= 0]
            self.free[self.n_free:self.n_free + freed.shape[0]] = freed
            self.n_free += freed.shape[0]
            old[:] = -1
        for dst, src, count in spans:
            rows = np.flatnonzero(ends[src:src + count])
            if rows.shape[0]:
                k = rows.shape[0]
                entries = self.free[self.n_free - k:self.n_free][::-1].copy()
                self.n_free -= k
                for i_next, _, name, _ in self.pairs:
                    self.finals[name][entries] = values[i_next][src + rows]
                fi[dst + rows] = entries
        last = slice(n - e, n)
        for i_next, _, name, _ in self.pairs:
            self.pending[name][...] = values[i_next][last]
        self.has_pending[...] = ~ends[last]

    def clear(self, wipe: bool = False) -> None:
        """Forget every row; ``wipe`` also zeroes the kept next values (they are row data)."""
        if wipe:
            for a in list(self.finals.values()) + list(self.pending.values()):
                a[...] = 0
        self._episode[...] = 0
        self._current[...] = 0
        self.stamped = 0
        if self.elide:
            self.final_idx[...] = -1
            k = self.free.shape[0]
            self.free[:] = np.arange(k - 1, -1, -1, dtype=np.int32)
            self.n_free = k
            self.has_pending[...] = False

    # -- reading ----------------------------------------------------------------------------
    def final_words(self, name: str, word: int) -> np.ndarray:
        """The final table of ``name`` as ``uint{8*word}[K, width]`` (what the kernels copy)."""
        return as_words(self.finals[name], word)

    def pending_words(self, name: str, word: int) -> np.ndarray:
        """``pending[name]`` as ``uint{8*word}[num_envs, width]``."""
        return as_words(self.pending[name], word)

    def next_value(self, name: str, slot: int, cursor: int):
        """The elided next field of one held slot (slow path for tests and introspection)."""
        f = self.final_idx[slot]
        if f >= 0:
            return self.finals[name][f]
        e = self.num_envs
        newest = (cursor - e) % self.capacity
        if slot - slot % e == newest:
            return self.pending[name][slot % e]
        return None  # read it from the stream's next row

    # -- state ------------------------------------------------------------------------------
    def state_dict(self, size: int, copy: bool = True) -> dict:
        episode = self.episode[:size].copy() if copy else self.episode[:size]
        state = {"num_envs": self.num_envs, "elide": self.elide, "next_of": dict(self.next_of),
                 "episode": episode, "current": self.current.copy()}
        if self.elide:
            slots = np.flatnonzero(self.final_idx[:size] >= 0)
            entries = self.final_idx[slots]
            state["final_slots"] = slots.astype(np.int64)
            state["finals"] = {n: t[entries].copy() for n, t in self.finals.items()}
            state["pending"] = {n: p.copy() for n, p in self.pending.items()}
            state["has_pending"] = self.has_pending.copy()
        return state

    def check_state(self, state, size: int):
        """Validate a :meth:`state_dict`; return it normalised for :meth:`load_state`."""
        if not isinstance(state, Mapping):
            raise ValueError("state has no episode bookkeeping ('episodes' entry)")
        if (state.get("num_envs") != self.num_envs or state.get("elide") != self.elide
                or state.get("next_of") != self.next_of):
            raise ValueError(f"state episodes config (num_envs={state.get('num_envs')}, elide="
                             f"{state.get('elide')}, next_of={state.get('next_of')}) differs from this "
                             f"buffer's (num_envs={self.num_envs}, elide={self.elide}, "
                             f"next_of={self.next_of})")
        expect_array(state.get("episode"), np.uint32, (size,), "episodes.episode")
        expect_array(state.get("current"), np.uint32, (self.num_envs,), "episodes.current")
        if self.elide:
            slots = state.get("final_slots")
            if not isinstance(slots, np.ndarray) or slots.dtype != np.int64 or slots.ndim != 1:
                raise ValueError("state episodes.final_slots must be a 1-D int64 array")
            if slots.size and (slots.min() < 0 or slots.max() >= size or np.unique(slots).size != slots.size):
                raise ValueError(f"state episodes.final_slots must be distinct slots in [0, {size})")
            k = slots.shape[0]
            for name in self.next_of:
                f = self.spec[name]
                expect_array((state.get("finals") or {}).get(name), f.dtype, (k,) + f.shape,
                        f"episodes.finals[{name!r}]")
                expect_array((state.get("pending") or {}).get(name), f.dtype, (self.num_envs,) + f.shape,
                        f"episodes.pending[{name!r}]")
            expect_array(state.get("has_pending"), np.bool_, (self.num_envs,), "episodes.has_pending")
            if k > self.free.shape[0]:  # refused now, not after load_state has cleared
                self.check_grow(k - self.free.shape[0])
        return state

    def load_state(self, state, size: int) -> None:
        self.clear()
        self._episode[:size] = state["episode"]
        self._current[:] = state["current"]
        self.stamped = 0 if self._writer is None else self._writer.cursor  # loaded just before
        if not self.elide:
            return
        slots = state["final_slots"]
        k = slots.shape[0]
        if k > self.free.shape[0]:
            self._grow(k - self.free.shape[0])
        entries = np.arange(k, dtype=np.int32)
        for name in self.next_of:
            self.finals[name][:k] = state["finals"][name]
            self.pending[name][...] = state["pending"][name]
        self.final_idx[slots] = entries
        total = self.free.shape[0]
        self.free[:total - k] = np.arange(total - 1, k - 1, -1, dtype=np.int32)
        self.n_free = total - k
        self.has_pending[...] = state["has_pending"]


def steps_error(num_envs: int, n: int) -> SpecError:
    """The SpecError of a write of ``n`` rows that are not whole steps of ``num_envs`` rows."""
    return SpecError(f"this buffer interleaves num_envs={num_envs} streams: extend takes whole "
                     f"steps of {num_envs} rows each, got {n} rows")


def stored_spec(spec: Spec, next_of: dict, elide: bool) -> Spec:
    """What the storage holds: ``spec`` without the elided next fields."""
    if not elide or not next_of:
        return spec
    return Spec([f for f in spec if f.name not in next_of])


def _initial_finals(capacity: int, num_envs: int) -> int:
    # entries of the final table at first: one per stream plus one per 64 rows (episodes of 64
    # steps or more need no growth)
    return num_envs + capacity // 64


def as_words(arr: np.ndarray, word: int, lead: int = 1) -> np.ndarray:
    """``arr`` (C-contiguous) as ``uint{8*word}[*arr.shape[:lead], width]``, a view."""
    return arr.reshape(arr.shape[:lead] + (-1,)).view(np.uint8).view(WORD_TYPES[word])


def _rows_bytes(arr: np.ndarray, n: int) -> np.ndarray:
    """uint8 view ``(n, row_bytes)`` of ``n`` rows (copied to C order if needed)."""
    return np.ascontiguousarray(arr).view(np.uint8).reshape(n, -1)


# -- checkpoints: state.episodes, read as untrusted input (``c``, ``arrays``: as in
# :mod:`tfdata.replay.frames`)

def read_state(c, arrays, ep, next_of: dict, spec: Spec, elide: bool, envs: int,
               size: int) -> dict:
    """The episode bookkeeping of the state: its keys, and each array of exactly the dtype and
    shape the buffer needs. Checked against the rows by :class:`EpisodeOrder`."""
    keys = ("num_envs", "elide", "next_of", "episode", "current")
    if elide:
        keys += ("final_slots", "finals", "pending", "has_pending")
    c.obj("state.episodes", ep, keys)
    w = "state.episodes."
    if type(ep["num_envs"]) is not int or ep["num_envs"] != envs:
        c.fail(w + "num_envs", f"{envs} (config.num_envs)", ep["num_envs"])
    if type(ep["elide"]) is not bool or ep["elide"] != elide:
        c.fail(w + "elide", f"{elide} (config.elide_next)", ep["elide"])
    if not isinstance(ep["next_of"], dict) or ep["next_of"] != next_of:
        c.fail(w + "next_of", f"{next_of} (from config.next_of)", ep["next_of"])
    out = {"num_envs": envs, "elide": elide, "next_of": dict(next_of)}
    out["episode"] = arrays.read(w + "episode", ep["episode"], np.uint32, (size,))
    out["current"] = arrays.read(w + "current", ep["current"], np.uint32, (envs,))
    if not elide:
        return out
    # one entry per row that ended an episode: the header's count, bounded by the rows held
    slots = ep["final_slots"]
    k = arrays.length(w + "final_slots", slots)
    if k > size:
        c.fail(w + "final_slots", f"at most {size} slots (the rows held)", f"{k} slots", show=False)
    out["final_slots"] = arrays.read(w + "final_slots", slots, np.int64, (k,))
    for part, lead in (("finals", k), ("pending", envs)):
        table = c.obj(w + part, ep[part], tuple(next_of))
        out[part] = {name: arrays.read(f"{w}{part}[{name!r}]", table[name], spec[name].dtype,
                                       (lead,) + spec[name].shape) for name in next_of}
    out["has_pending"] = arrays.read(w + "has_pending", ep["has_pending"], np.bool_, (envs,))
    return out


class EpisodeOrder:
    """Checks that the episode bookkeeping ``ep`` agrees with the rows' episode ends: what
    inserting those rows gave. ``term``, ``trunc``: the new buffer's flags; ``src_term``,
    ``src_trunc``: the same flags in the mapped rows file.

    :meth:`ahead` checks the rows of the file up to a slot, one chunk ahead of the copy into the
    buffer (from the copy's ``release`` callback), so the pages it faults in are those the copy
    reads next (a separate pass would fault them in again). :meth:`finish` checks what is left
    and raises FormatError naming the field."""

    def __init__(self, c, ep: dict, term, trunc, src_term, src_trunc, cursor: int,
                 size: int, cap: int):
        from ..kernels import _checkpoint as k  # numba: imported when a checkpoint loads

        self.k, self.c, self.ep = k, c, ep
        self.term, self.trunc, self.src = term, trunc, (src_term, src_trunc)
        self.cursor, self.size, self.cap = cursor, size, cap
        self.acc = 0
        self.done = 0  # rows checked, in order from slot 0
        self.pos = 0  # entries of final_slots matched so far (elision)

    def ahead(self, stop: int) -> None:
        start, stop = self.done, min(stop, self.size)
        if stop <= start:
            return
        ep, k = self.ep, self.k
        term, trunc = self.src
        self.acc |= k.episode_mismatch(ep["episode"], term, trunc, start, stop, self.cursor,
                                       self.size, self.cap, ep["num_envs"])
        if ep["elide"] and self.pos >= 0:
            self.pos = k.final_mismatch_from(ep["final_slots"], term, trunc, start, stop, self.pos)
        self.done = stop

    def finish(self) -> None:
        c, ep, k = self.c, self.ep, self.k
        w = "state.episodes."
        envs, size, cap = ep["num_envs"], self.size, self.cap
        self.ahead(size)  # what the copy's callbacks did not reach
        bad = -1
        if self.acc:
            bad = k.first_episode_break(ep["episode"], ep["current"], self.term, self.trunc,
                                        self.cursor, size, cap, envs)
        elif size == 0:
            bad = cap if ep["current"].any() else -1
        else:  # every step agrees with the next: the newest one against current
            lo = (self.cursor - envs) % cap
            ends = np.logical_or(self.term[lo:lo + envs], self.trunc[lo:lo + envs])
            grow = np.subtract(ep["current"], ep["episode"][lo:lo + envs])  # modulo 2**32
            bad = cap if np.any(grow != ends) else -1
        if 0 <= bad < cap:
            c.fail(w + "episode", "numbers that grow by one exactly after a row that ended an "
                   f"episode (terminated or truncated), in each stream; slot {bad} breaks that",
                   show=False)
        if bad >= cap:
            c.fail(w + "current", "each stream's newest episode number, plus one if its newest "
                   "row ended an episode (zeros in an empty buffer)", show=False)
        if not ep["elide"]:
            return
        if self.pos != ep["final_slots"].shape[0]:
            at = -1 - self.pos if self.pos < 0 else self.pos
            c.fail(w + "final_slots", "the slots of the rows that ended an episode, in order; "
                   f"position {at} differs", show=False)
        want = np.zeros(envs, bool)
        if size:
            lo = (self.cursor - envs) % cap
            want = ~np.logical_or(self.term[lo:lo + envs], self.trunc[lo:lo + envs])
        if np.any(ep["has_pending"].view(np.uint8) != want.view(np.uint8)):
            c.fail(w + "has_pending", "true exactly for the streams whose newest row did not "
                   "end an episode", show=False)
