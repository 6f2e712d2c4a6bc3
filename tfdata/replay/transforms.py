"""Transforms at sample time: what a batch shows that is not a stored row as it is.

Both read the episode bookkeeping (:mod:`tfdata.replay.episodes`) and run under the buffer's lock
right after the sampler filled an output. The contract (the same ring part as a sampler's, see
:mod:`tfdata.replay.samplers`):

``ring_arrays(batch_size, length, out)``, ``batch_view(arrays, fields, attrs)``
    Per-batch arrays and what they show (``discounts``; the elided next fields).
``plan_ring(...)``
    Bytes of ``ring_arrays`` for a batch of ``rows`` rows (for memory plans, before building),
    of every field or of the projected ``fields``.
``on_slices``
    Whether it applies to :meth:`~tfdata.ReplayBuffer.sample_sequences` batches too.
``project(names)``
    The transform for batches that show only the fields ``names`` (``sample(fields=...)``):
    what a projected batch shows equals the full batch's, restricted to ``names``. It reads what
    it needs that the projection leaves out from the storage, or writes it to scratch.
``apply(out, arrays, rows, where)``
    Transform the batch in ``out`` whose rows came from slots ``rows``; return the slots whose
    next values a later transform reads (n-step: each window's last row). ``where`` is the
    writer's position as the geometry needs it: the ring cursor, or a shared region's heads.

:class:`NStep` (``n_step=``) turns each row into an n-step transition; :class:`ElideNext`
(``elide_next=True``) fills the next fields that are not stored.
"""

from __future__ import annotations

import copy

import numpy as np

from ..errors import SpecError
from ..storage import WORD_TYPES, widest_word


def episode_options(spec, n_step, gamma, next_of, elide_next, roles) -> dict:
    """Check the episode options of a buffer against its spec (SpecError, TypeError or
    ValueError naming the option); allocates nothing.

    Returns ``n_step`` (None or int >= 1), ``gamma``, ``roles`` and ``next_of`` (resolved),
    ``elide_next`` and ``has_flags`` (the spec has terminated and truncated fields).
    """
    from .._checks import check_int, check_unit
    from .episodes import resolve_next_of, resolve_roles

    n_step = None if n_step is None else check_int("n_step", n_step, 1)
    gamma = check_unit("gamma", gamma)
    roles = resolve_roles(spec, roles)
    next_of = resolve_next_of(spec, next_of)
    elide_next = bool(elide_next)
    has_flags = "terminated" in roles and "truncated" in roles
    if not has_flags and (n_step is not None or elide_next):
        what = "n_step" if n_step is not None else "elide_next"
        raise SpecError(f"{what} needs episode boundaries: the spec must have bool fields "
                        f"'terminated' and 'truncated' (or name them with roles=), has "
                        f"{list(spec.names)}")
    if elide_next and not next_of:
        raise SpecError("elide_next=True but no field is the next of another: declare "
                        "next_of={'next_obs': 'obs'} (or name fields next_X and X)")
    if n_step is not None:
        if "reward" not in roles:
            raise SpecError(f"n_step needs a 'reward' field (or name it with roles=), fields: "
                            f"{list(spec.names)}")
        rf = spec[roles["reward"]]
        if rf.shape or rf.dtype.kind != "f":
            raise SpecError(f"field {rf.name!r} (reward) must be a float scalar for n-step "
                            f"returns, got {rf.dtype}{list(rf.shape)}")
    return {"n_step": n_step, "gamma": gamma, "roles": roles, "next_of": next_of,
            "elide_next": elide_next, "has_flags": has_flags}


def _word_pairs(storage, spec, next_of: dict, stored: bool) -> list:
    """``(next, word, (words, offset, width))`` for every next field stored (``stored``) or
    elided: the field n-step re-reads, or the source field elision reads from the next row."""
    out = []
    for nxt, src in next_of.items():
        if (nxt in storage.spec.names) != stored:
            continue
        name = nxt if stored else src
        word = widest_word(storage.field_offset(name), spec[nxt].nbytes)
        out.append((nxt, word, storage.field_words(name, word)))
    return out


