"""Software prefetch: a hint to the CPU that a cache line will be read soon.

``prefetch(arr, i)`` emits LLVM's ``llvm.prefetch`` (read, keep in every cache level, data)
for the line of element ``[i, 0, ...]`` of ``arr``; ``prefetch_row(arr, i)`` for the first and
the last byte of row ``i`` (the ``arr.shape[1:]`` elements from ``[i, 0, ...]``), since a row
may straddle two lines. A prefetch never faults and changes no value: it only starts the load
of a line early, so that a kernel can issue the misses of a whole batch before it needs the
first of them. Callers still keep ``i`` inside the array (no kernel touches memory outside its
arrays, hint or not).

Why and where it pays: docs/design/prioritized.md ("The floor"), with the figures in
reports/prioritized.md.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_I32 = ir.IntType(32)


def _prefetch(builder, ptr) -> None:
    fnty = ir.FunctionType(ir.VoidType(), [cgutils.voidptr_t, _I32, _I32, _I32])
    fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
    # rw = 0 (read), locality = 3 (keep in every level), cache type = 1 (data)
    builder.call(fn, [ptr, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


def _row_pointer(context, builder, sig, args):
    arrty = sig.args[0]
    ary = context.make_array(arrty)(context, builder, args[0])
    i = context.cast(builder, args[1], sig.args[1], types.intp)
    zero = context.get_constant(types.intp, 0)
    ptr = cgutils.get_item_pointer(context, builder, arrty, ary, [i] + [zero] * (arrty.ndim - 1),
                                   wraparound=False)
    return ary, builder.bitcast(ptr, cgutils.voidptr_t)


def _typed(arr, idx, contiguous: bool) -> bool:
    return (isinstance(arr, types.Array) and isinstance(idx, types.Integer)
            and (arr.layout == "C" or not contiguous))


@intrinsic
def prefetch(typingctx, arr, idx):
    """Prefetch the line of element ``[idx, 0, ...]`` of ``arr`` (any array; ``idx`` an integer
    in ``[0, arr.shape[0])``)."""
    if not _typed(arr, idx, False):
        return None

    def codegen(context, builder, sig, args):
        _prefetch(builder, _row_pointer(context, builder, sig, args)[1])
        return context.get_dummy_value()

    return types.void(arr, idx), codegen


@intrinsic
def prefetch_row(typingctx, arr, idx):
    """Prefetch the first and the last byte of row ``idx`` of ``arr`` (a C-contiguous array,
    any dtype and dimensions; ``idx`` an integer in ``[0, arr.shape[0])``)."""
    if not _typed(arr, idx, True):  # a row's bytes follow its first: C-contiguous only
        return None

    def codegen(context, builder, sig, args):
        arrty = sig.args[0]
        ary, first = _row_pointer(context, builder, sig, args)
        # bytes of one row: the itemsize times the elements of the trailing dimensions
        nbytes = context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(arrty.dtype)))
        shapes = cgutils.unpack_tuple(builder, ary.shape, arrty.ndim)
        for dim in shapes[1:]:
            nbytes = builder.mul(nbytes, dim)
        last = builder.gep(first, [builder.sub(nbytes, context.get_constant(types.intp, 1))])
        _prefetch(builder, first)
        _prefetch(builder, last)
        return context.get_dummy_value()

    return types.void(arr, idx), codegen
