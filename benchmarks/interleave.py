"""The write benchmarks' candidates interleaved in one process: every layout and the numpy
baseline in each round, the order rotated from round to round, so that a change of load on a
shared machine hits them alike (asv runs each candidate in a process of its own, at other
times). Prints the median of each candidate and its ratio to the numpy baseline's::

    python -m benchmarks.interleave              # push (PushEnvRow's rows), extend(1000), and
                                                 # one 8-row vector-env step (arrays, lists, int flags)
    python -m benchmarks.interleave --rounds 20 --capacity 10000

Not an asv benchmark (asv finds no ``time_`` here); the rows and buffers are those of
:mod:`benchmarks.bench_replay`.
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np

from .bench_replay import env_rows
from .common import CARTPOLE, LAYOUTS, fill, fill_chunk, new_buffer, random_rows

_LAYOUTS = LAYOUTS + ["groups"]


def candidates(capacity: int) -> dict:
    """``{(operation, values, layout): (fn, args)}``: push of one environment row (a different
    row each call, :func:`~benchmarks.bench_replay.env_rows`) and extend of 1000 rows (exact
    dtypes, and float64 rewards) into full buffers of ``capacity`` rows."""
    out = {}
    batches = {"exact": random_rows(CARTPOLE, 1000, seed=3)}
    batches["float64 rewards"] = dict(batches["exact"], reward=batches["exact"]["reward"].astype(np.float64))
    rows = {v: env_rows(v) for v in ("python", "numpy")}
    steps = env_steps(8)
    for layout in _LAYOUTS:
        buf = new_buffer(layout, CARTPOLE, capacity)
        fill(buf, capacity, fill_chunk(CARTPOLE))
        for values, rs in rows.items():
            out["push", values, layout] = (buf.push, [(r,) for r in rs])
        for values, batch in batches.items():
            out["extend(1000)", values, layout] = (buf.extend, [(batch,)])
        for values, ss in steps.items():
            out["step(8)", values, layout] = (buf.extend, [(s,) for s in ss])
    return out


def env_steps(n: int, count: int = 64) -> dict:
    """``count`` steps of ``n`` CartPole rows as a vector env's loop hands them to ``extend``:
    ``"arrays"`` (gymnasium's: float32 observation rows, int64 actions, float64 rewards, bool
    flags), ``"lists"`` (the rewards and flags as lists of Python scalars, as a loop that
    gathers them builds them) and ``"int flags"`` (the flags as int64 arrays of 0 and 1)."""
    rng = np.random.default_rng(8)
    out = {"arrays": [], "lists": [], "int flags": []}
    for _ in range(count):
        obs = rng.standard_normal((n + 1, 4), dtype=np.float32)
        ends = rng.random(n) < 0.05
        step = {"obs": obs[:n], "action": rng.integers(0, 2, n), "reward": rng.random(n),
                "next_obs": obs[1:], "terminated": ends, "truncated": np.zeros(n, bool)}
        out["arrays"].append(step)
        out["lists"].append(dict(step, reward=step["reward"].tolist(), terminated=ends.tolist(),
                                 truncated=[False] * n))
        out["int flags"].append(dict(step, terminated=ends.astype(np.int64),
                                     truncated=np.zeros(n, np.int64)))
    return out


def run(capacity: int, rounds: int, per_round: int) -> dict:
    """Median nanoseconds per call of every candidate, ``per_round`` calls each per round."""
    cands = candidates(capacity)
    keys = list(cands)
    times = {k: [] for k in keys}
    pc = time.perf_counter_ns
    gc.collect()
    gc.disable()
    try:
        for fn, args in cands.values():  # warm: output of first calls, branch predictors
            for a in args[:64]:
                fn(*a)
        for r in range(rounds):
            order = keys[r % len(keys):] + keys[:r % len(keys)]
            if r % 2:
                order.reverse()
            for k in order:
                fn, args = cands[k]
                n, out = len(args), times[k]
                for i in range(per_round):
                    a = args[(r * per_round + i) % n]
                    t0 = pc()
                    fn(*a)
                    out.append(pc() - t0)
    finally:
        gc.enable()
    return {k: float(np.median(v)) for k, v in times.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--capacity", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--per-round", type=int, default=2000)
    a = ap.parse_args(argv)
    med = run(a.capacity, a.rounds, a.per_round)
    print(f"{a.capacity:,} rows, {a.rounds} rounds of {a.per_round} calls; median per call, "
          f"and its ratio to the numpy baseline's (push: time over numpy's; extend and step: speed "
          f"over numpy's)")
    for (op, values, layout), ns in med.items():
        base = med[op, values, "numpy"]
        ratio = ns / base if op == "push" else base / ns
        label = "x numpy" if op == "push" else "x numpy's speed"
        print(f"  {op:13s} {values:16s} {layout:7s} {ns / 1e3:8.2f} us  {ratio:5.2f}{label}")


if __name__ == "__main__":
    main()
