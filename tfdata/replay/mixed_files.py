"""The checkpoint of a :class:`~tfdata.MixedReplayBuffer`: a directory of ``mixed.json`` and,
under ``sources/<i>``, the checkpoint of each buffer source ``i`` (:meth:`ReplayCore.save`).

A dataset source is stored by reference: its path, rows, spec and identity (the size and
modification time of its file, or a digest of the names, sizes and modification times of its
directory's files, ``manifest.json`` among them), checked at load: a dataset that changed is
refused, never read. Written beside ``path`` and renamed into place; an existing ``path`` is
replaced only when asked and only when it is such a checkpoint. ``mixed.json`` is untrusted
input: every key and value is checked before it reaches a constructor or a path.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat

from ..errors import FormatError
from ..storage.files import fsync_dir
from .checkpoint_files import begin, checkpoint_files, publish
from .buffer import ReplayBuffer
from .core import ReplayCore
from .mixing import MAX_SOURCES, NAME
from .samplers import shown

FORMAT, VERSION, DOC, SOURCES = "tfdata.mixed", 1, "mixed.json", "sources"
DOC_LIMIT = 1 << 20
MAX_PATH = 4096


def _spec_list(spec) -> list:
    return [[f.name, f.dtype.str, list(f.shape)] for f in spec]


def identity(path: str) -> dict:
    """What says a dataset at ``path`` is the one saved: a file's size and modification time,
    or a digest of a directory's regular files' names, sizes and modification times."""
    st = os.stat(path)
    if stat.S_ISREG(st.st_mode):
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    entries = []
    for name in sorted(os.listdir(path)):
        e = os.lstat(os.path.join(path, name))
        if stat.S_ISREG(e.st_mode):
            entries.append([name, e.st_size, e.st_mtime_ns])
    return {"digest": hashlib.sha256(json.dumps(entries).encode()).hexdigest()}


def _is_mixed(path: str) -> list:
    """The files and directories of the mixed checkpoint ``path``, deepest first; ValueError if
    it holds anything else."""
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        raise ValueError("not a directory")
    top = set(os.listdir(path))
    if DOC not in top or not top <= {DOC, SOURCES} or not stat.S_ISREG(os.lstat(os.path.join(path, DOC)).st_mode):
        raise ValueError(f"expected {DOC} and {SOURCES}/ only, found {sorted(top)[:8]}")
    files, dirs = [os.path.join(path, DOC)], []
    src = os.path.join(path, SOURCES)
    if SOURCES in top:
        if not stat.S_ISDIR(os.lstat(src).st_mode):
            raise ValueError(f"{SOURCES} is not a directory")
        for name in os.listdir(src):
            sub = os.path.join(src, name)
            if not name.isdigit() or not stat.S_ISDIR(os.lstat(sub).st_mode):
                raise ValueError(f"{SOURCES}/{name} is not a source's checkpoint")
            f, d = checkpoint_files(sub)
            files += [os.path.join(sub, r) for r in f]
            dirs += [os.path.join(sub, r) for r in d] + [sub]
        dirs.append(src)
    return files + dirs + [path]


KIND = "tfdata mixed checkpoint"


def save(buf, path, overwrite: bool) -> None:
    """Write ``buf`` to the mixed checkpoint ``path`` (see the module)."""
    path, tmp, stem, parent = begin(path, overwrite, _is_mixed, KIND)
    try:
        os.mkdir(os.path.join(tmp, SOURCES))
        refs = {}
        for i, (name, s) in enumerate(buf.sources.items()):
            if isinstance(s, ReplayCore):
                s.save(os.path.join(tmp, SOURCES, str(i)))
                continue
            where = getattr(s, "path", None)  # an ArrayDataset has none: given again at load
            where = None if where is None else os.path.abspath(where)
            refs[name] = {"path": where, "rows": len(s), "spec": _spec_list(s.spec),
                          "identity": None if where is None else identity(where)}
        doc = {"format": FORMAT, "version": VERSION, "config": buf.config,
               "state": buf.state_dict(), "datasets": refs}
        fd = os.open(os.path.join(tmp, DOC), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(doc, indent=1, allow_nan=False))
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(os.path.join(tmp, SOURCES))
        fsync_dir(tmp)
        publish(tmp, path, stem, parent, overwrite, _is_mixed, KIND)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # this call's own directory, nothing else
        raise


def _fail(dpath: str, field: str, expected: str, got) -> FormatError:
    return FormatError(f"{dpath}: {field}: expected {expected}, got {shown(got)}")


def _read(path: str) -> tuple:
    dpath = os.path.join(path, DOC)
    try:
        st = os.lstat(dpath)
    except FileNotFoundError:
        raise FileNotFoundError(f"{dpath}: no such file: {path} is not a mixed checkpoint") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size > DOC_LIMIT:
        raise FormatError(f"{dpath}: expected a regular file of at most {DOC_LIMIT} bytes")
    with open(dpath, "rb") as f:
        text = f.read(DOC_LIMIT + 1)

    def no_constant(c):
        raise FormatError(f"{dpath}: {c} is not a JSON value")

    try:
        doc = json.loads(text, parse_constant=no_constant)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, FormatError):
            raise
        raise FormatError(f"{dpath}: not JSON ({str(exc)[:100]})") from None
    return dpath, doc


def _check(dpath: str, doc) -> tuple:
    """The document's values, checked (FormatError naming the field)."""
    keys = {"format", "version", "config", "state", "datasets"}
    if not isinstance(doc, dict) or set(doc) != keys:
        raise _fail(dpath, "(top)", f"an object of the keys {sorted(keys)}", doc)
    if doc["format"] != FORMAT or type(doc["version"]) is not int or doc["version"] != VERSION:
        raise _fail(dpath, "format", f"{FORMAT!r} version {VERSION}", [doc["format"], doc["version"]])
    c = doc["config"]
    base, extra = {"sources", "fractions", "ring_size"}, {"transforms", "stats_from", "roles"}
    if not isinstance(c, dict) or set(c) not in (base, base | extra):
        raise _fail(dpath, "config", "an object of the keys sources, fractions, ring_size (and "
                    "transforms, stats_from, roles with transforms)", c)
    src = c["sources"]
    if not isinstance(src, list) or not 1 <= len(src) <= MAX_SOURCES:
        raise _fail(dpath, "config.sources", f"a list of 1 to {MAX_SOURCES} sources", src)
    for i, s in enumerate(src):
        if not (isinstance(s, list) and len(s) == 2 and isinstance(s[0], str) and NAME.match(s[0])
                and s[1] in ("buffer", "dataset")):
            raise _fail(dpath, f"config.sources.{i}", "[name, 'buffer' or 'dataset']", s)
    names = [s[0] for s in src]
    if len(set(names)) != len(names):
        raise _fail(dpath, "config.sources", "distinct names", names)
    fr = c["fractions"]
    if not isinstance(fr, dict) or set(fr) != set(names) or any(type(v) is not float for v in fr.values()):
        raise _fail(dpath, "config.fractions", f"a float per source {names}", fr)
    if type(c["ring_size"]) is not int or not 1 <= c["ring_size"] <= 1 << 16:
        raise _fail(dpath, "config.ring_size", "an int in [1, 65536]", c["ring_size"])
    if "transforms" in c:  # the list itself: from_config at load, against the functions given
        if c["stats_from"] is not None and c["stats_from"] not in names:
            raise _fail(dpath, "config.stats_from", f"null or a source of {names}", c["stats_from"])
        roles = c["roles"]
        if not isinstance(roles, dict) or len(roles) > 8 or not all(
                isinstance(k, str) and isinstance(v, str) and NAME.match(v) for k, v in roles.items()):
            raise _fail(dpath, "config.roles", "an object of role names to field names", roles)
    wanted = {s[0] for s in src if s[1] == "dataset"}
    refs = doc["datasets"]
    if not isinstance(refs, dict) or set(refs) != wanted:
        raise _fail(dpath, "datasets", f"one reference per dataset source {sorted(wanted)}", refs)
    for n, r in refs.items():
        f = f"datasets.{n}"
        if not isinstance(r, dict) or set(r) != {"path", "rows", "spec", "identity"}:
            raise _fail(dpath, f, "an object of the keys path, rows, spec, identity", r)
        p = r["path"]
        if p is not None and not (isinstance(p, str) and 0 < len(p) <= MAX_PATH and "\0" not in p
                                  and os.path.isabs(p)):
            raise _fail(dpath, f + ".path", f"an absolute path of at most {MAX_PATH} characters or null", p)
        if type(r["rows"]) is not int or r["rows"] < 1:
            raise _fail(dpath, f + ".rows", "an int >= 1", r["rows"])
        if not isinstance(r["spec"], list):
            raise _fail(dpath, f + ".spec", "a list of [name, dtype, shape]", r["spec"])
        ident = r["identity"]
        if not (ident is None and p is None or isinstance(ident, dict) and (
                set(ident) == {"size", "mtime_ns"} and all(type(v) is int for v in ident.values())
                or set(ident) == {"digest"} and isinstance(ident["digest"], str))):
            raise _fail(dpath, f + ".identity", "{size, mtime_ns} or {digest} (null without a path)", ident)
    return c, doc["state"], refs


