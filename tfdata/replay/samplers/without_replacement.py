"""Sampling without replacement while rows are inserted: every live row once per pass."""

from __future__ import annotations

import weakref

import numpy as np

from . import Sampler, StateError, checked_slots, state_int, state_part


def pass_problem(undrawn: int, passes: int, size: int) -> tuple | None:
    """Why a pass of ``undrawn`` slots, after ``passes`` passes, cannot go with ``size`` rows
    held, as ``(field, expected)``, or None. Every sample leaves the pool non-empty (a pass
    that ends is refilled at once with every live row) and a saved state adds the rows written
    since the last sample, so rows held means slots undrawn; a clear empties the buffer and
    sets ``passes`` to 0, and no pass completes without a row, so an empty buffer has none."""
    if size == 0 and passes:
        return "passes", "0 (no row is held: none was written since the buffer was cleared, so no pass ran)"
    if size and not undrawn:
        return "undrawn", (f"at least one slot with {size} rows held (a pass that ends is refilled "
                           f"at once with every live row: the pool is never empty while rows are held)")
    return None


class WithoutReplacementSampler(Sampler):
    """Each pass draws every live row exactly once, in a random order from the seed.

    Within a pass no row is drawn twice; rows written during the pass join it; a row that is
    overwritten before it was drawn is never returned (its slot's new row takes its place); a
    new pass begins when every row of the pass has been drawn, over every row then held. A batch
    never holds a row twice: when the pass ends in the middle of a batch, the rows the batch
    already took are drawn later in the new pass. Same seed and rows, same batches, on every
    layout; :meth:`state_dict` and checkpoints keep the pass (a restored buffer continues it).

    ``buffer.sampler.passes`` counts the passes completed.

    Sequences (``sample_sequences``, policy ``"mask"``): the slices' start rows are drawn from
    the same pass as rows are (a row drawn as a start is drawn for its pass): within a pass no
    row starts two slices, nor is it both a start and a row of :meth:`sample`; each slice is
    then filled as the uniform sampler fills it (rows of the start's stream while written and
    in its episode, the rest repeating the last valid row with ``mask`` False). So every
    valid start is drawn at most once per pass, and exactly once if the pass is drawn by
    slices alone. Policy ``"reject"`` is refused (NotImplementedError): a rejected start
    would have to leave the pass undrawn or be drawn without being returned, and a call that
    finds no slice would have to undo its draws to change nothing.

    Cost: the undrawn slots (uint32) and a flag per slot, 5 bytes per slot
    (``nbytes_parts["bookkeeping"]``); a write costs nothing (the sampler hears only laps of the
    ring, as running statistics do); a sample first adds the slots written since the previous
    one (one kernel call with the draws), then gathers the rows.
    """

    projects = True
    hears_writes = True
    #: writes are placed by the writer's cursor and the laps counted here, at the next sample
    wraps_only = True
    #: the name ``ReplayBuffer(sampler=...)`` and checkpoints give this sampler
    name = "without_replacement"
    rule = ("rows are drawn without replacement (every live row once per pass; a batch never "
            "holds a row twice)")

    def bind(self, storage, capacity: int, num_envs: int, allocator) -> None:
        super().bind(storage, capacity, num_envs, allocator)
        from ...kernels import _pool  # numba is imported when the first buffer is built

        self._k = _pool
        self.pool = allocator.zeros(capacity, np.uint32)
        self.inpool = allocator.zeros(capacity, np.uint8)
        self.meta = np.zeros(3, np.int64)  # [undrawn rows, passes completed, live rows]
        _pool.pool_clear(self.pool, self.inpool, self.meta)
        self.wraps = 0  # laps of the ring written
        self.synced = 0  # laps * capacity + cursor at the last sample
        self.writer = None

    def watch(self, writer) -> None:
        """The writer whose ``cursor`` places the writes (a proxy: the writer holds this hook)."""
        self.writer = weakref.proxy(writer)

    def plan(self, capacity: int) -> dict:
        return {"trees": 0, "bookkeeping": 5 * int(capacity)}

    @property
    def nbytes(self) -> dict:
        return {"trees": 0, "bookkeeping": int(self.pool.nbytes + self.inpool.nbytes)}

    @property
    def passes(self) -> int:
        """Passes completed so far (every row of the pass drawn; the next one began)."""
        return int(self.meta[1])

    @property
    def undrawn(self) -> int:
        """Rows of the current pass not drawn yet, as of the last sample (rows written since
        join at the next)."""
        return int(self.meta[0])

    # -- write hooks (lock held) ---------------------------------------------------------------
    def on_write(self, spans, n: int, extra) -> None:
        # before the cursor moves by n: the laps this write completes
        self.wraps += (self.writer.cursor + n) // self.capacity

    def on_wrap(self) -> None:
        self.wraps += 1

    def slot_hook(self):
        return None  # wraps_only

    def on_clear(self) -> None:
        self._k.pool_clear(self.pool, self.inpool, self.meta)
        self.meta[1] = 0
        self.wraps = 0
        self.synced = 0

    def _written(self) -> tuple:
        """``(start, count, position)``: the slots written since the last sync (none with no
        writer watched: over the shards of a region, the streams add the rows published to the
        pool before every draw, see :class:`tfdata.shared.streams.ShardStreams`)."""
        cap = self.capacity
        if self.writer is None:
            return 0, 0, self.synced
        position = self.wraps * cap + self.writer.cursor
        count = min(position - self.synced, cap)
        return self.synced % cap, count, position

    # -- drawing (lock held) -------------------------------------------------------------------
    def sample(self, n: int, out, arrays: dict) -> None:
        cap = self.capacity
        position = self.wraps * cap + self.writer.cursor
        synced = self.synced
        # draw, then gather, in one kernel call of the output's source (storage or projection)
        got = out.kernels.sample_pool(out.store, self.pool, self.inpool, self.meta, synced % cap,
                                      min(position - synced, cap), n, self.state, out.indices,
                                      out.kernel_out)
        if got < 0:  # the arguments come from this object: a bug, not the caller's input
            raise RuntimeError(f"WithoutReplacementSampler: sample_pool returned {got}")
        self.synced = position

    def sample_slices(self, n, streams, geo, reject, max_draws, out, arrays,
                      part=None) -> int:
        if reject:
            raise NotImplementedError(
                "sample_sequences(policy='reject') with sampler='without_replacement': a rejected "
                "start would leave its pass undrawn or drawn unreturned; use policy='mask' (starts "
                "drawn without replacement, invalid rows masked) or sampler='uniform'")
        cap = self.capacity
        position = self.wraps * cap + self.writer.cursor
        synced = self.synced
        mask = arrays["mask"]
        got = self._k.pool_slices(self.pool, self.inpool, self.meta, synced % cap,
                                  min(position - synced, cap), n, self.state,
                                  self.writer.cursor, self.num_envs, streams.episode,
                                  out.indices.reshape(mask.shape), mask)
        if got < 0:
            raise RuntimeError(f"WithoutReplacementSampler: pool_slices returned {got}")
        self.synced = position
        return -1

    # -- state ---------------------------------------------------------------------------------
    def extra_state(self, size: int) -> dict:
        """``{"undrawn": int64[m], "passes": int}``: the slots of the current pass not drawn
        yet, in the pool's order, the rows written since the last sample included (they are
        added here first, as a sample would)."""
        start, count, position = self._written()
        if count:
            # join them now (a sample of nothing): the saved pool is the one a sample would see
            empty = np.empty(0, np.int64)
            if size:
                self._k.pool_sample(self.pool, self.inpool, self.meta, start, count, size,
                                    self.state, empty)
            self.synced = position
        m = int(self.meta[0])
        return {"undrawn": self.pool[:m].astype(np.int64),  # the checkpoint's form: int64 slots
                "passes": int(self.meta[1])}

    def check_state(self, state, size: int, capacity: int):
        """``undrawn``: slots of rows held, each once; ``passes`` an int in ``[0, 2**63 - 1]``;
        together against the rows held (:func:`pass_problem`)."""
        rng = super().check_state(state, size, capacity)
        key = self.name
        state_part(state, ("undrawn", "passes"), key)
        passes = state_int(state, "passes", f"{key}.passes", 0, (1 << 63) - 1)
        undrawn = checked_slots(state["undrawn"], size, f"{key}.undrawn")
        problem = pass_problem(undrawn.shape[0], passes, size)
        if problem is not None:
            field, want = problem
            got = passes if field == "passes" else f"{undrawn.shape[0]} slots"
            raise StateError(f"{key}.{field}", want, got)
        return rng, undrawn, passes

    def load_state(self, checked) -> None:
        rng, undrawn, passes = checked
        super().load_state(rng)
        self.set_pass(undrawn, passes, self.writer.size)
        self.wraps = 0
        self.synced = self.writer.cursor  # the rows loaded are in the pool or drawn

    def set_pass(self, undrawn: np.ndarray, passes: int, n: int) -> None:
        """The pass of a checked state: ``undrawn`` (int64 slots, each once, every one below
        ``n``) in that order, after ``passes`` passes."""
        if self._k.pool_load(self.pool, self.inpool, self.meta, undrawn, n) != 0:
            raise RuntimeError("WithoutReplacementSampler: a checked pool did not load")
        self.meta[1] = passes


def read_undrawn(c, arrays, part, key: str, size: int, ring: bool = True) -> dict:
    """``state.<key>`` of a sampler without replacement from a checkpoint (``c``: its checker of
    JSON values, ``arrays``: its array reader), as a shared buffer reads it: ``undrawn``, int64
    slots (at most ``size``, from the header before anything is read) and ``passes``, against
    the rows held (:func:`pass_problem`; ``ring`` False: ``size`` bounds the slots of a shared
    region, not its rows held, and the caller checks them)."""
    w = f"state.{key}."
    c.obj(f"state.{key}", part, ("undrawn", "passes"))
    c.integer(w + "passes", part["passes"], 0, (1 << 63) - 1)
    m = arrays.length(w + "undrawn", part["undrawn"])
    if m > size:
        c.fail(w + "undrawn", f"at most {size} slots (the rows held)", f"{m} slots", show=False)
    problem = pass_problem(m, part["passes"], size) if ring else None
    if problem is not None:
        c.fail(w + problem[0], problem[1], part["passes"] if problem[0] == "passes" else f"{m} slots",
               show=problem[0] == "passes")
    return {"undrawn": arrays.read(w + "undrawn", part["undrawn"], np.int64, (m,)),
            "passes": part["passes"]}
