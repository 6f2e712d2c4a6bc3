"""A shared buffer's region: the files, their checks, the locks and the removal.

A region is a directory ``tfdata-shm-<name>`` holding ``region.json`` (what the buffer is:
untrusted input, checked by :func:`open_region` before anything is mapped), ``region`` (the
mapped words and rows), ``owner.lock`` and one lock file per shard. Each lock (``flock``) is
held by its process for as long as it lives and released by the kernel however it ends, so the
learner can tell a writer that died from one that is busy (:meth:`Region.writer_state`), and
:func:`sweep` can tell a region whose owner died (and remove it) from one in use. This module
(the control words of the learner and the writers, below) and :mod:`tfdata.storage.region`
(where the words and rows lie) alone know the region's byte layout.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import stat
import tempfile

import numpy as np

from .._checks import check_int as _check_int
from ..errors import FormatError
from ..replay import combinations
from . import frames as shared_frames
from ..replay.frames import resolve_frames
from ..replay.transforms import episode_options
from ..spec import Spec
from ..storage import files as io
from ..storage import check_layout, resolve_layout
from ..storage import region as shm_region

FORMAT = "tfdata.shared"
VERSION = 1
MODES = ("replay", "fifo")
POLICIES = ("block", "drop")
#: the policies of sampler="exactly_k" in replay mode (writers write free slots only)
EXACTLY_K_POLICIES = ("block", "drop")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,99}$")
_PREFIX = "tfdata-shm-"
# the files of a region directory (see _region_entries)
_REGION_NAME = re.compile(r"^(region\.json|region|owner\.lock|writer-[0-9]{1,6}\.lock)$")

# control words (uint64): global words, then one block of 16 per shard. The writer's words and
# the consumer's are 64 bytes apart, so the two processes never write to one cache line.
CLOSED = 0            # global: set by the owner when it closes the buffer
# global, written by the learner only: rows it has sampled in all, the "samples" count of a
# rate limiter (region.json "rate_limiter"); its "inserts" are the sum of the shards' heads
SAMPLES = 1
_FIRST = 16            # first shard block
_STRIDE = 16           # words per shard
# written by the shard's writer (HEAD, DROPPED, RESERVED: the positions kernels/_shared.py uses)
HEAD, DROPPED, RESERVED, PID, STATE, ATTACHES = 0, 1, 2, 3, 4, 5
# exactly-k replay: the writer's cursor (the shard's slot its next row's search starts at),
# stored after each write, read by a writer taking the shard over and by checkpoints
CURSOR = 6
_TAIL = 8              # written by the consumer
# shard states (STATE)
NEVER, ATTACHED, FINISHED = 0, 1, 2
# check the writers' locks at most this often from sample / get_batch
WATCH_S = 0.25


def shm_dir() -> str:
    """Where regions live unless ``dir=`` says otherwise: ``TFDATA_SHM_DIR``, else ``/dev/shm``
    (Linux's shared-memory file system), else the temporary directory."""
    env = os.environ.get("TFDATA_SHM_DIR")
    if env:
        return env
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK | os.X_OK):
        return "/dev/shm"
    return tempfile.gettempdir()


def region_path(name: str, dir: str | None) -> str:
    if os.sep in name:  # a path, as SharedReplayBuffer.path gives it
        return name
    if not _NAME.match(name):
        raise ValueError(f"shared buffer name must be 1-100 letters, digits, '_', '.' or '-' "
                         f"(not starting with '.' or '-'), got {name!r}")
    return os.path.join(dir or shm_dir(), _PREFIX + name)


def region_layout(spec: Spec, layout: str, shards: int, cap: int, fifo: bool, exactly_k: bool = False,
                  frames=None) -> dict:
    """Byte offsets of every section of a region (and its total size); exactly-k replay adds
    three words per slot (``taken``, ``released``, ``log``: see :class:`Region`). ``frames``:
    ``(resolved frame_stack, final_frames)``: the rows stored one frame per row, and the frame
    arrays (``lay["frame_arrays"]``, see :mod:`tfdata.shared.frames`). ``lay["stored"]``:
    the stored spec and layout."""
    slots = shards * cap
    extra = []
    if frames is not None:
        extra = shared_frames.region_arrays(spec, frames[0], shards, cap, frames[1])
        spec, layout = shared_frames.stored(spec, frames[0], layout)
    lay = shm_region.plan(spec, layout, _FIRST + _STRIDE * shards, slots if fifo else 0, slots,
                          3 if exactly_k else 0, extra)
    lay["frame_arrays"], lay["stored"] = extra, (spec, layout)
    return lay


