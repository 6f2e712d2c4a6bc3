"""Checkpoints of replay buffers: a directory other tools can read, written without a second copy.

Layout of a checkpoint directory (format ``tfdata.checkpoint`` 1.0)::

    state.json        format, version, buffer class and constructor config, spec, writer
                      cursor and size, RNG seed and counter, scalars of the episode bookkeeping
                      and of the prioritized state; arrays are {"$array": "arrays/<name>.npy"}
    arrays/*.npy      per-slot arrays: episode numbers, priorities (leaves), write versions, ...
    rows.npy | rows/  the first ``size`` physical rows of the storage, as a tfdata dataset file
                      (AoS ``.npy`` or SoA directory, the buffer's layout)

Saving holds the buffer's lock and streams the rows from the storage into the file in chunks
of at most 16 MiB (AoS records are written straight from the storage's memory), so the peak
memory of a save is the buffer plus one chunk. The directory is written beside ``path`` and
renamed into place: a crash during a save leaves the previous checkpoint intact.

Loading validates everything through ``load_state_dict`` before a byte of the new buffer is
written, maps the rows file and copies it in 16 MiB chunks, releasing each chunk's pages.
No pickle anywhere: JSON and ``.npy`` with ``allow_pickle=False``.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np

from .errors import FormatError
from .spec import Spec

FORMAT = "tfdata.checkpoint"
VERSION = (1, 0)
_STATE = "state.json"
_SAFE = re.compile(r"^arrays/[A-Za-z0-9_.\-]+\.npy$")


def _classes() -> dict:
    from .buffer import ReplayBuffer
    from .prioritized import PrioritizedReplayBuffer

    # an allow-list: a checkpoint names a class, it never makes tfdata import or call anything else
    return {"ReplayBuffer": ReplayBuffer, "PrioritizedReplayBuffer": PrioritizedReplayBuffer}


def _encode(obj, base: str, prefix: str, arrays: list):
    """JSON-able copy of ``obj`` with every ndarray written to ``arrays/<prefix>.npy``."""
    if isinstance(obj, np.ndarray):
        rel = f"arrays/{prefix}.npy"
        np.save(os.path.join(base, rel), obj, allow_pickle=False)
        arrays.append(rel)
        return {"$array": rel}
    if isinstance(obj, dict):
        return {k: _encode(v, base, f"{prefix}.{k}" if prefix else str(k), arrays) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_encode(v, base, f"{prefix}.{i}", arrays) for i, v in enumerate(obj)]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def _decode(obj, base: str):
    if isinstance(obj, dict):
        if set(obj) == {"$array"}:
            rel = obj["$array"]
            if not isinstance(rel, str) or not _SAFE.match(rel):
                raise FormatError(f"{base}: array reference {rel!r} is not a file under arrays/")
            try:
                return np.load(os.path.join(base, rel), allow_pickle=False)
            except (ValueError, OSError) as exc:
                raise FormatError(f"{base}: {rel}: {exc}") from None
        return {k: _decode(v, base) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v, base) for v in obj]
    return obj


def save(buffer, path) -> None:
    """Write ``buffer`` to the checkpoint directory ``path`` (see the module docstring)."""
    from .io import Writer, _chunk_rows

    path = os.fspath(path).rstrip(os.sep)
    tmp = path + ".tmp-checkpoint"
    if os.path.exists(tmp):
        shutil.rmtree(tmp)
    os.makedirs(os.path.join(tmp, "arrays"))
    storage = buffer._storage
    rows_name = "rows.npy" if storage.layout == "aos" else "rows"
    try:
        with buffer._lock:
            state = buffer._state_unlocked(copy=False)
            state.pop("data")
            size = buffer._writer.size
            step = _chunk_rows(storage.spec.row_nbytes)
            with Writer(os.path.join(tmp, rows_name), storage.spec, storage.layout) as w:
                for start in range(0, size, step):
                    stop = min(size, start + step)
                    if storage.layout == "aos":
                        w.append_records(storage.data[start:stop])
                    else:
                        w.append({name: col[start:stop] for name, col in storage.columns.items()})
            arrays: list = []
            doc = {"format": FORMAT, "version": list(VERSION), "class": type(buffer).__name__,
                   "config": _encode(buffer._config(), tmp, "config", arrays), "rows": rows_name,
                   "state": _encode(state, tmp, "", arrays)}
        with open(os.path.join(tmp, _STATE), "w") as f:
            json.dump(doc, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = path + ".old-checkpoint"
    if os.path.exists(path):
        if os.path.exists(old):
            shutil.rmtree(old)
        os.rename(path, old)
    os.rename(tmp, path)
    if os.path.exists(old):
        shutil.rmtree(old)


_OVERRIDES = ("spill_path", "hot_rows", "hot_bytes", "allocator", "memory_budget")


def load(path, **overrides):
    """Rebuild the buffer saved in ``path``; raises :class:`FormatError` for a bad checkpoint.

    ``overrides``: ``spill_path`` and ``hot_rows`` / ``hot_bytes`` to rebuild a buffer larger
    than memory as a spilling buffer (a checkpoint does not record where a buffer spilled);
    ``allocator`` and ``memory_budget`` as for the buffer's constructor (not recorded either).
    """
    bad = set(overrides) - set(_OVERRIDES)
    if bad:
        raise TypeError(f"load: unexpected keyword(s) {sorted(bad)}; allowed: {_OVERRIDES}")
    from .dataset import MmapDataset

    path = os.fspath(path)
    from .io import read_json_doc

    spath = os.path.join(path, _STATE)
    doc = read_json_doc(spath, "tfdata checkpoint", FORMAT, 64 << 20)
    version = doc.get("version")
    if not (isinstance(version, list) and len(version) == 2 and version[0] == VERSION[0]):
        raise FormatError(f"{spath}: checkpoint version {version!r} is not supported "
                          f"(this tfdata reads {VERSION[0]}.x)")
    classes = _classes()
    cls = classes.get(doc.get("class"))
    if cls is None:
        raise FormatError(f"{spath}: unknown buffer class {doc.get('class')!r} (known: {sorted(classes)})")
    config = _decode(doc.get("config"), path)
    state = _decode(doc.get("state"), path)
    if not isinstance(config, dict) or not isinstance(state, dict):
        raise FormatError(f"{spath}: config and state must be objects")
    rows_name = doc.get("rows")
    if rows_name not in ("rows.npy", "rows"):
        raise FormatError(f"{spath}: rows must be 'rows.npy' or 'rows', got {rows_name!r}")
    try:
        spec = Spec.from_dict(state["spec"])
        buf = cls(spec, **config, **overrides)
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{spath}: cannot rebuild the buffer ({type(exc).__name__}: {exc})") from None
    with MmapDataset.open(os.path.join(path, rows_name)) as ds:
        stored = buf._storage.spec
        if ds.spec != stored:
            raise FormatError(f"{path}/{rows_name}: fields {ds.spec} differ from the buffer's {stored}")
        size = state.get("writer", {}).get("size") if isinstance(state.get("writer"), dict) else None
        if size != len(ds):
            raise FormatError(f"{path}/{rows_name}: holds {len(ds)} rows, the state says {size}")
        state["data"] = {name: ds.field(name) for name in stored.names}
        buf.load_state_dict(state, _release=ds.release, _records=ds.records if ds.layout == "aos" else None)
        state["data"] = None
    return buf
