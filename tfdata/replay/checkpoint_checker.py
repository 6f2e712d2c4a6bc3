"""The checks of a checkpoint's ``state.json``, untrusted JSON (docs/design/checkpoints.md).

:class:`Checker`: exact types and bounds of JSON values, every failure a FormatError naming the
file and the field (a dotted path from the top of the document); the spec and the buffer's
config it checks itself, every part's config and state the part's reader given the checker
(:func:`tfdata.replay.frames.read_state`, a sampler's ``check_state``, ...). Also the limits of
what a checkpoint may ask for (:data:`MAX_RING_SIZE`, the memory available:
:func:`available_memory`), :func:`open_document`, the top level of ``state.json``, and
:func:`sampler_part`, what a sampler keeps, read for its ``check_state``.
"""

from __future__ import annotations

import math
import os
import re

import numpy as np

from ..errors import FormatError, SpecError
from ..spec import Field, Spec
from ..storage import check_layout
from . import columns, frames as frame_stacks, limiter
from .checkpoint_files import STATE, VERSION, read_state
from .samplers import RNG_KEYS, STATE_BYTES_BASE, STATE_BYTES_PER_SLOT, StateError, shown as _show

#: Largest ``ring_size`` accepted from a checkpoint. A buffer allocates ``ring_size`` output
#: batches at the first sample of each batch size; the default is 2, and a larger ring only
#: lets a batch live longer. A checkpoint of a few kilobytes must not make the first sample
#: allocate gigabytes.
MAX_RING_SIZE = 64
MAX_CAPACITY = (1 << 32) - 1
#: ``n_step`` accepted from a checkpoint: at most ``max(capacity, MAX_SHORT_N_STEP)``.
MAX_SHORT_N_STEP = 1024
_U64 = (1 << 64) - 1
_MAX_NDIM = 32
_MAX_DIM = (1 << 31) - 1
_MAX_ROW_BYTES = (1 << 31) - 1
_MAX_NAME = 1024
_DTYPE = re.compile(r"^[<>|=][biufc][0-9]{1,2}$")
# the buffer's own config keys (every other key is its sampler's), and those a checkpoint of an
# earlier version may lack
_CONFIG_KEYS = ("capacity", "layout", "ring_size", "num_envs", "n_step", "gamma", "next_of",
                "elide_next", "roles")
_CONFIG_OPTIONAL = ("stats", "sampler", "rate_limiter", "frame_stack", "frame_padding",
                    "transforms")
#: the keywords of a load a checkpoint never sets: where a buffer spills and what memory it
#: takes are the caller's
OVERRIDES = ("spill_path", "hot_rows", "hot_bytes", "allocator", "memory_budget")


def show_layout(layout) -> str:
    return repr(layout) if isinstance(layout, str) else str([list(g) for g in layout])[:200]


