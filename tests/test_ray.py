"""tfdata.ray against a local Ray instance: real rollout tasks push, the learner samples.

Every row carries its id in every field, so a sampled row can be checked against what was
pushed without trusting the module under test. Skips when Ray is not installed.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

if os.environ.get("TFDATA_REQUIRE_RAY") == "1":  # CI: a missing ray is a failure, not a skip
    import ray
else:
    ray = pytest.importorskip("ray")

import tfdata  # noqa: E402
from tfdata.ray import RayReplayBuffer  # noqa: E402

LAYOUTS = ["aos", "soa"]
# the id in every field: obs (exact in float32 below 2**24), action, reward (negated)
SPEC = {"obs": ("f4", (4,)), "action": "i8", "reward": "f8"}
# 28,224-byte image rows: a batch of 32 is 0.9 MB, far above Ray's 100 KiB inline limit
IMAGE = {"img": ("u1", (84, 84, 4)), "id": "i8"}


@pytest.fixture(scope="module")
def cluster():
    started = not ray.is_initialized()
    saved = os.environ.get("RAY_AUTH_MODE")
    if started:
        os.environ["RAY_AUTH_MODE"] = "disabled"  # a throwaway local instance: no token
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, object_store_memory=200 * 1024**2)
    yield
    if started:
        ray.shutdown()
        if saved is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved


def rows(ids) -> dict:
    ids = np.asarray(ids, np.int64)
    return {"obs": np.repeat(ids[:, None], 4, axis=1).astype(np.float32), "action": ids,
            "reward": -ids.astype(np.float64)}


def image_rows(ids) -> dict:
    ids = np.asarray(ids, np.int64)
    img = np.empty((len(ids), 84, 84, 4), np.uint8)
    img[:] = (ids % 251).astype(np.uint8)[:, None, None, None]
    return {"img": img, "id": ids}


def row_ids(batch) -> np.ndarray:
    """The ids of a batch of SPEC rows, after checking every field carries the same id."""
    ids = np.asarray(batch["action"])
    assert (np.asarray(batch["obs"]) == ids[:, None].astype(np.float32)).all(), "torn obs"
    assert (np.asarray(batch["reward"]) == -ids.astype(np.float64)).all(), "torn reward"
    return ids


def stored_ids(buf: RayReplayBuffer) -> np.ndarray:
    """Every id held, shard by shard in slot order (global slot order)."""
    out = np.full(buf.capacity, -1, np.int64)
    for s, st in enumerate(buf.state_dict()["shards"]):
        a = st["data"]["action"]
        out[s * buf.shard_capacity:s * buf.shard_capacity + len(a)] = a
    return out


@ray.remote(num_cpus=1)
def rollout(buf: RayReplayBuffer, worker: int, n: int, chunk: int) -> int:
    """A rollout worker: pushes ids worker * 100_000 + 0..n-1 in chunks, then flushes."""
    ids = worker * 100_000 + np.arange(n)
    with buf:  # a copy's close only flushes: errors of the pushes surface here
        for i in range(0, n, chunk):
            buf.extend(rows(ids[i:i + chunk]))
    return n


@ray.remote(num_cpus=1)
def bad_rollout(buf: RayReplayBuffer) -> None:
    batch = rows([1, 2])
    batch["action"] = np.array([1.5, 2.5])  # float into an int field: refused
    buf.extend(batch)


def test_import_tfdata_does_not_import_ray_and_missing_ray_says_how_to_install():
    code = ("import sys, tfdata\n"
            "assert 'ray' not in sys.modules and 'tfdata.ray' not in sys.modules, 'imported'\n"
            "sys.modules['ray'] = None  # as if Ray were not installed\n"
            "try:\n"
            "    import tfdata.ray\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'tfdata[ray]'" in out.stdout


def test_capacity_not_multiple_of_shards():
    with pytest.raises(ValueError, match=r"capacity 1000 is not a multiple of num_shards 3"):
        RayReplayBuffer(SPEC, 1000, num_shards=3)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_rollout_tasks_push_and_the_learner_samples_every_row(cluster, layout):
    with RayReplayBuffer(SPEC, 2048, num_shards=2, layout=layout, seed=0, max_in_flight=2) as buf:
        assert ray.get([rollout.remote(buf, w, 600, 40) for w in (1, 2)]) == [600, 600]
        pushed = np.concatenate([w * 100_000 + np.arange(600) for w in (1, 2)])
        assert len(buf) == 1200
        held = stored_ids(buf)
        # nothing lost, nothing duplicated, and each worker's rows spread over both shards
        np.testing.assert_array_equal(np.sort(held[held >= 0]), np.sort(pushed))
        for s in range(2):
            part = held[s * 1024:(s + 1) * 1024]
            assert {1, 2} == set(part[part >= 0] // 100_000)
        seen = set()
        for _ in range(10):
            b = buf.sample(128)
            ids = row_ids(b)
            assert b.indices.dtype == np.int64 and b.indices.shape == (128,)
            np.testing.assert_array_equal(held[b.indices], ids)  # indices name the rows
            seen.update(ids.tolist())
        assert seen <= set(pushed.tolist()) and len(seen) > 600


def test_bad_input_raises_spec_error_in_the_worker_and_sends_nothing(cluster):
    with RayReplayBuffer(SPEC, 64, num_shards=2, seed=0) as buf:
        buf.extend(rows(range(10)))
        buf.flush()
        with pytest.raises(tfdata.SpecError, match="'action'"):
            ray.get(bad_rollout.remote(buf))
        missing = rows([3])
        del missing["reward"]
        with pytest.raises(tfdata.SpecError, match="reward"):
            buf.extend(missing)
        with pytest.raises(tfdata.SpecError, match="'obs'"):
            buf.push({"obs": [1.0, 2.0], "action": 1, "reward": 0.0})  # wrong shape
        stats = buf.stats()
        assert len(buf) == 10 and stats["size"] == 10
        assert [s["extend_calls"] for s in stats["shards"]] == [1, 0]
        assert [s["rows_received"] for s in stats["shards"]] == [10, 0]
        buf.push({"obs": [11.0] * 4, "action": 11, "reward": -11.0})  # round-robin: shard 1
        assert [s["rows_received"] for s in buf.stats()["shards"]] == [10, 1]
        assert buf.state_dict()["shards"][1]["data"]["action"].tolist() == [11]


def test_sharded_sampling_draws_in_proportion_to_shard_sizes(cluster):
    with RayReplayBuffer(SPEC, 1536, num_shards=3, seed=3) as buf:
        buf.extend(rows(np.arange(300)), shard=0)
        buf.extend(rows(10_000 + np.arange(100)), shard=1)  # shard 2 stays empty
        from_shard = np.zeros(3, np.int64)
        for _ in range(40):
            b = buf.sample(64)
            ids = row_ids(b)
            shard = b.indices // buf.shard_capacity
            assert ((shard == 0) == (ids < 10_000)).all()  # rows come from where they were put
            from_shard += np.bincount(shard, minlength=3)
            # several shards: the learner concatenates, so the arrays are its own
            assert b["obs"].flags.writeable and b["obs"].flags.owndata
        n = from_shard.sum()
        # binomial(2560, 0.75): sd 21.9; 4 sd
        assert abs(from_shard[0] - 0.75 * n) < 4 * np.sqrt(n * 0.75 * 0.25), from_shard
        assert from_shard[2] == 0
        # a shard draws its varying share in power-of-two pieces, so it holds output rings for
        # sizes 1, 2, 4, ... 64 at most, not one per share size it was ever asked for
        plan = tfdata.ReplayBuffer.plan_memory(SPEC, 512, batch_sizes=[2**i for i in range(7)])
        for st in buf.stats()["shards"][:2]:
            assert st["nbytes"] <= sum(plan.values())


def test_same_seed_same_batches_and_state_dict_continues(cluster):
    def build(seed):
        buf = RayReplayBuffer(SPEC, 512, num_shards=2, seed=seed)
        for i in range(0, 300, 50):
            buf.extend(rows(np.arange(i, i + 50)))  # round-robin: the same shards for both
        return buf

    a, b, c = build(7), build(7), build(8)
    try:
        for _ in range(3):
            x, y, z = a.sample(32), b.sample(32), c.sample(32)
            np.testing.assert_array_equal(x.indices, y.indices)
            np.testing.assert_array_equal(row_ids(x), row_ids(y))
        assert not np.array_equal(x.indices, z.indices)  # another seed, other batches
        c.load_state_dict(a.state_dict())
        for _ in range(3):
            np.testing.assert_array_equal(a.sample(32).indices, c.sample(32).indices)
    finally:
        for buf in (a, b, c):
            buf.close()


@pytest.mark.parametrize("shards", [1, 2])
def test_batch_larger_than_the_rows_held_is_refused(cluster, shards):
    with RayReplayBuffer(SPEC, 64, num_shards=shards, seed=0) as buf:
        with pytest.raises(ValueError, match="empty"):
            buf.sample(1)
        buf.extend(rows(range(10)))
        with pytest.raises(ValueError, match="batch_size 11 is larger than the 10 rows") as err:
            buf.sample(11)
        assert err.type is ValueError  # not Ray's wrapper of the shard's error
        assert len(row_ids(buf.sample(10))) == 10  # as many as held is fine


def _mapped_file(arr: np.ndarray) -> str:
    """The file (or [heap], [anon]) of the memory mapping that holds ``arr``'s first byte."""
    addr = arr.__array_interface__["data"][0]
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                return parts[5] if len(parts) > 5 else "[anon]"
    return "?"


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_shard_batch_is_a_read_only_view_of_the_object_store(cluster, layout):
    with RayReplayBuffer(IMAGE, 256, layout=layout, seed=0) as buf:
        buf.extend(image_rows(np.arange(200)))
        b = buf.sample(32)  # 32 * 28,232 bytes: stored in the object store, not inlined
        img, ids = b["img"], b["id"]
        assert (img == (ids % 251).astype(np.uint8)[:, None, None, None]).all()
        for arr in (img, ids, b.indices):
            assert not arr.flags.writeable and not arr.flags.owndata
            assert "plasma" in _mapped_file(arr), _mapped_file(arr)  # Ray's shared memory
        assert img.flags.c_contiguous  # AoS too: the actor sends contiguous fields
        with pytest.raises(ValueError, match="read-only"):
            img[0, 0, 0, 0] = 1
        kept = b.copy()
        assert kept["img"].flags.writeable and not np.shares_memory(kept["img"], img)
        # a small result (2 rows, < 100 KiB) is inlined in the reply: read-only all the same,
        # but in this process's own memory, not the object store
        small = buf.sample(2)
        assert not small["img"].flags.writeable
        assert "plasma" not in _mapped_file(small["img"])


