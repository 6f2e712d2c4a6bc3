"""Minari datasets out: :func:`to_minari` writes the transitions of a tfdata dataset or replay
buffer as a Minari dataset through Minari's own public API (``create_dataset_from_buffers``),
one episode at a time. Design: docs/design/minari.md."""

from __future__ import annotations

import os
import shutil

import numpy as np

from ..dataset import Dataset, thawed
from ..replay.core import ReplayCore
from .minari_format import minari_space

#: The fields a source must have, and those it may have besides.
NEEDED = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
OPTIONAL = ("episode", "step")
_META_ARGS = ("algorithm_name", "author", "author_email", "code_permalink", "description")


def _source_rows(source):
    """``(spec, rows, read(start, stop) -> dict of arrays, metadata)`` of a dataset or buffer,
    rows in stream order."""
    if isinstance(source, Dataset):
        return source.spec, len(source), source.rows, thawed(source.metadata)
    if isinstance(source, ReplayCore):
        config = source.config
        refused = [(k, config[k]) for k, ok in (("num_envs", lambda v: v == 1),
                                                 ("elide_next", lambda v: not v),
                                                 ("frame_stack", lambda v: v is None),
                                                 ("sampler", lambda v: v != "exactly_k"))
                   if k in config and not ok(config[k])]
        if refused:
            raise NotImplementedError(
                f"source: a ReplayBuffer with {', '.join(f'{k}={v!r}' for k, v in refused)}: "
                f"to_minari reads a buffer of one stream (num_envs=1) whose rows are stored in "
                f"stream order with their next fields (no elide_next, no frame_stack, not "
                f"exactly_k); save such a buffer's rows as a dataset of transitions first")
        storage, capacity, size = source.storage, source.capacity, len(source)
        first = source.writer.cursor if size == capacity else 0

        def read(start: int, stop: int) -> dict:
            # slots in stream order: from the oldest row (the cursor once the ring is full)
            a, b = (first + start) % capacity, (first + stop - 1) % capacity + 1
            if a < b:
                return {n: storage.field(n)[a:b] for n in source.spec.names}
            return {n: np.concatenate([storage.field(n)[a:], storage.field(n)[:b]])
                    for n in source.spec.names}

        return source.spec, size, read, {}
    raise TypeError(f"source: expected a tfdata Dataset (ArrayDataset, MmapDataset) or a "
                    f"ReplayBuffer, got {type(source).__name__}")


def _check_fields(spec) -> None:
    missing = [n for n in NEEDED if n not in spec.names]
    extra = [n for n in spec.names if n not in NEEDED + OPTIONAL]
    if missing or extra:
        raise ValueError(
            f"source: a Minari dataset holds the fields {list(NEEDED)} (and optionally "
            f"{list(OPTIONAL)}); "
            + (f"missing {missing}" if missing else "")
            + ("; " if missing and extra else "")
            + (f"{extra} have no place in it: project them away (dataset.project([...]))"
               if extra else ""))
    obs, nxt = spec["obs"], spec["next_obs"]
    if obs.dtype != nxt.dtype or obs.shape != nxt.shape:
        raise ValueError(f"source: next_obs is {nxt.dtype}{list(nxt.shape)}, obs "
                         f"{obs.dtype}{list(obs.shape)}: they must be the same")
    for n in ("terminated", "truncated", "episode", "step"):
        if n in spec.names and (spec[n].shape != () or spec[n].dtype.kind not in "biu"):
            raise ValueError(f"source: field {n!r}: expected a bool or integer scalar per row, "
                             f"got {spec[n].dtype}{list(spec[n].shape)}")
    if spec["reward"].shape != () or spec["reward"].dtype.kind not in "iuf":
        raise ValueError(f"source: field 'reward': expected a numeric scalar per row, got "
                         f"{spec['reward'].dtype}{list(spec['reward'].shape)}")


def _check_space(space, field, what: str) -> None:
    """Refuse (ValueError) a field whose rows the space does not describe."""
    from gymnasium import spaces

    name, dt, shape = field.name, field.dtype, field.shape
    if isinstance(space, spaces.Discrete):
        ok = dt.kind in "iu" and shape == ()
        want = "an integer scalar"
    elif isinstance(space, (spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary)):
        ok = tuple(space.shape) == shape and (not isinstance(space, spaces.Box) or space.dtype == dt)
        want = f"{space.dtype}{list(space.shape)}"
    else:
        raise ValueError(f"{what}: {type(space).__name__} space: tfdata's fields are Box, Discrete, "
                         f"MultiDiscrete or MultiBinary spaces")
    if not ok:
        raise ValueError(f"source: field {name!r} is {dt}{list(shape)}, the {what} ({space}) holds {want}")


