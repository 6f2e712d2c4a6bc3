"""Allocators: numpy arrays whose memory comes from a chosen allocator.

Five allocators, one contract (:class:`Allocator`): ``empty``/``zeros`` return an ndarray; the
memory goes back to the allocator that gave it when the last view of the array dies.

``"numpy"`` (the default)
    ``np.empty``/``np.zeros``: the system malloc through numpy (glibc on Linux; numpy advises
    transparent huge pages for arrays of 4 MiB and more).
``"jemalloc"``
    Debian's ``libjemalloc2``, loaded with ctypes: ``mallocx``/``dallocx``, figures from
    ``mallctl`` (``stats.allocated``, ``stats.active``, ``stats.resident``, ``stats.mapped``).
``"mimalloc"``
    Debian's ``libmimalloc2.0``: ``mi_malloc_aligned``/``mi_zalloc_aligned``/``mi_free``,
    figures from ``mi_process_info``.
``"hugepages"`` / ``"nohugepages"``
    One anonymous ``mmap`` per array, advised ``MADV_HUGEPAGE`` (arrays of 2 MiB or more, start
    aligned to 2 MiB) or ``MADV_NOHUGEPAGE``: the control that numpy's own advice makes
    necessary. A system call per allocation and per free: for buffers built once, not for
    per-batch temporaries (several times slower than malloc under churn, reports/alloc).

The libraries are loaded with ``RTLD_LOCAL``: they serve tfdata's arrays only and never replace
the process's ``malloc``. They are never unloaded (memory they gave may outlive any handle).

Debian's jemalloc needs glibc's static TLS reserve, which a running Python has used up:
``dlopen`` fails with "cannot allocate memory in static TLS block" unless
``GLIBC_TUNABLES=glibc.rtld.optional_static_tls=4096`` was in the environment when the
interpreter started. :func:`reexec_with_tunables` restarts the current program with it;
:data:`TUNABLE` is the setting.

This is the only module of tfdata that touches ``ctypes``.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading
import weakref

import numpy as np

from .errors import AllocatorError

__all__ = ["Allocator", "NAMES", "TUNABLE", "get", "resolve", "open", "loaded",
           "reexec_with_tunables", "tunable_env", "has_tunable", "available"]

#: Allocator names, in the order reports list them.
NAMES = ("numpy", "jemalloc", "mimalloc", "hugepages", "nohugepages")

#: The glibc tunable Debian's jemalloc needs in the environment before Python starts.
TUNABLE = "glibc.rtld.optional_static_tls=4096"

#: Library file names tried in order (then ``ctypes.util.find_library``); the environment
#: variables ``TFDATA_JEMALLOC`` / ``TFDATA_MIMALLOC`` name a file to use instead.
LIBRARIES = {
    "jemalloc": ("libjemalloc.so.2",),
    "mimalloc": ("libmimalloc.so.2", "libmimalloc.so.2.0"),
}
_PACKAGES = {"jemalloc": "libjemalloc2", "mimalloc": "libmimalloc2.0"}

#: Default alignment of every block: a cache line, so no two arrays share one.
ALIGN = 64
_HUGE = 2 << 20  # the x86-64 / aarch64 (4 KiB granule) transparent huge page


def has_tunable(environ=None) -> bool:
    """Whether ``environ`` (default: this process's) carries :data:`TUNABLE`."""
    env = os.environ if environ is None else environ
    return TUNABLE in env.get("GLIBC_TUNABLES", "").split(":")


def tunable_env(environ=None) -> dict:
    """A copy of ``environ`` (default ``os.environ``) with :data:`TUNABLE` added to
    ``GLIBC_TUNABLES`` (other tunables kept)."""
    env = dict(os.environ if environ is None else environ)
    env.pop("_TFDATA_REEXEC", None)
    if not has_tunable(env):
        old = env.get("GLIBC_TUNABLES", "")
        env["GLIBC_TUNABLES"] = f"{old}:{TUNABLE}" if old else TUNABLE
    return env


def reexec_with_tunables(argv=None) -> None:
    """Restart this Python program with :data:`TUNABLE` set, if it is not set already.

    Call it first thing in a script that will load jemalloc. Replaces the process
    (``os.execve``): nothing after the call runs in the old one. ``argv`` defaults to the
    interpreter's own command line (``sys.orig_argv``), so ``python -m pkg ...`` restarts as such.
    Returns normally when the tunable is already set.
    """
    if has_tunable():
        os.environ.pop("_TFDATA_REEXEC", None)  # not for this program's own children
        return
    if os.environ.get("_TFDATA_REEXEC"):  # set but not effective: never loop
        raise AllocatorError("re-executed with GLIBC_TUNABLES but it is still missing")
    env = tunable_env()
    env["_TFDATA_REEXEC"] = "1"
    args = list(sys.orig_argv if argv is None else [sys.executable, *argv])
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, args, env)


