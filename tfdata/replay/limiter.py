"""The sample-to-insert rate limiter: how far sampling may run ahead of inserting, and back.

In the spirit of Reverb's ``SampleToInsertRatio`` and ``MinSize`` (the same two conditions,
counted in rows). With ``I`` rows inserted and ``S`` rows sampled since the buffer was built
(or cleared), ``spi = samples_per_insert``, ``offset = spi * min_size_to_sample``,
``min_diff = offset - error_buffer`` and ``max_diff = offset + error_buffer``:

* a sample of ``B`` rows may proceed when ``I >= min_size_to_sample`` and
  ``I * spi - S - B >= min_diff`` (sampling would not run more than ``error_buffer`` samples
  ahead of the ratio);
* an insert of ``n`` rows may proceed when ``I + n <= min_size_to_sample`` (filling up to the
  minimum is free) or ``(I + n) * spi - S <= max_diff`` (inserting would not run more than
  ``error_buffer`` samples behind it).

So at every point, once ``min_size_to_sample`` rows are in, ``S`` stays within
``[I * spi - max_diff, I * spi - min_diff]``. ``error_buffer`` must be at least
``max(1, samples_per_insert)``, Reverb's condition: with less, a sample of one row and an
insert of one row could each wait for the other forever. Sampling ``B`` rows at a time while
``n`` rows at a time are inserted never deadlocks when ``B + n * spi <= 2 * error_buffer``.

How the buffers call it (under their lock; a wait releases the lock and the GIL), and how a
shared buffer evaluates the same predicates over shared counts (with ``W`` writers the insert
bound may be overshot by one write of each other writer): docs/design/rate-limiter.md.
"""

from __future__ import annotations

import math
import threading
import time
import weakref

from .._checks import check_float, check_int

#: counts are exact integers; a checkpoint may hold up to this many (2**63 - 1)
MAX_COUNT = (1 << 63) - 1


def counts_problem(inserts: int, samples: int, size: int, spi: float, min_size: int,
                   error_buffer) -> tuple | None:
    """Why counts of ``inserts`` and ``samples`` (ints in ``[0, MAX_COUNT]``) cannot be those of
    a limiter with these parameters that serves a buffer holding ``size`` rows: ``(field,
    expected)`` naming the count at fault and what it must be, or None when they can.

    What every sequence of allowed inserts and samples (and clears) keeps true, and so what is
    checked: ``inserts >= size``; ``samples == 0`` or ``inserts >= min_size_to_sample``; with an
    ``error_buffer``, ``inserts * spi - samples <= max_diff`` and, once something was sampled,
    ``>= min_diff`` (a few ulps of slack for the float rounding of the predicate). Counts outside
    these would make every insert (or every sample) wait for ever."""
    if inserts < size:
        return "inserts", f"an int >= {size}, the rows held (each was inserted)"
    if samples and inserts < min_size:
        return "samples", (f"0 while inserts ({inserts}) < min_size_to_sample ({min_size}): no "
                           f"sample runs before min_size_to_sample rows were inserted")
    if error_buffer is None:
        return None
    offset = spi * min_size
    min_diff, max_diff = offset - error_buffer, offset + error_buffer
    ahead = inserts * spi
    diff = ahead - samples
    if diff > max_diff:
        return "inserts", (f"at most {(samples + max_diff) / spi:.17g} with samples = {samples} "
                           f"(inserts * samples_per_insert - samples = {diff:.17g} is above "
                           f"samples_per_insert * min_size_to_sample + error_buffer = {max_diff:.17g}, "
                           f"which no insert passes: every insert would wait for ever)")
    slack = 4 * math.ulp(abs(ahead) + samples + abs(min_diff))
    if samples and diff < min_diff - slack:
        return "samples", (f"at most {ahead - min_diff:.17g} with inserts = {inserts} (inserts * "
                           f"samples_per_insert - samples = {diff:.17g} is below "
                           f"samples_per_insert * min_size_to_sample - error_buffer = "
                           f"{min_diff:.17g}, which no sample passes: every sample would wait "
                           f"for ever)")
    return None


def check_timeout(name: str, timeout):
    """``timeout`` as None (wait as long as it takes) or a finite float > 0."""
    if timeout is None:
        return None
    return check_float(name, timeout, 0.0, low_open=True)


