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


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def software_info(lean: bool = False) -> dict:
    """Versions, the git commit and the tfdata settings of the environment. ``lean``: the versions
    from the installed packages' metadata, importing nothing (a parent that must stay small while
    it runs measured children: numba alone adds tens of MiB to a process)."""
    version = _dist_version if lean else _version
    env_names = sorted(k for k in os.environ if k.startswith(("NUMBA_", "TFDATA_", "OMP_", "MKL_")))
    return {
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "python_build": " ".join(platform.python_build()),
        "numpy": version("numpy"),
        "numba": version("numba"),
        "llvmlite": version("llvmlite"),
        "psutil": version("psutil"),
        "matplotlib": version("matplotlib"),
        "tfdata": version("tfdata"),
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


def collect_environment(lean: bool = False) -> dict:
    """CPU, caches, cores, RAM, OS/kernel and library versions, as one JSON-ready dict (``lean``:
    see :func:`software_info`)."""
    return {"cpu": cpu_info(), "memory": memory_info(), "os": os_info(), "software": software_info(lean)}


# -- small boards and emulation ---------------------------------------------------------------
_X86 = ("x86_64", "amd64", "i386", "i486", "i586", "i686")


def _family(machine: str | None) -> str | None:
    """'x86' or 'arm' (or the machine name itself) for a ``platform.machine()`` value."""
    if not machine:
        return None
    m = machine.lower()
    if m in _X86:
        return "x86"
    if m.startswith(("aarch64", "arm")):
        return "arm"
    return m


def cpuinfo_fields() -> dict:
    """What ``/proc/cpuinfo`` says the CPU is, from its first processor block (None where absent).

    Returns
    -------
    dict
        ``model`` (x86 ``model name``, or ARM's ``Model``/``Hardware`` line), ``vendor_id``,
        ``flags`` (x86, list), ``features`` (ARM ``Features``, list), ``cpu_implementer``,
        ``cpu_part``, ``cpu_architecture``, ``cpu_revision`` (ARM), ``processors`` (blocks
        listed), and ``family``: 'x86' or 'arm' by which fields are there, None if neither.
    """
    text = _read("/proc/cpuinfo") or ""
    first: dict = {}
    hardware = board = None
    processors = 0
    for line in text.splitlines():
        if ":" not in line:
            continue
        k, v = (x.strip() for x in line.split(":", 1))
        if k == "processor":
            processors += 1
        elif k == "Hardware":
            hardware = v
        elif k == "Model" and processors and "Model" not in first:
            board = v  # the Raspberry Pi kernel's board line (after the processor blocks)
        if k not in first:
            first[k] = v
    family = "x86" if ("vendor_id" in first or "flags" in first) else (
        "arm" if ("CPU implementer" in first or "Features" in first) else None)
    return {
        "model": first.get("model name") or board or hardware,
        "vendor_id": first.get("vendor_id"),
        "flags": first["flags"].split() if "flags" in first else None,
        "features": first["Features"].split() if "Features" in first else None,
        "cpu_implementer": first.get("CPU implementer"),
        "cpu_part": first.get("CPU part"),
        "cpu_architecture": first.get("CPU architecture"),
        "cpu_revision": first.get("CPU revision"),
        "processors": processors or None,
        "family": family,
    }


def board_model() -> str | None:
    """The board's name from the device tree (``/proc/device-tree/model``: 'Raspberry Pi 5 Model
    B Rev 1.0'); None on machines without one (x86, most VMs)."""
    text = _read("/proc/device-tree/model")
    return text.strip("\x00\n ") or None if text else None


def _cpus() -> list[str]:
    try:
        return sorted((n for n in os.listdir("/sys/devices/system/cpu") if re.fullmatch(r"cpu\d+", n)),
                      key=lambda n: int(n[3:]))
    except OSError:
        return []


def cpu_governors() -> dict:
    """``scaling_governor`` per CPU (``{"cpu0": "ondemand", ...}``); empty without cpufreq."""
    out = {}
    for c in _cpus():
        g = _read(f"/sys/devices/system/cpu/{c}/cpufreq/scaling_governor")
        if g is not None:
            out[c] = g.strip()
    return out


def cpu_frequencies() -> dict:
    """Per CPU: ``cur_khz`` (``scaling_cur_freq``) and ``max_khz`` (``cpuinfo_max_freq``, else
    ``scaling_max_freq``); empty without cpufreq."""
    out = {}
    for c in _cpus():
        d = f"/sys/devices/system/cpu/{c}/cpufreq/"
        cur = _read(d + "scaling_cur_freq")
        mx = _read(d + "cpuinfo_max_freq") or _read(d + "scaling_max_freq")
        if cur is not None and cur.strip().isdigit():
            out[c] = {"cur_khz": int(cur), "max_khz": int(mx) if mx and mx.strip().isdigit() else None}
    return out


def temperatures() -> dict:
    """Readable thermal zones, ``{"thermal_zone0 (cpu-thermal)": 47.2}`` in °C; empty when none
    can be read (most VMs)."""
    out = {}
    try:
        zones = sorted(n for n in os.listdir("/sys/class/thermal") if n.startswith("thermal_zone"))
    except OSError:
        return out
    for z in zones:
        t = _read(f"/sys/class/thermal/{z}/temp")
        kind = (_read(f"/sys/class/thermal/{z}/type") or "").strip()
        try:
            out[f"{z} ({kind})" if kind else z] = int(t) / 1000.0
        except (TypeError, ValueError):
            continue
    return out


def vcgencmd_throttled() -> dict | None:
    """A Raspberry Pi's ``vcgencmd get_throttled``: the raw value and its bits in words (under
    voltage, frequency capped, throttled, soft temperature limit: now, and since boot); None where
    the tool is missing."""
    text = _run(["vcgencmd", "get_throttled"])
    if not text or "=" not in text:
        return None
    try:
        v = int(text.strip().split("=", 1)[1], 16)
    except ValueError:
        return {"raw": text.strip(), "now": None, "since_boot": None}
    names = ("under-voltage", "frequency capped", "throttled", "soft temperature limit")
    return {"raw": hex(v), "now": [n for i, n in enumerate(names) if v >> i & 1],
            "since_boot": [n for i, n in enumerate(names) if v >> (16 + i) & 1]}


def emulation() -> dict:
    """Whether this interpreter runs under a user-mode emulator (qemu-user), best effort.

    qemu-user runs a foreign binary on the host's kernel: ``platform.machine()`` says the guest's
    architecture while ``/proc/cpuinfo`` (the host kernel's) still describes the host's CPU.

    Returns
    -------
    dict
        ``machine`` (``platform.machine()``), ``cpuinfo_family`` ('x86', 'arm' or None),
        ``emulated`` (True, False, or None when /proc/cpuinfo says nothing), and ``evidence``
        (the reasons, in words).
    """
    machine = platform.machine()
    info = cpuinfo_fields()
    fam, want = info["family"], _family(machine)
    evidence = []
    emulated = None
    if fam is not None and want is not None:
        emulated = fam != want
        evidence.append(f"platform.machine() is {machine}, /proc/cpuinfo describes an {fam} CPU")
    if emulated and os.path.exists(f"/proc/sys/fs/binfmt_misc/qemu-{machine}"):
        evidence.append(f"binfmt_misc has a qemu-{machine} handler")
    return {"machine": machine, "cpuinfo_family": fam, "emulated": emulated, "evidence": evidence}


def slug(text: str) -> str:
    """``text`` in lower case, each run of characters other than letters, digits and '_' as one '-'."""
    return re.sub(r"[^a-z0-9_]+", "-", text.lower()).strip("-")


def machine_slug() -> str:
    """A stable name for this machine, for a report folder: the device-tree board model on a
    board ('raspberry-pi-5-model-b-rev-1-0'), else ``<machine>-<cpu model>``
    ('x86_64-amd-epyc-7b13'); under emulation ``<machine>-emulated-on-<host cpu model>``."""
    machine = platform.machine() or "unknown"
    emu = emulation()
    model = cpuinfo_fields()["model"] or platform.processor() or "unknown-cpu"
    if emu["emulated"]:
        return slug(f"{machine}-emulated-on-{model}")[:80]
    board = board_model()
    if board:
        return slug(board)[:80]
    model = re.sub(r"\(r\)|\(tm\)|\bcpu\b|\bprocessor\b|@.*$|\d+-core", " ", model, flags=re.I)
    return slug(f"{machine}-{model}")[:80]


class FrequencySampler:
    """Samples the CPU frequencies and temperatures in a thread while a run lasts, to say whether
    the CPU throttled: a CPU below 0.95 of its maximum frequency while busy, a Raspberry Pi's
    ``vcgencmd get_throttled`` flags, or "unknown" when nothing is readable (most VMs).

    Use ``s = FrequencySampler(); s.start(); ...; summary = s.stop()``.
    """

    def __init__(self, interval_s: float = 1.0):
        import threading

        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self.samples: list = []
        self.temps_before = self.temps_after = None
        self.vcgencmd_before = self.vcgencmd_after = None

    def start(self) -> "FrequencySampler":
        self.temps_before, self.vcgencmd_before = temperatures(), vcgencmd_throttled()
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            f, t = cpu_frequencies(), temperatures()
            if f or t:
                self.samples.append({"t": time.time(), "freq": f, "temp": t})

    def stop(self) -> dict:
        """Stop sampling; the summary (JSON-ready)."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.temps_after, self.vcgencmd_after = temperatures(), vcgencmd_throttled()
        ratios = [s["freq"][c]["cur_khz"] / s["freq"][c]["max_khz"] for s in self.samples
                  for c in s["freq"] if s["freq"][c]["max_khz"]]
        max_temp = max((v for s in self.samples for v in s["temp"].values()), default=None)
        vc = self.vcgencmd_after
        if vc is not None and vc.get("now") is not None:
            throttled = "yes" if (vc["now"] or set(vc["since_boot"]) - set(
                (self.vcgencmd_before or {}).get("since_boot") or [])) else "no"
            how = f"vcgencmd get_throttled {self.vcgencmd_before and self.vcgencmd_before['raw']} -> {vc['raw']}"
        elif ratios:
            throttled = "yes" if min(ratios) < 0.95 else "no"
            how = (f"scaling_cur_freq / max sampled every {self.interval_s:g} s: lowest {min(ratios):.2f} "
                   "(below 0.95 counts as throttled; an idle CPU's governor may lower it too)")
        else:
            throttled, how = "unknown", "nothing readable (no cpufreq, no vcgencmd)"
        return {"throttled": throttled, "how": how, "samples": len(self.samples),
                "lowest_frequency_ratio": min(ratios) if ratios else None, "max_temperature_c": max_temp,
                "temperatures_before_c": self.temps_before, "temperatures_after_c": self.temps_after,
                "vcgencmd_before": self.vcgencmd_before, "vcgencmd_after": self.vcgencmd_after}


def edge_machine() -> dict:
    """What a report from a small board states about the machine, as one JSON-ready dict: the
    CPU (/proc/cpuinfo fields, flags or features), the board, cores, RAM, OS, kernel, governors,
    temperatures now, emulation, and the versions of Python, numpy, numba and llvmlite (from the
    installed metadata: nothing is imported)."""
    def dist(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    mem = _read("/proc/meminfo") or ""
    total = next((int(x.split()[1]) * 1024 for x in mem.splitlines() if x.startswith("MemTotal")), None)
    swap = next((int(x.split()[1]) * 1024 for x in mem.splitlines() if x.startswith("SwapTotal")), None)
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = None
    return {"slug": machine_slug(), "machine": platform.machine(), "cpu": cpuinfo_fields(),
            "board_model": board_model(), "logical_cpus": os.cpu_count(), "usable_cpus": affinity,
            "mem_total_bytes": total, "swap_total_bytes": swap, "os": os_info(),
            "governors": cpu_governors(), "frequencies": cpu_frequencies(), "temperatures_c": temperatures(),
            "emulation": emulation(), "hypervisor": lscpu().get("Hypervisor vendor"),
            "versions": {"python": sys.version.split()[0], "numpy": dist("numpy"), "numba": dist("numba"),
                         "llvmlite": dist("llvmlite"), "gymnasium": dist("gymnasium"), "tfdata": dist("tfdata")}}


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
    """Snapshots the environment and load at creation; :meth:`finish` adds the end state.
    ``lean``: read the library versions without importing them (:func:`software_info`)."""

    def __init__(self, experiment: str, *, mode: str, seeds: list[int], command: str,
                 run_name: str | None = None, parameters: dict | None = None, lean: bool = False):
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
        self.environment = collect_environment(lean)
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
