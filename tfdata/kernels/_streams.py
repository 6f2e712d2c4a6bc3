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
    ``int64[2 + 7 * S + B]`` ``[S, cap, snapshot...]``, the snapshot of
    :func:`tfdata.kernels._shared.snapshot_heads` from word 2 on (``geo[2 + S + s]``: shard
    ``s``'s head). A slice stays in its start's episode until a row is terminated or truncated.

The *age* of a slot is how many rows of its stream are newer, so a forward window from a slot
may take ``age + 1`` rows without reaching rows not written yet (or, after a wrap, older ones).

The kernels below (:data:`TEMPLATES`) are templates, never called as they are: they call the
geometry functions ``prepare``, ``next_row``, ``is_newest``, ``age``, ``in_episode``,
``fits_episode``, ``held``, ``draw_start`` and ``live_rows``, which this module leaves unbound;
:func:`specialize` binds one kind's (``ring_*`` or ``shard_*``) and returns its kernels, as
:func:`tfdata.kernels._sample.specialize` does per layout. So both kinds have one algorithm and
the same signatures (``episode`` unused by shards, ``term``/``trunc`` by the ring's slices), and
each compiles to the machine code of a hand-written kernel of its geometry. Every slot read
stays in ``[0, C)`` (ring) or in its shard (shards), whatever the geometry words hold.
"""

from __future__ import annotations

from types import FunctionType, SimpleNamespace

import numpy as np
from numba import njit

from .._config import INLINE_OPTIONS, NJIT_OPTIONS
from ._rng import fill_indices
from ._shared import draw_slot
from ._tree import is_weight, live_limit, stratified_find

_TWO32 = np.uint64(1 << 32)
#: words of a shard geometry before its heads snapshot
SHARD_HEADER = 2


# -- the ring: E interleaved streams ---------------------------------------------------------
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
def ring_next_row(g, j):
    """The next row of slot ``j``'s stream."""
    j += g[0]
    if j >= g[1]:
        j -= g[1]
    return j


@njit(**INLINE_OPTIONS)
def ring_is_newest(g, j):
    """Whether slot ``j`` holds its stream's newest row (a slot range: no division)."""
    return g[2] <= j and j < g[3]


@njit(**INLINE_OPTIONS)
def ring_age(g, j):
    """Rows newer than slot ``j`` in its stream (0 for the newest)."""
    d = g[2] - (j - j % g[0])
    if d < 0:
        d += g[1]
    return d // g[0]


@njit(**INLINE_OPTIONS)
def ring_in_episode(g, s, prev, j, episode, term, trunc):
    """Whether slot ``j`` (after ``prev``) is in the episode of the slice start ``s``."""
    return episode[j] == episode[s]


@njit(**INLINE_OPTIONS)
def ring_fits_episode(g, s, length, episode, term, trunc):
    """Whether the ``length`` rows from ``s`` (written: the caller checked its age) are in one
    episode: O(1), the episode numbers of the first and last rows."""
    end = (s + (length - 1) * g[0]) % g[1]
    return episode[end] == episode[s]


@njit(**INLINE_OPTIONS)
def ring_held(g, n_rows):
    """Rows a start is drawn from: the ``n_rows`` held (``[0, n_rows)``)."""
    return n_rows


@njit(**INLINE_OPTIONS)
def ring_draw_start(g, total, state, one):
    """One uniform start into ``one[0]`` (as a batch of one row draws it)."""
    fill_indices(total, state, one)


@njit(**INLINE_OPTIONS)
def ring_live_rows(g, n_rows, version, episode):
    """``(n, rows)`` of :func:`tfdata.kernels._tree.live_limit` for a prioritized start."""
    return n_rows, min(version.shape[0], episode.shape[0], g[1])


# -- shards: one stream per shard, as of a heads snapshot ------------------------------------
@njit(**INLINE_OPTIONS)
def shard_prepare(geo):
    """``(S, cap, geo)`` from ``[S, cap, snapshot...]``."""
    return geo[0], geo[1], geo


@njit(**INLINE_OPTIONS)
def _shard_head(g, s):
    """Shard ``s``'s head as read (0 for a shard the words do not describe)."""
    shards, geo = g[0], g[2]
    at = SHARD_HEADER + shards + s
    return geo[at] if s < shards and at < geo.shape[0] else 0


@njit(**INLINE_OPTIONS)
def shard_next_row(g, j):
    cap = g[1]
    base = (j // cap) * cap
    j += 1
    if j == base + cap:
        j = base
    return j


@njit(**INLINE_OPTIONS)
def shard_is_newest(g, j):
    cap = g[1]
    s = j // cap
    return j == s * cap + (_shard_head(g, s) - 1) % cap


@njit(**INLINE_OPTIONS)
def shard_age(g, j):
    """Rows newer than slot ``j`` in its shard (-1: the shard holds none)."""
    cap = g[1]
    s = j // cap
    h = _shard_head(g, s)
    if h <= 0:
        return -1
    return (s * cap + (h - 1) % cap - j) % cap


@njit(**INLINE_OPTIONS)
def shard_in_episode(g, s, prev, j, episode, term, trunc):
    """Row ``j`` is in the start's episode unless the row before it (``prev``) ended one."""
    return j == s or not (term[prev] or trunc[prev])


@njit(**INLINE_OPTIONS)
def shard_fits_episode(g, s, length, episode, term, trunc):
    """No row of the ``length`` from ``s`` but the last ends an episode (a scan of the flags)."""
    j = s
    for _ in range(length - 1):
        if term[j] or trunc[j]:
            return False
        j = shard_next_row(g, j)
    return True


@njit(**INLINE_OPTIONS)
def shard_held(g, n_rows):
    """Rows the shards held at the snapshot (``n_rows`` unused)."""
    total = 0
    geo = g[2]
    for s in range(g[0]):
        total += geo[SHARD_HEADER + s]
    return total


@njit(**INLINE_OPTIONS)
def shard_draw_start(g, total, state, one):
    """One uniform start over the rows held, numbered shard by shard (with one shard, the
    words of the generator a ring of one stream draws)."""
    nn = np.uint64(total)
    threshold = (_TWO32 - nn) % nn
    one[0], state[1] = draw_slot(g[2][SHARD_HEADER:], g[1], total, total == g[0] * g[1],
                                 threshold, state[0], state[1])


@njit(**INLINE_OPTIONS)
def shard_live_rows(g, n_rows, version, episode):
    return version.shape[0], version.shape[0]


# -- the templates ----------------------------------------------------------------------------
#: bound by :func:`specialize` to one kind's functions above
prepare = next_row = is_newest = age = in_episode = fits_episode = None
held = draw_start = live_rows = None


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
            if term[j] or trunc[j] or k == n - 1 or is_newest(g, j):
                discount[i] = wn
            else:
                last[i] = next_row(g, j)
        w = wn
    for i in range(batch):
        j = last[i]
        ret[i] = acc[i]
        term_out[i] = term[j]
        trunc_out[i] = trunc[j]


def _fits(g, s, length, episode, term, trunc):
    """Whether the ``length`` rows of ``s``'s stream from ``s`` on are written and in ``s``'s
    episode."""
    if age(g, s) < length - 1:
        return False
    return fits_episode(g, s, length, episode, term, trunc)


def _fill(g, s, b, episode, term, trunc, idx, mask):
    """Slice ``b`` from start ``s``: rows of its stream while they are written and in its
    episode; the rest repeat the last valid row, masked False."""
    length = idx.shape[1]
    kmax = min(length, age(g, s) + 1)
    j = s
    last = s
    for k in range(length):
        if k < kmax and in_episode(g, s, last, j, episode, term, trunc):
            idx[b, k] = j
            mask[b, k] = True
            last = j
            j = next_row(g, j)
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
    total = held(g, n_rows)
    if total <= 0:
        return -2
    length = idx.shape[1]
    for b in range(idx.shape[0]):
        one = idx[b, :1]  # one draw at a time: a rejected start draws again
        draw_start(g, total, state, one)
        if reject:
            tries = 1
            while not _fits(g, one[0], length, episode, term, trunc):
                if tries >= max_draws:
                    return b
                draw_start(g, total, state, one)
                tries += 1
        _fill(g, one[0], b, episode, term, trunc, idx, mask)
    return -1


def slices_prioritized(geo, n_rows, sums, mm, leaves, version, state, beta, episode, term, trunc,
                       reject, max_draws, idx, mask, u, weights, versions):
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
    state : ndarray of uint64, shape (2,)
    beta : float
    u : ndarray of float64, shape (B,)
        Scratch.
    weights : ndarray of float32, shape (B,)
    versions : ndarray of uint32, shape (B,)
        Output: ``version[start]`` (the caller adds its epoch).

    Returns
    -------
    int
        -1 on success; ``b`` when ``max_draws`` draws found no start for slice ``b``; -2, with
        nothing drawn, when the root mass is not finite and positive or no row is live.
    """
    g = prepare(geo)
    n, rows = live_rows(g, n_rows, version, episode)
    limit = live_limit(sums, leaves, n, rows)
    if limit == 0:
        return -2
    length = idx.shape[1]
    stratified_find(sums, leaves, limit, state, idx[:, 0], u)
    for b in range(idx.shape[0]):
        one = idx[b, :1]  # a redraw lands where slice b starts anyway
        if reject:
            tries = 1
            while not _fits(g, one[0], length, episode, term, trunc):
                if tries >= max_draws:
                    return b
                stratified_find(sums, leaves, limit, state, one, u[:1])
                tries += 1
        _fill(g, one[0], b, episode, term, trunc, idx, mask)
    for b in range(idx.shape[0]):
        s = idx[b, 0]
        weights[b] = is_weight(mm, leaves, s, beta)
        versions[b] = version[s]
    return -1


#: the kernels of one kind, in the order :func:`specialize` returns them
TEMPLATES = (nstep, slices, slices_prioritized)
#: inline templates, bound first (the kernels call them)
_HELPERS = (_fits, _fill)
_GEOMETRY = ("prepare", "next_row", "is_newest", "age", "in_episode", "fits_episode", "held",
             "draw_start", "live_rows")


def specialize(kind: str, prefix: str) -> SimpleNamespace:
    """The kernels of :data:`TEMPLATES` for one kind of streams, as cached numba kernels whose
    geometry functions are this module's ``<prefix>_<name>``; also ``fill`` (the inline slice
    fill, for other samplers' kernels). Attributes ``nstep``, ``slices``,
    ``slices_prioritized``, ``fill``, ``prepare``."""
    env = dict(globals())
    for name in _GEOMETRY:
        env[name] = env[f"{prefix}_{name}"]

    def made(template, options):
        fn = FunctionType(template.__code__, env, template.__name__, template.__defaults__)
        fn.__qualname__ = f"{kind}.{template.__name__}"  # names the cache entry
        fn.__doc__ = template.__doc__
        return njit(**options)(fn)

    for template in _HELPERS:
        env[template.__name__] = made(template, INLINE_OPTIONS)
    kernels = {t.__name__: made(t, NJIT_OPTIONS) for t in TEMPLATES}
    return SimpleNamespace(kind=kind, fill=env["_fill"], prepare=env["prepare"], **kernels)


#: the kernels of a ring of interleaved streams, and of shards of streams
RING = specialize("ring", "ring")
SHARDS = specialize("shards", "shard")
#: the ring's inline slice fill (a module global: kernels cannot read a namespace's attribute)
ring_fill = RING.fill
