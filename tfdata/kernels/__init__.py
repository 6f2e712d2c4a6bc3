"""Private numba kernels. Nothing here allocates: every kernel writes into arrays it is given.

One module per layout (:mod:`.aos`, :mod:`.soa`) with the same function names and signatures;
a storage picks its module once, when it is built. :mod:`.spans` has them too, for projections
(some fields of any layout, gathered into columns). Importing this package decorates the kernels
but compiles nothing: numba compiles (or loads from its cache) on the first call. Every kernel's
cache entry is stale when any source it imports changed (:mod:`tfdata._kernel_cache`).
"""

from __future__ import annotations

from .. import _kernel_cache

_kernel_cache.install()  # before the first kernel is defined

from . import aos, soa, spans  # noqa: E402
from ._rng import draw_indices, permutation  # noqa: E402
from ._tree import (first_bad_priority, tree_build, tree_fill, tree_fill_values,  # noqa: E402
                    tree_overwrite_max, tree_set)

from ._streams import NSTEP_STRIDED, RING, SHARDS  # noqa: E402
from ._strided import call_strided, strided  # noqa: E402
from ._episodes import (ELIDE_READONLY, ELIDE_STRIDED, ELIDED_READONLY, ELIDED_STRIDED,  # noqa: E402
                        copy_field_rows, copy_next_elided, elide_step, first_discontinuity,
                        stamp_episodes)

from ._frames import (RING_STACKS, SHARD_STACKS, final_ring_index, final_ring_room,  # noqa: E402
                      final_ring_write, frame_breaks, frame_push, frame_push_u8, frames_write,
                      torn_stacks)
from ._cold import cold_frame_stacks, cold_next_frame_stacks  # noqa: E402

from ._loader import touch_pages, window_order  # noqa: E402
from ._transforms import cast, normalize, random_shift, scale_clip  # noqa: E402

from ._shared import fifo_commit, fifo_plan, shard_begin, shard_publish  # noqa: E402
from ._replays import replays_claim, replays_log, replays_recover  # noqa: E402
from ._shared_tree import draw_prioritized, read_heads, torn_after_copy  # noqa: E402

BY_LAYOUT = {"aos": aos, "soa": soa}
#: the n-step and slice kernels of each kind of streams (``.nstep``, ``.slices``,
#: ``.slices_prioritized``), as BY_LAYOUT gives a layout's
BY_STREAMS = {"ring": RING, "shards": SHARDS}
#: the frame-stack kernels of each kind of streams (``.stacks``, ``.next_stacks``,
#: ``.stack_pairs``)
STACKS_BY_STREAMS = {"ring": RING_STACKS, "shards": SHARD_STACKS}

__all__ = ["aos", "soa", "spans", "draw_indices", "tree_build", "tree_fill", "tree_fill_values", "tree_set", "BY_LAYOUT",
           "copy_field_rows", "copy_next_elided", "elide_step", "first_discontinuity", "stamp_episodes", "RING", "SHARDS", "BY_STREAMS",
           "frame_breaks", "frame_push", "frame_push_u8", "frames_write", "RING_STACKS", "SHARD_STACKS",
           "STACKS_BY_STREAMS", "torn_stacks", "final_ring_index", "final_ring_room", "final_ring_write",
           "cold_frame_stacks", "cold_next_frame_stacks",
           "permutation", "touch_pages", "window_order",
           "fifo_commit", "fifo_plan", "shard_begin", "shard_publish", "replays_claim", "replays_log", "replays_recover",
           "draw_prioritized", "read_heads", "torn_after_copy", "strided", "call_strided", "NSTEP_STRIDED", "ELIDED_STRIDED", "ELIDED_READONLY",
           "ELIDE_STRIDED", "ELIDE_READONLY", "cast", "normalize", "random_shift", "scale_clip"]
