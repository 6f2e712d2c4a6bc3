"""Samplers: which rows a batch takes. One file per sampler; this module states the contract.

A sampler draws slots, hears about writes, and says what it adds to a batch. tfdata's:
``uniform.py`` (with replacement), ``without_replacement.py`` (every live row once per pass,
rows written during a pass joining it), ``exactly_k.py`` (every row in exactly k batches; its
buffer writes with a free-slot writer), ``prioritized.py``. The buffer calls it under its
lock; it never sees the layout, never allocates while sampling, and keeps its state in plain
arrays. No sampler has a twin for shared memory: a :class:`~tfdata.SharedReplayBuffer` given a
sampler (``sampler=MySampler(...)``, or tfdata's by name) drives the same object through
:class:`tfdata.shared.streams.ShardStreams`: the rows writer processes published since the last
sample reach it through its write hooks before each draw (``slot_hook()`` row by row, else
``on_write``), ``sample`` gets the rows held, and a row a writer tore during the copy is drawn
again (tfdata's draw the uniform, prioritized and without-replacement rows with kernels of the
shards; exactly-k hears the slots from the writers' logs).

What a sampler writes is marked *required*; everything else has a default in :class:`Sampler`.

``name``, ``rule`` (*required*)
    Class attributes (or properties) for messages: ``name`` is what ``ReplayBuffer(sampler=...)``
    and checkpoints call the sampler (required for a sampler that is saved; None: a user's
    sampler that is never saved, called by its class name: :func:`sampler_name`); ``rule`` says
    how a batch takes rows (``"rows are drawn uniformly with replacement"``), so that a refusal
    such as ``sample(B)`` with ``B`` above the rows held says what this sampler does.
``bind(storage, capacity, num_envs, allocator)`` (*required*)
    Once, when the buffer is built, before any other call: allocate what it keeps per slot.
``sample(n, out, arrays)`` (*required*)
    Fill ``out.indices`` with ``batch_size`` slots in ``[0, n)`` and ``out``'s rows with those
    rows (one kernel call: the uniform sampler draws and gathers in one pass). ``out`` comes
    from the storage, or from a projection of it (``sample(batch, fields=[...])``): gather
    through ``out`` (``out.kernels.<kernel>(out.store, ..., out.kernel_out)``,
    ``out.source.gather(indices, out)``), never through the storage, and draw exactly as for
    a full output, so a projected batch is the full batch restricted to its fields. A
    ``sample`` that raises leaves the output ring's slot unused.
``sample_slices(n, streams, geo, reject, max_draws, out, arrays, part=None)`` (*required*)
    Fill ``out.indices`` (viewed ``(B, L)``) and ``arrays["mask"]`` (slices ``part`` only)
    with slices of one stream and episode, following ``streams`` (:mod:`tfdata.replay.streams`)
    as of the geometry ``geo``; gather nothing; return -1, or the slice number no start was
    found for. A sampler that draws no slices raises.
``on_write(spans, n, extra)``, ``slot_hook()``, ``on_clear()`` (*required*, with ``hears_writes``)
    The write hooks (:mod:`tfdata.replay.writers`), called only if ``hears_writes`` (False by
    default: the push path then makes no call); ``extra`` is what ``push`` or ``extend`` passed
    for this sampler (priorities), or None. ``slot_hook()`` returns the one-row form ``f(slot)``
    (None: none), which may carry ``rows(spans)``, the same for the slots of ``spans`` (int64
    ``(m, 2)``: first slot, count) in one call (the prioritized sampler's, for the rows writer
    processes published). A sampler with ``wraps_only = True`` hears only laps of the ring
    (``on_wrap()`` from the generated push and extend) and places the writes by the writer's
    position when it samples.
``config()``, ``from_config(config, seed)`` (classmethod) (*required*)
    ``config()`` is the constructor's options as JSON values (not the seed: the state holds the
    RNG position); ``from_config`` builds an unbound sampler from such a dict and a seed. A
    checkpoint's config is untrusted input: ``from_config`` checks every key (exactly its own
    options, exact JSON types, bounds) and raises TypeError or ValueError naming the key, what
    was expected and what was given (``config.replays: expected an int in [1, 65535], got int
    0``; :func:`config_keys` and :func:`config_value` do this). The defaults: no options.
``extra_state(size)``, ``check_state(state, size, capacity)``, ``load_state(checked)`` (*required*)
    A sampler's state is one part: ``state_dict()`` is the RNG position (``{"seed",
    "counter"}``, every sampler's), ``extra_state(size)`` what it keeps beyond it, given
    ``size``, the rows held, as a dict of JSON values and numeric arrays (a pool, passes,
    priorities: new arrays, not views). A buffer's state dict holds the first under
    ``"sampler"`` and, for a sampler that overrides ``extra_state``, the second under its name
    (:func:`state_key`). ``check_state`` validates the part as untrusted input, flat (``{"seed",
    "counter", **extra}``), against its config and the rows held (``size`` of ``capacity``: a
    pass against the rows held, an exactly-k pool's deliveries against the rows written),
    without changing anything, and returns what ``load_state`` applies. It uses only its config
    and its arguments: a checkpoint calls it on the sampler ``from_config`` built, before the
    buffer is. Every problem is a ValueError or TypeError, ideally a :class:`StateError` naming
    the field (``exactly_k.delivered``), which a checkpoint reports as
    ``state.exactly_k.delivered``. The buffer refuses a state whose sampler part is another
    sampler's (a key it does not own, or its own key missing), naming both samplers, before
    asking ``check_state``.

Defaults a sampler may override:

``plan(capacity)``, ``nbytes``
    ``{"trees": bytes, "bookkeeping": bytes}`` it will hold for ``capacity`` slots (may use
    constructor options), and holds now.
``ring_arrays(batch_size, length, out)``, ``ring_nbytes(batch_size, length)``, ``batch_view(arrays, fields, attrs)``
    The per-batch arrays it needs in an output ring slot (``length`` None for rows, L for
    slices) and their bytes; what it shows in a batch (``attrs["weights"]``,
    ``attrs["versions"]``, ``attrs["mask"]``).
``projects``
    True declares that ``sample`` gathers through ``out`` as above; the buffer refuses
    ``fields=`` for a sampler that does not (its kernels would copy whole rows).
``drawable(n)``, ``waits_for_rows``
    The rows a batch can draw from of the ``n`` held; True for a sampler whose ``sample`` waits
    (on the condition of ``use_lock``, up to a timeout) until it has rows for a batch: the
    buffer then refuses only a batch larger than the capacity and lets ``sample`` wait, from
    the first call on.
``stream_order``
    False for a sampler that frees slots out of order: its buffer writes with a
    :class:`~tfdata.replay.writers.FreeSlotWriter`, which reads the sampler's free-slot contract
    (``remaining``, ``awaiting``, ``policy``, ``timeout``, ``waits``, ``on_drop``).
``watch(writer)``, ``wraps_only``/``on_wrap``
    A writer's concern held by a sampler: ``watch`` is called once after the writer is bound,
    for a sampler that reads its ``cursor`` and ``size`` (keep a weak proxy: the writer holds
    its hooks).
``use_lock(lock)``
    Called once with the buffer's lock, for a sampler whose writes (a free-slot writer's
    blocked writes) or ``sample`` wait on a ``threading.Condition`` of it (which releases it
    and the GIL while waiting).
``facets()``, ``state_dict()``
    What the combinations table needs to know of it; the RNG position.

A checkpoint writes ``name`` and ``config()`` into its config (``"sampler"``, absent for the
buffer's default sampler, and the options beside it) and the state as above, each array of
``extra_state`` an ``.npy`` file. ``ReplayBuffer.load(path, samplers=[MySampler])`` rebuilds a
sampler that is not tfdata's with ``MySampler.from_config`` and loads its state; the arrays of
its part hold at most :data:`STATE_BYTES_PER_SLOT` bytes per slot of the buffer in all (plus
:data:`STATE_BYTES_BASE`).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping

import numpy as np

from ..._checks import check_slot_list
from ..._rng import MASK64, splitmix64

#: what the arrays of a sampler's state (its :meth:`Sampler.extra_state`) may hold in all when a
#: checkpoint is read: ``STATE_BYTES_PER_SLOT`` bytes per slot of the buffer plus
#: ``STATE_BYTES_BASE``. tfdata's samplers keep at most two 8-byte values per slot (priorities
#: and write versions; an exactly-k pool's slots and counts), and a checkpoint of a few
#: kilobytes must not make a load allocate more than its capacity justifies
STATE_BYTES_PER_SLOT = 16
STATE_BYTES_BASE = 1 << 16
#: the keys of the RNG position, in every sampler's flat state
RNG_KEYS = ("seed", "counter")


def sampler_name(sampler) -> str:
    """What messages call ``sampler`` (an object or a class): its ``name`` (``"uniform"``,
    ``"exactly_k"``, ...), or its class's name for a sampler that has none."""
    cls = sampler if isinstance(sampler, type) else type(sampler)
    name = getattr(sampler, "name", None)
    return name if isinstance(name, str) and name else cls.__name__


