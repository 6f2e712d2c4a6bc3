"""Frame codecs: which compressor for the cold tier of an Atari frame buffer?

The question. An Atari replay buffer stores one 84x84 uint8 frame per transition and rebuilds
the 4-frame stacks when it samples. Frames that leave the hot window go to a cold tier,
compressed in blocks of B consecutive frames of one stream, and are decompressed when a sample
needs them. Which maintained codec package (lz4, zstandard or blosc2), with which settings and
which block size B, when the target is a 512 MB board and sampling pays for decompression?

Data: real frames. ``ALE/<Game>-v5`` (sticky actions 0.25) through gymnasium's
``AtariPreprocessing`` (frame skip 4, 84x84 grayscale, up to 30 no-ops) and
``FrameStackObservation(4)``; the stream compressed is the newest frame of every observation, in
order, episodes back to back (as a buffer fed by one environment holds them). Games: Breakout,
Pong, Seaquest; policies: random, and epsilon-greedy (epsilon 0.1) around a fixed action (a
stand-in for a policy that repeats itself, as a trained one does).

Candidates (all single-threaded, blosc2 included: ``nthreads=1``):

* ``lz4``: ``lz4.block`` (default mode; high compression level 9), ``lz4.frame`` (level 0);
* ``zstandard``: zstd levels 1, 3, 9, and level 3 with a dictionary trained on frames of an
  independent rollout of the same game;
* ``blosc2``: a meta-compressor: it splits a chunk into internal blocks, runs filters (bit
  shuffle, delta against the chunk's first block) and then a codec it bundles (lz4, zstd, its
  own blosclz) on each block; typesize 1 (bytes). Its internal blocks can be read one by one
  (``SChunk.get_slice``), so a frame can be fetched without decompressing its whole chunk; with
  ``blocksize`` = one frame ("frame blocks") that is exactly one frame.

Measured per (candidate, block size B in 1, 16, 64, 256), every stream, ``--reps`` repetitions
interleaved (the candidates' order rotates every repetition, one process, one thread):

* compression ratio (raw bytes / compressed bytes, all frames) and the bytes a 1M-frame cold
  tier would take;
* compress and decompress throughput (MB/s of raw frames, per-call times summed); decompression
  both ways a codec offers: returning a new object ("alloc") and filling a caller's buffer
  ("into": ``blosc2.decompress2(dst=)``, ``zstandard``'s ``stream_reader(src).readinto(dst)``;
  ``lz4`` has no such call, so its "into" is decompress + copy);
* the cost of a sample's frames: fetch the 5 consecutive frames of one (obs, next_obs) stack
  from a random position into a preallocated array, the way the cold tier would: decompress the
  block or blocks holding them (zstandard streams, so in blocks of 64 frames or more it stops
  after the last frame needed when that is in the first half), or, for blosc2, ``get_slice`` of
  those frames;
* the Python memory one call allocates (``tracemalloc`` peak), which the library must avoid
  while sampling.

Every decompressed block and every fetched stack is compared with the original frames; a
candidate that returns a wrong byte is reported and excluded.

    python experiments/frame_codecs.py --quick   # seconds: Breakout, one policy, 1,500 frames
    python experiments/frame_codecs.py           # 3 games x 2 policies x 10,000 frames, 4 reps (~8 min)
    python experiments/frame_codecs.py --render reports/frame_codecs/results.json   # the report again

Needs the ``atari`` extra and the three codec packages (``pip install lz4 zstandard blosc2``).
Writes ``reports/frame_codecs/`` (README.md, results.json, frame_codecs.png). Uses no tfdata
code: the question is which package tfdata should depend on.
"""

from __future__ import annotations

import json
import os
import sys
import time
import tracemalloc
from functools import partial

import numpy as np

sys.dont_write_bytecode = True  # write nothing outside reports/ (no experiments/__pycache__)
from _envs import atari_transitions  # noqa: E402
from _plots import panels_figure, scatter  # noqa: E402
from _recording import RunRecord, package_footprint, report_dir, seeds_parser, write_json  # noqa: E402
from _render import fmt_sig, hand_written, md_table, write_report as write_methodology_report  # noqa: E402
from _timing import rotated  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------------------------
EXPERIMENT = "frame_codecs"
GAMES = {"full": ("Breakout", "Pong", "Seaquest"), "quick": ("Breakout",)}
POLICIES = {"random": 1.0, "eps-greedy": 0.1}          # name -> epsilon
QUICK_POLICIES = ("random",)
FRAMES = {"full": 10_000, "quick": 1_500}               # per (game, policy) stream
DICT_FRAMES = {"full": 2_000, "quick": 500}             # the zstd dictionary's own rollout
DICT_BYTES = 64 * 1024                                  # zstd dictionary size asked for
DICT_SEED = 1_000                                       # its rollout's seed (not a measured stream)
BLOCKS = (1, 16, 64, 256)                               # frames per compressed block
REPS = {"full": 4, "quick": 2}
FETCHES = {"full": 64, "quick": 32}                     # stack fetches per (stream, candidate, B, rep)
STACK = 5                                               # frames of one (obs, next_obs) pair of 4-stacks
# zstandard: decompressing a block's first frames only (stream_reader.readinto into a shorter buffer)
# streams through zstd's own window buffer, ~10 µs more than one-shot decompression of a whole
# frame into a buffer that holds it (Pong, 5 frames of a 16-frame block: 11.7 µs, all 16: 10.8 µs;
# 5 frames of a 256-frame block: 11.7 µs, all 256: 132 µs): used for blocks of 64 frames and more
PREFIX_MIN_BLOCK = 64
FRAME_SHAPE = (84, 84)
FRAME_BYTES = FRAME_SHAPE[0] * FRAME_SHAPE[1]
# the decision: a 512 MB board; compressed sizes within 5% of it of the best count as equal
BOARD_BYTES = 512 * 2**20
MEMORY_SLACK = 0.05
CAPACITY = 1_000_000                                    # frames in the cold tier, for the footprint
COMPRESS_FLOOR_MBPS = 100.0   # must keep up with actors: one ALE env makes ~15 MB/s of frames
# fetch times within 25% of the fastest are a tie, broken by fewer dependencies: a practical
# threshold (25% of a ~12 µs stack is 3 µs, 0.1 ms on a batch of 32), not a noise bound (within one
# run the repetitions' medians differ by a few percent; the report shows them)
TIE = 0.25
SENSITIVITY = {"memory_slack": (0.025, 0.05, 0.10), "tie": (0.10, 0.25)}  # the rule's choice under other thresholds
PACKAGES = ("lz4", "zstandard", "blosc2")
OUT_DIR = report_dir(EXPERIMENT)