class Allocator:
    """Hands out numpy arrays from one allocator and counts what is live.

    Use :func:`get` for the shared handle of a name, or :func:`open` for a private one (a context
    manager). :meth:`close` refuses new arrays; arrays already given stay valid and are freed
    when their last view dies, by the allocator that gave them.

    Attributes
    ----------
    name : str
        One of :data:`NAMES`.
    live_bytes, live_blocks : int
        Bytes and arrays given and not yet freed (bytes as requested, before rounding).
    peak_bytes : int
        The most ``live_bytes`` has been.
    allocations : int
        Arrays given since the handle was made.
    """

    name = "?"

    def __init__(self):
        self._count_lock = threading.Lock()
        self.live_bytes = self.live_blocks = self.peak_bytes = self.allocations = 0
        self.closed = False

    # -- the contract ---------------------------------------------------------------------
    def empty(self, shape, dtype=np.float64) -> np.ndarray:
        """An uninitialised C-contiguous array of ``shape`` and ``dtype``, 64-byte aligned."""
        return self._array(shape, dtype, zero=False)

    def zeros(self, shape, dtype=np.float64) -> np.ndarray:
        """As :meth:`empty`, filled with zeros.

        numpy (``calloc``), jemalloc (``MALLOCX_ZERO``) and the mmap allocators know fresh pages
        are zero: a large block is mapped at its first touch, not here. mimalloc 2.0's
        ``mi_zalloc_aligned`` clears the block at once, so a buffer on mimalloc is resident from
        construction.
        """
        return self._array(shape, dtype, zero=True)

    def stats(self) -> dict:
        """Counters of this handle (``live_bytes``, ``live_blocks``, ``peak_bytes``,
        ``allocations``) plus the allocator's own process-wide figures where it reports them
        (jemalloc: ``allocated``, ``active``, ``resident``, ``mapped``; mimalloc: ``commit``,
        ``peak_commit``), all in bytes."""
        with self._count_lock:
            out = {"live_bytes": self.live_bytes, "live_blocks": self.live_blocks,
                   "peak_bytes": self.peak_bytes, "allocations": self.allocations}
        out.update(self._library_stats())
        return out

    def trim(self) -> None:
        """Ask the allocator to give free memory back to the system now (glibc ``malloc_trim``,
        jemalloc arena purge, mimalloc ``mi_collect``; nothing for the mmap allocators, whose
        free is ``munmap``)."""

    def close(self) -> None:
        """Refuse new arrays from this handle. Live arrays stay valid and are freed later."""
        self.closed = True
        with _registry_lock:
            if _registry.get(self.name) is self:
                del _registry[self.name]

    def __enter__(self) -> "Allocator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.live_blocks} live arrays, {self.live_bytes} bytes"
        return f"<tfdata.alloc {self.name}: {state}>"

    # -- shared machinery -----------------------------------------------------------------
    def _array(self, shape, dtype, zero: bool) -> np.ndarray:
        if self.closed:
            raise AllocatorError(f"allocator {self.name!r} is closed")
        dtype = np.dtype(dtype)
        shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"negative dimension in shape {shape}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        owner, arr = self._allocate(nbytes, shape, dtype, zero)
        with self._count_lock:
            self.live_bytes += nbytes
            self.live_blocks += 1
            self.allocations += 1
            self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        f = weakref.finalize(owner, _release, weakref.ref(self), nbytes, *self._free_args(owner))
        f.atexit = False  # at exit the process's memory goes anyway; never free under live views
        return arr

    def _free_args(self, owner) -> tuple:
        """What :func:`_release` passes to the allocator's free (after the owner died)."""
        return ()

    def _forget(self, nbytes: int) -> None:
        with self._count_lock:
            self.live_bytes -= nbytes
            self.live_blocks -= 1

    def _allocate(self, nbytes, shape, dtype, zero):  # -> (owner, array)
        raise NotImplementedError

    def _library_stats(self) -> dict:
        return {}


