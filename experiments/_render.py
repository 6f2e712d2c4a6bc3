"""Report writing shared by the experiments: markdown tables built from data (:func:`md_table`;
:func:`table`, a table declared as columns over records; :func:`text_table` for the console),
number formatting, the "Machine and run" section of a report (:func:`markdown`,
:func:`write_report`), the machine bullet and provenance line, ratio crossings in words, and the
hand-written parts of a report (:func:`hand_written`).

A report is written from its ``results.json``: the code writes the tables, plots and the machine
section; conclusions and the prose of the method are written by hand in the full report's
``README.md``, between ``<!-- hand-written: NAME -->`` and ``<!-- end hand-written -->``, and kept
where they are when a rerun rewrites the report. A quick run's folder has none.

Standard library only; it imports no sibling module.
"""

from __future__ import annotations

import math
import os
import re

# -- the machine and run section --------------------------------------------------------------
def _mib(n) -> str:
    return "?" if n is None else f"{n / (1 << 20):.1f} MiB"


def _kib(n) -> str:
    if n is None:
        return "?"
    return f"{n >> 20} MiB" if n >= (1 << 20) and n % (1 << 20) == 0 else f"{n / 1024:g} KiB"


def markdown(run: dict) -> str:
    """A methodology / environment section (markdown) for a run dict from :meth:`RunRecord.finish`."""
    env = run["environment"]
    cpu, sw, osi, mem = env["cpu"], env["software"], env["os"], env["memory"]
    caches = ", ".join(f"L{c['level']}{'d' if c['type'] == 'Data' else 'i' if c['type'] == 'Instruction' else ''}"
                       f" {_kib(c['size_bytes'])} (CPUs {c['shared_cpu_list']})"
                       for c in cpu["caches_cpu0"]) or "unknown"
    git = sw["git"]
    commit = "not a git checkout" if git["commit"] is None else (
        git["commit"][:12] + (" (with uncommitted changes)" if git["dirty"] else ""))
    freq = cpu.get("frequency_mhz") or {}
    rows = [
        ("Run name", f"`{run['run_name']}`"),
        ("Mode / command", f"{run['mode']}: `{run['command']}`"),
        ("Seeds", ", ".join(map(str, run["seeds"]))),
        ("Started (UTC)", run["started_utc"]),
        ("Wall clock", f"{run['wall_clock_s']:.0f} s (process CPU {run['process_cpu_s']:.0f} s)"),
        ("CPU", f"{cpu['model']} ({cpu['architecture']}), {cpu['logical_cpus']} logical CPUs, "
                f"{cpu['physical_cores']} cores, {cpu['threads_per_core']} thread(s)/core"
                + (f", {freq.get('current'):.0f} MHz" if freq.get("current") else "")),
        ("Virtualisation", cpu["hypervisor"] or "none reported"),
        ("Caches (per instance, seen by CPU 0)", caches),
        ("SIMD", ", ".join(cpu["simd"]) or "?"),
        ("RAM", f"{_mib(mem['total_bytes'])} total, swap {_mib(mem['swap_total_bytes'])}"),
        ("OS / kernel", f"{osi['distribution'] or osi['system']}, kernel {osi['kernel']}"),
        ("Python / numpy / numba", f"{sw['python']} ({sw['python_implementation']}) / {sw['numpy']} / "
                                   f"{sw['numba']} (llvmlite {sw['llvmlite']})"),
        ("tfdata", f"{sw['tfdata']}, commit {commit}"),
        ("Load average (1, 5, 15 min) at start / end",
         f"{run['load_average_start']} / {run['load_average_end']}"),
        ("Machine busy / CPU steal during the run",
         "?" if run["machine_busy_fraction"] is None else
         f"{100 * run['machine_busy_fraction']:.0f}% / {100 * run['cpu_steal_fraction']:.1f}% of all CPU time"),
        ("Peak RSS (getrusage)", f"main process {_mib(run['peak_rss_bytes'])}"
                                 + ("" if run.get("child_peak_rss_bytes") is None else
                                    f", largest measurement child {_mib(run['child_peak_rss_bytes'])}")),
        ("Timer", f"`time.perf_counter_ns`, {run['timer_overhead_ns']:.0f} ns per back-to-back pair "
                  "(included in every per-call time, not subtracted)"),
    ]
    lines = ["| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def write_report(out_dir: str, lines: list, run: dict) -> str:
    """Write ``out_dir/README.md``: ``lines``, then the "Machine and run" section for ``run``."""
    path = os.path.join(out_dir, "README.md")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(list(lines) + ["## Machine and run\n", markdown(run)]))
    return path


