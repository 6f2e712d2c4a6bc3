"""Files, checkpoints and spilling: write, commit, open, scan, save/load, and the spilling buffer.

Every class takes the contender as its first parameter; the baselines (``"numpy..."``, raw
``"fdatasync"``) run in the same suite, so every figure has its ratio to a baseline inside the
same run. No figure is meaningful alone on a shared machine: read ratios.

What each class measures:

* ``Write``: ``time_write``, writing 5,242,880 CartPole rows (80 chunks of 65,536; 252 MB as
  48-byte AoS records, 241 MB as SoA) to a new file. ``"aos"``/``"soa"``: a ``tfdata.io.Writer``,
  one ``append`` per chunk, then one ``commit`` (which ``fdatasync``\\ s) and ``close``;
  ``"aos_save"``: ``tfdata.io.save`` of the same rows as one in-memory structured array (what
  numpy gets); ``"numpy"``: ``numpy.save`` of that array (no sync: the data may still be only in
  the page cache when it returns); ``"numpy_fsync"``: the same plus ``os.fsync``, the honest
  baseline of a durable write. ``WriteThroughput``: ``track_gb_per_s`` (data bytes written per
  second) of the same five, measured round-robin in one process (``setup_cache``), and
  ``track_vs_numpy_fsync``, each one's GB/s over ``numpy_fsync``'s.
* ``Commit``: ``time_commit``, committing 1,000 appended CartPole rows (48 KB) to an existing
  dataset: *fsync dominated*. An AoS commit is two ``fdatasync`` (the data, then the header
  rewritten in place); an SoA commit two per field file (6 fields here) plus the manifest's
  ``fsync`` and its directory's. ``"fdatasync"`` is the floor: ``pwrite`` of the same 48 KB at
  the end of a file and one ``fdatasync``. On a disk whose flush costs a fixed latency expect
  about 2x the floor for AoS and an order of magnitude more for SoA (14 flushes).
* ``Open``: ``time_open``, ``MmapDataset.open`` of a 1M-row CartPole dataset (header checked
  against the file size, mapped; the SoA directory: manifest plus six field files), against
  ``numpy.load(path, mmap_mode="r")`` of the same AoS file (``"numpy"``) and of each field file
  of the SoA directory, names known in advance (``"numpy_soa"``). Closing is not timed.
* ``Read``: ``time_scan``, a sequential read of the 252 MB file (241 MB SoA) *from the page
  cache* (every file is read once before timing): open, copy every row out chunk by chunk
  (65,536 rows, a byte copy of the records, or of each column, into one preallocated chunk),
  close. ``"aos"``/``"soa"``: through ``MmapDataset`` (``ds.records`` / ``ds.columns``);
  ``"numpy_mmap"``: the same copies from ``numpy.load(path, mmap_mode="r")``; ``"numpy_load"``:
  ``numpy.load(path)``, a full read into fresh memory (page faults of that memory included).
  Mapping a file anew faults in its pages (minor faults, from the page cache): that is part of
  every mmap contender's figure. ``ReadThroughput``: ``track_gb_per_s`` (data bytes per second)
  and ``track_vs_numpy_mmap``, measured round-robin in one process.
* ``CheckpointSave``: ``time_save`` and ``peakmem_save`` of ``buf.save(path)`` for a full
  1M-row CartPole buffer (``"cartpole"``: 52 MB AoS, 50 MB SoA, episode bookkeeping included)
  and a full 5,000-row Atari-like buffer (``"image"``: 282 MB; 20,000 rows would be 1.13 GB,
  more than this suite's files may take: raise :data:`IMAGE_CKPT_ROWS` for a measured run on
  a big machine). ``"numpy"``: the hand-written buffer of :mod:`benchmarks.common`, one
  ``numpy.save`` per field array into a directory plus a small JSON of its cursor;
  ``"numpy_fsync"``: the same with ``fsync`` of every file and the directory (tfdata's save
  syncs: its commit and its ``state.json``). ``peakmem_save`` is asv's peak RSS of the whole
  process, the buffer built in ``setup`` included (see ``CheckpointRSS`` for the save alone).
* ``CheckpointLoad``: ``time_load``, ``ReplayBuffer.load(path)`` of those checkpoints (read
  once before timing: from the page cache) against ``numpy.load`` of every field file.
* ``CheckpointRSS``: ``track_save_rss_ratio``, *(peak RSS during the save - RSS before the
  buffer was built) / buf.nbytes*: 1.0 means the save added nothing to the buffer's own
  memory; target <= 1.1 ("peak RSS during save stays within 1.1x of the buffer").
  ``track_load_rss_ratio``: *(peak RSS during the load - RSS before it) / loaded.nbytes*, the same
  for a load, which maps the rows file and releases each 16 MiB chunk it has copied: at most
  about 1 + 16 MiB / nbytes (1.3 for CartPole, 1.06 for image rows). The checkpoint it loads is
  written by a forked child, so this process's heap holds nothing freed to reuse. The peak
  is exact: the kernel's high-water mark (``VmHWM``) reset just before through
  ``/proc/self/clear_refs``; where that is not possible, a psutil thread samples RSS every ms.
* ``SpillSample``: ``time_sample``, ``sample(256)`` of 1 KB rows (1,008-byte AoS records) from
  a full 200,000-row buffer (202 MB): ``"hot"``, a spilling buffer whose ``hot_rows`` is its
  capacity (every row resident: the spilling machinery's own cost); ``"mixed"``, a spilling
  buffer with ``hot_bytes="32MB"`` (84% of the draws fall in the cold part: page faults from
  the page cache, and the releases that keep RSS near the hot size); ``"ram"``, the same
  buffer in memory (the reference).
* ``SpillFillRSS``: ``track_rss_over_hot``, the peak RSS growth while building and filling a
  280,000-row buffer of 1 KB rows (282 MB) with ``hot_bytes="32MB"`` (``"spill"``) or in RAM
  (``"ram"``, the control), over the 32 MiB hot size: a little over 1 when spilling works (the
  hot rows, plus what is written before the next release, 1/8 of the hot window at a time, the
  fill block and the per-row episode bookkeeping, 1.1 MB here), about 8.4 in RAM. RSS counts
  the spill file's mapped pages (``RssFile``).

Files: every process writes what it needs once, into one temporary directory removed at exit,
and keeps it in a module-level cache; files meant to be read "from the page cache" are read
through once before timing. asv re-runs ``setup`` before each timed call (see
:mod:`benchmarks.common`); files a timed call creates are removed in ``teardown``, untimed.
Writes leave dirty pages that the kernel writes back in the background: write figures are
noisier than the others.

    asv run --python=same --show-stderr -b bench_io            # measured
    asv run --python=same --quick --show-stderr -b bench_io    # smoke (CI)
"""