def _episode_bounds(spec, n: int, read, chunk: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` of every episode: where the ``episode`` field changes, else after
    each row that terminated or was truncated; ValueError for a row that ends an episode inside
    one, or steps that do not follow each other."""
    starts = [0] if n else []
    has_ep, has_step = "episode" in spec.names, "step" in spec.names
    prev = None
    last = None  # the previous chunk's last row: (step, episode id or None, whether it ended)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        cols = read(lo, hi)
        ends = np.asarray(cols["terminated"], bool) | np.asarray(cols["truncated"], bool)
        if has_ep:
            ep = np.asarray(cols["episode"]).astype(np.int64)
            full = ep if prev is None else np.concatenate([[prev[0]], ep])
            change = np.flatnonzero(full[1:] != full[:-1]) + (lo if prev is None else lo - 1) + 1
            starts.extend(int(c) for c in change)
            inside = ends[:-1] & (ep[1:] == ep[:-1])
            if prev is not None and prev[1] and ep[0] == prev[0]:
                raise ValueError(f"source: row {lo - 1} ends an episode (terminated or truncated) "
                                 f"but row {lo} has the same episode id {ep[0]}")
            if inside.any():
                r = lo + int(np.flatnonzero(inside)[0])
                raise ValueError(f"source: row {r} ends an episode (terminated or truncated) but "
                                 f"row {r + 1} has the same episode id {ep[r - lo]}")
            prev = (int(ep[-1]), bool(ends[-1]))
        else:
            starts.extend(int(r) + 1 for r in np.flatnonzero(ends) + lo if r + 1 < n)
        if has_step:
            st = np.asarray(cols["step"]).astype(np.int64)
            same = (ep[1:] == ep[:-1]) if has_ep else ~ends[:-1]
            first = lo
            if last is not None:  # the pair across the chunks' boundary is checked too
                st = np.concatenate([[last[0]], st])
                same = np.concatenate([[ep[0] == last[1] if has_ep else not last[2]], same])
                first = lo - 1
            bad = np.flatnonzero(same & (st[1:] != st[:-1] + 1))
            if bad.size:
                r = first + int(bad[0])
                raise ValueError(f"source: rows {r} and {r + 1} of one episode have steps "
                                 f"{st[bad[0]]} and {st[bad[0] + 1]}: rows must be in step order")
            last = (int(st[-1]), int(ep[-1]) if has_ep else None, bool(ends[-1]))
    starts = sorted(set(starts))
    return list(zip(starts, starts[1:] + [n]))


def _episodes(read, bounds, obs_name: str):
    """One ``EpisodeBuffer`` per episode, checking that each row's ``next_obs`` is the next
    row's ``obs`` (a Minari episode keeps each observation once)."""
    from minari.data_collector import EpisodeBuffer

    for start, stop in bounds:
        cols = read(start, stop)
        obs, nxt = np.asarray(cols[obs_name]), np.asarray(cols["next_" + obs_name])
        if stop - start > 1:
            a = np.ascontiguousarray(nxt[:-1]).view(np.uint8).reshape(stop - start - 1, -1)
            b = np.ascontiguousarray(obs[1:]).view(np.uint8).reshape(stop - start - 1, -1)
            bad = np.flatnonzero((a != b).any(axis=1))
            if bad.size:
                r = start + int(bad[0])
                raise ValueError(f"source: next_obs of row {r} is not the obs of row {r + 1}, in "
                                 f"one episode: a Minari episode keeps each observation once")
        yield EpisodeBuffer(
            observations=np.concatenate([obs, nxt[-1:]]),
            actions=np.array(cols["action"]), rewards=np.array(cols["reward"]),
            terminations=np.array(cols["terminated"], bool),
            truncations=np.array(cols["truncated"], bool))


def to_minari(source, dataset_id: str, *, env=None, observation_space=None, action_space=None,
              eval_env=None, algorithm_name=None, author=None, author_email=None,
              code_permalink=None, description=None, chunk_bytes: int = 16 << 20):
    """Write the transitions of a tfdata dataset or replay buffer as a Minari dataset.

    Parameters
    ----------
    source : tfdata.Dataset or tfdata.ReplayBuffer
        A dataset (:class:`~tfdata.ArrayDataset`, :class:`~tfdata.MmapDataset`, a projection)
        or a replay buffer (or prioritized one) of one stream (``num_envs=1``) holding its
        next fields (no ``elide_next``, no ``frame_stack``, not ``sampler="exactly_k"``: rows
        off stream order), read through its public API in stream order, oldest first (once the
        ring has wrapped, the oldest episode may have lost its first rows). Fields: ``obs``,
        ``action``, ``reward``, ``next_obs``, ``terminated``, ``truncated``, optionally
        ``episode`` and ``step`` (int), nothing else.
    dataset_id : str
        The Minari id (``namespace/name-v0``), created under Minari's root
        (``MINARI_DATASETS_PATH``, else ``~/.minari/datasets``). An existing id is refused
        (ValueError): delete it with ``minari.delete_dataset`` first or choose another.
    env : str, gymnasium.Env or EnvSpec, optional
        The environment, as Minari takes it (recorded as the dataset's env spec).
    observation_space, action_space : gymnasium.spaces.Space, optional
        Else the environment's, else the source's metadata (a dataset from
        :func:`from_minari`); one of these must give them.
    eval_env, algorithm_name, author, author_email, code_permalink, description : optional
        Minari's metadata; each defaults to the source's metadata where it has it.
    chunk_bytes : int, default 16 MiB
        Rows read at a time while finding the episodes.

    Returns
    -------
    minari.MinariDataset

    Notes
    -----
    Episodes: rows with the same ``episode`` value in a run are one episode; without that
    field an episode ends after each row that terminated or was truncated, and the rows after
    the last such row are one unfinished episode. Minari numbers episodes 0, 1, ... in order:
    ids and steps are renumbered. Each episode's observations are its rows' ``obs`` and the
    last row's ``next_obs``; a row whose ``next_obs`` is not the next row's ``obs`` is refused.
    Images are written raw (``jpeg_encoding=False``): JPEG would change pixels, and the round
    trip ``from_minari(to_minari(ds))`` gives ``ds``'s rows bit for bit. Memory: one episode
    (Minari's API writes an episode at once) plus a chunk of rows.

    Everything is checked (fields, spaces, episodes, the id) before Minari creates the
    dataset; a failure while writing removes the dataset directory this call created.
    """
    import minari
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.storage import get_dataset_path

    spec, n, read, meta = _source_rows(source)
    _check_fields(spec)
    if not isinstance(dataset_id, str):
        raise TypeError(f"dataset_id: expected a str, got {type(dataset_id).__name__}")
    try:
        parse_dataset_id(dataset_id)
    except Exception as exc:  # noqa: BLE001 - Minari's own refusal, whatever its type
        raise ValueError(f"dataset_id: {dataset_id!r} is not a Minari id ({exc})") from None
    target = os.fspath(get_dataset_path(dataset_id))
    if os.path.lexists(target):
        raise ValueError(f"dataset_id: {dataset_id!r} exists ({target}); tfdata does not replace "
                         f"it: delete it with minari.delete_dataset({dataset_id!r}) or choose another id")
    if env is not None and (observation_space is None or action_space is None):
        import gymnasium as gym

        made = env if isinstance(env, gym.Env) else gym.make(env)
        observation_space = observation_space or made.observation_space
        action_space = action_space or made.action_space
    spaces = {}
    for what, given in (("observation_space", observation_space), ("action_space", action_space)):
        if given is None and isinstance(meta.get(what), str):
            given = minari_space(meta[what])
        if given is None:
            raise ValueError(f"{what}: not given, and neither env= nor the source's metadata "
                             f"gives it: pass env= or observation_space= and action_space=")
        spaces[what] = given
    _check_space(spaces["observation_space"], spec["obs"], "observation space")
    _check_space(spaces["action_space"], spec["action"], "action space")
    chunk = max(1, int(chunk_bytes) // max(1, spec.row_nbytes))
    bounds = _episode_bounds(spec, n, read, chunk)
    if not bounds:
        raise ValueError("source: holds no rows; a Minari dataset needs at least one episode")
    given = dict(zip(_META_ARGS, (algorithm_name, author, author_email, code_permalink, description)))
    for k in _META_ARGS:
        if given[k] is None and meta.get(k) is not None:
            v = meta[k]
            given[k] = set(v) if isinstance(v, list) else v
    try:
        return minari.create_dataset_from_buffers(
            dataset_id, _episodes(read, bounds, "obs"), env=env, eval_env=eval_env,
            observation_space=spaces["observation_space"], action_space=spaces["action_space"],
            data_format="hdf5", jpeg_encoding=False, **given)
    except BaseException:
        if os.path.isdir(target):  # made by this call (it did not exist above)
            shutil.rmtree(target, ignore_errors=True)
        raise
