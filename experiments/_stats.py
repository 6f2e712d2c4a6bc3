"""Statistics across seeds: mean ± std (with median and count: :func:`summary`), geometric means,
exact permutation tests, learning curves of episodes, verdicts on per-seed time ratios (a winner
only when every seed agrees and the mean is beyond a margin), summaries of per-seed latencies, and
where a ratio curve crosses 1.

numpy is imported inside the functions that need it.
"""

from __future__ import annotations

import math

def mean_std(xs) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1) of ``xs``, skipping None and NaN.

    Returns
    -------
    tuple of float
        (nan, nan) when nothing is left; std 0.0 for a single value.
    """
    import numpy as np

    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return float("nan"), float("nan")
    return float(np.mean(xs)), (float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0)


def summary(values, extremes: bool = False) -> dict:
    """Mean, sample std (ddof=1), median and count of ``values``, skipping None.

    Parameters
    ----------
    values : iterable of float or None
    extremes : bool
        Add ``min`` and ``max`` (before ``n``).

    Returns
    -------
    dict
        ``mean``, ``std`` (0.0 for a single value), ``median``, [``min``, ``max``,] ``n``; the
        statistics None when no value is left.
    """
    import numpy as np

    v = np.asarray([x for x in values if x is not None], dtype=float)
    if v.size == 0:
        return {"mean": None, "std": None, "median": None, **({"min": None, "max": None} if extremes else {}), "n": 0}
    return {"mean": float(v.mean()), "std": float(v.std(ddof=1)) if v.size > 1 else 0.0, "median": float(np.median(v)),
            **({"min": float(v.min()), "max": float(v.max())} if extremes else {}), "n": int(v.size)}


def gmean(xs) -> float:
    """Geometric mean (the average of ratios that treats 2x and 0.5x symmetrically)."""
    import numpy as np

    return float(np.exp(np.mean(np.log(xs))))


def permutation_test(a, b) -> float:
    """Exact two-sided permutation test of equal means (every split of the pooled values)."""
    import itertools

    import numpy as np

    a, b = list(a), list(b)
    pooled = a + b
    observed = abs(np.mean(a) - np.mean(b))
    n, hits, total = len(a), 0, 0
    for idx in itertools.combinations(range(len(pooled)), n):
        s = set(idx)
        x = [pooled[i] for i in idx]
        y = [pooled[i] for i in range(len(pooled)) if i not in s]
        total += 1
        hits += abs(np.mean(x) - np.mean(y)) >= observed - 1e-12
    return hits / total


def return_curve(episodes, total: int, bins: int) -> tuple[list, list]:
    """Mean episodic return of the episodes that ended in each of ``bins`` step ranges
    (carried forward through a range where none ended)."""
    import numpy as np

    edges = np.linspace(0, total, bins + 1)
    out, last = [], float("nan")
    ep = np.asarray(episodes, dtype=float).reshape(-1, 3)
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (ep[:, 0] >= lo) & (ep[:, 0] < hi)
        if m.any():
            last = float(ep[m, 1].mean())
        out.append(last)
    return ((edges[:-1] + edges[1:]) / 2).tolist(), out


def seed_curves(episodes_per_seed: list, total: int, bins: int) -> tuple[list, list]:
    """Per bin, the mean and the sample std over seeds of :func:`return_curve` of each seed's
    episodes (a bin before any seed's first episode is NaN, drawn as a gap; one seed: std 0)."""
    import warnings

    import numpy as np

    curves = [return_curve(episodes, total, bins)[1] for episodes in episodes_per_seed]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an all-NaN bin
        mean = np.nanmean(curves, axis=0).tolist()
        std = np.nanstd(curves, axis=0, ddof=1).tolist() if len(curves) > 1 else [0.0] * len(curves[0])
    return mean, std


def verdict(ratios, a: str, b: str, margin: float) -> str:
    """Which of two candidates is faster, from per-seed time ratios time(a) / time(b).

    Parameters
    ----------
    ratios : list of float
        One ratio per seed.
    a, b : str
        Names returned for the winner.
    margin : float
        The mean ratio must lie beyond ``1 ± margin``.

    Returns
    -------
    str
        ``a`` or ``b`` when every seed agrees and the mean is beyond the margin, else ``"tie"``.
    """
    import numpy as np

    m = float(np.mean(ratios))
    if all(r < 1 for r in ratios) and m < 1 - margin:
        return a
    if all(r > 1 for r in ratios) and m > 1 + margin:
        return b
    return "tie"


def ratio_summary(per_seed: list, a: str, b: str, margin: float) -> dict:
    """Mean, std, per-seed values and :func:`verdict` of per-seed ratios time(a) / time(b)."""
    m, sd = mean_std(per_seed)
    return {"mean": m, "std": sd, "per_seed": per_seed, "faster": verdict(per_seed, a, b, margin)}


def seed_summary(per_seed: list, **extra) -> dict:
    """Mean ± std across seeds of per-seed :func:`latency_stats` (median, p99 and mean).

    Parameters
    ----------
    per_seed : list of dict
        One :func:`latency_stats` per seed.
    **extra
        Further keys, placed before ``per_seed``.

    Returns
    -------
    dict
        ``median_us_mean``, ``median_us_std``, ``p99_us_*``, ``mean_us_*``, ``calls_per_seed``,
        the extra keys and ``per_seed``.
    """
    out = {}
    for f in ("median_us", "p99_us", "mean_us"):
        out[f + "_mean"], out[f + "_std"] = mean_std([p[f] for p in per_seed])
    out["calls_per_seed"] = [p["n"] for p in per_seed]
    return {**out, **extra, "per_seed": per_seed}


def crossings(xs, ys, verdicts, below_key: str) -> list[dict]:
    """Where a curve of ratios crosses 1 between consecutive measured points.

    The crossing is interpolated linearly in log(x) and log(ratio); nothing is extrapolated.

    Parameters
    ----------
    xs, ys : list of float
        Measured points (x ascending) and their mean ratios.
    verdicts : list of str
        :func:`verdict` at each point.
    below_key : str
        Name of the output key that is True when the ratio is below 1 left of the crossing.

    Returns
    -------
    list of dict
        ``x``, ``between`` (the two measured x), ``verdicts`` (theirs), ``significant`` (both
        sides have a winner, and they differ) and ``below_key``.
    """
    out = []
    for i in range(len(xs) - 1):
        y0, y1 = ys[i], ys[i + 1]
        if (y0 - 1) * (y1 - 1) > 0 or (y0 == 1 and i > 0) or y0 == y1:
            continue
        l0, l1 = math.log(y0), math.log(y1)
        t = -l0 / (l1 - l0)
        x = math.exp(math.log(xs[i]) + t * (math.log(xs[i + 1]) - math.log(xs[i])))
        sides = {verdicts[i], verdicts[i + 1]}
        out.append({"x": x, "between": [xs[i], xs[i + 1]], "verdicts": [verdicts[i], verdicts[i + 1]],
                    "significant": len(sides) == 2 and "tie" not in sides,
                    below_key: y0 < 1})
    return out
