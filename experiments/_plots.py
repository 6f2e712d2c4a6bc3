"""matplotlib helpers the experiments share: the Agg backend, log axes with plain labels, latency
lines (median with error bars, p99 dotted), grouped bars, ratio curves with their crossings of 1,
legends in columns, and saving a figure beside the report.

matplotlib is imported inside the functions, so importing this module stays cheap.
"""

from __future__ import annotations

import os

from _render import fmt_axis

def pyplot():
    """matplotlib.pyplot on the Agg backend (files only, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def log_axes(ax, xticks, xlabel: str, ysubs=None, base: int = 2) -> None:
    """Log x axis (``xticks`` labelled as plain numbers), log-10 y axis with plain labels, grid.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    xticks : list of number or None
        Major x ticks; None keeps matplotlib's.
    xlabel : str
    ysubs : tuple of float, optional
        Major y ticks at these multiples of each power of ten (e.g. ``(1, 2, 5)``); default
        matplotlib's.
    base : int
        Base of the x axis.
    """
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log", base=base)
    ax.set_yscale("log")
    if xticks is not None:
        ax.set_xticks(xticks, [str(x) for x in xticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    if ysubs is not None:
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=ysubs))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel(xlabel)
    ax.grid(True, which="both", alpha=0.3)


def latency_lines(ax, xs, stats: dict, colors: dict, labels: dict) -> None:
    """Per-call latency of several candidates against a parameter: the median (mean across seeds,
    error bar = std) solid with dots, the p99 (mean across seeds) dotted.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    xs : list of number
    stats : dict
        Candidate -> one :func:`seed_summary` per x.
    colors, labels : dict
        Candidate -> colour, legend name (the legend says "<name> median" / "<name> p99").
    """
    for name, ss in stats.items():
        ax.errorbar(xs, [s["median_us_mean"] for s in ss], yerr=[s["median_us_std"] for s in ss],
                    color=colors[name], marker="o", capsize=3, label=f"{labels[name]} median")
        ax.plot(xs, [s["p99_us_mean"] for s in ss], color=colors[name], ls=":", marker=".", alpha=0.7,
                label=f"{labels[name]} p99")


def grouped_bars(ax, groups: list, series: dict, colors: dict, labels: dict, *, width: float,
                 notes=None, log_base: float | None = None) -> None:
    """Bars of several candidates side by side per group, with error bars, from y = 0 (or, on a
    log axis, from y = ``log_base``).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    groups : list of str
        The x tick labels.
    series : dict
        Candidate -> (heights, errors), one per group; a NaN height draws no bar.
    colors, labels : dict
        Candidate -> colour, legend name.
    width : float
        Of one bar (a group is ``len(series) * width`` wide).
    notes : list of str, optional
        Written above each group's tallest bar (e.g. a ratio).
    log_base : float, optional
        Log-10 y axis with bars spanning from ``log_base`` to their height (up or down), and a
        line at ``log_base``: for ratios against a reference (``log_base=1``).
    """
    import numpy as np

    xs = np.arange(len(groups))
    bottom = 0.0 if log_base is None else log_base
    for j, (name, (h, e)) in enumerate(series.items()):
        ax.bar(xs + (j - (len(series) - 1) / 2) * width, np.asarray(h, dtype=float) - bottom, width,
               bottom=bottom, yerr=e, capsize=2, color=colors[name], label=labels[name])
    for i, note in enumerate(notes or []):  # above the bars and their error bars
        top = np.nanmax([h[i] + (e[i] if e is not None else 0) for h, e in series.values()] + [bottom])
        ax.text(xs[i], top * 1.02, note, ha="center", va="bottom", fontsize=8)
    ax.set_xticks(xs, groups, fontsize=8)
    if log_base is None:
        ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
    else:
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        ax.set_yscale("log")
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi * 1.25)  # room for the notes
        narrow = hi / lo < 4  # labelled ticks at finer steps, or a narrow axis shows only "1"
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 9) if narrow
                                                   else (1, 2, 5)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.axhline(log_base, color="k", lw=0.8)
    ax.grid(True, axis="y", alpha=0.3)


def ratio_curves(ax, curves: list, labels: list) -> None:
    """Ratio curves (mean ± std across seeds) with their crossings of 1 marked and labelled.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    curves : list of dict
        ``xs``, ``ys``, ``std``, ``x_label`` and ``crossings`` (:func:`crossings`); one colour each.
    labels : list of str
        Legend entry per curve.

    Notes
    -----
    A crossing is an X on y = 1, faded when it is not significant (one side a tie), with its x
    (:func:`fmt_axis`) written beside it.
    """
    cmap = pyplot().get_cmap("tab10")
    for i, (x, label) in enumerate(zip(curves, labels)):
        col = cmap(i % 10)
        ax.errorbar(x["xs"], x["ys"], yerr=x["std"], marker="o", ms=4, capsize=2, color=col, label=label)
        for cr in x["crossings"]:
            ax.plot([cr["x"]], [1.0], marker="X", ms=11, color=col, mec="k",
                    alpha=1.0 if cr["significant"] else 0.5)
            ax.annotate(fmt_axis(cr["x"], x["x_label"]), (cr["x"], 1.0), xytext=(4, -14),
                        textcoords="offset points", fontsize=7, color=col)
    ax.axhline(1.0, color="k", lw=0.9)


def column_legend(fig, ax, prefixes: list, **kw) -> int:
    """A figure legend of ``ax``'s lines with one column per label prefix, padded with blank
    entries so the columns' rows line up.

    Parameters
    ----------
    fig : matplotlib.figure.Figure
    ax : matplotlib.axes.Axes
    prefixes : list of str
        A line goes in the column of the prefix its label starts with (prefixes must not overlap).
    **kw
        Passed to ``fig.legend`` (``ncol`` is the number of prefixes).

    Returns
    -------
    int
        The number of legend rows (to leave room for them).
    """
    from matplotlib.lines import Line2D

    handles, labels = ax.get_legend_handles_labels()
    cols = [[(h, lab) for h, lab in zip(handles, labels) if lab.startswith(p)] for p in prefixes]
    rows = max(len(c) for c in cols)
    cols = [c + [(Line2D([], [], alpha=0), "")] * (rows - len(c)) for c in cols]
    fig.legend([h for c in cols for h, _ in c], [lab for c in cols for _, lab in c], ncol=len(prefixes),
               **kw)
    return rows


def save_figure(fig, out_dir: str, name: str, dpi: int = 110) -> str:
    """Save ``fig`` as ``out_dir/name``, close it, and return ``name`` (for the report)."""
    import matplotlib.pyplot as plt

    fig.savefig(os.path.join(out_dir, name), dpi=dpi)
    plt.close(fig)
    return name