def keeps_state(sampler) -> bool:
    """Whether ``sampler`` (an object or a class) keeps a state beyond its RNG position: it
    overrides :meth:`Sampler.extra_state`."""
    cls = sampler if isinstance(sampler, type) else type(sampler)
    return getattr(cls, "extra_state", Sampler.extra_state) is not Sampler.extra_state


def state_key(sampler):
    """The key of a buffer's state dict under which ``sampler`` (an object or a class) keeps
    its :meth:`~Sampler.extra_state`, or None for a sampler that keeps nothing beyond its RNG."""
    return sampler_name(sampler) if keeps_state(sampler) else None


def shown(v) -> str:
    """A short description of a value read from a file (never a recursive repr)."""
    if isinstance(v, Mapping):
        return f"an object of {len(v)} key(s)"
    if isinstance(v, (list, tuple)):
        return f"a list of {len(v)} item(s)"
    if isinstance(v, np.ndarray):
        return f"an array {v.dtype}{list(v.shape)}"
    if isinstance(v, str):
        return repr(v[:80]) + ("..." if len(v) > 80 else "")
    return f"{type(v).__name__} {str(v)[:80]}"


class StateError(ValueError):
    """A sampler's state refused by :meth:`Sampler.check_state`: ``field`` (where in the
    buffer's state dict: ``"exactly_k.delivered"``, ``"sampler.counter"``), what was
    ``expected`` and what was given (``got``, a short description; None: not shown).
    ``str()`` is the state dict's form (``sampler state: exactly_k.delivered = 3: expected
    ...``), unless a ``message`` is given; a checkpoint names the field as ``state.<field>``."""

    def __init__(self, field: str, expected: str, got=None, message: str | None = None):
        self.field, self.expected, self.got = field, expected, got
        if message is None:
            shown_got = "" if got is None else f" = {got}"
            message = f"sampler state: {field}{shown_got}: expected {expected}"
        super().__init__(message)


