"""``tfdata.kernels._pow.pow32``: the priority trees' powers without ``pow``, and the kernels that
use it (importance weights, the update's leaves), bit for bit against ``float32(x ** y)`` with
Python's power (the C library's, as the oracle in tests/naive.py computes it)."""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from tfdata.kernels import _tree
from tfdata.kernels._pow import A_HIGH, A_LOW, ERROR, X_HIGH, X_LOW, Y_MAX, pow32, power

from . import naive


@njit(cache=False)
def _power_all(x, y, out):
    for i in range(x.shape[0]):
        out[i] = power(x[i], y[i])


@njit(cache=False)
def _pow32_all(x, y, out):
    for i in range(x.shape[0]):
        out[i] = pow32(x[i], y)


def fast(x, y) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float64)
    out = np.zeros(len(x), np.float32)
    _pow32_all(x, float(y), out)
    return out


def exact(x, y) -> np.ndarray:
    with np.errstate(over="ignore"):  # a power past float32's range is inf, as in the kernels
        return np.array([np.float32(float(v) ** float(y)) for v in x], np.float32)


def bits(a) -> np.ndarray:
    return np.asarray(a, np.float32).view(np.uint32)


def check(x, y) -> float:
    """pow32 is NaN or exact on every value; returns the share of NaN (the callers' fallback)."""
    got, want = fast(x, y), exact(x, y)
    certain = ~np.isnan(got)
    bad = np.flatnonzero(certain & (bits(got) != bits(want)))
    assert bad.size == 0, f"y={y}: x={x[bad[:5]].tolist()} gave {got[bad[:5]]}, want {want[bad[:5]]}"
    return float(1.0 - certain.mean())