def _same(a, b) -> bool:
    return np.array_equal(a[1], b.indices) and all(np.array_equal(a[0][k], b[k]) for k in SPEC)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_samples_in_flight_are_not_overwritten_by_later_ones(cluster, layout):
    # a shard returns views of its buffer's output ring (ring_size 2): six samples requested
    # before any is read must be the six batches a local buffer in the same state draws
    with RayReplayBuffer(SPEC, 256, layout=layout, seed=0) as buf:
        buf.extend(rows(np.arange(200)))
        state = buf.state_dict()["shards"][0]
        refs = [buf._actors[0].sample.remote(16, None, True) for _ in range(6)]
        got = ray.get(refs)
    local = tfdata.ReplayBuffer(SPEC, 256, layout=layout)
    local.load_state_dict(state)
    expected = [local.sample(16, copy=True) for _ in range(6)]
    assert all(_same(g, e) for g, e in zip(got, expected))
    # control: views held past the ring are stale (StaleBatchError), as a shard's would be if
    # Ray serialised a result after the shard's next sample; the last ring_size are still valid
    local.load_state_dict(state)
    views = [local.sample(16) for _ in range(6)]
    for v in views[:4]:
        with pytest.raises(tfdata.StaleBatchError):
            dict(v)
    held = [(dict(v), v.indices) for v in views[4:]]
    assert _same(held[0], expected[4]) and _same(held[1], expected[5])