from __future__ import annotations

import atexit
import gc
import itertools
import json
import multiprocessing
import os
import shutil
import statistics
import sys
import threading
import time

import numpy as np
import psutil

import tfdata

from .common import (CARTPOLE, IMAGE, NumpyBuffer, read_through, build_and_fill, fill, fill_chunk, first_time, tmpdir,
                     random_rows, warm_kernels)

#: rows of the big CartPole files (Write, Read): 80 chunks of 65,536 (252 MB of AoS records)
CHUNK_ROWS = 65_536
FILE_ROWS = 80 * CHUNK_ROWS
#: rows of the file Open maps (its size barely matters: nothing is read)
OPEN_ROWS = 1_000_000
#: checkpointed buffers: 1M CartPole rows, and image rows (5,000: 282 MB; 20,000 is 1.13 GB)
CARTPOLE_CKPT_ROWS = 1_000_000
IMAGE_CKPT_ROWS = 5_000
CKPT = {"cartpole": (CARTPOLE, CARTPOLE_CKPT_ROWS), "image": (IMAGE, IMAGE_CKPT_ROWS)}

#: a 1 KB transition (1,006 data bytes, 1,008 per AoS record) for the spilling buffer
KB_ROW = tfdata.Spec({
    "obs": ("f4", (124,)),
    "action": "i8",
    "reward": "f4",
    "next_obs": ("f4", (124,)),
    "terminated": "?",
    "truncated": "?",
})
SPILL_ROWS = 200_000  # 202 MB
SPILL_FILL_ROWS = 280_000  # 282 MB
HOT = "32MB"  # 32 MiB (tfdata reads k, M, G as powers of 1024)
HOT_NBYTES = 32 << 20
SAMPLE_BATCH = 256