def test_power_is_within_its_stated_error_over_its_ranges():
    """The bound pow32's interval rests on: the float64 approximation within ERROR (2**-43, far
    inside the interval's 2**-32) of the power, for x in [X_LOW, X_HIGH], |y| <= Y_MAX and a
    result in [A_LOW, A_HIGH]; the extremes of each range included."""
    rng = np.random.default_rng(11)
    n = 400_000
    logx = rng.uniform(np.log(X_LOW), np.log(X_HIGH), n)
    y = rng.uniform(-Y_MAX, Y_MAX, n)
    y[: n // 4] = rng.uniform(-1.0, 1.0, n // 4)  # the exponents trees use
    # where the result would leave [A_LOW, A_HIGH], shrink x until it does not
    limit = np.log(A_HIGH) * 0.999
    logx = np.where(np.abs(logx * y) > limit, np.sign(logx) * limit / np.abs(y), logx)
    x = np.exp(logx)
    edges = np.array([X_LOW, X_HIGH, 1.0, np.nextafter(1.0, 2.0), np.nextafter(1.0, 0.0),
                      2 ** 0.5, np.nextafter(2 ** 0.5, 2.0), np.nextafter(2 ** 0.5, 0.0)])
    ey = np.minimum(Y_MAX, limit / np.maximum(np.abs(np.log(edges)), 1e-300))
    x, y = np.concatenate([x, edges, edges]), np.concatenate([y, ey, -ey])
    got = np.zeros(len(x))
    _power_all(x, y, got)
    want = np.array([a ** b for a, b in zip(x.tolist(), y.tolist())])
    inside = (want >= A_LOW) & (want <= A_HIGH)
    assert inside.mean() > 0.99
    err = np.abs(got[inside] - want[inside]) / want[inside]
    assert err.max() < ERROR, (err.max(), x[inside][err.argmax()], y[inside][err.argmax()])


@pytest.mark.parametrize("y", [0.4, 0.6, 1.0, 0.5, 0.01, 0.999, 2.0, 7.9, -0.4, -1.0, 1e-9, 0.0])
def test_pow32_is_exact_or_unsure_over_the_ranges_trees_use(y):
    rng = np.random.default_rng(abs(hash(y)) % 2 ** 32)
    sets = [
        rng.random(60_000) + 1e-12,  # weights' ratios p_min / p in (0, 1]
        1.0 - rng.random(20_000) * 1e-6,  # close to 1
        np.exp(rng.uniform(-80, 80, 60_000)),  # priorities + eps over many decades
        rng.lognormal(0.0, 2.0, 60_000),  # skewed TD errors
        np.float32(rng.random(20_000)).astype(np.float64),  # float32 leaves as float64
    ]
    rates = [check(x, y) for x in sets]
    if 0.0 < abs(y) <= 1.0:  # every result in range: sure of nearly every value
        assert max(rates) < 0.05, rates


def test_pow32_on_values_next_to_a_float32_rounding_boundary():
    """x chosen so that x ** y lies within a few float64 ulps of the midpoint between two
    float32 values: where rounding decides, pow32 must say it is unsure (or be right)."""
    rng = np.random.default_rng(7)
    f = np.float32(np.exp(rng.uniform(-60, 60, 20_000)))
    mid = (f.astype(np.float64) + np.nextafter(f, np.float32(np.inf)).astype(np.float64)) / 2
    for y in (0.4, 0.6, 1.0, 3.0):
        x = mid ** (1.0 / y)
        x = x * (1.0 + rng.integers(-4, 5, len(x)) * 2.0 ** -52)
        rate = check(x, y)
        assert rate > 0.5, rate  # most are unsure: the test reaches the fallback


@pytest.mark.parametrize("x", [0.0, -0.0, -1.0, 5e-324, 1e-310, 2.0 ** -1001, 2.0 ** 1001, np.inf,
                               -np.inf, np.nan, 1e300])
@pytest.mark.parametrize("y", [0.4, 1.0, 9.0, -9.0, np.nan, np.inf])
def test_pow32_is_unsure_outside_its_ranges(x, y):
    got = fast([x], y)[0]
    if np.isnan(got):
        return
    assert A_LOW <= got <= A_HIGH and bits(got) == bits(exact([x], y))


def test_pow32_of_a_zero_exponent_is_one():
    assert (fast(np.exp(np.linspace(-600, 600, 101)), 0.0) == 1.0).all()


def _unsure_priorities(alpha: float, eps: float, n: int, rng) -> np.ndarray:
    """Priorities whose leaf (p + eps) ** alpha lies next to a float32 rounding boundary, so that
    pow32 is unsure of most of them (checked by the caller)."""
    f = np.float32(rng.uniform(0.5, 50.0, n))
    mid = (f.astype(np.float64) + np.nextafter(f, np.float32(np.inf)).astype(np.float64)) / 2
    return mid ** (1.0 / alpha) - eps


@pytest.mark.parametrize("scratch", [0, 1, 3, 4, 256])
def test_update_writes_each_leaf_exactly_and_the_last_of_a_slot_listed_twice(scratch):
    """tree_update's leaves, computed ``scratch`` at a time with pow32 and ``**`` where it is
    unsure, equal the oracle's (naive.block_tree of float32((p + eps) ** alpha)), whatever the
    chunk and wherever a slot listed twice has a sure and an unsure value."""
    size, alpha, eps = 64, 0.6, 1e-6
    rng = np.random.default_rng(scratch)
    s, mm, lv = (a.copy() for a in naive.block_tree(np.ones(size), size))
    leaves = np.array(lv, np.float64)
    version = np.zeros(size, np.uint8)
    low, high = _tree.priority_bounds(eps, alpha, size)
    unsure = 0
    for _ in range(20):
        k = int(rng.integers(1, 40))
        slots = rng.integers(0, 12, k)  # few slots: many listed twice or more
        pri = np.where(np.arange(k) % 2 == rng.integers(0, 2), rng.random(k) * 40,
                       _unsure_priorities(alpha, eps, k, rng))
        unsure += int(np.isnan(fast(pri + eps, alpha)).sum())
        got = _tree.tree_update(s, mm, lv, version, slots, pri, np.zeros(0, np.uint32), False, 0,
                                size, low, high, eps, alpha, np.zeros(scratch, np.float32))
        assert got == 0
        for j in range(k):  # in order: the last value of a slot wins
            leaves[slots[j]] = np.float32(float(pri[j] + eps) ** alpha)
        for a, b in zip((s, mm, lv), naive.block_tree(leaves, size)):
            np.testing.assert_array_equal(a, b)
    assert unsure > 100  # the fallback ran, in every place of the chunks


def test_weights_of_a_sample_are_exact_where_pow32_is_unsure():
    """The sample's importance weights, float32((p_min / p) ** beta), bit for bit, over enough
    random leaves that pow32 is unsure of some of the drawn ones (about 1 in 150)."""
    import tfdata

    beta, n = 0.4, 4096
    buf = tfdata.PrioritizedReplayBuffer({"x": "i8"}, n, alpha=0.7, eps=1e-6, beta=beta, seed=5)
    buf.extend({"x": np.arange(n)})
    rng = np.random.default_rng(3)
    buf.update_priorities(np.arange(n), rng.lognormal(0.0, 1.0, n))
    leaves = buf.priorities()
    unsure = np.isnan(fast(leaves.min() / leaves, beta))
    drawn = 0
    for _ in range(10):
        b = buf.sample(n)
        want = [np.float32((float(leaves.min()) / float(leaves[j])) ** beta) for j in b.indices]
        np.testing.assert_array_equal(bits(b.weights), bits(np.array(want, np.float32)))
        drawn += int(unsure[b.indices].sum())
    assert drawn > 20  # the fallback ran
