"""A per-buffer ``push`` and ``extend`` specialised to its spec, for the hot path; the design
is docs/design/write-path.md.

For a given spec the checks are known when the buffer is built, so this module writes them out
once, field by field, as the source of one small function (as ``dataclasses`` does), compiled
with ``exec``. The generated function only accepts the inputs it can prove safe (ndarrays of the
field's dtype and shape, views and slices included; scalars whose type casts without loss, or
whose value fits; 0-d arrays read as their scalar; a plain dict with exactly the spec's keys);
anything else goes to the generic path, which validates in full and raises the precise error.
Both paths write the same values.

Two tiers of writes. The first writes with :mod:`struct` into byte views of the storage (one
``Struct.pack_into`` per region of records, one ``memoryview`` item or slice per column); since
``pack_into`` zeroes its span and then writes field by field, it takes only values it can prove
it packs exactly as numpy would assign them (Python and numpy scalars of every width: ints in
range, floats of a float32 field within its range or not finite, ints of a float field at most
2**53). Other valid values take the second tier, numpy assignments. The storage says where each field's bytes are
(:meth:`tfdata.storage.AoSStorage.byte_regions`); this module never sees a layout.
"""

from __future__ import annotations

import functools
import struct

import numpy as np

from ..spec import Field, Spec

#: records of at most this many rows are packed one ``pack_into`` each; more are interleaved by
#: one compiled call per region (``kernels._records``)
PACK_ROWS = 1


@functools.lru_cache(maxsize=128)
def _compiled(src: str, what: str = "push"):
    # buffers of the same spec share the code object (compiling is slow)
    return compile(src, f"<tfdata generated {what}>", "exec")


# struct codes of the dtypes the first tier packs ('=': native order, standard sizes, no
# alignment: the storage's own offsets place every field)
_CODES = {"b": "?", "i1": "b", "u1": "B", "i2": "h", "u2": "H", "i4": "i", "u4": "I", "i8": "q",
          "u8": "Q", "f4": "f", "f8": "d"}
_F32_MAX = float(np.finfo(np.float32).max)
_EXACT = 2 ** 53  # ints up to this size are exact doubles: one rounding into float32, as numpy's
_INF = float("inf")
# every numpy integer scalar type (np.longlong is a type of its own beside np.int64), and the
# ones whose every value is an exact double
_NP_INTS = frozenset(t for t in set(np.sctypeDict.values())
                     if isinstance(t, type) and issubclass(t, np.generic) and np.dtype(t).kind in "iu")
_SMALL_INTS = frozenset(t for t in _NP_INTS if np.dtype(t).itemsize <= 4)


def _code(dtype: np.dtype) -> str | None:
    key = "b" if dtype.kind == "b" else f"{dtype.kind}{dtype.itemsize}"
    return _CODES.get(key)


def _array_guard(v: str, i: int, shape: tuple) -> str:
    """The check that ``v`` is an ndarray of field ``i``'s dtype ``dt{i}`` and shape ``sh{i}``
    (``shape``): a view or slice of a larger array, contiguous or not, passes; an equal dtype
    that is not numpy's own object passes too (an unpickled array's, as a subprocess vector env
    returns). A 1-D shape is checked as ``ndim`` and ``len``, which builds no tuple."""
    head = f"type({v}) is ndarray and ({v}.dtype is dt{i} or {v}.dtype == dt{i})"
    if len(shape) == 1:
        return f"{head} and {v}.ndim == 1 and len({v}) == {shape[0]}"
    return f"{head} and {v}.shape == sh{i}"


