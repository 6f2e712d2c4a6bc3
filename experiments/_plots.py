"""matplotlib helpers the experiments share: the Agg backend, log axes with plain labels, latency
lines (median with error bars, p99 dotted), grouped bars, ratio curves with their crossings of 1,
legends in columns, and saving a figure beside the report.

An experiment declares a figure as its panels, one generic kind each (:func:`hbar_medians`,
:func:`bars`, :func:`hbars`, :func:`hbar_pairs`, :func:`hbar_values`, :func:`hbar_stack`,
:func:`bar_series`, :func:`lines`, :func:`learning_curves`, :func:`survival`, :func:`traces`,
:func:`scatter`) with
its data from ``results.json`` bound by ``functools.partial``, and :func:`panels_figure` (one row)
or :func:`grid_figure` draws and saves it::

    panels_figure(out_dir, "speed.png", (13, 4.8), [partial(hbar_medians, stats=res["sample"], ...)])

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


def plain_log_ticks(axis) -> None:
    """Plain numbers on a log axis (1, 2, 5 per decade, thousands separated), no minor labels."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def hbar_medians(ax, stats: dict, colors: dict, *, ref: str, target: float, title: str,
                 xlabel: str = "µs per call (median, bars p10-p90)") -> None:
    """Horizontal bars of each candidate's median with a p10-p90 interval, and a target line at
    ``target`` times the median of candidate ``ref``.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    stats : dict
        Candidate -> ``median_us``, ``p10_us``, ``p90_us``; top to bottom in dict order.
    colors : dict
        Candidate -> colour (black when missing).
    ref : str
        The candidate the target is relative to.
    target : float
    title, xlabel : str
    """
    import numpy as np

    kinds = list(stats)
    med = [stats[k]["median_us"] for k in kinds]
    err = [[m - stats[k]["p10_us"] for k, m in zip(kinds, med)], [stats[k]["p90_us"] - m for k, m in zip(kinds, med)]]
    y = np.arange(len(kinds))
    ax.barh(y, med, xerr=err, color=[colors.get(k, "k") for k in kinds], capsize=2)
    ax.axvline(target * stats[ref]["median_us"], color="r", ls="--", lw=1, label=f"target: {target}x {ref}")
    ax.set_yticks(y, kinds, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(True, axis="x", which="both", alpha=0.3)


def bars(ax, groups: list, series: dict, *, ylabel: str, colors: dict | None = None, title: str | None = None,
         tick_fontsize: float | None = None, legend_fontsize: float = 8) -> None:
    """Bars of several series side by side per group, on a log y axis with plain labels.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    groups : list of str
        The x tick labels.
    series : dict
        Legend label -> heights, one per group.
    ylabel : str
    colors : dict, optional
        Legend label -> colour; default matplotlib's cycle.
    title : str, optional
    tick_fontsize, legend_fontsize : float
    """
    import numpy as np

    xs = np.arange(len(groups))
    w = 0.8 / len(series)
    for j, (label, heights) in enumerate(series.items()):
        kw = {} if colors is None else {"color": colors[label]}
        ax.bar(xs + (j - (len(series) - 1) / 2) * w, heights, w, label=label, **kw)
    ax.set_yscale("log")
    plain_log_ticks(ax.yaxis)
    ax.set_xticks(xs, groups, **({} if tick_fontsize is None else {"fontsize": tick_fontsize}))
    ax.set_ylabel(ylabel)
    if title is not None:
        ax.set_title(title)
    ax.legend(fontsize=legend_fontsize)
    ax.grid(True, axis="y", which="both", alpha=0.3)


def hbars(ax, labels: list, values: list, *, xlabel: str, title: str, color: str) -> None:
    """One horizontal bar per label, top to bottom, on a linear axis."""
    import numpy as np

    y = np.arange(len(labels))
    ax.barh(y, values, color=color)
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)


def hbar_pairs(ax, labels: list, first: list, second: list, colors: list, *, names: tuple, xlabel: str,
               lines=()) -> None:
    """Two horizontal bars per label (the second hatched and faded), on a log x axis with plain
    labels, and vertical reference lines.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    labels : list of str
    first, second : list of float
        One value per label (NaN draws no bar).
    colors : list
        One colour per label.
    names : tuple of str
        Legend names of the first and the second bar.
    xlabel : str
    lines : sequence of (x, dict)
        Reference lines: position and ``axvline`` keywords (a ``label`` puts it in the legend).
    """
    import numpy as np

    y = np.arange(len(labels))
    ax.barh(y - 0.2, first, 0.4, color=colors, label=names[0])
    ax.barh(y + 0.2, second, 0.4, color=colors, alpha=0.45, hatch="//", label=names[1])
    for x, kw in lines:
        ax.axvline(x, **kw)
    ax.set_xscale("log")
    plain_log_ticks(ax.xaxis)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=7, loc="upper right")
    ax.grid(True, axis="x", which="both", alpha=0.3)


