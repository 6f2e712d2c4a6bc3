"""Atari frames: is a replay buffer that stores one 84x84 frame per transition exact, small and
fast on real Atari, against the buffers people use?

The question (issue 22). gymnasium's ``FrameStackObservation`` gives each transition an ``obs``
and a ``next_obs`` of 4 frames each (56 KB), of which one frame (7 KB) is new. ``tfdata.ReplayBuffer
(..., frame_stack={"obs": 4})`` stores that frame only and rebuilds both stacks when it samples.
On real ALE frames (Breakout, Pong; a random and an epsilon-greedy policy):

1. **Exactness.** Are its batches bit-identical to a naive buffer that stores the full ``obs``
   and ``next_obs`` stacks the environments returned, across episode ends, truncations, vector
   environments and ring wraps? Every transition is pushed (one environment) or extended (chunks
   of steps) into: frame buffers in AoS and SoA; a plain ``tfdata.ReplayBuffer`` storing the full
   stacks with the same seed (same draws); and a hand-written numpy ring of full stacks, indexed
   by ``batch.indices``. Every field of many batches is compared bit for bit; also with
   ``n_step=3`` (the numpy side computes the windows itself) and prioritized replay (the same
   priority updates on both sides).
2. **Memory for 1M transitions.** Bytes per transition planned for 1M (``plan_memory`` for tfdata,
   the arrays' dtypes for the others) and resident memory (RSS) measured after writing 100k real
   transitions, each buffer in a fresh forked process: tfdata frames (AoS, SoA), tfdata storing
   the full stacks (and with ``elide_next``: the obs stack only), stable-baselines3's
   ``ReplayBuffer`` with and without ``optimize_memory_usage``, a numpy buffer of full stacks and
   a hand-written numpy buffer of one frame per row. Target: at most 1.05x one 84x84 frame plus
   the other fields per transition. And how many transitions fit in 1, 2 and 4 GB.
3. **Speed** (one process, interleaved rounds, medians, ratios within the run). ``sample(32)`` of
   obs + next_obs stacks from a frame buffer of real frames against a memcpy of the batch's bytes
   (contiguous, from a pool as large as the buffer's frames: DRAM; and from one hot source: cache),
   the full-stack tfdata buffer, SB3 (both) and the numpy full-stack buffer. ``push`` of one
   transition against a hand-written numpy write of one frame and the small fields (no checks),
   the full-stack push and SB3's ``add``. Targets: sample within 1.3x the memcpy, push within 1.2x
   the one-frame write.
4. **The compressed cold tier** (``spill_path=``, ``hot_rows=``, ``compress_cold=True``): its
   compression ratio on the frames of each stream, and ``sample(32)`` with 50% and 90% of the rows
   cold: from the tier, from the uncompressed spill file through the page cache, and from the disk
   (the file's pages dropped with ``posix_fadvise`` before every timed call), against RAM; the
   memory each holds.

Real transitions: ``ALE/<Game>-v5`` (sticky actions 0.25) through ``AtariPreprocessing`` (frame
skip 4, 84x84 grayscale, up to 30 no-ops) and ``FrameStackObservation(4)`` (padding "reset"), in
a ``SyncVectorEnv`` with same-step autoreset (``_envs.atari_transitions``), collected once
per (game, policy, stream) and reused. Memory, speed and the cold tier's timings fill their
buffers by repeating a real block of one stream that starts at a reset and ends with an episode
end, so the stream written stays continuous (each repetition is a new episode).

    python experiments/atari_frames.py --quick   # seconds: Breakout, random policy, small sizes
    python experiments/atari_frames.py           # the report (~4 min on a busy 2-core machine)
    python experiments/atari_frames.py --render reports/atari_frames/results.json   # report and plots again

Needs the ``atari`` and ``compress`` extras; stable-baselines3 (the ``dqn`` extra) for its
baselines (left out, and said so, without it). Writes ``reports/atari_frames/`` (README.md,
results.json, memory.png, speed.png, cold.png). Only the public tfdata API.
"""

from __future__ import annotations

import gc
import importlib.util
import math
import os
import shutil
import sys
import tempfile
from functools import partial
import time

import numpy as np

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
from _atari_baselines import CheckedNumpyFrameBuffer, NaiveRing, NumpyFrameBuffer, planned_bytes  # noqa: E402
from _atari_baselines import make_buffer as make_baseline  # noqa: E402
from _atari_baselines import measure as measure_baseline  # noqa: E402
from _envs import atari_transitions, chunks_of, repeatable_block, row_dicts, rows_of  # noqa: E402
from _plots import bars, hbar_medians, hbar_pairs, hbars, panels_figure  # noqa: E402
from _recording import RunRecord, report_dir, seeds_parser, write_json  # noqa: E402
from _render import fmt_bytes, hand_written, md_table, table, write_report as write_methodology_report  # noqa: E402
from _timing import Memcpy, SliceTimer, cached_bytes, drop_page_cache, fresh_pages_allocator, remove  # noqa: E402
from _timing import rotated, rss_bytes, run_forked, run_rounds, spill_files  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "atari_frames"
K = 4                                                   # frames per observation
FRAME = (84, 84)
FRAME_BYTES = FRAME[0] * FRAME[1]
SPEC = {"obs": ("u1", (K, *FRAME)), "action": "i8", "reward": "f4", "next_obs": ("u1", (K, *FRAME)),
        "terminated": "?", "truncated": "?"}
FIELDS = tuple(SPEC)
OTHER_BYTES = 8 + 4 + 1 + 1                             # action, reward, terminated, truncated
ONE_FRAME_ROW = FRAME_BYTES + OTHER_BYTES               # the reference of the memory target
TARGET_MEMORY = 1.05                                    # bytes per transition / ONE_FRAME_ROW
TARGET_SAMPLE = 1.3                                     # sample(32) / memcpy of its bytes
TARGET_PUSH = 1.2                                       # push / numpy write of one frame
BATCH = 32
OUT_BYTES = 2 * BATCH * K * FRAME_BYTES + BATCH * OTHER_BYTES   # the bytes of one batch
FRAMES = {"obs": K}

GAMES = {"full": ("Breakout", "Pong"), "quick": ("Breakout",)}
POLICIES = {"random": 1.0, "eps-greedy": 0.1}          # name -> epsilon (else a fixed action per env)
QUICK_POLICIES = ("random",)
# streams collected per (game, policy): name -> (num_envs, vector steps, max_episode_steps, seed);
# the "-trunc" streams truncate episodes after max_episode_steps agent steps
STREAMS = {"full": {"E1": (1, 3000, None, 0), "E4": (4, 1500, None, 10),
                    "E1-trunc": (1, 1200, 60, 20), "E4-trunc": (4, 600, 60, 30)},
           "quick": {"E1": (1, 400, None, 0), "E4-trunc": (4, 120, 30, 30)}}
