"""Shared methodology for the experiments under ``experiments/``: what machine, what software,
what load, how long, how much memory.

An experiment does::

    from _methodology import RunRecord, write_json

    rec = RunRecord("layout", mode="quick", seeds=[0, 1, 2])   # snapshots machine + load
    ...                                                          # measure
    run = rec.finish()                                           # wall clock, load, peak RSS
    write_json("reports/layout/results.json", {"methodology": run, "results": ...})

The machine readers are best effort: a file or tool that cannot be read gives ``None``, never an
error, so an experiment runs the same on a laptop, a container or CI. Nothing recorded names a
path of the machine (no executable, working directory or cache locations), and the hostname is
not recorded.

Besides the run record, the plumbing experiments share, so that each experiment file holds only
its question, parameters, measured conditions and analysis: the ``--quick`` / ``--seeds`` command
line, the row kinds of the layout experiments (``ROW_KINDS``, random rows, filling buffers), timing
loops (per-call timing with an untimed setup, budgets, interleaved rounds, time-sliced candidates),
statistics across seeds (mean ± std, verdicts, ratio crossings and their sentences), memory
measurement in a forked process, number formatting, tables built from data (markdown and console),
the machine bullet and provenance line of a report, and matplotlib helpers (log axes, latency
lines, grouped bars, ratio curves with their crossings, column legends). numpy, psutil and
matplotlib are imported inside the functions that need them, so importing this module stays cheap.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import platform
import re
import resource
import subprocess
import sys
import time

#: Version of the JSON layout written by :func:`write_json`. Bump when a field changes meaning.
SCHEMA_VERSION = 1

_HERE = os.path.dirname(os.path.abspath(__file__))


def report_dir(name: str) -> str:
    """Where experiment ``name`` writes: ``reports/<name>/`` of this checkout, or
    ``$TFDATA_REPORTS_DIR/<name>/`` when that is set (``tfdata run --quick`` sets it to
    ``reports/quick``, so quick runs never replace a published report)."""
    base = os.environ.get("TFDATA_REPORTS_DIR") or os.path.join(os.path.dirname(_HERE), "reports")
    return os.path.join(base, name)


# -- small readers -------------------------------------------------------------------------------
def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _run(cmd: list[str], cwd: str | None = None, timeout: float = 10.0) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def _parse_size(text: str | None) -> int | None:
    """'32K' / '36608K' / '1 MiB' / '35.8 MiB' -> bytes."""
    if not text:
        return None
    m = re.match(r"\s*([\d.]+)\s*([KMG]?)(i?B)?", text.strip(), re.IGNORECASE)
    if not m:
        return None
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


# -- CPU ----------------------------------------------------------------------------------------
def cpu_caches() -> list[dict]:
    """Caches of CPU 0 from sysfs: level, type, size (bytes, per instance) and sharing CPUs."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    out = []
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith("index"))
    except OSError:
        return out
    for name in names:
        d = os.path.join(base, name)
        level, ctype, size = (_read(os.path.join(d, f)) for f in ("level", "type", "size"))
        shared = _read(os.path.join(d, "shared_cpu_list"))
        out.append({
            "level": int(level) if level and level.strip().isdigit() else None,
            "type": ctype.strip() if ctype else None,
            "size_bytes": _parse_size(size),
            "shared_cpu_list": shared.strip() if shared else None,
        })
    return out


def lscpu() -> dict:
    """``lscpu`` fields as a dict (empty when lscpu is missing). Flags are dropped (long)."""
    text = _run(["lscpu", "-J"])
    if text:
        try:
            rows = json.loads(text).get("lscpu", [])
            out = {}

            def walk(items):
                for r in items:
                    out[r["field"].rstrip(":")] = r.get("data")
                    walk(r.get("children", []))

            walk(rows)
            out.pop("Flags", None)
            return {k: v for k, v in out.items() if not k.startswith("Vulnerability")}
        except (ValueError, KeyError, TypeError):
            pass
    text = _run(["lscpu"])
    out = {}
    for line in (text or "").splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            if k != "Flags" and not k.startswith("Vulnerability"):
                out[k.strip()] = v.strip()
    return out


def cpu_info() -> dict:
    cpuinfo = _read("/proc/cpuinfo") or ""
    model = None
    cpuinfo_cache = None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if model is None and line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
        elif cpuinfo_cache is None and line.startswith("cache size"):
            cpuinfo_cache = line.split(":", 1)[1].strip()
        elif not flags and line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
    ls = lscpu()
    try:
        affinity = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    info = {
        "model": model or ls.get("Model name") or platform.processor() or None,
        "architecture": platform.machine(),
        "logical_cpus": os.cpu_count(),
        "physical_cores": None,
        "cpu_affinity": affinity,
        "threads_per_core": ls.get("Thread(s) per core"),
        "hypervisor": ls.get("Hypervisor vendor"),
        "simd": sorted(f for f in flags if f in ("sse4_2", "avx", "avx2", "avx512f", "avx512bw")),
        "caches_cpu0": cpu_caches(),
        "cpuinfo_cache_size": cpuinfo_cache,
        "lscpu_caches": {k: ls[k] for k in ("L1d cache", "L1i cache", "L2 cache", "L3 cache")
                         if k in ls},
        "frequency_mhz": None,
        "scaling_governor": (_read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
                             or "").strip() or None,
    }
    try:
        import psutil

        info["physical_cores"] = psutil.cpu_count(logical=False)
        f = psutil.cpu_freq()
        if f is not None:
            info["frequency_mhz"] = {"current": f.current, "min": f.min or None, "max": f.max or None}
    except Exception:  # psutil missing or unsupported platform
        pass
    return info


