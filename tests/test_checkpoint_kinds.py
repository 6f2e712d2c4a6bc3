"""Checkpoints of each single-process kind, one generation per refactoring (written by
tests/fixtures/make_checkpoints_kinds.py, once, by the code of its time: see its GENERATIONS):
today's code loads each and draws exactly the batches the saved buffer drew next."""

from __future__ import annotations

import os
import shutil

import pytest

import tfdata

from . import fixtures
from .fixtures.make_checkpoints_kinds import CASES, GENERATIONS, SAMPLERS, continuation, directory


def expected(generation: int) -> dict:
    return fixtures.expected(directory(generation))


FIXTURES = [(g, name) for g in sorted(GENERATIONS) for name in sorted(expected(g))]


def test_every_generation_holds_cases_of_today_and_the_last_one_every_case():
    fixtures.check_generations(GENERATIONS, CASES, directory)


@pytest.mark.parametrize("generation, name", FIXTURES, ids=[f"{g}-{n}" for g, n in FIXTURES])
def test_checkpoint_of_each_kind_continues_the_same_samples(tmp_path, generation, name):
    path = tmp_path / name
    shutil.copytree(os.path.join(directory(generation), name), path)
    buf = tfdata.ReplayBuffer.load(str(path), samplers=SAMPLERS)
    assert type(buf) is CASES[name][0]
    assert continuation(buf) == expected(generation)[name]