_MANY_SAMPLES = (200, 2000, 2.0)
# whole-file operations: a few readings of a fraction of a second to a few seconds each
_FILE_REPEAT = (3, 8, 10.0)


# -- files and caches -----------------------------------------------------------------------
_COUNTER = itertools.count()


def new_path(stem: str) -> str:
    """A path in :func:`tmpdir` that does not exist yet."""
    return os.path.join(tmpdir("io"), f"{stem}-{next(_COUNTER)}")


def remove(path: str | None) -> None:
    if path is None:
        return
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.unlink(path)


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_CACHE: dict = {}


def cached(key, make):
    """``make()`` once per process per ``key``."""
    value = _CACHE.get(key)
    if value is None:
        value = _CACHE[key] = make()
    return value


def cartpole_chunk() -> dict:
    """65,536 CartPole rows, one array per field (the chunk the suite fills buffers with)."""
    return fill_chunk(CARTPOLE)


def cartpole_records(rows: int) -> np.ndarray:
    """``rows`` CartPole rows as one structured array (``aos_dtype``), the chunk repeated."""
    def make():
        chunk = cartpole_chunk()
        block = np.empty(CHUNK_ROWS, CARTPOLE.aos_dtype)
        for name in CARTPOLE.names:
            block[name] = chunk[name]
        out = np.empty(rows, CARTPOLE.aos_dtype)
        for start in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - start)
            out[start:start + n] = block[:n]
        return out

    return cached(("records", rows), make)


def write_with_writer(path: str, layout: str, rows: int) -> None:
    """``rows`` CartPole rows through a Writer: one append per 65,536-row chunk, one commit."""
    chunk = cartpole_chunk()
    with tfdata.io.Writer(path, CARTPOLE, layout) as w:  # commits on a clean exit
        for start in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - start)
            w.append(chunk if n == CHUNK_ROWS else {k: v[:n] for k, v in chunk.items()})


def numpy_save(path: str, array: np.ndarray, sync: bool) -> None:
    if not sync:
        np.save(path, array, allow_pickle=False)
        return
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def dataset_file(layout: str, rows: int) -> str:
    """A committed CartPole dataset (AoS ``.npy`` or SoA directory), written once, read through."""
    def make():
        path = new_path(f"data-{layout}-{rows}") + (".npy" if layout == "aos" else "")
        write_with_writer(path, layout, rows)
        read_through(path)
        return path

    return cached(("file", layout, rows), make)


def data_nbytes(layout: str, rows: int) -> int:
    """Bytes of data in a file of ``rows`` CartPole rows (48 per AoS record, 46 per SoA row)."""
    return rows * (CARTPOLE.row_nbytes if layout == "soa" else CARTPOLE.aos_dtype.itemsize)


def in_child(fn, *args) -> None:
    """``fn(*args)`` in a forked child (so its memory never counts in this process); in-process
    where fork is not available. The child leaves through ``os._exit``: no atexit cleanup."""
    if "fork" not in multiprocessing.get_all_start_methods():
        fn(*args)
        return
    proc = multiprocessing.get_context("fork").Process(target=fn, args=args)
    sys.stdout.flush()  # the child flushes what it inherits: nothing twice
    sys.stderr.flush()
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"{fn.__name__}{args} failed in the child (exit code {proc.exitcode})")


def side_by_side(contenders: dict, rounds: int = 3) -> dict:
    """Median seconds of every contender, run round-robin in this process.

    ``contenders`` maps a key to ``(run, cleanup)``; one discarded round warms everything up.
    Round-robin puts every contender under the same machine state, so the ratios mean something.
    """
    times = {key: [] for key in contenders}
    for r in range(rounds + 1):
        for key, (run, cleanup) in contenders.items():
            t0 = time.perf_counter()
            run()
            t = time.perf_counter() - t0
            if cleanup is not None:
                cleanup()
            if r:
                times[key].append(t)
    return {key: statistics.median(v) for key, v in times.items()}


# -- peak RSS ---------------------------------------------------------------------------------
def rss() -> int:
    return psutil.Process().memory_info().rss


def _read_hwm() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _reset_hwm() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS (Linux); False if that is impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    hwm = _read_hwm()
    return hwm is not None and hwm <= rss() + (4 << 20)  # the reset took