def survival(ax, hists: dict, edges_ns, colors: dict, *, quantiles=(0.5, 0.99, 0.999), ylim, xlim, xlabel: str,
             title: str, ylabel: str | None = None, legend: bool = False) -> None:
    """Latency distributions as survival curves (fraction of calls slower, 1 - CDF), each from
    histograms pooled over seeds, on log-log axes with the quantiles marked.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    hists : dict
        Candidate -> list of histograms (counts per bin of ``edges_ns``, one per seed); an empty
        list draws nothing.
    edges_ns : numpy.ndarray
        float64 ``(bins + 1,)``: bin edges in nanoseconds (drawn in µs at the bins' geometric
        centres).
    colors : dict
        Candidate -> colour.
    quantiles : tuple of float
        A grey line and label at 1 - q each.
    ylim, xlim : tuple of float
    xlabel, title : str
    ylabel : str, optional
    legend : bool
        A legend, when anything was drawn.
    """
    import numpy as np

    centers = np.sqrt(edges_ns[:-1] * edges_ns[1:]) / 1e3
    for n, hs in hists.items():
        if not hs:
            continue
        h = np.sum(hs, axis=0).astype(float)
        surv = 1 - np.cumsum(h) / h.sum()
        ax.step(centers, np.maximum(surv, 1e-7), where="post", color=colors[n], label=n)
    for q in quantiles:
        ax.axhline(1 - q, color="0.8", lw=0.8, zorder=0)
        ax.text(xlim[0] * 1.05, 1 - q, f"p{q * 100:g}", fontsize=7, color="0.4", va="bottom")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_ylim(*ylim)
    ax.set_xlim(*xlim)
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    if legend and ax.get_legend_handles_labels()[0]:
        ax.legend()


def bar_series(ax, ticks: tuple, series: list, *, title: str, title_fontsize: float = 9, ylabel: str | None = None,
               yscale: dict | None = None, hlines=(), legend: dict | None = None, tick_kw: dict | None = None,
               grid: dict | None = None) -> None:
    """Bars declared as series: each series one ``ax.bar`` call (positions, heights, width and
    its style: error bars, bottoms, colours, hatches, a label), drawn in order.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    ticks : tuple
        ``(positions, labels)`` of the x ticks.
    series : list of dict
        ``at`` (x positions), ``heights``, ``width``, and any further ``ax.bar`` keyword
        (``yerr``, ``bottom``, ``color``, ``alpha``, ``hatch``, ``edgecolor``, ``label``, ...).
    title : str
    title_fontsize : float
    ylabel : str, optional
    yscale : dict, optional
        ``ax.set_yscale`` keywords (e.g. ``{"value": "symlog", "linthresh": 1}``).
    hlines : sequence of (y, dict)
        Reference lines: height and ``axhline`` keywords (e.g. ``(1, {"color": "k"})`` for ratios
        to a reference).
    legend : dict, optional
        ``ax.legend`` keywords; a legend only when a bar carries a label.
    tick_kw : dict, optional
        Keywords of the tick labels (``rotation``, ``fontsize``).
    grid : dict, optional
        ``ax.grid`` keywords (no grid when None).
    """
    for sr in series:
        sr = dict(sr)
        ax.bar(sr.pop("at"), sr.pop("heights"), sr.pop("width"), **sr)
    for y, kw in hlines:
        ax.axhline(y, **kw)
    ax.set_xticks(*ticks, **(tick_kw or {}))
    if yscale is not None:
        ax.set_yscale(**yscale)
    if ylabel is not None:
        ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=title_fontsize)
    if grid is not None:
        ax.grid(True, **grid)
    if legend is not None and ax.get_legend_handles_labels()[0]:
        ax.legend(**legend)


def traces(ax, lines: list, *, xlabel: str, ylabel: str, legend: dict | None = None) -> None:
    """Lines over a run (one per seed, say), each ``(x, y, ax.plot keywords)``, drawn in order.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    lines : list of tuple
    xlabel, ylabel : str
    legend : dict, optional
        ``ax.legend`` keywords; a legend only when a line carries a label.
    """
    for x, y, kw in lines:
        ax.plot(x, y, **kw)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    if legend is not None and ax.get_legend_handles_labels()[0]:
        ax.legend(**legend)


