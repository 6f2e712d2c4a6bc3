"""Which constructor options of the replay buffers combine: one table, checked before anything
is built.

Every buffer constructor (:class:`~tfdata.ReplayBuffer`, :class:`~tfdata.PrioritizedReplayBuffer`,
:class:`~tfdata.SharedReplayBuffer`) describes what it was given as a plain dict of *facets*
(:func:`facets`) and calls :func:`check`, which raises the first :data:`RULES` entry that
matches, with a message naming both options, the values given and why they do not combine.
A pair of options that no rule names is supported (``tests/test_combinations.py`` walks every
pair on every buffer class).

Two kinds of refusal: ``ValueError`` where the combination cannot mean anything (it would
deadlock, or read rows in an order the other option does not keep), ``NotImplementedError``
where it could but is not built (shared memory only).

The facets (absent options have the value shown as default):

``buffer``
    ``"ReplayBuffer"``, ``"PrioritizedReplayBuffer"`` or ``"SharedReplayBuffer"``.
``sampler``
    the sampler's name: ``"uniform"``, ``"without_replacement"``, ``"exactly_k"``,
    ``"prioritized"``, or the class name of a user's sampler.
``stream_order``
    whether the sampler's writes keep rows in stream order (exactly-k's do not; default True).
``policy``, ``replays``
    exactly-k's (None otherwise).
``rate_limiter``
    the limiter's ``params()`` (None: no limiter).
``n_step``, ``elide_next``, ``frame_stack``, ``compress_cold``, ``spill``, ``stats``, ``fifo``, ``prioritized``, ``transforms``
    n-step length or None; the others bools (``frame_stack``: any stacked field;
    ``spill``: a ``spill_path``; ``stats``: any ``stats=`` field; ``fifo``: a shared FIFO;
    ``prioritized``: sampling by priority; ``transforms``: any sample transform).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

BUFFERS = ("ReplayBuffer", "PrioritizedReplayBuffer", "SharedReplayBuffer")
SINGLE = ("ReplayBuffer", "PrioritizedReplayBuffer")
SHARED = ("SharedReplayBuffer",)

#: the facets and the value each has when its option is not given
DEFAULTS = {"buffer": "ReplayBuffer", "sampler": "uniform", "stream_order": True, "policy": None,
            "replays": None, "rate_limiter": None, "n_step": None, "elide_next": False,
            "frame_stack": False, "compress_cold": False, "spill": False, "stats": False,
            "fifo": False, "prioritized": False, "transforms": False}


def facets(buffer: str, **given) -> dict:
    """The facets of a buffer's options: :data:`DEFAULTS` updated with ``given`` (unknown names:
    TypeError, a programming error of the caller)."""
    bad = set(given) - set(DEFAULTS)
    if bad:
        raise TypeError(f"unknown facets {sorted(bad)}")
    return {**DEFAULTS, **given, "buffer": buffer}


def _bounded_limiter(o: dict) -> bool:
    lim = o["rate_limiter"]
    return lim is not None and lim.get("error_buffer") is not None


def _spi(o: dict) -> float:
    return float(o["rate_limiter"]["samples_per_insert"])


def exactly_k_ratio_refused(o: dict) -> bool:
    """Exactly-k with a bounded rate limiter can make no progress when the limiter's ratio is not
    what exactly-k delivers per row: every row is delivered ``replays`` times, so in the long run
    rows sampled per row inserted is ``replays`` (``"block"``) or less (rows dropped or
    overwritten before their last delivery). A ratio above ``replays`` asks for samples no row
    can give (inserts then wait for samples, samples for rows); one below it, with
    ``"block"``, lets too few samples through to free the slots writers wait for."""
    if o["sampler"] != "exactly_k" or not _bounded_limiter(o):
        return False
    spi, k = _spi(o), int(o["replays"] or 1)
    return spi > k or (spi < k and (o["policy"] or "block") == "block")


def exactly_k_batch_refusal(replays: int, params: dict, capacity: int, batch: int) -> str | None:
    """Why a ``sample(batch)`` of an exactly-k buffer under a bounded rate limiter (``params``,
    its ratio equal to ``replays``) could wait for ever, or None when it cannot.

    With ``k = replays``, ``m = min_size_to_sample``, ``e = error_buffer`` and ``R`` the
    deliveries the rows awaiting replay have left (``k * inserts - samples``): inserts wait
    while ``R > k * (m - 1) + e``, and each row awaiting replay has at most ``k`` deliveries
    left, so when inserts wait at least ``(k * (m - 1) + e) / k`` rows await replay, and a
    batch of more distinct rows than that would wait for rows no insert brings. The limiter lets
    a sample through only once ``R >= k * m - e + batch``; the capacity holds at most
    ``capacity`` rows awaiting replay, each with one delivery left at least, so writers can wait
    for free slots while the sample waits for inserts unless ``capacity >= k * m - e + batch``.
    """
    k, m, e = int(replays), int(params["min_size_to_sample"]), float(params["error_buffer"])
    pool = int((k * (m - 1) + e) // k) + 1  # rows awaiting replay whenever inserts wait
    if batch > pool:
        return (f"sampler='exactly_k' (replays={k}) with rate_limiter (min_size_to_sample={m}, "
                f"error_buffer={e:g}): a sample of {batch} distinct rows can wait for ever, since "
                f"inserts stop while only {pool} rows may await replay; sample at most {pool} "
                f"rows at a time, or raise min_size_to_sample or error_buffer")
    if capacity < k * m - e + batch:
        return (f"sampler='exactly_k' (replays={k}) with rate_limiter (min_size_to_sample={m}, "
                f"error_buffer={e:g}): a sample of {batch} rows waits until the rows awaiting "
                f"replay have k * min_size_to_sample - error_buffer + batch = {k * m - e + batch:g} "
                f"deliveries left, more than the capacity {capacity} may hold while writers "
                f"wait for free slots; use a capacity of at least {int(k * m - e + batch)}, or a "
                f"smaller min_size_to_sample")
    return None


def sample_refusal(sampler: dict, limiter: dict, capacity: int, batch: int) -> str | None:
    """Why a sample of ``batch`` rows by a sampler of these facets (``Sampler.facets()``) under a
    rate limiter of these ``params()`` could wait for ever, or None: checked when a batch size is
    first sampled (its output ring is built after)."""
    if sampler.get("sampler") != "exactly_k" or limiter.get("error_buffer") is None \
            or sampler.get("policy") != "block":  # (the others: writers never wait for slots)
        return None
    return exactly_k_batch_refusal(sampler["replays"], limiter, capacity, batch)


@dataclass(frozen=True)
class Rule:
    """One refused combination: options ``a`` and ``b`` of the buffers in ``where``, refused
    with ``error`` when ``applies(facets)``; ``why`` completes the message."""

    a: str
    b: str
    where: tuple
    error: type
    applies: Callable[[dict], bool]
    why: str


def _off_order(o):
    return not o["stream_order"]


#: every refused combination; a pair of options no rule names works (and is tested)
RULES = (
    Rule("sampler='exactly_k'", "n_step", BUFFERS, ValueError,
         lambda o: _off_order(o) and o["n_step"] is not None,
         "this sampler writes each row into the next free slot, skipping rows that await replay, "
         "so rows are not in stream order, which an n-step return reads; build the buffer "
         "without n_step"),
    Rule("sampler='exactly_k'", "elide_next", SINGLE, ValueError,
         lambda o: _off_order(o) and o["elide_next"],
         "this sampler writes rows off stream order, and an elided next field is read from the "
         "stream's next slot; build the buffer without elide_next"),
    Rule("sampler='exactly_k'", "frame_stack", BUFFERS, ValueError,
         lambda o: _off_order(o) and o["frame_stack"],
         "this sampler writes each row into a free slot, not in stream order, so a row's stack "
         "cannot be rebuilt from its stream's previous rows; use another sampler, or store the "
         "whole stacks (no frame_stack)"),
    Rule("sampler='exactly_k'", "rate_limiter", BUFFERS, ValueError, exactly_k_ratio_refused,
         "every row is delivered exactly `replays` times, so the rows sampled per row inserted "
         "are `replays` in the long run (fewer with policy 'drop' or 'overwrite'); a "
         "samples_per_insert above it makes inserts wait for samples that no row can give, one "
         "below it with policy='block' lets too few samples through to free the slots writers "
         "wait for: both threads would wait for ever. Use samples_per_insert = replays"),
    Rule("sampler='exactly_k'", "mode='fifo'", SHARED, ValueError,
         lambda o: o["sampler"] == "exactly_k" and o["fifo"],
         "a FIFO delivers every row once already"),
    Rule("sampler='exactly_k'", "prioritized=True", SHARED, ValueError,
         lambda o: o["sampler"] == "exactly_k" and o["prioritized"],
         "priorities would decide which rows are delivered, not k"),
    Rule("sampler='exactly_k'", "policy='overwrite'", SHARED, NotImplementedError,
         lambda o: o["sampler"] == "exactly_k" and o["policy"] == "overwrite",
         "a writer overwriting a row the learner may be copying would need the seqlock's "
         "redraws, which change who is delivered; use policy 'block' or 'drop'"),
    Rule("sampler='without_replacement'", "mode='fifo'", SHARED, ValueError,
         lambda o: o["sampler"] == "without_replacement" and o["fifo"],
         "a FIFO delivers every row once, in order"),
    Rule("sampler='without_replacement'", "prioritized=True", SHARED, ValueError,
         lambda o: o["sampler"] == "without_replacement" and o["prioritized"],
         "priorities decide which rows a batch takes, not passes"),
    Rule("sampler='without_replacement'", "frame_stack", SHARED, NotImplementedError,
         lambda o: o["sampler"] == "without_replacement" and o["frame_stack"],
         "frame stacks over shards are sampled uniformly or by priority (a ReplayBuffer takes "
         "both)"),
    Rule("prioritized=True", "mode='fifo'", SHARED, ValueError,
         lambda o: o["prioritized"] and o["fifo"],
         "a FIFO delivers every row once, in order"),
    Rule("frame_stack", "mode='fifo'", SHARED, ValueError,
         lambda o: o["frame_stack"] and o["fifo"],
         "a FIFO hands a row out once, and a stack reads the rows before it, which its writer "
         "may then have reused"),
    Rule("n_step", "mode='fifo'", SHARED, ValueError,
         lambda o: o["n_step"] is not None and o["fifo"],
         "a FIFO delivers the rows as written"),
    Rule("rate_limiter", "mode='fifo'", SHARED, ValueError,
         lambda o: o["rate_limiter"] is not None and o["fifo"],
         "a FIFO delivers every row once: its reader waits for rows and its writers for room "
         "already"),
    Rule("transforms", "mode='fifo'", SHARED, NotImplementedError,
         lambda o: o["transforms"] and o["fifo"],
         "not built: get_batch delivers the rows as written; use mode='replay'"),
    Rule("stats", "shared memory", SHARED, NotImplementedError,
         lambda o: o["stats"],
         "its rows are written by other processes, which the learner does not hear; use a "
         "ReplayBuffer for stats="),
    Rule("compress_cold", "no frame_stack", SINGLE, ValueError,
         lambda o: o["compress_cold"] and not o["frame_stack"],
         "compress_cold compresses the frames of stacked fields: it needs frame_stack= (and "
         "spill_path=)"),
    Rule("compress_cold", "no spill_path", SINGLE, ValueError,
         lambda o: o["compress_cold"] and not o["spill"],
         "compress_cold keeps the frames of rows that left the hot window of a spilling buffer "
         "compressed in RAM: it needs spill_path= and hot_rows= or hot_bytes="),
)


def _value(o: dict, name: str) -> str:
    """``name`` as given, for a message: ``n_step=3``, ``rate_limiter=(1.0, 8, 16.0)``."""
    key = name.split("=")[0].removeprefix("no ")
    if "=" in name or name.startswith("no ") or key not in o:
        return name
    v = o[key]
    if key == "rate_limiter":
        return (f"rate_limiter=RateLimiter(samples_per_insert={v['samples_per_insert']:g}, "
                f"min_size_to_sample={v['min_size_to_sample']}, error_buffer={v['error_buffer']})")
    if key == "sampler":
        return f"sampler={v!r}"
    return f"{key}={v!r}"


def refusal(o: dict):
    """The first rule refusing the facets ``o``, as ``(error class, message)``, or None."""
    for r in RULES:
        if o["buffer"] in r.where and r.applies(o):
            a = _value(o, r.a)
            if r.a.startswith("sampler="):  # the sampler given (a user's may write off order too)
                a = f"sampler={o['sampler']!r}"
                if o["sampler"] == "exactly_k":
                    a += f" (replays={o['replays'] or 1}, policy={o['policy'] or 'block'!r})"
            return r.error, f"{o['buffer']}: {a} with {_value(o, r.b)}: {r.why}"
    return None


def check(o: dict) -> None:
    """Raise the first refusal of :data:`RULES` for the facets ``o`` (nothing is built yet)."""
    found = refusal(o)
    if found is not None:
        raise found[0](found[1])


def markdown() -> str:
    """The table as markdown rows (what docs/design/combinations.md shows; a test keeps the two
    equal)."""
    lines = ["| option | with | buffers | refused with | why |", "| --- | --- | --- | --- | --- |"]
    for r in RULES:
        where = "all" if r.where == BUFFERS else ", ".join(r.where)
        lines.append(f"| `{r.a}` | `{r.b}` | {where} | {r.error.__name__} | {r.why} |")
    return "\n".join(lines)