def _tier1(f, v: str, i: int, ns: dict) -> str | None:
    """The first tier's check of field ``f`` held in variable ``v``, or None if the field cannot
    take the first tier (float16, complex).

    A scalar passes by its type alone when every value of that type packs as numpy assigns it
    (``pk``), or by its type and its value (``rk``, ``ik``): ints within the field's range, ints
    of a float field within 2**53 (exact doubles: one rounding, as numpy's cast), floats of a
    float32 field within its range, NaN or infinite (``struct`` refuses a finite value that
    rounds to infinity, numpy stores the infinity). The types are numpy's scalars of every width
    and Python's; a 0-d array is read as its scalar before (see :func:`_scalars`).
    """
    if _code(f.dtype) is None:
        return None
    if f.shape:
        ns[f"dt{i}"], ns[f"sh{i}"] = f.dtype, f.shape
        return _array_guard(v, i, f.shape)
    kind = f.dtype.kind
    if kind == "b":  # ints of 0 and 1 only, as Spec.check_row
        ns[f"pk{i}"], ns[f"rk{i}"] = _BOOLS, _INTS
        # Python's bools by identity first: the commonest flags, cheaper than a set lookup
        return (f"({v} is True or {v} is False or type({v}) in pk{i}"
                f" or type({v}) in rk{i} and 0 <= {v} <= 1)")
    if kind in "iu":
        ns[f"lo{i}"], ns[f"hi{i}"] = f.int_bounds
        ns[f"pk{i}"], ns[f"rk{i}"] = _int_types(f.dtype, f.scalar_types)
        return (f"(type({v}) is int and lo{i} <= {v} <= hi{i} or type({v}) in pk{i}"
                f" or type({v}) in rk{i} and lo{i} <= {v} <= hi{i})")
    ns[f"ik{i}"] = _WIDE_INTS  # exact below 2**53 only
    ints = f"type({v}) in ik{i} and -EXACT <= {v} <= EXACT"
    if f.dtype.itemsize == 4:
        ns[f"rk{i}"], ns[f"pk{i}"] = _DOUBLES, _INTO_F4
        # a Python float within range by its type first (the commonest reward); NF32, not
        # -F32: a negation in the source would build a float at every call
        return (f"(type({v}) is float and NF32 <= {v} <= F32 or type({v}) in rk{i}"
                f" and (NF32 <= {v} <= F32 or {v} != {v} or {v} == INF or {v} == -INF)"
                f" or type({v}) in pk{i} or {ints})")
    ns[f"pk{i}"] = _INTO_F8
    return f"(type({v}) is float or type({v}) in pk{i} or {ints})"


_BOOLS = frozenset({bool, np.bool_})
_INTS = frozenset({int}) | _NP_INTS
_WIDE_INTS = frozenset({int}) | (_NP_INTS - _SMALL_INTS)
_DOUBLES = frozenset({float, np.float64})
_INTO_F4 = frozenset({np.float32, np.float16, bool, np.bool_}) | _SMALL_INTS
_INTO_F8 = _INTO_F4 | _DOUBLES


@functools.lru_cache(maxsize=64)
def _int_types(dtype: np.dtype, scalar_types: frozenset) -> tuple:
    """``(pk, rk)`` of an integer field: the numpy ints that cast safely are in range by type;
    the others (and Python's) by value; np.bool_ has no __index__ (read as a bool before: see
    :func:`_scalars`)."""
    safe = frozenset(t for t in scalar_types if t is not np.bool_)
    return safe, (_NP_INTS - safe) | {int}


def _scalars(spec: Spec, ns: dict) -> list:
    """Source lines that read a 0-d array given for a scalar field as its numpy scalar, and a
    numpy bool given for an integer field as a Python bool (``struct`` takes no np.bool_ for
    an integer code): the values a failed first check looks at again."""
    lines = []
    for i, f in enumerate(spec):
        if f.shape or _code(f.dtype) is None:
            continue
        # (numeric only: an object array's item is anything, and the generic path refuses it)
        lines += [f"        if type(v{i}) is ndarray and v{i}.ndim == 0 and v{i}.dtype.kind in 'biuf':",
                  f"            v{i} = v{i}[()]"]
        if f.dtype.kind in "iu":
            lines += [f"        if type(v{i}) is bool_:", f"            v{i} = bool(v{i})"]
    ns["bool_"] = np.bool_
    return lines


def exact_guard(f, i: int, ns: dict) -> str:
    """The generated check that value ``v{i}`` enters field ``f`` as it is (the second tier):
    an ndarray of its exact dtype and shape, or a scalar type that casts without loss (ints
    within the field's range). Puts the names it uses into ``ns``."""
    v = f"v{i}"
    if f.shape:
        ns[f"dt{i}"], ns[f"sh{i}"] = f.dtype, f.shape
        return _array_guard(v, i, f.shape)
    ns[f"ok{i}"] = f.scalar_types
    if f.int_bounds is not None:
        ns[f"lo{i}"], ns[f"hi{i}"] = f.int_bounds
        return f"(type({v}) in ok{i} or type({v}) is int and lo{i} <= {v} <= hi{i})"
    return f"type({v}) in ok{i}"


