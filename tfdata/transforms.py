"""Transforms on sample: functions applied to every batch as part of sampling.

``ReplayBuffer(spec, capacity, transforms=[...])`` (and :class:`~tfdata.PrioritizedReplayBuffer`)
applies the list in order to each batch, under the buffer's lock, after the gather and the
buffer's own transforms (n-step returns, elided next fields, frame stacks). A transform reads
the batch's field arrays and writes them in place, or writes arrays of its own that the output
ring holds (allocated once, when the ring of a batch shape is built: sampling allocates
nothing) and that the batch then shows instead:

:class:`Normalize`
    ``(x - mean) * (1 / sqrt(var + eps))`` from the running statistics of the rows held
    (``stats=``); the batch's field becomes float32.
:class:`ScaleReward`, :class:`ClipReward`
    The reward (its role, see ``roles=``) scaled, or clipped, in place.
:class:`RandomShift`
    DrQ's random shift of images, channels first (``(..., H, W)``), with its own counter RNG.
:class:`Cast`
    A field as another dtype, optionally times ``scale`` (uint8 frames to float32 / 255).
:class:`Compiled`
    A numba function of yours (``@numba.njit(nogil=True)``), called without the GIL.
:class:`Function`
    A Python callable of yours (holds the GIL; for what speed does not matter).

Each is a *description* (its parameters, checked against the buffer's spec when the buffer is
built) whose :meth:`~SampleTransform.bind` gives the *part* a sample path runs: the ring part
of :mod:`tfdata.replay.transforms` (``ring_arrays``, ``batch_view``, ``project``, ``apply``),
over the field arrays of a batch given as a dict, so any output ring can run them. A buffer's
``config`` and checkpoint record each by name and parameters, a user function by its import
path (``module:qualname``); ``load(path, transforms=[fn, ...])`` resolves the recorded paths
only among the functions given (a checkpoint never makes tfdata import or call anything else).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from functools import partial

import numpy as np

from ._rng import MASK64, splitmix64
from .errors import FormatError, SpecError

__all__ = ["SampleTransform", "Normalize", "ScaleReward", "ClipReward", "RandomShift", "Cast",
           "Compiled", "Function", "Context", "check_transforms", "from_config", "import_path"]


class Context:
    """What transforms are checked against and bound to.

    Parameters
    ----------
    spec : Spec
        The fields of a batch (full shapes: a frame-stacked field's stack).
    roles : dict
        ``{role: field}`` (``reward``, ``terminated``, ``truncated``).
    stats_fields : tuple of str
        The fields whose running statistics are kept.
    stacked : tuple of str
        Frame-stacked fields (their statistics are of one frame).
    stats : optional
        The running statistics (:class:`tfdata.replay.columns.RunningStats`: ``sync()`` and
        ``tree(name)``); None when only checking.
    allocator : optional
        Allocates the ring arrays (``zeros(shape, dtype)``); None when only checking.
    no_stats : str, optional
        Why this kind of buffer keeps no running statistics at all (``Normalize`` is then
        refused with NotImplementedError giving this reason); None: it keeps those of
        ``stats_fields``.
    """

    def __init__(self, spec, roles, stats_fields=(), stacked=(), stats=None, allocator=None,
                 no_stats=None):
        self.spec, self.roles, self.stats_fields, self.stacked = spec, dict(roles), tuple(stats_fields), tuple(stacked)
        self.stats, self.allocator, self.no_stats = stats, allocator, no_stats


def import_path(fn) -> str | None:
    """``module:qualname`` of ``fn`` (of its Python function, for a numba dispatcher), or None
    when it has none that an import could find (a lambda, a local function)."""
    py = getattr(fn, "py_func", fn)
    mod, qual = getattr(py, "__module__", None), getattr(py, "__qualname__", None)
    if not isinstance(mod, str) or not isinstance(qual, str) or "<" in qual:
        return None
    return f"{mod}:{qual}"


def _field(spec, who: str, name):
    if not isinstance(name, str) or name not in spec:
        raise SpecError(f"{who}: {spec.unknown_message(name)}")
    return spec[name]


def _rows2d(a: np.ndarray, rows: int) -> np.ndarray:
    """``a`` (``(rows, *shape)``) as a ``(rows, k)`` view: never a copy."""
    return np.reshape(a, (rows, -1), copy=False)


class SampleTransform:
    """A transform's description (see the module). Subclasses set ``name`` and ``fields``."""

    name = ""
    #: the batch fields it reads or writes (a projection holding none of them skips it)
    fields: tuple = ()

    def config(self) -> dict:
        raise NotImplementedError

    def check(self, ctx: Context) -> None:
        """SpecError, TypeError or ValueError naming the transform, the field and the option."""

    def ring_nbytes(self, ctx: Context, rows: int, fields=None) -> int:
        """Bytes of the arrays it adds to one ring slot of ``rows`` rows (``fields``: a
        projection's)."""
        return 0

    def unsaved_reason(self) -> str | None:
        """Why a checkpoint could not record it (None: it can)."""
        return None

    def bind(self, ctx: Context) -> "Part":
        raise NotImplementedError

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "name")
        return f"{type(self).__name__}({inner})"


