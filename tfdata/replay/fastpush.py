"""A per-buffer ``push`` specialised to its spec, for the one-row-per-step hot path.

A generic push loops over fields, calls a checker per field and a writer per field: about
0.3 µs of interpreter work per field before any byte moves. For a given spec the checks are
known when the buffer is built, so this module writes them out once, field by field, as the
source of one small function (the technique of ``dataclasses`` and ``namedtuple``), and
compiles it with ``exec``. The generated function only accepts the inputs it can prove safe
without help (exact ndarray dtype and shape, scalar types that cast without loss, ints in
range, a plain dict with exactly the spec's keys); anything else goes to the generic path,
which validates in full and raises the precise error. Both paths write the same values.

Two tiers of writes. A numpy item assignment costs about 100 ns of dispatch however few bytes
it moves, so the first tier writes with the :mod:`struct` module into byte views of the
storage instead: fields that share one region of memory (the records of an AoS storage) are
packed by one ``Struct.pack_into`` at the row's offset, a region of one field (an SoA column)
takes one ``memoryview`` item or slice assignment. ``pack_into`` zeroes its span and then
writes field by field, so it must not fail half way: the first tier only takes values it can
prove it packs exactly as numpy would assign them (scalars of the exact Python or numpy types,
ints in range, floats of a float32 field within the float32 range, ints of a float field at
most 2**53 so that one rounding happens, as in numpy). Anything else that is valid takes the
second tier, numpy assignments as before. The storage says where each field's bytes are
(:meth:`tfdata.storage.AoSStorage.byte_regions`); this module never sees a layout.
"""

from __future__ import annotations

import functools
import struct

import numpy as np

from ..spec import Spec


@functools.lru_cache(maxsize=64)
def _compiled(src: str):
    # compiling costs ~0.3 ms; buffers of the same spec share the code object
    return compile(src, "<tfdata generated push>", "exec")


# struct codes of the dtypes the first tier packs ('=': native order, standard sizes, no
# alignment: the storage's own offsets place every field)
_CODES = {"b": "?", "i1": "b", "u1": "B", "i2": "h", "u2": "H", "i4": "i", "u4": "I", "i8": "q",
          "u8": "Q", "f4": "f", "f8": "d"}
_F32_MAX = float(np.finfo(np.float32).max)
_EXACT = 2 ** 53  # ints up to this size are exact doubles: one rounding into float32, as numpy's
_SMALL_INTS = (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32)


def _code(dtype: np.dtype) -> str | None:
    key = "b" if dtype.kind == "b" else f"{dtype.kind}{dtype.itemsize}"
    return _CODES.get(key)


def _tier1(f, v: str, i: int, ns: dict) -> str | None:
    """The first tier's check of field ``f`` held in variable ``v``, or None if the field cannot
    take the first tier (float16, complex)."""
    if _code(f.dtype) is None:
        return None
    if f.shape:
        return f"type({v}) is ndarray and {v}.dtype is dt{i} and {v}.shape == sh{i}"
    kind = f.dtype.kind
    if kind == "b":
        ns[f"pk{i}"] = frozenset({bool, np.bool_})
        return f"type({v}) in pk{i}"
    if kind in "iu":
        # bool and the numpy ints that cast safely are in range by type; np.bool_ has no __index__
        ns[f"pk{i}"] = frozenset(t for t in f.scalar_types if t is not np.bool_)
        return f"(type({v}) is int and lo{i} <= {v} <= hi{i} or type({v}) in pk{i})"
    ok = {float, bool, np.float64, np.float32, np.float16}
    ok |= {t for t in _SMALL_INTS if t in f.scalar_types}
    ns[f"pk{i}"] = frozenset(ok)
    if f.dtype.itemsize == 4:
        return (f"(type({v}) in pk{i} and -F32 <= {v} <= F32 "
                f"or type({v}) is int and -EXACT <= {v} <= EXACT)")
    return f"(type({v}) in pk{i} or type({v}) is int and -EXACT <= {v} <= EXACT)"