class PeakRSS:
    """``with PeakRSS() as p: ...``: ``p.before`` and ``p.peak``, RSS before and at most inside.

    Exact where ``/proc/self/clear_refs`` resets ``VmHWM``; otherwise a psutil thread samples
    RSS every millisecond.
    """

    def __enter__(self):
        gc.collect()
        self.before = rss()
        self.exact = _reset_hwm()
        if not self.exact:
            self._stop = threading.Event()
            self._max = self.before
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        proc = psutil.Process()
        while not self._stop.is_set():
            self._max = max(self._max, proc.memory_info().rss)
            time.sleep(0.001)

    def __exit__(self, *exc):
        if self.exact:
            self.peak = max(_read_hwm() or 0, rss())
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self._max, rss())
        return False


# -- 1. writing -------------------------------------------------------------------------------
WRITE_CONTENDERS = ["aos", "soa", "aos_save", "numpy", "numpy_fsync"]


def write_op(layout: str):
    """``run(path)`` writing :data:`FILE_ROWS` CartPole rows as ``layout``, and its data bytes."""
    if layout in ("aos", "soa"):
        nbytes = data_nbytes(layout, FILE_ROWS)
        return (lambda path: write_with_writer(path, layout, FILE_ROWS)), nbytes
    records = cartpole_records(FILE_ROWS)
    if layout == "aos_save":
        return (lambda path: tfdata.io.save(path, records, "aos")), records.nbytes
    sync = layout == "numpy_fsync"
    return (lambda path: numpy_save(path, records, sync)), records.nbytes


class Write:
    """Write 5,242,880 CartPole rows (252 MB AoS) to a new file (see the module docstring)."""

    params = [WRITE_CONTENDERS]
    param_names = ["layout"]
    repeat = _FILE_REPEAT
    timeout = 300

    def setup(self, layout):
        self.run, _ = write_op(layout)
        self.path = new_path("write") + ("" if layout == "soa" else ".npy")

    def teardown(self, layout):
        remove(self.path)

    def time_write(self, layout):
        self.run(self.path)


class WriteThroughput:
    """GB/s of data written by each contender of :class:`Write`, round-robin in one process."""

    params = [WRITE_CONTENDERS]
    param_names = ["layout"]
    timeout = 600

    def setup_cache(self):
        contenders = {}
        nbytes = {}
        for layout in WRITE_CONTENDERS:
            run, nbytes[layout] = write_op(layout)
            path = new_path("write-rr") + ("" if layout == "soa" else ".npy")
            contenders[layout] = (lambda run=run, path=path: run(path),
                                  lambda path=path: remove(path))
        seconds = side_by_side(contenders, rounds=3)
        return {k: nbytes[k] / seconds[k] / 1e9 for k in WRITE_CONTENDERS}

    def track_gb_per_s(self, gbs, layout):
        return gbs[layout]

    track_gb_per_s.unit = "GB/s"

    def track_vs_numpy_fsync(self, gbs, layout):
        return gbs[layout] / gbs["numpy_fsync"]

    track_vs_numpy_fsync.unit = "ratio"


# -- commit -----------------------------------------------------------------------------------
class _WriterCommit:
    def __init__(self, layout: str, rows: int):
        path = new_path("commit") + (".npy" if layout == "aos" else "")
        write_with_writer(path, layout, CHUNK_ROWS)  # an existing, committed dataset
        self.w = tfdata.io.Writer.open(path)
        self.batch = random_rows(CARTPOLE, rows, seed=4)
        atexit.register(self.w.close, False)

    def append(self):
        self.w.append(self.batch)

    def commit(self):
        self.w.commit()


class _RawCommit:
    def __init__(self, rows: int):
        self.data = np.full(rows * CARTPOLE.aos_dtype.itemsize, 7, np.uint8)
        self.path = new_path("fdatasync")
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self.offset = 0
        self.append()
        os.fdatasync(self.fd)
        atexit.register(os.close, self.fd)

    def append(self):
        view = memoryview(self.data)
        while view.nbytes:
            n = os.pwrite(self.fd, view, self.offset)
            view = view[n:]
            self.offset += n

    def commit(self):
        os.fdatasync(self.fd)


