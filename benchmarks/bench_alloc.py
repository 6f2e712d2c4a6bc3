"""Allocators: where a buffer's memory comes from, and when that matters.

tfdata can take the memory of its rows and sampled batches from five allocators
(:data:`tfdata.alloc.NAMES`): ``"numpy"`` (the system malloc through numpy, the default),
``"jemalloc"`` and ``"mimalloc"`` (Debian's libraries loaded with ctypes), and ``"hugepages"`` /
``"nohugepages"`` (one anonymous ``mmap`` per array, advised transparent huge pages on or off).
These benchmarks put them side by side, in the same run, on the operations where an allocator
could plausibly change something:

* ``Construct``: build a 1M-row CartPole buffer and fill it once. This is the first touch of
  fresh memory, where the allocator decides how many page faults are taken (4 KiB pages or
  2 MiB huge pages) and whether ``zeros`` is lazy (fresh pages are zero) or an eager memset.
  ``setup`` trims the allocator, so every repeat starts from memory given back to the OS, as
  the one buffer of a training run does; ``track_construct_only`` is the construction alone
  (no fill) and ``track_minor_faults`` the page faults of construction + fill.
* ``Sample``: ``sample(256)`` from a filled 1M-row CartPole buffer (46 MB). In steady state
  the memory is resident and the sample's output ring is reused, so the allocator is expected
  *not* to matter: equal figures here are a finding, not a wasted benchmark.
* ``GatherHugePages``: ``sample(4096)`` of Atari-like rows (56 KB each, 231 MB per batch) from
  a 484 MiB buffer, for ``numpy``, ``hugepages`` and ``nohugepages`` only. Random rows spread
  over half a gigabyte miss the TLB with 4 KiB pages (each row spans 14 of them; the buffer is
  124,000 pages, far more than any TLB), much less with 2 MiB pages (242 of them): this is where
  huge pages can matter. ``"numpy"`` is not a clean "off": numpy itself advises huge pages for
  arrays of 4 MiB and more, hence the explicit ``"nohugepages"`` control. ``HugePageCoverage``
  checks what the kernel actually granted (``AnonHugePages`` over the buffer's bytes): on a
  busy machine with fragmented memory the advice can be ignored, and the timing with it.
* ``Churn``: a naive loop that allocates and frees batch-sized arrays of varying sizes (4 KiB
  to 4 MiB, log-uniform, seeded) through ``tfdata.alloc.get(name).empty``, keeping a sliding
  window of the last 64 alive and writing one byte every 4 KiB of each (every page touched,
  without turning the loop into a memory-bandwidth test). This is the allocation pattern where
  allocators really differ: reuse of freed blocks versus ``mmap``/``munmap`` and fresh page
  faults each time, and how much memory is kept afterwards (``track_rss_growth``: resident
  bytes after the loop, the window released, minus before; not trimmed, so memory an allocator
  caches for reuse counts). Buffers are not involved, so the only parameter is the allocator.

Every buffer class takes the layout first, then the allocator. ``layout="numpy"`` is the
hand-written baseline of :mod:`benchmarks.common`, here with its per-field arrays taken from the
allocator (its sampled batches are plain numpy fancy-indexing results whatever the allocator).

An allocator that cannot be loaded (library not installed; Debian's jemalloc without
``GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096`` in the environment when Python started:
``python dev.py bench`` sets it, and asv passes its environment on to the benchmark processes)
skips the benchmark (asv's ``NotImplementedError``), with the reason on stderr, unless
``TFDATA_REQUIRE_ALLOCATORS=1``: then it fails loudly, so CI cannot silently lose a column.
"""

from __future__ import annotations

import collections
import gc
import math
import os
import resource
import statistics
import sys
import time

import numpy as np

import tfdata

from .common import (CARTPOLE, IMAGE, LAYOUTS, NumpyBuffer, fill, fill_chunk, first_time,
                     random_rows, warm_kernels)

ALLOCATORS = list(tfdata.alloc.NAMES)
#: the allocators of the huge-page comparison: the default, and an explicit on and off
HUGE_ALLOCATORS = ["numpy", "hugepages", "nohugepages"]

CAPACITY = 1_000_000  # CartPole rows: 46 MB of data
IMAGE_ROWS = 9_000  # Atari-like rows: 484 MiB, under the 512 MiB this suite allows itself

REQUIRE_ENV = "TFDATA_REQUIRE_ALLOCATORS"