def make_push(spec: Spec, arrays: list, writer, lock, slow, on_wrap=None, on_write=None,
              on_begin=None, regions=None, gate=None, place=None):
    """Return ``push(row)`` for ``spec``.

    Parameters
    ----------
    spec : Spec
    arrays : list of ndarray
        Field views of the storage in spec order, each ``(capacity, *field.shape)``.
    writer : RingWriter
        Its ``cursor`` and ``size`` are advanced under ``lock``.
    lock : threading.Lock
        The buffer's lock.
    slow : callable
        ``slow(row)``: the generic validated push, used for any input the fast path does not
        accept.
    on_wrap : callable, optional
        ``on_wrap()``, called under the lock by the push that fills the last slot, before the
        cursor goes back to 0 (the episode bookkeeping stamps the rows pushed since it last
        looked: :meth:`tfdata.replay.episodes.Episodes.wrapped`).
    on_write : callable, optional
        ``on_write(slot)``, called under the lock after the row is written and before the cursor
        moves (a prioritized buffer sets the slot's priority there; a shared buffer's writer
        publishes the row).
    on_begin : callable, optional
        ``on_begin(slot)``, called under the lock before the first byte is written (a shared
        buffer's writer waits for room and announces the row there); may raise, and then
        nothing is written.
    place : callable, optional
        ``place(cursor)``: the slot the row goes to instead of the cursor's (exactly-k: the next
        free slot), called under the lock before the first byte is written; may wait or raise
        (then nothing is written). The cursor then moves past that slot. Not with ``on_begin``.
    regions : list, optional
        Where the fields' bytes are, as the storage's ``byte_regions`` gives them:
        ``[(raw, stride, [(field_index, offset), ...]), ...]``, ``raw`` a writable uint8 array of
        ``capacity * stride`` bytes in which field ``i`` of slot ``p`` starts at byte
        ``p * stride + offset``. Without it only the second tier (numpy assignments) is used.
    gate : callable, optional
        ``gate(1)``, called under the lock before the slot is read: a rate limiter waits there
        (releasing the lock, so the slot is read after) and counts the row; may raise, and
        then nothing is written. None: no line is generated.
    """
    if place is not None and on_begin is not None:
        raise ValueError("make_push: place and on_begin are exclusive")
    ns = {"ndarray": np.ndarray, "slow": slow, "w": writer, "lock": lock, "cap": writer.capacity,
          "on_write": on_write, "on_begin": on_begin, "gate": gate, "place": place, "acquire": lock.acquire,
          "release": lock.release, "F32": _F32_MAX, "NF32": -_F32_MAX, "EXACT": _EXACT, "INF": _INF,
          "on_wrap": on_wrap}
    reads, checks, writes, fast_checks = [], [], [], []
    for i, f in enumerate(spec):
        v = f"v{i}"
        ns[f"a{i}"] = arrays[i]
        reads.append(f"        {v} = row[{f.name!r}]")
        checks.append(exact_guard(f, i, ns))
        writes.append(f"        a{i}[p] = {v}")
        fast_checks.append(_tier1(f, v, i, ns))
    fast = _fast_writes(spec, regions, fast_checks, ns) if regions is not None else None
    def write(indent: str, writes: list) -> list:
        """The locked part of a push at ``indent``: place, hooks, ``writes``, cursor, size."""
        if on_wrap is None:
            advance = [f"{indent}w.cursor = p + 1 if p + 1 != cap else 0"]
        else:
            advance = [f"{indent}q = p + 1", f"{indent}if q != cap:", f"{indent}    w.cursor = q",
                       f"{indent}else:", f"{indent}    on_wrap()", f"{indent}    w.cursor = 0"]
        return [*([] if gate is None else [f"{indent}gate(1)"]),
                f"{indent}p = w.cursor" if place is None else f"{indent}p = place(w.cursor)",
                *([] if on_begin is None else [f"{indent}on_begin(p)"]),
                *writes,
                *([] if on_write is None else [f"{indent}on_write(p)"]),
                *advance, f"{indent}if w.size != cap:", f"{indent}    w.size += 1"]
    def second_tier(indent: str) -> list:
        """The numpy assignments of values the first tier does not take, after their check."""
        return [f"{indent}if not (" + f"\n{indent}        and ".join(checks) + "):",
                f"{indent}    return slow(row)", f"{indent}with lock:",
                *write(indent + "    ", [indent + line[4:] for line in writes])]

    lines = [
        "def push(row):",
        f"    if type(row) is not dict or len(row) != {len(spec)}:",
        "        return slow(row)",
        "    try:",
        *reads,
        "    except KeyError:",
        "        return slow(row)",
    ]
    if fast is not None:
        guard, body = fast
        cond = "(" + "\n            and ".join(guard) + ")"
        lines += [
            f"    if not {cond}:",
            "        # 0-d arrays, numpy bools of an int field: read as scalars, then checked again",
            *_scalars(spec, ns),
            f"        if not {cond}:",
            *["        " + line for line in second_tier("    ")],
            "            return",
            "    acquire()",
            "    try:",
            *write("        ", [line[4:] for line in body]),  # (body: written at 12 spaces)
            "    finally:",
            "        release()",
        ]
    else:
        lines += second_tier("    ")
    src = "\n".join(lines)
    exec(_compiled(src), ns)
    # popped: the function's globals are ns, so ns holding it would be a reference cycle that
    # keeps the storage's views (and a shared region's map) alive until a cyclic collection
    push = ns.pop("push")
    push.__source__ = src
    return push