class Part:
    """A bound transform, the ring part the sample path runs (contract:
    :mod:`tfdata.replay.transforms`); it reads and writes only the batch's field arrays, which
    :meth:`batch_view` is given (the fields as the parts before it left them)."""

    #: applied to :meth:`~tfdata.ReplayBuffer.sample_sequences` batches too: per step
    on_slices = True

    def __init__(self, desc: SampleTransform, ctx: Context):
        self.desc, self.ctx, self.fields = desc, ctx, desc.fields
        from . import kernels

        self.k = kernels

    def project(self, names) -> "Part":
        """Itself when the projection ``names`` holds all its fields, a part that does nothing
        when it holds none; ValueError (before any allocation) when it holds some."""
        have = [f for f in self.fields if f in names]
        if len(have) == len(self.fields):
            return self
        if not have:
            return _Skip()
        missing = [f for f in self.fields if f not in names]
        raise ValueError(f"fields={list(names)}: transform {self.desc!r} needs the fields "
                         f"{missing} as well; sample them too, or none of {list(self.fields)}")

    def ring_arrays(self, batch_size: int, length, out) -> dict:
        return {}

    def batch_view(self, arrays: dict, fields: dict, attrs: dict) -> None:
        pass

    def apply(self, out, arrays: dict, rows, where):
        return rows

    # stateless by default
    def state_dict(self):
        return None

    def check_state(self, state):
        if state is not None:
            raise ValueError(f"transform {self.desc.name!r} keeps no state, got {type(state).__name__}")
        return None

    def load_state(self, state) -> None:
        pass


class _Skip(Part):
    """A transform none of whose fields a projection holds."""

    def __init__(self):
        pass


# -- built-ins ------------------------------------------------------------------------------