class Checker:
    """Validation of one ``state.json``: every failure is a FormatError naming the file and the
    field (a dotted path from the top of the document). The parts' readers
    (:func:`tfdata.replay.frames.read_state`, ...) are given one."""

    def __init__(self, spath: str):
        self.spath = spath

    def fail(self, where: str, expected: str, got=None, *, show: bool = True):
        tail = f", got {_show(got)}" if show else ""
        raise FormatError(f"{self.spath}: {where}: expected {expected}{tail}")

    def obj(self, where: str, v, keys, optional=()) -> dict:
        if not isinstance(v, dict):
            self.fail(where, "an object", v)
        unknown = set(v) - set(keys) - set(optional)
        if unknown:
            shown = sorted(str(k)[:40] for k in unknown)[:5]
            self.fail(where, f"only the keys {sorted(set(keys) | set(optional))}; unknown "
                      f"{shown}", show=False)
        missing = [k for k in keys if k not in v]
        if missing:
            self.fail(where, f"the keys {list(keys)}; missing {missing}", show=False)
        return v

    def integer(self, where: str, v, lo: int, hi: int) -> int:
        if type(v) is not int or not lo <= v <= hi:  # a bool is not an int
            self.fail(where, f"an int in [{lo}, {hi}]", v)
        return v

    def opt_int(self, where: str, v, lo: int, hi: int):
        return None if v is None else self.integer(where, v, lo, hi)

    def real(self, where: str, v, lo: float, hi: float, lo_open: bool = False) -> float:
        if (type(v) is not float or not math.isfinite(v) or v < lo or v > hi
                or (lo_open and v == lo)):
            self.fail(where, f"a float in {'(' if lo_open else '['}{lo}, {hi}]", v)
        return v

    def flag(self, where: str, v) -> bool:
        if type(v) is not bool:
            self.fail(where, "true or false", v)
        return v

    def choice(self, where: str, v, options) -> str:
        if type(v) is not str or v not in options:
            self.fail(where, f"one of {list(options)}", v)
        return v

    def layout(self, where: str, v, spec: Spec):
        """A layout: ``"aos"``, ``"soa"`` or a grouping of ``spec``'s fields in normal form
        (bounded before it is iterated); returns it normalised (a grouping as a tuple)."""
        if not isinstance(v, (str, list)):
            self.fail(where, "'aos', 'soa' or a list of groups of field names", v)
        try:
            return check_layout(v, spec, where)
        except ValueError as exc:  # SpecError too: it names the field
            raise FormatError(f"{self.spath}: {str(exc)[:300]}") from None

    def names(self, where: str, v, spec: Spec, keys=None) -> dict:
        """An object of str to str, every value (and key, unless ``keys``) a field of ``spec``."""
        if not isinstance(v, dict):
            self.fail(where, "an object of field names", v)
        for k, name in v.items():
            if keys is not None and k not in keys:
                self.fail(where, f"keys among {list(keys)}", k)
            if keys is None and k not in spec:
                self.fail(f"{where} key", f"a field of the spec {list(spec.names)}", k)
            if type(name) is not str or name not in spec:
                self.fail(f"{where}[{k[:40]!r}]", f"a field of the spec {list(spec.names)}", name)
        return v

    def caught(self, exc: Exception, where: str) -> FormatError:
        """The FormatError of a part's TypeError or ValueError: a sampler's ``from_config``
        (``config.<key>: ...``) or ``check_state`` (:class:`StateError`: ``state.<field>``)."""
        if isinstance(exc, StateError):
            tail = "" if exc.got is None else f", got {exc.got}"
            return FormatError(f"{self.spath}: state.{exc.field}: expected {exc.expected}{tail}")
        text = str(exc)[:300]
        return FormatError(f"{self.spath}: {text if text.startswith(where) else f'{where}: {text}'}")

    # -- the buffer's own parts --------------------------------------------------------------
    def spec(self, v) -> Spec:
        self.obj("state.spec", v, ("fields",))
        fields = v["fields"]
        if not isinstance(fields, list) or not fields:
            self.fail("state.spec.fields", "a non-empty list", fields)
        out, row = [], 0
        for i, f in enumerate(fields):
            where = f"state.spec.fields[{i}]"
            self.obj(where, f, ("name", "dtype", "shape"), ("low", "high"))
            name, dtype, shape = f["name"], f["dtype"], f["shape"]
            if type(name) is not str or not 1 <= len(name) <= _MAX_NAME:
                self.fail(f"{where}.name", f"a string of 1 to {_MAX_NAME} characters", name)
            if type(dtype) is not str or not _DTYPE.match(dtype):
                self.fail(f"{where}.dtype", "a numpy dtype string of a bool or numeric type "
                          "('<f4', '|b1', ...)", dtype)
            if (not isinstance(shape, list) or len(shape) > _MAX_NDIM
                    or any(type(d) is not int or not 1 <= d <= _MAX_DIM for d in shape)):
                self.fail(f"{where}.shape", f"a list of at most {_MAX_NDIM} ints in [1, {_MAX_DIM}]",
                          shape)
            try:
                field = Field(name, np.dtype(dtype), tuple(shape))
            except (SpecError, TypeError, ValueError) as exc:
                self.fail(f"{where}.dtype", f"a bool or numeric dtype ({str(exc)[:200]})", dtype)
            if field.dtype.str != dtype:  # canonical: what a save writes for this dtype
                self.fail(f"{where}.dtype", f"{field.dtype.str!r} (numpy's canonical form)", dtype)
            if "low" in f or "high" in f:  # a field's bounds (Field.from_dict checks them)
                try:
                    field = Field.from_dict(f)
                except SpecError as exc:
                    raise FormatError(f"{self.spath}: {where}: {str(exc)[:300]}") from None
            row += field.dtype.itemsize * math.prod(shape)
            if row > _MAX_ROW_BYTES:
                self.fail("state.spec", f"rows of at most {_MAX_ROW_BYTES} bytes",
                          f"{row} bytes up to field {i}", show=False)
            out.append(field)
        try:
            return Spec(out)
        except SpecError as exc:
            raise FormatError(f"{self.spath}: state.spec: {str(exc)[:300]}") from None

    def no_overrides(self, v, more=()) -> None:
        """Refuse a config naming what only the caller sets (:data:`OVERRIDES` and ``more``)."""
        for k in OVERRIDES + tuple(more) if isinstance(v, dict) else ():
            if k in v:
                raise FormatError(
                    f"{self.spath}: config: {k!r} is not accepted from a checkpoint (loading "
                    f"never writes outside the checkpoint directory nor takes memory settings "
                    f"from a file; pass {k}= to load)")

    def streams(self, v: dict, spec: Spec, key: str, most: int) -> tuple:
        """``(capacity, layout, streams)`` of ``config``, and the other options every buffer
        has (``ring_size``, ``n_step``, ``gamma``, ``next_of``, ``roles``); ``key``: the number
        of streams (``num_envs``, ``num_writers``: a divisor of the capacity, at most ``most``)."""
        c = "config."
        cap = self.integer(c + "capacity", v["capacity"], 1, MAX_CAPACITY)
        layout = self.layout(c + "layout", v["layout"], spec)
        self.integer(c + "ring_size", v["ring_size"], 1, MAX_RING_SIZE)
        n = self.integer(c + key, v[key], 1, min(most, cap))
        if cap % n:
            self.fail(c + key, f"a divisor of the capacity {cap}", n)
        # a window never takes more rows than a stream holds, but each sample loops n_step
        # times: bounded by the capacity (or 1024, for small buffers with long windows)
        self.opt_int(c + "n_step", v["n_step"], 1, max(cap, MAX_SHORT_N_STEP))
        self.real(c + "gamma", v["gamma"], 0.0, 1.0)
        self.names(c + "next_of", v["next_of"], spec)
        self.names(c + "roles", v["roles"], spec, keys=("reward", "terminated", "truncated"))
        return cap, layout, n

    def config(self, v, spec: Spec) -> tuple:
        """``(the buffer's config, the sampler's)``: the buffer's own keys checked here and by
        the parts that have options (statistics, frame stacks, rate limiter); every other key
        is the sampler's, for its ``from_config``."""
        self.no_overrides(v)
        own = _CONFIG_KEYS + _CONFIG_OPTIONAL
        self.obj("config", v, _CONFIG_KEYS, optional=set(v) if isinstance(v, dict) else ())
        c = "config."
        cap, layout, envs = self.streams(v, spec, "num_envs", MAX_CAPACITY)
        self.flag(c + "elide_next", v["elide_next"])
        if "stats" in v:
            columns.read_names(self, c + "stats", v["stats"], spec)
        if "frame_stack" in v or "frame_padding" in v:
            frame_stacks.read_config(self, v, spec)
        if "rate_limiter" in v:
            limiter.read_config(self, v["rate_limiter"], cap)
        buffer = {k: v[k] for k in own if k in v and k != "sampler"}
        return dict(buffer, layout=layout), {k: x for k, x in v.items() if k not in own}

    def sampler(self, v) -> dict:
        """``state.sampler``: the RNG's seed and counter (every sampler's)."""
        self.obj("state.sampler", v, RNG_KEYS)
        for k in RNG_KEYS:
            self.integer(f"state.sampler.{k}", v[k], 0, _U64)
        return v

    def rebuild(self, cls, *args, **kw):
        """``cls(*args, **kw)``, the buffer a checked checkpoint describes: what its constructor
        still refuses is a FormatError."""
        try:
            return cls(*args, **kw)
        except (SpecError, ValueError, TypeError, KeyError, OverflowError) as exc:
            raise FormatError(f"{self.spath}: cannot rebuild the buffer ({type(exc).__name__}: "
                              f"{str(exc)[:300]})") from None


