"""The README's SAC loop runs as printed (with fewer steps): the example stays true."""

from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest

from . import REPO


def test_readme_sac_example_runs():
    pytest.importorskip("gymnasium")
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "tfdata.nn.SAC(" in b]
    assert len(blocks) == 1, "expected one README example of tfdata.nn.SAC"
    code = blocks[0]
    assert "range(30_000)" in code and "learning_starts = 5_000" in code
    code = code.replace("range(30_000)", "range(300)").replace("learning_starts = 5_000", "learning_starts = 256")
    ns: dict = {}
    exec(compile(code, "README.md", "exec"), ns)
    sac, buf = ns["sac"], ns["buf"]
    assert len(buf) == 300 and sac.updates == 300 - 257
    # the policy at every even step after learning starts, twice
    assert sac.actor_optim.t == sum(2 for step in range(257, 300) if step % 2 == 0)
    assert sac.actor_optim.t > 0 and math.isfinite(sac.qf_loss) and sac.alpha < 1.0
    assert np.isfinite(sac.actor_params).all()