class Normalize(SampleTransform):
    """``(x - mean) * (1 / sqrt(var + eps))``, optionally clipped to ``[-clip, clip]``, from
    the running statistics of the rows held when the batch is sampled.

    Computed in float64 and rounded once to float32: the reciprocal ``1 / sqrt(var + eps)``
    once per element, then a product per value. :meth:`tfdata.replay.columns.FieldStats.normalize`
    divides instead, ``(x - mean) / sqrt(var + eps)``: the two float64 values differ by at most
    an ulp or two of float64, so the float32 results are equal except for a value within that
    distance of a float32 rounding boundary (one ulp of float32 apart there).

    Parameters
    ----------
    field : str
        The batch's field; the batch then shows it as float32, shape unchanged. A NaN stays
        NaN.
    eps : float, default 1e-8
        Added to the variance (a constant element becomes 0, not NaN).
    clip : float, optional
        ``> 0``.
    stats_of : str, optional
        The field whose statistics are used (default ``field``): e.g. ``"obs"``'s for
        ``"next_obs"``; of the same shape. It must be one of the buffer's ``stats=``.
    """

    name = "normalize"

    def __init__(self, field: str, *, eps: float = 1e-8, clip: float | None = None,
                 stats_of: str | None = None):
        if not isinstance(field, str):
            raise TypeError(f"Normalize: field must be a str, got {type(field).__name__}")
        eps = _real("Normalize", "eps", eps)
        if not eps >= 0:
            raise ValueError(f"Normalize: eps must be >= 0, got {eps}")
        if clip is not None:
            clip = _real("Normalize", "clip", clip)
            if not clip > 0:
                raise ValueError(f"Normalize: clip must be > 0 or None, got {clip}")
        if stats_of is not None and not isinstance(stats_of, str):
            raise TypeError(f"Normalize: stats_of must be a str or None, got {type(stats_of).__name__}")
        self.field, self.eps, self.clip = field, eps, clip
        self.stats_of = field if stats_of is None else stats_of
        self.fields = (field,)

    def config(self) -> dict:
        return {"name": self.name, "field": self.field, "eps": self.eps, "clip": self.clip,
                "stats_of": self.stats_of}

    def check(self, ctx: Context) -> None:
        f = _field(ctx.spec, "Normalize", self.field)
        s = _field(ctx.spec, "Normalize(stats_of=)", self.stats_of)
        if ctx.no_stats is not None:
            raise NotImplementedError(f"transforms=[Normalize({self.field!r})]: {ctx.no_stats}; "
                                      f"normalize the batch after sample instead")
        if self.stats_of not in ctx.stats_fields:
            raise SpecError(f"Normalize({self.field!r}): field {self.stats_of!r} has no running "
                            f"statistics; build the buffer with stats=[{self.stats_of!r}] "
                            f"(it keeps {list(ctx.stats_fields)})")
        if self.stats_of in ctx.stacked or self.field in ctx.stacked:
            raise NotImplementedError(f"Normalize({self.field!r}): a frame-stacked field's "
                                      f"statistics are of one frame, not of its stack")
        if f.dtype.kind not in "biuf" or f.shape != s.shape:
            raise SpecError(f"Normalize({self.field!r}): expected a numeric field of the shape of "
                            f"{self.stats_of!r} {list(s.shape)}, got {f.dtype}{list(f.shape)}")

    def ring_nbytes(self, ctx, rows, fields=None) -> int:
        if fields is not None and self.field not in fields:
            return 0
        return rows * _elems(ctx.spec[self.field]) * 4

    def bind(self, ctx):
        return _NormalizePart(self, ctx)


class _NormalizePart(Part):
    def __init__(self, desc, ctx):
        super().__init__(desc, ctx)
        self.sync = ctx.stats.sync  # the statistics of the rows held now (cheap when current)
        self.tree = ctx.stats.tree(desc.stats_of)  # (cnt, vals, moments), updated in place

    def ring_arrays(self, batch_size, length, out) -> dict:
        f = self.ctx.spec[self.desc.field]
        return {"out": self.ctx.allocator.zeros((batch_size * (length or 1),) + f.shape, np.float32)}

    def batch_view(self, arrays, fields, attrs) -> None:
        d, dst = self.desc, arrays["out"]
        rows = dst.shape[0]
        cnt, vals, moments = self.tree
        args = (_rows2d(fields[d.field], rows), cnt, vals, moments, float(d.eps),
                d.clip is not None, float(d.clip or 0.0), _rows2d(dst, rows))
        # the call bound once, with its arguments: the sample path makes it without unpacking
        arrays["call"] = partial(self.k.strided(self.k.normalize, args), *args)
        fields[d.field] = dst

    def apply(self, out, arrays, rows, where):
        self.sync()
        arrays["call"]()
        return rows


class ScaleReward(SampleTransform):
    """The reward times ``scale``, in place (the product in float64, rounded once to the
    reward's dtype).

    Parameters
    ----------
    scale : float
        Finite.
    """

    name = "scale_reward"

    def __init__(self, scale: float):
        self.scale = _real("ScaleReward", "scale", scale)
        if not math.isfinite(self.scale):
            raise ValueError(f"ScaleReward: scale must be finite, got {self.scale}")
        self.fields = ()

    def config(self) -> dict:
        return {"name": self.name, "scale": self.scale}

    def check(self, ctx) -> None:
        _reward(ctx, type(self).__name__)

    def bind(self, ctx):
        return _RewardPart(self, ctx, self.scale, False, 0.0, 0.0)


