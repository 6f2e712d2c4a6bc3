"""The replay buffer: the replay core with a uniform sampler (or any sampler given)."""

from __future__ import annotations

from .core import ReplayCore
from .samplers.exactly_k import OPTIONS as EXACTLY_K_OPTIONS, ExactlyKSampler
from .samplers.prioritized import PrioritizedSampler
from .samplers.uniform import UniformSampler
from .samplers.without_replacement import WithoutReplacementSampler

#: the samplers a ReplayBuffer builds from a name (and a checkpoint records by that name)
SAMPLERS = {"uniform": UniformSampler, "without_replacement": WithoutReplacementSampler,
            "exactly_k": ExactlyKSampler}
#: every sampler of tfdata, by name: a sampler of the user's takes none of these names
TFDATA_SAMPLERS = {**SAMPLERS, "prioritized": PrioritizedSampler}


def sampler_entries(buffer_class, sampler, default: str) -> dict:
    """What the config of a ``buffer_class`` buffer says of its ``sampler``: its ``name`` (as
    ``"sampler"``, unless it is ``default``) and its :meth:`~tfdata.replay.samplers.Sampler.config`;
    ``{"sampler": None}`` for a sampler that cannot be saved (see :func:`unsaved_reason`)."""
    if unsaved_reason(buffer_class, sampler) is not None:
        return {"sampler": None}
    name = sampler.name
    return {**({} if name == default else {"sampler": name}), **sampler.config()}


def unsaved_reason(buffer_class, sampler) -> str | None:
    """Why a checkpoint could not rebuild ``sampler`` (None: it can): it has no ``name``, or
    tfdata's name of another class (a subclass of one of tfdata's samplers keeps its name:
    loading it would build tfdata's), or options that are the buffer's own."""
    name = getattr(sampler, "name", None)
    mine = type(sampler).__name__
    if not isinstance(name, str) or not name:
        return (f"{mine} has no name: a sampler that is saved needs a name, config() and "
                f"from_config() (see tfdata.replay.samplers)")
    known = TFDATA_SAMPLERS.get(name)
    if known is not None and type(sampler) is not known:
        return (f"{mine} is not one of tfdata's samplers but has the name {name!r} of "
                f"{known.__name__}; give it a name of its own")
    if known is not None and name not in buffer_class.SAMPLERS:
        return (f"a {buffer_class.__name__} saves samplers {sorted(buffer_class.SAMPLERS)} and "
                f"samplers of the user's, not a {mine}")
    from .plan import CONFIG_DEFAULTS

    clash = sorted(set(sampler.config()) & (set(CONFIG_DEFAULTS) | {
        "capacity", "sampler", "rate_limiter", "allocator", "memory_budget", "seed"}))
    if clash:
        return f"{mine}.config() has the buffer's own option(s) {clash}"
    return None


def _named_sampler(sampler, seed, options=None):
    given = {k: v for k, v in (options or {}).items() if v is not None}
    if sampler is None or isinstance(sampler, str):
        name = "uniform" if sampler is None else sampler
        if name not in SAMPLERS:
            raise ValueError(f"sampler must be one of {sorted(SAMPLERS)} or a Sampler object, "
                             f"got {sampler!r}")
        if name == "exactly_k":
            return ExactlyKSampler(seed, **given)
    if given:
        raise ValueError(f"{', '.join(f'{k}=' for k in given)} given with sampler={sampler!r}: "
                         f"these options belong to sampler='exactly_k'")
    if sampler is None or isinstance(sampler, str):
        return SAMPLERS[name](seed)
    if seed is not None:
        raise ValueError("seed= and sampler= both given: a sampler holds its own seed")
    return sampler


