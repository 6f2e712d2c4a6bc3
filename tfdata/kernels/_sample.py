"""The gather and sampling kernels, written once for both layouts and for projections.

The functions below are templates, never called as they are. They copy rows with ``copy_field``,
test ``ONE_FIELD``, bound a tuple store's rows with ``rows_of`` and name the arrays it reads
with ``base_of``, names this module leaves unbound: each layout module calls :func:`specialize`
with its own and gets the six kernels as ``@njit(**NJIT_OPTIONS)`` dispatchers, compiled from
copies of the templates whose globals bind them. SoA (``ONE_FIELD = False``) copies its tuple of
``uint8[capacity, field_bytes]`` byte views field by field with :func:`.soa.copy_columns`; AoS
(``ONE_FIELD = True``) copies its one ``uint64[capacity, words]`` record array with
:func:`.aos.copy_records`. Both copy a whole row (of a field, for SoA) at a time with a
:func:`row_copy` made for their widths. The third specialization, :mod:`.spans` (``ONE_FIELD =
False``), is not a layout: its store is a tuple of ``(base, offset)`` pairs, one per field of a
projection (``sample(batch, fields=[...])``), each field's bytes at a byte offset of a base's
rows, copied with a :func:`span_copy` into one column per field; so one projected copy serves
every layout. numba prunes the branch of a constant global before typing (the other branch would
not even type) and inlines the copy as any ``inline="always"`` global, so each kernel compiles,
in the same time, to the machine code of a hand-written kernel for its layout. Each is cached
like any kernel: the entry is named after the layout
(``_sample.aos.sample_uniform-<line>.py311.nbi``), keyed by the signature and invalidated by an
edit of this file, of the layout's module, or of a source either imports
(:mod:`tfdata._kernel_cache`): of :func:`.aos.copy_records`, :func:`.spans.copy_spans`,
:func:`._pool.pool_draw` or :func:`._replays.replays_draw` too.

Tried and dropped: the copy passed as an argument (numba cannot cache the kernel: "dynamic
globals"); a closure over the copy (compiled again in every process: numba keys a closure's
cache entry by its pickled cells, and a pickled dispatcher holds a random uuid); a generic
kernel inlined into per-layout kernels (a slower cold compile); a copy picked by ``@overload``
on the store's type (a slower compile when inlined, slower samples when not); a whole-store copy
function per layout, or the AoS array handed over as a one-field tuple (one more inline level,
or a loop over a 1-tuple: a slower cold compile of one layout's kernels). Figures:
docs/design/kernels.md, "Measured".

``store`` and ``out`` are what the layout's storage hands the kernels: ``uint64[capacity,
words]`` for AoS, a tuple of ``uint8[capacity, field_bytes]`` byte views (one per field) for
SoA, a tuple of ``(uint8[capacity, row_bytes], offset)`` pairs with a tuple of ``uint8[rows,
field_bytes]`` columns for spans; ``out`` has at least ``len(idx)`` rows and only the first
``len(idx)`` are written.
"""

from __future__ import annotations

from types import FunctionType

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._pool import pool_draw
from ._prefetch import prefetch, prefetch_row
from ._replays import replays_draw
from ._rng import fill_indices
from ._shared import draw_slot, draw_slots, in_windows, snapshot_heads, windows
from ._sync import fence_acquire
from ._tree import epoch_stamp, is_weights, live_limit, stratified_find

_TWO32 = np.uint64(1 << 32)

def row_copy(sizes):
    """An intrinsic ``copy_row(dst, i, src, j, nbytes)``: the first ``nbytes`` bytes of row ``j``
    of ``src`` to row ``i`` of ``dst``, switching once per row among fixed-size copies, one per
    byte count in ``sizes``, and ``memcpy`` with the runtime length for any other count.

    A fixed-size copy is an ``llvm.memcpy`` of constant length, which LLVM emits as a few vector
    loads then stores (48 bytes: one 32-byte and one 16-byte move), as numba's whole-record
    assignment ``out[i] = buf[j]`` does for one dtype; so one compiled kernel serves every row
    width at that speed. The loop over a row's words with a runtime width that it replaces was
    twice as slow on random rows (see reports/benchmarks.md, "Uniform sample: where the time
    goes"). ``dst`` and ``src`` must be 2-D C-contiguous arrays (rows of contiguous bytes): any
    other array is a typing error, never a copy of the wrong bytes. No bounds or wraparound: the
    caller checked ``i`` and ``j``.
    """
    return _block_copy(sizes, offset=False)


