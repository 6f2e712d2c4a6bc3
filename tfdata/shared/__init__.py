"""Shared-memory buffers: many writer processes, one learner, no pickling of rows.

The learner builds a :class:`SharedReplayBuffer`; its rows live in a file in shared memory
(``/dev/shm`` on Linux) that rollout worker processes attach to by name with
:class:`SharedWriter` and write into directly, through the same AoS or SoA storage a
:class:`~tfdata.ReplayBuffer` uses. Nothing is sent through a pipe: a row goes from the worker's
arrays into the shared pages once, and from there into the learner's batch once.

Each writer owns one *shard*, a ring of ``capacity // num_writers`` slots. Two words per
shard, the rows it has begun (*reserved*) and the rows it has published (*head*), form a
sequence lock over the slots being written (see :mod:`tfdata.kernels._shared`): the learner
copies only rows that are complete, without any lock between processes and without
read-modify-write atomics, since no word of the region has two writers.

Two modes:

``mode="replay"``
    A ring per shard that overwrites its oldest rows; the learner ``sample``\\ s uniformly over
    every complete row of every shard.
``mode="fifo"``
    A queue per shard: every row is delivered exactly once by ``get_batch``, in arrival order
    (shards merged by publication time). When writers outrun the learner they either wait
    (``policy="block"``) or drop the rows that do not fit and count them (``policy="drop"``).

With a rate limiter (``rate_limiter=``, replay mode) the learner and the writers keep the ratio
of rows sampled to rows published (see :mod:`tfdata.replay.limiter`): inserts are the sum of
the shards' heads, samples a control word the learner publishes; the limiter's parameters are
in ``region.json``. Both sides poll these words with short sleeps (no lock between processes).

``mode="replay"`` with ``sampler="exactly_k"`` is between the two: the learner samples (every
row in exactly ``replays`` batches, in a random order) and releases each slot once its row's
last delivery is copied; each writer puts a row into the next free slot of its shard (per-slot
``taken`` / ``released`` words, one writer each) and logs the slot before publishing the head.
A writer waits (``"block"``) or drops (``"drop"``) only when no slot of its shard is free.

With ``frame_stack=`` (replay mode) a stacked observation is stored one frame per row and its
stacks rebuilt at sample time from the writer's shard, with the frame bookkeeping in the region
under the same sequence lock (see :mod:`tfdata.shared.frames`).

A region is a directory ``tfdata-shm-<name>`` holding ``region.json`` (what the buffer is),
``region`` (the mapped words and rows), ``owner.lock`` and one lock file per shard. Each lock
(``flock``) is held by its process for as long as it lives and released by the kernel however
it ends, so the learner can tell a writer that died from one that is busy, and :func:`sweep`
can tell a region whose owner died (and remove it) from one in use. This package and
:mod:`tfdata.storage.region` (where the words and rows lie) alone know the region's byte layout.

Modules: ``region`` (the region's files, words, locks and removal, :func:`sweep`), ``buffer``
(:class:`SharedReplayBuffer`, the learner), ``writer`` (:class:`SharedWriter`), and the parts the
buffer holds: ``draws`` (the torn-row checks and redraws of a sample), ``columns``, ``fifo`` (the
FIFO learner), ``gate`` (the learner's side of a rate limiter) and ``state`` (what checkpoints
read and restore).
"""

from ..errors import FormatError  # noqa: F401  (tfdata.shared.FormatError, as before the split)
from .buffer import SharedReplayBuffer
from .region import region_nbytes, shm_dir, sweep
from .writer import SharedWriter

__all__ = ["SharedReplayBuffer", "SharedWriter", "region_nbytes", "shm_dir", "sweep"]