class NStep:
    """n-step returns: ``reward`` becomes the discounted return of up to ``n`` rows of the
    stream, ``terminated``/``truncated`` and the next fields those of the window's last row,
    and ``batch.discounts`` is ``gamma ** k`` for the ``k`` rows taken.

    The windows follow the buffer's ``streams`` (:mod:`tfdata.replay.streams`): a ring of
    interleaved streams, ``apply``'s ``where`` the writer's cursor; or the shards of a shared
    region, ``where`` ignored, the windows stopping at the rows the streams' heads snapshot
    (read before the draw) held, the buffer checking afterwards against the same snapshot that
    no writer touched a window while it was read."""

    on_slices = False

    def __init__(self, storage, spec, roles: dict, next_of: dict, n: int, gamma: float, streams,
                 allocator):
        from .. import kernels

        self.k, self.storage, self.allocator = kernels, storage, allocator
        self.n, self.gamma, self.streams = n, gamma, streams
        self._kernel = streams.kernels.nstep
        self.roles = roles
        self.flags = (storage.field(roles["terminated"]), storage.field(roles["truncated"]))
        self.reward = storage.field(roles["reward"])
        # full mode: next fields are stored; n-step re-reads them at the window's last row
        self.copy_pairs = _word_pairs(storage, spec, next_of, stored=True)

    @staticmethod
    def plan_ring(rows: int, length, roles=None, fields=None) -> int:
        """Bytes of :meth:`ring_arrays` (``fields``: the projected fields; ``roles`` then
        needed): discount, last row, return, and the flags a projection leaves out."""
        if length is not None:
            return 0
        flags = 0
        if fields is not None and not (roles["terminated"] in fields and roles["truncated"] in fields):
            flags = 2 * rows
        return rows * (4 + 8 + 8) + flags

    def plan_ring_streams(self, rows: int, length, fields=None) -> int:
        """:meth:`plan_ring` plus what the streams keep per batch (the shards' torn marks)."""
        if length is not None:
            return 0
        return self.plan_ring(rows, length, self.roles, fields) + self.streams.ring_nbytes(rows)

    def project(self, names) -> "NStep":
        # what a projected output lacks is decided per output, in ring_arrays
        return self

    def ring_arrays(self, batch_size: int, length, out) -> dict:
        if length is not None:
            return {}
        a, f, r = self.allocator, out.fields, self.roles
        acc = a.zeros(batch_size, np.float64)
        arrays = {"discount": a.zeros(batch_size, np.float32), "last": a.zeros(batch_size, np.int64),
                  "acc": acc}
        # where the windows' reward and flags go: the output's fields, or scratch when a
        # projection leaves them out (the return then stays in ``acc``: written onto itself)
        term, trunc = f.get(r["terminated"]), f.get(r["truncated"])
        if term is None or trunc is None:
            flags = arrays["flags"] = a.zeros((2, batch_size), bool)
            term = flags[0] if term is None else term
            trunc = flags[1] if trunc is None else trunc
        ret = f.get(r["reward"], acc)
        arrays["outs"] = (ret, term, trunc)
        # the windows' reward, flags and outputs are fields of any stride (columns, records, or
        # scratch): one kernel specialization takes them all (per reward and return dtype)
        arrays["nstep"] = self.k.strided(
            self._kernel, (np.zeros(1, np.int64), out.indices, self.n, self.gamma, self.reward,
                           self.flags[0], self.flags[1], acc, ret, term, trunc,
                           arrays["discount"], arrays["last"]), self.k.NSTEP_STRIDED)
        # the next fields the output holds, re-read at each window's last row
        arrays["copies"] = [(src, off, width) + out.source.output_words(out, nxt, word)[:2]
                            for nxt, word, (src, off, width) in self.copy_pairs if nxt in f]
        arrays.update(self.streams.ring_arrays(batch_size, length, out))
        return arrays

    def batch_view(self, arrays: dict, fields: dict, attrs: dict) -> None:
        if "discount" in arrays:
            attrs["discounts"] = arrays["discount"]

    def apply(self, out, arrays: dict, rows: np.ndarray, where) -> np.ndarray:
        # after the gather, so the window's first row is in cache (a kernel fusing the two
        # measured slower: docs/design/nstep-and-elision.md, "Measured"); whole arrays, no
        # views made per sample
        ret, term, trunc = arrays["outs"]
        last = arrays["last"]
        arrays["nstep"](self.streams.at(where), rows, self.n, self.gamma, self.reward, self.flags[0],
                     self.flags[1], arrays["acc"], ret, term, trunc, arrays["discount"], last)
        for src, off, width, dst, doff in arrays["copies"]:
            self.k.copy_field_rows(src, off, last, rows, dst, doff, width)
        return last

    def apply_row(self, out, arrays: dict, i: int, where) -> None:
        """:meth:`apply` for row ``i`` of the batch only (a row drawn again)."""
        part, rows = slice(i, i + 1), out.indices[i:i + 1]
        ret, term, trunc = arrays["outs"]
        last = arrays["last"][part]
        arrays["nstep"](self.streams.at(where), rows, self.n, self.gamma, self.reward, self.flags[0],
                     self.flags[1], arrays["acc"][part], ret[part], term[part], trunc[part],
                     arrays["discount"][part], last)
        for src, off, width, dst, doff in arrays["copies"]:
            self.k.copy_field_rows(src, off, last, rows, dst[part], doff, width)


