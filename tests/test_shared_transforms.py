"""SharedReplayBuffer(transforms=): the sample transforms over rows written by other processes.

References: a ReplayBuffer (or PrioritizedReplayBuffer) given the same rows and seed (with one
writer the batches are the same bit for bit), the transforms' references in naive.py, and rows
whose fields are functions of their id, so that a transform applied twice, or not at all, to a
row drawn again after a torn read is visible."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time

import numpy as np
import pytest

from tfdata import (Cast, ClipReward, FormatError, Function, Normalize, PrioritizedReplayBuffer,
                    RandomShift, ReplayBuffer, ScaleReward)
from tfdata.shared import SharedReplayBuffer, SharedWriter

from . import naive
from .conftest import assert_batches_equal, row, sample_until_redraw
from .test_shared_frames import K, WriterEnv, spec_of, take
from .test_shared_nstep import SPEC as ID_SPEC, _writer, check_windows, id_rows

FORK = mp.get_context("fork")
IMAGES = {"obs": ("u1", (2, 9, 11)), "action": "i8", "reward": "f8", "terminated": "?",
          "truncated": "?"}


def negate_reward(fields):
    return {"reward": -fields["reward"]}


def image_rows(n, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    ends = rng.random(n) < 0.1
    return {"obs": rng.integers(0, 256, (n, 2, 9, 11), dtype=np.uint8),
            "action": rng.integers(0, 4, n), "reward": rng.normal(size=n),
            "terminated": ends, "truncated": np.zeros(n, bool)}


def transforms():
    return [RandomShift("obs", 2, seed=3), ScaleReward(0.5), ClipReward(-0.4, 0.4),
            Cast("obs", "f4", 1 / 255), Cast("action", "f8"), Function(negate_reward)]


def _write(name, shard, rows, errors):
    try:
        with SharedWriter(name, shard) as w:
            w.extend(rows)
    except BaseException as exc:
        errors.put(f"shard {shard}: {exc!r}")


def written(buf, rows) -> None:
    """``rows`` written into shard 0 by a writer process (which then closes its shard)."""
    errors = FORK.Queue()
    p = FORK.Process(target=_write, args=(buf.name, 0, rows, errors))
    p.start()
    p.join(60)
    assert p.exitcode == 0 and errors.empty(), errors.get() if not errors.empty() else p.exitcode


KINDS = {"uniform": {}, "n_step": {"n_step": 3, "gamma": 0.9}, "prioritized": {"prioritized": True},
         "without_replacement": {"sampler": "without_replacement"}}


@pytest.mark.parametrize("layout", ["aos", "soa"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_one_writer_process_gives_the_single_process_batches(layout, kind, shm_dir):
    kw = KINDS[kind]
    rows = image_rows(48)
    if kind == "prioritized":
        ref = PrioritizedReplayBuffer(IMAGES, 40, layout=layout, seed=5, transforms=transforms())
    else:
        ref = ReplayBuffer(IMAGES, 40, layout=layout, seed=5, transforms=transforms(),
                           **{k: v for k, v in kw.items()})
    for i in range(48):  # one push at a time: what a shared buffer's catch-up gives a sampler
        ref.push(row(rows, i))
    with SharedReplayBuffer(IMAGES, 40, layout=layout, seed=5, transforms=transforms(), **kw) as buf:
        written(buf, rows)
        for b in (1, 8, 8, 17):
            got, want = buf.sample(b, copy=True), ref.sample(b, copy=True)
            assert_batches_equal(dict(got), dict(want))
            np.testing.assert_array_equal(got.indices, want.indices)
        got, want = buf.sample(8, fields=["obs", "reward"]), ref.sample(8, fields=["obs", "reward"])
        assert_batches_equal(dict(got), dict(want))
        if kind != "without_replacement":  # (which draws no sequences across processes)
            got, want = buf.sample_sequences(3, 4, copy=True), ref.sample_sequences(3, 4, copy=True)
            assert_batches_equal(dict(got), dict(want))
            np.testing.assert_array_equal(got.mask, want.mask)
        assert [t.state_dict() for t in buf.transform_parts] == \
            [t.state_dict() for t in ref.transform_parts]


def test_frame_stacks_then_the_transforms(shm_dir):
    """After the stacks are rebuilt from the region: the batch of a twin buffer without
    transforms, then the references of naive.py (the shift draws from its own counter)."""
    spec = spec_of()
    rng = np.random.default_rng(1)
    rows = take(WriterEnv(0), rng, 30)
    kw = dict(seed=2, frame_stack=K, final_frames=24)
    with SharedReplayBuffer(spec, 24, transforms=[RandomShift("obs", 1, seed=4), ScaleReward(3.0)],
                            **kw) as buf, SharedReplayBuffer(spec, 24, **kw) as twin:
        written(buf, rows)
        written(twin, rows)
        counter = 0
        for _ in range(3):
            got, plain = buf.sample(6, copy=True), twin.sample(6, copy=True)
            np.testing.assert_array_equal(got.indices, plain.indices)
            shifted, counter = naive.random_shift(plain["obs"], 1, naive.key_of(4), counter)
            np.testing.assert_array_equal(got["obs"], shifted)
            np.testing.assert_array_equal(got["next_obs"], plain["next_obs"])
            np.testing.assert_array_equal(got["reward"], naive.scale_clip(plain["reward"], 3.0))


def test_checkpoint_round_trip_continues_the_same_batches(tmp_path, shm_dir):
    rows = image_rows(40, seed=3)
    with SharedReplayBuffer(IMAGES, 32, seed=7, transforms=transforms()) as buf:
        written(buf, rows)
        for _ in range(3):
            buf.sample(8)
        assert buf.config["transforms"] == [t.config() for t in transforms()]
        buf.save(tmp_path / "ck")
        with pytest.raises(FormatError, match="negate_reward"):  # not among those given
            SharedReplayBuffer.load(tmp_path / "ck")
        assert sorted(os.listdir(shm_dir)) == [os.path.basename(buf.path)]
        with SharedReplayBuffer.load(tmp_path / "ck", transforms=[negate_reward]) as back:
            assert back.transforms[0].config() == transforms()[0].config()
            assert [t.state_dict() for t in back.transform_parts] == \
                [t.state_dict() for t in buf.transform_parts]
            for _ in range(3):
                assert_batches_equal(dict(back.sample(8, copy=True)), dict(buf.sample(8, copy=True)))


def test_a_hostile_transforms_entry_is_a_format_error(tmp_path, shm_dir):
    with SharedReplayBuffer(IMAGES, 16, seed=0, transforms=[RandomShift("obs", seed=1)]) as buf:
        written(buf, image_rows(16))
        buf.save(tmp_path / "ck")
    path = tmp_path / "ck" / "state.json"
    doc = json.loads(path.read_text())
    bad = [("state", "transforms", None, "state.transforms"),
           ("state", "transforms", [{"seed": "x", "counter": 0}], "state.transforms"),
           ("state", "transforms", [{"seed": 1, "counter": 0}, None], "state.transforms"),
           ("config", "transforms", [{"name": "normalize", "field": "reward", "eps": 1e-8,
                                      "clip": None, "stats_of": "reward"}], "normalize"),
           ("config", "transforms", [{"name": "os:system"}], "config.transforms")]
    for part, key, value, match in bad:
        d = json.loads(json.dumps(doc))
        if value is None:
            del d[part][key]
        else:
            d[part][key] = value
        path.write_text(json.dumps(d))
        with pytest.raises(FormatError, match=match):
            SharedReplayBuffer.load(tmp_path / "ck")
        assert os.listdir(shm_dir) == []  # refused before a region exists


def test_normalize_and_fifo_are_refused_before_a_region_exists(shm_dir):
    with pytest.raises(NotImplementedError, match=r"Normalize\('reward'\).*no running statistics.*stats="):
        SharedReplayBuffer(IMAGES, 16, transforms=[Normalize("reward")])
    with pytest.raises(NotImplementedError, match="mode='fifo'"):
        SharedReplayBuffer(IMAGES, 16, mode="fifo", transforms=[ScaleReward(2.0)])
    with pytest.raises(TypeError, match="transforms"):
        SharedReplayBuffer(IMAGES, 16, transforms=ScaleReward(2.0))
    assert os.listdir(shm_dir) == []


def test_the_output_ring_counts_the_transforms_arrays(shm_dir):
    with SharedReplayBuffer(IMAGES, 16, seed=0, transforms=[Cast("obs", "f8")]) as buf, \
            SharedReplayBuffer(IMAGES, 16, seed=0) as plain:
        written(buf, image_rows(16))
        written(plain, image_rows(16))
        buf.sample(4)
        plain.sample(4)
        extra = buf.nbytes_parts["output_rings"] - plain.nbytes_parts["output_rings"]
        assert extra == buf.config["ring_size"] * 4 * 2 * 9 * 11 * 8


# -- torn rows: drawn again, then transformed once ----------------------------------------


def test_a_row_drawn_again_is_transformed_once(shm_dir):
    """A draw that lands on a slot being written is drawn again; the transform (in place on the
    reward) runs after, once: every reward is exactly twice its row's."""
    with SharedReplayBuffer(ID_SPEC, 14, num_writers=2, seed=4,
                            transforms=[ScaleReward(2.0)]) as buf:
        with SharedWriter(buf.name, 0) as w0:
            w0.extend(id_rows(range(3)))
        w = SharedWriter(buf.name, 1)
        w.extend(id_rows(100 + np.arange(10)))
        buf._k.shard_begin(w._words, 12)  # two slots of shard 1 in flight
        before = buf.redraws
        for _ in range(50):
            b = buf.sample(10)
            np.testing.assert_array_equal(b["reward"], 2.0 * np.asarray(b["id"], np.float64))
        assert buf.redraws > before  # some draws landed in flight
        w.close()