def cache_size(level: int) -> int | None:
    """Size in bytes of the unified or data cache of ``level`` seen by CPU 0 (None if unknown)."""
    for c in cpu_caches():
        if c["level"] == level and c["type"] in ("Unified", "Data"):
            return c["size_bytes"]
    return None


def cache_placement(nbytes: int) -> str:
    """Where ``nbytes`` of data fit in CPU 0's caches: "fits L2", "fits L3", "exceeds L3" or
    "cache size unknown"."""
    l2, l3 = cache_size(2), cache_size(3)
    if l2 and nbytes <= l2:
        return "fits L2"
    if l3 and nbytes <= l3:
        return "fits L3"
    return "exceeds L3" if l3 else "cache size unknown"


# -- software -----------------------------------------------------------------------------------
def _version(mod: str) -> str | None:
    try:
        m = __import__(mod)
        return getattr(m, "__version__", None)
    except Exception:
        return None


def git_info(directory: str = _HERE) -> dict:
    """Commit and dirty flag of the checkout holding ``directory``; None outside a git checkout."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd=directory)
    if commit is None:
        return {"commit": None, "dirty": None}
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=directory)
    return {"commit": commit.strip(), "dirty": bool(status.strip()) if status is not None else None}


def software_info() -> dict:
    env_names = sorted(k for k in os.environ if k.startswith(("NUMBA_", "TFDATA_", "OMP_", "MKL_")))
    return {
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "python_build": " ".join(platform.python_build()),
        "numpy": _version("numpy"),
        "numba": _version("numba"),
        "llvmlite": _version("llvmlite"),
        "psutil": _version("psutil"),
        "matplotlib": _version("matplotlib"),
        "tfdata": _version("tfdata"),
        "git": git_info(),
        # names only: values may be paths (NUMBA_CACHE_DIR); TFDATA_LAYOUT is a plain word
        "env_vars_set": env_names,
        "TFDATA_LAYOUT": os.environ.get("TFDATA_LAYOUT"),
        "TFDATA_ALLOCATOR": os.environ.get("TFDATA_ALLOCATOR"),
        # only where the experiment uses them (never imported here: torch alone takes seconds)
        "torch": getattr(sys.modules.get("torch"), "__version__", None),
        "gymnasium": getattr(sys.modules.get("gymnasium"), "__version__", None),
    }


def os_info() -> dict:
    release = _read("/etc/os-release") or ""
    pretty = None
    for line in release.splitlines():
        if line.startswith("PRETTY_NAME="):
            pretty = line.split("=", 1)[1].strip().strip('"')
    return {
        "system": platform.system(),
        "kernel": platform.release(),
        "distribution": pretty,
        "platform": platform.platform(),
    }


def memory_info() -> dict:
    try:
        import psutil

        vm = psutil.virtual_memory()
        return {"total_bytes": int(vm.total), "available_bytes": int(vm.available),
                "swap_total_bytes": int(psutil.swap_memory().total)}
    except Exception:
        return {"total_bytes": None, "available_bytes": None, "swap_total_bytes": None}


def collect_environment() -> dict:
    """CPU, caches, cores, RAM, OS/kernel and library versions, as one JSON-ready dict."""
    return {"cpu": cpu_info(), "memory": memory_info(), "os": os_info(), "software": software_info()}


def machine_brief() -> dict:
    """A compact machine description straight from /proc, sysfs and ``lscpu`` (raw strings).

    Returns
    -------
    dict
        ``cpu_model``, ``logical_cpus``, ``cpuinfo_cache_size``, ``caches_cpu0_sysfs`` (level,
        type, size, coherency_line_size and shared_cpu_list as sysfs writes them), ``lscpu`` (the
        cache, core and hypervisor fields), ``mem_total_bytes``, ``os``, ``kernel``, ``machine``.
    """
    cpuinfo = _read("/proc/cpuinfo") or ""
    model = cache = None
    for line in cpuinfo.splitlines():
        if model is None and line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
        if cache is None and line.startswith("cache size"):
            cache = line.split(":", 1)[1].strip()
    caches = []
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for name in sorted(os.listdir(base)):
            if name.startswith("index"):
                d = os.path.join(base, name)
                caches.append({k: (_read(os.path.join(d, k)) or "").strip()
                               for k in ("level", "type", "size", "coherency_line_size",
                                         "shared_cpu_list")})
    except OSError:
        pass
    ls = {}
    for line in (_run(["lscpu"]) or "").splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            if k.strip() in ("L1d cache", "L2 cache", "L3 cache", "Hypervisor vendor",
                             "Thread(s) per core", "Core(s) per socket", "Model name"):
                ls[k.strip()] = v.strip()
    mem = _read("/proc/meminfo") or ""
    total_mem = next((int(x.split()[1]) * 1024 for x in mem.splitlines()
                      if x.startswith("MemTotal")), None)
    return {"cpu_model": model, "logical_cpus": os.cpu_count(), "cpuinfo_cache_size": cache,
            "caches_cpu0_sysfs": caches, "lscpu": ls, "mem_total_bytes": total_mem,
            "os": platform.system(), "kernel": platform.release(), "machine": platform.machine()}


# -- load ---------------------------------------------------------------------------------------
def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


def _cpu_ticks() -> list[int] | None:
    """Aggregate ``cpu`` line of /proc/stat: user nice system idle iowait irq softirq steal ..."""
    text = _read("/proc/stat")
    if not text:
        return None
    first = text.splitlines()[0].split()
    return [int(x) for x in first[1:]] if first and first[0] == "cpu" else None


def _busy_shares(t0: list[int] | None, t1: list[int] | None) -> dict:
    if not t0 or not t1:
        return {"busy_fraction": None, "steal_fraction": None}
    d = [b - a for a, b in zip(t0, t1)]
    total = sum(d[:8]) or 1
    idle = d[3] + (d[4] if len(d) > 4 else 0)
    steal = d[7] if len(d) > 7 else 0
    return {"busy_fraction": round(1 - idle / total, 4), "steal_fraction": round(steal / total, 4)}


def peak_rss_bytes() -> int:
    """Peak resident set size of this process (``getrusage(RUSAGE_SELF).ru_maxrss``), in bytes.

    ``RUSAGE_CHILDREN`` is deliberately not used: on Linux a child started with vfork + exec
    (what ``subprocess`` does) inherits the parent's peak, so it reports the parent's figure.
    Experiments that measure in child processes report those children's own peaks instead.
    """
    scale = 1 if sys.platform == "darwin" else 1024  # Linux reports KiB, macOS bytes
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def timer_overhead_ns(n: int = 20000) -> float:
    """Median cost of two back-to-back ``perf_counter_ns`` calls (what every timed call includes)."""
    pc = time.perf_counter_ns
    d = []
    for _ in range(n):
        a = pc()
        d.append(pc() - a)
    d.sort()
    return float(d[len(d) // 2])


# -- one run ------------------------------------------------------------------------------------
class RunRecord:
    """Snapshots the environment and load at creation; :meth:`finish` adds the end state."""

    def __init__(self, experiment: str, *, mode: str, seeds: list[int], command: str,
                 run_name: str | None = None, parameters: dict | None = None):
        self.experiment = experiment
        self.mode = mode
        self.seeds = list(seeds)
        self.command = command
        self.parameters = parameters or {}
        self.start_unix = time.time()
        self.run_name = run_name or (f"{experiment}__{mode}__seeds{'-'.join(map(str, seeds))}"
                                     f"__{int(self.start_unix)}")
        self._t0 = time.perf_counter()
        self._cpu0 = _cpu_ticks()
        self._proc0 = os.times()
        self.load_start = load_average()
        self.environment = collect_environment()
        self.timer_overhead_ns = timer_overhead_ns()

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    def finish(self, *, child_peak_rss_bytes: int | None = None) -> dict:
        """End of the run. ``child_peak_rss_bytes``: largest peak RSS reported by the experiment's
        own child processes, if it used any."""
        wall = time.perf_counter() - self._t0
        proc = os.times()
        shares = _busy_shares(self._cpu0, _cpu_ticks())
        return {
            "experiment": self.experiment,
            "run_name": self.run_name,
            "mode": self.mode,
            "command": self.command,
            "seeds": self.seeds,
            "parameters": self.parameters,
            "started_utc": _dt.datetime.fromtimestamp(self.start_unix, _dt.timezone.utc)
                           .isoformat(timespec="seconds"),
            "wall_clock_s": round(wall, 2),
            "process_cpu_s": round((proc.user - self._proc0.user) + (proc.system - self._proc0.system)
                                   + (proc.children_user - self._proc0.children_user)
                                   + (proc.children_system - self._proc0.children_system), 2),
            "load_average_start": self.load_start,
            "load_average_end": load_average(),
            "machine_busy_fraction": shares["busy_fraction"],
            "cpu_steal_fraction": shares["steal_fraction"],
            "peak_rss_bytes": peak_rss_bytes(),
            "child_peak_rss_bytes": child_peak_rss_bytes,
            "timer_overhead_ns": self.timer_overhead_ns,
            "environment": self.environment,
        }


def write_json(path: str, payload: dict) -> None:
    """Write ``payload`` as JSON with ``schema_version`` first (numpy scalars become numbers)."""
    def default(o):
        if hasattr(o, "item"):
            return o.item()
        if hasattr(o, "tolist"):
            return o.tolist()
        raise TypeError(f"not JSON serialisable: {type(o).__name__}")

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"schema_version": SCHEMA_VERSION, **payload}, f, indent=1, default=default)
        f.write("\n")
    os.replace(tmp, path)


# -- markdown -----------------------------------------------------------------------------------
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


def md_table(header, rows, align: str) -> list[str]:
    """A markdown table built from data, so a report lists cells rather than hand-built lines.

    Parameters
    ----------
    header : sequence of str
        Column titles.
    rows : iterable of sequence
        One sequence of cells per row (``str`` is applied); an empty cell renders as ``| |``.
    align : str
        One letter per column: ``r`` right-aligned (numbers), anything else left.

    Returns
    -------
    list of str
        The header, the separator and one line per row, no blank line around them.
    """
    def line(cells):
        return "|" + "|".join(f" {c} " if c != "" else " " for c in map(str, cells)) + "|"

    return ([line(header), "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"]
            + [line(r) for r in rows])


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


def fmt_kib_mib(x: float) -> str:
    """'16 KiB' below a MiB, '9.0 MiB' from there."""
    return f"{x / 2**20:.1f} MiB" if x >= 2**20 else f"{x / 1024:.0f} KiB"


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


# -- command line -------------------------------------------------------------------------------
def seeds_parser(doc: str, quick_help: str, seeds_help: str, *, raw: bool = True):
    """The command line every experiment shares: ``--quick`` and ``--seeds``.

    Parameters
    ----------
    doc : str
        The experiment's module docstring; its first paragraph is the description.
    quick_help, seeds_help : str
        Help texts of ``--quick`` and ``--seeds``.
    raw : bool
        Keep the description's line breaks in ``--help`` (``RawDescriptionHelpFormatter``).

    Returns
    -------
    argparse.ArgumentParser
        A parser an experiment may extend before ``parse_args``.
    """
    import argparse

    kw = {"formatter_class": argparse.RawDescriptionHelpFormatter} if raw else {}
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0], **kw)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--seeds", default=None, help=seeds_help)
    return ap


def parse_seeds(text: str | None, default: int) -> list[int]:
    """Seeds from ``--seeds``: a count N (seeds 0..N-1) or a comma list.

    Parameters
    ----------
    text : str or None
        The option's value; None gives ``range(default)``.
    default : int
        Number of seeds when the option is absent.

    Returns
    -------
    list of int

    Raises
    ------
    SystemExit
        When a count below 1 is given.
    """
    if text is None:
        return list(range(default))
    if "," in text:
        return [int(s) for s in text.split(",") if s.strip()]
    n = int(text)
    if n < 1:
        raise SystemExit("--seeds: need at least one seed")
    return list(range(n))


# -- rows and buffers ---------------------------------------------------------------------------
#: The row kinds the layout experiments share (``tfdata.Spec(ROW_KINDS[kind])``), smallest first.
ROW_KINDS = {
    # 2 scalar fields: 12 bytes of data, 16-byte AoS record (rounded up to 8-byte words)
    "tiny": {"action": "i8", "reward": "f4"},
    # a CartPole-v1 transition
    "cartpole": {"obs": ("f4", (4,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (4,)),
                 "terminated": "?", "truncated": "?"},
    # a 64-float observation (MuJoCo-like state)
    "medium": {"obs": ("f4", (64,)), "action": "i8", "reward": "f4", "next_obs": ("f4", (64,)),
               "terminated": "?", "truncated": "?"},
    # an Atari frame stack, obs and next_obs stored (as a naive DQN buffer does)
    "image": {"obs": ("u1", (4, 84, 84)), "action": "i8", "reward": "f4",
              "next_obs": ("u1", (4, 84, 84)), "terminated": "?", "truncated": "?"},
}


def make_chunk(spec, n: int, rng, flag_p=None) -> dict:
    """``n`` random rows of ``spec``, one array per field, exact dtypes.

    Parameters
    ----------
    spec : tfdata.Spec
    n : int
    rng : numpy.random.Generator
    flag_p : dict, optional
        Probability of True per bool field (default 0.05 for every one).

    Returns
    -------
    dict
        Field name -> array of shape ``(n, *field.shape)`` and the field's dtype: floats
        standard normal, uint8 uniform over 0..255, other integers in 0..3.
    """
    import numpy as np

    out = {}
    for f in spec:
        shape = (n,) + f.shape
        if f.dtype.kind == "f":
            out[f.name] = rng.standard_normal(shape, dtype=np.float32).astype(f.dtype, copy=False)
        elif f.dtype.kind == "b":
            out[f.name] = rng.random(shape) < (flag_p or {}).get(f.name, 0.05)
        elif f.dtype == np.uint8:
            out[f.name] = rng.integers(0, 256, shape, dtype=np.uint8)
        else:
            out[f.name] = rng.integers(0, 4, shape).astype(f.dtype)
    return out


def fill(buf, chunk: dict, capacity: int) -> None:
    """Fill ``buf`` with ``capacity`` rows: ``extend(chunk)`` repeated, then the part that is left."""
    n = len(next(iter(chunk.values())))
    for _ in range(capacity // n):
        buf.extend(chunk)
    rest = capacity % n
    if rest:
        buf.extend({k: v[:rest] for k, v in chunk.items()})


def build_filled(keys, make, chunk: dict, capacity: int, fill_rates: dict | None = None) -> dict:
    """``{key: make(key)}`` each filled to ``capacity`` (:func:`fill`), built in the order of
    ``keys``; the first fill's time (build + fill, page faults included) goes to
    ``fill_rates[key]`` (``seconds``, ``rows_per_s``)."""
    import gc

    bufs = {}
    for key in keys:
        gc.collect()
        t0 = time.perf_counter()
        bufs[key] = buf = make(key)
        fill(buf, chunk, capacity)
        dt = time.perf_counter() - t0
        if fill_rates is not None:
            fill_rates[key] = {"seconds": dt, "rows_per_s": capacity / dt}
        assert len(buf) == capacity
    return bufs


# -- timing -------------------------------------------------------------------------------------
def time_calls(fn, arg, n: int, setup=None):
    """Wall time of each of ``n`` calls ``fn(arg)``, timed one by one.

    Parameters
    ----------
    fn : callable
        Called with one argument.
    arg : object
        Its argument (the same every call).
    n : int
        Number of calls.
    setup : callable, optional
        ``setup(arg)`` before each call, not timed (e.g. writes whose cost a read then pays).

    Returns
    -------
    numpy.ndarray
        int64 nanoseconds per call (``time.perf_counter_ns``; the timer's own cost included, as
        a caller sees it).
    """
    import numpy as np

    out = np.empty(n, dtype=np.int64)
    pc = time.perf_counter_ns
    for i in range(n):
        if setup is not None:
            setup(arg)
        t0 = pc()
        fn(arg)
        out[i] = pc() - t0
    return out


def calls_for_budget(fn, arg, budget_s: float, lo: int, hi: int, warmup: int, setup=None) -> int:
    """Warm ``fn(arg)`` up with ``warmup`` calls and size a measurement to a time budget.

    Parameters
    ----------
    fn, arg, setup
        As for :func:`time_calls`.
    budget_s : float
        Seconds the measurement should take.
    lo, hi : int
        Bounds on the number of calls (``lo`` wins for slow calls, ``hi`` for fast ones).
    warmup : int
        Untimed calls first; their median estimates the cost of one call.

    Returns
    -------
    int
        Number of calls to time.
    """
    import numpy as np

    est = float(np.median(time_calls(fn, arg, warmup, setup)))
    return int(min(hi, max(lo, budget_s * 1e9 / max(est, 1.0))))


def latency_stats(ns) -> dict:
    """Summary of per-call times.

    Parameters
    ----------
    ns : array_like
        Nanoseconds per call.

    Returns
    -------
    dict
        ``n`` and the median, p99, mean, std, min, p10 and p90 in microseconds (``*_us``).
    """
    import numpy as np

    us = np.asarray(ns) / 1e3
    return {"n": int(len(us)), "median_us": float(np.median(us)), "p99_us": float(np.percentile(us, 99)),
            "mean_us": float(us.mean()), "std_us": float(us.std()), "min_us": float(us.min()),
            "p10_us": float(np.percentile(us, 10)), "p90_us": float(np.percentile(us, 90))}


def rotated(seq, k: int) -> list:
    """``seq`` as a list rotated left by ``k`` (modulo its length): a different order per seed."""
    seq = list(seq)
    k %= len(seq)
    return seq[k:] + seq[:k]


def interleaved_latencies(calls: dict, args, *, budget_s: float, lo: int, hi: int, rounds: int,
                          warmup: int, setups: dict | None = None) -> dict:
    """Per-call latency of several callables, alternating them in rounds.

    Each callable gets its own number of calls (:func:`calls_for_budget`), split evenly over
    ``rounds``; in round r the callables run in their order rotated by r. Interleaving makes a
    change of machine load hit every candidate alike, so their ratios stay fair on a shared host.

    Parameters
    ----------
    calls : dict
        Name -> ``fn(arg)``; the dict order is the order of round 0.
    args : iterable
        Arguments measured one after another (e.g. batch sizes).
    budget_s, lo, hi, warmup
        As for :func:`calls_for_budget`, per (callable, argument).
    rounds : int
        Number of rounds.
    setups : dict, optional
        Name -> ``setup(arg)`` run untimed before each of that callable's calls (warm-up
        included); see :func:`time_calls`.

    Returns
    -------
    dict
        ``{arg: {name: latency_stats}}``.
    """
    import numpy as np

    keys = list(calls)
    out = {}
    for a in args:
        setup = (setups or {}).get
        counts = {k: calls_for_budget(calls[k], a, budget_s, lo, hi, warmup, setup(k)) for k in keys}
        parts = {k: [] for k in keys}
        for r in range(rounds):
            for k in rotated(keys, r):
                n = counts[k] // rounds + (1 if r < counts[k] % rounds else 0)
                parts[k].append(time_calls(calls[k], a, n, setup(k)))
        out[a] = {k: latency_stats(np.concatenate(parts[k])) for k in keys}
    return out


@contextlib.contextmanager
def gc_paused():
    """Collect garbage, then keep the collector off inside the block (a collection would land in
    whichever call is being timed)."""
    import gc

    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class SliceTimer:
    """A callable timed in time-budgeted slices, cycling through pre-built argument tuples.

    Parameters
    ----------
    fn : callable
        The timed function, called as ``fn(*arglist[i])``.
    arglist : list of tuple
        Arguments used in turn (so every call sees fresh data, and no call builds any).
    per_call : int
        Units of work per call; each recorded time is divided by it (time per unit).
    warmup : int
        Untimed calls at the start of every slice (caches and branch predictors refilled after
        the other candidates ran).
    min_calls : int
        Timed calls per slice even when the budget is exhausted.
    """

    def __init__(self, fn, arglist, per_call: int, *, warmup: int, min_calls: int):
        self.fn, self.arglist, self.per_call = fn, arglist, per_call
        self.warmup, self.min_calls = warmup, min_calls
        self.next = 0
        self.times_ns: list[float] = []

    def run_slice(self, budget_ns: int) -> None:
        """Time calls for ``budget_ns`` nanoseconds (at least ``min_calls``), appending to
        ``times_ns``."""
        fn, args, n, i = self.fn, self.arglist, len(self.arglist), self.next
        for _ in range(self.warmup):
            fn(*args[i % n])
            i += 1
        pc = time.perf_counter_ns
        out = self.times_ns
        scale = 1.0 / self.per_call
        end = pc() + budget_ns
        count = 0
        while count < self.min_calls or pc() < end:
            a = args[i % n]
            t0 = pc()
            fn(*a)
            out.append((pc() - t0) * scale)
            i += 1
            count += 1
        self.next = i


def run_rounds(timers: list, rounds: int, budget_ns: int, shift) -> None:
    """Run every :class:`SliceTimer` once per round, in an order that changes every round.

    Round r starts at timer ``shift(r) % len(timers)`` and odd rounds run backwards (A B C, then
    C B A), so drift of the machine during a round hits all candidates alike. The garbage
    collector is off meanwhile (a collection would land in one candidate's time).

    Parameters
    ----------
    timers : list of SliceTimer
    rounds : int
    budget_ns : int
        Slice budget per timer per round.
    shift : callable
        ``shift(r) -> int``, the rotation of round r.
    """
    import gc

    gc.disable()
    try:
        for rnd in range(rounds):
            s = shift(rnd) % len(timers)
            order = timers[s:] + timers[:s]
            if rnd % 2:
                order.reverse()
            for t in order:
                t.run_slice(budget_ns)
    finally:
        gc.enable()


def block_size(fn, make_args, target_s: float, max_m: int) -> int:
    """Units of work per call so that one call of ``fn`` takes about ``target_s``.

    Parameters
    ----------
    fn : callable
    make_args : callable
        ``make_args(start, m)`` -> argument tuple for m units of work.
    target_s : float
        Wanted seconds per call.
    max_m : int
        Upper bound (the pre-drawn data available).

    Returns
    -------
    int
        A power of two (so blocks tile pre-drawn rows of a power-of-two count).
    """
    m0 = 16
    a = make_args(0, m0)
    fn(*a)  # compile / load first
    t0 = time.perf_counter()
    fn(*a)
    per = max((time.perf_counter() - t0) / m0, 1e-8)
    m = int(min(max_m, max(1, round(target_s / per))))
    return 1 << int(math.log2(m))


# -- statistics ---------------------------------------------------------------------------------
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


def run_in_fresh_processes(script: str, variants: list, seeds: list, args: list, *, timeout_s: float,
                           describe, log) -> list[dict]:
    """Run every (variant, seed) as ``python script --worker VARIANT --seed SEED *args`` in a
    fresh process (its own peak memory, no shared caches), one thread for BLAS/OpenMP, the
    order of the variants rotated seed by seed (no variant always first or last). A worker
    prints one line ``RESULT <json>``; the dicts are returned, each with ``process_s``.
    ``describe(result) -> str`` makes the log line after the variant and seed; ``log(str)``
    prints it. SystemExit with the worker's stderr when one fails."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    runs = []
    for k, seed in enumerate(seeds):
        for variant in variants[k % len(variants):] + variants[:k % len(variants)]:
            cmd = [sys.executable, os.path.abspath(script), "--worker", variant, "--seed", str(seed), *args]
            t0 = time.perf_counter()
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
            if out.returncode != 0:
                raise SystemExit(f"worker {variant} seed {seed} failed:\n{out.stderr[-4000:]}")
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
            r = json.loads(line[len("RESULT "):])
            r["process_s"] = time.perf_counter() - t0
            runs.append(r)
            log(f"{variant:<26} seed {seed}: {describe(r)} ({r['process_s']:.0f} s)")
    return runs


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


def gmean(xs) -> float:
    """Geometric mean (the average of ratios that treats 2x and 0.5x symmetrically)."""
    import numpy as np

    return float(np.exp(np.mean(np.log(xs))))


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


def fmt_axis(x: float, label: str) -> str:
    """A measured x in words, by its axis label: capacities as '5,000' / '100k' / '1M', data bytes as
    '76 B', anything else with 3 significant digits."""
    if label.startswith("capacity"):
        return f"{x:,.0f}" if x < 1e4 else f"{x / 1e3:,.0f}k" if x < 1e6 else f"{x / 1e6:.2g}M"
    if label.startswith("data bytes"):
        return f"{x:,.0f} B"
    return f"{x:.3g}"


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


# -- memory -------------------------------------------------------------------------------------
def rss_bytes() -> int:
    """Current resident set size of this process (psutil), in bytes."""
    import psutil

    return psutil.Process().memory_info().rss


def fresh_pages_allocator() -> bool:
    """Make every allocation above 4 KiB a fresh mmap (glibc only), so RSS growth is the buffer's.

    Without this, a forked child reuses heap memory its parent already touched and freed, and a
    small buffer shows no RSS growth at all.

    Returns
    -------
    bool
        False where it cannot be done (not glibc).
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim(0)
        return libc.mallopt(-3, 4096) == 1  # M_MMAP_THRESHOLD: fixed, no dynamic raising
    except (OSError, AttributeError):
        return False


def _forked_child(conn, fn, args):
    try:
        conn.send(fn(*args))
    except BaseException as exc:  # report, never hang the parent
        conn.send({"error": repr(exc)})
    finally:
        conn.close()


def run_forked(fn, *args) -> dict:
    """``fn(*args)`` in a fresh forked process, so what it allocates starts from a clean slate.

    Parameters
    ----------
    fn : callable
        Returns a picklable dict.
    *args
        Its arguments (not pickled: the child is a fork).

    Returns
    -------
    dict
        ``fn``'s dict (or ``{"error": repr}`` if it raised) plus ``process``: "fresh forked
        process", or "in-process" where fork is unavailable (less clean; errors then propagate).
    """
    import multiprocessing

    try:
        ctx = multiprocessing.get_context("fork")
    except ValueError:
        out = fn(*args)
        out["process"] = "in-process"
        return out
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_forked_child, args=(child, fn, args))
    p.start()
    child.close()
    out = parent.recv()
    p.join()
    out["process"] = "fresh forked process"
    return out


# -- formatting ---------------------------------------------------------------------------------
def fmt_bytes(n: float) -> str:
    """'1.5 GiB', '12.0 MiB', '3.0 KiB', '100 B'."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


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


# -- plots --------------------------------------------------------------------------------------
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


# -- real Atari transitions ---------------------------------------------------------------------
#: The extra that brings what :func:`atari_transitions` needs.
ATARI_EXTRA = "atari"


def atari_env_id(game: str) -> str:
    """``"ALE/<Game>-v5"`` from a game name given in any case (``"breakout"`` -> Breakout)."""
    name = game[4:] if game.startswith("ALE/") else game
    name = name.split("-v")[0]
    return f"ALE/{name[:1].upper()}{name[1:]}-v5"


def make_atari_env(game: str, *, stack: int = 4, padding_type="reset", frame_skip: int = 4,
                   screen_size: int = 84, noop_max: int = 30, repeat_action_probability: float = 0.25,
                   max_episode_steps: int | None = None, terminal_on_life_loss: bool = False):
    """One Atari environment with DQN's preprocessing, as gymnasium documents it.

    ``gymnasium.make("ALE/<Game>-v5", frameskip=1, repeat_action_probability=...)`` (the ALE
    skips no frame itself: :class:`~gymnasium.wrappers.AtariPreprocessing` does, with the max over
    the last two frames), then ``AtariPreprocessing(frame_skip, screen_size, grayscale_obs=True,
    noop_max, terminal_on_life_loss)``, then, when ``max_episode_steps`` is given, a
    ``TimeLimit`` counted in agent steps (after the frame skip), then
    ``FrameStackObservation(stack, padding_type=...)``.

    Parameters
    ----------
    game : str
        ``"Breakout"``, ``"pong"``, ``"ALE/Seaquest-v5"``...
    stack : int
        Frames per observation.
    padding_type : str or array
        ``FrameStackObservation``'s: "reset" repeats the first frame of an episode, "zero" pads
        with zeros.
    frame_skip, screen_size, noop_max, terminal_on_life_loss
        ``AtariPreprocessing``'s.
    repeat_action_probability : float
        Sticky actions (0.25 is the v5 default).
    max_episode_steps : int, optional
        Truncate episodes after this many agent steps (None: the v5 limit of 108,000 frames).

    Returns
    -------
    gymnasium.Env
        Observations uint8 of shape ``(stack, screen_size, screen_size)``.

    Raises
    ------
    ImportError
        When gymnasium, ale_py or OpenCV is missing, naming the extra that installs them.
    """
    try:
        import ale_py
        import cv2  # noqa: F401  (AtariPreprocessing's resize)
        import gymnasium as gym
    except ImportError as exc:
        raise ImportError(f"real Atari frames need the {ATARI_EXTRA!r} extra (gymnasium, ale-py, "
                          f"opencv-python-headless): pip install -e '.[{ATARI_EXTRA}]' ({exc})") from exc
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, TimeLimit

    gym.register_envs(ale_py)
    env = gym.make(atari_env_id(game), frameskip=1, repeat_action_probability=repeat_action_probability)
    env = AtariPreprocessing(env, noop_max=noop_max, frame_skip=frame_skip, screen_size=screen_size,
                             terminal_on_life_loss=terminal_on_life_loss, grayscale_obs=True)
    if max_episode_steps is not None:
        env = TimeLimit(env, max_episode_steps)
    return FrameStackObservation(env, stack, padding_type=padding_type)


def atari_transitions(game: str, steps: int, *, num_envs: int = 1, seed: int = 0, epsilon: float = 1.0,
                      stack: int = 4, padding_type="reset", frame_skip: int = 4, screen_size: int = 84,
                      noop_max: int = 30, repeat_action_probability: float = 0.25,
                      max_episode_steps: int | None = None, frames_only: bool = False) -> dict:
    """Real Atari transitions, exactly as the environments gave them.

    ``num_envs`` environments of :func:`make_atari_env` in a ``gymnasium.vector.SyncVectorEnv``
    with ``autoreset_mode=SAME_STEP``: an environment whose episode ends (terminated or truncated)
    is reset within the same step, its last observation taken from ``info["final_obs"]``. So
    ``next_obs[t]`` is the observation that followed ``obs[t]`` (the final one at an episode's
    end), and ``obs[t + 1]`` is ``next_obs[t]`` except after an episode's end, where it is the
    first observation of the next episode (its earlier frames padded as ``padding_type`` says).

    The policy: with probability ``epsilon`` a uniformly random action, else a fixed action drawn
    once per environment (``epsilon=1``: the random policy). Environment ``i`` is seeded with
    ``seed + i``, the policy with ``seed``: the same arguments give the same arrays.

    Parameters
    ----------
    game : str
        E.g. ``"Breakout"``, ``"Pong"`` (see :func:`atari_env_id`).
    steps : int
        Vector steps T (``T * num_envs`` transitions).
    num_envs : int
        E, environments stepped together.
    seed : int
    epsilon : float
        Probability of a random action, in [0, 1].
    stack, padding_type, frame_skip, screen_size, noop_max, repeat_action_probability, max_episode_steps
        As for :func:`make_atari_env`; a small ``max_episode_steps`` forces truncations.
    frames_only : bool
        Keep only the newest frame of ``obs`` and ``next_obs`` (``stack`` times less memory: a
        stream of frames for compression measurements).

    Returns
    -------
    dict
        ``obs``: uint8 ``(T, [E,] stack, S, S)`` (``(T, [E,] S, S)`` with ``frames_only``; the E
        axis only when ``num_envs > 1``; S = ``screen_size``), ``next_obs`` the same,
        ``action``: int64 ``(T, [E])``, ``reward``: float32 ``(T, [E])`` (unclipped),
        ``terminated``, ``truncated``: bool ``(T, [E])``; and ``num_actions`` (int) and ``env_id``
        (str).
    """
    if steps < 1 or num_envs < 1:
        raise ValueError(f"steps and num_envs: expected >= 1, got steps={steps}, num_envs={num_envs}")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon: expected a probability in [0, 1], got {epsilon}")
    import gymnasium as gym
    import numpy as np

    kw = dict(stack=stack, padding_type=padding_type, frame_skip=frame_skip, screen_size=screen_size,
              noop_max=noop_max, repeat_action_probability=repeat_action_probability,
              max_episode_steps=max_episode_steps)
    make_atari_env(game, **kw).close()  # a clear ImportError before the vector env hides it
    envs = gym.vector.SyncVectorEnv([lambda: make_atari_env(game, **kw) for _ in range(num_envs)],
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    try:
        n_actions = int(envs.single_action_space.n)
        obs_shape = (screen_size, screen_size) if frames_only else (stack, screen_size, screen_size)
        out = {"obs": np.empty((steps, num_envs, *obs_shape), np.uint8),
               "next_obs": np.empty((steps, num_envs, *obs_shape), np.uint8),
               "action": np.empty((steps, num_envs), np.int64),
               "reward": np.empty((steps, num_envs), np.float32),
               "terminated": np.empty((steps, num_envs), bool),
               "truncated": np.empty((steps, num_envs), bool)}
        keep = (lambda o: o[..., -1, :, :]) if frames_only else (lambda o: o)
        rng = np.random.default_rng(seed)
        fixed = rng.integers(n_actions, size=num_envs)
        obs, _ = envs.reset(seed=seed)
        for t in range(steps):
            explore = rng.random(num_envs) < epsilon
            action = np.where(explore, rng.integers(n_actions, size=num_envs), fixed)
            nxt, reward, terminated, truncated, info = envs.step(action)
            out["obs"][t] = keep(obs)
            out["next_obs"][t] = keep(nxt)
            done = terminated | truncated
            for i in np.flatnonzero(done):  # the episode's last observation, before the reset
                out["next_obs"][t, i] = keep(info["final_obs"][i])
            out["action"][t], out["reward"][t] = action, reward
            out["terminated"][t], out["truncated"][t] = terminated, truncated
            obs = nxt
    finally:
        envs.close()
    if num_envs == 1:
        out = {k: v[:, 0] for k, v in out.items()}
    out["num_actions"], out["env_id"] = n_actions, atari_env_id(game)
    return out
