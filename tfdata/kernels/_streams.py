"""Where a stream's rows are, and which are valid: n-step windows and sequence slices written
once, specialized per kind of streams.

A buffer's rows form streams (one environment's, or one writer's, steps in order). Two kinds:

*ring*
    ``E`` environments interleaved in one ring of ``C`` slots (``C`` a multiple of ``E``):
    environment ``e``'s step ``t`` is in slot ``(t * E + e) % C``, the next row of a slot is
    ``slot + E`` (mod ``C``), and the newest step holds the ``E`` slots before the write cursor.
    Geometry: ``int64[3]`` ``[cursor, E, C]``. A slice stays in its start's episode by the
    episode numbers stamped at insert (one comparison).
*shards*
    One stream per shard of a shared region, ``cap`` slots each: the next row of slot ``j`` of
    shard ``s = j // cap`` is ``j + 1`` within ``[s * cap, (s + 1) * cap)`` (wrapping), and the
    newest is the one before the shard's head as read in a heads snapshot. Geometry:
    ``int64[2 + 7 * S]`` ``[S, cap, snapshot...]``, the snapshot of
    :func:`tfdata.kernels._shared.snapshot_heads` from word 2 on (``geo[2 + S + s]``: shard
    ``s``'s head). A slice stays in its start's episode until a row is terminated or truncated.

The *age* of a slot is how many rows of its stream are newer, so a forward window from a slot
may take ``age + 1`` rows without reaching rows not written yet (or, after a wrap, older ones).

The kernels below (:data:`TEMPLATES`) are templates, never called as they are: they call the
geometry functions ``prepare``, ``stream_of``, ``next_row``, ``is_newest``, ``age``,
``row_after``, ``held``, ``draw_start`` and ``live_rows`` and read the constant
``EPISODE_NUMBERS``, names this module leaves unbound; :func:`specialize` binds one kind's
(``ring_*`` or ``shard_*``) and returns its kernels, as :func:`tfdata.kernels._sample.specialize`
does per layout. So both kinds have one algorithm and the same signatures (``episode`` unused by
shards, ``term``/``trunc`` by the ring's slices), and each compiles to the machine code of a
hand-written kernel of its geometry. Every slot read stays in ``[0, C)`` (ring) or in its shard
(shards), whatever the geometry words hold.
"""

from __future__ import annotations

from types import FunctionType, SimpleNamespace

import numpy as np
from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._rng import draw_one
from ._tree import epoch_stamp, is_weight, live_limit, stratified_find

_TWO32 = np.uint64(1 << 32)
#: words of a shard geometry before its heads snapshot
SHARD_HEADER = 2


# -- the ring: E interleaved streams ---------------------------------------------------------
# Every geometry function takes the geometry words ``geo`` and ``g``, what ``prepare`` made of
# them once per kernel call (integers only: a tuple holding an array would count references
# at every call).
@njit(**INLINE_OPTIONS)
def ring_geometry(cursor, num_envs, capacity):
    """``(E, C, lo, hi)``: the newest step is slots ``[lo, hi)``."""
    lo = cursor - num_envs
    if lo < 0:
        lo += capacity
    return num_envs, capacity, lo, lo + num_envs


@njit(**INLINE_OPTIONS)
def ring_prepare(geo):
    """:func:`ring_geometry` of ``[cursor, E, C]``."""
    return ring_geometry(geo[0], geo[1], geo[2])


@njit(**INLINE_OPTIONS)
def ring_stream_of(geo, g, j):
    """What :func:`ring_next_row` needs to know of slot ``j``'s stream: nothing."""
    return 0


@njit(**INLINE_OPTIONS)
def ring_next_row(geo, g, c, j):
    """The next row of slot ``j``'s stream (``c``: :func:`ring_stream_of` it)."""
    j += g[0]
    if j >= g[1]:
        j -= g[1]
    return j


