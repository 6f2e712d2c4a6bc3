"""Replay buffers hosted in Ray actors: rollout workers on many machines push, a learner samples.

Optional: needs Ray (``pip install 'tfdata[ray]'``) and is never imported by ``import tfdata``.

:class:`RayReplayBuffer` is a small picklable handle over ``num_shards`` Ray actors, each holding
an ordinary :class:`tfdata.ReplayBuffer` (or :class:`tfdata.PrioritizedReplayBuffer`) of
``capacity // num_shards`` rows. Pass the handle to Ray tasks or actors (the rollout workers):
they validate rows in their own process and send them to a shard without waiting; the learner
samples through its own copy of the handle. What crosses Ray with no copy:
:class:`RayReplayBuffer` (Notes) and docs/design/ray.md.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping

import numpy as np

try:
    import ray
except ImportError as exc:  # the optional extra is not installed
    raise ImportError("tfdata.ray needs Ray, which is not installed: pip install 'tfdata[ray]'") from exc

from ._checks import check_float as _check_float
from ._checks import check_int as _check_int
from .batch import Batch
from .replay.buffer import ReplayBuffer
from .errors import SpecError
from .replay.prioritized import PrioritizedReplayBuffer, batch_slots
from .spec import Spec

_STATE_FORMAT = "tfdata.ray.RayReplayBuffer"
_STATE_VERSION = 1
# buffer options that need one writer per buffer (windows follow a stream's consecutive rows);
# a shard receives the rows of many workers interleaved, so they would mix streams
_STREAM_OPTIONS = ("n_step", "elide_next", "num_envs")
_SCHEDULE = ("beta", "beta_final", "beta_steps")  # the handle owns the beta schedule


def _get(refs):
    """``ray.get``, raising an actor's own exception (SpecError, ValueError...) rather than
    Ray's wrapper; the wrapper, with the remote traceback, is kept as its ``__cause__``."""
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as err:
        cause = getattr(err, "cause", None)
        if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
            raise cause from err
        raise


def _pieces(k: int, n: int) -> list[int]:
    """Split ``k`` draws into powers of two no larger than ``n``: a shard then only ever
    allocates output rings of sizes 1, 2, 4, ... (each batch size gets its own ring)."""
    out = []
    cap = 1 << (n.bit_length() - 1)
    while k:
        m = min(1 << (k.bit_length() - 1), cap)
        out.append(m)
        k -= m
    return out


