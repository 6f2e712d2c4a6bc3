"""Hot/cold spilling: a replay buffer whose rows live in a file, with only the recent ones in RAM.

The storage arrays are a writable shared mapping of a dataset file (``tfdata.io.map_storage``):
one ring of ``capacity`` slots, so sampling, writing and wrap-around work exactly as in RAM.
:class:`Spill` decides which pages stay: the ``hot_rows`` rows behind the write cursor; rows
that leave that window are released (``MADV_DONTNEED``: their data stays in the page cache and
reaches the file), and so are cold rows a sample pulled in, once the file-backed resident set
(``/proc/self/statm``: one row can map a 2 MiB folio, so estimating does not work) exceeds the
hot size by a margin. The spill file is the storage, not a checkpoint: never committed or
synced, and never replacing a file (use :meth:`ReplayBuffer.save` for a checkpoint). See
docs/design/spill-and-cold.md.
"""

from __future__ import annotations

from .mapping import ResidentFile
from .npy import PAGE


class Spill:
    """The release policy of one spilling buffer; called by the buffer under its lock.

    Parameters
    ----------
    storage_maps : list of (MappedFile, row_bytes)
    capacity, hot_rows : int
    row_nbytes : int
        Bytes of one stored row (all files together).
    """

    def __init__(self, storage_maps: list, capacity: int, hot_rows: int, row_nbytes: int):
        self.maps = storage_maps
        self.capacity = capacity
        self.hot_rows = hot_rows
        self.hot_bytes = hot_rows * row_nbytes
        # release in chunks of 1/8 of the hot window (at least 64 pages): few syscalls
        self.chunk = max(1, hot_rows // 8, (64 * PAGE) // max(1, row_nbytes))
        self.released_to = 0  # rows before this position (ring order, behind the hot window) are released
        self.written = 0  # rows written in total
        self.probe = ResidentFile()
        self.base = self.probe.file_bytes()
        self.slack = max(self.hot_bytes // 4, 16 << 20)

    def _release(self, start: int, stop: int) -> None:
        """Release ring rows ``[start, stop)`` (positions may exceed capacity: taken mod capacity)."""
        c = self.capacity
        if stop - start >= c:
            start, stop = 0, c
        a, b = start % c, stop % c
        spans = [(a, b)] if a < b else [(a, c), (0, b)]
        for s, e in spans:
            if e > s:
                for mf, width in self.maps:
                    mf.release(s * width, e * width)

    def after_write(self, n: int) -> None:
        """``n`` rows were just written at the cursor: release what left the hot window."""
        self.written += n
        cold_end = self.written - self.hot_rows  # rows before this are cold
        if cold_end - self.released_to >= self.chunk:
            self._release(self.released_to, cold_end)
            self.released_to = cold_end

    def after_sample(self) -> None:
        """:meth:`check_resident`, after every sample: one sample can map a large folio per row,
        so checking less often lets RSS run away."""
        self.check_resident()

    def check_resident(self) -> None:
        """Release the cold part if reads or in-place writes anywhere in the ring (samples, a
        relabelling) have made too much of it resident."""
        now = self.probe.file_bytes()
        if now < self.base:
            # the process's file-backed bytes are what is measured: when other mappings went
            # away since this buffer was built (another spilling buffer freed), the baseline
            # follows them down, or this buffer could keep that much more of its cold part
            self.base = now
        if now - self.base > self.hot_bytes + self.slack:
            self.release_cold()

    def release_cold(self) -> None:
        """Release the cold part of the ring: every row but the hot window (wrap-aware)."""
        cold_end = self.written - self.hot_rows
        if cold_end > 0:
            self._release(self.written, self.written + self.capacity - self.hot_rows)
            self.released_to = cold_end

    def reset(self) -> None:
        self._release(0, self.capacity)
        self.written = self.released_to = 0