# -- tables -----------------------------------------------------------------------------------
def md_table(header, rows, align: str, empty: str = " ") -> list[str]:
    """A markdown table built from data, so a report lists cells rather than hand-built lines.

    Parameters
    ----------
    header : sequence of str
        Column titles.
    rows : iterable of sequence
        One sequence of cells per row (``str`` is applied); an empty cell renders as ``| |``.
    align : str
        One letter per column: ``r`` right-aligned (numbers), anything else left.
    empty : str
        What an empty cell renders as between its bars.

    Returns
    -------
    list of str
        The header, the separator and one line per row, no blank line around them.
    """
    def line(cells):
        return "|" + "|".join(f" {c} " if c != "" else empty for c in map(str, cells)) + "|"

    return ([line(header), "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
            + [line(r) for r in rows])


def table(records, columns, empty: str = " ") -> list[str]:
    """A markdown table declared by its columns, one row per record (:func:`md_table`).

    Parameters
    ----------
    records : iterable
        One record (usually a dict of ``results.json``) per row.
    columns : sequence of tuple
        ``(header, align, cell)`` per column: ``align`` as for :func:`md_table`; ``cell`` a format
        string filled from the record (``"{median_us:.1f}"``, ``"{tiers[ram][calls]:,}"``) or a callable
        ``record -> value``.
    empty : str
        As for :func:`md_table`.

    Returns
    -------
    list of str
        As :func:`md_table`.
    """
    def cell(c, r):
        return c(r) if callable(c) else c.format_map(r)

    return md_table([h for h, _, _ in columns], [[cell(c, r) for _, _, c in columns] for r in records],
                    "".join(a for _, a, _ in columns), empty)


def text_table(header, rows) -> str:
    """A plain-text table for the console: columns as wide as their widest cell, the first
    left-aligned and the others right-aligned.

    Parameters
    ----------
    header : sequence of str
    rows : iterable of sequence
        Cells (``str`` is applied).

    Returns
    -------
    str
        Lines joined by newlines, a rule under the header.
    """
    rows = [[str(c) for c in r] for r in rows]
    w = [max(len(str(h)), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells):
        return "  ".join(c.ljust(w[0]) if i == 0 else c.rjust(w[i]) for i, c in enumerate(cells))

    return "\n".join([line([str(h) for h in header]), "-" * (sum(w) + 2 * len(w) - 2)]
                     + [line(r) for r in rows])


# -- numbers ----------------------------------------------------------------------------------
def fmt_bytes(n: float) -> str:
    """'1.5 GiB', '12.0 MiB', '3.0 KiB', '100 B'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_kib_mib(x: float) -> str:
    """'16 KiB' below a MiB, '9.0 MiB' from there."""
    return f"{x / 2**20:.1f} MiB" if x >= 2**20 else f"{x / 1024:.0f} KiB"


def fmt_us(x: float) -> str:
    """Microseconds with 3 significant digits at most ('1234', '56.7', '8.90'; NaN: '?')."""
    if math.isnan(x):
        return "?"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def fmt_rate(x: float) -> str:
    """A rate with a k/M/G suffix ('1.25M', '35k'; NaN: '?')."""
    if math.isnan(x):
        return "?"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f}{unit}" if x < 10 * scale else f"{x / scale:.0f}{unit}"
    return f"{x:.0f}"


def fmt_count(c: int) -> str:
    """A count such as a capacity: '1e6' for a power of ten, else thousands ('5k')."""
    e = int(round(math.log10(c)))
    return f"1e{e}" if 10 ** e == c else f"{c // 1000}k"


def fmt_sig(x, nd: int = 3) -> str:
    """``nd`` significant digits below 1000, thousands separators above; None: '-'."""
    if x is None:
        return "-"
    if x >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{nd}g}"


def fmt_axis(x: float, label: str) -> str:
    """A measured x in words, by its axis label: capacities as '5,000' / '100k' / '1M', data bytes as
    '76 B', anything else with 3 significant digits."""
    if label.startswith("capacity"):
        return f"{x:,.0f}" if x < 1e4 else f"{x / 1e3:,.0f}k" if x < 1e6 else f"{x / 1e6:.2g}M"
    if label.startswith("data bytes"):
        return f"{x:,.0f} B"
    return f"{x:.3g}"


# -- the machine bullet and provenance line ---------------------------------------------------
def sysfs_cache_bytes(machine: dict, level: int) -> int | None:
    """Size in bytes of the unified or data cache of ``level`` in a :func:`machine_brief`
    (None if not listed)."""
    for c in machine["caches_cpu0_sysfs"]:
        if c.get("level") == str(level) and c.get("type") in ("Unified", "Data"):
            sz = c.get("size", "")
            if sz.endswith("K"):
                return int(sz[:-1]) * 1024
            if sz.endswith("M"):
                return int(sz[:-1]) << 20
    return None


def run_cache_size(run: dict, level: int) -> int | None:
    """Size in bytes of the unified or data cache of ``level`` that CPU 0 saw in a run dict from
    :meth:`RunRecord.finish` (None if not recorded): a report rendered elsewhere speaks of the run's machine."""
    for c in run["environment"]["cpu"]["caches_cpu0"]:
        if c["level"] == level and c["type"] in ("Unified", "Data"):
            return c["size_bytes"]
    return None


def machine_bullet(machine: dict) -> str:
    """The "**Machine.**" bullet of a report's method section, from a :func:`machine_brief`:
    CPU, caches (sysfs and lscpu), OS and RAM."""
    l1, l2, l3 = (sysfs_cache_bytes(machine, lv) for lv in (1, 2, 3))
    ls = machine["lscpu"]
    size = lambda b: fmt_kib_mib(b) if b else "?"  # noqa: E731
    return (f"* **Machine.** {machine['cpu_model']}, {machine['logical_cpus']} logical CPUs, "
            f"{ls.get('Thread(s) per core', '?')} thread per core, virtual machine (hypervisor "
            f"{ls.get('Hypervisor vendor', 'none reported')}). Caches (sysfs, cpu0): L1d {size(l1)}, "
            f"L2 {size(l2)} per core, L3 {size(l3)} shared; lscpu totals: L1d {ls.get('L1d cache')}, "
            f"L2 {ls.get('L2 cache')}, L3 {ls.get('L3 cache')}; /proc/cpuinfo cache size "
            f"{machine['cpuinfo_cache_size']}; 64-byte lines. {machine['os']} {machine['kernel']}, "
            f"{machine['mem_total_bytes'] / 2**30:.1f} GiB RAM.")


def produced_by(mode: str, run_name: str, n_seeds: int, wall_s: float, started: str) -> str:
    """The start of a report's provenance line: which run, how many seeds, how long, when."""
    return (f"> Produced by the **{mode}** run `{run_name}` ({n_seeds} seed{'s' * (n_seeds != 1)}, "
            f"{wall_s:.0f} s wall clock, started {started}).")


# -- ratio crossings in words -----------------------------------------------------------------
def crossing_text(series: dict, names: dict, below_key: str) -> str:
    """One ratio curve's crossings of 1 in words (a report cell).

    Parameters
    ----------
    series : dict
        ``xs``, ``ys``, ``verdicts``, ``x_label`` and ``crossings`` (from :func:`crossings`).
    names : dict
        Verdict -> display name of the two candidates, e.g. ``{"soa": "SoA", "aos": "AoS"}``; the
        first is the one faster below a crossing whose ``below_key`` is True.
    below_key : str
        As given to :func:`crossings`.

    Returns
    -------
    str
        "**≈ x** (between a and b: ... faster below, ... above; verdicts ...)" per crossing, or
        "no crossover in the measured range (...)" saying who wins where.
    """
    fx = lambda v: fmt_axis(v, series["x_label"])  # noqa: E731
    first, second = names.values()
    if not series["crossings"]:
        vs = set(series["verdicts"])
        if len(vs) == 1 and vs <= set(names):
            who = f"{names[vs.pop()]} faster at every point"
        elif vs == {"tie"}:
            who = "ties at every point"
        else:
            ys = series["ys"]
            side = "above" if min(ys) > 1 else "below" if max(ys) < 1 else "on both sides of"
            who = f"ratio stays {side} 1; " + ", ".join(f"{fx(a)}: {v}" for a, v in
                                                        zip(series["xs"], series["verdicts"]))
        return f"no crossover in the measured range ({who})"
    parts = []
    for cr in series["crossings"]:
        lo, hi = cr["between"]
        below, above = (first, second) if cr[below_key] else (second, first)
        parts.append(f"**≈ {fx(cr['x'])}** (between {fx(lo)} and {fx(hi)}: {below} faster below, "
                     f"{above} above; verdicts {cr['verdicts'][0]} / {cr['verdicts'][1]}"
                     + ("" if cr["significant"] else "; one side is a tie, so within noise") + ")")
    return "; ".join(parts)


def crossing_summary(series_list: list) -> tuple[list, dict]:
    """Per dimension, how many ratio curves cross 1 and where (one line each).

    Parameters
    ----------
    series_list : list of dict
        Curves with ``dimension``, ``series`` (a name), ``x_label`` and ``crossings``.

    Returns
    -------
    tuple
        The lines, and ``{dimension: [curves]}`` in first-seen order.
    """
    by = {}
    for x in series_list:
        by.setdefault(x["dimension"], []).append(x)
    lines = []
    for dim, ss in by.items():
        found = {sig: [f"{x['series']} at ≈ {fmt_axis(cr['x'], x['x_label'])}" for x in ss
                       for cr in x["crossings"] if cr["significant"] == sig] for sig in (True, False)}
        txt = f"{dim}: {len(ss)} ratio curves, "
        if not found[True] and not found[False]:
            txt += "no crossover in the measured range"
        else:
            txt += (f"{len(found[True])} clear crossing(s) (a winner on each side): " + "; ".join(found[True])
                    if found[True] else "no clear crossing")
            txt += (f"; {len(found[False])} crossing(s) within noise (one side a tie): "
                    + "; ".join(found[False]) if found[False] else "")
        lines.append(txt)
    return lines, by


# -- cells of results.json --------------------------------------------------------------------
def pm(cell: dict, fmt: str = "{:.0f}", scale: float = 1.0) -> str:
    """``"mean ± std"`` of a summary cell ``{"mean": ..., "std": ...}`` (each scaled); "n/a" when
    its mean is None."""
    if cell.get("mean") is None:
        return "n/a"
    return (fmt + " ± " + fmt).format(cell["mean"] * scale, cell["std"] * scale)


def p_value(p) -> str:
    """A permutation test's p with two decimals; None (a single seed, nothing tested): "n/a (1 seed)"."""
    return "n/a (1 seed)" if p is None else f"{p:.2f}"


# -- hand-written parts -----------------------------------------------------------------------
def hand_written(out_dir: str, name: str) -> list[str]:
    """The hand-written block ``name`` of ``out_dir/README.md``, markers included, to put back when
    the report is rewritten.

    Parameters
    ----------
    out_dir : str
        The report's folder (read before the report is rewritten).
    name : str
        The block's name, as in ``<!-- hand-written: NAME -->`` (ends at ``<!-- end hand-written -->``).

    Returns
    -------
    list of str
        The block and a blank line; where the report has no such block (a quick run's folder, a
        new experiment), a line saying where the published report keeps it.
    """
    try:
        with open(os.path.join(out_dir, "README.md"), encoding="utf-8") as f:
            text = f.read()
    except OSError:
        text = ""
    m = re.search(r"<!-- hand-written: " + re.escape(name) + r" -->.*?<!-- end hand-written -->", text, re.S)
    if m:
        return [m.group(0), ""]
    return [f"*{name.capitalize()}: written by hand in the published report, "
            f"`reports/{os.path.basename(os.path.normpath(out_dir))}/README.md`.*", ""]