# ---------------------------------------------------------------------------------------------
# Candidates
# ---------------------------------------------------------------------------------------------
class Codec:
    """One candidate: how it compresses a block, decompresses it (two ways) and fetches frames.

    ``compress(block) -> bytes``; ``alloc(comp) -> bytes``; ``into(comp, dst)`` fills ``dst``
    (uint8 ``(B, 84, 84)``); ``prefix(comp, dst)``, where the codec streams, decompresses only
    the block's first ``len(dst)`` frames (a fetch then stops after the frames it needs);
    ``store(comps, B)`` builds what ``fetch(store, start, out)`` reads
    from (the list of blocks, or a blosc2 SChunk). ``bind(game)`` gives the per-game instance
    (only the dictionary candidate differs per game).
    """

    def __init__(self, name, package, note, compress, alloc, into, partial=False, dictionary=False, prefix=None):
        self.name, self.package, self.note = name, package, note
        self.compress, self.alloc, self.into = compress, alloc, into
        self.partial, self.dictionary = partial, dictionary
        self.prefix = prefix  # prefix(comp, dst): the first len(dst) frames of a block only, or None

    def fetch(self, store, B, start, out, scratch):
        """Frames ``start .. start + len(out)`` of the stream into ``out``."""
        n = len(out)
        if self.partial:  # blosc2: only the internal blocks holding the frames
            store.get_slice(start * FRAME_BYTES, (start + n) * FRAME_BYTES, out=out)
            return
        k = 0
        for b in range(start // B, (start + n - 1) // B + 1):
            lo, hi = max(start, b * B), min(start + n, (b + 1) * B)
            if B == 1:
                self.into(store[b], out[k:k + 1])
            elif self.prefix is not None and B >= PREFIX_MIN_BLOCK and 2 * (hi - b * B) <= B:
                # a stream codec stops after the last frame needed, when that is at most half a block
                self.prefix(store[b], scratch[:hi - b * B])
                out[k:k + hi - lo] = scratch[lo - b * B:hi - b * B]
            else:
                self.into(store[b], scratch)
                out[k:k + hi - lo] = scratch[lo - b * B:hi - b * B]
            k += hi - lo


def _copy_into(decompress):
    def into(comp, dst):
        np.copyto(dst.reshape(-1), np.frombuffer(decompress(comp), np.uint8))
    return into


def installed(package: str) -> bool:
    """Whether a codec package can be imported (the experiment measures those that can)."""
    import importlib.util

    return importlib.util.find_spec(package) is not None


def lz4_candidates() -> list:
    import lz4.block
    import lz4.frame

    return [Codec("lz4.block", "lz4", "default mode (acceleration 1)",
                  lambda b: lz4.block.compress(b), lz4.block.decompress, _copy_into(lz4.block.decompress)),
            Codec("lz4.block hc9", "lz4", "high-compression mode, level 9",
                  lambda b: lz4.block.compress(b, mode="high_compression", compression=9),
                  lz4.block.decompress, _copy_into(lz4.block.decompress)),
            Codec("lz4.frame", "lz4", "frame format, level 0",
                  lambda b: lz4.frame.compress(b, compression_level=0), lz4.frame.decompress,
                  _copy_into(lz4.frame.decompress))]


def zstd_codec(name: str, level: int, note: str, d=None) -> Codec:
    """zstd through ``zstandard``; ``d``: a ``ZstdCompressionDict`` or None."""
    import zstandard as zstd

    c = zstd.ZstdCompressor(level=level, dict_data=d) if d is not None else zstd.ZstdCompressor(level=level)
    dec = zstd.ZstdDecompressor(dict_data=d) if d is not None else zstd.ZstdDecompressor()

    def into(comp, dst):  # also the prefix: the reader stops when dst is full
        mv = memoryview(dst).cast("B")
        n, reader = 0, dec.stream_reader(comp)
        while n < len(mv):
            k = reader.readinto(mv[n:])
            if k == 0:
                raise ValueError(f"{name}: {n} bytes decompressed, {len(mv)} expected")
            n += k
    return Codec(name, "zstandard", note, c.compress, dec.decompress, into, dictionary=d is not None, prefix=into)


def blosc2_codec(name: str, codec: str, clevel: int, filters: list, note: str, blocksize: int = 0) -> Codec:
    """blosc2 with typesize 1 and one thread; ``codec``/``filters``: names of ``blosc2.Codec`` /
    ``blosc2.Filter`` members; ``blocksize`` 0: blosc2 chooses its internal block size."""
    import blosc2

    blosc2.set_nthreads(1)
    flt = [getattr(blosc2.Filter, f) for f in filters]
    cp = blosc2.CParams(codec=getattr(blosc2.Codec, codec), clevel=clevel, typesize=1, nthreads=1,
                        blocksize=blocksize, filters=flt, filters_meta=[0] * len(flt))
    dp = blosc2.DParams(nthreads=1)

    def into(comp, dst):
        blosc2.decompress2(comp, dst=dst)
    c = Codec(name, "blosc2", note, lambda b: blosc2.compress2(b, cparams=cp), blosc2.decompress2, into,
              partial=True)

    def store(comps, B):  # the cold tier: one chunk per block, read with get_slice
        s = blosc2.SChunk(chunksize=B * FRAME_BYTES, cparams=cp, dparams=dp)
        for comp in comps:
            s.append_chunk(comp)
        return s
    c.store = store
    return c


def blosc2_candidates() -> list:
    frame = FRAME_BYTES
    return [blosc2_codec("blosc2 lz4", "LZ4", 5, ["NOFILTER"], "clevel 5, no filter, automatic internal block size"),
            blosc2_codec("blosc2 lz4 bitshuffle", "LZ4", 5, ["BITSHUFFLE"], "clevel 5, bit shuffle"),
            blosc2_codec("blosc2 lz4 delta", "LZ4", 5, ["DELTA"], "clevel 5, delta against the chunk's first block"),
            blosc2_codec("blosc2 blosclz", "BLOSCLZ", 5, ["NOFILTER"], "clevel 5, no filter"),
            blosc2_codec("blosc2 zstd 1", "ZSTD", 1, ["NOFILTER"], "clevel 1, no filter"),
            blosc2_codec("blosc2 zstd 5", "ZSTD", 5, ["NOFILTER"], "clevel 5, no filter"),
            blosc2_codec("blosc2 zstd 1 bitshuffle", "ZSTD", 1, ["BITSHUFFLE"], "clevel 1, bit shuffle"),
            blosc2_codec("blosc2 lz4 frame-blocks", "LZ4", 5, ["NOFILTER"], "clevel 5, internal block = one frame",
                         frame),
            blosc2_codec("blosc2 zstd 1 frame-blocks", "ZSTD", 1, ["NOFILTER"], "clevel 1, internal block = one frame",
                         frame),
            blosc2_codec("blosc2 lz4 frame-blocks delta", "LZ4", 5, ["DELTA"],
                         "clevel 5, internal block = one frame, delta", frame)]


def make_candidates(dictionaries: dict, packages=PACKAGES) -> list:
    """The candidates of the codec packages in ``packages`` (the caller keeps the installed ones);
    ``dictionaries``: game -> trained zstd dictionary (``ZstdCompressionDict``).

    Returns a list of ``(Codec, binder)`` where ``binder(game)`` returns the Codec for a game (only
    the dictionary candidate differs per game)."""
    out = []
    if "lz4" in packages:
        out += [(c, lambda game, c=c: c) for c in lz4_candidates()]
    if "zstandard" in packages:
        out += [(c, lambda game, c=c: c) for c in (zstd_codec(f"zstd {lv}", lv, f"level {lv}") for lv in (1, 3, 9))]
        if dictionaries:
            per_game = {g: zstd_codec("zstd 3 + dict", 3, "level 3, dictionary trained on another rollout of the game",
                                      d) for g, d in dictionaries.items()}
            out.append((next(iter(per_game.values())), per_game.__getitem__))
    if "blosc2" in packages:
        out += [(c, lambda game, c=c: c) for c in blosc2_candidates()]
    return out


class Uncompressed(Codec):
    """No compression (what the hot tier costs): blocks are copies; a fetch copies its frames
    straight out of the stream, as an uncompressed buffer would."""

    def __init__(self):
        def into(comp, dst):
            np.copyto(dst.reshape(-1), np.frombuffer(comp, np.uint8))
        super().__init__("none (copy)", "-", "uncompressed, numpy copy", lambda b: b.tobytes(),
                         lambda c: bytes(memoryview(c)), into, partial=True)  # bytes(bytes) would not copy

    def store(self, comps, B):
        return np.frombuffer(b"".join(comps), np.uint8).reshape(-1, *FRAME_SHAPE)

    def fetch(self, store, B, start, out, scratch):
        out[:] = store[start:start + len(out)]


def train_dictionary(game: str, frames: int):
    """A zstd dictionary trained on the frames of an independent random rollout of ``game``."""
    import zstandard as zstd

    d = atari_transitions(game, frames, seed=DICT_SEED, frames_only=True)["obs"]
    t0 = time.perf_counter()
    out = zstd.train_dictionary(DICT_BYTES, [f.tobytes() for f in d])
    return out, {"game": game, "frames": frames, "seed": DICT_SEED, "asked_bytes": DICT_BYTES,
                 "bytes": len(out.as_bytes()), "train_s": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------
def blocks_of(F, B: int) -> list:
    return [F[i * B:(i + 1) * B] for i in range(len(F) // B)]


def measure_once(codec: Codec, F, B: int, starts, verify: bool) -> dict:
    """One pass of ``codec`` over stream ``F`` (uint8 ``(N, 84, 84)``) in blocks of ``B``: timed
    compression, both decompressions and the stack fetches (each call timed alone)."""
    pc = time.perf_counter_ns
    blocks = blocks_of(F, B)
    comps, t_comp = [], 0
    for b in blocks:
        t0 = pc()
        c = codec.compress(b)
        t_comp += pc() - t0
        comps.append(c)
    t_alloc = np.empty(len(blocks), np.int64)
    for i, c in enumerate(comps):
        t0 = pc()
        x = codec.alloc(c)
        t_alloc[i] = pc() - t0
        if verify and bytes(x) != blocks[i].tobytes():
            return {"error": f"alloc decompression of block {i} differs from the frames"}
    dst = np.empty((B, *FRAME_SHAPE), np.uint8)
    t_into = np.empty(len(blocks), np.int64)
    for i, c in enumerate(comps):
        t0 = pc()
        codec.into(c, dst)
        t_into[i] = pc() - t0
        if verify and not np.array_equal(dst, blocks[i]):
            return {"error": f"decompression into a buffer of block {i} differs from the frames"}
    store = codec.store(comps, B) if codec.partial else comps
    out = np.empty((STACK, *FRAME_SHAPE), np.uint8)
    t_fetch = np.empty(len(starts), np.int64)
    bad = 0
    for j, s in enumerate(starts):
        s = int(s)
        t0 = pc()
        codec.fetch(store, B, s, out, dst)
        t_fetch[j] = pc() - t0
        bad += not np.array_equal(out, F[s:s + STACK])  # every fetch checked (untimed)
    raw = len(blocks) * B * FRAME_BYTES
    res = {"raw_bytes": raw, "compressed_bytes": int(sum(len(c) for c in comps)), "blocks": len(blocks),
           "compress_ns": int(t_comp), "alloc_ns": t_alloc, "into_ns": t_into, "fetch_ns": t_fetch}
    if bad:
        res["error"] = f"{bad} of {len(starts)} fetched stacks differ from the frames"
    return res


def allocations(codec: Codec, F, B: int) -> dict:
    """Peak bytes traced by tracemalloc during one call of each path (after a warm-up call)."""
    blocks = blocks_of(F, B)
    i = len(blocks) // 2
    comp = codec.compress(blocks[i])
    dst = np.empty((B, *FRAME_SHAPE), np.uint8)
    store = codec.store([codec.compress(b) for b in blocks], B) if codec.partial else None
    out = np.empty((STACK, *FRAME_SHAPE), np.uint8)
    start = i * B + (B // 2 if B > STACK else 0)
    paths = {"alloc": lambda: codec.alloc(comp), "into": lambda: codec.into(comp, dst)}
    if store is not None:
        paths["fetch"] = lambda: codec.fetch(store, B, start, out, dst)
    res = {}
    for name, fn in paths.items():
        fn()
        tracemalloc.start()
        fn()
        res[name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return res


def collect_streams(games, policies, frames: int, log) -> dict:
    streams = {}
    for g in games:
        for p in policies:
            t0 = time.perf_counter()
            d = atari_transitions(g, frames, seed=0, epsilon=POLICIES[p], frames_only=True)
            F = np.ascontiguousarray(d["obs"])
            done = d["terminated"] | d["truncated"]
            streams[(g, p)] = F
            log(f"{g:<9} {p:<10} {len(F):,} frames, {int(done.sum())} episode ends, "
                f"{len(np.unique(F))} grey levels ({time.perf_counter() - t0:.1f} s)")
    return streams


def run(streams: dict, candidates: list, reps: int, fetches: int, log) -> dict:
    """Every (candidate, B) over every stream, ``reps`` rounds, the candidates' order rotated."""
    raw = {}   # (name, B, game, policy) -> per-rep measurements
    errors = {}
    names = [c.name for c, _ in candidates]
    by_name = {c.name: bind for c, bind in candidates}
    for r in range(reps):
        t_rep = time.perf_counter()
        for (g, p), F in streams.items():
            rng = np.random.default_rng([r, len(F)])
            starts = rng.integers(0, len(F) // max(BLOCKS) * max(BLOCKS) - STACK + 1, fetches)
            for name in rotated(names, r):
                codec = by_name[name](g)
                for B in BLOCKS:
                    key = (name, B)
                    if key in errors:
                        continue
                    ok_starts = starts[starts + STACK <= len(F) // B * B]
                    m = measure_once(codec, F, B, ok_starts, verify=True)
                    if "error" in m:
                        errors[key] = f"{g}/{p}, repetition {r}: {m['error']}"
                        log(f"  WRONG OUTPUT {name} B={B}: {errors[key]}")
                        continue
                    raw.setdefault((name, B, g, p), []).append(m)
        log(f"repetition {r + 1}/{reps} done in {time.perf_counter() - t_rep:.0f} s")
    return {"raw": raw, "errors": errors}


# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------
def summarise(measured: dict, candidates: list, streams: dict, allocs: dict) -> list[dict]:
    """One row per (candidate, B): ratio, footprint, throughputs (median over repetitions of the
    per-repetition totals over all streams), per-call medians and p99 (pooled)."""
    raw, errors = measured["raw"], measured["errors"]
    rows = []
    for c, _ in candidates:
        for B in BLOCKS:
            row = {"candidate": c.name, "package": c.package, "note": c.note, "block": B,
                   "partial_fetch": c.partial, "error": errors.get((c.name, B)),
                   "allocated_bytes": allocs.get((c.name, B))}
            per = {k: v for k, v in raw.items() if k[0] == c.name and k[1] == B}
            if row["error"] is None and per:
                reps = min(len(v) for v in per.values())
                tot_raw = sum(v[0]["raw_bytes"] for v in per.values())
                tot_comp = sum(v[0]["compressed_bytes"] for v in per.values())
                row["ratio"] = tot_raw / tot_comp
                row["ratio_by_stream"] = {f"{k[2]}/{k[3]}": v[0]["raw_bytes"] / v[0]["compressed_bytes"]
                                          for k, v in per.items()}
                row["ratio_by_game"] = {}
                for g in dict.fromkeys(k[2] for k in per):
                    gs = [v for k, v in per.items() if k[2] == g]
                    row["ratio_by_game"][g] = (sum(v[0]["raw_bytes"] for v in gs)
                                               / sum(v[0]["compressed_bytes"] for v in gs))
                row["bytes_per_1m_frames"] = CAPACITY * FRAME_BYTES / row["ratio"]

                def mbps(field):
                    per_rep = [tot_raw / (sum(int(np.sum(v[r][field])) for v in per.values()) / 1e9) / 1e6
                               for r in range(reps)]
                    return float(np.median(per_rep)), per_rep

                for field, label in (("compress_ns", "compress"), ("alloc_ns", "decompress_alloc"),
                                     ("into_ns", "decompress_into")):
                    row[f"{label}_mbps"], row[f"{label}_mbps_per_rep"] = mbps(field)
                for field, label in (("into_ns", "block_into"), ("alloc_ns", "block_alloc"), ("fetch_ns", "fetch")):
                    pooled = np.concatenate([m[field] for v in per.values() for m in v[:reps]]) / 1e3
                    row[f"{label}_us_median"] = float(np.median(pooled))
                    row[f"{label}_us_p99"] = float(np.percentile(pooled, 99))
                    row[f"{label}_calls"] = int(pooled.size)
                row["fetch_us_median_per_rep"] = [
                    float(np.median(np.concatenate([v[r]["fetch_ns"] for v in per.values()]) / 1e3))
                    for r in range(reps)]
                row["repetitions"] = reps
            rows.append(row)
    return rows


def decide(rows: list, footprints: dict, slack: float = MEMORY_SLACK, tie: float = TIE) -> dict:
    """The rule: among correct candidates compressing at least COMPRESS_FLOOR_MBPS, those whose
    1M-frame footprint is within MEMORY_SLACK x the board of the smallest footprint of any of them;
    of these, the fastest median stack fetch; a candidate of a package with fewer new dependencies
    whose fetch is within TIE of that wins instead."""
    ok = [r for r in rows if r["package"] != "-" and r.get("error") is None and "ratio" in r
          and r["compress_mbps"] >= COMPRESS_FLOOR_MBPS]
    if not ok:
        return {"chosen": None, "why": "no candidate passed"}
    best_bytes = min(r["bytes_per_1m_frames"] for r in ok)
    limit = best_bytes + slack * BOARD_BYTES
    eligible = sorted((r for r in ok if r["bytes_per_1m_frames"] <= limit), key=lambda r: r["fetch_us_median"])
    fastest = eligible[0]
    ndeps = {p: len(f["new_dependencies"]) for p, f in footprints.items()}
    ties = [r for r in eligible if r["fetch_us_median"] <= fastest["fetch_us_median"] * (1 + tie)]
    chosen = min(ties, key=lambda r: (ndeps.get(r["package"], 99), r["fetch_us_median"]))
    best_per_package = {}
    for p in dict.fromkeys(r["package"] for r in ok):
        mine = [r for r in eligible if r["package"] == p]
        top = min(mine, key=lambda r: r["fetch_us_median"]) if mine else None
        best_per_package[p] = (f"{top['candidate']} B={top['block']} ({top['fetch_us_median']:.1f} µs, "
                               f"{top['bytes_per_1m_frames'] / 2**20:.0f} MiB)" if top else None)
    return {"chosen": {"candidate": chosen["candidate"], "package": chosen["package"], "block": chosen["block"]},
            "fastest": {"candidate": fastest["candidate"], "block": fastest["block"]},
            "best_bytes_per_1m_frames": best_bytes, "limit_bytes_per_1m_frames": limit,
            "eligible": [(r["candidate"], r["block"]) for r in eligible],
            "ties": [(r["candidate"], r["block"]) for r in ties],
            "best_per_package": best_per_package,
            "excluded_slow_compress": [(r["candidate"], r["block"]) for r in rows
                                       if r.get("compress_mbps") is not None
                                       and r["compress_mbps"] < COMPRESS_FLOOR_MBPS],
            "excluded_wrong": [(r["candidate"], r["block"], r["error"]) for r in rows if r.get("error")]}


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------
COLORS = {"lz4": "tab:blue", "zstandard": "tab:green", "blosc2": "tab:orange", "-": "k"}
MARKERS = {1: "o", 16: "s", 64: "^", 256: "D"}


def plot(rows, decision) -> str:
    good = [r for r in rows if "ratio" in r and r.get("error") is None]
    mark = lambda r, x, y: (x, y, COLORS[r["package"]], MARKERS[r["block"]])  # noqa: E731
    ch, rings, vlines = decision.get("chosen"), [], []
    if ch:
        r = next(x for x in good if x["candidate"] == ch["candidate"] and x["block"] == ch["block"])
        rings = [(r["bytes_per_1m_frames"] / 2**20, r["fetch_us_median"],
                  f"chosen: {ch['candidate']}, B={ch['block']}")]
        vlines = [(decision["limit_bytes_per_1m_frames"] / 2**20,
                   dict(color="r", ls=":", lw=1, label=f"best + {MEMORY_SLACK:.0%} of a {BOARD_BYTES >> 20} MB board"))]
    keys = {(p if p != "-" else "uncompressed"): (c, "o") for p, c in COLORS.items()}
    keys.update({f"B = {b}": ("grey", m) for b, m in MARKERS.items()})
    return panels_figure(OUT_DIR, "frame_codecs.png", (13, 5.2), [
        partial(scatter, points=[mark(r, r["bytes_per_1m_frames"] / 2**20, r["fetch_us_median"]) for r in good],
                rings=rings, vlines=vlines, xlabel="cold tier for 1M frames (MiB, log)",
                ylabel="fetch one 5-frame stack (µs, median, log)", title="memory vs sampling cost",
                legend=dict(fontsize=8, loc="upper right")),
        partial(scatter, points=[mark(r, r["compress_mbps"], r["decompress_into_mbps"]) for r in good], keys=keys,
                xlabel="compress MB/s (median over repetitions)", ylabel="decompress into a buffer MB/s",
                title="speed (one thread)", legend=dict(fontsize=8, loc="lower right"))])


def _row_cells(r):
    if r.get("error"):
        return [r["candidate"], r["block"], "**wrong output**: " + r["error"], "", "", "", "", "", ""]
    a = r.get("allocated_bytes") or {}
    return [r["candidate"], r["block"], f"{r['ratio']:.1f}", f"{r['bytes_per_1m_frames'] / 2**20:,.0f}",
            fmt_sig(r["compress_mbps"]), fmt_sig(r["decompress_into_mbps"]), fmt_sig(r["decompress_alloc_mbps"]),
            f"{r['block_into_us_median']:.1f}", f"{r['fetch_us_median']:.1f} ({r['fetch_us_p99']:.0f})",
            ]


def headline(rows, decision) -> str:
    ch = decision.get("chosen")
    if not ch:
        return "No codec passed the rule."
    r = next(x for x in rows if x["candidate"] == ch["candidate"] and x["block"] == ch["block"])
    return (f"{ch['package']} ({ch['candidate']}, blocks of {ch['block']} frames): ratio {r['ratio']:.0f}x on real "
            f"Atari frames ({r['bytes_per_1m_frames'] / 2**20:.0f} MiB per 1M frames), a 5-frame stack fetched in "
            f"{r['fetch_us_median']:.0f} µs, {r['decompress_into_mbps'] / 1e3:.1f} GB/s decompressing into a buffer.")


def write_report(rows, decision, footprints, dicts, streams_info, run, png, mode, versions, not_installed) -> None:
    ch = decision.get("chosen")
    L = ["# Frame codecs: a compressor for the cold tier of an Atari frame buffer\n",
         f"<!-- headline: {headline(rows, decision)} -->\n",
         f"Made by `experiments/frame_codecs.py` ({mode} run, command `{run['command']}`, "
         f"{run['wall_clock_s']:.0f} s). Raw numbers: `results.json`.\n",
         "## Answer\n"]
    if not_installed:
        L.append(f"**Not measured: {', '.join(not_installed)} (not installed).** The decision below is among the "
                 "packages measured only; `pip install lz4 zstandard blosc2` compares all three.\n")
    if ch:
        r = next(x for x in rows if x["candidate"] == ch["candidate"] and x["block"] == ch["block"])
        L.append(f"* **{ch['package']}**: `{ch['candidate']}` ({r['note']}) in blocks of **{ch['block']}** "
                 f"consecutive frames. Ratio {r['ratio']:.1f} over every frame measured ("
                 + ", ".join(f"{g} {v:.0f}" for g, v in r["ratio_by_game"].items())
                 + f"); a cold tier of 1M frames takes {r['bytes_per_1m_frames'] / 2**20:.0f} MiB "
                 f"(raw: {CAPACITY * FRAME_BYTES / 2**20:,.0f} MiB). Fetching the 5 frames of one sampled "
                 f"(obs, next_obs) pair: {r['fetch_us_median']:.1f} µs median, {r['fetch_us_p99']:.0f} µs p99, "
                 f"so about {32 * r['fetch_us_median'] / 1e3:.2f} ms for a batch of 32 drawn from the cold tier. "
                 f"Compression {fmt_sig(r['compress_mbps'])} MB/s, decompression into a buffer "
                 f"{fmt_sig(r['decompress_into_mbps'])} MB/s.")
        fastest = decision["fastest"]
        L.append(f"* The rule (fixed before the run): among correct candidates compressing at least "
                 f"{COMPRESS_FLOOR_MBPS:.0f} MB/s, those whose 1M-frame footprint is within {MEMORY_SLACK:.0%} "
                 f"of the {BOARD_BYTES >> 20} MB board ({MEMORY_SLACK * BOARD_BYTES / 2**20:.1f} MiB) of the "
                 f"smallest ({decision['best_bytes_per_1m_frames'] / 2**20:.1f} MiB), take the fastest stack "
                 f"fetch ({fastest['candidate']}, B={fastest['block']}); a candidate within {TIE:.0%} of it "
                 f"from a package with fewer new dependencies wins the tie. "
                 f"{len(decision['eligible'])} (candidate, B) pairs were eligible; within the tie: "
                 + ", ".join(f"{n} B={b}" for n, b in decision["ties"]) + ".")
        spread = lambda x: f"{min(x['fetch_us_median_per_rep']):.1f}-{max(x['fetch_us_median_per_rep']):.1f} µs"  # noqa: E731
        fr = next(x for x in rows if x["candidate"] == fastest["candidate"] and x["block"] == fastest["block"])
        L.append(f"* Stack-fetch medians of the {r['repetitions']} repetitions: chosen {spread(r)}, fastest {spread(fr)}.")
        sens = decision.get("sensitivity") or []
        if sens:
            L.append("* The rule under other thresholds (memory slack as a share of the board, tie): "
                     + "; ".join(f"{x['memory_slack']:.1%}, {x['tie']:.0%}: "
                                 + (f"{x['chosen']['package']} ({x['chosen']['candidate']}, B={x['chosen']['block']})"
                                    if x["chosen"] else "none") for x in sens) + ".")
        L.append("* Fastest eligible per package: "
                 + "; ".join(f"{p}: {v or 'none eligible'}" for p, v in decision["best_per_package"].items()) + ".")
    if decision.get("excluded_wrong"):
        L.append("* **Wrong output** (excluded): " + "; ".join(f"{n} B={b} ({e})" for n, b, e in decision["excluded_wrong"])
                 + ". Every other decompressed block and fetched stack matched the frames byte for byte.")
    slow = decision.get("excluded_slow_compress") or []
    if slow:
        L.append(f"* Compressing below {COMPRESS_FLOOR_MBPS:.0f} MB/s (excluded): "
                 + ", ".join(f"{n} B={b}" for n, b in slow) + ".")
    L.append("")
    L.append("## Dependencies (installed here, measured from package metadata)\n")
    L.append("Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".\n")
    L += md_table(["package", "version", "installed size", "dependencies it brings (transitive, runtime)"],
                  [[p, f["version"], f"{f['installed_bytes'] / 2**20:.1f} MiB",
                    ", ".join(f["new_dependencies"]) or "none"] for p, f in footprints.items()], "llrl")
    L.append("")
    L.append("## Decompressing into a preallocated buffer (the library must not allocate while sampling)\n")
    L.append("Peak Python memory traced by `tracemalloc` during one call (after a warm-up call), one block of "
             "the largest block size; a value near the block's size means the call allocates its result:\n")
    bmax = max(BLOCKS)
    arow = []
    for c in dict.fromkeys(r["candidate"] for r in rows):
        r = next((x for x in rows if x["candidate"] == c and x["block"] == bmax), None)
        a = (r or {}).get("allocated_bytes") or {}
        arow.append([c, f"{a.get('alloc', 0):,}", f"{a.get('into', 0):,}",
                     f"{a['fetch']:,}" if "fetch" in a else "(block decompress into a scratch block)"])
    L += md_table(["candidate", "decompress (returns a new object)", "decompress into a buffer", "partial fetch"],
                  arow, "lrrr")
    L += ["", f"(a block of {bmax} frames is {bmax * FRAME_BYTES:,} bytes.)", "", *hand_written(OUT_DIR, "libraries")]
    L.append("## All candidates\n")
    L.append("Ratio: raw / compressed over every frame measured. MiB: a 1M-frame cold tier. Speeds: MB/s of raw "
             "frames, median over repetitions of the total over all streams, one thread. Block µs: median "
             "decompression of one block into a buffer. Stack µs: median (p99) fetch of 5 consecutive frames "
             "from a random position into a preallocated array, the decompression of every block it touches "
             "included (zstandard, blocks of 64 frames or more: up to the last frame needed when that is in the "
             "first half of the block, `stream_reader` stopping there; blosc2: "
             "`get_slice`, only its internal blocks holding the frames; lz4: the whole block).\n")
    hdr = ["candidate", "B", "ratio", "MiB / 1M frames", "compress MB/s", "decompress into MB/s",
           "decompress alloc MB/s", "block µs", "stack µs (p99)"]
    for B in BLOCKS:
        L.append(f"### Blocks of {B} frame{'s' * (B > 1)}\n")
        L += md_table(hdr, [_row_cells(r) for r in rows if r["block"] == B], "lr" + "r" * (len(hdr) - 2))
        L.append("")
    L.append(f"![memory against sampling cost; speeds]({png})\n")
    L += ["## Method\n",
          "* Frames: " + "; ".join(streams_info) + ".",
          f"* Blocks: consecutive frames of one stream, {', '.join(map(str, BLOCKS))} per block (the last, partial "
          "block of a stream dropped). Every candidate compresses every stream at every block size in every "
          "repetition; the order of the candidates rotates from one repetition to the next (one process, "
          "one thread, garbage collector on); each call is timed alone with `time.perf_counter_ns` (its "
          f"~{run['timer_overhead_ns']:.0f} ns included).",
          "* zstd dictionary: " + "; ".join(f"{d['game']}: {d['bytes']:,} bytes (asked {d['asked_bytes']:,}) "
                                            f"from {d['frames']:,} frames of seed {d['seed']}, trained in {d['train_s']:.2f} s"
                                            for d in dicts) + ". It must be stored with the buffer (checkpoints).",
          f"* Stack fetches: {FETCHES[mode]} random positions per (stream, candidate, B, repetition), the same "
          "positions for every candidate; frames may cross an episode boundary (the cost is the same).", ""]
    L += hand_written(OUT_DIR, "method")
    write_methodology_report(OUT_DIR, L, run)


def render(path: str) -> None:
    """The plot and the report from a results.json alone."""
    with open(path, encoding="utf-8") as f:
        res = json.load(f)
    run = res["methodology"]
    png = plot(res["rows"], res["decision"])
    write_report(res["rows"], res["decision"], res["footprints"], res["dictionaries"], res["streams"], run, png,
                 run["mode"], res["versions"], run["parameters"]["packages_not_installed"])


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------
def main(argv=None) -> None:
    ap = seeds_parser(__doc__, "Breakout, one policy, 1,500 frames, 2 repetitions (seconds)",
                      "unused (the rollouts use seed 0; the dictionary's seed 1000)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions (default 4, quick 2)")
    ap.add_argument("--frames", type=int, default=None, help="frames per (game, policy) stream")
    args = ap.parse_args(argv)
    if args.render:
        return render(args.render)
    mode = "quick" if args.quick else "full"
    missing = [m for m in ("ale_py", "gymnasium", "cv2") if not installed(m)]
    if missing:
        raise SystemExit(f"frame_codecs: real Atari frames need the atari extra ({', '.join(missing)} missing): "
                         "pip install -e '.[atari]'")
    packages = tuple(p for p in PACKAGES if installed(p))
    if not packages:
        raise SystemExit(f"frame_codecs: none of the codec packages {', '.join(PACKAGES)} is installed: "
                         "pip install lz4 zstandard blosc2")
    games, policies = GAMES[mode], (QUICK_POLICIES if args.quick else tuple(POLICIES))
    frames = args.frames or FRAMES[mode]
    reps = args.reps or REPS[mode]
    os.makedirs(OUT_DIR, exist_ok=True)
    command = "python experiments/frame_codecs.py" + "".join(" " + a for a in (argv if argv is not None else sys.argv[1:]))
    params = {"games": games, "policies": {p: POLICIES[p] for p in policies}, "frames_per_stream": frames,
              "blocks": BLOCKS, "repetitions": reps, "fetches": FETCHES[mode], "stack_frames": STACK,
              "board_bytes": BOARD_BYTES, "memory_slack": MEMORY_SLACK, "compress_floor_mbps": COMPRESS_FLOOR_MBPS,
              "tie": TIE, "dict_bytes": DICT_BYTES, "dict_frames": DICT_FRAMES[mode], "packages_measured": packages,
              "packages_not_installed": [p for p in PACKAGES if p not in packages]}
    rec = RunRecord(EXPERIMENT, mode=mode, seeds=[0], command=command, parameters=params)
    log = lambda s: print(s, flush=True)  # noqa: E731
    streams = collect_streams(games, policies, frames, log)
    dicts = {g: train_dictionary(g, DICT_FRAMES[mode]) for g in games} if "zstandard" in packages else {}
    candidates = make_candidates({g: d for g, (d, _) in dicts.items()}, packages)
    ref = Uncompressed()
    candidates.append((ref, lambda game: ref))
    first = next(iter(streams))
    allocs = {}
    for c, bind in candidates:
        for B in BLOCKS:
            allocs[(c.name, B)] = allocations(bind(first[0]), streams[first], B)
    measured = run(streams, candidates, reps, FETCHES[mode], log)
    rows = summarise(measured, candidates, streams, allocs)
    footprints = {p: package_footprint(p) for p in packages}
    decision = decide(rows, footprints)
    decision["sensitivity"] = [{"memory_slack": sl, "tie": t, "chosen": decide(rows, footprints, sl, t)["chosen"]}
                               for sl in SENSITIVITY["memory_slack"] for t in SENSITIVITY["tie"]]
    versions = {p: footprints[p]["version"] for p in packages}
    if "zstandard" in packages:
        import zstandard

        versions["zstd_library"] = ".".join(map(str, zstandard.ZSTD_VERSION))
    if "blosc2" in packages:
        import blosc2

        versions["c_blosc2"] = blosc2.blosclib_version
    streams_info = [f"{g} {p} ({len(F):,} frames)" for (g, p), F in streams.items()]
    run_rec = rec.finish()
    path = os.path.join(OUT_DIR, "results.json")
    write_json(path, {"methodology": run_rec, "versions": versions, "streams": streams_info,
                      "dictionaries": [m for _, m in dicts.values()], "footprints": footprints,
                      "decision": decision, "rows": rows})
    render(path)
    for r in rows:
        if "ratio" in r:
            log(f"{r['candidate']:<30} B={r['block']:<4} ratio {r['ratio']:7.1f}  compress {r['compress_mbps']:8.0f} MB/s  "
                f"into {r['decompress_into_mbps']:8.0f} MB/s  stack {r['fetch_us_median']:8.1f} µs")
        else:
            log(f"{r['candidate']:<30} B={r['block']:<4} {r['error']}")
    log(f"{mode} run done in {run_rec['wall_clock_s']:.0f} s; chosen: {decision.get('chosen')}; report: "
        f"{os.path.relpath(OUT_DIR)}/README.md")


if __name__ == "__main__":
    main()