def require(name: str) -> tfdata.alloc.Allocator:
    """The shared handle of allocator ``name``; skip the benchmark if it cannot be loaded.

    With ``TFDATA_REQUIRE_ALLOCATORS=1`` in the environment an unavailable allocator raises
    RuntimeError instead (a failed benchmark, not a skipped one).
    """
    ok, why = tfdata.alloc.available(name)
    if ok:
        return tfdata.alloc.get(name)
    if os.environ.get(REQUIRE_ENV) == "1":
        raise RuntimeError(f"allocator {name!r} is not available and {REQUIRE_ENV}=1: {why}")
    print(f"skipped: allocator {name!r} is not available ({why}); "
          f"set {REQUIRE_ENV}=1 to make this a failure", file=sys.stderr)
    raise NotImplementedError(why)


class AllocNumpyBuffer(NumpyBuffer):
    """:class:`benchmarks.common.NumpyBuffer` whose per-field arrays come from ``allocator``."""

    def __init__(self, spec: tfdata.Spec, capacity: int, allocator: str, seed: int = 0):
        super().__init__(spec, 0, seed=seed)  # empty arrays: sets every other attribute
        a = tfdata.alloc.get(allocator)
        self.capacity = capacity
        self.arrays = {f.name: a.zeros((capacity,) + f.shape, f.dtype) for f in spec}
        self._items = list(self.arrays.items())


def new_buffer(layout: str, spec: tfdata.Spec, capacity: int, allocator: str):
    if layout == "numpy":
        return AllocNumpyBuffer(spec, capacity, allocator)
    return tfdata.ReplayBuffer(spec, capacity, layout=layout, seed=0, allocator=allocator)


def build_and_fill(layout: str, spec: tfdata.Spec, capacity: int, allocator: str, chunk=None):
    buf = new_buffer(layout, spec, capacity, allocator)
    fill(buf, capacity, _chunk(spec) if chunk is None else chunk)
    return buf


_FILLED: dict = {}


def filled_buffer(layout: str, spec: tfdata.Spec, capacity: int, allocator: str):
    """A full buffer, built once per process and cached (every page touched before timing)."""
    key = (layout, spec, capacity, allocator)
    buf = _FILLED.get(key)
    if buf is None:
        buf = _FILLED[key] = build_and_fill(layout, spec, capacity, allocator)
    return buf


_CHUNK: dict = {}


def _chunk(spec):
    """Fill blocks for ``spec``: common's for CartPole; for image rows 250 rows (14 MB) instead of
    common's 1000 (56 MB), so that the block adds little to the process's memory."""
    if spec is not IMAGE:
        return fill_chunk(spec)
    chunk = _CHUNK.get(spec)
    if chunk is None:
        chunk = _CHUNK[spec] = random_rows(spec, 250, seed=1)
    return chunk


def _fresh(allocator: tfdata.alloc.Allocator) -> None:
    """Give freed memory back to the OS, so the next buffer first-touches fresh pages."""
    gc.collect()
    allocator.trim()


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


class Construct:
    """Build a 1M-row CartPole buffer and fill it once (first touch of its memory).

    ``peakmem_construct`` is the process's peak RSS (numba and the kernels loaded in every case).
    """

    params = [LAYOUTS, ALLOCATORS]
    param_names = ["layout", "allocator"]
    repeat = (3, 10, 10.0)
    timeout = 300

    def setup(self, layout, allocator):
        self.alloc = require(allocator)
        warm_kernels()
        fill_chunk(CARTPOLE)
        _fresh(self.alloc)

    def time_construct(self, layout, allocator):
        build_and_fill(layout, CARTPOLE, CAPACITY, allocator)

    def peakmem_construct(self, layout, allocator):
        build_and_fill(layout, CARTPOLE, CAPACITY, allocator)

    def track_construct_only(self, layout, allocator):
        """Seconds to construct the (empty) buffer: median of 5, memory trimmed before each.

        Near zero when ``zeros`` is lazy; an eager memset of all 46 MB shows here."""
        times = []
        for _ in range(5):
            _fresh(self.alloc)
            t0 = time.perf_counter()
            buf = new_buffer(layout, CARTPOLE, CAPACITY, allocator)
            times.append(time.perf_counter() - t0)
            del buf
        return statistics.median(times)

    track_construct_only.unit = "seconds"

    def track_minor_faults(self, layout, allocator):
        """Page faults of construction + fill: 11,000-13,000 with 4 KiB pages, ~25 with 2 MiB pages."""
        f0 = _minor_faults()
        buf = build_and_fill(layout, CARTPOLE, CAPACITY, allocator)
        faults = _minor_faults() - f0
        del buf
        return faults

    track_minor_faults.unit = "faults"


