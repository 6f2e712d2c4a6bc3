"""The learner's side of a FIFO region (``SharedReplayBuffer(mode="fifo")``): every row
delivered exactly once, in arrival order (shards merged by publication time: the kernels
``fifo_plan`` and ``fifo_commit``), each batch from this thread's ring of preallocated batches."""

from __future__ import annotations

import threading
import time

import numpy as np

from .._checks import check_int as _check_int
from ..batch import UNHELD as _UNHELD
from ..batch import Batch, retire
from ..batch import getrefcount as _getrefcount
from ..errors import SharedBufferError

__all__ = ["FifoLearner"]


class FifoLearner:
    """The consumer of a FIFO region: what :meth:`tfdata.SharedReplayBuffer.get_batch` and
    :meth:`~tfdata.SharedReplayBuffer.batches` do. ``lock`` is the buffer's (held while a batch is
    planned, copied and its rows released to the writers); ``watch(stacklevel)`` is the buffer's
    check for writers that died (it warns of each once). Over a replay region it refuses every
    call (SharedBufferError)."""

    def __init__(self, region, lock, ring_size: int, kernels, name: str, watch):
        self._region = region
        self._lock = lock
        self._ring_size = ring_size
        self._k = kernels
        self.name = name
        self._watch = watch
        st = region.storage
        self._store = st.kernel_store
        self._gather_kernel = st.kernels.gather
        self._local = threading.local()
        # the consumer's bookkeeping (under the lock)
        self._cursors = np.zeros(2 * region.shards, np.int64)
        self._info = np.zeros(4, np.int64)
        self._last = (time.monotonic(), 0, 0)  # time, rows published, rows dropped at the last batch

    def queued(self) -> int:
        """Rows published and not yet delivered, over every shard."""
        r = self._region
        return int((r.heads.astype(np.int64) - r.tails.astype(np.int64)).sum())

    def get_batch(self, batch_size: int, *, timeout: float | None = None, partial: bool = False,
                  copy: bool = False) -> Batch:
        """As :meth:`tfdata.SharedReplayBuffer.get_batch`."""
        if self._region.mode != "fifo":
            raise SharedBufferError(f"shared buffer {self.name!r} is a replay ring: use sample(), "
                                    f"or build it with mode='fifo' for exact-once batches")
        ring = self._ring(batch_size)
        t0 = time.monotonic()
        deadline = None if timeout is None else t0 + float(timeout)
        pause = 20e-6
        r = self._region
        while True:
            # the clock is read once per round: the partial batch and the TimeoutError below
            # must agree on whether the time is up
            expired = deadline is not None and time.monotonic() >= deadline
            with self._lock:
                i = ring[0]
                out, slots, batch, metrics = ring[1][i]
                k = self._k.fifo_plan(r.heads, r.tails, r.dropped, r.stamps, r.cap, batch_size,
                                      False, self._cursors, slots, self._info)
                if k == 0 and partial and self._info[0] > 0:
                    if expired or self._region.all_done():
                        k = self._k.fifo_plan(r.heads, r.tails, r.dropped, r.stamps, r.cap,
                                              batch_size, True, self._cursors, slots, self._info)
                if k:
                    # rows below a head are complete, and their slots are not reused before
                    # the tail passes them: a plain gather, then the tails
                    self._gather_kernel(self._store, slots[:k], out.kernel_out)
                    self._k.fifo_commit(r.tails, self._cursors)
                    ring[0] = (i + 1) % self._ring_size
                    now = time.monotonic()
                    self._fill_metrics(metrics, k, now, t0)
                    if k < batch_size:  # a partial batch: views of the first k rows
                        batch = _FifoBatch({n: v[:k] for n, v in batch.items()}, batch.indices[:k])
                        batch.metrics = metrics
                    elif _getrefcount(batch) > _UNHELD:  # still held: retire it (see Batch)
                        batch = retire(batch)
                        ring[1][i] = (out, slots, batch, metrics)
                    break
            if expired:
                raise TimeoutError(f"shared buffer {self.name!r}: {int(self._info[0])} rows queued "
                                   f"after {timeout} s, a batch needs {batch_size}")
            self._watch(5)  # the warning names the caller of SharedReplayBuffer.get_batch
            time.sleep(pause)  # releases the GIL
            pause = min(2 * pause, 1e-3)
        self._watch(5)
        return batch.copy_with_metrics() if copy else batch

    def _fill_metrics(self, m: dict, k: int, now: float, t0: float) -> None:
        info = self._info
        t_prev, pub_prev, drop_prev = self._last
        published, dropped = int(info[2]), int(info[3])
        m["rows"] = k
        m["queued"] = int(info[0]) - k
        m["oldest_age_s"] = max(0.0, (time.monotonic_ns() - int(info[1])) * 1e-9)
        m["ingest_rows_per_s"] = (published - pub_prev) / max(now - t_prev, 1e-9)
        m["dropped"] = dropped
        m["dropped_since"] = dropped - drop_prev
        m["wait_s"] = now - t0
        self._last = (now, published, dropped)

    def batches(self, batch_size: int, *, timeout: float | None = None, copy: bool = False):
        """As :meth:`tfdata.SharedReplayBuffer.batches`."""
        since = time.monotonic()
        while True:
            try:
                batch = self.get_batch(batch_size, timeout=0.05, copy=copy)
            except TimeoutError:
                if self._region.all_done():  # nothing more can come: deliver the rest and stop
                    if self.queued() == 0:
                        return
                    batch = self.get_batch(batch_size, timeout=0, partial=True, copy=copy)
                elif timeout is not None and time.monotonic() - since > timeout:
                    raise TimeoutError(f"shared buffer {self.name!r}: no batch of {batch_size} rows "
                                       f"within {timeout} s ({self.queued()} queued)") from None
                else:
                    continue
            since = time.monotonic()
            yield batch

    def _ring(self, batch_size):
        """This thread's ring of batches of ``batch_size`` rows (checked: a batch that could never
        fill is refused)."""
        key = ("fifo", batch_size)
        try:
            return self._local.rings[key]
        except (AttributeError, KeyError):
            pass
        batch_size = _check_int("batch_size", batch_size, 1)
        capacity = self._region.shards * self._region.cap
        if batch_size > capacity:
            raise ValueError(f"batch_size {batch_size} is larger than the queue's capacity "
                             f"{capacity}: no batch could ever fill")
        if self._region.policy == "block" and batch_size > self._region.cap:
            raise ValueError(
                f"batch_size {batch_size} is larger than a shard's {self._region.cap} slots: with "
                f"policy='block' a writer waits once its shard is full, so with the other writers "
                f"idle or finished no batch could fill; use batch_size <= {self._region.cap} or "
                f"capacity >= {batch_size * self._region.shards}")
        if not hasattr(self._local, "rings"):
            self._local.rings = {}
        st = self._region.storage
        slots = []
        for _ in range(self._ring_size):
            out = st.new_output(batch_size)
            metrics: dict = {}
            b = _FifoBatch(out.fields, out.indices)
            b.metrics = metrics
            slots.append((out, out.indices, b, metrics))  # the plan writes the slots there
        ring = self._local.rings[key] = [0, slots]
        return ring


class _FifoBatch(Batch):
    """A :class:`Batch` with the FIFO metrics of its delivery (``batch.metrics``)."""

    __slots__ = ("metrics",)

    def copy_with_metrics(self) -> "_FifoBatch":
        b = self.copy()
        out = _FifoBatch(dict(b), b.indices)
        out.metrics = dict(self.metrics)
        return out
