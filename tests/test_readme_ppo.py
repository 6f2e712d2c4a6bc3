"""The README's PPO loop runs as printed (with fewer steps): the example stays true."""

from __future__ import annotations

import math
import os
import re

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")


def test_readme_ppo_example_runs():
    pytest.importorskip("gymnasium")
    with open(README, encoding="utf-8") as f:
        text = f.read()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "tfdata.nn.PPO(" in b]
    assert len(blocks) == 1, "expected one README example of tfdata.nn.PPO"
    code = blocks[0]
    assert "500_000" in code
    ns: dict = {}
    exec(compile(code.replace("500_000", "1024"), "README.md", "exec"), ns)  # two rollouts
    agent, buf = ns["agent"], ns["buf"]
    assert buf.steps == 0 and ns["iterations"] == 2
    assert agent.stats and all(math.isfinite(v) for v in agent.stats.values())
