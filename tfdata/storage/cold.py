"""The compressed cold tier of a spilling frame-stacked buffer (``compress_cold=True``): the
frames of a stacked field's blocks that left the hot window, compressed in RAM (one ``bytes``
per block of :data:`BLOCK` slots), and the cache of decompressed blocks a sample reads them
from. The file keeps every row: the tier is a cache of it, dropped block by block when the
memory budget needs room. How it compresses, stays exact, samples and budgets:
docs/design/spill-and-cold.md.
"""

from __future__ import annotations

import sys

import numpy as np

#: the codec of the cold tier (see :func:`codec`) and its compression level, and the slots per
#: compressed block (the unit of compression and of decompression): chosen in reports/frame_codecs.
CODEC = "zstd"
LEVEL = 3
BLOCK = 16
#: bytes of decompressed blocks kept (at least 2 blocks): the blocks of a sample are decompressed
#: into it, in passes of that many blocks when a sample needs more
CACHE_BYTES = 4 << 20


class _Zstd:
    """zstd through the ``zstandard`` package: ``compress`` returns a new ``bytes``;
    ``decompress_into`` fills the caller's memory (no copy of the frames)."""

    package = "zstandard"

    def __init__(self, level: int = LEVEL):
        import zstandard

        self._c = zstandard.ZstdCompressor(level=level)
        self._d = zstandard.ZstdDecompressor()

    def compress(self, data) -> bytes:
        return self._c.compress(data)

    def decompress_into(self, blob: bytes, dst: memoryview) -> None:
        reader = self._d.stream_reader(blob)
        n = reader.readinto(dst)
        while 0 < n < len(dst):  # a reader may return less than asked: read on
            got = reader.readinto(dst[n:])
            if got <= 0:
                break
            n += got
        if n != len(dst):
            raise RuntimeError(f"cold tier: a block decompressed to {n} bytes, expected {len(dst)}")


_CODECS = {"zstd": _Zstd}


def codec(name: str | None = None):
    """The codec ``name`` (an object with ``compress(data) -> bytes`` and
    ``decompress_into(blob, dst)``); ImportError naming the ``compress`` extra when its package
    is not installed."""
    name = CODEC if name is None else name
    cls = _CODECS[name]
    try:
        return cls()
    except ImportError:
        raise ImportError(f"compress_cold=True needs the package {cls.package!r} (codec {name}): "
                          f"pip install 'tfdata[compress]'") from None