def _fast_writes(spec: Spec, regions: list, fast_checks: list, ns: dict):
    """The first tier: ``(guard, body)`` source lines, or None if no field can take it."""
    if all(c is None for c in fast_checks):
        return None
    guard, body, numpy_writes = [], [], []
    for r, (raw, stride, members) in enumerate(regions):
        ns[f"r{r}"] = memoryview(raw)
        packed = [(off, i) for i, off in members if fast_checks[i] is not None]
        for i, _ in members:
            if fast_checks[i] is None:  # float16, complex: numpy writes after the pack below
                numpy_writes.append(f"            a{i}[p] = v{i}")
        if not packed:
            continue
        packed.sort()
        if len(members) == 1:  # a column of its own: one item or slice assignment
            off, i = packed[0]
            f = spec[spec.names[i]]
            if f.shape:
                nb = f.nbytes
                # pack_into of the bytes: no slice of the memoryview to build
                ns[f"S{r}"] = struct.Struct(f"{nb}s")
                at = f"p * {stride}" + (f" + {off}" if off else "")
                body.append(f"            S{r}.pack_into(r{r}, {at}, v{i}.tobytes())")
            else:
                ns[f"m{r}"] = memoryview(raw).cast(_code(f.dtype))
                body.append(f"            m{r}[p] = v{i}")
            continue
        # several fields in one region (records): one pack at the row's offset
        fmt, args, at = ["="], [], packed[0][0]
        for off, i in packed:
            f = spec[spec.names[i]]
            if off > at:
                fmt.append(f"{off - at}x")
            fmt.append(f"{f.nbytes}s" if f.shape else _code(f.dtype))
            args.append(f"v{i}.tobytes()" if f.shape else f"v{i}")
            at = off + f.nbytes
        ns[f"S{r}"] = struct.Struct("".join(fmt))
        at = f"p * {stride}" + (f" + {packed[0][0]}" if packed[0][0] else "")
        body.append(f"            S{r}.pack_into(r{r}, {at}, {', '.join(args)})")
    for i, c in enumerate(fast_checks):
        if c is None:  # the second tier's check: numpy writes it, validated as there
            c = exact_guard(spec[spec.names[i]], i, ns)
        guard.append(c)
    return guard, body + numpy_writes


# the numeric dtypes a scalar field of an extend of few rows may come in: those numpy casts
# without loss of a value class (``astype``, the generic path's own cast) and, into an integer
# field, the integers that fit only by value (``tolist`` and ``struct``, which checks the range)
_NUMERIC = tuple(np.dtype(c) for c in "?bhilqBHILQefdg")


@functools.lru_cache(maxsize=64)
def _casts(dtype: np.dtype, rule: str) -> frozenset:
    """The dtypes of :data:`_NUMERIC` whose values enter a scalar field of ``dtype`` by
    ``rule`` (:meth:`tfdata.spec.Field.cast_rule`); cached: every buffer built asks again."""
    f = Field("f", dtype)
    out = frozenset(d for d in _NUMERIC if f.cast_rule(d) == rule)
    return out | {dtype} if rule == "ok" else out  # its own dtype, whatever its byte order


def _sources(f) -> frozenset:
    """Source dtypes an extend converts itself for field ``f`` (its own always)."""
    ok = {f.dtype}
    if not f.shape and _code(f.dtype) is not None and f.dtype.kind in "fiu":
        ok |= _casts(f.dtype, "ok")
        if f.dtype.kind in "iu":
            ok |= _casts(f.dtype, "range")
    return frozenset(ok)