def learning_curves(ax, x: list, curves: dict, *, title: str, xlabel: str = "environment step",
                    ylabel: str = "episodic return (mean ± std over seeds)") -> None:
    """Learning curves: per variant the mean over seeds, with a band of ± one std.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    x : list of float
        The curves' x (environment steps: the bins' centres).
    curves : dict
        Legend label -> ``(mean, std, line, band)``: ``mean`` and ``std`` one value per x, ``line``
        the ``ax.plot`` keywords (``lw``, ``ls``, ``color``), ``band`` the ``fill_between`` ones.
    title, xlabel, ylabel : str
    """
    import numpy as np

    for label, (m, s, line, band) in curves.items():
        m, s = np.asarray(m), np.asarray(s)
        ax.plot(x, m, label=label, **line)
        ax.fill_between(x, m - s, m + s, alpha=0.15, **band)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3)


def hbar_values(ax, labels: list, values: list, *, xlabel: str, xerr=None, color=None, vline=None,
                tick_labels: bool = True) -> None:
    """One horizontal bar per variant (a categorical axis, top to bottom), with error bars.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    labels : list of str
    values : list of float
    xlabel : str
    xerr : list of float, optional
    color : colour or list of colours, optional
        Default matplotlib's cycle.
    vline : tuple, optional
        ``(x, text)``: a dotted reference line, its text beside it at the top.
    tick_labels : bool
        False leaves the variants unnamed (a panel right of one that names them).
    """
    ax.barh(labels, values, **{k: v for k, v in (("xerr", xerr), ("color", color)) if v is not None})
    if vline is not None:
        ax.axvline(vline[0], color="k", ls=":", lw=1)
        ax.text(vline[0], len(labels) - 0.5, vline[1], fontsize=7, va="bottom", ha="right")
    ax.set_xlabel(xlabel)
    if not tick_labels:
        ax.set_yticklabels([])
    ax.invert_yaxis()


def hbar_stack(ax, labels: list, parts: dict, *, xlabel: str, legend: dict, vline: float | None = None,
               tick_labels: bool = True) -> None:
    """Horizontal bars of several parts stacked left to right per variant (where the time goes).

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    labels : list of str
    parts : dict
        Part -> one value per variant.
    xlabel : str
    legend : dict
        ``ax.legend`` keywords.
    vline : float, optional
        A dotted reference line.
    tick_labels : bool
        As for :func:`hbar_values`.
    """
    import numpy as np

    left = np.zeros(len(labels))
    for k, v in parts.items():
        v = np.asarray(v)
        ax.barh(labels, v, left=left, label=k)
        left += v
    if vline is not None:
        ax.axvline(vline, color="k", ls=":", lw=1)
    ax.set_xlabel(xlabel)
    if not tick_labels:
        ax.set_yticklabels([])
    ax.invert_yaxis()
    ax.legend(**legend)


def lines(ax, xs: list, series: list, *, xticks: list | None = None, ylim=None, yscale: str | None = None,
          grid_which: str = "major", title: str | None = None, title_fontsize: float = 9, ylabel: str | None = None,
          ylabel_fontsize: float | None = None, xlabel: str | None = None, legend: dict | None = None,
          hlines=()) -> None:
    """A metric over a parameter: one line per series, with error bars or without.

    Parameters
    ----------
    ax : matplotlib.axes.Axes
    xs : list of float
        Positions of the parameter's values.
    series : list of dict
        ``y`` (one value per x) and the ``ax.errorbar`` keywords (``yerr``, ``color``, ``marker``,
        ``label``, ...); with ``"plain": True``, an ``ax.plot`` line instead (a model, say).
    xticks : list of str, optional
        Labels of ``xs`` (default: ticks at ``xs``, labelled by matplotlib).
    ylim : tuple, optional
    yscale : str, optional
        E.g. ``"log"``.
    grid_which : str
        Grid lines at the ``"major"`` ticks or ``"both"``.
    title, ylabel, xlabel : str, optional
    title_fontsize, ylabel_fontsize : float
    legend : dict, optional
        ``ax.legend`` keywords (no legend when None).
    hlines : sequence of (y, dict)
        Reference lines: height and ``axhline`` keywords.
    """
    for sr in series:
        sr = dict(sr)
        y = sr.pop("y")
        if sr.pop("plain", False):
            ax.plot(xs, y, **sr)
        else:
            ax.errorbar(xs, y, **sr)
    for y, kw in hlines:
        ax.axhline(y, **kw)
    if yscale is not None:
        ax.set_yscale(yscale)
    ax.set_xticks(xs, *([] if xticks is None else [xticks]))
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.grid(True, which=grid_which, alpha=0.3)
    if title is not None:
        ax.set_title(title, fontsize=title_fontsize)
    if ylabel is not None:
        ax.set_ylabel(ylabel, **({} if ylabel_fontsize is None else {"fontsize": ylabel_fontsize}))
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    if legend is not None:
        ax.legend(**legend)


