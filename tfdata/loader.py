"""DataLoader: batches of a :class:`~tfdata.dataset.Dataset`, prefetched by one thread.

No worker processes: with ``prefetch > 0`` one background thread per epoch gathers the next
batches with a numba kernel that releases the GIL, into a ring of preallocated batch buffers,
while the consumer works between batches; a consumer whose batch is not ready gathers it itself
(docs/design/loader.md). The order of an epoch is a function of ``(seed, epoch)`` only, so the
batches are the same whatever the prefetch depth, whichever thread gathered them, and however
the previous epoch ended. The orders: :class:`LoaderConfig` ``shuffle``.
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
import time
import weakref

import numpy as np

from ._prefetch import Ahead, Failure, WANT_STEP_NS, run_ahead, spin_reads
from .batch import Batch
from .dataset import PAGE, Dataset
from .storage.files import ResidentFile
from ._rng import MASK64, splitmix64

_GOLDEN = 0x9E3779B97F4A7C15
#: a quarter of the resident target is read between two measurements, assuming each row may map
#: a 2 MiB folio: the resident set stays within about 1.25x ``resident_bytes``
_FOLIO_GUESS = 4 * (2 << 20)
_AUTO_RESIDENT = 64 << 20
_MODES = {False: "none", "none": "none", True: "full", "full": "full", "block": "block"}


def epoch_key(seed: int, epoch: int) -> int:
    """The generator key of epoch ``epoch``: ``splitmix64(splitmix64(seed) + (epoch + 1) * GOLDEN)``."""
    return splitmix64((splitmix64(seed) + (epoch + 1) * _GOLDEN) & MASK64)


def _int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class LoaderConfig:
    """Everything that decides what a :class:`DataLoader` yields and how much memory it holds.

    Parameters
    ----------
    batch_size : int
        Rows per batch, >= 1. A batch size above the dataset's length gives one batch of all
        the rows (or, with ``drop_last``, is refused); the loader's memory is sized by the
        rows a batch can really hold, ``min(batch_size, len(dataset))``, never by
        ``batch_size`` alone.
    shuffle : bool or {"block"}
        False: file order (with ``zero_copy`` a batch is a view of the dataset). True: a uniform
        permutation of all rows per epoch (Fisher-Yates; ``n`` int32 or int64 indices held by
        the loader). "block": for data far larger than memory, rows cut into blocks of
        ``block_rows`` consecutive rows; each epoch permutes the blocks, takes them
        ``window_blocks`` at a time, and permutes the rows of each window (reads sequential
        within a block, one window resident at a time).
    drop_last : bool
        Drop the last, shorter batch. A dataset shorter than one batch is then an error.
    seed : int or None
        Seed of every epoch's order; None draws one from the OS (kept in :attr:`seed`).
    prefetch : int
        Batches the background thread may prepare ahead; 0 gathers in the caller's thread. The
        thread starts once the caller spends ``WANT_STEP_NS`` or more between two batch requests
        twice in a row (a loop that only reads batches gathers them itself, as with 0), and the
        caller gathers any batch that is not ready when asked for. The ring has
        ``min(prefetch, batches per epoch) + 1`` slots.
    zero_copy : bool
        Unshuffled batches are views of the dataset (no copy). False copies them into the ring.
    block_rows : int or None
        Block shuffle: rows per block; None picks about 64 KiB of rows (at least one row).
    window_blocks : int
        Block shuffle: blocks whose rows are shuffled together (the shuffle buffer); a batch
        mixes at most this many file regions, so it matters more than the block size (the
        default's randomness: docs/design/loader.md).
    resident_bytes : int, None or "auto"
        Memory-mapped datasets larger than this have pages already consumed released
        (``MADV_DONTNEED``) so that about this many bytes of the file stay mapped; None never
        releases. "auto" (the default): 64 MiB for file order and block shuffle; None for
        ``shuffle=True``, where bounding the resident set means re-reading pages over and over
        (use block shuffle for files larger than memory, or set a number).
    """

    batch_size: int
    shuffle: object = False
    drop_last: bool = False
    seed: int | None = None
    prefetch: int = 2
    zero_copy: bool = True
    block_rows: int | None = None
    window_blocks: int = 512
    resident_bytes: object = "auto"

    def __post_init__(self):
        _int("batch_size", self.batch_size, 1)
        _int("prefetch", self.prefetch, 0)
        _int("window_blocks", self.window_blocks, 1)
        if self.block_rows is not None:
            _int("block_rows", self.block_rows, 1)
        if self.resident_bytes is not None and self.resident_bytes != "auto":
            _int("resident_bytes", self.resident_bytes, PAGE)
        try:
            _MODES[self.shuffle]
        except (KeyError, TypeError):
            raise ValueError(f"shuffle must be False, True or 'block', got {self.shuffle!r}") from None
        seed = self.seed
        if seed is None:
            seed = secrets.randbits(63)
        elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        object.__setattr__(self, "seed", int(seed) & MASK64)

    @property
    def mode(self) -> str:
        """``"none"``, ``"full"`` or ``"block"``."""
        return _MODES[self.shuffle]

    @property
    def resident_limit(self) -> int | None:
        """``resident_bytes`` with "auto" resolved for this order."""
        if self.resident_bytes == "auto":
            return None if self.mode == "full" else _AUTO_RESIDENT
        return self.resident_bytes


class DataLoader:
    """Iterate a dataset in batches, with background prefetch and optional shuffling.

    Parameters
    ----------
    dataset : Dataset
        :class:`~tfdata.ArrayDataset`, :class:`~tfdata.MmapDataset` or another implementation
        of the contract.
    batch_size, shuffle, drop_last, seed, prefetch
        See :class:`LoaderConfig`.
    config : LoaderConfig, optional
        Instead of the keywords.
    allocator : str or tfdata.alloc.Allocator, optional
        Where the batch ring and index arrays come from (as for :class:`~tfdata.ReplayBuffer`).
    memory_budget : int or str, optional
        Bytes the loader may allocate (:attr:`nbytes_parts`: batch ring, indices, permutation
        or block-shuffle scratch; the dataset's rows are not counted). Checked before
        allocating; :class:`tfdata.MemoryBudgetError` if it does not fit.
    fields : list of str, optional
        Load only these fields (:meth:`tfdata.Dataset.project`): each batch is the one the
        loader yields without ``fields`` (same rows, same order), restricted to them, and only
        their bytes are copied (and, for an SoA file, only their columns read). None: every
        field. Checked before anything is allocated (SpecError naming an unknown field).
    **options
        The other :class:`LoaderConfig` fields (``zero_copy``, ``block_rows``, ...).

    Notes
    -----
    Each ``iter(loader)`` is one epoch; epochs are numbered from 0 (:attr:`epoch` is the next
    one) and epoch ``e``'s order depends only on ``(seed, e)``. Starting an epoch stops the
    previous one.

    A yielded :class:`~tfdata.Batch` maps field names to arrays of shape
    ``(rows, *field.shape)``; ``batch.indices`` (int64) gives the dataset rows. Gathered batches
    live in the loader's ring and stay valid until the next batch is requested: keep one longer
    with ``batch.copy()``. Unshuffled zero-copy batches are read-only views of the dataset.

    The background thread stops at the end of the epoch, on :meth:`close`, when the iterator is
    garbage collected (``break`` out of a ``for`` loop drops it), and when a new epoch starts.
    An exception raised while preparing batch ``k`` is raised by the request for batch ``k``,
    after batches ``0 .. k-1`` have been delivered.

    ``async for batch in loader`` waits for batches in an executor thread, so the event loop
    keeps running.

    Examples
    --------
    >>> ds = tfdata.MmapDataset.open("data.npy")                      # doctest: +SKIP
    >>> for batch in tfdata.DataLoader(ds, 256, shuffle=True, seed=0):  # doctest: +SKIP
    ...     x = torch.from_numpy(batch["obs"])  # no copy
    """

    def __init__(self, dataset: Dataset, batch_size: int | None = None, shuffle=False, drop_last: bool = False,
                 seed: int | None = None, prefetch: int = 2, *, config: LoaderConfig | None = None,
                 allocator=None, memory_budget=None, fields=None, **options):
        from . import alloc
        from ._budget import check_budget, parse_bytes

        if config is None:
            if batch_size is None:
                raise TypeError("DataLoader needs batch_size (or config=LoaderConfig(...))")
            config = LoaderConfig(batch_size, shuffle, drop_last, seed, prefetch, **options)
        elif batch_size is not None or options:
            raise TypeError("pass either config= or the keyword options, not both")
        for attr in ("gather", "new_output", "rows", "spec"):
            if not hasattr(dataset, attr):
                raise TypeError(f"dataset: {type(dataset).__name__} has no {attr!r} (see tfdata.Dataset)")
        source = dataset
        if fields is not None:
            if not hasattr(dataset, "project"):
                raise TypeError(f"fields=: {type(dataset).__name__} has no 'project' (see "
                                f"tfdata.Dataset.project)")
            source = dataset.project(fields)  # SpecError before anything is allocated
        n = len(dataset)
        b = config.batch_size
        if config.drop_last and n < b:
            raise ValueError(f"drop_last=True: the dataset has {n} rows, fewer than one batch of {b}; "
                             "it would yield nothing")
        if n >= 1 << 32 and config.mode != "none":
            raise ValueError(f"shuffling supports fewer than 2**32 rows, the dataset has {n}")
        self.dataset = dataset
        #: what the batches are read from: the dataset, or its projection on ``fields``
        self.source = source
        self.fields = None if source is dataset else tuple(source.spec.names)
        self.config = config
        self.epoch = 0
        self._n = n
        self._gathers = config.mode != "none" or not config.zero_copy
        self._rows, ring, self._batches = self._sizes(config, n)
        self.allocator = a = alloc.resolve(allocator)
        self.memory_budget = None if memory_budget is None else parse_bytes("memory_budget", memory_budget)
        block_rows = None
        if config.mode == "block":
            block_rows = config.block_rows or max(1, (64 << 10) // max(1, dataset.row_nbytes))
        # checked before anything is allocated
        check_budget(self.memory_budget, self._planned_parts(source, config, n, block_rows),
                     f"DataLoader of batch {b}, prefetch {config.prefetch}, shuffle={config.shuffle!r}")
        rows = self._rows
        if self._gathers:
            self._ring = [self._new_output(source, rows, allocator) for _ in range(ring)]
        else:
            self._ring = [None] * ring
        self._idx = [a.zeros(rows, np.int64) for _ in range(ring)]
        # full gathered batches are the same objects every time their slot comes round
        self._full = [Batch(out.fields, idx) for out, idx in zip(self._ring, self._idx)] if self._gathers else None
        self._base = a.empty(rows, np.int64)
        self._base[:] = np.arange(rows, dtype=np.int64)
        self._perm = self._blocks = self._window = None
        if config.mode == "full":
            self._perm = a.zeros(n, np.int32 if n < 1 << 31 else np.int64)
        elif config.mode == "block":
            self.block_rows = block_rows
            n_blocks = -(-n // block_rows)
            self._blocks = a.zeros(n_blocks, np.int64)
            self._window = a.zeros(min(n, config.window_blocks * block_rows), np.int64)
        self._active = None
        self._lock = threading.Lock()
        #: an epoch's consumer spent a step outside next(): the next epoch starts its thread at once
        self._worked = False

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def batch_size(self) -> int:
        return self.config.batch_size

    def __len__(self) -> int:
        """Batches per epoch."""
        return self._batches

    def _new_output(self, dataset, b: int, requested):
        import inspect

        params = inspect.signature(dataset.new_output).parameters
        if "allocator" in params or any(p.kind is p.VAR_KEYWORD for p in params.values()):
            return dataset.new_output(b, allocator=self.allocator)
        if requested is not None:  # asked for explicitly: never fall back silently
            raise TypeError(f"allocator={requested!r}: {type(dataset).__name__}.new_output(batch_size) "
                            f"takes no allocator= argument, so its batches cannot come from that allocator")
        return dataset.new_output(b)  # a dataset of the older contract: its own memory

    @staticmethod
    def _sizes(config: LoaderConfig, n: int) -> tuple:
        """``(rows, slots)`` of the batch ring and the batches per epoch: a batch never holds
        more than the ``n`` rows of the dataset (at least one row, for an empty dataset), and
        the producer is never more than the epoch's batches ahead, so ``prefetch`` beyond that
        takes no slot."""
        b = config.batch_size
        batches = n // b if config.drop_last else -(-n // b)
        return max(1, min(b, n)), min(config.prefetch, batches) + 1, batches

    @staticmethod
    def _planned_parts(dataset, config: LoaderConfig, n: int, block_rows) -> dict:
        b, ring, _ = DataLoader._sizes(config, n)
        gathers = config.mode != "none" or not config.zero_copy
        order = 0
        if config.mode == "full":
            order = n * (4 if n < 1 << 31 else 8)
        elif config.mode == "block":
            order = 8 * (-(-n // block_rows) + min(n, config.window_blocks * block_rows))
        return {"output_ring": ring * b * (dataset.row_nbytes + 8) if gathers else 0,
                "indices": 8 * b * (ring + 1), "order": order}

    @property
    def nbytes_parts(self) -> dict:
        """Bytes the loader allocated, by part: ``output_ring`` (gathered batches and their
        indices), ``indices`` (the index arrays), ``order`` (permutation or block-shuffle
        scratch). The dataset's own rows are not counted."""
        ring = 0
        for out in self._ring:
            if out is not None:
                ring += out.nbytes
        order = sum(a.nbytes for a in (self._perm, self._blocks, self._window) if a is not None)
        return {"output_ring": int(ring), "indices": int(sum(i.nbytes for i in self._idx) + self._base.nbytes),
                "order": int(order)}

    @property
    def nbytes(self) -> int:
        """Total of :attr:`nbytes_parts`."""
        return sum(self.nbytes_parts.values())

    def __iter__(self) -> "_Epoch":
        with self._lock:
            self._stop_active(superseded=True)
            it = _Epoch(self, self.epoch)
            self.epoch += 1
            self._active = weakref.ref(it)
        return it

    def __aiter__(self) -> "_AsyncEpoch":
        return _AsyncEpoch(iter(self))

    def close(self) -> None:
        """Stop the running epoch, if any, and its thread."""
        self._stop_active(superseded=False)

    def _stop_active(self, superseded: bool) -> None:
        active = self._active() if self._active is not None else None
        self._active = None
        if active is not None:
            active.close()
            active._superseded = superseded and active._k < active._batches

    def state_dict(self) -> dict:
        """``{"seed", "epoch"}``: enough to resume at the start of epoch ``epoch``."""
        return {"seed": self.config.seed, "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        epoch = _int("epoch", state.get("epoch"), 0)
        seed = _int("seed", state.get("seed"), 0)
        self.close()
        self.config = dataclasses.replace(self.config, seed=seed & MASK64)
        self.epoch = epoch

    def __repr__(self) -> str:
        c = self.config
        fields = "" if self.fields is None else f", fields={list(self.fields)}"
        return (f"DataLoader({self.dataset!r}, batch_size={c.batch_size}, shuffle={c.shuffle!r}, "
                f"drop_last={c.drop_last}, seed={c.seed}, prefetch={c.prefetch}{fields})")


class _Plan:
    """What one epoch produces, batch after batch, in order. Used by one thread at a time.

    Holds no reference to the iterator, so dropping the iterator lets it be collected.
    """

    def __init__(self, loader: DataLoader, epoch: int):
        c = loader.config
        self.ds = loader.source
        self.n = loader._n
        self.b = c.batch_size
        self.rows = loader._rows  # rows of a ring slot: min(batch_size, n)
        self.batches = loader._batches
        self.mode = c.mode
        self.gathers = loader._gathers
        self.ring = loader._ring
        self.idx = loader._idx
        self.full = loader._full
        # bound once: tfdata's datasets skip the index checks (indices are in range by
        # construction) and copy consecutive rows as blocks; other datasets get the public calls
        self.gather = getattr(self.ds, "gather_unchecked", self.ds.gather)
        self.copy_range = getattr(self.ds, "_copy_range", None)
        self.base = loader._base
        self.perm = loader._perm
        self.blocks = loader._blocks
        self.window = loader._window
        self.rng = np.array([epoch_key(c.seed, epoch), 0], np.uint64)  # [key, counter]
        self.started = False
        mapped = getattr(self.ds, "mapped_nbytes", 0)
        limit = c.resident_limit
        self.limit = limit if (limit is not None and mapped > limit) else None
        # bytes mapped per row: the rows of the files read (a projection reads fewer of them)
        self.mapped_row = mapped // max(1, self.n)
        self.lag = len(loader._ring)
        self.released = 0  # rows [0, released) already released (file order)
        if self.limit is not None and self.mode != "none":
            # shuffled reads: how much a fault maps depends on the kernel (fault-around, large
            # folios), so the resident set is measured, not estimated
            self.probe = ResidentFile()
            self.probe_base = None  # taken when the epoch starts (see _start)
            self.chunk = max(1, self.limit // _FOLIO_GUESS)
        if self.mode == "block":
            self.block_rows = loader.block_rows
            self.window_blocks = c.window_blocks
            self.w_next = 0  # next window's first position in self.blocks
            self.w_len = 0
            self.w_pos = 0
            self.window_done = False

    def _start(self) -> None:
        from . import kernels

        self.started = True
        if self.limit is not None and self.mode != "none":
            # start from nothing mapped: pages an earlier epoch left would otherwise count in
            # the baseline and the bound would grow epoch by epoch (seen in the prefetch experiment)
            self.ds.release_all()
            self.probe_base = self.probe.file_bytes()
        if self.mode == "full":
            kernels.permutation(self.rng, self.perm)
        elif self.mode == "block":
            kernels.permutation(self.rng, self.blocks)
        elif self.limit is not None and hasattr(self.ds, "sequential"):
            self.ds.sequential()

    def produce(self, k: int) -> Batch:
        """Batch ``k`` of the epoch; must be called for k = 0, 1, 2, ... in order."""
        return self.fill(self.prepare(k), ahead=False)

    def prepare(self, k: int) -> tuple:
        """The sequential part of batch ``k`` (indices, window state, page advice); call for
        k = 0, 1, 2, ... in order, one thread at a time. Returns the work :meth:`fill` does,
        which may run in another thread and beside the fill of another batch.

        ``("done", batch)``: nothing left to do (bounded gathers, which measure and release the
        map as they go, run here whole); ``("view", batch, start, stop)``: a zero-copy batch whose
        pages a thread ahead of the consumer faults in; ``("range", start, m, slot)``: consecutive
        rows copied as blocks; ``("gather", idx, slot, m)``: the nogil gather kernel.
        """
        if not self.started:
            self._start()
        start = k * self.b
        m = min(self.b, self.n - start)
        slot = k % len(self.ring)
        idx = self.idx[slot][:m]
        if self.mode == "none":
            np.add(self.base[:m], start, out=idx)
            if self.limit is not None:
                self._release_behind(k)
                self.ds.willneed(start, start + m)
            if not self.gathers:
                return ("view", Batch(self.ds.rows(start, start + m), idx), start, start + m)
            if self.copy_range is not None:
                return ("range", start, m, slot)
        elif self.mode == "full":
            idx[:] = self.perm[start:start + m]
            if self.limit is not None:
                return ("done", self._gather_bounded(idx, slot, m))
        else:
            self._take_block_rows(idx)
            if self.limit is not None:
                batch = self._gather_bounded(idx, slot, m)
                if self.window_done:  # its last rows are gathered now: what it mapped can go
                    self.ds.release_all()
                    self.window_done = False
                return ("done", batch)
        return ("gather", idx, slot, m)

    def fill(self, work: tuple, ahead: bool) -> Batch:
        """Do the copy :meth:`prepare` planned and return the batch. ``ahead``: the prefetch
        thread runs ahead of the consumer, so the pages of a zero-copy batch are faulted in
        here, off the consumer's thread (the consumer reading them would fault them anyway)."""
        kind = work[0]
        if kind == "gather":
            _, idx, slot, m = work
            self.gather(idx, self.ring[slot])
            return self._batch(slot, m)
        if kind == "view":
            if ahead:
                self.ds.touch(work[2], work[3])
            return work[1]
        if kind == "range":
            _, start, m, slot = work
            self.copy_range(start, m, self.ring[slot])
            return self._batch(slot, m)
        return work[1]

    def _batch(self, slot: int, m: int) -> Batch:
        if m == self.rows:
            return self.full[slot]
        out = self.ring[slot]
        return Batch({name: v[:m] for name, v in out.fields.items()}, self.idx[slot][:m])

    def _gather_bounded(self, idx: np.ndarray, slot: int, m: int) -> Batch:
        # random reads of a mapped file: one row can map a whole large folio of the page cache,
        # so the resident set is measured and the map released between chunks of rows
        out = self.ring[slot]
        step = self.chunk
        for c0 in range(0, m, step):
            c1 = min(m, c0 + step)
            self.ds.gather_unchecked(idx[c0:c1], out, c0)
            if self.probe.file_bytes() - self.probe_base > self.limit:
                self.ds.release_all()
        return self._batch(slot, m)

    def _release_behind(self, k: int) -> None:
        # rows of batches before k - lag are no longer the consumer's (the ring contract)
        upto = max(0, (k - self.lag) * self.b)
        if (upto - self.released) * self.mapped_row >= self.limit // 2:
            self.ds.release(self.released, upto)
            self.released = upto

    def _take_block_rows(self, idx: np.ndarray) -> None:
        from . import kernels

        filled = 0
        m = idx.shape[0]
        while filled < m:
            if self.w_pos == self.w_len:
                self._next_window(kernels)
            take = min(m - filled, self.w_len - self.w_pos)
            idx[filled:filled + take] = self.window[self.w_pos:self.w_pos + take]
            self.w_pos += take
            filled += take

    def _next_window(self, kernels) -> None:
        # the finished window's pages go once this batch is gathered (not block by block:
        # docs/design/loader.md)
        self.window_done = self.w_next > 0
        b0 = self.w_next
        b1 = min(b0 + self.window_blocks, self.blocks.shape[0])
        self.w_len = kernels.window_order(self.blocks, b0, b1, self.block_rows, self.n, self.rng,
                                          self.window)
        self.w_pos = 0
        self.w_next = b1
        if self.limit is not None:
            for blk in self.blocks[b0:b1]:  # read the whole window ahead, block by block
                s = int(blk) * self.block_rows
                self.ds.willneed(s, min(s + self.block_rows, self.n))


_pc = time.perf_counter_ns


class _Epoch:
    """Iterator over one epoch's batches (what ``iter(loader)`` returns)."""

    def __init__(self, loader: DataLoader, epoch: int):
        self.epoch = epoch
        self._plan = _Plan(loader, epoch)
        self._k = 0
        self._batches = loader._batches
        self._closed = False
        self._superseded = False
        self._thread = None
        self._ctl = None
        if loader.config.prefetch > 0 and self._batches > 0:
            # the thread starts when the consumer first spends a step outside next() (see
            # _start_thread): a loop that only reads batches never pays for one
            self._ctl = Ahead(self._plan, len(loader._ring), self._batches)
            if loader._worked:
                # the previous epoch's consumer worked between batches: gather from the start
                self._ctl.want = True
                self._start_thread()
        self._loader_ref = weakref.ref(loader)
        self._long = False
        self._t_out = _pc()

    def _start_thread(self) -> None:
        ctl = self._ctl
        ctl.sleeping = ctl.asleep = False
        self._thread = threading.Thread(target=run_ahead, args=(ctl,), name=f"tfdata-prefetch-epoch{self.epoch}",
                                        daemon=True)
        self._thread.start()

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return self._batches - self._k

    def __next__(self) -> Batch:
        if self._superseded:
            raise RuntimeError(f"epoch {self.epoch} was stopped after {self._k} of {self._batches} batches "
                               "because a new epoch of the same loader started (the epochs share one "
                               "batch ring); finish or close an epoch before starting the next")
        k = self._k
        if self._closed or k >= self._batches:
            self.close()
            raise StopIteration
        ctl = self._ctl
        if ctl is None:
            try:
                batch = self._plan.produce(k)
            except BaseException:
                self.close()  # as with prefetch: a failed epoch yields nothing more
                raise
            self._k = k + 1
            return batch
        t = _pc()
        if ctl.asleep and t - self._t_out < WANT_STEP_NS:
            # A consumer that only asks for batches and a thread asleep (or not started): gather
            # here, like prefetch=0, with no lock (only this thread can wake the other). Every
            # batch the thread claimed is published, so batch k is ready unless it is the next.
            self._long = False
            if ctl.nxt == k:
                ctl.nxt = k + 1
                try:
                    batch = self._plan.fill(self._plan.prepare(k), ahead=False)
                except BaseException:
                    ctl.failed = True
                    self.close()
                    raise
                self._t_out = _pc()
                self._k = k + 1
                return batch
            batch = ctl.out[k % ctl.slots]
        else:
            # the consumer's step (the time since the previous batch was returned) was long
            # twice in a row: a single pause (the machine's noise, a log line) starts nothing
            long = t - self._t_out >= WANT_STEP_NS
            want = long and self._long
            self._long = long
            # batch k - 1 goes back: the thread may prepare up to batch k + slots - 1. Written
            # before ``sleeping`` is read (see Ahead); a thread that sleeps reads it when woken.
            ctl.state[0] = k + ctl.slots
            if want is not ctl.want:
                ctl.want = want
            if want and ctl.sleeping:
                if self._thread is None:
                    self._start_thread()
                else:
                    ctl.wake_thread()
            slot = k % ctl.slots
            if ctl.ready[slot] == k:
                batch = ctl.out[slot]
            else:
                batch = self._take(ctl, k, slot)
        self._t_out = _pc()
        if batch.__class__ is Failure:
            self.close()
            raise batch.exc
        self._k = k + 1
        return batch

    @staticmethod
    def _unwait(ctl: Ahead) -> None:
        # clear our wait flag, or, if the thread released us meanwhile, take the release back
        with ctl.mutex:
            if ctl.waiting:
                ctl.waiting = False
            else:
                ctl.done.acquire(blocking=False)

    def _take(self, ctl: Ahead, k: int, slot: int):
        """Batch ``k`` when it is not ready: gather it here rather than wait for the thread; if
        the thread is gathering it, gather a later batch meanwhile if a slot is free, else wait."""
        from .kernels._loader import wait_change

        plan = self._plan
        spins = spin_reads()
        while True:
            if ctl.ready[slot] == k:
                return ctl.out[slot]
            if ctl.ready[slot] > k:  # never: the ring protocol broken, fail rather than wait for ever
                raise RuntimeError(f"tfdata: batch {ctl.ready[slot]} overwrote batch {k} in the prefetch ring")
            if (ctl.asleep or ctl.exited) and ctl.nxt == k and not ctl.failed:
                # the thread is asleep (only this thread can wake it) or gone: no lock needed;
                # everything it claimed is published, so batch k is the next to prepare
                ctl.nxt = k + 1
                try:
                    return plan.fill(plan.prepare(k), ahead=False)
                except BaseException as exc:  # noqa: BLE001
                    ctl.failed = True
                    return Failure(exc)
            work = None
            with ctl.mutex:
                j = ctl.nxt
                if ctl.ready[slot] == k:
                    continue
                if j < ctl.state[0] and j < ctl.batches and not ctl.failed:
                    ctl.nxt = j + 1
                    try:
                        work = plan.prepare(j)
                    except BaseException as exc:  # noqa: BLE001
                        ctl.failed = True
                        work = Failure(exc)
                else:
                    ctl.waiting = True
            if work is None:  # the thread is gathering batch k: wait for it
                # first spin without the GIL on the published counter (a wake-up costs far more
                # than a spin, more still under load: docs/design/loader.md), then sleep
                seen = int(ctl.state[1])
                if seen < k and wait_change(ctl.state, 1, seen, spins) != seen:
                    self._unwait(ctl)
                    continue
                if not ctl.done.acquire(timeout=0.05):
                    self._unwait(ctl)
                    if ctl.exited and ctl.ready[slot] != k and ctl.nxt <= k:
                        raise RuntimeError("tfdata: the prefetch thread stopped before batch "
                                           f"{k}") from None
                continue
            if work.__class__ is not Failure:
                try:
                    work = plan.fill(work, ahead=j > k)
                except BaseException as exc:  # noqa: BLE001
                    ctl.failed = True
                    work = Failure(exc)
            if j == k:
                return work
            ctl.publish(j, work)

    def close(self) -> None:
        """Stop the producer thread (waits for the batch it is gathering, if any)."""
        if self._closed:
            return
        self._closed = True
        t = self._thread
        loader = self._loader_ref()
        if loader is not None and self._ctl is not None:
            # what this epoch's consumer last did decides how the next epoch starts
            loader._worked = t is not None and self._ctl.want
        if t is not None:
            ctl = self._ctl
            ctl.stop = True
            ctl.wake_thread()
            if t is not threading.current_thread():
                t.join()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


_DONE = object()


class _AsyncEpoch:
    """``async for`` over an epoch: each wait runs in the event loop's default executor."""

    def __init__(self, epoch: _Epoch):
        self._epoch = epoch

    def __aiter__(self):
        return self

    def _next(self):
        try:
            return next(self._epoch)
        except StopIteration:
            return _DONE

    async def __anext__(self) -> Batch:
        import asyncio  # here, not at module level: ``import tfdata`` stays light

        loop = asyncio.get_running_loop()
        batch = await loop.run_in_executor(None, self._next)
        if batch is _DONE:
            raise StopAsyncIteration
        return batch

    async def aclose(self) -> None:
        self._epoch.close()

    def close(self) -> None:
        self._epoch.close()