class ClipReward(SampleTransform):
    """The reward clipped to ``[low, high]``, in place. A NaN stays NaN.

    Parameters
    ----------
    low, high : float
        ``low <= high``.
    """

    name = "clip_reward"

    def __init__(self, low: float, high: float):
        self.low, self.high = _real("ClipReward", "low", low), _real("ClipReward", "high", high)
        if not self.low <= self.high:
            raise ValueError(f"ClipReward: expected low <= high, got low={self.low}, high={self.high}")
        self.fields = ()

    def config(self) -> dict:
        return {"name": self.name, "low": self.low, "high": self.high}

    def check(self, ctx) -> None:
        _reward(ctx, type(self).__name__)

    def bind(self, ctx):
        return _RewardPart(self, ctx, 1.0, True, self.low, self.high)


def _reward(ctx, who: str) -> str:
    name = ctx.roles.get("reward")
    if name is None:
        raise SpecError(f"{who}: the spec has no reward field (name it with roles="
                        f"{{'reward': ...}}); fields: {list(ctx.spec.names)}")
    f = ctx.spec[name]
    if f.shape or f.dtype.kind != "f":
        raise SpecError(f"{who}: the reward field {name!r} must be a float scalar, got "
                        f"{f.dtype}{list(f.shape)}")
    return name


class _RewardPart(Part):
    def __init__(self, desc, ctx, scale, has_clip, low, high):
        super().__init__(desc, ctx)
        self.fields = (_reward(ctx, type(desc).__name__),)
        self.params = (float(scale), bool(has_clip), float(low), float(high))

    def batch_view(self, arrays, fields, attrs) -> None:
        x = fields[self.fields[0]]
        args = (x,) + self.params
        arrays["call"] = (self.k.strided(self.k.scale_clip, args), args)

    def apply(self, out, arrays, rows, where):
        kernel, args = arrays["call"]
        kernel(*args)
        return rows


