"""On-policy rollouts: :class:`RolloutBuffer`, a fixed ``num_steps x num_envs`` block of
vector-env steps with compiled generalized advantage estimation (GAE) and shuffled minibatch
epochs (the data path of PPO as CleanRL's ``ppo.py`` writes it).

It reuses the replay buffers' storage and output rings, with kernels of its own
(:mod:`tfdata.kernels._rollout`), and never looks at the layout: the GAE kernel reads
``(num_steps, num_envs)`` views of single fields, the storage gathers minibatches
(docs/design/rollouts.md).
"""

from __future__ import annotations

import numbers
import secrets
from collections.abc import Mapping

import numpy as np

from ._checks import check_int as _check_int
from ._rng import MASK64, splitmix64
from .batch import UNHELD, OutputRing, getrefcount, retire
from .errors import SpecError
from .spec import Field, Spec
from .storage import make_storage, output_nbytes, resolve_layout, storage_nbytes

STATE_FORMAT = "tfdata.rollout"
STATE_VERSION = 1

#: the fields the buffer adds to every spec (float32, shape ()), in this order after the user's
OWN_FIELDS = ("advantage", "return")
#: fields a spec must have: name -> dtype (all of shape ())
REQUIRED = {"reward": np.float32, "value": np.float32, "terminated": np.bool_}
#: fields a spec may have, with a meaning to the buffer
OPTIONAL = {"truncated": np.bool_, "final_value": np.float32}
#: permutation draws are exactly uniform below 2**32 rows (Lemire's multiply-shift on 32 bits)
MAX_ROWS = (1 << 32) - 1


class _RingPart:
    """What an :class:`OutputRing` asks of a sampler, for rings that hold rows only."""

    @staticmethod
    def ring_arrays(batch_size, length, out) -> dict:
        return {}

    @staticmethod
    def batch_view(arrays, fields, attrs) -> None:
        pass


def _check_spec(spec) -> Spec:
    if not isinstance(spec, Spec):
        try:
            spec = Spec(spec)
        except SpecError:
            raise
        except Exception as exc:  # noqa: BLE001  (a spec description of any kind of junk)
            raise SpecError(f"RolloutBuffer: expected a tfdata.Spec or a mapping of fields, got "
                            f"{type(spec).__name__} ({exc})") from None
    for name in OWN_FIELDS:
        if name in spec:
            raise SpecError(f"RolloutBuffer: spec field {name!r}: the buffer adds this field "
                            f"itself (float32, shape ()); remove it from the spec")
    for table, required in ((REQUIRED, True), (OPTIONAL, False)):
        for name, dtype in table.items():
            if name not in spec:
                if required:
                    raise SpecError(f"RolloutBuffer: spec field {name!r} is missing: expected "
                                    f"{np.dtype(dtype)} of shape () (fields: {', '.join(spec.names)})")
                continue
            f = spec[name]
            if f.dtype != np.dtype(dtype) or f.shape != ():
                raise SpecError(f"RolloutBuffer: spec field {name!r}: expected {np.dtype(dtype)} "
                                f"of shape (), got {f.dtype} of shape {f.shape}")
    return spec


def _stored_spec(spec: Spec) -> Spec:
    return Spec(list(spec.fields) + [Field(n, np.float32, ()) for n in OWN_FIELDS])