class Commit:
    """Commit 1,000 appended CartPole rows (48 KB): fsync dominated (see the module docstring)."""

    params = [["aos", "soa", "fdatasync"]]
    param_names = ["layout"]
    rows = 1000
    repeat = (20, 300, 3.0)

    def setup(self, layout):
        if layout == "fdatasync":
            self.target = cached(("commit", layout), lambda: _RawCommit(self.rows))
        else:
            self.target = cached(("commit", layout), lambda: _WriterCommit(layout, self.rows))
        self.target.append()  # untimed: the commit alone is measured

    def time_commit(self, layout):
        self.target.commit()


# -- 2. opening -------------------------------------------------------------------------------
class Open:
    """Map a 1M-row CartPole dataset: ``MmapDataset.open`` vs ``numpy.load(mmap_mode="r")``."""

    params = [["aos", "soa", "numpy", "numpy_soa"]]
    param_names = ["layout"]
    repeat = _MANY_SAMPLES

    def setup(self, layout):
        warm_kernels()  # a dataset binds its kernels when opened: numba imported, kernels loaded
        self.path = dataset_file("soa" if layout.endswith("soa") else "aos", OPEN_ROWS)
        self.opened = None
        if layout == "numpy_soa":
            self.files = [os.path.join(self.path, name + ".npy") for name in CARTPOLE.names]
        if first_time("open", layout):
            self.time_open(layout)
            self.teardown(layout)

    def teardown(self, layout):
        if isinstance(self.opened, tfdata.MmapDataset):
            self.opened.close()
        self.opened = None

    def time_open(self, layout):
        if layout in ("aos", "soa"):
            self.opened = tfdata.MmapDataset.open(self.path)
        elif layout == "numpy":
            self.opened = np.load(self.path, mmap_mode="r")
        else:
            self.opened = [np.load(f, mmap_mode="r") for f in self.files]


# -- 3. sequential reads from the page cache --------------------------------------------------
READ_CONTENDERS = ["aos", "soa", "numpy_mmap", "numpy_load"]


def _byte_rows(arr: np.ndarray) -> np.ndarray:
    """uint8 ``(rows, row_bytes)`` view of a C-contiguous array."""
    return arr.reshape(arr.shape[0], -1).view(np.uint8)


def _copy_out(sources: list, outs: list, rows: int) -> None:
    """Copy ``rows`` rows of every byte-row source into its preallocated chunk, chunk by chunk."""
    for start in range(0, rows, CHUNK_ROWS):
        stop = min(rows, start + CHUNK_ROWS)
        for src, dst in zip(sources, outs):
            np.copyto(dst[:stop - start], src[start:stop])


def read_op(layout: str):
    """``run()`` reading the whole :data:`FILE_ROWS` file as ``layout``, and its data bytes."""
    file_layout = "soa" if layout == "soa" else "aos"
    path = dataset_file(file_layout, FILE_ROWS)
    nbytes = data_nbytes(file_layout, FILE_ROWS)
    if layout == "soa":
        outs = [np.empty((CHUNK_ROWS, f.nbytes), np.uint8) for f in CARTPOLE]
    else:
        outs = [np.empty((CHUNK_ROWS, CARTPOLE.aos_dtype.itemsize), np.uint8)]

    if layout in ("aos", "soa"):
        def run():
            ds = tfdata.MmapDataset.open(path)
            if ds.layout == "aos":
                _copy_out([_byte_rows(ds.records)], outs, len(ds))
            else:
                _copy_out([_byte_rows(ds.columns[f.name]) for f in ds.spec], outs, len(ds))
            ds.close()
    elif layout == "numpy_mmap":
        def run():
            arr = np.load(path, mmap_mode="r")
            _copy_out([_byte_rows(arr)], outs, arr.shape[0])
            del arr
    else:
        def run():
            arr = np.load(path)
            del arr
    return run, nbytes


class Read:
    """Open, copy out every row, close: the 252 MB file from the page cache (module docstring)."""

    params = [READ_CONTENDERS]
    param_names = ["layout"]
    repeat = _FILE_REPEAT
    timeout = 300

    def setup(self, layout):
        self.run, _ = cached(("read", layout), lambda: read_op(layout))
        if first_time("read", layout):
            self.run()

    def time_scan(self, layout):
        self.run()