def _release(handle_ref, nbytes, free=None, ptr=None) -> None:
    # runs when the last view of a block dies (any thread); captures the free function itself,
    # not module globals, so it works while modules are being torn down
    if free is not None:
        free(ptr)
    handle = handle_ref()
    if handle is not None:
        handle._forget(nbytes)


class _NumpyAllocator(Allocator):
    name = "numpy"

    def _allocate(self, nbytes, shape, dtype, zero):
        # numpy aligns to 16 bytes; over-allocate a cache line and view the aligned part
        raw = (np.zeros if zero else np.empty)(nbytes + ALIGN, np.uint8)
        off = (-raw.ctypes.data) % ALIGN
        arr = raw[off:off + nbytes].view(dtype).reshape(shape)
        return raw, arr  # every view keeps ``raw`` (the owner) alive

    def trim(self) -> None:
        libc = _libc()
        if libc is not None:
            libc.malloc_trim(0)


class _MmapAllocator(Allocator):
    """One anonymous private mapping per array, advised huge pages on or off."""

    def __init__(self, huge: bool):
        super().__init__()
        self.huge = huge
        self.name = "hugepages" if huge else "nohugepages"

    def _allocate(self, nbytes, shape, dtype, zero):
        # a huge array gets room to start on a 2 MiB boundary (untouched pages never become
        # resident); a smaller one cannot hold a huge page, and padding it would let the kernel
        # back its one touched page with a whole 2 MiB page
        huge = self.huge and nbytes >= _HUGE
        pad = _HUGE if huge else 0
        size = max(mmap.PAGESIZE, -(-(nbytes + pad) // mmap.PAGESIZE) * mmap.PAGESIZE)
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                      prot=mmap.PROT_READ | mmap.PROT_WRITE)
        m.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
        raw = np.frombuffer(m, np.uint8)
        off = (-raw.ctypes.data) % (_HUGE if huge else ALIGN)
        arr = raw[off:off + nbytes].view(dtype).reshape(shape)  # fresh anonymous pages are zero
        return m, arr


class _Block:
    """Owner of one block of foreign memory, shown to numpy through ``__array_interface__`` (not
    a ctypes array: see docs/design/allocators.md)."""

    __slots__ = ("ptr", "__array_interface__", "__weakref__")

    def __init__(self, ptr: int, nbytes: int):
        self.ptr = ptr
        self.__array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1",
                                    "version": 3}


class _LibraryAllocator(Allocator):
    """An allocator living in a shared library loaded with ctypes."""

    def __init__(self):
        super().__init__()
        self.lib = _load(self.name)
        self.path = getattr(self.lib, "_name", "")

    def _allocate(self, nbytes, shape, dtype, zero):
        size = max(nbytes, 1)
        ptr = self._malloc(size, zero)
        if not ptr:
            raise MemoryError(f"{self.name}: could not allocate {size} bytes")
        owner = _Block(ptr, nbytes)
        arr = np.asarray(owner).view(dtype).reshape(shape)  # base: the owner
        return owner, arr

    def _free_args(self, owner):
        return (self._free, owner.ptr)


