"""``float32(x ** y)`` for the priority trees, exact and about four times cheaper than ``pow``.

The trees store leaves ``float32((p + eps) ** alpha)`` and the samplers importance weights
``float32((p_min / p) ** beta)``: a float64 power rounded once to float32. :func:`pow32`
computes the power with a polynomial logarithm and exponential that the compiler vectorises
(no call to the C library), then keeps the float32 result only when it is certain: when the
whole interval ``a * (1 -+ 2**-32)`` around the approximation ``a`` rounds to the same float32,
the float64 power (within a fraction of a float64 ulp of the true one, as is ``a`` within far
less than the interval's width) rounds to that float32 too. Otherwise, and for any input
outside the ranges where the error bound holds, it returns NaN and the caller computes
``x ** y`` as before. The results are those of ``float32(x ** y)`` bit for bit, whatever the
inputs; the error bound and its arithmetic are in docs/design/prioritized.md ("Powers without
``pow``").

Callers run :func:`pow32` over a whole batch in one loop (vectorised), then a second loop
computes ``x ** y`` where it returned NaN: about 0.6% of the values.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from .._config import INLINE_OPTIONS


@intrinsic
def _bits(typingctx, x):
    """The bits of float64 ``x`` as an int64 (a bitcast: no memory, vectorisable)."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return types.int64(types.float64), codegen


@intrinsic
def _float(typingctx, b):
    """The float64 whose bits are int64 ``b``."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return types.float64(types.int64), codegen


_LN2 = 0.6931471805599453
_INV_LN2 = 1.4426950408889634
_ONE52 = np.int64(1) << 52
_SQRT2_BITS = 0x3FF6A09E667F3BCD  # sqrt(2): the mantissa is reduced to [sqrt(1/2), sqrt(2))
#: relative half-width of the interval that must round to one float32
MARGIN = 2.0 ** -32
#: the inputs and results for which the error bound is stated
X_LOW, X_HIGH = 2.0 ** -1000, 2.0 ** 1000
Y_MAX = 8.0
A_LOW, A_HIGH = 2.0 ** -120, 2.0 ** 120
_NAN32 = np.float32(np.nan)
#: the polynomials' coefficients, highest power first: 2 / (2j + 1) of s**2j for log(m) / s,
#: j = 9..0; 1 / j! of r**j for exp(r), j = 13..0
_LOG = tuple(2.0 / j for j in range(19, 0, -2))
_EXP = tuple(1.0 / math.factorial(j) for j in range(13, -1, -1))


@njit(**INLINE_OPTIONS)
def _horner(x, coeffs):
    p = coeffs[0]
    for c in coeffs[1:]:
        p = p * x + c
    return p


#: relative error of :func:`power` for x in [X_LOW, X_HIGH], |y| <= Y_MAX and a result in
#: [A_LOW, A_HIGH] (docs/design/prioritized.md; tests/test_pow.py checks it)
ERROR = 2.0 ** -43


@njit(**INLINE_OPTIONS)
def power(x, y):
    """``x ** y`` (float64), within :data:`ERROR` relatively (see its ranges), without ``pow``."""
    b = _bits(x)
    mb = (b & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000
    up = np.int64(mb > _SQRT2_BITS)
    m = _float(mb - _ONE52 * up)
    k = ((b >> 52) & 0x7FF) - 1023 + up
    # log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716: terms to s**19
    s = (m - 1.0) / (m + 1.0)
    z = s * s
    p = _horner(z, _LOG)
    t = y * (s * p + np.float64(k) * _LN2)
    # exp(t) = 2**n exp(r), |r| <= ln(2) / 2: Taylor terms to r**13
    n = np.floor(t * _INV_LN2 + 0.5)
    r = t - n * _LN2
    q = _horner(r, _EXP)
    n = min(max(n, -1000.0), 1000.0)  # the shift below stays defined; such a result is refused
    return _float(_bits(q) + (np.int64(n) << 52))


@njit(**INLINE_OPTIONS)
def pow32(x, y):
    """``float32(x ** y)`` (float64 ``x`` and ``y``) when certain, else NaN (float32)."""
    a = power(x, y)
    c = min(max(a, A_LOW), A_HIGH)  # converted inside float32's range whatever a is
    lo = np.float32(c * (1.0 - MARGIN))
    hi = np.float32(c * (1.0 + MARGIN))
    ok = ((x >= X_LOW) & (x <= X_HIGH) & (y >= -Y_MAX) & (y <= Y_MAX)
          & (a >= A_LOW) & (a <= A_HIGH) & (lo == hi))
    return lo if ok else _NAN32