@njit(**INLINE_OPTIONS)
def ring_is_newest(geo, g, j):
    """Whether slot ``j`` holds its stream's newest row (a slot range: no division)."""
    return g[2] <= j and j < g[3]


@njit(**INLINE_OPTIONS)
def ring_age(geo, g, j):
    """Rows newer than slot ``j`` in its stream (0 for the newest)."""
    d = g[2] - (j - j % g[0])
    if d < 0:
        d += g[1]
    return d // g[0]


@njit(**INLINE_OPTIONS)
def ring_row_after(geo, g, j, k):
    """The slot ``k`` rows after slot ``j`` in its stream (``k`` at most its age)."""
    return (j + k * g[0]) % g[1]


@njit(**INLINE_OPTIONS)
def ring_held(geo, g, n_rows):
    """Rows a start is drawn from: the ``n_rows`` held (``[0, n_rows)``)."""
    return n_rows


@njit(**INLINE_OPTIONS)
def ring_draw_start(geo, g, total, threshold, state):
    """One uniform start in ``[0, total)`` (the words a batch of one row draws); advances
    ``state``."""
    s, state[1] = draw_one(np.uint64(total), threshold, state[0], state[1])
    return s


@njit(**INLINE_OPTIONS)
def ring_live_rows(geo, g, n_rows, version, episode):
    """``(n, rows)`` of :func:`tfdata.kernels._tree.live_limit` for a prioritized start."""
    return n_rows, min(version.shape[0], episode.shape[0], g[1])


# -- shards: one stream per shard, as of a heads snapshot ------------------------------------
@njit(**INLINE_OPTIONS)
def shard_prepare(geo):
    """``(S, cap)`` from ``[S, cap, snapshot...]``."""
    return geo[0], geo[1]