# exactness: ring capacities in rows for a stream of T steps of E envs: a small ring that wraps
# tens of times (it must hold a batch), and a third of the stream (wraps about 3 times)
CAPACITIES = {"small": lambda T, E: max(40, 24 * E), "third": lambda T, E: max(K + 1, T // 3) * E}
CHECKS = {"full": 600, "quick": 25}                     # check rounds per (stream, capacity): a round
                                                        # compares one draw of each sampler (7 comparisons)
MEAN_CHUNK = 12                                         # mean steps per write (extend, or pushes)
PUSH_SHARE = 0.3                                        # one env: share of chunks written row by row
N_STEP, GAMMA = 3, 0.99
BUFFER_SEED = 7

PLAN_FOR = 1_000_000
RSS_FILL = {"full": 100_000, "quick": 3_000}            # transitions written before RSS is read
BUDGETS_GB = (1, 2, 4)                                  # GB = 2**30 bytes, as tfdata reads "1GB"
MEMORY_HEADROOM = 1.5                                   # free RAM needed: planned bytes x this

SPEED_ROWS = {"full": 50_000, "quick": 4_000}           # frame buffers (353 MB of frames in full)
SPEED_FULL_ROWS = {"full": 12_000, "quick": 2_000}      # full-stack buffers (677 MB each in full)
SPEED_ROUNDS = {"full": 20, "quick": 3}
SPEED_SLICE_MS = {"full": 120, "quick": 15}

COLD_ROWS = {"full": 20_000, "quick": 2_000}
COLD_FRACTIONS = (0.5, 0.9)
COLD_ROUNDS = {"full": 8, "quick": 2}
COLD_CALLS = {"full": 40, "quick": 5}                   # per round per tier
DISK_CALLS = {"full": 5, "quick": 2}                    # per round (each ~20-100 ms)
COLD_HOT_ROWS_RATIO = 64                                # ratio measurement: hot window in steps x E
                                                        # (at most an eighth of the stream)

OUT_DIR = report_dir(EXPERIMENT)


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# ---------------------------------------------------------------------------------------------
# 1. Exactness
# ---------------------------------------------------------------------------------------------
class Tally:
    """Counts of what was compared, and the mismatches (with where they happened)."""

    def __init__(self):
        self.batches, self.rows, self.bytes, self.mismatches = 0, 0, 0, []

    def same(self, where: str, got: dict, want: dict, names) -> None:
        self.batches += 1
        for f in names:
            a, b = np.asarray(got[f]), np.asarray(want[f])
            self.bytes += b.nbytes
            if a.shape != b.shape or a.dtype != b.dtype:
                self.mismatches.append({"where": where, "field": f, "rows": "shape/dtype"})
            elif not np.array_equal(a, b):
                bad = np.flatnonzero((a != b).reshape(len(a), -1).any(axis=1))
                self.mismatches.append({"where": where, "field": f, "rows": bad[:8].tolist()})
        self.rows += len(np.asarray(want[names[0]]))


def batch_fields(batch, extra=()) -> dict:
    out = {f: batch[f] for f in FIELDS}
    out["indices"] = batch.indices
    for e in extra:
        out[e] = getattr(batch, e)
    return out


def exactness_run(rows: dict, num_envs: int, capacity: int, checks: int, seed: int) -> dict:
    """Write ``rows`` into every buffer in chunks, comparing batches as the rings fill and wrap."""
    import tfdata

    E = num_envs
    common = dict(num_envs=E, seed=BUFFER_SEED)
    uni = {"frames-aos": tfdata.ReplayBuffer(SPEC, capacity, layout="aos", frame_stack=FRAMES, **common),
           "frames-soa": tfdata.ReplayBuffer(SPEC, capacity, layout="soa", frame_stack=FRAMES, **common),
           "full": tfdata.ReplayBuffer(SPEC, capacity, layout="aos", **common)}
    nst = {"frames-soa": tfdata.ReplayBuffer(SPEC, capacity, layout="soa", frame_stack=FRAMES, n_step=N_STEP,
                                             gamma=GAMMA, **common),
           "full": tfdata.ReplayBuffer(SPEC, capacity, layout="aos", n_step=N_STEP, gamma=GAMMA, **common)}
    pri = {"frames-aos": tfdata.PrioritizedReplayBuffer(SPEC, capacity, layout="aos", frame_stack=FRAMES, **common),
           "full": tfdata.PrioritizedReplayBuffer(SPEC, capacity, layout="aos", **common)}
    every = [*uni.values(), *nst.values(), *pri.values()]
    naive = NaiveRing(capacity, E)
    tally = {"uniform": Tally(), "n_step": Tally(), "prioritized": Tally()}
    rng = np.random.default_rng(seed)
    total = len(rows["action"]) // E
    per_chunk = max(1, math.ceil(checks / max(1, total / MEAN_CHUNK)))
    t, pushes, extends, rounds = 0, 0, 0, 0
    while t < total:
        steps = min(total - t, int(rng.integers(1, 2 * MEAN_CHUNK)))
        part = {f: v[t * E:(t + steps) * E] for f, v in rows.items()}
        if E == 1 and rng.random() < PUSH_SHARE:  # row by row: the push path (compiled for these frames)
            for i in range(steps):
                row = {f: v[i] for f, v in part.items()}
                for b in every:
                    b.push(row)
            pushes += steps
        else:
            for b in every:
                b.extend(part)
            extends += 1
        naive.write(part)
        t += steps
        if len(uni["full"]) < BATCH or rounds >= checks:
            continue
        for _ in range(per_chunk):
            rounds += 1
            where = f"row {t * E}"
            want = batch_fields(uni["full"].sample(BATCH))
            for name in ("frames-aos", "frames-soa"):
                tally["uniform"].same(f"{where}, {name} vs full", batch_fields(uni[name].sample(BATCH)), want,
                                      FIELDS + ("indices",))
            tally["uniform"].same(f"{where}, full vs numpy", want, naive.gather(want["indices"]), FIELDS)
            want = batch_fields(nst["full"].sample(BATCH), ("discounts",))
            tally["n_step"].same(f"{where}, n-step frames-soa vs full", batch_fields(nst["frames-soa"].sample(BATCH),
                                 ("discounts",)), want, FIELDS + ("indices", "discounts"))
            tally["n_step"].same(f"{where}, n-step full vs numpy", want, naive.nstep(want["indices"], N_STEP, GAMMA),
                                 FIELDS + ("discounts",))
            want = batch_fields(pri["full"].sample(BATCH), ("weights",))
            got = batch_fields(pri["frames-aos"].sample(BATCH), ("weights",))
            tally["prioritized"].same(f"{where}, prioritized frames-aos vs full", got, want,
                                      FIELDS + ("indices", "weights"))
            tally["prioritized"].same(f"{where}, prioritized full vs numpy", want, naive.gather(want["indices"]), FIELDS)
            prio = rng.random(BATCH) * 10 + 0.01
            for b in pri.values():
                b.update_priorities(want["indices"], prio)
    flags = {"episode_ends": int((rows["terminated"] | rows["truncated"]).sum()),
             "truncations": int(rows["truncated"].sum())}
    return {"capacity": capacity, "rows_written": len(rows["action"]), "wraps": len(rows["action"]) / capacity,
            "pushes": pushes, "extends": extends, **flags,
            **{k: {"batches": v.batches, "rows": v.rows, "bytes": v.bytes, "mismatches": len(v.mismatches),
                   "first_mismatches": v.mismatches[:5]} for k, v in tally.items()}}


# ---------------------------------------------------------------------------------------------
# 4a. The cold tier's compression ratio on each stream (measured while the stream is at hand)
# ---------------------------------------------------------------------------------------------
def cold_ratio(rows: dict, num_envs: int, workdir: str, name: str) -> dict:
    """Every row of the stream in a spilling frame buffer with the tier, all but a small hot
    window cold: the tier's ratio (raw frames / compressed bytes of the blocks held)."""
    import tfdata

    n = len(rows["action"])
    path = os.path.join(workdir, f"ratio-{name}")
    buf = tfdata.ReplayBuffer(SPEC, n, layout="aos", frame_stack=FRAMES, num_envs=num_envs, seed=0,
                              spill_path=path, hot_rows=max(num_envs, min(COLD_HOT_ROWS_RATIO * num_envs, n // 8)),
                              compress_cold=True)
    for c in chunks_of(rows, n, 1000 - 1000 % num_envs):
        buf.extend(c)
    info = buf.cold_info["obs"]
    del buf
    gc.collect()
    remove(path)
    return {"rows": n, "num_envs": num_envs, **{k: info[k] for k in ("blocks", "raw_bytes", "compressed_bytes",
                                                                   "ratio", "refused")}}


def collect_and_check(mode: str, workdir: str, log) -> tuple:
    """Per (game, policy, stream): collect the transitions, run the exactness checks at both
    capacities, measure the tier's ratio; keep each game's random one-env stream as a block."""
    results, ratios, blocks, sources = [], [], {}, []
    policies = QUICK_POLICIES if mode == "quick" else tuple(POLICIES)
    for game in GAMES[mode]:
        for policy in policies:
            for stream, (E, T, max_steps, seed) in STREAMS[mode].items():
                t0 = time.perf_counter()
                d = atari_transitions(game, T, num_envs=E, seed=seed, epsilon=POLICIES[policy],
                                      max_episode_steps=max_steps)
                collect_s = time.perf_counter() - t0
                rows = rows_of(d, E)
                src = {"game": game, "policy": policy, "stream": stream, "num_envs": E, "steps": T,
                       "max_episode_steps": max_steps, "seed": seed, "transitions": len(rows["action"]),
                       "episode_ends": int((rows["terminated"] | rows["truncated"]).sum()),
                       "truncations": int(rows["truncated"].sum()), "collect_s": collect_s}
                sources.append(src)
                for cname, capacity in CAPACITIES.items():
                    t1 = time.perf_counter()
                    r = exactness_run(rows, E, capacity(T, E), CHECKS[mode], seed=seed + 1)
                    r.update(game=game, policy=policy, stream=stream, num_envs=E, ring=cname,
                             seconds=time.perf_counter() - t1)
                    results.append(r)
                    bad = sum(r[k]["mismatches"] for k in ("uniform", "n_step", "prioritized"))
                    log(f"  exactness {game}/{policy}/{stream} capacity {r['capacity']} ({r['wraps']:.1f} laps): "
                        f"{sum(r[k]['batches'] for k in ('uniform', 'n_step', 'prioritized'))} batches, "
                        f"{bad} mismatches ({r['seconds']:.1f} s)")
                ratios.append({"game": game, "policy": policy, "stream": stream,
                               **cold_ratio(rows, E, workdir, f"{game}-{policy}-{stream}")})
                if policy == "random" and stream == "E1":
                    blocks[game] = repeatable_block(d)
                log(f"{game:<9} {policy:<10} {stream:<8} {src['transitions']:,} transitions, "
                    f"{src['episode_ends']} episode ends ({src['truncations']} truncated), collected in "
                    f"{collect_s:.1f} s; tier ratio {ratios[-1]['ratio']:.0f}")
                del d, rows
                gc.collect()
    return results, ratios, blocks, sources


# ---------------------------------------------------------------------------------------------
# 2. Memory
# ---------------------------------------------------------------------------------------------
# name -> ("tfdata", options) | ("baseline", _atari_baselines kind) | ("numpy-frame", None)
MEMORY_KINDS = {
    "tfdata frames AoS": ("tfdata", {"layout": "aos", "frame_stack": FRAMES}),
    "tfdata frames SoA": ("tfdata", {"layout": "soa", "frame_stack": FRAMES}),
    "tfdata full stacks": ("tfdata", {"layout": "aos"}),
    "tfdata elide_next": ("tfdata", {"layout": "aos", "elide_next": True}),
    "numpy one frame": ("numpy-frame", None),
    "numpy full stacks": ("baseline", "numpy"),
    "SB3": ("baseline", "sb3"),
    "SB3 optimize_memory_usage": ("baseline", "sb3-optimized"),
}


def planned_row_bytes(kind: str, capacity: int) -> int:
    """Bytes the buffer of ``kind`` holds for ``capacity`` rows (sampling batches of 32)."""
    import tfdata

    family, opt = MEMORY_KINDS[kind]
    if family == "tfdata":
        return int(sum(tfdata.ReplayBuffer.plan_memory(SPEC, capacity, batch_sizes=(BATCH,), **opt).values()))
    if family == "numpy-frame":
        return capacity * ONE_FRAME_ROW
    return planned_bytes(opt, capacity)


def fits(kind: str, budget: int) -> int:
    """Transitions a buffer of ``kind`` holds within ``budget`` bytes."""
    import tfdata.memory

    family, opt = MEMORY_KINDS[kind]
    if family == "tfdata":
        return int(tfdata.memory.max_capacity(SPEC, budget, batch_size=BATCH, **opt))
    return budget // (planned_row_bytes(kind, 1000) // 1000)


def measure_tfdata(options: dict, capacity: int, block: dict) -> dict:
    """In a fresh forked process: RSS before building, after building, after writing ``capacity``
    transitions (the block repeated, extends of 1,000 rows) and after the first sample(32)."""
    import tfdata

    fresh = fresh_pages_allocator()
    warm = tfdata.ReplayBuffer(SPEC, 64, seed=0, **options)  # load every kernel before the first reading
    for c in chunks_of(block, 64, 64):
        warm.extend(c)
    warm.sample(BATCH)
    del warm
    gc.collect()
    r0 = rss_bytes()
    buf = tfdata.ReplayBuffer(SPEC, capacity, seed=0, **options)
    r1 = rss_bytes()
    t0 = time.perf_counter()
    for c in chunks_of(block, capacity, 1000):
        buf.extend(c)
    fill_s = time.perf_counter() - t0
    r2 = rss_bytes()
    buf.sample(BATCH)
    r3 = rss_bytes()
    return {"fresh_pages_allocator": fresh, "rss_before": r0, "build_rss_growth": r1 - r0,
            "fill_rss_growth": r2 - r0, "sampled_rss_growth": r3 - r0, "nbytes": buf.nbytes,
            "nbytes_parts": buf.nbytes_parts, "fill_s": fill_s, "add_us": fill_s / capacity * 1e6}


def measure_numpy_frame(capacity: int, block: dict) -> dict:
    fresh = fresh_pages_allocator()
    rows = row_dicts(block)
    r0 = rss_bytes()
    buf = NumpyFrameBuffer(capacity)
    r1 = rss_bytes()
    t0 = time.perf_counter()
    for i in range(capacity):
        buf.push(rows[i % len(rows)])
    fill_s = time.perf_counter() - t0
    r2 = rss_bytes()
    return {"fresh_pages_allocator": fresh, "rss_before": r0, "build_rss_growth": r1 - r0,
            "fill_rss_growth": r2 - r0, "sampled_rss_growth": r2 - r0, "nbytes": buf.nbytes,
            "fill_s": fill_s, "add_us": fill_s / capacity * 1e6}


def memory(block: dict, fill: int, kinds, log) -> list:
    """Per kind: planned bytes for 1M and for ``fill``, measured RSS after ``fill`` transitions (in
    a fresh forked process, when the machine has the memory free), what fits in 1, 2, 4 GB."""
    import psutil

    d = {**block, "num_actions": 4}
    out = []
    for kind in kinds:
        family, opt = MEMORY_KINDS[kind]
        r = {"kind": kind, "planned_1m_bytes": planned_row_bytes(kind, PLAN_FOR),
             "planned_fill_bytes": planned_row_bytes(kind, fill), "filled": fill,
             "fits": {str(gb): fits(kind, gb << 30) for gb in BUDGETS_GB}}
        r["planned_bytes_per_row"] = r["planned_1m_bytes"] / PLAN_FOR
        if family == "tfdata":
            import tfdata

            r["planned_1m_parts"] = tfdata.ReplayBuffer.plan_memory(SPEC, PLAN_FOR, batch_sizes=(BATCH,), **opt)
        r["over_one_frame"] = r["planned_bytes_per_row"] / ONE_FRAME_ROW
        free = psutil.virtual_memory().available
        if free < MEMORY_HEADROOM * r["planned_fill_bytes"]:
            r["measured"] = {"skipped": f"{fmt_bytes(free)} free, {fmt_bytes(r['planned_fill_bytes'])} needed"}
        else:
            if family == "tfdata":
                m = run_forked(measure_tfdata, opt, fill, block)
            elif family == "numpy-frame":
                m = run_forked(measure_numpy_frame, fill, block)
            else:
                m = run_forked(measure_baseline, opt, fill, fill, d, 50)
                m["nbytes"] = m.get("arrays_bytes")
                m["sampled_rss_growth"] = m.get("fill_rss_growth")
            if "error" not in m:
                m["rss_bytes_per_row"] = m["sampled_rss_growth"] / fill
                m["rss_over_one_frame"] = m["rss_bytes_per_row"] / ONE_FRAME_ROW
            r["measured"] = m
        out.append(r)
        m = r["measured"]
        log(f"  memory {kind:<26} planned {r['planned_bytes_per_row']:9,.0f} B/row ({r['over_one_frame']:.3f}x), "
            + (f"RSS {m['rss_bytes_per_row']:9,.0f} B/row at {fill:,}" if "rss_bytes_per_row" in m
               else f"not measured: {m.get('skipped') or m.get('error')}"))
    return out


# ---------------------------------------------------------------------------------------------
# 3. Speed
# ---------------------------------------------------------------------------------------------
def fill_whole_blocks(buf, block: dict, capacity: int) -> None:
    """Write whole repetitions of the block until the ring is full: the stream then ends at the
    block's end, so pushing the block's rows from its first continues it."""
    n = len(block["action"])
    for c in chunks_of(block, math.ceil(capacity / n) * n, 1000):
        buf.extend(c)


def speed(block: dict, rows: int, full_rows: int, rounds: int, slice_ms: int, with_sb3: bool, log) -> dict:
    """sample(32) and push of every candidate, interleaved in rounds (one process)."""
    import tfdata

    bufs = {"tfdata frames AoS": tfdata.ReplayBuffer(SPEC, rows, layout="aos", frame_stack=FRAMES, seed=0),
            "tfdata frames SoA": tfdata.ReplayBuffer(SPEC, rows, layout="soa", frame_stack=FRAMES, seed=0),
            "tfdata full stacks": tfdata.ReplayBuffer(SPEC, full_rows, layout="aos", seed=0)}
    for b in bufs.values():
        fill_whole_blocks(b, block, b.capacity)
    rng = np.random.default_rng(0)
    base = {"numpy full stacks": make_baseline("numpy", full_rows)}
    if with_sb3:
        base["SB3"] = make_baseline("sb3", full_rows)
        base["SB3 optimize_memory_usage"] = make_baseline("sb3-optimized", full_rows)
    rows_list = row_dicts(block)
    sb3_args = [(r["obs"][None], r["next_obs"][None], np.array([[r["action"]]]), np.array([r["reward"]]),
                 np.array([r["terminated"] or r["truncated"]]), [{"TimeLimit.truncated": r["truncated"]}])
                for r in rows_list]
    for i in range(full_rows):  # full rings (the numpy buffer's add takes the fields)
        r = rows_list[i % len(rows_list)]
        base["numpy full stacks"].add(r["obs"], r["next_obs"], r["action"], r["reward"], r["terminated"],
                                      r["truncated"])
        for k in ("SB3", "SB3 optimize_memory_usage"):
            if k in base:
                base[k].add(*sb3_args[i % len(sb3_args)])
    one, checked = NumpyFrameBuffer(rows), CheckedNumpyFrameBuffer(rows)
    for i in range(math.ceil(rows / len(rows_list)) * len(rows_list)):  # full, the stream at a block end
        one.push(rows_list[i % len(rows_list)])
        checked.push(rows_list[i % len(rows_list)])
    frames_bytes = rows * FRAME_BYTES
    ref = {"memcpy (DRAM)": Memcpy(OUT_BYTES, frames_bytes, hot=False),
           "memcpy (hot cache)": Memcpy(OUT_BYTES, OUT_BYTES, hot=True)}
    sample_fns = {**{k: (lambda b=b: b.sample(BATCH)) for k, b in bufs.items()},
                  "numpy full stacks": lambda: base["numpy full stacks"].sample(BATCH, rng),
                  **{k: (lambda b=base[k]: b.sample(BATCH)) for k in ("SB3", "SB3 optimize_memory_usage") if k in base},
                  **{k: m.copy for k, m in ref.items()}}
    push_fns = {"tfdata frames AoS": bufs["tfdata frames AoS"].push, "tfdata frames SoA": bufs["tfdata frames SoA"].push,
                "tfdata full stacks": bufs["tfdata full stacks"].push, "numpy one frame": one.push,
                "numpy one frame + checks": checked.push,
                "numpy full stacks": lambda r: base["numpy full stacks"].add(r["obs"], r["next_obs"], r["action"],
                                                                           r["reward"], r["terminated"], r["truncated"])}
    timers = {("sample", k): SliceTimer(fn, [()], 1, warmup=3, min_calls=5) for k, fn in sample_fns.items()}
    timers.update({("push", k): SliceTimer(fn, [(r,) for r in rows_list], 1, warmup=3, min_calls=20)
                   for k, fn in push_fns.items()})
    for k in ("SB3", "SB3 optimize_memory_usage"):
        if k in base:
            timers[("push", k)] = SliceTimer(base[k].add, sb3_args, 1, warmup=3, min_calls=20)
    for t in timers.values():  # warm-up: output rings, caches, every code path once
        t.run_slice(0)
        t.times_ns.clear()
    t0 = time.perf_counter()
    run_rounds(list(timers.values()), rounds, slice_ms * 1_000_000, shift=lambda r: 3 * r)
    log(f"  speed: {rounds} rounds in {time.perf_counter() - t0:.0f} s")
    out = {"rows": rows, "full_rows": full_rows, "rounds": rounds, "slice_ms": slice_ms, "sample": {}, "push": {}}
    for (op, k), t in timers.items():
        ts = np.asarray(t.times_ns) / 1e3
        out[op][k] = {"median_us": float(np.median(ts)), "p10_us": float(np.percentile(ts, 10)),
                      "p90_us": float(np.percentile(ts, 90)), "p99_us": float(np.percentile(ts, 99)),
                      "calls": int(ts.size)}
    out["memory_bytes"] = {k: b.nbytes for k, b in bufs.items()}
    out["frames_pool_bytes"] = frames_bytes
    del bufs, base, one, checked, ref, timers, sample_fns, push_fns
    gc.collect()
    return out


# ---------------------------------------------------------------------------------------------
# 4b. The cold tier: sample(32) with 50% and 90% of the rows cold
# ---------------------------------------------------------------------------------------------
def cold_sampling(block: dict, game: str, rows: int, workdir: str, rounds: int, calls: int, disk_calls: int,
                  log) -> list:
    """For each cold fraction: the tier, the spill from the page cache, the spill from the disk,
    and RAM, filled alike, their sample(32) interleaved in rounds."""
    import tfdata

    ram = tfdata.ReplayBuffer(SPEC, rows, layout="aos", frame_stack=FRAMES, seed=0)
    fill_whole_blocks(ram, block, rows)
    out = []
    for cold in COLD_FRACTIONS:
        # every spilling buffer of the previous fraction is gone (and its map closed) before the
        # next ones are built: a spilling buffer measures its resident pages as the process's
        # file-backed RSS above what it was at construction, so file pages of other buffers
        # released later would let it keep that much more of its own cold rows mapped
        gc.collect()
        out.append(time_tiers(ram, block, game, rows, cold, workdir, rounds, calls, disk_calls))
        r = out[-1]
        log(f"  cold {game} {cold:.0%}: " + ", ".join(f"{t} {v['median_us'] / 1e3:.2f} ms" for t, v in r["tiers"].items()))
    return out


def time_tiers(ram, block: dict, game: str, rows: int, cold: float, workdir: str, rounds: int, calls: int,
               disk_calls: int) -> dict:
    import tfdata

    hot = max(1, round(rows * (1 - cold)))
    bufs, paths, buf = {"ram": ram}, {}, None
    for tier in ("tier", "page cache", "disk") if hasattr(os, "posix_fadvise") else ("tier", "page cache"):
        paths[tier] = os.path.join(workdir, f"cold-{game}-{cold}-{tier.replace(' ', '-')}")
        bufs[tier] = tfdata.ReplayBuffer(SPEC, rows, layout="aos", frame_stack=FRAMES, seed=0,
                                         spill_path=paths[tier], hot_rows=hot, compress_cold=tier == "tier")
        fill_whole_blocks(bufs[tier], block, rows)
    try:
        for buf in bufs.values():  # output rings, the tier's cache
            for _ in range(10):
                buf.sample(BATCH)
        times = {k: [] for k in bufs}
        cached_before, cached_after = [], []
        pc = time.perf_counter_ns
        for r in range(rounds):
            for tier in rotated(list(bufs), r):
                buf = bufs[tier]
                for i in range(disk_calls if tier == "disk" else calls):
                    if tier == "disk":
                        drop_page_cache(paths[tier])
                        if i == 0:
                            cached_before.append(cached_bytes(paths[tier]))
                    t0 = pc()
                    buf.sample(BATCH)
                    times[tier].append(pc() - t0)
                    if tier == "disk" and i == 0:
                        cached_after.append(cached_bytes(paths[tier]))
        res = {"game": game, "rows": rows, "cold_fraction": cold, "hot_rows": hot, "tiers": {}}
        for tier, ts in times.items():
            ts = np.asarray(ts) / 1e3
            buf = bufs[tier]
            fb = sum(os.path.getsize(f) for f in spill_files(paths[tier])) if tier in paths else 0
            res["tiers"][tier] = {"median_us": float(np.median(ts)), "p10_us": float(np.percentile(ts, 10)),
                                  "p90_us": float(np.percentile(ts, 90)), "calls": int(ts.size),
                                  "nbytes": buf.nbytes, "nbytes_parts": buf.nbytes_parts, "file_bytes": fb,
                                  "file_cached_bytes": cached_bytes(paths[tier]) if tier in paths else None}
            if tier == "tier":
                res["tiers"][tier]["cold_info"] = buf.cold_info["obs"]
            if tier == "disk" and all(c is not None for c in cached_before + cached_after):
                res["tiers"][tier]["cached_before_call"] = float(np.mean(cached_before)) / fb
                res["tiers"][tier]["cached_after_call"] = float(np.mean(cached_after)) / fb
        return res
    finally:
        for tier in paths:
            del bufs[tier]
        del buf
        gc.collect()
        for p in paths.values():
            remove(p)


# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------
def exactness_totals(results: list) -> dict:
    tot = {k: {"batches": 0, "rows": 0, "bytes": 0, "mismatches": 0} for k in ("uniform", "n_step", "prioritized")}
    for r in results:
        for k, t in tot.items():
            for f in t:
                t[f] += r[k][f]
    tot["all"] = {f: sum(tot[k][f] for k in ("uniform", "n_step", "prioritized")) for f in tot["uniform"]}
    return tot


def targets(mem: list, spd: dict) -> dict:
    m = {r["kind"]: r for r in mem}
    s, p = spd["sample"], spd["push"]
    dram = s["memcpy (DRAM)"]["median_us"]
    hot = s["memcpy (hot cache)"]["median_us"]
    one = p["numpy one frame"]["median_us"]
    checked = p["numpy one frame + checks"]["median_us"]
    out = {"memory": {}, "sample": {}, "push": {}}
    for k in ("tfdata frames AoS", "tfdata frames SoA"):
        if k in m:
            meas = m[k]["measured"]
            out["memory"][k] = {"planned": m[k]["over_one_frame"], "measured": meas.get("rss_over_one_frame"),
                                "met": m[k]["over_one_frame"] <= TARGET_MEMORY
                                and (meas.get("rss_over_one_frame") or 0) <= TARGET_MEMORY}
        out["sample"][k] = {"over_memcpy_dram": s[k]["median_us"] / dram, "over_memcpy_hot": s[k]["median_us"] / hot,
                            "met": s[k]["median_us"] <= TARGET_SAMPLE * dram}
        out["push"][k] = {"over_numpy_one_frame": p[k]["median_us"] / one, "over_numpy_checked": p[k]["median_us"] / checked,
                          "met": p[k]["median_us"] <= TARGET_PUSH * one}
    return out


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
COLORS = {"tfdata frames AoS": "tab:blue", "tfdata frames SoA": "tab:cyan", "tfdata full stacks": "tab:purple",
          "tfdata elide_next": "tab:pink", "numpy one frame": "tab:olive", "numpy one frame + checks": "tab:green",
          "numpy full stacks": "tab:gray",
          "SB3": "tab:red", "SB3 optimize_memory_usage": "tab:orange", "memcpy (DRAM)": "k",
          "memcpy (hot cache)": "0.6"}
TIER_COLORS = {"ram": "tab:blue", "tier": "tab:green", "page cache": "tab:orange", "disk": "tab:red"}


def figures(mem: list, spd: dict, cold: list, ratios: list) -> dict:
    """The report's figures (name -> file), drawn from results.json by the generic kinds of _plots."""
    kinds, fill = [r["kind"] for r in mem], mem[0]["filled"]
    gib_1m = lambda b: b * PLAN_FOR / 2**30  # noqa: E731
    measured = [gib_1m(r["measured"]["rss_bytes_per_row"]) if "rss_bytes_per_row" in r["measured"] else np.nan
                for r in mem]
    memory = [partial(hbar_pairs, labels=kinds, first=[r["planned_1m_bytes"] / 2**30 for r in mem], second=measured,
                      colors=[COLORS[k] for k in kinds], xlabel="GiB per 1M transitions (log)",
                      names=("planned for 1M", f"RSS measured at {fill:,}, x {PLAN_FOR // fill}"),
                      lines=[(gib_1m(ONE_FRAME_ROW), dict(color="k", lw=0.8, ls=":", label="one frame + other fields")),
                             (gib_1m(TARGET_MEMORY * ONE_FRAME_ROW),
                              dict(color="r", lw=1, ls="--", label=f"target {TARGET_MEMORY}x"))]),
              partial(bars, groups=[k.replace(" ", "\n", 1) for k in kinds], tick_fontsize=7,
                      series={f"{gb} GB": [r["fits"][str(gb)] for r in mem] for gb in BUDGETS_GB},
                      ylabel="transitions that fit (log)")]
    speed = [partial(hbar_medians, stats=spd[op], colors=COLORS, ref=ref, target=target, title=title)
             for op, ref, target, title in (("sample", "memcpy (DRAM)", TARGET_SAMPLE, "sample(32), obs + next_obs"),
                                            ("push", "numpy one frame", TARGET_PUSH, "push of one transition"))]
    games = list(dict.fromkeys(r["game"] for r in cold))
    by_game = [[r for r in cold if r["game"] == g] for g in games]
    tiers = [partial(bars, groups=[f"{r['cold_fraction']:.0%} cold" for r in rs], colors=TIER_COLORS,
                     series={t: [r["tiers"][t]["median_us"] / 1e3 for r in rs] for t in rs[0]["tiers"]},
                     ylabel="sample(32) ms (median, log)", title=f"{rs[0]['game']}, {rs[0]['rows']:,} rows")
             for rs in by_game]
    tiers.append(partial(hbars, labels=[f"{r['game']} {r['policy']} {r['stream']}" for r in ratios],
                         values=[r["ratio"] for r in ratios], color="tab:green", xlabel="compression ratio of the tier",
                         title="ratio per stream (zstd 3, 16-slot blocks)"))
    return {"memory": panels_figure(OUT_DIR, "memory.png", (13, 4.8), memory,
                                    suptitle="Memory of an Atari replay buffer (4 x 84 x 84 uint8 obs and next_obs)"),
            "speed": panels_figure(OUT_DIR, "speed.png", (13, 4.8), speed),
            "cold": panels_figure(OUT_DIR, "cold.png", (5 * (len(games) + 1), 4.4), tiers)}


def _x(v, nd=2) -> str:
    return "-" if v is None else f"{v:.{nd}f}x"


def _mib(b) -> str:
    return "-" if b is None else fmt_bytes(b)


# the tables: (header, align, cell) per column, a cell a format string of a results.json record or a callable
EXACT_COLUMNS = [("game", "l", "{game}"), ("policy", "l", "{policy}"), ("stream", "l", "{stream}"),
                 ("envs", "r", "{num_envs}"), ("transitions", "r", "{rows_written:,}"),
                 ("ends (trunc.)", "r", "{episode_ends} ({truncations})"), ("capacity", "r", "{capacity:,}"),
                 ("laps", "r", "{wraps:.1f}"), ("rows pushed / extends", "r", "{pushes} / {extends}"),
                 ("uniform", "r", "{uniform[batches]}"), ("n-step", "r", "{n_step[batches]}"),
                 ("prioritized", "r", "{prioritized[batches]}"),
                 ("mismatches", "r", lambda r: sum(r[k]["mismatches"] for k in ("uniform", "n_step", "prioritized")))]
RATIO_COLUMNS = [("game", "l", "{game}"), ("policy", "l", "{policy}"), ("stream", "l", "{stream}"),
                 ("rows", "r", "{rows:,}"), ("blocks", "r", "{blocks}"), ("raw", "r", lambda r: _mib(r["raw_bytes"])),
                 ("compressed", "r", lambda r: _mib(r["compressed_bytes"])), ("ratio", "r", "{ratio:.0f}")]


def _page_cache_note(r: dict) -> str:
    """The last column of the cold-sampling table: the file in the page cache (disk: before and
    after a timed call)."""
    if r["tier"] == "disk" and r.get("cached_before_call") is not None:
        return (f"{r['cached_before_call']:.0%} before a timed call, {r['cached_after_call']:.0%} after "
                f"(hot rows: {1 - r['cold']:.0%})")
    return _mib(r.get("file_cached_bytes")) if r.get("file_cached_bytes") is not None else "-"


COLD_COLUMNS = [("game", "l", "{game}"), ("cold", "l", "{cold:.0%}"), ("tier", "l", "{tier}"),
                ("median ms", "r", lambda r: f"{r['median_us'] / 1e3:.2f}"),
                ("p10 ms", "r", lambda r: f"{r['p10_us'] / 1e3:.2f}"), ("p90 ms", "r", lambda r: f"{r['p90_us'] / 1e3:.2f}"),
                ("calls", "r", "{calls}"), ("x ram", "r", lambda r: f"{r['median_us'] / r['ram_us']:.1f}"),
                ("nbytes (resident)", "r", lambda r: _mib(r["nbytes"])),
                ("spill file", "r", lambda r: _mib(r["file_bytes"]) if r["file_bytes"] else "-"),
                ("file in page cache", "r", _page_cache_note)]


def memory_columns(filled: int) -> list:
    m = lambda r: r["measured"]  # noqa: E731
    return ([("buffer", "l", "{kind}"), ("planned B / transition", "r", "{planned_bytes_per_row:,.0f}"),
             ("x one frame", "r", "{over_one_frame:.3f}"),
             ("GiB per 1M", "r", lambda r: f"{r['planned_1m_bytes'] / 2**30:.2f}"),
             (f"RSS B / transition at {filled:,}", "r",
              lambda r: f"{m(r)['rss_bytes_per_row']:,.0f}" if "rss_bytes_per_row" in m(r)
              else f"({m(r).get('skipped') or m(r).get('error')})"),
             ("RSS x one frame", "r", lambda r: _x(m(r).get("rss_over_one_frame"), 3))]
            + [(f"fit in {gb} GB", "r", lambda r, gb=gb: f"{r['fits'][str(gb)]:,}") for gb in BUDGETS_GB])


def speed_columns(ref: str, ref_us: float) -> list:
    return [("candidate", "l", "{candidate}"), ("median µs", "r", "{median_us:.1f}"), ("p10 µs", "r", "{p10_us:.1f}"),
            ("p90 µs", "r", "{p90_us:.1f}"), ("p99 µs", "r", "{p99_us:.1f}"), ("calls", "r", "{calls:,}"),
            (f"x {ref}", "r", lambda r: f"{r['median_us'] / ref_us:.2f}")]


def pool_sentence(spd: dict, run: dict) -> str:
    """Whether the DRAM memcpy's pool came from memory, judged by its time against the hot copy (the
    L3 size is the run's machine's, as recorded)."""
    l3 = next((c["size_bytes"] for c in run["environment"]["cpu"]["caches_cpu0"]
               if c["level"] == 3 and c["type"] in ("Unified", "Data")), None)
    slower = spd["sample"]["memcpy (DRAM)"]["median_us"] / spd["sample"]["memcpy (hot cache)"]["median_us"]
    pool = spd["frames_pool_bytes"]
    text = f"The DRAM memcpy's pool is {pool / 2**20:,.0f} MiB"
    if l3:
        text += f" (the machine reports an L3 of {l3 / 2**20:,.0f} MiB, shared: on a virtual machine, with other guests too)"
    return text + (f"; it is copied {slower:.2f}x slower than the hot source, so " +
                   ("not from the caches." if slower >= 1.2 else "largely from the caches (a small pool in this "
                                                                   "run): ratios to it are harsher on tfdata, not kinder."))


def headline(tot, tg, spd, cold, ratios) -> str:
    aos = "tfdata frames AoS"
    mem = tg["memory"].get(aos, {})
    r = np.median([x["ratio"] for x in ratios])
    games = "/".join(dict.fromkeys(r["game"] for r in ratios))
    return (f"real {games}: {tot['all']['batches']:,} batches bit-identical to the environments' full stacks "
            f"({tot['all']['mismatches']} mismatches); {mem.get('planned', float('nan')):.3f}x one frame per "
            f"transition at 1M (target {TARGET_MEMORY}x {'met' if mem.get('met') else 'missed'}); sample(32) "
            f"{tg['sample'][aos]['over_memcpy_dram']:.2f}x a DRAM memcpy of its bytes (target {TARGET_SAMPLE}x "
            f"{'met' if tg['sample'][aos]['met'] else 'missed'}); push {tg['push'][aos]['over_numpy_one_frame']:.1f}x a "
            f"numpy one-frame write (target {TARGET_PUSH}x {'met' if tg['push'][aos]['met'] else 'missed'}); "
            f"cold tier ratio {r:.0f} (median over streams).")


def write_report(run, sources, exact, tot, ratios, mem, spd, cold, tg, pngs, mode, with_sb3) -> None:
    aos, soa = "tfdata frames AoS", "tfdata frames SoA"
    L = ["# Atari frames: one frame per transition on real ALE, exact, small and fast?\n",
         f"<!-- headline: {headline(tot, tg, spd, cold, ratios)} -->\n",
         f"Made by `experiments/atari_frames.py` ({mode} run, command `{run['command']}`, "
         f"{run['wall_clock_s']:.0f} s). Raw numbers: `results.json`. Issue 22's questions, on real "
         "Atari frames; a `tfdata.ReplayBuffer(spec, capacity, frame_stack={\"obs\": 4})` against the "
         "buffers people use.\n"]
    if not with_sb3:
        L.append("**stable-baselines3 is not installed: its buffers were not measured** (`pip install -e '.[dqn]'`).\n")
    L.append("## Targets\n")
    bad = tot["all"]["mismatches"]
    met = lambda ok: "**met**" if ok else "**missed**"  # noqa: E731
    rows = [["exactness", "every buffer", f"{bad:,} mismatches in {tot['all']['batches']:,} batches of {BATCH} "
             f"({tot['all']['rows']:,} rows, {tot['all']['bytes'] / 2**30:.1f} GiB of fields, {len(sources)} streams, "
             f"rings wrapping up to {max(r['wraps'] for r in exact):.0f} times)", "0", met(bad == 0)]]
    for k in (aos, soa):
        if k in tg["memory"]:
            t = tg["memory"][k]
            rows.append(["memory per transition, x one frame + the other fields", k,
                         f"{t['planned']:.3f}x planned for 1M (a sample(32) ring included); RSS at "
                         f"{mem[0]['filled']:,}: {_x(t['measured'], 3)}", f"{TARGET_MEMORY}x", met(t["met"])])
    for k in (aos, soa):
        t = tg["sample"][k]
        rows.append(["sample(32), x a memcpy of its bytes from DRAM", k,
                     f"{t['over_memcpy_dram']:.2f}x ({spd['sample'][k]['median_us']:.0f} µs against "
                     f"{spd['sample']['memcpy (DRAM)']['median_us']:.0f}; {t['over_memcpy_hot']:.2f}x a hot-cache "
                     "memcpy)", f"{TARGET_SAMPLE}x", met(t["met"])])
    for k in (aos, soa):
        t = tg["push"][k]
        rows.append(["push, x a numpy write of one frame and the small fields", k,
                     f"{t['over_numpy_one_frame']:.1f}x ({spd['push'][k]['median_us']:.1f} µs against "
                     f"{spd['push']['numpy one frame']['median_us']:.2f}; {t['over_numpy_checked']:.2f}x the numpy "
                     "write with tfdata's checks)", f"{TARGET_PUSH}x", met(t["met"])])
    rat = {g: [r["ratio"] for r in ratios if r["game"] == g] for g in dict.fromkeys(r["game"] for r in ratios)}
    rows.append(["cold tier compression ratio", "AoS, zstd", ", ".join(f"{g} {min(v):.0f}-{max(v):.0f}"
                                                                       for g, v in rat.items()), "-", "-"])
    L += md_table(["target", "buffer", "measured", "target", "met?"], rows, "lllrl")
    L.append("")

    # 1. exactness
    L.append("## 1. Exactness\n")
    L.append(f"Every transition the environments returned is written into every buffer in chunks of 1-"
             f"{2 * MEAN_CHUNK - 1} steps drawn at random (one environment: {PUSH_SHARE:.0%} of the chunks row by row "
             "with `push`, the others with `extend`; four: `extend`); after "
             "each chunk, batches are drawn and compared field by field (`np.array_equal` of obs, next_obs, action, "
             "reward, terminated, truncated; and indices, n-step discounts, prioritized weights between the tfdata "
             "buffers). *uniform*: frames AoS and SoA against the full-stack tfdata buffer, that against the numpy "
             "ring at `batch.indices`. *n-step 3*: frames SoA against full stacks, that against windows the numpy "
             "side computes (return summed in float64 in order, next_obs and flags of the window's last row, "
             "`gamma**k`). *prioritized*: frames AoS against full stacks (the same `update_priorities` after each "
             "batch), that against the numpy ring.\n")
    L += table(exact, EXACT_COLUMNS)
    L.append("")
    L.append(f"Batches counted per comparison (a uniform check is three comparisons of one draw: AoS, SoA, numpy). "
             f"In all: uniform {tot['uniform']['batches']:,}, n-step {tot['n_step']['batches']:,}, prioritized "
             f"{tot['prioritized']['batches']:,} comparisons; {tot['all']['rows']:,} rows.\n")
    if bad:
        L.append("**Mismatches** (first ones):\n")
        for r in exact:
            for k in ("uniform", "n_step", "prioritized"):
                for m in r[k]["first_mismatches"]:
                    L.append(f"* {r['game']}/{r['policy']}/{r['stream']} capacity {r['capacity']}: {m['where']}, "
                             f"field {m['field']}, rows {m['rows']}")
        L.append("")

    # 2. memory
    L.append("## 2. Memory\n")
    L.append(f"Planned: bytes a buffer holds for {PLAN_FOR:,} transitions (tfdata: `ReplayBuffer.plan_memory(spec, "
             "1_000_000, batch_sizes=(32,), ...)`, the stored frames, episode bookkeeping, `K-1` frames per stream and "
             "a sample(32) output ring; SB3 and numpy: the arrays their dtypes give, SB3 storing reward, done and "
             "timeouts as float32). Measured: RSS growth of a fresh forked process from before building the buffer "
             f"to after writing {mem[0]['filled']:,} real transitions (and one sample(32)), divided by "
             f"{mem[0]['filled']:,}. Reference: one frame plus the other fields = {FRAME_BYTES:,} + {OTHER_BYTES} = "
             f"{ONE_FRAME_ROW:,} bytes. Fits: the largest capacity within the budget (tfdata: "
             "`tfdata.memory.max_capacity(spec, budget, batch_size=32, ...)`; the others: budget / planned bytes "
             "per row).\n")
    L += table(mem, memory_columns(mem[0]["filled"]))
    L.append("")
    a = next((r for r in mem if r["kind"] == aos), None)
    if a and "nbytes_parts" in a["measured"]:
        parts = a["measured"]["nbytes_parts"]
        L.append(f"`{aos}` at {a['filled']:,} rows, `nbytes_parts`: " + ", ".join(f"{k} {fmt_bytes(v)}" for k, v in parts.items())
                 + f" (`nbytes` {fmt_bytes(a['measured']['nbytes'])}, RSS growth {fmt_bytes(a['measured']['sampled_rss_growth'])}).")
        pp = a.get("planned_1m_parts")
        if pp:
            L.append(f"Planned for {PLAN_FOR:,}, per transition: " + ", ".join(f"{k} {v / PLAN_FOR:,.1f} B" for k, v in pp.items())
                     + f". Over one frame plus the other fields ({ONE_FRAME_ROW:,} B): the AoS record of the small fields "
                     "is padded to 8-byte words, and the bookkeeping is mostly the table of episodes' final frames "
                     "(`next_obs` of an episode's last row), allocated for one episode end per 64 rows and grown when "
                     "episodes are shorter (only the entries used become resident: the measured RSS is lower).")
        L.append("")
    L.append(f"![memory]({pngs['memory']})\n")

    # 3. speed
    L.append("## 3. Speed\n")
    L.append(f"One process; every candidate timed in slices of {spd['slice_ms']} ms, {spd['rounds']} rounds, the order "
             "rotated and reversed every other round (`_timing.run_rounds`), garbage collector off; each call "
             "timed alone (`perf_counter_ns`). Frame buffers and the one-frame numpy ring hold "
             f"{spd['rows']:,} rows ({spd['rows'] * FRAME_BYTES / 2**20:,.0f} MiB of frames); the full-stack buffers "
             f"(tfdata, SB3, numpy) {spd['full_rows']:,} rows ({spd['full_rows'] * 2 * K * FRAME_BYTES / 2**20:,.0f} MiB "
             "each, fewer rows to keep the run's memory down: all are beyond the caches). Every ring is full of real "
             "Breakout transitions; pushes continue the stream (the block repeated). The DRAM memcpy copies the "
             f"batch's {OUT_BYTES:,} bytes from a random offset of a pool as large as the frame buffers' frames; the "
             "hot one from one source that stays in the caches. SB3's sample returns torch tensors (its own copy "
             "included; torch with one thread, `torch.set_num_threads(1)`, as `tfdata run` sets `OMP_NUM_THREADS=1`: "
             "with two threads on this busy 2-core machine its sample took 30x longer); the numpy buffer's sample is "
             "fancy indexing into new arrays.\n")
    for op, ref, target in (("sample", "memcpy (DRAM)", TARGET_SAMPLE), ("push", "numpy one frame", TARGET_PUSH)):
        d = spd[op]
        L.append(f"**{op}** (ratio to {ref}; target {target}x for the frame buffers):\n")
        L += table([{"candidate": k, **v} for k, v in d.items()], speed_columns(ref, d[ref]["median_us"]))
        L.append("")
    L.append(f"![speed]({pngs['speed']})\n")

    # 4. cold tier
    L.append("## 4. The compressed cold tier\n")
    L.append("Ratio: every row of a stream in a spilling frame buffer (AoS) with `compress_cold=True` and a hot window "
             f"of {COLD_HOT_ROWS_RATIO} steps per environment (at most an eighth of the rows); `cold_info['obs']['ratio']` (raw frames / compressed "
             "bytes of the blocks held; zstd level 3, blocks of 16 consecutive slots: with 4 environments a block "
             "interleaves their frames).\n")
    L += table(ratios, RATIO_COLUMNS)
    L.append("")
    if cold:
        L.append(f"Sampling: {cold[0]['rows']:,} rows of the game's random-policy stream (AoS), `hot_rows` "
                 + ", ".join(f"{r['hot_rows']:,}" for r in cold[:len(COLD_FRACTIONS)]) + " (50%, 90% cold). *tier*: "
                 "`compress_cold=True`; *page cache*: the same spilling buffer without the tier (cold pages released by "
                 "the buffer, read back from the page cache, which holds the whole file here); *disk*: the same, its "
                 "file's pages dropped before every timed call (`fsync`, then `posix_fadvise(POSIX_FADV_DONTNEED)`: the "
                 "pages the buffer still maps stay: its hot rows and cold rows sampled since it last released them; "
                 "the last column gives the share of the file in the page cache, read with `mincore`, before and "
                 "after the first timed call of each round: a sample's page faults read ahead far more of the file "
                 "than the frames it needs); *ram*: a frame buffer without spill. Tiers interleaved in rounds "
                 "(order rotated). *nbytes*: the buffer's own memory (`nbytes`: hot rows, bookkeeping, output "
                 "ring, and for the tier its compressed copies and 4 MiB cache); *page cache* samples at its speed only "
                 "while the page cache holds the file (last column), the tier needs none of it (its file is cached "
                 "too here, having just been written, but cold frames come from the copies).\n")
        L += table([{**v, "game": r["game"], "cold": r["cold_fraction"], "tier": t, "ram_us": r["tiers"]["ram"]["median_us"]}
                    for r in cold for t, v in r["tiers"].items()], COLD_COLUMNS)
        L.append("")
        L.append(f"![cold tier]({pngs['cold']})\n")

    L += hand_written(OUT_DIR, "conclusion")
    L += ["## Method\n",
          "* Streams: " + "; ".join(f"{s['game']} {s['policy']} {s['stream']} ({s['num_envs']} env, {s['steps']:,} "
                                     f"steps, seed {s['seed']}" + (f", truncated at {s['max_episode_steps']} steps"
                                                                   if s["max_episode_steps"] else "")
                                     + f": {s['episode_ends']} ends, {s['truncations']} truncations)" for s in sources) + ".",
          f"* Sampling seed {BUFFER_SEED}. " + pool_sentence(spd, run), ""]
    L += hand_written(OUT_DIR, "method")
    write_methodology_report(OUT_DIR, L, run)


def publish(run, sources, exact, ratios, mem, spd, cold) -> tuple:
    """results.json, the plots and the report from the measurements."""
    tot, tg = exactness_totals(exact), targets(mem, spd)
    os.makedirs(OUT_DIR, exist_ok=True)
    pngs = figures(mem, spd, cold, ratios)
    write_json(os.path.join(OUT_DIR, "results.json"),
               {"methodology": run, "sources": sources, "targets": tg, "exactness_totals": tot, "exactness": exact,
                "cold_ratios": ratios, "memory": mem, "speed": spd, "cold_sampling": cold,
                "constants": {"one_frame_row_bytes": ONE_FRAME_ROW, "batch_bytes": OUT_BYTES,
                              "target_memory": TARGET_MEMORY, "target_sample": TARGET_SAMPLE, "target_push": TARGET_PUSH}})
    write_report(run, sources, exact, tot, ratios, mem, spd, cold, tg, pngs, run["mode"],
                 run["parameters"]["stable_baselines3"])
    return tot, tg


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = seeds_parser(__doc__, "Breakout, the random policy, small sizes (seconds)",
                      "unused (streams use fixed seeds, listed in the report)")
    args = ap.parse_args(argv)
    if args.render:
        import json

        with open(args.render, encoding="utf-8") as f:
            data = json.load(f)
        publish(data["methodology"], data["sources"], data["exactness"], data["cold_ratios"], data["memory"],
                data["speed"], data["cold_sampling"])
        return 0
    mode = "quick" if args.quick else "full"
    missing = [m for m in ("ale_py", "gymnasium", "cv2", "zstandard") if not have(m)]
    if missing:
        raise SystemExit(f"atari_frames: needs the atari and compress extras ({', '.join(missing)} missing): "
                         "pip install -e '.[atari,compress]'")
    with_sb3 = have("stable_baselines3")
    if with_sb3:  # imported once here: the forked memory measurements and the speed rounds share it
        import stable_baselines3  # noqa: F401
        import torch

        # one thread, as `tfdata run` sets OMP_NUM_THREADS=1: with two on this loaded 2-core machine,
        # SB3's sample (torch.tensor copies) took 12 ms instead of 0.4 ms (threads waiting for each other)
        torch.set_num_threads(1)
    os.makedirs(OUT_DIR, exist_ok=True)
    command = "python experiments/atari_frames.py" + "".join(" " + a for a in (argv if argv is not None else sys.argv[1:]))
    params = {"games": GAMES[mode], "policies": {p: POLICIES[p] for p in (QUICK_POLICIES if args.quick else POLICIES)},
              "streams": STREAMS[mode], "checks": CHECKS[mode], "n_step": N_STEP, "gamma": GAMMA,
              "plan_for": PLAN_FOR, "rss_fill": RSS_FILL[mode], "budgets_gb": BUDGETS_GB,
              "speed_rows": SPEED_ROWS[mode], "speed_full_rows": SPEED_FULL_ROWS[mode],
              "speed_rounds": SPEED_ROUNDS[mode], "speed_slice_ms": SPEED_SLICE_MS[mode], "cold_rows": COLD_ROWS[mode],
              "cold_fractions": COLD_FRACTIONS, "cold_rounds": COLD_ROUNDS[mode], "cold_calls": COLD_CALLS[mode],
              "disk_calls": DISK_CALLS[mode], "stable_baselines3": with_sb3}
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=[0], command=command, parameters=params)
    log = lambda s: print(s, flush=True)  # noqa: E731
    workdir = tempfile.mkdtemp(prefix="tfdata-atari-frames-")
    try:
        log("1. exactness (and the tier's ratio per stream)")
        exact, ratios, blocks, sources = collect_and_check(mode, workdir, log)
        block = blocks["Breakout"]
        log(f"2. memory (block of {len(block['action']):,} Breakout transitions)")
        kinds = [k for k, (fam, opt) in MEMORY_KINDS.items() if with_sb3 or not str(opt).startswith("sb3")]
        mem = memory(block, RSS_FILL[mode], kinds, log)
        log("3. speed")
        spd = speed(block, SPEED_ROWS[mode], SPEED_FULL_ROWS[mode], SPEED_ROUNDS[mode], SPEED_SLICE_MS[mode],
                    with_sb3, log)
        log("4. cold tier")
        cold = []
        for game, b in blocks.items():
            cold += cold_sampling(b, game, COLD_ROWS[mode], workdir, COLD_ROUNDS[mode], COLD_CALLS[mode],
                                  DISK_CALLS[mode], log)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    run = rec.finish(child_peak_rss_bytes=max((r["measured"].get("rss_before", 0) + r["measured"].get("sampled_rss_growth", 0)
                                               for r in mem if "rss_before" in r["measured"]), default=None))
    tot, tg = publish(run, sources, exact, ratios, mem, spd, cold)
    log(headline(tot, tg, spd, cold, ratios))
    log(f"{mode} run done in {run['wall_clock_s']:.0f} s; report: {os.path.relpath(OUT_DIR)}/README.md")
    if tot["all"]["mismatches"]:
        log(f"EXACTNESS FAILED: {tot['all']['mismatches']} mismatches (see the report)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