def region_nbytes(spec, capacity: int, *, num_writers: int = 1, layout=None,
                  mode: str = "replay", sampler: str | None = None, frame_stack=None,
                  frame_padding="reset", final_frames: int | None = None, next_of="auto",
                  roles=None) -> int:
    """Bytes of shared memory a :class:`SharedReplayBuffer` with these arguments maps
    (``sampler="exactly_k"``: 24 bytes more per slot; ``frame_stack``: one frame per row and
    the frame bookkeeping)."""
    spec = spec if isinstance(spec, Spec) else Spec(spec)
    shards, cap = check_shards(capacity, num_writers)
    frames = frame_options(spec, frame_stack, frame_padding, final_frames, next_of, roles, cap)
    return region_layout(spec, resolve_layout(layout, spec), shards, cap, mode == "fifo",
                         sampler == "exactly_k", frames)["nbytes"]


def frame_options(spec: Spec, frame_stack, frame_padding, final_frames, next_of, roles, cap):
    """``(resolved frame_stack, final_frames, next_of, roles)`` or None (no frame_stack);
    refuses bad options (nothing is created)."""
    opts = episode_options(spec, None, 0.99, next_of, False, roles)
    frames = resolve_frames(spec, frame_stack, frame_padding, opts["next_of"], opts["has_flags"])
    if frames is None:
        if final_frames is not None:
            raise ValueError("final_frames is given but frame_stack is None (it sizes the "
                             "final-frame table of stacked fields)")
        return None
    return (frames, shared_frames.check_options(spec, frames, cap, final_frames), opts["next_of"],
            opts["roles"])


def exactly_k_options(sampler, policy, replays, timeout) -> bool:
    """Whether ``sampler`` asks for exactly-k replay; ValueError for a sampler or policy that
    does not exist, or exactly-k's options with another sampler (what combines with what is
    the table of :mod:`tfdata.replay.combinations`)."""
    if sampler not in (None, "uniform", "without_replacement", "exactly_k"):
        raise ValueError(f"sampler must be one of ['uniform', 'without_replacement', 'exactly_k'] "
                         f"(None: uniform), got {sampler!r}")
    if sampler != "exactly_k":
        given = [k for k, v in (("replays", replays), ("timeout", timeout)) if v is not None]
        if given:
            raise ValueError(f"{', '.join(k + '=' for k in given)} given with sampler={sampler!r}: "
                             f"these options belong to sampler='exactly_k'")
        return False
    if policy is not None and policy not in EXACTLY_K_POLICIES + ("overwrite",):
        raise ValueError(f"policy must be one of {list(EXACTLY_K_POLICIES)}, got {policy!r}")
    return True


def check_shards(capacity, num_writers) -> tuple[int, int]:
    num_writers = _check_int("num_writers", num_writers, 1, 4096)
    capacity = _check_int("capacity", capacity, 1, (1 << 32) - 1)
    if capacity % num_writers:
        raise ValueError(f"capacity {capacity} must be a multiple of num_writers={num_writers} "
                         f"(each writer owns capacity // num_writers slots)")
    return num_writers, capacity // num_writers