# (no shard function calls another with an array: each array handed to an inline function
# costs reference counts)
@njit(**INLINE_OPTIONS)
def shard_stream_of(geo, g, j):
    """The first slot of slot ``j``'s shard (a division: once per window or slice)."""
    return (j // g[1]) * g[1]


@njit(**INLINE_OPTIONS)
def shard_next_row(geo, g, c, j):
    j += 1
    if j == c + g[1]:
        j = c
    return j


@njit(**INLINE_OPTIONS)
def shard_is_newest(geo, g, j):
    shards, cap = g
    s = j // cap
    at = SHARD_HEADER + shards + s  # shard s's head as read (0 where the words say nothing)
    h = geo[at] if s < shards and at < geo.shape[0] else 0
    return j == s * cap + (h - 1) % cap


@njit(**INLINE_OPTIONS)
def shard_age(geo, g, j):
    """Rows newer than slot ``j`` in its shard (-1: the shard holds none)."""
    shards, cap = g
    s = j // cap
    at = SHARD_HEADER + shards + s
    h = geo[at] if s < shards and at < geo.shape[0] else 0
    if h <= 0:
        return -1
    return (s * cap + (h - 1) % cap - j) % cap


@njit(**INLINE_OPTIONS)
def shard_row_after(geo, g, j, k):
    cap = g[1]
    base = (j // cap) * cap
    return base + (j - base + k) % cap


@njit(**INLINE_OPTIONS)
def shard_held(geo, g, n_rows):
    """Rows the shards held at the snapshot (``n_rows`` unused)."""
    total = 0
    for s in range(min(g[0], geo.shape[0] - SHARD_HEADER)):
        total += geo[SHARD_HEADER + s]
    return total


@njit(**INLINE_OPTIONS)
def shard_draw_start(geo, g, total, threshold, state):
    """One uniform start over the ``total`` rows held, numbered shard by shard (the slot itself
    when every shard is full; with one shard, the words a ring of one stream draws)."""
    u, state[1] = draw_one(np.uint64(total), threshold, state[0], state[1])
    if total == g[0] * g[1]:
        return u
    s = 0
    while u >= geo[SHARD_HEADER + s]:
        u -= geo[SHARD_HEADER + s]
        s += 1
    return s * g[1] + u


@njit(**INLINE_OPTIONS)
def shard_live_rows(geo, g, n_rows, version, episode):
    return version.shape[0], version.shape[0]


# -- the templates ----------------------------------------------------------------------------
#: bound by :func:`specialize` to one kind's functions above, and whether the kind ends an
#: episode by its episode numbers (ring) or by the flags of the rows (shards): a constant, so
#: numba prunes the other branch before typing (as ``ONE_FIELD`` in :mod:`._sample`); a test
#: of the flags in a function of its own would be handed the flag arrays at every row, which
#: costs reference counts
prepare = stream_of = next_row = is_newest = age = row_after = held = draw_start = None
live_rows = None
EPISODE_NUMBERS = True


def nstep(geo, idx, n, gamma, reward, term, trunc, acc, ret, term_out, trunc_out, discount, last):
    """Discounted n-step returns of the windows that start at ``idx``, written into a batch.

    A window takes rows ``t, t+1, ...`` of the start row's stream and stops after ``n`` rows, at
    the first row that is terminated or truncated (included), or at its stream's newest row,
    whichever comes first; ``k`` is the number of rows taken (``1 <= k <= n``).

    Parameters
    ----------
    geo : ndarray of int64
        The streams' geometry (see the module).
    idx : ndarray of int64, shape (B,)
        Start slots (held rows).
    n : int
        Longest window.
    gamma : float
        Discount per step.
    reward : ndarray, shape (slots,), any numeric dtype, any stride
    term, trunc : ndarray of bool, shape (slots,), any stride
        Row fields.
    acc : ndarray of float64, shape (B,)
        Scratch: ``sum_{j<k} gamma**j * reward[t+j]``, accumulated in order of j.
    ret, term_out, trunc_out : ndarray, shape (B,), any stride
        Output: the return (cast to the reward dtype) and the flags of each window's last row.
    discount : ndarray of float32, shape (B,)
        Output: ``gamma**k``, the factor of the bootstrap value (use it with ``1 - terminated``).
    last : ndarray of int64, shape (B,)
        Output: slot of each window's last row (its next observation is the bootstrap one).
    """
    g = prepare(geo)
    batch = idx.shape[0]
    for i in range(batch):
        acc[i] = 0.0
        last[i] = idx[i]
        discount[i] = -1.0  # open window
    # step by step over all windows, not window by window: the loads of different windows are
    # independent, so their cache misses overlap
    w = 1.0
    for k in range(n):
        wn = w * gamma
        for i in range(batch):
            if discount[i] >= 0.0:
                continue
            j = last[i]
            acc[i] += w * np.float64(reward[j])
            if term[j] or trunc[j] or k == n - 1 or is_newest(geo, g, j):
                discount[i] = wn
            else:
                last[i] = next_row(geo, g, stream_of(geo, g, j), j)
        w = wn
    for i in range(batch):
        j = last[i]
        ret[i] = acc[i]
        term_out[i] = term[j]
        trunc_out[i] = trunc[j]


def _fits(geo, g, s, length, episode, term, trunc):
    """Whether the ``length`` rows of ``s``'s stream from ``s`` on are written and in ``s``'s
    episode: the age of ``s``, then the episode numbers of the first and last rows (O(1)), or
    the flags of every row but the last."""
    if age(geo, g, s) < length - 1:
        return False
    if EPISODE_NUMBERS:
        return episode[row_after(geo, g, s, length - 1)] == episode[s]
    c = stream_of(geo, g, s)
    j = s
    for _ in range(length - 1):
        if term[j] or trunc[j]:
            return False
        j = next_row(geo, g, c, j)
    return True


def _fill(geo, g, s, b, episode, term, trunc, idx, mask):
    """Slice ``b`` from start ``s``: rows of its stream while they are written and in its
    episode; the rest repeat the last valid row, masked False."""
    length = idx.shape[1]
    kmax = min(length, age(geo, g, s) + 1)
    ep = 0
    if EPISODE_NUMBERS:
        ep = episode[s]
    ended = False  # (flags) the row before ended an episode
    c = stream_of(geo, g, s)
    j = s
    last = s
    for k in range(length):
        if EPISODE_NUMBERS:
            ok = k < kmax and episode[j] == ep
        else:
            ok = k < kmax and not ended
        if ok:
            idx[b, k] = j
            mask[b, k] = True
            last = j
            if not EPISODE_NUMBERS:
                ended = term[j] or trunc[j]
            j = next_row(geo, g, c, j)
        else:
            idx[b, k] = last
            mask[b, k] = False
            kmax = 0  # every later row is masked too


def slices(geo, n_rows, state, episode, term, trunc, reject, max_draws, idx, mask):
    """Draw ``B`` slices of ``L`` consecutive rows of one stream within one episode, starts
    uniform over the rows held.

    Parameters
    ----------
    geo : ndarray of int64
        The streams' geometry (see the module).
    n_rows : int
        Ring: rows held (starts are drawn from ``[0, n_rows)``); shards: unused (the snapshot
        says what each shard holds).
    state : ndarray of uint64, shape (2,)
        Counter-based RNG state, advanced in place.
    episode : ndarray of uint32, shape (slots,)
        Ring: every slot's episode number within its stream (stamped at insert).
    term, trunc : ndarray of bool, shape (slots,), any stride
        Shards: the row flags (a flagged row is its episode's last).
    reject : bool
        True: redraw starts until the whole slice is written and in one episode. False: keep
        the first start; rows past the episode's end or the newest row repeat the last valid
        row and get ``mask == False``.
    max_draws : int
        With ``reject``, the most draws per slice before giving up.
    idx : ndarray of int64, shape (B, L)
        Output: slots of the slice rows.
    mask : ndarray of bool, shape (B, L)
        Output: True where the row belongs to the slice's episode.

    Returns
    -------
    int
        -1 on success; ``b`` when ``max_draws`` draws found no start for slice ``b``; -2, with
        nothing drawn, when no row is held.
    """
    g = prepare(geo)
    total = held(geo, g, n_rows)
    if total <= 0:
        return -2
    nn = np.uint64(total)
    threshold = (_TWO32 - nn) % nn  # of Lemire's draw, once (the bound does not change)
    length = idx.shape[1]
    for b in range(idx.shape[0]):
        s = draw_start(geo, g, total, threshold, state)
        if reject:  # a rejected start draws again
            tries = 1
            while not _fits(geo, g, s, length, episode, term, trunc):
                if tries >= max_draws:
                    return b
                s = draw_start(geo, g, total, threshold, state)
                tries += 1
        _fill(geo, g, s, b, episode, term, trunc, idx, mask)
    return -1


def slices_prioritized(geo, n_rows, sums, mm, leaves, version, ring, state, beta, episode, term,
                       trunc, reject, max_draws, idx, mask, u, weights, versions):
    """:func:`slices` with starts drawn in proportion to their priority.

    Starts are drawn as :func:`tfdata.kernels.aos.sample_prioritized` draws rows: stratified,
    one per ``1/B`` of the total mass. With ``reject`` a start whose slice does not fit is
    replaced by a fresh proportional draw over the whole mass, up to ``max_draws`` draws.
    ``weights[b] = (p_min / p_start) ** beta`` and ``versions[b] = version[start]``, the start
    row being the one whose priority drew the slice.

    Parameters
    ----------
    geo, n_rows, episode, term, trunc, reject, max_draws, idx, mask
        As for :func:`slices` (``n_rows``: ring, the live rows).
    sums, mm, leaves
        The priority tree (see :mod:`tfdata.kernels._tree`).
    version : ndarray of uint8, shape (slots,)
    ring : int
        Rows per lap of the ring (of a shard's): the epoch is ``sums[0] // ring`` modulo 2**24
        (:func:`tfdata.kernels._tree.epoch_stamp`).
    state : ndarray of uint64, shape (2,)
    beta : float
    u : ndarray of float64, shape (B,)
        Scratch.
    weights : ndarray of float32, shape (B,)
    versions : ndarray of uint32, shape (B,)
        Output: ``epoch << 8 | version[start]``.

    Returns
    -------
    int
        -1 on success; ``b`` when ``max_draws`` draws found no start for slice ``b``; -2, with
        nothing drawn, when the root mass is not finite and positive or no row is live.
    """
    g = prepare(geo)
    n, rows = live_rows(geo, g, n_rows, version, episode)
    limit = live_limit(sums, leaves, n, rows)
    if limit == 0:
        return -2
    length = idx.shape[1]
    stratified_find(sums, leaves, limit, state, idx[:, 0], u)
    for b in range(idx.shape[0]):
        s = idx[b, 0]
        if reject:
            tries = 1
            while not _fits(geo, g, s, length, episode, term, trunc):
                if tries >= max_draws:
                    return b
                one = idx[b, :1]  # a redraw lands where slice b starts anyway
                stratified_find(sums, leaves, limit, state, one, u[:1])
                s = one[0]
                tries += 1
        _fill(geo, g, s, b, episode, term, trunc, idx, mask)
    stamp = epoch_stamp(sums, ring)
    for b in range(idx.shape[0]):
        s = idx[b, 0]
        weights[b] = is_weight(mm, leaves, s, beta)
        versions[b] = stamp | np.uint32(version[s])
    return -1


#: the arguments of :func:`nstep` of any stride (reward, flags; return and flags out): callers
#: take the kernel through :func:`tfdata.kernels.strided` with these, so one specialization
#: serves columns, records and scratch alike
NSTEP_STRIDED = (4, 5, 6, 8, 9, 10)
#: the kernels of one kind, in the order :func:`specialize` returns them
TEMPLATES = (nstep, slices, slices_prioritized)
#: inline templates, bound first (the kernels call them; ``_fill`` is other kernels' too)
_HELPERS = (_fits, _fill)
_GEOMETRY = ("prepare", "stream_of", "next_row", "is_newest", "age", "row_after", "held",
             "draw_start", "live_rows")


def specialize(kind: str, prefix: str) -> SimpleNamespace:
    """The kernels of :data:`TEMPLATES` for one kind of streams, as cached numba kernels whose
    geometry functions are this module's ``<prefix>_<name>``; also ``fill`` (the inline slice
    fill, for other samplers' kernels). Attributes ``nstep``, ``slices``,
    ``slices_prioritized``, ``fill``, ``prepare``."""
    env = dict(globals(), EPISODE_NUMBERS=kind == "ring")
    for name in _GEOMETRY:
        env[name] = env[f"{prefix}_{name}"]
    kernels = bind(kind, env, TEMPLATES, _HELPERS)
    return SimpleNamespace(kind=kind, fill=env["_fill"], prepare=env["prepare"], **kernels)


def bind(kind: str, env: dict, templates, helpers) -> dict:
    """Compile ``templates`` against the globals ``env`` (one kind's geometry functions bound
    in it): first each of ``helpers`` as an inline function put into ``env``, then each
    template as a cached kernel named ``<kind>.<name>`` (the name of its cache entry).
    Returns ``{template name: kernel}``."""

    def made(template, options):
        fn = FunctionType(template.__code__, env, template.__name__, template.__defaults__)
        fn.__qualname__ = f"{kind}.{template.__name__}"
        fn.__doc__ = template.__doc__
        return njit(**options)(fn)

    for template in helpers:
        env[template.__name__] = made(template, INLINE_OPTIONS)
    return {t.__name__: made(t, NJIT_OPTIONS) for t in templates}


#: the kernels of a ring of interleaved streams, and of shards of streams
RING = specialize("ring", "ring")
SHARDS = specialize("shards", "shard")
#: the ring's inline slice fill (a module global: kernels cannot read a namespace's attribute)
ring_fill = RING.fill
