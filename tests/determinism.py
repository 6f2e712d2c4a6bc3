"""Cross-architecture determinism: what tfdata computes from fixed seeds, as digests compared
with a golden file written on x86-64.

Importable (``cases()``, ``compare()``, ``check_checkpoint()``; tests/test_determinism.py) and a
script. Needs only tfdata and numpy (no gymnasium, torch or zstandard), so that it runs inside
a bare aarch64 root as well.

    python tests/determinism.py --check [--json OUT]     # compare with the golden file
    python tests/determinism.py --write                  # regenerate golden.json, params.npz
                                                         # and this machine's checkpoints
    python tests/determinism.py --write-checkpoint [DIR] # only the checkpoints, in DIR/<machine>
    python tests/determinism.py --spread                 # the learners' rounding spread against
                                                         # the tolerance (x86-64 CPU names)

Two classes of entry:

- ``exact``: batches (indices and the bytes of every field and attribute) of every sampler and
  layout, priorities and the sum tree after updates, n-step returns, sequences, frame stacks,
  a shared-memory buffer, GAE and minibatch order, and the arrays of saved checkpoints. Integer
  draws, and float arithmetic compiled without fast-math (IEEE operations in program order),
  must be bit-identical on every architecture.
- ``float``: the parameters of ``tfdata.nn``'s DQN, PPO and SAC after a few updates. Their
  kernels are compiled with fast-math (reassociation, contraction; ``tfdata._config.NN_OPTIONS``)
  for the host CPU, so sums are vectorised at the host's SIMD width and a multiply and an add
  may fuse; SAC's products are numpy's BLAS, whose kernels depend on the CPU. Their values are
  kept in ``params.npz`` and compared within :data:`TOLERANCE` (see its comment).

A checkpoint fixture written on any machine (``checkpoints/<machine>/<kind>``) must hold the
arrays of the golden entry ``checkpoint/<kind>/saved`` and continue (pushes, samples, priority
updates) with the golden ``checkpoint/<kind>/continue/<i>`` digests: the checkpoint format is
the same bytes on every little-endian machine, whatever its page size.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures", "determinism")
GOLDEN = os.path.join(FIXTURES, "golden.json")
PARAMS = os.path.join(FIXTURES, "params.npz")
CHECKPOINTS = os.path.join(FIXTURES, "checkpoints")
FORMAT = "tfdata.determinism"
VERSION = 1
EXACT, FLOAT = "exact", "float"

#: Tolerance of the ``float`` entries, per learner: a value ``a`` matches the golden ``g`` when
#: ``|a - g| <= atol + rtol * |g|`` for every parameter. Rounding differences between CPUs
#: (vector widths, fused multiply-adds, BLAS kernels) change the parameters after the updates
#: of :func:`nn_cases` by far less than these bounds; a changed learning rate, discount or sign
#: by far more (docs/design/determinism.md has the measurements; ``--spread`` repeats them).
TOLERANCE = {
    "nn/dqn": {"rtol": 1e-4, "atol": 1e-6},
    "nn/ppo": {"rtol": 1e-4, "atol": 1e-6},
    "nn/sac": {"rtol": 1e-9, "atol": 1e-12},  # float64
}

SPEC = {"obs": ("float32", (4,)), "action": "int64", "reward": "float32",
        "next_obs": ("float32", (4,)), "terminated": "bool", "truncated": "bool",
        "tag": ("uint8", (3,))}
GROUPS = [["obs", "action", "reward", "terminated", "truncated"], ["next_obs", "tag"]]
LAYOUTS = {"aos": "aos", "soa": "soa", "groups": GROUPS}
FRAME = (4, 4)
STACK = 4


# -- digests -----------------------------------------------------------------------------------


def _array_bytes(a) -> tuple[str, tuple, bytes]:
    a = np.ascontiguousarray(a)
    return a.dtype.str, tuple(a.shape), a.tobytes()


def digest_parts(parts: dict) -> dict:
    """``{"sha256": ..., "parts": {name: first 16 hex digits}}`` of named arrays: each array's
    dtype, shape and bytes, in the order given (the parts say which array differs)."""
    whole = hashlib.sha256()
    short = {}
    for name, arr in parts.items():
        dt, shape, data = _array_bytes(arr)
        h = hashlib.sha256(f"{name}|{dt}|{shape}|".encode())
        h.update(data)
        short[name] = h.hexdigest()[:16]
        whole.update(h.digest())
    return {"sha256": whole.hexdigest(), "parts": short}


def batch_parts(batch) -> dict:
    """Copies of the arrays of a batch: indices, every field (sorted by name) and the attributes
    it has (copies: the batch is a view into an output ring that a later sample reuses)."""
    parts = {"indices": np.array(batch.indices)}
    for k in sorted(batch):
        parts[k] = np.array(batch[k])
    for attr in ("weights", "discounts", "mask", "versions"):
        a = getattr(batch, attr, None)
        if a is not None:
            parts[attr] = np.array(a)
    return parts


class Recorder:
    """Collects entries: name -> {"class", "sha256", "parts"}; float entries keep their values."""

    def __init__(self):
        self.entries: dict = {}
        self.values: dict = {}

    def exact(self, name: str, parts: dict) -> None:
        if name in self.entries:
            raise KeyError(f"entry {name!r} recorded twice")
        self.entries[name] = {"class": EXACT, **digest_parts(parts)}

    def batch(self, name: str, batch) -> None:
        self.exact(name, batch_parts(batch))

    def floats(self, name: str, parts: dict) -> None:
        if name in self.entries:
            raise KeyError(f"entry {name!r} recorded twice")
        flat = np.concatenate([np.asarray(v).ravel() for v in parts.values()])
        self.entries[name] = {"class": FLOAT, **digest_parts(parts), "dtype": flat.dtype.str,
                              "size": int(flat.size)}
        self.values[name] = flat


# -- rows --------------------------------------------------------------------------------------


def signed(rng, shape, dtype=np.float32) -> np.ndarray:
    """Floats in [-2, 2) from the generator's integer bits and exact arithmetic only: no
    ``exp`` or ``log`` (a normal draw's, numpy's or the C library's), whose last bit may
    differ between machines, enters an input."""
    return (rng.random(shape) * 4.0 - 2.0).astype(dtype)



def streams(seed: int, num_envs: int, steps: int) -> list:
    """Vector-env steps of consistent rows (``next_obs`` is the stream's next ``obs``)."""
    rng = np.random.default_rng(seed)
    obs = rng.random((num_envs, 4), dtype=np.float32)
    out = []
    for t in range(steps):
        nxt = rng.random((num_envs, 4), dtype=np.float32)
        term = rng.random(num_envs) < 0.1
        trunc = (rng.random(num_envs) < 0.08) & ~term
        out.append({"obs": obs, "action": rng.integers(0, 3, num_envs),
                    "reward": signed(rng, num_envs),
                    "next_obs": nxt, "terminated": term, "truncated": trunc,
                    "tag": rng.integers(0, 256, (num_envs, 3)).astype(np.uint8)})
        obs = np.where((term | trunc)[:, None], rng.random((num_envs, 4), dtype=np.float32), nxt)
    return out


def fill(buf, steps: list) -> None:
    for s in steps:
        buf.extend(s)


def frame_streams(seed: int, num_envs: int, steps: int) -> list:
    """Steps of stacked frames (oldest first) as FrameStackObservation gives them, padded with
    the episode's first frame ("reset")."""
    rng = np.random.default_rng(seed)

    def new_frame():
        return rng.integers(0, 256, (num_envs,) + FRAME).astype(np.uint8)

    first = new_frame()
    stack = np.repeat(first[:, None], STACK, axis=1)
    out = []
    for t in range(steps):
        nxt_frame = new_frame()
        nxt = np.concatenate([stack[:, 1:], nxt_frame[:, None]], axis=1)
        term = rng.random(num_envs) < 0.1
        trunc = (rng.random(num_envs) < 0.05) & ~term
        out.append({"obs": stack.copy(), "next_obs": nxt, "action": rng.integers(0, 4, num_envs),
                    "reward": rng.random(num_envs).astype(np.float32), "terminated": term,
                    "truncated": trunc})
        reset = np.repeat(new_frame()[:, None], STACK, axis=1)
        stack = np.where((term | trunc)[:, None, None, None], reset, nxt)
    return out


def frame_spec() -> dict:
    return {"obs": ("uint8", (STACK,) + FRAME), "next_obs": ("uint8", (STACK,) + FRAME),
            "action": "int64", "reward": "float32", "terminated": "bool", "truncated": "bool"}


def priorities(rng, n: int) -> np.ndarray:
    """Priorities spanning several orders of magnitude (pow and the tree's sums see them)."""
    return np.ldexp(rng.integers(1, 1 << 20, n).astype(np.float64), rng.integers(-30, -10, n))


# -- the cases ---------------------------------------------------------------------------------


def replay_cases(rec: Recorder) -> None:
    import tfdata

    for lname, layout in LAYOUTS.items():
        buf = tfdata.ReplayBuffer(SPEC, 32, layout=layout, seed=101)
        fill(buf, streams(1, 1, 45))  # wraps
        for i, size in enumerate((5, 1, 8, 5)):
            rec.batch(f"uniform/{lname}/{i}", buf.sample(size))
        for i in range(2):
            rec.batch(f"sequences/{lname}/{i}", buf.sample_sequences(3, 4))

    buf = tfdata.ReplayBuffer(SPEC, 24, layout="soa", seed=7, sampler="without_replacement")
    fill(buf, streams(2, 1, 30))
    for i in range(5):
        rec.batch(f"without_replacement/soa/{i}", buf.sample(7))

    buf = tfdata.ReplayBuffer(SPEC, 24, layout="aos", seed=8, sampler="exactly_k", replays=2)
    fill(buf, streams(3, 1, 12))
    for i in range(3):
        rec.batch(f"exactly_k/aos/{i}", buf.sample(6))

    buf = tfdata.ReplayBuffer(SPEC, 40, layout=GROUPS, seed=9, num_envs=2, n_step=3, gamma=0.9)
    fill(buf, streams(4, 2, 27))
    for i in range(4):
        rec.batch(f"nstep/groups/{i}", buf.sample(6))
    rec.batch("nstep/groups/sequences", buf.sample_sequences(2, 5))

    fspec = frame_spec()
    buf = tfdata.ReplayBuffer(fspec, 24, layout="soa", seed=10, num_envs=2, frame_stack={"obs": STACK})
    fill(buf, frame_streams(5, 2, 17))
    for i in range(3):
        rec.batch(f"frames/soa/{i}", buf.sample(5))
    rec.batch("frames/soa/sequences", buf.sample_sequences(2, 3))


def prioritized_cases(rec: Recorder) -> None:
    import tfdata

    for lname, kw in (("soa", dict(layout="soa")),
                      ("aos-nstep-2env", dict(layout="aos", n_step=2, gamma=0.95, num_envs=2))):
        seed = len(lname)  # another draw per buffer
        buf = tfdata.PrioritizedReplayBuffer(SPEC, 32, seed=12 + seed, alpha=0.7, beta=0.4,
                                             beta_steps=6, **kw)
        fill(buf, streams(6, kw.get("num_envs", 1), 40 // kw.get("num_envs", 1)))
        rng = np.random.default_rng(13 + seed)
        for i in range(6):
            b = buf.sample(6)
            rec.batch(f"prioritized/{lname}/{i}", b)
            buf.update_priorities(b.indices, priorities(rng, 6))
        state = buf.state_dict()
        per = state["prioritized"]
        rec.exact(f"prioritized/{lname}/tree", {
            "leaves": per["leaves"], "versions": per["versions"],
            "samples": np.int64(per["samples"]), "counter": np.int64(state["sampler"]["counter"])})


def shared_cases(rec: Recorder) -> None:
    import tfdata

    with tempfile.TemporaryDirectory() as d:
        with tfdata.SharedReplayBuffer(SPEC, 24, layout="aos", seed=14, dir=d) as buf, \
                tfdata.SharedWriter(buf.name, 0, dir=d) as w:
            for s in streams(7, 1, 30):
                w.extend(s)
            for i in range(3):
                rec.batch(f"shared/aos/{i}", buf.sample(5, copy=True))


def rollout_cases(rec: Recorder) -> None:
    import tfdata

    spec = {"obs": ("float32", (3,)), "action": "int64", "log_prob": "float32",
            "reward": "float32", "value": "float32", "terminated": "bool", "truncated": "bool",
            "final_value": "float32"}
    T, E = 16, 2
    rng = np.random.default_rng(15)
    buf = tfdata.RolloutBuffer(spec, num_steps=T, num_envs=E, layout="soa", seed=16)
    for _ in range(T):
        buf.add({"obs": signed(rng, (E, 3)),
                 "action": rng.integers(0, 2, E), "log_prob": signed(rng, E),
                 "reward": signed(rng, E),
                 "value": signed(rng, E),
                 "terminated": rng.random(E) < 0.1, "truncated": rng.random(E) < 0.1,
                 "final_value": signed(rng, E)})
    buf.compute_returns_and_advantages(signed(rng, E), gamma=0.99,
                                       gae_lambda=0.95)
    rec.exact("rollout/gae", {"advantage": buf.field("advantage"), "return": buf.field("return")})
    for i, mb in enumerate(buf.minibatches(4, epochs=2)):
        rec.batch(f"rollout/minibatch/{i}", mb)


# -- checkpoints -------------------------------------------------------------------------------

#: the checkpoints every machine writes (``--write-checkpoint``) and every machine loads
CHECKPOINT_KINDS = ("prioritized-nstep-soa", "frames-groups")


def checkpoint_buffer(kind: str):
    """The buffer of checkpoint ``kind``, filled, sampled and (prioritized) updated: the state
    that is saved."""
    import tfdata

    if kind == "prioritized-nstep-soa":
        buf = tfdata.PrioritizedReplayBuffer(SPEC, 16, layout="soa", seed=17, n_step=3, gamma=0.9,
                                             alpha=0.6, beta=0.5, beta_steps=10)
        fill(buf, streams(8, 1, 21))
        rng = np.random.default_rng(18)
        for _ in range(3):
            b = buf.sample(4)
            buf.update_priorities(b.indices, priorities(rng, 4))
        return buf
    if kind == "frames-groups":
        buf = tfdata.ReplayBuffer(frame_spec(), 16, layout=[["action", "reward"], ["terminated", "truncated"]],
                                  seed=19, num_envs=2, frame_stack={"obs": STACK},
                                  sampler="without_replacement")
        fill(buf, frame_streams(9, 2, 11))
        buf.sample(5)
        return buf
    raise KeyError(kind)


def continue_checkpoint(buf, kind: str) -> list:
    """What a loaded checkpoint of ``kind`` must do next: pushes, samples (and priority
    updates), as a list of batch parts."""
    out = []
    if kind == "prioritized-nstep-soa":
        rest = streams(8, 1, 27)[21:]  # the same streams, continued
        rng = np.random.default_rng(20)
        for i in range(3):
            buf.extend(rest[2 * i])
            buf.extend(rest[2 * i + 1])
            b = buf.sample(5)
            out.append(batch_parts(b))
            buf.update_priorities(b.indices, priorities(rng, 5))
        out.append({"leaves": buf.state_dict()["prioritized"]["leaves"]})
    else:
        rest = frame_streams(9, 2, 15)[11:]
        for i in range(3):
            buf.extend(rest[i])
            out.append(batch_parts(buf.sample(5)))
        out.append(batch_parts(buf.sample_sequences(2, 3)))
    return out


def checkpoint_arrays(path: str) -> dict:
    """The content of the checkpoint directory ``path`` as named arrays: every field of its
    rows (through tfdata's dataset reader: header padding, which follows the page size, is not
    data), every file under ``arrays/`` and ``state.json`` (parsed, re-serialised sorted)."""
    import tfdata

    parts = {}
    rows = os.path.join(path, "rows.npy")
    if not os.path.exists(rows):
        rows = os.path.join(path, "rows")
    with tfdata.MmapDataset.open(rows) as ds:
        for f in ds.spec:
            parts[f"rows.{f.name}"] = np.array(ds.field(f.name))
    adir = os.path.join(path, "arrays")
    for name in sorted(os.listdir(adir)) if os.path.isdir(adir) else ():
        parts[f"arrays/{name}"] = np.load(os.path.join(adir, name), allow_pickle=False)
    with open(os.path.join(path, "state.json"), encoding="utf-8") as f:
        doc = json.load(f)
    parts["state.json"] = np.frombuffer(json.dumps(doc, sort_keys=True).encode(), np.uint8)
    return parts


def checkpoint_cases(rec: Recorder, save_to: str | None = None) -> None:
    """Save each kind, record its arrays; load it and record the continuation. ``save_to``:
    also keep the checkpoints there (``<save_to>/<kind>``)."""
    import tfdata

    with tempfile.TemporaryDirectory() as d:
        for kind in CHECKPOINT_KINDS:
            path = os.path.join(d, kind)
            checkpoint_buffer(kind).save(path)
            rec.exact(f"checkpoint/{kind}/saved", checkpoint_arrays(path))
            back = tfdata.ReplayBuffer.load(path)
            for i, parts in enumerate(continue_checkpoint(back, kind)):
                rec.exact(f"checkpoint/{kind}/continue/{i}", parts)
            if save_to is not None:
                # saved again from the same seeds, by tfdata: an existing checkpoint there is
                # replaced, anything else there is refused (FileExistsError) and left as it is
                os.makedirs(save_to, exist_ok=True)
                checkpoint_buffer(kind).save(os.path.join(save_to, kind), overwrite=True)


def check_checkpoint(path: str, kind: str, golden: dict) -> list:
    """Compare the checkpoint fixture ``path`` of ``kind`` with the golden entries: its arrays,
    then the continuation of the buffer it loads into. Returns result rows (see :func:`compare`)."""
    import tfdata

    rec = Recorder()
    rec.exact(f"checkpoint/{kind}/saved", checkpoint_arrays(path))
    with tempfile.TemporaryDirectory() as d:
        # a copy: the fixture stays untouched whatever a load does
        work = os.path.join(d, kind)
        shutil.copytree(path, work)
        back = tfdata.ReplayBuffer.load(work)
        for i, parts in enumerate(continue_checkpoint(back, kind)):
            rec.exact(f"checkpoint/{kind}/continue/{i}", parts)
    want = {k: v for k, v in golden["entries"].items() if k.startswith(f"checkpoint/{kind}/")}
    return compare(rec.entries, {}, {"entries": want}, {})


def checkpoint_fixtures(root: str = CHECKPOINTS) -> list:
    """``[(machine, kind, path)]`` of every checkpoint fixture present."""
    out = []
    if os.path.isdir(root):
        for machine in sorted(os.listdir(root)):
            for kind in CHECKPOINT_KINDS:
                path = os.path.join(root, machine, kind)
                if os.path.isdir(path):
                    out.append((machine, kind, path))
    return out


# -- the learners (float) ----------------------------------------------------------------------

NN_STEPS = 15


def dqn_batch(rng, n: int) -> dict:
    return {"obs": signed(rng, (n, 4)),
            "next_obs": signed(rng, (n, 4)),
            "action": rng.integers(0, 2, n), "reward": signed(rng, n),
            "terminated": rng.random(n) < 0.2}


def nn_cases(rec: Recorder, *, lr_scale: float = 1.0, gamma: float = 0.99,
             reward_sign: float = 1.0, steps: int = NN_STEPS) -> None:
    """DQN, PPO and SAC after ``steps`` updates on synthetic batches. ``lr_scale``, ``gamma``
    and ``reward_sign``: deliberate changes, which the tolerance must catch (``--spread``)."""
    from tfdata.nn import DQN, PPO, SAC

    rng = np.random.default_rng(21)
    dqn = DQN((4, 16, 16, 2), lr=1e-3 * lr_scale, gamma=gamma, seed=22)
    for t in range(steps):
        b = dqn_batch(rng, 16)
        b["reward"] *= np.float32(reward_sign)
        dqn.train(b)
        if t % 5 == 4:
            dqn.sync_target()
    rec.floats("nn/dqn", {"online": dqn.online.params, "target": dqn.target.params,
                          "m": dqn.optim.m, "v": dqn.optim.v})

    rng = np.random.default_rng(23)
    ppo = PPO(4, 3, hidden=(16, 16), lr=1e-3 * lr_scale, seed=24)
    for _ in range(steps):
        n = 16
        obs = signed(rng, (n, 4))
        actions, logp, values = ppo.act(obs)
        mb = {"obs": obs, "action": np.array(actions, np.int64),
              "log_prob": (logp + 0.05 * signed(rng, n)).astype(np.float32),
              "advantage": (reward_sign * signed(rng, n)).astype(np.float32),
              "return": (values + signed(rng, n)).astype(np.float32),
              "value": np.array(values, np.float32)}
        ppo.train(mb)
    rec.floats("nn/ppo", {"params": ppo.params, "m": ppo.optim.m, "v": ppo.optim.v})

    rng = np.random.default_rng(25)
    sac = SAC(3, [-2.0], [2.0], hidden=(16, 16), gamma=gamma, q_lr=1e-3 * lr_scale,
              policy_lr=3e-4 * lr_scale, seed=26, dtype="float64")
    for _ in range(steps):
        n = 16
        sac.train({"obs": signed(rng, (n, 3), np.float64), "next_obs": signed(rng, (n, 3), np.float64),
                   "action": rng.uniform(-2, 2, (n, 1)), "reward": reward_sign * signed(rng, n, np.float64),
                   "terminated": rng.random(n) < 0.1})
    rec.floats("nn/sac", {"actor": sac.actor_params, "q": sac.q_params,
                          "q_target": sac.q_target_params, "log_alpha": sac.log_alpha})


# -- everything --------------------------------------------------------------------------------


def cases(*, checkpoints_to: str | None = None, nn: bool = True) -> Recorder:
    """Every entry, computed now. ``checkpoints_to``: also keep the saved checkpoints there."""
    rec = Recorder()
    replay_cases(rec)
    prioritized_cases(rec)
    shared_cases(rec)
    rollout_cases(rec)
    checkpoint_cases(rec, checkpoints_to)
    if nn:
        nn_cases(rec)
    return rec


def machine() -> dict:
    import llvmlite
    import numba

    return {"machine": platform.machine(), "system": platform.system(),
            "byteorder": sys.byteorder, "python": platform.python_version(),
            "numpy": np.__version__, "numba": numba.__version__, "llvmlite": llvmlite.__version__}


def npz_key(name: str) -> str:
    return name.replace("/", ".")


def load_golden(path: str = GOLDEN, params: str = PARAMS) -> tuple[dict, dict]:
    """``(golden document, {float entry: values})``."""
    with open(path, encoding="utf-8") as f:
        golden = json.load(f)
    with np.load(params, allow_pickle=False) as z:
        values = {name: z[npz_key(name)] for name, e in golden["entries"].items() if e["class"] == FLOAT}
    return golden, values


def compare(entries: dict, values: dict, golden: dict, golden_values: dict) -> list:
    """One result per entry of either side: ``{"name", "class", "status", "detail"}`` with
    status ``equal``, ``within`` (float, within :data:`TOLERANCE`), ``MISMATCH``, ``MISSING``
    (golden only) or ``EXTRA`` (computed only). Only ``equal`` and ``within`` pass."""
    out = []
    want = golden["entries"]
    for name in sorted(set(want) | set(entries)):
        g, e = want.get(name), entries.get(name)
        cls = (g or e)["class"]
        if g is None or e is None:
            out.append({"name": name, "class": cls, "status": "EXTRA" if g is None else "MISSING",
                        "detail": "not in the golden file" if g is None else "not computed"})
            continue
        if g["class"] != e["class"]:
            out.append({"name": name, "class": cls, "status": "MISMATCH",
                        "detail": f"class {e['class']}, golden {g['class']}"})
            continue
        if e["sha256"] == g["sha256"]:
            out.append({"name": name, "class": cls, "status": "equal", "detail": ""})
            continue
        differ = sorted(k for k in set(g["parts"]) | set(e["parts"])
                        if g["parts"].get(k) != e["parts"].get(k))
        if cls == EXACT:
            out.append({"name": name, "class": cls, "status": "MISMATCH",
                        "detail": f"differ: {', '.join(differ)}"})
            continue
        a, b = values[name], golden_values.get(name)
        if b is None or a.shape != b.shape:
            out.append({"name": name, "class": cls, "status": "MISMATCH",
                        "detail": f"shape {a.shape}, golden {None if b is None else b.shape}"})
            continue
        tol = TOLERANCE[name]
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        diff = np.abs(a64 - b64)
        ratio = float(np.max(diff / (tol["atol"] + tol["rtol"] * np.abs(b64)))) if diff.size else 0.0
        ok = bool(np.all(np.isfinite(a64))) and ratio <= 1.0
        detail = (f"max |diff| {float(diff.max()):.3g}, max |diff|/(atol+rtol*|golden|) {ratio:.3g} "
                  f"(rtol {tol['rtol']:g}, atol {tol['atol']:g}); differ: {', '.join(differ)}")
        out.append({"name": name, "class": cls, "status": "within" if ok else "MISMATCH",
                    "detail": detail, "ratio": ratio, "max_abs": float(diff.max())})
    return out


def passed(results: list) -> bool:
    return all(r["status"] in ("equal", "within") for r in results)


def write(rec: Recorder, path: str = GOLDEN, params: str = PARAMS) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    doc = {"format": FORMAT, "version": VERSION, "written_on": machine(),
           "tolerance": TOLERANCE, "entries": rec.entries}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    np.savez_compressed(params, **{npz_key(k): v for k, v in rec.values.items()})


def check_golden(golden: dict, values: dict) -> None:
    """Raise ValueError unless ``golden`` is a well-formed golden document (and ``values`` holds
    the values of each float entry, of its dtype and size)."""
    if golden.get("format") != FORMAT or golden.get("version") != VERSION:
        raise ValueError(f"golden: format {golden.get('format')!r} version {golden.get('version')!r}")
    wm = golden.get("written_on")
    if not isinstance(wm, dict) or not {"machine", "numpy", "numba", "byteorder"} <= set(wm):
        raise ValueError(f"golden: written_on {wm!r}")
    entries = golden.get("entries")
    if not isinstance(entries, dict) or not entries:
        raise ValueError("golden: no entries")
    for name, e in entries.items():
        if e.get("class") not in (EXACT, FLOAT):
            raise ValueError(f"golden: {name}: class {e.get('class')!r}")
        sha = e.get("sha256")
        if not (isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)):
            raise ValueError(f"golden: {name}: sha256 {sha!r}")
        if not isinstance(e.get("parts"), dict) or not e["parts"]:
            raise ValueError(f"golden: {name}: parts {e.get('parts')!r}")
        if e["class"] == FLOAT:
            if name not in TOLERANCE:
                raise ValueError(f"golden: {name}: float entry without a tolerance")
            v = values.get(name)
            if v is None or v.dtype.str != e["dtype"] or v.size != e["size"]:
                raise ValueError(f"golden: {name}: values {None if v is None else (v.dtype, v.size)}, "
                                 f"expected {e['dtype']} x {e['size']}")


def run_check(json_out: str | None = None, verbose: bool = True) -> bool:
    t0 = time.perf_counter()
    golden, gvalues = load_golden()
    check_golden(golden, gvalues)
    rec = cases()
    results = compare(rec.entries, rec.values, golden, gvalues)
    for machine_name, kind, path in checkpoint_fixtures():
        for r in check_checkpoint(path, kind, golden):
            r["name"] = f"fixture[{machine_name}]:{r['name']}"
            results.append(r)
    seconds = time.perf_counter() - t0
    ok = passed(results)
    if verbose:
        width = max(len(r["name"]) for r in results)
        for r in results:
            print(f"{r['name']:<{width}}  {r['class']:<5}  {r['status']}"
                  + (f"  {r['detail']}" if r["detail"] else ""))
        bad = sum(r["status"] not in ("equal", "within") for r in results)
        print(f"{len(results)} entries, {bad} failing; golden written on "
              f"{golden['written_on']['machine']}, checked on {platform.machine()}; {seconds:.1f} s")
    if json_out:
        with open(json_out, "w", encoding="utf-8") as f:
            json.dump({"machine": machine(), "golden_written_on": golden["written_on"],
                       "passed": ok, "seconds": seconds, "results": results,
                       "entries": rec.entries,
                       "float_values": {k: v.tolist() for k, v in rec.values.items()}}, f, indent=1)
    return ok


#: ``--spread``: environments that change only the rounding of the learners (the vector width
#: and fused multiply-adds of the nn kernels, numpy's BLAS kernels and threads) ...
SPREAD_ENVS = {
    "host": {},
    # numba compiles for NUMBA_CPU_NAME with the host's features unless NUMBA_CPU_FEATURES is
    # set ("": the named CPU's own)
    "cpu generic": {"NUMBA_CPU_NAME": "generic"},  # x86-64 baseline: SSE2, no FMA
    "cpu nehalem": {"NUMBA_CPU_NAME": "nehalem", "NUMBA_CPU_FEATURES": ""},  # SSE4.2, no FMA
    "cpu haswell": {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": ""},  # AVX2 and FMA
    # 128-bit vectors with FMA, as aarch64's NEON
    "cpu haswell 128-bit": {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+prefer-128-bit"},
    "cpu skylake-avx512": {"NUMBA_CPU_NAME": "skylake-avx512", "NUMBA_CPU_FEATURES": ""},
    "blas 1 thread": {"OPENBLAS_NUM_THREADS": "1"},
    "blas 2 threads": {"OPENBLAS_NUM_THREADS": "2"},
    "blas sandybridge": {"OPENBLAS_CORETYPE": "SandyBridge"},
    "blas prescott": {"OPENBLAS_CORETYPE": "Prescott"},
}
#: ... and deliberate changes, each of which the tolerance must catch
SPREAD_CHANGES = {"lr x 1.01": {"lr_scale": 1.01}, "gamma 0.99 -> 0.98": {"gamma": 0.98},
                  "reward sign swapped": {"reward_sign": -1.0}}


def _nn_values(out: str, change: dict) -> None:
    rec = Recorder()
    nn_cases(rec, **change)
    np.savez(out, **{npz_key(k): v for k, v in rec.values.items()})


def spread() -> list:
    """Run the learners in fresh processes under :data:`SPREAD_ENVS` and with
    :data:`SPREAD_CHANGES`; returns and prints, per variant and learner, the largest difference
    from the host's run and its ratio to the tolerance (a ratio above 1 is outside it)."""
    import subprocess

    rows = []
    with tempfile.TemporaryDirectory() as d:
        runs = [(name, env, {}) for name, env in SPREAD_ENVS.items()]
        runs += [(name, {}, change) for name, change in SPREAD_CHANGES.items()]
        values = {}
        for name, env, change in runs:
            out = os.path.join(d, f"{len(values)}.npz")
            cmd = [sys.executable, os.path.abspath(__file__), "--nn-values", out,
                   "--change", json.dumps(change)]
            subprocess.run(cmd, check=True, env={**os.environ, **env})
            with np.load(out) as z:
                values[name] = {k: z[k] for k in z.files}
        base = values["host"]
        for name, env, change in runs[1:]:
            for learner in TOLERANCE:
                tol, k = TOLERANCE[learner], npz_key(learner)
                a, b = values[name][k].astype(np.float64), base[k].astype(np.float64)
                diff = np.abs(a - b)
                ratio = float(np.max(diff / (tol["atol"] + tol["rtol"] * np.abs(b))))
                rel = float(np.max(diff / np.maximum(np.abs(b), 1e-30)))
                rows.append({"variant": name, "kind": "change" if change else "rounding",
                             "learner": learner, "max_abs": float(diff.max()), "max_rel": rel,
                             "ratio": ratio})
    for r in rows:
        print(f"{r['variant']:<22} {r['kind']:<8} {r['learner']:<7} max |diff| {r['max_abs']:9.3g}  "
              f"max rel {r['max_rel']:9.3g}  diff/tolerance {r['ratio']:9.3g}")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--check", action="store_true", help="compare with the golden file")
    g.add_argument("--write", action="store_true",
                   help="regenerate the golden file, params.npz and this machine's checkpoints")
    g.add_argument("--spread", action="store_true",
                   help="measure the learners' rounding spread and the deliberate changes "
                        "against the tolerance (fresh processes)")
    g.add_argument("--nn-values", metavar="OUT", help=argparse.SUPPRESS)
    g.add_argument("--write-checkpoint", nargs="?", const=CHECKPOINTS, metavar="DIR",
                   help="write only the checkpoints, into DIR/<machine>/<kind> (default: the fixtures)")
    p.add_argument("--json", metavar="OUT", help="with --check: write the results as JSON")
    p.add_argument("--force", action="store_true", help="with --write: on a machine other than x86-64")
    p.add_argument("--change", default="{}", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.nn_values:
        _nn_values(args.nn_values, json.loads(args.change))
        return 0
    if args.spread:
        spread()
        return 0
    if args.check:
        return 0 if run_check(args.json) else 1
    if args.write:
        if platform.machine() not in ("x86_64", "AMD64") and not args.force:
            p.error(f"the golden file is written on x86-64, this is {platform.machine()}: "
                    f"--write-checkpoint adds this machine's checkpoints (--force to write anyway)")
        rec = cases(checkpoints_to=os.path.join(CHECKPOINTS, platform.machine()))
        write(rec)
        print(f"wrote {GOLDEN} ({len(rec.entries)} entries) and {PARAMS}")
        return 0
    dest = os.path.join(args.write_checkpoint, platform.machine())
    os.makedirs(dest, exist_ok=True)
    checkpoint_cases(Recorder(), dest)
    print(f"wrote {', '.join(CHECKPOINT_KINDS)} under {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
