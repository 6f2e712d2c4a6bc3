"""One compiled kernel for arrays of any stride: a specialization typed with strided arrays.

numba compiles a kernel once per argument types, and an array's type includes its layout: a
column of its own is C-contiguous, the same field inside records is strided, so a kernel that
reads a field compiles twice, once per layout, and more for each mix of several such
arguments. A kernel written for any stride (it indexes its arrays, never asks them to be
contiguous) needs only the strided (``"A"``) specialization: :func:`strided` compiles (or loads
from the cache) that one and returns its entry point, which takes contiguous arrays as well.

The entry point skips the dispatcher's lookup by type (a call costs less than a call of the
kernel) and with it the dispatcher's checks: it refuses an array of another number of
dimensions or item size, but not one of another dtype of that size, nor a strided array where
it was made for a contiguous one. So a wrapper makes it from the very arrays (or arrays of the
very types) it will pass, and passes nothing else.
"""

from __future__ import annotations

import numpy as np
from numba import typeof, types

#: (kernel, positions, what decides each argument's type) -> entry point: numba's typeof of
#: every argument costs tens of microseconds a call, the key a few
_ENTRIES: dict = {}


def _key(args, positions, readonly) -> tuple | None:
    """What numba's type of each argument follows from (None: an argument this does not know)."""
    out = []
    for i, a in enumerate(args):
        t = type(a)
        if t is np.ndarray:
            f = a.flags
            strided = positions is None or i in positions
            layout = "A" if strided else ("C" if f.c_contiguous else "F" if f.f_contiguous else "A")
            out.append((a.dtype, a.ndim, layout, f.writeable and i not in readonly, f.aligned))
        elif t is float or t is bool or (t is int and -(1 << 63) <= a < (1 << 63)):
            out.append(t)
        else:
            return None
    return tuple(out)


def strided_types(args, positions=None, readonly=()) -> tuple:
    """numba types of ``args``, the arrays at ``positions`` (every array if None) as strided
    (layout ``"A"``) arrays of the same dtype, dimensions and writability, those at ``readonly``
    read-only."""
    out = []
    for i, a in enumerate(args):
        t = typeof(a)
        if isinstance(t, types.Array):
            if positions is None or i in positions:
                t = t.copy(layout="A")
            if i in readonly:
                t = t.copy(readonly=True)
        out.append(t)
    return tuple(out)


def strided(kernel, args, positions=None, readonly=()):
    """The entry point of ``kernel`` (a numba dispatcher) compiled for the types of ``args`` with
    the arrays at ``positions`` (every array if None) strided: call it with arrays of those
    dtypes and dimensions and any stride, the other arguments of the same types as ``args``.
    The arrays at ``readonly`` (that the kernel only reads) are typed read-only, so that
    writable and read-only arrays (a caller's values) share the specialization.

    ``args`` are the arguments, or arguments of the same types, of the calls to come (only
    their types are read; see the module on what the entry point does not check). Compiles,
    or loads from the cache, at most once per process and types."""
    key = _key(args, positions, readonly)
    if key is None:
        return kernel.compile(strided_types(args, positions, readonly))
    key = (kernel, positions, readonly, key)
    got = _ENTRIES.get(key)
    if got is None:
        got = _ENTRIES[key] = kernel.compile(strided_types(args, positions, readonly))
    return got


def call_strided(kernel, positions, *args, readonly=()):
    """``strided(kernel, args, positions, readonly)(*args)``: one call, as a caller that keeps
    no entry point makes it (a test, a one-off)."""
    return strided(kernel, args, positions, readonly)(*args)