class _Halved:
    """A batch with its reward halved (what check_windows recomputes), the rest as it is."""

    def __init__(self, batch):
        self.batch, self.discounts = batch, batch.discounts

    def __getitem__(self, name):
        return np.asarray(self.batch[name]) / 2.0 if name == "reward" else self.batch[name]


@pytest.mark.parametrize("n_step", [None, 4])
def test_rows_and_windows_redrawn_while_writer_processes_overwrite(n_step, shm_dir):
    errors, stop = FORK.Queue(), FORK.Event()
    gamma, cap = 0.5, 64
    kw = {} if n_step is None else dict(n_step=n_step, gamma=gamma)
    with SharedReplayBuffer(ID_SPEC, 2 * cap, num_writers=2, seed=1,
                            transforms=[ScaleReward(2.0)], **kw) as buf:
        procs = [FORK.Process(target=_writer, args=(buf.name, s, stop, errors)) for s in range(2)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 60
        while len(buf) < 2 * cap and time.monotonic() < deadline:
            time.sleep(0.01)
        def check(b):
            if n_step is None:
                np.testing.assert_array_equal(b["reward"], 2.0 * np.asarray(b["id"], np.float64))
            else:
                check_windows(_Halved(b), n_step, gamma, 2, cap)

        sampled = sample_until_redraw(buf, check)
        stop.set()
        for p in procs:
            p.join(30)
        assert errors.empty(), errors.get()
        redraws = buf.redraws
    assert sampled >= 640
    assert redraws > 0, "nothing was ever redrawn: the writers did not race the reader"