class Region:
    """A mapped region: its description, its words and a storage over its rows."""

    def __init__(self, path: str, doc: dict, mapped: io.MappedFile):
        self.path = path
        self.doc = doc
        self.spec = Spec.from_dict(doc["spec"])
        self.layout = check_layout(doc["layout"], self.spec)
        self.mode = doc["mode"]
        self.policy = doc["policy"]
        # writers of an exactly-k replay region write free slots only (see taken / released)
        self.exactly_k = doc.get("sampler") == "exactly_k"
        self.shards = int(doc["num_writers"])
        self.cap = int(doc["shard_capacity"])
        self.limiter = doc.get("rate_limiter")  # checked by open_region (or made by the owner)
        self.map = mapped
        # fewer TLB misses for random gathers where the system gives shared memory huge pages
        mapped.hugepages()
        # frame stacks (region.json "frames", checked by open_region): stored one frame per row
        self.frames = None
        frames = None
        if doc.get("frames") is not None:
            fr, final_frames, roles = shared_frames.from_doc(doc["frames"], self.spec, self.cap)
            frames = (fr, final_frames)
        lay = region_layout(self.spec, self.layout, self.shards, self.cap, self.mode == "fifo",
                            self.exactly_k, frames)
        self.stored_spec, self.stored_layout = lay["stored"]
        if mapped.nbytes < lay["nbytes"]:
            raise FormatError(f"{path}: region file holds {mapped.nbytes} bytes, its description "
                              f"needs {lay['nbytes']}")
        self.nbytes = lay["nbytes"]
        slots = self.shards * self.cap
        self.ctrl = mapped.at(lay["ctrl"][0], np.uint64, (lay["ctrl"][1],))
        self.stamps = mapped.at(lay["stamps"][0], np.uint64, (lay["stamps"][1],))
        blocks = self.ctrl[_FIRST:]
        self.heads = blocks[HEAD::_STRIDE]
        self.reserved = blocks[RESERVED::_STRIDE]
        self.dropped = blocks[DROPPED::_STRIDE]
        self.tails = blocks[_TAIL::_STRIDE]
        # exactly-k replay, one word per slot of the region (slot g of shard g // cap):
        # taken[g]: rows the shard's writer has put in slot g (written by that writer only);
        # released[g]: rows of slot g the learner delivered k times and copied (learner only);
        # the slot is free iff they are equal. log[s * cap + p % cap]: the slot (of the shard)
        # of shard s's p-th published row, stored before the head (its writer only).
        self.taken = self.released = self.log = None
        if self.exactly_k:
            self.taken, self.released, self.log = (mapped.at(o, np.uint64, (slots,))
                                                   for o in lay["slot_words"])
        self.storage = shm_region.storage_over(mapped, lay, self.stored_spec, self.stored_layout, slots)
        if frames is not None:
            self.frames = shared_frames.ShardFrames(self.spec, fr, final_frames, roles,
                                                    shm_region.map_extra(mapped, lay, lay["frame_arrays"]),
                                                    self.storage, self.shards, self.cap)

    def torn(self, shard: int) -> int:
        """Slots of ``shard`` a writer began and did not publish (one that died mid-write)."""
        w = self.words(shard)
        return min(self.cap, max(0, int(w[RESERVED]) - int(w[HEAD])))

    def words(self, shard: int) -> np.ndarray:
        """The 16 control words of ``shard``."""
        start = _FIRST + _STRIDE * shard
        return self.ctrl[start:start + _STRIDE]

    def lock_path(self, shard: int) -> str:
        return os.path.join(self.path, f"writer-{shard}.lock")

    @property
    def closed(self) -> bool:
        return bool(self.ctrl[CLOSED])

    def writers(self, fifo: bool) -> list[dict]:
        """The state of every shard (see ``SharedReplayBuffer.writers``); ``fifo``: count the
        rows queued."""
        out = []
        for s in range(self.shards):
            w = self.words(s)
            head = int(w[HEAD])
            out.append({"shard": s, "state": self.writer_state(s), "pid": int(w[PID]),
                        "published": head, "dropped": int(w[DROPPED]),
                        "queued": head - int(self.tails[s]) if fifo else 0, "torn": self.torn(s)})
        return out

    def writer_state(self, shard: int) -> str:
        """The state of ``shard``'s writer: ``"waiting"`` (none attached yet), ``"attached"``,
        ``"finished"`` (closed its shard) or ``"dead"`` (its process ended without closing it)."""
        w = self.words(shard)
        state = int(w[STATE])
        if state == NEVER:
            return "waiting"
        if state == FINISHED:
            return "finished"
        if writer_alive(self.lock_path(shard)):
            return "attached"
        # re-read: a writer that closed between the two reads is finished, not dead
        return "finished" if int(w[STATE]) == FINISHED else "dead"

    def all_done(self) -> bool:
        """No writer can publish more: every shard's writer finished or died."""
        return all(self.writer_state(s) in ("finished", "dead") for s in range(self.shards))


_REGION_FILES = ("region.json", "region", "owner.lock")


def _region_entries(path: str) -> list[str] | None:
    """The names in the region directory ``path`` if it is one tfdata could have made: a real
    directory (not a link) holding only regular files (no links, no FIFOs) named as a region's
    files are, all of ``region.json``, ``region`` and ``owner.lock`` among them; else None.

    A region's files are mapped writable and locked: a link planted in its place would make a
    writer (or ``sweep``) write into a file elsewhere, and a FIFO would block an open.
    """
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return None
        names = os.listdir(path)
        if not all(_REGION_NAME.match(n) and stat.S_ISREG(os.lstat(os.path.join(path, n)).st_mode)
                   for n in names):
            return None
    except OSError:
        return None
    return names if all(n in names for n in _REGION_FILES) else None


