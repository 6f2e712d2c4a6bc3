"""tfdata.memory and memory budgets: what the process holds, what a buffer holds, part by part,
and budgets that refuse before allocating.

The independent reference for ``nbytes`` is the allocator itself: a buffer built on a private
allocator handle must account for exactly the bytes that handle gave out.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import tfdata
from tfdata import alloc, memory

from .conftest import CARTPOLE, LAYOUTS, ODD, random_rows

IMAGE = {"obs": ("u1", (84, 84)), "action": "i8", "reward": "f4", "next_obs": ("u1", (84, 84)),
         "terminated": "?", "truncated": "?"}

CONFIGS = {
    "uniform": (tfdata.ReplayBuffer, {}),
    "prioritized": (tfdata.PrioritizedReplayBuffer, {}),
    "nstep": (tfdata.ReplayBuffer, {"n_step": 3}),
    "elided_envs": (tfdata.ReplayBuffer, {"elide_next": True, "num_envs": 1}),
    "per_nstep_elided": (tfdata.PrioritizedReplayBuffer, {"n_step": 2, "elide_next": True}),
}


def stream(n: int, rng, spec=CARTPOLE, end_every: int = 5) -> dict:
    rows = random_rows(tfdata.Spec(spec), n, rng)
    rows["terminated"][:] = False
    rows["truncated"][:] = False
    rows["terminated"][end_every - 1::end_every] = True
    rows["next_obs"][:-1] = rows["obs"][1:]
    return rows


# -- parse and format ---------------------------------------------------------------------------
@pytest.mark.parametrize("text,value", [("400MB", 400 << 20), ("1.5 GiB", 3 << 29), ("512k", 512 << 10),
                                        ("64", 64), (" 2 TB ", 2 << 40), ("8MiB", 8 << 20), (4096, 4096),
                                        (np.int64(7), 7)])
def test_parse_bytes(text, value):
    assert memory.parse_bytes("memory_budget", text) == value


@pytest.mark.parametrize("bad", ["lots", "", "-5MB", "5 XB", 0, -1, True, None, 1.5, "0MB"])
def test_parse_bytes_refuses_with_the_name(bad):
    with pytest.raises(ValueError, match="memory_budget"):
        memory.parse_bytes("memory_budget", bad)


def test_format_bytes():
    assert memory.format_bytes(512) == "512 B"
    assert memory.format_bytes(3 << 29) == "1.50 GiB"
    assert memory.format_bytes(12 << 20) == "12.0 MiB"


# -- process figures ------------------------------------------------------------------------------
def test_snapshot_sees_memory_come_and_go():
    a = alloc.get("numpy")
    gc.collect()
    s0 = memory.snapshot()
    assert s0["rss"] > 0 and s0["uss"] > 0 and s0["peak_rss"] >= s0["rss"] - (1 << 20)
    assert s0["minor_faults"] > 0 and s0["major_faults"] >= 0
    x = a.empty(96 << 20, np.uint8)
    x[::4096] = 1
    s1 = memory.snapshot(uss=False)
    assert s1["uss"] == -1
    assert s1["rss"] - s0["rss"] > 90 << 20
    assert s1["minor_faults"] - s0["minor_faults"] >= (96 << 20) // (2 << 20)  # huge pages fault 2 MiB at once
    assert s1["allocators"]["numpy"]["live_bytes"] >= 96 << 20
    del x
    gc.collect()
    s2 = memory.snapshot(uss=False)
    assert s2["rss"] - s0["rss"] < 16 << 20
    assert s2["peak_rss"] >= s1["rss"] - (1 << 20)  # the peak remembers
    if memory.reset_peak():
        assert memory.snapshot(uss=False)["peak_rss"] < s1["rss"] - (64 << 20)


# -- nbytes, part by part, against the allocator ----------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("capacity", [1, 7, 33, 1000])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_nbytes_is_what_the_allocator_gave_and_the_plan_predicts(layout, capacity, config):
    cls, kw = CONFIGS[config]
    with alloc.open("numpy") as a:
        buf = cls(CARTPOLE, capacity, layout=layout, seed=0, allocator=a, **kw)
        plan = cls.plan_memory(CARTPOLE, capacity, layout=layout, **kw)
        assert buf.nbytes_parts == plan
        assert a.live_bytes == buf.nbytes == sum(plan.values())
        buf.extend(stream(max(capacity, 3), np.random.default_rng(1)))
        sizes = sorted({1, min(capacity, 5)})
        for b in sizes:
            buf.sample(b)
        if cls is tfdata.ReplayBuffer and capacity >= 3:
            buf.sample_sequences(2, 3, policy="mask")
            sizes.append((2, 3))
        got = buf.nbytes_parts
        want = cls.plan_memory(CARTPOLE, capacity, layout=layout, batch_sizes=sizes, **kw)
        if kw.get("elide_next"):  # the final-value table grows with the episode ends held
            assert got.pop("bookkeeping") >= want.pop("bookkeeping")
        assert got == want
        assert a.live_bytes == buf.nbytes
        del buf
        gc.collect()
        assert a.live_bytes == 0


def test_rings_of_other_threads_count_and_go_when_they_end():
    import threading

    with alloc.open("numpy") as a:
        buf = tfdata.ReplayBuffer(CARTPOLE, 64, seed=0, allocator=a)
        buf.extend(stream(64, np.random.default_rng(0)))
        buf.sample(8)
        one = buf.nbytes_parts["output_rings"]
        seen = {}

        def other():
            buf.sample(8)
            seen["rings"] = buf.nbytes_parts["output_rings"]

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert seen["rings"] == 2 * one
        gc.collect()
        assert buf.nbytes_parts["output_rings"] == one
        assert a.live_bytes == buf.nbytes


def test_elision_growth_counts(layout):
    with alloc.open("numpy") as a:
        buf = tfdata.ReplayBuffer(CARTPOLE, 128, layout=layout, seed=0, allocator=a, elide_next=True)
        before = buf.nbytes_parts["bookkeeping"]
        buf.extend(stream(128, np.random.default_rng(0), end_every=1))  # every row ends an episode
        assert buf.nbytes_parts["bookkeeping"] > before
        assert a.live_bytes == buf.nbytes


def test_spilling_buffer_counts_its_resident_rows(tmp_path):
    buf = tfdata.ReplayBuffer(CARTPOLE, 1000, seed=0, spill_path=tmp_path / "s.npy", hot_rows=100)
    assert buf.nbytes_parts["storage"] == 100 * tfdata.Spec(CARTPOLE).aos_dtype.itemsize
    assert buf.nbytes_parts == tfdata.ReplayBuffer.plan_memory(CARTPOLE, 1000, spill_path=tmp_path / "x.npy",
                                                               hot_rows=100)


# -- budgets ----------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_max_capacity_is_the_largest_that_fits(layout, config):
    cls, kw = CONFIGS[config]
    budget = 3 << 20
    cap = memory.max_capacity(CARTPOLE, "3MB", batch_size=256, prioritized=cls is tfdata.PrioritizedReplayBuffer,
                              layout=layout, **kw)
    assert cap > 10_000
    with alloc.open("numpy") as a:
        buf = cls(CARTPOLE, cap, layout=layout, seed=0, allocator=a, memory_budget=budget, **kw)
        # episodes of 64+ steps fit the final-value table an elided buffer starts with
        buf.extend(stream(cap, np.random.default_rng(2), end_every=100))
        buf.sample(256)
        assert a.live_bytes == buf.nbytes <= budget
        del buf
        gc.collect()
        with pytest.raises(tfdata.MemoryBudgetError):
            big = cls(CARTPOLE, cap + 1, layout=layout, seed=0, allocator=a, memory_budget=budget, **kw)
            big.extend(stream(256, np.random.default_rng(2)))
            big.sample(256)


def test_over_budget_construction_allocates_nothing_and_says_why():
    with alloc.open("numpy") as a:
        with pytest.raises(tfdata.MemoryBudgetError) as exc:
            tfdata.PrioritizedReplayBuffer(IMAGE, 100_000, allocator=a, memory_budget="400MB")
        assert a.allocations == 0
    msg = str(exc.value)
    fits = memory.max_capacity(IMAGE, "400MB", prioritized=True)
    assert "memory_budget=400.0 MiB (419430400 bytes)" in msg and "storage" in msg and "trees" in msg
    assert f"largest capacity that fits is {fits}" in msg
    assert isinstance(exc.value, MemoryError)
    assert fits == memory.max_capacity(IMAGE, 400 << 20, prioritized=True)
    tfdata.PrioritizedReplayBuffer(IMAGE, fits, memory_budget="400MB")  # and it does fit
    with pytest.raises(tfdata.MemoryBudgetError, match="no capacity fits"):
        tfdata.ReplayBuffer(IMAGE, 10, memory_budget="10k")
    assert memory.max_capacity(IMAGE, "10k") == 0


def test_a_new_batch_size_over_budget_is_refused_and_nothing_changes(layout):
    budget = tfdata.ReplayBuffer.plan_memory(ODD, 100, layout=layout, batch_sizes=[16])
    buf = tfdata.ReplayBuffer(ODD, 100, layout=layout, seed=4, memory_budget=sum(budget.values()))
    ref = tfdata.ReplayBuffer(ODD, 100, layout=layout, seed=4)
    rows = random_rows(tfdata.Spec(ODD), 100, np.random.default_rng(3))
    buf.extend(rows)
    ref.extend(rows)
    b = buf.sample(16)
    assert buf.nbytes == sum(budget.values())
    with pytest.raises(tfdata.MemoryBudgetError, match="sampling batches of 17 rows"):
        buf.sample(17)
    ref.sample(16)
    for _ in range(3):  # the RNG did not move: the same batches as a buffer never refused
        np.testing.assert_array_equal(buf.sample(16).indices, ref.sample(16).indices)
    assert b is not None


def test_elision_growth_over_budget_is_refused_and_nothing_changes():
    cap = 256
    plan = tfdata.ReplayBuffer.plan_memory(CARTPOLE, cap, elide_next=True)
    buf = tfdata.ReplayBuffer(CARTPOLE, cap, seed=0, elide_next=True, memory_budget=sum(plan.values()))
    rows = stream(72, np.random.default_rng(0), end_every=100)
    rows["terminated"][8:] = True  # 64 one-step episodes: more final values than the table holds
    buf.extend({k: v[:8] for k, v in rows.items()})
    state = buf.state_dict()
    with pytest.raises(tfdata.MemoryBudgetError, match="episode-final values"):
        buf.extend({k: v[8:] for k, v in rows.items()})
    after = buf.state_dict()
    assert len(buf) == 8 and after["writer"] == state["writer"]
    for k in state["data"]:
        np.testing.assert_array_equal(after["data"][k], state["data"][k])


def test_loader_budget_and_parts():
    spec = tfdata.Spec(IMAGE)
    rows = random_rows(spec, 64, np.random.default_rng(0))
    ds = tfdata.ArrayDataset(rows)
    with alloc.open("numpy") as a:
        loader = tfdata.DataLoader(ds, 16, shuffle=True, seed=0, prefetch=2, allocator=a)
        parts = loader.nbytes_parts
        assert parts["output_ring"] == 3 * 16 * (ds.row_nbytes + 8)
        assert a.live_bytes == loader.nbytes
        budget = loader.nbytes
        with pytest.raises(tfdata.MemoryBudgetError, match="DataLoader of batch 16, prefetch 3"):
            tfdata.DataLoader(ds, 16, shuffle=True, seed=0, prefetch=3, allocator=a, memory_budget=budget)
        assert a.live_bytes == loader.nbytes  # the refused loader allocated nothing
    tfdata.DataLoader(ds, 16, shuffle=True, seed=0, prefetch=2, memory_budget=budget)


def test_budget_arguments_are_checked():
    with pytest.raises(ValueError, match="memory_budget"):
        tfdata.ReplayBuffer(CARTPOLE, 10, memory_budget="plenty")
    with pytest.raises(TypeError, match="plan_memory: unexpected"):
        tfdata.ReplayBuffer.plan_memory(CARTPOLE, 10, capacity_hint=3)
    # arguments that do not change memory are accepted and ignored
    assert tfdata.PrioritizedReplayBuffer.plan_memory(CARTPOLE, 10, alpha=0.7, seed=3, allocator="numpy")