def make_extend(spec: Spec, writer, lock, slow, regions: list, max_rows: int = 16, num_envs: int = 1,
                stamp=None, on_write=None, on_wrap=None, write=None, direct=False, gate=None,
                elide=None):
    """Return ``extend(batch)`` for ``spec``, specialised to batches of at most ``max_rows`` rows
    (one step of a vector env): each field becomes the bytes of its ``n`` rows (``tobytes`` for
    the field's own dtype; numpy's ``astype`` for a dtype of :func:`_sources` it casts from
    without losing a value class, such as the float64 rewards gymnasium returns; ``tolist`` and
    :mod:`struct`, which checks the range, for ints that fit by value), then the rows are written with
    one slice assignment per region (SoA), one ``pack_into`` per record (AoS, up to
    :data:`PACK_ROWS` rows) or one compiled call per region of records (more rows,
    :func:`tfdata.kernels._records.scatter_fields`). Everything that
    can refuse (a value out of range, a float too large for float32) runs before the first byte
    is written; a refused or unusual batch (more rows, a wrap of the ring, anything else) goes to
    ``slow``, the generic validated extend. Only when a check fails, the batch is looked at
    once more: a scalar field's list or tuple read by ``np.asarray`` (the generic path's
    reading), ints of 0 and 1 given for a bool field read as bools (:func:`_as_flags`); then
    checked again.

    Parameters
    ----------
    spec, writer, lock, slow, regions
        As :func:`make_push`.
    max_rows : int
        Largest batch taken.
    num_envs : int
        Rows per step; a batch must hold whole steps.
    stamp : tuple, optional
        ``(f, term_i, trunc_i)``: ``f(term, trunc, slot)`` stamps episode numbers of the rows
        written from ``slot`` (several streams), given the fields at positions ``term_i`` and
        ``trunc_i``; None when the bookkeeping stamps late or there is none.
    on_write : callable, optional
        ``on_write(slot)`` per written slot, as in :func:`make_push`.
    on_wrap : callable, optional
        As in :func:`make_push`: called when a batch fills the last slot.
    write : callable, optional
        ``write(values, n)``: the buffer's write of ``n`` rows already checked (values in spec
        order). A larger batch whose every field has exactly the field's dtype (with
        ``direct``, also the dtypes :func:`_many_rows` takes) and the same ``n`` goes there,
        which spares it the generic check.
    direct : bool
        True when no part reacts to a write that does not reach the ring's end (no hook, or
        only hooks that hear laps) and episode numbers are stamped late (or not kept): such a
        larger batch that does not reach the ring's end is then written under the lock without
        the writer's bookkeeping, one numpy assignment per field into its strided view of
        ``regions`` (see :func:`_many_rows`).
    gate : tuple, optional
        ``(wait, count)``: ``wait(n)`` under the lock before the slot is read (a rate limiter
        waits there, releasing the lock), ``count(n)`` under the lock once ``n`` rows are
        written. None: no line is generated.
    elide : Elision, optional
        The buffer does not store one next field (``elide_next``): ``regions`` are those of
        the stored fields, and one compiled call (:func:`tfdata.kernels.elide_step`) checks the
        stream's continuity and keeps the final table, the pending values and the episode
        numbers before the stored fields are written. A row that breaks its stream, a full
        final table or a wrap goes to ``slow``, which raises or grows the table.
    """
    records = any(len(members) > 1 for _, _, members in regions)
    if elide is not None:
        # the storage's field i is the caller's field stored[i]
        regions = [(raw, stride, [(elide.stored[i], off) for i, off in members])
                   for raw, stride, members in regions]
    if max_rows < num_envs:
        return slow
    ns = {"on_wrap": on_wrap, "write": write, "ndarray": np.ndarray, "slow": slow, "w": writer, "cap": writer.capacity,
          "acquire": lock.acquire, "release": lock.release, "on_write": on_write,
          "stamp": None if stamp is None else stamp[0],
          "packer": _packer, "StructError": struct.error, "frombuffer": np.frombuffer, "U8": np.uint8,
          "asarray": np.asarray, "as_flags": _as_flags,
          "gate": None if gate is None else gate[0], "count": None if gate is None else gate[1]}
    names = spec.names
    reads, arrays, rows, checks, blobs = [], [], [], [], []
    lists, flags = [], []  # the second look of a batch whose arrays or dtypes fail the checks
    for i, f in enumerate(spec):
        reads.append(f"        v{i} = batch[{f.name!r}]")
        if not f.shape:
            # a scalar field's list or tuple: read as the generic path reads it (np.asarray)
            lists += [f"            if type(v{i}) is list or type(v{i}) is tuple:",
                      f"                v{i} = asarray(v{i})"]
        if f.dtype.kind == "b" and not f.shape and (elide is None or i in elide.stored):
            # ints as flags, 0 and 1 only (the generic path's range rule): read as bools
            ns[f"fl{i}"] = _casts(f.dtype, "range")
            flags += [f"            if v{i}.dtype in fl{i}:", f"                v{i} = as_flags(v{i})"]
        ns[f"src{i}"], ns[f"dt{i}"], ns[f"sh{i}"] = _sources(f), f.dtype, f.shape
        # each check once, the cheap ones first: arrays of the right ndim, then their rows (the
        # first array's, n, read after the ndim is known), then shapes and dtypes
        arrays.append(f"type(v{i}) is ndarray and v{i}.ndim == {1 + len(f.shape)}")
        if i:
            rows.append(f"len(v{i}) == n")
        if f.shape:
            rows.append(f"v{i}.shape[1:] == sh{i}")
        checks.append(f"v{i}.dtype in src{i}")
        if elide is not None and i in (elide.i_src, elide.i_next):
            checks[-1] += f" and v{i}.dtype is dt{i}"  # compared and kept as bytes
        if elide is not None and i not in elide.stored:
            continue
        if len(ns[f"src{i}"]) == 1:
            blobs.append(f"        b{i} = v{i}.tobytes()")
        else:
            # numpy's cast (the generic path's own) where it loses no value class; ints that fit
            # by value only through struct, which checks the range
            ns[f"cast{i}"] = cast = ns[f"src{i}"] & _casts(f.dtype, "ok")
            other = f"v{i}.astype(dt{i}).tobytes()"
            if len(cast) < len(ns[f"src{i}"]):
                other += f" if v{i}.dtype in cast{i} else packer({_code(f.dtype)!r}, n).pack(*v{i}.tolist())"
            blobs.append(f"        b{i} = v{i}.tobytes() if v{i}.dtype is dt{i} or v{i}.dtype == dt{i} else {other}")
    writes = []
    for r, (raw, stride, members) in enumerate(regions):
        ns[f"r{r}"] = memoryview(raw)
        if len(members) == 1:
            i, off = members[0]
            writes.append(f"            r{r}[p * {stride}:(p + n) * {stride}] = b{i}")
            continue
        members = sorted(members, key=lambda m: m[1])
        fmt, args, at = ["="], [], members[0][1]
        for i, off in members:
            nb = spec[names[i]].nbytes
            if off > at:
                fmt.append(f"{off - at}x")
            fmt.append(f"{nb}s")
            args.append(f"b{i}[k * {nb}:(k + 1) * {nb}]")
            at = off + nb
        ns[f"S{r}"] = struct.Struct("".join(fmt))
        ones = ", ".join(f"b{i}" for i, _ in members)  # one row: the blobs as they are
        writes += [f"            if n == 1:",
                   f"                S{r}.pack_into(r{r}, p * {stride} + {members[0][1]}, {ones})",
                   f"            else:",
                   f"                for k in range(n):",
                   f"                    S{r}.pack_into(r{r}, (p + k) * {stride} + {members[0][1]}, "
                   f"{', '.join(args)})"]
    if records:
        # beyond PACK_ROWS rows, one compiled call per region of records interleaves the fields'
        # checked bytes
        from ..kernels._records import scatter_fields

        ns["scatter"] = scatter_fields
        big = []
        for r, (raw, stride, members) in enumerate(regions):
            if len(members) == 1:
                i, _ = members[0]
                big.append(f"                r{r}[p * {stride}:(p + n) * {stride}] = b{i}")
                continue
            ns[f"R{r}"] = raw.reshape(-1, stride)
            ns[f"SP{r}"] = np.array([(off, spec[names[i]].nbytes) for i, off in members], np.int64)
            srcs = "".join(f"b{i}, " for i, _ in members)
            big += [f"                if scatter(R{r}, p, n, ({srcs}), SP{r}):",
                    f"                    raise RuntimeError('scatter_fields refused region {r}')"]
        writes = [f"            if n > {PACK_ROWS}:", *big, "            else:",
                  *["    " + w for w in writes]]
    tail = [
        *writes,
        *([] if stamp is None else [
            f"            stamp(v{stamp[1]}, v{stamp[2]}, p)"]),
        *([] if on_write is None else ["            for k in range(n):",
                                       "                on_write(p + k)"]),
        *(["            w.cursor = p + n if p + n != cap else 0"] if on_wrap is None else [
            "            if p + n != cap:",
            "                w.cursor = p + n",
            "            else:",
            "                on_wrap()",
            "                w.cursor = 0"]),
        "            if w.size != cap:",
        "                w.size = min(cap, w.size + n)",
        *([] if gate is None else ["            count(n)"]),
    ]
    if elide is not None:
        def first_step(*args):  # compiled at the first write, not when the buffer is built
            ns["estep"] = step = elide.compile(args)
            return step(*args)

        ns.update(estep=first_step, ep=elide.episodes, NXT=elide.name, fin=[None, None],
                  final_bytes=elide.final_bytes, pend=elide.pending, hasp=elide.has_pending,
                  episode=elide.episode, current=elide.current)
        i_s, i_n = elide.i_src, elide.i_next
        blobs += [f"        s8 = {_row_bytes(spec[names[i_s]], f'v{i_s}')}",
                  f"        n8 = {_row_bytes(spec[names[i_n]], f'v{i_n}')}"]

        def elided(tail):
            t, tr = elide.i_term, elide.i_trunc
            return [
                "            t = ep.finals[NXT]",
                "            if t is not fin[0]:  # the table grew: its bytes again",
                "                fin[0], fin[1] = t, final_bytes(t)",
                f"            r = estep(s8, n8, v{t}, v{tr}, p, ep.final_idx, fin[1], ep.free,",
                "                      ep.n_free, pend, hasp, episode, current)",
                "            if r >= 0:  # refused: the generic path says why, or grows the table",
                "                wrapped = True",
                "            else:",
                "                ep.n_free = -1 - r",
                *["    " + line for line in tail],
                "                ep.stamped = w.cursor",
            ]
    lines = [
        "def extend(batch):",
        f"    if type(batch) is not dict or len(batch) != {len(spec)}:",
        "        return slow(batch)",
        "    try:",
        *reads,
        "    except KeyError:",
        "        return slow(batch)",
        "    if not (" + "\n            and ".join(arrays) + "):",
        *(["        return slow(batch)"] if not lists else [
            "        try:",
            *lists,
            "        except Exception:  # ragged, junk: the generic path says why",
            "            return slow(batch)",
            "        if not (" + "\n                and ".join(arrays) + "):",
            "            return slow(batch)"]),
        "    n = len(v0)",
        "    if not (" + "\n            and ".join(rows or ["True"]) + "):",
        "        return slow(batch)",
        *([] if write is None else _many_rows(spec, max_rows, regions if direct else None, gate, ns)),
        f"    if not (0 < n <= {max_rows} and n % {num_envs} == 0\n            and "
        + "\n            and ".join(checks) + "):",
        *(["        return slow(batch)"] if not flags else [
            f"        if not (0 < n <= {max_rows} and n % {num_envs} == 0):",
            "            return slow(batch)",
            "        try:",
            *flags,
            "        except ValueError:  # not 0 or 1: the generic path refuses it",
            "            return slow(batch)",
            "        if not (" + "\n                and ".join(checks) + "):",
            "            return slow(batch)"]),
        "    try:",
        *blobs,
        "    except (StructError, OverflowError, TypeError, ValueError):",
        "        return slow(batch)  # a value the generic path must judge: it raises or casts",
        "    acquire()",
        "    try:",
        *([] if gate is None else ["        gate(n)"]),
        "        p = w.cursor",
        "        if p + n > cap:",
        "            wrapped = True",
        "        else:",
        "            wrapped = False",
        *(tail if elide is None else elided(tail)),
        "    finally:",
        "        release()",
        "    if wrapped:",
        "        return slow(batch)",
    ]
    src = "\n".join(lines)
    exec(_compiled(src, "extend"), ns)
    extend = ns.pop("extend")
    extend.__source__ = src
    return extend