class _Jemalloc(_LibraryAllocator):
    name = "jemalloc"
    _MALLOCX_ZERO = 0x40

    def __init__(self):
        super().__init__()
        lib = self.lib
        self._flags = flags = ALIGN.bit_length() - 1  # MALLOCX_LG_ALIGN(6)
        self._mallocx = lib.mallocx
        self._mallctl = lib.mallctl
        self._free = lambda ptr, _d=lib.dallocx: _d(ptr, flags)

    def _malloc(self, size, zero):
        return self._mallocx(size, self._flags | (self._MALLOCX_ZERO if zero else 0))

    def _read(self, name: bytes) -> int:
        value, size = ctypes.c_size_t(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_size_t))
        if self._mallctl(name, ctypes.byref(value), ctypes.byref(size), None, 0):
            return -1
        return int(value.value)

    def _library_stats(self):
        epoch = ctypes.c_uint64(1)  # statistics are a snapshot refreshed by writing "epoch"
        self._mallctl(b"epoch", None, None, ctypes.byref(epoch), ctypes.sizeof(epoch))
        return {k: self._read(b"stats." + k.encode()) for k in ("allocated", "active", "resident", "mapped")}

    def trim(self) -> None:
        # MALLCTL_ARENAS_ALL is 4096 in jemalloc 5
        self._mallctl(b"arena.4096.purge", None, None, None, 0)


class _Mimalloc(_LibraryAllocator):
    name = "mimalloc"

    def __init__(self):
        super().__init__()
        lib = self.lib
        self._malloc_aligned = lib.mi_malloc_aligned
        self._zalloc_aligned = lib.mi_zalloc_aligned
        self._free = lib.mi_free

    def _malloc(self, size, zero):
        return (self._zalloc_aligned if zero else self._malloc_aligned)(size, ALIGN)

    def _library_stats(self):
        vals = [ctypes.c_size_t() for _ in range(8)]
        self.lib.mi_process_info(*[ctypes.byref(v) for v in vals])
        return {"commit": int(vals[5].value), "peak_commit": int(vals[6].value)}

    def trim(self) -> None:
        self.lib.mi_collect(True)


# -- ctypes: every foreign declaration of tfdata is here -------------------------------------
_SIZE, _PTR, _INT = ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int
_SIGNATURES = {
    "jemalloc": {
        "mallocx": ([_SIZE, _INT], _PTR),
        "dallocx": ([_PTR, _INT], None),
        "mallctl": ([ctypes.c_char_p, _PTR, ctypes.POINTER(_SIZE), _PTR, _SIZE], _INT),
    },
    "mimalloc": {
        "mi_malloc_aligned": ([_SIZE, _SIZE], _PTR),
        "mi_zalloc_aligned": ([_SIZE, _SIZE], _PTR),
        "mi_free": ([_PTR], None),
        "mi_collect": ([ctypes.c_bool], None),
        "mi_process_info": ([ctypes.POINTER(_SIZE)] * 8, None),
        "mi_version": ([], _INT),
    },
    "libc": {
        "malloc_trim": ([_SIZE], _INT),
        "madvise": ([_PTR, _SIZE, _INT], _INT),
    },
}


def _declare(lib, table: dict):
    for fname, (argtypes, restype) in table.items():
        fn = getattr(lib, fname)
        fn.argtypes = argtypes
        fn.restype = restype
    return lib


_libc_handle = None


def _libc():
    """The C library (glibc ``malloc_trim``, ``madvise``), or None where there is none."""
    global _libc_handle
    if _libc_handle is None:
        try:
            _libc_handle = _declare(ctypes.CDLL(None, use_errno=True), _SIGNATURES["libc"])
        except (OSError, AttributeError):
            _libc_handle = False
    return _libc_handle or None


def madvise(arr: np.ndarray, advice: int) -> None:
    """``madvise`` over the whole pages of ``arr``'s memory, without holding the GIL
    (ctypes releases it during the call). ``advice``: an ``mmap.MADV_*`` constant."""
    libc = _libc()
    if libc is None:
        raise AllocatorError("madvise is not available on this platform")
    start = arr.ctypes.data
    lo = start - start % mmap.PAGESIZE
    hi = start + arr.nbytes
    if libc.madvise(lo, hi - lo, advice) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"madvise({advice}): {os.strerror(err)}")