def test_prioritized_update_priorities_round_trip(cluster):
    cap = 256
    with RayReplayBuffer(SPEC, 2 * cap, num_shards=2, prioritized=True, alpha=1.0, beta=1.0,
                         seed=0) as buf:
        buf.extend(rows(np.arange(100)), shard=0)
        buf.extend(rows(1000 + np.arange(100)), shard=1)
        slots = np.concatenate([np.arange(100), cap + np.arange(100)])
        ids = np.concatenate([np.arange(100), 1000 + np.arange(100)])
        # shard 0: 100 for ids divisible by 10, else 0.01; shard 1: 100 or 1.0. The global
        # minimum (0.01) is on shard 0 only, so shard 1's weights need the global rescaling
        pri = np.where(ids % 10 == 0, 100.0, np.where(ids < 1000, 0.01, 1.0))
        buf.update_priorities(slots, pri)
        buf.flush()
        eps = 1e-6
        leaf = dict(zip(ids.tolist(), (pri + eps).tolist()))
        n_high = 0
        for _ in range(10):
            b = buf.sample(100)
            got = row_ids(b)
            n_high += int((got % 10 == 0).sum())
            expected = np.array([(0.01 + eps) / leaf[i] for i in got.tolist()])  # beta = 1
            np.testing.assert_allclose(b.weights, expected, rtol=1e-5)
            assert b.weights.dtype == np.float32 and b.versions.dtype == np.uint64
        # mass of the high rows: 20 * 100 against 90 * 0.01 + 90 * 1.0
        assert n_high / 1000 > 0.93
        # stale rows: overwrite shard 0 completely, then update an old batch
        old = buf.sample(50)
        on_zero = int((old.indices < cap).sum())
        buf.extend(rows(5000 + np.arange(cap)), shard=0)
        buf.update_priorities(old, np.ones(50))  # default: skip the overwritten rows
        buf.flush()
        assert buf.stats()["stale_skipped"] == on_zero > 0
        buf.update_priorities(old, np.ones(50), stale="raise")
        with pytest.raises(ValueError, match="stale") as err:  # the shard's error, at flush
            buf.flush()
        assert err.type is ValueError  # tfdata's own exception, not Ray's wrapper
        # an error that arrives while nothing waits for it is raised by the next call, which
        # then sends nothing
        buf.update_priorities(old, np.ones(50), stale="raise")
        ray.wait(list(buf._pending), num_returns=len(buf._pending), timeout=30)
        with pytest.raises(ValueError, match="stale"):
            buf.extend(rows([7]), shard=1)
        assert buf.stats()["shards"][1]["rows_received"] == 100
        with pytest.raises(ValueError, match="finite"):  # checked before sending
            buf.update_priorities(old, np.full(50, np.nan))