def sampler_part(c: Checker, arrays, part, key: str, capacity: int) -> dict:
    """``state.<key>``, what a sampler keeps beyond its RNG position, decoded for its
    ``check_state``: an object whose top-level array references are read (bool or numeric
    arrays of at most :data:`STATE_BYTES_PER_SLOT` bytes per slot, plus
    :data:`STATE_BYTES_BASE`, in all, from the headers) and whose other values are JSON
    values. ``arrays``: the :class:`~tfdata.replay.checkpoint_files.Arrays` of the checkpoint."""
    w = f"state.{key}"
    if not isinstance(part, dict):
        c.fail(w, "an object (what the sampler keeps beyond its RNG position)", part)
    room = STATE_BYTES_PER_SLOT * capacity + STATE_BYTES_BASE
    out = {}
    for k, v in part.items():
        if k in RNG_KEYS:
            c.fail(f"{w}.{k}", "no such key (the RNG position is state.sampler)", v)
        if isinstance(v, dict) and "$array" in v:
            v = arrays.any(f"{w}.{k}", v, room)
            room -= v.nbytes
        out[k] = v
    return out


def open_document(path) -> tuple:
    """``(path, state.json path, document, checker)`` of the checkpoint directory ``path``, its
    top level and version checked."""
    path = os.fspath(path)
    if not os.path.lexists(path):
        raise FileNotFoundError(f"{path}: no such checkpoint")
    if not os.path.isdir(path):
        raise FormatError(f"{path}: not a checkpoint directory")
    spath = os.path.join(path, STATE)
    doc = read_state(spath)
    c = Checker(spath)
    c.obj("(top level)", doc, ("format", "version", "class", "config", "rows", "state"))
    version = doc["version"]
    if (not isinstance(version, list) or len(version) != 2
            or any(type(x) is not int for x in version) or version[0] != VERSION[0] or version[1] < 0):
        raise FormatError(f"{spath}: checkpoint version {_show(version)} is not supported "
                          f"(this tfdata reads {VERSION[0]}.x)")
    return path, spath, doc, c


def available_memory() -> int:
    """Bytes of memory available on this machine: what a load without a ``memory_budget`` may
    allocate at most."""
    import psutil

    return int(psutil.virtual_memory().available)