def span_copy(sizes):
    """An intrinsic ``copy_span(dst, i, src, j, offset, nbytes)``: bytes ``[offset, offset +
    nbytes)`` of row ``j`` of ``src`` to the first ``nbytes`` bytes of row ``i`` of ``dst``: a
    field's bytes out of a wider row (an AoS record, a group of fields), copied as
    :func:`row_copy` copies a row (a fixed-size copy per count in ``sizes``, else ``memcpy``).
    The same typing rule (2-D C-contiguous arrays only); no bounds: the caller checked ``i``,
    ``j`` and ``offset + nbytes <= src.shape[1] * src.itemsize``.
    """
    return _block_copy(sizes, offset=True)


def _block_copy(sizes, offset: bool):
    sizes = tuple(sorted(set(int(n) for n in sizes)))

    def codegen(context, builder, sig, args):
        dty, ity, sty, jty = sig.args[:4]
        nty = sig.args[-1]
        d = context.make_array(dty)(context, builder, args[0])
        s = context.make_array(sty)(context, builder, args[2])
        zero = context.get_constant(types.intp, 0)
        row_i = context.cast(builder, args[1], ity, types.intp)
        row_j = context.cast(builder, args[3], jty, types.intp)
        dst_ptr = cgutils.get_item_pointer(context, builder, dty, d, [row_i, zero],
                                           wraparound=False)
        src_ptr = cgutils.get_item_pointer(context, builder, sty, s, [row_j, zero],
                                           wraparound=False)
        dst_ptr = builder.bitcast(dst_ptr, cgutils.voidptr_t)
        src_ptr = builder.bitcast(src_ptr, cgutils.voidptr_t)
        if offset:  # a byte offset into the source row
            off = context.cast(builder, args[4], sig.args[4], types.intp)
            src_ptr = builder.gep(src_ptr, [off])
        n = context.cast(builder, args[-1], nty, types.intp)
        fn = builder.function
        done = fn.append_basic_block("copy_row.done")
        other = fn.append_basic_block("copy_row.other")
        switch = builder.switch(n, other)
        for size in sizes:
            block = fn.append_basic_block(f"copy_row.{size}")
            switch.add_case(ir.Constant(n.type, size), block)
            with builder.goto_block(block):
                cgutils.raw_memcpy(builder, dst_ptr, src_ptr, ir.Constant(n.type, size), 1)
                builder.branch(done)
        with builder.goto_block(other):
            cgutils.raw_memcpy(builder, dst_ptr, src_ptr, n, 1)
            builder.branch(done)
        builder.position_at_end(done)
        return context.get_dummy_value()

    def typed(dst, i, src, j, *rest):
        if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.ndim == 2
                and src.ndim == 2 and dst.layout == "C" and src.layout == "C"
                and isinstance(i, types.Integer) and isinstance(j, types.Integer)
                and all(isinstance(r, types.Integer) for r in rest)):
            return None
        return types.none(dst, i, src, j, *rest), codegen

    if offset:
        @intrinsic
        def copy_span(typingctx, dst, i, src, j, offset, nbytes):
            return typed(dst, i, src, j, offset, nbytes)

        return copy_span

    @intrinsic
    def copy_row(typingctx, dst, i, src, j, nbytes):
        return typed(dst, i, src, j, nbytes)

    return copy_row


#: bound by :func:`specialize`: whether the store is one array of rows (AoS) rather than a tuple
#: of them (SoA, spans), ``copy_field(src, idx, dst)``, ``dst[i] = src[idx[i]]`` for every i,
#: ``rows_of(src)``, the rows of one element of a tuple store, and ``base_of(src)``, the array
#: whose rows that element reads (what a prefetch of its rows names)
ONE_FIELD = False
copy_field = None
rows_of = None
base_of = None


def gather(store, idx, out):
    """Copy rows ``idx`` of ``store`` into ``out``.

    Parameters
    ----------
    store : ndarray of uint64, shape (capacity, words); or tuple of ndarray of uint8
        The record array viewed as 64-bit words (AoS), or byte views of the field arrays, each
        shape (capacity, field_bytes) (SoA).
    idx : ndarray of int64, shape (batch,)
        Row numbers, each in ``[0, capacity)`` (checked by the caller).
    out : same type as ``store``, at least ``batch`` rows
        Destination rows (for SoA, fields in the same order).
    """
    if ONE_FIELD:
        copy_field(store, idx, out)
    else:
        for f in range(len(store)):
            copy_field(store[f], idx, out[f])