def _many_rows(spec: Spec, max_rows: int, regions, gate, ns: dict) -> list:
    """Source lines of a generated extend for a batch of more than ``max_rows`` rows.

    Without ``regions``, a batch whose every field has the field's dtype goes to ``write``
    (which spares it the generic check). With them (``direct``), a scalar field may also come
    in a dtype numpy casts from without loss of a value class (float64 rewards, int64 into a
    float field: the generic path's own numpy assignment) or in integers that fit the field
    by value (checked as the generic path does, by ``min`` and ``max``), and a batch that does not reach the
    ring's end is written under the lock as one numpy assignment per field into a strided view
    of the storage's bytes: a shaped field as one opaque ``V{nbytes}`` item per row (numpy's
    strided copy of such items is several times faster than through the ``(rows, *shape)``
    view), read from the caller's rows by a view that fails, before the lock, when their last
    axis is not contiguous (then ``write``). Anything else: ``slow``.
    """
    fields = list(spec)
    values = "[" + ", ".join(f"v{i}" for i in range(len(fields))) + "]"
    conds, views, writes = [], [], []
    for i, f in enumerate(fields):
        exact = f"(v{i}.dtype is dt{i} or v{i}.dtype == dt{i})"
        if regions is not None and not f.shape:
            ns[f"okb{i}"] = _casts(f.dtype, "ok")
            exact = f"(v{i}.dtype is dt{i} or v{i}.dtype in okb{i}"
            fits = _casts(f.dtype, "range")
            if fits:  # ints that fit by value: the generic path's range check, before the lock
                ns[f"fit{i}"] = fits
                ns[f"lo{i}"], ns[f"hi{i}"] = (0, 1) if f.dtype.kind == "b" else f.int_bounds
                exact += f"\n                     or v{i}.dtype in fit{i} and lo{i} <= v{i}.min() and v{i}.max() <= hi{i}"
            exact += ")"
        conds.append(exact)
    lines = [f"    if n > {max_rows}:",
             "        if (" + "\n                and ".join(conds) + "):"]
    if regions is not None:
        for raw, stride, members in regions:
            rows = raw.shape[0] // stride
            for i, off in members:
                f = fields[i]
                if f.shape and stride == f.nbytes:  # a column of its own: contiguous
                    ns[f"d{i}"] = np.ndarray((rows, *f.shape), f.dtype, buffer=raw, offset=off)
                    writes.append(f"                    d{i}[p:p + n] = v{i}")
                elif f.shape:
                    ns[f"V{i}"] = np.dtype(f"V{f.nbytes}")
                    ns[f"d{i}"] = np.ndarray((rows, 1), ns[f"V{i}"], buffer=raw, offset=off,
                                             strides=(stride, f.nbytes))
                    flat = f"v{i}" if len(f.shape) == 1 else f"v{i}.reshape(n, {f.nbytes // f.dtype.itemsize})"
                    views.append(f"                s{i} = {flat}.view(V{i})")
                    writes.append(f"                    d{i}[p:p + n] = s{i}")
                else:
                    ns[f"d{i}"] = np.ndarray((rows,), f.dtype, buffer=raw, offset=off, strides=(stride,))
                    writes.append(f"                    d{i}[p:p + n] = v{i}")
        lines += [
            *(["            try:", *views, "            except ValueError:  # rows not contiguous",
               f"                return write({values}, n)"] if views else []),
            "            acquire()",
            "            try:",
            *([] if gate is None else ["                gate(n)"]),
            "                p = w.cursor",
            "                if p + n < cap:  # not reaching the end: no wrap, no lap",
            *writes,
            *([] if gate is None else ["                    count(n)"]),
            "                    w.cursor = p + n",
            "                    if w.size != cap:",
            "                        w.size = min(cap, w.size + n)",
            "                    return",
            "            finally:",
            "                release()"]
    return lines + [f"            return write({values}, n)", "        return slow(batch)"]