def scatter(ax, points: list, *, xlabel: str, ylabel: str, title: str, rings=(), vlines=(),
            keys: dict | None = None, legend: dict | None = None) -> None:
    """Points on log-log axes, a grid behind.

    Parameters
    ----------
    ax : matplotlib Axes
    points : list of tuple
        ``(x, y, color, marker)`` per point (size 30, alpha 0.8).
    xlabel, ylabel, title : str
    rings : sequence of tuple
        ``(x, y, label)``: points circled in red (a choice), labelled in the legend.
    vlines : sequence of tuple
        ``(x, style)``: vertical lines, ``style`` the keywords of ``axvline``.
    keys : dict, optional
        Legend entries that stand for no artist, ``label -> (color, marker)``; they replace the
        labelled artists in the legend.
    legend : dict, optional
        Keywords of ``ax.legend``; no legend when absent.
    """
    for x, y, color, marker in points:
        ax.scatter(x, y, c=color, marker=marker, s=30, alpha=0.8)
    for x, y, label in rings:
        ax.scatter([x], [y], s=220, facecolors="none", edgecolors="r", lw=2, label=label)
    for x, style in vlines:
        ax.axvline(x, **style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if legend is not None and keys:
        from matplotlib.lines import Line2D

        legend = {"handles": [Line2D([], [], color=c, marker=m, ls="", label=k) for k, (c, m) in keys.items()],
                  **legend}
    if legend is not None:
        ax.legend(**legend)


def grid_figure(out_dir: str, name: str, figsize: tuple, panels: list, *, suptitle: str, suptitle_fontsize: float,
                top: float, dpi: int = 110, **subplots) -> str:
    """A grid of panels (rows of ``panel(ax)`` callables), saved as ``out_dir/name``.

    Parameters
    ----------
    out_dir, name : str
    figsize : tuple of float
    panels : list of list of callable
        One list per row, one callable per column.
    suptitle : str
    suptitle_fontsize : float
    top : float
        Top of the panels' area, in figure fraction (room for the title).
    dpi : int
    **subplots
        Passed to ``plt.subplots`` (``sharex``, ``sharey``).

    Returns
    -------
    str
        ``name``.
    """
    fig, axes = pyplot().subplots(len(panels), len(panels[0]), figsize=figsize, squeeze=False, **subplots)
    for row, ax_row in zip(panels, axes):
        for panel, ax in zip(row, ax_row):
            panel(ax)
    fig.suptitle(suptitle, fontsize=suptitle_fontsize)
    fig.tight_layout(rect=(0, 0, 1, top))
    return save_figure(fig, out_dir, name, dpi=dpi)


def panels_figure(out_dir: str, name: str, figsize: tuple, panels: list, *, suptitle: str | None = None,
                  suptitle_fontsize: float | None = None, **subplots) -> str:
    """A row of panels, each drawn by ``panel(ax)``, saved as ``out_dir/name``.

    Parameters
    ----------
    out_dir, name : str
    figsize : tuple of float
    panels : list of callable
        One per axes, left to right (e.g. a generic kind with its data bound by ``functools.partial``).
    suptitle : str, optional
    suptitle_fontsize : float, optional
    **subplots
        Passed to ``plt.subplots`` (e.g. ``sharey=True``).

    Returns
    -------
    str
        ``name`` (for the report).
    """
    import numpy as np

    fig, axes = pyplot().subplots(1, len(panels), figsize=figsize, **subplots)
    for ax, panel in zip(np.atleast_1d(axes), panels):
        panel(ax)
    if suptitle is not None:
        fig.suptitle(suptitle, **({} if suptitle_fontsize is None else {"fontsize": suptitle_fontsize}))
    fig.tight_layout()
    return save_figure(fig, out_dir, name)


def save_figure(fig, out_dir: str, name: str, dpi: int = 110) -> str:
    """Save ``fig`` as ``out_dir/name``, close it, and return ``name`` (for the report)."""
    import matplotlib.pyplot as plt

    fig.savefig(os.path.join(out_dir, name), dpi=dpi)
    plt.close(fig)
    return name