def config_keys(config, keys, name: str) -> Mapping:
    """``config`` (untrusted: a checkpoint's) checked to be a mapping of exactly the options
    ``keys`` of sampler ``name``; TypeError naming the key otherwise."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config: expected an object of the options of sampler {name!r}, got "
                        f"{shown(config)}")
    for k in config:
        if k not in keys:
            raise TypeError(f"config.{str(k)[:40]}: expected no such key (the options of sampler "
                            f"{name!r}: {', '.join(keys) or 'none'}), got {shown(config[k])}")
    for k in keys:
        if k not in config:
            raise TypeError(f"config.{k}: expected a value (an option of sampler {name!r}), got "
                            f"nothing")
    return config


def config_value(config: Mapping, key: str, kind: str, lo=None, hi=None, *, lo_open: bool = False,
                 options=(), optional: bool = False):
    """``config[key]`` checked as untrusted input, exact JSON types (a bool is not an int, an
    int is not a float): ``kind`` ``"int"`` in ``[lo, hi]``, ``"float"`` finite in ``[lo, hi]``
    (``(lo, hi]`` with ``lo_open``), or ``"choice"`` among ``options``; None accepted when
    ``optional``. TypeError (wrong type) or ValueError (out of range) naming the key, what was
    expected and what was given."""
    v = config[key]
    if optional and v is None:
        return None
    none = " or null" if optional else ""
    if kind == "choice":
        want = f"one of {list(options)}{none}"
        if type(v) is not str:
            raise TypeError(f"config.{key}: expected {want}, got {shown(v)}")
        if v not in options:
            raise ValueError(f"config.{key}: expected {want}, got {shown(v)}")
        return v
    if kind == "int":
        want = f"an int in [{lo}, {hi}]{none}"
        ok_type, ok = type(v) is int, type(v) is int and lo <= v <= hi
    else:
        want = f"a float in {'(' if lo_open else '['}{lo}, {hi}]{none}"
        ok_type = type(v) is float
        ok = ok_type and math.isfinite(v) and lo <= v <= hi and not (lo_open and v == lo)
    if not ok:
        raise (ValueError if ok_type else TypeError)(f"config.{key}: expected {want}, got {shown(v)}")
    return v


def state_part(state, keys, key: str) -> Mapping:
    """``state`` (a sampler's flat state, untrusted) checked to hold exactly the RNG position
    and ``keys``; :class:`StateError` naming ``key`` (the sampler's part) otherwise."""
    if not isinstance(state, Mapping):
        raise StateError(key, "an object", shown(state))
    own = [k for k in state if k not in RNG_KEYS]
    if sorted(map(str, own)) != sorted(keys):
        raise StateError(key, f"an object of the keys {list(keys)}",
                         f"the keys {sorted(str(k)[:40] for k in own)[:8]}")
    return state


def state_int(state: Mapping, key: str, field: str, lo: int, hi: int) -> int:
    """``state[key]`` as an int in ``[lo, hi]`` (a Python or numpy integer, not a bool);
    :class:`StateError` naming ``field`` otherwise."""
    v = state[key]
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not lo <= v <= hi:
        raise StateError(field, f"an int in [{lo}, {hi}]", shown(v))
    return int(v)


def checked_slots(slots, size: int, field: str) -> np.ndarray:
    """``slots`` (from a state) as int64 slots of rows held, each once, at most ``size``;
    :class:`StateError` naming ``field`` and the first bad slot otherwise."""
    if not isinstance(slots, np.ndarray):
        raise StateError(field, "an integer array of slots", shown(slots))
    try:
        return check_slot_list(slots, size, "slots")
    except ValueError as exc:
        raise StateError(field, f"slots of the {size} rows held, each once",
                         str(exc)[len("slots: "):]) from None


class Sampler:
    """The base of every sampler: a counter-based RNG and the no-op parts of the contract.

    Parameters
    ----------
    seed : int or None
        Any int (reduced mod 2**64). None draws one from the OS; it is recorded in
        :meth:`state_dict`, so any run can be replayed.

    Attributes
    ----------
    state : ndarray of uint64, shape (2,)
        ``[key, counter]`` as the kernels read and advance it; ``key = splitmix64(seed)``.
    """

    # each described in the module docstring
    hears_writes = False
    projects = False
    #: False: a free-slot writer places the rows; the buffer then keeps no episode numbers and
    #: refuses n-step and ``elide_next``, which read rows in stream order
    stream_order = True
    name = None
    rule = "rows are drawn by this sampler"
    waits_for_rows = False

    def __init__(self, seed: int | None = None):
        if seed is None:
            seed = secrets.randbits(63)
        if isinstance(seed, (bool, float)) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        self.seed = int(seed) & MASK64
        self.state = np.array([splitmix64(self.seed), 0], dtype=np.uint64)

    @property
    def counter(self) -> int:
        """Number of 64-bit random words consumed so far."""
        return int(self.state[1])

    def facets(self) -> dict:
        """What the table of option combinations (:mod:`tfdata.replay.combinations`) needs to
        know of this sampler: its ``sampler`` name (a user's sampler: its class name) and
        ``stream_order``; a sampler with options that meet other options' adds them."""
        return {"sampler": sampler_name(self),
                "stream_order": bool(self.stream_order)}

    # -- config ----------------------------------------------------------------------------------
    def config(self) -> dict:
        """The constructor's options as JSON values (none here; the seed is in the state)."""
        return {}

    @classmethod
    def from_config(cls, config, seed):
        """An unbound sampler of ``config`` (untrusted: see the module docstring), seeded by
        ``seed``; here: no options."""
        config_keys(config, (), sampler_name(cls))
        return cls(seed)

    # -- construction and memory ---------------------------------------------------------------
    def bind(self, storage, capacity: int, num_envs: int, allocator) -> None:
        self.storage, self.capacity, self.num_envs, self.allocator = storage, capacity, num_envs, allocator

    def plan(self, capacity: int) -> dict:
        return {"trees": 0, "bookkeeping": 0}

    @property
    def nbytes(self) -> dict:
        return {"trees": 0, "bookkeeping": 0}

    def ring_arrays(self, batch_size: int, length: int | None, out) -> dict:
        if length is None:
            return {}
        return {"mask": self.allocator.zeros((batch_size, length), bool)}

    def ring_nbytes(self, batch_size: int, length: int | None) -> int:
        return 0 if length is None else batch_size * length

    def batch_view(self, arrays: dict, fields: dict, attrs: dict) -> None:
        if "mask" in arrays:
            attrs["mask"] = arrays["mask"]

    # -- drawing ---------------------------------------------------------------------------------
    def drawable(self, n: int) -> int:
        """Rows a batch can draw from now, of the ``n`` held: a sample of more waits for rows
        (under a rate limiter) or is refused. Every row held, unless the sampler holds some back
        (exactly-k: the rows awaiting replay)."""
        return n

    def sample(self, n: int, out, arrays: dict) -> None:
        raise NotImplementedError

    def draw_call(self, out, arrays: dict):
        """:meth:`sample` into ``out`` bound once, as a callable of ``n`` (the rows held): for a
        caller that draws into the same output every time from a number of rows that changes
        (a buffer's batch rows inside a larger batch). A sampler may bind its kernel itself
        (the uniform sampler does)."""
        sample = self.sample

        def call(n):
            sample(n, out, arrays)

        return call

    def sample_call(self, n: int, out, arrays: dict):
        """:meth:`sample` of ``n`` rows into ``out`` bound once, as a callable of no arguments:
        for a caller that draws from a fixed number of rows (a dataset's) into the same output
        every time. A sampler may bind its kernel itself (the uniform sampler does)."""
        from functools import partial

        return partial(self.sample, n, out, arrays)

    def sample_slices(self, n, streams, geo, reject, max_draws, out, arrays,
                      part=None) -> int:
        raise NotImplementedError(f"{type(self).__name__} draws no slices")

    # -- write hooks -----------------------------------------------------------------------------
    def on_write(self, spans: list, n: int, extra) -> None:
        pass

    def slot_hook(self):
        return None

    def on_clear(self) -> None:
        pass

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The RNG position: ``{"seed", "counter"}``."""
        return {"seed": self.seed, "counter": self.counter}

    def extra_state(self, size: int) -> dict:
        """What the sampler keeps beyond its RNG position (see the module docstring); a sampler
        that keeps nothing does not override this."""
        return {}

    def check_state(self, state, size: int, capacity: int):
        """Validate the sampler's flat state (untrusted: see the module docstring); here the
        RNG position. Returns what :meth:`load_state` needs."""
        if not isinstance(state, Mapping):
            raise StateError("sampler", "an object {seed, counter}", shown(state))
        for k in RNG_KEYS:
            if k not in state:
                raise StateError("sampler", f"the keys {list(RNG_KEYS)}; missing {k!r}")
        return tuple(state_int(state, k, f"sampler.{k}", 0, MASK64) for k in RNG_KEYS)

    def load_state(self, checked) -> None:
        seed, counter = checked
        self.seed = seed
        self.state[0] = splitmix64(seed)
        self.state[1] = counter
