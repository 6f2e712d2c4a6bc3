"""Checkpoints of each kind of shared buffer, one generation per refactoring (written by
tests/fixtures/make_checkpoints_shared.py, once, by the code of its time: see its GENERATIONS):
today's code loads each into a new region and draws exactly the batches the saved buffer drew
next.

Every kind continues without a writer: the exactly-k checkpoint holds more deliveries than the
two batches take, and the rate limiter's checkpoint allows more samples than they count."""

from __future__ import annotations

import os
import shutil

import pytest

from tfdata.shared import SharedReplayBuffer

from .fixtures.make_checkpoints_kinds import SAMPLERS
from . import fixtures
from .fixtures.make_checkpoints_shared import CASES, GENERATIONS, continuation, directory


def expected(generation: int) -> dict:
    return fixtures.expected(directory(generation))


FIXTURES = [(g, name) for g in sorted(GENERATIONS) for name in sorted(expected(g))]


def test_every_generation_holds_cases_of_today_and_the_last_one_every_case():
    fixtures.check_generations(GENERATIONS, CASES, directory)


@pytest.mark.parametrize("generation, name", FIXTURES, ids=[f"{g}-{n}" for g, n in FIXTURES])
def test_shared_checkpoint_of_each_kind_continues_the_same_samples(tmp_path, shm_dir, generation, name):
    path = tmp_path / name
    shutil.copytree(os.path.join(directory(generation), name), path)
    with SharedReplayBuffer.load(str(path), dir=str(shm_dir), samplers=SAMPLERS) as buf:
        assert buf.num_writers == len(CASES[name][2])
        assert continuation(buf) == expected(generation)[name]
