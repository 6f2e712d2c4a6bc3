"""Checkpoints of each single-process kind written before the parts of a buffer owned their
config and state (tests/fixtures/make_checkpoints_kinds.py, run once by the code of the commit
that added them): today's code loads each and draws exactly the batches the saved buffer drew
next."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import tfdata

from .fixtures.make_checkpoints_kinds import CASES, continuation

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "checkpoints_kinds")


@pytest.mark.parametrize("name", sorted(CASES))
def test_checkpoint_of_each_kind_continues_the_same_samples(tmp_path, name):
    path = tmp_path / name
    shutil.copytree(os.path.join(FIXTURES, name), path)
    with open(os.path.join(FIXTURES, "expected.json"), encoding="utf-8") as f:
        expected = json.load(f)[name]
    buf = tfdata.ReplayBuffer.load(str(path))
    assert type(buf) is CASES[name][0]
    assert continuation(buf) == expected
