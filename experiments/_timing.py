"""How the experiments time calls and measure memory: per-call timers with an untimed setup,
call counts sized to a time budget, candidates interleaved in rounds or timed in slices
(:class:`SliceTimer`, :func:`run_rounds`) so that a change of machine load hits every candidate
alike, and measurements in fresh processes (a forked child with its own RSS, :func:`run_forked`;
one fresh interpreter per variant and seed, :func:`run_in_fresh_processes`); the references
a copy is timed against (:class:`Memcpy`), and the page cache of spill files (drop it, read how
much of a file it holds).

numpy and psutil are imported inside the functions that need them.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time

# -- timing calls -----------------------------------------------------------------------------
def time_calls(fn, arg, n: int, setup=None):
    """Wall time of each of ``n`` calls ``fn(arg)``, timed one by one.

    Parameters
    ----------
    fn : callable
        Called with one argument.
    arg : object
        Its argument (the same every call).
    n : int
        Number of calls.
    setup : callable, optional
        ``setup(arg)`` before each call, not timed (e.g. writes whose cost a read then pays).

    Returns
    -------
    numpy.ndarray
        int64 nanoseconds per call (``time.perf_counter_ns``; the timer's own cost included, as
        a caller sees it).
    """
    import numpy as np

    out = np.empty(n, dtype=np.int64)
    pc = time.perf_counter_ns
    for i in range(n):
        if setup is not None:
            setup(arg)
        t0 = pc()
        fn(arg)
        out[i] = pc() - t0
    return out


def calls_for_budget(fn, arg, budget_s: float, lo: int, hi: int, warmup: int, setup=None) -> int:
    """Warm ``fn(arg)`` up with ``warmup`` calls and size a measurement to a time budget.

    Parameters
    ----------
    fn, arg, setup
        As for :func:`time_calls`.
    budget_s : float
        Seconds the measurement should take.
    lo, hi : int
        Bounds on the number of calls (``lo`` wins for slow calls, ``hi`` for fast ones).
    warmup : int
        Untimed calls first; their median estimates the cost of one call.

    Returns
    -------
    int
        Number of calls to time.
    """
    import numpy as np

    est = float(np.median(time_calls(fn, arg, warmup, setup)))
    return int(min(hi, max(lo, budget_s * 1e9 / max(est, 1.0))))


def latency_stats(ns) -> dict:
    """Summary of per-call times.

    Parameters
    ----------
    ns : array_like
        Nanoseconds per call.

    Returns
    -------
    dict
        ``n`` and the median, p99, mean, std, min, p10 and p90 in microseconds (``*_us``).
    """
    import numpy as np

    us = np.asarray(ns) / 1e3
    return {"n": int(len(us)), "median_us": float(np.median(us)), "p99_us": float(np.percentile(us, 99)),
            "mean_us": float(us.mean()), "std_us": float(us.std()), "min_us": float(us.min()),
            "p10_us": float(np.percentile(us, 10)), "p90_us": float(np.percentile(us, 90))}


def rotated(seq, k: int) -> list:
    """``seq`` as a list rotated left by ``k`` (modulo its length): a different order per seed."""
    seq = list(seq)
    k %= len(seq)
    return seq[k:] + seq[:k]


def interleaved_latencies(calls: dict, args, *, budget_s: float, lo: int, hi: int, rounds: int,
                          warmup: int, setups: dict | None = None) -> dict:
    """Per-call latency of several callables, alternating them in rounds.

    Each callable gets its own number of calls (:func:`calls_for_budget`), split evenly over
    ``rounds``; in round r the callables run in their order rotated by r. Interleaving makes a
    change of machine load hit every candidate alike, so their ratios stay fair on a shared host.

    Parameters
    ----------
    calls : dict
        Name -> ``fn(arg)``; the dict order is the order of round 0.
    args : iterable
        Arguments measured one after another (e.g. batch sizes).
    budget_s, lo, hi, warmup
        As for :func:`calls_for_budget`, per (callable, argument).
    rounds : int
        Number of rounds.
    setups : dict, optional
        Name -> ``setup(arg)`` run untimed before each of that callable's calls (warm-up
        included); see :func:`time_calls`.

    Returns
    -------
    dict
        ``{arg: {name: latency_stats}}``.
    """
    import numpy as np

    keys = list(calls)
    out = {}
    for a in args:
        setup = (setups or {}).get
        counts = {k: calls_for_budget(calls[k], a, budget_s, lo, hi, warmup, setup(k)) for k in keys}
        parts = {k: [] for k in keys}
        for r in range(rounds):
            for k in rotated(keys, r):
                n = counts[k] // rounds + (1 if r < counts[k] % rounds else 0)
                parts[k].append(time_calls(calls[k], a, n, setup(k)))
        out[a] = {k: latency_stats(np.concatenate(parts[k])) for k in keys}
    return out


@contextlib.contextmanager
def gc_paused():
    """Collect garbage, then keep the collector off inside the block (a collection would land in
    whichever call is being timed)."""
    import gc

    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class SliceTimer:
    """A callable timed in time-budgeted slices, cycling through pre-built argument tuples.

    Parameters
    ----------
    fn : callable
        The timed function, called as ``fn(*arglist[i])``.
    arglist : list of tuple
        Arguments used in turn (so every call sees fresh data, and no call builds any).
    per_call : int
        Units of work per call; each recorded time is divided by it (time per unit).
    warmup : int
        Untimed calls at the start of every slice (caches and branch predictors refilled after
        the other candidates ran).
    min_calls : int
        Timed calls per slice even when the budget is exhausted.
    """

    def __init__(self, fn, arglist, per_call: int, *, warmup: int, min_calls: int):
        self.fn, self.arglist, self.per_call = fn, arglist, per_call
        self.warmup, self.min_calls = warmup, min_calls
        self.next = 0
        self.times_ns: list[float] = []

    def run_slice(self, budget_ns: int) -> None:
        """Time calls for ``budget_ns`` nanoseconds (at least ``min_calls``), appending to
        ``times_ns``."""
        fn, args, n, i = self.fn, self.arglist, len(self.arglist), self.next
        for _ in range(self.warmup):
            fn(*args[i % n])
            i += 1
        pc = time.perf_counter_ns
        out = self.times_ns
        scale = 1.0 / self.per_call
        end = pc() + budget_ns
        count = 0
        while count < self.min_calls or pc() < end:
            a = args[i % n]
            t0 = pc()
            fn(*a)
            out.append((pc() - t0) * scale)
            i += 1
            count += 1
        self.next = i


def run_rounds(timers: list, rounds: int, budget_ns: int, shift) -> None:
    """Run every :class:`SliceTimer` once per round, in an order that changes every round.

    Round r starts at timer ``shift(r) % len(timers)`` and odd rounds run backwards (A B C, then
    C B A), so drift of the machine during a round hits all candidates alike. The garbage
    collector is off meanwhile (a collection would land in one candidate's time).

    Parameters
    ----------
    timers : list of SliceTimer
    rounds : int
    budget_ns : int
        Slice budget per timer per round.
    shift : callable
        ``shift(r) -> int``, the rotation of round r.
    """
    import gc

    gc.disable()
    try:
        for rnd in range(rounds):
            s = shift(rnd) % len(timers)
            order = timers[s:] + timers[:s]
            if rnd % 2:
                order.reverse()
            for t in order:
                t.run_slice(budget_ns)
    finally:
        gc.enable()


def block_size(fn, make_args, target_s: float, max_m: int) -> int:
    """Units of work per call so that one call of ``fn`` takes about ``target_s``.

    Parameters
    ----------
    fn : callable
    make_args : callable
        ``make_args(start, m)`` -> argument tuple for m units of work.
    target_s : float
        Wanted seconds per call.
    max_m : int
        Upper bound (the pre-drawn data available).

    Returns
    -------
    int
        A power of two (so blocks tile pre-drawn rows of a power-of-two count).
    """
    m0 = 16
    a = make_args(0, m0)
    fn(*a)  # compile / load first
    t0 = time.perf_counter()
    fn(*a)
    per = max((time.perf_counter() - t0) / m0, 1e-8)
    m = int(min(max_m, max(1, round(target_s / per))))
    return 1 << int(math.log2(m))


# -- fresh processes and memory ---------------------------------------------------------------
def run_in_fresh_processes(script: str, variants: list, seeds: list, args: list, *, timeout_s: float,
                           describe, log) -> list[dict]:
    """Run every (variant, seed) as ``python script --worker VARIANT --seed SEED *args`` in a
    fresh process (its own peak memory, no shared caches), one thread for BLAS/OpenMP, the
    order of the variants rotated seed by seed (no variant always first or last). A worker
    prints one line ``RESULT <json>``; the dicts are returned, each with ``process_s``.
    ``describe(result) -> str`` makes the log line after the variant and seed; ``log(str)``
    prints it. SystemExit with the worker's stderr when one fails."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    runs = []
    for k, seed in enumerate(seeds):
        for variant in variants[k % len(variants):] + variants[:k % len(variants)]:
            cmd = [sys.executable, os.path.abspath(script), "--worker", variant, "--seed", str(seed), *args]
            t0 = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
            if out.returncode != 0:
                raise SystemExit(f"worker {variant} seed {seed} failed:\n{out.stderr[-4000:]}")
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
            r = json.loads(line[len("RESULT "):])
            r["process_s"] = time.perf_counter() - t0
            runs.append(r)
            log(f"{variant:<26} seed {seed}: {describe(r)} ({r['process_s']:.0f} s)")
    return runs


def rss_statm() -> int:
    """Current resident set size of this process from ``/proc/self/statm``, in bytes (no psutil:
    nothing imported into the process being measured)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_hwm() -> int:
    """Peak resident set of this process's own address space (``VmHWM``, reset by exec), in bytes;
    ``getrusage``'s figure where ``/proc`` is missing."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_bytes() -> int:
    """Current resident set size of this process (psutil), in bytes."""
    import psutil

    return psutil.Process().memory_info().rss


def fresh_pages_allocator() -> bool:
    """Make every allocation above 4 KiB a fresh mmap (glibc only), so RSS growth is the buffer's.

    Without this, a forked child reuses heap memory its parent already touched and freed, and a
    small buffer shows no RSS growth at all.

    Returns
    -------
    bool
        False where it cannot be done (not glibc).
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
        # M_MMAP_MAX: a process that already holds 65,536 mmapped chunks (glibc's default cap; a
        # long-lived test worker can) would take the rest from the heap, zeroed by hand: resident
        libc.mallopt(-4, 1 << 24)
        return libc.mallopt(-3, 4096) == 1  # M_MMAP_THRESHOLD: fixed, no dynamic raising
    except (OSError, AttributeError):
        return False


def _forked_child(conn, fn, args):
    try:
        conn.send(fn(*args))
    except BaseException as exc:  # report, never hang the parent
        conn.send({"error": repr(exc)})
    finally:
        conn.close()


def run_forked(fn, *args) -> dict:
    """``fn(*args)`` in a fresh forked process, so what it allocates starts from a clean slate.

    Parameters
    ----------
    fn : callable
        Returns a picklable dict.
    *args
        Its arguments (not pickled: the child is a fork).

    Returns
    -------
    dict
        ``fn``'s dict (or ``{"error": repr}`` if it raised) plus ``process``: "fresh forked
        process", or "in-process" where fork is unavailable (less clean; errors then propagate).
    """
    import multiprocessing

    try:
        ctx = multiprocessing.get_context("fork")
    except ValueError:
        out = fn(*args)
        out["process"] = "in-process"
        return out
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_forked_child, args=(child, fn, args))
    p.start()
    child.close()
    out = parent.recv()
    p.join()
    out["process"] = "fresh forked process"
    return out


# -- references and the page cache ------------------------------------------------------------
class Memcpy:
    """``np.copyto`` of ``nbytes`` (a batch's bytes), contiguous: from a pool of ``pool_bytes`` at a random
    cache-line-aligned offset per call (``hot=False``: from DRAM when the pool exceeds the
    caches), or always from the same source (``hot=True``: from the caches)."""

    def __init__(self, nbytes: int, pool_bytes: int, hot: bool, seed: int = 0):
        import numpy as np

        self.pool = np.empty(max(pool_bytes, nbytes), np.uint8)
        self.pool.fill(0x5A)  # every page touched before timing
        self.dst = np.zeros(nbytes, np.uint8)
        offs = np.random.default_rng(seed).integers(0, (len(self.pool) - nbytes) // 64 + 1, 4096) * 64
        self.srcs = [self.pool[:nbytes]] if hot else [self.pool[o:o + nbytes] for o in offs.tolist()]
        self.k = 0
        self._copyto = np.copyto  # no import in the timed call

    def copy(self) -> None:
        self.k = (self.k + 1) % len(self.srcs)
        self._copyto(self.dst, self.srcs[self.k])


def remove(path: str) -> None:
    """Delete a spill file or directory."""
    import shutil

    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


def spill_files(path: str) -> list:
    return [path] if os.path.isfile(path) else sorted(os.path.join(path, f) for f in os.listdir(path))


def drop_page_cache(path: str) -> None:
    """Write the spill file's dirty pages, then ask the kernel to drop its cached pages (those the
    buffer maps, its hot rows and rows sampled since its last release, stay)."""
    for name in spill_files(path):
        fd = os.open(name, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def cached_bytes(path: str) -> int | None:
    """Bytes of the spill file in the page cache (``mincore`` on a fresh read-only map); None
    where that cannot be read."""
    import ctypes
    import mmap

    import numpy as np

    total = 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        page = mmap.PAGESIZE
        for name in spill_files(path):
            size = os.path.getsize(name)
            if size == 0:
                continue
            with open(name, "rb") as f:
                mm = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
            try:
                view = np.frombuffer(mm, np.uint8)
                pages = (size + page - 1) // page
                vec = np.zeros(pages, np.uint8)
                rc = libc.mincore(ctypes.c_void_p(view.ctypes.data), ctypes.c_size_t(size),
                                  ctypes.c_void_p(vec.ctypes.data))
                del view
                if rc != 0:
                    return None
                total += int((vec & 1).sum()) * page
            finally:
                mm.close()
    except (OSError, AttributeError, ValueError):
        return None
    return total