class ElideNext:
    """Next fields that are not stored (``elide_next=True``), read from the stream's next row,
    or from the episode bookkeeping where that row does not exist."""

    on_slices = True

    def __init__(self, storage, spec, episodes, roles: dict, next_of: dict, num_envs: int,
                 capacity: int, allocator):
        from .. import kernels

        self.k, self.spec, self.episodes, self.allocator = kernels, spec, episodes, allocator
        self.num_envs, self.capacity = num_envs, capacity
        self.flags = (storage.field(roles["terminated"]), storage.field(roles["truncated"]))
        self.pairs = _word_pairs(storage, spec, next_of, stored=False)

    @staticmethod
    def plan_ring(spec, next_of: dict, rows: int, fields=None) -> int:
        """Bytes of :meth:`ring_arrays`: the elided next fields (of ``fields`` only, if given)."""
        return rows * sum(spec[n].nbytes for n in next_of if fields is None or n in fields)

    def project(self, names) -> "ElideNext":
        """This transform filling only the elided fields among ``names``."""
        t = copy.copy(self)
        t.pairs = [p for p in self.pairs if p[0] in names]
        return t

    def ring_arrays(self, batch_size: int, length, out) -> dict:
        rows = batch_size * (length or 1)
        arrays, words = {}, {}
        for nxt, word, _ in self.pairs:
            f = self.spec[nxt]
            arr = arrays["next:" + nxt] = self.allocator.zeros((rows,) + f.shape, f.dtype)
            words[nxt] = arr.reshape(rows, -1).view(np.uint8).view(WORD_TYPES[word])
        arrays["words"] = words
        # per word type, one specialization of the copy: the flags of any stride, what it
        # reads of any writability (the storage's words, flags and the final table)
        arrays["copy"] = copies = {}
        for nxt, word, (src, _, _) in self.pairs:
            if word not in copies:
                w = np.zeros((1, 1), WORD_TYPES[word])
                copies[word] = self.k.strided(
                    self.k.copy_next_elided, (np.zeros(1, np.int64), 0, 1, 1, src, 0, *self.flags,
                                              np.zeros(1, np.int32), w, w, w, 0, 1),
                    self.k.ELIDED_STRIDED, self.k.ELIDED_READONLY)
        return arrays

    def batch_view(self, arrays: dict, fields: dict, attrs: dict) -> None:
        for nxt, _, _ in self.pairs:
            fields[nxt] = arrays["next:" + nxt]

    def apply(self, out, arrays: dict, rows: np.ndarray, cursor: int) -> np.ndarray:
        ep, words, copies = self.episodes, arrays["words"], arrays["copy"]
        for nxt, word, (src, off, width) in self.pairs:
            copies[word](rows, cursor, self.num_envs, self.capacity, src, off,
                                    self.flags[0], self.flags[1], ep.final_idx, ep.final_words(nxt, word),
                                    ep.pending_words(nxt, word), words[nxt], 0, width)
        return rows
