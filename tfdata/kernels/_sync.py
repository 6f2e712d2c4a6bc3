"""Memory ordering for the shared-memory seqlock: acquire/release loads, stores and fences.

These are LLVM's ordered loads and stores and its ``fence`` instruction, emitted inline into the
kernels that use them. They are plain aligned 64-bit loads and stores, never read-modify-write
atomics: each shard of a shared buffer has exactly one writer, so no two processes ever store to
the same word. What they add is *order*:

* on x86-64 (stores are seen in program order, loads are not reordered with loads) every one of
  them compiles to an ordinary ``mov``; they only stop the compiler from moving memory accesses
  across them;
* on AArch64 (Raspberry Pi, Jetson), where the CPU itself may reorder, they become ``ldar`` /
  ``stlr`` / ``dmb ish``.

The protocol they implement is in :mod:`tfdata.shared` and docs/design/shared-memory.md.
"""

from __future__ import annotations

from numba import types
from numba.core import cgutils
from numba.extending import intrinsic


def _word_pointer(context, builder, arrty, arr, idxty, idx):
    ary = context.make_array(arrty)(context, builder, arr)
    i = context.cast(builder, idx, idxty, types.intp)
    return cgutils.get_item_pointer(context, builder, arrty, ary, [i])


def _is_words(arr) -> bool:
    return isinstance(arr, types.Array) and arr.dtype == types.uint64 and arr.ndim == 1


@intrinsic
def load_acquire(typingctx, arr, idx):
    """``arr[idx]`` (uint64[:]) with acquire order: later loads cannot move before it."""
    if not _is_words(arr) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        ptr = _word_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
        return builder.load_atomic(ptr, "acquire", 8)

    return types.uint64(arr, idx), codegen


def _store(name: str, order: str, doc: str):
    """The intrinsic ``arr[idx] = val`` (uint64[:]) as one untorn 64-bit store of LLVM ``order``."""
    def store(typingctx, arr, idx, val):
        if not _is_words(arr) or not isinstance(idx, types.Integer) or not isinstance(val, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            ptr = _word_pointer(context, builder, sig.args[0], args[0], sig.args[1], args[1])
            v = context.cast(builder, args[2], sig.args[2], types.uint64)
            builder.store_atomic(v, ptr, order, 8)
            return context.get_dummy_value()

        return types.void(arr, idx, val), codegen

    store.__name__ = store.__qualname__ = name
    store.__doc__ = doc
    return intrinsic(store)


store_release = _store("store_release", "release",
                       "``arr[idx] = val`` (uint64[:]) with release order: earlier stores are visible first.")
store_relaxed = _store("store_relaxed", "monotonic",
                       "``arr[idx] = val`` (uint64[:]) as one untorn 64-bit store, no ordering of its own.")


@intrinsic
def fence_acquire(typingctx):
    """Loads before the fence complete before any load or store after it."""
    def codegen(context, builder, sig, args):
        builder.fence("acquire")
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def fence_release(typingctx):
    """Loads and stores before the fence are visible before any store after it."""
    def codegen(context, builder, sig, args):
        builder.fence("release")
        return context.get_dummy_value()

    return types.void(), codegen
