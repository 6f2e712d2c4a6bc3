"""Prioritized replay: sample, priority update, both in one step, the step's tail latency, and
the memory of a prioritized buffer.

Every class takes the layout as its first parameter; ``"numpy"`` is :class:`NumpySumTreeBuffer`
below, a vectorised numpy sum tree written the way one would by hand, measured in the same run
as tfdata so that every figure has its ratio to the baseline taken side by side. ``"floor"`` is
:class:`FloorStep`: tfdata's own tree kernels with the row copy, the whole step in one compiled
call with no Python, lock, checks or batch object around it (what is left to gain).

:class:`SampleUpdateLoop` is the step as a training loop takes it (a buffer filled by small
``extend`` calls, the garbage collector on, fresh priorities each step, uniform or skewed);
:class:`HugePages` is that step with each allocator, and :class:`StepFloor` measures the parts
of its floor (docs/design/prioritized.md, "The floor").

Filled buffers are built once per process, then given random priorities over every slot (the
same ones for every layout), so the trees are not flat when timing starts. As everywhere in
this suite, asv_runner calls ``setup`` before every timed call, so ``setup`` only looks things
up in per-process caches (and, for the update, draws the batch whose priorities are updated).
"""

from __future__ import annotations

import time

import numpy as np

import tfdata

from .common import (CAPACITIES, CARTPOLE, IMAGE, IMAGE_CAPACITY, LAYOUTS, NumpyBuffer,
                     TFDATA_LAYOUTS, fill, fill_chunk, first_time, one_row, p99_over_median,
                     random_rows, warm_kernels)

# every operation below is timed one call per sample (asv forces number=1 when a class has a
# setup), so take many samples: the median of thousands of single calls is stable
_MANY_SAMPLES = (200, 2000, 2.0)
BATCHES = [32, 256]
ALPHA, BETA, EPS = 0.6, 0.4, 1e-6  # tfdata's defaults, used by the baseline too


# -- the numpy baseline ---------------------------------------------------------------------
class NumpyBatch:
    """What :meth:`NumpySumTreeBuffer.sample` returns: slots, IS weights and the gathered rows."""

    __slots__ = ("indices", "weights", "fields")

    def __init__(self, indices, weights, fields):
        self.indices = indices
        self.weights = weights
        self.fields = fields

    def __getitem__(self, name):
        return self.fields[name]


class NumpySumTreeBuffer(NumpyBuffer):
    """Proportional prioritized replay written by hand with numpy: a binary sum tree, vectorised.

    * Storage: :class:`benchmarks.common.NumpyBuffer` (one preallocated array per field).
    * Priorities: one float64 array ``tree`` of ``2 * P`` nodes, ``P`` the power of two
      ``>= capacity``; ``tree[1]`` is the root, node ``i`` has children ``2i`` and ``2i + 1``,
      slot ``s`` is leaf ``P + s``. A leaf holds ``(priority + eps) ** alpha``; empty slots 0.
    * ``sample(B)``: stratified, ``u = (arange(B) + rng.random(B)) * total / B``, and the whole
      batch descends one level per step with array operations (``left = 2 * idx``; go right
      where ``u >= tree[left]``, subtracting the left mass). IS weights
      ``(p_min / p_i) ** beta``, with ``p_min`` an ``np.min`` over the live leaves (no min
      tree: the simple choice, and an O(capacity) pass per sample). Rows are gathered by fancy
      indexing each field (new arrays every call).
    * ``update_priorities``: set the leaves (a slot given twice keeps the last value, as numpy
      assignment does), then recompute the parents one level at a time from their children,
      the whole batch at once (shared parents are recomputed once per child given, to the
      same value: cheaper than deduplicating them with ``np.unique``).
    * New rows get the largest leaf value seen so far (1.0 at first), a running scalar.

    No validation and no lock, like ``NumpyBuffer``: the cheapest honest baseline.
    """

    def __init__(self, spec: tfdata.Spec, capacity: int, *, alpha: float = ALPHA,
                 beta: float = BETA, eps: float = EPS, seed: int = 0):
        super().__init__(spec, capacity, seed=seed)
        self.alpha, self.beta, self.eps = alpha, beta, eps
        self.leaves = 1 << max(0, (capacity - 1).bit_length())
        self.depth = self.leaves.bit_length() - 1  # levels between the root and the leaves
        self.tree = np.zeros(2 * self.leaves, np.float64)
        self.max_leaf = 1.0

    def _pull_up(self, nodes) -> None:
        """Recompute every ancestor of tree ``nodes`` (int64 array), one level at a time.

        A parent shared by several nodes is listed several times and written several times,
        with the same value (its children are final by then), which is cheaper than
        ``np.unique`` per level: that sort made the update 3-5x slower (measured at batch 32
        and 256, 10k and 1M slots).
        """
        tree = self.tree
        nodes = nodes >> 1
        for _ in range(self.depth):
            left = nodes << 1
            tree[nodes] = tree.take(left) + tree.take(left + 1)
            nodes >>= 1

    def extend(self, batch) -> None:
        super().extend(batch)
        n = min(len(batch[self._items[0][0]]), self.capacity)  # the rows that were kept
        slots = (np.arange(self.cursor - n, self.cursor) + self.capacity) % self.capacity
        nodes = slots + self.leaves
        self.tree[nodes] = self.max_leaf
        self._pull_up(nodes)

    def push(self, row) -> None:
        slot = self.cursor
        super().push(row)
        i = slot + self.leaves  # one leaf: walking up by hand beats the vectorised _pull_up
        self.tree[i] = self.max_leaf
        tree = self.tree
        i >>= 1
        while i >= 1:
            tree[i] = tree[2 * i] + tree[2 * i + 1]
            i >>= 1

    def sample(self, batch_size: int) -> NumpyBatch:
        tree, leaves = self.tree, self.leaves
        u = (np.arange(batch_size) + self.rng.random(batch_size)) * (tree[1] / batch_size)
        idx = np.ones(batch_size, np.int64)
        for _ in range(self.depth):  # idx: the batch's nodes at this level; u: mass left to skip
            idx <<= 1  # left children
            mass = tree.take(idx)
            right = u >= mass
            u -= mass * right
            idx += right
        slots = idx - leaves
        # rounding can push a draw past the last live leaf, into the empty slots: take the last
        np.minimum(slots, self.size - 1, out=slots)
        p_min = tree[leaves:leaves + self.size].min()
        weights = ((p_min / tree[slots + leaves]) ** self.beta).astype(np.float32)
        self.indices = slots
        return NumpyBatch(slots, weights, {name: arr[slots] for name, arr in self._items})

    def update_priorities(self, indices, priorities) -> None:
        values = (np.asarray(priorities, np.float64) + self.eps) ** self.alpha
        nodes = np.asarray(indices, np.int64) + self.leaves
        self.tree[nodes] = values
        self.max_leaf = max(self.max_leaf, float(values.max()))
        self._pull_up(nodes)