class ReadThroughput:
    """GB/s of data read by each contender of :class:`Read`, measured round-robin in one process."""

    params = [READ_CONTENDERS]
    param_names = ["layout"]
    timeout = 600

    def setup_cache(self):
        ops = {layout: read_op(layout) for layout in READ_CONTENDERS}
        seconds = side_by_side({k: (run, None) for k, (run, _) in ops.items()}, rounds=5)
        return {k: ops[k][1] / seconds[k] / 1e9 for k in READ_CONTENDERS}

    def track_gb_per_s(self, gbs, layout):
        return gbs[layout]

    track_gb_per_s.unit = "GB/s"

    def track_vs_numpy_mmap(self, gbs, layout):
        return gbs[layout] / gbs["numpy_mmap"]

    track_vs_numpy_mmap.unit = "ratio"


# -- 4. checkpoints ---------------------------------------------------------------------------
def _fill_buffer(layout: str, kind: str):
    spec, rows = CKPT[kind]
    return build_and_fill("numpy" if layout.startswith("numpy") else layout, spec, rows)


def save_checkpoint(buf, layout: str, path: str) -> None:
    """``buf.save(path)``; for the numpy buffer one ``numpy.save`` per field array, and a JSON."""
    if not isinstance(buf, NumpyBuffer):
        try:
            buf.save(path, overwrite=True)  # a repeat may save over its own checkpoint
        except TypeError:  # tfdata 0.1 (asv continuous against an older commit): no overwrite=
            buf.save(path)
        return
    sync = layout == "numpy_fsync"
    os.makedirs(path)
    for name, arr in buf.arrays.items():
        numpy_save(os.path.join(path, name + ".npy"), arr[:buf.size], sync)
    with open(os.path.join(path, "state.json"), "w") as f:
        json.dump({"cursor": buf.cursor, "size": buf.size, "capacity": buf.capacity}, f)
        if sync:
            f.flush()
            os.fsync(f.fileno())
    if sync:
        fsync_dir(path)


def load_checkpoint(layout: str, kind: str, path: str):
    if layout.startswith("numpy"):
        spec, _ = CKPT[kind]
        with open(os.path.join(path, "state.json")) as f:
            state = json.load(f)
        return state, {name: np.load(os.path.join(path, name + ".npy")) for name in spec.names}
    return tfdata.ReplayBuffer.load(path)


def _build_and_save(layout: str, kind: str, path: str) -> None:
    save_checkpoint(_fill_buffer(layout, kind), layout, path)


def checkpoint_dir(layout: str, kind: str) -> str:
    """A checkpoint of a full buffer, written once per process and read through (page cache).

    The buffer is built and saved in a forked child: its memory never passes through this
    process's allocator, so a later load here starts from a clean heap (``track_load_rss_ratio``).
    """
    def make():
        path = new_path(f"ckpt-{layout}-{kind}")
        in_child(_build_and_save, layout, kind, path)
        read_through(path)
        return path

    return cached(("ckpt", layout, kind), make)


class CheckpointSave:
    """``buf.save(path)`` of a full buffer vs ``numpy.save`` per field (module docstring)."""

    params = [["aos", "soa", "numpy", "numpy_fsync"], ["cartpole", "image"]]
    param_names = ["layout", "data"]
    repeat = _FILE_REPEAT
    timeout = 300

    def setup(self, layout, kind):
        warm_kernels()
        self.buf = cached(("ckpt-buf", layout, kind), lambda: _fill_buffer(layout, kind))
        self.path = new_path("save")

    def teardown(self, layout, kind):
        remove(self.path)

    def time_save(self, layout, kind):
        save_checkpoint(self.buf, layout, self.path)

    def peakmem_save(self, layout, kind):
        save_checkpoint(self.buf, layout, self.path)


class CheckpointLoad:
    """``ReplayBuffer.load(path)`` vs ``numpy.load`` per field, from the page cache."""

    params = [["aos", "soa", "numpy"], ["cartpole", "image"]]
    param_names = ["layout", "data"]
    repeat = _FILE_REPEAT
    timeout = 300

    def setup(self, layout, kind):
        warm_kernels()
        self.path = checkpoint_dir(layout, kind)
        self.loaded = None

    def teardown(self, layout, kind):
        # freed untimed; a ReplayBuffer holds a reference cycle (``_fast_push`` keeps a bound
        # method of the buffer), so only the cyclic GC frees it: without the collection every
        # reading would leave its buffer behind and the next load would run short of memory
        self.loaded = None
        gc.collect()

    def time_load(self, layout, kind):
        self.loaded = load_checkpoint(layout, kind, self.path)