def _load(name: str):
    """Load library ``name`` with ``RTLD_LOCAL`` and declare its functions; clear errors."""
    import ctypes.util  # here, not at import: it pulls in subprocess and friends

    override = os.environ.get(f"TFDATA_{name.upper()}")
    candidates = [override] if override else list(LIBRARIES[name])
    if not override:
        found = ctypes.util.find_library(name)
        if found and found not in candidates:
            candidates.append(found)
    errors = []
    for path in candidates:
        try:
            lib = ctypes.CDLL(path, mode=ctypes.RTLD_LOCAL)
        except OSError as exc:
            msg = str(exc)
            if "static TLS" in msg:
                raise AllocatorError(
                    f"{name} ({path}) is installed but cannot be loaded into a running Python: "
                    f"glibc has no static TLS space left for it ({msg}). Start Python with "
                    f"GLIBC_TUNABLES={TUNABLE} in the environment, e.g.\n"
                    f"    GLIBC_TUNABLES={TUNABLE} python your_script.py\n"
                    f"or call tfdata.alloc.reexec_with_tunables() at the top of the script "
                    f"(tfdata's own commands do this).") from None
            errors.append(f"{path}: {msg}")
            continue
        try:
            return _declare(lib, _SIGNATURES[name])
        except AttributeError as exc:
            errors.append(f"{path}: not the expected library ({exc})")
    where = f"the file TFDATA_{name.upper()} names" if override else "no library file found"
    raise AllocatorError(
        f"allocator {name!r} is not available: {where} ({'; '.join(errors) or 'none tried'}). "
        f"On Debian/Ubuntu install it with: apt-get install {_PACKAGES[name]} (as root, or with "
        f"sudo); elsewhere install {name} and set TFDATA_{name.upper()} to the path of its shared "
        f"library, or use allocator='numpy'.")


_FACTORIES = {
    "numpy": _NumpyAllocator,
    "jemalloc": _Jemalloc,
    "mimalloc": _Mimalloc,
    "hugepages": lambda: _MmapAllocator(True),
    "nohugepages": lambda: _MmapAllocator(False),
}
_registry: dict = {}
_registry_lock = threading.Lock()


def _check_name(name) -> str:
    if not isinstance(name, str) or name.lower() not in _FACTORIES:
        raise ValueError(f"allocator: expected one of {NAMES!r} or a tfdata.alloc.Allocator, got {name!r}")
    return name.lower()


def open(name: str) -> Allocator:  # noqa: A001 - mirrors io.open: a handle to close
    """A new private handle of allocator ``name`` (close it, or use it as a context manager)."""
    return _FACTORIES[_check_name(name)]()


def get(name: str) -> Allocator:
    """The shared handle of allocator ``name``, loaded on first use."""
    name = _check_name(name)
    with _registry_lock:
        handle = _registry.get(name)
        if handle is None:
            handle = _registry[name] = _FACTORIES[name]()
        return handle


def resolve(allocator=None) -> Allocator:
    """The allocator to use: an :class:`Allocator` as is, a name, else the ``TFDATA_ALLOCATOR``
    environment variable, else ``"numpy"``."""
    if isinstance(allocator, Allocator):
        if allocator.closed:
            raise AllocatorError(f"allocator {allocator.name!r} is closed")
        return allocator
    if allocator is None:
        env = os.environ.get("TFDATA_ALLOCATOR")
        if env:
            try:
                return get(_check_name(env))
            except ValueError:
                raise ValueError(f"TFDATA_ALLOCATOR environment variable: expected one of {NAMES!r}, "
                                 f"got {env!r}") from None
        return get("numpy")
    return get(allocator)


def loaded() -> list:
    """The shared handles loaded so far."""
    with _registry_lock:
        return list(_registry.values())


def available(name: str) -> tuple:
    """``(True, "")`` if allocator ``name`` can be used in this process, else ``(False, why)``.

    Loads the library if needed (it stays loaded) but registers no shared handle.
    """
    try:
        open(name).close()
    except AllocatorError as exc:
        return False, str(exc)
    return True, ""