def _check_seed(seed):
    if isinstance(seed, (bool, float)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed: expected an int or None, got {type(seed).__name__} {seed!r}")
    return int(seed) & MASK64


def _check_discount(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a float in [0, 1], got {type(value).__name__} {value!r}")
    value = float(value)
    if not 0.0 <= value <= 1.0:  # NaN fails too
        raise ValueError(f"{name}: expected a float in [0, 1], got {value!r}")
    return value


def _read_vector(name: str, value, n: int, kinds: str, expected: str) -> np.ndarray:
    """``value`` as an ndarray of shape ``(n,)`` of a dtype kind in ``kinds`` (a view where
    possible), or SpecError naming ``name``, the expected and the given."""
    arr = value
    if type(arr) is not np.ndarray:
        if not (hasattr(value, "__array__") or hasattr(value, "__array_interface__")
                or isinstance(value, (list, tuple, numbers.Number))):
            raise SpecError(f"{name}: expected {expected} of shape ({n},), got {type(value).__name__}")
        try:
            arr = np.asarray(value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise SpecError(f"{name}: expected {expected} of shape ({n},), cannot read "
                            f"{type(value).__name__} as an array ({exc})") from None
    if arr.dtype.kind not in kinds or arr.shape != (n,):
        raise SpecError(f"{name}: expected {expected} of shape ({n},), got {arr.dtype} of shape "
                        f"{arr.shape}")
    return arr


class RolloutBuffer:
    """One rollout of ``num_steps`` vector-env steps of ``num_envs`` envs, with compiled GAE and
    shuffled minibatch epochs.

    Parameters
    ----------
    spec : Spec or mapping
        Must have ``reward`` (float32, shape ()), ``value`` (float32, ()) and ``terminated``
        (bool, ()); may have ``truncated`` (bool, ()) and ``final_value`` (float32, (): the
        critic's value of ``info["final_obs"]``, read only where ``truncated``). Any other
        field is free (``obs``, ``action``, ``log_prob``, ...). ``advantage`` and ``return``
        are the buffer's own (float32, ()) and refused in the spec.
    num_steps, num_envs : int
        Steps per rollout and envs per step; ``num_steps * num_envs < 2**32``.
    layout : "aos", "soa", a list of groups of field names, or None
        As for :class:`tfdata.ReplayBuffer` (groups may name ``advantage`` and ``return``).
    seed : int or None
        Seed of the buffer's own stream of permutations (``minibatches(seed=None)``); None
        draws one from the OS (recorded in :meth:`state_dict`).
    ring_size : int, default 2
        Minibatches of one size held at a time: a yielded :class:`tfdata.Batch` stays valid
        until ``ring_size`` more minibatches of its size have been yielded (a batch still held
        then is retired: reading it raises :class:`tfdata.StaleBatchError`).
    allocator : str or tfdata.alloc.Allocator, optional
        Where the rows and the output rings come from.

    Attributes
    ----------
    spec : Spec
        The fields :meth:`add` takes (the spec given).
    fields : tuple of str
        The fields of a minibatch and of :meth:`field`: the spec's, then ``advantage``,
        ``return``.
    num_steps, num_envs, layout, seed

    Notes
    -----
    Not thread-safe: one thread adds, computes and iterates. Allocation-free once every
    minibatch size has been used once (its output ring built).
    """

    def __init__(self, spec, num_steps: int, num_envs: int, layout=None, *, seed=None,
                 ring_size: int = 2, allocator=None):
        from .kernels import _rollout as k  # numba is imported when the first buffer is built
        from .kernels import permutation

        spec = _check_spec(spec)
        T, E = self._check_shape(num_steps, num_envs)
        ring_size = _check_int("ring_size", ring_size, 1)
        seed = _check_seed(secrets.randbits(63) if seed is None else seed)
        stored = _stored_spec(spec)
        self.layout = resolve_layout(layout, stored)
        self.spec, self.num_steps, self.num_envs = spec, T, E
        self.fields = stored.names
        self.ring_size = ring_size
        self.seed = seed
        self._stored = stored
        self._k = k
        self._permutation = permutation
        self._storage = make_storage(stored, T * E, self.layout, allocator=allocator)
        self._allocator = self._storage.allocator
        a = self._allocator
        # bookkeeping: the epoch permutation, last values / dones as the kernel reads them, the
        # buffer's own generator [key, counter]
        self._perm = a.zeros(T * E, np.int64)
        self._last_values = a.zeros(E, np.float32)
        self._last_dones = a.zeros(E, np.float32)
        self._rng = a.zeros(2, np.uint64)
        self._rng[0] = splitmix64(self.seed)
        self._views = {name: self._view(name) for name in stored.names}
        v = self._views
        has_trunc, has_final = "truncated" in spec, "final_value" in spec
        # a spec without truncations passes ``terminated`` as its truncations (a no-op: a
        # terminated step is cut already), one without final values passes ``value`` (never read)
        self._gae_in = (v["reward"], v["value"], v["terminated"],
                        v["truncated"] if has_trunc else v["terminated"],
                        v["final_value"] if has_final else v["value"], has_final)
        self._gae_out = (v["advantage"], v["return"])
        self._gamma = self._lambda = None  # the discounts of the last call, and as float32
        self._g32 = self._gl32 = None
        self._env_shape = (E,)
        self._rings = {}  # minibatch rows -> OutputRing
        self._pos = 0  # steps added
        self._computed = False
        self._token = 0  # bumped by whatever invalidates a running minibatch iterator
        self._fast_add, self._fast_dtypes = self._make_fast_add()

    # -- construction helpers -----------------------------------------------------------------
    @staticmethod
    def _check_shape(num_steps, num_envs) -> tuple:
        T = _check_int("num_steps", num_steps, 1)
        E = _check_int("num_envs", num_envs, 1)
        if T * E > MAX_ROWS:
            raise ValueError(f"num_steps * num_envs: expected at most {MAX_ROWS} rows, got "
                             f"{T} * {E} = {T * E}")
        return T, E

    def _view(self, name: str) -> np.ndarray:
        """Field ``name`` of every row as ``(num_steps, num_envs, *shape)``: a view (checked)."""
        col = self._storage.field(name)
        view = col.reshape((self.num_steps, self.num_envs) + col.shape[1:])
        if not np.shares_memory(view, col):  # a reshape that copied would detach the buffer
            raise RuntimeError(f"field {name!r}: the storage's view cannot be seen as steps x envs")
        return view

    def _make_fast_add(self):
        """``fast(step, t) -> bool``: write step ``t`` and return True if every value of ``step``
        is one the generic path of :meth:`add` would accept as it is, else write nothing and
        return False (the generic path then validates in full and raises its precise errors).

        ``step`` must be a plain dict with exactly the spec's fields, each an ndarray of shape
        ``(num_envs, *field.shape)`` whose dtype is the one last accepted for that field (at
        first the field's own; :meth:`_learn_dtypes` adds those that cast safely whatever the
        values). Everything is checked before the first write, and a numpy assignment of such
        an array cannot fail. The checks are generated as one function, as
        :mod:`tfdata.replay.fastpush` does.
        """
        spec, E = self.spec, self.num_envs
        dtypes = [f.dtype for f in spec]
        if any("." in name for name in spec.names):  # nested specs: the generic path flattens
            return (lambda step, t: False), dtypes
        ns = {"ndarray": np.ndarray, "dt": dtypes}
        lines = ["def fast(step, t):",
                 f"    if type(step) is not dict or len(step) != {len(spec)}:",
                 "        return False"]
        checks = []
        for i, f in enumerate(spec):
            ns[f"sh{i}"], ns[f"w{i}"] = (E, *f.shape), self._views[f.name]
            lines.append(f"    v{i} = step.get({f.name!r})")
            checks.append(f"type(v{i}) is ndarray and v{i}.dtype is dt[{i}] and v{i}.shape == sh{i}")
        lines.append("    if not (" + "\n            and ".join(checks) + "):")
        lines.append("        return False")
        lines += [f"    w{i}[t] = v{i}" for i in range(len(spec))]
        lines.append("    return True")
        exec(compile("\n".join(lines), "<tfdata generated RolloutBuffer.add>", "exec"), ns)
        return ns["fast"], dtypes

    def _learn_dtypes(self, step) -> None:
        """After the generic path accepted ``step``: let the fast path take the dtypes it was
        given next time, those that cast safely whatever the values (``cast_rule`` "ok")."""
        E, dtypes = self.num_envs, self._fast_dtypes
        for i, f in enumerate(self.spec):
            v = step.get(f.name)
            if (type(v) is np.ndarray and v.shape == (E, *f.shape) and v.dtype is not dtypes[i]
                    and f.cast_rule(v.dtype) == "ok"):
                dtypes[i] = v.dtype

    # -- planning -------------------------------------------------------------------------------
    @staticmethod
    def spec_from_spaces(observation_space, action_space, *, final_value: bool = False) -> Spec:
        """The spec of a PPO rollout from gymnasium spaces (one env's, as a vector env's
        ``single_observation_space`` and ``single_action_space``).

        Fields: :meth:`tfdata.Spec.from_spaces` without ``next_obs`` (``obs``, ``action``,
        ``reward``, ``terminated``, ``truncated``), then ``log_prob`` and ``value`` (float32,
        shape ()), then ``final_value`` (float32, ()) if ``final_value``: the critic's value of
        ``info["final_obs"]``, so that GAE bootstraps through truncations (without it a
        truncation ends the return as CleanRL's ``ppo.py`` does).
        """
        base = Spec.from_spaces(observation_space, action_space, next_obs=False)
        extra = ["log_prob", "value"] + (["final_value"] if final_value else [])
        return Spec(list(base.fields) + [Field(name, np.float32, ()) for name in extra])

    @classmethod
    def plan_memory(cls, spec, num_steps: int, num_envs: int, *, layout=None, batch_sizes=(),
                    ring_size: int = 2) -> dict:
        """The bytes a buffer built with these arguments holds, by part, without building it.

        ``batch_sizes``: minibatch sizes (rows, ``num_steps * num_envs // n`` for
        ``minibatches(n)``) to be iterated, each adding an output ring of ``ring_size``
        minibatches. Returns the keys of :attr:`nbytes_parts`: ``storage`` (the rows, with
        ``advantage`` and ``return``), ``bookkeeping`` (the epoch permutation, int64 per row;
        last values and dones, float32 per env; the generator, 16 bytes) and
        ``output_rings``.
        """
        stored = _stored_spec(_check_spec(spec))
        T, E = cls._check_shape(num_steps, num_envs)
        ring_size = _check_int("ring_size", ring_size, 1)
        layout = resolve_layout(layout, stored)
        sizes = (batch_sizes,) if np.ndim(batch_sizes) == 0 else tuple(batch_sizes)
        rings = 0
        for b in sizes:
            b = _check_int("batch_sizes", b, 1, T * E)
            rings += ring_size * output_nbytes(stored, b, layout)
        return {"storage": storage_nbytes(stored, T * E, layout),
                "bookkeeping": 8 * T * E + 8 * E + 16, "output_rings": int(rings)}

    @property
    def nbytes_parts(self) -> dict:
        """Bytes this buffer holds, by part (the keys of :meth:`plan_memory`); the output rings
        of the minibatch sizes iterated so far."""
        book = self._perm.nbytes + self._last_values.nbytes + self._last_dones.nbytes + self._rng.nbytes
        return {"storage": int(self._storage.nbytes), "bookkeeping": int(book),
                "output_rings": int(sum(r.nbytes for r in self._rings.values()))}

    @property
    def nbytes(self) -> int:
        """Total of :attr:`nbytes_parts`: every byte of memory this buffer allocated."""
        return sum(self.nbytes_parts.values())

    # -- filling ----------------------------------------------------------------------------------
    @property
    def full(self) -> bool:
        """``num_steps`` steps have been added since the last :meth:`reset`."""
        return self._pos == self.num_steps

    @property
    def steps(self) -> int:
        """Steps added since the last :meth:`reset`."""
        return self._pos

    @property
    def computed(self) -> bool:
        """Advantages and returns are computed for the rows held."""
        return self._computed

    def __len__(self) -> int:
        """Rows held: ``steps * num_envs``."""
        return self._pos * self.num_envs

    def add(self, step: Mapping) -> None:
        """Add one vector-env step: row ``t * num_envs + e`` for each env ``e``.

        Parameters
        ----------
        step : Mapping
            Every field of :attr:`spec` (not ``advantage`` or ``return``), each an array of shape
            ``(num_envs, *field.shape)`` that casts safely into the field's dtype (the rules of
            :meth:`tfdata.Spec.check_batch`).

        Raises
        ------
        RuntimeError
            The rollout is full (call :meth:`reset` after using it).
        SpecError
            A missing or unknown field, a wrong shape or an unsafe dtype (named). Nothing is
            written.
        """
        T, E = self.num_steps, self.num_envs
        t = self._pos
        if t < T and self._fast_add(step, t):  # writes only what it has checked in full
            self._pos = t + 1
            return
        if t >= T:
            raise RuntimeError(f"RolloutBuffer.add: the rollout is full ({T} steps of {E} envs); "
                               f"call reset() to start the next one")
        try:
            n, values = self.spec.check_batch(step)
        except SpecError as exc:
            raise SpecError(f"RolloutBuffer.add: {str(exc).replace('extend: ', '').replace('extend ', 'add ')}") from None
        if n != E:
            raise SpecError(f"RolloutBuffer.add: expected {E} rows (one per env) in every field, "
                            f"got {n} (field {self.spec.names[0]!r} has shape "
                            f"{np.shape(values[0])})")
        # the user's fields come first in the stored spec: write_rows writes as many fields as
        # it is given values, so ``advantage`` and ``return`` are left alone
        self._storage.write_rows(self._pos * E, values, 0, E)
        self._pos += 1
        if type(step) is dict:
            self._learn_dtypes(step)

    def reset(self) -> None:
        """Start the next rollout: no steps held (rows are overwritten by the next :meth:`add`,
        not wiped; nothing is allocated). A running :meth:`minibatches` iterator stops."""
        self._pos = 0
        self._computed = False
        self._token += 1

    def field(self, name: str) -> np.ndarray:
        """View of field ``name`` of every row, shape ``(num_steps, num_envs, *field.shape)``
        (strided inside records for AoS and record groups). Rows of steps not yet added hold
        whatever the previous rollout left."""
        view = self._views.get(name) if type(name) is str else None
        if view is None:
            raise SpecError(f"RolloutBuffer.field: {self._stored.unknown_message(name)}")
        return view

    # -- GAE --------------------------------------------------------------------------------------
    def compute_returns_and_advantages(self, last_values, last_dones=None, *, gamma=0.99,
                                       gae_lambda=0.95) -> None:
        """Fill ``advantage`` and ``return`` of every row (one compiled call).

        Per row ``t`` of env ``e`` (the flags of the step that produced ``reward[t]``,
        gymnasium's): ``boot = 0`` if terminated, else ``final_value`` if truncated and the
        spec has ``final_value``, else 0 if truncated, else the next value (``value[t + 1, e]``,
        or ``last_values[e]`` at ``t = num_steps - 1``); ``delta = reward + gamma * boot -
        value``; ``adv = delta + gamma * gae_lambda * cont * lastgaelam`` with ``cont = 0`` if
        terminated or truncated, else 1; ``return = adv + value``. float32 arithmetic in
        CleanRL's order (``gamma * gae_lambda`` taken in double, then rounded): without a
        ``truncated`` field the results are bit for bit CleanRL's.

        Parameters
        ----------
        last_values : array_like of float, shape (num_envs,)
            The critic's value of the observation after the last step (any float dtype, numpy
            or anything with ``__array__`` such as a CPU torch tensor; rounded to float32).
            Must be finite.
        last_dones : array_like of bool or 0/1 numbers, shape (num_envs,), optional
            CleanRL's ``next_done``; if given it must equal ``terminated | truncated`` of the
            last step of each env.
        gamma, gae_lambda : float
            In ``[0, 1]``.

        Raises
        ------
        RuntimeError
            The rollout is not full.
        SpecError
            ``last_values`` / ``last_dones`` of the wrong shape or dtype, a non-finite last
            value, a done flag that is not 0/1 or disagrees with the rows (env named).
        TypeError, ValueError
            ``gamma`` or ``gae_lambda`` not a number in ``[0, 1]``.

        Nothing is changed by a refused call.
        """
        if self._pos != self.num_steps:
            raise RuntimeError(f"compute_returns_and_advantages: the rollout holds {self._pos} of "
                               f"{self.num_steps} steps; add them all first")
        # the discounts of the last call are kept as float32; Python floats equal to them skip
        # the checks (anything else, an array included, is checked in full)
        if (gamma.__class__ is not float or gae_lambda.__class__ is not float
                or gamma != self._gamma or gae_lambda != self._lambda):
            self._set_discounts(gamma, gae_lambda)
        lv = self._last_values
        if (type(last_values) is np.ndarray and last_values.shape == self._env_shape
                and last_values.dtype.kind == "f"):
            lv[...] = last_values
        else:
            lv[...] = _read_vector("last_values", last_values, self.num_envs, "f", "floats")
        ld, check = self._last_dones, last_dones is not None
        if check:
            ld[...] = _read_vector("last_dones", last_dones, self.num_envs, "biuf", "bools or 0/1 numbers")
        r, v, te, tr, fv, use_final = self._gae_in
        adv, ret = self._gae_out
        bad = self._k.gae(r, v, te, tr, fv, use_final, lv, ld, check, self._g32, self._gl32, adv, ret)
        if bad:
            self._refuse_gae(bad, last_values, last_dones)
        self._computed = True

    def _set_discounts(self, gamma, gae_lambda) -> None:
        g = _check_discount("gamma", gamma)
        lam = _check_discount("gae_lambda", gae_lambda)
        # CleanRL: ``args.gamma * nextvalues`` rounds gamma to float32; ``args.gamma *
        # args.gae_lambda * nextnonterminal`` multiplies in double first, then rounds
        self._g32, self._gl32 = np.float32(g), np.float32(g * lam)
        self._gamma, self._lambda = gamma, gae_lambda

    def _refuse_gae(self, bad: int, last_values, last_dones):
        E = self.num_envs
        kind, e = divmod(bad - 1, E)
        if kind == 0:
            raise SpecError(f"last_values: expected finite floats of shape ({E},), got "
                            f"{float(self._last_values[e])} for env {e}; nothing was computed")
        flags = "terminated | truncated" if "truncated" in self.spec else "terminated"
        if kind == 1:
            raise SpecError(f"last_dones: expected bools or 0/1 numbers of shape ({E},), got "
                            f"{float(self._last_dones[e])} for env {e}; nothing was computed")
        last = bool(self._gae_in[2][-1, e] or self._gae_in[3][-1, e])
        raise SpecError(f"last_dones: env {e}: expected {last} ({flags} of the last step added), "
                        f"got {bool(self._last_dones[e])}; the rows and the caller disagree about "
                        f"how the rollout ended; nothing was computed")

    # -- minibatches ------------------------------------------------------------------------------
    def minibatches(self, n: int, epochs: int = 1, seed=None):
        """Shuffled minibatches: each epoch a fresh permutation of all ``num_steps * num_envs``
        rows cut into ``n`` minibatches of ``num_steps * num_envs // n`` rows.

        Parameters
        ----------
        n : int
            Minibatches per epoch; must divide ``num_steps * num_envs``.
        epochs : int, default 1
        seed : int or None
            The permutations' generator: ``seed`` gives the same minibatches on every call and
            every layout (epoch ``k``'s permutation continues the stream of epoch ``k - 1``);
            None continues the buffer's own stream (``seed=`` of the constructor, in
            :meth:`state_dict`).

        Returns
        -------
        iterator of Batch
            ``epochs * n`` batches: ``batch[name]`` has shape ``(rows, *shape)`` for every name
            of :attr:`fields`; ``batch.indices`` (int64, ``(rows,)``) the row numbers
            ``t * num_envs + e``. Views into the buffer's output ring, valid until ``ring_size``
            more minibatches of this size have been yielded. The iterator stops with a
            RuntimeError if the buffer is reset, loaded or iterated again meanwhile.

        Raises
        ------
        RuntimeError
            Advantages not computed since the last :meth:`reset`.
        TypeError, ValueError
            ``n``, ``epochs`` or ``seed`` invalid, or ``n`` not dividing the rows.
        """
        N = self.num_steps * self.num_envs
        n = _check_int("n", n, 1, N)
        epochs = _check_int("epochs", epochs, 0)
        if N % n:
            raise ValueError(f"minibatches: n must divide the {N} rows ({self.num_steps} steps x "
                             f"{self.num_envs} envs), got {n}")
        key = None if seed is None else splitmix64(_check_seed(seed))
        if not self._computed:
            raise RuntimeError("minibatches: advantages and returns are not computed; call "
                               "compute_returns_and_advantages(last_values) on the full rollout first")
        m = N // n
        ring = self._rings.get(m)
        if ring is None:
            ring = self._rings[m] = OutputRing(self._storage, m, self.ring_size, None, (_RingPart,),
                                               self.fields)
        self._token += 1
        return self._epochs(ring, m, n, epochs, key, self._token)

    def _epochs(self, ring, m, n, epochs, key, token):
        perm, permute, take = self._perm, self._permutation, self._k.take
        gather = self._storage.gather
        slots, batches = ring.slots, ring.batches
        size = len(slots)
        own = key is None
        if own:
            state = self._rng
        else:
            state = np.array([key, 0], np.uint64)  # this iterator's own generator (16 bytes)
        for _ in range(epochs):
            if self._token != token:
                raise RuntimeError(self._stale_iterator)
            permute(state, perm)
            for b in range(n):
                if self._token != token:
                    raise RuntimeError(self._stale_iterator)
                i = ring.next
                out = slots[i]
                idx = out.indices
                take(perm, b * m, idx)
                gather(idx, out)
                ring.next = (i + 1) % size
                batch = batches[i]
                if getrefcount(batch) > UNHELD:  # the slot's previous batch is still held
                    batch = batches[i] = retire(batch)
                yield batch

    _stale_iterator = ("minibatches: this iterator was invalidated (the buffer was reset, loaded, "
                       "or minibatches() called again); start a new one")

    # -- state --------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything needed to continue: the spec, shape, steps held, whether advantages are
        computed, the generator and a copy of the rows held (one array per field, layout-neutral,
        ``(steps * num_envs, *shape)``, ``advantage`` and ``return`` included)."""
        rows = self._pos * self.num_envs
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "spec": self.spec.to_dict(),
                "num_steps": self.num_steps, "num_envs": self.num_envs, "steps": self._pos,
                "computed": self._computed,
                "rng": {"seed": self.seed, "counter": int(self._rng[1])},
                "data": self._storage.state_dict(rows)}

    def load_state_dict(self, state: Mapping) -> None:
        """Restore a :meth:`state_dict` (of any layout). The state is untrusted input: it is
        checked in full first (ValueError, TypeError or SpecError naming the key, the expected
        and the given), so a refused state changes nothing."""
        if not isinstance(state, Mapping):
            raise TypeError(f"state: expected a mapping, got {type(state).__name__}")
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"state['format']: expected {STATE_FORMAT!r}, got {_short(state.get('format'))}")
        if state.get("version") != STATE_VERSION or type(state.get("version")) is not int:
            raise ValueError(f"state['version']: expected {STATE_VERSION}, got {_short(state.get('version'))}")
        try:
            spec = Spec.from_dict(state["spec"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SpecError(f"state['spec']: not a spec ({_short(exc)})") from None
        if spec != self.spec:
            raise SpecError(f"state['spec']: expected this buffer's {self.spec}, got {spec}")
        for key, mine in (("num_steps", self.num_steps), ("num_envs", self.num_envs)):
            got = state.get(key)
            if type(got) is not int or got != mine:
                raise ValueError(f"state[{key!r}]: expected {mine}, got {_short(got)}")
        steps = state.get("steps")
        if type(steps) is not int or not 0 <= steps <= self.num_steps:
            raise ValueError(f"state['steps']: expected an int in [0, {self.num_steps}], got {_short(steps)}")
        computed = state.get("computed")
        if type(computed) is not bool or (computed and steps != self.num_steps):
            raise ValueError(f"state['computed']: expected a bool, True only for a full rollout "
                             f"({self.num_steps} steps), got {_short(computed)} with {steps} steps")
        rng = state.get("rng")
        if not isinstance(rng, Mapping) or set(rng) != {"seed", "counter"}:
            raise ValueError(f"state['rng']: expected {{'seed': int, 'counter': int}}, got {_short(rng)}")
        for key in ("seed", "counter"):
            x = rng[key]
            if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or not 0 <= int(x) <= MASK64:
                raise ValueError(f"state['rng'][{key!r}]: expected an int in [0, 2**64), got {_short(x)}")
        data = state.get("data")
        if not isinstance(data, Mapping):
            raise ValueError(f"state['data']: expected a mapping of field name to ndarray, got {_short(data)}")
        unknown = [k for k in data if k not in self._stored]
        if unknown:
            raise SpecError(f"state['data']: {self._stored.unknown_message(unknown[0])}")
        rows = steps * self.num_envs
        for f in self._stored:
            arr = data.get(f.name)
            if type(arr) is not np.ndarray or arr.dtype != f.dtype or arr.shape != (rows,) + f.shape:
                given = (f"{arr.dtype}{arr.shape}" if isinstance(arr, np.ndarray)
                         else "missing" if arr is None else type(arr).__name__)
                raise SpecError(f"state['data'][{f.name!r}]: expected {f.dtype}{(rows,) + f.shape}, "
                                f"got {given}")
        self._storage.load_state_dict(data, rows)
        self._pos, self._computed = steps, computed
        self.seed = int(rng["seed"])
        self._rng[0] = splitmix64(self.seed)
        self._rng[1] = int(rng["counter"])
        self._token += 1

    def __repr__(self) -> str:
        return (f"RolloutBuffer({self.num_steps} steps x {self.num_envs} envs, {self._pos} added, "
                f"computed={self._computed}, layout={self.layout!r}, fields={list(self.fields)})")


def _short(x) -> str:
    s = repr(x)
    return s if len(s) <= 100 else s[:97] + "..."


__all__ = ["RolloutBuffer"]