def _remove_region_files(path: str) -> None:
    """Delete a region's own files, then its directory (kept if anything else is in it)."""
    io.remove_names(path, _region_entries(path) or ())


def open_region(path: str) -> Region:
    doc_path = os.path.join(path, "region.json")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no shared buffer at {path} (closed by its owner, or never made; "
                                f"the owner's SharedReplayBuffer.name or .path names it)")
    if _region_entries(path) is None:
        raise FormatError(f"{path}: not a shared buffer region (a region is a directory of regular "
                          f"files region.json, region, owner.lock and writer-N.lock, no links)")
    doc = io.read_json_doc(doc_path, "tfdata shared buffer", FORMAT, 1 << 20)
    if doc.get("version") != VERSION:
        raise FormatError(f"{doc_path}: shared buffer version {doc.get('version')!r}, this tfdata "
                          f"reads version {VERSION}")
    try:
        if doc["mode"] not in MODES:
            raise ValueError(f"mode {str(doc['mode'])[:100]!r}")
        if doc.get("sampler", "uniform") not in ("uniform", "exactly_k") or (
                doc.get("sampler") == "exactly_k" and (
                    doc["mode"] != "replay" or doc["policy"] not in EXACTLY_K_POLICIES
                    or type(doc.get("replays")) is not int or not 1 <= doc["replays"] <= 65535)):
            raise ValueError(f"sampler {str(doc.get('sampler'))[:40]!r}, policy {str(doc['policy'])[:40]!r}, "
                             f"replays {str(doc.get('replays'))[:40]!r} for mode {doc['mode']!r}")
        if doc.get("sampler") != "exactly_k" and (
                doc["policy"] != (None if doc["mode"] == "replay" else doc["policy"]) or (
                doc["mode"] == "fifo" and doc["policy"] not in POLICIES)):
            raise ValueError(f"policy {doc['policy']!r} for mode {doc['mode']!r}")
        check_shards(doc["shard_capacity"] * doc["num_writers"], doc["num_writers"])
        if not isinstance(doc["layout"], (str, list)):
            raise ValueError(f"layout: {type(doc['layout']).__name__}")
        check_layout(doc["layout"], Spec.from_dict(doc["spec"]))
        _check_limiter_doc(doc)
        if doc.get("frames") is not None:
            if doc["mode"] != "replay" or doc.get("sampler") is not None:
                raise ValueError(f"frames with mode {doc['mode']!r}, sampler {str(doc.get('sampler'))[:40]!r}")
            shared_frames.from_doc(doc["frames"], Spec.from_dict(doc["spec"]), doc["shard_capacity"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # SpecError is a ValueError
        raise FormatError(f"{doc_path}: not a valid shared buffer description ({exc})") from None
    return Region(path, doc, io.MappedFile(os.path.join(path, "region"), 0, writable=True))


def _check_limiter_doc(doc: dict) -> None:
    """``region.json``'s ``rate_limiter`` (absent or null: none): exactly the parameters of a
    :class:`~tfdata.RateLimiter`, as its constructor checks them, in replay mode, with
    ``min_size_to_sample`` at most the capacity. ValueError or TypeError naming the field."""
    p = doc.get("rate_limiter")
    if p is None:
        return
    from ..replay.limiter import RateLimiter

    keys = ("samples_per_insert", "min_size_to_sample", "error_buffer", "timeout")
    if not isinstance(p, dict) or sorted(p) != sorted(keys):
        raise ValueError(f"rate_limiter: expected an object with the keys {list(keys)}, got "
                         f"{str(p)[:200]}")
    if doc["mode"] != "replay":
        raise ValueError(f"rate_limiter with mode {doc['mode']!r} (replay mode only)")
    try:
        lim = RateLimiter(**p)  # its own checks, each naming the argument
    except (TypeError, ValueError) as exc:
        raise ValueError(f"rate_limiter: {exc}") from None
    if lim.min_size_to_sample > doc["shard_capacity"] * doc["num_writers"]:
        raise ValueError(f"rate_limiter.min_size_to_sample must be <= the capacity "
                         f"{doc['shard_capacity'] * doc['num_writers']}, got {lim.min_size_to_sample}")
    exactly_k = doc.get("sampler") == "exactly_k"
    found = combinations.refusal(combinations.facets(
        "SharedReplayBuffer", sampler=doc.get("sampler", "uniform"), stream_order=not exactly_k,
        policy=doc["policy"] if exactly_k else None, replays=doc.get("replays"), rate_limiter=p))
    if found is not None:  # a region no constructor would have made
        raise ValueError(found[1])


def make_region(path: str, doc: dict) -> tuple[Region, int]:
    """Create the region ``path`` that ``doc`` (its ``region.json``) describes, after removing
    the orphans of its directory (:func:`sweep`). Built under a temporary name and renamed: a
    writer finds a complete region or none. Returns the region and the descriptor of its owner
    lock, held (the caller owns the region from then on: :func:`remove_region`)."""
    parent = os.path.dirname(path)
    sweep(parent)  # regions of owners that died without closing them
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", dir=parent)
    owner_fd = None
    try:
        # held for the owner's lifetime: sweep() tells an orphaned region by this lock
        owner_fd = os.open(os.path.join(tmp, "owner.lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(owner_fd, fcntl.LOCK_EX)
        HELD.add(owner_fd)
        mapped = io.create_region(os.path.join(tmp, "region"), doc["nbytes"])
        for s in range(doc["num_writers"]):
            open(os.path.join(tmp, f"writer-{s}.lock"), "wb").close()
        with open(os.path.join(tmp, "region.json"), "w", encoding="utf-8") as f:
            json.dump(doc, f)
        region = Region(tmp, doc, mapped)  # what can still fail, before writers can see it
        if region.frames is not None:
            region.frames.start()  # every shard's first row starts an episode
        os.rename(tmp, path)
        region.path = path
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if owner_fd is not None:
            HELD.discard(owner_fd)
            os.close(owner_fd)
        raise
    return region, owner_fd


def remove_region(path: str, ctrl: np.ndarray, owner: int, owner_fd: int) -> None:
    """The owner's finalizer: mark the region closed (writers fail their next write), remove its
    files, release the owner lock. Nothing in another process (a forked child)."""
    if os.getpid() != owner:
        return
    ctrl[CLOSED] = 1
    _remove_region_files(path)
    release(owner_fd)


# lock files this process holds (an owner's, its writers'): a forked child closes its copies,
# so that only the process that took a lock keeps it held (and its death frees it)
HELD: set = set()


# bumped in every forked child: a writer made before the fork belongs to the parent
GENERATION = [0]


def _close_inherited_locks() -> None:
    GENERATION[0] += 1
    for fd in list(HELD):
        try:
            os.close(fd)
        except OSError:
            pass
    HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_inherited_locks)


def release(fd: int) -> None:
    if fd in HELD:
        HELD.discard(fd)
        os.close(fd)


def writer_alive(lock_path: str) -> bool:
    """Whether a process holds the lock at ``lock_path`` (a shared lock is refused)."""
    try:
        fd = os.open(lock_path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # also releases the shared lock if it was taken
    return False


def sweep(dir: str | None = None) -> list[str]:
    """Remove the regions in ``dir`` (default :func:`shm_dir`) whose owner process has ended.

    An owner holds a lock on its region's ``owner.lock`` for as long as it lives, and the
    kernel releases it however the process ends (SIGKILL included), so a region whose lock is
    free is an orphan: its rows would otherwise hold memory of ``/dev/shm`` until reboot.
    Writers still attached to one get :class:`~tfdata.SharedBufferError` at their next write.
    Every :class:`SharedReplayBuffer` sweeps its directory when it is built. Returns the paths
    removed.
    """
    base = dir or shm_dir()
    removed = []
    try:
        names = [n for n in os.listdir(base) if n.startswith(_PREFIX)]
    except OSError:
        return removed
    for n in names:
        path = os.path.join(base, n)
        if _region_entries(path) is None:
            continue  # not a region tfdata made: never ours to remove
        try:
            fd = os.open(os.path.join(path, "owner.lock"), os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue  # not a complete region (or not ours to judge)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # the owner lives
        try:
            try:
                ctrl = io.MappedFile(os.path.join(path, "region"), 0, writable=True)
                ctrl.at(0, np.uint64, (1,))[CLOSED] = 1
            except (OSError, ValueError):
                pass
            _remove_region_files(path)
            removed.append(path)
        finally:
            os.close(fd)
    return removed


def kernels():
    from .. import kernels  # numba is imported when the first buffer is built, not at import

    return kernels