def load(cls, path, datasets, samplers, transforms, kwargs):
    """Rebuild the mixed buffer saved at ``path`` (see the module)."""
    from ..dataset import MmapDataset
    from .samplers import StateError

    from ..transforms import from_config

    path = os.fspath(path)
    dpath, doc = _read(path)
    config, state, refs = _check(dpath, doc)
    if "transforms" in config:  # user functions resolved only among the caller's, nothing imported
        kwargs = dict(kwargs, transforms=from_config(config["transforms"], transforms,
                                                     f"{dpath}: config.transforms"),
                      stats_from=config["stats_from"], roles=config["roles"])
    elif transforms and not isinstance(transforms, (list, tuple)):
        raise TypeError(f"transforms must be a list of functions, got {type(transforms).__name__}")
    names = [s[0] for s in config["sources"]]
    if not isinstance(datasets, dict) or not set(datasets) <= set(refs):
        raise ValueError(f"datasets: expected a dict of the dataset sources {sorted(refs)}, got "
                         f"{shown(datasets)}")
    sources = {}
    for i, (name, kind) in enumerate(config["sources"]):
        if kind == "buffer":
            sub = os.path.join(path, SOURCES, str(i))
            if not os.path.isdir(sub) or os.path.islink(sub):
                raise FormatError(f"{sub}: expected the checkpoint of source {name!r}")
            sources[name] = ReplayBuffer.load(sub, samplers=samplers)
            continue
        r, f = refs[name], f"datasets.{name}"
        ds = datasets.get(name)
        if ds is None:
            if r["path"] is None:
                raise ValueError(f"datasets: source {name!r} was saved without a path (an "
                                 f"ArrayDataset): give it as datasets={{{name!r}: dataset}}")
            try:
                now = identity(r["path"])
            except OSError as exc:
                raise FormatError(f"{dpath}: {f}.path: the dataset {r['path']} cannot be read "
                                  f"({exc})") from None
            if now != r["identity"]:
                raise FormatError(f"{dpath}: {f}.identity: the dataset {r['path']} changed since "
                                  f"the save (recorded {r['identity']}, found {now}); it is not read")
            ds = MmapDataset.open(r["path"])
        if len(ds) != r["rows"] or _spec_list(ds.spec) != r["spec"]:
            raise FormatError(f"{dpath}: {f}: expected {r['rows']} rows of {r['spec']}, the "
                              f"dataset has {len(ds)} rows of {_spec_list(ds.spec)}")
        sources[name] = ds
    try:
        fractions = {n: config["fractions"][n] for n in names}
        buf = cls(sources, fractions, seed=0, ring_size=config["ring_size"], **kwargs)
        buf.load_state_dict(state)
    except StateError as exc:
        raise FormatError(f"{dpath}: state.{exc.field}: expected {exc.expected}, got {exc.got}") from None
    except (ValueError, TypeError, NotImplementedError) as exc:
        raise FormatError(f"{dpath}: config: {exc}") from None
    return buf