class RandomShift(SampleTransform):
    """DrQ's random shift (Kostrikov et al., 2020) of image observations.

    Each row's image is padded by ``pad`` copies of its edge pixels on every side, then cropped
    back to its size at an offset drawn uniformly from ``[0, 2 * pad]`` along each axis: one
    offset per batch row (per step of a :meth:`~tfdata.ReplayBuffer.sample_sequences` slice),
    the same for all its channels or stacked frames.

    Images are **channels first**: the field's last two axes are height and width (``(H, W)``,
    ``(C, H, W)``, a frame stack ``(K, H, W)``, ...), any dtype (uint8 frames stay uint8). An
    ``(H, W, C)`` field would be shifted along W and C: give it channels first.

    Parameters
    ----------
    field : str
    pad : int, default 4
        ``0 <= pad <= 255``.
    seed : int, optional
        Of its own counter RNG (``[key, counter]``, saved in the buffer's state: batches after a
        checkpoint load, and in any layout, are the same bit for bit). None: drawn from the OS
        and recorded in the state.
    """

    name = "random_shift"

    def __init__(self, field: str, pad: int = 4, *, seed: int | None = None):
        if not isinstance(field, str):
            raise TypeError(f"RandomShift: field must be a str, got {type(field).__name__}")
        if isinstance(pad, bool) or not isinstance(pad, (int, np.integer)) or not 0 <= pad <= 255:
            raise ValueError(f"RandomShift: pad must be an int in [0, 255], got {pad!r:.50}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise TypeError(f"RandomShift: seed must be an int or None, got {type(seed).__name__}")
        self.field, self.pad, self.seed = field, int(pad), seed
        self.fields = (field,)

    def config(self) -> dict:
        return {"name": self.name, "field": self.field, "pad": self.pad}

    def check(self, ctx) -> None:
        f = _field(ctx.spec, "RandomShift", self.field)
        if len(f.shape) < 2:
            raise SpecError(f"RandomShift({self.field!r}): expected an image field (..., H, W), "
                            f"got shape {list(f.shape)}")

    def ring_nbytes(self, ctx, rows, fields=None) -> int:
        if fields is not None and self.field not in fields:
            return 0
        return rows * ctx.spec[self.field].nbytes

    def bind(self, ctx):
        return _ShiftPart(self, ctx)


class _ShiftPart(Part):
    def __init__(self, desc, ctx):
        super().__init__(desc, ctx)
        seed = secrets.randbits(63) if desc.seed is None else desc.seed
        self.seed = int(seed) & MASK64
        self.state = np.array([splitmix64(self.seed), 0], np.uint64)  # [key, counter]

    def ring_arrays(self, batch_size, length, out) -> dict:
        f = self.ctx.spec[self.desc.field]
        return {"out": self.ctx.allocator.zeros((batch_size * (length or 1),) + f.shape, f.dtype)}

    def batch_view(self, arrays, fields, attrs) -> None:
        dst = arrays["out"]
        rows, (h, w) = dst.shape[0], dst.shape[-2:]
        four = (rows, -1, h, w)
        args = (np.reshape(fields[self.desc.field], four, copy=False), self.desc.pad, self.state,
                np.reshape(dst, four, copy=False))
        arrays["call"] = (self.k.strided(self.k.random_shift, args), args)
        fields[self.desc.field] = dst

    def apply(self, out, arrays, rows, where):
        kernel, args = arrays["call"]
        kernel(*args)
        return rows

    def state_dict(self):
        return {"seed": self.seed, "counter": int(self.state[1])}

    def check_state(self, state):
        if (not isinstance(state, Mapping) or set(state) != {"seed", "counter"}
                or any(isinstance(state[k], bool) or not isinstance(state[k], (int, np.integer))
                       or not 0 <= int(state[k]) <= MASK64 for k in ("seed", "counter"))):
            raise ValueError(f"transform {self.desc!r}: state must be {{'seed', 'counter'}}, "
                             f"two ints in [0, 2**64), got {state!r:.100}")
        return int(state["seed"]), int(state["counter"])

    def load_state(self, state) -> None:
        seed, counter = state
        self.seed = seed
        self.state[0] = splitmix64(seed)
        self.state[1] = counter


class Cast(SampleTransform):
    """A field as ``dtype``: ``x * scale`` computed in float64 and rounded once, or without
    ``scale`` a safe cast (numpy's ``can_cast(..., "safe")``).

    Parameters
    ----------
    field : str
    dtype : dtype-like
        float32 or float64 with ``scale``; without, any dtype the field casts to safely.
    scale : float, optional
        E.g. ``1 / 255`` for uint8 frames.
    """

    name = "cast"

    def __init__(self, field: str, dtype, scale: float | None = None):
        if not isinstance(field, str):
            raise TypeError(f"Cast: field must be a str, got {type(field).__name__}")
        self.field, self.dtype = field, np.dtype(dtype)
        if self.dtype.kind not in "biuf":
            raise ValueError(f"Cast({field!r}): dtype must be numeric, got {self.dtype}")
        self.scale = None if scale is None else _real("Cast", "scale", scale)
        if self.scale is not None and self.dtype not in (np.float32, np.float64):
            raise ValueError(f"Cast({field!r}): scale needs dtype float32 or float64, got {self.dtype}")
        self.fields = (field,)

    def config(self) -> dict:
        return {"name": self.name, "field": self.field, "dtype": self.dtype.str, "scale": self.scale}

    def check(self, ctx) -> None:
        f = _field(ctx.spec, "Cast", self.field)
        if f.dtype.kind not in "biuf":
            raise SpecError(f"Cast({self.field!r}): the field's dtype {f.dtype} is not numeric")
        if self.scale is None and not np.can_cast(f.dtype, self.dtype, "safe"):
            raise SpecError(f"Cast({self.field!r}): {f.dtype} does not cast safely to {self.dtype}; "
                            f"give scale= (1.0 for a plain conversion to float)")

    def ring_nbytes(self, ctx, rows, fields=None) -> int:
        if fields is not None and self.field not in fields:
            return 0
        return rows * _elems(ctx.spec[self.field]) * self.dtype.itemsize

    def bind(self, ctx):
        return _CastPart(self, ctx)


class _CastPart(Part):
    def ring_arrays(self, batch_size, length, out) -> dict:
        f = self.ctx.spec[self.desc.field]
        return {"out": self.ctx.allocator.zeros((batch_size * (length or 1),) + f.shape,
                                                 self.desc.dtype)}

    def batch_view(self, arrays, fields, attrs) -> None:
        d, dst = self.desc, arrays["out"]
        rows = dst.shape[0]
        args = (_rows2d(fields[d.field], rows), d.scale is not None, float(d.scale or 1.0),
                _rows2d(dst, rows))
        arrays["call"] = (self.k.strided(self.k.cast, args), args)
        fields[d.field] = dst

    def apply(self, out, arrays, rows, where):
        kernel, args = arrays["call"]
        kernel(*args)
        return rows


# -- user functions -------------------------------------------------------------------------


class Compiled(SampleTransform):
    """A numba function of yours, called on the batch without the GIL.

    ``fn(*inputs, *outputs)``: ``inputs`` the batch's arrays of ``fields`` (shape
    ``(rows, *shape)``, in the layout's stride: a field inside records is a strided view),
    which it may modify in place; ``outputs`` arrays of ``outputs``' dtypes and the shapes of
    those fields, allocated once with the ring, which the batch then shows instead. Its return
    value is ignored.

    Parameters
    ----------
    fn : numba dispatcher
        ``@numba.njit(nogil=True)`` (``cache=True`` recommended: it is called from Python,
        right after the gather, so its own cache is the one that matters).
    fields : sequence of str
    outputs : dict, optional
        ``{field: dtype}``, fields among ``fields``.
    """

    name = "compiled"

    def __init__(self, fn, fields, outputs=None):
        if not callable(getattr(fn, "py_func", None)) or not hasattr(fn, "targetoptions"):
            raise TypeError(f"Compiled: fn must be a numba function (@numba.njit(nogil=True)), "
                            f"got {fn!r:.100}; use Function for a Python callable")
        if not fn.targetoptions.get("nogil"):
            raise ValueError(f"Compiled: {import_path(fn) or fn!r:.100} was compiled without "
                             f"nogil=True; decorate it with @numba.njit(nogil=True) so that "
                             f"sampling does not hold the GIL while it runs")
        self.fn, self.fields = fn, _names("Compiled", fields)
        outputs = {} if outputs is None else dict(outputs)
        self.outputs = {}
        for name, dt in outputs.items():
            if name not in self.fields:
                raise ValueError(f"Compiled: output {name!r} is not among fields {list(self.fields)}")
            self.outputs[name] = np.dtype(dt)

    def config(self) -> dict:
        return {"name": self.name, "fn": import_path(self.fn), "fields": list(self.fields),
                "outputs": {k: v.str for k, v in self.outputs.items()}}

    def unsaved_reason(self):
        return _unsaved(self.fn)

    def check(self, ctx) -> None:
        for n in self.fields:
            _field(ctx.spec, "Compiled", n)

    def ring_nbytes(self, ctx, rows, fields=None) -> int:
        if fields is not None and not all(n in fields for n in self.fields):
            return 0
        return sum(rows * _elems(ctx.spec[n]) * dt.itemsize for n, dt in self.outputs.items())

    def bind(self, ctx):
        return _CompiledPart(self, ctx)


class _CompiledPart(Part):
    def ring_arrays(self, batch_size, length, out) -> dict:
        rows = batch_size * (length or 1)
        return {"out:" + n: self.ctx.allocator.zeros((rows,) + self.ctx.spec[n].shape, dt)
                for n, dt in self.desc.outputs.items()}

    def batch_view(self, arrays, fields, attrs) -> None:
        d = self.desc
        args = tuple(fields[n] for n in d.fields) + tuple(arrays["out:" + n] for n in d.outputs)
        for n in d.outputs:
            fields[n] = arrays["out:" + n]
        arrays["call"] = (d.fn, args)

    def apply(self, out, arrays, rows, where):
        fn, args = arrays["call"]
        fn(*args)
        return rows


class Function(SampleTransform):
    """A Python callable of yours, called on the batch (holding the GIL: for what speed does not
    matter).

    ``fn(fields)``: ``fields`` a new dict of the batch's arrays (of ``fields``, or every field
    of the batch), which it may modify in place; it returns None, or a mapping of some of those
    names to arrays of the same shapes, copied into the batch (cast as numpy's ``same_kind``).

    Parameters
    ----------
    fn : callable
    fields : sequence of str, optional
    """

    name = "function"

    def __init__(self, fn, fields=None):
        if not callable(fn):
            raise TypeError(f"Function: fn must be callable, got {type(fn).__name__}")
        self.fn = fn
        self.names = None if fields is None else _names("Function", fields)
        self.fields = () if fields is None else self.names

    def config(self) -> dict:
        return {"name": self.name, "fn": import_path(self.fn),
                "fields": None if self.names is None else list(self.names)}

    def unsaved_reason(self):
        return _unsaved(self.fn)

    def check(self, ctx) -> None:
        for n in self.fields:
            _field(ctx.spec, "Function", n)

    def bind(self, ctx):
        return _FunctionPart(self, ctx)


class _FunctionPart(Part):
    def batch_view(self, arrays, fields, attrs) -> None:
        names = self.desc.names
        arrays["fields"] = [(n, fields[n]) for n in (fields if names is None else names)]

    def apply(self, out, arrays, rows, where):
        given = dict(arrays["fields"])
        got = self.desc.fn(given)
        if got is not None:
            if not isinstance(got, Mapping):
                raise TypeError(f"transform {self.desc!r}: fn returned {type(got).__name__}, "
                                f"expected None or a mapping of field name to array")
            own = dict(arrays["fields"])
            for name, value in got.items():
                dst = own.get(name)
                value = np.asarray(value)
                if dst is None or value.shape != dst.shape:
                    raise ValueError(f"transform {self.desc!r}: fn returned "
                                     f"{name!r:.60} of shape {value.shape}, expected one of "
                                     f"{list(own)} with its shape")
                np.copyto(dst, value, casting="same_kind")
        return rows


# -- checks, lists, configs -----------------------------------------------------------------


def _elems(field) -> int:
    return int(math.prod(field.shape))


def _real(who: str, what: str, v) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{who}: {what} must be a real number, got {type(v).__name__} {v!r:.50}")
    return float(v)


def _names(who: str, fields) -> tuple:
    if isinstance(fields, str) or not hasattr(fields, "__iter__"):
        raise TypeError(f"{who}: fields must be a list of field names, got {fields!r:.60}")
    names = tuple(fields)
    if not names or any(not isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ValueError(f"{who}: fields must be distinct field names, at least one, got {fields!r:.60}")
    return names


def _unsaved(fn) -> str | None:
    if import_path(fn) is None:
        return (f"the transform function {fn!r:.80} has no import path (a lambda or a local "
                f"function): define it at the top level of a module so that a checkpoint can "
                f"name it")
    return None


def check_transforms(transforms, ctx: Context) -> tuple:
    """``transforms`` (a list of :class:`SampleTransform`, or None) checked against ``ctx``;
    returns them as a tuple. TypeError for anything else."""
    if transforms is None:
        return ()
    if isinstance(transforms, SampleTransform) or not hasattr(transforms, "__iter__"):
        raise TypeError(f"transforms must be a list of tfdata.transforms objects, got "
                        f"{type(transforms).__name__}")
    out = tuple(transforms)
    for t in out:
        if not isinstance(t, SampleTransform):
            raise TypeError(f"transforms: expected tfdata.transforms objects (Normalize, Cast, "
                            f"Compiled, Function, ...), got {t!r:.100}")
        t.check(ctx)
    return out


_BUILTINS = {"normalize": (Normalize, ("field",), ("eps", "clip", "stats_of")),
             "scale_reward": (ScaleReward, ("scale",), ()),
             "clip_reward": (ClipReward, ("low", "high"), ()),
             "random_shift": (RandomShift, ("field", "pad"), ()),
             "cast": (Cast, ("field", "dtype", "scale"), ())}


def from_config(items, allowed=(), where: str = "config.transforms") -> list:
    """The transforms a config lists (untrusted: a checkpoint's), each rebuilt by name; a user
    function only when its recorded import path is one of the functions ``allowed`` (nothing is
    imported). Raises :class:`~tfdata.errors.FormatError` naming ``where`` and the entry."""
    allowed = () if allowed is None else allowed
    if isinstance(allowed, (str, bytes)) or not hasattr(allowed, "__iter__"):
        raise TypeError(f"transforms must be a list of functions, got {type(allowed).__name__}")
    by_path = {}
    for fn in allowed:
        p = import_path(fn)
        if p is None:
            raise TypeError(f"transforms: {fn!r:.80} has no import path (a lambda or a local "
                            f"function): a checkpoint cannot name it")
        by_path[p] = fn
    if not isinstance(items, list) or len(items) > 64:
        raise FormatError(f"{where}: expected a list of at most 64 transforms, got {str(items)[:100]}")
    out = []
    for i, item in enumerate(items):
        w = f"{where}[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise FormatError(f"{w}: expected an object with a name, got {str(item)[:100]}")
        name = item["name"]
        try:
            if name in _BUILTINS:
                cls, args, kw = _BUILTINS[name]
                if set(item) != {"name", *args, *kw}:
                    raise ValueError(f"expected the keys {sorted({'name', *args, *kw})}, got {sorted(item)}")
                out.append(cls(*[item[a] for a in args], **{k: item[k] for k in kw}))
                continue
            if name not in ("compiled", "function"):
                raise ValueError(f"unknown transform {name[:60]!r} (known: "
                                 f"{sorted(_BUILTINS) + ['compiled', 'function']})")
            keys = {"name", "fn", "fields"} | ({"outputs"} if name == "compiled" else set())
            if set(item) != keys:
                raise ValueError(f"expected the keys {sorted(keys)}, got {sorted(item)}")
        except (TypeError, ValueError) as exc:
            raise FormatError(f"{w}: {str(exc)[:300]}") from None
        path = item["fn"]
        fn = by_path.get(path) if isinstance(path, str) else None
        if fn is None:
            raise FormatError(f"{w}.fn: the function {str(path)[:120]!r} is not among those given "
                              f"to load ({sorted(by_path)}); pass it: load(path, "
                              f"transforms=[the_function]) (a checkpoint never makes tfdata import "
                              f"or call anything it is not given)")
        try:
            if name == "compiled":
                outputs = item["outputs"]
                if not isinstance(outputs, dict) or not all(isinstance(v, str) and len(v) < 8
                                                            for v in outputs.values()):
                    raise ValueError(f"outputs: expected an object of dtype strings, got {str(outputs)[:80]}")
                out.append(Compiled(fn, item["fields"], outputs))
            else:
                out.append(Function(fn, item["fields"]))
        except (TypeError, ValueError) as exc:
            raise FormatError(f"{w}: {str(exc)[:300]}") from None
    return out


def check_states(parts, states) -> list:
    """The transforms' states of a state dict (``None``, or a list with one entry per
    transform) checked by each part; ValueError naming the entry. Changes nothing."""
    if states is None:
        return [None] * len(parts)
    if not isinstance(states, list) or len(states) != len(parts):
        raise ValueError(f"state transforms: expected a list of {len(parts)} entries (one per "
                         f"transform), got {str(states)[:100]}")
    return [p.check_state(s) for p, s in zip(parts, states)]
