"""Checkpoints of each kind of shared buffer written before the parts of a buffer owned their
config and state (tests/fixtures/make_checkpoints_shared.py, run once by the code of the commit
before that refactoring): today's code loads each into a new region and draws exactly the
batches the saved buffer drew next.

Every kind continues without a writer: the exactly-k checkpoint holds more deliveries than the
two batches take, and the rate limiter's checkpoint allows more samples than they count."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tfdata.shared import SharedReplayBuffer

from .fixtures.make_checkpoints_shared import CASES, continuation

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "checkpoints_shared")


@pytest.mark.parametrize("name", sorted(CASES))
def test_shared_checkpoint_of_each_kind_continues_the_same_samples(tmp_path, shm_dir, name):
    path = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), path)
    with open(os.path.join(FIXTURES, "expected.json"), encoding="utf-8") as f:
        expected = json.load(f)[name]
    with SharedReplayBuffer.load(str(path), dir=str(shm_dir)) as buf:
        assert buf.num_writers == len(CASES[name][2])
        assert continuation(buf) == expected
