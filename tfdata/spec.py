"""The schema of a row: named fields (:class:`Field`), each a numeric (or bool) numpy dtype and a
shape, in a :class:`Spec`. A spec gives the AoS record of a row (:attr:`Spec.aos_dtype`; SoA
stores one array per field) and validates input (:meth:`Spec.check_row`,
:meth:`Spec.check_batch`) before anything is written, so a rejected row leaves every buffer
untouched.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .errors import SpecError

_ALLOWED_KINDS = "biufc"
_NUMPY_SCALAR_TYPES = (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                       np.uint32, np.uint64, np.float16, np.float32, np.float64, np.complex64,
                       np.complex128)
# numpy scalar types that stand for one value of a numeric kind
_NUMERIC_SCALARS = (np.bool_, np.integer, np.floating, np.complexfloating)


def _as_dtype(dtype, name: str) -> np.dtype:
    try:
        dt = np.dtype(dtype)
    except TypeError as exc:
        raise SpecError(f"field {name!r}: {dtype!r} is not a numpy dtype ({exc})") from None
    if dt.kind not in _ALLOWED_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise SpecError(
            f"field {name!r}: dtype must be bool or numeric (kinds {_ALLOWED_KINDS!r}), got {dt!r}"
        )
    # the canonical native instance, so fast paths can compare dtypes with `is`
    return np.dtype(dt.type)


def _as_shape(shape, name: str) -> tuple[int, ...]:
    if isinstance(shape, numbers.Integral):
        shape = (int(shape),)
    try:
        shape = tuple(int(s) for s in shape)
    except (TypeError, ValueError):
        raise SpecError(f"field {name!r}: shape must be a tuple of ints, got {shape!r}") from None
    if any(s <= 0 for s in shape):
        raise SpecError(f"field {name!r}: every dimension must be >= 1, got shape {shape}")
    return shape


def _as_bounds(field: "Field", low, high) -> tuple:
    """``(low, high)`` of ``field`` as read-only float64 arrays of the field's shape, checked;
    ``(None, None)`` when neither is given."""
    if low is None and high is None:
        return None, None
    name = field.name
    if low is None or high is None:
        raise SpecError(f"field {name!r}: bounds need both low and high (an unbounded side is "
                        f"-inf or inf), got low={_short(low)}, high={_short(high)}")
    if field.dtype.kind != "f":
        raise SpecError(f"field {name!r}: bounds are for floating-point fields, got dtype "
                        f"{field.dtype}")
    out = []
    for which, v in (("low", low), ("high", high)):
        try:
            arr = np.asarray(v)
        except (ValueError, TypeError, RuntimeError) as exc:
            raise SpecError(f"field {name!r}: {which}: cannot read {type(v).__name__} as an array "
                            f"({str(exc)[:100]})") from None
        if arr.dtype.kind not in "iuf":
            raise SpecError(f"field {name!r}: {which}: expected real numbers, got dtype {arr.dtype}")
        if arr.shape not in ((), field.shape):
            raise SpecError(f"field {name!r}: {which}: expected shape {field.shape} (or a scalar), "
                            f"got shape {arr.shape}")
        arr = np.array(np.broadcast_to(arr.astype(np.float64), field.shape), np.float64)
        if np.isnan(arr).any():
            raise SpecError(f"field {name!r}: {which}: expected finite or infinite floats, got NaN")
        arr.flags.writeable = False
        out.append(arr)
    if (out[0] > out[1]).any():
        i = np.unravel_index(int(np.argmax(out[0] > out[1])), field.shape) if field.shape else ()
        raise SpecError(f"field {name!r}: expected low <= high, got low {out[0][i]} > high "
                        f"{out[1][i]} at index {tuple(int(j) for j in i)}")
    return out[0], out[1]


def _short(v) -> str:
    return repr(v)[:100]


def _bound_to_json(arr: np.ndarray) -> list:
    # JSON has no infinity (checkpoints are written with allow_nan=False): "inf" / "-inf"
    return [x if math.isfinite(x) else ("inf" if x > 0 else "-inf") for x in arr.ravel().tolist()]


def _bound_from_json(name: str, which: str, v, shape: tuple) -> np.ndarray:
    """A bound written by :meth:`Field.to_dict`, read as untrusted input: a flat list of
    ``prod(shape)`` numbers (an int or float, or the strings ``"inf"`` / ``"-inf"``)."""
    size = math.prod(shape)
    if not isinstance(v, list) or len(v) != size:
        n = f"a list of {len(v)}" if isinstance(v, list) else type(v).__name__
        raise SpecError(f"field {name!r}: {which}: expected a list of {size} numbers (the field's "
                        f"shape {shape}, flattened), got {n}")
    out = np.empty(size, np.float64)
    for i, x in enumerate(v):
        if type(x) is str and x in ("inf", "-inf"):
            out[i] = float(x)
        elif type(x) in (int, float) and (type(x) is int or not math.isnan(x)):
            try:
                out[i] = x
            except OverflowError:
                raise SpecError(f"field {name!r}: {which}[{i}]: integer too large for a float") from None
        else:
            raise SpecError(f"field {name!r}: {which}[{i}]: expected a number or 'inf' / '-inf', "
                            f"got {_short(x)}")
    return out.reshape(shape)


@dataclass(frozen=True)
class Field:
    """One named field: a dtype and the shape of one row's value.

    Parameters
    ----------
    name : str
    dtype : numpy dtype
        Bool or numeric.
    shape : tuple of int, default ()
        The shape of one row's value.
    low, high : array_like or None, default None
        Bounds of a floating-point field (a continuous action: a gymnasium ``Box``'s ``low`` and
        ``high``), both or neither: scalars or arrays of ``shape``, no NaN (an unbounded side is
        ``-inf`` / ``inf``), ``low <= high``. Kept as read-only float64 arrays of ``shape`` for
        the learner to read (``spec["action"].low``); metadata only: values outside them are
        still accepted by a push (clip where the environment needs it), and they take no part
        in equality or hashing. They survive :meth:`to_dict` / :meth:`Spec.from_dict`, so every
        checkpoint, shared region and Ray actor keeps them; datasets do not (an AoS file holds
        a structured dtype only, and the layouts store the same).
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...] = ()
    low: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)
    high: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise SpecError(f"field names must be non-empty strings, got {self.name!r}")
        object.__setattr__(self, "dtype", _as_dtype(self.dtype, self.name))
        object.__setattr__(self, "shape", _as_shape(self.shape, self.name))
        low, high = _as_bounds(self, self.low, self.high)
        object.__setattr__(self, "low", low)
        object.__setattr__(self, "high", high)
        # bounds for the Python-int fast path of check_row (inf for float fields, None = no path)
        kind = self.dtype.kind
        if kind in "iu":
            info = np.iinfo(self.dtype)
            bounds = (int(info.min), int(info.max))
        elif kind in "fc":
            bounds = (-(2**1023), 2**1023)  # beyond this float() of a Python int overflows
        else:
            bounds = None
        object.__setattr__(self, "int_bounds", bounds if not self.shape else None)
        # scalar types (Python and numpy) that always enter a scalar field without loss
        ok = set()
        if not self.shape:
            ok = {t for t in _NUMPY_SCALAR_TYPES if self.cast_rule(np.dtype(t)) == "ok"}
            ok.add(bool)
            if kind in "fc":
                ok.add(float)
        object.__setattr__(self, "scalar_types", frozenset(ok))

    @property
    def nbytes(self) -> int:
        """Bytes of one row of this field."""
        # math.prod: np.prod's array round trip showed in a buffer's construction
        return self.dtype.itemsize * math.prod(self.shape)

    # -- validation -------------------------------------------------------------------------
    def coerce_one(self, value):
        """:meth:`coerce` for one row, with fast paths for the common exact inputs."""
        t = type(value)
        if t is np.ndarray:
            if value.dtype is self.dtype and value.shape == self.shape:
                return value
        elif t in self.scalar_types:
            return value
        elif t is int:
            b = self.int_bounds
            if b is not None and b[0] <= value <= b[1]:
                return value
        return self.coerce(value, ())

    def coerce(self, value, lead: tuple[int, ...] = ()):
        """Return ``value`` in a form that numpy can assign into this field without loss.

        Parameters
        ----------
        value : array_like or scalar
            For one row, shape ``self.shape``; for ``n`` rows, shape ``lead + self.shape``.
        lead : tuple of int
            ``()`` for one row, ``(n,)`` for a batch of ``n`` rows.

        Raises
        ------
        SpecError
            Wrong shape, a cast that could lose data (float into an integer field, an integer out
            of the field's range, a non-0/1 value into a bool field), or non-numeric junk.
        """
        expected = lead + self.shape
        t = type(value)
        # fast paths: the exact dtype and shape, or a Python scalar for a scalar field
        if t is np.ndarray:
            if value.dtype == self.dtype and value.shape == expected:
                return value
            arr = value
        elif not expected and (t is float or t is int or t is bool):
            return self._coerce_python_scalar(value)
        else:
            arr = self.to_array(value)
        if arr.dtype.kind not in _ALLOWED_KINDS:
            raise SpecError(f"field {self.name!r}: expected dtype {self.dtype}, got non-numeric data "
                            f"of dtype {arr.dtype}")
        if arr.shape != expected:
            raise SpecError(f"field {self.name!r}: expected shape {expected}, got shape {arr.shape}")
        self._check_cast(arr)
        if self.dtype.kind == "b" and arr.dtype.kind != "b":
            # ints of 0 and 1 (checked) as bools: the episode bookkeeping's kernels read flags
            # as bool arrays (int arrays made them raise after the rows were written)
            arr = arr.astype(np.bool_)
        return arr

    def to_array(self, value) -> np.ndarray:
        """Read ``value`` as a numeric ndarray, or raise SpecError naming this field."""
        t = type(value)
        if t is np.ndarray:
            arr = value
        elif (isinstance(value, (_NUMERIC_SCALARS, list, tuple, numbers.Number))
              or hasattr(value, "__array__") or hasattr(value, "__array_interface__")):
            # numbers, nested sequences, and other array libraries (torch, jax) via numpy's protocol
            try:
                arr = np.asarray(value)
            except (ValueError, TypeError, RuntimeError) as exc:
                raise SpecError(f"field {self.name!r}: cannot read {t.__name__} as an array ({exc})") from None
        else:
            raise SpecError(f"field {self.name!r}: expected a numeric array of dtype {self.dtype}, "
                            f"got {t.__name__}")
        if arr.dtype.kind not in _ALLOWED_KINDS:
            raise SpecError(f"field {self.name!r}: expected dtype {self.dtype}, got non-numeric data "
                            f"of dtype {arr.dtype} ({t.__name__})")
        return arr

    def _coerce_python_scalar(self, value):
        kind = self.dtype.kind
        if type(value) is float:
            if kind in "fc":
                return value
            raise SpecError(f"field {self.name!r}: expected dtype {self.dtype}, got a float ({value!r}); "
                            "casting float to an integer or bool field would lose data")
        if kind in "fc":
            try:
                float(value)
            except OverflowError:
                raise SpecError(f"field {self.name!r}: integer {value} is too large for dtype {self.dtype}") from None
            return value
        if kind == "b":
            if value in (0, 1):
                return bool(value)
            raise SpecError(f"field {self.name!r}: expected dtype bool, got {value!r} (only 0 and 1 cast safely)")
        info = np.iinfo(self.dtype)
        if info.min <= value <= info.max:
            return value
        raise SpecError(f"field {self.name!r}: value {value!r} out of range for dtype {self.dtype} "
                        f"[{info.min}, {info.max}]")

    def cast_rule(self, src: np.dtype) -> str:
        """How values of dtype ``src`` enter this field: ``"ok"`` (no value class can be lost),
        ``"range"`` (only if every value fits: integer narrowing, integers into bool) or ``"no"``."""
        dst = self.dtype
        if src == dst or np.can_cast(src, dst, casting="safe"):
            return "ok"
        if dst.kind in "fc" and src.kind in "biuf" and (dst.kind == "c" or src.kind != "c"):
            return "ok"  # same kind or int -> float: precision may round, no value class is lost
        if dst.kind in "iub" and src.kind in "iu":
            return "range"
        return "no"

    def _check_cast(self, arr: np.ndarray) -> None:
        src, dst = arr.dtype, self.dtype
        rule = self.cast_rule(src)
        if rule == "ok":
            return
        if rule == "range":
            if arr.size == 0:
                return
            lo, hi = arr.min(), arr.max()
            if dst.kind == "b":
                if lo >= 0 and hi <= 1:
                    return
                raise SpecError(f"field {self.name!r}: expected dtype bool, got {src} values other than 0 and 1")
            info = np.iinfo(dst)
            if lo >= info.min and hi <= info.max:
                return
            raise SpecError(f"field {self.name!r}: values in [{lo}, {hi}] of dtype {src} do not fit "
                            f"dtype {dst} [{info.min}, {info.max}]")
        raise SpecError(f"field {self.name!r}: expected dtype {dst}, got dtype {src}; "
                        f"casting {src} to {dst} could lose data")

    def to_dict(self) -> dict:
        """JSON-serialisable: ``name``, ``dtype`` (numpy's ``dtype.str``), ``shape`` and, for a
        field with bounds, ``low`` and ``high`` (flat lists, infinities as ``"inf"`` /
        ``"-inf"``)."""
        d = {"name": self.name, "dtype": self.dtype.str, "shape": list(self.shape)}
        if self.low is not None:
            d["low"], d["high"] = _bound_to_json(self.low), _bound_to_json(self.high)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "Field":
        """Inverse of :meth:`to_dict`, for untrusted input: SpecError naming the field and key
        for anything that is not a field (bounds: see :class:`Field`)."""
        if not isinstance(d, Mapping):
            raise SpecError(f"not a field dictionary: {type(d).__name__}")
        try:
            name, dtype, shape = d["name"], d["dtype"], d["shape"]
        except KeyError as exc:
            raise SpecError(f"not a field dictionary: missing key {exc}") from None
        if not isinstance(shape, (list, tuple)):
            raise SpecError(f"field {_short(name)}: shape: expected a list of ints, got {_short(shape)}")
        try:
            field = cls(name, np.dtype(dtype), tuple(shape))
        except SpecError:
            raise
        except (TypeError, ValueError) as exc:
            raise SpecError(f"field {_short(name)}: {str(exc)[:200]}") from None
        if "low" not in d and "high" not in d:
            return field
        low, high = (_bound_from_json(field.name, k, d[k], field.shape) if k in d else None
                     for k in ("low", "high"))
        return cls(field.name, field.dtype, field.shape, low=low, high=high)


