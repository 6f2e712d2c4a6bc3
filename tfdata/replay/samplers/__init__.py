"""Samplers: which rows a batch takes. One file per sampler; this module states the contract.

A sampler draws slots, hears about writes, and says what it adds to a batch. tfdata's:
``uniform.py`` (with replacement), ``without_replacement.py`` (every live row once per pass,
rows written during a pass joining it), ``exactly_k.py`` (every row in exactly k batches, with
a gate on the writes), ``prioritized.py`` and ``shared.py``. The buffer calls it
under its lock; it never sees the layout (it calls the kernels of the output it fills,
``out.kernels`` over ``out.store``, or ``out.source.gather``), never allocates while sampling,
and keeps its state in plain arrays.

The contract (see :class:`Sampler` for the defaults a new sampler inherits):

``bind(storage, capacity, num_envs, allocator)``
    Once, when the buffer is built, before any other call: allocate what it keeps per slot.
``plan(capacity)`` (classmethod-like; may use constructor options)
    ``{"trees": bytes, "bookkeeping": bytes}`` it will hold for ``capacity`` slots.
``nbytes``
    The same, for what it holds now.
``ring_arrays(batch_size, length, out)`` / ``ring_nbytes(batch_size, length)``
    The per-batch arrays it needs in an output ring slot (``length`` None for rows, L for
    slices), and their bytes; ``batch_view(arrays, fields, attrs)`` sets what it shows in a
    batch (``attrs["weights"]``, ``attrs["versions"]``, ``attrs["mask"]``).
``sample(n, out, arrays)``
    Fill ``out.indices`` with ``batch_size`` slots in ``[0, n)`` and ``out``'s rows with those
    rows (one kernel call: the uniform sampler draws and gathers in one pass). ``out`` comes
    from the storage, or from a projection of it (``sample(batch, fields=[...])``): gather
    through ``out`` (``out.kernels.<kernel>(out.store, ..., out.kernel_out)``,
    ``out.source.gather(indices, out)``), never through the storage, and draw exactly as for
    a full output, so a projected batch is the full batch restricted to its fields.
``projects``
    Class attribute, False by default: True declares that ``sample`` gathers through ``out``
    as above. The buffer refuses ``fields=`` for a sampler that does not (its kernels would
    copy whole rows into a projected output).
``sample_slices(n, cursor, episode, reject, max_draws, out, arrays)``
    Fill ``out.indices`` (viewed ``(B, L)``) and ``arrays["mask"]`` with slices of one stream
    and episode, gather nothing; return -1, or the slice number no start was found for.
``hears_writes``; ``on_write(spans, n, extra)``, ``slot_hook()``, ``on_clear()``
    The write hooks (see :mod:`tfdata.replay.writers`), called only if ``hears_writes``; ``extra`` is what ``push`` or
    ``extend`` passed for this sampler (priorities), or None. A sampler with ``wraps_only =
    True`` hears only laps of the ring (``on_wrap()`` from the generated push and extend), and
    places the writes by the writer's position when it samples.
``stream_order``
    Class attribute, True by default: False for a sampler whose gate places the writes
    (``place(n)``, see :mod:`tfdata.replay.writers`) off the ring order.
``watch(writer)`` (optional)
    Called once after the writer is bound, for a sampler that reads its ``cursor`` and
    ``size`` (keep a weak proxy: the writer holds its hooks).
``use_lock(lock)`` (optional)
    Called once with the buffer's lock, for a sampler whose write gate (``admit(n)``, see
    :mod:`tfdata.replay.writers`) or ``sample`` waits: it waits on a ``threading.Condition`` of
    that lock, which releases it (and the GIL) while waiting. A ``sample`` that raises leaves
    the output ring's slot unused.
``name``, ``rule``
    Class attributes (or properties) for messages: ``name`` is what ``ReplayBuffer(sampler=...)``
    and checkpoints call the sampler (None: a sampler of the user's, called by its class name:
    :func:`sampler_name`);
    ``rule`` says how a batch takes rows (``"rows are drawn uniformly with replacement"``), so
    that a refusal such as ``sample(B)`` with ``B`` above the rows held says what this sampler
    does, not what another would.
``waits_for_rows``
    False by default: True for a sampler whose ``sample`` waits (on the condition of
    ``use_lock``, up to a timeout) until it has rows for a batch. The buffer then does not
    refuse a batch larger than the rows held (only one larger than the capacity) and lets
    ``sample`` wait, from the first call on, even before any row exists.
``state_dict()``, ``extra_state(copy)``, ``check_state(state, size)``, ``load_state(checked)``
    ``state_dict`` is the RNG position (``{"seed", "counter"}``) every sampler has;
    ``extra_state(copy, size)`` what it adds at the top of the buffer's state, under its
    ``state_key`` (``{"prioritized": ...}``; a sampler with nothing beyond its RNG has
    ``state_key = None`` and adds nothing); ``check_state`` validates all of it against a state
    dict without changing anything, against the other parts' state too (the rows held: an
    exactly-k pool's deliveries against the rows written, a pass against the rows held), and
    returns what ``load_state`` applies. The buffer refuses a state whose sampler part is
    another sampler's (a key it does not own, or its own key missing), naming both samplers,
    before asking ``check_state``: a sampler never sees, or silently drops, another's state.
"""

from __future__ import annotations

import secrets

import numpy as np

from ..._rng import MASK64, splitmix64


def sampler_name(sampler) -> str:
    """What messages call ``sampler``: its ``name`` (``"uniform"``, ``"exactly_k"``, ...), or
    its class's name for a sampler that has none."""
    return getattr(sampler, "name", None) or type(sampler).__name__


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

    #: whether the writer calls the write hooks (a sampler that keeps nothing per slot: False,
    #: so the push path makes no call for it)
    hears_writes = False
    #: the key under which :meth:`extra_state` stores what this sampler adds (None: nothing)
    state_key = None
    #: whether ``sample`` gathers through the output it is given (``out.kernels``, ``out.store``,
    #: ``out.source``), so that projected outputs (``fields=``) are filled right
    projects = False
    #: whether the writer keeps rows in stream order (False: its gate places them, see
    #: ``place`` in :mod:`tfdata.replay.writers`; the buffer then keeps no episode numbers
    #: and refuses n-step and ``elide_next``, which read rows in stream order)
    stream_order = True
    #: the name ``ReplayBuffer(sampler=...)`` and checkpoints give this sampler (None: a sampler
    #: of the user's, called by its class name)
    name = None
    #: how a batch takes rows, for messages (see the module docstring)
    rule = "rows are drawn by this sampler"
    #: whether ``sample`` waits for rows (see the module docstring)
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

    def sample_slices(self, n, cursor, episode, reject, max_draws, out, arrays) -> int:
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
        return {"seed": self.seed, "counter": self.counter}

    def extra_state(self, copy: bool, size: int) -> dict:
        return {}

    def check_state(self, state, size: int):
        """Validate the sampler's part of a buffer state dict; return what :meth:`load_state` needs."""
        rng = state["sampler"]
        seed, counter = int(rng["seed"]), int(rng["counter"])
        if not (0 <= seed <= MASK64 and 0 <= counter <= MASK64):
            raise ValueError(f"sampler state: seed and counter must be uint64, got {seed}, {counter}")
        return seed, counter

    def load_state(self, checked) -> None:
        seed, counter = checked
        self.seed = seed
        self.state[0] = splitmix64(seed)
        self.state[1] = counter

    def load_state_dict(self, state: dict) -> None:
        """Restore the RNG from :meth:`state_dict`."""
        Sampler.load_state(self, Sampler.check_state(self, {"sampler": state}, 0))