class _Shard:
    """One shard, inside its Ray actor: a tfdata buffer and counters.

    Runs with ``max_concurrency=1``: one method at a time, in one thread. That is what makes
    returning views of the buffer's output ring safe: Ray serialises a method's return value
    (copies it into the object store or into the reply) before the actor runs its next method,
    and only the next ``sample`` of this thread can overwrite the ring.
    """

    def __init__(self, config: dict):
        self._config = config
        self.buf = None

    def build(self) -> int:
        """Build the buffer; its constructor's errors reach the caller through ``ray.get``."""
        c = dict(self._config)
        cls = PrioritizedReplayBuffer if c.pop("prioritized") else ReplayBuffer
        self.buf = cls(Spec.from_dict(c.pop("spec")), c.pop("capacity"), **c)
        self.rows = 0  # rows received
        self.extends = 0  # extend calls received
        self.samples = 0
        self.stale_skipped = 0
        return 0

    # -- writing ----------------------------------------------------------------------------
    def extend(self, fields: dict, priorities=None) -> int:
        # validated by the sender; the buffer checks again (cheap on exact dtypes and shapes)
        if priorities is None:
            self.buf.extend(fields)
        else:
            self.buf.extend(fields, priorities)
        n = len(next(iter(fields.values())))
        self.rows += n
        self.extends += 1
        return n

    # -- sampling ---------------------------------------------------------------------------
    def info(self) -> tuple:
        """``(rows held, sampling mass, smallest leaf)``: what the handle splits a batch by.

        For a prioritized buffer the mass is the root of its sum tree and the smallest leaf the
        root of its min tree (``(p + eps) ** alpha``); for a uniform one, ``(n, n, 1.0)``.
        """
        buf = self.buf
        n = len(buf)
        if isinstance(buf, PrioritizedReplayBuffer):
            # the trees' roots (the sampler's public mass, read in the actor's only thread)
            return (n, *buf.sampler.mass())
        return n, float(n), 1.0

    def sample(self, k: int, beta, whole: bool, names=None):
        """Draw ``k`` rows (with ``beta`` as the importance exponent when prioritized); only
        the fields ``names`` (a checked tuple) when given.

        ``whole``: one ``buffer.sample(k)`` (needs ``k <= len``; the one-shard path). Otherwise
        ``k`` may exceed the rows held (the draws of a multinomial split, with replacement) and
        is drawn in power-of-two pieces copied into fresh arrays.

        Returns
        -------
        fields : dict of str to ndarray
            C-contiguous, dtype ``spec[name].dtype``, shape ``(k, *spec[name].shape)``; the
            fields ``names`` (every field when None).
        slots : ndarray of int64, shape (k,)
            This shard's slots.
        weights : ndarray of float32, shape (k,), or None
            Importance weights normalised by this shard's smallest priority (prioritized only).
        versions : ndarray of uint64, shape (k,), or None
            Write versions of the slots at the sample (prioritized only).
        """
        buf = self.buf
        if beta is not None:
            buf.beta_start = beta  # beta_steps is None in a shard: this is the beta used
        self.samples += 1
        weighted = isinstance(buf, PrioritizedReplayBuffer)
        keep = buf.spec.names if names is None else names
        if whole:
            b = buf.sample(k, fields=names)
            # SoA fields are C-contiguous views of the ring: Ray copies them straight into the
            # object store. AoS fields are strided views of one record array, which Ray would
            # pickle in-band and the learner receive as private copies: make them contiguous.
            fields = {name: np.ascontiguousarray(b[name]) for name in keep}
            # versions as uint64 whatever the buffer counts them in (uint32, modulo 2**32)
            versions = None if b.versions is None else b.versions.astype(np.uint64)
            return fields, b.indices, b.weights, versions
        n = len(buf)
        if n == 0:
            raise ValueError("cannot sample from an empty shard")
        fields = {name: np.empty((k,) + buf.spec[name].shape, buf.spec[name].dtype) for name in keep}
        slots = np.empty(k, np.int64)
        weights = np.empty(k, np.float32) if weighted else None
        versions = np.empty(k, np.uint64) if weighted else None
        at = 0
        for m in _pieces(k, n):
            b = buf.sample(m, fields=names)  # views: copied out before the next piece may reuse the ring
            for name, arr in fields.items():
                arr[at:at + m] = b[name]
            slots[at:at + m] = b.indices
            if weighted:
                weights[at:at + m] = b.weights
                versions[at:at + m] = b.versions
            at += m
        return fields, slots, weights, versions

    def update_priorities(self, slots, priorities, versions, stale: str) -> int:
        """Set priorities; with ``versions`` and ``stale="skip"`` drop the rows overwritten since
        their sample instead of refusing the update. Returns the number of rows skipped."""
        buf = self.buf
        skipped = 0
        if versions is not None and stale == "skip":
            # write versions per slot (tfdata internals; no write can run between this check and
            # the update: the actor runs one method at a time)
            keep = buf.sampler.fresh(slots, versions)
            skipped = int(keep.size - np.count_nonzero(keep))
            if skipped:
                slots, priorities, versions = slots[keep], priorities[keep], versions[keep]
        buf.update_priorities(slots if versions is None else Batch({}, slots, versions=versions),
                              priorities)
        self.stale_skipped += skipped
        return skipped

    # -- columns ----------------------------------------------------------------------------
    def column_stats(self, name: str, running: bool) -> tuple:
        """``(count, values)`` of :meth:`tfdata.ReplayBuffer.column_stats`, or with ``running``
        of :meth:`tfdata.ReplayBuffer.stats` (plain data: a FieldStats does not pickle)."""
        st = self.buf.stats(name) if running else self.buf.column_stats(name)
        return st.count, np.array(st.values)

    def update_field(self, name: str, slots, values) -> int:
        self.buf.update_field(name, slots, values)
        return len(slots)

    # -- state ------------------------------------------------------------------------------
    def size(self) -> int:
        return len(self.buf)

    def stats(self) -> dict:
        buf = self.buf
        return {"size": len(buf), "capacity": buf.capacity, "layout": buf.layout,
                "nbytes": buf.nbytes, "rows_received": self.rows, "extend_calls": self.extends,
                "sample_calls": self.samples, "stale_skipped": self.stale_skipped}

    def state_dict(self) -> dict:
        return self.buf.state_dict()

    def load_state_dict(self, state) -> int:
        self.buf.load_state_dict(state)
        return len(self.buf)


