"""Records written from field bytes: a few rows of several fields interleaved into records.

A one-step extend of an AoS buffer (or of a group of fields) receives one array per field and
must write each row's fields side by side. numpy does it one strided copy per field (a view,
a reshape, a slice, a copy each); ``struct.pack_into`` one record at a time (a fixed cost per
row). :func:`scatter_fields` does every field of every row in one compiled call (figures:
docs/design/write-path.md, "Measured").
Reference: ``scatter_fields_naive`` in ``tests/naive.py``.
"""

from __future__ import annotations

from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._config import NJIT_OPTIONS

#: fields of at least this many bytes are copied by ``memcpy``; narrower ones byte by byte (a
#: call per field and row costs more than a few bytes' loop)
WIDE = 64


@intrinsic
def _copy_into_row(typingctx, dst, row, off, src, at, w):
    """``dst[row, off:off + w] = src[at:at + w]`` by ``memcpy``; ``dst`` a 2-D C-contiguous
    uint8 array, ``src`` a 1-D buffer (bytes or uint8 array). No bounds: the caller checked."""
    ints = (row, off, at, w)
    if not (isinstance(dst, types.Array) and dst.ndim == 2 and dst.layout == "C"
            and isinstance(src, types.Buffer) and src.ndim == 1 and src.layout == "C"
            and all(isinstance(t, types.Integer) for t in ints)):
        return None

    def codegen(context, builder, sig, args):
        d = context.make_array(sig.args[0])(context, builder, args[0])
        s = context.make_array(sig.args[3])(context, builder, args[3])
        r, o, a, n = (context.cast(builder, args[i], sig.args[i], types.intp) for i in (1, 2, 4, 5))
        zero = context.get_constant(types.intp, 0)
        dptr = cgutils.get_item_pointer(context, builder, sig.args[0], d, [r, zero], wraparound=False)
        dptr = builder.gep(builder.bitcast(dptr, cgutils.voidptr_t), [o])
        sptr = builder.gep(builder.bitcast(s.data, cgutils.voidptr_t), [a])
        cgutils.raw_memcpy(builder, dptr, sptr, n, 1)
        return context.get_dummy_value()

    return types.none(dst, row, off, src, at, w), codegen


@njit(**NJIT_OPTIONS)
def scatter_fields(dst, p, n, srcs, spans):
    """Write rows ``[p, p + n)`` of ``dst`` from the fields' bytes.

    Parameters
    ----------
    dst : uint8[rows, stride], C-contiguous
        The records as bytes (a storage's region).
    p, n : int
        First row and number of rows.
    srcs : tuple of bytes (or of 1-D uint8 arrays: another specialization)
        Field ``i``'s values of the ``n`` rows, C order: ``n * spans[i, 1]`` bytes. The extend
        passes bytes: one specialization per number of fields of a region of records.
    spans : int64[m, 2]
        ``(offset, width)`` of field ``i`` in a record; ``m >= len(srcs)``.

    Returns
    -------
    int
        0; -1 with nothing written when the arguments disagree (rows outside ``dst``, a span
        outside the record, a source of the wrong length), whatever they hold.
    """
    rows = dst.shape[0]
    stride = dst.shape[1]
    m = len(srcs)
    if n < 1 or p < 0 or p > rows - n or spans.shape[0] < m or spans.shape[1] < 2:
        return -1
    for i in range(m):
        off = spans[i, 0]
        w = spans[i, 1]
        if off < 0 or w < 0 or off > stride - w or len(srcs[i]) != n * w:
            return -1
    for i in range(m):
        s = srcs[i]
        off = spans[i, 0]
        w = spans[i, 1]
        if w >= WIDE:
            for k in range(n):
                _copy_into_row(dst, p + k, off, s, k * w, w)
            continue
        for k in range(n):
            row = p + k
            at = k * w
            for b in range(w):
                dst[row, off + b] = s[at + b]
    return 0