class ReplayBuffer(ReplayCore):
    """A fixed-capacity circular replay buffer with uniform sampling.

    Parameters
    ----------
    spec : Spec or mapping
        The row schema, or anything :class:`Spec` accepts.
    capacity : int
        Number of rows, ``1 <= capacity < 2**32``. Storage is allocated once, here.
    layout : {"aos", "soa"} or list of lists of str, optional
        Physical layout. Default: the ``TFDATA_LAYOUT`` environment variable (``aos`` or
        ``soa``), else ``"aos"``. A list of groups of field names is *column groups*
        (``[["obs", "action", "reward", "terminated", "truncated"], ["next_obs"]]``): each group
        of several fields stored as records, a field alone as a column, fields left out each
        alone; see :func:`tfdata.storage.resolve_layout` (SpecError naming an unknown or
        repeated field). The layout changes speed and memory, never results: the same seed
        gives bit-identical batches on every layout.
    seed : int, optional
        Seed of the sampling generator; None draws one (recorded in :meth:`state_dict`).
    sampler : str or Sampler, optional
        Which rows a batch takes: ``"uniform"`` (the default; with replacement),
        ``"without_replacement"`` (every live row once per pass, rows written during a pass
        joining it: :class:`~tfdata.replay.samplers.without_replacement.WithoutReplacementSampler`)
        or ``"exactly_k"`` (every row delivered in exactly ``replays`` batches, then its slot is
        free: :class:`~tfdata.replay.samplers.exactly_k.ExactlyKSampler`), seeded by ``seed``. Any object meeting the sampler contract of
        :mod:`tfdata.replay.samplers` plugs in here (then ``seed`` must be None: the sampler
        holds its own). A sampler of the user's is saved by its ``name`` and ``config()`` and
        loaded with ``ReplayBuffer.load(path, samplers=[ItsClass])`` (see :meth:`load`); one
        without a name is not saved (TypeError from ``save``).
    replays : int, optional
        ``sampler="exactly_k"`` only (default 1): deliveries per row, in ``[1, 65535]``.
    policy : {"block", "drop", "overwrite"}, optional
        ``sampler="exactly_k"`` only (default "block"). A row goes into the next free slot at
        or after the writer's cursor, skipping rows awaiting replay; when no slot is free a
        write waits, drops the rows without a slot (counted in ``sampler.dropped``), or
        overwrites the row at the cursor (replays lost counted in ``sampler.lost_replays``).
        Rows are then not in stream order: ``n_step`` and ``elide_next`` are refused (any
        policy), no episode numbers are kept, ``column()`` gives rows in slot order.
    timeout : float, optional
        ``sampler="exactly_k"`` only: seconds a blocked write waits before TimeoutError (None:
        for ever), and a sample short of rows waits for writer threads, from the first call
        on, an empty buffer included (None: ValueError at once).
        See :class:`~tfdata.replay.samplers.exactly_k.ExactlyKSampler`.
    ring_size : int, default 2
        Number of preallocated output batches per batch size (see :class:`Batch`).
    num_envs : int, default 1
        Parallel environment streams. Rows are interleaved step by step (env ``e``'s row of step
        ``t`` in slot ``(t * num_envs + e) % capacity``); the capacity must be a multiple of
        ``num_envs``, ``extend`` takes whole steps and ``push`` needs ``num_envs == 1``.
    n_step : int, optional
        Sample n-step transitions: ``reward`` holds the discounted return of up to ``n_step``
        rows of the stream, ``terminated``/``truncated``/``next_obs`` those of the window's last
        row, and ``batch.discounts`` is ``gamma ** k`` for the ``k`` rows taken. Windows stop at
        an episode end and at the newest row. Needs ``terminated``, ``truncated`` and a float
        ``reward`` field.
    gamma : float, default 0.99
        Discount of the n-step return, in ``[0, 1]``.
    next_of : "auto", mapping or None
        Which fields hold the next value of another (``{"next_obs": "obs"}``); "auto" pairs every
        ``next_X`` with ``X`` of the same dtype and shape. n-step reads them at the window's end.
    elide_next : bool, default False
        Do not store the next fields: read them from the stream's next row (episode-ending rows
        keep theirs aside). Same samples, less memory; each row's ``obs`` must then equal the
        previous row's ``next_obs`` unless that row ended an episode (else SpecError).
    roles : mapping, optional
        Field names of the roles ``reward``, ``terminated``, ``truncated`` if not those.
    frame_stack : int or mapping, optional
        Store a stacked observation one frame per row: ``{"obs": 4}`` (an int ``K`` stacks
        ``obs``) for a field of shape ``(K, *frame)``, oldest frame first, as gymnasium's
        ``FrameStackObservation`` returns it. Only its newest frame is stored, and its next
        field (``next_obs``) not at all; both are rebuilt when sampled, exactly what was pushed
        (padded before the episode's first row). Needs the episode flags; each row's stack must
        continue its stream's previous row (an episode's first row: be padded), and
        ``next_obs`` must be ``obs`` shifted by one frame, else SpecError. Every layout stores
        the frames as a column.
        The capacity must hold ``K`` steps per stream (``capacity >= K * num_envs``). Works with
        every other option (n-step, sequences, prioritized and without-replacement sampling,
        spill, checkpoints, budgets) except ``sampler="exactly_k"``, which writes rows off
        stream order (ValueError). ``column(name)`` gives the stored frames, ``stats=`` their
        statistics; ``update_field`` refuses the stacked field and its next field.
    frame_padding : "reset", "zero", array or mapping, default "reset"
        How the stacks of an episode's first rows are padded: FrameStackObservation's
        ``padding_type`` (``"reset"``: the first frame repeated; ``"zero"``; or a frame of a
        bool, integer or float field, finite: a checkpoint keeps it in its JSON config);
        per stacked field with a mapping.
    spill_path : str or path, optional
        Keep the rows in this file (an AoS ``.npy``, or an SoA or grouped directory, created
        sparse; the path must not exist: FileExistsError, nothing is replaced) instead of RAM.
        Sampling, writing and wrap-around are unchanged; only the ``hot_rows`` newest rows stay
        resident, older pages are released (see :mod:`tfdata.storage.spill`). Needs exactly
        one of ``hot_rows`` and ``hot_bytes``.
    hot_rows : int, optional
        Rows kept resident by a spilling buffer.
    hot_bytes : int or str, optional
        The same as bytes (``"64MB"``, ``"1.5GiB"``; k, M, G are powers of 1024).
    compress_cold : bool, default False
        With ``frame_stack`` and ``spill_path``: keep the frames of the rows that left the hot
        window compressed in RAM too, and read them from there when sampled (the file still
        holds every row: state dicts and checkpoints are unchanged; a loaded state is compressed
        again when it loads). Frames are compressed in blocks of 16 slots with zstd (level 3)
        once a whole block is out of the hot window, and decompressed into a cache of a few
        blocks (4 MiB) when a sample needs them (docs/design/spill-and-cold.md). Batches are
        bit-identical to those of the same buffer without it. Memory:
        ``nbytes_parts["cold"]`` (the compressed blocks, the cache and the block tables);
        ``plan_memory`` counts every frame that can be cold uncompressed (a bound); with a
        ``memory_budget``, a block whose copy would exceed it (or would not be smaller than its
        frames) stays in the file only (see :attr:`cold_info`). Needs the ``zstandard`` package
        (``pip install 'tfdata[compress]'``; ImportError otherwise). See
        :mod:`tfdata.storage.cold`.
    transforms : list, optional
        Applied to every batch in order, under the lock, after the gather and the buffer's own
        transforms (n-step, elision, frame stacks): :class:`tfdata.transforms.Normalize`,
        ``ScaleReward``, ``ClipReward``, ``RandomShift``, ``Cast``, ``Compiled`` (a numba
        function of yours, run without the GIL), ``Function`` (a Python callable). A transform
        may change a field's dtype (``Normalize``: float32). Recorded in ``config`` and
        checkpoints (a function of yours by its import path: see :meth:`load`).
    allocator : str or tfdata.alloc.Allocator, optional
        Where every array of the buffer comes from (rows, output rings, trees, bookkeeping):
        ``"numpy"``, ``"jemalloc"``, ``"mimalloc"``, ``"hugepages"`` or ``"nohugepages"`` (see
        :mod:`tfdata.alloc`). Default: the ``TFDATA_ALLOCATOR`` environment variable, else
        ``"numpy"``. Results never depend on it.
    memory_budget : int or str, optional
        Bytes (or ``"400MB"``) the buffer may hold in all, as :attr:`nbytes` counts them. Checked
        before anything is allocated: construction over budget, the output ring of a new batch
        size, or a growth of the episode-final table (``elide_next``) raises
        :class:`tfdata.MemoryBudgetError` and changes nothing. :func:`tfdata.memory.max_capacity`
        gives the largest capacity that fits.
    stats : list of str, optional
        Fields whose statistics over the rows held are kept up to date (count, and per element
        mean, population variance, std, min, max): read them with :meth:`stats`, normalise with
        ``buf.stats("obs").normalize(x)``. Bool, integer and float fields that are stored.
        Writes do no statistics work; a read recomputes what changed since the previous read
        (see :mod:`tfdata.replay.columns`). Memory: about ``capacity / 32`` float64 values per
        element of the field, up to twice that (``nbytes_parts["trees"]``). A field stacked with ``frame_stack`` has the statistics of
        its frames (one per row, as stored), of the frame's shape: ``normalize`` broadcasts
        them over a batch of stacks.
    rate_limiter : tfdata.RateLimiter, optional
        Keeps rows sampled per row inserted near its ``samples_per_insert``: ``sample`` and
        ``sample_sequences`` wait while sampling would run ahead, ``push`` and ``extend`` while
        inserting would (between threads; the lock and the GIL are released while waiting),
        each up to the limiter's ``timeout`` (then TimeoutError, nothing changed). With a
        limiter, sampling also waits for ``batch_size`` rows instead of raising. One limiter
        per buffer; its counts are in :meth:`state_dict` and checkpoints, ``clear`` resets
        them. Holds nothing per row (no memory in :attr:`nbytes`). See
        :mod:`tfdata.replay.limiter`.

    Notes
    -----
    *Sampling* is uniform **with replacement** over the rows currently held, and needs
    ``1 <= batch_size <= len(buffer)``: a batch larger than the data is almost always a
    configuration error (learning starts before the buffer holds a batch).

    *Combinations*: every option combines with every other, except the pairs refused at
    construction (ValueError or NotImplementedError naming both options and why), listed in
    one table, :data:`tfdata.replay.combinations.RULES`: with ``sampler="exactly_k"``,
    ``n_step``, ``elide_next``, ``frame_stack`` and a rate limiter whose
    ``samples_per_insert`` is not ``replays``; ``compress_cold`` without ``frame_stack`` and
    ``spill_path``.

    *Threads*: one writer and any number of samplers may share a buffer. Writes and samples are
    serialised by an internal lock, and kernels release the GIL, so other Python threads
    (an environment, a learner) keep running while a sample is gathered. A sampler never sees a
    row that is half written.

    *Steady state allocates nothing*: push and extend write in place; sample reuses its output
    ring. The first ``sample`` with a new batch size allocates that size's ring.

    *Episodes* are tracked when the spec has bool ``terminated`` and ``truncated`` fields
    (:meth:`sample_sequences` uses them).

    *Columns*: :meth:`column` (read-only views of one field, oldest to newest, no copy),
    :meth:`column_stats` (statistics computed now), :meth:`stats` (running statistics of the
    ``stats=`` fields) and :meth:`update_field` (relabelling rows in place).
    """

    #: the samplers it builds from a name (a checkpoint of it may name them), and the one it
    #: has when its config names none
    SAMPLERS = SAMPLERS
    DEFAULT_SAMPLER = "uniform"

    def __init__(self, spec, capacity: int, *, layout=None, seed: int | None = None,
                 sampler=None, ring_size: int = 2, num_envs: int = 1, n_step: int | None = None,
                 gamma: float = 0.99, next_of="auto", elide_next: bool = False, roles=None,
                 spill_path=None, hot_rows: int | None = None, hot_bytes=None,
                 allocator=None, memory_budget=None, stats=None, rate_limiter=None,
                 replays: int | None = None, policy: str | None = None,
                 timeout: float | None = None, frame_stack=None, frame_padding="reset",
                 compress_cold: bool = False, transforms=None):
        sampler = _named_sampler(sampler, seed, {"replays": replays, "policy": policy,
                                                 "timeout": timeout})
        super().__init__(spec, capacity, sampler, layout=layout, ring_size=ring_size,
                         num_envs=num_envs, n_step=n_step, gamma=gamma, next_of=next_of,
                         elide_next=elide_next, roles=roles, spill_path=spill_path,
                         hot_rows=hot_rows, hot_bytes=hot_bytes, allocator=allocator,
                         memory_budget=memory_budget, stats=stats, rate_limiter=rate_limiter,
                         frame_stack=frame_stack, frame_padding=frame_padding,
                         compress_cold=compress_cold, transforms=transforms)

    @property
    def config(self) -> dict:
        """As :attr:`ReplayCore.config`, plus the sampler's: ``sampler`` (its name) when it is
        not uniform, and its options (``replays``, ``policy``, ``timeout`` for exactly-k); a
        sampler that cannot be saved (no ``name``, see :func:`unsaved_reason`) gives
        ``sampler`` None."""
        return {**super().config, **sampler_entries(type(self), self.sampler, self.DEFAULT_SAMPLER)}

    @classmethod
    def sampler_classes(cls, given=()) -> dict:
        """``{name: class}`` of the samplers a checkpoint of this class may name: tfdata's, and
        the classes ``given`` to :meth:`load` (``samplers=``: an allow-list, by their
        ``name``; TypeError or ValueError for one that is not a sampler class with a name of
        its own)."""
        out = dict(cls.SAMPLERS)
        given = () if given is None else given
        if isinstance(given, (str, bytes)) or not hasattr(given, "__iter__"):
            raise TypeError(f"samplers must be a list of sampler classes, got "
                            f"{type(given).__name__}")
        for s in given:
            name = getattr(s, "name", None)
            if not isinstance(s, type) or not callable(getattr(s, "from_config", None)):
                raise TypeError(f"samplers: expected sampler classes (with name and from_config), "
                                f"got {s!r:.100}")
            if not isinstance(name, str) or not name:
                raise ValueError(f"samplers: {s.__name__} has no name (a str): a checkpoint "
                                 f"names its sampler")
            mine = TFDATA_SAMPLERS.get(name, out.get(name))
            if mine is not None and mine is not s:
                raise ValueError(f"samplers: {s.__name__} has the name {name!r} of "
                                 f"{mine.__name__}; give it a name of its own")
            out[name] = s
        return out

    @classmethod
    def unsaved_reason(cls, sampler) -> str | None:
        """Why a checkpoint could not rebuild ``sampler`` in a buffer of this class (None: it
        can): see :func:`unsaved_reason`."""
        return unsaved_reason(cls, sampler)

    @classmethod
    def sampler_options(cls, sampler) -> dict:
        """The constructor's keywords that give a buffer ``sampler`` (an unbound sampler that
        ``from_config`` built, seeded)."""
        return {"sampler": sampler}

    @classmethod
    def _planned_sampler(cls, options: dict):
        sampler = options.pop("sampler", None)
        extra = {k: options.pop(k, None) for k in EXACTLY_K_OPTIONS}
        if sampler is None or isinstance(sampler, str):
            return _named_sampler(sampler, 0, extra)
        return _named_sampler(sampler, None, extra)
