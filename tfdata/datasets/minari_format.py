"""Minari datasets in: :func:`from_minari` reads a Minari dataset's HDF5 file (Minari 0.5's
``hdf5`` backend) with h5py, checking everything it reads, and writes its transitions as a tfdata
dataset through :class:`tfdata.io.Writer`, episode by episode and chunk by chunk.

The format read (Minari 0.5.4, ``minari/dataset/_storages/hdf5_storage.py``): a directory
``<root>/<dataset id>/data/`` holding ``metadata.json`` (the dataset's metadata; the spaces as
JSON strings of Minari's serialization) and ``main_data.hdf5``, whose root holds one group
``episode_<i>`` per episode ``i`` with the datasets ``observations`` (``T + 1`` rows: the reset
observation and one per step), ``actions``, ``rewards``, ``terminations``, ``truncations``
(``T`` rows each) and a group ``infos``. An image space (a uint8 ``Box`` of 2 or 3 dimensions,
at least 32 x 32, bounds 0 and 255) is stored JPEG-encoded unless ``jpeg_encoding`` is false
in the metadata: one encoded frame per row, a 2-D uint8 dataset or a variable-length one.
The design, what is refused and why: docs/design/minari.md.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np

from ..errors import FormatError
from ..spec import Spec
from ..storage import files as _files

METADATA_FILE = "metadata.json"
DATA_FILE = "main_data.hdf5"
#: Largest ``metadata.json`` read (an image space's bounds are written element by element).
MAX_METADATA_FILE = 16 << 20
#: Largest HDF5 chunk read: HDF5 reads a whole chunk (and decompresses it) to give any row of it.
MAX_H5_CHUNK = 16 << 20
#: HDF5's chunk cache for the file (h5py's ``rdcc_nbytes``).
H5_CACHE = 1 << 20
MAX_STEPS = 1 << 40
MAX_ROW_NBYTES = 1 << 30
MAX_EPISODES = 1 << 31
#: A chunked dataset declaring more than ``SPARSE_RATIO`` times the bytes it stores (beyond
#: ``SPARSE_SLACK``) is refused: its unwritten chunks would be read as fill values.
SPARSE_RATIO = 64
SPARSE_SLACK = 1 << 20
#: Spaces tfdata holds: one numeric array per step.
HELD_SPACES = ("Box", "Discrete", "MultiDiscrete", "MultiBinary")
#: A serialized space longer than this is kept with its bounds as scalars when they are uniform.
_COMPACT_SPACE = 4096
_EPISODE_KEYS = ("observations", "actions", "rewards", "terminations", "truncations")
_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "episode", "step")


def minari_data_dir(dataset) -> tuple[str, np.ndarray | None]:
    """``(data directory, episode ids or None for all)`` of a ``MinariDataset`` or of the path
    of a Minari dataset directory (the one holding ``data/``, or ``data/`` itself)."""
    if hasattr(dataset, "storage") and hasattr(dataset, "episode_indices"):  # a MinariDataset
        ids = np.asarray(dataset.episode_indices)
        if ids.ndim != 1 or ids.dtype.kind not in "iu":
            raise TypeError(f"dataset.episode_indices: expected a 1-D integer array, got "
                            f"{ids.dtype}{list(ids.shape)}")
        return os.fspath(dataset.storage.data_path), ids.astype(np.int64)
    if not isinstance(dataset, (str, os.PathLike)):
        raise TypeError(f"dataset: expected a minari.MinariDataset or the path of a Minari dataset "
                        f"directory, got {type(dataset).__name__}")
    path = os.fspath(dataset)
    for d in (os.path.join(path, "data"), path):
        if os.path.isfile(os.path.join(d, METADATA_FILE)):
            return d, None
    raise FileNotFoundError(f"{path}: not a Minari dataset directory (no {METADATA_FILE} in it or "
                            f"in its data/ directory)")


def read_minari_metadata(data_dir: str) -> dict:
    """The checked ``metadata.json`` of a Minari data directory (FormatError naming the file)."""
    mpath = os.path.join(data_dir, METADATA_FILE)
    _files.check_regular(mpath)  # no FIFO: opening one would block
    with open(mpath, "rb") as f:
        raw = f.read(MAX_METADATA_FILE + 1)
    if len(raw) > MAX_METADATA_FILE:
        raise FormatError(f"{mpath}: larger than {MAX_METADATA_FILE} bytes; not a Minari dataset's metadata")
    try:
        meta = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise FormatError(f"{mpath}: not valid JSON ({str(exc)[:200]})") from None
    except RecursionError:
        raise FormatError(f"{mpath}: JSON nested too deeply") from None
    if not isinstance(meta, dict):
        raise FormatError(f"{mpath}: expected a JSON object, got {type(meta).__name__}")
    for key, types in (("data_format", str), ("jpeg_encoding", bool), ("observation_space", str),
                       ("action_space", str), ("total_episodes", int), ("total_steps", int),
                       ("dataset_id", str), ("env_spec", str)):
        v = meta.get(key)
        if v is not None and (not isinstance(v, types) or (types is int and isinstance(v, bool))):
            raise FormatError(f"{mpath}: {key}: expected {types.__name__}, got {str(v)[:100]!r}")
    for key, top in (("total_episodes", MAX_EPISODES), ("total_steps", MAX_STEPS)):
        v = meta.get(key, 0)
        if not 0 <= v < top:
            raise FormatError(f"{mpath}: {key}: expected an int in [0, {top}), got {v}")
    return meta


def parse_space(meta: dict, key: str, mpath: str) -> dict | None:
    """The space ``key`` ("observation_space", "action_space") of Minari's metadata as a dict
    (Minari's serialization), None when absent; refuses (ValueError) a space tfdata cannot hold,
    FormatError a malformed one."""
    text = meta.get(key)
    if text is None:
        return None
    try:
        space = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise FormatError(f"{mpath}: {key}: not a serialized space ({str(exc)[:100]})") from None
    what = key.split("_")[0]
    if not isinstance(space, dict) or not isinstance(space.get("type"), str):
        raise FormatError(f"{mpath}: {key}: expected a JSON object with a 'type', got {text[:100]!r}")
    if space["type"] not in HELD_SPACES:
        raise ValueError(f"{mpath}: the {what} space is a {space['type'][:50]} space, which tfdata "
                         f"cannot hold: a field is one numeric array per step ({', '.join(HELD_SPACES)} "
                         f"spaces); flatten it into a Box first (gymnasium.spaces.flatten)")
    return space


def space_field(space: dict, where: str) -> tuple[np.dtype, tuple] | None:
    """The dtype and per-step shape a held space gives, or None when the space does not say."""
    t = space["type"]
    try:
        if t == "Discrete":
            return np.dtype(np.int64), ()
        if t == "MultiBinary":
            n = space.get("n")
            return np.dtype(np.int8), tuple(n) if isinstance(n, list) else (int(n),)
        if t == "MultiDiscrete":
            return np.dtype(space["dtype"]), np.shape(space["nvec"])
        return np.dtype(space["dtype"]), tuple(int(d) for d in space["shape"])
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{where}: malformed {t} space ({str(exc)[:100]})") from None


def is_image_space(space: dict | None) -> bool:
    """Minari's test for a space it stores JPEG-encoded (``minari_storage.is_image_space``)."""
    if space is None or space["type"] != "Box":
        return False
    shape = space.get("shape")
    if not isinstance(shape, list) or len(shape) not in (2, 3) or shape[0] < 32 or shape[1] < 32:
        return False
    low, high = np.asarray(space.get("low"), dtype=float), np.asarray(space.get("high"), dtype=float)
    return space.get("dtype") == "uint8" and bool(np.all(low == 0)) and bool(np.all(high == 255))


def kept_metadata(meta: dict) -> dict:
    """The metadata a converted dataset keeps: Minari's, with a long space's uniform bounds as
    scalars (an image space's bounds are one number per pixel), and any value that would
    not fit a manifest left out and named under ``"tfdata_omitted"``."""
    kept = dict(meta)
    for key in ("observation_space", "action_space", "eval_env_spec"):
        text = kept.get(key)
        if isinstance(text, str) and len(text) > _COMPACT_SPACE:
            space = json.loads(text) if key != "eval_env_spec" else None
            if isinstance(space, dict) and space.get("type") == "Box":
                for bound in ("low", "high"):
                    values = np.asarray(space.get(bound), dtype=float)
                    if values.size and np.all(values == values.flat[0]):
                        space[bound] = values.flat[0].item()
                kept[key] = json.dumps(space)
    omitted = []
    while _files.metadata_problem(kept) is not None and kept:
        largest = max(kept, key=lambda k: len(json.dumps(kept[k])))
        omitted.append(largest)
        del kept[largest]
    if omitted:
        kept["tfdata_omitted"] = omitted
    return kept


def minari_space(text: str):
    """The gymnasium space of a serialized space kept by :func:`kept_metadata` (Minari's
    serialization; a Box's bounds may be scalars, which Minari's reader does not take)."""
    from minari.serialization import deserialize_space

    space = json.loads(text)
    if isinstance(space, dict) and space.get("type") == "Box":
        shape = tuple(space.get("shape", ()))
        for bound in ("low", "high"):
            if not isinstance(space.get(bound), list):
                space[bound] = np.full(shape, space[bound], dtype=float).tolist()
    return deserialize_space(json.dumps(space))


def _dataset(h5py, group, key: str, where: str, h5: str):
    """``group[key]``, which must be a dataset reached by a hard link, with its data in this file."""
    link = group.get(key, getlink=True)
    if link is None:
        raise FormatError(f"{h5}: {where}: missing")
    if not isinstance(link, h5py.HardLink):
        raise FormatError(f"{h5}: {where}: is a {type(link).__name__}, not a dataset; tfdata "
                          f"follows no link in a file it did not write")
    ds = group[key]
    if not isinstance(ds, h5py.Dataset):
        raise FormatError(f"{h5}: {where}: is a {type(ds).__name__}, expected a dataset")
    if ds.external or ds.is_virtual:
        raise FormatError(f"{h5}: {where}: keeps its data in other files (external or virtual "
                          f"storage); refusing")
    if ds.chunks is not None:
        chunk = int(np.prod(ds.chunks, dtype=object)) * ds.dtype.itemsize
        if chunk > MAX_H5_CHUNK:
            raise FormatError(f"{h5}: {where}: HDF5 chunks of {chunk} bytes (more than "
                              f"{MAX_H5_CHUNK}): reading any row would take a whole chunk")
    declared = int(np.prod(ds.shape, dtype=object)) * ds.dtype.itemsize
    stored = ds.id.get_storage_size()
    if declared > SPARSE_SLACK and stored * SPARSE_RATIO < declared:
        # storage never written reads as fill values: a small file could make a huge dataset
        raise FormatError(f"{h5}: {where}: declares {declared} bytes but stores {stored}; "
                          f"an absurd size (data never written)")
    return ds


def _numeric(ds, where: str, h5: str) -> np.dtype:
    """The numpy dtype of a dataset of numbers (h5py's bool and enum types included)."""
    dt = ds.dtype
    if dt.kind not in "biuf" or dt.fields is not None or dt.subdtype is not None:
        raise FormatError(f"{h5}: {where}: dtype {dt} is not numeric (bool, int, uint, float); "
                          f"tfdata holds numeric arrays only")
    return np.dtype(dt.str)  # without h5py's metadata (an enum's names)


class MinariReader:
    """A Minari HDF5 file read episode by episode, every dataset's link, kind, dtype, shape and
    chunk size checked before a row of it is read. The first episode fixes the fields
    (:attr:`spec`); :meth:`open` checks an episode against them, :meth:`read` gives the
    columns of steps ``[start, stop)``. No dataset stays open after its episode: h5py gives
    each open dataset a chunk cache, which would add up over many episodes."""

    def __init__(self, h5py, f, h5: str, meta: dict, mpath: str, ids):
        self.h5py, self.f, self.h5, self.meta, self.mpath = h5py, f, h5, meta, mpath
        self.spaces = {k: parse_space(meta, f"{k}_space", mpath) for k in ("observation", "action")}
        jpeg = meta.get("jpeg_encoding", True)
        self.jpeg = {"observations": jpeg and is_image_space(self.spaces["observation"]),
                     "actions": jpeg and is_image_space(self.spaces["action"])}
        if ids is None:
            n = meta.get("total_episodes")
            if n is None:
                raise FormatError(f"{mpath}: total_episodes: missing")
            ids = np.arange(n, dtype=np.int64)
        self.ids = ids.tolist()
        if not self.ids:
            raise FormatError(f"{mpath}: total_episodes: the dataset holds no episode")
        self.first = {}
        self.open(self.ids[0])
        first = self.first
        self.spec = Spec({"obs": first["observations"], "action": first["actions"],
                          "reward": first["rewards"], "next_obs": first["observations"],
                          "terminated": (np.bool_, ()), "truncated": (np.bool_, ()),
                          "episode": (np.int64, ()), "step": (np.int64, ())})
        if self.spec.row_nbytes > MAX_ROW_NBYTES:
            raise FormatError(f"{h5}: a transition of {self.spec.row_nbytes} bytes, more than {MAX_ROW_NBYTES}")

    def open(self, eid: int) -> tuple[int, dict]:
        """``(steps, {key: dataset})`` of episode ``eid``, checked."""
        h5py, f, h5 = self.h5py, self.f, self.h5
        name = f"episode_{eid}"
        link = f.get(name, getlink=True)
        if link is None:
            raise FormatError(f"{h5}: {name}: missing (the metadata lists {len(self.ids)} episodes)")
        if not isinstance(link, h5py.HardLink):
            raise FormatError(f"{h5}: {name}: is a {type(link).__name__}, not a group")
        g = f[name]
        if not isinstance(g, h5py.Group):
            raise FormatError(f"{h5}: {name}: is a {type(g).__name__}, expected a group of datasets")
        data = {}
        for key in ("observations", "actions"):
            where = f"{name}/{key}"
            kind = g.get(key, getlink=True)
            if kind is not None and isinstance(kind, h5py.HardLink) and isinstance(g[key], h5py.Group):
                raise ValueError(f"{h5}: {where}: is a group: the {key[:-1]} space is a Dict or "
                                 f"Tuple space, which tfdata cannot hold (a field is one numeric "
                                 f"array per step: {', '.join(HELD_SPACES)} spaces)")
            data[key] = _dataset(h5py, g, key, where, h5)
        for key in _EPISODE_KEYS[2:]:
            data[key] = _dataset(h5py, g, key, f"{name}/{key}", h5)
        steps = self._check_shapes(name, data, self.spaces, self.first)
        limit = self.meta.get("total_steps", MAX_STEPS - 1)
        if steps > limit:
            raise FormatError(f"{h5}: {name}/actions: {steps} steps, more than the {limit} the "
                              f"metadata counts for the whole dataset")
        return steps, data

    def check_total(self, total: int) -> None:
        """Refuse a file whose episodes do not hold the steps its metadata counts."""
        meta = self.meta
        if len(self.ids) == meta.get("total_episodes", -1) and meta.get("total_steps", total) != total:
            raise FormatError(f"{self.mpath}: total_steps: says {meta['total_steps']}, the episodes "
                              f"of {self.h5} hold {total}")

    def _check_shapes(self, name: str, data: dict, spaces: dict, first: dict) -> int:
        h5 = self.h5
        steps = data["actions"].shape[0] if data["actions"].ndim else -1
        if steps < 0:
            raise FormatError(f"{h5}: {name}/actions: a scalar, expected one row per step")
        for key in _EPISODE_KEYS:
            ds = data[key]
            where = f"{name}/{key}"
            rows = steps + 1 if key == "observations" else steps
            if ds.ndim == 0 or ds.shape[0] != rows:
                raise FormatError(f"{h5}: {where}: expected {rows} rows ({steps} steps"
                                  f"{' + 1: the observation after the last step' if rows > steps else ''}), "
                                  f"got shape {list(ds.shape)}")
            if key in ("rewards", "terminations", "truncations") and ds.ndim != 1:
                raise FormatError(f"{h5}: {where}: expected shape [{steps}], got {list(ds.shape)}")
            if self.jpeg.get(key):
                vlen = self.h5py.check_vlen_dtype(ds.dtype)
                if not ((vlen is not None and np.dtype(vlen) == np.uint8 and ds.ndim == 1)
                        or (ds.dtype == np.uint8 and ds.ndim == 2)):
                    raise FormatError(f"{h5}: {where}: expected JPEG-encoded frames (uint8 rows), "
                                      f"got {ds.dtype}{list(ds.shape)}")
                space = spaces["observation" if key == "observations" else "action"]
                got = space_field(space, f"{h5}: {where}")
            else:
                got = (_numeric(ds, where, h5), tuple(ds.shape[1:]))
                space = spaces.get("observation" if key == "observations" else "action") \
                    if key in ("observations", "actions") else None
                if space is not None:
                    want = space_field(space, f"{h5}: {where}")
                    if want is not None and want[1] != got[1]:
                        raise FormatError(f"{h5}: {where}: rows of shape {list(got[1])}, the space "
                                          f"says {list(want[1])}")
            if any(d >= (1 << 31) for d in got[1]):
                raise FormatError(f"{h5}: {where}: shape {list(ds.shape)} is absurd")
            if key in first and first[key] != got:
                raise FormatError(f"{h5}: {where}: {got[0]}{list(got[1])}, but the first episode's "
                                  f"is {first[key][0]}{list(first[key][1])}")
            first.setdefault(key, got)
        return steps

    def read(self, eid: int, data: dict, start: int, stop: int) -> dict:
        """The columns of steps ``[start, stop)`` of episode ``eid`` (its datasets ``data``, from
        :meth:`open`), ``next_obs`` a view of ``obs``."""
        name = f"episode_{eid}"
        cols = {}
        for key in _EPISODE_KEYS:
            ds = data[key]
            end = stop + 1 if key == "observations" else stop
            try:
                values = ds[start:end]
                if self.jpeg.get(key):
                    shape = self.spec["obs" if key == "observations" else "action"].shape
                    values = _decode_jpeg(values, shape, f"{self.h5}: {name}/{key}")
            except (OSError, ValueError, TypeError, KeyError) as exc:
                if isinstance(exc, FormatError):
                    raise
                raise FormatError(f"{self.h5}: {name}/{key}: unreadable rows [{start}, {end}) "
                                  f"({type(exc).__name__}: {str(exc)[:200]})") from None
            cols[key] = values
        for key in ("terminations", "truncations"):
            v = cols[key]
            if v.dtype != np.bool_:
                if v.size and (v.min() < 0 or v.max() > 1):
                    raise FormatError(f"{self.h5}: {name}/{key}: values other than 0 and 1")
                cols[key] = v.astype(np.bool_)
        n = stop - start
        return {"obs": cols["observations"][:n], "action": cols["actions"], "reward": cols["rewards"],
                "next_obs": cols["observations"][1:], "terminated": cols["terminations"],
                "truncated": cols["truncations"], "episode": np.full(n, eid, np.int64),
                "step": np.arange(start, stop, dtype=np.int64)}


def _decode_jpeg(frames, shape: tuple, where: str) -> np.ndarray:
    """JPEG-encoded frames (rows of uint8) decoded as Minari does, each checked for ``shape``
    before its pixels are decoded."""
    from PIL import Image

    out = np.empty((len(frames), *shape), np.uint8)
    height, width = shape[0], shape[1]
    mode = "L" if len(shape) == 2 else {1: "L", 3: "RGB", 4: "RGBA"}.get(shape[2])
    for i, raw in enumerate(frames):
        try:
            img = Image.open(io.BytesIO(np.asarray(raw, np.uint8).tobytes()))
        except Exception as exc:  # noqa: BLE001 - any failure of a hostile frame
            raise FormatError(f"{where}: row {i}: not a JPEG frame ({type(exc).__name__})") from None
        if img.size != (width, height) or img.mode != mode:
            raise FormatError(f"{where}: row {i}: a {img.mode} frame of {img.size[0]}x{img.size[1]}, "
                              f"expected {mode} of {width}x{height}")
        try:
            out[i] = np.asarray(img, dtype=np.uint8).reshape(shape)
        except Exception as exc:  # noqa: BLE001
            raise FormatError(f"{where}: row {i}: undecodable ({type(exc).__name__}: {str(exc)[:100]})") from None
    return out


def _joined(pieces: list) -> dict:
    """The columns of consecutive pieces of rows as one (no copy for a single piece)."""
    if len(pieces) == 1:
        return pieces[0]
    return {k: np.concatenate([p[k] for p in pieces]) for k in pieces[0]}


def from_minari(dataset, path, layout="aos", *, overwrite: bool = False,
                chunk_bytes: int = 16 << 20) -> None:
    """Convert a Minari dataset into a tfdata dataset of transitions, streaming.

    Parameters
    ----------
    dataset : minari.MinariDataset, str or path
        A loaded dataset (its episodes: all, or those a ``filter_episodes`` kept), or the path of
        a Minari dataset directory (the one holding ``data/``, or ``data/`` itself), as
        ``minari download`` leaves it under ``~/.minari/datasets/<dataset id>``. Only Minari's
        ``hdf5`` backend is read (the default); an ``arrow`` dataset: NotImplementedError.
    path : str or path
        Where to write: an AoS ``.npy`` file or a directory (see :func:`tfdata.io.save`).
    layout : {"aos", "soa"} or list of lists of str
        The dataset's layout; a grouping of the field names below writes column groups.
    overwrite : bool, default False
        Replace ``path`` if it is a tfdata dataset of the same layout (nothing else is ever
        replaced). The dataset appears at ``path`` only once complete; a failure leaves no file.
    chunk_bytes : int, default 16 MiB
        Bytes of transitions read, built and written at a time.

    Notes
    -----
    One row per step ``t`` of each episode: ``obs`` (observation ``t``, of the observation
    space's shape and the file's dtype), ``action``, ``reward`` (the file's dtypes),
    ``next_obs`` (observation ``t + 1``: Minari keeps ``T + 1`` observations per episode),
    ``terminated`` and ``truncated`` (bool, kept apart), ``episode`` (int64, the Minari
    episode id) and ``step`` (int64, ``t``). Rows are in episode order, so a
    :class:`tfdata.ReplayBuffer` extended with them gets n-step returns and sequences that stop
    at episode ends. JPEG-encoded image observations are decoded as Minari decodes them.

    Memory: the rows of one chunk are held at a time. Resident memory grows by at most
    ``4 * chunk_bytes + 2 * MAX_H5_CHUNK + H5_CACHE`` (about 4 chunks: the columns read,
    their checked copies and the AoS records or group blocks built from them; HDF5's
    cache and the chunk it decompresses), plus what importing h5py and compiling tfdata's
    checks take once, whatever the size of the dataset: an episode longer than a chunk is
    read in pieces.

    Metadata: a directory layout keeps Minari's ``metadata.json`` (dataset id, environment
    spec, spaces, algorithm, authors, code permalink, Minari version, counts...) in its
    manifest, read back as :attr:`tfdata.MmapDataset.metadata` (an image space's uniform bounds
    kept as scalars). An AoS file has no manifest and keeps none.

    Raises
    ------
    tfdata.errors.FormatError
        The file is not what Minari writes: not HDF5 or truncated, a key missing, a link
        instead of a dataset, an episode that is a dataset, observations not ``T + 1`` rows,
        a dtype that is not numeric, absurd sizes, a malformed or huge ``metadata.json``. The
        message names the file and the field (``episode_3/actions``). Nothing is written.
    ValueError
        A space tfdata cannot hold (Dict, Tuple, Text, Graph, Sequence): the message says
        which, observation or action.
    NotImplementedError
        A dataset of Minari's arrow backend.
    FileExistsError
        ``path`` exists and may not be replaced.
    """
    chunk_bytes = int(chunk_bytes)
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes: expected a positive int, got {chunk_bytes}")
    data_dir, ids = minari_data_dir(dataset)
    meta = read_minari_metadata(data_dir)
    mpath = os.path.join(data_dir, METADATA_FILE)
    fmt = meta.get("data_format", "hdf5")
    if fmt != "hdf5":
        raise NotImplementedError(
            f"{mpath}: data_format {fmt[:50]!r}: tfdata reads Minari's hdf5 backend only; convert "
            f"it with Minari first: minari.create_dataset_from_buffers(new_id, [EpisodeBuffer(...) "
            f"for each episode of minari.load_dataset(id)], ..., data_format='hdf5')")
    for key in ("observation_space", "action_space"):
        parse_space(meta, key, mpath)  # a space tfdata cannot hold is refused before h5py opens
    import h5py

    h5 = os.path.join(data_dir, DATA_FILE)
    if not os.path.lexists(h5):
        raise FormatError(f"{h5}: missing (a Minari hdf5 dataset keeps its episodes there)")
    _files.check_regular(h5)
    try:
        f = h5py.File(h5, "r", rdcc_nbytes=H5_CACHE)
    except (OSError, ValueError) as exc:
        raise FormatError(f"{h5}: not a readable HDF5 file ({str(exc)[:200]})") from None
    with f:
        try:
            reader = MinariReader(h5py, f, h5, meta, mpath, ids)
        except (OSError, KeyError, RuntimeError) as exc:  # h5py's errors on a corrupt file
            raise FormatError(f"{h5}: unreadable ({type(exc).__name__}: {str(exc)[:200]})") from None
        spec = reader.spec
        resolved = _files.dataset_layout(layout, spec)
        keep = kept_metadata(meta) if _files.holds_metadata(resolved) else None
        step = _files.chunk_rows(spec.row_nbytes, chunk_bytes)
        with _files.Writer(path, spec, layout, overwrite=overwrite, metadata=keep,
                           _publish_at_close=True) as w:
            pending, held, total = [], 0, 0  # pieces of episodes filling appends of ``step`` rows
            for eid in reader.ids:
                steps, data = reader.open(eid)
                total += steps
                start = 0
                while start < steps:
                    stop = min(steps, start + step - held)
                    pending.append(reader.read(eid, data, start, stop))
                    held += stop - start
                    start = stop
                    if held == step:
                        w.append(_joined(pending))
                        pending, held = [], 0
                del data  # its datasets closed before the next episode's open
            reader.check_total(total)  # raised inside the writer: nothing is published
            if pending:
                w.append(_joined(pending))