def sample_uniform(store, n, state, idx, out):
    """Draw ``len(idx)`` uniform row numbers in ``[0, n)`` into ``idx`` and gather them into ``out``.

    Parameters
    ----------
    store
        As for :func:`gather`.
    n : int
        Number of valid rows, ``1 <= n <= capacity``.
    state : ndarray of uint64, shape (2,)
        Counter-based RNG state ``[key, counter]``; advanced in place.
    idx : ndarray of int64, shape (batch,)
        Output: the sampled row numbers.
    out
        As for :func:`gather`; output: the sampled rows.
    """
    fill_indices(n, state, idx)
    if ONE_FIELD:
        copy_field(store, idx, out)
    else:
        for f in range(len(store)):
            copy_field(store[f], idx, out[f])


def sample_prioritized(store, n, sums, mm, leaves, version, ring, state, beta, idx, u, weights,
                       versions, out):
    """Stratified proportional sample with importance weights, gathered into ``out``.

    Parameters
    ----------
    store
        As for :func:`gather`.
    n : int
        Number of live rows: every slot drawn is in ``[0, n)``.
    sums, mm, leaves : ndarray of float64, shape (2 * NB,); of float32, shape (2 * NB, 2); of float32, shape (P,)
        The priority tree (see ``tfdata.kernels._tree``).
    version : ndarray of uint8, shape (capacity,)
        Write count of every slot, modulo 256.
    ring : int
        Rows per lap of the ring (of a shard's): the epoch of the versions is
        ``sums[0] // ring`` modulo 2**24 (``tfdata.kernels._tree.epoch_stamp``).
    state : ndarray of uint64, shape (2,)
        Counter-based RNG state, advanced in place (one word per draw).
    beta : float
        Importance-sampling exponent.
    idx : ndarray of int64, shape (batch,)
        Output: sampled slots.
    u : ndarray of float64, shape (batch,)
        Scratch.
    weights : ndarray of float32, shape (batch,)
        Output: ``(p_min / p_i) ** beta``, so the largest possible weight is 1.
    versions : ndarray of uint32, shape (batch,)
        Output: ``epoch << 8 | version[idx]``, to detect stale priority updates.
    out
        As for :func:`gather`; output: the sampled rows.

    Returns
    -------
    int
        0; or -1, with nothing drawn or written, when the root mass is not finite and positive
        or there are no live rows (the caller raises). Whatever the trees hold, every slot
        drawn is in ``[0, min(n, capacity))``.
    """
    rows = version.shape[0]
    if ONE_FIELD:
        rows = min(rows, store.shape[0])
    else:
        for f in range(len(store)):
            rows = min(rows, rows_of(store[f]))
    limit = live_limit(sums, leaves, n, rows)
    if limit == 0:
        return -1
    stratified_find(sums, leaves, limit, state, idx, u)
    # the rows' and versions' lines requested before the weights' powers, so that their misses
    # overlap that arithmetic instead of following it
    for i in range(idx.shape[0]):
        j = idx[i]
        prefetch(version, j)
        if ONE_FIELD:
            prefetch_row(store, j)
        else:
            for f in range(len(store)):
                prefetch_row(base_of(store[f]), j)
    is_weights(mm, leaves, idx, beta, weights, u)
    stamp = epoch_stamp(sums, ring)
    for i in range(idx.shape[0]):
        versions[i] = stamp | np.uint32(version[idx[i]])
    if ONE_FIELD:
        copy_field(store, idx, out)
    else:
        for f in range(len(store)):
            copy_field(store[f], idx, out[f])
    return 0