def cache_blocks(frame_nbytes: int, block: int) -> int:
    return max(2, CACHE_BYTES // max(1, block * frame_nbytes))


def planned_nbytes(capacity: int, hot_rows: int, frame_nbytes: int) -> tuple:
    """``(fixed, bound)``: bytes of the tier's tables and cache (exact), and a bound of its
    compressed blocks (every block that can be cold, at its uncompressed size: a copy is kept
    only when smaller)."""
    block = BLOCK
    nblocks = -(-capacity // block)
    c = cache_blocks(frame_nbytes, block)
    fixed = nblocks * (5 * 4 + 8) + c * (block * frame_nbytes + 4 * 8 + 4)
    cold = min(capacity, capacity - hot_rows + block)  # the cold rows, and the cursor's block
    return int(fixed), int(max(0, cold) * frame_nbytes)


class ColdFrames:
    """The compressed cold tier of one stacked field (see the module docstring). Every method
    is called under the buffer's lock.

    Parameters
    ----------
    words : ndarray of uintX, shape (capacity, width)
        The field's frame column in the storage (a column of its own: each slot's frame is
        ``width`` words, slots contiguous).
    hot_rows : int
        The spill policy's hot window: a block is compressed once its slots are older.
    room : callable or None
        ``room()``: bytes the memory budget has left (None: no budget).
    codec_name : str
    block : int
        Slots per block.

    Attributes
    ----------
    cold_from : ndarray of int32, shape (nblocks,)
    cache_map : ndarray of int32, shape (nblocks,)
    cache : ndarray of uintX, shape (C, block, width)
    mark, need, reach : ndarray of int32, shape (nblocks,)
        Scratch of the listing kernel.
    filled : ndarray of int64, shape (C,)
        Frames decompressed in each cache slot (from the block's first).
    compressed : int
        Bytes of the compressed copies held (``sys.getsizeof`` of each ``bytes``).
    refused : int
        Blocks not kept: over the budget or not compressible.
    """

    def __init__(self, words: np.ndarray, hot_rows: int, allocator, room=None,
                 codec_name: str | None = None, block: int | None = None):
        codec_name = CODEC if codec_name is None else codec_name
        block = BLOCK if block is None else block
        self.codec = codec(codec_name)
        self.codec_name = codec_name
        if words.ndim != 2 or not words.flags.c_contiguous:
            raise ValueError("cold tier: the frames must be a C-contiguous column (capacity, width)")
        self.words = words
        self.capacity, self.width = words.shape
        self.frame_nbytes = self.width * words.itemsize
        self.block = block
        self.hot_rows = hot_rows
        self.room = room
        self.nblocks = -(-self.capacity // block)
        a = allocator
        self.cold_from = a.empty(self.nblocks, np.int32)
        self.cold_from[:] = block
        self.cache_map = a.empty(self.nblocks, np.int32)
        self.cache_map[:] = -1
        self.mark = a.zeros(self.nblocks, np.int32)
        self.need = a.zeros(self.nblocks, np.int32)
        self.reach = a.zeros(self.nblocks, np.int32)
        c = cache_blocks(self.frame_nbytes, block)
        self.cache = a.zeros((c, block, self.width), words.dtype)
        self._cache_bytes = [memoryview(self.cache[i].reshape(-1).view(np.uint8)) for i in range(c)]
        self.slot_block = a.empty(c, np.int64)
        self.slot_block[:] = -1
        self.filled = a.zeros(c, np.int64)
        self.slot_used = a.zeros(c, np.int64)
        self.slot_pass = a.zeros(c, np.int64)
        self.todo = a.zeros(c, np.int32)
        from ..kernels._cold import cold_assign

        self._assign = cold_assign
        self.blobs = [None] * self.nblocks
        self.compressed = 0
        self.refused = 0
        self.shed_blocks = 0  # copies dropped to make room in the memory budget
        self.decompressed = 0  # blocks decompressed by samples (a counter for measurements)
        self.written = 0  # ring position of the next row (rows written since clear)
        self.done = 0  # ring position up to which blocks were considered for compression
        self.gen = 0
        self._clock = 0
        self._pass = 0

    @property
    def nbytes(self) -> int:
        return int(self.cold_from.nbytes + self.cache_map.nbytes + self.mark.nbytes + self.need.nbytes
                   + self.reach.nbytes + 8 * self.nblocks + self.cache.nbytes + self.slot_block.nbytes
                   + self.filled.nbytes + self.slot_used.nbytes + self.slot_pass.nbytes
                   + self.todo.nbytes + self.compressed)

    @property
    def blocks(self) -> int:
        """Blocks whose compressed copy is held."""
        return sum(b is not None for b in self.blobs)

    def info(self) -> dict:
        held = self.blocks
        raw = sum(self._len(b) for b, blob in enumerate(self.blobs) if blob is not None) * self.frame_nbytes
        data = sum(len(blob) for blob in self.blobs if blob is not None)
        return {"codec": self.codec_name, "block": self.block, "blocks": held, "raw_bytes": raw,
                "compressed_bytes": data, "ratio": raw / data if data else 0.0,
                "refused": self.refused, "shed": self.shed_blocks, "decompressed": self.decompressed}

    def _len(self, b: int) -> int:
        return min(self.block, self.capacity - b * self.block)

    # -- writing ----------------------------------------------------------------------------
    def after_write(self, spans, n: int) -> None:
        """``n`` rows were written at ``spans`` (``(dst, src, count)``, ring order): move the
        validity of the blocks they overwrote, then compress the blocks that left the hot
        window."""
        cf, bl = self.cold_from, self.block
        for dst, _src, count in spans:
            if count <= 0:
                continue
            for b in range(dst // bl, (dst + count - 1) // bl + 1):
                start = b * bl
                hi = min(dst + count, start + self._len(b)) - start
                if hi >= self._len(b):
                    if self.blobs[b] is not None or cf[b] < bl:
                        self._drop(b)
                elif cf[b] < hi:
                    cf[b] = hi
        self.written += n
        self._catch_up()

    def _catch_up(self) -> None:
        """Compress every block wholly in ``[done, written - hot_rows)`` (ring positions)."""
        cap, bl = self.capacity, self.block
        cold_end = self.written - self.hot_rows
        lo = self.written - cap  # positions before this were overwritten since
        if self.done < lo:
            self.done = lo
        while self.done < cold_end:
            slot = self.done % cap
            b = slot // bl
            end = self.done + (b * bl + self._len(b) - slot)
            if end > cold_end:
                break
            if slot == b * bl:  # the whole block (a block entered in its middle is left in the file)
                self._compress(b)
            self.done = end

    def _compress(self, b: int) -> None:
        start, n = b * self.block, self._len(b)
        raw = self.words[start:start + n]
        blob = self.codec.compress(raw)
        size = sys.getsizeof(blob)
        old = self.blobs[b]
        grow = size - (0 if old is None else sys.getsizeof(old))
        if size >= raw.nbytes or (self.room is not None and grow > 0 and grow > self.room()):
            self.refused += 1
            self._drop(b)
            return
        self._uncache(b)
        self.blobs[b] = blob
        self.compressed += grow
        self.cold_from[b] = 0

    def _uncache(self, b: int) -> None:
        c = int(self.cache_map[b])
        if c >= 0:
            self.cache_map[b] = -1
            self.slot_block[c] = -1

    def _drop(self, b: int) -> None:
        old = self.blobs[b]
        if old is not None:
            self.compressed -= sys.getsizeof(old)
            self.blobs[b] = None
        self.cold_from[b] = self.block
        self._uncache(b)

    def shed(self, nbytes: int) -> int:
        """Drop copies until ``nbytes`` are freed (or none is left), the oldest rows' first (the
        blocks from the cursor on: the next to be overwritten); their frames are read from the
        file. Returns the bytes freed."""
        freed, first = 0, (self.written % self.capacity) // self.block
        for i in range(self.nblocks):
            if freed >= nbytes:
                break
            b = (first + i) % self.nblocks
            blob = self.blobs[b]
            if blob is not None:
                freed += sys.getsizeof(blob)
                self._drop(b)
                self.shed_blocks += 1
        return freed

    def reset(self) -> None:
        """Forget every copy (the buffer was cleared)."""
        self.blobs = [None] * self.nblocks
        self.compressed = 0
        self.cold_from[:] = self.block
        self.cache_map[:] = -1
        self.slot_block[:] = -1
        self.written = self.done = 0

    def rebuild(self, cursor: int, size: int) -> None:
        """After the storage was loaded whole (a state dict): compress every block of the rows
        held that is out of the hot window, as if they had just been written."""
        self.reset()
        self.written = size if size < self.capacity else self.capacity + cursor
        self.done = self.written - size
        self._catch_up()

    # -- sampling ---------------------------------------------------------------------------
    def next_gen(self) -> int:
        """The listing kernel's mark for a new sample (``mark`` cleared when it would wrap)."""
        self.gen += 1
        if self.gen >= 2**31 - 1:
            self.mark[:] = 0
            self.gen = 1
        return self.gen

    def load(self, start: int, count: int) -> int:
        """Cache the listed blocks ``need[start:count]``, as many as the cache holds in one pass
        (blocks cached already count, and are kept); returns the index of the first block left
        for the next pass (``count``: all cached)."""
        self._pass += 1
        done, n, self._clock = self._assign(self.need, self.reach, start, count, self.cache_map,
                                            self.slot_block, self.filled, self.slot_used,
                                            self.slot_pass, self._pass, self._clock, self.todo)
        k = 0
        try:
            for k in range(n):
                c = int(self.todo[k])
                b = int(self.slot_block[c])
                frames = min(int(self.filled[c]), self._len(b))  # up to the last frame needed
                self.filled[c] = frames
                view = self._cache_bytes[c]
                size = frames * self.frame_nbytes
                self.codec.decompress_into(self.blobs[b], view if size == len(view) else view[:size])
                self.decompressed += 1
        except BaseException:
            for j in range(k, n):  # slots not filled hold no block
                c = int(self.todo[j])
                self.cache_map[self.slot_block[c]] = -1
                self.slot_block[c] = -1
            raise
        return done