def test_errors_of_a_shard_surface_at_the_next_call_or_flush(cluster):
    buf = RayReplayBuffer(SPEC, 64, seed=0)
    try:
        buf.extend(rows(range(5)))
        buf.flush()
        ray.kill(buf._actors[0])
        with pytest.raises(ray.exceptions.RayActorError):
            for i in range(5):  # the error comes from a reap, the backpressure wait or flush
                buf.extend(rows([i]))
            buf.flush()
    finally:
        buf._kill()


def test_column_groups_reach_every_shard(cluster):
    """A grouping is resolved in the creating process and every shard stores it; the rollout
    and in-flight tests hold on it as on AoS and SoA."""
    g = [["obs", "reward"]]  # action alone
    test_rollout_tasks_push_and_the_learner_samples_every_row(cluster, g)
    test_samples_in_flight_are_not_overwritten_by_later_ones(cluster, g)
    with RayReplayBuffer(SPEC, 64, num_shards=2, layout=g, seed=0) as buf:
        assert buf.layout == (("obs", "reward"), ("action",))
        assert [s["layout"] for s in buf.stats()["shards"]] == [buf.layout] * 2
    with pytest.raises(tfdata.SpecError, match="unknown field 'img'"):
        RayReplayBuffer(SPEC, 64, layout=[["img"]])