def _row_bytes(f, v: str) -> str:
    """The expression of ``v`` (``n`` rows of field ``f``, its dtype) as uint8 ``(n, f.nbytes)``,
    a view when its rows' bytes are contiguous (numpy raises ValueError otherwise)."""
    if len(f.shape) == 1:
        return f"{v}.view(U8)"
    return f"{v}.reshape(n, {f.nbytes // f.dtype.itemsize}).view(U8)"


class Elision:
    """What the generated extend of an elided buffer needs from its :class:`Episodes`: one
    next field ``name`` (position ``i_next``) elided, read from field ``i_src``; the flags at
    ``i_term`` and ``i_trunc``; ``stored``: the caller's position of each stored field."""

    __slots__ = ("episodes", "name", "i_next", "i_src", "i_term", "i_trunc", "stored",
                 "pending", "has_pending", "episode", "current")

    def __init__(self, episodes, name, i_next, i_src, stored, pending):
        self.episodes, self.name = episodes, name
        self.i_next, self.i_src, self.stored = i_next, i_src, list(stored)
        self.i_term, self.i_trunc = episodes.term_i, episodes.trunc_i
        self.pending, self.has_pending = pending, episodes.has_pending
        self.episode, self.current = episodes.episode, episodes.current

    @staticmethod
    def compile(args):
        """The entry point of :func:`tfdata.kernels.elide_step` for arguments like ``args``
        (one specialization: the caller's arrays of any stride, read-only or not)."""
        from .. import kernels

        return kernels.strided(kernels.elide_step, args, kernels.ELIDE_STRIDED, kernels.ELIDE_READONLY)

    @staticmethod
    def final_bytes(table: np.ndarray) -> np.ndarray:
        return table.reshape(table.shape[0], -1).view(np.uint8)


def _as_flags(v: np.ndarray) -> np.ndarray:
    """bool ``(n,)`` (read-only) of ``v``, ints ``(n,)``, if every value is 0 or 1 (the generic
    path's rule for ints into a bool field); ValueError otherwise (``bytes`` refuses a value
    outside ``[0, 255]``, ``strip`` leaves any other byte)."""
    b = bytes(v.tolist())
    if b.strip(b"\x00\x01"):
        raise ValueError("flags other than 0 and 1")
    return np.frombuffer(b, _BOOL)


_BOOL = np.dtype(np.bool_)


@functools.lru_cache(maxsize=256)
def _packer(code: str, n: int) -> struct.Struct:
    return struct.Struct(f"={n}{code}")