class CheckpointRSS:
    """Peak RSS of a save over the buffer's bytes, and of a load (see the module docstring)."""

    params = [["aos", "soa", "numpy"], ["cartpole", "image"]]
    param_names = ["layout", "data"]
    timeout = 300

    def setup(self, layout, kind):
        warm_kernels()
        fill_chunk(CKPT[kind][0])  # allocated before the baseline

    def track_save_rss_ratio(self, layout, kind):
        gc.collect()
        base = rss()
        buf = _fill_buffer(layout, kind)
        path = new_path("rss-save")
        with PeakRSS() as p:
            save_checkpoint(buf, layout, path)
        nbytes = buf.nbytes
        del buf
        remove(path)
        return (p.peak - base) / nbytes

    track_save_rss_ratio.unit = "ratio"

    def track_load_rss_ratio(self, layout, kind):
        path = checkpoint_dir(layout, kind)
        with PeakRSS() as p:
            loaded = load_checkpoint(layout, kind, path)
        if layout == "numpy":
            nbytes = sum(a.nbytes for a in loaded[1].values())
        else:
            nbytes = loaded.nbytes
        return (p.peak - p.before) / nbytes

    track_load_rss_ratio.unit = "ratio"


# -- 5. the spilling buffer -------------------------------------------------------------------
def kb_chunk() -> dict:
    """4,096 rows of 1 KB (4 MB), the block spilling buffers are filled with."""
    return cached("kb-chunk", lambda: random_rows(KB_ROW, 4096, seed=5))


def new_kb_buffer(layout: str, capacity: int, residency: str):
    """An empty buffer of 1 KB rows: in RAM, spilling with every row hot, or with 32 MiB hot."""
    if residency == "ram":
        return tfdata.ReplayBuffer(KB_ROW, capacity, layout=layout, seed=0)
    path = new_path("spill") + (".npy" if layout == "aos" else "")
    if residency == "hot":
        return tfdata.ReplayBuffer(KB_ROW, capacity, layout=layout, seed=0, spill_path=path,
                                   hot_rows=capacity)
    return tfdata.ReplayBuffer(KB_ROW, capacity, layout=layout, seed=0, spill_path=path,
                               hot_bytes=HOT)


class SpillSample:
    """``sample(256)`` of 1 KB rows from 200,000: all hot, mostly cold (32 MiB hot), in RAM."""

    params = [["aos", "soa"], ["hot", "mixed", "ram"]]
    param_names = ["layout", "residency"]
    repeat = _MANY_SAMPLES
    timeout = 300

    def setup(self, layout, residency):
        warm_kernels()

        def make():
            buf = new_kb_buffer(layout, SPILL_ROWS, residency)
            fill(buf, SPILL_ROWS, kb_chunk())
            return buf

        self.buf = cached(("spill", layout, residency), make)
        if first_time("spill-sample", layout, residency):
            for _ in range(300):  # the output ring, and the mixed buffer's fault/release cycle
                self.buf.sample(SAMPLE_BATCH)

    def time_sample(self, layout, residency):
        self.buf.sample(SAMPLE_BATCH)


class SpillFillRSS:
    """Peak RSS growth while building and filling 282 MB of 1 KB rows, over the 32 MiB hot size."""

    params = [["aos", "soa"], ["spill", "ram"]]
    param_names = ["layout", "residency"]
    timeout = 300

    def setup(self, layout, residency):
        warm_kernels()
        kb_chunk()

    def track_rss_over_hot(self, layout, residency):
        with PeakRSS() as p:
            buf = new_kb_buffer(layout, SPILL_FILL_ROWS, "mixed" if residency == "spill" else "ram")
            fill(buf, SPILL_FILL_ROWS, kb_chunk())
        del buf
        return (p.peak - p.before) / HOT_NBYTES

    track_rss_over_hot.unit = "ratio"