class RateLimiter:
    """Keep the ratio of rows sampled to rows inserted near ``samples_per_insert``.

    Parameters
    ----------
    samples_per_insert : float
        The target ratio of rows sampled to rows inserted (``> 0``, finite): 8.0 with batches
        of 256 means one ``sample(256)`` per 32 rows pushed.
    min_size_to_sample : int
        Rows that must have been inserted before the first sample (``>= 1``); inserts up to
        this many never wait. At most the buffer's capacity (checked when a buffer takes it).
    error_buffer : float or None
        How many samples sampling may run ahead of (or behind) the ratio, ``>=
        max(1, samples_per_insert)``. None: no bound either way (what :meth:`min_size` builds).
    timeout : float, optional
        Seconds a ``sample`` or ``push``/``extend`` waits before raising the built-in
        TimeoutError (which changes nothing); None waits as long as it takes.

    Notes
    -----
    A limiter serves one buffer: a second buffer given the same limiter refuses it
    (ValueError). ``clear()`` of the buffer sets both counts to 0 (as Reverb's table reset
    does); the wait metrics are kept. The counts are part of the buffer's ``state_dict`` and
    checkpoints; the parameters of its ``config``.

    A call that can never proceed raises ValueError at once rather than waiting: a sample of
    more than ``2 * error_buffer`` rows, an insert of ``n`` rows that is not allowed now and
    with ``n * samples_per_insert > 2 * error_buffer`` (no sampling can make room for it).
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, error_buffer, *,
                 timeout: float | None = None):
        spi = check_float("samples_per_insert", samples_per_insert, 0.0, low_open=True)
        self.samples_per_insert = spi
        self.min_size_to_sample = check_int("min_size_to_sample", min_size_to_sample, 1, MAX_COUNT)
        if error_buffer is None:
            self.error_buffer = None
            self.min_diff, self.max_diff = -math.inf, math.inf
        else:
            eb = check_float("error_buffer", error_buffer, 0.0)
            if eb < max(1.0, spi):
                raise ValueError(f"error_buffer must be >= max(1, samples_per_insert) = "
                                 f"{max(1.0, spi)} (with less, a sample of one row and an insert "
                                 f"of one row could each wait for the other forever), got {eb}")
            self.error_buffer = eb
            offset = spi * self.min_size_to_sample
            self.min_diff, self.max_diff = offset - eb, offset + eb
        self.timeout = check_timeout("timeout", timeout)
        self.inserts = 0
        self.samples = 0
        self._metrics = dict(insert_waits=0, insert_wait_s=0.0, sample_waits=0, sample_wait_s=0.0,
                             timeouts=0)
        self._cond = None     # a Condition on the owning buffer's lock, once bound
        self._owner = None    # weak reference to that buffer
        self._waiting = 0     # threads in a wait: the counting calls notify only then

    @classmethod
    def min_size(cls, n: int, *, timeout: float | None = None) -> "RateLimiter":
        """A limiter that only makes sampling wait until ``n`` rows have been inserted
        (Reverb's ``MinSize``); inserts never wait."""
        return cls(1.0, n, None, timeout=timeout)

    # -- parameters ---------------------------------------------------------------------------
    def params(self) -> dict:
        """The constructor's arguments (plain JSON types), what a buffer's ``config`` records."""
        return {"samples_per_insert": self.samples_per_insert,
                "min_size_to_sample": self.min_size_to_sample,
                "error_buffer": self.error_buffer, "timeout": self.timeout}

    def __repr__(self) -> str:
        p = self.params()
        return (f"RateLimiter({p['samples_per_insert']}, {p['min_size_to_sample']}, "
                f"{p['error_buffer']}, timeout={p['timeout']}; inserts={self.inserts}, "
                f"samples={self.samples})")

    # -- predicates ---------------------------------------------------------------------------
    def can_sample(self, batch_size: int) -> bool:
        """Whether a sample of ``batch_size`` rows would proceed now (does not wait)."""
        return (self.inserts >= self.min_size_to_sample and self.inserts * self.samples_per_insert
                - self.samples - batch_size >= self.min_diff)

    def can_insert(self, n: int) -> bool:
        """Whether an insert of ``n`` rows would proceed now (does not wait)."""
        return (self.inserts + n <= self.min_size_to_sample
                or (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff)

    def check_sample(self, batch_size: int) -> None:
        """ValueError if a sample of ``batch_size`` rows could never proceed: inserts stop
        ``error_buffer`` samples behind the ratio, so sampling can run at most
        ``2 * error_buffer`` rows ahead of the point where it must stop."""
        if self.error_buffer is None:
            return
        most = max(self.inserts * self.samples_per_insert - self.samples, self.max_diff)
        if most - batch_size < self.min_diff:
            raise ValueError(f"batch_size {batch_size} can never be sampled under this rate limiter: "
                             f"a sample waits until it runs at most error_buffer = "
                             f"{self.error_buffer} samples ahead of the ratio, and inserts stop "
                             f"error_buffer samples behind it, so at most 2 * error_buffer = "
                             f"{2 * self.error_buffer} rows can be sampled at once")

    def check_insert(self, n: int) -> None:
        """ValueError if an insert of ``n`` rows could never proceed: it is not allowed now, and
        samples (which stop at ``min_diff``) cannot make room for ``n * samples_per_insert``."""
        if self.error_buffer is None or self.can_insert(n):
            return
        least = min(self.inserts * self.samples_per_insert - self.samples, self.min_diff)
        if least + n * self.samples_per_insert > self.max_diff:
            raise ValueError(f"an insert of {n} rows can never proceed under this rate limiter: "
                             f"{n} rows count n * samples_per_insert = "
                             f"{n * self.samples_per_insert} samples, more than sampling can make "
                             f"room for (2 * error_buffer = {2 * self.error_buffer}); insert at most "
                             f"{int(2 * self.error_buffer // self.samples_per_insert)} rows at a time")

    # -- the owning buffer's calls (under its lock) -------------------------------------------
    def bind(self, lock, owner, capacity: int) -> None:
        """Serve the buffer ``owner`` whose lock is ``lock`` (a ``threading.Lock``).

        Raises ValueError if another live buffer holds this limiter, or if
        ``min_size_to_sample`` exceeds ``capacity`` (sampling could never start)."""
        self.check_free(owner)
        if self.min_size_to_sample > capacity:
            raise ValueError(f"rate_limiter: min_size_to_sample must be <= capacity {capacity} "
                             f"(a buffer never holds more rows), got {self.min_size_to_sample}")
        self._owner = weakref.ref(owner)
        self._cond = threading.Condition(lock)

    def check_free(self, owner) -> None:
        """ValueError if a live buffer other than ``owner`` holds this limiter."""
        held = None if self._owner is None else self._owner()
        if held is not None and held is not owner:
            raise ValueError(f"rate_limiter: this RateLimiter already serves a "
                             f"{type(held).__name__}; a limiter counts one buffer's inserts and "
                             f"samples, so build one RateLimiter per buffer")

    def admit_insert(self, n: int) -> None:
        """:meth:`insert_wait` then :meth:`inserted`: for a write that cannot fail after it."""
        if not (self.inserts + n <= self.min_size_to_sample
                or (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff):
            self._wait("insert", n, None)
        self.inserts += n
        if self._waiting:
            self._cond.notify_all()

    def insert_wait(self, n: int) -> None:
        """Return when an insert of ``n`` rows may proceed (the lock is released while waiting).

        Raises ValueError if it never can, TimeoutError after ``timeout`` seconds."""
        if not (self.inserts + n <= self.min_size_to_sample
                or (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff):
            self._wait("insert", n, None)

    def inserted(self, n: int) -> None:
        """Count ``n`` rows written (under the lock, with the write)."""
        self.inserts += n
        if self._waiting:
            self._cond.notify_all()

    def sample_wait(self, batch_size: int, held=None, step: int = 1) -> None:
        """Return when a sample of ``batch_size`` rows may proceed and, if ``held`` is given
        (its ``size``: the rows a batch can draw from now), ``held.size >= batch_size``; the
        lock is released while waiting. ``step``: the fewest rows an insert writes (the
        buffer's ``num_envs``).

        Raises ValueError if it never can (at once, or as soon as the sample waits for rows
        while no insert of ``step`` rows may proceed: both would wait for ever), TimeoutError
        after ``timeout`` seconds."""
        if not (self.inserts >= self.min_size_to_sample
                and self.inserts * self.samples_per_insert - self.samples - batch_size >= self.min_diff
                and (held is None or held.size >= batch_size)):
            self._wait("sample", batch_size, held, step)

    def sampled(self, batch_size: int) -> None:
        """Count ``batch_size`` rows sampled (under the lock, with the sample)."""
        self.samples += batch_size
        if self._waiting:
            self._cond.notify_all()

    def reset(self) -> None:
        """Both counts to 0 (the buffer was cleared); waiting threads re-check."""
        self.inserts = self.samples = 0
        if self._waiting:
            self._cond.notify_all()

    def _wait(self, side: str, n: int, held=None, step: int = 1) -> None:
        if side == "sample":
            self.check_sample(n)

            def ok():
                if held is None:
                    return self.can_sample(n)
                have = held.size
                if have < n and not self.can_insert(step):
                    raise ValueError(self._stuck_message(n, have, step))
                return have >= n and self.can_sample(n)
        else:
            self.check_insert(n)

            def ok():
                return self.can_insert(n)
        if self._cond is None:
            raise RuntimeError("RateLimiter: waits need a buffer (rate_limiter= of a buffer)")
        t0 = time.monotonic()
        deadline = None if self.timeout is None else t0 + self.timeout
        self._metrics[side + "_waits"] += 1
        self._waiting += 1
        try:
            while not ok():
                if deadline is None:
                    self._cond.wait()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    self._metrics["timeouts"] += 1
                    raise TimeoutError(self._timeout_message(side, n))
                self._cond.wait(left)
        finally:
            self._waiting -= 1
            self._metrics[side + "_wait_s"] += time.monotonic() - t0

    def _stuck_message(self, n: int, have: int, step: int) -> str:
        return (f"rate limiter: a sample of {n} rows waits for rows ({have} can be drawn now), "
                f"and an insert of {step} rows waits for samples (inserts={self.inserts}, "
                f"samples={self.samples}, samples_per_insert={self.samples_per_insert}, "
                f"min_size_to_sample={self.min_size_to_sample}, error_buffer="
                f"{self.error_buffer}): neither can proceed, so nothing was sampled; sample "
                f"smaller batches, or raise min_size_to_sample or error_buffer")

    def _timeout_message(self, side: str, n: int) -> str:
        what = f"a sample of {n} rows" if side == "sample" else f"an insert of {n} rows"
        ratio = self.samples / self.inserts if self.inserts else math.inf
        return (f"rate limiter: {what} waited {self.timeout} s (timeout) without being allowed: "
                f"inserts={self.inserts}, samples={self.samples}, samples/inserts={ratio:.4g}, "
                f"samples_per_insert={self.samples_per_insert}, min_size_to_sample="
                f"{self.min_size_to_sample}, error_buffer={self.error_buffer}; nothing was "
                + ("sampled" if side == "sample" else "written"))

    def record_wait(self, side: str, seconds: float, timed_out: bool = False) -> None:
        """Count one ``side`` (``"insert"`` or ``"sample"``) call that waited ``seconds`` (and
        raised TimeoutError if ``timed_out``): the metrics of a wait done elsewhere (a shared
        buffer's writers and learner poll shared memory instead of waiting here)."""
        self._metrics[side + "_waits"] += 1
        self._metrics[side + "_wait_s"] += seconds
        if timed_out:
            self._metrics["timeouts"] += 1

    def timeout_message(self, side: str, n: int, waited: float) -> str:
        """The TimeoutError message of a ``side`` call of ``n`` rows that waited ``waited`` s."""
        return self._timeout_message(side, n).replace(f"waited {self.timeout} s",
                                                      f"waited {waited:.3g} s")

    # -- metrics and state --------------------------------------------------------------------
    def metrics(self) -> dict:
        """Counts and waits so far: ``inserts``, ``samples`` (rows), ``insert_waits`` and
        ``sample_waits`` (calls that waited), ``insert_wait_s`` and ``sample_wait_s`` (seconds
        waited in all), ``timeouts`` (waits that raised TimeoutError). Read under the owning
        buffer's lock: the counts are those of one moment, between two writes or samples."""
        if self._cond is None:
            return {"inserts": self.inserts, "samples": self.samples, **self._metrics}
        with self._cond:
            return {"inserts": self.inserts, "samples": self.samples, **self._metrics}

    def state_dict(self) -> dict:
        """The counts, ``{"inserts": int, "samples": int}`` (what a checkpoint keeps)."""
        return {"inserts": self.inserts, "samples": self.samples}

    def check_state(self, state, size: int) -> dict:
        """``state`` (from :meth:`state_dict`) checked for a buffer holding ``size`` rows: two
        ints in ``[0, 2**63 - 1]`` these parameters can reach (:func:`counts_problem`).
        ValueError naming the field, the value and what it must be."""
        if not isinstance(state, dict) or set(state) != {"inserts", "samples"}:
            raise ValueError(f"rate_limiter state: expected a dict with keys 'inserts' and "
                             f"'samples', got {state!r:.200}")
        out = {}
        for k in ("inserts", "samples"):
            v = state[k]
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_COUNT:
                raise ValueError(f"rate_limiter state: {k} must be an int in [0, {MAX_COUNT}], "
                                 f"got {v!r:.100}")
            out[k] = int(v)
        problem = counts_problem(out["inserts"], out["samples"], size, self.samples_per_insert,
                                 self.min_size_to_sample, self.error_buffer)
        if problem is not None:
            k, want = problem
            if k == "inserts" and out["inserts"] < size:  # (the message older callers match)
                raise ValueError(f"rate_limiter state: inserts must be >= the {size} rows held, "
                                 f"got {out['inserts']}")
            raise ValueError(f"rate_limiter state: {k} = {out[k]}: expected {want}")
        return out

    def load_state_dict(self, state) -> None:
        """Set the counts from a :meth:`state_dict`, checked first by :meth:`check_state`
        against the rows its buffer holds (ValueError naming the field, nothing changed);
        under the owning buffer's lock if it has one."""
        held = None if self._owner is None else self._owner()
        if self._cond is None or held is None:
            counts = self.check_state(state, 0)
            self.load_state(counts)
            return
        with self._cond:
            self.load_state(self.check_state(state, len(held)))

    def load_state(self, state: dict) -> None:
        """Set the counts from a :meth:`check_state` result (under the owner's lock)."""
        self.inserts, self.samples = state["inserts"], state["samples"]
        if self._waiting:
            self._cond.notify_all()


# -- checkpoints: config.rate_limiter and state.rate_limiter, read as untrusted input (``c``: the
# checkpoint's checker of JSON values)
#: the parameters of a limiter, as :meth:`RateLimiter.params` gives them
PARAMS = ("samples_per_insert", "min_size_to_sample", "error_buffer", "timeout")


def read_config(c, v, cap: int) -> None:
    """``config.rate_limiter``: the parameters of a :class:`tfdata.RateLimiter`."""
    w = "config.rate_limiter"
    c.obj(w, v, PARAMS)
    spi = c.real(w + ".samples_per_insert", v["samples_per_insert"], 0.0, 1e12, lo_open=True)
    c.integer(w + ".min_size_to_sample", v["min_size_to_sample"], 1, cap)
    if v["error_buffer"] is not None:
        c.real(w + ".error_buffer", v["error_buffer"], max(1.0, spi), 1e18)
    if v["timeout"] is not None:
        c.real(w + ".timeout", v["timeout"], 0.0, 1e9, lo_open=True)


def read_state(c, v, size: int, params: dict | None = None) -> dict:
    """``state.rate_limiter``: the counts, ints in ``[0, 2**63 - 1]``, inserts >= size; with
    the limiter's ``params`` (``config.rate_limiter``, checked), counts those parameters can
    reach (:func:`counts_problem`)."""
    w = "state.rate_limiter"
    c.obj(w, v, ("inserts", "samples"))
    c.integer(w + ".inserts", v["inserts"], size, (1 << 63) - 1)
    c.integer(w + ".samples", v["samples"], 0, (1 << 63) - 1)
    if params is not None:
        problem = counts_problem(v["inserts"], v["samples"], size, params["samples_per_insert"],
                                 params["min_size_to_sample"], params["error_buffer"])
        if problem is not None:
            c.fail(f"{w}.{problem[0]}", problem[1], v[problem[0]])
    return {"inserts": v["inserts"], "samples": v["samples"]}
