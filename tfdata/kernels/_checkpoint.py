"""Consistency checks of a loaded checkpoint's episode bookkeeping against its rows.

One pass over the rows, no temporaries: a check of a million rows costs about a millisecond,
whatever the layout (the flags may be strided views of AoS records). Nothing is written.
References: ``episode_break_naive`` and ``final_mismatch_naive`` in ``tests/naive.py``.
"""

from __future__ import annotations

from numba import njit

from .._config import NJIT_OPTIONS

_MASK32 = 0xFFFFFFFF


@njit(**NJIT_OPTIONS)
def _mismatch(episode, term, trunc, a, b, shift):
    """Non-zero if some slot ``s`` in ``[a, b)`` has ``episode[s + shift] - episode[s]`` (mod
    2**32) different from its row's end (0 or 1). No early exit: the loop vectorises."""
    if a >= b:
        return 0
    # slices and indices from 0: no negative-index handling in the loop, so it vectorises
    nxt, cur = episode[a + shift:b + shift], episode[a:b]
    t, u = term[a:b], trunc[a:b]
    acc = 0
    for i in range(b - a):
        grow = (int(nxt[i]) - int(cur[i])) & _MASK32
        acc |= grow ^ int(t[i] | u[i])
    return acc


@njit(**NJIT_OPTIONS)
def episode_mismatch(episode, term, trunc, start, stop, cursor, size, capacity, num_envs):
    """Non-zero if a slot ``s`` in ``[start, stop)`` (a held slot, not of the newest step) has a
    successor whose episode number disagrees with its row's end (see
    :func:`first_episode_break`); 0 otherwise. For a check chunk by chunk, right after each
    chunk of rows was written (its flags are still in cache)."""
    E = num_envs
    stop = min(stop, size)
    newest = (cursor - E) % capacity if size == capacity else size - E
    acc = 0
    # [start, stop) without the newest step, split where the successor wraps (s >= capacity - E)
    for a, b in ((start, min(stop, newest)), (max(start, newest + E), stop)):
        if a >= b:
            continue
        mid = min(max(a, capacity - E), b)
        acc |= _mismatch(episode, term, trunc, a, mid, E)
        acc |= _mismatch(episode, term, trunc, mid, b, E - capacity)
    return acc


@njit(**NJIT_OPTIONS)
def final_mismatch_from(final_slots, term, trunc, start, stop, pos):
    """:func:`first_final_mismatch` for slots ``[start, stop)`` only, continuing at position
    ``pos`` of ``final_slots``: returns the position after them, or ``-1 - p`` for a
    disagreement at position ``p``. Chunks must come in order from slot 0."""
    k = final_slots.shape[0]
    for s in range(start, stop):
        if term[s] or trunc[s]:
            if pos >= k or final_slots[pos] != s:
                return -1 - pos
            pos += 1
    return pos


@njit(**NJIT_OPTIONS)
def first_episode_break(episode, current, term, trunc, cursor, size, capacity, num_envs):
    """Where a ring's episode numbers disagree with its rows' episode ends, or -1.

    A row gets its stream's current number at insert, and a row that is terminated or truncated
    makes the stream's next number one larger (modulo 2**32). So, walking each stream in time
    order (from the oldest step: slot ``cursor`` once the ring is full, else slot 0), the next
    row's number minus this row's is 1 if this row ended an episode and 0 otherwise, and
    ``current[e]`` is the newest row's number plus its end. An empty ring has ``current == 0``.

    Parameters
    ----------
    episode : ndarray of uint32, shape (size,)
    current : ndarray of uint32, shape (num_envs,)
    term, trunc : ndarray of bool, shape (>= size,), any stride
    cursor, size, capacity, num_envs : int
        The writer's state; ``size`` and ``cursor`` multiples of ``num_envs`` (checked before).

    Returns
    -------
    int
        -1 if consistent; else the slot whose successor's number is wrong, or
        ``capacity + e`` if ``current[e]`` is.
    """
    if size == 0:
        for e in range(num_envs):
            if current[e] != 0:
                return capacity + e
        return -1
    # a branch-free pass first (the successor of slot s is s + num_envs, mod capacity, except
    # for the newest step); the ordered walk below finds the slot only if something is wrong
    E = num_envs
    if size < capacity:
        acc = _mismatch(episode, term, trunc, 0, size - E, E)
    else:
        newest = cursor - E if cursor >= E else capacity - E
        if newest < capacity - E:
            acc = (_mismatch(episode, term, trunc, 0, newest, E)
                   | _mismatch(episode, term, trunc, newest + E, capacity - E, E)
                   | _mismatch(episode, term, trunc, capacity - E, capacity, E - capacity))
        else:
            acc = _mismatch(episode, term, trunc, 0, capacity - E, E)
    s = cursor if size == capacity else 0
    if acc == 0:  # only the newest step (against current) is left
        s = (s + size - E) % capacity
        steps = 1
    else:
        steps = size // num_envs
    for _ in range(steps - 1):
        n = s + num_envs
        if n >= capacity:
            n -= capacity
        for e in range(num_envs):
            grow = (int(episode[n + e]) - int(episode[s + e])) & _MASK32
            if grow != (1 if (term[s + e] or trunc[s + e]) else 0):
                return s + e
        s = n
    for e in range(num_envs):
        grow = (int(current[e]) - int(episode[s + e])) & _MASK32
        if grow != (1 if (term[s + e] or trunc[s + e]) else 0):
            return capacity + e
    return -1


@njit(**NJIT_OPTIONS)
def first_final_mismatch(final_slots, term, trunc, size):
    """-1 if ``final_slots`` lists exactly the slots ``< size`` whose row is terminated or
    truncated, in increasing order (what the elided-next bookkeeping keeps); else the position
    in ``final_slots`` of the first disagreement (``final_slots.shape[0]`` if it is short).

    Parameters
    ----------
    final_slots : ndarray of int64, shape (k,)
    term, trunc : ndarray of bool, shape (>= size,), any stride
    size : int
    """
    k = final_slots.shape[0]
    pos = 0
    for s in range(size):
        if term[s] or trunc[s]:
            if pos >= k or final_slots[pos] != s:
                return pos
            pos += 1
    if pos != k:
        return pos
    return -1