class _SampleFilled:
    """Time ``sample(batch)`` from a filled buffer of ``spec`` and ``rows`` (subclasses set them)."""

    param_names = ["layout", "allocator"]
    timeout = 300

    def setup(self, layout, allocator):
        require(allocator)
        warm_kernels()
        self.buf = filled_buffer(layout, self.spec, self.rows, allocator)
        if first_time(type(self).__name__, layout, allocator):
            for _ in range(3):  # allocates this batch size's output ring, and touches it
                self.buf.sample(self.batch)

    def time_sample(self, layout, allocator):
        self.buf.sample(self.batch)


class Sample(_SampleFilled):
    """``sample(256)`` from a full 1M-row CartPole buffer (steady state: memory resident)."""

    params = [LAYOUTS, ALLOCATORS]
    repeat = (200, 2000, 2.0)
    spec, rows, batch = CARTPOLE, CAPACITY, 256


class GatherHugePages(_SampleFilled):
    """``sample(4096)`` of Atari-like rows (231 MB per batch) from a 484 MiB buffer.

    The TLB case: thousands of random 56 KB rows over half a gigabyte. Compare ``hugepages``
    with ``nohugepages`` (``numpy`` is the default, usually huge pages through numpy's advice).
    """

    params = [LAYOUTS, HUGE_ALLOCATORS]
    repeat = (10, 100, 3.0)
    spec, rows, batch = IMAGE, IMAGE_ROWS, 4096


class HugePageCoverage:
    """Transparent huge pages actually granted to a freshly filled 484 MiB image buffer.

    ``track_huge_fraction``: growth of the process's ``AnonHugePages`` across build + fill,
    divided by the buffer's data bytes. About 1.0 means the whole buffer sits in 2 MiB pages
    (``hugepages``, and ``numpy`` through numpy's advice), 0 means none (``nohugepages``); a
    ``hugepages`` figure well below 1 means the kernel refused (fragmented memory, THP
    disabled), and ``GatherHugePages`` then compares nothing.
    """

    params = [LAYOUTS, HUGE_ALLOCATORS]
    param_names = ["layout", "allocator"]
    timeout = 300

    def setup(self, layout, allocator):
        require(allocator)
        warm_kernels()
        _chunk(IMAGE)

    def track_huge_fraction(self, layout, allocator):
        before = tfdata.memory.snapshot(uss=False)["huge"]
        buf = build_and_fill(layout, IMAGE, IMAGE_ROWS, allocator)
        after = tfdata.memory.snapshot(uss=False)["huge"]
        del buf
        if before < 0 or after < 0:
            raise NotImplementedError("AnonHugePages is not reported on this system")
        return (after - before) / (IMAGE.row_nbytes * IMAGE_ROWS)

    track_huge_fraction.unit = "ratio"


class Churn:
    """Allocate and free 1000 arrays of 4 KiB to 4 MiB (log-uniform, seeded; ~0.6 GB in all),
    keeping the last 64 alive and touching every page of each, through one allocator."""

    params = [ALLOCATORS]
    param_names = ["allocator"]
    repeat = (3, 10, 10.0)
    timeout = 300
    allocations = 1000
    window = 64
    min_size = 4 << 10
    max_size = 4 << 20

    def setup(self, allocator):
        self.alloc = require(allocator)
        warm_kernels()
        rng = np.random.default_rng(0)
        logs = rng.uniform(math.log(self.min_size), math.log(self.max_size), self.allocations)
        self.sizes = np.exp(logs).astype(np.int64).tolist()

    def _churn(self) -> collections.deque:
        empty = self.alloc.empty
        live = collections.deque()
        window = self.window
        for n in self.sizes:
            a = empty(n, np.uint8)
            a[::4096] = 1  # one byte every 4 KiB: every page touched
            live.append(a)
            if len(live) > window:
                live.popleft()  # freed here: the allocator gets it back
        return live

    def time_churn(self, allocator):
        self._churn()

    def track_rss_growth(self, allocator):
        """RSS after the loop, every array freed (not trimmed), minus RSS before, in bytes."""
        gc.collect()
        before = tfdata.memory.snapshot(uss=False)["rss"]
        live = self._churn()
        live.clear()
        gc.collect()
        return tfdata.memory.snapshot(uss=False)["rss"] - before

    track_rss_growth.unit = "bytes"