def check_baseline(draws: int = 200_000) -> None:
    """The baseline against exact answers on a small tree; raises AssertionError if wrong.

    Capacity 6 (8 leaves, two of them padding), filled past capacity so that the cursor wraps,
    then known priorities, one of them 0 and one slot given twice: the tree equals a bottom-up
    rebuild, sampled frequencies match ``p_i / sum p`` (alpha = 1) within 5 standard errors,
    the zero-priority slot and the padding are never drawn, the weights are
    ``(p_min / p_i) ** beta`` and never above 1, and rows follow their slots. Then, with equal
    priorities, a stratified batch of B = 8 rows out of 8 draws every row exactly once.
    """
    spec = tfdata.Spec({"x": "i8"})
    buf = NumpySumTreeBuffer(spec, 6, alpha=1.0, beta=0.5, eps=1e-12, seed=123)
    buf.extend({"x": np.arange(7, dtype=np.int64)})  # wraps: slot 0 holds 6, slots 1-5 hold 1-5
    buf.update_priorities(np.array([0, 1, 2, 3, 4, 5, 2]), np.array([1., 2., 9., 4., 0., 6., 3.]))
    leaves = buf.tree[buf.leaves:].copy()
    live_eps = np.array([1, 1, 1, 1, 1, 1, 0, 0]) * 1e-12
    expected_leaves = np.array([1., 2., 3., 4., 0., 6., 0., 0.]) + live_eps
    assert np.allclose(leaves, expected_leaves, rtol=0, atol=1e-15), leaves
    rebuilt = np.zeros_like(buf.tree)
    rebuilt[buf.leaves:] = leaves
    for i in range(buf.leaves - 1, 0, -1):
        rebuilt[i] = rebuilt[2 * i] + rebuilt[2 * i + 1]
    assert np.array_equal(rebuilt, buf.tree), (rebuilt, buf.tree)

    counts = np.zeros(buf.leaves, np.int64)
    batch = 1000
    for _ in range(draws // batch):
        b = buf.sample(batch)
        assert b.indices.min() >= 0 and b.indices.max() < len(buf)
        assert np.array_equal(b["x"], np.where(b.indices == 0, 6, b.indices))
        p = leaves[b.indices]
        live = leaves[:len(buf)]
        expected_w = (live.min() / p) ** 0.5
        assert b.weights.dtype == np.float32 and np.allclose(b.weights, expected_w, rtol=1e-6)
        assert b.weights.max() <= 1.0
        counts += np.bincount(b.indices, minlength=buf.leaves)
    prob = leaves / leaves.sum()
    n = counts.sum()
    # stratified draws vary less than independent ones: the binomial error is an upper bound
    tol = 5 * np.sqrt(n * prob * (1 - prob)) + 1
    assert np.all(np.abs(counts - n * prob) <= tol), (counts, n * prob)
    assert counts[4] == 0 and counts[6:].sum() == 0  # the zero priority and the padding

    # stratification: with equal masses every stratum of B = live rows holds exactly one row
    flat = NumpySumTreeBuffer(spec, 8, alpha=1.0, eps=0.0, seed=7)
    flat.extend({"x": np.arange(8, dtype=np.int64)})
    for _ in range(20):
        assert np.array_equal(np.sort(flat.sample(8).indices), np.arange(8))


# -- the floor: the step in one compiled call ----------------------------------------------------
_FLOOR: dict = {}


def _with_scratch() -> bool:
    """Whether this tfdata's ``is_weights`` and ``tree_update`` take scratch arrays (their
    powers computed a batch at a time), so that the floor runs on older commits too."""
    import inspect

    from tfdata.kernels._tree import tree_update

    return "scratch" in inspect.signature(tree_update.py_func).parameters


def _floor_kernels():
    """``(draw, step)``, compiled once per process (not cached), from tfdata's tree kernels:
    ``draw`` is the stratified descent, importance weights, versions and the row copy
    (whole-record assignment ``out[i] = records[idx[i]]``); ``step`` is ``draw`` then the checked
    priority update of the drawn slots (:func:`tfdata.kernels._tree.tree_update`). Raises
    NotImplementedError on a tfdata without those kernels."""
    kernels = _FLOOR.get("kernels")
    if kernels is None:
        try:
            from tfdata.kernels._tree import is_weights, live_limit, stratified_find, tree_update
        except ImportError as exc:
            raise NotImplementedError(f"no block tree kernels in this tfdata ({exc})") from None
        from numba import njit

        inline = dict(inline="always", boundscheck=False, error_model="numpy")
        if _with_scratch():  # the weights' and leaves' powers computed in scratch arrays

            @njit(**inline)
            def weights(mm, leaves, idx, beta, w, u):
                is_weights(mm, leaves, idx, beta, w, u)

            @njit(**inline)
            def update(sums, mm, leaves, version, idx, p, vv, n, low, high, eps, alpha, scratch):
                return tree_update(sums, mm, leaves, version, idx, p, vv, True, 0, n, low, high,
                                   eps, alpha, scratch)
        else:  # an older tfdata

            @njit(**inline)
            def weights(mm, leaves, idx, beta, w, u):
                is_weights(mm, leaves, idx, beta, w)

            @njit(**inline)
            def update(sums, mm, leaves, version, idx, p, vv, n, low, high, eps, alpha, scratch):
                return tree_update(sums, mm, leaves, version, idx, p, vv, True, 0, n, low, high,
                                   eps, alpha)

        @njit(nogil=True, boundscheck=False, error_model="numpy")
        def draw(records, n, sums, mm, leaves, version, state, beta, idx, u, w, vv, out):
            limit = live_limit(sums, leaves, n, records.shape[0])
            stratified_find(sums, leaves, limit, state, idx, u)
            weights(mm, leaves, idx, beta, w, u)
            for i in range(idx.shape[0]):
                vv[i] = version[idx[i]]
            for i in range(idx.shape[0]):
                out[i] = records[idx[i]]

        @njit(nogil=True, boundscheck=False, error_model="numpy")
        def step(records, n, sums, mm, leaves, version, state, beta, idx, u, w, vv, out, p, low,
                 high, eps, alpha, scratch):
            draw(records, n, sums, mm, leaves, version, state, beta, idx, u, w, vv, out)
            return update(sums, mm, leaves, version, idx, p, vv, n, low, high, eps, alpha, scratch)

        kernels = _FLOOR["kernels"] = (draw, step)
    return kernels


class FloorBatch:
    """What :meth:`FloorStep.sample` returns: the slots (and the arrays they index)."""

    __slots__ = ("indices",)

    def __init__(self, indices):
        self.indices = indices


class FloorStep:
    """The floor of a prioritized step at ``capacity`` CartPole rows: tfdata's block tree
    (float32 leaves, float64 block sums, float32 min/max, 8-bit versions) and the rows as one
    aligned 48 B record array, driven by the compiled :func:`_floor_kernels` with nothing else.

    ``sample(batch)`` is one call of ``draw``; ``update_priorities(indices, p)`` one call of
    ``tree_update`` (versions checked); ``step(batch, p)`` one call of both."""

    def __init__(self, capacity: int):
        self.draw, self.step_kernel = _floor_kernels()  # NotImplementedError on an older tfdata
        from tfdata.kernels._tree import new_tree, priority_bounds, tree_build

        chunk = fill_chunk(CARTPOLE)
        dtype = np.dtype([(f.name, f.dtype, f.shape) for f in CARTPOLE], align=True)
        self.records = np.zeros(capacity, dtype)
        rows = len(next(iter(chunk.values())))
        for start in range(0, capacity, rows):
            stop = min(capacity, start + rows)
            for name, values in chunk.items():
                self.records[name][start:stop] = values[:stop - start]

        class _Zeros:
            zeros = staticmethod(np.zeros)

        self.sums, self.mm, self.leaves, _ = new_tree(capacity, _Zeros())
        tree_build(self.sums, self.mm, self.leaves, (initial_priorities(capacity) + EPS) ** ALPHA)
        self.version = np.zeros(capacity, np.uint8)
        self.low, self.high = priority_bounds(EPS, ALPHA, len(self.leaves))
        self.n = capacity
        self.state = np.array([0x9E3779B97F4A7C15, 0], np.uint64)
        self._bufs: dict = {}
        scratch = np.zeros(256, np.float32)  # the sampler's, for the update's powers
        self.scratch = (scratch, scratch) if _with_scratch() else (scratch,)

    def _arrays(self, batch: int) -> tuple:
        a = self._bufs.get(batch)
        if a is None:
            a = self._bufs[batch] = (np.zeros(batch, np.int64), np.zeros(batch), np.zeros(batch, np.float32),
                                     np.zeros(batch, np.uint32), np.zeros(batch, self.records.dtype))
        return a

    def sample(self, batch: int) -> FloorBatch:
        idx, u, w, vv, out = self._arrays(batch)
        self.draw(self.records, self.n, self.sums, self.mm, self.leaves, self.version, self.state,
                  BETA, idx, u, w, vv, out)
        return FloorBatch(idx)

    def update_priorities(self, indices, priorities) -> None:
        from tfdata.kernels._tree import tree_update

        vv = self.version[indices].astype(np.uint32)
        tree_update(self.sums, self.mm, self.leaves, self.version, indices, priorities, vv, True, 0,
                    self.n, self.low, self.high, EPS, ALPHA, *self.scratch[1:])

    def step(self, batch: int, priorities) -> None:
        idx, u, w, vv, out = self._arrays(batch)
        self.step_kernel(self.records, self.n, self.sums, self.mm, self.leaves, self.version,
                         self.state, BETA, idx, u, w, vv, out, priorities, self.low, self.high, EPS,
                         ALPHA, self.scratch[0])


# -- buffers ----------------------------------------------------------------------------------
def new_prioritized(layout: str, capacity: int, seed: int = 0):
    """An empty prioritized buffer: tfdata's for "aos"/"soa", the numpy sum tree for "numpy"."""
    if layout == "numpy":
        return NumpySumTreeBuffer(CARTPOLE, capacity, alpha=ALPHA, beta=BETA, eps=EPS, seed=seed)
    return tfdata.PrioritizedReplayBuffer(CARTPOLE, capacity, alpha=ALPHA, beta=BETA, eps=EPS,
                                          layout=layout, seed=seed)


def initial_priorities(capacity: int) -> np.ndarray:
    """Priorities given to every slot after filling: |N(0, 1)|, like absolute TD errors."""
    return np.abs(np.random.default_rng(4).standard_normal(capacity))


_FILLED: dict = {}


def filled_prioritized(layout: str, capacity: int):
    """A full buffer with random priorities on every slot, built once per process and cached
    (the floor's :class:`FloorStep` is built full)."""
    buf = _FILLED.get((layout, capacity))
    if buf is None and layout == "floor":
        buf = _FILLED[(layout, capacity)] = FloorStep(capacity)
    if buf is None:
        buf = new_prioritized(layout, capacity)
        fill(buf, capacity, fill_chunk(CARTPOLE))
        buf.update_priorities(np.arange(capacity, dtype=np.int64), initial_priorities(capacity))
        _FILLED[(layout, capacity)] = buf
    return buf


_NEW_PRIORITIES: dict = {}


def new_priorities(batch: int) -> np.ndarray:
    """The priorities every timed update writes: |N(0, 1)| of length ``batch`` (cached)."""
    p = _NEW_PRIORITIES.get(batch)
    if p is None:
        p = _NEW_PRIORITIES[batch] = np.abs(np.random.default_rng(5).standard_normal(batch))
    return p


_WARM = False


def warm_prioritized() -> None:
    """Load (or compile) every kernel of both tfdata layouts and check the baseline, once per
    process, in every process (the baseline's included), so all have the same code resident."""
    global _WARM
    if _WARM:
        return
    warm_kernels()
    rows = random_rows(CARTPOLE, max(BATCHES))  # sample() wants batch_size <= len(buffer)
    for layout in TFDATA_LAYOUTS:
        buf = new_prioritized(layout, max(BATCHES))
        buf.extend(rows)
        for batch in BATCHES:
            b = buf.sample(batch)
            buf.update_priorities(b.indices, new_priorities(batch))
            buf.update_priorities(buf.sample(batch), new_priorities(batch))
    check_baseline()
    _WARM = True


def _setup(layout, capacity, batch):
    warm_prioritized()
    buf = filled_prioritized(layout, capacity)
    if first_time("prioritized", layout, capacity, batch):
        for _ in range(3):  # allocates this batch size's output ring
            b = buf.sample(batch)
            buf.update_priorities(b.indices, new_priorities(batch))
    return buf


# -- benchmarks -------------------------------------------------------------------------------
class SampleUpdate:
    """One prioritized-replay step on a full buffer of CartPole rows with random priorities.

    ``time_sample_update``: ``b = sample(batch)`` then ``update_priorities(b.indices, p)``.
    ``time_sample``: the sample alone. ``time_update``: the update alone, of the slots of a
    batch drawn in ``setup`` just before (so, as in training, right after their sample).
    ``time_sample_update_batch``: the same step passing the batch itself,
    ``update_priorities(b, p)``, the stale-checked path users take (numpy has no such check: its
    step as above). For ``"floor"`` both steps are one compiled call (:class:`FloorStep`).
    """

    params = [LAYOUTS + ["floor"], CAPACITIES, BATCHES]
    param_names = ["layout", "capacity", "batch"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, capacity, batch):
        self.buf = _setup(layout, capacity, batch)
        self.priorities = new_priorities(batch)
        if layout == "floor" and first_time("prioritized-floor-step", capacity, batch):
            self.buf.step(batch, self.priorities)  # compiles the one-call step
        self.indices = self.buf.sample(batch).indices.copy()

    def time_sample_update(self, layout, capacity, batch):
        buf = self.buf
        if layout == "floor":
            buf.step(batch, self.priorities)
            return
        b = buf.sample(batch)
        buf.update_priorities(b.indices, self.priorities)

    def time_sample_update_batch(self, layout, capacity, batch):
        buf = self.buf
        if layout == "floor":
            buf.step(batch, self.priorities)
        elif layout == "numpy":
            buf.update_priorities(buf.sample(batch).indices, self.priorities)
        else:
            buf.update_priorities(buf.sample(batch), self.priorities)

    def time_sample(self, layout, capacity, batch):
        self.buf.sample(batch)

    def time_update(self, layout, capacity, batch):
        self.buf.update_priorities(self.indices, self.priorities)


class SequenceUpdate:
    """The step of a recurrent learner on a full buffer of CartPole rows with random
    priorities: ``b = sample_sequences(batch, 8)`` (start rows drawn in proportion to their
    priority, slices cut at episode ends, masked), then ``update_priorities(b, p)`` of the start
    rows. tfdata's layouts only: the numpy sum tree above draws no slices."""

    params = [TFDATA_LAYOUTS, CAPACITIES, BATCHES]
    param_names = ["layout", "capacity", "batch"]
    repeat = _MANY_SAMPLES
    length = 8

    def setup(self, layout, capacity, batch):
        self.buf = _setup(layout, capacity, batch)
        self.priorities = new_priorities(batch)
        if first_time("prioritized-sequences", layout, capacity, batch):
            for _ in range(3):  # allocates this shape's output ring
                self.buf.update_priorities(self.buf.sample_sequences(batch, self.length),
                                           self.priorities)

    def time_sequence_update(self, layout, capacity, batch):
        buf = self.buf
        buf.update_priorities(buf.sample_sequences(batch, self.length), self.priorities)


def step_priorities(kind: str, rng, batch: int) -> np.ndarray:
    """The priorities one step of :class:`SampleUpdateLoop` writes: ``"uniform"`` fresh uniform
    values in (0, 1]; ``"skewed"`` lognormal(0, 2) values (about four decades apart: a few rows
    carry most of the mass, as absolute TD errors do in training)."""
    if kind == "uniform":
        return 1.0 - rng.random(batch)
    return rng.lognormal(0.0, 2.0, batch)


class SampleUpdateLoop:
    """The step of a training loop, ``b = sample(256)`` then ``update_priorities(b, p)``, in the
    conditions of a side-by-side run against other libraries: a buffer of CartPole rows filled
    by ``extend`` in chunks of 1,000 rows (new rows at the maximum priority), then a loop with
    the garbage collector on, fresh priorities each step (:func:`step_priorities`) so that the
    tree's shape keeps changing. ``"skewed"`` first gives every slot such a priority, so the
    batches are drawn from a skewed distribution, as in training.

    ``track_step``: the median of 2000 steps, each timed alone with ``perf_counter_ns`` after
    200 untimed ones, in µs (asv's ``time_`` benchmarks turn the collector off: this one keeps
    it on, as a training loop does). The buffer is built in the benchmark's own process, never
    shared with another case. numpy: :class:`NumpySumTreeBuffer`, given the batch's indices.
    Target: tfdata at 1M rows >= 8x faster than numpy.
    """

    params = [LAYOUTS, CAPACITIES, ["uniform", "skewed"]]
    param_names = ["layout", "capacity", "priorities"]
    batch = 256
    steps = 2000
    timeout = 600
    number = 1
    repeat = 1

    def setup(self, layout, capacity, priorities):
        warm_prioritized()
        buf = new_prioritized(layout, capacity)
        chunk = random_rows(CARTPOLE, 1000, seed=1)
        for start in range(0, capacity, 1000):
            buf.extend(chunk)
        self.rng = np.random.default_rng(6)
        if priorities == "skewed":
            for start in range(0, capacity, 65_536):
                slots = np.arange(start, min(capacity, start + 65_536), dtype=np.int64)
                buf.update_priorities(slots, step_priorities("skewed", self.rng, len(slots)))
        self.buf = buf
        self.step = self._step(layout, priorities)
        for _ in range(200):
            self.step()

    def _step(self, layout, priorities):
        sample, update, rng, batch = self.buf.sample, self.buf.update_priorities, self.rng, self.batch
        clock = time.perf_counter_ns
        numpy = layout == "numpy"

        def step():
            p = step_priorities(priorities, rng, batch)
            t0 = clock()
            b = sample(batch)
            update(b.indices if numpy else b, p)
            return clock() - t0

        return step

    def track_step(self, layout, capacity, priorities):
        import gc

        step = self.step
        was = gc.isenabled()
        gc.enable()
        try:
            times = [step() for _ in range(self.steps)]
        finally:
            if not was:
                gc.disable()
        return float(np.median(times)) / 1e3

    track_step.unit = "µs"


class SampleTail:
    """Tail latency of one step, ``sample(256)`` + ``update_priorities(batch)`` (the batch
    itself: stale-checked; numpy gets its indices), at 1M CartPole rows: p99 over median of
    2000 steps.

    Each step is timed on its own with ``perf_counter_ns``, garbage collector left on (as in a
    training loop), after 200 warm-up steps.
    """

    params = [LAYOUTS + ["floor"]]
    param_names = ["layout"]
    capacity = 1_000_000
    batch = 256
    calls = 2000
    timeout = 300

    def setup(self, layout):
        self.buf = _setup(layout, self.capacity, self.batch)
        self.priorities = new_priorities(self.batch)
        for _ in range(200):  # the steps timed below (the floor's step compiles on its first call)
            if layout == "floor":
                self.buf.step(self.batch, self.priorities)
            else:
                b = self.buf.sample(self.batch)
                self.buf.update_priorities(b if layout != "numpy" else b.indices, self.priorities)

    def track_p99_over_median(self, layout):
        sample, update = self.buf.sample, self.buf.update_priorities
        batch, priorities = self.batch, self.priorities
        if layout == "floor":
            step = self.buf.step
            return p99_over_median(lambda: step(batch, priorities), self.calls)
        if layout == "numpy":
            return p99_over_median(lambda: update(sample(batch).indices, priorities), self.calls)
        return p99_over_median(lambda: update(sample(batch), priorities), self.calls)

    track_p99_over_median.unit = "ratio"


def tree_on_huge_pages(sampler) -> None:
    """Move a prioritized sampler's tree and versions (``sums``, ``mm``, ``leaves``, ``v8``: 6
    MiB at 1M slots, each array under 4 MiB, which numpy leaves on small pages) into one private
    mapping aligned to 2 MiB and advised ``MADV_HUGEPAGE``, for the sample and update paths
    (only :class:`HugePages` does this: the write hooks keep the old arrays)."""
    import mmap

    arrays = [sampler.sums, sampler.mm, sampler.leaves, sampler.v8]
    huge = 2 << 20
    total = sum(a.nbytes + 64 for a in arrays) + huge
    m = mmap.mmap(-1, -(-total // huge) * huge + huge, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(mmap.MADV_HUGEPAGE)
    raw = np.frombuffer(m, np.uint8)
    at = (-raw.ctypes.data) % huge
    moved = []
    for a in arrays:
        at += (-(raw.ctypes.data + at)) % 64
        b = raw[at:at + a.nbytes].view(a.dtype).reshape(a.shape)
        b[...] = a
        moved.append(b)
        at += a.nbytes
    sampler.sums, sampler.mm, sampler.leaves, sampler.v8 = moved
    sampler.trees = (sampler.sums, sampler.mm, sampler.leaves)  # (the views keep ``m`` alive)


class HugePages(SampleUpdateLoop):
    """:class:`SampleUpdateLoop` (AoS, 1M rows, uniform priorities) with the buffer's memory from
    each allocator: ``"numpy"`` (the default: numpy advises huge pages for its arrays of 4 MiB or
    more, here the rows and the leaves), ``"nohugepages"`` (none), ``"hugepages"`` (every array
    of 2 MiB or more), and ``"hugepages+tree"``: that, and the tree and versions moved into one
    huge-page mapping (:func:`tree_on_huge_pages`). Figures: docs/design/prioritized.md."""

    params = [["aos"], ["numpy", "nohugepages", "hugepages", "hugepages+tree"]]
    param_names = ["layout", "allocator"]

    def setup(self, layout, allocator):
        warm_prioritized()
        buf = tfdata.PrioritizedReplayBuffer(CARTPOLE, 1_000_000, alpha=ALPHA, beta=BETA, eps=EPS,
                                             layout=layout, seed=0,
                                             allocator=allocator.split("+")[0])
        chunk = random_rows(CARTPOLE, 1000, seed=1)
        for _ in range(1000):
            buf.extend(chunk)
        if allocator.endswith("+tree"):
            tree_on_huge_pages(buf.sampler)
        self.buf, self.rng = buf, np.random.default_rng(6)
        self.step = self._step(layout, "uniform")
        for _ in range(200):
            self.step()

    def track_step(self, layout, allocator):
        return SampleUpdateLoop.track_step(self, layout, 1_000_000, "uniform")

    track_step.unit = "µs"


_PARTS: dict = {}


def _part_kernels() -> dict:
    """The floor's parts as compiled loops (compiled once per process, not cached), each running
    ``reps`` batches so that one call's dispatch is spread over them; see :class:`StepFloor`."""
    kernels = _PARTS.get("kernels")
    if kernels is not None:
        return kernels
    from numba import njit

    opts = dict(nogil=True, boundscheck=False, error_model="numpy")

    inline = dict(inline="always", boundscheck=False, error_model="numpy")
    try:
        from tfdata.kernels._pow import pow32
    except ImportError:  # an older tfdata: every power with ``**``

        @njit(**inline)
        def pow32(x, y):
            return np.float32(np.nan)

    @njit(**opts)
    def pows(a, b, beta, alpha, eps, w, leaf, u, reps):
        for r in range(reps):  # the weights' and the leaves' powers of one step (a row of
            for i in range(a.shape[1]):  # outputs per batch: no store is dead), as the kernels
                u[i] = a[r, i] / b[r, i]  # compute them: pow32, then ``**`` where it is unsure
            for i in range(a.shape[1]):
                w[r, i] = pow32(u[i], beta)
            for i in range(a.shape[1]):
                if w[r, i] != w[r, i]:
                    w[r, i] = np.float32(u[i] ** beta)
            for i in range(a.shape[1]):
                leaf[r, i] = pow32(a[r, i] + eps, alpha)
            for i in range(a.shape[1]):
                if leaf[r, i] != leaf[r, i]:
                    leaf[r, i] = np.float32((a[r, i] + eps) ** alpha)

    @njit(**opts)
    def rows(records, idx, out, reps):
        for r in range(reps):  # 256 random whole rows, as a uniform sample copies them
            for i in range(idx.shape[1]):
                out[r, i] = records[idx[r, i]]

    @njit(**opts)
    def lines(tree, at, reps):
        acc = 0.0
        for r in range(reps):  # independent loads of random lines: every miss can overlap
            for i in range(at.shape[1]):
                acc += tree[at[r, i]]
        return acc

    @njit(**opts)
    def chase(nxt, start, steps):
        j = start
        for _ in range(steps):  # each load's address is the previous load's value
            j = nxt[j]
        return j

    try:
        from tfdata.kernels._tree import _block4
    except ImportError:  # an older tfdata: the blocks one at a time
        from tfdata.kernels._tree import _block

        @njit(**inline)
        def _block4(sums, mm, leaves, nb, b0, b1, b2, b3):
            for b in (b0, b1, b2, b3):
                _block(sums, mm, leaves, nb, b)

    @njit(**opts)
    def blocks(leaves, at, sums, mm, reps):
        for r in range(reps):  # blocks summed in slot order with their smallest positive and
            for i in range(0, at.shape[1], 4):  # largest leaf, four at a time as the update does
                _block4(sums, mm, leaves, 0, at[r, i], at[r, i + 1], at[r, i + 2], at[r, i + 3])

    @njit(**opts)
    def noop(*args):
        return 0

    kernels = _PARTS["kernels"] = dict(pows=pows, rows=rows, lines=lines, chase=chase,
                                       blocks=blocks, noop=noop)
    return kernels


class StepFloor:
    """The parts of the floor of one prioritized step (``sample(256)`` + ``update_priorities``,
    1M CartPole rows), each measured alone at its best, in µs per step
    (docs/design/prioritized.md, "The floor", adds them up):

    * ``pows``: the 512 powers a step must compute exactly (256 weights, 256 leaves), as the
      kernels compute them (``tfdata.kernels._pow.pow32``, then ``**`` where it is unsure);
    * ``rows``: 256 random 48 B rows of 1M copied (a 48 MB record array, huge pages as numpy
      advises them): the gather;
    * ``lines``: 3,072 independent loads of random 64 B lines of a 6 MiB array (the tree's
      size): the 12 lines per draw beyond L1 that a step touches (5 levels of sums, 5 of
      min/max, the block's leaves, the version), with every miss free to overlap;
    * ``chase``: the same number of dependent loads (a random cycle over those lines): what
      each of them costs when nothing overlaps (``chase / lines`` is the memory-level
      parallelism the loads found);
    * ``blocks``: 256 blocks of 16 float32 leaves summed in slot order in float64 (the exact
      sums) with their smallest and largest leaf, four at a time as the update does;
    * ``python``: the cheapest public sample call (``ReplayBuffer.sample(1)``, uniform, 1,000
      rows) plus one call of a compiled no-op with the update kernel's 15 arguments;
    * ``onepath``: the public step (AoS, 1M rows filled as in :class:`SampleUpdateLoop`, GC on)
      with all the mass on slot 0 (every other slot at priority 0, slot 0 and each update at
      the largest accepted priority), so that every draw walks the same path and copies the
      same row: the same instructions as any step (the descent is branch-free, the update
      walks each slot's path), the Python around them, and no cache miss.

    Compiled parts run 32 batches per call, each on fresh random inputs; the median over 400
    calls / 32. ``python``: medians of 2000 calls each.
    """

    params = [["pows", "rows", "lines", "chase", "blocks", "python", "onepath"]]
    param_names = ["part"]
    timeout = 300
    number = 1
    repeat = 1
    reps = 32
    calls = 400
    batch = 256
    per_draw = 12

    def setup(self, part):
        self.k = _part_kernels()
        self.rng = np.random.default_rng(7)
        self.part = part

    def _median(self, call, calls) -> float:
        clock = time.perf_counter_ns
        times = []
        for _ in range(calls):
            t0 = clock()
            call()
            times.append(clock() - t0)
        return float(np.median(times)) / 1e3

    def track_part(self, part):
        k, rng, b, reps = self.k, self.rng, self.batch, self.reps
        if part == "python":
            buf = tfdata.ReplayBuffer(CARTPOLE, 1000, seed=0)
            buf.extend(random_rows(CARTPOLE, 1000))
            arrays = [np.zeros(256) for _ in range(15 if _with_scratch() else 14)]
            noop = k["noop"]
            noop(*arrays)
            return (self._median(lambda: buf.sample(1), 2000)
                    + self._median(lambda: noop(*arrays), 2000))
        if part == "onepath":
            buf = tfdata.PrioritizedReplayBuffer(CARTPOLE, 1_000_000, alpha=ALPHA, beta=BETA,
                                                 eps=EPS, layout="aos", seed=0)
            chunk = random_rows(CARTPOLE, 1000, seed=1)
            for _ in range(1000):
                buf.extend(chunk)
            top = buf.priority_range[1]
            p = np.zeros(1_000_000)
            p[0] = top
            buf.update_priorities(np.arange(1_000_000, dtype=np.int64), p)
            high = np.full(b, top)
            sample, update = buf.sample, buf.update_priorities

            def step():
                update(sample(b), high)

            for _ in range(200):
                step()
            assert (buf.sample(b).indices == 0).all()
            import gc

            was = gc.isenabled()
            gc.enable()
            try:
                return self._median(step, 2000)
            finally:
                if not was:
                    gc.disable()
        if part == "pows":
            a, bb = rng.random((reps, b)) + 1e-3, rng.random((reps, b)) + 1.0
            w, leaf = np.zeros((reps, b), np.float32), np.zeros((reps, b), np.float32)
            fn, u = k["pows"], np.zeros(b)
            call = lambda: fn(a, bb, BETA, ALPHA, EPS, w, leaf, u, reps)  # noqa: E731
        elif part == "rows":
            dtype = np.dtype([(f.name, f.dtype, f.shape) for f in CARTPOLE], align=True)
            records = np.zeros(1_000_000, dtype)
            records.view(np.uint8)[:] = 1  # every page resident
            sets = [rng.integers(0, len(records), (reps, b)) for _ in range(16)]
            out = np.zeros((reps, b), dtype)
            fn, it = k["rows"], iter(range(1 << 62))
            call = lambda: fn(records, sets[next(it) & 15], out, reps)  # noqa: E731
        elif part in ("lines", "chase"):
            tree = np.ones((6 << 20) // 8)
            nlines = tree.shape[0] // 8
            n = b * self.per_draw
            if part == "lines":
                sets = [rng.integers(0, nlines, (reps, n)) * 8 for _ in range(16)]
                fn, it = k["lines"], iter(range(1 << 62))
                call = lambda: fn(tree, sets[next(it) & 15], reps)  # noqa: E731
            else:
                order = rng.permutation(nlines) * 8
                nxt = np.zeros(tree.shape[0], np.int64)
                nxt[order] = np.roll(order, -1)
                fn = k["chase"]
                call = lambda: fn(nxt, int(order[0]), reps * n)  # noqa: E731
        else:
            leaves = rng.random(1 << 20).astype(np.float32)
            nb = (1 << 20) // 16
            sets = [rng.integers(0, nb, (reps, b)) for _ in range(16)]  # blocks
            # each block's node written to one place: in the step the descent has just read that
            # node's line, so its write is no miss (the memory floor counts the lines)
            sums = np.lib.stride_tricks.as_strided(np.zeros(1), (nb,), (0,))
            mm = np.lib.stride_tricks.as_strided(np.zeros((1, 2), np.float32), (nb, 2), (0, 4))
            fn, it = k["blocks"], iter(range(1 << 62))
            call = lambda: fn(leaves, sets[next(it) & 15], sums, mm, reps)  # noqa: E731
        call()
        return self._median(call, self.calls) / reps

    track_part.unit = "µs"


class Push:
    """``push`` of one CartPole row into a full prioritized buffer: the row, the eviction of the
    overwritten slot and the new row's maximum priority (tfdata: the per-spec fast path and one
    tree kernel call). Target: tfdata <= the numpy sum tree's time."""

    params = [LAYOUTS, CAPACITIES]
    param_names = ["layout", "capacity"]
    repeat = _MANY_SAMPLES

    def setup(self, layout, capacity):
        warm_prioritized()
        self.buf = filled_prioritized(layout, capacity)
        self.row = one_row(CARTPOLE, seed=2)
        if first_time("prioritized-push", layout, capacity):
            for _ in range(3):  # the first write of this process loads the tree kernel
                self.buf.push(self.row)

    def time_push(self, layout, capacity):
        self.buf.push(self.row)


class Memory:
    """Memory of a full prioritized buffer over the raw bytes of its rows (``spec.row_nbytes *
    capacity``): 1M CartPole rows (46 B) and 20k image rows (56,462 B).

    ``track_nbytes_ratio``: what the buffer says it holds (``nbytes``: rows, episode numbers,
    trees, versions, output rings; numpy: its field arrays and its float64 tree).
    ``track_rss_ratio``: the growth of this process's resident set while the buffer is built,
    filled (max priority for every row) and sampled once (``sample(256)`` + ``update_priorities``),
    the rows to fill with made before. Target: at most 1.3 for CartPole, as good for images.
    """

    params = [LAYOUTS, ["cartpole", "image"]]
    param_names = ["layout", "rows"]
    timeout = 300
    number = 1
    repeat = 1

    def setup(self, layout, rows):
        warm_prioritized()
        self.spec, self.capacity = (CARTPOLE, 1_000_000) if rows == "cartpole" else (IMAGE, IMAGE_CAPACITY)
        self.raw = self.spec.row_nbytes * self.capacity
        self.chunk = fill_chunk(self.spec)  # made before anything is measured
        self.p = new_priorities(256)

    def _build(self, layout):
        if layout == "numpy":
            buf = NumpySumTreeBuffer(self.spec, self.capacity, alpha=ALPHA, beta=BETA, eps=EPS)
        else:
            buf = tfdata.PrioritizedReplayBuffer(self.spec, self.capacity, alpha=ALPHA, beta=BETA,
                                                 eps=EPS, layout=layout, seed=0)
        fill(buf, self.capacity, self.chunk)
        b = buf.sample(256)
        buf.update_priorities(b.indices, self.p)
        return buf

    def track_nbytes_ratio(self, layout, rows):
        buf = self._build(layout)
        nbytes = buf.nbytes + (buf.tree.nbytes if layout == "numpy" else 0)
        return nbytes / self.raw

    track_nbytes_ratio.unit = "ratio"

    def track_rss_ratio(self, layout, rows):
        import gc

        from tfdata.memory import snapshot

        gc.collect()
        before = snapshot(uss=False)["rss"]
        buf = self._build(layout)
        grown = snapshot(uss=False)["rss"] - before
        del buf
        return grown / self.raw

    track_rss_ratio.unit = "ratio"