def make_push(spec: Spec, arrays: list, writer, lock, slow, on_wrap=None, on_write=None,
              on_begin=None, regions=None):
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
    regions : list, optional
        Where the fields' bytes are, as the storage's ``byte_regions`` gives them:
        ``[(raw, stride, [(field_index, offset), ...]), ...]``, ``raw`` a writable uint8 array of
        ``capacity * stride`` bytes in which field ``i`` of slot ``p`` starts at byte
        ``p * stride + offset``. Without it only the second tier (numpy assignments) is used.
    """
    ns = {"ndarray": np.ndarray, "slow": slow, "w": writer, "lock": lock, "cap": writer.capacity,
          "on_write": on_write, "on_begin": on_begin, "acquire": lock.acquire,
          "release": lock.release, "F32": _F32_MAX, "EXACT": _EXACT, "on_wrap": on_wrap}
    reads, checks, writes, fast_checks = [], [], [], []
    for i, f in enumerate(spec):
        v = f"v{i}"
        ns[f"a{i}"] = arrays[i]
        reads.append(f"        {v} = row[{f.name!r}]")
        if f.shape:
            ns[f"dt{i}"], ns[f"sh{i}"] = f.dtype, f.shape
            checks.append(f"type({v}) is ndarray and {v}.dtype is dt{i} and {v}.shape == sh{i}")
        else:
            ns[f"ok{i}"] = f.scalar_types
            if f.int_bounds is not None:
                ns[f"lo{i}"], ns[f"hi{i}"] = f.int_bounds
                checks.append(f"(type({v}) in ok{i} or type({v}) is int and lo{i} <= {v} <= hi{i})")
            else:
                checks.append(f"type({v}) in ok{i}")
        writes.append(f"        a{i}[p] = {v}")
        fast_checks.append(_tier1(f, v, i, ns))
    fast = _fast_writes(spec, regions, fast_checks, ns) if regions is not None else None
    def advance(indent: str) -> list:
        if on_wrap is None:
            return [f"{indent}w.cursor = p + 1 if p + 1 != cap else 0"]
        return [f"{indent}if p + 1 != cap:", f"{indent}    w.cursor = p + 1", f"{indent}else:",
                f"{indent}    on_wrap()", f"{indent}    w.cursor = 0"]
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
        lines += [
            "    if (" + "\n            and ".join(guard) + "):",
            "        acquire()",
            "        try:",
            "            p = w.cursor",
            *([] if on_begin is None else ["            on_begin(p)"]),
            *body,
            *([] if on_write is None else ["            on_write(p)"]),
            *advance("            "),
            "            if w.size != cap:",
            "                w.size += 1",
            "        finally:",
            "            release()",
            "        return",
        ]
    lines += [
        "    if not (" + "\n            and ".join(checks) + "):",
        "        return slow(row)",
        "    with lock:",
        "        p = w.cursor",
        *([] if on_begin is None else ["        on_begin(p)"]),
        *writes,
        *([] if on_write is None else ["        on_write(p)"]),
        *advance("        "),
        "        if w.size != cap:",
        "            w.size += 1",
    ]
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
                body.append(f"            q = p * {stride} + {off}")
                body.append(f"            r{r}[q:q + {nb}] = v{i}.tobytes()")
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
        body.append(f"            S{r}.pack_into(r{r}, p * {stride} + {packed[0][0]}, {', '.join(args)})")
    for i, c in enumerate(fast_checks):
        if c is None:  # the second tier's check: numpy writes it, validated as there
            f = spec[spec.names[i]]
            if f.shape:
                ns[f"dt{i}"], ns[f"sh{i}"] = f.dtype, f.shape
                c = f"type(v{i}) is ndarray and v{i}.dtype is dt{i} and v{i}.shape == sh{i}"
            else:
                ns[f"ok{i}"] = f.scalar_types
                if f.int_bounds is not None:
                    ns[f"lo{i}"], ns[f"hi{i}"] = f.int_bounds
                    c = f"(type(v{i}) in ok{i} or type(v{i}) is int and lo{i} <= v{i} <= hi{i})"
                else:
                    c = f"type(v{i}) in ok{i}"
        guard.append(c)
    return guard, body + numpy_writes