# max_concurrency=1 is part of the contract (see _Shard); set here so options cannot lose it
_ShardActor = ray.remote(max_concurrency=1)(_Shard)


class RayReplayBuffer:
    """A replay buffer sharded over Ray actors, shared by rollout workers and a learner.

    Parameters
    ----------
    spec : Spec or mapping
        The row schema, as for :class:`tfdata.ReplayBuffer`.
    capacity : int
        Total rows; each of the ``num_shards`` shards holds ``capacity // num_shards``, so the
        capacity must be a multiple of ``num_shards``.
    num_shards : int, default 1
        Actors to spread the rows (and the ingestion work) over.
    prioritized : bool, default False
        Shards are :class:`tfdata.PrioritizedReplayBuffer` s: ``alpha``, ``beta``,
        ``beta_final``, ``beta_steps`` and ``eps`` are taken from ``buffer_kwargs``. The beta
        schedule counts this handle's :meth:`sample` calls.
    layout : {"aos", "soa"} or list of lists of str, optional
        Layout of every shard (a grouping: see :class:`tfdata.ReplayBuffer`), resolved here
        (the argument, else this process's ``TFDATA_LAYOUT``, else ``"aos"``) so all shards
        agree whatever the remote environment.
    seed : int, optional
        Seeds the shards and the handle's split of batches over shards, through
        ``numpy.random.SeedSequence(seed)``. The same seed and the same rows in the same shards
        give the same batches. None draws one (recorded as :attr:`seed`).
    actor_options : dict, optional
        Passed to Ray's ``.options()`` for every shard actor: ``num_cpus``, ``memory``,
        ``resources``, ``scheduling_strategy`` (e.g. a ``NodeAffinitySchedulingStrategy`` or
        ``"SPREAD"``), ``runtime_env``... ``max_concurrency`` must stay 1.
    max_in_flight : int, default 4
        Writes (``extend``, ``push``, ``update_priorities``) this handle leaves unacknowledged
        before it waits for the oldest: the bound on memory and on how far a fast worker runs
        ahead of a slow shard.
    **buffer_kwargs
        Passed to every shard's buffer: ``ring_size``, ``allocator``, ``memory_budget`` (per
        shard), ``roles``, ``spill_path`` (with ``"{shard}"`` in it when ``num_shards > 1``),
        and the prioritized options. ``n_step``, ``elide_next`` and ``num_envs`` are refused: a
        shard holds the rows of many workers interleaved, so windows would mix their streams;
        compute n-step returns in the worker instead.

    Notes
    -----
    *Writing* (:meth:`extend`: checked here, sent without waiting). Rows go to the shards
    round-robin per copy of the handle (each worker's copy starts at shard 0, so every worker
    spreads its rows evenly). An error in a shard (an actor that died, a refused write) is
    raised by this handle's next call, before that call sends anything, or by :meth:`flush`.
    Ray runs the calls of one handle on one actor in order, so a :meth:`sample` or ``len()``
    after an ``extend`` sees its rows, without a flush.

    *Sampling* is uniform (or proportional to priority) with replacement over all rows held,
    as in one buffer of the whole capacity. With one shard, one actor call; with several, one
    call for every shard's size (or priority mass), a multinomial split of the batch in
    proportion to it, one concurrent call per shard that got rows, and a concatenation.

    *Zero copy* (``tests/test_ray.py`` checks it). A one-shard batch above Ray's
    ``max_direct_call_object_size`` (100 KiB by default) comes back as read-only views of the
    shared-memory object store, pinning its object while they live; a smaller one is inlined in
    the reply and copied once (read-only all the same). Several shards give writable
    concatenated copies.

    *Copies of the handle* (pickled into tasks and actors) share the shards. Only the handle
    that created them kills them (:meth:`close`); a copy's ``close`` only flushes. A rollout
    task should ``flush()`` (or use ``with handle:``) before it returns, so that its errors
    reach it. A handle is not thread-safe: give each thread its own copy.

    *Construction* waits until every shard actor is placed and its buffer built, so a bad
    option or a ``memory_budget`` refusal raises here; with ``actor_options`` no node can
    satisfy, it waits as Ray's pending actors do.
    """

    def __init__(self, spec, capacity: int, *, num_shards: int = 1, prioritized: bool = False,
                 layout=None, seed: int | None = None, actor_options=None,
                 max_in_flight: int = 4, **buffer_kwargs):
        from .storage import resolve_layout

        self.spec = spec if isinstance(spec, Spec) else Spec(spec)
        capacity = _check_int("capacity", capacity, 1)
        self.num_shards = _check_int("num_shards", num_shards, 1)
        if capacity % self.num_shards:
            lo = capacity - capacity % self.num_shards
            raise ValueError(f"capacity {capacity} is not a multiple of num_shards {self.num_shards} "
                             f"(each shard holds capacity // num_shards rows); use "
                             f"{lo or self.num_shards} or {lo + self.num_shards}")
        self.shard_capacity = capacity // self.num_shards
        self.prioritized = bool(prioritized)
        self.layout = resolve_layout(layout, self.spec)
        self._max_in_flight = _check_int("max_in_flight", max_in_flight, 1)
        for k in _STREAM_OPTIONS:
            if k in buffer_kwargs and buffer_kwargs[k] not in (None, False, 1):
                raise ValueError(f"{k}={buffer_kwargs[k]!r} is not supported by RayReplayBuffer: a "
                                 "shard receives the rows of many workers interleaved, so n-step "
                                 "windows and next-field elision would mix their streams; compute "
                                 "n-step returns in the rollout worker")
            buffer_kwargs.pop(k, None)
        options = dict(actor_options or {})
        if options.get("max_concurrency", 1) != 1:
            raise ValueError("actor_options: max_concurrency must be 1 (a shard returns views of "
                             "its output ring, valid until its next sample)")
        options.pop("max_concurrency", None)
        # the beta schedule counts the learner's samples, not each shard's calls
        self._samples = 0
        if self.prioritized:
            self.beta_start = _check_float("beta", buffer_kwargs.pop("beta", 0.4), 0.0)
            self.beta_final = _check_float("beta_final", buffer_kwargs.pop("beta_final", 1.0), 0.0)
            steps = buffer_kwargs.pop("beta_steps", None)
            self.beta_steps = None if steps is None else _check_int("beta_steps", steps, 1)
        else:
            bad = [k for k in _SCHEDULE if k in buffer_kwargs]
            if bad:
                raise TypeError(f"{bad} apply to prioritized=True only")
        spill = buffer_kwargs.pop("spill_path", None)
        if spill is not None and self.num_shards > 1 and "{shard}" not in str(spill):
            raise ValueError("spill_path: with several shards put '{shard}' in the path (each "
                             f"shard needs its own file), got {spill!r}")
        ss = np.random.SeedSequence(seed)
        self.seed = ss.entropy
        handle_ss, *shard_ss = ss.spawn(self.num_shards + 1)
        self._rng = np.random.default_rng(handle_ss)
        self._actors = []
        for s in range(self.num_shards):
            config = {"spec": self.spec.to_dict(), "capacity": self.shard_capacity,
                      "prioritized": self.prioritized, "layout": self.layout,
                      "seed": int(shard_ss[s].generate_state(1, np.uint64)[0]), **buffer_kwargs}
            if spill is not None:
                config["spill_path"] = str(spill).replace("{shard}", str(s))
            self._actors.append(_ShardActor.options(**options).remote(config))
        self._owner = True
        self._closed = False
        self._pending = collections.deque()
        self._next_shard = 0
        try:  # constructor errors (bad keyword, memory budget) here, as tfdata's own exceptions
            _get([a.build.remote() for a in self._actors])
        except BaseException:
            self._kill()
            raise

    # -- copies -----------------------------------------------------------------------------
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_pending"] = None  # refs in flight belong to this copy
        state["spec"] = self.spec.to_dict()  # plain data; the Spec rebuilds its checks
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.spec = Spec.from_dict(state["spec"])
        self._pending = collections.deque()
        self._owner = False
        self._next_shard = 0

    # -- writing ----------------------------------------------------------------------------
    def extend(self, batch: Mapping, shard: int | None = None, priorities=None) -> None:
        """Validate ``n`` rows here, then send them to one shard without waiting.

        Parameters
        ----------
        batch : mapping of str to array_like
            One array per field, each of shape ``(n, *spec[name].shape)`` (as
            :meth:`tfdata.ReplayBuffer.extend`).
        shard : int, optional
            The shard, in ``[0, num_shards)``. Default: the next one, round-robin.
        priorities : array_like of float, shape (n,), optional
            Prioritized buffers only: the rows' priorities, finite and ``>= 0`` (default: the
            shard's current maximum).

        Raises
        ------
        SpecError
            Bad input, raised here before anything is sent.
        Exception
            The error of an earlier write of this handle that failed in its shard.
        """
        self._reap()
        n, values = self.spec.check_batch(batch)
        p = self._check_new_priorities(priorities, n, "extend")
        if n == 0:
            return
        self._send(shard, dict(zip(self.spec.names, values)), p)

    def push(self, row: Mapping, shard: int | None = None, priority=None) -> None:
        """Validate one row here and send it (see :meth:`extend`).

        Each push is one actor call (about a millisecond of round trip, though the caller does
        not wait for it): rollout workers should :meth:`extend` steps or chunks of rows.
        """
        self._reap()
        values = self.spec.check_row(row)
        p = self._check_new_priorities(None if priority is None else [priority], 1, "push")
        self._send(shard, {f.name: np.asarray(v, f.dtype).reshape((1,) + f.shape)
                           for f, v in zip(self.spec, values)}, p)

    def flush(self) -> None:
        """Wait until every write of this handle has been applied; raise the first error."""
        self._check_open()
        while self._pending:
            _get(self._pending.popleft())

    def _send(self, shard, fields: dict, priorities) -> None:
        self._make_room(1)
        if shard is None:
            s = self._next_shard
            self._next_shard = (s + 1) % self.num_shards
        else:
            s = _check_int("shard", shard, 0, self.num_shards - 1)
        self._pending.append(self._actors[s].extend.remote(fields, priorities))

    def _make_room(self, k: int) -> None:
        """Backpressure: wait for the oldest writes until ``k`` more fit in flight. Runs before
        anything is sent, so a call that raises has sent nothing."""
        while self._pending and len(self._pending) + k > self._max_in_flight:
            _get(self._pending.popleft())

    def _reap(self) -> None:
        """Collect the writes that have finished, raising the first that failed."""
        self._check_open()
        if self._pending:
            ready, _ = ray.wait(list(self._pending), num_returns=len(self._pending), timeout=0)
            if ready:
                done = set(ready)
                self._pending = collections.deque(r for r in self._pending if r not in done)
                _get(ready)

    def _check_new_priorities(self, priorities, n: int, what: str):
        if priorities is None:
            return None
        if not self.prioritized:
            raise TypeError(f"{what}: priorities need prioritized=True")
        return self._check_priorities(priorities, n, what)

    @staticmethod
    def _check_priorities(priorities, n: int, what: str) -> np.ndarray:
        try:
            p = np.asarray(priorities, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise SpecError(f"{what}: priorities must be numbers ({exc})") from None
        if p.shape != (n,):
            raise SpecError(f"{what}: expected priorities of shape ({n},), got shape {p.shape}")
        bad = ~(np.isfinite(p) & (p >= 0))
        if bad.any():
            k = int(np.argmax(bad))
            raise ValueError(f"{what}: priorities must be finite and >= 0, got {p[k]} at position {k}")
        return p

    # -- sampling ---------------------------------------------------------------------------
    @property
    def beta(self) -> float | None:
        """The importance-sampling exponent of the next :meth:`sample` (prioritized only)."""
        if not self.prioritized:
            return None
        if self.beta_steps is None:
            return self.beta_start
        frac = min(1.0, self._samples / self.beta_steps)
        return self.beta_start + (self.beta_final - self.beta_start) * frac

    def sample(self, batch_size: int, *, fields=None) -> Batch:
        """Draw ``batch_size`` rows with replacement from all shards.

        Parameters
        ----------
        batch_size : int
        fields : list of str, optional
            Only these fields are gathered by the shards and sent (field projection, as in
            :meth:`tfdata.ReplayBuffer.sample`: the batch the same call without ``fields``
            would have returned, restricted to them). Checked here (SpecError naming an unknown
            field), before anything is sent.

        Returns
        -------
        Batch
            ``batch[name]``: dtype ``spec[name].dtype``, shape ``(batch_size, *spec[name].shape)``.
            ``batch.indices``: int64 ``(batch_size,)``, global slots
            ``shard * shard_capacity + slot`` (``divmod(i, shard_capacity)`` gives both).
            Prioritized: ``batch.weights`` float32 ``(batch_size,)``, importance weights
            normalised over all shards (at most 1), and ``batch.versions`` uint64
            ``(batch_size,)`` for :meth:`update_priorities`. With several shards the rows are
            grouped by shard, in shard order. Read-only or not: see *Zero copy* in the class
            Notes.

        Raises
        ------
        ValueError
            ``batch_size`` larger than the rows held by all shards, or the buffer is empty.
        """
        self._reap()
        batch_size = _check_int("batch_size", batch_size, 1)
        names = None if fields is None else self.spec.select(fields)
        beta = self.beta
        if self.num_shards == 1:
            fields, slots, weights, versions = _get(self._actors[0].sample.remote(batch_size, beta, True, names))
            self._samples += 1
            return Batch(fields, slots, weights, versions)
        info = _get([a.info.remote() for a in self._actors])
        sizes = np.array([i[0] for i in info], np.int64)
        total = int(sizes.sum())
        if batch_size > total:
            raise ValueError("cannot sample from an empty buffer" if total == 0 else
                             f"batch_size {batch_size} is larger than the {total} rows held by "
                             f"{self.num_shards} shards; sampling is with replacement but needs "
                             f"batch_size <= len(buffer)")
        mass = np.array([i[1] for i in info], np.float64)
        counts = self._rng.multinomial(batch_size, mass / mass.sum())
        parts = [(s, int(k)) for s, k in enumerate(counts) if k]
        got = _get([self._actors[s].sample.remote(k, beta, False, names) for s, k in parts])
        self._samples += 1
        fields = {name: np.concatenate([g[0][name] for g in got]) for name in names or self.spec.names}
        slots = np.concatenate([g[1] + s * self.shard_capacity for (s, _), g in zip(parts, got)])
        if not self.prioritized:
            return Batch(fields, slots)
        # a shard normalises weights by its own smallest leaf; rescale to the global one
        low = min(i[2] for i in info if i[0])
        weights = np.concatenate([g[2] * (low / info[s][2]) ** beta for (s, _), g in zip(parts, got)])
        versions = np.concatenate([g[3] for g in got])
        return Batch(fields, slots, weights.astype(np.float32), versions)

    def update_priorities(self, batch, priorities, *, stale: str = "skip") -> None:
        """Send new priorities to the shards of the sampled rows, without waiting.

        Parameters
        ----------
        batch : Batch or array_like of int, shape (k,)
            A batch from :meth:`sample` (its versions let a shard detect rows overwritten since
            the sample), or global slots in ``[0, capacity)``.
        priorities : array_like of float, shape (k,)
            Finite and ``>= 0``; checked here before anything is sent.
        stale : {"skip", "raise"}
            What a shard does with rows overwritten since the sample: skip them (counted in
            ``stats()["stale_skipped"]``), or refuse its whole update as
            :meth:`tfdata.PrioritizedReplayBuffer.update_priorities` does (the ValueError is
            raised by this handle's next call or :meth:`flush`). Default "skip": with workers
            writing all the time, an overwrite between a sample and its update is routine.
        """
        self._reap()
        if not self.prioritized:
            raise TypeError("update_priorities needs prioritized=True")
        if stale not in ("skip", "raise"):
            raise ValueError(f"stale must be 'skip' or 'raise', got {stale!r}")
        idx, versions = batch_slots(batch)
        p = self._check_priorities(priorities, idx.shape[0], "update_priorities")
        if idx.size == 0:
            return
        idx = idx.astype(np.int64, copy=False)
        cap = self.num_shards * self.shard_capacity
        if idx.min() < 0 or idx.max() >= cap:
            raise ValueError(f"update_priorities: indices must be in [0, {cap}), got values in "
                             f"[{idx.min()}, {idx.max()}]")
        shard, slot = np.divmod(idx, self.shard_capacity)
        targets = np.unique(shard)
        self._make_room(len(targets))  # all parts or none
        for s in targets:
            m = shard == s
            v = None if versions is None else versions[m]
            self._pending.append(self._actors[int(s)].update_priorities.remote(slot[m], p[m], v, stale))

    # -- columns ----------------------------------------------------------------------------
    def _field(self, name, what: str):
        if not isinstance(name, str) or name not in self.spec:
            raise SpecError(f"{what}: {self.spec.unknown_message(name)}")
        return self.spec[name]

    def _merged_stats(self, name, what: str):
        from .replay.columns import merge_stats

        f = self._field(name, what)
        self.flush()
        running = what == "field_stats"
        return merge_stats(name, f.shape, _get([a.column_stats.remote(name, running)
                                                for a in self._actors]))

    def column_stats(self, name: str):
        """Statistics of field ``name`` over the rows of every shard: each shard computes its
        own in one compiled pass (:meth:`tfdata.ReplayBuffer.column_stats`), this handle merges
        them (Chan's formulas, float64). Flushes first, so the rows this handle sent count.

        Returns
        -------
        tfdata.replay.columns.FieldStats
            ``count``, and per element (arrays of the field's shape, float64) ``mean``, ``var``
            (population), ``std``, ``min``, ``max``. With one shard, the shard's own.

        Raises
        ------
        SpecError
            Unknown field, or one of a dtype statistics are not computed for (raised by a shard).
        """
        return self._merged_stats(name, "column_stats")

    def field_stats(self, name: str):
        """The running statistics of field ``name`` (``stats=[...]`` among the buffer options:
        every shard keeps them, :meth:`tfdata.ReplayBuffer.stats`), merged over the shards as
        :meth:`column_stats` merges. Flushes first. SpecError: a field with no statistics
        kept (raised by the shards)."""
        return self._merged_stats(name, "field_stats")

    def update_field(self, name: str, indices, values) -> None:
        """Rewrite field ``name`` of the rows at global slots ``indices`` (as ``batch.indices``
        gives them) in place, on their shards (relabelling, as
        :meth:`tfdata.ReplayBuffer.update_field`), and wait until every shard has done it.

        Checked here, before anything is sent: the field, indices a 1-D integer array of slots
        held (each in its shard's ``[0, len)``), each given once, values that cast without loss
        to ``(len(indices), *spec[name].shape)``. A shard can still refuse a field its buffer
        does not rewrite (its SpecError is raised here); the check is made by every shard
        before any writes, so nothing changes then either.

        Raises
        ------
        SpecError, IndexError, ValueError
            As :meth:`tfdata.ReplayBuffer.update_field`; nothing is sent.
        """
        f = self._field(name, "update_field")
        self.flush()
        idx = np.asarray(indices)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise SpecError(f"update_field: indices must be a 1-D integer array, got "
                            f"{idx.dtype}{list(idx.shape)}")
        idx = idx.astype(np.int64, copy=False)
        vals = np.asarray(f.coerce(values, (idx.shape[0],)), f.dtype)
        if idx.size == 0:
            return
        sizes = _get([a.size.remote() for a in self._actors])  # rows only grow: a slot held stays held
        shard, slot = np.divmod(idx, self.shard_capacity)
        for i in range(idx.shape[0]):
            s = int(shard[i])
            if idx[i] < 0 or s >= self.num_shards or slot[i] >= sizes[s]:
                raise IndexError(f"update_field: index {int(idx[i])} at position {i} is not a slot "
                                 f"held (shard {s} holds {sizes[s] if 0 <= s < self.num_shards else 0} "
                                 f"rows of {self.shard_capacity})")
        uniq, first, counts = np.unique(idx, return_index=True, return_counts=True)
        if (counts > 1).any():
            dup = int(uniq[np.argmax(counts > 1)])
            pos = np.flatnonzero(idx == dup)
            raise ValueError(f"update_field: index {dup} is given twice (positions {int(pos[0])} "
                             f"and {int(pos[1])})")
        targets = [int(s) for s in np.unique(shard)]
        # a field a shard refuses (an episode flag...) is refused by every shard the same way,
        # before any write: the first reply raises it, and no shard has written
        _get([self._actors[s].update_field.remote(name, slot[shard == s], vals[shard == s])
              for s in targets])

    # -- state ------------------------------------------------------------------------------
    def __len__(self) -> int:
        self._reap()
        return int(sum(_get([a.size.remote() for a in self._actors])))

    def size(self) -> int:
        """Rows held by all shards (as ``len``)."""
        return len(self)

    @property
    def capacity(self) -> int:
        return self.num_shards * self.shard_capacity

    def stats(self) -> dict:
        """Figures of every shard and of this handle.

        ``shards``: per shard ``size``, ``capacity``, ``layout``, ``nbytes`` (its buffer's
        memory), ``rows_received``, ``extend_calls``, ``sample_calls``, ``stale_skipped``.
        Totals: ``size``, ``capacity``, ``stale_skipped``; this handle: ``in_flight`` (writes
        not yet acknowledged), ``samples`` (its sample calls: the beta schedule's position).
        """
        self._reap()
        shards = _get([a.stats.remote() for a in self._actors])
        return {"num_shards": self.num_shards, "capacity": self.capacity,
                "size": sum(s["size"] for s in shards),
                "stale_skipped": sum(s["stale_skipped"] for s in shards),
                "in_flight": len(self._pending), "samples": self._samples, "shards": shards}

    def state_dict(self) -> dict:
        """Every shard's :meth:`tfdata.ReplayBuffer.state_dict` (a copy of its rows, through the
        object store) plus this handle's split generator and beta position. Flushes first."""
        self.flush()
        return {"format": _STATE_FORMAT, "version": _STATE_VERSION, "num_shards": self.num_shards,
                "shard_capacity": self.shard_capacity, "prioritized": self.prioritized,
                "samples": self._samples, "rng": self._rng.bit_generator.state,
                "shards": _get([a.state_dict.remote() for a in self._actors])}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a :meth:`state_dict` into shards of the same number and capacity.

        Each shard validates its part in full before changing anything; the handle's generator
        and beta position are restored once every shard has taken its part.
        """
        self.flush()
        if not isinstance(state, Mapping) or state.get("format") != _STATE_FORMAT:
            raise ValueError(f"not a {_STATE_FORMAT} state dict")
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"unsupported state version {state.get('version')!r}")
        for key in ("num_shards", "shard_capacity", "prioritized"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"state {key} {state.get(key)!r} differs from this buffer's "
                                 f"{getattr(self, key)!r}")
        shards = state["shards"]
        if not isinstance(shards, (list, tuple)) or len(shards) != self.num_shards:
            raise ValueError(f"state must hold {self.num_shards} shard states")
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng"]
        samples = _check_int("state samples", state["samples"], 0)
        _get([a.load_state_dict.remote(s) for a, s in zip(self._actors, shards)])
        self._rng, self._samples = rng, samples

    # -- lifetime ---------------------------------------------------------------------------
    def close(self) -> None:
        """Flush, then (the handle that created them only) kill the shard actors."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            if self._owner:
                self._kill()
            else:
                self._closed = True

    def _kill(self) -> None:
        self._closed = True
        self._pending = collections.deque()
        for a in self._actors:
            ray.kill(a)

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this RayReplayBuffer is closed")

    def __enter__(self) -> "RayReplayBuffer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "prioritized, " if self.prioritized else ""
        return (f"RayReplayBuffer({kind}capacity={self.capacity}, num_shards={self.num_shards}, "
                f"layout={self.layout!r}, fields={list(self.spec.names)})")