class Spec:
    """An ordered set of named fields.

    Parameters
    ----------
    fields : mapping or iterable of Field
        ``{"obs": ("f4", (4,)), "action": "i8", "reward": ("f4", ())}``: each value is a dtype,
        a ``(dtype, shape)`` pair, or a :class:`Field`. Order is kept: it is the column order of
        the AoS record and of saved files.

    Notes
    -----
    Padding policy of :attr:`aos_dtype`: fields keep their declared order, each at its natural
    alignment (numpy's ``align=True``), and the itemsize is rounded up to a multiple of 8 bytes.
    Padding bytes carry no data; compare rows by field, never by raw bytes.
    """

    def __init__(self, fields):
        if isinstance(fields, Spec):
            fields = fields.fields
        items: list[Field] = []
        if isinstance(fields, Mapping):
            for name, desc in fields.items():
                items.append(self._field_from_desc(name, desc))
        else:
            for f in fields:
                if not isinstance(f, Field):
                    raise SpecError(f"expected Field objects or a mapping, got {type(f).__name__}")
                items.append(f)
        if not items:
            raise SpecError("a spec needs at least one field")
        names = [f.name for f in items]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise SpecError(f"duplicate field names: {sorted(dup)}")
        self._fields: tuple[Field, ...] = tuple(items)
        self._by_name = {f.name: f for f in items}
        self._nested = any("." in n for n in names)
        self._row_checks = tuple((f.name, f.coerce_one) for f in items)
        self._dtypes = tuple(f.dtype for f in items)
        self._batch_shapes = (-1, ())
        base = np.dtype([(f.name, f.dtype, f.shape) for f in items], align=True)
        itemsize = -(-base.itemsize // 8) * 8
        self._aos_dtype = np.dtype({
            "names": list(base.names),
            "formats": [base.fields[n][0] for n in base.names],
            "offsets": [base.fields[n][1] for n in base.names],
            "itemsize": itemsize,
            "aligned": True,
        })

    @staticmethod
    def _field_from_desc(name, desc) -> Field:
        if isinstance(desc, Field):
            if desc.name != name:
                raise SpecError(f"field {name!r}: Field object is named {desc.name!r}")
            return desc
        if isinstance(desc, tuple) and len(desc) == 2:
            return Field(name, desc[0], desc[1])
        return Field(name, desc, ())

    # -- constructors -----------------------------------------------------------------------
    @classmethod
    def from_example(cls, row: Mapping) -> "Spec":
        """Build a spec from one example row (mapping of field name to array or scalar).

        Python floats become float64, ints int64 and bools bool; arrays keep dtype and shape.
        Nested mappings become dotted field names (``{"obs": {"pos": ...}}`` -> ``"obs.pos"``).
        """
        if not isinstance(row, Mapping):
            raise SpecError(f"from_example expects a mapping, got {type(row).__name__}")
        fields = []
        for name, value in _flatten(row).items():
            try:
                arr = np.asarray(value)
            except (ValueError, TypeError) as exc:
                raise SpecError(f"field {name!r}: cannot read {type(value).__name__} as an array ({exc})") from None
            fields.append(Field(name, arr.dtype, arr.shape))
        return cls(fields)

    @classmethod
    def from_spaces(cls, observation_space, action_space, *, reward_dtype="f4",
                    next_obs: bool = True) -> "Spec":
        """Build the usual transition spec from gymnasium spaces.

        Fields: ``obs``, ``action``, ``reward`` (``reward_dtype``), ``next_obs`` (if
        ``next_obs``), ``terminated`` and ``truncated`` (bool). A Dict space gives dotted
        fields (``obs.<key>``). gymnasium is imported only by this method.

        A ``Box`` keeps its dtype and shape: a continuous action space (Pendulum's
        ``Box(-2, 2, (1,), float32)``) gives a float32 ``action`` of shape ``(1,)``. A
        floating-point ``Box`` action (float16, float32 or float64) also keeps its bounds as the
        field's ``low`` and ``high`` (float64 arrays of its shape; see :class:`Field`), which a
        learner reads to scale its actions: ``spec["action"].low``. An integer or bool ``Box``
        keeps its dtype without bounds; observation fields carry none (they are often infinite,
        and an image's would be as large as a frame).
        """
        fields = []
        fields += space_fields(observation_space, "obs")
        fields += space_fields(action_space, "action", bounds=True)
        fields.append(Field("reward", reward_dtype, ()))
        if next_obs:
            fields += space_fields(observation_space, "next_obs")
        fields.append(Field("terminated", np.bool_, ()))
        fields.append(Field("truncated", np.bool_, ()))
        return cls(fields)

    @classmethod
    def from_dict(cls, d: Mapping) -> "Spec":
        """Inverse of :meth:`to_dict` (each field by :meth:`Field.from_dict`, bounds checked)."""
        try:
            return cls([Field.from_dict(f) for f in d["fields"]])
        except (KeyError, TypeError) as exc:
            raise SpecError(f"not a spec dictionary: {exc}") from None

    def to_dict(self) -> dict:
        """A JSON-serialisable description (dtype strings are numpy's ``dtype.str``)."""
        return {"fields": [f.to_dict() for f in self._fields]}

    # -- introspection ----------------------------------------------------------------------
    @property
    def fields(self) -> tuple[Field, ...]:
        return self._fields

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self._fields)

    @property
    def aos_dtype(self) -> np.dtype:
        """Aligned structured dtype of one row, itemsize a multiple of 8."""
        return self._aos_dtype

    @property
    def row_nbytes(self) -> int:
        """Bytes of data in one row, without padding (the SoA cost per row)."""
        return sum(f.nbytes for f in self._fields)

    def __getitem__(self, name: str) -> Field:
        try:
            return self._by_name[name]
        except KeyError:
            raise SpecError(self.unknown_message(name)) from None

    def __contains__(self, name) -> bool:
        return name in self._by_name

    def __iter__(self):
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __eq__(self, other) -> bool:
        return isinstance(other, Spec) and self._fields == other._fields

    def __hash__(self) -> int:
        return hash(self._fields)

    def __repr__(self) -> str:
        inner = ", ".join(f"{f.name!r}: ({f.dtype.str!r}, {f.shape})" for f in self._fields)
        return f"Spec({{{inner}}})"

    def select(self, fields, what: str = "fields") -> tuple[str, ...]:
        """The field names ``fields`` (a list or tuple of str), checked, in spec order.

        Raises
        ------
        SpecError
            ``fields`` is a string or not iterable, is empty, names a field twice, holds a
            name that is not a str, or an unknown field (the message names it and lists the
            fields). Nothing is changed.
        """
        if isinstance(fields, (str, bytes)):
            raise SpecError(f"{what}: expected a list of field names, got the string {fields!r}; "
                            f"for one field write [{fields!r}]")
        try:
            items = list(fields)
        except TypeError:
            raise SpecError(f"{what}: expected a list of field names, got "
                            f"{type(fields).__name__} {fields!r}") from None
        if not items:
            raise SpecError(f"{what}: expected at least one field name, got an empty "
                            f"{type(fields).__name__} (fields=None gives every field)")
        seen = set()
        for name in items:
            if not isinstance(name, str):
                raise SpecError(f"{what}: field names must be str, got {type(name).__name__} "
                                f"{name!r}")
            if name not in self._by_name:
                raise SpecError(f"{what}: {self.unknown_message(name)}")
            if name in seen:
                raise SpecError(f"{what}: field {name!r} is named twice")
            seen.add(name)
        return tuple(f.name for f in self._fields if f.name in seen)

    def subset(self, names) -> "Spec":
        """The spec of fields ``names`` (known names), in spec order."""
        wanted = set(names)
        return Spec([f for f in self._fields if f.name in wanted])

    # -- validation -------------------------------------------------------------------------
    def unknown_message(self, name) -> str:
        close = difflib.get_close_matches(str(name), list(self._by_name), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown field {name!r}{hint} (fields: {', '.join(self._by_name)})"

    def _check_names(self, data: Mapping, what: str) -> None:
        missing = [f.name for f in self._fields if f.name not in data]
        unknown = [k for k in data if k not in self._by_name]
        if unknown:
            msgs = [self.unknown_message(k) for k in unknown]
            if missing:
                msgs.append(f"missing field(s) {missing}")
            raise SpecError(f"{what}: " + "; ".join(msgs))
        if missing:
            raise SpecError(f"{what}: missing field(s) {missing} (fields: {', '.join(self._by_name)})")

    def check_row(self, row: Mapping) -> list:
        """Validate one row and return its values in field order, ready to assign.

        Raises
        ------
        SpecError
            If a field is missing or unknown, or a value has the wrong shape or an unsafe dtype.
        """
        if type(row) is not dict and not isinstance(row, Mapping):
            raise SpecError(f"push expects a mapping of field name to value, got {type(row).__name__}")
        if self._nested:
            row = _flatten(row)
        if len(row) != len(self._fields):
            self._check_names(row, "push")
        try:
            return [coerce(row[name]) for name, coerce in self._row_checks]
        except KeyError:
            self._check_names(row, "push")
            raise

    def check_batch(self, batch: Mapping) -> tuple[int, list]:
        """Validate ``n`` rows (every field with the same leading dimension ``n``).

        Returns
        -------
        n : int
        values : list of ndarray
            In field order, each of shape ``(n, *field.shape)``.

        Raises
        ------
        SpecError
            As :meth:`check_row`, and when fields disagree on the number of rows.
        """
        if type(batch) is not dict and not isinstance(batch, Mapping):
            raise SpecError(f"extend expects a mapping of field name to array, got {type(batch).__name__}")
        if self._nested:
            batch = _flatten(batch)
        if len(batch) != len(self._fields):
            self._check_names(batch, "extend")
        try:
            values = [batch[name] for name, _ in self._row_checks]
        except KeyError:
            self._check_names(batch, "extend")
            raise
        # fast path: every value an ndarray of the exact dtype and row shape, same n
        v = values[0]
        if type(v) is np.ndarray and v.ndim:
            n = v.shape[0]
            shapes = self._batch_shapes
            if shapes[0] != n:  # cached per n: callers extend with the same n again and again
                shapes = self._batch_shapes = (n, tuple((n, *f.shape) for f in self._fields))
            for v, dt, shape in zip(values, self._dtypes, shapes[1]):
                if type(v) is not np.ndarray or v.dtype is not dt or v.shape != shape:
                    break
            else:
                return n, values
        n, first = None, None
        values = []
        for f in self._fields:
            v = batch[f.name]
            if type(v) is not np.ndarray:
                v = f.to_array(v)
            if v.ndim != 1 + len(f.shape):
                raise SpecError(f"field {f.name!r}: extend expects shape (n, {', '.join(map(str, f.shape))}) "
                                f"with n rows, got shape {v.shape}".replace(", )", ")"))
            if n is None:
                n, first = v.shape[0], f
            elif v.shape[0] != n:
                raise SpecError(f"extend: leading dimensions differ: field {first.name!r} has {n} rows, "
                                f"field {f.name!r} has {v.shape[0]} rows")
            values.append(f.coerce(v, (n,)))
        return n, values


def _flatten(row: Mapping, prefix: str = "") -> dict:
    out = {}
    for k, v in row.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def space_fields(space, name: str, bounds: bool = False) -> list[Field]:
    """Fields for one gymnasium space: Box, Discrete, MultiDiscrete, MultiBinary or Dict.

    ``bounds``: a floating-point Box's field keeps its ``low`` and ``high`` (see :class:`Field`).
    """
    try:
        from gymnasium import spaces
    except ImportError as exc:  # pragma: no cover - exercised only without gymnasium
        raise ImportError("Spec.from_spaces needs gymnasium: pip install 'tfdata[rl]'") from exc
    if isinstance(space, spaces.Box):
        if bounds and np.dtype(space.dtype).kind == "f":
            return [Field(name, space.dtype, space.shape, low=space.low, high=space.high)]
        return [Field(name, space.dtype, space.shape)]
    if isinstance(space, spaces.Discrete):
        return [Field(name, np.int64, ())]
    if isinstance(space, spaces.MultiDiscrete):
        return [Field(name, np.int64, space.nvec.shape)]
    if isinstance(space, spaces.MultiBinary):
        return [Field(name, np.int8, tuple(np.atleast_1d(space.n)))]
    if isinstance(space, spaces.Dict):
        out = []
        for key, sub in space.spaces.items():
            out += space_fields(sub, f"{name}.{key}", bounds)
        return out
    raise SpecError(f"field {name!r}: unsupported gymnasium space {type(space).__name__} "
                    "(supported: Box, Discrete, MultiDiscrete, MultiBinary, Dict)")