def sample_shared(store, heads, reserved, cap, scratch, state, idx, out, max_redraws):
    """Uniform sample of complete rows from a shared buffer whose writers may be writing.

    Reads every shard's head once (acquire), draws like :func:`sample_uniform` over the rows the
    shards hold, copies the rows, then (after an acquire fence) reads each shard's reserve: a
    row whose slot a writer may have been writing during the copy is drawn again, alone, until
    one copies cleanly (see ``tfdata.kernels._shared``).

    Parameters
    ----------
    store
        As for :func:`gather`.
    heads, reserved : ndarray of uint64, shape (shards,)
        Strided views of the shards' control words.
    cap : int
        Slots per shard.
    scratch : ndarray of int64, shape (7 * shards + batch,)
    state : ndarray of uint64, shape (2,)
        Counter-based RNG state, advanced in place.
    idx : ndarray of int64, shape (batch,)
        Output: the slots sampled.
    out
        As for :func:`gather`; output: the rows.
    max_redraws : int
        Redraws allowed before giving up.

    Returns
    -------
    int
        Redraws made (>= 0); -1 if ``max_redraws`` ran out; -2 if the shards hold fewer rows
        than ``batch`` (nothing drawn).
    """
    n = heads.shape[0]
    total = snapshot_heads(heads, cap, scratch)
    batch = idx.shape[0]
    if total < batch:
        return -2
    mark = scratch[7 * n:]
    key = state[0]
    ctr = draw_slots(scratch, cap, total, total == n * cap, key, state[1], idx)
    if ONE_FIELD:
        copy_field(store, idx, out)
    else:
        for f in range(len(store)):
            copy_field(store[f], idx, out[f])
    fence_acquire()
    # judge every row against the heads read before the copy; then redraw the rejected ones
    # one at a time, each against heads read afresh (writers keep moving the window)
    m = windows(reserved, scratch, cap)
    rejected = 0
    for i in range(batch if m else 0):
        mark[i] = in_windows(scratch, n, m, idx[i])
        rejected += mark[i]
    redraws = 0
    i = 0
    while rejected:
        while mark[i] == 0:
            i += 1
        while True:
            if redraws == max_redraws:
                state[1] = ctr
                return -1
            redraws += 1
            total = snapshot_heads(heads, cap, scratch)
            nn = np.uint64(total)
            idx[i], ctr = draw_slot(scratch, cap, total, total == n * cap, (_TWO32 - nn) % nn, key, ctr)
            if ONE_FIELD:
                copy_field(store, idx[i:i + 1], out[i:i + 1])
            else:
                for f in range(len(store)):
                    copy_field(store[f], idx[i:i + 1], out[f][i:i + 1])
            fence_acquire()
            if not in_windows(scratch, n, windows(reserved, scratch, cap), idx[i]):
                mark[i] = 0
                break
        rejected -= 1
    state[1] = ctr
    return redraws


def sample_pool(store, pool, inpool, meta, start, count, n, state, idx, out):
    """Draw ``len(idx)`` slots without replacement (``tfdata.kernels._pool.pool_draw``: the
    slots written since the last call join the pass first) and gather them into ``out``.

    Returns what ``pool_draw`` returns: the passes completed, or -1 / -2 (nothing gathered).
    """
    got = pool_draw(pool, inpool, meta, start, count, n, state, idx)
    if got < 0:
        return got
    if ONE_FIELD:
        copy_field(store, idx, out)
    else:
        for f in range(len(store)):
            copy_field(store[f], idx, out[f])
    return got


def sample_exactly_k(store, pool, remaining, meta, state, idx, out):
    """Draw ``len(idx)`` distinct slots awaiting replay (``tfdata.kernels._replays.replays_draw``:
    each drawn slot's count of deliveries left goes down by one, those at 0 are freed) and gather
    them into ``out``.

    Returns what ``replays_draw`` returns: the rows freed, or -1 / -2 (nothing gathered).
    """
    got = replays_draw(pool, remaining, meta, state, idx)
    if got < 0:
        return got
    if ONE_FIELD:
        copy_field(store, idx, out)
    else:
        for f in range(len(store)):
            copy_field(store[f], idx, out[f])
    return got


KERNELS = (gather, sample_uniform, sample_prioritized, sample_shared, sample_pool, sample_exactly_k)


@njit(**INLINE_OPTIONS)
def array_rows(src):
    """Rows of one array of a tuple store (SoA): the ``rows_of`` of :func:`specialize`'s default."""
    return src.shape[0]


@njit(**INLINE_OPTIONS)
def array_base(src):
    """The array whose rows one element of a tuple store reads (SoA: itself): the ``base_of``
    of :func:`specialize`'s default."""
    return src


def specialize(layout: str, one_field: bool, copy, rows=array_rows, base=array_base) -> tuple:
    """The kernels of :data:`KERNELS` for one layout, in that order, as cached numba kernels
    whose ``ONE_FIELD`` is ``one_field``, whose ``copy_field`` is ``copy``, whose ``rows_of``
    is ``rows`` and whose ``base_of`` is ``base``."""
    env = dict(globals(), ONE_FIELD=one_field, copy_field=copy, rows_of=rows, base_of=base)
    kernels = []
    for template in KERNELS:
        fn = FunctionType(template.__code__, env, template.__name__, template.__defaults__)
        fn.__qualname__ = f"{layout}.{template.__name__}"  # names the cache entry
        fn.__module__ = f"{__package__}.{layout}"
        fn.__doc__ = template.__doc__
        kernels.append(njit(**NJIT_OPTIONS)(fn))
    return tuple(kernels)
