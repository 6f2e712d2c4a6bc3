"""Array-of-structs kernels.

The storage is one structured array whose itemsize is a multiple of 8 bytes, seen here as
``uint64[capacity, words]``. One compiled kernel serves every schema (the row width is a
runtime value), so a new schema never triggers a compile. The kernels are :mod:`._sample`'s,
specialized to :func:`copy_records`.

A row is copied as one block (:func:`copy_row`): the width is switched on once per row among
the constant sizes 8 to 128 bytes, each a fixed-size copy that LLVM emits as a few vector loads
then stores (48 bytes: one 32-byte and one 16-byte move), as numba's own whole-record
assignment ``out[i] = buf[j]`` does for one dtype; wider rows go to ``memcpy``. Measured with
1M CartPole rows (48 B) on the 2-core VM, batch 256 / 1024: 4.5-4.8 / 14-15 µs against 8.9 /
37 µs for the loop over the row's 64-bit words this replaces (:func:`._copy.copy_rows` with a
runtime width: LLVM vectorises it with runtime trip-count checks, and its interleaved 8-byte
loads and stores keep fewer rows' cache misses in flight), and 4.3-4.6 / 15.4-16.3 µs for
the whole-record assignment of the record dtype. See reports/benchmarks.md, "Uniform sample:
where the time goes".
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .._config import INLINE_OPTIONS
from ._sample import specialize

#: row widths (bytes) copied by a fixed-size copy; anything else by memcpy with a runtime length
_FIXED_ROW_BYTES = range(8, 129, 8)


@intrinsic
def copy_row(typingctx, dst, i, src, j, nbytes):
    """Copy the first ``nbytes`` bytes of row ``j`` of ``src`` to row ``i`` of ``dst`` (2-D
    C-contiguous arrays; no bounds or wraparound: the caller checked ``i`` and ``j``).

    Typed for C-contiguous arrays only (whose rows are contiguous bytes): any other array is a
    typing error, never a copy of the wrong bytes."""
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.ndim == 2
            and src.ndim == 2 and dst.layout == "C" and src.layout == "C"
            and isinstance(i, types.Integer) and isinstance(j, types.Integer)
            and isinstance(nbytes, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        dty, ity, sty, jty, nty = sig.args
        d = context.make_array(dty)(context, builder, args[0])
        s = context.make_array(sty)(context, builder, args[2])
        zero = context.get_constant(types.intp, 0)
        row_i = context.cast(builder, args[1], ity, types.intp)
        row_j = context.cast(builder, args[3], jty, types.intp)
        dst_ptr = cgutils.get_item_pointer(context, builder, dty, d, [row_i, zero], wraparound=False)
        src_ptr = cgutils.get_item_pointer(context, builder, sty, s, [row_j, zero], wraparound=False)
        dst_ptr = builder.bitcast(dst_ptr, cgutils.voidptr_t)
        src_ptr = builder.bitcast(src_ptr, cgutils.voidptr_t)
        n = context.cast(builder, args[4], nty, types.intp)
        fn = builder.function
        done = fn.append_basic_block("copy_row.done")
        other = fn.append_basic_block("copy_row.other")
        switch = builder.switch(n, other)
        for size in _FIXED_ROW_BYTES:
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

    return types.none(dst, i, src, j, nbytes), codegen


@njit(**INLINE_OPTIONS)
def copy_records(src, idx, dst):
    """``dst[i, :] = src[idx[i], :]`` for every i, whole rows at a time (:func:`copy_row`);
    ``src`` and ``dst`` are ``uint64[rows, words]`` of one width."""
    nbytes = src.shape[1] * src.itemsize
    for i in range(idx.shape[0]):
        copy_row(dst, i, src, idx[i], nbytes)


gather, sample_uniform, sample_prioritized, sample_shared = specialize(
    "aos", one_field=True, copy=copy_records)

__all__ = ["gather", "sample_uniform", "sample_prioritized", "sample_shared"]
