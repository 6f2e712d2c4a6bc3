"""What a run of an experiment records, and where it writes: the machine (CPU, caches, RAM, OS),
the software (versions, git commit), the load during the run, the wall clock and peak memory
(:class:`RunRecord`), ``results.json`` (:func:`write_json`), the output folder
(:func:`report_dir`) and the ``--quick`` / ``--seeds`` command line every experiment shares.

An experiment does::

    from _recording import RunRecord, report_dir, write_json

    rec = RunRecord("layout", mode="quick", seeds=[0, 1, 2], command=...)  # snapshots machine + load
    ...                                                                   # measure
    run = rec.finish()                                                    # wall clock, load, peak RSS
    write_json(os.path.join(report_dir("layout"), "results.json"), {"methodology": run, ...})

The machine readers are best effort: a file or tool that cannot be read gives ``None``, never an
error, so an experiment runs the same on a laptop, a container or CI. Nothing recorded names a
path of the machine (no executable, working directory or cache locations), and the hostname is
not recorded. Standard library only (psutil where installed, imported inside the functions), so
importing this module stays cheap; it imports no sibling module.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
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


# -- where ------------------------------------------------------------------------------------
def report_dir(name: str) -> str:
    """Where experiment ``name`` writes: ``reports/<name>/`` of this checkout, or
    ``$TFDATA_REPORTS_DIR/<name>/`` when that is set (``tfdata run --quick`` sets it to
    ``reports/quick``, so quick runs never replace a published report)."""
    base = os.environ.get("TFDATA_REPORTS_DIR") or os.path.join(os.path.dirname(_HERE), "reports")
    return os.path.join(base, name)


# -- small readers ----------------------------------------------------------------------------
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


# -- CPU --------------------------------------------------------------------------------------
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


# -- software ---------------------------------------------------------------------------------
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


def thp_settings() -> dict:
    """The transparent huge pages settings (sysfs ``enabled``, ``defrag``, ``khugepaged/defrag``,
    ``hpage_pmd_size``; None where unreadable)."""
    out = {}
    for f in ("enabled", "defrag", "khugepaged/defrag", "hpage_pmd_size"):
        text = _read(f"/sys/kernel/mm/transparent_hugepage/{f}")
        out[f] = None if text is None else text.strip()
    return out


def library_versions(packages) -> dict:
    """Versions of Debian packages (``dpkg-query``; None where unknown), e.g. the allocator
    libraries behind ``tfdata.alloc``."""
    out = {}
    for pkg in packages:
        text = _run(["dpkg-query", "-W", "-f=${Version}", pkg])
        out[pkg] = text.strip() if text and text.strip() else None
    return out


def package_footprint(name: str) -> dict:
    """Installed size and dependencies (transitive, runtime only) of a distribution, from its
    metadata: what depending on it would bring (``new_dependencies``: all but numpy)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # pragma: no cover - pip always brings packaging
        Requirement = None
    seen, todo, size = set(), [name], 0
    while todo:
        n = todo.pop()
        key = n.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = importlib.metadata.distribution(n)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or []:
            size += f.size or 0
        for req in dist.requires or []:
            if Requirement is not None:
                r = Requirement(req)
                if r.marker is not None and not r.marker.evaluate({"extra": ""}):
                    continue
                todo.append(r.name)
            elif "extra ==" not in req:
                todo.append(req.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].strip())
    deps = sorted(seen - {name.lower()})
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"package": name, "version": version, "dependencies": deps,
            "new_dependencies": [d for d in deps if d not in ("numpy",)], "installed_bytes": size}


# -- load -------------------------------------------------------------------------------------
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


def cpu_snapshot(children: bool = False):
    """(machine busy CPU-seconds, this process's CPU-seconds), or None where /proc/stat is missing.

    Parameters
    ----------
    children : bool
        Count the CPU time of this process's waited-for children as its own (measurements run in
        child processes).
    """
    try:
        with open("/proc/stat", encoding="ascii") as f:
            parts = f.readline().split()
        ticks = [int(x) for x in parts[1:9]]
        busy = sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait
        t = os.times()
        own = t.user + t.system + (t.children_user + t.children_system if children else 0.0)
        return busy / os.sysconf("SC_CLK_TCK"), own
    except (OSError, ValueError, IndexError):
        return None


def other_cpu_share(before, after, wall_s: float) -> float | None:
    """Share of the machine's CPUs used by other processes between two :func:`cpu_snapshot`."""
    if before is None or after is None or wall_s <= 0:
        return None
    other = (after[0] - before[0]) - (after[1] - before[1])
    return max(0.0, other) / (wall_s * (os.cpu_count() or 1))


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


# -- one run ----------------------------------------------------------------------------------
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


# -- command line -----------------------------------------------------------------------------
def seeds_parser(doc: str, quick_help: str, seeds_help: str, *, raw: bool = True, render: bool = True):
    """The command line every experiment shares: ``--quick``, ``--seeds`` and ``--render``.

    Parameters
    ----------
    doc : str
        The experiment's module docstring; its first paragraph is the description.
    quick_help, seeds_help : str
        Help texts of ``--quick`` and ``--seeds``.
    raw : bool
        Keep the description's line breaks in ``--help`` (``RawDescriptionHelpFormatter``).
    render : bool
        Add ``--render RESULTS_JSON``: write the report and plots again from a results.json, nothing
        measured (:func:`read_results`).

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
    if render:
        ap.add_argument("--render", default=None, metavar="RESULTS_JSON",
                        help="write the report and plots again from a results.json (nothing measured)")
    return ap


def _int_keys(o):
    if isinstance(o, dict):
        return {int(k) if isinstance(k, str) and k.isdigit() else k: _int_keys(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_int_keys(v) for v in o]
    return o


def read_results(path: str, int_keys: bool = False) -> dict:
    """A results.json as written by :func:`write_json`.

    Parameters
    ----------
    path : str
    int_keys : bool
        Turn keys made of digits back into ints (JSON keeps only string keys; a run's dicts keyed by
        batch size or depth are read back as they were measured).

    Returns
    -------
    dict
    """
    with open(path, encoding="utf-8") as f:
        res = json.load(f)
    return _int_keys(res) if int_keys else res


def drop_stale_plots(out_dir: str, files) -> None:
    """Remove the ``*.png`` of ``out_dir`` that are not in ``files`` (plots an earlier run drew and
    this one did not)."""
    for name in os.listdir(out_dir):
        if name.endswith(".png") and name not in files:
            os.remove(os.path.join(out_dir, name))


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
