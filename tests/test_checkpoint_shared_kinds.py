"""Checkpoints of each kind of shared buffer, one generation per refactoring (written by
tests/fixtures/make_checkpoints_shared.py, once, by the code of its time: see its GENERATIONS):
today's code loads each into a new region and draws exactly the batches the saved buffer drew
next.

Every kind continues without a writer: the exactly-k checkpoint holds more deliveries than the
two batches take, and the rate limiter's checkpoint allows more samples than they count."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tfdata.shared import SharedReplayBuffer

from .fixtures.make_checkpoints_kinds import SAMPLERS
from .fixtures.make_checkpoints_shared import CASES, GENERATIONS, continuation, directory


def expected(generation: int) -> dict:
    with open(os.path.join(directory(generation), "expected.json"), encoding="utf-8") as f:
        return json.load(f)


FIXTURES = [(g, name) for g in sorted(GENERATIONS) for name in sorted(expected(g))]


def test_every_generation_holds_cases_of_today_and_the_last_one_every_case():
    """A case added to CASES needs a new generation written (and a case is never removed: the
    checkpoints of every generation must go on loading)."""
    for g in GENERATIONS:
        assert set(expected(g)) <= set(CASES)
    assert sorted(expected(max(GENERATIONS))) == sorted(CASES)


@pytest.mark.parametrize("generation, name", FIXTURES, ids=[f"{g}-{n}" for g, n in FIXTURES])
def test_shared_checkpoint_of_each_kind_continues_the_same_samples(tmp_path, shm_dir, generation, name):
    path = tmp_path / name
    shutil.copytree(os.path.join(directory(generation), name), path)
    with SharedReplayBuffer.load(str(path), dir=str(shm_dir), samplers=SAMPLERS) as buf:
        assert buf.num_writers == len(CASES[name][2])
        assert continuation(buf) == expected(generation)[name]