def _stats_array(st) -> np.ndarray:
    return np.stack([np.asarray(getattr(st, k), np.float64).reshape(-1)
                     for k in ("mean", "var", "std", "min", "max")])


@pytest.mark.parametrize("layout", ["aos", [["obs", "reward"]]], ids=["aos", "groups"])
def test_columns_relabelling_and_projection_across_shards(cluster, layout):
    """column_stats and the running statistics merged over shards equal the statistics of the
    rows held; update_field rewrites rows on their shards, and refuses bad input with nothing
    changed; a projected sample is the full one restricted."""
    from .naive import column_stats_naive
    from .test_columns import close

    kw = dict(num_shards=2, layout=layout, seed=3, stats=["obs", "reward"])
    with RayReplayBuffer(SPEC, 64, **kw) as buf, RayReplayBuffer(SPEC, 64, **kw) as twin:
        for b in (buf, twin):
            b.extend(rows(np.arange(50)), shard=0)  # wraps: ids 18..49 held
            b.extend(rows(np.arange(1000, 1010)), shard=1)
        held = np.r_[np.arange(18, 50), np.arange(1000, 1010)]

        def check(want_rows):
            for name in ("obs", "reward", "action"):
                n, want = column_stats_naive(want_rows[name])
                got = buf.column_stats(name)
                assert got.count == n == 42
                close(_stats_array(got), want, name)
                if name != "action":
                    close(_stats_array(buf.field_stats(name)), want, f"running {name}")

        check(rows(held))
        # projection: same rows and random numbers as the full batch
        full, part = twin.sample(16), buf.sample(16, fields=["action"])
        assert set(part) == {"action"}
        np.testing.assert_array_equal(part.indices, full.indices)
        np.testing.assert_array_equal(part["action"], full["action"])
        with pytest.raises(tfdata.SpecError, match="unknown field 'nope'"):
            buf.sample(4, fields=["nope"])
        # relabel some rows of both shards through their global slots
        b = buf.sample(8)
        slots = np.unique(b.indices)
        new = -1000.0 - np.arange(len(slots))
        buf.update_field("reward", slots, new)
        want = rows(held)
        order = {int(v): i for i, v in enumerate(held)}
        for sl, v in zip(slots, new):
            s, k = divmod(int(sl), 32)
            rid = (np.arange(18, 50)[(np.arange(18, 50) % 32) == k][0]) if s == 0 else 1000 + k
            want["reward"][order[int(rid)]] = v
        check(want)
        before = _stats_array(buf.column_stats("reward"))
        with pytest.raises(IndexError, match="not a slot held"):
            buf.update_field("reward", [0, 32 + 10], [1.0, 2.0])  # shard 1 holds 10 rows
        with pytest.raises(ValueError, match="given twice"):
            buf.update_field("reward", [3, 40, 3], [1.0, 2.0, 3.0])
        with pytest.raises(tfdata.SpecError, match="nope"):
            buf.update_field("nope", [0], [1.0])
        with pytest.raises(ValueError):
            buf.update_field("reward", [0, 1], [1.0])  # one value for two rows
        with pytest.raises(tfdata.SpecError):
            buf.field_stats("action")  # no running statistics kept for it
        np.testing.assert_array_equal(_stats_array(buf.column_stats("reward")), before)
